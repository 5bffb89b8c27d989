//! Structured answers end to end: a real gateway over MCP stdio and a real OpenCode against the
//! scripted fake LLM, whose `[[answers:<a1>;;<a2>...]]` marker gives one answer per turn of the
//! session. A task started with `output_schema` whose first answer does not match is corrected
//! by the gateway's automatic continue and returns the parsed value; one that never matches
//! reports the validation errors after the bounded retries; a bad schema is refused at start.

mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::git::init_repo;
use support::rig::{person_schema, Rig, TASK_TIMEOUT_MS};
use support::{FakeLlm, OpenCodeEnv};

/// Polls the task's status until it is finished (bounded), and returns every status seen as
/// (status, turn).
async fn watch_until_finished(rig: &Rig, id: &str) -> Vec<(String, u64)> {
    let deadline = Instant::now() + Duration::from_millis(TASK_TIMEOUT_MS);
    let mut seen = Vec::new();
    loop {
        let s = rig.status(id).await;
        let status = s["status"].as_str().unwrap_or_default().to_string();
        let turn = s["turn"].as_u64().unwrap_or_default();
        let done = !matches!(
            status.as_str(),
            "pending" | "running" | "waiting_permission"
        );
        seen.push((status, turn));
        if done {
            return seen;
        }
        assert!(
            Instant::now() < deadline,
            "task {id} did not finish: {seen:?}\n--- gateway stderr ---\n{}",
            rig.client.stderr()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_first_answer_is_corrected_in_the_same_session() {
    let rig = Rig::start(&[]).await;
    let wrong = r#"Here you are:\n```json\n{"name": "Ada", "age": "thirty-six"}\n```"#;
    let right = r#"Corrected:\n```json\n{"name": "Ada", "age": 36}\n```"#;
    let started = rig
        .start_answering("describe Ada", &[wrong, right], person_schema())
        .await;
    let id = started["task_id"].as_str().expect("task_id").to_string();
    let session = started["session_id"]
        .as_str()
        .expect("session_id")
        .to_string();

    // No one ever sees the wrong first answer as the task's end: every finished status is the
    // corrected turn's.
    let seen = watch_until_finished(&rig, &id).await;
    for (status, turn) in &seen {
        if !matches!(status.as_str(), "pending" | "running") {
            assert_eq!(
                (status.as_str(), *turn),
                ("completed", 2),
                "statuses seen: {seen:?}"
            );
        }
    }

    // The wait's lean answer carries the parsed value.
    let wait = rig
        .ok(
            "opencode_wait_for_task",
            json!({ "task_ids": [id], "timeout_ms": 0 }),
        )
        .await;
    let task = &wait["tasks"][0];
    assert_eq!(task["status"], "completed", "{wait}");
    assert_eq!(
        task["structured"],
        json!({ "name": "Ada", "age": 36 }),
        "{wait}"
    );
    assert!(task.get("structured_error").is_none(), "{wait}");

    let result = rig
        .ok(
            "opencode_get_task_result",
            json!({ "task_id": id, "detail": "full" }),
        )
        .await;
    assert_eq!(
        result["structured"],
        json!({ "name": "Ada", "age": 36 }),
        "{result}"
    );
    assert_eq!(result["turn"], 2, "{result}");
    let attempts = result["structured_attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 2, "{result}");
    assert_eq!(
        (&attempts[0]["turn"], &attempts[0]["ok"]),
        (&json!(1), &json!(false))
    );
    let first_errors = attempts[0]["errors"].to_string();
    assert!(
        first_errors.contains("`/age`") && first_errors.contains("integer"),
        "{first_errors}"
    );
    assert_eq!(attempts[1], json!({ "turn": 2, "ok": true }));

    // What the model was told: the schema with the first prompt, the errors with the second.
    let requests = rig.requests_for(&session);
    let first_user = requests
        .first()
        .map(|r| r.last_user_text.clone())
        .unwrap_or_default();
    assert!(
        first_user.contains("End your answer with one JSON value")
            && first_user.contains("\"required\""),
        "{first_user}"
    );
    let correction = requests
        .last()
        .map(|r| r.last_user_text.clone())
        .unwrap_or_default();
    assert!(
        correction.starts_with("Your answer did not end with a JSON value that matches")
            && correction.contains("`/age`"),
        "{correction}"
    );

    // The usage report counts the corrected turn's predecessor too: more than the last turn.
    let usage = rig.ok("opencode_usage", json!({})).await;
    let counted = usage["total"]["tokens"]["input"].as_u64().unwrap_or(0);
    let last_turn = result["tokens"]["input"].as_u64().unwrap_or(u64::MAX);
    assert!(counted > last_turn, "usage {usage} vs result {result}");

    // A host's own follow-up: the schema still applies, a new round with one attempt. (The
    // fake's last scripted answer is the right one.)
    rig.ok(
        "opencode_continue_task",
        json!({ "task_id": id, "prompt": "once more" }),
    )
    .await;
    let again = rig.finish(&id).await;
    assert_eq!(
        again["structured"],
        json!({ "name": "Ada", "age": 36 }),
        "{again}"
    );
    assert_eq!(
        again["structured_attempts"],
        json!([{ "turn": 3, "ok": true }]),
        "{again}"
    );
    let follow_up = rig
        .requests_for(&session)
        .last()
        .map(|r| r.last_user_text.clone())
        .unwrap_or_default();
    assert!(
        follow_up.starts_with("once more")
            && follow_up.contains("End your answer with one JSON value"),
        "{follow_up}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_never_matches_reports_the_validation_errors() {
    let rig = Rig::start(&[("OPENCODE_MCP_LIMITS__STRUCTURED_RETRIES", "1")]).await;
    let started = rig
        .start_task_with(json!({
            "prompt": r#"describe Ada [[answers:```json\n{"name": 7}\n```]]"#,
            "output_schema": person_schema(),
        }))
        .await;
    let id = started["task_id"].as_str().expect("task_id").to_string();
    let result = rig.finish(&id).await;
    assert_eq!(result["status"], "completed", "{result}");
    assert!(result.get("structured").is_none(), "{result}");
    let error = result["structured_error"]
        .as_str()
        .expect("structured_error");
    assert!(
        error.contains("after 2 attempts") && error.contains("`/name`") && error.contains("age"),
        "{error}"
    );
    // One retry (limits.structured_retries = 1): two turns, both failed, each visible.
    let attempts = result["structured_attempts"].as_array().expect("attempts");
    let shape: Vec<(u64, bool)> = attempts
        .iter()
        .map(|a| (a["turn"].as_u64().unwrap_or(0), a["ok"] == true))
        .collect();
    assert_eq!(shape, [(1, false), (2, false)], "{result}");
    assert!(attempts
        .iter()
        .all(|a| a["errors"].as_array().is_some_and(|e| !e.is_empty())));
    assert_eq!(result["turn"], 2, "{result}");
    // The status and wait say so too.
    let status = rig.status(&id).await;
    assert_eq!(status["structured_error"], json!(error), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_output_schema_is_refused_at_start() {
    let rig = Rig::start(&[]).await;
    let server_id = rig.server_id();
    let cases = [
        (json!({ "type": "strnig" }), "`/type`"),
        (json!("not a schema"), "output_schema"),
        (
            json!({ "$ref": "http://127.0.0.1:9/schema.json" }),
            "not a valid JSON Schema",
        ),
        (
            json!({ "description": "x".repeat(20_000) }),
            "more than the limit",
        ),
        // 4 KB whose check of one string takes 2^60 steps: each level an `anyOf` of two
        // references to the next (it kept its task `running` for over a minute and pinned a
        // runtime worker).
        (fan_out_of_references(60), "flatten the references"),
    ];
    for (schema, expected) in cases {
        let (code, message) = rig
            .err(
                "opencode_start_task",
                json!({ "server_id": server_id, "prompt": "p", "output_schema": schema }),
            )
            .await;
        assert_eq!(code, "invalid_argument", "{message}");
        assert!(message.contains(expected), "{expected}: {message}");
        assert!(message.contains("output_schema"), "{message}");
    }
    // Nothing was started: the fake model was never asked.
    assert!(rig.fake.chat_requests().is_empty());
    let tasks = rig.ok("opencode_list_tasks", json!({})).await;
    assert_eq!(tasks["tasks"], json!([]), "{tasks}");
}

/// A schema of `levels` definitions, each an `anyOf` of two references to the next.
fn fan_out_of_references(levels: usize) -> serde_json::Value {
    let mut defs = serde_json::Map::new();
    for i in 0..levels {
        let next = format!("#/$defs/d{}", i + 1);
        defs.insert(
            format!("d{i}"),
            json!({ "anyOf": [{ "$ref": next }, { "$ref": next, "minimum": 1 }] }),
        );
    }
    defs.insert(format!("d{levels}"), json!({ "type": "string" }));
    json!({ "$defs": defs, "$ref": "#/$defs/d0" })
}

/// A cancel while the gateway's correction turn runs ends the task `cancelled`: no waiter is
/// told it completed, no value is reported, and the checked first answer stays visible. The
/// first answer's wrong value is `[[delay:...]]`, which the validation error quotes back in the
/// correction prompt, so the fake model holds the correction turn open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_during_a_correction_ends_the_task_cancelled() {
    let rig = Rig::start(&[]).await;
    let wrong = r#"```json\n{"name": "Ada", "age": "{{delay:60000}}"}\n```"#;
    let right = r#"```json\n{"name": "Ada", "age": 36}\n```"#;
    let started = rig
        .start_answering("describe Ada", &[wrong, right], person_schema())
        .await;
    let id = started["task_id"].as_str().expect("task_id").to_string();

    // The correction turn is under way: turn 2, still running.
    let deadline = Instant::now() + Duration::from_millis(TASK_TIMEOUT_MS);
    loop {
        let s = rig.status(&id).await;
        assert!(
            matches!(s["status"].as_str(), Some("pending" | "running")),
            "never finished before the correction: {s}"
        );
        if s["turn"] == 2 && s["status"] == "running" {
            break;
        }
        assert!(Instant::now() < deadline, "no correction turn: {s}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // `running` comes with OpenCode's `busy`, before it sends the correction to the model: wait
    // until the model has it, so the cancel falls while the correction holds the turn open.
    let session = started["session_id"]
        .as_str()
        .expect("session_id")
        .to_string();
    rig.wait_for_correction(&session).await;

    let cancelled = rig
        .ok("opencode_cancel_task", json!({ "task_id": id }))
        .await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    let wait = rig
        .ok(
            "opencode_wait_for_task",
            json!({ "task_ids": [id], "timeout_ms": 10_000 }),
        )
        .await;
    assert_eq!(wait["tasks"][0]["status"], "cancelled", "{wait}");
    assert!(wait["tasks"][0].get("structured").is_none(), "{wait}");
    let result = rig
        .ok(
            "opencode_get_task_result",
            json!({ "task_id": id, "detail": "full" }),
        )
        .await;
    assert_eq!(result["status"], "cancelled", "{result}");
    assert!(result.get("structured").is_none(), "{result}");
    let attempts = result["structured_attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 1, "{result}");
    assert_eq!(attempts[0]["ok"], false, "{result}");
    // The correction really reached the model, quoting the wrong value (which held it open).
    let asked: Vec<String> = rig
        .requests_for(&session)
        .iter()
        .filter(|r| !r.is_title_request())
        .map(|r| r.summary())
        .collect();
    assert!(asked.len() >= 2, "{asked:?}");
}

/// A first answer that edited a file and got the JSON wrong, then a correction that fixes only
/// the JSON: the result's changed files are the round's, not just the correction turn's (which
/// changed nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrected_tasks_changed_files_include_the_first_answers() {
    // OpenCode tracks a turn's files in a git repository.
    let env = OpenCodeEnv::new();
    init_repo(&env.work_dir(), &[("README", "people\n")]);
    let rig = Rig::start_in(FakeLlm::start(), env, &[]).await;
    let wrong = r#"```json\n{"name": "Ada"}\n```"#;
    let right = r#"```json\n{"name": "Ada", "age": 36}\n```"#;
    let started = rig
        .start_answering(
            "note Ada down [[write:ada.txt:Ada Lovelace]]",
            &[wrong, right],
            person_schema(),
        )
        .await;
    let id = started["task_id"].as_str().expect("task_id").to_string();
    let result = rig.finish(&id).await;
    assert_eq!(result["status"], "completed", "{result}");
    assert_eq!(result["turn"], 2, "a correction ran: {result}");
    assert_eq!(
        result["structured"],
        json!({ "name": "Ada", "age": 36 }),
        "{result}"
    );
    let files: Vec<&str> = result["files_changed"]
        .as_array()
        .unwrap_or_else(|| panic!("files_changed: {result}"))
        .iter()
        .filter_map(|f| f["file"].as_str())
        .collect();
    assert_eq!(files, ["ada.txt"], "{result}");
}

/// A structured task with checks: its answer is checked against the schema first, then its
/// commands run, and only then does it end, with both verdicts in its result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_structured_answer_is_checked_then_its_commands_run() {
    let rig = Rig::start(&[("OPENCODE_MCP_CHECKS__FROM_CALLS", "true")]).await;
    let marker = rig.env.work_dir().join("checked");
    let right = r#"Done:\n```json\n{"name": "Ada", "age": 36}\n```"#;
    let started = rig
        .start_task_with(json!({
            "prompt": format!("describe Ada [[answers:{right}]]"),
            "output_schema": person_schema(),
            "checks": [format!("touch {}", marker.display())],
        }))
        .await;
    let id = started["task_id"].as_str().expect("task_id").to_string();
    let result = rig.finish(&id).await;
    assert_eq!(result["status"], "completed", "{result}");
    assert_eq!(
        result["structured"],
        json!({"name": "Ada", "age": 36}),
        "{result}"
    );
    assert_eq!(result["checks"]["status"], "passed", "{result}");
    assert!(marker.exists(), "the check did not run");
}

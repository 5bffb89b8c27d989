//! Fault drill: the gateway restarts (SIGKILL, then the same config again). Finished tasks stay
//! answerable by `task_id`; unfinished tasks on a managed server that died with the gateway are
//! reported as interrupted, never as running; unfinished tasks on an attached server are adopted
//! and finish normally; a finished task whose server went with the old gateway is continued on
//! the new one's server, in the same session, and what the old gateway never read of its turn
//! is read from there when the result is asked for.

mod support;

use serde_json::{json, Value};
use support::fake_llm::echo_reply;
use support::git::init_repo;
use support::rig::{person_schema, poll_for, wait_gone, Rig, TASK_TIMEOUT_MS};
use support::{FakeLlm, OpenCodeEnv};

fn id(v: &serde_json::Value) -> String {
    v["task_id"].as_str().expect("task_id").to_string()
}

fn session(v: &serde_json::Value) -> String {
    v["session_id"].as_str().expect("session_id").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_gateway_answers_for_finished_tasks_and_reports_interrupted_ones() {
    // Finished tasks leave memory after a second: the follow-up below is of a task that left
    // memory, read back from its record (a server started for it once evicted it on its first
    // tick, and the task then sat pending until its deadline).
    let in_memory = std::time::Duration::from_secs(1);
    let mut rig = Rig::start(&[("OPENCODE_MCP_LIMITS__FINISHED_IN_MEMORY", "1s")]).await;
    let done = id(&rig.start_task("finished before the crash").await);
    let before = rig.finish(&done).await;
    let finished = tokio::time::Instant::now();
    assert_eq!(before["status"], "completed");
    let running = id(&rig.start_task("cut short [[slow:30000]]").await);
    rig.fake
        .wait_for_request(std::time::Duration::from_secs(30), |r| {
            r.last_user_text.contains("cut short")
        })
        .await;
    let opencode = rig.opencode_pid();

    rig.kill_gateway().await;
    assert!(
        wait_gone(opencode, std::time::Duration::from_secs(10)).await,
        "the managed OpenCode dies with a SIGKILLed gateway"
    );
    rig.relaunch().await;

    let after = rig
        .ok(
            "opencode_get_task_result",
            json!({ "task_id": done , "detail": "full" }),
        )
        .await;
    assert_eq!(after["status"], "completed");
    assert_eq!(after["text"], before["text"]);
    assert_eq!(after["tokens"], before["tokens"]);
    let st = rig.status(&running).await;
    assert_eq!(st["status"], "failed", "{st}");
    assert_eq!(st["error"]["name"], "Interrupted", "{st}");
    // A wait on it returns at once: it is finished, not running.
    let w = rig.wait(&[&running], "all", TASK_TIMEOUT_MS).await;
    assert_eq!(w["done"], true);

    // A follow-up of the finished task: its server went with the old gateway, and the new
    // gateway's server carries the session on (OpenCode keeps it in its own storage), with the
    // history of the first turn. The scenario: the task has been out of use for longer than its
    // stay in memory.
    tokio::time::sleep_until(finished + 2 * in_memory).await;
    let follow_up = "and after the restart";
    rig.ok(
        "opencode_continue_task",
        json!({ "task_id": done, "prompt": follow_up }),
    )
    .await;
    let r = rig.finish(&done).await;
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["text"], echo_reply(follow_up), "{r}");
    let full = rig
        .ok(
            "opencode_get_task_status",
            json!({ "task_id": done, "detail": "full" }),
        )
        .await;
    assert_eq!(full["turn"], 2, "{full}");
    let now = rig.ok("opencode_start_server", json!({})).await;
    assert_eq!(now["reused"], true, "{now}");
    assert_eq!(
        full["server_id"], now["server_id"],
        "moved to the new server: {full}"
    );
    assert_ne!(full["server_id"], rig.server["server_id"], "{full}");
    let session = full["session_id"].as_str().expect("session_id");
    let last = rig
        .requests_for(session)
        .into_iter()
        .rfind(|r| !r.is_title_request())
        .expect("the follow-up reached the model");
    let history = serde_json::to_string(&last.messages).unwrap_or_default();
    assert!(
        history.contains("finished before the crash") && last.last_user_text.contains(follow_up),
        "{history}"
    );
}

/// A finished task leaves memory, then its record expires while the same gateway runs on: the
/// record is deleted (found by a sweep of the state directory: the gateway keeps nothing per
/// task that left memory), not before its TTL, and the task is then unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_expires_after_its_task_left_memory() {
    // Out of memory at the first tick a second after the finish (ticks are 5 s apart, so by
    // 6 s), before the 7 s TTL: the record goes by the sweep, not with the task in memory.
    let ttl = std::time::Duration::from_secs(7);
    let rig = Rig::start(&[
        ("OPENCODE_MCP_LIMITS__FINISHED_IN_MEMORY", "1s"),
        ("OPENCODE_MCP_LIMITS__FINISHED_TASK_TTL", "7s"),
    ])
    .await;
    let task = id(&rig.start_task("soon forgotten").await);
    let done = rig.finish(&task).await;
    assert_eq!(done["status"], "completed", "{done}");
    let finished = std::time::Instant::now();
    let file = rig
        .env
        .root()
        .join(format!("state/opencode-mcp/tasks/{task}.json"));
    assert!(file.is_file(), "the record is written at the finish");
    let gone = poll_for(ttl + std::time::Duration::from_secs(30), || {
        (!file.exists()).then(std::time::Instant::now)
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "the expired record is still there\n--- gateway stderr ---\n{}",
            rig.client.stderr()
        )
    });
    assert!(
        gone.duration_since(finished) + std::time::Duration::from_secs(1) >= ttl,
        "deleted {:?} after the finish, before its TTL",
        gone.duration_since(finished)
    );
    // The sweep logs its count after it deleted the file: wait for that line itself (on a
    // loaded machine the file is gone some milliseconds before the line is written).
    rig.client
        .wait_stderr_line(
            &["swept the state directory for expired task records expired=1"],
            std::time::Duration::from_secs(10),
        )
        .await
        .unwrap_or_else(|e| panic!("the record went by the sweep: {e}"));
    let (code, message) = rig
        .err("opencode_get_task_result", json!({ "task_id": task }))
        .await;
    assert_eq!(code, "not_found", "{message}");
    assert!(message.contains(&task), "{message}");
}

/// **A fan-out group keeps its members across a restart.** Records older than
/// `limits.finished_in_memory` are left on disk at a restore; they were never put back into
/// their group, so a wait on the group id answered `not_found`.
///
/// Proves: after the restart the group id still names both answers, in the fan-out's order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fan_out_group_answers_after_a_restart() {
    let mut rig = Rig::start(&[("OPENCODE_MCP_LIMITS__FINISHED_IN_MEMORY", "1s")]).await;
    let out = rig
        .ok(
            "opencode_fan_out",
            json!({
                "server_id": rig.server_id(),
                "prompt": "one question, two models",
                "models": ["fake/fake-model", "fake/fake-strong"]
            }),
        )
        .await;
    let group = out["group_id"].as_str().expect("group_id").to_string();
    let w = rig.wait(&[&group], "all", TASK_TIMEOUT_MS).await;
    assert_eq!(w["done"], true, "{w}");
    let members: Vec<Value> = w["tasks"].as_array().cloned().unwrap_or_default();
    assert_eq!(members.len(), 2, "{w}");
    // Both records on disk as finished before the crash (a wait returns as the turn ends; its
    // record is written a moment later by the store's writer).
    let on_disk = |id: &str| {
        let file = rig
            .env
            .root()
            .join(format!("state/opencode-mcp/tasks/{id}.json"));
        std::fs::read_to_string(file)
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .is_some_and(|r| r["status"] == "completed")
    };
    let written = poll_for(std::time::Duration::from_secs(10), || {
        members
            .iter()
            .filter_map(|t| t["task_id"].as_str())
            .all(&on_disk)
            .then_some(())
    })
    .await;
    assert!(written.is_some(), "both records are written as finished");
    // Old enough to be left on disk by the next restore.
    let finished = std::time::Instant::now();
    rig.kill_gateway().await;
    let rest = std::time::Duration::from_millis(1500).saturating_sub(finished.elapsed());
    tokio::time::sleep(rest).await;
    rig.relaunch().await;

    let w = rig.wait(&[&group], "all", TASK_TIMEOUT_MS).await;
    assert_eq!(w["done"], true, "{w}");
    let after: Vec<&str> = w["tasks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["task_id"].as_str())
        .collect();
    let before: Vec<&str> = members
        .iter()
        .filter_map(|t| t["task_id"].as_str())
        .collect();
    assert_eq!(after, before, "{w}");
    for t in w["tasks"].as_array().into_iter().flatten() {
        assert_eq!(t["text"], echo_reply("one question, two models"), "{w}");
    }
}

/// **A gateway that runs no server still lets records expire.** Eviction and the sweep ran on a
/// server's reconcile tick, so a restarted gateway that only answers reads (it starts no server
/// until a task needs one) never deleted a record, nor its worktree.
///
/// Proves: after a restart with no server started, the finished task's record is still
/// answered at first, and goes once its TTL has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_expire_in_a_gateway_that_runs_no_server() {
    // Long enough for a kill and a relaunch on a loaded machine, so the record is still there
    // when the new gateway starts.
    let ttl = std::time::Duration::from_secs(12);
    let mut rig = Rig::start(&[("OPENCODE_MCP_LIMITS__FINISHED_TASK_TTL", "12s")]).await;
    let task = id(&rig.start_task("expires later").await);
    let done = rig.finish(&task).await;
    assert_eq!(done["status"], "completed", "{done}");
    let finished = std::time::Instant::now();
    let file = rig
        .env
        .root()
        .join(format!("state/opencode-mcp/tasks/{task}.json"));
    // Written as finished before the crash (the store's writer follows the turn's end).
    let written = poll_for(std::time::Duration::from_secs(10), || {
        std::fs::read_to_string(&file)
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .is_some_and(|r| r["status"] == "completed")
            .then_some(())
    })
    .await;
    assert!(written.is_some(), "the record is written as finished");
    rig.kill_gateway().await;
    rig.relaunch().await;
    let st = rig.status(&task).await;
    assert_eq!(st["status"], "completed", "answered until it expires: {st}");
    assert!(
        finished.elapsed() < ttl,
        "the machine took the whole TTL to restart; nothing was tested"
    );
    let gone = poll_for(ttl + std::time::Duration::from_secs(30), || {
        (!file.exists()).then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "the expired record is still there\n--- gateway stderr ---\n{}",
        rig.client.stderr()
    );
    let servers = rig.ok("opencode_list_tasks", json!({})).await;
    assert!(
        !servers.to_string().contains(&task),
        "an expired task is not listed: {servers}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_tasks_on_an_attached_server_are_adopted_after_a_restart() {
    let (mut rig, _opencode) = Rig::attached(OpenCodeEnv::new(), &[]).await;
    let prompt = "outlives its gateway [[delay:4000]]";
    let task = id(&rig.start_task(prompt).await);
    rig.fake
        .wait_for_request(std::time::Duration::from_secs(30), |r| {
            r.last_user_text.contains("outlives its gateway")
        })
        .await;

    rig.kill_gateway().await;
    rig.relaunch().await;

    let w = rig.wait(&[&task], "all", TASK_TIMEOUT_MS).await;
    assert_eq!(w["done"], true, "{w}");
    let r = rig
        .ok(
            "opencode_get_task_result",
            json!({ "task_id": task , "detail": "full" }),
        )
        .await;
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["text"], echo_reply(prompt));
    // Reported once: one LLM call for the turn, and the task is not duplicated.
    let session = r["task_id"]
        .as_str()
        .map(|_| ())
        .and(w["tasks"][0]["session_id"].as_str());
    assert_eq!(rig.requests_for(session.expect("session")).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_share_the_state_directory_without_stepping_on_each_other() {
    let rig = Rig::start(&[]).await;
    let done = id(&rig.start_task("finished by the first gateway").await);
    rig.finish(&done).await;
    let prompt = "still running in the first gateway [[delay:8000]]";
    let running = id(&rig.start_task(prompt).await);

    // A second gateway on the same state directory, while the first one lives.
    let second = rig.launch.connect().await.expect("a second gateway starts");
    let seen = second
        .call_ok(
            "opencode_get_task_status",
            json!({ "task_id": done , "detail": "full" }),
        )
        .await
        .expect("the second gateway answers for a finished task");
    assert_eq!(seen["status"], "completed");
    let other = second
        .call(
            "opencode_get_task_status",
            json!({ "task_id": running , "detail": "full" }),
        )
        .await
        .expect("call");
    // Answered for from its record, and left to the gateway running it: acting on it is
    // refused, naming that gateway.
    assert!(other.error_code().is_none(), "{}", other.text);
    let seen = other.structured.clone();
    assert!(
        matches!(seen["status"].as_str(), Some("pending" | "running")),
        "{seen}"
    );
    let refused = second
        .call("opencode_cancel_task", json!({ "task_id": running }))
        .await
        .expect("call");
    assert_eq!(refused.error_code(), Some("conflict"), "{}", refused.text);
    assert!(refused.text.contains("another gateway"), "{}", refused.text);
    second.close().await.expect("close");

    // The first gateway's task was not marked interrupted by the second one.
    let r = rig.finish(&running).await;
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["text"], echo_reply(prompt));
}

/// **A task whose gateway is still going when its successor starts is taken over once it is
/// gone.** A host's reconnect starts the new gateway while the old one still shuts down: the
/// new one restores in milliseconds and found the task's owner alive. It answered `not_found`
/// for the task for its whole life (a host's retry with the same idempotency key started a
/// duplicate), and nothing ever adopted the turn still running on the attached server.
///
/// The old gateway is held stopped (SIGSTOP: alive, its owner lock held) while the new one
/// starts, so the overlap does not depend on timing; then it is killed.
///
/// Proves: meanwhile the new gateway shows the task from its record and refuses to act on it,
/// naming the other gateway; a retry with the same idempotency key answers with the same task;
/// once the old gateway is gone the new one adopts the task, which completes with its answer,
/// with one LLM call for the turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_of_a_gateway_still_shutting_down_is_taken_over_once_it_is_gone() {
    let (mut rig, _opencode) = Rig::attached(OpenCodeEnv::new(), &[]).await;
    let prompt = "outlives a slow shutdown [[delay:3000]]";
    let args = json!({
        "server_id": rig.server_id(),
        "prompt": prompt,
        "idempotency_key": "retry-me"
    });
    let task = id(&rig.start_task_with(args.clone()).await);
    rig.fake
        .wait_for_request(std::time::Duration::from_secs(30), |r| {
            r.last_user_text.contains("outlives a slow shutdown")
        })
        .await;
    let old = rig.client.pid().expect("gateway pid");
    let old_t = libc::pid_t::try_from(old).expect("pid fits");
    // SAFETY: kill(2) on a pid this test spawned; no memory is involved.
    unsafe {
        libc::kill(old_t, libc::SIGSTOP);
    }
    let old_client = std::mem::replace(
        &mut rig.client,
        rig.launch.connect().await.expect("a second gateway starts"),
    );

    let st = rig.status(&task).await;
    assert!(
        matches!(st["status"].as_str(), Some("pending" | "running")),
        "the task is answered for from its record: {st}"
    );
    let (code, message) = rig
        .err(
            "opencode_continue_task",
            json!({ "task_id": task, "prompt": "x" }),
        )
        .await;
    assert_eq!(code, "conflict", "{message}");
    assert!(message.contains(&old.to_string()), "{message}");
    let retried = rig.start_task_with(args).await;
    assert_eq!(
        id(&retried),
        task,
        "the retry is the same task, not a duplicate"
    );

    kill_outright(old, old_client).await;
    completed_with_one_call(&rig, &task, prompt).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_structured_correction_under_way_is_adopted_and_checked_after_a_restart() {
    let (mut rig, _opencode) = Rig::attached(OpenCodeEnv::new(), &[]).await;
    // The wrong first value holds the correction turn open for 4 s: the correction quotes it,
    // and the fake reads `{{delay:…}}` in a user turn as its delay marker.
    let wrong = r#"```json\n{"name": "Ada", "age": "{{delay:4000}}"}\n```"#;
    let right = r#"```json\n{"name": "Ada", "age": 36}\n```"#;
    let started = rig
        .start_answering("describe Ada", &[wrong, right], person_schema())
        .await;
    let task = id(&started);
    let session = session(&started);
    rig.wait_for_correction(&session).await;
    let during = rig.status(&task).await;
    assert!(
        matches!(during["status"].as_str(), Some("pending" | "running")) && during["turn"] == 2,
        "killed during the correction: {during}"
    );

    rig.kill_gateway().await;
    rig.relaunch().await;

    // The new gateway adopts turn 2 and checks its answer, as the old one would have.
    let r = rig.finish(&task).await;
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["turn"], 2, "{r}");
    assert_eq!(r["structured"], json!({ "name": "Ada", "age": 36 }), "{r}");
    let attempts = r["structured_attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 2, "{r}");
    assert_eq!(attempts[0]["ok"], false, "{r}");
    assert_eq!(attempts[1], json!({ "turn": 2, "ok": true }), "{r}");
    // Neither turn was sent twice: one model call for the answer, one for the correction.
    let calls = rig
        .requests_for(&session)
        .iter()
        .filter(|r| !r.is_title_request())
        .count();
    assert_eq!(calls, 2, "{r}");
}

/// A turn concluded from the event stream has its changed files read in the background and
/// saved with its record, so a restarted gateway still lists them; a record whose files were
/// never read (its gateway died first) says why instead of reading as "changed nothing".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_files_survive_a_restart_and_a_missing_list_says_why() {
    // OpenCode tracks a turn's files in a git repository.
    let env = OpenCodeEnv::new();
    init_repo(&env.work_dir(), &[("README", "files\n")]);
    let mut rig = Rig::start_in(FakeLlm::start(), env, &[]).await;
    let task = id(&rig
        .start_task("[[write:made.txt:made before the crash]]")
        .await);
    let w = rig.wait(&[&task], "all", TASK_TIMEOUT_MS).await;
    assert_eq!(w["tasks"][0]["status"], "completed", "{w}");
    let state = rig.env.root().join("state/opencode-mcp/tasks");
    let record = |id: &str| -> Option<serde_json::Value> {
        let text = std::fs::read_to_string(state.join(format!("{id}.json"))).ok()?;
        serde_json::from_str(&text).ok()
    };
    // No result call: the background read alone puts them in the record.
    let saved = poll_for(std::time::Duration::from_secs(30), || {
        record(&task).filter(|r| r["files_changed"].is_array())
    })
    .await
    .expect("the changed files reach the task's record without a result call");
    assert!(
        saved["files_changed"].to_string().contains("made.txt"),
        "{saved}"
    );

    // Two tasks whose records lost their lists, as a gateway killed before reading them
    // leaves; the second ran in a directory that is gone after the restart.
    let unread = id(&rig.start_task("[[write:second.txt:also made]]").await);
    let sub = rig.env.work_dir().join("sub");
    std::fs::create_dir_all(&sub).expect("a subdirectory");
    let moved_away = id(&rig
        .start_task_with(json!({
            "prompt": "[[write:third.txt:made in sub]]",
            "directory": sub.display().to_string(),
        }))
        .await);
    rig.wait(&[&unread, &moved_away], "all", TASK_TIMEOUT_MS)
        .await;
    rig.kill_gateway().await;
    for task in [&unread, &moved_away] {
        let mut rec = record(task).expect("the task's record");
        rec["files_changed"] = serde_json::Value::Null;
        std::fs::write(
            state.join(format!("{task}.json")),
            serde_json::to_vec(&rec).expect("json"),
        )
        .expect("rewrite the record");
    }
    std::fs::remove_dir_all(&sub).expect("remove the subdirectory");
    rig.relaunch().await;

    let after = rig
        .ok("opencode_get_task_result", json!({ "task_id": task }))
        .await;
    assert!(
        after["files_changed"].to_string().contains("made.txt"),
        "{after}"
    );
    assert!(after.get("files_error").is_none(), "{after}");
    // Its server went with the old gateway; asked for the result, the new gateway reads the
    // list from the server it uses now, which has the session.
    let read_late = rig
        .ok("opencode_get_task_result", json!({ "task_id": unread }))
        .await;
    assert!(
        read_late["files_changed"]
            .to_string()
            .contains("second.txt"),
        "{read_late}"
    );
    assert!(read_late.get("files_error").is_none(), "{read_late}");
    // Nothing can read the list of a task whose directory is gone: it says why.
    let missing = rig
        .ok("opencode_get_task_result", json!({ "task_id": moved_away }))
        .await;
    assert!(missing.get("files_changed").is_none(), "{missing}");
    let why = missing["files_error"].as_str().unwrap_or_default();
    assert!(
        why.contains("never read") && why.contains(rig.server_id().as_str()),
        "a missing list says why: {missing}"
    );
}

/// A turn on an attached server that finished while the gateway was down for longer than
/// `timeouts.task` keeps its answer: the deadline that fires at once after the restart reads
/// the turn before it claims it, instead of reporting a completed answer `timed_out`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_that_finished_during_a_long_downtime_keeps_its_answer() {
    // Long enough that the first gateway is gone before it (a loaded machine once took 4 s
    // from the start to the model's request, and that gateway aborted the turn itself).
    let limit = std::time::Duration::from_secs(10);
    let (mut rig, opencode) = Rig::attached(
        OpenCodeEnv::new(),
        &[
            ("OPENCODE_MCP_TIMEOUTS__TASK", "10s"),
            ("OPENCODE_MCP_TIMEOUTS__STALL", "2s"),
        ],
    )
    .await;
    let started = tokio::time::Instant::now();
    let prompt = "finishes while nobody watches [[delay:300]]";
    let task = id(&rig.start_task(prompt).await);
    rig.fake
        .wait_for_request(std::time::Duration::from_secs(30), |r| {
            r.last_user_text.contains("finishes while nobody watches")
        })
        .await;
    rig.kill_gateway().await;

    // OpenCode finishes the turn on its own: its session leaves the busy list.
    let dir = support::opencode_server::encode(&rig.env.work_dir().display().to_string());
    let idle_within = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (code, busy) = opencode
            .get_json(&format!("/session/status?directory={dir}"))
            .await;
        if code.is_success() && busy.as_object().is_some_and(|m| m.is_empty()) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < idle_within,
            "the turn never ended in OpenCode: {busy}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // The scenario: the gateway stays down past the task's deadline.
    tokio::time::sleep_until(started + limit + std::time::Duration::from_millis(500)).await;
    rig.relaunch().await;

    let w = rig.wait(&[&task], "all", TASK_TIMEOUT_MS).await;
    assert_eq!(w["done"], true, "{w}");
    let r = rig
        .ok("opencode_get_task_result", json!({ "task_id": task }))
        .await;
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["text"], echo_reply(prompt), "{r}");
}

/// **A task another gateway started after this one's restore is taken over once that gateway
/// is gone.** Two hosts share a state directory (two windows of one user); the second one
/// starts a task and closes mid-turn. The first gateway saw no such task at its restore, so it
/// answered for it from its record and refused to act on it for its whole life; the turn went
/// on untracked on the attached server.
///
/// Proves: reading the task is enough for the first gateway to watch its owner; once that
/// owner is gone the task is adopted and completes with its answer, one LLM call for the turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_started_by_a_gateway_that_later_exits_is_taken_over() {
    let (rig, _opencode) = Rig::attached(OpenCodeEnv::new(), &[]).await;
    let second = rig.launch.connect().await.expect("a second gateway starts");
    let attached = second
        .call_ok("opencode_start_server", json!({}))
        .await
        .expect("the second gateway attaches");
    let prompt = "started by the second gateway [[delay:3000]]";
    let started = second
        .call_ok(
            "opencode_start_task",
            json!({ "server_id": attached["server_id"], "prompt": prompt }),
        )
        .await
        .expect("the second gateway starts a task");
    let task = id(&started);
    rig.fake
        .wait_for_request(std::time::Duration::from_secs(30), |r| {
            r.last_user_text.contains("started by the second gateway")
        })
        .await;
    let st = rig.status(&task).await;
    assert!(
        matches!(st["status"].as_str(), Some("pending" | "running")),
        "the first gateway answers from the record: {st}"
    );
    let pid = second.pid().expect("second gateway pid");
    kill_outright(pid, second).await;
    completed_with_one_call(&rig, &task, prompt).await;
}

/// SIGKILLs gateway `pid` (a process this test spawned, held by `client`), lets its client go
/// and waits until it is gone.
async fn kill_outright(pid: u32, client: support::mcp::McpClient) {
    // SAFETY: kill(2) on a pid this test spawned; no memory is involved.
    unsafe {
        libc::kill(libc::pid_t::try_from(pid).expect("pid fits"), libc::SIGKILL);
    }
    drop(client);
    assert!(wait_gone(pid, std::time::Duration::from_secs(10)).await);
}

/// The task completed with the echo of `prompt`, its turn one LLM call (not run twice by two
/// gateways).
async fn completed_with_one_call(rig: &Rig, task: &str, prompt: &str) {
    let r = rig.finish(task).await;
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["text"], echo_reply(prompt));
    let st = rig.status(task).await;
    let session = st["session_id"].as_str().expect("session");
    assert_eq!(
        rig.requests_for(session).len(),
        1,
        "one LLM call for the turn"
    );
}

/// **The queue** (`limits.queue`). With every slot taken, a start answers at once with status
/// `queued` and its place; the queue's bound refuses the one too many, naming it; status, the
/// task list and a result read a queued task as queued; a cancelled queued task leaves the
/// queue and never starts; a restart keeps the queue (the running task that held the slot died
/// with the old gateway's server), and the queued tasks then start first in, first out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_tasks_wait_for_a_slot_in_order_and_survive_a_restart() {
    let mut rig = Rig::start(&[
        ("OPENCODE_MCP_LIMITS__MAX_TASKS", "1"),
        ("OPENCODE_MCP_LIMITS__QUEUE", "2"),
    ])
    .await;
    let (_gate, held) = rig.gate();
    let holder = id(&rig.start_task(&format!("holds the slot {held}")).await);
    let first = rig.start_task("queued first").await;
    assert_eq!(first["status"], "queued", "{first}");
    assert_eq!(first["queue_position"], 1, "{first}");
    let cancelled = rig.start_task("queued, then cancelled").await;
    assert_eq!(cancelled["queue_position"], 2, "{cancelled}");
    let (code, message) = rig
        .err(
            "opencode_start_task",
            json!({ "server_id": rig.server_id(), "prompt": "one too many" }),
        )
        .await;
    assert_eq!(code, "limit_exceeded", "{message}");
    assert!(message.contains("limits.queue is 2"), "{message}");
    let (first, cancelled) = (id(&first), id(&cancelled));

    let status = rig.status(&first).await;
    assert_eq!(status["status"], "queued", "{status}");
    let result = rig
        .ok("opencode_get_task_result", json!({ "task_id": first }))
        .await;
    assert_eq!(result["status"], "queued", "{result}");
    let listed = rig.ok("opencode_list_tasks", json!({})).await.to_string();
    assert!(
        listed.contains(&first) && listed.contains("queued"),
        "{listed}"
    );
    let gone = rig
        .ok("opencode_cancel_task", json!({ "task_id": cancelled }))
        .await;
    assert_eq!(gone["status"], "cancelled", "{gone}");
    let second = id(&rig.start_task("queued second").await);
    assert_eq!(rig.status(&second).await["queue_position"], 2);

    // A restart: the slot's holder died with the old gateway's server; the queue is kept.
    rig.kill_gateway().await;
    rig.relaunch().await;
    let w = rig
        .wait(&[&holder, &first, &second], "all", TASK_TIMEOUT_MS)
        .await;
    assert_eq!(w["done"], true, "{w}\n{}", rig.client.stderr());
    let statuses: Vec<&str> = w["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .map(|t| t["status"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(statuses, ["failed", "completed", "completed"], "{w}");
    assert_eq!(rig.status(&cancelled).await["status"], "cancelled");
    // First in, first out; the cancelled one never reached the model.
    let prompts: Vec<String> = rig
        .fake
        .requests()
        .into_iter()
        .map(|r| r.last_user_text)
        .collect();
    let at = |text: &str| prompts.iter().position(|p| p.contains(text));
    assert!(at("queued first") < at("queued second"), "{prompts:?}");
    assert!(at("queued first").is_some(), "{prompts:?}");
    assert_eq!(at("then cancelled"), None, "{prompts:?}");
}

/// **The queue in one gateway's life.** Queued tasks start as the slot frees, first in first
/// out, each in its own turn; a queued task cancelled never starts; a `fan_out` that finds no
/// room queues its targets; a queued task whose start turns out impossible (a model the server
/// does not have) ends `failed` (`StartFailed`, saying why) instead of waiting for ever; and a
/// wait on queued tasks returns once they finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_tasks_start_as_the_slot_frees() {
    let rig = Rig::start(&[
        ("OPENCODE_MCP_LIMITS__MAX_TASKS", "1"),
        ("OPENCODE_MCP_LIMITS__QUEUE", "5"),
    ])
    .await;
    let (gate, held) = rig.gate();
    let holder = id(&rig.start_task(&format!("holds the slot {held}")).await);
    let first = id(&rig.start_task("in line first").await);
    let dropped = id(&rig.start_task("in line, then cancelled").await);
    let impossible = rig
        .start_task_with(json!({ "prompt": "in line, impossible", "model": "fake/no-such-model" }))
        .await;
    assert_eq!(impossible["status"], "queued", "{impossible}");
    let impossible = id(&impossible);
    let group = rig
        .ok(
            "opencode_fan_out",
            json!({
                "server_id": rig.server_id(),
                "prompt": "in line as a group",
                "tiers": ["fast", "strong"],
            }),
        )
        .await;
    let members: Vec<String> = group["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .map(|t| {
            assert_eq!(t["status"], "queued", "{group}");
            id(t)
        })
        .collect();
    assert_eq!(members.len(), 2, "{group}");
    let cancelled = rig
        .ok("opencode_cancel_task", json!({ "task_id": dropped }))
        .await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    assert_eq!(rig.status(&first).await["queue_position"], 1);
    assert_eq!(rig.status(&impossible).await["queue_position"], 2);

    std::fs::write(&gate, "open").expect("open the gate");
    let mut all = vec![holder.as_str(), first.as_str(), impossible.as_str()];
    all.extend(members.iter().map(String::as_str));
    let w = rig.wait(&all, "all", TASK_TIMEOUT_MS).await;
    assert_eq!(w["done"], true, "{w}\n{}", rig.client.stderr());
    let status = |task: &str| {
        w["tasks"]
            .as_array()
            .and_then(|ts| ts.iter().find(|t| t["task_id"] == task))
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(status(&holder)["status"], "completed");
    assert_eq!(status(&first)["status"], "completed");
    for member in &members {
        assert_eq!(status(member)["status"], "completed", "{w}");
    }
    let failed = status(&impossible);
    assert_eq!(failed["status"], "failed", "{failed}");
    let error = failed["error"].to_string();
    assert!(
        error.contains("StartFailed") && error.contains("no-such-model"),
        "{error}"
    );
    assert_eq!(rig.status(&dropped).await["status"], "cancelled");
    let prompts: Vec<String> = rig
        .fake
        .requests()
        .into_iter()
        .map(|r| r.last_user_text)
        .collect();
    let at = |text: &str| prompts.iter().position(|p| p.contains(text));
    assert!(at("in line first").is_some(), "{prompts:?}");
    assert!(
        at("in line first") < at("in line as a group"),
        "{prompts:?}"
    );
    assert_eq!(at("then cancelled"), None, "{prompts:?}");
}

/// A gateway killed while a task's checks run: the restarted gateway adopts the task, holds its
/// completed turn again and runs the checks again; the task passes without another model call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_under_way_are_run_again_after_a_restart() {
    let (mut rig, _opencode) = Rig::attached(
        OpenCodeEnv::new(),
        &[("OPENCODE_MCP_CHECKS__FROM_CALLS", "true")],
    )
    .await;
    let (runs, gate, check) = gated_check(&rig);
    let started = rig
        .start_task_with(json!({ "prompt": "checked work", "checks": [check] }))
        .await;
    let task = id(&started);
    let session = session(&started);
    // The check's first run is under way (the task is still running meanwhile).
    check_started(&runs).await;
    let during = rig.status(&task).await;
    assert_eq!(
        during["status"], "running",
        "held while its checks run: {during}"
    );

    rig.kill_gateway().await;
    std::fs::write(&gate, "open").expect("open the gate");
    rig.relaunch().await;

    let r = rig.finish(&task).await;
    assert_eq!(r["status"], "completed", "{r}");
    checks_ran_again(&rig, &runs, &session, &r);
}

/// **Cancelled is on disk before it is said.** A task cancelled while it runs, its gateway
/// SIGKILLed the moment the cancel answers: the next gateway reports it cancelled, not
/// interrupted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_is_on_disk_before_it_answers() {
    let mut rig = Rig::start(&[]).await;
    let running = id(&rig.start_task("cancel me [[slow:30000]]").await);
    rig.fake
        .wait_for_request(std::time::Duration::from_secs(30), |r| {
            r.last_user_text.contains("cancel me")
        })
        .await;
    let cancelled = rig
        .ok("opencode_cancel_task", json!({ "task_id": running }))
        .await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    rig.kill_gateway().await;
    rig.relaunch().await;
    let st = rig.status(&running).await;
    assert_eq!(st["status"], "cancelled", "{st}");
}

/// **A continue is on disk before it is said.** A follow-up's new turn is a change in the
/// middle of a task's life that the store may hold back up to a second (to coalesce a turn's
/// first changes); the gateway answers only once it is written. The gateway is SIGKILLed the
/// moment the continue answers: the next gateway knows the second turn (it was reading the
/// first turn's record, `completed`, and would have given its answer as the follow-up's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_continue_is_on_disk_before_it_answers() {
    let mut rig = Rig::start(&[]).await;
    let task = id(&rig.start_task("first turn").await);
    let first = rig.finish(&task).await;
    assert_eq!(first["status"], "completed", "{first}");
    let continued = rig
        .ok(
            "opencode_continue_task",
            json!({ "task_id": task, "prompt": "second turn [[slow:30000]]" }),
        )
        .await;
    assert_eq!(continued["task_id"], task.as_str(), "{continued}");
    rig.kill_gateway().await;
    rig.relaunch().await;
    let st = rig.status(&task).await;
    assert_eq!(st["turn"], 2, "the second turn survived the kill: {st}");
    assert_ne!(st["status"], "completed", "not the first turn's end: {st}");
}

/// **A fan-out group is whole while another gateway runs it.** A host's reconnect starts the
/// new gateway while the old one still runs the group's tasks. The new gateway answers for
/// another live gateway's tasks from their records, and a wait on the group id used to be
/// `not_found` there: those records were never joined to their group.
///
/// Proves: the second gateway's wait on the group names both running members, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fan_out_group_is_whole_in_a_second_gateway() {
    let rig = Rig::start(&[]).await;
    let (gate, held) = rig.gate();
    let out = rig
        .ok(
            "opencode_fan_out",
            json!({
                "server_id": rig.server_id(),
                "prompt": format!("wait for the gate {held}"),
                "models": ["fake/fake-model", "fake/fake-strong"]
            }),
        )
        .await;
    let group = out["group_id"].as_str().expect("group_id").to_string();
    let members: Vec<String> = out["tasks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["task_id"].as_str().map(str::to_string))
        .collect();
    assert_eq!(members.len(), 2, "{out}");

    let second = rig.launch.connect().await.expect("a second gateway starts");
    let seen = second
        .call_ok(
            "opencode_wait_for_task",
            json!({ "task_ids": [group], "timeout_ms": 0 }),
        )
        .await
        .expect("the second gateway knows the group");
    let listed: Vec<&str> = seen["tasks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["task_id"].as_str())
        .collect();
    assert_eq!(listed, members, "{seen}");
    assert_eq!(seen["done"], false, "{seen}");
    second.close().await.expect("close");

    std::fs::write(&gate, "open").expect("open the gate");
    let w = rig.wait(&[&group], "all", TASK_TIMEOUT_MS).await;
    assert_eq!(w["done"], true, "{w}");
}

/// **Work outlives a host's reconnect, on this machine.** A host's `/mcp` or update starts a
/// new gateway and closes the old one's stdin while a task runs on the managed OpenCode. The old
/// gateway used to stop that OpenCode on its way out, and the task ended `failed`
/// (`Interrupted`). Now it asks the OpenCode's supervisor to linger (`limits.linger`), the new
/// gateway takes the server over once the old one is gone, and the task ends `completed` on the
/// same OpenCode, its agent still confined. Once the new gateway exits with no task left
/// running, that OpenCode stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_task_runs_on_across_a_clean_reconnect() {
    let mut rig = Rig::start(&[("OPENCODE_MCP_LIMITS__LINGER", "60s")]).await;
    let (gate, hold) = rig.gate();
    let task = id(&rig
        .start_task(&format!(
            "across a reconnect {hold} [[write:held.txt:held\\n]]"
        ))
        .await);
    let status = rig.running(&task).await;
    assert_eq!(status["status"], "running", "{status}");
    let opencode = rig.opencode_pid();

    // A reconnect: the new gateway starts, then the old one's stdin closes.
    let next = rig.launch.connect().await.expect("the new gateway starts");
    let old = std::mem::replace(&mut rig.client, next);
    let said = old.stderr_handle();
    old.close().await.expect("the old gateway exits cleanly");
    assert!(
        support::rig::alive(opencode),
        "the managed OpenCode did not outlive the clean exit of its gateway:\n{}",
        said()
    );
    let during = rig.status(&task).await;
    assert!(
        matches!(during["status"].as_str(), Some("pending" | "running")),
        "{during}\n{}",
        rig.client.stderr()
    );
    std::fs::write(&gate, "open").expect("open the gate");
    let result = rig.finish(&task).await;
    assert_eq!(
        result["status"],
        "completed",
        "{result}\n--- the old gateway ---\n{}\n--- the new gateway ---\n{}",
        said(),
        rig.client.stderr()
    );
    assert!(
        support::rig::alive(opencode),
        "the same OpenCode finished the task"
    );
    // Its agents' commands still go through the confining shell OpenCode was started with:
    // the old gateway left its file in place, the new one keeps it.
    let script = format!("{}.sh", rig.server_id());
    assert!(
        find_file(&rig.env.root().join("state"), &script),
        "the confining shell {script} is gone: OpenCode would run commands unconfined"
    );

    // No task runs: the new gateway's clean exit stops it.
    let next = rig.launch.connect().await.expect("a third gateway");
    let client = std::mem::replace(&mut rig.client, next);
    client.close().await.expect("the gateway exits cleanly");
    assert!(
        wait_gone(opencode, std::time::Duration::from_secs(15)).await,
        "the OpenCode ran on after its last task was done and its gateway exited"
    );
}

/// **Checks under way run again across a clean reconnect.** A task whose checks were running
/// when its gateway exited cleanly lingers on the same OpenCode, held for its checks; the next
/// gateway takes it over, runs the checks again, and the task ends `completed` with them
/// passed, without another model call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_under_way_run_again_across_a_clean_reconnect() {
    let mut rig = Rig::start(&[
        ("OPENCODE_MCP_LIMITS__LINGER", "60s"),
        ("OPENCODE_MCP_CHECKS__FROM_CALLS", "true"),
    ])
    .await;
    let (runs, gate, check) = gated_check(&rig);
    let started = rig
        .start_task_with(json!({ "prompt": "checked across a reconnect", "checks": [check] }))
        .await;
    let task = id(&started);
    let session = session(&started);
    check_started(&runs).await;
    let opencode = rig.opencode_pid();

    let next = rig.launch.connect().await.expect("the new gateway starts");
    let old = std::mem::replace(&mut rig.client, next);
    let said = old.stderr_handle();
    old.close().await.expect("the old gateway exits cleanly");
    assert!(
        support::rig::alive(opencode),
        "the OpenCode of a task held for its checks did not outlive the clean exit:\n{}",
        said()
    );
    std::fs::write(&gate, "open").expect("open the gate");
    let r = rig.finish(&task).await;
    assert_eq!(
        r["status"],
        "completed",
        "{r}\n--- the old gateway ---\n{}\n--- the new gateway ---\n{}",
        said(),
        rig.client.stderr()
    );
    checks_ran_again(&rig, &runs, &session, &r);
}

/// **Each task's deadline holds while no gateway runs.** Task B is held for its checks when its
/// gateway exits cleanly, so its OpenCode lingers for the whole `limits.linger`. Task A, open
/// and streaming, reaches its `timeouts.task` meanwhile: the supervisor aborts A's session at
/// that deadline, with no gateway (the model's stream is cut then, not when the next gateway
/// comes), and the next gateway reports A `timed_out`, saying no gateway ran; B ends
/// `completed`. The 15 s deadline is reloaded in once B is held: a running gateway holds a
/// held turn to the deadline in force when it began (its checks count), and that one must not
/// pass before the gateway exits, however slow the machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tasks_deadline_holds_while_no_gateway_runs() {
    let env = OpenCodeEnv::new();
    // The user's global file (`$XDG_CONFIG_HOME/opencode-mcp/`), which a reload re-reads.
    let user_file = env.root().join("config/opencode-mcp/delegation.yaml");
    std::fs::create_dir_all(user_file.parent().expect("parent")).expect("mkdir");
    std::fs::write(
        &user_file,
        "limits:\n  linger: 10m\nchecks:\n  from_calls: true\n",
    )
    .expect("write the user's file");
    let mut rig = Rig::start_in(FakeLlm::start(), env, &[]).await;
    let (runs, gate, check) = gated_check(&rig);
    let held = id(&rig
        .start_task_with(json!({ "prompt": "held for its checks", "checks": [check] }))
        .await);
    check_started(&runs).await;
    rig.append_and_reload(&user_file, "timeouts:\n  task: 15s\n")
        .await;
    let started = std::time::Instant::now();
    let open = id(&rig
        .start_task("streams past its deadline [[slow:90000]]")
        .await);
    let request = rig
        .fake
        .wait_for_request(std::time::Duration::from_secs(30), |r| {
            r.last_user_text.contains("streams past its deadline")
        })
        .await;
    let opencode = rig.opencode_pid();

    rig.exit_and_see_aborted_at(request.index, started, std::time::Duration::from_secs(15))
        .await;
    assert!(
        support::rig::alive(opencode),
        "the OpenCode stopped: the held task keeps it for limits.linger"
    );

    std::fs::write(&gate, "open").expect("open the gate");
    rig.relaunch_and_see_timed_out(&open, &held).await;
}

/// A check that records each run in `check-runs` and passes only once `check-gate` exists
/// (waiting up to 10 s for it), both in the task's directory, where a confined check may write:
/// (runs, gate, the command). A run that cannot record itself fails, its output saying why.
fn gated_check(rig: &Rig) -> (std::path::PathBuf, std::path::PathBuf, String) {
    let runs = rig.env.work_dir().join("check-runs");
    let gate = rig.env.work_dir().join("check-gate");
    let check = format!(
        "echo run >> {runs} || exit 3; test -f {gate} || sleep 10; test -f {gate}",
        runs = runs.display(),
        gate = gate.display()
    );
    (runs, gate, check)
}

/// The task's [`gated_check`] passed in the next gateway, which ran it again, with no fix round
/// and no model call after the first.
fn checks_ran_again(rig: &Rig, runs: &std::path::Path, session: &str, r: &serde_json::Value) {
    assert_eq!(r["checks"]["status"], "passed", "{r}");
    assert_eq!(r["checks"]["rounds"], 0, "{r}");
    let ran = std::fs::read_to_string(runs).unwrap_or_default();
    assert!(ran.lines().count() >= 2, "the check ran again: {ran:?} {r}");
    assert_eq!(rig.model_calls(session), 1, "a model call after the first");
}

/// Waits until a [`gated_check`] has begun its first run.
async fn check_started(runs: &std::path::Path) {
    // Its line, not just the file: `>>` makes the file before it writes, and a gateway killed
    // in between took that first run with it (a loaded machine once saw one line in all).
    let began = poll_for(std::time::Duration::from_secs(60), || {
        std::fs::read_to_string(runs)
            .is_ok_and(|t| t.contains("run\n"))
            .then_some(())
    })
    .await;
    assert!(began.is_some(), "the check never started");
}

/// Whether a file named `name` is anywhere under `dir`.
fn find_file(dir: &std::path::Path, name: &str) -> bool {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| {
            let path = e.path();
            if path.is_dir() {
                find_file(&path, name)
            } else {
                e.file_name() == name
            }
        })
}

/// **With no gateway, nothing runs past its deadline.** A gateway that exits cleanly while a
/// task runs lets its OpenCode run on, but only until that task's turn would have reached
/// `timeouts.task`, not for the whole `limits.linger` (10 min by default): no gateway enforces a
/// deadline meanwhile. The next gateway reports the task `Interrupted`, naming why, and leaves
/// no linger file behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lingering_opencode_stops_at_its_tasks_deadline() {
    let mut rig = Rig::start(&[("OPENCODE_MCP_TIMEOUTS__TASK", "12s")]).await;
    let (_gate, hold) = rig.gate();
    let task = id(&rig.start_task(&format!("past its deadline {hold}")).await);
    let status = rig.running(&task).await;
    assert_eq!(status["status"], "running", "{status}");
    let opencode = rig.opencode_pid();

    let next = rig.launch.connect().await.expect("a gateway to replace it");
    let old = std::mem::replace(&mut rig.client, next);
    let said = old.stderr_handle();
    // The replacement is killed first, so that no gateway takes the task over.
    rig.kill_gateway().await;
    old.close().await.expect("the gateway exits cleanly");
    assert!(
        support::rig::alive(opencode),
        "the OpenCode did not run on for its task:\n{}",
        said()
    );
    assert!(
        wait_gone(opencode, std::time::Duration::from_secs(45)).await,
        "the OpenCode ran on long past its task's deadline:\n{}",
        said()
    );

    rig.relaunch().await;
    // Taken over in the background once restored: its end follows the failed connection.
    let w = rig.wait(&[&task], "all", 30_000).await;
    assert_eq!(w["done"], true, "{w}");
    let st = rig.status(&task).await;
    assert_eq!(st["status"], "failed", "{st}");
    assert_eq!(st["error"]["name"], "Interrupted", "{st}");
    let linger = rig
        .env
        .root()
        .join("state")
        .join("opencode-mcp")
        .join("linger");
    let left: Vec<_> = std::fs::read_dir(&linger)
        .expect("the linger directory the old gateway made")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(
        left.is_empty(),
        "files outlived the server they name: {left:?}"
    );
}

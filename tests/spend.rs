//! Spend guards and model control end to end: a real gateway over stdio, a real OpenCode, and
//! the scripted fake LLM, whose `[[usage:<n>]]` makes every step of a turn report `n` prompt
//! tokens (the fake model costs $1 per million input tokens, so `[[usage:100000]]` is about
//! $0.10 a step), and which records every request OpenCode sends it.

mod support;

use serde_json::json;
use support::rig::{Rig, TASK_TIMEOUT_MS};
use support::{FakeLlm, OpenCodeEnv, FAKE_MODEL, FAKE_PROVIDER, FAKE_STRONG_MODEL};

/// A task whose steps report growing cost is stopped within one step of passing its budget:
/// it ends `failed` (`BudgetExceeded`, naming the cap), its partial turn is readable, and what
/// it spent counts toward the day, whose cap then refuses the next task saying when it resets.
/// A call's budget above the cap in force is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_over_its_budget_is_stopped_and_the_days_cap_refuses_the_next() {
    let rig = Rig::start(&[
        ("OPENCODE_MCP_LIMITS__MAX_COST_USD", "1"),
        ("OPENCODE_MCP_LIMITS__MAX_COST_USD_PER_DAY", "0.2"),
    ])
    .await;
    // A second gateway on the same state directory (another host window), started before
    // anything was spent: the day's cap is the user's, whichever gateway spent it.
    let second = rig.launch.connect().await.expect("a second gateway starts");

    // Above the cap in force: refused before anything starts.
    let (code, message) = rig
        .err(
            "opencode_start_task",
            json!({ "server_id": "default", "prompt": "x", "budget": { "max_cost_usd": 5 } }),
        )
        .await;
    assert_eq!(code, "invalid_argument", "{message}");
    assert!(message.contains("limits.max_cost_usd"), "{message}");
    for bad in [
        json!({ "max_cost_usd": 0 }),
        json!({ "max_cost_usd": -1 }),
        json!({ "max_tokens": 0 }),
    ] {
        let (code, message) = rig
            .err(
                "opencode_start_task",
                json!({ "server_id": "default", "prompt": "x", "budget": bad }),
            )
            .await;
        assert_eq!(code, "invalid_argument", "{bad}: {message}");
    }

    // Six steps planned at about $0.10 each, under a $0.25 budget.
    let steps: String = (1..=5)
        .map(|i| format!(" [[bash:echo step {i}]]"))
        .collect();
    let prompt = format!("spend [[usage:100000]]{steps}");
    let started = rig
        .start_task_with(json!({ "prompt": prompt, "budget": { "max_cost_usd": 0.25 } }))
        .await;
    let task = started["task_id"].as_str().expect("task_id").to_string();
    let w = rig.wait(&[&task], "all", TASK_TIMEOUT_MS).await;
    assert_eq!(w["done"], true, "{w}");
    let r = rig
        .ok(
            "opencode_get_task_result",
            json!({ "task_id": task, "detail": "full" }),
        )
        .await;
    assert_eq!(r["status"], "failed", "{r}");
    assert_eq!(r["error"]["name"], "BudgetExceeded", "{r}");
    let why = r["error"]["message"].as_str().unwrap_or_default();
    assert!(why.contains("max_cost_usd $0.25"), "{why}");
    assert!(
        r.get("text_error").is_none(),
        "the partial turn is readable: {r}"
    );
    let st = rig
        .ok(
            "opencode_get_task_status",
            json!({ "task_id": task, "detail": "full" }),
        )
        .await;
    let session = st["session_id"].as_str().unwrap_or_else(|| panic!("{st}"));
    let asked = rig.model_calls(session);
    // The cap is passed when the third step reports its cost; the fourth may be under way.
    assert!(
        (3..=4).contains(&asked),
        "stopped within one step of passing the cap: {asked} model calls of 6 planned"
    );
    let spent = r["cost"].as_f64().unwrap_or_default();
    assert!(spent > 0.25, "what it spent is recorded: {r}");
    let usage = rig.ok("opencode_usage", json!({})).await;
    let counted = usage["total"]["cost"].as_f64().unwrap_or_default();
    assert!(
        (counted - spent).abs() < 1e-9,
        "the usage report counts what the stopped task spent: {usage}"
    );
    assert_eq!(
        usage["total"]["priced_cost"], 0.0,
        "OpenCode reported it: {usage}"
    );

    // The day's recorded spend is past its cap: the next task is refused, running ones are not.
    let (code, message) = rig
        .err(
            "opencode_start_task",
            json!({ "server_id": "default", "prompt": "one more" }),
        )
        .await;
    assert_eq!(code, "budget_exceeded", "{message}");
    assert!(
        message.contains("max_cost_usd_per_day") && message.contains("00:00 UTC"),
        "{message}"
    );
    // The other gateway counts what this one spent: it refuses too (it used to count only
    // its own tasks, so each gateway could spend the whole cap).
    let refused = second
        .call(
            "opencode_start_task",
            json!({ "server_id": "default", "prompt": "from the other window" }),
        )
        .await
        .expect("call");
    assert_eq!(
        refused.error_code(),
        Some("budget_exceeded"),
        "{}",
        refused.text
    );
    second.close().await.expect("close");
}

/// A variant (reasoning effort) reaches the model request as OpenCode sends it, from a tier's
/// config or a call; a variant the model lacks, one on a model without variants, and one with
/// no model named are refused with what would be valid (OpenCode itself accepts any word and
/// silently runs without it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_variant_reaches_the_model_and_a_wrong_one_is_refused() {
    let env = OpenCodeEnv::new().with_config(json!({ "provider": { FAKE_PROVIDER: { "models": {
        FAKE_MODEL: { "variants": {
            "high": { "reasoningEffort": "high" },
            "low": { "reasoningEffort": "low" }
        } }
    } } } }));
    let model = format!("{FAKE_PROVIDER}/{FAKE_MODEL}");
    let strong = format!("{FAKE_PROVIDER}/{FAKE_STRONG_MODEL}");
    std::fs::write(
        env.work_dir().join("delegation.yaml"),
        format!(
            "tiers:\n  - {{name: fast, handles: quick work, models: [{model}], variant: low}}\n  \
             - {{name: standard, handles: most work, models: [{model}]}}\n  \
             - {{name: strong, handles: hard work, models: [{strong}]}}\n"
        ),
    )
    .expect("write the repository's delegation.yaml");
    let rig = Rig::start_in(FakeLlm::start(), env, &[]).await;

    for (args, effort) in [
        (json!({ "prompt": "on the tier", "tier": "fast" }), "low"),
        (
            json!({ "prompt": "on the call", "model": model, "variant": "high" }),
            "high",
        ),
    ] {
        let started = rig.start_task_with(args.clone()).await;
        let task = started["task_id"].as_str().expect("task_id").to_string();
        let r = rig.finish(&task).await;
        assert_eq!(r["status"], "completed", "{args}: {r}");
        let full = rig
            .ok(
                "opencode_get_task_status",
                json!({ "task_id": task, "detail": "full" }),
            )
            .await;
        assert_eq!(full["variant"], effort, "{full}");
        let session = full["session_id"].as_str().expect("session_id");
        let sent: Vec<String> = rig
            .requests_for(session)
            .into_iter()
            .filter(|q| !q.is_title_request())
            .map(|q| {
                q.body["reasoning_effort"]
                    .as_str()
                    .unwrap_or("(none)")
                    .to_string()
            })
            .collect();
        assert!(
            !sent.is_empty() && sent.iter().all(|e| e == effort),
            "{args}: the model was asked with {sent:?}"
        );
    }

    for (args, says) in [
        (
            json!({ "server_id": "default", "prompt": "x", "model": model, "variant": "nope" }),
            "its variants are: high, low",
        ),
        (
            json!({ "server_id": "default", "prompt": "x", "model": strong, "variant": "high" }),
            "has no variants",
        ),
        (
            json!({ "server_id": "default", "prompt": "x", "variant": "high" }),
            "needs a model",
        ),
    ] {
        let (code, message) = rig.err("opencode_start_task", args.clone()).await;
        assert_eq!(code, "invalid_argument", "{args}: {message}");
        assert!(message.contains(says), "{args}: {message}");
    }
}

/// `limits.max_tasks` and the day's cap hold for every turn that calls a model, however the
/// calls arrive: of five starts sent at once under `max_tasks: 2`, two start and three are
/// refused (each took its room only when its task was registered, so all five passed a check
/// that only counted); a follow-up that brings a finished task back to work while two others
/// run is refused too; and once the day's spend passed its cap, a follow-up is refused like a
/// new task (it spent without limit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caps_take_their_room_at_the_check_and_hold_for_follow_ups() {
    let rig = Rig::start(&[
        ("OPENCODE_MCP_LIMITS__MAX_TASKS", "2"),
        ("OPENCODE_MCP_LIMITS__MAX_COST_USD_PER_DAY", "0.15"),
    ])
    .await;
    let server = rig.server_id();
    let calls = (0..5).map(|i| {
        rig.client.call(
            "opencode_start_task",
            json!({ "server_id": server, "prompt": format!("at once {i} [[delay:2000]]") }),
        )
    });
    let replies = futures::future::join_all(calls).await;
    let mut started = Vec::new();
    let mut refused = 0;
    for reply in replies {
        let reply = reply.expect("the call is answered");
        if reply.is_error {
            assert_eq!(reply.error_code(), Some("limit_exceeded"), "{}", reply.text);
            refused += 1;
        } else {
            started.push(
                reply.structured["task_id"]
                    .as_str()
                    .expect("id")
                    .to_string(),
            );
        }
    }
    assert_eq!((started.len(), refused), (2, 3), "{started:?}");
    let ids: Vec<&str> = started.iter().map(String::as_str).collect();
    let w = rig.wait(&ids, "all", TASK_TIMEOUT_MS).await;
    assert_eq!(w["done"], true, "{w}");

    // Two run; a follow-up of a finished one would make three.
    let running: Vec<String> = futures::future::join_all(
        (0..2)
            .map(|i| rig.start_task_with(json!({ "prompt": format!("busy {i} [[delay:3000]]") }))),
    )
    .await
    .iter()
    .map(|s| s["task_id"].as_str().expect("id").to_string())
    .collect();
    let (code, message) = rig
        .err(
            "opencode_continue_task",
            json!({ "task_id": started[0], "prompt": "and one more thing" }),
        )
        .await;
    assert_eq!(code, "limit_exceeded", "{message}");
    assert!(message.contains("max_tasks"), "{message}");
    let ids: Vec<&str> = running.iter().map(String::as_str).collect();
    let w = rig.wait(&ids, "all", TASK_TIMEOUT_MS).await;
    assert_eq!(w["done"], true, "{w}");

    // About $0.20 in one step: past the day's $0.15. Its follow-up is refused like a new task.
    let costly = rig.start_task("costly [[usage:200000]]").await;
    let costly = costly["task_id"].as_str().expect("id").to_string();
    let r = rig.finish(&costly).await;
    assert_eq!(r["status"], "completed", "{r}");
    let (code, message) = rig
        .err(
            "opencode_continue_task",
            json!({ "task_id": costly, "prompt": "spend some more" }),
        )
        .await;
    assert_eq!(code, "budget_exceeded", "{message}");
    assert!(message.contains("max_cost_usd_per_day"), "{message}");
    let asked = rig.fake.requests().len();
    let (code, _) = rig
        .err(
            "opencode_continue_task",
            json!({ "task_id": started[1], "prompt": "and another" }),
        )
        .await;
    assert_eq!(code, "budget_exceeded");
    assert_eq!(rig.fake.requests().len(), asked, "no model was called");
}

/// **Steps that finished while no gateway watched count against the budget.** The per-turn caps
/// saw only what the event stream delivered: a turn adopted after a restart (or after a stream
/// gap) started counting from zero, and could spend its whole cap again. Now its spend is read
/// over HTTP (its session's and its subagents' messages) once adopted.
///
/// An attached OpenCode goes on with a capped turn while the gateway is killed; three or more
/// steps of about $0.10 finish unwatched; a new gateway adopts the turn.
///
/// Proves: the turn ends `BudgetExceeded` within two model calls of the adoption (without the
/// read it had $0.35 to spend afresh: four more steps).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_spent_while_no_gateway_watched_count_against_the_budget() {
    let (mut rig, _opencode) = Rig::attached(OpenCodeEnv::new(), &[]).await;
    let steps: String = (1..=11)
        .map(|i| format!(" [[bash:echo step {i}]]"))
        .collect();
    // Each model call waits 2.5 s: longer than a gateway takes to start and adopt the turn,
    // also on a loaded machine, so the calls counted before the relaunch are all but one.
    let prompt = format!("spend unwatched [[usage:100000]] [[delay:2500]]{steps}");
    let started = rig
        .start_task_with(json!({ "prompt": prompt, "budget": { "max_cost_usd": 0.35 } }))
        .await;
    let task = started["task_id"].as_str().expect("task_id").to_string();
    let st = rig.status(&task).await;
    let session = st["session_id"].as_str().expect("session_id").to_string();
    rig.fake
        .wait_for_request(std::time::Duration::from_secs(30), |r| {
            r.last_user_text.contains("spend unwatched")
        })
        .await;
    rig.kill_gateway().await;
    let unwatched = support::rig::poll_for(std::time::Duration::from_secs(90), || {
        (rig.model_calls(&session) >= 4).then_some(())
    })
    .await;
    assert!(unwatched.is_some(), "OpenCode went on without the gateway");
    let before = rig.model_calls(&session);
    rig.relaunch().await;

    let r = rig.finish(&task).await;
    assert_eq!(r["status"], "failed", "{r}");
    assert_eq!(r["error"]["name"], "BudgetExceeded", "{r}");
    let asked = rig.model_calls(&session);
    assert!(
        asked <= before + 2,
        "stopped within two model calls of the adoption: {before} calls before it, {asked} in all"
    );
}

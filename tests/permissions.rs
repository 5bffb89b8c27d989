//! Fault drill: a permission ask nobody answers. With policy `ask` the task shows
//! `waiting_permission` with what is asked, and a wait under way returns for it at once; `opencode_reply_permission` answers once, always or
//! reject; cancelling a task rejects its pending ask. Also: a stalled task is reported, not killed,
//! and the cap on tracked tasks is a clear error.

mod support;

use std::time::Duration;

use serde_json::json;
use support::fake_llm::echo_reply;
use support::rig::Rig;
use support::OpenCodeEnv;

fn id(v: &serde_json::Value) -> String {
    v["task_id"].as_str().expect("task_id").to_string()
}

/// Waits (bounded) until the task reports `waiting_permission`; returns its snapshot.
async fn until_asked(rig: &Rig, task: &str) -> serde_json::Value {
    let w = rig.wait(&[task], "any", 100).await;
    if w["tasks"][0]["status"] == "waiting_permission" {
        return w["tasks"][0].clone();
    }
    // Wake on changes until the ask shows (each wait returns at its timeout with a snapshot).
    for _ in 0..300 {
        let w = rig.wait(&[task], "any", 200).await;
        if w["tasks"][0]["status"] == "waiting_permission" {
            return w["tasks"][0].clone();
        }
        assert_ne!(w["done"], true, "finished without asking: {w}");
    }
    panic!("task {task} never asked for permission")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permission_asks_are_shown_and_answered() {
    let env = OpenCodeEnv::new().with_config(json!({ "permission": "ask" }));
    let (rig, opencode) = Rig::attached(env, &[]).await;

    // Answered once: the tool runs and the task completes. The model holds its tool call back
    // for 1.5 s, so the ask comes while the wait below runs, and ends it early: a task that
    // cannot go on until someone answers is news now, not at the wait's timeout.
    let prompt = "needs a shell [[delay:1500]] [[bash:echo permitted-$((6*7))]]";
    let allowed = id(&rig.start_task(prompt).await);
    let w = rig.wait(&[&allowed], "all", 60_000).await;
    assert_eq!(w["asking"], json!([allowed]), "{w}");
    assert_eq!(
        (&w["done"], &w["timed_out"]),
        (&json!(false), &json!(false)),
        "{w}"
    );
    let asked = w["tasks"][0].clone();
    assert_eq!(asked["status"], "waiting_permission", "{asked}");
    assert_eq!(asked["permissions"][0]["permission"], "bash", "{asked}");
    // Once said, the same ask does not end the next wait early.
    let again = rig.wait(&[&allowed], "all", 300).await;
    assert!(again.get("asking").is_none(), "{again}");
    assert_eq!(again["timed_out"], true, "{again}");
    assert_eq!(again["tasks"][0]["status"], "waiting_permission", "{again}");
    assert!(asked["permissions"][0]["patterns"]
        .to_string()
        .contains("echo permitted"));
    let (code, _) = rig
        .err(
            "opencode_continue_task",
            json!({ "task_id": allowed, "prompt": "x" }),
        )
        .await;
    assert_eq!(code, "conflict");
    let replied = rig
        .ok(
            "opencode_reply_permission",
            json!({ "task_id": allowed, "reply": "once" }),
        )
        .await;
    assert_eq!(replied["status"], "running");
    let r = rig.finish(&allowed).await;
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["text"], echo_reply(prompt));
    // Answering again is refused: the task waits on nothing.
    let (code, message) = rig
        .err(
            "opencode_reply_permission",
            json!({ "task_id": allowed, "reply": "once" }),
        )
        .await;
    assert_eq!(code, "conflict", "{message}");

    // Rejected: the agent stops; the task ends failed with a clear reason. This ask is pending
    // before the host waits (seen on OpenCode, not through the gateway): still news, so the wait
    // returns with it at once rather than at its timeout.
    let rejected = id(&rig.start_task("refused [[bash:echo nope]]").await);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while opencode.get_json("/permission").await.1 == json!([]) {
        assert!(std::time::Instant::now() < deadline, "no ask on OpenCode");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let w = rig.wait(&[&rejected], "all", 60_000).await;
    assert_eq!(w["asking"], json!([rejected]), "{w}");
    assert_eq!(w["tasks"][0]["status"], "waiting_permission", "{w}");
    rig.ok(
        "opencode_reply_permission",
        json!({ "task_id": rejected, "reply": "reject" }),
    )
    .await;
    let r = rig.finish(&rejected).await;
    assert_eq!(r["status"], "failed", "{r}");
    assert!(!r["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .is_empty());

    // Cancelled while asking: cancelled, and the ask is rejected (OpenCode's abort leaves it).
    let cancelled = id(&rig.start_task("abandoned [[bash:echo later]]").await);
    until_asked(&rig, &cancelled).await;
    let c = rig
        .ok("opencode_cancel_task", json!({ "task_id": cancelled }))
        .await;
    assert_eq!(c["status"], "cancelled");
    let (status, pending) = opencode.get_json("/permission").await;
    assert!(status.is_success());
    assert_eq!(pending, json!([]), "no ask left pending");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_task_is_reported_stalled_not_killed() {
    let rig = Rig::start(&[
        ("OPENCODE_MCP_TIMEOUTS__STALL", "1s"),
        ("OPENCODE_MCP_LIMITS__MAX_TASKS", "1"),
    ])
    .await;
    let task = id(&rig.start_task("quiet for a while [[delay:5000]]").await);
    // The cap on tracked tasks is a clear error, and costs the running task nothing.
    let (code, message) = rig
        .err(
            "opencode_start_task",
            json!({ "server_id": rig.server_id(), "prompt": "one too many" }),
        )
        .await;
    assert_eq!(code, "limit_exceeded", "{message}");
    assert!(message.contains("max_tasks"), "{message}");
    rig.fake.wait_for_requests(1, Duration::from_secs(30)).await;
    // The wait times out after 2.5 s with no event from the LLM-bound session in between.
    let w = rig
        .ok(
            "opencode_wait_for_task",
            json!({ "task_ids": [task], "timeout_ms": 2500, "include_progress": true }),
        )
        .await;
    let progress = &w["tasks"][0]["progress"];
    assert_eq!(progress["stalled"], true, "{w}");
    assert!(progress["last_event_ms_ago"].as_u64() >= Some(1000));
    let r = rig.finish(&task).await;
    assert_eq!(r["status"], "completed", "stalled is only reported: {r}");

    // The cap bounds live work, not history: with the finished task still answerable, rounds of
    // new tasks are accepted one after another (the cap once counted finished tasks for a day).
    for round in 0..3 {
        let next = id(&rig.start_task(&format!("round {round}")).await);
        let r = rig.finish(&next).await;
        assert_eq!(r["status"], "completed", "{r}");
    }
    let first = rig
        .ok(
            "opencode_get_task_result",
            json!({ "task_id": task , "detail": "full" }),
        )
        .await;
    assert_eq!(first["status"], "completed", "{first}");
}

//! Delegated tasks as native MCP tasks, and `subscriptions/listen`: protocol 2026-07-28 as
//! Claude Code 2.1.332 speaks it (`server/discover`, the client's name and capabilities in each
//! request's `_meta`), driven with rmcp's own client against the gateway binary and a real
//! OpenCode behind it.
//!
//! A `tools/call` that declares the tasks extension and starts work is answered with a task
//! handle whose id is the task (or fan-out group) id; `tasks/get` reads it to its end, with the
//! answer inline; `tasks/cancel` and `tasks/update` act on OpenCode. Without the extension the
//! same call returns its plain result. The interactive Claude Code test in `hosts.rs` checks the
//! same contract from the real host.

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolResponse, CancelTaskParams, CreateTaskResult, GetTaskParams, GetTaskResult,
    ServerNotification, SubscriptionFilter, TaskPayload, TaskStatus, UpdateTaskParams,
};
use serde_json::{json, Value};
use support::fake_llm::{echo_reply, FakeLlm, ERROR_400_MESSAGE};
use support::rig::{poll_for, Rig};
use support::tcp_proxy::TcpProxy;
use support::{OpenCodeEnv, OpenCodeServer};

/// A gateway with a server, spoken to in protocol 2026-07-28; `tasks`: every request declares
/// the tasks extension.
async fn modern_rig(env: OpenCodeEnv, tasks: bool, extra: &[(&str, &str)]) -> Rig {
    Rig::start_launched(FakeLlm::start(), env, extra, |launch| launch.modern(tasks)).await
}

/// Calls `tool` and returns the task handle it must answer with.
async fn handle(rig: &Rig, tool: &str, args: Value) -> CreateTaskResult {
    match rig.client.call_once(tool, args.clone()).await {
        Ok(CallToolResponse::Task(handle)) => handle,
        Ok(other) => panic!(
            "{tool}({args}) answered without a task handle: {other:?}\n{}",
            rig.client.stderr()
        ),
        Err(e) => panic!("{tool}({args}): {e}\n{}", rig.client.stderr()),
    }
}

/// Starts a task on the rig's server with `prompt`; returns its handle.
async fn start(rig: &Rig, prompt: &str) -> CreateTaskResult {
    handle(
        rig,
        "opencode_start_task",
        json!({"server_id": rig.server_id(), "prompt": prompt}),
    )
    .await
}

async fn get(rig: &Rig, id: &str) -> GetTaskResult {
    rig.client
        .peer()
        .get_task(GetTaskParams::new(id))
        .await
        .unwrap_or_else(|e| panic!("tasks/get {id}: {e}\n{}", rig.client.stderr()))
}

/// Polls `tasks/get` (as a host does, bounded) until `done` holds.
async fn poll(rig: &Rig, id: &str, done: impl Fn(&GetTaskResult) -> bool) -> GetTaskResult {
    let start = Instant::now();
    loop {
        let task = get(rig, id).await;
        if done(&task) {
            return task;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "task {id} stayed {:?}: {task:?}\n{}",
            task.task.status(),
            rig.client.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn poll_terminal(rig: &Rig, id: &str) -> GetTaskResult {
    poll(rig, id, |t| t.task.status().is_terminal()).await
}

/// Polls until the task asks for input, and returns what it asks.
async fn asked(rig: &Rig, id: &str) -> (GetTaskResult, rmcp::model::InputRequests) {
    let asking = poll(rig, id, |t| {
        t.task.status() == TaskStatus::InputRequired || t.task.status().is_terminal()
    })
    .await;
    let TaskPayload::InputRequired { input_requests } = &asking.task.payload else {
        panic!("no input asked for: {asking:?}");
    };
    let requests = input_requests.clone();
    (asking, requests)
}

/// Sends the user's answers with `tasks/update`.
async fn answer(rig: &Rig, id: &str, responses: BTreeMap<String, Value>) {
    rig.client
        .peer()
        .update_task(UpdateTaskParams::new(id, responses))
        .await
        .unwrap_or_else(|e| panic!("tasks/update: {e}\n{}", rig.client.stderr()));
}

/// Whether any request OpenCode sent its model holds `text` (a command's output).
fn model_saw(rig: &Rig, text: &str) -> bool {
    rig.fake.requests().iter().any(|r| {
        serde_json::to_string(&r.body)
            .unwrap_or_default()
            .contains(text)
    })
}

/// The tool result a completed task carries.
fn result_of(task: &GetTaskResult) -> &rmcp::model::JsonObject {
    match &task.task.payload {
        TaskPayload::Completed { result } => result,
        other => panic!("not completed: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_is_a_task_the_host_polls_to_its_answer_and_a_continue_is_a_task_of_its_own() {
    let rig = modern_rig(OpenCodeEnv::new(), true, &[]).await;
    let prompt = "native task [[delay:1500]]";
    let started = start(&rig, prompt).await;
    let id = started.task.task_id.clone();
    assert!(
        id.starts_with("tsk_"),
        "the task id is the handle: {started:?}"
    );
    assert_eq!(started.task.status, TaskStatus::Working);
    assert_eq!(started.task.poll_interval_ms, Some(1000));
    assert_eq!(
        started.task.ttl_ms,
        Some(24 * 3600 * 1000),
        "records stay answerable for limits.finished_task_ttl"
    );

    // Working, and saying what it does, while the model holds its answer back.
    let working = get(&rig, &id).await;
    assert_eq!(working.task.status(), TaskStatus::Working, "{working:?}");
    let message = working.task.task.status_message.clone().unwrap_or_default();
    assert!(message.contains("native task"), "{message}");

    let done = poll_terminal(&rig, &id).await;
    assert_eq!(done.task.status(), TaskStatus::Completed, "{done:?}");
    let result = result_of(&done);
    assert_eq!(result.get("isError"), Some(&json!(false)), "{result:?}");
    let waited = &result["structuredContent"];
    assert_eq!(waited["done"], true, "{waited}");
    assert_eq!(waited["tasks"][0]["task_id"], id.as_str(), "{waited}");
    assert_eq!(waited["tasks"][0]["text"], echo_reply(prompt), "{waited}");
    assert!(
        waited["tasks"][0].get("progress").is_none(),
        "the final result is the wait's own, without progress: {waited}"
    );
    let text = result["content"][0]["text"].as_str().unwrap_or_default();
    assert!(text.contains(&echo_reply(prompt)), "{text}");

    // Every other tool works on the same id.
    let plain = rig
        .ok("opencode_get_task_result", json!({"task_id": id}))
        .await;
    assert_eq!(plain["text"], echo_reply(prompt), "{plain}");

    // A follow-up is a task of its own (the turn it opened), and reads its own turn; the
    // first handle, reported completed, stays completed with its own answer (a terminal state
    // is final: it used to go back to `working`).
    let first_done = done.clone();
    let next = handle(
        &rig,
        "opencode_continue_task",
        json!({"task_id": id, "prompt": "second turn [[delay:1500]]"}),
    )
    .await;
    let next_id = next.task.task_id.clone();
    assert_eq!(next_id, format!("{id}.2"), "{next:?}");
    let first_again = get(&rig, &id).await;
    assert_eq!(
        first_again.task.status(),
        TaskStatus::Completed,
        "{first_again:?}"
    );
    assert_eq!(first_again.task.payload, first_done.task.payload);
    assert_eq!(
        first_again.task.task.created_at,
        first_done.task.task.created_at
    );
    let working = get(&rig, &next_id).await;
    assert_eq!(working.task.status(), TaskStatus::Working, "{working:?}");
    // Its times are the turn's, not the poll's.
    let again = get(&rig, &next_id).await;
    assert_eq!(working.task.task.created_at, again.task.task.created_at);
    let done = poll_terminal(&rig, &next_id).await;
    assert_eq!(
        result_of(&done)["structuredContent"]["tasks"][0]["text"],
        echo_reply("second turn [[delay:1500]]"),
        "{done:?}"
    );

    // A restarted gateway still answers for the task from its records.
    let mut rig = rig;
    rig.kill_gateway().await;
    rig.relaunch().await;
    let after = get(&rig, &next_id).await;
    assert_eq!(after.task.status(), TaskStatus::Completed, "{after:?}");
    assert_eq!(
        result_of(&after)["structuredContent"]["tasks"][0]["text"],
        echo_reply("second turn [[delay:1500]]"),
        "{after:?}"
    );

    // An id the gateway never gave is an error that names it, not a silent state.
    let unknown = rig
        .client
        .peer()
        .get_task(GetTaskParams::new("tsk_nope"))
        .await
        .expect_err("an unknown task id is an error");
    assert!(unknown.to_string().contains("tsk_nope"), "{unknown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_task_fails_with_its_error_and_a_cancelled_one_is_cancelled_at_once() {
    let rig = modern_rig(OpenCodeEnv::new(), true, &[]).await;

    let failing = start(&rig, "refused [[error400]]").await;
    let failed = poll_terminal(&rig, &failing.task.task_id).await;
    let TaskPayload::Failed { error } = &failed.task.payload else {
        panic!("not failed: {failed:?}");
    };
    let message = error["message"].as_str().unwrap_or_default();
    assert!(message.contains(ERROR_400_MESSAGE), "{message}");
    assert!(message.contains("opencode_continue_task"), "{message}");
    assert_eq!(error["data"]["code"], "failed", "{error:?}");
    assert!(error["code"].is_i64(), "a JSON-RPC error object: {error:?}");

    // The host's TaskStop sends tasks/cancel twice at the same instant: both are acknowledged,
    // and the OpenCode turn is aborted (its model stream is cut off).
    let slow = start(&rig, "long work [[slow:30000]]").await;
    let id = slow.task.task_id.clone();
    rig.fake
        .wait_for_request(Duration::from_secs(30), |r| {
            r.last_user_text.contains("long work")
        })
        .await;
    let peer = rig.client.peer();
    let (a, b) = tokio::join!(
        peer.cancel_task(CancelTaskParams::new(&id)),
        peer.cancel_task(CancelTaskParams::new(&id)),
    );
    a.expect("the first cancel is acknowledged");
    b.expect("the second cancel is acknowledged too");
    let cancelled = get(&rig, &id).await;
    assert_eq!(
        cancelled.task.status(),
        TaskStatus::Cancelled,
        "{cancelled:?}"
    );
    let status = rig
        .ok("opencode_get_task_status", json!({"task_id": id}))
        .await;
    assert_eq!(status["status"], "cancelled", "{status}");
    peer.cancel_task(CancelTaskParams::new(&id))
        .await
        .expect("cancelling a cancelled task is acknowledged");
}

/// A worktree start answers at once, its task a handle at once too; a start that then fails
/// in the background (here its worktree cannot be made: the state directory's `worktrees` is a
/// file) fails its task with `StartFailed`, naming the step, and its prompt reaches no model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_that_fails_in_the_background_fails_its_task() {
    let env = OpenCodeEnv::new();
    support::git::init_repo(&env.work_dir(), &[("app.txt", "one\n")]);
    let worktrees = env.root().join("state/opencode-mcp/worktrees");
    let rig = modern_rig(env, true, &[]).await;
    if worktrees.is_dir() {
        std::fs::remove_dir_all(&worktrees).expect("remove the worktrees directory");
    }
    if let Some(parent) = worktrees.parent() {
        std::fs::create_dir_all(parent).expect("the state directory");
    }
    std::fs::write(&worktrees, "a file where the worktrees go\n").expect("a file");

    let failing = handle(
        &rig,
        "opencode_start_task",
        json!({"server_id": rig.server_id(), "prompt": "never runs", "isolation": "worktree"}),
    )
    .await;
    let failed = poll_terminal(&rig, &failing.task.task_id).await;
    let TaskPayload::Failed { error } = &failed.task.payload else {
        panic!("not failed: {failed:?}\n{}", rig.client.stderr());
    };
    let message = error["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("could not start") && message.contains("making its worktree"),
        "{error:?}"
    );
    assert_eq!(error["data"]["code"], "failed", "{error:?}");
    let status = rig
        .ok(
            "opencode_get_task_status",
            json!({"task_id": failing.task.task_id}),
        )
        .await;
    assert_eq!(status["error"]["name"], "StartFailed", "{status}");
    assert!(!model_saw(&rig, "never runs"));
}

/// A task that fails after it began its answer hands that partial answer back with its error
/// (SEP-2663: a failed task's result is its error; what the turn wrote is part of it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_tasks_partial_answer_is_in_its_error() {
    let rig = modern_rig(
        OpenCodeEnv::new(),
        true,
        &[("OPENCODE_MCP_TIMEOUTS__TASK", "8s")],
    )
    .await;
    // Ten chunks over 16 s: the 8 s deadline cuts the answer about halfway.
    let prompt = "cut short [[slow:16000]]";
    let task = start(&rig, prompt).await;
    let ended = poll_terminal(&rig, &task.task.task_id).await;
    let TaskPayload::Failed { error } = &ended.task.payload else {
        panic!("not failed: {ended:?}");
    };
    assert_eq!(error["data"]["code"], "timed_out", "{error:?}");
    let partial = error["data"]["partial_text"].as_str().unwrap_or_default();
    let whole = format!("ECHO: {prompt}");
    assert!(
        !partial.is_empty() && whole.starts_with(partial) && partial != whole,
        "a beginning of {whole:?}: {error:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fan_out_is_one_task_for_the_group() {
    let env = OpenCodeEnv::new();
    let repo = "tiers:\n  - name: fast\n    handles: small things\n    models: [fake/fake-model]\n  - name: strong\n    handles: hard things\n    models: [fake/fake-strong]\n";
    std::fs::write(env.work_dir().join("delegation.yaml"), repo).expect("write delegation.yaml");
    let rig = modern_rig(env, true, &[]).await;
    let group = handle(
        &rig,
        "opencode_fan_out",
        json!({"server_id": rig.server_id(), "prompt": "Is this sound?", "tiers": ["fast", "strong"]}),
    )
    .await;
    let id = group.task.task_id.clone();
    assert!(id.starts_with("grp_"), "{group:?}");
    let done = poll_terminal(&rig, &id).await;
    let waited = &result_of(&done)["structuredContent"];
    let tasks = waited["tasks"].as_array().cloned().unwrap_or_default();
    assert_eq!(tasks.len(), 2, "{waited}");
    for task in &tasks {
        assert_eq!(task["group_id"], id.as_str(), "{waited}");
        assert_eq!(task["text"], echo_reply("Is this sound?"), "{waited}");
    }

    // A follow-up of one member is that member's task, not the group's: cancelling it leaves
    // the other member alone. (The group id used to win, and the cancel stopped every member.)
    let member = tasks[0]["task_id"].as_str().expect("task_id").to_string();
    let other = tasks[1]["task_id"].as_str().expect("task_id").to_string();
    let follow_up = handle(
        &rig,
        "opencode_continue_task",
        json!({"task_id": member, "prompt": "And now? [[delay:30000]]"}),
    )
    .await;
    let follow_up = follow_up.task.task_id;
    assert_eq!(follow_up, format!("{member}.2"));
    rig.client
        .peer()
        .cancel_task(CancelTaskParams::new(&follow_up))
        .await
        .expect("tasks/cancel");
    let cancelled = poll_terminal(&rig, &follow_up).await;
    assert_eq!(
        cancelled.task.status(),
        TaskStatus::Cancelled,
        "{cancelled:?}"
    );
    let status = rig
        .ok("opencode_get_task_status", json!({"task_id": other}))
        .await;
    assert_eq!(
        status["status"], "completed",
        "the other member is untouched: {status}"
    );
}

/// `tasks/cancel` on a group tries every member, at once, and names each one it could not
/// cancel (it used to stop at the first failure, leaving the rest running unnamed).
///
/// A fan-out of two slow members on an attached OpenCode behind a proxy; the proxy refuses
/// connections, so neither abort can reach OpenCode; then it listens again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_cancel_tries_every_member_and_names_each_it_could_not_cancel() {
    let fake = FakeLlm::start();
    let env = OpenCodeEnv::new();
    let server = OpenCodeServer::start(&env, &fake.url()).await;
    let mut proxy = TcpProxy::start(server.addr()).await;
    let url = proxy.url();
    let vars = [
        ("OPENCODE_MCP_OPENCODE__URL", url.as_str()),
        ("OPENCODE_SERVER_PASSWORD", server.password()),
    ];
    let rig = Rig::start_launched(fake, env, &vars, |launch| launch.modern(true)).await;
    let group = handle(
        &rig,
        "opencode_fan_out",
        json!({"server_id": rig.server_id(), "prompt": "long work [[slow:60000]]",
               "models": ["fake/fake-model", "fake/fake-strong"]}),
    )
    .await;
    let id = group.task.task_id.clone();
    let asked = poll_for(Duration::from_secs(30), || {
        let n = rig
            .fake
            .chat_requests()
            .into_iter()
            .filter(|r| !r.is_title_request() && r.last_user_text.contains("long work"))
            .count();
        (n >= 2).then_some(())
    })
    .await;
    assert!(asked.is_some(), "both members are streaming");
    let w = rig
        .ok(
            "opencode_wait_for_task",
            json!({"task_ids": [id], "timeout_ms": 0}),
        )
        .await;
    let members: Vec<String> = w["tasks"]
        .as_array()
        .map(|t| {
            t.iter()
                .filter_map(|t| t["task_id"].as_str())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(members.len(), 2, "{w}");

    proxy.refuse().await;
    proxy.cut().await;
    let refused = rig
        .client
        .peer()
        .cancel_task(CancelTaskParams::new(&id))
        .await
        .expect_err("no member could be cancelled");
    let message = refused.to_string();
    assert!(message.contains("cancelled 0 of 2"), "{message}");
    for member in &members {
        assert!(
            message.contains(member.as_str()),
            "{member} is named: {message}"
        );
    }

    proxy.resume();
    rig.client
        .peer()
        .cancel_task(CancelTaskParams::new(&id))
        .await
        .expect("with OpenCode back, the group is cancelled");
    for member in &members {
        let status = rig
            .ok("opencode_get_task_status", json!({"task_id": member}))
            .await;
        assert_eq!(status["status"], "cancelled", "{status}");
    }
}

/// A permission ask is `input_required` with a form; the user's choice, sent back with
/// `tasks/update`, reaches OpenCode and the task goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permission_ask_is_input_the_host_asks_its_user_for() {
    let env = OpenCodeEnv::new().with_config(json!({ "permission": "ask" }));
    let rig = modern_rig(env, true, &[("OPENCODE_MCP_OPENCODE__PERMISSION", "ask")]).await;
    let prompt = "needs a shell [[bash:echo permitted-$((6*7))]]";
    let started = start(&rig, prompt).await;
    let id = started.task.task_id.clone();
    let (asking, input_requests) = asked(&rig, &id).await;
    // It stays so until someone answers: the host polls again while its user decides.
    let again = get(&rig, &id).await;
    assert_eq!(again.task.payload, asking.task.payload, "{again:?}");
    assert_eq!(input_requests.len(), 1, "{input_requests:?}");
    let (key, request) = input_requests.iter().next().expect("one request");
    let wire = serde_json::to_value(request).expect("serializes");
    assert_eq!(wire["method"], "elicitation/create", "{wire}");
    let message = wire["params"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("bash"),
        "the form says what is asked: {message}"
    );
    assert!(message.contains("permitted-"), "and for what: {message}");
    let choices = &wire["params"]["requestedSchema"]["properties"]["decision"]["oneOf"];
    assert_eq!(
        choices
            .as_array()
            .map(|c| c.iter().map(|c| c["const"].clone()).collect::<Vec<_>>()),
        Some(vec![json!("once"), json!("always"), json!("reject")]),
        "{wire}"
    );

    let once = json!({"action": "accept", "content": {"decision": "once"}});
    answer(&rig, &id, BTreeMap::from([(key.clone(), once)])).await;
    let done = poll_terminal(&rig, &id).await;
    assert_eq!(done.task.status(), TaskStatus::Completed, "{done:?}");
    assert!(
        model_saw(&rig, "permitted-42"),
        "the allowed command's output never reached the model"
    );

    // A declined (or dismissed) dialog refuses: the command never runs.
    let refused = start(&rig, "again [[bash:echo refused-$((6*7))]]").await;
    let id = refused.task.task_id.clone();
    let (_, input_requests) = asked(&rig, &id).await;
    let declined = input_requests
        .keys()
        .map(|key| (key.clone(), json!({"action": "decline"})))
        .collect();
    answer(&rig, &id, declined).await;
    let ended = poll_terminal(&rig, &id).await;
    assert_ne!(ended.task.status(), TaskStatus::Completed, "{ended:?}");
    assert!(!model_saw(&rig, "refused-42"), "a declined command ran");
}

/// Two subagents asking at once are two forms, each keyed by its ask's id; the answer to one
/// goes to that ask only: the other stays asked, with its own form, until it is answered too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_asks_at_once_are_two_forms_each_answered_on_its_own() {
    let env = OpenCodeEnv::new().with_config(json!({ "permission": { "bash": "ask" } }));
    let rig = modern_rig(env, true, &[("OPENCODE_MCP_OPENCODE__PERMISSION", "ask")]).await;
    let dir = rig.env.work_dir();
    let prompt = "two helpers [[parallel]] \
         [[task:general:{{bash:touch from-first.txt}} first child]] \
         [[task:general:{{bash:touch from-second.txt}} second child]]";
    let id = start(&rig, prompt).await.task.task_id.clone();
    let both = poll(&rig, &id, |t| match &t.task.payload {
        TaskPayload::InputRequired { input_requests } => input_requests.len() == 2,
        _ => t.task.status().is_terminal(),
    })
    .await;
    let TaskPayload::InputRequired { input_requests } = &both.task.payload else {
        panic!("two asks were expected: {both:?}");
    };
    let key_for = |file: &str| -> String {
        input_requests
            .iter()
            .find(|(_, r)| serde_json::to_string(r).unwrap_or_default().contains(file))
            .map(|(k, _)| k.clone())
            .unwrap_or_else(|| panic!("no form for {file}: {input_requests:?}"))
    };
    let (first, second) = (key_for("from-first.txt"), key_for("from-second.txt"));
    assert_ne!(first, second);

    let once = json!({"action": "accept", "content": {"decision": "once"}});
    answer(&rig, &id, BTreeMap::from([(second.clone(), once.clone())])).await;
    let one_left = poll(&rig, &id, |t| match &t.task.payload {
        TaskPayload::InputRequired { input_requests } => input_requests.len() == 1,
        _ => true,
    })
    .await;
    let TaskPayload::InputRequired { input_requests } = &one_left.task.payload else {
        panic!("the first ask is unanswered, yet: {one_left:?}");
    };
    assert_eq!(
        input_requests.keys().collect::<Vec<_>>(),
        [&first],
        "the answer went to the second ask only"
    );
    assert!(
        !dir.join("from-first.txt").exists(),
        "the first is unanswered"
    );

    answer(&rig, &id, BTreeMap::from([(first, once)])).await;
    let done = poll_terminal(&rig, &id).await;
    assert_eq!(done.task.status(), TaskStatus::Completed, "{done:?}");
    assert!(dir.join("from-first.txt").exists() && dir.join("from-second.txt").exists());
}

/// Hosts that do not declare the extension get exactly what they got before: a plain result
/// on protocol 2026-07-28, and over `initialize` not even the extension in the capabilities.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_extension_a_start_returns_its_plain_result() {
    let rig = modern_rig(OpenCodeEnv::new(), false, &[]).await;
    let reply = rig
        .client
        .call_once(
            "opencode_start_task",
            json!({"server_id": rig.server_id(), "prompt": "plain"}),
        )
        .await
        .expect("a result");
    let CallToolResponse::Complete(result) = reply else {
        panic!("a task handle for a host that did not ask: {reply:?}");
    };
    let started = result.structured_content.unwrap_or_default();
    assert!(started["task_id"].is_string(), "{started}");
    assert_eq!(started["status"], "pending", "{started}");

    let legacy = Rig::start(&[]).await;
    let info = legacy.client.server_info().expect("initialize result");
    let capabilities = serde_json::to_value(&info.capabilities).expect("serializes");
    assert!(
        capabilities.get("extensions").is_none(),
        "an initialize host is not told of the tasks extension: {capabilities}"
    );
}

/// A task method acts only as an enabled tool would: with `cancel_task` and `reply_permission`
/// disabled in the configuration, `tasks/cancel` and `tasks/update` are refused, naming the
/// action, and the task runs on. (They used to act regardless.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_methods_do_not_act_for_a_disabled_tool() {
    let rig = modern_rig(
        OpenCodeEnv::new(),
        true,
        &[
            ("OPENCODE_MCP_TOOLS__OPENCODE_CANCEL_TASK__ENABLED", "false"),
            (
                "OPENCODE_MCP_TOOLS__OPENCODE_REPLY_PERMISSION__ENABLED",
                "false",
            ),
        ],
    )
    .await;
    let id = start(&rig, "runs on [[delay:1500]]").await.task.task_id;
    let refused = rig
        .client
        .peer()
        .cancel_task(CancelTaskParams::new(&id))
        .await
        .expect_err("tasks/cancel is refused");
    assert!(refused.to_string().contains("cancel_task"), "{refused}");
    let refused = rig
        .client
        .peer()
        .update_task(UpdateTaskParams::new(&id, BTreeMap::new()))
        .await
        .expect_err("tasks/update is refused");
    assert!(
        refused.to_string().contains("reply_permission"),
        "{refused}"
    );
    let done = poll_terminal(&rig, &id).await;
    assert_eq!(done.task.status(), TaskStatus::Completed, "{done:?}");
}

/// `subscriptions/listen`: acknowledged at once, held open, and a reload's `list_changed`
/// arrives on it, stamped with the stream's id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_reaches_a_listen_stream() {
    let rig = modern_rig(OpenCodeEnv::new(), true, &[]).await;
    let mut filter = SubscriptionFilter::new();
    filter.tools_list_changed = Some(true);
    filter.prompts_list_changed = Some(true);
    let mut stream =
        tokio::time::timeout(Duration::from_secs(10), rig.client.peer().listen(filter))
            .await
            .expect("acknowledged without a stall")
            .unwrap_or_else(|e| panic!("subscriptions/listen: {e}\n{}", rig.client.stderr()));
    assert_eq!(stream.acknowledged().tools_list_changed, Some(true));
    assert_eq!(stream.acknowledged().prompts_list_changed, Some(true));

    // The user's own file: the layer hot reload applies (the repository's applies at start).
    let user_dir = rig.env.root().join("config/opencode-mcp");
    std::fs::create_dir_all(&user_dir).expect("the user's config directory");
    std::fs::write(
        user_dir.join("delegation.yaml"),
        "tools:\n  tasks_now:\n    action: list_tasks\n    description: The stored tasks.\n",
    )
    .expect("write delegation.yaml");
    let changed = tokio::time::timeout(Duration::from_secs(30), stream.next())
        .await
        .expect("a notification within 30 s")
        .expect("the stream is open")
        .expect("a notification");
    assert!(
        matches!(changed, ServerNotification::ToolListChangedNotification(_)),
        "{changed:?}"
    );
    let tools = rig.client.list_tools().await.expect("tools/list");
    assert!(tools.iter().any(|t| t.name == "tasks_now"), "{tools:?}");

    // A method the gateway does not serve gets the protocol's answer, and no warning.
    let unserved = rig
        .client
        .peer()
        .list_resources(None)
        .await
        .expect_err("resources are not served");
    assert!(
        unserved.to_string().contains("-32601") || unserved.to_string().contains("not found"),
        "{unserved}"
    );
    let log = rig.client.stderr();
    assert!(!log.contains("WARN"), "{log}");
}

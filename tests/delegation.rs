//! Delegation end to end: the gateway binary over MCP stdio, a real `opencode serve` (the pinned
//! release) that the gateway starts itself, and the scripted fake LLM on 127.0.0.1. Each test
//! drives the nine tools as a host would and checks what the host sees.
//!
//! Each test owns one rig (one gateway, one OpenCode); scenarios that can share a server share a
//! test, which keeps the suite to a handful of OpenCode start-ups.

mod support;

use std::time::Duration;

use futures::future::join_all;
use serde_json::{json, Value};
use support::fake_llm::{echo_reply, ERROR_400_MESSAGE};
use support::rig::{alive, wait_gone, Rig, TASK_TIMEOUT_MS};

fn id(v: &Value) -> String {
    v["task_id"].as_str().expect("task_id").to_string()
}

fn status(v: &Value) -> &str {
    v["status"].as_str().unwrap_or("<none>")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_tasks_each_complete_with_their_own_reply() {
    let rig = Rig::start(&[]).await;
    // The fake answers only after 1.5 s, so a start that waited for the work would see it done.
    let prompts: Vec<String> = (0..5)
        .map(|i| format!("parallel task {i} [[delay:1500]]"))
        .collect();
    let starts = join_all(prompts.iter().map(|p| rig.start_task(p))).await;
    for s in &starts {
        assert!(
            matches!(status(s), "pending" | "running"),
            "start_task returns before the work is done: {s}"
        );
        assert_eq!(s["turn"], 1);
    }
    let ids: Vec<String> = starts.iter().map(id).collect();
    let id_refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let w = rig.wait(&id_refs, "all", TASK_TIMEOUT_MS).await;
    assert_eq!(w["done"], true, "{w}");
    assert_eq!(w["timed_out"], false);
    assert_eq!(w["unfinished"], json!([]));
    for (task_id, prompt) in ids.iter().zip(&prompts) {
        let r = rig
            .ok(
                "opencode_get_task_result",
                json!({ "task_id": task_id , "detail": "full" }),
            )
            .await;
        assert_eq!(r["status"], "completed", "{r}");
        assert_eq!(
            r["text"],
            echo_reply(prompt),
            "each task gets its own reply"
        );
        assert_eq!(r["truncated"], false);
        assert_eq!(r["model"], "fake/fake-model");
        assert_eq!(r["finish"], "stop");
        assert!(r["tokens"]["input"].as_u64() > Some(0), "{r}");
        assert!(r["error"].is_null());
    }
    // Five sessions, one LLM call each.
    let sessions: std::collections::BTreeSet<String> = rig
        .fake
        .chat_requests()
        .iter()
        .filter_map(|r| r.session_id().map(String::from))
        .collect();
    assert_eq!(sessions.len(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bash_tool_runs_and_its_output_goes_back_to_the_model() {
    let rig = Rig::start(&[]).await;
    let start = rig
        .start_task("list it [[bash:echo tool-output-$((40+2))]]")
        .await;
    let r = rig.finish(&id(&start)).await;
    assert_eq!(r["status"], "completed", "{r}");
    let tools = r["tools"].as_array().expect("tools");
    assert!(
        tools
            .iter()
            .any(|t| t["tool"] == "bash" && t["status"] == "completed"),
        "{r}"
    );
    let session = start["session_id"].as_str().expect("session_id");
    let requests = rig.requests_for(session);
    assert_eq!(requests.len(), 2, "the tool call, then the answer");
    assert!(
        requests[1]
            .tool_results()
            .iter()
            .any(|out| out.contains("tool-output-42")),
        "the shell ran and its output reached the model: {:?}",
        requests[1].tool_results()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continue_reports_the_new_turn_never_the_previous_one() {
    let rig = Rig::start(&[]).await;
    let start = rig.start_task("first turn").await;
    let task = id(&start);
    let first = rig.finish(&task).await;
    assert_eq!(first["text"], echo_reply("first turn"));

    let second_prompt = "second turn [[delay:5000]]";
    let cont = rig
        .ok(
            "opencode_continue_task",
            json!({ "task_id": task, "prompt": second_prompt, "detail": "full" }),
        )
        .await;
    assert_eq!(cont["turn"], 2);
    assert!(matches!(status(&cont), "pending" | "running"), "{cont}");
    // Right after the continue, nothing may report the finished first turn.
    let st = rig.status(&task).await;
    assert!(matches!(status(&st), "pending" | "running"), "{st}");
    let early = rig
        .ok(
            "opencode_get_task_result",
            json!({ "task_id": task , "detail": "full" }),
        )
        .await;
    assert_ne!(early["status"], "completed", "{early}");
    assert_ne!(early["text"], first["text"], "{early}");

    // A follow-up while the turn runs is refused, not queued.
    let (code, message) = rig
        .err(
            "opencode_continue_task",
            json!({ "task_id": task, "prompt": "third", "detail": "full" }),
        )
        .await;
    assert_eq!(code, "conflict", "{message}");

    let second = rig.finish(&task).await;
    assert_eq!(second["status"], "completed");
    assert_eq!(second["turn"], 2);
    assert_eq!(second["text"], echo_reply(second_prompt));

    // The model saw the whole conversation on the second call.
    let session = start["session_id"].as_str().expect("session_id");
    let requests = rig.requests_for(session);
    let last = requests.last().expect("requests");
    let roles: Vec<&str> = last
        .roles()
        .into_iter()
        .filter(|r| *r != "system")
        .collect();
    assert_eq!(
        roles,
        vec!["user", "assistant", "user"],
        "{}",
        last.summary()
    );
    assert!(serde_json::to_string(&last.messages)
        .unwrap_or_default()
        .contains("first turn"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_aborts_a_slow_stream() {
    let rig = Rig::start(&[]).await;
    let start = rig.start_task("slow one [[slow:30000]]").await;
    let task = id(&start);
    let first = rig.fake.wait_for_requests(1, Duration::from_secs(30)).await;
    let request_index = first[0].index;
    let cancelled = rig
        .ok("opencode_cancel_task", json!({ "task_id": task }))
        .await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    let end = rig
        .fake
        .wait_for_stream_end(request_index, Duration::from_secs(5))
        .await;
    assert!(end.client_closed, "OpenCode hung up the LLM stream");
    // It stays cancelled (the abort's own error events do not turn it into `failed`).
    let w = rig.wait(&[&task], "all", 1000).await;
    assert_eq!(w["tasks"][0]["status"], "cancelled", "{w}");
    // Cancelling again is a no-op that reports the same state.
    let again = rig
        .ok("opencode_cancel_task", json!({ "task_id": task }))
        .await;
    assert_eq!(again["status"], "cancelled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_errors_fail_and_the_deadline_times_out() {
    let rig = Rig::start(&[
        ("OPENCODE_MCP_TIMEOUTS__TASK", "6s"),
        ("OPENCODE_MCP_TIMEOUTS__STALL", "5s"),
    ])
    .await;
    // OpenCode's first turn loads its plugins, which can take seconds on a loaded machine: run
    // one ordinary task first so the deadline below measures only the provider's behaviour.
    let warm = rig.start_task("warm up").await;
    rig.finish(&id(&warm)).await;

    // A 400 is not retried: failed, with the provider's message.
    let bad = rig.start_task("bad request [[error400]]").await;
    let r = rig.finish(&id(&bad)).await;
    assert_eq!(r["status"], "failed", "{r}");
    let message = r["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(ERROR_400_MESSAGE), "{r}");
    assert!(r["error"]["name"].as_str().is_some_and(|n| !n.is_empty()));

    // 500s with a 2 s retry-after: OpenCode's five retries would take 10 s or more, so the 6 s
    // task deadline ends it first.
    let flaky = rig.start_task("flaky provider [[error500:2000]]").await;
    let task = id(&flaky);
    let w = rig.wait(&[&task], "all", TASK_TIMEOUT_MS).await;
    assert_eq!(w["tasks"][0]["status"], "timed_out", "{w}");
    assert!(w["tasks"][0]["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .contains("timeouts.task"));
    let session = flaky["session_id"].as_str().expect("session_id");
    let at_abort = rig.requests_for(session).len();
    assert!(at_abort >= 1, "the provider was tried");
    // Watch for longer than two retry intervals: OpenCode must send nothing more.
    tokio::time::sleep(Duration::from_millis(4500)).await;
    assert_eq!(
        rig.requests_for(session).len(),
        at_abort,
        "no LLM request after the abort"
    );
    let st = rig.status(&task).await;
    assert_eq!(st["status"], "timed_out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_any_timeouts_progress_and_host_cancellation() {
    let rig = Rig::start(&[("OPENCODE_MCP_TIMEOUTS__PROGRESS_INTERVAL", "200ms")]).await;
    let fast = id(&rig.start_task("fast one").await);
    let slow = id(&rig.start_task("slow one [[slow:8000]]").await);

    // `any` returns on the first finish.
    let w = rig
        .wait(&[&slow, &fast, &fast], "any", TASK_TIMEOUT_MS)
        .await;
    assert_eq!(w["done"], true, "{w}");
    assert_eq!(w["finished"], json!([fast]), "{w}");
    assert_eq!(w["unfinished"], json!([slow]));
    assert_eq!(
        w["tasks"].as_array().map(Vec::len),
        Some(2),
        "duplicate ids collapse"
    );

    // A short wait times out with a snapshot, not an error.
    let w = rig.wait(&[&slow], "all", 300).await;
    assert_eq!(w["done"], false);
    assert_eq!(w["timed_out"], true);
    assert!(matches!(
        w["tasks"][0]["status"].as_str(),
        Some("pending" | "running")
    ));

    // Progress notifications arrive during a wait that carries a progress token.
    let handle = rig
        .client
        .start_call(
            "opencode_wait_for_task",
            json!({ "task_ids": [fast, slow], "timeout_ms": 1200, "include_progress": true }),
        )
        .await
        .expect("send wait");
    let token = handle.progress_token.clone();
    let reply = rig
        .client
        .await_call("opencode_wait_for_task", handle, Duration::from_secs(30))
        .await
        .expect("wait returns");
    assert_eq!(reply.structured["timed_out"], true);
    assert!(reply.structured["tasks"][1]["progress"].is_object());
    // The client handles each notification in a task of its own: give the last ones a moment
    // to be recorded (bounded) before counting.
    let mut progress = rig.client.progress_for(&token);
    for _ in 0..50 {
        if progress.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        progress = rig.client.progress_for(&token);
    }
    assert!(
        progress.len() >= 2,
        "progress every 200 ms over 1.2 s, got {progress:?}"
    );
    // The client handles each notification on its own task, so they may arrive out of order:
    // in the order of their values, those sent strictly increase, and the last is the latest.
    progress.sort_by(|a, b| a.progress.total_cmp(&b.progress));
    assert!(progress.windows(2).all(|p| p[1].progress > p[0].progress));
    // One of two tasks finished reads as about half, however much of the wait has passed (the
    // elapsed share of the timeout once pushed it to ~90 %), and the message says how long.
    let last = progress.last().expect("a notification");
    assert_eq!(last.total, Some(2.0), "{last:?}");
    assert!(
        last.progress >= 1.0 && last.progress / 2.0 < 0.55,
        "{progress:?}"
    );
    assert!(
        last.message
            .as_deref()
            .is_some_and(|m| m.starts_with("1/2 finished after")),
        "{last:?}"
    );
    // ...and what the unfinished task is doing, in words, under its title.
    let slow_title = reply.structured["tasks"][1]["title"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let message = last.message.as_deref().unwrap_or_default();
    assert!(
        message.contains(&format!("\"{slow_title}\" (")),
        "{message} names {slow_title}"
    );
    assert!(
        ["starting", "thinking", "writing \"", "running"]
            .iter()
            .any(|doing| message.contains(&format!("): {doing}"))),
        "{message}"
    );

    // The host cancelling a wait ends the wait only.
    let handle = rig
        .client
        .start_call(
            "opencode_wait_for_task",
            json!({ "task_ids": [slow], "timeout_ms": 30000 }),
        )
        .await
        .expect("send wait");
    handle
        .cancel(Some("host gave up".into()))
        .await
        .expect("cancel the wait");
    let st = rig.status(&slow).await;
    assert!(
        matches!(status(&st), "pending" | "running"),
        "the task goes on: {st}"
    );
    let done = rig.finish(&slow).await;
    assert_eq!(done["status"], "completed", "{done}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_clear_errors() {
    let rig = Rig::start(&[]).await;
    let known = id(&rig.start_task("known task").await);
    let server_id = rig.server_id();

    for tool in [
        "opencode_get_task_status",
        "opencode_get_task_result",
        "opencode_cancel_task",
    ] {
        let (code, message) = rig.err(tool, json!({ "task_id": "tsk_nope" })).await;
        assert_eq!(code, "not_found", "{tool}: {message}");
        assert!(message.contains("tsk_nope"), "{tool}: {message}");
    }
    let (code, message) = rig
        .err(
            "opencode_continue_task",
            json!({ "task_id": "tsk_nope", "prompt": "x" }),
        )
        .await;
    assert_eq!(code, "not_found", "{message}");
    let (code, message) = rig
        .err(
            "opencode_wait_for_task",
            json!({ "task_ids": [known, "tsk_gone1", "tsk_gone2"] }),
        )
        .await;
    assert_eq!(code, "not_found");
    assert!(message.contains("tsk_gone1") && message.contains("tsk_gone2"));
    assert!(!message.contains(&known), "only the unknown ids: {message}");

    let start = |args: Value| {
        let mut args = args;
        args["server_id"] = json!(server_id);
        args
    };
    let cases = [
        (start(json!({ "prompt": "   " })), "prompt"),
        (
            start(json!({ "prompt": "x", "agent": "no-such-agent" })),
            "build",
        ),
        (
            start(json!({ "prompt": "x", "model": "fake/no-such-model" })),
            "fake/fake-model",
        ),
        (start(json!({ "prompt": "x", "model": "nomodel" })), "model"),
        (
            start(json!({ "prompt": "x", "tier": "no-such-tier" })),
            "fast",
        ),
        (
            start(json!({ "prompt": "x", "directory": "relative/dir" })),
            "directory",
        ),
    ];
    for (args, mentions) in cases {
        let (code, message) = rig.err("opencode_start_task", args.clone()).await;
        assert_eq!(code, "invalid_argument", "{args}: {message}");
        assert!(message.contains(mentions), "{args}: {message}");
    }
    let (code, message) = rig
        .err(
            "opencode_start_task",
            json!({ "server_id": "srv_nope", "prompt": "x" }),
        )
        .await;
    assert_eq!(code, "not_found", "{message}");
    for timeout in [json!(-1), json!(1_000_000_000u64), json!("soon")] {
        let (code, message) = rig
            .err(
                "opencode_wait_for_task",
                json!({ "task_ids": [known], "timeout_ms": timeout }),
            )
            .await;
        assert_eq!(code, "invalid_argument", "{timeout}: {message}");
        assert!(message.contains("timeout_ms"), "{message}");
    }
    // None of that disturbed the real task.
    let r = rig.finish(&known).await;
    assert_eq!(r["status"], "completed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_opencode_process_outlives_stop_server_or_the_gateway() {
    let rig = Rig::start(&[]).await;
    let first_pid = rig.opencode_pid();
    assert!(alive(first_pid));
    // A second start for the same directory returns the running server.
    let again = rig.ok("opencode_start_server", json!({})).await;
    assert_eq!(again["server_id"], rig.server["server_id"]);
    assert_eq!(again["reused"], true);

    let running = id(&rig.start_task("long one [[slow:30000]]").await);
    rig.fake.wait_for_requests(1, Duration::from_secs(30)).await;
    let stopped = rig
        .ok(
            "opencode_stop_server",
            json!({ "server_id": rig.server_id() }),
        )
        .await;
    assert_eq!(stopped["terminated"], true, "{stopped}");
    assert_eq!(stopped["failed_tasks"], json!([running]));
    assert!(wait_gone(first_pid, Duration::from_secs(10)).await);
    let st = rig.status(&running).await;
    assert_eq!(st["status"], "failed");
    assert!(st["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .contains("stopped"));
    // Its result stays readable.
    let r = rig
        .ok(
            "opencode_get_task_result",
            json!({ "task_id": running , "detail": "full" }),
        )
        .await;
    assert_eq!(r["status"], "failed");

    // A fresh server, stopped by the name the start tools accept for it: `default`. Once it is
    // gone, `default` names nothing to stop.
    let fresh = rig.ok("opencode_start_server", json!({})).await;
    assert_ne!(fresh["server_id"], rig.server["server_id"]);
    let fresh_pid = fresh["pid"].as_u64().expect("pid") as u32;
    let stopped = rig
        .ok("opencode_stop_server", json!({ "server_id": "default" }))
        .await;
    assert_eq!(stopped["server_id"], fresh["server_id"], "{stopped}");
    assert!(wait_gone(fresh_pid, Duration::from_secs(10)).await);
    let (code, message) = rig
        .err("opencode_stop_server", json!({ "server_id": "default" }))
        .await;
    assert_eq!(code, "not_found", "{message}");
    assert!(message.contains("`default`"), "{message}");

    // Another; then the host closes stdin: the gateway stops it and exits.
    let fresh = rig.ok("opencode_start_server", json!({})).await;
    let second_pid = fresh["pid"].as_u64().expect("pid") as u32;
    assert!(alive(second_pid));
    let gateway_pid = rig.client.pid().expect("gateway pid");
    let Rig { client, .. } = rig;
    client.close().await.expect("the gateway closes");
    assert!(wait_gone(gateway_pid, Duration::from_secs(15)).await);
    assert!(
        wait_gone(second_pid, Duration::from_secs(10)).await,
        "the managed OpenCode went with the gateway"
    );
}

/// The common cycle is two calls and lean results: `start_task` with server_id `default` (no
/// start_server call), then a wait that carries each answer. A long answer is cut to the host's
/// result budget (the whole result, JSON escapes included) and goes on, page by page, in
/// `get_task_result`; the pages join to exactly the answer. Ids, tokens and cost come with
/// detail `full` only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_calls_per_task_and_results_that_fit_the_host() {
    let fake = support::FakeLlm::start();
    let env = support::OpenCodeEnv::new();
    let budget = 4_000usize;
    let client = support::mcp::Launch::new(env.work_dir(), &env.home_dir())
        .envs(env.vars(&fake.url()))
        .env("OPENCODE_MCP_OPENCODE__COMMAND", support::opencode_bin())
        .env(
            "OPENCODE_MCP_HOSTS__DEFAULT__RESULT_CHARS",
            budget.to_string(),
        )
        .connect()
        .await
        .expect("gateway");
    let start = |prompt: String| {
        let client = &client;
        async move {
            let r = client
                .call(
                    "opencode_start_task",
                    json!({ "server_id": "default", "prompt": prompt }),
                )
                .await
                .expect("call");
            assert!(!r.is_error, "{}", r.text);
            r
        }
    };
    let short = start("short task".into()).await;
    // Quotes double in JSON: the budget must count the escaped text, not the characters.
    let long_line = format!("long {}", "word \"quoted\" ".repeat(900));
    let long = start(long_line.clone()).await;
    for reply in [&short, &long] {
        let s = &reply.structured;
        assert!(s["task_id"].is_string() && s["status"].is_string(), "{s}");
        for full_only in ["session_id", "server_id", "directory", "turn"] {
            assert!(
                s.get(full_only).is_none(),
                "lean start has no {full_only}: {s}"
            );
        }
    }
    let ids = [id(&short.structured), id(&long.structured)];
    let wait = client
        .call(
            "opencode_wait_for_task",
            json!({ "task_ids": ids, "timeout_ms": TASK_TIMEOUT_MS }),
        )
        .await
        .expect("wait");
    assert!(wait.text.len() <= budget, "{} > {budget}", wait.text.len());
    let w = &wait.structured;
    assert_eq!(w["done"], true, "{w}");
    assert_eq!(w["tasks"][0]["text"], "ECHO: short task", "{w}");
    assert!(w["tasks"][0].get("next_offset").is_none(), "{w}");
    let expected = echo_reply(&long_line);
    let first = w["tasks"][1]["text"]
        .as_str()
        .expect("the long answer starts");
    assert!(expected.starts_with(first) && first.len() > 1_000, "{w}");
    let mut offset = w["tasks"][1]["next_offset"]
        .as_u64()
        .expect("cut, with next_offset");
    assert_eq!(offset as usize, first.chars().count());
    let mut joined = first.to_string();
    let mut pages = 0;
    loop {
        let page = client
            .call(
                "opencode_get_task_result",
                json!({ "task_id": ids[1], "offset": offset }),
            )
            .await
            .expect("page");
        assert!(!page.is_error, "{}", page.text);
        assert!(page.text.len() <= budget, "{} > {budget}", page.text.len());
        let p = &page.structured;
        assert!(
            p.get("tokens").is_none() && p.get("model").is_none(),
            "lean: {p}"
        );
        joined.push_str(p["text"].as_str().expect("text"));
        pages += 1;
        match p["next_offset"].as_u64() {
            Some(next) => offset = next,
            None => break,
        }
    }
    assert_eq!(joined, expected);
    assert!(pages >= 2, "{pages}");
    let full = client
        .call_ok(
            "opencode_get_task_result",
            json!({ "task_id": ids[0], "detail": "full" }),
        )
        .await
        .expect("full result");
    assert!(full["tokens"]["input"].as_u64() > Some(0), "{full}");
    assert!(full["model"].is_string() && full["turn"] == 1, "{full}");
    eprintln!(
        "two-call cycle: start {} + wait {} characters of results (lean)",
        short.text.len(),
        wait.text.len()
    );
    client.close().await.expect("close");
}

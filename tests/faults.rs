//! Fault drills: each test causes one fault against the real, pinned OpenCode (plus the scripted
//! fake LLM on 127.0.0.1) and checks what the host sees over MCP, timing the recovery.
//!
//! | drill | test |
//! |---|---|
//! | OpenCode dies mid-task; managed servers bind loopback with a password nobody sees | [`opencode_dies_mid_task_and_a_fresh_server_takes_over`] |
//! | the event stream drops, OpenCode is unreachable for a while, wrong password on attach | [`attached_server_stream_cut_outage_and_wrong_password`] |
//! | the host vanishes: SIGTERM, SIGINT, SIGHUP, SIGKILL of the gateway (stdin closed: `delegation.rs`) | `host_sends_sigterm`, `host_sends_sigint`, `host_sends_sighup`, `host_kills_the_gateway_outright` |
//! | port in use, missing binary, HTML instead of the API, non-loopback without password | [`start_errors_name_the_cause_and_the_fix`] |
//! | malformed `delegation.yaml`, bad env override | [`a_malformed_config_refuses_to_start`] |
//! | the SSE decoder and the argument parser never panic | `property_*` |
//! | unknown fields and types from a newer OpenCode decode as before | [`unknown_fields_and_types_decode_as_before`] |
//!
//! Recovery times are printed (`cargo test --test faults -- --nocapture` shows them) as
//! `drill: what = N ms`.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::fake_llm::echo_reply;
use support::mcp::{Launch, McpClient, Sandbox};
use support::procs;
use support::rig::{poll_for, wait_gone, Rig, TASK_TIMEOUT_MS};
use support::tcp_proxy::TcpProxy;
use support::{opencode_bin, FakeLlm, OpenCodeEnv, OpenCodeServer};

fn id(v: &Value) -> String {
    v["task_id"].as_str().expect("task_id").to_string()
}

fn report(drill: &str, what: &str, took: Duration) {
    eprintln!("{drill}: {what} = {} ms", took.as_millis());
}

/// Every tool output of a session, so a test can grep them all.
#[derive(Default)]
struct Transcript(Mutex<Vec<String>>);

impl Transcript {
    fn push(&self, text: String) {
        self.0.lock().expect("transcript").push(text);
    }

    async fn ok(&self, rig: &Rig, tool: &str, args: Value) -> Value {
        let v = rig.ok(tool, args).await;
        self.push(v.to_string());
        v
    }

    async fn err(&self, rig: &Rig, tool: &str, args: Value) -> (String, String) {
        let (code, message) = rig.err(tool, args).await;
        self.push(format!("{code}: {message}"));
        (code, message)
    }

    fn all(&self) -> Vec<String> {
        self.0.lock().expect("transcript").clone()
    }
}

// ---------------------------------------------------------------------------------------------
// A deadline's abort that OpenCode never received.

/// **An abort the gateway had to give up on is tried again until OpenCode takes it.** A turn's
/// `timeouts.task` deadline ends the task whatever OpenCode says; when `POST /abort` cannot
/// reach OpenCode the session would otherwise run on, calling its model, unwatched.
///
/// An attached OpenCode behind a proxy runs a turn of fifteen 2.5 s model steps; the proxy
/// refuses every connection before the 10 s deadline passes, so the deadline's abort fails;
/// then it listens again.
///
/// Proves: the task ends `timed_out` at its deadline, and OpenCode's session stops within
/// seconds of the proxy's return, after a few of its fifteen steps (without the retries it ran
/// all of them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_that_could_not_reach_opencode_is_tried_again() {
    let fake = FakeLlm::start();
    let env = OpenCodeEnv::new();
    let server = OpenCodeServer::start(&env, &fake.url()).await;
    let upstream = server.addr();
    let mut proxy = TcpProxy::start(upstream).await;
    let url = proxy.url();
    let rig = Rig::start_in(
        fake,
        env,
        &[
            ("OPENCODE_MCP_OPENCODE__URL", url.as_str()),
            ("OPENCODE_SERVER_PASSWORD", server.password()),
            ("OPENCODE_MCP_TIMEOUTS__TASK", "10s"),
        ],
    )
    .await;
    const STEPS: usize = 15;
    let steps: String = (1..=STEPS)
        .map(|i| format!(" [[bash:echo step {i}]]"))
        .collect();
    let started = rig
        .start_task(&format!("run past the deadline [[delay:2500]]{steps}"))
        .await;
    let task = id(&started);
    let session = started["session_id"]
        .as_str()
        .expect("session_id")
        .to_string();
    let mut truth = server.events(&rig.env.work_dir()).await;
    rig.fake
        .wait_for_request(Duration::from_secs(30), |r| {
            r.last_user_text.contains("run past the deadline")
        })
        .await;
    proxy.refuse().await;
    proxy.cut().await;
    let w = rig
        .ok(
            "opencode_wait_for_task",
            json!({"task_ids": [task], "timeout_ms": 30_000}),
        )
        .await;
    assert_eq!(w["tasks"][0]["status"], "timed_out", "{w}");
    let at_deadline = rig.model_calls(&session);
    assert!(
        at_deadline < STEPS,
        "OpenCode still runs the turn: {at_deadline} steps asked"
    );
    proxy.resume();
    let back = Instant::now();
    truth.wait_idle(&session, Duration::from_secs(20)).await;
    report(
        "abort retry",
        "proxy back -> session stopped",
        back.elapsed(),
    );
    let stopped_after = rig.model_calls(&session);
    assert!(
        stopped_after < STEPS - 4,
        "the session stopped early: {stopped_after} of {STEPS} steps asked"
    );
}

// ---------------------------------------------------------------------------------------------
// Drill 1 (+ security): OpenCode dies mid-task.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_dies_mid_task_and_a_fresh_server_takes_over() {
    // Every crate at debug (a bare `debug` would mean this crate only): the password check
    // below covers the HTTP stack's debug output too.
    let rig = Rig::start(&[("OPENCODE_MCP_LOG", "debug,opencode_mcp=debug")]).await;
    let t = Transcript::default();
    t.push(rig.server.to_string());
    let first_server = rig.server_id();
    let first_pid = rig.opencode_pid();
    let first_password = check_managed_server_security(&rig.server).await;

    // One task finishes before the crash; two are mid-flight: a slow stream and a shell command.
    let done = id(&t
        .ok(
            &rig,
            "opencode_start_task",
            json!({"server_id": first_server, "prompt": "finished before the crash"}),
        )
        .await);
    let w = t
        .ok(
            &rig,
            "opencode_wait_for_task",
            json!({"task_ids": [done], "timeout_ms": TASK_TIMEOUT_MS}),
        )
        .await;
    assert_eq!(w["tasks"][0]["status"], "completed", "{w}");
    let streaming = id(&t
        .ok(
            &rig,
            "opencode_start_task",
            json!({"server_id": first_server, "prompt": "doomed stream [[slow:60000]]"}),
        )
        .await);
    let shell = id(&t
        .ok(
            &rig,
            "opencode_start_task",
            json!({"server_id": first_server, "prompt": "doomed shell [[bash:sleep 300]]"}),
        )
        .await);
    // Both are really running: the stream has reached the fake LLM and `sleep` runs under
    // OpenCode (bounded poll of /proc: the shell is OpenCode's child, not ours).
    let sleeper = poll_for(Duration::from_secs(30), || {
        procs::descendants(first_pid)
            .into_iter()
            .find(|pid| procs::stat(*pid).is_some_and(|p| p.comm == "sleep"))
    })
    .await
    .expect("the bash tool's `sleep` runs under OpenCode");
    rig.fake.wait_for_requests(3, Duration::from_secs(30)).await;
    let st = t
        .ok(
            &rig,
            "opencode_wait_for_task",
            json!({"task_ids": [streaming, shell], "timeout_ms": 0}),
        )
        .await;
    for task in st["tasks"].as_array().expect("tasks") {
        assert!(
            matches!(task["status"].as_str(), Some("pending" | "running")),
            "{st}"
        );
    }
    // OpenCode, the process group it runs in (with the gateway's supervisor, on Linux), and
    // everything under either.
    let group_of_server = procs::stat(first_pid).expect("OpenCode runs").pgrp;
    let mut doomed = procs::group(group_of_server);
    doomed.extend(procs::descendants(group_of_server));
    doomed.extend(procs::descendants(first_pid));
    doomed.insert(first_pid);
    assert!(doomed.contains(&sleeper));

    // SIGKILL the managed OpenCode.
    let killed_at = Instant::now();
    // SAFETY: kill(2) on the pid the gateway reported for its managed server.
    unsafe {
        libc::kill(first_pid as libc::pid_t, libc::SIGKILL);
    }
    let w = t
        .ok(
            &rig,
            "opencode_wait_for_task",
            json!({"task_ids": [streaming, shell], "timeout_ms": 30000}),
        )
        .await;
    let detected = killed_at.elapsed();
    report(
        "drill 1 (OpenCode SIGKILLed)",
        "kill -> tasks failed",
        detected,
    );
    assert_eq!(w["done"], true, "{w}");
    for task in w["tasks"].as_array().expect("tasks") {
        assert_eq!(task["status"], "failed", "{w}");
        let message = task["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(&first_server) && message.contains("exited with signal 9"),
            "the reason names the server and the signal: {w}"
        );
    }
    assert!(detected < Duration::from_secs(5), "took {detected:?}");
    // Nothing of that server is left: not OpenCode, not the shell it ran.
    match procs::wait_all_gone(&doomed, Duration::from_secs(10)).await {
        Ok(took) => report(
            "drill 1 (OpenCode SIGKILLed)",
            "kill -> its process group gone",
            took,
        ),
        Err(left) => panic!("left behind: {}", procs::describe(&left)),
    }

    // The finished task is still readable, the failed ones too.
    let r = t
        .ok(
            &rig,
            "opencode_get_task_result",
            json!({"task_id": done, "detail": "full" }),
        )
        .await;
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["text"], echo_reply("finished before the crash"));
    let r = t
        .ok(
            &rig,
            "opencode_get_task_result",
            json!({"task_id": shell, "detail": "full" }),
        )
        .await;
    assert_eq!(r["status"], "failed", "{r}");
    assert_eq!(r["error"]["name"], "ServerExited", "{r}");
    // A task on the dead server is refused with what to do.
    let (code, message) = t
        .err(
            &rig,
            "opencode_start_task",
            json!({"server_id": first_server, "prompt": "too late"}),
        )
        .await;
    assert_eq!(code, "opencode_unavailable", "{message}");
    assert!(
        message.contains("signal 9") && message.contains("opencode_start_server"),
        "{message}"
    );

    // A fresh server comes up and works.
    let restart = Instant::now();
    let fresh = t.ok(&rig, "opencode_start_server", json!({})).await;
    report(
        "drill 1 (OpenCode SIGKILLed)",
        "start_server -> fresh server ready",
        restart.elapsed(),
    );
    assert_ne!(fresh["server_id"], json!(first_server), "{fresh}");
    assert_eq!(fresh["reused"], false);
    let second_pid = fresh["pid"].as_u64().expect("pid") as u32;
    assert_ne!(second_pid, first_pid);
    let second_password = check_managed_server_security(&fresh).await;
    assert_ne!(first_password, second_password, "every server its own");
    let task_start = Instant::now();
    let after = id(&t
        .ok(
            &rig,
            "opencode_start_task",
            json!({"server_id": fresh["server_id"], "prompt": "after the crash"}),
        )
        .await);
    let w = t
        .ok(
            &rig,
            "opencode_wait_for_task",
            json!({"task_ids": [after], "timeout_ms": TASK_TIMEOUT_MS}),
        )
        .await;
    assert_eq!(w["tasks"][0]["status"], "completed", "{w}");
    report(
        "drill 1 (OpenCode SIGKILLed)",
        "first task on the fresh server",
        task_start.elapsed(),
    );
    let r = t
        .ok(
            &rig,
            "opencode_get_task_result",
            json!({"task_id": after, "detail": "full" }),
        )
        .await;
    assert_eq!(r["text"], echo_reply("after the crash"));
    // Status of everything once more, as a host polling would.
    for task in [&done, &streaming, &shell, &after] {
        t.ok(
            &rig,
            "opencode_get_task_status",
            json!({"task_id": task, "detail": "full" }),
        )
        .await;
    }

    // Security: no password in any tool output, nor in the debug log.
    let stderr = rig.client.stderr();
    for password in [&first_password, &second_password] {
        for (i, out) in t.all().iter().enumerate() {
            assert!(
                !out.contains(password.as_str()),
                "tool output {i} leaks the password: {out}"
            );
        }
        assert!(
            !stderr.contains(password.as_str()),
            "the gateway's stderr leaks the password"
        );
    }
    assert!(stderr.contains("DEBUG"), "the log ran at debug level");

    // The task records: private, and without the passwords.
    use std::os::unix::fs::PermissionsExt;
    let tasks_dir = rig.env.root().join("state/opencode-mcp/tasks");
    let mode = |p: &std::path::Path| {
        std::fs::metadata(p)
            .map(|m| m.permissions().mode() & 0o777)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    };
    assert_eq!(
        mode(&tasks_dir),
        0o700,
        "the task store is the user's alone"
    );
    let records: Vec<std::path::PathBuf> = std::fs::read_dir(&tasks_dir)
        .expect("the task store exists")
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(records.len() >= 4, "{records:?}");
    for record in &records {
        assert_eq!(mode(record), 0o600, "{}", record.display());
        let text = std::fs::read_to_string(record).unwrap_or_default();
        for password in [&first_password, &second_password] {
            assert!(
                !text.contains(password.as_str()),
                "{} holds a server password",
                record.display()
            );
        }
    }
}

/// A managed server listens on 127.0.0.1 only, answers 401 without its password and 200 with it.
/// Returns the password, read from the server's environment.
async fn check_managed_server_security(server: &Value) -> String {
    let url = server["url"].as_str().expect("url");
    let port: u16 = url
        .strip_prefix("http://127.0.0.1:")
        .unwrap_or_else(|| panic!("a managed server binds 127.0.0.1: {url}"))
        .parse()
        .expect("port");
    let listeners = procs::listeners_on(port);
    assert!(!listeners.is_empty(), "something listens on {port}");
    assert!(
        listeners
            .iter()
            .all(|(family, addr)| family == "tcp" && addr == "0100007F"),
        "only 127.0.0.1 listens on {port}: {listeners:?}"
    );
    let pid = server["pid"].as_u64().expect("pid") as u32;
    let password = procs::env_var(pid, "OPENCODE_SERVER_PASSWORD")
        .expect("a managed server always has a password");
    assert!(password.len() >= 16, "a real random password");
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client");
    let anonymous = http
        .get(format!("{url}/global/health"))
        .send()
        .await
        .expect("health");
    assert_eq!(anonymous.status().as_u16(), 401, "no password, no entry");
    let authed = http
        .get(format!("{url}/global/health"))
        .basic_auth("opencode", Some(&password))
        .send()
        .await
        .expect("health");
    assert_eq!(authed.status().as_u16(), 200);
    password
}

// ---------------------------------------------------------------------------------------------
// Drill 2: the event stream drops, OpenCode is unreachable for a while; wrong password on attach.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attached_server_stream_cut_outage_and_wrong_password() {
    let fake = FakeLlm::start();
    let env = OpenCodeEnv::new();
    let server = OpenCodeServer::start(&env, &fake.url()).await;
    let upstream = server.addr();
    let attach = |url: &str, password: Option<&str>| {
        let mut launch = Launch::new(env.work_dir(), &env.home_dir())
            .env("OPENCODE_MCP_OPENCODE__URL", url)
            .env("OPENCODE_MCP_LOG", "info,opencode_mcp=debug");
        if let Some(p) = password {
            launch = launch.env("OPENCODE_SERVER_PASSWORD", p);
        }
        launch
    };

    // Wrong password, and none at all: clear errors naming the variable.
    for (password, expected) in [
        (Some("not-the-password"), "refused the password"),
        (None, "requires a password"),
    ] {
        let client = attach(server.url(), password)
            .connect()
            .await
            .expect("gateway");
        let r = client
            .call("opencode_start_server", json!({}))
            .await
            .expect("call");
        assert!(r.is_error, "{}", r.text);
        assert_eq!(r.error_code(), Some("opencode_unavailable"), "{}", r.text);
        let message = r.error_message().unwrap_or_default();
        for fragment in [expected, "OPENCODE_SERVER_PASSWORD", server.url()] {
            assert!(message.contains(fragment), "{fragment:?} in {message}");
        }
        eprintln!("drill 4 (wrong password): {message}");
        client.close().await.expect("close");
    }

    // The real thing, through the proxy.
    let mut proxy = TcpProxy::start(upstream).await;
    let client = attach(&proxy.url(), Some(server.password()))
        .connect()
        .await
        .expect("gateway");
    let started = client
        .call_ok("opencode_start_server", json!({}))
        .await
        .expect("attach");
    assert_eq!(started["managed"], false);
    let server_id = started["server_id"]
        .as_str()
        .expect("server_id")
        .to_string();
    let rig = AttachedRig {
        client,
        server_id,
        fake: &fake,
    };
    // The pump subscribes right after the attach; the cut must find it connected.
    proxy
        .wait_connections("GET /global/event", 1, Duration::from_secs(10))
        .await;

    // 2a: cut every connection while three tasks wait on the LLM.
    let prompts: Vec<String> = (0..3).map(|i| format!("cut {i} [[delay:2500]]")).collect();
    let ids = rig.start_all(&prompts).await;
    let asked = fake.wait_for_requests(3, Duration::from_secs(30)).await;
    let cut_at = Instant::now();
    let cut = proxy.cut().await;
    assert!(cut >= 1, "the event stream was live");
    let finished = rig.collect_finishes(&ids).await;
    let all_done = Instant::now();
    report(
        "drill 2a (stream cut)",
        "cut -> all three completed",
        all_done - cut_at,
    );
    // The fake answered each 2.5 s after it was asked; the last answer to the host seeing it:
    let last_answer =
        asked.iter().map(|r| r.at).max().expect("requests") + Duration::from_millis(2500);
    report(
        "drill 2a (stream cut)",
        "last LLM answer -> host saw all completed",
        all_done.saturating_duration_since(last_answer),
    );
    rig.assert_completed_once(&ids, &prompts, &finished).await;
    // The pump reconnected through the proxy.
    proxy
        .wait_connections("GET /global/event", 2, Duration::from_secs(10))
        .await;
    // The proxy counts the connection before the pump has read OpenCode's answer and logged
    // the reconnection: wait for the line itself.
    rig.client
        .wait_stderr_line(&["event stream reconnected"], Duration::from_secs(10))
        .await
        .unwrap_or_else(|e| panic!("the pump reconnected: {e}"));

    // 2b: OpenCode unreachable (connections refused) while the tasks finish, then back.
    let mut truth = server.events(&env.work_dir()).await;
    let prompts: Vec<String> = (0..3)
        .map(|i| format!("outage {i} [[delay:5000]]"))
        .collect();
    let starts = rig.start_all_replies(&prompts).await;
    let ids: Vec<String> = starts.iter().map(id).collect();
    fake.wait_for_requests(6, Duration::from_secs(30)).await;
    proxy.refuse().await;
    proxy.cut().await;
    let down_at = Instant::now();
    // OpenCode finishes all three while the gateway cannot reach it (seen on our own stream),
    // in whatever order: waiting for one session's idle consumes the others' that come first.
    let mut busy: Vec<String> = starts
        .iter()
        .map(|s| s["session_id"].as_str().expect("session_id").to_string())
        .collect();
    while !busy.is_empty() {
        let idle = truth
            .wait_for(Duration::from_secs(30), |e| {
                e["type"] == "session.idle"
                    && busy
                        .iter()
                        .any(|s| e["properties"]["sessionID"] == s.as_str())
            })
            .await;
        busy.retain(|s| idle["properties"]["sessionID"] != s.as_str());
    }
    // The gateway cannot know yet: it reports them unfinished, not failed, not completed.
    let w = rig
        .ok(
            "opencode_wait_for_task",
            json!({"task_ids": ids, "timeout_ms": 0}),
        )
        .await;
    for task in w["tasks"].as_array().expect("tasks") {
        assert!(
            matches!(task["status"].as_str(), Some("pending" | "running")),
            "{w}"
        );
    }
    // New work is refused with a clear reason meanwhile.
    let r = rig
        .client
        .call(
            "opencode_start_task",
            json!({"server_id": rig.server_id, "prompt": "during the outage"}),
        )
        .await
        .expect("call");
    assert_eq!(r.error_code(), Some("opencode_unavailable"), "{}", r.text);
    assert!(
        r.error_message()
            .unwrap_or_default()
            .contains("unreachable"),
        "{}",
        r.text
    );
    let outage = down_at.elapsed();
    proxy.resume();
    let resumed_at = Instant::now();
    let finished = rig.collect_finishes(&ids).await;
    report("drill 2b (outage)", "outage length", outage);
    report(
        "drill 2b (outage)",
        "back -> all three completed",
        resumed_at.elapsed(),
    );
    rig.assert_completed_once(&ids, &prompts, &finished).await;
    proxy
        .wait_connections("GET /global/event", 3, Duration::from_secs(10))
        .await;
    rig.client.close().await.expect("close");
    drop(server);
}

/// A gateway attached to one server.
struct AttachedRig<'a> {
    client: McpClient,
    server_id: String,
    fake: &'a FakeLlm,
}

impl AttachedRig<'_> {
    async fn ok(&self, tool: &str, args: Value) -> Value {
        match self.client.call(tool, args.clone()).await {
            Ok(r) if !r.is_error => r.structured,
            Ok(r) => panic!("{tool}({args}): {}\n{}", r.text, self.client.stderr()),
            Err(e) => panic!("{tool}({args}): {e}\n{}", self.client.stderr()),
        }
    }

    async fn start_all_replies(&self, prompts: &[String]) -> Vec<Value> {
        let mut out = Vec::new();
        for p in prompts {
            out.push(
                self.ok(
                    "opencode_start_task",
                    json!({"server_id": self.server_id, "prompt": p, "detail": "full"}),
                )
                .await,
            );
        }
        out
    }

    async fn start_all(&self, prompts: &[String]) -> Vec<String> {
        self.start_all_replies(prompts)
            .await
            .iter()
            .map(id)
            .collect()
    }

    /// Waits with `mode: any` on the unfinished ones until none is left; returns, per task, how
    /// many waits reported it newly finished (the host's view of "reported once").
    async fn collect_finishes(&self, ids: &[String]) -> BTreeMap<String, usize> {
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        let deadline = Instant::now() + Duration::from_millis(TASK_TIMEOUT_MS);
        let mut waiting: Vec<String> = ids.to_vec();
        while !waiting.is_empty() {
            assert!(
                Instant::now() < deadline,
                "unfinished: {waiting:?}\n{}",
                self.client.stderr()
            );
            let w = self
                .ok(
                    "opencode_wait_for_task",
                    json!({"task_ids": waiting, "mode": "any", "timeout_ms": 30000}),
                )
                .await;
            for f in w["finished"].as_array().expect("finished") {
                *seen.entry(f.as_str().expect("id").to_string()).or_default() += 1;
            }
            waiting.retain(|t| !seen.contains_key(t));
        }
        seen
    }

    async fn assert_completed_once(
        &self,
        ids: &[String],
        prompts: &[String],
        finished: &BTreeMap<String, usize>,
    ) {
        for (task, prompt) in ids.iter().zip(prompts) {
            assert_eq!(finished.get(task), Some(&1), "{task}: {finished:?}");
            let r = self
                .ok(
                    "opencode_get_task_result",
                    json!({"task_id": task, "detail": "full" }),
                )
                .await;
            assert_eq!(r["status"], "completed", "{r}");
            assert_eq!(r["turn"], 1, "{r}");
            assert_eq!(r["text"], echo_reply(prompt), "{r}");
            let session = self
                .ok(
                    "opencode_get_task_status",
                    json!({"task_id": task, "detail": "full" }),
                )
                .await["session_id"]
                .as_str()
                .expect("session")
                .to_string();
            let calls = self
                .fake
                .chat_requests()
                .iter()
                .filter(|r| r.session_id() == Some(session.as_str()))
                .count();
            assert_eq!(calls, 1, "{task}: the prompt went out once");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Drill 3: the host vanishes. Every process the gateway started, and theirs, goes.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_sends_sigterm() {
    host_vanishes("SIGTERM", libc::SIGTERM).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_sends_sigint() {
    host_vanishes("SIGINT", libc::SIGINT).await;
}

/// The terminal that ran the host closed (the npm launcher forwards SIGHUP too): a clean
/// shutdown, like SIGTERM, not the default death that loses queued record writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_sends_sighup() {
    host_vanishes("SIGHUP", libc::SIGHUP).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_kills_the_gateway_outright() {
    host_vanishes("SIGKILL", libc::SIGKILL).await;
}

/// A second SIGTERM while the gateway is stopping its servers ends it at once (a host, or a
/// user at Ctrl-C, that is done waiting); the supervisors still take every managed process
/// down. The shutdown is held open by stopping OpenCode's process group (SIGSTOP), so the
/// gateway would otherwise wait out its stop grace (about 6 s) before exiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_during_shutdown_exits_at_once() {
    let rig = Rig::start(&[]).await;
    let gateway = rig.client.pid().expect("gateway pid");
    let opencode = rig.opencode_pid();
    let group = procs::stat(opencode).expect("OpenCode runs").pgrp;
    let everything = procs::group(group);
    let signal = |pid: libc::pid_t, sig| {
        // SAFETY: kill(2) on processes this test spawned (a negative pid: their group).
        unsafe { libc::kill(pid, sig) };
    };
    signal(-(group as libc::pid_t), libc::SIGSTOP);
    signal(gateway as libc::pid_t, libc::SIGTERM);
    rig.client
        .wait_stderr_line(
            &["stopping managed OpenCode servers"],
            Duration::from_secs(10),
        )
        .await
        .unwrap_or_else(|e| panic!("the first SIGTERM started the shutdown: {e}"));
    let second = Instant::now();
    signal(gateway as libc::pid_t, libc::SIGTERM);
    let gone = wait_gone(gateway, Duration::from_secs(20)).await;
    let took = second.elapsed();
    // Let the stopped supervisor run again: it finds its lifeline closed and cleans up.
    signal(-(group as libc::pid_t), libc::SIGCONT);
    assert!(gone, "the gateway is still running");
    rig.client
        .wait_stderr_line(
            &["SIGTERM received again while shutting down: exiting now"],
            Duration::from_secs(10),
        )
        .await
        .unwrap_or_else(|e| panic!("the second SIGTERM ended the wait: {e} (after {took:?})"));
    if let Err(left) = procs::wait_all_gone(&everything, Duration::from_secs(15)).await {
        panic!("left behind: {}", procs::describe(&left));
    }
    report(
        "drill 3b (second SIGTERM)",
        "second signal -> gateway gone",
        took,
    );
}

async fn host_vanishes(name: &str, signal: libc::c_int) {
    // With `limits.linger` on (the default), a clean shutdown lets the OpenCode of a running
    // task run on for the next gateway (restart.rs, a_local_task_runs_on_across_a_clean_reconnect).
    // Off, nothing the gateway started outlives it, which is what this drill checks.
    let rig = Rig::start(&[("OPENCODE_MCP_LIMITS__LINGER", "0s")]).await;
    let gateway = rig.client.pid().expect("gateway pid");
    let opencode = rig.opencode_pid();
    let task = id(&rig.start_task("still busy [[bash:sleep 300]]").await);
    let sleeper = poll_for(Duration::from_secs(30), || {
        procs::descendants(opencode)
            .into_iter()
            .find(|pid| procs::stat(*pid).is_some_and(|p| p.comm == "sleep"))
    })
    .await;
    assert!(
        sleeper.is_some(),
        "the task's shell runs: {}",
        rig.status(&task).await
    );
    let mut everything = procs::descendants(gateway);
    everything.extend(procs::group(opencode));
    assert!(everything.contains(&opencode));
    eprintln!(
        "drill 3 ({name}): processes under the gateway: {}",
        procs::describe(&everything)
    );
    let at = Instant::now();
    // SAFETY: kill(2) on the gateway this test spawned.
    unsafe {
        libc::kill(gateway as libc::pid_t, signal);
    }
    match procs::wait_all_gone(&everything, Duration::from_secs(15)).await {
        Ok(took) => report(
            &format!("drill 3 ({name})"),
            "signal -> every managed process gone",
            took,
        ),
        Err(left) => panic!("{name}: left behind: {}", procs::describe(&left)),
    }
    assert!(wait_gone(gateway, Duration::from_secs(10)).await);
    report(
        &format!("drill 3 ({name})"),
        "signal -> gateway gone",
        at.elapsed(),
    );
    if signal != libc::SIGKILL {
        // Its own shutdown ran (servers stopped, records flushed), not the signal's default.
        // The gateway is gone, but the reader of its stderr may not have read the pipe's last
        // bytes yet: wait (bounded) for each line rather than read what arrived so far.
        for line in [
            format!("{name} received, shutting down"),
            "stopping managed OpenCode servers".to_string(),
        ] {
            rig.client
                .wait_stderr_line(&[&line], Duration::from_secs(10))
                .await
                .unwrap_or_else(|e| panic!("{name}: no clean shutdown: {e}"));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Drill 4: start errors name the cause and the fix.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_errors_name_the_cause_and_the_fix() {
    let sandbox = Sandbox::new().expect("sandbox");
    let start_error = |launch: Launch, args: Value| async move {
        let client = launch.connect().await.expect("gateway");
        let at = Instant::now();
        let r = client
            .call("opencode_start_server", args)
            .await
            .expect("call");
        let took = at.elapsed();
        assert!(r.is_error, "must fail: {}", r.text);
        let out = (
            r.error_code().unwrap_or_default().to_string(),
            r.error_message().unwrap_or_default().to_string(),
            took,
        );
        client.close().await.expect("close");
        out
    };
    let check =
        |case: &str, (code, message, took): (String, String, Duration), fragments: &[&str]| {
            eprintln!("drill 4 ({case}, {} ms): {message}", took.as_millis());
            assert_eq!(code, "opencode_unavailable", "{case}: {message}");
            for f in fragments {
                assert!(message.contains(f), "{case}: {f:?} missing from: {message}");
            }
        };

    // The binary is missing.
    let r = start_error(
        sandbox
            .launch()
            .env("OPENCODE_MCP_OPENCODE__COMMAND", "/nonexistent/opencode"),
        json!({}),
    )
    .await;
    check(
        "missing binary",
        r,
        &[
            "/nonexistent/opencode",
            "not found",
            "npm install -g opencode-ai",
            "opencode.command",
        ],
    );

    // The port is taken (by a listener this test holds).
    let fake = FakeLlm::start();
    let env = OpenCodeEnv::new();
    let holder = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = holder.local_addr().expect("addr").port();
    let r = start_error(
        Launch::new(env.work_dir(), &env.home_dir())
            .envs(env.vars(&fake.url()))
            .env("OPENCODE_MCP_OPENCODE__COMMAND", opencode_bin()),
        json!({ "port": port }),
    )
    .await;
    check(
        "port in use",
        r,
        &[&format!("port {port}"), "already in use", "`port`"],
    );
    drop(holder);

    // Something that answers HTML to everything (as OpenCode's web UI does for unknown routes).
    let html = HtmlServer::start();
    let r = start_error(
        sandbox
            .launch()
            .env("OPENCODE_MCP_OPENCODE__URL", html.url())
            .env("OPENCODE_SERVER_PASSWORD", "whatever"),
        json!({}),
    )
    .await;
    check(
        "HTML instead of the API",
        r,
        &[&html.url(), "web page", "opencode.url"],
    );

    // Nothing listens there: a socket bound but not listening holds the port (so nothing else
    // can take it meanwhile) and connecting to it is refused.
    let holder = tokio::net::TcpSocket::new_v4().expect("socket");
    holder
        .bind(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
        .expect("bind");
    let closed = holder.local_addr().expect("addr").port();
    let r = start_error(
        sandbox.launch().env(
            "OPENCODE_MCP_OPENCODE__URL",
            format!("http://127.0.0.1:{closed}"),
        ),
        json!({}),
    )
    .await;
    check(
        "nothing listening",
        r,
        &["unreachable", "opencode serve", "opencode.url"],
    );
    drop(holder);

    // Drill 6: a non-loopback URL without a password is refused before any connection is made
    // (192.0.2.1 is TEST-NET-1: nothing answers there, and nothing is sent).
    let r = start_error(
        sandbox
            .launch()
            .env("OPENCODE_MCP_OPENCODE__URL", "https://192.0.2.1:4096"),
        json!({}),
    )
    .await;
    // A connection attempt would hang until the request timeout (15 s); this bound also covers
    // starting a debug gateway on a loaded machine.
    assert!(r.2 < Duration::from_secs(6), "refused without connecting");
    check(
        "non-loopback without password",
        r,
        &["loopback", "OPENCODE_SERVER_PASSWORD", "192.0.2.1"],
    );
}

/// A tiny HTTP server on 127.0.0.1 that answers `200 text/html` to every request.
struct HtmlServer {
    port: u16,
}

impl HtmlServer {
    fn start() -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                std::thread::spawn(move || {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let body = "<!doctype html><html><body>web app</body></html>";
                    let _ = write!(
                        stream,
                        "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n\
                         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                });
            }
        });
        Self { port }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

// ---------------------------------------------------------------------------------------------
// Drill 5: a malformed config refuses to start, before speaking MCP.

#[test]
fn a_malformed_config_refuses_to_start() {
    let sandbox = Sandbox::new().expect("sandbox");
    sandbox
        .write_repo_config("timeouts:\n  task: soon\nlimits:\n  max_taskz: 3\n")
        .expect("write");
    let file = sandbox.cwd().join("delegation.yaml").display().to_string();
    let (code, stdout, stderr) = run_serve(sandbox.launch());
    assert_ne!(code, Some(0), "{stderr}");
    assert!(stdout.is_empty(), "nothing on stdout: {stdout}");
    for f in [
        "refusing to start",
        file.as_str(),
        "timeouts.task",
        "limits.max_taskz",
    ] {
        assert!(stderr.contains(f), "{f:?} missing from:\n{stderr}");
    }
    eprintln!("drill 5 (bad file): {stderr}");

    let clean = Sandbox::new().expect("sandbox");
    let (code, stdout, stderr) =
        run_serve(clean.launch().env("OPENCODE_MCP_TIMEOUTS__TASK", "soon"));
    assert_ne!(code, Some(0), "{stderr}");
    assert!(stdout.is_empty(), "nothing on stdout: {stdout}");
    for f in [
        "refusing to start",
        "OPENCODE_MCP_TIMEOUTS__TASK",
        "timeouts.task",
    ] {
        assert!(stderr.contains(f), "{f:?} missing from:\n{stderr}");
    }
    eprintln!("drill 5 (bad env): {stderr}");
}

/// Runs the gateway's default command (serve) with stdin held open, as a host does, and returns
/// its exit code, stdout and stderr; it must exit on its own within 10 s.
fn run_serve(launch: Launch) -> (Option<i32>, String, String) {
    let cmd = launch.command();
    let mut cmd = cmd.into_std();
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn the gateway");
    let pid = child.id();
    // Held open until the gateway has exited: it must stop on its own, not at end of input.
    let stdin = child.stdin.take();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let output = match rx.recv_timeout(Duration::from_secs(10)) {
        Ok(output) => output.expect("the gateway's output"),
        Err(_) => {
            // SAFETY: kill(2) on the gateway this test spawned.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
            }
            panic!("the gateway kept running on a bad config");
        }
    };
    drop(stdin);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (output.status.code(), stdout, stderr)
}

// ---------------------------------------------------------------------------------------------
// Drill 7: property tests. A small deterministic generator (SplitMix64) instead of a property
// testing crate: proptest's `std` feature turns on `num-traits/std`, which the library's own
// dependencies build without, so `cargo test` after `cargo build` would rebuild the library and
// the generated client. Each case prints its seed when it fails, so it can be replayed.

/// Cases per property (fixed, so CI time is fixed).
const CASES: u64 = 256;

/// SplitMix64: tiny, fast, and good enough to drive input generation.
struct Gen(u64);

impl Gen {
    fn new(seed: u64) -> Self {
        Self(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    fn bytes(&mut self, max: usize) -> Vec<u8> {
        let n = self.below(max + 1);
        (0..n).map(|_| self.next() as u8).collect()
    }

    /// Strings that stress parsers: quotes, backslashes, newlines, `data:`, unicode, controls.
    fn string(&mut self, max: usize) -> String {
        const PIECES: &[&str] = &[
            "a", "Z", "0", " ", "\"", "\\", "\n", "\r", "\r\n", "\t", ":", "data:", "{", "}", "[",
            "]", ",", "é", "日本", "🦀", "\u{0}", "\u{7f}", "\u{2028}", "null", "-1", "ses_x",
            "msg_y", "prt_z", "srv_1", "tsk_1", "/", "../", "%00",
        ];
        let n = self.below(max + 1);
        (0..n).map(|_| *self.pick(PIECES)).collect()
    }

    fn number(&mut self) -> Value {
        match self.below(8) {
            0 => json!(0),
            1 => json!(-(self.below(1000) as i64)),
            2 => json!(self.next()),
            3 => json!(i64::MIN),
            4 => json!(u64::MAX),
            5 => json!((self.next() as f64) / 7.0),
            6 => json!(-0.5),
            _ => json!(self.below(100_000)),
        }
    }

    /// An arbitrary JSON value, at most `depth` levels deep.
    fn json(&mut self, depth: usize) -> Value {
        let choice = if depth == 0 {
            self.below(4)
        } else {
            self.below(6)
        };
        match choice {
            0 => Value::Null,
            1 => json!(self.chance(50)),
            2 => self.number(),
            3 => json!(self.string(12)),
            4 => Value::Array((0..self.below(5)).map(|_| self.json(depth - 1)).collect()),
            _ => {
                let mut map = serde_json::Map::new();
                for _ in 0..self.below(5) {
                    map.insert(self.string(6), self.json(depth - 1));
                }
                Value::Object(map)
            }
        }
    }

    /// `[[[[...]]]]` deeper than serde_json's recursion limit.
    fn too_deep(&mut self) -> Value {
        let mut v = json!("bottom");
        for _ in 0..(130 + self.below(100)) {
            v = json!([v]);
        }
        v
    }
}

/// Runs `case` for seeds `0..CASES` (offset by `salt`), naming the seed of a failing case.
fn for_each_case(property: &str, salt: u64, mut case: impl FnMut(&mut Gen)) {
    for i in 0..CASES {
        let seed = salt.wrapping_mul(1_000_003).wrapping_add(i);
        let mut g = Gen::new(seed);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| case(&mut g)));
        if let Err(panic) = outcome {
            eprintln!("{property}: case {i} (seed {seed}) failed");
            std::panic::resume_unwind(panic);
        }
    }
}

fn fixture_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/opencode")
}

/// Every recorded event payload (`events*.jsonl`), one per line.
fn recorded_event_lines() -> Vec<String> {
    let mut names: Vec<_> = std::fs::read_dir(fixture_dir())
        .expect("fixtures")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("events") && n.ends_with(".jsonl"))
        .collect();
    names.sort();
    assert!(names.len() >= 5, "{names:?}");
    names
        .iter()
        .flat_map(|n| {
            std::fs::read_to_string(fixture_dir().join(n))
                .expect("read fixture")
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(String::from)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Replaces the value at a random position of `v` with `replacement`.
fn replace_somewhere(g: &mut Gen, v: &mut Value, replacement: Value) {
    let mut slot = v;
    loop {
        let children = match slot {
            Value::Object(map) if !map.is_empty() => map.len(),
            Value::Array(items) if !items.is_empty() => items.len(),
            _ => break,
        };
        if g.chance(30) {
            break;
        }
        let i = g.below(children);
        slot = match slot {
            Value::Object(map) => map.values_mut().nth(i).expect("child"),
            Value::Array(items) => &mut items[i],
            _ => unreachable!(),
        };
    }
    *slot = replacement;
}

use opencode_mcp::opencode::events::{decode_event, Event, SseParser};

/// The SSE decoder: arbitrary bytes, arbitrary split points, recorded and mutated payloads. It
/// never panics, and how the bytes are split never changes what comes out.
#[test]
fn property_sse_decoder_never_panics_and_ignores_split_points() {
    let recorded = recorded_event_lines();
    let mut decoded_kinds = BTreeSet::new();
    for_each_case("sse", 1, |g| {
        // A stream of frames: recorded, mutated, random JSON, random bytes, comments, fields.
        let mut stream: Vec<u8> = Vec::new();
        for _ in 0..(1 + g.below(12)) {
            let eol: &[u8] = if g.chance(20) { b"\r\n" } else { b"\n" };
            match g.below(8) {
                0 | 1 => {
                    let line: String = g.pick(recorded.as_slice()).clone();
                    stream.extend_from_slice(b"data: ");
                    stream.extend_from_slice(line.as_bytes());
                }
                2 => {
                    let line: &String = g.pick(recorded.as_slice());
                    let mut v: Value = serde_json::from_str(line).expect("json");
                    let replacement = g.json(3);
                    replace_somewhere(g, &mut v, replacement);
                    stream.extend_from_slice(format!("data:{v}").as_bytes());
                }
                3 => {
                    let line: String = g.pick(recorded.as_slice()).clone();
                    let cut = g.below(line.len() + 1);
                    stream.extend_from_slice(b"data: ");
                    stream.extend_from_slice(&line.as_bytes()[..cut]);
                }
                4 => {
                    let v = if g.chance(10) {
                        g.too_deep()
                    } else {
                        g.json(4)
                    };
                    stream.extend_from_slice(format!("data: {v}").as_bytes());
                }
                5 => stream.extend(g.bytes(64)),
                6 => {
                    let field = *g.pick(&[": comment", "event: x", "id: 7", "retry: 10", "data"]);
                    stream.extend_from_slice(field.as_bytes());
                }
                _ => {
                    // A payload over several data lines.
                    stream.extend_from_slice(b"data: {\"type\":");
                    stream.extend_from_slice(eol);
                    stream.extend_from_slice(b"data: \"session.idle\"}");
                }
            }
            stream.extend_from_slice(eol);
            if g.chance(80) {
                stream.extend_from_slice(eol);
            }
        }
        let mut whole = SseParser::default();
        let expected = whole.feed(&stream);
        let mut split = SseParser::default();
        let mut got = Vec::new();
        let mut rest: &[u8] = &stream;
        while !rest.is_empty() {
            let n = g.below(rest.len().min(40) + 1);
            got.extend(split.feed(&rest[..n]));
            rest = &rest[n..];
        }
        assert_eq!(got, expected, "split points changed the payloads");
        for payload in &expected {
            let event = decode_event(payload);
            decoded_kinds.insert(
                format!("{event:?}")
                    .split([' ', '(', '{'])
                    .next()
                    .unwrap_or("")
                    .to_string(),
            );
        }
        // Well-formed frames (recorded payloads, blank-line terminated, LF or CRLF, with comments
        // and unknown fields between them) come out exactly as sent, however they are split.
        let frames: Vec<String> = (0..(1 + g.below(6)))
            .map(|_| g.pick(recorded.as_slice()).clone())
            .collect();
        let mut clean: Vec<u8> = Vec::new();
        for frame in &frames {
            let eol: &[u8] = if g.chance(30) { b"\r\n" } else { b"\n" };
            if g.chance(30) {
                clean.extend_from_slice(b": keep-alive");
                clean.extend_from_slice(eol);
            }
            if g.chance(20) {
                clean.extend_from_slice(b"id: 42");
                clean.extend_from_slice(eol);
            }
            clean.extend_from_slice(if g.chance(50) { b"data: " } else { b"data:" });
            clean.extend_from_slice(frame.as_bytes());
            clean.extend_from_slice(eol);
            clean.extend_from_slice(eol);
        }
        let mut parser = SseParser::default();
        let mut out = Vec::new();
        let mut rest: &[u8] = &clean;
        while !rest.is_empty() {
            let n = g.below(rest.len().min(64) + 1);
            out.extend(parser.feed(&rest[..n]));
            rest = &rest[n..];
        }
        assert_eq!(out, frames, "recorded frames come out as sent");
        // And arbitrary text as a payload.
        let _ = decode_event(&String::from_utf8_lossy(&g.bytes(200)));
        let _ = decode_event(&g.string(40));
    });
    // The generator reached the decoder's interesting paths, not only `Other`.
    for kind in [
        "SessionStatus",
        "SessionIdle",
        "MessageUpdated",
        "PartUpdated",
        "Other",
    ] {
        assert!(
            decoded_kinds.contains(kind),
            "{kind} never decoded: {decoded_kinds:?}"
        );
    }
}

/// Tool-argument parsing, for every action, over arbitrary JSON objects and mutations of valid
/// ones: `Ok`, or an `invalid_argument` error with a message; never a panic.
#[test]
fn property_tool_arguments_parse_or_fail_cleanly() {
    use opencode_mcp::config::Action;
    use opencode_mcp::error::ErrorCode;
    use opencode_mcp::gateway::parse_tool_arguments;

    const KEYS: &[&str] = &[
        "server_id",
        "task_id",
        "task_ids",
        "prompt",
        "agent",
        "model",
        "tier",
        "directory",
        "title",
        "port",
        "mode",
        "timeout_ms",
        "include_progress",
        "offset",
        "reply",
    ];
    let mut outcomes: BTreeMap<String, (u32, u32)> = BTreeMap::new();
    for_each_case("tool arguments", 2, |g| {
        for action in Action::ALL {
            let mut args = match g.below(3) {
                0 => valid_arguments(action),
                1 => serde_json::Map::new(),
                _ => match g.json(1) {
                    Value::Object(map) => map,
                    _ => serde_json::Map::new(),
                },
            };
            for _ in 0..g.below(4) {
                let key = if g.chance(80) {
                    g.pick(KEYS).to_string()
                } else {
                    g.string(8)
                };
                let value = match g.below(10) {
                    0 => g.too_deep(),
                    1 => json!(g.string(200)),
                    2 => g.number(),
                    _ => g.json(3),
                };
                args.insert(key, value);
            }
            let entry = outcomes.entry(format!("{action:?}")).or_default();
            match parse_tool_arguments(action, args.clone()) {
                Ok(()) => entry.0 += 1,
                Err(e) => {
                    entry.1 += 1;
                    assert_eq!(
                        e.code,
                        ErrorCode::InvalidArgument,
                        "{action:?} {args:?}: {e}"
                    );
                    assert!(!e.message.trim().is_empty(), "{action:?} {args:?}");
                }
            }
        }
    });
    // Both outcomes occurred for every action, so the cases were neither all junk nor all valid.
    for (action, (ok, err)) in &outcomes {
        assert!(*ok > 0 && *err > 0, "{action}: {ok} ok, {err} errors");
    }
}

/// A minimal valid argument object per action.
fn valid_arguments(action: opencode_mcp::config::Action) -> serde_json::Map<String, Value> {
    use opencode_mcp::config::Action;
    let v = match action {
        Action::StartServer => json!({}),
        Action::StopServer | Action::ListAgents => json!({"server_id": "srv_1"}),
        Action::StartTask => json!({"server_id": "srv_1", "prompt": "do it"}),
        Action::ContinueTask => json!({"task_id": "tsk_1", "prompt": "more"}),
        Action::WaitForTask => json!({"task_ids": ["tsk_1"]}),
        Action::ReplyPermission => json!({"task_id": "tsk_1", "reply": "once"}),
        _ => json!({"task_id": "tsk_1"}),
    };
    match v {
        Value::Object(map) => map,
        _ => unreachable!(),
    }
}

/// The same over the wire: random calls to every tool of a live gateway (no OpenCode behind it,
/// and a binary that does not exist, so nothing is started). Every call is answered with a tool
/// result carrying a code of the shared vocabulary (never `internal`, never a protocol error),
/// and the gateway is still there at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn property_tool_calls_over_mcp_never_break_the_gateway() {
    let sandbox = Sandbox::new().expect("sandbox");
    let client = sandbox
        .launch()
        .env("OPENCODE_MCP_OPENCODE__COMMAND", "/nonexistent/opencode")
        .connect()
        .await
        .expect("gateway");
    let tools: Vec<(String, Vec<String>)> = client
        .list_tools()
        .await
        .expect("tools")
        .iter()
        .map(|t| {
            let keys = t
                .input_schema
                .get("properties")
                .and_then(Value::as_object)
                .map(|p| p.keys().cloned().collect())
                .unwrap_or_default();
            (t.name.to_string(), keys)
        })
        .collect();
    let mut g = Gen::new(3);
    let mut codes: BTreeMap<String, u32> = BTreeMap::new();
    let started = Instant::now();
    for _ in 0..CASES {
        let (tool, keys) = g.pick(&tools).clone();
        let mut args = serde_json::Map::new();
        for _ in 0..g.below(keys.len() + 2) {
            let key = if !keys.is_empty() && g.chance(85) {
                g.pick(&keys).clone()
            } else {
                g.string(6)
            };
            args.insert(key, g.json(3));
        }
        // Keep waits short: a valid wait on unknown ids fails at once anyway.
        if args.contains_key("timeout_ms") && g.chance(50) {
            args.insert("timeout_ms".into(), json!(0));
        }
        let r = client
            .call(&tool, Value::Object(args.clone()))
            .await
            .unwrap_or_else(|e| panic!("{tool}({args:?}): protocol error {e}"));
        let code = if r.is_error {
            r.error_code().unwrap_or("<no code>").to_string()
        } else {
            "ok".to_string()
        };
        assert!(
            matches!(
                code.as_str(),
                "invalid_argument" | "not_found" | "opencode_unavailable" | "ok"
            ),
            "{tool}({args:?}) -> {}",
            r.text
        );
        *codes.entry(code).or_default() += 1;
    }
    report(
        "drill 7 (fuzzed tool calls)",
        &format!("{CASES} calls"),
        started.elapsed(),
    );
    eprintln!("drill 7 (fuzzed tool calls): outcomes {codes:?}");
    assert!(codes.get("invalid_argument").copied().unwrap_or(0) > 0);
    // Still serving.
    assert!(!client.list_tools().await.expect("still alive").is_empty());
    client.close().await.expect("close");
}

// ---------------------------------------------------------------------------------------------
// Drill 8: a newer OpenCode adds fields and types; decoding must not change.

/// The key injected everywhere; stripped again before comparing what was decoded.
const EXTRA: &str = "x_future_field";

/// Adds [`EXTRA`] (with a nested value) to every object in `v`, except the objects whose key in
/// their parent is in `maps` (maps of typed values, where a new key is a new entry, not a new
/// field).
fn decorate(v: &mut Value, maps: &[&str], parent_key: &str) {
    match v {
        Value::Object(map) => {
            for (k, child) in map.iter_mut() {
                decorate(child, maps, k);
            }
            if !maps.contains(&parent_key) {
                map.insert(
                    EXTRA.into(),
                    json!({"nested": [1, {"deeper": true}], "note": "from a newer OpenCode"}),
                );
            }
        }
        Value::Array(items) => {
            for item in items {
                decorate(item, maps, parent_key);
            }
        }
        _ => {}
    }
}

/// Removes [`EXTRA`] everywhere (free-form maps such as `metadata` keep what they are given).
fn strip(v: &mut Value) {
    match v {
        Value::Object(map) => {
            map.remove(EXTRA);
            map.values_mut().for_each(strip);
        }
        Value::Array(items) => items.iter_mut().for_each(strip),
        _ => {}
    }
}

/// The path of the first place where `a` and `b` differ.
fn first_difference(a: &Value, b: &Value, path: String) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for key in x.keys().chain(y.keys()) {
                let here = format!("{path}/{key}");
                match (x.get(key), y.get(key)) {
                    (Some(p), Some(q)) => {
                        if let Some(d) = first_difference(p, q, here) {
                            return Some(d);
                        }
                    }
                    (p, q) => return Some(format!("{here}: {p:?} vs {q:?}")),
                }
            }
            None
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (p, q))| first_difference(p, q, format!("{path}/{i}"))),
        _ => (a != b).then(|| format!("{path}: {a} vs {b}")),
    }
}

fn fixture_json(name: &str) -> Value {
    let text = std::fs::read_to_string(fixture_dir().join(name)).expect("fixture");
    serde_json::from_str(&text).expect("fixture is JSON")
}

/// Decodes `v` as `T` and re-encodes it (with [`EXTRA`] stripped), naming the path on failure.
fn roundtrip<T: serde::de::DeserializeOwned + serde::Serialize>(name: &str, v: &Value) -> Value {
    let decoded: T = serde_path_to_error::deserialize(v.clone())
        .unwrap_or_else(|e| panic!("{name} does not decode at {}: {e}", e.path()));
    let mut out = serde_json::to_value(decoded).expect("re-encode");
    strip(&mut out);
    out
}

#[test]
fn unknown_fields_and_types_decode_as_before() {
    use opencode_mcp::opencode::client::types;
    use opencode_mcp::opencode::session_activity_from_json;
    use opencode_mcp::tasks::lifecycle::turn::from_messages_json as turn_from_messages_json;

    // Responses decoded by the generated types: the same after extra fields at every level.
    macro_rules! same {
        ($ty:ty, $file:expr, $maps:expr) => {{
            let original = fixture_json($file);
            let mut decorated = original.clone();
            decorate(&mut decorated, $maps, "");
            assert_ne!(original, decorated);
            let before = roundtrip::<$ty>($file, &original);
            let after = roundtrip::<$ty>(&format!("{} with extra fields", $file), &decorated);
            if let Some(at) = first_difference(&before, &after, String::new()) {
                panic!(
                    "{}: decodes differently with extra fields, first at {at}",
                    $file
                );
            }
        }};
    }
    same!(Vec<types::Agent>, "agents.json", &[]);
    same!(
        types::ConfigProvidersResponse,
        "config_providers.json",
        &["default", "models", "headers", "variants"]
    );
    same!(types::Session, "session.json", &[]);
    same!(types::Session, "session_after_turn.json", &[]);
    same!(Vec<types::PermissionRequest>, "permission_list.json", &[]);
    for file in [
        "messages_text.json",
        "messages_tool.json",
        "messages_error.json",
        "messages_abort.json",
    ] {
        same!(Vec<types::SessionMessagesResponseItem>, file, &[]);
    }

    // The turn derived from the messages: the same with extra fields, an unknown part type and
    // an unknown message role added.
    for file in [
        "messages_text.json",
        "messages_tool.json",
        "messages_error.json",
        "messages_abort.json",
    ] {
        let original = fixture_json(file);
        let mut decorated = original.clone();
        decorate(&mut decorated, &[], "");
        let items = decorated.as_array_mut().expect("messages");
        for item in items.iter_mut() {
            let info = item["info"].clone();
            item["parts"].as_array_mut().expect("parts").push(json!({
                "id": "prt_zzz_future",
                "sessionID": info["sessionID"],
                "messageID": info["id"],
                "type": "hologram",
                "text": "not a text part",
                "intensity": 3
            }));
        }
        let session = items[0]["info"]["sessionID"].clone();
        items.push(json!({
            "info": {"id": "msg_zzz_future", "sessionID": session, "role": "narrator",
                     "time": {"created": 1}},
            "parts": []
        }));
        let users: Vec<String> = original
            .as_array()
            .expect("messages")
            .iter()
            .filter(|m| m["info"]["role"] == "user")
            .map(|m| m["info"]["id"].as_str().expect("id").to_string())
            .collect();
        assert!(!users.is_empty());
        for user in users {
            let before = turn_from_messages_json(&original.to_string(), &user).expect("decodes");
            let mut after =
                turn_from_messages_json(&decorated.to_string(), &user).expect("decodes too");
            // The message of an unknown kind still counts as the session's newest id (our next
            // message id must sort above it); everything else is as before.
            assert_eq!(after.newest_message_id.as_deref(), Some("msg_zzz_future"));
            after.newest_message_id = before.newest_message_id.clone();
            assert_eq!(before, after, "{file}, turn of {user}");
            assert!(before.user_message_seen);
        }
    }

    // `GET /session/status`: extra fields, and a status type this version does not know.
    for file in ["session_status_busy.json", "session_status_retry.json"] {
        let original = fixture_json(file);
        let mut decorated = original.clone();
        decorate(&mut decorated, &[""], "");
        assert_eq!(
            session_activity_from_json(&original),
            session_activity_from_json(&decorated),
            "{file}"
        );
    }
    let future =
        json!({"ses_a": {"type": "compacting", "progress": 0.5}, "ses_b": {"type": "busy"}});
    let activity = session_activity_from_json(&future).expect("an unknown status decodes");
    assert_eq!(activity.len(), 2);
    assert_eq!(
        activity.get("ses_a"),
        Some(&opencode_mcp::opencode::SessionActivity::Busy),
        "an unknown status is some kind of work, never idle"
    );

    // Events: extra fields decode to the same event; unknown event types are skipped; a part of
    // an unknown type still reaches the tracker as a part update.
    let mut seen_kinds = BTreeSet::new();
    for line in recorded_event_lines() {
        let original: Value = serde_json::from_str(&line).expect("json");
        let mut decorated = original.clone();
        // `metadata` is free-form and passed on as is: a new key there is data, not a field.
        decorate(&mut decorated, &["metadata"], "");
        let before = decode_event(&line);
        assert_eq!(before, decode_event(&decorated.to_string()), "{line}");
        if before != Event::Other {
            seen_kinds.insert(original["type"].as_str().unwrap_or("").to_string());
        }
        let mut renamed = original.clone();
        renamed["type"] = json!(format!("{}.v2", original["type"].as_str().unwrap_or("x")));
        assert_eq!(
            decode_event(&renamed.to_string()),
            Event::Other,
            "{renamed}"
        );
        if original["type"] == "message.part.updated" {
            let mut part = original.clone();
            part["properties"]["part"]["type"] = json!("hologram");
            match decode_event(&part.to_string()) {
                Event::PartUpdated { part, .. } => {
                    assert_eq!(part, opencode_mcp::opencode::events::PartEvent::Other)
                }
                other => panic!("an unknown part type must still be a part update: {other:?}"),
            }
        }
    }
    for kind in [
        "session.status",
        "session.idle",
        "session.error",
        "message.updated",
        "message.part.updated",
        "message.part.delta",
        "permission.asked",
        "permission.replied",
    ] {
        assert!(
            seen_kinds.contains(kind),
            "{kind} not in the fixtures: {seen_kinds:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Drill: a repository's own delegation.yaml cannot choose what runs or where it connects.

/// A cloned repository's `./delegation.yaml` names a script as `opencode.command` and a
/// listener of ours as `opencode.url`. `opencode_start_server` must neither execute the script
/// (it would leave a marker file) nor connect to the listener, and the gateway must say on
/// stderr which file and keys it did not apply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repository_config_cannot_choose_what_runs_or_where_it_connects() {
    use std::os::unix::fs::PermissionsExt;
    let sandbox = Sandbox::new().expect("sandbox");
    let marker = sandbox.cwd().join("executed.marker");
    let script = sandbox.cwd().join("evil.sh");
    std::fs::write(
        &script,
        format!("#!/bin/sh\ntouch '{}'\nsleep 30\n", marker.display()),
    )
    .expect("script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().expect("addr").port();
    sandbox
        .write_repo_config(&format!(
            "opencode:\n  command: {}\n  url: http://127.0.0.1:{port}\n",
            script.display()
        ))
        .expect("repo config");

    // The user's `opencode` is the one on their PATH (the default `opencode.command`).
    let bin = sandbox.home().join("bin");
    std::fs::create_dir_all(&bin).expect("bin dir");
    std::os::unix::fs::symlink(opencode_bin(), bin.join("opencode")).expect("symlink");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let client = sandbox
        .launch()
        .env("PATH", path)
        .connect()
        .await
        .expect("the gateway starts");
    let r = client
        .call(
            "opencode_start_server",
            json!({ "directory": sandbox.cwd().display().to_string() }),
        )
        .await
        .expect("call");
    // The user's own `opencode` ran, as a managed server.
    assert!(!r.is_error, "{}\n{}", r.text, client.stderr());
    assert_eq!(r.structured["managed"], true, "{}", r.text);
    assert!(!marker.exists(), "the repository's command was executed");
    assert!(
        matches!(listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the gateway connected to the repository's url"
    );
    let stderr = client.stderr();
    let file = sandbox.cwd().join("delegation.yaml").display().to_string();
    for fragment in [&file, "`opencode.command`", "`opencode.url`", "not applied"] {
        assert!(
            stderr.contains(fragment),
            "stderr lacks {fragment:?}:\n{stderr}"
        );
    }
    client.close().await.expect("close");
}

// ---------------------------------------------------------------------------------------------
// Drill: a signal ends the gateway promptly even when stdin is a socket that stays open.

/// Claude Code gives its servers sockets, not pipes, for stdio, and after SIGINT/SIGTERM it waits
/// about half a second before escalating to SIGKILL. The gateway must exit on the signal alone,
/// without waiting for stdin to close.
#[test]
fn a_signal_ends_the_gateway_even_with_a_socket_for_stdin() {
    use std::io::{BufRead, BufReader};
    use std::os::unix::net::UnixStream;
    let sandbox = Sandbox::new().expect("sandbox");
    let (ours, theirs) = UnixStream::pair().expect("socketpair");
    let stdin = theirs.try_clone().expect("clone");
    let launch = sandbox
        .launch()
        .env("OPENCODE_MCP_OPENCODE__COMMAND", opencode_bin());
    let mut cmd = launch.command().into_std();
    let mut child = cmd
        .stdin(Stdio::from(std::os::fd::OwnedFd::from(stdin)))
        .stdout(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the gateway");
    // Initialize, so the session is really being served.
    let mut writer = ours.try_clone().expect("clone");
    writeln!(
        writer,
        r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":"2025-06-18","capabilities":{{}},"clientInfo":{{"name":"socket-host","version":"1"}}}}}}"#
    )
    .expect("send initialize");
    ours.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut line = String::new();
    BufReader::new(&ours)
        .read_line(&mut line)
        .expect("the initialize reply");
    assert!(line.contains("\"id\":1"), "{line}");
    writeln!(
        writer,
        r#"{{"jsonrpc":"2.0","method":"notifications/initialized"}}"#
    )
    .expect("initialized");
    // A managed OpenCode runs, as it would in a real session.
    writeln!(
        writer,
        r#"{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":"opencode_start_server","arguments":{{}}}}}}"#
    )
    .expect("start_server");
    ours.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let mut reader = BufReader::new(&ours);
    let started = loop {
        let mut reply = String::new();
        reader.read_line(&mut reply).expect("a reply");
        if reply.contains("\"id\":2") {
            break reply;
        }
    };
    assert!(!started.contains("\"isError\":true"), "{started}");
    let opencode: u32 = serde_json::from_str::<Value>(&started)
        .ok()
        .and_then(|v| v["result"]["structuredContent"]["pid"].as_u64())
        .and_then(|p| u32::try_from(p).ok())
        .unwrap_or_else(|| panic!("a managed server's pid: {started}"));

    let at = Instant::now();
    // SAFETY: kill(2) on the gateway this test spawned.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
    }
    let exited = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break Some(status);
        }
        if at.elapsed() > Duration::from_secs(3) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let took = at.elapsed();
    if exited.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    // Our end of the socket is still open: only the signal can have ended it.
    drop(ours);
    assert!(
        exited.is_some(),
        "the gateway was still running {took:?} after SIGTERM with stdin open"
    );
    report(
        "signal with socket stdin",
        "SIGTERM -> gateway exited",
        took,
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let pids = BTreeSet::from([opencode]);
    if let Err(left) = rt.block_on(procs::wait_all_gone(&pids, Duration::from_secs(10))) {
        panic!("left behind: {}", procs::describe(&left));
    }
}

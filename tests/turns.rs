//! Turns that are more than "one user message, then replies to it": auto-compaction mid-turn,
//! subagents (the `task` tool) whose permission asks live on a child session, racing follow-ups,
//! a session deleted behind the gateway's back, and attached servers with several directories.
//!
//! Everything runs against the real, pinned OpenCode, through the real gateway binary over MCP
//! stdio, with the scripted fake LLM (`[[usage:<n>]]` and `[[task:...]]` are the markers these
//! tests need). The recorder at the end (`record_turn_fixtures`, a tool, not a test) saves the
//! message and event fixtures of a compaction turn and a subagent turn.

mod support;

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use support::fake_llm::{
    echo_reply, parse_markers, task_description, usage_prompt_tokens, RecordedRequest, Reply,
};
use support::isolation::FAKE_SMALL_MODEL;
use support::opencode_server::encode;
use support::opencode_server::EventStream;
use support::rig::{Rig, TASK_TIMEOUT_MS};
use support::{FakeLlm, Marker, OpenCodeEnv, OpenCodeServer, FAKE_PROVIDER};

/// Upper bound for one scripted turn driven directly.
const TURN: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// Helpers for driving OpenCode directly.

/// `GET /global/event`, read as the payloads of its `{directory, payload}` frames.
struct GlobalEvents {
    stream: EventStream,
    seen: Vec<Value>,
}

fn payload(event: Value) -> Value {
    event.get("payload").cloned().unwrap_or(event)
}

impl GlobalEvents {
    async fn subscribe(server: &OpenCodeServer) -> Self {
        GlobalEvents {
            stream: server.global_events().await,
            seen: Vec::new(),
        }
    }

    /// Consumes events until `pred` holds for one (given its payload); returns that payload.
    async fn wait_for(&mut self, timeout: Duration, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let Some(event) = self.stream.next(left).await else {
                panic!(
                    "no matching event after {timeout:?}; seen: {:?}",
                    self.seen
                        .iter()
                        .map(|e| e["type"].as_str().unwrap_or("?"))
                        .collect::<Vec<_>>()
                );
            };
            let payload = payload(event);
            self.seen.push(payload.clone());
            if pred(&payload) {
                return payload;
            }
        }
    }

    /// Drains what has arrived within `quiet` of silence.
    async fn drain(&mut self, quiet: Duration) {
        while let Some(event) = self.stream.next(quiet).await {
            self.seen.push(payload(event));
        }
    }
}

/// One line per event: its type and the ids and flags that tell a turn's structure.
fn event_line(e: &Value) -> Option<String> {
    let kind = e["type"].as_str().unwrap_or("?");
    if matches!(
        kind,
        "server.connected" | "server.heartbeat" | "message.part.delta" | "sync"
    ) || kind.starts_with("plugin.")
    {
        return None;
    }
    let p = &e["properties"];
    let info = &p["info"];
    let part = &p["part"];
    let mut fields: Vec<String> = Vec::new();
    let mut add = |name: &str, v: &Value| {
        if !v.is_null() {
            fields.push(format!(
                "{name}={}",
                v.as_str().map(str::to_owned).unwrap_or(v.to_string())
            ));
        }
    };
    add(
        "sessionID",
        if p["sessionID"].is_null() {
            if info["sessionID"].is_null() {
                &part["sessionID"]
            } else {
                &info["sessionID"]
            }
        } else {
            &p["sessionID"]
        },
    );
    if kind.starts_with("session.") && !info["id"].is_null() {
        add("session", &info["id"]);
        add("parentID", &info["parentID"]);
        add("title", &info["title"]);
    }
    if kind.starts_with("message.") && !kind.starts_with("message.part") {
        add("messageID", &info["id"]);
        add("role", &info["role"]);
        add("parentID", &info["parentID"]);
        add("agent", &info["agent"]);
        add("mode", &info["mode"]);
        add("summary", &info["summary"]);
        add("finish", &info["finish"]);
        add("completed", &info["time"]["completed"]);
        add("error", &info["error"]["name"]);
    }
    if kind.starts_with("message.part") {
        add("messageID", &part["messageID"]);
        add("part", &part["type"]);
        add("tool", &part["tool"]);
        add("state", &part["state"]["status"]);
        add("auto", &part["auto"]);
        add("synthetic", &part["synthetic"]);
    }
    if kind == "session.status" {
        add("status", &p["status"]["type"]);
    }
    if kind.starts_with("permission.") {
        add("permission", &p["permission"]);
        add("id", &p["id"]);
        add("reply", &p["reply"]);
    }
    if kind == "session.error" {
        add("error", &p["error"]["name"]);
        let message = p["error"]["data"]["message"].as_str().unwrap_or("");
        add(
            "message",
            &json!(message.chars().take(60).collect::<String>()),
        );
    }
    Some(format!("{kind} {}", fields.join(" ")))
}

struct Direct {
    // Field order is drop order.
    server: OpenCodeServer,
    env: OpenCodeEnv,
    fake: FakeLlm,
}

impl Direct {
    async fn start(env: OpenCodeEnv) -> Self {
        let fake = FakeLlm::start();
        let server = OpenCodeServer::start(&env, &fake.url()).await;
        Direct { server, env, fake }
    }

    fn q(&self) -> String {
        format!(
            "directory={}",
            encode(&self.env.work_dir().display().to_string())
        )
    }

    async fn create_session(&self, title: &str) -> String {
        let (status, s) = self
            .server
            .post_json(
                &format!("/session?{}", self.q()),
                &json!({ "title": title }),
            )
            .await;
        assert!(status.is_success(), "{status} {s}");
        s["id"].as_str().expect("id").to_owned()
    }

    async fn prompt(&self, session: &str, model: &str, text: &str) {
        let (status, body) = self
            .server
            .post_json(
                &format!("/session/{session}/prompt_async?{}", self.q()),
                &json!({
                    "parts": [{ "type": "text", "text": text }],
                    "model": { "providerID": FAKE_PROVIDER, "modelID": model }
                }),
            )
            .await;
        assert_eq!(status, 204, "{body}");
    }

    /// One ordinary turn, waited out: OpenCode's first turn loads its plugins, and recordings
    /// should show only the turn they are about.
    async fn warm_up(&self, model: &str) {
        let warm = self.create_session("warm-up").await;
        let mut events = GlobalEvents::subscribe(&self.server).await;
        self.prompt(&warm, model, "warm up").await;
        events
            .wait_for(TURN, |e| {
                e["type"] == "session.idle" && e["properties"]["sessionID"] == warm
            })
            .await;
    }

    async fn get(&self, path: &str) -> Value {
        let sep = if path.contains('?') { '&' } else { '?' };
        let (status, v) = self
            .server
            .get_json(&format!("{path}{sep}{}", self.q()))
            .await;
        assert!(status.is_success(), "GET {path}: {status} {v}");
        v
    }
}

fn redact_save(dir: &Path, env: &OpenCodeEnv, name: &str, text: &str) {
    std::fs::write(dir.join(name), env.redact_paths(text))
        .unwrap_or_else(|e| panic!("write {name}: {e}"));
    eprintln!("recorded {name}");
}

fn save_json(dir: &Path, env: &OpenCodeEnv, name: &str, v: &Value) {
    redact_save(
        dir,
        env,
        name,
        &(serde_json::to_string_pretty(v).expect("json") + "\n"),
    );
}

/// Messages as `id role parentID agent/mode summary finish text...` lines (for the report).
fn message_lines(messages: &Value) -> Vec<String> {
    messages
        .as_array()
        .expect("array")
        .iter()
        .map(|m| {
            let i = &m["info"];
            let parts: Vec<String> = m["parts"]
                .as_array()
                .map(|ps| {
                    ps.iter()
                        .map(|p| {
                            let t = p["type"].as_str().unwrap_or("?");
                            match t {
                                "text" => format!(
                                    "text({:.60}{})",
                                    p["text"].as_str().unwrap_or(""),
                                    if p["synthetic"] == true {
                                        ",synthetic"
                                    } else {
                                        ""
                                    }
                                ),
                                "tool" => format!(
                                    "tool({},{})",
                                    p["tool"].as_str().unwrap_or(""),
                                    p["state"]["status"].as_str().unwrap_or("")
                                ),
                                "compaction" => format!("compaction(auto={})", p["auto"]),
                                _ => t.to_owned(),
                            }
                        })
                        .collect()
                })
                .unwrap_or_default();
            format!(
                "{} {} parent={} agent={} mode={} summary={} finish={} completed={} parts={:?}",
                i["id"].as_str().unwrap_or("?"),
                i["role"].as_str().unwrap_or("?"),
                i["parentID"].as_str().unwrap_or("-"),
                i["agent"].as_str().unwrap_or("-"),
                i["mode"].as_str().unwrap_or("-"),
                i["summary"],
                i["finish"].as_str().unwrap_or("-"),
                !i["time"]["completed"].is_null(),
                parts
            )
        })
        .collect()
}

#[test]
fn usage_and_task_markers_parse() {
    assert_eq!(
        parse_markers("[[usage:5000]] [[bash:echo hi]]"),
        vec![
            Marker::Usage {
                prompt_tokens: 5000
            },
            Marker::Bash("echo hi".into())
        ]
    );
    assert_eq!(
        parse_markers("delegate [[task:general:{{bash:touch child.txt}} then {{slow:10}}]] ok"),
        vec![Marker::Task {
            subagent_type: "general".into(),
            prompt: "[[bash:touch child.txt]] then [[slow:10]]".into()
        }]
    );
    // The child prompt's markers are the child's, not the parent's.
    assert_eq!(
        parse_markers("[[task:general:{{bash:touch child.txt}}]]")
            .into_iter()
            .filter(|m| matches!(m, Marker::Bash(_)))
            .count(),
        0
    );
    assert_eq!(
        parse_markers("[[usage:lots]] [[task:general]] [[task::x]]"),
        vec![]
    );
    assert_eq!(usage_prompt_tokens(&parse_markers("[[usage:7]]")), 7);
    assert_eq!(usage_prompt_tokens(&parse_markers("plain")), 100);
    assert_eq!(
        task_description("[[bash:touch a]] and more words here"),
        "[[bash:touch a]] and more words"
    );
}

/// Not a test: drives OpenCode directly through a compaction turn and a subagent turn, prints
/// what it sees, and (with `RECORD_FIXTURES=1`) saves the fixtures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "recording tool: RECORD_FIXTURES=1 cargo test --test turns -- --ignored record_turn_fixtures --nocapture"]
async fn record_turn_fixtures() {
    let record = std::env::var("RECORD_FIXTURES").as_deref() == Ok("1");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/opencode");

    // Compaction.
    let d = Direct::start(OpenCodeEnv::new().with_small_model()).await;
    d.warm_up(FAKE_SMALL_MODEL).await;
    let mut events = GlobalEvents::subscribe(&d.server).await;
    let s = d.create_session("fixture: compaction").await;
    d.prompt(
        &s,
        FAKE_SMALL_MODEL,
        "compact me [[usage:5000]] [[bash:echo hi]]",
    )
    .await;
    events
        .wait_for(TURN, |e| {
            e["type"] == "session.idle" && e["properties"]["sessionID"] == s
        })
        .await;
    events.drain(Duration::from_millis(1500)).await;
    let messages = d.get(&format!("/session/{s}/message")).await;
    for l in message_lines(&messages) {
        eprintln!("MSG {l}");
    }
    let lines: Vec<String> = events.seen.iter().filter_map(event_line).collect();
    for l in &lines {
        eprintln!("EV {l}");
    }
    for r in d.fake.chat_requests() {
        eprintln!("REQ {}", r.summary());
    }
    // Paging backwards.
    let all: Vec<String> = messages
        .as_array()
        .expect("array")
        .iter()
        .map(|m| m["info"]["id"].as_str().unwrap_or("").to_owned())
        .collect();
    let mut page_path = format!("/session/{s}/message?limit=2&{}", d.q());
    for _ in 0..5 {
        let r = d.server.get(&page_path).send().await.expect("page");
        let status = r.status();
        let headers: Vec<String> = r
            .headers()
            .iter()
            .filter(|(n, _)| {
                let n = n.as_str();
                n == "link" || n == "x-next-cursor"
            })
            .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap_or("?")))
            .collect();
        let cursor = r
            .headers()
            .get("x-next-cursor")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let page: Value = r.json().await.unwrap_or(Value::Null);
        let ids: Vec<&str> = page
            .as_array()
            .map(|a| a.iter().filter_map(|m| m["info"]["id"].as_str()).collect())
            .unwrap_or_default();
        eprintln!("PAGE {page_path} -> {status} {ids:?} {headers:?}");
        let Some(cursor) = cursor else { break };
        page_path = format!(
            "/session/{s}/message?limit=2&before={}&{}",
            encode(&cursor),
            d.q()
        );
    }
    eprintln!("ALL {all:?}");
    if record {
        save_json(&dir, &d.env, "messages_compaction.json", &messages);
        redact_save(
            &dir,
            &d.env,
            "events_compaction.txt",
            &(lines.join("\n") + "\n"),
        );
    }
    drop(events);
    drop(d);

    // Subagent, with bash asked.
    let d =
        Direct::start(OpenCodeEnv::new().with_config(json!({ "permission": { "bash": "ask" } })))
            .await;
    d.warm_up(support::FAKE_MODEL).await;
    let mut events = GlobalEvents::subscribe(&d.server).await;
    let s = d.create_session("fixture: subagent").await;
    d.prompt(
        &s,
        support::FAKE_MODEL,
        "delegate it [[task:general:{{bash:touch child.txt}} child work]]",
    )
    .await;
    let asked = events
        .wait_for(TURN, |e| e["type"] == "permission.asked")
        .await;
    eprintln!("ASKED {asked}");
    let child = asked["properties"]["sessionID"]
        .as_str()
        .expect("sessionID")
        .to_owned();
    let pending = d.get("/permission").await;
    eprintln!("PERMISSION LIST {pending}");
    let parent_during = d.get(&format!("/session/{s}/message")).await;
    for l in message_lines(&parent_during) {
        eprintln!("PARENT-DURING {l}");
    }
    let status_during = d.get("/session/status").await;
    eprintln!("STATUS DURING {status_during}");
    let child_session = d.get(&format!("/session/{child}")).await;
    eprintln!("CHILD SESSION {child_session}");
    let permission_id = asked["properties"]["id"].as_str().expect("id");
    let (status, _) = d
        .server
        .post_json(
            &format!("/permission/{permission_id}/reply?{}", d.q()),
            &json!({ "reply": "once" }),
        )
        .await;
    assert!(status.is_success());
    events
        .wait_for(TURN, |e| {
            e["type"] == "session.idle" && e["properties"]["sessionID"] == s
        })
        .await;
    events.drain(Duration::from_millis(1500)).await;
    let parent = d.get(&format!("/session/{s}/message")).await;
    let child_messages = d.get(&format!("/session/{child}/message")).await;
    for l in message_lines(&parent) {
        eprintln!("PARENT {l}");
    }
    for l in message_lines(&child_messages) {
        eprintln!("CHILD {l}");
    }
    let lines: Vec<String> = events.seen.iter().filter_map(event_line).collect();
    for l in &lines {
        eprintln!("EV {l}");
    }
    for r in d.fake.chat_requests() {
        eprintln!("REQ {}", r.summary());
    }
    let task_tool = d
        .fake
        .chat_requests()
        .iter()
        .find_map(|r| {
            r.body["tools"].as_array().and_then(|ts| {
                ts.iter()
                    .find(|t| t.pointer("/function/name") == Some(&json!("task")))
                    .cloned()
            })
        })
        .unwrap_or(Value::Null);
    eprintln!(
        "TASK TOOL PARAMS {}",
        task_tool
            .pointer("/function/parameters")
            .unwrap_or(&Value::Null)
    );
    eprintln!(
        "child.txt exists: {}",
        d.env.work_dir().join("child.txt").exists()
    );

    // DELETE during a slow turn.
    let mut events = GlobalEvents::subscribe(&d.server).await;
    let del = d.create_session("fixture: delete").await;
    d.prompt(&del, support::FAKE_MODEL, "slow [[slow:8000]]")
        .await;
    d.fake
        .wait_for_request(TURN, |r| r.session_id() == Some(del.as_str()))
        .await;
    let r = d
        .server
        .request(
            reqwest::Method::DELETE,
            &format!("/session/{del}?{}", d.q()),
        )
        .send()
        .await
        .expect("DELETE");
    eprintln!(
        "DELETE -> {} {}",
        r.status(),
        r.text().await.unwrap_or_default()
    );
    events.drain(Duration::from_millis(3000)).await;
    for e in &events.seen {
        if e["type"] != "message.part.delta" && e["type"] != "server.heartbeat" {
            let keys: Vec<&String> = e
                .as_object()
                .map(|o| o.keys().collect())
                .unwrap_or_default();
            eprintln!(
                "DEL-EV type={} keys={keys:?} props={}",
                e["type"],
                serde_json::to_string(&e["properties"])
                    .unwrap_or_default()
                    .chars()
                    .take(300)
                    .collect::<String>()
            );
        }
    }
    eprintln!("STREAM ENDS {:?}", d.fake.stream_ends());
    let delete_lines: Vec<String> = events.seen.iter().filter_map(event_line).collect();
    let status_after = d.get("/session/status").await;
    eprintln!("STATUS AFTER DELETE {status_after}");

    if record {
        save_json(&dir, &d.env, "messages_subagent_parent.json", &parent);
        save_json(
            &dir,
            &d.env,
            "messages_subagent_child.json",
            &child_messages,
        );
        save_json(&dir, &d.env, "session_subagent_child.json", &child_session);
        save_json(&dir, &d.env, "permission_list_subagent.json", &pending);
        redact_save(
            &dir,
            &d.env,
            "events_subagent.txt",
            &(lines.join("\n") + "\n"),
        );
        redact_save(
            &dir,
            &d.env,
            "events_delete.txt",
            &(delete_lines.join("\n") + "\n"),
        );
    }
}

// ---------------------------------------------------------------------------------------------
// End to end through the gateway.

/// What the gateway assembles from the event stream up to a turn's `session.idle` frame is the
/// turn a read of its messages over HTTP gives (text, tokens, cost, tools, steps, compactions):
/// the gateway answers a wait at that frame from the streamed view, without the read.
#[tokio::test]
async fn the_turn_streamed_up_to_its_idle_frame_is_the_turn_read_over_http() {
    let d = Direct::start(OpenCodeEnv::new().with_small_model()).await;
    d.warm_up(FAKE_SMALL_MODEL).await;
    for prompt in [
        "compact me [[usage:5000]] [[bash:echo hi]]",
        "two steps [[write:streamed.txt:written]]",
        "just text",
    ] {
        let mut events = GlobalEvents::subscribe(&d.server).await;
        let s = d.create_session(prompt).await;
        d.prompt(&s, FAKE_SMALL_MODEL, prompt).await;
        events
            .wait_for(TURN, |e| {
                e["type"] == "session.idle" && e["properties"]["sessionID"] == s
            })
            .await;
        let messages = d.get(&format!("/session/{s}/message")).await;
        let user = messages
            .as_array()
            .and_then(|m| m.iter().find(|m| m["info"]["role"] == "user"))
            .and_then(|m| m["info"]["id"].as_str())
            .expect("our user message")
            .to_owned();
        let read =
            opencode_mcp::tasks::lifecycle::turn::from_messages_json(&messages.to_string(), &user)
                .expect("the messages decode");
        let mut streamed = opencode_mcp::tasks::lifecycle::stream::StreamedTurn::default();
        for e in &events.seen {
            let event = opencode_mcp::opencode::events::decode_event(&e.to_string());
            if event.session_id() == Some(s.as_str()) {
                streamed.apply(&user, &event);
            }
        }
        let seen = streamed
            .derive(&user)
            .unwrap_or_else(|| panic!("{prompt}: the stream showed the whole turn"));
        assert!(read.finished && read.steps >= 1, "{prompt}: {read:?}");
        if prompt.starts_with("compact") {
            assert_eq!(read.compactions, 1, "{prompt}: {read:?}");
        }
        if prompt.starts_with("two steps") {
            assert_eq!(read.tools.len(), 1, "{prompt}: {read:?}");
        }
        assert_eq!(seen, read, "{prompt}");
    }
}

/// A task cancelled while OpenCode still sets up its first turn in a directory it has not
/// served before leaves that directory usable: the next task there completes. OpenCode 1.18.33
/// loads a directory's providers inside its first turn and caches that load's interruption, so
/// every later prompt there failed ("All fibers interrupted without error") until the instance
/// was disposed; the gateway's abort now waits for the turn's first reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_cancelled_at_once_leaves_its_directory_usable() {
    let rig = Rig::start(&[]).await;
    for round in 0..3 {
        let dir = rig.env.work_dir().join(format!("fresh-{round}"));
        support::git::init_repo(&dir, &[("README", "fresh\n")]);
        let dir = dir.display().to_string();
        let first = task_id(
            &rig.start_task_with(json!({ "prompt": "slow [[slow:20000]]", "directory": dir }))
                .await,
        );
        let cancelled = rig
            .ok("opencode_cancel_task", json!({ "task_id": first }))
            .await;
        assert_eq!(
            cancelled["status"], "cancelled",
            "round {round}: {cancelled}"
        );
        let prompt = format!("after the cancel, round {round}");
        let next = task_id(
            &rig.start_task_with(json!({ "prompt": prompt, "directory": dir }))
                .await,
        );
        let r = rig.finish(&next).await;
        assert_eq!(r["status"], "completed", "round {round}: {r}");
        assert_eq!(r["text"], echo_reply(&prompt), "round {round}: {r}");
    }
}

/// OpenCode keeps an instance for every directory it is asked about. A worktree task's
/// directory is its own, so once its turn is read the gateway disposes that instance (without
/// it a worker's OpenCode grew by one per worktree task it ever ran); a follow-up boots it again
/// and completes. A directory tasks share (`isolation: none`) keeps its instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worktree_tasks_instance_is_disposed_once_its_turn_is_read() {
    let env = OpenCodeEnv::new();
    let repo = env.work_dir();
    support::git::init_repo(&repo, &[("README", "shared\n")]);
    let (rig, opencode) = Rig::attached(env, &[]).await;
    let mut events = GlobalEvents::subscribe(&opencode).await;
    let disposed = |e: &Value, dir: &str| {
        e["type"] == "server.instance.disposed" && e["properties"]["directory"] == dir
    };

    let shared = task_id(&rig.start_task("in the shared directory").await);
    let r = rig.finish(&shared).await;
    assert_eq!(r["status"], "completed", "{r}");

    let own = task_id(
        &rig.start_task_with(json!({ "prompt": "in a worktree", "isolation": "worktree" }))
            .await,
    );
    let worktree = rig.worktree(&own).await.display().to_string();
    let r = rig.finish(&own).await;
    assert_eq!(r["status"], "completed", "{r}");
    events
        .wait_for(Duration::from_secs(60), |e| disposed(e, &worktree))
        .await;
    let repo = repo.display().to_string();
    assert!(
        !events.seen.iter().any(|e| disposed(e, &repo)),
        "the shared directory's instance is kept: {:?}",
        events.seen
    );

    let next = rig
        .ok(
            "opencode_continue_task",
            json!({ "task_id": own, "prompt": "once more" }),
        )
        .await;
    assert_eq!(next["task_id"], own.as_str(), "{next}");
    let r = rig.finish(&own).await;
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["text"], echo_reply("once more"), "{r}");
    events
        .wait_for(Duration::from_secs(60), |e| disposed(e, &worktree))
        .await;
}

/// OpenCode lists a turn's changed files from snapshots it takes only in a git repository.
/// Outside one, a task that wrote a file must not read as "changed nothing": its result has no
/// list and says why, naming what the editing tool wrote. A task in a repository beside it, on
/// the same server, still gets its list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outside_git_a_turns_changed_files_are_unknown_not_empty() {
    let rig = Rig::start(&[]).await;
    let loose_dir = rig.env.work_dir();
    assert!(
        !loose_dir.join(".git").exists(),
        "the rig's directory is not a repository"
    );
    let repo = loose_dir.join("repo");
    support::git::init_repo(&repo, &[("README", "tracked\n")]);
    let loose = task_id(&rig.start_task("[[write:loose.txt:outside git]]").await);
    let tracked = task_id(
        &rig.start_task_with(json!({
            "prompt": "[[write:tracked.txt:inside git]]",
            "directory": repo.display().to_string(),
        }))
        .await,
    );

    let r = rig.finish(&loose).await;
    assert_eq!(r["status"], "completed", "{r}");
    assert!(loose_dir.join("loose.txt").is_file(), "the tool wrote: {r}");
    assert!(
        r.get("files_changed").is_none(),
        "no list, not an empty one: {r}"
    );
    let why = r["files_error"].as_str().unwrap_or_default();
    assert!(
        why.contains("git repository") && why.contains("loose.txt"),
        "says why and what the tool wrote: {r}"
    );

    let r = rig.finish(&tracked).await;
    assert_eq!(r["status"], "completed", "{r}");
    assert!(r.get("files_error").is_none(), "{r}");
    assert!(
        r["files_changed"].to_string().contains("tracked.txt"),
        "{r}"
    );
}

/// OpenCode writes a turn's list of changed files after the turn, late on a busy server, so an
/// empty list right after a turn whose tools edited files is not believed at once. A file git
/// ignores is such a turn whose list stays empty: a result asked for right away says the list
/// is not there yet (never "changed nothing" too early), and once the background read has
/// waited long enough the empty list stands, without an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_list_after_an_edit_is_believed_only_after_waiting() {
    let rig = Rig::start(&[]).await;
    let repo = rig.env.work_dir().join("ignoring");
    support::git::init_repo(&repo, &[("README", "r\n"), (".gitignore", "ignored/\n")]);
    let task = task_id(
        &rig.start_task_with(json!({
            "prompt": "[[write:ignored/quiet.txt:not listed]]",
            "directory": repo.display().to_string(),
        }))
        .await,
    );
    let r = rig.finish(&task).await;
    assert_eq!(r["status"], "completed", "{r}");
    assert!(
        repo.join("ignored/quiet.txt").is_file(),
        "the tool wrote: {r}"
    );
    assert!(r.get("files_changed").is_none(), "{r}");
    assert!(
        r["files_error"]
            .as_str()
            .is_some_and(|why| why.contains("not listed this turn's changed files yet")),
        "not yet known, not empty: {r}"
    );
    // Each call while the list is unknown reads it again itself (a few seconds).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let last = loop {
        let r = rig
            .ok("opencode_get_task_result", json!({ "task_id": task }))
            .await;
        if r.get("files_error").is_none() {
            break r;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the list never settles: {r}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(
        last.get("files_changed").is_none(),
        "nothing git tracks changed: {last}"
    );
}

fn task_id(v: &Value) -> String {
    v["task_id"].as_str().expect("task_id").to_owned()
}

fn session_of(v: &Value) -> String {
    v["session_id"].as_str().expect("session_id").to_owned()
}

/// `?directory=<dir>` for direct OpenCode calls.
fn dir_q(dir: &Path) -> String {
    format!("directory={}", encode(&dir.display().to_string()))
}

/// Polls an external state (OpenCode over HTTP, the file system) every 100 ms until `check`
/// gives `Some`, for at most `within`. There is no event to await for these from the test.
async fn poll<T, F, Fut>(within: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(found) = check().await {
            return Some(found);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `GET /permission` on the attached OpenCode.
async fn pending_permissions(opencode: &OpenCodeServer, dir: &Path) -> Vec<Value> {
    let (status, list) = opencode
        .get_json(&format!("/permission?{}", dir_q(dir)))
        .await;
    assert!(status.is_success(), "GET /permission: {status} {list}");
    list.as_array().cloned().unwrap_or_default()
}

/// `GET /session/status` on the attached OpenCode: the ids of the non-idle sessions.
async fn busy_sessions(opencode: &OpenCodeServer, dir: &Path) -> Vec<String> {
    let (status, map) = opencode
        .get_json(&format!("/session/status?{}", dir_q(dir)))
        .await;
    assert!(status.is_success(), "GET /session/status: {status} {map}");
    map.as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

/// Watches the task through the gateway's own wait (each call returns after `step_ms` with a
/// snapshot) until `pred` holds for its snapshot or `within` passes; returns the last snapshot
/// and whether `pred` held.
async fn watch_task(
    rig: &Rig,
    task: &str,
    within: Duration,
    pred: impl Fn(&Value) -> bool,
) -> (Value, bool) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let w = rig.wait(&[task], "any", 250).await;
        let snapshot = w["tasks"][0].clone();
        if pred(&snapshot) {
            return (snapshot, true);
        }
        if tokio::time::Instant::now() >= deadline {
            return (snapshot, false);
        }
    }
}

/// The compaction agent's request: no tools offered, and not the title generator.
fn is_compaction_request(r: &RecordedRequest) -> bool {
    r.is_chat() && r.tools.is_empty() && !r.is_title_request()
}

/// **Auto-compaction mid-turn is part of the turn, not its end.**
///
/// On the small-context model (`fake/fake-small`, context 2000, output 500), the first step is a
/// bash call whose usage reports 5000 prompt tokens (`[[usage:5000]]`), over OpenCode's threshold
/// `context - min(output, 32000)` = 1500. OpenCode then writes a user message with a `compaction`
/// part, asks the hidden `compaction` agent (a request without tools) for a `summary: true`
/// assistant message, adds a synthetic "Continue if you have next steps..." user message and asks
/// the model again; the final answer is parented to that synthetic message, not to our prompt.
///
/// Proves: the gateway reports the task `completed` (not `failed`/TurnStopped when the assistant
/// message parented to our prompt ends with `tool-calls`), and its result text is the final
/// answer (what the fake last answered in the main session), neither the compaction summary nor
/// the tool step. The fake's recorded requests show that compaction really happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_that_auto_compacts_completes_with_the_final_answer() {
    let rig = Rig::start_in(FakeLlm::start(), OpenCodeEnv::new().with_small_model(), &[]).await;
    let prompt = "compact me [[usage:5000]] [[bash:echo compaction-step]]";
    let start = rig
        .start_task_with(json!({
            "prompt": prompt,
            "model": format!("{FAKE_PROVIDER}/{FAKE_SMALL_MODEL}"),
            "title": "compaction"
        }))
        .await;
    let task = task_id(&start);
    let session = session_of(&start);
    let w = rig.wait(&[&task], "all", TASK_TIMEOUT_MS).await;
    assert_eq!(w["done"], true, "{w}");
    // The snapshot a wait returns at completion is whole: who answered, with which model.
    assert_eq!(w["tasks"][0]["agent"], "build", "{w}");
    assert_eq!(w["tasks"][0]["model"], "fake/fake-small", "{w}");

    // Compaction did happen: the tool step, a request from the compaction agent, then the model
    // asked again after the synthetic continue message.
    let requests = rig.requests_for(&session);
    let summary: Vec<String> = requests.iter().map(|r| r.summary()).collect();
    let tool_step = requests
        .iter()
        .position(|r| matches!(r.reply, Reply::ToolCall { .. }))
        .unwrap_or_else(|| panic!("no tool step: {summary:#?}"));
    let compaction = requests
        .iter()
        .position(is_compaction_request)
        .unwrap_or_else(|| panic!("OpenCode did not compact: {summary:#?}"));
    assert!(compaction > tool_step, "{summary:#?}");
    let last = requests.last().expect("requests");
    assert!(
        !is_compaction_request(last) && last.index > requests[compaction].index,
        "the model was asked again after the summary: {summary:#?}"
    );
    let Reply::Text {
        text: final_text, ..
    } = &last.reply
    else {
        panic!("the last answer is text: {summary:#?}");
    };
    let Reply::Text {
        text: summary_text, ..
    } = &requests[compaction].reply
    else {
        panic!("the summary is text: {summary:#?}");
    };

    let r = rig
        .ok(
            "opencode_get_task_result",
            json!({ "task_id": task , "detail": "full" }),
        )
        .await;
    assert_eq!(
        r["status"], "completed",
        "a compacted turn is still one turn that ends when the model stops: {r}"
    );
    assert_eq!(&r["text"], final_text.as_str(), "{r}");
    assert_ne!(&r["text"], summary_text.as_str(), "{r}");
    assert_ne!(r["text"], echo_reply(prompt), "{r}");
    // The summary step is counted, and labelled.
    assert_eq!(r["compactions"], 1, "{r}");
    let summary_input = r["compaction_tokens"]["input"].as_u64().unwrap_or(0);
    assert!(summary_input > 0, "{r}");
    assert!(
        r["tokens"]["input"].as_u64().unwrap_or(0) > summary_input,
        "{r}"
    );
    let st = rig.status(&task).await;
    assert_eq!(st["status"], "completed", "{st}");
}

/// The child's permission ask must be seen before answering it: waits (bounded) until the
/// attached OpenCode lists an ask and returns it.
async fn child_ask(opencode: &OpenCodeServer, dir: &Path) -> Value {
    poll(Duration::from_secs(60), || async {
        pending_permissions(opencode, dir).await.into_iter().next()
    })
    .await
    .expect("the child session asks for bash within 60 s")
}

/// A prompt whose model calls the `task` tool; the `general` subagent's child session then calls
/// bash, which the server's config (`bash: ask`) asks about.
const SUBAGENT_PROMPT: &str =
    "delegate it [[task:general:{{bash:touch from-child.txt}} child work]]";

fn subagent_env() -> OpenCodeEnv {
    // Only bash asks: with a blanket `ask` the `task` tool itself would ask on the parent first.
    OpenCodeEnv::new().with_config(json!({ "permission": { "bash": "ask" } }))
}

/// **A subagent's permission ask belongs to the task.**
///
/// The model calls the `task` tool; OpenCode runs the `general` agent in a child session
/// (`parentID` = the task's session), and the child's bash call raises `permission.asked` on the
/// CHILD's `sessionID` (`GET /permission` lists it there). Meanwhile the parent's `task` tool
/// part stays `running` and the parent session stays busy.
///
/// Proves: the gateway shows the parent task as `waiting_permission` with the ask (naming bash
/// and the command), `opencode_reply_permission(task_id, "once")` answers the child's ask, and
/// the task then completes with the parent's final answer while the file lands on disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subagents_permission_ask_is_shown_on_the_task_and_answered() {
    let SubagentAsking {
        rig,
        opencode,
        dir,
        task,
        session,
        ask,
    } = SubagentAsking::start().await;
    assert_ne!(
        ask["sessionID"], session,
        "the ask is on the child session: {ask}"
    );
    assert_eq!(ask["permission"], "bash", "{ask}");

    let (snapshot, asked) = watch_task(&rig, &task, Duration::from_secs(10), |t| {
        t["status"] == "waiting_permission"
    })
    .await;
    assert!(
        asked,
        "the child's ask {ask} is pending on OpenCode, but the task shows {snapshot}"
    );
    assert_eq!(
        snapshot["permissions"][0]["permission"], "bash",
        "{snapshot}"
    );
    assert!(
        snapshot["permissions"][0]["patterns"]
            .to_string()
            .contains("touch from-child.txt"),
        "{snapshot}"
    );

    let replied = rig
        .ok(
            "opencode_reply_permission",
            json!({ "task_id": task, "reply": "once" }),
        )
        .await;
    assert_eq!(replied["status"], "running", "{replied}");
    let r = rig.finish(&task).await;
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["text"], echo_reply(SUBAGENT_PROMPT), "{r}");
    assert!(dir.join("from-child.txt").exists(), "the child's bash ran");
    assert!(pending_permissions(&opencode, &dir).await.is_empty());
}

/// A task whose subagent waits on its bash permission (gateway with `permission: ask`, attached
/// to an OpenCode the test drives too).
struct SubagentAsking {
    rig: Rig,
    opencode: OpenCodeServer,
    dir: std::path::PathBuf,
    task: String,
    session: String,
    /// The child's ask as `GET /permission` lists it.
    ask: Value,
}

impl SubagentAsking {
    async fn start() -> Self {
        let (rig, opencode) = Rig::attached(
            subagent_env(),
            &[("OPENCODE_MCP_OPENCODE__PERMISSION", "ask")],
        )
        .await;
        let dir = rig.env.work_dir();
        let start = rig.start_task(SUBAGENT_PROMPT).await;
        let task = task_id(&start);
        let session = session_of(&start);
        let ask = child_ask(&opencode, &dir).await;
        Self {
            rig,
            opencode,
            dir,
            task,
            session,
            ask,
        }
    }
}

/// **Cancelling a task cancels its subagent's pending ask.**
///
/// Same set-up as above; the task is cancelled while the child session waits on its bash ask.
/// OpenCode propagates the parent's abort to the child but leaves the ask listed (measured on
/// 1.18.33), so the gateway must reject it itself.
///
/// Proves: `opencode_cancel_task` reports `cancelled`, `GET /permission` is empty afterwards,
/// both sessions go idle, and the fake gets no further LLM request for the child (its bash never
/// runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_task_rejects_its_subagents_pending_ask() {
    let SubagentAsking {
        rig,
        opencode,
        dir,
        task,
        session,
        ask,
    } = SubagentAsking::start().await;
    let child = ask["sessionID"]
        .as_str()
        .expect("child sessionID")
        .to_owned();
    let child_requests_before = rig.requests_for(&child).len();

    let c = rig
        .ok("opencode_cancel_task", json!({ "task_id": task }))
        .await;
    assert_eq!(c["status"], "cancelled", "{c}");
    let left = pending_permissions(&opencode, &dir).await;
    assert!(
        left.is_empty(),
        "cancel_task left the subagent's ask pending on OpenCode: {left:?}"
    );
    let idle = poll(Duration::from_secs(10), || async {
        let busy = busy_sessions(&opencode, &dir).await;
        (!busy.contains(&session) && !busy.contains(&child)).then_some(())
    })
    .await;
    assert!(
        idle.is_some(),
        "parent or child still busy: {:?}",
        busy_sessions(&opencode, &dir).await
    );
    assert_eq!(
        rig.requests_for(&child).len(),
        child_requests_before,
        "no LLM request for the child after the cancel"
    );
    assert!(
        !dir.join("from-child.txt").exists(),
        "the child's bash never ran"
    );
    let w = rig.wait(&[&task], "all", 1000).await;
    assert_eq!(w["tasks"][0]["status"], "cancelled", "{w}");
}

/// A prompt whose model calls the `task` tool twice in one step; OpenCode runs both subagents at
/// once, and each child's bash asks (`bash: ask`).
const TWO_SUBAGENTS_PROMPT: &str = "two helpers [[parallel]] \
     [[task:general:{{bash:touch from-first.txt}} first child]] \
     [[task:general:{{bash:touch from-second.txt}} second child]]";

/// **Two asks at once: each is shown with its id, and an answer lands only on the ask it names.**
///
/// Two subagents of one task ask for bash at the same time (both listed by `GET /permission`).
/// Before, the task held one ask, the newer replaced the older, and `reply_permission` answered
/// whichever it held: a host that had read ask A approved ask B.
///
/// Proves: the task shows both asks with OpenCode's ids; a reply without `permission_id` is
/// refused while two are pending (naming both, answering none); a reply naming B answers B only
/// (OpenCode still lists A, B's file lands, A's does not); naming B again is refused; with one
/// left the id may be left out; the task then completes with both files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_asks_at_once_are_each_answered_by_their_id() {
    let (rig, opencode) = Rig::attached(
        subagent_env(),
        &[("OPENCODE_MCP_OPENCODE__PERMISSION", "ask")],
    )
    .await;
    let dir = rig.env.work_dir();
    let task = task_id(&rig.start_task(TWO_SUBAGENTS_PROMPT).await);
    let asks = poll(Duration::from_secs(60), || async {
        let asks = pending_permissions(&opencode, &dir).await;
        (asks.len() == 2).then_some(asks)
    })
    .await
    .expect("both children ask for bash within 60 s");
    let id_of = |file: &str| -> String {
        asks.iter()
            .find(|a| a["patterns"].to_string().contains(file))
            .and_then(|a| a["id"].as_str())
            .unwrap_or_else(|| panic!("no ask for {file}: {asks:?}"))
            .to_owned()
    };
    let (first, second) = (id_of("from-first.txt"), id_of("from-second.txt"));

    let (snapshot, both) = watch_task(&rig, &task, Duration::from_secs(10), |t| {
        t["permissions"].as_array().is_some_and(|a| a.len() == 2)
    })
    .await;
    assert!(both, "OpenCode lists two asks, the task shows {snapshot}");
    assert_eq!(snapshot["status"], "waiting_permission", "{snapshot}");
    let mut shown: Vec<&str> = snapshot["permissions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a["id"].as_str())
        .collect();
    shown.sort_unstable();
    let mut expected = vec![first.as_str(), second.as_str()];
    expected.sort_unstable();
    assert_eq!(shown, expected, "{snapshot}");

    // No id while two are pending: refused, and nothing is answered.
    let (code, message) = rig
        .err(
            "opencode_reply_permission",
            json!({ "task_id": task, "reply": "always" }),
        )
        .await;
    assert_eq!(code, "conflict", "{message}");
    assert!(
        message.contains(&first) && message.contains(&second) && message.contains("permission_id"),
        "{message}"
    );
    assert_eq!(pending_permissions(&opencode, &dir).await.len(), 2);

    // Naming the second answers the second only.
    let replied = rig
        .ok(
            "opencode_reply_permission",
            json!({ "task_id": task, "reply": "once", "permission_id": second }),
        )
        .await;
    assert_eq!(replied["status"], "waiting_permission", "{replied}");
    assert_eq!(replied["permissions"][0]["id"], first.as_str(), "{replied}");
    assert_eq!(
        replied["permissions"].as_array().map(Vec::len),
        Some(1),
        "{replied}"
    );
    let left: Vec<Value> = pending_permissions(&opencode, &dir).await;
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(
        left[0]["id"],
        first.as_str(),
        "the first ask is still pending"
    );
    let second_ran = poll(Duration::from_secs(30), || async {
        dir.join("from-second.txt").exists().then_some(())
    })
    .await;
    assert!(second_ran.is_some(), "the second child's bash ran");
    assert!(
        !dir.join("from-first.txt").exists(),
        "the first is unanswered"
    );

    // The second again: no longer pending.
    let (code, message) = rig
        .err(
            "opencode_reply_permission",
            json!({ "task_id": task, "reply": "once", "permission_id": second }),
        )
        .await;
    assert_eq!(code, "conflict", "{message}");
    assert!(message.contains(&first), "{message}");

    // One left: the id may be left out.
    let replied = rig
        .ok(
            "opencode_reply_permission",
            json!({ "task_id": task, "reply": "once" }),
        )
        .await;
    assert_eq!(replied["status"], "running", "{replied}");
    let r = rig.finish(&task).await;
    assert_eq!(r["status"], "completed", "{r}");
    assert!(
        dir.join("from-first.txt").exists(),
        "the first child's bash ran"
    );
    assert!(pending_permissions(&opencode, &dir).await.is_empty());
}

/// **Two concurrent follow-ups on one finished task: exactly one wins.**
///
/// Two `opencode_continue_task` calls are in flight at once on one MCP client (`tokio::join!`).
/// Whichever the gateway takes first starts turn n+1; the other must be refused with `conflict`
/// (the task is no longer finished), not also sent to OpenCode (which would queue it and batch it
/// into the same LLM call). Repeated five times, because the race is timing-dependent.
///
/// Both calls pass `model` (the same one the task uses), as a host may: the gateway then validates
/// the model against the server over HTTP between its "is the task finished?" check and the claim
/// of the new turn, so both calls can pass the check.
///
/// Proves: each round, exactly one call succeeds, the other fails with code `conflict`, and the
/// fake LLM receives the accepted prompt and never the refused one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_concurrent_continues_start_exactly_one_turn() {
    let rig = Rig::start(&[]).await;
    let start = rig.start_task("first turn").await;
    let task = task_id(&start);
    let session = session_of(&start);
    let first = rig.finish(&task).await;
    assert_eq!(first["status"], "completed", "{first}");

    // With a `model`, the gateway checks the model against the server's catalog (an HTTP call)
    // between reading the task's state and claiming it: the window a second call slips through.
    let model = format!("{FAKE_PROVIDER}/{}", support::FAKE_MODEL);
    for round in 1..=5 {
        let a = format!("round {round} follow-up A");
        let b = format!("round {round} follow-up B");
        let seen_before = rig.requests_for(&session).len();
        let (ra, rb) = tokio::join!(
            rig.client.call(
                "opencode_continue_task",
                json!({ "task_id": task, "prompt": a, "model": model, "detail": "full" })
            ),
            rig.client.call(
                "opencode_continue_task",
                json!({ "task_id": task, "prompt": b, "model": model, "detail": "full" })
            ),
        );
        let (ra, rb) = (ra.expect("call A"), rb.expect("call B"));
        let outcome = format!(
            "round {round}: A -> {} {}; B -> {} {}",
            ra.is_error, ra.text, rb.is_error, rb.text
        );
        assert!(
            ra.is_error != rb.is_error,
            "exactly one continue may be accepted: {outcome}"
        );
        let (accepted, refused, refused_reply) = if ra.is_error {
            (&b, &a, &ra)
        } else {
            (&a, &b, &rb)
        };
        assert_eq!(refused_reply.error_code(), Some("conflict"), "{outcome}");

        let r = rig.finish(&task).await;
        assert_eq!(r["status"], "completed", "{outcome}: {r}");
        let new: Vec<RecordedRequest> = rig
            .requests_for(&session)
            .into_iter()
            .skip(seen_before)
            .collect();
        let carries = |text: &str| {
            new.iter().any(|q| {
                serde_json::to_string(&q.messages)
                    .unwrap_or_default()
                    .contains(text)
            })
        };
        let summary: Vec<String> = new.iter().map(|q| q.summary()).collect();
        assert!(carries(accepted), "{outcome}: {summary:#?}");
        assert!(
            !carries(refused),
            "the refused prompt reached the model: {outcome}: {summary:#?}"
        );
        assert_eq!(r["text"], echo_reply(accepted), "{outcome}: {r}");
    }
}

/// **A session deleted behind the gateway's back ends the task at once.**
///
/// While a slow stream runs, the session is deleted directly on the attached OpenCode
/// (`DELETE /session/{id}`). OpenCode 1.18.33 emits `session.deleted` (properties `sessionID` and
/// `info`, the whole session), then fails the running turn when it next writes a part
/// (`session.error` `UnknownError` "Failed query: insert into \"part\" ...") and goes idle; the
/// LLM stream is hung up. Nothing about it is a normal end of the turn.
///
/// Proves: the task is `failed` within 10 s, with an error message that says the session was
/// deleted (not a database error, not running until the 30-minute deadline).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_deleted_out_of_band_fails_the_task_naming_the_deletion() {
    let (rig, opencode) = Rig::attached(OpenCodeEnv::new(), &[]).await;
    let dir = rig.env.work_dir();
    let start = rig.start_task("deleted under it [[slow:20000]]").await;
    let task = task_id(&start);
    let session = session_of(&start);
    rig.fake
        .wait_for_request(Duration::from_secs(60), |r| {
            r.session_id() == Some(session.as_str())
        })
        .await;
    let response = opencode
        .request(
            reqwest::Method::DELETE,
            &format!("/session/{session}?{}", dir_q(&dir)),
        )
        .send()
        .await
        .expect("DELETE /session");
    assert!(response.status().is_success(), "{}", response.status());

    let w = rig.wait(&[&task], "all", 10_000).await;
    assert_eq!(
        w["done"], true,
        "the task must end once its session is deleted: {w}"
    );
    let r = rig
        .ok(
            "opencode_get_task_result",
            json!({ "task_id": task , "detail": "full" }),
        )
        .await;
    assert_eq!(r["status"], "failed", "{r}");
    let message = r["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.to_lowercase().contains("deleted"),
        "the error names the deletion: {r}"
    );
}

/// **An attached server serves several directories.**
///
/// A gateway attached to one OpenCode (`opencode.url`) is asked for a server in directory A and
/// one in directory B. OpenCode scopes every request by `?directory=`, so one attached process
/// serves both; the gateway must keep them apart.
///
/// Proves: the two `opencode_start_server` calls return different `server_id`s whose `directory`
/// are A and B, and a task started on B's server without a `directory` runs in B (its write
/// lands in B, not in A nor in the gateway's own directory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attached_server_keeps_each_directory_apart() {
    let (rig, _opencode) = Rig::attached(OpenCodeEnv::new(), &[]).await;
    let a = rig.env.root().join("project-a");
    let b = rig.env.root().join("project-b");
    std::fs::create_dir_all(&a).expect("mkdir a");
    std::fs::create_dir_all(&b).expect("mkdir b");
    let sa = rig
        .ok(
            "opencode_start_server",
            json!({ "directory": a.display().to_string() }),
        )
        .await;
    let sb = rig
        .ok(
            "opencode_start_server",
            json!({ "directory": b.display().to_string() }),
        )
        .await;
    assert_eq!(sa["directory"], a.display().to_string(), "{sa}");
    assert_eq!(sb["directory"], b.display().to_string(), "{sb}");
    assert_ne!(sa["server_id"], sb["server_id"], "A: {sa}\nB: {sb}");

    let start = rig
        .ok(
            "opencode_start_task",
            json!({
                "server_id": sb["server_id"],
                "prompt": "write it [[write:landed.txt:in b]]"
            }),
        )
        .await;
    let r = rig.finish(&task_id(&start)).await;
    assert_eq!(r["status"], "completed", "{r}");
    assert!(
        b.join("landed.txt").exists(),
        "the task ran in B; A has it: {}, the gateway dir has it: {}",
        a.join("landed.txt").exists(),
        rig.env.work_dir().join("landed.txt").exists()
    );
    assert!(!a.join("landed.txt").exists());
}

/// **Stopping an attached server stops its tasks' turns on OpenCode too.**
///
/// `opencode_stop_server` on an attached server cannot kill the process (it is not ours), so the
/// gateway must abort each running session there before it lets go of the server.
///
/// Proves: the running task is reported finished (`cancelled` or `failed`) with a message saying
/// the server was stopped, AND OpenCode really stopped the turn: the fake sees the slow stream's
/// client hang up, the session goes idle on OpenCode, and no later LLM request comes for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_an_attached_server_aborts_its_running_sessions() {
    let (rig, opencode) = Rig::attached(OpenCodeEnv::new(), &[]).await;
    let dir = rig.env.work_dir();
    let start = rig
        .start_task("outlived by its server [[slow:20000]]")
        .await;
    let task = task_id(&start);
    let session = session_of(&start);
    let request = rig
        .fake
        .wait_for_request(Duration::from_secs(60), |r| {
            r.session_id() == Some(session.as_str())
        })
        .await;

    let stopped = rig
        .ok(
            "opencode_stop_server",
            json!({ "server_id": rig.server_id() }),
        )
        .await;
    assert_eq!(stopped["terminated"], false, "{stopped}");
    let st = rig.status(&task).await;
    assert!(
        matches!(st["status"].as_str(), Some("cancelled" | "failed")),
        "{st}"
    );
    let message = st["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("stopped"), "{st}");

    let end = poll(Duration::from_secs(5), || async {
        rig.fake
            .stream_ends()
            .into_iter()
            .find(|e| e.request == request.index)
    })
    .await;
    assert!(
        end.as_ref().is_some_and(|e| e.client_closed),
        "OpenCode kept streaming the stopped task's turn: {end:?}, busy sessions: {:?}",
        busy_sessions(&opencode, &dir).await
    );
    let idle = poll(Duration::from_secs(10), || async {
        (!busy_sessions(&opencode, &dir).await.contains(&session)).then_some(())
    })
    .await;
    assert!(idle.is_some(), "the session is still busy on OpenCode");
    let requests = rig.requests_for(&session);
    assert_eq!(
        requests.last().map(|r| r.index),
        Some(request.index),
        "no LLM request after the stop"
    );
}

/// **A retried `start_task` with its `idempotency_key` starts one agent.**
///
/// Hosts retry tool calls after timeouts and reconnects. Two concurrent calls and a later retry
/// with the same key and arguments all answer with one task, and OpenCode gets one prompt; the
/// same key with other arguments is refused with `conflict`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_start_with_its_key_starts_one_agent() {
    let rig = Rig::start(&[]).await;
    let prompt = "only once, however often asked";
    let args = json!({
        "server_id": rig.server_id(),
        "prompt": prompt,
        "idempotency_key": "retry-7f3a",
    });
    let (a, b) = tokio::join!(
        rig.client.call_ok("opencode_start_task", args.clone()),
        rig.client.call_ok("opencode_start_task", args.clone())
    );
    let (a, b) = (a.expect("first call"), b.expect("concurrent retry"));
    assert_eq!(a["task_id"], b["task_id"], "{a}\n{b}");
    let task = task_id(&a);
    let r = rig.finish(&task).await;
    assert_eq!(r["status"], "completed", "{r}");
    let later = rig.ok("opencode_start_task", args.clone()).await;
    assert_eq!(
        later["task_id"], a["task_id"],
        "a retry after the end: {later}"
    );
    let prompts = rig
        .fake
        .chat_requests()
        .iter()
        .filter(|r| r.last_user_text.contains(prompt))
        .count();
    assert_eq!(prompts, 1, "one agent, one prompt");

    let mut other = args.clone();
    other["prompt"] = json!("a different task");
    let (code, message) = rig.err("opencode_start_task", other).await;
    assert_eq!(code, "conflict", "{message}");
    assert!(message.contains("retry-7f3a"), "{message}");
}

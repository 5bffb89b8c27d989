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

use futures::StreamExt;
use serde_json::{json, Value};
use support::fake_llm::{parse_markers, task_description, usage_prompt_tokens};
use support::isolation::FAKE_SMALL_MODEL;
use support::opencode_server::encode;
use support::{FakeLlm, Marker, OpenCodeEnv, OpenCodeServer, FAKE_PROVIDER};
use tokio::sync::mpsc;

/// Upper bound for one scripted turn driven directly.
const TURN: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// Helpers for driving OpenCode directly.

/// `GET /global/event`: every directory's events, each `{directory, payload}`.
struct GlobalEvents {
    rx: mpsc::UnboundedReceiver<Value>,
    seen: Vec<Value>,
    task: tokio::task::JoinHandle<()>,
}

impl GlobalEvents {
    async fn subscribe(server: &OpenCodeServer) -> Self {
        let response = server
            .get("/global/event")
            .send()
            .await
            .expect("GET /global/event");
        assert!(response.status().is_success(), "{}", response.status());
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            let mut body = response.bytes_stream();
            let mut buf: Vec<u8> = Vec::new();
            let mut data: Vec<String> = Vec::new();
            while let Some(Ok(bytes)) = body.next().await {
                buf.extend_from_slice(&bytes);
                while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=pos).collect();
                    let line = String::from_utf8_lossy(&line);
                    let line = line.trim_end_matches(['\n', '\r']);
                    if line.is_empty() {
                        if !data.is_empty() {
                            if let Ok(v) = serde_json::from_str::<Value>(&data.join("\n")) {
                                if tx.send(v).is_err() {
                                    return;
                                }
                            }
                            data.clear();
                        }
                    } else if let Some(rest) = line.strip_prefix("data:") {
                        data.push(rest.trim_start().to_owned());
                    }
                }
            }
        });
        let mut events = GlobalEvents {
            rx,
            seen: Vec::new(),
            task,
        };
        events
            .wait_for(Duration::from_secs(10), |e| e["type"] == "server.connected")
            .await;
        events
    }

    /// Consumes events until `pred` holds for one (given its payload); returns that payload.
    async fn wait_for(&mut self, timeout: Duration, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(event)) => {
                    let payload = event.get("payload").cloned().unwrap_or(event);
                    self.seen.push(payload.clone());
                    if pred(&payload) {
                        return payload;
                    }
                }
                Ok(None) => panic!("global event stream ended"),
                Err(_) => panic!(
                    "no matching event after {timeout:?}; seen: {:?}",
                    self.seen
                        .iter()
                        .map(|e| e["type"].as_str().unwrap_or("?"))
                        .collect::<Vec<_>>()
                ),
            }
        }
    }

    /// Drains what has arrived within `quiet` of silence.
    async fn drain(&mut self, quiet: Duration) {
        while let Ok(Some(event)) = tokio::time::timeout(quiet, self.rx.recv()).await {
            let payload = event.get("payload").cloned().unwrap_or(event);
            self.seen.push(payload);
        }
    }
}

impl Drop for GlobalEvents {
    fn drop(&mut self) {
        self.task.abort();
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
    let warm = d.create_session("warm-up").await;
    let mut events = GlobalEvents::subscribe(&d.server).await;
    d.prompt(&warm, FAKE_SMALL_MODEL, "warm up").await;
    events
        .wait_for(TURN, |e| {
            e["type"] == "session.idle" && e["properties"]["sessionID"] == warm
        })
        .await;
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
    let warm = d.create_session("warm-up").await;
    let mut events = GlobalEvents::subscribe(&d.server).await;
    d.prompt(&warm, support::FAKE_MODEL, "warm up").await;
    events
        .wait_for(TURN, |e| {
            e["type"] == "session.idle" && e["properties"]["sessionID"] == warm
        })
        .await;
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

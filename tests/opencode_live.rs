//! Proof of the test harness (`tests/support`) against the real, pinned OpenCode: the fake LLM,
//! the isolated environment and the server wrapper, driving OpenCode's HTTP API directly with
//! reqwest. This is not the product's code path; it pins down the OpenCode facts the product
//! relies on and records the JSON fixtures in `tests/fixtures/opencode/`.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::fake_llm::{self, echo_reply, parse_markers, ERROR_400_MESSAGE};
use support::opencode_server::encode;
use support::{FakeLlm, Marker, OpenCodeEnv, OpenCodeServer, Reply, FAKE_MODEL, FAKE_PROVIDER};

/// Upper bound for one scripted turn (they take well under a second).
const TURN: Duration = Duration::from_secs(30);

/// One fake LLM, one isolated env, one OpenCode.
struct Live {
    // Field order is drop order: OpenCode goes first, then its env and the fake.
    server: OpenCodeServer,
    env: OpenCodeEnv,
    fake: FakeLlm,
}

impl Live {
    async fn start() -> Self {
        Self::start_with(OpenCodeEnv::new()).await
    }

    async fn start_with(env: OpenCodeEnv) -> Self {
        let fake = FakeLlm::start();
        let server = OpenCodeServer::start(&env, &fake.url()).await;
        Live { server, env, fake }
    }

    fn dir_query(&self) -> String {
        format!(
            "directory={}",
            encode(&self.env.work_dir().display().to_string())
        )
    }

    /// `POST /session?directory=<work>` with a title (so OpenCode does not ask the LLM for
    /// one); returns the whole response.
    async fn create_session(&self, title: &str) -> Value {
        let path = format!("/session?{}", self.dir_query());
        let (status, session) = self
            .server
            .post_json(&path, &json!({ "title": title }))
            .await;
        assert!(status.is_success(), "POST {path}: {status} {session}");
        session
    }

    /// `POST /session/{id}/prompt_async` with one text part on the fake model.
    async fn prompt(&self, session_id: &str, text: &str) {
        let path = format!("/session/{session_id}/prompt_async?{}", self.dir_query());
        let body = json!({
            "parts": [{ "type": "text", "text": text }],
            "model": { "providerID": FAKE_PROVIDER, "modelID": FAKE_MODEL }
        });
        let (status, answer) = self.server.post_json(&path, &body).await;
        assert_eq!(status, 204, "POST {path}: {answer}");
    }

    async fn messages(&self, session_id: &str) -> Value {
        let path = format!("/session/{session_id}/message?{}", self.dir_query());
        let (status, messages) = self.server.get_json(&path).await;
        assert!(status.is_success(), "GET {path}: {status} {messages}");
        messages
    }
}

fn session_id(session: &Value) -> String {
    session["id"]
        .as_str()
        .unwrap_or_else(|| panic!("session without id: {session}"))
        .to_owned()
}

/// The assistant messages of a `GET /session/{id}/message` answer.
fn assistant_messages(messages: &Value) -> Vec<&Value> {
    messages
        .as_array()
        .expect("messages are an array")
        .iter()
        .filter(|m| m["info"]["role"] == "assistant")
        .collect()
}

/// The text parts of the last assistant message, joined.
fn last_assistant_text(messages: &Value) -> String {
    let assistants = assistant_messages(messages);
    let last = assistants.last().expect("an assistant message");
    last["parts"]
        .as_array()
        .expect("parts")
        .iter()
        .filter(|p| p["type"] == "text")
        .filter_map(|p| p["text"].as_str())
        .collect::<Vec<_>>()
        .join("")
}

fn is_session_event(event: &Value, kind: &str, session_id: &str) -> bool {
    event["type"] == kind && event["properties"]["sessionID"] == session_id
}

#[test]
fn fake_llm_markers_parse() {
    assert_eq!(
        parse_markers("do [[bash:echo hi]] then [[write:/a/b:x\\ny]] [[nope]] [[slow:500]]"),
        vec![
            Marker::Bash("echo hi".into()),
            Marker::Write {
                path: "/a/b".into(),
                content: "x\ny".into()
            },
            Marker::Slow { ms: 500 },
        ]
    );
    assert_eq!(
        parse_markers("[[error500:250:2]][[error400]][[delay:9]]"),
        vec![
            Marker::Error500 {
                retry_after_ms: Some(250),
                times: Some(2)
            },
            Marker::Error400,
            Marker::Delay { ms: 9 },
        ]
    );
    assert_eq!(
        parse_markers("[[error500]]"),
        vec![Marker::Error500 {
            retry_after_ms: None,
            times: None
        }]
    );
    assert_eq!(echo_reply("\n  hello there \nmore"), "ECHO: hello there");
}

/// The fake LLM on its own (no OpenCode): SSE framing, the non-streaming answer, tool-call
/// steps, errors and their headers, `/v1/models`, 404.
#[tokio::test]
async fn fake_llm_speaks_openai() {
    let fake = FakeLlm::start();
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("reqwest client");
    let chat = format!("{}/chat/completions", fake.url());
    let tools = json!([{ "type": "function", "function": { "name": "bash", "parameters": {} } }]);

    let response = http
        .post(&chat)
        .json(&json!({
            "model": "fake-model",
            "stream": true,
            "tools": tools,
            "messages": [{ "role": "user", "content": [{ "type": "text", "text": "[[bash:ls -l]] go" }] }]
        }))
        .send()
        .await
        .expect("stream request");
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let body = response.text().await.expect("SSE body");
    let frames: Vec<&str> = body
        .split("\n\n")
        .filter(|f| !f.is_empty())
        .map(|f| f.strip_prefix("data: ").expect("data frame"))
        .collect();
    assert_eq!(
        frames.len(),
        5,
        "role, tool call, finish, usage, [DONE]: {body}"
    );
    assert_eq!(frames[4], "[DONE]");
    let chunk = |i: usize| serde_json::from_str::<Value>(frames[i]).expect("chunk JSON");
    assert_eq!(chunk(0)["choices"][0]["delta"]["role"], "assistant");
    let call = &chunk(1)["choices"][0]["delta"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "bash");
    assert_eq!(call["function"]["arguments"], r#"{"command":"ls -l"}"#);
    assert_eq!(chunk(2)["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(chunk(3)["usage"]["total_tokens"], 110);

    // The step after the tool result, without streaming: the final text.
    let (status, answer) = {
        let response = http
            .post(&chat)
            .json(&json!({
                "model": "fake-model",
                "tools": tools,
                "messages": [
                    { "role": "user", "content": "[[bash:ls -l]] go" },
                    { "role": "assistant", "content": null, "tool_calls": [{ "id": "c1", "type": "function", "function": { "name": "bash", "arguments": "{}" } }] },
                    { "role": "tool", "tool_call_id": "c1", "content": "total 0" }
                ]
            }))
            .send()
            .await
            .expect("plain request");
        (
            response.status(),
            response.json::<Value>().await.expect("JSON answer"),
        )
    };
    assert_eq!(status, 200);
    assert_eq!(
        answer["choices"][0]["message"]["content"],
        "ECHO: [[bash:ls -l]] go"
    );
    assert_eq!(answer["choices"][0]["finish_reason"], "stop");

    let response = http
        .post(&chat)
        .json(&json!({ "model": "m", "stream": true, "messages": [{ "role": "user", "content": "[[error500:75]]" }] }))
        .send()
        .await
        .expect("500 request");
    assert_eq!(response.status(), 500);
    assert_eq!(response.headers()["retry-after-ms"], "75");
    let response = http
        .post(&chat)
        .json(&json!({ "model": "m", "stream": true, "messages": [{ "role": "user", "content": "[[error400]]" }] }))
        .send()
        .await
        .expect("400 request");
    assert_eq!(response.status(), 400);
    let error: Value = response.json().await.expect("error JSON");
    assert_eq!(error["error"]["message"], ERROR_400_MESSAGE);

    let models: Value = http
        .get(format!("{}/models", fake.url()))
        .send()
        .await
        .expect("models request")
        .json()
        .await
        .expect("models JSON");
    assert_eq!(models["data"][0]["id"], "fake-model");
    let missing = http
        .get(format!("{}/nope", fake.url()))
        .send()
        .await
        .expect("404 request");
    assert_eq!(missing.status(), 404);

    let requests = fake.wait_for_requests(6, TURN).await;
    assert_eq!(requests.len(), 6);
    assert_eq!(requests[0].tools, ["bash"]);
    assert_eq!(requests[0].last_user_text, "[[bash:ls -l]] go");
    assert_eq!(requests[1].tool_results(), ["total 0"]);
    assert!(!requests[1].stream);
    let ends = fake.stream_ends();
    assert_eq!(ends.len(), 1, "only the first answer was streamed");
    assert!(!ends[0].client_closed);
    assert_eq!(ends[0].chunks_sent, 5);
}

#[tokio::test]
async fn plain_text_turn() {
    let live = Live::start().await;
    eprintln!("opencode started in {:?}", live.server.startup);
    let mut events = live.server.events(&live.env.work_dir()).await;
    let session = live.create_session("plain text").await;
    let id = session_id(&session);
    assert_eq!(
        session["directory"],
        live.env.work_dir().display().to_string()
    );

    let prompt = "say hello\nwith a second line";
    live.prompt(&id, prompt).await;
    events.wait_idle(&id, TURN).await;

    let messages = live.messages(&id).await;
    assert_eq!(last_assistant_text(&messages), echo_reply(prompt));
    assert_eq!(last_assistant_text(&messages), "ECHO: say hello");
    let requests = live.fake.requests();
    assert_eq!(
        requests.len(),
        1,
        "one LLM call, no title or other requests: {:#?}",
        requests.iter().map(|r| r.summary()).collect::<Vec<_>>()
    );
    let request = &requests[0];
    assert!(request.is_chat());
    assert!(request.stream);
    assert_eq!(request.model, FAKE_MODEL);
    assert_eq!(request.session_id(), Some(id.as_str()));
    assert_eq!(request.last_user_text, prompt);
    assert_eq!(request.roles(), ["system", "user"]);
    eprintln!("events: {:?}", events.seen_types());
}

#[tokio::test]
async fn bash_tool_turn() {
    let live = Live::start().await;
    let mut events = live.server.events(&live.env.work_dir()).await;
    let id = session_id(&live.create_session("bash tool").await);
    live.prompt(&id, "[[bash:echo harness-bash-ok]] run it")
        .await;
    events.wait_idle(&id, TURN).await;

    let requests = live.fake.requests();
    assert_eq!(
        requests.len(),
        2,
        "tool call, then the answer: {:#?}",
        requests.iter().map(|r| r.summary()).collect::<Vec<_>>()
    );
    let offered = &requests[0].tools;
    for tool in ["bash", "write", "edit", "read"] {
        assert!(
            offered.iter().any(|t| t == tool),
            "{tool} offered: {offered:?}"
        );
    }
    assert_eq!(requests[1].roles(), ["system", "user", "assistant", "tool"]);
    assert_eq!(requests[1].tool_results(), ["harness-bash-ok\n"]);

    let messages = live.messages(&id).await;
    let assistants = assistant_messages(&messages);
    assert_eq!(assistants.len(), 2, "one assistant message per step");
    assert_eq!(assistants[0]["info"]["finish"], "tool-calls");
    assert_eq!(assistants[1]["info"]["finish"], "stop");
    let tool_part = assistants[0]["parts"]
        .as_array()
        .expect("parts")
        .iter()
        .find(|p| p["type"] == "tool")
        .expect("a tool part");
    assert_eq!(tool_part["tool"], "bash");
    assert_eq!(tool_part["state"]["status"], "completed");
    assert_eq!(
        tool_part["state"]["input"]["command"],
        "echo harness-bash-ok"
    );
    assert_eq!(tool_part["state"]["output"], "harness-bash-ok\n");
    assert_eq!(
        last_assistant_text(&messages),
        "ECHO: [[bash:echo harness-bash-ok]] run it"
    );
    eprintln!("events: {:?}", events.seen_types());
}

#[tokio::test]
async fn error_400_is_a_session_error() {
    let live = Live::start().await;
    let mut events = live.server.events(&live.env.work_dir()).await;
    let id = session_id(&live.create_session("error 400").await);
    live.prompt(&id, "[[error400]] fail please").await;
    let error = events
        .wait_for(TURN, |e| is_session_event(e, "session.error", &id))
        .await;
    eprintln!("session.error: {error:#}");
    let text = error.to_string();
    assert!(text.contains(ERROR_400_MESSAGE), "{error:#}");
    events.wait_idle(&id, TURN).await;
    // The turn's own chat requests: OpenCode may also list the provider's models or ask for a
    // title, at moments of its choosing (a CI run once counted a second request here).
    let all = live.fake.requests();
    let asked: Vec<_> = all
        .iter()
        .filter(|r| r.is_chat() && !r.is_title_request() && r.session_id() == Some(id.as_str()))
        .collect();
    assert_eq!(
        asked.len(),
        1,
        "a 400 is not retried; requests: {:?}",
        all.iter()
            .map(|r| format!("{} {}", r.method, r.path))
            .collect::<Vec<_>>()
    );
    eprintln!("events: {:?}", events.seen_types());
}

/// Four more markers against one server, in four concurrent sessions: a delayed `write`, a slow
/// stream aborted mid-way, a 500 retried twice, and a `bash` call waiting on a permission ask.
#[tokio::test]
async fn write_abort_retry_and_permission() {
    let env = OpenCodeEnv::new().with_config(json!({ "permission": { "bash": "ask" } }));
    let live = Live::start_with(env).await;
    tokio::join!(
        write_flow(&live),
        abort_flow(&live),
        retry_flow(&live),
        permission_flow(&live)
    );
}

fn requests_of(live: &Live, session_id: &str) -> Vec<support::RecordedRequest> {
    live.fake
        .chat_requests()
        .into_iter()
        .filter(|r| r.session_id() == Some(session_id))
        .collect()
}

async fn write_flow(live: &Live) {
    let mut events = live.server.events(&live.env.work_dir()).await;
    let id = session_id(&live.create_session("write").await);
    live.prompt(
        &id,
        "[[delay:300]][[write:notes/hello.txt:hello\\nworld]] write it",
    )
    .await;
    events.wait_idle(&id, TURN).await;

    let written = std::fs::read_to_string(live.env.work_dir().join("notes/hello.txt"))
        .expect("the write tool wrote notes/hello.txt (relative to the session directory)");
    assert_eq!(written, "hello\nworld");
    let requests = requests_of(live, &id);
    assert_eq!(requests.len(), 2, "write call, then the answer");
    assert!(
        matches!(&requests[0].reply, Reply::ToolCall { name, .. } if name == "write"),
        "{:?}",
        requests[0].reply
    );
    let end = live.fake.wait_for_stream_end(requests[0].index, TURN).await;
    assert!(
        end.at - requests[0].at >= Duration::from_millis(300),
        "[[delay:300]] held the answer"
    );
}

async fn abort_flow(live: &Live) {
    let mut events = live.server.events(&live.env.work_dir()).await;
    let id = session_id(&live.create_session("abort").await);
    live.prompt(&id, "[[slow:20000]] a long answer").await;
    let request = live
        .fake
        .wait_for_request(TURN, |r| r.session_id() == Some(id.as_str()))
        .await;

    let (status, statuses) = live
        .server
        .get_json(&format!("/session/status?{}", live.dir_query()))
        .await;
    assert!(status.is_success());
    assert_eq!(statuses[&id]["type"], "busy", "{statuses}");

    let (status, aborted) = live
        .server
        .post_json(
            &format!("/session/{id}/abort?{}", live.dir_query()),
            &json!({}),
        )
        .await;
    assert!(status.is_success());
    assert_eq!(aborted, true);
    let end = live.fake.wait_for_stream_end(request.index, TURN).await;
    assert!(
        end.client_closed,
        "OpenCode hung up the slow stream: {end:?}"
    );
    assert!(
        end.at - request.at < Duration::from_secs(10),
        "closed long before the 20 s stream would have ended: {end:?}"
    );
    let error = events
        .wait_for(TURN, |e| is_session_event(e, "session.error", &id))
        .await;
    assert_eq!(
        error["properties"]["error"]["name"], "MessageAbortedError",
        "{error}"
    );
    events.wait_idle(&id, TURN).await;
}

async fn retry_flow(live: &Live) {
    let mut events = live.server.events(&live.env.work_dir()).await;
    let id = session_id(&live.create_session("retry").await);
    let prompt = "[[error500:50:2]] a flaky provider";
    live.prompt(&id, prompt).await;
    events.wait_idle(&id, TURN).await;

    let retries: Vec<&Value> = events
        .seen()
        .iter()
        .filter(|e| is_session_event(e, "session.status", &id))
        .map(|e| &e["properties"]["status"])
        .filter(|s| s["type"] == "retry")
        .collect();
    assert_eq!(retries.len(), 2, "{retries:?}");
    assert_eq!(retries[0]["attempt"], 1);
    assert_eq!(retries[1]["attempt"], 2);
    assert_eq!(retries[0]["message"], fake_llm::ERROR_500_MESSAGE);
    assert_eq!(requests_of(live, &id).len(), 3, "two 500s, then the answer");
    assert_eq!(
        last_assistant_text(&live.messages(&id).await),
        echo_reply(prompt)
    );
}

async fn permission_flow(live: &Live) {
    let mut events = live.server.events(&live.env.work_dir()).await;
    let id = session_id(&live.create_session("permission").await);
    live.prompt(&id, "[[bash:echo allowed-once]] needs a permission")
        .await;
    let asked = events
        .wait_for(TURN, |e| is_session_event(e, "permission.asked", &id))
        .await;
    let permission_id = asked["properties"]["id"]
        .as_str()
        .expect("permission id")
        .to_owned();
    assert_eq!(asked["properties"]["permission"], "bash");

    let (status, pending) = live
        .server
        .get_json(&format!("/permission?{}", live.dir_query()))
        .await;
    assert!(status.is_success());
    assert!(
        pending
            .as_array()
            .expect("permission list")
            .iter()
            .any(|p| p["id"] == permission_id.as_str()),
        "{pending}"
    );
    let (status, replied) = live
        .server
        .post_json(
            &format!("/permission/{permission_id}/reply?{}", live.dir_query()),
            &json!({ "reply": "once" }),
        )
        .await;
    assert!(status.is_success());
    assert_eq!(replied, true);
    events.wait_idle(&id, TURN).await;
    let requests = requests_of(live, &id);
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[1].tool_results(), ["allowed-once\n"]);
}

/// Records the JSON fixtures in `tests/fixtures/opencode/` from the live, pinned OpenCode. A
/// recording tool, not a test (see the README there); it refuses to run without
/// `RECORD_FIXTURES=1`.
#[tokio::test]
#[ignore = "recording tool, not a test: RECORD_FIXTURES=1 cargo test --test opencode_live -- --ignored record_fixtures"]
async fn record_fixtures() {
    assert_eq!(
        std::env::var("RECORD_FIXTURES").as_deref(),
        Ok("1"),
        "record_fixtures rewrites tests/fixtures/opencode/; run it with RECORD_FIXTURES=1"
    );
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/opencode");
    std::fs::create_dir_all(&dir).expect("create the fixture dir");
    let live = Live::start().await;
    let q = live.dir_query();
    let save = |name: &str, value: &Value| save_json(&dir, &live.env, name, value);
    let save_events =
        |name: &str, events: &support::EventStream| save_raw_events(&dir, &live.env, name, events);
    let get_ok = |path: String| {
        let live = &live;
        async move {
            let (status, value) = live.server.get_json(&path).await;
            assert!(status.is_success(), "GET {path}: {status} {value}");
            value
        }
    };

    save("agents.json", &get_ok(format!("/agent?{q}")).await);
    save(
        "config_providers.json",
        &get_ok(format!("/config/providers?{q}")).await,
    );

    warm_up(&live).await;

    // A text turn.
    let mut events = live.server.events(&live.env.work_dir()).await;
    let session = live.create_session("fixture: text turn").await;
    save("session.json", &session);
    let text_id = session_id(&session);
    live.prompt(&text_id, "Say hello").await;
    events.wait_idle(&text_id, TURN).await;
    save("messages_text.json", &live.messages(&text_id).await);
    save(
        "session_after_turn.json",
        &get_ok(format!("/session/{text_id}?{q}")).await,
    );
    save_events("events_text.jsonl", &events);

    // A bash tool turn, then a 400 in a second session, on one event stream.
    let mut events = live.server.events(&live.env.work_dir()).await;
    let tool_id = session_id(&live.create_session("fixture: tool turn").await);
    live.prompt(&tool_id, "[[bash:echo fixture-bash-output]] run it")
        .await;
    events.wait_idle(&tool_id, TURN).await;
    save("messages_tool.json", &live.messages(&tool_id).await);
    let error_id = session_id(&live.create_session("fixture: error 400").await);
    live.prompt(&error_id, "[[error400]] fail").await;
    events
        .wait_for(TURN, |e| is_session_event(e, "session.error", &error_id))
        .await;
    // The first `session.idle` comes before the assistant message is marked failed.
    wait_failed_assistant(&mut events, &error_id).await;
    events.wait_idle(&error_id, TURN).await;
    save("messages_error.json", &live.messages(&error_id).await);
    save_events("events.jsonl", &events);

    // A slow turn: the busy status, then an abort.
    let mut events = live.server.events(&live.env.work_dir()).await;
    let abort_id = session_id(&live.create_session("fixture: abort").await);
    live.prompt(&abort_id, "[[slow:20000]] slow").await;
    live.fake
        .wait_for_request(TURN, |r| r.session_id() == Some(abort_id.as_str()))
        .await;
    save(
        "session_status_busy.json",
        &get_ok(format!("/session/status?{q}")).await,
    );
    let (status, aborted) = live
        .server
        .post_json(&format!("/session/{abort_id}/abort?{q}"), &json!({}))
        .await;
    assert!(status.is_success() && aborted == true, "{status} {aborted}");
    events
        .wait_for(TURN, |e| is_session_event(e, "session.error", &abort_id))
        .await;
    wait_failed_assistant(&mut events, &abort_id).await;
    events.wait_idle(&abort_id, TURN).await;
    save("messages_abort.json", &live.messages(&abort_id).await);
    save_events("events_abort.jsonl", &events);

    // A 500 retried once (the retry status while waiting), then the answer.
    let mut events = live.server.events(&live.env.work_dir()).await;
    let retry_id = session_id(&live.create_session("fixture: retry").await);
    live.prompt(&retry_id, "[[error500:1500:1]] flaky").await;
    events
        .wait_for(TURN, |e| {
            is_session_event(e, "session.status", &retry_id)
                && e["properties"]["status"]["type"] == "retry"
        })
        .await;
    save(
        "session_status_retry.json",
        &get_ok(format!("/session/status?{q}")).await,
    );
    events.wait_idle(&retry_id, TURN).await;
    save_events("events_retry.jsonl", &events);

    // Error bodies.
    let (status, body) = live
        .server
        .get_json(&format!("/session/ses_doesnotexist?{q}"))
        .await;
    eprintln!("GET /session/ses_doesnotexist: {status}");
    save(
        "error_404.json",
        &json!({ "status": status.as_u16(), "body": body }),
    );
    let (status, body) = live
        .server
        .post_json(
            &format!("/session/{text_id}/prompt_async?{q}"),
            &json!({ "parts": "not a list" }),
        )
        .await;
    eprintln!("POST prompt_async with a bad body: {status}");
    save(
        "error_400.json",
        &json!({ "status": status.as_u16(), "body": body }),
    );
    drop(live);

    // A pending permission ask, on a server whose config asks before bash.
    let env = OpenCodeEnv::new().with_config(json!({ "permission": { "bash": "ask" } }));
    let live = Live::start_with(env).await;
    let q = live.dir_query();
    warm_up(&live).await;
    let mut events = live.server.events(&live.env.work_dir()).await;
    let id = session_id(&live.create_session("fixture: permission").await);
    live.prompt(&id, "[[bash:echo needs-permission]] run it")
        .await;
    let asked = events
        .wait_for(TURN, |e| is_session_event(e, "permission.asked", &id))
        .await;
    let (status, list) = live.server.get_json(&format!("/permission?{q}")).await;
    assert!(status.is_success(), "GET /permission: {status}");
    save_json(&dir, &live.env, "permission_list.json", &list);
    let permission_id = asked["properties"]["id"].as_str().expect("permission id");
    let (status, _) = live
        .server
        .post_json(
            &format!("/permission/{permission_id}/reply?{q}"),
            &json!({ "reply": "once" }),
        )
        .await;
    assert!(status.is_success());
    events.wait_idle(&id, TURN).await;
    save_raw_events(&dir, &live.env, "events_permission.jsonl", &events);
}

/// A first turn loads OpenCode's plugins (some 45 `plugin.added` events and friends); the
/// recorder gets it out of the way so that the event fixtures show steady-state turns.
async fn warm_up(live: &Live) {
    let mut events = live.server.events(&live.env.work_dir()).await;
    let id = session_id(&live.create_session("warm-up").await);
    live.prompt(&id, "warm up").await;
    events.wait_idle(&id, TURN).await;
}

/// Waits for the `message.updated` that marks the session's assistant message as failed.
async fn wait_failed_assistant(events: &mut support::EventStream, session_id: &str) {
    events
        .wait_for(TURN, |e| {
            is_session_event(e, "message.updated", session_id)
                && e["properties"]["info"]["role"] == "assistant"
                && !e["properties"]["info"]["error"].is_null()
        })
        .await;
}

fn save_json(dir: &std::path::Path, env: &OpenCodeEnv, name: &str, value: &Value) {
    let text = serde_json::to_string_pretty(value).expect("pretty JSON");
    std::fs::write(dir.join(name), env.redact_paths(&text) + "\n")
        .unwrap_or_else(|e| panic!("write {name}: {e}"));
    eprintln!("recorded {name}");
}

fn save_raw_events(
    dir: &std::path::Path,
    env: &OpenCodeEnv,
    name: &str,
    events: &support::EventStream,
) {
    let lines: Vec<String> = events
        .raw()
        .iter()
        .map(|raw| env.redact_paths(raw))
        .collect();
    std::fs::write(dir.join(name), lines.join("\n") + "\n")
        .unwrap_or_else(|e| panic!("write {name}: {e}"));
    eprintln!("recorded {name} ({} events)", lines.len());
}

/// Drift check: `openapi/opencode.json`, which the client is generated from, is exactly what
/// the OpenCode the suite runs against prints with `opencode generate`. It fails on a refresh
/// that was not committed, on a hand edit of the spec, and on an `OPENCODE_BIN` whose API differs
/// from the pinned one (then the client would call an API the binary does not have).
#[test]
fn the_committed_spec_is_what_the_opencode_under_test_generates() {
    let bin = support::opencode_bin();
    let scratch = tempfile::tempdir().expect("tempdir");
    let dir = |name: &str| scratch.path().join(name);
    // As `openapi/refresh.sh` runs it: no user config, no update check, no plugin installs.
    let out = std::process::Command::new(&bin)
        .arg("generate")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", dir("home"))
        .env("XDG_CONFIG_HOME", dir("config"))
        .env("XDG_DATA_HOME", dir("data"))
        .env("XDG_CACHE_HOME", dir("cache"))
        .env("XDG_STATE_HOME", dir("state"))
        .env("OPENCODE_DISABLE_AUTOUPDATE", "1")
        .env("OPENCODE_DISABLE_MODELS_FETCH", "1")
        .env("npm_config_registry", "http://127.0.0.1:9")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {} generate: {e}", bin.display()));
    assert!(
        out.status.success(),
        "{} generate failed ({}): {}",
        bin.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let committed = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/openapi/opencode.json"
    ))
    .expect("openapi/opencode.json is committed");
    let pinned = support::pinned_version();
    let same_json = || {
        let a: Option<Value> = serde_json::from_slice(&committed).ok();
        let b: Option<Value> = serde_json::from_slice(&out.stdout).ok();
        a.is_some() && a == b
    };
    assert!(
        out.stdout == committed || same_json(),
        "openapi/opencode.json is not what {} generates (the suite is pinned to OpenCode {pinned}): \
         refresh it with `bash openapi/refresh.sh --bin {}` and commit the result, or run the \
         suite with the pinned OpenCode",
        bin.display(),
        bin.display()
    );
}

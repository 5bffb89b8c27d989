//! A scripted Anthropic Messages API on 127.0.0.1, for driving a real Claude Code headless.
//!
//! [`FakeAnthropic::start`] binds `127.0.0.1:0` and serves on its own thread (its own tokio
//! runtime), so it works from sync and async tests alike and stops when dropped. Claude Code
//! reaches it through `ANTHROPIC_BASE_URL=`[`FakeAnthropic::url`].
//!
//! # Routes
//!
//! - `POST /v1/messages` (Claude Code adds `?beta=true`): the **main conversation** is the request
//!   whose `tools` include a name starting with the configured prefix (e.g. `mcp__opencode__`);
//!   it is answered from the [`Step`] script. Every other messages request (titles, quota probes,
//!   small-model side calls) is a **side request** and gets the plain text [`SIDE_REPLY`]. With
//!   `"stream": true` the answer is server-sent events as the real API sends them
//!   (`message_start`, `content_block_start`/`content_block_delta`/`content_block_stop` per block,
//!   `message_delta` with `stop_reason` and `usage`, `message_stop`); without it, one message JSON.
//! - `POST /v1/messages/count_tokens`: `{"input_tokens": <body length / 4>}`.
//! - `GET /` and `HEAD /` (Claude Code's reachability probe): `200 ok`.
//! - anything else: 404 with an Anthropic-style error body.
//!
//! # Script
//!
//! The main conversation's k-th answer is step k, where k is the number of assistant messages
//! holding a `tool_use` block already in the request (so a retried request gets the same answer,
//! and the conversation's history, not the fake's memory, says where the script is). A
//! [`Step::tool`] answers with one `tool_use` block (id `toolu_fake_<k>`), whose input is computed
//! from the `tool_result` blocks the host sent back so far — which is how a later step uses an id
//! from an earlier result, and how a test sees exactly what the host showed its model. A
//! [`Step::text`] answers with a final text (`stop_reason: end_turn`). A [`Step::tool_or_text`] is
//! either, as the results so far decide (a loop the results bound, such as reading pages). Past the
//! end of the script the answer is the text [`SCRIPT_EXHAUSTED`].
//!
//! Every request is recorded ([`FakeAnthropic::requests`]).

use super::http::{read_request, HttpRequest};
use super::server_thread::ServerThread;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The text answer to every side request.
pub const SIDE_REPLY: &str = "Fake title";
/// The text answer of the main conversation once the script has run out.
pub const SCRIPT_EXHAUSTED: &str = "fake-anthropic: script exhausted";

/// Computes a tool call's input from the tool results the host sent back so far.
type InputFn = dyn Fn(&[ToolResult]) -> Value + Send + Sync;
/// The same, or `None` for no call at all.
type MaybeInputFn = dyn Fn(&[ToolResult]) -> Option<Value> + Send + Sync;

/// One answer of the main conversation.
#[derive(Clone)]
pub enum Step {
    /// Call tool `name`; the input is computed when the step is answered.
    Tool { name: String, input: Arc<InputFn> },
    /// End the turn with this text.
    Text(String),
    /// Call tool `name` if `input` computes an input, else end the turn with `otherwise`: for a
    /// loop whose length the results decide (reading pages until there is no next one), written
    /// as enough of these steps in a row.
    ToolOrText {
        name: String,
        input: Arc<MaybeInputFn>,
        otherwise: String,
    },
}

impl Step {
    /// A tool call whose input depends on earlier results (e.g. an id they returned).
    pub fn tool(
        name: impl Into<String>,
        input: impl Fn(&[ToolResult]) -> Value + Send + Sync + 'static,
    ) -> Self {
        Step::Tool {
            name: name.into(),
            input: Arc::new(input),
        }
    }

    /// A tool call with a fixed input.
    pub fn tool_json(name: impl Into<String>, input: Value) -> Self {
        Self::tool(name, move |_| input.clone())
    }

    /// The final text answer.
    pub fn text(text: impl Into<String>) -> Self {
        Step::Text(text.into())
    }

    /// A tool call while `input` computes one from the results so far, else the final text.
    pub fn tool_or_text(
        name: impl Into<String>,
        input: impl Fn(&[ToolResult]) -> Option<Value> + Send + Sync + 'static,
        otherwise: impl Into<String>,
    ) -> Self {
        Step::ToolOrText {
            name: name.into(),
            input: Arc::new(input),
            otherwise: otherwise.into(),
        }
    }
}

/// A `tool_result` block the host sent, joined with the `tool_use` it answers.
#[derive(Clone, Debug)]
pub struct ToolResult {
    pub tool_use_id: String,
    /// Name of the tool called (from the matching `tool_use` block; empty if none matched).
    pub name: String,
    /// The input the tool was called with.
    pub input: Value,
    /// The block's `content` as sent (a string or an array of content blocks).
    pub content: Value,
    /// The text of `content` (text blocks joined by newlines).
    pub text: String,
    pub is_error: bool,
}

impl ToolResult {
    /// `text` parsed as JSON (the gateway's results and errors are JSON text).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| {
            panic!(
                "the {} result the model saw is not JSON ({e}): {}",
                self.name, self.text
            )
        })
    }
}

/// How a request was classified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A messages request carrying the scripted tools.
    Main,
    /// Any other messages request.
    Side,
    CountTokens,
    Probe,
    NotFound,
}

/// One HTTP request the fake received.
#[derive(Clone, Debug)]
pub struct RecordedRequest {
    pub index: usize,
    pub at: Instant,
    pub method: String,
    /// The request target, e.g. `/v1/messages?beta=true`.
    pub path: String,
    /// Header names in lowercase.
    pub headers: Vec<(String, String)>,
    /// The JSON body (`Null` when there is none, a string when it is not JSON).
    pub body: Value,
    pub kind: Kind,
    /// For a main request: the step answered (index into the script).
    pub step: Option<usize>,
}

impl RecordedRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn messages(&self) -> &[Value] {
        self.body
            .get("messages")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    /// Names of the tools offered.
    pub fn tool_names(&self) -> Vec<String> {
        tool_names(&self.body)
    }

    /// Every `tool_result` block in the request, in order, with its `tool_use`.
    pub fn tool_results(&self) -> Vec<ToolResult> {
        tool_results(self.messages())
    }

    /// A one-line description, for failure messages.
    pub fn summary(&self) -> String {
        format!(
            "#{} {:?} {} {} step={:?} messages={} tools={}",
            self.index,
            self.kind,
            self.method,
            self.path,
            self.step,
            self.messages().len(),
            self.tool_names().len()
        )
    }
}

struct State {
    requests: Vec<RecordedRequest>,
    /// Script steps that could not be answered, with why.
    failures: Vec<String>,
}

struct Shared {
    state: Mutex<State>,
    script: Vec<Step>,
    main_tool_prefix: String,
}

/// The fake Anthropic API server. Stops (and drops open connections) when dropped.
pub struct FakeAnthropic {
    shared: Arc<Shared>,
    server: ServerThread,
}

impl FakeAnthropic {
    /// Binds 127.0.0.1:0 and serves `script` to the conversation whose tools start with
    /// `main_tool_prefix`.
    pub fn start(main_tool_prefix: &str, script: Vec<Step>) -> Self {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                requests: Vec::new(),
                failures: Vec::new(),
            }),
            script,
            main_tool_prefix: main_tool_prefix.to_owned(),
        });
        let serve_shared = shared.clone();
        let server = ServerThread::serve_connections("fake-anthropic", move |stream| {
            handle_connection(stream, serve_shared.clone())
        });
        FakeAnthropic { shared, server }
    }

    /// The value for `ANTHROPIC_BASE_URL`: `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.server.addr())
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared
            .state
            .lock()
            .expect("fake Anthropic state lock")
            .requests
            .clone()
    }

    /// Script steps that could not be answered (their input function panicked), with why.
    pub fn script_failures(&self) -> Vec<String> {
        self.shared
            .state
            .lock()
            .expect("fake Anthropic state lock")
            .failures
            .clone()
    }

    /// The main conversation's requests so far.
    pub fn main_requests(&self) -> Vec<RecordedRequest> {
        self.requests()
            .into_iter()
            .filter(|r| r.kind == Kind::Main)
            .collect()
    }

    /// The tool results of the longest main request: everything the host showed its model.
    pub fn final_tool_results(&self) -> Vec<ToolResult> {
        self.main_requests()
            .iter()
            .max_by_key(|r| r.messages().len())
            .map(RecordedRequest::tool_results)
            .unwrap_or_default()
    }
}

fn tool_names(body: &Value) -> Vec<String> {
    body.get("tools")
        .and_then(Value::as_array)
        .map(|tools| {
            tools
                .iter()
                .filter_map(|t| t.get("name").and_then(Value::as_str).map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Text of a content value: a string, or the `text` of its text blocks joined by newlines.
pub fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|b| b.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

fn blocks(message: &Value) -> &[Value] {
    message
        .get("content")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

fn tool_results(messages: &[Value]) -> Vec<ToolResult> {
    let uses: Vec<&Value> = messages
        .iter()
        .flat_map(blocks)
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("tool_use"))
        .collect();
    messages
        .iter()
        .flat_map(blocks)
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("tool_result"))
        .map(|b| {
            let id = b
                .get("tool_use_id")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            let used = uses
                .iter()
                .find(|u| u.get("id").and_then(Value::as_str) == Some(id.as_str()));
            let content = b.get("content").cloned().unwrap_or(Value::Null);
            ToolResult {
                name: used
                    .and_then(|u| u.get("name").and_then(Value::as_str))
                    .unwrap_or_default()
                    .to_owned(),
                input: used
                    .and_then(|u| u.get("input").cloned())
                    .unwrap_or(Value::Null),
                text: content_text(&content),
                content,
                is_error: b.get("is_error").and_then(Value::as_bool) == Some(true),
                tool_use_id: id,
            }
        })
        .collect()
}

/// The step a main request asks for: how many answers the conversation already holds (each
/// step is one answer). A turn that ends in text and is followed by a new user turn (the user's
/// next message, an interactive host's task notification) so moves on to the next step.
fn step_index(messages: &[Value]) -> usize {
    messages
        .iter()
        .filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
        .count()
}

/// The content blocks of one answer, and its stop reason.
fn answer(
    shared: &Shared,
    body: &Value,
    kind: Kind,
    step: Option<usize>,
) -> Result<(Vec<Value>, &'static str), String> {
    let text = |t: &str| Ok((vec![json!({"type": "text", "text": t})], "end_turn"));
    if kind != Kind::Main {
        return text(SIDE_REPLY);
    }
    let index = step.unwrap_or_default();
    let results = || {
        let messages = body
            .get("messages")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        tool_results(messages)
    };
    // A script that cannot compute its input (an earlier result lacked the id it needs) answers
    // 400, which Claude Code does not retry, with the reason: the run ends at once and the test's
    // assertions on the results say what went wrong.
    let compute = |name: &str, f: &dyn Fn(&[ToolResult]) -> Option<Value>| {
        let results = results();
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&results))).map_err(|panic| {
            let reason = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            format!("script step {index} ({name}) failed: {reason}")
        })
    };
    let tool_use = |name: &str, input: Value| {
        Ok((
            vec![json!({
                "type": "tool_use",
                "id": format!("toolu_fake_{index}"),
                "name": name,
                "input": input,
            })],
            "tool_use",
        ))
    };
    match shared.script.get(index) {
        Some(Step::Tool { name, input }) => {
            let input = compute(name, &|r| Some(input(r)))?.unwrap_or_default();
            tool_use(name, input)
        }
        Some(Step::ToolOrText {
            name,
            input,
            otherwise,
        }) => match compute(name, &|r| input(r))? {
            Some(input) => tool_use(name, input),
            None => text(otherwise),
        },
        Some(Step::Text(t)) => text(t),
        None => text(SCRIPT_EXHAUSTED),
    }
}

/// Serves requests on one connection until the client closes it (Claude Code keeps connections
/// alive).
async fn handle_connection(mut stream: TcpStream, shared: Arc<Shared>) {
    let mut pending = Vec::new();
    loop {
        let request = match read_request(&mut stream, &mut pending).await {
            Ok(Some(request)) => request,
            Ok(None) => return,
            Err(e) => {
                let body = error_body("invalid_request_error", &e.to_string());
                let _ =
                    write_response(&mut stream, 400, "application/json", body.to_string()).await;
                return;
            }
        };
        if handle_request(&mut stream, &shared, request).await.is_err() {
            return;
        }
    }
}

async fn handle_request(
    stream: &mut TcpStream,
    shared: &Shared,
    request: HttpRequest,
) -> io::Result<()> {
    let body = request.json();
    let route = request.path.split('?').next().unwrap_or("");
    let kind = match (request.method.as_str(), route) {
        ("POST", "/v1/messages") => {
            if tool_names(&body)
                .iter()
                .any(|n| n.starts_with(&shared.main_tool_prefix))
            {
                Kind::Main
            } else {
                Kind::Side
            }
        }
        ("POST", "/v1/messages/count_tokens") => Kind::CountTokens,
        ("GET" | "HEAD", "/") => Kind::Probe,
        _ => Kind::NotFound,
    };
    let step = (kind == Kind::Main).then(|| {
        step_index(
            body.get("messages")
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .unwrap_or_default(),
        )
    });
    let index = {
        let mut state = shared.state.lock().expect("fake Anthropic state lock");
        let index = state.requests.len();
        state.requests.push(RecordedRequest {
            index,
            at: Instant::now(),
            method: request.method.clone(),
            path: request.path.clone(),
            headers: request.headers.clone(),
            body: body.clone(),
            kind,
            step,
        });
        index
    };
    match kind {
        Kind::Probe => {
            // A HEAD answer announces no body: bytes after it would corrupt the next response
            // on this kept-alive connection.
            let body = if request.method == "HEAD" { "" } else { "ok" };
            write_response(stream, 200, "text/plain", body.into()).await
        }
        Kind::CountTokens => {
            // Claude Code counts large tool results this way before deciding whether to
            // truncate them (`MAX_MCP_OUTPUT_TOKENS`); a fixed small count would hide that, so
            // the estimate is the usual four characters per token.
            let tokens = (body.to_string().len() / 4).max(1);
            write_response(
                stream,
                200,
                "application/json",
                json!({"input_tokens": tokens}).to_string(),
            )
            .await
        }
        Kind::NotFound => {
            let body = error_body("not_found_error", &format!("no route {}", request.path));
            write_response(stream, 404, "application/json", body.to_string()).await
        }
        Kind::Main | Kind::Side => {
            let model = body
                .get("model")
                .and_then(Value::as_str)
                .unwrap_or("claude-fake")
                .to_owned();
            let (content, stop_reason) = match answer(shared, &body, kind, step) {
                Ok(answer) => answer,
                Err(reason) => {
                    shared
                        .state
                        .lock()
                        .expect("fake Anthropic state lock")
                        .failures
                        .push(reason.clone());
                    let body = error_body("invalid_request_error", &reason);
                    return write_response(stream, 400, "application/json", body.to_string()).await;
                }
            };
            let id = format!("msg_fake_{index}");
            if body.get("stream").and_then(Value::as_bool) == Some(true) {
                let events = sse_events(&id, &model, &content, stop_reason);
                write_response(stream, 200, "text/event-stream", events).await
            } else {
                let message = json!({
                    "id": id,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": content,
                    "stop_reason": stop_reason,
                    "stop_sequence": null,
                    "usage": usage(10),
                });
                write_response(stream, 200, "application/json", message.to_string()).await
            }
        }
    }
}

fn usage(output_tokens: u64) -> Value {
    json!({
        "input_tokens": 100,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    })
}

/// The whole SSE body of a streamed answer. Text and tool input are each sent in two deltas, so
/// that the client has to join them as it does for the real API.
fn sse_events(id: &str, model: &str, content: &[Value], stop_reason: &str) -> String {
    let mut out = String::new();
    let mut event = |name: &str, data: Value| {
        out.push_str(&format!("event: {name}\ndata: {data}\n\n"));
    };
    event(
        "message_start",
        json!({"type": "message_start", "message": {
            "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": null, "stop_sequence": null, "usage": usage(1),
        }}),
    );
    for (index, block) in content.iter().enumerate() {
        let kind = block
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let (start, deltas): (Value, Vec<Value>) = if kind == "tool_use" {
            let input = block.get("input").cloned().unwrap_or(json!({})).to_string();
            let (a, b) = split_half(&input);
            (
                json!({"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}),
                vec![
                    json!({"type": "input_json_delta", "partial_json": a}),
                    json!({"type": "input_json_delta", "partial_json": b}),
                ],
            )
        } else {
            let text = block
                .get("text")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let (a, b) = split_half(text);
            (
                json!({"type": "text", "text": ""}),
                vec![
                    json!({"type": "text_delta", "text": a}),
                    json!({"type": "text_delta", "text": b}),
                ],
            )
        };
        event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": start}),
        );
        for delta in deltas {
            event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": delta}),
            );
        }
        event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        );
    }
    event(
        "message_delta",
        json!({"type": "message_delta",
               "delta": {"stop_reason": stop_reason, "stop_sequence": null},
               "usage": {"output_tokens": 10}}),
    );
    event("message_stop", json!({"type": "message_stop"}));
    out
}

/// Splits at a char boundary near the middle.
fn split_half(s: &str) -> (&str, &str) {
    let mut mid = s.len() / 2;
    while !s.is_char_boundary(mid) {
        mid += 1;
    }
    s.split_at(mid)
}

fn error_body(kind: &str, message: &str) -> Value {
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

async fn write_response(
    stream: &mut TcpStream,
    status: u16,
    content_type: &str,
    body: String,
) -> io::Result<()> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        _ => "Not Found",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\
         request-id: req_fake\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.flush().await
}

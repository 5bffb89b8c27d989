//! A scripted OpenAI Responses API on 127.0.0.1, the model of a host (OpenAI Codex) under test.
//!
//! [`FakeResponses::start`] binds `127.0.0.1:0` and serves on its own thread (its own tokio
//! runtime), like [`FakeLlm`](super::fake_llm::FakeLlm), so it works from sync tests and stops
//! when dropped. The host reaches it as a custom model provider whose `base_url` is
//! [`FakeResponses::url`] (`http://127.0.0.1:<port>/v1`).
//!
//! # Routes
//!
//! - `POST /v1/responses`: the next [`Step`] of the script, as `text/event-stream` (what Codex
//!   asks for): `response.created`, then per output item `response.output_item.added`,
//!   (`response.output_text.delta` for text), `response.output_item.done`, and last
//!   `response.completed` with a usage block. The n-th such request gets step n; past the end of
//!   the script it gets the text [`SCRIPT_EXHAUSTED`].
//! - anything else: 404 with an OpenAI-style error body.
//!
//! Every request is recorded ([`FakeResponses::requests`]).
//!
//! # What the host showed its model
//!
//! A Responses client without server-side storage (Codex sends `"store": false`) resends the
//! whole conversation in every request's `input`: the model's `function_call` items and the host's
//! `function_call_output` items. [`FakeResponses::tool_outputs`] reads them back from the latest
//! request, so a test sees exactly what the host put in front of its model for each tool call,
//! and a [`Call`]'s arguments can be computed from the outputs so far (a task id returned by an
//! earlier call, say).

use super::http::{read_request, HttpRequest};
use super::server_thread::ServerThread;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The text answered once the script has no step left.
pub const SCRIPT_EXHAUSTED: &str = "fake-responses: the script has no step left";

/// Computes a call's arguments from the tool outputs the host has sent back so far.
pub type ArgsFn = Box<dyn Fn(&[ToolOutput]) -> Result<Value, String> + Send + Sync>;

/// One function call the fake model makes.
pub struct Call {
    /// The Responses `namespace` of the tool (Codex offers an MCP server's tools as one
    /// `namespace` tool, `mcp__<server>`), or `None` for a plain function tool.
    pub namespace: Option<String>,
    pub name: String,
    pub arguments: ArgsFn,
}

impl Call {
    /// A call with fixed arguments.
    pub fn new(namespace: Option<&str>, name: &str, arguments: Value) -> Self {
        Self::with(namespace, name, move |_| Ok(arguments.clone()))
    }

    /// A call whose arguments are computed from the outputs so far when its turn comes; an `Err`
    /// ends the script (the model answers [`FakeResponses::script_errors`]' text instead).
    pub fn with(
        namespace: Option<&str>,
        name: &str,
        arguments: impl Fn(&[ToolOutput]) -> Result<Value, String> + Send + Sync + 'static,
    ) -> Self {
        Call {
            namespace: namespace.map(str::to_owned),
            name: name.to_owned(),
            arguments: Box::new(arguments),
        }
    }
}

/// Computes a call's arguments from the outputs so far, or `None` for no call.
pub type MaybeArgsFn = Box<dyn Fn(&[ToolOutput]) -> Result<Option<Value>, String> + Send + Sync>;

/// One answer of the fake model.
pub enum Step {
    /// Function calls in one response (more than one: the host may run them in parallel).
    Calls(Vec<Call>),
    /// A final assistant message: the turn ends.
    Text(String),
    /// One call of `name` if `arguments` computes arguments from the outputs so far, else the
    /// final message `otherwise`: for a loop whose length the results decide (reading pages
    /// until there is no next one), written as enough of these steps in a row.
    CallOrText {
        namespace: Option<String>,
        name: String,
        arguments: MaybeArgsFn,
        otherwise: String,
    },
}

/// A tool call and what the host sent back for it, read from a request's `input`.
#[derive(Clone, Debug)]
pub struct ToolOutput {
    pub call_id: String,
    pub namespace: Option<String>,
    pub name: String,
    /// The call's arguments as the model sent them (a JSON string).
    pub arguments: String,
    /// The `output` field as the host sent it (a string, or a list of content items).
    pub output: Value,
}

impl ToolOutput {
    /// The output's text: the string itself, or the `text` of every content item joined by
    /// newlines.
    pub fn text(&self) -> String {
        match &self.output {
            Value::String(s) => s.clone(),
            Value::Array(items) => items
                .iter()
                .filter_map(|i| i.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n"),
            other => other.to_string(),
        }
    }
}

/// One HTTP request the fake received.
#[derive(Clone, Debug)]
pub struct RecordedRequest {
    pub index: usize,
    pub at: Instant,
    pub method: String,
    pub path: String,
    /// Header names in lowercase.
    pub headers: Vec<(String, String)>,
    /// The JSON body (`Null` when there is none, a string when it is not JSON).
    pub body: Value,
    /// The script step this request was answered with (`None`: not a responses request, or past
    /// the end of the script).
    pub step: Option<usize>,
}

impl RecordedRequest {
    pub fn is_responses(&self) -> bool {
        self.method == "POST" && self.path.starts_with("/v1/responses")
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The `input` items.
    pub fn input(&self) -> &[Value] {
        self.body
            .get("input")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    /// The tools offered (`tools`).
    pub fn tools(&self) -> &[Value] {
        self.body
            .get("tools")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    /// Every `function_call` of the input paired with its `function_call_output`, in call order
    /// (calls without an output yet are left out).
    pub fn tool_outputs(&self) -> Vec<ToolOutput> {
        let input = self.input();
        let field =
            |item: &Value, key: &str| item.get(key).and_then(Value::as_str).map(str::to_owned);
        input
            .iter()
            .filter(|i| i.get("type").and_then(Value::as_str) == Some("function_call"))
            .filter_map(|call| {
                let call_id = field(call, "call_id")?;
                let output = input.iter().find(|o| {
                    o.get("type").and_then(Value::as_str) == Some("function_call_output")
                        && o.get("call_id").and_then(Value::as_str) == Some(call_id.as_str())
                })?;
                Some(ToolOutput {
                    namespace: field(call, "namespace"),
                    name: field(call, "name").unwrap_or_default(),
                    arguments: field(call, "arguments").unwrap_or_default(),
                    output: output.get("output").cloned().unwrap_or(Value::Null),
                    call_id,
                })
            })
            .collect()
    }
}

#[derive(Default)]
struct State {
    requests: Vec<RecordedRequest>,
    /// Steps handed out so far.
    next_step: usize,
    /// Steps whose arguments could not be computed.
    errors: Vec<String>,
}

struct Shared {
    script: Vec<Step>,
    state: Mutex<State>,
}

/// The fake Responses API. Stops (and drops open connections) when dropped.
pub struct FakeResponses {
    shared: Arc<Shared>,
    server: ServerThread,
}

impl FakeResponses {
    /// Binds 127.0.0.1:0 and starts serving `script` on a dedicated thread.
    pub fn start(script: Vec<Step>) -> Self {
        let shared = Arc::new(Shared {
            script,
            state: Mutex::new(State::default()),
        });
        let serve_shared = shared.clone();
        let server = ServerThread::serve_connections("fake-responses", move |stream| {
            handle_connection(stream, serve_shared.clone())
        });
        FakeResponses { shared, server }
    }

    /// The provider base URL: `http://127.0.0.1:<port>/v1`.
    pub fn url(&self) -> String {
        format!("http://{}/v1", self.server.addr())
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.lock().requests.clone()
    }

    /// How many script steps have been answered.
    pub fn steps_served(&self) -> usize {
        self.lock().next_step
    }

    /// Why steps failed to compute their arguments (empty when none did).
    pub fn script_errors(&self) -> Vec<String> {
        self.lock().errors.clone()
    }

    /// The tool calls and outputs of the latest responses request: everything the host has
    /// shown its model so far.
    pub fn tool_outputs(&self) -> Vec<ToolOutput> {
        self.lock()
            .requests
            .iter()
            .rev()
            .find(|r| r.is_responses())
            .map(RecordedRequest::tool_outputs)
            .unwrap_or_default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared.state.lock().expect("fake responses state lock")
    }
}

/// Serves requests on one connection until the client closes it (clients keep connections
/// alive between turns).
async fn handle_connection(mut stream: TcpStream, shared: Arc<Shared>) {
    let mut buf = Vec::new();
    loop {
        let request = match read_request(&mut stream, &mut buf).await {
            Ok(Some(request)) => request,
            Ok(None) => return,
            Err(e) => {
                let body = error_body(&e.to_string());
                let _ = write_response(&mut stream, 400, "application/json", &body).await;
                return;
            }
        };
        if let Some(encoding) = request.header("content-encoding") {
            // Compressed bodies cannot be recorded as JSON; fail loudly rather than guess.
            let body = error_body(&format!(
                "content-encoding {encoding} is not supported by the fake"
            ));
            let _ = write_response(&mut stream, 400, "application/json", &body).await;
            return;
        }
        let (status, content_type, body) = answer(&shared, request);
        if write_response(&mut stream, status, content_type, &body)
            .await
            .is_err()
        {
            return;
        }
    }
}

/// Records `request` and computes the answer: (status, content type, body).
fn answer(shared: &Shared, request: HttpRequest) -> (u16, &'static str, Vec<u8>) {
    let body: Value = if request.body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&request.body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&request.body).into_owned()))
    };
    let mut state = shared.state.lock().expect("fake responses state lock");
    let index = state.requests.len();
    let mut recorded = RecordedRequest {
        index,
        at: Instant::now(),
        method: request.method,
        path: request.path,
        headers: request.headers,
        body,
        step: None,
    };
    if !recorded.is_responses() {
        state.requests.push(recorded);
        let body = error_body(&format!("no route for this request (#{index})"));
        return (404, "application/json", body);
    }
    let step_index = state.next_step;
    let events = match shared.script.get(step_index) {
        None => text_events(index, SCRIPT_EXHAUSTED),
        Some(step) => {
            state.next_step += 1;
            recorded.step = Some(step_index);
            match step {
                Step::Text(text) => text_events(index, text),
                Step::CallOrText {
                    namespace,
                    name,
                    arguments,
                    otherwise,
                } => match arguments(&recorded.tool_outputs()) {
                    Ok(Some(arguments)) => {
                        let call = Call::new(namespace.as_deref(), name, Value::Null);
                        items_events(index, vec![function_call_item(index, 0, &call, &arguments)])
                    }
                    Ok(None) => text_events(index, otherwise),
                    Err(e) => {
                        let e = format!("step {step_index} ({name}): {e}");
                        state.errors.push(e.clone());
                        text_events(index, &format!("fake-responses: script error: {e}"))
                    }
                },
                Step::Calls(calls) => {
                    let outputs = recorded.tool_outputs();
                    let computed: Result<Vec<Value>, String> = calls
                        .iter()
                        .enumerate()
                        .map(|(k, call)| {
                            let arguments = (call.arguments)(&outputs)
                                .map_err(|e| format!("step {step_index} ({}): {e}", call.name))?;
                            Ok(function_call_item(index, k, call, &arguments))
                        })
                        .collect();
                    match computed {
                        Ok(items) => items_events(index, items),
                        Err(e) => {
                            state.errors.push(e.clone());
                            text_events(index, &format!("fake-responses: script error: {e}"))
                        }
                    }
                }
            }
        }
    };
    state.requests.push(recorded);
    let mut sse = String::new();
    for event in events {
        let kind = event["type"].as_str().unwrap_or_default().to_owned();
        sse.push_str(&format!("event: {kind}\ndata: {event}\n\n"));
    }
    (200, "text/event-stream", sse.into_bytes())
}

fn function_call_item(request: usize, k: usize, call: &Call, arguments: &Value) -> Value {
    let mut item = json!({
        "type": "function_call",
        "id": format!("fc_{request}_{k}"),
        "call_id": format!("call_{request}_{k}"),
        "name": call.name,
        "arguments": arguments.to_string(),
        "status": "completed",
    });
    if let Some(namespace) = &call.namespace {
        item["namespace"] = json!(namespace);
    }
    item
}

/// The events of one response holding a single assistant message.
fn text_events(request: usize, text: &str) -> Vec<Value> {
    let id = format!("msg_{request}");
    let item = json!({
        "type": "message",
        "role": "assistant",
        "id": id,
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    });
    let mut events = vec![created(request)];
    events.push(json!({"type": "response.output_item.added", "output_index": 0, "item": item}));
    events.push(json!({
        "type": "response.output_text.delta",
        "item_id": id,
        "output_index": 0,
        "content_index": 0,
        "delta": text,
    }));
    events.push(json!({"type": "response.output_item.done", "output_index": 0, "item": item}));
    events.push(completed(request));
    events
}

/// The events of one response holding `items` (function calls).
fn items_events(request: usize, items: Vec<Value>) -> Vec<Value> {
    let mut events = vec![created(request)];
    for (k, item) in items.into_iter().enumerate() {
        events.push(json!({"type": "response.output_item.added", "output_index": k, "item": item}));
        events.push(json!({"type": "response.output_item.done", "output_index": k, "item": item}));
    }
    events.push(completed(request));
    events
}

fn created(request: usize) -> Value {
    json!({"type": "response.created", "response": {"id": format!("resp_{request}")}})
}

fn completed(request: usize) -> Value {
    json!({
        "type": "response.completed",
        "response": {
            "id": format!("resp_{request}"),
            "usage": {
                "input_tokens": 100,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": 10,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": 110,
            },
        },
    })
}

fn error_body(message: &str) -> Vec<u8> {
    json!({"error": {"message": message, "type": "invalid_request_error", "code": null}})
        .to_string()
        .into_bytes()
}

async fn write_response(
    stream: &mut TcpStream,
    status: u16,
    content_type: &str,
    body: &[u8],
) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        _ => "Error",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    stream.flush().await
}

//! A scripted, OpenAI-compatible LLM on 127.0.0.1 for OpenCode to talk to.
//!
//! [`FakeLlm::start`] binds `127.0.0.1:0` and serves on its own thread (its own tokio runtime),
//! so it works from sync and async tests alike and stops when dropped. OpenCode reaches it through
//! the `fake` provider that [`OpenCodeEnv`](super::isolation::OpenCodeEnv) configures with
//! [`FakeLlm::url`] (`http://127.0.0.1:<port>/v1`).
//!
//! # Routes
//!
//! - `POST /v1/chat/completions`: scripted (below). With `"stream": true` (what OpenCode sends) the
//!   answer is `text/event-stream`: a role chunk, content or `tool_calls` chunks, a chunk with
//!   `finish_reason` (`stop` or `tool_calls`), a usage chunk (100 prompt tokens unless
//!   `[[usage:<n>]]` says otherwise, + 10 completion tokens), then `data: [DONE]`. Without it, one
//!   `chat.completion` JSON object.
//! - `GET /v1/models`: lists `fake-model`, `fake-strong` and `fake-small`.
//! - anything else: 404 with an OpenAI-style error body.
//!
//! Every request is recorded ([`FakeLlm::requests`]), and so is the end of every streamed answer,
//! including whether the client hung up first ([`FakeLlm::stream_ends`]).
//!
//! # Script: markers in the last user message
//!
//! The fake reads the text of the last `user` message of a chat request (its text parts joined by
//! newlines) and acts on the markers in it. Without markers it answers **`ECHO: <first line>`**,
//! where `<first line>` is the first non-empty line of that text, trimmed, markers included; so
//! every task gets its own, predictable reply. Markers (none may contain `]]`):
//!
//! | marker | effect |
//! |---|---|
//! | `[[bash:<cmd>]]` | answer with a `bash` tool call `{"command": "<cmd>"}` |
//! | `[[bashin:<workdir>:<cmd>]]` | the same with `"workdir": "<workdir>"` (`<workdir>` has no `:`) |
//! | `[[write:<path>:<content>]]` | answer with a `write` tool call `{"filePath": "<path>", "content": "<content>"}`; `<path>` has no `:`; `\n` in `<content>` becomes a newline. A relative path is taken relative to the session directory (missing dirs are created). |
//! | `[[slow:<ms>]]` | stream the text answer in 10 chunks spread over about `<ms>` ms; if the client hangs up meanwhile, the [`StreamEnd`] says so (for abort tests) |
//! | `[[delay:<ms>]]` | wait `<ms>` ms before answering at all (also before an error) |
//! | `[[error400]]` | HTTP 400 with an OpenAI-style error body whose message is [`ERROR_400_MESSAGE`] (not retried: OpenCode reports a `session.error`) |
//! | `[[error500:<retry-after-ms>]]` | HTTP 500 with header `retry-after-ms: <retry-after-ms>` and message [`ERROR_500_MESSAGE`], on every attempt |
//! | `[[error500:<retry-after-ms>:<n>]]` | the same for the first `<n>` attempts of this turn, then the normal answer |
//! | `[[error500]]` | HTTP 500 without a retry header, on every attempt |
//! | `[[usage:<n>]]` | the usage chunk of every answer to this request reports `<n>` prompt tokens (instead of 100): with a small-context model (`fake-small`, see [`OpenCodeEnv::with_small_model`](super::isolation::OpenCodeEnv::with_small_model)) this makes OpenCode auto-compact after the step |
//! | `[[answers:<a1>;;<a2>;;...]]` | in **any** user message of the request (so it outlives follow-ups the test did not write): the text answer is `<ak>`, where `k` is the number of user messages in the request (the last one for more), in place of the echo; `\n` becomes a newline and `{{`/`}}` become `[[`/`]]` (so an answer can carry a marker into what the gateway sends back, e.g. a validation error quoting it). For turn-by-turn answers in one session, e.g. a wrong structured answer, then a right one |
//! | `[[parallel]]` | issue every tool marker of the prompt at once, as one step with several `tool_calls` (OpenCode runs them side by side, e.g. two subagents); the next step answers with text |
//! | `[[task:<subagent_type>:<prompt>]]` | answer with a `task` tool call `{"description": "<first words of prompt>", "prompt": "<prompt>", "subagent_type": "<subagent_type>"}` (a subagent in a child session); `<prompt>` cannot hold `]]`, so write `{{`/`}}` for `[[`/`]]`: `[[task:general:{{bash:touch x}}]]` makes the child run `[[bash:touch x]]` |
//!
//! OpenCode 1.18.33 retries a 500 five times (six requests in all), waiting `retry-after-ms` when
//! given, else 2 s, 4 s, 8 s, 16 s, 32 s (plus up to 25 % jitter), then reports a `session.error`
//! (`APIError`, `isRetryable: true`). So `[[error500:<ms>]]` gives up after about `5 × <ms>`, and
//! `[[error500]]` after more than a minute.
//!
//! Tool markers (`bash`, `write`, `task`) run one per step, in the order written: a request whose messages after the last
//! user message already hold `k` assistant tool-call messages gets the `k+1`-th tool call, and once
//! all have been issued the final text answer (`ECHO: <first line>`). So `[[bash:ls]]` makes two
//! LLM calls: the tool call, then (carrying the tool result) the text. A tool marker for a tool that
//! is not in the request's `tools` array is skipped. Errors win over tool calls and text.
//! "Attempts of this turn" are earlier requests with the same `x-session-id` header, the same
//! last-user text and the same number of messages.
//!
//! A session created without a title costs one extra request before the turn's own: OpenCode asks
//! for a title (no tools; see [`RecordedRequest::is_title_request`]); the fake echoes, so the title
//! becomes `ECHO: <first line>`.

use super::http::read_request;
use super::server_thread::ServerThread;
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The `error.message` of a scripted 400.
pub const ERROR_400_MESSAGE: &str = "fake-llm: scripted bad request ([[error400]])";
/// The `error.message` of a scripted 500.
pub const ERROR_500_MESSAGE: &str = "fake-llm: scripted server error ([[error500]])";
/// Prompt tokens reported in every usage chunk.
pub const USAGE_PROMPT_TOKENS: u64 = 100;
/// Completion tokens reported in every usage chunk.
pub const USAGE_COMPLETION_TOKENS: u64 = 10;

/// One scripting marker found in a prompt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Marker {
    Bash(String),
    /// `[[bashin:<workdir>:<cmd>]]`: a `bash` tool call that passes `workdir`.
    BashIn {
        workdir: String,
        command: String,
    },
    Write {
        path: String,
        content: String,
    },
    Slow {
        ms: u64,
    },
    Delay {
        ms: u64,
    },
    Error400,
    Error500 {
        retry_after_ms: Option<u64>,
        times: Option<u64>,
    },
    /// `[[usage:<n>]]`: report `n` prompt tokens in the usage chunk.
    Usage {
        prompt_tokens: u64,
    },
    /// `[[answers:<a1>;;<a2>...]]`: the text answer by the number of user messages.
    Answers(Vec<String>),
    /// `[[task:<subagent_type>:<prompt>]]`: a `task` tool call (`{{`/`}}` in the prompt already
    /// turned into `[[`/`]]`).
    Task {
        subagent_type: String,
        prompt: String,
    },
    /// `[[parallel]]`: all tool calls in one step.
    Parallel,
}

/// What the fake answered.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    /// Not answered yet (the request is being delayed or streamed).
    Pending,
    /// The client hung up during a `[[delay]]`, before any answer.
    ClientClosed,
    Text {
        text: String,
        slow_ms: Option<u64>,
    },
    ToolCall {
        id: String,
        name: String,
        arguments: Value,
    },
    /// `[[parallel]]`: several tool calls in one step, as (id, name, arguments).
    ToolCalls(Vec<(String, String, Value)>),
    Error {
        status: u16,
        message: String,
    },
    Models,
    NotFound,
    BadRequest(String),
}

/// One HTTP request the fake received.
#[derive(Clone, Debug)]
pub struct RecordedRequest {
    /// Position in [`FakeLlm::requests`].
    pub index: usize,
    pub at: Instant,
    pub method: String,
    /// The request target, e.g. `/v1/chat/completions`.
    pub path: String,
    /// Header names in lowercase.
    pub headers: Vec<(String, String)>,
    /// The JSON body (`Null` when there is none).
    pub body: Value,
    pub model: String,
    pub stream: bool,
    pub messages: Vec<Value>,
    /// Names of the tools offered.
    pub tools: Vec<String>,
    /// Text of the last user message (text parts joined by newlines).
    pub last_user_text: String,
    pub markers: Vec<Marker>,
    pub reply: Reply,
}

impl RecordedRequest {
    pub fn is_chat(&self) -> bool {
        self.method == "POST" && self.path.starts_with("/v1/chat/completions")
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// OpenCode's `x-session-id` header.
    pub fn session_id(&self) -> Option<&str> {
        self.header("x-session-id")
    }

    /// The roles of the messages, in order.
    pub fn roles(&self) -> Vec<&str> {
        self.messages
            .iter()
            .map(|m| m.get("role").and_then(Value::as_str).unwrap_or(""))
            .collect()
    }

    /// The text of every `tool` message (tool results), in order.
    pub fn tool_results(&self) -> Vec<String> {
        self.messages
            .iter()
            .filter(|m| m.get("role").and_then(Value::as_str) == Some("tool"))
            .map(|m| content_text(m.get("content").unwrap_or(&Value::Null)))
            .collect()
    }

    /// The system prompt (text of the `system` messages).
    pub fn system_text(&self) -> String {
        self.messages
            .iter()
            .filter(|m| m.get("role").and_then(Value::as_str) == Some("system"))
            .map(|m| content_text(m.get("content").unwrap_or(&Value::Null)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// OpenCode's session-title request (sent when a session is created without a title): its
    /// system prompt starts "You are a title generator" and it offers no tools.
    pub fn is_title_request(&self) -> bool {
        self.is_chat()
            && self.tools.is_empty()
            && self.system_text().contains("You are a title generator")
    }

    /// A one-line summary for assertion messages.
    pub fn summary(&self) -> String {
        format!(
            "#{} {} {} model={} stream={} roles={:?} last_user={:?} reply={:?}",
            self.index,
            self.method,
            self.path,
            self.model,
            self.stream,
            self.roles(),
            self.last_user_text.lines().next().unwrap_or(""),
            self.reply
        )
    }
}

/// The end of one streamed (SSE) answer.
#[derive(Clone, Debug)]
pub struct StreamEnd {
    /// Index of the request in [`FakeLlm::requests`].
    pub request: usize,
    pub at: Instant,
    /// SSE frames written before the end.
    pub chunks_sent: usize,
    /// The client closed the connection before the answer was complete.
    pub client_closed: bool,
}

#[derive(Default)]
struct State {
    requests: Vec<RecordedRequest>,
    stream_ends: Vec<StreamEnd>,
}

struct Shared {
    state: Mutex<State>,
    /// Bumped after every change to `state` (never while holding its lock).
    changed: watch::Sender<u64>,
}

impl Shared {
    fn update<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let result = {
            let mut state = self.state.lock().expect("fake LLM state lock");
            f(&mut state)
        };
        self.changed.send_modify(|n| *n += 1);
        result
    }

    fn read<R>(&self, f: impl FnOnce(&State) -> R) -> R {
        let state = self.state.lock().expect("fake LLM state lock");
        f(&state)
    }
}

/// What a [`FakeLlm`] received, shareable beyond a borrow of it: for a scripted host model
/// (whose steps run on the host fake's own thread) that waits for a task's request before it
/// answers.
#[derive(Clone)]
pub struct Received(Arc<Shared>);

impl Received {
    /// Blocks the calling thread until a request matching `pred` has arrived (`true`) or
    /// `within` has passed (`false`), looking every 20 ms.
    pub fn wait_blocking(&self, within: Duration, pred: impl Fn(&RecordedRequest) -> bool) -> bool {
        let deadline = std::time::Instant::now() + within;
        loop {
            if self.0.read(|s| s.requests.iter().any(&pred)) {
                return true;
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The fake LLM server. Stops (and drops open connections) when dropped.
pub struct FakeLlm {
    shared: Arc<Shared>,
    server: ServerThread,
}

impl FakeLlm {
    /// Binds 127.0.0.1:0 and starts serving on a dedicated thread.
    pub fn start() -> Self {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            changed: watch::channel(0).0,
        });
        let serve_shared = shared.clone();
        let server = ServerThread::serve_connections("fake-llm", move |stream| {
            handle_connection(stream, serve_shared.clone())
        });
        FakeLlm { shared, server }
    }

    /// The base URL for an OpenAI-compatible client: `http://127.0.0.1:<port>/v1`.
    pub fn url(&self) -> String {
        format!("http://{}/v1", self.server.addr())
    }

    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// A handle on the requests it receives, for another thread.
    pub fn received(&self) -> Received {
        Received(self.shared.clone())
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.read(|s| s.requests.clone())
    }

    /// The chat completion requests so far.
    pub fn chat_requests(&self) -> Vec<RecordedRequest> {
        self.shared
            .read(|s| s.requests.iter().filter(|r| r.is_chat()).cloned().collect())
    }

    /// Every finished SSE answer so far.
    pub fn stream_ends(&self) -> Vec<StreamEnd> {
        self.shared.read(|s| s.stream_ends.clone())
    }

    /// Waits until at least `n` requests have arrived and returns them all. Panics after
    /// `timeout` listing what did arrive.
    pub async fn wait_for_requests(&self, n: usize, timeout: Duration) -> Vec<RecordedRequest> {
        self.wait_until(timeout, &format!("{n} requests"), |s| {
            (s.requests.len() >= n).then(|| s.requests.clone())
        })
        .await
    }

    /// Waits until a request matching `pred` has arrived and returns the first such one.
    /// Panics after `timeout`.
    pub async fn wait_for_request(
        &self,
        timeout: Duration,
        pred: impl Fn(&RecordedRequest) -> bool,
    ) -> RecordedRequest {
        self.wait_until(timeout, "a matching request", |s| {
            s.requests.iter().find(|r| pred(r)).cloned()
        })
        .await
    }

    /// Waits until the answer to request `index` has ended and returns how. Panics after
    /// `timeout`.
    pub async fn wait_for_stream_end(&self, index: usize, timeout: Duration) -> StreamEnd {
        self.wait_until(
            timeout,
            &format!("end of the stream for request #{index}"),
            |s| s.stream_ends.iter().find(|e| e.request == index).cloned(),
        )
        .await
    }

    /// Waits until `check` returns `Some` over the recorded state. Panics after `timeout`.
    async fn wait_until<R>(
        &self,
        timeout: Duration,
        what: &str,
        check: impl Fn(&State) -> Option<R>,
    ) -> R {
        let mut changes = self.shared.changed.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(found) = self.shared.read(&check) {
                return found;
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => panic!("fake LLM stopped while waiting for {what}"),
                Err(_) => {
                    let seen: Vec<String> = self.requests().iter().map(|r| r.summary()).collect();
                    panic!(
                        "fake LLM: timed out after {timeout:?} waiting for {what}; requests:\n{}",
                        seen.join("\n")
                    );
                }
            }
        }
    }
}

/// Finds the markers in `text`, in order. Unknown `[[...]]` are not markers.
pub fn parse_markers(text: &str) -> Vec<Marker> {
    let mut markers = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("[[") {
        let after = &rest[start + 2..];
        let Some(end) = after.find("]]") else { break };
        let inner = &after[..end];
        if let Some(marker) = parse_marker(inner) {
            markers.push(marker);
            rest = &after[end + 2..];
        } else {
            rest = after;
        }
    }
    markers
}

fn parse_marker(inner: &str) -> Option<Marker> {
    let (name, arg) = match inner.split_once(':') {
        Some((name, arg)) => (name, Some(arg)),
        None => (inner, None),
    };
    let ms = |s: &str| s.trim().parse::<u64>().ok();
    match (name, arg) {
        ("bash", Some(cmd)) => Some(Marker::Bash(cmd.to_owned())),
        ("bashin", Some(arg)) => {
            let (workdir, command) = arg.split_once(':')?;
            Some(Marker::BashIn {
                workdir: workdir.to_owned(),
                command: command.to_owned(),
            })
        }
        ("write", Some(arg)) => {
            let (path, content) = arg.split_once(':')?;
            Some(Marker::Write {
                path: path.to_owned(),
                content: content.replace("\\n", "\n"),
            })
        }
        ("answers", Some(arg)) => Some(Marker::Answers(
            arg.split(";;")
                .map(|a| {
                    a.replace("\\n", "\n")
                        .replace("{{", "[[")
                        .replace("}}", "]]")
                })
                .collect(),
        )),
        ("slow", Some(arg)) => Some(Marker::Slow { ms: ms(arg)? }),
        ("delay", Some(arg)) => Some(Marker::Delay { ms: ms(arg)? }),
        ("error400", None) => Some(Marker::Error400),
        ("parallel", None) => Some(Marker::Parallel),
        ("error500", None) => Some(Marker::Error500 {
            retry_after_ms: None,
            times: None,
        }),
        ("usage", Some(arg)) => Some(Marker::Usage {
            prompt_tokens: ms(arg)?,
        }),
        ("task", Some(arg)) => {
            let (subagent_type, prompt) = arg.split_once(':')?;
            if subagent_type.is_empty() {
                return None;
            }
            Some(Marker::Task {
                subagent_type: subagent_type.to_owned(),
                prompt: prompt.replace("{{", "[[").replace("}}", "]]"),
            })
        }
        ("error500", Some(arg)) => {
            let (retry, times) = match arg.split_once(':') {
                Some((retry, times)) => (Some(ms(retry)?), Some(ms(times)?)),
                None => (Some(ms(arg)?), None),
            };
            Some(Marker::Error500 {
                retry_after_ms: retry,
                times,
            })
        }
        _ => None,
    }
}

/// The text of an OpenAI message `content`: a string, or the `text` of its text parts joined by
/// newlines.
pub fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// The default answer to a prompt: `ECHO: <first non-empty line>`.
pub fn echo_reply(prompt: &str) -> String {
    let first = prompt
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    format!("ECHO: {first}")
}

/// What to send back for one chat request, decided from the request and the history.
enum Plan {
    Error {
        status: u16,
        message: String,
        extra_headers: Vec<(String, String)>,
    },
    ToolCall {
        id: String,
        name: String,
        arguments: Value,
    },
    ToolCalls(Vec<(String, String, Value)>),
    Text {
        text: String,
        slow_ms: Option<u64>,
    },
}

impl Plan {
    fn reply(&self) -> Reply {
        match self {
            Plan::Error {
                status, message, ..
            } => Reply::Error {
                status: *status,
                message: message.clone(),
            },
            Plan::ToolCall {
                id,
                name,
                arguments,
            } => Reply::ToolCall {
                id: id.clone(),
                name: name.clone(),
                arguments: arguments.clone(),
            },
            Plan::ToolCalls(calls) => Reply::ToolCalls(calls.clone()),
            Plan::Text { text, slow_ms } => Reply::Text {
                text: text.clone(),
                slow_ms: *slow_ms,
            },
        }
    }
}

/// Decides the answer to the chat request recorded as `this`, given earlier `requests`.
fn plan(this: &RecordedRequest, earlier: &[RecordedRequest]) -> Plan {
    let messages = &this.messages;
    let last_user = messages
        .iter()
        .rposition(|m| m.get("role").and_then(Value::as_str) == Some("user"));
    let tool_steps_done = match last_user {
        Some(i) => messages[i + 1..]
            .iter()
            .filter(|m| {
                m.get("role").and_then(Value::as_str) == Some("assistant")
                    && m.get("tool_calls")
                        .and_then(Value::as_array)
                        .is_some_and(|c| !c.is_empty())
            })
            .count(),
        None => 0,
    };
    if this.markers.contains(&Marker::Error400) {
        return Plan::Error {
            status: 400,
            message: ERROR_400_MESSAGE.to_owned(),
            extra_headers: Vec::new(),
        };
    }
    for marker in &this.markers {
        if let Marker::Error500 {
            retry_after_ms,
            times,
        } = marker
        {
            let attempt = earlier
                .iter()
                .filter(|r| {
                    r.is_chat()
                        && r.session_id() == this.session_id()
                        && r.last_user_text == this.last_user_text
                        && r.messages.len() == this.messages.len()
                })
                .count() as u64;
            if times.is_none_or(|t| attempt < t) {
                return Plan::Error {
                    status: 500,
                    message: ERROR_500_MESSAGE.to_owned(),
                    extra_headers: retry_after_ms
                        .map(|ms| vec![("retry-after-ms".into(), ms.to_string())])
                        .unwrap_or_default(),
                };
            }
        }
    }
    let tool_calls: Vec<(&str, Value)> = this
        .markers
        .iter()
        .filter_map(|m| match m {
            Marker::Bash(cmd) => Some(("bash", json!({ "command": cmd }))),
            Marker::BashIn { workdir, command } => Some((
                "bash",
                json!({ "command": command, "workdir": workdir, "description": "run it" }),
            )),
            Marker::Write { path, content } => {
                Some(("write", json!({ "filePath": path, "content": content })))
            }
            Marker::Task {
                subagent_type,
                prompt,
            } => Some((
                "task",
                json!({
                    "description": task_description(prompt),
                    "prompt": prompt,
                    "subagent_type": subagent_type
                }),
            )),
            _ => None,
        })
        .filter(|(name, _)| this.tools.iter().any(|t| t == name))
        .collect();
    if this.markers.contains(&Marker::Parallel) && tool_calls.len() > 1 {
        if tool_steps_done == 0 {
            return Plan::ToolCalls(
                tool_calls
                    .into_iter()
                    .enumerate()
                    .map(|(k, (name, arguments))| {
                        (
                            format!("call_fake_{}_{k}", this.index),
                            name.to_owned(),
                            arguments,
                        )
                    })
                    .collect(),
            );
        }
    } else if let Some((name, arguments)) = tool_calls.into_iter().nth(tool_steps_done) {
        return Plan::ToolCall {
            id: format!("call_fake_{}_{}", this.index, tool_steps_done),
            name: name.to_owned(),
            arguments,
        };
    }
    let slow_ms = this.markers.iter().find_map(|m| match m {
        Marker::Slow { ms } => Some(*ms),
        _ => None,
    });
    Plan::Text {
        text: scripted_answer(messages).unwrap_or_else(|| echo_reply(&this.last_user_text)),
        slow_ms,
    }
}

/// The `[[answers:...]]` answer for a request holding `messages`, if a user message scripts one.
fn scripted_answer(messages: &[Value]) -> Option<String> {
    let users: Vec<String> = messages
        .iter()
        .filter(|m| m.get("role").and_then(Value::as_str) == Some("user"))
        .map(|m| content_text(m.get("content").unwrap_or(&Value::Null)))
        .collect();
    let answers = users.iter().find_map(|text| {
        parse_markers(text).into_iter().find_map(|m| match m {
            Marker::Answers(a) => Some(a),
            _ => None,
        })
    })?;
    let k = users.len().clamp(1, answers.len());
    answers.get(k - 1).cloned()
}

async fn handle_connection(mut stream: TcpStream, shared: Arc<Shared>) {
    let request = match read_request(&mut stream, &mut Vec::new()).await {
        Ok(Some(request)) => request,
        Ok(None) => return,
        Err(e) => {
            let _ = write_json(
                &mut stream,
                400,
                &[],
                &error_body(&e.to_string(), "bad_request"),
            )
            .await;
            return;
        }
    };
    let body = request.json();
    let messages: Vec<Value> = body
        .get("messages")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let last_user_text = messages
        .iter()
        .rev()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))
        .map(|m| content_text(m.get("content").unwrap_or(&Value::Null)))
        .unwrap_or_default();
    let tools: Vec<String> = body
        .get("tools")
        .and_then(Value::as_array)
        .map(|tools| {
            tools
                .iter()
                .filter_map(|t| {
                    t.pointer("/function/name")
                        .or_else(|| t.get("name"))
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                })
                .collect()
        })
        .unwrap_or_default();
    let markers = parse_markers(&last_user_text);
    let recorded = RecordedRequest {
        index: 0,
        at: Instant::now(),
        method: request.method.clone(),
        path: request.path.clone(),
        headers: request.headers.clone(),
        model: body
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
        stream: body.get("stream").and_then(Value::as_bool).unwrap_or(false),
        body,
        messages,
        tools,
        last_user_text,
        markers,
        reply: Reply::Pending,
    };

    let route = request.path.split('?').next().unwrap_or("");
    let is_chat = request.method == "POST" && route == "/v1/chat/completions";
    let is_models = request.method == "GET" && route == "/v1/models";

    // Record, and decide the plan against the history as it was on arrival.
    let (index, plan) = shared.update(|s| {
        let mut recorded = recorded;
        recorded.index = s.requests.len();
        let plan = if is_chat {
            if recorded.body.is_object() {
                Some(plan(&recorded, &s.requests))
            } else {
                recorded.reply = Reply::BadRequest("body is not a JSON object".into());
                None
            }
        } else {
            recorded.reply = if is_models {
                Reply::Models
            } else {
                Reply::NotFound
            };
            None
        };
        let index = recorded.index;
        s.requests.push(recorded);
        (index, plan)
    });

    if is_models {
        let models = json!({
            "object": "list",
            "data": [
                {"id": "fake-model", "object": "model", "created": 0, "owned_by": "fake"},
                {"id": "fake-strong", "object": "model", "created": 0, "owned_by": "fake"},
                {"id": "fake-small", "object": "model", "created": 0, "owned_by": "fake"}
            ]
        });
        let _ = write_json(&mut stream, 200, &[], &models).await;
        return;
    }
    let Some(plan) = plan else {
        let (status, body) = if is_chat {
            (
                400,
                error_body("request body is not a JSON object", "invalid_request_error"),
            )
        } else {
            (
                404,
                error_body(
                    &format!("no route {} {}", request.method, request.path),
                    "not_found",
                ),
            )
        };
        let _ = write_json(&mut stream, status, &[], &body).await;
        return;
    };

    let (model, streaming, markers) = shared.read(|s| {
        let r = &s.requests[index];
        (r.model.clone(), r.stream, r.markers.clone())
    });
    let (mut reader, mut writer) = stream.split();

    for marker in &markers {
        if let Marker::Delay { ms } = marker {
            if pause(&mut reader, Duration::from_millis(*ms)).await {
                shared.update(|s| s.requests[index].reply = Reply::ClientClosed);
                return;
            }
        }
    }

    let reply = plan.reply();
    shared.update(|s| s.requests[index].reply = reply);

    match plan {
        Plan::Error {
            status,
            message,
            extra_headers,
        } => {
            let code = if status == 400 {
                "invalid_request_error"
            } else {
                "server_error"
            };
            let _ = write_json(
                &mut writer,
                status,
                &extra_headers,
                &error_body(&message, code),
            )
            .await;
        }
        _ if !streaming => {
            let _ = write_json(
                &mut writer,
                200,
                &[],
                &completion_json(index, &model, &plan, usage_prompt_tokens(&markers)),
            )
            .await;
        }
        _ => {
            let prompt_tokens = usage_prompt_tokens(&markers);
            let end = stream_answer(
                &mut reader,
                &mut writer,
                index,
                &model,
                &plan,
                prompt_tokens,
            )
            .await;
            shared.update(|s| s.stream_ends.push(end));
        }
    }
}

/// Waits `dur` while watching for the client hanging up. Returns true if it did.
async fn pause<R: AsyncRead + Unpin>(reader: &mut R, dur: Duration) -> bool {
    let sleep = tokio::time::sleep(dur);
    tokio::pin!(sleep);
    let mut buf = [0u8; 1024];
    loop {
        tokio::select! {
            _ = &mut sleep => return false,
            read = reader.read(&mut buf) => match read {
                Ok(0) | Err(_) => return true,
                Ok(_) => {} // unexpected bytes (a pipelined request): ignore
            }
        }
    }
}

fn error_body(message: &str, code: &str) -> Value {
    json!({
        "error": {
            "message": message,
            "type": code,
            "param": null,
            "code": code
        }
    })
}

fn reason_phrase(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        500 => "Internal Server Error",
        _ => "Status",
    }
}

async fn write_json<W: tokio::io::AsyncWrite + Unpin>(
    writer: &mut W,
    status: u16,
    extra_headers: &[(String, String)],
    body: &Value,
) -> io::Result<()> {
    let body = serde_json::to_vec(body).map_err(io::Error::other)?;
    let mut head = format!(
        "HTTP/1.1 {status} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
        reason_phrase(status),
        body.len()
    );
    for (name, value) in extra_headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    writer.write_all(head.as_bytes()).await?;
    writer.write_all(&body).await?;
    writer.flush().await?;
    writer.shutdown().await
}

fn usage_json(prompt_tokens: u64) -> Value {
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": USAGE_COMPLETION_TOKENS,
        "total_tokens": prompt_tokens + USAGE_COMPLETION_TOKENS
    })
}

/// The prompt tokens to report for a request with these markers: the first `[[usage:<n>]]`, else
/// [`USAGE_PROMPT_TOKENS`].
pub fn usage_prompt_tokens(markers: &[Marker]) -> u64 {
    markers
        .iter()
        .find_map(|m| match m {
            Marker::Usage { prompt_tokens } => Some(*prompt_tokens),
            _ => None,
        })
        .unwrap_or(USAGE_PROMPT_TOKENS)
}

/// The `description` of a scripted `task` call: the first words of the child prompt, as a model
/// would write one (OpenCode shows it as the child session's title).
pub fn task_description(prompt: &str) -> String {
    let words: Vec<&str> = prompt.split_whitespace().take(5).collect();
    if words.is_empty() {
        "subtask".to_owned()
    } else {
        words.join(" ")
    }
}

fn completion_json(index: usize, model: &str, plan: &Plan, prompt_tokens: u64) -> Value {
    let (message, finish) = match plan {
        Plan::ToolCall {
            id,
            name,
            arguments,
        } => (
            json!({
                "role": "assistant",
                "content": null,
                "tool_calls": [{
                    "id": id,
                    "type": "function",
                    "function": { "name": name, "arguments": arguments.to_string() }
                }]
            }),
            "tool_calls",
        ),
        Plan::ToolCalls(calls) => (
            json!({
                "role": "assistant",
                "content": null,
                "tool_calls": calls.iter().map(|(id, name, arguments)| json!({
                    "id": id,
                    "type": "function",
                    "function": { "name": name, "arguments": arguments.to_string() }
                })).collect::<Vec<_>>()
            }),
            "tool_calls",
        ),
        Plan::Text { text, .. } => (json!({ "role": "assistant", "content": text }), "stop"),
        Plan::Error { .. } => (json!({ "role": "assistant", "content": "" }), "stop"),
    };
    json!({
        "id": format!("chatcmpl-fake-{index}"),
        "object": "chat.completion",
        "created": 1_700_000_000u64,
        "model": model,
        "choices": [{ "index": 0, "message": message, "finish_reason": finish }],
        "usage": usage_json(prompt_tokens)
    })
}

/// Streams the answer as SSE. Returns how the stream ended.
async fn stream_answer<R, W>(
    reader: &mut R,
    writer: &mut W,
    index: usize,
    model: &str,
    plan: &Plan,
    prompt_tokens: u64,
) -> StreamEnd
where
    R: AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let id = format!("chatcmpl-fake-{index}");
    let chunk = |choices: Value| {
        json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": 1_700_000_000u64,
            "model": model,
            "choices": choices
        })
    };
    let delta = |delta: Value, finish: Option<&str>| {
        chunk(json!([{ "index": 0, "delta": delta, "finish_reason": finish }]))
    };
    let mut frames: Vec<(Duration, String)> = Vec::new();
    let mut push =
        |pause: Duration, value: Value| frames.push((pause, format!("data: {value}\n\n")));
    push(
        Duration::ZERO,
        delta(json!({ "role": "assistant", "content": "" }), None),
    );
    let finish = match plan {
        Plan::ToolCall {
            id,
            name,
            arguments,
        } => {
            push(
                Duration::ZERO,
                delta(
                    json!({ "tool_calls": [{
                        "index": 0,
                        "id": id,
                        "type": "function",
                        "function": { "name": name, "arguments": arguments.to_string() }
                    }] }),
                    None,
                ),
            );
            "tool_calls"
        }
        Plan::ToolCalls(calls) => {
            for (index, (id, name, arguments)) in calls.iter().enumerate() {
                push(
                    Duration::ZERO,
                    delta(
                        json!({ "tool_calls": [{
                            "index": index,
                            "id": id,
                            "type": "function",
                            "function": { "name": name, "arguments": arguments.to_string() }
                        }] }),
                        None,
                    ),
                );
            }
            "tool_calls"
        }
        Plan::Text { text, slow_ms } => {
            match slow_ms {
                Some(ms) => {
                    let pieces = split_even(text, 10);
                    let gap = Duration::from_millis(*ms / pieces.len().max(1) as u64);
                    for piece in pieces {
                        push(gap, delta(json!({ "content": piece }), None));
                    }
                }
                None => push(Duration::ZERO, delta(json!({ "content": text }), None)),
            }
            "stop"
        }
        Plan::Error { .. } => "stop",
    };
    push(Duration::ZERO, delta(json!({}), Some(finish)));
    let mut usage = chunk(json!([]));
    usage["usage"] = usage_json(prompt_tokens);
    push(Duration::ZERO, usage);
    frames.push((Duration::ZERO, "data: [DONE]\n\n".to_owned()));

    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n";
    let mut end = StreamEnd {
        request: index,
        at: Instant::now(),
        chunks_sent: 0,
        client_closed: false,
    };
    if writer.write_all(head.as_bytes()).await.is_err() {
        end.client_closed = true;
        end.at = Instant::now();
        return end;
    }
    for (gap, frame) in frames {
        if !gap.is_zero() && pause(reader, gap).await {
            end.client_closed = true;
            end.at = Instant::now();
            return end;
        }
        if writer.write_all(frame.as_bytes()).await.is_err() || writer.flush().await.is_err() {
            end.client_closed = true;
            end.at = Instant::now();
            return end;
        }
        end.chunks_sent += 1;
    }
    let _ = writer.shutdown().await;
    end.at = Instant::now();
    end
}

/// Splits `text` into at most `n` non-empty pieces of similar length (on char boundaries).
fn split_even(text: &str, n: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    if chars.is_empty() {
        return vec![String::new()];
    }
    let size = chars.len().div_ceil(n.max(1));
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}

/// Groups recorded chat requests by `x-session-id` (requests without one under `""`).
pub fn by_session(requests: &[RecordedRequest]) -> HashMap<String, Vec<RecordedRequest>> {
    let mut map: HashMap<String, Vec<RecordedRequest>> = HashMap::new();
    for r in requests.iter().filter(|r| r.is_chat()) {
        map.entry(r.session_id().unwrap_or("").to_owned())
            .or_default()
            .push(r.clone());
    }
    map
}

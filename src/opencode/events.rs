//! The event pump: one SSE stream per OpenCode server (`GET /global/event`), decoded leniently
//! into the few events the task tracker needs.
//!
//! The `Event` union in OpenCode's spec has about eighty variants and changes between releases,
//! so it is not generated: only the fields we use are read. The three busiest kinds (message
//! and part updates, text deltas) go straight into typed shapes that skip everything else
//! without allocating (see [`lenient`](super::lenient)); the rare ones are picked out of a
//! `Value`. An unknown event type, an extra field, a field of another shape or a malformed
//! frame is skipped, never an error, so a newer OpenCode cannot break the stream. The stream has no replay, so the pump is subscribed
//! before any prompt is sent, and after a reconnect the tracker reconciles over HTTP.

use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::api::Api;
use super::lenient::{Obj, Scalar};
use super::types::{
    error_info_from_json, ErrorInfo, PermissionAsk, SessionActivity, Tokens, ToolCall,
};
use serde::de::{Deserialize, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

/// What the pump reports to the tracker.
#[derive(Debug, Clone, PartialEq)]
pub enum PumpEvent {
    /// The stream is (re)connected: anything may have been missed before this, reconcile.
    Connected,
    /// The stream broke; the pump is reconnecting.
    Disconnected(String),
    /// An event from OpenCode (boxed: an event is far larger than the other variants).
    Event(Box<Event>),
    /// An event was dropped (larger than [`MAX_EVENT_BYTES`]): what it said is unknown.
    Dropped,
}

/// The OpenCode events the tracker understands.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    SessionStatus {
        session_id: String,
        activity: SessionActivity,
    },
    SessionIdle {
        session_id: String,
    },
    SessionError {
        session_id: Option<String>,
        error: ErrorInfo,
    },
    MessageUpdated {
        session_id: String,
        message_id: String,
        /// `user` or `assistant`.
        role: String,
        parent_id: Option<String>,
        completed: bool,
        finish: Option<String>,
        error: Option<ErrorInfo>,
        /// A compaction summary (`summary: true`): never the end of a turn.
        summary: bool,
        agent: Option<String>,
        /// `provider/model` of an assistant message.
        model: Option<String>,
        /// Epoch ms of `time.completed`.
        completed_at: Option<u64>,
        tokens: Tokens,
        cost: f64,
    },
    /// `session.created` / `session.updated`: how a subagent's child session (one with a
    /// `parentID`) is tied to the task of its parent.
    SessionInfo {
        session_id: String,
        parent_id: Option<String>,
    },
    /// `session.deleted`: OpenCode keeps streaming a deleted session's turn, so only this event
    /// tells the gateway the task is gone.
    SessionDeleted {
        session_id: String,
    },
    PartUpdated {
        session_id: String,
        message_id: String,
        part_id: String,
        part: PartEvent,
    },
    PartDelta {
        session_id: String,
        message_id: String,
        part_id: String,
        field: String,
        delta: String,
    },
    PermissionAsked(PermissionAsk),
    PermissionReplied {
        session_id: String,
        request_id: String,
    },
    /// Heartbeats, and every event type we do not use.
    Other,
}

impl Event {
    /// The session an event is about, if any.
    pub fn session_id(&self) -> Option<&str> {
        match self {
            Event::SessionStatus { session_id, .. }
            | Event::SessionIdle { session_id }
            | Event::MessageUpdated { session_id, .. }
            | Event::PartUpdated { session_id, .. }
            | Event::PartDelta { session_id, .. }
            | Event::PermissionReplied { session_id, .. }
            | Event::SessionInfo { session_id, .. }
            | Event::SessionDeleted { session_id } => Some(session_id),
            Event::SessionError { session_id, .. } => session_id.as_deref(),
            Event::PermissionAsked(ask) => Some(&ask.session_id),
            Event::Other => None,
        }
    }
}

/// The parts of a `message.part.updated` the progress report uses.
#[derive(Debug, Clone, PartialEq)]
pub enum PartEvent {
    Text {
        text: String,
        /// Neither synthetic nor ignored: part of what the model wrote.
        counted: bool,
    },
    Tool {
        /// The call as a read of the turn over HTTP reports it.
        call: ToolCall,
        /// What progress shows: OpenCode's title, else the tool's main argument, on one line.
        title: Option<String>,
    },
    /// A user message holding this part asks for a compaction.
    Compaction,
    StepStart,
    StepFinish,
    Other,
}

/// The longest line (and event) the parser keeps. OpenCode's frames carry whole message parts
/// (a tool's output, a file's text), so the cap is generous; it exists so that a server that
/// never sends a newline cannot grow the gateway's memory without bound. An oversized event is
/// dropped whole (the reconcile reads the state it described over HTTP).
pub const MAX_EVENT_BYTES: usize = 16 * 1024 * 1024;

/// Incremental parser of a `text/event-stream` body: feed it bytes, get the `data` payloads of
/// complete events. Only `data:` lines matter here (OpenCode sends no `event:` or `id:`).
#[derive(Debug, Default)]
pub struct SseParser {
    /// The start of a line whose end has not arrived yet.
    line: Vec<u8>,
    data: String,
    has_data: bool,
    /// The current event passed [`MAX_EVENT_BYTES`]: skip to its end.
    oversized: bool,
    /// The current line passed it: skip to its end.
    line_dropped: bool,
    /// Events dropped for their size since the last [`SseParser::take_dropped`].
    dropped: u32,
}

impl SseParser {
    /// Feeds a chunk; returns the payloads of the events it completed. A line that ends inside
    /// the chunk is read where it lies; only the unfinished last one is copied (this runs on
    /// every frame of every session on the server).
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        let mut rest = chunk;
        while let Some(end) = memchr::memchr(b'\n', rest) {
            let piece = &rest[..end];
            rest = &rest[end + 1..];
            if self.line.is_empty() && !self.line_dropped {
                if self.fits(piece.len()) {
                    self.on_line(without_cr(piece), &mut out);
                } else {
                    self.oversized = true;
                }
                continue;
            }
            self.keep(piece);
            let line = std::mem::take(&mut self.line);
            if !std::mem::take(&mut self.line_dropped) {
                self.on_line(without_cr(&line), &mut out);
            }
        }
        self.keep(rest);
        out
    }

    /// How many events were dropped for their size since the last call.
    pub fn take_dropped(&mut self) -> u32 {
        std::mem::take(&mut self.dropped)
    }

    /// Whether `more` bytes of the current line still fit in the event.
    fn fits(&self, more: usize) -> bool {
        self.line.len() + self.data.len() + more <= MAX_EVENT_BYTES
    }

    /// Keeps part of an unfinished line, or drops the line (and its event) once it is too long.
    fn keep(&mut self, bytes: &[u8]) {
        if self.line_dropped || bytes.is_empty() {
            return;
        }
        if self.fits(bytes.len()) {
            self.line.extend_from_slice(bytes);
        } else {
            self.oversized = true;
            self.line_dropped = true;
            self.line = Vec::new();
        }
    }

    fn on_line(&mut self, line: &[u8], out: &mut Vec<String>) {
        if line.is_empty() {
            if self.has_data && !self.oversized {
                out.push(std::mem::take(&mut self.data));
            }
            if self.oversized {
                self.dropped = self.dropped.saturating_add(1);
            }
            self.data.clear();
            self.has_data = false;
            self.oversized = false;
            return;
        }
        if self.oversized {
            return;
        }
        // `event:`, `id:`, `retry:` and comments are ignored.
        let Some(rest) = line.strip_prefix(b"data:") else {
            return;
        };
        let rest = rest.strip_prefix(b" ").unwrap_or(rest);
        if self.has_data {
            self.data.push('\n');
        }
        // Checked, not converted lossily: the check runs a word at a time over ASCII, and
        // every byte of every event passes here.
        match std::str::from_utf8(rest) {
            Ok(text) => self.data.push_str(text),
            Err(_) => self.data.push_str(&String::from_utf8_lossy(rest)),
        }
        self.has_data = true;
    }
}

/// A line without the `\r` of a CRLF ending.
fn without_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// Decodes one `data:` payload of `/global/event` (`{directory, payload: {type, properties}}`)
/// or of `/event` (`{type, properties}`). Never fails: what it cannot read is [`Event::Other`].
///
/// Every byte OpenCode streams passes here (on a fan-out of 200 tasks this was half of all the
/// gateway's instructions), so a frame is read in one pass: OpenCode writes `type` before
/// `properties`, and the properties are read straight into the shape of that kind (see
/// [`read_props`]). Kinds the gateway ignores, about half of the bytes (`sync`,
/// `session.diff`, `plugin.added`), are skipped without building anything. Properties that
/// come before their type are kept as raw JSON and read once the type is known.
pub fn decode_event(data: &str) -> Event {
    let mut de = serde_json::Deserializer::from_str(data);
    match de.deserialize_map(FrameVisitor) {
        Ok(event) if de.end().is_ok() => event.unwrap_or(Event::Other),
        _ => Event::Other,
    }
}

/// Reads a frame (or the `payload` inside one) into the event it carries, other fields ignored.
struct FrameVisitor;

impl<'de> Visitor<'de> for FrameVisitor {
    type Value = Option<Event>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an event frame")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut kind = Scalar::Absent;
        let mut props: Option<Props<'de>> = None;
        let mut early: Option<&'de RawValue> = None;
        let mut payload: Option<Option<Event>> = None;
        while let Some(key) = map.next_key::<Scalar<'de>>()? {
            match key.as_str() {
                Some("payload") => payload = Some(map.next_value_seed(FrameSeed)?),
                Some("type") => kind = map.next_value()?,
                Some("properties") => match kind.as_str() {
                    Some(k) => props = map.next_value_seed(PropsSeed(k))?,
                    None => early = Some(map.next_value()?),
                },
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        if let Some(event) = payload {
            return Ok(event);
        }
        let kind = kind.as_str().unwrap_or("");
        if let Some(raw) = early {
            let mut de = serde_json::Deserializer::from_str(raw.get());
            props = read_props(kind, &mut de).ok().flatten();
        }
        Ok(props.and_then(|p| decode_properties(kind, p)))
    }
}

/// The `payload` of a `/global/event` frame.
struct FrameSeed;

impl<'de> DeserializeSeed<'de> for FrameSeed {
    type Value = Option<Event>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(FrameVisitor)
    }
}

/// The `properties` of an event whose kind is known.
struct PropsSeed<'k>(&'k str);

impl<'de> DeserializeSeed<'de> for PropsSeed<'_> {
    type Value = Option<Props<'de>>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        read_props(self.0, d)
    }
}

fn s(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(String::from)
}

/// The properties of an event, read as the shape of its kind.
enum Props<'a> {
    MessageUpdated(wire::MessageUpdated<'a>),
    PartUpdated(wire::PartUpdated<'a>),
    PartDelta(wire::PartDelta<'a>),
    /// A rare kind the tracker reads, as JSON.
    Json(Value),
}

/// Reads the properties of an event of `kind` from `d`: the busy kinds into their typed
/// shapes, the other kinds the tracker reads as JSON, and any other kind skipped without
/// building anything (`None`, as for properties that are not an object).
fn read_props<'de, D: Deserializer<'de>>(kind: &str, d: D) -> Result<Option<Props<'de>>, D::Error> {
    Ok(match kind {
        "message.updated" => Obj::deserialize(d)?.0.map(Props::MessageUpdated),
        "message.part.updated" => Obj::deserialize(d)?.0.map(Props::PartUpdated),
        "message.part.delta" => Obj::deserialize(d)?.0.map(Props::PartDelta),
        "session.status" | "session.idle" | "session.error" | "session.created"
        | "session.updated" | "session.deleted" | "permission.asked" | "permission.replied" => {
            Some(Props::Json(Value::deserialize(d)?))
        }
        _ => {
            IgnoredAny::deserialize(d)?;
            None
        }
    })
}

/// The event that properties read by [`read_props`] describe.
fn decode_properties(kind: &str, props: Props) -> Option<Event> {
    let p = match props {
        Props::MessageUpdated(p) => return message_updated(p),
        Props::PartUpdated(p) => return part_updated(p),
        Props::PartDelta(p) => return part_delta(p),
        Props::Json(p) => p,
    };
    let p = &p;
    Some(match kind {
        "session.status" => {
            let status = p.get("status")?;
            let activity = match status.get("type").and_then(Value::as_str)? {
                "idle" => SessionActivity::Idle,
                "busy" => SessionActivity::Busy,
                "retry" => SessionActivity::Retry {
                    attempt: status.get("attempt").and_then(Value::as_u64).unwrap_or(0),
                    message: s(status, "message").unwrap_or_default(),
                    next: status.get("next").and_then(Value::as_u64).unwrap_or(0),
                },
                _ => SessionActivity::Busy,
            };
            Event::SessionStatus {
                session_id: s(p, "sessionID")?,
                activity,
            }
        }
        "session.idle" => Event::SessionIdle {
            session_id: s(p, "sessionID")?,
        },
        "session.error" => Event::SessionError {
            session_id: s(p, "sessionID"),
            error: p
                .get("error")
                .map(error_info_from_json)
                .unwrap_or(ErrorInfo {
                    provider_status: None,
                    retryable: None,
                    name: "UnknownError".into(),
                    message: "OpenCode reported a session error without details".into(),
                }),
        },
        "session.created" | "session.updated" => {
            let info = p.get("info")?;
            Event::SessionInfo {
                session_id: s(info, "id").or_else(|| s(p, "sessionID"))?,
                parent_id: s(info, "parentID"),
            }
        }
        "session.deleted" => Event::SessionDeleted {
            session_id: p
                .get("info")
                .and_then(|i| s(i, "id"))
                .or_else(|| s(p, "sessionID"))?,
        },
        "permission.asked" => Event::PermissionAsked(PermissionAsk {
            id: s(p, "id")?,
            session_id: s(p, "sessionID")?,
            permission: s(p, "permission").unwrap_or_default(),
            patterns: p
                .get("patterns")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(String::from)
                        .collect()
                })
                .unwrap_or_default(),
            metadata: p.get("metadata").cloned().unwrap_or(Value::Null),
        }),
        "permission.replied" => Event::PermissionReplied {
            session_id: s(p, "sessionID")?,
            request_id: s(p, "requestID")?,
        },
        _ => Event::Other,
    })
}

fn message_updated(p: wire::MessageUpdated) -> Option<Event> {
    let info = p.info.0?;
    let model = match (info.provider_id.as_str(), info.model_id.as_str()) {
        (Some(p), Some(m)) => Some(format!("{p}/{m}")),
        _ => None,
    };
    let completed = info.time.0.map(|t| t.completed).unwrap_or_default();
    Some(Event::MessageUpdated {
        session_id: info
            .session_id
            .into_string()
            .or_else(|| p.session_id.into_string())?,
        message_id: info.id.into_string()?,
        role: info.role.into_string().unwrap_or_default(),
        parent_id: info.parent_id.into_string(),
        completed: completed.is_set(),
        finish: info.finish.into_string(),
        error: info
            .error
            .and_then(|e| serde_json::from_str::<Value>(e.get()).ok())
            .map(|e| error_info_from_json(&e)),
        summary: info.summary.is_true(),
        agent: info.agent.into_string(),
        model,
        completed_at: completed.as_u64(),
        tokens: info.tokens.0.map(wire::Tokens::counts).unwrap_or_default(),
        cost: info.cost.as_f64().unwrap_or(0.0),
    })
}

fn part_updated(p: wire::PartUpdated) -> Option<Event> {
    let part = p.part.0?;
    let decoded = match part.kind.as_str().unwrap_or("") {
        "text" => PartEvent::Text {
            counted: !part.synthetic.is_true() && !part.ignored.is_true(),
            text: part.text.into_string().unwrap_or_default(),
        },
        "tool" => {
            let state = part.state.0.unwrap_or_default();
            PartEvent::Tool {
                title: tool_title(&state),
                call: tool_call(part.tool, state),
            }
        }
        "compaction" => PartEvent::Compaction,
        "step-start" => PartEvent::StepStart,
        "step-finish" => PartEvent::StepFinish,
        _ => PartEvent::Other,
    };
    Some(Event::PartUpdated {
        session_id: part
            .session_id
            .into_string()
            .or_else(|| p.session_id.into_string())?,
        message_id: part.message_id.into_string()?,
        part_id: part.id.into_string().unwrap_or_default(),
        part: decoded,
    })
}

fn part_delta(p: wire::PartDelta) -> Option<Event> {
    Some(Event::PartDelta {
        session_id: p.session_id.into_string()?,
        message_id: p.message_id.into_string()?,
        part_id: p.part_id.into_string().unwrap_or_default(),
        field: p.field.into_string().unwrap_or_default(),
        delta: p.delta.into_string().unwrap_or_default(),
    })
}

/// OpenCode sends `server.heartbeat` every 10 s: a stream silent for this long is dead even if
/// the connection looks open (a half-open TCP connection never ends on its own).
const STREAM_IDLE: Duration = Duration::from_secs(35);
/// First and largest pause between reconnection attempts.
const BACKOFF_MIN: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Runs the pump until `stop` is cancelled: connect, forward events, and on any break report
/// `Disconnected`, back off (250 ms doubling to 5 s, back to 250 ms once a connection is made)
/// and reconnect. Each successful connect is reported as `Connected` so the tracker reconciles
/// what the gap may have hidden.
pub async fn run_pump(api: Api, tx: mpsc::UnboundedSender<PumpEvent>, stop: CancellationToken) {
    let mut backoff = BACKOFF_MIN;
    // When the stream was lost, and how many attempts failed since.
    let mut lost: Option<(tokio::time::Instant, u32)> = None;
    loop {
        let mut connected = false;
        let outcome = tokio::select! {
            _ = stop.cancelled() => return,
            r = stream_once(&api, &tx, &mut connected, &mut lost) => r,
        };
        if connected {
            backoff = BACKOFF_MIN;
        }
        let reason = match outcome {
            Ok(()) => "the event stream ended".to_string(),
            Err(e) => e,
        };
        if tx.send(PumpEvent::Disconnected(reason.clone())).is_err() {
            return;
        }
        match &mut lost {
            Some((_, failures)) => *failures += 1,
            None => {
                tracing::info!(url = api.base_url(), %reason, "event stream lost; reconnecting");
                lost = Some((tokio::time::Instant::now(), 0));
            }
        }
        tracing::debug!(url = api.base_url(), %reason, ?backoff, "event stream down; next attempt after the backoff");
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// One connection: returns when the stream ends or fails. Sets `connected` once the stream is
/// established (and logs the reconnection if it follows a loss).
async fn stream_once(
    api: &Api,
    tx: &mpsc::UnboundedSender<PumpEvent>,
    connected: &mut bool,
    lost: &mut Option<(tokio::time::Instant, u32)>,
) -> Result<(), String> {
    let response = api
        .stream_get("/global/event")
        .header(reqwest::header::ACCEPT, "text/event-stream")
        .send()
        .await
        .map_err(|e| format!("cannot connect: {e}"))?;
    if !response.status().is_success() {
        return Err(format!("HTTP {}", response.status()));
    }
    let is_sse = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("text/event-stream"));
    if !is_sse {
        return Err("the event endpoint did not answer with text/event-stream".into());
    }
    *connected = true;
    if let Some((since, failures)) = lost.take() {
        tracing::info!(
            url = api.base_url(),
            down_ms = since.elapsed().as_millis() as u64,
            failed_attempts = failures,
            "event stream reconnected"
        );
    }
    if tx.send(PumpEvent::Connected).is_err() {
        return Ok(());
    }
    let mut parser = SseParser::default();
    let mut body = response.bytes_stream();
    loop {
        let chunk = match tokio::time::timeout(STREAM_IDLE, body.next()).await {
            Err(_) => {
                return Err(format!(
                    "no data (not even a heartbeat) for {}s",
                    STREAM_IDLE.as_secs()
                ))
            }
            Ok(None) => return Ok(()),
            Ok(Some(chunk)) => chunk.map_err(|e| format!("stream read failed: {e}"))?,
        };
        for data in parser.feed(&chunk) {
            let event = decode_event(&data);
            if event != Event::Other && tx.send(PumpEvent::Event(Box::new(event))).is_err() {
                return Ok(());
            }
        }
        if parser.take_dropped() > 0 && tx.send(PumpEvent::Dropped).is_err() {
            return Ok(());
        }
    }
}

/// Most characters of a tool's title kept for progress.
const TITLE_CHARS: usize = 200;

/// The tool call of a `tool` part, as `messages::view` reads it from the same part over HTTP:
/// the status, OpenCode's title once running or completed, the error once failed.
fn tool_call(tool: Scalar, state: wire::ToolState) -> ToolCall {
    let status = state
        .status
        .into_string()
        .unwrap_or_else(|| "pending".to_string());
    let (title, error) = match status.as_str() {
        "running" | "completed" => (state.title.into_string(), None),
        "error" => (None, state.error.into_string()),
        _ => (None, None),
    };
    ToolCall {
        tool: tool.into_string().unwrap_or_default(),
        status,
        title,
        error,
    }
}

/// What a tool call is doing, in a few words: OpenCode's own title when it gave one, else the
/// call's main argument (a shell tool's command, an edit's file, a search's pattern), so
/// progress reads `running bash: cargo test`, not just `running bash`. One line, bounded.
fn tool_title(state: &wire::ToolState) -> Option<String> {
    let title = state
        .title
        .as_str()
        .filter(|t| !t.trim().is_empty())
        .or_else(|| {
            let input = state.input.0.as_ref()?;
            [
                &input.command,
                &input.file_path,
                &input.path,
                &input.pattern,
                &input.url,
                &input.query,
                &input.description,
            ]
            .into_iter()
            .find_map(Scalar::as_str)
            .filter(|t| !t.trim().is_empty())
        })?;
    let line: String = title.split_whitespace().collect::<Vec<_>>().join(" ");
    Some(if line.chars().count() > TITLE_CHARS {
        let cut: String = line.chars().take(TITLE_CHARS - 1).collect();
        format!("{cut}…")
    } else {
        line
    })
}

/// The shapes of the three busiest event kinds, only the fields the tracker reads (see
/// [`lenient`](super::lenient) for why they are typed and how they stay lenient).
mod wire {
    use serde::Deserialize;
    use serde_json::value::RawValue;

    use super::super::lenient::{Obj, Scalar};

    /// `message.updated`: `{sessionID?, info: Message}`.
    #[derive(Deserialize)]
    pub struct MessageUpdated<'a> {
        #[serde(borrow, default)]
        pub info: Obj<MessageInfo<'a>>,
        #[serde(rename = "sessionID", borrow, default)]
        pub session_id: Scalar<'a>,
    }

    #[derive(Deserialize)]
    pub struct MessageInfo<'a> {
        #[serde(borrow, default)]
        pub id: Scalar<'a>,
        #[serde(rename = "sessionID", borrow, default)]
        pub session_id: Scalar<'a>,
        #[serde(borrow, default)]
        pub role: Scalar<'a>,
        #[serde(rename = "parentID", borrow, default)]
        pub parent_id: Scalar<'a>,
        #[serde(borrow, default)]
        pub finish: Scalar<'a>,
        /// `true` on a compaction summary; on a user message an object (its diffs), skipped.
        #[serde(borrow, default)]
        pub summary: Scalar<'a>,
        #[serde(borrow, default)]
        pub agent: Scalar<'a>,
        #[serde(rename = "providerID", borrow, default)]
        pub provider_id: Scalar<'a>,
        #[serde(rename = "modelID", borrow, default)]
        pub model_id: Scalar<'a>,
        #[serde(borrow, default)]
        pub time: Obj<Time<'a>>,
        /// Rare and small: parsed into a `Value` only when present.
        #[serde(borrow, default)]
        pub error: Option<&'a RawValue>,
        #[serde(borrow, default)]
        pub tokens: Obj<Tokens<'a>>,
        #[serde(borrow, default)]
        pub cost: Scalar<'a>,
    }

    #[derive(Deserialize)]
    pub struct Time<'a> {
        #[serde(borrow, default)]
        pub completed: Scalar<'a>,
    }

    #[derive(Deserialize)]
    pub struct Tokens<'a> {
        #[serde(borrow, default)]
        input: Scalar<'a>,
        #[serde(borrow, default)]
        output: Scalar<'a>,
        #[serde(borrow, default)]
        reasoning: Scalar<'a>,
        #[serde(borrow, default)]
        cache: Obj<Cache<'a>>,
    }

    #[derive(Deserialize)]
    struct Cache<'a> {
        #[serde(borrow, default)]
        read: Scalar<'a>,
        #[serde(borrow, default)]
        write: Scalar<'a>,
    }

    impl Tokens<'_> {
        /// The counts as `messages::view` reads them over HTTP: negative or missing is 0.
        pub fn counts(self) -> super::Tokens {
            let n = |v: &Scalar| v.as_f64().unwrap_or(0.0).max(0.0) as u64;
            let cache = self.cache.0;
            super::Tokens {
                input: n(&self.input),
                output: n(&self.output),
                reasoning: n(&self.reasoning),
                cache_read: cache.as_ref().map_or(0, |c| n(&c.read)),
                cache_write: cache.as_ref().map_or(0, |c| n(&c.write)),
            }
        }
    }

    /// `message.part.updated`: `{sessionID?, part: Part}`.
    #[derive(Deserialize)]
    pub struct PartUpdated<'a> {
        #[serde(borrow, default)]
        pub part: Obj<Part<'a>>,
        #[serde(rename = "sessionID", borrow, default)]
        pub session_id: Scalar<'a>,
    }

    /// Any kind of part: the fields of the kinds the tracker reads, all optional.
    #[derive(Deserialize)]
    pub struct Part<'a> {
        #[serde(borrow, default)]
        pub id: Scalar<'a>,
        #[serde(rename = "sessionID", borrow, default)]
        pub session_id: Scalar<'a>,
        #[serde(rename = "messageID", borrow, default)]
        pub message_id: Scalar<'a>,
        #[serde(rename = "type", borrow, default)]
        pub kind: Scalar<'a>,
        #[serde(borrow, default)]
        pub text: Scalar<'a>,
        #[serde(borrow, default)]
        pub synthetic: Scalar<'a>,
        #[serde(borrow, default)]
        pub ignored: Scalar<'a>,
        #[serde(borrow, default)]
        pub tool: Scalar<'a>,
        /// A tool's state; its `output` and `metadata` are skipped, not read.
        #[serde(borrow, default)]
        pub state: Obj<ToolState<'a>>,
    }

    #[derive(Deserialize, Default)]
    pub struct ToolState<'a> {
        #[serde(borrow, default)]
        pub status: Scalar<'a>,
        #[serde(borrow, default)]
        pub title: Scalar<'a>,
        #[serde(borrow, default)]
        pub error: Scalar<'a>,
        /// Only the arguments that can name a call; a write's content is skipped.
        #[serde(borrow, default)]
        pub input: Obj<ToolInput<'a>>,
    }

    #[derive(Deserialize)]
    pub struct ToolInput<'a> {
        #[serde(borrow, default)]
        pub command: Scalar<'a>,
        #[serde(rename = "filePath", borrow, default)]
        pub file_path: Scalar<'a>,
        #[serde(borrow, default)]
        pub path: Scalar<'a>,
        #[serde(borrow, default)]
        pub pattern: Scalar<'a>,
        #[serde(borrow, default)]
        pub url: Scalar<'a>,
        #[serde(borrow, default)]
        pub query: Scalar<'a>,
        #[serde(borrow, default)]
        pub description: Scalar<'a>,
    }

    /// `message.part.delta`: flat.
    #[derive(Deserialize)]
    pub struct PartDelta<'a> {
        #[serde(rename = "sessionID", borrow, default)]
        pub session_id: Scalar<'a>,
        #[serde(rename = "messageID", borrow, default)]
        pub message_id: Scalar<'a>,
        #[serde(rename = "partID", borrow, default)]
        pub part_id: Scalar<'a>,
        #[serde(borrow, default)]
        pub field: Scalar<'a>,
        #[serde(borrow, default)]
        pub delta: Scalar<'a>,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_parser_handles_split_chunks_and_crlf() {
        let mut p = SseParser::default();
        assert!(p.feed(b"data: {\"a\"").is_empty());
        assert!(p.feed(b":1}\r\n").is_empty());
        assert_eq!(p.feed(b"\r\n"), vec!["{\"a\":1}".to_string()]);
        assert_eq!(
            p.feed(b": comment\nevent: x\ndata: one\ndata: two\n\n"),
            vec!["one\ntwo".to_string()]
        );
        assert!(p.feed(b"\n\n").is_empty(), "blank lines alone emit nothing");
    }

    #[test]
    fn decodes_global_wrapper_and_session_events() {
        let e = decode_event(
            r#"{"directory":"/w","payload":{"id":"evt_1","type":"session.idle","properties":{"sessionID":"ses_1"}}}"#,
        );
        assert_eq!(
            e,
            Event::SessionIdle {
                session_id: "ses_1".into()
            }
        );
        let e = decode_event(
            r#"{"type":"session.status","properties":{"sessionID":"ses_1","status":{"type":"retry","attempt":2,"message":"500","next":99}}}"#,
        );
        assert_eq!(
            e,
            Event::SessionStatus {
                session_id: "ses_1".into(),
                activity: SessionActivity::Retry {
                    attempt: 2,
                    message: "500".into(),
                    next: 99
                }
            }
        );
    }

    #[test]
    fn unknown_types_extra_fields_and_garbage_are_other_or_tolerated() {
        assert_eq!(decode_event("not json"), Event::Other);
        assert_eq!(
            decode_event(r#"{"type":"brand.new.event","properties":{}}"#),
            Event::Other
        );
        // Missing required field: skipped, not an error.
        assert_eq!(
            decode_event(r#"{"type":"session.idle","properties":{}}"#),
            Event::Other
        );
        let e = decode_event(
            r#"{"type":"session.idle","properties":{"sessionID":"ses_1","newField":[1,2]},"extra":true}"#,
        );
        assert_eq!(e.session_id(), Some("ses_1"));
        // Properties before their type are read once the type is known, in either envelope.
        for frame in [
            r#"{"properties":{"sessionID":"s","messageID":"m","partID":"p","field":"text","delta":"d"},"type":"message.part.delta"}"#,
            r#"{"payload":{"properties":{"sessionID":"s","messageID":"m","field":"text","delta":"d"},"type":"message.part.delta"},"directory":"/w"}"#,
        ] {
            assert!(
                matches!(decode_event(frame), Event::PartDelta { ref delta, .. } if delta == "d"),
                "{frame}"
            );
        }
        // Not one JSON object, or a payload that is not one: skipped.
        for frame in [
            r#"{"type":"session.idle","properties":{"sessionID":"s"}} trailing"#,
            r#"{"payload":"session.idle"}"#,
            r#"["session.idle"]"#,
            r#"{"type":"session.idle","properties":{"sessionID":"s"}"#,
        ] {
            assert_eq!(decode_event(frame), Event::Other, "{frame}");
        }
    }

    #[test]
    fn session_error_carries_name_and_message() {
        let e = decode_event(
            r#"{"type":"session.error","properties":{"sessionID":"ses_1","error":{"name":"APIError","data":{"message":"Bad Request: nope","statusCode":400}}}}"#,
        );
        assert_eq!(
            e,
            Event::SessionError {
                session_id: Some("ses_1".into()),
                error: ErrorInfo {
                    provider_status: Some(400),
                    retryable: None,
                    name: "APIError".into(),
                    message: "Bad Request: nope".into()
                }
            }
        );
    }

    #[test]
    fn session_lifecycle_events_name_parent_and_deletion() {
        let e = decode_event(
            r#"{"type":"session.created","properties":{"info":{"id":"ses_child","parentID":"ses_parent","title":"x"}}}"#,
        );
        assert_eq!(
            e,
            Event::SessionInfo {
                session_id: "ses_child".into(),
                parent_id: Some("ses_parent".into())
            }
        );
        let e = decode_event(r#"{"type":"session.deleted","properties":{"info":{"id":"ses_1"}}}"#);
        assert_eq!(
            e,
            Event::SessionDeleted {
                session_id: "ses_1".into()
            }
        );
        let e = decode_event(
            r#"{"type":"message.updated","properties":{"info":{"id":"msg_2","sessionID":"ses_1","role":"assistant","parentID":"msg_1","summary":true,"finish":"stop","time":{"created":1,"completed":2}}}}"#,
        );
        assert!(matches!(e, Event::MessageUpdated { summary: true, .. }));
    }

    #[test]
    fn an_endless_line_is_dropped_not_kept() {
        let mut p = SseParser::default();
        let chunk = vec![b'x'; 1024 * 1024];
        for _ in 0..(MAX_EVENT_BYTES / chunk.len() + 2) {
            assert!(p.feed(&chunk).is_empty());
        }
        assert!(p.line.len() < MAX_EVENT_BYTES);
        assert!(p.feed(b"\n\ndata: {}\n\n") == vec!["{}".to_string()]);
    }

    /// A line longer than the cap drops its event (counted), whether it arrives in one chunk or
    /// across several, and the next event is read as usual.
    #[test]
    fn an_oversized_event_is_counted_and_the_next_one_read() {
        let big = format!("data: {}\n", "x".repeat(MAX_EVENT_BYTES));
        for cut in [None, Some(10), Some(big.len() - 1)] {
            let mut p = SseParser::default();
            let got = match cut {
                None => p.feed(big.as_bytes()),
                Some(at) => {
                    let (a, b) = big.as_bytes().split_at(at);
                    let mut got = p.feed(a);
                    got.extend(p.feed(b));
                    got
                }
            };
            assert!(got.is_empty(), "cut {cut:?}");
            assert_eq!(
                p.feed(b"\ndata: ok\n\n"),
                vec!["ok".to_string()],
                "cut {cut:?}"
            );
            assert_eq!(p.take_dropped(), 1, "cut {cut:?}");
            assert!(p.line.capacity() < MAX_EVENT_BYTES, "cut {cut:?}");
        }
    }

    /// A running tool without a title of OpenCode's own is named by its main argument, on one
    /// bounded line.
    #[test]
    fn a_running_tool_is_named_by_its_title_or_main_argument() {
        let part = |state: &str| {
            decode_event(&format!(
                r#"{{"type":"message.part.updated","properties":{{"part":{{"id":"p","sessionID":"s","messageID":"m","type":"tool","tool":"bash","state":{state}}}}}}}"#
            ))
        };
        let title = |e: Event| match e {
            Event::PartUpdated {
                part: PartEvent::Tool { title, .. },
                ..
            } => title,
            other => panic!("not a tool part: {other:?}"),
        };
        assert_eq!(
            title(part(
                r#"{"status":"running","input":{"command":"cargo  test \t --all"}}"#
            )),
            Some("cargo test --all".to_string())
        );
        assert_eq!(
            title(part(
                r#"{"status":"running","title":"Runs the tests","input":{"command":"x"}}"#
            )),
            Some("Runs the tests".to_string())
        );
        assert_eq!(
            title(part(
                r#"{"status":"running","input":{"filePath":"/w/src/lib.rs"}}"#
            )),
            Some("/w/src/lib.rs".to_string())
        );
        let long = "y".repeat(1000);
        let cut = title(part(&format!(
            r#"{{"status":"running","input":{{"command":"{long}"}}}}"#
        )))
        .unwrap_or_default();
        assert_eq!(cut.chars().count(), TITLE_CHARS);
        assert_eq!(title(part(r#"{"status":"pending","input":{}}"#)), None);
    }

    #[test]
    fn message_and_part_events() {
        let e = decode_event(
            r#"{"type":"message.updated","properties":{"sessionID":"ses_1","info":{"id":"msg_2","sessionID":"ses_1","role":"assistant","parentID":"msg_1","finish":"stop","time":{"created":1,"completed":2}}}}"#,
        );
        assert_eq!(
            e,
            Event::MessageUpdated {
                session_id: "ses_1".into(),
                message_id: "msg_2".into(),
                role: "assistant".into(),
                parent_id: Some("msg_1".into()),
                completed: true,
                finish: Some("stop".into()),
                error: None,
                summary: false,
                agent: None,
                model: None,
                completed_at: Some(2),
                tokens: Tokens::default(),
                cost: 0.0,
            }
        );
        let e = decode_event(
            r#"{"type":"message.part.updated","properties":{"sessionID":"ses_1","time":1,"part":{"id":"prt_1","sessionID":"ses_1","messageID":"msg_2","type":"tool","tool":"bash","callID":"c","state":{"status":"running","title":"ls"}}}}"#,
        );
        assert_eq!(
            e,
            Event::PartUpdated {
                session_id: "ses_1".into(),
                message_id: "msg_2".into(),
                part_id: "prt_1".into(),
                part: PartEvent::Tool {
                    call: ToolCall {
                        tool: "bash".into(),
                        status: "running".into(),
                        title: Some("ls".into()),
                        error: None,
                    },
                    title: Some("ls".into())
                }
            }
        );
    }

    /// The busy kinds are read into typed shapes: every field the tracker uses comes through,
    /// what it does not use (a tool's output, a user message's diffs) is skipped, and a field of
    /// another shape costs that field, not the event.
    #[test]
    fn busy_kinds_read_every_used_field_and_tolerate_other_shapes() {
        let e = decode_event(
            r#"{"type":"message.updated","properties":{"info":{"id":"m","sessionID":"s","role":"assistant","agent":"build","providerID":"fake","modelID":"fake-strong","error":{"name":"APIError","data":{"message":"quota"}},"tokens":{"input":10,"output":-3,"reasoning":2.7,"cache":{"read":4,"write":"x"}},"cost":0.25,"time":{"created":1,"completed":1.5},"summary":{"diffs":[{"file":"a","before":"x"}]}}}}"#,
        );
        assert_eq!(
            e,
            Event::MessageUpdated {
                session_id: "s".into(),
                message_id: "m".into(),
                role: "assistant".into(),
                parent_id: None,
                completed: true,
                finish: None,
                error: Some(ErrorInfo {
                    provider_status: None,
                    retryable: None,
                    name: "APIError".into(),
                    message: "quota".into()
                }),
                summary: false,
                agent: Some("build".into()),
                model: Some("fake/fake-strong".into()),
                // A completion time that is not an integer is "completed, time unknown",
                // as `Value::as_u64` read it.
                completed_at: None,
                tokens: Tokens {
                    input: 10,
                    output: 0,
                    reasoning: 2,
                    cache_read: 4,
                    cache_write: 0,
                },
                cost: 0.25,
            }
        );
        // A text part's text is unescaped; a synthetic one is not counted.
        let e = decode_event(
            r#"{"type":"message.part.updated","properties":{"part":{"id":"p","sessionID":"s","messageID":"m","type":"text","text":"line\n\"two\"","synthetic":true}}}"#,
        );
        assert_eq!(
            e,
            Event::PartUpdated {
                session_id: "s".into(),
                message_id: "m".into(),
                part_id: "p".into(),
                part: PartEvent::Text {
                    text: "line\n\"two\"".into(),
                    counted: false
                }
            }
        );
        // A failed tool: its error, not its title; output and metadata skipped.
        let e = decode_event(
            r#"{"type":"message.part.updated","properties":{"part":{"id":"p","sessionID":"s","messageID":"m","type":"tool","tool":"write","state":{"status":"error","error":"denied","input":{"filePath":"/w/a","content":"big"},"output":"x","metadata":{"diff":[1,2]}}}}}"#,
        );
        assert_eq!(
            e,
            Event::PartUpdated {
                session_id: "s".into(),
                message_id: "m".into(),
                part_id: "p".into(),
                part: PartEvent::Tool {
                    call: ToolCall {
                        tool: "write".into(),
                        status: "error".into(),
                        title: None,
                        error: Some("denied".into()),
                    },
                    title: Some("/w/a".into())
                }
            }
        );
        // Fields of another shape: the state is not an object, the text not a string.
        let e = decode_event(
            r#"{"type":"message.part.updated","properties":{"sessionID":"s","part":{"messageID":"m","type":"tool","tool":"bash","state":"running"}}}"#,
        );
        assert!(
            matches!(&e, Event::PartUpdated { session_id, part: PartEvent::Tool { call, title: None }, .. }
                if session_id == "s" && call.status == "pending"),
            "{e:?}"
        );
        let e = decode_event(
            r#"{"type":"message.part.updated","properties":{"part":{"sessionID":"s","messageID":"m","type":"text","text":{"rich":true}}}}"#,
        );
        assert!(
            matches!(&e, Event::PartUpdated { part: PartEvent::Text { text, counted: true }, .. } if text.is_empty()),
            "{e:?}"
        );
        let e = decode_event(
            r#"{"type":"message.part.delta","properties":{"sessionID":"s","messageID":"m","partID":"p","field":"text","delta":"more"}}"#,
        );
        assert_eq!(
            e,
            Event::PartDelta {
                session_id: "s".into(),
                message_id: "m".into(),
                part_id: "p".into(),
                field: "text".into(),
                delta: "more".into()
            }
        );
        // Without the ids that place it, an event is skipped, whatever else it carries.
        for frame in [
            r#"{"type":"message.updated","properties":{"info":{"sessionID":"s","role":"assistant"}}}"#,
            r#"{"type":"message.updated","properties":{"info":"m"}}"#,
            r#"{"type":"message.part.updated","properties":{"part":{"sessionID":"s","type":"text"}}}"#,
            r#"{"type":"message.part.delta","properties":[1]}"#,
            r#"{"type":"message.part.delta"}"#,
        ] {
            assert_eq!(decode_event(frame), Event::Other, "{frame}");
        }
    }
}

//! A thin, typed facade over the generated client: the calls the gateway makes, returning our own
//! domain types so that no module outside `opencode` names a generated type.
//!
//! Every call passes the session's `directory`: OpenCode keeps one instance per directory and
//! routes a request by that query parameter, so a task started in `/repo/a` must be read back
//! through `/repo/a` too.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::client::{types, Client};
use super::error::OpencodeError;

/// Basic-auth user name OpenCode expects.
pub const AUTH_USER: &str = "opencode";

/// A handle on one OpenCode server's HTTP API.
#[derive(Clone, Debug)]
pub struct Api {
    client: Client,
    /// The client the generated one uses (same auth and timeout), for the calls decoded by hand.
    http: reqwest::Client,
    /// Same auth, connect timeout only: for the long-lived event stream.
    stream_http: reqwest::Client,
    base_url: String,
}

/// An agent as the host needs to see it.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct AgentInfo {
    pub name: String,
    /// `primary`, `subagent` or `all`.
    pub mode: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The agent's own model (`provider/model`), when it pins one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// The models a server offers, as exact `provider/model` ids, and its defaults per provider.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelCatalog {
    pub models: Vec<String>,
    /// provider id -> default model id.
    pub defaults: BTreeMap<String, String>,
}

impl ModelCatalog {
    pub fn contains(&self, model: &str) -> bool {
        self.models.iter().any(|m| m == model)
    }
}

/// What `GET /session/status` says about one session. Idle sessions are absent from that list.
#[derive(Debug, Clone, PartialEq)]
pub enum SessionActivity {
    Busy,
    Retry {
        attempt: u64,
        message: String,
        /// Epoch milliseconds of the next attempt.
        next: u64,
    },
    Idle,
}

/// Token counts of a turn (summed over its assistant messages).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Tokens {
    pub input: u64,
    pub output: u64,
    pub reasoning: u64,
    pub cache_read: u64,
    pub cache_write: u64,
}

/// An error OpenCode recorded on an assistant message or a session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ErrorInfo {
    /// OpenCode's error name, e.g. `APIError`, `ProviderAuthError`, `MessageAbortedError`.
    pub name: String,
    pub message: String,
}

/// One tool call of a turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ToolCall {
    pub tool: String,
    /// `pending`, `running`, `completed` or `error`.
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The state of one turn (our user message and the assistant messages answering it), read from
/// `GET /session/{id}/message`. This is the authority on completion (design notes §5).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TurnState {
    /// Our user message is in the session.
    pub user_message_seen: bool,
    /// Assistant messages whose `parentID` is our user message.
    pub assistant_messages: usize,
    /// The latest of them has `time.completed` with a terminal finish, or an error.
    pub finished: bool,
    /// The latest of them has `time.completed` (whatever its finish). Completed with
    /// `tool-calls` while the session is idle means the agent loop stopped after a tool call
    /// without a final answer (a rejected permission does this).
    pub latest_completed: bool,
    pub finish: Option<String>,
    pub error: Option<ErrorInfo>,
    /// Text of the latest assistant message (what the model said last).
    pub text: String,
    pub model: Option<String>,
    pub agent: Option<String>,
    pub tokens: Tokens,
    pub cost: f64,
    pub tools: Vec<ToolCall>,
    /// Completed steps (assistant messages with `time.completed`).
    pub steps: u32,
    /// Epoch ms the latest assistant message completed.
    pub completed_at: Option<u64>,
    /// `text` was cut at the gateway's `limits.max_result_chars`.
    #[serde(default)]
    pub text_capped: bool,
}

impl TurnState {
    /// Keeps at most `max` characters of the text (memory and state files stay bounded).
    pub fn cap_text(mut self, max: usize) -> Self {
        if let Some((cut, _)) = self.text.char_indices().nth(max) {
            self.text.truncate(cut);
            self.text_capped = true;
        }
        self
    }
}

/// A pending permission ask.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PermissionAsk {
    pub id: String,
    pub session_id: String,
    /// What is asked for, e.g. `bash`, `edit`, `external_directory`.
    pub permission: String,
    /// The patterns it covers, e.g. the command line.
    pub patterns: Vec<String>,
    /// Tool-specific details (e.g. the command), as OpenCode sends them.
    pub metadata: serde_json::Value,
}

/// One file a session changed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FileChange {
    pub file: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    pub additions: u64,
    pub deletions: u64,
}

/// How to answer a permission ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PermissionReply {
    Once,
    Always,
    Reject,
}

/// A finish reason that ends a turn. `tool-calls` (and an absent finish) mean another step follows.
pub fn is_terminal_finish(finish: &str) -> bool {
    !matches!(finish, "tool-calls" | "unknown" | "")
}

impl Api {
    /// A client for `base_url` (e.g. `http://127.0.0.1:4096`), authenticating with `password`
    /// when given. `request_timeout` bounds every call: the generated client's own default
    /// (15 s, not configurable) is replaced by ours.
    pub fn new(
        base_url: &str,
        password: Option<&str>,
        request_timeout: Duration,
    ) -> Result<Self, OpencodeError> {
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(password) = password {
            let value = basic_auth_header(AUTH_USER, password);
            let mut value = reqwest::header::HeaderValue::from_str(&value).map_err(|_| {
                OpencodeError::Config("the OpenCode password contains invalid characters".into())
            })?;
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        /// Idle keep-alive connections kept per server.
        const POOL_MAX_IDLE_PER_HOST: usize = 8;
        /// How long an idle keep-alive connection is kept.
        const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
        // Idle keep-alive connections are bounded in number and in time. By default reqwest keeps
        // any number of idle connections per host (and each for 90 s), so a burst of 300
        // concurrent tasks left about 280 sockets open to one OpenCode after the burst: file
        // descriptors in both processes for nothing. Eight idle connections cover the steady load (a few tasks'
        // reads and the reconcile) and are still reused; the rest close once idle for 30 s. The
        // stream client holds one long response, which these settings do not cut; they only
        // bound its idle leftovers after a reconnect.
        let build = |total: Option<Duration>| {
            let mut b = reqwest::Client::builder()
                .default_headers(headers.clone())
                .connect_timeout(request_timeout)
                .pool_max_idle_per_host(POOL_MAX_IDLE_PER_HOST)
                .pool_idle_timeout(POOL_IDLE_TIMEOUT);
            if let Some(t) = total {
                b = b.timeout(t);
            }
            b.build()
                .map_err(|e| OpencodeError::Config(format!("cannot build an HTTP client: {e}")))
        };
        let http = build(Some(request_timeout))?;
        // The event stream is one long response: it gets no overall timeout.
        let stream_http = build(None)?;
        let base_url = base_url.trim_end_matches('/').to_string();
        Ok(Self {
            client: Client::new_with_client(&base_url, http.clone()),
            http,
            stream_http,
            base_url,
        })
    }

    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// A GET of `path` on the streaming client (same auth, no overall timeout).
    pub(crate) fn stream_get(&self, path: &str) -> reqwest::RequestBuilder {
        self.stream_http.get(format!("{}{path}", self.base_url))
    }

    /// `GET /global/health`: the server's version, proving it is OpenCode and the password works.
    pub async fn health(&self) -> Result<String, OpencodeError> {
        let r = self
            .client
            .global_health()
            .send()
            .await
            .map_err(|e| OpencodeError::from_client("GET /global/health", e))?;
        Ok(r.into_inner().version)
    }

    /// `GET /agent`.
    pub async fn agents(&self, directory: &str) -> Result<Vec<AgentInfo>, OpencodeError> {
        let r = self
            .client
            .app_agents()
            .directory(directory)
            .send()
            .await
            .map_err(|e| OpencodeError::from_client("GET /agent", e))?;
        Ok(r.into_inner()
            .into_iter()
            .map(|a| AgentInfo {
                name: a.name,
                mode: a.mode.to_string(),
                description: a.description,
                model: a.model.map(|m| format!("{}/{}", m.provider_id, m.model_id)),
            })
            .collect())
    }

    /// `GET /config/providers`: every model as `provider/model`, sorted.
    pub async fn models(&self, directory: &str) -> Result<ModelCatalog, OpencodeError> {
        let r = self
            .client
            .config_providers()
            .directory(directory)
            .send()
            .await
            .map_err(|e| OpencodeError::from_client("GET /config/providers", e))?
            .into_inner();
        let mut models: Vec<String> = r
            .providers
            .iter()
            .flat_map(|p| p.models.keys().map(move |m| format!("{}/{}", p.id, m)))
            .collect();
        models.sort();
        Ok(ModelCatalog {
            models,
            defaults: r.default.into_iter().collect(),
        })
    }

    /// `POST /session?directory=`: a new session with a title (without one, OpenCode spends an
    /// LLM call naming it).
    pub async fn create_session(
        &self,
        directory: &str,
        title: &str,
    ) -> Result<String, OpencodeError> {
        let body = types::SessionCreateBody {
            agent: None,
            metadata: Default::default(),
            model: None,
            parent_id: None,
            permission: None,
            title: Some(title.to_string()),
            workspace_id: None,
        };
        let r = self
            .client
            .session_create()
            .directory(directory)
            .body(body)
            .send()
            .await
            .map_err(|e| OpencodeError::from_client("POST /session", e))?;
        Ok(r.into_inner().id)
    }

    /// `POST /session/{id}/prompt_async` with our own message id, so the turn can be told apart
    /// from every other (design notes §5). OpenCode answers 204 at once; failures of the turn
    /// itself arrive later as events.
    pub async fn prompt_async(
        &self,
        directory: &str,
        session_id: &str,
        message_id: &str,
        text: &str,
        agent: Option<&str>,
        model: Option<&str>,
    ) -> Result<(), OpencodeError> {
        let model = match model {
            Some(m) => {
                let (provider, model) = split_model(m).ok_or_else(|| {
                    OpencodeError::Config(format!("model `{m}` is not of the form provider/model"))
                })?;
                Some(types::SessionPromptAsyncBodyModel {
                    provider_id: provider.to_string(),
                    model_id: model.to_string(),
                })
            }
            None => None,
        };
        let part = types::TextPartInput {
            id: None,
            ignored: None,
            metadata: Default::default(),
            synthetic: None,
            text: text.to_string(),
            time: None,
            type_: types::TextPartInputType::Text,
        };
        let body = types::SessionPromptAsyncBody {
            agent: agent.map(String::from),
            format: None,
            message_id: Some(message_id.to_string()),
            model,
            no_reply: None,
            parts: vec![part.into()],
            system: None,
            tools: Default::default(),
            variant: None,
        };
        self.client
            .session_prompt_async()
            .session_id(session_id)
            .directory(directory)
            .body(body)
            .send()
            .await
            .map_err(|e| OpencodeError::from_client("POST /session/{id}/prompt_async", e))?;
        Ok(())
    }

    /// `POST /session/{id}/abort`. Returns what OpenCode said (it answers `true` for an idle
    /// session too); a 404 is an error, never a silent success.
    pub async fn abort(&self, directory: &str, session_id: &str) -> Result<bool, OpencodeError> {
        let r = self
            .client
            .session_abort()
            .session_id(session_id)
            .directory(directory)
            .send()
            .await
            .map_err(|e| OpencodeError::from_client("POST /session/{id}/abort", e))?;
        Ok(r.into_inner())
    }

    /// `GET /session/status`: non-idle sessions of one directory's instance.
    ///
    /// Decoded by hand rather than with the generated `SessionStatus` (a closed, tagged enum):
    /// a newer OpenCode with one more status type must not break the completion checks that
    /// read this on every reconcile. See [`session_activity_from_json`].
    pub async fn session_activity(
        &self,
        directory: &str,
    ) -> Result<BTreeMap<String, SessionActivity>, OpencodeError> {
        const OPERATION: &str = "GET /session/status";
        let response = self
            .http
            .get(format!("{}/session/status", self.base_url))
            .query(&[("directory", directory)])
            .send()
            .await
            .map_err(|e| OpencodeError::from_reqwest(OPERATION, &e))?;
        let value = OpencodeError::json_body(OPERATION, response).await?;
        session_activity_from_json(&value).map_err(|detail| OpencodeError::Decode {
            operation: OPERATION.into(),
            detail,
        })
    }

    /// Reads the session's messages and derives the state of the turn opened by
    /// `user_message_id`.
    pub async fn turn_state(
        &self,
        directory: &str,
        session_id: &str,
        user_message_id: &str,
    ) -> Result<TurnState, OpencodeError> {
        let r = self
            .client
            .session_messages()
            .session_id(session_id)
            .directory(directory)
            .send()
            .await
            .map_err(|e| OpencodeError::from_client("GET /session/{id}/message", e))?;
        Ok(derive_turn(&r.into_inner(), user_message_id))
    }

    /// `GET /session/{id}/diff`: files the session changed (optionally since one message).
    pub async fn changed_files(
        &self,
        directory: &str,
        session_id: &str,
        message_id: Option<&str>,
    ) -> Result<Vec<FileChange>, OpencodeError> {
        let mut req = self
            .client
            .session_diff()
            .session_id(session_id)
            .directory(directory);
        if let Some(m) = message_id {
            req = req.message_id(m);
        }
        let r = req
            .send()
            .await
            .map_err(|e| OpencodeError::from_client("GET /session/{id}/diff", e))?;
        Ok(r.into_inner()
            .into_iter()
            .filter_map(|d| {
                Some(FileChange {
                    file: d.file?,
                    status: d.status.map(|s| s.to_string()),
                    additions: d.additions.max(0.0) as u64,
                    deletions: d.deletions.max(0.0) as u64,
                })
            })
            .collect())
    }

    /// `GET /permission`: pending asks of one directory's instance.
    pub async fn permissions(&self, directory: &str) -> Result<Vec<PermissionAsk>, OpencodeError> {
        let r = self
            .client
            .permission_list()
            .directory(directory)
            .send()
            .await
            .map_err(|e| OpencodeError::from_client("GET /permission", e))?;
        Ok(r.into_inner()
            .into_iter()
            .map(|p| PermissionAsk {
                id: p.id,
                session_id: p.session_id,
                permission: p.permission,
                patterns: p.patterns,
                metadata: serde_json::Value::Object(p.metadata),
            })
            .collect())
    }

    /// `POST /permission/{id}/reply`.
    pub async fn reply_permission(
        &self,
        directory: &str,
        request_id: &str,
        reply: PermissionReply,
    ) -> Result<bool, OpencodeError> {
        let reply = match reply {
            PermissionReply::Once => "once",
            PermissionReply::Always => "always",
            PermissionReply::Reject => "reject",
        };
        let r = self
            .client
            .permission_reply()
            .request_id(request_id)
            .directory(directory)
            .body(types::PermissionReplyBody {
                message: None,
                reply: reply.to_string(),
            })
            .send()
            .await
            .map_err(|e| OpencodeError::from_client("POST /permission/{id}/reply", e))?;
        Ok(r.into_inner())
    }
}

/// `provider/model` -> (`provider`, `model`). The model part may itself contain slashes
/// (`openrouter/anthropic/claude`), the provider may not.
pub fn split_model(model: &str) -> Option<(&str, &str)> {
    let (p, m) = model.split_once('/')?;
    (!p.is_empty() && !m.is_empty()).then_some((p, m))
}

/// `Basic <base64(user:password)>` (RFC 7617), standard alphabet with padding.
fn basic_auth_header(user: &str, password: &str) -> String {
    use base64::Engine as _;
    let credentials =
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Basic {credentials}")
}

/// Decodes a `GET /session/status` answer (`{sessionID: {type, ...}}`). Lenient: fields it does
/// not use are ignored, and a status type it does not know counts as busy (the endpoint lists only
/// sessions that are not idle, so whatever it is, the session is doing something).
pub fn session_activity_from_json(
    value: &serde_json::Value,
) -> Result<BTreeMap<String, SessionActivity>, String> {
    let map = value
        .as_object()
        .ok_or_else(|| format!("expected an object of sessions, got {value}"))?;
    Ok(map
        .iter()
        .map(|(id, status)| {
            let activity = match status.get("type").and_then(|t| t.as_str()) {
                Some("idle") => SessionActivity::Idle,
                Some("retry") => SessionActivity::Retry {
                    attempt: status.get("attempt").and_then(|a| a.as_u64()).unwrap_or(0),
                    message: status
                        .get("message")
                        .and_then(|m| m.as_str())
                        .unwrap_or_default()
                        .to_string(),
                    next: status.get("next").and_then(|n| n.as_u64()).unwrap_or(0),
                },
                _ => SessionActivity::Busy,
            };
            (id.clone(), activity)
        })
        .collect())
}

/// The turn state (`derive_turn`) from the JSON text of a `GET /session/{id}/message` answer,
/// decoded with the generated types exactly as [`Api::turn_state`] decodes it. For tests and
/// fuzzing: no generated type crosses this boundary.
pub fn turn_from_messages_json(json: &str, user_message_id: &str) -> Result<TurnState, String> {
    let messages: Vec<types::SessionMessagesResponseItem> =
        serde_json::from_str(json).map_err(|e| e.to_string())?;
    Ok(derive_turn(&messages, user_message_id))
}

/// Derives a turn's state from the session's messages (pure, so it is unit-tested on recorded
/// responses).
pub(crate) fn derive_turn(
    messages: &[types::SessionMessagesResponseItem],
    user_message_id: &str,
) -> TurnState {
    let mut state = TurnState::default();
    let mut latest: Option<(&types::AssistantMessage, &[types::Part])> = None;
    for item in messages {
        match &item.info {
            types::Message::UserMessage(u) if u.id == user_message_id => {
                state.user_message_seen = true;
            }
            types::Message::AssistantMessage(a) if a.parent_id == user_message_id => {
                state.assistant_messages += 1;
                state.cost += a.cost;
                let t = &a.tokens;
                state.tokens.input += t.input.max(0.0) as u64;
                state.tokens.output += t.output.max(0.0) as u64;
                state.tokens.reasoning += t.reasoning.max(0.0) as u64;
                state.tokens.cache_read += t.cache.read.max(0.0) as u64;
                state.tokens.cache_write += t.cache.write.max(0.0) as u64;
                if a.time.completed.is_some() {
                    state.steps += 1;
                }
                for part in &item.parts {
                    if let types::Part::ToolPart(tp) = part {
                        state.tools.push(tool_call(tp));
                    }
                }
                // Messages come in creation order; ids are ascending too. Keep the newest.
                let newer = latest.is_none_or(|(prev, _)| a.id >= prev.id);
                if newer {
                    latest = Some((a, &item.parts));
                }
            }
            _ => {}
        }
    }
    if let Some((a, parts)) = latest {
        state.model = Some(format!("{}/{}", a.provider_id, a.model_id));
        state.agent = Some(a.agent.clone());
        state.finish = a.finish.clone();
        state.error = a.error.as_ref().map(error_info);
        state.completed_at = a.time.completed;
        state.text = parts
            .iter()
            .filter_map(|p| match p {
                types::Part::TextPart(t)
                    if t.synthetic != Some(true) && t.ignored != Some(true) =>
                {
                    Some(t.text.as_str())
                }
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("\n");
        let terminal = a.finish.as_deref().is_some_and(is_terminal_finish);
        state.latest_completed = a.time.completed.is_some();
        state.finished = state.error.is_some() || (a.time.completed.is_some() && terminal);
    }
    state
}

fn tool_call(tp: &types::ToolPart) -> ToolCall {
    let (status, title, error) = match &tp.state {
        types::ToolState::ToolStatePending(_) => ("pending", None, None),
        types::ToolState::ToolStateRunning(r) => ("running", r.title.clone(), None),
        types::ToolState::ToolStateCompleted(c) => ("completed", Some(c.title.clone()), None),
        types::ToolState::ToolStateError(e) => ("error", None, Some(e.error.clone())),
        types::ToolState::Object(o) => (
            o.get("status")
                .and_then(|s| s.as_str())
                .unwrap_or("unknown"),
            None,
            None,
        ),
    };
    ToolCall {
        tool: tp.tool.clone(),
        status: status.to_string(),
        title,
        error,
    }
}

/// OpenCode's message errors all look like `{name, data: {message, ...}}`; read them as JSON so
/// that a variant we do not know still yields its name and message.
fn error_info(e: &types::AssistantMessageError) -> ErrorInfo {
    let value = serde_json::to_value(e).unwrap_or(serde_json::Value::Null);
    error_info_from_json(&value)
}

/// `{name, data: {message}}` (or `{name, message}`) -> [`ErrorInfo`].
pub fn error_info_from_json(value: &serde_json::Value) -> ErrorInfo {
    let name = value
        .get("name")
        .and_then(|n| n.as_str())
        .unwrap_or("UnknownError")
        .to_string();
    let message = value
        .pointer("/data/message")
        .or_else(|| value.get("message"))
        .and_then(|m| m.as_str())
        .map(String::from)
        .unwrap_or_else(|| value.to_string());
    ErrorInfo { name, message }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_auth_header_is_rfc7617() {
        // RFC 7617 section 2's example.
        assert_eq!(
            basic_auth_header("Aladdin", "open sesame"),
            "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ=="
        );
        // Padding, and `+`: the standard alphabet, not the URL-safe one.
        assert_eq!(basic_auth_header("opencode", "a"), "Basic b3BlbmNvZGU6YQ==");
        assert_eq!(basic_auth_header("", "?>?"), "Basic Oj8+Pw==");
    }

    #[test]
    fn model_ids_split_at_the_first_slash() {
        assert_eq!(split_model("fake/fake-model"), Some(("fake", "fake-model")));
        assert_eq!(
            split_model("openrouter/anthropic/claude"),
            Some(("openrouter", "anthropic/claude"))
        );
        assert_eq!(split_model("nomodel"), None);
        assert_eq!(split_model("/x"), None);
    }

    #[test]
    fn only_tool_calls_continue_a_turn() {
        assert!(is_terminal_finish("stop"));
        assert!(is_terminal_finish("length"));
        assert!(!is_terminal_finish("tool-calls"));
    }

    /// Decodes a recorded response of the real OpenCode 1.18.33 with the generated types, naming
    /// the JSON path on failure.
    fn fixture<T: serde::de::DeserializeOwned>(name: &str) -> T {
        let path = format!(
            "{}/tests/fixtures/opencode/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).expect("fixture exists");
        let de = &mut serde_json::Deserializer::from_str(&text);
        serde_path_to_error::deserialize(de)
            .unwrap_or_else(|e| panic!("{name} does not decode at {}: {e}", e.path()))
    }

    fn user_message_id(messages: &[types::SessionMessagesResponseItem]) -> String {
        messages
            .iter()
            .find_map(|m| match &m.info {
                types::Message::UserMessage(u) => Some(u.id.clone()),
                _ => None,
            })
            .expect("a user message")
    }

    #[test]
    fn recorded_agents_and_providers_decode() {
        let agents: Vec<types::Agent> = fixture("agents.json");
        assert!(agents.iter().any(|a| a.name == "build"));
        let providers: types::ConfigProvidersResponse = fixture("config_providers.json");
        let fake = providers
            .providers
            .iter()
            .find(|p| p.id == "fake")
            .expect("fake provider");
        assert!(fake.models.contains_key("fake-model"));
    }

    #[test]
    fn enum_values_from_a_newer_opencode_still_decode() {
        let mut agents: serde_json::Value = fixture("agents.json");
        if let Some(list) = agents.as_array_mut() {
            for a in list {
                a["mode"] = serde_json::json!("a-mode-from-the-future");
            }
        }
        let decoded: Vec<types::Agent> =
            serde_json::from_value(agents).expect("unknown enum values decode");
        assert!(decoded.iter().all(|a| a.mode == "a-mode-from-the-future"));
    }

    #[test]
    fn recorded_sessions_statuses_and_permissions_decode() {
        let s: types::Session = fixture("session.json");
        assert!(s.id.starts_with("ses"));
        let _: types::Session = fixture("session_after_turn.json");
        let busy: std::collections::HashMap<String, types::SessionStatus> =
            fixture("session_status_busy.json");
        assert!(busy
            .values()
            .any(|v| matches!(v, types::SessionStatus::Busy)));
        let retry: std::collections::HashMap<String, types::SessionStatus> =
            fixture("session_status_retry.json");
        assert!(retry
            .values()
            .any(|v| matches!(v, types::SessionStatus::Retry { .. })));
        let asks: Vec<types::PermissionRequest> = fixture("permission_list.json");
        assert!(asks.iter().all(|a| a.id.starts_with("per")));
    }

    #[test]
    fn a_text_turn_is_finished_with_its_text_and_tokens() {
        let messages: Vec<types::SessionMessagesResponseItem> = fixture("messages_text.json");
        let turn = derive_turn(&messages, &user_message_id(&messages));
        assert!(turn.user_message_seen && turn.finished && turn.latest_completed);
        assert_eq!(turn.finish.as_deref(), Some("stop"));
        assert!(turn.text.starts_with("ECHO: "), "{}", turn.text);
        assert!(turn.tokens.input > 0 && turn.tokens.output > 0);
        assert_eq!(turn.model.as_deref(), Some("fake/fake-model"));
        assert!(turn.error.is_none());
    }

    #[test]
    fn a_tool_turn_lists_its_tools_and_ends_on_the_final_step() {
        let messages: Vec<types::SessionMessagesResponseItem> = fixture("messages_tool.json");
        let turn = derive_turn(&messages, &user_message_id(&messages));
        assert!(turn.finished);
        assert!(turn.assistant_messages >= 2, "a tool step, then the answer");
        assert!(turn
            .tools
            .iter()
            .any(|t| t.tool == "bash" && t.status == "completed"));
        assert!(turn.steps >= 2);
    }

    #[test]
    fn error_and_abort_turns_carry_the_error() {
        let messages: Vec<types::SessionMessagesResponseItem> = fixture("messages_error.json");
        let turn = derive_turn(&messages, &user_message_id(&messages));
        let error = turn.error.expect("error");
        assert_eq!(error.name, "APIError");
        assert!(
            error.message.contains("scripted bad request"),
            "{}",
            error.message
        );
        assert!(turn.finished);
        let aborted: Vec<types::SessionMessagesResponseItem> = fixture("messages_abort.json");
        let turn = derive_turn(&aborted, &user_message_id(&aborted));
        assert_eq!(
            turn.error.map(|e| e.name).as_deref(),
            Some("MessageAbortedError")
        );
    }

    #[test]
    fn a_turn_belongs_to_its_own_user_message_only() {
        let messages: Vec<types::SessionMessagesResponseItem> = fixture("messages_text.json");
        let other = derive_turn(&messages, "msg_someone_else");
        assert!(!other.user_message_seen && !other.finished && other.text.is_empty());
    }

    #[test]
    fn capping_keeps_whole_characters_and_says_so() {
        let turn = TurnState {
            text: "héllo".into(),
            ..TurnState::default()
        };
        let capped = turn.clone().cap_text(2);
        assert_eq!(capped.text, "hé");
        assert!(capped.text_capped);
        let whole = turn.cap_text(5);
        assert_eq!(whole.text, "héllo");
        assert!(!whole.text_capped);
    }

    #[test]
    fn error_json_yields_name_and_message() {
        let e = error_info_from_json(
            &serde_json::json!({"name": "APIError", "data": {"message": "bad key", "statusCode": 400}}),
        );
        assert_eq!(e.name, "APIError");
        assert_eq!(e.message, "bad key");
    }
}

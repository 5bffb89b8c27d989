//! The hand-written value types the OpenCode facade returns: what the rest of the gateway knows
//! of OpenCode. No generated type appears here or leaves `opencode/`; these are built from the
//! generated ones (in `api.rs` and `messages.rs`) or decoded leniently from JSON, so a newer
//! OpenCode that adds a field or a variant cannot break them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

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
    /// `provider/model` -> the names of its variants (reasoning effort levels and the like, as
    /// the provider's config defines them); models without variants are absent.
    pub variants: BTreeMap<String, Vec<String>>,
    /// `provider/model` -> its price as the catalog lists it.
    pub prices: BTreeMap<String, Price>,
    /// The models able to work as a delegated agent: they call tools and hold a context of at
    /// least [`CAPABLE_CONTEXT`] tokens.
    pub capable: std::collections::BTreeSet<String>,
}

/// The least context, in tokens, of a model [`ModelCatalog::capable`] lists: an agent's system
/// prompt and tool definitions alone take several thousand.
pub const CAPABLE_CONTEXT: f64 = 32_000.0;

/// A model's price in the catalog, in USD per million tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Price {
    pub input: f64,
    pub output: f64,
    #[serde(default)]
    pub cache_read: f64,
    #[serde(default)]
    pub cache_write: f64,
}

impl Price {
    /// What `tokens` cost at this price: input at the input price, output and reasoning at the
    /// output price, cache reads and writes at their own prices.
    pub fn of(&self, tokens: &Tokens) -> f64 {
        let per = |n: u64, usd_per_mtok: f64| n as f64 * usd_per_mtok / 1_000_000.0;
        per(tokens.input, self.input)
            + per(tokens.output.saturating_add(tokens.reasoning), self.output)
            + per(tokens.cache_read, self.cache_read)
            + per(tokens.cache_write, self.cache_write)
    }

    /// Every price is zero (a free or local model).
    pub fn is_free(&self) -> bool {
        [self.input, self.output, self.cache_read, self.cache_write]
            .iter()
            .all(|p| *p <= 0.0)
    }
}

impl ModelCatalog {
    pub fn contains(&self, model: &str) -> bool {
        self.models.iter().any(|m| m == model)
    }

    /// The variants `model` offers (none for an unknown model).
    pub fn variants_of(&self, model: &str) -> &[String] {
        self.variants.get(model).map_or(&[], Vec::as_slice)
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

impl Tokens {
    /// Adds `other`, saturating: the counts come from OpenCode's floats (cast to the largest
    /// integer when absurd), and a sum must neither panic nor wrap to a small number.
    pub fn add(&mut self, other: &Tokens) {
        self.input = self.input.saturating_add(other.input);
        self.output = self.output.saturating_add(other.output);
        self.reasoning = self.reasoning.saturating_add(other.reasoning);
        self.cache_read = self.cache_read.saturating_add(other.cache_read);
        self.cache_write = self.cache_write.saturating_add(other.cache_write);
    }

    /// Takes away `other`, saturating at zero.
    pub fn sub(&mut self, other: &Tokens) {
        self.input = self.input.saturating_sub(other.input);
        self.output = self.output.saturating_sub(other.output);
        self.reasoning = self.reasoning.saturating_sub(other.reasoning);
        self.cache_read = self.cache_read.saturating_sub(other.cache_read);
        self.cache_write = self.cache_write.saturating_sub(other.cache_write);
    }
}

/// Who wrote a message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Role {
    User,
    Assistant,
    /// A message kind this gateway does not know (a newer OpenCode).
    #[default]
    Other,
}

/// One message of a session, normalised: the view the turn logic judges, whether the message
/// was read over HTTP or assembled from events.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MessageView {
    pub id: String,
    pub role: Role,
    pub parent_id: Option<String>,
    /// `time.completed` is set (assistant messages).
    pub completed: bool,
    /// Epoch ms of `time.completed`.
    pub completed_at: Option<u64>,
    pub finish: Option<String>,
    pub error: Option<ErrorInfo>,
    /// An assistant message holding a compaction summary (`summary: true`).
    pub summary: bool,
    /// A user message OpenCode wrote to request a compaction (it holds a `compaction` part).
    pub compaction: bool,
    pub agent: Option<String>,
    /// `provider/model`.
    pub model: Option<String>,
    pub tokens: Tokens,
    pub cost: f64,
    /// Its text parts that are neither synthetic nor ignored, joined by newlines.
    pub text: String,
    pub tools: Vec<ToolCall>,
}

/// An error OpenCode recorded on an assistant message or a session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ErrorInfo {
    /// OpenCode's error name, e.g. `APIError`, `ProviderAuthError`, `MessageAbortedError`.
    pub name: String,
    pub message: String,
    /// The HTTP status the model's provider answered with, when the error is one
    /// (`APIError`'s `statusCode`): what tells a rate limit, an overload or a server error that
    /// OpenCode's own retries did not clear from a request the provider refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_status: Option<u16>,
    /// OpenCode's own judgement that the provider call may succeed if tried again
    /// (`APIError`'s `isRetryable`: an overload, a dropped connection), after its own retries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retryable: Option<bool>,
}

impl ErrorInfo {
    /// A provider error that another model may not hit: a rate limit (429), an overload (529,
    /// 503), another server error (5xx) or one OpenCode calls retryable (a dropped connection),
    /// left after OpenCode's own retries. A refused request (400, 401, ...) is not one.
    pub fn is_provider_outage(&self) -> bool {
        self.retryable == Some(true)
            || self
                .provider_status
                .is_some_and(|s| s == 429 || (500..600).contains(&s))
    }
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

impl PermissionAsk {
    /// What is asked, on one line of at most `max_chars` characters: the permission and its
    /// patterns (`bash rm -rf build`), cut with `…`. The patterns are the agent's text: shown
    /// to the host as data, never read as instructions.
    pub fn summary(&self, max_chars: usize) -> String {
        let mut what = self.permission.clone();
        for p in &self.patterns {
            what.push(' ');
            what.push_str(p);
        }
        let flat: String = what
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        if flat.chars().count() <= max_chars {
            return flat;
        }
        let mut cut: String = flat.chars().take(max_chars.saturating_sub(1)).collect();
        cut.push('…');
        cut
    }
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

/// `provider/model` -> (`provider`, `model`). The model part may itself contain slashes
/// (`openrouter/anthropic/claude`), the provider may not.
pub fn split_model(model: &str) -> Option<(&str, &str)> {
    let (p, m) = model.split_once('/')?;
    (!p.is_empty() && !m.is_empty()).then_some((p, m))
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
    let provider_status = value
        .pointer("/data/statusCode")
        .and_then(serde_json::Value::as_u64)
        .and_then(|s| u16::try_from(s).ok());
    let retryable = value
        .pointer("/data/isRetryable")
        .and_then(serde_json::Value::as_bool);
    ErrorInfo {
        name,
        message,
        provider_status,
        retryable,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_asks_summary_is_one_bounded_line() {
        let ask = PermissionAsk {
            id: "per_1".into(),
            session_id: "ses".into(),
            permission: "bash".into(),
            patterns: vec!["rm -rf build\nrm -rf /".into(), "ls".into()],
            metadata: serde_json::Value::Null,
        };
        assert_eq!(ask.summary(100), "bash rm -rf build rm -rf / ls");
        assert_eq!(ask.summary(8), "bash rm…");
        assert_eq!(ask.summary(8).chars().count(), 8);
    }

    #[test]
    fn token_sums_saturate() {
        let huge = Tokens {
            input: u64::MAX,
            output: u64::MAX - 1,
            reasoning: 1,
            cache_read: 0,
            cache_write: u64::MAX,
        };
        let mut sum = huge;
        sum.add(&huge);
        assert_eq!(sum.input, u64::MAX);
        assert_eq!(sum.output, u64::MAX);
        assert_eq!(sum.reasoning, 2);
        assert_eq!(sum.cache_write, u64::MAX);
    }

    use super::*;

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

    #[test]
    fn error_json_yields_name_and_message() {
        let e = error_info_from_json(
            &serde_json::json!({"name": "APIError", "data": {"message": "bad key", "statusCode": 400}}),
        );
        assert_eq!(e.name, "APIError");
        assert_eq!(e.message, "bad key");
        assert_eq!(e.provider_status, Some(400));
        assert!(!e.is_provider_outage(), "a refused request");
        for (data, outage) in [
            (
                serde_json::json!({"message": "slow down", "statusCode": 429}),
                true,
            ),
            (
                serde_json::json!({"message": "overloaded", "statusCode": 529}),
                true,
            ),
            (
                serde_json::json!({"message": "closed", "isRetryable": true}),
                true,
            ),
            (
                serde_json::json!({"message": "no", "statusCode": 401, "isRetryable": false}),
                false,
            ),
            (
                serde_json::json!({"message": "odd", "statusCode": "500"}),
                false,
            ),
        ] {
            let e = error_info_from_json(&serde_json::json!({"name": "APIError", "data": data}));
            assert_eq!(e.is_provider_outage(), outage, "{e:?}");
        }
    }
}

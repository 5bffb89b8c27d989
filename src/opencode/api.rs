//! A thin, typed facade over the generated client: the calls the gateway makes, returning our own
//! domain types so that no module outside `opencode` names a generated type.
//!
//! Every call passes the session's `directory`: OpenCode keeps one instance per directory and
//! routes a request by that query parameter, so a task started in `/repo/a` must be read back
//! through `/repo/a` too.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::client::{types, Client};
use super::error::OpencodeError;
use super::listings::{Listing, Remembered};
use super::messages;
use super::types::{
    session_activity_from_json, split_model, AgentInfo, FileChange, MessageView, ModelCatalog,
    PermissionAsk, PermissionReply, Price, SessionActivity,
};

/// Messages read per request when reading a turn: most turns fit in one page.
const MESSAGE_PAGE: u32 = 50;
/// Pages read at most for one turn (a turn of thousands of steps is read up to this bound, the
/// newest part first).
const MAX_MESSAGE_PAGES: usize = 40;

/// What a prompt runs on; `None`: the server's default agent or model, no variant.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunOn<'a> {
    pub agent: Option<&'a str>,
    /// `provider/model`.
    pub model: Option<&'a str>,
    /// One of the model's variants (e.g. a reasoning effort).
    pub variant: Option<&'a str>,
}

/// Basic-auth user name OpenCode expects.
pub const AUTH_USER: &str = "opencode";

/// A permission rule the gateway puts on a session it creates. OpenCode (1.18.33) judges a tool
/// call by the last rule that matches among the agent's rules (the user's config and
/// OpenCode's defaults) and then the session's, so these win over every config; in a pattern
/// `*` matches across `/`, and an edit's path is relative to the git root (measured).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForcedRule {
    pub permission: &'static str,
    pub pattern: String,
    pub allow: bool,
}

/// A handle on one OpenCode server's HTTP API.
#[derive(Clone, Debug)]
pub struct Api {
    client: Client,
    /// The client the generated one uses (same auth and timeout), for the calls decoded by hand.
    http: reqwest::Client,
    /// Same auth, connect timeout only: for the long-lived event stream.
    stream_http: reqwest::Client,
    base_url: String,
    /// The server's agents and models as last read (see `listings`), shared by the clones.
    listings: Arc<Listings>,
    /// Per directory: a prompt and a disposal of its instance never overlap (see `instances`).
    gates: Arc<super::instances::InstanceGates>,
}

#[derive(Debug, Default)]
struct Listings {
    agents: Remembered<Vec<AgentInfo>>,
    models: Remembered<ModelCatalog>,
    /// Whether OpenCode keeps snapshots (so lists of changed files) in a directory.
    tracked: Remembered<bool>,
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
        /// How long an idle keep-alive connection is kept.
        const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(10);
        // Idle keep-alive connections are bounded in time, not in number. A fan-out holds one
        // connection per concurrent call (200 tasks: 200 creates, then 200 prompts). Capping the
        // idle ones (it was eight) closed the rest after every burst, so the next burst connected
        // all over again; on 200 tasks at once that build trailed a client with reqwest's
        // defaults (benches/README.md, session 15). reqwest's default idle time (90 s) would
        // leave a burst's sockets open long after it, though: file descriptors in both processes
        // for nothing. Ten seconds keeps a burst's connections for the burst and the reconcile's
        // from one tick (5 s) to the next, and closes the rest soon after. The stream client
        // holds one long response, which these settings do not cut.
        // An OpenCode on this machine is reached directly, whatever HTTP_PROXY/HTTPS_PROXY say:
        // a proxy cannot reach the host's loopback, and NO_PROXY does not reliably exempt it
        // (reqwest's matcher applies `NO_PROXY=*` to host names only, so `127.0.0.1` still went
        // to the proxy and every call failed with "connection refused" under a host that passed
        // a proxy on, as Claude Code does). A server attached by a remote URL keeps the proxy.
        let local = super::pool::is_loopback_url(base_url);
        let build = |total: Option<Duration>| {
            let mut b = reqwest::Client::builder()
                .default_headers(headers.clone())
                .connect_timeout(request_timeout)
                .pool_idle_timeout(POOL_IDLE_TIMEOUT);
            if local {
                b = b.no_proxy();
            }
            if let Some(t) = total {
                b = b.timeout(t);
            }
            b.build()
                .map_err(|e| OpencodeError::Internal(format!("cannot build an HTTP client: {e}")))
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
            listings: Arc::default(),
            gates: Arc::default(),
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

    /// `GET /agent`: the agents a task may be given (hidden ones left out), read now (and
    /// remembered, see [`Self::agent_listing`]).
    pub async fn agents(&self, directory: &str) -> Result<Vec<AgentInfo>, OpencodeError> {
        let listing = self.agent_listing(directory, false).await?;
        Ok(Arc::unwrap_or_clone(listing.value))
    }

    /// The agents of `directory`: as read within `listings::FRESH_FOR` if `reuse`, else read
    /// now; either way what was read is remembered.
    pub async fn agent_listing(
        &self,
        directory: &str,
        reuse: bool,
    ) -> Result<Listing<Vec<AgentInfo>>, OpencodeError> {
        let read = self.read_agents(directory);
        self.listings.agents.get(directory, reuse, read).await
    }

    async fn read_agents(&self, directory: &str) -> Result<Vec<AgentInfo>, OpencodeError> {
        let r = self
            .client
            .app_agents()
            .directory(directory)
            .send()
            .await
            .map_err(|e| OpencodeError::from_client("GET /agent", e))?;
        Ok(r.into_inner()
            .into_iter()
            // Hidden agents (`compaction`, `summary`, `title`) are OpenCode's own machinery:
            // a task cannot be given to them, so they are not offered.
            .filter(|a| a.hidden != Some(true))
            .map(|a| AgentInfo {
                name: a.name,
                mode: a.mode.to_string(),
                description: a.description,
                model: a.model.map(|m| format!("{}/{}", m.provider_id, m.model_id)),
            })
            .collect())
    }

    /// `GET /config/providers`: every model as `provider/model`, sorted; read now (and
    /// remembered, see [`Self::model_listing`]).
    pub async fn models(&self, directory: &str) -> Result<ModelCatalog, OpencodeError> {
        let listing = self.model_listing(directory, false).await?;
        Ok(Arc::unwrap_or_clone(listing.value))
    }

    /// The model catalog of `directory`: as read within `listings::FRESH_FOR` if `reuse`, else
    /// read now; either way what was read is remembered.
    pub async fn model_listing(
        &self,
        directory: &str,
        reuse: bool,
    ) -> Result<Listing<ModelCatalog>, OpencodeError> {
        let read = self.read_models(directory);
        self.listings.models.get(directory, reuse, read).await
    }

    async fn read_models(&self, directory: &str) -> Result<ModelCatalog, OpencodeError> {
        let r = self
            .client
            .config_providers()
            .directory(directory)
            .send()
            .await
            .map_err(|e| OpencodeError::from_client("GET /config/providers", e))?
            .into_inner();
        let mut catalog = ModelCatalog {
            defaults: r.default.into_iter().collect(),
            ..ModelCatalog::default()
        };
        for p in &r.providers {
            for (id, m) in &p.models {
                let name = format!("{}/{}", p.id, id);
                if !m.variants.is_empty() {
                    let mut names: Vec<String> = m.variants.keys().cloned().collect();
                    names.sort();
                    catalog.variants.insert(name.clone(), names);
                }
                let c = &m.cost;
                let price = Price {
                    input: c.input,
                    output: c.output,
                    cache_read: c.cache.read,
                    cache_write: c.cache.write,
                };
                catalog.prices.insert(name.clone(), price);
                if m.capabilities.toolcall && m.limit.context >= super::types::CAPABLE_CONTEXT {
                    catalog.capable.insert(name.clone());
                }
                catalog.models.push(name);
            }
        }
        catalog.models.sort();
        Ok(catalog)
    }

    /// `POST /session?directory=`: a new session with a title (without one, OpenCode spends an
    /// LLM call naming it).
    pub async fn create_session(
        &self,
        directory: &str,
        title: &str,
        forced: &[ForcedRule],
    ) -> Result<String, OpencodeError> {
        let rules: Vec<types::PermissionRule> = forced
            .iter()
            .map(|r| types::PermissionRule {
                action: types::PermissionAction(if r.allow { "allow" } else { "deny" }.into()),
                pattern: r.pattern.clone(),
                permission: r.permission.to_string(),
            })
            .collect();
        let body = types::SessionCreateBody {
            agent: None,
            metadata: Default::default(),
            model: None,
            parent_id: None,
            permission: (!rules.is_empty()).then(|| rules.into()),
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

    /// `GET /session/{id}`: the session's parent, for a child session (a subagent's) whose
    /// creation the event stream did not show. `Ok(None)` for a top-level session.
    pub async fn session_parent(
        &self,
        directory: &str,
        session_id: &str,
    ) -> Result<Option<String>, OpencodeError> {
        let r = self
            .client
            .session_get()
            .session_id(session_id)
            .directory(directory)
            .send()
            .await
            .map_err(|e| OpencodeError::from_client("GET /session/{id}", e))?;
        Ok(r.into_inner().parent_id)
    }

    /// `GET /session/{id}/children`: the ids of the session's child sessions (its subagents').
    pub async fn children(
        &self,
        directory: &str,
        session_id: &str,
    ) -> Result<Vec<String>, OpencodeError> {
        let r = self
            .client
            .session_children()
            .session_id(session_id)
            .directory(directory)
            .send()
            .await
            .map_err(|e| OpencodeError::from_client("GET /session/{id}/children", e))?;
        Ok(r.into_inner().into_iter().map(|s| s.id).collect())
    }

    /// `POST /session/{id}/prompt_async` with our own message id, so the turn can be told apart
    /// from every other (see `tasks::turn`). OpenCode answers 204 at once; failures of the turn
    /// itself arrive later as events.
    pub async fn prompt_async(
        &self,
        directory: &str,
        session_id: &str,
        message_id: &str,
        text: &str,
        on: RunOn<'_>,
    ) -> Result<(), OpencodeError> {
        let RunOn {
            agent,
            model,
            variant,
        } = on;
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
            variant: variant.map(String::from),
        };
        // Not while this directory's instance is being disposed (see `instances`); prompts of
        // one directory share the lock.
        let gate = self.gates.of(directory);
        let _held = gate.read().await;
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

    /// `POST /instance/dispose?directory=`: lets go of `directory`'s instance, if `still_done`
    /// says so under the directory's lock, which prompts take too (see `instances`). Returns
    /// whether it was disposed. Only for a directory no other task shares.
    pub async fn dispose_instance(
        &self,
        directory: &str,
        still_done: impl FnOnce() -> bool,
    ) -> Result<bool, OpencodeError> {
        let gate = self.gates.of(directory);
        let _held = gate.write().await;
        if !still_done() {
            return Ok(false);
        }
        let r = self
            .client
            .instance_dispose()
            .directory(directory)
            .send()
            .await
            .map_err(|e| OpencodeError::from_client("POST /instance/dispose", e))?;
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

    /// `GET /config?directory=`: the `shell` the server's instance for `directory` runs its
    /// bash tool with (`None`: its default). Decoded by hand: only this field is needed, and
    /// the typed config (hundreds of fields, none unknown allowed) would break on any newer one.
    /// A confined task starts only when this is the confining shell: a wrapper around OpenCode
    /// (the user's `opencode.command`, a worker's `opencode`) that replaces
    /// `OPENCODE_CONFIG_CONTENT` would otherwise leave its agents on plain `bash`, silently.
    ///
    /// It is a task's first request in its directory (a new worktree), for which OpenCode boots
    /// an instance (its configuration, plugins and tools) before it answers: `within` bounds it
    /// instead of `timeouts.request` (the callers give it `timeouts.server_start`). On a busy
    /// machine, with a fan-out's starts side by side, that boot took longer than 15 s.
    pub async fn configured_shell(
        &self,
        directory: &str,
        within: Duration,
    ) -> Result<Option<String>, OpencodeError> {
        const OPERATION: &str = "GET /config";
        let response = self
            .http
            .get(format!("{}/config", self.base_url))
            .timeout(within)
            .query(&[("directory", directory)])
            .send()
            .await
            .map_err(|e| OpencodeError::from_reqwest(OPERATION, &e))?;
        let value = OpencodeError::json_body(OPERATION, response).await?;
        match value.get("shell") {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(OpencodeError::Decode {
                operation: OPERATION.into(),
                detail: format!("`shell` is not a string: {other}"),
            }),
        }
    }

    /// The messages of the turn opened by `user_message_id`, oldest first, starting with ours
    /// (or, if the session does not hold it, the whole session read within the page bound, so the
    /// caller can tell that it is missing).
    ///
    /// Sessions grow with every `continue_task`, so this pages backwards from the newest message
    /// and stops at our own message instead of downloading the whole history on every
    /// completion check. OpenCode 1.18.33 pages like this: `limit=N` answers the newest N
    /// messages (oldest first), with an `X-Next-Cursor` header naming the oldest of them; passing
    /// that cursor as `before` answers the N before it. (`before` is that opaque cursor, not a
    /// message id: a message id is answered with 400.)
    pub async fn turn_messages(
        &self,
        directory: &str,
        session_id: &str,
        user_message_id: &str,
    ) -> Result<Vec<MessageView>, OpencodeError> {
        let mut collected: Vec<MessageView> = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..MAX_MESSAGE_PAGES {
            let mut req = self
                .client
                .session_messages()
                .session_id(session_id)
                .directory(directory)
                .limit(i64::from(MESSAGE_PAGE));
            if let Some(c) = &cursor {
                req = req.before(c.clone());
            }
            let response = req
                .send()
                .await
                .map_err(|e| OpencodeError::from_client("GET /session/{id}/message", e))?;
            let next = response
                .headers()
                .get("x-next-cursor")
                .and_then(|v| v.to_str().ok())
                .filter(|v| !v.is_empty())
                .map(String::from);
            let mut page: Vec<MessageView> =
                response.into_inner().iter().map(messages::view).collect();
            page.sort_by(|a, b| a.id.cmp(&b.id));
            // Keep only what is older than what we already have (a server that ignored the
            // cursor would answer the same page again).
            if let Some(oldest) = collected.first() {
                page.retain(|m| m.id < oldest.id);
            }
            let found = page.iter().any(|m| m.id == user_message_id);
            let progressed = !page.is_empty();
            page.append(&mut collected);
            collected = page;
            match next {
                Some(c) if !found && progressed => cursor = Some(c),
                _ => break,
            }
        }
        Ok(collected)
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

    /// Whether OpenCode can list the files a turn in `directory` changed: its diffs come from
    /// snapshots it takes only in a git repository (`GET /project/current` names `vcs: "git"`).
    /// Elsewhere every list is empty whatever the turn did, so an empty one means nothing.
    /// Remembered like the listings: OpenCode decides a directory's project once per instance.
    pub async fn tracks_changes(&self, directory: &str) -> Result<bool, OpencodeError> {
        let read = async {
            let r = self
                .client
                .project_current()
                .directory(directory)
                .send()
                .await
                .map_err(|e| OpencodeError::from_client("GET /project/current", e))?;
            Ok(r.into_inner().vcs.is_some())
        };
        Ok(*self
            .listings
            .tracked
            .get(directory, true, read)
            .await?
            .value)
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

/// `Basic <base64(user:password)>` (RFC 7617), standard alphabet with padding.
pub(crate) fn basic_auth_header(user: &str, password: &str) -> String {
    use base64::Engine as _;
    let credentials =
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Basic {credentials}")
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
}

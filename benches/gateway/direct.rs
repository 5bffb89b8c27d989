//! The floor: the same turns driven straight against OpenCode's HTTP API with reqwest, exactly
//! the two calls the gateway's `start_task` makes (`POST /session?directory=`, then
//! `POST /session/{id}/prompt_async`), with completion read from the shared [`IdleWatch`].
//!
//! [`IdleWatch`]: crate::sse::IdleWatch

use serde_json::{json, Value};

use crate::support::opencode_server::encode;
use crate::BoxError;

/// A direct HTTP client of one OpenCode server, working in one directory.
pub struct Direct {
    http: reqwest::Client,
    base_url: String,
    password: String,
    dir_query: String,
}

impl Direct {
    pub fn new(base_url: &str, password: &str, directory: &str) -> Result<Self, BoxError> {
        Ok(Self {
            // Like the gateway's client: pooled keep-alive connections, no proxy.
            http: reqwest::Client::builder().no_proxy().build()?,
            base_url: base_url.trim_end_matches('/').to_string(),
            password: password.to_string(),
            dir_query: format!("directory={}", encode(directory)),
        })
    }

    fn post(&self, path: &str) -> reqwest::RequestBuilder {
        self.http
            .post(format!("{}{path}", self.base_url))
            .basic_auth("opencode", Some(&self.password))
    }

    /// Creates a session with `title` and sends `prompt` to it; returns the session id once
    /// OpenCode has accepted the prompt (204).
    pub async fn start(&self, title: &str, prompt: &str) -> Result<String, BoxError> {
        self.start_on(title, prompt, None).await
    }

    /// [`Self::start`], running the prompt on `model` (`provider/model`) when given, as the
    /// gateway sends it.
    pub async fn start_on(
        &self,
        title: &str,
        prompt: &str,
        model: Option<&str>,
    ) -> Result<String, BoxError> {
        let response = self
            .post(&format!("/session?{}", self.dir_query))
            .json(&json!({ "title": title }))
            .send()
            .await?;
        let status = response.status();
        let session: Value = response.json().await?;
        let id = session["id"]
            .as_str()
            .ok_or_else(|| format!("POST /session: {status} {session}"))?
            .to_string();
        let response = self
            .post(&format!("/session/{id}/prompt_async?{}", self.dir_query))
            .json(&{
                let mut body = json!({ "parts": [{ "type": "text", "text": prompt }] });
                if let Some((provider, model)) = model.and_then(|m| m.split_once('/')) {
                    body["model"] = json!({ "providerID": provider, "modelID": model });
                }
                body
            })
            .send()
            .await?;
        if response.status() != reqwest::StatusCode::NO_CONTENT {
            let status = response.status();
            let body = response.text().await.unwrap_or_default();
            return Err(format!("POST prompt_async: {status} {body:.300}").into());
        }
        Ok(id)
    }

    fn get(&self, path: &str) -> reqwest::RequestBuilder {
        self.http
            .get(format!("{}{path}", self.base_url))
            .basic_auth("opencode", Some(&self.password))
    }

    /// What confirming a turn over HTTP costs at the floor: the two reads the gateway's
    /// completion check makes (`GET /session/{id}/message`, `GET /session/status`), at once.
    pub async fn confirm(&self, session_id: &str) -> Result<(), BoxError> {
        let messages = self.get(&format!("/session/{session_id}/message?{}", self.dir_query));
        let status = self.get(&format!("/session/status?{}", self.dir_query));
        let (m, s) = tokio::join!(
            async { messages.send().await?.error_for_status()?.bytes().await },
            async { status.send().await?.error_for_status()?.bytes().await },
        );
        m?;
        s?;
        Ok(())
    }

    /// `POST /session/{id}/abort` (cleanup after the CPU window).
    pub async fn abort(&self, session_id: &str) -> Result<(), BoxError> {
        let response = self
            .post(&format!("/session/{session_id}/abort?{}", self.dir_query))
            .send()
            .await?;
        if !response.status().is_success() {
            return Err(format!("POST abort: {}", response.status()).into());
        }
        Ok(())
    }
}

/// The title the gateway gives a session, so both paths send OpenCode the same request bodies.
pub use opencode_mcp::tasks::default_title as gateway_title;

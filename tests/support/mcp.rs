//! An MCP host for tests: spawns the built `opencode-mcp` binary and speaks MCP to it over stdio
//! with rmcp's client, as Claude Code or Codex would.
//!
//! - [`Launch`]: how to start the gateway: its working directory (where a repo-level
//!   `delegation.yaml` is picked up), extra arguments, and an environment that starts from nothing
//!   (`PATH` only, `HOME` and `XDG_CONFIG_HOME` pointed into a temp dir) so that a developer's real
//!   config never leaks in. Add OpenCode isolation variables with [`Launch::envs`] (e.g. from
//!   `OpenCodeEnv::vars`).
//! - [`Sandbox`]: a temp dir holding `cwd/` and `home/`, for the common case.
//! - [`McpClient`]: the connected client. Every call is bounded by [`TIMEOUT`]; tool calls come
//!   back as a [`ToolReply`] (structured content, `isError`, the error code); progress
//!   notifications are recorded; the gateway's stderr is kept for failure messages.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig,
    ClientRequest, GetPromptRequestParams, GetPromptResult, Implementation, JsonObject,
    ProgressNotificationParam, ProgressToken, Prompt, ServerPeerInfo, ServerResult, Tool,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RequestHandle, RunningService};
use rmcp::transport::TokioChildProcess;
use rmcp::{ClientHandler, RoleClient, ServiceError, ServiceExt};
use serde_json::Value;
use tokio::io::AsyncReadExt;

/// The error type of these helpers.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The bound on every single request and on startup and shutdown.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// The gateway binary under test.
pub fn gateway_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_opencode-mcp"))
}

/// How to start the gateway.
#[derive(Debug, Clone)]
pub struct Launch {
    bin: PathBuf,
    cwd: PathBuf,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
}

impl Launch {
    /// Runs in `cwd` with a clean environment: `PATH`, and `HOME`/`XDG_CONFIG_HOME` under `home`.
    pub fn new(cwd: impl Into<PathBuf>, home: &Path) -> Self {
        let mut env = Vec::new();
        if let Some(path) = std::env::var_os("PATH") {
            env.push(("PATH".into(), path));
        }
        env.push(("HOME".into(), home.as_os_str().to_owned()));
        env.push((
            "XDG_CONFIG_HOME".into(),
            home.join(".config").into_os_string(),
        ));
        Self {
            bin: gateway_bin(),
            cwd: cwd.into(),
            args: Vec::new(),
            env,
        }
    }

    /// Adds a command-line argument.
    /// Runs another gateway binary (the benchmark measures the release build, or any build).
    pub fn bin(mut self, bin: impl Into<PathBuf>) -> Self {
        self.bin = bin.into();
        self
    }

    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Sets one environment variable (a later value for the same name wins).
    pub fn env(mut self, name: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }

    /// Sets several environment variables.
    pub fn envs<K: Into<OsString>, V: Into<OsString>>(
        mut self,
        vars: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        for (k, v) in vars {
            self.env.push((k.into(), v.into()));
        }
        self
    }

    /// The command, with stdio left for the caller to configure.
    pub fn command(&self) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&self.bin);
        cmd.args(&self.args)
            .current_dir(&self.cwd)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .kill_on_drop(true);
        cmd
    }

    /// Spawns the gateway and completes the MCP handshake.
    pub async fn connect(&self) -> Result<McpClient, BoxError> {
        let (transport, stderr) = TokioChildProcess::builder(self.command())
            .stderr(Stdio::piped())
            .spawn()?;
        let pid = transport.id();
        let stderr_text = Arc::new(Mutex::new(String::new()));
        if let Some(mut pipe) = stderr {
            let sink = stderr_text.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(n) = pipe.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    if let Ok(mut s) = sink.lock() {
                        s.push_str(&String::from_utf8_lossy(&buf[..n]));
                    }
                }
            });
        }
        let recorder = Recorder::default();
        let service = match tokio::time::timeout(TIMEOUT, recorder.clone().serve(transport)).await {
            Ok(Ok(service)) => service,
            Ok(Err(e)) => {
                return Err(format!("MCP handshake failed: {e}\n{}", snapshot(&stderr_text)).into())
            }
            Err(_) => {
                return Err(format!("MCP handshake timed out\n{}", snapshot(&stderr_text)).into())
            }
        };
        Ok(McpClient {
            service,
            recorder,
            stderr: stderr_text,
            pid,
        })
    }
}

fn snapshot(text: &Arc<Mutex<String>>) -> String {
    text.lock().map(|s| s.clone()).unwrap_or_default()
}

/// A temp dir with `cwd/` (the gateway's working directory) and `home/`. Removed on drop.
pub struct Sandbox {
    root: tempfile::TempDir,
}

impl Sandbox {
    pub fn new() -> Result<Self, BoxError> {
        let root = tempfile::Builder::new().prefix("opencode-mcp-").tempdir()?;
        std::fs::create_dir_all(root.path().join("cwd"))?;
        std::fs::create_dir_all(root.path().join("home"))?;
        Ok(Self { root })
    }

    pub fn root(&self) -> &Path {
        self.root.path()
    }

    pub fn cwd(&self) -> PathBuf {
        self.root.path().join("cwd")
    }

    pub fn home(&self) -> PathBuf {
        self.root.path().join("home")
    }

    /// Writes `./delegation.yaml` in the gateway's working directory.
    pub fn write_repo_config(&self, yaml: &str) -> Result<(), BoxError> {
        std::fs::write(self.cwd().join("delegation.yaml"), yaml)?;
        Ok(())
    }

    /// A launch in `cwd/` with `home/` as the home directory.
    pub fn launch(&self) -> Launch {
        Launch::new(self.cwd(), &self.home())
    }
}

/// A tool call's result, reduced to what tests assert on.
#[derive(Debug, Clone)]
pub struct ToolReply {
    pub is_error: bool,
    /// `structuredContent` (`Value::Null` when absent).
    pub structured: Value,
    /// The first text block (the JSON mirror of `structuredContent`).
    pub text: String,
    pub raw: CallToolResult,
}

impl ToolReply {
    fn from_result(raw: CallToolResult) -> Self {
        let text = raw
            .content
            .iter()
            .find_map(|c| c.as_text().map(|t| t.text.clone()))
            .unwrap_or_default();
        let is_error = raw.is_error == Some(true);
        // An error result carries its `{"error": …}` as JSON text only.
        let structured = match &raw.structured_content {
            Some(v) => v.clone(),
            None if is_error => serde_json::from_str(&text).unwrap_or(Value::Null),
            None => Value::Null,
        };
        Self {
            is_error,
            structured,
            text,
            raw,
        }
    }

    /// `error.code` of an `isError` result.
    pub fn error_code(&self) -> Option<&str> {
        self.structured
            .pointer("/error/code")
            .and_then(Value::as_str)
    }

    /// `error.message` of an `isError` result.
    pub fn error_message(&self) -> Option<&str> {
        self.structured
            .pointer("/error/message")
            .and_then(Value::as_str)
    }
}

/// The client side: records progress notifications.
#[derive(Clone, Default)]
pub struct Recorder {
    progress: Arc<Mutex<Vec<ProgressNotificationParam>>>,
}

impl ClientHandler for Recorder {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        if let Ok(mut p) = self.progress.lock() {
            p.push(params);
        }
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("opencode-mcp-tests", "0.0.0"),
        )
    }
}

/// A connected gateway.
pub struct McpClient {
    service: RunningService<RoleClient, Recorder>,
    recorder: Recorder,
    stderr: Arc<Mutex<String>>,
    pid: Option<u32>,
}

/// Bounds a request by [`TIMEOUT`]; dropping the request future on timeout makes rmcp send
/// `notifications/cancelled` for it.
async fn bounded<T>(
    fut: impl std::future::Future<Output = Result<T, ServiceError>>,
) -> Result<T, ServiceError> {
    tokio::time::timeout(TIMEOUT, fut)
        .await
        .unwrap_or(Err(ServiceError::Timeout { timeout: TIMEOUT }))
}

impl McpClient {
    /// What the server said at `initialize`.
    pub fn server_info(&self) -> Option<ServerPeerInfo> {
        self.service.peer_info().map(|i| i.as_ref().clone())
    }

    /// The gateway's process id.
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// Everything the gateway wrote to stderr so far.
    pub fn stderr(&self) -> String {
        snapshot(&self.stderr)
    }

    /// The progress notifications received so far.
    pub fn progress(&self) -> Vec<ProgressNotificationParam> {
        self.recorder
            .progress
            .lock()
            .map(|p| p.clone())
            .unwrap_or_default()
    }

    /// The progress notifications received for one request's token.
    pub fn progress_for(&self, token: &ProgressToken) -> Vec<ProgressNotificationParam> {
        self.progress()
            .into_iter()
            .filter(|p| &p.progress_token == token)
            .collect()
    }

    pub async fn list_tools(&self) -> Result<Vec<Tool>, ServiceError> {
        bounded(self.service.list_all_tools()).await
    }

    pub async fn list_prompts(&self) -> Result<Vec<Prompt>, ServiceError> {
        bounded(self.service.list_all_prompts()).await
    }

    pub async fn get_prompt(
        &self,
        name: &str,
        args: Value,
    ) -> Result<GetPromptResult, ServiceError> {
        let mut params = GetPromptRequestParams::new(name);
        if let Value::Object(map) = args {
            params = params.with_arguments(map);
        }
        bounded(self.service.get_prompt(params)).await
    }

    /// Calls a tool. `args` must be a JSON object (anything else sends no arguments). A JSON-RPC
    /// error (unknown tool) is `Err(ServiceError::McpError(..))`; a tool error is an `Ok` reply
    /// with `is_error`.
    pub async fn call(&self, tool: &str, args: Value) -> Result<ToolReply, ServiceError> {
        let result = bounded(self.service.call_tool(call_params(tool, args))).await?;
        Ok(ToolReply::from_result(result))
    }

    /// Calls a tool and returns its structured content; a tool error is an `Err` carrying it.
    pub async fn call_ok(&self, tool: &str, args: Value) -> Result<Value, BoxError> {
        let reply = self.call(tool, args).await?;
        if reply.is_error {
            return Err(format!("{tool} failed: {}", reply.text).into());
        }
        Ok(reply.structured)
    }

    /// Sends a tool call without awaiting it: the handle gives the request id and progress token,
    /// and can cancel the call (`notifications/cancelled`) or await its result
    /// ([`McpClient::await_call`]).
    pub async fn start_call(
        &self,
        tool: &str,
        args: Value,
    ) -> Result<RequestHandle<RoleClient>, ServiceError> {
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(call_params(tool, args)));
        bounded(
            self.service
                .send_request_with_option(request, PeerRequestOptions::no_options()),
        )
        .await
    }

    /// Awaits a call sent with [`McpClient::start_call`], bounded by `timeout`.
    pub async fn await_call(
        handle: RequestHandle<RoleClient>,
        timeout: Duration,
    ) -> Result<ToolReply, BoxError> {
        match tokio::time::timeout(timeout, handle.await_response()).await {
            Ok(Ok(ServerResult::CallToolResult(r))) => Ok(ToolReply::from_result(r)),
            Ok(Ok(other)) => Err(format!("unexpected response: {other:?}").into()),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(format!("tool call still running after {timeout:?}").into()),
        }
    }

    /// Closes stdin (as a host does at exit) and waits, bounded, for the session to end. The
    /// transport then waits for the process to exit, escalating to SIGTERM and kill.
    pub async fn close(self) -> Result<(), BoxError> {
        match tokio::time::timeout(TIMEOUT, self.service.cancel()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err("closing the MCP session timed out".into()),
        }
    }
}

fn call_params(tool: &str, args: Value) -> CallToolRequestParams {
    let params = CallToolRequestParams::new(tool.to_string());
    match args {
        Value::Object(map) => params.with_arguments(map),
        _ => params,
    }
}

/// `json!({...})` as a [`JsonObject`] (empty for anything but an object).
pub fn object(value: Value) -> JsonObject {
    match value {
        Value::Object(map) => map,
        _ => JsonObject::new(),
    }
}

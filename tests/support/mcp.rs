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
//!   back as a [`ToolReply`] (structured content, `isError`, the error code); progress and
//!   list-changed notifications are recorded; the gateway's stderr is kept for failure messages
//!   (and for tests that wait for a log line).

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::ProtocolVersion;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig,
    ClientRequest, GetPromptRequestParams, GetPromptResult, Implementation, JsonObject,
    ProgressNotificationParam, ProgressToken, Prompt, ServerPeerInfo, ServerResult, Tool,
};
use rmcp::service::{
    ClientLifecycleMode, ClientServiceExt, NotificationContext, PeerRequestOptions, RequestHandle,
    RunningService,
};
use rmcp::{ClientHandler, RoleClient, ServiceError};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// The error type of these helpers.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The bound on every single request and on startup and shutdown.
pub const TIMEOUT: Duration = Duration::from_secs(90);

/// The gateway binary under test.
pub fn gateway_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_opencode-mcp"))
}

/// How to start the gateway.
#[derive(Debug, Clone)]
pub struct Launch {
    /// The `clientInfo.name` sent at `initialize` (hosts are told apart by it).
    client_name: String,
    /// Whether results are checked against their tool's `outputSchema` (see
    /// [`Launch::unchecked`]).
    check_results: bool,
    /// Protocol 2026-07-28 (`server/discover`, per-request `_meta`) instead of `initialize`, and
    /// whether every request then declares the tasks extension (see [`Launch::modern`]).
    modern: Option<bool>,
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
        env.extend(
            super::isolation::coverage_var().map(|(k, v)| (OsString::from(k), OsString::from(v))),
        );
        Self {
            client_name: "opencode-mcp-tests".into(),
            check_results: true,
            modern: None,
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

    /// Introduces the client as `name` at `initialize`, as a real host would
    /// (`claude-code`, `codex-mcp-client`).
    pub fn client_name(mut self, name: &str) -> Self {
        self.client_name = name.to_string();
        self
    }

    /// Speaks protocol 2026-07-28 as Claude Code 2.1.332 does: `server/discover` instead of
    /// `initialize`, the client's name and capabilities in every request's `_meta`, and with
    /// `tasks` the tasks extension among those capabilities (so start calls may be answered with
    /// a task handle).
    pub fn modern(mut self, tasks: bool) -> Self {
        self.modern = Some(tasks);
        self
    }

    /// Skips the `outputSchema` check of each result: for the benchmark, whose timings must be
    /// the gateway's, not the check's. Tests keep it.
    pub fn unchecked(mut self) -> Self {
        self.check_results = false;
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
    ///
    /// The gateway's stdout passes through a checker before rmcp reads it: every line must be a
    /// JSON-RPC 2.0 message. rmcp itself skips lines it cannot parse, and a host would not, so a
    /// stray line (a log, a debug print) is recorded and fails the test when the client is closed
    /// or dropped ([`McpClient::stdout_violations`]).
    pub async fn connect(&self) -> Result<McpClient, BoxError> {
        let mut child = self
            .command()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let pid = child.id();
        let (Some(stdin), Some(stdout), Some(mut stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err("the gateway's stdio pipes are missing".into());
        };
        let stderr_text = Arc::new(Mutex::new(String::new()));
        let sink = stderr_text.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                if let Ok(mut s) = sink.lock() {
                    s.push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            }
        });
        let violations = Arc::new(Mutex::new(Vec::new()));
        let (checked, mut forward) = tokio::io::duplex(1 << 20);
        let found = violations.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            loop {
                let line = match lines.next_line().await {
                    Ok(Some(line)) => line,
                    Ok(None) => break,
                    Err(e) => {
                        push(&found, format!("unreadable stdout: {e}"));
                        break;
                    }
                };
                if let Err(why) = check_jsonrpc(&line) {
                    push(&found, format!("{why}: {}", clip(&line)));
                    continue;
                }
                let sent = async {
                    forward.write_all(line.as_bytes()).await?;
                    forward.write_all(b"\n").await
                };
                if sent.await.is_err() {
                    break;
                }
            }
        });
        let recorder = Recorder {
            name: self.client_name.clone(),
            tasks: self.modern == Some(true),
            ..Recorder::default()
        };
        let lifecycle = match self.modern {
            None => ClientLifecycleMode::Initialize,
            Some(_) => ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            },
        };
        let serving = recorder
            .clone()
            .serve_with_lifecycle((checked, stdin), lifecycle);
        let service = match tokio::time::timeout(TIMEOUT, serving).await {
            Ok(Ok(service)) => service,
            Ok(Err(e)) => {
                return Err(format!("MCP handshake failed: {e}\n{}", snapshot(&stderr_text)).into())
            }
            Err(_) => {
                return Err(format!("MCP handshake timed out\n{}", snapshot(&stderr_text)).into())
            }
        };
        Ok(McpClient {
            service: Some(service),
            child,
            recorder,
            stderr: stderr_text,
            pid,
            violations,
            check_results: self.check_results,
            output_schemas: tokio::sync::OnceCell::new(),
        })
    }
}

fn push<T>(list: &Arc<Mutex<Vec<T>>>, item: T) {
    if let Ok(mut l) = list.lock() {
        l.push(item);
    }
}

fn clip(line: &str) -> String {
    line.chars().take(300).collect()
}

/// Why `line` is not one JSON-RPC 2.0 message (a request, a notification or a response), if it
/// is not.
pub fn check_jsonrpc(line: &str) -> Result<(), String> {
    let v: Value = serde_json::from_str(line).map_err(|e| format!("not JSON ({e})"))?;
    let Some(m) = v.as_object() else {
        return Err("not a JSON-RPC object".into());
    };
    if m.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err("no \"jsonrpc\": \"2.0\"".into());
    }
    if let Some(method) = m.get("method") {
        return match method.is_string() {
            true => Ok(()),
            false => Err("`method` is not a string".into()),
        };
    }
    let id_ok = m
        .get("id")
        .is_some_and(|id| id.is_string() || id.is_number());
    match (id_ok, m.contains_key("result"), m.contains_key("error")) {
        (true, true, false) | (true, false, true) => Ok(()),
        _ => Err("neither a request nor a response with an id and one of result/error".into()),
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

/// A `notifications/*/list_changed` the server sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ListChanged {
    Tools,
    Prompts,
}

/// The client side: records progress and list-changed notifications.
#[derive(Clone, Default)]
pub struct Recorder {
    name: String,
    /// Declares the tasks extension.
    tasks: bool,
    progress: Arc<Mutex<Vec<ProgressNotificationParam>>>,
    list_changed: Arc<Mutex<Vec<ListChanged>>>,
}

impl ClientHandler for Recorder {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        push(&self.list_changed, ListChanged::Tools);
    }

    async fn on_prompt_list_changed(&self, _context: NotificationContext<RoleClient>) {
        push(&self.list_changed, ListChanged::Prompts);
    }

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
        let capabilities = if self.tasks {
            ClientCapabilities::builder().enable_tasks().build()
        } else {
            ClientCapabilities::default()
        };
        ClientConfig::new(
            capabilities,
            Implementation::new(self.name.clone(), "0.0.0"),
        )
    }
}

/// A connected gateway.
pub struct McpClient {
    /// `None` once [`McpClient::close`] has taken it.
    service: Option<RunningService<RoleClient, Recorder>>,
    child: tokio::process::Child,
    recorder: Recorder,
    stderr: Arc<Mutex<String>>,
    pid: Option<u32>,
    /// Stdout lines that were not JSON-RPC.
    violations: Arc<Mutex<Vec<String>>>,
    check_results: bool,
    /// Each tool's `outputSchema`, compiled, read once from `tools/list`.
    output_schemas: tokio::sync::OnceCell<HashMap<String, Arc<jsonschema::Validator>>>,
}

impl Drop for McpClient {
    /// A test that never closes its client is still held to the protocol: what a host would
    /// have rejected fails it here.
    fn drop(&mut self) {
        self.stop_for_coverage();
        let found = self.stdout_violations();
        if !found.is_empty() && !std::thread::panicking() {
            panic!("the gateway broke the MCP protocol:\n{}", found.join("\n"));
        }
    }
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
    /// Under coverage (see the README), a client dropped without [`Self::close`] stops its
    /// gateway with SIGTERM and waits (at most 10 s) for it to exit: the SIGKILL of
    /// `kill_on_drop` would leave no profile, and the lines that test ran would count as
    /// untested. A plain `cargo test` keeps the immediate kill.
    fn stop_for_coverage(&mut self) {
        let Some(pid) = self
            .pid
            .filter(|_| super::isolation::coverage_var().is_some())
        else {
            return;
        };
        if !matches!(self.child.try_wait(), Ok(None)) {
            return;
        }
        let Ok(pid) = libc::pid_t::try_from(pid) else {
            return;
        };
        // SAFETY: kill(2) on our own child, which has not been reaped (try_wait said so).
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while matches!(self.child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What the server said at `initialize`.
    pub fn server_info(&self) -> Option<ServerPeerInfo> {
        self.service().peer_info().map(|i| i.as_ref().clone())
    }

    /// The gateway's process id.
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// Everything the gateway wrote to stderr so far.
    pub fn stderr(&self) -> String {
        snapshot(&self.stderr)
    }

    /// What the gateway writes on stderr, read later (after [`Self::close`], say).
    pub fn stderr_handle(&self) -> impl Fn() -> String {
        let stderr = self.stderr.clone();
        move || snapshot(&stderr)
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

    /// The list-changed notifications received so far, in order.
    pub fn list_changes(&self) -> Vec<ListChanged> {
        self.recorder
            .list_changed
            .lock()
            .map(|l| l.clone())
            .unwrap_or_default()
    }

    /// Waits (bounded by `within`) until at least `count` list-changed notifications have
    /// arrived, and returns them all; `Err` with the gateway's stderr if they did not.
    pub async fn wait_list_changes(
        &self,
        count: usize,
        within: Duration,
    ) -> Result<Vec<ListChanged>, BoxError> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let got = self.list_changes();
            if got.len() >= count {
                return Ok(got);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(format!(
                    "{count} list-changed notification(s) expected within {within:?}, got \
                     {got:?}\n--- gateway stderr ---\n{}",
                    self.stderr()
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits (bounded by `within`) until the gateway's stderr holds a line containing every one
    /// of `needles`, and returns that line.
    pub async fn wait_stderr_line(
        &self,
        needles: &[&str],
        within: Duration,
    ) -> Result<String, BoxError> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let text = self.stderr();
            if let Some(line) = text.lines().find(|l| needles.iter().all(|n| l.contains(n))) {
                return Ok(line.to_string());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(format!(
                    "no stderr line with {needles:?} within {within:?}\n--- gateway stderr ---\n{text}"
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// What the gateway wrote to stdout that was not JSON-RPC.
    pub fn stdout_violations(&self) -> Vec<String> {
        self.violations
            .lock()
            .map(|v| v.clone())
            .unwrap_or_default()
    }

    fn service(&self) -> &RunningService<RoleClient, Recorder> {
        self.service
            .as_ref()
            .expect("the client is open until close() consumes it")
    }

    /// The client's side of the connection, for requests the helpers do not wrap (task
    /// methods, `subscriptions/listen`).
    pub fn peer(&self) -> &rmcp::service::Peer<RoleClient> {
        self.service().peer()
    }

    /// Calls a tool and returns the response as sent: a result, or a task handle.
    pub async fn call_once(
        &self,
        tool: &str,
        args: Value,
    ) -> Result<rmcp::model::CallToolResponse, ServiceError> {
        bounded(
            self.service()
                .peer()
                .call_tool_once(call_params(tool, args)),
        )
        .await
    }

    pub async fn list_tools(&self) -> Result<Vec<Tool>, ServiceError> {
        bounded(self.service().list_all_tools()).await
    }

    pub async fn list_prompts(&self) -> Result<Vec<Prompt>, ServiceError> {
        bounded(self.service().list_all_prompts()).await
    }

    /// Checks a result as the TypeScript SDK 1.x does before a host sees it: a tool that
    /// declares an `outputSchema` must return `structuredContent` on success, and any
    /// `structuredContent` must match the schema (on error results too: that is where the SDK
    /// rejected ours). Panics with the reasons, as the host's call would fail.
    async fn check_result(&self, tool: &str, result: &CallToolResult) {
        if !self.check_results {
            return;
        }
        let schemas = self
            .output_schemas
            .get_or_init(|| async {
                let tools = self
                    .list_tools()
                    .await
                    .expect("tools/list for the output schemas");
                tools
                    .into_iter()
                    .filter_map(|t| {
                        let schema = Value::Object(t.output_schema.as_deref()?.clone());
                        let compiled = jsonschema::validator_for(&schema).unwrap_or_else(|e| {
                            panic!("{}: the outputSchema does not compile: {e}", t.name)
                        });
                        Some((t.name.to_string(), Arc::new(compiled)))
                    })
                    .collect()
            })
            .await;
        let Some(schema) = schemas.get(tool) else {
            return;
        };
        let problems: Vec<String> = match &result.structured_content {
            None if result.is_error != Some(true) => {
                vec!["a successful result without structuredContent".into()]
            }
            None => Vec::new(),
            Some(content) => schema
                .iter_errors(content)
                .map(|e| format!("{e} at {}", e.instance_path()))
                .collect(),
        };
        if !problems.is_empty() {
            let shown = serde_json::to_string(result).unwrap_or_default();
            panic!(
                "{tool}: the result does not match the tool's outputSchema (a TypeScript SDK \
                 host would reject it with -32602): {}\nresult: {}",
                problems.join("; "),
                clip(&shown)
            );
        }
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
        bounded(self.service().get_prompt(params)).await
    }

    /// Calls a tool. `args` must be a JSON object (anything else sends no arguments). A JSON-RPC
    /// error (unknown tool) is `Err(ServiceError::McpError(..))`; a tool error is an `Ok` reply
    /// with `is_error`.
    pub async fn call(&self, tool: &str, args: Value) -> Result<ToolReply, ServiceError> {
        let result = bounded(self.service().call_tool(call_params(tool, args))).await?;
        self.check_result(tool, &result).await;
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
            self.service()
                .send_request_with_option(request, PeerRequestOptions::no_options()),
        )
        .await
    }

    /// Awaits a call to `tool` sent with [`McpClient::start_call`], bounded by `timeout`.
    pub async fn await_call(
        &self,
        tool: &str,
        handle: RequestHandle<RoleClient>,
        timeout: Duration,
    ) -> Result<ToolReply, BoxError> {
        match tokio::time::timeout(timeout, handle.await_response()).await {
            Ok(Ok(ServerResult::CallToolResult(r))) => {
                self.check_result(tool, &r).await;
                Ok(ToolReply::from_result(r))
            }
            Ok(Ok(other)) => Err(format!("unexpected response: {other:?}").into()),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(format!("tool call still running after {timeout:?}").into()),
        }
    }

    /// Closes stdin (as a host does at exit) and waits, bounded, for the session to end and
    /// the gateway to exit by itself. Fails if it does not, or if it broke the protocol.
    pub async fn close(mut self) -> Result<(), BoxError> {
        if let Some(service) = self.service.take() {
            match tokio::time::timeout(TIMEOUT, service.cancel()).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(e.into()),
                Err(_) => return Err("closing the MCP session timed out".into()),
            }
        }
        match tokio::time::timeout(TIMEOUT, self.child.wait()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(e.into()),
            Err(_) => {
                return Err(format!(
                    "the gateway did not exit within {TIMEOUT:?} of its stdin closing\n{}",
                    self.stderr()
                )
                .into())
            }
        }
        let found = std::mem::take(&mut *self.violations.lock().map_err(|e| e.to_string())?);
        if found.is_empty() {
            Ok(())
        } else {
            Err(format!("the gateway broke the MCP protocol:\n{}", found.join("\n")).into())
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

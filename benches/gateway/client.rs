//! The MCP host side: spawns a gateway binary and speaks MCP to it over stdio with rmcp's client,
//! as `tests/support/mcp.rs` does, but with the binary chosen at run time (`BENCH_GATEWAY_BIN`,
//! default the release build cargo made for this bench), so two builds can be compared with the
//! same harness.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, ClientRequest, ServerResult,
};
use rmcp::service::{PeerRequestOptions, RequestHandle, RunningService};
use rmcp::transport::TokioChildProcess;
use rmcp::{RoleClient, ServiceExt};
use serde_json::Value;
use tokio::io::AsyncReadExt;

use crate::BoxError;

/// Bound on every single request (waits are sliced below it).
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// The gateway binary: `$BENCH_GATEWAY_BIN`, else the one cargo built for this bench.
pub fn gateway_bin() -> PathBuf {
    std::env::var_os("BENCH_GATEWAY_BIN")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_opencode-mcp")))
}

/// How to start a gateway: binary, working directory and a complete environment.
#[derive(Debug, Clone)]
pub struct Spawn {
    bin: PathBuf,
    cwd: PathBuf,
    env: Vec<(OsString, OsString)>,
}

impl Spawn {
    /// Runs in `cwd` with nothing inherited but `PATH`; `HOME`/`XDG_CONFIG_HOME` under `home`.
    pub fn new(bin: PathBuf, cwd: PathBuf, home: &Path) -> Self {
        let mut env = Vec::new();
        if let Some(path) = std::env::var_os("PATH") {
            env.push(("PATH".into(), path));
        }
        env.push(("HOME".into(), home.as_os_str().to_owned()));
        env.push((
            "XDG_CONFIG_HOME".into(),
            home.join(".config").into_os_string(),
        ));
        Self { bin, cwd, env }
    }

    /// Sets one variable (a later value for the same name wins).
    pub fn env(mut self, name: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }

    pub fn envs<K: Into<OsString>, V: Into<OsString>>(
        mut self,
        vars: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        for (k, v) in vars {
            self.env.push((k.into(), v.into()));
        }
        self
    }

    /// The command, stdio left to the caller.
    pub fn command(&self) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&self.bin);
        cmd.current_dir(&self.cwd)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .kill_on_drop(true);
        cmd
    }

    /// Spawns the gateway and completes the MCP handshake.
    pub async fn connect(&self) -> Result<Client, BoxError> {
        let (transport, stderr) = TokioChildProcess::builder(self.command())
            .stderr(Stdio::piped())
            .spawn()?;
        let pid = transport.id().ok_or("the gateway has no pid")?;
        let text = Arc::new(Mutex::new(String::new()));
        if let Some(mut pipe) = stderr {
            let sink = text.clone();
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
        let service = match tokio::time::timeout(TIMEOUT, ().serve(transport)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(format!("MCP handshake failed: {e}\n{}", read(&text)).into()),
            Err(_) => return Err(format!("MCP handshake timed out\n{}", read(&text)).into()),
        };
        Ok(Client {
            service,
            stderr: text,
            pid,
        })
    }
}

fn read(text: &Mutex<String>) -> String {
    text.lock().map(|s| s.clone()).unwrap_or_default()
}

/// A tool call's result.
#[derive(Debug, Clone)]
pub struct Reply {
    pub is_error: bool,
    pub structured: Value,
    pub text: String,
}

impl Reply {
    fn from(raw: CallToolResult) -> Self {
        Self {
            is_error: raw.is_error == Some(true),
            text: raw
                .content
                .iter()
                .find_map(|c| c.as_text().map(|t| t.text.clone()))
                .unwrap_or_default(),
            structured: raw.structured_content.unwrap_or(Value::Null),
        }
    }
}

/// A connected gateway.
pub struct Client {
    service: RunningService<RoleClient, ()>,
    stderr: Arc<Mutex<String>>,
    pub pid: u32,
}

fn params(tool: &str, args: Value) -> CallToolRequestParams {
    let p = CallToolRequestParams::new(tool.to_string());
    match args {
        Value::Object(map) => p.with_arguments(map),
        _ => p,
    }
}

impl Client {
    /// Everything the gateway wrote to stderr so far.
    pub fn stderr(&self) -> String {
        read(&self.stderr)
    }

    pub async fn call(&self, tool: &str, args: Value) -> Result<Reply, BoxError> {
        let r = tokio::time::timeout(TIMEOUT, self.service.call_tool(params(tool, args)))
            .await
            .map_err(|_| format!("{tool} took longer than {TIMEOUT:?}"))??;
        Ok(Reply::from(r))
    }

    /// Sends a tool call and returns as soon as it is written, for timing its reply separately.
    pub async fn start_call(
        &self,
        tool: &str,
        args: Value,
    ) -> Result<RequestHandle<RoleClient>, BoxError> {
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params(tool, args)));
        Ok(self
            .service
            .send_request_with_option(request, PeerRequestOptions::no_options())
            .await?)
    }

    pub async fn await_call(
        handle: RequestHandle<RoleClient>,
        timeout: Duration,
    ) -> Result<Reply, BoxError> {
        match tokio::time::timeout(timeout, handle.await_response()).await {
            Ok(Ok(ServerResult::CallToolResult(r))) => Ok(Reply::from(r)),
            Ok(Ok(other)) => Err(format!("unexpected response: {other:?}").into()),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(format!("tool call still running after {timeout:?}").into()),
        }
    }

    /// Closes stdin, as a host does at exit, and waits (bounded) for the session to end.
    pub async fn close(self) -> Result<(), BoxError> {
        match tokio::time::timeout(TIMEOUT, self.service.cancel()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err("closing the MCP session timed out".into()),
        }
    }
}

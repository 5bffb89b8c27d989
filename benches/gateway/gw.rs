//! The gateway under test: the release `opencode-mcp` binary spawned over stdio and driven with
//! rmcp's client ([`Client`]), attached to the benchmark's OpenCode server through
//! `OPENCODE_MCP_OPENCODE__URL` and `OPENCODE_SERVER_PASSWORD`, so the gateway and the direct
//! baseline talk to one and the same OpenCode.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::gateway_bin;
use crate::support::isolation::OpenCodeEnv;
use crate::support::mcp::{Launch as Spawn, McpClient as Client};
use crate::support::opencode_server::OpenCodeServer;
use crate::BoxError;

/// A `wait_for_task` call never asks for more than this (the client bounds every request at
/// 30 s); longer waits loop.
const WAIT_SLICE_MS: u64 = 25_000;

/// The launch every benchmark gateway uses: isolated env, attached to `server`, its own task
/// store in `state_dir` (so one gateway's records never load into another), limits raised so
/// that a run's thousands of tasks and 200-id waits are allowed, logs at `warn`.
pub fn launch(
    env: &OpenCodeEnv,
    fake_url: &str,
    server: &OpenCodeServer,
    state_dir: &Path,
) -> Spawn {
    Spawn::new(env.work_dir(), &env.home_dir())
        .bin(gateway_bin())
        .envs(env.vars(fake_url))
        .env("OPENCODE_MCP_OPENCODE__URL", server.url())
        .env("OPENCODE_SERVER_PASSWORD", server.password())
        .env("OPENCODE_MCP_LIMITS__MAX_TASKS", "100000")
        .env("OPENCODE_MCP_LIMITS__MAX_WAIT_IDS", "1000")
        .env("OPENCODE_MCP_STATE_DIR", state_dir)
        .env("OPENCODE_MCP_LOG", "warn")
        .unchecked()
}

/// A connected gateway with an attached server.
pub struct Gw {
    pub client: Client,
    pub server_id: String,
    pub pid: u32,
}

/// What `start_task` returned.
pub struct Started {
    pub task_id: String,
    pub session_id: String,
}

impl Gw {
    /// Spawns the gateway and completes `initialize`; `attach` then calls `opencode_start_server`.
    pub async fn connect(launch: &Spawn) -> Result<Client, BoxError> {
        launch.connect().await
    }

    /// Attaches a connected client to the configured server.
    pub async fn attach(client: Client) -> Result<Self, BoxError> {
        let pid = client.pid().ok_or("the gateway has no pid")?;
        let reply = client.call("opencode_start_server", json!({})).await?;
        if reply.is_error {
            return Err(format!(
                "start_server failed: {}\n--- gateway stderr ---\n{}",
                reply.text,
                client.stderr()
            )
            .into());
        }
        let server = reply.structured;
        let server_id = server["server_id"]
            .as_str()
            .ok_or_else(|| format!("start_server without server_id: {server}"))?
            .to_string();
        if server["managed"] != false {
            return Err(format!("expected an attached server, got {server}").into());
        }
        Ok(Self {
            client,
            server_id,
            pid,
        })
    }

    pub async fn start(launch: &Spawn) -> Result<Self, BoxError> {
        Self::attach(Self::connect(launch).await?).await
    }

    /// Calls a tool; a tool error is an `Err` carrying its text.
    pub async fn ok(&self, tool: &str, args: Value) -> Result<Value, BoxError> {
        let reply = self.client.call(tool, args).await?;
        if reply.is_error {
            return Err(format!("{tool} failed: {}", reply.text).into());
        }
        Ok(reply.structured)
    }

    pub async fn start_task(&self, prompt: &str) -> Result<Started, BoxError> {
        self.start_task_on(prompt, None).await
    }

    /// `start_task`, naming `model` (`provider/model`) when given: the gateway checks it against
    /// the server's model catalog before the prompt goes out.
    pub async fn start_task_on(
        &self,
        prompt: &str,
        model: Option<&str>,
    ) -> Result<Started, BoxError> {
        self.start_task_with(prompt, model, None).await
    }

    /// `start_task` in `directory` when given (else the server's own).
    pub async fn start_task_in(
        &self,
        prompt: &str,
        directory: Option<&str>,
    ) -> Result<Started, BoxError> {
        self.start_task_with(prompt, None, directory).await
    }

    async fn start_task_with(
        &self,
        prompt: &str,
        model: Option<&str>,
        directory: Option<&str>,
    ) -> Result<Started, BoxError> {
        // The benchmark compares sessions with direct ones: it needs the ids.
        let mut args = json!({ "server_id": self.server_id, "prompt": prompt, "detail": "full" });
        if let Some(model) = model {
            args["model"] = json!(model);
        }
        if let Some(directory) = directory {
            args["directory"] = json!(directory);
        }
        let v = self.ok("opencode_start_task", args).await?;
        let field = |k: &str| {
            v[k].as_str()
                .map(String::from)
                .ok_or_else(|| format!("start_task without {k}: {v}"))
        };
        Ok(Started {
            task_id: field("task_id")?,
            session_id: field("session_id")?,
        })
    }

    /// Waits (mode `all`) until every task is finished; fails if one did not complete or the
    /// whole wait takes longer than `limit`.
    pub async fn wait_all(&self, ids: &[String], limit: Duration) -> Result<Value, BoxError> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let w = self
                .ok(
                    "opencode_wait_for_task",
                    json!({ "task_ids": ids, "mode": "all", "timeout_ms": WAIT_SLICE_MS }),
                )
                .await?;
            if w["done"] == true {
                return check_completed(w);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(format!(
                    "{} tasks still unfinished after {limit:?}",
                    w["unfinished"].as_array().map_or(0, Vec::len)
                )
                .into());
            }
        }
    }
}

/// Every task of a finished wait completed (a failed one would make the timing meaningless).
pub fn check_completed(w: Value) -> Result<Value, BoxError> {
    let bad: Vec<String> = w["tasks"]
        .as_array()
        .map(|tasks| {
            tasks
                .iter()
                .filter(|t| t["status"] != "completed")
                .map(|t| format!("{} {} {}", t["task_id"], t["status"], t["error"]))
                .collect()
        })
        .unwrap_or_default();
    if bad.is_empty() {
        Ok(w)
    } else {
        Err(format!("tasks did not complete: {}", bad.join("; ")).into())
    }
}

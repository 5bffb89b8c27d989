//! What confinement costs: two gateways that each start their own OpenCode (an attached server
//! cannot be confined), one with the sandbox on (the default) and one with `sandbox.mode: off`,
//! driven alternately in the same run.
//!
//! - A task whose agent runs 20 short commands (`[[bash:true]]` twenty times: twenty model
//!   steps, each a command through the confining shell), timed from `start_task` to the wait
//!   that returns its answer.
//! - One check (`true`): its own `duration_ms` as the gateway measured it, on each side.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::gw::Gw;
use crate::support::isolation::OpenCodeEnv;
use crate::support::mcp::Launch as Spawn;
use crate::{gateway_bin, BoxError};

/// Commands the agent of the command scenario runs.
pub const COMMANDS: usize = 20;

pub struct SandboxCost {
    pub commands_confined_ms: Vec<f64>,
    pub commands_plain_ms: Vec<f64>,
    pub check_confined_ms: Vec<f64>,
    pub check_plain_ms: Vec<f64>,
}

/// A gateway that starts its own OpenCode, confined or not.
async fn gateway(
    env: &OpenCodeEnv,
    fake_url: &str,
    state: &Path,
    confined: bool,
) -> Result<Gw, BoxError> {
    let mut launch = Spawn::new(env.work_dir(), &env.home_dir())
        .bin(gateway_bin())
        .envs(env.vars(fake_url))
        .env(
            "OPENCODE_MCP_OPENCODE__COMMAND",
            crate::support::opencode_bin::opencode_bin(),
        )
        .env("OPENCODE_MCP_STATE_DIR", state)
        .env("OPENCODE_MCP_CHECKS__FROM_CALLS", "true")
        .env("OPENCODE_MCP_LIMITS__MAX_TASKS", "1000")
        .env("OPENCODE_MCP_LOG", "warn")
        .unchecked();
    if !confined {
        launch = launch.env("OPENCODE_MCP_SANDBOX__MODE", "off");
    }
    let client = Gw::connect(&launch).await?;
    let pid = client.pid().ok_or("the gateway has no pid")?;
    let reply = client.call("opencode_start_server", json!({})).await?;
    if reply.is_error {
        return Err(format!("start_server: {}\n{}", reply.text, client.stderr()).into());
    }
    let server_id = reply.structured["server_id"]
        .as_str()
        .ok_or("no server_id")?
        .to_string();
    Ok(Gw {
        client,
        server_id,
        pid,
    })
}

/// Starts `args` on `gw` and waits for it; returns the time taken and the finished task.
async fn run(gw: &Gw, mut args: Value) -> Result<(f64, Value), BoxError> {
    args["server_id"] = json!(gw.server_id);
    let t = Instant::now();
    let v = gw.ok("opencode_start_task", args).await?;
    let id = v["task_id"].as_str().unwrap_or_default().to_string();
    let w = gw
        .wait_all(std::slice::from_ref(&id), Duration::from_secs(180))
        .await?;
    let took = crate::scenarios::ms(t.elapsed());
    let task = w["tasks"][0].clone();
    if task["status"] != "completed" {
        return Err(format!("the task did not complete: {task}").into());
    }
    Ok((took, task))
}

pub async fn sandbox(
    env: &OpenCodeEnv,
    fake_url: &str,
    state_root: &Path,
    reps: usize,
) -> Result<SandboxCost, BoxError> {
    let confined = gateway(env, fake_url, &state_root.join("sandbox-on"), true).await?;
    let plain = gateway(env, fake_url, &state_root.join("sandbox-off"), false).await?;
    let mut out = SandboxCost {
        commands_confined_ms: Vec::new(),
        commands_plain_ms: Vec::new(),
        check_confined_ms: Vec::new(),
        check_plain_ms: Vec::new(),
    };
    let markers = " [[bash:true]]".repeat(COMMANDS);
    // One warm-up task each: OpenCode's first turn in a directory loads its plugins.
    for gw in [&confined, &plain] {
        let dir = env.work_dir().join(format!("sandbox-warm-{}", gw.pid));
        std::fs::create_dir_all(&dir)?;
        run(
            gw,
            json!({ "prompt": "warm up [[bash:true]]", "directory": dir.display().to_string() }),
        )
        .await?;
    }
    for i in 0..reps {
        for (on, gw) in [(true, &confined), (false, &plain)] {
            let dir = env.work_dir().join(format!("sandbox-{i}-{on}"));
            std::fs::create_dir_all(&dir)?;
            let dir = dir.display().to_string();
            let (took, task) = run(
                gw,
                json!({ "prompt": format!("commands {i}{markers}"), "directory": dir, "detail": "full" }),
            )
            .await?;
            if task["confined"] != on {
                return Err(format!("expected confined: {on}, got {task}").into());
            }
            let (_, checked) = run(
                gw,
                json!({ "prompt": format!("checked {i}"), "directory": dir, "checks": ["true"], "detail": "full" }),
            )
            .await?;
            let check = checked["checks"]["last"][0]["duration_ms"]
                .as_f64()
                .ok_or_else(|| format!("no check duration: {checked}"))?;
            if on {
                out.commands_confined_ms.push(took);
                out.check_confined_ms.push(check);
            } else {
                out.commands_plain_ms.push(took);
                out.check_plain_ms.push(check);
            }
        }
    }
    Ok(out)
}

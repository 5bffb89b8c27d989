//! `start_server`: start a managed OpenCode server (or attach to the configured one) and return
//! its `server_id`.
//!
//! A second start for the same directory returns the server already running there (`reused:
//! true`) rather than a second process, which is what makes the tool idempotent and lets a host
//! call it defensively at the start of every session.

use rmcp::model::ToolAnnotations;
use schemars::JsonSchema;
use serde::Deserialize;

use super::{checks, ActionSpec, Ctx};
use crate::gateway::error::ToolError;
use crate::opencode::ServerInfo;

/// Arguments of `start_server`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Args {
    /// 0 or absent: a free port.
    pub port: Option<u16>,
    /// Absolute project path. Default: the gateway's.
    pub directory: Option<String>,
}

/// The `start_server` action.
pub struct StartServer;

impl ActionSpec for StartServer {
    type Args = Args;
    type Output = ServerInfo;
    const TITLE: &'static str = "Start an OpenCode server";

    /// Starts a local process: not read-only, but nothing is lost (not destructive); repeating
    /// it returns the running server (idempotent); it touches only this machine (closed world).
    fn annotations() -> ToolAnnotations {
        ToolAnnotations::new()
            .read_only(false)
            .destructive(false)
            .idempotent(true)
            .open_world(false)
    }
}

pub(super) async fn run(args: Args, ctx: &Ctx<'_>) -> Result<ServerInfo, ToolError> {
    // 0 is the conventional "any port", as in the config's `opencode.port`.
    let port = args.port.filter(|p| *p != 0);
    let directory = checks::directory("directory", args.directory)?;
    Ok(ctx.tasks.start_server(port, directory).await?)
}

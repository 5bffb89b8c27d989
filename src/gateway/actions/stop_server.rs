//! `stop_server`: stop a managed OpenCode server (an attached one is only forgotten).
//!
//! Tasks still running on it end as `failed`, and the result says which, so the host is never
//! left waiting on tasks that can no longer finish.

use rmcp::model::ToolAnnotations;
use schemars::JsonSchema;
use serde::Deserialize;

use super::{checks, ActionSpec, Ctx};
use crate::gateway::error::ToolError;
use crate::opencode::StopInfo;

/// Arguments of `stop_server`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Args {
    /// A start server tool's id, or `default`.
    #[schemars(length(min = 1))]
    pub server_id: String,
}

/// The `stop_server` action.
pub struct StopServer;

impl ActionSpec for StopServer {
    type Args = Args;
    type Output = StopInfo;
    const TITLE: &'static str = "Stop an OpenCode server";

    /// Stops a server process the gateway started (or detaches from an attached one) and ends
    /// the tasks still running there; no user data is destroyed, so not destructive (see
    /// `cancel_task`). Stopping a stopped server changes nothing more (idempotent); local only
    /// (closed world).
    fn annotations() -> ToolAnnotations {
        ToolAnnotations::new()
            .read_only(false)
            .destructive(false)
            .idempotent(true)
            .open_world(false)
    }
}

pub(super) async fn run(args: Args, ctx: &Ctx<'_>) -> Result<StopInfo, ToolError> {
    let server_id = checks::required_name("server_id", args.server_id)?;
    // `default` names the same server here as in the start tools, where it is accepted.
    let server_id = if server_id == super::start_task::DEFAULT_SERVER {
        ctx.tasks.default_server_id().ok_or_else(|| {
            ToolError::new(
                crate::error::ErrorCode::NotFound,
                "no `default` server is running: it starts with the first task (or the start \
                 server tool), so there is nothing to stop",
            )
        })?
    } else {
        server_id
    };
    Ok(ctx.tasks.stop_server(&server_id).await?)
}

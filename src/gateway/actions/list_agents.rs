//! `list_agents`: the agents and models a server offers, and what each configured tier resolves
//! to on it, so the host can choose `agent`, `model` or `tier` for a task from facts rather than
//! guesses.

use rmcp::model::{JsonObject, ToolAnnotations};
use schemars::JsonSchema;
use serde::Deserialize;

use super::{start_task, ActionSpec, Ctx};
use crate::config::Config;
use crate::gateway::error::ToolError;
use crate::gateway::schema::require_first;
use crate::tasks::AgentCatalog;

/// Arguments of `list_agents`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Args {
    /// A start server tool's id, or `default`.
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub server_id: String,
}

/// The `list_agents` action.
pub struct ListAgents;

impl ActionSpec for ListAgents {
    type Args = Args;
    type Output = AgentCatalog;
    const TITLE: &'static str = "List agents and models";

    /// Reads the server's catalog and changes nothing.
    fn annotations() -> ToolAnnotations {
        super::observing()
    }

    fn refine_input_schema(_config: &Config, schema: &mut JsonObject) {
        require_first(schema, "server_id");
    }
}

pub(super) async fn run(args: Args, ctx: &Ctx<'_>) -> Result<AgentCatalog, ToolError> {
    let server_id = start_task::server_id(args.server_id, ctx).await?;
    Ok(ctx.tasks.list_agents(&server_id).await?)
}

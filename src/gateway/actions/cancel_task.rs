//! `cancel_task`: abort a task's current turn. The task ends as `cancelled`; edits it already
//! made stay on disk.
//!
//! The service checks OpenCode's answer to the abort: a failed abort is an error, never a task
//! reported `cancelled` while it keeps running (a bug of the original).

use rmcp::model::ToolAnnotations;
use schemars::JsonSchema;
use serde::Deserialize;

use super::{checks, ActionSpec, Ctx};
use crate::gateway::error::ToolError;
use crate::tasks::TaskSnapshot;

/// Arguments of `cancel_task`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Args {
    /// The task.
    #[schemars(length(min = 1))]
    pub task_id: String,
}

/// The `cancel_task` action.
pub struct CancelTask;

impl ActionSpec for CancelTask {
    type Args = Args;
    type Output = TaskSnapshot;
    const TITLE: &'static str = "Cancel a task";

    /// Stops an agent; it destroys nothing of the user's (MCP's `destructiveHint` means
    /// destructive updates to the environment, and Codex refuses such tools under its default
    /// approval policy): what the agent already wrote stays. Cancelling a cancelled task changes
    /// nothing (idempotent); talks only to the local OpenCode (closed world).
    fn annotations() -> ToolAnnotations {
        ToolAnnotations::new()
            .read_only(false)
            .destructive(false)
            .idempotent(true)
            .open_world(false)
    }
}

pub(super) async fn run(args: Args, ctx: &Ctx<'_>) -> Result<TaskSnapshot, ToolError> {
    let task_id = checks::single_task_id("task_id", args.task_id, ctx.tasks).await?;
    Ok(ctx.tasks.cancel(&task_id).await?)
}

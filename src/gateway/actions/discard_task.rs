//! `discard_task`: remove a worktree task's worktree and its branch; what it changed and was not
//! applied is gone.

use rmcp::model::ToolAnnotations;
use schemars::JsonSchema;
use serde::Deserialize;

use super::{checks, ActionSpec, Ctx};
use crate::gateway::error::ToolError;
use crate::tasks::DiscardOutcome;

/// Arguments of `discard_task`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Args {
    /// A finished worktree task.
    #[schemars(length(min = 1))]
    pub task_id: String,
}

/// The `discard_task` action.
pub struct DiscardTask;

impl ActionSpec for DiscardTask {
    type Args = Args;
    type Output = DiscardOutcome;
    const TITLE: &'static str = "Discard a task's worktree";

    /// Destructive: the task's unapplied work is deleted with its worktree and branch.
    /// Idempotent: discarding a discarded task removes nothing more. Closed world: local git.
    fn annotations() -> ToolAnnotations {
        ToolAnnotations::new()
            .read_only(false)
            .destructive(true)
            .idempotent(true)
            .open_world(false)
    }
}

pub(super) async fn run(args: Args, ctx: &Ctx<'_>) -> Result<DiscardOutcome, ToolError> {
    let task_id = checks::single_task_id("task_id", args.task_id, ctx.tasks).await?;
    Ok(ctx.tasks.discard(&task_id).await?)
}

//! `apply_task`: bring a worktree task's change into the tree it was branched from, by a
//! three-way merge against the task's base. A conflict changes nothing and names the files.

use rmcp::model::ToolAnnotations;
use schemars::JsonSchema;
use serde::Deserialize;

use super::{checks, ActionSpec, Ctx};
use crate::gateway::error::ToolError;
use crate::tasks::ApplyOutcome;

/// Arguments of `apply_task`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Args {
    /// A finished worktree task.
    #[schemars(length(min = 1))]
    pub task_id: String,
}

/// The `apply_task` action.
pub struct ApplyTask;

impl ActionSpec for ApplyTask {
    type Args = Args;
    type Output = ApplyOutcome;
    const TITLE: &'static str = "Apply a task's change";

    /// Destructive: it writes the user's working tree (merged, never over their own edits, but
    /// a host that gates writes should gate this). Idempotent: applying an applied task writes
    /// nothing. Closed world: local git only.
    fn annotations() -> ToolAnnotations {
        ToolAnnotations::new()
            .read_only(false)
            .destructive(true)
            .idempotent(true)
            .open_world(false)
    }
}

pub(super) async fn run(args: Args, ctx: &Ctx<'_>) -> Result<ApplyOutcome, ToolError> {
    let task_id = checks::single_task_id("task_id", args.task_id, ctx.tasks).await?;
    Ok(ctx.tasks.apply(&task_id).await?)
}

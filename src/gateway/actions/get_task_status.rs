//! `get_task_status`: a task's status right now, without waiting.
//!
//! It reads the same state as wait and result (kept current by OpenCode's event stream), so the
//! three tools never disagree about a task.

use rmcp::model::ToolAnnotations;
use schemars::JsonSchema;
use serde::Deserialize;

use super::{checks, ActionSpec, Ctx};
use crate::gateway::error::ToolError;
use crate::tasks::{Detail, TaskSnapshot};

/// Arguments of `get_task_status`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Args {
    /// The task.
    #[schemars(length(min = 1))]
    pub task_id: String,
    /// What a running task is doing.
    #[serde(default)]
    pub include_progress: bool,
    /// `full`: also model, tokens, cost.
    #[serde(default)]
    pub detail: Detail,
}

/// The `get_task_status` action.
pub struct GetTaskStatus;

impl ActionSpec for GetTaskStatus {
    type Args = Args;
    type Output = TaskSnapshot;
    const TITLE: &'static str = "Get task status";

    /// Reads the gateway's own state and changes nothing.
    fn annotations() -> ToolAnnotations {
        super::observing()
    }
}

pub(super) async fn run(args: Args, ctx: &Ctx<'_>) -> Result<TaskSnapshot, ToolError> {
    let task_id = checks::single_task_id("task_id", args.task_id, ctx.tasks).await?;
    let snapshot = ctx.tasks.status(&task_id, args.include_progress).await?;
    // The host now sees the pending ask: a wait does not return early for it again.
    ctx.tasks.asks_shown([&snapshot]);
    Ok(snapshot.with_detail(args.detail))
}

//! `get_task_result`: a task's full outcome: status, final text (paged), model, tokens, cost,
//! changed files, tool calls, or the error that ended it; with `view: diff`, a worktree task's
//! unified diff in place of the text, paged the same way.
//!
//! Long text is paged by `offset` in characters, up to `limits.result_page_chars` per call, so a
//! large answer never overflows the host's context in one go.

use rmcp::model::ToolAnnotations;
use schemars::JsonSchema;
use serde::Deserialize;

use super::{checks, ActionSpec, Ctx};
use crate::gateway::budget;
use crate::gateway::error::ToolError;
use crate::tasks::{Detail, ResultView, TaskResult};

/// Arguments of `get_task_result`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Args {
    /// The task.
    #[schemars(length(min = 1))]
    pub task_id: String,
    /// Where a page starts: the previous page's `next_offset`.
    #[serde(default)]
    pub offset: u64,
    /// `text`: the answer; `diff`: a worktree task's unified diff.
    #[serde(default)]
    pub view: ResultView,
    /// `full`: also model, tokens, cost.
    #[serde(default)]
    pub detail: Detail,
}

/// The `get_task_result` action.
pub struct GetTaskResult;

impl ActionSpec for GetTaskResult {
    type Args = Args;
    type Output = TaskResult;
    const TITLE: &'static str = "Get task result";

    /// Reads the session's messages and changes nothing.
    fn annotations() -> ToolAnnotations {
        super::observing()
    }
}

pub(super) async fn run(args: Args, ctx: &Ctx<'_>) -> Result<TaskResult, ToolError> {
    let task_id = checks::single_task_id("task_id", args.task_id, ctx.tasks).await?;
    let result = ctx
        .tasks
        .result_view(&task_id, args.view)
        .await?
        .with_detail(args.detail);
    Ok(budget::page_result(
        result,
        args.offset,
        ctx.config.limits.result_page_chars as usize,
        ctx.host.result_chars as usize,
        ctx.host.count,
    ))
}

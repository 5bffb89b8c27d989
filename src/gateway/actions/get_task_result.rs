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
    /// The `task_id` returned by the start task tool.
    #[schemars(length(min = 1))]
    pub task_id: String,
    /// Character offset into the final text (or the diff): 0 for the first page, then the
    /// `next_offset` of the previous page.
    #[serde(default)]
    pub offset: u64,
    /// `text` (default): the agent's answer. `diff`: the unified diff of everything a worktree
    /// task changed against its base, paged the same way.
    #[serde(default)]
    pub view: ResultView,
    /// `lean` (default): status, answer, error, changed files. `full`: also the OpenCode ids,
    /// directory, agent, model, turn, tokens, cost, tool calls and timings.
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

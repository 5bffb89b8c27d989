//! `reply_permission`: answer a permission ask a task is waiting on.
//!
//! With `opencode.permission: ask`, OpenCode pauses a tool call until someone answers; the task
//! shows `waiting_permission` with each pending ask and its id. An unanswered ask would keep the
//! session busy forever (the original's bug 5), so the host gets a tool to answer it. Two
//! subagents may ask at once: an answer goes to the ask its `permission_id` names, or, without
//! one, to the only pending ask; it never lands on an ask the host has not seen.

use rmcp::model::ToolAnnotations;
use schemars::JsonSchema;
use serde::Deserialize;

use super::{checks, ActionSpec, Ctx};
use crate::gateway::error::ToolError;
use crate::opencode::PermissionReply;
use crate::tasks::TaskSnapshot;

// How to answer (the tool's description says; a schema description would only repeat it).
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Reply {
    /// Allow this one call.
    Once,
    /// Allow this pattern for the rest of the session.
    Always,
    /// Refuse; the agent stops after the tool call.
    Reject,
}

/// Arguments of `reply_permission`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Args {
    /// A task `waiting_permission`.
    #[schemars(length(min = 1))]
    pub task_id: String,
    // The values say it; the tool's description says what each does.
    pub reply: Reply,
    /// The ask's `id`, if several are pending.
    #[serde(default)]
    pub permission_id: Option<String>,
}

/// The `reply_permission` action.
pub struct ReplyPermission;

impl ActionSpec for ReplyPermission {
    type Args = Args;
    type Output = TaskSnapshot;
    const TITLE: &'static str = "Answer a permission ask";

    /// Lets a paused tool call run (or refuses it): not read-only, and allowing a command can be
    /// destructive; answering twice is refused rather than repeated (not idempotent).
    fn annotations() -> ToolAnnotations {
        ToolAnnotations::new()
            .read_only(false)
            .destructive(true)
            .idempotent(false)
            .open_world(false)
    }
}

pub(super) async fn run(args: Args, ctx: &Ctx<'_>) -> Result<TaskSnapshot, ToolError> {
    let task_id = checks::single_task_id("task_id", args.task_id, ctx.tasks).await?;
    let reply = match args.reply {
        Reply::Once => PermissionReply::Once,
        Reply::Always => PermissionReply::Always,
        Reply::Reject => PermissionReply::Reject,
    };
    let ask = args
        .permission_id
        .map(|id| checks::required_name("permission_id", id))
        .transpose()?;
    Ok(ctx
        .tasks
        .reply_permission(&task_id, ask.as_deref(), reply)
        .await?)
}

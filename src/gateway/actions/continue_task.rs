//! `continue_task`: send a follow-up prompt to a task's session. The agent keeps its context; the
//! same task id runs a new turn (turn + 1) and is waited on as before.
//!
//! The service ties completion to the new turn's own message, so status and wait can never report
//! the previous turn as the answer (a race in the original).
//!
//! A task started with `output_schema` keeps it: the follow-up gets the JSON instruction appended,
//! its answer is validated again, and a new round of automatic corrections may follow (see
//! `tasks/structured.rs`).

use rmcp::model::{JsonObject, ToolAnnotations};
use schemars::JsonSchema;
use serde::Deserialize;

use super::{checks, start_task, ActionSpec, Ctx};
use crate::config::Config;
use crate::gateway::error::ToolError;
use crate::tasks::{self, Detail, TaskSnapshot};

/// Arguments of `continue_task`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Args {
    /// The task.
    #[schemars(length(min = 1))]
    pub task_id: String,
    /// The follow-up: a correction, the next step, an answer.
    #[schemars(length(min = 1))]
    pub prompt: String,
    /// Another agent for this turn.
    #[schemars(length(min = 1))]
    pub agent: Option<String>,
    /// Another `provider/model` for this turn.
    #[schemars(length(min = 1))]
    pub model: Option<String>,
    /// More commands that must pass.
    pub checks: Option<Vec<String>>,
    /// `full`: also model, tokens, cost.
    #[serde(default)]
    pub detail: Detail,
}

/// The `continue_task` action.
pub struct ContinueTask;

impl ActionSpec for ContinueTask {
    type Args = Args;
    type Output = TaskSnapshot;
    const TITLE: &'static str = "Continue a task";

    /// As for starting a task: the agent may change or delete files (destructive), each call runs
    /// another turn (not idempotent), and the agent reaches an LLM provider (open world).
    fn annotations() -> ToolAnnotations {
        ToolAnnotations::new()
            .read_only(false)
            .destructive(true)
            .idempotent(false)
            .open_world(true)
    }

    fn refine_input_schema(config: &Config, schema: &mut JsonObject) {
        start_task::refine_prompt(config, schema);
        start_task::refine_checks(config, schema);
    }
}

pub(super) async fn run(args: Args, ctx: &Ctx<'_>) -> Result<TaskSnapshot, ToolError> {
    let request = tasks::ContinueTask {
        task_id: checks::single_task_id("task_id", args.task_id, ctx.tasks).await?,
        prompt: checks::prompt("prompt", args.prompt, ctx.config)?,
        agent: checks::optional_name("agent", args.agent)?,
        model: checks::model("model", args.model)?,
        checks: args.checks.unwrap_or_default(),
    };
    Ok(ctx
        .tasks
        .continue_task(request)
        .await?
        .with_detail(args.detail))
}

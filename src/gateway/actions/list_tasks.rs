//! `list_tasks`: the stored tasks, newest first, so a host whose `start_task` reply was lost (a
//! timeout, a cancelled call, a reconnect) can find the task it started instead of leaving an
//! agent running that nobody watches.

use rmcp::model::ToolAnnotations;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ActionSpec, Ctx};
use crate::gateway::error::ToolError;
use crate::tasks::store::usage::{self, TaskLine};
use crate::tasks::{epoch_ms, TaskStatus};

/// Most tasks one call lists.
const MAX_LIMIT: u32 = 200;

/// Arguments of `list_tasks`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Args {
    /// Only this status.
    #[serde(default)]
    pub status: Option<TaskStatus>,
    /// Most tasks, newest first.
    #[serde(default = "default_limit")]
    #[schemars(range(min = 1, max = MAX_LIMIT))]
    pub limit: u32,
}

fn default_limit() -> u32 {
    20
}

/// What `list_tasks` returns.
#[derive(Debug, Serialize, JsonSchema)]
pub struct TaskList {
    /// Newest first.
    pub tasks: Vec<TaskLine>,
    /// How many tasks matched (more than `tasks` holds when `limit` cut the list).
    pub total: u32,
}

/// The `list_tasks` action.
pub struct ListTasks;

impl ActionSpec for ListTasks {
    type Args = Args;
    type Output = TaskList;
    const TITLE: &'static str = "List tasks";

    /// Reads the task records and changes nothing.
    fn annotations() -> ToolAnnotations {
        super::observing()
    }
}

pub(super) async fn run(args: Args, ctx: &Ctx<'_>) -> Result<TaskList, ToolError> {
    if args.limit == 0 || args.limit > MAX_LIMIT {
        return Err(ToolError::invalid_argument(format!(
            "`limit`: expected 1 to {MAX_LIMIT}, found {}",
            args.limit
        )));
    }
    let records = ctx.tasks.summaries().await;
    let mut tasks = usage::list(
        &records,
        args.status,
        epoch_ms(std::time::SystemTime::now()),
        &|pid| ctx.tasks.gateway_alive(pid),
    );
    let total = u32::try_from(tasks.len()).unwrap_or(u32::MAX);
    tasks.truncate(args.limit as usize);
    Ok(TaskList { tasks, total })
}

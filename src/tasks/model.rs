//! The task model: one status vocabulary, and the shapes status, wait and result report.
//!
//! These types are also the tools' output schemas (via schemars), so a field added here is a
//! field the host sees.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::opencode::{ErrorInfo, FileChange, PermissionAsk, Tokens, ToolCall};

/// The one status vocabulary every tool uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    /// The prompt was sent; OpenCode has not started on it yet.
    Pending,
    /// OpenCode is working on the turn (including provider retries).
    Running,
    /// A tool is waiting for a permission answer.
    WaitingPermission,
    /// The turn finished; the result is readable.
    Completed,
    /// The turn ended with an error (provider error, server died, ...).
    Failed,
    /// Cancelled by `cancel_task`.
    Cancelled,
    /// Ran past `timeouts.task` and was aborted.
    TimedOut,
}

impl TaskStatus {
    /// Finished for good (until a `continue_task` opens a new turn).
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskStatus::Completed
                | TaskStatus::Failed
                | TaskStatus::Cancelled
                | TaskStatus::TimedOut
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Pending => "pending",
            TaskStatus::Running => "running",
            TaskStatus::WaitingPermission => "waiting_permission",
            TaskStatus::Completed => "completed",
            TaskStatus::Failed => "failed",
            TaskStatus::Cancelled => "cancelled",
            TaskStatus::TimedOut => "timed_out",
        }
    }
}

/// What a task is doing right now (with `include_progress`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, JsonSchema)]
pub struct Progress {
    /// The tool running now, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_tool: Option<String>,
    /// Its title (e.g. the command or the file).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_tool_title: Option<String>,
    /// The last characters of the streamed text.
    pub text_tail: String,
    /// Model steps completed in this turn.
    pub steps: u32,
    /// Tool calls finished in this turn.
    pub tools_run: u32,
    /// Tokens so far in this turn.
    pub tokens: Tokens,
    /// Milliseconds since the last event from OpenCode for this task.
    pub last_event_ms_ago: u64,
    /// No event for longer than `timeouts.stall` (reported, not acted on).
    pub stalled: bool,
    /// The provider is failing and OpenCode is retrying.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryInfo>,
}

/// OpenCode's retry state for a failing provider.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RetryInfo {
    pub attempt: u64,
    pub message: String,
}

/// A task as status and wait report it.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct TaskSnapshot {
    pub task_id: String,
    pub status: TaskStatus,
    pub server_id: String,
    pub session_id: String,
    pub title: String,
    pub directory: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The model the turn asked for (`provider/model`), or the one that answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// 1 for the first prompt, +1 for each `continue_task`.
    pub turn: u32,
    /// Milliseconds since the current turn was sent.
    pub elapsed_ms: u64,
    /// Why the task failed, timed out or was cancelled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorInfo>,
    /// The permission the task waits for (status `waiting_permission`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permission: Option<PermissionAsk>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
}

/// The full result of a task's current turn.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct TaskResult {
    pub task_id: String,
    /// The same status `get_task_status` reports.
    pub status: TaskStatus,
    pub turn: u32,
    /// The final text of the turn, from `offset`, at most `limits.result_page_chars` characters.
    pub text: String,
    /// More text follows: call again with `offset = next_offset`.
    pub truncated: bool,
    /// Character offset this page starts at.
    pub offset: u64,
    /// Total characters of the final text.
    pub total_chars: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_offset: Option<u64>,
    /// The answer was longer than `limits.max_result_chars` and was cut there.
    pub text_capped: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// Summed over the turn's model calls, compaction summaries included.
    pub tokens: Tokens,
    /// Cost in USD as OpenCode computed it (0 for models without pricing), summed like `tokens`.
    pub cost: f64,
    /// How often OpenCode compacted the context during the turn (summarised the history to fit
    /// the model's context window, then went on).
    pub compactions: u32,
    /// The part of `tokens` spent writing those summaries.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compaction_tokens: Option<Tokens>,
    /// The model's finish reason (`stop`, `length`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finish: Option<String>,
    /// Milliseconds from sending the turn to its end (or until now while running).
    pub duration_ms: u64,
    /// Files this turn changed.
    pub files_changed: Vec<FileChange>,
    /// Tool calls of the turn.
    pub tools: Vec<ToolCall>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorInfo>,
    /// Why `text` is empty or incomplete although the turn is over: its messages could not be
    /// read from OpenCode. Never present when `text` is the whole answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text_error: Option<String>,
}

/// `all`: wait until every task is finished; `any`: until one is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WaitMode {
    #[default]
    All,
    Any,
}

/// What a wait saw when it returned.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct WaitOutcome {
    /// The condition (`all` or `any`) was met.
    pub done: bool,
    /// The wait ended at its timeout with the condition unmet (call again to keep waiting).
    pub timed_out: bool,
    pub mode: WaitMode,
    /// Tasks that have finished (any terminal status).
    pub finished: Vec<String>,
    /// Tasks still pending, running or waiting for permission.
    pub unfinished: Vec<String>,
    /// A snapshot of every task waited on, in the order asked.
    pub tasks: Vec<TaskSnapshot>,
}

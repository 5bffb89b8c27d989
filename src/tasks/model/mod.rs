//! The task model: one status vocabulary, and the shapes status, wait and result report.
//!
//! These types are also the tools' output schemas (via schemars), so a field added here is a
//! field the host sees.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::git::DiffFile;
use crate::opencode::{ErrorInfo, FileChange, PermissionAsk, Tokens, ToolCall};

pub(crate) mod checks;
pub use checks::{CheckResult, ChecksStatus, ChecksView, Escalation};

/// Milliseconds since the Unix epoch: how every time a task reports or keeps is stamped (0 for
/// a clock set before 1970).
pub fn epoch_ms(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The one status vocabulary every tool uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    /// Every slot it could run in is taken (`limits.queue`): it starts, first in first out,
    /// as one frees; `queue_position` says how many are ahead of it.
    Queued,
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
            TaskStatus::Queued => "queued",
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
    /// A task with spending caps: what this turn has spent so far, in USD as OpenCode reports
    /// it (all steps and subagents)...
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spent_usd: Option<f64>,
    /// ...and in tokens (input, output, reasoning, cache reads and writes)...
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spent_tokens: Option<u64>,
    /// ...against these caps: past one, the turn is stopped (`BudgetExceeded`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<crate::config::Budget>,
}

/// OpenCode's retry state for a failing provider.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RetryInfo {
    pub attempt: u64,
    pub message: String,
}

/// How much a task tool reports. Every character of a result is read at the orchestrating
/// model's price, so by default a result says what the orchestrator acts on (status, answer,
/// error, changed files) and the rest (ids, model, tokens, cost, tool calls) comes on request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Detail {
    /// Status, title, elapsed time, answer, error, changed files.
    #[default]
    Lean,
    /// Also the OpenCode ids (server, session), directory, agent, model, turn, tokens, cost,
    /// tool calls and timings.
    Full,
}

/// One answer of a structured task (started with `output_schema`) checked against its schema.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StructuredAttempt {
    /// The turn that gave the answer.
    pub turn: u32,
    /// It matched the schema.
    pub ok: bool,
    /// Why not: each mismatch as `` `<instance path>`: <message> `` (capped), or why no JSON
    /// value was found.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
}

/// A task as status and wait report it.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct TaskSnapshot {
    pub task_id: String,
    pub status: TaskStatus,
    /// Set when the status alone does not say where the task stands: `starting`, `aborting`,
    /// or `held_schema`, `held_checks`, `held_outage` (its answer is being checked or moved).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// A queued task's place in the queue (1: it starts next).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_position: Option<u32>,
    pub title: String,
    /// Milliseconds since the current turn was sent.
    pub elapsed_ms: u64,
    /// Why the task failed, timed out or was cancelled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorInfo>,
    /// The permission asks the task waits on (status `waiting_permission`), oldest first; each
    /// is answered by its `id`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub permissions: Vec<PermissionAsk>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
    /// The answer of a finished turn (wait results), as much as fits in this result.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The answer goes on: read the rest with the get-result tool from this `offset`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_offset: Option<u64>,
    /// Files the finished turn changed (wait results; listed once read, which happens right
    /// after the turn ends: the get-result tool lists them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub files_changed: Option<Vec<FileChange>>,
    /// The task's git worktree (isolation `worktree`); in wait results with the files changed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workspace: Option<Workspace>,
    /// A finished task started with `output_schema`: the JSON value its answer ended with,
    /// parsed, once it matched the schema.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub structured: Option<serde_json::Value>,
    /// A finished task started with `output_schema` whose answers never matched it (after the
    /// automatic corrections): the last validation errors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub structured_error: Option<String>,
    /// (detail `full`) Each answer checked against `output_schema`, one per turn.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub structured_attempts: Option<Vec<StructuredAttempt>>,
    /// A task with checks: whether they passed (only `passed` is verified), fix rounds, the
    /// failing commands' output ends, escalations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checks: Option<ChecksView>,
    /// Each move of the task to another model (a fallback after a provider error, or the
    /// tier's `escalate_to`): `from`, `to`, the models, why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub escalations: Vec<Escalation>,
    /// Whether its commands and checks ran sandboxed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confined: Option<bool>,
    /// Why not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unconfined: Option<String>,
    /// (detail `full`) The OpenCode server the task runs on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_id: Option<String>,
    /// (detail `full`) The OpenCode session of the task.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// (detail `full`) The directory the session works in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub directory: Option<String>,
    /// (detail `full`)
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// (detail `full`) The model that answered (`provider/model`) as OpenCode reports it, else
    /// the one the turn asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// (detail `full`) Present only when the model that answered is not the one the turn asked
    /// for: the one asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_requested: Option<String>,
    /// (detail `full`) The model variant the turn ran with (e.g. its reasoning effort).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    /// (detail `full`) 1 for the first prompt, +1 for each `continue_task` or automatic
    /// correction.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub turn: Option<u32>,
    /// The fan-out group the task is one answer of: pass it to the wait tool in place of the
    /// task ids. A group's tasks always show `model`, `tokens` and `cost`, so the answers can be
    /// compared side by side.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group_id: Option<String>,
    /// (detail `full`, or in a group) Tokens of the finished turn.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens: Option<Tokens>,
    /// (detail `full`, or in a group) Cost of the finished turn in dollars, as OpenCode reports
    /// it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
    /// When the current turn was sent, and when the task last moved (its finish, else its
    /// latest event), in epoch ms: a native task's `createdAt` and `lastUpdatedAt`. Not in tool
    /// results.
    #[serde(skip)]
    #[schemars(skip)]
    pub turn_started_ms: u64,
    #[serde(skip)]
    #[schemars(skip)]
    pub updated_ms: u64,
}

impl TaskSnapshot {
    /// Drops what only detail `full` reports.
    pub fn with_detail(mut self, detail: Detail) -> Self {
        if detail == Detail::Lean {
            self.server_id = None;
            self.session_id = None;
            self.directory = None;
            self.agent = None;
            self.turn = None;
            self.structured_attempts = None;
            self.model_requested = None;
            self.variant = None;
            if self.group_id.is_none() {
                self.model = None;
                self.tokens = None;
                self.cost = None;
            }
        }
        self
    }
}

/// The full result of a task's current turn.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct TaskResult {
    pub task_id: String,
    /// The same status `get_task_status` reports.
    pub status: TaskStatus,
    /// Set when the status alone does not say where the task stands: `starting`, `aborting`,
    /// or `held_schema`, `held_checks`, `held_outage` (its answer is being checked or moved).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The final text of the turn from `offset`: as much as fits in one result for this host
    /// (at most `limits.result_page_chars` characters).
    pub text: String,
    /// More text follows: call again with `offset = next_offset`.
    pub truncated: bool,
    /// Total characters of the final text.
    pub total_chars: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_offset: Option<u64>,
    /// Character offset this page starts at (absent for 0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub offset: u64,
    /// The answer was longer than `limits.max_result_chars` and was cut there.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub text_capped: bool,
    /// The turn had more messages than the gateway reads back (2,000): `tokens`, `cost` and
    /// `tools` count its newest messages only (the answer and the status are unaffected).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub messages_capped: bool,
    /// Files this turn changed, as OpenCode lists them: every file that changed in the task's
    /// directory while the turn ran, so another task's changes there at the same time are
    /// listed too (`isolation: "worktree"` keeps tasks apart).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files_changed: Vec<FileChange>,
    /// The task's git worktree (isolation `worktree`), with every file the task changed against
    /// its base.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workspace: Option<Workspace>,
    /// `diff` when `text` is the task's unified diff rather than its answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub view: Option<ResultView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorInfo>,
    /// Why `text` is empty or incomplete although the turn is over: its messages could not be
    /// read from OpenCode. Never present when `text` is the whole answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text_error: Option<String>,
    /// Why `files_changed` is absent although the turn is over: OpenCode's list of the turn's
    /// changed files could not be read, is not written yet (ask again), or is not kept there
    /// (OpenCode lists changes only in a git repository). Absent `files_changed` without it
    /// means none changed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub files_error: Option<String>,
    /// A task started with `output_schema`: the JSON value its answer ended with, parsed, once
    /// it matched the schema (first page only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub structured: Option<serde_json::Value>,
    /// A task started with `output_schema` whose answers never matched it (after the automatic
    /// corrections): the last validation errors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub structured_error: Option<String>,
    /// A task started with `output_schema`: each answer checked, one per turn (an automatic
    /// correction is a turn), so every retry is visible (first page only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub structured_attempts: Option<Vec<StructuredAttempt>>,
    /// A task with checks: whether they passed (only `passed` is verified), fix rounds, and
    /// each command's exit status, duration and output end in the latest run; escalations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checks: Option<ChecksView>,
    /// Each move of the task to another model (a fallback after a provider error, or the
    /// tier's `escalate_to`): `from`, `to`, the models, why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub escalations: Vec<Escalation>,
    /// Whether its commands and checks ran sandboxed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confined: Option<bool>,
    /// Why not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unconfined: Option<String>,
    /// (detail `full`) 1 for the first prompt, +1 for each `continue_task` or automatic
    /// correction.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub turn: Option<u32>,
    /// (detail `full`) The model that answered, as OpenCode reports it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// (detail `full`) Present only when the model that answered is not the one the turn asked
    /// for: the one asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_requested: Option<String>,
    /// (detail `full`) The model variant the turn ran with (e.g. its reasoning effort).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    /// (detail `full`)
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// (detail `full`) Summed over the turn's model calls, compaction summaries included.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens: Option<Tokens>,
    /// (detail `full`) Cost in USD as OpenCode computed it (0 for models without pricing),
    /// summed like `tokens`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
    /// (detail `full`) How often OpenCode compacted the context during the turn (summarised the
    /// history to fit the model's context window, then went on).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compactions: Option<u32>,
    /// (detail `full`) The part of `tokens` spent writing those summaries.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compaction_tokens: Option<Tokens>,
    /// (detail `full`) The model's finish reason (`stop`, `length`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finish: Option<String>,
    /// (detail `full`) Milliseconds from sending the turn to its end (or until now while
    /// running).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// (detail `full`) Tool calls of the turn.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<ToolCall>>,
    /// Fields this page left out so that it still carries the answer within the host's result
    /// size (`tools`, `workspace`, `files_changed`, `structured_attempts`, `structured`, in that
    /// order): the wait for this task listed the changed files, `view` `diff` shows the changes,
    /// and the structured value is the JSON the answer ends with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub omitted: Option<Vec<String>>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl TaskResult {
    /// Drops what only detail `full` reports.
    pub fn with_detail(mut self, detail: Detail) -> Self {
        if detail == Detail::Lean {
            self.turn = None;
            self.model = None;
            self.model_requested = None;
            self.variant = None;
            self.agent = None;
            self.tokens = None;
            self.cost = None;
            self.compactions = None;
            self.compaction_tokens = None;
            self.finish = None;
            self.duration_ms = None;
            self.tools = None;
        }
        self
    }
}

/// What `get_task_result` pages through.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ResultView {
    /// The agent's final answer.
    #[default]
    Text,
    /// The unified diff of everything the task changed against its base (worktree tasks).
    Diff,
}

/// A task's git worktree, as results report it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct Workspace {
    /// The worktree's directory (the session works there), on `worker` when there is one.
    pub path: String,
    /// Its branch, `opencode-mcp/<task_id>`.
    pub branch: String,
    /// The worker the task runs on, when not this machine; its change is fetched back here
    /// after each turn, so diff and apply work as for a local worktree.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    /// The commit it started from: `HEAD` plus the uncommitted changes of the origin at the
    /// start (base `working_tree`), or `HEAD` (base `head`).
    pub base: String,
    /// The repository apply brings the change into.
    pub origin: String,
    /// The task's change was applied (up to the state of the last apply).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub applied: bool,
    /// The worktree and branch were removed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub discarded: bool,
    /// Every file the task changed against `base` (results of finished turns).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changes: Option<Vec<DiffFile>>,
    /// Why `changes` could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diff_error: Option<String>,
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
    /// Tasks waiting for a permission answer that had not been shown before (by a wait or a
    /// status): the wait returned early for them, since they cannot go on until the ask is
    /// answered (or they are cancelled). The ask is in each one's `permission`; a later wait
    /// does not return early for the same ask again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub asking: Vec<String>,
    pub mode: WaitMode,
    /// Tasks that have finished (any terminal status).
    pub finished: Vec<String>,
    /// Tasks still pending, running or waiting for permission.
    pub unfinished: Vec<String>,
    /// A snapshot of every task waited on, in the order asked.
    pub tasks: Vec<TaskSnapshot>,
}

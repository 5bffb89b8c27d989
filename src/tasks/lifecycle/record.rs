//! The durable task record: what is saved to the state directory and restored from it, and
//! nothing else. Live progress (the current tool, streamed text, monotonic clocks) lives beside
//! it in the registry and is never written.
//!
//! Records are JSON; fields added after the first release carry `#[serde(default)]` so that a
//! newer gateway reads an older gateway's records, and unknown fields are ignored so that an
//! older gateway can still read a newer one's.

use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};

use super::super::model::{epoch_ms, TaskStatus, Workspace};
use super::phase::Phase;
use super::turn::TurnState;
use crate::opencode::{ErrorInfo, FileChange, PermissionAsk};
use crate::tasks::spend::spent::TaskSpend;

pub use super::held::{ChecksState, StructuredState};

/// Format version of a record.
pub const VERSION: u32 = 1;

/// One task: its session, its current turn and, once the turn is over, its outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRecord {
    pub version: u32,
    pub id: String,
    /// The gateway process that owns the task's live turn (set when the record is written).
    pub owner_pid: u32,
    pub server_id: String,
    /// The server's base URL and whether the gateway manages it: after a restart this is how a
    /// stored task finds its server again (or learns it is gone).
    pub server_url: String,
    pub managed: bool,
    pub session_id: String,
    pub directory: String,
    pub title: String,
    /// Agent and model the current turn asked for (None = the server's default).
    pub agent: Option<String>,
    pub model: Option<String>,
    /// The tier the task was started with, kept so the usage report can say which tier did
    /// which share of the work; cleared when a follow-up names its own model. Absent in records
    /// written before the usage report existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    /// 1 for the first prompt, +1 for each `continue_task` and each automatic correction of a
    /// structured answer.
    pub turn: u32,
    /// Our user message of the current turn: the turn is everything after it.
    pub user_message_id: String,
    /// Epoch milliseconds the task was started (its first turn), so a task list sorts by when
    /// tasks began rather than by their latest follow-up. Absent in older records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_ms: Option<u64>,
    /// Epoch milliseconds.
    pub turn_started_ms: u64,
    pub finished_ms: Option<u64>,
    /// What hosts read; derived from `phase` by the lifecycle's transitions, the only writers
    /// (see [`TaskRecord::status`]). Saved so that older gateways and the task list read it.
    status: TaskStatus,
    /// Where the task stands (see [`Phase`]). Absent in records written before phases were
    /// saved: [`TaskRecord::phase`] derives it then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    phase: Option<Phase>,
    /// The provider failure a turn held for another model ([`Phase::HeldOutage`]) is held with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    outage: Option<ErrorInfo>,
    /// A queued task's start request (`service::StartTask`, as JSON), until it starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued: Option<serde_json::Value>,
    pub error: Option<ErrorInfo>,
    /// The permission asks the turn waits on (its own session's and its subagents'), oldest
    /// first; each is answered by its id. Records written before asks were kept apart hold one
    /// ask, or `null`, under `permission`.
    #[serde(
        default,
        alias = "permission",
        deserialize_with = "asks_one_or_many",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub permissions: Vec<PermissionAsk>,
    /// The finished turn as read over HTTP (text, tokens, tools).
    pub outcome: Option<TurnState>,
    /// Why the finished turn's outcome could not be read (after retries): reported with the
    /// result so that an empty text is never presented as the answer.
    #[serde(default)]
    pub outcome_error: Option<String>,
    /// Files the current turn changed.
    pub files_changed: Option<Vec<FileChange>>,
    /// Why the finished turn's changed files could not be read: reported with the result, so
    /// that a missing list never reads as "changed nothing".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files_error: Option<String>,
    /// Sessions of subagents the task started (their asks and activity are the task's).
    #[serde(default)]
    pub child_sessions: Vec<String>,
    /// The newest message id seen in the session: the next one we mint sorts above it.
    #[serde(default)]
    pub newest_message_id: Option<String>,
    /// The `idempotency_key` the task was started with, and the fingerprint of the arguments
    /// that came with it (so a retry after a restart still finds it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency: Option<(String, u64)>,
    /// The git worktree the task works in (isolation `worktree`); absent for isolation `none`
    /// and in records written before worktrees existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<WorkspaceRecord>,
    /// The fan-out group the task was started in (`fan_out`: one prompt, several tiers or
    /// models), so its answer is shown beside the others'; absent for a task started alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<GroupMember>,
    /// The `output_schema` of a structured task, its checked answers and where the check stands
    /// (see `structured.rs`); absent for other tasks and in older records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured: Option<StructuredState>,
    /// The commands that must succeed after each turn, their latest run, fix rounds and
    /// escalations (see `checks`); absent for tasks without checks and in older records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checks: Option<ChecksState>,
    /// Each move of the task to another model: a tier's fallback model after a provider error,
    /// or its `escalate_to` tier after failing checks or a provider error (oldest first).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub escalations: Vec<super::super::model::Escalation>,
    /// What the task spent: its earlier turns, the tiers and models it left, the host turn's
    /// earlier rounds (the fields keep their names on disk). Only `spend/` writes it.
    #[serde(flatten)]
    pub spend: TaskSpend,
    /// The caps each turn of the task may spend up to (`limits`, its tier's and its start
    /// call's, the lowest of each); absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<crate::config::Budget>,
    /// The model variant every turn runs with (the call's, else the tier's); cleared when a
    /// continue names a model of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    /// The model the task was started on and its price in the server's catalog then: what the
    /// usage report prices its turns at when OpenCode reports no cost for them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price: Option<(String, crate::opencode::Price)>,
    /// Whether the task's commands and checks run in the sandbox, and why not; absent in
    /// records written before the sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confinement: Option<crate::sandbox::Confinement>,
    /// The turns before the current one, oldest first, in short (the last [`PAST_TURNS`]): what
    /// the dashboard's task page lists. Absent in older records.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub past_turns: Vec<PastTurn>,
}

/// Past turns a record keeps (the oldest go first): the record is rewritten on every change.
pub const PAST_TURNS: usize = 20;
/// Characters of a past turn's answer kept.
pub const PAST_ANSWER_CHARS: usize = 500;

/// A turn that ended, in short, as the next one opened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PastTurn {
    pub turn: u32,
    pub status: TaskStatus,
    pub started_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_ms: Option<u64>,
    /// The model that answered, else the one asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// What OpenCode reported it cost.
    pub cost: f64,
    /// The start of its answer (the agent's text: hostile, shown as text).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub answer: String,
    /// Whether `answer` was cut.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cut: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A task's place in a fan-out group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupMember {
    /// The group id (`grp_...`).
    pub id: String,
    /// Its position among the group's targets (0-based), the order results are shown in.
    pub index: u32,
}

/// A task's worktree, as kept across restarts: enough to diff, apply and remove it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspaceRecord {
    /// The top of the user's repository the worktree was made from (where apply writes).
    pub origin: String,
    /// The worktree's root.
    pub path: String,
    /// `opencode-mcp/<task_id>`.
    pub branch: String,
    /// The commit the worktree started from.
    pub base: String,
    /// The commit of the task's branch last applied to the origin: the next apply brings only
    /// what the task changed since.
    #[serde(default)]
    pub applied: Option<String>,
    /// The worktree and its branch were removed.
    #[serde(default)]
    pub discarded: bool,
    /// For a task placed on a remote worker: where its worktree is there (`path` and `branch`
    /// are the worker's) and what of it was fetched back. `None`: the worktree is on this
    /// machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<RemoteWorkspace>,
}

/// The worker side of a remote task's worktree (see `workers::repo`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteWorkspace {
    /// The worker's name in the user's `workers:`.
    pub worker: String,
    /// The worker's bare repository for the origin (the worktree's repository there).
    pub bare: String,
    /// The commit of the task's branch last fetched back, in the origin under
    /// `refs/opencode-mcp/remote/<task>`: what diff, apply and results read.
    #[serde(default)]
    pub fetched: Option<String>,
    /// The turn whose end `fetched` holds (0: none yet).
    #[serde(default)]
    pub fetched_turn: u32,
}

impl TaskRecord {
    /// The worker the task runs on: a remote worker's name, or `local`.
    pub fn worker(&self) -> &str {
        self.workspace
            .as_ref()
            .and_then(|w| w.remote.as_ref())
            .map_or(crate::config::LOCAL_WORKER, |r| r.worker.as_str())
    }

    /// A task whose first turn has not been opened yet.
    pub fn new(
        id: String,
        server_id: String,
        session_id: String,
        directory: String,
        title: String,
    ) -> Self {
        Self {
            version: VERSION,
            id,
            owner_pid: std::process::id(),
            server_id,
            server_url: String::new(),
            managed: false,
            session_id,
            directory,
            title,
            agent: None,
            model: None,
            tier: None,
            turn: 0,
            user_message_id: String::new(),
            created_ms: Some(epoch_ms(SystemTime::now())),
            turn_started_ms: epoch_ms(SystemTime::now()),
            finished_ms: None,
            status: TaskStatus::Pending,
            phase: Some(Phase::Starting),
            outage: None,
            queued: None,
            error: None,
            permissions: Vec::new(),
            outcome: None,
            outcome_error: None,
            files_changed: None,
            files_error: None,
            child_sessions: Vec::new(),
            newest_message_id: None,
            idempotency: None,
            workspace: None,
            group: None,
            structured: None,
            checks: None,
            escalations: Vec::new(),
            confinement: None,
            past_turns: Vec::new(),
            budget: None,
            variant: None,
            price: None,
            spend: TaskSpend::default(),
        }
    }

    /// What the current turn cost as its outcome was read over HTTP (0 until it is read).
    pub fn outcome_cost(&self) -> f64 {
        self.outcome.as_ref().map_or(0.0, |o| o.cost)
    }

    /// What hosts read of where the task stands.
    pub fn status(&self) -> TaskStatus {
        self.status
    }

    /// Where the task stands.
    pub fn phase(&self) -> Phase {
        self.phase.unwrap_or_else(|| {
            let schema = self
                .structured
                .as_ref()
                .is_some_and(|s| s.checking.is_some());
            let checks = self.checks.as_ref().is_some_and(|c| c.checking.is_some());
            Phase::of_older_record(self.status, schema, checks)
        })
    }

    /// The provider failure the turn is held with on its way to another model.
    pub fn outage(&self) -> Option<&ErrorInfo> {
        self.outage.as_ref()
    }

    /// Moves the task to `phase`, its status with it: the phase's own status, else `open`
    /// (the open or aborting turn's status as it was, `pending` for a turn that just began;
    /// for [`Phase::Finished`], the status it ended with, set by [`Self::finish`]).
    pub(in crate::tasks::lifecycle) fn set_phase(&mut self, phase: Phase, open: TaskStatus) {
        self.phase = Some(phase);
        if phase != Phase::HeldOutage {
            self.outage = None;
        }
        self.status = phase.fixed_status().unwrap_or(open);
    }

    /// Holds the turn for another model, with the provider failure it is held with.
    pub(in crate::tasks::lifecycle) fn hold_outage(&mut self, error: Option<ErrorInfo>) {
        self.set_phase(Phase::HeldOutage, TaskStatus::Running);
        self.outage = error;
    }

    /// The open turn's status moves within `open` (`pending`, `running`, `waiting_permission`).
    pub(in crate::tasks::lifecycle) fn set_open_status(&mut self, status: TaskStatus) {
        debug_assert!(matches!(self.phase(), Phase::Open | Phase::Aborting));
        self.status = status;
    }

    /// Opens a new turn: everything about the previous one is cleared, but what it spent is
    /// added to the task's spend ([`TaskSpend::open_turn`]); `rounds_before` is what the host
    /// turn's earlier rounds spent.
    pub(in crate::tasks::lifecycle) fn begin_turn(
        &mut self,
        user_message_id: String,
        agent: Option<String>,
        model: Option<String>,
        rounds_before: (f64, u64),
    ) {
        let now = epoch_ms(SystemTime::now());
        let finished = (self.turn > 0).then(|| {
            let end = self.finished_ms.unwrap_or(now);
            (
                self.outcome.as_ref().map(|o| (&o.tokens, o.cost)),
                end.saturating_sub(self.turn_started_ms),
            )
        });
        self.spend.open_turn(finished, rounds_before);
        if self.turn > 0 {
            self.keep_past_turn(now);
        }
        self.turn += 1;
        self.note_message_id(&user_message_id);
        self.user_message_id = user_message_id;
        self.agent = agent;
        self.model = model;
        self.turn_started_ms = now;
        self.finished_ms = None;
        self.set_phase(Phase::Open, TaskStatus::Pending);
        self.error = None;
        self.permissions.clear();
        self.outcome = None;
        self.outcome_error = None;
        self.files_changed = None;
        self.files_error = None;
    }

    /// Keeps the current turn, in short, before the next one clears it.
    fn keep_past_turn(&mut self, now: u64) {
        let text = self.outcome.as_ref().map_or("", |o| o.text.as_str());
        let answer: String = text.chars().take(PAST_ANSWER_CHARS).collect();
        let past = PastTurn {
            turn: self.turn,
            status: self.status(),
            started_ms: self.turn_started_ms,
            finished_ms: Some(self.finished_ms.unwrap_or(now)),
            model: self
                .outcome
                .as_ref()
                .and_then(|o| o.model.clone())
                .or_else(|| self.model.clone()),
            cost: self.outcome.as_ref().map_or(0.0, |o| o.cost),
            cut: answer.len() < text.len(),
            answer,
            error: self.error.as_ref().map(|e| e.message.clone()),
        };
        self.past_turns.push(past);
        let over = self.past_turns.len().saturating_sub(PAST_TURNS);
        self.past_turns.drain(..over);
    }

    /// Ends the turn with a terminal status.
    pub(in crate::tasks::lifecycle) fn finish(
        &mut self,
        status: TaskStatus,
        error: Option<ErrorInfo>,
    ) {
        debug_assert!(status.is_terminal());
        self.set_phase(Phase::Finished, status);
        self.error = error;
        self.permissions.clear();
        self.finished_ms = Some(epoch_ms(SystemTime::now()));
        // However the turn ended, no check of its answer is pending any more.
        if let Some(s) = self.structured.as_mut() {
            s.checking = None;
        }
        if let Some(c) = self.checks.as_mut() {
            c.checking = None;
        }
        // Known at once, in the same write as the end of the turn: no read, no second write.
        if self.files_changed.is_none() && self.ran_no_tool() {
            self.files_changed = Some(Vec::new());
            self.files_error = None;
        }
    }

    /// Whether the current turn is known to have run no tool at all, so that it changed no
    /// file and its list is empty without asking OpenCode. Only a turn whose outcome was read
    /// whole qualifies: not one whose older messages were left unread, nor a structured round
    /// with corrections (the outcome is the last correction's). A pure answer is the common
    /// case of a fan-out of questions, and each saved read is one request less on a busy
    /// server.
    pub fn ran_no_tool(&self) -> bool {
        let whole_round = self
            .structured
            .as_ref()
            .is_none_or(|s| s.corrected_messages.is_empty())
            && self
                .checks
                .as_ref()
                .is_none_or(|c| c.fixed_messages.is_empty());
        whole_round
            && self
                .outcome
                .as_ref()
                .is_some_and(|o| o.user_message_seen && o.tools.is_empty() && !o.messages_capped)
    }

    /// Whether the current turn completed and is held for the gateway's own verdict (its
    /// structured answer's check, or its checks): the durable twin of `Phase::Checking`.
    pub fn is_held(&self) -> bool {
        let turn = Some(self.turn);
        self.structured.as_ref().is_some_and(|s| s.checking == turn)
            || self.checks.as_ref().is_some_and(|c| c.checking == turn)
    }

    /// Our user messages of the host turn's earlier rounds (structured corrections, checks' fix
    /// rounds), oldest first: the turn's changed files are those of all its rounds.
    pub fn earlier_rounds(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        let structured = self.structured.iter().flat_map(|s| &s.corrected_messages);
        let checks = self.checks.iter().flat_map(|c| &c.fixed_messages);
        for m in structured.chain(checks) {
            if !out.contains(&m.as_str()) {
                out.push(m);
            }
        }
        out.sort_unstable();
        out
    }

    /// Remembers a message id of the session if it is the newest seen.
    pub fn note_message_id(&mut self, id: &str) {
        if self.newest_message_id.as_deref().is_none_or(|n| id > n) {
            self.newest_message_id = Some(id.to_string());
        }
    }

    /// The model the turn asked for, when OpenCode answered with another one (a provider
    /// fallback, an agent pinning its own model): results and the task list flag it.
    pub fn model_requested_if_other(&self, answered: Option<&str>) -> Option<String> {
        requested_if_other(self.model.as_deref(), answered)
    }

    /// When the task was started (epoch ms): its first turn, or the current one for records
    /// written before that was kept.
    pub fn started_ms(&self) -> u64 {
        self.created_ms.unwrap_or(self.turn_started_ms)
    }

    /// The `Instant` `epoch_ms` lies at, as well as this process can express it.
    pub fn instant_at(ms: u64) -> Instant {
        let ago = Duration::from_millis(epoch_ms(SystemTime::now()).saturating_sub(ms));
        Instant::now().checked_sub(ago).unwrap_or_else(Instant::now)
    }
}

/// The model `asked` for, when another one `answered` (see
/// [`TaskRecord::model_requested_if_other`]).
pub fn requested_if_other(asked: Option<&str>, answered: Option<&str>) -> Option<String> {
    let asked = asked?;
    (answered.is_some_and(|a| a != asked)).then(|| asked.to_string())
}

/// A worktree as status and results show it (its diff is read when asked for).
impl Workspace {
    pub fn from_record(w: &WorkspaceRecord) -> Self {
        Self {
            path: w.path.clone(),
            branch: w.branch.clone(),
            base: w.base.clone(),
            origin: w.origin.clone(),
            applied: w.applied.is_some(),
            discarded: w.discarded,
            worker: w.remote.as_ref().map(|r| r.worker.clone()),
            changes: None,
            diff_error: None,
        }
    }
}

/// Reads `permissions` as a list, or as the single ask (or `null`) of a record written when a
/// task held one ask.
fn asks_one_or_many<'de, D>(d: D) -> Result<Vec<PermissionAsk>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        Many(Vec<PermissionAsk>),
        One(Option<PermissionAsk>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::Many(asks) => asks,
        OneOrMany::One(ask) => ask.into_iter().collect(),
    })
}

/// The error a task whose turn died with its gateway reports.
pub fn interrupted(reason: &str) -> ErrorInfo {
    ErrorInfo {
        provider_status: None,
        retryable: None,
        name: "Interrupted".into(),
        message: reason.to_string(),
    }
}

/// The error name of a task whose worker is out of reach for good.
pub const WORKER_LOST: &str = "WorkerLost";

/// The error of a task whose worker's OpenCode is out of reach for good.
pub fn worker_lost(message: &str) -> ErrorInfo {
    ErrorInfo {
        provider_status: None,
        retryable: None,
        name: WORKER_LOST.into(),
        message: message.to_string(),
    }
}

/// The error of a task whose start failed after it was answered (`why`: the step, and the
/// cause): a start in the background, or a queued task's when its turn came.
pub fn start_failed(why: impl std::fmt::Display) -> ErrorInfo {
    ErrorInfo {
        provider_status: None,
        retryable: None,
        name: "StartFailed".into(),
        message: format!("the task could not start: {why}"),
    }
}

/// For the tests of other rooms, which build records in a given state: the transitions they
/// would otherwise reach through a running gateway.
#[cfg(test)]
impl TaskRecord {
    pub fn begin_turn_for_test(
        &mut self,
        user_message_id: String,
        agent: Option<String>,
        model: Option<String>,
    ) {
        self.begin_turn(user_message_id, agent, model, (0.0, 0));
    }

    pub fn finish_for_test(&mut self, status: TaskStatus, error: Option<ErrorInfo>) {
        self.finish(status, error);
    }

    /// The record as the lifecycle would have left it with `status`.
    pub fn set_status_for_test(&mut self, status: TaskStatus) {
        let phase = Phase::of_older_record(status, false, false);
        self.set_phase(phase, status);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A task whose first turn (user message `msg_1`) has begun.
    fn in_first_turn() -> TaskRecord {
        let mut r = TaskRecord::new(
            "t".into(),
            "s".into(),
            "ses".into(),
            "/w".into(),
            "x".into(),
        );
        r.begin_turn("msg_1".into(), None, None, (0.0, 0));
        r
    }

    #[test]
    fn a_new_turn_clears_the_previous_outcome() {
        let mut r = in_first_turn();
        r.outcome_error = Some("x".into());
        r.finish(
            TaskStatus::Failed,
            Some(ErrorInfo {
                provider_status: None,
                retryable: None,
                name: "X".into(),
                message: "y".into(),
            }),
        );
        let mut outcome = TurnState::default();
        outcome.tokens.input = 120;
        outcome.cost = 0.25;
        r.outcome = Some(outcome);
        r.begin_turn("msg_2".into(), None, None, (0.0, 0));
        assert_eq!(r.turn, 2);
        assert!(r.outcome.is_none());
        assert_eq!(
            (r.spend.earlier().tokens.input, r.spend.earlier().cost),
            (120, 0.25)
        );
        assert_eq!(r.status, TaskStatus::Pending);
        assert!(r.error.is_none() && r.finished_ms.is_none() && r.outcome_error.is_none());
        assert_eq!(r.newest_message_id.as_deref(), Some("msg_2"));
    }

    /// A turn that ran no tool ends with its (empty) list of changed files in the same
    /// record, so its end is one write, not two; one that ran a tool, or whose outcome is not
    /// known whole, leaves the list to be read.
    #[test]
    fn the_end_of_a_turn_that_ran_no_tool_knows_its_empty_list() {
        use crate::opencode::ToolCall;
        let ended = |tools: Vec<ToolCall>, capped: bool| {
            let mut r = in_first_turn();
            r.outcome = Some(TurnState {
                user_message_seen: true,
                tools,
                messages_capped: capped,
                ..TurnState::default()
            });
            r.finish(TaskStatus::Completed, None);
            r.files_changed
        };
        assert_eq!(ended(vec![], false), Some(vec![]));
        let bash = ToolCall {
            tool: "bash".into(),
            status: "completed".into(),
            title: None,
            error: None,
        };
        assert_eq!(ended(vec![bash], false), None);
        assert_eq!(ended(vec![], true), None);
    }

    #[test]
    fn records_of_the_first_release_still_load() {
        let old = serde_json::json!({
            "version": 1, "id": "tsk_a", "owner_pid": 1, "server_id": "srv", "server_url": "u",
            "managed": true, "session_id": "ses", "directory": "/w", "title": "t",
            "agent": null, "model": null, "turn": 1, "user_message_id": "msg_1",
            "turn_started_ms": 5, "finished_ms": 6, "status": "completed", "error": null,
            "permission": null, "retry": null, "outcome": null, "files_changed": null
        });
        let r: TaskRecord = serde_json::from_value(old).expect("an old record loads");
        assert!(r.child_sessions.is_empty() && r.outcome_error.is_none());
        assert!(r.workspace.is_none());
        assert!(r.permissions.is_empty());
    }

    /// A new record as JSON, as it is written.
    fn new_record_json() -> serde_json::Value {
        serde_json::to_value(TaskRecord::new(
            "tsk_a".into(),
            "srv".into(),
            "ses".into(),
            "/w".into(),
            "t".into(),
        ))
        .expect("record")
    }

    #[test]
    fn a_record_holding_one_ask_loads_it_as_the_only_pending_one() {
        let ask = serde_json::json!({
            "id": "per_1", "session_id": "ses", "permission": "bash",
            "patterns": ["rm -rf build"], "metadata": {}
        });
        let mut rec = new_record_json();
        rec["permission"] = ask.clone();
        let r: TaskRecord = serde_json::from_value(rec.clone()).expect("loads");
        assert_eq!(r.permissions.len(), 1);
        assert_eq!(r.permissions[0].id, "per_1");
        // Written back, it holds a list, which loads the same.
        let again = serde_json::to_value(&r).expect("json");
        assert_eq!(again["permissions"][0]["id"], "per_1");
        assert!(again.get("permission").is_none());
        let r2: TaskRecord = serde_json::from_value(again).expect("loads");
        assert_eq!(r2.permissions, r.permissions);
    }

    /// The spend a record keeps sits beside its other fields, under the names records had
    /// before it was one value: records written by older gateways read the same, and older
    /// gateways read ours.
    #[test]
    fn a_records_spend_keeps_its_names_on_disk() {
        let mut rec = new_record_json();
        assert!(rec.get("spend").is_none() && rec.get("earlier").is_none());
        rec["earlier"] = serde_json::json!({"cost": 0.5, "wall_ms": 7});
        rec["segments"] =
            serde_json::json!([{"tier": "fast", "model": "p/m", "spent": {"cost": 0.25}}]);
        rec["spent_before"] = serde_json::json!([0.125, 40]);
        let r: TaskRecord = serde_json::from_value(rec).expect("loads");
        assert_eq!(
            (r.spend.earlier().cost, r.spend.earlier().wall_ms),
            (0.5, 7)
        );
        assert_eq!(r.spend.segments()[0].tier.as_deref(), Some("fast"));
        let caps = r
            .spend
            .for_caps(&crate::tasks::spend::spending::Spending::default());
        assert_eq!(caps, (0.125, 40));
        let again = serde_json::to_value(&r).expect("json");
        assert_eq!(again["earlier"]["cost"], 0.5);
        assert_eq!(again["segments"][0]["spent"]["cost"], 0.25);
        assert_eq!(again["spent_before"], serde_json::json!([0.125, 40]));
    }
}

//! A task's entry: its durable record and its live state, moved only by named transitions.
//!
//! The phase (see `phase.rs`) is saved in the record; the transitions here
//! ([`TaskEntry::claim_start`], [`TaskEntry::begin_turn`], [`TaskEntry::hold`],
//! [`TaskEntry::claim_abort`], [`TaskEntry::finish`], ...) are the only way it moves, each from
//! the phases it names, so two deciders (an idle event and an abort, say) cannot both end a
//! turn. Everything else the gateway knows of a running turn and does not keep on disk
//! (progress, streamed text, spend, pending asks' times) is [`Live`]. The registry holds the
//! entries and runs every change under its lock (`registry.rs`).

use std::time::{Duration, Instant};

use super::super::model::{Progress, TaskSnapshot, TaskStatus, Workspace};
use super::phase::{Held, Phase, Refused};
use super::record::TaskRecord;
use super::stream::StreamedTurn;
use crate::opencode::{ErrorInfo, PermissionAsk};

pub use super::live::{AskSeen, Live};

/// What a move to [`Phase::Finished`] claims the turn from ([`TaskEntry::finish`]): every end
/// of a turn names the phase and turn it holds, so two deciders (an idle event and an abort,
/// say) cannot both end one turn, and nothing ends a turn it does not hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// The open turn's verdict is in (from the stream, or a completion check).
    Open(u32),
    /// The check of a structured answer, which holds the turn.
    Checked(u32),
    /// An abort, which holds the turn.
    Aborted(u32),
    /// The queue, which holds a task not started yet.
    Queued,
    /// A start under way (its worktree, session and prompt on their way in the background),
    /// which holds the task until its first turn opens.
    Starting,
    /// The turn is gone whoever holds it: its session was deleted, its server died, or the
    /// gateway that ran it exited.
    Gone(u32),
}

impl Claim {
    /// The statuses a turn held by this claim may end in: a verdict completes or fails a turn
    /// (and times out one its supervisor aborted at its deadline while no gateway ran: see
    /// `abort::timed_out_unwatched`); a check completes or fails it; an abort cancels it, times
    /// it out or fails it (a cap, `stop_server`); the queue cancels or fails a task that never
    /// started; a turn that is gone fails, or is cancelled.
    pub fn may_end_in(self, status: TaskStatus) -> bool {
        use TaskStatus::*;
        match self {
            Claim::Open(_) => matches!(status, Completed | Failed | TimedOut),
            Claim::Checked(_) => matches!(status, Completed | Failed),
            Claim::Aborted(_) => matches!(status, Cancelled | TimedOut | Failed),
            Claim::Queued | Claim::Starting => matches!(status, Cancelled | Failed),
            Claim::Gone(_) => matches!(status, Failed | Cancelled),
        }
    }
}

/// One tracked task: its durable record and its live progress.
#[derive(Debug, Clone)]
pub struct TaskEntry {
    pub rec: TaskRecord,
    pub live: Live,
}

impl TaskEntry {
    /// A task made by this gateway, before its first turn is opened.
    pub fn new(rec: TaskRecord) -> Self {
        Self {
            rec,
            live: Live::new(Instant::now()),
        }
    }

    /// A task queued for a slot (`limits.queue`), its start request kept in its record.
    pub fn queued(mut rec: TaskRecord) -> Self {
        rec.set_phase(Phase::Queued, TaskStatus::Queued);
        Self::new(rec)
    }

    /// A task recorded and answered at once, whose start (its worktree, its session, its
    /// prompt) runs in the background; its start request is kept in its record, so a gateway
    /// that takes it over can start it again (see [`Self::adopt`]).
    pub fn starting(mut rec: TaskRecord) -> Self {
        rec.set_phase(Phase::Starting, TaskStatus::Pending);
        Self::new(rec)
    }

    /// A task read back from the store, in the phase it was saved in (a view of another live
    /// gateway's task shows where that gateway has it). Not yet used by anyone: a finished one
    /// is as old as its finish (a call that reads it back marks it used).
    pub fn from_record(rec: TaskRecord) -> Self {
        let mut live = Live::new(TaskRecord::instant_at(rec.turn_started_ms));
        live.finished_at = rec.finished_ms.map(TaskRecord::instant_at);
        if let Some(finished) = live.finished_at {
            live.last_used = finished;
        }
        if !rec.status().is_terminal() {
            // What the stream showed of the turn went with the gateway that saw it: its answer
            // and its spend so far are read over HTTP.
            live.streamed.mark_gap();
        }
        // A pending ask read back is as old as the restore: a permission list read after it that
        // no longer has the ask (answered while the gateway was down) clears it. Without a time
        // the sweep never did, and the task showed `waiting_permission` for good.
        for ask in &rec.permissions {
            live.asks.insert(ask.id.clone(), AskSeen::now());
        }
        // What a record read back had spent is in the day's ledger already (written while it
        // ran, or at the restore for records from before the ledger): only what it spends from
        // now on is new. A task of yesterday read back today (for an apply, say) must not count
        // toward today.
        let mut entry = Self { rec, live };
        let read = entry.rec.outcome_cost();
        entry.live.spending.ledgered_already(read);
        entry
    }

    /// This gateway takes over a task whose gateway is gone. A hold or an abort under way died
    /// with that gateway: the turn is open again, and is claimed again by whoever decides it
    /// now (a held answer is held again by the next completion check, whose record still says
    /// what was being checked). A start under way from the queue goes back to the queue (its
    /// request is still in the record).
    pub fn adopt(&mut self) {
        match self.rec.phase() {
            Phase::HeldSchema | Phase::HeldChecks | Phase::HeldOutage => {
                self.rec.set_phase(Phase::Open, TaskStatus::Running)
            }
            Phase::Aborting => {
                let status = self.rec.status();
                self.rec.set_phase(Phase::Open, status)
            }
            Phase::Starting if self.rec.queued.is_some() => {
                self.rec.set_phase(Phase::Queued, TaskStatus::Queued)
            }
            Phase::Queued | Phase::Starting | Phase::Open | Phase::Finished => {}
        }
    }

    /// Opens a new turn, from a task being started or a finished turn (a host's follow-up):
    /// the record's and the progress of the previous one are cleared, and the caps start over.
    pub fn begin_turn(
        &mut self,
        user_message_id: String,
        agent: Option<String>,
        model: Option<String>,
    ) -> Result<(), Refused> {
        self.refuse_unless(
            matches!(self.rec.phase(), Phase::Starting | Phase::Finished),
            "begin_turn",
        )?;
        self.open(user_message_id, agent, model, (0.0, 0));
        Ok(())
    }

    fn open(
        &mut self,
        user_message_id: String,
        agent: Option<String>,
        model: Option<String>,
        rounds_before: (f64, u64),
    ) {
        self.rec
            .begin_turn(user_message_id, agent, model, rounds_before);
        self.stop_deadline();
        self.live = Live::new(Instant::now());
    }

    fn refuse_unless(&self, allowed: bool, transition: &'static str) -> Result<(), Refused> {
        if allowed {
            return Ok(());
        }
        Err(Refused {
            from: self.rec.phase(),
            transition,
        })
    }

    /// Opens the next round of the same host turn (a structured answer's correction, a checks'
    /// fix round), from turn `turn` held: a new turn, whose caps count what the earlier rounds
    /// spent.
    pub fn begin_correction(
        &mut self,
        turn: u32,
        user_message_id: String,
        agent: Option<String>,
        model: Option<String>,
    ) -> Result<(), Refused> {
        self.refuse_unless(self.is_checking(turn), "begin_correction")?;
        // The checked answer is done with, and its turn joins the round's earlier turns (whose
        // changed files the round reports).
        if let Some(s) = self.rec.structured.as_mut() {
            s.checking = None;
            s.corrected_messages.push(self.rec.user_message_id.clone());
        }
        if let Some(c) = self.rec.checks.as_mut() {
            c.checking = None;
            c.fixed_messages.push(self.rec.user_message_id.clone());
        }
        let before = self.budget_spend();
        self.open(user_message_id, agent, model, before);
        Ok(())
    }

    /// What the host's turn has spent against its caps: this round and the earlier ones.
    pub fn budget_spend(&self) -> (f64, u64) {
        self.rec.spend.for_caps(&self.live.spending)
    }

    /// Why no further round of this host turn may be sent (a structured answer's correction, a
    /// checks' fix round): its caps are reached, and a round would be stopped at its first step.
    pub fn caps_reached(&self) -> Option<String> {
        let (usd, tokens) = self.budget_spend();
        crate::tasks::spend::caps::reached(self.rec.budget.as_ref()?, usd, tokens)
    }

    /// Ends the current turn's deadline timer, if one is armed.
    pub fn stop_deadline(&mut self) {
        if let Some(timer) = self.live.deadline.take() {
            timer.cancel();
        }
    }

    /// Where the task stands.
    pub fn phase(&self) -> Phase {
        self.rec.phase()
    }

    /// The turn runs in OpenCode, and only its events and completion checks decide it.
    pub fn is_open(&self) -> bool {
        self.phase() == Phase::Open
    }

    /// The turn is over and nothing acts on it any more: it may be continued, applied or
    /// discarded.
    pub fn is_settled(&self) -> bool {
        self.phase() == Phase::Finished
    }

    /// Claims queued task for its start: from queued only, so a cancel that came first wins
    /// and a task is never started twice. Run under the registry's lock, like every move.
    pub fn claim_start(&mut self) -> Result<(), Refused> {
        self.refuse_unless(self.phase() == Phase::Queued, "claim_start")?;
        self.rec.set_phase(Phase::Starting, TaskStatus::Pending);
        Ok(())
    }

    /// A start claimed from the queue could not reach its worker, which dropped off only
    /// briefly: the task waits in the queue again (its request is still in its record).
    pub fn back_to_queue(&mut self) -> Result<(), Refused> {
        self.refuse_unless(
            self.phase() == Phase::Starting && self.rec.queued.is_some(),
            "back_to_queue",
        )?;
        self.rec.set_phase(Phase::Queued, TaskStatus::Queued);
        Ok(())
    }

    /// Claims turn `turn` for an abort, from open or held; `false` when the task is on
    /// another turn, finished, or already being aborted (a second abort is a no-op).
    pub fn claim_abort(&mut self, turn: u32) -> bool {
        let phase = self.phase();
        let claimable = phase == Phase::Open || phase.is_held();
        if !claimable || self.rec.turn != turn {
            return false;
        }
        let status = self.rec.status();
        self.rec.set_phase(Phase::Aborting, status);
        true
    }

    /// Turn `turn` is claimed by an abort.
    pub fn is_aborting(&self, turn: u32) -> bool {
        self.rec.turn == turn && self.phase() == Phase::Aborting
    }

    /// OpenCode refused the abort of turn `turn`: it runs on, open (a check that held it gave
    /// up when the abort claimed the turn; the next completion check holds it again).
    pub fn abort_refused(&mut self, turn: u32) {
        if self.is_aborting(turn) {
            let status = self.rec.status();
            self.rec.set_phase(Phase::Open, status);
        }
    }

    /// Holds the open turn for the gateway's own verdict (`what`: its structured answer, its
    /// checks, or another model after a provider failure, with `outage` the failure); `false`
    /// when it is not open (a hold already runs, an abort claimed it, or it is over). The task
    /// reads as running meanwhile (an ask pending at the turn's end no longer holds it).
    ///
    /// The turn's deadline ends here: `timeouts.task` bounds an agent's turn, and this one ended
    /// within it. What bounds the hold is each check's own `timeouts.check`; a correction round
    /// or another model's turn gets a deadline of its own. A gateway that adopts a held task
    /// after a restart arms none for it either, and a worker's OpenCode left lingering keeps
    /// running for it as long as for any task: one rule wherever the task is held.
    pub fn hold(&mut self, what: Held, outage: Option<ErrorInfo>) -> bool {
        if !self.is_open() {
            return false;
        }
        match what {
            Held::Outage => self.rec.hold_outage(outage),
            _ => self.rec.set_phase(what.into(), TaskStatus::Running),
        }
        self.stop_deadline();
        true
    }

    /// The hold of turn `turn` moves on to `what` (a structured answer that passed its
    /// schema goes on to the checks); `false` when the turn is no longer held.
    pub fn hold_next(&mut self, turn: u32, what: Held) -> bool {
        if !self.is_checking(turn) || what == Held::Outage {
            return false;
        }
        self.rec.set_phase(what.into(), TaskStatus::Running);
        true
    }

    /// Turn `turn` is held (not aborted, finished or followed by another turn).
    pub fn is_checking(&self, turn: u32) -> bool {
        self.rec.turn == turn && self.phase().is_held()
    }

    /// The hold of turn `turn` ended without finishing it or opening a correction (an abort
    /// claimed the turn meanwhile and was refused): the turn is open again, so the next
    /// completion check holds it again.
    pub fn release_hold(&mut self, turn: u32) {
        if self.is_checking(turn) {
            self.rec.set_phase(Phase::Open, TaskStatus::Running);
        }
    }

    /// A permission ask of the task (or of one of its subagents) is pending: the task waits for
    /// it, beside any other ask still pending (two subagents may ask at once; each is answered
    /// by its own id). A turn that is not open (over, held or aborted), or an ask it
    /// already holds, is left as it is.
    pub fn ask_permission(&mut self, ask: PermissionAsk) {
        if !self.is_open() || self.rec.permissions.iter().any(|p| p.id == ask.id) {
            return;
        }
        self.rec.set_open_status(TaskStatus::WaitingPermission);
        self.live.asks.insert(ask.id.clone(), AskSeen::now());
        self.rec.permissions.push(ask);
    }

    /// The ask `request_id` was answered: it is no longer pending, and once no ask is, the task
    /// runs again.
    pub fn permission_answered(&mut self, request_id: &str) {
        self.rec.permissions.retain(|p| p.id != request_id);
        self.live.asks.remove(request_id);
        if self.rec.permissions.is_empty() && self.rec.status() == TaskStatus::WaitingPermission {
            self.rec.set_open_status(TaskStatus::Running);
        }
    }

    /// Ends the turn with a terminal status, if `claim` holds it and may end in `status`: the
    /// one move to [`Phase::Finished`], and the one place a terminal status is written.
    /// Returns whether it ended the turn; a claim that does not hold (another decider ended or
    /// claimed the turn first, or a later turn began) changes nothing.
    pub fn finish(&mut self, claim: Claim, status: TaskStatus, error: Option<ErrorInfo>) -> bool {
        let phase = self.phase();
        let held = match claim {
            Claim::Open(turn) => phase == Phase::Open && self.rec.turn == turn,
            Claim::Checked(turn) => self.is_checking(turn),
            Claim::Aborted(turn) => self.is_aborting(turn),
            Claim::Queued => phase == Phase::Queued,
            Claim::Starting => phase == Phase::Starting,
            Claim::Gone(turn) => phase != Phase::Finished && self.rec.turn == turn,
        };
        if !held || !claim.may_end_in(status) {
            return false;
        }
        self.rec.finish(status, error);
        self.live.asks.clear();
        self.live.current_tool = None;
        self.live.retry = None;
        // The answer is in the record now (or is read over HTTP): the streamed copy goes.
        self.live.streamed = StreamedTurn::default();
        self.stop_deadline();
        self.live.finished_at = Some(Instant::now());
        true
    }

    /// The turn's first sign of work (the session busy or retrying, a reply): `pending` becomes
    /// `running`. Returns whether it did.
    pub fn started(&mut self) -> bool {
        let moved = self.is_open() && self.rec.status() == TaskStatus::Pending;
        if moved {
            self.rec.set_open_status(TaskStatus::Running);
        }
        moved
    }

    /// From sending the turn to its end (or to now).
    pub fn duration(&self) -> Duration {
        self.live
            .finished_at
            .unwrap_or_else(Instant::now)
            .saturating_duration_since(self.live.turn_started)
    }

    /// The agent that answered (from the outcome, else the events), else the one asked for.
    pub fn agent(&self) -> Option<String> {
        let r = &self.rec;
        r.outcome
            .as_ref()
            .and_then(|o| o.agent.clone())
            .or_else(|| {
                self.live
                    .latest_reply
                    .as_ref()
                    .and_then(|s| s.agent.clone())
            })
            .or_else(|| r.agent.clone())
    }

    /// The model that answered, as the outcome (else the event stream) reports it.
    fn answered_model(&self) -> Option<String> {
        self.rec
            .outcome
            .as_ref()
            .and_then(|o| o.model.clone())
            .or_else(|| {
                self.live
                    .latest_reply
                    .as_ref()
                    .and_then(|s| s.model.clone())
            })
    }

    /// The model that answered, else the one asked for.
    pub fn model(&self) -> Option<String> {
        self.answered_model().or_else(|| self.rec.model.clone())
    }

    /// The model the turn asked for, if another one answered.
    pub fn model_requested(&self) -> Option<String> {
        self.rec
            .model_requested_if_other(self.answered_model().as_deref())
    }

    /// The snapshot status and wait report.
    pub fn snapshot(&self, include_progress: bool, stall: Duration) -> TaskSnapshot {
        let r = &self.rec;
        let progress = include_progress.then(|| {
            let since_event = self.live.last_event.elapsed();
            let tokens = r.outcome.as_ref().map(|o| o.tokens).unwrap_or_default();
            Progress {
                current_tool: self.live.current_tool.as_ref().map(|(t, _)| t.clone()),
                current_tool_title: self.live.current_tool.as_ref().and_then(|(_, t)| t.clone()),
                text_tail: self.live.text_tail.clone(),
                steps: self.live.steps,
                tools_run: self.live.tools_run,
                tokens,
                last_event_ms_ago: since_event.as_millis() as u64,
                // A task waiting for a person's answer is quiet by design, not stalled.
                stalled: !r.status().is_terminal()
                    && r.status() != TaskStatus::WaitingPermission
                    && since_event > stall,
                retry: self.live.retry.clone(),
                spent_usd: r.budget.map(|_| self.budget_spend().0),
                spent_tokens: r.budget.map(|_| self.budget_spend().1),
                budget: r.budget,
            }
        });
        // A structured task's value and errors are the finished round's only.
        let structured = r.structured.as_ref().filter(|_| r.status().is_terminal());
        TaskSnapshot {
            queue_position: None,
            task_id: r.id.clone(),
            status: r.status(),
            phase: r.phase().shown().map(str::to_string),
            title: r.title.clone(),
            elapsed_ms: self.duration().as_millis() as u64,
            error: r.error.clone(),
            permissions: r.permissions.clone(),
            progress,
            text: None,
            next_offset: None,
            files_changed: None,
            workspace: r.workspace.as_ref().map(Workspace::from_record),
            structured: structured.and_then(|s| s.value.clone()),
            structured_error: structured.and_then(|s| s.error.clone()),
            structured_attempts: structured
                .filter(|s| !s.attempts.is_empty())
                .map(|s| s.attempts.clone()),
            checks: r
                .checks
                .as_ref()
                .map(|c| c.view(r.status().is_terminal(), r.turn).brief()),
            escalations: r.escalations.clone(),
            confined: r.confinement.as_ref().map(|c| c.is_confined()),
            unconfined: r
                .confinement
                .as_ref()
                .and_then(|c| c.why_not().map(str::to_string)),
            server_id: Some(r.server_id.clone()),
            session_id: Some(r.session_id.clone()),
            directory: Some(r.directory.clone()),
            agent: self.agent(),
            model: self.model(),
            model_requested: self.model_requested(),
            variant: r.variant.clone(),
            turn: Some(r.turn),
            group_id: r.group.as_ref().map(|g| g.id.clone()),
            tokens: r
                .outcome
                .as_ref()
                .filter(|_| r.status().is_terminal())
                .map(|o| o.tokens),
            cost: r
                .outcome
                .as_ref()
                .filter(|_| r.status().is_terminal())
                .map(|o| o.cost),
            turn_started_ms: r.turn_started_ms,
            updated_ms: r.finished_ms.unwrap_or_else(|| {
                let now = super::super::model::epoch_ms(std::time::SystemTime::now());
                let since = u64::try_from(self.live.last_event.elapsed().as_millis()).unwrap_or(0);
                now.saturating_sub(since).max(r.turn_started_ms)
            }),
        }
    }

    /// Appends streamed text to the progress tail, keeping the last `max` characters.
    pub fn push_text(&mut self, text: &str, max: usize) {
        let tail = &mut self.live.text_tail;
        tail.push_str(text);
        let count = tail.chars().count();
        if count > max {
            let cut = tail
                .char_indices()
                .nth(count - max)
                .map(|(i, _)| i)
                .unwrap_or(0);
            tail.drain(..cut);
        }
    }
}

/// What a waiter can observe (a change wakes them).
pub(in crate::tasks) fn observable(e: &TaskEntry) -> impl PartialEq {
    (
        e.rec.status(),
        e.rec.turn,
        e.rec
            .permissions
            .iter()
            .map(|p| p.id.clone())
            .collect::<Vec<_>>(),
        e.rec.phase(),
        // The turn's first reply (an abort waits for it: see `abort.rs`).
        e.live.latest_reply.is_some(),
    )
}

/// For unit tests: task `id` on server `srv`, session `session`, directory `/w`, in its first
/// turn (user message `msg_1`).
#[cfg(test)]
impl TaskEntry {
    pub(crate) fn in_first_turn(id: &str, session: &str) -> Self {
        let mut e = TaskEntry::new(TaskRecord::new(
            id.into(),
            "srv".into(),
            session.into(),
            "/w".into(),
            "t".into(),
        ));
        e.begin_turn("msg_1".into(), None, None)
            .expect("a new task opens its first turn");
        e
    }

    /// Task `id` in the queue, its saved start request `request`.
    pub(crate) fn queued_for_test(id: &str, request: Option<serde_json::Value>) -> Self {
        let mut rec = TaskRecord::new(
            id.into(),
            String::new(),
            String::new(),
            "/w".into(),
            "t".into(),
        );
        rec.queued = request;
        TaskEntry::queued(rec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queued(id: &str) -> TaskEntry {
        TaskEntry::queued_for_test(id, Some(serde_json::json!({ "prompt": "x" })))
    }

    /// The queue's race, forced both ways: the drainer read the task as queued, then a cancel
    /// and the drainer's claim land in either order. Whichever comes first wins, never both: a
    /// cancelled task is never started, and a starting one is not reported cancelled.
    #[test]
    fn a_cancel_and_the_queues_claim_never_both_win() {
        let mut cancelled_first = queued("a");
        assert_eq!(cancelled_first.rec.status(), TaskStatus::Queued);
        assert!(cancelled_first.finish(Claim::Queued, TaskStatus::Cancelled, None));
        let refused = cancelled_first
            .claim_start()
            .expect_err("a cancelled task never starts");
        assert_eq!(refused.from, Phase::Finished);
        assert_eq!(cancelled_first.rec.status(), TaskStatus::Cancelled);

        let mut claimed_first = queued("b");
        claimed_first
            .claim_start()
            .expect("a queued task is claimed");
        assert!(!claimed_first.finish(Claim::Queued, TaskStatus::Cancelled, None));
        assert!(claimed_first.claim_start().is_err(), "started once");
        assert_eq!(
            (claimed_first.rec.status(), claimed_first.phase()),
            (TaskStatus::Pending, Phase::Starting),
            "a starting task reads as pending"
        );
    }

    /// `timeouts.task` bounds an agent's turn, not the gateway's check of its answer: holding a
    /// turn ends its deadline timer, as a gateway adopting a held task arms none and a worker's
    /// lingering OpenCode gives it the whole grace period. Before, a running gateway aborted a
    /// turn as timed out while its checks ran, throwing away an answer given in time.
    #[test]
    fn holding_a_turn_ends_its_deadline() {
        for what in [Held::Checks, Held::Schema, Held::Outage] {
            let mut e = TaskEntry::in_first_turn("a", "ses_a");
            let timer = tokio_util::sync::CancellationToken::new();
            e.live.deadline = Some(timer.clone());
            assert!(e.hold(what, None), "{what:?}: an open turn is held");
            assert!(
                timer.is_cancelled(),
                "{what:?}: the deadline timer is stopped"
            );
            assert!(e.live.deadline.is_none(), "{what:?}");
        }
        let mut over = TaskEntry::in_first_turn("b", "ses_b");
        assert!(over.claim_abort(1));
        let timer = tokio_util::sync::CancellationToken::new();
        over.live.deadline = Some(timer.clone());
        assert!(
            !over.hold(Held::Checks, None),
            "an aborting turn is not held"
        );
        assert!(!timer.is_cancelled(), "nor is its deadline touched");
    }

    /// Each claim ends a turn only in the statuses it may: a verdict completes, fails or (an
    /// abort at the deadline with no gateway) times out, a check completes or fails, an abort
    /// cancels, times out or fails, the queue cancels or fails.
    #[test]
    fn each_claim_ends_only_in_its_own_statuses() {
        let mut e = TaskEntry::in_first_turn("a", "ses_a");
        assert!(!e.finish(Claim::Open(1), TaskStatus::Cancelled, None));
        assert!(Claim::Open(1).may_end_in(TaskStatus::TimedOut));
        assert!(!Claim::Checked(1).may_end_in(TaskStatus::TimedOut));
        assert!(!Claim::Open(1).may_end_in(TaskStatus::Queued));
        assert!(
            !e.finish(Claim::Queued, TaskStatus::Failed, None),
            "not queued"
        );
        assert!(e.claim_abort(1));
        assert!(!e.finish(Claim::Aborted(1), TaskStatus::Completed, None));
        assert!(e.finish(Claim::Aborted(1), TaskStatus::TimedOut, None));
        assert_eq!(e.phase(), Phase::Finished);
    }

    /// The phase is saved with the record, and read back as it was, holds included (a view of
    /// another gateway's task shows it); a record from before phases were saved gets its phase
    /// from its status and the checks it was running.
    #[test]
    fn the_phase_is_saved_and_older_records_get_one() {
        let mut e = TaskEntry::in_first_turn("a", "ses_a");
        e.rec.checks = Some(super::super::record::ChecksState::new(vec!["true".into()]));
        assert!(e.hold(Held::Checks, None));
        e.rec.checks.as_mut().expect("checks").checking = Some(1);
        let saved = serde_json::to_value(&e.rec).expect("serialises");
        assert_eq!(saved["phase"], "held_checks");
        assert_eq!(saved["status"], "running");
        let back: TaskRecord = serde_json::from_value(saved.clone()).expect("reads back");
        assert_eq!(back.phase(), Phase::HeldChecks);

        let mut older = saved;
        older.as_object_mut().expect("object").remove("phase");
        let back: TaskRecord = serde_json::from_value(older).expect("reads back");
        assert_eq!(back.phase(), Phase::HeldChecks);

        let outage = ErrorInfo {
            provider_status: Some(503),
            retryable: Some(true),
            name: "APIError".into(),
            message: "overloaded".into(),
        };
        let mut moving = TaskEntry::in_first_turn("b", "ses_b");
        assert!(moving.hold(Held::Outage, Some(outage.clone())));
        let back: TaskRecord =
            serde_json::from_value(serde_json::to_value(&moving.rec).expect("json")).expect("back");
        assert_eq!(
            back.outage(),
            Some(&outage),
            "what is held is saved with the hold"
        );
        moving.release_hold(1);
        assert_eq!(moving.rec.outage(), None, "and goes with it");
    }
}

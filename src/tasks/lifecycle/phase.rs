//! The state word: where a task stands, saved in its record, and the status hosts read derived
//! from it.
//!
//! ```text
//!            claim_start           begin_turn            hold(kind)            finish
//!   Queued ──────────────▶ Starting ──────────▶ Open ──────────────▶ Held ──────────▶ Finished
//!     │                                         ▲  │ ◀── release_hold ──┘ │              │
//!     │ finish(Queued)                           │  │ claim_abort          │ claim_abort  │
//!     ▼                                         │  ▼                      ▼              │
//!   Finished                      abort_refused └─ Aborting ──── finish ──▶ Finished     │
//!                                                                                        │
//!   Finished ──────────────────── begin_turn (a follow-up) ──────────────────────────────┘
//! ```
//!
//! A held turn's answer is in, and the gateway is deciding on it before any waiter sees it: a
//! structured answer checked against its schema, the task's checks, or a provider failure on its
//! way to another model. Held and aborting tasks read as `running`; a starting one as
//! `pending`.

use serde::{Deserialize, Serialize};

use super::super::model::TaskStatus;

/// Where a task stands. It changes only through the transitions on
/// [`TaskEntry`](super::entry::TaskEntry), each of which names the phases it moves from, so two
/// deciders (an idle event and an abort, say) can never both end one turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Waiting in the queue for a slot (`limits.queue`): no session, no server yet.
    Queued,
    /// Being started: its worktree, session and first prompt are on their way.
    Starting,
    /// The turn runs in OpenCode (`pending`, `running` or `waiting_permission`): its events
    /// and completion checks decide it.
    Open,
    /// The turn's structured answer is being checked against its schema.
    HeldSchema,
    /// The task's checks run on the turn's work.
    HeldChecks,
    /// The turn failed at its provider, and the task is on its way to another model.
    HeldOutage,
    /// A cancel, the deadline, a cap or `stop_server` claimed the turn and is aborting it.
    Aborting,
    /// The turn is over: the status is terminal.
    Finished,
}

/// What a turn is held for (see [`Phase`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    Schema,
    Checks,
    Outage,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Queued => "queued",
            Phase::Starting => "starting",
            Phase::Open => "open",
            Phase::HeldSchema => "held_schema",
            Phase::HeldChecks => "held_checks",
            Phase::HeldOutage => "held_outage",
            Phase::Aborting => "aborting",
            Phase::Finished => "finished",
        }
    }

    /// What status, result and the task list show beside the status: the phases the status
    /// alone does not tell (a starting task reads `pending`, a held or aborting one `running`).
    pub fn shown(self) -> Option<&'static str> {
        match self {
            Phase::Starting
            | Phase::HeldSchema
            | Phase::HeldChecks
            | Phase::HeldOutage
            | Phase::Aborting => Some(self.as_str()),
            Phase::Queued | Phase::Open | Phase::Finished => None,
        }
    }

    /// The turn is held for the gateway's own verdict.
    pub fn is_held(self) -> bool {
        self.held().is_some()
    }

    pub fn held(self) -> Option<Held> {
        match self {
            Phase::HeldSchema => Some(Held::Schema),
            Phase::HeldChecks => Some(Held::Checks),
            Phase::HeldOutage => Some(Held::Outage),
            _ => None,
        }
    }

    /// The status every task in this phase reads as; `None` for the phases whose status says
    /// more than the phase (an open or aborting turn: pending, running or waiting for a
    /// permission; a finished one: how it ended).
    pub(super) fn fixed_status(self) -> Option<TaskStatus> {
        match self {
            Phase::Queued => Some(TaskStatus::Queued),
            Phase::Starting => Some(TaskStatus::Pending),
            Phase::HeldSchema | Phase::HeldChecks | Phase::HeldOutage => Some(TaskStatus::Running),
            Phase::Open | Phase::Aborting | Phase::Finished => None,
        }
    }

    /// The phase of a record written before phases were saved: from its status, and from
    /// whether a check of its answer was under way.
    pub(super) fn of_older_record(status: TaskStatus, schema: bool, checks: bool) -> Phase {
        match status {
            TaskStatus::Queued => Phase::Queued,
            s if s.is_terminal() => Phase::Finished,
            _ if schema => Phase::HeldSchema,
            _ if checks => Phase::HeldChecks,
            _ => Phase::Open,
        }
    }
}

impl From<Held> for Phase {
    fn from(h: Held) -> Phase {
        match h {
            Held::Schema => Phase::HeldSchema,
            Held::Checks => Phase::HeldChecks,
            Held::Outage => Phase::HeldOutage,
        }
    }
}

/// A transition asked of a task in a phase it does not move from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the task is {from:?}, and `{transition}` does not move from there")]
pub struct Refused {
    pub from: Phase,
    pub transition: &'static str,
}

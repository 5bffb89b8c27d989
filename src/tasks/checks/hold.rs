//! A completed turn held for the gateway's own verdict before any waiter sees it: a structured
//! answer checked against its schema (`structured`), then the task's checks (`checks`). While
//! held, the task is reported `running` (the phases `held_schema`, `held_checks`, `held_outage`); `structured.checking`
//! and `checks.checking` are the phase's durable twins, so a restarted gateway reads the turn
//! again and holds it again.

use std::sync::Arc;

use super::commands as checks;
use super::{escalation, structured};
use crate::config::Config;
use crate::opencode::{ErrorInfo, Server};
use crate::tasks::context::TaskContext;
use crate::tasks::lifecycle::entry::TaskEntry;
use crate::tasks::lifecycle::phase::{Held, Phase};
use crate::tasks::model::TaskStatus;
use crate::tasks::turn::outcome;

/// What [`hold`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// Nothing to check: finish the turn as usual.
    No,
    /// Held now: run [`settle`] for this turn.
    Held(u32),
    /// A check of this turn already runs.
    Already,
}

/// Called by the tracker and the completion checks, under the registry lock, with a turn's
/// verdict: a `completed` turn of a task with an `output_schema` or with checks, or a `failed`
/// one whose provider error may clear on another model (`escalation`), is held instead of
/// finished, and the caller runs [`settle`]. A turn already held is not held twice.
pub fn hold(
    e: &mut TaskEntry,
    status: TaskStatus,
    error: Option<&ErrorInfo>,
    config: &Config,
) -> Hold {
    let turn = e.rec.turn;
    let verify =
        status == TaskStatus::Completed && (e.rec.structured.is_some() || checks::wants_checks(e));
    let outage = status == TaskStatus::Failed && escalation::wants_move(config, &e.rec, error);
    if !verify && !outage {
        return Hold::No;
    }
    let what = if outage {
        Held::Outage
    } else if e.rec.structured.is_some() {
        Held::Schema
    } else {
        Held::Checks
    };
    if !e.hold(what, outage.then(|| error.cloned()).flatten()) {
        return Hold::Already;
    }
    if outage {
        return Hold::Held(turn);
    }
    if let Some(s) = e.rec.structured.as_mut() {
        s.checking = Some(turn);
    }
    if let Some(c) = e.rec.checks.as_mut() {
        c.checking = Some(turn);
    }
    Hold::Held(turn)
}

/// Settles the held turn `turn`: its structured answer first, then its checks; either may end
/// the task or open another round. A settle that did neither (an abort claimed the task
/// meanwhile, then failed, so it runs on) lets the turn be held again: otherwise every later
/// completion check would find it `Already` held and the task would sit `running` until its
/// deadline.
pub async fn settle(ctx: &TaskContext, server: &Arc<Server>, task_id: &str, turn: u32) {
    let (outage, structured) = match ctx.registry.get(task_id) {
        Some(e) => (e.phase() == Phase::HeldOutage, e.rec.structured.is_some()),
        None => return,
    };
    if outage {
        escalation::settle_outage(ctx, server, task_id, turn).await;
    } else if !structured || structured::check_held(ctx, server, task_id, turn).await {
        // The answer passed its schema (or there is none): the hold moves on to the checks.
        ctx.registry
            .update(task_id, |e| e.hold_next(turn, Held::Checks));
        checks::settle(ctx, server, task_id, turn).await;
    }
    ctx.registry.update(task_id, |e| e.release_hold(turn));
    // The task ended at this turn: what follows any turn's end (its files, a remote task's
    // work brought back), as for a turn that was never held.
    if ctx
        .registry
        .get(task_id)
        .is_some_and(|e| e.rec.turn == turn && e.rec.status().is_terminal())
    {
        outcome::after_turn(ctx, server, task_id, turn, outcome::Attempts::Patient).await;
    }
}

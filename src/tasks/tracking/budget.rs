//! Budgets enforced on a running turn: what each step costs is noted from the event stream
//! ([`note_spending`]), or read over HTTP after a gap ([`reconcile_spend`]), and a turn past one
//! of its caps is stopped ([`stop_over_budget`]): it ends `failed` (`BudgetExceeded`), its
//! partial answer and changed files kept. The caps themselves, and the day's cap, are
//! `spend/caps.rs`'s.

use std::sync::Arc;

use crate::opencode::events::Event;
use crate::opencode::{ErrorInfo, Server};
use crate::tasks::context::TaskContext;
use crate::tasks::lifecycle::turn::ReplySeen;
use crate::tasks::model::TaskStatus;
use crate::tasks::turn::outcome::{after_turn, Attempts};

/// Counts what an open turn spent from its messages read over HTTP, when its streamed view has
/// a gap (a reconnect, a dropped event, a restart): the stream's `message.updated` of a step
/// finished meanwhile never comes, and a turn could otherwise spend up to its cap again after
/// each gap. Its own session's messages of the turn, and its subagents' (their child sessions
/// are listed by OpenCode, also one whose `session.created` was missed: it is adopted, so its
/// later events count too). A cap passed is acted on as from the stream.
pub(in crate::tasks) async fn reconcile_spend(
    ctx: &TaskContext,
    server: &Arc<Server>,
    task_id: &str,
) {
    let Some(e) = ctx.registry.get(task_id) else {
        return;
    };
    if !e.is_open() || !e.live.streamed.has_gap() {
        return;
    }
    let (dir, session, since, turn) = (
        e.rec.directory.clone(),
        e.rec.session_id.clone(),
        e.rec.user_message_id.clone(),
        e.rec.turn,
    );
    let mut seen = Vec::new();
    match server.api.turn_messages(&dir, &session, &since).await {
        Ok(messages) => seen.extend(messages),
        Err(e) => {
            tracing::debug!(task_id, error = %e, "reconcile: reading the turn's messages failed");
            return;
        }
    }
    match server.api.children(&dir, &session).await {
        Ok(children) => {
            for child in children {
                ctx.registry.adopt_child(&session, &child);
                if let Ok(messages) = server.api.turn_messages(&dir, &child, &since).await {
                    seen.extend(messages);
                }
            }
        }
        Err(e) => {
            tracing::debug!(task_id, error = %e, "reconcile: listing subagent sessions failed")
        }
    }
    let then = ctx.registry.update(task_id, |e| {
        if e.rec.turn != turn || !e.is_open() {
            return None;
        }
        // Message ids sort by time across sessions: what is newer than our prompt is the turn's.
        for m in seen
            .iter()
            .filter(|m| m.role == crate::opencode::Role::Assistant && m.id > since)
        {
            e.live.spending.note(&m.id, m.cost, &m.tokens);
        }
        over_budget(e)
    });
    if let Some(Some(OverBudget { turn, why })) = then {
        stop_over_budget(ctx, server, task_id, turn, why).await;
    }
}

/// Notes what an assistant message of the turn (the task's own, or a subagent's) reports it
/// has spent so far.
pub(in crate::tasks) fn note_spending(
    e: &mut crate::tasks::lifecycle::entry::TaskEntry,
    event: &Event,
    child: bool,
) {
    if let Event::MessageUpdated {
        message_id,
        role,
        cost,
        tokens,
        ..
    } = event
    {
        let ours = child || ReplySeen::in_turn(message_id, &e.rec.user_message_id);
        if role == "assistant" && ours {
            e.live.spending.note(message_id, *cost, tokens);
        }
    }
}

/// A turn that passed one of its task's caps (`why` says which, by how much).
#[derive(Debug)]
pub(in crate::tasks) struct OverBudget {
    pub turn: u32,
    pub why: String,
}

/// The open turn has spent past one of its task's caps.
pub(in crate::tasks) fn over_budget(
    e: &crate::tasks::lifecycle::entry::TaskEntry,
) -> Option<OverBudget> {
    let budget = e.rec.budget.as_ref().filter(|_| e.is_open())?;
    let (cost, tokens) = e.budget_spend();
    let why = budget.passed_by(cost, tokens)?;
    Some(OverBudget {
        turn: e.rec.turn,
        why,
    })
}

/// Aborts a turn that passed a spending cap: the task ends `failed` (`BudgetExceeded`), and its
/// partial answer and changed files are read as after any abort.
pub(in crate::tasks) async fn stop_over_budget(
    ctx: &TaskContext,
    server: &Arc<Server>,
    task_id: &str,
    turn: u32,
    why: String,
) {
    tracing::info!(task_id, %why, "the turn passed its budget; aborting it");
    let error = ErrorInfo {
        provider_status: None,
        retryable: None,
        name: "BudgetExceeded".into(),
        message: format!(
            "the turn was stopped because {why}; its partial answer and changed files are kept"
        ),
    };
    let stopped = super::abort::abort_turn(
        ctx,
        server,
        task_id,
        Some(turn),
        TaskStatus::Failed,
        Some(error),
        super::abort::IfAbortFails::FinishAnyway,
    )
    .await;
    if let Ok(Some(turn)) = stopped {
        after_turn(ctx, server, task_id, turn, Attempts::Patient).await;
    }
}

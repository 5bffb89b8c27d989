//! The tracker: one per OpenCode server, it turns the server's events and HTTP reads into task
//! state. The verdicts themselves ("the turn is over, and this is its answer") are
//! [`turn`](crate::tasks::lifecycle::turn)'s; the tracker feeds it and applies what it says. Its rooms: HTTP
//! checks are `completion.rs`'s, reading a finished turn `outcome.rs`'s, permission asks
//! `asks.rs`'s, a running turn's caps `budget.rs`'s.
//!
//! - **Events** drive progress (current tool, streamed text, retries, permission asks) and can
//!   end a turn at once: when the session goes idle and the stream already showed the turn's
//!   final reply. Any other idle, error or reconnect *triggers* an HTTP check.
//! - **HTTP checks** read the turn (paging back from the newest message to ours) and, unless the
//!   final reply is already there, a fresh status: an absence (no answer, a stopped loop) is
//!   never concluded from a remembered idle. At most one check per task runs at a time; a
//!   trigger during a check makes it run once more.
//! - **Subagents**: a session created with a `parentID` that belongs to a task becomes that
//!   task's child session; its permission asks are the task's asks, its tools show in progress.
//! - **Gaps**: on every (re)connect and every reconcile tick, pending permissions are read
//!   (`GET /permission`) and sessions that are no longer working are checked, so an ask or an
//!   idle the stream missed is found within one tick.
//! - **Deleted sessions** (`session.deleted`, or a 404 on read) fail the task at once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::asks::sweep_permissions;
use super::budget::{note_spending, over_budget, reconcile_spend, stop_over_budget, OverBudget};
use super::completion::{spawn_check, spawn_settle};
use crate::tasks::context::TaskContext;
use crate::tasks::turn::outcome::{after_turn, spawn_outcome, Attempts};

use crate::opencode::events::{Event, PartEvent, PumpEvent};
use crate::opencode::{ErrorInfo, Server, SessionActivity};
use crate::tasks::checks::hold::{self, Hold};
use crate::tasks::lifecycle::entry::Claim;
use crate::tasks::lifecycle::phase::Phase;
use crate::tasks::lifecycle::turn::{self, session_deleted, Idle, ReplySeen};
use crate::tasks::model::{RetryInfo, TaskStatus};
use crate::tasks::store::registry::Registry;

/// How often unfinished tasks are re-checked over HTTP even without events (covers a stream
/// that silently stopped delivering).
pub(in crate::tasks) const RECONCILE_EVERY: Duration = Duration::from_secs(5);

/// Runs until the server's pump stops (server stopped) or its process exits.
pub async fn run(
    ctx: TaskContext,
    server: Arc<Server>,
    mut events: mpsc::UnboundedReceiver<PumpEvent>,
) {
    let mut reconcile = tokio::time::interval(RECONCILE_EVERY);
    reconcile.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let exited = async {
        match &server.process {
            Some(p) => p.wait_exit().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(exited);
    loop {
        tokio::select! {
            how = &mut exited => {
                fail_server_tasks(&ctx.registry, &server.id, "ServerExited", &format!("the OpenCode server {} {how}", server.id));
                server.stop.cancel();
                return;
            }
            _ = server.stop.cancelled() => return,
            _ = reconcile.tick() => spawn_reconcile(&ctx, &server, false),
            msg = events.recv() => match msg {
                None => return,
                Some(PumpEvent::Connected) => {
                    // Events before this connect were not seen: no open turn's streamed view
                    // is whole (a turn opened while the stream was down included).
                    mark_gaps(&ctx, &server);
                    spawn_reconcile(&ctx, &server, true);
                }
                Some(PumpEvent::Disconnected(reason)) => {
                    tracing::debug!(server_id = %server.id, %reason, "event stream disconnected");
                    mark_gaps(&ctx, &server);
                }
                Some(PumpEvent::Dropped) => mark_gaps(&ctx, &server),
                Some(PumpEvent::Event(event)) => apply(&ctx, &server, *event),
            }
        }
    }
}

/// Events of the server's open turns may have been missed: their streamed views are not used
/// (their answers are read over HTTP).
fn mark_gaps(ctx: &TaskContext, server: &Server) {
    for id in unfinished_on(&ctx.registry, &server.id) {
        ctx.registry.update(&id, |e| e.live.streamed.mark_gap());
    }
}

/// The safety net, kept cheap: per directory in use, one `GET /session/status` and one
/// `GET /permission`; a full completion check only for tasks whose session is no longer working
/// (those are the ones a dropped event could have left behind), or for every unfinished task
/// after a reconnect (`all`).
fn spawn_reconcile(ctx: &TaskContext, server: &Arc<Server>, all: bool) {
    let ids = unfinished_on(&ctx.registry, &server.id);
    if ids.is_empty() {
        return;
    }
    let ctx = ctx.clone();
    let server = server.clone();
    tokio::spawn(async move {
        let mut by_dir: BTreeMap<String, Vec<(String, String, u32)>> = BTreeMap::new();
        for id in ids {
            if let Some(e) = ctx.registry.get(&id) {
                by_dir.entry(e.rec.directory.clone()).or_default().push((
                    id,
                    e.rec.session_id.clone(),
                    e.rec.turn,
                ));
            }
        }
        for (dir, tasks) in by_dir {
            sweep_permissions(&ctx, &server, &dir).await;
            for (id, _, _) in &tasks {
                reconcile_spend(&ctx, &server, id).await;
            }
            if all {
                for (id, _, _) in tasks {
                    spawn_check(&ctx, &server, id, Idle::No, None);
                }
                continue;
            }
            let activity = match server.api.session_activity(&dir).await {
                Ok(a) => a,
                Err(e) => {
                    tracing::debug!(server_id = %server.id, error = %e, "reconcile: status check failed");
                    continue;
                }
            };
            for (id, session, turn) in tasks {
                let working = matches!(
                    activity.get(&session),
                    Some(SessionActivity::Busy | SessionActivity::Retry { .. })
                );
                if !working {
                    // Idle as of the turn read before the status: a continue since then opens a
                    // turn this read says nothing about.
                    spawn_check(&ctx, &server, id, Idle::Confirmed, Some(turn));
                }
            }
        }
    });
}

pub(in crate::tasks) fn unfinished_on(registry: &Registry, server_id: &str) -> Vec<String> {
    registry.ids_where(|e| e.rec.server_id == server_id && !e.rec.status().is_terminal())
}

/// Marks every unfinished task of a server as failed (server died or was stopped).
pub fn fail_server_tasks(
    registry: &Registry,
    server_id: &str,
    name: &str,
    reason: &str,
) -> Vec<String> {
    let ids = unfinished_on(registry, server_id);
    for id in &ids {
        registry.update(id, |e| {
            let turn = e.rec.turn;
            e.finish(
                Claim::Gone(turn),
                TaskStatus::Failed,
                Some(ErrorInfo {
                    provider_status: None,
                    retryable: None,
                    name: name.into(),
                    message: reason.to_string(),
                }),
            );
        });
    }
    ids
}

/// What to do after an event was applied.
pub(in crate::tasks) enum Then {
    Nothing,
    /// Run a completion check, knowing this about the session's activity.
    Check(Idle),
    /// The turn ended: read its outcome.
    ReadOutcome(u32),
    /// The session is gone: stop what OpenCode still runs of it, and read what there is.
    Deleted(u32),
    /// A structured task's turn completed and is held: check its answer.
    Settle(u32),
    /// The turn passed one of the task's spending caps.
    OverBudget(OverBudget),
}

/// Applies one event to the task of its session, if it is ours.
fn apply(ctx: &TaskContext, server: &Arc<Server>, event: Event) {
    let Some(session_id) = event.session_id() else {
        return;
    };
    if let Event::SessionInfo {
        parent_id: Some(parent),
        ..
    } = &event
    {
        ctx.registry.adopt_child(parent, session_id);
        return;
    }
    let Some(owner) = ctx.registry.owner_of(session_id) else {
        return;
    };
    let then = ctx
        .registry
        .update(&owner.task_id, |e| {
            if e.rec.server_id != server.id {
                return Then::Nothing;
            }
            e.live.last_event = Instant::now();
            // Spend counts also after the turn ended for us: an abort OpenCode did not confirm
            // at once may leave a step running, and what it costs is spent all the same.
            note_spending(e, &event, owner.child);
            if e.rec.status().is_terminal() {
                return Then::Nothing;
            }
            let then = if owner.child {
                apply_child(ctx, e, &event);
                Then::Nothing
            } else {
                apply_own(ctx, e, &event)
            };
            match then {
                Then::Nothing | Then::Check(_) => {
                    over_budget(e).map(Then::OverBudget).unwrap_or(then)
                }
                ended => ended,
            }
        })
        .unwrap_or(Then::Nothing);
    match then {
        Then::Nothing => {}
        Then::Check(idle) => spawn_check(ctx, server, owner.task_id, idle, None),
        Then::ReadOutcome(turn) => spawn_outcome(ctx, server, owner.task_id, turn),
        Then::Settle(turn) => spawn_settle(ctx, server, owner.task_id, turn),
        Then::OverBudget(OverBudget { turn, why }) => {
            let (ctx, server, id) = (ctx.clone(), server.clone(), owner.task_id);
            tokio::spawn(async move { stop_over_budget(&ctx, &server, &id, turn, why).await });
        }
        Then::Deleted(turn) => {
            let (ctx, server, id) = (ctx.clone(), server.clone(), owner.task_id);
            tokio::spawn(async move {
                if let Some(e) = ctx.registry.get(&id) {
                    let _ = server.api.abort(&e.rec.directory, &e.rec.session_id).await;
                }
                // Its session is gone, so one read says so; a remote task's work is still on
                // its worker, and is brought back.
                after_turn(&ctx, &server, &id, turn, Attempts::Once).await;
            });
        }
    }
}

/// A subagent's event: its asks are the task's, its tools show as the task's progress.
fn apply_child(
    ctx: &TaskContext,
    e: &mut crate::tasks::lifecycle::entry::TaskEntry,
    event: &Event,
) {
    match event {
        Event::PermissionAsked(ask) => e.ask_permission(ask.clone()),
        Event::PermissionReplied { request_id, .. } => e.permission_answered(request_id),
        Event::PartUpdated {
            part: PartEvent::Tool { call, title },
            ..
        } => track_tool(e, &call.tool, &call.status, title),
        Event::PartDelta { field, delta, .. } if field == "text" => {
            e.push_text(delta, ctx.tail_chars)
        }
        _ => {}
    }
}

fn track_tool(
    e: &mut crate::tasks::lifecycle::entry::TaskEntry,
    tool: &str,
    status: &str,
    title: &Option<String>,
) {
    match status {
        "pending" | "running" => e.live.current_tool = Some((tool.to_string(), title.clone())),
        _ => {
            e.live.tools_run += 1;
            e.live.current_tool = None;
        }
    }
}

/// An event of the task's own session.
fn apply_own(
    ctx: &TaskContext,
    e: &mut crate::tasks::lifecycle::entry::TaskEntry,
    event: &Event,
) -> Then {
    let mut then = Then::Nothing;
    if e.is_open() {
        e.live.streamed.apply(&e.rec.user_message_id, event);
    }
    match event {
        Event::SessionStatus { activity, .. } => match activity {
            SessionActivity::Busy => {
                if e.started() {
                    // The first `busy` of a turn follows everything the previous turn emitted,
                    // so an error seen before it was the previous turn's (the stream can lag
                    // behind the HTTP check that ended that turn).
                    e.live.session_error = None;
                }
                e.live.retry = None;
            }
            SessionActivity::Retry {
                attempt, message, ..
            } => {
                e.started();
                e.live.retry = Some(RetryInfo {
                    attempt: *attempt,
                    message: message.clone(),
                });
            }
            SessionActivity::Idle => then = Then::Check(Idle::Reported),
        },
        Event::SessionIdle { .. } => then = Then::Check(Idle::Reported),
        Event::SessionError { error, .. } => {
            e.live.session_error = Some(error.clone());
            then = Then::Check(Idle::No);
        }
        Event::SessionDeleted { session_id } => {
            let turn = e.rec.turn;
            if e.phase() != Phase::Aborting
                && e.finish(
                    Claim::Gone(turn),
                    TaskStatus::Failed,
                    Some(session_deleted(session_id)),
                )
            {
                return Then::Deleted(turn);
            }
        }
        Event::MessageUpdated {
            role,
            message_id,
            completed,
            finish,
            error,
            summary,
            agent,
            model,
            ..
        } => {
            e.rec.note_message_id(message_id);
            if role == "assistant" && ReplySeen::in_turn(message_id, &e.rec.user_message_id) {
                e.started();
                // Message ids ascend: keep the newest reply.
                let newer = e
                    .live
                    .latest_reply
                    .as_ref()
                    .is_none_or(|r| *message_id >= r.message_id);
                if newer {
                    e.live.latest_reply = Some(ReplySeen {
                        message_id: message_id.clone(),
                        completed: *completed,
                        finish: finish.clone(),
                        error: error.clone(),
                        summary: *summary,
                        agent: agent.clone(),
                        model: model.clone(),
                    });
                }
            }
        }
        Event::PartUpdated { part, .. } => match part {
            PartEvent::Tool { call, title } => track_tool(e, &call.tool, &call.status, title),
            PartEvent::StepFinish => e.live.steps += 1,
            PartEvent::Text { .. }
            | PartEvent::Compaction
            | PartEvent::StepStart
            | PartEvent::Other => {}
        },
        Event::PartDelta { field, delta, .. } => {
            if field == "text" {
                e.push_text(delta, ctx.tail_chars);
            }
        }
        Event::PermissionAsked(ask) => e.ask_permission(ask.clone()),
        Event::PermissionReplied { request_id, .. } => e.permission_answered(request_id),
        Event::SessionInfo { .. } | Event::Other => {}
    }
    // Idle, and the events already showed the turn's final reply: the turn is over without a
    // round trip; its outcome is read over HTTP off the waiters' path.
    if matches!(then, Then::Check(Idle::Reported)) && e.is_open() {
        if let Some(v) = turn::conclude_from_events(e.live.latest_reply.as_ref()) {
            match hold::hold(e, v.status, v.error.as_ref(), &ctx.config.get()) {
                Hold::Held(turn) => return Then::Settle(turn),
                Hold::Already => return Then::Nothing,
                Hold::No => {}
            }
            // The answer as streamed, when the stream showed all of it: the wait that returns
            // now carries it without a read. Otherwise it is read over HTTP (off this path).
            match e.live.streamed.derive(&e.rec.user_message_id) {
                Some(state) if state.finished => {
                    e.rec.outcome = Some(state.cap_text(ctx.max_result_chars));
                }
                _ => tracing::debug!(
                    task_id = %e.rec.id,
                    gap = e.live.streamed.has_gap(),
                    "the stream did not show the whole turn; reading it over HTTP"
                ),
            }
            let turn = e.rec.turn;
            e.finish(Claim::Open(turn), v.status, v.error);
            return Then::ReadOutcome(turn);
        }
    }
    then
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::opencode::PermissionAsk;
    use crate::tasks::context::fixtures::{context, registry_with};
    #[test]
    fn a_subagents_ask_is_its_parents_and_only_until_answered() {
        let registry = registry_with(|e| {
            e.started();
        });
        registry.adopt_child("ses_a", "ses_child");
        let ctx = context(registry.clone());
        let ask = PermissionAsk {
            id: "per_1".into(),
            session_id: "ses_child".into(),
            permission: "bash".into(),
            patterns: vec!["touch x".into()],
            metadata: serde_json::Value::Null,
        };
        let owner = registry.owner_of("ses_child").expect("child");
        registry.update(&owner.task_id, |e| {
            apply_child(&ctx, e, &Event::PermissionAsked(ask.clone()))
        });
        let asked = registry.get("tsk_a").expect("task");
        assert_eq!(asked.rec.status(), TaskStatus::WaitingPermission);
        assert_eq!(
            asked
                .rec
                .permissions
                .iter()
                .map(|p| p.session_id.as_str())
                .collect::<Vec<_>>(),
            ["ses_child"]
        );
        registry.update("tsk_a", |e| {
            apply_child(
                &ctx,
                e,
                &Event::PermissionReplied {
                    session_id: "ses_child".into(),
                    request_id: "per_1".into(),
                },
            )
        });
        assert_eq!(
            registry.get("tsk_a").map(|e| e.rec.status()),
            Some(TaskStatus::Running)
        );
    }
}

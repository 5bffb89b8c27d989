//! The tracker: one per OpenCode server, it turns the server's events into task state.
//!
//! Events drive progress (current tool, streamed text, retries, permission asks) and *trigger*
//! completion checks; they never decide completion alone. When a session goes idle (or errors, or
//! the stream reconnects, or the periodic reconcile fires) the tracker reads the session's
//! messages over HTTP and asks the one question that matters (design notes §5): has the latest
//! assistant message answering *our* user message completed with a terminal finish or an error,
//! while the session is idle? A stale `session.idle` from a previous turn therefore cannot complete
//! a continued task (the original's bug 1).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::model::{RetryInfo, TaskStatus};
use super::registry::{Registry, ReplySeen};
use crate::opencode::events::{Event, PartEvent, PumpEvent};
use crate::opencode::{ErrorInfo, Server, SessionActivity};

/// How often unfinished tasks are re-checked over HTTP even without events (covers a stream
/// that silently stopped delivering).
const RECONCILE_EVERY: Duration = Duration::from_secs(5);

/// Shared state the tracker needs.
#[derive(Clone)]
pub struct TrackerContext {
    pub registry: Arc<Registry>,
    /// Characters of streamed text kept for progress.
    pub tail_chars: usize,
    /// Characters of final text kept per task.
    pub max_result_chars: usize,
    /// Finished tasks older than this are forgotten.
    pub finished_ttl: Duration,
}

/// Runs until the server's pump stops (server stopped) or its process exits.
pub async fn run(
    ctx: TrackerContext,
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
                fail_server_tasks(&ctx.registry, &server.id, &format!("the OpenCode server {} {how}", server.id));
                server.stop.cancel();
                return;
            }
            _ = server.stop.cancelled() => return,
            _ = reconcile.tick() => {
                ctx.registry.evict_finished(ctx.finished_ttl);
                spawn_reconcile(&ctx, &server);
            }
            msg = events.recv() => match msg {
                None => return,
                Some(PumpEvent::Connected) => {
                    for id in unfinished_on(&ctx.registry, &server.id) {
                        spawn_check(&ctx, &server, id, Activity::Unknown);
                    }
                }
                Some(PumpEvent::Disconnected(reason)) => {
                    tracing::debug!(server_id = %server.id, %reason, "event stream disconnected");
                }
                Some(PumpEvent::Event(event)) => apply(&ctx, &server, event),
            }
        }
    }
}

/// The periodic safety net, kept cheap: one `GET /session/status` per directory in use, and a
/// full completion check only for tasks whose session that says is no longer working (those are
/// the ones a dropped event could have left behind). A busy session's task is left to its events.
fn spawn_reconcile(ctx: &TrackerContext, server: &Arc<Server>) {
    let ids = unfinished_on(&ctx.registry, &server.id);
    if ids.is_empty() {
        return;
    }
    let ctx = ctx.clone();
    let server = server.clone();
    tokio::spawn(async move {
        let mut by_dir: std::collections::BTreeMap<String, Vec<(String, String)>> =
            Default::default();
        for id in ids {
            if let Some(e) = ctx.registry.get(&id) {
                by_dir
                    .entry(e.directory.clone())
                    .or_default()
                    .push((id, e.session_id.clone()));
            }
        }
        for (dir, tasks) in by_dir {
            let activity = match server.api.session_activity(&dir).await {
                Ok(a) => a,
                Err(e) => {
                    tracing::debug!(server_id = %server.id, error = %e, "reconcile: status check failed");
                    continue;
                }
            };
            for (id, session) in tasks {
                let working = matches!(
                    activity.get(&session),
                    Some(SessionActivity::Busy | SessionActivity::Retry { .. })
                );
                if !working {
                    spawn_check(&ctx, &server, id, Activity::Idle);
                }
            }
        }
    });
}

fn unfinished_on(registry: &Registry, server_id: &str) -> Vec<String> {
    registry.ids_where(|e| e.server_id == server_id && !e.status.is_terminal())
}

/// Marks every unfinished task of a server as failed with `reason` (server died or stopped).
pub fn fail_server_tasks(registry: &Registry, server_id: &str, reason: &str) -> Vec<String> {
    let ids = unfinished_on(registry, server_id);
    for id in &ids {
        registry.update(id, |e| {
            if !e.status.is_terminal() {
                e.finish(
                    TaskStatus::Failed,
                    Some(ErrorInfo {
                        name: "ServerExited".into(),
                        message: reason.to_string(),
                    }),
                );
            }
        });
    }
    ids
}

/// Applies one event to the task of its session, if it is ours.
fn apply(ctx: &TrackerContext, server: &Arc<Server>, event: Event) {
    let Some(session_id) = event.session_id() else {
        return;
    };
    let Some(task_id) = ctx.registry.task_for_session(session_id) else {
        return;
    };
    let mut check = None;
    let mut finished_turn = None;
    ctx.registry.update(&task_id, |e| {
        if e.server_id != server.id {
            return;
        }
        e.last_event = std::time::Instant::now();
        if e.status.is_terminal() {
            return;
        }
        match &event {
            Event::SessionStatus { activity, .. } => match activity {
                SessionActivity::Busy => {
                    if e.status == TaskStatus::Pending {
                        e.status = TaskStatus::Running;
                        // The first `busy` of a turn follows everything the previous turn
                        // emitted, so an error seen before it was the previous turn's (the
                        // stream can lag behind the HTTP check that ended that turn).
                        e.session_error = None;
                    }
                    e.retry = None;
                }
                SessionActivity::Retry {
                    attempt, message, ..
                } => {
                    if e.status == TaskStatus::Pending {
                        e.status = TaskStatus::Running;
                    }
                    e.retry = Some(RetryInfo {
                        attempt: *attempt,
                        message: message.clone(),
                    });
                }
                SessionActivity::Idle => check = Some(Activity::Idle),
            },
            Event::SessionIdle { .. } => check = Some(Activity::Idle),
            Event::SessionError { error, .. } => {
                e.session_error = Some(error.clone());
                check = Some(Activity::Unknown);
            }
            Event::MessageUpdated {
                role,
                parent_id,
                message_id,
                completed,
                finish,
                error,
                ..
            } => {
                if role == "assistant" && parent_id.as_deref() == Some(e.user_message_id.as_str()) {
                    if e.status == TaskStatus::Pending {
                        e.status = TaskStatus::Running;
                    }
                    // Message ids ascend: keep the newest reply.
                    let newer = e
                        .latest_reply
                        .as_ref()
                        .is_none_or(|r| *message_id >= r.message_id);
                    if newer {
                        e.latest_reply = Some(ReplySeen {
                            message_id: message_id.clone(),
                            completed: *completed,
                            finish: finish.clone(),
                            error: error.clone(),
                        });
                    }
                }
            }
            Event::PartUpdated { part, .. } => match part {
                PartEvent::Tool {
                    tool,
                    status,
                    title,
                } => match status.as_str() {
                    "pending" | "running" => e.current_tool = Some((tool.clone(), title.clone())),
                    _ => {
                        e.tools_run += 1;
                        e.current_tool = None;
                    }
                },
                PartEvent::StepFinish => e.steps += 1,
                PartEvent::Text { .. } | PartEvent::StepStart | PartEvent::Other => {}
            },
            Event::PartDelta { field, delta, .. } => {
                if field == "text" {
                    e.push_text(delta, ctx.tail_chars);
                }
            }
            Event::PermissionAsked(ask) => {
                e.status = TaskStatus::WaitingPermission;
                e.permission = Some(ask.clone());
            }
            Event::PermissionReplied { request_id, .. } => {
                if e.permission.as_ref().is_some_and(|p| &p.id == request_id) {
                    e.permission = None;
                    e.status = TaskStatus::Running;
                }
            }
            Event::Other => {}
        }
        // Idle, and the events already showed our final reply: the turn is over (design notes
        // §5) without a round trip; the outcome is read over HTTP off the waiters' path.
        if check == Some(Activity::Idle) && !e.aborting {
            if let Some(reply) = e.latest_reply.clone().filter(ReplySeen::ends_turn) {
                let status = if reply.error.is_some() {
                    TaskStatus::Failed
                } else {
                    TaskStatus::Completed
                };
                e.finish(status, reply.error);
                finished_turn = Some(e.turn);
                check = None;
            }
        }
    });
    if let Some(known) = check {
        spawn_check(ctx, server, task_id.clone(), known);
    }
    if let Some(turn) = finished_turn {
        let ctx = ctx.clone();
        let server = server.clone();
        tokio::spawn(async move { fill_outcome(&ctx, &server, &task_id, turn).await });
    }
}

/// Reads a finished turn's outcome (text, tokens, tools) and keeps it. If this fails the result
/// is read live when asked for.
async fn fill_outcome(ctx: &TrackerContext, server: &Server, task_id: &str, turn: u32) {
    let Some(entry) = ctx.registry.get(task_id) else {
        return;
    };
    match server
        .api
        .turn_state(&entry.directory, &entry.session_id, &entry.user_message_id)
        .await
    {
        Ok(state) => {
            let state = state.cap_text(ctx.max_result_chars);
            ctx.registry.update(task_id, |e| {
                if e.turn == turn && e.outcome.is_none() {
                    e.outcome = Some(state);
                }
            });
        }
        Err(e) => {
            tracing::debug!(task_id, error = %e, "reading a finished turn failed; the result will be read live")
        }
    }
}

/// What the trigger of a completion check already says about the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activity {
    /// An idle event or a status read just now: no need to ask again (it saves a request on
    /// every completion, which matters when fifty tasks finish at once).
    Idle,
    /// Ask OpenCode (`GET /session/status`).
    Unknown,
}

fn spawn_check(ctx: &TrackerContext, server: &Arc<Server>, task_id: String, known: Activity) {
    let ctx = ctx.clone();
    let server = server.clone();
    tokio::spawn(async move { check_completion(&ctx, &server, &task_id, known).await });
}

/// Reads the turn over HTTP and finishes the task if the turn is over. Safe to call any time and
/// any number of times: it only ever finishes the turn it read, and never a task that has moved
/// on (a newer turn) or is being aborted.
pub async fn check_completion(
    ctx: &TrackerContext,
    server: &Server,
    task_id: &str,
    known: Activity,
) {
    let registry = &ctx.registry;
    let Some(entry) = registry.get(task_id) else {
        return;
    };
    if entry.status.is_terminal() || entry.aborting {
        return;
    }
    let turn = server
        .api
        .turn_state(&entry.directory, &entry.session_id, &entry.user_message_id);
    let activity = async {
        match known {
            Activity::Idle => Ok(None),
            Activity::Unknown => server
                .api
                .session_activity(&entry.directory)
                .await
                .map(Some),
        }
    };
    let (turn, activity) = match tokio::join!(turn, activity) {
        (Ok(t), Ok(a)) => (t.cap_text(ctx.max_result_chars), a),
        (Err(e), _) | (_, Err(e)) => {
            tracing::debug!(task_id, error = %e, "completion check failed; will retry");
            return;
        }
    };
    let idle = match &activity {
        None => true,
        Some(a) => matches!(a.get(&entry.session_id), None | Some(SessionActivity::Idle)),
    };
    registry.update(task_id, |e| {
        if e.turn != entry.turn || e.status.is_terminal() || e.aborting {
            return;
        }
        if !turn.user_message_seen && !idle {
            return;
        }
        if idle && turn.finished {
            let status = if turn.error.is_some() {
                TaskStatus::Failed
            } else {
                TaskStatus::Completed
            };
            let error = turn.error.clone();
            e.outcome = Some(turn);
            e.finish(status, error);
        } else if idle && e.session_error.is_some() {
            // Failures of an async prompt can leave no assistant message at all (e.g. an unknown
            // model): the session error is the whole story.
            let error = e.session_error.clone();
            e.outcome = Some(turn);
            e.finish(TaskStatus::Failed, error);
        } else if idle && turn.latest_completed {
            // The loop ended after a tool step with no final answer (e.g. a rejected permission).
            e.outcome = Some(turn);
            e.finish(
                TaskStatus::Failed,
                Some(ErrorInfo {
                    name: "TurnStopped".into(),
                    message: "the agent stopped after a tool call without a final answer (was a permission rejected?)".into(),
                }),
            );
        } else if !idle && e.status == TaskStatus::Pending && turn.user_message_seen {
            e.status = TaskStatus::Running;
        }
    });
}

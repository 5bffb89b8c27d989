//! Aborting a turn: `cancel_task`, the `timeouts.task` deadline and `stop_server` share one
//! sequence, [`abort_turn`].

use std::sync::Arc;
use std::time::Duration;

use super::asks;
use super::completion;
use crate::opencode::{ErrorInfo, OpencodeError, PermissionReply, Server};
use crate::tasks::context::TaskContext;
use crate::tasks::lifecycle::entry::Claim;
use crate::tasks::lifecycle::turn::{Idle, Verdict};
use crate::tasks::model::TaskStatus;
use crate::tasks::turn::outcome;
use crate::tasks::turn::outcome::Attempts;

/// What [`abort_turn`] does when OpenCode refuses or cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::tasks) enum IfAbortFails {
    /// `cancel_task`: leave the task as it was and return the error (a 404 is never reported as
    /// a cancellation).
    KeepRunning,
    /// The deadline and `stop_server`: the turn is over for us whatever OpenCode says; log and
    /// finish it.
    FinishAnyway,
}

/// [`OnDeadline`](crate::tasks::context::OnDeadline): the deadline timer's action, handed to the
/// context by whoever builds it.
pub(in crate::tasks) fn on_deadline(
    ctx: TaskContext,
    server: Arc<Server>,
    task_id: String,
    turn: u32,
    limit: Duration,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    Box::pin(async move { deadline_passed(&ctx, &server, &task_id, turn, limit).await })
}

/// The turn's `timeouts.task` (`limit`) passed: abort it if it is still running.
async fn deadline_passed(
    ctx: &TaskContext,
    server: &Arc<Server>,
    task_id: &str,
    turn: u32,
    limit: Duration,
) {
    // The turn may have ended without the gateway seeing it yet (events missed, or it ended
    // while the gateway was down, so this deadline fires at once after a restart): read it
    // first, and claim only a turn that is really still running.
    if let Some(ended) =
        completion::check_completion(ctx, server, task_id, Idle::No, Some(turn)).await
    {
        outcome::after_turn(ctx, server, task_id, ended, Attempts::Patient).await;
        return;
    }
    let error = timeout_error(limit, "");
    if let Ok(Some(turn)) = abort_turn(
        ctx,
        server,
        task_id,
        Some(turn),
        TaskStatus::TimedOut,
        Some(error),
        IfAbortFails::FinishAnyway,
    )
    .await
    {
        outcome::after_turn(ctx, server, task_id, turn, Attempts::Patient).await;
    }
}

/// The error of a turn that ran past its `timeouts.task` (`limit`); `how` says more of how it
/// was aborted, if anything.
fn timeout_error(limit: Duration, how: &str) -> ErrorInfo {
    ErrorInfo {
        provider_status: None,
        retryable: None,
        name: "TaskTimeout".into(),
        message: format!(
            "the task ran longer than timeouts.task ({}) and was aborted{how}",
            humantime::format_duration(limit)
        ),
    }
}

/// An open turn found aborted once past its deadline (`age` against `limit`) was aborted at
/// that deadline by the supervisor of an OpenCode left lingering with no gateway: no gateway
/// saw it, since one that aborts a turn holds it as aborting, not open. It timed out, as it
/// would have with a gateway running, rather than failed with OpenCode's abort error.
pub(in crate::tasks) fn timed_out_unwatched(v: Verdict, age: Duration, limit: Duration) -> Verdict {
    let aborted = v
        .error
        .as_ref()
        .is_some_and(|e| e.name == "MessageAbortedError");
    if !aborted || age < limit {
        return v;
    }
    Verdict {
        status: TaskStatus::TimedOut,
        error: Some(timeout_error(limit, " while no gateway ran")),
    }
}

/// How long after its prompt a turn's abort may wait for the turn's first reply (see
/// [`wait_for_first_reply`]). OpenCode creates it within about 1.5 s of the prompt in a
/// directory it has not served before, at once in one it has; a stream that shows no events,
/// or a turn adopted after a restart (whose earlier replies this gateway never saw), must not
/// hold a cancel for long.
const FIRST_REPLY_WAIT: Duration = Duration::from_secs(10);

/// Waits until the turn's first assistant message exists (the event stream shows it), the turn
/// ends otherwise, or `gave_up` ([`FIRST_REPLY_WAIT`] after the prompt) passes. OpenCode 1.18.33 loads a directory's
/// providers inside the first turn there, before that message, and caches the interruption
/// when that turn is aborted: every later prompt in the directory then fails ("All fibers
/// interrupted without error", from `SessionPrompt.getModel`) until the instance is disposed,
/// which for a task's worktree means its continues never run. An abort that early was also
/// ignored at times (answered `true`, the turn ran on). Measured: aborted 50 ms to 1 s after
/// the prompt, 28 of 31 poisoned the directory; aborted after the first reply, 0 of 10.
async fn wait_for_first_reply(
    ctx: &TaskContext,
    task_id: &str,
    turn: u32,
    gave_up: tokio::time::Instant,
) {
    let registry = &ctx.registry;
    let mut changed = registry.subscribe();
    loop {
        let waiting = registry
            .get(task_id)
            .is_some_and(|e| e.is_aborting(turn) && e.live.latest_reply.is_none());
        if !waiting {
            return;
        }
        if tokio::time::timeout_at(gave_up, changed.changed())
            .await
            .is_err()
        {
            tracing::debug!(
                task_id,
                "no reply {FIRST_REPLY_WAIT:?} after the prompt; aborting the turn anyway"
            );
            return;
        }
    }
}

/// Aborts a task's turn (`turn`, or whatever turn is current when `None`): claims it (so events
/// cannot decide its status meanwhile, and a second abort is a no-op), rejects every ask it
/// waits on (OpenCode's abort leaves asks listed), aborts the session (OpenCode passes the
/// abort on to subagents' child sessions), rejects any other ask of the task still listed (one
/// raised just before the abort whose event had not arrived), and finishes the task with
/// `status`. Returns the turn it finished, if it did.
pub(in crate::tasks) async fn abort_turn(
    ctx: &TaskContext,
    server: &Arc<Server>,
    task_id: &str,
    turn: Option<u32>,
    status: TaskStatus,
    error: Option<ErrorInfo>,
    if_fails: IfAbortFails,
) -> Result<Option<u32>, OpencodeError> {
    let registry = &ctx.registry;
    let claimed = registry.update(task_id, |e| {
        let turn = turn.unwrap_or(e.rec.turn);
        e.claim_abort(turn).then(|| e.clone())
    });
    let Some(Some(entry)) = claimed else {
        return Ok(None);
    };
    if entry.live.latest_reply.is_none() {
        let gave_up = tokio::time::Instant::from_std(entry.live.turn_started + FIRST_REPLY_WAIT);
        wait_for_first_reply(ctx, task_id, entry.rec.turn, gave_up).await;
    }
    let rec = &entry.rec;
    for ask in &rec.permissions {
        if let Err(e) = server
            .api
            .reply_permission(&rec.directory, &ask.id, PermissionReply::Reject)
            .await
        {
            tracing::warn!(task_id, ask = %ask.id, error = %e, "rejecting a pending permission failed");
        }
    }
    match server.api.abort(&rec.directory, &rec.session_id).await {
        Err(e) if if_fails == IfAbortFails::KeepRunning => {
            registry.update(task_id, |e| e.abort_refused(rec.turn));
            Err(e)
        }
        outcome => {
            match outcome {
                Err(e) => {
                    tracing::warn!(task_id, error = %e, "aborting the session failed; finishing the task anyway, and trying again");
                    tokio::spawn(keep_aborting(
                        server.clone(),
                        rec.directory.clone(),
                        rec.session_id.clone(),
                        task_id.to_string(),
                    ));
                }
                Ok(_) => {
                    let answered: Vec<String> =
                        rec.permissions.iter().map(|p| p.id.clone()).collect();
                    asks::reject_pending_asks(ctx, server, &rec.directory, task_id, &answered).await
                }
            }
            let finished = registry.update(task_id, |e| {
                e.finish(Claim::Aborted(rec.turn), status, error)
                    .then_some(rec.turn)
            });
            Ok(finished.flatten())
        }
    }
}

/// Pauses between the tries of [`keep_aborting`]: about five minutes in all.
const ABORT_RETRIES: [Duration; 9] = [
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(8),
    Duration::from_secs(15),
    Duration::from_secs(30),
    Duration::from_secs(60),
    Duration::from_secs(60),
    Duration::from_secs(120),
];

/// Tries the abort of a session again until OpenCode confirms it, after an abort the gateway
/// had to give up on (a deadline or a budget, which end the task whatever OpenCode says): until
/// then the session may go on calling its model, and spending (which still counts: see
/// `tracker.rs`). Ends early when the server is stopped.
async fn keep_aborting(server: Arc<Server>, directory: String, session: String, task_id: String) {
    for pause in ABORT_RETRIES {
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = server.stop.cancelled() => return,
        }
        match server.api.abort(&directory, &session).await {
            Ok(_) => {
                tracing::info!(task_id, "the session's abort went through on a later try");
                return;
            }
            Err(e) => tracing::debug!(task_id, error = %e, "aborting the session failed again"),
        }
    }
    tracing::warn!(task_id, "OpenCode never confirmed the abort of the task's session; it may still be running on its server");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aborted() -> Verdict {
        Verdict {
            status: TaskStatus::Failed,
            error: Some(ErrorInfo {
                provider_status: None,
                retryable: None,
                name: "MessageAbortedError".into(),
                message: "aborted".into(),
            }),
        }
    }

    /// Only a turn found aborted at or past its deadline timed out while no gateway ran; any
    /// other end, or an abort before the deadline, stays as read.
    #[test]
    fn an_abort_past_the_deadline_is_a_timeout() {
        let limit = Duration::from_secs(60);
        let late = timed_out_unwatched(aborted(), Duration::from_secs(61), limit);
        assert_eq!(late.status, TaskStatus::TimedOut);
        let error = late.error.expect("an error");
        assert_eq!(error.name, "TaskTimeout");
        assert!(error.message.contains("no gateway"), "{}", error.message);
        let early = timed_out_unwatched(aborted(), Duration::from_secs(59), limit);
        assert_eq!(early, aborted());
        let failed = Verdict {
            status: TaskStatus::Failed,
            error: Some(ErrorInfo {
                name: "APIError".into(),
                ..aborted().error.expect("an error")
            }),
        };
        assert_eq!(
            timed_out_unwatched(failed.clone(), Duration::from_secs(99), limit),
            failed
        );
        let done = Verdict {
            status: TaskStatus::Completed,
            error: None,
        };
        assert_eq!(
            timed_out_unwatched(done.clone(), Duration::from_secs(99), limit),
            done
        );
    }
}

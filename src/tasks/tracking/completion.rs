//! Completion checks: whether a turn is over, read over HTTP (paging back from the newest
//! message to ours) and, unless the final reply is already there, a fresh status, so an absence
//! (no answer, a stopped loop) is never concluded from a remembered idle. At most one check per
//! task runs at a time; a trigger during a check makes it run once more.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::tasks::checks::hold::{self, Hold};
use crate::tasks::context::TaskContext;
use crate::tasks::lifecycle::entry::Claim;
use crate::tasks::lifecycle::turn::session_deleted;
use crate::tasks::lifecycle::turn::{self, Idle, TurnState};
use crate::tasks::model::TaskStatus;
use crate::tasks::turn::outcome::{after_turn, read_turn, Attempts};

use crate::opencode::{Server, SessionActivity};

/// Runs a completion check unless one is running for the task; then that one runs again.
/// `for_turn`: the turn `idle` was observed for, when it was read before the check (reconcile).
pub fn spawn_check(
    ctx: &TaskContext,
    server: &Arc<Server>,
    task_id: String,
    idle: Idle,
    for_turn: Option<u32>,
) {
    {
        let mut checks = ctx.checks.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(again) = checks.get_mut(&task_id) {
            *again = true;
            return;
        }
        checks.insert(task_id.clone(), false);
    }
    let ctx = ctx.clone();
    let server = server.clone();
    tokio::spawn(async move {
        // A panic inside a check must not leave the entry behind: every later trigger would
        // then only mark it to run again, and the task would never be checked again.
        let _unwind = ForgetCheckOnPanic {
            checks: ctx.checks.clone(),
            task_id: task_id.clone(),
        };
        let (mut idle, mut for_turn) = (idle, for_turn);
        loop {
            // This check ended the turn: read its changed files now, off the completion path,
            // so the wait that returns at completion does not pay for the round trip and later
            // results find them. A turn that something else ended (most often the idle event
            // right after the one that started this check) is that path's to read: reading it
            // here too doubled the gateway's requests at a fan-out's busiest moment.
            if let Some(turn) = check_completion(&ctx, &server, &task_id, idle, for_turn).await {
                after_turn(&ctx, &server, &task_id, turn, Attempts::Patient).await;
            }
            let mut checks = ctx.checks.lock().unwrap_or_else(|p| p.into_inner());
            match checks.get_mut(&task_id) {
                Some(again) if *again => {
                    *again = false;
                    // What the later trigger knew is not kept: ask OpenCode.
                    (idle, for_turn) = (Idle::No, None);
                }
                _ => {
                    checks.remove(&task_id);
                    return;
                }
            }
        }
    });
}

/// Removes a task's entry from the running checks when its check task unwinds.
pub(in crate::tasks) struct ForgetCheckOnPanic {
    pub(in crate::tasks) checks: Arc<Mutex<HashMap<String, bool>>>,
    pub(in crate::tasks) task_id: String,
}

impl Drop for ForgetCheckOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.checks
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&self.task_id);
        }
    }
}

/// Reads the turn over HTTP and finishes the task if [`turn::conclude`] says the turn is over.
/// Safe to call any time and any number of times: it only ever finishes the turn it read, and
/// never a task that has moved on (a newer turn) or is being aborted. `known` is what the
/// trigger said about the session: `Confirmed` (a status read just now) or `Reported` (an idle
/// event) spare a status read when the turn's final reply is already there; otherwise the status
/// is read fresh. `for_turn` is the turn `known` was observed for, if it was read earlier.
///
/// Returns the turn this call ended, if it ended one (a structured answer it held and checked
/// counts only if the check then finished the task; its files were read by the check).
pub async fn check_completion(
    ctx: &TaskContext,
    server: &Arc<Server>,
    task_id: &str,
    known: Idle,
    for_turn: Option<u32>,
) -> Option<u32> {
    let registry = &ctx.registry;
    let entry = registry.get(task_id)?;
    if !entry.is_open() {
        return None;
    }
    let known = match for_turn {
        Some(t) if t != entry.rec.turn => Idle::No,
        _ => known,
    };
    let rec = &entry.rec;
    let mut turn = match read_turn(server, rec, ctx.max_result_chars).await {
        Ok(turn) => turn,
        Err(e) if e.http_status() == Some(404) => {
            registry.update(task_id, |e| {
                let error = session_deleted(&e.rec.session_id);
                e.finish(Claim::Gone(entry.rec.turn), TaskStatus::Failed, Some(error));
            });
            // Gone with its session: one read says so. A remote task's work is still on its
            // worker, and is brought back.
            after_turn(ctx, server, task_id, entry.rec.turn, Attempts::Once).await;
            return None;
        }
        Err(e) => {
            tracing::debug!(task_id, error = %e, "completion check failed; will retry");
            return None;
        }
    };
    let idle = if turn.finished && known != Idle::No {
        known
    } else {
        match server.api.session_activity(&rec.directory).await {
            Ok(a) => match a.get(&rec.session_id) {
                None | Some(SessionActivity::Idle) => Idle::Confirmed,
                Some(_) => Idle::No,
            },
            Err(e) => {
                tracing::debug!(task_id, error = %e, "completion check: status read failed; will retry");
                return None;
            }
        }
    };
    // The messages were read before the status: a final step that started and ended between
    // the two reads is missing from them, and "idle without a final answer" would judge a
    // completed turn stopped. Read them again, now that the session is known to be idle.
    if !turn.finished && idle == Idle::Confirmed {
        match read_turn(server, rec, ctx.max_result_chars).await {
            Ok(again) => turn = again,
            Err(e) => {
                tracing::debug!(task_id, error = %e, "completion check: second read failed; will retry");
                return None;
            }
        }
    }
    let config = ctx.config.get();
    let ended = registry.update(task_id, |e| {
        if e.rec.turn != entry.rec.turn || !e.is_open() {
            return Ended::No;
        }
        if let Some(newest) = &turn.newest_message_id {
            e.rec.note_message_id(newest);
        }
        let age = e.live.turn_started.elapsed().as_millis() as u64;
        let stuck = note_unfinished(&mut e.live, &turn, idle);
        let verdict = turn::conclude(&turn, idle, e.live.session_error.as_ref(), age)
            .or_else(|| turn::abandoned(&turn, idle, stuck))
            .map(|v| {
                let (age, limit) = (Duration::from_millis(age), config.timeouts.task.get());
                super::abort::timed_out_unwatched(v, age, limit)
            });
        match verdict {
            Some(v) => {
                e.rec.outcome = Some(turn.clone());
                match hold::hold(e, v.status, v.error.as_ref(), &config) {
                    Hold::Held(turn) => return Ended::Held(turn),
                    Hold::Already => return Ended::No,
                    Hold::No => {}
                }
                let turn = e.rec.turn;
                if e.finish(Claim::Open(turn), v.status, v.error) {
                    return Ended::Finished(turn);
                }
                tracing::warn!(task_id = %e.rec.id, turn, "a turn's verdict was refused by its lifecycle");
            }
            None => {
                if idle == Idle::No && turn.user_message_seen {
                    e.started();
                }
            }
        }
        Ended::No
    });
    match ended? {
        Ended::Finished(turn) => Some(turn),
        Ended::Held(turn) => {
            // The check reads the files of a round it ends.
            hold::settle(ctx, server, task_id, turn).await;
            None
        }
        Ended::No => None,
    }
}

/// What a completion check did with the turn it read.
pub(in crate::tasks) enum Ended {
    /// Nothing: still running, or ended by someone else meanwhile.
    No,
    /// Finished the task at this turn.
    Finished(u32),
    /// Held this turn's structured answer for its check.
    Held(u32),
}

/// Counts this check if it confirmed the session idle with the turn's newest step unfinished
/// (the same step as the checks before it); any other finding starts the count over.
pub(in crate::tasks) fn note_unfinished(
    live: &mut crate::tasks::lifecycle::entry::Live,
    turn: &TurnState,
    idle: Idle,
) -> turn::Unfinished {
    let step = turn
        .newest_message_id
        .clone()
        .filter(|_| idle == Idle::Confirmed && turn.newest_step_unfinished());
    let Some(step) = step else {
        live.unfinished = None;
        return turn::Unfinished::default();
    };
    let (checks, since) = match live.unfinished.take() {
        Some((seen, checks, since)) if seen == step => (checks + 1, since),
        _ => (1, Instant::now()),
    };
    live.unfinished = Some((step, checks, since));
    turn::Unfinished {
        checks,
        for_ms: since.elapsed().as_millis() as u64,
    }
}

/// Checks a held structured answer off the event path.
pub(in crate::tasks) fn spawn_settle(
    ctx: &TaskContext,
    server: &Arc<Server>,
    task_id: String,
    turn: u32,
) {
    let ctx = ctx.clone();
    let server = server.clone();
    tokio::spawn(async move { hold::settle(&ctx, &server, &task_id, turn).await });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tasks::lifecycle::entry::TaskEntry;
    use crate::tasks::lifecycle::turn::TurnState;
    /// A check that panics leaves no entry behind, so the task can be checked again.
    #[tokio::test]
    async fn a_panicking_check_is_forgotten() {
        let checks: Arc<Mutex<HashMap<String, bool>>> = Arc::default();
        checks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert("tsk_a".into(), false);
        let held = checks.clone();
        let run = tokio::spawn(async move {
            let _unwind = ForgetCheckOnPanic {
                checks: held,
                task_id: "tsk_a".into(),
            };
            panic!("a check that panics");
        });
        assert!(run.await.is_err(), "the task panicked");
        assert!(checks.lock().unwrap_or_else(|p| p.into_inner()).is_empty());
    }

    /// Confirmed-idle checks that find the same unfinished step count up; any other finding
    /// (another step, a remembered idle, a completed step) starts over.
    #[test]
    fn unfinished_steps_are_counted_per_step_and_only_when_idle_is_confirmed() {
        let mut e = TaskEntry::in_first_turn("tsk_a", "ses_a");
        let stuck = |newest: &str| TurnState {
            user_message_seen: true,
            assistant_messages: 1,
            newest_message_id: Some(newest.into()),
            ..TurnState::default()
        };
        let count =
            |e: &mut TaskEntry, t: &TurnState, idle| note_unfinished(&mut e.live, t, idle).checks;
        assert_eq!(count(&mut e, &stuck("m2"), Idle::Confirmed), 1);
        assert_eq!(count(&mut e, &stuck("m2"), Idle::Confirmed), 2);
        assert_eq!(
            count(&mut e, &stuck("m3"), Idle::Confirmed),
            1,
            "another step"
        );
        assert_eq!(
            count(&mut e, &stuck("m3"), Idle::Reported),
            0,
            "not confirmed"
        );
        let done = TurnState {
            latest_completed: true,
            ..stuck("m3")
        };
        assert_eq!(count(&mut e, &stuck("m3"), Idle::Confirmed), 1);
        assert_eq!(count(&mut e, &done, Idle::Confirmed), 0, "completed");
    }
}

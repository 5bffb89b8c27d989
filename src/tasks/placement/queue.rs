//! The queue (`limits.queue`): starts that find every slot they could run in taken wait here
//! instead of being refused, and start first in, first out as slots free.
//!
//! A queued task is a task like any other from the moment its start is answered: it has its
//! id, its record (status `queued`, its start request kept in `queued`), and so status, waits,
//! lists, native tasks and cancel see it, and a restart keeps it (its record is on disk). It
//! has no session and no server yet, so nothing that follows sessions or servers touches it.
//! It holds no slot: room is counted over started tasks only (`capacity.rs`).
//!
//! The drainer ([`drain_queue`]) looks at the queue whenever a task changes (a finish frees a
//! slot) and every second (a start that failed gives its slot back without a change), and
//! starts every queued task that has room now, oldest first. A task whose own worker is full
//! waits, while one behind it that may run elsewhere starts: first in first out among the
//! tasks that compete for the same slots.

use std::collections::HashSet;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::FutureExt;

use super::links::WorkerServes;
use super::start::{unstarted_record, StartTask, Step};
use super::Placement;
use crate::tasks::error::TaskError;
use crate::tasks::lifecycle::entry::{Claim, TaskEntry};
use crate::tasks::lifecycle::phase::Phase;
use crate::tasks::lifecycle::record::start_failed;
use crate::tasks::model::{TaskSnapshot, TaskStatus};

/// The drainer's pace: at least this long between passes, at most this long without one.
const DRAIN_PAUSE: Duration = Duration::from_millis(100);
const DRAIN_EVERY: Duration = Duration::from_secs(1);
/// How long a queued start waits for its record to reach the disk.
const QUEUED_DURABLE: Duration = Duration::from_secs(5);

impl Placement {
    /// Queues `req` (refused with `why`, the refusal of its slot, when the queue is off or
    /// full); `directory` is where it will run, resolved now. Answers at once with the task's
    /// id, status `queued` and its place, once its record is on disk: a queued task lives only
    /// in its record until it starts, so a gateway killed right after the answer must not take
    /// it along.
    pub(in crate::tasks) async fn enqueue(
        &self,
        mut req: StartTask,
        directory: String,
        idempotency: Option<(String, u64)>,
        why: String,
    ) -> Result<TaskSnapshot, TaskError> {
        let bound = self.tracker.config().limits.queue as usize;
        if bound == 0 {
            return Err(TaskError::LimitExceeded(why));
        }
        let task_id = crate::ids::task_id();
        {
            let _one_at_a_time = self.enqueueing.lock().unwrap_or_else(|p| p.into_inner());
            let queued = self.registry.queued().len();
            if queued >= bound {
                return Err(TaskError::LimitExceeded(format!(
                    "{why}; and the queue is full ({queued} tasks wait, limits.queue is {bound})"
                )));
            }
            let rec = unstarted_record(&task_id, &mut req, directory, idempotency)?;
            self.registry.insert(TaskEntry::queued(rec));
        }
        if let Some(store) = self.registry.store() {
            if let Err(e) = store.flush(QUEUED_DURABLE).await {
                tracing::warn!(task_id, error = %e, "a queued task's record may not be on disk yet");
            }
        }
        tracing::info!(task_id, "every slot is taken; the task is queued");
        self.tracker.snapshot(&task_id, false)
    }

    /// Starts every queued task that has room now, oldest first (see the module comment).
    async fn drain(self: &Arc<Self>) {
        // Where a task found no room in this pass, the ones behind it that would ask the same
        // workers find none either: they are not asked again (a long queue costs one check
        // per kind of request, not one per task).
        let mut full: HashSet<(Option<String>, bool, Option<String>)> = HashSet::new();
        for id in self.registry.queued() {
            let Some(entry) = self.registry.get(&id) else {
                continue;
            };
            let request = entry
                .rec
                .queued
                .clone()
                .map(serde_json::from_value::<StartTask>);
            let req = match request {
                Some(Ok(req)) => req,
                other => {
                    let why = match other {
                        Some(Err(e)) => format!("its queued start request cannot be read: {e}"),
                        _ => "its queued start request is missing".to_string(),
                    };
                    self.fail_start(&id, why);
                    continue;
                }
            };
            // Its worker dropped off a moment ago: it waits until the worker is tried again,
            // rather than failing on a connection that is coming back.
            if req
                .worker
                .as_deref()
                .is_some_and(|w| self.workers.avoided(w))
            {
                continue;
            }
            // Still full where it may run: it waits; one behind it may run elsewhere.
            let kind = (
                req.worker.clone(),
                req.isolation == crate::config::Isolation::Worktree,
                req.tier.clone(),
            );
            if full.contains(&kind) {
                continue;
            }
            let slot =
                match self.reserve(req.worker.as_deref(), req.isolation, req.tier.as_deref(), 1) {
                    Ok(mut room) => room.pop(),
                    Err(TaskError::LimitExceeded(_)) => None,
                    // It can never start as asked (its worker is no longer declared, say).
                    Err(e) => {
                        self.fail_start(&id, e.to_string());
                        continue;
                    }
                };
            let Some(slot) = slot else {
                full.insert(kind);
                continue;
            };
            // Queued to starting is one move under the registry's lock: a cancel that came
            // after the read above wins, and the task is not started; one that comes after
            // this finds it starting.
            let claimed = self.registry.update(&id, |e| e.claim_start().is_ok());
            if claimed != Some(true) {
                continue;
            }
            self.spawn_start(req, entry.rec.idempotency.clone(), slot, id, true);
        }
    }

    /// Runs the start of task `id`, recorded as starting, in the background, in `slot` taken
    /// for it: a start answered at once, or a queued one whose turn came (`from_queue`). A
    /// queued start its worker could not take while that worker is only briefly out of reach
    /// waits in the queue for it (it was waiting anyway); any other failure ends the task
    /// `StartFailed`, naming the step and the cause, so a host that named an unreachable
    /// worker learns it at once. A start a cancel ended is left as the cancel left it.
    pub(in crate::tasks) fn spawn_start(
        self: &Arc<Self>,
        req: StartTask,
        idempotency: Option<(String, u64)>,
        slot: crate::tasks::store::capacity::Slots,
        id: String,
        from_queue: bool,
    ) {
        let this = self.clone();
        let worker = req.worker.clone();
        tokio::spawn(async move {
            let start = this.start_queued(req, idempotency, slot, &id);
            let Ok(started) = std::panic::AssertUnwindSafe(start).catch_unwind().await else {
                // A bug in one of its steps (the panic is on stderr already): the task must not
                // stay `starting` for ever, and its room went with the unwinding.
                tracing::error!(task_id = %id, "a task's start panicked; the task fails");
                if this.still_starting(Some(&id)) {
                    this.fail_start(
                        &id,
                        "an internal error stopped it (a bug of the gateway's: its log says \
                         more)"
                            .into(),
                    );
                }
                return;
            };
            let Err((step, e)) = started else {
                if let Some(w) = worker.as_deref() {
                    WorkerServes::mark_up(&this.workers.down, w);
                }
                return;
            };
            if let Some(w) = worker.as_deref().filter(|_| e.worker_unreachable()) {
                WorkerServes::mark_down(&this.workers.down, w, e.to_string());
            }
            // Only a worker out of reach is waited for: one that answered and refused (its
            // OpenCode would not start, say) fails the start.
            let briefly_down = from_queue
                && e.worker_unreachable()
                && worker.as_deref().is_some_and(|w| this.briefly_down(w));
            if briefly_down
                && this.registry.update(&id, |e| e.back_to_queue().is_ok()) == Some(true)
            {
                tracing::info!(task_id = %id, error = %e, "its worker is out of reach for now; the task waits in the queue for it");
                return;
            }
            if !this.still_starting(Some(&id)) {
                // A cancel ended it, or its prompt failed after its turn was registered (that
                // turn ended it `StartFailed` already).
                tracing::debug!(task_id = %id, step = step.doing(), error = %e, "a start stopped; its task has ended");
                return;
            }
            tracing::warn!(task_id = %id, step = step.doing(), error = %e, "a task could not start");
            this.fail_start(&id, format!("{}: {e}", step.doing()));
        });
    }

    fn briefly_down(&self, w: &str) -> bool {
        let lost_after = crate::workers::lost_after(&self.tracker.config(), w);
        self.workers
            .down_since(w)
            .is_some_and(|d| d.since.elapsed() < lost_after)
    }

    /// Starts queued task `id` in room taken for it (on the server it was queued for, or the
    /// gateway's own when that one is gone: after a restart, say).
    async fn start_queued(
        &self,
        mut req: StartTask,
        idempotency: Option<(String, u64)>,
        slot: crate::tasks::store::capacity::Slots,
        id: &str,
    ) -> Result<TaskSnapshot, (Step, TaskError)> {
        #[cfg(test)]
        if req.prompt == tests::PANICS {
            panic!("a bug in a step of the start (a test's)");
        }
        if self.server(&req.server_id).is_err() {
            req.server_id = self
                .start_server(None, None)
                .await
                .map_err(|e| (Step::Checks, e))?
                .server_id;
        }
        tracing::debug!(task_id = id, "starting the task");
        self.start_recorded(req, idempotency, slot, id).await
    }

    /// Ends task `id`, queued or starting, `failed` (`StartFailed`, with `why`), unless it
    /// started or ended meanwhile.
    fn fail_start(&self, id: &str, why: String) {
        self.registry.update(id, |e| {
            let claim = match e.phase() {
                Phase::Queued => Claim::Queued,
                Phase::Starting => Claim::Starting,
                _ => return,
            };
            e.finish(claim, TaskStatus::Failed, Some(start_failed(&why)));
        });
    }

    /// Cancels a task not started yet, in the queue or starting in the background: it ends
    /// `cancelled` and never starts (a start under way stops at its next step and undoes what
    /// it made; the answer waits for the record on disk, so a restart cannot start it after
    /// all).
    pub(in crate::tasks) async fn cancel_unstarted(
        &self,
        id: &str,
    ) -> Result<TaskSnapshot, TaskError> {
        // One move under the registry's lock, like the drainer's claim: whichever comes first
        // wins, never both.
        let cancelled = self.registry.update(id, |e| {
            let claim = match e.phase() {
                Phase::Starting => Claim::Starting,
                _ => Claim::Queued,
            };
            let left = e.finish(claim, TaskStatus::Cancelled, None);
            if left {
                e.rec.queued = None;
            }
            left || e.rec.status().is_terminal()
        });
        if cancelled != Some(true) {
            // Its start registered its first turn just now: that turn is aborted instead.
            return Err(TaskError::Conflict(format!(
                "task {id} finished starting right now; cancel it again"
            )));
        }
        if let Some(store) = self.registry.store() {
            if let Err(e) = store.flush(QUEUED_DURABLE).await {
                tracing::warn!(task_id = id, error = %e, "a cancelled queued task's record may not be on disk yet");
            }
        }
        self.tracker.snapshot(id, false)
    }
}

/// Runs the queue for the gateway's life (see the module comment).
pub(in crate::tasks) async fn drain_queue(service: Weak<Placement>) {
    let Some(mut changes) = service.upgrade().map(|s| s.registry.subscribe()) else {
        return;
    };
    loop {
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(DRAIN_EVERY) => {}
        }
        let Some(this) = service.upgrade() else {
            return;
        };
        if this.tracker.config().limits.queue > 0 || !this.registry.queued().is_empty() {
            this.drain().await;
        }
        drop(this);
        tokio::time::sleep(DRAIN_PAUSE).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A service whose queue holds `bound` tasks, on a state directory of its own.
    fn service(bound: u32) -> (crate::tasks::TaskService, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("a state directory");
        let mut config = crate::gateway::test_config();
        config.state_dir = Some(dir.path().display().to_string());
        config.limits.queue = bound;
        (crate::tasks::TaskService::new(Arc::new(config)), dir)
    }

    fn request() -> StartTask {
        StartTask {
            prompt: "wait your turn".into(),
            ..StartTask::default()
        }
    }

    /// A start that finds no slot waits in the queue, answered `queued` with its place; one
    /// more than `limits.queue` holds is refused, saying why and naming the bound; with no
    /// queue, the slot's refusal stands.
    #[tokio::test]
    async fn a_full_queue_refuses_naming_its_bound() {
        let (s, _dir) = service(1);
        let first = s
            .placement
            .enqueue(request(), "/w".into(), None, "every slot is taken".into())
            .await
            .expect("queued");
        assert_eq!(first.status, TaskStatus::Queued);
        let refused = s
            .placement
            .enqueue(request(), "/w".into(), None, "every slot is taken".into())
            .await
            .expect_err("the queue is full")
            .to_string();
        assert!(
            refused.contains("every slot is taken")
                && refused.contains("the queue is full")
                && refused.contains("limits.queue is 1"),
            "{refused}"
        );
        let (off, _dir) = service(0);
        let why = off
            .placement
            .enqueue(request(), "/w".into(), None, "every slot is taken".into())
            .await
            .expect_err("no queue")
            .to_string();
        assert!(why.contains("every slot is taken"), "{why}");
    }

    /// The prompt whose start panics in its first step (test builds only).
    pub(super) const PANICS: &str = "panic in a step of my start";

    /// A start that panics (a bug in one of its steps) fails its task `StartFailed`, saying so,
    /// rather than leave it starting for ever.
    #[tokio::test]
    async fn a_start_that_panics_fails_its_task() {
        let (s, _dir) = service(4);
        let request = StartTask {
            prompt: PANICS.into(),
            ..StartTask::default()
        };
        let request = serde_json::to_value(&request).expect("a request");
        s.registry
            .insert(TaskEntry::queued_for_test("tsk_panics", Some(request)));
        s.placement.drain().await;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let ended = loop {
            let e = s.registry.get("tsk_panics").expect("still known");
            if e.rec.status().is_terminal() || std::time::Instant::now() > deadline {
                break e;
            }
            tokio::task::yield_now().await;
        };
        assert_eq!(ended.rec.status(), TaskStatus::Failed);
        let error = ended.rec.error.expect("an error");
        assert_eq!(error.name, "StartFailed");
        assert!(
            error.message.contains("internal error"),
            "{}",
            error.message
        );
    }

    /// A queued task whose saved request cannot be read (a record from another version, or
    /// altered) fails `StartFailed`, saying so, rather than wait for ever; so does one with none.
    #[tokio::test]
    async fn a_queued_request_that_cannot_be_read_fails_the_task() {
        let (s, _dir) = service(4);
        for (id, request) in [
            ("tsk_garbled", Some(serde_json::json!("not a request"))),
            ("tsk_empty", None),
        ] {
            s.registry.insert(TaskEntry::queued_for_test(id, request));
        }
        s.placement.drain().await;
        for (id, says) in [
            ("tsk_garbled", "cannot be read"),
            ("tsk_empty", "is missing"),
        ] {
            let e = s.registry.get(id).expect("still known");
            assert_eq!(e.rec.status(), TaskStatus::Failed, "{id}");
            let error = e.rec.error.expect("an error");
            assert_eq!(error.name, "StartFailed", "{id}");
            assert!(error.message.contains(says), "{id}: {}", error.message);
        }
    }
}

//! Waiting on tasks: all or any of them, until a deadline. The registry wakes waiters only on
//! changes they can observe (a status, a turn, a permission), so a wait on fifty streaming tasks
//! sleeps until one of them really moves.

use std::time::Duration;

use super::error::TaskError;
use super::model::{TaskSnapshot, WaitMode, WaitOutcome};
use super::service::TaskService;

impl TaskService {
    /// The permission asks in these snapshots have been shown to the host (a status, or the
    /// return of a wait): a later wait does not return early for them.
    pub fn asks_shown<'a>(&self, shown: impl IntoIterator<Item = &'a TaskSnapshot>) {
        self.registry.asks_shown(shown.into_iter().flat_map(|t| {
            t.permissions
                .iter()
                .map(|p| (t.task_id.as_str(), p.id.as_str()))
        }));
    }

    /// `ids` with each fan-out group id replaced by its tasks (in target order) that still
    /// exist, repeats dropped. A group with no known task is reported like an unknown task id.
    pub async fn expand_groups(&self, ids: Vec<String>) -> Result<Vec<String>, TaskError> {
        if !ids
            .iter()
            .any(|id| id.starts_with(crate::ids::GROUP_PREFIX))
        {
            return Ok(ids);
        }
        self.tracker.restored().await;
        let mut out = Vec::with_capacity(ids.len());
        let mut unknown = Vec::new();
        for id in ids {
            if !id.starts_with(crate::ids::GROUP_PREFIX) {
                out.push(id);
                continue;
            }
            // A member whose record is gone (another gateway sharing the state directory swept
            // it when it expired) is no longer part of the answer; the rest still are.
            let members: Vec<String> = self
                .registry
                .group_members(&id)
                .into_iter()
                .filter(|m| self.registry.knows(m))
                .collect();
            if members.is_empty() {
                unknown.push(id);
            }
            out.extend(members);
        }
        if !unknown.is_empty() {
            return Err(TaskError::UnknownTasks(unknown));
        }
        let mut seen = std::collections::HashSet::new();
        out.retain(|id| seen.insert(id.clone()));
        Ok(out)
    }

    /// Waits up to `timeout` for the ids (already de-duplicated) to satisfy `mode`, or, with
    /// `on_asks`, until a task has a permission ask the host has not been shown: nothing moves
    /// until someone answers it, so the host should hear of it now rather than at the timeout.
    /// Never cancels a task; dropping the future ends only the wait. The caller marks the asks
    /// it shows the host ([`TaskService::asks_shown`]).
    pub async fn wait(
        &self,
        task_ids: &[String],
        mode: WaitMode,
        timeout: Duration,
        include_progress: bool,
        on_asks: bool,
    ) -> Result<WaitOutcome, TaskError> {
        self.tracker.restored().await;
        let deadline = tokio::time::Instant::now() + timeout;
        let mut changes = self.registry.subscribe();
        loop {
            changes.borrow_and_update();
            // Whether to return is judged cheaply first (this runs on every change of any
            // task), then again from the snapshots, which are what the host is shown: a task
            // may have moved in between.
            let finished = self
                .registry
                .finished_count(task_ids)
                .map_err(TaskError::UnknownTasks)?;
            let may_be_done = match mode {
                WaitMode::All => finished == task_ids.len(),
                WaitMode::Any => finished > 0,
            };
            let may_be_asking = on_asks && !self.registry.unshown_asks(task_ids).is_empty();
            let expired = tokio::time::Instant::now() >= deadline;
            if may_be_done || may_be_asking || expired {
                let tasks = self
                    .registry
                    .snapshots(task_ids, include_progress, self.tracker.stall())
                    .map_err(TaskError::UnknownTasks)?;
                let (finished, unfinished): (Vec<_>, Vec<_>) =
                    tasks.iter().partition(|t| t.status.is_terminal());
                let done = match mode {
                    WaitMode::All => unfinished.is_empty(),
                    WaitMode::Any => !finished.is_empty(),
                };
                // From the snapshots, so that each task listed shows its ask in this result
                // (one that came after them wakes this loop again).
                let unshown = if on_asks {
                    self.registry.unshown_asks(task_ids)
                } else {
                    Vec::new()
                };
                let asking: Vec<String> = unfinished
                    .iter()
                    .filter(|t| !t.permissions.is_empty() && unshown.contains(&t.task_id))
                    .map(|t| t.task_id.clone())
                    .collect();
                if done || expired || !asking.is_empty() {
                    return Ok(WaitOutcome {
                        done,
                        timed_out: !done && asking.is_empty(),
                        asking,
                        mode,
                        finished: finished.iter().map(|t| t.task_id.clone()).collect(),
                        unfinished: unfinished.iter().map(|t| t.task_id.clone()).collect(),
                        tasks,
                    });
                }
            }
            tokio::select! {
                r = changes.changed() => if r.is_err() { tokio::time::sleep_until(deadline).await },
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }
}

//! Waiting on tasks: all or any of them, until a deadline. The registry wakes waiters only on
//! changes they can observe (a status, a turn, a permission), so a wait on fifty streaming tasks
//! sleeps until one of them really moves.

use std::collections::HashSet;
use std::time::Duration;

use super::error::TaskError;
use super::model::{WaitMode, WaitOutcome};
use super::service::TaskService;

impl TaskService {
    /// `ids` with each fan-out group id replaced by its tasks (in target order), repeats
    /// dropped. A group with no known task is reported like an unknown task id.
    pub async fn expand_groups(&self, ids: Vec<String>) -> Result<Vec<String>, TaskError> {
        if !ids
            .iter()
            .any(|id| id.starts_with(crate::ids::GROUP_PREFIX))
        {
            return Ok(ids);
        }
        self.restored().await;
        let mut out = Vec::with_capacity(ids.len());
        let mut unknown = Vec::new();
        for id in ids {
            if !id.starts_with(crate::ids::GROUP_PREFIX) {
                out.push(id);
                continue;
            }
            let members = self.registry.group_members(&id);
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

    /// Waits up to `timeout` for the ids (already de-duplicated) to satisfy `mode`, or, given
    /// `known_asks` (the permission asks pending when the caller's wait began), until a task
    /// asks something not among them: nothing moves until someone answers it, so the caller
    /// should hear of it now rather than at the timeout. Never cancels a task; dropping the
    /// future ends only the wait.
    pub async fn wait(
        &self,
        task_ids: &[String],
        mode: WaitMode,
        timeout: Duration,
        include_progress: bool,
        known_asks: Option<&HashSet<String>>,
    ) -> Result<WaitOutcome, TaskError> {
        self.restored().await;
        let deadline = tokio::time::Instant::now() + timeout;
        let mut changes = self.registry.subscribe();
        loop {
            changes.borrow_and_update();
            let tasks = self
                .registry
                .snapshots(task_ids, include_progress, self.stall())
                .map_err(TaskError::UnknownTasks)?;
            let (finished, unfinished): (Vec<_>, Vec<_>) =
                tasks.iter().partition(|t| t.status.is_terminal());
            let done = match mode {
                WaitMode::All => unfinished.is_empty(),
                WaitMode::Any => !finished.is_empty(),
            };
            let asking: Vec<String> = match known_asks {
                Some(known) => unfinished
                    .iter()
                    .filter(|t| {
                        t.permission
                            .as_ref()
                            .is_some_and(|p| !known.contains(&p.id))
                    })
                    .map(|t| t.task_id.clone())
                    .collect(),
                None => Vec::new(),
            };
            let expired = tokio::time::Instant::now() >= deadline;
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
            tokio::select! {
                r = changes.changed() => if r.is_err() { tokio::time::sleep_until(deadline).await },
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }
}

//! Letting finished tasks go: from memory after `memory_ttl`, from disk after `disk_ttl`, and
//! the worktrees of expired records handed back to be cleaned (git is slow and async; the
//! registry's lock is neither).
//!
//! Finished tasks leave memory after `limits.finished_in_memory` (their records stay on disk
//! until `limits.finished_task_ttl`) and are read back by id when asked for, so the number of
//! tasks in memory is bounded by live work, not by a day's history. Nothing is kept per task
//! that left memory: its record's expiry is found again by a sweep of the state directory
//! ([`Registry::sweep_disk`]).

use super::disk::Durability;
use super::registry::{Registry, Tables};
use crate::tasks::lifecycle::record::{TaskRecord, WorkspaceRecord};
use crate::tasks::model::TaskStatus;
use std::time::{Duration, Instant};

/// A task whose record expired while it still had a worktree: the worktree is removed, or kept
/// when its change was never applied (see `workspace::clean_expired`).
#[derive(Debug, Clone, PartialEq)]
pub struct Expired {
    pub task_id: String,
    /// The turn the record held when it expired: a record that holds another turn by the time
    /// the worktree is cleaned was continued by another gateway, which still uses the worktree.
    pub turn: u32,
    pub title: String,
    pub status: TaskStatus,
    pub workspace: WorkspaceRecord,
}

impl Expired {
    /// The worktree of `rec`'s task that outlives its record, if it has one not yet discarded.
    fn of(rec: &TaskRecord) -> Option<Self> {
        let w = rec.workspace.as_ref().filter(|w| !w.discarded)?;
        Some(Self {
            task_id: rec.id.clone(),
            turn: rec.turn,
            title: rec.title.clone(),
            status: rec.status(),
            workspace: w.clone(),
        })
    }
}

/// What one eviction pass did.
#[derive(Debug, Default)]
pub struct Evicted {
    /// Finished tasks that left memory.
    pub left_memory: usize,
    /// Worktrees whose task's record was deleted in this pass.
    pub worktrees: Vec<Expired>,
    /// Records that left memory are due to expire: run [`Registry::sweep_disk`] (and then
    /// nothing else starts one until it is done).
    pub sweep_due: bool,
}

/// The least time between two sweeps of the state directory: a hundredth of the TTL, at least
/// a second.
pub(super) fn sweep_pause(disk_ttl: Duration) -> Duration {
    (disk_ttl / 100).max(Duration::from_secs(1))
}

impl Registry {
    /// Lets finished tasks go: from memory once finished for `memory_ttl` (their records stay
    /// on disk and are read back by id), from disk too once finished for `disk_ttl` (or at
    /// once from memory when there is no store). Records that expire after leaving memory go
    /// in a sweep of the state directory, due when [`Evicted::sweep_due`] says so: the caller
    /// runs [`Self::sweep_disk`] off the runtime. The worktrees of tasks whose records were
    /// deleted are returned: they are the caller's to clean (git is async and slow, this lock
    /// is neither).
    pub fn evict_finished(&self, memory_ttl: Duration, disk_ttl: Duration) -> Evicted {
        let mut t = self.lock();
        let has_store = self.store.is_some();
        let mut unsaved = Vec::new();
        let old: Vec<(String, Instant, bool)> = t
            .tasks
            .values()
            .filter_map(|e| {
                let finished = e.live.finished_at?;
                // The record's life counts from the finish; its stay in memory from last use.
                let expired = finished.elapsed() >= disk_ttl;
                let unused = finished.max(e.live.last_used).elapsed() >= memory_ttl;
                // Only what is on disk leaves memory: a record still queued leaves with a later
                // eviction, one whose write was given up is offered to the writer again (a
                // full disk may have room now) and stays, so its answer is never lost.
                let durable = match &self.store {
                    Some(store) if !expired && unused => match store.durability(&e.rec.id) {
                        Durability::OnDisk => true,
                        Durability::Queued => false,
                        Durability::Unsaved => {
                            unsaved.push(e.rec.clone());
                            false
                        }
                    },
                    _ => true,
                };
                (expired || (has_store && unused && durable))
                    .then(|| (e.rec.id.clone(), finished, expired))
            })
            .collect();
        if let Some(store) = &self.store {
            for rec in unsaved {
                store.submit(rec);
            }
        }
        let mut out = Evicted {
            left_memory: old.len(),
            worktrees: Vec::new(),
            sweep_due: false,
        };
        for (id, finished, expired) in old {
            let Some(e) = t.tasks.remove(&id) else {
                continue;
            };
            t.unindex(&e);
            if expired {
                out.worktrees.extend(self.expire(&mut t, &e.rec));
            } else {
                t.left_on_disk(finished, disk_ttl);
            }
        }
        if !t.sweeping && t.next_sweep.is_some_and(|at| at <= Instant::now()) {
            t.sweeping = true;
            out.sweep_due = true;
        }
        out
    }

    /// Deletes the records on disk that expired (finished `disk_ttl` or longer ago) of tasks
    /// not in memory, and returns their worktrees for the caller to clean. Reads the state
    /// directory (a `stat` per record, see [`Store::expired`]): blocking, so callers run it off
    /// the runtime. The next sweep is due when the next record expires, but at most one sweep
    /// per hundredth of the TTL (15 minutes at a day), so a steady stream of finishes sweeps
    /// a full directory a hundred times a TTL, not once per task; a record expires that much
    /// late at worst.
    pub fn sweep_disk(&self, disk_ttl: Duration) -> Vec<Expired> {
        let Some(store) = &self.store else {
            return Vec::new();
        };
        let now = std::time::SystemTime::now();
        let found = store.expired(disk_ttl, now);
        let mut t = self.lock();
        let mut worktrees = Vec::new();
        let mut expired = 0;
        for rec in found.records {
            // In memory (read back meanwhile): its own eviction decides.
            if t.tasks.contains_key(&rec.id) {
                continue;
            }
            expired += 1;
            worktrees.extend(self.expire(&mut t, &rec));
        }
        tracing::debug!(
            expired,
            "swept the state directory for expired task records"
        );
        let not_before = Instant::now() + sweep_pause(disk_ttl);
        t.next_sweep = found.next.map(|at| {
            let wait = at.duration_since(now).unwrap_or_default();
            (Instant::now() + wait).max(not_before)
        });
        t.sweeping = false;
        worktrees
    }

    /// A sweep that was due did not finish (its thread panicked or was cancelled): the next
    /// one is due after the usual pause, so that records still expire in this gateway rather
    /// than only at the next restart.
    pub fn sweep_failed(&self, disk_ttl: Duration) {
        let mut t = self.lock();
        t.sweeping = false;
        t.next_sweep = Some(Instant::now() + sweep_pause(disk_ttl));
    }

    /// Deletes an expired task's record (as of the turn `rec` holds: see
    /// [`Store::submit_expire`]) and hands back its worktree.
    fn expire(&self, t: &mut Tables, rec: &TaskRecord) -> Option<Expired> {
        t.forget_member(&rec.id);
        if let Some(store) = &self.store {
            store.submit_expire(&rec.id, rec.turn);
        }
        Expired::of(rec)
    }
}

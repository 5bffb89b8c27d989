//! The store's one writer thread: it takes what is due from the queue, applies it (a record
//! written atomically, or removed), records its progress, and wakes those who wait to flush.

use super::disk::{Op, Queued, Shared, StoreError, Writer, RETRY, RETRY_PAUSE, WRITE_RETRIES};
use super::read::{read_record, record_path, ReadError};
use crate::tasks::lifecycle::record::TaskRecord;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// Waits until `applied` reaches what was submitted when the call began.
pub(super) fn flush_shared(shared: &Shared, timeout: Duration) -> Result<(), StoreError> {
    let deadline = Instant::now() + timeout;
    let mut q = shared.lock();
    let target = q.submitted;
    if q.applied < target {
        q.hurry = q.hurry.max(target);
        shared.work.notify_one();
    }
    while q.applied < target {
        if q.writer == Writer::Stopped {
            return Err(StoreError::WriterStopped);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(StoreError::FlushTimedOut {
                waited: timeout,
                pending: q.pending.len() + q.writing.len(),
            });
        }
        q = shared
            .progress
            .wait_timeout(q, left)
            .map(|(q, _)| q)
            .unwrap_or_else(|p| p.into_inner().0);
    }
    // Every failure no flush has reported yet: a write that failed before this call was made
    // (the writer can be quicker than the caller) is reported too.
    let failed = q.failed - q.reported;
    q.reported = q.failed;
    match failed {
        0 => Ok(()),
        failed => Err(StoreError::WritesFailed { failed }),
    }
}

/// Marks the writer stopped and wakes flushers when the writer thread ends, even by a panic.
struct WriterAlive<'a>(&'a Shared);

impl Drop for WriterAlive<'_> {
    fn drop(&mut self) {
        self.0.lock().writer = Writer::Stopped;
        self.0.progress.notify_all();
    }
}

/// The writer thread: takes what is due, applies it, records progress, until closed.
pub(super) fn run_writer(shared: &Shared) {
    let _alive = WriterAlive(shared);
    loop {
        let (batch, upto) = {
            let mut q = shared.lock();
            let now = loop {
                if q.pending.is_empty() {
                    if q.closing {
                        return;
                    }
                    q = shared.work.wait(q).unwrap_or_else(|p| p.into_inner());
                    continue;
                }
                let now = Instant::now();
                let next = q
                    .pending
                    .values()
                    .map(|p| if p.first <= q.hurry { now } else { p.due })
                    .min()
                    .unwrap_or(now);
                if q.closing || next <= now {
                    break now;
                }
                q = shared
                    .work
                    .wait_timeout(q, next - now)
                    .map(|(q, _)| q)
                    .unwrap_or_else(|p| p.into_inner().0);
            };
            let (hurry, closing) = (q.hurry, q.closing);
            let taken: Vec<String> = q
                .pending
                .iter()
                .filter(|(_, p)| closing || p.first <= hurry || p.due <= now)
                .map(|(id, _)| id.clone())
                .collect();
            let batch: HashMap<String, Op> = taken
                .into_iter()
                .filter_map(|id| q.pending.remove_entry(&id))
                .map(|(id, p)| (id, p.op))
                .collect();
            let batch = Arc::new(batch);
            q.writing = batch.clone();
            // Everything submitted so far is on disk once this batch is, except what still
            // waits in the queue (and what it replaced).
            let waiting = q.pending.values().map(|p| p.first).min().unwrap_or(RETRY);
            (batch, q.submitted.min(waiting.saturating_sub(1)))
        };
        let mut failed = Vec::new();
        let mut lost = Vec::new();
        for (id, op) in batch.iter() {
            match apply(&shared.dir, id, op) {
                Ok(()) => {}
                // An id that cannot be a file name never will be: not tried again.
                Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
                    tracing::warn!(task_id = %id, error = %e, "cannot update the task's record in the state directory");
                    lost.push(id.clone());
                }
                Err(e) => {
                    tracing::warn!(task_id = %id, error = %e, "cannot update the task's record in the state directory");
                    failed.push((id.clone(), op.clone()));
                }
            }
        }
        let mut q = shared.lock();
        q.writing = Arc::default();
        q.applied = upto;
        // A flush reports the failures of what was submitted before it; a retry's failure was
        // reported with its first try.
        let first_failures = failed
            .iter()
            .filter(|(id, _)| !q.retries.contains_key(id))
            .count();
        q.failed += (lost.len() + first_failures) as u64;
        for (id, _) in batch.iter() {
            if !failed.iter().any(|(f, _)| f == id) && !lost.contains(id) {
                q.retries.remove(id);
                q.unsaved.remove(id);
            }
        }
        q.unsaved.extend(lost);
        // A failed write is tried again unless a newer one of the same task replaced it: a
        // record lost to a full disk would make the task unknown once it leaves memory.
        let mut requeued = false;
        for (id, op) in failed {
            let tries = q.retries.entry(id.clone()).or_insert(0);
            *tries += 1;
            if *tries > WRITE_RETRIES {
                q.retries.remove(&id);
                tracing::warn!(task_id = %id, "giving up writing the task's record after {WRITE_RETRIES} retries");
                q.unsaved.insert(id);
                continue;
            }
            if let std::collections::hash_map::Entry::Vacant(slot) = q.pending.entry(id) {
                slot.insert(Queued {
                    op,
                    due: Instant::now(),
                    first: RETRY,
                });
                requeued = true;
            }
        }
        drop(q);
        shared.progress.notify_all();
        if requeued {
            // Rest before the next try, unless the store is closing or new work comes in.
            let q = shared.lock();
            if !q.closing {
                drop(shared.work.wait_timeout(q, RETRY_PAUSE));
            }
        }
    }
}

fn apply(dir: &Path, task_id: &str, op: &Op) -> std::io::Result<()> {
    let Some(path) = record_path(dir, task_id) else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("unsafe task id `{task_id}`"),
        ));
    };
    match op {
        Op::Save(record) => write_record(dir, &path, record),
        Op::Remove => remove_record(&path),
        Op::Expire { turn } => match read_record(&path) {
            Ok(on_disk) if on_disk.turn != *turn => {
                tracing::info!(
                    task_id,
                    turn = on_disk.turn,
                    "not expiring a task record another gateway continued"
                );
                Ok(())
            }
            Ok(on_disk) => {
                // What it spent outlives it, for the dashboard's savings over days.
                if let Some(state_dir) = dir.parent() {
                    super::rollup::keep(state_dir, &on_disk);
                }
                remove_record(&path)
            }
            Err(ReadError::Missing) => Ok(()),
            // Unreadable: reported where records are read; not this writer's to judge.
            Err(ReadError::Bad(_)) => Ok(()),
        },
    }
}

fn remove_record(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Writes `record` to `path` atomically and owner-only (see `crate::private_files`, which also
/// says why there is no fsync).
fn write_record(dir: &Path, path: &Path, record: &TaskRecord) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(record).map_err(std::io::Error::other)?;
    // Dated by its finish when finished (see the module notes on expiry).
    crate::private_files::write_atomic(dir, path, &record.id, &bytes, finished_at(record))
}

/// When a finished record's turn finished (the date its file carries); `None` while it runs.
pub(super) fn finished_at(record: &TaskRecord) -> Option<SystemTime> {
    record
        .finished_ms
        .filter(|_| record.status().is_terminal())
        .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms))
}

//! The task store: every task's state on disk, so a restarted gateway still answers for it.
//!
//! **Format: one small JSON file per task** in `<state_dir>/tasks/<task_id>.json`, replaced
//! atomically (written to a temporary file in the same directory, then renamed over the old
//! one; not fsynced, see [`write_record`]). Why not an embedded database: the registry is small
//! (capped by `limits.max_tasks`), is read whole once at start-up, and each task has exactly one
//! writer: the gateway process that owns it. With a file per task, two gateway processes sharing
//! the directory never write the same file, a crash mid-write leaves the previous version intact
//! (rename is atomic), and a corrupt file costs one task rather than the store. A database would
//! add a dependency, a lock shared by every process, and its own recovery story, for none of that.
//!
//! **One ordered writer.** The registry changes a task under its lock and hands the new record to
//! [`Store::submit`] before letting go of it, so records are submitted in the order the states
//! happened. Submitting only enqueues: one writer thread owns the directory and applies the queue,
//! keeping just the newest pending operation per task (a task that changes five times while a
//! write is in flight is written once more, as its latest state). Because every write of a task
//! goes through that one thread in submit order, an older state can never land on top of a newer
//! one, which it could when each caller wrote its own file after releasing the lock. Temporary
//! files get a name no other write shares (pid and a counter), so two writes never interleave in
//! one file either. [`Store::flush`] waits for what was submitted before it: before an answer
//! goes out to a host, and at shutdown.
//!
//! **What is written at once, and what may wait.** The start of a turn (a new task, a
//! continued one) and its end are written as soon as the writer gets to them: those are what a
//! restarted gateway needs to answer for the task. A change in the middle of a turn (running,
//! a permission ask, the newest message, a subagent's session) waits up to [`MID_TURN_DELAY`]
//! for the next change of the same task to replace it: a turn changes several times in its
//! first moments, and a short one ends within that time, so a turn is written two or three
//! times instead of four or five (each write is a file creation and a rename: on a fan-out of
//! short tasks those were a fifth of the gateway's CPU, on two cores shared with OpenCode). Nothing of the
//! kind is lost for good by a crash in that second: a restarted gateway reads the turn's state
//! back from OpenCode. A flush writes everything queued, waiting or not.
//!
//! The records describe what the user's agents did in their repositories: the directory is
//! created `0700` and each record `0600`, with those modes at creation, so there is no moment in
//! which another local user could read them.
//!
//! Ownership: each record names the pid of the gateway that wrote it, and each open store holds
//! that gateway's owner lock (`owner.rs`). At start-up a gateway skips unfinished tasks whose
//! owner is still alive (another gateway's live work) and takes over the rest.
//!
//! **A finished record is dated by its finish**: its file's modification time is set to the
//! turn's finish, so expiry (`limits.finished_task_ttl`, counted from the finish) can be found
//! by listing the directory ([`Store::expired`]) instead of the gateway keeping a note per task
//! that left memory: a day of finished tasks costs the gateway no memory at all. Only files
//! whose date says they expired are opened, and each is checked against its own `finished_ms`,
//! so a file dated otherwise (copied, touched, written by an older gateway) can only expire
//! late, never early.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use super::owner::OwnerLock;
use crate::tasks::lifecycle::record::TaskRecord;
use crate::tasks::model::TaskStatus;
use crate::tasks::store::usage::TaskSummary;

use super::read::{read_dir_records, read_record, record_path, ReadError};
pub use super::read::{read_stored, read_summaries, Stored};
use super::writer::{finished_at, flush_shared, run_writer};

/// How long the gateway waits at exit for queued records to reach the disk. Writes take well
/// under a millisecond each, so this only matters when the disk itself is stuck.
pub const SHUTDOWN_FLUSH: Duration = Duration::from_secs(2);
/// How long dropping the last handle on a [`Store`] waits for its queue to reach the disk. The
/// gateway flushes explicitly at shutdown; this only bounds the backstop.
const DROP_FLUSH: Duration = Duration::from_secs(2);

/// Why the store could not confirm that submitted records are on disk.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the task store did not reach the disk within {}s ({pending} operation(s) still queued)", .waited.as_secs_f32())]
    FlushTimedOut { waited: Duration, pending: usize },
    #[error(
        "{failed} task record write(s) failed while flushing (see the warnings logged for each)"
    )]
    WritesFailed { failed: u64 },
    #[error("the task store's writer thread has stopped")]
    WriterStopped,
}

/// How long a change in the middle of a turn may wait in the queue for a newer one of the same
/// task (see the module notes).
pub const MID_TURN_DELAY: Duration = Duration::from_secs(1);

/// Whether a task's newest state has reached the disk ([`Store::durability`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    OnDisk,
    /// Queued or being written: on disk shortly.
    Queued,
    /// Its write failed for good (or the writer stopped): the file holds an older state.
    Unsaved,
}

/// What the writer does to one task's file.
#[derive(Debug, Clone)]
pub(super) enum Op {
    Save(Box<TaskRecord>),
    Remove,
    /// Remove the record only if the file still holds turn `turn`: a record expired by this
    /// gateway may meanwhile have been continued by another one sharing the state directory,
    /// whose newer turn must survive.
    Expire {
        turn: u32,
    },
}

impl Op {
    /// A save in the middle of a turn: it may wait for the next change (see the module notes).
    pub(super) fn may_wait(&self) -> bool {
        matches!(self, Op::Save(record) if matches!(
            record.status(),
            TaskStatus::Running | TaskStatus::WaitingPermission
        ))
    }
}

/// One task's queued operation.
pub(super) struct Queued {
    pub(super) op: Op,
    /// When the writer takes it at the latest.
    pub(super) due: Instant,
    /// The sequence number of the oldest operation it stands for (the ones it replaced are
    /// not on disk either), which holds back `applied`; `RETRY` for a failed write queued again,
    /// which holds back no flush (its failure was reported).
    pub(super) first: u64,
}

/// [`Queued::first`] of a failed write tried again.
pub(super) const RETRY: u64 = u64::MAX;

/// How often a failed write is tried again (a full disk may free up), and how long the writer
/// rests before each new try, so that a disk that stays full costs nothing.
pub(super) const WRITE_RETRIES: u32 = 5;
pub(super) const RETRY_PAUSE: Duration = Duration::from_secs(1);

/// The writer's queue, shared with every handle.
#[derive(Default)]
pub(super) struct Queue {
    /// The newest operation per task not yet taken by the writer.
    pub(super) pending: HashMap<String, Queued>,
    /// The batch the writer is applying now, so [`Store::load`] still sees those records while
    /// they are between the queue and the disk.
    pub(super) writing: Arc<HashMap<String, Op>>,
    /// Operations submitted so far (a sequence number).
    pub(super) submitted: u64,
    /// Every operation up to this sequence number has been applied (or replaced by a later one
    /// that has).
    pub(super) applied: u64,
    /// Writes that failed, in total (each once, at its first try).
    pub(super) failed: u64,
    /// How many of those a flush has already reported.
    pub(super) reported: u64,
    /// A flush waits for everything up to this sequence number: the writer takes it at once,
    /// whether or not it could wait.
    pub(super) hurry: u64,
    /// Tries so far of the writes that failed and are queued again, by task.
    pub(super) retries: HashMap<String, u32>,
    /// Tasks whose newest operation could not be applied and is no longer queued (given up
    /// after [`WRITE_RETRIES`], or never writable, or the writer stopped): their record on disk
    /// is older than what the gateway holds.
    pub(super) unsaved: std::collections::HashSet<String>,
    /// The last handle is gone: drain and stop.
    pub(super) closing: bool,
    /// The writer thread's state.
    pub(super) writer: Writer,
}

/// The writer thread starts with the first write, not when the store opens: a gateway that is
/// only asked for its tools (or only reads old tasks) never needs it, and its start was on the
/// path to the `initialize` reply.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) enum Writer {
    #[default]
    NotStarted,
    Running,
    /// Ended (or could not be started); changes are no longer saved.
    Stopped,
}

pub(super) struct Shared {
    pub(super) dir: PathBuf,
    pub(super) queue: Mutex<Queue>,
    /// Wakes the writer (work, or closing).
    pub(super) work: Condvar,
    /// Wakes flushers (the writer applied a batch, or stopped).
    pub(super) progress: Condvar,
}

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, Queue> {
        // The queue is plain data, consistent after every statement: a panic elsewhere while
        // holding the lock leaves nothing half-done.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Closes the queue when the last [`Store`] handle goes, after a bounded flush.
pub(super) struct Handle {
    shared: Arc<Shared>,
    /// The state directory, where the owner locks live.
    state_dir: PathBuf,
    /// This gateway's owner lock, held while the store is open (see `owner.rs`); `None` if it
    /// could not be taken (then other gateways fall back to the process table).
    _owner: Option<OwnerLock>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        if let Err(e) = flush_shared(&self.shared, DROP_FLUSH) {
            tracing::warn!(error = %e, "task records may be missing from the state directory");
        }
        self.shared.lock().closing = true;
        self.shared.work.notify_all();
    }
}

/// The directory of task files and its one writer. Cloning is cheap and shares the writer.
#[derive(Clone)]
pub struct Store {
    handle: Arc<Handle>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("dir", &self.handle.shared.dir)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Opens (creating) `<state_dir>/tasks`; its writer thread starts with the first write.
    ///
    /// Directories created here are `0700`; an existing `tasks` directory that others can read
    /// is tightened to `0700` (it is ours alone). `state_dir` itself is left as it is when it
    /// already exists: the user may have pointed it at a directory with other uses.
    pub fn open(state_dir: &Path) -> std::io::Result<Self> {
        let dir = state_dir.join("tasks");
        create_private_dir(&dir)?;
        let shared = Arc::new(Shared {
            dir,
            queue: Mutex::new(Queue::default()),
            work: Condvar::new(),
            progress: Condvar::new(),
        });
        let owner = OwnerLock::acquire(state_dir)
            .inspect_err(|e| {
                tracing::warn!(
                    error = %e,
                    "cannot take this gateway's owner lock; other gateways sharing the state \
                     directory may take its running tasks for a dead gateway's"
                )
            })
            .ok();
        Ok(Self {
            handle: Arc::new(Handle {
                shared,
                state_dir: state_dir.to_path_buf(),
                _owner: owner,
            }),
        })
    }

    /// The state directory the store keeps its records in.
    pub fn state_dir(&self) -> &Path {
        &self.handle.state_dir
    }

    /// Whether the gateway `pid` that wrote a record is still running (its owner lock is held).
    pub fn owner_alive(&self, pid: u32) -> bool {
        super::owner::alive(&self.handle.state_dir, pid)
    }

    fn shared(&self) -> &Shared {
        &self.handle.shared
    }

    /// Queues `record` to be written; returns at once. Call it while still holding the lock
    /// under which the record's state was decided, so that submit order is state order.
    pub fn submit(&self, record: TaskRecord) {
        let id = record.id.clone();
        self.enqueue(id, Op::Save(Box::new(record)));
    }

    /// Queues the removal of a task's record; returns at once. Ordered with [`Self::submit`]: a
    /// removal submitted after a save wins, a save submitted after a removal recreates the file.
    pub fn submit_remove(&self, task_id: &str) {
        self.enqueue(task_id.to_string(), Op::Remove);
    }

    /// Queues the removal of an expired task's record, as of its turn `turn`: the file is left
    /// alone if it holds another turn by then (another gateway on the same state directory
    /// continued the task).
    pub fn submit_expire(&self, task_id: &str, turn: u32) {
        self.enqueue(task_id.to_string(), Op::Expire { turn });
    }

    fn enqueue(&self, id: String, op: Op) {
        let shared = self.shared();
        let mut q = shared.lock();
        if q.writer == Writer::NotStarted {
            // Under the queue lock, so only one caller starts it; the thread's first act is to
            // take that lock, so it waits for this operation to be queued.
            let writer = self.handle.shared.clone();
            q.writer = match std::thread::Builder::new()
                .name("opencode-mcp-store".into())
                .spawn(move || run_writer(&writer))
            {
                Ok(_) => Writer::Running,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot start the task store's writer thread");
                    Writer::Stopped
                }
            };
        }
        if q.writer == Writer::Stopped {
            q.unsaved.insert(id.clone());
            drop(q);
            tracing::warn!(task_id = %id, "the task store's writer has stopped; this change is not saved");
            return;
        }
        q.submitted += 1;
        let seq = q.submitted;
        let now = Instant::now();
        let wait = op.may_wait();
        let due = if wait { now + MID_TURN_DELAY } else { now };
        let was_idle = q.pending.is_empty();
        let queued = match q.pending.remove(&id) {
            // A write already due never waits longer for being replaced.
            Some(old) => Queued {
                op,
                due: old.due.min(due),
                first: old.first.min(seq),
            },
            None => Queued {
                op,
                due,
                first: seq,
            },
        };
        q.pending.insert(id, queued);
        drop(q);
        // A writer asleep until an earlier write falls due needs no wake-up for a later one.
        if !wait || was_idle {
            shared.work.notify_one();
        }
    }

    /// Whether the task's newest state is on disk: nothing of it still queued or being written,
    /// and its last write not given up. What is not durable must stay in memory, or its answer
    /// would be gone once it left.
    pub fn durability(&self, task_id: &str) -> Durability {
        let q = self.shared().lock();
        if q.pending.contains_key(task_id) || q.writing.contains_key(task_id) {
            Durability::Queued
        } else if q.unsaved.contains(task_id) {
            Durability::Unsaved
        } else {
            Durability::OnDisk
        }
    }

    /// Waits until everything submitted before this call is on disk, at most `timeout`. Blocks
    /// the calling thread; async code uses [`Self::flush`].
    pub fn flush_blocking(&self, timeout: Duration) -> Result<(), StoreError> {
        flush_shared(self.shared(), timeout)
    }

    /// [`Self::flush_blocking`] on a blocking thread; at once, with no thread, when everything
    /// submitted is already written (the common case of a read that changed nothing).
    pub async fn flush(&self, timeout: Duration) -> Result<(), StoreError> {
        // With nothing left to write and no failure left to report, nothing to wait for: no
        // blocking thread (decided under the one lock, so no submit can slip in between).
        {
            let q = self.shared().lock();
            if q.applied >= q.submitted && q.failed == q.reported {
                return Ok(());
            }
        }
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.flush_blocking(timeout))
            .await
            .map_err(|_| StoreError::WriterStopped)?
    }

    /// The task's newest record: one still queued if there is one (so a task evicted from memory
    /// right after a change reads back as that change), else the file. `None` when there is no
    /// such task; an unreadable file is logged and also `None`.
    pub fn load(&self, task_id: &str) -> Option<TaskRecord> {
        let path = record_path(&self.shared().dir, task_id)?;
        if let Some(queued) = self.queued(task_id, |op| match op {
            Op::Save(record) => Some(TaskRecord::clone(record)),
            Op::Remove | Op::Expire { .. } => None,
        }) {
            return queued;
        }
        match read_record(&path) {
            Ok(record) => Some(record),
            Err(ReadError::Missing) => None,
            Err(ReadError::Bad(why)) => {
                tracing::warn!(path = %path.display(), %why, "cannot read a task record");
                None
            }
        }
    }

    /// Whether the task has a record: one queued (not a removal), or a file. A `stat`, not a
    /// read: for checks over many tasks that need no record.
    pub fn holds(&self, task_id: &str) -> bool {
        let Some(path) = record_path(&self.shared().dir, task_id) else {
            return false;
        };
        self.queued(task_id, |op| matches!(op, Op::Save(_)))
            .unwrap_or_else(|| path.is_file())
    }

    /// What `read` makes of the task's newest operation still queued or being written, if
    /// there is one: that is newer than the file.
    fn queued<R>(&self, task_id: &str, read: impl FnOnce(&Op) -> R) -> Option<R> {
        let q = self.shared().lock();
        q.pending
            .get(task_id)
            .map(|p| &p.op)
            .or_else(|| q.writing.get(task_id))
            .map(read)
    }

    /// Every readable record on disk; unreadable files are reported (path, reason) and left in
    /// place. Reads the directory as it is: call it before submitting (at start-up), or flush.
    #[cfg(test)]
    pub fn load_all(&self) -> (Vec<TaskRecord>, Vec<(PathBuf, String)>) {
        read_dir_records(&self.shared().dir, |r| r)
    }

    /// [`Self::load_all`], keeping of each record only its [`TaskSummary`]: one record is held
    /// at a time, however many the directory keeps.
    pub fn summaries(&self) -> (Vec<TaskSummary>, Vec<(PathBuf, String)>) {
        self.load_each(|r| TaskSummary::from(&r))
    }

    /// [`Self::load_all`], keeping of each record what `keep` makes of it: one record is held
    /// at a time, however many the directory keeps.
    pub fn load_each<T>(
        &self,
        keep: impl FnMut(TaskRecord) -> T,
    ) -> (Vec<T>, Vec<(PathBuf, String)>) {
        read_dir_records(&self.shared().dir, keep)
    }

    /// The finished records that expired by `now` (finished `ttl` or longer ago), newest state
    /// first (a queued write wins over the file, as in [`Self::load`]), and when the next of
    /// the others is due. Lists the directory and opens only the files dated as expired (see
    /// the module notes), so it costs a `stat` per record. Blocking: call it off the runtime.
    pub fn expired(&self, ttl: Duration, now: SystemTime) -> Expiring {
        let mut out = Expiring::default();
        let Ok(dir) = std::fs::read_dir(&self.shared().dir) else {
            return out;
        };
        let due =
            |finished: SystemTime| finished.checked_add(ttl).unwrap_or(SystemTime::UNIX_EPOCH);
        for entry in dir.flatten() {
            let name = entry.file_name();
            let Some(id) = name.to_str().and_then(|n| n.strip_suffix(".json")) else {
                continue;
            };
            let Ok(dated) = entry.metadata().and_then(|m| m.modified()) else {
                continue;
            };
            if due(dated) > now {
                out.next = Some(out.next.map_or(due(dated), |n| n.min(due(dated))));
                continue;
            }
            let Some(record) = self.load(id) else {
                continue;
            };
            match finished_at(&record) {
                Some(at) if due(at) <= now => out.records.push(record),
                Some(at) => out.next = Some(out.next.map_or(due(at), |n| n.min(due(at)))),
                // Running (another gateway's, or continued since): not expiring.
                None => {}
            }
        }
        out
    }
}

/// What [`Store::expired`] found.
#[derive(Debug, Default)]
pub struct Expiring {
    pub records: Vec<TaskRecord>,
    /// When the next record on disk expires, as far as the directory says (a running task's
    /// file counts by its date: at worst a look that finds nothing).
    pub next: Option<SystemTime>,
}

/// Creates `dir` as `0700` (see `crate::private_files`), saying so when it had to be tightened.
pub(in crate::tasks) fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    if let Some(mode) = crate::private_files::create_dir(dir)? {
        tracing::info!(dir = %dir.display(), mode = format!("{mode:o}"), "restricting a state directory to its owner (0700)");
    }
    Ok(())
}

/// The state directory a gateway with `config` uses: its `state_dir`, else [`default_state_dir`].
pub fn state_dir_of(config: &crate::config::Config) -> Option<PathBuf> {
    config
        .state_dir
        .as_ref()
        .map(PathBuf::from)
        .or_else(default_state_dir)
}

/// `$XDG_STATE_HOME/opencode-mcp`, else `$HOME/.local/state/opencode-mcp` (a relative
/// `XDG_STATE_HOME` is ignored: see [`crate::config::xdg_dir`]).
pub fn default_state_dir() -> Option<PathBuf> {
    crate::config::xdg_dir("XDG_STATE_HOME", ".local/state")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    use crate::tasks::lifecycle::turn::TurnState;
    use crate::tasks::model::TaskStatus;

    fn completed() -> TaskRecord {
        let mut r = TaskRecord::new(
            "tsk_abc".into(),
            "srv_1".into(),
            "ses_1".into(),
            "/w".into(),
            "title".into(),
        );
        r.server_url = "http://127.0.0.1:1".into();
        r.managed = true;
        r.begin_turn_for_test("msg_1".into(), Some("build".into()), None);
        r.finish_for_test(TaskStatus::Completed, None);
        r.outcome = Some(TurnState {
            text: "done".into(),
            finished: true,
            ..TurnState::default()
        });
        r
    }

    /// A fresh state directory under the system temp dir, removed on drop.
    struct TempState(PathBuf);

    impl TempState {
        fn new() -> Self {
            Self(std::env::temp_dir().join(format!("ocm-store-{}", crate::ids::task_id())))
        }
    }

    impl Drop for TempState {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    const FLUSH: Duration = Duration::from_secs(10);

    fn files(store: &Store) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&store.shared().dir)
            .expect("read dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    fn record(id: &str, turn: u32) -> TaskRecord {
        let mut r = completed();
        r.id = id.to_string();
        r.turn = turn;
        r
    }

    /// Reads `path` over and over until `stop`, returning the turns seen in order, or the first
    /// read that was not a whole record. (Absent only counts before the first record appears.)
    fn watch_file(
        path: PathBuf,
        stop: Arc<std::sync::atomic::AtomicBool>,
    ) -> std::thread::JoinHandle<Result<Vec<u32>, String>> {
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                match read_record(&path) {
                    Ok(r) => seen.push(r.turn),
                    Err(ReadError::Missing) if seen.is_empty() => {}
                    Err(ReadError::Missing) => return Err("the record vanished".into()),
                    Err(ReadError::Bad(why)) => return Err(format!("a torn record: {why}")),
                }
            }
            Ok(seen)
        })
    }

    /// `holds` answers as `load` would, queued or written, without reading the record.
    #[test]
    fn a_task_is_held_while_it_has_a_record() {
        let state = TempState::new();
        let store = Store::open(&state.0).expect("open");
        assert!(!store.holds("tsk_abc"));
        store.submit(completed());
        assert!(store.holds("tsk_abc"), "queued");
        store.flush_blocking(FLUSH).expect("flush");
        assert!(store.holds("tsk_abc"), "on disk");
        store.submit_remove("tsk_abc");
        assert!(!store.holds("tsk_abc"), "a removal queued");
        store.flush_blocking(FLUSH).expect("flush");
        assert!(!store.holds("tsk_abc"), "removed");
        assert!(!store.holds("../escape"), "not an id");
    }

    #[test]
    fn records_round_trip_through_disk() {
        let state = TempState::new();
        let store = Store::open(&state.0).expect("open");
        let stored = completed();
        store.submit(stored.clone());
        store.submit(stored.clone());
        store.flush_blocking(FLUSH).expect("flush");
        let (all, bad) = store.load_all();
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!(all, vec![stored.clone()]);
        // The report and the list read the same files, keeping only summaries.
        let (summaries, bad) = store.summaries();
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!(summaries, vec![TaskSummary::from(&stored)]);
        assert_eq!(
            summaries[0].latest.as_ref().map(|l| l.tokens),
            stored.outcome.as_ref().map(|o| o.tokens)
        );
        assert_eq!(store.load("tsk_abc"), Some(stored));
        let back = all[0].clone();
        assert_eq!(back.status(), TaskStatus::Completed);
        assert_eq!(back.outcome.map(|o| o.text).as_deref(), Some("done"));
        assert!(back.finished_ms.is_some());
        store.submit_remove("tsk_abc");
        store.flush_blocking(FLUSH).expect("flush");
        assert!(store.load_all().0.is_empty());
        assert_eq!(store.load("tsk_abc"), None);
    }

    /// Writers that each decide a version under one lock (as the registry does) and submit it
    /// before releasing the lock: the file ends as the last version decided. With a write per
    /// caller after the lock (and one shared temporary name), an older version could land last,
    /// or a rename could find its temporary file already taken by another writer.
    #[test]
    fn the_last_submitted_version_wins_under_concurrency() {
        let state = TempState::new();
        let store = Store::open(&state.0).expect("open");
        let decided = Arc::new(Mutex::new(0u32));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let store = store.clone();
                let decided = decided.clone();
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        let mut turn = decided.lock().expect("lock");
                        *turn += 1;
                        store.submit(record("tsk_same", *turn));
                        // Another task in between, so batches mix ids.
                        store.submit(record(&format!("tsk_other{}", *turn % 3), *turn));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        store.flush_blocking(FLUSH).expect("flush");
        let last = *decided.lock().expect("lock");
        assert_eq!(last, 1600);
        let on_disk = read_record(&state.0.join("tasks/tsk_same.json"))
            .ok()
            .expect("record on disk");
        assert_eq!(on_disk.turn, last);
        assert_eq!(
            files(&store),
            [
                "tsk_other0.json",
                "tsk_other1.json",
                "tsk_other2.json",
                "tsk_same.json"
            ],
            "no temporary files are left behind"
        );
    }

    /// Writers with no order between them: every write succeeds and the file is always one
    /// whole record. With one temporary name per (task, pid), two writers truncated and wrote the
    /// same file, and the second rename found it gone.
    #[test]
    fn concurrent_writers_never_share_a_temporary_file() {
        let state = TempState::new();
        let store = Store::open(&state.0).expect("open");
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let watcher = watch_file(state.0.join("tasks/tsk_raced.json"), stop.clone());
        let threads: Vec<_> = (0..8)
            .map(|n| {
                let store = store.clone();
                std::thread::spawn(move || {
                    for i in 0..200 {
                        store.submit(record("tsk_raced", n * 1000 + i));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        store.flush_blocking(FLUSH).expect("every write succeeded");
        stop.store(true, Ordering::Relaxed);
        watcher
            .join()
            .expect("watcher")
            .expect("only whole records");
        let (all, bad) = store.load_all();
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!(all.len(), 1);
        assert_eq!(files(&store), ["tsk_raced.json"]);
    }

    /// The registry end to end: while concurrent updates of one task run, the file only moves
    /// forward, and it ends in the registry's final state. Saving after the registry lock was
    /// released let an older state land over a newer one.
    #[test]
    fn the_disk_ends_in_the_registrys_final_state() {
        use super::super::registry::Registry;
        let state = TempState::new();
        let store = Store::open(&state.0).expect("open");
        let registry = Arc::new(Registry::new(Some(store.clone())));
        registry.insert(crate::tasks::lifecycle::entry::TaskEntry::new(completed()));
        store.flush_blocking(FLUSH).expect("flush");
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let watcher = watch_file(state.0.join("tasks/tsk_abc.json"), stop.clone());
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let registry = registry.clone();
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        registry.update("tsk_abc", |e| e.rec.turn += 1);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        store.flush_blocking(FLUSH).expect("flush");
        stop.store(true, Ordering::Relaxed);
        let seen = watcher
            .join()
            .expect("watcher")
            .expect("only whole records");
        assert!(
            seen.windows(2).all(|w| w[0] <= w[1]),
            "the record went back to an older state"
        );
        let in_memory = registry.get("tsk_abc").map(|e| e.rec.turn);
        let on_disk = read_record(&state.0.join("tasks/tsk_abc.json"))
            .ok()
            .map(|r| r.turn);
        assert_eq!(in_memory, Some(1601));
        assert_eq!(on_disk, in_memory);
        registry.remove("tsk_abc");
        store.flush_blocking(FLUSH).expect("flush");
        assert!(files(&store).is_empty());
    }

    #[test]
    fn a_remove_after_a_save_wins_and_a_save_after_a_remove_recreates() {
        let state = TempState::new();
        let store = Store::open(&state.0).expect("open");
        store.submit(record("tsk_gone", 1));
        store.submit_remove("tsk_gone");
        store.submit(record("tsk_back", 1));
        store.flush_blocking(FLUSH).expect("flush");
        store.submit_remove("tsk_back");
        store.submit(record("tsk_back", 2));
        store.flush_blocking(FLUSH).expect("flush");
        assert_eq!(files(&store), ["tsk_back.json"]);
        assert_eq!(store.load("tsk_gone"), None);
        assert_eq!(store.load("tsk_back").map(|r| r.turn), Some(2));
    }

    /// Flush returns only once every record submitted before it is a complete file, read here
    /// straight from disk (not through `load`, which also sees the queue).
    #[test]
    fn flush_waits_for_everything_submitted_before_it() {
        let state = TempState::new();
        let store = Store::open(&state.0).expect("open");
        for i in 0..300 {
            store.submit(record(&format!("tsk_{i}"), i));
        }
        store.flush_blocking(FLUSH).expect("flush");
        for i in 0..300 {
            let r = read_record(&state.0.join(format!("tasks/tsk_{i}.json")))
                .ok()
                .expect("on disk after flush");
            assert_eq!(r.turn, i);
        }
    }

    fn mid_turn(id: &str, turn: u32) -> TaskRecord {
        let mut r = record(id, turn);
        r.set_status_for_test(TaskStatus::Running);
        r.finished_ms = None;
        r
    }

    fn due_in(store: &Store, id: &str) -> Option<Duration> {
        let q = store.shared().lock();
        q.pending
            .get(id)
            .map(|p| p.due.saturating_duration_since(Instant::now()))
    }

    /// A change in the middle of a turn waits in the queue (for a newer one to replace it),
    /// the start and the end of a turn do not, and a waiting write is not postponed further by
    /// the next change, nor does it hold back a write that was already due.
    #[test]
    fn a_change_mid_turn_waits_and_the_end_of_a_turn_does_not() {
        let state = TempState::new();
        let store = Store::open(&state.0).expect("open");
        store.submit(mid_turn("tsk_mid", 1));
        let first = due_in(&store, "tsk_mid").expect("a mid-turn write waits in the queue");
        assert!(
            first > Duration::ZERO && first <= MID_TURN_DELAY,
            "{first:?}"
        );
        store.submit(mid_turn("tsk_mid", 2));
        let second = due_in(&store, "tsk_mid").expect("still queued");
        assert!(
            second <= first,
            "replacing it postponed the write: {second:?} > {first:?}"
        );
        // The end of the turn replaces it and is due at once.
        store.submit(record("tsk_mid", 3));
        assert!(due_in(&store, "tsk_mid").is_none_or(|d| d.is_zero()));
        store.flush_blocking(FLUSH).expect("flush");
        let on_disk = read_record(&state.0.join("tasks/tsk_mid.json")).ok();
        assert_eq!(on_disk.map(|r| r.turn), Some(3));
    }

    /// A waiting write reaches the disk by itself, without a flush.
    #[test]
    fn a_waiting_write_is_written_without_a_flush() {
        let state = TempState::new();
        let store = Store::open(&state.0).expect("open");
        store.submit(mid_turn("tsk_late", 4));
        let path = state.0.join("tasks/tsk_late.json");
        let deadline = Instant::now() + FLUSH;
        let turn = loop {
            if let Ok(r) = read_record(&path) {
                break r.turn;
            }
            assert!(
                Instant::now() < deadline,
                "a waiting write never reached the disk"
            );
            std::thread::yield_now();
        };
        assert_eq!(turn, 4);
    }

    /// A flush writes what waits too, at once: its timeout here is shorter than the wait, so
    /// a flush that only waited for the write to fall due would fail. What was submitted after
    /// the flush began is not its concern.
    #[test]
    fn a_flush_does_not_wait_for_a_waiting_write_to_fall_due() {
        let state = TempState::new();
        let store = Store::open(&state.0).expect("open");
        store.submit(mid_turn("tsk_a", 1));
        store.submit(record("tsk_b", 2));
        store
            .flush_blocking(MID_TURN_DELAY / 2)
            .expect("the flush wrote the waiting record at once");
        for (id, turn) in [("tsk_a", 1), ("tsk_b", 2)] {
            let r = read_record(&state.0.join(format!("tasks/{id}.json"))).ok();
            assert_eq!(r.map(|r| r.turn), Some(turn), "{id}");
        }
    }

    #[tokio::test]
    async fn the_async_flush_waits_too() {
        let state = TempState::new();
        let store = Store::open(&state.0).expect("open");
        store.submit(record("tsk_async", 7));
        store.flush(FLUSH).await.expect("flush");
        let r = read_record(&state.0.join("tasks/tsk_async.json")).ok();
        assert_eq!(r.map(|r| r.turn), Some(7));
    }

    #[test]
    fn a_failed_write_is_reported_by_flush() {
        let state = TempState::new();
        let store = Store::open(&state.0).expect("open");
        store.submit(record("../escape", 1));
        assert!(matches!(
            store.flush_blocking(FLUSH),
            Err(StoreError::WritesFailed { failed: 1 })
        ));
        store.submit(record("tsk_fine", 1));
        store.flush_blocking(FLUSH).expect("a later flush is clean");
    }

    /// A write that failed (a full disk, here a record whose path is a directory for a while)
    /// is tried again and lands once the way is clear, unless a newer record replaced it.
    #[test]
    fn a_failed_write_is_tried_again() {
        let state = TempState::new();
        let store = Store::open(&state.0).expect("open");
        let blocker = state.0.join("tasks/tsk_retry.json");
        std::fs::create_dir_all(blocker.join("x")).expect("a directory where the record goes");
        store.submit(record("tsk_retry", 3));
        assert!(matches!(
            store.flush_blocking(FLUSH),
            Err(StoreError::WritesFailed { failed: 1 })
        ));
        std::fs::remove_dir_all(&blocker).expect("clear the way");
        // On disk, not only queued (load also sees queued records).
        let start = Instant::now();
        while read_record(&blocker).ok().map(|r| r.turn) != Some(3) {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the record was never written again"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    #[test]
    fn corrupt_and_torn_files_are_reported_not_fatal() {
        let state = TempState::new();
        let store = Store::open(&state.0).expect("open");
        let dir = state.0.join("tasks");
        std::fs::write(dir.join("tsk_bad.json"), b"{not json").expect("write");
        // A record cut off mid-write, as a non-atomic writer could leave it.
        let whole = serde_json::to_vec(&record("tsk_torn", 1)).expect("json");
        std::fs::write(dir.join("tsk_torn.json"), &whole[..whole.len() / 2]).expect("write");
        store.submit(completed());
        store.flush_blocking(FLUSH).expect("flush");
        let (all, bad) = store.load_all();
        assert_eq!(all.len(), 1);
        let mut bad: Vec<String> = bad
            .iter()
            .filter_map(|(p, _)| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect();
        bad.sort();
        assert_eq!(bad, ["tsk_bad.json", "tsk_torn.json"]);
        assert_eq!(store.load("tsk_torn"), None);
    }

    #[cfg(unix)]
    #[test]
    fn the_directory_and_records_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
        let state = TempState::new();
        let store = Store::open(&state.0).expect("open");
        store.submit(record("tsk_private", 1));
        store.flush_blocking(FLUSH).expect("flush");
        let dir = state.0.join("tasks");
        assert_eq!(mode(&state.0), 0o700);
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("tsk_private.json")), 0o600);
        drop(store);
        // An existing directory others can read is tightened.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let _store = Store::open(&state.0).expect("reopen");
        assert_eq!(mode(&dir), 0o700);
    }

    #[test]
    fn dropping_the_last_handle_flushes_its_queue() {
        let state = TempState::new();
        let store = Store::open(&state.0).expect("open");
        let other = store.clone();
        store.submit(record("tsk_dropped", 3));
        drop(store);
        drop(other);
        let r = read_record(&state.0.join("tasks/tsk_dropped.json")).ok();
        assert_eq!(r.map(|r| r.turn), Some(3));
    }

    #[test]
    fn unsafe_ids_never_become_paths() {
        let dir = Path::new("/nonexistent");
        assert!(record_path(dir, "../etc/passwd").is_none());
        assert!(record_path(dir, "").is_none());
        assert!(record_path(dir, "tsk_ok").is_some());
    }

    #[test]
    fn only_live_gateways_count_as_owners() {
        let state = TempState::new();
        let store = Store::open(&state.0).expect("open");
        assert!(store.owner_alive(std::process::id()));
        assert!(!store.owner_alive(u32::MAX - 1));
    }
}

//! The task registry: the tasks the gateway tracks, the one place status, wait and result read
//! from, and the change signal waiters sleep on.
//!
//! Every change of a task goes through [`Registry::update`]: one closure under one lock, so a
//! decision ("the turn is over", "this continue opens turn 3", "this abort claims the turn") and
//! its effect are one atomic step. A change to the durable record is handed to the store while
//! the lock is still held, so the order on disk is the order of the changes. Waiters are woken
//! only when something they can observe changes (status, turn, permission), not on every
//! streamed token.
//!
//! Finished tasks leave memory, then disk, as `expiry.rs` says. The day's spend is in the
//! ledger (`spend/ledger.rs`), which every change of a task's spend reaches from here. A task's
//! own state and its transitions are the lifecycle's.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::disk::Store;
use crate::tasks::lifecycle::entry::{observable, TaskEntry};
use crate::tasks::lifecycle::record::{GroupMember, TaskRecord};
use crate::tasks::model::{TaskSnapshot, TaskStatus};
use crate::tasks::spend::ledger::Ledger;
use crate::tasks::store::usage::TaskSummary;

/// A session the registry knows: the task's own, or a subagent's child session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionOwner {
    pub task_id: String,
    pub child: bool,
}

#[derive(Default)]
pub(super) struct Tables {
    /// Boxed: an entry is about 2 KB, and a table of them inline would be one allocation of
    /// (capacity x 2 KB) that doubles as tasks arrive (4 MiB at 1,000 tasks, half of it empty
    /// slots), copied whole at each growth.
    pub(super) tasks: HashMap<String, Box<TaskEntry>>,
    pub(super) by_session: HashMap<String, SessionOwner>,
    /// When the next record that left memory expires, if any did: the state directory is swept
    /// then ([`Registry::sweep_disk`]). Records on disk cost no memory per task: the sweep
    /// finds them by their files' dates (see `store`).
    pub(super) next_sweep: Option<Instant>,
    /// A sweep is running (on a blocking thread): no second one is started meanwhile.
    pub(super) sweeping: bool,
    /// Fan-out groups: id -> (target index, task id) of every member whose record exists, in
    /// memory or only on disk. A group outlives its members' stay in memory (a finished answer
    /// leaves memory long before a slower sibling finishes), and goes with their records.
    pub(super) groups: HashMap<String, Vec<(u32, String)>>,
}

impl Tables {
    /// A finished task, out of memory, whose record stays on disk: what is kept of it is when
    /// its record is due to expire (`finished` + `disk_ttl`).
    pub(super) fn left_on_disk(&mut self, finished: Instant, disk_ttl: Duration) {
        let due = finished + disk_ttl;
        self.next_sweep = Some(self.next_sweep.map_or(due, |at| at.min(due)));
    }

    /// Makes `task_id` a member of its fan-out group (once).
    fn join_group(&mut self, task_id: &str, g: &GroupMember) {
        let members = self.groups.entry(g.id.clone()).or_default();
        if !members.iter().any(|(_, id)| id == task_id) {
            members.push((g.index, task_id.to_string()));
        }
    }

    fn index(&mut self, e: &TaskEntry) {
        if let Some(g) = &e.rec.group {
            self.join_group(&e.rec.id, g);
        }
        // A queued task has no session yet.
        if e.rec.session_id.is_empty() {
            return;
        }
        self.by_session.insert(
            e.rec.session_id.clone(),
            SessionOwner {
                task_id: e.rec.id.clone(),
                child: false,
            },
        );
        for child in &e.rec.child_sessions {
            self.by_session.insert(
                child.clone(),
                SessionOwner {
                    task_id: e.rec.id.clone(),
                    child: true,
                },
            );
        }
    }

    /// The task's record is gone: it is no longer a member of its group.
    pub(super) fn forget_member(&mut self, task_id: &str) {
        self.groups.retain(|_, members| {
            members.retain(|(_, id)| id != task_id);
            !members.is_empty()
        });
    }

    /// The queued tasks, first in first: by when they were queued, then by id.
    fn queue_order(&self) -> Vec<&str> {
        let mut queued: Vec<(u64, &str)> = self
            .tasks
            .values()
            .filter(|e| e.rec.status() == TaskStatus::Queued)
            .map(|e| (e.rec.turn_started_ms, e.rec.id.as_str()))
            .collect();
        queued.sort_unstable();
        queued.into_iter().map(|(_, id)| id).collect()
    }

    pub(super) fn unindex(&mut self, e: &TaskEntry) {
        if !e.rec.session_id.is_empty() {
            self.by_session.remove(&e.rec.session_id);
        }
        for child in &e.rec.child_sessions {
            self.by_session.remove(child);
        }
    }
}

/// The tasks, by id and by session, with a change signal, written through to the [`Store`]
/// when one is attached.
pub struct Registry {
    pub(super) tables: Mutex<Tables>,
    pub(super) changed: watch::Sender<u64>,
    pub(super) store: Option<Store>,
    /// The day's spend, shared with the other gateways on the state directory (`ledger.rs`).
    ledger: Ledger,
    /// Where another gateway's unfinished task is reported each time it is read (its id and
    /// owner): the watcher that takes it over once that gateway is gone (`restore.rs`).
    foreign_seen: std::sync::OnceLock<tokio::sync::mpsc::UnboundedSender<(String, u32)>>,
}

impl Default for Registry {
    fn default() -> Self {
        Self::new(None)
    }
}

/// What the state directory holds of a task that is not in memory ([`Registry::on_disk`]).
enum OnDisk {
    /// A finished task, to be brought back into memory.
    Finished(TaskEntry),
    /// Another gateway's unfinished task, as its record says (`live.foreign` names its pid).
    Foreign(TaskEntry),
}

impl Registry {
    /// A registry, writing every durable change to `store` when given.
    pub fn new(store: Option<Store>) -> Self {
        let ledger = Ledger::new(store.as_ref().map(|s| s.state_dir().join("spend")));
        Self {
            tables: Mutex::new(Tables::default()),
            changed: watch::channel(0).0,
            store,
            ledger,
            foreign_seen: std::sync::OnceLock::new(),
        }
    }

    /// Reports every other gateway's unfinished task read from now on to `watcher`.
    pub fn report_foreign(&self, watcher: tokio::sync::mpsc::UnboundedSender<(String, u32)>) {
        let _ = self.foreign_seen.set(watcher);
    }

    /// The attached store, if any.
    pub fn store(&self) -> Option<&Store> {
        self.store.as_ref()
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands a record to the store. Called with the registry lock held: the store's writer
    /// applies records in the order they are handed over, so disk follows memory.
    fn persist(&self, rec: &TaskRecord) {
        if let Some(store) = &self.store {
            let mut rec = rec.clone();
            // Whoever writes a record owns the task's live turn from then on.
            rec.owner_pid = std::process::id();
            store.submit(rec);
        }
    }

    /// A receiver that sees every later observable change. Subscribe *before* reading state, so
    /// a change in between is not missed.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// The change count: it moves on every observable change, so two equal readings mean
    /// nothing changed in between.
    pub fn version(&self) -> u64 {
        *self.changed.borrow()
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Adds a task read from the store, without writing it back.
    pub fn restore(&self, entry: TaskEntry) {
        self.add(entry, false);
    }

    /// Takes note of a finished task read from the store that stays there: it is past its time
    /// in memory, so it is left where [`Self::evict_finished`] would put it at once. What an
    /// eviction keeps of a task is kept of it: its spend toward today's guard and when its
    /// record expires. `day_spend` is the task's [`record_day_spend`].
    pub fn restore_on_disk(
        &self,
        task_id: &str,
        finished_ms: u64,
        group: Option<&GroupMember>,
        disk_ttl: Duration,
    ) {
        let finished = TaskRecord::instant_at(finished_ms);
        let mut t = self.lock();
        t.left_on_disk(finished, disk_ttl);
        // Still a member of its group: a wait on the group reads it back by id.
        if let Some(g) = group {
            t.join_group(task_id, g);
        }
    }

    /// Makes `task_id` (another live gateway's task, answered for from its record) a member of
    /// its fan-out group here, so a wait on the group finds every member.
    pub fn join_group(&self, task_id: &str, g: &GroupMember) {
        self.lock().join_group(task_id, g);
    }

    /// Turn `turn` of `task_id` spent `usd` (a record read back at a restore, whose spend the
    /// day's ledger may not hold yet: written before the ledger existed).
    pub fn note_spend(&self, task_id: &str, turn: u32, usd: f64) {
        self.ledger.observe(task_id, turn, usd);
    }

    /// Adds a task and writes it.
    pub fn insert(&self, entry: TaskEntry) {
        self.add(entry, true);
    }

    /// Puts a task whose first turn is open in place of its entry, only while that entry is
    /// still being started: a cancel may have finished it meanwhile, and then nothing changes
    /// (`false`), so a cancelled start never runs.
    pub fn insert_started(&self, entry: TaskEntry) -> bool {
        use crate::tasks::lifecycle::phase::Phase;
        {
            let mut t = self.lock();
            let starting = t
                .tasks
                .get(&entry.rec.id)
                .is_some_and(|e| e.phase() == Phase::Starting);
            if !starting {
                return false;
            }
            self.persist(&entry.rec);
            t.index(&entry);
            t.tasks.insert(entry.rec.id.clone(), Box::new(entry));
        }
        self.bump();
        true
    }

    fn add(&self, entry: TaskEntry, write: bool) {
        {
            let mut t = self.lock();
            if write {
                self.persist(&entry.rec);
            }
            t.index(&entry);
            t.tasks.insert(entry.rec.id.clone(), Box::new(entry));
        }
        self.bump();
    }

    /// Forgets a task, in memory and on disk.
    pub fn remove(&self, task_id: &str) {
        {
            let mut t = self.lock();
            if let Some(mut e) = t.tasks.remove(task_id) {
                e.stop_deadline();
                t.unindex(&e);
            }
            t.forget_member(task_id);
            if let Some(store) = &self.store {
                store.submit_remove(task_id);
            }
        }
        self.bump();
    }

    /// The task, from memory or, for a finished task that left memory, from the store. Either
    /// way it counts as used (see [`Live::last_used`]). Another gateway's unfinished task is a
    /// view of its record ([`Self::foreign`]).
    pub fn get(&self, task_id: &str) -> Option<TaskEntry> {
        if let Some(e) = self.lock().tasks.get_mut(task_id) {
            e.live.last_used = Instant::now();
            return Some(TaskEntry::clone(e));
        }
        match self.on_disk(task_id)? {
            OnDisk::Finished(entry) => {
                let mut t = self.lock();
                Some(TaskEntry::clone(Self::admit(&mut t, entry)))
            }
            OnDisk::Foreign(view) => Some(view),
        }
    }

    /// What the state directory holds of a task not in memory, read once. A finished task is
    /// brought back (it leaves memory again with the next eviction). An unfinished one is
    /// another gateway's (or was: a gateway shutting down while this one started): it is
    /// answered for from its record as that gateway last wrote it, not taken (that gateway may
    /// still finish it, and this one adopts it once that gateway is gone: see `restore.rs`), and
    /// not held in memory.
    fn on_disk(&self, task_id: &str) -> Option<OnDisk> {
        let rec = self.store.as_ref()?.load(task_id)?;
        if rec.status().is_terminal() {
            let mut entry = TaskEntry::from_record(rec);
            entry.live.last_used = Instant::now();
            return Some(OnDisk::Finished(entry));
        }
        if rec.owner_pid == std::process::id() {
            return None;
        }
        let owner = rec.owner_pid;
        if let Some(watcher) = self.foreign_seen.get() {
            let _ = watcher.send((task_id.to_string(), owner));
        }
        let mut entry = TaskEntry::from_record(rec);
        entry.live.foreign = Some(owner);
        Some(OnDisk::Foreign(entry))
    }

    /// Puts a finished task read back from disk into memory, unless another call brought it
    /// back (and perhaps changed it) meanwhile: memory wins. Returns the task in memory.
    fn admit(t: &mut Tables, entry: TaskEntry) -> &mut TaskEntry {
        let id = entry.rec.id.clone();
        if !t.tasks.contains_key(&id) {
            t.index(&entry);
        }
        let e = t.tasks.entry(id).or_insert_with(|| Box::new(entry));
        e.live.last_used = Instant::now();
        e
    }

    /// Whether the task exists, in memory or on disk, without reading it back into memory.
    pub fn knows(&self, task_id: &str) -> bool {
        self.lock().tasks.contains_key(task_id)
            || self.store.as_ref().is_some_and(|s| s.holds(task_id))
    }

    /// The summary of every task in memory (for the usage report and the task list).
    pub fn summaries(&self) -> Vec<TaskSummary> {
        self.lock()
            .tasks
            .values()
            .map(|e| TaskSummary::from(&e.rec))
            .collect()
    }

    /// Tasks in memory that are not finished (queued ones included).
    #[cfg(test)]
    pub fn live_count(&self) -> usize {
        self.lock()
            .tasks
            .values()
            .filter(|e| !e.rec.status().is_terminal())
            .count()
    }

    /// Tasks in memory that hold a slot (started and not finished), by the worker they run on.
    /// A queued task holds none, nor does one being started from the queue: the room its start
    /// took is counted apart ([`super::capacity`]) until it is registered as started.
    pub fn live_by_worker(&self) -> std::collections::HashMap<String, usize> {
        use crate::tasks::lifecycle::phase::Phase;
        let mut counts = std::collections::HashMap::new();
        for e in self.lock().tasks.values() {
            if !matches!(e.phase(), Phase::Queued | Phase::Starting | Phase::Finished) {
                *counts.entry(e.rec.worker().to_string()).or_default() += 1;
            }
        }
        counts
    }

    /// The queued tasks, first in first.
    pub fn queued(&self) -> Vec<String> {
        self.lock()
            .queue_order()
            .into_iter()
            .map(str::to_string)
            .collect()
    }

    /// The task a session belongs to, and whether it is a subagent's child session.
    pub fn owner_of(&self, session_id: &str) -> Option<SessionOwner> {
        self.lock().by_session.get(session_id).cloned()
    }

    /// Ties a subagent's child session to the task of its parent session; returns the task.
    pub fn adopt_child(&self, parent_session: &str, child_session: &str) -> Option<String> {
        let task_id = self.owner_of(parent_session)?.task_id;
        {
            let mut t = self.lock();
            let entry = t.tasks.get_mut(&task_id)?;
            if entry.rec.child_sessions.iter().any(|c| c == child_session) {
                return Some(task_id);
            }
            entry.rec.child_sessions.push(child_session.to_string());
            self.persist(&entry.rec);
            t.by_session.insert(
                child_session.to_string(),
                SessionOwner {
                    task_id: task_id.clone(),
                    child: true,
                },
            );
        }
        Some(task_id)
    }

    /// Applies `f` to the task; writes the record if it changed and wakes
    /// waiters if something they observe changed. A finished task that left memory is read back
    /// first, so a change is never lost to eviction: `None` means the task does not exist (or
    /// is another gateway's unfinished one).
    pub fn update<R>(&self, task_id: &str, f: impl FnOnce(&mut TaskEntry) -> R) -> Option<R> {
        let mut t = self.lock();
        if !t.tasks.contains_key(task_id) {
            // Read back outside the lock (it reads a file), then admitted and changed under one
            // hold of the lock: an eviction cannot come between, so the change is never lost.
            drop(t);
            let OnDisk::Finished(entry) = self.on_disk(task_id)? else {
                return None;
            };
            t = self.lock();
            Self::admit(&mut t, entry);
        }
        let entry = t.tasks.get_mut(task_id)?;
        entry.live.last_used = Instant::now();
        // Everything in the record is saved and nothing else is (progress lives in `Live`):
        // any change of the record is written, so no field can be forgotten.
        let (before, seen) = (entry.rec.clone(), observable(entry));
        let r = f(entry);
        if entry.rec != before {
            self.persist(&entry.rec);
        }
        let wake = seen != observable(entry);
        // Spend is observed here, where every change of a task passes: a turn's spend
        // that grew is written to the day's ledger (once per step at most).
        let read = entry.rec.outcome_cost();
        let grew = entry
            .live
            .spending
            .to_ledger(read)
            .map(|usd| (entry.rec.turn, usd));
        drop(t);
        if let Some((turn, usd)) = grew {
            self.ledger.observe(task_id, turn, usd);
        }
        if wake {
            self.bump();
        }
        Some(r)
    }

    /// The unfinished tasks among `ids` with a pending permission ask the host has not been
    /// shown.
    pub fn unshown_asks(&self, ids: &[String]) -> Vec<String> {
        let t = self.lock();
        ids.iter()
            .filter(|id| {
                t.tasks.get(*id).is_some_and(|e| {
                    !e.rec.status().is_terminal()
                        && e.rec
                            .permissions
                            .iter()
                            .any(|p| !e.live.asks.get(&p.id).is_some_and(|a| a.shown))
                })
            })
            .cloned()
            .collect()
    }

    /// These asks (task id, ask id) have been shown to the host; one a task no longer waits on
    /// (answered meanwhile) is left alone.
    pub fn asks_shown<'a>(&self, asks: impl IntoIterator<Item = (&'a str, &'a str)>) {
        let mut t = self.lock();
        for (task_id, ask_id) in asks {
            if let Some(seen) = t
                .tasks
                .get_mut(task_id)
                .and_then(|e| e.live.asks.get_mut(ask_id))
            {
                seen.shown = true;
            }
        }
    }

    /// The tasks of a fan-out group, in the order of its targets: also those that left memory
    /// (they are read back by id), as long as their records exist.
    pub fn group_members(&self, group: &str) -> Vec<String> {
        let mut members = self.lock().groups.get(group).cloned().unwrap_or_default();
        members.sort_unstable();
        members.into_iter().map(|(_, id)| id).collect()
    }

    /// Whether any task in memory matches `pred`.
    pub fn any(&self, pred: impl Fn(&TaskEntry) -> bool) -> bool {
        self.lock().tasks.values().any(|e| pred(e))
    }

    /// Ids of tasks in memory matching `pred`.
    pub fn ids_where(&self, pred: impl Fn(&TaskEntry) -> bool) -> Vec<String> {
        self.lock()
            .tasks
            .values()
            .filter(|e| pred(e))
            .map(|e| e.rec.id.clone())
            .collect()
    }

    /// Snapshots of `ids` in order, all taken under one lock; `Err` lists the unknown ones.
    pub fn snapshots(
        &self,
        ids: &[String],
        include_progress: bool,
        stall: Duration,
    ) -> Result<Vec<TaskSnapshot>, Vec<String>> {
        let views = self.bring_back(ids)?;
        let t = self.lock();
        let mut out = Vec::with_capacity(ids.len());
        let mut gone = Vec::new();
        let mut queue: Option<Vec<&str>> = None;
        for id in ids {
            match t.tasks.get(id).map(|e| &**e).or_else(|| views.get(id)) {
                Some(e) => {
                    let mut snapshot = e.snapshot(include_progress, stall);
                    if e.rec.status() == TaskStatus::Queued {
                        let order = queue.get_or_insert_with(|| t.queue_order());
                        snapshot.queue_position =
                            order.iter().position(|q| *q == id).map(|p| p as u32 + 1);
                    }
                    out.push(snapshot)
                }
                None => gone.push(id.clone()),
            }
        }
        if gone.is_empty() {
            Ok(out)
        } else {
            Err(gone)
        }
    }

    /// How many of `ids` are finished (or, if some are unknown, their ids). A wait asks this on
    /// every change of any task, and builds the snapshots it returns only once it returns: with
    /// a wait on all of 200 tasks, building 200 snapshots per change was most of what the
    /// gateway spent waiting.
    pub fn finished_count(&self, ids: &[String]) -> Result<usize, Vec<String>> {
        let views = self.bring_back(ids)?;
        let t = self.lock();
        let mut finished = 0;
        let mut gone = Vec::new();
        for id in ids {
            match t.tasks.get(id).map(|e| &**e).or_else(|| views.get(id)) {
                Some(e) => finished += usize::from(e.rec.status().is_terminal()),
                None => gone.push(id.clone()),
            }
        }
        if gone.is_empty() {
            Ok(finished)
        } else {
            Err(gone)
        }
    }

    /// Brings finished tasks among `ids` that left memory back from disk, and reads views of
    /// another gateway's unfinished ones (returned, not held); the ids known nowhere are the
    /// error.
    fn bring_back(&self, ids: &[String]) -> Result<HashMap<String, TaskEntry>, Vec<String>> {
        let missing: Vec<String> = {
            let t = self.lock();
            ids.iter()
                .filter(|id| !t.tasks.contains_key(*id))
                .cloned()
                .collect()
        };
        let mut views = HashMap::new();
        let mut unknown = Vec::new();
        for id in missing {
            match self.on_disk(&id) {
                Some(OnDisk::Finished(entry)) => {
                    Self::admit(&mut self.lock(), entry);
                }
                Some(OnDisk::Foreign(view)) => {
                    views.insert(id, view);
                }
                None => unknown.push(id),
            }
        }
        if unknown.is_empty() {
            Ok(views)
        } else {
            Err(unknown)
        }
    }

    /// What today's (UTC) turns spent, as every gateway on the state directory observed them:
    /// the day's spend for `limits.max_cost_usd_per_day` (see `spend/caps.rs`, `spend/ledger.rs`).
    pub fn spent_today(&self) -> f64 {
        self.ledger.spent_today()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::opencode::PermissionAsk;
    use crate::tasks::lifecycle::entry::Claim;
    use crate::tasks::lifecycle::phase::{Held, Phase};
    use crate::tasks::lifecycle::record::GroupMember;
    use crate::tasks::lifecycle::record::WorkspaceRecord;
    use crate::tasks::store::disk::Durability;
    use crate::tasks::store::expiry::Evicted;
    use crate::tasks::store::expiry::{sweep_pause, Expired};
    use tokio_util::sync::CancellationToken;

    fn entry(id: &str) -> TaskEntry {
        TaskEntry::in_first_turn(id, &format!("ses_{id}"))
    }

    /// A registry writing to a store in a fresh temp directory (removed when the guard drops).
    fn stored() -> (Registry, Store, TempDir) {
        let dir =
            TempDir(std::env::temp_dir().join(format!("ocm-registry-{}", crate::ids::task_id())));
        let store = Store::open(&dir.0).expect("open");
        (Registry::new(Some(store.clone())), store, dir)
    }

    struct TempDir(std::path::PathBuf);

    /// Sweeps the state directory once the queued writes are on disk (the sweep lists files).
    fn sweep(r: &Registry, store: &Store, ttl: Duration) -> Vec<Expired> {
        store
            .flush_blocking(Duration::from_secs(10))
            .expect("the records are written");
        r.sweep_disk(ttl)
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn text_tail_keeps_the_last_characters_on_char_boundaries() {
        let mut e = entry("a");
        e.push_text("héllo wörld", 5);
        assert_eq!(e.live.text_tail, "wörld");
        e.push_text("!", 5);
        assert_eq!(e.live.text_tail, "örld!");
    }

    #[test]
    fn unknown_ids_are_listed() {
        let r = Registry::default();
        r.insert(entry("a"));
        let err = r
            .snapshots(
                &["a".into(), "b".into(), "c".into()],
                false,
                Duration::from_secs(1),
            )
            .expect_err("unknown");
        assert_eq!(err, vec!["b".to_string(), "c".to_string()]);
        assert_eq!(
            r.finished_count(&["c".into(), "a".into()]),
            Err(vec!["c".to_string()])
        );
        assert_eq!(r.finished_count(&["a".into()]), Ok(0));
        assert_eq!(
            r.owner_of("ses_a"),
            Some(SessionOwner {
                task_id: "a".into(),
                child: false
            })
        );
    }

    #[test]
    fn only_observable_changes_wake_subscribers() {
        let r = Registry::default();
        r.insert(entry("a"));
        let rx = r.subscribe();
        r.update("a", |e| e.push_text("token", 100));
        assert!(
            !rx.has_changed().unwrap_or(true),
            "a streamed token wakes no one"
        );
        r.update("a", |e| {
            e.started();
        });
        assert!(rx.has_changed().unwrap_or(false));
    }

    #[test]
    fn child_sessions_belong_to_the_parent_task() {
        let r = Registry::default();
        r.insert(entry("a"));
        assert_eq!(r.adopt_child("ses_a", "ses_child").as_deref(), Some("a"));
        assert_eq!(r.adopt_child("ses_unknown", "ses_other"), None);
        let owner = r.owner_of("ses_child").expect("mapped");
        assert!(owner.child && owner.task_id == "a");
        r.remove("a");
        assert!(r.owner_of("ses_child").is_none());
    }

    #[test]
    fn stalled_is_not_said_of_a_task_waiting_for_a_person() {
        let mut e = entry("a");
        e.live.last_event = Instant::now() - Duration::from_secs(10);
        e.started();
        let stall = Duration::from_secs(1);
        assert!(e.snapshot(true, stall).progress.expect("progress").stalled);
        e.ask_permission(ask("per_1", "ses_a"));
        assert!(!e.snapshot(true, stall).progress.expect("progress").stalled);
    }

    /// A task queued, or being started from the queue, holds no slot of its own (the room its
    /// start took is counted apart); once started it does, on its worker.
    #[test]
    fn only_started_tasks_hold_a_slot() {
        let r = Registry::default();
        let mut rec = TaskRecord::new(
            "q".into(),
            String::new(),
            String::new(),
            "/w".into(),
            "t".into(),
        );
        rec.queued = Some(serde_json::json!({}));
        r.insert(TaskEntry::queued(rec));
        assert!(r.live_by_worker().is_empty());
        assert_eq!(r.update("q", |e| e.claim_start().is_ok()), Some(true));
        assert!(r.live_by_worker().is_empty(), "starting");
        r.insert(entry("a"));
        assert_eq!(r.live_by_worker().get("local"), Some(&1));
    }

    /// Each claim moves only from the phase it names and only on the turn it names: a second
    /// abort, a check of a turn an abort claimed, a stale turn's abort or check, and anything
    /// on a finished turn are refused.
    #[test]
    fn claims_move_only_from_the_phase_and_turn_they_name() {
        let mut e = entry("a");
        assert_eq!(e.phase(), Phase::Open);
        assert!(!e.claim_abort(2), "another turn");
        assert!(e.hold(Held::Checks, None));
        assert!(!e.hold(Held::Checks, None), "one check per turn");
        assert!(e.claim_abort(1), "an abort may claim a turn being checked");
        assert!(!e.claim_abort(1), "a second abort is a no-op");
        assert!(!e.hold(Held::Checks, None) && !e.is_checking(1));
        e.release_hold(1);
        assert_eq!(
            e.phase(),
            Phase::Aborting,
            "a check ending does not undo an abort"
        );
        e.abort_refused(1);
        assert_eq!(
            e.phase(),
            Phase::Open,
            "a refused abort leaves the turn open"
        );
        e.ask_permission(ask("per_1", "ses_a"));
        assert_eq!(e.rec.status(), TaskStatus::WaitingPermission);
        assert!(e.claim_abort(1));
        e.finish(Claim::Gone(e.rec.turn), TaskStatus::Cancelled, None);
        assert!(e.is_settled());
        assert!(!e.claim_abort(1) && !e.hold(Held::Checks, None));
        e.begin_turn("msg_2".into(), None, None)
            .expect("a finished task opens a turn");
        assert!(e.is_open() && !e.claim_abort(1) && e.claim_abort(2));
        // A task read back from disk is in the phase it was saved in; adopted, an abort under
        // way died with its gateway, and the turn is open again.
        let mut on_disk = e.rec.clone();
        let mut adopted = TaskEntry::from_record(on_disk.clone());
        assert_eq!(adopted.phase(), Phase::Aborting);
        adopted.adopt();
        assert!(adopted.is_open());
        on_disk.finish_for_test(TaskStatus::Completed, None);
        assert!(TaskEntry::from_record(on_disk).is_settled());
    }

    /// A turn ends only by a claim that holds it: an open turn's verdict does not end a turn an
    /// abort claimed, an abort's end does not end an open turn, nothing ends another turn, and
    /// an ended turn does not end twice.
    #[test]
    fn only_a_claim_that_holds_the_turn_ends_it() {
        let mut e = entry("c");
        assert!(!e.finish(Claim::Aborted(1), TaskStatus::Cancelled, None));
        assert!(!e.finish(Claim::Open(2), TaskStatus::Completed, None));
        assert!(
            !e.finish(Claim::Open(1), TaskStatus::Running, None),
            "not a terminal status"
        );
        assert!(e.claim_abort(1));
        assert!(!e.finish(Claim::Open(1), TaskStatus::Completed, None));
        assert!(e.finish(Claim::Aborted(1), TaskStatus::Cancelled, None));
        assert_eq!(
            (e.rec.status(), e.phase()),
            (TaskStatus::Cancelled, Phase::Finished)
        );
        assert!(
            !e.finish(Claim::Gone(1), TaskStatus::Failed, None),
            "ended once"
        );
        e.begin_turn("msg_2".into(), None, None)
            .expect("a finished task opens a turn");
        assert!(e.hold(Held::Checks, None));
        assert_eq!(
            e.rec.status(),
            TaskStatus::Running,
            "a held answer runs until checked"
        );
        assert!(!e.finish(Claim::Open(2), TaskStatus::Completed, None));
        assert!(
            e.finish(Claim::Gone(2), TaskStatus::Failed, None),
            "gone, whoever holds it"
        );
        assert!(!e.started(), "a finished turn does not start");
    }

    /// A turn's deadline timer ends with the turn (finished, followed by another, or the task
    /// removed), so no timer task outlives the turn it guards.
    #[test]
    fn a_turns_deadline_timer_ends_with_the_turn() {
        let armed = |e: &mut TaskEntry| {
            let timer = CancellationToken::new();
            e.live.deadline = Some(timer.clone());
            timer
        };
        let mut e = entry("a");
        let first = armed(&mut e);
        assert!(e.finish(Claim::Open(e.rec.turn), TaskStatus::Completed, None));
        assert!(first.is_cancelled(), "a finished turn ends its timer");
        let second = armed(&mut e);
        e.begin_turn("msg_2".into(), None, None)
            .expect("a finished task opens a turn");
        assert!(
            second.is_cancelled(),
            "a new turn ends the old turn's timer"
        );
        let r = Registry::default();
        let mut running = entry("b");
        let third = armed(&mut running);
        r.insert(running);
        r.remove("b");
        assert!(third.is_cancelled(), "a removed task ends its timer");
    }

    #[test]
    fn eviction_only_takes_old_finished_tasks() {
        let r = Registry::default();
        r.insert(entry("running"));
        let mut done = entry("done");
        done.finish(Claim::Open(done.rec.turn), TaskStatus::Completed, None);
        r.insert(done);
        let hour = Duration::from_secs(3600);
        assert_eq!(r.flushed_evict(hour, hour).left_memory, 0);
        assert_eq!(
            r.flushed_evict(Duration::ZERO, Duration::ZERO).left_memory,
            1
        );
        assert!(r.get("running").is_some() && r.get("done").is_none());
        assert_eq!(r.live_count(), 1);
    }

    /// A finished task read back from disk (a continue, an apply or a discard on a task that
    /// left memory) stays while it is used, however long ago it finished; and a change to one
    /// that left memory is applied to its record, never dropped.
    #[test]
    fn eviction_counts_from_last_use_and_an_update_reads_through() {
        let (r, store, _dir) = stored();
        let mut done = entry("done");
        done.finish(Claim::Open(done.rec.turn), TaskStatus::Completed, None);
        // Finished an hour ago (as a record written by an earlier gateway says).
        let hour = Duration::from_secs(3600);
        done.rec.finished_ms = Some(done.rec.finished_ms.unwrap_or_default() - 3_600_000);
        store.submit(done.rec.clone());
        store
            .flush_blocking(Duration::from_secs(10))
            .expect("the record is written");
        let ten_minutes = Duration::from_secs(600);
        // Read back by a call: used now, so the next eviction tick leaves it alone.
        assert!(r.get("done").is_some());
        assert_eq!(r.flushed_evict(ten_minutes, 24 * hour).left_memory, 0);
        // Unused for the TTL, it leaves memory; an update then reads it back and is applied.
        assert_eq!(r.flushed_evict(Duration::ZERO, 24 * hour).left_memory, 1);
        let moved = r.update("done", |e| e.rec.server_id = "srv_new".into());
        assert!(moved.is_some(), "the update found the task on disk");
        assert_eq!(
            r.get("done").map(|e| e.rec.server_id),
            Some("srv_new".to_string())
        );
        assert!(r.update("never", |_| ()).is_none());
    }

    /// Updates racing evictions: each one is applied (read back and changed under one hold of
    /// the lock), none is lost to an eviction between the read and the change.
    #[test]
    fn no_update_is_lost_to_a_concurrent_eviction() {
        let (r, store, _dir) = stored();
        let mut done = entry("done");
        done.finish(Claim::Open(done.rec.turn), TaskStatus::Completed, None);
        store.submit(done.rec.clone());
        store
            .flush_blocking(Duration::from_secs(10))
            .expect("the record is written");
        // Updates go on until the task has left memory many times meanwhile. Each one counts
        // in the record's title and waits until it is on disk, so an eviction can come next.
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
        const EVICTIONS: usize = 20;
        let (stop, left) = (AtomicBool::new(false), AtomicUsize::new(0));
        let count = |e: &mut TaskEntry| {
            let n: usize = e.rec.title.parse().unwrap_or(0);
            e.rec.title = (n + 1).to_string();
        };
        let (updates, applied) = std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(Relaxed) {
                    let evicted = r.flushed_evict(Duration::ZERO, Duration::from_secs(3600));
                    left.fetch_add(evicted.left_memory, Relaxed);
                }
            });
            let (mut updates, mut applied) = (0, 0);
            while left.load(Relaxed) < EVICTIONS && updates < 20_000 {
                updates += 1;
                applied += usize::from(r.update("done", count).is_some());
                let _ = store.flush_blocking(Duration::from_secs(10));
            }
            stop.store(true, Relaxed);
            (updates, applied)
        });
        assert!(
            left.load(Relaxed) >= EVICTIONS,
            "the task left memory meanwhile"
        );
        assert_eq!(applied, updates, "every update found the task");
        let title = r.get("done").expect("the task").rec.title;
        assert_eq!(title, updates.to_string(), "every change is in the record");
    }

    fn ask(id: &str, session: &str) -> PermissionAsk {
        PermissionAsk {
            id: id.into(),
            session_id: session.into(),
            permission: "bash".into(),
            patterns: vec![],
            metadata: serde_json::Value::Null,
        }
    }

    /// A task restored with a pending ask can have it cleared by the next permission sweep.
    #[test]
    fn a_restored_ask_can_be_swept() {
        let mut e = entry("asking");
        e.ask_permission(ask("per_1", "ses_asking"));
        let restored = TaskEntry::from_record(e.rec.clone());
        assert_eq!(restored.rec.permissions.len(), 1);
        assert!(
            restored.live.asks.contains_key("per_1"),
            "the sweep only clears asks with a time"
        );
    }

    /// Two asks at once (two subagents) are both kept, in order; answering one leaves the task
    /// waiting on the other, and only the last answer lets it run.
    #[test]
    fn every_pending_ask_is_kept_until_it_is_answered() {
        let r = Registry::default();
        r.insert(entry("t"));
        r.update("t", |e| {
            e.ask_permission(ask("per_a", "ses_child1"));
            e.ask_permission(ask("per_b", "ses_child2"));
            e.ask_permission(ask("per_a", "ses_child1"));
        });
        let shown = |r: &Registry| {
            r.snapshots(&["t".into()], false, Duration::from_secs(60))
                .expect("snapshot")
                .remove(0)
        };
        let s = shown(&r);
        assert_eq!(s.status, TaskStatus::WaitingPermission);
        let ids: Vec<&str> = s.permissions.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(ids, ["per_a", "per_b"]);
        // Shown one by one: the task stays news while any ask is unshown.
        assert_eq!(r.unshown_asks(&["t".into()]), ["t"]);
        r.asks_shown([("t", "per_a")]);
        assert_eq!(r.unshown_asks(&["t".into()]), ["t"]);
        r.asks_shown([("t", "per_b")]);
        assert!(r.unshown_asks(&["t".into()]).is_empty());
        r.update("t", |e| e.permission_answered("per_b"));
        let s = shown(&r);
        assert_eq!(s.status, TaskStatus::WaitingPermission);
        assert_eq!(s.permissions.len(), 1);
        assert_eq!(s.permissions[0].id, "per_a");
        r.update("t", |e| e.permission_answered("per_a"));
        let s = shown(&r);
        assert_eq!(s.status, TaskStatus::Running);
        assert!(s.permissions.is_empty());
    }

    /// A finished task read back from disk (a task of another day, brought back by an apply or
    /// a status) adds nothing to the day's spend when it is changed: only what a turn spends
    /// while this gateway holds it is new.
    #[test]
    fn a_task_read_back_counts_nothing_again() {
        let (r, store, _dir) = stored();
        let mut old = entry("old");
        old.finish(Claim::Open(old.rec.turn), TaskStatus::Completed, None);
        old.rec.outcome = Some(crate::tasks::lifecycle::turn::TurnState {
            cost: 2.0,
            ..Default::default()
        });
        store.submit(old.rec.clone());
        store
            .flush_blocking(Duration::from_secs(10))
            .expect("written");
        assert!(r.get("old").is_some(), "read back");
        r.update("old", |e| e.rec.title = "renamed".into());
        assert_eq!(r.spent_today(), 0.0);
    }

    /// A structured answer's correction is a round of the same host turn: the caps count what
    /// every round spent (`structured_retries` used to multiply them); a follow-up starts over.
    #[test]
    fn corrections_spend_against_the_caps_of_the_turn_they_correct() {
        let tokens = crate::opencode::Tokens {
            input: 100,
            ..Default::default()
        };
        let mut e = entry("s");
        e.live.spending.note("msg_a", 0.25, &tokens);
        assert!(e.hold(Held::Schema, None));
        e.begin_correction(1, "msg_2".into(), None, None)
            .expect("a held turn opens a correction");
        assert_eq!(e.rec.turn, 2);
        e.live.spending.note("msg_b", 0.125, &tokens);
        assert_eq!(e.budget_spend(), (0.375, 200));
        assert_eq!(
            e.live.spending.usd(0.0),
            0.125,
            "the ledger counts each round once"
        );
        assert!(
            e.begin_correction(2, "msg_3".into(), None, None).is_err(),
            "an open turn is not corrected"
        );
        assert!(e.hold(Held::Checks, None));
        e.begin_correction(2, "msg_3".into(), None, None)
            .expect("a held turn opens a correction");
        assert_eq!(e.budget_spend(), (0.375, 200));
        // What the earlier rounds spent is in the record: a gateway that adopts the task after
        // a restart still counts it.
        let adopted = TaskEntry::from_record(e.rec.clone());
        assert_eq!(adopted.budget_spend(), (0.375, 200));
        e.finish(Claim::Open(e.rec.turn), TaskStatus::Completed, None);
        e.begin_turn("msg_4".into(), None, None)
            .expect("a finished task opens a turn");
        assert_eq!(
            e.budget_spend(),
            (0.0, 0),
            "a follow-up is a turn of its own"
        );
    }

    /// A finished task leaves memory only once its record is on disk: one whose write fails for
    /// good (here an id that can be no file name) stays, and is answered from memory; one
    /// written leaves as before.
    /// [`Registry::evict_finished`] once every queued record is on disk (only what is on disk
    /// leaves memory).
    impl Registry {
        fn flushed_evict(&self, memory_ttl: Duration, disk_ttl: Duration) -> Evicted {
            if let Some(store) = &self.store {
                let _ = store.flush_blocking(Duration::from_secs(10));
            }
            self.evict_finished(memory_ttl, disk_ttl)
        }
    }

    #[test]
    fn only_a_task_whose_record_is_on_disk_leaves_memory() {
        let (r, store, _dir) = stored();
        let mut lost = entry("bad/id");
        lost.finish(Claim::Open(lost.rec.turn), TaskStatus::Completed, None);
        r.insert(lost);
        let mut kept = entry("good");
        kept.finish(Claim::Open(kept.rec.turn), TaskStatus::Completed, None);
        r.insert(kept);
        let _ = store.flush_blocking(Duration::from_secs(10));
        assert_eq!(store.durability("bad/id"), Durability::Unsaved);
        assert_eq!(store.durability("good"), Durability::OnDisk);
        let evicted = r.flushed_evict(Duration::ZERO, Duration::from_secs(3600));
        assert_eq!(evicted.left_memory, 1, "only the one on disk left memory");
        assert!(
            r.any(|e| e.rec.id == "bad/id"),
            "the unsaved answer stays in memory"
        );
        assert!(!r.any(|e| e.rec.id == "good"));
        assert!(r.get("good").is_some(), "read back from disk");
    }

    /// Releasing an idempotency key (a failed all-or-nothing fan-out) is written at once, not
    /// only with some later durable change.
    #[test]
    fn a_released_idempotency_key_is_written() {
        let (r, store, _dir) = stored();
        let mut e = entry("keyed");
        e.rec.idempotency = Some(("k".into(), 7));
        r.insert(e);
        r.update("keyed", |e| e.rec.idempotency = None);
        store
            .flush_blocking(Duration::from_secs(10))
            .expect("written");
        let on_disk = store.load("keyed").expect("the record");
        assert_eq!(on_disk.idempotency, None);
    }

    /// Another gateway on the same state directory continued a task this one holds as finished
    /// (it read the record at its start): expiring it here leaves the newer record alone,
    /// whether it expires from memory or after leaving memory.
    #[test]
    fn expiry_leaves_a_record_another_gateway_continued() {
        let (r, store, _dir) = stored();
        let hour = Duration::from_secs(3600);
        for (id, leave_memory_first) in [("left", true), ("held", false)] {
            let mut done = entry(id);
            done.finish(Claim::Open(done.rec.turn), TaskStatus::Completed, None);
            r.insert(done.clone());
            if leave_memory_first {
                assert_eq!(r.flushed_evict(Duration::ZERO, hour).left_memory, 1);
            }
            let mut continued = done.rec.clone();
            continued.begin_turn_for_test("msg_2".into(), None, None);
            store.submit(continued);
            store
                .flush_blocking(Duration::from_secs(10))
                .expect("written");
            r.flushed_evict(Duration::ZERO, Duration::ZERO);
            sweep(&r, &store, Duration::ZERO);
            store
                .flush_blocking(Duration::from_secs(10))
                .expect("flushed");
            assert_eq!(
                store.load(id).map(|rec| rec.turn),
                Some(2),
                "{id}: the continued record survives this gateway's expiry"
            );
        }
        // A record that still holds the expired turn is deleted.
        let mut done = entry("own");
        done.finish(Claim::Open(done.rec.turn), TaskStatus::Completed, None);
        r.insert(done);
        r.flushed_evict(Duration::ZERO, Duration::ZERO);
        store
            .flush_blocking(Duration::from_secs(10))
            .expect("flushed");
        assert!(store.load("own").is_none());
    }

    #[test]
    fn expired_tasks_hand_back_their_worktrees_once() {
        let workspace = |path: &str, discarded| WorkspaceRecord {
            origin: "/repo".into(),
            path: path.into(),
            branch: format!("opencode-mcp/{path}"),
            base: "b".into(),
            applied: None,
            discarded,
            remote: None,
        };
        let (r, store, _dir) = stored();
        for (id, w) in [
            ("kept", Some(workspace("kept", false))),
            ("gone", Some(workspace("gone", true))),
            ("none", None),
        ] {
            let mut e = entry(id);
            e.rec.workspace = w;
            e.finish(Claim::Open(e.rec.turn), TaskStatus::Completed, None);
            r.insert(e);
        }
        let hour = Duration::from_secs(3600);
        // Leaving memory is not expiring: the worktree stays the task's.
        let first = r.flushed_evict(Duration::ZERO, hour);
        assert_eq!((first.left_memory, first.worktrees.len()), (3, 0));
        // Not yet expired: the sweep finds nothing, and says when to look again.
        assert!(sweep(&r, &store, hour).is_empty());
        // Expired from disk: only the worktree not yet discarded comes back, and only once.
        let second = sweep(&r, &store, Duration::ZERO);
        let paths: Vec<&str> = second.iter().map(|e| e.workspace.path.as_str()).collect();
        assert_eq!(paths, vec!["kept"]);
        assert_eq!(second[0].status, TaskStatus::Completed);
        assert!(sweep(&r, &store, Duration::ZERO).is_empty());
        assert!(r
            .evict_finished(Duration::ZERO, Duration::ZERO)
            .worktrees
            .is_empty());
    }

    #[test]
    fn a_group_keeps_its_members_that_left_memory_until_their_records_go() {
        let dir = std::env::temp_dir().join(format!("ocm-registry-{}", crate::ids::task_id()));
        let store = Store::open(&dir).expect("open");
        let r = Registry::new(Some(store.clone()));
        for (id, index, finished) in [("slow", 1, false), ("fast", 0, true)] {
            let mut e = entry(id);
            e.rec.group = Some(GroupMember {
                id: "grp_1".into(),
                index,
            });
            if finished {
                e.finish(Claim::Open(e.rec.turn), TaskStatus::Completed, None);
            }
            r.insert(e);
        }
        assert_eq!(r.group_members("grp_1"), ["fast", "slow"]);
        let hour = Duration::from_secs(3600);
        // The fast answer leaves memory while its sibling still runs: still a member.
        assert_eq!(r.flushed_evict(Duration::ZERO, hour).left_memory, 1);
        assert_eq!(r.group_members("grp_1"), ["fast", "slow"]);
        assert!(r.snapshots(&r.group_members("grp_1"), false, hour).is_ok());
        // Its record expires: it is no longer listed, the running one is.
        r.flushed_evict(Duration::ZERO, hour);
        r.flushed_evict(Duration::ZERO, Duration::ZERO);
        sweep(&r, &store, Duration::ZERO);
        assert_eq!(r.group_members("grp_1"), ["slow"]);
        r.remove("slow");
        assert!(r.group_members("grp_1").is_empty());
        store
            .flush_blocking(Duration::from_secs(10))
            .expect("flushed");
        let _ = std::fs::remove_dir_all(dir);
    }

    /// Records that left memory expire in a sweep of the state directory, found by their
    /// files' dates (the finish): the gateway keeps nothing per task for them.
    #[test]
    fn records_that_left_memory_expire_in_a_sweep_dated_by_their_finish() {
        let (r, store, dir) = stored();
        let mut done = entry("done");
        done.finish(Claim::Open(done.rec.turn), TaskStatus::Completed, None);
        let finished_ms = done.rec.finished_ms.expect("finished");
        r.insert(done);
        let hour = Duration::from_secs(3600);
        let left = r.flushed_evict(Duration::ZERO, hour);
        assert_eq!((left.left_memory, left.sweep_due), (1, false));
        store
            .flush_blocking(Duration::from_secs(10))
            .expect("written");
        let dated = std::fs::metadata(dir.0.join("tasks/done.json"))
            .and_then(|m| m.modified())
            .expect("the record's date");
        assert_eq!(
            crate::tasks::model::epoch_ms(dated),
            finished_ms,
            "a finished record is dated by its finish"
        );
        // Not due for an hour: a sweep now leaves it, and puts the next one an hour out.
        assert!(sweep(&r, &store, hour).is_empty());
        assert!(store.load("done").is_some());
        assert!(!r.flushed_evict(Duration::ZERO, hour).sweep_due);
        // Due: the sweep deletes it, and one sweep runs at a time.
        r.lock().next_sweep = Some(Instant::now());
        assert!(r.flushed_evict(Duration::ZERO, hour).sweep_due);
        assert!(!r.flushed_evict(Duration::ZERO, hour).sweep_due);
        sweep(&r, &store, Duration::ZERO);
        store
            .flush_blocking(Duration::from_secs(10))
            .expect("flushed");
        assert!(store.load("done").is_none());
        // Nothing left on disk: no sweep is due again.
        assert_eq!(r.lock().next_sweep, None);
    }

    /// A sweep that never finished (its thread panicked) does not stop sweeping for good: the
    /// next one falls due after the usual pause.
    #[test]
    fn a_failed_sweep_lets_the_next_one_run() {
        let (r, _store, _dir) = stored();
        let hour = Duration::from_secs(3600);
        r.lock().next_sweep = Some(Instant::now());
        assert!(r.flushed_evict(Duration::ZERO, hour).sweep_due);
        assert!(!r.flushed_evict(Duration::ZERO, hour).sweep_due);
        r.sweep_failed(hour);
        let next = r.lock().next_sweep.expect("a next sweep is planned");
        assert!(
            next > Instant::now() + sweep_pause(hour) / 2,
            "not at once: {next:?}"
        );
        r.lock().next_sweep = Some(Instant::now());
        assert!(r.flushed_evict(Duration::ZERO, hour).sweep_due);
    }

    /// A file dated later than its record's finish (touched, copied) expires late, never early;
    /// one dated earlier is checked against the record and kept while it is not due.
    #[test]
    fn a_sweep_trusts_the_record_over_the_file_date() {
        let (r, store, dir) = stored();
        let hour = Duration::from_secs(3600);
        let mut early = entry("early");
        early.finish(Claim::Open(early.rec.turn), TaskStatus::Completed, None);
        r.insert(early);
        store
            .flush_blocking(Duration::from_secs(10))
            .expect("written");
        let file = std::fs::File::options()
            .write(true)
            .open(dir.0.join("tasks/early.json"))
            .expect("open");
        file.set_modified(std::time::SystemTime::now() - 2 * hour)
            .expect("dated");
        drop(file);
        r.flushed_evict(Duration::ZERO, hour);
        assert!(sweep(&r, &store, hour).is_empty());
        store
            .flush_blocking(Duration::from_secs(10))
            .expect("flushed");
        assert!(store.load("early").is_some(), "finished just now: kept");
        assert!(r.lock().next_sweep.is_some(), "and looked at again later");
    }

    /// A turn's spend counts toward today once, with the most that was seen of it (streamed,
    /// subagents included, or read), wherever its task is; a later turn adds its own; another
    /// gateway on the same state directory counts the same.
    #[test]
    fn a_days_spend_counts_each_turn_once_for_every_gateway() {
        let (r, store, dir) = stored();
        let tokens = crate::opencode::Tokens::default();
        let read = |cost| crate::tasks::lifecycle::turn::TurnState {
            cost,
            ..Default::default()
        };
        for id in ["a", "b", "free"] {
            r.insert(entry(id));
        }
        // `a` streamed more (a subagent's steps) than its own session's cost read later.
        r.update("a", |e| e.live.spending.note("msg_child", 0.3, &tokens));
        r.update("a", |e| {
            e.finish(Claim::Open(e.rec.turn), TaskStatus::Completed, None);
            e.rec.outcome = Some(read(0.25));
        });
        r.update("b", |e| {
            e.finish(Claim::Open(e.rec.turn), TaskStatus::Completed, None);
            e.rec.outcome = Some(read(0.5));
        });
        r.update("free", |e| {
            e.finish(Claim::Open(e.rec.turn), TaskStatus::Completed, None);
        });
        assert!((r.spent_today() - 0.8).abs() < 1e-9, "{}", r.spent_today());
        let hour = Duration::from_secs(3600);
        assert_eq!(r.flushed_evict(Duration::ZERO, hour).left_memory, 3);
        assert!((r.spent_today() - 0.8).abs() < 1e-9, "left memory");
        assert!(r.get("a").is_some());
        assert!((r.spent_today() - 0.8).abs() < 1e-9, "read back");
        // A follow-up's turn adds its own spend; the first turn still counts.
        r.update("b", |e| {
            e.begin_turn("msg_2".into(), None, None)
                .expect("a finished task opens a turn");
            e.live.spending.note("msg_3", 0.125, &tokens);
        });
        assert!(
            (r.spent_today() - 0.925).abs() < 1e-9,
            "{}",
            r.spent_today()
        );
        // Another gateway on the same state directory counts the same day.
        drop(store);
        let other = Registry::new(Store::open(&dir.0).ok());
        assert!(
            (other.spent_today() - 0.925).abs() < 1e-9,
            "{}",
            other.spent_today()
        );
    }

    #[test]
    fn finished_tasks_leave_memory_and_answer_from_disk() {
        let dir = std::env::temp_dir().join(format!("ocm-registry-{}", crate::ids::task_id()));
        let store = Store::open(&dir).expect("open");
        let r = Registry::new(Some(store.clone()));
        let mut done = entry("done");
        done.finish(Claim::Open(done.rec.turn), TaskStatus::Completed, None);
        r.insert(done);
        r.insert(entry("live"));
        let hour = Duration::from_secs(3600);
        assert_eq!(r.flushed_evict(Duration::ZERO, hour).left_memory, 1);
        assert_eq!(r.ids_where(|_| true), vec!["live".to_string()]);
        // A wait's count brings it back too, and counts it finished.
        let both = ["done".to_string(), "live".to_string()];
        assert_eq!(r.finished_count(&both), Ok(1));
        assert_eq!(r.flushed_evict(Duration::ZERO, hour).left_memory, 1);
        let back = r.get("done").expect("read back from disk");
        assert_eq!(back.rec.status(), TaskStatus::Completed);
        assert!(r.snapshots(&["done".into()], false, hour).is_ok());
        // Past the TTL it is gone for good, whether in memory or only on disk.
        assert_eq!(r.flushed_evict(Duration::ZERO, hour).left_memory, 1);
        assert_eq!(
            r.flushed_evict(Duration::ZERO, Duration::ZERO).left_memory,
            0
        );
        assert!(sweep(&r, &store, Duration::ZERO).is_empty());
        store
            .flush_blocking(Duration::from_secs(10))
            .expect("flushed");
        assert!(r.get("done").is_none());
        let _ = std::fs::remove_dir_all(dir);
    }
}

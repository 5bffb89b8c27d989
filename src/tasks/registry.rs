//! The task registry: every task the gateway tracks, the one place status, wait and result read
//! from, and the change signal waiters sleep on.
//!
//! All mutation goes through [`Registry::update`], which bumps a `watch` counter, so a waiter
//! wakes on the event that finished its task rather than on a timer.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::model::{Progress, RetryInfo, TaskSnapshot, TaskStatus};
use super::store::{Store, StoredTask};
use crate::opencode::{ErrorInfo, FileChange, PermissionAsk, TurnState};

/// An assistant message of the current turn, from `message.updated` events.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplySeen {
    pub message_id: String,
    pub completed: bool,
    pub finish: Option<String>,
    pub error: Option<ErrorInfo>,
}

impl ReplySeen {
    /// Completed with a final finish (not `tool-calls`), or failed.
    pub fn ends_turn(&self) -> bool {
        self.error.is_some()
            || (self.completed
                && self
                    .finish
                    .as_deref()
                    .is_some_and(crate::opencode::is_terminal_finish))
    }
}

/// One tracked task (one OpenCode session) and the state of its current turn.
#[derive(Debug, Clone)]
pub struct TaskEntry {
    pub id: String,
    pub server_id: String,
    /// The server's base URL and whether the gateway manages it: after a restart this is how a
    /// stored task finds its server again (or learns it is gone).
    pub server_url: String,
    pub managed: bool,
    pub session_id: String,
    pub directory: String,
    pub title: String,
    /// Agent and model asked for by the current turn (None = the server's default).
    pub agent: Option<String>,
    pub model: Option<String>,
    pub turn: u32,
    /// Our user message of the current turn: completion is tied to it (design notes §5).
    pub user_message_id: String,
    pub turn_started: Instant,
    pub status: TaskStatus,
    pub error: Option<ErrorInfo>,
    pub permission: Option<PermissionAsk>,
    /// A cancel or deadline abort is in flight: events must not decide the status meanwhile.
    pub aborting: bool,
    /// A `session.error` seen during this turn (async failures arrive only this way).
    pub session_error: Option<ErrorInfo>,
    /// The newest assistant message answering our user message, as the event stream reported
    /// it. When the session goes idle with this completed and final, the turn is over without a
    /// round trip (the HTTP read of the outcome then happens off the waiters' path).
    pub latest_reply: Option<ReplySeen>,
    // Progress, fed by events.
    pub current_tool: Option<(String, Option<String>)>,
    pub text_tail: String,
    pub steps: u32,
    pub tools_run: u32,
    pub retry: Option<RetryInfo>,
    pub last_event: Instant,
    /// The turn as read over HTTP when it finished.
    pub outcome: Option<TurnState>,
    pub files_changed: Option<Vec<FileChange>>,
    pub finished_at: Option<Instant>,
}

impl TaskEntry {
    /// A task whose first turn was just sent.
    pub fn new(
        id: String,
        server_id: String,
        session_id: String,
        directory: String,
        title: String,
    ) -> Self {
        let now = Instant::now();
        Self {
            id,
            server_id,
            server_url: String::new(),
            managed: false,
            session_id,
            directory,
            title,
            agent: None,
            model: None,
            turn: 0,
            user_message_id: String::new(),
            turn_started: now,
            status: TaskStatus::Pending,
            error: None,
            permission: None,
            aborting: false,
            session_error: None,
            latest_reply: None,
            current_tool: None,
            text_tail: String::new(),
            steps: 0,
            tools_run: 0,
            retry: None,
            last_event: now,
            outcome: None,
            files_changed: None,
            finished_at: None,
        }
    }

    /// Opens a new turn: everything about the previous one is cleared.
    pub fn begin_turn(
        &mut self,
        user_message_id: String,
        agent: Option<String>,
        model: Option<String>,
    ) {
        let now = Instant::now();
        self.turn += 1;
        self.user_message_id = user_message_id;
        self.agent = agent;
        self.model = model;
        self.turn_started = now;
        self.status = TaskStatus::Pending;
        self.error = None;
        self.permission = None;
        self.aborting = false;
        self.session_error = None;
        self.latest_reply = None;
        self.current_tool = None;
        self.text_tail.clear();
        self.steps = 0;
        self.tools_run = 0;
        self.retry = None;
        self.last_event = now;
        self.outcome = None;
        self.files_changed = None;
        self.finished_at = None;
    }

    /// Ends the turn with a terminal status.
    pub fn finish(&mut self, status: TaskStatus, error: Option<ErrorInfo>) {
        self.status = status;
        self.error = error;
        self.permission = None;
        self.current_tool = None;
        self.retry = None;
        self.aborting = false;
        self.finished_at = Some(Instant::now());
    }

    /// Milliseconds from sending the turn to its end (or to now).
    pub fn duration(&self) -> Duration {
        self.finished_at
            .unwrap_or_else(Instant::now)
            .saturating_duration_since(self.turn_started)
    }

    /// The snapshot status and wait report.
    pub fn snapshot(&self, include_progress: bool, stall: Duration) -> TaskSnapshot {
        let progress = include_progress.then(|| {
            let since_event = self.last_event.elapsed();
            let tokens = self.outcome.as_ref().map(|o| o.tokens).unwrap_or_default();
            Progress {
                current_tool: self.current_tool.as_ref().map(|(t, _)| t.clone()),
                current_tool_title: self.current_tool.as_ref().and_then(|(_, t)| t.clone()),
                text_tail: self.text_tail.clone(),
                steps: self.steps,
                tools_run: self.tools_run,
                tokens,
                last_event_ms_ago: since_event.as_millis() as u64,
                stalled: !self.status.is_terminal() && since_event > stall,
                retry: self.retry.clone(),
            }
        });
        TaskSnapshot {
            task_id: self.id.clone(),
            status: self.status,
            server_id: self.server_id.clone(),
            session_id: self.session_id.clone(),
            title: self.title.clone(),
            directory: self.directory.clone(),
            agent: self
                .outcome
                .as_ref()
                .and_then(|o| o.agent.clone())
                .or_else(|| self.agent.clone()),
            model: self
                .outcome
                .as_ref()
                .and_then(|o| o.model.clone())
                .or_else(|| self.model.clone()),
            turn: self.turn,
            elapsed_ms: self.duration().as_millis() as u64,
            error: self.error.clone(),
            permission: self.permission.clone(),
            progress,
        }
    }

    /// Appends streamed text to the progress tail, keeping the last `max` characters.
    pub fn push_text(&mut self, text: &str, max: usize) {
        self.text_tail.push_str(text);
        let count = self.text_tail.chars().count();
        if count > max {
            let cut = self
                .text_tail
                .char_indices()
                .nth(count - max)
                .map(|(i, _)| i)
                .unwrap_or(0);
            self.text_tail.drain(..cut);
        }
    }
}

#[derive(Default)]
struct Tables {
    tasks: HashMap<String, TaskEntry>,
    by_session: HashMap<String, String>,
}

/// The tasks, by id and by session, with a change signal, written through to the [`Store`]
/// when one is attached.
pub struct Registry {
    tables: Mutex<Tables>,
    changed: watch::Sender<u64>,
    store: Option<Store>,
}

/// What makes a change worth writing to disk (progress is not).
type Durable = (TaskStatus, u32, bool, bool, bool, String);

fn durable(e: &TaskEntry) -> Durable {
    (
        e.status,
        e.turn,
        e.outcome.is_some(),
        e.files_changed.is_some(),
        e.permission.is_some(),
        e.server_id.clone(),
    )
}

impl Default for Registry {
    fn default() -> Self {
        Self::new()
    }
}

impl Registry {
    pub fn new() -> Self {
        Self {
            tables: Mutex::new(Tables::default()),
            changed: watch::channel(0).0,
            store: None,
        }
    }

    /// A registry that writes every durable change to `store`.
    pub fn with_store(store: Store) -> Self {
        Self {
            store: Some(store),
            ..Self::new()
        }
    }

    /// The attached store, if any.
    pub fn store(&self) -> Option<&Store> {
        self.store.as_ref()
    }

    /// Hands one task's record to the store's writer. Called with the registry lock held, so
    /// records reach the writer in the order the states happened (the writer keeps that order).
    fn persist(&self, record: Option<StoredTask>) {
        if let (Some(store), Some(record)) = (&self.store, record) {
            store.submit(record);
        }
    }

    /// Adds a task loaded from the store, without writing it back.
    pub fn restore(&self, entry: TaskEntry) {
        {
            let mut t = self.lock();
            t.by_session
                .insert(entry.session_id.clone(), entry.id.clone());
            t.tasks.insert(entry.id.clone(), entry);
        }
        self.bump();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A receiver that sees every later change. Subscribe *before* reading state, so a change in
    /// between is not missed.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    pub fn insert(&self, entry: TaskEntry) {
        {
            let mut t = self.lock();
            self.persist(self.store.as_ref().map(|_| StoredTask::from_entry(&entry)));
            t.by_session
                .insert(entry.session_id.clone(), entry.id.clone());
            t.tasks.insert(entry.id.clone(), entry);
        }
        self.bump();
    }

    pub fn remove(&self, task_id: &str) {
        {
            let mut t = self.lock();
            if let Some(e) = t.tasks.remove(task_id) {
                t.by_session.remove(&e.session_id);
            }
            if let Some(store) = &self.store {
                store.submit_remove(task_id);
            }
        }
        self.bump();
    }

    pub fn get(&self, task_id: &str) -> Option<TaskEntry> {
        self.lock().tasks.get(task_id).cloned()
    }

    /// How many tasks are tracked.
    pub fn count(&self) -> usize {
        self.lock().tasks.len()
    }

    pub fn task_for_session(&self, session_id: &str) -> Option<String> {
        self.lock().by_session.get(session_id).cloned()
    }

    /// Applies `f` to the task and signals waiters if `f` says it changed something.
    pub fn update<R>(&self, task_id: &str, f: impl FnOnce(&mut TaskEntry) -> R) -> Option<R> {
        let r = {
            let mut t = self.lock();
            let entry = t.tasks.get_mut(task_id)?;
            let before = self.store.as_ref().map(|_| durable(entry));
            let r = f(entry);
            let record = before
                .filter(|b| *b != durable(entry))
                .map(|_| StoredTask::from_entry(entry));
            self.persist(record);
            r
        };
        self.bump();
        Some(r)
    }

    /// Ids of tasks matching `pred`.
    pub fn ids_where(&self, pred: impl Fn(&TaskEntry) -> bool) -> Vec<String> {
        self.lock()
            .tasks
            .values()
            .filter(|e| pred(e))
            .map(|e| e.id.clone())
            .collect()
    }

    /// Snapshots of `ids` in order; `Err` lists the unknown ones.
    pub fn snapshots(
        &self,
        ids: &[String],
        include_progress: bool,
        stall: Duration,
    ) -> Result<Vec<TaskSnapshot>, Vec<String>> {
        let t = self.lock();
        let unknown: Vec<String> = ids
            .iter()
            .filter(|id| !t.tasks.contains_key(*id))
            .cloned()
            .collect();
        if !unknown.is_empty() {
            return Err(unknown);
        }
        Ok(ids
            .iter()
            .filter_map(|id| t.tasks.get(id))
            .map(|e| e.snapshot(include_progress, stall))
            .collect())
    }

    /// Forgets finished tasks older than `ttl`; returns how many went.
    pub fn evict_finished(&self, ttl: Duration) -> usize {
        let mut t = self.lock();
        let old: Vec<(String, String)> = t
            .tasks
            .values()
            .filter(|e| e.finished_at.is_some_and(|f| f.elapsed() >= ttl))
            .map(|e| (e.id.clone(), e.session_id.clone()))
            .collect();
        for (id, session) in &old {
            t.tasks.remove(id);
            t.by_session.remove(session);
            if let Some(store) = &self.store {
                store.submit_remove(id);
            }
        }
        old.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: &str) -> TaskEntry {
        let mut e = TaskEntry::new(
            id.into(),
            "srv".into(),
            format!("ses_{id}"),
            "/w".into(),
            "t".into(),
        );
        e.begin_turn("msg_1".into(), None, None);
        e
    }

    #[test]
    fn a_new_turn_clears_the_previous_outcome() {
        let mut e = entry("a");
        e.finish(
            TaskStatus::Failed,
            Some(ErrorInfo {
                name: "X".into(),
                message: "y".into(),
            }),
        );
        e.begin_turn("msg_2".into(), None, None);
        assert_eq!(e.turn, 2);
        assert_eq!(e.status, TaskStatus::Pending);
        assert!(e.error.is_none() && e.finished_at.is_none() && e.outcome.is_none());
    }

    #[test]
    fn text_tail_keeps_the_last_characters_on_char_boundaries() {
        let mut e = entry("a");
        e.push_text("héllo wörld", 5);
        assert_eq!(e.text_tail, "wörld");
        e.push_text("!", 5);
        assert_eq!(e.text_tail, "örld!");
    }

    #[test]
    fn unknown_ids_are_listed() {
        let r = Registry::new();
        r.insert(entry("a"));
        let err = r
            .snapshots(
                &["a".into(), "b".into(), "c".into()],
                false,
                Duration::from_secs(1),
            )
            .expect_err("unknown");
        assert_eq!(err, vec!["b".to_string(), "c".to_string()]);
        assert_eq!(r.task_for_session("ses_a").as_deref(), Some("a"));
    }

    #[test]
    fn updates_wake_subscribers() {
        let r = Registry::new();
        r.insert(entry("a"));
        let rx = r.subscribe();
        assert!(!rx.has_changed().unwrap_or(true));
        r.update("a", |e| e.status = TaskStatus::Running);
        assert!(rx.has_changed().unwrap_or(false));
    }

    #[test]
    fn eviction_only_takes_old_finished_tasks() {
        let r = Registry::new();
        r.insert(entry("running"));
        let mut done = entry("done");
        done.finish(TaskStatus::Completed, None);
        r.insert(done);
        assert_eq!(r.evict_finished(Duration::from_secs(3600)), 0);
        assert_eq!(r.evict_finished(Duration::ZERO), 1);
        assert!(r.get("running").is_some() && r.get("done").is_none());
    }
}

//! The task service: the one object the gateway's tool handlers call, and its small actions
//! (cancel, a permission's reply, status, shutdown). Its larger jobs live beside it or in the
//! room whose data they move: `placement/` (start, the queue, servers, workers, worktrees,
//! reached through [`Placement`]), `restore.rs` (tasks a previous gateway left), `follow_up.rs`
//! (`continue_task`), `result.rs` (the result of a turn) and `wait.rs` (all/any waits). What
//! they share with the tracker is `context.rs`'s.

use std::sync::Arc;
use std::time::Duration;

use super::context::TaskContext;
use super::error::TaskError;
use super::lifecycle::phase::Phase;
use super::model::{TaskSnapshot, TaskStatus};
use super::placement::Placement;
use super::resolve::{self, AgentCatalog};
use crate::config::Config;
use crate::opencode::{PermissionReply, ServerPool};
use crate::tasks::store::disk::{self, Store};
use crate::tasks::store::registry::Registry;
use crate::tasks::store::usage::TaskSummary;
use crate::tasks::turn::outcome;

/// How long a report of a finished task waits for its record to reach the disk.
const REPORTED_DURABLE: Duration = Duration::from_secs(2);
/// How long shutdown waits for outcomes still being read: hosts send SIGINT, SIGTERM and SIGKILL
/// about half a second apart, and stopping the servers must come first.
const SHUTDOWN_FLUSH: Duration = Duration::from_millis(500);

/// The tasks and the servers they run on.
pub struct TaskService {
    /// What every room shares. Its configuration is the one new calls and new tasks use:
    /// swapped whole by a reload ([`TaskService::reconfigure`]); the lock is held only to clone
    /// the `Arc`. What a running task needs (its deadline, its model) was taken from it when
    /// the task started, so a reload never changes a task under way. The keys it cannot take at
    /// run time (the state directory, the server settings the pool and tracker were built with)
    /// keep their running value: see `config::RESTART_KEYS`.
    pub(super) tracker: TaskContext,
    pub(super) registry: Arc<Registry>,
    /// Where tasks run and getting them there (`placement/`).
    pub(super) placement: Arc<Placement>,
    /// `false` while stored tasks are being loaded at start-up (the context holds the receiver).
    pub(super) restored: tokio::sync::watch::Sender<bool>,
    /// Epoch ms this service was created: where `opencode_usage`'s default period starts.
    pub started_ms: u64,
}

impl TaskService {
    /// The service, with its registry written through to the state directory. If that
    /// directory cannot be used the gateway still works, without surviving a restart, and says so.
    pub fn new(config: Arc<Config>) -> Self {
        let dir = disk::state_dir_of(&config);
        let state_dir = dir.clone();
        let store = match dir.as_deref().map(Store::open) {
            Some(Ok(s)) => Some(s),
            Some(Err(e)) => {
                tracing::warn!(error = %e, dir = ?dir, "the state directory is not usable; tasks will not survive a restart");
                None
            }
            None => {
                tracing::warn!("no state directory (set state_dir, XDG_STATE_HOME or HOME); tasks will not survive a restart");
                None
            }
        };
        let registry = Arc::new(Registry::new(store));
        let (restored, restored_rx) = tokio::sync::watch::channel(true);
        let tracker = TaskContext {
            worktrees: state_dir
                .as_deref()
                .map(crate::tasks::store::gc::worktrees_dir),
            git_lock: Default::default(),
            fetching: Default::default(),
            registry: registry.clone(),
            tail_chars: config.limits.progress_tail_chars as usize,
            max_result_chars: config.limits.max_result_chars as usize,
            // No task stays in memory once its record is gone.
            memory_ttl: config
                .limits
                .finished_in_memory
                .get()
                .min(config.limits.finished_task_ttl.get()),
            finished_ttl: config.limits.finished_task_ttl.get(),
            checks: Default::default(),
            foreign: Default::default(),
            config: crate::config::LiveConfig::new(config.clone()),
            capacity: Default::default(),
            on_deadline: crate::tasks::tracking::abort::on_deadline,
            restored: restored_rx,
        };
        let mut pool = ServerPool::new(config.clone());
        if let Some(dir) = &state_dir {
            pool =
                pool.publishing_credentials(dir, |pid| crate::tasks::store::owner::alive(dir, pid));
        }
        Self {
            placement: Arc::new(Placement::new(tracker.clone(), pool, state_dir)),
            registry,
            tracker,
            restored,
            started_ms: super::model::epoch_ms(std::time::SystemTime::now()),
        }
    }

    /// Every task this gateway can answer for, for the usage report and the task list: those in
    /// memory (current), and the finished ones left only in the state directory (also those of
    /// other gateways sharing it, since the store is what the report is about). Summaries, not
    /// records: a day of records must not be held at once (see [`TaskSummary`]).
    pub async fn summaries(&self) -> Vec<TaskSummary> {
        self.tracker.restored().await;
        let mut all = Vec::new();
        if let Some(store) = self.registry.store().cloned() {
            // What was removed or changed in memory must be on disk before the directory is read.
            if let Err(e) = store.flush(SHUTDOWN_FLUSH).await {
                tracing::warn!(error = %e, "the task list may show stale records");
            }
            let read = tokio::task::spawn_blocking(move || {
                let (summaries, _) = store.summaries();
                // Reading a day of records leaves their buffers free in the blocking thread's
                // arena: hand them back now rather than keep them until the next quiet spell.
                crate::memory::give_back();
                summaries
            })
            .await;
            all = read.unwrap_or_default();
        }
        let held = self.registry.summaries();
        let in_memory: std::collections::HashSet<&str> =
            held.iter().map(|t| t.id.as_str()).collect();
        all.retain(|t| !in_memory.contains(t.id.as_str()));
        all.extend(held);
        all
    }

    /// The configuration in force now (one snapshot: take it once per operation).
    pub fn config(&self) -> Arc<Config> {
        self.tracker.config()
    }

    /// Puts a reloaded configuration in force for new calls and new tasks.
    pub fn reconfigure(&self, config: Arc<Config>) {
        self.tracker.config.set(config);
    }

    /// The task's current turn (1 for the first prompt), if the task is known.
    pub fn turn_of(&self, task_id: &str) -> Option<u32> {
        self.registry.get(task_id).map(|e| e.rec.turn)
    }

    /// Whether the gateway with process id `pid` (a task record's owner) still runs; this one
    /// does.
    pub fn gateway_alive(&self, pid: u32) -> bool {
        self.tracker.gateway_alive(pid)
    }

    /// Answers one permission ask the task waits on (its own, or one of its subagents'):
    /// `ask_id`, or without it the only pending ask. An answer never lands on an ask the host
    /// did not name: with several pending, or an id no longer pending, it is refused and the
    /// pending asks are listed.
    pub async fn reply_permission(
        &self,
        task_id: &str,
        ask_id: Option<&str>,
        reply: PermissionReply,
    ) -> Result<TaskSnapshot, TaskError> {
        self.tracker.restored().await;
        let entry = self.tracker.own_entry(task_id)?;
        let pending = &entry.rec.permissions;
        if pending.is_empty() || entry.rec.status() != TaskStatus::WaitingPermission {
            return Err(TaskError::Conflict(format!(
                "task {} is not waiting for a permission (status {})",
                entry.rec.id,
                entry.rec.status().as_str()
            )));
        }
        let listed = || {
            pending
                .iter()
                .map(|p| format!("`{}` ({})", p.id, p.summary(80)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let ask = match (ask_id, pending.as_slice()) {
            (Some(id), _) => pending.iter().find(|p| p.id == id).ok_or_else(|| {
                TaskError::Conflict(format!(
                    "task {} has no pending ask `{id}` (answered already?); it waits on: {}",
                    entry.rec.id,
                    listed()
                ))
            })?,
            (None, [only]) => only,
            (None, _) => {
                return Err(TaskError::Conflict(format!(
                    "task {} waits on {} asks: name the one to answer with `permission_id`: {}",
                    entry.rec.id,
                    pending.len(),
                    listed()
                )))
            }
        };
        let server = self.placement.server(&entry.rec.server_id)?;
        server
            .api
            .reply_permission(&entry.rec.directory, &ask.id, reply)
            .await?;
        self.registry
            .update(task_id, |e| e.permission_answered(&ask.id));
        self.tracker.snapshot(task_id, false)
    }

    pub async fn status(
        &self,
        task_id: &str,
        include_progress: bool,
    ) -> Result<TaskSnapshot, TaskError> {
        self.tracker.restored().await;
        self.tracker.snapshot(task_id, include_progress)
    }

    /// Waits (bounded) until every record change made so far is on disk. The gateway calls it
    /// once, after every tool call and native task method and before the answer goes out
    /// (`gateway::handler`), so nothing a host is told is newer than what a restarted gateway
    /// would read back: a task reported started, continued, cancelled or finished stays so
    /// after a SIGKILL (a clean-clone run once found a task reported completed interrupted
    /// after the restart; a continue's new turn waited up to a second in the queue).
    pub async fn reported(&self) {
        if let Some(store) = self.registry.store() {
            if let Err(e) = store.flush(REPORTED_DURABLE).await {
                tracing::warn!(error = %e, "an answer goes out before its record is on disk");
            }
        }
    }

    /// Reads what is still unread of finished turns, stops every managed server, and waits for
    /// the task store's writer (used on shutdown).
    /// Puts every task record still queued on disk, waiting at most `timeout`: for an exit that
    /// does not wait for the orderly [`Self::shutdown`] (a second signal).
    pub async fn flush_records(&self, timeout: Duration) {
        if let Some(store) = self.registry.store() {
            if let Err(e) = store.flush(timeout).await {
                tracing::warn!(error = %e, "task records may be missing from the state directory");
            }
        }
    }

    pub async fn shutdown(&self) {
        let flushes = self
            .placement
            .pool
            .all()
            .into_iter()
            .filter(|s| s.exited().is_none())
            .map(|s| async move {
                self.placement
                    .flush_outcomes(&s, true, SHUTDOWN_FLUSH)
                    .await
            });
        futures::future::join_all(flushes).await;
        self.placement.let_local_serves_linger().await;
        self.placement.pool.stop_all().await;
        self.placement.stop_worker_serves().await;
        // Stopping failed the tasks still running; those records, like any still queued, must
        // be on disk before the process exits.
        if let Some(store) = self.registry.store() {
            if let Err(e) = store.flush(disk::SHUTDOWN_FLUSH).await {
                tracing::warn!(error = %e, "task records may be missing from the state directory");
            }
        }
    }
}

impl TaskService {
    /// What a server offers, and what each configured tier resolves to there (`list_agents`).
    pub async fn list_agents(&self, server_id: &str) -> Result<AgentCatalog, TaskError> {
        let server = self.placement.server(server_id)?;
        resolve::catalog(&server, &self.config()).await
    }

    /// Aborts the turn (and rejects every permission it, or one of its subagents, waits on);
    /// idempotent on finished tasks. The gateway answers only once its record says so on disk
    /// ([`Self::reported`]): a gateway killed right after must not bring it back running.
    pub async fn cancel(&self, task_id: &str) -> Result<TaskSnapshot, TaskError> {
        self.tracker.restored().await;
        let entry = self.tracker.own_entry(task_id)?;
        if entry.rec.status().is_terminal() {
            return self.tracker.snapshot(task_id, false);
        }
        if matches!(entry.phase(), Phase::Queued | Phase::Starting) {
            return self.placement.cancel_unstarted(task_id).await;
        }
        let server = self.placement.server(&entry.rec.server_id)?;
        let finished = crate::tasks::tracking::abort::abort_turn(
            &self.tracker,
            &server,
            task_id,
            Some(entry.rec.turn),
            TaskStatus::Cancelled,
            None,
            crate::tasks::tracking::abort::IfAbortFails::KeepRunning,
        )
        .await?;
        if let Some(turn) = finished {
            outcome::spawn_outcome(&self.tracker, &server, task_id.to_string(), turn);
        }
        self.tracker.snapshot(task_id, false)
    }
}

/// Placement's jobs the gateway asks for, through the facade (see `placement/`).
impl TaskService {
    /// Takes room for `new` starts at once (`fan_out`): see [`Placement::reserve`].
    pub fn reserve(
        &self,
        worker: Option<&str>,
        isolation: crate::config::Isolation,
        tier: Option<&str>,
        new: usize,
    ) -> Result<Vec<crate::tasks::Slots>, TaskError> {
        self.placement.reserve(worker, isolation, tier, new)
    }

    /// Starts a task: see [`Placement::start_with`].
    pub async fn start(&self, req: crate::tasks::StartTask) -> Result<TaskSnapshot, TaskError> {
        self.placement.start(req).await
    }

    /// Starts a task in room already taken (`room`, one slot), or taking its own.
    pub async fn start_with(
        &self,
        req: crate::tasks::StartTask,
        room: Option<crate::tasks::Slots>,
    ) -> Result<TaskSnapshot, TaskError> {
        self.placement.start_with(req, room).await
    }

    /// Frees the idempotency key of a task whose start is being undone.
    pub async fn release_key(&self, task_id: &str) {
        self.placement.release_key(task_id).await
    }

    pub async fn start_server(
        &self,
        port: Option<u16>,
        directory: Option<String>,
    ) -> Result<crate::opencode::ServerInfo, TaskError> {
        self.placement.start_server(port, directory).await
    }

    pub fn default_server_id(&self) -> Option<String> {
        self.placement.default_server_id()
    }

    pub async fn stop_server(
        &self,
        server_id: &str,
    ) -> Result<crate::opencode::StopInfo, TaskError> {
        self.placement.stop_server(server_id).await
    }

    /// Applies a settled task's worktree to the user's tree: see [`Placement::apply`].
    pub async fn apply(&self, task_id: &str) -> Result<crate::tasks::ApplyOutcome, TaskError> {
        self.placement.apply(task_id).await
    }

    /// Removes a settled task's worktree: see [`Placement::discard`].
    pub async fn discard(&self, task_id: &str) -> Result<crate::tasks::DiscardOutcome, TaskError> {
        self.placement.discard(task_id).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tasks::lifecycle::record::TaskRecord;

    /// Another gateway's unfinished task is read from its record, and acting on it is refused
    /// naming that gateway; its finished tasks are this gateway's to act on.
    #[test]
    fn another_gateways_running_task_is_read_not_acted_on() {
        let mut config = crate::gateway::test_config();
        let dir = std::env::temp_dir().join(format!("ocm-foreign-{}", crate::ids::task_id()));
        config.state_dir = Some(dir.display().to_string());
        let service = TaskService::new(Arc::new(config));
        let store = service.registry.store().cloned().expect("a store");
        let mut rec = TaskRecord::new(
            "tsk_theirs".into(),
            "srv".into(),
            "ses_theirs".into(),
            "/w".into(),
            "theirs".into(),
        );
        rec.begin_turn_for_test("msg_1".into(), None, None);
        rec.set_status_for_test(TaskStatus::Running);
        rec.owner_pid = 1;
        store.submit(rec.clone());
        store
            .flush_blocking(std::time::Duration::from_secs(10))
            .expect("written");
        let seen = service
            .tracker
            .entry("tsk_theirs")
            .expect("read from its record");
        assert_eq!(seen.live.foreign, Some(1));
        assert_eq!(seen.rec.status(), TaskStatus::Running);
        let refused = service
            .tracker
            .own_entry("tsk_theirs")
            .expect_err("refused");
        assert!(
            refused.to_string().contains("another gateway (pid 1)"),
            "{refused}"
        );
        assert_eq!(
            service
                .tracker
                .snapshot("tsk_theirs", false)
                .map(|s| s.status)
                .ok(),
            Some(TaskStatus::Running)
        );
        rec.finish_for_test(TaskStatus::Completed, None);
        store.submit(rec);
        store
            .flush_blocking(std::time::Duration::from_secs(10))
            .expect("written");
        assert!(
            service.tracker.own_entry("tsk_theirs").is_ok(),
            "finished: ours to act on"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// An OpenCode runs on after a clean exit only for a server with unfinished tasks, for
    /// `limits.linger` but never past the last of their deadlines; 0 turns it off.
    #[test]
    fn a_server_lingers_for_its_tasks_until_their_last_deadline_at_most() {
        let service_with = |linger: u64, task: u64| {
            let mut config = crate::gateway::test_config();
            config.limits.linger = Duration::from_secs(linger).into();
            config.timeouts.task = Duration::from_secs(task).into();
            config.timeouts.stall = Duration::from_secs(1).into();
            TaskService::new(Arc::new(config))
        };
        let running = |service: &TaskService, id: &str, status: TaskStatus| {
            let mut rec = TaskRecord::new(
                id.into(),
                "srv".into(),
                format!("ses_{id}"),
                "/w".into(),
                id.into(),
            );
            rec.begin_turn_for_test("msg_1".into(), None, None);
            match status {
                TaskStatus::Running => rec.set_status_for_test(status),
                done => rec.finish_for_test(done, None),
            }
            service
                .registry
                .insert(crate::tasks::lifecycle::entry::TaskEntry::from_record(rec));
        };
        let service = service_with(600, 3600);
        assert_eq!(service.placement.linger_for("srv"), None, "no task");
        running(&service, "tsk_done", TaskStatus::Completed);
        assert_eq!(
            service.placement.linger_for("srv"),
            None,
            "only a finished one"
        );
        running(&service, "tsk_open", TaskStatus::Running);
        let linger = service.placement.linger_for("srv").expect("lingers");
        assert_eq!((linger.grace, linger.tasks), (Duration::from_secs(600), 1));
        assert_eq!(linger.open.len(), 1, "{linger:?}");
        assert_eq!(linger.open[0].session_id, "ses_tsk_open");
        assert_eq!(service.placement.linger_for("srv_other"), None);

        let service = service_with(600, 120);
        running(&service, "tsk_open", TaskStatus::Running);
        let linger = service.placement.linger_for("srv").expect("lingers");
        let (grace, tasks) = (linger.grace, linger.tasks);
        assert_eq!(tasks, 1);
        assert!(
            linger.open[0].left <= grace,
            "{linger:?}: the turn's own deadline is at most the linger"
        );
        assert!(
            grace <= Duration::from_secs(120) && grace > Duration::from_secs(100),
            "{grace:?}: not bounded by the deadline"
        );

        let service = service_with(0, 3600);
        running(&service, "tsk_open", TaskStatus::Running);
        assert_eq!(service.placement.linger_for("srv"), None, "linger 0 is off");
    }
}

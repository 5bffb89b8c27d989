//! What every room of the task machinery shares: the registry, the configuration in force, the
//! limits a turn is held to, and the deadline timer. One value, cloned into each server's
//! tracker and each spawned check, so a room needs this file and the data rooms, never another
//! behaviour room.
//!
//! The deadline timer is the one place where the rooms call each other in a loop (a deadline
//! checks the turn, a check may open a structured correction, a correction arms a deadline):
//! the timer lives here and what it runs is handed in as [`OnDeadline`] by whoever builds the
//! context (the service, with `abort::deadline_passed`), so no room imports the one above it.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::opencode::Server;
use crate::tasks::error::TaskError;
use crate::tasks::lifecycle::entry::TaskEntry;
use crate::tasks::model::TaskSnapshot;
use crate::tasks::store::registry::Registry;

/// What runs when a turn's deadline passes: the task, its turn, and the `timeouts.task` the
/// error message names.
pub type OnDeadline =
    fn(TaskContext, Arc<Server>, String, u32, Duration) -> Pin<Box<dyn Future<Output = ()> + Send>>;

#[derive(Clone)]
pub struct TaskContext {
    pub registry: Arc<Registry>,
    /// Characters of streamed text kept for progress.
    pub tail_chars: usize,
    /// Characters of final text kept per task.
    pub max_result_chars: usize,
    /// Finished tasks leave memory after this (they stay readable from disk).
    pub memory_ttl: Duration,
    /// Finished tasks are forgotten after this.
    pub finished_ttl: Duration,
    /// Where task worktrees live (`<state_dir>/worktrees`), if there is a state directory.
    pub worktrees: Option<std::path::PathBuf>,
    /// The service's lock for git writes: cleaning an expired task's worktree is one.
    pub git_lock: Arc<tokio::sync::RwLock<()>>,
    /// One fetch of a remote task's work at a time, per task (`fetch.rs`): the gateway-wide
    /// `git_lock` is not held across the network.
    pub fetching: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
    /// Tasks with a completion check running, and whether another was asked for meanwhile.
    pub checks: Arc<Mutex<HashMap<String, bool>>>,
    /// Sessions with pending asks that belong to no task (someone else's work on the same
    /// server): not looked up again on every reconcile.
    pub foreign: Arc<Mutex<HashSet<String>>>,
    /// The configuration in force, shared with the service: `timeouts.task` for the turns the
    /// gateway opens itself, `limits.structured_retries` for a structured answer's corrections.
    pub config: crate::config::LiveConfig,
    /// Room for unfinished tasks, taken by starts and by follow-ups of finished tasks.
    pub capacity: Arc<crate::tasks::store::capacity::Capacity>,
    /// What runs when a turn's deadline passes ([`TaskContext::arm_deadline`]).
    pub on_deadline: OnDeadline,
    /// `false` while the stored tasks are being loaded at start-up (`restore.rs` holds the
    /// sender): every action that reads tasks waits for it ([`TaskContext::restored`]).
    pub restored: tokio::sync::watch::Receiver<bool>,
}

impl TaskContext {
    /// The configuration in force now (one snapshot: take it once per operation).
    pub fn config(&self) -> Arc<Config> {
        self.config.get()
    }

    /// Resolves once the stored tasks are loaded (at once when there is nothing to load).
    pub async fn restored(&self) {
        let mut rx = self.restored.clone();
        let _ = rx.wait_for(|done| *done).await;
    }

    pub fn stall(&self) -> Duration {
        self.config().timeouts.stall.get()
    }

    pub fn entry(&self, task_id: &str) -> Result<TaskEntry, TaskError> {
        self.registry
            .get(task_id)
            .ok_or_else(|| TaskError::UnknownTasks(vec![task_id.to_string()]))
    }

    /// The task, to act on: another gateway's unfinished task (a view of its record) is
    /// refused, naming that gateway, since only the gateway running a turn may change it.
    pub fn own_entry(&self, task_id: &str) -> Result<TaskEntry, TaskError> {
        let entry = self.entry(task_id)?;
        match entry.live.foreign {
            None => Ok(entry),
            Some(pid) => Err(TaskError::Conflict(format!(
                "task {task_id} is run by another gateway (pid {pid}) sharing this state \
                 directory; it is {}. Ask again once it finishes, or once that gateway exits \
                 (this one then takes the task over)",
                entry.rec.status().as_str()
            ))),
        }
    }

    /// The task as status reports it.
    pub fn snapshot(
        &self,
        task_id: &str,
        include_progress: bool,
    ) -> Result<TaskSnapshot, TaskError> {
        self.registry
            .snapshots(&[task_id.to_string()], include_progress, self.stall())
            .map_err(TaskError::UnknownTasks)?
            .pop()
            .ok_or_else(|| TaskError::UnknownTasks(vec![task_id.to_string()]))
    }

    /// Whether the gateway with process id `pid` (a task record's owner) still runs; this one
    /// does.
    pub fn gateway_alive(&self, pid: u32) -> bool {
        self.registry
            .store()
            .is_none_or(|store| store.owner_alive(pid))
    }

    /// Arms the deadline of a turn that starts now: `timeouts.task` as in force now.
    pub fn arm_turn_deadline(
        &self,
        server: &Arc<Server>,
        task_id: &str,
        turn: u32,
        after: Duration,
    ) {
        let limit = self.config().timeouts.task.get();
        self.arm_deadline(server, task_id, turn, after, limit);
    }

    /// Runs [`TaskContext::on_deadline`] `after` from now (the turn's `timeouts.task`) if the
    /// turn is still open then. `limit` is the `timeouts.task` the error message names (in force
    /// when the turn started). Arming again replaces the turn's timer; the turn's end stops it.
    pub fn arm_deadline(
        &self,
        server: &Arc<Server>,
        task_id: &str,
        turn: u32,
        after: Duration,
        limit: Duration,
    ) {
        let timer = CancellationToken::new();
        let armed = self.registry.update(task_id, |e| {
            let open = e.rec.turn == turn && !e.is_settled();
            if open {
                e.stop_deadline();
                e.live.deadline = Some(timer.clone());
            }
            open
        });
        if armed != Some(true) {
            return;
        }
        let ctx = self.clone();
        let server = server.clone();
        let task_id = task_id.to_string();
        let stop = server.stop.clone();
        // This task lives as long as the turn, so it stays small: what runs when the deadline
        // passes (reads and an abort, several KB of future) is boxed and built only then.
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                // The turn ended (or a newer one began): nothing to time out.
                _ = timer.cancelled() => {}
                _ = tokio::time::sleep(after) => {
                    let passed = ctx.on_deadline;
                    passed(ctx, server, task_id, turn, limit).await;
                }
            }
        });
    }
}

/// Fixtures the behaviour rooms' unit tests share: a context over a registry, a registry
/// holding one task, and a server nobody listens on.
#[cfg(test)]
pub(super) mod fixtures {
    use std::sync::Arc;
    use std::time::Duration;

    use super::TaskContext;
    use crate::opencode::{Api, Server};
    use crate::tasks::lifecycle::entry::TaskEntry;
    use crate::tasks::store::registry::Registry;

    /// A context over `registry` with small limits; its deadlines do nothing when they pass.
    pub fn context(registry: Arc<Registry>) -> TaskContext {
        TaskContext {
            registry,
            tail_chars: 100,
            max_result_chars: 1000,
            memory_ttl: Duration::from_secs(600),
            finished_ttl: Duration::from_secs(3600),
            worktrees: None,
            git_lock: Default::default(),
            fetching: Default::default(),
            checks: Default::default(),
            foreign: Default::default(),
            config: crate::config::LiveConfig::new(Arc::new(crate::gateway::test_config())),
            capacity: Default::default(),
            on_deadline: |_, _, _, _, _| Box::pin(async {}),
            restored: tokio::sync::watch::channel(true).1,
        }
    }

    /// A registry holding task `tsk_a` (session `ses_a`) in its first turn, then `f` applied.
    pub fn registry_with(f: impl FnOnce(&mut TaskEntry)) -> Arc<Registry> {
        let registry = Arc::new(Registry::default());
        let mut e = TaskEntry::in_first_turn("tsk_a", "ses_a");
        f(&mut e);
        registry.insert(e);
        registry
    }

    /// A server whose port nobody listens on.
    pub fn unreachable_server() -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        Server {
            id: "srv".into(),
            api: Api::new(
                &format!("http://127.0.0.1:{port}"),
                None,
                Duration::from_secs(2),
            )
            .expect("client"),
            directory: "/w".into(),
            version: "test".into(),
            process: None,
            stop: Default::default(),
            credentials: None,
            worker: None,
            sandbox: None,
            worker_shell: None,
            confinement: crate::sandbox::Confinement::Unconfined("a test server".into()),
        }
    }
}

//! The task service: the one object the gateway's tool handlers call. This file holds the
//! service itself and the actions that open or end turns (start, continue, cancel) or touch
//! servers; the other jobs live one a file beside it: `restore.rs` (tasks a previous gateway
//! left), `result.rs` (the result of a turn), `wait.rs` (all/any waits), `workspace.rs` (a
//! task's worktree). What they share with the tracker is `context.rs`'s.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::capacity::{Place, Slots};
use super::context::TaskContext;
use super::error::TaskError;
use super::follow::{open_turn, Follows};
use super::lifecycle::entry::{Claim, TaskEntry};
use super::lifecycle::phase::Phase;
use super::lifecycle::record::StructuredState;
use super::lifecycle::record::{GroupMember, TaskRecord};
use super::model::{TaskSnapshot, TaskStatus};
use super::outcome;
use super::registry::Registry;
use super::resolve::{self, AgentCatalog, Choice};
use super::spend;
use super::store::{self, Store};
use super::structured;
use super::tracker;
use super::usage::TaskSummary;
use crate::config::Budget;
use crate::config::{Config, Isolation};
use crate::git::Base;
use crate::ids;
use crate::opencode::{
    resolve_directory, OpencodeError, PermissionReply, RunOn, Server, ServerInfo, ServerPool,
    StopInfo,
};

/// How long a report of a finished task waits for its record to reach the disk.
const REPORTED_DURABLE: Duration = Duration::from_secs(2);
/// How long `stop_server` waits for what is unread of its finished turns.
const STOP_FLUSH: Duration = Duration::from_secs(5);
/// How long shutdown waits for outcomes still being read: hosts send SIGINT, SIGTERM and SIGKILL
/// about half a second apart, and stopping the servers must come first.
const SHUTDOWN_FLUSH: Duration = Duration::from_millis(500);

/// A validated `start_task` request (kept as JSON in a queued task's record).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct StartTask {
    pub server_id: String,
    pub prompt: String,
    pub agent: Option<String>,
    /// Exact `provider/model`.
    pub model: Option<String>,
    /// A tier name from the config; resolved against the server's models.
    pub tier: Option<String>,
    /// Absolute directory the session runs in (default: the server's).
    pub directory: Option<String>,
    pub title: Option<String>,
    /// Same key and arguments: the task the first call started. Same key, other arguments:
    /// `conflict`.
    pub idempotency_key: Option<String>,
    /// `worktree`: the task works in a git worktree of its own (see `workspace.rs`).
    pub isolation: Isolation,
    /// What that worktree starts from.
    pub base: Base,
    /// The fan-out group this task is one answer of, and its place there.
    pub group: Option<GroupMember>,
    /// A JSON Schema the answer must end with a matching JSON value of (see `structured.rs`).
    pub output_schema: Option<serde_json::Value>,
    /// The call's own spending caps (they may only lower those in force; see `spend.rs`).
    pub budget: Budget,
    /// The model variant to run (reasoning effort), in place of the tier's.
    pub variant: Option<String>,
    /// The worker to run on (`local`, or a remote worker of `workers:`); `None`: this machine.
    pub worker: Option<String>,
    /// Commands that must succeed after each turn, besides the tier's (see `checks`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<String>,
}

impl StartTask {
    /// A stable fingerprint of everything but the key (FNV-1a: the same across processes and
    /// releases, so a retry after a restart matches).
    fn fingerprint(&self) -> u64 {
        // serde_json's maps are ordered, so equal schemas serialize alike.
        let schema = self.output_schema.as_ref().map(|s| s.to_string());
        let fields = [
            Some(self.server_id.as_str()),
            Some(self.prompt.as_str()),
            self.agent.as_deref(),
            self.model.as_deref(),
            self.tier.as_deref(),
            self.directory.as_deref(),
            self.title.as_deref(),
            Some(match self.isolation {
                Isolation::None => "isolation:none",
                Isolation::Worktree => "isolation:worktree",
            }),
            Some(match self.base {
                Base::WorkingTree => "base:working_tree",
                Base::Head => "base:head",
            }),
            schema.as_deref(),
        ];
        // Hashed only when given, so a key's fingerprint is what it was before budgets and
        // variants existed.
        let budget = (!self.budget.is_unlimited()).then(|| format!("{:?}", self.budget));
        let variant = self.variant.as_ref().map(|v| format!("variant:{v}"));
        let worker = self.worker.as_ref().map(|w| format!("worker:{w}"));
        let checks = (!self.checks.is_empty()).then(|| format!("checks:{:?}", self.checks));
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let given: Vec<String> = [budget, variant, worker, checks]
            .into_iter()
            .flatten()
            .collect();
        for field in fields
            .into_iter()
            .chain(given.iter().map(|f| Some(f.as_str())))
        {
            // A marker per field keeps `None` apart from `Some("")` and fields apart.
            let bytes = field.map_or(&[0xff_u8][..], str::as_bytes);
            for b in bytes.iter().chain(&[0x00]) {
                hash ^= u64::from(*b);
                hash = hash.wrapping_mul(0x0100_0000_01b3);
            }
        }
        hash
    }
}

/// What an `idempotency_key` is bound to: the argument fingerprint and the task it started.
type KeySlot = Arc<tokio::sync::Mutex<Option<(u64, String)>>>;

/// How many idempotency keys accumulate between prunes of those that stand for nothing.
const KEYS_PRUNE_AT: usize = 1024;

/// A validated `continue_task` request.
#[derive(Debug, Clone, Default)]
pub struct ContinueTask {
    pub task_id: String,
    pub prompt: String,
    pub agent: Option<String>,
    pub model: Option<String>,
    /// Checks to add to the task's (see `checks`).
    pub checks: Vec<String>,
}

/// The tasks and the servers they run on.
pub struct TaskService {
    /// The configuration new calls and new tasks use: swapped whole by a reload
    /// ([`TaskService::reconfigure`]); the lock is held only to clone the `Arc`. What a running
    /// task needs (its deadline, its model) was taken from it when the task started, so a reload
    /// never changes a task under way. The keys it cannot take at run time (the state directory,
    /// the server settings the pool and tracker were built with) keep their running value: see
    /// `config::RESTART_KEYS`.
    config: crate::config::LiveConfig,
    pub(super) pool: ServerPool,
    pub(super) registry: Arc<Registry>,
    pub(super) tracker: TaskContext,
    /// `false` while stored tasks are being loaded at start-up.
    pub(super) restored: tokio::sync::watch::Sender<bool>,
    /// `idempotency_key` -> its slot; starts with one key run one at a time.
    pub(super) keys: std::sync::Mutex<std::collections::HashMap<String, KeySlot>>,
    /// The state directory (task worktrees live in its `worktrees/`), if there is one.
    pub(super) state_dir: Option<std::path::PathBuf>,
    /// Git operations that write (creating a worktree, apply, discard) run one at a time, so two
    /// applies never merge against the same snapshot of the user's tree.
    pub(super) git_lock: Arc<tokio::sync::RwLock<()>>,
    /// Epoch ms this service was created: where `opencode_usage`'s default period starts.
    pub started_ms: u64,
    /// The remote workers' OpenCode servers, started on first use (`placement.rs`).
    pub(super) workers: super::links::WorkerServes,
    /// Queued tasks being started now (`queue.rs`).
    /// Held while the queue's length is checked and a task added, so `limits.queue` holds.
    pub(super) enqueueing: std::sync::Mutex<()>,
}

impl TaskService {
    /// The service, with its registry written through to the state directory. If that
    /// directory cannot be used the gateway still works, without surviving a restart, and says so.
    pub fn new(config: Arc<Config>) -> Self {
        let dir = config
            .state_dir
            .as_ref()
            .map(std::path::PathBuf::from)
            .or_else(store::default_state_dir);
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
        let live = crate::config::LiveConfig::new(config.clone());
        let git_lock = Arc::new(tokio::sync::RwLock::new(()));
        let tracker = TaskContext {
            worktrees: state_dir.as_deref().map(super::gc::worktrees_dir),
            git_lock: git_lock.clone(),
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
            config: live.clone(),
            capacity: Default::default(),
            on_deadline: super::abort::on_deadline,
        };
        let mut pool = ServerPool::new(config.clone());
        if let Some(dir) = &state_dir {
            pool = pool.publishing_credentials(dir, |pid| super::owner::alive(dir, pid));
        }
        Self {
            pool,
            registry,
            tracker,
            restored: tokio::sync::watch::Sender::new(true),
            keys: Default::default(),
            state_dir,
            git_lock,
            config: live,
            started_ms: super::lifecycle::record::epoch_ms(std::time::SystemTime::now()),
            workers: Default::default(),
            enqueueing: Default::default(),
        }
    }

    /// Every task this gateway can answer for, for the usage report and the task list: those in
    /// memory (current), and the finished ones left only in the state directory (also those of
    /// other gateways sharing it, since the store is what the report is about). Summaries, not
    /// records: a day of records must not be held at once (see [`TaskSummary`]).
    pub async fn summaries(&self) -> Vec<TaskSummary> {
        self.restored().await;
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
        self.config.get()
    }

    /// Puts a reloaded configuration in force for new calls and new tasks.
    pub fn reconfigure(&self, config: Arc<Config>) {
        self.config.set(config);
    }

    pub(super) fn stall(&self) -> Duration {
        self.config().timeouts.stall.get()
    }

    pub(super) fn server(&self, server_id: &str) -> Result<Arc<Server>, TaskError> {
        let server = self
            .pool
            .get(server_id)
            .ok_or_else(|| TaskError::UnknownServer(server_id.to_string()))?;
        if let Some(how) = server.exited() {
            return Err(OpencodeError::Gone {
                server_id: server_id.to_string(),
                reason: format!("its process {how}; call opencode_start_server again"),
            }
            .into());
        }
        Ok(server)
    }

    /// The server a follow-up of a finished task runs on: its own, or, when that one is gone
    /// (stopped, or it went with a gateway that restarted), the server the gateway uses now
    /// ([`Self::server_in_use_for`]), which the task moves to.
    async fn server_for_follow_up(&self, entry: &TaskEntry) -> Result<Arc<Server>, TaskError> {
        let rec = &entry.rec;
        match self.server(&rec.server_id) {
            Err(TaskError::UnknownServer(_) | TaskError::Opencode(OpencodeError::Gone { .. })) => {}
            found => return found,
        }
        let server = self.server_in_use_for(entry).await?;
        tracing::info!(task_id = %rec.id, from = %rec.server_id, to = %server.id, "the task's server is gone; its follow-up runs on the server in use now");
        self.registry
            .update(&rec.id, |e| {
                e.rec.server_id = server.id.clone();
                e.rec.server_url = server.api.base_url().to_string();
                e.rec.managed = server.process.is_some();
            })
            .ok_or_else(|| TaskError::UnknownTasks(vec![rec.id.clone()]))?;
        Ok(server)
    }

    /// For a task whose own server is gone: the server the gateway uses now (started, or
    /// attached, if there is none), once it is known to have the task's session. OpenCode keeps
    /// sessions in its own storage, not in a server process, so another server on this machine
    /// carries the session on; one that does not have it (other storage) is a clear conflict
    /// rather than a new, empty session or a turn that reads as never having happened.
    pub(super) async fn server_in_use_for(
        &self,
        entry: &TaskEntry,
    ) -> Result<Arc<Server>, TaskError> {
        let rec = &entry.rec;
        let on_worker = rec.workspace.as_ref().and_then(|w| w.remote.as_ref());
        let server = match on_worker {
            // A remote task's session is kept by its worker's OpenCode: the worker's server
            // now (started again if this gateway has none) carries it on.
            Some(r) => match self.remote_worker(&r.worker, Isolation::Worktree)? {
                Some(w) => self.worker_server(&w).await?,
                None => {
                    return Err(TaskError::Conflict(format!(
                        "task {} names no worker",
                        rec.id
                    )))
                }
            },
            None => {
                if !Path::new(&rec.directory).is_dir() {
                    return Err(TaskError::Conflict(format!(
                        "task {}'s server is gone and so is its directory {}; start a new task",
                        rec.id, rec.directory
                    )));
                }
                let info = self.start_server(None, None).await?;
                self.server(&info.server_id)?
            }
        };
        match server
            .api
            .session_parent(&rec.directory, &rec.session_id)
            .await
        {
            Ok(_) => Ok(server),
            Err(OpencodeError::Http { status: 404, .. }) => Err(TaskError::Conflict(format!(
                "task {}'s server {} is gone, and the server in use now ({}) does not have \
                 its session {}; start a new task",
                rec.id,
                rec.server_id,
                server.api.base_url(),
                rec.session_id
            ))),
            Err(e) => Err(e.into()),
        }
    }

    pub(super) fn entry(&self, task_id: &str) -> Result<TaskEntry, TaskError> {
        self.registry
            .get(task_id)
            .ok_or_else(|| TaskError::UnknownTasks(vec![task_id.to_string()]))
    }

    /// The task's current turn (1 for the first prompt), if the task is known.
    pub fn turn_of(&self, task_id: &str) -> Option<u32> {
        self.registry.get(task_id).map(|e| e.rec.turn)
    }

    /// The task, to act on: another gateway's unfinished task (a view of its record) is
    /// refused, naming that gateway, since only the gateway running a turn may change it.
    pub(super) fn own_entry(&self, task_id: &str) -> Result<TaskEntry, TaskError> {
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

    pub async fn start_server(
        &self,
        port: Option<u16>,
        directory: Option<String>,
    ) -> Result<ServerInfo, TaskError> {
        let (info, started) = self.pool.start(port, directory).await?;
        if let Some(started) = started {
            tokio::spawn(tracker::run(
                self.tracker.clone(),
                started.server,
                started.events,
            ));
        }
        Ok(info)
    }

    /// Whether the gateway with process id `pid` (a task record's owner) still runs; this one
    /// does.
    pub fn gateway_alive(&self, pid: u32) -> bool {
        self.registry
            .store()
            .is_none_or(|store| store.owner_alive(pid))
    }

    /// The id of the running server `server_id: "default"` stands for, if any.
    pub fn default_server_id(&self) -> Option<String> {
        self.pool.default_id()
    }

    /// Stops a server. Its unfinished tasks are aborted first (an attached server keeps
    /// running, so without the abort its agents would go on editing and spending), then
    /// reported `failed` (`ServerStopped`); outcomes still being read are read before the
    /// server goes.
    pub async fn stop_server(&self, server_id: &str) -> Result<StopInfo, TaskError> {
        let server = self
            .pool
            .get(server_id)
            .ok_or_else(|| TaskError::UnknownServer(server_id.to_string()))?;
        let live = self
            .registry
            .ids_where(|e| e.rec.server_id == server.id && !e.rec.status().is_terminal());
        let message = if server.process.is_some() {
            format!(
                "the OpenCode server {} was stopped by opencode_stop_server",
                server.id
            )
        } else {
            format!(
                "aborted: opencode_stop_server stopped the gateway's use of the attached OpenCode server {} ({}), which itself keeps running",
                server.id,
                server.api.base_url()
            )
        };
        if server.exited().is_none() {
            let aborts = live.iter().map(|id| {
                super::abort::abort_turn(
                    &self.tracker,
                    &server,
                    id,
                    None,
                    TaskStatus::Failed,
                    Some(crate::opencode::ErrorInfo {
                        provider_status: None,
                        retryable: None,
                        name: "ServerStopped".into(),
                        message: message.clone(),
                    }),
                    super::abort::IfAbortFails::FinishAnyway,
                )
            });
            futures::future::join_all(aborts).await;
            self.flush_outcomes(&server, true, STOP_FLUSH).await;
        }
        let (server, exit) = self
            .pool
            .stop(server_id)
            .await
            .ok_or_else(|| TaskError::UnknownServer(server_id.to_string()))?;
        if let Some(worker) = &server.worker {
            self.stop_worker_serve(worker).await;
        }
        // Anything that started meanwhile, or could not be aborted, ends here.
        tracker::fail_server_tasks(&self.registry, &server.id, "ServerStopped", &message);
        Ok(StopInfo {
            server_id: server.id.clone(),
            terminated: server.process.is_some(),
            exit,
            failed_tasks: live,
        })
    }

    /// Reads what is not read yet of a server's finished turns (their outcomes and, with
    /// `files`, their changed files) before the server goes, for at most `bound`.
    async fn flush_outcomes(&self, server: &Arc<Server>, files: bool, bound: Duration) {
        let pending = self.registry.ids_where(|e| {
            e.rec.server_id == server.id
                && e.rec.status().is_terminal()
                && ((e.rec.outcome.is_none() && e.rec.outcome_error.is_none())
                    || (files && e.rec.files_changed.is_none()))
        });
        if pending.is_empty() {
            return;
        }
        let reads = pending.iter().map(|id| async move {
            let turn = self.registry.get(id).map(|e| e.rec.turn).unwrap_or(0);
            outcome::read_outcome(&self.tracker, server, id, turn, outcome::Attempts::Once).await;
            if files {
                outcome::read_files(&self.tracker, server, id, turn, outcome::Attempts::Once).await;
            }
        });
        if tokio::time::timeout(bound, futures::future::join_all(reads))
            .await
            .is_err()
        {
            tracing::warn!(server_id = %server.id, "some finished turns' outcomes could not be read before the server stopped");
        }
    }

    /// Takes room for `new` more unfinished tasks, one slot each, on `worker` when the call
    /// names one, else on this machine first and then on the remote workers with free slots
    /// (only for tasks that can run remotely: `isolation` worktree); refuses when the workers
    /// have too few free slots between them (see `capacity.rs`). Finished tasks never count:
    /// they leave memory and stay readable from disk. `fan_out` takes room for all its targets
    /// at once and hands one slot to each of its starts ([`TaskService::start_with`]).
    ///
    /// A worker that declares `tiers` is given only tasks of those tiers (`tier`; `None`: the
    /// task names none, or the tasks of a fan-out differ).
    pub fn reserve(
        &self,
        worker: Option<&str>,
        isolation: Isolation,
        tier: Option<&str>,
        new: usize,
    ) -> Result<Vec<Slots>, TaskError> {
        let config = self.config();
        let places = match worker {
            Some(name) => {
                self.remote_worker(name, isolation)?;
                vec![Place::of(&config, name)]
            }
            // Workers found out of reach are left out for a while.
            None if isolation == Isolation::Worktree && self.state_dir.is_some() => {
                crate::workers::from_config(&config)
                    .iter()
                    .filter(|w| w.remote.is_none() || !self.workers.avoided(&w.name))
                    .filter(|w| w.takes(tier))
                    .map(|w| Place::from_worker(&config, w))
                    .collect()
            }
            None => vec![Place::local(&config)],
        };
        self.tracker.capacity.spread(&self.registry, &places, new)
    }

    /// Creates a session, sends the prompt, and returns as soon as OpenCode accepted it. With an
    /// `idempotency_key`, a retry returns the task the first call started (concurrent calls with
    /// one key run one after the other); a first call that failed leaves the key free.
    pub async fn start(&self, req: StartTask) -> Result<TaskSnapshot, TaskError> {
        self.start_with(req, None).await
    }

    /// [`TaskService::start`] in room already taken (`room`, one slot), or taking its own.
    pub async fn start_with(
        &self,
        req: StartTask,
        room: Option<Slots>,
    ) -> Result<TaskSnapshot, TaskError> {
        self.restored().await;
        let Some(key) = req.idempotency_key.clone() else {
            return self.start_new(req, None, room, None).await;
        };
        let fingerprint = req.fingerprint();
        let slot = self.key_slot(&key);
        let mut bound = slot.lock().await;
        if let Some((fp, task_id)) = bound.as_ref() {
            if *fp != fingerprint {
                return Err(TaskError::Conflict(format!(
                    "idempotency_key `{key}` already started task {task_id} with other arguments; \
                     use a new key for a new task"
                )));
            }
            if let Ok(snapshot) = self.snapshot(task_id, false) {
                return Ok(snapshot);
            }
            // The task it started has expired: the key starts anew.
        }
        let snapshot = self
            .start_new(req, Some((key, fingerprint)), room, None)
            .await?;
        *bound = Some((fingerprint, snapshot.task_id.clone()));
        Ok(snapshot)
    }

    pub(super) fn key_slot(&self, key: &str) -> KeySlot {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        // Keys outlive their tasks (restore binds every stored one, expired records take none
        // along): every KEYS_PRUNE_AT new keys, drop the ones bound to nothing or to a task
        // that no longer exists. A key in use (its slot locked) is left alone. Existence is a
        // `stat` for tasks out of memory: reading them would bring each back into memory.
        if !keys.contains_key(key) && !keys.is_empty() && keys.len().is_multiple_of(KEYS_PRUNE_AT) {
            keys.retain(|_, slot| match slot.try_lock() {
                Ok(bound) => bound
                    .as_ref()
                    .is_some_and(|(_, task_id)| self.registry.knows(task_id)),
                Err(_) => true,
            });
        }
        keys.entry(key.to_string()).or_default().clone()
    }

    /// Unbinds the task's `idempotency_key` (in memory and in its record, so a restart does not
    /// bind it again): for a task started and then cancelled because the call it belonged to
    /// failed as a whole (`fan_out`'s all or nothing), whose retry must start anew rather than
    /// be handed back the cancelled task.
    pub async fn release_key(&self, task_id: &str) {
        let Some((key, _)) = self.registry.get(task_id).and_then(|e| e.rec.idempotency) else {
            return;
        };
        let slot = self.key_slot(&key);
        let mut bound = slot.lock().await;
        if bound.as_ref().is_some_and(|(_, id)| id == task_id) {
            *bound = None;
        }
        self.registry.update(task_id, |e| e.rec.idempotency = None);
    }

    /// Binds keys of restored tasks again, so a retry after a restart finds its task.
    pub(super) fn bind_key(&self, key: String, fingerprint: u64, task_id: String) {
        let slot = self.key_slot(&key);
        let bound = slot.try_lock();
        if let Ok(mut bound) = bound {
            *bound = Some((fingerprint, task_id));
        }
    }

    /// Starts `req` as a new task, or, with `queued_id`, starts that queued task (in `room`
    /// taken for it) in its place.
    pub(super) async fn start_new(
        &self,
        req: StartTask,
        idempotency: Option<(String, u64)>,
        room: Option<Slots>,
        queued_id: Option<String>,
    ) -> Result<TaskSnapshot, TaskError> {
        if let Some(schema) = &req.output_schema {
            structured::check_schema(schema)
                .map_err(|e| TaskError::InvalidArgument(e.to_string()))?;
        }
        let checks = super::checks::commands_for(&self.config(), req.tier.as_deref(), &req.checks)
            .map_err(TaskError::InvalidArgument)?;
        let local = self.server(&req.server_id)?;
        let budget = spend::caps(&self.config(), req.tier.as_deref(), req.budget)?;
        spend::within_daily_cap(&self.config(), &self.registry)?;
        let directory = match req.directory.clone() {
            Some(d) => resolve_directory(Some(d))?,
            None => local.directory.clone(),
        };
        // Held until the task is registered: until then it counts as an unfinished task of
        // the worker it was taken on, which is where the task runs. No room anywhere: the
        // task is queued when the user allows it (`queue.rs`).
        let room = match room {
            Some(room) => room,
            None => {
                match self.reserve(req.worker.as_deref(), req.isolation, req.tier.as_deref(), 1) {
                    Ok(mut room) => room
                        .pop()
                        .ok_or_else(|| TaskError::LimitExceeded("no room for the task".into()))?,
                    Err(TaskError::LimitExceeded(why)) => {
                        return self.enqueue(req, directory, idempotency, why).await
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        let worker = self.remote_worker(room.worker(), req.isolation)?;
        // A remote task runs on its worker's OpenCode, whose agents and models are that
        // worker's own.
        let server = match &worker {
            Some(w) => self.worker_server(w).await?,
            None => local,
        };
        let Choice {
            model,
            variant,
            price,
        } = resolve::choose(
            &self.config(),
            &server,
            if worker.is_some() {
                &server.directory
            } else {
                &directory
            },
            req.agent.as_deref(),
            req.model.as_deref(),
            req.tier.as_deref(),
            req.variant.as_deref(),
        )
        .await?;
        let title = req
            .title
            .clone()
            .unwrap_or_else(|| default_title(&req.prompt));
        let from_queue = queued_id.is_some();
        let task_id = queued_id.unwrap_or_else(ids::task_id);
        let workspace = match (&worker, req.isolation) {
            (Some(w), _) => Some(
                self.place(w, &server, &directory, &task_id, req.base)
                    .await?,
            ),
            (None, Isolation::None) => None,
            (None, Isolation::Worktree) => Some(
                self.create_workspace(&directory, &task_id, req.base)
                    .await?,
            ),
        };
        let directory = workspace
            .as_ref()
            .map_or(directory, |(_, session_dir)| session_dir.clone());
        // The task's root is registered with the server's sandbox before its session exists,
        // so its first command already finds it; a task that cannot be confined as the user
        // asked does not start.
        let root = workspace
            .as_ref()
            .map_or(directory.as_str(), |(w, _)| w.path.as_str());
        let opt_out = crate::sandbox::tier_opt_out(&self.config(), req.tier.as_deref());
        let confinement = match admit(&server, root, opt_out).await {
            Ok(confinement) => confinement,
            Err(e) => {
                self.drop_workspace(workspace.as_ref().map(|(w, _)| w))
                    .await;
                return Err(e);
            }
        };
        let forced = forced_rules(&self.config(), &server);
        let session_id = match server.api.create_session(&directory, &title, &forced).await {
            Ok(id) => id,
            Err(e) => {
                self.drop_workspace(workspace.as_ref().map(|(w, _)| w))
                    .await;
                return Err(e.into());
            }
        };
        let message_id = ids::message_id();
        let mut rec = TaskRecord::new(
            task_id.clone(),
            server.id.clone(),
            session_id.clone(),
            directory.clone(),
            title,
        );
        rec.server_url = server.api.base_url().to_string();
        rec.managed = server.process.is_some();
        rec.confinement = Some(confinement);
        rec.idempotency = idempotency;
        rec.workspace = workspace.as_ref().map(|(w, _)| w.clone());
        rec.tier = req.tier.clone();
        rec.budget = (!budget.is_unlimited()).then_some(budget);
        rec.variant = variant.clone();
        rec.price = price.map(|p| (model.clone().unwrap_or_default(), p));
        rec.group = req.group.clone();
        rec.structured = req.output_schema.clone().map(StructuredState::new);
        rec.checks =
            (!checks.is_empty()).then(|| super::lifecycle::record::ChecksState::new(checks));
        let prompt = match &req.output_schema {
            Some(schema) => format!("{}{}", req.prompt, structured::instruction(schema)),
            None => req.prompt.clone(),
        };
        let mut entry = TaskEntry::new(rec);
        if let Err(refused) = entry.begin_turn(message_id.clone(), req.agent.clone(), model.clone())
        {
            self.drop_workspace(workspace.as_ref().map(|(w, _)| w))
                .await;
            return Err(TaskError::Conflict(format!("task {task_id}: {refused}")));
        }
        // Registered before the prompt goes out, so no event of this turn can be missed.
        self.registry.insert(entry);
        drop(room);
        if let Err(e) = server
            .api
            .prompt_async(
                &directory,
                &session_id,
                &message_id,
                &prompt,
                RunOn {
                    agent: req.agent.as_deref(),
                    model: model.as_deref(),
                    variant: variant.as_deref(),
                },
            )
            .await
        {
            // A task that was queued keeps its id: it ends failed (by the queue) rather than
            // vanishing.
            if from_queue {
                let error = super::lifecycle::record::start_failed(&e);
                self.registry.update(&task_id, |entry| {
                    let turn = entry.rec.turn;
                    entry.finish(Claim::Gone(turn), TaskStatus::Failed, Some(error));
                });
            } else {
                self.registry.remove(&task_id);
            }
            self.drop_workspace(workspace.as_ref().map(|(w, _)| w))
                .await;
            return Err(e.into());
        }
        self.arm_deadline(&server, &task_id, 1, self.config().timeouts.task.get());
        self.snapshot(&task_id, false)
    }

    /// Sends a follow-up in the same session. Refused while the task is still working: a prompt
    /// sent to a busy session is queued and batched into the running LLM call, which would blur
    /// which result belongs to which prompt. Of two concurrent continues exactly one opens the
    /// turn (a compare-and-set on the turn number under the registry lock); the other gets
    /// `conflict`.
    pub async fn continue_task(&self, req: ContinueTask) -> Result<TaskSnapshot, TaskError> {
        self.restored().await;
        let entry = self.own_entry(&req.task_id)?;
        let still_running = |e: &TaskEntry| {
            TaskError::Conflict(format!(
                "task {} is still {}; wait for it (opencode_wait_for_task) or cancel it before continuing",
                e.rec.id,
                e.rec.status().as_str()
            ))
        };
        if !entry.is_settled() {
            return Err(still_running(&entry));
        }
        if entry.rec.workspace.as_ref().is_some_and(|w| w.discarded) {
            return Err(TaskError::Conflict(format!(
                "task {}'s worktree was discarded (opencode_discard_task), so there is nothing to \
                 continue in; start a new task",
                entry.rec.id
            )));
        }
        let server = self.server_for_follow_up(&entry).await?;
        let agent = req.agent.clone().or(entry.rec.agent.clone());
        let model = match req.model.as_deref() {
            Some(_) => {
                resolve::choose(
                    &self.config(),
                    &server,
                    &entry.rec.directory,
                    agent.as_deref(),
                    req.model.as_deref(),
                    None,
                    None,
                )
                .await?
                .model
            }
            None => {
                if req.agent.is_some() {
                    resolve::choose(
                        &self.config(),
                        &server,
                        &entry.rec.directory,
                        agent.as_deref(),
                        None,
                        None,
                        None,
                    )
                    .await?;
                }
                entry.rec.model.clone()
            }
        };
        // A structured task's schema still applies: the follow-up asks for the JSON again, and a
        // new round of checks (with the whole retry budget) begins.
        let prompt = match &entry.rec.structured {
            Some(s) => format!("{}{}", req.prompt, structured::instruction(&s.schema)),
            None => req.prompt.clone(),
        };
        let own_model = req.model.is_some();
        let more_checks = super::checks::commands_for(&self.config(), None, &req.checks)
            .map_err(TaskError::InvalidArgument)?;
        if entry.rec.checks.as_ref().map_or(0, |c| c.commands.len()) + more_checks.len()
            > super::checks::MAX_CHECKS
        {
            return Err(TaskError::InvalidArgument(format!(
                "a task takes at most {} checks, with those it has",
                super::checks::MAX_CHECKS
            )));
        }
        open_turn(
            &self.tracker,
            &server,
            &entry.rec.id,
            entry.rec.turn,
            Follows::Finished,
            &prompt,
            agent,
            model,
            |e| {
                if own_model {
                    // A model of its own: the turn is no longer the tier's work, and the tier's
                    // variant belongs to the tier's model.
                    e.rec.tier = None;
                    e.rec.variant = None;
                }
                if let Some(s) = e.rec.structured.as_mut() {
                    s.restart();
                }
                match e.rec.checks.as_mut() {
                    Some(c) => c.restart(&more_checks),
                    None if !more_checks.is_empty() => {
                        e.rec.checks =
                            Some(super::lifecycle::record::ChecksState::new(more_checks));
                    }
                    None => {}
                }
            },
        )
        .await?;
        self.snapshot(&entry.rec.id, false)
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
        self.restored().await;
        let entry = self.own_entry(task_id)?;
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
        let server = self.server(&entry.rec.server_id)?;
        server
            .api
            .reply_permission(&entry.rec.directory, &ask.id, reply)
            .await?;
        self.registry
            .update(task_id, |e| e.permission_answered(&ask.id));
        self.snapshot(task_id, false)
    }

    pub async fn status(
        &self,
        task_id: &str,
        include_progress: bool,
    ) -> Result<TaskSnapshot, TaskError> {
        self.restored().await;
        let snapshot = self.snapshot(task_id, include_progress)?;
        if snapshot.status.is_terminal() {
            self.durable().await;
        }
        Ok(snapshot)
    }

    /// Waits (bounded) until every record change made so far is on disk: a task is reported
    /// finished only once its record says so, or a host told "completed" whose gateway is then
    /// killed would find the task interrupted after the restart (a clean-clone run did).
    pub(super) async fn durable(&self) {
        if let Some(store) = self.registry.store() {
            if let Err(e) = store.flush(REPORTED_DURABLE).await {
                tracing::warn!(error = %e, "a finished task is reported before its record is on disk");
            }
        }
    }

    pub(super) fn snapshot(
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
            .pool
            .all()
            .into_iter()
            .filter(|s| s.exited().is_none())
            .map(|s| async move { self.flush_outcomes(&s, true, SHUTDOWN_FLUSH).await });
        futures::future::join_all(flushes).await;
        self.pool.stop_all().await;
        self.stop_worker_serves().await;
        // Stopping failed the tasks still running; those records, like any still queued, must
        // be on disk before the process exits.
        if let Some(store) = self.registry.store() {
            if let Err(e) = store.flush(store::SHUTDOWN_FLUSH).await {
                tracing::warn!(error = %e, "task records may be missing from the state directory");
            }
        }
    }
}

impl TaskService {
    /// What a server offers, and what each configured tier resolves to there (`list_agents`).
    pub async fn list_agents(&self, server_id: &str) -> Result<AgentCatalog, TaskError> {
        let server = self.server(server_id)?;
        resolve::catalog(&server, &self.config()).await
    }

    /// Aborts the turn (and rejects every permission it, or one of its subagents, waits on);
    /// idempotent on finished tasks. A task is reported cancelled only once its record says so
    /// on disk (a gateway killed right after must not bring it back running).
    pub async fn cancel(&self, task_id: &str) -> Result<TaskSnapshot, TaskError> {
        self.restored().await;
        let entry = self.own_entry(task_id)?;
        if entry.rec.status().is_terminal() {
            self.durable().await;
            return self.snapshot(task_id, false);
        }
        if matches!(entry.phase(), Phase::Queued | Phase::Starting) {
            return self.cancel_queued(task_id).await;
        }
        let server = self.server(&entry.rec.server_id)?;
        let finished = super::abort::abort_turn(
            &self.tracker,
            &server,
            task_id,
            Some(entry.rec.turn),
            TaskStatus::Cancelled,
            None,
            super::abort::IfAbortFails::KeepRunning,
        )
        .await?;
        if let Some(turn) = finished {
            outcome::spawn_outcome(&self.tracker, &server, task_id.to_string(), turn);
        }
        let snapshot = self.snapshot(task_id, false)?;
        if snapshot.status.is_terminal() {
            self.durable().await;
        }
        Ok(snapshot)
    }

    /// Aborts the turn `after` from now (its `timeouts.task` deadline) if it is still running then.
    pub(super) fn arm_deadline(
        &self,
        server: &Arc<Server>,
        task_id: &str,
        turn: u32,
        after: Duration,
    ) {
        let limit = self.config().timeouts.task.get();
        self.tracker
            .arm_deadline(server, task_id, turn, after, limit);
    }
}

/// A session title from the prompt's first line (OpenCode would otherwise spend an LLM call).
pub fn default_title(prompt: &str) -> String {
    let line = prompt
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("task");
    let mut title: String = line.chars().take(60).collect();
    if line.chars().count() > 60 {
        title.push('…');
    }
    format!("[opencode-mcp] {title}")
}

/// Registers a task's `root` with its server's sandbox (and puts the confining shell back in
/// place if it went missing), before each turn: a task is never run unconfined on a server
/// that confines.
///
/// `opt_out`: why this turn runs unconfined on a server that confines (its tier's
/// `sandbox: off`, [`crate::sandbox::tier_opt_out`]). Returns what the task's record says of
/// its confinement for the turn.
pub(super) async fn admit(
    server: &Server,
    root: &str,
    opt_out: Option<String>,
) -> Result<crate::sandbox::Confinement, TaskError> {
    let refuse = |why: String| TaskError::Opencode(crate::opencode::OpencodeError::Start(why));
    let open = opt_out.is_some();
    let expected = if let Some(shell) = &server.worker_shell {
        shell
            .ensure(root, open)
            .await
            .map_err(crate::workers::serve::ServeError::from)?;
        shell.path.clone()
    } else if let Some(sandbox) = &server.sandbox {
        sandbox.admit(Path::new(root), open).map_err(|e| {
            refuse(format!(
                "cannot confine the task to {root}: the sandbox's files could not be written ({e})"
            ))
        })?;
        sandbox.shell().display().to_string()
    } else {
        return Ok(server.confinement.clone());
    };
    // OpenCode falls back to plain `bash` without a word: the task starts only once its
    // instance is seen to run commands through the confining shell.
    let shell = server.api.configured_shell(root).await?;
    if shell.as_deref() != Some(expected.as_str()) {
        let place = server
            .worker
            .as_deref()
            .map_or_else(|| "here".to_string(), |w| format!("on worker {w}"));
        return Err(refuse(format!(
            "the task would not run confined: OpenCode {place} runs its agents' commands with \
             {} instead of the confining shell {expected}, so its command or environment \
             replaces the OPENCODE_CONFIG_CONTENT the gateway gives it (a wrapper script?). \
             Fix: put that OpenCode's own settings in its config file \
             (~/.config/opencode/opencode.json) instead, or turn confinement off in your own \
             delegation.yaml",
            shell.as_deref().unwrap_or("its default shell"),
        )));
    }
    Ok(match opt_out {
        Some(why) => crate::sandbox::Confinement::Unconfined(why),
        None => server.confinement.clone(),
    })
}

/// The permission rules a new session on `server` gets ([`crate::sandbox::session_rules`]):
/// on this machine while `sandbox.mode` is on (an attached server too: its commands are not
/// confined, but its edits are still held), on a worker while its tasks run confined.
fn forced_rules(
    config: &crate::config::Config,
    server: &Server,
) -> Vec<crate::opencode::ForcedRule> {
    match (&server.worker, &server.worker_shell) {
        (None, _) if config.sandbox.mode == crate::config::SandboxMode::On => {
            crate::sandbox::session_rules(
                crate::sandbox::opencode_dir("XDG_DATA_HOME", ".local/share").as_deref(),
            )
        }
        (Some(_), Some(shell)) => {
            crate::sandbox::session_rules(shell.opencode_data.as_deref().map(Path::new))
        }
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys of tasks that are gone, or bound to nothing, do not pile up.
    #[test]
    fn idempotency_keys_of_gone_tasks_are_pruned() {
        let mut config = crate::gateway::test_config();
        let dir = std::env::temp_dir().join(format!("ocm-keys-{}", crate::ids::task_id()));
        config.state_dir = Some(dir.display().to_string());
        let service = TaskService::new(Arc::new(config));
        for i in 0..KEYS_PRUNE_AT {
            service.bind_key(format!("key-{i}"), 1, format!("tsk_gone_{i}"));
        }
        let held = service.key_slot("key-0");
        let guard = held.try_lock().expect("not in use");
        let _new = service.key_slot("another");
        drop(guard);
        let left = service.keys.lock().unwrap_or_else(|p| p.into_inner()).len();
        assert!(left <= 2, "{left} keys left");
        let _ = std::fs::remove_dir_all(&dir);
    }

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
        let seen = service.entry("tsk_theirs").expect("read from its record");
        assert_eq!(seen.live.foreign, Some(1));
        assert_eq!(seen.rec.status(), TaskStatus::Running);
        let refused = service.own_entry("tsk_theirs").expect_err("refused");
        assert!(
            refused.to_string().contains("another gateway (pid 1)"),
            "{refused}"
        );
        assert_eq!(
            service.snapshot("tsk_theirs", false).map(|s| s.status).ok(),
            Some(TaskStatus::Running)
        );
        rec.finish_for_test(TaskStatus::Completed, None);
        store.submit(rec);
        store
            .flush_blocking(std::time::Duration::from_secs(10))
            .expect("written");
        assert!(
            service.own_entry("tsk_theirs").is_ok(),
            "finished: ours to act on"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Placement: this machine first, then the worker with the most free slots among those
    /// that take the task's tier; a worker that declares tiers takes no task of another tier
    /// (nor one naming none); a task that can only run here (isolation `none`) stays here.
    #[test]
    fn placement_gives_a_worker_only_the_tiers_it_takes() {
        let mut config = crate::gateway::test_config();
        let dir = std::env::temp_dir().join(format!("ocm-place-{}", crate::ids::task_id()));
        config.state_dir = Some(dir.display().to_string());
        config.workers = yaml_serde::from_str(
            "local:\n  max_tasks: 1\ncheap:\n  ssh: cheap\n  max_tasks: 2\n  tiers: [fast]\nany:\n  ssh: any\n  max_tasks: 1\n",
        )
        .expect("workers");
        let service = TaskService::new(Arc::new(config));
        let take = |tier: Option<&str>, isolation| {
            service
                .reserve(None, isolation, tier, 1)
                .map(|mut s| s.pop().expect("a slot"))
        };
        let here = take(Some("fast"), Isolation::Worktree).expect("room here");
        assert_eq!(here.worker(), "local");
        let cheap = take(Some("fast"), Isolation::Worktree).expect("room on cheap");
        assert_eq!(cheap.worker(), "cheap", "2 free there, 1 on any");
        let untiered = take(None, Isolation::Worktree).expect("room on any");
        assert_eq!(untiered.worker(), "any", "cheap takes only tier fast");
        let refused = take(Some("strong"), Isolation::Worktree).expect_err("no room");
        assert!(
            refused
                .to_string()
                .contains("every worker's slots are taken"),
            "{refused}"
        );
        assert!(
            !refused.to_string().contains("cheap"),
            "cheap was not asked: {refused}"
        );
        let here_only = take(Some("fast"), Isolation::None).expect_err("this machine is full");
        assert!(
            here_only.to_string().contains("on this machine"),
            "{here_only}"
        );
        drop((here, cheap, untiered));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn titles_come_from_the_first_non_empty_line() {
        assert_eq!(
            default_title("\n  fix the bug\nmore"),
            "[opencode-mcp] fix the bug"
        );
        assert!(default_title(&"x".repeat(100)).ends_with('…'));
    }
}

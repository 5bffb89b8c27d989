//! The task actions: start, continue, cancel, status, result, wait, and the server actions that
//! touch tasks (start, stop, list agents). Tool handlers in `gateway` call exactly one of these.

use std::sync::Arc;
use std::time::Duration;

use schemars::JsonSchema;
use serde::Serialize;

use super::error::TaskError;
use super::model::{TaskResult, TaskSnapshot, TaskStatus, WaitMode, WaitOutcome};
use super::registry::{Registry, TaskEntry};
use super::store::{self, Store};
use super::tracker::{self, TrackerContext};
use crate::config::{Config, Tier};
use crate::ids;
use crate::opencode::{
    resolve_directory, AgentInfo, ErrorInfo, ModelCatalog, OpencodeError, PermissionReply, Server,
    ServerInfo, ServerPool, StopInfo,
};

/// A validated `start_task` request.
#[derive(Debug, Clone, Default)]
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
}

/// A validated `continue_task` request.
#[derive(Debug, Clone, Default)]
pub struct ContinueTask {
    pub task_id: String,
    pub prompt: String,
    pub agent: Option<String>,
    pub model: Option<String>,
}

/// A tier and what it resolves to on one server.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct TierResolution {
    pub name: String,
    pub handles: String,
    /// The model the tier resolves to now (`provider/model`); absent = the server's default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// `false` when the tier lists models and the server offers none of them.
    pub available: bool,
}

/// What `list_agents` reports.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct AgentCatalog {
    pub server_id: String,
    pub agents: Vec<AgentInfo>,
    /// Every model the server offers, as exact `provider/model` ids.
    pub models: Vec<String>,
    /// The server's default model per provider (`provider/model`).
    pub default_models: Vec<String>,
    pub tiers: Vec<TierResolution>,
}

/// The tasks and the servers they run on.
pub struct TaskService {
    config: Arc<Config>,
    pool: ServerPool,
    registry: Arc<Registry>,
    /// `false` while stored tasks are being loaded at start-up.
    restored: tokio::sync::watch::Sender<bool>,
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
        let registry = match dir.as_deref().map(Store::open) {
            Some(Ok(s)) => Registry::with_store(s),
            Some(Err(e)) => {
                tracing::warn!(error = %e, dir = ?dir, "the state directory is not usable; tasks will not survive a restart");
                Registry::new()
            }
            None => {
                tracing::warn!("no state directory (set state_dir, XDG_STATE_HOME or HOME); tasks will not survive a restart");
                Registry::new()
            }
        };
        Self {
            pool: ServerPool::new(config.clone()),
            registry: Arc::new(registry),
            restored: tokio::sync::watch::Sender::new(true),
            config,
        }
    }

    /// Loads the tasks a previous gateway left in the state directory. Finished tasks become
    /// answerable again; unfinished ones on a managed server died with that gateway's server and
    /// are reported `failed` (`Interrupted`); unfinished ones on the attached server are adopted
    /// and finish normally. Unfinished tasks of another gateway that is still running are left to
    /// it.
    ///
    /// The store is read on a blocking thread so `initialize` is answered at once (a full store
    /// takes about 10 ms per 1,000 records); every action that reads tasks waits for it
    /// ([`Self::restored`]). Adopting, which needs the network, runs after that in the background.
    pub fn restore(self: &Arc<Self>) {
        let Some(store) = self.registry.store().cloned() else {
            return;
        };
        self.restored.send_replace(false);
        let this = self.clone();
        tokio::spawn(async move {
            let loaded = tokio::task::spawn_blocking(move || store.load_all()).await;
            let adopt = match loaded {
                Ok((records, bad)) => this.take_over(records, bad),
                Err(e) => {
                    tracing::warn!(error = %e, "reading the state directory failed");
                    Vec::new()
                }
            };
            this.restored.send_replace(true);
            if !adopt.is_empty() {
                this.adopt(adopt).await;
            }
        });
    }

    /// Resolves once the stored tasks are loaded (at once when there is nothing to load).
    async fn restored(&self) {
        let mut rx = self.restored.subscribe();
        let _ = rx.wait_for(|done| *done).await;
    }

    /// Registers loaded records; returns the ids to adopt on the attached server.
    fn take_over(
        &self,
        records: Vec<store::StoredTask>,
        bad: Vec<(std::path::PathBuf, String)>,
    ) -> Vec<String> {
        for (path, why) in bad {
            tracing::warn!(path = %path.display(), %why, "skipping an unreadable task record");
        }
        let attach_url = self
            .config
            .opencode
            .url
            .as_deref()
            .map(|u| u.trim_end_matches('/').to_string());
        let mut adopt = Vec::new();
        let mut loaded = 0usize;
        for record in records {
            if record.status.is_terminal() {
                self.registry.restore(record.into_entry());
                loaded += 1;
                continue;
            }
            if record.owner_pid != std::process::id() && store::gateway_alive(record.owner_pid) {
                continue;
            }
            let attached_here =
                !record.managed && attach_url.as_deref() == Some(record.server_url.as_str());
            let mut entry = record.into_entry();
            if attached_here {
                adopt.push(entry.id.clone());
                self.registry.insert(entry);
            } else {
                let reason = if entry.managed {
                    "the gateway running this task exited, and its managed OpenCode server with it; start the task again"
                } else {
                    "the gateway running this task exited, and the OpenCode server it was attached to is no longer configured (opencode.url)"
                };
                entry.finish(TaskStatus::Failed, Some(store::interrupted(reason)));
                self.registry.insert(entry);
            }
            loaded += 1;
        }
        if loaded > 0 {
            tracing::info!(
                tasks = loaded,
                adopting = adopt.len(),
                "restored tasks from the state directory"
            );
        }
        adopt
    }

    /// Attaches to the configured server and hands it the unfinished tasks a previous gateway
    /// left there.
    async fn adopt(&self, adopt: Vec<String>) {
        let server = match self.start_server(None, None).await {
            Ok(info) => self.pool.get(&info.server_id),
            Err(e) => {
                tracing::warn!(error = %e, "cannot reach the attached OpenCode to adopt unfinished tasks");
                None
            }
        };
        let Some(server) = server else {
            for id in &adopt {
                self.registry.update(id, |e| {
                    e.finish(
                        TaskStatus::Failed,
                        Some(store::interrupted(
                            "the gateway restarted and could not reach the attached OpenCode server to pick this task up again",
                        )),
                    )
                });
            }
            return;
        };
        let limit = self.config.timeouts.task.get();
        for id in adopt {
            let Some((turn, elapsed)) = self.registry.update(&id, |e| {
                e.server_id = server.id.clone();
                (e.turn, e.turn_started.elapsed())
            }) else {
                continue;
            };
            self.arm_deadline(&server, &id, turn, limit.saturating_sub(elapsed));
            let ctx = self.tracker_context();
            let server = server.clone();
            tokio::spawn(async move {
                tracker::check_completion(&ctx, &server, &id, tracker::Activity::Unknown).await
            });
        }
    }

    fn tracker_context(&self) -> TrackerContext {
        TrackerContext {
            registry: self.registry.clone(),
            tail_chars: self.config.limits.progress_tail_chars as usize,
            max_result_chars: self.config.limits.max_result_chars as usize,
            finished_ttl: self.config.limits.finished_task_ttl.get(),
        }
    }

    fn stall(&self) -> Duration {
        self.config.timeouts.stall.get()
    }

    fn server(&self, server_id: &str) -> Result<Arc<Server>, TaskError> {
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

    fn entry(&self, task_id: &str) -> Result<TaskEntry, TaskError> {
        self.registry
            .get(task_id)
            .ok_or_else(|| TaskError::UnknownTasks(vec![task_id.to_string()]))
    }

    pub async fn start_server(
        &self,
        port: Option<u16>,
        directory: Option<String>,
    ) -> Result<ServerInfo, TaskError> {
        let (info, started) = self.pool.start(port, directory).await?;
        if let Some(started) = started {
            tokio::spawn(tracker::run(
                self.tracker_context(),
                started.server,
                started.events,
            ));
        }
        Ok(info)
    }

    pub async fn stop_server(&self, server_id: &str) -> Result<StopInfo, TaskError> {
        let (server, exit) = self
            .pool
            .stop(server_id)
            .await
            .ok_or_else(|| TaskError::UnknownServer(server_id.to_string()))?;
        let failed_tasks = tracker::fail_server_tasks(
            &self.registry,
            &server.id,
            &format!(
                "the OpenCode server {} was stopped by opencode_stop_server",
                server.id
            ),
        );
        Ok(StopInfo {
            server_id: server.id.clone(),
            terminated: server.process.is_some(),
            exit,
            failed_tasks,
        })
    }

    pub async fn list_agents(&self, server_id: &str) -> Result<AgentCatalog, TaskError> {
        let server = self.server(server_id)?;
        let (agents, catalog) = tokio::join!(
            server.api.agents(&server.directory),
            server.api.models(&server.directory)
        );
        let (agents, catalog) = (agents?, catalog?);
        let tiers = self
            .config
            .tiers
            .iter()
            .map(|t| resolve_tier(t, &catalog))
            .collect();
        Ok(AgentCatalog {
            server_id: server.id.clone(),
            agents,
            default_models: catalog
                .defaults
                .iter()
                .map(|(p, m)| format!("{p}/{m}"))
                .collect(),
            models: catalog.models,
            tiers,
        })
    }

    /// Checks agent, model and tier against the live server; returns the model to use.
    async fn choose(
        &self,
        server: &Server,
        directory: &str,
        agent: Option<&str>,
        model: Option<&str>,
        tier: Option<&str>,
    ) -> Result<Option<String>, TaskError> {
        let tier = match tier {
            Some(name) => Some(
                self.config
                    .tiers
                    .iter()
                    .find(|t| t.name == name)
                    .ok_or_else(|| {
                        TaskError::InvalidArgument(format!(
                            "unknown tier `{name}`; configured tiers: {}",
                            self.config
                                .tiers
                                .iter()
                                .map(|t| t.name.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ))
                    })?,
            ),
            None => None,
        };
        let need_models = model.is_some() || tier.is_some_and(|t| !t.models.is_empty());
        let (agents, catalog) = tokio::join!(
            async {
                match agent {
                    Some(_) => server.api.agents(directory).await.map(Some),
                    None => Ok(None),
                }
            },
            async {
                if need_models {
                    server.api.models(directory).await.map(Some)
                } else {
                    Ok(None)
                }
            }
        );
        if let (Some(name), Some(agents)) = (agent, agents?) {
            if !agents.iter().any(|a| a.name == name) {
                return Err(TaskError::InvalidArgument(format!(
                    "unknown agent `{name}`; this server offers: {}",
                    agents
                        .iter()
                        .map(|a| a.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        }
        let catalog = catalog?.unwrap_or_default();
        if let Some(m) = model {
            if !catalog.contains(m) {
                return Err(TaskError::InvalidArgument(format!(
                    "unknown model `{m}`; this server offers: {}",
                    list_some(&catalog.models)
                )));
            }
            return Ok(Some(m.to_string()));
        }
        if let Some(t) = tier {
            let r = resolve_tier(t, &catalog);
            if !r.available {
                return Err(TaskError::InvalidArgument(format!(
                    "tier `{}` lists {} but this server offers none of them; it offers: {}",
                    t.name,
                    t.models.join(", "),
                    list_some(&catalog.models)
                )));
            }
            return Ok(r.model);
        }
        Ok(None)
    }

    /// Makes room for one more task: evicts expired finished tasks, then refuses at the cap.
    fn ensure_capacity(&self) -> Result<(), TaskError> {
        self.registry
            .evict_finished(self.config.limits.finished_task_ttl.get());
        let max = self.config.limits.max_tasks as usize;
        if self.registry.count() >= max {
            return Err(TaskError::LimitExceeded(format!(
                "{max} tasks are tracked (limits.max_tasks); wait for some to finish, or raise the limit"
            )));
        }
        Ok(())
    }

    /// Creates a session, sends the prompt, and returns as soon as OpenCode accepted it.
    pub async fn start(&self, req: StartTask) -> Result<TaskSnapshot, TaskError> {
        self.restored().await;
        let server = self.server(&req.server_id)?;
        self.ensure_capacity()?;
        let directory = match req.directory {
            Some(d) => resolve_directory(Some(d))?,
            None => server.directory.clone(),
        };
        let model = self
            .choose(
                &server,
                &directory,
                req.agent.as_deref(),
                req.model.as_deref(),
                req.tier.as_deref(),
            )
            .await?;
        let title = req
            .title
            .clone()
            .unwrap_or_else(|| default_title(&req.prompt));
        let session_id = server.api.create_session(&directory, &title).await?;
        let task_id = ids::task_id();
        let message_id = ids::message_id();
        let mut entry = TaskEntry::new(
            task_id.clone(),
            server.id.clone(),
            session_id.clone(),
            directory.clone(),
            title,
        );
        entry.server_url = server.api.base_url().to_string();
        entry.managed = server.process.is_some();
        entry.begin_turn(message_id.clone(), req.agent.clone(), model.clone());
        // Registered before the prompt goes out, so no event of this turn can be missed.
        self.registry.insert(entry);
        if let Err(e) = server
            .api
            .prompt_async(
                &directory,
                &session_id,
                &message_id,
                &req.prompt,
                req.agent.as_deref(),
                model.as_deref(),
            )
            .await
        {
            self.registry.remove(&task_id);
            return Err(e.into());
        }
        self.arm_deadline(&server, &task_id, 1, self.config.timeouts.task.get());
        self.snapshot(&task_id, false)
    }

    /// Sends a follow-up in the same session. Refused while the task is still working: a prompt
    /// sent to a busy session is queued and batched into the running LLM call, which would blur
    /// which result belongs to which prompt.
    pub async fn continue_task(&self, req: ContinueTask) -> Result<TaskSnapshot, TaskError> {
        self.restored().await;
        let entry = self.entry(&req.task_id)?;
        if !entry.status.is_terminal() || entry.aborting {
            return Err(TaskError::Conflict(format!(
                "task {} is still {}; wait for it (opencode_wait_for_task) or cancel it before continuing",
                entry.id,
                entry.status.as_str()
            )));
        }
        let server = self.server(&entry.server_id)?;
        let agent = req.agent.clone().or(entry.agent.clone());
        let model = match req.model.as_deref() {
            Some(_) => {
                self.choose(
                    &server,
                    &entry.directory,
                    agent.as_deref(),
                    req.model.as_deref(),
                    None,
                )
                .await?
            }
            None => {
                if req.agent.is_some() {
                    self.choose(&server, &entry.directory, agent.as_deref(), None, None)
                        .await?;
                }
                entry.model.clone()
            }
        };
        let message_id = ids::message_id();
        let previous = entry.clone();
        let turn = self
            .registry
            .update(&entry.id, |e| {
                e.begin_turn(message_id.clone(), agent.clone(), model.clone());
                e.turn
            })
            .ok_or_else(|| TaskError::UnknownTasks(vec![entry.id.clone()]))?;
        if let Err(e) = server
            .api
            .prompt_async(
                &entry.directory,
                &entry.session_id,
                &message_id,
                &req.prompt,
                agent.as_deref(),
                model.as_deref(),
            )
            .await
        {
            // The follow-up never started: the previous turn's result stays readable.
            self.registry.update(&entry.id, |e| *e = previous);
            return Err(e.into());
        }
        self.arm_deadline(&server, &entry.id, turn, self.config.timeouts.task.get());
        self.snapshot(&entry.id, false)
    }

    /// Aborts the turn (and rejects a permission it waits on); idempotent on finished tasks.
    pub async fn cancel(&self, task_id: &str) -> Result<TaskSnapshot, TaskError> {
        self.restored().await;
        let entry = self.entry(task_id)?;
        if entry.status.is_terminal() {
            return self.snapshot(task_id, false);
        }
        let server = self.server(&entry.server_id)?;
        abort_turn(
            &self.registry,
            &server,
            task_id,
            entry.turn,
            TaskStatus::Cancelled,
            None,
            IfAbortFails::KeepRunning,
        )
        .await?;
        self.snapshot(task_id, false)
    }

    /// Aborts the turn `after` from now (its `timeouts.task` deadline) if it is still running then.
    fn arm_deadline(&self, server: &Arc<Server>, task_id: &str, turn: u32, after: Duration) {
        let limit = self.config.timeouts.task.get();
        let registry = self.registry.clone();
        let server = server.clone();
        let task_id = task_id.to_string();
        let stop = server.stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = tokio::time::sleep(after) => {
                    let error = ErrorInfo {
                        name: "TaskTimeout".into(),
                        message: format!(
                            "the task ran longer than timeouts.task ({}) and was aborted",
                            humantime::format_duration(limit)
                        ),
                    };
                    // Infallible with FinishAnyway.
                    let _ = abort_turn(
                        &registry,
                        &server,
                        &task_id,
                        turn,
                        TaskStatus::TimedOut,
                        Some(error),
                        IfAbortFails::FinishAnyway,
                    )
                    .await;
                }
            }
        });
    }

    /// Answers the permission the task is waiting on. Refused when it waits on none, so an
    /// answer can never land on a later, different ask.
    pub async fn reply_permission(
        &self,
        task_id: &str,
        reply: PermissionReply,
    ) -> Result<TaskSnapshot, TaskError> {
        self.restored().await;
        let entry = self.entry(task_id)?;
        let ask = match (&entry.permission, entry.status) {
            (Some(ask), TaskStatus::WaitingPermission) => ask.clone(),
            _ => {
                return Err(TaskError::Conflict(format!(
                    "task {} is not waiting for a permission (status {})",
                    entry.id,
                    entry.status.as_str()
                )))
            }
        };
        let server = self.server(&entry.server_id)?;
        server
            .api
            .reply_permission(&entry.directory, &ask.id, reply)
            .await?;
        self.registry.update(task_id, |e| {
            if e.permission.as_ref().is_some_and(|p| p.id == ask.id) {
                e.permission = None;
                if e.status == TaskStatus::WaitingPermission {
                    e.status = TaskStatus::Running;
                }
            }
        });
        self.snapshot(task_id, false)
    }

    pub async fn status(
        &self,
        task_id: &str,
        include_progress: bool,
    ) -> Result<TaskSnapshot, TaskError> {
        self.restored().await;
        self.snapshot(task_id, include_progress)
    }

    fn snapshot(&self, task_id: &str, include_progress: bool) -> Result<TaskSnapshot, TaskError> {
        self.registry
            .snapshots(&[task_id.to_string()], include_progress, self.stall())
            .map_err(TaskError::UnknownTasks)?
            .pop()
            .ok_or_else(|| TaskError::UnknownTasks(vec![task_id.to_string()]))
    }

    /// The full result of the current turn; `offset` is in characters. For an unfinished task it
    /// reports what is known so far, with the same status `get_task_status` gives.
    pub async fn result(&self, task_id: &str, offset: u64) -> Result<TaskResult, TaskError> {
        self.restored().await;
        let entry = self.entry(task_id)?;
        let server = self
            .pool
            .get(&entry.server_id)
            .filter(|s| s.exited().is_none());
        let outcome = match (&entry.outcome, &server) {
            (Some(o), _) => Some(o.clone()),
            (None, Some(s)) => s
                .api
                .turn_state(&entry.directory, &entry.session_id, &entry.user_message_id)
                .await
                .ok()
                .map(|t| t.cap_text(self.config.limits.max_result_chars as usize)),
            (None, None) => None,
        };
        let files = match (&entry.files_changed, &server) {
            (Some(f), _) => f.clone(),
            (None, Some(s)) => {
                let files = s
                    .api
                    .changed_files(&entry.directory, &entry.session_id, None)
                    .await
                    .unwrap_or_default();
                if entry.status.is_terminal() {
                    let f = files.clone();
                    let turn = entry.turn;
                    self.registry.update(task_id, |e| {
                        if e.turn == turn {
                            e.files_changed = Some(f);
                        }
                    });
                }
                files
            }
            (None, None) => Vec::new(),
        };
        // Status is re-read so result never disagrees with status (the original's bug 3).
        let current = self.entry(task_id)?;
        let outcome = outcome.unwrap_or_default();
        let page = self.config.limits.result_page_chars as usize;
        let total = outcome.text.chars().count();
        let start = (offset as usize).min(total);
        let text: String = outcome.text.chars().skip(start).take(page).collect();
        let end = start + text.chars().count();
        Ok(TaskResult {
            task_id: current.id.clone(),
            status: current.status,
            turn: current.turn,
            truncated: end < total,
            next_offset: (end < total).then_some(end as u64),
            offset: start as u64,
            total_chars: total as u64,
            text,
            text_capped: outcome.text_capped,
            model: outcome.model.clone().or(current.model.clone()),
            agent: outcome.agent.clone().or(current.agent.clone()),
            tokens: outcome.tokens,
            cost: outcome.cost,
            finish: outcome.finish.clone(),
            duration_ms: current.duration().as_millis() as u64,
            files_changed: files,
            tools: outcome.tools.clone(),
            error: current.error.clone(),
        })
    }

    /// Waits up to `timeout` for the ids (already de-duplicated) to satisfy `mode`. Never
    /// cancels a task; dropping the future ends only the wait.
    pub async fn wait(
        &self,
        task_ids: &[String],
        mode: WaitMode,
        timeout: Duration,
        include_progress: bool,
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
            let expired = tokio::time::Instant::now() >= deadline;
            if done || expired {
                return Ok(WaitOutcome {
                    done,
                    timed_out: !done,
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

    /// Stops every managed server (used on shutdown), then waits for the task store's writer:
    /// stopping fails the tasks still running, and those records, like any still queued, must be
    /// on disk before the process exits.
    pub async fn shutdown(&self) {
        self.pool.stop_all().await;
        if let Some(store) = self.registry.store() {
            if let Err(e) = store.flush(store::SHUTDOWN_FLUSH).await {
                tracing::warn!(error = %e, "task records may be missing from the state directory");
            }
        }
    }
}

/// What [`abort_turn`] does when OpenCode refuses or cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IfAbortFails {
    /// `cancel_task`: leave the task as it was and return the error (a 404 is never reported as
    /// a cancellation).
    KeepRunning,
    /// The deadline: the turn is over for us whatever OpenCode says; log and finish it.
    FinishAnyway,
}

/// Aborts turn `turn` of a task: claims it (so events cannot decide its status meanwhile, and a
/// second abort is a no-op), rejects a permission it waits on (OpenCode's abort leaves the ask
/// listed), aborts the session, and finishes the task with `status`. Shared by `cancel_task` and
/// the task deadline.
async fn abort_turn(
    registry: &Registry,
    server: &Server,
    task_id: &str,
    turn: u32,
    status: TaskStatus,
    error: Option<ErrorInfo>,
    if_fails: IfAbortFails,
) -> Result<(), OpencodeError> {
    let claimed = registry.update(task_id, |e| {
        if e.turn != turn || e.status.is_terminal() || e.aborting {
            None
        } else {
            e.aborting = true;
            Some(e.clone())
        }
    });
    let Some(Some(entry)) = claimed else {
        return Ok(());
    };
    if let Some(ask) = &entry.permission {
        if let Err(e) = server
            .api
            .reply_permission(&entry.directory, &ask.id, PermissionReply::Reject)
            .await
        {
            tracing::warn!(task_id, error = %e, "rejecting the pending permission failed");
        }
    }
    match server.api.abort(&entry.directory, &entry.session_id).await {
        Err(e) if if_fails == IfAbortFails::KeepRunning => {
            registry.update(task_id, |e| e.aborting = false);
            Err(e)
        }
        outcome => {
            if let Err(e) = outcome {
                tracing::warn!(task_id, error = %e, "aborting the session failed; finishing the task anyway");
            }
            registry.update(task_id, |e| {
                if e.turn == turn {
                    e.finish(status, error);
                }
            });
            Ok(())
        }
    }
}

/// A tier's model on a server: the first listed model the server offers; a tier that lists no
/// models means the server's default.
pub fn resolve_tier(tier: &Tier, catalog: &ModelCatalog) -> TierResolution {
    let (model, available) = if tier.models.is_empty() {
        (None, true)
    } else {
        match tier.models.iter().find(|m| catalog.contains(m)) {
            Some(m) => (Some(m.clone()), true),
            None => (None, false),
        }
    };
    TierResolution {
        name: tier.name.clone(),
        handles: tier.handles.clone(),
        model,
        available,
    }
}

fn list_some(items: &[String]) -> String {
    const MAX: usize = 40;
    if items.is_empty() {
        return "(none)".into();
    }
    let mut s = items
        .iter()
        .take(MAX)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if items.len() > MAX {
        s.push_str(&format!(", ... ({} more)", items.len() - MAX));
    }
    s
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

#[cfg(test)]
mod tests {
    use super::*;

    fn tier(models: &[&str]) -> Tier {
        Tier {
            name: "fast".into(),
            handles: "x".into(),
            models: models.iter().map(|m| m.to_string()).collect(),
        }
    }

    #[test]
    fn tiers_resolve_to_the_first_offered_model() {
        let catalog = ModelCatalog {
            models: vec!["a/one".into(), "b/two".into()],
            defaults: Default::default(),
        };
        assert_eq!(
            resolve_tier(&tier(&["z/nope", "b/two", "a/one"]), &catalog).model,
            Some("b/two".into())
        );
        let none = resolve_tier(&tier(&["z/nope"]), &catalog);
        assert!(!none.available && none.model.is_none());
        let default = resolve_tier(&tier(&[]), &catalog);
        assert!(default.available && default.model.is_none());
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

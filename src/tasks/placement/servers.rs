//! The OpenCode servers tasks run on: the one a task's turn uses (here, or on its worker),
//! started on request, and stopped with what is unread of their finished turns.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::Placement;

use crate::config::Isolation;
use crate::opencode::{OpenTurn, OpencodeError, Server, ServerInfo, StopInfo};
use crate::tasks::error::TaskError;
use crate::tasks::lifecycle::entry::TaskEntry;
use crate::tasks::model::TaskStatus;
use crate::tasks::tracking::tracker;
use crate::tasks::turn::outcome;

/// How long `stop_server` waits for what is unread of its finished turns.
const STOP_FLUSH: Duration = Duration::from_secs(5);

/// How an OpenCode runs on for its unfinished tasks once this gateway is gone (a host's
/// reconnect or update ends the gateway while tasks run).
#[derive(Debug, PartialEq)]
pub(in crate::tasks) struct Linger {
    /// `limits.linger`, but never past the last of the open turns' deadlines (`timeouts.task`):
    /// no gateway enforces a deadline meanwhile (on this machine the supervisor aborts each
    /// open turn at its own; a worker's OpenCode only stops), so this bounds what an agent can
    /// spend unwatched.
    pub grace: Duration,
    /// Its unfinished tasks.
    pub tasks: usize,
    /// Its open turns and what is left of each one's `timeouts.task`: the supervisor of a
    /// server on this machine aborts each at its deadline while no gateway runs.
    pub open: Vec<OpenTurn>,
}

impl Placement {
    pub(in crate::tasks) fn server(&self, server_id: &str) -> Result<Arc<Server>, TaskError> {
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
    pub(in crate::tasks) async fn server_for_follow_up(
        &self,
        entry: &TaskEntry,
    ) -> Result<Arc<Server>, TaskError> {
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
    pub(in crate::tasks) async fn server_in_use_for(
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
    pub async fn start_server(
        &self,
        port: Option<u16>,
        directory: Option<String>,
    ) -> Result<ServerInfo, TaskError> {
        let (info, started) = self.pool.start(port, directory).await?;
        if let Some(started) = started {
            self.track(started);
        }
        Ok(info)
    }

    /// Follows a server the pool just came to know (started, reached on a worker, or taken
    /// over): its events go to the tracker from now on. Returns the server.
    pub(in crate::tasks) fn track(&self, started: crate::opencode::Started) -> Arc<Server> {
        let server = started.server.clone();
        tokio::spawn(tracker::run(
            self.tracker.clone(),
            started.server,
            started.events,
        ));
        server
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
                crate::tasks::tracking::abort::abort_turn(
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
                    crate::tasks::tracking::abort::IfAbortFails::FinishAnyway,
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
    pub(in crate::tasks) async fn flush_outcomes(
        &self,
        server: &Arc<Server>,
        files: bool,
        bound: Duration,
    ) {
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

    /// Lets each managed server on this machine that still runs tasks outlive this gateway for
    /// `limits.linger` (a host's reconnect or update ends the gateway while tasks run), for the
    /// next gateway on this state directory to take over, as a worker's OpenCode does. One that
    /// cannot linger is stopped with the rest, and its tasks end as before.
    pub(in crate::tasks) async fn let_local_serves_linger(&self) {
        let lingers = self
            .pool
            .all()
            .into_iter()
            .filter(|s| s.process.is_some() && s.worker.is_none() && s.exited().is_none())
            .filter_map(|s| self.linger_for(&s.id).map(|linger| (s, linger)))
            .map(|(s, Linger { grace, tasks, open })| async move {
                match self.pool.let_linger(&s.id, grace, &open).await {
                    Ok(()) => tracing::info!(server_id = %s.id, tasks, ?grace, "the OpenCode runs on for its unfinished tasks; the next gateway takes them over"),
                    Err(e) => tracing::warn!(server_id = %s.id, error = %e, "cannot let the OpenCode run on for its tasks; stopping it"),
                }
            });
        futures::future::join_all(lingers).await;
    }

    /// How an OpenCode may run on for its unfinished tasks on `server_id` once this gateway is
    /// gone; `None` when there are none or `limits.linger` is 0. One pass over the server's
    /// tasks (see [`Linger`]).
    pub(in crate::tasks) fn linger_for(&self, server_id: &str) -> Option<Linger> {
        let config = self.tracker.config();
        let (grace, limit) = (config.limits.linger.get(), config.timeouts.task.get());
        if grace.is_zero() {
            return None;
        }
        let ids = self
            .registry
            .ids_where(|e| e.rec.server_id == server_id && !e.rec.status().is_terminal());
        let mut open = Vec::new();
        let mut last = None;
        for e in ids.iter().filter_map(|id| self.registry.get(id)) {
            // A held turn (its answer under check) has no deadline of its own.
            let left = match e.rec.is_held() {
                true => grace,
                false => limit.saturating_sub(e.live.turn_started.elapsed()),
            };
            if e.is_open() {
                open.push(OpenTurn {
                    left,
                    session_id: e.rec.session_id.clone(),
                    directory: e.rec.directory.clone(),
                });
            }
            last = last.max(Some(left));
        }
        Some(Linger {
            grace: grace.min(last?.max(Duration::from_secs(1))),
            tasks: ids.len(),
            open,
        })
    }
}

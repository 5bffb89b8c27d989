//! Tasks placed on a remote worker (`worker` of `start_task`; `workers:` of the user's
//! delegation.yaml, see `crate::workers`).
//!
//! Each worker gets one OpenCode, started there over ssh on first use and kept while the
//! gateway runs (`workers::serve`); the pool knows it as a server like any other, reached at
//! its forward, with a tracker reading its events, so status, waits, permissions, cancel and
//! deadlines work for a remote task exactly as for a local one. A remote task is always a
//! worktree task: its base is the snapshot a local worktree would start from (`git::base_commit`),
//! pushed to the worker's bare repository for the origin, with the task's worktree made there
//! (`workers::repo::push`); its work comes back after each turn (`fetch.rs`).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::error::TaskError;
use super::fetch::{self, remote_of};
use super::record::{RemoteWorkspace, WorkspaceRecord};
use super::service::TaskService;
use super::tracker;
use crate::config::{Isolation, LOCAL_WORKER};
use crate::git::{self, Base};
use crate::opencode::Server;
use crate::workers::{self, repo, serve::RemoteServe, Remote};

/// How long stopping a worker's OpenCode may take at shutdown (hosts send SIGINT, SIGTERM and
/// SIGKILL about half a second apart).
const STOP_AT_SHUTDOWN: Duration = Duration::from_millis(1_500);

/// The workers' OpenCode servers this gateway started, one per worker.
#[derive(Default)]
pub(super) struct WorkerServes {
    /// Worker name -> its OpenCode, if started. A worker's slot is locked while it is being
    /// started, so two tasks placed at once start one OpenCode.
    slots: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<Link>>>>>,
}

/// A worker's OpenCode in use: the pool's server for it and the ssh session it runs in.
struct Link {
    server_id: String,
    serve: RemoteServe,
    remote: Remote,
}

impl WorkerServes {
    fn slot(&self, worker: &str) -> Arc<tokio::sync::Mutex<Option<Link>>> {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots.entry(worker.to_string()).or_default().clone()
    }

    fn all(&self) -> Vec<Arc<tokio::sync::Mutex<Option<Link>>>> {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots.values().cloned().collect()
    }
}

/// A remote worker a call named: its name and how it is reached.
pub(super) struct Named {
    pub name: String,
    pub remote: Remote,
}

impl TaskService {
    /// The remote worker `name` of the configuration in force, for a task with `isolation`;
    /// `None` for this machine (`local`). An unknown name, and a task that cannot run remotely
    /// (isolation `none`: it would work in a directory of this machine), are refused.
    pub(super) fn remote_worker(
        &self,
        name: &str,
        isolation: Isolation,
    ) -> Result<Option<Named>, TaskError> {
        if name == LOCAL_WORKER {
            return Ok(None);
        }
        let config = self.config();
        let known = workers::from_config(&config);
        let Some(remote) = known
            .iter()
            .find(|w| w.name == name)
            .and_then(|w| w.remote.clone())
        else {
            let names: Vec<&str> = known.iter().map(|w| w.name.as_str()).collect();
            return Err(TaskError::InvalidArgument(format!(
                "unknown worker `{name}`: the workers are {} (`workers:` of your own \
                 delegation.yaml; see `opencode-mcp workers`)",
                names.join(", ")
            )));
        };
        if isolation == Isolation::None {
            return Err(TaskError::InvalidArgument(format!(
                "a task on worker `{name}` works in a git worktree there, and isolation `none` \
                 would have it work in a directory of this machine: leave isolation out (or \
                 pass `worktree`), or run the task on `local`"
            )));
        }
        Ok(Some(Named {
            name: name.to_string(),
            remote,
        }))
    }

    /// The OpenCode of worker `w`: the one started before while its session lives, else one
    /// started now (its root made there on first use) and taken into the pool with a tracker.
    pub(super) async fn worker_server(&self, w: &Named) -> Result<Arc<Server>, TaskError> {
        let slot = self.workers.slot(&w.name);
        let mut link = slot.lock().await;
        if let Some(l) = link.as_mut() {
            match self.pool.get(&l.server_id) {
                Some(server) if l.serve.alive() => return Ok(server),
                _ => {
                    tracing::warn!(worker = %w.name, "the worker's OpenCode session ended; starting it again");
                    if let Some(old) = link.take() {
                        self.pool.stop(&old.server_id).await;
                        old.serve.stop(&old.remote).await;
                    }
                }
            }
        }
        let within = self.config().timeouts.server_start.get();
        let serve = RemoteServe::start(&w.name, &w.remote, &w.remote.root, within).await?;
        let started = match self
            .pool
            .adopt_worker(&w.name, &serve.url, &serve.password, &serve.directory)
            .await
        {
            Ok(started) => started,
            Err(e) => {
                serve.stop(&w.remote).await;
                return Err(e.into());
            }
        };
        let server = started.server.clone();
        tokio::spawn(tracker::run(
            self.tracker.clone(),
            started.server,
            started.events,
        ));
        *link = Some(Link {
            server_id: server.id.clone(),
            serve,
            remote: w.remote.clone(),
        });
        Ok(server)
    }

    /// Makes task `task_id`'s worktree on worker `w` (whose OpenCode is `server`, serving from
    /// the worker's root made absolute) for the repository around the local `directory`;
    /// returns its record and the directory the session works in there.
    pub(super) async fn place(
        &self,
        w: &Named,
        server: &Server,
        directory: &str,
        task_id: &str,
        base: Base,
    ) -> Result<(WorkspaceRecord, String), TaskError> {
        let scratch = self.worktrees_dir()?;
        let (origin, base) = {
            let _one_at_a_time = self.git_lock.write().await;
            git::base_commit(Path::new(directory), &scratch, task_id, base).await?
        };
        let Some(origin_text) = origin.to_str().map(str::to_string) else {
            return Err(TaskError::InvalidArgument(format!(
                "the repository at {} has a path that is not valid UTF-8, which the gateway \
                 cannot keep in a task's record: rename the directory",
                origin.display()
            )));
        };
        // The worker's OpenCode reported its root as an absolute path; the session's
        // directory must be one.
        let remote = Remote {
            root: server.directory.clone(),
            ..w.remote.clone()
        };
        let placed = repo::push(&w.name, &remote, &origin, task_id, &base).await?;
        // The session works at the same place inside the worktree as `directory` is inside
        // the repository.
        let inside = Path::new(directory)
            .strip_prefix(&origin)
            .ok()
            .and_then(Path::to_str)
            .filter(|rel| !rel.is_empty());
        let session_dir = match inside {
            Some(rel) => format!("{}/{rel}", placed.worktree),
            None => placed.worktree.clone(),
        };
        Ok((
            WorkspaceRecord {
                origin: origin_text,
                path: placed.worktree,
                branch: placed.branch,
                base,
                applied: None,
                discarded: false,
                remote: Some(RemoteWorkspace {
                    worker: w.name.clone(),
                    bare: placed.bare,
                    fetched: None,
                    fetched_turn: 0,
                }),
            },
            session_dir,
        ))
    }

    /// Removes a remote task's worktree, branch and base ref from its worker, and its fetched
    /// ref here.
    pub(super) async fn remove_remote(
        &self,
        w: &WorkspaceRecord,
        r: &RemoteWorkspace,
    ) -> Result<(), TaskError> {
        let remote = remote_of(&self.config(), &r.worker)?;
        repo::discard(
            &r.worker,
            &remote,
            Path::new(&w.origin),
            &fetch::placed(w, &r.bare),
        )
        .await?;
        Ok(())
    }

    /// Stops the OpenCode of the worker whose pool server was `server_id` (`stop_server`).
    pub(super) async fn stop_worker_serve(&self, worker: &str) {
        let slot = self.workers.slot(worker);
        let taken = slot.lock().await.take();
        if let Some(link) = taken {
            link.serve.stop(&link.remote).await;
        }
    }

    /// Stops every worker's OpenCode (shutdown), all at once and for a bounded time: one that
    /// cannot be reached in time is left to its ssh session's end.
    pub(super) async fn stop_worker_serves(&self) {
        let stops = self.workers.all().into_iter().map(|slot| async move {
            let taken = slot.lock().await.take();
            if let Some(link) = taken {
                link.serve.stop(&link.remote).await;
            }
        });
        if tokio::time::timeout(STOP_AT_SHUTDOWN, futures::future::join_all(stops))
            .await
            .is_err()
        {
            tracing::warn!("some workers' OpenCode could not be stopped in time");
        }
    }
}

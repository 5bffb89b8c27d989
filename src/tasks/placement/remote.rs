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

use super::supervise::Supervision;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::links::{Link, WorkerServes};
use super::Placement;
use crate::config::{Isolation, LOCAL_WORKER};
use crate::git::Base;
use crate::opencode::Server;
use crate::tasks::error::TaskError;
use crate::tasks::lifecycle::record::{RemoteWorkspace, WorkspaceRecord};
use crate::tasks::turn::fetch::{self, remote_of};
use crate::workers::sandbox::{self, WorkerShell};
use crate::workers::serve::{RemoteServe, Saved, ServeError};
use crate::workers::{self, repo, Remote};

/// Under the state directory: what reaches each worker's OpenCode again after a restart.
const WORKERS_DIR: &str = "workers";

/// How long stopping a worker's OpenCode may take at shutdown (hosts send SIGINT, SIGTERM and
/// SIGKILL about half a second apart).
const STOP_AT_SHUTDOWN: Duration = Duration::from_millis(1_500);

/// A remote worker a call named: its name and how it is reached.
pub(in crate::tasks) struct Named {
    pub name: String,
    pub remote: Remote,
}

impl Placement {
    /// The remote worker `name` of the configuration in force, for a task with `isolation`;
    /// `None` for this machine (`local`). An unknown name, and a task that cannot run remotely
    /// (isolation `none`: it would work in a directory of this machine), are refused.
    pub(in crate::tasks) fn remote_worker(
        &self,
        name: &str,
        isolation: Isolation,
    ) -> Result<Option<Named>, TaskError> {
        if name == LOCAL_WORKER {
            return Ok(None);
        }
        let config = self.tracker.config();
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
    pub(in crate::tasks) async fn worker_server(
        &self,
        w: &Named,
    ) -> Result<Arc<Server>, TaskError> {
        let slot = self.workers.slot(&w.name);
        let mut link = slot.lock().await;
        if let Some(l) = link.as_mut() {
            if let (Some(server), true) = (self.pool.get(&l.server_id), l.serve.alive()) {
                return Ok(server);
            }
            // Its connection dropped: its OpenCode and its tasks may well go on there, and the
            // supervisor is reaching it again; starting another would orphan them.
            let why = self
                .workers
                .down_since(&w.name)
                .map(|d| format!("{} ({}s ago)", d.why, d.since.elapsed().as_secs()))
                .unwrap_or_else(|| "its connection dropped".into());
            return Err(TaskError::WorkerServe(ServeError::Failed {
                worker: w.name.clone(),
                detail: format!(
                    "the worker is out of reach: {why}; the gateway is reconnecting (its tasks there fail `WorkerLost` if it stays out of reach for workers.{}.lost_after): try again, or run the task elsewhere",
                    w.name
                ),
            }));
        }
        let config = self.tracker.config();
        let within = config.timeouts.server_start.get();
        // The confining shell goes there first: OpenCode is started with it as its shell. A
        // worker that cannot confine (and whose user did not let it run unconfined) starts
        // nothing.
        let shell = match sandbox::prepare(&w.name, &w.remote, &config, within).await {
            Ok(sandbox::Prepared::Confined(shell)) => Ok(Arc::new(shell)),
            Ok(sandbox::Prepared::Unconfined(why)) => Err(why),
            Err(e) => {
                if let sandbox::SandboxError::Ssh { .. } = &e {
                    WorkerServes::mark_down(&self.workers.down, &w.name, e.to_string());
                }
                return Err(ServeError::from(e).into());
            }
        };
        let shell_path = shell.as_ref().ok().map(|s| s.path.as_str());
        let started =
            RemoteServe::start(&w.name, &w.remote, &w.remote.root, shell_path, within).await;
        let serve = match started {
            Ok(serve) => serve,
            Err(e) => {
                WorkerServes::mark_down(&self.workers.down, &w.name, e.to_string());
                return Err(e.into());
            }
        };
        WorkerServes::mark_up(&self.workers.down, &w.name);
        match self.take_in(w, serve, &mut link, shell).await {
            Ok(server) => Ok(server),
            Err((serve, e)) => {
                serve.stop(&w.remote).await;
                Err(e.into())
            }
        }
    }

    /// Makes `serve` worker `w`'s OpenCode here: a server of the pool (its password proven),
    /// with a tracker, saved to be reached again after a restart, in the worker's `link`, and
    /// supervised. On failure `serve` is handed back, for the caller to stop or let go.
    async fn take_in(
        &self,
        w: &Named,
        serve: RemoteServe,
        link: &mut Option<Link>,
        shell: Result<Arc<WorkerShell>, String>,
    ) -> Result<Arc<Server>, (RemoteServe, crate::opencode::OpencodeError)> {
        let started = match self
            .pool
            .adopt_worker(
                &w.name,
                &serve.url,
                &serve.password,
                &serve.directory,
                shell,
            )
            .await
        {
            Ok(started) => started,
            Err(e) => return Err((serve, e)),
        };
        let server = self.track(started);
        self.save_serve(&serve.saved(&w.name));
        *link = Some(Link {
            server_id: server.id.clone(),
            serve,
            remote: w.remote.clone(),
        });
        self.supervise(w, &server);
        Ok(server)
    }

    /// Watches worker `w`'s connection while `server` is its OpenCode here: when the session
    /// drops, the worker is avoided by placement and reached again (the same OpenCode, through
    /// the same local port, so the server's clients and event stream carry on), with backoff;
    /// if it stays out of reach past `workers.<name>.lost_after`, or its OpenCode is gone, the
    /// tasks that were running there fail `WorkerLost`, naming the worker.
    fn supervise(&self, w: &Named, server: &Arc<Server>) {
        let config = self.tracker.config();
        let watch = Supervision {
            worker: Named {
                name: w.name.clone(),
                remote: w.remote.clone(),
            },
            slot: self.workers.slot(&w.name),
            down: self.workers.down.clone(),
            server: server.clone(),
            registry: self.registry.clone(),
            lost_after: workers::lost_after(&config, &w.name),
            within: config.timeouts.server_start.get(),
            saved_file: self.saved_path(&w.name, std::process::id()),
        };
        tokio::spawn(watch.run());
    }

    /// The OpenCode a gateway that is gone (`owner`) started on worker `w`, reached again to
    /// adopt its tasks: through what that gateway saved of it (`workers/<name>.<pid>.json`),
    /// its password proving it is still that OpenCode. It becomes this gateway's OpenCode for
    /// the worker (saved again under this gateway's pid). A worker this gateway already
    /// reached is returned as it is.
    pub(in crate::tasks) async fn reattach_worker(
        &self,
        w: &Named,
        owner: u32,
    ) -> Result<Arc<Server>, TaskError> {
        let slot = self.workers.slot(&w.name);
        let mut link = slot.lock().await;
        if let Some(l) = link.as_mut() {
            if let (Some(server), true) = (self.pool.get(&l.server_id), l.serve.alive()) {
                return Ok(server);
            }
        }
        let lost = |detail: String| {
            TaskError::Conflict(format!(
                "the OpenCode that worker `{}` ran the task on cannot be reached again: {detail}",
                w.name
            ))
        };
        let path = self
            .saved_path(&w.name, owner)
            .ok_or_else(|| lost("no state directory".into()))?;
        let saved: Saved = std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
            .map_err(|e| lost(format!("{} ({e})", path.display())))?;
        let config = self.tracker.config();
        let within = config.timeouts.server_start.get();
        let serve = RemoteServe::reattach(&w.name, &w.remote, &saved, within, None).await?;
        // Its shell was fixed when it started: its tasks are confined if it has the script
        // (written there again now), and reported unconfined if it was started without one.
        let shell = match (
            &saved.shell,
            sandbox::prepare(&w.name, &w.remote, &config, within).await,
        ) {
            (Some(had), Ok(sandbox::Prepared::Confined(shell))) if *had == shell.path => {
                Ok(Arc::new(shell))
            }
            (Some(had), Ok(sandbox::Prepared::Confined(shell))) => Err(format!(
                "its OpenCode on worker {} runs commands through {had}, not {}",
                w.name, shell.path
            )),
            (None, Ok(sandbox::Prepared::Confined(_))) => Err(format!(
                "its OpenCode on worker {} was started unconfined, before confinement was on \
                 for the worker",
                w.name
            )),
            (_, Ok(sandbox::Prepared::Unconfined(why))) => Err(why),
            (_, Err(e)) => Err(e.to_string()),
        };
        // Not that OpenCode (its password is refused): nothing of ours to stop there.
        let server = self
            .take_in(w, serve, &mut link, shell)
            .await
            .map_err(|(_, e)| lost(e.to_string()))?;
        if owner != std::process::id() {
            let _ = std::fs::remove_file(&path);
        }
        tracing::info!(worker = %w.name, pid = saved.remote_pid, "reached again the worker's OpenCode a previous gateway started");
        Ok(server)
    }

    /// Stops the workers' OpenCode servers that gateways now gone started and no task of
    /// theirs needs (their files are read after the adoptions, which took what they needed),
    /// and forgets them. A worker that cannot be reached keeps its file for the next start.
    pub(in crate::tasks) async fn sweep_worker_serves(&self) {
        let Some(dir) = self.state_dir.as_ref().map(|d| d.join(WORKERS_DIR)) else {
            return;
        };
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return;
        };
        let config = self.tracker.config();
        for path in entries.filter_map(|e| Some(e.ok()?.path())) {
            let Some(saved) = std::fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<Saved>(&b).ok())
            else {
                continue;
            };
            if saved.gateway_pid == std::process::id()
                || self.tracker.gateway_alive(saved.gateway_pid)
            {
                continue;
            }
            let Some(remote) = workers::remote(&config, &saved.worker) else {
                continue;
            };
            match remote
                .ssh
                .run(&["true"], None, Duration::from_secs(15))
                .await
            {
                Ok(_) => {
                    if RemoteServe::stop_saved(&remote, &saved).await {
                        let _ = std::fs::remove_file(&path);
                    }
                    tracing::info!(worker = %saved.worker, pid = saved.remote_pid, "stopped a worker's OpenCode that a gateway now gone had left running");
                }
                Err(e) => {
                    tracing::debug!(worker = %saved.worker, error = %e, "cannot reach a worker to stop the OpenCode a gone gateway left there");
                }
            }
        }
    }

    /// `<state_dir>/workers/<worker>.<gateway pid>.json` (worker names are checked to be safe
    /// file names).
    fn saved_path(&self, worker: &str, gateway_pid: u32) -> Option<std::path::PathBuf> {
        let dir = self.state_dir.as_ref()?.join(WORKERS_DIR);
        Some(dir.join(format!("{worker}.{gateway_pid}.json")))
    }

    /// Writes what reaches a worker's OpenCode again (password included: a private file).
    fn save_serve(&self, saved: &Saved) {
        let Some(path) = self.saved_path(&saved.worker, saved.gateway_pid) else {
            return;
        };
        let written = path
            .parent()
            .ok_or_else(|| std::io::Error::other("no directory"))
            .and_then(|dir| {
                crate::private_files::create_dir(dir)?;
                let bytes = serde_json::to_vec(saved).map_err(std::io::Error::other)?;
                crate::private_files::write_atomic(dir, &path, &saved.worker, &bytes, None)
            });
        if let Err(e) = written {
            tracing::warn!(worker = %saved.worker, error = %e, "cannot save how to reach the worker's OpenCode; a restart of the gateway will not adopt its tasks");
        }
    }

    /// Forgets what was saved of this gateway's OpenCode on `worker` (it was stopped).
    fn forget_serve(&self, worker: &str) {
        if let Some(path) = self.saved_path(worker, std::process::id()) {
            let _ = std::fs::remove_file(path);
        }
    }

    /// Makes task `task_id`'s worktree on worker `w` (whose OpenCode is `server`, serving from
    /// the worker's root made absolute) for the repository around the local `directory`, from
    /// the base its fan-out `group` shares when it has one; returns its record and the directory the session works in there.
    pub(in crate::tasks) async fn place(
        &self,
        w: &Named,
        server: &Server,
        directory: &str,
        task_id: &str,
        base: Base,
        group: Option<&str>,
    ) -> Result<(WorkspaceRecord, String), TaskError> {
        let scratch = self.worktrees_dir()?;
        let (origin, base) = {
            let _one_at_a_time = self.git_lock.write().await;
            self.base_for(directory, &scratch, base, group).await?
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
        let placed = repo::Placed::new(&remote.root, &origin, task_id, &base);
        self.send_and_add(&w.name, &remote, &origin, &placed)
            .await?;
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
    pub(in crate::tasks) async fn remove_remote(
        &self,
        w: &WorkspaceRecord,
        r: &RemoteWorkspace,
    ) -> Result<(), TaskError> {
        let remote = remote_of(&self.tracker.config(), &r.worker)?;
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
    pub(in crate::tasks) async fn stop_worker_serve(&self, worker: &str) {
        let slot = self.workers.slot(worker);
        let taken = slot.lock().await.take();
        if let Some(link) = taken {
            link.serve.stop(&link.remote).await;
        }
        self.forget_serve(worker);
    }

    /// Stops every worker's OpenCode (shutdown), all at once and for a bounded time: one that
    /// cannot be reached in time is left to its ssh session's end.
    pub(in crate::tasks) async fn stop_worker_serves(&self) {
        let stops = self
            .workers
            .all()
            .into_iter()
            .map(|(name, slot)| async move {
                let taken = slot.lock().await.take();
                let Some(link) = taken else {
                    return;
                };
                // Its tasks outlive this gateway (a host's reconnect ends it): their OpenCode
                // runs on for `limits.linger`, and the next gateway on this state directory
                // takes them over from its saved file, as after a crash.
                let Some(super::servers::Linger {
                    grace: linger,
                    tasks,
                    open,
                }) = self.linger_for(&link.server_id)
                else {
                    link.serve.stop(&link.remote).await;
                    self.forget_serve(&name);
                    return;
                };
                match link.serve.linger(&link.remote, linger, &open).await {
                    Ok(true) => tracing::info!(worker = %name, tasks, ?linger, "the worker's OpenCode runs on for its unfinished tasks; the next gateway takes them over"),
                    Ok(false) => tracing::warn!(worker = %name, tasks, ?linger, "the worker's OpenCode runs on for its unfinished tasks, but the worker has no curl to abort each at its deadline: they run on until the next gateway takes them over or the grace period ends"),
                    Err(e) => tracing::warn!(worker = %name, error = %e, "could not bound how long the worker's OpenCode runs on; it runs its tasks on until a gateway takes them over"),
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

//! A task's git worktree (isolation `worktree`): created before its session, read for every
//! result (the files it changed against its base, and the unified diff), and at the end
//! applied to the tree it came from or discarded.
//!
//! Parallel writers are the reason: five tasks editing one working tree overwrite each other's
//! files and break each other's test runs, and nobody can tell whose change is whose. In its own
//! worktree each task's change is its own, reviewable on its own, and taken or left whole.
//!
//! The git work itself is in [`crate::git`]; this file ties it to the task's record, which keeps
//! the worktree across restarts, and to the task's state (a running task is never applied or
//! discarded under the agent's feet).

use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::Serialize;

use super::Placement;
use crate::git::{self, Base, DiffFile};
use crate::tasks::error::TaskError;
use crate::tasks::lifecycle::entry::TaskEntry;
use crate::tasks::lifecycle::record::WorkspaceRecord;
use crate::tasks::model::Workspace;
use crate::tasks::turn::fetch;

/// What `apply_task` did.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct ApplyOutcome {
    pub task_id: String,
    /// The files this call changed in the origin's working tree (empty when there was nothing
    /// left to apply).
    pub applied: Vec<DiffFile>,
    /// Everything up to the task's current state was already applied; nothing was written.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub already_applied: bool,
    pub workspace: Workspace,
}

/// What `discard_task` did.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct DiscardOutcome {
    pub task_id: String,
    /// The worktree had already been discarded; nothing was removed.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub already_discarded: bool,
    pub workspace: Workspace,
}

/// The longest a read of a remote task's work (its result, its diff) waits on its worker.
const VIEW_FETCH_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

impl Placement {
    /// Where worktrees and the temporary indexes of snapshots go.
    pub(in crate::tasks) fn worktrees_dir(&self) -> Result<PathBuf, TaskError> {
        self.state_dir
            .as_ref()
            .map(|d| d.join("worktrees"))
            .ok_or_else(|| {
                TaskError::InvalidArgument(
                    "isolation `worktree` needs the gateway's state directory, and there is none: \
                     set `state_dir` in delegation.yaml (or XDG_STATE_HOME or HOME), or start \
                     the task with isolation `none`"
                        .into(),
                )
            })
    }

    /// Creates task `task_id`'s worktree for the repository around `directory`, from the base
    /// its fan-out `group` shares when it has one; returns its record and the directory the session works in.
    pub(in crate::tasks) async fn create_workspace(
        &self,
        directory: &str,
        task_id: &str,
        base: Base,
        group: Option<&str>,
    ) -> Result<(WorkspaceRecord, String), TaskError> {
        let root = self.worktrees_dir()?;
        let _one_at_a_time = self.git_lock.write().await;
        let (origin, commit) = self.base_for(directory, &root, base, group).await?;
        let created = git::create_at(Path::new(directory), &root, task_id, origin, commit).await?;
        // Records keep paths as text: a path that is not UTF-8 would be stored changed, and a
        // later apply, discard or gc would aim at a directory that does not exist.
        let text = |p: &Path| p.to_str().map(str::to_string);
        let paths = (
            text(&created.origin),
            text(&created.path),
            text(&created.session_dir),
        );
        let (Some(origin), Some(path), Some(session_dir)) = paths else {
            let _ = git::remove(&created.origin, &created.path, &created.branch).await;
            return Err(TaskError::InvalidArgument(format!(
                "the repository at {} (or the state directory) has a path that is not valid \
                 UTF-8, which the gateway cannot keep in a task's record: rename the directory, \
                 or start the task with isolation `none`",
                created.origin.display()
            )));
        };
        Ok((
            WorkspaceRecord {
                origin,
                path,
                branch: created.branch,
                base: created.base,
                applied: None,
                discarded: false,
                remote: None,
            },
            session_dir,
        ))
    }

    /// Removes a worktree whose task never started (its session or prompt failed).
    pub(in crate::tasks) async fn drop_workspace(&self, workspace: Option<&WorkspaceRecord>) {
        let Some(w) = workspace else { return };
        if let Some(r) = &w.remote {
            if let Err(e) = self.remove_remote(w, r).await {
                tracing::warn!(path = %w.path, worker = %r.worker, error = %e, "the worktree on the worker of a task that did not start could not be removed");
            }
            return;
        }
        let _one_at_a_time = self.git_lock.write().await;
        if let Err(e) = git::remove(Path::new(&w.origin), Path::new(&w.path), &w.branch).await {
            tracing::warn!(path = %w.path, error = %e, "the worktree of a task that did not start could not be removed");
        }
    }

    /// The worktree as results report it, with the files the task changed against its base
    /// (a read error is reported beside it, never in place of the result).
    pub(in crate::tasks) async fn workspace_view(
        &self,
        w: &WorkspaceRecord,
        task_id: &str,
    ) -> Workspace {
        let mut view = Workspace::from_record(w);
        if w.discarded {
            return view;
        }
        let summary = async {
            if w.remote.is_some() {
                let (w, tip, stale) = self.fetched(task_id, w).await?;
                let Some(tip) = tip else {
                    // Nothing is back from the worker yet: its first turn still runs.
                    return Ok((Vec::new(), stale));
                };
                let _shared = self.git_lock.read().await;
                let origin = git::Repo::at(Path::new(&w.origin));
                return Ok((git::summary(&origin, &w.base, &tip).await?, stale));
            }
            let (_shared, now) = self.current_tree(w).await?;
            Ok::<_, TaskError>((git::summary(now.repo(), &w.base, &now.tree).await?, None))
        };
        match summary.await {
            Ok((files, stale)) => {
                view.changes = Some(files);
                view.diff_error = stale;
            }
            Err(e) => {
                tracing::debug!(task = task_id, error = %e, "no diff summary");
                view.diff_error = Some(e.to_string());
            }
        }
        view
    }

    /// The worktree as it is now, untracked files included, snapshot for reading (nothing is
    /// written to the user's repository), with the git lock held shared: keep the guard while
    /// the snapshot is read, so no apply or discard runs meanwhile.
    async fn current_tree(
        &self,
        w: &WorkspaceRecord,
    ) -> Result<(tokio::sync::RwLockReadGuard<'_, ()>, git::Reading), TaskError> {
        let shared = self.git_lock.read().await;
        let scratch = self.worktrees_dir()?;
        let worktree = pin(w).await?;
        Ok((shared, worktree.read(&scratch).await?))
    }

    /// The task's work as a unified diff against its base, capped at
    /// `limits.max_result_chars`: the diff, whether it was capped, and why it may be stale (a
    /// remote task's work that could not be fetched back just now).
    pub(in crate::tasks) async fn diff(
        &self,
        task_id: &str,
    ) -> Result<(String, bool, Option<String>), TaskError> {
        let entry = self.tracker.own_entry(task_id)?;
        let w = workspace_of(&entry)?;
        if w.discarded {
            return Err(discarded(task_id));
        }
        let max_chars = self.tracker.config().limits.max_result_chars as usize;
        let mut stale = None;
        let (diff, capped) = if w.remote.is_some() {
            let (w, tip, why) = self.fetched(task_id, w).await?;
            stale = why;
            let _shared = self.git_lock.read().await;
            let origin = git::Repo::at(Path::new(&w.origin));
            git::unified(
                &origin,
                &w.base,
                tip.as_deref().unwrap_or(&w.base),
                max_chars,
            )
            .await?
        } else {
            let (_shared, now) = self.current_tree(w).await?;
            git::unified(now.repo(), &w.base, &now.tree, max_chars).await?
        };
        Ok((diff, capped, stale))
    }

    /// Merges the task's change (everything since its base, or since the last apply) into the
    /// working tree it was branched from. On a conflict nothing there changes (`conflict`, naming
    /// the files). Applying what is already applied changes nothing.
    pub async fn apply(&self, task_id: &str) -> Result<ApplyOutcome, TaskError> {
        self.tracker.restored().await;
        let scratch = self.worktrees_dir()?;
        // A remote task's work is brought back first (a fetch takes the git lock itself).
        if self.settled(task_id, "apply").is_ok() {
            fetch::fetch_back(&self.tracker, task_id).await?;
        }
        let one_at_a_time = self.git_lock.write().await;
        let entry = self.settled(task_id, "apply")?;
        let w = workspace_of(&entry)?.clone();
        if w.discarded {
            return Err(discarded(task_id));
        }
        let tip = match &w.remote {
            Some(r) => r.fetched.clone().ok_or_else(|| {
                TaskError::Conflict(format!(
                    "task {task_id}'s work is not back from worker `{}` yet; try again",
                    r.worker
                ))
            })?,
            None => git::commit_state(&pin(&w).await?, &scratch, task_id).await?,
        };
        let from = w.applied.clone().unwrap_or_else(|| w.base.clone());
        let files = if from == tip {
            None
        } else {
            let label = format!("task {task_id}");
            Some(
                git::apply(Path::new(&w.origin), &from, &tip, &scratch, &label)
                    .await?
                    .files,
            )
        };
        let record = self
            .registry
            .update(task_id, |e| {
                if let Some(w) = e.rec.workspace.as_mut() {
                    w.applied = Some(tip.clone());
                }
                e.rec.workspace.clone()
            })
            .flatten()
            .ok_or_else(|| TaskError::UnknownTasks(vec![task_id.to_string()]))?;
        // The view reads under the shared lock.
        drop(one_at_a_time);
        Ok(ApplyOutcome {
            task_id: task_id.to_string(),
            already_applied: files.is_none(),
            applied: files.unwrap_or_default(),
            workspace: self.workspace_view(&record, task_id).await,
        })
    }

    /// Removes the task's worktree and its branch. Discarding twice is discarding once.
    pub async fn discard(&self, task_id: &str) -> Result<DiscardOutcome, TaskError> {
        self.tracker.restored().await;
        let _one_at_a_time = self.git_lock.write().await;
        let entry = self.settled(task_id, "discard")?;
        let w = workspace_of(&entry)?.clone();
        let already = w.discarded;
        if !already {
            match &w.remote {
                Some(r) => self.remove_remote(&w, r).await?,
                None => git::remove(Path::new(&w.origin), Path::new(&w.path), &w.branch).await?,
            }
        }
        let record = self
            .registry
            .update(task_id, |e| {
                if let Some(w) = e.rec.workspace.as_mut() {
                    w.discarded = true;
                }
                e.rec.workspace.clone()
            })
            .flatten()
            .ok_or_else(|| TaskError::UnknownTasks(vec![task_id.to_string()]))?;
        Ok(DiscardOutcome {
            task_id: task_id.to_string(),
            already_discarded: already,
            workspace: Workspace::from_record(&record),
        })
    }

    /// A remote task's workspace with its work fetched back when its turn is over (the
    /// record as it is then), and the commit that holds that work (`None` before the first
    /// fetch). A running task's is what was last fetched.
    ///
    /// A worker that cannot be reached (lost, say), or that does not answer within
    /// [`VIEW_FETCH_WAIT`], leaves what was fetched before: that is read, and the third value
    /// says why it may be older than the task's last turn. A read never waits longer on a
    /// worker (the fetch after the turn goes on in the background).
    async fn fetched(
        &self,
        task_id: &str,
        w: &WorkspaceRecord,
    ) -> Result<(WorkspaceRecord, Option<String>, Option<String>), TaskError> {
        let settled = self.registry.get(task_id).is_some_and(|e| e.is_settled());
        let fetch = async {
            tokio::time::timeout(VIEW_FETCH_WAIT, fetch::fetch_back(&self.tracker, task_id))
                .await
                .unwrap_or_else(|_| {
                    Err(TaskError::Conflict(format!(
                        "its worker did not give the work back within {}s (it is still being \
                         fetched; read again later)",
                        VIEW_FETCH_WAIT.as_secs()
                    )))
                })
        };
        let (w, stale) = match settled {
            true => match fetch.await {
                Ok(now) => (now.unwrap_or_else(|| w.clone()), None),
                Err(e) if w.remote.as_ref().is_some_and(|r| r.fetched.is_some()) => {
                    let note = format!(
                        "the task's last work could not be brought back from its worker ({e}); \
                         this is its work as fetched after turn {}",
                        w.remote.as_ref().map_or(0, |r| r.fetched_turn)
                    );
                    (w.clone(), Some(note))
                }
                Err(e) => return Err(e),
            },
            false => (w.clone(), None),
        };
        let tip = w.remote.as_ref().and_then(|r| r.fetched.clone());
        Ok((w, tip, stale))
    }

    /// The task, refused (`conflict`) while its agent may still write to the worktree.
    fn settled(&self, task_id: &str, what: &str) -> Result<TaskEntry, TaskError> {
        let entry = self.tracker.own_entry(task_id)?;
        if !entry.is_settled() {
            return Err(TaskError::Conflict(format!(
                "task {task_id} is still {}: its agent may still be writing; wait for it \
                 (opencode_wait_for_task) or cancel it before you {what} it",
                entry.rec.status().as_str()
            )));
        }
        Ok(entry)
    }
}

/// The task's worktree as its record has it (see [`git::Worktree`]).
async fn pin(w: &WorkspaceRecord) -> Result<git::Worktree, TaskError> {
    Ok(git::Worktree::pin(Path::new(&w.origin), Path::new(&w.path), &w.base).await?)
}

fn workspace_of(entry: &TaskEntry) -> Result<&WorkspaceRecord, TaskError> {
    entry.rec.workspace.as_ref().ok_or_else(|| {
        TaskError::InvalidArgument(format!(
            "task {} has no worktree (it was started with isolation `none`): its changes are \
             already in its directory {}",
            entry.rec.id, entry.rec.directory
        ))
    })
}

fn discarded(task_id: &str) -> TaskError {
    TaskError::Conflict(format!(
        "task {task_id}'s worktree was discarded (opencode_discard_task); its change is gone"
    ))
}

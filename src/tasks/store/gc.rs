//! Worktrees that outlive their tasks.
//!
//! A finished task's record is deleted once `limits.finished_task_ttl` has passed. Its worktree
//! and branch go with it, because nobody can reach them through the gateway any more, except
//! when the worktree holds a change that was never applied: deleting that would silently throw
//! away an agent's work the orchestrator may still want. Such a worktree is kept, with a note
//! beside it (`<state_dir>/worktrees/<task_id>.kept.json`: the task's title, status, and the
//! worktree's record, i.e. its base and what was applied), and listed by `opencode-mcp gc`, which
//! removes it only when asked to with `--force`.
//!
//! `gc` reads the state directory as it is on disk, like the store does, without opening the
//! store (no owner lock, no writer thread), so it runs beside a running gateway or without one.
//! It never writes the user's working tree: removing a worktree is `git worktree remove` of a
//! directory under the state directory and `git branch -D` of an `opencode-mcp/` branch.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::disk::{read_stored, Stored};
use super::expiry::Expired;
use crate::config::Config;
use crate::git::{self, BRANCH_PREFIX};
use crate::tasks::lifecycle::record::{RemoteWorkspace, WorkspaceRecord};
use crate::tasks::model::epoch_ms;
use crate::tasks::model::TaskStatus;
use crate::workers::{self, repo};

/// The end of a kept worktree's note: `<task_id>.kept.json` beside the worktree.
const KEPT_SUFFIX: &str = ".kept.json";

/// A worktree with neither record nor note may belong to a task being started right now (the
/// worktree is made before its record is written): younger than this, `gc` leaves it alone even
/// with `--force`.
const UNKNOWN_MIN_AGE: Duration = Duration::from_secs(600);

/// Written beside a worktree kept after its task's record expired.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct KeptNote {
    task_id: String,
    title: String,
    status: TaskStatus,
    workspace: WorkspaceRecord,
    /// Epoch milliseconds.
    kept_ms: u64,
}

fn note_path(worktrees: &Path, task_id: &str) -> PathBuf {
    worktrees.join(format!("{task_id}{KEPT_SUFFIX}"))
}

/// Cleans the worktrees of tasks whose records just expired: removed (worktree and branch) when
/// everything in them was applied or there is nothing in them, else kept with a note. Runs one
/// worktree at a time under `lock`, the gateway's lock for git writes, but for a remote task's:
/// its steps cross the network, and it takes the lock only to move its fetched ref here.
pub(in crate::tasks) async fn clean_expired(
    lock: &tokio::sync::RwLock<()>,
    worktrees: &Path,
    expired: Vec<Expired>,
    config: &Config,
) {
    for e in expired {
        if continued_elsewhere(worktrees, &e) {
            tracing::info!(task = %e.task_id, "not cleaning the worktree of an expired task another gateway continued");
            continue;
        }
        if let Some(r) = &e.workspace.remote {
            clean_remote(&e, r, config, lock).await;
            continue;
        }
        let _one_at_a_time = lock.write().await;
        if continued_elsewhere(worktrees, &e) {
            continue;
        }
        let w = &e.workspace;
        let path = Path::new(&w.path);
        let origin = Path::new(&w.origin);
        match git::pending(origin, path, &w.base, w.applied.as_deref(), worktrees).await {
            Ok(p) if !p.unapplied => match git::remove(origin, path, &w.branch).await {
                Ok(()) => {
                    tracing::info!(task = %e.task_id, path = %w.path, "removed the worktree of an expired task")
                }
                Err(err) => {
                    tracing::warn!(task = %e.task_id, path = %w.path, error = %err, "could not remove the worktree of an expired task; `opencode-mcp gc --remove-orphans` retries")
                }
            },
            outcome => {
                if let Err(err) = &outcome {
                    tracing::warn!(task = %e.task_id, path = %w.path, error = %err, "cannot tell whether an expired task's worktree holds unapplied work; keeping it");
                }
                let note = KeptNote {
                    task_id: e.task_id.clone(),
                    title: e.title.clone(),
                    status: e.status,
                    workspace: w.clone(),
                    kept_ms: epoch_ms(SystemTime::now()),
                };
                let written = serde_json::to_vec_pretty(&note)
                    .map_err(std::io::Error::other)
                    .and_then(|bytes| std::fs::write(note_path(worktrees, &e.task_id), bytes));
                if let Err(err) = written {
                    tracing::warn!(task = %e.task_id, error = %err, "cannot write the note of a kept worktree");
                }
                tracing::warn!(task = %e.task_id, path = %w.path, "the task's record expired but its worktree holds changes never applied: kept; see `opencode-mcp gc`");
            }
        }
    }
}

/// Cleans the worker of an expired remote task: its last state is fetched back first, then its
/// worktree, branch and base ref leave the worker. The fetched ref here
/// (`refs/opencode-mcp/remote/<task>`) goes too, unless it holds work never applied: then it
/// stays in the user's repository, named in the log, so nothing of the agent's work is lost
/// while the worker is cleaned. A worker that cannot be reached keeps everything.
async fn clean_remote(
    e: &Expired,
    r: &RemoteWorkspace,
    config: &Config,
    lock: &tokio::sync::RwLock<()>,
) {
    let w = &e.workspace;
    let Some(remote) = workers::remote(config, &r.worker) else {
        tracing::warn!(task = %e.task_id, worker = %r.worker, "an expired task's worker is no longer declared; its worktree stays there");
        return;
    };
    let placed = repo::Placed {
        bare: r.bare.clone(),
        worktree: w.path.clone(),
        branch: w.branch.clone(),
        base: w.base.clone(),
    };
    let origin = Path::new(&w.origin);
    let message = format!("opencode-mcp: the work of task {} (expired)", e.task_id);
    let fetched = match repo::fetch_back(&r.worker, &remote, origin, &placed, &message).await {
        Ok(tip) => {
            let _one_at_a_time = lock.write().await;
            repo::keep_fetched(origin, &placed, Some(&tip))
                .await
                .map(|()| tip)
        }
        Err(err) => Err(err),
    };
    let tip = match fetched {
        Ok(tip) => tip,
        Err(err) => {
            tracing::warn!(task = %e.task_id, worker = %r.worker, error = %err, "cannot bring an expired task's work back from its worker; its worktree stays there");
            return;
        }
    };
    let repo = git::Repo::at(origin);
    let tree = |commit: String| {
        let repo = &repo;
        async move {
            repo.git(&["rev-parse", &format!("{commit}^{{tree}}")])
                .await
                .map(|o| o.line())
        }
    };
    let taken = w.applied.clone().unwrap_or_else(|| w.base.clone());
    let unapplied = match (tree(tip.clone()).await, tree(taken).await) {
        (Ok(a), Ok(b)) => a != b,
        _ => true,
    };
    if let Err(err) = repo::discard_there(&r.worker, &remote, &placed).await {
        tracing::warn!(task = %e.task_id, worker = %r.worker, error = %err, "could not clean an expired task's worktree on its worker");
    }
    let local = format!("{}{}", repo::REMOTE_REF_PREFIX, e.task_id);
    if unapplied {
        tracing::warn!(task = %e.task_id, origin = %w.origin, git_ref = %local, "the task's record expired but its work was never applied: kept in the repository as {local}");
    } else if let Err(err) = repo.git(&["update-ref", "-d", &local]).await {
        tracing::debug!(task = %e.task_id, error = %err, "could not delete the fetched ref");
    }
    tracing::info!(task = %e.task_id, worker = %r.worker, "cleaned the worker of an expired task");
}

/// The task's record on disk holds a turn other than the one that expired: another gateway on
/// the same state directory continued it (and its new turn runs in this worktree). A record
/// still there with the expired turn is this gateway's own removal, not yet written.
fn continued_elsewhere(worktrees: &Path, e: &Expired) -> bool {
    let Some(state_dir) = worktrees.parent() else {
        return false;
    };
    matches!(read_stored(state_dir, &e.task_id), Stored::Record(r) if r.turn != e.turn)
}

/// Where a worktree's task stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// The task's record is in the state directory: the gateway answers for it.
    Task,
    /// The record expired and the worktree was kept for its unapplied changes.
    Kept,
    /// Neither record nor note: left by a gateway that stopped between creating the worktree
    /// and writing the record, or by hand.
    Unknown,
    /// The record exists but cannot be read (named, with why).
    Unreadable(String),
}

/// One directory under `<state_dir>/worktrees/`.
#[derive(Debug, Clone)]
pub struct GcWorktree {
    pub task_id: String,
    pub path: PathBuf,
    pub owner: Owner,
    pub title: Option<String>,
    pub status: Option<TaskStatus>,
    /// Something of it was applied (`None` when unknown).
    pub applied: Option<bool>,
    /// Files changed against the task's base (against its checked-out commit when the base
    /// is unknown).
    pub changed_files: Option<usize>,
    /// It holds changes never applied (`None` when that cannot be told).
    pub unapplied: Option<bool>,
    /// The repository it belongs to and its branch, when known.
    pub origin: Option<PathBuf>,
    pub branch: Option<String>,
    /// Why something above is unknown.
    pub problem: Option<String>,
    /// How long ago the worktree was created (its `.git` link was written).
    pub age: Option<Duration>,
}

impl GcWorktree {
    /// Its task's record is gone: nothing but `gc` will ever clean it.
    pub fn orphan(&self) -> bool {
        matches!(self.owner, Owner::Kept | Owner::Unknown)
    }

    /// One line for `gc`'s listing.
    pub fn line(&self) -> String {
        let owner = match &self.owner {
            Owner::Task => "record present".to_string(),
            Owner::Kept => "record expired, kept".to_string(),
            Owner::Unknown => "no record".to_string(),
            Owner::Unreadable(why) => format!("record unreadable ({why})"),
        };
        let status = self.status.map_or("-", TaskStatus::as_str);
        let applied = match self.applied {
            Some(true) => "applied",
            Some(false) => "not applied",
            None => "applied: unknown",
        };
        let changed = self
            .changed_files
            .map_or("changed files: unknown".to_string(), |n| {
                format!("{n} changed file(s)")
            });
        let unapplied = match self.unapplied {
            Some(true) => "unapplied changes",
            Some(false) => "nothing unapplied",
            None => "unapplied: unknown",
        };
        let mut line = format!(
            "{}  {status}  {owner}  {applied}  {changed}  {unapplied}  {}",
            self.task_id,
            self.path.display()
        );
        if let Some(t) = &self.title {
            line.push_str(&format!("  \"{t}\""));
        }
        if let Some(p) = &self.problem {
            line.push_str(&format!("  ({p})"));
        }
        line
    }
}

/// The worktrees directory of `state_dir`.
pub fn worktrees_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("worktrees")
}

/// How many worktrees were kept for their unapplied changes after their tasks expired (a note
/// whose worktree still exists). Reads file names only: cheap enough for `check-config`.
pub fn kept_count(state_dir: &Path) -> usize {
    let dir = worktrees_dir(state_dir);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let id = name.strip_suffix(KEPT_SUFFIX)?;
            dir.join(id).is_dir().then_some(())
        })
        .count()
}

/// Every worktree under `<state_dir>/worktrees/`, with its task and what it holds, by task id.
pub async fn list(state_dir: &Path) -> Vec<GcWorktree> {
    let dir = worktrees_dir(state_dir);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut ids: Vec<String> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        // Temporary indexes and notes are files; anything hidden is not a task's.
        .filter(|n| !n.starts_with('.'))
        .collect();
    ids.sort();
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        out.push(inspect(state_dir, &dir, id).await);
    }
    out
}

async fn inspect(state_dir: &Path, dir: &Path, task_id: String) -> GcWorktree {
    let path = dir.join(&task_id);
    let age = std::fs::metadata(path.join(".git"))
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok());
    let mut g = GcWorktree {
        task_id,
        path,
        owner: Owner::Unknown,
        title: None,
        status: None,
        applied: None,
        changed_files: None,
        unapplied: None,
        origin: None,
        branch: None,
        problem: None,
        age,
    };
    let workspace = match read_stored(state_dir, &g.task_id) {
        Stored::Record(r) => {
            g.owner = Owner::Task;
            g.title = Some(r.title.clone());
            g.status = Some(r.status());
            r.workspace
        }
        Stored::Unreadable(why) => {
            g.owner = Owner::Unreadable(why);
            None
        }
        Stored::Missing => match read_note(dir, &g.task_id) {
            Ok(Some(note)) => {
                g.owner = Owner::Kept;
                g.title = Some(note.title);
                g.status = Some(note.status);
                Some(note.workspace)
            }
            Ok(None) => None,
            Err(why) => {
                g.problem = Some(why);
                None
            }
        },
    };
    match workspace {
        Some(w) => {
            g.applied = Some(w.applied.is_some());
            g.origin = Some(PathBuf::from(&w.origin));
            g.branch = Some(w.branch.clone());
            let origin = Path::new(&w.origin);
            match git::pending(origin, &g.path, &w.base, w.applied.as_deref(), dir).await {
                Ok(p) => {
                    g.changed_files = Some(p.changed_files);
                    g.unapplied = Some(p.unapplied);
                }
                Err(e) => g.problem = Some(e.to_string()),
            }
        }
        // No record of its base: what git says about the worktree itself.
        None => match git::locate(&g.path).await {
            Ok(at) => {
                match git::pending(&at.origin, &g.path, &at.head, None, dir).await {
                    Ok(p) => g.changed_files = Some(p.changed_files),
                    Err(e) => g.problem = Some(e.to_string()),
                }
                g.origin = Some(at.origin);
                g.branch = at.branch;
            }
            Err(e) => {
                g.problem = Some(format!(
                    "not a git worktree any more ({e}); if nothing in it is needed, delete the \
                     directory by hand"
                ))
            }
        },
    }
    g
}

fn read_note(dir: &Path, task_id: &str) -> Result<Option<KeptNote>, String> {
    let path = note_path(dir, task_id);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| format!("unreadable note {}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("unreadable note {}: {e}", path.display())),
    }
}

/// What `remove_orphans` did with one worktree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GcAction {
    Removed,
    /// Left in place, and why (with the fix when there is one).
    Kept(String),
    Failed(String),
}

/// Removes the worktrees (and their `opencode-mcp/` branches) whose task record is gone and that
/// hold nothing unapplied; with `force`, also those that do or that cannot be told. Worktrees
/// whose task still has a record are the gateway's and are never touched here.
pub async fn remove_orphans(
    state_dir: &Path,
    force: bool,
    found: Vec<GcWorktree>,
) -> Vec<(GcWorktree, GcAction)> {
    let dir = worktrees_dir(state_dir);
    let mut out = Vec::new();
    for g in found.into_iter().filter(GcWorktree::orphan) {
        let action = decide(&g, force);
        let action = match action {
            Some(kept) => GcAction::Kept(kept),
            None => match remove_one(&g).await {
                Ok(()) => {
                    let _ = std::fs::remove_file(note_path(&dir, &g.task_id));
                    GcAction::Removed
                }
                Err(e) => GcAction::Failed(e),
            },
        };
        out.push((g, action));
    }
    out
}

/// Why `g` stays, or `None` when it goes.
fn decide(g: &GcWorktree, force: bool) -> Option<String> {
    if g.origin.is_none() {
        return Some(
            g.problem
                .clone()
                .unwrap_or_else(|| "its repository is unknown".into()),
        );
    }
    if g.owner == Owner::Unknown && g.age.is_none_or(|a| a < UNKNOWN_MIN_AGE) {
        return Some(format!(
            "created less than {} min ago with no record yet: it may be a task being started",
            UNKNOWN_MIN_AGE.as_secs() / 60
        ));
    }
    match g.unapplied {
        Some(false) => None,
        _ if force => None,
        Some(true) => Some(
            "it holds changes never applied: review them in the worktree, or pass --force to \
             remove them too"
                .into(),
        ),
        None => Some(
            "whether it holds unapplied changes is unknown: look at the worktree, or pass \
             --force to remove it anyway"
                .into(),
        ),
    }
}

async fn remove_one(g: &GcWorktree) -> Result<(), String> {
    let origin = g.origin.as_deref().ok_or("its repository is unknown")?;
    // Only our own branch is deleted: a worktree someone switched to another branch keeps that.
    let branch = g
        .branch
        .clone()
        .filter(|b| b.starts_with(BRANCH_PREFIX))
        .unwrap_or_else(|| format!("{BRANCH_PREFIX}{}", g.task_id));
    git::remove(origin, &g.path, &branch)
        .await
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tasks::lifecycle::record::TaskRecord;
    use crate::tasks::store::disk::Store;

    /// An expired task's worktree is not cleaned when its record on disk holds a newer turn
    /// (another gateway continued the task there); the record of the expired turn itself, or
    /// none, leaves it to be cleaned.
    #[test]
    fn a_worktree_continued_by_another_gateway_is_not_cleaned() {
        let state = std::env::temp_dir().join(format!("ocm-gc-{}", crate::ids::task_id()));
        let store = Store::open(&state).expect("open");
        let expired = |id: &str| Expired {
            task_id: id.into(),
            turn: 1,
            title: "t".into(),
            status: TaskStatus::Completed,
            workspace: WorkspaceRecord {
                origin: "/repo".into(),
                path: "/w".into(),
                branch: format!("{BRANCH_PREFIX}{id}"),
                base: "b".into(),
                applied: None,
                discarded: false,
                remote: None,
            },
        };
        for (id, turn) in [("tsk_same", 1), ("tsk_newer", 2)] {
            let mut rec = TaskRecord::new(
                id.into(),
                "srv".into(),
                "ses".into(),
                "/w".into(),
                "t".into(),
            );
            rec.turn = turn;
            store.submit(rec);
        }
        store
            .flush_blocking(Duration::from_secs(10))
            .expect("written");
        let worktrees = worktrees_dir(&state);
        assert!(!continued_elsewhere(&worktrees, &expired("tsk_same")));
        assert!(!continued_elsewhere(&worktrees, &expired("tsk_gone")));
        assert!(continued_elsewhere(&worktrees, &expired("tsk_newer")));
        drop(store);
        let _ = std::fs::remove_dir_all(state);
    }

    /// A repository at `<tmp>/repo` with one commit, for real worktrees.
    fn repo(tmp: &Path) -> PathBuf {
        let repo = tmp.join("repo");
        std::fs::create_dir_all(&repo).expect("repo dir");
        std::fs::write(repo.join("a.txt"), "one\n").expect("write");
        for args in [
            &["init", "--quiet", "-b", "main"][..],
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@localhost",
                "add",
                "a.txt",
            ],
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@localhost",
                "commit",
                "--quiet",
                "-m",
                "init",
            ],
        ] {
            let out = std::process::Command::new("git")
                .args(args)
                .current_dir(&repo)
                .env("GIT_CONFIG_GLOBAL", "/dev/null")
                .env("GIT_CONFIG_NOSYSTEM", "1")
                .output()
                .expect("git runs");
            assert!(out.status.success(), "git {args:?}: {out:?}");
        }
        repo
    }

    fn expired_of(c: &git::Created, id: &str) -> Expired {
        Expired {
            task_id: id.into(),
            turn: 1,
            title: format!("task {id}"),
            status: TaskStatus::Completed,
            workspace: WorkspaceRecord {
                origin: c.origin.display().to_string(),
                path: c.path.display().to_string(),
                branch: c.branch.clone(),
                base: c.base.clone(),
                applied: None,
                discarded: false,
                remote: None,
            },
        }
    }

    /// On real worktrees: an expired task's empty worktree is removed and one with unapplied
    /// work kept with a note, which `gc` then reports as kept; a worktree with neither record
    /// nor note is described from git alone and spared while young; a directory that is no
    /// worktree any more is named with what to do.
    #[tokio::test]
    async fn expired_worktrees_are_removed_or_kept_and_gc_describes_every_kind() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let repo = repo(tmp.path());
        let state = tmp.path().join("state");
        let worktrees = worktrees_dir(&state);
        let make = |id: &'static str| {
            let (repo, worktrees) = (repo.clone(), worktrees.clone());
            async move {
                git::create(&repo, &worktrees, id, git::Base::Head)
                    .await
                    .unwrap_or_else(|e| panic!("worktree {id}: {e}"))
            }
        };
        let empty = make("tsk_empty").await;
        let kept = make("tsk_kept").await;
        std::fs::write(kept.path.join("a.txt"), "two\n").expect("write");
        let stray = make("tsk_stray").await;
        std::fs::write(stray.path.join("b.txt"), "new\n").expect("write");
        std::fs::create_dir_all(worktrees.join("tsk_broken")).expect("dir");

        let lock = tokio::sync::RwLock::new(());
        clean_expired(
            &lock,
            &worktrees,
            vec![
                expired_of(&empty, "tsk_empty"),
                expired_of(&kept, "tsk_kept"),
            ],
            &crate::gateway::test_config(),
        )
        .await;
        assert!(!empty.path.exists(), "nothing in it: removed");
        assert!(kept.path.exists(), "unapplied work: kept");
        assert_eq!(kept_count(&state), 1);

        let found = list(&state).await;
        let by_id = |id: &str| {
            found
                .iter()
                .find(|g| g.task_id == id)
                .unwrap_or_else(|| panic!("{id} listed: {found:?}"))
        };
        let k = by_id("tsk_kept");
        assert_eq!(k.owner, Owner::Kept);
        assert_eq!(k.title.as_deref(), Some("task tsk_kept"));
        assert_eq!((k.changed_files, k.unapplied), (Some(1), Some(true)));
        let s = by_id("tsk_stray");
        assert_eq!(s.owner, Owner::Unknown);
        assert_eq!(s.branch.as_deref(), Some("opencode-mcp/tsk_stray"));
        assert_eq!(s.changed_files, Some(1), "the untracked b.txt");
        let b = by_id("tsk_broken");
        assert!(
            b.problem
                .as_deref()
                .is_some_and(|p| p.contains("not a git worktree any more")),
            "{b:?}"
        );

        let done = remove_orphans(&state, false, found).await;
        let action = |id: &str| {
            done.iter()
                .find(|(g, _)| g.task_id == id)
                .map(|(_, a)| a.clone())
                .unwrap_or_else(|| panic!("{id} decided: {done:?}"))
        };
        assert!(
            matches!(action("tsk_stray"), GcAction::Kept(why) if why.contains("created less than")),
            "a young worktree with no record may be a task being started"
        );
        assert!(
            matches!(action("tsk_kept"), GcAction::Kept(_)),
            "unapplied work stays without --force"
        );
        assert!(kept.path.exists() && stray.path.exists());
    }
}

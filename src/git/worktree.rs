//! A task's worktree: the snapshot it starts from, creating it, committing its state, removing
//! it.
//!
//! A worktree lives outside the user's tree (under the gateway's state directory,
//! `worktrees/<task_id>`) on its own branch `opencode-mcp/<task_id>`, so an agent's edits, its
//! half-written files and its test runs never reach the user's files or another task's.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::run::{commit_tree, git, Cmd, GitError};
use super::BRANCH_PREFIX;

/// What a task's worktree starts from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Base {
    /// What the orchestrator sees: `HEAD` plus the uncommitted changes (staged, unstaged, and
    /// untracked files that are not ignored).
    #[default]
    WorkingTree,
    /// The last commit only.
    Head,
}

/// A created worktree.
#[derive(Debug, Clone)]
pub struct Created {
    /// The top of the user's repository: where apply brings the change.
    pub origin: PathBuf,
    /// The worktree's root.
    pub path: PathBuf,
    /// Where the session works: the directory asked for, at the same place inside the worktree.
    pub session_dir: PathBuf,
    pub branch: String,
    /// The commit the worktree was branched from.
    pub base: String,
}

/// Creates the worktree of task `name` for the repository around `dir`, at `root/<name>`.
pub async fn create(dir: &Path, root: &Path, name: &str, base: Base) -> Result<Created, GitError> {
    let origin = toplevel(dir).await?;
    let head = head(&origin).await?;
    let base_commit = match base {
        Base::Head => head,
        Base::WorkingTree => {
            let tree = snapshot_tree(&origin, root)
                .await
                .map_err(|e| as_snapshot_error(&origin, e))?;
            let head_tree = git(&origin, &["rev-parse", &format!("{head}^{{tree}}")])
                .await?
                .line();
            if tree == head_tree {
                head
            } else {
                let message = format!(
                    "opencode-mcp: uncommitted changes of {} as the base of task {name}",
                    origin.display()
                );
                commit_tree(&origin, &tree, &head, &message).await?
            }
        }
    };
    // Owner-only: the worktrees hold copies of the user's files, untracked ones included.
    crate::private_files::create_dir(root).map_err(|error| GitError::Io {
        dir: root.to_path_buf(),
        context: "creating the worktrees directory",
        error,
    })?;
    let path = root.join(name);
    let branch = format!("{BRANCH_PREFIX}{name}");
    Cmd::new(&origin, &["worktree", "add", "--quiet", "-b", &branch])
        .arg(path.as_os_str())
        .arg(OsStr::new(&base_commit))
        .ok()
        .await?;
    let path = path.canonicalize().unwrap_or(path);
    // The session works at the same place inside the worktree as `dir` is inside the repository.
    let canonical_dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let session_dir = match canonical_dir.strip_prefix(&origin) {
        Ok(rel) if !rel.as_os_str().is_empty() => {
            let d = path.join(rel);
            // An untracked or ignored directory is not in the checkout.
            std::fs::create_dir_all(&d).map_err(|error| GitError::Io {
                dir: d.clone(),
                context: "creating the task's directory inside its worktree",
                error,
            })?;
            d
        }
        _ => path.clone(),
    };
    Ok(Created {
        origin,
        path,
        session_dir,
        branch,
        base: base_commit,
    })
}

/// The top directory of the repository around `dir` (canonical).
async fn toplevel(dir: &Path) -> Result<PathBuf, GitError> {
    if !dir.is_dir() {
        return Err(GitError::NotARepository {
            dir: dir.to_path_buf(),
        });
    }
    let out = Cmd::new(dir, &["rev-parse", "--show-toplevel"])
        .output()
        .await?;
    let top = out.line();
    if out.code != Some(0) || top.is_empty() {
        return Err(GitError::NotARepository {
            dir: dir.to_path_buf(),
        });
    }
    let top = PathBuf::from(top);
    Ok(top.canonicalize().unwrap_or(top))
}

/// The commit `HEAD` names.
async fn head(repo: &Path) -> Result<String, GitError> {
    let out = Cmd::new(repo, &["rev-parse", "--verify", "-q", "HEAD^{commit}"])
        .output()
        .await?;
    match out.code {
        Some(0) => Ok(out.line()),
        _ => Err(GitError::NoCommits {
            dir: repo.to_path_buf(),
        }),
    }
}

/// A failed snapshot of `dir` (git's failure or the temporary index's), as the error that says
/// the uncommitted changes could not be read; used by create and by apply.
pub(super) fn as_snapshot_error(dir: &Path, e: GitError) -> GitError {
    match e {
        GitError::Failed {
            command, stderr, ..
        } => GitError::Snapshot {
            dir: dir.to_path_buf(),
            detail: format!("`git {command}`: {stderr}"),
        },
        GitError::Io { context, error, .. } => GitError::Snapshot {
            dir: dir.to_path_buf(),
            detail: format!("{context}: {error}"),
        },
        other => other,
    }
}

/// A temporary index file, removed when dropped.
struct TempIndex(PathBuf);

impl Drop for TempIndex {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        let _ = std::fs::remove_file(self.0.with_extension("lock"));
    }
}

static TEMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// The tree of `repo`'s working tree as it is now: tracked files as they are on disk, deleted
/// ones gone, untracked files that are not ignored added. Written through a temporary index in
/// `scratch`, so the repository's own index and files are left exactly as they were.
pub async fn snapshot_tree(repo: &Path, scratch: &Path) -> Result<String, GitError> {
    // Owner-only, like the worktrees: a temporary index lists the user's untracked files.
    crate::private_files::create_dir(scratch).map_err(|error| GitError::Io {
        dir: scratch.to_path_buf(),
        context: "creating the directory for temporary indexes",
        error,
    })?;
    let seq = TEMP_SEQ.fetch_add(1, Ordering::Relaxed);
    let temp = TempIndex(scratch.join(format!(".index-{}-{seq}", std::process::id())));
    let real = git(
        repo,
        &["rev-parse", "--path-format=absolute", "--git-path", "index"],
    )
    .await?
    .line();
    let index_env = temp.0.as_os_str();
    // Seeded from the real index, `add -A` hashes only what changed since it was written.
    let seeded = !real.is_empty() && seed_index(Path::new(&real), &temp.0).is_ok();
    if !seeded {
        Cmd::new(repo, &["read-tree", "HEAD"])
            .env("GIT_INDEX_FILE", index_env)
            .ok()
            .await?;
    }
    Cmd::new(repo, &["add", "-A", "--", "."])
        // `add` writes the index it is given: here the temporary one.
        .env("GIT_INDEX_FILE", index_env)
        .ok()
        .await?;
    let tree = Cmd::new(repo, &["write-tree"])
        .env("GIT_INDEX_FILE", index_env)
        .ok()
        .await?
        .line();
    Ok(tree)
}

/// Copies the index at `real` to `temp` with its modification time. Git trusts an entry's
/// cached stat data only if the file was modified before the index was written; an entry as new
/// as the index itself ("racily clean") has its contents compared. A copy stamped with the time
/// of copying would make every such entry look trustworthy, and a file rewritten with the same
/// size within the same clock tick as the checkout (a few milliseconds) would be taken as
/// unchanged: left out of the snapshot, so out of an apply, and its worktree removable.
fn seed_index(real: &Path, temp: &Path) -> std::io::Result<()> {
    let written = std::fs::metadata(real)?.modified()?;
    std::fs::copy(real, temp)?;
    std::fs::File::options()
        .write(true)
        .open(temp)?
        .set_modified(written)
}

/// Commits the worktree's current state (untracked files included) to its branch, if it differs
/// from the branch's tip, and returns the tip. The worktree's index is reset to it, its files
/// are left as they are (they already hold that state).
pub async fn commit_state(worktree: &Path, scratch: &Path, task: &str) -> Result<String, GitError> {
    let tree = snapshot_tree(worktree, scratch).await?;
    let tip = git(worktree, &["rev-parse", "--verify", "HEAD^{commit}"])
        .await?
        .line();
    let tip_tree = git(worktree, &["rev-parse", &format!("{tip}^{{tree}}")])
        .await?
        .line();
    if tree == tip_tree {
        return Ok(tip);
    }
    let commit = commit_tree(
        worktree,
        &tree,
        &tip,
        &format!("opencode-mcp: the work of task {task}"),
    )
    .await?;
    git(worktree, &["update-ref", "HEAD", &commit, &tip]).await?;
    git(worktree, &["reset", "--quiet"]).await?;
    Ok(commit)
}

/// Removes the worktree at `path` and deletes `branch` in `origin`. Whatever is already gone is
/// skipped, so removing twice is removing once.
pub async fn remove(origin: &Path, path: &Path, branch: &str) -> Result<(), GitError> {
    if path.exists() {
        // Twice `--force`: also when the worktree has changes or is locked.
        Cmd::new(origin, &["worktree", "remove", "--force", "--force"])
            .arg(path.as_os_str())
            .ok()
            .await?;
    }
    // A worktree directory deleted by hand leaves its registration behind.
    git(origin, &["worktree", "prune"]).await?;
    let exists = Cmd::new(
        origin,
        &[
            "rev-parse",
            "--verify",
            "-q",
            &format!("refs/heads/{branch}"),
        ],
    )
    .output()
    .await?
    .code
        == Some(0);
    if exists {
        git(origin, &["branch", "-D", "--quiet", branch]).await?;
    }
    Ok(())
}

/// What a task's worktree still holds, for deciding whether it may be removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pending {
    /// Files changed against the task's base.
    pub changed_files: usize,
    /// The worktree differs from what was last applied (or, never applied, from its base):
    /// removing it would lose work nobody took.
    pub unapplied: bool,
}

/// Compares the worktree at `path`, as it is on disk (untracked files included), with `base` and
/// with `applied` (the commit last applied, if any). A worktree that is gone holds nothing.
pub async fn pending(
    path: &Path,
    base: &str,
    applied: Option<&str>,
    scratch: &Path,
) -> Result<Pending, GitError> {
    if !path.exists() {
        return Ok(Pending {
            changed_files: 0,
            unapplied: false,
        });
    }
    let tree = snapshot_tree(path, scratch).await?;
    let changed_files = super::diff::summary(path, base, &tree).await?.len();
    let taken = applied.unwrap_or(base);
    let taken_tree = git(path, &["rev-parse", &format!("{taken}^{{tree}}")])
        .await?
        .line();
    Ok(Pending {
        changed_files,
        unapplied: tree != taken_tree,
    })
}

/// Where a worktree came from, read from the worktree itself: for one whose task record is gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    /// The repository the worktree belongs to (where `git worktree remove` runs).
    pub origin: PathBuf,
    /// The branch checked out there, if any (`opencode-mcp/<task_id>` for ours).
    pub branch: Option<String>,
    /// The commit checked out there.
    pub head: String,
}

/// Reads the repository and branch of the worktree at `path`.
pub async fn locate(path: &Path) -> Result<Located, GitError> {
    let common = Cmd::new(
        path,
        &["rev-parse", "--path-format=absolute", "--git-common-dir"],
    )
    .output()
    .await?;
    if common.code != Some(0) || common.line().is_empty() {
        return Err(GitError::NotARepository {
            dir: path.to_path_buf(),
        });
    }
    let common = PathBuf::from(common.line());
    // A non-bare repository's common directory is its `.git`; git runs fine from either.
    let origin = match common.file_name() {
        Some(n) if n == ".git" => common.parent().map(Path::to_path_buf).unwrap_or(common),
        _ => common,
    };
    let branch = Cmd::new(path, &["symbolic-ref", "-q", "--short", "HEAD"])
        .output()
        .await?;
    let branch = (branch.code == Some(0) && !branch.line().is_empty()).then(|| branch.line());
    let head = git(path, &["rev-parse", "--verify", "HEAD^{commit}"])
        .await?
        .line();
    Ok(Located {
        origin,
        branch,
        head,
    })
}

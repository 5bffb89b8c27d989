//! A task's worktree: the snapshot it starts from, creating it, committing its state, removing
//! it.
//!
//! A worktree lives outside the user's tree (under the gateway's state directory,
//! `worktrees/<task_id>`) on its own branch `opencode-mcp/<task_id>`, so an agent's edits, its
//! half-written files and its test runs never reach the user's files or another task's.
//!
//! Once the agent has had it, everything in the worktree is the agent's, its `.git` file
//! included: the gateway reaches it only as a [`Worktree`], whose repository is found from the
//! origin the task record names (see `run`'s module comment for why).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::run::{commit_tree, commit_tree_dated, GitError, Repo};
use super::BRANCH_PREFIX;

/// What a task's worktree starts from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
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

/// The repository around `dir` (its top directory, canonical) and the commit a task's work
/// starts from: `HEAD`, or for [`Base::WorkingTree`] `HEAD` plus the uncommitted changes
/// (untracked files included) as a commit of the gateway's, written without touching the
/// user's index (`scratch` holds the temporary one).
///
/// The snapshot commit depends only on `HEAD` and the files: its message names no task and its
/// dates are `HEAD`'s. So starts from the same state share one base, and a worker that has it
/// already is not sent it again (`workers::repo`).
pub async fn base_commit(
    dir: &Path,
    scratch: &Path,
    base: Base,
) -> Result<(PathBuf, String), GitError> {
    let origin = toplevel(dir).await?;
    let repo = Repo::at(&origin);
    let head = head(&repo).await?;
    let commit = match base {
        Base::Head => head,
        Base::WorkingTree => {
            let tree = snapshot_tree(&repo, scratch)
                .await
                .map_err(|e| as_snapshot_error(&origin, e))?;
            // `<tree> <committer seconds> <offset>` of HEAD, in one call.
            let about = repo
                .git(&[
                    "show",
                    "-s",
                    "--no-show-signature",
                    "--format=%T %ct %cz",
                    &head,
                ])
                .await?
                .line();
            let mut parts = about.split(' ');
            let (head_tree, seconds, offset) = (
                parts.next().unwrap_or_default(),
                parts.next().unwrap_or("0"),
                parts.next().unwrap_or("+0000"),
            );
            if tree == head_tree {
                head
            } else {
                let message = format!(
                    "opencode-mcp: uncommitted changes of {} on {head}",
                    origin.display()
                );
                let date = format!("{seconds} {offset}");
                commit_tree_dated(&repo, &tree, &head, &message, Some(&date)).await?
            }
        }
    };
    Ok((origin, commit))
}

/// Creates the worktree of task `name` for the repository around `dir`, at `root/<name>`.
pub async fn create(dir: &Path, root: &Path, name: &str, base: Base) -> Result<Created, GitError> {
    let (origin, base_commit) = base_commit(dir, root, base).await?;
    create_at(dir, root, name, origin, base_commit).await
}

/// [`create`] from a base already made by [`base_commit`] for the repository `origin` around
/// `dir` (a fan-out's targets share one).
pub async fn create_at(
    dir: &Path,
    root: &Path,
    name: &str,
    origin: PathBuf,
    base_commit: String,
) -> Result<Created, GitError> {
    let repo = Repo::at(&origin);
    // Owner-only: the worktrees hold copies of the user's files, untracked ones included.
    crate::private_files::create_dir(root).map_err(|error| GitError::Io {
        dir: root.to_path_buf(),
        context: "creating the worktrees directory",
        error,
    })?;
    let path = root.join(name);
    let branch = format!("{BRANCH_PREFIX}{name}");
    let add = || {
        repo.cmd(&["worktree", "add", "--quiet", "-b", &branch])
            .arg(path.as_os_str())
            .arg(OsStr::new(&base_commit))
            .ok()
    };
    if let Err(e) = add().await {
        // What an earlier attempt at this same start made (a gateway that stopped while the
        // task was starting: the next one starts it again) is removed, and the worktree added
        // once more; task names are unique. Only then: every start would pay for the look.
        if !path.exists() && !branch_exists(&repo, &branch).await? {
            return Err(e);
        }
        remove(&origin, &path, &branch).await?;
        add().await?;
    }
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

/// Refuses a `dir` a worktree cannot be made of (git missing, not inside a repository, a
/// repository with no commit yet), with two quick `git rev-parse`: what a start refuses at
/// once, before its worktree is made in the background.
pub async fn can_branch(dir: &Path) -> Result<(), GitError> {
    let origin = toplevel(dir).await?;
    head(&Repo::at(&origin)).await.map(drop)
}

/// Whether `branch` is a branch of `repo`.
async fn branch_exists(repo: &Repo, branch: &str) -> Result<bool, GitError> {
    let out = repo
        .cmd(&[
            "rev-parse",
            "--verify",
            "-q",
            &format!("refs/heads/{branch}"),
        ])
        .output()
        .await?;
    Ok(out.code == Some(0))
}

/// The top directory of the repository around `dir` (canonical).
async fn toplevel(dir: &Path) -> Result<PathBuf, GitError> {
    if !dir.is_dir() {
        return Err(GitError::NotARepository {
            dir: dir.to_path_buf(),
        });
    }
    let out = Repo::at(dir)
        .cmd(&["rev-parse", "--show-toplevel"])
        .output()
        .await?;
    // The path as git printed it, bytes and all (a lossy reading would name a directory that
    // does not exist).
    let top = out.stdout.split(|b| *b == b'\n').next().unwrap_or_default();
    if out.code != Some(0) || top.is_empty() {
        return Err(GitError::NotARepository {
            dir: dir.to_path_buf(),
        });
    }
    let top = path_of_bytes(top);
    Ok(top.canonicalize().unwrap_or(top))
}

/// A path from git's output, as the bytes it printed.
fn path_of_bytes(bytes: &[u8]) -> PathBuf {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        PathBuf::from(OsStr::from_bytes(bytes))
    }
    #[cfg(not(unix))]
    {
        PathBuf::from(String::from_utf8_lossy(bytes).into_owned())
    }
}

/// The commit `HEAD` names.
async fn head(repo: &Repo) -> Result<String, GitError> {
    let out = repo
        .cmd(&["rev-parse", "--verify", "-q", "HEAD^{commit}"])
        .output()
        .await?;
    match out.code {
        Some(0) => Ok(out.line()),
        _ => Err(GitError::NoCommits {
            dir: repo.dir().to_path_buf(),
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

/// A temporary index file or object directory in the scratch directory, removed when dropped.
struct TempPath(PathBuf);

impl Drop for TempPath {
    fn drop(&mut self) {
        if self.0.is_dir() {
            let _ = std::fs::remove_dir_all(&self.0);
        } else {
            let _ = std::fs::remove_file(&self.0);
            let _ = std::fs::remove_file(self.0.with_extension("lock"));
        }
    }
}

static TEMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// Makes the directory of temporary indexes and object stores. Owner-only, like the worktrees:
/// a temporary index lists the user's untracked files.
fn make_scratch(scratch: &Path) -> Result<(), GitError> {
    crate::private_files::create_dir(scratch)
        .map(drop)
        .map_err(|error| GitError::Io {
            dir: scratch.to_path_buf(),
            context: "creating the directory for temporary indexes",
            error,
        })
}

/// A new name in `scratch`: `.<what>-<pid>-<seq>`.
fn scratch_path(scratch: &Path, what: &str) -> PathBuf {
    let seq = TEMP_SEQ.fetch_add(1, Ordering::Relaxed);
    scratch.join(format!(".{what}-{}-{seq}", std::process::id()))
}

/// The tree of `repo`'s working tree as it is now: tracked files as they are on disk, deleted
/// ones gone, untracked files that are not ignored added. Written through a temporary index in
/// `scratch`, so the repository's own index and files are left exactly as they were.
pub async fn snapshot_tree(repo: &Repo, scratch: &Path) -> Result<String, GitError> {
    make_scratch(scratch)?;
    let temp = TempPath(scratch_path(scratch, "index"));
    let real = repo
        .git(&["rev-parse", "--path-format=absolute", "--git-path", "index"])
        .await?
        .line();
    let index_env = temp.0.as_os_str();
    // Seeded from the real index, `add -A` hashes only what changed since it was written.
    let seeded = !real.is_empty() && seed_index(Path::new(&real), &temp.0).is_ok();
    if !seeded {
        repo.cmd(&["read-tree", "HEAD"])
            .env("GIT_INDEX_FILE", index_env)
            .ok()
            .await?;
    }
    repo.cmd(&["add", "-A", "--", "."])
        // `add` writes the index it is given: here the temporary one.
        .env("GIT_INDEX_FILE", index_env)
        .ok()
        .await?;
    let tree = repo
        .cmd(&["write-tree"])
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
pub async fn commit_state(
    worktree: &Worktree,
    scratch: &Path,
    task: &str,
) -> Result<String, GitError> {
    let repo = &worktree.repo;
    let tree = snapshot_tree(repo, scratch).await?;
    let tip = repo
        .git(&["rev-parse", "--verify", "HEAD^{commit}"])
        .await?
        .line();
    let tip_tree = repo
        .git(&["rev-parse", &format!("{tip}^{{tree}}")])
        .await?
        .line();
    if tree == tip_tree {
        return Ok(tip);
    }
    let commit = commit_tree(
        repo,
        &tree,
        &tip,
        &format!("opencode-mcp: the work of task {task}"),
    )
    .await?;
    repo.git(&["update-ref", "HEAD", &commit, &tip]).await?;
    repo.git(&["reset", "--quiet"]).await?;
    Ok(commit)
}

/// Removes the worktree at `path` and deletes `branch` in `origin`. Whatever is already gone is
/// skipped, so removing twice is removing once.
pub async fn remove(origin: &Path, path: &Path, branch: &str) -> Result<(), GitError> {
    let repo = Repo::at(origin);
    if path.exists() {
        // Twice `--force`: also when the worktree has changes or is locked.
        let removed = repo
            .cmd(&["worktree", "remove", "--force", "--force"])
            .arg(path.as_os_str())
            .ok()
            .await;
        if let Err(e) = removed {
            // Git checks the worktree's `.git` file first, which the agent may have rewritten.
            // A worktree the origin still has registered at this path is removed as git would
            // have, by deleting it; anything else is left alone and reported.
            if registered_dir(&repo, path).await.is_err() {
                return Err(e);
            }
            tracing::warn!(path = %path.display(), error = %e, "git refused to remove the worktree (its `.git` was changed); deleting its directory instead");
            std::fs::remove_dir_all(path).map_err(|error| GitError::Io {
                dir: path.to_path_buf(),
                context: "deleting a worktree whose `.git` was changed",
                error,
            })?;
        }
    }
    // A worktree directory deleted by hand leaves its registration behind.
    repo.git(&["worktree", "prune"]).await?;
    if branch_exists(&repo, branch).await? {
        repo.git(&["branch", "-D", "--quiet", branch]).await?;
    }
    Ok(())
}

/// A task's worktree, reached the way the gateway's record says: `path`, the origin repository it
/// was made from and the task's base commit. Git's own files for it are found in the origin (its
/// common directory's `worktrees/<name>`, the entry whose `gitdir` points back at `path`), never
/// through the worktree's `.git` file, which is the agent's to write; its attributes come from
/// the base commit, not from the worktree's `.gitattributes`.
#[derive(Debug, Clone)]
pub struct Worktree {
    /// Calls pinned to the worktree (`GIT_DIR`, `GIT_WORK_TREE`, `GIT_ATTR_SOURCE`).
    repo: Repo,
    /// The origin's object store: where the worktree's objects are (a read writes new ones
    /// elsewhere, see [`Worktree::read`]).
    objects: PathBuf,
}

impl Worktree {
    /// Finds the worktree at `path` among `origin`'s registered worktrees. Fails, naming both,
    /// when the origin has no worktree there (removed by hand, or never made by the gateway).
    pub async fn pin(origin: &Path, path: &Path, base: &str) -> Result<Self, GitError> {
        let git_dir = registered_dir(&Repo::at(origin), path).await?;
        Ok(Self::at(path, git_dir, base))
    }

    fn at(path: &Path, git_dir: PathBuf, attributes_from: &str) -> Self {
        warn_if_rewritten(path, &git_dir);
        // `commondir` names the origin's `.git`, relative to the worktree's git dir.
        let common = std::fs::read_to_string(git_dir.join("commondir"))
            .map(|c| git_dir.join(c.trim()))
            .unwrap_or_else(|_| git_dir.join("../.."));
        let env = vec![
            ("GIT_DIR", git_dir.into_os_string()),
            ("GIT_WORK_TREE", path.as_os_str().to_owned()),
            ("GIT_ATTR_SOURCE", attributes_from.into()),
        ];
        Self {
            repo: Repo::pinned(path, env),
            objects: common.join("objects"),
        }
    }

    /// Calls on the worktree.
    pub fn repo(&self) -> &Repo {
        &self.repo
    }

    /// A snapshot of the worktree as it is now (untracked files included) for reading only: the
    /// objects it needs that the repository lacks go to a scratch store under `scratch`, which
    /// goes when the [`Reading`] is dropped. Reading a task's result never writes the user's
    /// `.git`.
    pub async fn read(&self, scratch: &Path) -> Result<Reading, GitError> {
        make_scratch(scratch)?;
        let objects = TempPath(scratch_path(scratch, "objects"));
        std::fs::create_dir(&objects.0).map_err(|error| GitError::Io {
            dir: objects.0.clone(),
            context: "creating a scratch object store",
            error,
        })?;
        let repo = self.repo.quarantined(&objects.0, &self.objects);
        let tree = snapshot_tree(&repo, scratch).await?;
        Ok(Reading {
            repo,
            tree,
            _objects: objects,
        })
    }
}

/// A read-only snapshot of a worktree ([`Worktree::read`]): its tree, and calls that can see it.
pub struct Reading {
    repo: Repo,
    pub tree: String,
    _objects: TempPath,
}

impl Reading {
    pub fn repo(&self) -> &Repo {
        &self.repo
    }
}

/// The git dir (`<common>/worktrees/<name>`) through which `origin` registers the worktree at
/// `path`: the entry whose `gitdir` file points at `<path>/.git`. Git names the entry after the
/// worktree's directory, with a number added when that name was taken, so that one is looked at
/// first.
async fn registered_dir(origin: &Repo, path: &Path) -> Result<PathBuf, GitError> {
    let common = origin
        .git(&["rev-parse", "--path-format=absolute", "--git-common-dir"])
        .await?
        .line();
    let entries = Path::new(&common).join("worktrees");
    let expected = normalize(&path.join(".git"));
    let named = path.file_name().map(|n| entries.join(n));
    let others = std::fs::read_dir(&entries)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path());
    for candidate in named.into_iter().chain(others) {
        let Ok(text) = read_small(&candidate.join("gitdir")) else {
            continue;
        };
        let points_at = candidate.join(text.trim());
        if normalize(&points_at) == expected {
            return Ok(candidate);
        }
    }
    Err(GitError::Unregistered {
        path: path.to_path_buf(),
        origin: origin.dir().to_path_buf(),
    })
}

/// `path` with its directory resolved (symlinks, `..`) when it exists, else as given.
fn normalize(path: &Path) -> PathBuf {
    match (path.parent(), path.file_name()) {
        (Some(dir), Some(name)) => dir
            .canonicalize()
            .map(|d| d.join(name))
            .unwrap_or_else(|_| path.to_path_buf()),
        _ => path.to_path_buf(),
    }
}

/// A small regular file's text (git's pointer files are one line); anything else is refused.
fn read_small(path: &Path) -> std::io::Result<String> {
    let meta = std::fs::symlink_metadata(path)?;
    if !meta.is_file() || meta.len() > 4096 {
        return Err(std::io::Error::other("not a small regular file"));
    }
    std::fs::read_to_string(path)
}

/// Logs (once per worktree and process) when the worktree's `.git` no longer points at its git
/// dir: the agent (or someone) rewrote it. The gateway's calls do not read it, so this is a
/// note, not an error.
fn warn_if_rewritten(path: &Path, git_dir: &Path) {
    let dot_git = path.join(".git");
    let intact = read_small(&dot_git).is_ok_and(|text| {
        text.trim()
            .strip_prefix("gitdir:")
            .is_some_and(|to| normalize(&path.join(to.trim())) == normalize(git_dir))
    });
    static WARNED: std::sync::Mutex<std::collections::BTreeSet<PathBuf>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let first = || {
        WARNED
            .lock()
            .map(|mut seen| seen.insert(path.to_path_buf()))
            .unwrap_or(true)
    };
    // Once per worktree: every read of it would say it again.
    if !intact && first() {
        tracing::warn!(worktree = %path.display(), "the worktree's `.git` was changed (by its agent?); the gateway's git ignores it and uses the repository the task was made from");
    }
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

/// Compares the worktree of `origin` at `path`, as it is on disk (untracked files included),
/// with `base` and with `applied` (the commit last applied, if any). A worktree that is gone
/// holds nothing.
pub async fn pending(
    origin: &Path,
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
    let reading = Worktree::pin(origin, path, base)
        .await?
        .read(scratch)
        .await?;
    let changed_files = super::diff::summary(reading.repo(), base, &reading.tree)
        .await?
        .len();
    let taken = applied.unwrap_or(base);
    let taken_tree = reading
        .repo()
        .git(&["rev-parse", &format!("{taken}^{{tree}}")])
        .await?
        .line();
    Ok(Pending {
        changed_files,
        unapplied: reading.tree != taken_tree,
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

/// Reads the repository and branch of the worktree at `path`, whose task record is gone. Its
/// `.git` file is the only pointer left, so it is read as data and believed only if it leads
/// out of the worktree to a git dir whose `gitdir` points back here: a pointer into the
/// worktree itself (a repository the agent planted) is refused.
pub async fn locate(path: &Path) -> Result<Located, GitError> {
    let not_ours = |why: &str| GitError::Tampered {
        path: path.to_path_buf(),
        why: why.to_string(),
    };
    let text = read_small(&path.join(".git")).map_err(|_| GitError::NotARepository {
        dir: path.to_path_buf(),
    })?;
    let to = text
        .trim()
        .strip_prefix("gitdir:")
        .ok_or_else(|| not_ours("it holds no `gitdir:` line"))?;
    let git_dir = path
        .join(to.trim())
        .canonicalize()
        .map_err(|_| not_ours("the git dir it names does not exist"))?;
    let root = path.canonicalize().map_err(|error| GitError::Io {
        dir: path.to_path_buf(),
        context: "resolving the worktree's path",
        error,
    })?;
    if git_dir.starts_with(&root) {
        return Err(not_ours("it names a git dir inside the worktree"));
    }
    let back = read_small(&git_dir.join("gitdir"))
        .map_err(|_| not_ours("the git dir it names has no `gitdir` file"))?;
    if normalize(&git_dir.join(back.trim())) != normalize(&root.join(".git")) {
        return Err(not_ours("the git dir it names belongs to another worktree"));
    }
    let probe = Worktree::at(&root, git_dir.clone(), "HEAD");
    let common = probe
        .repo
        .git(&["rev-parse", "--path-format=absolute", "--git-common-dir"])
        .await?
        .line();
    let common = PathBuf::from(common);
    if common.starts_with(&root) {
        return Err(not_ours("its repository is inside the worktree"));
    }
    let head = probe
        .repo
        .git(&["rev-parse", "--verify", "HEAD^{commit}"])
        .await?
        .line();
    let branch = probe
        .repo
        .cmd(&["symbolic-ref", "-q", "--short", "HEAD"])
        .output()
        .await?;
    let branch = (branch.code == Some(0) && !branch.line().is_empty()).then(|| branch.line());
    // A non-bare repository's common directory is its `.git`; git runs fine from either.
    let origin = match common.file_name() {
        Some(n) if n == ".git" => common.parent().map(Path::to_path_buf).unwrap_or(common),
        _ => common,
    };
    Ok(Located {
        origin,
        branch,
        head,
    })
}

//! Scenario `worktree`: what a task's worktree costs to create in a large repository, against a
//! bare `git worktree add` of the same repository in the same run.
//!
//! The gateway's side is its own code, [`opencode_mcp::git::create`] with base `working_tree`
//! (the default): the snapshot of the uncommitted changes through a temporary index, the
//! snapshot commit, then `git worktree add` of that commit. The baseline is what a user would
//! type, `git worktree add -b <branch> <path> HEAD`, which checks out the same files but carries
//! no uncommitted change. Both check out the whole tree, so the ratio is what the snapshot adds.
//! No OpenCode and no gateway process are involved: this scenario runs before they start.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use opencode_mcp::git::{self, Base};

use crate::scenarios::ms;
use crate::BoxError;

/// What the scenario measured.
pub struct WorktreeTimes {
    pub files: usize,
    pub gateway_ms: Vec<f64>,
    pub bare_ms: Vec<f64>,
}

/// Environment for the git runs that build the repository: no user or system config, and an
/// identity, so the setup works (and is the same) on any machine.
const SETUP_ENV: [(&str, &str); 6] = [
    ("GIT_CONFIG_GLOBAL", "/dev/null"),
    ("GIT_CONFIG_NOSYSTEM", "1"),
    ("GIT_AUTHOR_NAME", "bench"),
    ("GIT_AUTHOR_EMAIL", "bench@example.invalid"),
    ("GIT_COMMITTER_NAME", "bench"),
    ("GIT_COMMITTER_EMAIL", "bench@example.invalid"),
];

pub(crate) async fn git_in(dir: &Path, args: &[&str]) -> Result<(), BoxError> {
    let out = tokio::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .envs(SETUP_ENV)
        .output()
        .await?;
    if !out.status.success() {
        return Err(format!(
            "git {args:?} in {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )
        .into());
    }
    Ok(())
}

/// A repository of `files` small committed files in directories of 100, plus uncommitted
/// changes of every kind (so the gateway's snapshot has something to carry).
pub(crate) async fn make_repo(repo: &Path, files: usize) -> Result<(), BoxError> {
    // Committed files are dated an hour back: written in the same second as the index, they
    // would be "racily clean" and re-hashed by every command, which a real repository's files
    // are not.
    let past = SystemTime::now() - Duration::from_secs(3600);
    for i in 0..files {
        let dir = repo.join(format!("d{:03}", i / 100));
        if i % 100 == 0 {
            std::fs::create_dir_all(&dir)?;
        }
        let path = dir.join(format!("f{i:05}.txt"));
        std::fs::write(&path, format!("file {i}\nsome content of file {i}\n"))?;
        std::fs::File::options()
            .write(true)
            .open(&path)?
            .set_modified(past)?;
    }
    git_in(repo, &["init", "-q", "-b", "main"]).await?;
    git_in(repo, &["add", "-A"]).await?;
    git_in(repo, &["commit", "-q", "-m", "10,000 files"]).await?;
    // An unstaged edit, a staged edit, a staged new file and an untracked one.
    std::fs::write(repo.join("d000/f00000.txt"), "edited, unstaged\n")?;
    std::fs::write(repo.join("d001/f00100.txt"), "edited, staged\n")?;
    std::fs::write(repo.join("staged-new.txt"), "new, staged\n")?;
    git_in(repo, &["add", "d001/f00100.txt", "staged-new.txt"]).await?;
    std::fs::write(repo.join("untracked.txt"), "untracked\n")?;
    Ok(())
}

/// The gateway's worktree for task `name` under `root`, created and removed; returns the
/// creation time.
async fn gateway_once(repo: &Path, root: &Path, name: &str) -> Result<f64, BoxError> {
    let t = Instant::now();
    let created = git::create(repo, root, name, Base::WorkingTree).await?;
    let took = ms(t.elapsed());
    if !created.path.join("untracked.txt").is_file() {
        return Err("the gateway's worktree lacks the repository's untracked file".into());
    }
    git::remove(&created.origin, &created.path, &created.branch).await?;
    Ok(took)
}

/// `git worktree add -b <branch> <path> HEAD`, timed, then removed with its branch.
async fn bare_once(repo: &Path, root: &Path, name: &str) -> Result<f64, BoxError> {
    let path: PathBuf = root.join(name);
    let branch = format!("bare/{name}");
    let t = Instant::now();
    let out = tokio::process::Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(["worktree", "add", "-q", "-b", &branch])
        .arg(&path)
        .arg("HEAD")
        .output()
        .await?;
    let took = ms(t.elapsed());
    if !out.status.success() {
        return Err(format!(
            "git worktree add in {}: {}",
            repo.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )
        .into());
    }
    git::remove(repo, &path, &branch).await?;
    Ok(took)
}

/// Builds the repository, warms both sides once, then times `reps` creations of each,
/// alternating which goes first.
pub async fn worktree_creation(files: usize, reps: usize) -> Result<WorktreeTimes, BoxError> {
    let tmp = tempfile::tempdir()?;
    let repo = tmp.path().join("repo");
    std::fs::create_dir_all(&repo)?;
    make_repo(&repo, files).await?;
    let root = tmp.path().join("worktrees");
    gateway_once(&repo, &root, "warm-g").await?;
    bare_once(&repo, &root, "warm-b").await?;
    let mut out = WorktreeTimes {
        files,
        gateway_ms: Vec::with_capacity(reps),
        bare_ms: Vec::with_capacity(reps),
    };
    for r in 0..reps {
        let (g, b) = (format!("g{r}"), format!("b{r}"));
        if r % 2 == 0 {
            out.gateway_ms.push(gateway_once(&repo, &root, &g).await?);
            out.bare_ms.push(bare_once(&repo, &root, &b).await?);
        } else {
            out.bare_ms.push(bare_once(&repo, &root, &b).await?);
            out.gateway_ms.push(gateway_once(&repo, &root, &g).await?);
        }
    }
    Ok(out)
}

//! Spawning `git`, and what can go wrong with it.
//!
//! Every call runs with a cleaned environment: variables that would point git elsewhere
//! (`GIT_DIR`, `GIT_WORK_TREE`, `GIT_INDEX_FILE`, set when the gateway itself runs under a git
//! hook) are removed, prompts are off (a credential prompt would hang the gateway), optional
//! locks are off (a read must never write the user's index), and messages are in the C locale so
//! that the few the gateway recognises read the same everywhere.
//!
//! The user's repository and settings are not the gateway's, so nothing of theirs runs or waits
//! on a call: hooks are off (`worktree add` runs `post-checkout`, `update-ref` runs
//! `reference-transaction`; a failing husky hook made every worktree task fail), an askpass
//! answers nothing, fsmonitor is off, LFS does not fetch on checkout, and every call is bounded
//! by [`TIMEOUT`]: one that hangs anyway is killed and reported, rather than holding the lock
//! every worktree operation shares.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::io::AsyncWriteExt;

/// What a git operation of a task workspace can fail with. Every message names the directory
/// and says how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum GitError {
    #[error(
        "isolation `worktree` needs git, and `git` could not be run in {dir} ({reason}): install \
         git and put it on the gateway's PATH, or start the task with isolation `none`"
    )]
    Missing { dir: PathBuf, reason: String },
    #[error(
        "{dir} is not inside a git repository, so the task cannot get a worktree of it: pass a \
         `directory` inside a repository, run `git init` there and commit, or start the task \
         with isolation `none`"
    )]
    NotARepository { dir: PathBuf },
    #[error(
        "the repository at {dir} has no commit yet, and a worktree needs one to branch from: \
         commit once (e.g. `git commit --allow-empty -m init`), or start the task with isolation \
         `none`"
    )]
    NoCommits { dir: PathBuf },
    #[error(
        "cannot snapshot the uncommitted changes of {dir} as the task's base: {detail}. Fix what \
         git reports (an unreadable file, a broken index), or pass base `head` to branch from \
         the last commit only"
    )]
    Snapshot { dir: PathBuf, detail: String },
    #[error("{message}")]
    Conflict { message: String, files: Vec<String> },
    #[error("`git {command}` failed in {dir}: {stderr}")]
    Failed {
        dir: PathBuf,
        command: String,
        stderr: String,
    },
    #[error("{context} ({dir}): {error}")]
    Io {
        dir: PathBuf,
        context: &'static str,
        error: std::io::Error,
    },
}

/// The output of a git run that exited, successfully or not.
pub struct Output {
    pub code: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: String,
}

impl Output {
    /// The first line of stdout, trimmed (an id, a path).
    pub fn line(&self) -> String {
        String::from_utf8_lossy(&self.stdout)
            .lines()
            .next()
            .unwrap_or("")
            .trim()
            .to_string()
    }
}

/// The longest one git call may take. Generous (a snapshot of a large tree through a
/// temporary index reads every file), and only a bound: nothing should wait on the user.
pub const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// Settings every call runs with, whatever the user's config says (see the module comment).
const OVERRIDES: [&str; 4] = [
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "core.fsmonitor=false",
];

/// One git invocation: `git -C <dir> <args>`, with extra environment and optional stdin.
pub struct Cmd<'a> {
    dir: &'a Path,
    args: Vec<&'a OsStr>,
    env: Vec<(&'a str, &'a OsStr)>,
    stdin: Option<Vec<u8>>,
}

impl<'a> Cmd<'a> {
    pub fn new(dir: &'a Path, args: &[&'a str]) -> Self {
        Self {
            dir,
            args: args.iter().map(|a| OsStr::new(*a)).collect(),
            env: Vec::new(),
            stdin: None,
        }
    }

    pub fn arg(mut self, arg: &'a OsStr) -> Self {
        self.args.push(arg);
        self
    }

    pub fn env(mut self, key: &'a str, value: &'a OsStr) -> Self {
        self.env.push((key, value));
        self
    }

    pub fn stdin(mut self, input: Vec<u8>) -> Self {
        self.stdin = Some(input);
        self
    }

    fn describe(&self) -> String {
        self.args
            .iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Runs it and returns whatever it exited with; only a git that cannot be started is an
    /// error here.
    pub async fn output(self) -> Result<Output, GitError> {
        let mut cmd = tokio::process::Command::new("git");
        cmd.args(OVERRIDES).arg("-C").arg(self.dir);
        cmd.args(&self.args);
        for var in [
            "GIT_DIR",
            "GIT_WORK_TREE",
            "GIT_INDEX_FILE",
            "GIT_OBJECT_DIRECTORY",
            "GIT_PREFIX",
            "GIT_COMMON_DIR",
        ] {
            cmd.env_remove(var);
        }
        cmd.env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_ASKPASS", "false")
            .env("SSH_ASKPASS", "false")
            .env("GIT_SSH_COMMAND", "ssh -o BatchMode=yes")
            .env("GIT_LFS_SKIP_SMUDGE", "1")
            .env("GIT_OPTIONAL_LOCKS", "0")
            .env("LC_ALL", "C");
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd.stdin(if self.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|e| GitError::Missing {
            dir: self.dir.to_path_buf(),
            reason: e.to_string(),
        })?;
        let command = self.describe();
        if let (Some(input), Some(mut pipe)) = (self.stdin, child.stdin.take()) {
            // A git that exits early closes the pipe; its exit status says why.
            let _ = pipe.write_all(&input).await;
            drop(pipe);
        }
        let out = match tokio::time::timeout(TIMEOUT, child.wait_with_output()).await {
            Ok(out) => out.map_err(|error| GitError::Io {
                dir: self.dir.to_path_buf(),
                context: "waiting for git",
                error,
            })?,
            // Dropping the future killed git (kill_on_drop).
            Err(_) => {
                return Err(GitError::Failed {
                    dir: self.dir.to_path_buf(),
                    command,
                    stderr: format!("it ran longer than {} s and was stopped", TIMEOUT.as_secs()),
                })
            }
        };
        Ok(Output {
            code: out.status.code(),
            stdout: out.stdout,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }

    /// Runs it and requires success.
    pub async fn ok(self) -> Result<Output, GitError> {
        let dir = self.dir.to_path_buf();
        let command = self.describe();
        let out = self.output().await?;
        if out.code == Some(0) {
            Ok(out)
        } else {
            Err(GitError::Failed {
                dir,
                command,
                stderr: out.stderr,
            })
        }
    }
}

/// `git -C dir <args>`, required to succeed.
pub async fn git(dir: &Path, args: &[&str]) -> Result<Output, GitError> {
    Cmd::new(dir, args).ok().await
}

/// Identity for the commits the gateway makes (snapshots, task states), so that they work in a
/// repository without `user.name` and never borrow the user's name for work they did not do.
pub const IDENTITY: [(&str, &str); 4] = [
    ("GIT_AUTHOR_NAME", "opencode-mcp"),
    ("GIT_AUTHOR_EMAIL", "opencode-mcp@localhost"),
    ("GIT_COMMITTER_NAME", "opencode-mcp"),
    ("GIT_COMMITTER_EMAIL", "opencode-mcp@localhost"),
];

/// `git commit-tree <tree> -p <parent> -m <message>` as the gateway, unsigned (a signing setup
/// may prompt or need an agent).
pub async fn commit_tree(
    dir: &Path,
    tree: &str,
    parent: &str,
    message: &str,
) -> Result<String, GitError> {
    let mut cmd = Cmd::new(
        dir,
        &[
            "commit-tree",
            "--no-gpg-sign",
            tree,
            "-p",
            parent,
            "-m",
            message,
        ],
    );
    for (k, v) in IDENTITY {
        cmd = cmd.env(k, OsStr::new(v));
    }
    Ok(cmd.ok().await?.line())
}

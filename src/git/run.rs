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
//! every worktree operation shares. What a call prints is bounded too ([`OUTPUT_LIMIT`], or the
//! caller's own limit): a task's diff can be as large as the agent made it.
//!
//! # What an agent wrote never chooses what git runs
//!
//! Git runs programs named by its configuration: filter drivers (`filter.<x>.clean`, chosen per
//! file by `.gitattributes`), diff and merge drivers, textconv, `core.fsmonitor`, `core.pager`,
//! `core.sshCommand`, credential helpers, hooks. In a task's worktree the agent writes the files,
//! including the worktree's own `.git` file, which tells git where the repository (and so its
//! config) is: an agent allowed only to edit files could write `.git` pointing at a directory of
//! its own with `[filter "x"] clean = <command>`, and `.gitattributes` with `* filter=x`, and the
//! gateway's next `git add` would run `<command>` as the user. So a worktree is reached only
//! through a [`Repo`] pinned from the gateway's record ([`super::Worktree`]): `GIT_DIR` and
//! `GIT_WORK_TREE` set (the `.git` file is never read), attributes taken from the task's base
//! commit (`GIT_ATTR_SOURCE`; the worktree's `.gitattributes` choose nothing), and the settings
//! below forced on every call. The configuration git then reads is the user's own (system,
//! global, the origin repository's), which the agent cannot write.

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
    #[error(
        "{path} is not a worktree of {origin} any more (git has no record of it there): it was \
         removed or moved by hand; discard the task"
    )]
    Unregistered { path: PathBuf, origin: PathBuf },
    #[error(
        "the worktree at {path} has a `.git` that does not lead back to the repository it was \
         made from ({why}), so the gateway will not run git there: look at the directory, and \
         delete it by hand if nothing in it is needed"
    )]
    Tampered { path: PathBuf, why: String },
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
    /// Stdout went past the call's limit: `stdout` holds the first part, and git was stopped.
    pub truncated: bool,
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

/// The most a call's stdout is read ([`Cmd::limit`] sets another): past it git is stopped and
/// the output marked [`Output::truncated`]. Only a task's change (a diff, a patch, a file of it)
/// can come near it.
pub const OUTPUT_LIMIT: usize = 64 << 20;

/// The most of a call's stderr that is kept (it goes into error messages).
const STDERR_LIMIT: usize = 64 << 10;

/// Settings every call runs with, whatever the user's config says (see the module comment): no
/// hook, no fsmonitor, no pager or editor, no external diff, no credential helper, no `ext::`
/// transport. Filter, diff and merge drivers cannot be switched off by name (their names are
/// free); they run only where attributes choose them, and a worktree's attributes come from
/// its base commit ([`super::Worktree`]).
pub const OVERRIDES: [&str; 18] = [
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "core.fsmonitor=false",
    "-c",
    "core.pager=cat",
    "-c",
    "core.editor=false",
    "-c",
    "sequence.editor=false",
    "-c",
    "diff.external=",
    "-c",
    "credential.helper=",
    "-c",
    "protocol.ext.allow=never",
    "-c",
    "commit.gpgSign=false",
];

/// Variables of the gateway's own environment that would point a call at another repository,
/// index, object store or attribute source, or make it run a program: removed from every call.
const SCRUBBED: [&str; 14] = [
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_PREFIX",
    "GIT_COMMON_DIR",
    "GIT_ATTR_SOURCE",
    "GIT_NAMESPACE",
    "GIT_EXTERNAL_DIFF",
    "GIT_PAGER",
    "GIT_EDITOR",
    "GIT_SEQUENCE_EDITOR",
    "GIT_PROXY_COMMAND",
];

/// Where git calls run, and what they are pinned to: the plain `git -C <dir>` of the user's own
/// tree ([`Repo::at`]), or a task's worktree with its repository, work tree and attributes fixed
/// by the gateway ([`super::Worktree::repo`]), possibly writing new objects into a scratch store
/// ([`Repo::quarantined`]).
#[derive(Debug, Clone)]
pub struct Repo {
    dir: std::path::PathBuf,
    env: Vec<(&'static str, std::ffi::OsString)>,
}

impl Repo {
    /// The repository git finds from `dir`: for the user's own tree, whose `.git` is theirs.
    pub fn at(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
            env: Vec::new(),
        }
    }

    /// Calls run in `dir` with these variables (`GIT_DIR`, `GIT_WORK_TREE`, ...).
    pub(super) fn pinned(dir: &Path, env: Vec<(&'static str, std::ffi::OsString)>) -> Self {
        Self {
            dir: dir.to_path_buf(),
            env,
        }
    }

    /// The same repository, with new objects written to `objects` (a scratch directory) and
    /// the repository's own `real` object store read beside it: a read that hashes files (a
    /// snapshot for a diff) leaves the user's `.git` exactly as it was.
    pub(super) fn quarantined(&self, objects: &Path, real: &Path) -> Self {
        let mut env = self.env.clone();
        env.push(("GIT_OBJECT_DIRECTORY", objects.as_os_str().to_owned()));
        env.push((
            "GIT_ALTERNATE_OBJECT_DIRECTORIES",
            real.as_os_str().to_owned(),
        ));
        Self {
            dir: self.dir.clone(),
            env,
        }
    }

    /// The directory calls run in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A call of `git <args>` here.
    pub fn cmd<'a>(&'a self, args: &[&'a str]) -> Cmd<'a> {
        let mut cmd = Cmd::new(&self.dir, args);
        for (k, v) in &self.env {
            cmd = cmd.env(k, v.as_os_str());
        }
        cmd
    }

    /// `git <args>` here, required to succeed.
    pub async fn git(&self, args: &[&str]) -> Result<Output, GitError> {
        self.cmd(args).ok().await
    }
}

/// One git invocation: `git -C <dir> <args>`, with extra environment and optional stdin.
pub struct Cmd<'a> {
    dir: &'a Path,
    args: Vec<&'a OsStr>,
    env: Vec<(&'a str, &'a OsStr)>,
    stdin: Option<Vec<u8>>,
    limit: usize,
}

impl<'a> Cmd<'a> {
    pub fn new(dir: &'a Path, args: &[&'a str]) -> Self {
        Self {
            dir,
            args: args.iter().map(|a| OsStr::new(*a)).collect(),
            env: Vec::new(),
            stdin: None,
            limit: OUTPUT_LIMIT,
        }
    }

    /// Reads at most `bytes` of stdout (then git is stopped and the output is
    /// [`Output::truncated`]).
    pub fn limit(mut self, bytes: usize) -> Self {
        self.limit = bytes;
        self
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
        for var in SCRUBBED {
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
        let limit = self.limit;
        let stdin = self.stdin.zip(child.stdin.take());
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let run = async {
            let feed = async {
                if let Some((input, mut pipe)) = stdin {
                    // A git that exits early closes the pipe; its exit status says why.
                    let _ = pipe.write_all(&input).await;
                }
            };
            let (_, out, err) = tokio::join!(
                feed,
                read_bounded(stdout, limit),
                read_bounded(stderr, STDERR_LIMIT)
            );
            let ((stdout, truncated), (stderr, _)) = (out?, err?);
            if truncated {
                // It has more to say than is read: stop it rather than wait on a full pipe.
                let _ = child.start_kill();
            }
            let status = child.wait().await?;
            Ok::<_, std::io::Error>(Output {
                code: status.code(),
                stdout,
                stderr: String::from_utf8_lossy(&stderr).trim().to_string(),
                truncated,
            })
        };
        match tokio::time::timeout(TIMEOUT, run).await {
            Ok(out) => out.map_err(|error| GitError::Io {
                dir: self.dir.to_path_buf(),
                context: "waiting for git",
                error,
            }),
            // Dropping the future killed git (kill_on_drop).
            Err(_) => Err(GitError::Failed {
                dir: self.dir.to_path_buf(),
                command,
                stderr: format!("it ran longer than {} s and was stopped", TIMEOUT.as_secs()),
            }),
        }
    }

    /// Runs it and requires success (or output past the call's limit, after which git was
    /// stopped: the caller reads [`Output::truncated`]).
    pub async fn ok(self) -> Result<Output, GitError> {
        let dir = self.dir.to_path_buf();
        let command = self.describe();
        let out = self.output().await?;
        if out.code == Some(0) || out.truncated {
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

/// Reads `pipe` to its end or to `limit` bytes; `true` if there was more.
async fn read_bounded<R: tokio::io::AsyncRead + Unpin>(
    pipe: Option<R>,
    limit: usize,
) -> std::io::Result<(Vec<u8>, bool)> {
    use tokio::io::AsyncReadExt;
    let Some(pipe) = pipe else {
        return Ok((Vec::new(), false));
    };
    let mut buf = Vec::new();
    let cap = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1);
    pipe.take(cap).read_to_end(&mut buf).await?;
    let more = buf.len() > limit;
    buf.truncate(limit);
    Ok((buf, more))
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
    repo: &Repo,
    tree: &str,
    parent: &str,
    message: &str,
) -> Result<String, GitError> {
    commit_tree_dated(repo, tree, parent, message, None).await
}

/// [`commit_tree`] with the commit's author and committer dates set to `date` (git's internal
/// form, `<unix seconds> <offset>`) when given: the same tree, parent, message and date make the
/// same commit, whenever and however often it is written.
pub async fn commit_tree_dated(
    repo: &Repo,
    tree: &str,
    parent: &str,
    message: &str,
    date: Option<&str>,
) -> Result<String, GitError> {
    let mut cmd = repo.cmd(&[
        "commit-tree",
        "--no-gpg-sign",
        tree,
        "-p",
        parent,
        "-m",
        message,
    ]);
    for (k, v) in IDENTITY {
        cmd = cmd.env(k, OsStr::new(v));
    }
    if let Some(date) = date {
        for k in ["GIT_AUTHOR_DATE", "GIT_COMMITTER_DATE"] {
            cmd = cmd.env(k, OsStr::new(date));
        }
    }
    Ok(cmd.ok().await?.line())
}

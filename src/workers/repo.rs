//! The repository on a worker, moved with git over the same `ssh` both ways.
//!
//! - **There** ([`push`]): the task's base (the commit a local worktree would start from: `HEAD`,
//!   or `HEAD` plus the uncommitted work) is pushed into a bare repository under the worker's
//!   root, one per origin repository (`<root>/repos/<name>-<hash>.git`), so a later push sends
//!   only what is new; a worktree is made there on the task's branch (`<root>/worktrees/<task>`,
//!   branch `opencode-mcp/<task>`).
//! - **Back** ([`fetch_back`]): after a turn, what the agent changed is committed on the task's
//!   branch there and fetched into the local repository as `refs/opencode-mcp/remote/<task>`,
//!   the gateway's own namespace: no branch of the user's is written.
//! - **Gone** ([`discard`]): the worktree, the branch and the base ref leave the worker, and the
//!   local ref goes.
//!
//! Git on the worker runs with the settings local worktrees get ([`crate::git::OVERRIDES`]:
//! no hooks, no fsmonitor, no external diff, no credential helper, ...), given as
//! `GIT_CONFIG_*` variables. The worktree is reached through the paths the gateway chose
//! (`GIT_DIR`, `GIT_WORK_TREE`), never through its `.git` file, which the agent can rewrite,
//! and attributes come from the task's base commit (`GIT_ATTR_SOURCE`): nothing the agent
//! wrote in its worktree chooses what git runs. What that holds on the worker depends on its
//! confinement: a confined agent ([`super::sandbox`]) cannot write the bare repository (it is
//! read-only in its sandbox), but an unconfined one (`workers.<name>.sandbox: off`) runs as the
//! ssh user and can rewrite the bare repository's `config` and `info/attributes`, which git
//! there obeys (`git add -A` would run a filter it names). That reaches nothing beyond the
//! worker: what comes back is fetched as objects (`fetch.fsckObjects`) into the gateway's own
//! ref here. Locally, git's ssh transport runs the same `ssh` as every other call
//! ([`super::ssh::Ssh::git_ssh_command`]).

use std::ffi::OsStr;
use std::path::Path;
use std::time::Duration;

use super::ssh::SshError;
use super::Remote;
use crate::git::{GitError, Repo, BRANCH_PREFIX, IDENTITY, OVERRIDES};

/// The longest one step on the worker may take (a first push of a large repository, a
/// checkout of its tree).
const STEP_LIMIT: Duration = Duration::from_secs(600);

/// The local ref a remote task's work is kept in.
pub const REMOTE_REF_PREFIX: &str = "refs/opencode-mcp/remote/";
/// The local ref a fetch of a remote task's work lands in first ([`keep_fetched`] moves it).
const INCOMING_REF_PREFIX: &str = "refs/opencode-mcp/incoming/";
/// The worker's ref holding a task's base.
const BASE_REF_PREFIX: &str = "refs/opencode-mcp/base/";

/// What moving the work can fail with.
#[derive(Debug, thiserror::Error)]
pub enum RepoError {
    #[error(transparent)]
    Ssh(#[from] SshError),
    #[error(transparent)]
    Git(#[from] GitError),
    #[error("git on worker {worker} failed ({step}): {detail}")]
    OnWorker {
        worker: String,
        step: &'static str,
        detail: String,
    },
}

/// Where a task's work lives on its worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    /// The worker's bare repository for the origin.
    pub bare: String,
    /// The task's worktree there: where its OpenCode session works.
    pub worktree: String,
    /// The task's branch there.
    pub branch: String,
    /// The commit the task started from.
    pub base: String,
}

impl Placed {
    /// Where task `task` of the repository at `origin` lives on a worker whose root is `root`.
    pub fn new(root: &str, origin: &Path, task: &str, base: &str) -> Self {
        let root = root.trim_end_matches('/');
        Self {
            bare: format!("{root}/repos/{}.git", repository_name(origin)),
            worktree: format!("{root}/worktrees/{task}"),
            branch: format!("{BRANCH_PREFIX}{task}"),
            base: base.to_string(),
        }
    }

    /// The task id (the worktree's last segment).
    fn task(&self) -> &str {
        self.worktree.rsplit('/').next().unwrap_or_default()
    }
}

/// Sends the task's base to the worker and makes its worktree there. `origin` is the local
/// repository (its top directory), `base` the commit to start from.
pub async fn push(
    worker: &str,
    remote: &Remote,
    origin: &Path,
    task: &str,
    base: &str,
) -> Result<Placed, RepoError> {
    let placed = Placed::new(&remote.root, origin, task, base);
    send_base(worker, remote, origin, &placed).await?;
    add_worktree(worker, remote, &placed).await?;
    Ok(placed)
}

/// The first half of [`push`]: makes sure the worker's bare repository for `origin` exists and
/// holds the task's base (under the task's base ref there). Starts from one base share it: the
/// caller may skip this for a base it sent that worker already.
pub async fn send_base(
    worker: &str,
    remote: &Remote,
    origin: &Path,
    placed: &Placed,
) -> Result<(), RepoError> {
    // `git init` on an existing repository changes nothing of its content: every push can
    // make sure the repository is there, in the same round trip as nothing else.
    on_worker(
        worker,
        remote,
        "init",
        // `--shared=0600`: what git's transport writes into it later (a push) is the user's
        // alone too, whatever umask the worker's login gives `git-receive-pack`.
        &git_argv(&["init", "--bare", "--quiet", "--shared=0600", &placed.bare]),
    )
    .await?;
    let refspec = format!("{}:{BASE_REF_PREFIX}{}", placed.base, placed.task());
    over_ssh(
        origin,
        remote,
        &["push", "--quiet", "--no-verify", "--force"],
        &placed.bare,
        &refspec,
    )
    .await?;
    Ok(())
}

/// The second half of [`push`]: adds the task's worktree and branch at its base in the
/// worker's bare repository, which must hold the base already ([`send_base`]).
pub async fn add_worktree(worker: &str, remote: &Remote, placed: &Placed) -> Result<(), RepoError> {
    let add = git_argv(&[
        "-C",
        &placed.bare,
        "worktree",
        "add",
        "--quiet",
        "-b",
        &placed.branch,
        &placed.worktree,
        &placed.base,
    ]);
    if on_worker(worker, remote, "worktree add", &add)
        .await
        .is_err()
    {
        // An earlier attempt at this same start (its gateway stopped while the task was
        // starting; the next one starts it again) left the task's worktree or branch: task
        // names are unique, so they are removed, and the worktree is added once more.
        let remove = git_argv(&[
            "-C",
            &placed.bare,
            "worktree",
            "remove",
            "--force",
            "--force",
            &placed.worktree,
        ]);
        let _ = on_worker(worker, remote, "worktree remove", &remove).await;
        let prune = git_argv(&["-C", &placed.bare, "worktree", "prune"]);
        let _ = on_worker(worker, remote, "worktree prune", &prune).await;
        let branch = git_argv(&[
            "-C",
            &placed.bare,
            "branch",
            "-D",
            "--quiet",
            &placed.branch,
        ]);
        let _ = on_worker(worker, remote, "branch delete", &branch).await;
        on_worker(worker, remote, "worktree add", &add).await?;
    }
    Ok(())
}

/// Commits what the agent changed in the task's worktree on the worker (if anything) and
/// fetches the task's branch into the local repository at `origin` as
/// `refs/opencode-mcp/remote/<task>`. Returns the commit fetched.
pub async fn fetch_back(
    worker: &str,
    remote: &Remote,
    origin: &Path,
    placed: &Placed,
    message: &str,
) -> Result<String, RepoError> {
    // `$1`: the commit message. The repository and work tree are the gateway's paths, given
    // in the environment; `add -A` stages deletions and untracked files alike.
    const COMMIT: &str = "git add -A -- . && { git diff --cached --quiet || git commit --quiet \
                          --no-verify --no-gpg-sign -m \"$1\"; } && git rev-parse HEAD";
    let git_dir = format!("{}/worktrees/{}", placed.bare, placed.task());
    let mut argv: Vec<String> = vec![
        "env".into(),
        format!("GIT_DIR={git_dir}"),
        format!("GIT_WORK_TREE={}", placed.worktree),
        format!("GIT_ATTR_SOURCE={}", placed.base),
        "GIT_OPTIONAL_LOCKS=0".into(),
        "GIT_TERMINAL_PROMPT=0".into(),
    ];
    argv.extend(IDENTITY.iter().map(|(k, v)| format!("{k}={v}")));
    argv.extend(config_env());
    argv.extend(["sh", "-c", COMMIT, "sh", message].map(String::from));
    let refs: Vec<&str> = argv.iter().map(String::as_str).collect();
    // The worktree's files are the agent's; `sh` runs in it so that `-- .` is the whole tree.
    on_worker(worker, remote, "commit", &in_dir(&placed.worktree, &refs)).await?;
    // Into a ref of the task's own first: no other git work here waits on the network (the
    // caller moves it into place, [`keep_fetched`]).
    let local = format!("{INCOMING_REF_PREFIX}{}", placed.task());
    let refspec = format!("+refs/heads/{}:{local}", placed.branch);
    // What comes back was written where the agent works: its objects are checked as they
    // arrive, and the commit is the one the fetch wrote here, never what the worker printed
    // (the agent runs as the same user there, and whatever it prints would be handed to git
    // here as an argument).
    over_ssh(
        origin,
        remote,
        &[
            "-c",
            "fetch.fsckObjects=true",
            "fetch",
            "--quiet",
            "--no-tags",
            "--no-write-fetch-head",
        ],
        &placed.bare,
        &refspec,
    )
    .await?;
    let commit = Repo::at(origin)
        .git(&[
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("{local}^{{commit}}"),
        ])
        .await?
        .line();
    if !is_object_id(&commit) {
        return Err(RepoError::OnWorker {
            worker: worker.to_string(),
            step: "fetch",
            detail: format!("the fetched ref {local} does not name a commit"),
        });
    }
    Ok(commit)
}

/// Moves what [`fetch_back`] brought into the task's ref here (`refs/opencode-mcp/remote/
/// <task>`), or, with `None` (the task was discarded meanwhile), only drops it.
pub async fn keep_fetched(
    origin: &Path,
    placed: &Placed,
    commit: Option<&str>,
) -> Result<(), RepoError> {
    let repo = Repo::at(origin);
    let incoming = format!("{INCOMING_REF_PREFIX}{}", placed.task());
    if let Some(commit) = commit {
        let local = format!("{REMOTE_REF_PREFIX}{}", placed.task());
        repo.git(&["update-ref", &local, commit]).await?;
    }
    let _ = repo.git(&["update-ref", "-d", &incoming]).await;
    Ok(())
}

/// A full object id in hex (SHA-1 or SHA-256), as `rev-parse` prints one.
fn is_object_id(text: &str) -> bool {
    matches!(text.len(), 40 | 64) && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Removes the task's worktree, branch and base ref from the worker, and its fetched ref from
/// the local repository. What is already gone is not an error.
pub async fn discard(
    worker: &str,
    remote: &Remote,
    origin: &Path,
    placed: &Placed,
) -> Result<(), RepoError> {
    discard_there(worker, remote, placed).await?;
    let local = format!("{REMOTE_REF_PREFIX}{}", placed.task());
    let _ = Repo::at(origin).git(&["update-ref", "-d", &local]).await;
    Ok(())
}

/// Removes the task's worktree, branch and base ref from the worker only (the work fetched
/// back stays here).
pub async fn discard_there(
    worker: &str,
    remote: &Remote,
    placed: &Placed,
) -> Result<(), RepoError> {
    // `$1` bare repository, `$2` worktree, `$3` branch, `$4` base ref, `$5` and `$6` the task's
    // files of the gateway's there (its unconfined marker, its running check's pid). Each step
    // may find its part gone already; the prune forgets a worktree whose directory was removed
    // by hand.
    const CLEAN: &str = "git -C \"$1\" worktree remove --force \"$2\" 2>/dev/null; \
                         rm -rf -- \"$2\"; git -C \"$1\" worktree prune; \
                         git -C \"$1\" branch -D \"$3\" >/dev/null 2>&1; \
                         git -C \"$1\" update-ref -d \"$4\" 2>/dev/null; \
                         rm -f -- \"$5\" \"$6\"; exit 0";
    let base_ref = format!("{BASE_REF_PREFIX}{}", placed.task());
    let root = placed
        .worktree
        .strip_suffix(&format!("/worktrees/{}", placed.task()))
        .unwrap_or_default();
    let (marker, pidfile) = if root.is_empty() {
        (String::new(), String::new())
    } else {
        (
            format!("{root}/sandbox/open/{}", placed.task()),
            format!("{root}/checks/{}.pid", placed.task()),
        )
    };
    let mut argv: Vec<String> = vec!["env".into()];
    argv.extend(config_env());
    argv.extend(
        [
            "sh",
            "-c",
            CLEAN,
            "sh",
            &placed.bare,
            &placed.worktree,
            &placed.branch,
            &base_ref,
            &marker,
            &pidfile,
        ]
        .map(String::from),
    );
    let refs: Vec<&str> = argv.iter().map(String::as_str).collect();
    on_worker(worker, remote, "discard", &refs).await?;
    Ok(())
}

/// Runs `argv` on the worker; its stdout, or what it said when it failed.
async fn on_worker(
    worker: &str,
    remote: &Remote,
    step: &'static str,
    argv: &[&str],
) -> Result<String, RepoError> {
    // What the gateway makes there (the root, bare repositories, worktrees) is the ssh user's
    // alone, as local worktrees are, whatever the worker's umask.
    let mut private = vec!["sh", "-c", "umask 077 && exec \"$@\"", "sh"];
    private.extend_from_slice(argv);
    let out = remote.ssh.run(&private, None, STEP_LIMIT).await?;
    if out.status != 0 {
        return Err(RepoError::OnWorker {
            worker: worker.to_string(),
            step,
            detail: match out.stderr.trim() {
                "" => format!("exit status {}", out.status),
                s => s.to_string(),
            },
        });
    }
    Ok(out.stdout)
}

/// `git <args> <the worker's repository at bare> <refspec>` in the local repository at
/// `origin`, git's transport running the worker's own `ssh` ([`super::ssh::Ssh::git_ssh_command`]).
async fn over_ssh(
    origin: &Path,
    remote: &Remote,
    args: &[&str],
    bare: &str,
    refspec: &str,
) -> Result<(), GitError> {
    Repo::at(origin)
        .cmd(args)
        .arg(OsStr::new(&url(remote, bare)))
        .arg(OsStr::new(refspec))
        .env("GIT_SSH_COMMAND", OsStr::new(&remote.ssh.git_ssh_command()))
        .env("GIT_SSH_VARIANT", OsStr::new("ssh"))
        .ok()
        .await
        .map(drop)
}

/// `git <OVERRIDES> <args>` as argv for the worker.
fn git_argv<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut argv = vec!["git"];
    argv.extend(OVERRIDES);
    argv.extend_from_slice(args);
    argv
}

/// `argv` run with `dir` as its working directory (`cd` first; the directory is the one the
/// gateway made).
fn in_dir<'a>(dir: &'a str, argv: &[&'a str]) -> Vec<&'a str> {
    let mut out = vec![
        "sh",
        "-c",
        "cd -- \"$1\" && shift && exec \"$@\"",
        "sh",
        dir,
    ];
    out.extend_from_slice(argv);
    out
}

/// [`OVERRIDES`] as `GIT_CONFIG_COUNT`/`GIT_CONFIG_KEY_<n>`/`GIT_CONFIG_VALUE_<n>`
/// assignments for `env`: every git a script runs gets them.
fn config_env() -> Vec<String> {
    let pairs: Vec<(&str, &str)> = OVERRIDES
        .chunks(2)
        .filter_map(|c| c.get(1)?.split_once('='))
        .collect();
    let mut out = vec![format!("GIT_CONFIG_COUNT={}", pairs.len())];
    for (i, (key, value)) in pairs.iter().enumerate() {
        out.push(format!("GIT_CONFIG_KEY_{i}={key}"));
        out.push(format!("GIT_CONFIG_VALUE_{i}={value}"));
    }
    out
}

/// git's address of the worker's repository at `path` (scp-like: `<destination>:<path>`, a
/// relative path being relative to the ssh login's home).
fn url(remote: &Remote, path: &str) -> String {
    format!("{}:{path}", remote.ssh.destination())
}

/// A name for the origin repository on workers: its directory's name (made safe) and a hash
/// of its full path, so two checkouts of the same name do not share a repository.
fn repository_name(origin: &Path) -> String {
    let base: String = origin
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
        .chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '_' | '.' => c,
            _ => '_',
        })
        .take(40)
        .collect();
    // FNV-1a: stable across builds and platforms (the name must be the same at every start).
    let hash = origin
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
        });
    let base = base.trim_start_matches('.');
    format!(
        "{}-{hash:016x}",
        if base.is_empty() { "repo" } else { base }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repository_names_are_safe_stable_and_distinct() {
        let a = repository_name(Path::new("/home/me/src/app"));
        assert_eq!(a, repository_name(Path::new("/home/me/src/app")));
        assert!(a.starts_with("app-"), "{a}");
        assert_ne!(a, repository_name(Path::new("/home/you/src/app")));
        let odd = repository_name(Path::new("/x/../.. it's $(odd)"));
        assert!(
            odd.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)),
            "{odd}"
        );
        assert!(!odd.starts_with('.'), "{odd}");
    }

    /// Only a full hex object id is taken as the commit fetched back.
    #[test]
    fn only_object_ids_are_commits() {
        assert!(is_object_id(&"a".repeat(40)));
        assert!(is_object_id(&"0123456789abcdef".repeat(4)));
        assert!(!is_object_id("--output=/tmp/x"));
        assert!(!is_object_id(&"g".repeat(40)));
        assert!(!is_object_id("abc"));
    }

    /// Every override reaches the worker's git as a config variable pair.
    #[test]
    fn overrides_become_config_variables() {
        let vars = config_env();
        assert_eq!(vars[0], format!("GIT_CONFIG_COUNT={}", OVERRIDES.len() / 2));
        assert!(vars.contains(&"GIT_CONFIG_KEY_0=core.hooksPath".to_string()));
        assert!(vars.contains(&"GIT_CONFIG_VALUE_0=/dev/null".to_string()));
    }
}

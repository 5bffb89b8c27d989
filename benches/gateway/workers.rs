//! Scenario `workers`: what moving a task's work to a worker and back costs, against plain git
//! over the same ssh in the same run. The worker is a real `sshd` on 127.0.0.1 (the tests'
//! [`Sshd`]), so the figures are git's and ssh's work without a network's latency.
//!
//! The gateway's side shares one ssh connection per worker (as a serving gateway does); the
//! plain side is a user's own `git` and `ssh`, one connection per command.
//!
//! - **First push** of a 10,000-file repository into a worker that has never seen it: the
//!   gateway's [`repo::push`] (make the bare repository, push the base, add the task's worktree
//!   there, which checks out every file) against `git init --bare` over ssh plus `git push` of
//!   the same commit into a fresh bare repository.
//! - **Later push** of a base one changed file newer, into the same repositories: the same two
//!   sides (the gateway's again adds a worktree: a new task checks out the whole tree).
//! - **Turn end to diff readable**: three files changed in the task's worktree there, then the
//!   gateway's [`repo::fetch_back`] and a local `git diff --stat` of the fetched ref, against a
//!   commit over ssh, a plain `git fetch` and the same diff.

use std::path::Path;
use std::time::Instant;

use opencode_mcp::git::{base_commit, Base};
use opencode_mcp::workers::ssh::{quote, share_connections, Ssh};
use opencode_mcp::workers::{repo, Remote};

use crate::scenarios::ms;
use crate::support::sshd::{SshKey, Sshd};
use crate::worktree::{git_in, make_repo};
use crate::BoxError;

/// What the scenario measured, per side (ms).
pub struct WorkerTimes {
    pub files: usize,
    pub first_gateway: Vec<f64>,
    pub first_plain: Vec<f64>,
    pub later_gateway: Vec<f64>,
    pub later_plain: Vec<f64>,
    pub back_gateway: Vec<f64>,
    pub back_plain: Vec<f64>,
}

/// Plain git against the worker's repository, with plain `ssh` (`-F` for the test's client
/// configuration; no shared connection, as a user's own `git push` runs).
async fn plain_git(origin: &Path, config: &str, args: &[&str]) -> Result<(), BoxError> {
    let out = tokio::process::Command::new("git")
        .arg("-C")
        .arg(origin)
        .args(args)
        .env("GIT_SSH_COMMAND", format!("ssh -F {}", quote(config)))
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .await?;
    if !out.status.success() {
        return Err(format!("git {args:?}: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(())
}

/// A plain `git push` of `commit` to branch `branch` of the repository at `url`.
async fn plain_push(
    origin: &Path,
    config: &str,
    url: &str,
    commit: &str,
    branch: &str,
) -> Result<(), BoxError> {
    let refspec = format!("{commit}:refs/heads/{branch}");
    plain_git(origin, config, &["push", "--quiet", url, &refspec]).await
}

/// Runs both sides of a measurement one after the other, the gateway's first when
/// `gateway_first` (the order alternates between rounds), and returns (gateway's, plain's).
async fn in_turn<A, B>(
    gateway_first: bool,
    gateway: impl std::future::Future<Output = Result<A, BoxError>>,
    plain: impl std::future::Future<Output = Result<B, BoxError>>,
) -> Result<(A, B), BoxError> {
    if gateway_first {
        let a = gateway.await?;
        Ok((a, plain.await?))
    } else {
        let b = plain.await?;
        Ok((gateway.await?, b))
    }
}

/// `argv` on the worker with plain `ssh` (the baseline side).
async fn on_worker(config: &str, argv: &[&str]) -> Result<(), BoxError> {
    let line: Vec<String> = argv.iter().map(|a| quote(a)).collect();
    let out = tokio::process::Command::new("ssh")
        .args(["-F", config, "-o", "BatchMode=yes", "bench"])
        .arg(line.join(" "))
        .output()
        .await?;
    if !out.status.success() {
        return Err(format!(
            "{argv:?} on the worker: {}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(())
}

/// Runs the scenario: `reps` rounds, each on fresh repositories, alternating which side goes
/// first.
pub async fn worker_moves(files: usize, reps: usize) -> Result<WorkerTimes, BoxError> {
    let tmp = tempfile::tempdir()?;
    let local = tmp.path().join("repo");
    std::fs::create_dir_all(&local)?;
    make_repo(&local, files).await?;
    let scratch = tmp.path().join("scratch");
    std::fs::create_dir_all(&scratch)?;
    let (origin, base) = base_commit(&local, &scratch, "bench", Base::WorkingTree).await?;
    // The later base: one more file changed.
    std::fs::write(
        local.join("d002/f00200.txt"),
        "changed for the later push\n",
    )?;
    let (_, later) = base_commit(&local, &scratch, "bench-later", Base::WorkingTree).await?;

    // The gateway's side shares one connection per worker, as a serving gateway does.
    share_connections();
    let key = SshKey::new();
    let worker = Sshd::start("bench", &key);
    let config = key.config_file().display().to_string();
    let ssh = Ssh::new("bench", Some(&config));
    let mut out = WorkerTimes {
        files,
        first_gateway: Vec::new(),
        first_plain: Vec::new(),
        later_gateway: Vec::new(),
        later_plain: Vec::new(),
        back_gateway: Vec::new(),
        back_plain: Vec::new(),
    };
    for r in 0..reps {
        let root = worker.root.join(format!("r{r}"));
        let remote = Remote {
            ssh: ssh.clone(),
            opencode: "opencode".into(),
            root: root.display().to_string(),
        };
        let plain_bare = root.join("plain.git").display().to_string();
        let plain_url = format!("bench:{plain_bare}");
        let gateway_first = async {
            let t = Instant::now();
            let placed = repo::push("bench", &remote, &origin, &format!("t{r}a"), &base).await?;
            Ok::<_, BoxError>((ms(t.elapsed()), placed))
        };
        let plain_first = async {
            let t = Instant::now();
            on_worker(&config, &["git", "init", "--bare", "--quiet", &plain_bare]).await?;
            plain_push(&origin, &config, &plain_url, &base, "b").await?;
            Ok::<_, BoxError>(ms(t.elapsed()))
        };
        let ((g, placed), p) = in_turn(r % 2 == 0, gateway_first, plain_first).await?;
        out.first_gateway.push(g);
        out.first_plain.push(p);

        let gateway_later = async {
            let t = Instant::now();
            repo::push("bench", &remote, &origin, &format!("t{r}b"), &later).await?;
            Ok::<_, BoxError>(ms(t.elapsed()))
        };
        let plain_later = async {
            let t = Instant::now();
            plain_push(&origin, &config, &plain_url, &later, "c").await?;
            Ok::<_, BoxError>(ms(t.elapsed()))
        };
        let (g, p) = in_turn(r % 2 == 0, gateway_later, plain_later).await?;
        out.later_gateway.push(g);
        out.later_plain.push(p);

        // An agent's turn changed three files in the task's worktree there.
        let there = Path::new(&placed.worktree);
        for f in ["d000/f00001.txt", "d003/f00300.txt", "new-by-agent.txt"] {
            std::fs::write(there.join(f), format!("the agent wrote {f}\n"))?;
        }
        let t = Instant::now();
        repo::fetch_back("bench", &remote, &origin, &placed, "turn 1").await?;
        git_in(
            &local,
            &[
                "diff",
                "--stat",
                &base,
                &format!("{}{}", repo::REMOTE_REF_PREFIX, format_args!("t{r}a")),
            ],
        )
        .await?;
        out.back_gateway.push(ms(t.elapsed()));
        // The same by hand on the plain side: a commit there, a fetch, the diff.
        let plain_wt = root.join("plain-wt").display().to_string();
        on_worker(
            &config,
            &[
                "git",
                "-C",
                &plain_bare,
                "worktree",
                "add",
                "-q",
                &plain_wt,
                "b",
            ],
        )
        .await?;
        for f in ["d000/f00001.txt", "d003/f00300.txt", "new-by-agent.txt"] {
            std::fs::write(Path::new(&plain_wt).join(f), format!("by hand {f}\n"))?;
        }
        let t = Instant::now();
        on_worker(
            &config,
            &[
                "sh",
                "-c",
                "cd \"$1\" && git add -A && git -c user.name=b -c user.email=b@b commit -q -m x",
                "sh",
                &plain_wt,
            ],
        )
        .await?;
        plain_git(
            &origin,
            &config,
            &[
                "fetch",
                "--quiet",
                &plain_url,
                "+refs/heads/b:refs/bench/plain",
            ],
        )
        .await?;
        git_in(&local, &["diff", "--stat", &base, "refs/bench/plain"]).await?;
        out.back_plain.push(ms(t.elapsed()));
    }
    Ok(out)
}

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

use serde_json::json;

use crate::gw::Gw;
use crate::scenarios::ms;
use crate::support::fake_llm::FakeLlm;
use crate::support::isolation::OpenCodeEnv;
use crate::support::mcp::Launch as Spawn;
use crate::support::opencode_bin::opencode_bin;
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
    let (origin, base) = base_commit(&local, &scratch, Base::WorkingTree).await?;
    // The later base: one more file changed.
    std::fs::write(
        local.join("d002/f00200.txt"),
        "changed for the later push\n",
    )?;
    let (_, later) = base_commit(&local, &scratch, Base::WorkingTree).await?;

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
        let commit = repo::fetch_back("bench", &remote, &origin, &placed, "turn 1").await?;
        repo::keep_fetched(&origin, &placed, Some(&commit)).await?;
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

/// What the fan-out row measured: wall time (ms) from the first start to every task finished,
/// with the tasks over three workers and with all of them on one.
pub struct FanoutTimes {
    pub tasks: usize,
    pub slots: u32,
    /// Seconds each task's agent sleeps.
    pub work_secs: u64,
    pub three: Vec<f64>,
    pub one: Vec<f64>,
    /// `start_task` answered (ms), in the same gateway, in turn: a worktree task placed on a
    /// worker (its OpenCode already running), a worktree task on this machine, and a task
    /// working in place here (isolation `none`), the baseline.
    pub start_remote: Vec<f64>,
    pub start_local: Vec<f64>,
    pub start_none: Vec<f64>,
    /// From the first start until every task of the round runs (or is done) (ms).
    pub running_three: Vec<f64>,
    pub running_one: Vec<f64>,
    /// CPU time (s) the workers' OpenCode processes used during each round, per task, and the
    /// busiest one's share of a core over the round: OpenCode is one JavaScript thread, so a
    /// side whose work is bound by it cannot go faster than one core.
    pub opencode_cpu_three: Vec<f64>,
    pub opencode_cpu_one: Vec<f64>,
    pub busiest_three: Vec<f64>,
    pub busiest_one: Vec<f64>,
}

/// **A fan-out of `tasks` across three workers against the same tasks on one**, through the
/// real gateway: three real `sshd` workers on 127.0.0.1, each with `slots` slots and its own
/// OpenCode (started by the gateway on first use, before the clock), the queue on; each task's
/// agent runs `sleep <work_secs>` (a build or a test run standing in: wall time, not this
/// machine's two cores). On one worker the tasks beyond its slots queue and run in waves; over
/// three they run side by side. `reps` rounds, the two sides alternating.
///
/// Each worktree task also costs its worker's OpenCode about 4 s of CPU (the new directory's
/// instance), which the stand-in workers take from the same two cores. With `sleep 5` that
/// CPU, not the sleep, bounds both sides; a longer sleep shows how the placement scales when
/// the work is what takes the time, as on separate machines.
pub async fn worker_fanout(
    tasks: usize,
    slots: u32,
    reps: usize,
    work_secs: u64,
) -> Result<FanoutTimes, BoxError> {
    let fake = FakeLlm::start();
    let env = OpenCodeEnv::new();
    let repo = env.work_dir();
    git_in(&repo, &["init", "-q", "-b", "main"]).await?;
    std::fs::write(repo.join("app.txt"), "one\n")?;
    git_in(&repo, &["add", "-A"]).await?;
    git_in(
        &repo,
        &[
            "-c",
            "user.name=b",
            "-c",
            "user.email=b@b",
            "commit",
            "-q",
            "-m",
            "x",
        ],
    )
    .await?;
    let key = SshKey::new();
    let names = ["f1", "f2", "f3"];
    let mut workers = Vec::new();
    let mut homes = Vec::new();
    let mut file = String::from("workers:\n");
    for name in names {
        let worker = Sshd::start(name, &key);
        let home = OpenCodeEnv::new();
        let wrapper = worker
            .opencode_setup(&home, &fake.url())
            .display()
            .to_string();
        file.push_str(&format!(
            "  {name}:\n    ssh: {name}\n    ssh_config: {}\n    max_tasks: {slots}\n    opencode: {wrapper}\n    root: {}\n",
            key.config_file().display(),
            worker.root.join("mcp").display()
        ));
        workers.push(worker);
        homes.push(home);
    }
    let user_file = env.root().join("user-delegation.yaml");
    std::fs::write(&user_file, file)?;
    let launch = Spawn::new(env.work_dir(), &env.home_dir())
        .bin(crate::gateway_bin())
        .envs(env.vars(&fake.url()))
        .env("OPENCODE_MCP_OPENCODE__COMMAND", opencode_bin())
        .env("OPENCODE_MCP_CONFIG", &user_file)
        .env("OPENCODE_MCP_LIMITS__QUEUE", "1000")
        .env("OPENCODE_MCP_LIMITS__MAX_WAIT_IDS", "1000")
        // BENCH_GATEWAY_LOG (a level or filter, as `OPENCODE_MCP_LOG`) and BENCH_GATEWAY_STDERR
        // (a file the gateway's log is written to at the end): what a start spent its time on.
        .env(
            "OPENCODE_MCP_LOG",
            std::env::var("BENCH_GATEWAY_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .unchecked();
    let client = launch.connect().await?;
    let started = client.call_ok("opencode_start_server", json!({})).await?;
    let server_id = started["server_id"]
        .as_str()
        .ok_or("start_server without server_id")?
        .to_string();
    let gw = Gw {
        pid: client.pid().unwrap_or(0),
        client,
        server_id,
    };
    let start = |prompt: String, worker: &'static str| {
        let gw = &gw;
        async move {
            // `none`: this machine, in place (the baseline of a start's answer).
            let args = match worker {
                "none" => json!({ "server_id": gw.server_id, "prompt": prompt }),
                _ => json!({
                    "server_id": gw.server_id,
                    "prompt": prompt,
                    "worker": worker,
                    "isolation": "worktree",
                }),
            };
            let v = gw.ok("opencode_start_task", args).await?;
            v["task_id"]
                .as_str()
                .map(String::from)
                .ok_or_else(|| BoxError::from(format!("start_task without task_id: {v}")))
        }
    };
    // Every worker's OpenCode started (and its repository pushed once) before the clock.
    let mut warm = Vec::new();
    for name in names {
        warm.push(start(format!("warm up {name}"), name).await?);
    }
    gw.wait_all(&warm, std::time::Duration::from_secs(120))
        .await?;
    let mut out = FanoutTimes {
        tasks,
        slots,
        work_secs,
        three: Vec::new(),
        one: Vec::new(),
        start_remote: Vec::new(),
        start_local: Vec::new(),
        start_none: Vec::new(),
        running_three: Vec::new(),
        running_one: Vec::new(),
        opencode_cpu_three: Vec::new(),
        opencode_cpu_one: Vec::new(),
        busiest_three: Vec::new(),
        busiest_one: Vec::new(),
    };
    // The workers' OpenCode processes: each started by the gateway through its wrapper, which
    // exports that worker's isolated `HOME`.
    let opencodes: Vec<u32> = crate::support::procs::all()
        .into_iter()
        .filter(|p| p.comm == "opencode" && p.is_live())
        .filter(|p| {
            crate::support::procs::env_var(p.pid, "HOME")
                .is_some_and(|h| homes.iter().any(|home| Path::new(&h) == home.home_dir()))
        })
        .map(|p| p.pid)
        .collect();
    if opencodes.len() != names.len() {
        return Err(format!(
            "found {} worker OpenCode processes, expected {}",
            opencodes.len(),
            names.len()
        )
        .into());
    }
    // Each one's CPU seconds so far; an OpenCode that is gone fails the round rather than
    // counting as having used nothing.
    let cpu = || -> Result<Vec<f64>, BoxError> {
        opencodes
            .iter()
            .map(|pid| {
                crate::machine::cpu_seconds(*pid)
                    .ok_or_else(|| format!("worker OpenCode {pid} is gone").into())
            })
            .collect()
    };
    // One start at a time, the three kinds in turn (the order rotating each round): what a
    // host waits for a task id.
    let mut started = Vec::new();
    for i in 0..reps * 12 {
        let kind = (i + i / 3) % 3;
        let worker = [names[0], "local", "none"][kind];
        let t = Instant::now();
        started.push(start(format!("quick {i}"), worker).await?);
        let took = ms(t.elapsed());
        [
            &mut out.start_remote,
            &mut out.start_local,
            &mut out.start_none,
        ][kind]
            .push(took);
    }
    gw.wait_all(&started, std::time::Duration::from_secs(120))
        .await?;
    for r in 0..reps * 2 {
        let spread = (r % 2 == 0) == (r / 2 % 2 == 0);
        let cpu_before = cpu()?;
        let t = Instant::now();
        let mut ids = Vec::with_capacity(tasks);
        for i in 0..tasks {
            let worker = if spread {
                names[i % names.len()]
            } else {
                names[0]
            };
            ids.push(start(format!("fan {r}.{i} [[bash:sleep {work_secs}]]"), worker).await?);
        }
        // Every task past `pending` (running, or already done); on one worker, those past its
        // slots wait in the queue, so this is when the last wave begins.
        loop {
            let listed = gw
                .ok("opencode_list_tasks", json!({ "limit": 200 }))
                .await?;
            let waiting = listed["tasks"].as_array().map_or(0, |tasks| {
                tasks
                    .iter()
                    .filter(|t| ids.iter().any(|id| t["task_id"] == id.as_str()))
                    .filter(|t| ["pending", "queued"].contains(&t["status"].as_str().unwrap_or("")))
                    .count()
            });
            if waiting == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let running = ms(t.elapsed());
        gw.wait_all(&ids, std::time::Duration::from_secs(600 + 6 * work_secs))
            .await?;
        let took = ms(t.elapsed());
        let used: Vec<f64> = cpu()?
            .iter()
            .zip(&cpu_before)
            .map(|(after, before)| after - before)
            .collect();
        let per_task = used.iter().sum::<f64>() / tasks as f64;
        let busiest = used.iter().copied().fold(0.0, f64::max) / (took / 1000.0);
        if spread {
            out.three.push(took);
            out.running_three.push(running);
            out.opencode_cpu_three.push(per_task);
            out.busiest_three.push(busiest);
        } else {
            out.one.push(took);
            out.running_one.push(running);
            out.opencode_cpu_one.push(per_task);
            out.busiest_one.push(busiest);
        }
    }
    if let Ok(file) = std::env::var("BENCH_GATEWAY_STDERR") {
        std::fs::write(file, gw.client.stderr())?;
    }
    gw.client.close().await?;
    drop(homes);
    drop(workers);
    Ok(out)
}

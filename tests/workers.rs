//! Workers (`workers:` in the user's delegation.yaml): real OpenSSH servers on 127.0.0.1 stand
//! for the machines ([`support::sshd`]), each with its own home and root directory, reached with
//! a key made for the test through an ssh client configuration of the test's own
//! (`workers.<name>.ssh_config`), never the user's `~/.ssh`.

mod support;

use std::process::{Command, Output, Stdio};

use serde_json::Value;
use support::sshd::{SshKey, Sshd};
use support::{opencode_bin, pinned_version, FakeLlm, OpenCodeEnv};

/// Runs `opencode-mcp <args>` in `env` with `user` as the user's own file (`--config`).
fn run(env: &OpenCodeEnv, user: &str, args: &[&str]) -> Output {
    run_with(env, user, args, &[])
}

/// [`run`] with more environment (`OPENCODE_MCP_*` settings).
fn run_with(env: &OpenCodeEnv, user: &str, args: &[&str], vars: &[(&str, String)]) -> Output {
    let fake = FakeLlm::start();
    let file = env.root().join("user-delegation.yaml");
    std::fs::write(&file, user).expect("write the user's file");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_opencode-mcp"));
    env.apply(&mut cmd, &fake.url())
        .arg("--config")
        .arg(&file)
        .args(args)
        .envs(vars.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null());
    cmd.output().expect("run opencode-mcp")
}

fn describe(o: &Output) -> String {
    format!(
        "exit {}\n--- stdout ---\n{}--- stderr ---\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A worker entry of the user's file for `sshd`.
fn entry(sshd: &Sshd, key: &SshKey, opencode: &str, root: &str, slots: u32) -> String {
    format!(
        "  {name}:\n    ssh: {name}\n    ssh_config: {config}\n    max_tasks: {slots}\n    opencode: {opencode}\n    root: {root}\n",
        name = sshd.name,
        config = key.config_file().display(),
    )
}

/// `opencode-mcp workers` names each worker with its slots and what its probe found: a ready
/// one (git, the pinned OpenCode, its root made), one whose sshd is gone, and one without
/// OpenCode whose root cannot be made; it exits non-zero while one is not ready.
#[test]
fn workers_are_listed_with_their_slots_and_health() {
    let env = OpenCodeEnv::new();
    let key = SshKey::new();
    let ready = Sshd::start("ready", &key);
    let mut gone = Sshd::start("gone", &key);
    gone.stop();
    let lacking = Sshd::start("lacking", &key);
    let blocker = lacking.root.join("a-file");
    std::fs::write(&blocker, "not a directory").expect("write a file");
    let bin = opencode_bin().display().to_string();
    let ready_root = ready.root.join("fresh");
    let user = format!(
        "workers:\n  local:\n    max_tasks: 3\n{}{}{}",
        entry(&ready, &key, &bin, &ready_root.display().to_string(), 4),
        entry(&gone, &key, &bin, "/tmp", 2),
        entry(
            &lacking,
            &key,
            "no-such-opencode",
            &blocker.join("root").display().to_string(),
            1
        ),
    );
    let out = run(&env, &user, &["workers", "--json"]);
    assert!(
        !out.status.success(),
        "two workers are not ready: {}",
        describe(&out)
    );
    let listed: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("JSON ({e}): {}", describe(&out)));
    let by_name = |name: &str| {
        listed
            .as_array()
            .and_then(|a| a.iter().find(|w| w["name"] == name))
            .cloned()
            .unwrap_or_else(|| panic!("no worker {name}: {listed}"))
    };
    assert_eq!(listed[0]["name"], "local", "this machine first: {listed}");
    assert_eq!(by_name("local")["max_tasks"], 3);

    let w = by_name("ready");
    assert_eq!(w["max_tasks"], 4);
    assert_eq!(w["health"]["reachable"], true, "{w}");
    assert_eq!(w["health"]["opencode"], pinned_version(), "{w}");
    assert!(
        w["health"]["git"]
            .as_str()
            .is_some_and(|g| g.starts_with("git version")),
        "{w}"
    );
    assert_eq!(w["problems"], serde_json::json!([]), "{w}");
    assert!(ready_root.is_dir(), "the probe made the worker's root");
    assert!(
        ready.log().contains("Accepted publickey"),
        "the worker's sshd saw the test key: {}",
        ready.log()
    );

    let w = by_name("gone");
    assert_eq!(w["health"]["reachable"], false, "{w}");
    let problem = w["problems"][0]["problem"].as_str().unwrap_or_default();
    assert!(problem.contains("ssh cannot reach gone"), "{w}");
    assert!(
        w["problems"][0]["fix"]
            .as_str()
            .is_some_and(|f| f.contains("BatchMode=yes")),
        "{w}"
    );

    let w = by_name("lacking");
    assert_eq!(w["health"]["reachable"], true, "{w}");
    let problems = w["problems"].to_string();
    assert!(
        problems.contains("`no-such-opencode` does not run there"),
        "{w}"
    );
    assert!(problems.contains("cannot be written"), "{w}");

    // The same as text: one line per worker, then each problem and its fix.
    let out = run(&env, &user, &["workers"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let line = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no line for {name}:\n{text}"))
            .to_string()
    };
    assert!(line("ready").contains("ready (git version"), "{text}");
    assert!(line("gone").contains("unreachable"), "{text}");
    assert!(line("lacking").contains("not ready"), "{text}");
    assert!(text.contains("fix: install OpenCode on lacking"), "{text}");
}

/// A repository's delegation.yaml cannot add a worker: the gateway never connects to it, and
/// `check-config` names the setting it did not apply.
#[test]
fn a_repository_file_cannot_add_a_worker() {
    let env = OpenCodeEnv::new();
    let key = SshKey::new();
    let target = Sshd::start("target", &key);
    let repo = format!("workers:\n{}", entry(&target, &key, "opencode", "/tmp", 8));
    std::fs::write(env.work_dir().join("delegation.yaml"), repo).expect("write the repo file");
    let out = run(&env, "{}\n", &["workers", "--json"]);
    assert!(out.status.success(), "{}", describe(&out));
    let listed: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let names: Vec<&str> = listed
        .as_array()
        .map(|a| a.iter().filter_map(|w| w["name"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(names, ["local"], "{listed}");
    assert!(
        !target.log().contains("Accepted publickey"),
        "nothing connected to the repository's worker: {}",
        target.log()
    );
    let out = run(&env, "{}\n", &["check-config"]);
    assert!(!out.status.success(), "{}", describe(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("workers"), "{stderr}");
    assert!(
        stderr.contains("which machines your code is sent to"),
        "{stderr}"
    );
}

/// `opencode-mcp doctor` checks each worker: a ready one passes (with its OpenCode release and
/// slots) and gets its own OpenCode started there to check its providers against the tiers
/// (one tier it cannot serve is a warning); one that ssh cannot reach is a blocker with its fix.
#[test]
fn doctor_checks_each_worker() {
    let env = OpenCodeEnv::new();
    let key = SshKey::new();
    let ready = Sshd::start("ready", &key);
    let mut gone = Sshd::start("gone", &key);
    gone.stop();
    let bin = opencode_bin().display().to_string();
    let worker_fake = FakeLlm::start();
    let there = worker_opencode(&ready, &env, &worker_fake.url());
    let user = format!(
        "tiers:\n  - name: fast\n    handles: small things\n    models: [fake/fake-model]\n  - name: rare\n    handles: nothing\n    models: [nowhere/absent-model]\nworkers:\n{}{}",
        entry(&ready, &key, &there.display().to_string(), &ready.root.display().to_string(), 2),
        entry(&gone, &key, &bin, "/tmp", 2) + "    sandbox: off\n",
    );
    let out = run_with(
        &env,
        &user,
        &["doctor"],
        &[("OPENCODE_MCP_OPENCODE__COMMAND", bin.clone())],
    );
    assert!(
        !out.status.success(),
        "a worker is down: {}",
        describe(&out)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let line = |name: &str| {
        text.lines()
            .find(|l| l.contains(&format!(" worker {name}:")))
            .unwrap_or_else(|| panic!("no check for worker {name}:\n{text}"))
            .to_string()
    };
    let ok = line("ready");
    assert!(ok.starts_with("ok"), "{text}");
    assert!(
        ok.contains(&format!("opencode {}", pinned_version())),
        "{text}"
    );
    assert!(ok.contains("2 slots"), "{text}");
    assert!(ok.contains("agents confined (bubblewrap there)"), "{text}");
    // Its own OpenCode was started there for the check: it offers the fake models, which serve
    // tier fast and not tier rare.
    let providers = line("ready providers");
    assert!(providers.starts_with("warn"), "{text}");
    assert!(providers.contains("cannot serve tier(s) rare"), "{text}");
    let down = line("gone");
    assert!(down.starts_with("FAIL"), "{text}");
    assert!(down.contains("ssh cannot reach gone"), "{text}");
    assert!(text.contains("ssh -o BatchMode=yes gone true"), "{text}");
    // The user let one worker's agents run unconfined: the sandbox line says so, naming it
    // alone (the other's are confined there).
    let sandbox = text
        .lines()
        .find(|l| l.contains(" sandbox:"))
        .unwrap_or_else(|| panic!("no sandbox line:\n{text}"));
    assert!(
        sandbox.starts_with("warn")
            && sandbox.contains("workers gone run unconfined")
            && !sandbox.contains("ready"),
        "{text}"
    );
}

/// Reads a file of the worker's (the test sees its disk, as the worker's own shell would).
fn read(path: &std::path::Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// **The work goes to a worker and comes back with git over ssh.** The base (HEAD plus the
/// uncommitted and untracked work) is pushed into the worker's bare repository and a worktree
/// made there on the task's branch; what the agent then does there (an edit, a new file, a
/// deletion) comes back as the gateway's own ref, with no branch of the user's written; a
/// `.git` file the agent rewrote to point at a repository of its own, whose filter would run a
/// command, runs nothing; a discard leaves nothing on the worker. An unreachable worker is an
/// error naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_goes_to_a_worker_and_back_with_git() {
    use opencode_mcp::git::{base_commit, Base};
    use opencode_mcp::workers::{repo, ssh::Ssh, Remote};
    use support::git::{git, init_repo};

    // As a serving gateway does: the steps share one connection (git's transport too).
    opencode_mcp::workers::ssh::share_connections();
    let key = SshKey::new();
    let worker = Sshd::start("w1", &key);
    let remote = Remote {
        ssh: Ssh::new("w1", Some(&key.config_file().display().to_string())),
        opencode: "opencode".into(),
        root: worker.root.display().to_string(),
    };
    let local = tempfile::tempdir().expect("temp dir");
    let repo_dir = local.path().join("app");
    init_repo(
        &repo_dir,
        &[("src/lib.rs", "fn a() {}\n"), ("README", "hello\n")],
    );
    std::fs::write(repo_dir.join("src/lib.rs"), "fn a() {}\nfn b() {}\n").expect("edit");
    std::fs::write(repo_dir.join("notes.txt"), "untracked\n").expect("untracked");
    let status_before = git(&repo_dir, &["status", "--porcelain"]);
    let scratch = local.path().join("scratch");
    std::fs::create_dir_all(&scratch).expect("scratch");
    let (origin, base) = base_commit(&repo_dir, &scratch, Base::WorkingTree)
        .await
        .expect("the base commit");

    let placed = repo::push("w1", &remote, &origin, "tsk_one", &base)
        .await
        .expect("pushed to the worker");
    let there = std::path::PathBuf::from(&placed.worktree);
    assert!(there.starts_with(&worker.root), "{placed:?}");
    assert_eq!(read(&there.join("src/lib.rs")), "fn a() {}\nfn b() {}\n");
    assert_eq!(read(&there.join("notes.txt")), "untracked\n");

    // The agent's work on the worker, and a planted `.git` pointing at a repository whose
    // filter driver would create `marker` if git ever followed it.
    std::fs::write(there.join("README"), "hello, worker\n").expect("edit there");
    std::fs::remove_file(there.join("notes.txt")).expect("delete there");
    std::fs::create_dir_all(there.join("docs")).expect("mkdir there");
    std::fs::write(there.join("docs/plan.md"), "# plan\n").expect("add there");
    let evil = worker.root.join("evil");
    git(&worker.root, &["init", "-q", "evil"]);
    let marker = worker.root.join("marker");
    git(
        &evil,
        &[
            "config",
            "filter.x.clean",
            &format!("touch {} && cat", marker.display()),
        ],
    );
    std::fs::write(there.join(".gitattributes"), "* filter=x\n").expect("attributes");
    std::fs::write(
        there.join(".git"),
        format!("gitdir: {}\n", evil.join(".git").display()),
    )
    .expect("plant .git");

    let commit = repo::fetch_back("w1", &remote, &origin, &placed, "turn 1 of tsk_one")
        .await
        .expect("fetched back");
    repo::keep_fetched(&origin, &placed, Some(&commit))
        .await
        .expect("kept in the task's ref");
    assert!(
        !marker.exists(),
        "the planted repository's filter never ran"
    );
    let fetched = git(
        &repo_dir,
        &["rev-parse", "refs/opencode-mcp/remote/tsk_one"],
    );
    assert_eq!(fetched.trim(), commit);
    let changed = git(
        &repo_dir,
        &[
            "diff",
            "--name-status",
            &base,
            "refs/opencode-mcp/remote/tsk_one",
        ],
    );
    for line in [
        "M\tREADME",
        "D\tnotes.txt",
        "A\tdocs/plan.md",
        "A\t.gitattributes",
    ] {
        assert!(changed.lines().any(|l| l == line), "{line} in:\n{changed}");
    }
    assert!(!changed.contains(".git\n"), "{changed}");
    assert_eq!(
        git(&repo_dir, &["branch", "--format=%(refname:short)"]).trim(),
        "main",
        "no branch of the user's was written"
    );
    assert_eq!(
        git(&repo_dir, &["status", "--porcelain"]),
        status_before,
        "the user's files and index are as they were"
    );

    // A later push of the same origin goes to the same repository.
    let second = repo::push("w1", &remote, &origin, "tsk_two", &base)
        .await
        .expect("a second task");
    assert_eq!(second.bare, placed.bare);

    repo::discard("w1", &remote, &origin, &placed)
        .await
        .expect("discarded");
    assert!(!there.exists(), "the worktree left the worker");
    let branches = git(
        std::path::Path::new(&placed.bare),
        &["branch", "--format=%(refname:short)"],
    );
    assert!(!branches.contains("opencode-mcp/tsk_one"), "{branches}");
    assert!(branches.contains("opencode-mcp/tsk_two"), "{branches}");
    let refs = git(&repo_dir, &["for-each-ref", "refs/opencode-mcp/"]);
    assert!(!refs.contains("tsk_one"), "{refs}");

    let mut gone = Sshd::start("w2", &key);
    gone.stop();
    let unreachable = Remote {
        ssh: Ssh::new("w2", Some(&key.config_file().display().to_string())),
        opencode: "opencode".into(),
        root: "/tmp".into(),
    };
    let err = repo::push("w2", &unreachable, &origin, "tsk_three", &base)
        .await
        .expect_err("an unreachable worker");
    assert!(err.to_string().contains("ssh could not reach w2"), "{err}");
}

/// Kills a process when dropped (if it still runs).
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(pid) = libc::pid_t::try_from(self.0) {
            if pid > 1 {
                // SAFETY: kill(2) on the pid of an OpenCode this test started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

/// The worker's own OpenCode setup ([`Sshd::opencode_setup`]).
fn worker_opencode(worker: &Sshd, env: &OpenCodeEnv, fake_url: &str) -> std::path::PathBuf {
    worker.opencode_setup(env, fake_url)
}

/// **OpenCode on a worker, behind the session's forward.** Started over ssh on the worker's
/// loopback with a password of its own (sent on stdin: on no command line of either machine),
/// with the worker's own configuration (here a wrapper holding the worker's environment: its
/// home and its provider, the fake model); reached here through the forward, where it refuses
/// a request without the password and runs a turn with it; stopped on request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_runs_on_a_worker_behind_a_forward() {
    use opencode_mcp::workers::{serve::RemoteServe, ssh::Ssh, Remote};
    use support::opencode_server::encode;
    use support::{procs, FAKE_MODEL, FAKE_PROVIDER};

    let fake = FakeLlm::start();
    let env = OpenCodeEnv::new();
    let key = SshKey::new();
    let worker = Sshd::start("w1", &key);
    let wrapper = worker_opencode(&worker, &env, &fake.url());
    let remote = Remote {
        ssh: Ssh::new("w1", Some(&key.config_file().display().to_string())),
        opencode: wrapper.display().to_string(),
        root: worker.root.display().to_string(),
    };
    let project = worker.root.join("project");
    std::fs::create_dir_all(&project).expect("project dir");
    let project_dir = project.display().to_string();

    // Its bash tool's shell is the one given (here a stand-in file: the confining script is
    // `workers::sandbox`'s), through OPENCODE_CONFIG_CONTENT, beside the worker's own settings.
    let shell = worker.root.join("shell-stand-in");
    std::fs::write(&shell, "#!/bin/sh\nexec /bin/sh \"$@\"\n").expect("the stand-in shell");
    let shell = shell.display().to_string();
    let serve = RemoteServe::start(
        "w1",
        &remote,
        &project_dir,
        Some(&shell),
        std::time::Duration::from_secs(60),
    )
    .await
    .expect("OpenCode started on the worker");
    // The worker is this machine: should an assertion fail before the stop, its OpenCode (which
    // outlives a dropped ssh session by design) is killed here, not left running.
    let reaper = KillOnDrop(serve.remote_pid);
    assert!(serve.url.starts_with("http://127.0.0.1:"), "{}", serve.url);
    let listeners = procs::listeners_on(serve.remote_port);
    assert!(
        !listeners.is_empty(),
        "OpenCode listens on {}",
        serve.remote_port
    );
    assert!(
        listeners
            .iter()
            .all(|(family, addr)| family == "tcp" && addr == "0100007F"),
        "only the worker's loopback: {listeners:?}"
    );
    let everywhere: Vec<String> = procs::all()
        .into_iter()
        .filter_map(|p| std::fs::read(format!("/proc/{}/cmdline", p.pid)).ok())
        .map(|c| String::from_utf8_lossy(&c).into_owned())
        .filter(|c| c.contains(&serve.password))
        .collect();
    assert!(
        everywhere.is_empty(),
        "the password is on a command line: {everywhere:?}"
    );

    let http = reqwest::Client::new();
    let q = format!("directory={}", encode(&project_dir));
    let refused = http
        .get(format!("{}/session?{q}", serve.url))
        .send()
        .await
        .expect("a request through the forward");
    assert_eq!(refused.status(), 401, "no password, no answer");
    let session: Value = http
        .post(format!("{}/session?{q}", serve.url))
        .basic_auth("opencode", Some(&serve.password))
        .json(&serde_json::json!({}))
        .send()
        .await
        .expect("create a session")
        .json()
        .await
        .expect("a session");
    let id = session["id"].as_str().expect("session id");
    assert_eq!(session["directory"], project_dir.as_str(), "{session}");
    let api = opencode_mcp::opencode::Api::new(
        &serve.url,
        Some(&serve.password),
        std::time::Duration::from_secs(30),
    )
    .expect("client");
    assert_eq!(
        api.configured_shell(&project_dir, std::time::Duration::from_secs(30))
            .await
            .expect("its config"),
        Some(shell.clone()),
        "OpenCode there runs commands with the shell given"
    );
    let prompted = http
        .post(format!("{}/session/{id}/prompt_async?{q}", serve.url))
        .basic_auth("opencode", Some(&serve.password))
        .json(&serde_json::json!({
            "parts": [{ "type": "text", "text": "hello from the worker" }],
            "model": { "providerID": FAKE_PROVIDER, "modelID": FAKE_MODEL }
        }))
        .send()
        .await
        .expect("prompt");
    assert_eq!(prompted.status(), 204);
    fake.wait_for_request(std::time::Duration::from_secs(60), |r| {
        r.last_user_text.contains("hello from the worker")
    })
    .await;

    // Another process here holds the port a forward to it would take: the forward is refused
    // (`ExitOnForwardFailure`), never left to the squatter, which would receive the password
    // and the prompts.
    let squatter = std::net::TcpListener::bind("127.0.0.1:0").expect("a squatter");
    squatter.set_nonblocking(true).expect("nonblocking");
    let taken = squatter.local_addr().expect("addr").port();
    let refused = RemoteServe::reattach(
        "w1",
        &remote,
        &serve.saved("w1"),
        std::time::Duration::from_secs(30),
        Some(taken),
    )
    .await;
    assert!(
        refused.is_err(),
        "a forward from a port another process holds"
    );
    assert!(squatter.accept().is_err(), "the squatter was reached");

    let pid = serve.remote_pid;
    assert!(pid > 1, "the worker's OpenCode pid is known");
    let url = serve.url.clone();
    serve.stop(&remote).await;
    let gone = support::rig::poll_for(std::time::Duration::from_secs(15), || {
        (!procs::stat(pid).is_some_and(|p| p.is_live())).then_some(())
    })
    .await;
    assert!(gone.is_some(), "OpenCode on the worker stopped");
    // Stopped: its pid is no longer ours to kill.
    std::mem::forget(reaper);
    assert!(
        http.get(format!("{url}/session?{q}")).send().await.is_err(),
        "the forward is closed"
    );
}

/// Starting OpenCode on a worker fails with the reason, never hangs: an OpenCode command that
/// does not run there, and a worker ssh cannot reach.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_that_cannot_start_on_a_worker_says_why() {
    use opencode_mcp::workers::{serve::RemoteServe, ssh::Ssh, Remote};

    let key = SshKey::new();
    let worker = Sshd::start("w1", &key);
    let config = key.config_file().display().to_string();
    let root = worker.root.display().to_string();
    let remote = Remote {
        ssh: Ssh::new("w1", Some(&config)),
        opencode: "no-such-opencode".into(),
        root: root.clone(),
    };
    let within = std::time::Duration::from_secs(30);
    let err = RemoteServe::start("w1", &remote, &root, None, within)
        .await
        .expect_err("no OpenCode there");
    let said = err.to_string();
    assert!(
        said.contains("OpenCode on worker w1 did not start"),
        "{said}"
    );
    assert!(said.contains("no-such-opencode"), "{said}");

    let missing = Remote {
        opencode: opencode_bin().display().to_string(),
        ..remote.clone()
    };
    // A root that cannot be made there (a file stands in its way).
    let blocked = worker.root.join("a-file");
    std::fs::write(&blocked, "not a directory").expect("write");
    let unusable = blocked.join("root").display().to_string();
    let err = RemoteServe::start("w1", &missing, &unusable, None, within)
        .await
        .expect_err("no usable directory there");
    assert!(err.to_string().contains("did not start"), "{err}");
    // A confining shell that is not there: OpenCode would fall back to plain bash, so it is
    // not started; one that is no plain absolute path is refused before ssh.
    let gone_shell = worker.root.join("no-such-shell").display().to_string();
    let err = RemoteServe::start("w1", &missing, &root, Some(&gone_shell), within)
        .await
        .expect_err("no confining shell there");
    assert!(
        err.to_string().contains("confining shell") && err.to_string().contains("is missing"),
        "{err}"
    );
    let err = RemoteServe::start("w1", &missing, &root, Some("shell\"x"), within)
        .await
        .expect_err("not a plain absolute path");
    assert!(
        err.to_string().contains("not a plain absolute path"),
        "{err}"
    );

    let mut gone = Sshd::start("w2", &key);
    gone.stop();
    let unreachable = Remote {
        ssh: Ssh::new("w2", Some(&config)),
        ..missing
    };
    let err = RemoteServe::start("w2", &unreachable, &root, None, within)
        .await
        .expect_err("an unreachable worker");
    assert!(err.to_string().contains("ssh could not reach w2"), "{err}");
}

/// Kills, when dropped, every process whose `HOME` is `home` (a worker's OpenCode outlives the
/// ssh session it was started in, by design; a test that fails before its gateway stops it
/// must not leave it running).
struct ReapHome(std::path::PathBuf);

impl ReapHome {
    fn pids(&self) -> Vec<u32> {
        let home = self.0.display().to_string();
        support::procs::all()
            .into_iter()
            .filter(|p| p.is_live())
            .filter(|p| support::procs::env_var(p.pid, "HOME").as_deref() == Some(home.as_str()))
            .map(|p| p.pid)
            .collect()
    }

    /// Of [`Self::pids`], those whose parent is not one of them: the OpenCode servers, not
    /// what their agents run.
    fn servers(&self) -> Vec<u32> {
        let all = self.pids();
        all.iter()
            .copied()
            .filter(|pid| support::procs::stat(*pid).is_some_and(|p| !all.contains(&p.ppid)))
            .collect()
    }
}

impl Drop for ReapHome {
    fn drop(&mut self) {
        for pid in self.pids() {
            drop(KillOnDrop(pid));
        }
    }
}

/// A gateway (the tests' rig, its own managed OpenCode here) whose user's file declares one
/// worker `w1` with `slots` slots (and `local_slots` for this machine when given), the worker a
/// real `sshd` with its own OpenCode setup; the gateway's directory a repository holding
/// `files`, changed as `prepare` says before the gateway starts.
struct OneWorker {
    rig: support::rig::Rig,
    /// The worker's root (`workers.w1.root`).
    root: std::path::PathBuf,
    /// The user's delegation.yaml (`OPENCODE_MCP_CONFIG`).
    user_file: std::path::PathBuf,
    repo: std::path::PathBuf,
    reaper: ReapHome,
    _worker_env: OpenCodeEnv,
    _worker: Sshd,
    /// The ssh client configuration the gateway reaches the worker with.
    _key: SshKey,
}

impl OneWorker {
    async fn start(
        files: &[(&str, &str)],
        prepare: impl FnOnce(&std::path::Path),
        local_slots: Option<u32>,
        slots: u32,
    ) -> Self {
        Self::start_with(files, prepare, local_slots, slots, "").await
    }

    /// [`Self::start`], with `more` (lines of YAML) added to the worker's entry.
    async fn start_with(
        files: &[(&str, &str)],
        prepare: impl FnOnce(&std::path::Path),
        local_slots: Option<u32>,
        slots: u32,
        more: &str,
    ) -> Self {
        Self::start_login(files, prepare, local_slots, slots, more, None).await
    }

    /// [`Self::start_with`], the worker's sessions run through `login` (sshd's
    /// `ForceCommand`) when given.
    async fn start_login(
        files: &[(&str, &str)],
        prepare: impl FnOnce(&std::path::Path),
        local_slots: Option<u32>,
        slots: u32,
        more: &str,
        login: Option<&std::path::Path>,
    ) -> Self {
        let fake = FakeLlm::start();
        let env = OpenCodeEnv::new();
        let key = SshKey::new();
        let worker = Sshd::start_with("w1", &key, login);
        // The worker's own OpenCode setup: a home of its own, its provider the fake model.
        let worker_env = OpenCodeEnv::new();
        let reaper = ReapHome(worker_env.home_dir());
        let wrapper = worker_opencode(&worker, &worker_env, &fake.url());
        let root = worker.root.join("mcp");
        let repo = env.work_dir();
        support::git::init_repo(&repo, files);
        prepare(&repo);
        let local = local_slots
            .map(|n| format!("  local:\n    max_tasks: {n}\n"))
            .unwrap_or_default();
        let user_file = env.root().join("user-delegation.yaml");
        let w1 = entry(
            &worker,
            &key,
            &wrapper.display().to_string(),
            &root.display().to_string(),
            slots,
        );
        // The tests pass checks of their own in calls, which only the user's file allows.
        std::fs::write(
            &user_file,
            format!("checks:\n  from_calls: true\nworkers:\n{local}{w1}{more}"),
        )
        .expect("the user's file");
        let config_var = user_file.display().to_string();
        let rig =
            support::rig::Rig::start_in(fake, env, &[("OPENCODE_MCP_CONFIG", config_var.as_str())])
                .await;
        Self {
            rig,
            root,
            user_file,
            repo,
            reaper,
            _worker_env: worker_env,
            _worker: worker,
            _key: key,
        }
    }
}

/// **A task placed on a worker, end to end**, through the gateway's tools: `worker` is offered
/// (with the declared names) only because the user's file declares a remote worker; the task
/// runs in a worktree on the worker made from the user's working tree (uncommitted work
/// included), on the worker's own OpenCode and provider, while a local task runs beside it;
/// its result names the worker and lists its change, which came back with git (the diff is
/// readable here, the user's tree and branches untouched); a follow-up turn's work comes back
/// too; apply brings it into the user's files; discard cleans the worker; an unknown worker and
/// isolation `none` on a worker are refused; a clean exit stops the worker's OpenCode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_placed_on_a_worker_runs_there_and_its_work_comes_back() {
    use serde_json::json;
    use support::git::git;
    use support::rig::TASK_TIMEOUT_MS;

    // Bound last, the gateway goes first, before its worker.
    let OneWorker {
        _key,
        _worker,
        _worker_env,
        reaper,
        repo,
        user_file,
        root,
        rig,
    } = OneWorker::start(
        &[("app.txt", "one\ntwo\n"), ("README", "hello\n")],
        |repo| {
            std::fs::write(repo.join("app.txt"), "one\ntwo\nthree (uncommitted)\n").expect("edit")
        },
        Some(1),
        2,
    )
    .await;
    let status_before = git(&repo, &["status", "--porcelain"]);

    let tools = rig.client.list_tools().await.expect("tools");
    let start = tools
        .iter()
        .find(|t| t.name == "opencode_start_task")
        .expect("start_task");
    let worker_arg = &start.input_schema["properties"]["worker"];
    assert_eq!(worker_arg["enum"], json!(["local", "w1"]), "{worker_arg}");

    let (code, message) = rig
        .err(
            "opencode_start_task",
            json!({ "server_id": "default", "prompt": "x", "worker": "w9" }),
        )
        .await;
    assert_eq!(code, "invalid_argument", "{message}");
    assert!(
        message.contains("unknown worker `w9`") && message.contains("w1"),
        "{message}"
    );
    let (code, message) = rig
        .err(
            "opencode_start_task",
            json!({ "server_id": "default", "prompt": "x", "worker": "w1", "isolation": "none" }),
        )
        .await;
    assert_eq!(code, "invalid_argument", "{message}");
    assert!(message.contains("isolation `none`"), "{message}");

    // The first two tasks hold their slots until the test opens the gate.
    let (gate, held) = rig.gate();
    let remote = rig
        .start_task_with(json!({
            "prompt": format!("on the worker {held} [[write:app.txt:one\\ntwo\\nthree (uncommitted)\\nfour (worker)\\n]]"),
            "worker": "w1",
            // Runs on the worker, in its worktree: only there does app.txt hold the line.
            "checks": ["grep -q 'four (worker)' app.txt && pwd"],
        }))
        .await;
    let local = rig
        .start_task_with(json!({
            "prompt": format!("here {held} [[write:local.txt:local\\n]]"),
            "isolation": "worktree",
        }))
        .await;
    // This machine's one slot is taken: a worktree task the call places nowhere goes to the
    // worker with free slots; then every slot is taken, and a task that can only run here
    // (isolation `none`) is refused naming this machine's limit.
    let spilled = rig
        .start_task_with(json!({
            "prompt": format!("spill over {held} [[write:spill.txt:spilled\\n]]"),
            "isolation": "worktree",
        }))
        .await;
    assert_eq!(spilled["workspace"]["worker"], "w1", "{spilled}");
    let (code, message) = rig
        .err(
            "opencode_start_task",
            json!({ "server_id": rig.server_id(), "prompt": "x", "isolation": "worktree" }),
        )
        .await;
    assert_eq!(code, "limit_exceeded", "{message}");
    assert!(
        message.contains("local 1 of 1 (workers.local.max_tasks)")
            && message.contains("w1 2 of 2 (workers.w1.max_tasks)"),
        "{message}"
    );
    let (code, message) = rig
        .err(
            "opencode_start_task",
            json!({ "server_id": rig.server_id(), "prompt": "x", "isolation": "none" }),
        )
        .await;
    assert_eq!(code, "limit_exceeded", "{message}");
    assert!(
        message.contains("on this machine") && message.contains("workers.local.max_tasks is 1"),
        "{message}"
    );
    // `opencode-mcp workers` counts the slots in use; `tasks` names the worker of each task.
    let cli_command = |args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_opencode-mcp"));
        cmd.args(args).current_dir(&repo).env_clear();
        if let Some(path) = std::env::var_os("PATH") {
            cmd.env("PATH", path);
        }
        cmd.envs(rig.env.vars(&rig.fake.url()))
            .env("OPENCODE_MCP_CONFIG", &user_file);
        cmd
    };
    let cli = |args: &[&str]| cli_command(args).output().expect("the gateway binary runs");
    // `watch` on the remote task, in a terminal: it checks the session through the gateway's
    // forward, then runs `<opencode> attach` (here a stand-in that writes what it was given)
    // on the worker's directory, the password in its environment only.
    let seen = rig.env.root().join("watched.txt");
    let stand_in = rig.env.root().join("opencode-stand-in.sh");
    std::fs::write(
        &stand_in,
        format!(
            "#!/bin/sh\n{{ printf '%s\\n' \"$@\"; [ -n \"$OPENCODE_SERVER_PASSWORD\" ] && echo password-in-env; echo end; }} > '{}'\n",
            seen.display()
        ),
    )
    .expect("write the stand-in");
    std::fs::set_permissions(
        &stand_in,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let mut watch = cli_command(&["watch", remote["task_id"].as_str().unwrap_or("?")]);
    watch.env("OPENCODE_MCP_OPENCODE__COMMAND", &stand_in);
    let tmux = support::tmux::Tmux::start(&watch);
    let written = support::rig::poll_for(std::time::Duration::from_secs(30), || {
        std::fs::read_to_string(&seen)
            .ok()
            .filter(|t| t.ends_with("end\n"))
    })
    .await
    .unwrap_or_else(|| panic!("the stand-in did not run:\n{}", tmux.pane()));
    let lines: Vec<&str> = written.lines().collect();
    assert_eq!(lines.first(), Some(&"attach"), "{written}");
    assert!(
        lines
            .get(1)
            .is_some_and(|u| u.starts_with("http://127.0.0.1:")),
        "{written}"
    );
    assert_eq!(
        lines.get(5).copied(),
        remote["workspace"]["path"].as_str(),
        "--dir is the worker's directory: {written}"
    );
    assert!(written.contains("password-in-env"), "{written}");
    drop(tmux);
    let listed = cli(&["workers", "--json"]);
    let listed: Value = serde_json::from_slice(&listed.stdout)
        .unwrap_or_else(|e| panic!("workers --json: {e}\n{}", describe(&listed)));
    let in_use: Vec<(String, u64)> = listed
        .as_array()
        .expect("a list")
        .iter()
        .map(|w| {
            (
                w["name"].as_str().unwrap_or_default().to_string(),
                w["in_use"].as_u64().unwrap_or(99),
            )
        })
        .collect();
    assert_eq!(
        in_use,
        [("local".to_string(), 1), ("w1".to_string(), 2)],
        "{listed}"
    );
    let tasks = cli(&["tasks"]);
    let tasks = String::from_utf8_lossy(&tasks.stdout).into_owned();
    let spilled_line = tasks
        .lines()
        .find(|l| l.contains(spilled["task_id"].as_str().unwrap_or("?")))
        .unwrap_or_default();
    // Agents on the worker run confined there, as here: neither line says otherwise.
    assert!(spilled_line.ends_with("[on w1]"), "{tasks}");
    let local_line = tasks
        .lines()
        .find(|l| l.contains(local["task_id"].as_str().unwrap_or("?")))
        .unwrap_or_default();
    assert!(
        !local_line.contains("[on ") && !local_line.contains("[unconfined]"),
        "{tasks}"
    );
    std::fs::write(&gate, "open").expect("open the gate");
    let spilled_id = spilled["task_id"].as_str().expect("task_id").to_string();
    let remote_id = remote["task_id"].as_str().expect("task_id").to_string();
    let local_id = local["task_id"].as_str().expect("task_id").to_string();
    let ws = &remote["workspace"];
    assert_eq!(ws["worker"], "w1", "{remote}");
    let there = std::path::PathBuf::from(ws["path"].as_str().expect("path"));
    assert!(
        there.starts_with(&root),
        "the worktree is under the worker's root: {remote}"
    );
    assert_eq!(remote["directory"], ws["path"], "{remote}");
    assert!(local["workspace"].get("worker").is_none(), "{local}");

    let w = rig
        .wait(
            &[&remote_id, &local_id, &spilled_id],
            "all",
            TASK_TIMEOUT_MS,
        )
        .await;
    assert_eq!(w["done"], true, "{w}\n{}", rig.client.stderr());
    let result = rig
        .ok("opencode_get_task_result", json!({ "task_id": remote_id }))
        .await;
    assert_eq!(result["status"], "completed", "{result}");
    assert_eq!(result["workspace"]["worker"], "w1", "{result}");
    assert_eq!(result["checks"]["status"], "passed", "{result}");
    assert_eq!(
        result["checks"]["last"][0]["output"],
        format!("{}\n", there.display()),
        "the check ran in the worker's worktree: {result}"
    );
    let changes = &result["workspace"]["changes"];
    assert_eq!(changes[0]["file"], "app.txt", "{result}");
    assert_eq!(changes.as_array().map(Vec::len), Some(1), "{result}");
    assert_eq!(
        read(&there.join("app.txt")),
        "one\ntwo\nthree (uncommitted)\nfour (worker)\n",
        "the agent wrote on the worker"
    );
    let diff = rig
        .ok(
            "opencode_get_task_result",
            json!({ "task_id": remote_id, "view": "diff" }),
        )
        .await;
    let text = diff["text"].as_str().expect("diff");
    assert!(text.contains("+four (worker)"), "{text}");
    assert!(
        !text.contains("+three"),
        "the base holds the uncommitted work: {text}"
    );
    assert_eq!(git(&repo, &["status", "--porcelain"]), status_before);
    assert_eq!(
        git(
            &repo,
            &["branch", "--list", &format!("opencode-mcp/{remote_id}")]
        ),
        "",
        "no branch of the remote task's here: its work is under the gateway's own ref"
    );
    let fetched = git(
        &repo,
        &[
            "rev-parse",
            &format!("refs/opencode-mcp/remote/{remote_id}"),
        ],
    );
    assert_eq!(fetched.trim().len(), 40, "{fetched}");
    let spilled_result = rig
        .ok("opencode_get_task_result", json!({ "task_id": spilled_id }))
        .await;
    assert_eq!(
        spilled_result["workspace"]["changes"][0]["file"], "spill.txt",
        "{spilled_result}"
    );
    let local_result = rig
        .ok("opencode_get_task_result", json!({ "task_id": local_id }))
        .await;
    assert_eq!(
        local_result["workspace"]["changes"][0]["file"], "local.txt",
        "{local_result}"
    );

    // A second turn on the worker: its work comes back too.
    rig.ok(
        "opencode_continue_task",
        json!({ "task_id": remote_id, "prompt": "more [[write:docs/more.txt:second turn\\n]]" }),
    )
    .await;
    let second = rig.finish(&remote_id).await;
    let files: Vec<&str> = second["workspace"]["changes"]
        .as_array()
        .map(|c| c.iter().filter_map(|f| f["file"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(files, ["app.txt", "docs/more.txt"], "{second}");

    // Apply brings the work into the user's files; their uncommitted edit stays.
    let applied = rig
        .ok("opencode_apply_task", json!({ "task_id": remote_id }))
        .await;
    assert_eq!(applied["workspace"]["applied"], true, "{applied}");
    assert_eq!(
        read(&repo.join("app.txt")),
        "one\ntwo\nthree (uncommitted)\nfour (worker)\n"
    );
    assert_eq!(read(&repo.join("docs/more.txt")), "second turn\n");

    // Discard cleans the worker and the fetched ref.
    let gone = rig
        .ok("opencode_discard_task", json!({ "task_id": remote_id }))
        .await;
    assert_eq!(gone["workspace"]["discarded"], true, "{gone}");
    assert!(!there.exists(), "the worktree left the worker");
    let refs = git(&repo, &["for-each-ref", "refs/opencode-mcp/"]);
    assert!(!refs.contains(&remote_id), "{refs}");

    // A clean exit stops the worker's OpenCode.
    assert!(!reaper.pids().is_empty(), "the worker's OpenCode ran");
    rig.client.close().await.expect("the gateway exits cleanly");
    let stopped = support::rig::poll_for(std::time::Duration::from_secs(15), || {
        reaper.pids().is_empty().then_some(())
    })
    .await;
    assert!(
        stopped.is_some(),
        "the worker's OpenCode still runs: {:?}",
        reaper.pids()
    );
}

/// **A remote task across a gateway restart.** A gateway killed outright (SIGKILL, as hosts do)
/// leaves its worker's OpenCode running; the next gateway reaches that same OpenCode again from
/// what the first saved, adopts the task still running there, and the task finishes with its
/// work fetched back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_task_survives_a_gateway_restart() {
    let OneWorker {
        _key,
        _worker,
        _worker_env,
        reaper,
        mut rig,
        ..
    } = OneWorker::start(&[("app.txt", "one\n")], |_| {}, None, 3).await;
    let (gate, held, running) = HeldOnWorker::start(&rig, &reaper).await;

    // Killed outright: the worker's OpenCode goes on, and so does the held task.
    rig.kill_gateway().await;
    assert_eq!(
        reaper.servers(),
        running,
        "the worker's OpenCode outlived the gateway"
    );
    rig.relaunch().await;
    HeldOnWorker::finishes_there(&rig, &reaper, &held, &gate, &running).await;
}

/// A task held on worker `w1` (its agent in its shell, waiting on a gate), under way there
/// before the gateway goes: what the restart and reconnect tests carry across.
struct HeldOnWorker;

impl HeldOnWorker {
    /// Starts it; its gate, its id, and the worker's OpenCode running it.
    async fn start(
        rig: &support::rig::Rig,
        reaper: &ReapHome,
    ) -> (std::path::PathBuf, String, Vec<u32>) {
        let (gate, hold) = rig.gate();
        let held = rig
            .start_task_with(serde_json::json!({
                "prompt": format!("held {hold} [[write:held.txt:held\\n]]"),
                "worker": "w1",
            }))
            .await;
        let held = held["task_id"].as_str().expect("task_id").to_string();
        let status = rig.running(&held).await;
        assert_eq!(status["status"], "running", "{status}");
        let running = reaper.servers();
        assert_eq!(running.len(), 1, "the worker's OpenCode runs");
        (gate, held, running)
    }

    /// In the gateway now serving, adopted (not interrupted; its last recorded state may be
    /// the one before `running`), it completes with its work, on the same OpenCode: none was
    /// started again.
    async fn finishes_there(
        rig: &support::rig::Rig,
        reaper: &ReapHome,
        held: &str,
        gate: &std::path::Path,
        running: &[u32],
    ) {
        let status = rig.status(held).await;
        assert!(
            ["pending", "running"].contains(&status["status"].as_str().unwrap_or_default()),
            "{status}\n{}",
            rig.client.stderr()
        );
        std::fs::write(gate, "open").expect("open the gate");
        let result = rig.finish(held).await;
        assert_eq!(
            result["status"],
            "completed",
            "{result}\n{}",
            rig.client.stderr()
        );
        assert_eq!(
            result["workspace"]["changes"][0]["file"], "held.txt",
            "{result}"
        );
        assert_eq!(
            reaper.servers(),
            running,
            "the same OpenCode finished the task"
        );
    }
}

/// **Remote tasks expire cleanly.** Once the records expire, the worker is cleaned of every
/// task's worktree; work never applied stays in the user's repository under the gateway's ref,
/// applied work leaves no ref; and a gateway that finds a killed gateway's OpenCode on a worker
/// with no task needing it stops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_tasks_expire_cleanly() {
    use serde_json::json;
    use support::git::git;
    use support::rig::TASK_TIMEOUT_MS;

    let OneWorker {
        _key,
        _worker,
        _worker_env,
        reaper,
        repo,
        root,
        mut rig,
        ..
    } = OneWorker::start(&[("app.txt", "one\n")], |_| {}, None, 3).await;
    let start = |prompt: &str| {
        let rig = &rig;
        let prompt = prompt.to_string();
        async move {
            let s = rig
                .start_task_with(json!({ "prompt": prompt, "worker": "w1" }))
                .await;
            s["task_id"].as_str().expect("task_id").to_string()
        }
    };
    let kept = start("kept [[write:kept.txt:never applied\\n]]").await;
    let taken = start("taken [[write:taken.txt:applied\\n]]").await;
    let w = rig.wait(&[&kept, &taken], "all", TASK_TIMEOUT_MS).await;
    assert_eq!(w["done"], true, "{w}");
    rig.ok("opencode_apply_task", json!({ "task_id": taken }))
        .await;
    assert_eq!(read(&repo.join("taken.txt")), "applied\n");
    assert!(!reaper.servers().is_empty(), "the worker's OpenCode runs");

    // The gateway is killed (its OpenCode on the worker goes on); the next one finds every
    // record expired.
    rig.kill_gateway().await;
    rig.launch = rig
        .launch
        .clone()
        .env("OPENCODE_MCP_LIMITS__FINISHED_TASK_TTL", "1ms");
    rig.relaunch().await;
    let worktrees = root.join("worktrees");
    let cleaned = support::rig::poll_for(std::time::Duration::from_secs(60), || {
        let left = std::fs::read_dir(&worktrees)
            .map(|d| d.count())
            .unwrap_or(0);
        (left == 0 && reaper.pids().is_empty()).then_some(())
    })
    .await;
    assert!(
        cleaned.is_some(),
        "worktrees left on the worker: {:?}; OpenCode there: {:?}\n{}",
        std::fs::read_dir(&worktrees).map(|d| d
            .filter_map(|e| e.ok())
            .map(|e| e.file_name())
            .collect::<Vec<_>>()),
        reaper.pids(),
        rig.client.stderr()
    );
    let refs = support::rig::poll_for(std::time::Duration::from_secs(30), || {
        let refs = git(
            &repo,
            &["for-each-ref", "--format=%(refname)", "refs/opencode-mcp/"],
        );
        (!refs.contains(&taken)).then_some(refs)
    })
    .await
    .expect("the applied task's ref goes");
    assert!(
        refs.contains(&format!("refs/opencode-mcp/remote/{kept}")),
        "{refs}"
    );
    let kept_file = git(
        &repo,
        &["show", &format!("refs/opencode-mcp/remote/{kept}:kept.txt")],
    );
    assert_eq!(kept_file, "never applied\n");
}

/// The gateway's own `ssh` processes forwarding to worker `name` (the sessions its OpenCode
/// is reached through).
fn forwards_to(key: &SshKey, name: &str) -> Vec<u32> {
    ssh_clients(key, name, true)
}

/// This test's live `ssh` clients to worker `name` (only its forwards with `forwards`): found
/// by the client configuration the test's gateway passes with `-F` as well as by the name,
/// since every test names its worker `w1` and their tests run side by side (a client of
/// another test's gateway, once killed here, cut that test's worker off).
fn ssh_clients(key: &SshKey, name: &str, forwards: bool) -> Vec<u32> {
    let config = key.config_file().display().to_string();
    support::procs::all()
        .into_iter()
        .filter(|p| p.is_live() && p.comm == "ssh")
        .filter(|p| {
            let cmdline = std::fs::read(format!("/proc/{}/cmdline", p.pid)).unwrap_or_default();
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            let ours = args
                .windows(2)
                .any(|w| w[0] == b"-F" && w[1] == config.as_bytes());
            ours && args.contains(&name.as_bytes()) && (!forwards || args.contains(&&b"-L"[..]))
        })
        .map(|p| p.pid)
        .collect()
}

/// **Faults.** A worker whose connection drops (the gateway's ssh to it killed; its OpenCode
/// goes on there) is reached again, the same OpenCode finishing the task that ran there. A
/// worker that is gone (its sshd stopped, its OpenCode with it) fails its running task
/// `WorkerLost`, naming it, once `lost_after` passes; a task the call places nowhere then
/// avoids it, and a call that names it is told it cannot be reached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_worker_is_reached_again_and_a_gone_one_is_lost() {
    use serde_json::json;
    use support::git::init_repo;
    use support::rig::{Rig, TASK_TIMEOUT_MS};

    let fake = FakeLlm::start();
    let env = OpenCodeEnv::new();
    let key = SshKey::new();
    // `a1` goes away for good; `b1` only drops its connection. Of two workers with as many
    // free slots the first named is chosen, so avoiding `a1` shows.
    let mut gone = Sshd::start("a1", &key);
    let drops = Sshd::start("b1", &key);
    let (gone_env, drops_env) = (OpenCodeEnv::new(), OpenCodeEnv::new());
    let gone_reaper = ReapHome(gone_env.home_dir());
    let drops_reaper = ReapHome(drops_env.home_dir());
    let gone_opencode = worker_opencode(&gone, &gone_env, &fake.url());
    let drops_opencode = worker_opencode(&drops, &drops_env, &fake.url());
    let repo = env.work_dir();
    init_repo(&repo, &[("app.txt", "one\n")]);
    let user_file = env.root().join("user-delegation.yaml");
    std::fs::write(
        &user_file,
        format!(
            "workers:\n  local:\n    max_tasks: 1\n{}    lost_after: 3s\n{}    lost_after: 5m\n",
            entry(
                &gone,
                &key,
                &gone_opencode.display().to_string(),
                &gone.root.join("mcp").display().to_string(),
                2
            ),
            entry(
                &drops,
                &key,
                &drops_opencode.display().to_string(),
                &drops.root.join("mcp").display().to_string(),
                2
            ),
        ),
    )
    .expect("the user's file");
    let config_var = user_file.display().to_string();
    let rig = Rig::start_in(fake, env, &[("OPENCODE_MCP_CONFIG", config_var.as_str())]).await;
    let (gate, held) = rig.gate();
    let start = |args: serde_json::Value| {
        let rig = &rig;
        async move {
            let s = rig.start_task_with(args).await;
            (s["task_id"].as_str().expect("task_id").to_string(), s)
        }
    };
    let (on_gone, _) = start(json!({ "prompt": format!("doomed {held}"), "worker": "a1" })).await;
    let (on_drops, on_drops_started) = start(json!({
        "prompt": format!("carries on {held} [[write:b.txt:from b1\\n]]"),
        "worker": "b1",
    }))
    .await;
    let (local, _) =
        start(json!({ "prompt": format!("here {held}"), "isolation": "worktree" })).await;
    let before = drops_reaper.servers();
    assert_eq!(before.len(), 1, "b1's OpenCode runs");

    // b1's connection drops; its OpenCode goes on.
    let forwards = forwards_to(&key, "b1");
    assert!(!forwards.is_empty(), "the gateway forwards to b1");
    for pid in forwards {
        drop(KillOnDrop(pid));
    }
    // a1 goes away, its OpenCode with it.
    gone.stop();
    let lost = rig.wait(&[&on_gone], "all", 60_000).await;
    let task = &lost["tasks"][0];
    assert_eq!(task["status"], "failed", "{lost}\n{}", rig.client.stderr());
    let error = task["error"].to_string();
    assert!(
        error.contains("WorkerLost") && error.contains("`a1`"),
        "{error}"
    );
    assert!(gone_reaper.servers().is_empty());

    // With this machine's one slot taken, a task placed nowhere goes to b1, not a1.
    let (placed, snapshot) =
        start(json!({ "prompt": "placed [[write:p.txt:p\\n]]", "isolation": "worktree" })).await;
    assert_eq!(
        snapshot["workspace"]["worker"],
        "b1",
        "{snapshot}\n{}",
        rig.client.stderr()
    );
    // Named, a1 is tried: the start answers, then fails, naming it.
    let message = start_fails(&rig, json!({ "prompt": "x", "worker": "a1" })).await;
    assert!(message.contains("a1"), "{message}");

    std::fs::write(&gate, "open").expect("open the gate");
    let w = rig
        .wait(&[&on_drops, &local, &placed], "all", TASK_TIMEOUT_MS)
        .await;
    assert_eq!(w["done"], true, "{w}\n{}", rig.client.stderr());
    let result = rig
        .ok("opencode_get_task_result", json!({ "task_id": on_drops }))
        .await;
    assert_eq!(result["status"], "completed", "{result}");
    assert_eq!(
        result["workspace"]["changes"][0]["file"], "b.txt",
        "{result}"
    );
    assert_eq!(
        drops_reaper.servers(),
        before,
        "the same OpenCode carried on"
    );

    // stop_server on the worker's server stops its OpenCode there.
    let server_id = on_drops_started["server_id"].as_str().expect("server_id");
    let stopped = rig
        .ok("opencode_stop_server", json!({ "server_id": server_id }))
        .await;
    assert_eq!(stopped["failed_tasks"], json!([]), "{stopped}");
    let gone = support::rig::poll_for(std::time::Duration::from_secs(15), || {
        drops_reaper.servers().is_empty().then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "b1's OpenCode still runs: {:?}",
        drops_reaper.servers()
    );
}

/// **A restart that finds the worker gone.** The gateway is killed while a task runs on a
/// worker, and the worker goes too (its sshd and its OpenCode); the next gateway cannot reach
/// that OpenCode again, and the task ends `failed` (`WorkerLost`, naming the worker) instead of
/// staying `running` for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_task_whose_worker_went_with_the_gateway_fails_worker_lost() {
    use serde_json::json;

    let OneWorker {
        _key,
        mut _worker,
        _worker_env,
        reaper,
        mut rig,
        ..
    } = OneWorker::start(&[("app.txt", "one\n")], |_| {}, None, 2).await;
    let held = rig
        .start_task_with(json!({
            "prompt": "held [[bash:sleep 300]]",
            "worker": "w1",
        }))
        .await;
    let held = held["task_id"].as_str().expect("task_id").to_string();
    rig.kill_gateway().await;
    _worker.stop();
    for pid in reaper.pids() {
        drop(KillOnDrop(pid));
    }
    rig.relaunch().await;
    let w = rig.wait(&[&held], "all", 60_000).await;
    let task = &w["tasks"][0];
    assert_eq!(task["status"], "failed", "{w}\n{}", rig.client.stderr());
    let error = task["error"].to_string();
    assert!(
        error.contains("WorkerLost") && error.contains("`w1`"),
        "{error}"
    );
}

/// **A hostile agent on a worker stays in its worktree there**, with no sandbox setting
/// anywhere: confinement is the default on a worker too (its bubblewrap, through the confining
/// shell the gateway writes there). The agent, and then its check, try to write the worker
/// user's home and the worker's root, read a planted key, print the environment (OpenCode's
/// password there), kill the worker's OpenCode, rewrite their worktree's `.git` and put a hook
/// into the bare repository there (through bash and through OpenCode's own write tool), and
/// work in a sibling task's worktree and in the root through `workdir`. Each fails with a
/// message the agent can read; an honest task beside it writes its file and passes its check;
/// both are reported confined.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_agent_on_a_worker_stays_in_its_worktree() {
    use serde_json::json;
    const PLANTED: &str = "PLANTED-SECRET";

    let OneWorker {
        _key,
        _worker,
        _worker_env,
        reaper,
        repo: _repo,
        user_file: _,
        root,
        rig,
    } = OneWorker::start(&[("app.txt", "one\n")], |_| {}, None, 2).await;
    // The worker's OpenCode runs with a home of its own (its wrapper sets it), its checks
    // with the ssh login's: a key is planted in each, and each reads its own `~`.
    let home = _worker_env.home_dir();
    for h in [&home, &_worker.home] {
        std::fs::create_dir_all(h.join(".ssh")).expect("the worker's ~/.ssh");
        std::fs::write(h.join(".ssh/id_ed25519"), format!("{PLANTED}-ssh")).expect("plant");
    }

    let honest = rig
        .start_task_with(json!({
            "prompt": "[[bash:echo honest > result.txt]]",
            "worker": "w1",
            "checks": ["grep -q honest result.txt"],
        }))
        .await;
    let honest_id = honest["task_id"].as_str().expect("id").to_string();
    let sibling = honest["workspace"]["path"]
        .as_str()
        .expect("the honest task's worktree there")
        .to_string();
    let honest = rig.finish(&honest_id).await;
    assert_eq!(honest["status"], "completed", "{honest}");
    assert_eq!(honest["checks"]["status"], "passed", "{honest}");
    assert_eq!(honest["confined"], true, "{honest}");

    let bare = std::fs::read_dir(root.join("repos"))
        .expect("the worker's bare repositories")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "git"))
        .expect("the bare repository of the origin");
    // What the gateway made there is the ssh user's alone, whatever the worker's umask.
    for made in [
        root.clone(),
        root.join("repos"),
        bare.clone(),
        bare.join("objects"),
        std::path::PathBuf::from(&sibling),
        root.join("sandbox"),
    ] {
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&made).expect("stat").permissions(),
        );
        assert_eq!(mode & 0o077, 0, "{} is {:o}", made.display(), mode & 0o777);
    }
    let servers = reaper.servers();
    let opencode_pid = *servers.first().expect("the worker's OpenCode runs");
    let attacks = [
        format!("[[bash:echo x > {}/owned]]", home.display()),
        format!("[[bash:echo x > {}/owned-root]]", root.display()),
        "[[bash:cat ~/.ssh/id_ed25519]]".to_string(),
        "[[bash:env]]".to_string(),
        format!("[[bash:kill -9 {opencode_pid}]]"),
        format!(
            "[[bash:echo 'echo pwned' > {}/hooks/pre-commit]]",
            bare.display()
        ),
        "[[bash:echo 'gitdir: /elsewhere' > .git]]".to_string(),
        format!("[[write:{}/hooks/post-commit:echo pwned]]", bare.display()),
        "[[write:.git:gitdir /elsewhere]]".to_string(),
        format!("[[bashin:{sibling}:touch from-attacker]]"),
        format!("[[bashin:{}:touch from-attacker]]", root.display()),
        "[[bash:echo mine > mine.txt]]".to_string(),
    ];
    let check = format!(
        "cat ~/.ssh/id_ed25519; env; echo x > {h}/owned-by-check; \
         echo pwned > {b}/hooks/pre-push; kill -9 {opencode_pid}; test -f mine.txt",
        h = home.display(),
        b = bare.display(),
    );
    let hostile = rig
        .start_task_with(json!({
            "prompt": format!("attack {}", attacks.join(" ")),
            "worker": "w1",
            "checks": [check],
        }))
        .await;
    let hostile_id = hostile["task_id"].as_str().expect("id").to_string();
    let session = hostile["session_id"].as_str().expect("session").to_string();
    let worktree = std::path::PathBuf::from(hostile["workspace"]["path"].as_str().expect("path"));
    let pointer = read(&worktree.join(".git"));
    let done = rig.finish(&hostile_id).await;

    assert_eq!(done["confined"], true, "{done}");
    assert_eq!(
        done["checks"]["status"], "passed",
        "its own work was kept: {done}"
    );
    support::held::agent_was_held(
        &rig.tool_outputs(&session),
        &[
            PLANTED,
            "OPENCODE_SERVER_PASSWORD",
            "OPENCODE_CONFIG_CONTENT",
        ],
    );
    support::held::check_was_held(&done, &[PLANTED, "OPENCODE_SERVER_PASSWORD"]);
    for path in [
        home.join("owned"),
        home.join("owned-by-check"),
        root.join("owned-root"),
        root.join("from-attacker"),
        bare.join("hooks/pre-commit"),
        bare.join("hooks/post-commit"),
        bare.join("hooks/pre-push"),
        std::path::Path::new(&sibling).join("from-attacker"),
    ] {
        assert!(!path.exists(), "the agent wrote {}", path.display());
    }
    assert_eq!(
        read(&worktree.join(".git")),
        pointer,
        "the .git pointer was rewritten"
    );
    assert_eq!(read(&worktree.join("mine.txt")), "mine\n");
    assert!(
        support::procs::stat(opencode_pid).is_some_and(|p| p.is_live()),
        "the worker's OpenCode still runs"
    );
}

/// **A hostile worker neither hangs nor floods the gateway.** The stand-in's login does the
/// hostile part before every command, as a worker's `~/.ssh/rc` or profile could: first it
/// prints bytes that are not UTF-8 and then says nothing more; then it prints 50 MB. Each time
/// a start on that worker fails within its bound, naming the worker and the step, while the
/// task list answers within 3 s and a local task starts and completes; the gateway's memory
/// stays small. Once the worker behaves, a task runs there again (no lock was left held).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_worker_neither_hangs_nor_floods_the_gateway() {
    use serde_json::json;
    use std::time::{Duration, Instant};

    let fake = FakeLlm::start();
    let env = OpenCodeEnv::new();
    let key = SshKey::new();
    let mode = env.root().join("worker-mode");
    let login = env.root().join("hostile-login.sh");
    std::fs::write(
        &login,
        format!(
            "#!/bin/sh\ncase \"$(cat '{}' 2>/dev/null)\" in\n  silent) printf '\\377\\376'; \
             exec sleep 120;;\n  flood) head -c 50000000 /dev/zero;;\nesac\n\
             exec /bin/sh -c \"$SSH_ORIGINAL_COMMAND\"\n",
            mode.display()
        ),
    )
    .expect("the hostile login");
    std::fs::set_permissions(&login, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let worker = Sshd::start_with("w1", &key, Some(&login));
    let worker_env = OpenCodeEnv::new();
    let _reaper = ReapHome(worker_env.home_dir());
    let wrapper = worker_opencode(&worker, &worker_env, &fake.url());
    let repo = env.work_dir();
    support::git::init_repo(&repo, &[("app.txt", "one\n")]);
    let user_file = env.root().join("user-delegation.yaml");
    let root = worker.root.join("mcp");
    std::fs::write(
        &user_file,
        format!(
            "timeouts:\n  server_start: 20s\nworkers:\n{}",
            entry(
                &worker,
                &key,
                &wrapper.display().to_string(),
                &root.display().to_string(),
                2
            )
        ),
    )
    .expect("the user's file");
    let config = user_file.display().to_string();
    let rig =
        support::rig::Rig::start_in(fake, env, &[("OPENCODE_MCP_CONFIG", config.as_str())]).await;
    let gateway = rig.client.pid().expect("gateway pid");

    for (hostile, said) in [
        ("silent", "did not finish within"),
        ("flood", "printed more than"),
    ] {
        std::fs::write(&mode, hostile).expect("the worker's mode");
        let remote = async {
            let started = Instant::now();
            let message = start_fails(
                &rig,
                json!({ "server_id": "default", "prompt": "x", "worker": "w1" }),
            )
            .await;
            (started.elapsed(), message)
        };
        let meanwhile = async {
            let mut slowest = Duration::ZERO;
            let local = rig.start_task("[[bash:echo here > here.txt]]").await;
            for _ in 0..3 {
                let asked = Instant::now();
                rig.ok("opencode_list_tasks", json!({})).await;
                slowest = slowest.max(asked.elapsed());
            }
            let done = rig.finish(local["task_id"].as_str().expect("id")).await;
            (slowest, done)
        };
        let ((took, message), (slowest, local)) = tokio::join!(remote, meanwhile);
        assert!(
            took < Duration::from_secs(90),
            "{hostile}: {took:?} {message}"
        );
        assert!(
            message.contains("w1") && message.contains("confining shell") && message.contains(said),
            "{hostile}: {message}"
        );
        assert!(
            slowest < Duration::from_secs(3),
            "{hostile}: list took {slowest:?}"
        );
        assert_eq!(local["status"], "completed", "{hostile}: {local}");
        let status = std::fs::read_to_string(format!("/proc/{gateway}/status")).expect("status");
        let peak_kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .expect("VmHWM");
        assert!(
            peak_kib < 200 * 1024,
            "{hostile}: the gateway peaked at {peak_kib} KiB"
        );
    }

    // The worker behaves again: a task runs there.
    std::fs::write(&mode, "fine").expect("the worker's mode");
    let task = rig
        .start_task_with(json!({ "prompt": "[[bash:echo there > there.txt]]", "worker": "w1" }))
        .await;
    let done = rig.finish(task["task_id"].as_str().expect("id")).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["confined"], true, "{done}");

    // The worker goes silent while a task's work is to be fetched back (at its turn's end):
    // that fetch waits on the worker, and no other git work here waits on it.
    let (gate, held) = rig.gate();
    let slow = rig
        .start_task_with(
            json!({ "prompt": format!("{held} [[bash:echo later > later.txt]]"), "worker": "w1" }),
        )
        .await;
    std::fs::write(&mode, "silent").expect("the worker's mode");
    std::fs::write(&gate, "open").expect("open the gate");
    let slow = rig.finish(slow["task_id"].as_str().expect("id")).await;
    assert_eq!(slow["status"], "completed", "{slow}");
    let started = Instant::now();
    let local = rig
        .start_task_with(
            json!({ "prompt": "[[bash:echo local > local.txt]]", "isolation": "worktree" }),
        )
        .await;
    let local = rig.finish(local["task_id"].as_str().expect("id")).await;
    assert_eq!(local["status"], "completed", "{local}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "a local worktree task waited {:?} behind the silent worker",
        started.elapsed()
    );
}

/// **A cancel stops a remote check, and what it started.** Killing the local `ssh` stops
/// nothing on the worker: the check's process group there is killed over ssh (its pid kept in a
/// file of the gateway's there), and with it the sandbox it runs in. The check here starts a
/// child in the background and waits on another; after the cancel, neither runs any more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_stops_a_remote_check_and_what_it_started() {
    use serde_json::json;
    use std::os::unix::process::CommandExt;

    let OneWorker {
        _key,
        _worker,
        _worker_env,
        reaper: _reaper,
        repo: _repo,
        user_file: _,
        root: _root,
        rig,
    } = OneWorker::start(&[("app.txt", "one\n")], |_| {}, None, 1).await;
    let task = rig
        .start_task_with(json!({
            "prompt": "[[bash:echo x > x.txt]]",
            "worker": "w1",
            "checks": ["touch check-started; sleep 4242 & sleep 4243"],
        }))
        .await;
    let id = task["task_id"].as_str().expect("id").to_string();
    let worktree = std::path::PathBuf::from(task["workspace"]["path"].as_str().expect("path"));
    let started = support::rig::poll_for(std::time::Duration::from_secs(60), || {
        worktree.join("check-started").exists().then_some(())
    })
    .await;
    assert!(started.is_some(), "the check did not start on the worker");
    let sleeping = || {
        support::procs::all()
            .into_iter()
            .filter(|p| p.is_live())
            .filter_map(|p| std::fs::read(format!("/proc/{}/cmdline", p.pid)).ok())
            .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
            .filter(|c| c.starts_with("sleep 424"))
            .count()
    };
    let running = support::rig::poll_for(std::time::Duration::from_secs(30), || {
        (sleeping() == 2).then_some(())
    })
    .await;
    assert!(
        running.is_some(),
        "the check's two sleeps run ({})",
        sleeping()
    );
    let cancelled = rig
        .ok("opencode_cancel_task", json!({ "task_id": id }))
        .await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    let gone = support::rig::poll_for(std::time::Duration::from_secs(30), || {
        (sleeping() == 0).then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "{} of the check's processes still run",
        sleeping()
    );
    // The result shows the check the cancel stopped, saying so (once the check's run has
    // wound up: the cancel answers at once).
    let mut result = Value::Null;
    for _ in 0..300 {
        result = rig
            .ok("opencode_get_task_result", json!({ "task_id": id }))
            .await;
        if result["checks"]["last"].is_array() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let last = &result["checks"]["last"];
    assert_eq!(last.as_array().map(Vec::len), Some(1), "{result}");
    assert_eq!(
        last[0]["command"], "touch check-started; sleep 4242 & sleep 4243",
        "{result}"
    );
    assert_eq!(
        last[0]["error"], "stopped: the task was cancelled",
        "{result}"
    );

    // A pid file that outlived its check (a worker that rebooted, say) names a pid that now
    // belongs to someone else's shell, leading its own process group as a check's `timeout`
    // would. The next round of checks stops what that file names first: the shell is not
    // this task's check, and it runs on.
    let root = worktree
        .parent()
        .and_then(std::path::Path::parent)
        .expect("the worker's root");
    // Its stdio is not the test's: a `sleep` left holding the test binary's stdout would keep
    // the run's output open after every test ended. The guard stops the whole group (the shell
    // and its `sleep`) however this test ends.
    let mut decoy = GroupGuard(
        std::process::Command::new("sh")
            .args(["-c", "sleep 5151; true"])
            .process_group(0)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("a shell of the user's"),
    );
    std::fs::write(
        root.join("checks").join(format!("{id}.pid")),
        format!("{}\n", decoy.0.id()),
    )
    .expect("the stale pid file");
    std::fs::remove_file(worktree.join("check-started")).expect("the first round's mark");
    rig.ok(
        "opencode_continue_task",
        json!({ "task_id": id, "prompt": "[[bash:echo y > y.txt]]" }),
    )
    .await;
    let again = support::rig::poll_for(std::time::Duration::from_secs(60), || {
        worktree.join("check-started").exists().then_some(())
    })
    .await;
    assert!(again.is_some(), "the next round of checks did not start");
    assert!(
        decoy.0.try_wait().expect("the shell's state").is_none(),
        "a shell that only took the stale pid was stopped as the check"
    );
    drop(decoy);
    let cancelled = rig
        .ok("opencode_cancel_task", json!({ "task_id": id }))
        .await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
}

/// **A lost period leaves no OpenCode behind.** The worker drops off the network (the
/// gateway's connections to it cut, new ones unanswered) for longer than its `lost_after`,
/// while its OpenCode runs on there: the running task fails `WorkerLost`. Once the worker
/// answers again, the OpenCode of the lost period is stopped, and a new task runs there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_back_from_a_lost_period_keeps_no_opencode_from_it() {
    use serde_json::json;

    let OneWorker {
        _key: key,
        _worker,
        _worker_env,
        reaper,
        repo: _repo,
        user_file: _,
        root: _root,
        rig,
    } = OneWorker::start_with(
        &[("app.txt", "one\n")],
        |_| {},
        None,
        2,
        "    lost_after: 3s\n",
    )
    .await;
    let (gate, held) = rig.gate();
    let task = rig
        .start_task_with(
            json!({ "prompt": format!("{held} [[bash:echo x > x.txt]]"), "worker": "w1" }),
        )
        .await;
    let id = task["task_id"].as_str().expect("id").to_string();
    let lost_period = reaper.servers();
    assert_eq!(
        lost_period.len(),
        1,
        "one OpenCode runs there: {lost_period:?}"
    );

    // Off the network: nothing new is answered, and every connection of the gateway's to it
    // (the forward, the shared one) is cut.
    _worker.pause();
    let clients = ssh_clients(&key, "w1", false);
    assert!(!clients.is_empty(), "the gateway's ssh to w1 runs");
    for pid in clients {
        drop(KillOnDrop(pid));
    }
    let lost = rig.finish(&id).await;
    assert_eq!(lost["status"], "failed", "{lost}");
    assert!(lost["error"].to_string().contains("WorkerLost"), "{lost}");
    assert!(
        support::procs::stat(lost_period[0]).is_some_and(|p| p.is_live()),
        "the lost period's OpenCode runs on there while the worker is unreachable"
    );

    _worker.resume();
    let stopped = support::rig::poll_for(std::time::Duration::from_secs(120), || {
        (!support::procs::stat(lost_period[0]).is_some_and(|p| p.is_live())).then_some(())
    })
    .await;
    assert!(stopped.is_some(), "the lost period's OpenCode still runs");
    std::fs::write(&gate, "open").expect("open the gate");
    let again = rig
        .start_task_with(json!({ "prompt": "[[bash:echo y > y.txt]]", "worker": "w1" }))
        .await;
    let again = rig.finish(again["task_id"].as_str().expect("id")).await;
    assert_eq!(again["status"], "completed", "{again}");
}

/// **Every end of a remote turn brings its work back.** Tasks on a worker end each in its own
/// way: completed, stopped at its deadline, stopped by a token cap, cancelled, and failed by its
/// checks. After each end the gateway fetches the turn's work into its own ref here, without a
/// call asking for it. Then the worker goes away for good, and each task's diff still shows
/// what its last turn wrote. (The deadline and the cap used to end a turn without that fetch.
/// Their work then stayed on a worker that could vanish.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_end_of_a_remote_turn_brings_its_work_back() {
    use serde_json::json;
    use support::rig::TASK_TIMEOUT_MS;

    let OneWorker {
        _key,
        mut _worker,
        _worker_env,
        reaper: _reaper,
        repo,
        user_file: _,
        root: _root,
        rig,
    } = OneWorker::start_with(
        &[("app.txt", "one\n")],
        |_| {},
        None,
        6,
        "timeouts:\n  task: 25s\n",
    )
    .await;
    let (_gate, held) = rig.gate();
    let start = |name: &'static str, extra: serde_json::Value| {
        let rig = &rig;
        async move {
            let mut args = json!({ "worker": "w1" });
            if let (Some(args), Some(extra)) = (args.as_object_mut(), extra.as_object()) {
                args.extend(extra.clone());
            }
            let s = rig.start_task_with(args).await;
            let id = s["task_id"].as_str().expect("task_id").to_string();
            let path = std::path::PathBuf::from(s["workspace"]["path"].as_str().expect("path"));
            (name, id, path)
        }
    };
    let tasks = vec![
        start(
            "completed",
            json!({ "prompt": "[[write:completed.txt:done\\n]]" }),
        )
        .await,
        start(
            "deadline",
            json!({ "prompt": "[[write:deadline.txt:late\\n]] [[bash:sleep 300]]" }),
        )
        .await,
        start(
            "budget",
            json!({
                "prompt": "[[usage:5000]] [[write:budget.txt:dear\\n]] [[bash:echo 1]] [[bash:echo 2]] [[bash:echo 3]]",
                "budget": { "max_tokens": 8000 },
            }),
        )
        .await,
        start(
            "cancelled",
            json!({ "prompt": format!("[[write:cancelled.txt:stopped\\n]] {held}") }),
        )
        .await,
        start(
            "checks",
            json!({ "prompt": "[[write:checks.txt:checked\\n]]", "checks": ["exit 3"] }),
        )
        .await,
    ];
    let (_, cancelled, cancelled_path) = &tasks[3];
    let wrote = support::rig::poll_for(std::time::Duration::from_secs(60), || {
        cancelled_path.join("cancelled.txt").exists().then_some(())
    })
    .await;
    assert!(wrote.is_some(), "the task to cancel never wrote its file");
    let c = rig
        .ok("opencode_cancel_task", json!({ "task_id": cancelled }))
        .await;
    assert_eq!(c["status"], "cancelled", "{c}");
    // Their ends are watched with status alone: a wait, a result or a diff would fetch the work
    // themselves, and the fetch each end makes by itself is what is under test.
    let mut ended: Vec<(String, String)> = Vec::new();
    for (name, id, _) in &tasks {
        let gave_up = std::time::Instant::now() + std::time::Duration::from_millis(TASK_TIMEOUT_MS);
        let (mut last, mut done) = (Value::Null, None);
        while done.is_none() && std::time::Instant::now() < gave_up {
            last = rig.status(id).await;
            let over = !matches!(
                last["status"].as_str(),
                Some("pending" | "queued" | "running" | "waiting_permission")
            );
            if over {
                done = Some(());
            } else {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
        assert!(done.is_some(), "the {name} task never ended: {last}");
        ended.push((
            last["status"].as_str().unwrap_or_default().to_string(),
            last["error"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        ));
    }
    assert_eq!(
        ended,
        [
            ("completed", ""),
            ("timed_out", "TaskTimeout"),
            ("failed", "BudgetExceeded"),
            ("cancelled", ""),
            ("failed", "ChecksFailed"),
        ]
        .map(|(s, e)| (s.to_string(), e.to_string())),
    );
    // Each end fetched its turn's work here, by itself.
    for (name, id, _) in &tasks {
        let file = format!("refs/opencode-mcp/remote/{id}:{name}.txt");
        let fetched = support::rig::poll_for(std::time::Duration::from_secs(60), || {
            Command::new("git")
                .arg("-C")
                .arg(&repo)
                .args(["cat-file", "-e", &file])
                .stderr(Stdio::null())
                .status()
                .ok()
                .filter(|s| s.success())
        })
        .await;
        assert!(
            fetched.is_some(),
            "the {name} task's work was not fetched back after its turn ended\n{}",
            rig.client.stderr()
        );
    }
    // The worker goes away for good.
    _worker.stop();
    for (name, id, _) in &tasks {
        let diff = rig
            .ok(
                "opencode_get_task_result",
                json!({ "task_id": id, "view": "diff" }),
            )
            .await;
        let text = diff["text"].as_str().unwrap_or_default();
        assert!(
            text.contains(&format!("{name}.txt")),
            "the {name} task's diff without its worker: {diff}"
        );
    }
}

/// **Work outlives a host's reconnect.** A host's `/mcp` or update starts a new gateway and
/// closes the old one's stdin while a task runs on a worker. The old gateway exits cleanly
/// without stopping the worker's OpenCode (it used to, and the task ended `WorkerLost`); the new
/// one takes the task over, and it ends `completed` with its work, on the same OpenCode, whose
/// linger timer the new gateway stopped. Then, with no gateway back, a lingering OpenCode stops
/// once `limits.linger` has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_task_runs_on_across_a_clean_reconnect() {
    use serde_json::json;

    let OneWorker {
        _key,
        _worker,
        _worker_env,
        reaper,
        mut rig,
        root,
        ..
    } = OneWorker::start_with(
        &[("app.txt", "one\n")],
        |_| {},
        None,
        3,
        "limits:\n  linger: 20s\n",
    )
    .await;
    let (gate, held, running) = HeldOnWorker::start(&rig, &reaper).await;
    rig.reconnect().await;
    assert_eq!(
        reaper.servers(),
        running,
        "the worker's OpenCode outlived the clean exit"
    );
    HeldOnWorker::finishes_there(&rig, &reaper, &held, &gate, &running).await;
    assert!(
        !root.join("linger.pid").exists(),
        "the new gateway stopped the linger timer"
    );

    // No gateway comes back: the lingering OpenCode stops after `limits.linger`.
    std::fs::remove_file(&gate).expect("close the gate");
    let (_, hold) = rig.gate();
    // The new gateway has no server of the old one's: `default` starts one.
    let again = rig
        .ok(
            "opencode_start_task",
            json!({ "server_id": "default", "prompt": format!("again {hold}"), "worker": "w1" }),
        )
        .await;
    let again = again["task_id"].as_str().expect("task_id").to_string();
    let status = rig.running(&again).await;
    assert_eq!(status["status"], "running", "{status}");
    let client = rig.client;
    let said = client.stderr_handle();
    client.close().await.expect("the gateway exits cleanly");
    assert_eq!(reaper.servers(), running, "it lingers for its task");
    assert!(
        root.join("linger.pid").exists(),
        "no linger timer on the worker\n{}",
        said()
    );
    let stopped = support::rig::poll_for(std::time::Duration::from_secs(90), || {
        reaper.servers().is_empty().then_some(())
    })
    .await;
    assert!(
        stopped.is_some(),
        "the worker's OpenCode still runs long after limits.linger: {:?}",
        reaper
            .servers()
            .iter()
            .map(|p| {
                let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
                let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
                format!(
                    "{p}: {} [{stat}]",
                    String::from_utf8_lossy(&cmd).replace('\0', " ")
                )
            })
            .collect::<Vec<_>>()
    );
}

/// **A task's deadline holds on a worker while no gateway runs.** Task A streams on worker
/// `w1` (its model answers for 90 s) while task H is held for its check there, so the worker's
/// OpenCode lingers for the whole `limits.linger` once the gateway exits cleanly. No gateway
/// runs at A's `timeouts.task` (15 s), yet its session is aborted then by the linger timer on
/// the worker (it used to run on until the next gateway took it over), and OpenCode keeps
/// running H. The next gateway reports A `timed_out`, saying no gateway ran, and H completes
/// there once its check passes. The 15 s deadline is reloaded in once H is held: a running
/// gateway holds a held turn to the deadline in force when it began (its checks count), and
/// that one must not pass before the gateway exits, however slow the machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_tasks_deadline_holds_while_no_gateway_runs() {
    use serde_json::json;

    let OneWorker {
        _key,
        _worker,
        _worker_env,
        reaper,
        user_file,
        mut rig,
        ..
    } = OneWorker::start_with(
        &[("app.txt", "one\n")],
        |_| {},
        None,
        3,
        "limits:\n  linger: 10m\n",
    )
    .await;
    let held = rig
        .start_task_with(json!({
            "prompt": "held for its check [[write:held.txt:held\\n]]",
            "worker": "w1",
            "checks": ["echo run >> check-runs; test -f check-gate || sleep 60; test -f check-gate"],
        }))
        .await;
    let worktree = std::path::PathBuf::from(held["workspace"]["path"].as_str().expect("path"));
    let held = held["task_id"].as_str().expect("task_id").to_string();
    let began = support::rig::poll_for(std::time::Duration::from_secs(60), || {
        worktree.join("check-runs").exists().then_some(())
    })
    .await;
    assert!(began.is_some(), "the check did not start on the worker");
    rig.append_and_reload(&user_file, "timeouts:\n  task: 15s\n")
        .await;

    let started = std::time::Instant::now();
    let open = rig
        .start_task_with(
            json!({ "prompt": "streams past its deadline [[slow:90000]]", "worker": "w1" }),
        )
        .await;
    let open = open["task_id"].as_str().expect("task_id").to_string();
    let request = rig
        .fake
        .wait_for_request(std::time::Duration::from_secs(30), |r| {
            r.last_user_text.contains("streams past its deadline")
        })
        .await;
    let running = reaper.servers();
    assert_eq!(running.len(), 1, "the worker's OpenCode runs");

    let said = rig
        .exit_and_see_aborted_at(request.index, started, std::time::Duration::from_secs(15))
        .await;
    assert_eq!(
        reaper.servers(),
        running,
        "the worker's OpenCode stopped: the held task keeps it for limits.linger; the exited \
         gateway said:\n{said}"
    );

    std::fs::write(worktree.join("check-gate"), "open").expect("open the gate");
    rig.relaunch_and_see_timed_out(&open, &held).await;
}

/// Starts `args` (on `w1`, detail `full`) and returns the answer as it came: before the
/// task's start is done (see `Rig::start_task_with`, which waits for it).
async fn start_raw(rig: &support::rig::Rig, args: serde_json::Value) -> serde_json::Value {
    let mut args = args;
    args["worker"] = serde_json::json!("w1");
    args["detail"] = serde_json::json!("full");
    start_answered(rig, args).await
}

/// Starts `args` (with the rig's server unless they name one), which answers at once:
/// `pending`, phase `starting`. The answer.
async fn start_answered(rig: &support::rig::Rig, args: serde_json::Value) -> serde_json::Value {
    let mut args = args;
    if args.get("server_id").is_none() {
        args["server_id"] = serde_json::json!(rig.server_id());
    }
    let started = rig.ok("opencode_start_task", args.clone()).await;
    assert_eq!(started["status"], "pending", "{args}: {started}");
    assert_eq!(started["phase"], "starting", "{args}: {started}");
    started
}

/// Starts `args` (with the rig's server unless named), which answers at once (`pending`,
/// phase `starting`), and whose start then fails in the background: the task's `StartFailed`
/// message, read once the task is done (within 90 s).
async fn start_fails(rig: &support::rig::Rig, args: serde_json::Value) -> String {
    let started = start_answered(rig, args.clone()).await;
    let id = started["task_id"].as_str().expect("task_id").to_string();
    let w = rig.wait(&[&id], "all", 90_000).await;
    assert_eq!(w["done"], true, "{args}: {w}\n{}", rig.client.stderr());
    let st = rig.status(&id).await;
    assert_eq!(st["status"], "failed", "{args}: {st}");
    assert_eq!(st["error"]["name"], "StartFailed", "{args}: {st}");
    st["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Stops the worker's OpenCode that task `id` ran on, and waits until it is gone (so the next
/// start there has to start one).
async fn stop_opencode_of(rig: &support::rig::Rig, id: &str, reaper: &ReapHome) {
    let server_id = rig.status(id).await["server_id"]
        .as_str()
        .expect("server_id")
        .to_string();
    rig.ok(
        "opencode_stop_server",
        serde_json::json!({ "server_id": server_id }),
    )
    .await;
    let gone = support::rig::poll_for(std::time::Duration::from_secs(15), || {
        reaper.servers().is_empty().then_some(())
    })
    .await;
    assert!(gone.is_some(), "the worker's OpenCode still runs");
}

/// Whether a file or directory named `name` is anywhere under `dir` (a few levels down).
fn found_under(dir: &std::path::Path, name: &str, depth: u32) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().any(|e| {
        e.file_name().to_string_lossy().contains(name)
            || (depth > 0
                && e.file_type().is_ok_and(|t| t.is_dir())
                && found_under(&e.path(), name, depth - 1))
    })
}

/// **A start on a worker answers at once**, the task `pending` in phase `starting`, while its
/// OpenCode starts there, its base is pushed, its worktree made and its session created:
/// - a step that fails then ends the task `StartFailed`, naming the step, as wait, status and
///   the list see it;
/// - the same `idempotency_key` while it starts is the same task, which then completes;
/// - a cancel while it starts wins: the task stays cancelled, its prompt never reaches a
///   model and nothing of it is left on the worker;
/// - a gateway killed while it starts, or one a host's reconnect closes cleanly: the next one
///   starts it again, and it completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_start_answers_at_once_and_finishes_in_the_background() {
    use serde_json::json;

    let OneWorker {
        _key,
        _worker,
        _worker_env,
        reaper,
        mut rig,
        root,
        ..
    } = OneWorker::start(&[("app.txt", "one\n")], |_| {}, None, 3).await;
    let id = |v: &serde_json::Value| v["task_id"].as_str().expect("task_id").to_string();
    let wrapper = _worker.root.join("opencode-here");
    let off = _worker.root.join("opencode-here.off");

    // OpenCode cannot start on the worker: the start still answers, then fails.
    std::fs::rename(&wrapper, &off).expect("break the worker's OpenCode");
    let failing = id(&start_raw(&rig, json!({ "prompt": "never runs" })).await);
    let w = rig.wait(&[&failing], "all", 60_000).await;
    assert_eq!(w["done"], true, "{w}\n{}", rig.client.stderr());
    let st = rig.status(&failing).await;
    assert_eq!(st["status"], "failed", "{st}");
    assert_eq!(st["error"]["name"], "StartFailed", "{st}");
    let message = st["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("starting OpenCode on its worker"),
        "the step is named: {st}"
    );
    let listed = rig.ok("opencode_list_tasks", json!({})).await;
    let row = listed["tasks"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["task_id"] == failing.as_str()))
        .cloned()
        .unwrap_or_default();
    assert_eq!(row["status"], "failed", "{listed}");
    // Its result says why, and claims no turn whose text or files were lost.
    let r = rig
        .ok("opencode_get_task_result", json!({ "task_id": failing }))
        .await;
    assert_eq!(r["error"]["name"], "StartFailed", "{r}");
    assert!(
        r.get("text_error").is_none() && r.get("files_error").is_none(),
        "{r}"
    );
    std::fs::rename(&off, &wrapper).expect("mend the worker's OpenCode");

    // A cancel while OpenCode starts there (no OpenCode runs on the worker yet).
    assert!(reaper.servers().is_empty(), "no OpenCode on the worker yet");
    let cancelled = id(&start_raw(&rig, json!({ "prompt": "cancelled while starting" })).await);
    let answer = rig
        .ok("opencode_cancel_task", json!({ "task_id": cancelled }))
        .await;
    assert_eq!(answer["status"], "cancelled", "{answer}");

    // The same key while it starts is the same task.
    let keyed = json!({ "prompt": "keyed [[write:keyed.txt:k\\n]]", "idempotency_key": "k1" });
    let first = id(&start_raw(&rig, keyed.clone()).await);
    let again = rig
        .ok(
            "opencode_start_task",
            json!({ "server_id": rig.server_id(), "worker": "w1", "prompt": keyed["prompt"], "idempotency_key": "k1" }),
        )
        .await;
    assert_eq!(id(&again), first, "{again}");
    let done = rig.finish(&first).await;
    assert_eq!(
        done["status"],
        "completed",
        "{done}\n{}",
        rig.client.stderr()
    );

    // The cancelled start has ended by now (its OpenCode is up): it never ran, and nothing of
    // it is on the worker.
    let st = rig.status(&cancelled).await;
    assert_eq!(st["status"], "cancelled", "{st}");
    assert!(
        !found_under(&root, &cancelled, 4),
        "something of the cancelled start is on the worker under {}",
        root.display()
    );

    // A gateway killed while a start is under way: its OpenCode on the worker stopped first,
    // so the start has to start one again.
    stop_opencode_of(&rig, &first, &reaper).await;
    let across = id(&start_raw(
        &rig,
        json!({ "prompt": "started across a restart [[write:across.txt:a\\n]]" }),
    )
    .await);
    rig.kill_gateway().await;
    rig.relaunch().await;
    let r = rig.finish(&across).await;
    assert_eq!(r["status"], "completed", "{r}\n{}", rig.client.stderr());
    assert_eq!(r["workspace"]["changes"][0]["file"], "across.txt", "{r}");

    // A host's clean reconnect (`/mcp`) while a start is under way (OpenCode on the worker
    // stopped again, so the start has to start one): the next gateway starts it, and it
    // completes with its work.
    stop_opencode_of(&rig, &across, &reaper).await;
    let during = id(&start_raw(
        &rig,
        // This gateway has no server of the first one's: `default` starts one.
        json!({
            "server_id": "default",
            "prompt": "started across a reconnect [[write:during.txt:d\n]]",
        }),
    )
    .await);
    rig.reconnect().await;
    let r = rig.finish(&during).await;
    assert_eq!(r["status"], "completed", "{r}\n{}", rig.client.stderr());
    assert_eq!(r["workspace"]["changes"][0]["file"], "during.txt", "{r}");

    let requests = rig.fake.requests();
    assert!(
        requests
            .iter()
            .all(|r| !r.last_user_text.contains("cancelled while starting")
                && !r.last_user_text.contains("never runs")),
        "a start that did not happen reached the model"
    );
}

/// **A queued task waits out a short worker drop.** A task queued for worker `w1` (its one
/// slot taken) is due to start while `w1` refuses every new session: its start fails, and the
/// task goes back to the queue instead of failing, since the worker has been out of reach for
/// less than its `lost_after`. Once the worker answers again, the task starts there and
/// completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_task_waits_out_a_short_worker_drop() {
    use serde_json::json;

    // Every session on the worker (each command, through the shared connection too) runs
    // through this login, which fails while the mode file says `down`, as a worker does
    // whose sshd refuses.
    let dir = support::isolation::test_tmp().join(format!("drop-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let mode = dir.join("mode");
    let login = dir.join("login.sh");
    std::fs::write(
        &login,
        format!(
            "#!/bin/sh\n[ \"$(cat '{}' 2>/dev/null)\" = down ] && exit 255\n\
             exec /bin/sh -c \"$SSH_ORIGINAL_COMMAND\"\n",
            mode.display()
        ),
    )
    .expect("the login");
    std::fs::set_permissions(&login, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let OneWorker {
        _key,
        _worker,
        _worker_env,
        reaper: _reaper,
        rig,
        ..
    } = OneWorker::start_login(
        &[("app.txt", "one\n")],
        |_| {},
        None,
        1,
        "limits:\n  queue: 5\n",
        Some(&login),
    )
    .await;
    let (gate, hold) = rig.gate();
    let first = rig
        .start_task_with(json!({ "prompt": format!("first {hold}"), "worker": "w1" }))
        .await;
    let first = first["task_id"].as_str().expect("task_id").to_string();
    let queued = rig
        .start_task_with(json!({ "prompt": "[[write:b.txt:b\\n]]", "worker": "w1" }))
        .await;
    assert_eq!(queued["status"], "queued", "{queued}");
    let queued = queued["task_id"].as_str().expect("task_id").to_string();

    // The worker stops answering; the first task ends, so the queued one is due to start.
    std::fs::write(&mode, "down").expect("the worker's mode");
    std::fs::write(&gate, "open").expect("open the gate");
    let done = rig.finish(&first).await;
    assert_eq!(done["status"], "completed", "{done}");
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    while std::time::Instant::now() < deadline {
        let status = rig.status(&queued).await;
        let now = status["status"].as_str().unwrap_or_default().to_string();
        if seen.last() != Some(&now) {
            seen.push(now.clone());
        }
        if now == "failed" || (now == "queued" && seen.len() >= 3) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(
        seen,
        ["queued", "pending", "queued"],
        "its start was tried while the worker was away, and it waits again\n{}",
        rig.client.stderr()
    );

    std::fs::write(&mode, "up").expect("the worker's mode");
    let w = rig.wait(&[&queued], "all", 150_000).await;
    assert_eq!(w["done"], true, "{w}\n{}", rig.client.stderr());
    let result = rig
        .ok("opencode_get_task_result", json!({ "task_id": queued }))
        .await;
    assert_eq!(result["status"], "completed", "{result}");
    assert_eq!(
        result["workspace"]["changes"][0]["file"], "b.txt",
        "{result}"
    );
}

/// A child leading its own process group, stopped with all of that group (SIGKILL) when
/// dropped, so nothing it started outlives the test, a failed assertion included.
struct GroupGuard(std::process::Child);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Ok(pid) = libc::pid_t::try_from(self.0.id()) {
            // SAFETY: kill(2) with a negative pid signals that process group; the group is this
            // child's own (process_group(0)) and the child is not yet reaped, so the id is ours.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
        let _ = self.0.wait();
    }
}

/// The base refs the worker's repositories under `root` hold, one line per ref.
fn base_refs_there(root: &std::path::Path) -> String {
    let mut out = String::new();
    for bare in std::fs::read_dir(root.join("repos"))
        .into_iter()
        .flatten()
        .flatten()
    {
        out.push_str(&support::git::git(
            &bare.path(),
            &[
                "for-each-ref",
                "--format=%(refname)",
                "refs/opencode-mcp/base/",
            ],
        ));
    }
    out
}

/// **Starts from one state share one base.** Two tasks started on `w1` from the same
/// uncommitted work start from one base commit, sent to the worker once (the second start only
/// adds its worktree: it has no base ref of its own there); a start after the worker's
/// repositories were removed by hand sends the base again and completes; and a fan-out's
/// targets here start from one base too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_from_one_state_share_one_base() {
    use serde_json::json;

    let OneWorker {
        rig,
        root,
        _key,
        _worker,
        _worker_env,
        reaper: _reaper,
        ..
    } = OneWorker::start(
        &[("app.txt", "one\n")],
        |repo| std::fs::write(repo.join("app.txt"), "one, edited\n").expect("uncommitted work"),
        None,
        3,
    )
    .await;
    let id = |v: &serde_json::Value| v["task_id"].as_str().expect("task_id").to_string();
    let first = id(&start_raw(&rig, json!({ "prompt": "first [[write:a.txt:a\\n]]" })).await);
    let a = rig.finish(&first).await;
    let second = id(&start_raw(&rig, json!({ "prompt": "second [[write:b.txt:b\\n]]" })).await);
    let b = rig.finish(&second).await;
    for r in [&a, &b] {
        assert_eq!(r["status"], "completed", "{r}\n{}", rig.client.stderr());
    }
    let base = a["workspace"]["base"].as_str().expect("workspace.base");
    assert_eq!(
        b["workspace"]["base"], base,
        "one state, one base: {a}\n{b}"
    );
    let refs = base_refs_there(&root);
    assert!(
        refs.contains(&first),
        "the first start sent the base: {refs}"
    );
    assert!(
        !refs.contains(&second),
        "the second start sent the base again: {refs}"
    );

    // The worker lost its repositories: the next start sends the base again.
    std::fs::remove_dir_all(root.join("repos")).expect("remove the worker's repositories");
    let third = id(&start_raw(&rig, json!({ "prompt": "third [[write:c.txt:c\\n]]" })).await);
    let c = rig.finish(&third).await;
    assert_eq!(c["status"], "completed", "{c}\n{}", rig.client.stderr());
    assert_eq!(c["workspace"]["base"], base, "{c}");
    assert_eq!(c["workspace"]["changes"][0]["file"], "c.txt", "{c}");
    assert!(base_refs_there(&root).contains(&third));

    // A fan-out here: its targets share one base.
    let out = rig
        .ok(
            "opencode_fan_out",
            json!({
                "server_id": rig.server_id(),
                "prompt": "Is this sound?",
                "models": ["fake/fake-model", "fake/fake-strong"],
                "isolation": "worktree",
            }),
        )
        .await;
    let ids: Vec<String> = out["task_ids"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t.as_str().map(String::from))
        .collect();
    assert_eq!(ids.len(), 2, "{out}");
    let mut bases = Vec::new();
    for t in &ids {
        let r = rig.finish(t).await;
        assert_eq!(r["status"], "completed", "{r}");
        bases.push(r["workspace"]["base"].clone());
    }
    assert_eq!(bases[0], base, "{bases:?}");
    assert_eq!(bases[0], bases[1], "{bases:?}");
}

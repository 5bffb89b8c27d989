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

/// `opencode-mcp doctor` has one check per worker: a ready one passes (with its OpenCode
/// release and slots), one that ssh cannot reach is a blocker with its fix.
#[test]
fn doctor_checks_each_worker() {
    let env = OpenCodeEnv::new();
    let key = SshKey::new();
    let ready = Sshd::start("ready", &key);
    let mut gone = Sshd::start("gone", &key);
    gone.stop();
    let bin = opencode_bin().display().to_string();
    let user = format!(
        "workers:\n{}{}",
        entry(&ready, &key, &bin, &ready.root.display().to_string(), 2),
        entry(&gone, &key, &bin, "/tmp", 2),
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
    let down = line("gone");
    assert!(down.starts_with("FAIL"), "{text}");
    assert!(down.contains("ssh cannot reach gone"), "{text}");
    assert!(text.contains("ssh -o BatchMode=yes gone true"), "{text}");
}

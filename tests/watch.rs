//! `opencode-mcp watch`, end to end: a real gateway over MCP stdio with a real OpenCode and the
//! scripted fake LLM runs a task that stays busy (`[[delay:<ms>]]`); `opencode-mcp watch <id>`
//! then runs inside a tmux server on a private socket, and the pane must show OpenCode's own
//! terminal UI on that task's session (its prompt), while no process on the machine has the
//! server's password on its command line. Also: the credentials file the gateway keeps for
//! `watch` is private and goes with the gateway, and each dead end (unknown task, missing
//! binary, server gone) is one clear line. For a task on an attached server, the password comes
//! from `opencode.password_env`'s variable.

mod support;

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::git::init_repo;
use support::opencode_bin::opencode_bin;
use support::procs;
use support::rig::Rig;
use support::tmux::Tmux;
use support::{FakeLlm, OpenCodeEnv};

/// How long OpenCode's TUI gets to draw the session (it starts a renderer and reads the session
/// over HTTP; on a loaded 2-core machine that takes a few seconds).
const TUI_DEADLINE: Duration = Duration::from_secs(60);
/// Words of the task's prompt that the pane must show (its title is other words, so that they
/// can only come from the session's user message).
const PROMPT_WORDS: &str = "Count the marmalade jars";
const TITLE: &str = "watched pantry task";

/// The rig's isolated environment and its fake LLM's URL: what a subcommand needs to find the
/// gateway's state directory, also once the gateway is gone.
struct Env<'a>(&'a OpenCodeEnv, String);

/// The gateway binary's subcommand `args` in the rig's environment (the gateway's state
/// directory and `opencode.command`), plus `extra` variables.
fn cli_command(rig: &Env, args: &[&str], extra: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_opencode-mcp"));
    cmd.args(args).current_dir(rig.0.work_dir()).env_clear();
    if let Some(path) = std::env::var_os("PATH") {
        cmd.env("PATH", path);
    }
    cmd.envs(rig.0.vars(&rig.1))
        .env("OPENCODE_MCP_OPENCODE__COMMAND", opencode_bin());
    cmd.envs(extra.iter().copied());
    cmd
}

/// Runs `watch` where it must fail before any TUI starts; returns its stderr.
fn watch_fails(rig: &Env, task_id: &str, extra: &[(&str, &str)]) -> String {
    let out: Output = cli_command(rig, &["watch", task_id], extra)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("the gateway binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "watch {task_id} should fail; stdout: {}\nstderr: {stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        out.stdout.is_empty(),
        "a failing watch prints nothing on stdout"
    );
    stderr
}

/// `/proc/<pid>/cmdline` with its NULs as spaces.
fn cmdline(pid: u32) -> Option<String> {
    let bytes = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(String::from_utf8_lossy(&bytes).replace('\0', " "))
}

/// Every process whose command line holds `needle`, as `pid: cmdline`.
fn command_lines_holding(needle: &str) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| Some((pid, cmdline(pid)?)))
        .filter(|(_, line)| line.contains(needle))
        .map(|(pid, line)| format!("{pid}: {line}"))
        .collect()
}

/// The remote addresses of the TCP connections `pids` hold (from their socket fds and
/// `/proc/net/tcp{,6}`), as the kernel writes them (hex).
fn tcp_peers(pids: &BTreeSet<u32>) -> Vec<String> {
    let mut inodes = BTreeSet::new();
    for pid in pids {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.filter_map(Result::ok) {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                let t = target.to_string_lossy();
                if let Some(inode) = t.strip_prefix("socket:[").and_then(|r| r.strip_suffix(']')) {
                    inodes.insert(inode.to_string());
                }
            }
        }
    }
    let mut peers = Vec::new();
    for family in ["tcp", "tcp6"] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/net/{family}")) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.len() > 9 && inodes.contains(cols[9]) && cols[3] != "0A" {
                peers.push(cols[2].to_string());
            }
        }
    }
    peers
}

/// Whether a `/proc/net/tcp{,6}` remote address (`hex ip:hex port`) is on this machine.
fn is_loopback_peer(peer: &str) -> bool {
    let ip = peer.split(':').next().unwrap_or("");
    match ip.len() {
        // 127.0.0.0/8, little-endian: the last byte of the hex is the first octet.
        8 => ip.ends_with("7F"),
        // ::1, or ::ffff:127.x.y.z.
        32 => {
            ip == "00000000000000000000000001000000"
                || (ip.starts_with("0000000000000000FFFF0000") && ip.ends_with("7F"))
        }
        _ => false,
    }
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("stat {}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

/// Polls (bounded) until the task reports `running`.
async fn wait_running(rig: &Rig, task_id: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = rig.status(task_id).await;
        if status["status"] == "running" {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "task {task_id} never ran: {status}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_opens_opencodes_tui_on_the_tasks_session_without_exposing_the_password() {
    let home = OpenCodeEnv::new();
    init_repo(&home.work_dir(), &[("pantry.txt", "jars: ?\n")]);
    let rig = Rig::start_in(FakeLlm::start(), home, &[]).await;
    let server_id = rig.server_id();
    let fake_url = rig.fake.url();
    let env = Env(&rig.env, fake_url.clone());

    // The gateway keeps the managed server's credentials in a private file, and the password in
    // it is the one the server runs with.
    let state_dir = rig.env.root().join("state/opencode-mcp");
    let creds_path = state_dir.join(format!("servers/{server_id}.json"));
    let creds: Value = serde_json::from_slice(
        &std::fs::read(&creds_path)
            .unwrap_or_else(|e| panic!("read {}: {e}", creds_path.display())),
    )
    .expect("the credentials file is JSON");
    let password = creds["password"].as_str().expect("a password").to_string();
    assert!(password.len() >= 32, "{creds}");
    assert_eq!(
        procs::env_var(rig.opencode_pid(), "OPENCODE_SERVER_PASSWORD").as_deref(),
        Some(password.as_str()),
        "the file holds the server's own password"
    );
    assert_eq!(creds["url"], rig.server["url"], "{creds}");
    assert_eq!(mode(&creds_path), 0o600, "{}", creds_path.display());
    assert_eq!(mode(creds_path.parent().expect("dir")), 0o700);
    assert!(
        !rig.client.stderr().contains(&password),
        "the password is in the gateway's log"
    );

    // The dead ends say what is wrong, and nothing starts.
    let unknown = watch_fails(&env, "tsk_nosuchtask", &[]);
    assert!(
        unknown.contains("no task `tsk_nosuchtask`") && unknown.contains("opencode-mcp tasks"),
        "{unknown}"
    );

    // A task that stays busy for the whole test (the fake LLM holds its answer back), in a
    // worktree of its own: the TUI must open the session in that directory.
    let started = rig
        .start_task_with(serde_json::json!({
            "prompt": format!("{PROMPT_WORDS} in the pantry [[delay:300000]]"),
            "title": TITLE,
            "isolation": "worktree",
        }))
        .await;
    let task_id = started["task_id"].as_str().expect("task_id").to_string();
    let worktree = started["workspace"]["path"]
        .as_str()
        .expect("workspace.path")
        .to_string();
    wait_running(&rig, &task_id).await;

    let missing = watch_fails(
        &env,
        &task_id,
        &[("OPENCODE_MCP_OPENCODE__COMMAND", "/nonexistent/opencode")],
    );
    assert!(
        missing.contains("`/nonexistent/opencode` binary was not found")
            && missing.contains("npm install -g opencode-ai@"),
        "{missing}"
    );

    // The real thing: `watch` in a terminal.
    let tmux = Tmux::start(&cli_command(&env, &["watch", &task_id], &[]));
    let deadline = Instant::now() + TUI_DEADLINE;
    let mut pane = String::new();
    // The sidebar shows the session's directory (wrapped over lines: `.../worktrees/` then
    // `<task_id>:<branch>`); the task id appears nowhere else on screen.
    let shows_session = |pane: &str| {
        pane.contains(PROMPT_WORDS)
            && pane.contains(TITLE)
            && pane.contains("worktrees/")
            && pane.contains(task_id.as_str())
    };
    while Instant::now() < deadline {
        pane = tmux.pane();
        if shows_session(&pane) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        shows_session(&pane),
        "the pane never showed the task's prompt ({PROMPT_WORDS}), title ({TITLE}) and \
         worktree ({worktree}) within {TUI_DEADLINE:?}; it shows:\n{pane}\n\
         --- gateway stderr ---\n{}",
        rig.client.stderr()
    );

    // `watch` became `opencode attach` on that session (exec: same pid), with the password in its
    // environment and on no command line anywhere.
    let pid = tmux.pane_pid().expect("the pane's pid");
    let line = cmdline(pid).unwrap_or_default();
    assert!(
        line.contains(" attach ")
            && line.contains(rig.server["url"].as_str().expect("url"))
            && line.contains(&format!(
                "--session {}",
                started["session_id"].as_str().expect("session_id")
            ))
            && line.contains(&format!("--dir {worktree}")),
        "the pane runs: {line}"
    );
    assert_eq!(
        procs::env_var(pid, "OPENCODE_SERVER_PASSWORD").as_deref(),
        Some(password.as_str()),
        "the TUI gets the password through its environment"
    );
    let exposed = command_lines_holding(&password);
    assert!(
        exposed.is_empty(),
        "the password is on a command line: {exposed:?}"
    );
    // The TUI talks to this machine only.
    let mut tree = procs::descendants(pid);
    tree.insert(pid);
    let peers = tcp_peers(&tree);
    assert!(
        !peers.is_empty(),
        "the TUI holds no connection to the server ({})",
        procs::describe(&tree)
    );
    assert!(
        peers.iter().all(|p| is_loopback_peer(p)),
        "the TUI connects off this machine: {peers:?}"
    );
    eprintln!(
        "watch: the TUI showed the session after {:?}",
        TUI_DEADLINE - deadline.saturating_duration_since(Instant::now())
    );

    drop(tmux);

    // A session deleted in OpenCode: `watch` says so rather than open an empty UI.
    let session_id = started["session_id"].as_str().expect("session_id");
    let deleted = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("an HTTP client")
        .delete(format!(
            "{}/session/{session_id}",
            rig.server["url"].as_str().expect("url")
        ))
        .query(&[("directory", worktree.as_str())])
        .basic_auth("opencode", Some(&password))
        .send()
        .await
        .expect("DELETE /session/{id}");
    assert!(deleted.status().is_success(), "{deleted:?}");
    let gone_session = watch_fails(&env, &task_id, &[]);
    assert!(
        gone_session.contains(&format!(
            "session {session_id} of task `{task_id}` no longer exists"
        )),
        "{gone_session}"
    );

    // The server is stopped while its gateway runs on: its credentials file goes with it, and
    // `watch` says which of the two happened.
    rig.ok(
        "opencode_stop_server",
        serde_json::json!({ "server_id": rig.server_id() }),
    )
    .await;
    assert!(
        !creds_path.exists(),
        "{} outlived its server",
        creds_path.display()
    );
    let stopped = watch_fails(&env, &task_id, &[]);
    assert!(
        stopped.contains("the server was stopped (its gateway, pid ")
            && stopped.contains("runs on"),
        "{stopped}"
    );

    // A server running when the gateway exits takes its credentials file along too.
    let second = rig.ok("opencode_start_server", serde_json::json!({})).await;
    let second_creds = state_dir.join(format!(
        "servers/{}.json",
        second["server_id"].as_str().expect("server_id")
    ));
    assert!(second_creds.is_file(), "{}", second_creds.display());

    // The gateway exits, and `watch` now says the server is gone and why.
    let Rig {
        client, env: home, ..
    } = rig;
    client.close().await.expect("the gateway exits cleanly");
    assert!(
        !second_creds.exists(),
        "{} outlived the gateway",
        second_creds.display()
    );
    let gone = watch_fails(&Env(&home, fake_url), &task_id, &[]);
    assert!(
        gone.contains("is not reachable")
            && gone.contains("has exited")
            && gone.contains("must still be running"),
        "{gone}"
    );
}

/// A task on an attached server (`opencode.url`, a server the gateway did not start): `watch`
/// takes the password from the variable `opencode.password_env` names, as the gateway does, and
/// says which variable to set when it is missing or wrong. The exec is checked with a stand-in
/// for `opencode` that records its arguments and environment (the TUI itself is the test above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_on_an_attached_server_is_watched_with_the_password_from_its_variable() {
    let (rig, opencode) = Rig::attached(OpenCodeEnv::new(), &[]).await;
    let env = Env(&rig.env, rig.fake.url());
    let started = rig
        .start_task_with(serde_json::json!({ "prompt": "watched from afar [[delay:300000]]" }))
        .await;
    let task_id = started["task_id"].as_str().expect("task_id").to_string();
    wait_running(&rig, &task_id).await;

    for password in [None, Some("not-the-password")] {
        let extra: Vec<(&str, &str)> = password
            .map(|p| ("OPENCODE_SERVER_PASSWORD", p))
            .into_iter()
            .collect();
        let message = watch_fails(&env, &task_id, &extra);
        assert!(
            message.contains("OPENCODE_SERVER_PASSWORD")
                && message.contains("opencode.password_env")
                && message.contains(opencode.url()),
            "{password:?}: {message}"
        );
    }

    let record = rig.env.root().join("watched.txt");
    let stand_in = rig.env.root().join("opencode-stand-in.sh");
    std::fs::write(
        &stand_in,
        format!(
            "#!/bin/sh\n{{ printf '%s\\n' \"$@\"; echo \"password=$OPENCODE_SERVER_PASSWORD\"; }} > '{}'\n",
            record.display()
        ),
    )
    .expect("write the stand-in");
    std::fs::set_permissions(&stand_in, std::fs::Permissions::from_mode(0o755))
        .expect("chmod the stand-in");
    let extra = [
        ("OPENCODE_SERVER_PASSWORD", opencode.password()),
        (
            "OPENCODE_MCP_OPENCODE__COMMAND",
            stand_in.to_str().expect("a UTF-8 path"),
        ),
    ];
    // Without a terminal it says so and ends, instead of starting a TUI that waits for ever.
    let no_terminal = watch_fails(&env, &task_id, &extra);
    assert!(no_terminal.contains("needs a terminal"), "{no_terminal}");
    assert!(!record.exists(), "nothing was started without a terminal");
    // In a terminal, the exec.
    let tmux = Tmux::start(&cli_command(&env, &["watch", &task_id], &extra));
    // Its last line is the password: the file is complete once that is in.
    let written = || {
        std::fs::read_to_string(&record)
            .ok()
            .filter(|t| t.contains("password="))
    };
    let start = Instant::now();
    while written().is_none() && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let seen = written().unwrap_or_else(|| panic!("the stand-in did not run:\n{}", tmux.pane()));
    let session = started["session_id"].as_str().unwrap_or_default();
    let directory = rig.env.work_dir();
    let expected = format!(
        "attach\n{}\n--session\n{session}\n--dir\n{}\npassword={}\n",
        opencode.url(),
        directory.display(),
        opencode.password()
    );
    assert_eq!(seen, expected);
    rig.ok(
        "opencode_cancel_task",
        serde_json::json!({ "task_id": task_id }),
    )
    .await;
}

//! `opencode-mcp doctor` against the real pinned OpenCode, in an isolated home whose only
//! provider is the fake LLM on 127.0.0.1: the binary is run as a user would run it, and its
//! report and exit code are checked, as is that no OpenCode it started is left running.

mod support;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use support::{opencode_bin, pinned_version, procs, FakeLlm, OpenCodeEnv, OpenCodeServer};

/// Set on every doctor run, with a value unique to the test; every process the doctor starts
/// inherits it, which is how the survivors of a run are found in `/proc`.
const MARKER: &str = "DOCTOR_TEST_RUN";

/// Runs `opencode-mcp doctor <args>` in `env` (only PATH inherited), with the pinned OpenCode as
/// `opencode.command` unless `extra` overrides it.
fn doctor(env: &OpenCodeEnv, fake: &FakeLlm, extra: &[(&str, &str)], args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_opencode-mcp"));
    env.apply(&mut cmd, &fake.url())
        .env("OPENCODE_MCP_OPENCODE__COMMAND", opencode_bin())
        .env(MARKER, env.root())
        .arg("doctor")
        .args(args)
        .stdin(Stdio::null());
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd.output().expect("run opencode-mcp doctor")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn describe(o: &Output) -> String {
    format!(
        "exit {}\n--- stdout ---\n{}--- stderr ---\n{}",
        o.status,
        stdout(o),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The report line of check `name` (`<status> <name>: ...`).
fn line<'a>(text: &'a str, name: &str) -> &'a str {
    text.lines()
        .find(|l| {
            l.split_once(' ')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with(&format!("{name}:")))
        })
        .unwrap_or_else(|| panic!("no `{name}` line in:\n{text}"))
}

/// Live processes that carry this env's marker: what the doctor left behind once it exited.
fn leftovers(env: &OpenCodeEnv) -> Vec<String> {
    let marker = env.root().display().to_string();
    procs::all()
        .into_iter()
        .filter(|p| p.is_live() && procs::env_var(p.pid, MARKER).as_deref() == Some(&marker))
        .map(|p| format!("{} {}", p.pid, p.comm))
        .collect()
}

/// Everything in place: the pinned binary, the fake provider, a creatable state dir. Exit 0, and
/// the throwaway server is gone when the doctor is.
#[test]
fn a_working_setup_passes_and_leaves_no_server_behind() {
    let fake = FakeLlm::start();
    let env = OpenCodeEnv::new();
    let out = doctor(&env, &fake, &[], &[]);
    let text = stdout(&out);
    assert!(out.status.success(), "{}", describe(&out));

    let opencode = line(&text, "opencode");
    assert!(opencode.starts_with("ok "), "{opencode}");
    assert!(
        opencode.contains(&format!("found {}", opencode_bin().display())),
        "{opencode}"
    );
    assert!(
        opencode.contains(&format!("version {}", pinned_version())),
        "{opencode}"
    );
    assert_eq!(pinned_version(), "1.18.33");

    let providers = line(&text, "providers");
    assert!(providers.starts_with("ok "), "{providers}");
    // fake/fake-model and fake/fake-strong, nothing else (the env enables only `fake`).
    assert!(
        providers.contains("2 model(s) from 1 provider(s): fake;"),
        "{providers}"
    );
    // The built-in tiers list no models: each means the server's default, which exists here.
    for tier in ["fast", "standard", "strong"] {
        let l = line(&text, &format!("tier {tier}"));
        assert!(l.starts_with("ok ") && l.contains("default model"), "{l}");
    }
    let state = line(&text, "state dir");
    assert!(state.starts_with("ok "), "{state}");
    assert!(
        state.contains(&env.root().join("state/opencode-mcp").display().to_string()),
        "{state}"
    );
    assert!(
        text.contains(&format!(
            "claude mcp add opencode -- {}",
            Path::new(env!("CARGO_BIN_EXE_opencode-mcp"))
                .canonicalize()
                .expect("canonical binary path")
                .display()
        )),
        "{text}"
    );
    assert!(
        text.contains("default_tools_approval_mode = \"approve\""),
        "{text}"
    );
    let left = leftovers(&env);
    assert!(
        left.is_empty(),
        "the doctor left processes running: {left:?}"
    );
    assert_leftovers_are_seen(&env);
}

/// The leftover search is not blind: a process started with the marker is found.
fn assert_leftovers_are_seen(env: &OpenCodeEnv) {
    let mut probe = Command::new("sleep")
        .arg("60")
        .env(MARKER, env.root())
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn sleep");
    let seen = leftovers(env);
    let _ = probe.kill();
    let _ = probe.wait();
    assert!(
        seen.iter()
            .any(|p| p.starts_with(&format!("{} ", probe.id()))),
        "a marked process was not found: {seen:?}"
    );
}

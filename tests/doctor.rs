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
    let mut all = vec!["doctor"];
    all.extend_from_slice(args);
    cli(env, fake, extra, &all)
}

/// Runs `opencode-mcp <args>` as [`doctor`] does.
fn cli(env: &OpenCodeEnv, fake: &FakeLlm, extra: &[(&str, &str)], args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_opencode-mcp"));
    env.apply(&mut cmd, &fake.url())
        .env("OPENCODE_MCP_OPENCODE__COMMAND", opencode_bin())
        .env(MARKER, env.root())
        .args(args)
        .stdin(Stdio::null());
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd.output().expect("run opencode-mcp")
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
    // The built-in tiers list no models: each runs the server's default, which exists here, so
    // delegating saves nothing yet: a warning, whose fix names the scripted catalog's models.
    for tier in ["fast", "standard", "strong"] {
        let l = line(&text, &format!("tier {tier}"));
        assert!(l.starts_with("warn ") && l.contains("default model"), "{l}");
        let at = text.find(l).unwrap_or_default() + l.len();
        let fix = text[at..].lines().nth(1).unwrap_or_default();
        assert!(
            fix.contains("fix:")
                && fix.contains(&format!("tier `{tier}`"))
                && fix.contains("fake/"),
            "{fix}"
        );
    }
    let sandbox = line(&text, "sandbox");
    assert!(
        sandbox.starts_with("ok ") && sandbox.contains("bwrap") && sandbox.contains("network off"),
        "{sandbox}"
    );
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

/// Confinement turned off is a warning, with the way back on; it does not fail the doctor.
#[test]
fn sandbox_off_is_a_warning_with_its_fix() {
    let fake = FakeLlm::start();
    let env = OpenCodeEnv::new();
    let out = doctor(&env, &fake, &[("OPENCODE_MCP_SANDBOX__MODE", "off")], &[]);
    let text = stdout(&out);
    assert!(out.status.success(), "{}", describe(&out));
    let sandbox = line(&text, "sandbox");
    assert!(
        sandbox.starts_with("warn ") && sandbox.contains("run as you"),
        "{sandbox}"
    );
    assert!(
        text.contains("sandbox: {mode: off}"),
        "the fix names the setting: {text}"
    );
}

/// The leftover search is not blind: a process started with the marker is found.
fn assert_leftovers_are_seen(env: &OpenCodeEnv) {
    let mut probe = Command::new("sleep")
        .arg("60")
        .env(MARKER, env.root())
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn sleep");
    // Right after spawn the child may not have exec'd yet, and until it has, its environment
    // is still this process's (no marker): look until it shows, with a bound.
    let mine = format!("{} ", probe.id());
    let start = std::time::Instant::now();
    let seen = loop {
        let seen = leftovers(env);
        if seen.iter().any(|p| p.starts_with(&mine))
            || start.elapsed() > std::time::Duration::from_secs(10)
        {
            break seen;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let _ = probe.kill();
    let _ = probe.wait();
    assert!(
        seen.iter().any(|p| p.starts_with(&mine)),
        "a marked process was not found: {seen:?}"
    );
}

/// The configured binary does not exist: a blocker naming the path and the fix; nothing is
/// started. The state dir check still runs, and a directory others can read is a warning with
/// its chmod, not a blocker.
#[test]
fn a_missing_binary_is_a_blocker_with_its_fix() {
    use std::os::unix::fs::PermissionsExt;
    let fake = FakeLlm::start();
    let env = OpenCodeEnv::new();
    let state = env.root().join("shared-state");
    std::fs::create_dir(&state).expect("create the state dir");
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).expect("chmod 755");
    let state = state.display().to_string();
    let out = doctor(
        &env,
        &fake,
        &[
            ("OPENCODE_MCP_OPENCODE__COMMAND", "/nonexistent/opencode"),
            ("OPENCODE_MCP_STATE_DIR", &state),
        ],
        &[],
    );
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let opencode = line(&text, "opencode");
    assert!(opencode.starts_with("FAIL "), "{opencode}");
    assert!(opencode.contains("`/nonexistent/opencode`"), "{opencode}");
    assert!(opencode.contains("not found"), "{opencode}");
    assert!(
        text.contains(&format!(
            "fix: npm install -g opencode-ai@{}, or set opencode.command",
            pinned_version()
        )),
        "{text}"
    );
    assert!(text.contains("OPENCODE_MCP_OPENCODE__COMMAND"), "{text}");
    assert!(line(&text, "providers").starts_with("skip "), "{text}");
    let state_line = line(&text, "state dir");
    assert!(state_line.starts_with("warn "), "{state_line}");
    assert!(text.contains(&format!("fix: chmod 700 {state}")), "{text}");
    assert!(leftovers(&env).is_empty());
}

/// A repository tier whose only model the server does not offer: a blocker naming the tier, its
/// model and some offered ones; the JSON report says the same.
#[test]
fn a_tier_without_an_offered_model_is_a_blocker() {
    let fake = FakeLlm::start();
    let env = OpenCodeEnv::new();
    std::fs::write(
        env.work_dir().join("delegation.yaml"),
        "tiers:\n  - name: fast\n    handles: x\n    models: [nope/none]\n  - name: strong\n    \
         handles: y\n    models: [nope/other, fake/fake-strong]\n",
    )
    .expect("write delegation.yaml");
    let out = doctor(&env, &fake, &[], &["--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let report: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", describe(&out)));
    assert_eq!(report["ok"], false, "{report:#}");
    let checks = report["checks"].as_array().expect("checks");
    let check = |name: &str| {
        checks
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no `{name}` check in {report:#}"))
    };
    assert_eq!(check("opencode")["status"], "ok", "{report:#}");
    assert_eq!(check("providers")["status"], "ok", "{report:#}");
    let fast = check("tier fast");
    assert_eq!(fast["status"], "fail", "{fast:#}");
    let detail = fast["detail"].as_str().expect("detail");
    assert!(detail.contains("nope/none"), "{detail}");
    assert!(detail.contains("fake/fake-model"), "{detail}");
    let fix = fast["fix"].as_str().expect("a fix");
    assert!(fix.contains("tier `fast`"), "{fix}");
    // The second tier resolves to its first offered model, as start_task would.
    let strong = check("tier strong");
    assert_eq!(strong["status"], "ok", "{strong:#}");
    assert!(
        strong["detail"]
            .as_str()
            .is_some_and(|d| d.contains("fake/fake-strong")),
        "{strong:#}"
    );
    // Only the failed tier fails.
    let failed: Vec<&str> = checks
        .iter()
        .filter(|c| c["status"] == "fail")
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(failed, ["tier fast"], "{report:#}");
    assert!(leftovers(&env).is_empty(), "{:?}", leftovers(&env));
}

/// Attach mode (`opencode.url`): the configured server is checked (reachable, its version) and
/// its models read; nothing is spawned, and the attached server keeps running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_mode_checks_the_configured_server() {
    let fake = FakeLlm::start();
    let env = OpenCodeEnv::new();
    let server = OpenCodeServer::start(&env, &fake.url()).await;
    let url = server.url().to_string();
    let password = server.password().to_string();
    let out = tokio::task::block_in_place(|| {
        doctor(
            &env,
            &fake,
            &[
                ("OPENCODE_MCP_OPENCODE__URL", url.as_str()),
                ("OPENCODE_MCP_OPENCODE__COMMAND", "/nonexistent/opencode"),
                ("OPENCODE_SERVER_PASSWORD", password.as_str()),
            ],
            &[],
        )
    });
    let text = stdout(&out);
    assert!(out.status.success(), "{}", describe(&out));
    let opencode = line(&text, "opencode");
    assert!(opencode.starts_with("ok "), "{opencode}");
    assert!(
        opencode.contains(&format!("attached to {url}")),
        "{opencode}"
    );
    assert!(
        opencode.contains(&format!("version {}", pinned_version())),
        "{opencode}"
    );
    assert!(line(&text, "providers").starts_with("ok "), "{text}");
    assert!(
        procs::stat(server.pid()).is_some_and(|p| p.is_live()),
        "the attached server was stopped"
    );
    assert!(leftovers(&env).is_empty(), "{:?}", leftovers(&env));

    // A wrong password: the opencode line fails with the reason and what to change.
    let out = tokio::task::block_in_place(|| {
        doctor(
            &env,
            &fake,
            &[
                ("OPENCODE_MCP_OPENCODE__URL", url.as_str()),
                ("OPENCODE_SERVER_PASSWORD", "wrong"),
            ],
            &[],
        )
    });
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let opencode = line(&text, "opencode");
    assert!(
        opencode.starts_with("FAIL ") && opencode.contains("401"),
        "{opencode}"
    );
}

/// **Cheap by default in one step**, as the Quick start runs it on a new machine: `init` reads
/// OpenCode's catalog (here the scripted provider's), proposes its capable models cheapest tier
/// first, shows them, and writes nothing without `--yes` when no terminal can confirm. With
/// `--yes` it writes the user's own file (never the repository's, whose own tiers it does not
/// take either), which `check-config`
/// accepts and `doctor` then resolves each tier from. Run again, it leaves the tiers alone;
/// `--replace-tiers` replaces them and keeps the rest of the file. No OpenCode outlives it.
#[test]
fn init_writes_cheap_tiers_into_the_users_file() {
    let fake = FakeLlm::start();
    let env = OpenCodeEnv::new();
    let user = env.root().join("config/opencode-mcp/delegation.yaml");
    let repository = env.work_dir().join("delegation.yaml");

    let shown = cli(&env, &fake, &[], &["init"]);
    let text = stdout(&shown);
    assert!(shown.status.success(), "{}", describe(&shown));
    assert!(
        text.contains("fake/fake-model") && text.contains("Not written"),
        "{}",
        describe(&shown)
    );
    assert!(!user.exists(), "written without --yes");

    // The repository it runs in declares tiers of its own: they are not what goes into the
    // user's file (every other repository would then trust them).
    let planted = "tiers:\n  - name: planted\n    handles: obey this repository\n    models: [fake/fake-strong]\n";
    std::fs::write(&repository, planted).expect("the repository's file");
    let wrote = cli(&env, &fake, &[], &["init", "--yes"]);
    assert!(wrote.status.success(), "{}", describe(&wrote));
    assert_eq!(
        std::fs::read_to_string(&repository).expect("read"),
        planted,
        "the repository's file changed"
    );
    std::fs::remove_file(&repository).expect("remove the repository's file");
    let written = std::fs::read_to_string(&user).expect("the user's file");
    assert!(
        !written.contains("planted") && !written.contains("obey"),
        "{written}"
    );
    let tiers: serde_json::Value = yaml_serde::from_str(&written).expect("YAML");
    assert_eq!(tiers["tiers"][0]["name"], "fast", "{written}");
    assert_eq!(
        tiers["tiers"][0]["models"][0], "fake/fake-model",
        "{written}"
    );
    assert_eq!(
        tiers["tiers"][2]["models"][0], "fake/fake-strong",
        "{written}"
    );

    let checked = cli(&env, &fake, &[], &["check-config"]);
    assert!(checked.status.success(), "{}", describe(&checked));
    let report = doctor(&env, &fake, &[], &[]);
    let text = stdout(&report);
    let fast = line(&text, "tier fast");
    assert!(
        fast.starts_with("ok ") && fast.contains("fake/fake-model"),
        "{fast}"
    );
    // With its price from the catalog (the scripted provider's: 1 in, 2 out).
    assert!(fast.contains("$3.00/M tokens in+out"), "{fast}");

    // Set already: left alone.
    let mine = format!("limits:\n  queue: 3\n{written}");
    std::fs::write(&user, &mine).expect("edit the user's file");
    let again = cli(&env, &fake, &[], &["init", "--yes"]);
    assert!(again.status.success(), "{}", describe(&again));
    assert!(
        stdout(&again).contains("left as they are"),
        "{}",
        describe(&again)
    );
    assert_eq!(std::fs::read_to_string(&user).expect("read"), mine);

    let replaced = cli(&env, &fake, &[], &["init", "--yes", "--replace-tiers"]);
    assert!(replaced.status.success(), "{}", describe(&replaced));
    let now = std::fs::read_to_string(&user).expect("read");
    assert!(now.starts_with("limits:\n  queue: 3\n"), "{now}");
    let back: serde_json::Value = yaml_serde::from_str(&now).expect("YAML");
    assert_eq!(back["tiers"][0]["models"][0], "fake/fake-model", "{now}");
    assert_eq!(leftovers(&env), Vec::<String>::new());
}

//! Confinement as an attacker sees it: a real gateway over MCP stdio, a real OpenCode, real
//! bubblewrap, and the scripted model playing a hostile agent. Nothing here turns the sandbox
//! on: it is the default, so these tasks start the way a user starts one.
//!
//! The hostile agent, in a worktree task, tries each way out the sandbox must close (writes
//! outside its worktree, the user's secrets, the environment, the gateway's pid, a loopback
//! port, its worktree's `.git` and the origin's git dir through bash and through OpenCode's
//! own write tool, a sibling task's worktree and `~` through `workdir`), and a check does the
//! same. In the same run an honest task writes, builds a small crate offline and tests it in
//! its worktree, and completes with its check passed.
//!
//! The environment lives outside /tmp (see `support::isolation::test_tmp`): a confined command
//! gets a private /tmp, so secrets planted there would be out of sight anyway and prove nothing.

mod support;

use std::io::Read;
use std::path::{Path, PathBuf};

use serde_json::json;
use support::git::{git, init_repo};
use support::rig::Rig;
use support::{FakeLlm, OpenCodeEnv};

const PLANTED: &str = "PLANTED-SECRET";

/// The real toolchain homes, so the honest task's `cargo` works under the isolated `$HOME`.
fn toolchain_env() -> Vec<(String, String)> {
    let home = PathBuf::from(std::env::var("HOME").expect("HOME"));
    let pick = |var: &str, rel: &str| {
        std::env::var(var).unwrap_or_else(|_| home.join(rel).to_string_lossy().into_owned())
    };
    vec![
        ("CARGO_HOME".into(), pick("CARGO_HOME", ".cargo")),
        ("RUSTUP_HOME".into(), pick("RUSTUP_HOME", ".rustup")),
    ]
}

fn plant(path: &Path, content: &str) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("dirs");
    std::fs::write(path, content).expect("plant");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_agent_and_its_check_stay_in_their_worktree_while_an_honest_task_builds() {
    let env = OpenCodeEnv::new();
    let work = env.work_dir();
    init_repo(
        &work,
        &[
            (
                "Cargo.toml",
                "[package]\nname = \"tiny\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
            ),
            (
                "src/main.rs",
                "fn main() { println!(\"hi\"); }\n#[test]\nfn adds() { assert_eq!(1 + 1, 2); }\n",
            ),
            (".gitignore", "target/\n"),
        ],
    );
    let home = env.home_dir();
    let state = env.root().join("state/opencode-mcp");
    plant(&home.join(".ssh/id_ed25519"), &format!("{PLANTED}-ssh"));
    plant(&home.join(".aws/credentials"), &format!("{PLANTED}-aws"));
    plant(
        &state.join("planted-worker.json"),
        &format!("{PLANTED}-state"),
    );
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listener");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().expect("addr").port();

    let toolchain = toolchain_env();
    let mut extra: Vec<(&str, &str)> = toolchain
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    extra.push(("PLANTED_PROVIDER_KEY", "sk-PLANTED-SECRET-env"));
    // The honest task names the user's check; the attacker's check is a command of the call's
    // own, which the user's layers allow here.
    extra.push((
        "OPENCODE_MCP_CHECKS__NAMED__TEST",
        "cargo test --offline -q",
    ));
    extra.push(("OPENCODE_MCP_CHECKS__FROM_CALLS", "true"));
    let rig = Rig::start_in(FakeLlm::start(), env, &extra).await;
    let gateway = rig.client.pid().expect("gateway pid");

    // The honest task: writes, builds and tests in its worktree; its check builds too.
    let honest = rig
        .start_task_with(json!({
            "prompt": "build it [[bash:echo honest > result.txt && cargo build --offline -q && cargo test --offline -q 2>&1 | tail -3]]",
            "isolation": "worktree",
            "checks": ["test"],
        }))
        .await;
    let honest_id = honest["task_id"].as_str().expect("id").to_string();
    let honest_session = honest["session_id"].as_str().expect("session").to_string();
    let sibling = honest["workspace"]["path"]
        .as_str()
        .expect("the honest task's worktree")
        .to_string();

    let origin_git = work.join(".git");
    let attacks = [
        format!("[[bash:echo x > {}/owned]]", home.display()),
        format!("[[bash:echo x > {}/owned-origin]]", work.display()),
        format!(
            "[[bash:cat {h}/.ssh/id_ed25519 {h}/.aws/credentials {s}/planted-worker.json]]",
            h = home.display(),
            s = state.display()
        ),
        "[[bash:env]]".to_string(),
        format!("[[bash:kill -9 {gateway}]]"),
        format!("[[bash:exec 3<>/dev/tcp/127.0.0.1/{port} && echo CONNECTED]]"),
        "[[bash:echo 'gitdir: /elsewhere' > .git]]".to_string(),
        format!(
            "[[bash:echo 'echo pwned' > {}/hooks/pre-commit]]",
            origin_git.display()
        ),
        "[[bash:git config core.hooksPath /elsewhere]]".to_string(),
        format!(
            "[[write:{}/hooks/post-commit:echo pwned]]",
            origin_git.display()
        ),
        "[[write:.git:gitdir /elsewhere]]".to_string(),
        format!("[[bashin:{sibling}:touch from-attacker]]"),
        format!("[[bashin:{}:touch from-attacker]]", home.display()),
        "[[bash:echo mine > mine.txt]]".to_string(),
    ];
    let check = format!(
        "cat {h}/.ssh/id_ed25519; env; echo x > {h}/owned-by-check; kill -9 {gateway}; \
         echo 'echo pwned' > {g}/hooks/pre-push; \
         bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port}' && echo CONNECTED; test -f mine.txt",
        h = home.display(),
        g = origin_git.display(),
    );
    let hostile = rig
        .start_task_with(json!({
            "prompt": format!("attack {}", attacks.join(" ")),
            "isolation": "worktree",
            "checks": [check],
        }))
        .await;
    let hostile_id = hostile["task_id"].as_str().expect("id").to_string();
    let session = hostile["session_id"].as_str().expect("session").to_string();
    let worktree = PathBuf::from(hostile["workspace"]["path"].as_str().expect("worktree"));
    let pointer = std::fs::read_to_string(worktree.join(".git")).expect("the .git pointer");

    let done = rig.finish(&hostile_id).await;
    let honest = rig.finish(&honest_id).await;

    // The honest task did its work and its check passed, confined.
    assert_eq!(honest["status"], "completed", "{honest}");
    assert_eq!(honest["checks"]["status"], "passed", "{honest}");
    assert_eq!(
        honest["checks"]["commands"],
        json!(["cargo test --offline -q"]),
        "the named check's command ran: {honest}"
    );
    assert_eq!(honest["confined"], true, "{honest}");
    let honest_out = rig.tool_outputs(&honest_session);
    assert!(honest_out.contains("test result: ok"), "{honest_out}");
    assert_eq!(
        std::fs::read_to_string(Path::new(&sibling).join("result.txt")).expect("result.txt"),
        "honest\n"
    );

    // The hostile task ran confined, and everything it tried failed.
    assert_eq!(done["confined"], true, "{done}");
    assert_eq!(
        done["checks"]["status"], "passed",
        "its own work was kept: {done}"
    );
    support::held::agent_was_held(
        &rig.tool_outputs(&session),
        &[
            PLANTED,
            "CONNECTED",
            "OPENCODE_SERVER_PASSWORD",
            "OPENCODE_CONFIG_CONTENT",
            "PLANTED_PROVIDER_KEY",
        ],
    );
    support::held::check_was_held(&done, &[PLANTED, "PLANTED_PROVIDER_KEY", "CONNECTED"]);

    for path in [
        home.join("owned"),
        home.join("owned-by-check"),
        home.join("from-attacker"),
        work.join("owned-origin"),
        origin_git.join("hooks/pre-commit"),
        origin_git.join("hooks/post-commit"),
        origin_git.join("hooks/pre-push"),
        Path::new(&sibling).join("from-attacker"),
    ] {
        assert!(!path.exists(), "the agent wrote {}", path.display());
    }
    assert_eq!(
        std::fs::read_to_string(worktree.join(".git")).expect("pointer"),
        pointer,
        "the worktree's .git pointer was rewritten"
    );
    let config = git(&work, &["config", "--list", "--local"]);
    assert!(!config.contains("hookspath"), "{config}");
    assert_eq!(
        std::fs::read_to_string(worktree.join("mine.txt")).expect("its own file"),
        "mine\n"
    );
    // Nothing connected to the loopback port, and the gateway still answers.
    let mut accepted = listener.accept().ok();
    if let Some((stream, _)) = accepted.as_mut() {
        let mut buf = [0u8; 1];
        let _ = stream.read(&mut buf);
    }
    assert!(
        accepted.is_none(),
        "a confined command reached a loopback port"
    );
    assert!(support::rig::alive(gateway));
    let status = rig.status(&hostile_id).await;
    assert_eq!(status["confined"], true, "{status}");
}

/// bubblewrap works for a user without privileges (CI runs as root, users do not): the
/// confining shell, run as `nobody` through `setpriv`, confines a command to its root.
#[test]
fn the_confining_shell_confines_an_unprivileged_user() {
    let base = support::isolation::test_tmp();
    let dir = tempfile::tempdir_in(&base).expect("tempdir");
    let root = dir.path().join("root");
    let home = dir.path().join("home");
    std::fs::create_dir_all(&root).expect("root");
    plant(&home.join(".ssh/id_ed25519"), PLANTED);
    let bwrap = which("bwrap").expect(
        "the sandbox tests need bubblewrap: `apt-get install bubblewrap` (.ci/run installs it)",
    );
    let policy = json!({
        "bwrap": bwrap,
        "network": false,
        "hide": [home.join(".ssh")],
        "caches": [],
        "env": ["PATH", "HOME"],
        "roots": [root],
    });
    let policy_file = dir.path().join("policy.json");
    std::fs::write(&policy_file, policy.to_string()).expect("policy");
    let built = env!("CARGO_BIN_EXE_opencode-mcp");
    // SAFETY: geteuid only reads the process's credentials.
    let root_uid = unsafe { libc::geteuid() } == 0;
    // A copy the user can run: the build's own may lie in a directory only root may enter (a
    // clone in `mktemp -d`).
    let exe = dir.path().join("opencode-mcp");
    std::fs::copy(built, &exe).expect("copy the binary");
    let mut cmd = if root_uid {
        // The files it needs must be the user's, as they would be.
        let chown = std::process::Command::new("chown")
            .args(["-R", "65534:65534"])
            .arg(dir.path())
            .status()
            .expect("chown");
        assert!(chown.success());
        for d in [dir.path(), base.as_path()] {
            let _ = std::process::Command::new("chmod")
                .arg("o+x")
                .arg(d)
                .status();
        }
        let mut c = std::process::Command::new("setpriv");
        c.args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--reset-env",
        ]);
        c.arg(&exe);
        c
    } else {
        std::process::Command::new(&exe)
    };
    cmd.arg("__sandbox-shell")
        .arg(&policy_file)
        .arg("-c")
        .arg(format!(
            "echo inside > ok.txt; cat {}/.ssh/id_ed25519; echo x > {}/owned; echo $$",
            home.display(),
            home.display()
        ))
        .current_dir(&root)
        .env("HOME", &home);
    let out = cmd
        .output()
        .expect("run the confining shell (setpriv comes with util-linux)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(root.join("ok.txt")).expect("it wrote in its root: {text}"),
        "inside\n",
        "{text}"
    );
    assert!(!text.contains(PLANTED), "{text}");
    assert!(!home.join("owned").exists(), "{text}");
    assert!(text.contains("Read-only file system"), "{text}");
    assert!(
        text.lines().any(|l| l.trim() == "2"),
        "its own pid namespace (the shell is pid 2 under bwrap): {text}"
    );

    // A directory of no task is refused, saying why.
    let refused = std::process::Command::new(&exe)
        .arg("__sandbox-shell")
        .arg(&policy_file)
        .arg("-c")
        .arg("touch escaped")
        .current_dir(dir.path())
        .output()
        .expect("run");
    assert_eq!(refused.status.code(), Some(126));
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(why.contains("outside this task's directory"), "{why}");
    assert!(!dir.path().join("escaped").exists());
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// An `isolation: none` task in a subdirectory of a repository: it writes only there. OpenCode
/// itself judges a `workdir` against the git root (the repository's top is "inside" for it), so
/// the confining shell's own root is what refuses the top; and the repository's `.git` is
/// read-only, so the agent cannot commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_in_a_subdirectory_writes_only_there_and_cannot_commit() {
    let env = OpenCodeEnv::new();
    let work = env.work_dir();
    init_repo(&work, &[("README", "top\n"), ("sub/keep", "sub\n")]);
    let sub = work.join("sub");
    let rig = Rig::start_in(FakeLlm::start(), env, &[]).await;
    let prompts = [
        "[[bash:echo inside > inside.txt]]".to_string(),
        "[[bash:echo x > ../escaped-up]]".to_string(),
        format!("[[bashin:{}:touch escaped-top]]", work.display()),
        "[[bash:git add -A && git commit -qm pwned && echo COMMITTED]]".to_string(),
    ];
    let started = rig
        .start_task_with(json!({
            "prompt": format!("work {}", prompts.join(" ")),
            "directory": sub.display().to_string(),
        }))
        .await;
    let id = started["task_id"].as_str().expect("id").to_string();
    let session = started["session_id"].as_str().expect("session").to_string();
    let done = rig.finish(&id).await;
    assert_eq!(done["confined"], true, "{done}");
    let out = rig.tool_outputs(&session);
    assert_eq!(
        std::fs::read_to_string(sub.join("inside.txt")).expect("inside.txt"),
        "inside\n"
    );
    assert!(!work.join("escaped-up").exists(), "{out}");
    assert!(!work.join("escaped-top").exists(), "{out}");
    assert!(out.contains("outside this task's directory"), "{out}");
    assert!(!out.contains("COMMITTED"), "{out}");
    assert_eq!(
        git(&work, &["rev-list", "--count", "HEAD"]).trim(),
        "1",
        "the agent committed: {out}"
    );
}

/// **A tier the user lets run unconfined.** The user's own file sets `sandbox: off` on one
/// tier: that task's commands and its check run as the user (their writes outside the worktree
/// land), and it is reported unconfined naming the tier. A task of another tier on the same
/// OpenCode, at the same time, stays confined, and so does its check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tier_the_user_lets_run_unconfined_runs_so_and_no_other() {
    let env = OpenCodeEnv::new();
    let work = env.work_dir();
    init_repo(&work, &[("README", "x\n")]);
    let home = env.home_dir();
    let user_file = env.root().join("user-delegation.yaml");
    std::fs::write(
        &user_file,
        "checks:\n  from_calls: true\ntiers:\n  - name: loose\n    handles: trusted chores\n    \
         sandbox: off\n  - name: tight\n    handles: everything else\n",
    )
    .expect("the user's file");
    let config = user_file.display().to_string();
    let rig = Rig::start_in(
        FakeLlm::start(),
        env,
        &[("OPENCODE_MCP_CONFIG", config.as_str())],
    )
    .await;
    let start = |tier: &str, name: &str| {
        json!({
            "prompt": format!("[[bash:echo x > {}/{name}]]", home.display()),
            "tier": tier,
            "isolation": "worktree",
            "checks": [format!("echo y > {}/{name}-by-check", home.display())],
        })
    };
    let loose = rig.start_task_with(start("loose", "opened")).await;
    let tight = rig.start_task_with(start("tight", "closed")).await;
    let loose = rig.finish(loose["task_id"].as_str().expect("id")).await;
    let tight = rig.finish(tight["task_id"].as_str().expect("id")).await;

    assert_eq!(loose["confined"], false, "{loose}");
    let why = loose["unconfined"].as_str().unwrap_or_default();
    assert!(
        why.contains("tier loose") && why.contains("sandbox: off"),
        "{loose}"
    );
    assert!(home.join("opened").exists(), "{loose}");
    assert_eq!(loose["checks"]["status"], "passed", "{loose}");
    assert!(home.join("opened-by-check").exists(), "{loose}");

    assert_eq!(tight["confined"], true, "{tight}");
    assert!(!home.join("closed").exists(), "{tight}");
    assert_eq!(tight["checks"]["status"], "failed", "{tight}");
    assert!(!home.join("closed-by-check").exists(), "{tight}");
}

/// **A subagent is held like its parent.** The hostile agent hands the work to a subagent (a
/// child session, which the gateway did not create): the child's own write tool and its bash try
/// to write outside the worktree and into the worktree's `.git`, and fail the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subagent_stays_in_its_parents_worktree() {
    let env = OpenCodeEnv::new();
    let work = env.work_dir();
    init_repo(&work, &[("README", "x\n")]);
    let home = env.home_dir();
    let rig = Rig::start_in(FakeLlm::start(), env, &[]).await;
    let child = [
        format!("{{{{write:{}/owned-by-child:x}}}}", home.display()),
        "{{write:.git:gitdir /elsewhere}}".to_string(),
        format!(
            "{{{{bash:echo x > {}/owned-by-child-bash}}}}",
            home.display()
        ),
        "{{write:child.txt:mine}}".to_string(),
    ];
    let started = rig
        .start_task_with(json!({
            "prompt": format!("delegate [[task:general:{}]]", child.join(" ")),
            "isolation": "worktree",
        }))
        .await;
    let id = started["task_id"].as_str().expect("id").to_string();
    let worktree = PathBuf::from(started["workspace"]["path"].as_str().expect("worktree"));
    let pointer = std::fs::read_to_string(worktree.join(".git")).expect("pointer");
    let done = rig.finish(&id).await;
    assert_eq!(done["confined"], true, "{done}");
    assert_eq!(
        std::fs::read_to_string(worktree.join("child.txt")).expect("the child's own file"),
        "mine"
    );
    assert!(!home.join("owned-by-child").exists(), "{done}");
    assert!(!home.join("owned-by-child-bash").exists(), "{done}");
    assert_eq!(
        std::fs::read_to_string(worktree.join(".git")).expect("pointer"),
        pointer,
        "the child rewrote the .git pointer"
    );
}

/// **The whole path as a user without privileges.** CI runs as root, users do not: here the
/// gateway, its OpenCode and so every agent command and check run as `nobody` (through
/// `setpriv`), with a home, a repository and a state directory of that user's. A worktree
/// task's agent writes its own file and fails to write its user's home (writable to that user,
/// so only the sandbox stops it); its check does the same; the task is reported confined. As a
/// user without privileges already, the test runs the same path as that user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unprivileged_user_gets_the_same_confinement_end_to_end() {
    let env = OpenCodeEnv::new();
    let work = env.work_dir();
    init_repo(&work, &[("README", "x\n")]);
    let home = env.home_dir();
    // SAFETY: geteuid only reads the process's credentials.
    let as_root = unsafe { libc::geteuid() } == 0;
    let bin = env.root().join("bin");
    std::fs::create_dir_all(&bin).expect("bin dir");
    if as_root {
        let chown = std::process::Command::new("chown")
            .args(["-R", "65534:65534"])
            .arg(env.root())
            .status()
            .expect("chown");
        assert!(chown.success());
        let _ = std::process::Command::new("chmod")
            .arg("o+x")
            .arg(support::isolation::test_tmp())
            .status();
    }
    // Binaries the user can reach (the build's may lie under a directory only root may enter):
    // linked in, or copied where a link cannot be made.
    let reachable = |from: &Path, name: &str| {
        // The file itself: a link to a link (npm's `.bin`) would dangle.
        let from = from.canonicalize().expect("a binary");
        let to = bin.join(name);
        if std::fs::hard_link(&from, &to).is_err() {
            std::fs::copy(&from, &to).expect("copy a binary");
        }
        to
    };
    let gateway = reachable(
        Path::new(env!("CARGO_BIN_EXE_opencode-mcp")),
        "opencode-mcp",
    );
    let opencode = reachable(&support::opencode_bin::opencode_bin(), "opencode");
    let opencode_var = opencode.display().to_string();
    let rig = Rig::start_launched(
        FakeLlm::start(),
        env,
        &[
            ("OPENCODE_MCP_OPENCODE__COMMAND", opencode_var.as_str()),
            ("OPENCODE_MCP_CHECKS__FROM_CALLS", "true"),
        ],
        |launch| match as_root {
            true => launch
                .bin("setpriv")
                .arg("--reuid=65534")
                .arg("--regid=65534")
                .arg("--clear-groups")
                .arg(&gateway),
            false => launch.bin(&gateway),
        },
    )
    .await;
    let started = rig
        .start_task_with(json!({
            "prompt": format!(
                "[[bash:echo mine > mine.txt]] [[bash:echo x > {}/owned; id -u]]",
                home.display()
            ),
            "isolation": "worktree",
            "checks": [format!("echo x > {}/owned-by-check; test -f mine.txt", home.display())],
        }))
        .await;
    let id = started["task_id"].as_str().expect("id").to_string();
    let session = started["session_id"].as_str().expect("session").to_string();
    let worktree = PathBuf::from(started["workspace"]["path"].as_str().expect("worktree"));
    let done = rig.finish(&id).await;
    let out = rig.tool_outputs(&session);
    assert_eq!(done["confined"], true, "{done}");
    assert_eq!(done["checks"]["status"], "passed", "{done}");
    assert_eq!(
        std::fs::read_to_string(worktree.join("mine.txt")).expect("its own file"),
        "mine\n"
    );
    assert!(out.contains("Read-only file system"), "{out}");
    if as_root {
        assert!(out.contains("65534"), "the agent ran as nobody: {out}");
    }
    assert!(!home.join("owned").exists(), "{out}");
    assert!(!home.join("owned-by-check").exists(), "{done}");
}

/// **An OpenCode that drops the confining shell.** A wrapper around `opencode` that sets
/// `OPENCODE_CONFIG_CONTENT` itself replaces the configuration the gateway gives OpenCode, so
/// its agents' commands would run with OpenCode's own shell, unconfined. The gateway reads the
/// shell OpenCode actually uses before a task starts: the start is refused, saying why and what
/// to do, and no prompt reaches the model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_opencode_that_drops_the_confining_shell_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let env = OpenCodeEnv::new();
    let wrapper = env.root().join("opencode-wrapper");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nOPENCODE_CONFIG_CONTENT='{{}}'\nexport OPENCODE_CONFIG_CONTENT\nexec {} \"$@\"\n",
            support::opencode_bin().display()
        ),
    )
    .expect("the wrapper");
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let command = wrapper.display().to_string();
    let rig = Rig::start_in(
        FakeLlm::start(),
        env,
        &[("OPENCODE_MCP_OPENCODE__COMMAND", command.as_str())],
    )
    .await;
    let (code, message) = rig
        .err(
            "opencode_start_task",
            json!({ "server_id": rig.server_id(), "prompt": "must not run [[bash:touch escaped]]" }),
        )
        .await;
    assert!(
        message.contains("would not run confined") && message.contains("config file"),
        "{code}: {message}"
    );
    assert!(
        !rig.fake
            .requests()
            .iter()
            .any(|r| r.last_user_text.contains("must not run")),
        "the prompt reached the model"
    );
}

//! Parallel writers without collisions, end to end: the gateway binary over MCP stdio, the
//! pinned OpenCode it starts, the scripted fake LLM, and real git repositories in temp dirs.
//!
//! Tasks started with `isolation: "worktree"` each get a git worktree of the repository the
//! gateway runs in (five at once in the parallel test); the fake's `[[write:<path>:<content>]]`
//! marker makes each agent write the same file differently through OpenCode's write tool. Each
//! task's diff must show only its own change, the user's tree (files and index) must stay as it
//! was until an apply, an apply must merge, a conflicting apply must change nothing, and discard
//! must leave no worktree or branch. When records expire, worktrees go with them unless never
//! applied; `opencode-mcp gc` lists and removes what is left.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use futures::future::join_all;
use serde_json::{json, Value};
use support::git::git;
use support::rig::{Rig, TASK_TIMEOUT_MS};
use support::{FakeLlm, OpenCodeEnv};

/// Ten lines, `line 1` .. `line 10`, with line `n` replaced by `text` when given.
fn shared(edit: Option<(usize, &str)>) -> String {
    (1..=10)
        .map(|i| match edit {
            Some((n, text)) if n == i => format!("{text}\n"),
            _ => format!("line {i}\n"),
        })
        .collect()
}

/// The `[[write:...]]` marker for `path` with `content` (newlines written as `\n`).
fn write_marker(path: &str, content: &str) -> String {
    format!("[[write:{path}:{}]]", content.replace('\n', "\\n"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// A repository with one commit and every kind of uncommitted change: an unstaged edit, a staged
/// new file, an untracked file and an ignored one.
fn make_repo(repo: &Path) {
    git(repo, &["init", "-q", "-b", "main"]);
    std::fs::write(repo.join("shared.txt"), shared(None)).expect("write");
    std::fs::write(repo.join("notes.txt"), "committed notes\n").expect("write");
    std::fs::write(repo.join(".gitignore"), "ignored.txt\n").expect("write");
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-q", "-m", "initial"]);
    std::fs::write(
        repo.join("notes.txt"),
        "committed notes\nand an unstaged edit\n",
    )
    .expect("write");
    std::fs::write(repo.join("staged.txt"), "staged, not committed\n").expect("write");
    git(repo, &["add", "staged.txt"]);
    std::fs::write(repo.join("draft.txt"), "untracked draft\n").expect("write");
    std::fs::write(repo.join("ignored.txt"), "ignored\n").expect("write");
}

fn id(v: &Value) -> String {
    v["task_id"].as_str().expect("task_id").to_string()
}

fn changes(result: &Value) -> Vec<(String, String, u64, u64)> {
    result["workspace"]["changes"]
        .as_array()
        .unwrap_or_else(|| panic!("no workspace.changes in {result}"))
        .iter()
        .map(|c| {
            (
                c["file"].as_str().unwrap_or_default().to_string(),
                c["status"].as_str().unwrap_or_default().to_string(),
                c["additions"].as_u64().unwrap_or(u64::MAX),
                c["deletions"].as_u64().unwrap_or(u64::MAX),
            )
        })
        .collect()
}

fn modified(file: &str, add: u64, del: u64) -> (String, String, u64, u64) {
    (file.to_string(), "modified".to_string(), add, del)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_worktree_tasks_keep_their_changes_apart_until_applied() {
    let env = OpenCodeEnv::new();
    let repo = env.work_dir();
    make_repo(&repo);
    let state_worktrees = env.root().join("state/opencode-mcp/worktrees");
    let index_path = repo.join(".git/index");
    let index_before = std::fs::read(&index_path).expect("the user's index");
    let status_before = git(&repo, &["status", "--porcelain"]);
    let head = git(&repo, &["rev-parse", "HEAD"]).trim().to_string();
    let mut rig = Rig::start_in(FakeLlm::start(), env, &[]).await;

    // Four tasks rewrite line 5 (they conflict with each other), the fifth rewrites line 9
    // and adds a file (it merges with any one of them).
    let tasks = [
        (
            "A",
            format!(
                "edit A {}",
                write_marker("shared.txt", &shared(Some((5, "line 5 by task A"))))
            ),
        ),
        (
            "B",
            format!(
                "edit B {}",
                write_marker("shared.txt", &shared(Some((5, "line 5 by task B"))))
            ),
        ),
        (
            "C",
            format!(
                "edit C {}",
                write_marker("shared.txt", &shared(Some((5, "line 5 by task C"))))
            ),
        ),
        (
            "E",
            format!(
                "edit E {}",
                write_marker("shared.txt", &shared(Some((5, "line 5 by task E"))))
            ),
        ),
        (
            "D",
            format!(
                "edit D {} {}",
                write_marker("shared.txt", &shared(Some((9, "line 9 by task D")))),
                write_marker("docs/new.txt", "added by task D\n")
            ),
        ),
    ];
    let starts = join_all(tasks.iter().map(|(_, prompt)| {
        rig.start_task_with(json!({ "prompt": prompt, "isolation": "worktree" }))
    }))
    .await;
    let ids: Vec<String> = starts.iter().map(id).collect();
    for (start, task_id) in starts.iter().zip(&ids) {
        let ws = &start["workspace"];
        assert_eq!(ws["branch"], format!("opencode-mcp/{task_id}"), "{start}");
        let path = PathBuf::from(ws["path"].as_str().expect("workspace.path"));
        assert!(path.starts_with(&state_worktrees), "{}", path.display());
        assert_eq!(
            start["directory"], ws["path"],
            "the session works in the worktree"
        );
        // The base is HEAD plus the uncommitted changes: a commit on top of HEAD.
        let base = ws["base"].as_str().expect("workspace.base");
        assert_ne!(base, head);
        assert_eq!(git(&repo, &["rev-parse", &format!("{base}^")]).trim(), head);
        // What the orchestrator sees is in the worktree; what git ignores is not.
        assert_eq!(
            read(&path.join("notes.txt")),
            "committed notes\nand an unstaged edit\n"
        );
        assert_eq!(read(&path.join("staged.txt")), "staged, not committed\n");
        assert_eq!(read(&path.join("draft.txt")), "untracked draft\n");
        assert!(!path.join("ignored.txt").exists());
    }
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let w = rig.wait(&refs, "all", TASK_TIMEOUT_MS).await;
    assert_eq!(w["done"], true, "{w}");
    for task in w["tasks"].as_array().expect("tasks") {
        assert_eq!(task["status"], "completed", "{task}");
        assert!(
            task["workspace"]["changes"].is_array(),
            "wait results carry the diff: {task}"
        );
    }

    // Each task's diff is its own change and nothing else.
    assert_eq!(ids.len(), 5);
    let (a, b, c, e, d) = (&ids[0], &ids[1], &ids[2], &ids[3], &ids[4]);
    for (task_id, label) in [(a, "A"), (b, "B"), (c, "C"), (e, "E")] {
        let r = rig
            .ok("opencode_get_task_result", json!({ "task_id": task_id }))
            .await;
        assert_eq!(changes(&r), vec![modified("shared.txt", 1, 1)], "{r}");
        let diff = rig
            .ok(
                "opencode_get_task_result",
                json!({ "task_id": task_id, "view": "diff" }),
            )
            .await;
        assert_eq!(diff["view"], "diff");
        let text = diff["text"].as_str().expect("diff text");
        assert!(text.contains(&format!("+line 5 by task {label}")), "{text}");
        assert!(text.contains("-line 5\n"), "{text}");
        assert_eq!(
            text.matches("by task").count(),
            1,
            "only its own change: {text}"
        );
    }
    let rd = rig
        .ok("opencode_get_task_result", json!({ "task_id": d }))
        .await;
    assert_eq!(
        changes(&rd),
        vec![
            ("docs/new.txt".to_string(), "added".to_string(), 1, 0),
            modified("shared.txt", 1, 1)
        ],
        "{rd}"
    );

    // Nothing reached the user's tree or index.
    assert_eq!(read(&repo.join("shared.txt")), shared(None));
    assert!(!repo.join("docs").exists());
    assert_eq!(std::fs::read(&index_path).expect("index"), index_before);
    assert_eq!(git(&repo, &["status", "--porcelain"]), status_before);

    // A follow-up works in the same worktree.
    rig.ok(
        "opencode_continue_task",
        json!({ "task_id": c, "prompt": format!("more {}", write_marker("c2.txt", "second turn\n")) }),
    )
    .await;
    let rc = rig.finish(c).await;
    assert_eq!(
        changes(&rc),
        vec![
            ("c2.txt".to_string(), "added".to_string(), 1, 0),
            modified("shared.txt", 1, 1)
        ],
        "{rc}"
    );
    assert!(!repo.join("c2.txt").exists());

    // Applying A writes the user's file and keeps their uncommitted work.
    let applied = rig.ok("opencode_apply_task", json!({ "task_id": a })).await;
    assert_eq!(applied["applied"][0]["file"], "shared.txt", "{applied}");
    assert_eq!(applied["workspace"]["applied"], true);
    let after_a = shared(Some((5, "line 5 by task A")));
    assert_eq!(read(&repo.join("shared.txt")), after_a);
    assert_eq!(
        read(&repo.join("notes.txt")),
        "committed notes\nand an unstaged edit\n"
    );
    assert_eq!(read(&repo.join("draft.txt")), "untracked draft\n");
    assert_eq!(
        std::fs::read(&index_path).expect("index"),
        index_before,
        "apply writes the files, never the index"
    );

    // B and E conflict with A: refused, naming the file and quoting both sides of the
    // conflicting lines, and nothing changes.
    for (task_id, theirs) in [(b, "line 5 by task B"), (e, "line 5 by task E")] {
        let (code, message) = rig
            .err("opencode_apply_task", json!({ "task_id": task_id }))
            .await;
        assert_eq!(code, "conflict", "{message}");
        assert!(message.contains("shared.txt"), "{message}");
        assert!(
            message.contains("<<<<<<< working tree")
                && message.contains(&format!(">>>>>>> task {task_id}"))
                && message.contains("line 5 by task A")
                && message.contains(theirs),
            "{message}"
        );
        assert_eq!(read(&repo.join("shared.txt")), after_a);
        assert_eq!(std::fs::read(&index_path).expect("index"), index_before);
    }

    // D touches other lines: it merges with A.
    rig.ok("opencode_apply_task", json!({ "task_id": d })).await;
    let after_ad = shared(Some((5, "line 5 by task A"))).replace("line 9\n", "line 9 by task D\n");
    assert_eq!(read(&repo.join("shared.txt")), after_ad);
    assert_eq!(read(&repo.join("docs/new.txt")), "added by task D\n");

    // Applying again writes nothing.
    let again = rig.ok("opencode_apply_task", json!({ "task_id": a })).await;
    assert_eq!(again["already_applied"], true, "{again}");
    assert_eq!(again["applied"], json!([]));
    assert_eq!(read(&repo.join("shared.txt")), after_ad);

    // A restarted gateway still knows the worktrees.
    rig.kill_gateway().await;
    rig.relaunch().await;
    let rb = rig
        .ok("opencode_get_task_result", json!({ "task_id": b }))
        .await;
    assert_eq!(rb["workspace"]["branch"], format!("opencode-mcp/{b}"));
    assert_eq!(changes(&rb), vec![modified("shared.txt", 1, 1)], "{rb}");

    // Discard removes worktree and branch, twice is once, and the change is gone for good.
    let b_path = PathBuf::from(rb["workspace"]["path"].as_str().expect("path"));
    assert!(b_path.is_dir());
    let gone = rig
        .ok("opencode_discard_task", json!({ "task_id": b }))
        .await;
    assert_eq!(gone["workspace"]["discarded"], true, "{gone}");
    assert!(!b_path.exists());
    assert_eq!(
        git(&repo, &["branch", "--list", &format!("opencode-mcp/{b}")]),
        ""
    );
    let twice = rig
        .ok("opencode_discard_task", json!({ "task_id": b }))
        .await;
    assert_eq!(twice["already_discarded"], true, "{twice}");
    let (code, _) = rig
        .err("opencode_apply_task", json!({ "task_id": b }))
        .await;
    assert_eq!(code, "conflict");
    let (code, _) = rig
        .err(
            "opencode_continue_task",
            json!({ "task_id": b, "prompt": "more" }),
        )
        .await;
    assert_eq!(code, "conflict");
    for task_id in [a, c, d, e] {
        rig.ok("opencode_discard_task", json!({ "task_id": task_id }))
            .await;
    }
    let worktrees = git(&repo, &["worktree", "list", "--porcelain"]);
    assert_eq!(worktrees.matches("worktree ").count(), 1, "{worktrees}");
    assert_eq!(git(&repo, &["branch", "--list", "opencode-mcp/*"]), "");
    assert_eq!(
        read(&repo.join("shared.txt")),
        after_ad,
        "discard leaves applied work alone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worktree_edge_cases_and_clear_errors() {
    let env = OpenCodeEnv::new();
    let repo = env.work_dir();
    git(&repo, &["init", "-q", "-b", "main"]);
    std::fs::write(repo.join("a.txt"), "a\n").expect("write");
    std::fs::create_dir_all(repo.join("sub")).expect("mkdir");
    std::fs::write(repo.join("sub/b.txt"), "b\n").expect("write");
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-q", "-m", "initial"]);
    let plain = env.root().join("tmp/not-a-repo");
    std::fs::create_dir_all(&plain).expect("mkdir");
    let empty = env.root().join("tmp/no-commits");
    std::fs::create_dir_all(&empty).expect("mkdir");
    git(&empty, &["init", "-q"]);
    let rig = Rig::start_in(FakeLlm::start(), env, &[]).await;

    // A directory outside any repository: named, with the fix.
    let (code, message) = rig
        .err(
            "opencode_start_task",
            json!({ "server_id": rig.server_id(), "prompt": "x", "isolation": "worktree",
                    "directory": plain.display().to_string() }),
        )
        .await;
    assert_eq!(code, "invalid_argument", "{message}");
    assert!(message.contains(&plain.display().to_string()), "{message}");
    assert!(message.contains("isolation `none`"), "{message}");

    // A repository without a commit has nothing to branch from.
    let (code, message) = rig
        .err(
            "opencode_start_task",
            json!({ "server_id": rig.server_id(), "prompt": "x", "isolation": "worktree",
                    "directory": empty.display().to_string() }),
        )
        .await;
    assert_eq!(code, "invalid_argument", "{message}");
    assert!(message.contains(&empty.display().to_string()), "{message}");
    assert!(message.contains("no commit yet"), "{message}");

    // `base` without a worktree means nothing.
    let (code, message) = rig
        .err(
            "opencode_start_task",
            json!({ "server_id": rig.server_id(), "prompt": "x", "base": "head" }),
        )
        .await;
    assert_eq!(code, "invalid_argument", "{message}");

    // A worktree start answers once the task is recorded, before its worktree and session
    // exist; they follow in the background.
    let raw = rig
        .ok(
            "opencode_start_task",
            json!({ "server_id": rig.server_id(), "prompt": "made after the answer", "isolation": "worktree", "detail": "full" }),
        )
        .await;
    assert_eq!(raw["status"], "pending", "{raw}");
    assert_eq!(raw["phase"], "starting", "{raw}");
    assert!(raw.get("workspace").is_none(), "{raw}");
    let early = id(&raw);
    let made = rig.worktree(&early).await;
    assert!(made.join("a.txt").exists(), "{}", made.display());
    let done = rig.finish(&early).await;
    assert_eq!(done["status"], "completed", "{done}");

    // A running task is neither applied nor discarded.
    let slow = id(&rig
        .start_task_with(
            json!({ "prompt": "slow [[slow:20000]]", "isolation": "worktree", "base": "head" }),
        )
        .await);
    for tool in ["opencode_apply_task", "opencode_discard_task"] {
        let (code, message) = rig.err(tool, json!({ "task_id": slow })).await;
        assert_eq!(code, "conflict", "{tool}: {message}");
        assert!(message.contains("still"), "{message}");
    }
    // Cancelled at once: the gateway's abort waits for the turn's first reply (an abort during
    // a directory's first turn set-up poisons OpenCode's instance for it; `tests/turns.rs`).
    rig.ok("opencode_cancel_task", json!({ "task_id": slow }))
        .await;
    let head = git(&repo, &["rev-parse", "HEAD"]);
    let r = rig
        .ok("opencode_get_task_result", json!({ "task_id": slow }))
        .await;
    assert_eq!(
        r["workspace"]["base"],
        head.trim(),
        "base `head` is HEAD itself"
    );
    rig.ok("opencode_discard_task", json!({ "task_id": slow }))
        .await;

    // A task given a subdirectory works at the same place inside its worktree.
    let start = rig
        .start_task_with(json!({
            "prompt": format!("in sub {}", write_marker("here.txt", "written in sub\n")),
            "isolation": "worktree",
            "directory": repo.join("sub").display().to_string(),
        }))
        .await;
    let sub = id(&start);
    let path = PathBuf::from(start["workspace"]["path"].as_str().expect("path"));
    assert_eq!(
        start["directory"],
        path.join("sub").display().to_string(),
        "{start}"
    );
    let r = rig.finish(&sub).await;
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(
        changes(&r),
        vec![("sub/here.txt".to_string(), "added".to_string(), 1, 0)],
        "{r}"
    );
    rig.ok("opencode_apply_task", json!({ "task_id": sub }))
        .await;
    assert_eq!(read(&repo.join("sub/here.txt")), "written in sub\n");
    rig.ok("opencode_discard_task", json!({ "task_id": sub }))
        .await;

    // A task without a worktree has nothing to apply.
    let plain_task = id(&rig.start_task("no isolation").await);
    rig.finish(&plain_task).await;
    let (code, message) = rig
        .err("opencode_apply_task", json!({ "task_id": plain_task }))
        .await;
    assert_eq!(code, "invalid_argument", "{message}");
    assert!(message.contains("isolation `none`"), "{message}");
    let (code, _) = rig
        .err(
            "opencode_get_task_result",
            json!({ "task_id": plain_task, "view": "diff" }),
        )
        .await;
    assert_eq!(code, "invalid_argument");
}

/// Runs the gateway binary's `args` (a subcommand) in `cwd` with the rig's environment (its
/// state directory); returns (success, stdout, stderr).
fn gateway_cli(rig: &Rig, cwd: &Path, args: &[&str]) -> (bool, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_opencode-mcp"));
    cmd.args(args).current_dir(cwd).env_clear();
    if let Some(path) = std::env::var_os("PATH") {
        cmd.env("PATH", path);
    }
    cmd.envs(rig.env.vars(&rig.fake.url()));
    let out = cmd.output().expect("the gateway binary runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The line of `gc`'s listing for `task_id`.
fn gc_line<'a>(listing: &'a str, task_id: &str) -> &'a str {
    listing
        .lines()
        .find(|l| l.starts_with(task_id))
        .unwrap_or_else(|| panic!("{task_id} is not listed:\n{listing}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_tasks_take_their_worktrees_along_unless_never_applied() {
    let env = OpenCodeEnv::new();
    let repo = env.work_dir();
    make_repo(&repo);
    let state = env.root().join("state/opencode-mcp");
    let mut rig = Rig::start_in(FakeLlm::start(), env, &[]).await;

    // One change applied, one task that changed nothing, one change never applied.
    let prompts = [
        format!("applied {}", write_marker("applied.txt", "taken\n")),
        "nothing to write".to_string(),
        format!("kept {}", write_marker("kept.txt", "never taken\n")),
    ];
    let starts = join_all(
        prompts
            .iter()
            .map(|p| rig.start_task_with(json!({ "prompt": p, "isolation": "worktree" }))),
    )
    .await;
    let ids: Vec<String> = starts.iter().map(id).collect();
    let paths: Vec<PathBuf> = starts
        .iter()
        .map(|s| PathBuf::from(s["workspace"]["path"].as_str().expect("workspace.path")))
        .collect();
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let w = rig.wait(&refs, "all", TASK_TIMEOUT_MS).await;
    assert_eq!(w["done"], true, "{w}");
    let (applied, untouched, kept) = (&ids[0], &ids[1], &ids[2]);
    rig.ok("opencode_apply_task", json!({ "task_id": applied }))
        .await;
    let status_after_apply = git(&repo, &["status", "--porcelain"]);

    // While the records exist, gc lists the worktrees as the gateway's and removes none. The
    // store is written behind the registry: gc runs again (bounded) until it reads the apply.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let listing = loop {
        let (ok, listing, stderr) = gateway_cli(&rig, &repo, &["gc", "--remove-orphans"]);
        assert!(ok, "{stderr}");
        if gc_line(&listing, applied).contains("applied") || std::time::Instant::now() >= deadline {
            break listing;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert!(
        gc_line(&listing, applied)
            .contains("record present  applied  1 changed file(s)  nothing unapplied"),
        "{listing}"
    );
    assert!(
        gc_line(&listing, untouched).contains("not applied  0 changed file(s)  nothing unapplied"),
        "{listing}"
    );
    assert!(
        gc_line(&listing, kept).contains("not applied  1 changed file(s)  unapplied changes"),
        "{listing}"
    );
    assert!(!listing.contains("removed"), "{listing}");
    assert!(paths.iter().all(|p| p.is_dir()));

    // A gateway whose finished_task_ttl has long passed for them lets the records go, and
    // with them the worktrees of the applied task and of the one that changed nothing.
    rig.kill_gateway().await;
    rig.launch = rig
        .launch
        .clone()
        .env("OPENCODE_MCP_LIMITS__FINISHED_TASK_TTL", "1ms");
    rig.relaunch().await;
    let records = state.join("tasks");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    // Removal deletes the directory first and the branch after it: settled means both.
    let settled = || {
        let branches = git(&repo, &["branch", "--list", "opencode-mcp/*"]);
        !paths[0].exists()
            && !paths[1].exists()
            && !branches.contains(applied.as_str())
            && !branches.contains(untouched.as_str())
            && state.join(format!("worktrees/{kept}.kept.json")).is_file()
            && ids
                .iter()
                .all(|i| !records.join(format!("{i}.json")).exists())
    };
    while !settled() {
        assert!(
            std::time::Instant::now() < deadline,
            "expired tasks were not cleaned within 30 s\n--- gateway stderr ---\n{}",
            rig.client.stderr()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let branches = git(&repo, &["branch", "--list", "opencode-mcp/*"]);
    assert!(!branches.contains(applied.as_str()), "{branches}");
    assert!(!branches.contains(untouched.as_str()), "{branches}");
    assert!(branches.contains(kept.as_str()), "{branches}");
    assert_eq!(read(&paths[2].join("kept.txt")), "never taken\n");

    // The kept one is listed, counted by check-config, and not removed without --force.
    let (ok, listing, stderr) = gateway_cli(&rig, &repo, &["gc"]);
    assert!(ok, "{stderr}");
    assert!(listing.starts_with("1 worktree(s) under "), "{listing}");
    assert!(
        gc_line(&listing, kept).contains(
            "completed  record expired, kept  not applied  1 changed file(s)  unapplied changes"
        ),
        "{listing}"
    );
    let (ok, _, stderr) = gateway_cli(&rig, &repo, &["check-config"]);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("1 worktree(s) of expired tasks kept with changes never applied"),
        "{stderr}"
    );
    let (ok, out, stderr) = gateway_cli(&rig, &repo, &["gc", "--remove-orphans"]);
    assert!(ok, "{stderr}");
    assert!(
        out.contains(&format!("kept {kept}: it holds changes never applied")),
        "{out}"
    );
    assert!(paths[2].is_dir());
    let (ok, out, stderr) = gateway_cli(&rig, &repo, &["gc", "--remove-orphans", "--force"]);
    assert!(ok, "{stderr}");
    assert!(out.contains(&format!("removed {kept}")), "{out}");
    assert!(!paths[2].exists());
    assert!(!state.join(format!("worktrees/{kept}.kept.json")).exists());
    assert_eq!(git(&repo, &["branch", "--list", "opencode-mcp/*"]), "");
    let worktrees = git(&repo, &["worktree", "list", "--porcelain"]);
    assert_eq!(worktrees.matches("worktree ").count(), 1, "{worktrees}");
    // gc never touched the user's tree.
    assert_eq!(git(&repo, &["status", "--porcelain"]), status_after_apply);
    assert_eq!(read(&repo.join("applied.txt")), "taken\n");
    let (ok, _, stderr) = gateway_cli(&rig, &repo, &["check-config"]);
    assert!(ok && !stderr.contains("kept"), "{stderr}");
}

/// Without git on the gateway's PATH, a worktree task is refused with what to do, and nothing is
/// started. (OpenCode itself is reached by absolute path, so only git is missing.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_git_is_named_with_the_fix() {
    let env = OpenCodeEnv::new();
    let repo = env.work_dir();
    git(&repo, &["init", "-q", "-b", "main"]);
    std::fs::write(repo.join("a.txt"), "a\n").expect("write");
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-q", "-m", "initial"]);
    let no_git = env.root().join("tmp/bin-without-git");
    std::fs::create_dir_all(&no_git).expect("mkdir");
    let path = no_git.display().to_string();
    let rig = Rig::start_in(FakeLlm::start(), env, &[("PATH", path.as_str())]).await;

    let (code, message) = rig
        .err(
            "opencode_start_task",
            json!({ "server_id": rig.server_id(), "prompt": "x", "isolation": "worktree" }),
        )
        .await;
    assert_eq!(code, "invalid_argument", "{message}");
    assert!(
        message.contains("isolation `worktree` needs git") && message.contains("isolation `none`"),
        "{message}"
    );
    let listed = rig.ok("opencode_list_tasks", json!({})).await;
    assert_eq!(listed["total"], 0, "nothing was started: {listed}");
    assert!(
        !repo.join(".git/worktrees").exists(),
        "no worktree was made in {}",
        repo.display()
    );
}

/// An agent allowed only to edit files plants a repository of its own in its worktree: `.git`
/// pointing at `.evil`, whose config defines a filter that runs a command, borrowing the
/// origin's objects, and `.gitattributes` choosing that filter for every file. Every operation
/// of the gateway that runs git on the worktree (the result with its changed files, a wait, the
/// diff, an apply, `gc`'s listing, a discard) works on the true repository and runs nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_git_dir_planted_by_the_agent_runs_nothing_and_is_not_believed() {
    let env = OpenCodeEnv::new();
    let repo = env.work_dir();
    git(&repo, &["init", "-q", "-b", "main"]);
    std::fs::write(repo.join("a.txt"), "one\n").expect("write");
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-q", "-m", "initial"]);
    let marker = env.root().join("tmp/filter-ran");
    let objects = repo.join(".git/objects");
    // Unconfined on purpose: this is the gateway's own git against a `.git` the agent planted,
    // and the sandbox's session rules now stop the agent from writing any `.git` at all
    // (tests/sandbox.rs shows that). The defence behind it must hold on its own.
    let rig = Rig::start_in(
        FakeLlm::start(),
        env,
        &[("OPENCODE_MCP_SANDBOX__MODE", "off")],
    )
    .await;

    let config = format!(
        "[core]\n repositoryformatversion = 0\n[filter \"x\"]\n clean = touch {}; cat\n smudge = cat\n",
        marker.display()
    );
    let prompt = [
        "plant".to_string(),
        write_marker("a.txt", "one\ntwo\n"),
        write_marker(".evil/HEAD", "ref: refs/heads/main\n"),
        write_marker(".evil/refs/heads/.keep", ""),
        write_marker(
            ".evil/objects/info/alternates",
            &format!("{}\n", objects.display()),
        ),
        write_marker(".evil/config", &config),
        write_marker(".gitattributes", "* filter=x\n"),
        write_marker(".git", "gitdir: .evil\n"),
    ]
    .join(" ");
    let start = rig
        .start_task_with(json!({ "prompt": prompt, "isolation": "worktree" }))
        .await;
    let task = id(&start);
    let path = PathBuf::from(start["workspace"]["path"].as_str().expect("path"));
    let r = rig.finish(&task).await;
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(
        read(&path.join(".git")),
        "gitdir: .evil\n",
        "the agent's write tool planted the pointer"
    );
    let no_marker = |after: &str| {
        assert!(
            !marker.exists(),
            "the agent's filter ran during {after}\n--- gateway stderr ---\n{}",
            rig.client.stderr()
        )
    };
    no_marker("the result");
    // The changes are read from the true repository: a.txt against the task's base.
    let files: Vec<String> = changes(&r).into_iter().map(|c| c.0).collect();
    assert!(files.contains(&"a.txt".to_string()), "{r}");
    assert!(!files.contains(&".git".to_string()), "{r}");

    let w = rig.wait(&[&task], "all", TASK_TIMEOUT_MS).await;
    assert_eq!(w["done"], true, "{w}");
    no_marker("a wait");
    let d = rig
        .ok(
            "opencode_get_task_result",
            json!({ "task_id": task, "view": "diff" }),
        )
        .await;
    assert!(d["text"].as_str().unwrap_or("").contains("+two"), "{d}");
    no_marker("the diff view");
    rig.ok("opencode_apply_task", json!({ "task_id": task }))
        .await;
    no_marker("an apply");
    assert_eq!(read(&repo.join("a.txt")), "one\ntwo\n");
    let (ok, listing, stderr) = gateway_cli(&rig, &repo, &["gc"]);
    assert!(ok, "{stderr}");
    assert!(gc_line(&listing, &task).contains("applied"), "{listing}");
    no_marker("gc");
    rig.ok("opencode_discard_task", json!({ "task_id": task }))
        .await;
    no_marker("a discard");
    assert!(!path.exists(), "the worktree is gone");
    assert_eq!(git(&repo, &["branch", "--list", "opencode-mcp/*"]), "");
    let stderr = rig.client.stderr();
    assert!(
        stderr.contains("the worktree's `.git` was changed"),
        "the gateway says what it ignored:\n{stderr}"
    );
}

/// A repository whose real path is not UTF-8 (reached through a symlink that is) is refused
/// with what to do, and leaves no worktree or branch behind: records keep paths as text, and a
/// path stored changed would send a later apply, discard or gc to a directory that does not
/// exist. Titles and idempotency keys are bounded, for `fan_out` as for `start_task`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_that_is_not_utf8_and_overlong_names_are_refused() {
    use std::os::unix::ffi::OsStrExt;
    let env = OpenCodeEnv::new();
    let base = env.root().join("tmp");
    let real = base.join(std::ffi::OsStr::from_bytes(b"repo-\xff"));
    std::fs::create_dir_all(&real).expect("mkdir");
    git(&real, &["init", "-q", "-b", "main"]);
    std::fs::write(real.join("a.txt"), "a\n").expect("write");
    git(&real, &["add", "-A"]);
    git(&real, &["commit", "-q", "-m", "initial"]);
    let link = base.join("repo-link");
    std::os::unix::fs::symlink(&real, &link).expect("symlink");
    let rig = Rig::start_in(FakeLlm::start(), env, &[]).await;

    let (code, message) = rig
        .err(
            "opencode_start_task",
            json!({ "server_id": rig.server_id(), "prompt": "x", "isolation": "worktree",
                    "directory": link.display().to_string() }),
        )
        .await;
    assert_eq!(code, "invalid_argument", "{message}");
    assert!(message.contains("not valid UTF-8"), "{message}");
    assert_eq!(git(&real, &["branch", "--list", "opencode-mcp/*"]), "");
    let worktrees = git(&real, &["worktree", "list", "--porcelain"]);
    assert_eq!(worktrees.matches("worktree ").count(), 1, "{worktrees}");

    let long = "t".repeat(201);
    let (code, message) = rig
        .err(
            "opencode_start_task",
            json!({ "server_id": rig.server_id(), "prompt": "x", "title": long }),
        )
        .await;
    assert_eq!(code, "invalid_argument", "{message}");
    assert!(
        message.contains("`title`") && message.contains("200"),
        "{message}"
    );
    let (code, message) = rig
        .err(
            "opencode_fan_out",
            json!({ "server_id": rig.server_id(), "prompt": "x",
                    "models": [
                        format!("{}/{}", support::FAKE_PROVIDER, support::FAKE_MODEL),
                        format!("{}/{}", support::FAKE_PROVIDER, support::FAKE_STRONG_MODEL),
                    ],
                    "idempotency_key": "k".repeat(101) }),
        )
        .await;
    assert_eq!(code, "invalid_argument", "{message}");
    assert!(message.contains("`idempotency_key`"), "{message}");
    assert!(rig.fake.chat_requests().is_empty(), "nothing was started");
}

//! Preset tools declared in a repository's `delegation.yaml`, end to end: the file is dropped into
//! the directory the gateway starts in (no rebuild), the host sees the preset with its own schema
//! over the real MCP wire, and a call starts a real OpenCode task whose prompt is the rendered
//! template, on the tier the preset fixes. `fan_out` (and the built-in `review` preset on it)
//! asks two tiers at once and the wait tool returns both answers side by side.

mod support;

use serde_json::{json, Value};
use support::fake_llm::{content_text, FakeLlm};
use support::git::{git, init_repo};
use support::isolation::OpenCodeEnv;
use support::rig::Rig;

/// The issue's own example, with the fast tier bound to a model other than the server's
/// default, so that the model a task ran on proves which tier it was started on.
const PRESETS: &str = r#"
tiers:
  - name: fast
    handles: mechanical work
    models: [fake/fake-strong]
  - name: standard
    handles: features
    models: []
  - name: strong
    handles: hard work
    models: []
tools:
  write_tests:
    action: start_task
    tier: fast
    description: Write unit tests for one module and run them.
    arguments:
      - {name: module, description: Path of the module to test, required: true}
      - {name: notes, description: Cases that matter, required: false}
    prompt: |-
      Write unit tests for {{module}}.{% if notes %} {{notes}}{% endif %}
      Run the test command; they must pass. Do not change non-test code.
"#;

/// The issue's example exactly as written: `isolation: worktree`, and an optional `{{notes}}`
/// with no conditional around it.
const ISSUE_EXAMPLE: &str = include_str!("fixtures/presets/write_tests.yaml");

async fn rig_with(yaml: &str) -> Rig {
    let env = OpenCodeEnv::new();
    std::fs::write(env.work_dir().join("delegation.yaml"), yaml).expect("write delegation.yaml");
    Rig::start_in(FakeLlm::start(), env, &[]).await
}

/// The text of the user messages the fake model received for a session (title requests aside).
fn user_text(rig: &Rig, session_id: &str) -> String {
    rig.requests_for(session_id)
        .iter()
        .filter(|r| !r.is_title_request())
        .flat_map(|r| r.messages.clone())
        .filter(|m| m.get("role").and_then(Value::as_str) == Some("user"))
        .map(|m| content_text(m.get("content").unwrap_or(&Value::Null)))
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preset_tool_starts_its_rendered_prompt_on_its_tier() {
    let rig = rig_with(PRESETS).await;

    let tools = rig.client.list_tools().await.expect("tools/list");
    let preset = tools
        .iter()
        .find(|t| t.name == "write_tests")
        .unwrap_or_else(|| panic!("write_tests is listed: {:?}", tools.iter().map(|t| &t.name)));
    let schema = Value::Object(preset.input_schema.as_ref().clone());
    assert_eq!(schema["required"], json!(["module"]), "{schema}");
    let props = schema["properties"].as_object().expect("properties");
    assert_eq!(props["module"]["type"], "string");
    assert_eq!(props["notes"]["type"], "string");
    for hidden in ["prompt", "tier"] {
        assert!(
            !props.contains_key(hidden),
            "`{hidden}` is not the host's: {schema}"
        );
    }
    assert_eq!(
        preset.description.as_deref(),
        Some("Write unit tests for one module and run them.")
    );

    // With the optional argument and without: both render, the missing one as nothing.
    let with_notes = rig
        .ok(
            "write_tests",
            json!({ "module": "src/lib.rs", "notes": "Cover the empty input.", "detail": "full" }),
        )
        .await;
    let without = rig
        .ok(
            "write_tests",
            json!({ "module": "src/main.rs", "detail": "full" }),
        )
        .await;
    for (start, first_line) in [
        (
            &with_notes,
            "Write unit tests for src/lib.rs. Cover the empty input.",
        ),
        (&without, "Write unit tests for src/main.rs."),
    ] {
        let id = start["task_id"].as_str().expect("task_id");
        let result = rig.finish(id).await;
        assert_eq!(result["status"], "completed", "{result}");
        assert_eq!(
            result["model"], "fake/fake-strong",
            "the fast tier: {result}"
        );
        assert_eq!(result["text"], format!("ECHO: {first_line}"), "{result}");
        let session = start["session_id"].as_str().expect("session_id");
        let sent = user_text(&rig, session);
        assert!(
            sent.contains(&format!(
                "{first_line}\nRun the test command; they must pass. Do not change non-test code."
            )),
            "the agent got the whole rendered template: {sent}"
        );
    }

    // What the preset fixes or declares is checked at the call, naming the argument.
    let (code, message) = rig.err("write_tests", json!({ "notes": "x" })).await;
    assert_eq!(code, "invalid_argument");
    assert!(message.contains("`module`"), "{message}");
    let (code, message) = rig
        .err("write_tests", json!({ "module": "m", "tier": "strong" }))
        .await;
    assert_eq!(code, "invalid_argument");
    assert!(message.contains("`tier` is fixed"), "{message}");
    // A host that passes a `prompt` out of habit is told what to pass instead.
    let (code, message) = rig
        .err(
            "write_tests",
            json!({ "module": "m", "prompt": "write tests" }),
        )
        .await;
    assert_eq!(code, "invalid_argument");
    assert!(
        message.contains("instead of `prompt`") && message.contains("module"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_preset_is_refused_at_load_naming_file_and_key() {
    let env = OpenCodeEnv::new();
    let file = env.work_dir().join("delegation.yaml");
    std::fs::write(
        &file,
        PRESETS
            .replace("tier: fast\n", "tier: fastest\n")
            .replace("{{module}}", "{{modul}}"),
    )
    .expect("write delegation.yaml");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_opencode-mcp"))
        .arg("check-config")
        .current_dir(env.work_dir())
        .env("HOME", env.home_dir())
        .env("XDG_CONFIG_HOME", env.home_dir().join(".config"))
        .output()
        .expect("the gateway binary runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let shown = file.display().to_string();
    for expected in [
        format!("{shown}: `tools.write_tests.tier`: \"fastest\" is not a valid `tier`"),
        format!("{shown}: `tools.write_tests.prompt`: unknown placeholder `modul`"),
    ] {
        assert!(stderr.contains(&expected), "{expected}\nin:\n{stderr}");
    }
}

/// Tiers bound to two different models, so each answer shows which tier gave it.
const TWO_TIERS: &str = r#"
tiers:
  - name: fast
    handles: mechanical work
    models: [fake/fake-strong]
  - name: standard
    handles: features
    models: [fake/fake-strong]
  - name: strong
    handles: hard work
    models: [fake/fake-model]
tools:
  review:
    enabled: true
"#;

/// Waits (lean, as a host would) on a fan-out group and returns the finished tasks.
async fn wait_group(rig: &Rig, group: &str) -> Vec<Value> {
    let w = rig
        .ok(
            "opencode_wait_for_task",
            json!({ "task_ids": [group], "timeout_ms": 60_000 }),
        )
        .await;
    assert_eq!(w["done"], true, "{w}\n{}", rig.client.stderr());
    w["tasks"].as_array().cloned().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_to_two_tiers_returns_both_answers_side_by_side() {
    let rig = rig_with(TWO_TIERS).await;

    let out = rig
        .ok(
            "opencode_fan_out",
            json!({ "prompt": "Is this design sound?", "tiers": ["fast", "strong"] }),
        )
        .await;
    let group = out["group_id"].as_str().expect("group_id").to_string();
    assert!(group.starts_with("grp_"), "{out}");
    let ids = out["task_ids"].as_array().cloned().unwrap_or_default();
    assert_eq!(ids.len(), 2, "{out}");
    for task in out["tasks"].as_array().into_iter().flatten() {
        assert_eq!(task["group_id"], group.as_str(), "{out}");
    }

    let tasks = wait_group(&rig, &group).await;
    assert_eq!(
        tasks
            .iter()
            .map(|t| t["task_id"].clone())
            .collect::<Vec<_>>(),
        ids,
        "the group's tasks, in the order of the targets"
    );
    let models: Vec<&str> = tasks.iter().filter_map(|t| t["model"].as_str()).collect();
    assert_eq!(models, ["fake/fake-strong", "fake/fake-model"], "{tasks:?}");
    for task in &tasks {
        assert_eq!(task["status"], "completed", "{task}");
        assert_eq!(task["text"], "ECHO: Is this design sound?", "{task}");
        assert!(task["tokens"]["output"].as_u64().unwrap_or(0) > 0, "{task}");
        assert!(task["cost"].is_number(), "{task}");
    }

    // The built-in review preset, enabled by the repository: two tiers, the rendered prompt.
    let out = rig.ok("review", json!({ "focus": "error handling" })).await;
    let group = out["group_id"].as_str().expect("group_id").to_string();
    let tasks = wait_group(&rig, &group).await;
    assert_eq!(tasks.len(), 2, "{tasks:?}");
    let models: Vec<&str> = tasks.iter().filter_map(|t| t["model"].as_str()).collect();
    assert_eq!(
        models,
        ["fake/fake-strong", "fake/fake-model"],
        "standard, strong"
    );
    for task in &tasks {
        assert_eq!(
            task["text"],
            "ECHO: Review the change shown by `git diff HEAD` in this repository. Do not edit any file.",
            "{task}"
        );
    }

    // A tool that takes one task refuses the group id and names its tasks (cancelling the group
    // is not done by accident: each is cancelled by its own id).
    for tool in ["opencode_get_task_result", "opencode_cancel_task"] {
        let (code, message) = rig.err(tool, json!({ "task_id": group })).await;
        assert_eq!(code, "invalid_argument", "{tool}: {message}");
        for task in &tasks {
            let id = task["task_id"].as_str().unwrap_or_default();
            assert!(
                message.contains(id),
                "{tool} names the group's tasks: {message}"
            );
        }
    }
    let (code, message) = rig
        .err(
            "opencode_wait_for_task",
            json!({ "task_ids": ["grp_nosuchgroup0"] }),
        )
        .await;
    assert_eq!(code, "not_found", "{message}");
    assert!(message.contains("grp_nosuchgroup0"), "{message}");
    let (code, message) = rig
        .err(
            "opencode_fan_out",
            json!({ "prompt": "p", "tiers": ["fast"] }),
        )
        .await;
    assert_eq!(code, "invalid_argument");
    assert!(message.contains("2 to 8"), "{message}");

    // All or nothing: a target that cannot start fails the call, and the tasks that did start
    // are cancelled rather than left running unwatched.
    let before = rig.ok("opencode_list_tasks", json!({})).await["total"]
        .as_u64()
        .unwrap_or_default();
    let failing = json!({
        "prompt": "p [[delay:20000]]",
        "models": ["fake/fake-model", "nope/missing"],
        "idempotency_key": "second-opinion-1",
    });
    for attempt in 1..=2 {
        let (code, message) = rig.err("opencode_fan_out", failing.clone()).await;
        assert_eq!(code, "invalid_argument", "{message}");
        assert!(
            message.contains("`nope/missing`") && message.contains("cancelled"),
            "{message}"
        );
        // The retry with the same key starts the group again: a failed call binds no key, so
        // it is not handed back the task it cancelled.
        let listed = rig.ok("opencode_list_tasks", json!({})).await;
        assert_eq!(
            listed["total"].as_u64(),
            Some(before + attempt),
            "one task started per attempt: {listed}"
        );
        assert_eq!(listed["tasks"][0]["status"], "cancelled", "{listed}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_issues_preset_works_in_its_own_worktree() {
    let env = OpenCodeEnv::new();
    let repo = env.work_dir();
    init_repo(
        &repo,
        &[
            ("src/lib.rs", "pub fn f() {}\n"),
            ("delegation.yaml", ISSUE_EXAMPLE),
        ],
    );
    let rig = Rig::start_in(FakeLlm::start(), env, &[]).await;

    // The agent writes a test file (the fake model takes the marker from the notes).
    let start = rig
        .ok(
            "write_tests",
            json!({ "module": "src/lib.rs", "notes": "[[write:tests/lib_test.rs:one case]]" }),
        )
        .await;
    let id = start["task_id"].as_str().expect("task_id").to_string();
    // A worktree's start answers before the worktree exists (phase `starting`).
    assert_eq!(start["phase"], "starting", "{start}");
    let start = rig.started(&id).await;
    let ws = &start["workspace"];
    assert_eq!(ws["branch"], format!("opencode-mcp/{id}"), "{start}");
    let worktree = std::path::PathBuf::from(ws["path"].as_str().expect("workspace.path"));
    assert_ne!(worktree, repo);
    let result = rig.finish(&id).await;
    assert_eq!(result["status"], "completed", "{result}");
    let changed: Vec<&str> = result["workspace"]["changes"]
        .as_array()
        .unwrap_or_else(|| panic!("workspace.changes: {result}"))
        .iter()
        .filter_map(|c| c["file"].as_str())
        .collect();
    assert_eq!(changed, ["tests/lib_test.rs"], "{result}");
    assert_eq!(
        std::fs::read_to_string(worktree.join("tests/lib_test.rs"))
            .ok()
            .as_deref(),
        Some("one case")
    );
    assert!(
        !repo.join("tests/lib_test.rs").exists(),
        "the user's checkout is untouched until applied"
    );
    assert_eq!(git(&repo, &["status", "--porcelain"]), "");

    // Without the optional argument, `{{notes}}` renders as nothing.
    let start = rig
        .ok(
            "write_tests",
            json!({ "module": "src/lib.rs", "detail": "full" }),
        )
        .await;
    let id = start["task_id"].as_str().expect("task_id");
    assert_eq!(rig.finish(id).await["status"], "completed");
    // Its session is made after the answer (a worktree's start): read it from the task.
    let session = rig.status(id).await["session_id"]
        .as_str()
        .expect("session_id")
        .to_string();
    let sent = user_text(&rig, &session);
    assert!(
        sent.contains(
            "Write unit tests for src/lib.rs. \nRun the test command; they must pass. Do not \
             change non-test code."
        ),
        "{sent}"
    );
}

/// A repository's preset whose template would loop ten billion times (or write 100 MB) is
/// refused at call time within a bound, and the gateway goes on serving: rendering has fuel
/// and an output cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runaway_template_is_an_error_not_a_stuck_gateway() {
    let rig = rig_with(
        r#"
tools:
  spin:
    action: start_task
    description: Spins.
    arguments:
      - {name: task, description: Anything, required: true}
    prompt: |-
      {% for i in range(100000) %}{% for j in range(100000) %}{{ task }}{% endfor %}{% endfor %}
  big:
    action: start_task
    description: Writes a lot.
    arguments:
      - {name: task, description: Anything, required: true}
    prompt: |-
      {{ task }}{{ 'x' * 100000000 }}
"#,
    )
    .await;
    for tool in ["spin", "big"] {
        let started = std::time::Instant::now();
        let (code, message) = rig.err(tool, json!({ "task": "t" })).await;
        assert_eq!(code, "invalid_argument", "{tool}: {message}");
        assert!(
            message.contains("cannot render the prompt template"),
            "{tool}: {message}"
        );
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "{tool} took {:?}",
            started.elapsed()
        );
    }
    // Still serving.
    let listed = rig.ok("opencode_list_tasks", json!({})).await;
    assert_eq!(listed["total"], 0, "{listed}");
}

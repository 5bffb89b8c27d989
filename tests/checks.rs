//! Checks end to end: a real gateway over MCP stdio, a real OpenCode and the scripted model.
//!
//! The user's own file (`OPENCODE_MCP_CONFIG`) sets a fix prompt that carries a `[[write:...]]`
//! marker, so the scripted model writes the file a check looks for only in a fix round: a
//! first turn that leaves a check failing, a fix round whose prompt holds the failing output,
//! then a pass. Beside it: a task whose check never passes (rounds used up, `failed`
//! `ChecksFailed`), a check that hangs and one that prints megabytes (both bounded), a tier
//! that escalates to a stronger model, and a repository's file whose checks are withheld.

mod support;

use serde_json::{json, Value};
use support::isolation::{FAKE_MODEL, FAKE_PROVIDER, FAKE_STRONG_MODEL};
use support::rig::Rig;
use support::{FakeLlm, OpenCodeEnv};

/// The check the fix round makes pass: `fixed.txt` must exist in the task's directory.
const NEEDS_FIX: &str = "test -f fixed.txt || { echo 'fixed.txt is missing'; exit 7; }";

fn user_config(env: &OpenCodeEnv) -> std::path::PathBuf {
    let model = format!("{FAKE_PROVIDER}/{FAKE_MODEL}");
    let strong = format!("{FAKE_PROVIDER}/{FAKE_STRONG_MODEL}");
    let path = env.home_dir().join("user-delegation.yaml");
    std::fs::write(
        &path,
        format!(
            "timeouts:\n  check: 3s\nchecks:\n  from_calls: true\n  max_rounds: 1\n  output_chars: 300\n  fix_prompt: |-\n    \
             FIX ROUND {{{{ round }}}} of {{{{ max_rounds }}}} [[write:fixed.txt:yes]]\n    \
             {{% for f in failures %}}$ {{{{ f.command }}}} => {{{{ f.status }}}}: {{{{ f.output }}}}\n    \
             {{% endfor %}}\ntiers:\n  \
             - {{name: fast, handles: quick work, models: [{model}], escalate_to: strong, checks: [\"{NEEDS_FIX}\"]}}\n  \
             - {{name: strong, handles: hard work, models: [{strong}]}}\n"
        ),
    )
    .expect("write the user's delegation.yaml");
    path
}

fn dir(env: &OpenCodeEnv, name: &str) -> String {
    let d = env.work_dir().join(name);
    std::fs::create_dir_all(&d).expect("task directory");
    d.to_string_lossy().into_owned()
}

/// The session's model calls began on the default model and ended on the strong one: the
/// model really changed in OpenCode, not only in the gateway's record.
fn first_and_last_models(rig: &Rig, session: &str) {
    let models: Vec<String> = rig
        .requests_for(session)
        .iter()
        .filter(|r| !r.is_title_request())
        .map(|r| r.model.clone())
        .collect();
    assert_eq!(
        models.first().map(String::as_str),
        Some(FAKE_MODEL),
        "{models:?}"
    );
    assert_eq!(
        models.last().map(String::as_str),
        Some(FAKE_STRONG_MODEL),
        "{models:?}"
    );
}

/// Starts a task; returns its id and its session's.
async fn start(rig: &Rig, args: Value) -> (String, String) {
    let started = rig.start_task_with(args).await;
    let field = |k: &str| started[k].as_str().expect(k).to_string();
    (field("task_id"), field("session_id"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_run_after_each_turn_fix_rounds_follow_and_the_verdict_is_reported() {
    let env = OpenCodeEnv::new();
    let config = user_config(&env);
    // The repository's file fixes a check on the start tool: withheld, as the user's file does
    // not set `checks.from_repository`.
    std::fs::write(
        env.work_dir().join("delegation.yaml"),
        "tools:\n  opencode_start_task:\n    checks: [\"touch PWNED\"]\n",
    )
    .expect("write the repository's delegation.yaml");
    let config_env = config.to_string_lossy().into_owned();
    let rig = Rig::start_in(
        FakeLlm::start(),
        env,
        &[("OPENCODE_MCP_CONFIG", config_env.as_str())],
    )
    .await;
    let env = &rig.env;
    assert!(
        rig.client
            .stderr()
            .contains("`tools.opencode_start_task.checks`"),
        "the withheld check is reported:\n{}",
        rig.client.stderr()
    );

    // 1. A failing check, one fix round whose prompt carries the failure, then a pass.
    let fixed_dir = dir(env, "fixed");
    let (fixed, fixed_session) = start(
        &rig,
        json!({ "prompt": "do the work", "directory": fixed_dir, "checks": [NEEDS_FIX] }),
    )
    .await;
    // 2. A check that never passes.
    let never_dir = dir(env, "never");
    let (never, _) = start(
        &rig,
        json!({ "prompt": "do the work", "directory": never_dir,
                "checks": ["echo 'still broken'; exit 1"] }),
    )
    .await;
    // 3. A check that prints megabytes and one that hangs: bounded.
    let bounded_dir = dir(env, "bounded");
    let (bounded, _) = start(
        &rig,
        json!({ "prompt": "do the work", "directory": bounded_dir,
                "checks": ["yes y | head -c 3000000; echo LAST LINE; exit 2", "sleep 60"] }),
    )
    .await;
    // 4. A tier whose check fails after its rounds escalates to a stronger tier's model.
    let escalated_dir = dir(env, "escalated");
    let (escalated, escalated_session) = start(
        &rig,
        json!({ "prompt": "do the work", "directory": escalated_dir, "tier": "fast",
                "checks": ["test -f fixed.txt && test -f second.txt || exit 4"] }),
    )
    .await;
    // 5. The repository's check was withheld: a plain task is not held for one.
    let repo_dir = dir(env, "repo");
    let (repo, _) = start(
        &rig,
        json!({ "prompt": "do the work", "directory": repo_dir }),
    )
    .await;

    // 1.
    let result = rig.finish(&fixed).await;
    assert_eq!(result["status"], "completed", "{result}");
    let checks = &result["checks"];
    assert_eq!(checks["status"], "passed", "{result}");
    assert_eq!(checks["rounds"], 1, "{result}");
    assert_eq!(checks["last"][0]["exit"], 0, "{result}");
    assert_eq!(result["turn"], 2, "{result}");
    let asked: Vec<String> = rig
        .requests_for(&fixed_session)
        .iter()
        .map(|r| r.last_user_text.clone())
        .collect();
    let fix = asked
        .iter()
        .find(|t| t.starts_with("FIX ROUND 1 of 1"))
        .unwrap_or_else(|| panic!("no fix round reached the model: {asked:#?}"));
    assert!(
        fix.contains("exit status 7") && fix.contains("fixed.txt is missing"),
        "the fix prompt carries the command's status and output: {fix}"
    );
    // The wait's snapshot says the same, briefly.
    let wait = rig
        .ok(
            "opencode_wait_for_task",
            json!({ "task_ids": [fixed], "timeout_ms": 0 }),
        )
        .await;
    assert_eq!(wait["tasks"][0]["checks"]["status"], "passed", "{wait}");

    // 2.
    let result = rig.finish(&never).await;
    assert_eq!(result["status"], "failed", "{result}");
    assert_eq!(result["error"]["name"], "ChecksFailed", "{result}");
    let message = result["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("exit status 1") && message.contains("1 fix round"),
        "{message}"
    );
    assert_eq!(result["checks"]["status"], "failed", "{result}");
    assert_eq!(result["checks"]["rounds"], 1, "{result}");
    assert_eq!(result["checks"]["last"][0]["output"], "still broken\n");
    assert_eq!(
        result["turn"], 2,
        "one fix round, then the verdict: {result}"
    );
    let wait = rig
        .ok(
            "opencode_wait_for_task",
            json!({ "task_ids": [never], "timeout_ms": 0 }),
        )
        .await;
    assert_eq!(wait["tasks"][0]["status"], "failed", "{wait}");
    assert_eq!(wait["tasks"][0]["checks"]["status"], "failed", "{wait}");

    // 3.
    let result = rig.finish(&bounded).await;
    assert_eq!(result["status"], "failed", "{result}");
    let last = result["checks"]["last"].as_array().expect("last run");
    let huge = &last[0];
    assert_eq!(huge["exit"], 2, "{result}");
    assert_eq!(huge["output_cut"], true, "{result}");
    let kept = huge["output"].as_str().unwrap_or_default();
    assert!(
        kept.chars().count() <= 300 && kept.ends_with("LAST LINE\n"),
        "{kept}"
    );
    let hung = &last[1];
    assert!(hung.get("exit").is_none(), "{result}");
    assert!(
        hung["error"]
            .as_str()
            .is_some_and(|e| e.contains("timeouts.check")),
        "{result}"
    );
    let ms = hung["duration_ms"].as_u64().unwrap_or(u64::MAX);
    assert!((3000..30_000).contains(&ms), "stopped at 3 s: {ms} ms");

    // 4. Turn 1 on `fast` fails both checks (the tier's, the call's); its one fix round writes
    // fixed.txt, the call's check still fails; the next round runs on `strong`.
    let result = rig.finish(&escalated).await;
    let escalations = result["escalations"]
        .as_array()
        .unwrap_or_else(|| panic!("no escalation: {result}"));
    assert_eq!(escalations.len(), 1, "{result}");
    assert_eq!(escalations[0]["from"], "fast");
    assert_eq!(escalations[0]["to"], "strong");
    assert_eq!(
        escalations[0]["model"],
        format!("{FAKE_PROVIDER}/{FAKE_STRONG_MODEL}")
    );
    first_and_last_models(&rig, &escalated_session);
    // second.txt is never written: the chain ends failed after the strong tier's round.
    assert_eq!(result["status"], "failed", "{result}");
    assert_eq!(result["error"]["name"], "ChecksFailed", "{result}");
    // Usage counts each tier's share: the turns on `fast` under fast (the task itself under
    // strong, where it ended), and the fix rounds with them.
    let usage = rig.ok("opencode_usage", json!({})).await;
    let tier = |name: &str| {
        usage["tiers"]
            .as_array()
            .and_then(|t| t.iter().find(|g| g["name"] == name))
            .cloned()
            .unwrap_or_else(|| panic!("no tier {name}: {usage}"))
    };
    let (fast, strong) = (tier("fast"), tier("strong"));
    assert_eq!(
        (fast["tasks"].as_u64(), strong["tasks"].as_u64()),
        (Some(0), Some(1)),
        "{usage}"
    );
    assert!(fast["tokens"]["input"].as_u64() > Some(0), "{usage}");
    assert!(strong["tokens"]["input"].as_u64() > Some(0), "{usage}");
    let model_tokens = |name: &str| {
        usage["models"]
            .as_array()
            .and_then(|t| t.iter().find(|g| g["name"] == name))
            .and_then(|g| g["tokens"]["input"].as_u64())
            .unwrap_or_default()
    };
    assert!(
        model_tokens(&format!("{FAKE_PROVIDER}/{FAKE_STRONG_MODEL}")) > 0,
        "{usage}"
    );

    // 5.
    let result = rig.finish(&repo).await;
    assert_eq!(result["status"], "completed", "{result}");
    assert!(result.get("checks").is_none(), "{result}");
    assert!(
        !std::path::Path::new(&repo_dir).join("PWNED").exists(),
        "the repository's check ran"
    );

    // 6. A follow-up adds a check of its own: both run after its turn, with a whole set of
    // rounds.
    rig.ok(
        "opencode_continue_task",
        json!({ "task_id": fixed, "prompt": "add extra [[write:extra.txt:x]]",
                "checks": ["test -f extra.txt"] }),
    )
    .await;
    let result = rig.finish(&fixed).await;
    assert_eq!(result["status"], "completed", "{result}");
    assert_eq!(result["checks"]["status"], "passed", "{result}");
    assert_eq!(result["checks"]["rounds"], 0, "{result}");
    let commands: Vec<&str> = result["checks"]["last"]
        .as_array()
        .map(|l| l.iter().filter_map(|r| r["command"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(commands, [NEEDS_FIX, "test -f extra.txt"], "{result}");

    // 7. A task whose first turn reaches its token cap gets no fix round: it ends ChecksFailed
    // saying why. The cap is what the same turn spends, read from a probe task.
    let probe_dir = dir(env, "probe");
    let (probe, _) = start(
        &rig,
        json!({ "prompt": "probe [[usage:1000]]", "directory": probe_dir }),
    )
    .await;
    let probe = rig.finish(&probe).await;
    let t = &probe["tokens"];
    let spent: u64 = ["input", "output", "reasoning", "cache_read", "cache_write"]
        .iter()
        .filter_map(|k| t[*k].as_u64())
        .sum();
    assert!(spent >= 1000, "{probe}");
    let capped_dir = dir(env, "capped");
    let (capped, capped_session) = start(
        &rig,
        json!({ "prompt": "capped [[usage:1000]]", "directory": capped_dir,
                "checks": ["exit 1"], "budget": { "max_tokens": spent } }),
    )
    .await;
    let result = rig.finish(&capped).await;
    assert_eq!(result["status"], "failed", "{result}");
    assert_eq!(result["error"]["name"], "ChecksFailed", "{result}");
    let message = result["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("no fix round was sent"), "{message}");
    assert_eq!(result["turn"], 1, "{result}");
    assert_eq!(
        rig.model_calls(&capped_session),
        1,
        "no model call after the cap"
    );
}

/// A provider outage OpenCode's retries do not clear (the scripted model answers 500 to every
/// request of the first prompt) moves the task, in the same session, to its tier's fallback
/// model, or to its `escalate_to` tier's model; the result lists the move and the models used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_outage_moves_the_task_to_a_fallback_model_or_a_stronger_tier() {
    let env = OpenCodeEnv::new();
    let model = format!("{FAKE_PROVIDER}/{FAKE_MODEL}");
    let strong = format!("{FAKE_PROVIDER}/{FAKE_STRONG_MODEL}");
    let path = env.home_dir().join("user-delegation.yaml");
    std::fs::write(
        &path,
        format!(
            "tiers:\n  \
             - {{name: fast, handles: quick work, models: [{model}], fallback_models: [{strong}]}}\n  \
             - {{name: cheap, handles: cheap work, models: [{model}], escalate_to: strong}}\n  \
             - {{name: strong, handles: hard work, models: [{strong}]}}\n  \
             - {{name: lone, handles: no way out, models: [{model}]}}\n"
        ),
    )
    .expect("write the user's delegation.yaml");
    let config = path.to_string_lossy().into_owned();
    let rig = Rig::start_in(
        FakeLlm::start(),
        env,
        &[("OPENCODE_MCP_CONFIG", config.as_str())],
    )
    .await;
    let outage = "the provider is down [[error500:20]]";
    let (fallback, fallback_session) =
        start(&rig, json!({ "prompt": outage, "tier": "fast" })).await;
    let (escalated, escalated_session) =
        start(&rig, json!({ "prompt": outage, "tier": "cheap" })).await;
    let (stuck, _) = start(&rig, json!({ "prompt": outage, "tier": "lone" })).await;

    for (id, session, from, to) in [
        (&fallback, &fallback_session, "fast", "fast"),
        (&escalated, &escalated_session, "cheap", "strong"),
    ] {
        let result = rig.finish(id).await;
        assert_eq!(result["status"], "completed", "{result}");
        let moves = result["escalations"]
            .as_array()
            .unwrap_or_else(|| panic!("no escalation: {result}"));
        assert_eq!(moves.len(), 1, "{result}");
        assert_eq!(moves[0]["from"], from, "{result}");
        assert_eq!(moves[0]["to"], to, "{result}");
        assert_eq!(moves[0]["from_model"], model.as_str(), "{result}");
        assert_eq!(moves[0]["model"], strong.as_str(), "{result}");
        // The scripted 500, or the dropped connection the fake sometimes leaves on a retry
        // (which OpenCode marks retryable): both are outages.
        assert!(
            moves[0]["why"]
                .as_str()
                .is_some_and(|w| w.starts_with("provider error: APIError")),
            "{result}"
        );
        first_and_last_models(&rig, session);
        // The model that answered is the one moved to.
        assert_eq!(result["model"], strong.as_str(), "{result}");
    }
    // A tier with nowhere to go fails with the provider's error, as before.
    let result = rig.finish(&stuck).await;
    assert_eq!(result["status"], "failed", "{result}");
    assert!(result.get("escalations").is_none(), "{result}");
}

/// **A held task says where it stands, and its checks are not cut off by the task's deadline.**
/// While a task's checks run, it reads `running` (as hosts expect) with `phase: held_checks`
/// beside it, in status and in the task list of the CLI, which reads the saved record. The
/// check outlasts `timeouts.task` (20 s, counted from the turn's start): the turn ended in time,
/// so the task stays held, and once the checks passed, the phase is gone and the task is
/// `completed`, not `timed_out`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_held_for_its_checks_shows_that_phase() {
    const DEADLINE: std::time::Duration = std::time::Duration::from_secs(20);
    let env = OpenCodeEnv::new();
    let config = env.home_dir().join("user-delegation.yaml");
    std::fs::write(
        &config,
        format!(
            "checks:\n  from_calls: true\ntimeouts:\n  task: {}s\n",
            DEADLINE.as_secs()
        ),
    )
    .expect("the user's file");
    let config_var = config.display().to_string();
    let rig = Rig::start_in(
        FakeLlm::start(),
        env,
        &[("OPENCODE_MCP_CONFIG", config_var.as_str())],
    )
    .await;
    let gate = rig.env.root().join("checks-gate");
    let check = format!("until test -f {}; do sleep 0.1; done", gate.display());
    let began = std::time::Instant::now();
    let (task, _) = start(&rig, json!({ "prompt": "held", "checks": [check] })).await;
    let mut seen = Value::Null;
    for _ in 0..600 {
        seen = rig
            .ok("opencode_get_task_status", json!({ "task_id": task }))
            .await;
        if seen["phase"] == "held_checks" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(seen["phase"], "held_checks", "{seen}");
    assert_eq!(seen["status"], "running", "{seen}");

    // The CLI reads the saved record, which the store writes just after the change.
    let listed = |rig: &Rig| -> Value {
        let (_, stdout, stderr) = rig.cli(&["tasks", "--json"], &[]);
        let all: Value = serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("tasks --json: {e}: {stdout}\n{stderr}"));
        all.as_array()
            .and_then(|l| l.iter().find(|t| t["task_id"] == task.as_str()).cloned())
            .unwrap_or_else(|| panic!("the task is listed: {all}"))
    };
    let mut line = Value::Null;
    for _ in 0..50 {
        line = listed(&rig);
        if line["phase"] == "held_checks" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert_eq!(
        (&line["status"], &line["phase"]),
        (&json!("running"), &json!("held_checks")),
        "{line}"
    );

    // The deadline passes while the check still runs: the time itself is what is tested.
    tokio::time::sleep(
        (began + DEADLINE + std::time::Duration::from_secs(1))
            .duration_since(std::time::Instant::now()),
    )
    .await;
    let still = rig
        .ok("opencode_get_task_status", json!({ "task_id": task }))
        .await;
    assert_eq!(
        (&still["status"], &still["phase"]),
        (&json!("running"), &json!("held_checks")),
        "past timeouts.task, a turn that ended in time is still held for its check: {still}"
    );

    std::fs::write(&gate, "open").expect("open the gate");
    let done = rig.finish(&task).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert!(done.get("phase").is_none(), "{done}");
}

//! The usage report and the task list, end to end: a real gateway over stdio and a real OpenCode
//! against the scripted fake LLM (`[[usage:<n>]]` sets the prompt tokens of its answers). Two
//! tasks run (one on a tier, one without); then `opencode_usage`, `opencode-mcp usage --json`
//! and `opencode-mcp tasks --json` must agree with the tasks' own `get_task_result` numbers.

mod support;

use serde_json::{json, Value};
use support::rig::Rig;

/// The reference price set for this test (dollars per million tokens), through the same
/// environment layer for the gateway and the subcommands.
const PRICE_ENV: [(&str, &str); 2] = [
    ("OPENCODE_MCP_REPORT__REFERENCE_PRICE__INPUT_PER_MTOK", "2"),
    (
        "OPENCODE_MCP_REPORT__REFERENCE_PRICE__OUTPUT_PER_MTOK",
        "10",
    ),
];

/// Runs the gateway binary's subcommand `args` in the rig's environment, with the prices set;
/// (ok, stdout, stderr).
fn cli(rig: &Rig, args: &[&str]) -> (bool, String, String) {
    rig.cli(args, &PRICE_ENV)
}

fn u(v: &Value) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| panic!("not an unsigned integer: {v}"))
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

const TOKEN_KINDS: [&str; 5] = ["input", "output", "reasoning", "cache_read", "cache_write"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_and_task_list_match_the_tasks_own_results() {
    let rig = Rig::start(&PRICE_ENV).await;

    // Run one after the other, so the second is strictly the newer.
    let a = rig
        .start_task_with(json!({ "prompt": "first [[usage:1234]]", "tier": "fast" }))
        .await;
    let a_id = a["task_id"].as_str().expect("task_id").to_string();
    let a_result = rig.finish(&a_id).await;
    let b = rig.start_task("second [[usage:4321]]").await;
    let b_id = b["task_id"].as_str().expect("task_id").to_string();
    let b_first = rig.finish(&b_id).await;
    // A follow-up replaces the task's result with its own turn; the report counts both turns.
    rig.ok(
        "opencode_continue_task",
        json!({ "task_id": b_id, "prompt": "and more [[usage:777]]" }),
    )
    .await;
    let b_result = rig.finish(&b_id).await;
    for r in [&a_result, &b_first, &b_result] {
        assert_eq!(r["status"], "completed", "{r}");
    }
    assert!(
        u(&b_result["tokens"]["input"]) < 4321,
        "the second turn's own: {b_result}"
    );
    // The markers reached OpenCode's accounting: the sums below are not sums of zeros.
    assert!(u(&a_result["tokens"]["input"]) >= 1234, "{a_result}");
    assert!(u(&b_first["tokens"]["input"]) >= 4321, "{b_first}");

    let mut expected_tokens = json!({});
    for kind in TOKEN_KINDS {
        expected_tokens[kind] = json!(
            u(&a_result["tokens"][kind])
                + u(&b_first["tokens"][kind])
                + u(&b_result["tokens"][kind])
        );
    }
    let expected_cost = f(&a_result["cost"]) + f(&b_first["cost"]) + f(&b_result["cost"]);
    let t = &expected_tokens;
    let expected_reference = ((u(&t["input"]) + u(&t["cache_read"]) + u(&t["cache_write"])) as f64
        * 2.0
        + (u(&t["output"]) + u(&t["reasoning"])) as f64 * 10.0)
        / 1e6;

    let check = |who: &str, report: &Value| {
        let total = &report["total"];
        assert_eq!(total["tasks"], 2, "{who}: {report}");
        assert_eq!(
            total["statuses"],
            json!({ "completed": 2 }),
            "{who}: {report}"
        );
        assert_eq!(total["tokens"], expected_tokens, "{who}: {report}");
        assert!(
            (f(&total["cost"]) - expected_cost).abs() < 1e-9,
            "{who}: {report}"
        );
        assert!(
            (f(&total["reference_cost"]) - expected_reference).abs() < 1e-9,
            "{who}: {report}"
        );
        assert!(
            (f(&total["saving"]) - (expected_reference - expected_cost)).abs() < 1e-9,
            "{who}: {report}"
        );
        assert_eq!(
            report["reference_price"],
            json!({ "input_per_mtok": 2.0, "output_per_mtok": 10.0 }),
            "{who}"
        );
        // Per tier: the tier task alone under `fast`, the other under `(none)`.
        let tiers: Vec<(String, u64, u64)> = report["tiers"]
            .as_array()
            .expect("tiers")
            .iter()
            .map(|g| {
                (
                    g["name"].as_str().unwrap_or_default().to_string(),
                    u(&g["tasks"]),
                    u(&g["tokens"]["input"]),
                )
            })
            .collect();
        assert_eq!(
            tiers,
            [
                (
                    "(none)".to_string(),
                    1,
                    u(&b_first["tokens"]["input"]) + u(&b_result["tokens"]["input"]),
                ),
                ("fast".to_string(), 1, u(&a_result["tokens"]["input"])),
            ],
            "{who}"
        );
    };

    // The tool, by default over the gateway's lifetime (both tasks ran in it).
    let tool = rig.ok("opencode_usage", json!({})).await;
    check("opencode_usage", &tool);
    let (code, message) = rig
        .err("opencode_usage", json!({ "since": "yesterday" }))
        .await;
    assert_eq!(code, "invalid_argument", "{message}");
    assert!(
        message.contains("`since`") && message.contains("`yesterday`"),
        "{message}"
    );

    // The subcommand reads the state directory beside the running gateway. The store is written
    // behind the registry, so it is read again (bounded) until the last turn's record is there.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let cli_report = loop {
        let (ok, stdout, stderr) = cli(&rig, &["usage", "--json"]);
        assert!(ok, "{stderr}");
        let report: Value = serde_json::from_str(&stdout).expect("usage --json is JSON");
        if report["total"]["tokens"] == expected_tokens || std::time::Instant::now() >= deadline {
            break report;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    check("opencode-mcp usage --json", &cli_report);
    let (ok, stdout, stderr) = cli(&rig, &["usage", "--since", "1h"]);
    assert!(ok, "{stderr}");
    assert!(stdout.starts_with("2 task(s) since "), "{stdout}");
    let (ok, _, stderr) = cli(&rig, &["usage", "--since", "soon"]);
    assert!(!ok);
    assert!(
        stderr.contains("--since") && stderr.contains("`soon`") && stderr.contains("45s"),
        "{stderr}"
    );

    // The list: newest first, with their statuses and the tier where there was one.
    let (ok, stdout, stderr) = cli(&rig, &["tasks", "--json"]);
    assert!(ok, "{stderr}");
    let lines: Value = serde_json::from_str(&stdout).expect("tasks --json is JSON");
    let listed: Vec<(&str, &str, Option<&str>)> = lines
        .as_array()
        .expect("a list")
        .iter()
        .map(|l| {
            (
                l["task_id"].as_str().unwrap_or_default(),
                l["status"].as_str().unwrap_or_default(),
                l["tier"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        [
            (b_id.as_str(), "completed", None),
            (a_id.as_str(), "completed", Some("fast")),
        ]
    );
    let (ok, stdout, _) = cli(&rig, &["tasks", "--status", "failed", "--json"]);
    assert!(ok);
    assert_eq!(serde_json::from_str::<Value>(&stdout).ok(), Some(json!([])));
    let (ok, _, stderr) = cli(&rig, &["tasks", "--status", "done"]);
    assert!(!ok && stderr.contains("`done`"), "{stderr}");

    // The tool lists the same, and `limit` cuts it while `total` still counts both.
    let listed = rig.ok("opencode_list_tasks", json!({ "limit": 1 })).await;
    assert_eq!(listed["total"], 2, "{listed}");
    assert_eq!(listed["tasks"][0]["task_id"], json!(b_id), "{listed}");
    assert_eq!(listed["tasks"].as_array().map(Vec::len), Some(1));

    // A running task is listed too, first, with its status as stored (the store is written
    // behind the registry, so the list is polled with a bound).
    let c = rig.start_task("third [[delay:60000]]").await;
    let c_id = c["task_id"].as_str().expect("task_id").to_string();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let running = loop {
        let (ok, stdout, stderr) = cli(&rig, &["tasks", "--status", "running", "--json"]);
        assert!(ok, "{stderr}");
        let list: Value = serde_json::from_str(&stdout).expect("tasks --json is JSON");
        if list.as_array().is_some_and(|l| !l.is_empty()) {
            break list;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the running task was never listed as running: {stdout}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(running.as_array().map(Vec::len), Some(1), "{running}");
    assert_eq!(running[0]["task_id"], json!(c_id), "{running}");
    let (ok, stdout, _) = cli(&rig, &["tasks", "--json"]);
    assert!(ok);
    let all: Value = serde_json::from_str(&stdout).expect("tasks --json is JSON");
    let order: Vec<(&str, &str)> = all
        .as_array()
        .into_iter()
        .flatten()
        .map(|l| {
            (
                l["task_id"].as_str().unwrap_or_default(),
                l["status"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        order,
        [
            (c_id.as_str(), "running"),
            (b_id.as_str(), "completed"),
            (a_id.as_str(), "completed"),
        ]
    );
    rig.ok("opencode_cancel_task", json!({ "task_id": c_id }))
        .await;
}

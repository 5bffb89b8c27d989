//! Real MCP hosts' clients against the gateway, with a real OpenCode behind it.
//!
//! - TypeScript SDK 1.x (`@modelcontextprotocol/sdk`, the client of the MCP Inspector and of many
//!   hosts): it validates `structuredContent` against the tool's `outputSchema` even on error
//!   results. The pinned version is installed from npm under the target dir on first use
//!   (needs Node.js and npm); the client script is `tests/hosts/ts_sdk_client.mjs`.
//! - TypeScript SDK 2.x (`@modelcontextprotocol/client`, the split packages that replace 1.x):
//!   the same client script, pinned and installed the same way.
//! - OpenAI Codex CLI (`@openai/codex`, pinned, installed from npm under the target dir on first
//!   use): `codex exec --json` with the gateway as its MCP server and a scripted fake Responses
//!   API as its model; the test reads what Codex showed its model of each tool result
//!   (`tests/hosts/codex.rs`, `tests/support/fake_responses.rs`).
//! - Claude Code (`@anthropic-ai/claude-code`, pinned, installed from npm the same way), run
//!   headless with its model API faked on 127.0.0.1 ([`support::fake_anthropic`]): the test reads
//!   the `tool_result` blocks it sends back, i.e. exactly what the host showed its model. Helpers
//!   in `tests/hosts/claude_code.rs`.
//!
//! Claude Code and Codex each also read one long answer through `wait_for_task` and as many
//! `get_task_result` pages as it takes: the gateway's per-host result budget is only right if
//! every one of those results reaches the model whole, which only the real host can show.

mod support;

#[path = "hosts/claude_code.rs"]
mod claude_code;
#[path = "hosts/codex.rs"]
mod codex;

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use support::fake_anthropic::{FakeAnthropic, Step, ToolResult};
use support::fake_llm::echo_reply;
use support::npm::Install;
use support::{opencode_bin, FakeLlm, OpenCodeEnv};

/// The TypeScript SDK 1.x release the suite is pinned to.
const TS_SDK_1: &str = "1.32.2";
/// The TypeScript SDK 2.x release the suite is pinned to: 2.x ships the client as its own
/// package, `@modelcontextprotocol/client`.
const TS_SDK_2: &str = "2.4.0";

/// The npm prefix holding `package@version`, installed on first use.
fn ts_sdk(package: &str, version: &str, dir_name: &str) -> std::path::PathBuf {
    Install {
        package,
        version,
        dir_name,
        skip_hint: "install it there yourself with npm",
    }
    .ensure(|dir| {
        let manifest = dir.join("node_modules").join(package).join("package.json");
        let text = std::fs::read_to_string(&manifest).map_err(|e| e.to_string())?;
        let found: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        if found["version"] == version {
            Ok(dir.to_path_buf())
        } else {
            Err(format!("found version {}", found["version"]))
        }
    })
}

/// Runs `tests/hosts/ts_sdk_client.mjs` with the SDK installed under `sdk` against a gateway with
/// a real OpenCode behind it, and checks its report: the SDK is `package@version`, it accepted
/// every result, and each error result reads as the gateway's JSON error.
fn the_typescript_sdk_accepts_every_result(sdk: &std::path::Path, package: &str, version: &str) {
    let fake = FakeLlm::start();
    let env = OpenCodeEnv::new();
    let mut vars: serde_json::Map<String, Value> = env
        .vars(&fake.url())
        .into_iter()
        .map(|(k, v)| (k, Value::String(v)))
        .collect();
    vars.insert(
        "OPENCODE_MCP_OPENCODE__COMMAND".into(),
        Value::String(opencode_bin().display().to_string()),
    );
    if let Ok(path) = std::env::var("PATH") {
        vars.insert("PATH".into(), Value::String(path));
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/hosts/ts_sdk_client.mjs");
    let output = Command::new("node")
        .arg(script)
        .env("SDK_DIR", sdk)
        .env("GATEWAY_BIN", env!("CARGO_BIN_EXE_opencode-mcp"))
        .env("GATEWAY_CWD", env.work_dir())
        .env("GATEWAY_ENV", Value::Object(vars).to_string())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run node (install Node.js to run this test): {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the client script failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("not the client's report ({e}): {stdout}"));
    assert_eq!(report["sdkPackage"], package);
    assert_eq!(report["sdkVersion"], version);
    let calls = report["calls"].as_array().expect("calls");
    let tools = report["tools"].as_array().expect("tools");
    assert!(tools.len() >= 10, "{tools:?}");
    let rejected: Vec<&Value> = calls.iter().filter(|c| c["ok"] != true).collect();
    assert!(
        rejected.is_empty(),
        "the SDK rejected results: {rejected:#?}"
    );
    for c in calls {
        let expect_error = c["case"] == "error";
        assert_eq!(c["isError"], expect_error, "{c}");
        if expect_error {
            // The model reads the error as JSON text: code and message.
            let body: Value = serde_json::from_str(c["text"].as_str().unwrap_or_default())
                .unwrap_or_else(|e| panic!("error text is not JSON ({e}): {c}"));
            assert!(body["error"]["code"].is_string(), "{c}");
            assert!(body["error"]["message"].is_string(), "{c}");
        }
    }
    let errors = calls.iter().filter(|c| c["case"] == "error").count();
    assert_eq!(errors, tools.len(), "every tool's error path was called");
}

/// Every tool's success and error paths reach a TypeScript SDK 1.x client as results it accepts:
/// before, every error result failed on the client with "-32602 Structured content does not
/// match the tool's output schema".
#[test]
fn the_typescript_sdk_1_accepts_every_result() {
    let package = "@modelcontextprotocol/sdk";
    let sdk = ts_sdk(package, TS_SDK_1, &format!("ts-sdk-{TS_SDK_1}"));
    the_typescript_sdk_accepts_every_result(&sdk, package, TS_SDK_1);
}

/// The same run with the TypeScript SDK 2.x client, which hosts move to: a new package with its
/// own output-schema validation (compiled from the listed tools, checked on every call), so 1.x
/// passing says nothing about it.
#[test]
fn the_typescript_sdk_2_accepts_every_result() {
    let package = "@modelcontextprotocol/client";
    let sdk = ts_sdk(package, TS_SDK_2, &format!("ts-sdk-client-{TS_SDK_2}"));
    the_typescript_sdk_accepts_every_result(&sdk, package, TS_SDK_2);
}

/// Codex drives a whole delegation through the gateway in one `codex exec`: start a server, list
/// agents, start two tasks at once, wait for both, read the results, hit an unknown task id. The
/// test checks what Codex showed its model of each result (the `function_call_output` items it
/// sent back to the fake Responses API), and that when Codex exits no gateway and no OpenCode is
/// left behind.
#[test]
fn codex_delegates_through_the_gateway() {
    use codex::{shown_json, tool, tool_with};
    use std::collections::BTreeSet;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;
    use support::fake_responses::{FakeResponses, Step, ToolOutput};

    codex::codex_bin(); // install before the run's clock starts
    let llm = FakeLlm::start();
    let env = OpenCodeEnv::new();
    let prompts = ["first task from codex", "second task from codex"];
    let final_text = "All delegated work is done.";

    // What the model's next call needs from the results it has seen.
    let server_id = |outputs: &[ToolOutput]| -> Result<Value, String> {
        let out = outputs
            .iter()
            .find(|o| o.name == "opencode_start_server")
            .ok_or("no start_server output yet")?;
        shown_json(out)?
            .get("server_id")
            .cloned()
            .ok_or_else(|| format!("no server_id in {}", out.text()))
    };
    let task_ids = |outputs: &[ToolOutput]| -> Result<Vec<Value>, String> {
        outputs
            .iter()
            .filter(|o| o.name == "opencode_start_task")
            .map(|o| {
                shown_json(o)?
                    .get("task_id")
                    .cloned()
                    .ok_or_else(|| format!("no task_id in {}", o.text()))
            })
            .collect()
    };
    // The processes of this env while the tasks run: the gateway and its OpenCode.
    let live_during_run = Arc::new(Mutex::new(BTreeSet::new()));
    let seen = live_during_run.clone();
    let data_home = codex::data_home(&env);
    let start_task = move |prompt: &'static str| {
        tool_with("opencode_start_task", move |o| {
            Ok(json!({"server_id": server_id(o)?, "prompt": prompt}))
        })
    };
    let result_of = move |k: usize| {
        tool_with("opencode_get_task_result", move |o| {
            Ok(json!({"task_id": task_ids(o)?[k]}))
        })
    };
    let script = vec![
        Step::Calls(vec![tool("opencode_start_server", json!({}))]),
        Step::Calls(vec![tool_with("opencode_list_agents", move |o| {
            Ok(json!({"server_id": server_id(o)?}))
        })]),
        Step::Calls(vec![start_task(prompts[0]), start_task(prompts[1])]),
        Step::Calls(vec![tool_with("opencode_wait_for_task", move |o| {
            // Names are read now: by the time the test looks, these processes are gone.
            *seen.lock().unwrap() = codex::processes_with_data_home(&data_home)
                .into_iter()
                .map(|pid| {
                    (
                        pid,
                        support::procs::stat(pid)
                            .map(|p| p.comm)
                            .unwrap_or_default(),
                    )
                })
                .collect();
            Ok(json!({"task_ids": task_ids(o)?, "mode": "all", "timeout_ms": 60000}))
        })]),
        Step::Calls(vec![
            result_of(0),
            result_of(1),
            tool(
                "opencode_get_task_result",
                json!({"task_id": "tsk_unknown"}),
            ),
        ]),
        Step::Text(final_text.into()),
    ];
    let steps = script.len();
    let fake = FakeResponses::start(script);
    let home = codex::CodexHome::new(
        &fake,
        &codex::gateway_env(&env, &llm.url()),
        codex::ServerOptions {
            approval_mode: Some("approve"),
            ..Default::default()
        },
    );
    let run = codex::exec(
        &home,
        &env.work_dir(),
        "Delegate the work to OpenCode.",
        Duration::from_secs(120),
    );
    let ctx = || {
        let outputs: Vec<String> = fake
            .tool_outputs()
            .iter()
            .map(|o| format!("{} {} => {}", o.name, o.arguments, o.output))
            .collect();
        format!(
            "{}\n--- tool outputs\n{}",
            run.describe(),
            outputs.join("\n")
        )
    };
    run.assert_scripted(&fake, &ctx());
    assert_eq!(fake.steps_served(), steps, "{}", ctx());

    // The model was offered the gateway's tools as one namespace.
    let first = fake
        .requests()
        .into_iter()
        .find(|r| r.is_responses())
        .expect("a request");
    let namespace = first
        .tools()
        .iter()
        .find(|t| t["type"] == "namespace" && t["name"] == codex::NAMESPACE)
        .unwrap_or_else(|| {
            panic!(
                "no {} namespace tool in {:?}",
                codex::NAMESPACE,
                first.tools()
            )
        });
    assert_eq!(
        namespace["tools"].as_array().map(Vec::len),
        Some(default_tool_count()),
        "every enabled tool reaches the model: {namespace}"
    );

    // What the model saw, call by call.
    let outputs = fake.tool_outputs();
    let names: Vec<&str> = outputs.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "opencode_start_server",
            "opencode_list_agents",
            "opencode_start_task",
            "opencode_start_task",
            "opencode_wait_for_task",
            "opencode_get_task_result",
            "opencode_get_task_result",
            "opencode_get_task_result",
        ],
        "{}",
        ctx()
    );
    assert!(outputs
        .iter()
        .all(|o| o.namespace.as_deref() == Some(codex::NAMESPACE)));
    let shown: Vec<Value> = outputs[..7]
        .iter()
        .map(|o| shown_json(o).unwrap_or_else(|e| panic!("{e}\n{}", ctx())))
        .collect();
    let server = &shown[0];
    assert!(
        server["server_id"]
            .as_str()
            .is_some_and(|s| s.starts_with("srv_")),
        "{server}"
    );
    assert_eq!(server["version"], support::pinned_version(), "{server}");
    let agents: Vec<&str> = shown[1]["agents"]
        .as_array()
        .map(|a| a.iter().filter_map(|a| a["name"].as_str()).collect())
        .unwrap_or_default();
    assert!(agents.contains(&"build"), "{}", shown[1]);
    let ids: Vec<&str> = shown[2..4]
        .iter()
        .filter_map(|t| t["task_id"].as_str())
        .collect();
    assert_eq!(ids.len(), 2, "{shown:?}");
    assert_ne!(ids[0], ids[1]);
    let wait = &shown[4];
    assert_eq!(wait["done"], true, "{wait}");
    assert_eq!(wait["timed_out"], false, "{wait}");
    assert_eq!(wait["finished"], json!(ids), "{wait}");
    for (k, result) in shown[5..7].iter().enumerate() {
        assert_eq!(result["task_id"], ids[k], "{result}");
        assert_eq!(result["status"], "completed", "{result}");
        assert_eq!(result["text"], format!("ECHO: {}", prompts[k]), "{result}");
    }
    // The unknown id: an error result, shown as the gateway's JSON error text.
    let error = shown_json(&outputs[7]).unwrap_or_else(|e| panic!("{e}\n{}", ctx()));
    assert_eq!(error["error"]["code"], "not_found", "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("tsk_unknown")),
        "{error}"
    );

    // Codex's own account: the error call failed, every other call completed, and the turn
    // ended with the model's final text.
    let statuses: Vec<(&str, &str)> = run
        .events
        .iter()
        .filter(|e| e["type"] == "item.completed" && e["item"]["type"] == "mcp_tool_call")
        .map(|e| {
            (
                e["item"]["tool"].as_str().unwrap_or_default(),
                e["item"]["status"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(statuses.len(), 8, "{statuses:?}");
    assert_eq!(
        statuses.iter().filter(|s| s.1 == "failed").count(),
        1,
        "{statuses:?}"
    );
    assert!(
        run.events
            .iter()
            .any(|e| e["item"]["type"] == "agent_message" && e["item"]["text"] == final_text),
        "{}",
        ctx()
    );

    // While the tasks ran, the gateway and the OpenCode it started were up; after Codex
    // exited, neither (nor anything else of this env) is left.
    let during = live_during_run.lock().unwrap().clone();
    let opencode_pid = server["pid"]
        .as_u64()
        .expect("start_server reports the pid") as u32;
    assert!(
        during.iter().any(|(pid, _)| *pid == opencode_pid),
        "OpenCode {opencode_pid} not among {during:?}"
    );
    assert!(
        during.iter().any(|(_, name)| name == "opencode-mcp"),
        "no gateway among {during:?}"
    );
    match codex::wait_none_left(&env, Duration::from_secs(15)) {
        Ok(took) => eprintln!(
            "codex exec took {:?}; its processes were gone {took:?} after",
            run.elapsed
        ),
        Err(left) => panic!(
            "left behind after codex exited: {}",
            support::procs::describe(&left)
        ),
    }
}

/// `codex exec` cannot ask anyone, so Codex refuses MCP tools it would want approved ("MCP tool
/// call requires approval, but approval policy is never"): by default those annotated
/// destructive (start_task, continue_task, reply_permission). `default_tools_approval_mode =
/// "approve"` on the server, as docs/hosts.md recommends, lets every tool through. Each tool is
/// called once with arguments naming nothing that exists, so no OpenCode starts; a call that
/// reached the gateway shows its JSON error.
#[test]
fn codex_runs_destructive_tools_only_when_approved() {
    use support::fake_responses::{FakeResponses, Step};

    const REFUSED: &str = "MCP tool call requires approval, but approval policy is never";
    let calls = [
        (
            "opencode_start_server",
            json!({"directory": "/nonexistent/codex-host"}),
        ),
        ("opencode_stop_server", json!({"server_id": "srv_nope"})),
        ("opencode_list_agents", json!({"server_id": "srv_nope"})),
        (
            "opencode_start_task",
            json!({"server_id": "srv_nope", "prompt": "x"}),
        ),
        (
            "opencode_continue_task",
            json!({"task_id": "tsk_nope", "prompt": "x"}),
        ),
        ("opencode_cancel_task", json!({"task_id": "tsk_nope"})),
        ("opencode_get_task_status", json!({"task_id": "tsk_nope"})),
        ("opencode_get_task_result", json!({"task_id": "tsk_nope"})),
        ("opencode_wait_for_task", json!({"task_ids": ["tsk_nope"]})),
        (
            "opencode_reply_permission",
            json!({"task_id": "tsk_nope", "reply": "once"}),
        ),
    ];
    codex::codex_bin();
    let env = OpenCodeEnv::new();
    // No OpenCode starts here, so its model is never called; any 127.0.0.1 URL will do.
    let gateway_env = codex::gateway_env(&env, "http://127.0.0.1:9/v1");
    let refused_under = |approval_mode: Option<&'static str>| -> Vec<String> {
        let script = vec![
            Step::Calls(
                calls
                    .iter()
                    .map(|(name, args)| codex::tool(name, args.clone()))
                    .collect(),
            ),
            Step::Text("done".into()),
        ];
        let fake = FakeResponses::start(script);
        let home = codex::CodexHome::new(
            &fake,
            &gateway_env,
            codex::ServerOptions {
                approval_mode,
                ..Default::default()
            },
        );
        let run = codex::exec(
            &home,
            &env.work_dir(),
            "Call every tool.",
            std::time::Duration::from_secs(60),
        );
        assert!(run.status.success(), "{}", run.describe());
        let outputs = fake.tool_outputs();
        assert_eq!(outputs.len(), calls.len(), "{}", run.describe());
        let mut refused = Vec::new();
        for out in &outputs {
            let text = codex::shown_text(out);
            if text == REFUSED {
                refused.push(out.name.clone());
                continue;
            }
            // Not refused: the gateway answered, with its JSON error.
            let body: Value = serde_json::from_str(&text).unwrap_or_else(|e| {
                panic!(
                    "{} showed neither JSON nor the refusal ({e}): {text}",
                    out.name
                )
            });
            assert!(body["error"]["code"].is_string(), "{}: {text}", out.name);
        }
        refused.sort();
        refused
    };
    assert_eq!(
        refused_under(None),
        [
            "opencode_continue_task",
            "opencode_reply_permission",
            "opencode_start_task"
        ],
        "without an approval mode Codex refuses exactly the destructive tools"
    );
    assert_eq!(
        refused_under(Some("approve")),
        Vec::<String>::new(),
        "with default_tools_approval_mode = \"approve\" every tool runs"
    );
}

/// Field `key` of the `nth` result of gateway tool `tool` that the model saw.
fn id_from(results: &[ToolResult], tool: &str, nth: usize, key: &str) -> Value {
    let found = results
        .iter()
        .filter(|r| r.name == claude_code::tool(tool))
        .nth(nth)
        .unwrap_or_else(|| panic!("no result #{nth} of {tool} yet: {results:#?}"));
    let value = found.json()[key].clone();
    assert!(
        value.is_string(),
        "no {key} in the {tool} result: {}",
        found.text
    );
    value
}

/// The user's global `delegation.yaml` of `env` (`$XDG_CONFIG_HOME/opencode-mcp/`), its
/// directory made: the layer that hot reload applies (the repository's file applies at start).
fn user_config_file(env: &OpenCodeEnv) -> std::path::PathBuf {
    let dir = env.root().join("config/opencode-mcp");
    std::fs::create_dir_all(&dir).expect("the user's config directory");
    dir.join("delegation.yaml")
}

/// Hot reload as Codex sees it: the user's `delegation.yaml` gains a tool while `codex exec`
/// runs (written when the fake model's first answer goes out). The gateway reloads and notifies,
/// but Codex keeps offering the tools it listed at start.
#[test]
fn codex_keeps_its_tool_list_through_a_reload() {
    use codex::{shown_json, tool_with};
    use std::time::Duration;
    use support::fake_responses::{FakeResponses, Step};

    codex::codex_bin();
    let llm = FakeLlm::start();
    let env = OpenCodeEnv::new();
    let user_file = user_config_file(&env);
    let script = vec![
        Step::Calls(vec![tool_with("opencode_start_task", move |_| {
            std::fs::write(
                &user_file,
                "tools:\n  tasks_now:\n    action: list_tasks\n    description: The stored tasks, \
                 newest first, to find one whose start reply was lost.\n",
            )
            .map_err(|e| e.to_string())?;
            Ok(json!({"server_id": "default", "prompt": "hold on [[delay:10000]]"}))
        })]),
        Step::Calls(vec![tool_with("opencode_wait_for_task", |o| {
            let started = o
                .iter()
                .find(|o| o.name == "opencode_start_task")
                .ok_or("no start_task output yet")?;
            let id = shown_json(started)?["task_id"].clone();
            Ok(json!({"task_ids": [id], "timeout_ms": 60000}))
        })]),
        Step::Calls(vec![codex::tool("tasks_now", json!({}))]),
        Step::Text("Reloaded.".into()),
    ];
    let fake = FakeResponses::start(script);
    let gateway_log = env.root().join("tmp/gateway.log");
    let home = codex::CodexHome::new(
        &fake,
        &codex::gateway_env(&env, &llm.url()),
        codex::ServerOptions {
            approval_mode: Some("approve"),
            gateway_log: Some(gateway_log.clone()),
        },
    );
    let run = codex::exec(
        &home,
        &env.work_dir(),
        "Start a task and wait for it.",
        Duration::from_secs(120),
    );
    run.assert_scripted(&fake, &run.describe());
    let log = std::fs::read_to_string(&gateway_log).unwrap_or_default();
    // The gateway reloaded and told Codex (the notification itself is shown to reach a host in
    // the Claude Code test and tests/reload.rs).
    assert!(
        log.contains("configuration reloaded") && log.contains("tools_changed=true"),
        "{log}"
    );
    let offered = |r: &support::fake_responses::RecordedRequest| -> Vec<String> {
        r.tools()
            .iter()
            .filter(|t| t["name"] == codex::NAMESPACE)
            .flat_map(|t| t["tools"].as_array().cloned().unwrap_or_default())
            .filter_map(|t| t["name"].as_str().map(str::to_owned))
            .collect()
    };
    let requests: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|r| r.is_responses())
        .collect();
    assert!(requests.len() >= 4, "{}", run.describe());
    // Codex 0.171.0 (`codex exec`) keeps the tool list it read at start: the new tool is never
    // offered, and a call to it is refused by Codex itself. Its users restart the session after
    // editing delegation.yaml (README).
    for r in &requests {
        let tools = offered(r);
        assert!(
            tools.contains(&"opencode_start_task".to_string()),
            "{tools:?}"
        );
        assert!(!tools.contains(&"tasks_now".to_string()), "{tools:?}");
    }
    let refused = fake
        .tool_outputs()
        .into_iter()
        .find(|o| o.name == "tasks_now")
        .unwrap_or_else(|| panic!("the call was answered: {}", run.describe()));
    assert!(
        refused.output.to_string().contains("unsupported call"),
        "{}",
        refused.output
    );
}

/// Hot reload as Claude Code sees it: the user's `delegation.yaml` gains a tool while a
/// session runs (written when the fake model's first answer goes out), the gateway sends
/// `notifications/tools/list_changed`, and Claude Code's next request to its model lists the new
/// tool, which the model can then call.
#[test]
fn claude_code_picks_up_a_tool_added_by_a_reload() {
    claude_code_picks_up_a_reload(claude_code::CLAUDE_CODE);
}

/// The same in Claude Code of the 2026-07-28 era, which learns of it on its
/// `subscriptions/listen` stream.
#[test]
fn claude_code_2026_picks_up_a_tool_added_by_a_reload() {
    claude_code_picks_up_a_reload(&claude_code::current_release());
}

fn claude_code_picks_up_a_reload(version: &str) {
    let fake_llm = FakeLlm::start();
    let env = OpenCodeEnv::new();
    let t = claude_code::tool;
    let user_file = user_config_file(&env);
    let script = vec![
        Step::tool(t("opencode_start_task"), move |_| {
            // Always loaded: a host that defers tools behind a search lists it in its very
            // next request, as one without search does.
            std::fs::write(
                &user_file,
                "tools:\n  tasks_now:\n    action: list_tasks\n    always_load: true\n    \
                 description: The stored tasks, newest first, to find one whose start reply was \
                 lost.\n",
            )
            .expect("write the user's delegation.yaml");
            json!({"server_id": "default", "prompt": "hold on [[delay:10000]]"})
        }),
        // Spans the reload: the task answers after 10 s, the edit is noticed in about 1.3 s.
        Step::tool(t("opencode_wait_for_task"), |r| {
            json!({"task_ids": [id_from(r, "opencode_start_task", 0, "task_id")],
                   "timeout_ms": 60000})
        }),
        Step::tool_json(t("tasks_now"), json!({})),
        Step::text("Reloaded."),
    ];
    let api = FakeAnthropic::start(&t(""), script);
    let claude = claude_code::ClaudeCode::new(&env, &fake_llm, &[("OPENCODE_MCP_LOG", "info")])
        .with_version(version);
    let run = claude.run(
        &api,
        "Start a task, wait for it, then list the tasks.",
        Duration::from_secs(240),
    );
    run.dump_if_asked(&api);
    let summary = run.summary(&api);
    assert_eq!(
        summary["result"],
        "Reloaded.",
        "{summary}\n{}",
        run.describe()
    );

    let main = api.main_requests();
    assert!(main.len() >= 4, "{}", run.describe());
    assert!(
        !main[0].tool_names().contains(&t("tasks_now")),
        "not there before the edit: {:?}",
        main[0].tool_names()
    );
    assert!(
        main[2].tool_names().contains(&t("tasks_now")),
        "listed after the reload: {:?}\n--- gateway log ---\n{}",
        main[2].tool_names(),
        claude_code::tail(&run.gateway_log, 4000)
    );
    let results = api.final_tool_results();
    let listed = results
        .iter()
        .find(|r| r.name == t("tasks_now"))
        .unwrap_or_else(|| panic!("the new tool was called: {results:#?}"));
    assert_eq!(listed.json()["total"], 1, "{}", listed.text);
    if let Err(left) = claude.wait_gateway_gone(Duration::from_secs(10)) {
        panic!("gateway processes left after Claude Code exited: {left:?}");
    }
}

/// The check every Claude Code run ends with: a debug log with a line of the plugin marketplace's
/// GitHub probe (as the 2026 release wrote before it was told not to install the marketplace)
/// fails, naming that line; a log of calls to 127.0.0.1 only passes.
#[test]
fn a_claude_code_run_that_reached_for_github_is_refused() {
    let local = "[DEBUG] MCP server \"opencode\": Successfully connected (transport: stdio)\n\
                 [WARN] Official marketplace GCS fetch failed: connect ECONNREFUSED 127.0.0.1:9\n";
    assert_eq!(claude_code::stayed_local(local), Ok(()));
    let probe = "[DEBUG] SSH config check: code=255 configured=false";
    let refused = claude_code::stayed_local(&format!("{local}{probe}\n"))
        .expect_err("an ssh probe of github.com must fail the run");
    assert!(refused.contains(probe), "{refused}");
}

/// Claude Code, headless, delegates through the gateway: start a server, list agents, start two
/// tasks, wait for both (with progress), read a result, meet an error; and when it exits, the
/// gateway and its OpenCode are gone. The assertions are on the `tool_result` blocks Claude Code
/// sent back to its (fake) model: what a real model would have read.
#[test]
fn claude_code_delegates_through_the_gateway() {
    claude_code_delegates(claude_code::CLAUDE_CODE);
}

/// The same two-call cycle in headless Claude Code of the 2026-07-28 era (`server/discover`,
/// the host named in each request's `_meta`): headless runs never offer native tasks.
#[test]
fn claude_code_2026_delegates_through_the_gateway() {
    claude_code_delegates(&claude_code::current_release());
}

fn claude_code_delegates(version: &str) {
    let fake_llm = FakeLlm::start();
    let env = OpenCodeEnv::new();
    let t = claude_code::tool;
    // The 2026-era releases run with their defaults: tools are deferred behind a tool search,
    // except the gateway's always-loaded ones. The server and agent tools are found by their
    // search hints, with words a model would use.
    let searching = version != claude_code::CLAUDE_CODE;
    let search = searching.then(|| {
        Step::tool_json(
            "ToolSearch",
            json!({"query": "OpenCode server agents", "max_results": 5}),
        )
    });
    let script: Vec<Step> = search
        .into_iter()
        .chain([
            Step::tool_json(t("opencode_start_server"), json!({})),
            Step::tool(
                t("opencode_list_agents"),
                |r| json!({"server_id": id_from(r, "opencode_start_server", 0, "server_id")}),
            ),
            Step::tool(t("opencode_start_task"), |r| {
                json!({"server_id": id_from(r, "opencode_start_server", 0, "server_id"),
                   "prompt": "first task from claude code [[delay:5000]]"})
            }),
            Step::tool(t("opencode_start_task"), |r| {
                json!({"server_id": id_from(r, "opencode_start_server", 0, "server_id"),
                   "prompt": "second task from claude code [[delay:5000]]"})
            }),
            Step::tool(t("opencode_wait_for_task"), |r| {
                json!({"task_ids": [id_from(r, "opencode_start_task", 0, "task_id"),
                                id_from(r, "opencode_start_task", 1, "task_id")],
                   "mode": "all", "timeout_ms": 60000})
            }),
            Step::tool(
                t("opencode_get_task_result"),
                |r| json!({"task_id": id_from(r, "opencode_start_task", 0, "task_id")}),
            ),
            Step::tool_json(
                t("opencode_get_task_result"),
                json!({"task_id": "tsk_nope"}),
            ),
            Step::text("All delegated work is done."),
        ])
        .collect();
    let api = FakeAnthropic::start(&t(""), script);
    let claude = claude_code::ClaudeCode::new(
        &env,
        &fake_llm,
        &[
            ("OPENCODE_MCP_TIMEOUTS__PROGRESS_INTERVAL", "200ms"),
            ("OPENCODE_MCP_LOG", "debug"),
        ],
    )
    .with_version(version);
    let run = claude.run(
        &api,
        "Delegate the two tasks to OpenCode.",
        Duration::from_secs(240),
    );
    run.dump_if_asked(&api);

    // Claude Code ran the whole script and ended with the final text.
    let summary = run.summary(&api);
    assert_eq!(summary["is_error"], false, "{summary}");
    assert_eq!(
        summary["result"], "All delegated work is done.",
        "{summary}"
    );

    // What the model saw, call by call.
    let mut results = api.final_tool_results();
    if searching {
        let first = &api.main_requests()[0];
        let offered = first.body["tools"].as_array().cloned().unwrap_or_default();
        let loaded = |name: &str| {
            offered
                .iter()
                .any(|tool| tool["name"] == t(name) && tool.get("defer_loading").is_none())
        };
        for name in [
            "opencode_start_task",
            "opencode_wait_for_task",
            "opencode_get_task_result",
        ] {
            assert!(
                loaded(name),
                "{name} is in the first request, not deferred: {:?}",
                first.tool_names()
            );
        }
        assert!(!loaded("opencode_start_server"), "deferred until searched");
        let found = results.remove(0);
        assert_eq!(found.name, "ToolSearch", "{results:#?}");
        for name in ["opencode_start_server", "opencode_list_agents"] {
            assert!(
                found.text.contains(&t(name)) || found.content.to_string().contains(&t(name)),
                "the search by hint found {name}: {}",
                found.content
            );
        }
    }
    let names: Vec<&str> = results.iter().map(|r| r.name.as_str()).collect();
    let expected: Vec<String> = [
        "opencode_start_server",
        "opencode_list_agents",
        "opencode_start_task",
        "opencode_start_task",
        "opencode_wait_for_task",
        "opencode_get_task_result",
        "opencode_get_task_result",
    ]
    .iter()
    .map(|n| t(n))
    .collect();
    assert_eq!(names, expected, "{results:#?}");
    // Claude Code hands its model the structuredContent, serialized, as the whole result (the
    // text content is dropped when structuredContent is present): so the JSON the gateway puts
    // there is exactly what a model reads.
    for r in &results {
        assert!(
            r.content.is_string(),
            "{} reached the model as {}",
            r.name,
            r.content
        );
    }
    let (ok, failed) = results.split_at(6);
    for r in ok {
        assert!(!r.is_error, "{} failed: {}", r.name, r.text);
    }
    let server = ok[0].json();
    assert!(server["server_id"].is_string(), "{server}");
    let opencode_pid = server["pid"]
        .as_u64()
        .unwrap_or_else(|| panic!("no pid in {server}")) as u32;
    let agents = ok[1].json();
    assert!(
        agents["agents"]
            .as_array()
            .is_some_and(|a| a.iter().any(|a| a["name"] == "build")),
        "{agents}"
    );
    let (first, second) = (ok[2].json(), ok[3].json());
    assert_ne!(first["task_id"], second["task_id"]);
    let waited = ok[4].json();
    assert_eq!(waited["done"], true, "{waited}");
    assert_eq!(waited["timed_out"], false, "{waited}");
    assert_eq!(
        waited["finished"],
        json!([first["task_id"], second["task_id"]]),
        "{waited}"
    );
    let result = ok[5].json();
    assert_eq!(result["status"], "completed", "{result}");
    assert_eq!(
        result["text"], "ECHO: first task from claude code [[delay:5000]]",
        "{result}"
    );
    // The error reaches the model as the gateway's JSON error text, flagged as an error.
    let error = &failed[0];
    assert!(error.is_error, "{error:?}");
    let body = error.json();
    assert_eq!(body["error"]["code"], "not_found", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("tsk_nope")),
        "{body}"
    );

    // Claude Code identified itself, sent a progress token with the wait, and took the progress
    // notifications (the tasks take 5 s, the interval is 200 ms) without complaint.
    // In either era (clientInfo at `initialize`, or in each request's `_meta`).
    let log = &run.gateway_log;
    assert!(
        log.contains(&format!(
            "the host is claude-code {version} (limits of `hosts.claude-code`)"
        )),
        "the gateway did not recognise claude-code {version}:\n{log}"
    );
    let progress = log.lines().filter(|l| l.contains("wait progress")).count();
    assert!(progress >= 2, "{progress} progress notifications:\n{log}");
    assert!(
        !log.contains("cannot send a progress notification"),
        "{log}"
    );
    let mcp_errors: Vec<&str> = run
        .debug_log
        .lines()
        .filter(|l| l.contains("[ERROR] MCP server"))
        .collect();
    assert!(
        mcp_errors.len() == 1 && mcp_errors[0].contains("tsk_nope"),
        "Claude Code logged MCP errors other than the scripted one: {mcp_errors:#?}"
    );
    // Nothing the host sent went unanswered (`subscriptions/listen` was, before 2.1.332 was
    // served), and the gateway had nothing to warn about.
    for needle in ["-32601", "Method not found", "method not found"] {
        assert!(
            !run.debug_log.contains(needle) && !log.contains(needle),
            "{needle} in the logs:\n{}\n--- gateway ---\n{log}",
            claude_code::tail(&run.debug_log, 6000)
        );
    }
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .collect();
    assert!(warnings.is_empty(), "the gateway warned: {warnings:#?}");

    // A clean exit: the gateway and its OpenCode ran during the session and are gone after it.
    assert!(
        run.seen_pids.contains(&opencode_pid),
        "OpenCode {opencode_pid} was never seen among {:?}",
        run.seen_pids
    );
    if let Err(left) = claude.wait_gateway_gone(Duration::from_secs(10)) {
        panic!(
            "left running after claude exited: {}",
            support::procs::describe(&left)
        );
    }
}

/// The `delegate_task` slash command as people type it. Claude Code gives each declared prompt
/// argument one word of the typed text (quotes are not honoured), so the prompt declares one
/// optional argument and sends the model to the whole request, which Claude Code passes along
/// with the rendered prompt.
#[test]
fn claude_code_slash_command_keeps_the_whole_request() {
    let fake_llm = FakeLlm::start();
    let env = OpenCodeEnv::new();
    let t = claude_code::tool;
    let api = FakeAnthropic::start(&t(""), vec![Step::text("Understood.")]);
    let claude = claude_code::ClaudeCode::new(&env, &fake_llm, &[]);
    let typed = "Rename foo to bar in src/lib.rs, mechanical, keep the public API";
    let run = claude.run(
        &api,
        &format!("/mcp__opencode__delegate_task {typed}"),
        Duration::from_secs(120),
    );
    run.dump_if_asked(&api);
    assert!(run.output.status.success(), "{}", run.describe());
    let main = api.main_requests();
    let first = main
        .first()
        .unwrap_or_else(|| panic!("no request reached the model: {}", run.describe()));
    let seen = serde_json::to_string(first.messages()).unwrap_or_default();
    assert!(
        seen.contains("Delegate work to OpenCode agents"),
        "the rendered prompt reaches the model: {seen}"
    );
    assert!(
        seen.contains("The work: Rename"),
        "the argument holds the first word: {seen}"
    );
    assert!(
        seen.contains(typed),
        "the whole typed request reaches the model: {seen}"
    );
    assert!(
        seen.contains("the user's whole request is the text that came with"),
        "the prompt says where the rest is: {seen}"
    );
}

/// Pages the large-answer runs allow for: each fake model's script has this many
/// read-the-next-page-or-stop steps.
const MAX_PAGES: usize = 12;
/// The fake model's last words in the large-answer runs, once no page is left.
const READ_ALL: &str = "Read the whole answer.";

/// A one-line prompt of exactly `chars` characters that JSON must escape in places (`"` and `\`)
/// and that holds non-ASCII (2-, 3- and 4-byte UTF-8, the last two UTF-16 units in JavaScript),
/// numbered so that a lost, doubled or reordered piece shows. The fake OpenCode model answers
/// `ECHO: <it>`.
fn big_prompt(chars: usize) -> String {
    let mut prompt = String::new();
    let mut count = 0;
    for k in 0.. {
        let unit = format!("part {k:05}: \"quoted\" back\\slash C:\\dir é ü 中文 😀 — ");
        for c in unit.chars() {
            if count == chars {
                // The fake trims the line it echoes: end on a character that stays.
                if prompt.ends_with(char::is_whitespace) {
                    prompt.pop();
                    prompt.push('.');
                }
                return prompt;
            }
            prompt.push(c);
            count += 1;
        }
    }
    unreachable!()
}

/// The next `get_task_result` arguments after what the model has seen (gateway tool name and
/// shown JSON, in call order): the `next_offset` of the last wait or page, or `None` when the
/// answer is complete.
fn next_page(shown: &[(String, Value)]) -> Option<Value> {
    let task_id = shown
        .iter()
        .find(|(name, _)| name == "opencode_start_task")
        .map(|(_, v)| v["task_id"].clone())?;
    let (name, last) = shown
        .iter()
        .rev()
        .find(|(name, _)| name == "opencode_wait_for_task" || name == "opencode_get_task_result")?;
    let next = if name == "opencode_wait_for_task" {
        &last["tasks"][0]["next_offset"]
    } else {
        &last["next_offset"]
    };
    next.as_u64()
        .map(|offset| json!({"task_id": task_id, "offset": offset}))
}

/// Checks the large-answer run's results as the model saw them (`shown`: tool name, shown
/// text, and that text parsed): start, wait, then pages; lean shapes; and the wait's piece plus
/// every page's piece joined is exactly `expected`. Returns a line per result with its size.
fn check_large_answer(shown: &[(String, String, Value)], expected: &str) -> Vec<String> {
    let names: Vec<&str> = shown.iter().map(|(n, _, _)| n.as_str()).collect();
    assert!(names.len() >= 4, "not paged at all: {names:?}");
    assert_eq!(
        names[..2],
        ["opencode_start_task", "opencode_wait_for_task"]
    );
    assert!(
        names[2..].iter().all(|n| *n == "opencode_get_task_result"),
        "{names:?}"
    );
    // Lean by default: no OpenCode ids, no token counts, anywhere in what the model read.
    fn keys(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    out.push(k.clone());
                    keys(v, out);
                }
            }
            Value::Array(a) => a.iter().for_each(|v| keys(v, out)),
            _ => {}
        }
    }
    for (name, _, v) in shown {
        let mut found = Vec::new();
        keys(v, &mut found);
        for key in ["session_id", "tokens"] {
            assert!(!found.contains(&key.to_owned()), "{name} shows {key}: {v}");
        }
    }
    let task_id = &shown[0].2["task_id"];
    assert!(task_id.is_string(), "{}", shown[0].1);
    let wait = &shown[1].2;
    assert_eq!(wait["done"], true, "{wait}");
    assert_eq!(wait["tasks"][0]["task_id"], *task_id, "{wait}");
    assert_eq!(wait["tasks"][0]["status"], "completed", "{wait}");
    let mut joined = wait["tasks"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no answer in the wait result: {wait}"))
        .to_owned();
    let mut sizes = vec![format!(
        "wait: {} bytes shown, {} UTF-16 units, {} answer chars",
        shown[1].1.len(),
        shown[1].1.encode_utf16().count(),
        joined.chars().count()
    )];
    let mut offset = wait["tasks"][0]["next_offset"].as_u64();
    for (k, (_, text, page)) in shown[2..].iter().enumerate() {
        assert_eq!(page["task_id"], *task_id, "{page}");
        assert_eq!(page["status"], "completed", "{page}");
        // Each page starts where the model was told the next one would.
        assert_eq!(
            Some(page["offset"].as_u64().unwrap_or_default()),
            offset,
            "page {k}: {page}"
        );
        let piece = page["text"].as_str().unwrap_or_default();
        assert!(!piece.is_empty(), "page {k} is empty: {page}");
        joined.push_str(piece);
        offset = page["next_offset"].as_u64();
        sizes.push(format!(
            "page {k}: {} bytes shown, {} UTF-16 units, {} answer chars",
            text.len(),
            text.encode_utf16().count(),
            piece.chars().count()
        ));
    }
    assert_eq!(offset, None, "the last page still points on");
    assert_eq!(
        joined.chars().count(),
        expected.chars().count(),
        "the pieces joined have the wrong length"
    );
    assert!(
        joined == expected,
        "the pieces joined differ from the answer"
    );
    sizes
}

/// Claude Code reads a 120,000-character answer (quotes, backslashes, non-ASCII) page by page:
/// the wait result and every page arrive inline and whole (none moved into a file, which Claude
/// Code does past 50,000 characters), and the pieces join to the exact answer.
#[test]
fn claude_code_reads_a_large_answer_whole_page_by_page() {
    claude_code_reads_a_large_answer(claude_code::CLAUDE_CODE);
}

/// The same in Claude Code of the 2026-07-28 era, which names itself only in each request's
/// `_meta`: recognised, it gets Claude Code's pages (about 45,000 characters), not the 20,000
/// of an unknown host.
#[test]
fn claude_code_2026_reads_a_large_answer_whole_page_by_page() {
    claude_code_reads_a_large_answer(&claude_code::current_release());
}

fn claude_code_reads_a_large_answer(version: &str) {
    let fake_llm = FakeLlm::start();
    let env = OpenCodeEnv::new();
    let t = claude_code::tool;
    let prompt = big_prompt(120_000 - "ECHO: ".len());
    let expected = format!("ECHO: {prompt}");
    let seen = move |results: &[ToolResult]| -> Vec<(String, Value)> {
        results
            .iter()
            .map(|r| (r.name.trim_start_matches(&t("")).to_owned(), r.json()))
            .collect()
    };
    let mut script = vec![
        Step::tool_json(
            t("opencode_start_task"),
            json!({"server_id": "default", "prompt": prompt}),
        ),
        Step::tool(t("opencode_wait_for_task"), |r| {
            json!({"task_ids": [id_from(r, "opencode_start_task", 0, "task_id")],
                   "timeout_ms": 60000})
        }),
    ];
    for _ in 0..MAX_PAGES {
        script.push(Step::tool_or_text(
            t("opencode_get_task_result"),
            move |r| next_page(&seen(r)),
            READ_ALL,
        ));
    }
    let api = FakeAnthropic::start(&t(""), script);
    let claude = claude_code::ClaudeCode::new(&env, &fake_llm, &[]).with_version(version);
    let run = claude.run(
        &api,
        "Delegate the work to OpenCode.",
        Duration::from_secs(240),
    );
    run.dump_if_asked(&api);
    let summary = run.summary(&api);
    assert_eq!(summary["result"], READ_ALL, "{summary}");

    let results = api.final_tool_results();
    let shown: Vec<(String, String, Value)> = results
        .iter()
        .map(|r| {
            assert!(!r.is_error, "{} failed: {}", r.name, r.text);
            // Inline: one string, not a pointer to a file with a preview.
            assert!(r.content.is_string(), "{} came as {}", r.name, r.content);
            assert!(
                !r.text.contains("<persisted-output>"),
                "{} was moved into a file: {}",
                r.name,
                claude_code::tail(&r.text, 3000)
            );
            let name = r.name.trim_start_matches(&t("")).to_owned();
            (name, r.text.clone(), r.json())
        })
        .collect();
    for line in check_large_answer(&shown, &expected) {
        eprintln!("claude code {version}: {line}");
    }
    // Pages as large as Claude Code takes inline: every result that carries a piece of the
    // answer, but the last, is at least 40,000 characters as the model reads it (this answer's
    // quotes and backslashes are escaped in that JSON, so its pieces of the answer are smaller).
    let pieces: Vec<usize> = shown
        .iter()
        .filter(|(name, _, _)| name != "opencode_start_task")
        .map(|(_, text, _)| text.chars().count())
        .collect();
    assert!(
        pieces.iter().rev().skip(1).all(|&n| n >= 40_000),
        "claude code {version} read the answer in results of {pieces:?} characters"
    );
    if let Err(left) = claude.wait_gateway_gone(Duration::from_secs(10)) {
        panic!(
            "left running after claude exited: {}",
            support::procs::describe(&left)
        );
    }
}

/// Codex reads a 30,000-character answer (quotes, backslashes, non-ASCII) page by page: the
/// wait result and every page reach its model whole (Codex keeps 12,000 bytes of a result for a
/// model it has no metadata for and drops the middle), and the pieces join to the exact answer.
#[test]
fn codex_reads_a_large_answer_whole_page_by_page() {
    use support::fake_responses::{FakeResponses, Step, ToolOutput};

    codex::codex_bin();
    let llm = FakeLlm::start();
    let env = OpenCodeEnv::new();
    let prompt = big_prompt(30_000 - "ECHO: ".len());
    let expected = format!("ECHO: {prompt}");
    let seen = move |outputs: &[ToolOutput]| -> Result<Vec<(String, Value)>, String> {
        outputs
            .iter()
            .map(|o| Ok((o.name.clone(), codex::shown_json(o)?)))
            .collect()
    };
    let mut script = vec![
        Step::Calls(vec![codex::tool(
            "opencode_start_task",
            json!({"server_id": "default", "prompt": prompt}),
        )]),
        Step::Calls(vec![codex::tool_with("opencode_wait_for_task", move |o| {
            let task_id = seen(o)?
                .first()
                .map(|(_, v)| v["task_id"].clone())
                .ok_or("no start_task output yet")?;
            Ok(json!({"task_ids": [task_id], "timeout_ms": 60000}))
        })]),
    ];
    for _ in 0..MAX_PAGES {
        script.push(Step::CallOrText {
            namespace: Some(codex::NAMESPACE.into()),
            name: "opencode_get_task_result".into(),
            arguments: Box::new(move |o| Ok(next_page(&seen(o)?))),
            otherwise: READ_ALL.into(),
        });
    }
    let fake = FakeResponses::start(script);
    let home = codex::CodexHome::new(
        &fake,
        &codex::gateway_env(&env, &llm.url()),
        codex::ServerOptions {
            approval_mode: Some("approve"),
            ..Default::default()
        },
    );
    let run = codex::exec(
        &home,
        &env.work_dir(),
        "Delegate the work to OpenCode.",
        Duration::from_secs(120),
    );
    let shown: Vec<(String, String, Value)> = fake
        .tool_outputs()
        .iter()
        .map(|o| {
            let raw = o.text();
            assert!(
                raw.starts_with("Wall time: "),
                "{} not shown as Codex shows a result: {}",
                o.name,
                claude_code::tail(&raw, 2000)
            );
            // Codex marks a cut result with `…<n> tokens truncated…` where the middle was.
            assert!(
                !raw.contains("tokens truncated"),
                "Codex cut the {} result: {raw}",
                o.name
            );
            let json = codex::shown_json(o).unwrap_or_else(|e| panic!("{e}"));
            (o.name.clone(), raw, json)
        })
        .collect();
    // The run's own account after what the model saw: a cut result fails above, as such, rather
    // than here as the script error it causes.
    run.assert_scripted(&fake, &run.describe());
    assert!(
        run.events
            .iter()
            .any(|e| e["item"]["type"] == "agent_message" && e["item"]["text"] == READ_ALL),
        "{}",
        run.describe()
    );

    for line in check_large_answer(&shown, &expected) {
        eprintln!("codex {line}");
    }
    if let Err(left) = codex::wait_none_left(&env, Duration::from_secs(15)) {
        panic!(
            "left behind after codex exited: {}",
            support::procs::describe(&left)
        );
    }
}

/// How many tools the built-in configuration enables.
fn default_tool_count() -> usize {
    let dir = tempfile::tempdir().expect("tempdir");
    let sources = opencode_mcp::config::Sources {
        explicit: None,
        cwd: dir.path().to_path_buf(),
        user_dir: None,
        frozen_repository: None,
    };
    let config =
        opencode_mcp::config::load_with_env(&sources, Vec::new()).expect("the built-in config");
    config.enabled_tools().count()
}

/// Interactive Claude Code of the 2026-07-28 era runs a delegated task as a native MCP task:
/// the model makes one call, `opencode_start_task`; Claude Code backgrounds it, polls
/// `tasks/get`, and hands the answer to the model as a task notification, a new turn. Then the
/// model stops a second, long task with TaskStop, which reaches OpenCode as a cancel (its model
/// stream is cut off).
#[test]
fn claude_code_2026_runs_a_delegated_task_in_the_background() {
    let version = claude_code::current_release();
    let fake_llm = FakeLlm::start();
    let env = OpenCodeEnv::new();
    let t = claude_code::tool;
    let quick = "background work [[delay:3000]]";
    let long = "long work [[slow:120000]]";
    let received = fake_llm.received();
    let script = vec![
        Step::tool_json(
            t("opencode_start_task"),
            json!({"server_id": "default", "prompt": quick}),
        ),
        Step::text("Started it."),
        // The task notification's turn.
        Step::text("Read the answer."),
        // The user's second message.
        Step::tool_json(
            t("opencode_start_task"),
            json!({"server_id": "default", "prompt": long}),
        ),
        // The model stops the task once it is working: OpenCode has sent its model request.
        // (Stopped sooner, within milliseconds of its start as the script would otherwise do on
        // a loaded machine, OpenCode ends the turn before it asks its model anything, and there
        // is no model stream whose end shows the cancel.)
        Step::tool("TaskStop", move |r| {
            // Bounded; a request that never comes is reported after the stop, with the screen.
            received.wait_blocking(Duration::from_secs(60), |q| {
                !q.is_title_request() && q.last_user_text.contains("long work")
            });
            let started = r.last().map(|r| r.text.clone()).unwrap_or_default();
            json!({"task_id": claude_code::background_id(&started)})
        }),
        Step::text("Stopped it."),
        Step::text("Noted."),
    ];
    let api = FakeAnthropic::start(&t(""), script);
    let claude = claude_code::ClaudeCode::new(&env, &fake_llm, &[("OPENCODE_MCP_LOG", "debug")])
        .with_version(&version);
    let session = claude.interactive(&api);
    let describe = || {
        format!(
            "screen:\n{}\n--- requests ---\n{}\n--- gateway ---\n{}",
            session.tmux.pane(),
            api.requests()
                .iter()
                .map(|r| r.summary())
                .collect::<Vec<_>>()
                .join("\n"),
            claude_code::tail(&session.gateway_log(), 4000)
        )
    };
    // The first prompt goes in once the gateway's tools are listed (they are then offered).
    session
        .wait_until_tools_listed(Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e}"));
    session.say("Delegate the background work to OpenCode.");
    let read = session.tmux.wait_for(Duration::from_secs(120), |pane| {
        pane.contains("Read the answer.")
    });
    assert!(read.is_ok(), "no turn for the notification\n{}", describe());

    let main = api.main_requests();
    let last = main.last().expect("requests reached the model");
    let results = last.tool_results();
    assert_eq!(results.len(), 1, "one call: {results:#?}");
    assert_eq!(results[0].name, t("opencode_start_task"));
    // With the host's defaults (tool search on), the delegation needed no search: the start
    // tool was in the first request, not deferred.
    let first_tools = main[0].body["tools"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        first_tools
            .iter()
            .any(|tool| tool["name"] == t("opencode_start_task")
                && tool.get("defer_loading").is_none()),
        "{:?}",
        main[0].tool_names()
    );
    assert!(
        main.iter()
            .all(|r| r.tool_results().iter().all(|x| x.name != "ToolSearch")),
        "no tool-search call"
    );
    assert!(
        results[0].text.contains("started server-side task tsk_")
            && results[0].text.contains("background"),
        "the call was backgrounded as an MCP task: {}",
        results[0].text
    );
    let notification = task_notification(&api)
        .unwrap_or_else(|| panic!("no task notification reached the model\n{}", describe()));
    assert!(
        notification.contains("<status>completed</status>"),
        "{notification}"
    );
    assert!(
        notification.contains(&echo_reply(quick)),
        "the answer is in the notification: {notification}"
    );

    // TaskStop: Claude Code sends tasks/cancel, the gateway aborts the OpenCode turn.
    let before = fake_llm.requests().len();
    session.say("Start the long work, then stop it.");
    let stopped = session.tmux.wait_for(Duration::from_secs(120), |pane| {
        pane.contains("Stopped it.")
    });
    assert!(stopped.is_ok(), "TaskStop did not complete\n{}", describe());
    let long_request = wait_until(Duration::from_secs(30), || {
        fake_llm
            .requests()
            .into_iter()
            .skip(before)
            .find(|r| r.last_user_text.contains("long work"))
    })
    .unwrap_or_else(|| panic!("the long task never reached the model\n{}", describe()));
    let end = wait_until(Duration::from_secs(30), || {
        fake_llm
            .stream_ends()
            .into_iter()
            .find(|e| e.request == long_request.index)
    })
    .unwrap_or_else(|| panic!("the long task's stream never ended\n{}", describe()));
    assert!(
        end.client_closed,
        "OpenCode hung up the model's stream: the task was cancelled"
    );
    let log = session.gateway_log();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .collect();
    assert!(warnings.is_empty(), "the gateway warned: {warnings:#?}");
    let debug = session.debug_log();
    assert!(
        !debug.contains("-32601") && !debug.contains("Method not found"),
        "{}",
        claude_code::tail(&debug, 6000)
    );
}

/// The first `<task-notification>` in the conversation Claude Code last sent its (fake) model:
/// the turn in which it handed over a background task's result.
fn task_notification(api: &FakeAnthropic) -> Option<String> {
    let last = api.main_requests().into_iter().last()?;
    let conversation = serde_json::to_string(last.messages()).ok()?;
    conversation
        .split("<task-notification>")
        .nth(1)
        .map(str::to_string)
}

/// Polls `found` (bounded) until it returns something.
fn wait_until<T>(within: Duration, found: impl Fn() -> Option<T>) -> Option<T> {
    let start = std::time::Instant::now();
    loop {
        if let Some(value) = found() {
            return Some(value);
        }
        if start.elapsed() > within {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A permission ask of a backgrounded task is a dialog in interactive Claude Code (the task's
/// `input_required` form): the user's answer goes back with `tasks/update`, reaches OpenCode,
/// and the task goes on to its answer.
#[test]
fn claude_code_2026_asks_its_user_for_a_tasks_permission() {
    let version = claude_code::current_release();
    let fake_llm = FakeLlm::start();
    let env = OpenCodeEnv::new().with_config(json!({ "permission": "ask" }));
    let t = claude_code::tool;
    let prompt = "needs a shell [[bash:echo permitted-$((6*7))]]";
    let script = vec![
        Step::tool_json(
            t("opencode_start_task"),
            json!({"server_id": "default", "prompt": prompt}),
        ),
        Step::text("Started it."),
        Step::text("Read the answer."),
    ];
    let api = FakeAnthropic::start(&t(""), script);
    let claude = claude_code::ClaudeCode::new(
        &env,
        &fake_llm,
        &[
            ("OPENCODE_MCP_LOG", "debug"),
            ("OPENCODE_MCP_OPENCODE__PERMISSION", "ask"),
        ],
    )
    .with_version(&version);
    let session = claude.interactive(&api);
    session
        .wait_until_tools_listed(Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e}"));
    session.say("Delegate the shell work to OpenCode.");
    let describe = || {
        format!(
            "screen:\n{}\n--- gateway ---\n{}",
            session.tmux.pane(),
            claude_code::tail(&session.gateway_log(), 4000)
        )
    };
    let dialog = session
        .tmux
        .wait_for(Duration::from_secs(120), |pane| {
            pane.contains("asks permission to run")
        })
        .unwrap_or_else(|_| panic!("no permission dialog\n{}", describe()));
    assert!(
        dialog.contains("bash echo permitted-$((6*7))"),
        "the dialog says what is asked for: {dialog}"
    );
    // Open the choice, pick the first (allow once), then Accept.
    session.tmux.press("Right");
    let choices = session.tmux.wait_for(Duration::from_secs(10), |pane| {
        pane.contains("Allow once") && pane.contains("Reject")
    });
    assert!(choices.is_ok(), "no choices\n{}", describe());
    session.tmux.press("Enter");
    let chosen = session.tmux.wait_for(Duration::from_secs(10), |pane| {
        pane.contains("Allow this?: Allow once") && pane.contains("❯ Accept")
    });
    assert!(chosen.is_ok(), "not chosen\n{}", describe());
    // The form takes a key only once it has settled after the choice; a press it dropped
    // leaves it on screen, so press again (bounded) until it is gone.
    let mut answered = false;
    for _ in 0..5 {
        session.tmux.press("Enter");
        if session
            .tmux
            .wait_for(Duration::from_secs(3), |pane| {
                !pane.contains("requests your input")
            })
            .is_ok()
        {
            answered = true;
            break;
        }
    }
    assert!(answered, "the form was not accepted\n{}", describe());
    let read = session.tmux.wait_for(Duration::from_secs(120), |pane| {
        pane.contains("Read the answer.")
    });
    assert!(read.is_ok(), "no turn for the notification\n{}", describe());
    let notification =
        task_notification(&api).unwrap_or_else(|| panic!("no task notification\n{}", describe()));
    assert!(
        notification.contains("<status>completed</status>")
            && notification.contains(&echo_reply(prompt)),
        "{notification}"
    );
    // The allowed command ran: its output reached OpenCode's model.
    let ran = fake_llm
        .requests()
        .iter()
        .any(|r| r.body.to_string().contains("permitted-42"));
    assert!(ran, "the allowed command's output never reached the model");
}

/// **The Quick start's setup line, as a user types it**: `claude mcp add opencode -- <gateway>`
/// in a fresh home registers the gateway, and `claude mcp list`, which starts it and speaks MCP
/// to it, reports it connected. (The Quick start's line runs the gateway through `npx`; the
/// npm package's own test drives that launcher.)
#[test]
fn claude_mcp_add_registers_the_gateway() {
    let bin = claude_code::claude_bin(&claude_code::current_release());
    let home = tempfile::tempdir().expect("a home");
    let config_dir = home.path().join(".claude");
    std::fs::create_dir_all(&config_dir).expect("CLAUDE_CONFIG_DIR");
    let run = |args: &[&str]| {
        let mut cmd = Command::new(&bin);
        cmd.env_clear();
        if let Some(path) = std::env::var_os("PATH") {
            cmd.env("PATH", path);
        }
        cmd.env("HOME", home.path())
            .env("CLAUDE_CONFIG_DIR", &config_dir)
            .env("TMPDIR", home.path())
            .env("DISABLE_AUTOUPDATER", "1")
            .env("DISABLE_TELEMETRY", "1")
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .env("CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL", "1")
            // Nothing leaves the machine: anything that tries meets a closed port.
            .env("HTTPS_PROXY", "http://127.0.0.1:9")
            .env("HTTP_PROXY", "http://127.0.0.1:9")
            .env("NO_PROXY", "127.0.0.1,localhost")
            .args(args)
            .current_dir(home.path())
            .stdin(Stdio::null());
        let out = cmd.output().expect("run claude");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    let (added, said) = run(&[
        "mcp",
        "add",
        "opencode",
        "--",
        env!("CARGO_BIN_EXE_opencode-mcp"),
    ]);
    assert!(added, "claude mcp add: {said}");
    let (listed, said) = run(&["mcp", "list"]);
    assert!(listed, "claude mcp list: {said}");
    let line = said
        .lines()
        .find(|l| l.starts_with("opencode"))
        .unwrap_or_else(|| panic!("no opencode server listed: {said}"));
    assert!(line.contains("Connected"), "{line}");
}

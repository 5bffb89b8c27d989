//! The MCP surface as a host sees it: the built binary, spawned over stdio in a temp directory
//! with a clean environment, driven by rmcp's client (and once by hand, to check the wire).
//!
//! - snapshots of `initialize`, `tools/list`, `prompts/list` and a rendered `delegate_task`;
//! - a repo-level `delegation.yaml` changes exactly what it says, compared against the default
//!   run with the same edits applied programmatically;
//! - the rename recipe of docs/configuration.md (a new entry with the same action, the old one disabled) renames
//!   the tool in every text that names it through `{{tool:<action>}}`;
//! - every stdout line is JSON-RPC 2.0, and the process exits 0 when stdin closes;
//! - argument validation over the wire: each bad call is an `isError` result with code
//!   `invalid_argument` and a message naming the argument.
//!
//! No OpenCode is started here: every call either fails validation before reaching the task
//! service or names an id the gateway does not know.

mod support;

use std::collections::BTreeSet;
use std::process::Stdio;

use opencode_mcp::config::{self, Config, Sources};
use serde_json::{json, Value};
use support::mcp::{BoxError, McpClient, Sandbox, TIMEOUT};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

const TASK_STATUS: &str = "opencode_get_task_status";
const TASK_RESULT: &str = "opencode_get_task_result";
const START_TASK: &str = "opencode_start_task";
const CONTINUE_TASK: &str = "opencode_continue_task";
const WAIT: &str = "opencode_wait_for_task";
const START_SERVER: &str = "opencode_start_server";
const STOP_SERVER: &str = "opencode_stop_server";

/// The built-in configuration, as the library loads it with no files and no env.
fn default_config() -> Result<Config, BoxError> {
    let sandbox = Sandbox::new()?;
    let sources = Sources {
        explicit: None,
        cwd: sandbox.cwd(),
        user_dir: None,
        frozen_repository: None,
    };
    Ok(config::load_with_env(&sources, Vec::new())?)
}

/// Everything a host learns from one session: initialize, tools, prompts, a rendered prompt.
struct Surface {
    initialize: Value,
    tools: Value,
    prompts: Value,
    delegate_task: Value,
}

fn prompt_args() -> Value {
    json!({
        "task": "Rename `Foo` to `Bar` across src/; mechanical. Keep the public API; run cargo test.",
    })
}

async fn surface(client: &McpClient) -> Result<Surface, BoxError> {
    let mut initialize = serde_json::to_value(client.server_info())?;
    // The version changes with every release; the snapshot should not.
    if let Some(v) = initialize.pointer_mut("/serverInfo/version") {
        assert_eq!(v, env!("CARGO_PKG_VERSION"));
        *v = json!("[version]");
    }
    Ok(Surface {
        initialize,
        tools: serde_json::to_value(client.list_tools().await?)?,
        prompts: serde_json::to_value(client.list_prompts().await?)?,
        delegate_task: serde_json::to_value(
            client.get_prompt("delegate_task", prompt_args()).await?,
        )?,
    })
}

async fn default_surface() -> Result<Surface, BoxError> {
    let sandbox = Sandbox::new()?;
    let client = sandbox.launch().connect().await?;
    let s = surface(&client).await?;
    client.close().await?;
    Ok(s)
}

#[tokio::test]
async fn snapshots_of_the_default_surface() -> Result<(), BoxError> {
    let s = default_surface().await?;
    insta::assert_json_snapshot!("initialize", s.initialize);
    insta::assert_json_snapshot!("tools_list", s.tools);
    insta::assert_json_snapshot!("prompts_list", s.prompts);
    insta::assert_json_snapshot!("prompts_get_delegate_task", s.delegate_task);

    // What the snapshots must show whatever the wording of the default file.
    let names: Vec<&str> = s
        .tools
        .as_array()
        .map(|t| t.iter().filter_map(|t| t["name"].as_str()).collect())
        .unwrap_or_default();
    let mut sorted = names.clone();
    sorted.sort_unstable();
    assert_eq!(names, sorted, "tools/list is sorted by name");
    assert_eq!(
        names.len(),
        opencode_mcp::config::Action::ALL.len(),
        "{names:?}"
    );
    for tool in s.tools.as_array().into_iter().flatten() {
        assert_eq!(tool["inputSchema"]["type"], "object", "{}", tool["name"]);
        assert_eq!(tool["outputSchema"]["type"], "object", "{}", tool["name"]);
        assert!(tool["annotations"].is_object(), "{}", tool["name"]);
        assert!(!tool.to_string().contains("$ref"), "{}", tool["name"]);
    }
    assert_eq!(s.initialize["serverInfo"]["name"], "opencode-mcp");
    let text = s.delegate_task["messages"][0]["content"]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(text.contains("Rename `Foo` to `Bar` across src/"), "{text}");
    assert!(!text.contains("{{"), "every placeholder is filled: {text}");
    Ok(())
}

/// A preset tool from a repository file: its input schema is built from its declared arguments
/// plus the action's own that it does not fix (pinned), and it keeps its action's output schema
/// and annotations.
#[tokio::test]
async fn snapshot_of_a_preset_tool() -> Result<(), BoxError> {
    let sandbox = Sandbox::new()?;
    // The issue's own example.
    sandbox.write_repo_config(include_str!("fixtures/presets/write_tests.yaml"))?;
    let client = sandbox.launch().connect().await?;
    let s = surface(&client).await?;
    client.close().await?;
    let tools = s.tools.as_array().cloned().unwrap_or_default();
    let preset = tools.iter().find(|t| t["name"] == "write_tests");
    let start = tools.iter().find(|t| t["name"] == START_TASK);
    let (Some(preset), Some(start)) = (preset, start) else {
        return Err(format!("write_tests and {START_TASK} are listed: {}", s.tools).into());
    };
    assert_eq!(preset["outputSchema"], start["outputSchema"]);
    assert_eq!(preset["annotations"], start["annotations"]);
    let mut shown = preset.clone();
    if let Some(obj) = shown.as_object_mut() {
        obj.remove("outputSchema");
    }
    insta::assert_json_snapshot!("preset_write_tests", shown);
    Ok(())
}

/// The rename recipe from docs/configuration.md, for two tools: `delegate_start` replaces
/// `opencode_start_task` (named by the instructions and the `delegate_task` prompt) and
/// `delegate_result` replaces `opencode_get_task_result` (named by those and by the wait tool's
/// description, which does not name the start tool). Every text the host reads follows, and is
/// otherwise the default text byte for byte.
#[tokio::test]
async fn the_rename_recipe_renames_the_tool_everywhere() -> Result<(), BoxError> {
    let default = default_surface().await?;
    let sandbox = Sandbox::new()?;
    sandbox.write_repo_config(
        r#"
tools:
  delegate_start:
    action: start_task
    description: Start a delegated task; then call {{tool:wait_for_task}}.
  opencode_start_task:
    enabled: false
  delegate_result:
    action: get_task_result
    description: Read a task's outcome.
  opencode_get_task_result:
    enabled: false
"#,
    )?;
    let client = sandbox.launch().connect().await?;
    let renamed = surface(&client).await?;
    client.close().await?;

    let rename = |text: &str| {
        text.replace(START_TASK, "delegate_start")
            .replace(TASK_RESULT, "delegate_result")
    };
    let text_at = |v: &Value, pointer: &str| {
        v.pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };

    let instructions = text_at(&renamed.initialize, "/instructions");
    let before = text_at(&default.initialize, "/instructions");
    assert!(
        before.contains(START_TASK) && before.contains(TASK_RESULT),
        "{before}"
    );
    assert_eq!(instructions, rename(&before));

    let prompt = text_at(&renamed.delegate_task, "/messages/0/content/text");
    let before = text_at(&default.delegate_task, "/messages/0/content/text");
    assert!(
        before.contains(START_TASK) && before.contains(TASK_RESULT),
        "{before}"
    );
    assert_eq!(prompt, rename(&before));
    assert!(prompt.contains("delegate_start"), "{prompt}");

    let description = |surface: &Surface, name: &str| {
        surface
            .tools
            .as_array()
            .into_iter()
            .flatten()
            .find(|t| t["name"] == name)
            .map(|t| text_at(t, "/description"))
    };
    let wait = description(&renamed, WAIT).unwrap_or_default();
    let before = description(&default, WAIT).unwrap_or_default();
    assert!(before.contains(TASK_RESULT), "{before}");
    assert_eq!(wait, rename(&before));
    assert!(wait.contains("delegate_result"), "{wait}");
    // The repository's own text is rendered too.
    assert_eq!(
        description(&renamed, "delegate_start").as_deref(),
        Some("Start a delegated task; then call opencode_wait_for_task.")
    );
    assert_eq!(description(&renamed, START_TASK), None, "disabled");

    let everything = serde_json::to_string(&(&renamed.initialize, &renamed.tools))?
        + &serde_json::to_string(&(&renamed.prompts, &renamed.delegate_task))?;
    for old in [START_TASK, TASK_RESULT] {
        assert!(!everything.contains(old), "`{old}` is still named");
    }
    Ok(())
}

#[tokio::test]
async fn a_repo_config_changes_exactly_what_it_says() -> Result<(), BoxError> {
    let defaults = default_config()?;
    let new_description = "Repo-specific: report one task's status at once.";
    let new_tier = json!({
        "name": "review",
        "handles": "security reviews of finished work",
        "models": ["acme/reviewer-1", "acme/reviewer-2"],
    });
    // `tiers` is a list: a layer that sets it replaces it whole, so keep the default tiers.
    let mut tiers = serde_json::to_value(&defaults.tiers)?;
    if let Some(list) = tiers.as_array_mut() {
        list.push(new_tier.clone());
    }
    let repo = json!({
        "tools": {
            TASK_STATUS: { "description": new_description },
            // A tool no text names: disabling one that a `{{tool:...}}` names is refused at load
            // (see `the_rename_recipe_renames_the_tool_everywhere`).
            STOP_SERVER: { "enabled": false },
        },
        "tiers": tiers,
    });

    let default = default_surface().await?;
    let sandbox = Sandbox::new()?;
    sandbox.write_repo_config(&yaml_serde::to_string(&repo)?)?;
    let client = sandbox.launch().connect().await?;
    let tuned = surface(&client).await?;

    // tools/list: the default with the three edits applied.
    let mut expected_tools = default.tools.clone();
    if let Some(tools) = expected_tools.as_array_mut() {
        tools.retain(|t| t["name"] != STOP_SERVER);
        for tool in tools.iter_mut() {
            if tool["name"] == TASK_STATUS {
                tool["description"] = json!(new_description);
            }
            // The tier arguments list the configured tiers.
            let tiers = match tool["name"].as_str() {
                Some(START_TASK) => "/inputSchema/properties/tier/enum",
                Some("opencode_fan_out") => "/inputSchema/properties/tiers/items/enum",
                _ => continue,
            };
            if let Some(names) = tool.pointer_mut(tiers).and_then(Value::as_array_mut) {
                names.push(new_tier["name"].clone());
            }
        }
    }
    assert_eq!(tuned.tools, expected_tools);

    // The rendered prompt: one more tier line, after the last default tier.
    let line =
        "- review: security reviews of finished work (models: acme/reviewer-1, acme/reviewer-2)";
    let last = defaults
        .tiers
        .last()
        .map(|t| t.name.clone())
        .unwrap_or_default();
    let mut expected_prompt = default.delegate_task.clone();
    if let Some(Value::String(text)) = expected_prompt.pointer_mut("/messages/0/content/text") {
        let lines: Vec<String> = text
            .lines()
            .flat_map(|l| {
                let mut out = vec![l.to_string()];
                if l.trim_start().starts_with(&format!("- {last}: ")) {
                    out.push(format!("{}{line}", &l[..l.len() - l.trim_start().len()]));
                }
                out
            })
            .collect();
        *text = lines.join("\n");
    }
    assert_ne!(
        expected_prompt, default.delegate_task,
        "the edit found the tier list"
    );
    assert_eq!(tuned.delegate_task, expected_prompt);

    // Nothing else moved.
    assert_eq!(tuned.initialize, default.initialize);
    assert_eq!(tuned.prompts, default.prompts);

    // The disabled tool cannot be called: a JSON-RPC invalid_params error naming it.
    match client
        .call(STOP_SERVER, json!({"server_id": "srv_x"}))
        .await
    {
        Err(rmcp::ServiceError::McpError(e)) => {
            assert_eq!(e.code, rmcp::model::ErrorCode::INVALID_PARAMS);
            assert!(e.message.contains(STOP_SERVER), "{}", e.message);
        }
        other => panic!("calling a disabled tool: {other:?}"),
    }
    client.close().await?;
    Ok(())
}

#[tokio::test]
async fn stdout_is_only_json_rpc_and_the_process_exits_when_stdin_closes() -> Result<(), BoxError> {
    let sandbox = Sandbox::new()?;
    let requests = [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw-test", "version": "0"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
        json!({"jsonrpc": "2.0", "id": 3, "method": "prompts/list"}),
        json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
            "params": {"name": "no_such_tool", "arguments": {}}}),
        json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
            "params": {"name": START_TASK, "arguments": {"server_id": 7, "prompt": ""}}}),
        json!({"jsonrpc": "2.0", "id": 6, "method": "tools/call",
            "params": {"name": TASK_STATUS, "arguments": {"task_id": "tsk_unknown"}}}),
        json!({"jsonrpc": "2.0", "id": 7, "method": "prompts/get",
            "params": {"name": "delegate_task", "arguments": {"colour": "x"}}}),
    ];
    let (status, output, stderr_text) = raw_session(sandbox.launch(), &requests).await?;
    assert_eq!(
        status.code(),
        Some(0),
        "exit status; stderr:\n{stderr_text}"
    );

    let mut answered = BTreeSet::new();
    for line in output.lines() {
        if let Err(why) = support::mcp::check_jsonrpc(line) {
            panic!("stdout line is not JSON-RPC ({why}): {line}");
        }
        let msg: Value = serde_json::from_str(line)?;
        if let Some(id) = msg.get("id").and_then(Value::as_i64) {
            assert!(answered.insert(id), "id {id} answered twice");
        }
    }
    assert_eq!(
        answered,
        (1..=7).collect(),
        "stdout:\n{output}\nstderr:\n{stderr_text}"
    );

    let by_id = |id: i64| {
        output
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|m| m["id"] == id)
            .unwrap_or_default()
    };
    assert_eq!(by_id(4)["error"]["code"], -32602, "unknown tool");
    assert!(by_id(4)["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("no_such_tool")));
    // An error result is JSON text only: no structuredContent for a client to validate against
    // the success-shaped outputSchema.
    let error_body = |id: i64| -> Value {
        let result = &by_id(id)["result"];
        assert!(result.get("structuredContent").is_none(), "{result}");
        result["content"][0]["text"]
            .as_str()
            .and_then(|t| serde_json::from_str(t).ok())
            .unwrap_or_default()
    };
    assert_eq!(by_id(5)["result"]["isError"], true);
    assert_eq!(error_body(5)["error"]["code"], "invalid_argument");
    assert_eq!(by_id(6)["result"]["isError"], true);
    assert_eq!(error_body(6)["error"]["code"], "not_found");
    assert_eq!(
        by_id(7)["error"]["code"],
        -32602,
        "undeclared prompt argument"
    );
    Ok(())
}

/// Asserts an `isError` result with code `invalid_argument` whose message contains every `names`.
async fn assert_invalid(
    client: &McpClient,
    tool: &str,
    args: Value,
    names: &[&str],
) -> Result<String, BoxError> {
    let reply = client.call(tool, args.clone()).await?;
    assert!(
        reply.is_error,
        "{tool} {args}: expected an error, got {}",
        reply.text
    );
    assert_eq!(
        reply.error_code(),
        Some("invalid_argument"),
        "{tool} {args}: {}",
        reply.text
    );
    let message = reply.error_message().unwrap_or_default().to_string();
    for name in names {
        assert!(
            message.contains(name),
            "{tool} {args}: `{message}` should name {name}"
        );
    }
    // The text block mirrors the structured content for hosts that ignore the latter.
    assert_eq!(
        serde_json::from_str::<Value>(&reply.text)?,
        reply.structured
    );
    Ok(message)
}

#[tokio::test]
async fn arguments_are_validated_before_anything_runs() -> Result<(), BoxError> {
    let defaults = default_config()?;
    let wait_max_ms = u64::try_from(defaults.timeouts.wait_max.get().as_millis())?;
    let sandbox = Sandbox::new()?;
    let client = sandbox.launch().connect().await?;
    let start = |extra: Value| {
        let mut args = json!({"server_id": "srv_x", "prompt": "Add a unit test for parse()."});
        if let (Some(a), Value::Object(e)) = (args.as_object_mut(), extra) {
            a.extend(e);
        }
        args
    };

    // Empty (blank) prompt.
    assert_invalid(
        &client,
        START_TASK,
        start(json!({"prompt": "  \n"})),
        &["`prompt`"],
    )
    .await?;
    assert_invalid(
        &client,
        CONTINUE_TASK,
        json!({"task_id": "tsk_x", "prompt": ""}),
        &["`prompt`"],
    )
    .await?;
    // Unknown field.
    assert_invalid(
        &client,
        TASK_STATUS,
        json!({"task_id": "tsk_x", "colour": 1}),
        &["`colour`"],
    )
    .await?;
    // Wrong type.
    assert_invalid(
        &client,
        TASK_RESULT,
        json!({"task_id": "tsk_x", "offset": "ten"}),
        &["`offset`"],
    )
    .await?;
    assert_invalid(&client, WAIT, json!({"task_ids": "tsk_x"}), &["`task_ids`"]).await?;
    // Missing required field.
    assert_invalid(
        &client,
        START_TASK,
        json!({"server_id": "srv_x"}),
        &["`prompt`"],
    )
    .await?;
    // timeout_ms over the maximum, and negative.
    let over = json!({"task_ids": ["tsk_x"], "timeout_ms": wait_max_ms + 1});
    assert_invalid(
        &client,
        WAIT,
        over,
        &["`timeout_ms`", &wait_max_ms.to_string()],
    )
    .await?;
    assert_invalid(
        &client,
        WAIT,
        json!({"task_ids": ["tsk_x"], "timeout_ms": -5}),
        &["`timeout_ms`"],
    )
    .await?;
    // Empty and oversized task_ids.
    assert_invalid(&client, WAIT, json!({"task_ids": []}), &["`task_ids`"]).await?;
    let many: Vec<String> = (0..=defaults.limits.max_wait_ids)
        .map(|i| format!("tsk_{i}"))
        .collect();
    assert_invalid(
        &client,
        WAIT,
        json!({"task_ids": many}),
        &["`task_ids`", "max_wait_ids"],
    )
    .await?;
    assert_invalid(
        &client,
        WAIT,
        json!({"task_ids": ["tsk_x", " "]}),
        &["`task_ids[1]`"],
    )
    .await?;
    // Bad mode.
    assert_invalid(
        &client,
        WAIT,
        json!({"task_ids": ["tsk_x"], "mode": "some"}),
        &["`mode`"],
    )
    .await?;
    // model and tier together, a malformed model, an unknown tier, a relative directory.
    assert_invalid(
        &client,
        START_TASK,
        start(json!({"model": "a/b", "tier": "fast"})),
        &["`model`", "`tier`"],
    )
    .await?;
    assert_invalid(
        &client,
        START_TASK,
        start(json!({"model": "gpt"})),
        &["`model`"],
    )
    .await?;
    let tiers: Vec<&str> = defaults.tiers.iter().map(|t| t.name.as_str()).collect();
    let mut names = vec!["`tier`"];
    names.extend(&tiers);
    assert_invalid(&client, START_TASK, start(json!({"tier": "huge"})), &names).await?;
    assert_invalid(
        &client,
        START_TASK,
        start(json!({"directory": "rel/dir"})),
        &["`directory`"],
    )
    .await?;
    assert_invalid(
        &client,
        START_SERVER,
        json!({"directory": "rel/dir"}),
        &["`directory`"],
    )
    .await?;
    assert_invalid(&client, START_SERVER, json!({"port": 70000}), &["`port`"]).await?;
    // A prompt over limits.max_prompt_bytes.
    let big = "x".repeat(defaults.limits.max_prompt_bytes as usize + 1);
    assert_invalid(
        &client,
        START_TASK,
        start(json!({"prompt": big})),
        &["`prompt`", "max_prompt_bytes"],
    )
    .await?;

    // Past validation: ids the gateway does not know.
    for (tool, args) in [
        (TASK_STATUS, json!({"task_id": "tsk_unknown"})),
        (TASK_RESULT, json!({"task_id": "tsk_unknown"})),
        (WAIT, json!({"task_ids": ["tsk_unknown"], "timeout_ms": 0})),
        (START_TASK, start(json!({}))),
    ] {
        let reply = client.call(tool, args).await?;
        assert!(reply.is_error, "{tool}: {}", reply.text);
        assert_eq!(
            reply.error_code(),
            Some("not_found"),
            "{tool}: {}",
            reply.text
        );
    }
    client.close().await?;
    Ok(())
}

#[tokio::test]
async fn sigterm_ends_the_session_cleanly() -> Result<(), BoxError> {
    let sandbox = Sandbox::new()?;
    let mut child = sandbox
        .launch()
        .command()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut stdin = child.stdin.take().ok_or("no stdin")?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw-test", "version": "0"}}});
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let answer = tokio::time::timeout(TIMEOUT, async {
        stdin
            .write_all(format!("{initialize}\n").as_bytes())
            .await?;
        stdin.flush().await?;
        lines.next_line().await
    })
    .await??
    .ok_or("no answer to initialize")?;
    assert!(answer.contains("\"id\":1"), "{answer}");

    // stdin stays open: only the signal can end the session.
    let pid = i32::try_from(child.id().ok_or("no pid")?)?;
    // SAFETY: kill(2) on our own child's pid, with a valid signal number.
    let sent = unsafe { libc::kill(pid, libc::SIGTERM) };
    assert_eq!(sent, 0, "kill(SIGTERM)");
    let status = tokio::time::timeout(TIMEOUT, child.wait()).await??;
    assert_eq!(status.code(), Some(0), "exit status after SIGTERM");
    drop(stdin);
    Ok(())
}

/// The test client fails where a host fails: a line on stdout that is not JSON-RPC (here a shell
/// prints one before the gateway starts) fails `close`, though rmcp itself would skip it.
#[tokio::test]
async fn the_test_client_rejects_a_stray_stdout_line() -> Result<(), BoxError> {
    let sandbox = Sandbox::new()?;
    let gateway = support::mcp::gateway_bin();
    let client = sandbox
        .launch()
        .bin("/bin/sh")
        .arg("-c")
        .arg(format!("echo 'starting up'; exec '{}'", gateway.display()))
        .connect()
        .await?;
    client.list_tools().await?;
    assert_eq!(client.stdout_violations().len(), 1);
    let err = client
        .close()
        .await
        .expect_err("a stray line breaks the protocol");
    assert!(err.to_string().contains("starting up"), "{err}");
    Ok(())
}

#[test]
fn the_jsonrpc_check_tells_messages_from_other_lines() {
    use support::mcp::check_jsonrpc;
    for ok in [
        r#"{"jsonrpc":"2.0","id":1,"result":{}}"#,
        r#"{"jsonrpc":"2.0","id":"a","error":{"code":-1,"message":"x"}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{}}"#,
    ] {
        assert_eq!(check_jsonrpc(ok), Ok(()), "{ok}");
    }
    for bad in [
        "starting up",
        r#"{"id":1,"result":{}}"#,
        r#"{"jsonrpc":"2.0","id":1}"#,
        r#"{"jsonrpc":"2.0","id":1,"result":{},"error":{}}"#,
        r#"[{"jsonrpc":"2.0","id":1,"result":{}}]"#,
    ] {
        assert!(check_jsonrpc(bad).is_err(), "{bad}");
    }
}

/// Each host is offered a wait it can sit through: the `timeout_ms` bound in its tool list is
/// its own `hosts` entry's `wait_max` (a host unknown to the config gets `default`'s), never the
/// gateway-wide `timeouts.wait_max` that hosts would cut off at about a minute.
#[tokio::test]
async fn each_host_sees_the_wait_it_can_sit_through() -> Result<(), BoxError> {
    let defaults = default_config()?;
    let sandbox = Sandbox::new()?;
    sandbox.write_repo_config("hosts:\n  codex-mcp-client:\n    wait_max: 20s\n")?;
    for (name, expected) in [
        ("codex-mcp-client", 20_000u64),
        (
            "some-other-host",
            u64::try_from(defaults.host(None).wait_max.as_millis())?,
        ),
    ] {
        let client = sandbox.launch().client_name(name).connect().await?;
        let tools = client.list_tools().await?;
        let wait = tools
            .iter()
            .find(|t| t.name == WAIT)
            .ok_or("no wait tool")?;
        let timeout = &wait.input_schema["properties"]["timeout_ms"];
        assert_eq!(timeout["maximum"], expected, "{name}: {timeout}");
        assert!(
            timeout["default"].as_u64() <= Some(expected),
            "{name}: {timeout}"
        );
        client.close().await?;
    }
    assert!(defaults.host(None).wait_max < defaults.timeouts.wait_max.get());
    Ok(())
}

/// Runs one short session (initialize, tools/list, a tool call that needs no OpenCode), closes
/// stdin, and returns the gateway's stdout and stderr once it has exited 0.
async fn short_session(env: &[(&str, &str)]) -> Result<(String, String), BoxError> {
    let sandbox = Sandbox::new()?;
    let mut launch = sandbox.launch();
    for (k, v) in env {
        launch = launch.env(*k, *v);
    }
    let requests = [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "quiet-test", "version": "0"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": TASK_STATUS, "arguments": {"task_id": "tsk_unknown"}}}),
    ];
    let (status, stdout, stderr) = raw_session(launch, &requests).await?;
    assert_eq!(status.code(), Some(0), "stderr:\n{stderr}");
    let answered = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|m| m.get("result").is_some())
        .count();
    assert_eq!(answered, 3, "stdout:\n{stdout}\nstderr:\n{stderr}");
    Ok((stdout, stderr))
}

/// Writes `requests` to a gateway's stdin, one a line, closes it, and returns how the gateway
/// exited and everything it wrote on stdout and stderr; each step is bounded by [`TIMEOUT`].
async fn raw_session(
    launch: support::mcp::Launch,
    requests: &[Value],
) -> Result<(std::process::ExitStatus, String, String), BoxError> {
    let mut child = launch
        .command()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut stdin = child.stdin.take().ok_or("no stdin")?;
    let input: String = requests.iter().map(|r| format!("{r}\n")).collect();
    tokio::time::timeout(TIMEOUT, async {
        stdin.write_all(input.as_bytes()).await?;
        stdin.shutdown().await
    })
    .await??;
    drop(stdin);
    let output = tokio::time::timeout(TIMEOUT, child.wait_with_output()).await??;
    Ok((
        output.status,
        String::from_utf8(output.stdout)?,
        String::from_utf8(output.stderr)?,
    ))
}

/// Lines that rmcp logged at INFO (tracing's format: `<time>  INFO <spans>: rmcp::...`).
fn rmcp_info_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.contains(" INFO ") && l.contains("rmcp::"))
        .collect()
}

#[tokio::test]
async fn default_stderr_is_quiet_and_debug_brings_the_per_message_lines_back(
) -> Result<(), BoxError> {
    let (_, quiet) = short_session(&[]).await?;
    assert!(
        rmcp_info_lines(&quiet).is_empty(),
        "rmcp's per-message INFO lines at the default level:\n{quiet}"
    );
    // Still our own lines: the default level is quiet, not silent.
    assert!(quiet.contains("serving MCP on stdio"), "{quiet}");

    // The same session at `debug` shows them, so the check above looks for lines that exist.
    let (_, loud) = short_session(&[("OPENCODE_MCP_LOG", "debug")]).await?;
    assert!(
        !rmcp_info_lines(&loud).is_empty(),
        "no rmcp INFO line even at debug:\n{loud}"
    );
    assert!(loud.contains(" DEBUG "), "{loud}");
    // A line per MCP message: rmcp logs each request and response at debug.
    assert!(
        loud.contains("rmcp::service: received request"),
        "no per-request line at debug:\n{loud}"
    );
    // `debug` is this crate at debug, not every dependency: no other crate's DEBUG line.
    let foreign: Vec<&str> = loud
        .lines()
        .filter(|l| {
            l.contains(" DEBUG ") && !l.contains("opencode_mcp") && !l.contains("rmcp::service:")
        })
        .collect();
    assert!(foreign.is_empty(), "{foreign:#?}");
    Ok(())
}

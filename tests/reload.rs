//! Hot reload of `delegation.yaml` over the real MCP wire: the gateway binary in a temp project
//! directory, its config files edited while it serves, and what the host then sees.
//!
//! - a tool added to the user's file is announced (`notifications/tools/list_changed`)
//!   and listed and callable; a prompt edit is announced as `prompts/list_changed` only; an edit
//!   that changes nothing in force is announced as nothing;
//! - an invalid edit keeps the running surface, with a warning naming file, key and problem, and
//!   a later valid edit applies (the first notification after the broken edit is the valid one's);
//! - `--config FILE` is watched; a restart-only key (`state_dir`) changed there keeps its running
//!   value with a warning while the rest of the edit applies; the repository's file is not
//!   reloaded (an agent can write it): an edit is reported, and applies at the next start under
//!   its trust rules;
//! - `reload: false` watches nothing;
//! - with a real OpenCode and the scripted model: a task running across a reload finishes
//!   normally under the deadline it started with, while a task started after it gets the new one.
//!
//! Synchronisation is on what the gateway says: a notification, or its log line on stderr, each
//! awaited with a bounded deadline.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use support::fake_llm::echo_reply;
use support::mcp::{BoxError, ListChanged, McpClient, Sandbox};
use support::rig::{Rig, TASK_TIMEOUT_MS};
use support::{FakeLlm, OpenCodeEnv};

/// How long a reload may take to be noticed: one poll (1 s) and the settle time, with room for
/// a loaded machine.
const NOTICED: Duration = Duration::from_secs(20);

const STATUS_TOOL: &str = "opencode_get_task_status";

/// A repository file that adds a tool `status` (an alias of get_task_status) described as `desc`.
fn with_status_tool(desc: &str) -> String {
    format!(
        "tools:\n  status:\n    action: get_task_status\n    description: {desc}\n",
        desc = json!(desc)
    )
}

/// Writes `text` to `path` as editors save: a temporary file renamed over the old one.
fn save(path: &Path, text: &str) -> Result<(), BoxError> {
    let tmp = path.with_extension("yaml.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

async fn tool_names(client: &McpClient) -> Result<Vec<String>, BoxError> {
    Ok(client
        .list_tools()
        .await?
        .into_iter()
        .map(|t| t.name.to_string())
        .collect())
}

async fn description_of(client: &McpClient, name: &str) -> Result<Option<String>, BoxError> {
    Ok(client
        .list_tools()
        .await?
        .into_iter()
        .find(|t| t.name == name)
        .and_then(|t| t.description.map(|d| d.to_string())))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edits_to_the_users_file_swap_the_surface_and_a_broken_edit_keeps_it(
) -> Result<(), BoxError> {
    let sandbox = Sandbox::new()?;
    // The user's global file: the layer the user edits while a session runs.
    let user_file = sandbox.home().join(".config/opencode-mcp/delegation.yaml");
    std::fs::create_dir_all(user_file.parent().ok_or("no parent")?)?;
    std::fs::write(&user_file, "timeouts:\n  stall: 4m\n")?;
    let client = sandbox.launch().connect().await?;
    let caps = client
        .server_info()
        .map(|i| i.capabilities)
        .ok_or("no server info")?;
    assert_eq!(caps.tools.and_then(|t| t.list_changed), Some(true));
    assert_eq!(caps.prompts.and_then(|p| p.list_changed), Some(true));
    assert!(!tool_names(&client).await?.contains(&"status".to_string()));
    client
        .wait_stderr_line(&["watching", &user_file.display().to_string()], NOTICED)
        .await?;

    // 1. A tool added to the file: announced, listed, and routed to its action.
    save(&user_file, &with_status_tool("First alias."))?;
    assert_eq!(
        client.wait_list_changes(1, NOTICED).await?,
        [ListChanged::Tools]
    );
    assert!(tool_names(&client).await?.contains(&"status".to_string()));
    let reply = client
        .call("status", json!({ "task_id": "t_nope" }))
        .await?;
    assert!(reply.is_error, "{}", reply.text);
    assert_eq!(
        reply.error_code(),
        Some("not_found"),
        "the new tool reaches get_task_status: {}",
        reply.text
    );

    // 2. A broken edit: the warning names the file, the key and what was expected; nothing is
    // announced and the running surface is still served.
    save(
        &user_file,
        &format!(
            "{}timeouts:\n  task: soon\n",
            with_status_tool("Broken edit.")
        ),
    )?;
    let warning = client
        .wait_stderr_line(
            &[
                "WARN",
                &user_file.display().to_string(),
                "`timeouts.task`",
                "stays in force",
            ],
            NOTICED,
        )
        .await?;
    assert!(
        warning.contains("duration"),
        "says what was expected: {warning}"
    );
    assert_eq!(
        description_of(&client, "status").await?.as_deref(),
        Some("First alias.")
    );
    assert_eq!(client.list_changes(), [ListChanged::Tools]);

    // A valid edit after it applies, and its notification is the first since the broken one.
    save(&user_file, &with_status_tool("Second alias."))?;
    assert_eq!(
        client.wait_list_changes(2, NOTICED).await?,
        [ListChanged::Tools, ListChanged::Tools]
    );
    assert_eq!(
        description_of(&client, "status").await?.as_deref(),
        Some("Second alias.")
    );

    // 3. A comment changes nothing in force: logged, not announced.
    save(
        &user_file,
        &format!("# a comment\n{}", with_status_tool("Second alias.")),
    )?;
    client
        .wait_stderr_line(&["nothing in force changed"], NOTICED)
        .await?;
    assert_eq!(client.list_changes().len(), 2);

    // 4. A prompt edit: prompts/list_changed only.
    save(
        &user_file,
        &format!(
            "{}prompts:\n  delegate_task:\n    description: Hand work to OpenCode.\n",
            with_status_tool("Second alias.")
        ),
    )?;
    assert_eq!(
        client.wait_list_changes(3, NOTICED).await?[2],
        ListChanged::Prompts
    );
    let prompts = client.list_prompts().await?;
    assert_eq!(
        prompts[0].description.as_deref(),
        Some("Hand work to OpenCode.")
    );
    assert_eq!(client.list_changes().len(), 3, "no tools/list_changed");

    // 5. The file deleted: back to the built-in surface, which changes the tools and (the
    // description above reverts) the prompts. Both are announced; the client handles each
    // notification on its own task, so their order on arrival is not fixed.
    std::fs::remove_file(&user_file)?;
    let mut last = client.wait_list_changes(5, NOTICED).await?.split_off(3);
    last.sort();
    assert_eq!(last, [ListChanged::Tools, ListChanged::Prompts]);
    let names = tool_names(&client).await?;
    assert!(!names.contains(&"status".to_string()));
    assert!(names.contains(&STATUS_TOOL.to_string()));
    client.close().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_only_keys_warn_and_the_rest_of_the_edit_applies() -> Result<(), BoxError> {
    let sandbox = Sandbox::new()?;
    let state = sandbox.root().join("state");
    let explicit = sandbox.root().join("mine.yaml");
    std::fs::write(&explicit, format!("state_dir: {}\n", state.display()))?;
    let launch = || sandbox.launch().arg("--config").arg(&explicit);
    let client = launch().connect().await?;

    // --config FILE is the user's own layer: `state_dir` may be set there, but not while serving.
    save(
        &explicit,
        &format!(
            "state_dir: {}\n{}",
            sandbox.root().join("elsewhere").display(),
            with_status_tool("From --config.")
        ),
    )?;
    let warning = client
        .wait_stderr_line(&["`state_dir` changed in", "restarts"], NOTICED)
        .await?;
    assert!(
        warning.contains(&explicit.display().to_string()),
        "names the file: {warning}"
    );
    assert_eq!(
        client.wait_list_changes(1, NOTICED).await?,
        [ListChanged::Tools]
    );
    assert!(tool_names(&client).await?.contains(&"status".to_string()));
    assert!(
        !sandbox.root().join("elsewhere").exists(),
        "the running state directory is kept"
    );

    // A repository file written while serving (as an agent working in this directory could)
    // is not applied: the gateway says so, with how to apply it, and the tools stay as they
    // were. An edit of the user's file after it reloads without it.
    let repo_file = sandbox.cwd().join("delegation.yaml");
    save(
        &repo_file,
        "opencode:\n  command: ./evil\ntools:\n  result:\n    action: get_task_result\n    \
         description: Repository alias.\n",
    )?;
    let noticed = client
        .wait_stderr_line(
            &[
                "WARN",
                "the repository's delegation.yaml changed",
                "restart the MCP server",
            ],
            NOTICED,
        )
        .await?;
    assert!(
        noticed.contains(&repo_file.display().to_string()),
        "{noticed}"
    );
    save(
        &explicit,
        &format!(
            "state_dir: {}\n{}",
            sandbox.root().join("elsewhere").display(),
            with_status_tool("From --config, again.")
        ),
    )?;
    client.wait_list_changes(2, NOTICED).await?;
    let names = tool_names(&client).await?;
    assert!(!names.contains(&"result".to_string()), "{names:?}");
    assert_eq!(
        description_of(&client, "status").await?.as_deref(),
        Some("From --config, again.")
    );
    assert!(!client.stderr().contains("`opencode.command`"));
    client.close().await?;

    // At the next start it applies, under the repository's trust rules: it may add a tool, not
    // choose what the gateway runs.
    let client = launch().connect().await?;
    let withheld = client
        .wait_stderr_line(&["`opencode.command`", "is not applied"], NOTICED)
        .await?;
    assert!(
        withheld.contains(&repo_file.display().to_string()),
        "{withheld}"
    );
    let names = tool_names(&client).await?;
    assert!(names.contains(&"result".to_string()) && names.contains(&"status".to_string()));
    client.close().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_false_watches_nothing() -> Result<(), BoxError> {
    let sandbox = Sandbox::new()?;
    sandbox.write_repo_config("reload: false\n")?;
    let client = sandbox.launch().connect().await?;
    client
        .wait_stderr_line(&["`reload: false`"], NOTICED)
        .await?;
    let caps = client
        .server_info()
        .map(|i| i.capabilities)
        .ok_or("no server info")?;
    assert_eq!(caps.tools.and_then(|t| t.list_changed), None);
    assert_eq!(caps.prompts.and_then(|p| p.list_changed), None);
    // The session is up and answering, so start-up logging is over: no watch was started.
    assert!(!tool_names(&client).await?.is_empty());
    assert!(!client.stderr().contains("watching"), "{}", client.stderr());
    client.close().await
}

/// A `delegation.yaml` that is a FIFO (no writer ever comes) is no layer, and neither start-up
/// nor the watcher waits on it: the gateway answers `initialize` and lists its tools (the
/// watcher's open blocked, and the gateway did not answer for 30 s and more).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_named_delegation_yaml_is_not_waited_on() -> Result<(), BoxError> {
    let sandbox = Sandbox::new()?;
    let fifo = sandbox.cwd().join("delegation.yaml");
    let made = Command::new("mkfifo").arg(&fifo).status()?;
    assert!(made.success(), "mkfifo (coreutils) is needed for this test");
    let client = sandbox.launch().connect().await?;
    assert!(tool_names(&client)
        .await?
        .contains(&STATUS_TOOL.to_string()));
    client.close().await
}

fn id(v: &Value) -> String {
    v["task_id"].as_str().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_task_survives_a_reload_and_new_tasks_get_the_new_settings() {
    let env = OpenCodeEnv::new();
    // The user's global file (`$XDG_CONFIG_HOME/opencode-mcp/`).
    let user_file = env.root().join("config/opencode-mcp/delegation.yaml");
    std::fs::create_dir_all(user_file.parent().expect("parent")).expect("mkdir");
    std::fs::write(&user_file, "timeouts:\n  stall: 4m\n").expect("write the user's file");
    let rig = Rig::start_in(FakeLlm::start(), env, &[]).await;

    let running = id(&rig.start_task("long one [[slow:6000]]").await);
    // A task deadline far shorter than the running task takes, and a new tool.
    save(
        &user_file,
        &format!(
            "timeouts:\n  stall: 500ms\n  task: 2s\n{}",
            with_status_tool("Added while a task runs.")
        ),
    )
    .expect("edit");
    assert_eq!(
        rig.client
            .wait_list_changes(1, NOTICED)
            .await
            .expect("the reload is announced"),
        [ListChanged::Tools]
    );
    let during = rig.status(&running).await;
    assert!(
        matches!(during["status"].as_str(), Some("pending" | "running")),
        "the reload came while the task ran: {during}"
    );

    // The running task keeps the 30-minute deadline it started with.
    let result = rig.finish(&running).await;
    assert_eq!(result["status"], "completed", "{result}");
    assert_eq!(result["text"], echo_reply("long one [[slow:6000]]"));

    // A task started now gets the new 2-second deadline.
    let late = id(&rig.start_task("late one [[slow:6000]]").await);
    let w = rig.wait(&[&late], "all", TASK_TIMEOUT_MS).await;
    assert_eq!(w["done"], true, "{w}");
    assert_eq!(rig.status(&late).await["status"], "timed_out");
    // The tool added by the reload answers for the running gateway's tasks.
    let via_alias = rig.ok("status", json!({ "task_id": running })).await;
    assert_eq!(via_alias["status"], "completed");
}

//! The shape of `delegation.yaml`.
//!
//! Everything a host sees (which tools exist, what they are called and how they are described, the
//! model tiers the `delegate_task` prompt teaches, the limits every argument is checked against) is
//! declared here rather than in code, so that a repository can tune delegation by dropping its own
//! file in without a rebuild. Every struct denies unknown keys: a typo in a user's file must be an
//! error that names the key, never a setting silently ignored.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::duration::HumanDuration;

/// The whole resolved configuration, after every layer has been merged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Optional JSON Schema reference for editors; ignored by the server.
    #[serde(rename = "$schema", default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<String>,
    /// Server `instructions` sent to the host at `initialize` (at most 2,048 characters, because
    /// Claude Code cuts longer ones).
    pub instructions: String,
    /// How to reach or start OpenCode.
    pub opencode: OpenCodeConfig,
    /// Timeouts, as human durations such as `45s`, `10m`, `1h30m`.
    pub timeouts: Timeouts,
    /// Bounds every tool argument and the task registry are checked against.
    pub limits: Limits,
    /// Model tiers, cheapest first: which difficulty of work each one takes and which models serve it.
    pub tiers: Vec<Tier>,
    /// The tool set: each entry binds a tool name to an action.
    pub tools: BTreeMap<String, ToolConfig>,
    /// Prompts offered to the host (`prompts/list`).
    pub prompts: BTreeMap<String, PromptConfig>,
}

/// How OpenCode is reached: a managed `opencode serve` child, or an attached server at `url`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OpenCodeConfig {
    /// The `opencode` binary used for managed servers (a name on PATH or a path).
    pub command: String,
    /// Interface managed servers bind to. Only loopback addresses are accepted.
    pub hostname: String,
    /// Port for managed servers; 0 picks a free one.
    pub port: u16,
    /// Attach to an already running server instead of spawning one (e.g. `http://127.0.0.1:4096`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Name of the environment variable holding the basic-auth password for an attached server.
    /// Managed servers always get a fresh random password.
    pub password_env: String,
    /// What managed servers do when a tool asks for permission.
    pub permission: PermissionPolicy,
}

/// The permission policy given to managed OpenCode servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PermissionPolicy {
    /// Every tool runs without asking (OpenCode's `"permission": "allow"`).
    Allow,
    /// OpenCode asks; the task shows `waiting_permission` until someone answers.
    Ask,
    /// Every ask is refused.
    Deny,
}

/// Timeouts. All are human durations (`500ms`, `45s`, `10m`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Timeouts {
    /// How long a managed `opencode serve` may take to print its `listening on` line.
    pub server_start: HumanDuration,
    /// Timeout for one HTTP request to OpenCode.
    pub request: HumanDuration,
    /// How long `wait_for_task` waits when the caller gives no `timeout_ms`. Keep it under 60 s:
    /// hosts such as Codex cut tool calls off at 60 s.
    pub wait_default: HumanDuration,
    /// The largest `timeout_ms` a caller may ask `wait_for_task` for.
    pub wait_max: HumanDuration,
    /// A task running longer than this is aborted and reported `timed_out`.
    pub task: HumanDuration,
    /// A running task with no event for this long is reported as stalled in its progress.
    pub stall: HumanDuration,
    /// Interval of MCP progress notifications during a wait, when the host sent a progress token.
    pub progress_interval: HumanDuration,
}

/// Bounds on inputs and on what the gateway keeps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Largest prompt accepted, in bytes.
    pub max_prompt_bytes: u32,
    /// Most task ids one `wait_for_task` call may name.
    pub max_wait_ids: u32,
    /// Most characters of result text returned by one `get_task_result` call; pass `offset` to page.
    pub result_page_chars: u32,
    /// Most tasks tracked at once (finished ones are evicted after `finished_task_ttl`).
    pub max_tasks: u32,
    /// How long a finished task stays answerable.
    pub finished_task_ttl: HumanDuration,
    /// Characters of streamed text shown as the tail in progress reports.
    pub progress_tail_chars: u32,
}

/// A tier of models and the difficulty of work it should take.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Tier {
    /// Name used as `tier` in `opencode_start_task` (e.g. `fast`).
    pub name: String,
    /// The kind of work this tier handles, in words the host model reads.
    pub handles: String,
    /// Candidate models as exact `provider/model` ids; the first one the server offers wins.
    /// Empty means "the server's default model".
    #[serde(default)]
    pub models: Vec<String>,
}

/// One tool in the MCP tool set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolConfig {
    /// The action this tool performs.
    pub action: Action,
    /// The description the host model reads.
    pub description: String,
    /// Disabled tools are absent from `tools/list` and cannot be called.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Optional human-readable title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
}

fn default_true() -> bool {
    true
}

/// The actions the gateway implements. Tools are bound to these by name in `tools`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    StartServer,
    StopServer,
    ListAgents,
    StartTask,
    ContinueTask,
    CancelTask,
    GetTaskStatus,
    GetTaskResult,
    WaitForTask,
}

impl Action {
    /// Every action, in the order tools are documented.
    pub const ALL: [Action; 9] = [
        Action::StartServer,
        Action::StopServer,
        Action::ListAgents,
        Action::StartTask,
        Action::ContinueTask,
        Action::CancelTask,
        Action::GetTaskStatus,
        Action::GetTaskResult,
        Action::WaitForTask,
    ];

    /// The snake_case name used in `delegation.yaml`.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::StartServer => "start_server",
            Action::StopServer => "stop_server",
            Action::ListAgents => "list_agents",
            Action::StartTask => "start_task",
            Action::ContinueTask => "continue_task",
            Action::CancelTask => "cancel_task",
            Action::GetTaskStatus => "get_task_status",
            Action::GetTaskResult => "get_task_result",
            Action::WaitForTask => "wait_for_task",
        }
    }
}

/// A prompt offered to the host. The template is plain text with `{{name}}` placeholders: each
/// declared argument, plus `{{tiers}}` (a rendered list of the configured tiers).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromptConfig {
    /// What the prompt is for.
    pub description: String,
    /// Arguments the host fills in.
    #[serde(default)]
    pub arguments: Vec<PromptArgument>,
    /// The message text, with `{{argument}}` and `{{tiers}}` placeholders.
    pub template: String,
}

/// One argument of a prompt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromptArgument {
    pub name: String,
    pub description: String,
    #[serde(default)]
    pub required: bool,
}

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
use std::time::Duration;

/// What an MCP tool name must look like (letters, digits, `_` and `-`, 1 to 64 of them).
pub const TOOL_NAME_PATTERN: &str = "^[a-zA-Z0-9_-]{1,64}$";

/// What a model id in a tier must look like: `provider/model` (the model part may hold more `/`).
pub const MODEL_ID_PATTERN: &str = r"^[^/\s]+/\S+$";

/// What a prompt argument name must look like (it is written `{{name}}` in templates).
pub const ARGUMENT_NAME_PATTERN: &str = "^[a-zA-Z0-9_-]+$";

/// The most characters `instructions` may hold (Claude Code cuts longer ones).
pub const MAX_INSTRUCTIONS_CHARS: usize = 2048;

/// The whole resolved configuration, after every layer has been merged.
///
/// In a file every key is optional: each file is one layer and sets only what it changes, and the
/// merged result must be complete. Items of lists (`tiers`, a prompt's `arguments`) are the
/// exception: a layer that sets a list replaces it whole, so each item must be complete.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Optional JSON Schema reference for editors; ignored by the server.
    #[serde(rename = "$schema", default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<String>,
    /// Server `instructions` sent to the host at `initialize` (at most 2,048 characters, because
    /// Claude Code cuts longer ones; counted after `{{tool:<action>}}` is replaced by the tool's
    /// name). Name this gateway's tools as `{{tool:<action>}}` (e.g. `{{tool:start_task}}`) so a
    /// renamed tool is named right.
    #[schemars(length(max = MAX_INSTRUCTIONS_CHARS))]
    pub instructions: String,
    /// How to reach or start OpenCode.
    pub opencode: OpenCodeConfig,
    /// Timeouts, as human durations such as `45s`, `10m`, `1h30m`.
    pub timeouts: Timeouts,
    /// Bounds every tool argument and the task registry are checked against.
    pub limits: Limits,
    /// Model tiers, cheapest first: which difficulty of work each one takes and which models serve it.
    ///
    /// A list: a layer that sets `tiers` replaces the whole list (copy the default tiers you keep).
    pub tiers: Vec<Tier>,
    /// The tool set: each entry binds a tool name to an action.
    ///
    /// A map: layers merge per tool and per field, so a repository can change one tool's
    /// `description` or set `enabled: false` without repeating the rest.
    #[schemars(extend("propertyNames" = { "pattern": TOOL_NAME_PATTERN }))]
    pub tools: BTreeMap<String, ToolConfig>,
    /// Where tasks work by default: in the directory they are given, or each in a git worktree
    /// of its own. A task's `isolation` and `base` arguments override these.
    #[serde(default)]
    pub isolation: IsolationConfig,
    /// Where the task registry is kept so a restarted gateway still answers for its tasks
    /// (default: `$XDG_STATE_HOME/opencode-mcp`, else `~/.local/state/opencode-mcp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_dir: Option<String>,
    /// Prompts offered to the host (`prompts/list`). Merged per prompt like `tools`.
    pub prompts: BTreeMap<String, PromptConfig>,
    /// What each MCP host can take, by the `clientInfo.name` it sends at `initialize`
    /// (`claude-code`, `codex-mcp-client`, ...); `default` serves every other host and fills
    /// the fields an entry leaves out. Merged per host and per field like `tools`.
    #[serde(default)]
    pub hosts: BTreeMap<String, HostConfig>,
    /// How `opencode_usage` and `opencode-mcp usage` value the work delegated.
    #[serde(default)]
    pub report: ReportConfig,
    /// Machines tasks may run on, by name, reached with your own `ssh` client and
    /// `~/.ssh/config`. `local` is this machine (only its `max_tasks` can be set); every other
    /// entry is a machine with git and OpenCode (with its own providers) that `ssh` reaches
    /// without a prompt. Only your own layers may set this: a repository's file cannot add,
    /// choose or change workers. Merged per worker and per field like `tools`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("propertyNames" = { "pattern": WORKER_NAME_PATTERN }))]
    pub workers: BTreeMap<String, WorkerConfig>,
    /// Watch the configuration files while serving and apply a valid edit at once (tools,
    /// prompts, tiers, timeouts, limits; the host is told its tool and prompt lists changed).
    /// `false` reads them only at start. This key itself takes effect at the next start.
    #[serde(default = "reload_default")]
    pub reload: bool,
    /// Commands that check a task's work after each turn (declared on tiers, on a preset as its
    /// fixed `checks`, or by the call), and the fix rounds that follow a failing one.
    #[serde(default)]
    pub checks: ChecksConfig,
    /// Confinement of every command a delegated agent runs and of every check (bubblewrap, on
    /// by default on Linux). Only your own files may set this.
    #[serde(default)]
    pub sandbox: SandboxConfig,
    /// The live page of tasks, workers, the queue and spend (`opencode-mcp dashboard`), served
    /// by a gateway too when `serve` is on. Only your own files may set this.
    #[serde(default)]
    pub dashboard: DashboardConfig,
    /// Settings of the repository's file that were not applied (not part of the file format).
    #[serde(skip)]
    #[schemars(skip)]
    pub withheld: Vec<super::trust::Withheld>,
    /// Built-in defaults changed to fit values the user set, one line each (not part of the
    /// file format; `print-config` lists them).
    #[serde(skip)]
    #[schemars(skip)]
    pub derived: Vec<String>,
    /// `instructions` as written, before tool names were filled in (not part of the file
    /// format): tells a reload whether the text changed or only the tools it names.
    #[serde(skip)]
    #[schemars(skip)]
    pub instructions_source: Provenance,
}

/// Where a setting came from, kept beside it for messages. Not a setting: two configurations
/// that put the same values in force are equal whatever their provenance (a printed config
/// loads back equal, though its texts were written with the tool names filled in).
#[derive(Debug, Clone, Default)]
pub struct Provenance(pub String);

impl PartialEq for Provenance {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// `reload` when no layer sets it: on.
fn reload_default() -> bool {
    true
}

impl Config {
    /// The enabled tools, by name.
    pub fn enabled_tools(&self) -> impl Iterator<Item = (&str, &ToolConfig)> {
        self.tools
            .iter()
            .filter(|(_, tool)| tool.enabled)
            .map(|(name, tool)| (name.as_str(), tool))
    }

    /// The limits for the host that called itself `client` at `initialize`: its own entry, with
    /// what it leaves out taken from `default`.
    pub fn host(&self, client: Option<&str>) -> HostLimits {
        let default = self.hosts.get(DEFAULT_HOST);
        let own = client.and_then(|name| self.hosts.get(name));
        let pick = |f: fn(&HostConfig) -> Option<u32>| {
            own.and_then(f)
                .or_else(|| default.and_then(f))
                .unwrap_or(FALLBACK_RESULT_CHARS)
        };
        let wait = own
            .and_then(|h| h.wait_max)
            .or_else(|| default.and_then(|h| h.wait_max))
            .map_or(self.timeouts.wait_max.get(), |w| w.get());
        let count = own
            .and_then(|h| h.count)
            .or_else(|| default.and_then(|h| h.count))
            .unwrap_or_default();
        HostLimits {
            result_chars: pick(|h| h.result_chars),
            count,
            wait_max: wait.min(self.timeouts.wait_max.get()),
        }
    }

    /// The `hosts:` entry whose limits apply to the host called `client`: its own, or `default`.
    pub fn host_name<'a>(&self, client: &'a str) -> &'a str {
        if self.hosts.contains_key(client) {
            client
        } else {
            DEFAULT_HOST
        }
    }

    /// The tier called `name`, if configured.
    pub fn tier(&self, name: &str) -> Option<&Tier> {
        self.tiers.iter().find(|tier| tier.name == name)
    }
}

/// How the usage report values the work delegated.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReportConfig {
    /// What the same tokens would have cost on the model that delegates (the orchestrator's), so
    /// the report can state the saving as a number.
    #[serde(default)]
    pub reference_price: ReferencePrice,
}

/// A model's list price in US dollars per million tokens. Not negative.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReferencePrice {
    /// Dollars per million input tokens; cache reads and writes are charged at this price too
    /// (the reference has no cache discount), so the saving is an upper bound when caching helps.
    #[schemars(range(min = 0.0))]
    pub input_per_mtok: f64,
    /// Dollars per million output tokens; reasoning tokens are charged at this price.
    #[schemars(range(min = 0.0))]
    pub output_per_mtok: f64,
}

impl Default for ReferencePrice {
    /// A frontier model's list price ($15 in, $75 out per million tokens), used when no file
    /// sets one, so a report always has a saving to show.
    fn default() -> Self {
        Self {
            input_per_mtok: 15.0,
            output_per_mtok: 75.0,
        }
    }
}

/// A worker's name: short, lowercase, safe in a path and a git ref.
pub const WORKER_NAME_PATTERN: &str = "^[a-z0-9][a-z0-9_-]{0,31}$";
/// The worker that is this machine.
pub const LOCAL_WORKER: &str = "local";

/// One machine tasks may run on (`workers.<name>`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkerConfig {
    /// The `ssh` destination: a `Host` of your `~/.ssh/config` or `user@host`. Connections use
    /// `BatchMode=yes` (never a prompt) and no agent forwarding. Not for `local`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh: Option<String>,
    /// An ssh client configuration file to use instead of `~/.ssh/config` and the system's
    /// (`ssh -F`; an absolute path), e.g. one kept for workers alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_config: Option<String>,
    /// Tasks it runs at once (each of its OpenCode's sessions, with its tools and builds, runs
    /// there). For `local`, the default is `limits.max_tasks`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_tasks: Option<u32>,
    /// The OpenCode command on the worker (default `opencode`, found on its `PATH`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opencode: Option<String>,
    /// Where the worker keeps repositories and task worktrees, relative to the ssh login's home
    /// directory unless absolute (default `.opencode-mcp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
    /// How long the worker may stay out of reach (its connection dropped, the machine gone)
    /// while the gateway keeps reconnecting, before its unfinished tasks fail `WorkerLost`
    /// (default 2m). Work fetched back before stays.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost_after: Option<HumanDuration>,
    /// The tiers whose tasks it takes when a call names no worker (e.g. a box whose own
    /// providers serve the cheap tiers). Unset: any task. A call naming the worker is not held
    /// to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tiers: Option<Vec<String>>,
    /// Whether its agents' commands and checks run confined there (bubblewrap on the worker,
    /// the rules of `sandbox`). Unset: as `sandbox.mode`. With `on`, a worker where bubblewrap
    /// cannot run takes no task; `off` lets its agents run as its ssh user. Not for `local`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxMode>,
}

/// The defaults of `opencode_start_task`'s `isolation` and `base`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IsolationConfig {
    /// `none`: tasks work in their directory, all in the same files. `worktree`: each task gets
    /// a git worktree of the repository on its own branch (`opencode-mcp/<task_id>`), to review
    /// and apply or discard.
    #[serde(default)]
    pub mode: Isolation,
    /// What a worktree starts from: `working_tree` (`HEAD` plus the uncommitted changes,
    /// untracked files included: what you see) or `head` (the last commit only).
    #[serde(default)]
    pub base: crate::git::Base,
}

/// Confinement: what a delegated agent's commands and the checks may reach. See
/// `docs/security.md`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxConfig {
    /// `on`: every command and check runs in a sandbox (writes only in the task's directory, no
    /// secrets, no network, its own processes); a start where that cannot work is refused.
    /// `off`: they run as you, unconfined.
    #[serde(default)]
    pub mode: SandboxMode,
    /// Let confined commands and checks use the network.
    #[serde(default)]
    pub network: bool,
    /// More paths (absolute, or `~/...`) confined commands must not see, beside the built-in
    /// ones (`~/.ssh`, `~/.gnupg`, `~/.aws`, `~/.netrc`, cloud CLIs' config, OpenCode's data, the
    /// state directory).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hide: Vec<String>,
    /// More toolchain caches (absolute, or `~/...`) beside `~/.cargo`, `~/.rustup`, `~/.npm` and
    /// `~/.cache`: readable, written only in a private layer thrown away after each command.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub caches: Vec<String>,
    /// More environment variables confined commands keep, beside `PATH`, `HOME`, the locale,
    /// `TERM` and the toolchain homes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
}

/// Whether a gateway serves the dashboard, and where.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DashboardConfig {
    /// A gateway serving MCP also serves the page on 127.0.0.1, behind a random token, and its
    /// page can cancel that gateway's tasks. One page per state directory: the first gateway
    /// (or `opencode-mcp dashboard`) to start serves it. The address goes to the log and to
    /// `opencode-mcp doctor`.
    #[serde(default)]
    pub serve: bool,
    /// The page's port on 127.0.0.1; 0 takes any free port.
    #[serde(default)]
    pub port: u16,
}

/// Whether confinement is on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SandboxMode {
    #[default]
    On,
    Off,
}

/// Where a task works.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Isolation {
    /// In the directory it is given, shared with every other task there.
    #[default]
    None,
    /// In a git worktree of its own, created by the gateway.
    Worktree,
}

/// How OpenCode is reached: a managed `opencode serve` child, or an attached server at `url`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OpenCodeConfig {
    /// The `opencode` binary used for managed servers (a name on PATH or a path).
    #[schemars(length(min = 1))]
    pub command: String,
    /// Interface managed servers bind to. Only loopback addresses are accepted (`127.0.0.0/8`,
    /// `::1`, `localhost`): a managed server runs tools with the user's rights.
    pub hostname: String,
    /// Port for managed servers; 0 picks a free one.
    pub port: u16,
    /// Attach to an already running server instead of spawning one (an `http` or `https` URL such as
    /// `http://127.0.0.1:4096`). Unset (`~`) means managed servers are spawned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Name of the environment variable holding the basic-auth password for an attached server.
    /// Managed servers always get a fresh random password.
    #[schemars(length(min = 1))]
    pub password_env: String,
    /// What managed servers do when a tool asks for permission.
    pub permission: PermissionPolicy,
}

/// The permission policy given to managed OpenCode servers.
///
/// Deserialized from its three words only (see the `Deserialize` impl below): serde's derive
/// would also read the map `{allow: ~}` as `allow`, a shape no one writes on purpose and one the
/// trust filter must never have to guess about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PermissionPolicy {
    /// Every tool runs without asking (OpenCode's `"permission": "allow"`).
    Allow,
    /// OpenCode asks; the task shows `waiting_permission` until someone answers.
    Ask,
    /// Every ask is refused.
    Deny,
}

impl PermissionPolicy {
    const WORDS: &'static [&'static str] = &["allow", "ask", "deny"];
}

impl<'de> Deserialize<'de> for PermissionPolicy {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let word = String::deserialize(deserializer)?;
        match word.as_str() {
            "allow" => Ok(Self::Allow),
            "ask" => Ok(Self::Ask),
            "deny" => Ok(Self::Deny),
            _ => Err(serde::de::Error::unknown_variant(&word, Self::WORDS)),
        }
    }
}

/// Timeouts. All are human durations (`500ms`, `45s`, `10m`); none may be zero, and
/// `wait_default` may not exceed `wait_max`.
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
    /// Longest run of one check command (`checks`); a longer one is stopped and counts as failed.
    #[serde(default = "check_timeout_default")]
    pub check: HumanDuration,
}

fn linger_default() -> HumanDuration {
    Duration::from_secs(600).into()
}

fn check_timeout_default() -> HumanDuration {
    Duration::from_secs(600).into()
}

/// Checks: commands that must succeed in a task's directory after its turn, and what follows a
/// failing one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChecksConfig {
    /// Fix rounds after a failing check: the session is continued with the failure (the
    /// `fix_prompt`) and the checks run again, at most this often; then the task ends failed
    /// (`checks_failed`), or moves to its tier's `escalate_to`. 0: no fix round.
    #[serde(default = "max_rounds_default")]
    #[schemars(range(max = MAX_CHECK_ROUNDS))]
    pub max_rounds: u32,
    /// Characters kept of each check's output (its end): shown in the result and sent in the
    /// fix prompt.
    #[serde(default = "output_chars_default")]
    #[schemars(range(min = 100, max = MAX_CHECK_OUTPUT_CHARS))]
    pub output_chars: u32,
    /// Whether a repository's `delegation.yaml` may declare checks (a tier's `checks`, a tool's
    /// fixed `checks`): a check is a command the gateway runs. Only your own files may set this;
    /// a repository's checks are withheld otherwise.
    #[serde(default)]
    pub from_repository: bool,
    /// Checks a call or a preset may name (`checks: [test]`), each a name and the command it
    /// runs, e.g. `test: cargo test -q`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("propertyNames" = { "pattern": CHECK_NAME_PATTERN }))]
    pub named: BTreeMap<String, String>,
    /// Whether a call (or a preset) may pass commands of its own as `checks`, not only names of
    /// `named`: a check is a command the gateway runs, and a repository's instructions can ask
    /// the host model to pass one. Only your own files may set this.
    #[serde(default)]
    pub from_calls: bool,
    /// The prompt of a fix round (MiniJinja). `failures` lists the failing checks, each with
    /// `command`, `status` (its exit status, or how it ended), `seconds` and `output` (its end);
    /// `round` and `max_rounds` count the fix rounds.
    #[serde(default = "fix_prompt_default")]
    #[schemars(length(min = 1))]
    pub fix_prompt: String,
}

/// What the name of a check in `checks.named` must look like.
pub const CHECK_NAME_PATTERN: &str = "^[a-zA-Z0-9_-]{1,40}$";

/// The most fix rounds `checks.max_rounds` allows: each is a full model turn.
pub const MAX_CHECK_ROUNDS: u32 = 10;
/// The most output `checks.output_chars` keeps per check.
pub const MAX_CHECK_OUTPUT_CHARS: u32 = 100_000;

fn max_rounds_default() -> u32 {
    2
}

fn output_chars_default() -> u32 {
    4000
}

/// The fix prompt the built-in file sets (kept here too for layers built without it).
pub const FIX_PROMPT_DEFAULT: &str = "The checks of your work failed. Find the cause and fix \
it, then stop: the checks run again when you finish (fix round {{ round }} of {{ max_rounds }}). \
Do not weaken or skip a check to make it pass.\n{% for f in failures %}\n$ {{ f.command }}\n\
{{ f.status }} after {{ f.seconds }} s; the end of its output:\n{{ f.output }}\n{% endfor %}";

fn fix_prompt_default() -> String {
    FIX_PROMPT_DEFAULT.to_string()
}

/// One failing check, as a fix prompt shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct FixFailure {
    pub command: String,
    /// How it ended, in words: `exit status 1`, `stopped after 10m (timeouts.check)`.
    pub status: String,
    pub seconds: f64,
    /// The end of its output.
    pub output: String,
}

/// Steps a fix prompt's rendering may take: a template that loops without end fails instead.
const FIX_PROMPT_FUEL: u64 = 200_000;

impl ChecksConfig {
    /// The prompt of fix round `round` for these failures, at most `max_bytes` long (the
    /// prompt limit): the template is bounded in steps by its fuel and in output by the writer,
    /// so a template that would build gigabytes fails at the limit instead.
    pub fn render_fix_prompt(
        &self,
        round: u32,
        failures: &[FixFailure],
        max_bytes: usize,
    ) -> Result<String, minijinja::Error> {
        use minijinja::Value as V;
        let failures: Vec<V> = failures
            .iter()
            .map(|f| {
                V::from(BTreeMap::from([
                    ("command", V::from(f.command.as_str())),
                    ("status", V::from(f.status.as_str())),
                    ("seconds", V::from((f.seconds * 10.0).round() / 10.0)),
                    ("output", V::from(f.output.as_str())),
                ]))
            })
            .collect();
        let context = V::from(BTreeMap::from([
            ("round", V::from(round)),
            ("max_rounds", V::from(self.max_rounds)),
            ("failures", V::from(failures)),
        ]));
        let mut env = minijinja::Environment::new();
        env.set_fuel(Some(FIX_PROMPT_FUEL));
        let mut out = Capped {
            text: Vec::new(),
            max: max_bytes,
        };
        env.template_from_str(&self.fix_prompt)?
            .render_captured_to(context, &mut out)
            .map_err(|e| {
                if out.text.len() >= max_bytes {
                    minijinja::Error::new(
                        minijinja::ErrorKind::InvalidOperation,
                        format!(
                            "it renders to more than {max_bytes} bytes (limits.max_prompt_bytes)"
                        ),
                    )
                } else {
                    e
                }
            })?;
        Ok(String::from_utf8_lossy(&out.text).into_owned())
    }
}

/// A writer that refuses to hold more than `max` bytes.
struct Capped {
    text: Vec<u8>,
    max: usize,
}

impl std::io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.text.len() + buf.len() > self.max {
            let room = self.max - self.text.len();
            self.text.extend_from_slice(&buf[..room]);
            return Err(std::io::Error::other("the prompt limit is reached"));
        }
        self.text.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Default for ChecksConfig {
    fn default() -> Self {
        Self {
            max_rounds: max_rounds_default(),
            output_chars: output_chars_default(),
            from_repository: false,
            named: BTreeMap::new(),
            from_calls: false,
            fix_prompt: fix_prompt_default(),
        }
    }
}

/// Bounds on inputs and on what the gateway keeps. None may be zero.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Largest prompt accepted, in bytes.
    #[schemars(range(min = 1))]
    pub max_prompt_bytes: u32,
    /// Most task ids one `wait_for_task` call may name.
    #[schemars(range(min = 1))]
    pub max_wait_ids: u32,
    /// Most characters of result text returned by one `get_task_result` call; pass `offset` to page.
    #[schemars(range(min = 1))]
    pub result_page_chars: u32,
    /// Most unfinished tasks at once (pending, running or waiting for a permission). Finished
    /// tasks do not count: they stay answerable from the state directory for `finished_task_ttl`.
    #[schemars(range(min = 1))]
    pub max_tasks: u32,
    /// Most tasks that wait for a slot when every slot they could run in is taken: a start
    /// then answers at once with status `queued` and its place, and the task starts first in,
    /// first out as slots free. 0 (the default): such a start is refused (`limit_exceeded`).
    #[serde(default)]
    #[schemars(range(max = MAX_QUEUE))]
    pub queue: u32,
    /// How long an OpenCode (a worker's, or a managed one on this machine) keeps running its
    /// unfinished tasks after this gateway exits cleanly (a host's reconnect or update ends the
    /// gateway): the next gateway on the same state directory takes them over. Once it passes
    /// with no gateway back, that OpenCode is stopped. 0: stop it at exit, as one without
    /// unfinished tasks is. At most 1 day.
    #[serde(default = "linger_default")]
    pub linger: HumanDuration,
    /// How long a finished task stays answerable (its record is then deleted).
    pub finished_task_ttl: HumanDuration,
    /// How long a finished task stays in memory after it finished or was last used; then only
    /// its record in the state directory answers for it (read back by id when asked for). A
    /// longer value than `finished_task_ttl` acts as that.
    pub finished_in_memory: HumanDuration,
    /// Characters of streamed text shown as the tail in progress reports.
    #[schemars(range(min = 1))]
    pub progress_tail_chars: u32,
    /// Most characters of a task's final text the gateway keeps (memory and state files stay
    /// bounded); a longer answer is cut and the result says so (`text_capped`).
    #[schemars(range(min = 1))]
    pub max_result_chars: u32,
    /// How many times a task started with an `output_schema` is continued automatically when
    /// its answer does not match the schema (each correction is one more turn in the same
    /// session, sent the validation errors). 0: never; the mismatch is reported at once.
    #[schemars(range(max = MAX_STRUCTURED_RETRIES))]
    pub structured_retries: u32,
    /// Most USD one turn of a task may cost (every step, subagents and compaction included, as
    /// OpenCode reports it while the turn streams); past it the turn is aborted and the task
    /// ends `failed` (`BudgetExceeded`), its partial answer kept. Unset: no cap. A tier's
    /// `max_cost_usd` and a call's `budget` can only lower it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_usd: Option<f64>,
    /// Most tokens one turn may use (input, output, reasoning, cache reads and writes, summed the
    /// same way). Unset: no cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Most USD the tasks of one UTC day may cost together: once the day's recorded spend
    /// reaches it, new tasks are refused (`budget_exceeded`) until midnight UTC; running tasks
    /// finish. Unset: no cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_usd_per_day: Option<f64>,
}

/// Largest `limits.queue` accepted (queued tasks are held in memory and on disk).
pub const MAX_QUEUE: u32 = 10_000;

/// Largest cap in USD accepted anywhere (a guard against a typo, not a policy).
pub const MAX_COST_USD: f64 = 1_000_000.0;
/// Largest token cap accepted anywhere.
pub const MAX_TOKENS: u64 = 1_000_000_000_000;

/// Caps on what one turn of a task may spend (see `limits.max_cost_usd`); unset: no cap.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    // The names say what each is (in USD, in tokens): every word of an input schema is read by
    // the host's model on every request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_usd: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
}

impl Budget {
    /// A cap in USD the configuration and a call may set: positive, finite, at most
    /// [`MAX_COST_USD`] (0 would stop every turn at its first step; unset means no cap).
    pub fn cost_cap_ok(usd: f64) -> bool {
        usd.is_finite() && usd > 0.0 && usd <= MAX_COST_USD
    }

    /// A cap in tokens the configuration and a call may set: above 0, at most [`MAX_TOKENS`].
    pub fn token_cap_ok(tokens: u64) -> bool {
        tokens > 0 && tokens <= MAX_TOKENS
    }

    /// The lower of each cap.
    pub fn tightest(self, other: Budget) -> Budget {
        fn lower<T: PartialOrd>(a: Option<T>, b: Option<T>) -> Option<T> {
            match (a, b) {
                (Some(a), Some(b)) => Some(if b < a { b } else { a }),
                (a, b) => a.or(b),
            }
        }
        Budget {
            max_cost_usd: lower(self.max_cost_usd, other.max_cost_usd),
            max_tokens: lower(self.max_tokens, other.max_tokens),
        }
    }

    /// No cap at all.
    pub fn is_unlimited(&self) -> bool {
        self.max_cost_usd.is_none() && self.max_tokens.is_none()
    }

    /// What spending `cost` USD and `tokens` tokens passed, if it passed a cap: "cost $X of
    /// max_cost_usd $Y" and/or "N tokens of max_tokens M".
    pub fn passed_by(&self, cost: f64, tokens: u64) -> Option<String> {
        let mut over = Vec::new();
        if let Some(cap) = self.max_cost_usd.filter(|cap| cost > *cap) {
            over.push(format!("it cost ${cost:.4}, above max_cost_usd ${cap}"));
        }
        if let Some(cap) = self.max_tokens.filter(|cap| tokens > *cap) {
            over.push(format!("it used {tokens} tokens, above max_tokens {cap}"));
        }
        (!over.is_empty()).then(|| over.join(", and "))
    }
}

/// The most automatic corrections `limits.structured_retries` allows: each is a full model turn.
pub const MAX_STRUCTURED_RETRIES: u32 = 5;

/// The `hosts` entry that serves every host without one of its own.
pub const DEFAULT_HOST: &str = "default";

/// Used only if `hosts.default` were missing, which validation refuses.
const FALLBACK_RESULT_CHARS: u32 = 20_000;

/// The fewest characters a host's result budget may be: a result's fields besides the answer
/// take up to a few thousand.
pub const MIN_RESULT_CHARS: u32 = 4_000;

/// What one MCP host can take. Hosts differ: Claude Code moves a tool result over 50,000
/// characters into a file and shows its model a 2 KB preview; Codex keeps about 12,000
/// characters of each result; most hosts end a tool call that runs past 60 s.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HostConfig {
    /// Most characters of one tool result as the host shows it to its model (the whole JSON
    /// text, not just the answer in it). Long answers are paged to fit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = MIN_RESULT_CHARS))]
    pub result_chars: Option<u32>,
    /// How the host measures `result_chars`: `bytes` (UTF-8, as Codex cuts; never more than
    /// the other, so safe for any host) or `utf16` (a JavaScript string's length, as Claude
    /// Code measures: non-ASCII answers then get pages up to three times larger).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<LengthUnit>,
    /// The longest `wait_for_task` call the host lets run (its tool-call timeout, less a
    /// margin); a longer `timeout_ms` is shortened to it. At most `timeouts.wait_max`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_max: Option<HumanDuration>,
}

/// How a host measures the length of a tool result.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LengthUnit {
    /// UTF-8 bytes.
    #[default]
    Bytes,
    /// UTF-16 code units (JavaScript's `string.length`).
    Utf16,
}

impl LengthUnit {
    /// The length of `c` in this unit.
    pub fn of_char(self, c: char) -> usize {
        match self {
            LengthUnit::Bytes => c.len_utf8(),
            LengthUnit::Utf16 => c.len_utf16(),
        }
    }

    /// The length of `text` in this unit.
    pub fn of(self, text: &str) -> usize {
        match self {
            LengthUnit::Bytes => text.len(),
            LengthUnit::Utf16 => text.encode_utf16().count(),
        }
    }
}

/// The limits in force for one host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostLimits {
    pub result_chars: u32,
    /// The unit `result_chars` is counted in.
    pub count: LengthUnit,
    pub wait_max: std::time::Duration,
}

/// A tier of models and the difficulty of work it should take.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Tier {
    /// Name used as `tier` in `opencode_start_task` (e.g. `fast`); unique among tiers.
    #[schemars(length(min = 1))]
    pub name: String,
    /// The kind of work this tier handles, in words the host model reads.
    #[schemars(length(min = 1))]
    pub handles: String,
    /// Candidate models as exact `provider/model` ids (e.g. `openrouter/qwen/qwen3-coder`); the
    /// first one the server offers wins. Empty means "the server's default model".
    #[serde(default)]
    #[schemars(inner(regex(pattern = MODEL_ID_PATTERN)))]
    pub models: Vec<String>,
    /// Most USD one turn of this tier's tasks may cost; lowers `limits.max_cost_usd`, never
    /// raises it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_usd: Option<f64>,
    /// Most tokens one turn of this tier's tasks may use; lowers `limits.max_tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// The variant of the tier's model to run (its reasoning effort, e.g. `high`), as the
    /// model's provider config names them; checked against the model's variants on the server
    /// when a task starts (and by `doctor`). A tier naming one must list `models`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub variant: Option<String>,
    /// Commands that must succeed in a task's directory after each turn of this tier's tasks
    /// (e.g. `cargo test -q`); a failing one gets fix rounds (`checks`). A repository's file
    /// may set this only where your own file allows it (`checks.from_repository`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(length(min = 1)))]
    pub checks: Vec<String>,
    /// Another tier whose model takes over, in the same session, when this tier's checks still
    /// fail after the fix rounds, or its model fails with a provider error OpenCode's own
    /// retries did not clear (rate limit, overload, server error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub escalate_to: Option<String>,
    /// Models (`provider/model`) tried in order, in the same session, when this tier's model
    /// fails with a provider error OpenCode's own retries did not clear; then `escalate_to`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(regex(pattern = MODEL_ID_PATTERN)))]
    pub fallback_models: Vec<String>,
    /// `off`: this tier's tasks run unconfined (their commands and checks as you, see
    /// `sandbox`), here and on workers, while `sandbox.mode` is on. `on` (the default) follows
    /// `sandbox.mode`. Only your own file can set it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxMode>,
}

impl Tier {
    /// This tier's own caps.
    pub fn budget(&self) -> Budget {
        Budget {
            max_cost_usd: self.max_cost_usd,
            max_tokens: self.max_tokens,
        }
    }
}

impl Limits {
    /// The gateway-wide caps of one turn.
    pub fn budget(&self) -> Budget {
        Budget {
            max_cost_usd: self.max_cost_usd,
            max_tokens: self.max_tokens,
        }
    }
}

/// One tool in the MCP tool set.
///
/// Besides binding a name to an action, an entry can make the tool a *preset*: any other key
/// fixes that argument of the action (`tier: fast`, `isolation: worktree`, `mode: any`), which then
/// disappears from the tool's input schema; and for actions that take a `prompt`, `arguments` and
/// a `prompt` template replace the free-form prompt with declared arguments. Every other key is
/// checked when the file loads: it must be an argument of the action, with a value the action
/// accepts (a misspelt setting is reported with the arguments the action does take).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ToolConfig {
    /// The action this tool performs.
    pub action: Action,
    /// The description the host model reads: what the tool does, when to use it, what it returns.
    /// `{{tool:<action>}}` becomes the name of the enabled tool bound to that action.
    #[schemars(length(min = 1))]
    pub description: String,
    /// Disabled tools are absent from `tools/list` and cannot be called.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Optional human-readable title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Keep this tool in every request a host sends its model, also in hosts that otherwise
    /// defer tools behind a tool search (Claude Code; `_meta` `anthropic/alwaysLoad`). Meant for
    /// the tools one delegation needs: each always-loaded tool costs its description and schema
    /// on every request, a deferred one a search call once per session.
    #[serde(default)]
    pub always_load: bool,
    /// Words a host's tool search finds this tool by (`_meta` `anthropic/searchHint`): what a
    /// model would look for when it needs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub search_hint: Option<String>,
    /// Preset tools: the arguments the host fills in, each a string used as `{{name}}` in
    /// `prompt`. A list: a layer that sets it replaces the whole list.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub arguments: Vec<PromptArgument>,
    /// Preset tools: the template (MiniJinja: `{{name}}`, `{% if name %}...{% endif %}`) rendered
    /// from `arguments` into the action's `prompt`. An optional argument left out renders as
    /// nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub prompt: Option<String>,
    /// Every other key: an argument of the action fixed to this value (e.g. `tier: fast`).
    #[serde(flatten)]
    pub fixed: BTreeMap<String, serde_json::Value>,
}

impl ToolConfig {
    /// Whether the entry changes the action's arguments (a preset) rather than only naming it.
    pub fn is_preset(&self) -> bool {
        self.prompt.is_some() || !self.arguments.is_empty() || !self.fixed.is_empty()
    }
}

fn default_true() -> bool {
    true
}

/// The actions the gateway implements. Tools are bound to these by name in `tools`; one action may
/// back several tools (aliases).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Start (or reuse) an OpenCode server.
    StartServer,
    /// Stop a managed OpenCode server.
    StopServer,
    /// List the agents a server offers.
    ListAgents,
    /// Start a delegated task (a new OpenCode session) and return its id at once.
    StartTask,
    /// Send a follow-up prompt to a task's session.
    ContinueTask,
    /// Abort a running task.
    CancelTask,
    /// Report a task's status (and optionally its progress).
    GetTaskStatus,
    /// Return a finished task's full output, paged.
    GetTaskResult,
    /// Long-poll one or more tasks until all or any finish, or the wait times out.
    WaitForTask,
    /// Answer the permission a task is waiting on (once, always, or reject).
    ReplyPermission,
    /// Merge a worktree task's change into the tree it was branched from.
    ApplyTask,
    /// Remove a worktree task's worktree and branch.
    DiscardTask,
    /// Report tokens, cost and the saving over a reference price, per tier and model.
    Usage,
    /// List the stored tasks, newest first.
    ListTasks,
    /// Send one prompt to several tiers or models at once; the tasks form one group.
    FanOut,
}

impl Action {
    /// Every action, in the order tools are documented.
    pub const ALL: [Action; 15] = [
        Action::StartServer,
        Action::StopServer,
        Action::ListAgents,
        Action::StartTask,
        Action::ContinueTask,
        Action::CancelTask,
        Action::GetTaskStatus,
        Action::GetTaskResult,
        Action::WaitForTask,
        Action::ReplyPermission,
        Action::ApplyTask,
        Action::DiscardTask,
        Action::Usage,
        Action::ListTasks,
        Action::FanOut,
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
            Action::ReplyPermission => "reply_permission",
            Action::ApplyTask => "apply_task",
            Action::DiscardTask => "discard_task",
            Action::Usage => "usage",
            Action::ListTasks => "list_tasks",
            Action::FanOut => "fan_out",
        }
    }
}

/// A prompt offered to the host. The template is plain text with `{{name}}` placeholders: each
/// declared argument, plus `{{tiers}}` (a rendered list of the configured tiers) and
/// `{{tool:<action>}}` (the name of the enabled tool bound to that action).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromptConfig {
    /// What the prompt is for.
    #[schemars(length(min = 1))]
    pub description: String,
    /// Arguments the host fills in. A list: a layer that sets it replaces the whole list.
    #[serde(default)]
    pub arguments: Vec<PromptArgument>,
    /// The message text, with `{{argument}}`, `{{tiers}}` and `{{tool:<action>}}` placeholders.
    #[schemars(length(min = 1))]
    pub template: String,
}

/// One argument of a prompt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromptArgument {
    /// The argument's name, used as `{{name}}` in the template (letters, digits, `_`, `-`; not
    /// `tiers`, which the gateway fills in itself).
    #[schemars(regex(pattern = ARGUMENT_NAME_PATTERN))]
    pub name: String,
    /// What the host should put here.
    #[schemars(length(min = 1))]
    pub description: String,
    /// Whether the host must supply it. Optional arguments left out render as empty text.
    #[serde(default)]
    pub required: bool,
}

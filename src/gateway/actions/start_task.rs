//! `start_task`: delegate work to an OpenCode agent. It creates a session, sends the prompt and
//! returns at once with the task's id and status `pending`; the work runs in the background.
//!
//! `model` and `tier` are alternatives: an exact `provider/model`, or a configured tier that the
//! service resolves against the models the server offers. Giving both is an error rather than a
//! silent preference for one of them.

use rmcp::model::{JsonObject, ToolAnnotations};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use super::{checks, ActionSpec, Ctx};
use crate::config::{Budget, Config, Isolation};
use crate::gateway::error::ToolError;
use crate::gateway::schema::{property, require_first};
use crate::git::Base;
use crate::tasks::{self, Detail, TaskSnapshot};

/// Arguments of `start_task`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Args {
    /// `default` (started on first use), or a start server tool's id.
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub server_id: String,
    /// Self-contained: goal, files, constraints, how to check. The agent sees nothing else.
    #[schemars(length(min = 1))]
    pub prompt: String,
    /// OpenCode agent (list agents tool).
    #[schemars(length(min = 1))]
    pub agent: Option<String>,
    /// Exact `provider/model`, instead of `tier`.
    #[schemars(length(min = 1))]
    pub model: Option<String>,
    /// The cheapest tier that can do the job (see the delegate_task prompt).
    #[schemars(length(min = 1))]
    pub tier: Option<String>,
    /// Model variant, e.g. effort `high`.
    #[schemars(length(min = 1))]
    pub variant: Option<String>,
    /// Absolute path to work in.
    #[schemars(length(min = 1))]
    pub directory: Option<String>,
    /// `worktree`: its own git worktree, so parallel edits never collide.
    pub isolation: Option<Isolation>,
    /// A worktree's start: `working_tree` (HEAD plus your uncommitted changes) or `head`.
    pub base: Option<Base>,
    /// Short title.
    #[schemars(length(min = 1))]
    pub title: Option<String>,
    /// A retry with the same key and arguments returns the first call's task.
    #[schemars(length(min = 1, max = 128))]
    pub idempotency_key: Option<String>,
    /// JSON Schema of a structured answer: checked, corrected, returned as `structured`.
    pub output_schema: Option<serde_json::Map<String, Value>>,
    /// Spend caps per turn.
    pub budget: Option<Budget>,
    /// Commands that must pass after each turn, e.g. `cargo test -q`.
    pub checks: Option<Vec<String>>,
    /// Machine to run on; remote ones get a worktree.
    #[schemars(length(min = 1))]
    pub worker: Option<String>,
    /// `full`: also model, tokens, cost.
    #[serde(default)]
    pub detail: Detail,
}

/// The `start_task` action.
pub struct StartTask;

impl ActionSpec for StartTask {
    type Args = Args;
    type Output = TaskSnapshot;
    const TITLE: &'static str = "Start a delegated task";

    /// Destructive: the agent runs with the permissions of the managed server (by default it may
    /// run any shell command and edit or delete any file in the directory), so the call can
    /// overwrite work; a host that gates destructive tools should gate this one. Not idempotent:
    /// each call starts another session doing the work again, unless it carries an
    /// `idempotency_key`. Open world: the agent talks to an LLM provider and may use web tools.
    fn annotations() -> ToolAnnotations {
        ToolAnnotations::new()
            .read_only(false)
            .destructive(true)
            .idempotent(false)
            .open_world(true)
    }

    fn refine_input_schema(config: &Config, schema: &mut JsonObject) {
        require_first(schema, "server_id");
        refine_prompt(config, schema);
        refine_tier(config, schema);
        refine_worker(config, schema);
        refine_checks(config, schema);
    }
}

/// Offers `checks` as the user's file allows it: the names of `checks.named` as its values, or
/// commands of the call's own where `checks.from_calls` is on (naming the named ones too), and
/// leaves it out where neither is there (nothing a call could pass would be taken).
pub(super) fn refine_checks(config: &Config, schema: &mut JsonObject) {
    let named: Vec<Value> = config
        .checks
        .named
        .keys()
        .map(|k| Value::String(k.clone()))
        .collect();
    if named.is_empty() && !config.checks.from_calls {
        if let Some(Value::Object(properties)) = schema.get_mut("properties") {
            properties.remove("checks");
        }
        return;
    }
    let Some(checks) = property(schema, "checks") else {
        return;
    };
    if config.checks.from_calls {
        if !named.is_empty() {
            if let Some(Value::String(d)) = checks.get_mut("description") {
                let names: Vec<&str> = named.iter().filter_map(Value::as_str).collect();
                d.push_str(&format!(" Named: {}.", names.join(", ")));
            }
        }
        return;
    }
    if let Some(Value::String(d)) = checks.get_mut("description") {
        *d = "Checks that must pass after each turn, by name.".into();
    }
    // `checks` is `["array", "null"]` of strings: its items become the names.
    if let Some(Value::Object(items)) = checks.get_mut("items") {
        items.insert("enum".into(), Value::Array(named));
    }
}

/// Lists the workers as the allowed values of `worker`, and leaves the argument out while the
/// user declares no remote worker (every task then runs here, and the hosts' context is not
/// spent on an argument that has one value).
pub(super) fn refine_worker(config: &Config, schema: &mut JsonObject) {
    let workers = crate::workers::from_config(config);
    if workers.iter().all(|w| w.remote.is_none()) {
        if let Some(Value::Object(properties)) = schema.get_mut("properties") {
            properties.remove("worker");
        }
        return;
    }
    if let Some(worker) = property(schema, "worker") {
        let names: Vec<Value> = workers.into_iter().map(|w| Value::String(w.name)).collect();
        worker.insert("enum".into(), Value::Array(names));
    }
}

/// States the byte limit on `prompt` (JSON Schema's `maxLength` counts characters, not bytes).
pub(super) fn refine_prompt(config: &Config, schema: &mut JsonObject) {
    if let Some(Value::String(d)) =
        property(schema, "prompt").and_then(|p| p.get_mut("description"))
    {
        d.push_str(&format!(
            " At most {} bytes.",
            config.limits.max_prompt_bytes
        ));
    }
}

/// Lists the configured tiers as the allowed values of `tier`.
fn refine_tier(config: &Config, schema: &mut JsonObject) {
    if let Some(tier) = property(schema, "tier") {
        let names: Vec<Value> = config
            .tiers
            .iter()
            .map(|t| Value::String(t.name.clone()))
            .collect();
        tier.insert("enum".into(), Value::Array(names));
    }
}

/// The name that stands for "the gateway's own server" in place of a `server_id`.
pub const DEFAULT_SERVER: &str = "default";

/// Resolves `default` (and a `server_id` left out, which hosts that skip optional-looking
/// arguments send) to the server for the gateway's directory, starting it on first use; the
/// two-call cycle (start, wait) needs no start server call.
pub(super) async fn server_id(given: String, ctx: &Ctx<'_>) -> Result<String, ToolError> {
    let given = given.trim();
    if given.is_empty() || given == DEFAULT_SERVER {
        return Ok(ctx.tasks.start_server(None, None).await?.server_id);
    }
    checks::required_name("server_id", given.to_string())
}

pub(super) async fn run(args: Args, ctx: &Ctx<'_>) -> Result<TaskSnapshot, ToolError> {
    if args.model.is_some() && args.tier.is_some() {
        return Err(ToolError::invalid_argument(
            "`model` and `tier` are mutually exclusive: pass an exact `model` or a `tier`, not both",
        ));
    }
    // Everything is checked before a `default` server is started for the call.
    let prompt = checks::prompt("prompt", args.prompt, ctx.config)?;
    let agent = checks::optional_name("agent", args.agent)?;
    let model = checks::model("model", args.model)?;
    let tier = checks::tier("tier", args.tier, ctx.config)?;
    let directory = checks::directory("directory", args.directory)?;
    let title = checks::title("title", args.title)?;
    let idempotency_key = checks::idempotency_key(
        "idempotency_key",
        args.idempotency_key,
        checks::MAX_KEY_CHARS,
    )?;
    let output_schema = checks::output_schema(args.output_schema)?;
    let budget = checks::budget("budget", args.budget)?;
    let variant = checks::optional_name("variant", args.variant)?;
    let worker = checks::optional_name("worker", args.worker)?;
    // A remote worker runs tasks in a worktree of their own there: that is the default for
    // them, whatever isolation is configured for this machine.
    let remote = worker
        .as_deref()
        .is_some_and(|w| w != crate::config::LOCAL_WORKER);
    let isolation = match (args.isolation, remote) {
        (None, true) => Some(Isolation::Worktree),
        (given, _) => given,
    };
    let (isolation, base) = checks::isolation(isolation, args.base, ctx.config)?;
    let request = tasks::StartTask {
        server_id: server_id(args.server_id, ctx).await?,
        prompt,
        agent,
        model,
        tier,
        directory,
        title,
        idempotency_key,
        isolation,
        base,
        group: None,
        output_schema,
        budget,
        variant,
        worker,
        checks: args.checks.unwrap_or_default(),
    };
    Ok(ctx.tasks.start(request).await?.with_detail(args.detail))
}

//! `fan_out`: one prompt to several tiers or models at once, for a second opinion (a review by
//! two models that did not write the code) or to compare what the tiers make of the same work.
//!
//! Each target gets a task of its own, exactly as `start_task` would start it, and all of them
//! share a group id. The wait tool takes the group id in place of the task ids, and every task
//! of a group shows its model, tokens and cost even in lean results, so the answers arrive side
//! by side with what each cost. The starts run concurrently (each may make a worktree); if any
//! fails, the ones that started are cancelled and the error is returned: a half-started
//! comparison is not what was asked for.

use std::collections::HashSet;

use rmcp::model::{JsonObject, ToolAnnotations};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::start_task::{refine_prompt, server_id, StartTask};
use super::{checks, ActionSpec, Ctx};
use crate::config::{Budget, Config, Isolation};
use crate::gateway::error::ToolError;
use crate::gateway::schema::property;
use crate::git::Base;
use crate::tasks::{self, Detail, TaskSnapshot};

/// Most targets of one fan-out: each is a full agent run, paid for.
pub const MAX_TARGETS: usize = 8;

/// Arguments of `fan_out`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Args {
    /// `default`, or a start server tool's id.
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub server_id: String,
    /// The self-contained task every target gets.
    #[schemars(length(min = 1))]
    pub prompt: String,
    /// Tiers to ask, each once; or `models`.
    pub tiers: Option<Vec<String>>,
    /// `provider/model`s to ask, each once.
    pub models: Option<Vec<String>>,
    /// OpenCode agent. Default: the server's.
    #[schemars(length(min = 1))]
    pub agent: Option<String>,
    /// Absolute path to work in.
    #[schemars(length(min = 1))]
    pub directory: Option<String>,
    /// `worktree` each, or `none` (all in `directory`; for reviews).
    pub isolation: Option<Isolation>,
    /// A worktree's start.
    pub base: Option<Base>,
    /// Short title.
    #[schemars(length(min = 1))]
    pub title: Option<String>,
    /// A retry with the same key returns the first call's tasks.
    #[schemars(length(min = 1, max = 100))]
    pub idempotency_key: Option<String>,
    /// JSON Schema of each structured answer.
    pub output_schema: Option<serde_json::Map<String, Value>>,
    /// Spend caps per turn.
    pub budget: Option<Budget>,
    /// Commands each must pass.
    pub checks: Option<Vec<String>>,
    /// `full` adds ids, model, tokens, cost.
    #[serde(default)]
    pub detail: Detail,
}

/// What `fan_out` returns: the group and its tasks, in the order of the targets.
#[derive(Debug, Serialize, JsonSchema)]
pub struct FanOutResult {
    /// Pass to the wait tool (`task_ids: [group_id]`) to wait for every answer.
    pub group_id: String,
    /// The tasks, one per target, in the order given.
    pub task_ids: Vec<String>,
    pub tasks: Vec<TaskSnapshot>,
}

/// The `fan_out` action.
pub struct FanOut;

impl ActionSpec for FanOut {
    type Args = Args;
    type Output = FanOutResult;
    const TITLE: &'static str = "Ask several tiers or models at once";

    /// As `start_task`, several times over.
    fn annotations() -> ToolAnnotations {
        <StartTask as ActionSpec>::annotations()
    }

    fn refine_input_schema(config: &Config, schema: &mut JsonObject) {
        refine_prompt(config, schema);
        super::start_task::refine_checks(config, schema);
        let names: Vec<Value> = config
            .tiers
            .iter()
            .map(|t| Value::String(t.name.clone()))
            .collect();
        if let Some(tiers) = property(schema, "tiers") {
            tiers.insert("minItems".into(), 2.into());
            tiers.insert("maxItems".into(), MAX_TARGETS.into());
            tiers.insert("uniqueItems".into(), true.into());
            if let Some(Value::Object(items)) = tiers.get_mut("items") {
                items.insert("enum".into(), Value::Array(names));
            }
        }
        if let Some(models) = property(schema, "models") {
            models.insert("minItems".into(), 2.into());
            models.insert("maxItems".into(), MAX_TARGETS.into());
            models.insert("uniqueItems".into(), true.into());
        }
    }
}

/// One target: a tier or an exact model.
#[derive(Debug, Clone, PartialEq)]
enum Target {
    Tier(String),
    Model(String),
}

impl Target {
    fn name(&self) -> &str {
        match self {
            Target::Tier(name) | Target::Model(name) => name,
        }
    }
}

fn targets(args: &mut Args, config: &Config) -> Result<Vec<Target>, ToolError> {
    let (field, list) =
        match (args.tiers.take(), args.models.take()) {
            (Some(_), Some(_)) => return Err(ToolError::invalid_argument(
                "`tiers` and `models` are mutually exclusive: ask tiers or exact models, not both",
            )),
            (None, None) => return Err(ToolError::invalid_argument(
                "give `tiers` (configured tier names) or `models` (`provider/model` ids) to ask",
            )),
            (Some(tiers), None) => ("tiers", tiers),
            (None, Some(models)) => ("models", models),
        };
    if !(2..=MAX_TARGETS).contains(&list.len()) {
        return Err(ToolError::invalid_argument(format!(
            "`{field}` names {} targets; a fan-out asks 2 to {MAX_TARGETS} (one target is \
             start_task)",
            list.len()
        )));
    }
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(list.len());
    for (i, name) in list.into_iter().enumerate() {
        let key = format!("{field}[{i}]");
        let target = if field == "tiers" {
            checks::tier(&key, Some(name), config)?.map(Target::Tier)
        } else {
            checks::model(&key, Some(name))?.map(Target::Model)
        };
        let Some(target) = target else {
            continue;
        };
        if !seen.insert(target.name().to_string()) {
            return Err(ToolError::invalid_argument(format!(
                "`{key}` repeats `{}`; each target is asked once",
                target.name()
            )));
        }
        out.push(target);
    }
    Ok(out)
}

pub(super) async fn run(mut args: Args, ctx: &Ctx<'_>) -> Result<FanOutResult, ToolError> {
    let targets = targets(&mut args, ctx.config)?;
    let prompt = checks::prompt("prompt", args.prompt, ctx.config)?;
    let agent = checks::optional_name("agent", args.agent)?;
    let directory = checks::directory("directory", args.directory)?;
    let title = checks::title("title", args.title)?;
    let idempotency_key = checks::idempotency_key(
        "idempotency_key",
        args.idempotency_key,
        checks::MAX_GROUP_KEY_CHARS,
    )?;
    let output_schema = checks::output_schema(args.output_schema)?;
    let budget = checks::budget("budget", args.budget)?;
    let (isolation, base) = checks::isolation(args.isolation, args.base, ctx.config)?;
    let server_id = server_id(args.server_id, ctx).await?;
    // The group takes its room first, all of it or none, and hands one slot to each start.
    // (A retry with a key may start nothing new: its starts each take their own.)
    let mut room = match idempotency_key {
        // No room for all of them: each start takes its own, or is queued when the user
        // allows a queue.
        None => match ctx.tasks.reserve(None, isolation, None, targets.len()) {
            Ok(room) => Some(room),
            Err(tasks::TaskError::LimitExceeded(_)) if ctx.config.limits.queue > 0 => None,
            Err(e) => return Err(e.into()),
        },
        Some(_) => None,
    };
    let checks = args.checks.clone().unwrap_or_default();
    let group = crate::ids::group_id();
    let requests = targets.iter().zip(0u32..).map(|(target, index)| {
        let (model, tier) = match target {
            Target::Tier(t) => (None, Some(t.clone())),
            Target::Model(m) => (Some(m.clone()), None),
        };
        tasks::StartTask {
            server_id: server_id.clone(),
            prompt: prompt.clone(),
            agent: agent.clone(),
            model,
            tier,
            directory: directory.clone(),
            title: Some(match &title {
                Some(t) => format!("{t} ({})", target.name()),
                None => format!("{} ({})", tasks::default_title(&prompt), target.name()),
            }),
            // One key per target, so a retry finds each task again.
            idempotency_key: idempotency_key
                .as_ref()
                .map(|k| format!("{k}/{}", target.name())),
            isolation,
            base,
            group: Some(tasks::GroupMember {
                id: group.clone(),
                index,
            }),
            output_schema: output_schema.clone(),
            budget,
            // Each target runs its tier's own variant.
            variant: None,
            worker: None,
            checks: checks.clone(),
        }
    });
    let starts: Vec<_> = requests
        .map(|r| {
            let slot = room
                .as_mut()
                .and_then(|r| (!r.is_empty()).then(|| r.remove(0)));
            ctx.tasks.start_with(r, slot)
        })
        .collect();
    let started = futures::future::join_all(starts).await;
    let mut tasks = Vec::with_capacity(started.len());
    let mut failure = None;
    for (target, result) in targets.iter().zip(started) {
        match result {
            Ok(snapshot) => tasks.push(snapshot),
            Err(e) => {
                failure.get_or_insert((target.name().to_string(), ToolError::from(e)));
            }
        }
    }
    if let Some((name, error)) = failure {
        for task in &tasks {
            if let Err(e) = ctx.tasks.cancel(&task.task_id).await {
                tracing::warn!(task = %task.task_id, "cannot cancel a fan-out task: {e}");
            }
            // A retry with the same key must start the whole group again.
            ctx.tasks.release_key(&task.task_id).await;
        }
        return Err(ToolError::new(
            error.code,
            format!(
                "fan-out to `{name}` failed, so the other {} started were cancelled: {}",
                tasks.len(),
                error.message
            ),
        ));
    }
    // A retried call (same idempotency key) returns the tasks of the first, with their group.
    let group_id = tasks
        .first()
        .and_then(|t| t.group_id.clone())
        .unwrap_or(group);
    Ok(FanOutResult {
        group_id,
        task_ids: tasks.iter().map(|t| t.task_id.clone()).collect(),
        tasks: tasks
            .into_iter()
            .map(|t| t.with_detail(args.detail))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(tiers: Option<Vec<&str>>, models: Option<Vec<&str>>) -> Args {
        let list = |l: Option<Vec<&str>>| l.map(|v| v.into_iter().map(String::from).collect());
        Args {
            server_id: String::new(),
            prompt: "p".into(),
            tiers: list(tiers),
            models: list(models),
            agent: None,
            directory: None,
            isolation: None,
            base: None,
            title: None,
            idempotency_key: None,
            output_schema: None,
            budget: None,
            checks: None,
            detail: Detail::Lean,
        }
    }

    #[test]
    fn targets_are_tiers_or_models_two_to_eight_each_once() {
        let config = crate::gateway::test_config();
        let got = targets(&mut args(Some(vec!["fast", "strong"]), None), &config);
        assert_eq!(
            got.expect("valid"),
            vec![Target::Tier("fast".into()), Target::Tier("strong".into())]
        );
        let err = |tiers, models| {
            targets(&mut args(tiers, models), &config)
                .expect_err("refused")
                .message
        };
        assert!(err(Some(vec!["fast"]), Some(vec!["a/b", "c/d"])).contains("mutually exclusive"));
        assert!(err(None, None).contains("give `tiers`"));
        assert!(err(Some(vec!["fast"]), None).contains("2 to 8"));
        assert!(err(Some(vec!["fast", "fast"]), None).contains("`tiers[1]` repeats"));
        assert!(err(Some(vec!["fast", "nope"]), None).contains("`tiers[1]` `nope`"));
        assert!(err(None, Some(vec!["a/b", "nomodel"])).contains("models[1]"));
        let nine = vec![
            "a/1", "a/2", "a/3", "a/4", "a/5", "a/6", "a/7", "a/8", "a/9",
        ];
        assert!(err(None, Some(nine)).contains("2 to 8"));
    }
}

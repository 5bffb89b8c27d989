//! Argument checks shared by several actions: the rules a JSON type cannot express.
//!
//! Every error names the argument, so the host model can fix its call without guessing (the
//! original accepted empty prompts, negative timeouts and unbounded id lists).

use std::path::Path;

use crate::config::{Budget, Config, Isolation, MAX_COST_USD, MAX_TOKENS};
use crate::gateway::error::ToolError;
use crate::git::Base;

/// An id or name: surrounding whitespace is dropped, and nothing may remain empty.
pub fn required_name(field: &str, value: String) -> Result<String, ToolError> {
    let trimmed = value.trim();
    if trimmed.is_empty() {
        return Err(ToolError::invalid_argument(format!(
            "`{field}` must not be empty"
        )));
    }
    Ok(trimmed.to_string())
}

/// An optional id or name: absent is fine, given-but-blank is an error.
pub fn optional_name(field: &str, value: Option<String>) -> Result<Option<String>, ToolError> {
    value.map(|v| required_name(field, v)).transpose()
}

/// Longest `title` accepted: it is shown in every status and list, and stored with the task.
pub const MAX_TITLE_CHARS: usize = 200;
/// Longest `idempotency_key` of a start; a fan-out's is shorter, as each of its tasks' keys is
/// it plus `/<tier or model>`.
pub const MAX_KEY_CHARS: usize = 128;
pub const MAX_GROUP_KEY_CHARS: usize = 100;

/// An optional name of at most `max` characters.
fn bounded_name(
    field: &str,
    value: Option<String>,
    max: usize,
) -> Result<Option<String>, ToolError> {
    let value = optional_name(field, value)?;
    if let Some(v) = &value {
        let chars = v.chars().count();
        if chars > max {
            return Err(ToolError::invalid_argument(format!(
                "`{field}` is {chars} characters long; at most {max} are accepted"
            )));
        }
    }
    Ok(value)
}

/// An optional task title (at most [`MAX_TITLE_CHARS`]).
pub fn title(field: &str, value: Option<String>) -> Result<Option<String>, ToolError> {
    bounded_name(field, value, MAX_TITLE_CHARS)
}

/// An optional idempotency key of at most `max` characters.
pub fn idempotency_key(
    field: &str,
    value: Option<String>,
    max: usize,
) -> Result<Option<String>, ToolError> {
    bounded_name(field, value, max)
}

/// A prompt: not blank, at most `limits.max_prompt_bytes` bytes. Kept as written.
pub fn prompt(field: &str, value: String, config: &Config) -> Result<String, ToolError> {
    if value.trim().is_empty() {
        return Err(ToolError::invalid_argument(format!(
            "`{field}` must not be empty: give the agent a self-contained task"
        )));
    }
    let max = config.limits.max_prompt_bytes as usize;
    if value.len() > max {
        return Err(ToolError::invalid_argument(format!(
            "`{field}` is {} bytes, more than the limit of {max} bytes (limits.max_prompt_bytes)",
            value.len()
        )));
    }
    Ok(value)
}

/// An optional absolute directory path.
pub fn directory(field: &str, value: Option<String>) -> Result<Option<String>, ToolError> {
    let Some(dir) = optional_name(field, value)? else {
        return Ok(None);
    };
    if !Path::new(&dir).is_absolute() {
        return Err(ToolError::invalid_argument(format!(
            "`{field}` must be an absolute path, got `{dir}`"
        )));
    }
    Ok(Some(dir))
}

/// An optional exact model id, `provider/model` (the model part may contain more `/`).
pub fn model(field: &str, value: Option<String>) -> Result<Option<String>, ToolError> {
    let Some(model) = optional_name(field, value)? else {
        return Ok(None);
    };
    let well_formed = !model.chars().any(char::is_whitespace)
        && model
            .split_once('/')
            .is_some_and(|(provider, id)| !provider.is_empty() && !id.is_empty());
    if !well_formed {
        return Err(ToolError::invalid_argument(format!(
            "`{field}` must be an exact model id of the form provider/model \
             (e.g. `anthropic/claude-sonnet-4`), got `{model}`"
        )));
    }
    Ok(Some(model))
}

/// An optional tier name, which must be one of the configured tiers.
pub fn tier(
    field: &str,
    value: Option<String>,
    config: &Config,
) -> Result<Option<String>, ToolError> {
    let Some(tier) = optional_name(field, value)? else {
        return Ok(None);
    };
    if config.tier(&tier).is_none() {
        let names: Vec<&str> = config.tiers.iter().map(|t| t.name.as_str()).collect();
        return Err(ToolError::invalid_argument(format!(
            "`{field}` `{tier}` is not a configured tier; the tiers are: {}",
            names.join(", ")
        )));
    }
    Ok(Some(tier))
}

/// A call's spending caps: each given one a positive, finite number within the bounds the
/// configuration also has (whether it lowers the caps in force is the service's check).
pub fn budget(field: &str, budget: Option<Budget>) -> Result<Budget, ToolError> {
    let budget = budget.unwrap_or_default();
    if let Some(v) = budget.max_cost_usd.filter(|v| !Budget::cost_cap_ok(*v)) {
        return Err(ToolError::invalid_argument(format!(
            "`{field}.max_cost_usd` must be an amount in USD above 0 and at most {MAX_COST_USD}, \
             found {v}"
        )));
    }
    if let Some(v) = budget.max_tokens.filter(|v| !Budget::token_cap_ok(*v)) {
        return Err(ToolError::invalid_argument(format!(
            "`{field}.max_tokens` must be a number of tokens above 0 and at most {MAX_TOKENS}, \
             found {v}"
        )));
    }
    Ok(budget)
}

/// Where a task works: `isolation` (default: the config's) and, for a worktree, its `base`
/// (default: the config's). A `base` without a worktree is refused rather than ignored.
pub fn isolation(
    isolation: Option<Isolation>,
    base: Option<Base>,
    config: &Config,
) -> Result<(Isolation, Base), ToolError> {
    let isolation = isolation.unwrap_or(config.isolation.mode);
    if isolation == Isolation::None && base.is_some() {
        return Err(ToolError::invalid_argument(
            "`base` applies to isolation `worktree` only; pass `isolation: \"worktree\"` with it, or leave `base` out",
        ));
    }
    Ok((isolation, base.unwrap_or(config.isolation.base)))
}

/// An `output_schema`, checked before any task is started with it.
pub fn output_schema(
    schema: Option<serde_json::Map<String, serde_json::Value>>,
) -> Result<Option<serde_json::Value>, ToolError> {
    let schema = schema.map(serde_json::Value::Object);
    if let Some(schema) = &schema {
        crate::tasks::checks::structured::check_schema(schema)
            .map_err(|e| ToolError::invalid_argument(e.to_string()))?;
    }
    Ok(schema)
}

/// The id of one task. A fan-out group id in its place is refused with the group's task ids, so
/// the host can pick the one it means (or wait on the group).
pub async fn single_task_id(
    field: &str,
    value: String,
    tasks: &crate::tasks::TaskService,
) -> Result<String, ToolError> {
    let id = required_name(field, value)?;
    if !id.starts_with(crate::ids::GROUP_PREFIX) {
        return Ok(id);
    }
    let members = tasks.expand_groups(vec![id.clone()]).await?;
    Err(ToolError::invalid_argument(format!(
        "`{field}` `{id}` is a fan-out group, not a task: this tool takes one of its tasks: {} \
         (the wait tool takes the group id, for every answer)",
        members.join(", ")
    )))
}

/// Milliseconds from a config duration, saturating (for schema bounds and comparisons).
pub fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_trimmed_and_not_blank() {
        assert_eq!(required_name("task_id", " tsk_1 ".into()).unwrap(), "tsk_1");
        let e = required_name("task_id", "  ".into()).unwrap_err();
        assert_eq!(e.message, "`task_id` must not be empty");
        assert_eq!(optional_name("agent", None).unwrap(), None);
        assert!(optional_name("agent", Some(String::new())).is_err());
    }

    #[test]
    fn models_need_provider_and_model() {
        for ok in ["a/b", "openrouter/qwen/qwen3-coder"] {
            assert!(model("model", Some(ok.into())).is_ok(), "{ok}");
        }
        for bad in ["gpt-4", "/b", "a/", "a /b"] {
            let e = model("model", Some(bad.into())).unwrap_err();
            assert!(e.message.starts_with("`model`"), "{}", e.message);
        }
    }

    #[test]
    fn directories_must_be_absolute() {
        assert!(directory("directory", Some("/tmp/x".into())).is_ok());
        let e = directory("directory", Some("rel/x".into())).unwrap_err();
        assert!(e.message.contains("absolute"), "{}", e.message);
    }
}

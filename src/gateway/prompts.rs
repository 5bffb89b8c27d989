//! Prompts from `config.prompts`: the detailed delegation guidance (which tier takes which work,
//! how to write a task prompt) lives here rather than in the server `instructions`, which Claude
//! Code cuts at 2,048 characters, and it is built from the configured tiers so that it never names
//! models a repository does not use.
//!
//! A template is plain text with `{{name}}` placeholders (the grammar is `config::template`'s, the
//! same one the config validation uses): each declared argument, and `{{tiers}}`, one line per tier.

use std::collections::BTreeMap;

use rmcp::model::{
    GetPromptRequestParams, GetPromptResult, Prompt, PromptArgument, PromptMessage, Role,
};
use rmcp::ErrorData as McpError;
use serde_json::{json, Value};

use crate::config::{Config, PromptConfig, Tier};

/// The prompts for `prompts/list`, in name order.
pub fn list(config: &Config) -> Vec<Prompt> {
    config
        .prompts
        .iter()
        .map(|(name, prompt)| {
            let arguments = prompt
                .arguments
                .iter()
                .map(|a| {
                    PromptArgument::new(a.name.clone())
                        .with_description(a.description.clone())
                        .with_required(a.required)
                })
                .collect();
            Prompt::new(
                name.clone(),
                Some(prompt.description.clone()),
                Some(arguments),
            )
        })
        .collect()
}

/// Renders a prompt for `prompts/get`. An unknown prompt, a missing (or blank) required argument
/// and an undeclared argument are `invalid_params` errors that name the culprit.
pub fn get(config: &Config, request: &GetPromptRequestParams) -> Result<GetPromptResult, McpError> {
    let Some(prompt) = config.prompts.get(&request.name) else {
        let names: Vec<&str> = config.prompts.keys().map(String::as_str).collect();
        return Err(McpError::invalid_params(
            format!(
                "unknown prompt `{}`; the prompts are: {}",
                request.name,
                names.join(", ")
            ),
            Some(json!({ "prompt": request.name })),
        ));
    };
    let args = arguments(&request.name, prompt, request.arguments.as_ref())?;
    let text = prompt.render(&args, &tiers_text(&config.tiers));
    Ok(
        GetPromptResult::new(vec![PromptMessage::new_text(Role::User, text)])
            .with_description(prompt.description.clone()),
    )
}

fn arguments(
    name: &str,
    prompt: &PromptConfig,
    given: Option<&serde_json::Map<String, Value>>,
) -> Result<BTreeMap<String, String>, McpError> {
    let mut args = BTreeMap::new();
    for (key, value) in given.into_iter().flatten() {
        if !prompt.arguments.iter().any(|a| &a.name == key) {
            let declared: Vec<&str> = prompt.arguments.iter().map(|a| a.name.as_str()).collect();
            return Err(McpError::invalid_params(
                format!(
                    "prompt `{name}` has no argument `{key}`; its arguments are: {}",
                    declared.join(", ")
                ),
                Some(json!({ "prompt": name, "argument": key })),
            ));
        }
        let text = match value {
            Value::Null => continue,
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        args.insert(key.clone(), text);
    }
    for arg in prompt.arguments.iter().filter(|a| a.required) {
        let present = args.get(&arg.name).is_some_and(|v| !v.trim().is_empty());
        if !present {
            return Err(McpError::invalid_params(
                format!(
                    "prompt `{name}` requires the argument `{}` ({})",
                    arg.name, arg.description
                ),
                Some(json!({ "prompt": name, "argument": arg.name })),
            ));
        }
    }
    Ok(args)
}

/// `- <name>: <handles> (models: a, b)`, one line per tier, cheapest first.
pub fn tiers_text(tiers: &[Tier]) -> String {
    tiers
        .iter()
        .map(|tier| {
            let models = if tier.models.is_empty() {
                "server default".to_string()
            } else {
                tier.models.join(", ")
            };
            format!("- {}: {} (models: {models})", tier.name, tier.handles)
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(name: &str, args: Value) -> GetPromptRequestParams {
        let mut r = GetPromptRequestParams::new(name);
        if let Value::Object(map) = args {
            r = r.with_arguments(map);
        }
        r
    }

    fn text(r: &GetPromptResult) -> String {
        let v = serde_json::to_value(&r.messages).unwrap_or_default();
        v[0]["content"]["text"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    #[test]
    fn tiers_render_one_line_each() {
        let tiers = vec![
            Tier {
                name: "fast".into(),
                handles: "renames".into(),
                models: vec![],
                ..Tier::default()
            },
            Tier {
                name: "strong".into(),
                handles: "reviews".into(),
                models: vec!["a/b".into(), "c/d".into()],
                ..Tier::default()
            },
        ];
        assert_eq!(
            tiers_text(&tiers),
            "- fast: renames (models: server default)\n- strong: reviews (models: a/b, c/d)"
        );
    }

    #[test]
    fn renders_delegate_task() {
        let config = crate::gateway::test_config();
        let r = get(
            &config,
            &request("delegate_task", json!({"task": "rename foo"})),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let t = text(&r);
        assert!(t.contains("The work: rename foo"), "{t}");
        assert!(t.contains(&tiers_text(&config.tiers)), "{t}");
        assert!(!t.contains("{{"), "{t}");
    }

    #[test]
    fn argument_errors_name_the_argument() {
        let config = crate::gateway::test_config();
        // `task` is optional: Claude Code may send nothing when the user typed nothing.
        let r =
            get(&config, &request("delegate_task", json!({}))).unwrap_or_else(|e| panic!("{e}"));
        assert!(text(&r).contains("The work: \n"), "{}", text(&r));
        let e = get(
            &config,
            &request("delegate_task", json!({"task": "x", "bogus": "y"})),
        )
        .unwrap_err();
        assert!(e.message.contains("`bogus`"), "{}", e.message);
        let e = get(&config, &request("nope", json!({}))).unwrap_err();
        assert!(e.message.contains("`nope`"), "{}", e.message);
    }
}

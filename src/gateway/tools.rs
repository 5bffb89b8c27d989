//! The tool table: which tools exist, as the config declares them.
//!
//! Code knows *actions*; `delegation.yaml` decides which tools exist, what they are called and how
//! they are described. Two things are built from the config:
//! - [`ToolTable`]: where each enabled tool's calls go (its action, and a preset tool's preset),
//!   kept for the life of the configuration and looked up on every call;
//! - [`list`]: the tools as `tools/list` shows them: name and description (and optional title)
//!   from the config, and from the action the input schema (refined with the config's limits
//!   and tiers), the output schema and the annotations, sorted by name so the list is stable
//!   whatever the config's order. It is built for each `tools/list` and not kept: the schemas
//!   come to about 800 KB as JSON values, which a gateway would otherwise hold (once per host
//!   bound) for a list a host asks for once per session.

use std::collections::HashMap;
use std::sync::Arc;

use rmcp::model::{JsonObject, Tool};

use super::actions;
use super::preset::Preset;
use crate::config::{Action, Config, ToolConfig};

/// Where the enabled tools' calls go, looked up on every call.
#[derive(Debug, Clone)]
pub struct ToolTable {
    routes: HashMap<String, Route>,
    /// The enabled tool names, sorted (for error messages).
    names: Vec<String>,
    /// Default tool names (`opencode_<action>`) and the enabled tool that now does that action,
    /// where they differ: error messages written in code name the default tools.
    renamed: Vec<(String, String)>,
}

/// Where a call to a tool goes: its action, and for a preset tool the preset that turns the
/// host's arguments into the action's.
#[derive(Debug, Clone)]
pub struct Route {
    pub action: Action,
    pub preset: Option<Arc<Preset>>,
}

impl ToolTable {
    pub fn new(config: &Config) -> Self {
        let routes: HashMap<String, Route> = config
            .enabled_tools()
            .map(|(name, tool)| (name.to_string(), route(tool, config)))
            .collect();
        let mut names: Vec<String> = routes.keys().cloned().collect();
        names.sort();
        let renamed = crate::config::tool_names(config)
            .into_iter()
            .map(|(action, name)| (format!("opencode_{}", action.as_str()), name))
            .filter(|(default, name)| default != name)
            .collect();
        Self {
            routes,
            names,
            renamed,
        }
    }

    /// `text` (an error message) with every default tool name that a rename replaced written as
    /// the tool the host can call, so the text follows the tool table as the descriptions do.
    pub fn name_tools_in(&self, text: &str) -> String {
        let mut out = text.to_string();
        for (default, name) in &self.renamed {
            // Whole names only: `opencode_start_task` must not touch `opencode_start_task_x`.
            let mut result = String::with_capacity(out.len());
            let mut rest = out.as_str();
            while let Some(at) = rest.find(default.as_str()) {
                let end = at + default.len();
                let whole = !rest[end..]
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
                result.push_str(&rest[..at]);
                result.push_str(if whole { name } else { default });
                rest = &rest[end..];
            }
            result.push_str(rest);
            out = result;
        }
        out
    }

    /// Where a call to an enabled tool goes.
    pub fn route(&self, name: &str) -> Option<&Route> {
        self.routes.get(name)
    }

    /// The enabled tool names, sorted (for error messages).
    pub fn names(&self) -> Vec<&str> {
        self.names.iter().map(String::as_str).collect()
    }
}

/// The enabled tools as `tools/list` shows them, sorted by name.
pub fn list(config: &Config) -> Vec<Tool> {
    let mut tools: Vec<Tool> = config
        .enabled_tools()
        .map(|(name, tool)| describe(name, tool, config).0)
        .collect();
    tools.sort_by(|a, b| a.name.cmp(&b.name));
    tools
}

/// The input schema of `action` as a plain tool bound to it shows it (config refinements
/// included): what a preset's fixed values are checked against and starts from.
pub fn action_input_schema(action: Action, config: &Config) -> JsonObject {
    actions::tool_parts(action, config).input
}

/// Where the calls of a config entry go. Only a preset tool needs its schema built (its preset
/// accepts what that schema lists).
fn route(tool: &ToolConfig, config: &Config) -> Route {
    match Preset::of(tool) {
        None => Route {
            action: tool.action,
            preset: None,
        },
        Some(_) => describe("", tool, config).1,
    }
}

/// The tool a config entry describes, and where its calls go.
fn describe(name: &str, tool: &ToolConfig, config: &Config) -> (Tool, Route) {
    let parts = actions::tool_parts(tool.action, config);
    let preset = Preset::of(tool);
    let input = match &preset {
        Some(preset) => preset.input_schema(&parts.input),
        None => parts.input,
    };
    // A preset accepts what its own schema lists (not its action's hidden arguments).
    let preset = preset.map(|p| {
        let accepts = input
            .get("properties")
            .and_then(|p| p.as_object())
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default();
        Arc::new(p.accepting(accepts))
    });
    let title = tool
        .title
        .clone()
        .unwrap_or_else(|| parts.title.to_string());
    let mut described = Tool::new(name.to_string(), tool.description.clone(), input)
        .with_title(title)
        .with_raw_output_schema(parts.output.into())
        .with_annotations(parts.annotations);
    described.meta = loading_meta(tool);
    let route = Route {
        action: tool.action,
        preset,
    };
    (described, route)
}

/// How a host that defers tools behind a search loads this one (Claude Code reads these keys
/// of a tool's `_meta`; hosts that do not know them ignore them): always, or found by its hint.
fn loading_meta(tool: &ToolConfig) -> Option<rmcp::model::MetaObject> {
    let mut meta = JsonObject::new();
    if tool.always_load {
        meta.insert("anthropic/alwaysLoad".into(), true.into());
    }
    if let Some(hint) = &tool.search_hint {
        meta.insert("anthropic/searchHint".into(), hint.clone().into());
    }
    (!meta.is_empty()).then_some(rmcp::model::MetaObject(meta))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn every_action_has_object_schemas_without_refs() {
        let config = crate::gateway::test_config();
        let table = ToolTable::new(&config);
        let tools = list(&config);
        assert_eq!(tools.len(), Action::ALL.len());
        for tool in &tools {
            let input = Value::Object(tool.input_schema.as_ref().clone());
            assert_eq!(input["type"], "object", "{}", tool.name);
            let output = tool
                .output_schema
                .as_ref()
                .map(|s| Value::Object(s.as_ref().clone()));
            let output = output.unwrap_or_default();
            assert_eq!(output["type"], "object", "{}", tool.name);
            for text in [input.to_string(), output.to_string()] {
                assert!(
                    !text.contains("$ref") && !text.contains("$schema"),
                    "{}: {text}",
                    tool.name
                );
            }
        }
        let names = table.names();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);
        let listed: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
        assert_eq!(
            listed, names,
            "the list and the routes name the same tools, in order"
        );
    }

    #[test]
    fn schemas_carry_config_limits() {
        let config = crate::gateway::test_config();
        let tools = list(&config);
        let schema_of = |action: Action| {
            let (name, _) = config
                .enabled_tools()
                .find(|(_, t)| t.action == action)
                .unwrap_or_else(|| panic!("no tool for {action:?}"));
            let tool = tools.iter().find(|t| t.name == name).cloned();
            Value::Object(
                tool.map(|t| t.input_schema.as_ref().clone())
                    .unwrap_or_default(),
            )
        };
        let wait = schema_of(Action::WaitForTask);
        assert_eq!(
            wait["properties"]["task_ids"]["maxItems"],
            config.limits.max_wait_ids
        );
        assert_eq!(wait["properties"]["task_ids"]["minItems"], 1);
        assert_eq!(wait["properties"]["mode"]["default"], "all");
        let start = schema_of(Action::StartTask);
        let tiers: Vec<Value> = config
            .tiers
            .iter()
            .map(|t| Value::from(t.name.clone()))
            .collect();
        assert_eq!(start["properties"]["tier"]["enum"], Value::Array(tiers));
        assert_eq!(
            start["required"],
            serde_json::json!(["server_id", "prompt"])
        );
    }

    #[test]
    fn error_messages_name_renamed_tools() {
        let mut config = crate::gateway::test_config();
        let wait = config
            .tools
            .get("opencode_wait_for_task")
            .cloned()
            .expect("the built-in wait tool");
        config.tools.insert("await".into(), wait);
        if let Some(old) = config.tools.get_mut("opencode_wait_for_task") {
            old.enabled = false;
        }
        let table = ToolTable::new(&config);
        assert_eq!(
            table.name_tools_in(
                "task t is still running; wait for it (opencode_wait_for_task), not \
                 opencode_wait_for_task_x; opencode_start_server first"
            ),
            "task t is still running; wait for it (await), not opencode_wait_for_task_x; \
             opencode_start_server first"
        );
        let default = ToolTable::new(&crate::gateway::test_config());
        assert_eq!(
            default.name_tools_in("(opencode_wait_for_task)"),
            "(opencode_wait_for_task)"
        );
    }
}

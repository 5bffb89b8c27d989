//! The tool table: which tools exist, as the config declares them.
//!
//! Code knows *actions*; `delegation.yaml` decides which tools exist, what they are called and how
//! they are described. This table joins the two once, at startup: for each enabled tool, the name
//! and description (and optional title) from the config, and from the action the input schema
//! (refined with the config's limits and tiers), the output schema and the annotations. The result
//! is sorted by name so `tools/list` is stable whatever the config's order.

use std::collections::HashMap;

use rmcp::model::Tool;

use super::actions::{
    ActionSpec, ApplyTask, CancelTask, ContinueTask, DiscardTask, GetTaskResult, GetTaskStatus,
    ListAgents, ListTasks, ReplyPermission, StartServer, StartTask, StopServer, Usage, WaitForTask,
};
use super::schema;
use crate::config::{Action, Config, ToolConfig};

/// The enabled tools, as listed to the host and looked up on every call.
#[derive(Debug, Clone)]
pub struct ToolTable {
    tools: Vec<Tool>,
    actions: HashMap<String, Action>,
}

impl ToolTable {
    pub fn new(config: &Config) -> Self {
        let mut tools: Vec<Tool> = config
            .enabled_tools()
            .map(|(name, tool)| describe(name, tool, config))
            .collect();
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        let actions = config
            .enabled_tools()
            .map(|(name, tool)| (name.to_string(), tool.action))
            .collect();
        Self { tools, actions }
    }

    /// The tools for `tools/list`, sorted by name.
    pub fn tools(&self) -> &[Tool] {
        &self.tools
    }

    /// The action behind an enabled tool.
    pub fn action(&self, name: &str) -> Option<Action> {
        self.actions.get(name).copied()
    }

    /// The enabled tool names, sorted (for error messages).
    pub fn names(&self) -> Vec<&str> {
        self.tools.iter().map(|t| t.name.as_ref()).collect()
    }
}

fn describe(name: &str, tool: &ToolConfig, config: &Config) -> Tool {
    match tool.action {
        Action::StartServer => build::<StartServer>(name, tool, config),
        Action::StopServer => build::<StopServer>(name, tool, config),
        Action::ListAgents => build::<ListAgents>(name, tool, config),
        Action::StartTask => build::<StartTask>(name, tool, config),
        Action::ContinueTask => build::<ContinueTask>(name, tool, config),
        Action::CancelTask => build::<CancelTask>(name, tool, config),
        Action::GetTaskStatus => build::<GetTaskStatus>(name, tool, config),
        Action::GetTaskResult => build::<GetTaskResult>(name, tool, config),
        Action::WaitForTask => build::<WaitForTask>(name, tool, config),
        Action::ReplyPermission => build::<ReplyPermission>(name, tool, config),
        Action::ApplyTask => build::<ApplyTask>(name, tool, config),
        Action::DiscardTask => build::<DiscardTask>(name, tool, config),
        Action::Usage => build::<Usage>(name, tool, config),
        Action::ListTasks => build::<ListTasks>(name, tool, config),
    }
}

fn build<A: ActionSpec>(name: &str, tool: &ToolConfig, config: &Config) -> Tool {
    let mut input = schema::input_schema::<A::Args>();
    A::refine_input_schema(config, &mut input);
    let output = schema::output_schema::<A::Output>();
    let title = tool.title.clone().unwrap_or_else(|| A::TITLE.to_string());
    Tool::new(name.to_string(), tool.description.clone(), input)
        .with_title(title)
        .with_raw_output_schema(output.into())
        .with_annotations(A::annotations())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn every_action_has_object_schemas_without_refs() {
        let config = crate::gateway::test_config();
        let table = ToolTable::new(&config);
        assert_eq!(table.tools().len(), Action::ALL.len());
        for tool in table.tools() {
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
    }

    #[test]
    fn schemas_carry_config_limits() {
        let config = crate::gateway::test_config();
        let table = ToolTable::new(&config);
        let schema_of = |action: Action| {
            let (name, _) = config
                .enabled_tools()
                .find(|(_, t)| t.action == action)
                .unwrap_or_else(|| panic!("no tool for {action:?}"));
            let tool = table.tools().iter().find(|t| t.name == name).cloned();
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
}

//! The actions behind the tools, one file each.
//!
//! Every file follows the same shape, so reading one is reading them all:
//!
//! - `Args`: the tool's arguments. Its serde derive is the parser (`deny_unknown_fields`: a
//!   misspelt argument is an error, not silently ignored), and its schemars derive, doc comments
//!   included, is the input schema the host sees, so the two cannot drift apart.
//! - a unit struct implementing [`ActionSpec`]: the output type (the output schema), a default
//!   title, honest annotations, and the config-dependent parts of the input schema (limits, tier
//!   names), which a derive cannot know.
//! - `run`: checks what types cannot express (non-blank text, absolute paths, the config's limits),
//!   then calls exactly one [`TaskService`] method. Handlers stay thin; the behaviour lives in
//!   `tasks`.
//!
//! [`run`] here is the dispatch from a config [`Action`] to those handlers.

mod apply_task;
mod cancel_task;
mod checks;
mod continue_task;
mod discard_task;
mod fan_out;
mod get_task_result;
mod get_task_status;
mod list_agents;
mod list_tasks;
mod reply_permission;
mod start_server;
mod start_task;
mod stop_server;
mod usage;
mod wait_for_task;

pub use apply_task::ApplyTask;
pub use cancel_task::CancelTask;
pub use continue_task::ContinueTask;
pub use discard_task::DiscardTask;
pub use fan_out::FanOut;
pub use get_task_result::GetTaskResult;
pub use get_task_status::GetTaskStatus;
pub use list_agents::ListAgents;
pub use list_tasks::ListTasks;
pub use reply_permission::ReplyPermission;
pub use start_server::StartServer;
pub use start_task::StartTask;
pub use stop_server::StopServer;
pub use usage::Usage;
pub use wait_for_task::WaitForTask;
pub(super) use wait_for_task::{describe_unfinished, now as wait_now};

use rmcp::model::{JsonObject, ToolAnnotations};
use rmcp::service::RequestContext;
use rmcp::RoleServer;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use super::error::ToolError;
use crate::config::{Action, Config, HostLimits};
use crate::tasks::TaskService;

/// What a handler may use: the config, the task service, and the MCP request (for progress
/// notifications and the host's cancellation).
pub struct Ctx<'a> {
    pub config: &'a Config,
    /// What the calling host can take: result size and wait length.
    pub host: HostLimits,
    pub tasks: &'a TaskService,
    pub request: &'a RequestContext<RoleServer>,
}

/// The static description of an action, from which `tools.rs` builds the MCP tool.
pub trait ActionSpec {
    /// The arguments (input schema).
    type Args: DeserializeOwned + JsonSchema;
    /// The success result (output schema). Must serialize as a JSON object.
    type Output: Serialize + JsonSchema;
    /// The title used when the config gives the tool none.
    const TITLE: &'static str;
    /// Behaviour hints for the host (read-only, destructive, idempotent, open world).
    fn annotations() -> ToolAnnotations;
    /// Adds what depends on the config (bounds from `limits`/`timeouts`, tier names) to the
    /// derived input schema.
    fn refine_input_schema(_config: &Config, _schema: &mut JsonObject) {}
}

/// The annotations of a tool that only looks: it reads state and changes nothing (read-only, not
/// destructive), asking again gives the same answer (idempotent), and it touches only this
/// machine (closed world).
pub(super) fn observing() -> ToolAnnotations {
    ToolAnnotations::new()
        .read_only(true)
        .destructive(false)
        .idempotent(true)
        .open_world(false)
}

/// Every action once: its [`Action`] variant, the module whose `run` handles it, and its spec
/// type. What goes by action (running a call, parsing its arguments only, describing its tool)
/// expands from this one list, so adding an action is a line here and a file beside this one.
macro_rules! each_action {
    ($then:ident) => {
        $then! {
            StartServer => start_server::StartServer,
            StopServer => stop_server::StopServer,
            ListAgents => list_agents::ListAgents,
            StartTask => start_task::StartTask,
            ContinueTask => continue_task::ContinueTask,
            CancelTask => cancel_task::CancelTask,
            GetTaskStatus => get_task_status::GetTaskStatus,
            GetTaskResult => get_task_result::GetTaskResult,
            WaitForTask => wait_for_task::WaitForTask,
            ReplyPermission => reply_permission::ReplyPermission,
            ApplyTask => apply_task::ApplyTask,
            DiscardTask => discard_task::DiscardTask,
            Usage => usage::Usage,
            ListTasks => list_tasks::ListTasks,
            FanOut => fan_out::FanOut,
        }
    };
}

macro_rules! by_action {
    ($($variant:ident => $module:ident :: $spec:ident),* $(,)?) => {
        /// Parses `args` for `action`, runs its handler, and returns the result as JSON.
        pub async fn run(
            action: Action,
            args: JsonObject,
            ctx: &Ctx<'_>,
        ) -> Result<Value, ToolError> {
            match action {
                $(Action::$variant => json($module::run(parse_args(args)?, ctx).await),)*
            }
        }

        /// Parses `args` as `action`'s arguments and stops there, exactly as a call would.
        pub fn parse_only(action: Action, args: JsonObject) -> Result<(), ToolError> {
            match action {
                $(Action::$variant => parse_args::<<$spec as ActionSpec>::Args>(args).map(drop),)*
            }
        }

        /// What the code says about `action`'s tool (see [`ToolParts`]).
        pub fn tool_parts(action: Action, config: &Config) -> ToolParts {
            match action {
                $(Action::$variant => ToolParts::of::<$spec>(config),)*
            }
        }
    };
}

each_action!(by_action);

/// What the code says about an action's tool: its input schema (config refinements included),
/// its output schema, the title used when the config gives none, and its annotations.
pub struct ToolParts {
    pub input: JsonObject,
    pub output: JsonObject,
    pub title: &'static str,
    pub annotations: ToolAnnotations,
}

impl ToolParts {
    fn of<A: ActionSpec>(config: &Config) -> Self {
        let mut input = super::schema::input_schema::<A::Args>();
        A::refine_input_schema(config, &mut input);
        Self {
            input,
            output: super::schema::output_schema::<A::Output>(),
            title: A::TITLE,
            annotations: A::annotations(),
        }
    }
}

fn json<T: Serialize>(result: Result<T, ToolError>) -> Result<Value, ToolError> {
    let value = result?;
    serde_json::to_value(value)
        .map_err(|e| ToolError::internal(format!("cannot serialize the result: {e}")))
}

/// Deserializes tool arguments, with errors that name the argument (serde's own messages name
/// it for missing and unknown fields, `serde_path_to_error` names it, down to the list index, for
/// a wrong type or value).
///
/// An explicit `null` counts as absent: some hosts send `null` for every optional argument they
/// leave out.
pub fn parse_args<T: DeserializeOwned>(mut args: JsonObject) -> Result<T, ToolError> {
    args.retain(|_, value| !value.is_null());
    serde_path_to_error::deserialize(Value::Object(args)).map_err(|e| {
        let message = e.inner().to_string();
        let path = e.path().to_string();
        let names_field = ["missing field", "unknown field", "duplicate field"]
            .iter()
            .any(|prefix| message.starts_with(prefix));
        ToolError::invalid_argument(if names_field || path == "." {
            message
        } else {
            format!("`{path}`: {message}")
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::json;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Sample {
        name: String,
        #[serde(default)]
        ids: Vec<String>,
        port: Option<u16>,
        #[serde(default)]
        flag: bool,
    }

    fn parse(v: Value) -> Result<Sample, ToolError> {
        match v {
            Value::Object(o) => parse_args(o),
            _ => unreachable!(),
        }
    }

    /// `checks` is offered as the user's file allows: left out with neither names nor
    /// commands allowed, the names as its values, or commands of the call's own.
    #[test]
    fn checks_are_offered_as_the_users_file_allows() {
        let checks_of = |config: &Config, action: Action| {
            tool_parts(action, config).input["properties"]
                .get("checks")
                .cloned()
        };
        let mut config = crate::gateway::test_config();
        for action in [Action::StartTask, Action::ContinueTask, Action::FanOut] {
            assert_eq!(checks_of(&config, action), None, "{action:?}");
        }
        config
            .checks
            .named
            .insert("test".into(), "cargo test -q".into());
        let named = checks_of(&config, Action::StartTask).expect("offered");
        assert_eq!(named["items"]["enum"], json!(["test"]), "{named}");
        config.checks.from_calls = true;
        let free = checks_of(&config, Action::ContinueTask).expect("offered");
        assert!(free["items"].get("enum").is_none(), "{free}");
        assert!(
            free["description"]
                .as_str()
                .is_some_and(|d| d.ends_with("Named: test.")),
            "{free}"
        );
    }

    #[test]
    fn wrong_types_name_the_field() {
        let e = parse(json!({"name": "a", "port": "x"})).unwrap_err();
        assert_eq!(
            e.message,
            "`port`: invalid type: string \"x\", expected u16"
        );
        let e = parse(json!({"name": "a", "ids": ["ok", 3]})).unwrap_err();
        assert!(
            e.message.starts_with("`ids[1]`: invalid type: integer `3`"),
            "{}",
            e.message
        );
        let e = parse(json!({"name": "a", "port": 70000})).unwrap_err();
        assert!(
            e.message.starts_with("`port`: invalid value"),
            "{}",
            e.message
        );
    }

    #[test]
    fn missing_and_unknown_fields_keep_serde_wording() {
        let e = parse(json!({"port": 1})).unwrap_err();
        assert_eq!(e.message, "missing field `name`");
        let e = parse(json!({"name": "a", "colour": 1})).unwrap_err();
        assert!(
            e.message.starts_with("unknown field `colour`"),
            "{}",
            e.message
        );
    }

    #[test]
    fn null_means_absent() {
        let s = parse(json!({"name": "a", "flag": null, "port": null})).unwrap();
        assert!(!s.flag && s.port.is_none());
    }
}

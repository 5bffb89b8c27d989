//! [`Gateway`]: the rmcp `ServerHandler`, written by hand because the tool set is data.
//!
//! rmcp's macros fix tools at compile time; here the config decides which tools exist and what
//! they are called, so the handler serves a [`ToolTable`] built once at startup and dispatches a
//! call by tool name to its action. Everything is computed up front: `get_info` is called by rmcp
//! on every capability check and `tools/list` on every host refresh, so both only clone.
//!
//! Errors: an unknown or disabled tool name cannot be routed and is a JSON-RPC `invalid_params`
//! error naming the tool; everything else (bad arguments included) is a tool result with
//! `isError: true` that the host model can read and act on (see `error.rs`).

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, GetPromptRequestParams,
    GetPromptResponse, Implementation, ListPromptsResult, ListToolsResult, PaginatedRequestParams,
    Prompt, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::json;

use super::actions::{self, Ctx};
use super::prompts;
use super::tools::ToolTable;
use crate::config::Config;
use crate::tasks::TaskService;

/// The name the server reports in `initialize`.
pub const SERVER_NAME: &str = "opencode-mcp";

/// The MCP server: the config, the task service, and the tool and prompt lists built from them.
#[derive(Clone)]
pub struct Gateway {
    config: Arc<Config>,
    tasks: Arc<TaskService>,
    tools: Arc<ToolTable>,
    prompts: Arc<Vec<Prompt>>,
    info: Arc<ServerConfig>,
}

impl Gateway {
    pub fn new(config: Config) -> Self {
        let config = Arc::new(config);
        let tasks = Arc::new(TaskService::new(config.clone()));
        let tools = Arc::new(ToolTable::new(&config));
        let prompts = Arc::new(prompts::list(&config));
        let info = ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_prompts()
                .build(),
        )
        .with_server_info(Implementation::new(SERVER_NAME, env!("CARGO_PKG_VERSION")))
        .with_instructions(config.instructions.clone());
        Self {
            config,
            tasks,
            tools,
            prompts,
            info: Arc::new(info),
        }
    }

    /// The task service, for shutdown.
    pub fn tasks(&self) -> Arc<TaskService> {
        self.tasks.clone()
    }
}

impl ServerHandler for Gateway {
    fn get_info(&self) -> ServerConfig {
        self.info.as_ref().clone()
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(self.tools.tools().to_vec()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let CallToolRequestParams {
            name, arguments, ..
        } = request;
        let name = name.as_ref();
        let Some(action) = self.tools.action(name) else {
            return Err(McpError::invalid_params(
                format!(
                    "unknown tool `{name}`: it does not exist or is disabled in delegation.yaml; \
                     the tools are: {}",
                    self.tools.names().join(", ")
                ),
                Some(json!({ "tool": name })),
            ));
        };
        let ctx = Ctx {
            config: &self.config,
            tasks: &self.tasks,
            request: &context,
        };
        let args = arguments.unwrap_or_default();
        let result = match actions::run(action, args, &ctx).await {
            Ok(value) => CallToolResult::structured(value),
            Err(e) => {
                tracing::debug!(tool = name, error = %e, "tool call failed");
                e.into_result()
            }
        };
        Ok(result.into())
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        Ok(ListPromptsResult::with_all_items(
            self.prompts.as_ref().clone(),
        ))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        Ok(prompts::get(&self.config, &request)?.into())
    }
}

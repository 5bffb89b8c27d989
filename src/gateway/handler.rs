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

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

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
use crate::config::{Config, HostLimits};
use crate::tasks::TaskService;

/// The name the server reports in `initialize`.
pub const SERVER_NAME: &str = "opencode-mcp";

/// The MCP server: the config, the task service, and the tool and prompt lists built from them.
#[derive(Clone)]
pub struct Gateway {
    config: Arc<Config>,
    tasks: Arc<TaskService>,
    tools: Arc<ToolTable>,
    /// The tool table as each host sees it (its own wait bound in the schemas), built on its
    /// first `tools/list`; there are only ever a handful of host names.
    host_tools: Arc<Mutex<HashMap<String, Arc<ToolTable>>>>,
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
            host_tools: Arc::default(),
            prompts,
            info: Arc::new(info),
        }
    }

    /// The limits of the host on the other end, by the name it gave at `initialize`.
    fn host(&self, context: &RequestContext<RoleServer>) -> (Option<String>, HostLimits) {
        let name = context
            .peer
            .peer_info()
            .map(|info| info.client_info.name.clone());
        let limits = self.config.host(name.as_deref());
        (name, limits)
    }

    /// The tool list for a host: the wait tool's `timeout_ms` bound and default are what that
    /// host sits through.
    fn tools_for(&self, name: Option<String>, limits: HostLimits) -> Arc<ToolTable> {
        if limits.wait_max >= self.config.timeouts.wait_max.get() {
            return self.tools.clone();
        }
        let mut table = self.host_tools.lock().unwrap_or_else(|p| p.into_inner());
        table
            .entry(name.unwrap_or_default())
            .or_insert_with(|| {
                let mut seen = self.config.as_ref().clone();
                seen.timeouts.wait_max = limits.wait_max.into();
                seen.timeouts.wait_default =
                    seen.timeouts.wait_default.get().min(limits.wait_max).into();
                Arc::new(ToolTable::new(&seen))
            })
            .clone()
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
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let (name, limits) = self.host(&context);
        let tools = self.tools_for(name, limits);
        Ok(ListToolsResult::with_all_items(tools.tools().to_vec()))
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
        let Some(route) = self.tools.route(name) else {
            return Err(McpError::invalid_params(
                format!(
                    "unknown tool `{name}`: it does not exist or is disabled in delegation.yaml; \
                     the tools are: {}",
                    self.tools.names().join(", ")
                ),
                Some(json!({ "tool": name })),
            ));
        };
        let (_, host) = self.host(&context);
        let ctx = Ctx {
            config: &self.config,
            host,
            tasks: &self.tasks,
            request: &context,
        };
        let args = arguments.unwrap_or_default();
        let args = match &route.preset {
            Some(preset) => preset.arguments_for_action(name, args),
            None => Ok(args),
        };
        let outcome = match args {
            Ok(args) => actions::run(route.action, args, &ctx).await,
            Err(e) => Err(e),
        };
        let result = match outcome {
            Ok(value) => CallToolResult::structured(value),
            Err(e) => {
                // An internal error is the gateway's own fault: the user should see it. The rest
                // (bad arguments, unknown ids, conflicts) is the host's to handle.
                if e.code == crate::error::ErrorCode::Internal {
                    tracing::warn!(tool = name, error = %e, "tool call failed");
                } else {
                    tracing::debug!(tool = name, error = %e, "tool call failed");
                }
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

//! [`Gateway`]: the rmcp `ServerHandler`, written by hand because the tool set is data.
//!
//! rmcp's macros fix tools at compile time; here the config decides which tools exist and what
//! they are called, so the handler serves a tool table built from the config and dispatches a
//! call by tool name to its action. Everything is computed up front, in a [`Surface`] that a
//! reload replaces whole (`reload.rs`): `get_info` is called by rmcp on every capability check
//! and `tools/list` on every host refresh, so both only clone.
//!
//! Errors: an unknown or disabled tool name cannot be routed and is a JSON-RPC `invalid_params`
//! error naming the tool; everything else (bad arguments included) is a tool result with
//! `isError: true` that the host model can read and act on (see `error.rs`).

use std::sync::{Arc, RwLock};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, GetPromptRequestParams,
    GetPromptResponse, Implementation, ListPromptsResult, ListToolsResult, PaginatedRequestParams,
    ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::json;

use super::actions::{self, Ctx};
use super::prompts;
use super::surface::Surface;
use crate::config::Config;
use crate::tasks::TaskService;

/// The name the server reports in `initialize`.
pub const SERVER_NAME: &str = "opencode-mcp";

/// The MCP server: the task service, and the surface (config, tools, prompts) it serves now.
#[derive(Clone)]
pub struct Gateway {
    tasks: Arc<TaskService>,
    /// Replaced whole by a reload; the lock is held only to clone or replace the `Arc`, and each
    /// request takes one snapshot (see `surface.rs`).
    surface: Arc<RwLock<Arc<Surface>>>,
    /// What `initialize` answers. Fixed for the session: a host reads the instructions once.
    info: Arc<ServerConfig>,
}

impl Gateway {
    pub fn new(config: Config) -> Self {
        let config = Arc::new(config);
        let tasks = Arc::new(TaskService::new(config.clone()));
        let mut capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_tool_list_changed()
            .enable_prompts()
            .enable_prompts_list_changed()
            .build();
        if !config.reload {
            // Nothing will change while serving: promise no list-changed notifications.
            for changed in [
                capabilities.tools.as_mut().map(|t| &mut t.list_changed),
                capabilities.prompts.as_mut().map(|p| &mut p.list_changed),
            ]
            .into_iter()
            .flatten()
            {
                *changed = None;
            }
        }
        let info = ServerConfig::new(capabilities)
            .with_server_info(Implementation::new(SERVER_NAME, env!("CARGO_PKG_VERSION")))
            .with_instructions(config.instructions.clone());
        Self {
            tasks,
            surface: Arc::new(RwLock::new(Arc::new(Surface::new(config)))),
            info: Arc::new(info),
        }
    }

    /// The surface in force now: take it once per request.
    pub(super) fn surface(&self) -> Arc<Surface> {
        self.surface
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Puts a reloaded surface in force. The task service gets the new config first, so a call
    /// that sees the new surface (a new tier in a schema, say) finds the service already knowing
    /// it; a call already under way keeps the snapshot it took.
    pub(super) fn install(&self, surface: Arc<Surface>) {
        self.tasks.reconfigure(surface.config.clone());
        *self.surface.write().unwrap_or_else(|p| p.into_inner()) = surface;
    }

    /// The task service, for shutdown.
    pub fn tasks(&self) -> Arc<TaskService> {
        self.tasks.clone()
    }
}

/// The name the host gave at `initialize`.
fn client_name(context: &RequestContext<RoleServer>) -> Option<String> {
    context
        .peer
        .peer_info()
        .map(|info| info.client_info.name.clone())
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
        let tools = self.surface().tools_for(client_name(&context).as_deref());
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
        let surface = self.surface();
        let Some(route) = surface.tools.route(name) else {
            return Err(McpError::invalid_params(
                format!(
                    "unknown tool `{name}`: it does not exist or is disabled in delegation.yaml; \
                     the tools are: {}",
                    surface.tools.names().join(", ")
                ),
                Some(json!({ "tool": name })),
            ));
        };
        let host = surface.host(client_name(&context).as_deref());
        let ctx = Ctx {
            config: &surface.config,
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
            Err(mut e) => {
                e.message = surface.tools.name_tools_in(&e.message);
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
            self.surface().prompts.as_ref().clone(),
        ))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        Ok(prompts::get(&self.surface().config, &request)?.into())
    }
}

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

use std::sync::{Arc, Mutex, RwLock};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams,
    GetPromptRequestParams, GetPromptResponse, GetTaskParams, GetTaskResult, Implementation,
    InitializeRequestParams, InitializeResult, ListPromptsResult, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, SubscriptionFilter, UpdateTaskParams,
    TASKS_EXTENSION_ID,
};
use rmcp::service::{RequestContext, SubscriptionContext};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::json;

use super::actions::{self, Ctx};
use super::mcp_tasks;
use super::prompts;
use super::subscriptions::{self, Listeners};
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
    /// What `initialize` and `server/discover` answer. Fixed for the session: a host reads the
    /// instructions once.
    info: Arc<ServerConfig>,
    /// The open `subscriptions/listen` streams a reload notifies.
    listeners: Arc<Listeners>,
    /// The name the host gave last (at `initialize`, or in a request's `_meta` on protocol
    /// 2026-07-28), for what happens outside a request: a reload compares the tool list this
    /// host sees.
    client: Arc<Mutex<Option<String>>>,
    /// Whether list changes are announced (`reload: true`).
    reload: bool,
    /// The native task handles already reported finished (see `mcp_tasks.rs`).
    settled: Arc<mcp_tasks::Settled>,
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
            .enable_tasks()
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
            reload: config.reload,
            surface: Arc::new(RwLock::new(Arc::new(Surface::new(config)))),
            info: Arc::new(info),
            listeners: Arc::default(),
            client: Arc::default(),
            settled: Arc::default(),
        }
    }

    /// The open listen streams, for the reload loop.
    pub(super) fn listeners(&self) -> Arc<Listeners> {
        self.listeners.clone()
    }

    /// The name the host gave most recently.
    pub(super) fn client(&self) -> Option<String> {
        self.client
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The host of this request: the `clientInfo` in its own `_meta` (protocol 2026-07-28 sends
    /// it with every request and no `initialize`), else the one given at `initialize`. Every
    /// per-host choice (result size, wait bound, tool list) is made from this, in one place.
    fn host_of(&self, context: &RequestContext<RoleServer>) -> Option<String> {
        let info = context.client_info()?;
        let mut last = self.client.lock().unwrap_or_else(|p| p.into_inner());
        if last.as_ref() != Some(&info.name) {
            let host = self.surface().config.host_name(&info.name);
            tracing::info!(
                "the host is {} {} (limits of `hosts.{host}`)",
                info.name,
                info.version
            );
            *last = Some(info.name.clone());
        }
        Some(info.name)
    }

    /// What a native-task method needs of a tool call: the surface, the host's limits and this
    /// request, with `then` run on them.
    async fn with_ctx<T>(
        &self,
        context: &RequestContext<RoleServer>,
        then: impl AsyncFnOnce(&Ctx<'_>, u64) -> Result<T, super::ToolError>,
    ) -> Result<T, McpError> {
        let surface = self.surface();
        let ctx = Ctx {
            config: &surface.config,
            host: surface.host(self.host_of(context).as_deref()),
            tasks: &self.tasks,
            request: context,
        };
        let outcome = then(&ctx, mcp_tasks::ttl_ms(&surface.config)).await;
        // As for a tool call ([`Self::call_tool`]): on disk before it is said.
        self.tasks.reported().await;
        outcome.map_err(|mut e| {
            e.message = surface.tools().name_tools_in(&e.message);
            mcp_tasks::error_object(&e)
        })
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

impl ServerHandler for Gateway {
    fn get_info(&self) -> ServerConfig {
        self.info.as_ref().clone()
    }

    /// As rmcp's own, except that a host on the `initialize` handshake is not told of the tasks
    /// extension: task handles go only to requests that declare it themselves (2026-07-28), and
    /// older hosts see exactly the capabilities they always saw.
    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        context.peer.set_peer_info(request.clone());
        self.host_of(&context);
        let mut result = self.negotiate_initialize(&request)?;
        if let Some(extensions) = result.capabilities.extensions.as_mut() {
            extensions.remove(TASKS_EXTENSION_ID);
            if extensions.is_empty() {
                result.capabilities.extensions = None;
            }
        }
        Ok(result)
    }

    fn accepted_subscription_filter(
        &self,
        _requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        Some(subscriptions::granted(self.reload))
    }

    /// Holds the stream open until the host cancels it or the session ends: a reload sends on
    /// it (`subscriptions.rs`).
    async fn listen(&self, context: SubscriptionContext) -> Result<(), McpError> {
        self.host_of(context.request_context());
        let id = context.sink().id().clone();
        self.listeners.add(context.sink().clone());
        // Removed however this ends: cancelled, or dropped with the session.
        let _listening = Listening {
            listeners: &self.listeners,
            id,
        };
        context.cancelled().await;
        Ok(())
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        let id = request.task_id;
        let task = self
            .with_ctx(&context, async |ctx, ttl| {
                mcp_tasks::get(&id, ttl, ctx, &self.settled).await
            })
            .await?;
        Ok(GetTaskResult::new(task))
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let UpdateTaskParams {
            task_id,
            input_responses,
            ..
        } = request;
        self.with_ctx(&context, async |ctx, _| {
            mcp_tasks::update(&task_id, input_responses, ctx).await
        })
        .await
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let id = request.task_id;
        self.with_ctx(&context, async |ctx, _| mcp_tasks::cancel(&id, ctx).await)
            .await
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let tools = self.surface().tools_for(self.host_of(&context).as_deref());
        Ok(ListToolsResult::with_all_items(tools))
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
        let Some(route) = surface.tools().route(name) else {
            return Err(McpError::invalid_params(
                format!(
                    "unknown tool `{name}`: it does not exist or is disabled in delegation.yaml; \
                     the tools are: {}",
                    surface.tools().names().join(", ")
                ),
                Some(json!({ "tool": name })),
            ));
        };
        let host = surface.host(self.host_of(&context).as_deref());
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
        // Durable before reported: whatever the call changed is on disk before the host hears
        // of it (an error too may follow a change, such as a start that failed late).
        self.tasks.reported().await;
        let result = match outcome {
            Ok(value) => {
                if mcp_tasks::requested(&context.meta) && mcp_tasks::runs_as_task(route.action) {
                    let ttl = mcp_tasks::ttl_ms(&surface.config);
                    let follow_up = (route.action == crate::config::Action::ContinueTask)
                        .then(|| value.get("task_id").and_then(serde_json::Value::as_str))
                        .flatten()
                        .and_then(|id| self.tasks.turn_of(id));
                    if let Some(handle) = mcp_tasks::handle(&value, ttl, follow_up) {
                        return Ok(handle.into());
                    }
                }
                CallToolResult::structured(value)
            }
            Err(mut e) => {
                e.message = surface.tools().name_tools_in(&e.message);
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

/// Takes a listen stream's sink out of the listeners when the stream ends, however it ends.
struct Listening<'a> {
    listeners: &'a Listeners,
    id: rmcp::model::RequestId,
}

impl Drop for Listening<'_> {
    fn drop(&mut self) {
        self.listeners.remove(&self.id);
    }
}

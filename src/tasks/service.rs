//! The task actions: start, continue, cancel, status, result, wait, and the server actions that
//! touch tasks (stop, list agents). Tool handlers in `gateway` call exactly one of these.

use std::sync::Arc;
use std::time::Duration;

use schemars::JsonSchema;
use serde::Serialize;

use super::error::TaskError;
use super::model::{TaskResult, TaskSnapshot, WaitMode, WaitOutcome};
use crate::config::Config;
use crate::opencode::{AgentInfo, ServerInfo, ServerPool, StopInfo};

/// A validated `start_task` request.
#[derive(Debug, Clone, Default)]
pub struct StartTask {
    pub server_id: String,
    pub prompt: String,
    pub agent: Option<String>,
    /// Exact `provider/model`.
    pub model: Option<String>,
    /// A tier name from the config; resolved against the server's models.
    pub tier: Option<String>,
    /// Absolute directory the session runs in (default: the server's).
    pub directory: Option<String>,
    pub title: Option<String>,
}

/// A validated `continue_task` request.
#[derive(Debug, Clone, Default)]
pub struct ContinueTask {
    pub task_id: String,
    pub prompt: String,
    pub agent: Option<String>,
    pub model: Option<String>,
}

/// A tier and what it resolves to on one server.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct TierResolution {
    pub name: String,
    pub handles: String,
    /// The model the tier resolves to now (`provider/model`); absent = the server's default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// `false` when the tier lists models and the server offers none of them.
    pub available: bool,
}

/// What `list_agents` reports.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct AgentCatalog {
    pub server_id: String,
    pub agents: Vec<AgentInfo>,
    /// Every model the server offers, as exact `provider/model` ids.
    pub models: Vec<String>,
    /// The server's default model, if it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_model: Option<String>,
    pub tiers: Vec<TierResolution>,
}

/// The tasks and the servers they run on.
pub struct TaskService {
    #[allow(dead_code)]
    config: Arc<Config>,
    pool: ServerPool,
}

fn not_yet() -> TaskError {
    TaskError::NotImplemented("this action is not implemented yet".into())
}

impl TaskService {
    pub fn new(config: Arc<Config>) -> Self {
        Self {
            pool: ServerPool::new(config.clone()),
            config,
        }
    }

    pub async fn start_server(
        &self,
        port: Option<u16>,
        directory: Option<String>,
    ) -> Result<ServerInfo, TaskError> {
        Ok(self.pool.start(port, directory).await?)
    }

    pub async fn stop_server(&self, _server_id: &str) -> Result<StopInfo, TaskError> {
        Err(not_yet())
    }

    pub async fn list_agents(&self, _server_id: &str) -> Result<AgentCatalog, TaskError> {
        Err(not_yet())
    }

    /// Returns as soon as the prompt is accepted (status `pending`).
    pub async fn start(&self, _req: StartTask) -> Result<TaskSnapshot, TaskError> {
        Err(not_yet())
    }

    pub async fn continue_task(&self, _req: ContinueTask) -> Result<TaskSnapshot, TaskError> {
        Err(not_yet())
    }

    pub async fn cancel(&self, _task_id: &str) -> Result<TaskSnapshot, TaskError> {
        Err(not_yet())
    }

    pub fn status(&self, _task_id: &str, _include_progress: bool) -> Result<TaskSnapshot, TaskError> {
        Err(not_yet())
    }

    /// `offset` is in characters.
    pub async fn result(&self, _task_id: &str, _offset: u64) -> Result<TaskResult, TaskError> {
        Err(not_yet())
    }

    /// Waits up to `timeout` for the ids (already de-duplicated) to satisfy `mode`. Never
    /// cancels a task; dropping the future ends only the wait.
    pub async fn wait(
        &self,
        _task_ids: &[String],
        _mode: WaitMode,
        _timeout: Duration,
        _include_progress: bool,
    ) -> Result<WaitOutcome, TaskError> {
        Err(not_yet())
    }

    /// Stops every managed server (used on shutdown).
    pub async fn shutdown(&self) {}
}

//! The OpenCode servers the gateway knows: managed children it started and servers it attached to.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::Serialize;

use super::error::OpencodeError;
use crate::config::Config;

/// What `start_server` reports.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct ServerInfo {
    pub server_id: String,
    /// Base URL of the server's HTTP API.
    pub url: String,
    /// `true` when the gateway started the process (and will stop it); `false` when attached.
    pub managed: bool,
    /// OpenCode's version.
    pub version: String,
    /// The directory tasks on this server run in unless they name their own.
    pub directory: String,
    /// `true` when an already running server for this directory was returned.
    pub reused: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
}

/// What `stop_server` reports.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct StopInfo {
    pub server_id: String,
    /// `true` if a process was terminated; `false` for an attached server (only forgotten).
    pub terminated: bool,
    /// Tasks that were still running and are now `failed`.
    pub failed_tasks: Vec<String>,
}

/// The servers, by id.
pub struct ServerPool {
    #[allow(dead_code)]
    config: Arc<Config>,
}

impl ServerPool {
    pub fn new(config: Arc<Config>) -> Self {
        Self { config }
    }

    /// Starts (or attaches to, when `opencode.url` is set) a server for `directory` (default:
    /// the gateway's working directory); returns the running one for that directory if any.
    pub async fn start(
        &self,
        _port: Option<u16>,
        _directory: Option<String>,
    ) -> Result<ServerInfo, OpencodeError> {
        Err(OpencodeError::Start("not implemented yet".into()))
    }
}

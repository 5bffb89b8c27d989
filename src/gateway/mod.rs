//! The MCP surface: an rmcp `ServerHandler` whose tools and prompts come from the config.

use crate::config::Config;

/// Errors that end the stdio server.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("MCP transport failed: {0}")]
    Transport(String),
}

/// Serves MCP on stdin/stdout until the host closes stdin.
pub async fn serve_stdio(_config: Config) -> Result<(), GatewayError> {
    Err(GatewayError::Transport("not implemented yet".into()))
}

//! `delegation.yaml`: types, layering and validation.

mod duration;
mod types;

pub use duration::HumanDuration;
pub use types::*;

use std::path::PathBuf;

/// The embedded default file: the repo's own `delegation.yaml`, compiled in.
pub const DEFAULT_YAML: &str = include_str!("../../delegation.yaml");

/// Where configuration layers come from (lowest first: built-in, user file, `./delegation.yaml`
/// in `cwd`, `explicit`, then `OPENCODE_MCP_*` environment variables).
#[derive(Debug, Clone, Default)]
pub struct Sources {
    /// `--config FILE` or `OPENCODE_MCP_CONFIG`.
    pub explicit: Option<PathBuf>,
    /// Directory searched for `delegation.yaml` (the directory the host started us in).
    pub cwd: PathBuf,
    /// The user's global config directory (`$XDG_CONFIG_HOME/opencode-mcp`), if any.
    pub user_dir: Option<PathBuf>,
}

/// A configuration error. Placeholder until the loader lands.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// Loads and validates the layered configuration.
pub fn load(_sources: &Sources) -> Result<Config, ConfigError> {
    Err(ConfigError("config loading not implemented yet".into()))
}

/// The JSON Schema of `delegation.yaml`.
pub fn json_schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(Config)).unwrap_or_default()
}

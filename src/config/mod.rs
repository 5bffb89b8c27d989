//! `delegation.yaml`: the declared surface of the gateway.
//!
//! Everything a host sees (tools, their names and descriptions, the `delegate_task` prompt, the
//! model tiers) and every limit is configuration, layered with figment, lowest first:
//!
//! 1. the built-in default, the repo's own `delegation.yaml` compiled in ([`DEFAULT_YAML`]);
//! 2. the user's file, `<user_dir>/delegation.yaml` (`$XDG_CONFIG_HOME/opencode-mcp`), if present;
//! 3. `delegation.yaml` in the directory the host started us in, if present: the repository's
//!    file, which tunes the surface but never the trust boundary (see `trust.rs`);
//! 4. the file named by `--config` / `OPENCODE_MCP_CONFIG`, which must exist;
//! 5. `OPENCODE_MCP_*` environment variables, `__` separating nested keys
//!    (`OPENCODE_MCP_TIMEOUTS__WAIT_DEFAULT=30s`).
//!
//! Maps (`tools`, `prompts`, and every settings block) merge key by key; lists (`tiers`, a prompt's
//! `arguments`) are replaced whole by the highest layer that sets them.
//!
//! Files:
//! - `types.rs`: the shape (serde + schemars; unknown keys are errors);
//! - `duration.rs`: `45s`-style durations;
//! - `yaml.rs`: the figment `Format` for `yaml_serde`;
//! - `env.rs`: the environment layer (injectable, one provider per variable);
//! - `load.rs`: layering, extraction, attribution of errors to layers;
//! - `trust.rs`: what the repository's own file may not set (what runs, where it connects,
//!   which secret, where data lands) and the permission policy it may only tighten;
//! - `validate.rs`: rules types cannot express (loopback host, `wait_default <= wait_max`, ...);
//! - `template.rs`: `{{placeholder}}` parsing and rendering for prompt templates, and the
//!   `{{tool:<action>}}` names rendered into every text the host reads;
//! - `restart.rs`: the keys a reload cannot change while serving, in one list;
//! - `watch.rs`: noticing edits to the layer files while serving (polled; see there why);
//! - `error.rs`: [`ConfigError`], whose every problem names source, key path and expectation.

mod duration;
mod env;
mod error;
mod load;
pub mod reference;
mod restart;
mod template;
mod trust;
mod types;
mod validate;
pub mod watch;
mod yaml;

pub use duration::HumanDuration;
pub use env::{IGNORED as IGNORED_ENV_VARS, PREFIX as ENV_PREFIX};
pub use error::{printable, printable_lines, ConfigError, Origin, Problem};
pub use load::same_file;
pub use load::{load_checked, load_with_env, SurfaceCheck, BUILT_IN_NAME, FILE_NAME};
pub use restart::{keep_running, NotApplied, RestartKey, RESTART_KEYS};
pub use template::{
    placeholders, render, stale_mentions, tool_names, tool_placeholders, StaleMention,
    TIERS_PLACEHOLDER, TOOL_PREFIX,
};
pub use trust::{Policy, Rule, Withheld, POLICY};
pub use types::*;
pub use validate::Issue;
pub use yaml::Yaml;

use std::path::PathBuf;

/// The embedded default file: the repo's own `delegation.yaml`, compiled in.
/// The configuration in force, shared by everything that must follow a reload (the task service
/// and its tracker): swapped whole, and read as one snapshot per operation. The lock is held only
/// to clone or replace the `Arc`.
#[derive(Debug, Clone)]
pub struct LiveConfig(std::sync::Arc<std::sync::RwLock<std::sync::Arc<Config>>>);

impl LiveConfig {
    pub fn new(config: std::sync::Arc<Config>) -> Self {
        Self(std::sync::Arc::new(std::sync::RwLock::new(config)))
    }

    /// The configuration in force now (take it once per operation).
    pub fn get(&self) -> std::sync::Arc<Config> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Puts a reloaded configuration in force.
    pub fn set(&self, config: std::sync::Arc<Config>) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = config;
    }
}

pub const DEFAULT_YAML: &str = include_str!("../../delegation.yaml");

/// The data of [`DEFAULT_YAML`] as JSON, made by `build.rs`: the gateway reads its built-in layer
/// from this, because parsing the YAML took about 0.6 ms of every start.
pub(crate) const DEFAULT_JSON: &str =
    include_str!(concat!(env!("OUT_DIR"), "/delegation.builtin.json"));

/// The typing keywords of `delegation.schema.json` as committed (made by `build.rs`): the
/// schema the environment layer types its values by (see `env.rs`). The committed file is
/// [`json_schema`]'s output (the test `committed_schema_is_current`), and reading this is cheaper
/// than generating that: generating took about 0.6 ms of every start with an `OPENCODE_MCP_*`
/// variable (perf: 18 % of a `check-config` run with the bench's five variables).
const ENV_SCHEMA_JSON: &str =
    include_str!(concat!(env!("OUT_DIR"), "/delegation.schema.types.json"));

/// [`ENV_SCHEMA_JSON`] parsed; generated if it ever fails to parse.
pub(crate) fn env_schema() -> serde_json::Value {
    serde_json::from_str(ENV_SCHEMA_JSON).unwrap_or_else(|_| json_schema())
}

/// Where configuration layers come from (lowest first: built-in, user file, `./delegation.yaml`
/// in `cwd`, `explicit`, then `OPENCODE_MCP_*` environment variables).
#[derive(Debug, Clone, Default)]
pub struct Sources {
    /// `--config FILE` or `OPENCODE_MCP_CONFIG`; must exist. A relative path is taken relative to
    /// `cwd`.
    pub explicit: Option<PathBuf>,
    /// Directory searched for `delegation.yaml` (the directory the host started us in).
    pub cwd: PathBuf,
    /// The user's global config directory (`$XDG_CONFIG_HOME/opencode-mcp`), if any.
    pub user_dir: Option<PathBuf>,
    /// The repository's file as read once when serving began ([`Sources::freeze_repository`]):
    /// every later load (a hot reload) takes this text, not what the file holds by then.
    pub frozen_repository: Option<std::sync::Arc<Frozen>>,
}

/// The repository's `delegation.yaml` as it was when the gateway began to serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frozen {
    /// There was none (or it was no regular file).
    Absent,
    /// Its text, or why it could not be read.
    Text(Result<String, String>),
}

impl Sources {
    /// The repository's own file: `delegation.yaml` in `cwd`, unless it is the user's file or
    /// the one `--config` names (then it is theirs, with their trust).
    pub fn repository_file(&self) -> Option<PathBuf> {
        let path = self.cwd.join(FILE_NAME);
        let explicit = self.explicit.as_ref().map(|e| self.cwd.join(e));
        let user_file = self.user_dir.as_ref().map(|d| d.join(FILE_NAME));
        let theirs = [explicit, user_file]
            .iter()
            .flatten()
            .any(|f| load::same_file(f, &path));
        (!theirs).then_some(path)
    }

    /// Reads the repository's file now, once, for every load that follows. While the gateway
    /// serves, an agent working in this directory (`isolation: none`) can write
    /// `./delegation.yaml`; were it reloaded, the agent would choose the tools, prompts and
    /// tiers the host uses next. So the repository's file takes effect when the gateway starts,
    /// and an edit of it while serving is only reported ([`crate::gateway`]'s reload). The
    /// user's own files are not frozen: only the user writes those.
    pub fn freeze_repository(mut self) -> Self {
        let frozen = match self.repository_file() {
            Some(path) if path.is_file() => {
                Frozen::Text(load::read_layer(&path, Some(self.cwd.as_path())))
            }
            _ => Frozen::Absent,
        };
        self.frozen_repository = Some(std::sync::Arc::new(frozen));
        self
    }
}

/// `$<var>/opencode-mcp`, else `$HOME/<home_rel>/opencode-mcp`: an XDG base directory.
///
/// A relative value is ignored, as the XDG Base Directory spec says: it would resolve against
/// the working directory, which is the repository the host starts the gateway in, so
/// `XDG_CONFIG_HOME=.config` would load the repository's own
/// `.config/opencode-mcp/delegation.yaml` as the user's trusted file.
pub fn xdg_dir(var: &str, home_rel: &str) -> Option<PathBuf> {
    xdg_dir_from(
        std::env::var_os(var).map(PathBuf::from),
        std::env::var_os("HOME").map(PathBuf::from),
        home_rel,
    )
}

fn xdg_dir_from(value: Option<PathBuf>, home: Option<PathBuf>, home_rel: &str) -> Option<PathBuf> {
    let base = value
        .filter(|v| v.is_absolute())
        .or_else(|| home.filter(|h| h.is_absolute()).map(|h| h.join(home_rel)))?;
    Some(base.join("opencode-mcp"))
}

/// Loads and validates the layered configuration, reading `OPENCODE_MCP_*` variables from the
/// process environment, with the surface's own checks (`surface`, see [`load_checked`]). See
/// [`load_with_env`] to pass the environment explicitly.
pub fn load(sources: &Sources, surface: SurfaceCheck) -> Result<Config, ConfigError> {
    let vars = std::env::vars_os().filter_map(|(name, value)| {
        // A variable whose name is not UTF-8 cannot be one of ours.
        let name = name.into_string().ok()?;
        Some((name, value.to_string_lossy().into_owned()))
    });
    load_checked(sources, vars, surface)
}

/// The JSON Schema of a `delegation.yaml` file (committed as `delegation.schema.json`;
/// regenerate with `cargo run -- config-schema > delegation.schema.json`).
///
/// It is the schema of [`Config`] with one change: a file is one layer and sets only what it
/// changes, so keys of merged maps are not `required` (the loader checks that the merged result
/// is complete). Items of lists (`Tier`, `PromptArgument`) keep their required keys, since a
/// layer that sets a list replaces it whole.
pub fn json_schema() -> serde_json::Value {
    let mut schema = serde_json::to_value(schemars::schema_for!(Config)).unwrap_or_default();
    if let Some(root) = schema.as_object_mut() {
        root.remove("required");
    }
    if let Some(defs) = schema.get_mut("$defs").and_then(|d| d.as_object_mut()) {
        for (name, def) in defs.iter_mut() {
            if !WHOLE_LIST_ITEMS.contains(&name.as_str()) {
                if let Some(def) = def.as_object_mut() {
                    def.remove("required");
                }
            }
        }
    }
    schema
}

/// Schema definitions that only occur as list items, which a layer always gives whole.
const WHOLE_LIST_ITEMS: [&str; 2] = ["Tier", "PromptArgument"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relative_xdg_value_is_ignored() {
        let home = Some(PathBuf::from("/home/u"));
        let dir =
            |value: Option<&str>| xdg_dir_from(value.map(PathBuf::from), home.clone(), ".config");
        assert_eq!(dir(Some("/x")), Some(PathBuf::from("/x/opencode-mcp")));
        assert_eq!(
            dir(Some(".config")),
            Some(PathBuf::from("/home/u/.config/opencode-mcp"))
        );
        assert_eq!(
            dir(Some("")),
            Some(PathBuf::from("/home/u/.config/opencode-mcp"))
        );
        assert_eq!(
            dir(None),
            Some(PathBuf::from("/home/u/.config/opencode-mcp"))
        );
        assert_eq!(
            xdg_dir_from(Some("rel".into()), Some("also-rel".into()), ".config"),
            None
        );
    }
}

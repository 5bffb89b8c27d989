//! Hot reload: a valid edit of the user's `delegation.yaml` layers replaces the surface while
//! serving.
//!
//! The repository's own `./delegation.yaml` is not reloaded: it is read once, when serving
//! begins (`Sources::freeze_repository`), and an edit of it is logged with how to apply it (a
//! restart). An agent working in the gateway's directory can write that file; reloading it
//! would let the agent choose the tools, prompts, tiers and limits the host uses for the rest of
//! the session, without the user seeing it. The user's own files (the global one, `--config`)
//! reload as below.
//!
//! The loop waits for a layer file to change (`config::watch`), loads the configuration exactly
//! as start-up does (same layers, same trust rules, same validation, the repository's text as it
//! was at start), and then:
//!
//! - an invalid result changes nothing: the running surface stays and a warning carries the
//!   loader's text, which names the file, the key and what was expected. A later valid edit
//!   applies as usual;
//! - keys that cannot change while serving (`config::RESTART_KEYS`) keep their running value,
//!   and a warning names each and the file whose edit changed it;
//! - if nothing effective changed (a comment, a value set to what it was), nothing happens;
//! - otherwise a new [`Surface`] is built and installed whole, and the host is sent
//!   `notifications/tools/list_changed` if the tool list it would get changed, and
//!   `notifications/prompts/list_changed` if the prompts did: on its `subscriptions/listen`
//!   streams (protocol 2026-07-28), or bare to a host that began with `initialize`
//!   (`subscriptions.rs`).
//!
//! Tasks already running are not touched: each took its model and deadline when it started.

use std::path::PathBuf;
use std::sync::Arc;

use rmcp::service::Peer;
use rmcp::RoleServer;

use super::handler::Gateway;
use super::surface::{Changes, Surface};
use crate::config::{self, watch::Watch, Config, ConfigError};

/// What one reload did, for the log and for tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The configuration does not load; the running one stays.
    Invalid,
    /// Loaded, but nothing in force changed.
    Unchanged,
    /// A new surface is in force.
    Applied(Changes),
}

/// Watches the layer files until the session ends (the caller aborts the task), applying each
/// settled change and telling `peer` what changed.
pub async fn run(gateway: Gateway, mut watch: Watch, peer: Peer<RoleServer>) {
    let files: Vec<String> = watch.files().map(|p| p.display().to_string()).collect();
    tracing::info!(
        "watching {} for configuration changes (`reload: false` turns this off)",
        files.join(", ")
    );
    let listeners = gateway.listeners();
    let repository = watch.sources().repository_file();
    loop {
        let mut changed = watch.changed().await;
        if let Some(repo) = &repository {
            let before = changed.len();
            changed.retain(|p| !config::same_file(p, repo));
            if changed.len() < before {
                tracing::warn!(
                    file = %repo.display(),
                    "the repository's delegation.yaml changed; it is not applied while serving \
                     (an agent working in this directory can write it, and would choose the tools, \
                     prompts and tiers in use): restart the MCP server to apply it (in Claude Code, \
                     /mcp and reconnect)"
                );
            }
        }
        if changed.is_empty() {
            continue;
        }
        let loaded = super::load_config(watch.sources());
        let client = gateway.client();
        let outcome = apply(&gateway, loaded, &changed, client.as_deref());
        if let Outcome::Applied(changes) = outcome {
            listeners.notify(changes, &peer).await;
        }
    }
}

/// Applies one load result to the gateway; returns what happened. `changed` are the files whose
/// edit is being applied (for messages); `client` is the host's name (its tool list may differ).
pub(super) fn apply(
    gateway: &Gateway,
    loaded: Result<Config, ConfigError>,
    changed: &[PathBuf],
    client: Option<&str>,
) -> Outcome {
    let files = changed
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let mut new = match loaded {
        Ok(new) => new,
        Err(e) => {
            tracing::warn!("{files} changed, but the configuration is not valid; the running one stays in force until a valid edit: {e}");
            return Outcome::Invalid;
        }
    };
    let running = gateway.surface();
    for kept in config::keep_running(&mut new, &running.config, changed) {
        tracing::warn!("{kept}");
    }
    for withheld in &new.withheld {
        if !running.config.withheld.contains(withheld) {
            tracing::warn!("{withheld}");
        }
    }
    if same_in_force(&new, &running.config) {
        tracing::info!("{files} changed; nothing in force changed");
        return Outcome::Unchanged;
    }
    let surface = Arc::new(Surface::new(Arc::new(new)));
    let changes = running.changes(&surface, client);
    gateway.install(surface);
    tracing::info!(
        tools_changed = changes.tools,
        prompts_changed = changes.prompts,
        "configuration reloaded from {files}"
    );
    Outcome::Applied(changes)
}

/// Whether two configurations put the same settings in force (what the repository's file tried
/// and failed to set is not a setting).
fn same_in_force(a: &Config, b: &Config) -> bool {
    let mut a = a.clone();
    a.withheld.clone_from(&b.withheld);
    a == *b
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gateway on the built-in config, its state directory in a temp dir (kept while the
    /// test runs).
    fn gateway() -> (Gateway, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = crate::gateway::test_config();
        config.state_dir = Some(dir.path().display().to_string());
        (Gateway::new(config), dir)
    }

    fn file() -> Vec<PathBuf> {
        vec![PathBuf::from("/repo/delegation.yaml")]
    }

    #[test]
    fn an_invalid_load_keeps_the_running_surface() {
        let (g, _dir) = gateway();
        let before = g.surface();
        let err = ConfigError::MissingFile {
            path: PathBuf::from("/x.yaml"),
        };
        assert_eq!(apply(&g, Err(err), &file(), None), Outcome::Invalid);
        assert!(Arc::ptr_eq(&before, &g.surface()));
    }

    #[test]
    fn an_equal_config_is_no_reload() {
        let (g, _dir) = gateway();
        let before = g.surface();
        let same = before.config.as_ref().clone();
        assert_eq!(apply(&g, Ok(same), &file(), None), Outcome::Unchanged);
        assert!(Arc::ptr_eq(&before, &g.surface()));
    }

    #[test]
    fn a_new_tool_is_installed_and_reported_and_restart_keys_keep_their_value() {
        let (g, _dir) = gateway();
        let before = g.surface();
        let mut new = before.config.as_ref().clone();
        let status = new.tools["opencode_get_task_status"].clone();
        new.tools.insert("status".into(), status);
        new.state_dir = Some("/somewhere/else".into());
        new.timeouts.task = std::time::Duration::from_secs(7).into();
        let outcome = apply(&g, Ok(new), &file(), None);
        assert_eq!(
            outcome,
            Outcome::Applied(Changes {
                tools: true,
                prompts: false
            })
        );
        let after = g.surface();
        assert!(after.tools().route("status").is_some());
        assert_eq!(after.config.state_dir, before.config.state_dir);
        assert_eq!(
            after.config.timeouts.task.get(),
            std::time::Duration::from_secs(7)
        );
        assert_eq!(
            g.tasks().config().timeouts.task.get(),
            std::time::Duration::from_secs(7),
            "the task service sees the new config for new tasks"
        );
    }

    #[test]
    fn a_change_to_restart_keys_only_is_no_reload() {
        let (g, _dir) = gateway();
        let before = g.surface();
        let mut new = before.config.as_ref().clone();
        new.opencode.port = 4096;
        assert_eq!(apply(&g, Ok(new), &file(), None), Outcome::Unchanged);
        assert!(Arc::ptr_eq(&before, &g.surface()));
    }
}

//! A turn's confinement: before each turn, the task's root is registered with its server's
//! sandbox and the server is seen to run commands through the confining shell; a new session
//! gets the permission rules that hold its edits.

use std::path::Path;

use crate::opencode::Server;
use crate::tasks::error::TaskError;

/// Registers a task's `root` with its server's sandbox (and puts the confining shell back in
/// place if it went missing), before each turn: a task is never run unconfined on a server
/// that confines.
///
/// `opt_out`: why this turn runs unconfined on a server that confines (its tier's
/// `sandbox: off`, [`crate::sandbox::tier_opt_out`]). `boot`: how long the server may take to
/// answer for `root` (see [`crate::opencode::Api::configured_shell`]). Returns what the task's
/// record says of its confinement for the turn.
pub(in crate::tasks) async fn admit(
    server: &Server,
    root: &str,
    opt_out: Option<String>,
    boot: std::time::Duration,
) -> Result<crate::sandbox::Confinement, TaskError> {
    let refuse = |why: String| TaskError::Opencode(crate::opencode::OpencodeError::Start(why));
    let open = opt_out.is_some();
    let expected = if let Some(shell) = &server.worker_shell {
        shell
            .ensure(root, open)
            .await
            .map_err(crate::workers::serve::ServeError::from)?;
        shell.path.clone()
    } else if let Some(sandbox) = &server.sandbox {
        sandbox.admit(Path::new(root), open).map_err(|e| {
            refuse(format!(
                "cannot confine the task to {root}: the sandbox's files could not be written ({e})"
            ))
        })?;
        sandbox.shell().display().to_string()
    } else {
        return Ok(server.confinement.clone());
    };
    // OpenCode falls back to plain `bash` without a word: the task starts only once its
    // instance is seen to run commands through the confining shell.
    let shell = server.api.configured_shell(root, boot).await?;
    if shell.as_deref() != Some(expected.as_str()) {
        let place = server
            .worker
            .as_deref()
            .map_or_else(|| "here".to_string(), |w| format!("on worker {w}"));
        return Err(refuse(format!(
            "the task would not run confined: OpenCode {place} runs its agents' commands with \
             {} instead of the confining shell {expected}, so its command or environment \
             replaces the OPENCODE_CONFIG_CONTENT the gateway gives it (a wrapper script?). \
             Fix: put that OpenCode's own settings in its config file \
             (~/.config/opencode/opencode.json) instead, or turn confinement off in your own \
             delegation.yaml",
            shell.as_deref().unwrap_or("its default shell"),
        )));
    }
    Ok(match opt_out {
        Some(why) => crate::sandbox::Confinement::Unconfined(why),
        None => server.confinement.clone(),
    })
}
/// The permission rules a new session on `server` gets ([`crate::sandbox::session_rules`]):
/// on this machine while `sandbox.mode` is on (an attached server too: its commands are not
/// confined, but its edits are still held), on a worker while its tasks run confined.
pub(in crate::tasks) fn forced_rules(
    config: &crate::config::Config,
    server: &Server,
) -> Vec<crate::opencode::ForcedRule> {
    match (&server.worker, &server.worker_shell) {
        (None, _) if config.sandbox.mode == crate::config::SandboxMode::On => {
            crate::sandbox::session_rules(
                crate::sandbox::opencode_dir("XDG_DATA_HOME", ".local/share").as_deref(),
            )
        }
        (Some(_), Some(shell)) => {
            crate::sandbox::session_rules(shell.opencode_data.as_deref().map(Path::new))
        }
        _ => Vec::new(),
    }
}

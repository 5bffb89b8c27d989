//! The MCP surface: an rmcp `ServerHandler` whose tools and prompts come from the config.
//!
//! - `handler.rs`: [`Gateway`], the hand-written `ServerHandler` (info, tools, prompts, dispatch);
//! - `tools.rs`: the tool table, config tool -> action, with schemas and annotations;
//! - `actions/`: one file per action: its arguments, output, checks and the one service call;
//! - `schema.rs`: how argument and output types become JSON Schemas hosts accept;
//! - `prompts.rs`: prompts from the config, rendered with the tier list;
//! - `surface.rs`: [`Surface`](surface::Surface), the config and everything built from it for
//!   the host, one immutable snapshot;
//! - `reload.rs`: hot reload: a valid edit of a config file swaps the surface and tells the
//!   host, an invalid one is logged and changes nothing;
//! - `error.rs`: [`ToolError`], how a failed call reads to the host.
//!
//! [`serve_stdio`] runs it all on stdin/stdout and, however the session ends (the host closes
//! stdin, or SIGTERM/SIGINT/SIGHUP), stops the OpenCode servers the gateway started before
//! returning, so no child process outlives us (the original orphaned them).

mod actions;
mod budget;
mod error;
mod handler;
mod mcp_tasks;
mod preset;
mod prompts;
mod reload;
mod schema;
mod subscriptions;
mod surface;
mod tools;

pub use error::ToolError;
pub use handler::{Gateway, SERVER_NAME};
pub use preset::issues as preset_issues;

/// Loads the layered configuration as the gateway serves it: the file's own rules and the
/// surface's (presets' fixed values against their actions' arguments), which only the gateway
/// can check. Every command that acts on a configuration loads it through here.
pub fn load_config(
    sources: &crate::config::Sources,
) -> Result<crate::config::Config, crate::config::ConfigError> {
    crate::config::load(sources, preset_issues)
}

use std::time::Duration;

use rmcp::service::ServerInitializeError;
use rmcp::ServiceExt;
use tokio_util::sync::CancellationToken;

use crate::config::{watch::Watch, Config};

/// How long an exit on a second signal waits for queued task records to reach the disk.
const SECOND_SIGNAL_FLUSH: Duration = Duration::from_secs(1);

/// How long stopping the managed servers may take at exit before we give up on them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// How long the dashboard may take to stop serving at exit.
const PAGE_STOP: Duration = Duration::from_secs(5);

/// Serves the dashboard (`dashboard.serve`) with cancel for this gateway's tasks, unless
/// another process serves this state directory's page. Whatever happens here, MCP is served:
/// a page that cannot be served is logged.
async fn serve_page(
    config: Config,
    tasks: std::sync::Arc<crate::tasks::TaskService>,
    stop: CancellationToken,
) {
    use crate::dashboard::{claim, Claimed, Dashboard};
    let Some(dir) = crate::tasks::state_dir_of(&config) else {
        tracing::warn!("dashboard.serve: no state directory, so no page");
        return;
    };
    // The task store made the directory (private) as the gateway started; the page needs it for
    // its lock, and creates nothing itself.
    let claim = match claim(&dir) {
        Claimed::Ours(claim) => claim,
        Claimed::Taken(other) => {
            tracing::info!(
                at = other.as_deref().unwrap_or("an address it did not note"),
                "dashboard.serve: another process serves this state directory's page"
            );
            return;
        }
        Claimed::Unclaimable => {
            tracing::warn!(dir = %dir.display(), "dashboard.serve: the state directory is not usable, so no page");
            return;
        }
    };
    let port = config.dashboard.port;
    let page = match Dashboard::bind(config, dir, port).await {
        Ok(page) => page.claimed(claim).with_control(tasks),
        Err(e) => {
            tracing::warn!(error = %e, "dashboard.serve: the page is not served");
            return;
        }
    };
    tracing::info!(url = %page.url(), "dashboard: serving the page (it can cancel this gateway's tasks)");
    if let Err(e) = page.serve(async move { stop.cancelled().await }).await {
        tracing::warn!(error = %e, "dashboard: the page stopped");
    }
}

/// Errors that end the stdio server.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("MCP transport failed: {0}")]
    Transport(String),
}

/// Serves MCP on stdin/stdout until the host closes stdin or a SIGTERM/SIGINT/SIGHUP arrives,
/// then stops every managed OpenCode server and returns. With a `watch`, edits to the config
/// files are applied while serving (see `reload.rs`).
pub async fn serve_stdio(config: Config, watch: Option<Watch>) -> Result<(), GatewayError> {
    let page_config = config.dashboard.serve.then(|| config.clone());
    let gateway = Gateway::new(config);
    let tasks = gateway.tasks();
    let page_stop = CancellationToken::new();
    let page = page_config.map(|c| tokio::spawn(serve_page(c, tasks.clone(), page_stop.clone())));
    // Tasks a previous gateway left in the state directory answer again from the first call
    // (every task action waits for them), but are read only once the handshake is over: the
    // `initialize` reply never waits for a full state directory.
    let (handshake_done, handshake) = tokio::sync::oneshot::channel::<()>();
    tasks.restore(async move {
        // Sent when the host is initialized, dropped when it never is: either way, read.
        let _ = handshake.await;
    });
    let stop = CancellationToken::new();
    // The handlers are installed here, before the first byte is served: installed inside the
    // spawned task, a SIGTERM right after `initialize` could still meet the default action and
    // kill the process without stopping its servers.
    let signals = tokio::spawn(cancel_on_signal(stop.clone(), tasks.clone()));
    let served = serve(gateway, stop, watch, handshake_done).await;
    // The page goes first: it cancels nothing while the servers stop.
    page_stop.cancel();
    if let Some(page) = page {
        let _ = tokio::time::timeout(PAGE_STOP, page).await;
    }
    // The handlers stay installed through the shutdown: a second signal ends the wait.
    tracing::info!("stopping managed OpenCode servers");
    if tokio::time::timeout(SHUTDOWN_GRACE, tasks.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            "managed OpenCode servers did not stop within {}s",
            SHUTDOWN_GRACE.as_secs()
        );
    }
    signals.abort();
    served
}

async fn serve(
    gateway: Gateway,
    stop: CancellationToken,
    watch: Option<Watch>,
    handshake_done: tokio::sync::oneshot::Sender<()>,
) -> Result<(), GatewayError> {
    let handler = gateway.clone();
    // `stdio_pipes` reads stdin through the reactor when it is a pipe (as hosts launch us), so a
    // signal can end the session without a blocking read holding the runtime open.
    let running = match handler
        .serve_with_ct(rmcp::transport::stdio_pipes(), stop)
        .await
    {
        Ok(running) => running,
        Err(ServerInitializeError::ConnectionClosed(reason)) => {
            tracing::info!("the host closed stdin before initializing: {reason}");
            return Ok(());
        }
        Err(ServerInitializeError::Cancelled) => {
            tracing::info!("stopped before the host initialized");
            return Ok(());
        }
        Err(e) => return Err(GatewayError::Transport(e.to_string())),
    };
    tracing::info!("serving MCP on stdio");
    let _ = handshake_done.send(());
    // Started once the host is initialized: its list-changed notifications go to that peer.
    let reloading = watch.map(|w| tokio::spawn(reload::run(gateway, w, running.peer().clone())));
    let ended = running.waiting().await;
    if let Some(task) = reloading {
        task.abort();
    }
    match ended {
        Ok(reason) => {
            tracing::info!(?reason, "MCP session ended");
            Ok(())
        }
        Err(e) => Err(GatewayError::Transport(format!(
            "the MCP service task failed: {e}"
        ))),
    }
}

/// Installs the SIGTERM, SIGINT and SIGHUP handlers now, and returns a future that cancels
/// `stop` on the first of them. A second signal (a second Ctrl-C while the servers are being
/// stopped) ends the process at once, with the signal's exit status: whoever sends it is done
/// waiting. Nothing is left behind by that: each managed OpenCode's supervisor sees its lifeline
/// close and takes its server down. The first signal always gets the orderly shutdown, also
/// when it comes after the host closed stdin (Claude Code closes stdin, then sends SIGTERM).
#[cfg(unix)]
fn cancel_on_signal(
    stop: CancellationToken,
    tasks: std::sync::Arc<crate::tasks::TaskService>,
) -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    // SIGHUP too: a closed terminal (or the npm launcher, which forwards it) means the host is
    // gone, and the default action would end the gateway without stopping its servers or
    // writing its queued records.
    let handlers = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    ) {
        (Ok(term), Ok(int), Ok(hup)) => Some((term, int, hup)),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
            tracing::warn!("cannot listen for SIGTERM/SIGINT/SIGHUP: {e}");
            None
        }
    };
    async move {
        let Some((mut term, mut int, mut hup)) = handlers else {
            return;
        };
        let mut received = false;
        loop {
            let (name, number) = tokio::select! {
                _ = term.recv() => ("SIGTERM", libc::SIGTERM),
                _ = int.recv() => ("SIGINT", libc::SIGINT),
                _ = hup.recv() => ("SIGHUP", libc::SIGHUP),
            };
            if received {
                // Claude Code sends SIGINT then SIGTERM when it exits: expected, not a fault.
                tracing::info!("{name} received again while shutting down: exiting now");
                // The records first (a second at most): a task that finished must not read
                // back as running after a restart.
                tasks.flush_records(SECOND_SIGNAL_FLUSH).await;
                std::process::exit(128 + number);
            }
            received = true;
            tracing::info!("{name} received, shutting down");
            stop.cancel();
        }
    }
}

/// Cancels `stop` on the first Ctrl-C.
#[cfg(not(unix))]
async fn cancel_on_signal(
    stop: CancellationToken,
    _tasks: std::sync::Arc<crate::tasks::TaskService>,
) {
    if tokio::signal::ctrl_c().await.is_ok() {
        tracing::info!("interrupted, shutting down");
        stop.cancel();
    }
}

/// Parses `args` as the arguments of `action`, exactly as a `tools/call` does before the action
/// runs, and stops there: `Ok` or the `invalid_argument` error the host would get. Never touches
/// OpenCode. For property tests and fuzzing of the argument parsing.
pub fn parse_tool_arguments(
    action: crate::config::Action,
    args: rmcp::model::JsonObject,
) -> Result<(), ToolError> {
    actions::parse_only(action, args)
}

/// The built-in configuration, for unit tests.
#[cfg(test)]
pub(crate) fn test_config() -> Config {
    let sources = crate::config::Sources {
        explicit: None,
        cwd: std::path::PathBuf::from("/nonexistent/opencode-mcp-unit-tests"),
        user_dir: None,
        frozen_repository: None,
    };
    match crate::config::load_checked(&sources, Vec::new(), preset_issues) {
        Ok(config) => config,
        Err(e) => panic!("the built-in config does not load: {e}"),
    }
}

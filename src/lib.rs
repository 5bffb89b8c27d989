//! opencode-mcp: an MCP stdio server that hands mechanical work to cheaper models running as
//! OpenCode agents, asynchronously and in parallel, while the orchestrating host stays in charge.
//!
//! # Layout
//!
//! - [`config`]: `delegation.yaml`: its types, the figment layering (built-in default, user file,
//!   repo file, `--config`, env) and the validation that names file and key on every error.
//! - [`opencode`]: everything that speaks to OpenCode: the progenitor client generated from
//!   `openapi/` by `build.rs`, supervision of `opencode serve` processes, and the SSE event pump.
//!   No other module names a generated type.
//! - [`tasks`]: the task model, the one status vocabulary, the registry every tool reads from, and
//!   waiting (all/any) on it.
//! - [`gateway`]: the rmcp `ServerHandler`: the tool table built from config, one file per action,
//!   the `delegate_task` prompt, and the error vocabulary every tool shares.
//! - [`git`]: task worktrees with plain `git`: snapshots of the user's tree that leave it alone,
//!   the per-task diff, and the three-way apply.
//! - [`doctor`]: `opencode-mcp doctor`, the first-run checks (binary, providers, tiers, state
//!   directory) with a fix for each problem.
//! - [`watch`]: `opencode-mcp watch`, OpenCode's own terminal UI on a task's session.
//! - [`sandbox`]: confinement of every command a delegated agent runs and of every check
//!   (bubblewrap): the policy, the confining shell OpenCode is given, the probe.
//! - [`private_files`]: owner-only files written atomically (task records, server credentials).
//! - [`logging`]: the stderr log filter (quiet by default) and its `OPENCODE_MCP_LOG` override.

pub mod config;
pub mod coverage;
pub mod dashboard;
pub mod doctor;
pub mod error;
pub mod gateway;
pub mod git;
pub mod ids;
pub mod init;
pub mod logging;
pub mod memory;
pub mod opencode;
pub mod private_files;
pub mod sandbox;
pub mod tasks;
pub mod watch;
pub mod workers;

/// The `opencode-ai` release the OpenCode client was generated from (`openapi/OPENCODE_VERSION`,
/// read by `build.rs`).
pub const OPENCODE_API_VERSION: &str = env!("OPENCODE_API_VERSION");

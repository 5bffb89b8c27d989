//! Workers: the machines tasks may run on. The local machine is one; every other one is a
//! machine the user reaches with `ssh`, declared in their own `delegation.yaml` (`workers:`; a
//! repository's file cannot add, choose or change one, see `config::trust`).
//!
//! - `ssh`: running fixed commands there through the user's own `ssh` client, never prompting,
//!   forwarding nothing, every argument quoted.
//! - `probe`: what a worker offers (reachable, git, OpenCode and its release, a writable root),
//!   in one round trip; `opencode-mcp workers` and `doctor` report it.
//! - `repo`: the repository there and back with git over the same ssh: the task's base pushed
//!   into a bare repository per origin, a worktree made on the task's branch, the agent's work
//!   committed there and fetched back under the gateway's own refs, and all of it removed.
//! - `seen`: what was last seen of each worker (reached or not, when, by whom), noted under the
//!   state directory for the dashboard.
//! - `serve`: the worker's OpenCode, started over ssh on its loopback with a password of its
//!   own, reached through the same connection's port forward.

pub mod probe;
pub mod repo;
pub mod sandbox;
pub mod seen;
pub mod serve;
pub mod ssh;

use serde::Serialize;

use crate::config::{Config, LOCAL_WORKER};
use probe::Health;
use ssh::Ssh;

/// The OpenCode command on a worker when its entry names none.
pub const DEFAULT_OPENCODE: &str = "opencode";
/// A worker's root directory when its entry names none (relative to the ssh login's home).
pub const DEFAULT_ROOT: &str = ".opencode-mcp";

/// One machine tasks may run on.
#[derive(Debug, Clone)]
pub struct Worker {
    pub name: String,
    /// Tasks it runs at once.
    pub max_tasks: u32,
    /// The tiers whose tasks placement gives it (`None`: any).
    pub tiers: Option<Vec<String>>,
    /// How it is reached; `None` for this machine.
    pub remote: Option<Remote>,
    /// Whether its tasks run confined ([`sandbox::mode`]).
    pub sandbox: crate::config::SandboxMode,
}

/// A worker reached over `ssh`.
#[derive(Debug, Clone)]
pub struct Remote {
    pub ssh: Ssh,
    /// The OpenCode command there.
    pub opencode: String,
    /// Where repositories and worktrees live there.
    pub root: String,
}

/// The workers of a configuration: this machine first (with `workers.local.max_tasks`, else
/// `limits.max_tasks`), then the others by name. The configuration was validated: a remote
/// entry has its destination and its slots.
pub fn from_config(config: &Config) -> Vec<Worker> {
    let local_slots = config
        .workers
        .get(LOCAL_WORKER)
        .and_then(|w| w.max_tasks)
        .unwrap_or(config.limits.max_tasks);
    let mut out = vec![Worker {
        name: LOCAL_WORKER.to_string(),
        max_tasks: local_slots,
        tiers: None,
        remote: None,
        sandbox: config.sandbox.mode,
    }];
    for (name, w) in &config.workers {
        let (Some(destination), false) = (w.ssh.as_deref(), name == LOCAL_WORKER) else {
            continue;
        };
        out.push(Worker {
            name: name.clone(),
            max_tasks: w.max_tasks.unwrap_or(1),
            tiers: w.tiers.clone(),
            remote: Some(Remote {
                ssh: Ssh::new(destination, w.ssh_config.as_deref()),
                opencode: w
                    .opencode
                    .clone()
                    .unwrap_or_else(|| DEFAULT_OPENCODE.to_string()),
                root: w.root.clone().unwrap_or_else(|| DEFAULT_ROOT.to_string()),
            }),
            sandbox: sandbox::mode(config, name),
        });
    }
    out
}

/// How long a worker may stay out of reach before its tasks fail, when its entry says nothing.
pub const DEFAULT_LOST_AFTER: std::time::Duration = std::time::Duration::from_secs(120);

/// `workers.<name>.lost_after` ([`DEFAULT_LOST_AFTER`] when not given).
pub fn lost_after(config: &Config, name: &str) -> std::time::Duration {
    config
        .workers
        .get(name)
        .and_then(|w| w.lost_after)
        .map_or(DEFAULT_LOST_AFTER, |d| d.get())
}

impl Worker {
    /// Whether placement may give it a task of `tier` (`None`: the task names no tier).
    pub fn takes(&self, tier: Option<&str>) -> bool {
        match (&self.tiers, tier) {
            (None, _) => true,
            (Some(tiers), Some(tier)) => tiers.iter().any(|t| t == tier),
            (Some(_), None) => false,
        }
    }
}

/// The remote worker `name` of `config`, if it declares one.
pub fn remote(config: &Config, name: &str) -> Option<Remote> {
    from_config(config)
        .into_iter()
        .find(|w| w.name == name)
        .and_then(|w| w.remote)
}

/// One line of `opencode-mcp workers`: a worker, its slots and its health.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerReport {
    pub name: String,
    /// `local`, or the ssh destination.
    #[serde(rename = "where")]
    pub place: String,
    pub max_tasks: u32,
    /// Unfinished tasks there now, of the gateways running on this state directory.
    pub in_use: u32,
    /// `None` for this machine (nothing to probe).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health: Option<Health>,
    /// What is wrong and what to do, one pair each; empty when ready.
    pub problems: Vec<Problem>,
}

/// Something a worker lacks, and the fix.
#[derive(Debug, Clone, Serialize)]
pub struct Problem {
    pub problem: String,
    pub fix: String,
}

/// Probes every remote worker of `workers` ([`from_config`]) at once and reports all of them,
/// in the same order.
pub async fn report(workers: &[Worker]) -> Vec<WorkerReport> {
    let probes = workers.iter().map(|w| async move {
        match w.remote {
            Some(_) => Some(probe::probe(w).await),
            None => None,
        }
    });
    let healths = futures::future::join_all(probes).await;
    workers
        .iter()
        .zip(healths)
        .map(|(w, health)| WorkerReport {
            name: w.name.clone(),
            place: w.remote.as_ref().map_or_else(
                || "this machine".to_string(),
                |r| r.ssh.destination().to_string(),
            ),
            max_tasks: w.max_tasks,
            in_use: 0,
            problems: health
                .as_ref()
                .map(|h| {
                    h.problems(w)
                        .into_iter()
                        .map(|(problem, fix)| Problem { problem, fix })
                        .collect()
                })
                .unwrap_or_default(),
            health,
        })
        .collect()
}

/// `opencode-mcp workers` as text: one line per worker, then its problems.
pub fn text(reports: &[WorkerReport]) -> String {
    let mut out = String::new();
    for r in reports {
        let state = match &r.health {
            None => "ready".to_string(),
            Some(h) if h.ready() => format!(
                "ready ({}, opencode {}, {}, {} ms)",
                h.git.as_deref().unwrap_or_default(),
                h.opencode.as_deref().unwrap_or_default(),
                if h.confined { "confined" } else { "unconfined" },
                h.took_ms
            ),
            Some(h) if !h.reachable => "unreachable".to_string(),
            Some(_) => "not ready".to_string(),
        };
        out.push_str(&format!(
            "{:<16} {:<28} {:>3} of {:>3} slots in use  {state}\n",
            r.name, r.place, r.in_use, r.max_tasks
        ));
        for p in &r.problems {
            out.push_str(&format!("    {}\n      fix: {}\n", p.problem, p.fix));
        }
    }
    out
}

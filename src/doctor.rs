//! `opencode-mcp doctor`: checks what a first run needs and says how to fix each problem.
//!
//! A gateway that cannot start OpenCode, or whose tiers name models no provider offers, only
//! says so when the host's model first calls a tool, inside a conversation, where the user reads
//! the error second-hand. The doctor runs the same steps up front, from a terminal: it finds the
//! `opencode` binary the way the gateway would, starts a throwaway managed server through the
//! gateway's own [`ServerPool`] (same spawn, supervisor, password and readiness wait), reads the
//! models it offers, resolves every tier with the resolver `start_task` uses, and checks the
//! state directory the task store would write to. Each check is one line with a fix; a failed
//! blocker makes the command exit non-zero, a warning does not.
//!
//! The throwaway server is stopped before the report is returned, whatever the checks found,
//! and every step is bounded: the binary's `--version` and the server's start by
//! `timeouts.server_start`, each HTTP read by `timeouts.request`, the whole server phase by a
//! deadline made of those (see [`server_phase_budget`]). Should the process die anyway, the
//! supervisor (enabled by `main`, as for `serve`) takes the server down with it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::config::{Config, ConfigError};
use crate::opencode::{split_model, ModelCatalog, OpencodeError, ServerInfo, ServerPool};
use crate::tasks::{check_variant, resolve_tier};
use crate::OPENCODE_API_VERSION;

/// Offered models named in a failed tier's line, at most (a catalog can hold hundreds).
const MODELS_SHOWN: usize = 12;
/// Time for what is not a request or a start: stopping the server is bounded separately.
const BUDGET_MARGIN: Duration = Duration::from_secs(5);

/// How one check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Nothing to do.
    Ok,
    /// Works, but worth fixing (a different OpenCode version, a state dir others can read).
    Warn,
    /// A blocker: the gateway will not work until it is fixed.
    Fail,
    /// Not checked, because a check it depends on failed.
    Skip,
}

impl Status {
    /// Plain ASCII, so the report reads the same in any terminal and in a log.
    fn label(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
            Status::Skip => "skip",
        }
    }
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Check {
    pub name: String,
    pub status: Status,
    pub detail: String,
    /// What to do about a warning or a failure.
    pub fix: Option<String>,
}

impl Check {
    fn new(name: impl Into<String>, status: Status, detail: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            status,
            detail: detail.into(),
            fix: None,
        }
    }

    fn fix(mut self, fix: impl Into<String>) -> Self {
        self.fix = Some(fix.into());
        self
    }
}

/// Everything the doctor found, and the host setup lines.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub checks: Vec<Check>,
    /// `false` when any check failed (warnings do not count).
    pub ok: bool,
    /// How to register this binary with Claude Code and Codex.
    pub next_steps: Vec<String>,
}

impl Report {
    fn new(checks: Vec<Check>, exe: &Path) -> Self {
        let ok = checks.iter().all(|c| c.status != Status::Fail);
        Self {
            checks,
            ok,
            next_steps: next_steps(exe),
        }
    }

    /// The report as the terminal shows it: one line per check (and its fix), then next steps.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for c in &self.checks {
            out.push_str(&format!(
                "{:<4} {}: {}\n",
                c.status.label(),
                c.name,
                c.detail
            ));
            if let Some(fix) = &c.fix {
                out.push_str(&format!("     fix: {fix}\n"));
            }
        }
        let failed = self
            .checks
            .iter()
            .filter(|c| c.status == Status::Fail)
            .count();
        if failed == 0 {
            out.push_str("\nno blocker found.\n");
        } else {
            out.push_str(&format!(
                "\n{failed} blocker(s) to fix before the first run.\n"
            ));
        }
        out.push_str("\nnext steps:\n");
        for line in &self.next_steps {
            out.push_str(&format!("  {line}\n"));
        }
        out
    }
}

/// Runs every check. `exe` is this binary's absolute path, for the host setup lines.
pub async fn run(loaded: Result<Config, ConfigError>, exe: &Path) -> Report {
    let config = match loaded {
        Ok(c) => c,
        Err(e) => {
            // Every other check reads the configuration.
            let check = Check::new("config", Status::Fail, e.to_string()).fix(
                "correct the file and key named above (`opencode-mcp check-config` checks \
                 again)",
            );
            return Report::new(vec![check], exe);
        }
    };
    let mut checks = vec![config_check(&config), sandbox_check(&config)];
    let config = Arc::new(config);
    let binary_found = match &config.opencode.url {
        // Attach mode: the configured server is checked instead; nothing is spawned.
        Some(_) => true,
        None => {
            let check = binary_check(&config).await;
            let found = check.status != Status::Fail;
            checks.push(check);
            found
        }
    };
    if binary_found {
        checks.extend(server_checks(config.clone()).await);
    } else {
        checks.push(Check::new(
            "providers",
            Status::Skip,
            "not checked: no OpenCode to start",
        ));
    }
    checks.push(state_dir_check(&config));
    checks.push(dashboard_check(&config));
    checks.extend(worker_checks(&config).await);
    Report::new(checks, exe)
}

/// The address of a dashboard serving this state directory, token included (only the user can
/// read the file it comes from), or how to start one.
fn dashboard_check(config: &Config) -> Check {
    let running =
        crate::tasks::state_dir_of(config).and_then(|dir| crate::dashboard::running_address(&dir));
    match running {
        Some(url) => Check::new("dashboard", Status::Ok, format!("serving at {url}")),
        None => Check::new(
            "dashboard",
            Status::Ok,
            "not running; `opencode-mcp dashboard` serves a live page of tasks and spend",
        ),
    }
}

/// Whether delegated agents' commands and checks can run confined here (a fresh probe: it runs
/// `bwrap` itself). Confinement that is on but cannot work is a blocker: every start would be
/// refused.
fn sandbox_check(config: &Config) -> Check {
    use crate::sandbox::probe::{self, Availability};
    let name = "sandbox";
    if config.sandbox.mode == crate::config::SandboxMode::Off {
        return Check::new(
            name,
            Status::Warn,
            "off (sandbox.mode: off): delegated agents' commands and checks run as you, with your \
             files, keys and network",
        )
        .fix("remove `sandbox: {mode: off}` from your delegation.yaml to confine them");
    }
    let attached = config.opencode.url.as_ref().map(|_| {
        " Tasks on the attached server (opencode.url) run unconfined: the gateway did not start \
         it, so it cannot give it its shell; their checks still run confined."
    });
    // Workers the user let run unconfined; the others are confined there, or refused (their
    // own lines say whether bubblewrap runs there).
    let remote: Vec<String> = crate::workers::from_config(config)
        .into_iter()
        .filter(|w| w.remote.is_some() && w.sandbox == crate::config::SandboxMode::Off)
        .map(|w| w.name)
        .collect();
    let on_workers = (!remote.is_empty()).then(|| {
        format!(
            " Tasks on workers {} run unconfined there (workers.<name>.sandbox: off).",
            remote.join(", ")
        )
    });
    match probe::probe() {
        Availability::Ready(bwrap) => {
            let check = Check::new(
                name,
                if attached.is_some() || on_workers.is_some() {
                    Status::Warn
                } else {
                    Status::Ok
                },
                format!(
                    "{} confines every command of a delegated agent and every check: writes only \
                     in the task's directory, secrets hidden, network {}.{}{}",
                    bwrap.display(),
                    if config.sandbox.network { "on" } else { "off" },
                    attached.unwrap_or_default(),
                    on_workers.clone().unwrap_or_default()
                ),
            );
            match (attached, on_workers) {
                (Some(_), _) => check.fix(
                    "leave opencode.url unset to let the gateway start (and confine) its OpenCode",
                ),
                (None, Some(_)) => check.fix(
                    "remove `sandbox: off` from those workers' entries (with bubblewrap \
                     installed there) to confine their agents",
                ),
                (None, None) => check,
            }
        }
        Availability::Unsupported(os) => Check::new(
            name,
            Status::Warn,
            format!("delegated agents and checks run unconfined on {os}: the gateway confines them on Linux only"),
        )
        .fix("run the gateway on Linux (or WSL) with bubblewrap for confined agents"),
        Availability::Missing { why, fix } => {
            Check::new(name, Status::Fail, format!("{why}; every task start is refused"))
                .fix(fix.join("\n"))
        }
    }
}

/// Two checks per remote worker: reachable over ssh without a prompt, git and OpenCode there
/// (another OpenCode release than this gateway's is a warning), a writable root; then, for a
/// ready one, its OpenCode's providers against the tiers. A worker that is not ready is a
/// blocker: tasks placed there would fail.
async fn worker_checks(config: &Config) -> Vec<Check> {
    let workers = crate::workers::from_config(config);
    let reports = crate::workers::report(&workers).await;
    crate::workers::seen::note_probes(crate::tasks::state_dir_of(config).as_deref(), &reports);
    let mut checks = Vec::new();
    for (worker, report) in workers.iter().zip(reports) {
        let Some(check) = reachability_check(report) else {
            continue;
        };
        let ready = check.status != Status::Fail;
        checks.push(check);
        if ready {
            checks.push(worker_providers(config, worker).await);
        }
    }
    checks
}

/// The worker's own OpenCode, started there for the check (and stopped): the providers it
/// offers, and every tier that lists models against them. A worker with no model is a
/// blocker; one that cannot serve some tiers is a warning (tasks of those tiers need another
/// worker).
async fn worker_providers(config: &Config, worker: &crate::workers::Worker) -> Check {
    let name = format!("worker {} providers", worker.name);
    let Some(remote) = worker.remote.as_ref() else {
        return Check::new(name, Status::Skip, "this machine");
    };
    let place = remote.ssh.destination();
    let started = crate::workers::serve::RemoteServe::start(
        &worker.name,
        remote,
        &remote.root,
        // Only its providers are asked for: no agent runs, so no shell is needed.
        None,
        config.timeouts.server_start.get(),
    )
    .await;
    let serve = match started {
        Ok(serve) => serve,
        Err(e) => {
            return Check::new(
                name,
                Status::Fail,
                format!("OpenCode did not start there: {e}"),
            )
            .fix(format!(
                "run `{} serve` on {place} to see OpenCode's own error",
                remote.opencode
            ))
        }
    };
    let catalog = match crate::opencode::Api::new(
        &serve.url,
        Some(&serve.password),
        config.timeouts.request.get(),
    ) {
        Ok(api) => api.models(&serve.directory).await,
        Err(e) => Err(e),
    };
    serve.stop(remote).await;
    let catalog = match catalog {
        Ok(c) if !c.models.is_empty() => c,
        Ok(_) => {
            return Check::new(name, Status::Fail, "OpenCode there offers no model").fix(format!(
                "configure a provider on {place} (`opencode auth login` there): the worker's \
                 OpenCode uses its own providers, your keys never leave this machine"
            ))
        }
        Err(e) => {
            return Check::new(
                name,
                Status::Fail,
                format!("reading its models failed: {e}"),
            )
        }
    };
    let lacking: Vec<&str> = config
        .tiers
        .iter()
        .filter(|t| !t.models.is_empty() && !resolve_tier(t, &catalog).available)
        .map(|t| t.name.as_str())
        .collect();
    let offered = format!("{} model(s) offered there", catalog.models.len());
    if lacking.is_empty() {
        return Check::new(name, Status::Ok, format!("{offered}; serves every tier"));
    }
    Check::new(
        name,
        Status::Warn,
        format!(
            "{offered}; cannot serve tier(s) {}: none of their models is offered there",
            lacking.join(", ")
        ),
    )
    .fix(format!(
        "configure those providers on {place}, or keep those tiers' tasks on other workers"
    ))
}

/// A remote worker's check from its probe (`None` for this machine, which is not probed).
fn reachability_check(r: crate::workers::WorkerReport) -> Option<Check> {
    let health = r.health?;
    let name = format!("worker {}", r.name);
    if let Some(first) = r.problems.first() {
        let detail = r
            .problems
            .iter()
            .map(|p| p.problem.as_str())
            .collect::<Vec<_>>()
            .join("; ");
        return Some(Check::new(name, Status::Fail, detail).fix(first.fix.clone()));
    }
    let opencode = health.opencode.as_deref().unwrap_or_default();
    let detail = format!(
        "{} over ssh in {} ms: {}, opencode {opencode}, root writable, {} slots, {}",
        r.place,
        health.took_ms,
        health.git.as_deref().unwrap_or_default(),
        r.max_tasks,
        if health.confined {
            "agents confined (bubblewrap there)"
        } else {
            "agents unconfined (its sandbox is off in your delegation.yaml)"
        }
    );
    Some(if opencode == OPENCODE_API_VERSION {
        Check::new(name, Status::Ok, detail)
    } else {
        Check::new(name, Status::Warn, detail).fix(format!(
            "this gateway was built against OpenCode {OPENCODE_API_VERSION}: npm i -g \
             opencode-ai@{OPENCODE_API_VERSION} on {}",
            r.place
        ))
    })
}

/// The configuration loaded; settings of the repository's file that were not applied are a
/// warning (the gateway serves without them).
fn config_check(config: &Config) -> Check {
    if config.withheld.is_empty() {
        return Check::new(
            "config",
            Status::Ok,
            "delegation.yaml layers load and validate",
        );
    }
    let keys: Vec<&str> = config.withheld.iter().map(|w| w.key.as_str()).collect();
    Check::new(
        "config",
        Status::Warn,
        format!(
            "the repository's delegation.yaml sets {} which it may not (not applied)",
            keys.join(", ")
        ),
    )
    .fix("move those settings to your user file or the environment (`opencode-mcp check-config` explains each)")
}

/// What to do when the `opencode` binary is missing or unusable.
fn install_fix() -> String {
    format!(
        "npm install -g opencode-ai@{OPENCODE_API_VERSION}, or set opencode.command in \
         delegation.yaml (or OPENCODE_MCP_OPENCODE__COMMAND) to the path of the `opencode` binary"
    )
}

/// The `opencode` binary as configured: found, and its version against the one the client was
/// generated from (another version is a warning: most of the API is stable across releases).
async fn binary_check(config: &Config) -> Check {
    let command = &config.opencode.command;
    let Some(path) = locate(command) else {
        let where_ = if command.contains('/') {
            "no such file".to_string()
        } else {
            "not on PATH".to_string()
        };
        return Check::new(
            "opencode",
            Status::Fail,
            format!("`{command}` (opencode.command) was not found: {where_}"),
        )
        .fix(install_fix());
    };
    let shown = path.display();
    match version_of(&path, config.timeouts.server_start.get()).await {
        Ok(v) if v == OPENCODE_API_VERSION => Check::new(
            "opencode",
            Status::Ok,
            format!("found {shown}, version {v}"),
        ),
        Ok(v) => Check::new(
            "opencode",
            Status::Warn,
            format!(
                "found {shown}, version {v}; this gateway was built against \
                 {OPENCODE_API_VERSION}, so some calls may not match"
            ),
        )
        .fix(format!("npm install -g opencode-ai@{OPENCODE_API_VERSION}")),
        Err(e) => Check::new(
            "opencode",
            Status::Fail,
            format!("found {shown}, but `{shown} --version` {e}"),
        )
        .fix(install_fix()),
    }
}

/// `command` as the gateway would run it: a path as given, or the first executable file of that
/// name on `PATH`.
fn locate(command: &str) -> Option<PathBuf> {
    crate::opencode::find_program(command, is_executable)
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The version `<bin> --version` prints (its last non-empty line: a first run may print notices
/// before it), within `timeout`; the error completes "`<bin> --version` ...".
async fn version_of(bin: &Path, timeout: Duration) -> Result<String, String> {
    let mut cmd = tokio::process::Command::new(bin);
    cmd.arg("--version")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let output = match tokio::time::timeout(timeout, cmd.output()).await {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => return Err(format!("could not run: {e}")),
        Err(_) => {
            return Err(format!(
                "printed nothing within {} (timeouts.server_start)",
                humantime::format_duration(timeout)
            ))
        }
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    let version = stdout
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
        .to_string();
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(format!(
            "failed ({}): {}",
            output.status,
            stderr.lines().last().unwrap_or("").trim()
        ));
    }
    if version.is_empty() {
        return Err("printed no version".into());
    }
    Ok(version)
}

/// The deadline of the whole server phase: a start and two reads, each bounded by its own
/// timeout already; the margin covers the rest. It only matters if one of those bounds fails.
fn server_phase_budget(config: &Config) -> Duration {
    config
        .timeouts
        .server_start
        .get()
        .saturating_add(config.timeouts.request.get().saturating_mul(2))
        .saturating_add(BUDGET_MARGIN)
}

/// Starts (or, in attach mode, reaches) a server the way `opencode_start_server` does, in
/// `directory` (default: the current one), and reads its models; the server is stopped before
/// this returns, whatever happened. `Err`: why no server answered (bounded by
/// [`server_phase_budget`]).
pub async fn read_catalog(
    config: &Arc<Config>,
    directory: Option<String>,
) -> Result<(ServerInfo, Result<ModelCatalog, OpencodeError>), String> {
    let pool = ServerPool::new(config.clone());
    let budget = server_phase_budget(config);
    let outcome = tokio::time::timeout(budget, async {
        let (info, _events) = pool.start(None, directory).await?;
        let server = pool.get(&info.server_id).ok_or_else(|| {
            OpencodeError::Internal("the started server is not in the pool".into())
        })?;
        let catalog = server.api.models(&server.directory).await;
        Ok::<_, OpencodeError>((info, catalog))
    })
    .await;
    // Whatever happened, nothing this command started outlives it.
    pool.stop_all().await;
    match outcome {
        Ok(Ok(found)) => Ok(found),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!(
            "no answer within {} (timeouts.server_start plus two timeouts.request)",
            humantime::format_duration(budget)
        )),
    }
}

/// Starts (or, in attach mode, reaches) a server the way `opencode_start_server` does, reads its
/// models and resolves every tier against them; the server is stopped before this returns.
async fn server_checks(config: Arc<Config>) -> Vec<Check> {
    let mut checks = Vec::new();
    let attach = config.opencode.url.as_deref();
    let (info, catalog) = match read_catalog(&config, None).await {
        Ok(found) => found,
        Err(detail) => {
            checks.push(start_failure(&config, &detail));
            return checks;
        }
    };
    if let Some(url) = attach {
        let (status, fix) = if info.version == OPENCODE_API_VERSION {
            (Status::Ok, None)
        } else {
            (
                Status::Warn,
                Some(format!(
                    "run OpenCode {OPENCODE_API_VERSION} there (npm install -g \
                     opencode-ai@{OPENCODE_API_VERSION}); this gateway was built against it"
                )),
            )
        };
        checks.push(Check {
            name: "opencode".into(),
            status,
            detail: format!(
                "attached to {url} (opencode.url): reachable, version {}",
                info.version
            ),
            fix,
        });
    }
    match catalog {
        Ok(catalog) => {
            let providers = providers_check(&catalog);
            let usable = providers.status == Status::Ok;
            checks.push(providers);
            if usable {
                checks.extend(tier_checks(&config, &catalog));
            }
        }
        Err(e) => checks.push(
            Check::new(
                "providers",
                Status::Fail,
                format!("reading the models failed: {e}"),
            )
            .fix(
                "check OpenCode's provider configuration (`opencode models` lists what it offers)",
            ),
        ),
    }
    checks
}

/// A server that could not be started or reached: in attach mode that is the `opencode` check
/// failing; in managed mode the binary was found, so it is the start that failed.
fn start_failure(config: &Config, detail: &str) -> Check {
    match &config.opencode.url {
        Some(_) => Check::new("opencode", Status::Fail, detail).fix(
            "start `opencode serve` at opencode.url, or unset opencode.url \
             (OPENCODE_MCP_OPENCODE__URL) to let the gateway start its own",
        ),
        None => Check::new(
            "providers",
            Status::Fail,
            format!("a managed OpenCode server did not start: {detail}"),
        )
        .fix(format!(
            "run `{} serve` in this directory to see OpenCode's own error; raise \
             timeouts.server_start if this machine is slow",
            config.opencode.command
        )),
    }
}

/// The providers and models the server offers; none at all is a blocker.
fn providers_check(catalog: &ModelCatalog) -> Check {
    if catalog.models.is_empty() {
        return Check::new("providers", Status::Fail, "OpenCode offers no model").fix(
            "configure a provider in OpenCode: `opencode auth login`, or a `provider` entry in \
             opencode.json",
        );
    }
    let mut providers: Vec<&str> = catalog
        .models
        .iter()
        .filter_map(|m| split_model(m).map(|(p, _)| p))
        .collect();
    providers.dedup();
    let defaults: Vec<String> = catalog
        .defaults
        .iter()
        .map(|(p, m)| format!("{p}/{m}"))
        .collect();
    Check::new(
        "providers",
        Status::Ok,
        format!(
            "{} model(s) from {} provider(s): {}; each provider's default: {} (a task with no \
             model runs on opencode.json `model` if set, else on OpenCode's own pick)",
            catalog.models.len(),
            providers.len(),
            providers.join(", "),
            if defaults.is_empty() {
                "none".to_string()
            } else {
                defaults.join(", ")
            }
        ),
    )
}

/// Every configured tier against the offered models, with `start_task`'s own resolver.
fn tier_checks(config: &Config, catalog: &ModelCatalog) -> Vec<Check> {
    config
        .tiers
        .iter()
        .map(|tier| {
            let name = format!("tier {}", tier.name);
            let resolved = resolve_tier(tier, catalog);
            if tier.models.is_empty() {
                // An empty list means "the server's default model".
                return if catalog.defaults.is_empty() {
                    Check::new(name, Status::Fail, "uses the server's default model, and it has none")
                        .fix("set `model` in opencode.json, or list models for this tier in delegation.yaml")
                } else {
                    // Then delegating to it saves nothing, unless the default happens to be cheap.
                    Check::new(
                        name,
                        Status::Warn,
                        "names no model: its tasks run the server's default model (opencode.json \
                         `model`, else OpenCode's own pick), so delegating to it may save nothing",
                    )
                    .fix(format!(
                        "list cheaper models for tier `{}` under `tiers` in \
                         ~/.config/opencode-mcp/delegation.yaml; {}",
                        tier.name,
                        cheapest(catalog)
                    ))
                };
            }
            match resolved.model {
                Some(model) if resolved.available => match tier.variant.as_deref() {
                    None => Check::new(
                        name,
                        Status::Ok,
                        format!("resolves to {model}{}", price_of(catalog, &model)),
                    ),
                    Some(v) => match check_variant(v, Some(&model), catalog) {
                        Ok(()) => Check::new(
                            name,
                            Status::Ok,
                            format!(
                                "resolves to {model}{}, variant {v}",
                                price_of(catalog, &model)
                            ),
                        ),
                        Err(e) => Check::new(name, Status::Fail, e.to_string()).fix(format!(
                            "set tier `{}`'s `variant` in delegation.yaml to one its model offers, \
                             or remove it",
                            tier.name
                        )),
                    },
                },
                _ => Check::new(
                    name,
                    Status::Fail,
                    format!(
                        "lists {}, and OpenCode offers none of them; it offers: {}",
                        tier.models.join(", "),
                        some_of(&catalog.models)
                    ),
                )
                .fix(format!(
                    "edit tier `{}` in delegation.yaml to list models OpenCode offers (`opencode \
                     models` lists them), or configure the provider of the ones it lists",
                    tier.name
                )),
            }
        })
        .collect()
}

/// ` ($x/M tokens in+out)` for a model the catalog prices above nothing, else nothing.
fn price_of(catalog: &ModelCatalog, model: &str) -> String {
    match catalog.prices.get(model).map(|p| p.input + p.output) {
        Some(total) if total.is_finite() && total > 0.0 => {
            format!(" (${total:.2}/M tokens in+out)")
        }
        _ => String::new(),
    }
}

/// The cheapest capable models (tool calls, a context of 32k tokens or more), as a proposal;
/// without prices in the catalog, some capable models, saying so.
fn cheapest(catalog: &ModelCatalog) -> String {
    let ranked = crate::init::ranked(catalog);
    if ranked.models.is_empty() {
        return format!(
            "OpenCode offers no model that calls tools with a context of 32k tokens or more; \
             offered: {}",
            some_of(&catalog.models)
        );
    }
    let list: Vec<String> = ranked
        .models
        .iter()
        .take(3)
        .map(|(model, price)| match price {
            Some(total) => format!("{model} (${total:.2}/M tokens in+out)"),
            None => model.clone(),
        })
        .collect();
    if ranked.priced {
        format!(
            "the cheapest capable ones offered: {}; `opencode-mcp init` writes a proposal",
            list.join(", ")
        )
    } else {
        format!(
            "the catalog lists no prices; capable ones offered: {}; `opencode-mcp init` writes \
             a proposal",
            list.join(", ")
        )
    }
}

fn some_of(models: &[String]) -> String {
    let mut s = models
        .iter()
        .take(MODELS_SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if models.len() > MODELS_SHOWN {
        s.push_str(&format!(", ... ({} more)", models.len() - MODELS_SHOWN));
    }
    s
}

/// The directory the task store writes to (`state_dir`, else the XDG state dir, as
/// `TaskService::new` picks it): it must exist or be creatable, and be writable; it should be
/// private, since task records hold prompts and answers. Nothing is created or changed here: a
/// diagnosis that alters what it diagnoses would hide the next run's problem.
fn state_dir_check(config: &Config) -> Check {
    let name = "state dir";
    let Some(dir) = crate::tasks::state_dir_of(config) else {
        return Check::new(
            name,
            Status::Warn,
            "none: neither state_dir, XDG_STATE_HOME nor HOME is set, so tasks will not survive \
             a restart of the gateway",
        )
        .fix("set state_dir in delegation.yaml (or OPENCODE_MCP_STATE_DIR)");
    };
    let shown = dir.display();
    if !dir.exists() {
        // The gateway creates it (0700, with missing parents) on its first start; the doctor
        // changes nothing, so it checks that the nearest existing ancestor lets it.
        let ancestor = dir.ancestors().skip(1).find(|a| a.exists());
        return match ancestor {
            Some(a) if a.is_dir() && writable(a) => Check::new(
                name,
                Status::Ok,
                format!(
                    "{shown} does not exist yet; the gateway creates it (0700) on its first start \
                     ({} is writable)",
                    a.display()
                ),
            ),
            Some(a) => Check::new(
                name,
                Status::Fail,
                format!(
                    "{shown} does not exist and cannot be created: {} is not a writable directory",
                    a.display()
                ),
            )
            .fix(format!(
                "create it yourself (mkdir -p {shown} && chmod 700 {shown}), or set state_dir to a \
                 directory you own"
            )),
            None => Check::new(name, Status::Fail, format!("{shown} cannot be created"))
                .fix("set state_dir in delegation.yaml (or OPENCODE_MCP_STATE_DIR) to an absolute path you own"),
        };
    }
    if !dir.is_dir() {
        return Check::new(name, Status::Fail, format!("{shown} is not a directory"))
            .fix("remove or rename that file, or set state_dir to another directory");
    }
    if !writable(&dir) {
        return Check::new(
            name,
            Status::Fail,
            format!("{shown} is not writable by this user"),
        )
        .fix(format!(
            "make it yours (chown $(id -u) {shown}; chmod 700 {shown}), or set state_dir to a \
                 directory you own"
        ));
    }
    let mode = {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(&dir).map(|m| m.permissions().mode() & 0o777)
    };
    match mode {
        Ok(mode) if mode & 0o077 != 0 => Check::new(
            name,
            Status::Warn,
            format!(
                "{shown} is writable, but other users can reach it (mode {mode:o}), and task \
                 records hold prompts and answers"
            ),
        )
        .fix(format!("chmod 700 {shown}")),
        Ok(_) => Check::new(
            name,
            Status::Ok,
            format!("{shown} is writable and private (0700)"),
        ),
        Err(e) => Check::new(name, Status::Fail, format!("{shown} cannot be read: {e}")),
    }
}

/// Whether this process may create files in `dir` (write and search permission), as the kernel
/// decides it for this user: mode bits alone miss ownership, ACLs and read-only mounts.
fn writable(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: access(2) reads a NUL-terminated path we own for the duration of the call.
    unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) == 0 }
}

/// The lines that register this binary with Claude Code and Codex (what docs/hosts.md says),
/// with this executable's absolute path. Run through `npx`, that path is in npx's cache, which
/// npx may clear: the lines then say `npx -y opencode-mcp-gateway`, as README does.
fn next_steps(exe: &Path) -> Vec<String> {
    let path = exe.display().to_string();
    let (command, args): (String, &[&str]) = if path.contains("/_npx/") {
        ("npx".into(), &["-y", "opencode-mcp-gateway"])
    } else {
        (path, &[])
    };
    let shell: Vec<String> = std::iter::once(command.as_str())
        .chain(args.iter().copied())
        .map(shell_quote)
        .collect();
    let mut lines = vec![
        "Claude Code:".into(),
        format!("  claude mcp add opencode -- {}", shell.join(" ")),
        "Codex (~/.codex/config.toml):".into(),
        "  [mcp_servers.opencode]".into(),
        format!("  command = {}", toml_string(&command)),
    ];
    if !args.is_empty() {
        let args: Vec<String> = args.iter().map(|a| toml_string(a)).collect();
        lines.push(format!("  args = [{}]", args.join(", ")));
    }
    // Codex's own tool timeout (300 s) is left as it is: the gateway keeps its waits under it.
    lines.push("  default_tools_approval_mode = \"approve\"".into());
    lines
}

/// `s` as a TOML basic string: a JSON string escapes the same characters the same way.
fn toml_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("\"{s}\""))
}

/// `s` as one shell word: as is when it holds only safe characters, else single-quoted.
fn shell_quote(s: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "/._-+:=@%,".contains(c);
    if !s.is_empty() && s.chars().all(safe) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_quoted_for_the_shell_and_toml() {
        assert_eq!(
            shell_quote("/usr/bin/opencode-mcp"),
            "/usr/bin/opencode-mcp"
        );
        assert_eq!(shell_quote("/my dir/it's"), r"'/my dir/it'\''s'");
        let steps = next_steps(Path::new("/a \"b\"/opencode-mcp"));
        assert!(steps.contains(&r#"  command = "/a \"b\"/opencode-mcp""#.to_string()));
        let npx = next_steps(Path::new(
            "/home/u/.npm/_npx/1f2e/node_modules/opencode-mcp-gateway-linux-x64/bin/opencode-mcp",
        ));
        assert!(npx.contains(&"  claude mcp add opencode -- npx -y opencode-mcp-gateway".into()));
        assert!(npx.contains(&r#"  args = ["-y", "opencode-mcp-gateway"]"#.into()));
    }

    #[test]
    fn a_tiers_variant_is_checked_against_its_model() {
        let mut config = crate::gateway::test_config();
        config.tiers = vec![
            crate::config::Tier {
                name: "fast".into(),
                handles: "x".into(),
                models: vec!["p/m".into()],
                variant: Some("high".into()),
                ..Default::default()
            },
            crate::config::Tier {
                name: "odd".into(),
                handles: "y".into(),
                models: vec!["p/m".into()],
                variant: Some("max".into()),
                ..Default::default()
            },
        ];
        let catalog = ModelCatalog {
            models: vec!["p/m".into()],
            variants: [("p/m".to_string(), vec!["high".into(), "low".into()])].into(),
            ..ModelCatalog::default()
        };
        let checks = tier_checks(&config, &catalog);
        assert_eq!(checks[0].status, Status::Ok, "{:?}", checks[0]);
        assert!(checks[0].detail.contains("variant high"), "{:?}", checks[0]);
        assert_eq!(checks[1].status, Status::Fail, "{:?}", checks[1]);
        assert!(checks[1].detail.contains("high, low"), "{:?}", checks[1]);
        assert!(checks[1].fix.as_deref().unwrap_or_default().contains("odd"));
    }

    /// A tier that names no model runs the server's default, so delegating to it may save
    /// nothing: a warning, whose fix proposes the cheapest priced models (or, without prices,
    /// names some offered ones and says so).
    #[test]
    fn a_tier_without_models_is_a_warning_proposing_cheap_ones() {
        let mut config = crate::gateway::test_config();
        config.tiers = vec![crate::config::Tier {
            name: "fast".into(),
            handles: "x".into(),
            ..Default::default()
        }];
        let price = |input, output| crate::opencode::Price {
            input,
            output,
            ..Default::default()
        };
        let catalog = ModelCatalog {
            models: vec![
                "p/dear".into(),
                "p/cheap".into(),
                "p/mid".into(),
                "p/free".into(),
            ],
            defaults: [("p".to_string(), "dear".to_string())].into(),
            prices: [
                ("p/dear".to_string(), price(15.0, 75.0)),
                ("p/cheap".to_string(), price(0.1, 0.4)),
                ("p/mid".to_string(), price(1.0, 4.0)),
                ("p/unoffered".to_string(), price(0.0, 0.0)),
            ]
            .into(),
            capable: ["p/dear", "p/cheap", "p/mid", "p/free", "p/unoffered"]
                .iter()
                .map(|m| m.to_string())
                .collect(),
            ..ModelCatalog::default()
        };
        let checks = tier_checks(&config, &catalog);
        assert_eq!(checks[0].status, Status::Warn, "{:?}", checks[0]);
        let fix = checks[0].fix.clone().unwrap_or_default();
        assert!(fix.contains("tier `fast`"), "{fix}");
        let (cheap, mid, dear) = (
            fix.find("p/cheap").expect("cheap proposed"),
            fix.find("p/mid").expect("mid proposed"),
            fix.find("p/dear").expect("dear listed third"),
        );
        assert!(cheap < mid && mid < dear, "cheapest first: {fix}");
        assert!(!fix.contains("p/unoffered"), "only offered models: {fix}");

        let unpriced = ModelCatalog {
            prices: Default::default(),
            ..catalog
        };
        let fix = tier_checks(&config, &unpriced)[0]
            .fix
            .clone()
            .unwrap_or_default();
        assert!(fix.contains("no prices") && fix.contains("p/free"), "{fix}");
    }

    #[test]
    fn only_failures_make_the_report_fail() {
        let exe = Path::new("/x");
        let warn = Report::new(vec![Check::new("a", Status::Warn, "w")], exe);
        assert!(warn.ok);
        let fail = Report::new(
            vec![
                Check::new("a", Status::Ok, "fine"),
                Check::new("b", Status::Fail, "broken").fix("mend it"),
            ],
            exe,
        );
        assert!(!fail.ok);
        let text = fail.text();
        assert!(text.contains("FAIL b: broken\n     fix: mend it"), "{text}");
        assert!(text.contains("1 blocker(s)"), "{text}");
    }

    #[test]
    fn a_missing_command_is_not_located() {
        assert!(locate("/nonexistent/opencode").is_none());
        assert!(locate("surely-no-such-binary-on-path-xyz").is_none());
    }

    /// A configuration that does not load is the one check: every other reads it.
    #[tokio::test]
    async fn a_configuration_that_does_not_load_is_the_only_check() {
        let missing = ConfigError::MissingFile {
            path: PathBuf::from("/nowhere/delegation.yaml"),
        };
        let report = run(Err(missing), Path::new("/x")).await;
        assert!(!report.ok);
        assert_eq!(report.checks.len(), 1, "{:?}", report.checks);
        let check = &report.checks[0];
        assert_eq!(
            (check.name.as_str(), check.status),
            ("config", Status::Fail)
        );
        assert!(
            check.detail.contains("/nowhere/delegation.yaml"),
            "{check:?}"
        );
        assert!(
            check
                .fix
                .as_deref()
                .unwrap_or_default()
                .contains("check-config"),
            "{check:?}"
        );
    }

    /// An executable script in `dir` named `name` with `body`.
    fn script(dir: &Path, name: &str, body: &str) -> String {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("write a script");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        path.display().to_string()
    }

    /// The `opencode` check reads `--version`: the pinned one is fine, another a warning; a
    /// command that fails, prints nothing, hangs or is not there is a blocker saying which.
    #[tokio::test]
    async fn the_opencode_command_is_judged_by_its_version() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let check_of = |command: String| {
            let mut config = crate::gateway::test_config();
            config.opencode.command = command;
            config.timeouts.server_start = "1s".parse().expect("a duration");
            async move { binary_check(&config).await }
        };
        let pinned = script(
            tmp.path(),
            "pinned",
            &format!("echo {OPENCODE_API_VERSION}"),
        );
        assert_eq!(check_of(pinned).await.status, Status::Ok);
        let other = check_of(script(tmp.path(), "other", "echo 0.0.1")).await;
        assert_eq!(other.status, Status::Warn, "{other:?}");
        assert!(other.fix.unwrap_or_default().contains(OPENCODE_API_VERSION));
        let cases = [
            ("failing", "echo broken >&2; exit 3", "failed ("),
            ("silent", "exit 0", "printed no version"),
            ("hung", "exec sleep 30", "printed nothing within"),
        ];
        for (name, body, says) in cases {
            let c = check_of(script(tmp.path(), name, body)).await;
            assert_eq!(c.status, Status::Fail, "{name}: {c:?}");
            assert!(c.detail.contains(says), "{name}: {c:?}");
        }
        let gone = check_of(tmp.path().join("gone").display().to_string()).await;
        assert!(gone.detail.contains("no such file"), "{gone:?}");
        let unknown = check_of("surely-no-such-binary-on-path-xyz".into()).await;
        assert!(unknown.detail.contains("not on PATH"), "{unknown:?}");
    }

    /// The state directory: private and writable is fine; reachable by others a warning; not
    /// there yet fine when its parent lets the gateway make it; a file, or a parent that is not
    /// a writable directory, a blocker.
    #[test]
    fn the_state_directory_is_judged_without_being_changed() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().expect("tempdir");
        let check_at = |dir: &Path| {
            let mut config = crate::gateway::test_config();
            config.state_dir = Some(dir.display().to_string());
            state_dir_check(&config)
        };
        let private = tmp.path().join("private");
        std::fs::create_dir(&private).expect("mkdir");
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        assert_eq!(check_at(&private).status, Status::Ok);
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let open = check_at(&private);
        assert_eq!(open.status, Status::Warn, "{open:?}");
        assert_eq!(
            open.fix.as_deref(),
            Some(&*format!("chmod 700 {}", private.display()))
        );
        let later = private.join("a/b");
        assert_eq!(check_at(&later).status, Status::Ok);
        assert!(!later.exists(), "the check made it");
        let file = tmp.path().join("file");
        std::fs::write(&file, "").expect("a file");
        let not_dir = check_at(&file);
        assert!(not_dir.detail.contains("is not a directory"), "{not_dir:?}");
        let under_file = check_at(&file.join("state"));
        assert_eq!(under_file.status, Status::Fail, "{under_file:?}");
        assert!(
            under_file.detail.contains("cannot be created"),
            "{under_file:?}"
        );
    }

    /// A server that did not start names what to do: in attach mode, start it or unset the URL;
    /// managed, run `opencode serve` to see OpenCode's own error.
    #[test]
    fn a_server_that_did_not_start_says_what_to_do() {
        let mut config = crate::gateway::test_config();
        let managed = start_failure(&config, "boom");
        assert_eq!(managed.name, "providers");
        assert!(managed.fix.unwrap_or_default().contains("serve"));
        config.opencode.url = Some("http://127.0.0.1:1".into());
        let attached = start_failure(&config, "boom");
        assert_eq!(
            (attached.name.as_str(), attached.status),
            ("opencode", Status::Fail)
        );
        assert!(attached.fix.unwrap_or_default().contains("opencode.url"));
    }
}

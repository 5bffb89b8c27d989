//! The `opencode-mcp` binary: the MCP stdio server, plus config subcommands and `doctor`.
//!
//! stdout belongs to the MCP protocol alone (`doctor` aside, which is not the server); every log
//! line goes to stderr through `tracing`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use opencode_mcp::config::{self, Sources};
use opencode_mcp::gateway::load_config;

/// `pow` is the one function of the C maths library the binary calls (tokio's scheduler
/// statistics and minijinja's `**` operator use it). Defined here from the pure-Rust `libm`
/// crate, the linker (which drops unused libraries, `--as-needed`) leaves `libm.so.6` out, so the
/// gateway no longer maps and relocates it at every start: about 0.5 MiB less resident while
/// idle (measured with `/proc/<pid>/smaps`). The symbol is the binary's own: it is not exported,
/// so no shared library resolves to it. The library and its tests keep the system's.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[no_mangle]
pub extern "C" fn pow(x: f64, y: f64) -> f64 {
    libm::pow(x, y)
}

/// `--version`: ours and the OpenCode API the client was generated from, since a gateway only
/// speaks to the OpenCode releases whose API matches.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (OpenCode API ",
    env!("OPENCODE_API_VERSION"),
    ")"
);

/// Under every `--help`: where to start, where the configuration lives, how to see more.
const FOOTER: &str =
    "Start with `opencode-mcp doctor`: it checks a first run and prints the host setup.
Configuration: ~/.config/opencode-mcp/delegation.yaml (yours), ./delegation.yaml (the repository's).
Logs go to stderr; OPENCODE_MCP_LOG=debug shows more.";

/// The variable naming the `--config` file: besides the arguments, the one input of clap's.
const CONFIG_VAR: &str = "OPENCODE_MCP_CONFIG";

#[derive(Debug, Parser)]
#[command(name = "opencode-mcp", version = VERSION, about, after_help = FOOTER)]
struct Cli {
    /// A delegation.yaml layered above the built-in, user and repo files.
    #[arg(long, global = true, env = CONFIG_VAR, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve MCP over stdio (the default).
    Serve,
    /// Check the configuration files and name every error.
    ///
    /// Loads the layered delegation.yaml (built-in, your file, the repository's, --config, then
    /// OPENCODE_MCP_* variables), prints each error with its file and key, and exits non-zero if
    /// there is one.
    CheckConfig,
    /// Print the resolved configuration as YAML.
    PrintConfig,
    /// Print the JSON Schema of delegation.yaml.
    ConfigSchema,
    /// Check everything a first run needs, and say how to fix it. Start here.
    ///
    /// Checks the configuration, confinement, the opencode binary, its providers and models,
    /// every tier and the state directory, with a fix under each problem. Then prints the lines
    /// that add the gateway to Claude Code and Codex. Exits non-zero when a blocker failed.
    Doctor {
        /// Print the report as JSON ({checks: [{name, status, detail, fix}], ok, next_steps}).
        #[arg(long)]
        json: bool,
    },
    /// Propose cheap models for each tier, and write them to your file.
    ///
    /// Reads OpenCode's catalog, proposes the cheapest capable models for each tier (they call
    /// tools and hold 32k tokens of context), shows the proposal, and writes it to your own
    /// ~/.config/opencode-mcp/delegation.yaml once you confirm. Never writes a repository's file.
    Init {
        /// Write without asking.
        #[arg(long)]
        yes: bool,
        /// Replace the tiers your file sets already (else they are left alone).
        #[arg(long)]
        replace_tiers: bool,
    },
    /// List the tasks' worktrees, and remove those left behind.
    ///
    /// Lists each worktree under `<state_dir>/worktrees/` with its task (if its record still
    /// exists), status, whether it was applied, and its changed files. Reads the state directory
    /// only: a running gateway is neither needed nor disturbed.
    Gc {
        /// Remove the worktrees (and their branches) whose task record is gone and that hold no
        /// unapplied changes.
        #[arg(long)]
        remove_orphans: bool,
        /// With --remove-orphans: also remove those with changes never applied (they are lost).
        #[arg(long, requires = "remove_orphans")]
        force: bool,
    },
    /// Report what delegation cost and saved, per tier and per model.
    ///
    /// Counts the stored tasks by status, with tokens, cost as OpenCode reported it, wall time,
    /// and the saving against `report.reference_price`. Reads the state directory only: no
    /// gateway is needed.
    Usage {
        /// Only tasks whose latest turn started within this long ago (`24h`, `30m`, `7d`).
        /// Default: every stored task.
        #[arg(long, value_name = "DURATION")]
        since: Option<String>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List the stored tasks, newest first.
    ///
    /// Shows each task's id, status, tier, model, age, duration and title. Reads the state
    /// directory only: no gateway is needed.
    Tasks {
        /// Only tasks with this status (pending, running, waiting_permission, completed, failed,
        /// cancelled, timed_out).
        #[arg(long, value_name = "STATUS")]
        status: Option<String>,
        /// Print the list as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Watch a task's agent work in OpenCode's terminal UI.
    ///
    /// Runs `opencode attach` on the task's session, to watch the agent or take it over. The
    /// task's server must be running: for a managed server, the gateway that started the task.
    /// The server's password reaches OpenCode through its environment, never its command line.
    Watch {
        /// The task (`opencode-mcp tasks` lists them).
        task_id: String,
    },
    /// Serve a live page of tasks, workers, the queue and spend.
    ///
    /// Reads the state directory only (no gateway is needed) and serves the page on
    /// 127.0.0.1, behind a random token in the address it prints. Read-only. Stop it with
    /// Ctrl-C.
    Dashboard {
        /// The port on 127.0.0.1 (0: any free port).
        #[arg(long, default_value_t = 0)]
        port: u16,
    },
    /// List the workers and check that each one is ready.
    ///
    /// Lists this machine and each worker of `workers:` in your delegation.yaml, reached over
    /// ssh, with its slots and health: reachable without a prompt, git, OpenCode and its
    /// version, a writable root. Exits non-zero when a worker is not ready.
    Workers {
        /// Print the list as JSON ([{name, where, max_tasks, health, problems}]).
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    opencode_mcp::coverage::write_whole_profiles();
    // A managed OpenCode's supervisor is this binary too (see `opencode::supervisor`).
    if let Some(code) = opencode_mcp::opencode::supervisor::main_if_requested() {
        return code;
    }
    // So is the confining shell OpenCode runs each of an agent's commands with.
    if let Some(code) = opencode_mcp::sandbox::shell::main_if_requested() {
        return code;
    }
    opencode_mcp::logging::init();
    let cli = without_arguments().unwrap_or_else(parse);
    let sources = Sources {
        explicit: cli.config.clone(),
        cwd: std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
        user_dir: user_config_dir(),
        frozen_repository: None,
    };
    let command = cli.command.unwrap_or(Command::Serve);
    if !matches!(command, Command::Serve) {
        restore_sigpipe();
    }
    match command {
        Command::ConfigSchema => {
            match serde_json::to_string_pretty(&config::json_schema()) {
                Ok(text) => println!("{text}"),
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::FAILURE;
                }
            }
            ExitCode::SUCCESS
        }
        Command::CheckConfig => {
            match load_config(&sources) {
                // Settings the repository's file may not make are not errors to serving (they are
                // ignored, with a warning), but a check must not call such a file valid.
                Ok(cfg) if !cfg.withheld.is_empty() => {
                    for w in &cfg.withheld {
                        eprintln!("{w}");
                    }
                    for mention in config::stale_mentions(&cfg) {
                        eprintln!("{mention}");
                    }
                    eprintln!(
                        "{} setting(s) of the repository's delegation.yaml are not applied",
                        cfg.withheld.len()
                    );
                    ExitCode::FAILURE
                }
                Ok(cfg) => {
                    // Literal tool names that name no enabled tool: prose the host may act on, but
                    // the gateway still works, so a warning and not a failure.
                    for mention in config::stale_mentions(&cfg) {
                        eprintln!("{mention}");
                    }
                    eprintln!("configuration is valid");
                    // Kept worktrees are not a configuration error, but this is where a user looks.
                    if let Some(dir) = opencode_mcp::tasks::state_dir_of(&cfg) {
                        let kept = opencode_mcp::tasks::store::gc::kept_count(&dir);
                        if kept > 0 {
                            eprintln!(
                            "{kept} worktree(s) of expired tasks kept with changes never applied \
                             (under {}): list them with `opencode-mcp gc`",
                            opencode_mcp::tasks::store::gc::worktrees_dir(&dir).display()
                        );
                        }
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("{e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::PrintConfig => {
            match load_config(&sources) {
                Ok(cfg) => match yaml_serde::to_string(&cfg) {
                    Ok(text) => {
                        print!("{text}");
                        for d in &cfg.derived {
                            println!("# derived: {d}");
                        }
                        for w in &cfg.withheld {
                            // One comment line each, whatever the repository wrote: a value with a
                            // newline must not become a setting of the printed file.
                            let line = format!(
                                "# not applied from {}: {} = {}; in force: {}",
                                w.file.display(),
                                w.key,
                                w.value,
                                w.in_force
                            );
                            println!("{}", config::printable(&line));
                        }
                        ExitCode::SUCCESS
                    }
                    Err(e) => {
                        eprintln!("error: {e}");
                        ExitCode::FAILURE
                    }
                },
                Err(e) => {
                    eprintln!("{e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Serve => {
            opencode_mcp::workers::ssh::share_connections();
            serve(&sources)
        }
        Command::Doctor { json } => doctor(&sources, json),
        Command::Init { yes, replace_tiers } => init(&sources, yes, replace_tiers),
        Command::Gc {
            remove_orphans,
            force,
        } => gc(&sources, remove_orphans, force),
        Command::Usage { since, json } => usage(&sources, since.as_deref(), json),
        Command::Tasks { status, json } => tasks(&sources, status.as_deref(), json),
        Command::Watch { task_id } => watch(&sources, &task_id),
        Command::Workers { json } => workers(&sources, json),
        Command::Dashboard { port } => dashboard(&sources, port),
    }
}

fn workers(sources: &Sources, json: bool) -> ExitCode {
    let cfg = match load_config(sources) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("opencode-mcp workers: {e}");
            return ExitCode::FAILURE;
        }
    };
    let Some(runtime) = runtime("opencode-mcp workers") else {
        return ExitCode::FAILURE;
    };
    let workers = opencode_mcp::workers::from_config(&cfg);
    let mut reports = runtime.block_on(opencode_mcp::workers::report(&workers));
    // Slots in use: the running tasks of live gateways on this state directory.
    if let Some(dir) = opencode_mcp::tasks::state_dir_of(&cfg) {
        let (records, _) = opencode_mcp::tasks::read_summaries(&dir);
        let alive = |pid| opencode_mcp::tasks::gateway_alive(&dir, pid);
        let in_use = opencode_mcp::tasks::slots_in_use(&records, &alive);
        for report in &mut reports {
            report.in_use = in_use.get(&report.name).copied().unwrap_or(0);
        }
        // What the probes found is what the dashboard shows until the next look.
        opencode_mcp::workers::seen::note_probes(Some(&dir), &reports);
    }
    if json {
        match serde_json::to_string_pretty(&reports) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                eprintln!("opencode-mcp workers: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        print!(
            "{}",
            config::printable_lines(&opencode_mcp::workers::text(&reports))
        );
    }
    if reports.iter().all(|r| r.problems.is_empty()) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The subcommands print for people and pipes: `opencode-mcp tasks | head` must end quietly
/// when `head` closes the pipe, as other command-line tools do, not panic in `println!` (Rust
/// ignores SIGPIPE, so the write fails instead). `serve` keeps ignoring it: a host that goes
/// away is noticed on stdin, and the managed servers are stopped on the way out.
fn restore_sigpipe() {
    // SAFETY: signal(2) only sets the disposition of SIGPIPE back to the default; no handler
    // of ours is installed, so nothing runs in signal context.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// The configuration and the stored task records, for `usage` and `tasks` (`who` prefixes the
/// errors). Unreadable records are named on stderr and skipped: one corrupt file must not hide
/// the rest.
fn stored_records(
    sources: &Sources,
    who: &str,
) -> Option<(
    config::Config,
    Vec<opencode_mcp::tasks::store::usage::TaskSummary>,
)> {
    let cfg = match load_config(sources) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("{who}: {e}");
            return None;
        }
    };
    let Some(dir) = opencode_mcp::tasks::state_dir_of(&cfg) else {
        eprintln!(
            "{who}: no state directory: set `state_dir` in delegation.yaml (or XDG_STATE_HOME or \
             HOME)"
        );
        return None;
    };
    let (records, bad) = opencode_mcp::tasks::read_summaries(&dir);
    for (path, why) in bad {
        eprintln!(
            "{who}: skipping unreadable task record {}: {why}",
            path.display()
        );
    }
    Some((cfg, records))
}

fn print_json<T: serde::Serialize>(who: &str, value: &T) -> ExitCode {
    match serde_json::to_string_pretty(value) {
        Ok(text) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{who}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `usage`: the report goes to stdout (a table, or JSON with `--json`).
fn usage(sources: &Sources, since: Option<&str>, json: bool) -> ExitCode {
    use opencode_mcp::tasks::{epoch_ms, store::usage};
    const WHO: &str = "opencode-mcp usage";
    let now = epoch_ms(std::time::SystemTime::now());
    let since_ms = match since.map(|s| s.trim().parse::<config::HumanDuration>()) {
        None => None,
        Some(Ok(d)) => {
            Some(now.saturating_sub(u64::try_from(d.get().as_millis()).unwrap_or(u64::MAX)))
        }
        Some(Err(e)) => {
            eprintln!("{WHO}: --since: {e}");
            return ExitCode::FAILURE;
        }
    };
    let Some((cfg, records)) = stored_records(sources, WHO) else {
        return ExitCode::FAILURE;
    };
    let report = usage::report(&records, since_ms, now, cfg.report.reference_price);
    if json {
        return print_json(WHO, &report);
    }
    print!("{}", config::printable_lines(&report.text()));
    ExitCode::SUCCESS
}

/// `tasks`: the list goes to stdout (a table, or JSON with `--json`).
fn tasks(sources: &Sources, status: Option<&str>, json: bool) -> ExitCode {
    use opencode_mcp::tasks::{epoch_ms, store::usage, TaskStatus};
    const WHO: &str = "opencode-mcp tasks";
    let status = match status {
        None => None,
        Some(s) => match serde_json::from_value::<TaskStatus>(serde_json::Value::from(s.trim())) {
            Ok(st) => Some(st),
            Err(_) => {
                eprintln!(
                    "{WHO}: --status: expected one of queued, pending, running, waiting_permission, \
                     completed, failed, cancelled, timed_out; found `{s}`"
                );
                return ExitCode::FAILURE;
            }
        },
    };
    let Some((cfg, records)) = stored_records(sources, WHO) else {
        return ExitCode::FAILURE;
    };
    let dir = opencode_mcp::tasks::state_dir_of(&cfg);
    let alive = |pid: u32| {
        dir.as_deref()
            .is_some_and(|d| opencode_mcp::tasks::gateway_alive(d, pid))
    };
    let lines = usage::list(
        &records,
        status,
        epoch_ms(std::time::SystemTime::now()),
        &alive,
    );
    if json {
        return print_json(WHO, &lines);
    }
    print!("{}", usage::list_text(&lines));
    ExitCode::SUCCESS
}

/// `dashboard`: prints the page's address (token included) on stdout, then serves until Ctrl-C.
fn dashboard(sources: &Sources, port: u16) -> ExitCode {
    const WHO: &str = "opencode-mcp dashboard";
    let cfg = match load_config(sources) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("{WHO}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let Some(dir) = opencode_mcp::tasks::state_dir_of(&cfg) else {
        eprintln!("{WHO}: no state directory: set `state_dir` in your delegation.yaml, or HOME");
        return ExitCode::FAILURE;
    };
    let Some(runtime) = runtime(WHO) else {
        return ExitCode::FAILURE;
    };
    let served = runtime.block_on(async {
        let page = opencode_mcp::dashboard::Dashboard::bind(cfg, dir, port).await?;
        println!("{}", page.url());
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        page.serve(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
    });
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{WHO}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `watch`: checks, then runs OpenCode's TUI in place of this process (see `watch.rs`); only its
/// failures are ours to print.
fn watch(sources: &Sources, task_id: &str) -> ExitCode {
    const WHO: &str = "opencode-mcp watch";
    let cfg = match load_config(sources) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("{WHO}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let Some(runtime) = runtime(WHO) else {
        return ExitCode::FAILURE;
    };
    let planned = runtime.block_on(opencode_mcp::watch::plan(
        &cfg,
        opencode_mcp::tasks::state_dir_of(&cfg).as_deref(),
        task_id.trim(),
        |name| std::env::var(name).ok(),
    ));
    // Nothing of the runtime may linger into the TUI's process (or its wait).
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    let plan = match planned {
        Ok(plan) => plan,
        Err(e) => {
            eprintln!("{WHO}: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The TUI draws on a terminal and reads keys from one; without it, it waits for ever.
    use std::io::IsTerminal;
    if !std::io::stdin().is_terminal() || !std::io::stdout().is_terminal() {
        eprintln!(
            "{WHO}: opens OpenCode's terminal UI, so it needs a terminal for stdin and stdout; \
             run it in one. Without a terminal, `opencode-mcp tasks` lists the tasks and \
             opencode_get_task_result reads an answer"
        );
        return ExitCode::FAILURE;
    }
    match plan.run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{WHO}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `gc`: the listing (and what was removed) goes to stdout; failures to run go to stderr.
fn gc(sources: &Sources, remove_orphans: bool, force: bool) -> ExitCode {
    use opencode_mcp::tasks::store::gc::{self, GcAction};
    let cfg = match load_config(sources) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("opencode-mcp gc: {e}");
            return ExitCode::FAILURE;
        }
    };
    let Some(dir) = opencode_mcp::tasks::state_dir_of(&cfg) else {
        eprintln!(
            "opencode-mcp gc: no state directory: set `state_dir` in delegation.yaml (or \
             XDG_STATE_HOME or HOME)"
        );
        return ExitCode::FAILURE;
    };
    let Some(runtime) = runtime("opencode-mcp gc") else {
        return ExitCode::FAILURE;
    };
    runtime.block_on(async {
        let found = gc::list(&dir).await;
        println!(
            "{} worktree(s) under {}",
            found.len(),
            gc::worktrees_dir(&dir).display()
        );
        for g in &found {
            println!("{}", g.line());
        }
        if !remove_orphans {
            let orphans = found.iter().filter(|g| g.orphan()).count();
            if orphans > 0 {
                println!(
                    "{orphans} without a task record: `opencode-mcp gc --remove-orphans` removes \
                     those with nothing unapplied (--force: all of them)"
                );
            }
            return ExitCode::SUCCESS;
        }
        let mut failed = false;
        for (g, action) in gc::remove_orphans(&dir, force, found).await {
            match action {
                GcAction::Removed => println!(
                    "removed {} ({}, branch {})",
                    g.task_id,
                    g.path.display(),
                    g.branch.as_deref().unwrap_or("-")
                ),
                GcAction::Kept(why) => println!("kept {}: {why}", g.task_id),
                GcAction::Failed(why) => {
                    failed = true;
                    println!(
                        "failed to remove {} ({}): {why}",
                        g.task_id,
                        g.path.display()
                    );
                }
            }
        }
        if failed {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        }
    })
}

/// `init`: the proposal and what was done go to stdout; failures to stderr.
fn init(sources: &Sources, yes: bool, replace_tiers: bool) -> ExitCode {
    use std::io::{BufRead, IsTerminal, Write};
    // What goes into the user's own file comes from the user's own layers only: the tiers (and
    // the `handles` text the host model reads) of the repository the command runs in are not
    // read, so a repository cannot plant them in a file every other repository then trusts.
    let own = Sources {
        explicit: sources.explicit.clone(),
        cwd: PathBuf::from("/nonexistent/opencode-mcp-init"),
        user_dir: sources.user_dir.clone(),
        frozen_repository: None,
    };
    let cfg = match load_config(&own) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("opencode-mcp init: {e}");
            return ExitCode::FAILURE;
        }
    };
    let Some(path) = sources.user_dir.as_ref().map(|d| d.join(config::FILE_NAME)) else {
        eprintln!("opencode-mcp init: no home directory (set HOME or XDG_CONFIG_HOME)");
        return ExitCode::FAILURE;
    };
    // Tiers set already and not to be replaced: nothing to do, and no server to start.
    let sets_tiers = match std::fs::read_to_string(&path) {
        Ok(text) => opencode_mcp::init::sets_tiers(&text).unwrap_or(false),
        Err(_) => false,
    };
    if sets_tiers && !replace_tiers {
        println!(
            "{} sets `tiers` already: they are left as they are. Pass --replace-tiers for a new \
             proposal in their place.",
            path.display()
        );
        return ExitCode::SUCCESS;
    }
    enable_supervisor();
    let Some(runtime) = runtime("opencode-mcp init") else {
        return ExitCode::FAILURE;
    };
    // Likewise the catalog: OpenCode reads a project's `opencode.json` (its providers and
    // models among it), so it runs in an empty directory of its own, where only the user's own
    // OpenCode configuration applies; a repository's provider is never proposed.
    let neutral = match tempfile_dir() {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("opencode-mcp init: cannot make an empty directory for OpenCode: {e}");
            return ExitCode::FAILURE;
        }
    };
    let read = runtime.block_on(opencode_mcp::doctor::read_catalog(
        &Arc::new(cfg.clone()),
        Some(neutral.display().to_string()),
    ));
    let _ = std::fs::remove_dir_all(&neutral);
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    let catalog = match read {
        Ok((_, Ok(catalog))) => catalog,
        Ok((_, Err(e))) => {
            eprintln!("opencode-mcp init: reading OpenCode's models failed: {e}");
            return ExitCode::FAILURE;
        }
        Err(why) => {
            eprintln!("opencode-mcp init: OpenCode did not start: {why} (`opencode-mcp doctor` says more)");
            return ExitCode::FAILURE;
        }
    };
    let ranked = opencode_mcp::init::ranked(&catalog);
    if ranked.models.is_empty() {
        eprintln!(
            "opencode-mcp init: OpenCode offers no model that calls tools with a context of 32k \
             tokens or more; configure a provider (`opencode auth login`) and run it again"
        );
        return ExitCode::FAILURE;
    }
    let proposal = opencode_mcp::init::propose(&cfg.tiers, &ranked);
    let block = match opencode_mcp::init::yaml(&proposal, ranked.priced) {
        Ok(block) => block,
        Err(e) => {
            eprintln!("opencode-mcp init: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("Proposed tiers, for {}:\n\n{block}", path.display());
    if !yes {
        if !std::io::stdin().is_terminal() {
            println!("Not written: run `opencode-mcp init --yes` to write it.");
            return ExitCode::SUCCESS;
        }
        print!("Write these tiers to {}? [y/N] ", path.display());
        let _ = std::io::stdout().flush();
        let mut answer = String::new();
        let _ = std::io::stdin().lock().read_line(&mut answer);
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            println!("Not written.");
            return ExitCode::SUCCESS;
        }
    }
    match opencode_mcp::init::write(&path, &block, replace_tiers) {
        Ok(done) => {
            let what = match done {
                opencode_mcp::init::Written::Created => "created",
                opencode_mcp::init::Written::Added => "added the tiers to",
                opencode_mcp::init::Written::Replaced => "replaced the tiers of",
            };
            println!(
                "Done: {what} {}. `opencode-mcp doctor` shows what each tier resolves to.",
                path.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("opencode-mcp init: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A new empty directory under the system's temporary directory, this process's own.
fn tempfile_dir() -> std::io::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "opencode-mcp-init-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    std::fs::create_dir(&dir)?;
    Ok(dir)
}

/// `doctor`: stdout is not MCP here, so the report goes there; only failures to run go to stderr.
fn doctor(sources: &Sources, json: bool) -> ExitCode {
    // The throwaway server runs under the supervisor, as the gateway's do, so that it goes with
    // this process however it ends.
    enable_supervisor();
    let exe = std::env::current_exe()
        .and_then(|p| p.canonicalize())
        .unwrap_or_else(|_| PathBuf::from("opencode-mcp"));
    let Some(runtime) = runtime("opencode-mcp doctor") else {
        return ExitCode::FAILURE;
    };
    let report = runtime.block_on(opencode_mcp::doctor::run(load_config(sources), &exe));
    // The server is stopped inside `run`; what may remain are cancelled pumps.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    if json {
        match serde_json::to_string_pretty(&report) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                eprintln!("opencode-mcp doctor: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        print!("{}", config::printable_lines(&report.text()));
    }
    if report.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Managed servers run under the supervisor, which is this very binary. On Linux
/// `/proc/self/exe` stays valid even if the file is replaced while we run; elsewhere the path
/// the binary was started from is the best there is.
fn enable_supervisor() {
    #[cfg(target_os = "linux")]
    let exe = Some(PathBuf::from("/proc/self/exe"));
    #[cfg(not(target_os = "linux"))]
    let exe = std::env::current_exe().ok();
    match exe {
        Some(exe) => opencode_mcp::opencode::supervisor::enable(exe),
        None => tracing::warn!(
            "cannot find this binary's path: managed OpenCode servers run without the supervisor"
        ),
    }
}

/// The command line of nearly every start: a host runs the binary with no arguments, and
/// without [`CONFIG_VAR`]. clap gives the same `Cli` then (`without_arguments_is_what_clap_gives`),
/// but only after building the whole command tree: 4 % of a `check-config` run's samples (perf).
fn without_arguments() -> Option<Cli> {
    (std::env::args_os().len() == 1 && std::env::var_os(CONFIG_VAR).is_none()).then_some(Cli {
        config: None,
        command: None,
    })
}

/// The command line, parsed by clap, with [`FOOTER`] under every subcommand's help too.
fn parse() -> Cli {
    use clap::{CommandFactory, FromArgMatches};
    let matches = Cli::command()
        .mut_subcommands(|c| c.after_help(FOOTER))
        .get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// The async runtime of `serve` and `doctor`: two workers are plenty for an I/O-bound gateway.
/// `None` (after saying why on stderr, prefixed with `who`) if it cannot be built.
fn runtime(who: &str) -> Option<tokio::runtime::Runtime> {
    match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => Some(rt),
        Err(e) => {
            eprintln!("{who}: cannot start the async runtime: {e}");
            None
        }
    }
}

fn serve(sources: &Sources) -> ExitCode {
    opencode_mcp::memory::limit_arenas();
    // The files are read for the watch before the config is loaded, so an edit in between is
    // still seen as a change; the repository's file is read once, here, for this whole run.
    let sources = &sources.clone().freeze_repository();
    let watch = config::watch::Watch::new(sources);
    // A malformed config refuses to start: running on defaults the user did not choose is worse.
    let cfg = match load_config(sources) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("opencode-mcp: refusing to start: {e}");
            return ExitCode::FAILURE;
        }
    };
    for w in &cfg.withheld {
        tracing::warn!("{w}");
    }
    for d in &cfg.derived {
        tracing::info!("derived: {d}");
    }
    // Managed servers run under a supervisor that takes down whatever OpenCode started.
    enable_supervisor();
    let Some(runtime) = runtime("opencode-mcp") else {
        return ExitCode::FAILURE;
    };
    let watch = cfg.reload.then_some(watch);
    if watch.is_none() {
        tracing::info!("`reload: false`: configuration changes take effect at the next start");
    }
    // Boxed: the serving future is tens of KB, and on the main thread's stack each new page of
    // it is a page fault at start; on the heap it takes memory the config load just freed.
    let served = runtime.block_on(Box::pin(opencode_mcp::gateway::serve_stdio(cfg, watch)));
    // Everything that must happen before exit (servers stopped, records on disk) happened inside
    // `serve_stdio`. What may remain is a blocking read of stdin: when stdin is a socket (Claude
    // Code's) rather than a pipe, it is read on a blocking thread that only returns when the host
    // closes its end, and dropping the runtime would wait for it. Do not wait.
    runtime.shutdown_background();
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("opencode-mcp: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `$XDG_CONFIG_HOME/opencode-mcp`, else `$HOME/.config/opencode-mcp`.
fn user_config_dir() -> Option<PathBuf> {
    opencode_mcp::config::xdg_dir("XDG_CONFIG_HOME", ".config")
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, FromArgMatches};

    /// Help reads at a glance: each command's one line is short (its details are in its own
    /// `--help`), and every help ends by naming where to start.
    #[test]
    fn every_command_says_what_it_does_in_one_short_line() {
        let command = super::Cli::command();
        for sub in command.get_subcommands() {
            let about = sub.get_about().map(|a| a.to_string()).unwrap_or_default();
            assert!(
                !about.is_empty() && about.chars().count() <= 70,
                "`{}`: {about:?} ({} characters)",
                sub.get_name(),
                about.chars().count()
            );
        }
        let mut with_footer = command.mut_subcommands(|c| c.after_help(super::FOOTER));
        let help = with_footer
            .find_subcommand_mut("tasks")
            .expect("tasks")
            .render_long_help()
            .to_string();
        assert!(help.contains("opencode-mcp doctor"), "{help}");
        assert!(help.contains("OPENCODE_MCP_LOG"), "{help}");
    }

    /// [`super::without_arguments`] is right as long as clap, given no argument and no
    /// variable, leaves every field empty, and the config variable is the only one it reads.
    #[test]
    fn without_arguments_is_what_clap_gives() {
        let command = super::Cli::command();
        let vars: Vec<_> = command
            .get_arguments()
            .filter_map(|a| a.get_env())
            .collect();
        assert_eq!(vars, [std::ffi::OsStr::new(super::CONFIG_VAR)]);
        // The test's own environment must not decide the result: the variable is taken out.
        let matches = command
            .mut_arg("config", |a| a.env(clap::builder::Resettable::Reset))
            .try_get_matches_from(["opencode-mcp"])
            .expect("no arguments parse");
        let parsed = super::Cli::from_arg_matches(&matches).expect("no arguments make a Cli");
        let fast = super::Cli {
            config: None,
            command: None,
        };
        assert_eq!(format!("{parsed:?}"), format!("{fast:?}"));
    }

    /// The binary's own `pow` (the one `f64::powf` calls here) keeps C's special cases.
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn pow_is_the_c_function() {
        assert_eq!(super::pow(2.0, 10.0), 1024.0);
        assert_eq!(2f64.powf(10.0), 1024.0);
        assert!((super::pow(2.0, 0.5) - std::f64::consts::SQRT_2).abs() < 1e-15);
        assert_eq!(super::pow(f64::NAN, 0.0), 1.0);
        assert_eq!(super::pow(0.0, -1.0), f64::INFINITY);
        assert!(super::pow(-8.0, 1.0 / 3.0).is_nan());
        assert_eq!(super::pow(0.9, 1e6), 0.0);
    }
}

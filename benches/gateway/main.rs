//! `cargo bench --bench gateway`: the gateway against the raw OpenCode floor.
//!
//! One real `opencode serve` (the pinned release, as the tests use it) answers both sides: the
//! release `opencode-mcp` binary, attached to it and driven over MCP stdio with rmcp's client,
//! and a direct reqwest client making the same HTTP calls. The LLM is the tests' scripted fake
//! on 127.0.0.1. Every comparative figure interleaves the two sides in the same run and is
//! reported as medians, p95s and the ratio of medians; see `benches/README.md` for the figures,
//! the knobs (`BENCH_*` environment variables) and a recorded run.
//!
//! Cargo builds the `opencode-mcp` binary for a bench in the bench profile (release settings)
//! and hands its path to this harness as `CARGO_BIN_EXE_opencode-mcp`, so `cargo bench` alone
//! measures a release gateway; the harness refuses a debug one. `BENCH_GATEWAY_BIN` measures
//! another build instead (e.g. a candidate fix built in a worktree).

#[path = "../../tests/support/mod.rs"]
mod support;

mod dashboard;
mod direct;
mod figures;
mod gw;
mod machine;
mod report;
mod sandbox;
mod scenarios;
mod sse;
mod stats;
mod surface;
mod tour;
mod workers;
mod worktree;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use serde_json::json;

use direct::Direct;
use gw::Gw;
use machine::Machine;
use report::{Figure, ScaleRow};
use scenarios::ms;
use sse::IdleWatch;
use stats::Summary;
use support::fake_llm::FakeLlm;
use support::isolation::OpenCodeEnv;
use support::mcp::Launch as Spawn;
use support::opencode_server::OpenCodeServer;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The gateway binary: `$BENCH_GATEWAY_BIN`, else the release build cargo made for this bench.
pub fn gateway_bin() -> PathBuf {
    std::env::var_os("BENCH_GATEWAY_BIN")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_opencode-mcp")))
}

/// How much to measure; every field has a `BENCH_*` override.
#[derive(Debug, Clone, Serialize)]
struct Knobs {
    quick: bool,
    /// Measured start_task/direct pairs (figures 1 and 2).
    start_pairs: usize,
    start_warmup: usize,
    /// Fake LLM delay for figures 1 and 2, ms.
    start_delay_ms: u64,
    cold_reps: usize,
    /// (concurrent tasks, repetitions per side).
    scale: Vec<(usize, usize)>,
    /// Fake LLM delay for the fan-out and scaling turns, ms.
    fan_delay_ms: u64,
    /// (tasks, repetitions per side) of the fan-out whose tasks each write a file.
    scale_writes: (usize, usize),
    rss_tasks: usize,
    busy_tasks: usize,
    long_secs: u64,
    idle_secs: u64,
    /// Files in the `worktree` scenario's repository, and creations timed per side.
    worktree_files: usize,
    worktree_reps: usize,
    /// Rounds of the `workers` scenario (on the `worktree` scenario's repository size).
    worker_reps: usize,
    /// The `fanout` scenario: tasks per round, slots per worker, rounds per side, and the
    /// seconds each task's agent sleeps (its wall-bound work).
    fanout_tasks: usize,
    fanout_slots: u32,
    fanout_reps: usize,
    fanout_work_secs: u64,
    /// The steady-rate soak: rounds, tasks per round, seconds per round, and how long a
    /// finished task stays in the soak gateway's memory (`limits.finished_in_memory`).
    soak_rounds: usize,
    soak_tasks: usize,
    soak_every_secs: u64,
    soak_in_memory_secs: u64,
    /// Rounds of the `tour` (every tool, as a host's session uses them).
    tour_rounds: usize,
    only: Option<BTreeSet<String>>,
}

/// The model `start_model` names: the fake's second one, so that it is not the server's default.
const START_MODEL: &str = "fake/fake-strong";

/// Scenario names for `BENCH_ONLY` (`footprint` is RSS and CPU; `worktree` is a task's git
/// worktree in a large repository, and `workers` a task's work moved to a worker (a real sshd on
/// 127.0.0.1) and back; neither needs OpenCode; `fanout` is tasks over three workers against
/// one, with their own gateway and OpenCode servers).
const SCENARIOS: [&str; 16] = [
    "surface",
    "sandbox",
    "start",
    "start_model",
    "cycle",
    "check_round",
    "scale",
    "scale_writes",
    "cold",
    "footprint",
    "worktree",
    "workers",
    "fanout",
    "tour",
    "soak",
    "dashboard",
];

fn env_num<T: std::str::FromStr>(name: &str, default: T) -> Result<T, BoxError> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .map_err(|_| format!("{name}={v} is not a number").into()),
        _ => Ok(default),
    }
}

impl Knobs {
    fn from_env() -> Result<Self, BoxError> {
        let quick = std::env::var("BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
        let q = |full: usize, quick_value: usize| if quick { quick_value } else { full };
        let default_scale = if quick {
            vec![(1, 3), (10, 2), (50, 2), (200, 1)]
        } else {
            vec![(1, 8), (10, 5), (50, 9), (200, 5)]
        };
        let default_writes = (50, q(3, 1));
        let scale = match std::env::var("BENCH_SCALE") {
            Ok(v) if !v.trim().is_empty() => parse_scale(&v, &default_scale)?,
            _ => default_scale,
        };
        let only = match std::env::var("BENCH_ONLY") {
            Ok(v) if !v.trim().is_empty() => {
                let set: BTreeSet<String> = v.split(',').map(|s| s.trim().to_string()).collect();
                if let Some(bad) = set.iter().find(|s| !SCENARIOS.contains(&s.as_str())) {
                    return Err(format!(
                        "BENCH_ONLY: unknown scenario `{bad}`; known: {}",
                        SCENARIOS.join(",")
                    )
                    .into());
                }
                Some(set)
            }
            _ => None,
        };
        Ok(Self {
            quick,
            start_pairs: env_num("BENCH_START_PAIRS", q(100, 12))?,
            start_warmup: 3,
            start_delay_ms: 150,
            cold_reps: env_num("BENCH_COLD_REPS", q(30, 10))?,
            scale,
            fan_delay_ms: 500,
            scale_writes: match std::env::var("BENCH_SCALE_WRITES") {
                Ok(v) if !v.trim().is_empty() => match parse_scale(&v, &[default_writes])?[..] {
                    [one] => one,
                    _ => return Err("BENCH_SCALE_WRITES: one `tasks[:reps]`".into()),
                },
                _ => default_writes,
            },
            rss_tasks: env_num("BENCH_RSS_TASKS", 1000)?,
            busy_tasks: 50,
            long_secs: env_num("BENCH_LONG_SECS", q(60, 10) as u64)?,
            idle_secs: env_num("BENCH_IDLE_SECS", q(10, 3) as u64)?,
            worktree_files: env_num("BENCH_WORKTREE_FILES", 10_000)?,
            worktree_reps: env_num("BENCH_WORKTREE_REPS", q(10, 5))?,
            worker_reps: env_num("BENCH_WORKER_REPS", q(6, 3))?,
            fanout_tasks: env_num("BENCH_FANOUT_TASKS", 30)?,
            fanout_slots: env_num("BENCH_FANOUT_SLOTS", 10)?,
            fanout_reps: env_num("BENCH_FANOUT_REPS", q(3, 1))?,
            fanout_work_secs: env_num("BENCH_FANOUT_WORK", 90)?,
            soak_rounds: env_num("BENCH_SOAK_ROUNDS", q(12, 6))?,
            soak_tasks: env_num("BENCH_SOAK_TASKS", q(300, 100))?,
            soak_every_secs: env_num("BENCH_SOAK_EVERY_SECS", q(60, 20) as u64)?,
            soak_in_memory_secs: env_num("BENCH_SOAK_IN_MEMORY_SECS", q(120, 30) as u64)?,
            tour_rounds: env_num("BENCH_TOUR_ROUNDS", q(10, 2))?,
            only,
        })
    }

    fn runs(&self, scenario: &str) -> bool {
        self.only.as_ref().is_none_or(|s| s.contains(scenario))
    }
}

/// `1,10,50,200` (default repetitions) or `1:8,10:5,...`.
fn parse_scale(text: &str, defaults: &[(usize, usize)]) -> Result<Vec<(usize, usize)>, BoxError> {
    text.split(',')
        .map(|item| {
            let item = item.trim();
            let (n, reps) = match item.split_once(':') {
                Some((n, r)) => (n.parse()?, r.parse()?),
                None => {
                    let n: usize = item.parse()?;
                    let reps = defaults
                        .iter()
                        .find(|(d, _)| *d == n)
                        .map_or(2, |(_, r)| *r);
                    (n, reps)
                }
            };
            Ok((n, reps))
        })
        .collect::<Result<_, std::num::ParseIntError>>()
        .map_err(|e| format!("BENCH_SCALE={text}: {e}").into())
}

/// The recorded run. It is written after every scenario, not only at the end, so a scenario that
/// fails (or a run stopped by hand) an hour in keeps what the earlier ones measured; `complete`
/// says whether the run got to its end.
#[derive(Serialize)]
struct Output<'a> {
    schema: u32,
    started_at: &'a str,
    complete: bool,
    duration_secs: f64,
    git: &'a str,
    gateway_bin: String,
    opencode_version: &'a str,
    machine: &'a Machine,
    knobs: &'a Knobs,
    figures: &'a [Figure],
    scaling: &'a [ScaleRow],
    extra: &'a serde_json::Map<String, serde_json::Value>,
}

impl Output<'_> {
    fn write(&self, path: &std::path::Path) -> Result<(), BoxError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, serde_json::to_string_pretty(self)? + "\n")?;
        Ok(())
    }
}

fn main() {
    // `cargo test --all-targets` runs a harness-less bench without `--bench`: do nothing then.
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!(
            "gateway bench: run it with `cargo bench --bench gateway` (nothing to do in test mode)"
        );
        return;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("gateway bench: cannot start a runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = runtime.block_on(run()) {
        eprintln!("gateway bench failed: {e}");
        std::process::exit(1);
    }
}

fn release_gateway() -> Result<PathBuf, BoxError> {
    let bin = gateway_bin();
    if !bin.is_file() {
        return Err(format!("the gateway binary {} is missing", bin.display()).into());
    }
    let in_debug = bin
        .parent()
        .and_then(|p| p.file_name())
        .is_some_and(|d| d == "debug");
    if in_debug || cfg!(debug_assertions) {
        return Err(format!(
            "{} is a debug build; run `cargo bench --bench gateway`, which builds the gateway in the release (bench) profile",
            bin.display()
        )
        .into());
    }
    Ok(bin)
}

fn now_iso() -> (String, String) {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    match chrono::DateTime::from_timestamp(secs, 0) {
        Some(t) => (
            t.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
            t.format("%Y%m%d-%H%M%S").to_string(),
        ),
        None => (secs.to_string(), secs.to_string()),
    }
}

fn out_path(stamp: &str) -> PathBuf {
    if let Some(p) = std::env::var_os("BENCH_OUT").filter(|v| !v.is_empty()) {
        return PathBuf::from(p);
    }
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .filter(|v| !v.is_empty())
        .map(|d| manifest.join(d))
        .unwrap_or_else(|| manifest.join("target"));
    target
        .join("bench-results")
        .join(format!("gateway-{stamp}.json"))
}

fn step(what: &str) {
    eprintln!("[bench] {what}");
}

async fn run() -> Result<(), BoxError> {
    let knobs = Knobs::from_env()?;
    let bin = release_gateway()?;
    let run_started = Instant::now();
    let (started_at, stamp) = now_iso();
    let mut machine = Machine::read();
    let opencode_version = support::opencode_bin::pinned_version();
    println!("# opencode-mcp gateway benchmark ({started_at})");
    println!(
        "machine: {} CPU(s), {}, {} MiB RAM, Linux {}, load average {}",
        machine.nproc,
        machine.cpu_model,
        machine.mem_total_mb,
        machine.kernel,
        machine.loadavg_at_start
    );
    let git = machine::git_describe();
    let path = out_path(&stamp);
    println!(
        "gateway: {} ({git}); OpenCode {opencode_version}; quick={}",
        bin.display(),
        knobs.quick
    );
    println!("JSON (written after each scenario): {}", path.display());
    // Written after each scenario with `complete: false`, and once more at the end.
    let save = |out: &figures::Collected, machine: &Machine, complete: bool| {
        Output {
            schema: 1,
            started_at: &started_at,
            complete,
            duration_secs: ms(run_started.elapsed()) / 1000.0,
            git: &git,
            gateway_bin: bin.display().to_string(),
            opencode_version: &opencode_version,
            machine,
            knobs: &knobs,
            figures: &out.figures,
            scaling: &out.scaling,
            extra: &out.extra,
        }
        .write(&path)
    };

    let mut out = figures::Collected::default();
    // What ships: the binary, and what a download of it weighs (gzip -9 of the binary, as the
    // npm platform tarball carries it, less the tar headers and package.json).
    figures::binary_size(&mut out, &bin);
    // First, while no OpenCode runs: it is git and the disk alone.
    if knobs.runs("worktree") {
        step(&format!(
            "worktree: {} files, {} creations per side",
            knobs.worktree_files, knobs.worktree_reps
        ));
        let w = worktree::worktree_creation(knobs.worktree_files, knobs.worktree_reps).await?;
        figures::worktree(&mut out, &w);
        save(&out, &machine, false)?;
    }

    if knobs.runs("workers") {
        step(&format!(
            "workers: {} files to a worker over ssh and back, {} rounds",
            knobs.worktree_files, knobs.worker_reps
        ));
        let w = workers::worker_moves(knobs.worktree_files, knobs.worker_reps).await?;
        figures::workers(&mut out, &w);
        save(&out, &machine, false)?;
    }
    if knobs.runs("fanout") {
        step(&format!(
            "fanout: {} tasks (`sleep {}`) over three workers against one, {} slots each, {} rounds per side",
            knobs.fanout_tasks, knobs.fanout_work_secs, knobs.fanout_slots, knobs.fanout_reps
        ));
        let f = workers::worker_fanout(
            knobs.fanout_tasks,
            knobs.fanout_slots,
            knobs.fanout_reps,
            knobs.fanout_work_secs,
        )
        .await?;
        figures::fanout(&mut out, &f);
        save(&out, &machine, false)?;
    }

    let needs_opencode = SCENARIOS
        .iter()
        .any(|s| !["worktree", "workers", "fanout"].contains(s) && knobs.runs(s));
    if needs_opencode {
        step("starting the fake LLM and OpenCode");
        let fake = FakeLlm::start();
        let env = OpenCodeEnv::new();
        let server = OpenCodeServer::start(&env, &fake.url()).await;
        let work_dir = env.work_dir().display().to_string();
        let watch = IdleWatch::connect(server.url(), server.password()).await?;
        let direct = Direct::new(server.url(), server.password(), &work_dir)?;
        // BENCH_STATE_ROOT puts the gateways' task stores elsewhere (e.g. on tmpfs, to see what
        // their fsyncs cost); by default they live in the isolated env's temp dir.
        let state_root = std::env::var_os("BENCH_STATE_ROOT")
            .filter(|v| !v.is_empty())
            .map(|r| PathBuf::from(r).join(format!("opencode-mcp-bench-{}", std::process::id())))
            .unwrap_or_else(|| env.root().join("bench-state"));
        let state = |name: &str| state_root.join(name);
        println!("task stores under {}", state_root.display());
        let launch = gw::launch(&env, &fake.url(), &server, &state("main"));
        let footprint_launch = gw::launch(&env, &fake.url(), &server, &state("footprint"));
        let cold_launch = gw::launch(&env, &fake.url(), &server, &state("cold"));
        // The soak's gateway logs each eviction and give-back of freed memory (the soak reads
        // its rounds at those points).
        let soak_launch = gw::launch(&env, &fake.url(), &server, &state("soak"))
            .env(
                "OPENCODE_MCP_LIMITS__FINISHED_IN_MEMORY",
                format!("{}s", knobs.soak_in_memory_secs),
            )
            .env(
                "OPENCODE_MCP_LOG",
                "warn,opencode_mcp=info,rmcp=warn,opencode_mcp::memory=debug,opencode_mcp::tasks::housekeeping=debug",
            );
        let gateway = Gw::start(&launch).await?;
        let gateway_cpu_at_start = machine::cpu_seconds(gateway.pid).unwrap_or(0.0);

        // OpenCode's first turn in a directory loads its plugins and agents; keep that out.
        step("warming up");
        for i in 0..3 {
            let prompt = format!("bench warmup {i}");
            let s = direct
                .start(&direct::gateway_title(&prompt), &prompt)
                .await?;
            watch.wait_all(&[s], Duration::from_secs(120)).await?;
            let t = gateway.start_task(&prompt).await?;
            gateway
                .wait_all(&[t.task_id], Duration::from_secs(120))
                .await?;
        }

        let mut cold_empty: Option<Summary> = None;

        // `start_model` is the same round trip naming a model, which the gateway checks against
        // the server's catalog before the prompt goes out. The two run interleaved.
        let models: Vec<Option<&str>> = [("start", None), ("start_model", Some(START_MODEL))]
            .into_iter()
            .filter(|(scenario, _)| knobs.runs(scenario))
            .map(|(_, model)| model)
            .collect();
        if !models.is_empty() {
            step(&format!(
                "start_task round trip ({}): {} pairs each, interleaved",
                models
                    .iter()
                    .map(|m| m.map_or("completion noticed too".into(), |m| format!("model {m}")))
                    .collect::<Vec<_>>()
                    .join("; "),
                knobs.start_pairs
            ));
            let results = scenarios::start_round_trips(
                &gateway,
                &direct,
                &watch,
                knobs.start_warmup,
                knobs.start_pairs,
                knobs.start_delay_ms,
                &models,
            )
            .await?;
            for (model, r) in models.iter().zip(&results) {
                match model {
                    None => figures::start(&mut out, r),
                    Some(_) => figures::start_model(&mut out, r),
                }
            }
            save(&out, &machine, false)?;
        }

        if knobs.runs("cycle") {
            step("orchestrator cycle: calls and characters of results per delegated task");
            let c = scenarios::orchestrator_cycle(&gateway, 5).await?;
            figures::cycle(&mut out, &c);
            save(&out, &machine, false)?;
        }

        if knobs.runs("sandbox") {
            let reps = if knobs.quick { 3 } else { 10 };
            step(&format!(
                "sandbox: a task of {} commands and one check, confined against unconfined, {reps} pairs",
                sandbox::COMMANDS
            ));
            let c = sandbox::sandbox(&env, &fake.url(), &state_root, reps).await?;
            figures::sandbox(&mut out, &c);
            save(&out, &machine, false)?;
        }

        if knobs.runs("check_round") {
            let reps = if knobs.quick { 3 } else { 10 };
            step(&format!(
                "check round: a task whose check fails once against one without checks, {reps} pairs"
            ));
            let root = env.work_dir().join("check-rounds");
            let c = scenarios::check_round(&gateway, &fake, &root, reps).await?;
            figures::check_round(&mut out, &c);
            save(&out, &machine, false)?;
        }

        if knobs.runs("scale") {
            for &(n, reps) in &knobs.scale {
                step(&format!(
                    "fan-out: {n} concurrent tasks, {reps} rep(s) per side"
                ));
                let f = scenarios::fan_out(
                    &gateway,
                    &direct,
                    &watch,
                    n,
                    reps,
                    knobs.fan_delay_ms,
                    None,
                    server.pid(),
                )
                .await?;
                figures::fan_out(&mut out, n, reps, knobs.fan_delay_ms, &f);
                save(&out, &machine, false)?;
            }
        }

        if knobs.runs("scale_writes") {
            let (n, reps) = knobs.scale_writes;
            step(&format!(
                "fan-out: {n} concurrent tasks writing a file each, {reps} rep(s) per side"
            ));
            // In a git repository of its own: only there does OpenCode list changed files.
            let repo = env.work_dir().join("writes-repo");
            support::git::init_repo(&repo, &[("README", "bench\n")]);
            let repo_dir = repo.display().to_string();
            let in_repo = Direct::new(server.url(), server.password(), &repo_dir)?;
            // OpenCode's first turn in a directory loads its plugins and agents; keep that out.
            let prompt = "bench warmup writes-repo";
            let s = in_repo
                .start(&direct::gateway_title(prompt), prompt)
                .await?;
            watch.wait_all(&[s], Duration::from_secs(120)).await?;
            let t = gateway.start_task_in(prompt, Some(&repo_dir)).await?;
            gateway
                .wait_all(&[t.task_id], Duration::from_secs(120))
                .await?;
            let f = scenarios::fan_out(
                &gateway,
                &in_repo,
                &watch,
                n,
                reps,
                knobs.fan_delay_ms,
                Some(&repo_dir),
                server.pid(),
            )
            .await?;
            figures::fan_out_writes(&mut out, n, reps, knobs.fan_delay_ms, &f);
            save(&out, &machine, false)?;
        }

        if knobs.runs("dashboard") {
            let (records, reps) = if knobs.quick { (200, 3) } else { (1_000, 10) };
            step(&format!(
                "dashboard: a change shown on an open page ({reps} reps), a page of {records} stored tasks"
            ));
            let d = dashboard::measure(records, reps).await?;
            figures::dashboard(&mut out, &d);
            save(&out, &machine, false)?;
        }

        if knobs.runs("surface") {
            step("surface: what a host's model reads on every request (tools/list, instructions)");
            let s = surface::measure(&cold_launch).await?;
            figures::surface(&mut out, &s);
            save(&out, &machine, false)?;
        }

        if knobs.runs("cold") {
            // Measuring another build (the shipped, statically linked one): the binary
            // `cargo build --release` makes from this tree, which is what `cargo install` gives,
            // is measured beside it, interleaved.
            let built = PathBuf::from(env!("CARGO_BIN_EXE_opencode-mcp"));
            let mut launches = vec![cold_launch.clone()];
            if built != gateway_bin() {
                launches.push(cold_launch.clone().bin(&built));
            }
            step(&format!(
                "cold start: {} reps{}",
                knobs.cold_reps,
                match launches.len() {
                    1 => String::new(),
                    _ => format!(
                        ", with this tree's cargo build ({}) beside it",
                        built.display()
                    ),
                }
            ));
            let (g, t) = scenarios::cold_starts(&launches, knobs.cold_reps).await?;
            cold_empty = Some(figures::cold_start(&mut out, &g[0], &t));
            if let Some(built) = g.get(1) {
                figures::cold_start_cargo_build(&mut out, built, &t);
            }
            save(&out, &machine, false)?;
        }

        if knobs.runs("footprint") {
            let window = Duration::from_secs(knobs.long_secs);
            step(&format!(
                "footprint: RSS idle and with {} tasks; CPU with {} streaming tasks for {} s (twice: direct, gateway)",
                knobs.rss_tasks, knobs.busy_tasks, knobs.long_secs
            ));
            let f = scenarios::footprint(
                &footprint_launch,
                &direct,
                &fake,
                server.pid(),
                knobs.rss_tasks,
                knobs.busy_tasks,
                window,
                Duration::from_secs(knobs.idle_secs),
            )
            .await?;
            figures::footprint(&mut out, &f);
            save(&out, &machine, false)?;
        }

        // Start-up loads the whole task store before answering `initialize`: measure it with the
        // footprint gateway's records (its tracked tasks plus the busy ones) in place.
        if knobs.runs("cold") && knobs.runs("footprint") {
            let stored = std::fs::read_dir(state("footprint").join("tasks"))
                .map(|d| d.count())
                .unwrap_or(0);
            step(&format!(
                "cold start with {stored} stored tasks: {} reps",
                knobs.cold_reps
            ));
            // The empty store again, right before, so both ran under the same load (the first
            // cold start ran minutes earlier, on a quieter machine or a busier one).
            let (empty, _) = scenarios::cold_start(&cold_launch, knobs.cold_reps).await?;
            let empty = Some(Summary::of(&empty)).or(cold_empty);
            let (g, t) = scenarios::cold_start(&footprint_launch, knobs.cold_reps).await?;
            figures::cold_start_stored(&mut out, stored, empty, &g, &t);
            // The same store read by the usage report and the task list, its tasks out of
            // memory (they leave it a second after they finished).
            step(&format!("list_tasks and usage over {stored} stored tasks"));
            let reads = scenarios::stored_reads(
                &footprint_launch
                    .clone()
                    .env("OPENCODE_MCP_LIMITS__FINISHED_IN_MEMORY", "1s"),
                stored,
                5,
            )
            .await?;
            figures::stored_reads(&mut out, &reads);
            save(&out, &machine, false)?;
        }

        // A fresh gateway with its own OpenCode, taken through every tool: by a host that
        // speaks the classic protocol, then by one that speaks 2026-07-28 with tasks.
        if knobs.runs("tour") {
            for (host, tasks) in [("classic", false), ("tasks", true)] {
                step(&format!(
                    "tour ({host} host): {} rounds of every tool on a fresh gateway with its own OpenCode",
                    knobs.tour_rounds
                ));
                let repo = env.work_dir().join(format!("tour-{host}"));
                support::git::init_repo(
                    &repo,
                    &[("README", "tour\n"), ("delegation.yaml", tour::DELEGATION)],
                );
                let launch = Spawn::new(&repo, &env.home_dir())
                    .bin(gateway_bin())
                    .envs(env.vars(&fake.url()))
                    .env(
                        "OPENCODE_MCP_OPENCODE__COMMAND",
                        support::opencode_bin::opencode_bin(),
                    )
                    .env("OPENCODE_MCP_STATE_DIR", state(&format!("tour-{host}")))
                    .env("OPENCODE_MCP_LOG", "warn")
                    .unchecked();
                let launch = if tasks { launch.modern(true) } else { launch };
                let t = tour::tour(&launch, &repo, knobs.tour_rounds, tasks).await?;
                figures::tour(&mut out, &t, tasks);
                save(&out, &machine, false)?;
            }
        }

        // A gateway that works at a steady rate for longer than its finished tasks stay in
        // memory: its RSS must stop growing once they start leaving.
        if knobs.runs("soak") {
            step(&format!(
                "soak: {} rounds of {} tasks, one every {} s; finished tasks leave memory after {} s",
                knobs.soak_rounds, knobs.soak_tasks, knobs.soak_every_secs, knobs.soak_in_memory_secs
            ));
            let rounds = scenarios::soak(
                &soak_launch,
                knobs.soak_rounds,
                knobs.soak_tasks,
                Duration::from_secs(knobs.soak_every_secs),
                Duration::from_secs(knobs.soak_in_memory_secs),
            )
            .await?;
            figures::soak(
                &mut out,
                &rounds,
                knobs.soak_tasks,
                knobs.soak_every_secs,
                knobs.soak_in_memory_secs,
            );
        }

        // The main gateway after everything: how much it grew and burned over the run.
        if let Some((rss, hwm)) = machine::rss_mb(gateway.pid) {
            out.extra.insert(
                "main_gateway_end".into(),
                json!({
                    "rss_mib": rss, "hwm_mib": hwm,
                    "cpu_secs": machine::cpu_seconds(gateway.pid).unwrap_or(0.0) - gateway_cpu_at_start,
                }),
            );
        }
        gateway.client.close().await?;
        if !state_root.starts_with(env.root()) {
            let _ = std::fs::remove_dir_all(&state_root);
        }
    }

    machine.loadavg_at_end = machine::loadavg();
    let duration = run_started.elapsed();
    println!();
    println!("{}", report::figures_table(&out.figures));
    for f in out.figures.iter().filter(|f| !f.note.is_empty()) {
        println!("- {}: {}", f.title, f.note);
    }
    if !out.scaling.is_empty() {
        println!();
        println!("scaling (ms; \"started\" = all start acknowledgements in, \"all done\" = completion known to the client):");
        println!();
        println!("{}", report::scaling_table(&out.scaling));
    }
    println!(
        "load average at end {}; run took {:.0} s",
        machine.loadavg_at_end,
        duration.as_secs_f64()
    );
    save(&out, &machine, true)?;
    println!("JSON: {}", path.display());
    Ok(())
}

//! The measured scenarios. Every comparative one interleaves the gateway and the direct
//! baseline (alternating which goes first) on the same OpenCode, so drift on a shared machine
//! hits both sides alike.

use std::process::Stdio;
use std::time::{Duration, Instant};

use futures::future::join_all;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use crate::direct::{gateway_title, Direct};
use crate::gw::{check_completed, Gw};
use crate::machine::{cpu_seconds, rss_mb, rss_split_mb};
use crate::sse::IdleWatch;
use crate::support::fake_llm::FakeLlm;
use crate::support::mcp::Launch as Spawn;
use crate::BoxError;

/// Pause after each measured turn so OpenCode's post-turn work does not spill into the next.
const SETTLE: Duration = Duration::from_millis(30);
/// Bound on any one turn or fan-out finishing.
const FINISH_LIMIT: Duration = Duration::from_secs(300);

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// `b - a` in ms, negative when `b` came first.
fn signed_ms(a: Instant, b: Instant) -> f64 {
    if b >= a {
        ms(b - a)
    } else {
        -ms(a - b)
    }
}

// ---------------------------------------------------------------------------------------------
// 4. Cold start

const INITIALIZE: &str = concat!(
    r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","#,
    r#""capabilities":{},"clientInfo":{"name":"opencode-mcp-bench","version":"0"}}}"#,
    "\n"
);

/// exec → `initialize` reply on stdout, and exec → end of stdout of `true` (its exit), `reps`
/// times each, interleaved.
pub async fn cold_start(launch: &Spawn, reps: usize) -> Result<(Vec<f64>, Vec<f64>), BoxError> {
    let (mut gateways, empty) = cold_starts(std::slice::from_ref(launch), reps).await?;
    Ok((gateways.pop().unwrap_or_default(), empty))
}

/// [`cold_start`] for several launches (builds) at once: each round starts every launch and
/// `true` once, in an order that rotates, so that the builds are compared over the same minutes
/// of a machine whose `true` alone moved between 0.75 and 2.75 ms across runs.
pub async fn cold_starts(
    launches: &[Spawn],
    reps: usize,
) -> Result<(Vec<Vec<f64>>, Vec<f64>), BoxError> {
    const WARMUP: usize = 2;
    let mut gateways: Vec<Vec<f64>> = launches.iter().map(|_| Vec::new()).collect();
    let mut empty = Vec::new();
    // Slot `launches.len()` is `true`.
    let slots = launches.len() + 1;
    for i in 0..WARMUP + reps {
        for k in 0..slots {
            let slot = (i + k) % slots;
            let elapsed = match launches.get(slot) {
                Some(launch) => cold_gateway(launch).await?,
                None => cold_true().await?,
            };
            if i >= WARMUP {
                match gateways.get_mut(slot) {
                    Some(samples) => samples.push(elapsed),
                    None => empty.push(elapsed),
                }
            }
        }
    }
    Ok((gateways, empty))
}

async fn cold_gateway(launch: &Spawn) -> Result<f64, BoxError> {
    let mut cmd = launch.command();
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let t0 = Instant::now();
    let mut child = cmd.spawn()?;
    let mut stdin = child.stdin.take().ok_or("no stdin")?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    stdin.write_all(INITIALIZE.as_bytes()).await?;
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .map_err(|_| "no initialize reply within 10 s")??
        .ok_or("the gateway closed stdout before replying")?;
    let elapsed = ms(t0.elapsed());
    if !line.contains(r#""id":1"#) || !line.contains(r#""result""#) {
        return Err(format!("unexpected initialize reply: {line:.300}").into());
    }
    // Closing stdin ends the session; the gateway exits on its own.
    drop(stdin);
    if tokio::time::timeout(Duration::from_secs(5), child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
    Ok(elapsed)
}

fn true_bin() -> Result<std::path::PathBuf, BoxError> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("true"))
        .find(|p| p.is_file())
        .ok_or_else(|| "`true` is not on PATH".into())
}

async fn cold_true() -> Result<f64, BoxError> {
    // Timed like the gateway: until something arrives on its stdout, here the end of file when
    // `true` exits (reaping the child goes through a signal and is not what is compared).
    // An absolute path, like the gateway's: with a changed PATH and a bare name, std falls back
    // from posix_spawn to fork + exec, which costs milliseconds in this large process.
    let mut cmd = tokio::process::Command::new(true_bin()?);
    cmd.env_clear()
        .envs(std::env::var_os("PATH").map(|p| ("PATH", p)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let t0 = Instant::now();
    let mut child = cmd.spawn()?;
    let mut stdout = child.stdout.take().ok_or("no stdout")?;
    let mut sink = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stdout.read_to_end(&mut sink))
        .await
        .map_err(|_| "`true` did not exit within 10 s")??;
    let elapsed = ms(t0.elapsed());
    if !child.wait().await?.success() {
        return Err("`true` failed".into());
    }
    Ok(elapsed)
}

// ---------------------------------------------------------------------------------------------
// 1 + 2. start_task round trip, and completion noticed

#[derive(Default)]
pub struct StartResults {
    pub gateway_ms: Vec<f64>,
    pub direct_ms: Vec<f64>,
    /// `session.idle` on the wire → `wait_for_task` returned, ms (negative: the gateway's reply
    /// came first, which happens because it also reacts to `session.status idle`).
    pub noticed_ms: Vec<f64>,
    /// Samples dropped because the wait was sent after the idle had already arrived.
    pub noticed_dropped: usize,
    /// The floor for noticing: `session.idle` on the wire → the two reads the gateway's
    /// completion check makes, answered to a direct client, ms.
    pub confirm_ms: Vec<f64>,
}

/// `pairs` measured pairs (after `warmup` unmeasured ones) of one gateway `start_task` and one
/// direct create + prompt, for each of `models` (`None`: the server's default; a model: both
/// sides run on it, and the gateway checks it against the server's catalog first), with one
/// [`StartResults`] per entry of `models`. The scenarios are interleaved, a pair of each per
/// round in an order that rotates, so that each sees the same minutes of a shared machine and
/// their rows can be compared with each other, not only with their baselines. Within a pair the
/// side that goes first alternates. The fake LLM answers after `delay_ms`, so the turn's own
/// work never overlaps the measured calls; every turn is waited out (unmeasured for the start
/// figure) before the next call.
#[allow(clippy::too_many_arguments)]
pub async fn start_round_trips(
    gw: &Gw,
    direct: &Direct,
    watch: &IdleWatch,
    warmup: usize,
    pairs: usize,
    delay_ms: u64,
    models: &[Option<&str>],
) -> Result<Vec<StartResults>, BoxError> {
    let mut results: Vec<StartResults> = models.iter().map(|_| StartResults::default()).collect();
    for i in 0..warmup + pairs {
        let measured = i >= warmup;
        for k in 0..models.len() {
            let which = (i + k) % models.len();
            let (model, r) = (models[which], &mut results[which]);
            for gateway_side in [i % 2 == 0, i % 2 != 0] {
                if gateway_side {
                    let prompt = format!("bench start gateway {i}.{which} [[delay:{delay_ms}]]");
                    let (start, noticed) = gateway_turn(gw, watch, &prompt, model).await?;
                    if measured {
                        r.gateway_ms.push(start);
                        match noticed {
                            Some(n) => r.noticed_ms.push(n),
                            None => r.noticed_dropped += 1,
                        }
                    }
                } else {
                    let prompt = format!("bench start direct {i}.{which} [[delay:{delay_ms}]]");
                    let t0 = Instant::now();
                    let session = direct
                        .start_on(&gateway_title(&prompt), &prompt, model)
                        .await?;
                    let elapsed = ms(t0.elapsed());
                    let idle = watch
                        .wait_all(std::slice::from_ref(&session), FINISH_LIMIT)
                        .await?;
                    direct.confirm(&session).await?;
                    let confirmed = Instant::now();
                    if measured {
                        r.direct_ms.push(elapsed);
                        r.confirm_ms.push(signed_ms(idle, confirmed));
                    }
                }
                tokio::time::sleep(SETTLE).await;
            }
        }
    }
    Ok(results)
}

/// One gateway turn: the timed `start_task`, then a pending `wait_for_task` whose return is
/// compared with our own stream's `session.idle`.
async fn gateway_turn(
    gw: &Gw,
    watch: &IdleWatch,
    prompt: &str,
    model: Option<&str>,
) -> Result<(f64, Option<f64>), BoxError> {
    let t0 = Instant::now();
    let started = gw.start_task_on(prompt, model).await?;
    let start_ms = ms(t0.elapsed());
    let handle = gw
        .client
        .start_call(
            "opencode_wait_for_task",
            json!({ "task_ids": [started.task_id], "mode": "all", "timeout_ms": 20_000 }),
        )
        .await?;
    let sent = Instant::now();
    let reply = gw
        .client
        .await_call("opencode_wait_for_task", handle, Duration::from_secs(30))
        .await?;
    let returned = Instant::now();
    if reply.is_error || reply.structured["done"] != true {
        return Err(format!("wait_for_task did not finish the task: {}", reply.text).into());
    }
    check_completed(reply.structured)?;
    // Our stream and the gateway's carry the same frame; ours may read it a moment later.
    let idle = watch
        .wait_all(
            std::slice::from_ref(&started.session_id),
            Duration::from_secs(5),
        )
        .await?;
    let noticed = (idle > sent).then(|| signed_ms(idle, returned));
    Ok((start_ms, noticed))
}

// ---------------------------------------------------------------------------------------------
// 3 + 7. Fan-out and scaling

#[derive(Debug, Default, Clone)]
pub struct FanOut {
    /// From the first call to the last start acknowledged, ms.
    pub gateway_started: Vec<f64>,
    pub direct_started: Vec<f64>,
    /// From the first call to "all finished" known to the client, ms.
    pub gateway_total: Vec<f64>,
    pub direct_total: Vec<f64>,
    /// Gateway CPU time per gateway repetition, ms.
    pub gateway_cpu_ms: Vec<f64>,
    /// OpenCode's CPU seconds in the quiet second before each side's batch, in run order.
    pub opencode_quiet_secs: Vec<f64>,
}

/// `n` tasks started at once and waited for, `reps` times on each side, interleaved. The fake
/// LLM answers every turn after `delay_ms`. Each batch starts once OpenCode has been quiet for
/// a second: after the last `session.idle` of a batch OpenCode still works on it (titles,
/// snapshots, summaries). With a fixed pause of 0.3 s instead, one run's pairs of 200-task
/// batches had the gateway at 1.19-1.22x the direct side when it ran second, and at 0.91-1.06x
/// when it ran first.
///
/// With `writes_in`, a git repository (`direct` must work in the same one), every task runs
/// there and first writes a file of its own (a `write` tool call, then the answer): the gateway
/// then reads each turn's changed files from OpenCode, in the background, while the direct side
/// reads nothing. What those reads cost the turns still running shows. (OpenCode lists changed
/// files only in a git repository; elsewhere the gateway reads none.)
#[allow(clippy::too_many_arguments)]
pub async fn fan_out(
    gw: &Gw,
    direct: &Direct,
    watch: &IdleWatch,
    n: usize,
    reps: usize,
    delay_ms: u64,
    writes_in: Option<&str>,
    opencode_pid: u32,
) -> Result<FanOut, BoxError> {
    let mut r = FanOut::default();
    let writes = writes_in.is_some();
    let kind = if writes { "fanw" } else { "fan" };
    for rep in 0..reps {
        for gateway_side in [rep % 2 == 0, rep % 2 != 0] {
            let prompts: Vec<String> = (0..n)
                .map(|k| {
                    let side = if gateway_side { "gateway" } else { "direct" };
                    let write = if writes {
                        format!(" [[write:bench-{kind}/{n}-{side}-{rep}-{k}.txt:{k}]]")
                    } else {
                        String::new()
                    };
                    format!("bench {kind} {n} {side} {rep} {k} [[delay:{delay_ms}]]{write}")
                })
                .collect();
            r.opencode_quiet_secs.push(quiet_cpu(opencode_pid).await?);
            if gateway_side {
                let cpu0 = cpu(gw.pid, "gateway")?;
                let t0 = Instant::now();
                let starts = join_all(prompts.iter().map(|p| gw.start_task_in(p, writes_in))).await;
                let started = ms(t0.elapsed());
                let ids = starts
                    .into_iter()
                    .map(|s| s.map(|s| s.task_id))
                    .collect::<Result<Vec<_>, _>>()?;
                gw.wait_all(&ids, FINISH_LIMIT).await?;
                r.gateway_started.push(started);
                r.gateway_total.push(ms(t0.elapsed()));
                r.gateway_cpu_ms
                    .push((cpu(gw.pid, "gateway")? - cpu0) * 1000.0);
            } else {
                let t0 = Instant::now();
                let starts = join_all(
                    prompts
                        .iter()
                        .map(|p| async move { direct.start(&gateway_title(p), p).await }),
                )
                .await;
                let started = ms(t0.elapsed());
                let sessions = starts.into_iter().collect::<Result<Vec<_>, _>>()?;
                watch.wait_all(&sessions, FINISH_LIMIT).await?;
                r.direct_started.push(started);
                r.direct_total.push(ms(t0.elapsed()));
            }
        }
    }
    Ok(r)
}

// ---------------------------------------------------------------------------------------------
// 5 + 6. Memory and CPU

#[derive(Debug, Default, Clone)]
pub struct Footprint {
    /// VmRSS readings, MiB: right after `initialize`, after attaching (idle), with the tasks.
    pub rss_initialized: Vec<f64>,
    pub rss_idle: Vec<f64>,
    pub rss_loaded: Vec<f64>,
    pub hwm_loaded: f64,
    /// (anonymous, file-backed) MiB at each of the three readings.
    pub split_initialized: (f64, f64),
    pub split_idle: (f64, f64),
    pub split_loaded: (f64, f64),
    pub tracked_tasks: usize,
    /// Seconds taken to run the tracked tasks (batches of 50).
    pub load_secs: f64,
    /// Gateway and OpenCode CPU seconds over an idle window of `idle_window_secs`.
    pub idle_cpu_secs: f64,
    pub opencode_idle_cpu_secs: f64,
    pub idle_window_secs: f64,
    /// Gateway CPU seconds while `busy_tasks` streamed slowly for `window_secs`.
    pub busy_tasks: usize,
    pub window_secs: f64,
    pub gateway_cpu_secs: f64,
    /// OpenCode's CPU over the same window with the gateway driving the tasks, and over an
    /// equal window (just before) with the same tasks driven directly: what the gateway's
    /// subscription and polling cost OpenCode shows as the difference.
    pub opencode_cpu_gateway_secs: f64,
    pub opencode_cpu_direct_secs: f64,
    /// OpenCode's CPU in the last second before the direct and the gateway window.
    pub opencode_before_direct_secs: f64,
    pub opencode_before_gateway_secs: f64,
}

async fn rss_samples(pid: u32) -> Result<Vec<f64>, BoxError> {
    let mut v = Vec::new();
    for _ in 0..5 {
        v.push(rss_mb(pid).ok_or("cannot read the gateway's VmRSS")?.0);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(v)
}

fn split(pid: u32) -> Result<(f64, f64), BoxError> {
    rss_split_mb(pid).ok_or_else(|| "cannot read the gateway's RssAnon/RssFile".into())
}

fn cpu(pid: u32, what: &str) -> Result<f64, BoxError> {
    cpu_seconds(pid).ok_or_else(|| format!("cannot read /proc/{pid}/stat ({what})").into())
}

/// A fresh gateway: RSS idle, RSS with `tasks` tracked (finished) tasks, then CPU while
/// `busy` tasks stream slowly for `window`, after the same `busy` turns driven directly.
#[allow(clippy::too_many_arguments)]
pub async fn footprint(
    launch: &Spawn,
    direct: &Direct,
    fake: &FakeLlm,
    opencode_pid: u32,
    tasks: usize,
    busy: usize,
    window: Duration,
    idle_window: Duration,
) -> Result<Footprint, BoxError> {
    let mut f = Footprint::default();
    let client = Gw::connect(launch).await?;
    let pid = client.pid().ok_or("the gateway has no pid")?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    f.rss_initialized = rss_samples(pid).await?;
    f.split_initialized = split(pid)?;
    let gateway = Gw::attach(client).await?;
    let gw = &gateway;
    tokio::time::sleep(Duration::from_secs(1)).await;
    f.rss_idle = rss_samples(pid).await?;
    f.split_idle = split(pid)?;

    let (c0, o0) = (cpu(pid, "gateway")?, cpu(opencode_pid, "opencode")?);
    tokio::time::sleep(idle_window).await;
    f.idle_cpu_secs = cpu(pid, "gateway")? - c0;
    f.opencode_idle_cpu_secs = cpu(opencode_pid, "opencode")? - o0;
    f.idle_window_secs = idle_window.as_secs_f64();

    let t0 = Instant::now();
    run_in_batches(gw, tasks, |k| format!("bench rss {k}")).await?;
    f.load_secs = t0.elapsed().as_secs_f64();
    f.tracked_tasks = tasks;
    tokio::time::sleep(Duration::from_secs(1)).await;
    f.rss_loaded = rss_samples(pid).await?;
    f.split_loaded = split(pid)?;
    f.hwm_loaded = rss_mb(pid).map(|(_, hwm)| hwm).unwrap_or(0.0);

    // CPU: `busy` turns whose answers stream slowly through the whole window, driven directly
    // first, then through the gateway (after the load above, OpenCode settles first).
    f.busy_tasks = busy;
    f.window_secs = window.as_secs_f64();
    let slow_ms = window.as_millis() as u64 + 20_000;
    let prompt = |side: &str, k: usize| format!("bench cpu {side} {k} [[slow:{slow_ms}]]");
    tokio::time::sleep(Duration::from_secs(5)).await;
    f.opencode_before_direct_secs = quiet_cpu(opencode_pid).await?;

    let sessions = join_all((0..busy).map(|k| {
        let p = prompt("direct", k);
        async move { direct.start(&gateway_title(&p), &p).await }
    }))
    .await
    .into_iter()
    .collect::<Result<Vec<_>, _>>()?;
    for s in &sessions {
        wait_llm_request(fake, s).await;
    }
    let o0 = cpu(opencode_pid, "opencode")?;
    tokio::time::sleep(window).await;
    f.opencode_cpu_direct_secs = cpu(opencode_pid, "opencode")? - o0;
    for r in join_all(sessions.iter().map(|s| direct.abort(s))).await {
        r?;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    f.opencode_before_gateway_secs = quiet_cpu(opencode_pid).await?;

    let starts = join_all((0..busy).map(|k| {
        let p = prompt("gateway", k);
        async move { gw.start_task(&p).await }
    }))
    .await
    .into_iter()
    .collect::<Result<Vec<_>, _>>()?;
    for s in &starts {
        wait_llm_request(fake, &s.session_id).await;
    }
    let (g0, o0) = (cpu(pid, "gateway")?, cpu(opencode_pid, "opencode")?);
    tokio::time::sleep(window).await;
    let (g1, o1) = (cpu(pid, "gateway")?, cpu(opencode_pid, "opencode")?);
    f.gateway_cpu_secs = g1 - g0;
    f.opencode_cpu_gateway_secs = o1 - o0;
    for r in join_all(
        starts
            .iter()
            .map(|s| gw.ok("opencode_cancel_task", json!({ "task_id": s.task_id }))),
    )
    .await
    {
        r?;
    }
    gateway.client.close().await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok(f)
}

/// Waits (at most [`QUIET_MAX`]) until OpenCode has been quiet for a second, so that leftovers
/// of earlier work (aborted turns, garbage collection) do not land in a CPU window; returns the
/// CPU seconds of its last quiet second.
async fn quiet_cpu(opencode_pid: u32) -> Result<f64, BoxError> {
    let deadline = Instant::now() + QUIET_MAX;
    loop {
        let o0 = cpu(opencode_pid, "opencode")?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let used = cpu(opencode_pid, "opencode")? - o0;
        if used <= 0.03 || Instant::now() >= deadline {
            return Ok(used);
        }
    }
}

/// The longest wait for OpenCode to go quiet before a CPU window.
const QUIET_MAX: Duration = Duration::from_secs(15);

async fn wait_llm_request(fake: &FakeLlm, session_id: &str) {
    fake.wait_for_request(Duration::from_secs(60), |r| {
        r.session_id() == Some(session_id)
    })
    .await;
}

/// What the orchestrating model pays per delegated task: tool calls and characters of results.
pub struct Cycle {
    /// Characters of results per cycle: start_task with `server_id: "default"`, then one wait
    /// that carries the answer (lean results).
    pub lean_chars: Vec<f64>,
    /// The four-call cycle with every detail: start_server, start_task, wait, get_task_result.
    pub full_chars: Vec<f64>,
    /// Characters of the answer itself, in each cycle.
    pub answer_chars: usize,
}

/// Calls per cycle of each kind.
pub const LEAN_CALLS: usize = 2;
pub const FULL_CALLS: usize = 4;

/// Runs `reps` trivial tasks each way and counts the characters of every result the host model
/// would read (the JSON text of each result).
pub async fn orchestrator_cycle(gw: &Gw, reps: usize) -> Result<Cycle, BoxError> {
    let mut out = Cycle {
        lean_chars: Vec::new(),
        full_chars: Vec::new(),
        answer_chars: 0,
    };
    for i in 0..reps {
        let prompt = format!("cycle {i}: rename foo to bar in lib.rs");
        out.answer_chars = format!("ECHO: {prompt}").chars().count();
        let call = |tool: &'static str, args: serde_json::Value| async move {
            let r = gw.client.call(tool, args).await?;
            if r.is_error {
                return Err::<_, BoxError>(format!("{tool} failed: {}", r.text).into());
            }
            Ok(r)
        };
        let chars = |r: &crate::support::mcp::ToolReply| r.text.chars().count() as f64;

        let start = call(
            "opencode_start_task",
            json!({ "server_id": "default", "prompt": prompt }),
        )
        .await?;
        let id = start.structured["task_id"].clone();
        let wait = call(
            "opencode_wait_for_task",
            json!({ "task_ids": [id], "timeout_ms": 60_000 }),
        )
        .await?;
        if wait.structured["tasks"][0]["text"].as_str().is_none() {
            return Err(format!("the wait carried no answer: {}", wait.text).into());
        }
        out.lean_chars.push(chars(&start) + chars(&wait));

        let server = call("opencode_start_server", json!({})).await?;
        let start = call(
            "opencode_start_task",
            json!({ "server_id": gw.server_id, "prompt": prompt, "detail": "full" }),
        )
        .await?;
        let id = start.structured["task_id"].clone();
        let wait = call(
            "opencode_wait_for_task",
            json!({ "task_ids": [id], "timeout_ms": 60_000, "detail": "full" }),
        )
        .await?;
        let result = call(
            "opencode_get_task_result",
            json!({ "task_id": id, "detail": "full" }),
        )
        .await?;
        out.full_chars
            .push(chars(&server) + chars(&start) + chars(&wait) + chars(&result));
    }
    Ok(out)
}

/// The steady-rate soak: `rounds` rounds of `per_round` trivial tasks, one round every `every`,
/// on one gateway whose finished tasks leave memory `in_memory` after they finish.
///
/// Each round is read at two fixed points of its own, found in the gateway's debug log (the
/// soak's gateway logs `opencode_mcp::memory` and `opencode_mcp::tasks::tracker` at debug), not
/// at a fixed time: a reading taken at a fixed time lands before, during or after the 5 s
/// eviction passes depending on how fast the round ran, and measured that race instead of the
/// gateway's memory.
/// - *held*: once every task of the round finished and the gateway gave freed memory back at
///   the end of the burst: the round's tasks in memory, the previous round's gone;
/// - *floor*: once every task of the round has left memory and the gateway gave memory back.
///
/// The next round starts `every` after this one did, or at the floor reading if that is later.
pub async fn soak(
    launch: &Spawn,
    rounds: usize,
    per_round: usize,
    every: Duration,
    in_memory: Duration,
) -> Result<Vec<SoakRound>, BoxError> {
    let client = Gw::connect(launch).await?;
    let pid = client.pid().ok_or("the gateway has no pid")?;
    let gateway = Gw::attach(client).await?;
    let gw = &gateway;
    let log = |from: usize| -> String {
        let text = gw.client.stderr();
        text.get(from..).unwrap_or_default().to_owned()
    };
    let mut out = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let started = Instant::now();
        run_in_batches(gw, per_round, |k| format!("bench soak {round} {k}")).await?;
        let burst_done = gw.client.stderr().len();
        // The tracker gives memory back once no task runs (within a tick or two).
        let held = read_when(pid, Duration::from_secs(30), || {
            log(burst_done).lines().rev().find_map(Trimmed::parse)
        })
        .await;
        // Every task the gateway ran so far has left memory, and the give-back after it.
        let all_gone = per_round * (round + 1);
        let floor = read_when(pid, in_memory + Duration::from_secs(60), || {
            let text = log(0);
            let gone: usize = text.lines().filter_map(evicted).sum();
            let last_eviction = text.rfind("finished tasks left memory")?;
            (gone >= all_gone)
                .then(|| text[last_eviction..].lines().find_map(Trimmed::parse))
                .flatten()
        })
        .await;
        eprintln!(
            "[bench] soak round {}/{rounds} ({:.0} s): held {}; floor {}",
            round + 1,
            started.elapsed().as_secs_f64(),
            held.describe(),
            floor.describe()
        );
        out.push(SoakRound { held, floor });
        // The round's pace is the scenario, not a synchronisation.
        tokio::time::sleep_until((started + every).into()).await;
    }
    Ok(out)
}

/// Reads `pid`'s memory as soon as `ready` finds the give-back it waits for in the gateway's
/// log (polled every 100 ms), or when `within` has passed without it (then `trimmed` is `None`
/// and the reading is marked as taken late).
async fn read_when(
    pid: u32,
    within: Duration,
    mut ready: impl FnMut() -> Option<Trimmed>,
) -> Reading {
    let deadline = Instant::now() + within;
    let trimmed = loop {
        if let Some(t) = ready() {
            break Some(t);
        }
        if Instant::now() >= deadline {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let rss = rss_mb(pid).map(|(now, _)| now).unwrap_or(0.0);
    let (anon, file) = rss_split_mb(pid).unwrap_or_default();
    Reading {
        rss,
        anon,
        file,
        trimmed,
    }
}

/// How many tasks an eviction pass took out of memory (`tasks=N` of its debug line).
fn evicted(line: &str) -> Option<usize> {
    if !line.contains("finished tasks left memory") {
        return None;
    }
    kib_field(line, "tasks").and_then(|n| usize::try_from(n).ok())
}

/// The digits after `name=` in a `tracing` line.
fn kib_field(line: &str, name: &str) -> Option<u64> {
    let at = line.find(&format!(" {name}="))? + name.len() + 2;
    let digits: String = line[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// One round of the soak, read at its two points (see [`soak`]).
#[derive(Debug, Clone, Copy)]
pub struct SoakRound {
    pub held: Reading,
    pub floor: Reading,
}

/// The gateway's memory at one point: RSS (MiB) and its anonymous and file-backed parts (the
/// heap and stacks, and the pages of the binary mapped in, which come and go with the code that
/// ran and the page cache rather than with what the gateway keeps), and the gateway's own
/// figures at the give-back the reading waited for.
#[derive(Debug, Clone, Copy)]
pub struct Reading {
    pub rss: f64,
    pub anon: f64,
    pub file: f64,
    pub trimmed: Option<Trimmed>,
}

impl Reading {
    fn describe(&self) -> String {
        match self.trimmed {
            Some(t) => format!(
                "{:.1} MiB (anon {:.1}, file {:.1}; heap {:.2} in use)",
                self.rss, self.anon, self.file, t.heap_in_use
            ),
            None => format!(
                "{:.1} MiB (anon {:.1}, file {:.1}; LATE: the give-back was not logged in time)",
                self.rss, self.anon, self.file
            ),
        }
    }
}

/// What the gateway logs when it gives freed memory back (`memory::give_back`), in MiB.
#[derive(Debug, Clone, Copy)]
pub struct Trimmed {
    pub heap_in_use: f64,
    pub heap_free: f64,
}

impl Trimmed {
    fn parse(line: &str) -> Option<Trimmed> {
        if !line.contains("gave freed memory back") {
            return None;
        }
        let mib = |name: &str| kib_field(line, name).map(|kib| kib as f64 / 1024.0);
        Some(Trimmed {
            heap_in_use: mib("heap_in_use_kib")?,
            heap_free: mib("heap_free_kib")?,
        })
    }
}

/// Runs `total` trivial tasks through the gateway in batches of 50, each batch started at once
/// and waited out.
async fn run_in_batches(
    gw: &Gw,
    total: usize,
    prompt: impl Fn(usize) -> String,
) -> Result<(), BoxError> {
    let mut done = 0;
    while done < total {
        let batch = (total - done).min(50);
        let starts = join_all((done..done + batch).map(|k| {
            let p = prompt(k);
            async move { gw.start_task(&p).await }
        }))
        .await;
        let ids = starts
            .into_iter()
            .map(|s| s.map(|s| s.task_id))
            .collect::<Result<Vec<_>, _>>()?;
        gw.wait_all(&ids, FINISH_LIMIT).await?;
        done += batch;
    }
    Ok(())
}

/// What a gateway's memory does when the usage report and the task list read a full store.
pub struct StoredReads {
    pub records: usize,
    /// RSS (MiB) once the store is restored and every finished task has left memory.
    pub before: f64,
    /// After `calls` rounds of `opencode_list_tasks` and `opencode_usage`.
    pub after: f64,
    pub calls: usize,
    /// Milliseconds each call took.
    pub list_ms: Vec<f64>,
    pub usage_ms: Vec<f64>,
}

/// A gateway started on `records` stored tasks whose finished tasks leave memory at once
/// (`launch` sets `limits.finished_in_memory` short), so the report and the list read them from
/// the state directory: RSS before and after `rounds` of both calls.
pub async fn stored_reads(
    launch: &Spawn,
    records: usize,
    rounds: usize,
) -> Result<StoredReads, BoxError> {
    let client = Gw::connect(launch).await?;
    let pid = client.pid().ok_or("the gateway has no pid")?;
    // Any call that reads tasks waits for the store to be restored (and the restored tasks
    // leave memory right after): an unknown id is the cheapest.
    let reply = client
        .call("opencode_get_task_status", json!({ "task_id": "tsk_none" }))
        .await?;
    if reply.error_code() != Some("not_found") {
        return Err(format!("expected not_found for an unknown task: {}", reply.text).into());
    }
    let before = rss_mb(pid).map_or(0.0, |(rss, _)| rss);
    let mut out = StoredReads {
        records,
        before,
        after: 0.0,
        calls: 0,
        list_ms: Vec::new(),
        usage_ms: Vec::new(),
    };
    for _ in 0..rounds {
        for (tool, args, times) in [
            (
                "opencode_list_tasks",
                json!({ "limit": 20 }),
                &mut out.list_ms,
            ),
            (
                "opencode_usage",
                json!({ "since": "24h" }),
                &mut out.usage_ms,
            ),
        ] {
            let t = Instant::now();
            let reply = client.call(tool, args).await?;
            times.push(ms(t.elapsed()));
            if reply.is_error {
                return Err(format!("{tool} failed: {}", reply.text).into());
            }
            out.calls += 1;
        }
    }
    out.after = rss_mb(pid).map_or(0.0, |(rss, _)| rss);
    client.close().await?;
    Ok(out)
}

/// What a fix round of the checks costs, against the same task without checks.
pub struct CheckRound {
    /// Start to answer of a task without checks, ms.
    pub plain_ms: Vec<f64>,
    /// Start to answer of the same task whose check fails once (one fix round), then passes.
    pub checked_ms: Vec<f64>,
    /// Characters of the fix prompt the model was sent (the default template).
    pub fix_prompt_chars: Vec<f64>,
}

/// A check that fails on its first run and passes on its second: one fix round, whatever the
/// agent does.
const FAILS_ONCE: &str =
    "test -f .ran || { touch .ran; echo 'first run: failing on purpose'; exit 1; }";

/// Runs `reps` pairs, each in fresh directories under `root`: a task without checks, and the
/// same task with [`FAILS_ONCE`] (one fix round, then a pass). Both are timed from the start
/// call to the wait that returns the answer, on the same gateway, alternately.
pub async fn check_round(
    gw: &Gw,
    fake: &crate::support::FakeLlm,
    root: &std::path::Path,
    reps: usize,
) -> Result<CheckRound, BoxError> {
    let mut out = CheckRound {
        plain_ms: Vec::new(),
        checked_ms: Vec::new(),
        fix_prompt_chars: Vec::new(),
    };
    for i in 0..reps {
        for checked in [false, true] {
            let dir = root.join(format!("round-{i}-{checked}"));
            std::fs::create_dir_all(&dir)?;
            let mut args = json!({
                "server_id": gw.server_id,
                "prompt": format!("check round {i}: add a doc comment to lib.rs"),
                "directory": dir.display().to_string(),
                "detail": "full",
            });
            if checked {
                args["checks"] = json!([FAILS_ONCE]);
            }
            let t = Instant::now();
            let v = gw.ok("opencode_start_task", args).await?;
            let id = v["task_id"].as_str().unwrap_or_default().to_string();
            let session = v["session_id"].as_str().unwrap_or_default().to_string();
            let w = gw
                .wait_all(std::slice::from_ref(&id), Duration::from_secs(120))
                .await?;
            let took = ms(t.elapsed());
            if checked {
                let task = &w["tasks"][0];
                if task["checks"]["status"] != "passed" || task["checks"]["rounds"] != 1 {
                    return Err(
                        format!("the checked task did not pass after one round: {task}").into(),
                    );
                }
                let fix = fake
                    .chat_requests()
                    .into_iter()
                    .filter(|r| r.session_id() == Some(session.as_str()))
                    .find(|r| {
                        r.last_user_text
                            .starts_with("The checks of your work failed")
                    })
                    .ok_or("no fix prompt reached the model")?;
                out.fix_prompt_chars
                    .push(fix.last_user_text.chars().count() as f64);
                out.checked_ms.push(took);
            } else {
                out.plain_ms.push(took);
            }
        }
    }
    Ok(out)
}

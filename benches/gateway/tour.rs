//! The `tour`: one gateway taken through every tool the way a host's session uses them, round
//! after round, and its RSS read at the end.
//!
//! Issue 22 sets a goal for the gateway's RSS "after the full held-out scenario run" (≤ 14 MiB).
//! Those scenarios are not on this machine, so this is the nearest thing the bench can run: a
//! fresh gateway that starts its own OpenCode (`opencode_start_server` with a directory, as a
//! host does), and in each round lists agents, starts tasks on every tier, with a shell call, a
//! file write, a structured answer, a model error, a worktree and an idempotency key, waits for
//! any and for all with progress, reads statuses and results (the full detail, a diff), cancels a
//! streaming task, refuses a follow-up to a running one, sends follow-ups, applies or discards the
//! worktree, asks two tiers at once (`opencode_fan_out` and the `review` preset), asks for ids
//! that do not exist, lists tasks and reports usage. Every answer is checked, so a round that
//! went wrong fails the run instead of measuring a gateway that did less. The RSS is read after
//! each round, at the end with the server still up, and after `opencode_stop_server`.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::gw::check_completed;
use crate::machine::{rss_mb, rss_split_mb};
use crate::support::mcp::{Launch as Spawn, McpClient as Client};
use crate::BoxError;
use rmcp::model::{CallToolResponse, CancelTaskParams, GetTaskParams};

/// The repository's own `delegation.yaml`: every tier bound (two models, so a fan-out asks two
/// different ones) and the built-in `review` preset switched on.
pub const DELEGATION: &str = "\
tiers:
  - {name: fast, handles: renames and boilerplate, models: [fake/fake-model]}
  - {name: standard, handles: features, models: []}
  - {name: strong, handles: reviews, models: [fake/fake-strong]}
tools:
  review: {enabled: true}
";

/// Bound on one wait for a round's tasks.
const ROUND_LIMIT: Duration = Duration::from_secs(180);

/// What the tour measured.
#[derive(Default)]
pub struct Tour {
    /// RSS (MiB) after each round.
    pub rss_rounds: Vec<f64>,
    /// After the last round, the server still up: RSS, peak (VmHWM), anonymous + file-backed.
    pub rss_end: f64,
    pub hwm_end: f64,
    pub split_end: (f64, f64),
    /// After as many rounds again of calls that start nothing (every task's status and result,
    /// waits on them all, the task list and the usage report), before stopping the server: a
    /// gateway's memory must grow with the tasks it holds, not with the calls it answers.
    pub rss_after_reads: f64,
    pub read_calls: usize,
    /// After `opencode_stop_server`.
    pub rss_stopped: f64,
    /// Wall time of each round, s.
    pub round_secs: Vec<f64>,
    /// Per round, each plain task: `start_task` sent → its answer in a `wait_for_task` (ms).
    pub answer_ms: Vec<f64>,
    pub tasks: usize,
    pub calls: usize,
}

/// A connected gateway and the count of tool calls made through it.
struct Host {
    client: Client,
    calls: usize,
    /// Speaks protocol 2026-07-28 with the tasks extension, as Claude Code does: a call that
    /// starts work is answered with a task handle.
    tasks: bool,
}

impl Host {
    async fn ok(&mut self, tool: &str, args: Value) -> Result<Value, BoxError> {
        self.calls += 1;
        self.client.call_ok(tool, args).await
    }

    /// A call that must fail with `code`.
    async fn refused(&mut self, tool: &str, args: Value, code: &str) -> Result<(), BoxError> {
        self.calls += 1;
        let reply = self.client.call(tool, args.clone()).await?;
        match reply.error_code() {
            Some(c) if reply.is_error && c == code => Ok(()),
            _ => Err(format!("{tool} {args}: expected error `{code}`, got {}", reply.text).into()),
        }
    }

    async fn start(&mut self, args: Value) -> Result<String, BoxError> {
        self.start_work("opencode_start_task", args, "task_id")
            .await
    }

    /// A call that starts work (a task, a follow-up, a group): the id of the task or group it
    /// started, from the result's `key`, or from the task handle a host with tasks gets.
    async fn start_work(&mut self, tool: &str, args: Value, key: &str) -> Result<String, BoxError> {
        if !self.tasks {
            let v = self.ok(tool, args).await?;
            return field(&v, key);
        }
        self.calls += 1;
        match self.client.call_once(tool, args.clone()).await? {
            CallToolResponse::Task(handle) => Ok(handle.task.task_id),
            other => Err(format!("{tool} {args}: no task handle: {other:?}").into()),
        }
    }

    /// Waits (mode `all`) until `ids` are finished; the statuses are checked by the caller.
    async fn wait_all(&mut self, ids: &[String]) -> Result<Value, BoxError> {
        let deadline = Instant::now() + ROUND_LIMIT;
        loop {
            let w = self
                .ok(
                    "opencode_wait_for_task",
                    json!({ "task_ids": ids, "mode": "all", "timeout_ms": 25_000 }),
                )
                .await?;
            if w["done"] == true {
                return Ok(w);
            }
            if Instant::now() >= deadline {
                return Err(format!("tasks unfinished after {ROUND_LIMIT:?}: {w}").into());
            }
        }
    }
}

fn field(v: &Value, key: &str) -> Result<String, BoxError> {
    v[key]
        .as_str()
        .map(String::from)
        .ok_or_else(|| format!("no `{key}` in {v}").into())
}

/// The status each task of a finished wait ended with.
fn statuses(w: &Value) -> Vec<(String, String)> {
    w["tasks"]
        .as_array()
        .map(|tasks| {
            tasks
                .iter()
                .map(|t| {
                    let s = |k: &str| t[k].as_str().unwrap_or_default().to_string();
                    (s("task_id"), s("status"))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn expect_status(w: &Value, id: &str, status: &str) -> Result<(), BoxError> {
    match statuses(w).into_iter().find(|(t, _)| t == id) {
        Some((_, s)) if s == status => Ok(()),
        other => Err(format!("task {id}: expected {status}, got {other:?} in {w}").into()),
    }
}

/// Runs `rounds` rounds on a fresh gateway launched by `launch` (in `repo`, a git repository
/// holding [`DELEGATION`]). With `tasks`, the launch speaks protocol 2026-07-28 with the tasks
/// extension ([`Spawn::modern`]): work starts as task handles, a few are read with `tasks/get`
/// and the streaming task is cancelled with `tasks/cancel`, as Claude Code does.
pub async fn tour(
    launch: &Spawn,
    repo: &Path,
    rounds: usize,
    tasks: bool,
) -> Result<Tour, BoxError> {
    let client = launch.connect().await?;
    let pid = client.pid().ok_or("the gateway has no pid")?;
    let mut host = Host {
        client,
        calls: 0,
        tasks,
    };
    let directory = repo.display().to_string();
    let mut out = Tour::default();
    let mut server_id = String::new();
    // Every task the rounds start (fan-out groups aside), for the reads after them.
    let mut started = Vec::new();
    for round in 0..rounds {
        let began = Instant::now();
        let server = host
            .ok("opencode_start_server", json!({ "directory": directory }))
            .await?;
        let id = field(&server, "server_id")?;
        if round > 0 && id != server_id {
            return Err(format!("a second start_server gave another server: {server}").into());
        }
        server_id = id;
        let agents = host
            .ok("opencode_list_agents", json!({ "server_id": server_id }))
            .await?;
        if agents["agents"].as_array().is_none_or(Vec::is_empty) {
            return Err(format!("list_agents listed none: {agents}").into());
        }
        let task = |prompt: String| json!({ "server_id": server_id, "prompt": prompt });

        // Plain tasks on every tier, timed from the start call to their answer in a wait.
        let sent = Instant::now();
        let mut plain = Vec::new();
        for tier in ["fast", "standard", "strong"] {
            let mut args = task(format!("tour {round} {tier}: rename foo to bar"));
            args["tier"] = json!(tier);
            plain.push(host.start(args).await?);
        }
        let shell = host
            .start(task(format!("tour {round}: list the files [[bash:ls]]")))
            .await?;
        let writer = host
            .start(task(format!(
                "tour {round}: write a note [[write:notes/tour-{round}.txt:round {round}]]"
            )))
            .await?;
        let mut args = task(format!(
            r#"tour {round}: describe Ada [[answers:{{"name":"Ada","born":1815}}]]"#
        ));
        args["output_schema"] = json!({
            "type": "object",
            "properties": { "name": { "type": "string" }, "born": { "type": "integer" } },
            "required": ["name", "born"],
        });
        let structured = host.start(args).await?;
        let failing = host
            .start(task(format!("tour {round}: [[error400]]")))
            .await?;
        let slow = host
            .start(task(format!("tour {round}: take your time [[slow:20000]]")))
            .await?;
        let mut args = task(format!(
            "tour {round}: in a worktree [[write:wt-{round}.txt:from worktree {round}]]"
        ));
        args["isolation"] = json!("worktree");
        let worktree = host.start(args).await?;
        let mut args = task(format!("tour {round}: keyed"));
        args["idempotency_key"] = json!(format!("tour-{round}"));
        let keyed = host.start(args.clone()).await?;
        if host.start(args).await? != keyed {
            return Err("the same idempotency key started a second task".into());
        }
        out.tasks += 10;

        // Every task of the round that ends by itself (all but the streaming one).
        let mut quick = plain.clone();
        quick.extend([
            shell,
            writer.clone(),
            structured.clone(),
            failing.clone(),
            worktree.clone(),
            keyed,
        ]);
        started.extend(quick.iter().cloned());
        started.push(slow.clone());
        let any = host
            .ok(
                "opencode_wait_for_task",
                json!({ "task_ids": quick, "mode": "any", "include_progress": true, "timeout_ms": 60_000 }),
            )
            .await?;
        if any["done"] != true {
            return Err(format!("no task finished within a minute: {any}").into());
        }
        for id in quick.iter().chain([&slow]) {
            host.ok(
                "opencode_get_task_status",
                json!({ "task_id": id, "include_progress": true }),
            )
            .await?;
        }
        let done = host.wait_all(&quick).await?;
        let answered = sent.elapsed();
        expect_status(&done, &failing, "failed")?;
        for id in quick.iter().filter(|id| **id != failing) {
            expect_status(&done, id, "completed")?;
        }
        for id in &plain {
            let t = done["tasks"]
                .as_array()
                .and_then(|ts| ts.iter().find(|t| t["task_id"] == id.as_str()))
                .ok_or("a plain task is missing from the wait")?;
            if t["text"].as_str().is_none() {
                return Err(format!("the wait carried no answer: {t}").into());
            }
        }
        out.answer_ms.push(answered.as_secs_f64() * 1000.0);

        // The streaming task: a follow-up is refused while it runs, then it is cancelled.
        host.refused(
            "opencode_continue_task",
            json!({ "task_id": slow, "prompt": "and more" }),
            "conflict",
        )
        .await?;
        if tasks {
            host.calls += 1;
            host.client
                .peer()
                .cancel_task(CancelTaskParams::new(&slow))
                .await?;
            for id in [&plain[0], &structured, &failing] {
                host.calls += 1;
                let got = host.client.peer().get_task(GetTaskParams::new(id)).await?;
                if !got.task.status().is_terminal() {
                    return Err(format!("tasks/get {id}: not finished: {got:?}").into());
                }
            }
        } else {
            host.ok("opencode_cancel_task", json!({ "task_id": slow }))
                .await?;
        }
        let cancelled = host
            .ok("opencode_get_task_status", json!({ "task_id": slow }))
            .await?;
        if cancelled["status"] != "cancelled" {
            return Err(format!("the cancelled task is not: {cancelled}").into());
        }

        // Results: lean, full, a structured answer, a model error, a worktree's diff.
        for id in &quick {
            host.ok("opencode_get_task_result", json!({ "task_id": id }))
                .await?;
        }
        let full = host
            .ok(
                "opencode_get_task_result",
                json!({ "task_id": plain[0], "detail": "full" }),
            )
            .await?;
        if full["text"].as_str().is_none() {
            return Err(format!("no text in a full result: {full}").into());
        }
        let answer = host
            .ok("opencode_get_task_result", json!({ "task_id": structured }))
            .await?;
        if !answer.to_string().contains("1815") {
            return Err(format!("the structured answer is not in its result: {answer}").into());
        }
        let diff = host
            .ok(
                "opencode_get_task_result",
                json!({ "task_id": worktree, "view": "diff" }),
            )
            .await?;
        if !diff.to_string().contains(&format!("wt-{round}.txt")) {
            return Err(format!("the worktree's diff misses its file: {diff}").into());
        }
        let take = if round % 2 == 0 {
            "opencode_apply_task"
        } else {
            "opencode_discard_task"
        };
        host.ok(take, json!({ "task_id": worktree })).await?;

        // Follow-ups in the same sessions.
        let follow = [plain[0].clone(), writer.clone()];
        for id in &follow {
            host.start_work(
                "opencode_continue_task",
                json!({ "task_id": id, "prompt": format!("tour {round}: one more thing") }),
                "task_id",
            )
            .await?;
        }
        out.tasks += 2;
        check_completed(host.wait_all(&follow).await?)?;

        // Two tiers at once, directly and through the preset.
        let groups = [
            host.start_work(
                "opencode_fan_out",
                json!({ "server_id": server_id, "prompt": format!("tour {round}: is this sound?"), "tiers": ["fast", "strong"] }),
                "group_id",
            )
            .await?,
            host.start_work(
                "review",
                json!({ "focus": format!("round {round}") }),
                "group_id",
            )
            .await?,
        ];
        out.tasks += 4;
        for g in &groups {
            let w = host.wait_all(std::slice::from_ref(g)).await?;
            if w["tasks"].as_array().map_or(0, Vec::len) != 2 {
                return Err(format!("a group of two tiers did not give two answers: {w}").into());
            }
            check_completed(w)?;
        }

        // Ids that do not exist.
        let unknown = format!("tsk_tour{round}unknown");
        for tool in [
            "opencode_get_task_status",
            "opencode_get_task_result",
            "opencode_cancel_task",
        ] {
            host.refused(tool, json!({ "task_id": unknown }), "not_found")
                .await?;
        }
        host.refused(
            "opencode_wait_for_task",
            json!({ "task_ids": [unknown] }),
            "not_found",
        )
        .await?;

        host.ok("opencode_list_tasks", json!({ "limit": 50 }))
            .await?;
        host.ok("opencode_usage", json!({})).await?;

        out.round_secs.push(began.elapsed().as_secs_f64());
        let rss = rss_mb(pid).map_or(0.0, |(rss, _)| rss);
        eprintln!(
            "[bench] tour round {}/{rounds}: {rss:.1} MiB, {:.1} s",
            round + 1,
            began.elapsed().as_secs_f64()
        );
        out.rss_rounds.push(rss);
    }
    (out.rss_end, out.hwm_end) = rss_mb(pid).unwrap_or_default();
    out.split_end = rss_split_mb(pid).unwrap_or_default();
    let calls = host.calls;
    for _ in 0..rounds {
        for id in &started {
            host.ok("opencode_get_task_status", json!({ "task_id": id }))
                .await?;
            host.ok("opencode_get_task_result", json!({ "task_id": id }))
                .await?;
        }
        for ids in started.chunks(50) {
            host.wait_all(ids).await?;
        }
        host.ok("opencode_list_tasks", json!({ "limit": 50 }))
            .await?;
        host.ok("opencode_usage", json!({})).await?;
    }
    out.read_calls = host.calls - calls;
    out.rss_after_reads = rss_mb(pid).map_or(0.0, |(rss, _)| rss);
    if !server_id.is_empty() {
        host.ok("opencode_stop_server", json!({ "server_id": server_id }))
            .await?;
    }
    out.rss_stopped = rss_mb(pid).map_or(0.0, |(rss, _)| rss);
    out.calls = host.calls;
    host.client.close().await?;
    Ok(out)
}

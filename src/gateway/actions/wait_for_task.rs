//! `wait_for_task`: long-poll one or more tasks until all (or any) of them finish, or the wait
//! times out.
//!
//! Hosts cut tool calls off (Codex after 60 s by default), so a wait is bounded by `timeout_ms`
//! (default `timeouts.wait_default`, under a minute) and a timeout is not an error: it returns
//! every task's current status with `timed_out: true`, and the host calls again.
//!
//! The wait runs in slices of `timeouts.progress_interval`. Between slices, when the request
//! carried a progress token, a `notifications/progress` tells the host how far along the tasks
//! are; Claude Code resets its tool timeout on each one. The host may cancel the call
//! (`notifications/cancelled`): the wait then ends at once, and the tasks keep running, because
//! cancelling a wait must never cancel the work it waits for (a bug of the original).

use std::collections::HashSet;
use std::time::Duration;

use rmcp::model::{JsonObject, ProgressNotificationParam, ProgressToken, ToolAnnotations};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use tokio::time::Instant;

use super::{checks, ActionSpec, Ctx};
use crate::config::{Config, HostLimits};
use crate::error::ErrorCode;
use crate::gateway::budget;
use crate::gateway::error::ToolError;
use crate::gateway::schema::property;
use crate::tasks::{Detail, Files, TaskSnapshot, TaskStatus, WaitMode, WaitOutcome};

/// Arguments of `wait_for_task`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Args {
    /// Task ids, or a fan-out's `group_id`.
    #[schemars(length(min = 1))]
    pub task_ids: Vec<String>,
    /// `all` tasks finished, or `any`.
    #[serde(default)]
    pub mode: WaitMode,
    /// Then the current statuses are returned; 0: at once.
    pub timeout_ms: Option<u64>,
    /// What running tasks are doing.
    #[serde(default)]
    pub include_progress: bool,
    /// `full`: also model, tokens, cost.
    #[serde(default)]
    pub detail: Detail,
}

/// The `wait_for_task` action.
pub struct WaitForTask;

impl ActionSpec for WaitForTask {
    type Args = Args;
    type Output = WaitOutcome;
    const TITLE: &'static str = "Wait for tasks";

    /// Only watches; cancelling the call leaves the tasks alone.
    fn annotations() -> ToolAnnotations {
        super::observing()
    }

    fn refine_input_schema(config: &Config, schema: &mut JsonObject) {
        if let Some(ids) = property(schema, "task_ids") {
            ids.insert("maxItems".into(), json!(config.limits.max_wait_ids));
        }
        let default_ms = checks::millis(config.timeouts.wait_default.get());
        let max_ms = checks::millis(config.timeouts.wait_max.get());
        // `default` and `maximum` say it: not again in words.
        if let Some(timeout) = property(schema, "timeout_ms") {
            timeout.insert("default".into(), json!(default_ms));
            timeout.insert("maximum".into(), json!(max_ms));
        }
    }
}

/// A checked request.
#[derive(Debug, PartialEq)]
struct Request {
    ids: Vec<String>,
    mode: WaitMode,
    timeout: Duration,
    include_progress: bool,
}

fn validate(args: Args, config: &Config, host: HostLimits) -> Result<Request, ToolError> {
    if args.task_ids.is_empty() {
        return Err(ToolError::invalid_argument(
            "`task_ids` must name at least one task",
        ));
    }
    let mut seen = HashSet::with_capacity(args.task_ids.len());
    let mut ids: Vec<String> = Vec::with_capacity(args.task_ids.len());
    for (i, id) in args.task_ids.into_iter().enumerate() {
        let id = checks::required_name(&format!("task_ids[{i}]"), id)?;
        if seen.insert(id.clone()) {
            ids.push(id);
        }
    }
    let max_ids = config.limits.max_wait_ids as usize;
    if ids.len() > max_ids {
        return Err(ToolError::invalid_argument(format!(
            "`task_ids` names {} distinct tasks, more than the limit of {max_ids} (limits.max_wait_ids)",
            ids.len()
        )));
    }
    let max_ms = checks::millis(config.timeouts.wait_max.get());
    let timeout_ms = args
        .timeout_ms
        .unwrap_or_else(|| checks::millis(config.timeouts.wait_default.get()));
    if timeout_ms > max_ms {
        return Err(ToolError::invalid_argument(format!(
            "`timeout_ms` is {timeout_ms}, more than the maximum of {max_ms} (timeouts.wait_max); \
             wait in shorter calls"
        )));
    }
    // A wait the host would cut off returns nothing at all; one shortened to what the host sits
    // through returns a snapshot, and the caller waits again.
    let timeout = Duration::from_millis(timeout_ms).min(host.wait_max);
    Ok(Request {
        ids,
        mode: args.mode,
        timeout,
        include_progress: args.include_progress,
    })
}

pub(super) async fn run(args: Args, ctx: &Ctx<'_>) -> Result<WaitOutcome, ToolError> {
    let detail = args.detail;
    let mut request = validate(args, ctx.config, ctx.host)?;
    request.ids = ctx.tasks.expand_groups(request.ids).await?;
    let max_ids = ctx.config.limits.max_wait_ids as usize;
    if request.ids.len() > max_ids {
        return Err(ToolError::invalid_argument(format!(
            "`task_ids` names {} tasks once its groups are counted, more than the limit of \
             {max_ids} (limits.max_wait_ids)",
            request.ids.len()
        )));
    }
    let token = ctx.request.meta.get_progress_token();
    // The shortest slice is bounded so that a tiny configured interval cannot spin.
    let interval = ctx
        .config
        .timeouts
        .progress_interval
        .get()
        .max(Duration::from_millis(100));
    // Progress messages name the running tools, so ask for progress when reporting it.
    let with_progress = request.include_progress || token.is_some();
    let started = Instant::now();
    let deadline = started + request.timeout;
    let mut last_progress = 0.0;
    let mut sent = 0u32;
    // In `any` mode one finished task ends the wait: that is the whole of the work.
    let total = match request.mode {
        WaitMode::All => request.ids.len(),
        WaitMode::Any => 1,
    };
    loop {
        let slice_end = deadline.min(Instant::now() + interval);
        let slice = slice_end.saturating_duration_since(Instant::now());
        let wait = ctx
            .tasks
            .wait(&request.ids, request.mode, slice, with_progress, true);
        let outcome = tokio::select! {
            biased;
            _ = ctx.request.ct.cancelled() => return Err(cancelled()),
            outcome = wait => outcome?,
        };
        if outcome.done || !outcome.asking.is_empty() || slice_end >= deadline {
            // Every pending ask in this result is the host's to see now, not only the new ones.
            ctx.tasks.asks_shown(&outcome.tasks);
            let outcome = finish(outcome, request.include_progress, detail);
            return Ok(with_answers(outcome, detail, ctx).await);
        }
        if let Some(token) = &token {
            sent += 1;
            let finished = outcome.finished.len().min(total);
            let value = progress_value(finished, sent, last_progress);
            last_progress = value;
            let note = ProgressNotificationParam::new(token.clone(), value)
                .with_total(total as f64)
                .with_message(progress_message(
                    &outcome,
                    request.ids.len(),
                    started.elapsed(),
                ));
            notify(ctx, note).await;
        }
        // A service that returned before the slice ended without meeting the condition must not
        // turn this loop into a spin: wait out the slice.
        tokio::select! {
            biased;
            _ = ctx.request.ct.cancelled() => return Err(cancelled()),
            _ = tokio::time::sleep_until(slice_end) => {}
        }
    }
}

/// The wait's result for one task or group at once (timeout 0), progress included: what a
/// native MCP task's `tasks/get` is read from (`gateway::mcp_tasks`).
pub(in crate::gateway) async fn now(id: &str, ctx: &Ctx<'_>) -> Result<WaitOutcome, ToolError> {
    let args = Args {
        task_ids: vec![id.to_string()],
        mode: WaitMode::All,
        timeout_ms: Some(0),
        include_progress: true,
        detail: Detail::Lean,
    };
    run(args, ctx).await
}

fn cancelled() -> ToolError {
    // rmcp drops the response to a cancelled request; this is for the log only.
    ToolError::new(
        ErrorCode::Conflict,
        "the host cancelled this wait; the tasks keep running",
    )
}

async fn notify(ctx: &Ctx<'_>, note: ProgressNotificationParam) {
    let token: &ProgressToken = &note.progress_token;
    tracing::debug!(?token, message = ?note.message, "wait progress");
    tokio::select! {
        biased;
        _ = ctx.request.ct.cancelled() => {}
        sent = ctx.request.peer.notify_progress(note) => {
            if let Err(e) = sent {
                tracing::debug!("cannot send a progress notification: {e}");
            }
        }
    }
}

/// The result the host sees: `timed_out` is exactly "the condition was not met, and no unseen
/// permission ask ended the wait early", progress is shown only when asked for (it may have been
/// fetched for the notifications), and the ids and the rest only with detail `full`.
fn finish(mut outcome: WaitOutcome, include_progress: bool, detail: Detail) -> WaitOutcome {
    outcome.timed_out = !outcome.done && outcome.asking.is_empty();
    outcome.tasks = std::mem::take(&mut outcome.tasks)
        .into_iter()
        .map(|mut task| {
            if !include_progress {
                task.progress = None;
            }
            task.with_detail(detail)
        })
        .collect();
    outcome
}

/// Adds each finished task's answer and changed files, within the host's result budget: the
/// common cycle is then start and wait, with no call to read the result unless an answer is
/// too long for one result (its `next_offset` says where to go on).
async fn with_answers(mut outcome: WaitOutcome, detail: Detail, ctx: &Ctx<'_>) -> WaitOutcome {
    // The answers are in memory once a turn is concluded; changed files are listed if already
    // read (the tracker reads them right after the turn), never fetched on this path, which
    // runs at completion and so sets how soon the host learns of it. Worktree tasks' changes
    // come from git; those run side by side.
    let reads = outcome
        .tasks
        .iter()
        .enumerate()
        .filter(|(_, task)| task.status.is_terminal())
        .map(|(i, task)| {
            let id = task.task_id.clone();
            async move {
                let read = ctx.tasks.result_with(&id, Files::IfKnown).await;
                (i, id, read)
            }
        });
    let mut answers = Vec::new();
    for (i, id, read) in futures::future::join_all(reads).await {
        match read {
            Ok(result) => {
                // What each answer cost: with detail `full`, and always for a fan-out group,
                // whose answers are meant to be weighed side by side.
                if let Some(task) = outcome.tasks.get_mut(i) {
                    if detail == Detail::Full || task.group_id.is_some() {
                        task.model = result.model.clone().or(task.model.take());
                        task.tokens = result.tokens;
                        task.cost = result.cost;
                    }
                }
                answers.push((i, result))
            }
            // The snapshot still says how the task ended; the get-result tool says why the
            // answer cannot be read.
            Err(e) => tracing::debug!(task = %id, "no answer for the wait: {e}"),
        }
    }
    budget::fill_answers(
        &mut outcome,
        answers,
        ctx.host.result_chars as usize,
        ctx.host.count,
    );
    outcome
}

/// MCP requires progress to increase with every notification, and hosts show `progress / total`
/// as the share of the work done. The integer part is the number of finished tasks; each
/// notification adds a thousandth (at most 0.9 in all), so the value grows while no task finishes
/// without suggesting work that is not done. (Adding the share of the wait's timeout used, as
/// before, made one of two finished tasks read as 95 %.) A task reopened by `continue_task`
/// mid-wait lowers the count; the value then still creeps up.
fn progress_value(finished: usize, sent: u32, last: f64) -> f64 {
    let value = finished as f64 + (f64::from(sent) * 0.001).min(0.9);
    if value > last {
        value
    } else {
        last + 0.001
    }
}

/// What the host shows while it waits, in words: how many tasks finished, then for each
/// unfinished one (at most five) its title, how long it has run and what it is doing now. E.g.
/// `1/3 finished after 40 s. "Fix the lints" (35 s): running bash: cargo test. "Write tests"
/// (40 s): writing "…three cases for the parser". "Rename" (12 s): waiting for permission: bash
/// rm x.` Hosts print it beside the progress bar, so it names work, not ids.
fn progress_message(outcome: &WaitOutcome, total: usize, waited: Duration) -> String {
    let mut message = format!(
        "{}/{total} finished after {}.",
        outcome.finished.len(),
        human(waited)
    );
    message.push(' ');
    message.push_str(&describe_unfinished(outcome));
    message.trim_end().to_string()
}

/// The unfinished tasks of `outcome` in words (at most five), e.g. `"Fix the lints" (35 s):
/// running bash: cargo test.`: the tail of a progress message, and a native task's status.
pub(in crate::gateway) fn describe_unfinished(outcome: &WaitOutcome) -> String {
    const SHOWN: usize = 5;
    let unfinished: Vec<&TaskSnapshot> = outcome
        .tasks
        .iter()
        .filter(|t| !t.status.is_terminal())
        .collect();
    let mut message: Vec<String> = unfinished.iter().take(SHOWN).map(|t| describe(t)).collect();
    if unfinished.len() > SHOWN {
        message.push(format!("And {} more.", unfinished.len() - SHOWN));
    }
    message.join(" ")
}

/// One unfinished task in words: `"<title>" (<elapsed>): <what it is doing>.`
fn describe(task: &TaskSnapshot) -> String {
    let progress = task.progress.as_ref();
    let doing = match (task.status, progress) {
        (TaskStatus::Pending, _) => "starting".to_string(),
        (TaskStatus::WaitingPermission, _) => match task.permissions.as_slice() {
            [] => "waiting for permission".to_string(),
            [ask] => format!("waiting for permission: {}", ask.summary(70)),
            [ask, more @ ..] => format!(
                "waiting for permission: {} (and {} more)",
                ask.summary(70),
                more.len()
            ),
        },
        (_, Some(p)) if p.retry.is_some() => {
            let retry = p.retry.as_ref().map(|r| (r.attempt, r.message.as_str()));
            let (attempt, why) = retry.unwrap_or_default();
            format!(
                "the model provider is failing, retry {attempt}: {}",
                shorten(why, 60)
            )
        }
        (_, Some(p)) if p.stalled => format!(
            "no activity for {} (stalled?)",
            human(Duration::from_millis(p.last_event_ms_ago))
        ),
        (_, Some(p)) => match (&p.current_tool, &p.current_tool_title) {
            (Some(tool), Some(title)) => format!("running {tool}: {}", shorten(title, 60)),
            (Some(tool), None) => format!("running {tool}"),
            _ if !p.text_tail.trim().is_empty() => {
                format!("writing \"{}\"", tail(p.text_tail.trim(), 50))
            }
            _ if p.steps > 0 => format!("thinking (step {})", p.steps + 1),
            _ => "thinking".to_string(),
        },
        (_, None) => "running".to_string(),
    };
    format!(
        "\"{}\" ({}): {doing}.",
        shorten(&task.title, 40),
        human(Duration::from_millis(task.elapsed_ms))
    )
}

/// `40 s`, `3 min 5 s`, `1 h 2 min`.
fn human(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{s} s"),
        60..=3599 => format!("{} min {} s", s / 60, s % 60),
        _ => format!("{} h {} min", s / 3600, (s % 3600) / 60),
    }
}

/// The last `max_chars` characters of `text` on one line, with `…` when cut.
fn tail(text: &str, max_chars: usize) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let count = flat.chars().count();
    if count <= max_chars {
        return flat;
    }
    let mut out = String::from("…");
    out.extend(flat.chars().skip(count - max_chars));
    out
}

fn shorten(text: &str, max_chars: usize) -> String {
    let line = text.lines().next().unwrap_or_default();
    if line.chars().count() <= max_chars && line.len() == text.len() {
        return line.to_string();
    }
    let mut out: String = line.chars().take(max_chars).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tasks::Progress;

    fn snapshot(id: &str, status: TaskStatus, tool: Option<(&str, &str)>) -> TaskSnapshot {
        TaskSnapshot {
            queue_position: None,
            phase: None,
            task_id: id.into(),
            status,
            server_id: Some("srv_1".into()),
            session_id: Some("ses_1".into()),
            title: "t".into(),
            directory: Some("/tmp".into()),
            agent: None,
            model: None,
            model_requested: None,
            variant: None,
            turn: Some(1),
            group_id: None,
            tokens: None,
            cost: None,
            text: None,
            next_offset: None,
            files_changed: None,
            workspace: None,
            structured: None,
            structured_error: None,
            structured_attempts: None,
            checks: None,
            escalations: Vec::new(),
            confined: None,
            unconfined: None,
            elapsed_ms: 0,
            error: None,
            permissions: Vec::new(),
            progress: tool.map(|(tool, title)| Progress {
                current_tool: Some(tool.into()),
                current_tool_title: Some(title.into()),
                ..Progress::default()
            }),
            turn_started_ms: 0,
            updated_ms: 0,
        }
    }

    #[test]
    fn message_says_in_words_what_each_unfinished_task_does() {
        let mut writing = snapshot("tsk_b", TaskStatus::Running, None);
        writing.title = "Write tests".into();
        writing.elapsed_ms = 95_000;
        writing.progress = Some(Progress {
            text_tail:
                "First I read the module.\nThen I added three cases for the parser's empty input"
                    .into(),
            ..Progress::default()
        });
        let mut stalled = snapshot("tsk_f", TaskStatus::Running, None);
        stalled.progress = Some(Progress {
            stalled: true,
            last_event_ms_ago: 360_000,
            ..Progress::default()
        });
        let mut tool = snapshot("tsk_a", TaskStatus::Running, Some(("bash", "cargo test")));
        tool.title = "Fix the lints".into();
        tool.elapsed_ms = 35_000;
        let outcome = WaitOutcome {
            asking: Vec::new(),
            done: false,
            timed_out: true,
            mode: WaitMode::All,
            finished: vec!["tsk_d".into(), "tsk_e".into()],
            unfinished: vec![
                "tsk_a".into(),
                "tsk_b".into(),
                "tsk_c".into(),
                "tsk_f".into(),
            ],
            tasks: vec![
                tool,
                writing,
                snapshot("tsk_c", TaskStatus::WaitingPermission, None),
                snapshot("tsk_d", TaskStatus::Completed, None),
                snapshot("tsk_e", TaskStatus::Failed, None),
                stalled,
            ],
        };
        assert_eq!(
            progress_message(&outcome, 6, Duration::from_secs(40)),
            "2/6 finished after 40 s. \"Fix the lints\" (35 s): running bash: cargo test. \
             \"Write tests\" (1 min 35 s): writing \"…n I added three cases for the parser's empty input\". \
             \"t\" (0 s): waiting for permission. \"t\" (0 s): no activity for 6 min 0 s (stalled?)."
        );
        let finished = finish(outcome, false, Detail::Lean);
        assert!(finished.tasks.iter().all(|t| t.progress.is_none()));
        assert!(finished.timed_out);
    }

    #[test]
    fn validation_dedupes_in_order_and_applies_config_bounds() {
        let config = crate::gateway::test_config();
        let args = |ids: &[&str], timeout_ms: Option<u64>| Args {
            task_ids: ids.iter().map(|s| s.to_string()).collect(),
            mode: WaitMode::Any,
            timeout_ms,
            include_progress: false,
            detail: Detail::Lean,
        };
        let roomy = HostLimits {
            result_chars: 20_000,
            count: crate::config::LengthUnit::Bytes,
            wait_max: config.timeouts.wait_max.get(),
        };
        let r = validate(args(&["b", " a", "b", "a "], None), &config, roomy)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.ids, vec!["b", "a"]);
        assert_eq!(r.timeout, config.timeouts.wait_default.get());
        let max = checks::millis(config.timeouts.wait_max.get());
        assert!(validate(args(&["a"], Some(max)), &config, roomy).is_ok());
        let e = validate(args(&["a"], Some(max + 1)), &config, roomy).unwrap_err();
        assert!(e.message.starts_with("`timeout_ms`"), "{}", e.message);
        let e = validate(args(&[], None), &config, roomy).unwrap_err();
        assert!(e.message.starts_with("`task_ids`"), "{}", e.message);
        // A host that cuts calls at a minute gets a wait it can sit through, not an error.
        let brief = HostLimits {
            wait_max: Duration::from_secs(50),
            ..roomy
        };
        let r = validate(args(&["a"], Some(max)), &config, brief).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.timeout, Duration::from_secs(50));
        let e = validate(args(&["a"], Some(max + 1)), &config, brief).unwrap_err();
        assert!(e.message.starts_with("`timeout_ms`"), "{}", e.message);
    }

    #[test]
    fn progress_always_increases_and_counts_only_finished_work() {
        let a = progress_value(1, 1, 0.0);
        let b = progress_value(1, 2, a);
        let c = progress_value(0, 3, b);
        let d = progress_value(1, 4, c);
        assert!(a < b && b < c && c < d, "{a} {b} {c} {d}");
        // One of two tasks finished, however long the wait: about half, never near all.
        let late = progress_value(1, 60, 0.0);
        assert!(late / 2.0 < 0.55, "{late}");
        assert!(progress_value(0, 1000, 0.0) < 1.0);
    }

    #[test]
    fn shortens_long_titles() {
        assert_eq!(shorten("ab\ncd", 10), "ab…");
        assert_eq!(shorten("abcdef", 3), "abc…");
        assert_eq!(shorten("abc", 3), "abc");
    }

    /// Each other state a waiting task can be in has its words: starting, one ask or several,
    /// a failing provider, a tool without a title, a step under way, no progress at all; and
    /// long times read in hours.
    #[test]
    fn every_state_of_a_waiting_task_has_its_words() {
        let ask = |id: &str| crate::opencode::PermissionAsk {
            id: id.into(),
            session_id: "ses_1".into(),
            permission: "bash".into(),
            patterns: vec!["rm -rf build".into()],
            metadata: serde_json::Value::Null,
        };
        let with = |status, progress: Option<Progress>| {
            let mut t = snapshot("tsk", status, None);
            t.progress = progress;
            describe(&t)
        };
        assert!(with(TaskStatus::Pending, None).ends_with(": starting."));
        let mut one = snapshot("tsk", TaskStatus::WaitingPermission, None);
        one.permissions = vec![ask("per_1")];
        assert!(describe(&one).contains("waiting for permission: bash rm -rf build."));
        one.permissions.push(ask("per_2"));
        assert!(
            describe(&one).contains("(and 1 more)"),
            "{}",
            describe(&one)
        );
        let retry = Progress {
            retry: Some(crate::tasks::RetryInfo {
                attempt: 3,
                message: "overloaded".into(),
            }),
            ..Progress::default()
        };
        assert!(with(TaskStatus::Running, Some(retry))
            .contains("the model provider is failing, retry 3: overloaded"));
        let untitled = Progress {
            current_tool: Some("read".into()),
            ..Progress::default()
        };
        assert!(with(TaskStatus::Running, Some(untitled)).ends_with(": running read."));
        let stepping = Progress {
            steps: 2,
            ..Progress::default()
        };
        assert!(with(TaskStatus::Running, Some(stepping)).ends_with(": thinking (step 3)."));
        assert!(with(TaskStatus::Running, Some(Progress::default())).ends_with(": thinking."));
        assert!(with(TaskStatus::Running, None).ends_with(": running."));
        assert_eq!(human(Duration::from_secs(3_720)), "1 h 2 min");
    }
}

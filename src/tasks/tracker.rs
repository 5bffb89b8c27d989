//! The tracker: one per OpenCode server, it turns the server's events and HTTP reads into task
//! state. The verdicts themselves ("the turn is over, and this is its answer") are
//! [`turn`](super::turn)'s; the tracker feeds it and applies what it says. Its rooms: HTTP
//! checks are `completion.rs`'s, reading a finished turn `outcome.rs`'s, permission asks
//! `asks.rs`'s, a running turn's caps `budget.rs`'s.
//!
//! - **Events** drive progress (current tool, streamed text, retries, permission asks) and can
//!   end a turn at once: when the session goes idle and the stream already showed the turn's
//!   final reply. Any other idle, error or reconnect *triggers* an HTTP check.
//! - **HTTP checks** read the turn (paging back from the newest message to ours) and, unless the
//!   final reply is already there, a fresh status: an absence (no answer, a stopped loop) is
//!   never concluded from a remembered idle. At most one check per task runs at a time; a
//!   trigger during a check makes it run once more.
//! - **Subagents**: a session created with a `parentID` that belongs to a task becomes that
//!   task's child session; its permission asks are the task's asks, its tools show in progress.
//! - **Gaps**: on every (re)connect and every reconcile tick, pending permissions are read
//!   (`GET /permission`) and sessions that are no longer working are checked, so an ask or an
//!   idle the stream missed is found within one tick.
//! - **Deleted sessions** (`session.deleted`, or a 404 on read) fail the task at once.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::asks::sweep_permissions;
use super::budget::{note_spending, over_budget, reconcile_spend, stop_over_budget};
use super::completion::{spawn_check, spawn_settle};
use super::outcome::{read_outcome, spawn_outcome, Attempts};

use super::entry::{Claim, Phase};
use super::model::{RetryInfo, TaskStatus};
use super::registry::Registry;
use super::structured::{self, Hold};
use super::turn::{self, Idle, ReplySeen};
use crate::opencode::events::{Event, PartEvent, PumpEvent};
use crate::opencode::{ErrorInfo, Server, SessionActivity};

/// How often unfinished tasks are re-checked over HTTP even without events (covers a stream
/// that silently stopped delivering).
pub(super) const RECONCILE_EVERY: Duration = Duration::from_secs(5);

/// Shared state the tracker needs.
#[derive(Clone)]
pub struct TrackerContext {
    pub registry: Arc<Registry>,
    /// Characters of streamed text kept for progress.
    pub tail_chars: usize,
    /// Characters of final text kept per task.
    pub max_result_chars: usize,
    /// Finished tasks leave memory after this (they stay readable from disk).
    pub memory_ttl: Duration,
    /// Finished tasks are forgotten after this.
    pub finished_ttl: Duration,
    /// Where task worktrees live (`<state_dir>/worktrees`), if there is a state directory.
    pub worktrees: Option<std::path::PathBuf>,
    /// The service's lock for git writes: cleaning an expired task's worktree is one.
    pub git_lock: Arc<tokio::sync::RwLock<()>>,
    /// Tasks with a completion check running, and whether another was asked for meanwhile.
    pub checks: Arc<Mutex<HashMap<String, bool>>>,
    /// Sessions with pending asks that belong to no task (someone else's work on the same
    /// server): not looked up again on every reconcile.
    pub foreign: Arc<Mutex<HashSet<String>>>,
    /// The configuration in force, shared with the service: `timeouts.task` for the turns the
    /// gateway opens itself, `limits.structured_retries` for a structured answer's corrections.
    pub config: crate::config::LiveConfig,
    /// Room for unfinished tasks, taken by starts and by follow-ups of finished tasks.
    pub capacity: Arc<super::capacity::Capacity>,
}

/// Runs until the server's pump stops (server stopped) or its process exits.
pub async fn run(
    ctx: TrackerContext,
    server: Arc<Server>,
    mut events: mpsc::UnboundedReceiver<PumpEvent>,
) {
    let mut reconcile = tokio::time::interval(RECONCILE_EVERY);
    reconcile.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let exited = async {
        match &server.process {
            Some(p) => p.wait_exit().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(exited);
    loop {
        tokio::select! {
            how = &mut exited => {
                fail_server_tasks(&ctx.registry, &server.id, "ServerExited", &format!("the OpenCode server {} {how}", server.id));
                server.stop.cancel();
                return;
            }
            _ = server.stop.cancelled() => return,
            _ = reconcile.tick() => spawn_reconcile(&ctx, &server, false),
            msg = events.recv() => match msg {
                None => return,
                Some(PumpEvent::Connected) => {
                    // Events before this connect were not seen: no open turn's streamed view
                    // is whole (a turn opened while the stream was down included).
                    mark_gaps(&ctx, &server);
                    spawn_reconcile(&ctx, &server, true);
                }
                Some(PumpEvent::Disconnected(reason)) => {
                    tracing::debug!(server_id = %server.id, %reason, "event stream disconnected");
                    mark_gaps(&ctx, &server);
                }
                Some(PumpEvent::Dropped) => mark_gaps(&ctx, &server),
                Some(PumpEvent::Event(event)) => apply(&ctx, &server, *event),
            }
        }
    }
}

/// Events of the server's open turns may have been missed: their streamed views are not used
/// (their answers are read over HTTP).
fn mark_gaps(ctx: &TrackerContext, server: &Server) {
    for id in unfinished_on(&ctx.registry, &server.id) {
        ctx.registry.update(&id, |e| e.live.streamed.mark_gap());
    }
}

/// The safety net, kept cheap: per directory in use, one `GET /session/status` and one
/// `GET /permission`; a full completion check only for tasks whose session is no longer working
/// (those are the ones a dropped event could have left behind), or for every unfinished task
/// after a reconnect (`all`).
fn spawn_reconcile(ctx: &TrackerContext, server: &Arc<Server>, all: bool) {
    let ids = unfinished_on(&ctx.registry, &server.id);
    if ids.is_empty() {
        return;
    }
    let ctx = ctx.clone();
    let server = server.clone();
    tokio::spawn(async move {
        let mut by_dir: BTreeMap<String, Vec<(String, String, u32)>> = BTreeMap::new();
        for id in ids {
            if let Some(e) = ctx.registry.get(&id) {
                by_dir.entry(e.rec.directory.clone()).or_default().push((
                    id,
                    e.rec.session_id.clone(),
                    e.rec.turn,
                ));
            }
        }
        for (dir, tasks) in by_dir {
            sweep_permissions(&ctx, &server, &dir).await;
            for (id, _, _) in &tasks {
                reconcile_spend(&ctx, &server, id).await;
            }
            if all {
                for (id, _, _) in tasks {
                    spawn_check(&ctx, &server, id, Idle::No, None);
                }
                continue;
            }
            let activity = match server.api.session_activity(&dir).await {
                Ok(a) => a,
                Err(e) => {
                    tracing::debug!(server_id = %server.id, error = %e, "reconcile: status check failed");
                    continue;
                }
            };
            for (id, session, turn) in tasks {
                let working = matches!(
                    activity.get(&session),
                    Some(SessionActivity::Busy | SessionActivity::Retry { .. })
                );
                if !working {
                    // Idle as of the turn read before the status: a continue since then opens a
                    // turn this read says nothing about.
                    spawn_check(&ctx, &server, id, Idle::Confirmed, Some(turn));
                }
            }
        }
    });
}

pub(super) fn unfinished_on(registry: &Registry, server_id: &str) -> Vec<String> {
    registry.ids_where(|e| e.rec.server_id == server_id && !e.rec.status.is_terminal())
}

/// Marks every unfinished task of a server as failed (server died or was stopped).
pub fn fail_server_tasks(
    registry: &Registry,
    server_id: &str,
    name: &str,
    reason: &str,
) -> Vec<String> {
    let ids = unfinished_on(registry, server_id);
    for id in &ids {
        registry.update(id, |e| {
            let turn = e.rec.turn;
            e.finish(
                Claim::Gone(turn),
                TaskStatus::Failed,
                Some(ErrorInfo {
                    name: name.into(),
                    message: reason.to_string(),
                }),
            );
        });
    }
    ids
}

/// What to do after an event was applied.
pub(super) enum Then {
    Nothing,
    /// Run a completion check, knowing this about the session's activity.
    Check(Idle),
    /// The turn ended: read its outcome.
    ReadOutcome(u32),
    /// The session is gone: stop what OpenCode still runs of it, and read what there is.
    Deleted(u32),
    /// A structured task's turn completed and is held: check its answer.
    Settle(u32),
    /// The turn passed one of the task's spending caps (`why` says which, by how much).
    OverBudget {
        turn: u32,
        why: String,
    },
}

/// Applies one event to the task of its session, if it is ours.
fn apply(ctx: &TrackerContext, server: &Arc<Server>, event: Event) {
    let Some(session_id) = event.session_id() else {
        return;
    };
    if let Event::SessionInfo {
        parent_id: Some(parent),
        ..
    } = &event
    {
        ctx.registry.adopt_child(parent, session_id);
        return;
    }
    let Some(owner) = ctx.registry.owner_of(session_id) else {
        return;
    };
    let then = ctx
        .registry
        .update(&owner.task_id, |e| {
            if e.rec.server_id != server.id {
                return Then::Nothing;
            }
            e.live.last_event = Instant::now();
            // Spend counts also after the turn ended for us: an abort OpenCode did not confirm
            // at once may leave a step running, and what it costs is spent all the same.
            note_spending(e, &event, owner.child);
            if e.rec.status.is_terminal() {
                return Then::Nothing;
            }
            let then = if owner.child {
                apply_child(ctx, e, &event);
                Then::Nothing
            } else {
                apply_own(ctx, e, &event)
            };
            match then {
                Then::Nothing | Then::Check(_) => over_budget(e).unwrap_or(then),
                ended => ended,
            }
        })
        .unwrap_or(Then::Nothing);
    match then {
        Then::Nothing => {}
        Then::Check(idle) => spawn_check(ctx, server, owner.task_id, idle, None),
        Then::ReadOutcome(turn) => spawn_outcome(ctx, server, owner.task_id, turn),
        Then::Settle(turn) => spawn_settle(ctx, server, owner.task_id, turn),
        Then::OverBudget { turn, why } => {
            let (ctx, server, id) = (ctx.clone(), server.clone(), owner.task_id);
            tokio::spawn(async move { stop_over_budget(&ctx, &server, &id, turn, why).await });
        }
        Then::Deleted(turn) => {
            let (ctx, server, id) = (ctx.clone(), server.clone(), owner.task_id);
            tokio::spawn(async move {
                if let Some(e) = ctx.registry.get(&id) {
                    let _ = server.api.abort(&e.rec.directory, &e.rec.session_id).await;
                }
                read_outcome(&ctx, &server, &id, turn, Attempts::Once).await;
            });
        }
    }
}

/// A subagent's event: its asks are the task's, its tools show as the task's progress.
fn apply_child(ctx: &TrackerContext, e: &mut super::entry::TaskEntry, event: &Event) {
    match event {
        Event::PermissionAsked(ask) => e.ask_permission(ask.clone()),
        Event::PermissionReplied { request_id, .. } => e.permission_answered(request_id),
        Event::PartUpdated {
            part: PartEvent::Tool { call, title },
            ..
        } => track_tool(e, &call.tool, &call.status, title),
        Event::PartDelta { field, delta, .. } if field == "text" => {
            e.push_text(delta, ctx.tail_chars)
        }
        _ => {}
    }
}

fn track_tool(e: &mut super::entry::TaskEntry, tool: &str, status: &str, title: &Option<String>) {
    match status {
        "pending" | "running" => e.live.current_tool = Some((tool.to_string(), title.clone())),
        _ => {
            e.live.tools_run += 1;
            e.live.current_tool = None;
        }
    }
}

/// An event of the task's own session.
fn apply_own(ctx: &TrackerContext, e: &mut super::entry::TaskEntry, event: &Event) -> Then {
    let mut then = Then::Nothing;
    if e.is_open() {
        e.live.streamed.apply(&e.rec.user_message_id, event);
    }
    match event {
        Event::SessionStatus { activity, .. } => match activity {
            SessionActivity::Busy => {
                if e.started() {
                    // The first `busy` of a turn follows everything the previous turn emitted,
                    // so an error seen before it was the previous turn's (the stream can lag
                    // behind the HTTP check that ended that turn).
                    e.live.session_error = None;
                }
                e.live.retry = None;
            }
            SessionActivity::Retry {
                attempt, message, ..
            } => {
                e.started();
                e.live.retry = Some(RetryInfo {
                    attempt: *attempt,
                    message: message.clone(),
                });
            }
            SessionActivity::Idle => then = Then::Check(Idle::Reported),
        },
        Event::SessionIdle { .. } => then = Then::Check(Idle::Reported),
        Event::SessionError { error, .. } => {
            e.live.session_error = Some(error.clone());
            then = Then::Check(Idle::No);
        }
        Event::SessionDeleted { session_id } => {
            let turn = e.rec.turn;
            if e.phase() != Phase::Aborting
                && e.finish(
                    Claim::Gone(turn),
                    TaskStatus::Failed,
                    Some(session_deleted(session_id)),
                )
            {
                return Then::Deleted(turn);
            }
        }
        Event::MessageUpdated {
            role,
            message_id,
            completed,
            finish,
            error,
            summary,
            agent,
            model,
            ..
        } => {
            e.rec.note_message_id(message_id);
            if role == "assistant" && ReplySeen::in_turn(message_id, &e.rec.user_message_id) {
                e.started();
                // Message ids ascend: keep the newest reply.
                let newer = e
                    .live
                    .latest_reply
                    .as_ref()
                    .is_none_or(|r| *message_id >= r.message_id);
                if newer {
                    e.live.latest_reply = Some(ReplySeen {
                        message_id: message_id.clone(),
                        completed: *completed,
                        finish: finish.clone(),
                        error: error.clone(),
                        summary: *summary,
                        agent: agent.clone(),
                        model: model.clone(),
                    });
                }
            }
        }
        Event::PartUpdated { part, .. } => match part {
            PartEvent::Tool { call, title } => track_tool(e, &call.tool, &call.status, title),
            PartEvent::StepFinish => e.live.steps += 1,
            PartEvent::Text { .. }
            | PartEvent::Compaction
            | PartEvent::StepStart
            | PartEvent::Other => {}
        },
        Event::PartDelta { field, delta, .. } => {
            if field == "text" {
                e.push_text(delta, ctx.tail_chars);
            }
        }
        Event::PermissionAsked(ask) => e.ask_permission(ask.clone()),
        Event::PermissionReplied { request_id, .. } => e.permission_answered(request_id),
        Event::SessionInfo { .. } | Event::Other => {}
    }
    // Idle, and the events already showed the turn's final reply: the turn is over without a
    // round trip; its outcome is read over HTTP off the waiters' path.
    if matches!(then, Then::Check(Idle::Reported)) && e.is_open() {
        if let Some(v) = turn::conclude_from_events(e.live.latest_reply.as_ref()) {
            if v.status == TaskStatus::Completed {
                match structured::hold(e) {
                    Hold::Held(turn) => return Then::Settle(turn),
                    Hold::Already => return Then::Nothing,
                    Hold::No => {}
                }
            }
            // The answer as streamed, when the stream showed all of it: the wait that returns
            // now carries it without a read. Otherwise it is read over HTTP (off this path).
            match e.live.streamed.derive(&e.rec.user_message_id) {
                Some(state) if state.finished => {
                    e.rec.outcome = Some(state.cap_text(ctx.max_result_chars));
                }
                _ => tracing::debug!(
                    task_id = %e.rec.id,
                    gap = e.live.streamed.has_gap(),
                    "the stream did not show the whole turn; reading it over HTTP"
                ),
            }
            let turn = e.rec.turn;
            e.finish(Claim::Open(turn), v.status, v.error);
            return Then::ReadOutcome(turn);
        }
    }
    then
}

/// How a task whose session was deleted behind the gateway's back (`session.deleted`, or a 404
/// on reading it) ends.
pub(super) fn session_deleted(session_id: &str) -> ErrorInfo {
    ErrorInfo {
        name: "SessionDeleted".into(),
        message: format!("the task's OpenCode session {session_id} was deleted while the task ran"),
    }
}

#[cfg(test)]
mod tests {
    use crate::tasks::entry::Claim;
    // The tracker's rooms are tested together here: they share these fixtures.
    use super::super::asks::{remember_foreign, MAX_FOREIGN};
    use super::super::completion::*;
    use super::super::outcome::*;
    use super::super::turn::TurnState;

    #[test]
    fn a_completed_writing_tool_makes_an_empty_list_suspect() {
        use crate::opencode::ToolCall;
        let turn = |tools: &[(&str, &str)]| TurnState {
            tools: tools
                .iter()
                .map(|(tool, status)| ToolCall {
                    tool: tool.to_string(),
                    status: status.to_string(),
                    title: None,
                    error: None,
                })
                .collect(),
            ..TurnState::default()
        };
        let edits = |tools: &[(&str, &str)]| edited_files(Some(&turn(tools)));
        assert_eq!(
            edits(&[("read", "completed"), ("write", "completed")]),
            Edits::Surely
        );
        assert_eq!(edits(&[("edit", "completed")]), Edits::Surely);
        assert_eq!(
            edits(&[("bash", "completed"), ("edit", "completed")]),
            Edits::Surely
        );
        // A shell command or a subagent may have written files: doubted for a while too.
        assert_eq!(edits(&[("bash", "completed")]), Edits::Maybe);
        assert_eq!(edits(&[("task", "completed")]), Edits::Maybe);
        assert_eq!(edits(&[("write", "error")]), Edits::No);
        assert_eq!(
            edits(&[("bash", "error"), ("read", "completed")]),
            Edits::No
        );
        assert_eq!(edits(&[]), Edits::No);
        assert_eq!(edited_files(None), Edits::No);
    }

    /// The set of foreign sessions stays bounded however many a shared server shows.
    #[test]
    fn foreign_sessions_are_remembered_within_a_bound() {
        let mut set = HashSet::new();
        for i in 0..(3 * MAX_FOREIGN) {
            remember_foreign(
                &mut set,
                vec![format!("ses_{i}"), format!("ses_{i}_parent")],
            );
            assert!(set.len() <= MAX_FOREIGN, "{}", set.len());
        }
        assert!(set.contains(&format!("ses_{}", 3 * MAX_FOREIGN - 1)));
    }

    /// A check that panics leaves no entry behind, so the task can be checked again.
    #[tokio::test]
    async fn a_panicking_check_is_forgotten() {
        let checks: Arc<Mutex<HashMap<String, bool>>> = Arc::default();
        checks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert("tsk_a".into(), false);
        let held = checks.clone();
        let run = tokio::spawn(async move {
            let _unwind = ForgetCheckOnPanic {
                checks: held,
                task_id: "tsk_a".into(),
            };
            panic!("a check that panics");
        });
        assert!(run.await.is_err(), "the task panicked");
        assert!(checks.lock().unwrap_or_else(|p| p.into_inner()).is_empty());
    }

    use super::*;
    use crate::opencode::{Api, PermissionAsk};
    use crate::tasks::entry::TaskEntry;

    fn context(registry: Arc<Registry>) -> TrackerContext {
        TrackerContext {
            registry,
            tail_chars: 100,
            max_result_chars: 1000,
            memory_ttl: Duration::from_secs(600),
            finished_ttl: Duration::from_secs(3600),
            worktrees: None,
            git_lock: Default::default(),
            checks: Default::default(),
            foreign: Default::default(),
            config: crate::config::LiveConfig::new(Arc::new(crate::gateway::test_config())),
            capacity: Default::default(),
        }
    }

    /// A registry holding task `tsk_a` (session `ses_a`) in its first turn, then `f` applied.
    fn registry_with(f: impl FnOnce(&mut TaskEntry)) -> Arc<Registry> {
        let registry = Arc::new(Registry::default());
        let mut e = TaskEntry::in_first_turn("tsk_a", "ses_a");
        f(&mut e);
        registry.insert(e);
        registry
    }

    /// Confirmed-idle checks that find the same unfinished step count up; any other finding
    /// (another step, a remembered idle, a completed step) starts over.
    #[test]
    fn unfinished_steps_are_counted_per_step_and_only_when_idle_is_confirmed() {
        let mut e = TaskEntry::in_first_turn("tsk_a", "ses_a");
        let stuck = |newest: &str| TurnState {
            user_message_seen: true,
            assistant_messages: 1,
            newest_message_id: Some(newest.into()),
            ..TurnState::default()
        };
        let count =
            |e: &mut TaskEntry, t: &TurnState, idle| note_unfinished(&mut e.live, t, idle).checks;
        assert_eq!(count(&mut e, &stuck("m2"), Idle::Confirmed), 1);
        assert_eq!(count(&mut e, &stuck("m2"), Idle::Confirmed), 2);
        assert_eq!(
            count(&mut e, &stuck("m3"), Idle::Confirmed),
            1,
            "another step"
        );
        assert_eq!(
            count(&mut e, &stuck("m3"), Idle::Reported),
            0,
            "not confirmed"
        );
        let done = TurnState {
            latest_completed: true,
            ..stuck("m3")
        };
        assert_eq!(count(&mut e, &stuck("m3"), Idle::Confirmed), 1);
        assert_eq!(count(&mut e, &done, Idle::Confirmed), 0, "completed");
    }

    /// A server whose port nobody listens on.
    fn unreachable_server() -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        Server {
            id: "srv".into(),
            api: Api::new(
                &format!("http://127.0.0.1:{port}"),
                None,
                Duration::from_secs(2),
            )
            .expect("client"),
            directory: "/w".into(),
            version: "test".into(),
            process: None,
            stop: Default::default(),
            credentials: None,
        }
    }

    /// A structured answer held for its check while a cancel claims the task: the check gives
    /// way to the abort. If the abort then fails (the task runs on), the turn can be held and
    /// checked again, rather than every later check finding it `Already` held.
    #[tokio::test]
    async fn a_check_that_gave_way_to_a_failed_abort_lets_the_turn_be_held_again() {
        let registry = registry_with(|e| {
            e.rec.structured = Some(crate::tasks::record::StructuredState::new(
                serde_json::json!({ "type": "object" }),
            ));
            e.rec.outcome = Some(TurnState {
                text: "{}".into(),
                ..Default::default()
            });
        });
        let ctx = context(registry.clone());
        let server = Arc::new(unreachable_server());
        assert_eq!(
            registry.update("tsk_a", structured::hold),
            Some(Hold::Held(1))
        );
        assert_eq!(registry.update("tsk_a", |e| e.claim_abort(1)), Some(true));
        structured::settle(&ctx, &server, "tsk_a", 1).await;
        registry.update("tsk_a", |e| e.abort_refused(1));
        assert_eq!(
            registry.update("tsk_a", structured::hold),
            Some(Hold::Held(1))
        );
        structured::settle(&ctx, &server, "tsk_a", 1).await;
        let e = registry.get("tsk_a").expect("task");
        assert_eq!(e.rec.status, TaskStatus::Completed);
        assert_eq!(
            e.rec.structured.and_then(|s| s.value),
            Some(serde_json::json!({}))
        );
    }

    /// Outside git the reason names each file an editing tool wrote once, completed tools only,
    /// and stops after twenty names.
    #[test]
    fn an_untracked_turn_names_what_its_editing_tools_wrote() {
        use crate::opencode::ToolCall;
        let call = |tool: &str, status: &str, title: &str| ToolCall {
            tool: tool.into(),
            status: status.into(),
            title: Some(title.into()),
            error: None,
        };
        let mut e = TaskEntry::in_first_turn("tsk_a", "ses_a");
        e.rec.directory = "/scratch".into();
        let mut tools = vec![
            call("write", "completed", "b.txt"),
            call("edit", "completed", "a.txt"),
            call("write", "completed", "b.txt"),
            call("write", "error", "failed.txt"),
            call("bash", "completed", "touch c.txt"),
        ];
        e.rec.outcome = Some(TurnState {
            tools: tools.clone(),
            ..TurnState::default()
        });
        assert_eq!(
            untracked_files(&e.rec),
            "OpenCode lists a turn's changed files only in a git repository, and /scratch is not \
             in one; its editing tools wrote a.txt, b.txt"
        );
        tools.extend((0..25).map(|i| call("write", "completed", &format!("f{i:02}"))));
        e.rec.outcome = Some(TurnState {
            tools,
            ..TurnState::default()
        });
        let why = untracked_files(&e.rec);
        assert!(why.ends_with(", f17 and 7 more"), "{why}");
        e.rec.outcome = None;
        assert!(untracked_files(&e.rec).ends_with("is not in one"));
    }

    /// A turn known to have run no tool changed nothing: its list is empty without a request
    /// (the server here is unreachable, so a request would record an error instead). A turn
    /// that ran one, or whose outcome is not known whole, is asked about.
    #[tokio::test]
    async fn only_a_turn_that_ran_no_tool_gets_its_empty_list_without_asking() {
        use crate::opencode::ToolCall;
        let finished = |tools: Vec<ToolCall>, capped: bool| {
            registry_with(move |e| {
                e.rec.outcome = Some(TurnState {
                    user_message_seen: true,
                    finished: true,
                    tools,
                    messages_capped: capped,
                    ..TurnState::default()
                });
                e.finish(Claim::Gone(e.rec.turn), TaskStatus::Completed, None);
            })
        };
        let server = unreachable_server();
        let read = |registry: Arc<Registry>| {
            let ctx = context(registry.clone());
            let server = &server;
            async move {
                read_files(&ctx, server, "tsk_a", 1, Attempts::Patient).await;
                let rec = registry.get("tsk_a").expect("task").rec;
                (rec.files_changed, rec.files_error.is_some())
            }
        };
        assert_eq!(read(finished(vec![], false)).await, (Some(vec![]), false));
        let bash = ToolCall {
            tool: "bash".into(),
            status: "completed".into(),
            title: None,
            error: None,
        };
        assert_eq!(read(finished(vec![bash], false)).await, (None, true));
        assert_eq!(read(finished(vec![], true)).await, (None, true));
        let unknown = registry_with(|e| {
            e.finish(Claim::Gone(e.rec.turn), TaskStatus::Completed, None);
        });
        assert_eq!(read(unknown).await, (None, true));
    }

    #[tokio::test]
    async fn an_outcome_that_cannot_be_read_is_said_not_left_empty() {
        let registry = registry_with(|e| {
            e.finish(Claim::Gone(e.rec.turn), TaskStatus::Completed, None);
        });
        let ctx = context(registry.clone());
        read_outcome(&ctx, &unreachable_server(), "tsk_a", 1, Attempts::Once).await;
        let after = registry.get("tsk_a").expect("task");
        assert!(after.rec.outcome.is_none());
        let why = after.rec.outcome_error.expect("the failure is recorded");
        assert!(why.contains("could not be read"), "{why}");
    }

    #[test]
    fn a_subagents_ask_is_its_parents_and_only_until_answered() {
        let registry = registry_with(|e| e.rec.status = TaskStatus::Running);
        registry.adopt_child("ses_a", "ses_child");
        let ctx = context(registry.clone());
        let ask = PermissionAsk {
            id: "per_1".into(),
            session_id: "ses_child".into(),
            permission: "bash".into(),
            patterns: vec!["touch x".into()],
            metadata: serde_json::Value::Null,
        };
        let owner = registry.owner_of("ses_child").expect("child");
        registry.update(&owner.task_id, |e| {
            apply_child(&ctx, e, &Event::PermissionAsked(ask.clone()))
        });
        let asked = registry.get("tsk_a").expect("task");
        assert_eq!(asked.rec.status, TaskStatus::WaitingPermission);
        assert_eq!(
            asked
                .rec
                .permissions
                .iter()
                .map(|p| p.session_id.as_str())
                .collect::<Vec<_>>(),
            ["ses_child"]
        );
        registry.update("tsk_a", |e| {
            apply_child(
                &ctx,
                e,
                &Event::PermissionReplied {
                    session_id: "ses_child".into(),
                    request_id: "per_1".into(),
                },
            )
        });
        assert_eq!(
            registry.get("tsk_a").map(|e| e.rec.status),
            Some(TaskStatus::Running)
        );
    }
}

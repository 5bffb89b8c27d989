//! The tracker: one per OpenCode server, it turns the server's events and HTTP reads into task
//! state. The verdicts themselves ("the turn is over, and this is its answer") are
//! [`turn`](super::turn)'s; the tracker feeds it and applies what it says.
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

use super::model::{RetryInfo, TaskStatus};
use super::registry::{Phase, Registry, SessionOwner};
use super::structured::{self, Hold};
use super::turn::{self, Idle, ReplySeen, TurnState};
use crate::opencode::events::{Event, PartEvent, PumpEvent};
use crate::opencode::{ErrorInfo, PermissionReply, Server, SessionActivity};

/// How often unfinished tasks are re-checked over HTTP even without events (covers a stream
/// that silently stopped delivering).
const RECONCILE_EVERY: Duration = Duration::from_secs(5);

/// Pauses between attempts to read a finished turn's outcome (then it is reported unreadable).
const OUTCOME_RETRIES: [Duration; 5] = [
    Duration::from_millis(250),
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(8),
];

/// Levels of subagents followed up from a session whose parent is unknown.
const MAX_NESTING: usize = 4;

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

/// The gateway's housekeeping, whatever servers run: finished tasks leave memory, expired
/// records and their worktrees go, and memory is given back once things are quiet. It ran on
/// each server's reconcile tick before, so after `stop_server`, or in a restarted gateway that
/// only answers reads, nothing was ever evicted or swept.
pub async fn housekeep(ctx: TrackerContext) {
    let mut tick = tokio::time::interval(RECONCILE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The registry's change count when memory was last given back (see `give_back_when_quiet`).
    let mut trimmed_at = 0;
    loop {
        tick.tick().await;
        if evict(&ctx) {
            trimmed_at = ctx.registry.version();
        }
        give_back_when_quiet(&ctx, &mut trimmed_at);
    }
}

/// Events of the server's open turns may have been missed: their streamed views are not used
/// (their answers are read over HTTP).
fn mark_gaps(ctx: &TrackerContext, server: &Server) {
    for id in unfinished_on(&ctx.registry, &server.id) {
        ctx.registry.update(&id, |e| e.live.streamed.mark_gap());
    }
}

/// Lets finished tasks go (see [`Registry::evict_finished`]) and, in the background, cleans the
/// worktrees of those whose records were deleted: nobody can reach them through the gateway any
/// more, so they would pile up in the state directory otherwise.
///
/// Returns whether freed memory was given back to the system (it is when tasks left memory).
pub fn evict(ctx: &TrackerContext) -> bool {
    let evicted = ctx
        .registry
        .evict_finished(ctx.memory_ttl, ctx.finished_ttl);
    let trimmed = evicted.left_memory > 0;
    if trimmed {
        tracing::debug!(
            tasks = evicted.left_memory,
            worktrees = evicted.worktrees.len(),
            "finished tasks left memory"
        );
        crate::memory::give_back();
    }
    // Worktrees of records that expired in memory, then of those a due sweep of the state
    // directory finds (the sweep reads the directory: on a blocking thread), in one background
    // task: git is async and slow.
    let sweep = evicted
        .sweep_due
        .then(|| (ctx.registry.clone(), ctx.finished_ttl));
    if !evicted.worktrees.is_empty() || sweep.is_some() {
        let (dir, lock, mut worktrees) = (
            ctx.worktrees.clone(),
            ctx.git_lock.clone(),
            evicted.worktrees,
        );
        tokio::spawn(async move {
            if let Some((registry, ttl)) = sweep {
                let sweeping = registry.clone();
                match tokio::task::spawn_blocking(move || sweeping.sweep_disk(ttl)).await {
                    Ok(swept) => worktrees.extend(swept),
                    Err(e) => {
                        tracing::warn!(error = %e, "sweeping expired task records failed");
                        registry.sweep_failed(ttl);
                    }
                }
            }
            if let Some(dir) = dir.filter(|_| !worktrees.is_empty()) {
                super::gc::clean_expired(&lock, &dir, worktrees).await;
            }
        });
    }
    trimmed
}

/// Gives freed memory back once a burst of work is over: when no task is running and tasks
/// changed since the last time. A fan-out of many tasks leaves the allocator holding the
/// buffers its turns used (event frames, streamed views, HTTP bodies) in free chunks between
/// live ones; without this they stay resident until finished tasks leave memory, minutes
/// later. At most once per quiet spell, so a steady load pays nothing.
fn give_back_when_quiet(ctx: &TrackerContext, trimmed_at: &mut u64) {
    let changes = ctx.registry.version();
    if changes == *trimmed_at || ctx.registry.any(|e| !e.is_settled()) {
        return;
    }
    *trimmed_at = changes;
    crate::memory::give_back();
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

/// Counts what an open turn spent from its messages read over HTTP, when its streamed view has
/// a gap (a reconnect, a dropped event, a restart): the stream's `message.updated` of a step
/// finished meanwhile never comes, and a turn could otherwise spend up to its cap again after
/// each gap. Its own session's messages of the turn, and its subagents' (their child sessions
/// are listed by OpenCode, also one whose `session.created` was missed: it is adopted, so its
/// later events count too). A cap passed is acted on as from the stream.
pub(super) async fn reconcile_spend(ctx: &TrackerContext, server: &Arc<Server>, task_id: &str) {
    let Some(e) = ctx.registry.get(task_id) else {
        return;
    };
    if !e.is_open() || !e.live.streamed.has_gap() {
        return;
    }
    let (dir, session, since, turn) = (
        e.rec.directory.clone(),
        e.rec.session_id.clone(),
        e.rec.user_message_id.clone(),
        e.rec.turn,
    );
    let mut seen = Vec::new();
    match server.api.turn_messages(&dir, &session, &since).await {
        Ok(messages) => seen.extend(messages),
        Err(e) => {
            tracing::debug!(task_id, error = %e, "reconcile: reading the turn's messages failed");
            return;
        }
    }
    match server.api.children(&dir, &session).await {
        Ok(children) => {
            for child in children {
                ctx.registry.adopt_child(&session, &child);
                if let Ok(messages) = server.api.turn_messages(&dir, &child, &since).await {
                    seen.extend(messages);
                }
            }
        }
        Err(e) => {
            tracing::debug!(task_id, error = %e, "reconcile: listing subagent sessions failed")
        }
    }
    let then = ctx.registry.update(task_id, |e| {
        if e.rec.turn != turn || !e.is_open() {
            return None;
        }
        // Message ids sort by time across sessions: what is newer than our prompt is the turn's.
        for m in seen
            .iter()
            .filter(|m| m.role == crate::opencode::Role::Assistant && m.id > since)
        {
            e.live.spending.note(&m.id, m.cost, &m.tokens);
        }
        over_budget(e)
    });
    if let Some(Some(Then::OverBudget { turn, why })) = then {
        stop_over_budget(ctx, server, task_id, turn, why).await;
    }
}

/// Reads the pending permissions of one directory and gives each to its task (a subagent's ask
/// to the task of its parent session); an ask a task still shows that is no longer pending (it
/// was answered while the stream was down) is cleared.
async fn sweep_permissions(ctx: &TrackerContext, server: &Server, directory: &str) {
    let started = Instant::now();
    let asks = match server.api.permissions(directory).await {
        Ok(a) => a,
        Err(e) => {
            tracing::debug!(server_id = %server.id, error = %e, "reconcile: permission list failed");
            return;
        }
    };
    let mut pending: HashSet<String> = HashSet::new();
    for ask in asks {
        pending.insert(ask.id.clone());
        if let Some(owner) = resolve_owner(ctx, server, directory, &ask.session_id).await {
            ctx.registry
                .update(&owner.task_id, |e| e.ask_permission(ask));
        }
    }
    // Recorded before this list was read, and not in it: answered while the stream was down.
    let stale = |e: &super::registry::TaskEntry| -> Vec<String> {
        e.rec
            .permissions
            .iter()
            .filter(|p| !pending.contains(&p.id))
            .filter(|p| e.live.asks.get(&p.id).is_some_and(|a| a.since < started))
            .map(|p| p.id.clone())
            .collect()
    };
    for id in ctx.registry.ids_where(|e| {
        e.rec.server_id == server.id && e.rec.directory == directory && !stale(e).is_empty()
    }) {
        ctx.registry.update(&id, |e| {
            for ask in stale(e) {
                e.permission_answered(&ask);
            }
        });
    }
}

/// Rejects every ask OpenCode still lists for `task_id` (its own session's or a subagent's),
/// except those `answered` (rejected already). Called after an abort: OpenCode leaves a pending ask
/// listed when it aborts the session, and an ask raised just before the abort may not have
/// reached the task through the event stream yet, so only OpenCode's own list finds it.
pub(super) async fn reject_pending_asks(
    ctx: &TrackerContext,
    server: &Server,
    directory: &str,
    task_id: &str,
    answered: &[String],
) {
    let asks = match server.api.permissions(directory).await {
        Ok(a) => a,
        Err(e) => {
            tracing::debug!(task_id, error = %e, "after an abort: the permission list failed");
            return;
        }
    };
    for ask in asks {
        if answered.contains(&ask.id) {
            continue;
        }
        let owner = resolve_owner(ctx, server, directory, &ask.session_id).await;
        if owner.is_some_and(|o| o.task_id == task_id) {
            if let Err(e) = server
                .api
                .reply_permission(directory, &ask.id, PermissionReply::Reject)
                .await
            {
                tracing::warn!(task_id, error = %e, "rejecting a pending permission after the abort failed");
            }
        }
    }
}

/// The task a session belongs to: the registry's answer, or for a session it has not seen, the
/// task of its parent (a subagent whose `session.created` the stream did not show), followed up
/// a few levels.
async fn resolve_owner(
    ctx: &TrackerContext,
    server: &Server,
    directory: &str,
    session_id: &str,
) -> Option<SessionOwner> {
    if let Some(owner) = ctx.registry.owner_of(session_id) {
        return Some(owner);
    }
    let is_foreign = |s: &str| {
        ctx.foreign
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(s)
    };
    if is_foreign(session_id) {
        return None;
    }
    let mut chain = vec![session_id.to_string()];
    for _ in 0..MAX_NESTING {
        let current = chain.last()?.clone();
        let parent = match server.api.session_parent(directory, &current).await {
            Ok(Some(parent)) if !is_foreign(&parent) => parent,
            // A top-level session that is not a task's, or one whose family is known not to be.
            Ok(_) => break,
            // Not known now; ask again next time.
            Err(_) => return None,
        };
        if ctx.registry.owner_of(&parent).is_some() {
            // Tie the whole chain, from the known parent down.
            let mut above = parent;
            for child in chain.iter().rev() {
                ctx.registry.adopt_child(&above, child)?;
                above = child.clone();
            }
            return ctx.registry.owner_of(session_id);
        }
        chain.push(parent);
    }
    remember_foreign(
        &mut ctx.foreign.lock().unwrap_or_else(|p| p.into_inner()),
        chain,
    );
    None
}

/// Most sessions known not to be any task's. A server shared with people and other tools
/// shows many; past this the set starts over, and a session seen again costs one lookup.
const MAX_FOREIGN: usize = 4096;

/// Notes sessions that belong to no task, within [`MAX_FOREIGN`].
fn remember_foreign(set: &mut HashSet<String>, sessions: Vec<String>) {
    if set.len() + sessions.len() > MAX_FOREIGN {
        set.clear();
    }
    set.extend(sessions);
}

fn unfinished_on(registry: &Registry, server_id: &str) -> Vec<String> {
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
            if !e.rec.status.is_terminal() {
                e.finish(
                    TaskStatus::Failed,
                    Some(ErrorInfo {
                        name: name.into(),
                        message: reason.to_string(),
                    }),
                );
            }
        });
    }
    ids
}

/// What to do after an event was applied.
enum Then {
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

/// Notes what an assistant message of the turn (the task's own, or a subagent's) reports it
/// has spent so far.
fn note_spending(e: &mut super::registry::TaskEntry, event: &Event, child: bool) {
    if let Event::MessageUpdated {
        message_id,
        role,
        cost,
        tokens,
        ..
    } = event
    {
        let ours = child || ReplySeen::in_turn(message_id, &e.rec.user_message_id);
        if role == "assistant" && ours {
            e.live.spending.note(message_id, *cost, tokens);
        }
    }
}

/// The open turn has spent past one of its task's caps.
fn over_budget(e: &super::registry::TaskEntry) -> Option<Then> {
    let budget = e.rec.budget.as_ref().filter(|_| e.is_open())?;
    let (cost, tokens) = e.budget_spend();
    let why = budget.passed_by(cost, tokens)?;
    Some(Then::OverBudget {
        turn: e.rec.turn,
        why,
    })
}

/// Aborts a turn that passed a spending cap: the task ends `failed` (`BudgetExceeded`), and its
/// partial answer and changed files are read as after any abort.
async fn stop_over_budget(
    ctx: &TrackerContext,
    server: &Arc<Server>,
    task_id: &str,
    turn: u32,
    why: String,
) {
    tracing::info!(task_id, %why, "the turn passed its budget; aborting it");
    let error = ErrorInfo {
        name: "BudgetExceeded".into(),
        message: format!(
            "the turn was stopped because {why}; its partial answer and changed files are kept"
        ),
    };
    let stopped = super::abort::abort_turn(
        ctx,
        server,
        task_id,
        Some(turn),
        TaskStatus::Failed,
        Some(error),
        super::abort::IfAbortFails::FinishAnyway,
    )
    .await;
    if let Ok(Some(turn)) = stopped {
        read_outcome(ctx, server, task_id, turn, Attempts::Patient).await;
        read_files(ctx, server, task_id, turn, Attempts::Patient).await;
    }
}

/// A subagent's event: its asks are the task's, its tools show as the task's progress.
fn apply_child(ctx: &TrackerContext, e: &mut super::registry::TaskEntry, event: &Event) {
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

fn track_tool(
    e: &mut super::registry::TaskEntry,
    tool: &str,
    status: &str,
    title: &Option<String>,
) {
    match status {
        "pending" | "running" => e.live.current_tool = Some((tool.to_string(), title.clone())),
        _ => {
            e.live.tools_run += 1;
            e.live.current_tool = None;
        }
    }
}

/// An event of the task's own session.
fn apply_own(ctx: &TrackerContext, e: &mut super::registry::TaskEntry, event: &Event) -> Then {
    let mut then = Then::Nothing;
    if e.is_open() {
        e.live.streamed.apply(&e.rec.user_message_id, event);
    }
    match event {
        Event::SessionStatus { activity, .. } => match activity {
            SessionActivity::Busy => {
                if e.rec.status == TaskStatus::Pending {
                    e.rec.status = TaskStatus::Running;
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
                if e.rec.status == TaskStatus::Pending {
                    e.rec.status = TaskStatus::Running;
                }
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
            if e.phase() != Phase::Aborting {
                e.finish(TaskStatus::Failed, Some(session_deleted(session_id)));
                return Then::Deleted(e.rec.turn);
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
                if e.rec.status == TaskStatus::Pending {
                    e.rec.status = TaskStatus::Running;
                }
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
            e.finish(v.status, v.error);
            return Then::ReadOutcome(e.rec.turn);
        }
    }
    then
}

/// How a task whose session was deleted behind the gateway's back (`session.deleted`, or a 404
/// on reading it) ends.
fn session_deleted(session_id: &str) -> ErrorInfo {
    ErrorInfo {
        name: "SessionDeleted".into(),
        message: format!("the task's OpenCode session {session_id} was deleted while the task ran"),
    }
}

/// Runs a completion check unless one is running for the task; then that one runs again.
/// `for_turn`: the turn `idle` was observed for, when it was read before the check (reconcile).
pub fn spawn_check(
    ctx: &TrackerContext,
    server: &Arc<Server>,
    task_id: String,
    idle: Idle,
    for_turn: Option<u32>,
) {
    {
        let mut checks = ctx.checks.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(again) = checks.get_mut(&task_id) {
            *again = true;
            return;
        }
        checks.insert(task_id.clone(), false);
    }
    let ctx = ctx.clone();
    let server = server.clone();
    tokio::spawn(async move {
        // A panic inside a check must not leave the entry behind: every later trigger would
        // then only mark it to run again, and the task would never be checked again.
        let _unwind = ForgetCheckOnPanic {
            checks: ctx.checks.clone(),
            task_id: task_id.clone(),
        };
        let (mut idle, mut for_turn) = (idle, for_turn);
        loop {
            // This check ended the turn: read its changed files now, off the completion path,
            // so the wait that returns at completion does not pay for the round trip and later
            // results find them. A turn that something else ended (most often the idle event
            // right after the one that started this check) is that path's to read: reading it
            // here too doubled the gateway's requests at a fan-out's busiest moment.
            if let Some(turn) = check_completion(&ctx, &server, &task_id, idle, for_turn).await {
                read_files(&ctx, &server, &task_id, turn, Attempts::Patient).await;
            }
            let mut checks = ctx.checks.lock().unwrap_or_else(|p| p.into_inner());
            match checks.get_mut(&task_id) {
                Some(again) if *again => {
                    *again = false;
                    // What the later trigger knew is not kept: ask OpenCode.
                    (idle, for_turn) = (Idle::No, None);
                }
                _ => {
                    checks.remove(&task_id);
                    return;
                }
            }
        }
    });
}

/// Removes a task's entry from the running checks when its check task unwinds.
struct ForgetCheckOnPanic {
    checks: Arc<Mutex<HashMap<String, bool>>>,
    task_id: String,
}

impl Drop for ForgetCheckOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.checks
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&self.task_id);
        }
    }
}

/// Reads the turn over HTTP and finishes the task if [`turn::conclude`] says the turn is over.
/// Safe to call any time and any number of times: it only ever finishes the turn it read, and
/// never a task that has moved on (a newer turn) or is being aborted. `known` is what the
/// trigger said about the session: `Confirmed` (a status read just now) or `Reported` (an idle
/// event) spare a status read when the turn's final reply is already there; otherwise the status
/// is read fresh. `for_turn` is the turn `known` was observed for, if it was read earlier.
///
/// Returns the turn this call ended, if it ended one (a structured answer it held and checked
/// counts only if the check then finished the task; its files were read by the check).
pub async fn check_completion(
    ctx: &TrackerContext,
    server: &Arc<Server>,
    task_id: &str,
    known: Idle,
    for_turn: Option<u32>,
) -> Option<u32> {
    let registry = &ctx.registry;
    let entry = registry.get(task_id)?;
    if !entry.is_open() {
        return None;
    }
    let known = match for_turn {
        Some(t) if t != entry.rec.turn => Idle::No,
        _ => known,
    };
    let rec = &entry.rec;
    let mut turn = match read_turn(server, rec, ctx.max_result_chars).await {
        Ok(turn) => turn,
        Err(e) if e.http_status() == Some(404) => {
            registry.update(task_id, |e| {
                if e.rec.turn == entry.rec.turn && !e.rec.status.is_terminal() {
                    let error = session_deleted(&e.rec.session_id);
                    e.finish(TaskStatus::Failed, Some(error));
                }
            });
            // Gone with its session: there are no files to read.
            return None;
        }
        Err(e) => {
            tracing::debug!(task_id, error = %e, "completion check failed; will retry");
            return None;
        }
    };
    let idle = if turn.finished && known != Idle::No {
        known
    } else {
        match server.api.session_activity(&rec.directory).await {
            Ok(a) => match a.get(&rec.session_id) {
                None | Some(SessionActivity::Idle) => Idle::Confirmed,
                Some(_) => Idle::No,
            },
            Err(e) => {
                tracing::debug!(task_id, error = %e, "completion check: status read failed; will retry");
                return None;
            }
        }
    };
    // The messages were read before the status: a final step that started and ended between
    // the two reads is missing from them, and "idle without a final answer" would judge a
    // completed turn stopped. Read them again, now that the session is known to be idle.
    if !turn.finished && idle == Idle::Confirmed {
        match read_turn(server, rec, ctx.max_result_chars).await {
            Ok(again) => turn = again,
            Err(e) => {
                tracing::debug!(task_id, error = %e, "completion check: second read failed; will retry");
                return None;
            }
        }
    }
    let ended = registry.update(task_id, |e| {
        if e.rec.turn != entry.rec.turn || !e.is_open() {
            return Ended::No;
        }
        if let Some(newest) = &turn.newest_message_id {
            e.rec.note_message_id(newest);
        }
        let age = e.live.turn_started.elapsed().as_millis() as u64;
        let stuck = note_unfinished(&mut e.live, &turn, idle);
        let verdict = turn::conclude(&turn, idle, e.live.session_error.as_ref(), age)
            .or_else(|| turn::abandoned(&turn, idle, stuck));
        match verdict {
            Some(v) => {
                e.rec.outcome = Some(turn.clone());
                if v.status == TaskStatus::Completed {
                    match structured::hold(e) {
                        Hold::Held(turn) => return Ended::Held(turn),
                        Hold::Already => return Ended::No,
                        Hold::No => {}
                    }
                }
                e.finish(v.status, v.error);
                return Ended::Finished(e.rec.turn);
            }
            None => {
                if idle == Idle::No && e.rec.status == TaskStatus::Pending && turn.user_message_seen
                {
                    e.rec.status = TaskStatus::Running;
                }
            }
        }
        Ended::No
    });
    match ended? {
        Ended::Finished(turn) => Some(turn),
        Ended::Held(turn) => {
            // The check reads the files of a round it ends.
            structured::settle(ctx, server, task_id, turn).await;
            None
        }
        Ended::No => None,
    }
}

/// What a completion check did with the turn it read.
enum Ended {
    /// Nothing: still running, or ended by someone else meanwhile.
    No,
    /// Finished the task at this turn.
    Finished(u32),
    /// Held this turn's structured answer for its check.
    Held(u32),
}

/// Counts this check if it confirmed the session idle with the turn's newest step unfinished
/// (the same step as the checks before it); any other finding starts the count over.
fn note_unfinished(
    live: &mut super::registry::Live,
    turn: &TurnState,
    idle: Idle,
) -> turn::Unfinished {
    let step = turn
        .newest_message_id
        .clone()
        .filter(|_| idle == Idle::Confirmed && turn.newest_step_unfinished());
    let Some(step) = step else {
        live.unfinished = None;
        return turn::Unfinished::default();
    };
    let (checks, since) = match live.unfinished.take() {
        Some((seen, checks, since)) if seen == step => (checks + 1, since),
        _ => (1, Instant::now()),
    };
    live.unfinished = Some((step, checks, since));
    turn::Unfinished {
        checks,
        for_ms: since.elapsed().as_millis() as u64,
    }
}

/// Checks a held structured answer off the event path.
fn spawn_settle(ctx: &TrackerContext, server: &Arc<Server>, task_id: String, turn: u32) {
    let ctx = ctx.clone();
    let server = server.clone();
    tokio::spawn(async move { structured::settle(&ctx, &server, &task_id, turn).await });
}

fn spawn_outcome(ctx: &TrackerContext, server: &Arc<Server>, task_id: String, turn: u32) {
    let ctx = ctx.clone();
    let server = server.clone();
    tokio::spawn(async move {
        read_outcome(&ctx, &server, &task_id, turn, Attempts::Patient).await;
        // Then its changed files, off the completion path as for a turn concluded over HTTP:
        // a record that has them answers for them after a restart too.
        read_files(&ctx, &server, &task_id, turn, Attempts::Patient).await;
    });
}

/// How hard [`read_outcome`] and [`read_files`] try.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempts {
    /// In the background: retry with backoff ([`OUTCOME_RETRIES`]; for a list of changed files
    /// still empty after an edit, [`EMPTY_DIFF_RETRIES`] then [`EMPTY_DIFF_LATE`]).
    Patient,
    /// On a caller's path (a result call, a flush at stop): one read of the outcome; the short
    /// schedule for an empty list of changed files, left unknown if it is still empty.
    Once,
}

/// Reads a finished turn's outcome (text, tokens, tools) and the files it changed; if it cannot
/// be read, the record says why, so the result never presents an empty text as the answer.
pub async fn read_outcome(
    ctx: &TrackerContext,
    server: &Server,
    task_id: &str,
    turn_no: u32,
    attempts: Attempts,
) {
    let mut last_error = String::new();
    let pauses: &[Duration] = match attempts {
        Attempts::Patient => &OUTCOME_RETRIES,
        Attempts::Once => &[],
    };
    for pause in std::iter::once(Duration::ZERO).chain(pauses.iter().copied()) {
        tokio::time::sleep(pause).await;
        let Some(entry) = ctx.registry.get(task_id) else {
            return;
        };
        if entry.rec.turn != turn_no || entry.rec.outcome.is_some() {
            break;
        }
        match read_turn_once(ctx, server, &entry.rec).await {
            Ok(state) => {
                ctx.registry.update(task_id, |e| {
                    if e.rec.turn == turn_no && e.rec.outcome.is_none() {
                        e.rec.outcome = Some(state);
                        e.rec.outcome_error = None;
                    }
                });
                break;
            }
            Err((e, gone)) => {
                last_error = e;
                if gone {
                    break;
                }
            }
        }
        if server.exited().is_some() || server.stop.is_cancelled() {
            break;
        }
    }
    ctx.registry.update(task_id, |e| {
        if e.rec.turn == turn_no && e.rec.outcome.is_none() && !last_error.is_empty() {
            e.rec.outcome_error = Some(format!(
                "the turn's final text could not be read from OpenCode: {last_error}"
            ));
        }
    });
}

/// Reads the task's current turn over HTTP (paging back to its user message) and judges it with
/// [`turn::derive`], keeping at most `max_chars` of its text.
pub(super) async fn read_turn(
    server: &Server,
    rec: &super::record::TaskRecord,
    max_chars: usize,
) -> Result<TurnState, crate::opencode::OpencodeError> {
    let messages = server
        .api
        .turn_messages(&rec.directory, &rec.session_id, &rec.user_message_id)
        .await?;
    Ok(turn::derive(&messages, &rec.user_message_id).cap_text(max_chars))
}

/// One read of a finished turn; a read that does not yet show the final reply is an error (the
/// caller retries), and so is a session that is gone (`true`: retrying is pointless).
async fn read_turn_once(
    ctx: &TrackerContext,
    server: &Server,
    rec: &super::record::TaskRecord,
) -> Result<TurnState, (String, bool)> {
    let state = read_turn(server, rec, ctx.max_result_chars)
        .await
        .map_err(|e| (e.to_string(), e.http_status() == Some(404)))?;
    // A structured turn held for its check completed, like a `completed` one.
    let completed = rec.status == TaskStatus::Completed
        || rec
            .structured
            .as_ref()
            .is_some_and(|s| s.checking == Some(rec.turn));
    if state.user_message_seen && (state.finished || !completed) {
        Ok(state)
    } else {
        Err((
            "the session does not show the turn's final reply yet".into(),
            false,
        ))
    }
}

/// The files the turn changed (OpenCode's diff since our user message), once; for a structured
/// task, those of every turn of the round, corrections included. Read in the background right
/// after the turn's outcome (never on the path a wait returns on), again when a result is asked
/// for while they are still unknown, and before the server goes. A failed read is recorded
/// (`files_error`) so that a result never presents "no list" as "nothing changed".
///
/// Each turn's list is read in the background by the one path that ended the turn (the event
/// that concluded it, the completion check that did, an abort); a turn that ran no tool is
/// known to have changed nothing and costs no request.
pub async fn read_files(
    ctx: &TrackerContext,
    server: &Server,
    task_id: &str,
    turn_no: u32,
    attempts: Attempts,
) {
    let Some(entry) = ctx.registry.get(task_id) else {
        return;
    };
    let rec = &entry.rec;
    if rec.turn != turn_no || rec.files_changed.is_some() {
        return;
    }
    if rec.ran_no_tool() {
        ctx.registry.update(task_id, |e| {
            if e.rec.turn == turn_no && e.rec.files_changed.is_none() {
                e.rec.files_changed = Some(Vec::new());
                e.rec.files_error = None;
            }
        });
        return;
    }
    // Outside a git repository OpenCode takes no snapshots and lists nothing whatever the turn
    // did: an empty list there would read as "changed nothing". Say the list is unknown instead
    // of asking (and asking again, as an empty list after an edit is) for nothing. A failed
    // check falls through to the read, which records its own error if OpenCode is unreachable.
    if let Ok(false) = server.api.tracks_changes(&rec.directory).await {
        note_files_error(ctx, task_id, turn_no, untracked_files(rec));
        return;
    }
    let mut messages: Vec<&str> = rec
        .structured
        .as_ref()
        .map(|s| s.corrected_messages.iter().map(String::as_str).collect())
        .unwrap_or_default();
    messages.push(&rec.user_message_id);
    // The turn's list is the union of its messages' lists (a structured task's corrections
    // are messages of the same turn).
    let read = || async {
        let mut turns = Vec::with_capacity(messages.len());
        for message in &messages {
            turns.push(
                server
                    .api
                    .changed_files(&rec.directory, &rec.session_id, Some(message))
                    .await?,
            );
        }
        Ok::<_, crate::opencode::OpencodeError>(structured::round_files(turns))
    };
    // An empty list right after a turn that edited files may only mean OpenCode has not
    // written it yet (see `EMPTY_DIFF_RETRIES`): read again before believing it. A caller's
    // read that still finds none leaves the list unknown (the result says so) for the
    // background read, which goes on longer, to settle.
    let edited = edited_files(rec.outcome.as_ref());
    let late: &[Duration] = match (attempts, edited) {
        (Attempts::Patient, Edits::Surely) => &EMPTY_DIFF_LATE,
        _ => &[],
    };
    let mut pauses = EMPTY_DIFF_RETRIES.iter().chain(late);
    let files = loop {
        match read().await {
            Ok(files) if files.is_empty() && edited != Edits::No => match pauses.next() {
                Some(pause) => {
                    tracing::debug!(
                        task_id,
                        "OpenCode lists no changed files yet for a turn that edited files; \
                         reading again"
                    );
                    tokio::time::sleep(*pause).await;
                }
                None if attempts == Attempts::Once => {
                    tracing::debug!(task_id, "the turn's changed files are not listed yet");
                    return;
                }
                None => break files,
            },
            Ok(files) => break files,
            Err(e) => {
                tracing::debug!(task_id, error = %e, "reading the turn's changed files failed");
                let why = format!("the turn's changed files could not be read from OpenCode: {e}");
                note_files_error(ctx, task_id, turn_no, why);
                return;
            }
        }
    };
    ctx.registry.update(task_id, |e| {
        if e.rec.turn == turn_no {
            e.rec.files_changed = Some(files);
            e.rec.files_error = None;
        }
    });
}

/// Records why turn `turn_no`'s list of changed files is unknown, unless the list is known by
/// now or the task has moved on to another turn.
fn note_files_error(ctx: &TrackerContext, task_id: &str, turn_no: u32, why: String) {
    ctx.registry.update(task_id, |e| {
        if e.rec.turn == turn_no && e.rec.files_changed.is_none() {
            e.rec.files_error = Some(why);
        }
    });
}

/// Pauses before reading a turn's changed files again while OpenCode lists none for a turn that
/// edited files. OpenCode computes that list (`GET /session/{id}/diff?messageID=`) from its
/// snapshots in the background after the turn ends, and `session.idle` can come first: read at
/// once, the list of a turn that wrote a file was empty on a loaded machine. Usually the first
/// read has it; these cover about 3 s, off the completion path (a result call that finds no
/// list yet waits for them too).
///
/// Then, in the background only, [`EMPTY_DIFF_LATE`]: with 200 tasks writing files in one
/// repository at once, 3–17 of them still had no list after 3 s, and OpenCode listed every one
/// of those later. An empty list is believed only after these (a write of a file git ignores,
/// or of the same bytes, changes nothing OpenCode can list).
const EMPTY_DIFF_RETRIES: [Duration; 6] = [
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(200),
    Duration::from_millis(400),
    Duration::from_millis(800),
    Duration::from_millis(1600),
];

/// The background read's further pauses after [`EMPTY_DIFF_RETRIES`]: about 25 s in all.
const EMPTY_DIFF_LATE: [Duration; 3] = [
    Duration::from_millis(3200),
    Duration::from_millis(6400),
    Duration::from_millis(12800),
];

/// Why a turn in a directory OpenCode keeps no snapshots of has no list of changed files, with
/// the files its editing tools named (their titles are the paths), as a hint of what it wrote.
fn untracked_files(rec: &super::record::TaskRecord) -> String {
    const NAMED: usize = 20;
    let mut named: Vec<&str> = editing_calls(rec.outcome.as_ref())
        .filter_map(|t| t.title.as_deref())
        .collect();
    named.sort_unstable();
    named.dedup();
    let mut why = format!(
        "OpenCode lists a turn's changed files only in a git repository, and {} is not in one",
        rec.directory
    );
    if !named.is_empty() {
        let more = named.len().saturating_sub(NAMED);
        why.push_str("; its editing tools wrote ");
        why.push_str(&named[..named.len().min(NAMED)].join(", "));
        if more > 0 {
            why.push_str(&format!(" and {more} more"));
        }
    }
    why
}

/// OpenCode's tools that write files themselves.
const EDITING_TOOLS: [&str; 5] = ["write", "edit", "multiedit", "patch", "apply_patch"];

/// Tools that may write files without saying so: a shell command, a subagent (whose edits are
/// its child session's calls, not the turn's).
const MAYBE_EDITING_TOOLS: [&str; 2] = ["bash", "task"];

/// How sure it is that a turn changed files, which decides how long an empty list of changed
/// files is doubted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Edits {
    /// A file-editing tool completed: an empty list is read again for about 3 s, and in the
    /// background for about 25 s more, before it is believed.
    Surely,
    /// A shell command or a subagent completed: most change nothing, so an empty list is read
    /// again for about 3 s only (the first read was believed before, and lagged behind edits).
    Maybe,
    /// No tool that writes ran: an empty list is believed at once.
    No,
}

/// How sure it is that the turn changed files.
fn edited_files(outcome: Option<&TurnState>) -> Edits {
    if editing_calls(outcome).next().is_some() {
        return Edits::Surely;
    }
    let maybe = outcome
        .into_iter()
        .flat_map(|o| &o.tools)
        .any(|t| t.status == "completed" && MAYBE_EDITING_TOOLS.contains(&t.tool.as_str()));
    if maybe {
        Edits::Maybe
    } else {
        Edits::No
    }
}

/// The turn's completed calls of [`EDITING_TOOLS`].
fn editing_calls(outcome: Option<&TurnState>) -> impl Iterator<Item = &crate::opencode::ToolCall> {
    outcome
        .into_iter()
        .flat_map(|o| &o.tools)
        .filter(|t| t.status == "completed" && EDITING_TOOLS.contains(&t.tool.as_str()))
}

#[cfg(test)]
mod tests {
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
    use crate::tasks::registry::TaskEntry;

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
            e.rec.structured = Some(structured::StructuredState::new(
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
                e.finish(TaskStatus::Completed, None);
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
        let unknown = registry_with(|e| e.finish(TaskStatus::Completed, None));
        assert_eq!(read(unknown).await, (None, true));
    }

    #[tokio::test]
    async fn an_outcome_that_cannot_be_read_is_said_not_left_empty() {
        let registry = registry_with(|e| e.finish(TaskStatus::Completed, None));
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

//! Reading a finished turn over HTTP: its answer, tools and tokens (the outcome), and the files
//! it changed, with the retries each needs (OpenCode writes both in the background after the
//! turn ends).

use std::sync::Arc;
use std::time::Duration;

use crate::tasks::context::TaskContext;
use crate::tasks::lifecycle::turn::{self, TurnState};
use crate::tasks::model::TaskStatus;

use crate::opencode::{FileChange, Server};

/// Pauses between attempts to read a finished turn's outcome (then it is reported unreadable).
pub(in crate::tasks) const OUTCOME_RETRIES: [Duration; 5] = [
    Duration::from_millis(250),
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(8),
];

pub(in crate::tasks) fn spawn_outcome(
    ctx: &TaskContext,
    server: &Arc<Server>,
    task_id: String,
    turn: u32,
) {
    let ctx = ctx.clone();
    let server = server.clone();
    tokio::spawn(async move { after_turn(&ctx, &server, &task_id, turn, Attempts::Patient).await });
}

/// What follows every end of a turn, whoever ended it (its events, a completion check, a
/// cancel, the deadline, a cap, a hold's settle, a deleted session), off the waiters' path:
/// its outcome (if not read yet), then its changed files (a record that has them answers for
/// them after a restart too), then, for a remote task, its work back from its worker (see
/// `fetch.rs`), so that turn's work stays readable here once the worker is gone. This is the
/// one way out of a turn: an end that skipped it left a remote task's last work on a worker
/// that could vanish.
pub(in crate::tasks) async fn after_turn(
    ctx: &TaskContext,
    server: &Arc<Server>,
    task_id: &str,
    turn: u32,
    attempts: Attempts,
) {
    read_outcome(ctx, server, task_id, turn, attempts).await;
    read_files(ctx, server, task_id, turn, attempts).await;
    release_instance(ctx, server, task_id, turn).await;
    super::fetch::after_turn(ctx, task_id).await;
}

/// Once a worktree task's turn has been read and the task is done, OpenCode's instance for its
/// directory is disposed: the directory is the task's alone, and an instance kept for every
/// worktree ever run grew a worker's OpenCode without bound (see `opencode::instances`). A
/// follow-up boots it again. Checked again under the directory's lock, so a turn opened
/// meanwhile keeps it. A failure costs only memory: logged, not reported.
async fn release_instance(ctx: &TaskContext, server: &Arc<Server>, task_id: &str, turn: u32) {
    let done = |e: &crate::tasks::lifecycle::entry::TaskEntry| {
        e.rec.turn == turn
            && e.is_settled()
            && e.rec.workspace.as_ref().is_some_and(|w| !w.discarded)
    };
    let Some(directory) = ctx
        .registry
        .get(task_id)
        .filter(|e| done(e))
        .map(|e| e.rec.directory.clone())
    else {
        return;
    };
    let still_done = || ctx.registry.get(task_id).is_some_and(|e| done(&e));
    match server.api.dispose_instance(&directory, still_done).await {
        Ok(disposed) => tracing::debug!(task_id, turn, disposed, "the worktree's instance"),
        Err(e) => {
            tracing::debug!(task_id, turn, error = %e, "disposing the worktree's instance failed")
        }
    }
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
    ctx: &TaskContext,
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
pub(in crate::tasks) async fn read_turn(
    server: &Server,
    rec: &crate::tasks::lifecycle::record::TaskRecord,
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
pub(in crate::tasks) async fn read_turn_once(
    ctx: &TaskContext,
    server: &Server,
    rec: &crate::tasks::lifecycle::record::TaskRecord,
) -> Result<TurnState, (String, bool)> {
    let state = read_turn(server, rec, ctx.max_result_chars)
        .await
        .map_err(|e| (e.to_string(), e.http_status() == Some(404)))?;
    // A structured turn held for its check completed, like a `completed` one.
    let completed = rec.status() == TaskStatus::Completed || rec.is_held();
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
    ctx: &TaskContext,
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
    let mut messages: Vec<&str> = rec.earlier_rounds();
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
        Ok::<_, crate::opencode::OpencodeError>(round_files(turns))
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
pub(in crate::tasks) fn note_files_error(
    ctx: &TaskContext,
    task_id: &str,
    turn_no: u32,
    why: String,
) {
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
pub(in crate::tasks) const EMPTY_DIFF_RETRIES: [Duration; 6] = [
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(200),
    Duration::from_millis(400),
    Duration::from_millis(800),
    Duration::from_millis(1600),
];

/// The background read's further pauses after [`EMPTY_DIFF_RETRIES`]: about 25 s in all.
pub(in crate::tasks) const EMPTY_DIFF_LATE: [Duration; 3] = [
    Duration::from_millis(3200),
    Duration::from_millis(6400),
    Duration::from_millis(12800),
];

/// Why a turn in a directory OpenCode keeps no snapshots of has no list of changed files, with
/// the files its editing tools named (their titles are the paths), as a hint of what it wrote.
pub(in crate::tasks) fn untracked_files(
    rec: &crate::tasks::lifecycle::record::TaskRecord,
) -> String {
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
pub(in crate::tasks) const EDITING_TOOLS: [&str; 5] =
    ["write", "edit", "multiedit", "patch", "apply_patch"];

/// Tools that may write files without saying so: a shell command, a subagent (whose edits are
/// its child session's calls, not the turn's).
pub(in crate::tasks) const MAYBE_EDITING_TOOLS: [&str; 2] = ["bash", "task"];

/// How sure it is that a turn changed files, which decides how long an empty list of changed
/// files is doubted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::tasks) enum Edits {
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
pub(in crate::tasks) fn edited_files(outcome: Option<&TurnState>) -> Edits {
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
pub(in crate::tasks) fn editing_calls(
    outcome: Option<&TurnState>,
) -> impl Iterator<Item = &crate::opencode::ToolCall> {
    outcome
        .into_iter()
        .flat_map(|o| &o.tools)
        .filter(|t| t.status == "completed" && EDITING_TOOLS.contains(&t.tool.as_str()))
}
/// The files a structured round changed, from each of its turns' own lists (oldest first): one
/// entry per file, with the status it first had (a file the round added stays `added`) and the
/// lines added and removed summed over the turns.
pub fn round_files(turns: Vec<Vec<FileChange>>) -> Vec<FileChange> {
    let mut merged: Vec<FileChange> = Vec::new();
    for change in turns.into_iter().flatten() {
        match merged.iter_mut().find(|m| m.file == change.file) {
            Some(m) => {
                m.additions += change.additions;
                m.deletions += change.deletions;
                if m.status.is_none() {
                    m.status = change.status;
                }
            }
            None => merged.push(change),
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::opencode::FileChange;
    use crate::tasks::context::fixtures::{context, registry_with, unreachable_server};
    use crate::tasks::lifecycle::entry::Claim;
    use crate::tasks::lifecycle::entry::TaskEntry;
    use crate::tasks::lifecycle::turn::TurnState;
    use crate::tasks::model::TaskStatus;
    use crate::tasks::store::registry::Registry;
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
                e.finish(Claim::Open(e.rec.turn), TaskStatus::Completed, None);
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
            e.finish(Claim::Open(e.rec.turn), TaskStatus::Completed, None);
        });
        assert_eq!(read(unknown).await, (None, true));
    }

    #[tokio::test]
    async fn an_outcome_that_cannot_be_read_is_said_not_left_empty() {
        let registry = registry_with(|e| {
            e.finish(Claim::Open(e.rec.turn), TaskStatus::Completed, None);
        });
        let ctx = context(registry.clone());
        read_outcome(&ctx, &unreachable_server(), "tsk_a", 1, Attempts::Once).await;
        let after = registry.get("tsk_a").expect("task");
        assert!(after.rec.outcome.is_none());
        let why = after.rec.outcome_error.expect("the failure is recorded");
        assert!(why.contains("could not be read"), "{why}");
    }

    #[test]
    fn a_rounds_files_are_those_of_all_its_turns() {
        let change = |file: &str, status: Option<&str>, additions, deletions| FileChange {
            file: file.into(),
            status: status.map(Into::into),
            additions,
            deletions,
        };
        let merged = round_files(vec![
            vec![
                change("a.rs", Some("added"), 10, 0),
                change("b.rs", None, 1, 1),
            ],
            vec![],
            vec![
                change("a.rs", Some("modified"), 2, 3),
                change("c.rs", Some("deleted"), 0, 4),
            ],
        ]);
        assert_eq!(
            merged,
            [
                change("a.rs", Some("added"), 12, 3),
                change("b.rs", None, 1, 1),
                change("c.rs", Some("deleted"), 0, 4),
            ]
        );
    }
}

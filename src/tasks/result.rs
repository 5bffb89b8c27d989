//! The result of a task's current turn, paged.
//!
//! Everything a result reports (status, turn, text, tokens) comes from one snapshot of the task,
//! so a result that overlaps a `continue_task` can never label one turn's text with another
//! turn's number, and it always agrees with what `get_task_status` said at that moment.

use super::error::TaskError;
use super::model::TaskResult;
use super::service::TaskService;
use crate::tasks::lifecycle::turn::TurnState;
use crate::tasks::turn::outcome;
use crate::tasks::turn::outcome::Attempts;
use crate::tasks::ResultView;

/// Whether a result may ask OpenCode for the turn's changed files when they are not known yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Files {
    /// Read them (one HTTP round trip) if they are not known.
    Read,
    /// Report them only if they are known already.
    IfKnown,
}

impl TaskService {
    /// The task's result, with its unified diff in place of the answer for `view: diff`.
    pub async fn result_view(
        &self,
        task_id: &str,
        view: ResultView,
    ) -> Result<TaskResult, TaskError> {
        let mut result = self.result(task_id).await?;
        if view == ResultView::Diff {
            let (diff, capped, stale) = self.placement.diff(task_id).await?;
            result.total_chars = diff.chars().count() as u64;
            result.text = diff;
            result.text_capped = capped;
            result.text_error = stale;
            result.view = Some(ResultView::Diff);
        }
        Ok(result)
    }

    /// The full result of the current turn, with the whole text (the caller pages it for its
    /// host). For an unfinished task it reports what is known so far, with the same status
    /// `get_task_status` gives. A finished turn whose messages cannot be read says so in
    /// `text_error`; an empty text is never presented as the answer.
    pub async fn result(&self, task_id: &str) -> Result<TaskResult, TaskError> {
        self.result_with(task_id, Files::Read).await
    }

    /// [`Self::result`], reading the turn's changed files from OpenCode only if `files` says so
    /// (a wait returning at completion lists them if they are known already; the tracker reads
    /// them right after the turn ends).
    pub async fn result_with(&self, task_id: &str, files: Files) -> Result<TaskResult, TaskError> {
        self.tracker.restored().await;
        let mut entry = self.tracker.entry(task_id)?;
        let finished = entry.rec.status().is_terminal();
        let known = self.placement.pool.get(&entry.rec.server_id);
        // A task that ended before it had a session (its start failed, or it was cancelled
        // while queued or starting) has no turn to read: its `error` says why.
        let never_started = entry.rec.session_id.is_empty();
        // Never read, nor tried: a read that failed recorded why.
        let unread = (entry.rec.outcome.is_none() && entry.rec.outcome_error.is_none())
            || (entry.rec.files_changed.is_none() && entry.rec.files_error.is_none());
        let server = match known.as_ref().filter(|s| s.exited().is_none()) {
            Some(s) => Some(s.clone()),
            // A finished turn whose text or files the gateway that ran it never read: that
            // gateway exited, and its server with it (this gateway does not know the server at
            // all). Asked for them, read them from the server in use now, which has the
            // session. A server that died under this gateway is left as it is, a stopped one
            // was read from as it stopped, and a wait (`IfKnown`) starts no server.
            None if known.is_none()
                && !never_started
                && finished
                && unread
                && files == Files::Read =>
            {
                match self.placement.server_in_use_for(&entry).await {
                    Ok(s) => Some(s),
                    Err(e) => {
                        tracing::info!(task_id, error = %e, "no server to read a finished task's unread turn from");
                        None
                    }
                }
            }
            None => None,
        };
        let mut text_error = entry.rec.outcome_error.clone();
        if entry.rec.outcome.is_none() {
            if let Some(s) = &server {
                if finished {
                    // The background read has not landed yet: read it now, and keep it.
                    outcome::read_outcome(
                        &self.tracker,
                        s,
                        task_id,
                        entry.rec.turn,
                        Attempts::Once,
                    )
                    .await;
                    match self.registry.get(task_id) {
                        Some(now) if now.rec.turn == entry.rec.turn => {
                            text_error = now.rec.outcome_error.clone();
                            entry = now;
                        }
                        _ => {}
                    }
                } else {
                    // A running turn: what it has said so far.
                    let max_chars = self.tracker.config().limits.max_result_chars as usize;
                    if let Ok(partial) = outcome::read_turn(s, &entry.rec, max_chars).await {
                        entry.rec.outcome = Some(partial);
                    }
                }
            } else if finished && text_error.is_none() && !never_started {
                text_error = Some(format!(
                    "the turn's final text was never read, and its OpenCode server {} is gone",
                    entry.rec.server_id
                ));
            }
        }
        if finished && files == Files::Read && entry.rec.files_changed.is_none() {
            if let Some(s) = &server {
                outcome::read_files(
                    &self.tracker,
                    s,
                    task_id,
                    entry.rec.turn,
                    outcome::Attempts::Once,
                )
                .await;
                if let Some(now) = self
                    .registry
                    .get(task_id)
                    .filter(|n| n.rec.turn == entry.rec.turn)
                {
                    // Its error too: a list that could not be read, or that OpenCode does
                    // not keep there, must not read as "changed nothing".
                    entry.rec.files_changed = now.rec.files_changed;
                    entry.rec.files_error = now.rec.files_error;
                }
            }
        }
        // A finished turn without its list of changed files says why, so that no list never
        // reads as "changed nothing"; while a wait returns at completion (`IfKnown`) the
        // background read may simply not have landed yet.
        let files_error = match (&entry.rec.files_changed, &entry.rec.files_error) {
            (Some(_), _) => None,
            _ if !finished || never_started => None,
            (None, Some(why)) => Some(why.clone()),
            (None, None) if server.is_none() => Some(format!(
                "the turn's changed files were never read, and its OpenCode server {} is gone",
                entry.rec.server_id
            )),
            // Read just now, and OpenCode still lists none for a turn whose tools edited files:
            // it writes the list after the turn, late on a busy server.
            (None, None) if files == Files::Read => Some(
                "OpenCode has not listed this turn's changed files yet, though its tools edited \
                 files; ask for the result again in a few seconds"
                    .into(),
            ),
            (None, None) => None,
        };
        let outcome: TurnState = entry.rec.outcome.clone().unwrap_or_default();
        if finished && entry.rec.outcome.is_none() && text_error.is_none() && !never_started {
            text_error = Some("the turn's final text could not be read from OpenCode".into());
        }
        let total = outcome.text.chars().count() as u64;
        let workspace = match &entry.rec.workspace {
            Some(w) => Some(self.placement.workspace_view(w, &entry.rec.id).await),
            None => None,
        };
        // A structured task's value and errors are the finished round's only; its attempts show
        // while it is still being corrected too.
        let structured = entry.rec.structured.as_ref();
        let round_over = structured.filter(|_| finished);
        Ok(TaskResult {
            task_id: entry.rec.id.clone(),
            status: entry.rec.status(),
            phase: entry.phase().shown().map(str::to_string),
            text: outcome.text.clone(),
            truncated: false,
            total_chars: total,
            next_offset: None,
            offset: 0,
            text_capped: outcome.text_capped,
            messages_capped: outcome.messages_capped,
            files_changed: entry.rec.files_changed.clone().unwrap_or_default(),
            workspace,
            view: None,
            error: entry.rec.error.clone(),
            text_error,
            files_error,
            structured: round_over.and_then(|s| s.value.clone()),
            structured_error: round_over.and_then(|s| s.error.clone()),
            structured_attempts: structured.map(|s| s.attempts.clone()),
            checks: entry
                .rec
                .checks
                .as_ref()
                .map(|c| c.view(finished, entry.rec.turn)),
            escalations: entry.rec.escalations.clone(),
            confined: entry.rec.confinement.as_ref().map(|c| c.is_confined()),
            unconfined: entry
                .rec
                .confinement
                .as_ref()
                .and_then(|c| c.why_not().map(str::to_string)),
            turn: Some(entry.rec.turn),
            model: entry.model(),
            model_requested: entry.model_requested(),
            variant: entry.rec.variant.clone(),
            agent: entry.agent(),
            tokens: Some(outcome.tokens),
            cost: Some(outcome.cost),
            compactions: Some(outcome.compactions),
            compaction_tokens: (outcome.compactions > 0).then_some(outcome.compaction_tokens),
            finish: outcome.finish.clone(),
            duration_ms: Some(entry.duration().as_millis() as u64),
            tools: Some(outcome.tools.clone()),
            omitted: None,
        })
    }
}

//! A follow-up (`continue_task`): the next turn of a finished task, in the same session, on the
//! server it ran on (`placement/`), with its model resolved again if asked (`resolve.rs`), its
//! structured answer's schema and its checks carried on (`checks/`), and the turn opened as every
//! turn is (`turn/follow.rs`).

use super::error::TaskError;
use super::lifecycle::entry::TaskEntry;
use super::model::TaskSnapshot;
use super::resolve;
use super::service::TaskService;
use crate::tasks::checks::structured;
use crate::tasks::turn::follow::{open_turn, Follows};

/// A validated `continue_task` request.
#[derive(Debug, Clone, Default)]
pub struct ContinueTask {
    pub task_id: String,
    pub prompt: String,
    pub agent: Option<String>,
    pub model: Option<String>,
    /// Checks to add to the task's (see `checks`).
    pub checks: Vec<String>,
}

impl TaskService {
    /// Sends a follow-up in the same session. Refused while the task is still working: a prompt
    /// sent to a busy session is queued and batched into the running LLM call, which would blur
    /// which result belongs to which prompt. Of two concurrent continues exactly one opens the
    /// turn (a compare-and-set on the turn number under the registry lock); the other gets
    /// `conflict`.
    pub async fn continue_task(&self, req: ContinueTask) -> Result<TaskSnapshot, TaskError> {
        self.tracker.restored().await;
        let entry = self.tracker.own_entry(&req.task_id)?;
        let still_running = |e: &TaskEntry| {
            TaskError::Conflict(format!(
                "task {} is still {}; wait for it (opencode_wait_for_task) or cancel it before continuing",
                e.rec.id,
                e.rec.status().as_str()
            ))
        };
        if !entry.is_settled() {
            return Err(still_running(&entry));
        }
        if entry.rec.workspace.as_ref().is_some_and(|w| w.discarded) {
            return Err(TaskError::Conflict(format!(
                "task {}'s worktree was discarded (opencode_discard_task), so there is nothing to \
                 continue in; start a new task",
                entry.rec.id
            )));
        }
        let server = self.placement.server_for_follow_up(&entry).await?;
        let agent = req.agent.clone().or(entry.rec.agent.clone());
        let model = match req.model.as_deref() {
            Some(_) => {
                resolve::choose(
                    &self.config(),
                    &server,
                    &entry.rec.directory,
                    agent.as_deref(),
                    req.model.as_deref(),
                    None,
                    None,
                )
                .await?
                .model
            }
            None => {
                if req.agent.is_some() {
                    resolve::choose(
                        &self.config(),
                        &server,
                        &entry.rec.directory,
                        agent.as_deref(),
                        None,
                        None,
                        None,
                    )
                    .await?;
                }
                entry.rec.model.clone()
            }
        };
        // A structured task's schema still applies: the follow-up asks for the JSON again, and a
        // new round of checks (with the whole retry budget) begins.
        let prompt = match &entry.rec.structured {
            Some(s) => format!("{}{}", req.prompt, structured::instruction(&s.schema)),
            None => req.prompt.clone(),
        };
        let own_model = req.model.is_some();
        let more_checks =
            crate::tasks::checks::commands::commands_for(&self.config(), None, &req.checks)
                .map_err(TaskError::InvalidArgument)?;
        if entry.rec.checks.as_ref().map_or(0, |c| c.commands.len()) + more_checks.len()
            > crate::tasks::checks::commands::MAX_CHECKS
        {
            return Err(TaskError::InvalidArgument(format!(
                "a task takes at most {} checks, with those it has",
                crate::tasks::checks::commands::MAX_CHECKS
            )));
        }
        open_turn(
            &self.tracker,
            &server,
            &entry.rec.id,
            entry.rec.turn,
            Follows::Finished,
            &prompt,
            agent,
            model,
            |e| {
                if own_model {
                    // A model of its own: the turn is no longer the tier's work, and the tier's
                    // variant belongs to the tier's model.
                    e.rec.tier = None;
                    e.rec.variant = None;
                }
                if let Some(s) = e.rec.structured.as_mut() {
                    s.restart();
                }
                match e.rec.checks.as_mut() {
                    Some(c) => c.restart(&more_checks),
                    None if !more_checks.is_empty() => {
                        e.rec.checks =
                            Some(super::lifecycle::record::ChecksState::new(more_checks));
                    }
                    None => {}
                }
            },
        )
        .await?;
        self.tracker.snapshot(&entry.rec.id, false)
    }
}

//! Opening a task's next turn: a host's `continue_task` and the gateway's own structured
//! corrections take the same path, so both are claimed, capped and timed the same way.

use std::sync::Arc;

use crate::ids;
use crate::opencode::{RunOn, Server};
use crate::tasks::context::TaskContext;
use crate::tasks::error::TaskError;
use crate::tasks::lifecycle::entry::TaskEntry;
use crate::tasks::spend::caps;

/// What a new turn follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::tasks) enum Follows {
    /// A finished turn: a host's `continue_task`.
    Finished,
    /// A structured answer held for its check: the gateway's automatic correction
    /// (`structured::settle`).
    Correction,
}

/// Opens the next turn of a task, the one path for a host's follow-up and the gateway's
/// corrections. Claims the turn atomically: only a task still at `expected_turn`, in the state
/// `follows` names and not being aborted, moves on (of two concurrent continues exactly one
/// wins; the other gets `conflict`). A worktree task claims under the git lock, so an apply or
/// discard of it is either done before the agent writes again, or sees it running and is
/// refused. `prepare` adjusts the entry, under the same lock, before the turn begins. Then the
/// prompt is sent and the turn's deadline armed; if OpenCode refuses the prompt, the claim is
/// undone and the previous turn stays as it was. Returns the new turn.
#[allow(clippy::too_many_arguments)]
pub(in crate::tasks) async fn open_turn(
    ctx: &TaskContext,
    server: &Arc<Server>,
    task_id: &str,
    expected_turn: u32,
    follows: Follows,
    prompt: &str,
    agent: Option<String>,
    model: Option<String>,
    prepare: impl FnOnce(&mut TaskEntry),
) -> Result<u32, TaskError> {
    let entry = ctx
        .registry
        .get(task_id)
        .ok_or_else(|| TaskError::UnknownTasks(vec![task_id.to_string()]))?;
    // Every turn that calls a model is held to the day's cap, and a finished task brought back
    // to work takes room among the unfinished ones (a correction's task never stopped being
    // unfinished). The room is held until the claim made the task unfinished again.
    let config = ctx.config.get();
    caps::within_daily_cap(&config, ctx.registry.spent_today())?;
    let root = entry
        .rec
        .workspace
        .as_ref()
        .map_or(entry.rec.directory.as_str(), |w| w.path.as_str());
    let opt_out = crate::sandbox::tier_opt_out(&config, entry.rec.tier.as_deref());
    let boot = config.timeouts.server_start.get();
    let confinement = super::confine::admit(server, root, opt_out, boot).await?;
    let room = match follows {
        Follows::Finished => Some(ctx.capacity.spread(
            &ctx.registry,
            &[crate::tasks::store::capacity::Place::of(
                &config,
                entry.rec.worker(),
            )],
            1,
        )?),
        Follows::Correction => None,
    };
    let git_guard = match entry.rec.workspace {
        Some(_) => Some(ctx.git_lock.write().await),
        None => None,
    };
    let claimed = ctx
        .registry
        .update(task_id, |e| {
            let ready = match follows {
                Follows::Finished => e.is_settled(),
                Follows::Correction => e.is_checking(expected_turn),
            };
            if e.rec.turn != expected_turn || !ready {
                return Err(TaskError::Conflict(format!(
                    "task {} is still {}; wait for it (opencode_wait_for_task) or cancel it before continuing",
                    e.rec.id,
                    e.rec.status().as_str()
                )));
            }
            if e.rec.workspace.as_ref().is_some_and(|w| w.discarded) {
                return Err(TaskError::Conflict(format!(
                    "task {}'s worktree was discarded meanwhile; start a new task",
                    e.rec.id
                )));
            }
            let previous = e.clone();
            prepare(e);
            e.rec.confinement = Some(confinement.clone());
            let message_id = ids::message_id_after(e.rec.newest_message_id.as_deref());
            let opened = match follows {
                Follows::Finished => e.begin_turn(message_id.clone(), agent.clone(), model.clone()),
                Follows::Correction => e.begin_correction(
                    expected_turn,
                    message_id.clone(),
                    agent.clone(),
                    model.clone(),
                ),
            };
            if let Err(refused) = opened {
                *e = previous;
                return Err(TaskError::Conflict(format!("task {task_id}: {refused}")));
            }
            Ok((previous, message_id, e.rec.turn, e.rec.variant.clone()))
        })
        .ok_or_else(|| TaskError::UnknownTasks(vec![task_id.to_string()]))?;
    let (previous, message_id, turn, variant) = claimed?;
    drop((git_guard, room));
    if let Err(e) = server
        .api
        .prompt_async(
            &entry.rec.directory,
            &entry.rec.session_id,
            &message_id,
            prompt,
            RunOn {
                agent: agent.as_deref(),
                model: model.as_deref(),
                variant: variant.as_deref(),
            },
        )
        .await
    {
        // The turn never started: the previous turn's result stays readable. Only our own turn
        // is undone.
        ctx.registry.update(task_id, |e| {
            if e.rec.turn == turn && e.rec.user_message_id == message_id {
                *e = previous;
            }
        });
        return Err(e.into());
    }
    // The deadline in force now: a reload applies to the turns opened after it.
    let limit = ctx.config.get().timeouts.task.get();
    ctx.arm_deadline(server, task_id, turn, limit, limit);
    Ok(turn)
}

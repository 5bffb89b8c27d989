//! A remote task's work brought back: after each of its turns, what the agent changed in its
//! worktree on the worker is committed there and fetched into the origin repository here under
//! the gateway's own ref (`workers::repo::fetch_back`). Diff, apply and results then read that
//! commit as they read a local worktree's state, and a worker that is gone later still leaves
//! every turn fetched before it went.
//!
//! A fetch runs at the end of every turn (from `outcome`, beside reading the turn's answer) and
//! again when a diff or an apply finds the last fetch older than the task's turn, so a caller
//! never reads a state the worker has moved past. Fetches write a ref of the user's repository,
//! so they take the gateway's git lock like every git write.

use std::sync::Arc;

use crate::config::Config;
use crate::tasks::context::TaskContext;
use crate::tasks::error::TaskError;
use crate::tasks::lifecycle::record::WorkspaceRecord;
use crate::workers::{self, repo, Remote};

/// The remote worker `name` of `config`: its connection and its OpenCode command.
pub(in crate::tasks) fn remote_of(config: &Config, name: &str) -> Result<Remote, TaskError> {
    workers::remote(config, name).ok_or_else(|| {
        TaskError::Conflict(format!(
            "worker `{name}` is no longer among the workers of your delegation.yaml; put it \
                 back to reach the task's work there"
        ))
    })
}

/// Where a remote workspace's work lives on its worker, as `workers::repo` names it.
pub(in crate::tasks) fn placed(w: &WorkspaceRecord, bare: &str) -> repo::Placed {
    repo::Placed {
        bare: bare.to_string(),
        worktree: w.path.clone(),
        branch: w.branch.clone(),
        base: w.base.clone(),
    }
}

/// Brings task `task_id`'s work back from its worker unless what was fetched is already its
/// current turn's end; returns the task's workspace record as it is then. A task on this
/// machine is returned as it is. A fetch while the turn still runs brings back the state so
/// far, and the turn's end is fetched again.
///
/// The network steps (the commit there, the fetch into a ref of the task's own) run without the
/// gateway-wide git lock, one at a time per task; the lock is taken only to move the fetched
/// commit into the task's ref here. A worker that answers slowly holds up its own task's
/// fetches, not every other task's git work.
pub(in crate::tasks) async fn fetch_back(
    ctx: &TaskContext,
    task_id: &str,
) -> Result<Option<WorkspaceRecord>, TaskError> {
    let mine = {
        let mut fetching = ctx.fetching.lock().unwrap_or_else(|p| p.into_inner());
        fetching.entry(task_id.to_string()).or_default().clone()
    };
    let result = {
        let _one_per_task = mine.lock().await;
        fetch_back_now(ctx, task_id).await
    };
    let mut fetching = ctx.fetching.lock().unwrap_or_else(|p| p.into_inner());
    // The map's and this call's: nobody else waits on it.
    if Arc::strong_count(&mine) <= 2 {
        fetching.remove(task_id);
    }
    result
}

async fn fetch_back_now(
    ctx: &TaskContext,
    task_id: &str,
) -> Result<Option<WorkspaceRecord>, TaskError> {
    let entry = ctx
        .registry
        .get(task_id)
        .ok_or_else(|| TaskError::UnknownTasks(vec![task_id.to_string()]))?;
    let Some(w) = entry.rec.workspace.clone() else {
        return Ok(None);
    };
    let Some(r) = w.remote.as_ref() else {
        return Ok(Some(w));
    };
    let turn = entry.rec.turn;
    let settled = entry.is_settled();
    if w.discarded || (r.fetched.is_some() && r.fetched_turn == turn) {
        return Ok(Some(w));
    }
    let remote = remote_of(&ctx.config.get(), &r.worker)?;
    let origin = std::path::Path::new(&w.origin);
    let placed = placed(&w, &r.bare);
    let commit = repo::fetch_back(
        &r.worker,
        &remote,
        origin,
        &placed,
        &format!("opencode-mcp: the work of task {task_id} (turn {turn})"),
    )
    .await?;
    {
        let _one_at_a_time = ctx.git_lock.write().await;
        // Discarded meanwhile: its ref is gone and stays gone.
        let discarded = ctx
            .registry
            .get(task_id)
            .is_none_or(|e| e.rec.workspace.as_ref().is_none_or(|w| w.discarded));
        repo::keep_fetched(origin, &placed, (!discarded).then_some(commit.as_str())).await?;
        if discarded {
            return Ok(None);
        }
    }
    tracing::debug!(task_id, turn, commit, worker = %r.worker, "fetched the task's work back");
    let updated = ctx
        .registry
        .update(task_id, |e| {
            if let Some(r) = e.rec.workspace.as_mut().and_then(|w| w.remote.as_mut()) {
                r.fetched = Some(commit.clone());
                // Only a settled turn's end is final: a fetch while it runs is fetched again.
                if settled && e.rec.turn == turn {
                    r.fetched_turn = turn;
                }
            }
            e.rec.workspace.clone()
        })
        .flatten();
    Ok(updated.or(Some(w)))
}

/// [`fetch_back`] after a turn ended, in the background: a failure is logged (the next diff or
/// apply fetches again, and says why if it still cannot).
pub(in crate::tasks) async fn after_turn(ctx: &TaskContext, task_id: &str) {
    let remote = ctx
        .registry
        .get(task_id)
        .is_some_and(|e| e.rec.workspace.as_ref().is_some_and(|w| w.remote.is_some()));
    if !remote {
        return;
    }
    if let Err(e) = fetch_back(ctx, task_id).await {
        tracing::warn!(task_id, error = %e, "could not fetch the task's work back from its worker yet");
    }
}

//! Housekeeping of finished tasks, for the gateway as a whole rather than per server: they
//! leave memory once unused ([`evict`]), expired records and their worktrees go, and memory is
//! given back to the system once things are quiet.

use super::context::TaskContext;
use crate::tasks::tracking::tracker::RECONCILE_EVERY;

/// The gateway's housekeeping, whatever servers run: finished tasks leave memory, expired
/// records and their worktrees go, and memory is given back once things are quiet. It ran on
/// each server's reconcile tick before, so after `stop_server`, or in a restarted gateway that
/// only answers reads, nothing was ever evicted or swept.
pub async fn housekeep(ctx: TaskContext) {
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

/// Lets finished tasks go (see [`Registry::evict_finished`]) and, in the background, cleans the
/// worktrees of those whose records were deleted: nobody can reach them through the gateway any
/// more, so they would pile up in the state directory otherwise.
///
/// Returns whether freed memory was given back to the system (it is when tasks left memory).
pub fn evict(ctx: &TaskContext) -> bool {
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
        let (dir, lock, mut worktrees, config) = (
            ctx.worktrees.clone(),
            ctx.git_lock.clone(),
            evicted.worktrees,
            ctx.config.get(),
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
                crate::tasks::store::gc::clean_expired(&lock, &dir, worktrees, &config).await;
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
pub(super) fn give_back_when_quiet(ctx: &TaskContext, trimmed_at: &mut u64) {
    let changes = ctx.registry.version();
    if changes == *trimmed_at || ctx.registry.any(|e| !e.is_settled()) {
        return;
    }
    *trimmed_at = changes;
    crate::memory::give_back();
}

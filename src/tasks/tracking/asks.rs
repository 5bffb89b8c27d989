//! Permission asks, as OpenCode lists them: the reconcile's sweep gives each pending ask to
//! its task (a subagent's to its parent's task) and clears the asks answered while the stream
//! was down; after an abort every ask of the task still listed is rejected. Sessions that
//! belong to no task (someone else's work on a shared server) are remembered, within a bound,
//! so they are not looked up again on every tick.

use std::collections::HashSet;
use std::time::Instant;

use crate::tasks::context::TaskContext;
use crate::tasks::store::registry::SessionOwner;

use crate::opencode::{PermissionReply, Server};

/// Levels of subagents followed up from a session whose parent is unknown.
pub(in crate::tasks) const MAX_NESTING: usize = 4;

/// Reads the pending permissions of one directory and gives each to its task (a subagent's ask
/// to the task of its parent session); an ask a task still shows that is no longer pending (it
/// was answered while the stream was down) is cleared.
pub(in crate::tasks) async fn sweep_permissions(
    ctx: &TaskContext,
    server: &Server,
    directory: &str,
) {
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
    let stale = |e: &crate::tasks::lifecycle::entry::TaskEntry| -> Vec<String> {
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
pub(in crate::tasks) async fn reject_pending_asks(
    ctx: &TaskContext,
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
pub(in crate::tasks) async fn resolve_owner(
    ctx: &TaskContext,
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
pub(in crate::tasks) const MAX_FOREIGN: usize = 4096;

/// Notes sessions that belong to no task, within [`MAX_FOREIGN`].
pub(in crate::tasks) fn remember_foreign(set: &mut HashSet<String>, sessions: Vec<String>) {
    if set.len() + sessions.len() > MAX_FOREIGN {
        set.clear();
    }
    set.extend(sessions);
}

#[cfg(test)]
mod tests {
    use super::*;
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
}

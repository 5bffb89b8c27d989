//! Letting go of a directory's OpenCode instance once a task is done with it.
//!
//! OpenCode keeps one *instance* per directory it is asked about (its configuration, plugins,
//! tools, snapshot tracking and file watchers), booted by the first request that names the
//! directory and kept for the server's lifetime. A worktree task's directory is its own, so
//! every such task added one for good: a worker that had run thirty worktree tasks held an
//! OpenCode of 5.2 GB at over a core of CPU, and new worktrees' first requests (the instance's
//! boot) timed out behind it. Measured on the pinned OpenCode, thirty booted directories added
//! about 270 MB; booting and disposing them four times over kept it bounded, and booting one
//! again costs about 0.2 s.
//!
//! So once a worktree task's turn has been read, the gateway disposes that directory's instance
//! (`POST /instance/dispose?directory=`); a follow-up boots it again. Disposal ends what runs in
//! the instance, so it must never overtake a turn that a follow-up opened meanwhile: a prompt
//! and a disposal of one directory take the same per-directory lock ([`InstanceGates`]), and the
//! disposal checks under it that its task is still done. A turn is recorded before its prompt is
//! sent, so either the check sees the new turn (and the instance is kept), or the prompt waits
//! for the disposal and boots the instance again. Directories that tasks share (`isolation:
//! none`) are never disposed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

/// One async lock per directory: prompts take it shared (a fan-out's prompts in one directory go
/// out side by side), a disposal takes it alone.
/// Entries are weak: a directory no one holds is dropped when the map is next grown past
/// [`PRUNE_AT`], so a gateway that runs thousands of worktree tasks keeps only the live ones.
#[derive(Debug, Default)]
pub(crate) struct InstanceGates {
    by_directory: Mutex<HashMap<String, Weak<tokio::sync::RwLock<()>>>>,
}

/// Entries at which the dead ones are swept.
const PRUNE_AT: usize = 64;

impl InstanceGates {
    /// The lock of `directory`, shared with whoever holds it now.
    pub(crate) fn of(&self, directory: &str) -> Arc<tokio::sync::RwLock<()>> {
        let mut map = self
            .by_directory
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(live) = map.get(directory).and_then(Weak::upgrade) {
            return live;
        }
        if map.len() >= PRUNE_AT {
            map.retain(|_, w| w.strong_count() > 0);
        }
        let gate = Arc::new(tokio::sync::RwLock::new(()));
        map.insert(directory.to_string(), Arc::downgrade(&gate));
        gate
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_directory
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_directory_has_one_gate_while_held_and_dead_ones_are_swept() {
        let gates = InstanceGates::default();
        let a = gates.of("/w/a");
        let again = gates.of("/w/a");
        assert!(
            Arc::ptr_eq(&a, &again),
            "one lock per directory while it is held"
        );
        let prompt = a.read().await;
        assert!(
            gates.of("/w/a").try_read().is_ok(),
            "prompts go side by side"
        );
        assert!(
            gates.of("/w/a").try_write().is_err(),
            "a disposal waits for them"
        );
        drop(prompt);
        let disposal = a.write().await;
        assert!(
            gates.of("/w/a").try_read().is_err(),
            "a prompt waits for a disposal"
        );
        assert!(
            gates.of("/w/b").try_read().is_ok(),
            "another directory's is free"
        );
        drop(disposal);
        drop((a, again));
        for i in 0..PRUNE_AT + 1 {
            drop(gates.of(&format!("/w/{i}")));
        }
        assert!(
            gates.len() < 8,
            "directories no one holds are swept: {} left",
            gates.len()
        );
    }
}

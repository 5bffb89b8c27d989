//! What starts running side by side share: the base a fan-out's targets start from, and the
//! bases each worker holds already.
//!
//! A fan-out asks one question of several models, so its targets start from one snapshot of
//! the user's tree, made once: not once per target, each waiting for the git lock, on files
//! that may change between two of them. And a base a worker holds already is not sent again: a
//! worktree start there then costs one round trip (adding the worktree) instead of three (the
//! repository, the push, the worktree). Snapshot commits depend only on `HEAD` and the files
//! (`git::base_commit`), so a series of starts from an unchanged tree shares one base as well.
//!
//! Both are remembered for a bounded number of entries, the oldest forgotten first: forgetting
//! costs only the work done again.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::OnceCell;

use super::Placement;
use crate::git::{self, Base};
use crate::tasks::TaskError;
use crate::workers::repo::{self, Placed};
use crate::workers::Remote;

/// How many entries each memory keeps.
const REMEMBERED: usize = 256;

/// (group, directory, base kind) -> (the repository's top, the base commit).
type GroupBases = Bounded<(String, String, Base), (PathBuf, String)>;

/// (worker, bare repository there, commit) -> sent (or being sent: later starts wait for it).
type SentBases = Bounded<(String, String, String), Arc<OnceCell<()>>>;

/// The bases made for fan-outs, and those sent to workers.
#[derive(Default)]
pub(in crate::tasks) struct SharedBases {
    groups: Mutex<GroupBases>,
    sent: Mutex<SentBases>,
}

/// A map that forgets its oldest entry past [`REMEMBERED`].
struct Bounded<K, V> {
    map: HashMap<K, V>,
    order: VecDeque<K>,
}

impl<K, V> Default for Bounded<K, V> {
    fn default() -> Self {
        Self {
            map: HashMap::new(),
            order: VecDeque::new(),
        }
    }
}

impl<K: Hash + Eq + Clone, V: Clone> Bounded<K, V> {
    fn get(&self, key: &K) -> Option<V> {
        self.map.get(key).cloned()
    }

    fn insert(&mut self, key: K, value: V) {
        if self.map.insert(key.clone(), value).is_none() {
            self.order.push_back(key);
        }
        while self.order.len() > REMEMBERED {
            if let Some(old) = self.order.pop_front() {
                self.map.remove(&old);
            }
        }
    }

    fn remove(&mut self, key: &K) {
        if self.map.remove(key).is_some() {
            self.order.retain(|k| k != key);
        }
    }

    fn get_or_insert_with(&mut self, key: K, make: impl FnOnce() -> V) -> V {
        if let Some(v) = self.get(&key) {
            return v;
        }
        let v = make();
        self.insert(key, v.clone());
        v
    }
}

impl Placement {
    /// The repository around `directory` and the commit a task starts from: made now, or, for a
    /// fan-out's target, the one its group made first. The caller holds the git lock (making a
    /// snapshot writes objects), so two targets never make it at once.
    pub(in crate::tasks) async fn base_for(
        &self,
        directory: &str,
        scratch: &Path,
        base: Base,
        group: Option<&str>,
    ) -> Result<(PathBuf, String), TaskError> {
        let key = group.map(|g| (g.to_string(), directory.to_string(), base));
        if let Some(made) = key.as_ref().and_then(|k| self.bases.groups().get(k)) {
            return Ok(made);
        }
        let made = git::base_commit(Path::new(directory), scratch, base).await?;
        if let Some(key) = key {
            self.bases.groups().insert(key, made.clone());
        }
        Ok(made)
    }

    /// Sends `placed`'s base to worker `worker` unless it was sent there already, then adds the
    /// task's worktree. A base sent before but gone there since (the repository removed by
    /// hand) is sent again when adding the worktree fails.
    pub(in crate::tasks) async fn send_and_add(
        &self,
        worker: &str,
        remote: &Remote,
        origin: &Path,
        placed: &Placed,
    ) -> Result<(), TaskError> {
        let key = (worker.to_string(), placed.bare.clone(), placed.base.clone());
        let cell = self
            .bases
            .sent()
            .get_or_insert_with(key.clone(), Default::default);
        let mut sent_here = false;
        cell.get_or_try_init(|| {
            sent_here = true;
            repo::send_base(worker, remote, origin, placed)
        })
        .await?;
        match repo::add_worktree(worker, remote, placed).await {
            Ok(()) => Ok(()),
            Err(e) if sent_here => Err(e.into()),
            Err(e) => {
                tracing::debug!(worker, error = %e, "adding a worktree on a base sent before failed; sending the base again");
                self.bases.sent().remove(&key);
                repo::send_base(worker, remote, origin, placed).await?;
                repo::add_worktree(worker, remote, placed).await?;
                Ok(())
            }
        }
    }
}

impl SharedBases {
    fn groups(&self) -> std::sync::MutexGuard<'_, GroupBases> {
        self.groups.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn sent(&self) -> std::sync::MutexGuard<'_, SentBases> {
        self.sent.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_entry_is_forgotten_first() {
        let mut b = Bounded::default();
        for i in 0..REMEMBERED + 2 {
            b.insert(i, i * 10);
        }
        assert_eq!(b.get(&0), None);
        assert_eq!(b.get(&1), None);
        assert_eq!(b.get(&2), Some(20));
        assert_eq!(b.get(&(REMEMBERED + 1)), Some((REMEMBERED + 1) * 10));
        assert_eq!(b.order.len(), REMEMBERED);
        // Set again, a key keeps its place in line.
        b.insert(2, 21);
        assert_eq!(b.order.len(), REMEMBERED);
        b.remove(&2);
        assert_eq!((b.get(&2), b.order.len()), (None, REMEMBERED - 1));
        assert_eq!(b.get_or_insert_with(7, || 0), 70);
        assert_eq!(b.get_or_insert_with(9999, || 5), 5);
    }
}

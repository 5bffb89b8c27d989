//! Where a task runs, and getting it there.
//!
//! - `queue`: `limits.queue`: queued starts and the drainer.
//! - `remote`: tasks on workers (their OpenCode started, supervised, reached again; the
//!   worktree made there).
//! - `links`: the workers' OpenCode servers in use, and the workers found out of reach.
//! - `workspace`: a task's git worktree (create, diff, apply, discard).
//! - `bases`: what starts side by side share (a fan-out's base, the bases sent to workers).
//! - `servers`: the servers tasks run on (started, reached, let linger, stopped).
//! - `start`: a start, from its request to its first turn.
//!
//! All of it is one [`Placement`], which the service holds. Its methods reach only what it
//! holds: the shared [`TaskContext`] and the data rooms, never the service. So the service
//! calls placement, and placement never calls back.

mod bases;
pub(crate) mod links;
pub(crate) mod queue;
pub(crate) mod remote;
pub(crate) mod servers;
pub(crate) mod start;
mod supervise;
pub(crate) mod workspace;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::opencode::ServerPool;
use crate::tasks::context::TaskContext;
use crate::tasks::store::registry::Registry;

/// Where tasks run and getting them there: the servers, the workers' serves, the queue, the
/// idempotency keys and the worktrees.
pub(in crate::tasks) struct Placement {
    pub(in crate::tasks) tracker: TaskContext,
    pub(in crate::tasks) registry: Arc<Registry>,
    pub(in crate::tasks) pool: ServerPool,
    /// The remote workers' OpenCode servers, started on first use (`remote.rs`).
    pub(in crate::tasks) workers: links::WorkerServes,
    /// `idempotency_key` -> its slot; starts with one key run one at a time.
    pub(in crate::tasks) keys: Mutex<HashMap<String, start::KeySlot>>,
    /// Held while the queue's length is checked and a task added, so `limits.queue` holds.
    pub(in crate::tasks) enqueueing: Mutex<()>,
    /// The state directory (task worktrees live in its `worktrees/`), if there is one.
    pub(in crate::tasks) state_dir: Option<PathBuf>,
    /// Git operations that write (creating a worktree, apply, discard) run one at a time, so
    /// two applies never merge against the same snapshot of the user's tree.
    pub(in crate::tasks) git_lock: Arc<tokio::sync::RwLock<()>>,
    /// The bases made for fan-outs and sent to workers, shared by the starts that follow.
    pub(in crate::tasks) bases: bases::SharedBases,
    /// Server id -> the line its starts wait in (`start::STARTS_AT_ONCE` at a time).
    pub(in crate::tasks) start_gates: Mutex<HashMap<String, Arc<tokio::sync::Semaphore>>>,
}

impl Placement {
    pub(in crate::tasks) fn new(
        tracker: TaskContext,
        pool: ServerPool,
        state_dir: Option<PathBuf>,
    ) -> Self {
        let workers = links::WorkerServes::default();
        if let Some(dir) = &state_dir {
            workers.down.note_under(dir.clone());
        }
        Self {
            registry: tracker.registry.clone(),
            git_lock: tracker.git_lock.clone(),
            tracker,
            pool,
            workers,
            keys: Default::default(),
            enqueueing: Default::default(),
            state_dir,
            bases: Default::default(),
            start_gates: Default::default(),
        }
    }
}

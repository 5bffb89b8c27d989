//! Where a task runs, and getting it there.
//!
//! - `queue`: `limits.queue`: queued starts and the drainer.
//! - `remote`: tasks on workers (their OpenCode started, supervised, reached again; the
//!   worktree made there).
//! - `links`: the workers' OpenCode servers in use, and the workers found out of reach.
//! - `workspace`: a task's git worktree (create, diff, apply, discard).

pub(crate) mod links;
pub(crate) mod queue;
pub(crate) mod remote;
pub(crate) mod servers;
pub(crate) mod start;
mod supervise;
pub(crate) mod workspace;

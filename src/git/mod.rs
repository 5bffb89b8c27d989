//! Git, run as the `git` program, for task workspaces: a git worktree per task, its diff against
//! the base it started from, and bringing that change back (apply) or dropping it (discard).
//!
//! # Why plain `git` and not OpenCode's `POST /experimental/worktree`
//!
//! OpenCode 1.18.33 can create worktrees itself, but that endpoint does not fit a task:
//! - it returns before the worktree exists (it is created asynchronously), so a session started
//!   right after it would race the checkout;
//! - it puts the worktree under OpenCode's own data directory on a branch `opencode/<name>`, which
//!   the gateway can neither name after its task nor keep with its task records;
//! - it branches from `HEAD` only, so the orchestrator's uncommitted changes (what it sees and
//!   means when it delegates) would be missing in the task's tree;
//! - it is experimental, and an attached server of another version may lack it.
//!
//! With `git` the worktree exists when the call returns, its base is exactly what the
//! orchestrator sees, and the same code works for managed and attached servers.
//!
//! # The user's tree is never touched, except by apply
//!
//! Snapshots of a tree with its uncommitted changes go through a temporary index
//! (`GIT_INDEX_FILE`, seeded from a copy of the real one so unchanged files are not hashed again)
//! and `git write-tree`/`git commit-tree`: they add objects to the repository and nothing else.
//! Reads run with `GIT_OPTIONAL_LOCKS=0`, so not even an index refresh is written. Apply computes
//! the merged tree first (`git merge-tree`) and changes the working tree only when the merge is
//! clean, with one `git apply` that checks every hunk before it writes any.
//!
//! - `run`: spawning `git` with a clean environment, and its errors.
//! - `worktree`: snapshots, creating and removing a task's worktree.
//! - `diff`: the summary (`--raw --numstat`) and the unified diff of a change.
//! - `apply`: the three-way merge of a task's change into its origin.

mod apply;
mod diff;
mod run;
mod worktree;

pub use apply::{apply, Applied};
pub use diff::{parse_raw_numstat, summary, unified, DiffFile, DiffStatus};
pub use run::GitError;
pub use worktree::{
    commit_state, create, locate, pending, remove, snapshot_tree, Base, Created, Located, Pending,
};

/// The prefix of every task branch: `opencode-mcp/<task_id>`.
pub const BRANCH_PREFIX: &str = "opencode-mcp/";

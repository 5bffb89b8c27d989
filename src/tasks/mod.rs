//! Tasks: what a delegated task is and how its state is decided, kept, read and waited on.
//!
//! - `turn`: pure: a task's turn (everything after our own user message) and the one rule for
//!   "it is over, and this is its answer".
//! - `record` (the durable record), `registry` (live tasks: record + progress under one lock),
//!   `store` (the records on disk).
//! - `tracker`: feeds OpenCode's events and HTTP reads into `turn` and the registry; `stream`
//!   assembles a turn's messages from the events, so a turn ended by its idle frame has its
//!   answer without a read.
//! - `service`: the actions the gateway calls (start, continue, status, permissions, servers),
//!   with one job a file beside it: `restore`, `resolve`, `abort`, `result`, `wait`, and
//!   `workspace` (a task's git worktree: create, diff, apply, discard).
//! - `gc`: worktrees that outlive their tasks' records (kept when never applied; `opencode-mcp gc`).
//! - `usage`: pure: the usage report and the task list over stored records (`opencode-mcp usage`,
//!   `opencode-mcp tasks` and their tools).
//! - `structured`: tasks started with an `output_schema`: the instruction, extracting and
//!   validating the JSON their answer ends with, and the bounded automatic corrections.
//! - `spend`: spend guards: a task's caps, what its turn spent so far, the day's total.
//! - `capacity`: room for unfinished tasks (`limits.max_tasks`), taken at the check.
//! - `model`: the shapes status, wait and result report (also the tools' output schemas).

mod abort;
mod capacity;
mod error;
pub mod gc;
mod ledger;
mod model;
mod owner;
mod record;
mod registry;
mod resolve;
mod restore;
mod result;
pub use result::Files;
mod service;
mod spend;
mod store;
pub mod stream;
pub mod structured;
mod tracker;
pub mod turn;
pub mod usage;
mod wait;
mod workspace;

pub use capacity::Slots;
pub use error::TaskError;
pub use model::*;
pub use owner::alive as gateway_alive;
pub use record::{epoch_ms, GroupMember, TaskRecord};
pub use resolve::{check_variant, resolve_tier, AgentCatalog, TierResolution};
pub use service::*;
pub use store::{default_state_dir, read_stored, read_summaries, Stored};
pub use workspace::{ApplyOutcome, DiscardOutcome};

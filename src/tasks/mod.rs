//! Tasks: what a delegated task is and how its state is decided, kept, read and waited on.
//!
//! The data, each room depending only on the ones above it:
//! - `model` (the shapes status, wait and result report; also the tools' output schemas),
//!   `turn` (pure: a task's turn and the one rule for "it is over, and this is its answer"),
//!   `stream` (a turn's messages assembled from the events).
//! - `record` (the durable record, with a structured task's state), `entry` (a task's record and
//!   live state, moved only by named phase transitions, with the turn's spend so far).
//! - `store` (the records on disk, one writer), `owner` (which gateway is alive), `ledger` (the
//!   day's spend, shared by every gateway on the state directory), `registry` (the tasks in
//!   memory under one lock, the change signal, eviction and expiry), `capacity`
//!   (`limits.max_tasks`, taken at the check), `spend` (a task's caps and the day's cap).
//!
//! The behaviour:
//! - `tracker`: one per OpenCode server, it feeds the server's events into the entries; beside
//!   it, `completion` (is the turn over: checks over HTTP), `outcome` (reading a finished turn and
//!   its changed files), `asks` (permission asks as OpenCode lists them), `budget` (a running
//!   turn's caps enforced), and `housekeeping` (eviction and expiry, for the gateway as a whole).
//! - `service`: the actions the gateway calls (start, continue, status, permissions, servers),
//!   with one job a file beside it: `restore` (and adopting another gateway's tasks), `resolve`,
//!   `abort`, `result`, `wait`, and `workspace` (a task's git worktree: create, diff, apply,
//!   discard).
//! - `structured`: tasks started with an `output_schema`: the instruction, extracting and
//!   validating the JSON their answer ends with, and the bounded automatic corrections.
//! - `gc`: worktrees that outlive their tasks' records (kept when never applied; `opencode-mcp gc`).
//! - `usage`: pure: the usage report and the task list over stored records (`opencode-mcp usage`,
//!   `opencode-mcp tasks` and their tools).

mod abort;
mod asks;
mod budget;
mod capacity;
mod completion;
mod entry;
mod error;
pub mod gc;
mod housekeeping;
mod ledger;
mod model;
mod outcome;
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

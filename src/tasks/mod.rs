//! Tasks: what a delegated task is and how its state is decided, kept, read and waited on.
//!
//! The data, each room depending only on the ones above it:
//! - `model` (the shapes status, wait and result report; also the tools' output schemas),
//!   `turn` (pure: a task's turn and the one rule for "it is over, and this is its answer"),
//!   `stream` (a turn's messages assembled from the events).
//! - `lifecycle/`: the one state word and what it moves. `phase` (where a task stands: queued,
//!   starting, open, held for its schema, checks or an outage, aborting, finished; the status
//!   hosts read is derived from it), `record` (the durable record, the phase saved in it, with a
//!   structured task's and a checked task's state, and the spend per tier it moved from),
//!   `entry` (a task's record and live state, moved only by named transitions, each naming the
//!   phases it moves from and the statuses it may end in). No other room can write a status.
//! - `store` (the records on disk, one writer), `owner` (which gateway is alive), `ledger` (the
//!   day's spend, shared by every gateway on the state directory), `registry` (the tasks in
//!   memory under one lock, the change signal, eviction and expiry), `capacity`
//!   (slots per worker, taken at the check), `spend` (a
//!   task's caps and the day's cap), `links` (the workers' OpenCode servers in use, and the
//!   workers found out of reach).
//!
//! The behaviour, each room importing only the data rooms and the rooms listed before it (no
//! import circle):
//! - `context`: what every behaviour room shares (the registry, the configuration in force, the
//!   limits, and the turn deadline's timer, whose action is handed in so no room imports the one
//!   above it).
//! - `fetch` (a remote task's work brought back from its worker), `asks` (permission asks as
//!   OpenCode lists them), `outcome` (reading a finished turn and its changed files, then
//!   fetching a remote one's work), `follow` (opening a task's next turn: a host's continue and the gateway's
//!   corrections), `structured` (tasks started with an `output_schema`: the instruction,
//!   extracting and validating the JSON their answer ends with, the bounded corrections),
//!   `escalation` (moving a task to another model in its session: a tier's fallback models and
//!   `escalate_to` after a provider outage), `checks` (commands that must pass after each turn:
//!   run where the task works, fix rounds, escalation when they still fail), `hold` (a turn held
//!   for the gateway's own verdict before any waiter sees it: a structured answer, then checks;
//!   or a provider failure on its way to another model),
//!   `completion` (is the turn over: checks over HTTP), `abort` (ending a turn early: cancel,
//!   deadline, budget, `stop_server`), `budget` (a running turn's caps enforced).
//! - `tracker`: one per OpenCode server, it feeds the server's events into the entries and
//!   hands each verdict to the room above; `housekeeping` (eviction and expiry, for the gateway
//!   as a whole).
//! - `service`: the actions the gateway calls (start, continue, cancel, status, permissions,
//!   servers), with one job a file beside it: `restore` (and adopting another gateway's tasks),
//!   `resolve` (agents, models and tiers against the live server), `result`, `wait`,
//!   `workspace` (a task's git worktree: create, diff, apply, discard), `placement` (tasks on
//!   remote workers: their OpenCode started, supervised and reached again, the worktree made
//!   there) and `queue` (`limits.queue`: queued starts and the drainer).
//! - `gc`: worktrees that outlive their tasks' records (kept when never applied; `opencode-mcp gc`).
//! - `usage`: pure: the usage report and the task list over stored records (`opencode-mcp usage`,
//!   `opencode-mcp tasks` and their tools).

pub mod checks;
mod context;
mod error;
mod housekeeping;
pub mod lifecycle;
mod model;
mod placement;
mod resolve;
mod restore;
mod result;
mod service;
pub mod spend;
pub mod store;
mod tracking;
mod turn;
mod wait;

pub use error::TaskError;
pub use lifecycle::record::{epoch_ms, GroupMember, TaskRecord};
pub use model::*;
pub use placement::start::{default_title, StartTask};
pub use placement::workspace::{ApplyOutcome, DiscardOutcome};
pub use resolve::{check_variant, resolve_tier, AgentCatalog, TierResolution};
pub use result::Files;
pub use service::*;
pub use store::capacity::Slots;
pub use store::disk::{default_state_dir, read_stored, read_summaries, Stored};
pub use store::owner::alive as gateway_alive;

//! Tasks: what a delegated task is and how its state is decided, kept, read and waited on.
//!
//! The rooms, each importing only the rooms listed before it, with one exception: the jobs of
//! the facade (`impl TaskService` in `placement/`, `restore.rs`, `result.rs`, `wait.rs`) import
//! `service.rs`, listed last, for the struct they add methods to.
//!
//! | room | what it holds |
//! |---|---|
//! | `model/` | the shapes status, wait and result report (also the tools' output schemas) |
//! | `error.rs`, `resolve.rs` | the task actions' error vocabulary; agents, models and tiers resolved against the live server |
//! | `lifecycle/` | the one state word (`phase`), a turn's state machine (`turn`, pure) and its stream (`stream`), the durable record (`record`, with `held` and `live` beside it), and `entry`: the record moved only by named transitions. No other room can write a status |
//! | `spend/` | money: a task's caps and the day's cap (`caps`), the day's spend on disk (`ledger`), the usage report and task list (`usage`, pure) |
//! | `store/` | what is kept: the tasks in memory under one lock (`registry`), their expiry (`expiry`), the records on disk (`disk`, `read`, `writer`), the state directory's owner (`owner`), slots per worker (`capacity`), worktrees that outlive their records (`gc`) |
//! | `context.rs` | what every behaviour room shares: the registry, the configuration in force, the limits, the deadline's timer |
//! | `turn/` | a turn's end read (`outcome`: the one sequence after every end), a remote task's work fetched back (`fetch`), a turn's confinement (`confine`), the next turn opened (`follow`) |
//! | `checks/` | the gateway's own verdicts before a waiter sees a turn: `hold` (the one place a held turn settles), `structured`, `commands` (and `run`), `escalation` |
//! | `tracking/` | a running turn followed: `tracker` (events in), `completion`, `budget`, `asks`, `abort` |
//! | `placement/` | where a task runs and getting it there: `start`, `queue`, `servers`, `remote` (and `supervise`, `links`), `workspace` |
//! | `housekeeping.rs`, `restore.rs` | eviction and expiry for the gateway as a whole; tasks a previous gateway left, adopted |
//! | `service.rs` | the facade the gateway's tool handlers call; `result.rs` and `wait.rs` read through it |

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

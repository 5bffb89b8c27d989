//! What is kept of the tasks: in memory under one lock, on disk by one writer.
//!
//! - `registry`: the tasks in memory, the change signal, eviction and expiry.
//! - `disk`: the records on disk (one ordered writer; reading them back).
//! - `owner`: which gateway owns the state directory, and whether another is alive.
//! - `capacity`: slots per worker, taken at the check.
//! - `gc`: worktrees that outlive their tasks' records (`opencode-mcp gc`).
//! - `usage`: pure: the usage report and the task list over stored records.
//! - `rollup`: what expired records spent, kept by day for the dashboard's savings over days.

pub(crate) mod capacity;
pub(crate) mod disk;
pub(crate) mod expiry;
pub mod gc;
pub(crate) mod owner;
pub(crate) mod read;
pub(crate) mod registry;
pub mod rollup;
pub mod usage;
mod writer;

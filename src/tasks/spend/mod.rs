//! Money: what a task may spend and what it spent.
//!
//! - `caps`: a task's caps (the lowest of `limits`, its tier's and its call's) and the day's cap.
//! - `ledger`: the day's spend on disk, shared by every gateway on the state directory.
//! - `usage`: pure: the usage report and the task list over stored records.

pub(crate) mod caps;
pub(crate) mod ledger;
pub mod usage;

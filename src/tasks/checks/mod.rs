//! The gateway's own verdicts on a turn before any waiter sees it.
//!
//! - `hold`: a finished turn held for a verdict, and the one place that settles it.
//! - `structured`: tasks started with an `output_schema` (the instruction, the JSON their
//!   answer ends with, validated, and the bounded corrections).
//! - `commands`: commands that must pass after each turn (run where the task works, fix
//!   rounds, escalation when they still fail); `run` runs one, here or on a worker, confined.
//! - `escalation`: moving a task to another model in its session (a tier's fallback models,
//!   `escalate_to` after a provider outage).

pub(crate) mod commands;
pub(crate) mod escalation;
pub(crate) mod hold;
pub(crate) mod run;
pub mod structured;

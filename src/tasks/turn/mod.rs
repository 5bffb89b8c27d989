//! A turn's end read, and the next turn opened.
//!
//! - `outcome`: the one sequence after every end of a turn: its answer, its changed files, a
//!   remote task's work fetched back.
//! - `fetch`: a remote task's work brought back from its worker.
//! - `follow`: opening a task's next turn (a host's continue, the gateway's corrections).

pub(crate) mod confine;
pub(crate) mod fetch;
pub(crate) mod follow;
pub(crate) mod outcome;

//! A running turn followed: events in, verdicts out.
//!
//! - `tracker`: one per OpenCode server; feeds its events into the entries.
//! - `completion`: is the turn over (checked over HTTP when the stream is unsure).
//! - `budget`: a running turn's caps enforced.
//! - `asks`: permission asks as OpenCode lists them.
//! - `abort`: ending a turn early (cancel, deadline, budget, a stopped server).

pub(crate) mod abort;
pub(crate) mod asks;
pub(crate) mod budget;
pub(crate) mod completion;
pub(crate) mod tracker;

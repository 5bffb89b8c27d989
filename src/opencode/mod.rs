//! Everything that speaks to OpenCode.

pub mod client;

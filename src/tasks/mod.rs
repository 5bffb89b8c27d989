//! Tasks: the model and its one status vocabulary, the registry every tool reads, the tracker
//! that turns OpenCode events into task state, and the actions (start, continue, cancel, status,
//! result, wait) the gateway calls.

mod error;
mod model;
mod registry;
mod service;
mod store;
mod tracker;

pub use error::TaskError;
pub use model::*;
pub use service::*;

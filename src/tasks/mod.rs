//! Tasks: the model and its one status vocabulary, the registry every tool reads, and waiting.

mod error;
mod model;
mod service;

pub use error::TaskError;
pub use model::*;
pub use service::*;

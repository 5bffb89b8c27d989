//! Everything that speaks to OpenCode: the generated client (behind [`Api`]), server
//! supervision ([`ServerPool`]) and the event stream.

mod api;
pub mod client;
mod error;
mod pool;

pub use api::{
    error_info_from_json, is_terminal_finish, split_model, AgentInfo, Api, ErrorInfo, FileChange,
    ModelCatalog, PermissionAsk, PermissionReply, SessionActivity, Tokens, ToolCall, TurnState,
};
pub use error::OpencodeError;
pub use pool::{ServerInfo, ServerPool, StopInfo};

//! Everything that speaks to OpenCode: the generated client (behind [`Api`]), supervision of
//! managed `opencode serve` processes, the server pool, and the SSE event pump.

mod api;
pub mod client;
mod error;
pub mod events;
mod pool;
mod process;
pub mod supervisor;

pub use api::{
    error_info_from_json, is_terminal_finish, session_activity_from_json, split_model,
    turn_from_messages_json, AgentInfo, Api, ErrorInfo, FileChange, ModelCatalog, PermissionAsk,
    PermissionReply, SessionActivity, Tokens, ToolCall, TurnState,
};
pub use error::OpencodeError;
pub use pool::{resolve_directory, Server, ServerInfo, ServerPool, Started, StopInfo};
pub use process::kill_group;

//! Everything that speaks to OpenCode: the generated client (behind [`Api`]), supervision of
//! managed `opencode serve` processes, the server pool, and the SSE event pump.
//!
//! - `api`: the typed facade over the generated client (one method per call we make).
//! - `process` and `supervisor`: a managed `opencode serve` and the small process that makes
//!   everything it starts go with the gateway; `linger`: the file and socket through which the
//!   next gateway takes over one that outlived a clean exit while its tasks ran.
//! - `instances`: letting go of a worktree's OpenCode instance once its task is done with it.
//! - `listings`: the server's agents and models, remembered for a minute for `start_task`.
//! - `types`: the value types the facade returns; `messages`: session messages normalised into
//!   [`MessageView`], the one view the turn logic judges.

mod api;
pub mod client;
pub mod credentials;
mod error;
pub mod events;
mod instances;
mod lenient;
pub mod linger;
mod listings;
mod messages;
mod pool;
mod process;
pub mod supervisor;
mod types;

pub(crate) use api::basic_auth_header;
pub use api::{Api, ForcedRule, RunOn, AUTH_USER};
pub use error::OpencodeError;
pub use listings::{Listing, FRESH_FOR};
pub use messages::messages_from_json;
pub use pool::{
    is_loopback_url, resolve_directory, Server, ServerInfo, ServerPool, Started, StopInfo,
};
#[cfg(target_os = "linux")]
pub(crate) use process::die_with_gateway;
pub(crate) use process::{find_program, spawn_child};
pub use process::{free_port, kill_group, parse_listening_line, OpenTurn};
pub use types::{
    error_info_from_json, is_terminal_finish, session_activity_from_json, split_model, AgentInfo,
    ErrorInfo, FileChange, MessageView, ModelCatalog, PermissionAsk, PermissionReply, Price, Role,
    SessionActivity, Tokens, ToolCall,
};

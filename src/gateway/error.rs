//! How a failed tool call reads to the host.
//!
//! MCP has two ways to fail a `tools/call`: a JSON-RPC error, which hosts tend to show as an opaque
//! "tool failed", and a normal result with `isError: true`, which the host model reads and can act
//! on. Everything the caller can fix or should know about (a bad argument, an unknown task, OpenCode
//! being down) is the latter, as a [`ToolError`]: one [`ErrorCode`] from the crate-wide vocabulary
//! plus a message, sent as the text `{"error": {"code", "message"}}` (JSON, so a program can
//! read it as well as a model). JSON-RPC errors are kept for requests that cannot be routed at all
//! (an unknown or disabled tool name), see `handler.rs`.
//!
//! Error results carry no `structuredContent`. Output schemas describe only the success shape,
//! and the TypeScript SDK 1.x client (the Inspector's, and many hosts') validates any
//! `structuredContent` against the tool's `outputSchema` even when `isError` is true, rejecting
//! the whole result with -32602; without it, the SDK accepts an error result as it is.

use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::json;

use crate::error::{Coded, ErrorCode};
use crate::tasks::TaskError;

/// A tool call that failed in a way the caller should read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolError {
    pub code: ErrorCode,
    pub message: String,
}

impl ToolError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// An argument failed validation; the message must name the argument.
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidArgument, message)
    }

    /// A condition that is a bug in the gateway rather than the caller's doing.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Internal, message)
    }

    /// The `isError: true` result the host receives: text only (see the module doc).
    pub fn into_result(self) -> CallToolResult {
        let body = json!({
            "error": { "code": self.code.as_str(), "message": self.message }
        });
        CallToolResult::error(vec![ContentBlock::text(body.to_string())])
    }

    fn from_coded<E: Coded>(e: &E) -> Self {
        Self::new(e.code(), e.to_string())
    }
}

impl std::fmt::Display for ToolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.message)
    }
}

impl std::error::Error for ToolError {}

impl From<TaskError> for ToolError {
    fn from(e: TaskError) -> Self {
        Self::from_coded(&e)
    }
}

impl From<crate::opencode::OpencodeError> for ToolError {
    fn from(e: crate::opencode::OpencodeError) -> Self {
        Self::from_coded(&e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_as_json_text_without_structured_content() {
        let r = ToolError::new(ErrorCode::NotFound, "unknown task id(s): tsk_x").into_result();
        assert_eq!(r.is_error, Some(true));
        let expected =
            json!({"error": {"code": "not_found", "message": "unknown task id(s): tsk_x"}});
        assert_eq!(
            r.structured_content, None,
            "a client that validates structuredContent against the outputSchema would reject it"
        );
        let text = r
            .content
            .first()
            .and_then(|c| c.as_text())
            .map(|t| t.text.clone());
        assert_eq!(text, Some(expected.to_string()));
    }

    #[test]
    fn task_errors_keep_their_code() {
        let e: ToolError = TaskError::UnknownTasks(vec!["tsk_a".into()]).into();
        assert_eq!(e.code, ErrorCode::NotFound);
        assert!(e.message.contains("tsk_a"));
    }
}

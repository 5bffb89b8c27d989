//! The error vocabulary every tool shares.
//!
//! Each concern has its own `thiserror` enum ([`crate::opencode::OpencodeError`],
//! [`crate::tasks::TaskError`], ...); each maps onto one [`ErrorCode`] here, so a host sees one
//! small, stable set of codes (the original mixed `not_found`, `task_not_found` and
//! `server_not_found`) with a human-readable message beside it.

use schemars::JsonSchema;
use serde::Serialize;

/// The machine-readable kind of a tool error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// An id (task, server) that the gateway does not know.
    NotFound,
    /// An argument failed validation (empty prompt, unknown agent/model/tier, bad timeout, ...).
    InvalidArgument,
    /// The request conflicts with the current state (e.g. continuing a task that is still running).
    Conflict,
    /// A configured cap was hit (tracked tasks, prompt size).
    LimitExceeded,
    /// A spending cap was reached (`limits.max_cost_usd_per_day`).
    BudgetExceeded,
    /// OpenCode could not be reached or started.
    OpencodeUnavailable,
    /// OpenCode answered with an error.
    OpencodeError,
    /// A bug or an unexpected condition inside the gateway.
    Internal,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::NotFound => "not_found",
            ErrorCode::InvalidArgument => "invalid_argument",
            ErrorCode::Conflict => "conflict",
            ErrorCode::LimitExceeded => "limit_exceeded",
            ErrorCode::BudgetExceeded => "budget_exceeded",
            ErrorCode::OpencodeUnavailable => "opencode_unavailable",
            ErrorCode::OpencodeError => "opencode_error",
            ErrorCode::Internal => "internal",
        }
    }
}

/// Implemented by every concern's error enum.
pub trait Coded: std::error::Error {
    fn code(&self) -> ErrorCode;
}

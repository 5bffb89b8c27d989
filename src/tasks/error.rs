//! Errors of the task actions.

use crate::error::{Coded, ErrorCode};
use crate::git::GitError;
use crate::opencode::OpencodeError;
use crate::workers::repo::RepoError;
use crate::workers::sandbox::SandboxError;
use crate::workers::serve::ServeError;
use crate::workers::ssh::SshError;

#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error("unknown task id(s): {}", .0.join(", "))]
    UnknownTasks(Vec<String>),
    #[error("unknown server id `{0}`: call opencode_start_server first, or use the server_id it returned")]
    UnknownServer(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    LimitExceeded(String),
    /// The day's spending cap is reached.
    #[error("{0}")]
    BudgetExceeded(String),
    #[error(transparent)]
    Opencode(#[from] OpencodeError),
    #[error(transparent)]
    Git(#[from] GitError),
    /// Moving a remote task's repository to or from its worker failed.
    #[error(transparent)]
    Worker(#[from] RepoError),
    /// A worker's OpenCode could not be started or reached.
    #[error(transparent)]
    WorkerServe(#[from] ServeError),
}

impl TaskError {
    /// A worker that ssh could not reach (refused, failed to connect, or silent past its
    /// bound): a drop that may well pass, unlike a refusal of what was asked.
    pub fn worker_unreachable(&self) -> bool {
        match self {
            TaskError::Worker(RepoError::Ssh(e))
            | TaskError::WorkerServe(ServeError::Ssh(e))
            | TaskError::WorkerServe(ServeError::Sandbox(SandboxError::Ssh {
                source: e, ..
            })) => matches!(e, SshError::Unreachable { .. } | SshError::TimedOut { .. }),
            _ => false,
        }
    }
}

impl Coded for TaskError {
    fn code(&self) -> ErrorCode {
        let git = |e: &GitError| match e {
            GitError::Missing { .. }
            | GitError::NotARepository { .. }
            | GitError::NoCommits { .. }
            | GitError::Snapshot { .. } => ErrorCode::InvalidArgument,
            GitError::Conflict { .. }
            | GitError::Unregistered { .. }
            | GitError::Tampered { .. } => ErrorCode::Conflict,
            GitError::Failed { .. } | GitError::Io { .. } => ErrorCode::Internal,
        };
        // A worker ssh cannot reach is as unavailable as an OpenCode that cannot be reached.
        let ssh = |e: &SshError| match e {
            SshError::NoClient(_) => ErrorCode::Internal,
            SshError::Unreachable { .. } | SshError::TimedOut { .. } | SshError::TooMuch { .. } => {
                ErrorCode::OpencodeUnavailable
            }
        };
        match self {
            TaskError::UnknownTasks(_) | TaskError::UnknownServer(_) => ErrorCode::NotFound,
            TaskError::InvalidArgument(_) => ErrorCode::InvalidArgument,
            TaskError::Conflict(_) => ErrorCode::Conflict,
            TaskError::LimitExceeded(_) => ErrorCode::LimitExceeded,
            TaskError::BudgetExceeded(_) => ErrorCode::BudgetExceeded,
            TaskError::Opencode(e) => e.code(),
            TaskError::Git(e) => git(e),
            TaskError::Worker(RepoError::Git(e)) => git(e),
            TaskError::Worker(RepoError::Ssh(e))
            | TaskError::WorkerServe(ServeError::Ssh(e))
            | TaskError::WorkerServe(ServeError::Sandbox(SandboxError::Ssh {
                source: e, ..
            })) => ssh(e),
            TaskError::Worker(RepoError::OnWorker { .. }) => ErrorCode::Internal,
            TaskError::WorkerServe(_) => ErrorCode::OpencodeUnavailable,
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use std::time::Duration;

    fn unreachable() -> SshError {
        SshError::Unreachable {
            destination: "w1".into(),
            detail: "connection refused".into(),
        }
    }

    fn timed_out() -> SshError {
        SshError::TimedOut {
            destination: "w1".into(),
            command: "git".into(),
            after: Duration::from_secs(1),
            stderr: String::new(),
        }
    }

    fn too_much() -> SshError {
        SshError::TooMuch {
            destination: "w1".into(),
            command: "cat".into(),
            limit: 1,
        }
    }

    /// A worker that could not be reached, by whichever step, is a drop that may pass (the
    /// queue waits it out); anything the worker answered is not.
    #[test]
    fn only_a_worker_out_of_reach_counts_as_unreachable() {
        let by_sandbox = |e| {
            TaskError::WorkerServe(ServeError::Sandbox(SandboxError::Ssh {
                worker: "w1".into(),
                source: e,
            }))
        };
        for e in [
            TaskError::Worker(RepoError::Ssh(unreachable())),
            TaskError::WorkerServe(ServeError::Ssh(timed_out())),
            by_sandbox(unreachable()),
        ] {
            assert!(e.worker_unreachable(), "{e}");
            assert_eq!(e.code(), ErrorCode::OpencodeUnavailable, "{e}");
        }
        for e in [
            TaskError::Worker(RepoError::Ssh(too_much())),
            TaskError::Worker(RepoError::OnWorker {
                worker: "w1".into(),
                step: "push",
                detail: "refused".into(),
            }),
            TaskError::WorkerServe(ServeError::Gone {
                worker: "w1".into(),
                pid: 42,
            }),
            TaskError::Conflict("busy".into()),
        ] {
            assert!(!e.worker_unreachable(), "{e}");
        }
    }

    /// Each error says to the host what kind of trouble it is: the host's to fix, a conflict
    /// to retry, or the gateway's own.
    #[test]
    fn every_error_has_the_code_of_its_kind() {
        let dir = PathBuf::from("/nowhere");
        let cases = [
            (
                TaskError::Git(GitError::Tampered {
                    path: dir.clone(),
                    why: "a .git file elsewhere".into(),
                }),
                ErrorCode::Conflict,
            ),
            (
                TaskError::Worker(RepoError::Git(GitError::Unregistered {
                    path: dir.clone(),
                    origin: dir.clone(),
                })),
                ErrorCode::Conflict,
            ),
            (
                TaskError::Git(GitError::Io {
                    dir: dir.clone(),
                    context: "reading",
                    error: std::io::Error::other("disk"),
                }),
                ErrorCode::Internal,
            ),
            (
                TaskError::Worker(RepoError::Ssh(SshError::NoClient(std::io::Error::other(
                    "no ssh",
                )))),
                ErrorCode::Internal,
            ),
            (
                TaskError::Worker(RepoError::OnWorker {
                    worker: "w1".into(),
                    step: "push",
                    detail: "refused".into(),
                }),
                ErrorCode::Internal,
            ),
            (
                TaskError::WorkerServe(ServeError::NoSecret("w1".into())),
                ErrorCode::OpencodeUnavailable,
            ),
            (
                TaskError::Worker(RepoError::Ssh(too_much())),
                ErrorCode::OpencodeUnavailable,
            ),
            (
                TaskError::UnknownTasks(vec!["tsk_x".into()]),
                ErrorCode::NotFound,
            ),
            (
                TaskError::BudgetExceeded("over".into()),
                ErrorCode::BudgetExceeded,
            ),
        ];
        for (error, code) in cases {
            assert_eq!(error.code(), code, "{error}");
        }
    }
}

//! Errors of talking to, starting or stopping OpenCode.

use crate::error::{Coded, ErrorCode};

/// Everything that can go wrong between the gateway and an OpenCode server. Messages name the
/// cause and, where there is one, the fix; they never contain the server password.
#[derive(Debug, thiserror::Error)]
pub enum OpencodeError {
    /// The request could not be sent or got no answer (refused, reset, timed out).
    #[error("OpenCode at {url} is unreachable during {operation}: {reason}")]
    Unreachable {
        url: String,
        operation: String,
        reason: String,
    },
    /// OpenCode answered with an error status.
    #[error("OpenCode rejected {operation} with HTTP {status}: {name}: {message}")]
    Http {
        operation: String,
        status: u16,
        name: String,
        message: String,
    },
    /// The answer did not decode as the pinned API says it should.
    #[error("OpenCode's answer to {operation} did not decode: {detail}")]
    Decode { operation: String, detail: String },
    /// A 200 with HTML: an unknown route answers with the web UI, so this is not the API we know
    /// (wrong URL, or an OpenCode version without this route).
    #[error("OpenCode answered {operation} with a web page instead of JSON: the URL is not an OpenCode API of the pinned version (check opencode.url and the OpenCode version)")]
    NotTheApi { operation: String },
    /// 401: the password is wrong or missing.
    #[error("OpenCode refused the credentials for {operation} (HTTP 401): set the server's password in the environment variable named by opencode.password_env")]
    Unauthorized { operation: String },
    /// A managed server could not be started.
    #[error("cannot start OpenCode: {0}")]
    Start(String),
    /// The configured server (`opencode.url`) cannot be used: the reason says why and what to
    /// change.
    #[error("cannot attach to OpenCode at {url} (opencode.url): {reason}")]
    Attach { url: String, reason: String },
    /// The server process is gone.
    #[error("the OpenCode server {server_id} is not running: {reason}")]
    Gone { server_id: String, reason: String },
    /// Bad local configuration or arguments (password characters, a directory, a model id).
    #[error("{0}")]
    Config(String),
    /// A fault inside the gateway (an HTTP client that cannot be built, a request the generated
    /// client refuses to form): never the user's doing.
    #[error("internal error: {0}")]
    Internal(String),
}

impl Coded for OpencodeError {
    fn code(&self) -> ErrorCode {
        match self {
            OpencodeError::Unreachable { .. }
            | OpencodeError::Start(_)
            | OpencodeError::Attach { .. }
            | OpencodeError::Gone { .. }
            | OpencodeError::Unauthorized { .. }
            | OpencodeError::NotTheApi { .. } => ErrorCode::OpencodeUnavailable,
            OpencodeError::Http { status: 404, .. } => ErrorCode::NotFound,
            OpencodeError::Http { status: 400, .. } => ErrorCode::InvalidArgument,
            OpencodeError::Http { .. } | OpencodeError::Decode { .. } => ErrorCode::OpencodeError,
            OpencodeError::Config(_) => ErrorCode::InvalidArgument,
            OpencodeError::Internal(_) => ErrorCode::Internal,
        }
    }
}

impl OpencodeError {
    /// Classifies an error of the generated client.
    pub(crate) fn from_client<E: serde::Serialize + std::fmt::Debug>(
        operation: &str,
        e: progenitor_client::Error<E>,
    ) -> Self {
        use progenitor_client::Error as E2;
        let operation = operation.to_string();
        match e {
            E2::CommunicationError(e) | E2::ResponseBodyError(e) | E2::InvalidUpgrade(e) => {
                OpencodeError::Unreachable {
                    url: e
                        .url()
                        .map(|u| format!("{}://{}", u.scheme(), u.authority()))
                        .unwrap_or_default(),
                    operation,
                    reason: describe_reqwest(&e),
                }
            }
            E2::ErrorResponse(rv) => {
                let status = rv.status().as_u16();
                let body = serde_json::to_value(rv.into_inner()).unwrap_or_default();
                let info = super::types::error_info_from_json(&body);
                if status == 401 {
                    OpencodeError::Unauthorized { operation }
                } else {
                    OpencodeError::Http {
                        operation,
                        status,
                        name: info.name,
                        message: info.message,
                    }
                }
            }
            E2::InvalidResponsePayload(bytes, err) => {
                if bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'<') {
                    OpencodeError::NotTheApi { operation }
                } else {
                    OpencodeError::Decode {
                        operation,
                        detail: err.to_string(),
                    }
                }
            }
            E2::UnexpectedResponse(r) => {
                let status = r.status().as_u16();
                if status == 401 {
                    OpencodeError::Unauthorized { operation }
                } else {
                    OpencodeError::Http {
                        operation,
                        status,
                        name: "UnexpectedResponse".into(),
                        message: format!("unexpected HTTP {status}"),
                    }
                }
            }
            E2::InvalidRequest(m) | E2::Custom(m) => OpencodeError::Internal(m),
        }
    }
}

impl OpencodeError {
    /// The HTTP status OpenCode answered with, for errors that carry one.
    pub fn http_status(&self) -> Option<u16> {
        match self {
            OpencodeError::Http { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// A request of ours that got no answer.
    pub(crate) fn from_reqwest(operation: &str, e: &reqwest::Error) -> Self {
        OpencodeError::Unreachable {
            url: e
                .url()
                .map(|u| format!("{}://{}", u.scheme(), u.authority()))
                .unwrap_or_default(),
            operation: operation.to_string(),
            reason: describe_reqwest(e),
        }
    }

    /// The JSON body of an answer, classified as the generated client's answers are: 401,
    /// other error statuses (with OpenCode's error name and message), a web page instead of
    /// JSON, or JSON that does not parse.
    pub(crate) async fn json_body(
        operation: &str,
        response: reqwest::Response,
    ) -> Result<serde_json::Value, OpencodeError> {
        let operation = operation.to_string();
        let status = response.status();
        let bytes = response
            .bytes()
            .await
            .map_err(|e| OpencodeError::from_reqwest(&operation, &e))?;
        if status.as_u16() == 401 {
            return Err(OpencodeError::Unauthorized { operation });
        }
        let parsed = serde_json::from_slice::<serde_json::Value>(&bytes);
        if !status.is_success() {
            let info = parsed
                .as_ref()
                .map(super::types::error_info_from_json)
                .unwrap_or_else(|_| super::types::ErrorInfo {
                    name: "UnexpectedResponse".into(),
                    message: format!("unexpected HTTP {}", status.as_u16()),
                });
            return Err(OpencodeError::Http {
                operation,
                status: status.as_u16(),
                name: info.name,
                message: info.message,
            });
        }
        match parsed {
            Ok(value) => Ok(value),
            Err(_) if bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'<') => {
                Err(OpencodeError::NotTheApi { operation })
            }
            Err(e) => Err(OpencodeError::Decode {
                operation,
                detail: e.to_string(),
            }),
        }
    }
}

fn describe_reqwest(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "the request timed out (timeouts.request)".into()
    } else if e.is_connect() {
        "connection refused or failed".into()
    } else {
        let mut s = e.to_string();
        let mut src = std::error::Error::source(e);
        while let Some(inner) = src {
            s.push_str(": ");
            s.push_str(&inner.to_string());
            src = inner.source();
        }
        s
    }
}

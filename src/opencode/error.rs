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
    /// Classifies an error of the generated client, by the same rules as [`Self::json_body`]
    /// classifies the answers decoded by hand.
    pub(crate) fn from_client<E: serde::Serialize + std::fmt::Debug>(
        operation: &str,
        e: progenitor_client::Error<E>,
    ) -> Self {
        use progenitor_client::Error as E2;
        match e {
            E2::CommunicationError(e) | E2::ResponseBodyError(e) | E2::InvalidUpgrade(e) => {
                Self::from_reqwest(operation, &e)
            }
            E2::ErrorResponse(rv) => {
                let status = rv.status().as_u16();
                let body = serde_json::to_value(rv.into_inner()).ok();
                Self::answered(operation, status, body.as_ref())
            }
            E2::InvalidResponsePayload(bytes, err) => {
                Self::undecodable(operation, &bytes, err.to_string())
            }
            E2::UnexpectedResponse(r) => Self::answered(operation, r.status().as_u16(), None),
            E2::InvalidRequest(m) | E2::Custom(m) => OpencodeError::Internal(m),
        }
    }

    /// An error status: 401 is a wrong or missing password; any other carries OpenCode's error
    /// name and message when its body has them.
    fn answered(operation: &str, status: u16, body: Option<&serde_json::Value>) -> Self {
        if status == 401 {
            return OpencodeError::Unauthorized {
                operation: operation.to_string(),
            };
        }
        let info = body
            .map(super::types::error_info_from_json)
            .unwrap_or_else(|| super::types::ErrorInfo {
                provider_status: None,
                retryable: None,
                name: "UnexpectedResponse".into(),
                message: format!("unexpected HTTP {status}"),
            });
        OpencodeError::Http {
            operation: operation.to_string(),
            status,
            name: info.name,
            message: info.message,
        }
    }

    /// A success status whose body is not what was expected: a web page means the URL is not
    /// OpenCode's API (OpenCode answers unknown routes with its web UI).
    fn undecodable(operation: &str, bytes: &[u8], detail: String) -> Self {
        let operation = operation.to_string();
        if bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'<') {
            OpencodeError::NotTheApi { operation }
        } else {
            OpencodeError::Decode { operation, detail }
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
        let status = response.status();
        let bytes = response
            .bytes()
            .await
            .map_err(|e| OpencodeError::from_reqwest(operation, &e))?;
        let parsed = serde_json::from_slice::<serde_json::Value>(&bytes);
        if !status.is_success() {
            return Err(Self::answered(
                operation,
                status.as_u16(),
                parsed.as_ref().ok(),
            ));
        }
        parsed.map_err(|e| Self::undecodable(operation, &bytes, e.to_string()))
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

//! The gateway's error type and its mapping to HTTP statuses.
//!
//! Internal details (apiserver errors, S3 errors, paths) go to the log, never to the client:
//! [`Error::public_message`] is what a client sees.

use axum::http::StatusCode;

/// Gateway errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No or invalid credentials.
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// Authenticated but not allowed (e.g. missing scope).
    #[error("forbidden: {0}")]
    Forbidden(String),
    /// Unknown tool, task or artifact — also used for things the caller may not see.
    #[error("not found: {0}")]
    NotFound(String),
    /// Input the caller can fix.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// Body or value above a size cap.
    #[error("too large: {0}")]
    TooLarge(String),
    /// Admission limits reached.
    #[error("server busy: {0}")]
    Busy(String),
    /// A deadline passed.
    #[error("timed out: {0}")]
    Timeout(String),
    /// A part is not built or not configured; the message says which.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// Kubernetes API failure.
    #[error("kubernetes: {0}")]
    Kube(#[from] kube::Error),
    /// Storage failure.
    #[error("storage: {0}")]
    Storage(String),
    /// Anything else.
    #[error("internal: {0}")]
    Internal(String),
}

/// Result with the gateway's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// HTTP status for this error.
    pub fn status(&self) -> StatusCode {
        match self {
            Error::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            Error::Forbidden(_) => StatusCode::FORBIDDEN,
            Error::NotFound(_) => StatusCode::NOT_FOUND,
            Error::InvalidRequest(_) => StatusCode::BAD_REQUEST,
            Error::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Error::Busy(_) => StatusCode::SERVICE_UNAVAILABLE,
            Error::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            Error::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Error::Kube(_) | Error::Storage(_) | Error::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The message a client may see: the caller-facing variants verbatim, a generic
    /// message for internal failures (whose details are logged instead).
    pub fn public_message(&self) -> String {
        match self {
            Error::Kube(_) | Error::Storage(_) | Error::Internal(_) => "internal error; see the gateway log".to_owned(),
            other => other.to_string(),
        }
    }
}

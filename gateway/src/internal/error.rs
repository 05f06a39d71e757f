//! Errors of the internal API as JSON answers: `{"error": "..."}` with a status.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error answer of the internal API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Message for the runner (never internal details: those go to the log).
    pub message: String,
}

impl ApiError {
    /// An error with a status and message.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self { status, message: message.into() }
    }

    /// 400.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// 401.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, message)
    }

    /// 403.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, message)
    }

    /// 404.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }

    /// 413.
    pub fn too_large(what: &str, limit: usize) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, format!("{what} is larger than {limit} bytes"))
    }
}

impl From<crate::Error> for ApiError {
    fn from(e: crate::Error) -> Self {
        if e.status().is_server_error() {
            tracing::error!(error = %e, "internal API request failed");
        }
        Self::new(e.status(), e.public_message())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(json!({"error": self.message}))).into_response()
    }
}

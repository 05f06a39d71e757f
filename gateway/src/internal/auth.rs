//! Runner token checks: the bearer token must be signed with the master key, unexpired, and
//! name the run the path names.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;
use toolyard_api::OwnerKey;
use toolyard_api::storage::RunId;
use toolyard_api::token::{Claims, RunKind};

use super::InternalState;
use super::error::ApiError;

/// The verified claims of the request's runner token.
#[derive(Clone, Debug)]
pub struct RunClaims(pub Claims);

impl RunClaims {
    /// The run id of the path, if the token is for exactly that run of that kind.
    pub fn require(&self, kind: RunKind, id: &str) -> Result<RunId, ApiError> {
        let claims = &self.0;
        if claims.kind != kind {
            let what = match kind {
                RunKind::Call => "call",
                RunKind::Task => "task",
            };
            return Err(ApiError::forbidden(format!("this token is not for a {what}")));
        }
        if claims.id != id {
            return Err(ApiError::forbidden("this token is for another run"));
        }
        RunId::parse(id).map_err(|e| ApiError::bad_request(e.to_string()))
    }

    /// The storage owner the run acts as.
    pub fn owner_key(&self) -> OwnerKey {
        self.0.owner.key()
    }
}

impl FromRequestParts<Arc<InternalState>> for RunClaims {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<InternalState>) -> Result<Self, ApiError> {
        let value =
            parts.headers.get(header::AUTHORIZATION).ok_or_else(|| ApiError::unauthorized("missing bearer token"))?;
        let token = value
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
            .ok_or_else(|| ApiError::unauthorized("the Authorization header is not a bearer token"))?;
        match state.key.verify(token.trim(), now()) {
            Ok(claims) => Ok(RunClaims(claims)),
            Err(e) => {
                tracing::debug!(reason = %e, "runner token refused");
                Err(ApiError::unauthorized(e.to_string()))
            }
        }
    }
}

/// Seconds since the Unix epoch.
pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

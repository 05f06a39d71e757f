//! Authentication: bearer credentials to an [`Identity`].
//!
//! Authenticators are tried in order (API keys, OIDC JWTs, Kubernetes TokenReview); the
//! first that recognizes the credential decides.

use async_trait::async_trait;

use crate::identity::Identity;

/// Why a credential was refused; the reason is a bounded metric label.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct AuthError {
    /// Short machine reason (`missing`, `invalid`, `expired`, `audience`, `issuer`, ...).
    pub reason: &'static str,
    /// Message for the log and the `WWW-Authenticate` error description (no secrets).
    pub message: String,
}

/// One way of authenticating a bearer token.
#[async_trait]
pub trait Authenticator: Send + Sync + 'static {
    /// `Ok(Some(identity))`: accepted. `Ok(None)`: not a credential of this kind, try the
    /// next. `Err`: this kind, but refused (stop).
    async fn authenticate(&self, token: &str) -> Result<Option<Identity>, AuthError>;
}

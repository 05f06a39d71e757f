//! Authentication: bearer credentials to an [`Identity`].
//!
//! Authenticators are tried in order (API keys, OIDC JWTs, Kubernetes TokenReview); the
//! first that recognizes the credential decides. [`chain::AuthChain`] holds them,
//! [`middleware::require_identity`] puts the result into the request, and
//! [`metadata`] serves the RFC 9728 protected resource metadata the 401 points at.
//! Tokens are never logged and never passed on: only their SHA-256 is kept (as cache keys).

use async_trait::async_trait;

use crate::identity::Identity;

pub mod apikey;
pub mod cache;
pub mod chain;
pub mod config;
pub mod jwks;
pub mod jwt;
pub mod metadata;
pub mod metrics;
pub mod middleware;
pub mod tokenreview;

pub use chain::{Anonymous, AuthChain};
pub use config::AuthArgs;
pub use metadata::{ProtectedResourceMetadata, metadata_router};
pub use metrics::AuthMetrics;
pub use middleware::{AuthState, authenticate, require_identity};

/// Why a credential was refused; the reason is a bounded metric label.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct AuthError {
    /// Short machine reason (`missing`, `invalid`, `expired`, `audience`, `issuer`, ...).
    pub reason: &'static str,
    /// Message for the log and the `WWW-Authenticate` error description (no secrets).
    pub message: String,
}

impl AuthError {
    /// An error with one of the [`reason`] constants.
    pub fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Self { reason, message: message.into() }
    }

    /// True when the credential may be fine but a dependency (JWKS endpoint, apiserver)
    /// could not be asked: answered 503, not 401.
    pub fn is_unavailable(&self) -> bool {
        self.reason == reason::UNAVAILABLE
    }
}

/// The bounded set of [`AuthError::reason`] values (metric labels).
pub mod reason {
    /// No credential and anonymous access is off.
    pub const MISSING: &str = "missing";
    /// The `Authorization` header is not a usable `Bearer` credential.
    pub const MALFORMED: &str = "malformed";
    /// Refused: unknown API key, TokenReview said no, bad signature shape, ...
    pub const INVALID: &str = "invalid";
    /// Signature does not verify.
    pub const SIGNATURE: &str = "signature";
    /// `exp` passed.
    pub const EXPIRED: &str = "expired";
    /// `nbf` in the future.
    pub const NOT_YET_VALID: &str = "not_yet_valid";
    /// `aud` does not name this gateway.
    pub const AUDIENCE: &str = "audience";
    /// `iss` is not a configured issuer.
    pub const ISSUER: &str = "issuer";
    /// `alg` is not RS256/ES256 (including `none` and HMAC).
    pub const ALGORITHM: &str = "algorithm";
    /// `kid` not in the issuer's JWKS, even after a refresh.
    pub const UNKNOWN_KEY: &str = "unknown_key";
    /// A required claim is missing or has the wrong type.
    pub const CLAIMS: &str = "claims";
    /// No configured authenticator recognized the credential.
    pub const UNRECOGNIZED: &str = "unrecognized";
    /// Authenticated, but a required OAuth scope is missing.
    pub const INSUFFICIENT_SCOPE: &str = "insufficient_scope";
    /// A dependency (JWKS, apiserver) could not be reached.
    pub const UNAVAILABLE: &str = "unavailable";

    /// Every reason, for pre-registering metric label values.
    pub const ALL: &[&str] = &[
        MISSING,
        MALFORMED,
        INVALID,
        SIGNATURE,
        EXPIRED,
        NOT_YET_VALID,
        AUDIENCE,
        ISSUER,
        ALGORITHM,
        UNKNOWN_KEY,
        CLAIMS,
        UNRECOGNIZED,
        INSUFFICIENT_SCOPE,
        UNAVAILABLE,
    ];
}

/// One way of authenticating a bearer token.
#[async_trait]
pub trait Authenticator: Send + Sync + 'static {
    /// `Ok(Some(identity))`: accepted. `Ok(None)`: not a credential of this kind, try the
    /// next. `Err`: this kind, but refused (stop).
    async fn authenticate(&self, token: &str) -> Result<Option<Identity>, AuthError>;
}

/// Lowercase hex SHA-256 of `data` (API key hashes).
pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(sha256(data))
}

/// SHA-256 of `data` (cache keys for tokens).
pub fn sha256(data: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(data).into()
}

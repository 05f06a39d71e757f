//! The ordered list of authenticators a request's bearer token is offered to.
//!
//! The first authenticator that recognizes the token decides (accepts or refuses); a
//! token nobody recognizes is refused as `unrecognized`. A request without a token gets
//! the anonymous identity only when one was configured explicitly; a request with a bad
//! token is never downgraded to anonymous.

use std::sync::Arc;

use super::metrics::AuthMetrics;
use super::{AuthError, Authenticator, reason};
use crate::identity::Identity;

/// Issuer of the identity built by [`Anonymous::identity`].
pub const ANONYMOUS_ISSUER: &str = "anonymous";

/// Settings of anonymous access (off unless configured).
#[derive(Clone, Debug)]
pub struct Anonymous {
    /// User name given to requests without credentials.
    pub user: String,
    /// Their groups.
    pub groups: Vec<String>,
}

impl Anonymous {
    /// The identity requests without credentials get (issuer `anonymous`).
    pub fn identity(&self) -> Identity {
        Identity {
            issuer: ANONYMOUS_ISSUER.to_owned(),
            user: self.user.clone(),
            groups: self.groups.clone(),
            scopes: Vec::new(),
        }
    }
}

/// Authenticators in order, optional anonymous identity, and outcome counters.
#[derive(Clone, Default)]
pub struct AuthChain {
    authenticators: Vec<Arc<dyn Authenticator>>,
    anonymous: Option<Identity>,
    metrics: AuthMetrics,
}

impl std::fmt::Debug for AuthChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthChain")
            .field("authenticators", &self.authenticators.len())
            .field("anonymous", &self.anonymous)
            .finish_non_exhaustive()
    }
}

impl AuthChain {
    /// A chain trying `authenticators` in order; no anonymous access.
    pub fn new(authenticators: Vec<Arc<dyn Authenticator>>) -> Self {
        Self { authenticators, anonymous: None, metrics: AuthMetrics::default() }
    }

    /// Requests without credentials get `identity` (e.g. [`Anonymous::identity`], or the
    /// local user of embedded mode on loopback).
    pub fn with_anonymous(mut self, identity: Identity) -> Self {
        self.anonymous = Some(identity);
        self
    }

    /// Counts outcomes into `metrics` (share it with the `/metrics` registry).
    pub fn with_metrics(mut self, metrics: AuthMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The counters this chain updates.
    pub fn metrics(&self) -> &AuthMetrics {
        &self.metrics
    }

    /// True when requests without credentials are let in.
    pub fn allows_anonymous(&self) -> bool {
        self.anonymous.is_some()
    }

    /// Authenticates a bearer token (`None`: no credentials sent), counting the outcome.
    pub async fn authenticate(&self, token: Option<&str>) -> Result<Identity, AuthError> {
        let result = self.decide(token).await;
        match &result {
            Ok(identity) => self.metrics.success(identity),
            Err(e) => {
                self.metrics.failure(e.reason);
                tracing::info!(reason = e.reason, message = %e.message, "authentication refused");
            }
        }
        result
    }

    async fn decide(&self, token: Option<&str>) -> Result<Identity, AuthError> {
        let Some(token) = token else {
            return self.anonymous.clone().ok_or_else(|| AuthError::new(reason::MISSING, "no bearer token"));
        };
        for authenticator in &self.authenticators {
            if let Some(identity) = authenticator.authenticate(token).await? {
                return Ok(identity);
            }
        }
        Err(AuthError::new(reason::UNRECOGNIZED, "no configured authenticator accepts this token"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::apikey::{ApiKey, ApiKeyAuthenticator, generate_api_key};

    #[tokio::test]
    async fn anonymous_only_without_credentials_and_only_when_enabled() {
        let (key, hash) = generate_api_key();
        let keys: Arc<dyn Authenticator> =
            Arc::new(ApiKeyAuthenticator::from_keys(vec![ApiKey::new("alice", vec![], &hash).expect("hash")]));
        let closed = AuthChain::new(vec![Arc::clone(&keys)]);
        assert_eq!(closed.authenticate(None).await.expect_err("no anonymous").reason, reason::MISSING);
        assert_eq!(closed.authenticate(Some("other")).await.expect_err("unknown").reason, reason::UNRECOGNIZED);
        assert_eq!(closed.metrics().failures_for(reason::UNRECOGNIZED), 1);

        let anon = Anonymous { user: "guest".into(), groups: vec!["guests".into()] };
        let open = AuthChain::new(vec![keys]).with_anonymous(anon.identity());
        assert_eq!(open.authenticate(None).await.expect("anonymous").user, "guest");
        assert_eq!(open.authenticate(Some(&key)).await.expect("key").user, "alice");
        let bad = open.authenticate(Some("ty_wrong")).await.expect_err("bad key is not downgraded");
        assert_eq!(bad.reason, reason::INVALID);
    }
}

//! Kubernetes tokens (ServiceAccount tokens, or any token the apiserver accepts) checked
//! with a TokenReview that names the gateway's audience.
//!
//! The gateway's own identity needs only `create` on `tokenreviews`. Results are cached
//! briefly, keyed by the token's SHA-256 (never the token): accepted for
//! `positive_ttl`, refused for `negative_ttl`; apiserver failures are not cached. The
//! identity's issuer is `kubernetes`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};

use super::cache::TtlCache;
use super::{AuthError, Authenticator, reason};
use crate::identity::Identity;

/// The issuer recorded on identities authenticated by TokenReview.
pub const ISSUER: &str = "kubernetes";

/// TokenReview settings.
#[derive(Clone, Debug)]
pub struct TokenReviewSettings {
    /// Audience the token must be valid for (`toolyard` by default).
    pub audience: String,
    /// How long an accepted token's identity is reused.
    pub positive_ttl: Duration,
    /// How long a refused token stays refused without asking again.
    pub negative_ttl: Duration,
    /// Timeout of each review.
    pub timeout: Duration,
    /// Cache bound.
    pub max_entries: usize,
}

impl Default for TokenReviewSettings {
    fn default() -> Self {
        Self {
            audience: "toolyard".into(),
            positive_ttl: Duration::from_secs(60),
            negative_ttl: Duration::from_secs(10),
            timeout: Duration::from_secs(5),
            max_entries: 10_000,
        }
    }
}

/// Authenticates tokens by TokenReview.
pub struct TokenReviewAuthenticator {
    api: Api<TokenReview>,
    settings: TokenReviewSettings,
    cache: TtlCache<[u8; 32], Result<Identity, AuthError>>,
    reviews: AtomicU64,
}

impl std::fmt::Debug for TokenReviewAuthenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenReviewAuthenticator").field("settings", &self.settings).finish_non_exhaustive()
    }
}

impl TokenReviewAuthenticator {
    /// Reviews tokens with `client` (which needs `create tokenreviews`).
    pub fn new(client: kube::Client, settings: TokenReviewSettings) -> Self {
        let cache = TtlCache::new(settings.max_entries);
        Self { api: Api::all(client), settings, cache, reviews: AtomicU64::new(0) }
    }

    /// TokenReviews sent so far (cache hits send none).
    pub fn reviews_sent(&self) -> u64 {
        self.reviews.load(Ordering::Relaxed)
    }

    async fn review(&self, token: &str) -> Result<Identity, AuthError> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: Some(vec![self.settings.audience.clone()]),
            },
            ..Default::default()
        };
        self.reviews.fetch_add(1, Ordering::Relaxed);
        let answer = tokio::time::timeout(self.settings.timeout, self.api.create(&PostParams::default(), &review))
            .await
            .map_err(|_| {
                tracing::warn!(timeout = ?self.settings.timeout, "TokenReview timed out");
                AuthError::new(reason::UNAVAILABLE, "token review timed out")
            })?
            .map_err(|e| {
                tracing::warn!(error = %e, "TokenReview failed");
                AuthError::new(reason::UNAVAILABLE, "token review failed")
            })?;
        let status = answer.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            if let Some(error) = status.error.as_deref().filter(|e| !e.is_empty()) {
                tracing::debug!(error, "TokenReview refused the token");
            }
            return Err(AuthError::new(reason::INVALID, "token not accepted by Kubernetes"));
        }
        let audiences = status.audiences.unwrap_or_default();
        if !audiences.contains(&self.settings.audience) {
            return Err(AuthError::new(reason::AUDIENCE, "token is not valid for this gateway's audience"));
        }
        let user = status.user.unwrap_or_default();
        let name = user
            .username
            .filter(|u| !u.is_empty())
            .ok_or_else(|| AuthError::new(reason::CLAIMS, "TokenReview accepted the token but named no user"))?;
        Ok(Identity {
            issuer: ISSUER.to_owned(),
            user: name,
            groups: user.groups.unwrap_or_default(),
            scopes: Vec::new(),
        })
    }
}

#[async_trait]
impl Authenticator for TokenReviewAuthenticator {
    async fn authenticate(&self, token: &str) -> Result<Option<Identity>, AuthError> {
        let key = super::sha256(token.as_bytes());
        if let Some(cached) = self.cache.get(&key) {
            return cached.map(Some);
        }
        let result = self.review(token).await;
        match &result {
            Ok(_) => self.cache.insert(key, result.clone(), self.settings.positive_ttl),
            Err(e) if !e.is_unavailable() => self.cache.insert(key, result.clone(), self.settings.negative_ttl),
            Err(_) => {}
        }
        result.map(Some)
    }
}

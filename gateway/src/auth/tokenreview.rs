//! Kubernetes tokens (ServiceAccount tokens, or any token the apiserver accepts) checked
//! with a TokenReview that names the gateway's audience.
//!
//! The gateway's own identity needs only `create` on `tokenreviews`. Results are cached
//! briefly, keyed by the token's SHA-256 (never the token): accepted for
//! `positive_ttl`, refused for `negative_ttl`, in two bounded caches so that a flood of refused
//! tokens never pushes out accepted ones; apiserver failures are not cached. The identity's
//! issuer is `kubernetes`.
//!
//! Only tokens that could be Kubernetes tokens are reviewed ([`precheck`]): ServiceAccount
//! tokens are JWTs, so by default anything else is left to the other authenticators (and
//! refused as unrecognized) without a TokenReview, and a JWT past its `exp` is refused here.
//! A JWT must also carry a valid signature of one of the cluster's ServiceAccount keys (the
//! apiserver's `/openid/v1/jwks`, cached like an OIDC issuer's keys): made-up tokens, however
//! many, cost a signature check here and never a TokenReview. When those keys cannot be read
//! the token is reviewed as before (the apiserver still decides). Clusters whose users hold
//! opaque tokens (a static token file, a webhook authenticator) turn on
//! [`TokenReviewSettings::opaque_tokens`]; clusters whose apiserver also accepts other JWTs
//! (OIDC) turn on [`TokenReviewSettings::other_jwts`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use base64::Engine;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, Validation};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};
use serde_json::{Map, Value};

use super::cache::TtlCache;
use super::jwks::{IssuerKeys, JwksSource, JwksTiming, MAX_DOCUMENT_BYTES};
use super::{AuthError, Authenticator, reason};
use crate::identity::Identity;

/// The issuer recorded on identities authenticated by TokenReview.
pub const ISSUER: &str = "kubernetes";

/// Longest token sent to TokenReview (ServiceAccount tokens are about 1 KiB).
const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// Clock skew allowed when a JWT's `exp` is checked before a review.
const EXP_LEEWAY_SECS: i64 = 60;

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
    /// Bound of each cache (accepted tokens, refused tokens).
    pub max_entries: usize,
    /// Also review tokens that are not JWTs (static token files, webhook authenticators with
    /// opaque tokens). Off: only JWTs, the shape of ServiceAccount tokens, are reviewed.
    pub opaque_tokens: bool,
    /// Also review JWTs that no ServiceAccount key of the cluster signed (an apiserver that
    /// also accepts OIDC JWTs). Off: such JWTs are refused here, without a TokenReview.
    pub other_jwts: bool,
    /// Cache timing of the cluster's ServiceAccount keys.
    pub keys: JwksTiming,
}

impl Default for TokenReviewSettings {
    fn default() -> Self {
        Self {
            audience: "toolyard".into(),
            positive_ttl: Duration::from_secs(60),
            negative_ttl: Duration::from_secs(10),
            timeout: Duration::from_secs(5),
            max_entries: 10_000,
            opaque_tokens: false,
            other_jwts: false,
            keys: JwksTiming { ttl: Duration::from_secs(300), min_refresh_interval: Duration::from_secs(10) },
        }
    }
}

/// Authenticates tokens by TokenReview.
pub struct TokenReviewAuthenticator {
    api: Api<TokenReview>,
    settings: TokenReviewSettings,
    accepted: TtlCache<[u8; 32], Identity>,
    refused: TtlCache<[u8; 32], AuthError>,
    reviews: AtomicU64,
    /// The cluster's ServiceAccount keys (`None` with [`TokenReviewSettings::other_jwts`]).
    cluster_keys: Option<IssuerKeys>,
}

impl std::fmt::Debug for TokenReviewAuthenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenReviewAuthenticator").field("settings", &self.settings).finish_non_exhaustive()
    }
}

impl TokenReviewAuthenticator {
    /// Reviews tokens with `client` (which needs `create tokenreviews`, and `get` on the
    /// non-resource URL `/openid/v1/jwks` unless [`TokenReviewSettings::other_jwts`]).
    pub fn new(client: kube::Client, settings: TokenReviewSettings) -> Self {
        let (accepted, refused) = (TtlCache::new(settings.max_entries), TtlCache::new(settings.max_entries));
        let cluster_keys = (!settings.other_jwts).then(|| {
            IssuerKeys::with_source("kubernetes".into(), settings.keys, Box::new(ClusterKeys(client.clone())))
        });
        Self { api: Api::all(client), settings, accepted, refused, reviews: AtomicU64::new(0), cluster_keys }
    }

    /// Refuses a JWT that none of the cluster's ServiceAccount keys signed; `Ok` when one did,
    /// or when the keys cannot be read (then the apiserver decides).
    async fn signed_by_cluster(&self, keys: &IssuerKeys, token: &str) -> Result<(), AuthError> {
        let not_ours = || AuthError::new(reason::INVALID, "the token was not signed by this cluster");
        let header = jsonwebtoken::decode_header(token).map_err(|_| not_ours())?;
        if !matches!(header.alg, Algorithm::RS256 | Algorithm::ES256) {
            return Err(not_ours());
        }
        let key = match keys.find(header.kid.as_deref(), header.alg).await {
            Ok(key) => key,
            Err(e) if e.is_unavailable() => {
                tracing::debug!("the cluster's ServiceAccount keys are unavailable; the apiserver decides");
                return Ok(());
            }
            Err(_) => return Err(not_ours()),
        };
        // Only the signature and expiry here; audience, issuer and the bound objects are the
        // TokenReview's.
        let mut validation = Validation::new(header.alg);
        validation.validate_aud = false;
        validation.required_spec_claims.clear();
        validation.leeway = EXP_LEEWAY_SECS.unsigned_abs();
        jsonwebtoken::decode::<Map<String, Value>>(token, &key.key, &validation).map(|_| ()).map_err(|_| not_ours())
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
        if !precheck(token, self.settings.opaque_tokens, unix_now())? {
            tracing::debug!("the token cannot be a Kubernetes token; no TokenReview sent");
            return Ok(None);
        }
        let key = super::sha256(token.as_bytes());
        if let Some(identity) = self.accepted.get(&key) {
            return Ok(Some(identity));
        }
        if let Some(refusal) = self.refused.get(&key) {
            return Err(refusal);
        }
        if let Some(keys) = &self.cluster_keys
            && jwt_claims(token).is_some()
        {
            self.signed_by_cluster(keys, token).await?;
        }
        let result = self.review(token).await;
        match &result {
            Ok(identity) => {
                self.accepted.insert(key, identity.clone(), self.settings.positive_ttl);
            }
            Err(e) if !e.is_unavailable() => {
                self.refused.insert(key, e.clone(), self.settings.negative_ttl);
            }
            Err(_) => {}
        }
        result.map(Some)
    }
}

/// The cluster's ServiceAccount keys, read from the apiserver (`GET /openid/v1/jwks`).
struct ClusterKeys(kube::Client);

#[async_trait]
impl JwksSource for ClusterKeys {
    async fn fetch(&self) -> Result<JwkSet, String> {
        const PATH: &str = "/openid/v1/jwks";
        let request = http::Request::get(PATH).body(Vec::new()).map_err(|e| e.to_string())?;
        let text = self.0.request_text(request).await.map_err(|e| format!("GET {PATH}: {e}"))?;
        if text.len() > MAX_DOCUMENT_BYTES {
            return Err(format!("GET {PATH}: larger than {MAX_DOCUMENT_BYTES} bytes"));
        }
        serde_json::from_str(&text).map_err(|e| format!("GET {PATH}: not a JWKS: {e}"))
    }
}

/// Whether `token` is worth a TokenReview: `Ok(true)` to review it, `Ok(false)` when it cannot
/// be a Kubernetes token (not ours: the next authenticator, or a refusal as unrecognized),
/// `Err` for a JWT whose `exp` has passed (`now` in Unix seconds).
///
/// A JWT here is three base64url segments whose header is a JSON object naming an `alg` and
/// whose payload is a JSON object; nothing is verified (the apiserver does that). Tokens longer
/// than [`MAX_TOKEN_BYTES`] are never reviewed; other shapes only with `opaque_tokens`.
pub fn precheck(token: &str, opaque_tokens: bool, now: i64) -> Result<bool, AuthError> {
    if token.is_empty() || token.len() > MAX_TOKEN_BYTES {
        return Ok(false);
    }
    let Some(claims) = jwt_claims(token) else { return Ok(opaque_tokens) };
    let exp = claims.get("exp").and_then(Value::as_i64);
    if exp.is_some_and(|exp| exp.saturating_add(EXP_LEEWAY_SECS) < now) {
        return Err(AuthError::new(reason::EXPIRED, "token expired"));
    }
    Ok(true)
}

/// The payload of a token shaped like a JWT (see [`precheck`]), unverified.
fn jwt_claims(token: &str) -> Option<Map<String, Value>> {
    let mut segments = token.split('.');
    let (header, payload, signature) = (segments.next()?, segments.next()?, segments.next()?);
    let base64url = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if segments.next().is_some() || ![header, payload, signature].into_iter().all(base64url) {
        return None;
    }
    let decode = |s: &str| -> Option<Map<String, Value>> {
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(s).ok()?;
        serde_json::from_slice(&bytes).ok()
    };
    decode(header)?.get("alg")?.as_str()?;
    decode(payload)
}

fn unix_now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::Arc;

    use http_body_util::BodyExt;
    use serde_json::json;

    use super::*;

    const NOW: i64 = 1_800_000_000;

    /// A token shaped like a ServiceAccount token (unsigned: the apiserver stand-in decides).
    fn jwt(payload: Value) -> String {
        let enc = |v: Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
        format!("{}.{}.c2lnbmF0dXJl", enc(json!({"alg": "RS256", "kid": "k1"})), enc(payload))
    }

    #[test]
    fn only_tokens_shaped_like_kubernetes_tokens_are_reviewed() {
        let live =
            jwt(json!({"iss": "https://kubernetes.default.svc", "sub": "system:serviceaccount:a:b", "exp": NOW + 600}));
        assert_eq!(precheck(&live, false, NOW), Ok(true));
        assert_eq!(precheck(&jwt(json!({"sub": "legacy, no exp"})), false, NOW), Ok(true));
        let within_leeway = jwt(json!({"exp": NOW - 30}));
        assert_eq!(precheck(&within_leeway, false, NOW), Ok(true), "clock skew is allowed");
        let expired = precheck(&jwt(json!({"exp": NOW - 3600})), true, NOW).unwrap_err();
        assert_eq!(expired.reason, reason::EXPIRED);

        let header = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(r#"{"alg":"RS256"}"#);
        for not_jwt in [
            "not-a-real-token-0123456789".to_owned(),
            "a.b.c".to_owned(),
            format!("{header}.e30"),
            format!("{header}.e30.sig.extra"),
            format!("{header}.e30."),
            format!("{header}.e30=.sig"),
            format!("{}.e30.sig", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(r#"{"typ":"JWT"}"#)),
            format!("{header}.{}.sig", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode("[1]")),
        ] {
            assert_eq!(precheck(&not_jwt, false, NOW), Ok(false), "{not_jwt}");
            assert_eq!(precheck(&not_jwt, true, NOW), Ok(true), "with opaque tokens on: {not_jwt}");
        }
        let huge = jwt(json!({"pad": "x".repeat(MAX_TOKEN_BYTES)}));
        assert_eq!((precheck(&huge, false, NOW), precheck(&huge, true, NOW)), (Ok(false), Ok(false)));
        assert_eq!(precheck("", true, NOW), Ok(false));
    }

    /// An apiserver stand-in for the one function under test: answers TokenReviews, accepting
    /// only `good`, and counts them.
    fn authenticator(good: String, settings: TokenReviewSettings) -> (TokenReviewAuthenticator, Arc<AtomicU64>) {
        let sent = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&sent);
        let apiserver = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let (good, counter) = (good.clone(), Arc::clone(&counter));
            async move {
                counter.fetch_add(1, Ordering::Relaxed);
                let body = request.into_body().collect().await.expect("request body").to_bytes();
                let review: Value = serde_json::from_slice(&body).expect("a TokenReview");
                let token = review["spec"]["token"].as_str().unwrap_or_default();
                let status = if token == good {
                    json!({"authenticated": true, "user": {"username": "sa"}, "audiences": ["toolyard"]})
                } else {
                    json!({"authenticated": false, "error": "invalid bearer token"})
                };
                let answer = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                    "metadata": {}, "spec": review["spec"], "status": status});
                let response = http::Response::builder()
                    .status(201)
                    .header("content-type", "application/json")
                    .body(http_body_util::Full::new(bytes::Bytes::from(answer.to_string())))
                    .expect("response");
                Ok::<_, Infallible>(response)
            }
        });
        (TokenReviewAuthenticator::new(kube::Client::new(apiserver, "default"), settings), sent)
    }

    #[tokio::test]
    async fn refusals_are_cached_briefly_apart_from_accepted_tokens_and_non_jwts_cost_no_review() {
        let good = jwt(json!({"sub": "sa", "exp": unix_now() + 600}));
        let settings = TokenReviewSettings {
            negative_ttl: Duration::from_millis(300),
            max_entries: 4,
            // These tokens are unsigned: the stand-in apiserver decides (auth_tokenreview tests
            // the signature check against the real apiserver's keys).
            other_jwts: true,
            ..TokenReviewSettings::default()
        };
        let (auth, sent) = authenticator(good.clone(), settings);
        let reviews = || sent.load(Ordering::Relaxed);

        for _ in 0..100 {
            assert_eq!(auth.authenticate("random-opaque-token-0123456789").await, Ok(None));
        }
        assert_eq!(reviews(), 0, "a token that is no JWT is never reviewed");

        assert_eq!(auth.authenticate(&good).await.expect("accepted").expect("identity").user, "sa");
        let bad = jwt(json!({"sub": "forged", "exp": unix_now() + 600}));
        for _ in 0..10 {
            assert_eq!(auth.authenticate(&bad).await.expect_err("refused").reason, reason::INVALID);
        }
        assert_eq!(reviews(), 2, "one review each; the refusal came from the cache after the first");

        // More refused tokens than the cache holds: they never push the accepted one out.
        for i in 0..20 {
            let other = jwt(json!({"sub": format!("forged-{i}"), "exp": unix_now() + 600}));
            assert!(auth.authenticate(&other).await.is_err());
        }
        assert_eq!(reviews(), 22);
        assert!(auth.refused.len() <= 4, "the refusal cache is bounded");
        assert!(auth.authenticate(&good).await.is_ok());
        assert_eq!(reviews(), 22, "the accepted token is still cached");

        // The refusal is remembered for the negative TTL only.
        assert!(auth.authenticate(&bad).await.is_err());
        let before = reviews();
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(auth.authenticate(&bad).await.is_err());
        assert_eq!(reviews(), before + 1, "asked again once the refusal expired");
    }
}

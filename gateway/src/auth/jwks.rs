//! The JWKS cache of one issuer, and OIDC discovery of its keys.
//!
//! Keys come from a [`JwksSource`]: for an OIDC issuer, [`Discovered`]:
//! `<issuer>/.well-known/openid-configuration` gives the `jwks_uri` (its `issuer` must equal
//! the configured one exactly); the cluster's ServiceAccount keys come from the apiserver. Keys are cached for a TTL; a token whose `kid` is unknown
//! triggers a refresh, at most once per `min_refresh_interval` so that tokens with random
//! `kid`s cannot make the gateway hammer the identity provider. When a refresh fails the
//! previous keys stay in use. Only RS256 (RSA, at least 2048 bits) and ES256 (P-256) keys
//! are kept.

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, JwkSet, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use serde::Deserialize;

use super::{AuthError, reason};

/// Largest discovery or JWKS document accepted.
pub const MAX_DOCUMENT_BYTES: usize = 512 * 1024;

/// Where an issuer's current key set comes from.
#[async_trait]
pub trait JwksSource: Send + Sync {
    /// Fetches the key set (the caller limits how often).
    async fn fetch(&self) -> Result<JwkSet, String>;
}

/// Cache timing of one issuer's keys.
#[derive(Clone, Copy, Debug)]
pub struct JwksTiming {
    /// Keys older than this are fetched again before use.
    pub ttl: Duration,
    /// Minimum time between two fetches (unknown `kid`s do not cause more).
    pub min_refresh_interval: Duration,
}

/// One verification key.
#[derive(Clone)]
pub struct VerifyingKey {
    /// `kid`, when the JWK has one.
    pub kid: Option<String>,
    /// RS256 or ES256.
    pub alg: Algorithm,
    /// The key.
    pub key: DecodingKey,
}

struct KeySet {
    keys: Vec<VerifyingKey>,
    fetched: Instant,
}

/// Discovery and cached keys of one issuer.
pub struct IssuerKeys {
    issuer: String,
    timing: JwksTiming,
    source: Box<dyn JwksSource>,
    keys: RwLock<Option<Arc<KeySet>>>,
    /// When keys were last fetched (or tried), serializing fetches.
    last_attempt: tokio::sync::Mutex<Option<Instant>>,
}

#[derive(Deserialize)]
struct Discovery {
    issuer: String,
    jwks_uri: String,
}

/// An OIDC issuer's keys over HTTPS: `jwks_uri` when configured, else by discovery.
pub struct Discovered {
    issuer: String,
    configured_jwks_uri: Option<String>,
    http: reqwest::Client,
    /// The discovered `jwks_uri`, until a fetch fails (it may have moved).
    discovered: std::sync::Mutex<Option<String>>,
}

impl IssuerKeys {
    /// Keys of `issuer`, from `jwks_uri` when given, else by discovery.
    pub fn new(issuer: String, jwks_uri: Option<String>, timing: JwksTiming, http: reqwest::Client) -> Self {
        let source =
            Discovered { issuer: issuer.clone(), configured_jwks_uri: jwks_uri, http, discovered: Default::default() };
        Self::with_source(issuer, timing, Box::new(source))
    }

    /// Keys named `issuer` (in logs) from `source`.
    pub fn with_source(issuer: String, timing: JwksTiming, source: Box<dyn JwksSource>) -> Self {
        Self { issuer, timing, source, keys: RwLock::new(None), last_attempt: tokio::sync::Mutex::new(None) }
    }

    /// The key for a token with `kid` (or, without one, the issuer's only key for `alg`).
    pub async fn find(&self, kid: Option<&str>, alg: Algorithm) -> Result<VerifyingKey, AuthError> {
        if let Some(set) = self.current()
            && set.fetched.elapsed() < self.timing.ttl
            && let Some(found) = lookup(&set, kid, alg)?
        {
            return Ok(found);
        }
        let mut last_attempt = self.last_attempt.lock().await;
        // Someone else may have refreshed while this task waited for the lock.
        let current = self.current();
        let fresh = current.as_ref().is_some_and(|s| s.fetched.elapsed() < self.timing.ttl);
        if let Some(set) = &current
            && fresh
            && let Some(found) = lookup(set, kid, alg)?
        {
            return Ok(found);
        }
        let may_fetch = last_attempt.is_none_or(|t| t.elapsed() >= self.timing.min_refresh_interval);
        if may_fetch {
            *last_attempt = Some(Instant::now());
            match self.source.fetch().await.map(|set| usable_keys(&set)) {
                Ok(keys) => {
                    tracing::info!(issuer = %self.issuer, keys = keys.len(), "JWKS fetched");
                    let set = Arc::new(KeySet { keys, fetched: Instant::now() });
                    *self.keys.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(set);
                }
                Err(e) => {
                    tracing::warn!(issuer = %self.issuer, error = %e, "JWKS fetch failed; keeping cached keys");
                    if current.is_none() {
                        return Err(AuthError::new(
                            reason::UNAVAILABLE,
                            "the identity provider's keys are unavailable",
                        ));
                    }
                }
            }
        }
        drop(last_attempt);
        match self.current() {
            Some(set) => lookup(&set, kid, alg)?.ok_or_else(|| {
                AuthError::new(reason::UNKNOWN_KEY, "the token's signing key is not in the issuer's JWKS")
            }),
            None => Err(AuthError::new(reason::UNAVAILABLE, "the identity provider's keys are unavailable")),
        }
    }

    fn current(&self) -> Option<Arc<KeySet>> {
        self.keys.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

#[async_trait]
impl JwksSource for Discovered {
    async fn fetch(&self) -> Result<JwkSet, String> {
        let known = self.discovered.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        let jwks_uri = match (&self.configured_jwks_uri, known.as_ref()) {
            (Some(uri), _) | (None, Some(uri)) => uri.clone(),
            (None, None) => {
                let url = format!("{}/.well-known/openid-configuration", self.issuer.trim_end_matches('/'));
                let doc: Discovery = self.get_json(&url).await?;
                if doc.issuer != self.issuer {
                    return Err(format!(
                        "discovery document names issuer {:?}, expected {:?}",
                        doc.issuer, self.issuer
                    ));
                }
                check_url(&doc.jwks_uri).map_err(|e| format!("jwks_uri: {e}"))?;
                doc.jwks_uri
            }
        };
        let fetched = self.get_json(&jwks_uri).await;
        // Discover again after a failure (the jwks_uri may have moved); keep it otherwise.
        *self.discovered.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
            fetched.is_ok().then(|| jwks_uri.clone()).filter(|_| self.configured_jwks_uri.is_none());
        fetched
    }
}

impl Discovered {
    async fn get_json<T: serde::de::DeserializeOwned>(&self, url: &str) -> Result<T, String> {
        let mut resp = self
            .http
            .get(url)
            .header(reqwest::header::ACCEPT, "application/json")
            .send()
            .await
            .map_err(|e| format!("GET {url}: {e}"))?;
        if !resp.status().is_success() {
            return Err(format!("GET {url}: HTTP {}", resp.status()));
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| format!("GET {url}: {e}"))? {
            if body.len() + chunk.len() > MAX_DOCUMENT_BYTES {
                return Err(format!("GET {url}: document larger than {MAX_DOCUMENT_BYTES} bytes"));
            }
            body.extend_from_slice(&chunk);
        }
        serde_json::from_slice(&body).map_err(|e| format!("GET {url}: not the expected JSON: {e}"))
    }
}

/// The key for `kid`/`alg`; `Err` when the token's `alg` does not fit the key it names.
fn lookup(set: &KeySet, kid: Option<&str>, alg: Algorithm) -> Result<Option<VerifyingKey>, AuthError> {
    match kid {
        Some(kid) => match set.keys.iter().find(|k| k.kid.as_deref() == Some(kid)) {
            Some(k) if k.alg == alg => Ok(Some(k.clone())),
            Some(_) => Err(AuthError::new(reason::ALGORITHM, "the token's alg does not match its key")),
            None => Ok(None),
        },
        None => {
            let mut fitting = set.keys.iter().filter(|k| k.alg == alg);
            match (fitting.next(), fitting.next()) {
                (Some(k), None) => Ok(Some(k.clone())),
                _ => Ok(None),
            }
        }
    }
}

/// RS256/ES256 signature keys of a JWKS; others (encryption keys, HMAC, small RSA) are skipped.
fn usable_keys(set: &JwkSet) -> Vec<VerifyingKey> {
    set.keys
        .iter()
        .filter(|jwk| !matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)))
        .filter_map(|jwk| {
            let alg = key_algorithm(jwk)?;
            let key = DecodingKey::from_jwk(jwk).ok()?;
            Some(VerifyingKey { kid: jwk.common.key_id.clone(), alg, key })
        })
        .collect()
}

fn key_algorithm(jwk: &Jwk) -> Option<Algorithm> {
    let implied = match &jwk.algorithm {
        AlgorithmParameters::RSA(rsa) => {
            use base64::Engine;
            let n = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(rsa.n.trim_end_matches('=')).ok()?;
            let bits = n.iter().skip_while(|b| **b == 0).count() * 8;
            if bits < 2048 {
                return None;
            }
            Algorithm::RS256
        }
        AlgorithmParameters::EllipticCurve(ec) if ec.curve == EllipticCurve::P256 => Algorithm::ES256,
        _ => return None,
    };
    match jwk.common.key_algorithm {
        None => Some(implied),
        Some(KeyAlgorithm::RS256) if implied == Algorithm::RS256 => Some(implied),
        Some(KeyAlgorithm::ES256) if implied == Algorithm::ES256 => Some(implied),
        Some(_) => None,
    }
}

/// Issuer and JWKS URLs must be `https`, except on loopback (local development and tests).
pub fn check_url(url: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    match parsed.scheme() {
        "https" => Ok(()),
        "http" if is_loopback(&parsed) => Ok(()),
        _ => Err(format!("{url:?} must use https (plain http only for loopback addresses)")),
    }
}

fn is_loopback(url: &reqwest::Url) -> bool {
    let Some(host) = url.host_str() else { return false };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_https_or_loopback_http_urls_are_allowed() {
        assert!(check_url("https://idp.example.com").is_ok());
        assert!(check_url("http://127.0.0.1:8080/x").is_ok());
        assert!(check_url("http://localhost:8080").is_ok());
        assert!(check_url("http://idp.example.com").is_err());
        assert!(check_url("file:///etc/passwd").is_err());
        assert!(check_url("not a url").is_err());
    }

    #[test]
    fn hmac_and_encryption_keys_are_not_used() {
        let set: JwkSet = serde_json::from_value(serde_json::json!({"keys": [
            {"kty": "oct", "k": "c2VjcmV0", "kid": "h", "alg": "HS256"},
            {"kty": "EC", "crv": "P-256", "use": "enc", "kid": "e",
             "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU",
             "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"},
            {"kty": "EC", "crv": "P-256", "kid": "s",
             "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU",
             "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}
        ]}))
        .expect("jwks");
        let keys = usable_keys(&set);
        assert_eq!(keys.len(), 1);
        assert_eq!(keys[0].kid.as_deref(), Some("s"));
        assert_eq!(keys[0].alg, Algorithm::ES256);
    }
}

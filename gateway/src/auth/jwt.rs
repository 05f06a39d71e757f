//! OIDC / OAuth bearer JWTs from configured issuers.
//!
//! A token is this authenticator's when it is shaped like a JWT and its (unverified) `iss`
//! is a configured issuer; other tokens go to the next authenticator (Kubernetes
//! ServiceAccount tokens are JWTs too). Then: `alg` must be RS256 or ES256 (so `none` and
//! HMAC — including HS256 "signed" with a public key — are refused before any key is
//! touched), the key comes from the issuer's JWKS ([`super::jwks`]), and `iss`, `aud`,
//! `exp` and `nbf` are checked with a small clock skew. The user name, groups and scopes
//! come from configurable claims; the identity's issuer is the issuer URL.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, Validation};
use serde_json::{Map, Value};

use super::jwks::{IssuerKeys, JwksTiming, check_url};
use super::{AuthError, Authenticator, reason};
use crate::identity::Identity;

/// One trusted issuer.
#[derive(Clone, Debug)]
pub struct JwtIssuerConfig {
    /// The exact `iss` value (and discovery base URL).
    pub issuer: String,
    /// Accepted `aud` values (at least one).
    pub audiences: Vec<String>,
    /// JWKS URL; discovered from the issuer when `None`.
    pub jwks_uri: Option<String>,
    /// Claim holding the user name (`sub` by default). A dotted path reaches nested claims.
    pub username_claim: String,
    /// Claim holding the groups (`groups` by default): a list of strings or one string.
    pub groups_claim: String,
}

impl JwtIssuerConfig {
    /// An issuer with the default claims (`sub`, `groups`).
    pub fn new(issuer: impl Into<String>, audiences: Vec<String>) -> Self {
        Self {
            issuer: issuer.into(),
            audiences,
            jwks_uri: None,
            username_claim: "sub".into(),
            groups_claim: "groups".into(),
        }
    }
}

/// Settings shared by all issuers.
#[derive(Clone, Copy, Debug)]
pub struct JwtSettings {
    /// Tolerated clock difference for `exp` and `nbf`.
    pub clock_skew: Duration,
    /// JWKS cache timing.
    pub jwks: JwksTiming,
    /// Timeout of each discovery/JWKS request.
    pub http_timeout: Duration,
}

impl Default for JwtSettings {
    fn default() -> Self {
        Self {
            clock_skew: Duration::from_secs(30),
            jwks: JwksTiming { ttl: Duration::from_secs(300), min_refresh_interval: Duration::from_secs(10) },
            http_timeout: Duration::from_secs(10),
        }
    }
}

struct Issuer {
    config: JwtIssuerConfig,
    keys: IssuerKeys,
    validation: Validation,
}

/// Authenticates JWTs of the configured issuers.
pub struct JwtAuthenticator {
    issuers: HashMap<String, Issuer>,
}

impl std::fmt::Debug for JwtAuthenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtAuthenticator").field("issuers", &self.issuer_urls()).finish()
    }
}

impl JwtAuthenticator {
    /// Checks the configuration (https issuers, audiences present) and builds the HTTP client.
    /// Nothing is fetched until the first token of an issuer arrives.
    pub fn new(issuers: Vec<JwtIssuerConfig>, settings: JwtSettings) -> Result<Self, String> {
        let http = reqwest::Client::builder()
            .timeout(settings.http_timeout)
            .connect_timeout(settings.http_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("building the OIDC HTTP client: {e}"))?;
        let mut map = HashMap::new();
        for config in issuers {
            check_url(&config.issuer).map_err(|e| format!("OIDC issuer: {e}"))?;
            if let Some(uri) = &config.jwks_uri {
                check_url(uri).map_err(|e| format!("JWKS URI of {}: {e}", config.issuer))?;
            }
            if config.audiences.is_empty() || config.audiences.iter().any(String::is_empty) {
                return Err(format!("OIDC issuer {}: set at least one non-empty audience", config.issuer));
            }
            if config.username_claim.is_empty() || config.groups_claim.is_empty() {
                return Err(format!("OIDC issuer {}: claim names must not be empty", config.issuer));
            }
            let mut validation = Validation::new(Algorithm::RS256);
            validation.set_issuer(&[config.issuer.as_str()]);
            validation.set_audience(&config.audiences);
            validation.set_required_spec_claims(&["exp", "iss", "aud"]);
            validation.validate_nbf = true;
            validation.leeway = settings.clock_skew.as_secs();
            let keys = IssuerKeys::new(config.issuer.clone(), config.jwks_uri.clone(), settings.jwks, http.clone());
            if map.insert(config.issuer.clone(), Issuer { config, keys, validation }).is_some() {
                return Err("an OIDC issuer is configured twice".into());
            }
        }
        Ok(Self { issuers: map })
    }

    /// The configured issuer URLs (the `authorization_servers` of the resource metadata).
    pub fn issuer_urls(&self) -> Vec<String> {
        let mut urls: Vec<String> = self.issuers.keys().cloned().collect();
        urls.sort();
        urls
    }
}

/// The parts of a JWT read before verification.
struct Unverified {
    alg: String,
    kid: Option<String>,
    iss: String,
}

/// `Some` when `token` is shaped like a JWT with an `iss`.
fn peek(token: &str) -> Option<Unverified> {
    let mut parts = token.split('.');
    let (header, payload, _sig) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let decode = |s: &str| -> Option<Map<String, Value>> {
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(s).ok()?;
        serde_json::from_slice(&bytes).ok()
    };
    let header = decode(header)?;
    let payload = decode(payload)?;
    Some(Unverified {
        alg: header.get("alg")?.as_str()?.to_owned(),
        kid: header.get("kid").and_then(Value::as_str).map(str::to_owned),
        iss: payload.get("iss")?.as_str()?.to_owned(),
    })
}

#[async_trait]
impl Authenticator for JwtAuthenticator {
    async fn authenticate(&self, token: &str) -> Result<Option<Identity>, AuthError> {
        let Some(peeked) = peek(token) else { return Ok(None) };
        let Some(issuer) = self.issuers.get(&peeked.iss) else {
            tracing::debug!("JWT from an issuer that is not configured; trying the next authenticator");
            return Ok(None);
        };
        let alg = match peeked.alg.as_str() {
            "RS256" => Algorithm::RS256,
            "ES256" => Algorithm::ES256,
            _ => return Err(AuthError::new(reason::ALGORITHM, "the token's alg is not RS256 or ES256")),
        };
        let key = issuer.keys.find(peeked.kid.as_deref(), alg).await?;
        let mut validation = issuer.validation.clone();
        validation.algorithms = vec![alg];
        let data = jsonwebtoken::decode::<Map<String, Value>>(token, &key.key, &validation).map_err(map_error)?;
        identity(&issuer.config, &data.claims).map(Some)
    }
}

fn map_error(e: jsonwebtoken::errors::Error) -> AuthError {
    let (r, msg) = match e.kind() {
        ErrorKind::InvalidSignature => (reason::SIGNATURE, "signature does not verify".to_owned()),
        ErrorKind::ExpiredSignature => (reason::EXPIRED, "token expired".to_owned()),
        ErrorKind::ImmatureSignature => (reason::NOT_YET_VALID, "token not valid yet (nbf)".to_owned()),
        ErrorKind::InvalidAudience => (reason::AUDIENCE, "token is for another audience".to_owned()),
        ErrorKind::InvalidIssuer => (reason::ISSUER, "token is from another issuer".to_owned()),
        ErrorKind::InvalidAlgorithm | ErrorKind::InvalidAlgorithmName | ErrorKind::UnsupportedAlgorithm => {
            (reason::ALGORITHM, "the token's alg is not accepted".to_owned())
        }
        ErrorKind::MissingRequiredClaim(c) => (reason::CLAIMS, format!("claim {c} missing")),
        ErrorKind::InvalidClaimFormat(c) => (reason::CLAIMS, format!("claim {c} has the wrong type")),
        _ => (reason::INVALID, "token is not a valid JWT".to_owned()),
    };
    AuthError::new(r, msg)
}

/// A claim by name, or by dotted path into nested objects.
fn claim<'a>(claims: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    if let Some(v) = claims.get(name) {
        return Some(v);
    }
    let mut parts = name.split('.');
    let mut current = claims.get(parts.next()?)?;
    for part in parts {
        current = current.as_object()?.get(part)?;
    }
    Some(current)
}

fn string_list(value: Option<&Value>, split_spaces: bool) -> Option<Vec<String>> {
    match value {
        None | Some(Value::Null) => Some(Vec::new()),
        Some(Value::String(s)) if split_spaces => Some(s.split_whitespace().map(str::to_owned).collect()),
        Some(Value::String(s)) => Some(vec![s.clone()]),
        Some(Value::Array(items)) => items.iter().map(|v| v.as_str().map(str::to_owned)).collect(),
        Some(_) => None,
    }
}

fn identity(config: &JwtIssuerConfig, claims: &Map<String, Value>) -> Result<Identity, AuthError> {
    let user =
        claim(claims, &config.username_claim).and_then(Value::as_str).filter(|s| !s.is_empty()).ok_or_else(|| {
            AuthError::new(reason::CLAIMS, format!("claim {} missing or not a string", config.username_claim))
        })?;
    let groups = string_list(claim(claims, &config.groups_claim), false).ok_or_else(|| {
        AuthError::new(reason::CLAIMS, format!("claim {} is not a list of strings", config.groups_claim))
    })?;
    let scopes = match claims.get("scope") {
        Some(v) => string_list(Some(v), true),
        None => string_list(claims.get("scp"), true),
    }
    .ok_or_else(|| AuthError::new(reason::CLAIMS, "claim scope/scp is not a string or list of strings"))?;
    Ok(Identity { issuer: config.issuer.clone(), user: user.to_owned(), groups, scopes })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claims(v: Value) -> Map<String, Value> {
        v.as_object().expect("object").clone()
    }

    #[test]
    fn identity_reads_configured_and_nested_claims() {
        let mut config = JwtIssuerConfig::new("https://idp", vec!["toolyard".into()]);
        let c = claims(json!({"sub": "u1", "groups": ["a", "b"], "scope": "mcp:tools  read"}));
        let id = identity(&config, &c).expect("identity");
        assert_eq!((id.user.as_str(), id.issuer.as_str()), ("u1", "https://idp"));
        assert_eq!(id.groups, vec!["a", "b"]);
        assert_eq!(id.scopes, vec!["mcp:tools", "read"]);

        config.username_claim = "email".into();
        config.groups_claim = "realm_access.roles".into();
        let c = claims(json!({"email": "a@x", "realm_access": {"roles": ["r"]}, "scp": ["s1"]}));
        let id = identity(&config, &c).expect("identity");
        assert_eq!(
            (id.user.as_str(), id.groups.clone(), id.scopes.clone()),
            ("a@x", vec!["r".into()], vec!["s1".into()])
        );
    }

    #[test]
    fn identity_refuses_missing_user_and_bad_groups() {
        let config = JwtIssuerConfig::new("https://idp", vec!["toolyard".into()]);
        assert_eq!(identity(&config, &claims(json!({"groups": []}))).expect_err("no sub").reason, reason::CLAIMS);
        assert_eq!(identity(&config, &claims(json!({"sub": ""}))).expect_err("empty").reason, reason::CLAIMS);
        let bad_groups = claims(json!({"sub": "u", "groups": [1]}));
        assert_eq!(identity(&config, &bad_groups).expect_err("groups").reason, reason::CLAIMS);
    }

    #[test]
    fn peek_recognizes_only_jwt_shapes() {
        let enc = |v: Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
        let token = format!("{}.{}.sig", enc(json!({"alg": "none"})), enc(json!({"iss": "https://idp"})));
        let p = peek(&token).expect("jwt");
        assert_eq!((p.alg.as_str(), p.iss.as_str(), p.kid), ("none", "https://idp", None));
        assert!(peek("ty_abc").is_none());
        assert!(peek("a.b.c").is_none());
        assert!(peek(&format!("{token}.extra")).is_none());
    }

    #[test]
    fn configuration_is_checked() {
        let ok = JwtIssuerConfig::new("https://idp.example.com", vec!["toolyard".into()]);
        assert!(JwtAuthenticator::new(vec![ok.clone()], JwtSettings::default()).is_ok());
        let plain = JwtIssuerConfig::new("http://idp.example.com", vec!["toolyard".into()]);
        assert!(JwtAuthenticator::new(vec![plain], JwtSettings::default()).is_err());
        let no_aud = JwtIssuerConfig::new("https://idp.example.com", vec![]);
        assert!(JwtAuthenticator::new(vec![no_aud], JwtSettings::default()).is_err());
        assert!(JwtAuthenticator::new(vec![ok.clone(), ok], JwtSettings::default()).is_err());
    }
}

//! The axum middleware that authenticates every request to the MCP endpoints.
//!
//! `Authorization: Bearer <token>` goes through the [`AuthChain`]; on success the
//! [`Identity`] is inserted into the request extensions and the `Authorization` header is
//! removed (tokens are never passed on). Otherwise, per RFC 6750 and the MCP authorization
//! spec:
//! - no credentials: 401, `WWW-Authenticate: Bearer resource_metadata="<url>"`;
//! - a refused token: 401 with `error="invalid_token"` and a short `error_description`;
//! - a malformed `Authorization` header: 400 `error="invalid_request"`;
//! - a valid OAuth token lacking a required scope: 403 `error="insufficient_scope"`;
//! - an identity provider or apiserver that cannot be reached: 503 with `Retry-After`.

use std::sync::Arc;

use axum::extract::{OriginalUri, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::chain::AuthChain;
use super::metadata::{ProtectedResourceMetadata, resource_path};
use super::{AuthError, reason};
use crate::identity::Identity;

/// Everything [`require_identity`] needs; build once, share as `Arc`.
#[derive(Clone, Debug)]
pub struct AuthState {
    /// The authenticators.
    pub chain: AuthChain,
    /// For the `resource_metadata` URL of challenges.
    pub metadata: ProtectedResourceMetadata,
    /// OAuth scopes every token of a [`Self::scoped_issuers`] issuer must carry.
    pub required_scopes: Vec<String>,
    /// Issuers whose tokens carry OAuth scopes (the OIDC issuers). API keys, Kubernetes
    /// tokens and anonymous access have no scopes and are not subject to
    /// [`Self::required_scopes`]; their permissions come from authorization alone.
    pub scoped_issuers: Vec<String>,
}

impl AuthState {
    /// The scopes `identity` lacks (empty when none are required of it).
    pub fn missing_scopes(&self, identity: &Identity) -> Vec<String> {
        if !self.scoped_issuers.contains(&identity.issuer) {
            return Vec::new();
        }
        self.required_scopes.iter().filter(|s| !identity.scopes.contains(s)).cloned().collect()
    }
}

/// The bearer token of a request: `Ok(None)` without an `Authorization` header.
/// A non-Bearer scheme is `Err(missing)`; a broken header is `Err(malformed)`.
pub fn bearer_token(headers: &HeaderMap) -> Result<Option<&str>, AuthError> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let Some(value) = values.next() else { return Ok(None) };
    if values.next().is_some() {
        return Err(AuthError::new(reason::MALFORMED, "more than one Authorization header"));
    }
    let value =
        value.to_str().map_err(|_| AuthError::new(reason::MALFORMED, "Authorization header is not visible ASCII"))?;
    let (scheme, token) = value.split_once(' ').unwrap_or((value, ""));
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(AuthError::new(reason::MISSING, "only Bearer credentials are accepted"));
    }
    let token = token.trim();
    // RFC 6750 b64token: 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"="
    let body = token.trim_end_matches('=');
    if body.is_empty() || !body.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~+/".contains(&b)) {
        return Err(AuthError::new(reason::MALFORMED, "the bearer token is empty or has invalid characters"));
    }
    Ok(Some(token))
}

/// The middleware form of [`authenticate`], for routers that take a layer:
/// `axum::middleware::from_fn_with_state(Arc<AuthState>, require_identity)`.
pub async fn require_identity(State(state): State<Arc<AuthState>>, mut request: Request, next: Next) -> Response {
    match authenticate(&state, &mut request).await {
        Ok(identity) => {
            request.extensions_mut().insert(identity);
            next.run(request).await
        }
        Err(refusal) => refusal,
    }
}

/// Authenticates `request`: on success the caller's [`Identity`] (for the caller to put into
/// the request extensions, where the MCP service looks for it), with the `Authorization`
/// header removed from the request; otherwise the answer to send (see the module docs).
pub async fn authenticate(state: &AuthState, request: &mut Request) -> Result<Identity, Response> {
    // Built only for a refusal: an accepted request needs no challenge.
    let challenge = |request: &Request| {
        let path = request.extensions().get::<OriginalUri>().map_or_else(|| request.uri().path(), |u| u.0.path());
        Challenge::new(state, request.headers(), &resource_path(path))
    };
    let token = match bearer_token(request.headers()) {
        Ok(token) => token,
        Err(e) => {
            state.chain.metrics().failure(e.reason);
            tracing::info!(reason = e.reason, message = %e.message, "authentication refused");
            return Err(challenge(request).refuse(&e, true));
        }
    };
    let identity = match state.chain.authenticate(token).await {
        Ok(identity) => identity,
        Err(e) => return Err(challenge(request).refuse(&e, token.is_some())),
    };
    let missing = state.missing_scopes(&identity);
    if !missing.is_empty() {
        state.chain.metrics().failure(reason::INSUFFICIENT_SCOPE);
        tracing::info!(user = %identity.user, missing = ?missing, "insufficient scope");
        return Err(challenge(request).insufficient_scope());
    }
    request.headers_mut().remove(header::AUTHORIZATION);
    Ok(identity)
}

/// Builds the `WWW-Authenticate` challenges of one request.
struct Challenge {
    metadata_url: Option<String>,
    scope: String,
}

impl Challenge {
    fn new(state: &AuthState, headers: &HeaderMap, resource_path: &str) -> Self {
        Self {
            metadata_url: state.metadata.metadata_url(headers, resource_path),
            scope: state.required_scopes.join(" "),
        }
    }

    fn header(&self, error: Option<(&str, &str)>) -> HeaderValue {
        let mut params = Vec::new();
        if let Some(url) = &self.metadata_url {
            params.push(format!("resource_metadata=\"{}\"", quoted_safe(url)));
        }
        if !self.scope.is_empty() {
            params.push(format!("scope=\"{}\"", quoted_safe(&self.scope)));
        }
        if let Some((code, description)) = error {
            params.push(format!("error=\"{code}\""));
            params.push(format!("error_description=\"{}\"", quoted_safe(description)));
        }
        let value = if params.is_empty() { "Bearer".to_owned() } else { format!("Bearer {}", params.join(", ")) };
        HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static("Bearer"))
    }

    /// The answer to a refused request. `token_given`: a credential was presented, so the
    /// challenge carries an error code (RFC 6750 §3.1).
    fn refuse(&self, e: &AuthError, token_given: bool) -> Response {
        if e.is_unavailable() {
            let mut r = error_body(StatusCode::SERVICE_UNAVAILABLE, "temporarily_unavailable", &e.message);
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
            return r;
        }
        let (status, code) = match e.reason {
            reason::MALFORMED => (StatusCode::BAD_REQUEST, Some("invalid_request")),
            reason::MISSING => (StatusCode::UNAUTHORIZED, None),
            _ if token_given => (StatusCode::UNAUTHORIZED, Some("invalid_token")),
            _ => (StatusCode::UNAUTHORIZED, None),
        };
        let mut r = error_body(status, code.unwrap_or("unauthorized"), &e.message);
        r.headers_mut().insert(header::WWW_AUTHENTICATE, self.header(code.map(|c| (c, e.message.as_str()))));
        r
    }

    fn insufficient_scope(&self) -> Response {
        let description = "the token lacks a required scope";
        let mut r = error_body(StatusCode::FORBIDDEN, "insufficient_scope", description);
        r.headers_mut().insert(header::WWW_AUTHENTICATE, self.header(Some(("insufficient_scope", description))));
        r
    }
}

fn error_body(status: StatusCode, code: &str, description: &str) -> Response {
    (status, axum::Json(json!({"error": code, "error_description": description}))).into_response()
}

/// Keeps only characters RFC 6750 allows inside quoted parameters (no `"` or `\`).
fn quoted_safe(s: &str) -> String {
    s.chars().filter(|c| matches!(c, ' '..='~') && *c != '"' && *c != '\\').collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(header::AUTHORIZATION, HeaderValue::from_str(v).expect("header"));
        }
        h
    }

    #[test]
    fn bearer_tokens_are_extracted_and_bad_headers_refused() {
        assert_eq!(bearer_token(&headers(&[])), Ok(None));
        assert_eq!(bearer_token(&headers(&["Bearer abc.def-_~+/=="])), Ok(Some("abc.def-_~+/==")));
        assert_eq!(bearer_token(&headers(&["bearer ty_x"])), Ok(Some("ty_x")));
        let reason_of = |v: &[&str]| bearer_token(&headers(v)).expect_err("refused").reason;
        assert_eq!(reason_of(&["Basic dXNlcjpwdw=="]), reason::MISSING);
        assert_eq!(reason_of(&["Bearer "]), reason::MALFORMED);
        assert_eq!(reason_of(&["Bearer a\"b"]), reason::MALFORMED);
        assert_eq!(reason_of(&["Bearer a", "Bearer b"]), reason::MALFORMED);
    }

    #[test]
    fn scopes_are_required_only_of_oauth_issuers() {
        let state = AuthState {
            chain: AuthChain::default(),
            metadata: ProtectedResourceMetadata::default(),
            required_scopes: vec!["mcp".into()],
            scoped_issuers: vec!["https://idp".into()],
        };
        let mut id = Identity { issuer: "https://idp".into(), user: "u".into(), groups: vec![], scopes: vec![] };
        assert_eq!(state.missing_scopes(&id), vec!["mcp".to_owned()]);
        id.scopes.push("mcp".into());
        assert!(state.missing_scopes(&id).is_empty());
        id.issuer = "apikey".into();
        id.scopes.clear();
        assert!(state.missing_scopes(&id).is_empty());
    }

    #[test]
    fn challenge_parameters_cannot_be_broken_out_of() {
        assert_eq!(quoted_safe("a\"b\\c\nd"), "abcd");
    }
}

//! The local mode's own OAuth 2.1 authorization server, for MCP clients that sign in only
//! through OAuth (MCP Inspector, desktop assistants). The protected resource metadata names
//! the gateway itself as the authorization server, and these public routes serve it:
//! - `GET /.well-known/oauth-authorization-server`: its metadata (RFC 8414);
//! - `POST /oauth/register`: dynamic client registration (RFC 7591), public clients only;
//! - `GET /oauth/authorize`: a page asking the user for the local token;
//! - `POST /oauth/authorize`: checks the token and sends the browser back to the client with
//!   a one-time code;
//! - `POST /oauth/token`: that code and its PKCE verifier (S256 only) for an access token.
//!
//! Only someone holding the local token can allow a client, so a web page that opens the
//! authorize URL gets nothing. Access tokens (`tyo_…`) act as the local user; they live in
//! memory for [`ACCESS_TOKEN_LIFETIME`] or until the gateway stops, and only their SHA-256 is
//! kept. Registrations, codes and tokens are bounded in number (the oldest go first).
//! Documents are made only for the hosts the gateway serves, like the resource metadata.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::FormRejection;
use axum::extract::{Form, Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine;
use serde::Deserialize;
use serde_json::{Value, json};
use subtle::ConstantTimeEq;
use tower_http::cors::{Any, CorsLayer};

use crate::auth::apikey::random_token;
use crate::auth::{AuthError, Authenticator, ProtectedResourceMetadata, reason, sha256};
use crate::identity::Identity;

/// Path of the authorization server metadata.
pub const SERVER_METADATA: &str = "/.well-known/oauth-authorization-server";
/// Path of dynamic client registration.
pub const REGISTER: &str = "/oauth/register";
/// Path of the authorization endpoint (the sign-in page).
pub const AUTHORIZE: &str = "/oauth/authorize";
/// Path of the token endpoint.
pub const TOKEN: &str = "/oauth/token";

/// How long an access token works.
pub const ACCESS_TOKEN_LIFETIME: Duration = Duration::from_secs(24 * 3600);
/// How long a code waits for its exchange.
const CODE_LIFETIME: Duration = Duration::from_secs(60);
/// Prefix of the access tokens this server issues.
const ACCESS_TOKEN_PREFIX: &str = "tyo_";
/// At most this many registered clients, pending codes and live tokens.
const MAX_CLIENTS: usize = 256;
const MAX_CODES: usize = 64;
const MAX_TOKENS: usize = 1024;
/// Limits of one registration.
const MAX_REDIRECT_URIS: usize = 8;
const MAX_URI_LEN: usize = 2000;
const MAX_NAME_LEN: usize = 200;

/// The authorization server of one local gateway, and the authenticator of its tokens.
pub struct LocalAuthorization {
    /// Accepts the local token (the user's proof on the sign-in page).
    local_key: Arc<dyn Authenticator>,
    /// The local user's name, shown on the page.
    user: String,
    /// Which hosts documents are made for, and the base URL per request.
    metadata: ProtectedResourceMetadata,
    grants: Mutex<Grants>,
}

struct Grants {
    clients: Bounded<String, Client>,
    codes: Bounded<String, Code>,
    tokens: Bounded<[u8; 32], Identity>,
}

struct Client {
    name: Option<String>,
    redirect_uris: Vec<String>,
}

struct Code {
    client_id: String,
    redirect_uri: String,
    challenge: String,
    identity: Identity,
}

impl LocalAuthorization {
    /// A server whose sign-in page accepts what `local_key` accepts, for `user`.
    pub fn new(local_key: Arc<dyn Authenticator>, user: &str, metadata: ProtectedResourceMetadata) -> Arc<Self> {
        Arc::new(Self { local_key, user: user.to_owned(), metadata, grants: Mutex::default() })
    }

    fn grants(&self) -> std::sync::MutexGuard<'_, Grants> {
        self.grants.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Checks an authorization request: `Err(Refusal::Page)` when the client or its
    /// redirect URI cannot be trusted (nothing is sent there), `Err(Refusal::Redirect)` for
    /// the other faults, which go back to the client.
    fn check(&self, base: &str, p: &AuthorizeParams) -> Result<Checked, Refusal> {
        let client_id = p.client_id.as_deref().unwrap_or_default();
        let grants = self.grants();
        let Some(client) = grants.clients.get(client_id) else {
            return Err(Refusal::Page(format!(
                "unknown client_id {client_id:?}: the client must register at {REGISTER} first (its registration \
                 ends when the gateway stops)"
            )));
        };
        let redirect_uri = match (&p.redirect_uri, client.redirect_uris.as_slice()) {
            (Some(uri), registered) if registered.contains(uri) => uri.clone(),
            (Some(uri), _) => {
                return Err(Refusal::Page(format!("redirect_uri {uri:?} is not registered for this client")));
            }
            (None, [only]) => only.clone(),
            (None, _) => return Err(Refusal::Page("redirect_uri is required: the client registered several".into())),
        };
        let client_name = client.name.clone().unwrap_or_else(|| format!("Client {client_id}"));
        drop(grants);
        let back = |error: &'static str, description: String| Refusal::Redirect {
            redirect_uri: redirect_uri.clone(),
            error,
            description,
            state: p.state.clone(),
        };
        if p.response_type.as_deref() != Some("code") {
            return Err(back("unsupported_response_type", "response_type must be code".into()));
        }
        let challenge = p.code_challenge.as_deref().unwrap_or_default();
        if !(43..=128).contains(&challenge.len()) || !challenge.bytes().all(is_unreserved) {
            return Err(back("invalid_request", "a PKCE code_challenge (43 to 128 characters) is required".into()));
        }
        if p.code_challenge_method.as_deref() != Some("S256") {
            return Err(back("invalid_request", "code_challenge_method must be S256".into()));
        }
        if let Some(resource) = &p.resource
            && resource != base
            && !resource.starts_with(&format!("{base}/"))
        {
            return Err(back("invalid_target", format!("resource must be this gateway ({base}), not {resource:?}")));
        }
        Ok(Checked { client_name, redirect_uri, challenge: challenge.to_owned() })
    }
}

/// The local mode's access tokens (other tokens are left to the next authenticator).
#[async_trait]
impl Authenticator for LocalAuthorization {
    async fn authenticate(&self, token: &str) -> Result<Option<Identity>, AuthError> {
        if !token.starts_with(ACCESS_TOKEN_PREFIX) {
            return Ok(None);
        }
        match self.grants().tokens.get(&sha256(token.as_bytes())) {
            Some(identity) => Ok(Some(identity.clone())),
            None => Err(AuthError::new(reason::INVALID, "unknown or expired access token of the local mode")),
        }
    }
}

/// The routes of [`LocalAuthorization`] (public: merge outside the authentication
/// middleware). Browsers' MCP clients call the metadata, registration and token endpoints
/// from their own origin, so those answer CORS requests from any origin; they hand out
/// nothing without a code that only the local token's holder can obtain.
pub fn router(authorization: Arc<LocalAuthorization>) -> Router {
    let cors = CorsLayer::new().allow_origin(Any).allow_methods([Method::GET, Method::POST]).allow_headers([
        header::CONTENT_TYPE,
        header::AUTHORIZATION,
        header::HeaderName::from_static("mcp-protocol-version"),
    ]);
    let api = Router::new()
        .route(SERVER_METADATA, get(server_metadata))
        .route(REGISTER, post(register))
        .route(TOKEN, post(token))
        .layer(cors);
    Router::new().route(AUTHORIZE, get(authorize_page).post(authorize)).merge(api).with_state(authorization)
}

async fn server_metadata(State(a): State<Arc<LocalAuthorization>>, headers: HeaderMap) -> Response {
    let Some(base) = a.metadata.base_url(&headers) else { return bad_host() };
    json_response(
        StatusCode::OK,
        &json!({
            "issuer": base,
            "authorization_endpoint": format!("{base}{AUTHORIZE}"),
            "token_endpoint": format!("{base}{TOKEN}"),
            "registration_endpoint": format!("{base}{REGISTER}"),
            "response_types_supported": ["code"],
            "grant_types_supported": ["authorization_code"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["none"],
            "authorization_response_iss_parameter_supported": true,
        }),
    )
}

/// Dynamic client registration: any client may register (the user still has to allow it);
/// it gets no secret and authenticates at the token endpoint with its PKCE verifier.
async fn register(State(a): State<Arc<LocalAuthorization>>, headers: HeaderMap, body: Bytes) -> Response {
    if a.metadata.base_url(&headers).is_none() {
        return bad_host();
    }
    let metadata: Value = match serde_json::from_slice(&body) {
        Ok(Value::Object(m)) => Value::Object(m),
        _ => return oauth_error(StatusCode::BAD_REQUEST, "invalid_client_metadata", "the body must be a JSON object"),
    };
    let client = match client_from(&metadata) {
        Ok(client) => client,
        Err(e) => return oauth_error(StatusCode::BAD_REQUEST, e.0, &e.1),
    };
    let client_id = random_token("tyc_");
    let mut answer = json!({
        "client_id": client_id,
        "client_id_issued_at": jiff::Timestamp::now().as_second(),
        "redirect_uris": client.redirect_uris,
        "grant_types": ["authorization_code"],
        "response_types": ["code"],
        "token_endpoint_auth_method": "none",
    });
    if let Some(name) = &client.name {
        answer["client_name"] = json!(name);
    }
    // Registrations last as long as the gateway: a client registered before a restart
    // registers again (the SDKs do so when the server no longer knows their client_id).
    a.grants().clients.insert(client_id, client, Duration::MAX);
    json_response(StatusCode::CREATED, &answer)
}

/// What a registration asks for, checked: `Err((error code, description))`.
fn client_from(metadata: &Value) -> Result<Client, (&'static str, String)> {
    let Some(uris) = metadata.get("redirect_uris").and_then(Value::as_array).filter(|u| !u.is_empty()) else {
        return Err(("invalid_redirect_uri", "redirect_uris (a non-empty list) is required".into()));
    };
    if uris.len() > MAX_REDIRECT_URIS {
        return Err(("invalid_redirect_uri", format!("at most {MAX_REDIRECT_URIS} redirect_uris")));
    }
    let mut redirect_uris = Vec::new();
    for uri in uris {
        let Some(uri) = uri.as_str() else {
            return Err(("invalid_redirect_uri", "redirect_uris must be strings".into()));
        };
        check_redirect_uri(uri).map_err(|e| ("invalid_redirect_uri", e))?;
        redirect_uris.push(uri.to_owned());
    }
    if let Some(grants) = metadata.get("grant_types").and_then(Value::as_array)
        && !grants.iter().any(|g| g == "authorization_code")
    {
        return Err(("invalid_client_metadata", "this server grants authorization_code only".into()));
    }
    let name = match metadata.get("client_name") {
        None | Some(Value::Null) => None,
        Some(Value::String(name)) if name.chars().count() <= MAX_NAME_LEN => Some(name.clone()),
        Some(_) => {
            return Err((
                "invalid_client_metadata",
                format!("client_name: a string of at most {MAX_NAME_LEN} characters"),
            ));
        }
    };
    Ok(Client { name, redirect_uris })
}

/// A redirect URI a code may be sent to: HTTPS, HTTP to this machine (loopback), or an
/// app's private-use scheme (`com.example.app:/cb`, RFC 8252); never with a fragment.
fn check_redirect_uri(uri: &str) -> Result<(), String> {
    if uri.len() > MAX_URI_LEN {
        return Err(format!("a redirect URI has at most {MAX_URI_LEN} characters"));
    }
    let parsed = reqwest::Url::parse(uri).map_err(|e| format!("redirect URI {uri:?}: {e}"))?;
    if parsed.fragment().is_some() {
        return Err(format!("redirect URI {uri:?} must not have a fragment"));
    }
    let loopback = match parsed.host_str() {
        Some("localhost") => true,
        Some(host) => {
            host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
        }
        None => false,
    };
    match parsed.scheme() {
        "https" if parsed.host().is_some() => Ok(()),
        "http" if loopback => Ok(()),
        "http" => Err(format!("redirect URI {uri:?}: plain http only to this machine (localhost, 127.0.0.1, [::1])")),
        scheme if scheme.contains('.') => Ok(()),
        _ => Err(format!("redirect URI {uri:?}: use https, http to localhost, or an app's reverse-domain scheme")),
    }
}

/// The parameters of an authorization request (query of the GET, fields of the POST).
#[derive(Clone, Debug, Default, Deserialize)]
struct AuthorizeParams {
    response_type: Option<String>,
    client_id: Option<String>,
    redirect_uri: Option<String>,
    code_challenge: Option<String>,
    code_challenge_method: Option<String>,
    state: Option<String>,
    resource: Option<String>,
    scope: Option<String>,
}

/// The sign-in form: the request again, the user's token and their decision.
#[derive(Debug, Deserialize)]
struct ConsentForm {
    #[serde(flatten)]
    request: AuthorizeParams,
    token: Option<String>,
    decision: Option<String>,
}

/// An authorization request that may go ahead.
struct Checked {
    client_name: String,
    redirect_uri: String,
    challenge: String,
}

enum Refusal {
    /// Shown to the user; nothing goes to the client.
    Page(String),
    /// Sent back to the client's redirect URI (RFC 6749 4.1.2.1).
    Redirect { redirect_uri: String, error: &'static str, description: String, state: Option<String> },
}

impl Refusal {
    fn respond(self, base: &str) -> Response {
        match self {
            Refusal::Page(message) => page(StatusCode::BAD_REQUEST, error_page(&message)),
            Refusal::Redirect { redirect_uri, error, description, state } => redirect_back(
                &redirect_uri,
                &[("error", error), ("error_description", &description)],
                state.as_deref(),
                base,
            ),
        }
    }
}

async fn authorize_page(
    State(a): State<Arc<LocalAuthorization>>,
    headers: HeaderMap,
    params: Result<Query<AuthorizeParams>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Some(base) = a.metadata.base_url(&headers) else { return bad_host() };
    let Ok(Query(params)) = params else {
        return page(StatusCode::BAD_REQUEST, error_page("the authorization request's parameters cannot be read"));
    };
    match a.check(&base, &params) {
        Ok(checked) => page(StatusCode::OK, sign_in_page(&a.user, &checked, &params, None)),
        Err(refusal) => refusal.respond(&base),
    }
}

async fn authorize(
    State(a): State<Arc<LocalAuthorization>>,
    headers: HeaderMap,
    form: Result<Form<ConsentForm>, FormRejection>,
) -> Response {
    let Some(base) = a.metadata.base_url(&headers) else { return bad_host() };
    let Ok(Form(form)) = form else {
        return page(StatusCode::BAD_REQUEST, error_page("the sign-in form cannot be read"));
    };
    let checked = match a.check(&base, &form.request) {
        Ok(checked) => checked,
        Err(refusal) => return refusal.respond(&base),
    };
    let state = form.request.state.as_deref();
    if form.decision.as_deref() != Some("allow") {
        let denied = [("error", "access_denied"), ("error_description", "the user did not allow the client")];
        return redirect_back(&checked.redirect_uri, &denied, state, &base);
    }
    let token = form.token.as_deref().map(str::trim).unwrap_or_default();
    let identity = match a.local_key.authenticate(token).await {
        Ok(Some(identity)) if !token.is_empty() => identity,
        _ => {
            tracing::info!(client = %checked.client_name, "local sign-in refused: not the local token");
            let retry = sign_in_page(&a.user, &checked, &form.request, Some("That is not the local token."));
            return page(StatusCode::FORBIDDEN, retry);
        }
    };
    let code = random_token("");
    let client_id = form.request.client_id.clone().unwrap_or_default();
    let grant = Code { client_id, redirect_uri: checked.redirect_uri.clone(), challenge: checked.challenge, identity };
    a.grants().codes.insert(code.clone(), grant, CODE_LIFETIME);
    tracing::info!(client = %checked.client_name, "local sign-in: a client was allowed");
    redirect_back(&checked.redirect_uri, &[("code", &code)], state, &base)
}

#[derive(Debug, Deserialize)]
struct TokenParams {
    grant_type: Option<String>,
    code: Option<String>,
    redirect_uri: Option<String>,
    client_id: Option<String>,
    code_verifier: Option<String>,
}

/// The code exchange. A code works once: it is taken before it is checked, so a failed
/// attempt uses it up too.
async fn token(
    State(a): State<Arc<LocalAuthorization>>,
    headers: HeaderMap,
    form: Result<Form<TokenParams>, FormRejection>,
) -> Response {
    if a.metadata.base_url(&headers).is_none() {
        return bad_host();
    }
    let Ok(Form(p)) = form else {
        return oauth_error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "send application/x-www-form-urlencoded fields",
        );
    };
    if p.grant_type.as_deref() != Some("authorization_code") {
        return oauth_error(StatusCode::BAD_REQUEST, "unsupported_grant_type", "grant_type must be authorization_code");
    }
    let (Some(code), Some(verifier)) = (p.code.as_deref(), p.code_verifier.as_deref()) else {
        return oauth_error(StatusCode::BAD_REQUEST, "invalid_request", "code and code_verifier are required");
    };
    let Some(grant) = a.grants().codes.take(code) else {
        return oauth_error(StatusCode::BAD_REQUEST, "invalid_grant", "unknown, used or expired code");
    };
    if p.client_id.as_deref() != Some(grant.client_id.as_str()) {
        return oauth_error(StatusCode::BAD_REQUEST, "invalid_grant", "the code was issued to another client_id");
    }
    if p.redirect_uri.as_deref().is_some_and(|uri| uri != grant.redirect_uri) {
        return oauth_error(StatusCode::BAD_REQUEST, "invalid_grant", "redirect_uri differs from the authorization's");
    }
    let computed = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sha256(verifier.as_bytes()));
    if !bool::from(computed.as_bytes().ct_eq(grant.challenge.as_bytes())) {
        return oauth_error(
            StatusCode::BAD_REQUEST,
            "invalid_grant",
            "code_verifier does not match the code_challenge",
        );
    }
    let access_token = random_token(ACCESS_TOKEN_PREFIX);
    a.grants().tokens.insert(sha256(access_token.as_bytes()), grant.identity, ACCESS_TOKEN_LIFETIME);
    json_response(
        StatusCode::OK,
        &json!({
            "access_token": access_token,
            "token_type": "Bearer",
            "expires_in": ACCESS_TOKEN_LIFETIME.as_secs(),
        }),
    )
}

/// A 303 to `redirect_uri` with `params`, the client's `state` and the issuer (RFC 9207).
fn redirect_back(redirect_uri: &str, params: &[(&str, &str)], state: Option<&str>, issuer: &str) -> Response {
    // Registered URIs were parsed at registration.
    let Ok(mut url) = reqwest::Url::parse(redirect_uri) else {
        return page(StatusCode::BAD_REQUEST, error_page("the redirect URI cannot be used"));
    };
    {
        let mut query = url.query_pairs_mut();
        for (name, value) in params {
            query.append_pair(name, value);
        }
        if let Some(state) = state {
            query.append_pair("state", state);
        }
        query.append_pair("iss", issuer);
    }
    let mut response = StatusCode::SEE_OTHER.into_response();
    if let Ok(location) = HeaderValue::from_str(url.as_str()) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

fn sign_in_page(user: &str, checked: &Checked, request: &AuthorizeParams, error: Option<&str>) -> String {
    let target = reqwest::Url::parse(&checked.redirect_uri)
        .map(|u| u.origin().ascii_serialization())
        .ok()
        .filter(|o| o != "null")
        .unwrap_or_else(|| checked.redirect_uri.clone());
    let mut hidden = String::new();
    let fields = [
        ("response_type", &request.response_type),
        ("client_id", &request.client_id),
        ("redirect_uri", &Some(checked.redirect_uri.clone())),
        ("code_challenge", &request.code_challenge),
        ("code_challenge_method", &request.code_challenge_method),
        ("state", &request.state),
        ("resource", &request.resource),
        ("scope", &request.scope),
    ];
    for (name, value) in fields {
        if let Some(value) = value {
            hidden.push_str(&format!("<input type=\"hidden\" name=\"{name}\" value=\"{}\">\n", escape(value)));
        }
    }
    let error = error.map(|e| format!("<p class=\"error\">{}</p>\n", escape(e))).unwrap_or_default();
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Allow {client} — Toolyard (local)</title>\n\
         <style>{STYLE}</style></head><body><main>\n<h1>Toolyard (local)</h1>\n\
         <p><b>{client}</b> asks to call your tools as <b>{user}</b>. If you allow it, your browser goes back to \
         <code>{target}</code> with a sign-in code.</p>\n{error}\
         <form method=\"post\" action=\"{AUTHORIZE}\">\n{hidden}\
         <label for=\"token\">The local token (printed by <code>toolyard-gateway local</code> at start, or in its \
         <code>--token-file</code>)</label>\n\
         <input id=\"token\" type=\"password\" name=\"token\" autocomplete=\"off\" autofocus>\n\
         <p><button name=\"decision\" value=\"allow\">Allow</button> \
         <button name=\"decision\" value=\"deny\">Deny</button></p>\n</form></main></body></html>\n",
        client = escape(&checked.client_name),
        user = escape(user),
        target = escape(&target),
    )
}

fn error_page(message: &str) -> String {
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Toolyard (local)</title>\
         <style>{STYLE}</style></head><body><main><h1>Toolyard (local)</h1>\
         <p class=\"error\">This sign-in request cannot go ahead: {}</p></main></body></html>\n",
        escape(message)
    )
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:3em auto;max-width:36em;padding:0 1em}\
    .error{color:#a00}input{display:block;width:100%;margin:.5em 0;padding:.4em}button{padding:.4em 1.2em}";

/// An HTML page that no other site may frame (no clickjacking of the Allow button), runs no
/// script, and is never cached.
fn page(status: StatusCode, html: String) -> Response {
    let mut response = (status, html).into_response();
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    let mut response = (status, axum::Json(body)).into_response();
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

fn oauth_error(status: StatusCode, error: &str, description: &str) -> Response {
    json_response(status, &json!({"error": error, "error_description": description}))
}

fn bad_host() -> Response {
    (StatusCode::BAD_REQUEST, "missing, invalid or not allowed Host header").into_response()
}

/// Text for HTML text and double-quoted attributes.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// RFC 3986 unreserved characters (a PKCE challenge's alphabet).
fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~".contains(&b)
}

/// A map of at most `cap` entries that expire: inserting into a full map drops the oldest.
struct Bounded<K, V> {
    cap: usize,
    entries: HashMap<K, Entry<V>>,
}

struct Entry<V> {
    inserted: Instant,
    /// `None`: never.
    expires: Option<Instant>,
    value: V,
}

impl<V> Entry<V> {
    fn live(self) -> Option<V> {
        self.expires.is_none_or(|e| e > Instant::now()).then_some(self.value)
    }
}

impl<K: Eq + Hash + Clone, V> Bounded<K, V> {
    fn with_cap(cap: usize) -> Self {
        Self { cap, entries: HashMap::new() }
    }

    /// Keeps `value` for `lifetime` (`Duration::MAX`: as long as the map).
    fn insert(&mut self, key: K, value: V, lifetime: Duration) {
        let now = Instant::now();
        self.entries.retain(|_, entry| entry.expires.is_none_or(|e| e > now));
        if self.entries.len() >= self.cap
            && let Some(oldest) = self.entries.iter().min_by_key(|(_, entry)| entry.inserted).map(|(k, _)| k.clone())
        {
            self.entries.remove(&oldest);
        }
        self.entries.insert(key, Entry { inserted: now, expires: now.checked_add(lifetime), value });
    }

    fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: std::borrow::Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        let entry = self.entries.get(key)?;
        entry.expires.is_none_or(|e| e > Instant::now()).then_some(&entry.value)
    }

    fn take<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: std::borrow::Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        self.entries.remove(key)?.live()
    }
}

impl Default for Grants {
    fn default() -> Self {
        Self {
            clients: Bounded::with_cap(MAX_CLIENTS),
            codes: Bounded::with_cap(MAX_CODES),
            tokens: Bounded::with_cap(MAX_TOKENS),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirect_uris_go_only_to_https_this_machine_or_an_app() {
        for good in [
            "https://claude.ai/api/mcp/auth_callback",
            "http://127.0.0.1:6276/oauth/callback",
            "http://localhost:6274/oauth/callback",
            "http://[::1]:9/cb",
            "com.example.app:/oauth",
        ] {
            assert!(check_redirect_uri(good).is_ok(), "{good}");
        }
        for bad in [
            "http://attacker.example/cb",
            "http://127.0.0.1.attacker.example/cb",
            "javascript:alert(1)",
            "data:text/html,x",
            "file:///etc/passwd",
            "https://app.example/cb#frag",
            "not a url",
            "/relative/cb",
        ] {
            assert!(check_redirect_uri(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn bounded_maps_expire_and_drop_the_oldest_when_full() {
        let mut map = Bounded::with_cap(2);
        map.insert("a", 1, Duration::MAX);
        map.insert("b", 2, Duration::MAX);
        map.insert("c", 3, Duration::from_secs(20));
        assert_eq!(map.get("a"), None, "the oldest went");
        assert_eq!(map.get("b"), Some(&2));
        assert_eq!(map.take("c"), Some(3));
        assert_eq!(map.take("c"), None, "taken once");
        map.insert("d", 4, Duration::ZERO);
        assert_eq!(map.get("d"), None, "expired");
    }

    #[test]
    fn page_text_is_escaped() {
        assert_eq!(escape("<a href=\"x\">&'"), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;");
    }
}

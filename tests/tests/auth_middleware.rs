//! The authentication middleware and the protected resource metadata, driven in-process
//! (tower `oneshot`) with a real key file and a real local OIDC provider: 401 challenges
//! pointing at the metadata, RFC 6750 error codes, 403 for a missing scope, 503 when the
//! identity provider cannot be reached, the identity reaching the handler and the token not.

use crate::auth_support;

use std::sync::Arc;

use auth_support::{Idp, SigningKey, now};
use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode, header};
use axum::routing::{get, post};
use clap::Parser;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use toolyard_gateway::Identity;
use toolyard_gateway::auth::config::AuthContext;
use toolyard_gateway::auth::{AuthArgs, AuthMetrics, AuthState, metadata_router, reason, require_identity};
use tower::ServiceExt;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    auth: AuthArgs,
}

/// The handler behind the middleware: reports who called, and whether a token leaked through.
async fn whoami(request: Request) -> String {
    if request.headers().contains_key(header::AUTHORIZATION) {
        return "token passed on!".into();
    }
    let id = request.extensions().get::<Identity>().expect("identity inserted");
    format!("{} {}", id.issuer, id.user)
}

struct Gateway {
    app: Router,
    state: Arc<AuthState>,
    alice_key: String,
    idp: Idp,
    key: SigningKey,
}

async fn gateway(public_url: Option<&str>, extra: &[&str]) -> Gateway {
    let idp = Idp::start().await;
    let key = SigningKey::ec("k1");
    idp.set_keys(&[&key]);
    let dir = auth_support::temp_dir("mw");
    let (alice_key, alice_hash) = toolyard_gateway::auth::apikey::generate_api_key();
    let keys = dir.join("keys.yaml");
    std::fs::write(&keys, format!("keys:\n  - user: alice\n    sha256: {alice_hash}\n")).expect("write");
    let keys_arg = keys.to_string_lossy().into_owned();
    let mut argv = vec![
        "gw",
        "--api-keys-file",
        &keys_arg,
        "--oidc-issuer",
        &idp.issuer,
        "--oidc-audience",
        "toolyard",
        "--required-scope",
        "mcp:tools",
        "--supported-scope",
        "profile",
    ];
    argv.extend_from_slice(extra);
    let ctx = AuthContext {
        kube: None,
        namespace: "toolyard".into(),
        public_url: public_url.map(str::to_owned),
        default_scheme: "https".into(),
        allowed_hosts: Vec::new(),
        metrics: AuthMetrics::default(),
        shutdown: CancellationToken::new(),
    };
    let setup = Cli::parse_from(argv).auth.build(ctx).await.expect("auth setup");
    let app = Router::new()
        .route("/mcp", post(whoami).get(whoami))
        .route("/toolsets/{toolset}/mcp", post(whoami))
        .layer(axum::middleware::from_fn_with_state(setup.state.clone(), require_identity))
        .merge(metadata_router(setup.metadata.clone()));
    Gateway { app, state: setup.state, alice_key, idp, key }
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Answer {
    fn challenge(&self) -> &str {
        self.headers.get(header::WWW_AUTHENTICATE).and_then(|v| v.to_str().ok()).unwrap_or("")
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).expect("JSON body")
    }
}

async fn send(app: &Router, method: &str, path: &str, auth: &[&str]) -> Answer {
    let mut request = Request::builder().method(method).uri(path).header(header::HOST, "localhost:8443");
    for value in auth {
        request = request.header(header::AUTHORIZATION, *value);
    }
    let response = app.clone().oneshot(request.body(Body::empty()).expect("request")).await.expect("response");
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.expect("body");
    Answer { status, headers, body: String::from_utf8_lossy(&bytes).into_owned() }
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

#[tokio::test]
async fn a_request_without_credentials_gets_a_challenge_pointing_at_the_metadata() {
    let gw = gateway(Some("https://gw.example.com"), &[]).await;
    let a = send(&gw.app, "POST", "/mcp", &[]).await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        a.challenge(),
        "Bearer resource_metadata=\"https://gw.example.com/.well-known/oauth-protected-resource/mcp\", scope=\"mcp:tools\""
    );
    let a = send(&gw.app, "POST", "/toolsets/pricing/mcp", &[]).await;
    assert!(
        a.challenge().contains(
            "resource_metadata=\"https://gw.example.com/.well-known/oauth-protected-resource/toolsets/pricing/mcp\""
        ),
        "{}",
        a.challenge()
    );
    assert!(!a.challenge().contains("error="), "no error code without a token (RFC 6750 3.1)");
    // Other schemes are not credentials here: same challenge.
    let a = send(&gw.app, "POST", "/mcp", &["Basic YWxpY2U6cHc="]).await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    assert!(!a.challenge().contains("error="));
    assert_eq!(gw.state.chain.metrics().failures_for(reason::MISSING), 3);
}

#[tokio::test]
async fn refused_tokens_get_invalid_token_and_broken_headers_invalid_request() {
    let gw = gateway(Some("https://gw.example.com"), &[]).await;
    let (wrong, _) = toolyard_gateway::auth::apikey::generate_api_key();
    let a = send(&gw.app, "POST", "/mcp", &[&bearer(&wrong)]).await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    assert!(a.challenge().contains("error=\"invalid_token\""), "{}", a.challenge());
    assert!(a.challenge().contains("error_description=\"unknown API key\""), "{}", a.challenge());
    assert!(a.challenge().contains("resource_metadata="), "{}", a.challenge());
    assert_eq!(a.json()["error"], "invalid_token");
    assert!(!a.body.contains(&wrong), "the token is not echoed");

    let mut claims = gw.idp.claims("alice", "toolyard");
    claims["exp"] = (now() - 600).into();
    let a = send(&gw.app, "POST", "/mcp", &[&bearer(&gw.key.sign(&claims))]).await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    assert!(a.challenge().contains("error_description=\"token expired\""), "{}", a.challenge());

    let a = send(&gw.app, "POST", "/mcp", &[&bearer("a"), &bearer("b")]).await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    assert!(a.challenge().contains("error=\"invalid_request\""));
    let a = send(&gw.app, "POST", "/mcp", &["Bearer"]).await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);

    let m = gw.state.chain.metrics();
    assert_eq!((m.failures_for(reason::INVALID), m.failures_for(reason::EXPIRED)), (1, 1));
    assert_eq!(m.failures_for(reason::MALFORMED), 2);
}

#[tokio::test]
async fn accepted_credentials_reach_the_handler_as_an_identity_without_the_token() {
    let gw = gateway(Some("https://gw.example.com"), &[]).await;
    let a = send(&gw.app, "POST", "/mcp", &[&bearer(&gw.alice_key)]).await;
    assert_eq!((a.status, a.body.as_str()), (StatusCode::OK, "apikey alice"));

    let token = gw.key.sign(&gw.idp.claims("carol", "toolyard"));
    let a = send(&gw.app, "POST", "/toolsets/pricing/mcp", &[&bearer(&token)]).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.body, format!("{} carol", gw.idp.issuer));
}

#[tokio::test]
async fn an_oauth_token_without_the_required_scope_gets_403_insufficient_scope() {
    let gw = gateway(Some("https://gw.example.com"), &[]).await;
    let mut claims = gw.idp.claims("carol", "toolyard");
    claims["scope"] = "profile".into();
    let a = send(&gw.app, "POST", "/mcp", &[&bearer(&gw.key.sign(&claims))]).await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    let c = a.challenge();
    assert!(c.contains("error=\"insufficient_scope\"") && c.contains("scope=\"mcp:tools\""), "{c}");
    assert!(c.contains("resource_metadata=\"https://gw.example.com/.well-known/oauth-protected-resource/mcp\""), "{c}");
    assert_eq!(gw.state.chain.metrics().failures_for(reason::INSUFFICIENT_SCOPE), 1);

    // API keys carry no scopes and are not subject to them.
    let a = send(&gw.app, "POST", "/mcp", &[&bearer(&gw.alice_key)]).await;
    assert_eq!(a.status, StatusCode::OK);
}

#[tokio::test]
async fn metadata_documents_describe_the_gateway_and_each_endpoint() {
    let gw = gateway(Some("https://gw.example.com"), &[]).await;
    for (path, resource) in [
        ("/.well-known/oauth-protected-resource", "https://gw.example.com"),
        ("/.well-known/oauth-protected-resource/mcp", "https://gw.example.com/mcp"),
        ("/.well-known/oauth-protected-resource/toolsets/pricing/mcp", "https://gw.example.com/toolsets/pricing/mcp"),
    ] {
        let a = send(&gw.app, "GET", path, &[]).await;
        assert_eq!(a.status, StatusCode::OK, "{path}");
        let doc = a.json();
        assert_eq!(doc["resource"], resource);
        assert_eq!(doc["authorization_servers"], serde_json::json!([gw.idp.issuer]));
        assert_eq!(doc["scopes_supported"], serde_json::json!(["mcp:tools", "profile"]));
        assert_eq!(doc["bearer_methods_supported"], serde_json::json!(["header"]));
        assert_eq!(a.headers.get(header::ACCESS_CONTROL_ALLOW_ORIGIN).map(|v| v.as_bytes()), Some(&b"*"[..]));
    }
    let a = send(&gw.app, "GET", "/.well-known/oauth-protected-resource/toolsets/Not_A_Label/mcp", &[]).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn without_a_public_url_the_host_header_builds_the_urls() {
    let gw = gateway(None, &[]).await;
    let a = send(&gw.app, "POST", "/mcp", &[]).await;
    assert!(
        a.challenge().contains("resource_metadata=\"https://localhost:8443/.well-known/oauth-protected-resource/mcp\""),
        "{}",
        a.challenge()
    );
    let a = send(&gw.app, "GET", "/.well-known/oauth-protected-resource/mcp", &[]).await;
    assert_eq!(a.json()["resource"], "https://localhost:8443/mcp");
}

#[tokio::test]
async fn anonymous_access_lets_only_credential_free_requests_in() {
    let gw = gateway(Some("https://gw.example.com"), &["--anonymous", "--anonymous-user", "guest"]).await;
    let a = send(&gw.app, "POST", "/mcp", &[]).await;
    assert_eq!((a.status, a.body.as_str()), (StatusCode::OK, "anonymous guest"));
    let a = send(&gw.app, "POST", "/mcp", &[&bearer("ty_not-a-key")]).await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED, "a bad token is not downgraded to anonymous");
}

#[tokio::test]
async fn an_unreachable_identity_provider_answers_503_with_retry_after() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let dead_issuer = format!("http://{}", listener.local_addr().expect("addr"));
    drop(listener);
    let gw = gateway(Some("https://gw.example.com"), &["--oidc-issuer", &dead_issuer]).await;
    let key = SigningKey::ec("k");
    let claims =
        serde_json::json!({"iss": dead_issuer, "aud": "toolyard", "sub": "x", "exp": now() + 60, "scope": "mcp:tools"});
    let a = send(&gw.app, "POST", "/mcp", &[&bearer(&key.sign(&claims))]).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(a.headers.contains_key(header::RETRY_AFTER));
    assert_eq!(gw.state.chain.metrics().failures_for(reason::UNAVAILABLE), 1);
}

#[tokio::test]
async fn unprotected_routes_are_left_alone() {
    let gw = gateway(Some("https://gw.example.com"), &[]).await;
    let app = gw.app.clone().route("/healthz", get(|| async { "ok" }));
    let a = send(&app, "GET", "/healthz", &[]).await;
    assert_eq!((a.status, a.body.as_str()), (StatusCode::OK, "ok"));
}

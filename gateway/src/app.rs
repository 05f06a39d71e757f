//! The public HTTP router: MCP endpoints behind authentication and admission limits, plus
//! the ops endpoints.
//!
//! ```text
//! /mcp                       all tools the caller may call
//! /toolsets/{toolset}/mcp    the tools of one toolset
//! /search/mcp                `tool_search` and `call_tool` over every tool the caller may call
//! /status                    what the caller's requests meet (authenticated; `toolyard check`)
//! /healthz /readyz /metrics  ops (no authentication; /metrics only when configured)
//! ```
//!
//! An MCP request passes, in order: shutdown refusal and the global HTTP limit (503 +
//! `Retry-After`), the declared body size (413), authentication ([`auth::authenticate`]: the
//! caller's [`Identity`](crate::identity::Identity), or an answer 400/401/403/503), the
//! per-user HTTP limit (429 + `Retry-After`), the body of a POST (read under the server's body
//! deadline: 408 when it passes), then the MCP service, which finds the identity in the request
//! extensions. These steps run in the route's handler, one after the other, rather
//! than as one router layer each: a layer costs every request a boxed future and a boxed
//! service clone per route. Every route is counted in the metrics.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{MatchedPath, Path, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::auth::{self, AuthState};
use crate::mcp::{self, McpService, Scope};
use crate::metrics::Rejection;
use crate::state::AppState;

/// Route template of the all-tools endpoint.
pub const MCP_PATH: &str = "/mcp";
/// Route template of a toolset endpoint.
pub const TOOLSET_MCP_PATH: &str = "/toolsets/{toolset}/mcp";
/// `tool_search` and `call_tool` over every tool the caller may call.
pub const SEARCH_MCP_PATH: &str = "/search/mcp";

/// Route of the caller's status report.
pub const STATUS_PATH: &str = "/status";

/// What the MCP routes serve with.
struct McpRoutes {
    state: Arc<AppState>,
    auth: Arc<AuthState>,
    service: McpService,
}

/// The public router. `auth` authenticates the MCP routes (not the ops routes).
///
/// In-flight MCP streams end when `state.shutdown` fires (subscriptions) — tool calls are
/// let run; see [`crate::server`] for the shutdown sequence.
pub fn app(state: AppState, auth: Arc<AuthState>) -> Router {
    app_with(state, auth, Router::new(), CancellationToken::new())
}

/// [`app`] with more public routes that need no authentication (the RFC 9728 metadata of
/// [`crate::auth::metadata_router`]) and the token that hard-stops every MCP stream (fired
/// by the server at the end of the shutdown grace period). The extra routes are counted in
/// the metrics like the others.
pub fn app_with(
    state: AppState,
    auth: Arc<AuthState>,
    extra_public: Router,
    stream_cancel: CancellationToken,
) -> Router {
    // The middleware gets the state behind one `Arc`: it is cloned for every request.
    let shared = Arc::new(state.clone());
    let routes =
        Arc::new(McpRoutes { state: shared.clone(), auth, service: mcp::service(state.clone(), stream_cancel) });
    let mcp_router = Router::new()
        .route(MCP_PATH, any(mcp_all))
        .route(TOOLSET_MCP_PATH, any(mcp_toolset))
        .route(SEARCH_MCP_PATH, any(mcp_search))
        .route(STATUS_PATH, get(status))
        .with_state(routes);
    let ops = if state.settings.metrics_on_public { ops_router(state.clone()) } else { health_router(state.clone()) };
    Router::new()
        .merge(mcp_router)
        .merge(ops)
        .merge(extra_public)
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(shared, record_request))
        .layer(tower_http::trace::TraceLayer::new_for_http())
}

/// `/healthz`, `/readyz` and `/metrics`: for the separate metrics listener.
pub fn ops_router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

fn health_router(state: AppState) -> Router {
    Router::new().route("/healthz", get(healthz)).route("/readyz", get(readyz)).with_state(state)
}

async fn mcp_all(State(routes): State<Arc<McpRoutes>>, request: Request) -> Response {
    admit(&routes, request, Some(Scope::All)).await
}

async fn mcp_search(State(routes): State<Arc<McpRoutes>>, request: Request) -> Response {
    admit(&routes, request, Some(Scope::Search)).await
}

async fn mcp_toolset(State(routes): State<Arc<McpRoutes>>, Path(toolset): Path<String>, request: Request) -> Response {
    admit(&routes, request, is_dns_label(&toolset).then_some(Scope::Toolset(toolset))).await
}

/// Admission, authentication and per-user admission (see the module docs), then the MCP
/// service for the request's scope; a scope of `None` (a toolset name that cannot exist)
/// answers 404 once the caller is authenticated.
async fn admit(routes: &McpRoutes, mut request: Request, scope: Option<Scope>) -> Response {
    let admitted = match admit_caller(routes, &mut request).await {
        Ok(admitted) => admitted,
        Err(refusal) => return refusal,
    };
    let Some(scope) = scope else { return not_found().await };
    request.extensions_mut().insert(admitted.identity);
    request.extensions_mut().insert(scope);
    forward(routes, request).await
}

/// An authenticated caller, holding its admission permits while its request runs.
struct Admitted {
    identity: crate::identity::Identity,
    _permits: (crate::limits::HttpPermit, crate::limits::HttpPermit),
}

/// The steps every authenticated route takes before its own work (see the module docs).
async fn admit_caller(routes: &McpRoutes, request: &mut Request) -> Result<Admitted, Response> {
    let state = &routes.state;
    if let Some(refusal) = global_refusal(state, request) {
        return Err(refusal);
    }
    let permit = match state.limits.try_admit_http() {
        Ok(p) => p,
        Err(rejection) => {
            state.metrics.admission_rejected(rejection);
            return Err(busy_response(state, StatusCode::SERVICE_UNAVAILABLE, "too many requests in flight"));
        }
    };
    let identity = auth::authenticate(&routes.auth, request).await?;
    let user_permit = match state.limits.try_admit_http_user(identity.owner_key().as_str()) {
        Ok(p) => p,
        Err(rejection) => {
            state.metrics.admission_rejected(rejection);
            return Err(busy_response(
                state,
                StatusCode::TOO_MANY_REQUESTS,
                "too many requests in flight for this user",
            ));
        }
    };
    Ok(Admitted { identity, _permits: (permit, user_permit) })
}

/// `GET /status`: [`crate::status::report`] for the authenticated caller.
async fn status(State(routes): State<Arc<McpRoutes>>, mut request: Request) -> Response {
    let admitted = match admit_caller(&routes, &mut request).await {
        Ok(admitted) => admitted,
        Err(refusal) => return refusal,
    };
    axum::Json(crate::status::report(&routes.state, &admitted.identity).await).into_response()
}

/// Hands a request to the MCP service. POST bodies are read here first (up to the cap, 413
/// beyond), so that a body the MCP layer cannot decode gets a JSON-RPC error: `-32700` for
/// text that is not JSON, `-32600` for JSON that is no JSON-RPC message (HTTP 400 both).
async fn forward(routes: &McpRoutes, request: Request) -> Response {
    if request.method() != Method::POST {
        return routes.service.other(request).await;
    }
    let (parts, body) = request.into_parts();
    let json_body = mcp::declares_json(&parts.headers);
    let bytes = match read_body(body, routes.state.settings.limits.max_body_bytes).await {
        Ok(bytes) => bytes,
        Err(BodyError::Unreadable) => {
            return (StatusCode::BAD_REQUEST, "could not read the request body\n").into_response();
        }
        Err(BodyError::TimedOut) => {
            routes.state.metrics.admission_rejected(Rejection::BodyTimeout);
            let mut response = (StatusCode::REQUEST_TIMEOUT, "request body not received in time\n").into_response();
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            return response;
        }
        Err(BodyError::TooLarge) => {
            routes.state.metrics.admission_rejected(Rejection::BodyTooLarge);
            return (StatusCode::PAYLOAD_TOO_LARGE, "request body too large\n").into_response();
        }
    };
    let response = routes.service.post(parts, bytes.clone()).await;
    if json_body && response.status() == StatusCode::UNSUPPORTED_MEDIA_TYPE {
        return undecodable_message(&bytes);
    }
    response
}

/// Why a request body could not be read.
#[derive(Debug, PartialEq, Eq)]
enum BodyError {
    /// The connection failed or the body was malformed.
    Unreadable,
    /// The body missed its deadline ([`crate::server::ServerSettings::body_read_timeout`]).
    TimedOut,
    /// More than the cap.
    TooLarge,
}

/// Reads a request body of at most `max` bytes. A body that arrives in one piece (most
/// requests) is kept as it came, without a copy.
///
/// It stops as soon as the body is complete by its own length (`is_end_stream`) instead of
/// polling once more for the end of the stream. With hyper's HTTP/1 body channel that last
/// poll is never ready at once: the request waits for the connection task to run again, a
/// scheduler round trip (and a wake-up of another worker thread) before every answer.
async fn read_body<B>(mut body: B, max: usize) -> Result<Bytes, BodyError>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: std::error::Error + 'static,
{
    let mut single = Bytes::new();
    let mut joined: Option<BytesMut> = None;
    while !body.is_end_stream() {
        let Some(frame) = body.frame().await else { break };
        let Ok(chunk) = frame.map_err(|e| unreadable(&e))?.into_data() else {
            continue; // trailers
        };
        let total = joined.as_ref().map_or(single.len(), BytesMut::len) + chunk.len();
        if total > max {
            return Err(BodyError::TooLarge);
        }
        match &mut joined {
            Some(joined) => joined.extend_from_slice(&chunk),
            None if single.is_empty() => single = chunk,
            None => {
                let mut both = BytesMut::with_capacity(total);
                both.extend_from_slice(&single);
                both.extend_from_slice(&chunk);
                joined = Some(both);
            }
        }
    }
    Ok(joined.map_or(single, BytesMut::freeze))
}

/// Why a body could not be read: it missed its deadline, or anything else.
fn unreadable(error: &(dyn std::error::Error + 'static)) -> BodyError {
    if crate::server::is_body_timeout(error) { BodyError::TimedOut } else { BodyError::Unreadable }
}

/// The JSON-RPC error for a body that is not a JSON-RPC message.
fn undecodable_message(body: &[u8]) -> Response {
    let (code, message, id) = match serde_json::from_slice::<Value>(body) {
        Err(e) => (-32700, format!("Parse error: the body is not JSON ({e})"), Value::Null),
        Ok(v) => {
            let id = v.get("id").filter(|id| id.is_string() || id.is_number()).cloned().unwrap_or(Value::Null);
            (
                -32600,
                "Invalid Request: not a JSON-RPC 2.0 message of MCP (check jsonrpc, id, method and params)".to_owned(),
                id,
            )
        }
    };
    let body = json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}});
    (StatusCode::BAD_REQUEST, axum::Json(body)).into_response()
}

async fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "not found\n").into_response()
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(state): State<AppState>) -> Response {
    match state.readiness().await {
        Ok(()) => (StatusCode::OK, "ready\n").into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}\n")).into_response(),
    }
}

async fn metrics(State(state): State<AppState>) -> Response {
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], state.metrics.encode())
        .into_response()
}

/// The refusal of a new MCP request while shutting down, or of a declared body above the cap
/// before it is read.
fn global_refusal(state: &AppState, request: &Request) -> Option<Response> {
    if state.shutdown.is_cancelled() {
        state.metrics.admission_rejected(Rejection::ShuttingDown);
        let mut response = busy_response(state, StatusCode::SERVICE_UNAVAILABLE, "server is shutting down");
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        return Some(response);
    }
    let declared =
        request.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > state.settings.limits.max_body_bytes as u64) {
        state.metrics.admission_rejected(Rejection::BodyTooLarge);
        return Some((StatusCode::PAYLOAD_TOO_LARGE, "request body too large\n").into_response());
    }
    None
}

fn busy_response(state: &AppState, status: StatusCode, message: &str) -> Response {
    let retry = state.limits.settings().retry_after.as_secs().max(1);
    let mut response = (status, format!("{message}; retry later\n")).into_response();
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(retry));
    response
}

/// Counts every request by route template, method and status.
async fn record_request(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let route = request.extensions().get::<MatchedPath>().map(|p| p.as_str().to_owned());
    let method = request.method().as_str().to_owned();
    let started = Instant::now();
    let response = next.run(request).await;
    let route = route.unwrap_or_else(|| "unmatched".to_owned());
    let method = if is_standard_method(&method) { method } else { "other".to_owned() };
    state.metrics.http_request(&route, &method, response.status().as_u16(), started.elapsed());
    response
}

fn is_standard_method(m: &str) -> bool {
    matches!(m, "GET" | "POST" | "PUT" | "DELETE" | "HEAD" | "OPTIONS" | "PATCH")
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use super::*;

    #[tokio::test]
    async fn undecodable_bodies_get_json_rpc_errors() {
        let parse = undecodable_message(b"{not json");
        assert_eq!(parse.status(), StatusCode::BAD_REQUEST);
        let body = axum::body::to_bytes(parse.into_body(), 10_000).await.unwrap();
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["code"], -32700);
        assert_eq!(v["id"], Value::Null);
        let invalid = undecodable_message(br#"{"jsonrpc":"2.0","id":7,"method":5}"#);
        let body = axum::body::to_bytes(invalid.into_body(), 10_000).await.unwrap();
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!((v["error"]["code"].clone(), v["id"].clone()), (json!(-32600), json!(7)));
    }

    /// A body of one chunk that declares its end, as hyper's body of a request with a
    /// `Content-Length` does; it fails the test if it is polled past that end.
    struct DeclaredLength(Option<Bytes>);

    impl http_body::Body for DeclaredLength {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            _cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
            let chunk = self.0.take().expect("the body was polled past its declared end");
            std::task::Poll::Ready(Some(Ok(http_body::Frame::data(chunk))))
        }

        fn is_end_stream(&self) -> bool {
            self.0.is_none()
        }
    }

    #[tokio::test]
    async fn a_body_is_read_up_to_its_declared_end_and_not_polled_after_it() {
        let chunk = Bytes::from_static(b"{\"jsonrpc\":\"2.0\"}");
        let read = read_body(DeclaredLength(Some(chunk.clone())), 1024).await.unwrap();
        assert_eq!(read, chunk);
        assert_eq!(read.as_ptr(), chunk.as_ptr(), "a body in one piece is not copied");
    }

    #[tokio::test]
    async fn a_body_in_pieces_is_joined_and_capped() {
        let pieces = || {
            let chunks: Vec<Result<Bytes, std::io::Error>> =
                vec![Ok(Bytes::from_static(b"ab")), Ok(Bytes::from_static(b"cd")), Ok(Bytes::from_static(b"e"))];
            axum::body::Body::from_stream(futures::stream::iter(chunks))
        };
        assert_eq!(read_body(pieces(), 5).await.unwrap(), Bytes::from_static(b"abcde"));
        assert_eq!(read_body(pieces(), 4).await.unwrap_err(), BodyError::TooLarge);
        assert_eq!(read_body(axum::body::Body::empty(), 4).await.unwrap(), Bytes::new());
        let broken: Vec<Result<Bytes, std::io::Error>> =
            vec![Ok(Bytes::from_static(b"ab")), Err(std::io::Error::other("connection reset"))];
        let broken = axum::body::Body::from_stream(futures::stream::iter(broken));
        assert_eq!(read_body(broken, 100).await.unwrap_err(), BodyError::Unreadable);
    }

    #[tokio::test]
    async fn a_body_past_its_deadline_is_timed_out() {
        let stalled: Vec<Result<Bytes, std::io::Error>> = vec![Ok(Bytes::from_static(b"{"))];
        let stalled = futures::StreamExt::chain(futures::stream::iter(stalled), futures::stream::pending());
        let body = tower_http::timeout::DeadlineBody::new(
            std::time::Duration::from_millis(20),
            axum::body::Body::from_stream(stalled),
        );
        assert_eq!(read_body(axum::body::Body::new(body), 100).await.unwrap_err(), BodyError::TimedOut);
    }

    #[test]
    fn toolset_names_are_dns_labels() {
        assert!(is_dns_label("pricing"));
        assert!(is_dns_label("a-1"));
        for bad in ["", "-a", "a-", "A", "a_b", "..", "a/b", &"a".repeat(64)] {
            assert!(!is_dns_label(bad), "{bad:?}");
        }
    }
}

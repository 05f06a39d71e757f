//! The MCP server over stateless Streamable HTTP (rmcp): `tools/list` and `tools/call` with
//! tools from the [`crate::catalog::ToolCatalog`], authorization per tool, argument
//! validation before anything runs; the built-in task tools ([`builtin`], [`tasks`]); task
//! results, events and files as resources ([`resources`]); the MCP tasks extension for
//! `run_coding_task`; `notifications/tools/list_changed` and resource updates through
//! `subscriptions/listen` (protocol 2026-07-28) or a session's GET stream (older revisions:
//! [`sessions`]); and `notifications/cancelled` for running calls ([`cancel`]).
//!
//! [`service`] builds the [`McpService`] that [`crate::app::app`] mounts at `/mcp` and
//! `/toolsets/{toolset}/mcp`: plain `tools/list` and `tools/call` requests are answered on
//! the `direct` path, everything else by rmcp's Streamable HTTP service. The handler reads
//! the caller's [`crate::Identity`] and the [`Scope`] from the HTTP request extensions.

pub mod asks;
pub mod builtin;
pub mod cancel;
mod changes;
mod convert;
mod cursor;
mod direct;
pub mod errors;
mod handler;
pub mod resources;
mod rounds;
pub mod sessions;
pub mod tasks;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::IntoResponse;
use bytes::Bytes;
use http::{Request, Response};
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

pub use convert::{call_result_to_mcp, to_mcp_tool};
pub use cursor::{decode_cursor, encode_cursor};
pub use handler::{CALL_ID_META, McpHandler, SUPPORTED_PROTOCOL_VERSIONS};

use crate::core::Selection;
use crate::hosts::AllowedHosts;
use crate::identity::Identity;
use crate::state::AppState;

/// Which tools an MCP endpoint serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// `/mcp`: every tool the caller may call.
    All,
    /// `/toolsets/<name>/mcp`: the tools of one toolset.
    Toolset(String),
    /// `/search/mcp`: `tool_search` and `call_tool` only, over every tool the caller may call.
    Search,
}

impl Scope {
    /// The part of the catalog this endpoint serves.
    pub fn selection(&self) -> Selection {
        match self {
            Scope::All | Scope::Search => Selection::all(),
            Scope::Toolset(name) => Selection::toolset(name.clone()),
        }
    }

    /// Whether this endpoint serves the prompts and resources of an upstream server in
    /// `toolset`: all of them on `/mcp`, a toolset's servers' on its endpoint, none on
    /// `/search/mcp`.
    pub fn shows_server_of(&self, toolset: Option<&str>) -> bool {
        match self {
            Scope::All => true,
            Scope::Toolset(name) => toolset == Some(name.as_str()),
            Scope::Search => false,
        }
    }
}

/// The request declares a JSON body (`Content-Type: application/json`, parameters allowed).
pub fn declares_json(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"))
}

/// The MCP endpoint: the `direct` path for plain `tools/list` and `tools/call`, rmcp's
/// stateless Streamable HTTP service for everything else. Cheap to clone.
#[derive(Clone)]
pub struct McpService {
    rmcp: StreamableHttpService<McpHandler, NeverSessionManager>,
    handler: McpHandler,
    stop: CancellationToken,
    allowed_hosts: Arc<AllowedHosts>,
}

impl McpService {
    /// Serves a POST whose body has been read (and size-checked) already. A
    /// `notifications/cancelled` is acted on here: the stateless transport drops
    /// notifications, and the call it names may run on any replica (see [`cancel`]). So is a
    /// client's answer to a request the gateway asked it ([`asks`]).
    pub async fn post(&self, mut parts: http::request::Parts, body: Bytes) -> Response<Body> {
        same_origin(&mut parts.headers);
        if let Err(refused) = self.session_of(&mut parts) {
            return refused.into_response();
        }
        if let Some(direct) = direct::take(&parts, &body, &self.allowed_hosts) {
            return direct.serve(&self.handler, parts, &self.stop).await;
        }
        // An answer is no request: read only for bodies the direct path did not take.
        if let Some(answer) = asks::answer_of(&body)
            && let Some(who) = parts.extensions.get::<Identity>()
        {
            let state = self.handler.state();
            return asks::deliver(&state.asks, state.store.as_ref(), state.calls.quota(), &who.owner_key(), answer)
                .await;
        }
        if let Some(request_id) = cancel::cancelled_request_id(&body)
            && let Some(who) = parts.extensions.get::<Identity>()
        {
            cancel::on_cancelled(self.handler.state(), who, &request_id);
        }
        let opens_session = is_initialize(&body).then(|| parts.extensions.get::<Identity>().map(Identity::owner_key));
        let mut response = self.rmcp.handle(Request::from_parts(parts, Body::from(body))).await.map(Body::new);
        if let Some(Some(owner)) = opens_session
            && response.status() == http::StatusCode::OK
            && let Ok(id) = http::HeaderValue::from_str(&self.handler.state().sessions.open(&owner))
        {
            response.headers_mut().insert(sessions::HEADER, id);
        }
        response
    }

    /// Serves any other request: a GET with a session is its stream ([`sessions`]); rmcp
    /// answers the others (a GET without one, DELETE: 405).
    pub async fn other(&self, request: Request<Body>) -> Response<Body> {
        let (mut parts, body) = request.into_parts();
        same_origin(&mut parts.headers);
        let session = match self.session_of(&mut parts) {
            Ok(session) => session,
            Err(refused) => return refused.into_response(),
        };
        if parts.method == http::Method::GET
            && let Some(session) = session
            && let Some(who) = parts.extensions.get::<Identity>()
        {
            let state = self.handler.state();
            if !self.allowed_hosts.allows(&parts.headers, &parts.uri) {
                return (http::StatusCode::FORBIDDEN, "Forbidden: Host header is not allowed\n").into_response();
            }
            if let Some(origin) = parts.headers.get(http::header::ORIGIN)
                && !state.settings.allowed_origins.iter().any(|o| o.as_bytes() == origin.as_bytes())
            {
                return (http::StatusCode::FORBIDDEN, "Forbidden: Origin is not allowed\n").into_response();
            }
            let accepts_sse = parts
                .headers
                .get_all(http::header::ACCEPT)
                .iter()
                .any(|v| v.to_str().is_ok_and(|v| v.contains("text/event-stream")));
            if !accepts_sse {
                return (http::StatusCode::NOT_ACCEPTABLE, "Not Acceptable: the stream is text/event-stream\n")
                    .into_response();
            }
            let scope = parts.extensions.get::<Scope>().cloned().unwrap_or(Scope::All);
            return sessions::stream(&self.handler, who, scope, session).await;
        }
        self.rmcp.handle(Request::from_parts(parts, body)).await.map(Body::new)
    }

    /// The session the request names (`Mcp-Session-Id`), checked to be the caller's and put in
    /// its extensions; `None` when it names none. A session that is not the caller's is
    /// answered 404, as an ended session is: the client then starts a new one.
    fn session_of(&self, parts: &mut http::request::Parts) -> Result<Option<sessions::Session>, NoSuchSession> {
        let Some(header) = parts.headers.get(sessions::HEADER) else { return Ok(None) };
        let sessions = &self.handler.state().sessions;
        let checked = header
            .to_str()
            .ok()
            .zip(parts.extensions.get::<Identity>())
            .and_then(|(header, who)| sessions.check(header, &who.owner_key()));
        match checked {
            Some(session) => {
                parts.extensions.insert(session.clone());
                Ok(Some(session))
            }
            None => Err(NoSuchSession),
        }
    }
}

/// A request's session is not the caller's (or not one at all): 404, as for an ended session.
struct NoSuchSession;

impl IntoResponse for NoSuchSession {
    fn into_response(self) -> axum::response::Response {
        (http::StatusCode::NOT_FOUND, "Not Found: no such session; start a new one with initialize\n").into_response()
    }
}

/// How often an idle SSE stream carries a comment (rmcp's setting for its streams).
const SSE_KEEP_ALIVE: Duration = Duration::from_secs(15);

/// An SSE answer of serialized JSON-RPC `messages`, one event each, as rmcp writes its streams:
/// kept alive, and marked for proxies not to buffer.
fn sse_response(messages: impl futures::Stream<Item = String> + Send + 'static) -> axum::response::Response {
    let events = futures::StreamExt::map(messages, |data| {
        Ok::<_, std::convert::Infallible>(axum::response::sse::Event::default().data(data))
    });
    let sse = axum::response::sse::Sse::new(events)
        .keep_alive(axum::response::sse::KeepAlive::new().interval(SSE_KEEP_ALIVE));
    ([(http::HeaderName::from_static("x-accel-buffering"), http::HeaderValue::from_static("no"))], sse).into_response()
}

/// A JSON-RPC message as the text of an SSE event.
fn to_json(message: &rmcp::model::ServerJsonRpcMessage) -> String {
    serde_json::to_string(message).unwrap_or_else(|e| {
        tracing::error!(error = %e, "serializing a JSON-RPC message failed");
        String::new()
    })
}

/// True when the body is an `initialize` request.
fn is_initialize(body: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Message<'a> {
        #[serde(borrow)]
        method: Option<std::borrow::Cow<'a, str>>,
    }
    const METHOD: &[u8] = b"\"initialize\"";
    body.windows(METHOD.len()).any(|w| w == METHOD)
        && serde_json::from_slice::<Message>(body).is_ok_and(|m| m.method.as_deref() == Some("initialize"))
}

/// Drops an `Origin` that is the gateway's own loopback origin
/// ([`crate::hosts::is_own_loopback_origin`]): the request is same-origin, and is served as
/// one without `Origin`. Every other `Origin` is checked against the allowed list.
fn same_origin(headers: &mut http::HeaderMap) {
    if crate::hosts::is_own_loopback_origin(headers) {
        headers.remove(http::header::ORIGIN);
    }
}

/// Builds the endpoint. rmcp's service is stateless (any replica serves any request), answers
/// in JSON where the client allows it, and checks hosts and origins from the settings and the
/// body cap from the limits. Origins are always checked: a request with an `Origin` that is
/// not listed (every `Origin` when the list is empty) gets 403, as the Streamable HTTP
/// transport requires; requests without one (non-browser clients) and those from the
/// gateway's own loopback origin pass. `cancel` ends every stream and every waiting request when fired;
/// the server fires it only after the shutdown grace period, so in-flight calls can finish.
pub fn service(state: AppState, cancel: CancellationToken) -> McpService {
    let settings = state.settings.clone();
    let mut config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(Some(Duration::from_secs(15)))
        .with_cancellation_token(cancel.clone())
        .with_allowed_hosts(settings.allowed_hosts.clone())
        .with_allowed_origins(settings.allowed_origins.clone())
        .enforce_origin_validation();
    if settings.allowed_hosts.is_empty() {
        config = config.disable_allowed_hosts();
    }
    config.max_request_body_bytes = settings.limits.max_body_bytes;
    let handler = McpHandler::new(state);
    let rmcp_handler = handler.clone();
    McpService {
        rmcp: StreamableHttpService::new(
            move || Ok(rmcp_handler.clone()),
            Arc::new(NeverSessionManager::default()),
            config,
        ),
        handler,
        stop: cancel,
        allowed_hosts: Arc::new(AllowedHosts::new(&settings.allowed_hosts)),
    }
}

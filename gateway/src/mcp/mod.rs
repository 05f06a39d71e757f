//! The MCP server over stateless Streamable HTTP (rmcp): `tools/list` and `tools/call` with
//! tools from the [`crate::catalog::ToolCatalog`], authorization per tool, argument
//! validation before anything runs; the built-in task tools ([`builtin`], [`tasks`]); task
//! results, events and files as resources ([`resources`]); the MCP tasks extension for
//! `run_coding_task`; `notifications/tools/list_changed` and resource updates through
//! `subscriptions/listen` (protocol 2026-07-28; older revisions have no stateless channel);
//! and `notifications/cancelled` for running calls ([`cancel`]).
//!
//! [`service`] builds the [`McpService`] that [`crate::app::app`] mounts at `/mcp` and
//! `/toolsets/{toolset}/mcp`: plain `tools/list` and `tools/call` requests are answered on
//! the `direct` path, everything else by rmcp's Streamable HTTP service. The handler reads
//! the caller's [`crate::Identity`] and the [`Scope`] from the HTTP request extensions.

pub mod asks;
pub mod builtin;
pub mod cancel;
mod convert;
mod cursor;
mod direct;
pub mod errors;
mod handler;
pub mod resources;
mod rounds;
pub mod tasks;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
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
        self.rmcp.handle(Request::from_parts(parts, Body::from(body))).await.map(Body::new)
    }

    /// Serves any other request (GET, DELETE, ...: rmcp answers them).
    pub async fn other(&self, mut request: Request<Body>) -> Response<Body> {
        same_origin(request.headers_mut());
        self.rmcp.handle(request).await.map(Body::new)
    }
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

//! The MCP server over stateless Streamable HTTP (rmcp): `tools/list` and `tools/call` with
//! tools from the [`crate::catalog::ToolCatalog`], authorization per tool, argument
//! validation before anything runs; the built-in task tools ([`builtin`], [`tasks`]); task
//! results, events and files as resources ([`resources`]); the MCP tasks extension for
//! `run_coding_task`; `notifications/tools/list_changed` and resource updates through
//! `subscriptions/listen` (protocol 2026-07-28; older revisions have no stateless channel);
//! and `notifications/cancelled` for running calls ([`cancel`]).
//!
//! [`service`] builds the rmcp tower service that [`crate::app::app`] mounts at `/mcp` and
//! `/toolsets/{toolset}/mcp`. The handler reads the caller's [`crate::Identity`] and the
//! [`Scope`] from the HTTP request extensions that rmcp passes through.

pub mod builtin;
pub mod cancel;
mod convert;
mod cursor;
pub mod errors;
mod handler;
pub mod resources;
pub mod tasks;

use std::sync::Arc;
use std::time::Duration;

use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

pub use convert::{call_result_to_mcp, to_mcp_tool};
pub use cursor::{decode_cursor, encode_cursor};
pub use handler::{McpHandler, SUPPORTED_PROTOCOL_VERSIONS, new_call_id};

use crate::state::AppState;

/// Which tools an MCP endpoint serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// `/mcp`: every tool the caller may call.
    All,
    /// `/toolsets/<name>/mcp`: the tools of one toolset.
    Toolset(String),
}

impl Scope {
    /// True when `tool` belongs to this scope.
    pub fn contains(&self, tool: &crate::catalog::Tool) -> bool {
        match self {
            Scope::All => true,
            Scope::Toolset(name) => tool.spec.toolset.as_deref() == Some(name.as_str()),
        }
    }
}

/// The rmcp service type mounted by the router.
pub type McpService = StreamableHttpService<McpHandler, NeverSessionManager>;

/// Builds the stateless Streamable HTTP service: no sessions (any replica serves any request),
/// JSON responses where the client allows them, hosts and origins from the settings, and the
/// body cap from the limits. `cancel` ends every stream when fired; the server fires it only
/// after the shutdown grace period, so in-flight calls can finish.
pub fn service(state: AppState, cancel: CancellationToken) -> McpService {
    let settings = state.settings.clone();
    let mut config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(Some(Duration::from_secs(15)))
        .with_cancellation_token(cancel)
        .with_allowed_hosts(settings.allowed_hosts.clone());
    if settings.allowed_hosts.is_empty() {
        config = config.disable_allowed_hosts();
    }
    if !settings.allowed_origins.is_empty() {
        config = config.with_allowed_origins(settings.allowed_origins.clone());
    }
    config.max_request_body_bytes = settings.limits.max_body_bytes;
    let handler = McpHandler::new(state);
    StreamableHttpService::new(move || Ok(handler.clone()), Arc::new(NeverSessionManager::default()), config)
}

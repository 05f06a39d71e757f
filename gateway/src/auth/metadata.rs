//! OAuth 2.0 Protected Resource Metadata (RFC 9728), as the MCP authorization spec asks:
//! `/.well-known/oauth-protected-resource` (the whole gateway) and the path-suffixed
//! variants `/.well-known/oauth-protected-resource/mcp` and
//! `/.well-known/oauth-protected-resource/toolsets/<name>/mcp`. A 401 points at them
//! through `WWW-Authenticate: Bearer resource_metadata="..."`.
//!
//! URLs are built from the configured public URL; without one, from the request's `Host`
//! header (checked to be a plain `host[:port]`) and the default scheme.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};

use crate::hosts::AllowedHosts;

/// Path of the metadata document of the whole gateway.
pub const WELL_KNOWN: &str = "/.well-known/oauth-protected-resource";

/// What the metadata documents say.
#[derive(Clone, Debug, Default)]
pub struct ProtectedResourceMetadata {
    /// Public base URL of the gateway (`https://toolyard.example.com`, no path). When
    /// `None`, derived from the request's `Host` header and [`Self::default_scheme`].
    pub public_url: Option<String>,
    /// Scheme used with the `Host` header when no public URL is set (`https`, or `http`
    /// when serving plain HTTP). Empty means `https`.
    pub default_scheme: String,
    /// Authorization servers (the OIDC issuers).
    pub authorization_servers: Vec<String>,
    /// The gateway is its own authorization server (the local mode's
    /// [`crate::local::oauth`]): the documents name the gateway's base URL.
    pub own_authorization_server: bool,
    /// Scopes clients may ask for.
    pub scopes_supported: Vec<String>,
    /// Human-readable name of the resource.
    pub resource_name: Option<String>,
    /// Hosts the documents are made for when no public URL is set (the gateway's
    /// `--allowed-hosts`): a request for another host gets none, so a page served from an
    /// attacker's host name cannot have the gateway describe itself under that name.
    pub allowed_hosts: AllowedHosts,
}

impl ProtectedResourceMetadata {
    /// Checks the public URL: absolute `http(s)` with no path, query or fragment.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(url) = &self.public_url {
            let parsed = reqwest::Url::parse(url).map_err(|e| format!("public URL {url:?}: {e}"))?;
            if !matches!(parsed.scheme(), "http" | "https")
                || parsed.host_str().is_none()
                || !parsed.path().trim_end_matches('/').is_empty()
                || parsed.query().is_some()
                || parsed.fragment().is_some()
            {
                return Err(format!("public URL {url:?} must look like https://host[:port] (no path or query)"));
            }
        }
        Ok(())
    }

    /// `scheme://host[:port]` of the gateway for this request, if it can be told.
    pub fn base_url(&self, headers: &HeaderMap) -> Option<String> {
        if let Some(url) = &self.public_url {
            return Some(url.trim_end_matches('/').to_owned());
        }
        if !self.allowed_hosts.allows(headers, &http::Uri::default()) {
            return None;
        }
        let host = headers.get(header::HOST)?.to_str().ok()?;
        if host.is_empty()
            || host.len() > 255
            || !host.bytes().all(|b| b.is_ascii_alphanumeric() || b"-.:[]".contains(&b))
        {
            return None;
        }
        let scheme = if self.default_scheme.is_empty() { "https" } else { self.default_scheme.as_str() };
        Some(format!("{scheme}://{host}"))
    }

    /// URL of the metadata document for `resource_path` (`""`, `/mcp`, `/toolsets/x/mcp`).
    pub fn metadata_url(&self, headers: &HeaderMap, resource_path: &str) -> Option<String> {
        Some(format!("{}{WELL_KNOWN}{resource_path}", self.base_url(headers)?))
    }

    /// The JSON document for the resource at `base` + `resource_path`.
    pub fn document(&self, base: &str, resource_path: &str) -> Value {
        let mut doc = json!({
            "resource": format!("{base}{resource_path}"),
            "bearer_methods_supported": ["header"],
        });
        if self.own_authorization_server {
            doc["authorization_servers"] = json!([base]);
        } else if !self.authorization_servers.is_empty() {
            doc["authorization_servers"] = json!(self.authorization_servers);
        }
        if !self.scopes_supported.is_empty() {
            doc["scopes_supported"] = json!(self.scopes_supported);
        }
        if let Some(name) = &self.resource_name {
            doc["resource_name"] = json!(name);
        }
        doc
    }
}

/// The protected resource a request path belongs to: `/mcp`, `/toolsets/<name>/mcp`, or
/// `""` (the whole gateway) for anything else. Only these shapes are echoed into headers.
pub fn resource_path(path: &str) -> String {
    let path = path.trim_end_matches('/');
    if path == "/mcp" {
        return path.to_owned();
    }
    if let Some(name) = path.strip_prefix("/toolsets/").and_then(|rest| rest.strip_suffix("/mcp"))
        && is_toolset_name(name)
    {
        return path.to_owned();
    }
    String::new()
}

/// A DNS label, as McpTool's `toolset` field requires.
fn is_toolset_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// Routes serving the metadata documents (merge into the gateway's router, outside the
/// authentication middleware).
pub fn metadata_router(metadata: ProtectedResourceMetadata) -> Router {
    let metadata = Arc::new(metadata);
    Router::new()
        .route(WELL_KNOWN, get(|State(m): State<Arc<ProtectedResourceMetadata>>, h: HeaderMap| async move { serve(&m, &h, "") }))
        .route(
            &format!("{WELL_KNOWN}/mcp"),
            get(|State(m): State<Arc<ProtectedResourceMetadata>>, h: HeaderMap| async move { serve(&m, &h, "/mcp") }),
        )
        .route(
            &format!("{WELL_KNOWN}/toolsets/{{toolset}}/mcp"),
            get(|State(m): State<Arc<ProtectedResourceMetadata>>, h: HeaderMap, Path(toolset): Path<String>| async move {
                if !is_toolset_name(&toolset) {
                    return StatusCode::NOT_FOUND.into_response();
                }
                serve(&m, &h, &format!("/toolsets/{toolset}/mcp"))
            }),
        )
        .with_state(metadata)
}

fn serve(metadata: &ProtectedResourceMetadata, headers: &HeaderMap, resource_path: &str) -> Response {
    let Some(base) = metadata.base_url(headers) else {
        return (StatusCode::BAD_REQUEST, "missing, invalid or not allowed Host header").into_response();
    };
    let mut response = axum::Json(metadata.document(&base, resource_path)).into_response();
    let h = response.headers_mut();
    // A public document: browsers (MCP Inspector) fetch it cross-origin.
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue::from_static("*"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("public, max-age=300"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_paths_are_recognized_and_nothing_else_is_echoed() {
        assert_eq!(resource_path("/mcp"), "/mcp");
        assert_eq!(resource_path("/mcp/"), "/mcp");
        assert_eq!(resource_path("/toolsets/pricing/mcp"), "/toolsets/pricing/mcp");
        assert_eq!(resource_path("/toolsets/Bad\"x/mcp"), "");
        assert_eq!(resource_path("/toolsets//mcp"), "");
        assert_eq!(resource_path("/other"), "");
    }

    #[test]
    fn base_url_prefers_the_public_url_and_checks_the_host_header() {
        let mut m = ProtectedResourceMetadata::default();
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("gw.example.com:8443"));
        assert_eq!(m.base_url(&h).as_deref(), Some("https://gw.example.com:8443"));
        h.insert(header::HOST, HeaderValue::from_static("evil\"host"));
        assert_eq!(m.base_url(&h), None);
        m.allowed_hosts = AllowedHosts::new(&["gw.example.com".to_owned()]);
        h.insert(header::HOST, HeaderValue::from_static("gw.example.com:8443"));
        assert_eq!(m.base_url(&h).as_deref(), Some("https://gw.example.com:8443"), "any port of an allowed host");
        h.insert(header::HOST, HeaderValue::from_static("attacker.example:8443"));
        assert_eq!(m.base_url(&h), None, "no document for a host not served");
        m.public_url = Some("https://toolyard.example.com/".into());
        assert_eq!(m.base_url(&h).as_deref(), Some("https://toolyard.example.com"));
        assert!(m.validate().is_ok());
        m.public_url = Some("https://toolyard.example.com/mcp".into());
        assert!(m.validate().is_err());
    }
}

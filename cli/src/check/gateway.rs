//! Checks of a gateway (or any MCP server) at `--url`: TLS chain, names and expiry; the
//! token; the MCP handshake in both protocol eras; the tools this identity may call; coding
//! tasks.

use std::time::Duration;

use rmcp::ClientLifecycleMode;
use rmcp::model::ProtocolVersion;
use serde_json::Value;

use super::Line;
use crate::connect::{Connection, error_chain};

/// Certificates closer than this to expiry are a WARN.
const EXPIRY_WARNING: Duration = Duration::from_secs(30 * 24 * 3600);

/// The gateway lines.
pub async fn check(conn: &Connection, limit: Duration, require_agent: bool) -> Vec<Line> {
    let mut lines = Vec::new();
    let url = match conn.url().map(reqwest::Url::parse) {
        Ok(Ok(url)) => url,
        Ok(Err(e)) => return vec![Line::fail("gateway.url", format!("not a URL: {e}"), "pass --url https://HOST/mcp")],
        Err(e) => return vec![Line::fail("gateway.url", e.to_string(), "pass --url https://HOST/mcp")],
    };
    lines.push(reach(conn, &url, limit).await);
    if lines.iter().any(|l| l.status == super::Status::Fail) {
        lines.push(Line::skip("gateway.token", "not checked: no connection"));
        return lines;
    }
    let token = match conn.token() {
        Ok(Some(_)) => true,
        Ok(None) => false,
        Err(e) => {
            lines.push(Line::fail("gateway.token", format!("{e:#}"), "point --token-file at a readable token file"));
            return lines;
        }
    };
    let eras = [
        ("mcp.2025-11-25", ClientLifecycleMode::Initialize),
        ("mcp.2026-07-28", ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] }),
    ];
    let mut client = None;
    for (check, lifecycle) in eras {
        let attempt = tokio::time::timeout(limit, conn.connect_with(lifecycle, true)).await;
        match attempt {
            Err(_) => lines.push(Line::fail(
                check,
                format!("no answer within {} s", limit.as_secs()),
                "check that the gateway is ready",
            )),
            Ok(Err(e)) => {
                let text = format!("{e:#}");
                if text.contains("refused the token") {
                    let (detail, fix) = if token {
                        (
                            "the gateway refuses the token (401)",
                            "use a current token: for a ServiceAccount `kubectl create token NAME --audience toolyard`",
                        )
                    } else {
                        (
                            "no token given and the gateway requires one (401)",
                            "pass --token-file FILE or set TOOLYARD_TOKEN",
                        )
                    };
                    if !lines.iter().any(|l| l.check == "gateway.token") {
                        lines.push(Line::fail("gateway.token", detail, fix));
                    }
                    lines.push(Line::skip(check, "not checked: the token is refused"));
                } else {
                    lines.push(Line::fail(
                        check,
                        text.replace('\n', " "),
                        "see the detail; the gateway's log has the server side",
                    ));
                }
            }
            Ok(Ok(c)) => {
                if !lines.iter().any(|l| l.check == "gateway.token") {
                    let who = if token { "the token is accepted" } else { "the server accepts calls without a token" };
                    lines.push(Line::pass("gateway.token", who));
                }
                let server = c.peer_info().map(|i| match &i.server_info {
                    Some(s) => format!("{} {} (protocol {})", s.name, s.version, i.protocol_version),
                    None => format!("protocol {}", i.protocol_version),
                });
                lines.push(Line::pass(check, server.unwrap_or_else(|| "handshake done".into())));
                client.get_or_insert(c);
            }
        }
    }
    let Some(client) = client else {
        lines.push(Line::skip("tools", "not checked: no MCP session"));
        return lines;
    };
    match tokio::time::timeout(limit, client.list_all_tools()).await {
        Err(_) => lines.push(Line::fail("tools", "tools/list did not answer in time", "check the gateway's log")),
        Ok(Err(e)) => {
            lines.push(Line::fail("tools", format!("tools/list: {}", error_chain(&e)), "check the gateway's log"))
        }
        Ok(Ok(tools)) => {
            let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
            if names.is_empty() {
                lines.push(Line::warn(
                    "tools",
                    "this identity may call no tool",
                    "bind the ClusterRole toolyard-tool-caller to it in the tools' namespace (or fix the local --policy)",
                ));
            } else {
                lines.push(Line::pass(
                    "tools",
                    format!("{} tool(s) this identity may call: {}", names.len(), names.join(", ")),
                ));
            }
        }
    }
    let _ = client.cancel().await;
    lines.extend(status(conn, &url, limit, require_agent).await);
    lines
}

/// The lines from the gateway's `/status` report: storage writable as the gateway sees it,
/// coding tasks allowed, each model profile reached from the gateway.
async fn status(conn: &Connection, mcp_url: &reqwest::Url, limit: Duration, required: bool) -> Vec<Line> {
    const AGENT_FIX: &str = "configure a model profile on the gateway (chart value model.profiles; locally \
                             TOOLYARD_MODEL_BASE_URL and TOOLYARD_MODEL) and allow this identity `use` on it";
    let missing = |detail: &str, fix: &str| {
        if required {
            Line::fail("coding-tasks", detail, fix)
        } else {
            Line::skip("coding-tasks", format!("{detail} (--require-agent makes this a FAIL)"))
        }
    };
    let url = status_url(mcp_url);
    let report = async {
        let mut request = conn.http()?.get(url.clone()).timeout(limit);
        if let Some(token) = conn.token()? {
            request = request.bearer_auth(token);
        }
        let response = request.send().await?;
        if response.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let response = response.error_for_status()?;
        anyhow::Ok(Some(response.json::<Value>().await?))
    };
    let report = match report.await {
        Ok(Some(report)) => report,
        Ok(None) => {
            let skip = "not checked: the server has no /status (not a Toolyard gateway, or an older one)";
            return vec![Line::skip("gateway.storage", skip), Line::skip("coding-tasks", skip)];
        }
        Err(e) => return vec![Line::fail("gateway.status", format!("GET {url}: {e:#}"), "see the gateway's log")],
    };
    let mut lines = Vec::new();
    lines.push(match report.pointer("/storage/writable").and_then(Value::as_bool) {
        Some(true) => Line::pass("gateway.storage", "the gateway writes and reads back this identity's storage"),
        _ => Line::fail(
            "gateway.storage",
            format!(
                "the gateway cannot write this identity's storage: {}",
                report.pointer("/storage/error").and_then(Value::as_str).unwrap_or("no reason given")
            ),
            "check the gateway's storage settings (gateway.storage.s3.*), its credentials and that the bucket accepts writes",
        ),
    });
    let models = report["models"].as_array().cloned().unwrap_or_default();
    if report["codingTasks"].as_bool() != Some(true) {
        lines.push(missing(
            "this identity may not start coding tasks",
            "bind the ClusterRole toolyard-task-runner to it (or `codingTasks: true` in the local policy)",
        ));
    } else if models.is_empty() {
        lines.push(missing("the gateway has no model profile this identity may use", AGENT_FIX));
    } else {
        let describe = |m: &Value| {
            let name = m["profile"].as_str().unwrap_or_default();
            match (m["reachable"].as_bool(), m["error"].as_str()) {
                (Some(true), _) => format!("{name} (reachable, HTTP {})", m["status"]),
                (_, Some(error)) => format!("{name} ({error})"),
                _ => format!("{name} (unknown)"),
            }
        };
        let all: Vec<String> = models.iter().map(describe).collect();
        let reachable = models.iter().filter(|m| m["reachable"].as_bool() == Some(true)).count();
        let detail = format!("model profile(s) as the gateway reaches them: {}", all.join(", "));
        let fix = "check the profile's baseUrl, its key Secret and the gateway's egress to the endpoint";
        lines.push(if reachable == models.len() {
            Line::pass("coding-tasks", detail)
        } else if reachable == 0 && required {
            Line::fail("coding-tasks", detail, fix)
        } else {
            Line::warn("coding-tasks", detail, fix)
        });
    }
    lines
}

/// `/status` next to the MCP endpoint: `https://h/prefix/mcp` or
/// `https://h/prefix/toolsets/x/mcp` give `https://h/prefix/status` (a gateway behind an
/// Ingress path keeps its prefix).
fn status_url(mcp_url: &reqwest::Url) -> reqwest::Url {
    let path = mcp_url.path().trim_end_matches('/');
    let base = path.strip_suffix("/mcp").unwrap_or(path);
    let base = match base.rsplit_once("/toolsets/") {
        Some((prefix, toolset)) if !toolset.contains('/') => prefix,
        _ => base,
    };
    let mut url = mcp_url.clone();
    url.set_path(&format!("{base}/status"));
    url.set_query(None);
    url
}

/// The connection line: an HTTPS handshake with the trusted roots, then the leaf
/// certificate's names and expiry (`gateway.tls`); plain HTTP only on loopback
/// (`gateway.http`).
async fn reach(conn: &Connection, url: &reqwest::Url, limit: Duration) -> Line {
    let https = url.scheme() == "https";
    let check = if https { "gateway.tls" } else { "gateway.http" };
    let client = match conn.http_builder().and_then(|b| Ok(b.tls_info(true).timeout(limit).build()?)) {
        Ok(c) => c,
        Err(e) => return Line::fail(check, format!("{e:#}"), "pass a PEM file of CA certificates with --ca-file"),
    };
    let response = match client.get(url.clone()).send().await {
        Ok(r) => r,
        Err(e) => {
            let text = error_chain(&e);
            let fix = if text.contains("certificate") || text.contains("Certificate") || text.contains("UnknownIssuer")
            {
                "trust the gateway's CA with --ca-file, or give the gateway a certificate for this host name (gateway.tls.existingSecret)"
            } else {
                "check --url (https or http, host, port) and that the gateway runs and is reachable from here"
            };
            return Line::fail(check, format!("no connection to {url}: {text}"), fix);
        }
    };
    if !https {
        let host = url.host_str().unwrap_or_default();
        let loopback = host == "localhost" || host.starts_with("127.") || host == "[::1]";
        return if loopback {
            Line::pass(check, "plain HTTP on loopback (the local mode)")
        } else {
            Line::warn(
                check,
                format!("{url} is plain HTTP: tokens cross the network unencrypted"),
                "serve the gateway over HTTPS (the chart does by default)",
            )
        };
    }
    const CHECK: &str = "gateway.tls";
    let Some(der) = response.extensions().get::<reqwest::tls::TlsInfo>().and_then(|i| i.peer_certificate()) else {
        return Line::pass(CHECK, "the chain and host name are valid");
    };
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return Line::warn(
            CHECK,
            "the chain and host name are valid, but the certificate could not be read",
            "none needed",
        );
    };
    let not_after = cert.validity().not_after;
    let left = cert.validity().time_to_expiration().map(|d| Duration::from_secs(d.whole_seconds().max(0) as u64));
    let subject = cert.subject().to_string();
    match left {
        Some(left) if left < EXPIRY_WARNING => Line::warn(
            CHECK,
            format!("the certificate ({subject}) expires in {} day(s), on {not_after}", left.as_secs() / 86400),
            "renew it (cert-manager renews before expiry; a chart-made certificate is renewed by `helm upgrade`)",
        ),
        Some(_) => Line::pass(CHECK, format!("chain and host name valid; {subject}, valid until {not_after}")),
        None => Line::fail(CHECK, format!("the certificate expired on {not_after}"), "renew the certificate"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_url_keeps_any_path_prefix() {
        let status = |u: &str| status_url(&reqwest::Url::parse(u).unwrap()).to_string();
        assert_eq!(status("https://h/mcp"), "https://h/status");
        assert_eq!(status("https://h:8443/toolsets/pricing/mcp"), "https://h:8443/status");
        assert_eq!(status("https://h/toolyard/mcp/"), "https://h/toolyard/status");
        assert_eq!(status("https://h/toolyard/toolsets/risk/mcp?x=1"), "https://h/toolyard/status");
    }
}

//! Checks of a gateway (or any MCP server) at `--url`: TLS chain, names and expiry; the
//! token; the MCP handshake in both protocol eras; the tools this identity may call; coding
//! tasks.

use std::time::Duration;

use rmcp::ClientLifecycleMode;
use rmcp::model::ProtocolVersion;

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
            let agent = names.contains(&"run_coding_task");
            lines.push(coding_tasks(&client, agent, require_agent, limit).await);
        }
    }
    let _ = client.cancel().await;
    lines
}

/// Which model profiles the gateway has, asked without starting a task: `run_coding_task`
/// with a profile name that cannot exist answers with the profiles there are (or that
/// there are none).
async fn coding_tasks(client: &crate::connect::Client, offered: bool, required: bool, limit: Duration) -> Line {
    const CHECK: &str = "coding-tasks";
    const FIX: &str = "configure a model profile on the gateway (chart value model.profiles; locally \
                       TOOLYARD_MODEL_BASE_URL and TOOLYARD_MODEL) and allow this identity `create codingtasks`";
    let missing = |detail: &str| if required { Line::fail(CHECK, detail, FIX) } else { Line::skip(CHECK, detail) };
    if !offered {
        return missing("run_coding_task is not offered to this identity");
    }
    let mut probe = serde_json::Map::new();
    probe.insert("task".into(), "toolyard check: profile probe (never runs)".into());
    probe.insert("model".into(), "toolyard-check-no-such-profile".into());
    let answer = match crate::call::call_tool(client, "run_coding_task", probe, Some(limit)).await {
        Ok(result) => crate::call::content_text(&result),
        Err(e) => return Line::fail(CHECK, format!("{e:#}"), "see the gateway's log"),
    };
    if let Some(list) = answer.split_once("(profiles: ").and_then(|(_, rest)| rest.strip_suffix(')')) {
        return Line::pass(
            CHECK,
            format!("model profile(s): {list} (whether the gateway reaches them is not reported yet)"),
        );
    }
    if answer.contains("no model profile") {
        return missing("the gateway has no model profile: coding tasks are refused");
    }
    Line::warn(
        CHECK,
        format!("unexpected answer to the profile probe: {answer}"),
        "compare the gateway's version with this binary's",
    )
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

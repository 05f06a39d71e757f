//! The embedded local mode's HTTP surface with raw requests, as a browser or a misbehaving
//! client sends them: `toolyard_gateway::local::start` on loopback with the real runner binary
//! and a shell tool (no cluster, no Python). Browser `Origin`s are refused unless listed (or the gateway's own loopback origin);
//! a `tools/call` whose params do not fit gets invalid params (-32602); a body sent too slowly
//! is cut off with 408 and frees its user's request slot; the data folder is the user's alone;
//! `/metrics` is served only on its own opt-in listener.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use toolyard_gateway::local::{LocalArgs, LocalGateway};
use toolyard_tests::local::{self, TempDir};
use toolyard_tests::repo_path;

const TOKEN: &str = "ty_local-http-test-token-0001";

/// `toolyard-gateway local` flags, parsed as the command line parses them.
#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    local: LocalArgs,
}

/// A folder with one Job-mode tool, `echo`, run by `/bin/sh` (the echo fixture's script).
fn echo_tools() -> TempDir {
    let dir = TempDir::new("local-http-tools");
    let script = repo_path("tests/fixtures/echo/echo.sh");
    let manifest = json!({
        "apiVersion": "toolyard.dev/v1alpha1",
        "kind": "McpTool",
        "metadata": {"name": "echo"},
        "spec": {
            "name": "echo",
            "description": "Echo the arguments.",
            "inputSchema": {"type": "object"},
            "runtime": {"image": "toolyard.local/unused:0", "command": ["/bin/sh", script.to_str().expect("utf-8")]},
        },
    });
    std::fs::write(dir.path().join("tools.yaml"), manifest.to_string()).expect("test setup");
    dir
}

/// A local gateway serving `tools` with its data in `data` and the extra `flags`.
async fn start(tools: &Path, data: &Path, flags: &[&str]) -> LocalGateway {
    let runner = local::binary("toolyard-runner");
    let mut argv = vec![
        "local".to_owned(),
        tools.to_str().expect("utf-8").to_owned(),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--token".into(),
        TOKEN.into(),
        "--data-dir".into(),
        data.to_str().expect("utf-8").to_owned(),
        "--runner".into(),
        runner.to_str().expect("utf-8").to_owned(),
    ];
    argv.extend(flags.iter().map(|f| (*f).to_owned()));
    let args = Cli::try_parse_from(argv).expect("flags parse").local;
    toolyard_gateway::local::start(args).await.expect("the local gateway starts")
}

/// A JSON-RPC POST to `url` with the local token and the headers of `extra`.
async fn post(url: &str, body: &Value, extra: &[(&str, &str)]) -> (u16, String) {
    let mut request = reqwest::Client::new()
        .post(url)
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body.to_string());
    for (name, value) in extra {
        request = request.header(*name, *value);
    }
    let response = request.send().await.expect("request");
    let status = response.status().as_u16();
    let mut body = response.text().await.unwrap_or_default();
    if body.len() > 400 {
        // Enough to tell answers apart in a failure message.
        body.truncate(body.floor_char_boundary(400));
    }
    (status, body)
}

fn list() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
}

fn call_echo() -> Value {
    json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "echo", "arguments": {"x": 1}}})
}

#[tokio::test]
async fn browser_origins_are_refused_unless_listed() {
    let tools = echo_tools();
    let data = TempDir::new("local-http-origin");
    let gateway = start(tools.path(), &data.path().join("data"), &[]).await;
    let url = gateway.mcp_url();

    let (status, body) = post(&url, &list(), &[]).await;
    assert_eq!(status, 200, "a request without Origin (a non-browser client) passes: {body}");
    let other_name = format!("http://localhost:{}", gateway.addr.port());
    for origin in ["http://evil.example", "http://localhost:6274", "null", &other_name] {
        for request in [list(), call_echo()] {
            let (status, body) = post(&url, &request, &[("origin", origin)]).await;
            assert_eq!(status, 403, "Origin {origin} is not listed: {request} -> {body}");
        }
    }
    // The gateway's own origin (the loopback Host the request was sent to) is not cross-origin.
    let own = format!("http://{}", gateway.addr);
    for request in [list(), call_echo()] {
        let (status, body) = post(&url, &request, &[("origin", &own)]).await;
        assert_eq!(status, 200, "the gateway's own origin {own} passes: {request} -> {body}");
    }
    gateway.shutdown().await.expect("shutdown");

    let listed = start(tools.path(), &data.path().join("data"), &["--allowed-origins", "http://localhost:6274"]).await;
    let url = listed.mcp_url();
    let (status, body) = post(&url, &list(), &[("origin", "http://localhost:6274")]).await;
    assert_eq!(status, 200, "a listed Origin passes: {body}");
    let (status, body) = post(&url, &call_echo(), &[("origin", "http://localhost:6274")]).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"echo\""), "the call ran: {body}");
    let (status, _) = post(&url, &list(), &[("origin", "http://localhost:6275")]).await;
    assert_eq!(status, 403, "the listed port only");
    listed.shutdown().await.expect("shutdown");
}

/// The protected resource metadata is made for the hosts the gateway serves only: a page
/// served from another host name (DNS rebinding) gets no document naming that host.
#[tokio::test]
async fn resource_metadata_is_made_for_allowed_hosts_only() {
    let tools = echo_tools();
    let data = TempDir::new("local-http-prm");
    let gateway = start(tools.path(), &data.path().join("data"), &[]).await;
    let http = reqwest::Client::new();
    let url = format!("http://{}/.well-known/oauth-protected-resource/mcp", gateway.addr);
    let ours: serde_json::Value = http.get(&url).send().await.expect("get").json().await.expect("json");
    assert_eq!(ours["resource"], format!("http://{}/mcp", gateway.addr), "{ours}");
    let foreign = http.get(&url).header("host", "rebound.attacker.example").send().await.expect("get");
    assert_eq!(foreign.status(), 400);
    let text = foreign.text().await.expect("text");
    assert!(!text.contains("attacker"), "{text}");
    gateway.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn tools_call_with_misshapen_params_gets_invalid_params() {
    let tools = echo_tools();
    let data = TempDir::new("local-http-params");
    let gateway = start(tools.path(), data.path(), &[]).await;
    let url = gateway.mcp_url();
    let call = |params: Option<Value>| {
        let mut request = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call"});
        if let Some(params) = params {
            request["params"] = params;
        }
        request
    };
    for request in [
        call(Some(json!({"arguments": {"x": 1}}))),
        call(Some(json!({"name": "echo", "arguments": [1]}))),
        call(Some(json!({"name": "echo", "arguments": "x"}))),
        call(Some(json!({"name": 5}))),
        call(None),
    ] {
        for version in [None, Some("2025-11-25"), Some("2025-06-18")] {
            let headers: Vec<(&str, &str)> = version.map(|v| ("mcp-protocol-version", v)).into_iter().collect();
            let (status, body) = post(&url, &request, &headers).await;
            let answer: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{request}: {e}: {body}"));
            assert_eq!(answer["error"]["code"], -32602, "{request} ({version:?}) -> {status} {body}");
            assert_eq!(answer["id"], 7, "{body}");
        }
    }
    let unknown = json!({"jsonrpc": "2.0", "id": 8, "method": "tools/explode", "params": {}});
    let (_, body) = post(&url, &unknown, &[]).await;
    let answer: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(answer["error"]["code"], -32601, "an unknown method is still not found: {body}");
    gateway.shutdown().await.expect("shutdown");
}

/// What the server sent on `stream` until it closed the connection.
async fn read_until_closed(stream: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return String::from_utf8_lossy(&got).into_owned(),
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

#[tokio::test]
async fn a_body_sent_too_slowly_is_cut_off_and_frees_the_users_slot() {
    let tools = echo_tools();
    let data = TempDir::new("local-http-slow");
    let gateway = start(tools.path(), data.path(), &["--body-read-timeout-seconds", "5"]).await;
    let url = gateway.mcp_url();

    // As many requests as one user may have in flight (64 by default), each authenticated and
    // admitted, then stalled after the first byte of its body.
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: 100\r\n\r\n{{",
        gateway.addr
    );
    let mut slow = Vec::new();
    for _ in 0..64 {
        let mut stream = TcpStream::connect(gateway.addr).await.expect("connect");
        stream.write_all(head.as_bytes()).await.expect("send");
        slow.push(stream);
    }
    toolyard_tests::wait_until(Duration::from_secs(5), "the stalled requests hold every slot of the user", || {
        let url = url.clone();
        async move { Ok(post(&url, &list(), &[]).await.0 == 429) }
    })
    .await
    .expect("the user is at the limit");

    for stream in &mut slow {
        // A bound for a hang, not a speed check.
        let answer = tokio::time::timeout(Duration::from_secs(60), read_until_closed(stream))
            .await
            .expect("the stalled request is cut off");
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    }
    let (status, body) = post(&url, &list(), &[]).await;
    assert_eq!(status, 200, "the slots are free again: {body}");
    gateway.shutdown().await.expect("shutdown");
}

/// Every entry under `dir` (not following links), `dir` first.
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut found = vec![dir.to_owned()];
    let mut i = 0;
    while i < found.len() {
        if std::fs::symlink_metadata(&found[i]).expect("entry").is_dir() {
            let mut children: Vec<PathBuf> =
                std::fs::read_dir(&found[i]).expect("folder").map(|e| e.expect("entry").path()).collect();
            children.sort();
            found.extend(children);
        }
        i += 1;
    }
    found
}

#[tokio::test]
async fn the_data_folder_and_every_file_in_it_are_private_to_the_user() {
    let tools = echo_tools();
    let base = TempDir::new("local-http-private");
    let data = base.path().join("data");
    std::fs::create_dir(&data).expect("test setup");
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).expect("test setup");

    let gateway = start(tools.path(), &data, &[]).await;
    let (status, body) = post(&gateway.mcp_url(), &call_echo(), &[]).await;
    assert!(status == 200 && body.contains("\"echo\""), "the call ran: {status} {body}");
    gateway.shutdown().await.expect("shutdown");

    let entries = tree(&data);
    assert!(entries.iter().any(|p| p.ends_with("result.json")), "the call's files are there: {entries:?}");
    for path in entries {
        let meta = std::fs::symlink_metadata(&path).expect("entry");
        let (mode, want) = (meta.mode() & 0o777, if meta.is_dir() { 0o700 } else { 0o600 });
        assert_eq!(mode, want, "{} has mode {mode:o}", path.display());
    }

    if nix::unistd::geteuid().is_root() {
        // A folder of another user (a shared or planted one) is refused, not used.
        std::os::unix::fs::chown(&data, Some(4242), Some(4242)).expect("test setup");
        let args = Cli::try_parse_from([
            "local",
            tools.path().to_str().expect("utf-8"),
            "--data-dir",
            data.to_str().expect("utf-8"),
            "--runner",
            local::binary("toolyard-runner").to_str().expect("utf-8"),
        ])
        .expect("flags parse")
        .local;
        let e = toolyard_gateway::local::start(args).await.expect_err("another user's folder").to_string();
        assert!(e.contains("belongs to user id 4242"), "{e}");
    }
}

#[tokio::test]
async fn metrics_are_served_only_on_their_own_listener() {
    let tools = echo_tools();
    let data = TempDir::new("local-http-metrics");
    let http = reqwest::Client::new();

    let gateway = start(tools.path(), data.path(), &[]).await;
    assert_eq!(gateway.metrics_addr, None, "no metrics listener unless asked for");
    let base = format!("http://{}", gateway.addr);
    let metrics = http.get(format!("{base}/metrics")).send().await.expect("request");
    assert_eq!(metrics.status(), 404, "no unauthenticated metrics on the MCP listener");
    let with_token = http.get(format!("{base}/metrics")).bearer_auth(TOKEN).send().await.expect("request");
    assert_eq!(with_token.status(), 404);
    assert_eq!(http.get(format!("{base}/healthz")).send().await.expect("request").status(), 200);
    gateway.shutdown().await.expect("shutdown");

    let gateway = start(tools.path(), data.path(), &["--metrics-listen", "127.0.0.1:0"]).await;
    let ops = gateway.metrics_addr.expect("the metrics listener");
    let (status, _) = post(&gateway.mcp_url(), &call_echo(), &[]).await;
    assert_eq!(status, 200);
    let text = http.get(format!("http://{ops}/metrics")).send().await.expect("request").text().await.expect("text");
    assert!(text.contains("toolyard_gateway_tool_calls_total{tool=\"echo\""), "{text}");
    let public = http.get(format!("http://{}/metrics", gateway.addr)).send().await.expect("request");
    assert_eq!(public.status(), 404, "still not on the MCP listener");
    gateway.shutdown().await.expect("shutdown");
}

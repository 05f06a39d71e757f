//! The gateway's HTTP surface with raw requests: bad input of every kind, authentication
//! challenges, DNS-rebinding protection, the ops endpoints, and graceful shutdown.

use crate::gateway_support;

use std::sync::Arc;
use std::time::Duration;

use gateway_support::{
    Behaviour, FakePlatform, Gateway, Options, create_tool, grant_call, grant_platform, post_raw, spec, toolcalls,
};
use serde_json::{Value, json};
use tokio::sync::Notify;
use toolyard_tests::{TestEnv, User, wait_until};

async fn setup(prefix: &str, options: Options) -> (String, Gateway) {
    let env = TestEnv::get();
    env.install_crds().await.expect("CRDs");
    let ns = env.namespace(prefix).await.expect("namespace");
    grant_platform(&ns).await;
    create_tool(&ns, "echo", spec("echo", 60), true).await;
    grant_call(&ns, "alice-calls", &[], &["alice"], &[]).await;
    gateway_support::wait_allowed("alice", &[], &ns, "toolyard.dev", "mcptools", "call", Some("echo")).await;
    let gw = Gateway::start(std::slice::from_ref(&ns), options).await;
    (ns, gw)
}

fn alice() -> String {
    TestEnv::get().token(User::Alice).to_owned()
}

fn jsonrpc_error(body: &str) -> Value {
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"));
    v.get("error").cloned().unwrap_or_else(|| panic!("no error in {v}"))
}

#[tokio::test]
async fn malformed_and_misshapen_requests_get_clear_errors_and_create_nothing() {
    let (ns, gw) = setup("gwbad", Options::default()).await;
    let url = gw.mcp_url();
    let token = alice();

    let (status, _, body) = post_raw(&url, Some(&token), "{not json", "application/json").await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(jsonrpc_error(&body)["code"], -32700, "parse error: {body}");

    for shape in [
        json!({"jsonrpc": "2.0", "id": 1, "method": 5}),
        json!({"jsonrpc": "1.0", "id": 1, "method": "tools/list"}),
        json!([1, 2, 3]),
        json!("tools/list"),
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"arguments": {"x": 1}}}),
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo", "arguments": [1]}}),
    ] {
        let (status, _, body) = post_raw(&url, Some(&token), shape.to_string(), "application/json").await;
        assert!(status == 400 || status == 200, "{shape} -> {status} {body}");
        let error = jsonrpc_error(&body);
        assert!(error["code"].as_i64().is_some_and(|c| (-32700..=-32600).contains(&c)), "{shape} -> {body}");
    }

    let (status, _, body) = post_raw(&url, Some(&token), "{}", "text/plain").await;
    assert_eq!(status, 415, "{body}");

    // An unknown method is answered, not crashed on.
    let unknown = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/explode", "params": {}});
    let (_, _, body) = post_raw(&url, Some(&token), unknown.to_string(), "application/json").await;
    assert!(jsonrpc_error(&body)["code"].as_i64().is_some(), "{body}");

    // Names that try to walk paths are just unknown tools; nothing reaches storage.
    for name in ["../../etc/passwd", "echo/../echo", "calls/x", "e\u{0}cho"] {
        let req =
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": name, "arguments": {"x": 1}}});
        let (_, _, body) = post_raw(&url, Some(&token), req.to_string(), "application/json").await;
        let error = jsonrpc_error(&body);
        assert!(error["message"].as_str().is_some_and(|m| m.starts_with("Unknown tool")), "{name:?} -> {body}");
    }
    for path in ["/toolsets/..%2F..%2Fetc/mcp", "/toolsets/UPPER/mcp", "/toolsets/a_b/mcp"] {
        let (status, _, _) = post_raw(&format!("{}{path}", gw.base), Some(&token), "{}", "application/json").await;
        assert_eq!(status, 404, "{path}");
    }
    assert!(toolcalls(&ns).await.is_empty(), "no bad request created a ToolCall");
}

#[tokio::test]
async fn oversized_bodies_are_refused_before_anything_runs() {
    let mut options = Options::default();
    options.settings.limits.max_body_bytes = 64 * 1024;
    let (ns, gw) = setup("gwbig", options).await;
    let big = "x".repeat(100 * 1024);
    let req = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo", "arguments": {"x": 1, "label": big}}});
    let (status, _, _) = post_raw(&gw.mcp_url(), Some(&alice()), req.to_string(), "application/json").await;
    assert_eq!(status, 413, "declared length above the cap");
    // The same body streamed without a Content-Length is cut off while reading.
    let chunks: Vec<Result<String, std::io::Error>> = vec![Ok(req.to_string())];
    let stream = reqwest::Body::wrap_stream(futures::stream::iter(chunks));
    let (status, _, _) = post_raw(&gw.mcp_url(), Some(&alice()), stream, "application/json").await;
    assert_eq!(status, 413, "chunked body above the cap");
    assert!(toolcalls(&ns).await.is_empty());
    let metrics = reqwest::get(format!("{}/metrics", gw.base)).await.unwrap().text().await.unwrap();
    assert!(metrics.contains("toolyard_gateway_admission_rejections_total{reason=\"body_too_large\"} 2"), "{metrics}");
}

#[tokio::test]
async fn missing_or_bad_credentials_get_a_bearer_challenge() {
    let (_ns, gw) = setup("gwauth", Options::default()).await;
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string();
    let (status, headers, _) = post_raw(&gw.mcp_url(), None, list.clone(), "application/json").await;
    assert_eq!(status, 401);
    let challenge = headers.get("www-authenticate").expect("challenge").to_str().unwrap().to_owned();
    assert!(challenge.starts_with("Bearer ") && challenge.contains("resource_metadata="), "{challenge}");
    let (status, headers, _) =
        post_raw(&gw.mcp_url(), Some("not-a-valid-token-1234"), list.clone(), "application/json").await;
    assert_eq!(status, 401);
    assert!(headers.get("www-authenticate").unwrap().to_str().unwrap().contains("invalid_token"));
    // The metadata the challenge points at is served without credentials.
    let url = challenge.split("resource_metadata=\"").nth(1).and_then(|r| r.split('"').next()).expect("url").to_owned();
    let doc: Value = reqwest::get(&url).await.expect("metadata").json().await.expect("json");
    assert!(doc["resource"].as_str().is_some_and(|r| r.ends_with("/mcp")), "{doc}");
}

#[tokio::test]
async fn foreign_host_headers_are_refused() {
    let (_ns, gw) = setup("gwhost", Options::default()).await;
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string();
    let response = reqwest::Client::new()
        .post(gw.mcp_url())
        .header("host", "attacker.example")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .bearer_auth(alice())
        .body(list)
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 403, "DNS rebinding protection: only configured hosts");
}

#[tokio::test]
async fn ops_endpoints_report_health_readiness_and_metrics() {
    let (_ns, gw) = setup("gwops", Options::default()).await;
    let _platform = FakePlatform::start(&gw.namespaces[0], &gw.internal).await;
    let get = |path: &str| {
        let url = format!("{}{path}", gw.base);
        async move {
            let r = reqwest::get(url).await.expect("get");
            (r.status().as_u16(), r.text().await.unwrap_or_default())
        }
    };
    assert_eq!(get("/healthz").await.0, 200);
    assert_eq!(get("/readyz").await, (200, "ready\n".to_owned()));
    let client = gw.client(User::Alice).await;
    client
        .call_tool(
            rmcp::model::CallToolRequestParams::new("echo")
                .with_arguments(json!({"x": 1}).as_object().unwrap().clone()),
        )
        .await
        .expect("call");
    let (status, metrics) = get("/metrics").await;
    assert_eq!(status, 200);
    for needle in [
        "toolyard_gateway_tool_calls_total{tool=\"echo\",outcome=\"success\"} 1",
        "toolyard_gateway_tool_call_duration_seconds_count{tool=\"echo\"} 1",
        "toolyard_gateway_mcp_requests_total{method=\"tools/call\",outcome=\"ok\"} 1",
        "toolyard_gateway_http_requests_total{route=\"/mcp\",method=\"POST\",status=\"200\"}",
        "toolyard_gateway_tool_calls_in_flight 0",
    ] {
        assert!(metrics.contains(needle), "missing {needle:?} in\n{metrics}");
    }
    client.cancel().await.ok();
}

#[tokio::test]
async fn shutdown_finishes_in_flight_calls_and_refuses_new_ones() {
    let (ns, mut gw) = setup("gwstop", Options::default()).await;
    let mut platform = FakePlatform::start(&ns, &gw.internal).await;
    let release = Arc::new(Notify::new());
    platform.set("echo", Behaviour::HoldThenEcho(release.clone()));
    let client = Arc::new(gw.client(User::Alice).await);
    let in_flight = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .call_tool(
                    rmcp::model::CallToolRequestParams::new("echo")
                        .with_arguments(json!({"x": 1}).as_object().unwrap().clone()),
                )
                .await
        })
    };
    platform.next().await;
    gw.tokens.trigger.cancel();
    // Readiness fails at once so the Service stops sending traffic.
    wait_until(Duration::from_secs(5), "shutdown started", || {
        let app = gw.tokens.app.clone();
        async move { Ok(app.is_cancelled()) }
    })
    .await
    .expect("shutdown");
    assert!(gw.state.readiness().await.is_err());
    // The in-flight call still completes.
    release.notify_one();
    let result = in_flight.await.expect("join").expect("the in-flight call finished");
    assert_eq!(result.is_error, Some(false));
    let server = gw.server.take().expect("server");
    tokio::time::timeout(Duration::from_secs(20), server)
        .await
        .expect("server stopped")
        .expect("join")
        .expect("clean stop");
    // Nothing listens any more.
    let after = reqwest::Client::new().post(gw.mcp_url()).body("{}").send().await;
    assert!(after.is_err(), "new connections are refused after shutdown");
}

/// POSTs `body` with the given `Accept` header and protocol revision (none when `None`).
async fn post_with(url: &str, token: &str, accept: &str, version: Option<&str>, body: &str) -> (u16, String) {
    let mut request = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", accept)
        .bearer_auth(token)
        .body(body.to_owned());
    if let Some(v) = version {
        request = request.header("mcp-protocol-version", v);
    }
    let response = request.send().await.expect("request");
    let status = response.status().as_u16();
    (status, response.text().await.expect("body"))
}

/// The plain `tools/list` and `tools/call` requests the gateway answers on its direct path
/// (see gateway/src/mcp/direct.rs) get exactly the answer rmcp's service gives. An `Accept`
/// entry with a quality weight is one of the shapes the direct path leaves to rmcp, so each
/// request is sent both ways and the answers must be equal: results, tool errors, invalid
/// arguments, unknown tools, string and number ids, with and without a revision, and the
/// bodies at the edge of what the direct path reads (extra, repeated and escaped keys, a
/// `result` or `error` key, `_meta`, odd ids and params).
#[tokio::test]
async fn the_direct_path_answers_exactly_as_rmcp_does() {
    let (ns, gw) = setup("gwdirect", Options::default()).await;
    create_tool(&ns, "fails", spec("fails", 60), true).await;
    grant_call(&ns, "alice-fails", &[], &["alice"], &[]).await;
    let platform = FakePlatform::start(&ns, &gw.internal).await;
    platform.set("fails", Behaviour::ToolError("volatility must be positive".into()));
    let url = gw.mcp_url();
    let token = alice();
    wait_until(Duration::from_secs(30), "both tools listed", || {
        let (url, token) = (url.clone(), token.clone());
        async move {
            let list = r#"{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}"#;
            let (_, body) = post_with(&url, &token, "application/json, text/event-stream", None, list).await;
            Ok(body.contains("\"fails\"") && body.contains("\"echo\""))
        }
    })
    .await
    .expect("tools listed");

    let call = |id: &str, name: &str, arguments: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{name}","arguments":{arguments}}}}}"#
        )
    };
    let requests: Vec<String> = vec![
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#.into(),
        r#"{"jsonrpc":"2.0","id":"list-2","method":"tools/list","params":{}}"#.into(),
        call("3", "echo", r#"{"x":1.5,"label":"direct"}"#),
        call(r#""four""#, "fails", r#"{"x":1}"#),
        call("5", "echo", r#"{"x":"not a number"}"#),
        call("6", "echo", r#"{"x":1,"extra":true}"#),
        call("7", "no-such-tool", r#"{"x":1}"#),
        call("8", "../../etc/passwd", "{}"),
        r#"{"jsonrpc":"2.0","id":9,"method":"tools/list","params":{"cursor":"not-a-cursor"}}"#.into(),
        r#"{"jsonrpc":"2.0","id":10,"method":"tools/list","params":null}"#.into(),
        r#"{"jsonrpc":"2.0","id":11,"method":"tools/list","params":{"_meta":{"progressToken":"p"}}}"#.into(),
        r#"{"method":"tools/list","extra":[1,{"id":2}],"id":12,"jsonrpc":"2.0"}"#.into(),
        r#"{"jsonrpc":"2.0","id":13,"method":"tools/list","result":{}}"#.into(),
        r#"{"jsonrpc":"2.0","id":14,"method":"tools/list","error":null}"#.into(),
        r#"{"jsonrpc":"2.0","id":15,"method":"tools/list","id":16}"#.into(),
        r#"{"jsonrpc":"2.0","id":17,"method":"tools/list","method":"tools/call"}"#.into(),
        r#"{"jsonrpc":"2.0","id":18,"\u006dethod":"tools/list"}"#.into(),
        r#"{"jsonrpc":"2.0","id":19,"method":"tools\/list"}"#.into(),
        r#"{"jsonrpc":"1.0","id":20,"method":"tools/list"}"#.into(),
        r#"{"jsonrpc":"2.0","id":null,"method":"tools/list"}"#.into(),
        r#"{"jsonrpc":"2.0","id":21.5,"method":"tools/list"}"#.into(),
        r#"{"jsonrpc":"2.0","id":22,"method":"tools/call","params":"oops"}"#.into(),
        r#"{"jsonrpc":"2.0","id":23,"method":"tools/call","params":{"name":"no-such-tool","arguments":{},"_meta":{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}}"#.into(),
        r#"{"jsonrpc":"2.0","id":24,"method":"tools/call","params":{"name":"echo","arguments":{"x":"bad"},"params":1}}"#.into(),
        r#"{"jsonrpc":"2.0","id":25,"method":"ping"}"#.into(),
        r#"[{"jsonrpc":"2.0","id":26,"method":"tools/list"}]"#.into(),
    ];
    for version in [Some("2025-11-25"), Some("2025-06-18"), None] {
        for request in &requests {
            let direct = post_with(&url, &token, "application/json, text/event-stream", version, request).await;
            let rmcp = post_with(&url, &token, "application/json;q=1, text/event-stream", version, request).await;
            assert_eq!(direct.0, rmcp.0, "status of {request} ({version:?}): {} vs {}", direct.1, rmcp.1);
            // JSON answers compare as JSON (key order aside), anything else as text; each call
            // has its own id (checked to be there, then left out).
            let parse = |body: &str| {
                let mut v = serde_json::from_str::<Value>(body).unwrap_or_else(|_| Value::String(body.into()));
                if let Some(meta) = v.pointer_mut("/result/_meta").and_then(Value::as_object_mut) {
                    let id = meta.remove(toolyard_gateway::mcp::CALL_ID_META);
                    assert!(id.as_ref().is_some_and(Value::is_string), "a call id: {body}");
                }
                v
            };
            assert_eq!(parse(&direct.1), parse(&rmcp.1), "{request} ({version:?})");
        }
    }
    // The answers are the real ones, not two equal failures.
    let (_, body) = post_with(&url, &token, "application/json, text/event-stream", None, &requests[2]).await;
    let v: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(v["id"], 3);
    assert_eq!(v["result"]["structuredContent"]["echo"]["x"], 1.5, "{v}");
    let (_, body) = post_with(&url, &token, "application/json, text/event-stream", None, &requests[3]).await;
    let v: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(v["result"]["isError"], true, "{v}");
    assert_eq!(v["result"]["content"][0]["text"], "volatility must be positive", "{v}");
    // The valid echo call created a ToolCall on each revision and path (and once more just
    // above); the invalid ones created none.
    let echo_calls = toolcalls(&ns).await.iter().filter(|c| c.spec.tool == "echo").count();
    assert_eq!(echo_calls, 3 * 2 + 1, "only valid echo calls create ToolCalls");
}

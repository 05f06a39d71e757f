//! Upstream MCP servers (McpServer manifests) in the embedded local mode: the official Python
//! SDK's server (`tests/fixtures/python/upstream_server.py`) behind the gateway, driven by a
//! real MCP client (rmcp over Streamable HTTP).

use crate::local_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rmcp::model::{
    ArgumentInfo, CallToolRequest, CallToolRequestParams, CallToolResponse, CallToolResult, ClientCapabilities,
    ClientConfig, ClientRequest, CompleteRequestParams, GetPromptRequestParams, Implementation,
    ProgressNotificationParam, ProtocolVersion, Reference, ServerNotification, SubscriptionFilter,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, ClientLifecycleMode, ClientServiceExt, RoleClient};
use serde_json::{Value, json};
use toolyard_api::mcpserver::ConnectionState;
use toolyard_gateway::serve::DataArgs;
use toolyard_tests::legacy::LegacySession;
use toolyard_tests::local::TempDir;
use toolyard_tests::repo_path;
use toolyard_tests::upstream::{EverythingServer, ServerProcess, UpstreamServer, free_port};

const TOKEN: &str = "ty_local-upstream-test-token-01";

/// A client that counts progress notifications (and, through its subscription,
/// `tools/list_changed`) and keeps the log messages it hears as `(logger, data)`.
#[derive(Clone, Default)]
struct Counting {
    list_changed: Arc<AtomicUsize>,
    progress: Arc<AtomicUsize>,
    logs: Arc<std::sync::Mutex<Vec<Heard>>>,
}

/// A log message heard: its logger and data.
type Heard = (Option<String>, Value);

impl Counting {
    /// The log messages heard so far, once `n` have come (rmcp hands each to the handler on a
    /// task of its own, so the last may follow the answer), or after 10 s.
    async fn logs_once(&self, n: usize) -> Vec<Heard> {
        for _ in 0..100 {
            if self.heard().len() >= n {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        std::mem::take(&mut *self.heard())
    }

    fn heard(&self) -> std::sync::MutexGuard<'_, Vec<Heard>> {
        self.logs.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl ClientHandler for Counting {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(ClientCapabilities::default(), Implementation::new("upstream-test", "1"))
    }

    async fn on_progress(&self, _params: ProgressNotificationParam, _context: NotificationContext<RoleClient>) {
        self.progress.fetch_add(1, Ordering::SeqCst);
    }

    #[allow(deprecated)]
    async fn on_logging_message(
        &self,
        params: rmcp::model::LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.heard().push((params.logger, params.data));
    }
}

struct Setup {
    gateway: local_support::Running,
    client: RunningService<RoleClient, Counting>,
    counts: Counting,
    _dir: TempDir,
    _data: TempDir,
}

impl Setup {
    /// The local mode on McpServer manifests for these `(name, port)` servers, pinging them
    /// every second, reconnecting after 1, 2, then 3 s, and giving a call `timeout` seconds.
    async fn start(servers: &[(&str, u16)], timeout: u32) -> Self {
        Self::start_with(servers, timeout, false).await
    }

    /// [`Setup::start`], with the pricing example's functions too when `pricing`.
    async fn start_with(servers: &[(&str, u16)], timeout: u32, pricing: bool) -> Self {
        let specs: Vec<(&str, String)> = servers
            .iter()
            .map(|(name, port)| (*name, format!("url: http://127.0.0.1:{port}/mcp\ntimeoutSeconds: {timeout}")))
            .collect();
        Self::start_specs(&specs, pricing).await
    }

    /// The local mode on McpServers named and specified (`spec:`, as YAML lines) as given,
    /// reconnecting after 1, 2, then 3 s; with the pricing example's functions when `pricing`.
    async fn start_specs(servers: &[(&str, String)], pricing: bool) -> Self {
        Self::start_specs_with(servers, pricing, DataArgs::default()).await
    }

    /// [`Setup::start_specs`] with these storage quota and retention settings.
    async fn start_specs_with(servers: &[(&str, String)], pricing: bool, data_args: DataArgs) -> Self {
        let dir = TempDir::new("upstream-manifests");
        if pricing {
            let text = std::fs::read_to_string(repo_path("examples/pricing/tools.yaml")).expect("pricing manifests");
            let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("pricing manifests parse");
            let docs: Vec<String> = docs
                .into_iter()
                .map(|mut d| {
                    d["spec"]["runtime"]["workingDir"] = json!(repo_path("examples/pricing"));
                    d.to_string()
                })
                .collect();
            std::fs::write(dir.path().join("pricing.yaml"), docs.join("\n---\n")).expect("manifests written");
        }
        for (name, spec) in servers {
            let spec: String = spec.lines().map(|l| format!("  {l}\n")).collect();
            let manifest = format!(
                "apiVersion: toolyard.dev/v1alpha1\nkind: McpServer\nmetadata: {{name: {name}}}\nspec:\n{spec}  reconnectDelaysSeconds: [1, 2, 3]\n"
            );
            std::fs::write(dir.path().join(format!("{name}.yaml")), manifest).expect("manifest written");
        }
        let data = TempDir::new("upstream-data");
        let mut args = local_support::args(dir.path().to_owned(), &data, TOKEN, 4, data_args);
        args.upstream.upstream_ping_seconds = 1;
        args.upstream.upstream_connect_timeout_seconds = 2;
        let gateway = local_support::start_args(args).await;
        let counts = Counting::default();
        let config = StreamableHttpClientTransportConfig::with_uri(gateway.mcp_url())
            .auth_header(TOKEN.to_owned())
            .custom_headers(
                [(
                    http::HeaderName::from_static("traceparent"),
                    http::HeaderValue::from_static("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
                )]
                .into(),
            );
        // A 2026-07-28 client: it hears of list changes through `subscriptions/listen`.
        let lifecycle = ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] };
        let client = counts
            .clone()
            .serve_with_lifecycle(StreamableHttpClientTransport::from_config(config), lifecycle)
            .await
            .expect("MCP client connects");
        let mut subscription = client
            .listen(SubscriptionFilter::builder().tools_list_changed().build())
            .await
            .expect("subscriptions/listen");
        let heard = counts.list_changed.clone();
        tokio::spawn(async move {
            while let Ok(Some(note)) = subscription.next().await {
                if matches!(note, ServerNotification::ToolListChangedNotification(_)) {
                    heard.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
        Self { gateway, client, counts, _dir: dir, _data: data }
    }

    async fn tool_names(&self) -> Vec<String> {
        let tools = self.client.list_all_tools().await.expect("tools/list");
        tools.into_iter().map(|t| t.name.to_string()).collect()
    }

    /// Waits (up to a minute: a loaded machine slows the servers' start) until `tools/list`
    /// does (`present`) or does not show `name`.
    async fn wait_listed(&self, name: &str, present: bool) {
        for _ in 0..600 {
            if self.tool_names().await.iter().any(|n| n == name) == present {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let connections = self.gateway.upstreams.connections();
        panic!("{name} listed: expected {present}; tools: {:?}; connections: {connections:?}", self.tool_names().await);
    }

    async fn call(&self, tool: &str, arguments: Value) -> CallToolResult {
        let params = CallToolRequestParams::new(tool.to_owned())
            .with_arguments(arguments.as_object().expect("test setup").clone());
        self.client.call_tool(params).await.unwrap_or_else(|e| panic!("tools/call {tool}: {e}"))
    }
}

fn text(result: &CallToolResult) -> String {
    result.content.iter().filter_map(|c| c.as_text().map(|t| t.text.clone())).collect::<Vec<_>>().join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_upstream_servers_tools_are_served_prefixed_with_their_answers_unchanged() {
    let markers = TempDir::new("upstream-markers");
    let port = free_port();
    let _server = UpstreamServer::start(port, markers.path());
    let setup = Setup::start(&[("market-data", port)], 30).await;
    setup.wait_listed("market_data_get_quote", true).await;
    let names = setup.tool_names().await;
    for tool in ["get_quote", "snapshot", "whoami", "slow", "add_tool"] {
        assert!(names.contains(&format!("market_data_{tool}")), "{tool} is served prefixed: {names:?}");
    }
    let listed = setup.client.list_all_tools().await.expect("tools/list");
    let quote = listed.iter().find(|t| t.name == "market_data_get_quote").expect("listed");
    assert_eq!(quote.description.as_deref(), Some("Last price of a ticker."));
    assert_eq!(quote.input_schema["required"], json!(["ticker"]), "the upstream's schema is served");

    // Structured content and tool errors come back as the server sent them.
    let ok = setup.call("market_data_get_quote", json!({"ticker": "ACME"})).await;
    assert_eq!(ok.structured_content, Some(json!({"ticker": "ACME", "price": 12.5})));
    assert_ne!(ok.is_error, Some(true));
    let unknown = setup.call("market_data_get_quote", json!({"ticker": "NOPE"})).await;
    assert_eq!(unknown.is_error, Some(true));
    assert!(text(&unknown).contains("no such ticker: NOPE"), "{unknown:?}");
    // The gateway checks arguments against the upstream's schema before sending anything.
    let invalid = setup.call("market_data_get_quote", json!({})).await;
    assert_eq!(invalid.is_error, Some(true));
    assert!(text(&invalid).starts_with("invalid arguments"), "{invalid:?}");

    // Every content type passes through.
    let snapshot = serde_json::to_value(setup.call("market_data_snapshot", json!({})).await).expect("json");
    let kinds: Vec<&str> =
        snapshot["content"].as_array().expect("content").iter().filter_map(|c| c["type"].as_str()).collect();
    assert_eq!(kinds, ["text", "image", "audio", "resource_link", "resource"], "{snapshot}");
    assert_eq!(snapshot["content"][1]["mimeType"], "image/png");
    assert_eq!(snapshot["content"][3]["uri"], "file:///quotes/acme.csv");
    assert_eq!(snapshot["content"][4]["resource"]["text"], "day,price\n1,3.25\n");

    // The server gets the caller's trace, never the caller's token.
    let who = setup.call("market_data_whoami", json!({})).await;
    let who = who.structured_content.expect("structured");
    assert_eq!(who["authorization"], Value::Null, "the caller's token stays at the gateway: {who}");
    let traceparent = who["traceparent"].as_str().expect("a traceparent reaches the server");
    assert!(traceparent.starts_with("00-0af7651916cd43dd8448eb211c80319c-"), "same trace: {traceparent}");

    // Progress reaches the caller; a cancellation reaches the server.
    let params = CallToolRequestParams::new("market_data_slow")
        .with_arguments(json!({"seconds": 30}).as_object().unwrap().clone());
    let handle = setup
        .client
        .send_cancellable_request(
            ClientRequest::CallToolRequest(CallToolRequest::new(params)),
            PeerRequestOptions::no_options(),
        )
        .await
        .expect("sent");
    for _ in 0..200 {
        if setup.counts.progress.load(Ordering::SeqCst) >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(setup.counts.progress.load(Ordering::SeqCst) >= 2, "the server's progress reaches the caller");
    handle.cancel(Some("test".into())).await.expect("cancel sent");
    assert!(cancelled(&markers).await, "the caller's cancellation reaches the server");

    // A tool the server adds is served once it says its list changed, and clients are told.
    let before = setup.counts.list_changed.load(Ordering::SeqCst);
    let added = setup.call("market_data_add_tool", json!({"name": "late-tool"})).await;
    assert_eq!(text(&added), "added");
    setup.wait_listed("market_data_late_tool", true).await;
    assert!(setup.counts.list_changed.load(Ordering::SeqCst) > before, "clients hear that the list changed");
    let late = setup.call("market_data_late_tool", json!({})).await;
    assert_eq!(text(&late), "late-tool answers");

    // Its prompts are served prefixed, taken from the server with their arguments.
    let prompts = setup.client.list_all_prompts().await.expect("prompts/list");
    let summary = prompts.iter().find(|p| p.name == "market_data_market_summary").expect("the prompt is listed");
    let arguments: Vec<(&str, Option<bool>)> =
        summary.arguments.iter().flatten().map(|a| (a.name.as_str(), a.required)).collect();
    assert_eq!(arguments, [("ticker", Some(true)), ("horizon", Some(false))], "{summary:?}");
    let mut get = GetPromptRequestParams::new("market_data_market_summary");
    get.arguments = json!({"ticker": "ACME", "horizon": "1w"}).as_object().cloned();
    let got = serde_json::to_value(setup.client.get_prompt(get).await.expect("prompts/get")).expect("json");
    assert_eq!(got["messages"][0]["content"]["text"], "Summarize the market for ACME over 1w.", "{got}");
    let missing = setup.client.get_prompt(GetPromptRequestParams::new("market_data_market_summary")).await;
    assert!(missing.is_err_and(|e| e.to_string().contains("missing required arguments: ticker")));
    let unknown = setup.client.get_prompt(GetPromptRequestParams::new("market_data_nothing")).await;
    assert!(unknown.is_err_and(|e| e.to_string().contains("Unknown prompt")));
    // Its arguments complete from the server, asked under the prompt's name there.
    let complete = |prompt: &str, value: &str| {
        CompleteRequestParams::new(Reference::for_prompt(prompt), ArgumentInfo::new("ticker", value))
    };
    let suggested = setup.client.complete(complete("market_data_market_summary", "a")).await.expect("completion");
    assert_eq!(suggested.completion.values, ["ACME"]);
    let unknown = setup.client.complete(complete("market_data_nothing", "a")).await;
    assert!(unknown.is_err_and(|e| e.to_string().contains("Unknown prompt")));

    let connections = setup.gateway.upstreams.connections();
    let c = &connections["market-data"];
    assert_eq!((c.state, c.tools, c.failures), (ConnectionState::Connected, 11, 0), "{c:?}");

    // Each proxied call's files are stored under the caller's prefix, like a function's: its
    // input, its result (the server's answer in `mcp`) and its event log.
    let calls = stored_calls(setup._data.path());
    let quote = calls.iter().find(|c| c.0.contains("\"ticker\":\"ACME\"") && c.1.contains("12.5"));
    let (_, result, log) = quote.unwrap_or_else(|| panic!("no stored call of market_data_get_quote: {calls:?}"));
    let result: Value = serde_json::from_str(result).expect("result.json");
    assert_eq!(result["mcp"]["structuredContent"], json!({"ticker": "ACME", "price": 12.5}), "{result}");
    for event in ["call_accepted", "call_started", "call_finished"] {
        assert!(log.contains(event), "{event} in {log}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_upstream_servers_log_messages_reach_the_caller_at_the_level_it_asks() {
    let markers = TempDir::new("upstream-markers");
    let port = free_port();
    let _server = UpstreamServer::start(port, markers.path());
    let setup = Setup::start(&[("market-data", port)], 30).await;
    setup.wait_listed("market_data_chatty", true).await;
    let levels = |logs: &[Heard]| {
        let mut levels: Vec<String> = logs
            .iter()
            .map(|(logger, data)| {
                assert_eq!(logger.as_deref(), Some("chatty"), "the server's logger name is kept");
                data["level"].as_str().expect("the server's data").to_owned()
            })
            .collect();
        levels.sort();
        levels
    };

    // A 2026-07-28 client hears every message by default, and those at its `_meta` level up.
    let answer = setup.call("market_data_chatty", json!({})).await;
    assert_eq!(text(&answer), "logged");
    assert_eq!(levels(&setup.counts.logs_once(4).await), ["debug", "error", "info", "warning"]);
    let mut meta = rmcp::model::RequestMetaObject::default();
    #[allow(deprecated)]
    meta.set_log_level(rmcp::model::LoggingLevel::Warning);
    let request = CallToolRequest::new(CallToolRequestParams::new("market_data_chatty"));
    let options = PeerRequestOptions::no_options().with_meta(meta);
    let handle = setup
        .client
        .send_request_with_option(ClientRequest::CallToolRequest(request), options)
        .await
        .expect("tools/call sent");
    handle.await_response().await.expect("answered");
    assert_eq!(levels(&setup.counts.logs_once(2).await), ["error", "warning"]);

    // A 2025-11-25 client (no session at the gateway) hears them on the call's own stream.
    let counts = Counting::default();
    let config = StreamableHttpClientTransportConfig::with_uri(setup.gateway.mcp_url()).auth_header(TOKEN.to_owned());
    let legacy = counts
        .clone()
        .serve_with_lifecycle(StreamableHttpClientTransport::from_config(config), ClientLifecycleMode::Initialize)
        .await
        .expect("MCP client connects");
    #[allow(deprecated)]
    legacy
        .set_level(rmcp::model::SetLevelRequestParams::new(rmcp::model::LoggingLevel::Debug))
        .await
        .expect("logging/setLevel is accepted");
    let answer = legacy.call_tool(CallToolRequestParams::new("market_data_chatty")).await.expect("tools/call");
    assert_eq!(text(&answer), "logged");
    assert_eq!(levels(&counts.logs_once(4).await), ["debug", "error", "info", "warning"]);
}

/// The calls stored under `data`: each one's input, result and first event segment.
fn stored_calls(data: &std::path::Path) -> Vec<(String, String, String)> {
    let mut found = Vec::new();
    let mut folders = vec![data.to_owned()];
    while let Some(dir) = folders.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                folders.push(path);
            } else if path.file_name().is_some_and(|n| n == "input.json")
                && dir.parent().is_some_and(|p| p.ends_with("calls"))
            {
                let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
                found.push((read("input.json"), read("result.json"), read("events/000001.jsonl")));
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_that_goes_away_is_retried_on_schedule_without_touching_the_other() {
    let markers = TempDir::new("upstream-markers");
    let (port_a, port_b) = (free_port(), free_port());
    let server_a = UpstreamServer::start(port_a, markers.path());
    let _server_b = UpstreamServer::start(port_b, markers.path());
    let setup = Setup::start(&[("alpha", port_a), ("beta", port_b)], 30).await;
    setup.wait_listed("alpha_get_quote", true).await;
    setup.wait_listed("beta_get_quote", true).await;

    drop(server_a);
    setup.wait_listed("alpha_get_quote", false).await;
    // Beta keeps answering while alpha is away, and alpha's tool is unknown meanwhile.
    let beta = setup.call("beta_get_quote", json!({"ticker": "INITECH"})).await;
    assert_eq!(beta.structured_content, Some(json!({"ticker": "INITECH", "price": 3.25})));
    let alpha = setup.client.call_tool(CallToolRequestParams::new("alpha_get_quote")).await;
    assert!(alpha.is_err_and(|e| e.to_string().contains("Unknown tool")), "alpha's tools are gone while it is away");

    // The reconnect delays follow the schedule, the last one repeating: 1, 2, 3, 3 s.
    let mut seen = Vec::new();
    for _ in 0..300 {
        let c = setup.gateway.upstreams.connections()["alpha"].clone();
        if c.state == ConnectionState::Waiting && !seen.iter().any(|(f, _)| *f == c.failures) {
            let next = c.next_retry.as_ref().expect("a waiting connection has a next retry").0;
            let at = c.updated.as_ref().expect("a state change has a time").0;
            seen.push((c.failures, next.duration_since(at).as_secs()));
            assert!(c.last_error.as_deref().is_some_and(|e| !e.is_empty()), "{c:?}");
        }
        if seen.len() == 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let delays: Vec<i64> = seen.iter().map(|(_, d)| *d).collect();
    assert_eq!(delays, [1, 2, 3, 3], "failures and their delays: {seen:?}");
    assert_eq!(setup.gateway.upstreams.connections()["beta"].state, ConnectionState::Connected);

    // Back again: its tools return and clients are told the list changed.
    let before = setup.counts.list_changed.load(Ordering::SeqCst);
    let _server_a = UpstreamServer::start(port_a, markers.path());
    setup.wait_listed("alpha_get_quote", true).await;
    assert!(setup.counts.list_changed.load(Ordering::SeqCst) > before, "clients hear that the list changed");
    let alpha = setup.call("alpha_get_quote", json!({"ticker": "ACME"})).await;
    assert_eq!(alpha.structured_content, Some(json!({"ticker": "ACME", "price": 12.5})));
    let c = setup.gateway.upstreams.connections()["alpha"].clone();
    assert_eq!((c.state, c.failures, c.last_error.as_deref()), (ConnectionState::Connected, 0, None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn misbehaving_servers_are_timed_out_capped_and_reported_while_the_session_stays_healthy() {
    let markers = TempDir::new("upstream-markers");
    let (good, garbage, silent) = (free_port(), free_port(), free_port());
    let _good = UpstreamServer::start(good, markers.path());
    let _garbage = UpstreamServer::start_as(garbage, markers.path(), Some("garbage"));
    let _silent = UpstreamServer::start_as(silent, markers.path(), Some("silent"));
    // The call timeout bounds the hung call below, and the flood must fit in it too: the
    // Python server's 6,000 notifications took over 3 s on a slow 2-CPU machine.
    let setup = Setup::start(&[("good", good), ("garbage", garbage), ("silent", silent)], 10).await;
    setup.wait_listed("good_get_quote", true).await;

    // A server answering garbage and one that never answers are reported, with what failed.
    for name in ["garbage", "silent"] {
        let mut last = None;
        for _ in 0..100 {
            let c = setup.gateway.upstreams.connections()[name].clone();
            if c.state == ConnectionState::Waiting {
                last = Some(c);
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let c = last.unwrap_or_else(|| panic!("{name} is reported as waiting"));
        let error = c.last_error.unwrap_or_default();
        assert!(error.contains("handshake"), "{name}: {error}");
        assert!(!setup.tool_names().await.iter().any(|n| n.starts_with(&format!("{name}_"))));
    }

    // A call that never ends is timed out (and the server told to stop).
    let hung = setup.call("good_hang", json!({})).await;
    assert_eq!(hung.is_error, Some(true));
    assert!(text(&hung).contains("did not answer within 10 s"), "{hung:?}");
    // A flood of notifications is absorbed; the answer still arrives, after at most 1,000 of
    // the log messages and a warning that says how many were not passed on.
    let flood = setup.call("good_flood", json!({"count": 3000})).await;
    assert_eq!(text(&flood), "sent 3000");
    let logs = setup.counts.logs_once(1001).await;
    let (passed, warnings): (Vec<_>, Vec<_>) = logs.iter().partition(|(logger, _)| logger.is_none());
    assert!(!passed.is_empty() && passed.len() <= 1000, "{} passed on", passed.len());
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    let warning = warnings[0].1.as_str().expect("text");
    assert!(warning.ends_with("were not passed on (at most 1000 per call)"), "{warning}");
    let missed: usize = warning.split(' ').next().and_then(|n| n.parse().ok()).expect("a count");
    assert_eq!(passed.len() + missed, 3000, "each message passed on or counted");
    // An answer above the cap is refused with a clear error; the caller's session is unharmed
    // and the server is served again (over a new connection if the old one broke).
    let huge = setup.call("good_huge", json!({"megabytes": 50})).await;
    assert_eq!(huge.is_error, Some(true));
    assert!(text(&huge).contains("above the 16 MiB limit"), "{huge:?}");
    setup.wait_listed("good_get_quote", true).await;
    let ok = setup.call("good_get_quote", json!({"ticker": "ACME"})).await;
    assert_eq!(ok.structured_content, Some(json!({"ticker": "ACME", "price": 12.5})), "the session is healthy");
    assert_eq!(setup.gateway.upstreams.connections()["good"].state, ConnectionState::Connected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_reference_server_everything_is_served_through_the_gateway() {
    let port = free_port();
    let _everything = EverythingServer::start(port);
    let setup = Setup::start(&[("everything", port)], 30).await;
    setup.wait_listed("everything_echo", true).await;
    let names = setup.tool_names().await;
    for tool in ["everything_get_sum", "everything_get_tiny_image", "everything_get_structured_content"] {
        assert!(names.iter().any(|n| n == tool), "{tool} is served: {names:?}");
    }

    let echo = setup.call("everything_echo", json!({"message": "hello upstream"})).await;
    assert_eq!(text(&echo), "Echo: hello upstream");
    let sum = setup.call("everything_get_sum", json!({"a": 2, "b": 3})).await;
    assert!(text(&sum).contains("is 5"), "{sum:?}");
    let image = serde_json::to_value(setup.call("everything_get_tiny_image", json!({})).await).expect("json");
    assert!(image["content"].as_array().expect("content").iter().any(|c| c["type"] == "image"), "{image}");
    let weather = setup.call("everything_get_structured_content", json!({"location": "Chicago"})).await;
    let weather = weather.structured_content.expect("structured content passes through");
    assert!(weather["temperature"].is_number() && weather["conditions"].is_string(), "{weather}");
    // Its schema is enforced at the gateway: a city it does not know never reaches it.
    let refused = setup.call("everything_get_structured_content", json!({"location": "Paris"})).await;
    assert!(text(&refused).starts_with("invalid arguments"), "{refused:?}");

    // Its progress reaches the caller.
    let before = setup.counts.progress.load(Ordering::SeqCst);
    let done = setup.call("everything_trigger_long_running_operation", json!({"duration": 1, "steps": 4})).await;
    assert!(text(&done).contains("completed"), "{done:?}");
    assert!(setup.counts.progress.load(Ordering::SeqCst) >= before + 2, "progress notifications are passed on");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_search_endpoint_finds_and_calls_functions_and_upstream_tools_alike() {
    let markers = TempDir::new("upstream-markers");
    let port = free_port();
    let _server = UpstreamServer::start(port, markers.path());
    let setup = Setup::start_with(&[("market-data", port)], 30, true).await;
    setup.wait_listed("market_data_get_quote", true).await;

    let url = setup.gateway.mcp_url().replace("/mcp", "/search/mcp");
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url).auth_header(TOKEN.to_owned()),
    );
    let search = ClientConfig::default()
        .serve_with_lifecycle(transport, ClientLifecycleMode::Initialize)
        .await
        .expect("MCP client connects");
    let mut listed: Vec<String> =
        search.list_all_tools().await.expect("tools/list").into_iter().map(|t| t.name.to_string()).collect();
    listed.sort();
    assert_eq!(listed, ["call_tool", "tool_search"], "the search endpoint lists its two tools only");

    let found = |query: &str| {
        let params = CallToolRequestParams::new("tool_search")
            .with_arguments(json!({"query": query}).as_object().expect("object").clone());
        let search = &search;
        async move {
            let r = search.call_tool(params).await.expect("tool_search");
            r.structured_content.expect("structured")["tools"].as_array().expect("tools").clone()
        }
    };
    let options = found("option price").await;
    assert_eq!(options[0]["name"], "price_option", "{options:?}");
    assert_eq!(options[0]["input_schema"]["required"][0], "spot", "schemas come with the results");
    let quotes = found("market quote").await;
    assert_eq!(quotes[0]["name"], "market_data_get_quote", "upstream tools are found too: {quotes:?}");
    assert!(found("no-such-words-anywhere").await.is_empty());

    let call = |name: &str, arguments: Value| {
        CallToolRequestParams::new("call_tool")
            .with_arguments(json!({"name": name, "arguments": arguments}).as_object().expect("object").clone())
    };
    let priced = search
        .call_tool(call(
            "price_option",
            json!({"spot": 100, "strike": 100, "time_to_expiry": 1, "volatility": 0.2, "rate": 0.05}),
        ))
        .await
        .expect("call_tool");
    let price = priced.structured_content.expect("structured")["price"].as_f64().unwrap_or_default();
    assert!((price - 10.45).abs() < 0.01, "{price}");
    let quote = search.call_tool(call("market_data_get_quote", json!({"ticker": "ACME"}))).await.expect("call_tool");
    assert_eq!(quote.structured_content, Some(json!({"ticker": "ACME", "price": 12.5})));
    let invalid = search.call_tool(call("market_data_get_quote", json!({}))).await.expect("call_tool");
    assert!(text(&invalid).starts_with("invalid arguments"), "{invalid:?}");
    let unknown = search.call_tool(call("no_such_tool", json!({}))).await;
    assert!(unknown.is_err_and(|e| e.to_string().contains("Unknown tool")));
    // The tools themselves are not callable there by name: only through call_tool.
    let direct = search.call_tool(CallToolRequestParams::new("market_data_get_quote")).await;
    assert!(direct.is_err_and(|e| e.to_string().contains("Unknown tool")));
}

/// Processes whose command line mentions `marker`.
fn processes_with(marker: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        if String::from_utf8_lossy(&cmdline).contains(marker) {
            found.push(pid);
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn servers_toolyard_runs_are_started_over_stdio_and_http_and_restarted_when_they_die() {
    let stdio_markers = TempDir::new("stdio-server-markers");
    let http_markers = TempDir::new("http-server-markers");
    let script = repo_path("tests/fixtures/python/upstream_server.py");
    let python = toolyard_tests::local::python();
    let port = free_port();
    let runtime = |args: String| {
        format!("runtime:\n  image: ghcr.io/acme/upstream:1\n  command: [{python:?}, {:?}, {args}]", script.display())
    };
    let stdio = runtime(format!("stdio, {:?}", stdio_markers.path().display().to_string()));
    let http = format!(
        "{}\nstreamableHttp: {{port: {port}}}",
        runtime(format!("\"{port}\", {:?}", http_markers.path().display().to_string()))
    );
    let setup = Setup::start_specs(&[("desk", stdio), ("web", http)], false).await;
    setup.wait_listed("desk_get_quote", true).await;
    setup.wait_listed("web_get_quote", true).await;

    for tool in ["desk_get_quote", "web_get_quote"] {
        let quote = setup.call(tool, json!({"ticker": "ACME"})).await;
        assert_eq!(quote.structured_content, Some(json!({"ticker": "ACME", "price": 12.5})), "{tool}: {quote:?}");
    }
    let snapshot = serde_json::to_value(setup.call("desk_snapshot", json!({})).await).expect("json");
    let kinds: Vec<&str> =
        snapshot["content"].as_array().expect("content").iter().filter_map(|c| c["type"].as_str()).collect();
    assert!(kinds.contains(&"image") && kinds.contains(&"audio"), "every content type over stdio: {kinds:?}");
    let stdio_marker = stdio_markers.path().display().to_string();
    let http_marker = http_markers.path().display().to_string();
    assert_eq!(processes_with(&stdio_marker).len(), 1, "one process of the stdio server");
    assert_eq!(processes_with(&http_marker).len(), 1, "one process of the HTTP server");

    // The stdio server dies: its tools go, the other server keeps answering, and the next
    // attempt (1 s later) starts it again.
    for pid in processes_with(&stdio_marker) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).expect("kill");
    }
    setup.wait_listed("desk_get_quote", false).await;
    let quote = setup.call("web_get_quote", json!({"ticker": "INITECH"})).await;
    assert_eq!(quote.structured_content, Some(json!({"ticker": "INITECH", "price": 3.25})));
    let status = setup.gateway.upstreams.connections();
    assert!(status["desk"].last_error.is_some(), "the failure is reported: {:?}", status["desk"]);
    setup.wait_listed("desk_get_quote", true).await;
    let quote = setup.call("desk_get_quote", json!({"ticker": "ACME"})).await;
    assert_eq!(quote.structured_content, Some(json!({"ticker": "ACME", "price": 12.5})));
    assert_eq!(setup.gateway.upstreams.connections()["desk"].state, ConnectionState::Connected);

    // Stopping the gateway stops both servers' processes.
    let Setup { gateway, client, _dir, _data, .. } = setup;
    let _ = client.cancel().await;
    gateway.shutdown().await.expect("shutdown");
    for _ in 0..50 {
        if processes_with(&stdio_marker).is_empty() && processes_with(&http_marker).is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "server processes outlive the gateway: {:?} {:?}",
        processes_with(&stdio_marker),
        processes_with(&http_marker)
    );
}

impl Setup {
    /// The local mode on two servers that ask their callers: the conformance fixture
    /// (`fixtures`: sampling, elicitation) and the market-data server (`market-data`:
    /// `ask_flood`), with the servers (stopped when dropped) and the latter's markers folder.
    async fn asking() -> (Self, [ServerProcess; 2], TempDir) {
        let port = free_port();
        let fixtures =
            UpstreamServer::start_script("tests/fixtures/python/conformance_server.py", port, &[port.to_string()]);
        let markers = TempDir::new("upstream-markers");
        let flooding_port = free_port();
        let flooding = UpstreamServer::start(flooding_port, markers.path());
        let setup = Setup::start(&[("fixtures", port), ("market-data", flooding_port)], 30).await;
        setup.wait_listed("fixtures_test_sampling", true).await;
        setup.wait_listed("market_data_ask_flood", true).await;
        (setup, [fixtures, flooding], markers)
    }
}

/// A 2025-11-25 client that answers an upstream server's sampling and elicitation requests,
/// keeping what it was asked.
#[derive(Clone, Default)]
struct Answering {
    asked: Arc<std::sync::Mutex<Vec<Value>>>,
    /// How long it takes to answer an elicitation.
    delay: Duration,
    /// Elicitations being answered now, and the most at once.
    answering: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    /// The data of the log messages heard.
    logs: Arc<std::sync::Mutex<Vec<Value>>>,
}

impl ClientHandler for Answering {
    fn get_info(&self) -> ClientConfig {
        let mut capabilities = ClientCapabilities::default();
        capabilities.sampling = Some(Default::default());
        capabilities.elicitation = Some(Default::default());
        ClientConfig::new(capabilities, Implementation::new("answering-test", "1"))
    }

    #[allow(deprecated)]
    async fn create_message(
        &self,
        params: rmcp::model::CreateMessageRequestParams,
        _context: rmcp::service::RequestContext<RoleClient>,
    ) -> Result<rmcp::model::CreateMessageResult, rmcp::ErrorData> {
        self.asked.lock().expect("lock").push(serde_json::to_value(&params).expect("params"));
        Ok(rmcp::model::CreateMessageResult::new(
            rmcp::model::SamplingMessage::assistant_text("forty-two"),
            "test-model".into(),
        ))
    }

    async fn create_elicitation(
        &self,
        request: rmcp::model::ElicitRequestParams,
        _context: rmcp::service::RequestContext<RoleClient>,
    ) -> Result<rmcp::model::ElicitResult, rmcp::ErrorData> {
        self.asked.lock().expect("lock").push(serde_json::to_value(&request).expect("params"));
        let now = self.answering.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(self.delay).await;
        self.answering.fetch_sub(1, Ordering::SeqCst);
        Ok(rmcp::model::ElicitResult::new(rmcp::model::ElicitationAction::Accept)
            .with_content(json!({"username": "ada", "email": "ada@example.com"})))
    }

    #[allow(deprecated)]
    async fn on_logging_message(
        &self,
        params: rmcp::model::LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.logs.lock().expect("lock").push(params.data);
    }
}

/// An upstream server's requests to its caller during a call (sampling, elicitation) reach a
/// 2025-11-25 caller on its call's stream, and the caller's answers reach the server. A client
/// that cannot answer gets its own error passed on, and a 2026-07-28 caller that declared no
/// capability has the server told clearly that it cannot be asked; the call ends with the
/// server's error either way. A server that floods its caller
/// with requests has those beyond four at once refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_upstream_servers_requests_reach_the_caller_and_its_answers_reach_the_server() {
    let (setup, _servers, _markers) = Setup::asking().await;
    let connect = |handler| local_support::legacy_client(setup.gateway.mcp_url(), TOKEN, handler);
    let answering = Answering::default();
    let client = connect(answering.clone()).await;
    let call = |tool: &str, arguments: Value| {
        CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments.as_object().expect("object").clone())
    };
    let sampled = client.call_tool(call("fixtures_test_sampling", json!({"prompt": "6 x 7?"}))).await.expect("call");
    assert_eq!(text(&sampled), "LLM response: forty-two", "{sampled:?}");
    let elicited = client.call_tool(call("fixtures_test_elicitation", json!({"message": "Who?"}))).await.expect("call");
    assert!(text(&elicited).contains("'username': 'ada'"), "{elicited:?}");
    let asked = answering.asked.lock().expect("lock").clone();
    assert_eq!(asked.len(), 2, "{asked:?}");
    assert_eq!(asked[0]["messages"][0]["content"]["text"], "6 x 7?", "{asked:?}");
    assert_eq!(asked[0]["maxTokens"], 100, "{asked:?}");
    assert_eq!(asked[1]["message"], "Who?", "{asked:?}");

    // rmcp's default client handler refuses sampling ("method not found", with the method as
    // its message): its error reaches the server, which fails the call with it.
    let plain = local_support::legacy_client(setup.gateway.mcp_url(), TOKEN, ClientConfig::default()).await;
    let refused = plain.call_tool(call("fixtures_test_sampling", json!({"prompt": "?"}))).await.expect("call");
    assert_eq!(refused.is_error, Some(true), "{refused:?}");
    assert!(text(&refused).ends_with("refused the call: sampling/createMessage"), "{refused:?}");

    // Twelve requests at once, to a client that takes a second over each: four are asked, the
    // others refused at once.
    let slow = Answering { delay: Duration::from_secs(1), ..Answering::default() };
    let flooded = connect(slow.clone()).await;
    let flood = flooded.call_tool(call("market_data_ask_flood", json!({"count": 12}))).await.expect("call");
    let report = text(&flood);
    assert!(report.starts_with("answered 4; refused 8: "), "{report}");
    assert!(report.contains("the caller already has 4 requests of this call to answer"), "{report}");
    assert_eq!(slow.most.load(Ordering::SeqCst), 4, "{report}");

    // The setup's 2026-07-28 client declares no capability: it cannot be asked, and the
    // server is told so.
    let modern = setup.call("fixtures_test_sampling", json!({"prompt": "?"})).await;
    assert_eq!(modern.is_error, Some(true), "{modern:?}");
    assert!(
        text(&modern).contains("the caller cannot be asked sampling/createMessage: it did not declare the capability"),
        "{modern:?}"
    );
}

/// A 2026-07-28 caller gets an upstream server's requests as `input_required` results (the
/// multi-round-trip form), and its retries carry the answers to the server, which the call
/// was held for. rmcp's client drives the rounds itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_2026_caller_answers_an_upstream_servers_requests_in_rounds() {
    let (setup, _servers, markers) = Setup::asking().await;
    let call = |tool: &str, arguments: Value| {
        CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments.as_object().expect("object").clone())
    };
    let answering = Answering::default();
    let client = modern_client(setup.gateway.mcp_url(), answering.clone()).await;

    // One round by hand: the server's request comes as `input_required`, under an ask id,
    // with a request state to send back.
    let first = client.call_tool_once(call("fixtures_test_sampling", json!({"prompt": "6 x 7?"}))).await.expect("call");
    let CallToolResponse::InputRequired(asked) = first else { panic!("input required: {first:?}") };
    let requests = asked.input_requests.expect("requests");
    let (key, request) = requests.iter().next().expect("one request");
    assert!(key.starts_with("toolyard-ask-"), "{key}");
    let request = serde_json::to_value(request).expect("request");
    assert_eq!(request["method"], "sampling/createMessage", "{request}");
    assert_eq!(request["params"]["messages"][0]["content"]["text"], "6 x 7?", "{request}");
    let state = asked.request_state.expect("a request state");
    let answer = json!({"role": "assistant", "content": {"type": "text", "text": "by hand"}, "model": "m"});
    let retry = call("fixtures_test_sampling", json!({"prompt": "6 x 7?"}))
        .with_input_responses([(key.clone(), answer)].into())
        .with_request_state(state.clone());
    let done = client.call_tool_once(retry).await.expect("retry");
    let CallToolResponse::Complete(sampled) = done else { panic!("complete: {done:?}") };
    assert_eq!(text(&sampled), "LLM response: by hand", "{sampled:?}");
    // The call is over: its state names nothing any more.
    let again = client.call_tool_once(call("fixtures_test_sampling", json!({})).with_request_state(state)).await;
    let error = again.expect_err("a spent request state");
    assert!(error.to_string().contains("requestState names no call of yours"), "{error}");
    let forged = client
        .call_tool_once(call("fixtures_test_sampling", json!({})).with_request_state("../../calls/x.1"))
        .await
        .expect_err("a forged request state");
    assert!(forged.to_string().contains("requestState names no call of yours"), "{forged}");

    // rmcp's client answers through its handler and retries by itself.
    let elicited = client.call_tool(call("fixtures_test_elicitation", json!({"message": "Who?"}))).await.expect("call");
    assert!(text(&elicited).contains("'username': 'ada'"), "{elicited:?}");
    assert_eq!(answering.asked.lock().expect("lock").last().expect("asked")["message"], "Who?");

    // Twelve requests at once: four are asked (in as few rounds as they came in), the others
    // refused at once.
    let slow = Answering { delay: Duration::from_secs(1), ..Answering::default() };
    let flooded = modern_client(setup.gateway.mcp_url(), slow.clone()).await;
    let flood = flooded.call_tool(call("market_data_ask_flood", json!({"count": 12}))).await.expect("call");
    let report = text(&flood);
    assert!(report.starts_with("answered 4; refused 8: "), "{report}");

    // A cancellation of a later round stops the held call: it reaches the server.
    let sleepy = || call("market_data_ask_flood", json!({"count": 1, "then_sleep": 60}));
    let first = client.call_tool_once(sleepy()).await.expect("first round");
    let CallToolResponse::InputRequired(asked) = first else { panic!("input required: {first:?}") };
    let key = asked.input_requests.as_ref().and_then(|r| r.keys().next().cloned()).expect("a request");
    let retry = sleepy()
        .with_input_responses([(key, json!({"action": "accept", "content": {}}))].into())
        .with_request_state(asked.request_state.expect("a request state"));
    let handle = client
        .send_cancellable_request(
            ClientRequest::CallToolRequest(CallToolRequest::new(retry)),
            PeerRequestOptions::no_options(),
        )
        .await
        .expect("sent");
    // The call's log message after the answer reaches this round's request (the call is held
    // on this replica); then the cancellation reaches the server.
    let logged = || answering.logs.lock().expect("lock").contains(&json!("asked 1"));
    for _ in 0..100 {
        if logged() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(logged(), "the later round hears the call's log message");
    handle.cancel(Some("test".into())).await.expect("cancel sent");
    assert!(cancelled(&markers).await, "the cancellation of a later round reaches the server");
}

/// Whether the market-data server writes its `cancelled` marker in `markers` (within 10 s).
async fn cancelled(markers: &TempDir) -> bool {
    let marker = markers.path().join("cancelled");
    for _ in 0..100 {
        if marker.exists() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    marker.exists()
}

/// A 2026-07-28 client with `handler`, at the MCP URL `url`.
async fn modern_client<H: ClientHandler>(url: String, handler: H) -> RunningService<RoleClient, H> {
    let config = StreamableHttpClientTransportConfig::with_uri(url).auth_header(TOKEN.to_owned());
    let lifecycle = ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] };
    handler
        .serve_with_lifecycle(StreamableHttpClientTransport::from_config(config), lifecycle)
        .await
        .expect("MCP client connects")
}

/// A 2025-11-25 session subscribes to an upstream server's resource: the gateway subscribes to
/// it on its own connection to the server, and the server's update reaches the session's GET
/// stream. A resource no server serves is not found; without a session there is no stream.
/// A session's subscription is a file of its owner's: refused once the owner's stored files
/// reach the storage quota, as a call is (sessions are free to open, so nothing else would
/// bound them).
#[tokio::test(flavor = "multi_thread")]
async fn a_session_subscription_is_refused_at_the_storage_quota() {
    let port = free_port();
    let _server =
        UpstreamServer::start_script("tests/fixtures/python/conformance_server.py", port, &[port.to_string()]);
    let spec = format!("url: http://127.0.0.1:{port}/mcp\ntimeoutSeconds: 30");
    let quota = DataArgs { storage_quota_bytes: 8000, ..DataArgs::default() };
    let setup = Setup::start_specs_with(&[("fixtures", spec)], false, quota).await;
    setup.wait_listed("fixtures_update_watched_resource", true).await;
    // The owner already stores more than the quota.
    let owner = toolyard_api::OwnerKey::derive("apikey", "local");
    let old = setup._data.path().join("owners").join(owner.as_str()).join("calls/old");
    std::fs::create_dir_all(&old).expect("folder");
    std::fs::write(old.join("result.json"), vec![b'x'; 9000]).expect("an old result");

    let session = LegacySession::open(&setup.gateway.mcp_url(), TOKEN).await;
    let subscribe = json!({"jsonrpc": "2.0", "id": 2, "method": "resources/subscribe",
        "params": {"uri": "test://watched-resource"}});
    let refused = session.post(subscribe).await;
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("storage quota reached"), "{refused}");
    let sessions = setup._data.path().join("owners").join(owner.as_str()).join("sessions");
    assert!(!sessions.exists(), "nothing stored for the refused subscription");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_session_hears_an_upstream_servers_resource_updates() {
    let port = free_port();
    let _server =
        UpstreamServer::start_script("tests/fixtures/python/conformance_server.py", port, &[port.to_string()]);
    let setup = Setup::start(&[("fixtures", port)], 30).await;
    setup.wait_listed("fixtures_update_watched_resource", true).await;
    let session = LegacySession::open(&setup.gateway.mcp_url(), TOKEN).await;
    let mut stream = session.stream().await;
    let subscribe =
        |method: &str, uri: &str| json!({"jsonrpc": "2.0", "id": 2, "method": method, "params": {"uri": uri}});
    let uri = "test://watched-resource";
    let subscribed = session.post(subscribe("resources/subscribe", uri)).await;
    assert_eq!(subscribed["result"], json!({}), "{subscribed}");
    let unknown = session.post(subscribe("resources/subscribe", "test://nothing-here")).await;
    assert_eq!(unknown["error"]["code"], -32002, "{unknown}");
    assert_eq!(unknown["error"]["data"]["uri"], "test://nothing-here", "{unknown}");
    let sessionless = session.without_id().post(subscribe("resources/subscribe", uri)).await;
    assert!(sessionless["error"]["message"].as_str().is_some_and(|m| m.contains("needs a session")), "{sessionless}");
    let long = format!("test://template/{}/data", "x".repeat(600));
    let refused = session.post(subscribe("resources/subscribe", &long)).await;
    assert!(refused["error"]["message"].as_str().is_some_and(|m| m.contains("at most 512 bytes")), "{refused}");

    let update = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "fixtures_update_watched_resource", "arguments": {}}});
    // The stream takes the subscription up at once (it was made through its own replica);
    // the update may still come before the server has it, so the tool is called until heard.
    let heard = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let answered = session.post(update.clone()).await;
            assert_eq!(answered["result"]["isError"], false, "{answered}");
            if let Ok(heard) =
                tokio::time::timeout(Duration::from_secs(2), stream.until("notifications/resources/updated")).await
            {
                return heard;
            }
        }
    })
    .await
    .expect("the session's stream hears the server's update");
    assert_eq!(heard["params"]["uri"], uri, "{heard}");
    let owner = toolyard_api::OwnerKey::derive("apikey", "local");
    let sessions = setup._data.path().join("owners").join(owner.as_str()).join("sessions");
    let stored = |folder: &std::path::Path| std::fs::read_dir(folder).map_or(0, Iterator::count);
    let subscriptions = std::fs::read_dir(&sessions).expect("a session folder").flatten().next().expect("one");
    let subscriptions = subscriptions.path().join("subscriptions");
    assert_eq!(stored(&subscriptions), 1, "the subscription is stored");
    let unsubscribed = session.post(subscribe("resources/unsubscribe", uri)).await;
    assert_eq!(unsubscribed["result"], json!({}), "{unsubscribed}");
    assert_eq!(stored(&subscriptions), 0, "unsubscribing deletes the subscription's file and its folder");

    // A 2026-07-28 client hears it through subscriptions/listen.
    let mut filter = SubscriptionFilter::new();
    filter.resource_subscriptions = Some(vec![uri.to_owned()]);
    let mut listening = setup.client.listen(filter).await.expect("subscriptions/listen");
    assert_eq!(listening.acknowledged().resource_subscriptions, Some(vec![uri.to_owned()]));
    let heard = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            setup.call("fixtures_update_watched_resource", json!({})).await;
            let next = tokio::time::timeout(Duration::from_secs(2), listening.next()).await;
            if let Ok(Ok(Some(ServerNotification::ResourceUpdatedNotification(n)))) = next {
                return n.params.uri;
            }
        }
    })
    .await
    .expect("the listen stream hears the server's update");
    assert_eq!(heard, uri);
}

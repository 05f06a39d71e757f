//! Traces in local mode, end to end: `toolyard-gateway local` (the binary, as a user starts it)
//! with the standard `OTEL_*` variables pointing at a real trace store (Jaeger v2, started with
//! the test cluster), called by a real MCP client (rmcp over Streamable HTTP) that sends its
//! `traceparent` in `_meta`. The store's query API must show one trace from the client's span
//! through the gateway, the runner and the Python function; an invalid `traceparent` starts a
//! new trace; a collector that is down or never answers costs no call.

use std::process::Stdio;
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResult, ClientConfig, RequestMetaObject};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientLifecycleMode, ClientServiceExt, RoleClient};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use toolyard_tests::local::{self, TempDir};
use toolyard_tests::model_server::{ScriptedModel, Turn};
use toolyard_tests::repo_path;
use toolyard_tests::traces::{ClientSpan, Trace, TraceStore, random_u128};

const TOKEN: &str = "ty_tracing-local-test-token-01";
const GATEWAY: &str = "toolyard-gateway";
const RUNNER: &str = "toolyard-runner";
const FUNCTION: &str = "toolyard-function";
/// How long the store may take to show spans (the processes send them in batches).
const STORE_WAIT: Duration = Duration::from_secs(60);

/// A `toolyard-gateway local` process serving the pricing example, exporting to `otlp`.
struct Gateway {
    process: tokio::process::Child,
    url: String,
    /// Its standard error (the logs).
    log: std::path::PathBuf,
    _data: TempDir,
}

impl Gateway {
    async fn start(user: &str, otlp: &str) -> Self {
        Self::start_with(user, otlp, &[]).await
    }

    /// With extra environment variables (a model endpoint for coding tasks).
    async fn start_with(user: &str, otlp: &str, env: &[(&str, &str)]) -> Self {
        let data = TempDir::new("tracing-local");
        let log = data.path().with_extension("log");
        let mut process = tokio::process::Command::new(local::binary("toolyard-gateway"))
            .env_remove("TOOLYARD_MODEL_BASE_URL")
            .envs(env.iter().copied())
            .arg("local")
            .arg(repo_path("examples/pricing"))
            .arg("--data-dir")
            .arg(data.path())
            .args(["--listen", "127.0.0.1:0", "--token", TOKEN, "--user", user])
            .args(["--runner", local::binary("toolyard-runner").to_str().expect("utf-8"), "--python", &local::python()])
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", otlp)
            // Small batches, sent soon: the test reads the store right after the calls.
            .env("OTEL_BSP_SCHEDULE_DELAY", "100")
            .env("RUST_BACKTRACE", "0")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .kill_on_drop(true)
            .spawn()
            .expect("toolyard-gateway local starts");
        let mut lines = BufReader::new(process.stdout.take().expect("piped")).lines();
        let url = loop {
            let line = tokio::time::timeout(Duration::from_secs(120), lines.next_line())
                .await
                .expect("the banner within 2 minutes")
                .expect("stdout")
                .unwrap_or_else(|| panic!("the gateway exited: {}", std::fs::read_to_string(&log).unwrap_or_default()));
            if let Some(url) = line.trim().strip_prefix("MCP URL:") {
                break url.trim().to_owned();
            }
        };
        // Keep reading stdout so the gateway never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Self { process, url, log, _data: data }
    }

    /// What it logged so far.
    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn client(&self) -> RunningService<RoleClient, ClientConfig> {
        let transport = StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(self.url.clone()).auth_header(TOKEN.to_owned()),
        );
        ClientConfig::default()
            .serve_with_lifecycle(transport, ClientLifecycleMode::Initialize)
            .await
            .expect("MCP client connects")
    }

    async fn stop(mut self) {
        if let Some(pid) = self.process.id() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(i32::try_from(pid).expect("pid")),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let _ = tokio::time::timeout(Duration::from_secs(30), self.process.wait()).await;
        let _ = std::fs::remove_file(&self.log);
    }
}

/// `tools/call` with `_meta.traceparent`.
async fn call(
    client: &RunningService<RoleClient, ClientConfig>,
    tool: &str,
    arguments: Value,
    traceparent: &str,
) -> CallToolResult {
    let mut params =
        CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments.as_object().expect("object").clone());
    let mut meta = RequestMetaObject::new();
    meta.0.set_traceparent(traceparent);
    params.meta = Some(meta);
    let result = client.call_tool(params).await.unwrap_or_else(|e| panic!("tools/call {tool}: {e}"));
    assert_ne!(result.is_error, Some(true), "{tool} failed: {result:?}");
    result
}

fn atm() -> Value {
    json!({"spot": 100, "strike": 100, "time_to_expiry": 1, "volatility": 0.2, "rate": 0.05})
}

/// A fresh client span: (trace id, span id, traceparent).
fn client_context() -> (String, String, String) {
    let span = ClientSpan::new();
    (span.trace_id, span.span_id, span.traceparent)
}

/// The gateway's spans of one call: `tools/call <tool>` under the client's span, with its
/// `authorize` and `execute` children. Returns the `execute` span's id.
fn gateway_part(trace: &Trace, tool: &str, client_span: &str) -> String {
    let call = trace.one(GATEWAY, &format!("tools/call {tool}"));
    assert_eq!(call.parent.as_deref(), Some(client_span), "the client's span is the parent:\n{}", trace.tree());
    assert_eq!(call.tags.get("gen_ai.tool.name").map(String::as_str), Some(tool));
    assert_eq!(call.tags.get("mcp.method.name").map(String::as_str), Some("tools/call"));
    assert_eq!(call.tags.get("span.kind").map(String::as_str), Some("server"), "{:?}", call.tags);
    assert!(
        call.tags.get("toolyard.call.id").is_some_and(|id| id.starts_with(&tool.replace('_', "-"))),
        "{:?}",
        call.tags
    );
    for child in ["authorize", "execute"] {
        let span = trace.one(GATEWAY, child);
        assert_eq!(trace.parent(span).id, call.id, "{child} is a child of tools/call:\n{}", trace.tree());
    }
    trace.one(GATEWAY, "execute").id.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_is_one_trace_from_the_client_to_the_python_function() {
    let store = TraceStore::get();
    let gateway = Gateway::start("tracing-one-trace", &store.otlp_endpoint).await;
    let client = gateway.client().await;

    // A Job-mode tool: gateway -> runner process -> Python process.
    let (trace_id, client_span, traceparent) = client_context();
    call(&client, "price_option", atm(), &traceparent).await;
    let python = "pricing.options.price_option";
    let expected =
        [(GATEWAY, "tools/call price_option"), (RUNNER, "call"), (RUNNER, "function.call"), (FUNCTION, python)];
    let trace = store.wait_for(&trace_id, &expected, STORE_WAIT).await.expect("the trace reaches the store");
    let execute = gateway_part(&trace, "price_option", &client_span);
    let runner = trace.one(RUNNER, "call");
    assert_eq!(runner.parent.as_deref(), Some(execute.as_str()), "the runner under execute:\n{}", trace.tree());
    for child in ["read input", "function.call", "upload"] {
        assert_eq!(trace.parent(trace.one(RUNNER, child)).id, runner.id, "{child} under call:\n{}", trace.tree());
    }
    let function = trace.one(FUNCTION, python);
    assert_eq!(trace.parent(function).id, trace.one(RUNNER, "function.call").id, "\n{}", trace.tree());
    assert!(trace.spans.iter().all(|s| !s.tags.contains_key("otel.name")), "otel.* fields are not attributes");

    // A reused warm worker (the pool runs in the gateway): gateway -> the worker's function span.
    let (trace_id, client_span, traceparent) = client_context();
    call(&client, "get_quote", json!({"symbol": "AAPL"}), &traceparent).await;
    let python = "pricing.quotes.get_quote";
    let trace = store
        .wait_for(&trace_id, &[(GATEWAY, "tools/call get_quote"), (FUNCTION, python)], STORE_WAIT)
        .await
        .expect("the pooled call's trace reaches the store");
    let execute = gateway_part(&trace, "get_quote", &client_span);
    assert_eq!(trace.one(FUNCTION, python).parent.as_deref(), Some(execute.as_str()), "\n{}", trace.tree());

    client.cancel().await.expect("client closes");
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_traceparent_starts_a_new_trace() {
    let store = TraceStore::get();
    let user = format!("tracing-invalid-{:08x}", random_u128() as u32);
    let gateway = Gateway::start(&user, &store.otlp_endpoint).await;
    let client = gateway.client().await;
    let invalid = "00-ZZZZ5f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    call(&client, "calc_greeks", atm(), invalid).await;

    let deadline = tokio::time::Instant::now() + STORE_WAIT;
    let found = loop {
        let found = store.find(GATEWAY, "enduser.id", &user).await.expect("search");
        if !found.is_empty() || tokio::time::Instant::now() >= deadline {
            break found;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(found.len(), 1, "one trace for the user's one call: {found:?}");
    let trace = store
        .wait_for(
            &found[0],
            &[(GATEWAY, "tools/call calc_greeks"), (FUNCTION, "pricing.options.calc_greeks")],
            STORE_WAIT,
        )
        .await
        .expect("the whole trace");
    let root = trace.one(GATEWAY, "tools/call calc_greeks");
    assert_eq!(root.parent, None, "the gateway's span is the root of a new trace:\n{}", trace.tree());
    assert!(!invalid.contains(&trace.id), "a new trace id");
    assert_eq!(trace.one(FUNCTION, "pricing.options.calc_greeks").service, FUNCTION);

    client.cancel().await.expect("client closes");
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_is_down_or_never_answers_costs_no_call() {
    // Down: nothing listens. Silent: accepts connections and never answers.
    let down = {
        let socket = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        socket.local_addr().expect("addr")
    };
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let silent_addr = silent.local_addr().expect("addr");
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            open.push(stream);
        }
    });
    for endpoint in [format!("http://{down}"), format!("http://{silent_addr}")] {
        let gateway = Gateway::start("tracing-no-collector", &endpoint).await;
        let client = gateway.client().await;
        for n in 0..3 {
            let (_, _, traceparent) = client_context();
            let result = call(&client, "price_option", atm(), &traceparent).await;
            let price = result.structured_content.as_ref().and_then(|v| v["price"].as_f64());
            assert!(price.is_some_and(|p| (p - 10.4506).abs() < 1e-4), "call {n} via {endpoint}: {result:?}");
            call(&client, "get_quote", json!({"symbol": "MSFT"}), &traceparent).await;
        }
        client.cancel().await.expect("client closes");
        gateway.stop().await;
    }
    held.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coding_task_is_one_trace_through_the_agent_its_model_calls_and_its_tool_calls() {
    let store = TraceStore::get();
    let model = ScriptedModel::start(
        "sk-tracing-test-key-0001",
        vec![
            Turn::code(
                "p = price_option(spot=100, strike=100, time_to_expiry=1, volatility=0.2, rate=0.05)\nprint(p['price'])",
            ),
            Turn::code("final_answer({'task_type': 'analysis', 'summary': 'priced', 'metrics': {'price': p['price']}})")
                .expecting("10.45"),
        ],
    )
    .await;
    let base_url = model.base_url();
    let env = [
        ("TOOLYARD_MODEL_BASE_URL", base_url.as_str()),
        ("TOOLYARD_MODEL", "scripted-model"),
        ("TOOLYARD_MODEL_API_KEY", model.api_key()),
        ("TOOLYARD_LOG_FORMAT", "json"),
    ];
    let gateway = Gateway::start_with("tracing-coding", &store.otlp_endpoint, &env).await;
    let client = gateway.client().await;
    let (trace_id, client_span, traceparent) = client_context();
    let result = call(&client, "run_coding_task", json!({"task": "price the ATM call"}), &traceparent).await;
    let result = result.structured_content.expect("the task's result");
    assert_eq!(result["status"], "success", "{result}");
    assert!(model.failures().is_empty(), "{:?}", model.failures());

    let expected = [
        (GATEWAY, "tools/call run_coding_task"),
        (RUNNER, "agent.run"),
        (RUNNER, "model.generate"),
        (GATEWAY, "chat scripted-model"),
        (RUNNER, "tool.call"),
        (GATEWAY, "tools/call price_option"),
        (RUNNER, "call"),
        (FUNCTION, "pricing.options.price_option"),
    ];
    let trace = store.wait_for(&trace_id, &expected, STORE_WAIT).await.expect("the task's trace reaches the store");
    let task = trace.one(GATEWAY, "tools/call run_coding_task");
    assert_eq!(task.parent.as_deref(), Some(client_span.as_str()), "\n{}", trace.tree());
    let agent = trace.one(RUNNER, "agent.run");
    assert_eq!(trace.parent(agent).id, task.id, "agent.run under the gateway's span:\n{}", trace.tree());

    // Two model calls, each through the gateway's proxy, with the tokens the model reported.
    let generations = trace.named(RUNNER, "model.generate");
    assert_eq!(generations.len(), 2, "\n{}", trace.tree());
    for generate in &generations {
        assert_eq!(trace.parent(generate).id, agent.id, "\n{}", trace.tree());
        assert_eq!(
            generate.tags.get("gen_ai.usage.input_tokens").map(String::as_str),
            Some("10"),
            "{:?}",
            generate.tags
        );
        assert_eq!(generate.tags.get("gen_ai.usage.output_tokens").map(String::as_str), Some("10"));
    }
    for chat in trace.named(GATEWAY, "chat scripted-model") {
        let proxy = trace.parent(chat);
        assert_eq!(proxy.name, "model.proxy", "\n{}", trace.tree());
        assert!(
            generations.iter().any(|g| g.id == trace.parent(proxy).id),
            "under a model.generate:\n{}",
            trace.tree()
        );
        assert_eq!(chat.tags.get("gen_ai.request.model").map(String::as_str), Some("scripted-model"));
    }

    // The agent's tool call: its child is the gateway's tools/call, then the runner and the function.
    let tool_call = trace.one(RUNNER, "tool.call");
    assert_eq!(trace.parent(tool_call).id, agent.id, "\n{}", trace.tree());
    let gateway_call = trace.one(GATEWAY, "tools/call price_option");
    assert_eq!(trace.parent(gateway_call).id, tool_call.id, "\n{}", trace.tree());
    assert_eq!(gateway_call.tags.get("toolyard.task.id"), task.tags.get("toolyard.task.id"));
    let runner = trace.one(RUNNER, "call");
    assert_eq!(trace.parent(trace.parent(runner)).id, gateway_call.id, "runner under execute:\n{}", trace.tree());
    client.cancel().await.expect("client closes");

    // The logs: JSON lines; those written in a span carry its trace and span ids; rmcp's
    // per-request lines are off; no secret of the run appears anywhere.
    let logs = gateway.logs();
    let lines: Vec<Value> = logs
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect();
    let finished = lines
        .iter()
        .find(|l| l["message"] == "call finished")
        .unwrap_or_else(|| panic!("no 'call finished' line in\n{logs}"));
    assert_eq!(finished["trace_id"].as_str(), Some(trace.id.as_str()), "{finished}");
    assert_eq!(finished["span_id"].as_str(), Some(gateway_call.id.as_str()), "the tools/call span: {finished}");
    let started = lines.iter().find(|l| l["message"] == "coding task started").expect("a 'coding task started' line");
    assert_eq!(started["span_id"].as_str(), Some(task.id.as_str()), "{started}");
    assert!(!lines.iter().any(|l| l["target"].as_str().is_some_and(|t| t.starts_with("rmcp"))), "rmcp lines:\n{logs}");
    for secret in [TOKEN, model.api_key()] {
        assert!(!logs.contains(secret), "a secret in the logs:\n{logs}");
    }
    gateway.stop().await;
}

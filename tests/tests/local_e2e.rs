//! The embedded local mode end to end: `toolyard_gateway::local::start` on loopback with the
//! real runner binary, real Python tool processes and the real local folder store, driven by
//! a real MCP client (rmcp over Streamable HTTP) — the pricing example and the misbehaving
//! fixture tools.

use crate::coding_support;
use crate::local_support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResult, ClientConfig};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientLifecycleMode, ClientServiceExt, RoleClient};
use serde_json::{Value, json};
use toolyard_api::OwnerKey;
use toolyard_api::protocol::CallResult;
use toolyard_gateway::local::LocalGateway;
use toolyard_gateway::serve::DataArgs;
use toolyard_tests::local::{self, TempDir};

const TOKEN: &str = "ty_local-e2e-test-token-0001";

/// The local mode, a connected client and the local mode's folder (removed after the local
/// mode has shut down: see [`local_support::Running`]).
struct Local {
    gateway: local_support::Running,
    client: RunningService<RoleClient, ClientConfig>,
    data: TempDir,
}

impl Local {
    async fn start(dir: &str) -> Self {
        let data = TempDir::new("local-e2e");
        let gateway = local_support::start(dir, &data, TOKEN, 4).await;
        Self::connect(gateway, data).await
    }

    /// The local mode with its files in `data` and these quota and retention settings.
    async fn start_with(dir: &str, data: TempDir, lifecycle: DataArgs) -> Self {
        let gateway = local_support::start_with(dir, &data, TOKEN, 4, lifecycle).await;
        Self::connect(gateway, data).await
    }

    async fn connect(gateway: local_support::Running, data: TempDir) -> Self {
        let transport = StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(gateway.mcp_url()).auth_header(TOKEN.to_owned()),
        );
        let client = ClientConfig::default()
            .serve_with_lifecycle(transport, ClientLifecycleMode::Initialize)
            .await
            .expect("MCP client connects");
        Self { gateway, client, data }
    }

    fn gateway(&self) -> &LocalGateway {
        &self.gateway
    }

    /// Shuts the gateway down, checks it stopped cleanly, and hands over its folder.
    async fn stop(self) -> TempDir {
        self.gateway.shutdown().await.expect("the local mode shuts down cleanly");
        self.data
    }

    async fn call(&self, tool: &str, arguments: Value) -> CallToolResult {
        let params = CallToolRequestParams::new(tool.to_owned())
            .with_arguments(arguments.as_object().expect("test setup").clone());
        self.client.call_tool(params).await.unwrap_or_else(|e| panic!("tools/call {tool}: {e}"))
    }

    /// The call folders of the local user, by name.
    fn calls(&self) -> Vec<PathBuf> {
        let owner = OwnerKey::derive("apikey", "local");
        let dir = self.gateway().data_dir.join("owners").join(owner.as_str()).join("calls");
        let mut calls: Vec<PathBuf> =
            std::fs::read_dir(dir).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default();
        calls.sort();
        calls
    }

    fn call_folder(&self, prefix: &str) -> PathBuf {
        let found: Vec<PathBuf> = self
            .calls()
            .into_iter()
            .filter(|p| p.file_name().expect("test setup").to_string_lossy().starts_with(prefix))
            .collect();
        assert_eq!(found.len(), 1, "one {prefix}* call folder: {found:?}");
        found.into_iter().next().expect("test setup")
    }

    /// The events of the one call whose folder starts with `prefix`, once its log ends with
    /// `call_finished`. That event comes after the answer, and a pooled call's whole folder is
    /// stored after it too: both are waited for.
    async fn finished_call_events(&self, prefix: &str) -> Vec<Value> {
        for _ in 0..100 {
            let folders: Vec<PathBuf> = self
                .calls()
                .into_iter()
                .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(prefix)))
                .collect();
            if let [folder] = folders.as_slice() {
                let events = call_events(folder);
                if events.last().is_some_and(|e| e["type"] == "call_finished") {
                    return events;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("no call_finished event for one {prefix}* call in {:?}", self.calls());
    }
}

/// The events of the call in `folder`, in segment order (`events/000001.jsonl`, ...). A
/// segment being written is a `.tmp-*` file until it is renamed into place; it is skipped.
fn call_events(folder: &Path) -> Vec<Value> {
    let mut segments: Vec<PathBuf> = std::fs::read_dir(folder.join("events"))
        .map(|d| d.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "jsonl")).collect())
        .unwrap_or_default();
    segments.sort();
    segments
        .iter()
        .flat_map(|s| read(s).lines().map(|l| serde_json::from_str(l).expect("an event line")).collect::<Vec<Value>>())
        .collect()
}

fn types_of(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().unwrap_or_default()).collect()
}

fn text_of(result: &CallToolResult) -> String {
    result.content.iter().filter_map(|c| c.as_text().map(|t| t.text.clone())).collect::<Vec<_>>().join("\n")
}

fn structured(result: &CallToolResult) -> Value {
    assert_ne!(result.is_error, Some(true), "unexpected error: {}", text_of(result));
    result.structured_content.clone().unwrap_or_else(|| panic!("no structured content: {result:?}"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

const ATM: fn() -> Value = || json!({"spot": 100, "strike": 100, "time_to_expiry": 1, "volatility": 0.2, "rate": 0.05});

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pricing_tools_price_greeks_and_quotes_in_both_modes() {
    let local = Local::start("examples/pricing").await;
    let mut names: Vec<String> = local
        .client
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .filter(|n| toolyard_gateway::mcp::builtin::Builtin::from_name(n).is_none())
        .collect();
    names.sort();
    assert_eq!(names, ["calc_greeks", "get_quote", "get_quote_fresh", "price_option"]);

    let price = structured(&local.call("price_option", ATM()).await);
    assert!((price["price"].as_f64().unwrap() - 10.4506).abs() < 1e-4, "{price}");
    assert_eq!(price["option_type"], "call");

    let greeks = structured(&local.call("calc_greeks", ATM()).await);
    assert!((greeks["delta"].as_f64().unwrap() - 0.6368).abs() < 1e-4, "{greeks}");
    assert!(greeks["theta"].as_f64().unwrap() < 0.0, "{greeks}");

    let pooled = structured(&local.call("get_quote", json!({"symbol": "aapl"})).await);
    let fresh = structured(&local.call("get_quote_fresh", json!({"symbol": "AAPL"})).await);
    assert_eq!(pooled, fresh);
    assert_eq!(pooled["symbol"], "AAPL");

    let unknown = local.call("get_quote", json!({"symbol": "NOPE"})).await;
    assert_eq!(unknown.is_error, Some(true));
    assert!(text_of(&unknown).contains("LookupError: unknown symbol 'NOPE'"), "{}", text_of(&unknown));

    // Every call left its files under the local user's prefix.
    let folder = local.call_folder("price-option-");
    let stored: CallResult = serde_json::from_str(&read(&folder.join("result.json"))).unwrap();
    assert_eq!(stored.value.as_ref(), Some(&price));
    assert_eq!(serde_json::from_str::<Value>(&read(&folder.join("input.json"))).unwrap(), ATM());
    local.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_arguments_get_a_clear_error_and_nothing_runs() {
    let local = Local::start("examples/pricing").await;
    let before = local.calls();
    let refused = local.call("price_option", json!({"spot": "x", "strike": 100})).await;
    assert_eq!(refused.is_error, Some(true));
    let message = text_of(&refused);
    assert!(message.contains("/spot") && message.contains("\"time_to_expiry\" is a required property"), "{message}");
    assert_eq!(local.calls(), before, "no call folder: nothing was stored or started");
    let pooled = local.call("get_quote", json!({"symbol": 5})).await;
    assert_eq!(pooled.is_error, Some(true));
    assert_eq!(local.calls(), before);
    local.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_that_ask_learn_who_called_and_others_learn_nothing() {
    let local = Local::start("tests/fixtures/misbehaving").await;
    let local_user = json!({"caller": {"issuer": "apikey", "user": "local", "groups": []}});
    // A fresh process per call (TOOLYARD_CALLER) and a reused jsonl worker (per request).
    assert_eq!(structured(&local.call("whoami", json!({})).await), local_user);
    for _ in 0..2 {
        assert_eq!(structured(&local.call("whoami_pool", json!({})).await), local_user);
    }
    // The same function under an McpTool that did not ask: no caller, no variable.
    let anonymous = structured(&local.call("whoami_anonymous", json!({})).await);
    assert_eq!(anonymous, json!({"caller": null, "environment": false}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misbehaving_tools_fail_cleanly() {
    let local = Local::start("tests/fixtures/misbehaving").await;

    let failed = local.call("fail", json!({"message": "boom"})).await;
    assert_eq!(failed.is_error, Some(true));
    assert!(text_of(&failed).contains("RuntimeError: boom"), "{}", text_of(&failed));

    let noisy = structured(&local.call("noisy", json!({"n": 50})).await);
    assert_eq!(noisy, json!({"n": 50}), "prints never reach the result");
    assert!(read(&local.call_folder("noisy-").join("stdout.log")).contains("raw fd 1 line 49"));

    let nan = local.call("nan", json!({})).await;
    assert_eq!(nan.is_error, Some(true));
    assert!(text_of(&nan).contains("NaN"), "{}", text_of(&nan));

    let echoed = json!({"nested": [1, "two", {"three": null}]});
    assert_eq!(
        structured(&local.call("echo", json!({"value": echoed.clone()})).await),
        json!({"value": echoed.clone()})
    );
    assert_eq!(
        structured(&local.call("echo_pool", json!({"value": echoed.clone()})).await),
        json!({"value": echoed.clone()})
    );
    // A pool call's files are written after its answer; shutting down waits for them.
    let calls =
        local.gateway().data_dir.join("owners").join(OwnerKey::derive("apikey", "local").as_str()).join("calls");
    let _data = local.stop().await;
    let pooled: Vec<_> = std::fs::read_dir(&calls)
        .expect("calls folder")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("echo-pool-")))
        .collect();
    assert_eq!(pooled.len(), 1, "{pooled:?}");
    let stored: CallResult = serde_json::from_str(&read(&pooled[0].join("result.json"))).unwrap();
    assert_eq!(stored.value, Some(json!({"value": echoed.clone()})));
    assert_eq!(serde_json::from_str::<Value>(&read(&pooled[0].join("input.json"))).unwrap(), json!({"value": echoed}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_reaches_the_client_and_each_call_logs_accepted_started_progress_finished() {
    let local = Local::start("tests/fixtures/misbehaving").await;
    // An rmcp client sends a progress token with every request and records the notifications.
    let client = coding_support::connect(&local.gateway().mcp_url(), TOKEN, false).await;
    for (tool, prefix) in [("steps", "steps-"), ("steps_pool", "steps-pool-")] {
        client.service().progress.lock().expect("lock").clear();
        let result = coding_support::call(&client, tool, json!({"n": 3, "pause": 0.6})).await;
        assert_eq!(structured(&result), json!({"n": 3}), "{tool}");
        // The client hands notifications to its handler in tasks of their own: the last one
        // may be recorded just after the answer.
        let mut progress = coding_support::progress_of(&client);
        for _ in 0..50 {
            if progress.last().is_some_and(|p| p.progress == 1.0) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            progress = coding_support::progress_of(&client);
        }
        assert!(progress.len() >= 2, "{tool}: {progress:?}");
        assert!(progress.windows(2).all(|w| w[1].progress > w[0].progress), "{tool}: {progress:?}");
        assert!(progress.iter().all(|p| p.total == Some(1.0)), "{tool}: {progress:?}");
        let last = progress.last().expect("progress");
        assert_eq!((last.progress, last.message.as_deref()), (1.0, Some("step 3 of 3")), "{tool}");

        let events = local.finished_call_events(prefix).await;
        let types = types_of(&events);
        assert_eq!(types[..2], ["call_accepted", "call_started"], "{tool}: {events:?}");
        assert_eq!(types.last(), Some(&"call_finished"), "{tool}");
        assert!(types[2..types.len() - 1].iter().all(|t| *t == "call_progress"), "{tool}: {types:?}");
        assert_eq!(events[0]["data"], json!({"tool": tool, "mode": if tool == "steps" { "Job" } else { "Pool" }}));
        let reported = &events[events.len() - 2];
        assert_eq!(reported["data"], json!({"fraction": 1.0, "message": "step 3 of 3"}), "{tool}: {events:?}");
        assert_eq!(events.last().expect("finished")["data"]["outcome"], "ok");
        let times: Vec<&str> = events.iter().map(|e| e["time"].as_str().expect("time")).collect();
        let parsed: Vec<k8s_openapi::jiff::Timestamp> = times.iter().map(|t| t.parse().expect("RFC 3339")).collect();
        assert!(parsed.windows(2).all(|w| w[0] <= w[1]), "{tool}: events in time order: {times:?}");
    }

    // A call whose client asked for no progress (the SDK's plain call) logs its lifecycle too,
    // and a timed-out one says so.
    let hung = local.call("hang", json!({"seconds": 600})).await;
    assert_eq!(hung.is_error, Some(true));
    let events = local.finished_call_events("hang-").await;
    assert_eq!(types_of(&events), ["call_accepted", "call_started", "call_finished"]);
    assert_eq!(events[2]["data"]["outcome"], "timed_out", "{events:?}");
    local.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_tool_times_out_at_its_deadline_and_its_process_group_is_gone() {
    let local = Local::start("tests/fixtures/misbehaving").await;
    let hung = local.call("hang", json!({"seconds": 600})).await;
    assert_eq!(hung.is_error, Some(true));
    assert!(text_of(&hung).contains("timed out after 2s"), "{}", text_of(&hung));

    let folder = local.call_folder("hang-");
    let stored: CallResult = serde_json::from_str(&read(&folder.join("result.json"))).unwrap();
    assert_eq!(stored.error.map(|e| e.kind), Some(toolyard_api::protocol::CallErrorKind::TimedOut));
    let stderr = read(&folder.join("stderr.log"));
    let (pid, child) = local::hang_pids(&stderr).unwrap_or_else(|| panic!("no pids in {stderr}"));
    assert!(!local::pid_alive(pid), "the tool process {pid} still runs");
    assert!(!local::pid_alive(child), "the tool's child process {child} still runs");
    local.stop().await;
}

/// A finished call's files are deleted by its owner with `delete_call`, named by the id in the
/// result's `_meta`; a second delete, or an id that is no call, answers "no such call".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_call_is_deleted_with_its_files() {
    let local = Local::start("examples/pricing").await;
    let priced = local.call("price_option", ATM()).await;
    structured(&priced);
    let meta = priced.meta.clone().expect("_meta");
    let id = meta.0[toolyard_gateway::mcp::CALL_ID_META].as_str().expect("the call id").to_owned();
    local.finished_call_events(&id).await;
    let folder = local.call_folder(&id);
    let deleted = structured(&local.call("delete_call", json!({"call_id": id})).await);
    assert_eq!(deleted["deleted"], true, "{deleted}");
    assert!(deleted["files"].as_u64().unwrap_or_default() >= 3, "input, result and events: {deleted}");
    assert!(!folder.exists(), "{} is gone", folder.display());
    for unknown in [id.as_str(), "price-option-000000000000", "../../etc"] {
        let again = local.call("delete_call", json!({"call_id": unknown})).await;
        assert_eq!((again.is_error, text_of(&again)), (Some(true), format!("no such call: {unknown:?}")));
    }
}

/// A client without the tasks extension starts a Job-mode call with `start_call` and follows
/// it with `get_call_result` to the tool's answer; the local mode runs the same path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_started_call_is_followed_to_its_result() {
    let local = Local::start("examples/pricing").await;
    let started = structured(&local.call("start_call", json!({"tool": "price_option", "arguments": ATM()})).await);
    assert_eq!(started["status"], "running", "a Job-mode call is started, not waited for: {started}");
    let id = started["call_id"].as_str().expect("call_id").to_owned();
    let mut followed = Value::Null;
    for _ in 0..300 {
        followed = structured(&local.call("get_call_result", json!({"call_id": id})).await);
        if followed["status"] != "running" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(followed["status"], "completed", "{followed}");
    let price = followed["result"]["structuredContent"]["price"].as_f64().expect("a price");
    assert!((price - 10.4506).abs() < 1e-4, "{followed}");
    let unknown = local.call("get_call_result", json!({"call_id": "price-option-000000000000"})).await;
    assert_eq!(text_of(&unknown), "no such call: \"price-option-000000000000\"");
}

/// The risk example (numpy, pandas and matplotlib installed in the Python the local mode
/// runs) on the embedded mode: VaR, stress scenarios, a PNG chart, and bad input named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_risk_example_computes_var_and_stress_and_returns_its_chart() {
    let local = Local::start("examples/risk").await;
    let book = json!({"us_equity": 1_000_000, "us_treasury_10y": 500_000});
    let var = structured(&local.call("historical_var", json!({"positions": book, "horizon_days": 10})).await);
    assert_eq!((var["observations"].as_u64(), var["horizon_days"].as_u64()), (Some(504), Some(10)), "{var}");
    let (value, shortfall) = (var["var"].as_f64().expect("var"), var["expected_shortfall"].as_f64().expect("es"));
    assert!(0.0 < value && value <= shortfall, "{var}");
    let stress = structured(&local.call("stress_test", json!({"positions": book})).await);
    assert_eq!(stress["worst"], "liquidity_shock", "{stress}");
    let crash = stress["results"].as_array().expect("results").iter().find(|r| r["scenario"] == "equity_crash");
    assert_eq!(crash.map(|r| r["pnl"].clone()), Some(json!(-230000.0)), "{stress}");

    let charted = local.call("pnl_chart", json!({"positions": book})).await;
    let chart = structured(&charted);
    assert_eq!(chart["image"], "pnl.png", "{chart}");
    let one_day = structured(&local.call("historical_var", json!({"positions": book})).await);
    assert_eq!(chart["var"], one_day["var"], "the chart marks the one-day VaR");
    let images: Vec<_> = charted.content.iter().filter_map(|c| c.as_image()).collect();
    assert_eq!(images.iter().map(|i| i.mime_type.as_str()).collect::<Vec<_>>(), ["image/png"]);

    let unknown = local.call("historical_var", json!({"positions": {"gold": 1}})).await;
    assert_eq!(unknown.is_error, Some(true));
    assert!(text_of(&unknown).contains("unknown risk factor(s) gold; known: us_equity"), "{}", text_of(&unknown));
}

/// A warm pool keeps calls waiting for a free slot up to its queue (`pool.queue`, 1 here) and
/// refuses the next at once as busy, counted in the metrics; a waiting call runs once the slot
/// is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_warm_pool_queues_then_refuses_and_counts_the_refusal() {
    let local = Arc::new(Local::start("tests/fixtures/misbehaving").await);
    let spawn = |seconds: f64| {
        let local = Arc::clone(&local);
        tokio::spawn(async move {
            let params = CallToolRequestParams::new("hang_pool")
                .with_arguments(json!({"seconds": seconds}).as_object().expect("test setup").clone());
            local.client.call_tool(params).await
        })
    };
    // The one slot is taken once the function's child `sleep 2.9` runs.
    let running = spawn(2.9);
    let mut started = false;
    for _ in 0..300 {
        started = std::fs::read_dir("/proc")
            .expect("/proc")
            .flatten()
            .any(|p| std::fs::read(p.path().join("cmdline")).is_ok_and(|c| c == b"sleep\x002.9\x00"));
        if started {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(started, "the first call runs");
    // Two more: whichever comes first waits in the queue, the other is refused.
    let (a, b) = (spawn(0.1), spawn(0.1));
    let (a, b) = (a.await.expect("join"), b.await.expect("join"));
    let refused: Vec<String> = [&a, &b].iter().filter_map(|r| r.as_ref().err()).map(ToString::to_string).collect();
    assert_eq!(refused.len(), 1, "{a:?} {b:?}");
    assert!(refused[0].contains("the tool's warm pool is at capacity"), "{refused:?}");
    for answered in [running.await.expect("join"), if a.is_ok() { a } else { b }] {
        let answered = answered.expect("tools/call");
        assert_ne!(answered.is_error, Some(true), "{}", text_of(&answered));
    }
    let metrics = local.gateway().metrics_addr.expect("the metrics listener");
    let text = reqwest::get(format!("http://{metrics}/metrics")).await.expect("metrics").text().await.expect("text");
    assert!(text.contains("toolyard_gateway_admission_rejections_total{reason=\"pool_busy\"} 1"), "{text}");
}

fn call_id(result: &CallToolResult) -> String {
    let meta = result.meta.clone().expect("_meta");
    meta.0[toolyard_gateway::mcp::CALL_ID_META].as_str().expect("the call id").to_owned()
}

/// At the storage quota a call is refused, saying how much is stored and how to free it;
/// deleting a call makes room again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_at_the_storage_quota_are_refused_until_something_is_deleted() {
    let quota = DataArgs { storage_quota_bytes: 1, ..DataArgs::default() };
    let local = Local::start_with("examples/pricing", TempDir::new("local-quota"), quota).await;
    // Nothing stored yet: both calls run (the second on the usage measured for the first).
    let first = local.call("price_option", ATM()).await;
    structured(&first);
    let second = local.call("price_option", ATM()).await;
    structured(&second);
    for r in [&first, &second] {
        local.finished_call_events(&call_id(r)).await;
    }
    // A deletion measures again: the second call's files are over the 1-byte quota.
    structured(&local.call("delete_call", json!({"call_id": call_id(&first)})).await);
    let refused = local.call("price_option", ATM()).await;
    assert_eq!(refused.is_error, Some(true), "{refused:?}");
    let text = text_of(&refused);
    assert!(
        text.starts_with("storage quota reached: your stored calls and tasks take ")
            && text.contains(" of your 1 bytes")
            && text.contains("delete_call, delete_task"),
        "{text}"
    );
    assert_eq!(local.calls().len(), 1, "the refused call stored nothing");
    structured(&local.call("delete_call", json!({"call_id": call_id(&second)})).await);
    structured(&local.call("price_option", ATM()).await);
}

/// With a retention, files older than it are deleted (the local folder has no lifecycle
/// rules: the gateway deletes them itself, first at start); newer ones stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_older_than_the_retention_are_deleted() {
    let data = TempDir::new("local-retention");
    let owner = OwnerKey::derive("apikey", "local");
    let calls = data.path().join("owners").join(owner.as_str()).join("calls");
    let plant = |name: &str, age: Duration| {
        let dir = calls.join(name);
        std::fs::create_dir_all(&dir).expect("folder");
        let file = std::fs::File::create(dir.join("result.json")).expect("file");
        file.set_modified(std::time::SystemTime::now() - age).expect("mtime");
    };
    plant("old-000000000001", Duration::from_secs(3 * 86_400));
    plant("new-000000000001", Duration::from_secs(3600));
    let retention = DataArgs { retention_days: 2, ..DataArgs::default() };
    let local = Local::start_with("examples/pricing", data, retention).await;
    for _ in 0..100 {
        if !calls.join("old-000000000001").exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!calls.join("old-000000000001").exists(), "the expired call and its folder are gone");
    assert!(calls.join("new-000000000001/result.json").exists(), "a newer call stays");
    drop(local);
}

/// A function returns an image and a file with its value, from a fresh process (Job mode) and
/// from a reused warm worker: the caller gets the image as image content and a link to each
/// file, stored as the caller's and readable with `resources/read` and `read_artifact`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn functions_return_images_and_files_in_both_modes() {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let local = Local::start("tests/fixtures/misbehaving").await;
    for tool in ["chart", "chart_pool"] {
        let r = local.call(tool, json!({"points": 3})).await;
        assert_eq!(structured(&r), json!({"points": 3, "image": "chart.png", "table": "data/points.csv"}), "{tool}");
        let id = call_id(&r);
        let images: Vec<_> = r.content.iter().filter_map(|c| c.as_image()).collect();
        assert_eq!(images.len(), 1, "{tool}: {:?}", r.content);
        assert_eq!(images[0].mime_type, "image/png");
        let png = b64.decode(&images[0].data).expect("base64");
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "{tool}: a PNG");
        let links: Vec<_> = r.content.iter().filter_map(|c| c.as_resource_link()).collect();
        let uris: Vec<&str> = links.iter().map(|l| l.uri.as_str()).collect();
        assert_eq!(
            uris,
            [
                format!("toolyard://calls/{id}/files/outputs/chart.png"),
                format!("toolyard://calls/{id}/files/outputs/data/points.csv")
            ],
            "{tool}"
        );
        assert_eq!((links[1].mime_type.as_deref(), links[1].size), (Some("text/csv"), Some(16)));

        // The CSV, through resources/read, and in the caller's folder.
        let read = local
            .client
            .read_resource(rmcp::model::ReadResourceRequestParams::new(uris[1]))
            .await
            .expect("resources/read");
        match &read.contents[0] {
            rmcp::model::ResourceContents::TextResourceContents { text, mime_type, .. } => {
                assert_eq!((text.as_str(), mime_type.as_deref()), ("x,y\n0,0\n1,1\n2,4\n", Some("text/csv")));
            }
            other => panic!("{tool}: expected text, got {other:?}"),
        }
        let stored = local.call_folder(&id).join("outputs/chart.png");
        assert_eq!(std::fs::read(&stored).expect("stored image"), png, "{tool}");
        // read_artifact by call id, in chunks like a task's files.
        let chunk = structured(
            &local.call("read_artifact", json!({"call_id": id, "filename": "chart.png", "encoding": "base64"})).await,
        );
        assert_eq!(b64.decode(chunk["content"].as_str().expect("content")).expect("base64"), png);
        let unknown = local.call("read_artifact", json!({"call_id": id, "filename": "nothing.png"})).await;
        assert_eq!(text_of(&unknown), format!("no file \"nothing.png\" in call {id:?}"));
    }
    // A link to another call, or out of the folder, reads as not found.
    for uri in ["toolyard://calls/chart-000000000000/files/outputs/chart.png", "toolyard://calls/x/files/outputs/../y"]
    {
        let e =
            local.client.read_resource(rmcp::model::ReadResourceRequestParams::new(uri)).await.expect_err("not found");
        assert!(e.to_string().contains("no such resource"), "{uri}: {e}");
    }

    // Returned files the runner must refuse fail the call, saying which and why.
    for (kind, reason) in [
        ("traversal", "a returned file's name \"../../../etc/passwd\" is not allowed"),
        ("link", "the returned file x.txt is not a plain file in the call's folder"),
        ("mime", "the image x.txt is image/svg+xml; images are image/png"),
        ("big", "the returned file x.txt has 9437184 bytes; the limit is 8 MiB"),
    ] {
        let r = local.call("hostile_output", json!({"kind": kind})).await;
        assert_eq!(r.is_error, Some(true), "{kind}: {r:?}");
        assert!(text_of(&r).contains(reason), "{kind}: {}", text_of(&r));
        assert!(!r.content.iter().any(|c| c.as_resource_link().is_some()), "{kind}: nothing linked");
    }
}

//! Shared by the coding-task tests of the embedded mode and the cluster: an MCP client that
//! records progress notifications, helpers for the task tools, and the scripted model
//! conversations of the scenarios.

#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, Implementation, ProgressNotificationParam,
};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, ClientLifecycleMode, ClientServiceExt, RoleClient};
use serde_json::{Map, Value, json};
use toolyard_tests::model_server::Turn;

/// The API key the scripted model requires.
pub const MODEL_KEY: &str = "sk-scripted-test-key-0001";
/// The model id the agent is configured with.
pub const MODEL_ID: &str = "scripted-model";

/// A client handler that records progress notifications.
#[derive(Clone)]
pub struct Recorder {
    /// Progress notifications received.
    pub progress: Arc<Mutex<Vec<ProgressNotificationParam>>>,
    config: ClientConfig,
}

impl ClientHandler for Recorder {
    fn get_info(&self) -> ClientConfig {
        self.config.clone()
    }

    async fn on_progress(&self, params: ProgressNotificationParam, _context: NotificationContext<RoleClient>) {
        self.progress.lock().expect("lock").push(params);
    }
}

/// An MCP client.
pub type Client = RunningService<RoleClient, Recorder>;

/// Connects to `url` with `token`. With `tasks_extension` the client declares the MCP tasks
/// extension and speaks protocol 2026-07-28 (`server/discover`, capabilities in every
/// request's `_meta`: a stateless server learns them from each request); otherwise it uses
/// the `initialize` handshake.
pub async fn connect(url: &str, token: &str, tasks_extension: bool) -> Client {
    connect_with(reqwest::Client::default(), url, token, tasks_extension).await
}

/// [`connect`] over `http` (for example a client that trusts a test CA, for `https://` URLs).
pub async fn connect_with(http: reqwest::Client, url: &str, token: &str, tasks_extension: bool) -> Client {
    let capabilities = if tasks_extension {
        ClientCapabilities::builder().enable_tasks().build()
    } else {
        ClientCapabilities::default()
    };
    let config = ClientConfig::new(capabilities, Implementation::new("coding-test", "0.1.0"));
    let mut attempt = 0;
    loop {
        attempt += 1;
        let recorder = Recorder { progress: Arc::default(), config: config.clone() };
        let transport = StreamableHttpClientTransport::with_client(
            http.clone(),
            StreamableHttpClientTransportConfig::with_uri(url.to_owned()).auth_header(token.to_owned()),
        );
        let lifecycle = if tasks_extension {
            ClientLifecycleMode::Discover { preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28] }
        } else {
            ClientLifecycleMode::Initialize
        };
        match recorder.serve_with_lifecycle(transport, lifecycle).await {
            Ok(client) => return client,
            // 503 + Retry-After (e.g. the apiserver's TokenReview was briefly unreachable on a
            // busy test cluster) means "try again": a real client does.
            Err(e) if attempt < 5 && format!("{e:?}").contains("status: 503") => {
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            Err(e) => panic!("MCP client connects: {e:?}"),
        }
    }
}

/// The progress notifications `client` received so far, in progress order (the client
/// handles notifications concurrently, so arrival order may differ).
pub fn progress_of(client: &Client) -> Vec<ProgressNotificationParam> {
    let mut all = client.service().progress.lock().expect("lock").clone();
    all.sort_by(|a, b| a.progress.total_cmp(&b.progress));
    all
}

/// A JSON object as tool arguments.
pub fn args(v: Value) -> Map<String, Value> {
    v.as_object().cloned().expect("arguments are an object")
}

/// Calls a tool; panics on protocol errors.
pub async fn call(client: &Client, name: &str, arguments: Value) -> CallToolResult {
    let params = CallToolRequestParams::new(name.to_owned()).with_arguments(args(arguments));
    client.call_tool(params).await.unwrap_or_else(|e| panic!("tools/call {name}: {e}"))
}

/// Calls a tool with the client's `traceparent` in `_meta`.
pub async fn call_in_trace(client: &Client, name: &str, arguments: Value, traceparent: &str) -> CallToolResult {
    let mut params = CallToolRequestParams::new(name.to_owned()).with_arguments(args(arguments));
    let mut meta = rmcp::model::RequestMetaObject::new();
    meta.0.set_traceparent(traceparent);
    params.meta = Some(meta);
    client.call_tool(params).await.unwrap_or_else(|e| panic!("tools/call {name}: {e}"))
}

/// Calls a tool and returns a protocol error as text too.
pub async fn call_text(client: &Client, name: &str, arguments: Value) -> String {
    let params = CallToolRequestParams::new(name.to_owned()).with_arguments(args(arguments));
    match client.call_tool(params).await {
        Ok(r) => text_of(&r),
        Err(e) => e.to_string(),
    }
}

/// The text content of a result.
pub fn text_of(result: &CallToolResult) -> String {
    result.content.iter().filter_map(|c| c.as_text().map(|t| t.text.clone())).collect::<Vec<_>>().join("\n")
}

/// The structured content of a result (any `isError`).
pub fn structured(result: &CallToolResult) -> Value {
    result.structured_content.clone().unwrap_or_else(|| panic!("no structured content: {}", text_of(result)))
}

/// The structured content of a successful result.
pub fn ok(result: &CallToolResult) -> Value {
    assert_ne!(result.is_error, Some(true), "unexpected error: {}", text_of(result));
    structured(result)
}

/// Reads a whole task file through `read_artifact` in chunks of `length`, checking every
/// chunk's shape; returns the bytes and the answers.
pub async fn read_artifact(
    client: &Client,
    task: &str,
    filename: &str,
    encoding: &str,
    length: u64,
) -> (Vec<u8>, Vec<Value>) {
    let mut bytes = Vec::new();
    let mut answers = Vec::new();
    let mut offset = 0u64;
    loop {
        let answer = ok(&call(
            client,
            "read_artifact",
            json!({"task_id": task, "filename": filename, "offset": offset, "length": length, "encoding": encoding}),
        )
        .await);
        let keys: Vec<&str> = answer.as_object().expect("object").keys().map(String::as_str).collect();
        assert_eq!(keys, ["content", "encoding", "offset", "next_offset", "size"], "{answer}");
        assert_eq!(answer["offset"], offset);
        assert_eq!(answer["encoding"], encoding);
        let content = answer["content"].as_str().expect("content");
        let chunk = if encoding == "base64" {
            B64.decode(content).expect("each chunk decodes alone")
        } else {
            content.as_bytes().to_vec()
        };
        assert!(chunk.len() as u64 <= length, "a chunk is at most `length` bytes");
        bytes.extend(chunk);
        answers.push(answer.clone());
        match answer["next_offset"].as_u64() {
            Some(next) => {
                assert!(next > offset, "next_offset moves on");
                offset = next;
            }
            None => {
                assert_eq!(answer["size"].as_u64(), Some(bytes.len() as u64), "size is the whole file");
                return (bytes, answers);
            }
        }
    }
}

/// Polls `get_task_result` until the task is final (bounded).
pub async fn wait_final(client: &Client, task: &str, timeout: Duration) -> Value {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let result = call(client, "get_task_result", json!({"task_id": task})).await;
        let v = structured(&result);
        if !matches!(v["status"].as_str(), Some("pending" | "running")) {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "task {task} still {} after {timeout:?}", v["status"]);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The system prompt of a recorded model request.
pub fn system_prompt(request: &Value) -> String {
    request["messages"][0]["content"].as_str().unwrap_or_default().to_owned()
}

/// The text of the last message of a recorded model request.
pub fn last_message(request: &Value) -> String {
    let last = request["messages"].as_array().and_then(|m| m.last()).cloned().unwrap_or_default();
    match &last["content"] {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The arguments of one pricing scenario (a 3-month call struck at 100, 25% vol, 4% rate).
pub fn scenario(spot: f64) -> Value {
    json!({"spot": spot, "strike": 100, "time_to_expiry": 0.25, "volatility": 0.25, "rate": 0.04, "option_type": "call"})
}

/// The prompt of the pricing task.
pub const PRICING_TASK: &str = "Compare a European call at spots 90, 100 and 110 (strike 100, 3 months, volatility \
                                25%, rate 4%): price and delta per share. Save the scenarios as scenarios.csv.";

/// The pricing conversation: a step that raises (repaired next), the computation with the
/// CSV, a final answer that breaks the contract (repaired next), then the accepted one.
pub fn pricing_turns() -> Vec<Turn> {
    vec![
        Turn::code(
            "first = price_option(spot=100, strike=100, time_to_expiry=0.25, volatility=0.25, rate=0.04)\n\
             print('price at 100:', first['price'])\n\
             print(first['value'])",
        ),
        Turn::code(
            "import csv, io\n\
             rows = []\n\
             for spot in (90, 100, 110):\n    \
                 args = dict(spot=spot, strike=100, time_to_expiry=0.25, volatility=0.25, rate=0.04, option_type='call')\n    \
                 price = price_option(**args)['price']\n    \
                 delta = calc_greeks(**args)['delta']\n    \
                 rows.append((spot, price, delta))\n\
             buf = io.StringIO()\n\
             writer = csv.writer(buf, lineterminator='\\n')\n\
             writer.writerow(['spot', 'price', 'delta'])\n\
             for spot, price, delta in rows:\n    \
                 writer.writerow([spot, repr(price), repr(delta)])\n\
             write_artifact('scenarios.csv', buf.getvalue())\n\
             print(read_written_artifact('scenarios.csv'))",
        )
        .expecting("Traceback (most recent call last)")
        .expecting("KeyError: 'value'")
        .expecting("price at 100:"),
        Turn::code("final_answer({'task_type': 'analysis', 'metrics': {'price_100': rows[1][1]}})")
            .expecting("spot,price,delta"),
        Turn::code(
            "final_answer({'task_type': 'analysis',\n\
             'summary': 'The call is worth more and its delta is higher as spot rises from 90 to 110.',\n\
             'metrics': {'price_90': rows[0][1], 'price_100': rows[1][1], 'price_110': rows[2][1],\n\
                         'delta_90': rows[0][2], 'delta_100': rows[1][2], 'delta_110': rows[2][2]},\n\
             'assumptions': ['Black-Scholes-Merton', 'no dividends']})",
        )
        .expecting("final_answer was not accepted")
        .expecting("summary is required"),
    ]
}

/// Parses the scenarios CSV: (spot, price, delta) per row.
pub fn parse_scenarios(csv: &str) -> Vec<(f64, f64, f64)> {
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("spot,price,delta"), "{csv}");
    lines
        .map(|l| {
            let cells: Vec<f64> = l.split(',').map(|c| c.parse().unwrap_or_else(|_| panic!("{c} in {l}"))).collect();
            (cells[0], cells[1], cells[2])
        })
        .collect()
}

/// Checks the pricing task end to end: its result, what the model was sent, its files
/// through `list_artifacts` / `read_artifact` / resources, and the CSV against direct calls.
pub async fn check_pricing(client: &Client, result: &Value, requests: &[Value]) {
    assert_eq!(result["status"], "success", "{result}");
    assert_eq!(result["task_type"], "analysis", "{result}");
    assert_eq!((result["steps"].as_u64(), result["model_calls"].as_u64()), (Some(4), Some(4)), "{result}");
    assert_eq!(result["tool_calls"], 7, "{result}");
    assert_eq!(result["assumptions"], json!(["Black-Scholes-Merton", "no dividends"]));
    let task = result["task_id"].as_str().expect("task id").to_owned();
    let artifacts = result["artifacts"].as_array().expect("artifacts");
    assert_eq!(artifacts.len(), 1, "{result}");
    assert_eq!(
        (artifacts[0]["name"].as_str(), artifacts[0]["path"].as_str()),
        (Some("scenarios.csv"), Some("outputs/scenarios.csv"))
    );

    // What the model was sent: the tools with their signatures, the task, the traceback.
    assert_eq!(requests.len(), 4, "four model calls");
    let system = system_prompt(&requests[0]);
    assert!(
        system.contains(
            "- price_option(spot: float, strike: float, time_to_expiry: float, volatility: float, rate: float"
        ),
        "{system}"
    );
    assert!(system.contains("- calc_greeks(") && system.contains("final_answer"), "{system}");
    assert_eq!(requests[0]["model"], MODEL_ID);
    assert!(last_message(&requests[0]).contains("spots 90, 100 and 110"));
    let observation = last_message(&requests[1]);
    assert!(
        observation.contains("Traceback (most recent call last)") && observation.contains("KeyError: 'value'"),
        "{observation}"
    );

    // The CSV, read back in small text chunks and in base64 chunks, equals direct calls.
    let size = artifacts[0]["size"].as_u64().expect("size");
    let (text, chunks) = read_artifact(client, &task, "scenarios.csv", "text", 16).await;
    assert!(chunks.len() > 2, "read in several chunks");
    assert_eq!(text.len() as u64, size);
    let (bytes, _) = read_artifact(client, &task, "outputs/scenarios.csv", "base64", 10).await;
    assert_eq!(bytes, text);
    let rows = parse_scenarios(std::str::from_utf8(&text).expect("utf-8"));
    assert_eq!(rows.iter().map(|r| r.0).collect::<Vec<_>>(), [90.0, 100.0, 110.0]);
    // The direct calls at once: each is a Job of its own on a cluster.
    let direct = futures::future::join_all(rows.iter().map(|(spot, _, _)| async move {
        let (priced, greeks) =
            tokio::join!(call(client, "price_option", scenario(*spot)), call(client, "calc_greeks", scenario(*spot)));
        (ok(&priced)["price"].as_f64().expect("price"), ok(&greeks)["delta"].as_f64().expect("delta"))
    }))
    .await;
    for ((spot, price, delta), (direct_price, direct_delta)) in rows.iter().zip(direct) {
        assert_eq!((*price, *delta), (direct_price, direct_delta), "spot {spot}");
        let key = format!("price_{spot}");
        assert_eq!(result["metrics"][&key].as_f64(), Some(direct_price), "{key}");
    }
    assert!(rows[0].1 < rows[1].1 && rows[1].1 < rows[2].1 && rows[0].2 < rows[2].2, "{rows:?}");

    // Every file of the task is listed and readable.
    let listed = ok(&call(client, "list_artifacts", json!({"task_id": task})).await);
    assert_eq!(listed["artifacts"], json!(result["artifacts"]), "{listed}");
    let files: Vec<&str> =
        listed["files"].as_array().expect("files").iter().filter_map(|f| f["path"].as_str()).collect();
    for expected in ["actions/0001.py", "actions/0004.py", "outputs/scenarios.csv", "result.json", "tool_calls.json"] {
        assert!(files.contains(&expected), "{expected} in {files:?}");
    }
    let (code, _) = read_artifact(client, &task, "actions/0002.py", "text", 256 * 1024).await;
    assert!(String::from_utf8(code).expect("utf-8").contains("calc_greeks(**args)"));
    let (calls, _) = read_artifact(client, &task, "tool_calls.json", "text", 256 * 1024).await;
    let calls: Vec<Value> = serde_json::from_slice(&calls).expect("tool_calls.json");
    assert_eq!(calls.len(), 7);
    assert_eq!((calls[0]["step"].as_u64(), calls[0]["tool"].as_str()), (Some(1), Some("price_option")));
    assert!(calls.iter().all(|c| c["is_error"] == false && c["call_id"].is_string()), "{calls:?}");
    let (stored, _) = read_artifact(client, &task, "result.json", "text", 256 * 1024).await;
    let stored: Value = serde_json::from_slice(&stored).expect("result.json");
    assert_eq!(stored["summary"], result["summary"]);

    let event_files: Vec<&str> = files.iter().copied().filter(|f| f.starts_with("events/")).collect();
    let mut types = Vec::new();
    for f in event_files {
        let (lines, _) = read_artifact(client, &task, f, "text", 256 * 1024).await;
        for line in String::from_utf8(lines).expect("utf-8").lines() {
            let event: Value = serde_json::from_str(line).expect("event");
            types.push(event["type"].as_str().expect("type").to_owned());
        }
    }
    for expected in [
        "task_created",
        "agent_started",
        "model_call_started",
        "model_call_finished",
        "tool_call_started",
        "tool_call_finished",
        "artifact_written",
        "step_finished",
        "agent_finished",
    ] {
        assert!(types.iter().any(|t| t == expected), "{expected} in {types:?}");
    }
    assert_eq!(types.first().map(String::as_str), Some("task_created"));
    assert_eq!(types.last().map(String::as_str), Some("agent_finished"));

    // The same through resources.
    let csv_uri = format!("toolyard://tasks/{task}/files/outputs/scenarios.csv");
    let read = client
        .read_resource(rmcp::model::ReadResourceRequestParams::new(csv_uri.clone()))
        .await
        .expect("resources/read");
    let content = serde_json::to_value(&read.contents[0]).expect("contents");
    assert_eq!(content["text"].as_str().map(str::as_bytes), Some(text.as_slice()));
    assert_eq!(content["mimeType"], "text/csv");
    let templates = client.list_all_resource_templates().await.expect("templates");
    assert_eq!(templates.len(), 4, "task result, events, files, and call files");
    let resources = client.list_all_resources().await.expect("resources/list");
    assert!(resources.iter().any(|r| r.uri == format!("toolyard://tasks/{task}/result")), "{resources:?}");

    let listed = ok(&call(client, "list_tasks", json!({"status": "success"})).await);
    assert!(listed["tasks"].as_array().expect("tasks").iter().any(|t| t["task_id"] == task.as_str()), "{listed}");
    let again = structured(&call(client, "get_task_result", json!({"task_id": task})).await);
    assert_eq!(&again, result);
}

/// The hostile model's step (`tests/fixtures/hostile/escapes.py`) with the internal API URLs a
/// clever model might guess and the values that must not be found anywhere it can read.
pub fn hostile_code(candidate_urls: &[String], secrets: &[&str]) -> String {
    let code =
        std::fs::read_to_string(toolyard_tests::repo_path("tests/fixtures/hostile/escapes.py")).expect("fixture");
    code.replace("CANDIDATE_URLS = []", &format!("CANDIDATE_URLS = {}", json!(candidate_urls)))
        .replace("SECRETS = []", &format!("SECRETS = {}", json!(secrets)))
}

/// What the hostile step reported: the `ESCAPES` line of the observation in `request` (the
/// model request that followed the step).
pub fn escapes_of(request: &Value) -> Map<String, Value> {
    let observation = last_message(request);
    let line = observation
        .lines()
        .find_map(|l| l.trim().strip_prefix("ESCAPES "))
        .unwrap_or_else(|| panic!("the hostile step printed no ESCAPES line: {observation}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

/// Every escape the hostile step tried was refused: no /proc file of the runner (or of any
/// process) gave it anything, no credential was readable anywhere, its own environment holds
/// none, and the internal API refused it everywhere (and was found at least once: the test
/// would prove nothing otherwise).
pub fn assert_no_escape(escapes: &Map<String, Value>) {
    for (name, outcome) in escapes {
        if let Some(text) = outcome.as_str() {
            assert!(text.starts_with("refused"), "{name}: {text}\n{escapes:?}");
        }
    }
    assert_eq!(escapes["credentials in /proc"], json!([]), "{escapes:?}");
    assert_eq!(escapes["own environment"], json!([]), "{escapes:?}");
    let answers = escapes["internal api"].as_object().expect("internal api answers");
    for (what, answer) in answers {
        assert!(answer.as_u64().is_none_or(|code| !(200..300).contains(&code)), "{what} answered {answer}");
    }
    assert!(answers.values().any(|a| a == 401), "the internal API was never reached: {answers:?}");
}

/// Polls `tasks/get` for `id` (every 100 ms, `timeout` at most) until it is no longer working:
/// the task as JSON (`status`, and `result` or `error`), or `None` when it still works.
pub async fn finished_task(client: &Client, id: &str, timeout: Duration) -> Option<Value> {
    let deadline = tokio::time::Instant::now() + timeout;
    while tokio::time::Instant::now() < deadline {
        let got = client.peer().get_task(rmcp::model::GetTaskParams::new(id.to_owned())).await.expect("tasks/get");
        if got.task.status() != rmcp::model::TaskStatus::Working {
            return Some(serde_json::to_value(got).expect("json"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

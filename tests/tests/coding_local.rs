//! Coding tasks on the embedded mode, end to end: the real `toolyard-gateway local` binary
//! (model settings from its environment), the real `toolyard-runner agent` child process with
//! its Python harness, real tool processes, the local folder store, a real MCP client — and
//! the deterministic scripted model server in place of an LLM.

use crate::coding_support;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use coding_support::{Client, MODEL_ID, MODEL_KEY, call, call_text, connect, ok, structured, text_of, wait_final};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, GetTaskParams, TaskStatus as McpTaskStatus,
};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use toolyard_tests::legacy::LegacySession;
use toolyard_tests::local::{self, TempDir, toolyard};
use toolyard_tests::model_server::{Gate, Reply, ScriptedModel, Turn, wait_for_requests};
use toolyard_tests::repo_path;

const TOKEN: &str = "ty_coding-local-test-token-0001";

/// A running `toolyard-gateway local`.
struct LocalGateway {
    child: tokio::process::Child,
    url: String,
    log: PathBuf,
    /// The folder the log is in, removed with the gateway.
    _log_dir: TempDir,
}

/// Model settings given to the gateway's environment.
enum ModelEnv<'a> {
    Scripted(&'a ScriptedModel),
    Url(String),
    None,
}

impl LocalGateway {
    async fn start(tools: &Path, data: &Path, model: ModelEnv<'_>, extra: &[&str]) -> Self {
        let log_dir = TempDir::new("coding-local-log");
        let log = log_dir.join("gateway.log");
        let mut command = tokio::process::Command::new(local::binary("toolyard-gateway"));
        command
            .arg("local")
            .arg(tools)
            .arg("--data-dir")
            .arg(data)
            // The token by environment, as docs/usage.md says: a command line is readable by any
            // process of the user (the hostile model test looks there too).
            .env("TOOLYARD_LOCAL_TOKEN", TOKEN)
            .args(["--listen", "127.0.0.1:0", "--kill-grace", "0.5"])
            .args(["--runner", local::binary("toolyard-runner").to_str().expect("utf-8"), "--python", &local::python()])
            .args(extra)
            .env_remove("TOOLYARD_MODEL_BASE_URL")
            .env_remove("TOOLYARD_MODEL")
            .env_remove("TOOLYARD_MODEL_API_KEY")
            .env("RUST_LOG", "info,toolyard_gateway=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .kill_on_drop(true);
        match model {
            ModelEnv::Scripted(m) => {
                command
                    .env("TOOLYARD_MODEL_BASE_URL", m.base_url())
                    .env("TOOLYARD_MODEL", MODEL_ID)
                    .env("TOOLYARD_MODEL_API_KEY", m.api_key());
            }
            ModelEnv::Url(url) => {
                command.env("TOOLYARD_MODEL_BASE_URL", url).env("TOOLYARD_MODEL", MODEL_ID);
            }
            ModelEnv::None => {}
        }
        let mut child = command.spawn().expect("the gateway starts");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut url = None;
        while url.is_none() {
            let line = tokio::time::timeout(Duration::from_secs(120), lines.next_line())
                .await
                .expect("the banner")
                .expect("read");
            let Some(line) = line else {
                panic!("the gateway exited: {}", std::fs::read_to_string(&log).unwrap_or_default())
            };
            url = line.trim().strip_prefix("MCP URL:").map(|u| u.trim().to_owned());
        }
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Self { child, url: url.expect("url"), log, _log_dir: log_dir }
    }

    async fn client(&self) -> Client {
        connect(&self.url, TOKEN, false).await
    }

    fn dump_log(&self) {
        eprintln!("----- gateway log -----\n{}", std::fs::read_to_string(&self.log).unwrap_or_default());
    }

    /// SIGTERM, as a user stopping it, and wait; returns its log (whose folder goes with it).
    async fn stop(mut self) -> String {
        if let Some(pid) = self.child.id() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGTERM);
        }
        let _ = tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await;
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The pricing tools plus a policy allowing only some of them, in a temp folder.
fn policy_file(dir: &TempDir, tools: &[&str]) -> PathBuf {
    let path = dir.path().join("policy.yaml");
    let tools: Vec<String> = tools.iter().map(|t| format!("\"{t}\"")).collect();
    std::fs::write(
        &path,
        format!("rules:\n  - users: [local]\n    tools: [{}]\n    codingTasks: true\n", tools.join(", ")),
    )
    .expect("policy");
    path
}

/// Starts a task whose first model answer waits for `gate`; returns its waiting
/// `run_coding_task` call and its id, once it runs.
async fn start_held_task(
    gateway: &LocalGateway,
    client: &Client,
    model: &ScriptedModel,
    gate: &Gate,
) -> (tokio::task::JoinHandle<Value>, String) {
    let before = model.requests().len();
    model.push(vec![Turn::code("print('never')").held(gate)]);
    let waiting = {
        let client = gateway.client().await;
        tokio::spawn(async move { structured(&call(&client, "run_coding_task", json!({"task": "slow"})).await) })
    };
    wait_for_requests(model, before + 1, Duration::from_secs(60)).await.expect("the agent asks the model");
    let running = ok(&call(client, "list_tasks", json!({"status": "running"})).await);
    let task = running["tasks"][0]["task_id"].as_str().expect("a running task").to_owned();
    (waiting, task)
}

/// The folder of task `task` of the local user in the data folder `data`.
fn task_folder(data: &TempDir, task: &str) -> PathBuf {
    data.path().join("owners").join(toolyard_api::OwnerKey::derive("apikey", "local").as_str()).join("tasks").join(task)
}

async fn run_task(client: &Client, arguments: Value) -> Value {
    let result = call(client, "run_coding_task", arguments).await;
    structured(&result)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pricing_task_computes_saves_and_reads_back_its_scenarios_on_the_embedded_mode() {
    let model = ScriptedModel::start(MODEL_KEY, coding_support::pricing_turns()).await;
    let data = TempDir::new("coding-local-pricing");
    let gateway =
        LocalGateway::start(&repo_path("examples/pricing"), data.path(), ModelEnv::Scripted(&model), &[]).await;
    let client = gateway.client().await;

    let names: Vec<String> =
        client.list_all_tools().await.expect("tools/list").into_iter().map(|t| t.name.to_string()).collect();
    for builtin in [
        "run_coding_task",
        "get_task_result",
        "list_tasks",
        "cancel_task",
        "list_artifacts",
        "read_artifact",
        "tool_search",
    ] {
        assert!(names.iter().any(|n| n == builtin), "{builtin} in {names:?}");
    }

    let result =
        run_task(&client, json!({"task": coding_support::PRICING_TASK, "tools": ["price_option", "calc_greeks"]}))
            .await;
    if result["status"] != "success" {
        gateway.dump_log();
    }
    assert!(model.failures().is_empty(), "the model was sent what the script expects: {:?}", model.failures());
    assert_eq!(model.remaining(), 0);
    coding_support::check_pricing(&client, &result, &model.requests()).await;

    // Progress notifications came while it ran; the first names the task.
    let progress = coding_support::progress_of(&client);
    assert!(progress.len() >= 2, "{progress:?}");
    assert!(progress[0].message.as_deref().unwrap_or_default().contains(result["task_id"].as_str().unwrap()));
    assert!(progress.windows(2).all(|w| w[1].progress > w[0].progress), "progress only grows: {progress:?}");
    assert!(
        progress.iter().any(|p| p.message.as_deref().unwrap_or_default().contains("calling price_option")),
        "{progress:?}"
    );

    // Only the tools the task was given: the agent's system prompt lists just those two.
    let system = coding_support::system_prompt(&model.requests()[0]);
    assert!(!system.contains("get_quote"), "{system}");

    // tool_search finds tools by words.
    let found = ok(&call(&client, "tool_search", json!({"query": "greeks"})).await);
    assert_eq!(found["tools"].as_array().map(|t| t.len()), Some(1), "{found}");
    assert_eq!(found["tools"][0]["name"], "calc_greeks");

    // The `toolyard` command: the task in the list, its result, its files, one fetched.
    let task = result["task_id"].as_str().expect("task id");
    let listed = toolyard(&gateway.url, TOKEN, &["tasks"]).await;
    assert_eq!(listed.code, 0, "{listed:?}");
    assert!(listed.stdout.lines().any(|l| l.starts_with(task) && l.contains("success")), "{}", listed.stdout);
    let shown = toolyard(&gateway.url, TOKEN, &["tasks", task]).await;
    assert_eq!(shown.code, 0, "{shown:?}");
    assert!(
        shown.stdout.contains("status:  success") && shown.stdout.contains("artifact: scenarios.csv"),
        "{}",
        shown.stdout
    );
    let files = toolyard(&gateway.url, TOKEN, &["artifacts", task]).await;
    assert!(files.stdout.lines().any(|l| l.starts_with("scenarios.csv ")), "{}", files.stdout);
    assert!(files.stdout.lines().any(|l| l.starts_with("result.json ")), "{}", files.stdout);
    let csv = data.path().with_extension("scenarios.csv");
    let fetched =
        toolyard(&gateway.url, TOKEN, &["artifacts", task, "scenarios.csv", "-o", csv.to_str().unwrap()]).await;
    assert_eq!(fetched.code, 0, "{fetched:?}");
    let rows = coding_support::parse_scenarios(&std::fs::read_to_string(&csv).expect("the fetched file"));
    let _ = std::fs::remove_file(&csv);
    assert_eq!(rows.len(), 3, "{rows:?}");
    let unknown = toolyard(&gateway.url, TOKEN, &["tasks", "no-such-task"]).await;
    assert_ne!(unknown.code, 0, "{unknown:?}");
    let deleted = toolyard(&gateway.url, TOKEN, &["tasks", task, "--delete"]).await;
    assert_eq!(deleted.code, 0, "{deleted:?}");
    assert!(deleted.stdout.starts_with(&format!("{task}: deleted (")), "{}", deleted.stdout);
    let gone = toolyard(&gateway.url, TOKEN, &["tasks", task]).await;
    assert!(gone.code != 0 && gone.stderr.contains("no such task"), "{gone:?}");

    // `check` sees the profile from the gateway, and the storage it writes.
    let check = toolyard(&gateway.url, TOKEN, &["check", "--require-agent"]).await;
    assert_eq!(check.code, 0, "{check:?}");
    assert!(check.stdout.contains("default (reachable, HTTP 200)"), "{}", check.stdout);
    assert!(check.stdout.lines().any(|l| l.starts_with("PASS  gateway.storage")), "{}", check.stdout);

    // A suite step replays the same task against the scripted model.
    model.set_script(coding_support::pricing_turns());
    let suite = data.path().with_extension("suite.yaml");
    let task_text = serde_json::to_string(coding_support::PRICING_TASK).expect("JSON is YAML");
    std::fs::write(
        &suite,
        format!(
            "tests:\n  - name: the pricing task\n    codingTask: {{task: {task_text}, tools: [price_option, calc_greeks]}}\n    \
             expect:\n      values:\n        - {{path: '$.artifacts[0].name', equals: scenarios.csv}}\n        \
             - {{path: $.status, equals: success}}\n"
        ),
    )
    .expect("suite");
    let run = toolyard(&gateway.url, TOKEN, &["test", suite.to_str().unwrap()]).await;
    let _ = std::fs::remove_file(&suite);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("PASS  the pricing task"), "{}", run.stdout);
    assert!(model.failures().is_empty(), "{:?}", model.failures());
    gateway.stop().await;
}

/// The agent's `tool_search()` is the gateway's ranking over the task's own tools: a tool
/// outside the task's selection is never found.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_agents_tool_search_ranks_the_tasks_tools_at_the_gateway() {
    let model = ScriptedModel::start(
        MODEL_KEY,
        vec![
            Turn::code("print([t['name'] for t in tool_search('option greeks')])\nprint(tool_search('quote'))"),
            Turn::code("final_answer({'task_type': 'answer', 'summary': 'searched'})")
                .expecting("['calc_greeks', 'price_option']")
                .expecting("[]"),
        ],
    )
    .await;
    let data = TempDir::new("coding-local-search");
    let gateway =
        LocalGateway::start(&repo_path("examples/pricing"), data.path(), ModelEnv::Scripted(&model), &[]).await;
    let client = gateway.client().await;
    let result = run_task(&client, json!({"task": "find the tools", "tools": ["price_option", "calc_greeks"]})).await;
    if result["status"] != "success" {
        gateway.dump_log();
    }
    assert_eq!(result["status"], "success", "{result}");
    assert!(model.failures().is_empty(), "{:?}", model.failures());
    gateway.stop().await;
}

/// The files a tool returns to a task's call become the task's artifacts (`<call id>/<name>`):
/// the step's output names each, the code reads them back, and the task's result lists them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn files_a_tool_returns_to_a_task_are_its_artifacts_and_its_code_reads_them() {
    // The note printed with the call is what a model reads; this script finds the artifact
    // names in it as a model would.
    let model = ScriptedModel::start(
        MODEL_KEY,
        vec![
            Turn::code(
                "import io, re, contextlib\nout = io.StringIO()\nwith contextlib.redirect_stdout(out):\n    \
                 r = chart(points=2)\nprint(out.getvalue())\nnames = re.findall(r'saved as the artifact \"([^\"]+)\"', \
                 out.getvalue())\nprint(read_written_artifact(names[1]))",
            ),
            Turn::code("final_answer({'task_type': 'answer', 'summary': 'charted'})")
                .expecting("returned chart.png (image/png, ")
                .expecting("returned data/points.csv (text/csv, 12 bytes), saved as the artifact")
                .expecting("x,y\n0,0\n1,1"),
        ],
    )
    .await;
    let data = TempDir::new("coding-local-files");
    let gateway =
        LocalGateway::start(&repo_path("tests/fixtures/misbehaving"), data.path(), ModelEnv::Scripted(&model), &[])
            .await;
    let client = gateway.client().await;
    let result = run_task(&client, json!({"task": "chart two points", "tools": ["chart"]})).await;
    if result["status"] != "success" {
        gateway.dump_log();
    }
    assert_eq!(result["status"], "success", "{result}");
    assert!(model.failures().is_empty(), "{:?}", model.failures());
    let names: Vec<&str> =
        result["artifacts"].as_array().expect("artifacts").iter().filter_map(|a| a["name"].as_str()).collect();
    assert_eq!(names.len(), 2, "{result}");
    let call = names[0].split('/').next().expect("the call id");
    assert!(call.starts_with("chart-"), "{names:?}");
    assert_eq!(names, [format!("{call}/chart.png"), format!("{call}/data/points.csv")], "{result}");
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tasks_that_cannot_finish_say_why_on_the_embedded_mode() {
    let gate = Gate::new();
    let model = ScriptedModel::start(MODEL_KEY, vec![]).await;
    let data = TempDir::new("coding-local-failures");
    let dir = TempDir::new("coding-local-policy");
    // The local user may call the pricing functions but not the quote tools.
    let policy = policy_file(&dir, &["price_option", "calc_greeks"]);
    let gateway = LocalGateway::start(
        &repo_path("examples/pricing"),
        data.path(),
        ModelEnv::Scripted(&model),
        &["--policy", policy.to_str().expect("utf-8")],
    )
    .await;
    let client = gateway.client().await;

    // A tool its owner may not call is as unknown to the agent as a tool that does not exist.
    model.push(vec![
        Turn::code(
            "for name in ('get_quote', 'no_such_tool'):\n    \
                 try:\n        \
                     globals()[name](symbol='AAPL')\n    \
                 except Exception as e:\n        \
                     print(name, '->', type(e).__name__, str(e).replace(name, 'X'))",
        ),
        Turn::code("final_answer({'task_type': 'unsupported', 'summary': 'No quote tool is available to me.'})")
            .expecting("get_quote -> KeyError 'X'")
            .expecting("no_such_tool -> KeyError 'X'"),
    ]);
    let result = run_task(&client, json!({"task": "What is the AAPL quote?"})).await;
    assert_eq!(
        (result["status"].as_str(), result["task_type"].as_str()),
        (Some("success"), Some("unsupported")),
        "{result}"
    );
    let system = coding_support::system_prompt(&model.requests()[0]);
    assert!(system.contains("price_option(") && !system.contains("get_quote"), "{system}");

    // Budget exhaustion: two steps without a final answer.
    let before = model.requests().len();
    model.push(vec![Turn::code("print('thinking')"), Turn::code("print('still thinking')")]);
    let result = run_task(&client, json!({"task": "loop", "budgets": {"max_steps": 2}})).await;
    assert_eq!((result["status"].as_str(), result["task_type"].as_str()), (Some("failed"), Some("failed")), "{result}");
    assert!(result["error"].as_str().unwrap().contains("step budget of 2 was exhausted"), "{result}");
    assert_eq!(model.requests().len() - before, 2);

    // The model call budget: answers without code cost model calls, not steps.
    model.push(vec![
        Turn::reply("Let me think about it."),
        Turn::reply("Still thinking.").expecting("had no ```python code block"),
    ]);
    let result = run_task(&client, json!({"task": "think", "budgets": {"max_steps": 1, "max_model_calls": 2}})).await;
    assert_eq!(result["status"], "failed", "{result}");
    assert!(result["error"].as_str().unwrap().contains("model call budget of 2 was exhausted"), "{result}");
    assert_eq!((result["steps"].as_u64(), result["model_calls"].as_u64()), (Some(0), Some(2)), "{result}");

    // The tool call budget.
    model.push(vec![Turn::code(
        "for s in (90, 100):\n    print(price_option(spot=s, strike=100, time_to_expiry=0.25, volatility=0.25, rate=0.04))",
    )]);
    let result = run_task(&client, json!({"task": "price twice", "budgets": {"max_tool_calls": 1}})).await;
    assert_eq!(result["status"], "failed", "{result}");
    assert!(result["error"].as_str().unwrap().contains("tool call budget of 1 was exhausted"), "{result}");
    assert_eq!(result["tool_calls"], 1);

    // The deadline: a step that sleeps past it.
    model.push(vec![Turn::code("import time\ntime.sleep(120)")]);
    let result = run_task(&client, json!({"task": "sleep", "budgets": {"timeout_seconds": 10}})).await;
    assert_eq!(result["status"], "timed_out", "{result}");
    assert!(result["error"].as_str().unwrap().contains("deadline"), "{result}");

    // Cancel: the model takes its time; the task is cancelled meanwhile.
    let (waiting, task) = start_held_task(&gateway, &client, &model, &gate).await;
    let cancelled = ok(&call(&client, "cancel_task", json!({"task_id": task})).await);
    assert_eq!(cancelled["cancel_requested"], true, "{cancelled}");
    let result = tokio::time::timeout(Duration::from_secs(60), waiting).await.expect("the wait ends").expect("join");
    gate.open();
    assert_eq!(
        (result["task_id"].as_str(), result["status"].as_str()),
        (Some(task.as_str()), Some("cancelled")),
        "{result}"
    );
    let again = ok(&call(&client, "cancel_task", json!({"task_id": task})).await);
    assert_eq!((again["status"].as_str(), again["cancel_requested"].as_bool()), (Some("cancelled"), Some(false)));

    // A finished task is deleted by its owner: its record and every file, in the data folder.
    let folder = task_folder(&data, &task);
    assert!(folder.exists(), "{}", folder.display());
    let deleted = ok(&call(&client, "delete_task", json!({"task_id": task})).await);
    assert_eq!(deleted["deleted"], true, "{deleted}");
    assert!(!folder.exists(), "{} is gone", folder.display());
    let listed = ok(&call(&client, "list_tasks", json!({})).await);
    assert!(!listed.to_string().contains(&task), "{listed}");

    // Deleting a running task cancels it first: its waiter hears "cancelled", nothing is left.
    let held = Gate::new();
    let (waiting, task) = start_held_task(&gateway, &client, &model, &held).await;
    let deleted = ok(&call(&client, "delete_task", json!({"task_id": task})).await);
    assert_eq!(deleted["deleted"], true, "{deleted}");
    let result = tokio::time::timeout(Duration::from_secs(60), waiting).await.expect("the wait ends").expect("join");
    held.open();
    assert_eq!(result["status"], "cancelled", "{result}");
    let folder = task_folder(&data, &task);
    assert!(!folder.exists(), "{} is gone", folder.display());

    // Unknown ids answer alike, whatever the tool.
    for tool in ["get_task_result", "cancel_task", "list_artifacts", "delete_task"] {
        let r = call(&client, tool, json!({"task_id": "task-000000000000"})).await;
        assert_eq!((r.is_error, text_of(&r)), (Some(true), "no such task: \"task-000000000000\"".to_owned()), "{tool}");
    }
    let r = call(&client, "read_artifact", json!({"task_id": "task-000000000000", "filename": "result.json"})).await;
    assert_eq!(text_of(&r), "no such task: \"task-000000000000\"");
    assert!(model.failures().is_empty(), "{:?}", model.failures());
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn model_endpoint_problems_and_missing_settings_are_reported_on_the_embedded_mode() {
    // No model configured: direct calls work, run_coding_task says what to set, at once.
    let data = TempDir::new("coding-local-nomodel");
    let gateway = LocalGateway::start(&repo_path("examples/pricing"), data.path(), ModelEnv::None, &[]).await;
    let client = gateway.client().await;
    ok(&call(&client, "price_option", coding_support::scenario(100.0)).await);
    let refused = call(&client, "run_coding_task", json!({"task": "anything"})).await;
    assert_eq!(refused.is_error, Some(true));
    let message = text_of(&refused);
    assert!(message.contains("TOOLYARD_MODEL_BASE_URL and TOOLYARD_MODEL"), "{message}");
    let listed = ok(&call(&client, "list_tasks", json!({})).await);
    assert_eq!(listed["tasks"], json!([]), "nothing was started");
    gateway.stop().await;

    // The endpoint is down.
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
    let data = TempDir::new("coding-local-down");
    let url = format!("http://127.0.0.1:{port}/v1");
    let gateway = LocalGateway::start(&repo_path("examples/pricing"), data.path(), ModelEnv::Url(url), &[]).await;
    let client = gateway.client().await;
    let result = structured(&call(&client, "run_coding_task", json!({"task": "anything"})).await);
    assert_eq!(result["status"], "failed", "{result}");
    let error = result["error"].as_str().unwrap_or_default();
    assert!(error.contains("the model endpoint of profile default is unreachable"), "{error}");
    let check = toolyard(&gateway.url, TOKEN, &["check", "--require-agent"]).await;
    assert_eq!(check.code, 1, "{check:?}");
    assert!(
        check.stdout.lines().any(|l| l.starts_with("FAIL  coding-tasks") && l.contains("default (unreachable")),
        "{}",
        check.stdout
    );
    gateway.stop().await;

    // A wrong key: refused, not retried.
    let model = ScriptedModel::start(MODEL_KEY, vec![]).await;
    let data = TempDir::new("coding-local-badkey");
    let gateway =
        LocalGateway::start(&repo_path("examples/pricing"), data.path(), ModelEnv::Url(model.base_url()), &[]).await;
    let client = gateway.client().await;
    let result = structured(&call(&client, "run_coding_task", json!({"task": "anything"})).await);
    assert_eq!(result["status"], "failed", "{result}");
    assert!(result["error"].as_str().unwrap_or_default().contains("refused the API key (401)"), "{result}");
    assert_eq!(model.rejected(), 1, "a refused key is not retried");
    let check = toolyard(&gateway.url, TOKEN, &["check", "--require-agent"]).await;
    assert!(
        check
            .stdout
            .lines()
            .any(|l| l.starts_with("FAIL  coding-tasks") && l.contains("refuses the profile's key (HTTP 401)")),
        "{}",
        check.stdout
    );
    gateway.stop().await;

    // Rate limited (429 with Retry-After), then a malformed answer: both retried, within budget.
    let model = ScriptedModel::start(
        MODEL_KEY,
        vec![
            Turn::with(Reply::Error { status: 429, retry_after: Some(1) }),
            Turn::with(Reply::Malformed("<html>busy</html>".into())),
            Turn::code("final_answer({'task_type': 'answer', 'summary': 'fine after all'})"),
        ],
    )
    .await;
    let data = TempDir::new("coding-local-flaky");
    let gateway =
        LocalGateway::start(&repo_path("examples/pricing"), data.path(), ModelEnv::Scripted(&model), &[]).await;
    let client = gateway.client().await;
    let result = structured(&call(&client, "run_coding_task", json!({"task": "anything"})).await);
    assert_eq!(
        (result["status"].as_str(), result["summary"].as_str()),
        (Some("success"), Some("fine after all")),
        "{result}"
    );
    assert_eq!(result["model_calls"], 2, "the 429 was retried inside one call; the malformed answer cost one");
    assert_eq!(model.requests().len(), 3);
    let arrivals = model.arrivals();
    assert!(arrivals[1] - arrivals[0] >= Duration::from_secs(1), "the retry waited as Retry-After asked");

    // Still malformed after the retries: failed, saying what the endpoint sent.
    let malformed = || Turn::with(Reply::Malformed("<html>busy</html>".into()));
    model.push(vec![malformed(), malformed(), malformed()]);
    let result = structured(&call(&client, "run_coding_task", json!({"task": "anything"})).await);
    assert_eq!((result["status"].as_str(), result["model_calls"].as_u64()), (Some("failed"), Some(3)), "{result}");
    let error = result["error"].as_str().unwrap_or_default();
    // (The agent's model endpoint is the gateway's model route of its task.)
    assert!(
        error.contains("/model sent a malformed response: not a chat completion")
            && error.contains("<html>busy</html>"),
        "{error}"
    );

    // Still rate limited after the retries.
    let limited = |secs| Turn::with(Reply::Error { status: 429, retry_after: Some(secs) });
    model.push(vec![limited(0), limited(0), limited(0), limited(0)]);
    let result = structured(&call(&client, "run_coding_task", json!({"task": "anything"})).await);
    assert_eq!(result["status"], "failed", "{result}");
    let error = result["error"].as_str().unwrap_or_default();
    assert!(error.contains("is rate limiting (429) after 4 attempts: scripted 429 Too Many Requests"), "{error}");
    assert_eq!(result["model_calls"], 1, "{result}");

    // A Retry-After longer than the agent waits ends the call at once, saying so.
    model.push(vec![limited(3600)]);
    let result = structured(&call(&client, "run_coding_task", json!({"task": "anything"})).await);
    assert_eq!(result["status"], "failed", "{result}");
    let error = result["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("is rate limiting (429) and asks to wait 3600s, longer than the 60s the agent waits"),
        "{error}"
    );
    assert_eq!(model.remaining(), 0);
    assert!(model.failures().is_empty(), "{:?}", model.failures());
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_tasks_extension_returns_a_handle_and_tasks_get_follows_it() {
    let gate = Gate::new();
    let model = ScriptedModel::start(
        MODEL_KEY,
        vec![
            Turn::code("print(price_option(spot=100, strike=100, time_to_expiry=1, volatility=0.2, rate=0.05))")
                .held(&gate),
            Turn::code("final_answer({'task_type': 'answer', 'summary': 'done'})").expecting("10.45"),
        ],
    )
    .await;
    let data = TempDir::new("coding-local-ext");
    let gateway =
        LocalGateway::start(&repo_path("examples/pricing"), data.path(), ModelEnv::Scripted(&model), &[]).await;
    let client = connect(&gateway.url, TOKEN, true).await;
    let params =
        CallToolRequestParams::new("run_coding_task").with_arguments(coding_support::args(json!({"task": "price"})));
    let CallToolResponse::Task(handle) = client.peer().call_tool_once(params).await.expect("tools/call") else {
        panic!("a tasks-extension client gets a task handle")
    };
    let id = handle.task.task_id.clone();
    assert_eq!(handle.task.status, McpTaskStatus::Working);
    let working = client.peer().get_task(GetTaskParams::new(id.clone())).await.expect("tasks/get");
    assert_eq!(working.task.status(), McpTaskStatus::Working);
    gate.open();
    let done = coding_support::finished_task(&client, &id, Duration::from_secs(60)).await.expect("the task completes");
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["structuredContent"]["task_type"], "answer", "{done}");
    assert_eq!(done["result"]["structuredContent"]["task_id"], id.as_str());
    let unknown = client.peer().get_task(GetTaskParams::new("task-000000000000")).await.unwrap_err().to_string();
    assert!(unknown.contains("no such task"), "{unknown}");
    let unknown = client.peer().cancel_task(CancelTaskParams::new("task-000000000000")).await.unwrap_err().to_string();
    assert!(unknown.contains("no such task"), "{unknown}");

    // A Job-mode tool runs as a task for this client too; a Pool-mode one answers at once.
    let params = CallToolRequestParams::new("price_option").with_arguments(coding_support::args(
        json!({"spot": 100, "strike": 100, "time_to_expiry": 1, "volatility": 0.2, "rate": 0.05}),
    ));
    let CallToolResponse::Task(handle) = client.peer().call_tool_once(params).await.expect("tools/call") else {
        panic!("a Job-mode call of a tasks-extension client is a task")
    };
    let call_id = handle.task.task_id.clone();
    let done =
        coding_support::finished_task(&client, &call_id, Duration::from_secs(30)).await.expect("the call completes");
    assert_eq!(done["status"], "completed", "{done}");
    let price = done["result"]["structuredContent"]["price"].as_f64().expect("a price");
    assert!((price - 10.4506).abs() < 1e-4, "{done}");
    assert_eq!(done["result"]["_meta"]["toolyard.dev/callId"], call_id.as_str());
    let quote = CallToolRequestParams::new("get_quote").with_arguments(coding_support::args(json!({"symbol": "aapl"})));
    let answered = client.peer().call_tool_once(quote).await.expect("tools/call");
    assert!(matches!(answered, CallToolResponse::Complete(_)), "a Pool-mode call answers at once: {answered:?}");
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gateway_restart_ends_a_running_local_task_and_keeps_every_result_readable() {
    let gate = Gate::new();
    let model = ScriptedModel::start(
        MODEL_KEY,
        vec![
            Turn::code("final_answer({'task_type': 'answer', 'summary': 'before the restart'})"),
            Turn::code("print('never runs')").held(&gate),
        ],
    )
    .await;
    let data = TempDir::new("coding-local-restart");
    let gateway =
        LocalGateway::start(&repo_path("examples/pricing"), data.path(), ModelEnv::Scripted(&model), &[]).await;
    let client = gateway.client().await;
    let finished = structured(&call(&client, "run_coding_task", json!({"task": "quick"})).await);
    assert_eq!(finished["status"], "success", "{finished}");
    let waiting = {
        let client = gateway.client().await;
        tokio::spawn(async move { call_text(&client, "run_coding_task", json!({"task": "slow"})).await })
    };
    wait_for_requests(&model, 2, Duration::from_secs(60)).await.expect("the second task asks the model");
    let running = ok(&call(&client, "list_tasks", json!({"status": "running"})).await);
    let task = running["tasks"][0]["task_id"].as_str().expect("running").to_owned();
    // The agent's temporary files are in a folder of its own under the data folder, which
    // the gateway removes even when it has to kill the agent.
    let own_tmp = data.path().join("scratch").join(&task);
    let agent_folders = || -> Vec<String> {
        std::fs::read_dir(&own_tmp)
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default()
    };
    assert!(agent_folders().iter().any(|f| f.starts_with(&format!("toolyard-agent-{task}-"))), "{own_tmp:?}");
    gateway.stop().await;
    let answered = waiting.await.expect("join");
    assert!(answered.contains("the gateway is restarting"), "a waiting client is told the task goes on: {answered}");
    gate.open();

    let gateway =
        LocalGateway::start(&repo_path("examples/pricing"), data.path(), ModelEnv::Scripted(&model), &[]).await;
    let client = gateway.client().await;
    let result = wait_final(&client, &task, Duration::from_secs(30)).await;
    assert_eq!(result["status"], "failed", "{result}");
    assert!(
        result["error"].as_str().unwrap_or_default().contains("the gateway stopped while the task was running"),
        "{result}"
    );
    let before = structured(&call(&client, "get_task_result", json!({"task_id": finished["task_id"]})).await);
    assert_eq!(before, finished, "a result from before the restart is still readable");
    let files = ok(&call(&client, "list_artifacts", json!({"task_id": task})).await);
    assert!(files["files"].as_array().expect("files").iter().any(|f| f["path"] == "events/000001.jsonl"), "{files}");
    assert!(!own_tmp.exists(), "the killed agent's temporary folder is gone: {:?}", agent_folders());
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn notifications_cancelled_on_a_separate_request_stops_a_running_call_on_the_embedded_mode() {
    let tools = TempDir::new("coding-local-hang");
    // The `hang` fixture with a long timeout: only a cancellation ends it soon.
    let fixture = std::fs::read_to_string(repo_path("tests/fixtures/misbehaving/tools.yaml")).expect("fixture");
    let hang = fixture.split("\n---\n").find(|d| d.contains("name: \"hang\"")).expect("hang manifest");
    let pythonpath =
        format!("{}:{}", repo_path("worker-image/python").display(), repo_path("tests/fixtures/misbehaving").display());
    let hang = hang.replace("timeoutSeconds: 2", "timeoutSeconds: 600").replace(
        "    command: [\"python3\", \"-m\", \"toolyard.run\", \"misbehaving:hang\"]",
        &format!("    command: [\"python3\", \"-m\", \"toolyard.run\", \"misbehaving:hang\"]\n    env:\n      - name: PYTHONPATH\n        value: \"{pythonpath}\""),
    );
    std::fs::write(tools.path().join("tools.yaml"), hang).expect("manifest");
    let data = TempDir::new("coding-local-hang-data");
    let gateway = LocalGateway::start(tools.path(), data.path(), ModelEnv::None, &[]).await;
    let http = reqwest::Client::new();
    let post = |body: Value| {
        http.post(&gateway.url)
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .body(body.to_string())
            .send()
    };
    let call = post(
        json!({"jsonrpc": "2.0", "id": 41, "method": "tools/call", "params": {"name": "hang", "arguments": {"seconds": 600}}}),
    );
    let call = tokio::spawn(call);
    // Wait until the tool runs (its call folder has its input).
    let calls =
        data.path().join("owners").join(toolyard_api::OwnerKey::derive("apikey", "local").as_str()).join("calls");
    toolyard_tests::wait_until(Duration::from_secs(60), "the hang call to start", || {
        let calls = calls.clone();
        async move { Ok(std::fs::read_dir(&calls).map(|d| d.count() > 0).unwrap_or(false)) }
    })
    .await
    .expect("the call starts");
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Another request, another connection: the cancellation notification alone.
    let accepted = post(
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 41, "reason": "user"}}),
    )
    .await
    .expect("POST");
    assert_eq!(accepted.status(), 202);
    let response = tokio::time::timeout(Duration::from_secs(30), call)
        .await
        .expect("the call ends soon")
        .expect("join")
        .expect("response");
    let body = response.text().await.expect("body");
    if !body.contains("cancelled") {
        gateway.dump_log();
    }
    assert!(body.contains("the call was cancelled"), "{body}");
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_subscription_hears_when_a_task_result_arrives() {
    let gate = Gate::new();
    let model = ScriptedModel::start(
        MODEL_KEY,
        vec![Turn::code("final_answer({'task_type': 'answer', 'summary': 'subscribed'})").held(&gate)],
    )
    .await;
    let data = TempDir::new("coding-local-subscribe");
    let gateway =
        LocalGateway::start(&repo_path("examples/pricing"), data.path(), ModelEnv::Scripted(&model), &[]).await;
    let client = connect(&gateway.url, TOKEN, true).await;
    let params =
        CallToolRequestParams::new("run_coding_task").with_arguments(coding_support::args(json!({"task": "x"})));
    let CallToolResponse::Task(handle) = client.peer().call_tool_once(params).await.expect("tools/call") else {
        panic!("a task handle")
    };
    let uri = format!("toolyard://tasks/{}/result", handle.task.task_id);
    let mut filter = rmcp::model::SubscriptionFilter::new();
    filter.resource_subscriptions = Some(vec![uri.clone(), "toolyard://tasks/task-000000000000/result".into()]);
    let mut subscription = client.peer().listen(filter).await.expect("subscriptions/listen");
    assert!(subscription.acknowledged().resource_subscriptions.as_ref().is_some_and(|u| u.contains(&uri)));

    // A 2025-11-25 client subscribes in its session, and hears on the session's GET stream.
    let session = LegacySession::open(&gateway.url, TOKEN).await;
    let mut stream = session.stream().await;
    let subscribe =
        |uri: &str| json!({"jsonrpc": "2.0", "id": 2, "method": "resources/subscribe", "params": {"uri": uri}});
    let subscribed = session.post(subscribe(&uri)).await;
    assert_eq!(subscribed["result"], json!({}), "{subscribed}");
    let other = session.post(subscribe("quotes://ACME/last")).await;
    assert_eq!(other["error"]["code"], -32002, "no server serves it: {other}");
    let sessionless = session.without_id().post(subscribe(&uri)).await;
    assert!(sessionless["error"]["message"].as_str().is_some_and(|m| m.contains("needs a session")), "{sessionless}");

    wait_for_requests(&model, 1, Duration::from_secs(60)).await.expect("the agent asks the model");
    gate.open();
    let heard = tokio::time::timeout(Duration::from_secs(60), stream.until("notifications/resources/updated"))
        .await
        .unwrap_or_else(|_| {
            gateway.dump_log();
            panic!("the session's stream hears no update")
        });
    assert_eq!(heard["params"]["uri"], uri, "{heard}");
    let updated = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            match subscription.next().await.expect("notification") {
                Some(rmcp::model::ServerNotification::ResourceUpdatedNotification(n)) => return n.params.uri,
                Some(_) => {}
                None => panic!("the subscription ended"),
            }
        }
    })
    .await
    .expect("a resource update arrives");
    assert_eq!(updated, uri);
    let result = wait_final(&client, &handle.task.task_id, Duration::from_secs(30)).await;
    assert_eq!(result["summary"], "subscribed");
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancelled_run_coding_task_request_stops_waiting_but_not_the_task() {
    let gate = Gate::new();
    let model = ScriptedModel::start(
        MODEL_KEY,
        vec![Turn::code("final_answer({'task_type': 'answer', 'summary': 'finished anyway'})").held(&gate)],
    )
    .await;
    let data = TempDir::new("coding-local-stopwait");
    let gateway =
        LocalGateway::start(&repo_path("examples/pricing"), data.path(), ModelEnv::Scripted(&model), &[]).await;
    let http = reqwest::Client::new();
    let post = |body: Value| {
        http.post(&gateway.url)
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .body(body.to_string())
            .send()
    };
    let run = json!({"jsonrpc": "2.0", "id": "run-1", "method": "tools/call",
        "params": {"name": "run_coding_task", "arguments": {"task": "wait for me"}}});
    let waiting = tokio::spawn(post(run));
    wait_for_requests(&model, 1, Duration::from_secs(60)).await.expect("the agent asks the model");
    let accepted =
        post(json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "run-1"}}))
            .await
            .expect("POST");
    assert_eq!(accepted.status(), 202);
    let response = tokio::time::timeout(Duration::from_secs(30), waiting).await.expect("the wait ends").expect("join");
    let body = response.expect("response").text().await.expect("body");
    assert!(body.contains("the task goes on"), "{body}");
    gate.open();
    let client = gateway.client().await;
    let listed = ok(&call(&client, "list_tasks", json!({})).await);
    let task = listed["tasks"][0]["task_id"].as_str().expect("the task").to_owned();
    let result = wait_final(&client, &task, Duration::from_secs(60)).await;
    assert_eq!((result["status"].as_str(), result["summary"].as_str()), (Some("success"), Some("finished anyway")));
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_interpreter_is_fresh_per_task_reaches_tools_only_through_stubs_and_its_files_read_in_capped_chunks() {
    const BIG: usize = 320_000;
    let model = ScriptedModel::start(
        MODEL_KEY,
        vec![
            // The tools' own modules are not importable, and no credentials are in the interpreter.
            Turn::code(
                "kept = 42\n\
                 import os\n\
                 try:\n    import pricing\n    print('imported', pricing.__file__)\n\
                 except ImportError as e:\n    print('import failed:', type(e).__name__)\n\
                 print('env:', sorted(k for k in os.environ if k.startswith('TOOLYARD')))",
            ),
            Turn::code(
                "import base64\n\
                 blob = bytes(range(256)) * 4\n\
                 write_artifact('data/blob.bin', base64.b64encode(blob).decode(), encoding='base64')\n\
                 write_artifact('big.txt', 'abcdefgh' * 40000)\n\
                 print(kept, len(read_written_artifact('big.txt')))",
            )
            .expecting("import failed: ModuleNotFoundError")
            .expecting("env: []"),
            // The model claims an artifact it never wrote: refused by the contract.
            Turn::code("final_answer({'task_type': 'answer', 'summary': 'wrote files', 'artifacts': ['fake.csv']})")
                .expecting(format!("42 {BIG}")),
            Turn::code("final_answer({'task_type': 'answer', 'summary': 'wrote files'})")
                .expecting("unknown keys [\"artifacts\"]"),
            // The next task gets a fresh interpreter.
            Turn::code("print('kept' in globals(), 'write_artifact' in globals())"),
            Turn::code("final_answer({'task_type': 'answer', 'summary': 'fresh'})").expecting("False True"),
        ],
    )
    .await;
    let data = TempDir::new("coding-local-interpreter");
    let gateway =
        LocalGateway::start(&repo_path("examples/pricing"), data.path(), ModelEnv::Scripted(&model), &[]).await;
    let client = gateway.client().await;

    let first = run_task(&client, json!({"task": "write files"})).await;
    if first["status"] != "success" {
        gateway.dump_log();
    }
    assert_eq!((first["status"].as_str(), first["steps"].as_u64()), (Some("success"), Some(4)), "{first}");
    let mut listed: Vec<(String, u64)> = first["artifacts"]
        .as_array()
        .expect("artifacts")
        .iter()
        .map(|a| (a["path"].as_str().expect("path").to_owned(), a["size"].as_u64().expect("size")))
        .collect();
    listed.sort();
    assert_eq!(listed, [("outputs/big.txt".to_owned(), BIG as u64), ("outputs/data/blob.bin".to_owned(), 1024)]);
    let second = run_task(&client, json!({"task": "fresh?"})).await;
    assert_eq!((second["status"].as_str(), second["summary"].as_str()), (Some("success"), Some("fresh")), "{second}");
    assert!(model.failures().is_empty(), "{:?}", model.failures());
    let task = first["task_id"].as_str().expect("id");

    // Without `length`, a chunk is at most 256 KiB; the last one says next_offset null.
    let read = |offset: u64| {
        let client = &client;
        async move {
            ok(&call(client, "read_artifact", json!({"task_id": task, "filename": "big.txt", "offset": offset})).await)
        }
    };
    let chunk = read(0).await;
    assert_eq!(chunk["content"].as_str().map(str::len), Some(256 * 1024));
    assert_eq!((chunk["next_offset"].as_u64(), chunk["size"].as_u64()), (Some(256 * 1024), Some(BIG as u64)));
    let rest = read(256 * 1024).await;
    assert_eq!(rest["content"].as_str().map(str::len), Some(BIG - 256 * 1024));
    assert!(rest["next_offset"].is_null(), "{}", rest["next_offset"]);
    let over =
        call(&client, "read_artifact", json!({"task_id": task, "filename": "big.txt", "length": 256 * 1024 + 1})).await;
    assert_eq!(over.is_error, Some(true), "a longer chunk is refused: {}", text_of(&over));
    let (blob, _) = coding_support::read_artifact(&client, task, "data/blob.bin", "base64", 100).await;
    assert_eq!(blob, (0..=255u8).cycle().take(1024).collect::<Vec<u8>>());

    // list_tasks pages with its cursor, newest first.
    let page = ok(&call(&client, "list_tasks", json!({"limit": 1})).await);
    assert_eq!(page["tasks"][0]["task_id"], second["task_id"], "{page}");
    let cursor = page["next_cursor"].as_str().expect("a cursor for the next page");
    let page = ok(&call(&client, "list_tasks", json!({"limit": 1, "cursor": cursor})).await);
    assert_eq!(page["tasks"][0]["task_id"], first["task_id"], "{page}");
    assert!(page["next_cursor"].is_null(), "{page}");

    // The model's API key is in no log and no stored file.
    let log = gateway.stop().await;
    assert!(!log.is_empty() && !log.contains(MODEL_KEY), "the gateway log never shows the key");
    for file in files_under(data.path()) {
        let bytes = std::fs::read(&file).expect("read");
        assert!(!String::from_utf8_lossy(&bytes).contains(MODEL_KEY), "{} holds the key", file.display());
    }
}

/// Every file under `dir`.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() { out.extend(files_under(&path)) } else { out.push(path) }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_written_code_reaches_no_credential_in_the_embedded_mode() {
    let model = ScriptedModel::start(MODEL_KEY, vec![]).await;
    let data = TempDir::new("coding-local-hostile");
    let gateway =
        LocalGateway::start(&repo_path("examples/pricing"), data.path(), ModelEnv::Scripted(&model), &[]).await;
    let client = gateway.client().await;
    model.set_script(vec![
        Turn::code(&coding_support::hostile_code(&[], &[MODEL_KEY, TOKEN])),
        Turn::code("final_answer({'task_type': 'answer', 'summary': 'tried every door'})"),
    ]);
    let result = structured(&call(&client, "run_coding_task", json!({"task": "escape"})).await);
    assert_eq!(result["status"], "success", "{result}");
    let escapes = coding_support::escapes_of(&model.requests()[1]);
    coding_support::assert_no_escape(&escapes);
    gateway.stop().await;
}

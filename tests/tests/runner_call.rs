//! `toolyard-runner call` as a real process against the real internal API (loopback HTTP,
//! local folder store), running the misbehaving fixture tools with the real Python runner.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use serde_json::{Value, json};
use toolyard_api::protocol::{CallErrorKind, CallResult, env, runner_exit};
use toolyard_api::token::{Claims, RunKind, SigningKey};
use toolyard_api::{Owner, OwnerKey};
use toolyard_gateway::internal::{self, InternalState};
use toolyard_gateway::store::ArtifactStore;
use toolyard_gateway::store::fs::FsStore;
use toolyard_tests::local::{self, TempDir};

fn key() -> SigningKey {
    SigningKey::new(b"runner-call-test-key-0123456789abcdef".to_vec()).expect("test setup")
}

fn owner() -> Owner {
    Owner { issuer: "local".into(), user: "dev".into(), groups: vec![] }
}

fn now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("test setup").as_secs() as i64
}

struct Gateway {
    url: String,
    store: Arc<FsStore>,
    dir: TempDir,
}

impl Gateway {
    async fn start() -> Self {
        let dir = TempDir::new("runner-call");
        let store = Arc::new(FsStore::new(dir.path().join("data")).expect("test setup"));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("test setup");
        let url = format!("http://{}", listener.local_addr().expect("test setup"));
        let router = internal::router(InternalState::new(store.clone(), key()));
        tokio::spawn(async move { axum::serve(listener, router).await.expect("test setup") });
        Self { url, store, dir }
    }

    fn owner_key(&self) -> OwnerKey {
        owner().key()
    }

    async fn file(&self, id: &str, name: &str) -> Option<String> {
        let bytes = self.store.get(&self.owner_key(), &format!("calls/{id}/{name}")).await.expect("test setup")?;
        Some(String::from_utf8_lossy(&bytes).into_owned())
    }

    async fn result(&self, id: &str) -> CallResult {
        let text = self.file(id, "result.json").await.unwrap_or_else(|| panic!("no result stored for {id}"));
        serde_json::from_str(&text).expect("test setup")
    }

    /// Stores the input and returns a runner command for call `id` (token for `token_id`).
    async fn runner(
        &self,
        id: &str,
        token_id: &str,
        input: Value,
        runner_args: &[&str],
        cmd: &[&str],
    ) -> tokio::process::Command {
        self.store
            .put(&self.owner_key(), &format!("calls/{id}/input.json"), Bytes::from(input.to_string()))
            .await
            .expect("the input is stored");
        let claims =
            Claims { kind: RunKind::Call, ns: String::new(), id: token_id.into(), owner: owner(), exp: now() + 600 };
        let mut command = tokio::process::Command::new(local::binary("toolyard-runner"));
        command
            .arg("call")
            .args(runner_args)
            .arg("--")
            .args(cmd)
            .env(env::GATEWAY_URL, &self.url)
            .env(env::TOKEN, key().sign(&claims))
            .env(env::RUN_ID, id)
            .env(env::TRACEPARENT, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
            .env("PYTHONPATH", local::misbehaving_pythonpath())
            .env("TOOLYARD_TERMINATION_LOG", self.termination_log(id))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command
    }

    fn termination_log(&self, id: &str) -> PathBuf {
        self.dir.path().join(format!("{id}.termination-log"))
    }
}

fn tool(function: &str) -> Vec<String> {
    vec![local::python(), "-m".into(), "toolyard.run".into(), format!("misbehaving:{function}")]
}

async fn run(mut command: tokio::process::Command) -> (i32, String) {
    let out = command.output().await.expect("test setup");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn error_of(result: &CallResult) -> (CallErrorKind, &str) {
    let e = result.error.as_ref().unwrap_or_else(|| panic!("expected an error result, got {result:?}"));
    (e.kind, e.message.as_str())
}

#[tokio::test]
async fn echo_result_and_logs_are_uploaded_and_the_exit_code_is_ok() {
    let gw = Gateway::start().await;
    let cmd = tool("echo");
    let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
    let (code, stderr) = run(gw.runner("c-echo", "c-echo", json!({"value": [1, {"a": null}]}), &[], &cmd).await).await;
    assert_eq!(code, runner_exit::OK, "{stderr}");
    let result = gw.result("c-echo").await;
    assert_eq!(result.value, Some(json!({"value": [1, {"a": null}]})));
    assert_eq!(result.exit_code, Some(0));
    assert_eq!(gw.file("c-echo", "stdout.log").await, None, "an empty stream is not uploaded");
    assert_eq!(std::fs::read_to_string(gw.termination_log("c-echo")).unwrap().split(" in ").next(), Some("ok"));
}

#[tokio::test]
async fn a_raising_tool_a_nan_and_invalid_arguments_are_tool_failures_with_their_messages() {
    let gw = Gateway::start().await;
    let cases = [
        ("fail", json!({"message": "boom"}), CallErrorKind::ToolError, "RuntimeError: boom"),
        ("nan", json!({}), CallErrorKind::BadResult, "result.value is NaN"),
        ("fail", json!({"message": 3}), CallErrorKind::InvalidArguments, "message"),
    ];
    for (i, (function, input, kind, message)) in cases.into_iter().enumerate() {
        let id = format!("c-fail-{i}");
        let cmd = tool(function);
        let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
        let (code, stderr) = run(gw.runner(&id, &id, input, &[], &cmd).await).await;
        assert_eq!(code, runner_exit::TOOL_FAILED, "{function}: {stderr}");
        let result = gw.result(&id).await;
        assert_eq!(error_of(&result).0, kind, "{result:?}");
        assert!(error_of(&result).1.contains(message), "{result:?}");
        let summary = std::fs::read_to_string(gw.termination_log(&id)).unwrap();
        assert!(summary.contains(message), "{summary}");
    }
    // The traceback of the raising tool is in its stderr log.
    assert!(gw.file("c-fail-0", "stderr.log").await.unwrap().contains("Traceback"));
}

#[tokio::test]
async fn output_that_looks_like_protocol_json_never_reaches_the_result() {
    let gw = Gateway::start().await;
    let cmd = tool("noisy");
    let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
    let (code, stderr) = run(gw.runner("c-noisy", "c-noisy", json!({"n": 20}), &[], &cmd).await).await;
    assert_eq!(code, runner_exit::OK, "{stderr}");
    assert_eq!(gw.result("c-noisy").await.value, Some(json!({"n": 20})));
    let stdout = gw.file("c-noisy", "stdout.log").await.unwrap();
    assert!(stdout.contains("raw fd 1 line 19") && stdout.contains("not from the function result"), "{stdout}");
    assert!(gw.file("c-noisy", "stderr.log").await.unwrap().contains("\"ready\": true"));
}

#[tokio::test]
async fn logs_are_bounded_and_the_cut_is_noted() {
    let gw = Gateway::start().await;
    let cmd = tool("noisy");
    let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
    let (code, _) = run(gw.runner("c-big", "c-big", json!({"n": 500}), &["--log-limit", "1000"], &cmd).await).await;
    assert_eq!(code, runner_exit::OK);
    let stdout = gw.file("c-big", "stdout.log").await.unwrap();
    assert!(stdout.len() < 1200, "{} bytes kept", stdout.len());
    assert!(stdout.contains("[toolyard: output truncated;"), "{stdout}");
}

#[tokio::test]
async fn a_hanging_tool_is_timed_out_and_its_whole_process_group_is_gone() {
    let gw = Gateway::start().await;
    let cmd = tool("hang");
    let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
    let runner =
        gw.runner("c-hang", "c-hang", json!({"seconds": 600}), &["--timeout", "1", "--kill-grace", "0.5"], &cmd).await;
    let (code, stderr) = run(runner).await;
    assert_eq!(code, runner_exit::TIMED_OUT, "{stderr}");
    let result = gw.result("c-hang").await;
    assert_eq!(error_of(&result), (CallErrorKind::TimedOut, "the call timed out after 1s"));
    let log = gw.file("c-hang", "stderr.log").await.unwrap();
    let (pid, child) = local::hang_pids(&log).unwrap_or_else(|| panic!("no pids in the hang fixture's stderr: {log}"));
    assert!(!local::pid_alive(pid), "the tool process {pid} is still running");
    assert!(!local::pid_alive(child), "the tool's child {child} is still running");
}

#[tokio::test]
async fn sigterm_to_the_runner_stops_the_group_and_reports_a_timeout() {
    let gw = Gateway::start().await;
    let cmd = tool("hang");
    let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
    let mut runner = gw.runner("c-term", "c-term", json!({"seconds": 600}), &["--kill-grace", "0.5"], &cmd).await;
    let mut child = runner.spawn().unwrap();
    // Wait until the tool runs and has started its own child, then stop the runner as the
    // kubelet would.
    let pid = child.id().expect("runner pid") as i32;
    let mut tree = None;
    for _ in 0..600 {
        if let Some(&tool_pid) = local::children_of(pid).first()
            && let Some(&sleep_pid) = local::children_of(tool_pid).first()
        {
            tree = Some((tool_pid, sleep_pid));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (tool_pid, sleep_pid) = tree.expect("the tool and its child start");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    let status = child.wait().await.expect("runner exit");
    assert_eq!(status.code(), Some(runner_exit::TIMED_OUT));
    let result = gw.result("c-term").await;
    assert_eq!(error_of(&result).0, CallErrorKind::TimedOut);
    assert!(error_of(&result).1.contains("SIGTERM"), "{result:?}");
    assert!(!local::pid_alive(tool_pid), "the tool process {tool_pid} still runs");
    assert!(!local::pid_alive(sleep_pid), "the tool's child {sleep_pid} still runs");
}

#[tokio::test]
async fn the_tool_gets_arguments_result_file_and_traceparent_but_no_credentials() {
    let gw = Gateway::start().await;
    let script = "import json, os, sys\n\
        args = json.load(sys.stdin)\n\
        names = sorted(k for k in os.environ if k.startswith('TOOLYARD_') or k == 'TRACEPARENT')\n\
        json.dump({'args': args, 'env': names, 'traceparent': os.environ.get('TRACEPARENT')}, open(os.environ['TOOLYARD_RESULT_FILE'], 'w'))\n";
    let python = local::python();
    let (code, stderr) = run(gw.runner("c-env", "c-env", json!({"x": 1}), &[], &[&python, "-c", script]).await).await;
    assert_eq!(code, runner_exit::OK, "{stderr}");
    let value = gw.result("c-env").await.value.unwrap();
    assert_eq!(value["args"], json!({"x": 1}));
    assert_eq!(value["traceparent"], json!("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"));
    let names: Vec<&str> = value["env"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert!(!names.contains(&env::TOKEN) && !names.contains(&env::GATEWAY_URL), "credentials leaked: {names:?}");
    assert!(names.contains(&env::RESULT_FILE) && names.contains(&env::ERROR_FILE), "{names:?}");
}

#[tokio::test]
async fn missing_or_non_json_result_files_and_signals_are_named() {
    let gw = Gateway::start().await;
    let cases: [(&str, &[&str], CallErrorKind, &str); 4] = [
        ("c-nofile", &["sh", "-c", "cat >/dev/null"], CallErrorKind::BadResult, "wrote no result file"),
        (
            "c-notjson",
            &["sh", "-c", "echo 'oops' > \"$TOOLYARD_RESULT_FILE\""],
            CallErrorKind::BadResult,
            "not valid JSON",
        ),
        ("c-segv", &["sh", "-c", "kill -SEGV $$"], CallErrorKind::Crashed, "SIGSEGV"),
        ("c-exit9", &["sh", "-c", "echo disk full >&2; exit 9"], CallErrorKind::ToolError, "status 9"),
    ];
    for (id, cmd, kind, message) in cases {
        let (code, stderr) = run(gw.runner(id, id, json!({}), &[], cmd).await).await;
        assert_eq!(code, runner_exit::TOOL_FAILED, "{id}: {stderr}");
        let result = gw.result(id).await;
        assert_eq!(error_of(&result).0, kind, "{id}: {result:?}");
        assert!(error_of(&result).1.contains(message), "{id}: {result:?}");
    }
    let exit9 = gw.result("c-exit9").await;
    assert!(error_of(&exit9).1.contains("disk full"), "stderr hint: {exit9:?}");
    let (code, _) = run(gw.runner("c-nocmd", "c-nocmd", json!({}), &[], &["/nonexistent/tool"]).await).await;
    assert_eq!(code, runner_exit::TOOL_FAILED);
    assert_eq!(error_of(&gw.result("c-nocmd").await).0, CallErrorKind::SpawnFailed);
}

#[tokio::test]
async fn a_token_for_another_call_gets_nothing_and_the_runner_reports_its_own_error() {
    let gw = Gateway::start().await;
    let cmd = tool("echo");
    let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
    // The runner is told it runs c-victim but holds a token for c-other.
    let (code, stderr) = run(gw.runner("c-victim", "c-other", json!({"value": "secret"}), &[], &cmd).await).await;
    assert_eq!(code, runner_exit::RUNNER_ERROR, "{stderr}");
    assert!(stderr.contains("403") && stderr.contains("another run"), "{stderr}");
    assert_eq!(gw.file("c-victim", "result.json").await, None);
    assert!(std::fs::read_to_string(gw.termination_log("c-victim")).unwrap().starts_with("runner error:"));
}

/// Event segments stay unique when two replicas store a run's events at once: each takes the
/// next free number with a create-only write, so no post overwrites another's segment.
#[tokio::test]
async fn events_posted_through_two_replicas_at_once_keep_every_segment() {
    let dir = TempDir::new("runner-call-events");
    let store = Arc::new(FsStore::new(dir.path().join("data")).expect("test setup"));
    let mut urls = Vec::new();
    for _ in 0..2 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("test setup");
        urls.push(format!("http://{}", listener.local_addr().expect("test setup")));
        let router = internal::router(InternalState::new(store.clone(), key()));
        tokio::spawn(async move { axum::serve(listener, router).await.expect("test setup") });
    }
    let claims =
        Claims { kind: RunKind::Call, ns: String::new(), id: "evt-1".into(), owner: owner(), exp: now() + 600 };
    let token = key().sign(&claims);
    let http = reqwest::Client::new();
    let posts = (0..20).map(|n| {
        let request = http
            .post(format!("{}/internal/v1/calls/evt-1/events", urls[n % 2]))
            .bearer_auth(&token)
            .body(json!({"time": "2026-12-04T12:00:00Z", "type": "call_started", "data": {"n": n}}).to_string());
        async move { request.send().await.expect("post").status() }
    });
    for status in futures::future::join_all(posts).await {
        assert_eq!(status, 204);
    }
    let segments = store.list(&owner().key(), "calls/evt-1/events/").await.expect("list");
    assert_eq!(segments.len(), 20, "{segments:?}");
}

//! `toolyard-gateway local` as a user runs it: the printed connection details, `/healthz`,
//! and the messages for a second instance on the same data folder, a busy port, a missing
//! runner binary and a missing Python.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use toolyard_tests::local::{self, TempDir};
use toolyard_tests::repo_path;

const TOKEN: &str = "ty_local-cli-test-token-0001";

fn gateway(data: &TempDir, extra: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(local::binary("toolyard-gateway"));
    command
        .arg("local")
        .arg(repo_path("examples/pricing"))
        .arg("--data-dir")
        .arg(data.path())
        .args([
            "--runner",
            local::binary("toolyard-runner").to_str().expect("test setup"),
            "--python",
            &local::python(),
        ])
        .args(extra)
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

async fn fails_with(mut command: tokio::process::Command) -> String {
    let out =
        tokio::time::timeout(Duration::from_secs(60), command.output()).await.expect("exits").expect("test setup");
    assert!(!out.status.success(), "expected a failure: {}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test]
async fn it_prints_how_to_connect_serves_healthz_and_refuses_a_second_instance() {
    let data = TempDir::new("local-cli");
    let mut first = gateway(&data, &["--listen", "127.0.0.1:0", "--token", TOKEN])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = first.stderr.take().unwrap();
    let logs = tokio::spawn(async move {
        let mut logs = String::new();
        stderr.read_to_string(&mut logs).await.map(|_| logs)
    });
    let mut lines = BufReader::new(first.stdout.take().unwrap()).lines();
    let mut printed = String::new();
    while !printed.contains("Stop with Ctrl-C") {
        let line = tokio::time::timeout(Duration::from_secs(120), lines.next_line()).await.expect("banner").unwrap();
        printed.push_str(&line.expect("the gateway keeps running"));
        printed.push('\n');
    }
    let url = printed
        .lines()
        .find_map(|l| l.trim().strip_prefix("MCP URL:"))
        .map(str::trim)
        .unwrap_or_else(|| panic!("no MCP URL in {printed}"))
        .to_owned();
    assert!(url.starts_with("http://127.0.0.1:") && url.ends_with("/mcp"), "{url}");
    assert!(printed.contains(&format!("Token:    {TOKEN}")), "{printed}");
    assert!(
        printed.contains("price_option") && printed.contains("get_quote            warm worker, reused"),
        "{printed}"
    );
    assert!(printed.contains("streamable_http_client(") && printed.contains("Streamable HTTP"), "{printed}");

    let health = reqwest::get(url.replace("/mcp", "/healthz")).await.unwrap();
    assert!(health.status().is_success());
    let unauthenticated = reqwest::Client::new().post(&url).body("{}").send().await.unwrap();
    assert_eq!(unauthenticated.status(), reqwest::StatusCode::UNAUTHORIZED);

    // A second instance on the same data folder.
    let second = fails_with(gateway(&data, &["--listen", "127.0.0.1:0"])).await;
    assert!(second.contains("another toolyard-gateway is already running on the data folder"), "{second}");

    // A busy port, with its own data folder.
    let other = TempDir::new("local-cli-other");
    let port = url.trim_start_matches("http://").trim_end_matches("/mcp").to_owned();
    let busy = fails_with(gateway(&other, &["--listen", &port])).await;
    assert!(busy.contains(&format!("cannot listen on {port}: the port is already in use")), "{busy}");

    nix::sys::signal::kill(nix::unistd::Pid::from_raw(first.id().unwrap() as i32), nix::sys::signal::Signal::SIGTERM)
        .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), first.wait()).await.expect("stops on SIGTERM").unwrap();
    assert!(status.success(), "{status}");
    // Logs to a pipe (or a file, or a pod's log) carry no terminal colour codes.
    let logs = logs.await.unwrap().unwrap();
    assert!(logs.contains("listening") && !logs.contains('\x1b'), "{logs:?}");
}

#[tokio::test]
async fn a_missing_runner_or_python_is_named_with_the_fix() {
    let data = TempDir::new("local-cli-missing");
    let mut no_runner = tokio::process::Command::new(local::binary("toolyard-gateway"));
    no_runner
        .arg("local")
        .arg(repo_path("examples/pricing"))
        .arg("--data-dir")
        .arg(data.path())
        .args(["--runner", "/nonexistent/toolyard-runner", "--listen", "127.0.0.1:0"])
        .env("RUST_BACKTRACE", "0");
    let message = fails_with(no_runner).await;
    assert!(message.contains("--runner /nonexistent/toolyard-runner: no such file"), "{message}");

    let mut no_python = tokio::process::Command::new(local::binary("toolyard-gateway"));
    no_python
        .arg("local")
        .arg(repo_path("examples/pricing"))
        .arg("--data-dir")
        .arg(data.path())
        .args(["--runner", local::binary("toolyard-runner").to_str().unwrap()])
        .args(["--listen", "127.0.0.1:0", "--python", "/nonexistent/python3"])
        .env("RUST_BACKTRACE", "0");
    let message = fails_with(no_python).await;
    assert!(
        message.contains("runs `python3`, but /nonexistent/python3 is not installed")
            && message.contains("--python PATH"),
        "{message}"
    );

    let bad = TempDir::new("local-cli-bad");
    std::fs::write(
        bad.path().join("tools.yaml"),
        "apiVersion: toolyard.dev/v1alpha1\nkind: McpTool\nmetadata: {name: x}\nspec: {name: x}\n",
    )
    .unwrap();
    let mut bad_folder = tokio::process::Command::new(local::binary("toolyard-gateway"));
    bad_folder.arg("local").arg(bad.path()).arg("--data-dir").arg(data.path()).env("RUST_BACKTRACE", "0");
    let message = fails_with(bad_folder).await;
    assert!(message.contains("tools.yaml (document 1): spec.description: Required value"), "{message}");
}

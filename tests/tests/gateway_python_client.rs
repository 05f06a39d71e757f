//! The official Python MCP SDK (package `mcp`) as the client of the gateway, in both
//! protocol eras: the `initialize` handshake (2025-11-25) and `server/discover` (2026-07-28).

use crate::gateway_support;

use std::path::PathBuf;
use std::process::Command;

use gateway_support::{FakePlatform, Gateway, Options, create_tool, grant_call, grant_platform, spec};
use serde_json::{Value, json};
use toolyard_tests::{TestEnv, User, repo_path};

/// The interpreter with the `mcp` package: `TOOLYARD_TEST_PYTHON` (tests/run.sh sets it), else
/// the venv in `$HOME/.cache/toolyard/venv`, created from tests/python-requirements.txt if needed.
fn python_with_mcp() -> PathBuf {
    if let Some(p) = std::env::var_os("TOOLYARD_TEST_PYTHON") {
        return PathBuf::from(p);
    }
    let home = std::env::var_os("HOME").expect("HOME");
    let venv = PathBuf::from(home).join(".cache/toolyard/venv");
    let python = venv.join("bin/python");
    let has_mcp = |p: &PathBuf| Command::new(p).args(["-c", "import mcp"]).status().is_ok_and(|s| s.success());
    if !has_mcp(&python) {
        let status = Command::new("python3").arg("-m").arg("venv").arg(&venv).status().expect("python3 -m venv");
        assert!(status.success(), "python3 -m venv {} failed", venv.display());
        let status = Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check", "-r"])
            .arg(repo_path("tests/python-requirements.txt"))
            .status()
            .expect("pip");
        assert!(status.success(), "pip install -r tests/python-requirements.txt failed");
    }
    assert!(has_mcp(&python), "{} cannot import mcp", python.display());
    python
}

fn run_client(url: &str, mode: &str, token: &str) -> Value {
    let out = Command::new(python_with_mcp())
        .arg(repo_path("tests/fixtures/python/mcp_sdk_client.py"))
        .args([url, mode, "price_option", r#"{"x": 2.5}"#])
        .env("MCP_TOKEN", token)
        .output()
        .expect("running the Python client");
    assert!(out.status.success(), "Python client ({mode}) failed:\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

#[tokio::test]
async fn the_official_python_sdk_lists_and_calls_tools_in_both_protocol_eras() {
    let env = TestEnv::get();
    env.install_crds().await.expect("CRDs");
    let ns = env.namespace("gwpy").await.expect("namespace");
    grant_platform(&ns).await;
    create_tool(&ns, "price-option", spec("price_option", 60), true).await;
    create_tool(&ns, "hidden", spec("hidden_tool", 60), true).await;
    grant_call(&ns, "alice-calls", &["price-option"], &["alice"], &[]).await;
    gateway_support::wait_allowed("alice", &[], &ns, "toolyard.dev", "mcptools", "call", Some("price-option")).await;
    let gw = Gateway::start(std::slice::from_ref(&ns), Options::default()).await;
    let _platform = FakePlatform::start(&ns, &gw.internal).await;
    let token = env.token(User::Alice).to_owned();
    for (mode, protocol) in [("legacy", "2025-11-25"), ("auto", "2026-07-28")] {
        let url = gw.mcp_url();
        let token = token.clone();
        let mode_owned = mode.to_owned();
        let seen = tokio::task::spawn_blocking(move || run_client(&url, &mode_owned, &token)).await.expect("join");
        assert_eq!(seen["protocol"], protocol, "{mode}");
        assert_eq!(
            seen["tools"],
            json!([
                {"name": "cancel_call", "required": ["call_id"], "title": "Cancel a call"},
                {"name": "delete_call", "required": ["call_id"], "title": "Delete a call"},
                {"name": "get_call_result", "required": ["call_id"], "title": "Get a call's result"},
                {"name": "price_option", "required": ["x"], "title": "Tool price_option"},
                {"name": "start_call", "required": ["tool"], "title": "Start a call"}
            ]),
            "{mode}: only the granted tool is listed (and the call built-ins, for its calls)"
        );
        assert_eq!(seen["result"]["isError"], false, "{mode}: {seen}");
        assert_eq!(seen["result"]["structuredContent"], json!({"echo": {"x": 2.5}}), "{mode}");
        assert_eq!(
            serde_json::from_str::<Value>(seen["result"]["text"].as_str().unwrap()).unwrap(),
            json!({"echo": {"x": 2.5}})
        );
        assert_eq!(seen["invalid"]["isError"], true, "{mode}");
        assert!(seen["invalid"]["text"].as_str().unwrap().contains("/x"), "{mode}: {seen}");
        assert_eq!(seen["unknown"]["code"], -32602, "{mode}: {seen}");
        assert_eq!(seen["unknown"]["message"], "Unknown tool: \"no_such_tool\"", "{mode}");
    }
}

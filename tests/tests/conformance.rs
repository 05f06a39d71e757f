//! The official MCP conformance suite (`@modelcontextprotocol/conformance`, server scenarios,
//! active suite) against the local gateway, which serves the suite's fixture tools and prompts from an
//! upstream McpServer (`tests/fixtures/python/conformance_server.py`, on the official Python
//! SDK). Scenarios the gateway does not pass yet are listed, each with the reason, in
//! `tests/conformance/expected-failures.yml` (and the README): one that starts passing, or a
//! new failure, fails this test.

use crate::local_support;

use std::time::Duration;

use rmcp::model::ClientConfig;
use toolyard_gateway::serve::DataArgs;
use toolyard_tests::local::TempDir;
use toolyard_tests::repo_path;
use toolyard_tests::upstream::{UpstreamServer, conformance, free_port};

const TOKEN: &str = "ty_local-conformance-token-01";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conformance_suite_passes_but_for_the_named_scenarios() {
    let port = free_port();
    let _fixtures =
        UpstreamServer::start_script("tests/fixtures/python/conformance_server.py", port, &[port.to_string()]);
    let dir = TempDir::new("conformance-manifests");
    let manifest = format!(
        "apiVersion: toolyard.dev/v1alpha1\nkind: McpServer\nmetadata: {{name: fixtures}}\nspec:\n  url: {}\n  toolPrefix: \"\"\n  reconnectDelaysSeconds: [1]\n",
        UpstreamServer::url(port)
    );
    std::fs::write(dir.path().join("fixtures.yaml"), manifest).expect("manifest written");
    let data = TempDir::new("conformance-data");
    let mut args = local_support::args(dir.path().to_owned(), &data, TOKEN, 2, DataArgs::default());
    // The suite sends no token.
    args.anonymous = true;
    let gateway = local_support::start_args(args).await;

    let client = local_support::legacy_client(gateway.mcp_url(), TOKEN, ClientConfig::default()).await;
    let mut served = false;
    for _ in 0..100 {
        let tools = client.list_all_tools().await.expect("tools/list");
        if tools.iter().any(|t| t.name == "test_simple_text") {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(served, "the fixture tools are served");

    let output = TempDir::new("conformance-results");
    let baseline = repo_path("tests/conformance/expected-failures.yml");
    let baseline = baseline.to_string_lossy();
    let url = gateway.mcp_url();
    let (code, out, err) = tokio::task::block_in_place(|| {
        conformance(&url, output.path(), &["--suite", "active", "--expected-failures", &baseline])
    });
    assert_eq!(
        code,
        0,
        "the conformance suite failed beyond its expected failures:\n{out}\n{err}\nchecks that failed:\n{}",
        failed_checks(output.path())
    );
}

/// The checks the suite recorded as failed (each scenario's `checks.json`, with its details),
/// one per line: the summary names only the scenario.
fn failed_checks(results: &std::path::Path) -> String {
    let mut lines = Vec::new();
    for scenario in std::fs::read_dir(results).into_iter().flatten().flatten() {
        let Ok(text) = std::fs::read_to_string(scenario.path().join("checks.json")) else { continue };
        let Ok(serde_json::Value::Array(checks)) = serde_json::from_str(&text) else { continue };
        for check in checks.iter().filter(|c| c["status"] == "FAILURE") {
            lines.push(format!("{}: {check}", scenario.file_name().to_string_lossy()));
        }
    }
    lines.sort();
    lines.join("\n")
}

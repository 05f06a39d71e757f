//! MCP Inspector (its CLI, from npm) against the local mode: with the token it lists and calls
//! the tools; without one it is told that authentication is required and, kept from
//! interactive OAuth, asks for no authorization server: the protected resource metadata names
//! none.

mod local_support;

use serde_json::Value;
use toolyard_tests::local::TempDir;
use toolyard_tests::upstream::inspector_cli;

const TOKEN: &str = "ty_local-inspector-token-0001";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_inspector_lists_and_calls_with_the_token_and_is_refused_without_it() {
    let data = TempDir::new("inspector-data");
    let gateway = local_support::start("examples/pricing", &data, TOKEN, 2).await;
    let url = gateway.mcp_url();
    let home = TempDir::new("inspector-home");
    let header = format!("Authorization: Bearer {TOKEN}");

    let (code, out, err) = tokio::task::block_in_place(|| {
        inspector_cli(home.path(), &[&url, "--method", "tools/list", "--header", &header])
    });
    assert_eq!(code, 0, "{out}\n{err}");
    let listed: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let names: Vec<&str> =
        listed["tools"].as_array().expect("tools").iter().filter_map(|t| t["name"].as_str()).collect();
    assert!(names.contains(&"price_option"), "{names:?}");

    let (code, out, err) = tokio::task::block_in_place(|| {
        inspector_cli(
            home.path(),
            &[
                &url,
                "--method",
                "tools/call",
                "--tool-name",
                "price_option",
                "--tool-arg",
                "spot=100",
                "strike=100",
                "time_to_expiry=1",
                "volatility=0.2",
                "rate=0.05",
                "--header",
                &header,
            ],
        )
    });
    assert_eq!(code, 0, "{out}\n{err}");
    let called: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let price = called["structuredContent"]["price"].as_f64().unwrap_or_default();
    assert!((price - 10.45).abs() < 0.01, "{called}");

    // Without a token: "authentication required" (exit 3), not an OAuth attempt.
    let (code, out, err) = tokio::task::block_in_place(|| {
        inspector_cli(home.path(), &[&url, "--method", "tools/list", "--stored-auth-only"])
    });
    assert_eq!(code, 3, "{out}\n{err}");
    assert!(out.contains("auth_required") || err.contains("auth_required"), "{out}\n{err}");
    assert!(!format!("{out}{err}").contains("Registration"), "no client registration is attempted: {out}\n{err}");
}

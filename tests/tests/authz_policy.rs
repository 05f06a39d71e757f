//! The static policy of embedded mode, loaded from a file through the command-line
//! configuration: a matrix of users, groups and tools, coding tasks, default deny, and
//! clear errors for malformed files.

use crate::auth_support;

use clap::Parser;
use toolyard_gateway::Identity;
use toolyard_gateway::authz::{AuthzArgs, AuthzMetrics};
use toolyard_gateway::catalog::Tool;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    authz: AuthzArgs,
}

fn args(extra: &[&str]) -> AuthzArgs {
    Cli::parse_from(std::iter::once("toolyard-gateway").chain(extra.iter().copied())).authz
}

fn tool(mcp_name: &str, object_name: &str) -> Tool {
    let spec = serde_json::from_value(serde_json::json!({
        "name": mcp_name,
        "description": "test tool",
        "inputSchema": {"type": "object"},
        "runtime": {"image": "python:3.12-slim", "command": ["true"]},
    }))
    .expect("spec");
    Tool::new(String::new(), object_name.to_owned(), 1, spec).expect("tool")
}

fn who(issuer: &str, user: &str, groups: &[&str]) -> Identity {
    Identity {
        issuer: issuer.into(),
        user: user.into(),
        groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        scopes: vec![],
    }
}

const POLICY: &str = r#"
rules:
  - users: [alice]
    tools: ["*"]
    codingTasks: true
  - groups: [quants]
    issuers: [https://idp.example.com]
    tools: [price_option, calc-greeks]
  - groups: [ops]
    issuers: [kubernetes]
    codingTasks: true
  - users: ["*"]
    issuers: ["*"]
    tools: [get_quote]
"#;

#[tokio::test]
async fn the_policy_file_grants_exactly_what_it_lists() {
    let dir = auth_support::temp_dir("policy");
    let path = dir.join("policy.yaml");
    std::fs::write(&path, POLICY).expect("write");
    let path_arg = path.to_string_lossy().into_owned();
    let authz = args(&["--authz-mode", "static", "--policy-file", &path_arg])
        .build(None, AuthzMetrics::default())
        .expect("policy");

    let price = tool("price_option", "price-option");
    let greeks = tool("calc_greeks", "calc-greeks");
    let quote = tool("get_quote", "get-quote");
    let secret = tool("secret_tool", "secret-tool");
    let alice = who("apikey", "alice", &[]);
    let quant = who("https://idp.example.com", "quinn", &["quants"]);
    let bob = who("kubernetes", "bob", &["ops"]);
    let anon = who("anonymous", "anonymous", &["system:unauthenticated"]);
    // Rules name their issuers: alice of an identity provider is not the API key user alice,
    // and the quants group of another provider is not the one granted.
    let other_alice = who("https://other.example.com", "alice", &["quants"]);

    let matrix = [
        (&alice, [true, true, true, true], true),
        (&other_alice, [false, false, true, false], false),
        (&quant, [true, true, true, false], false),
        (&bob, [false, false, true, false], true),
        (&anon, [false, false, false, false], false),
    ];
    for (identity, tools, tasks) in matrix {
        for (tool, expected) in [&price, &greeks, &quote, &secret].into_iter().zip(tools) {
            let allowed = authz.can_call(identity, tool).await.expect("decision");
            assert_eq!(allowed, expected, "{} -> {}", identity.user, tool.name());
        }
        assert_eq!(authz.can_create_task(identity, "").await.expect("decision"), tasks, "{} tasks", identity.user);
    }
}

#[tokio::test]
async fn an_empty_policy_denies_everything() {
    let dir = auth_support::temp_dir("policy");
    for (i, text) in ["", "rules: []\n", "# nothing yet\n"].into_iter().enumerate() {
        let path = dir.join(format!("empty-{i}.yaml"));
        std::fs::write(&path, text).expect("write");
        let path_arg = path.to_string_lossy().into_owned();
        let authz = args(&["--authz-mode", "static", "--policy-file", &path_arg])
            .build(None, AuthzMetrics::default())
            .expect("policy");
        assert!(!authz.can_call(&who("apikey", "alice", &["quants"]), &tool("t", "t")).await.expect("decision"));
        assert!(!authz.can_create_task(&who("apikey", "alice", &[]), "").await.expect("decision"));
    }
}

#[tokio::test]
async fn malformed_policies_are_refused_with_file_and_field() {
    let dir = auth_support::temp_dir("policy");
    let cases = [
        ("unknown-field.yaml", "rules:\n  - users: [alice]\n    tool: ['*']\n", "unknown field `tool`"),
        ("no-subject.yaml", "rules:\n  - tools: ['*']\n", "rules[0]: set users and/or groups"),
        (
            "grants-nothing.yaml",
            "rules:\n  - users: [a]\n    tools: [x]\n  - groups: [ops]\n",
            "rules[1]: grants nothing",
        ),
        ("pattern.yaml", "rules:\n  - users: [a]\n    tools: ['price_*']\n", "rules[0].tools[0]"),
        ("bad-bool.yaml", "rules:\n  - users: [a]\n    codingTasks: sometimes\n", "codingTasks"),
        ("not-a-list.yaml", "rules:\n  users: [a]\n", "rules"),
        ("no-issuers.yaml", "rules:\n  - users: [a]\n    issuers: []\n    tools: [x]\n", "rules[0].issuers"),
    ];
    for (name, text, needle) in cases {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("write");
        let path_arg = path.to_string_lossy().into_owned();
        let Err(e) = args(&["--authz-mode", "static", "--policy-file", &path_arg]).build(None, AuthzMetrics::default())
        else {
            panic!("{name} was accepted");
        };
        let e = e.to_string();
        assert!(e.contains(&path_arg), "{name}: {e}");
        assert!(e.contains(needle), "{name}: {e:?} should contain {needle:?}");
    }
    let missing = dir.join("missing.yaml").to_string_lossy().into_owned();
    let Err(e) = args(&["--authz-mode", "static", "--policy-file", &missing]).build(None, AuthzMetrics::default())
    else {
        panic!("a missing file was accepted");
    };
    assert!(e.to_string().contains(&missing), "{e}");
}

#[tokio::test]
async fn the_mode_and_its_inputs_must_fit_together() {
    assert!(args(&["--authz-mode", "static"]).build(None, AuthzMetrics::default()).is_err(), "static needs a file");
    assert!(args(&[]).build(None, AuthzMetrics::default()).is_err(), "kubernetes needs a client");
    assert!(args(&["--policy-file", "/p.yaml"]).build(None, AuthzMetrics::default()).is_err(), "file only for static");
}

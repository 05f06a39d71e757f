//! The authorization matrix on the real apiserver: alice and bob (real tokens, TokenReview),
//! tools granted by RoleBindings to a user, to a group, by resourceName, namespace-wide, and
//! cluster-wide by a ClusterRoleBinding. In every cell the listed set equals the callable
//! set, and a tool one may not call answers exactly like a tool that does not exist.

use crate::gateway_support;

use std::collections::BTreeSet;

use gateway_support::{FakePlatform, Gateway, Options, create_tool, grant_call, grant_platform, spec, wait_allowed};
use k8s_openapi::api::rbac::v1::{PolicyRule, Subject};
use rmcp::model::CallToolRequestParams;
use serde_json::json;
use toolyard_tests::{TestEnv, User, random_suffix};

#[tokio::test]
async fn listed_tools_equal_callable_tools_for_every_kind_of_grant() {
    let env = TestEnv::get();
    env.install_crds().await.expect("CRDs");
    let a = env.namespace("gwauthz-a").await.expect("namespace");
    let b = env.namespace("gwauthz-b").await.expect("namespace");
    grant_platform(&a).await;
    grant_platform(&b).await;
    let suffix = random_suffix(6);
    let cluster_object = format!("cluster-granted-{suffix}");
    let tools_a = [
        ("by-user", "by_user"),
        ("by-group", "by_group"),
        ("ops-only", "ops_only"),
        (cluster_object.as_str(), "cluster_granted"),
        ("nobody", "nobody"),
    ];
    for (object, name) in tools_a {
        create_tool(&a, object, spec(name, 60), true).await;
    }
    for (object, name) in [("wide-1", "wide_1"), ("wide-2", "wide_2")] {
        create_tool(&b, object, spec(name, 60), true).await;
    }

    // The grants.
    grant_call(&a, "to-user-alice", &["by-user"], &["alice"], &[]).await;
    grant_call(&a, "to-group-quants", &["by-group"], &[], &["quants"]).await;
    grant_call(&a, "to-group-ops", &["ops-only"], &[], &["ops"]).await;
    grant_call(&b, "bob-namespace-wide", &[], &["bob"], &[]).await;
    let cluster_role = format!("toolyard-test-matrix-{suffix}");
    gateway_support::apply_cluster_role(
        &cluster_role,
        vec![PolicyRule {
            api_groups: Some(vec!["toolyard.dev".into()]),
            resources: Some(vec!["mcptools".into()]),
            resource_names: Some(vec![cluster_object.clone()]),
            verbs: vec!["call".into()],
            ..Default::default()
        }],
        vec![Subject {
            kind: "User".into(),
            name: "bob".into(),
            api_group: Some("rbac.authorization.k8s.io".into()),
            namespace: None,
        }],
    )
    .await;
    let mcp = ("toolyard.dev", "mcptools", "call");
    wait_allowed("alice", &[], &a, mcp.0, mcp.1, mcp.2, Some("by-user")).await;
    wait_allowed("carol", &["quants"], &a, mcp.0, mcp.1, mcp.2, Some("by-group")).await;
    wait_allowed("carol", &["ops"], &a, mcp.0, mcp.1, mcp.2, Some("ops-only")).await;
    wait_allowed("bob", &[], &b, mcp.0, mcp.1, mcp.2, Some("wide-1")).await;
    wait_allowed("bob", &[], &a, mcp.0, mcp.1, mcp.2, Some(&cluster_object)).await;

    let gw = Gateway::start(&[a.clone(), b.clone()], Options::default()).await;
    let _platform_a = FakePlatform::start(&a, &gw.internal).await;
    let _platform_b = FakePlatform::start(&b, &gw.internal).await;
    let all: Vec<&str> =
        ["by_user", "by_group", "ops_only", "cluster_granted", "nobody", "wide_1", "wide_2", "no_such_tool"].into();

    let cells = [
        (User::Alice, vec!["by_group", "by_user"]),
        (User::Bob, vec!["cluster_granted", "ops_only", "wide_1", "wide_2"]),
    ];
    for (user, expected) in cells {
        let client = gw.client(user).await;
        let listed = Gateway::listed(&client).await;
        assert_eq!(listed, expected, "{user:?} lists exactly the tools granted");
        let mut callable = BTreeSet::new();
        for name in &all {
            let request = CallToolRequestParams::new((*name).to_owned())
                .with_arguments(json!({"x": 1}).as_object().unwrap().clone());
            match client.call_tool(request).await {
                Ok(result) => {
                    assert_eq!(result.is_error, Some(false), "{user:?} {name}: {result:?}");
                    callable.insert((*name).to_owned());
                }
                Err(rmcp::ServiceError::McpError(e)) => {
                    // Not granted and not existing look the same: same code, same message shape, no data.
                    assert_eq!(e.code, rmcp::model::ErrorCode::INVALID_PARAMS, "{user:?} {name}");
                    assert_eq!(e.message, format!("Unknown tool: {name:?}"), "{user:?} {name}");
                    assert_eq!(e.data, None);
                }
                Err(other) => panic!("{user:?} {name}: {other:?}"),
            }
        }
        // (`listed` leaves out the call built-ins: listed for anyone who may call a tool.)
        let listed: BTreeSet<String> = listed.into_iter().collect();
        assert_eq!(callable, listed, "{user:?}: the callable set equals the listed set");
        client.cancel().await.ok();
    }
}

/// An McpPrompt `name` in `ns`.
async fn create_prompt(ns: &str, name: &str, spec: serde_json::Value) {
    let env = TestEnv::get();
    let api: kube::Api<toolyard_api::McpPrompt> = kube::Api::namespaced(env.client(User::Admin).await, ns);
    let prompt: toolyard_api::McpPrompt = serde_json::from_value(json!({
        "apiVersion": "toolyard.dev/v1alpha1", "kind": "McpPrompt",
        "metadata": {"name": name, "namespace": ns}, "spec": spec,
    }))
    .expect("McpPrompt");
    api.create(&kube::api::PostParams::default(), &prompt).await.expect("create McpPrompt");
}

/// The prompts `client` lists, sorted.
async fn listed_prompts(
    client: &rmcp::service::RunningService<rmcp::RoleClient, rmcp::model::ClientConfig>,
) -> Vec<String> {
    let mut names: Vec<String> =
        client.list_all_prompts().await.expect("prompts/list").into_iter().map(|p| p.name).collect();
    names.sort();
    names
}

#[tokio::test]
async fn declared_prompts_are_listed_and_got_by_whoever_may_call_them() {
    let env = TestEnv::get();
    env.install_crds().await.expect("CRDs");
    let ns = env.namespace("gwprompts").await.expect("namespace");
    grant_platform(&ns).await;
    create_prompt(
        &ns,
        "price-check",
        json!({
            "title": "Price check",
            "description": "Prices an option.",
            "arguments": [{"name": "ticker", "required": true, "values": ["AAPL", "MSFT", "MSTR"]}],
            "messages": [{"role": "user", "text": "Price a call on {{ticker}}."}],
        }),
    )
    .await;
    create_prompt(
        &ns,
        "risk-summary",
        json!({"description": "Summarizes risk.", "messages": [{"role": "user", "text": "Summarize."}]}),
    )
    .await;
    // A placeholder naming no argument: refused by the gateway, so served to nobody.
    create_prompt(&ns, "broken", json!({"description": "d", "messages": [{"role": "user", "text": "{{missing}}"}]}))
        .await;
    // alice: price-check only; bob: every McpPrompt of the namespace.
    let (group, prompts, call) = (&["toolyard.dev"][..], &["mcpprompts"][..], &["call"][..]);
    let alice_rule = gateway_support::named_rule(group, prompts, call, &["price-check"]);
    gateway_support::apply_role(&ns, "prompt-alice", vec![alice_rule], vec![gateway_support::user_subject("alice")])
        .await;
    let bob_rule = gateway_support::rule(group, prompts, call);
    gateway_support::apply_role(&ns, "prompt-bob", vec![bob_rule], vec![gateway_support::user_subject("bob")]).await;
    wait_allowed("alice", &[], &ns, "toolyard.dev", "mcpprompts", "call", Some("price-check")).await;
    wait_allowed("bob", &[], &ns, "toolyard.dev", "mcpprompts", "call", None).await;

    let gw = Gateway::start(std::slice::from_ref(&ns), Options::default()).await;
    let alice = gw.client(User::Alice).await;
    let bob = gw.client(User::Bob).await;
    assert_eq!(listed_prompts(&alice).await, ["price-check"]);
    assert_eq!(listed_prompts(&bob).await, ["price-check", "risk-summary"], "a broken prompt is served to nobody");

    let get = |name: &str, ticker: Option<&str>| {
        let mut request = rmcp::model::GetPromptRequestParams::new(name.to_owned());
        if let Some(ticker) = ticker {
            request.arguments = Some(json!({"ticker": ticker}).as_object().unwrap().clone());
        }
        request
    };
    let got = alice.get_prompt(get("price-check", Some("MSFT"))).await.expect("prompts/get");
    assert_eq!(
        serde_json::to_value(&got.messages).unwrap(),
        json!([{"role": "user", "content": {"type": "text", "text": "Price a call on MSFT."}}])
    );
    for (name, ticker, expect) in [
        ("price-check", Some("IBM"), "argument \"ticker\" must be one of: AAPL, MSFT, MSTR".to_owned()),
        ("price-check", None, "missing required arguments: ticker".to_owned()),
        // Not granted and not existing look the same.
        ("risk-summary", None, "Unknown prompt: \"risk-summary\"".to_owned()),
        ("no-such-prompt", None, "Unknown prompt: \"no-such-prompt\"".to_owned()),
    ] {
        match alice.get_prompt(get(name, ticker)).await {
            Err(rmcp::ServiceError::McpError(e)) => {
                assert_eq!(e.code, rmcp::model::ErrorCode::INVALID_PARAMS, "{name}");
                assert_eq!(e.message, expect, "{name}");
            }
            other => panic!("{name} {ticker:?}: {other:?}"),
        }
    }
    let completion = alice
        .complete(rmcp::model::CompleteRequestParams::new(
            rmcp::model::Reference::for_prompt("price-check"),
            rmcp::model::ArgumentInfo::new("ticker", "ms"),
        ))
        .await
        .expect("completion/complete");
    assert_eq!(completion.completion.values, ["MSFT", "MSTR"]);

    // The watch follows deletions; a 2026-07-28 client subscribed to prompt changes is told
    // (a 2025-11-25 client is offered them too, on its session's GET stream).
    assert_eq!(
        bob.peer_info().and_then(|i| i.capabilities.prompts.as_ref().map(|p| p.list_changed)),
        Some(Some(true)),
        "2025-11-25: prompts listChanged"
    );
    let modern = gw.modern_client(User::Bob).await;
    assert_eq!(
        modern.peer_info().and_then(|i| i.capabilities.prompts.as_ref().and_then(|p| p.list_changed)),
        Some(true)
    );
    let mut subscription = modern
        .listen(rmcp::model::SubscriptionFilter::builder().prompts_list_changed().build())
        .await
        .expect("subscriptions/listen");
    let api: kube::Api<toolyard_api::McpPrompt> = kube::Api::namespaced(env.client(User::Admin).await, &ns);
    api.delete("risk-summary", &Default::default()).await.expect("delete");
    let note =
        tokio::time::timeout(std::time::Duration::from_secs(20), subscription.next()).await.expect("told in time");
    assert!(matches!(note, Ok(Some(rmcp::model::ServerNotification::PromptListChangedNotification(_)))), "{note:?}");
    assert_eq!(listed_prompts(&bob).await, ["price-check"], "the deleted prompt is gone");
    subscription.cancel().await.ok();
    modern.cancel().await.ok();
    alice.cancel().await.ok();
    bob.cancel().await.ok();
}

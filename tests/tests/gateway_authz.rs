//! The authorization matrix on the real apiserver: alice and bob (real tokens, TokenReview),
//! tools granted by RoleBindings to a user, to a group, by resourceName, namespace-wide, and
//! cluster-wide by a ClusterRoleBinding. In every cell the listed set equals the callable
//! set, and a tool one may not call answers exactly like a tool that does not exist.

mod gateway_support;

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

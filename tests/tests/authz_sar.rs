//! Authorization by SubjectAccessReview on the real apiserver: tools granted to users, to
//! groups, by resourceName and cluster-wide; default deny; coding tasks; the identity
//! mapping of OIDC and API-key users; the decision cache and the one broad review.
//! The reviewing client is the gateway's user with only `create subjectaccessreviews`.

use crate::auth_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use auth_support::rbac::{self, Ask, subject};
use toolyard_gateway::Identity;
use toolyard_gateway::authz::{Authorizer, AuthzMetrics, SarAuthorizer, SarSettings};
use toolyard_gateway::catalog::Tool;
use toolyard_tests::{TestEnv, User, random_suffix};

const GROUP: &str = "toolyard.dev";

fn tool(namespace: &str, object_name: &str) -> Tool {
    let spec = serde_json::from_value(serde_json::json!({
        "name": object_name.replace('-', "_"),
        "description": "test tool",
        "inputSchema": {"type": "object"},
        "runtime": {"image": "python:3.12-slim", "command": ["true"]},
    }))
    .expect("spec");
    Tool::new(namespace.to_owned(), object_name.to_owned(), 1, spec).expect("tool")
}

fn kube_user(user: &str, groups: &[&str]) -> Identity {
    let mut groups: Vec<String> = groups.iter().map(|g| (*g).to_owned()).collect();
    groups.push("system:authenticated".into());
    Identity { issuer: "kubernetes".into(), user: user.into(), groups, scopes: vec![] }
}

fn oidc_user(user: &str, groups: &[&str]) -> Identity {
    Identity {
        issuer: "https://idp.example.com".into(),
        user: user.into(),
        groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        scopes: vec![],
    }
}

fn apikey_user(user: &str, groups: &[&str]) -> Identity {
    Identity { issuer: "apikey".into(), ..oidc_user(user, groups) }
}

async fn authorizer() -> SarAuthorizer {
    rbac::grant_gateway("toolyard-test-gateway-sar", "authorization.k8s.io", "subjectaccessreviews", "create").await;
    let client = TestEnv::get().client(User::Gateway).await;
    SarAuthorizer::new(client, SarSettings::default(), AuthzMetrics::default())
}

fn call(user: &str, groups: &[&str], ns: &str, name: &str) -> Ask {
    Ask::new(user, groups, ns, GROUP, "mcptools", "call").named(name)
}

fn call_all(user: &str, groups: &[&str], ns: &str) -> Ask {
    Ask::new(user, groups, ns, GROUP, "mcptools", "call")
}

#[tokio::test]
async fn tools_granted_to_users_and_groups_by_name_and_nothing_else() {
    let env = TestEnv::get();
    let ns = env.namespace("authz").await.expect("namespace");
    // alice: price-option by name; group ops (bob): calc-greeks by name.
    rbac::namespace_grant(
        &ns,
        "call-price",
        GROUP,
        "mcptools",
        &["call"],
        &["price-option"],
        vec![subject("User", "alice")],
    )
    .await;
    rbac::namespace_grant(
        &ns,
        "call-greeks",
        GROUP,
        "mcptools",
        &["call"],
        &["calc-greeks"],
        vec![subject("Group", "ops")],
    )
    .await;
    rbac::wait_for(call("alice", &[], &ns, "price-option"), true).await;
    rbac::wait_for(call("bob", &["ops"], &ns, "calc-greeks"), true).await;

    let authz = authorizer().await;
    let price = tool(&ns, "price-option");
    let greeks = tool(&ns, "calc-greeks");
    let quote = tool(&ns, "get-quote");
    let alice = kube_user("alice", &["quants", "viewers"]);
    let bob = kube_user("bob", &["ops"]);

    let matrix = [
        (&alice, &price, true),
        (&alice, &greeks, false),
        (&alice, &quote, false),
        (&bob, &price, false),
        (&bob, &greeks, true),
        (&bob, &quote, false),
    ];
    for (who, tool, expected) in matrix {
        let allowed = authz.can_call(who, tool).await.expect("decision");
        assert_eq!(allowed, expected, "{} on {}", who.user, tool.object_name);
    }
    // An API-key user named alice is reviewed as alice; an OIDC user named alice is not.
    assert!(authz.can_call(&apikey_user("alice", &[]), &price).await.expect("decision"));
    assert!(!authz.can_call(&oidc_user("alice", &["ops"]), &price).await.expect("decision"));
    assert!(!authz.can_call(&oidc_user("alice", &["ops"]), &greeks).await.expect("decision"));
    // A tool of the same name in another namespace is another object.
    let elsewhere = env.namespace("authz-other").await.expect("namespace");
    assert!(!authz.can_call(&alice, &tool(&elsewhere, "price-option")).await.expect("decision"));
}

#[tokio::test]
async fn a_cluster_wide_grant_costs_one_review_per_subject() {
    let env = TestEnv::get();
    let ns = env.namespace("authz-cw").await.expect("namespace");
    let ns2 = env.namespace("authz-cw2").await.expect("namespace");
    let name = format!("toolyard-test-call-all-{}", random_suffix(6));
    // OIDC users are reviewed with the oidc: prefix, so the binding names the prefixed group.
    rbac::cluster_grant(&name, GROUP, "mcptools", &["call"], &[], vec![subject("Group", "oidc:analysts")]).await;
    rbac::wait_for(call_all("oidc:erin", &["oidc:analysts"], &ns), true).await;

    let authz = authorizer().await;
    let erin = oidc_user("erin", &["analysts"]);
    let before = authz.reviews_sent();
    for object in ["a", "b", "c", "d", "e"] {
        assert!(authz.can_call(&erin, &tool(&ns, object)).await.expect("decision"), "{object}");
    }
    assert_eq!(authz.reviews_sent() - before, 1, "one broad review covers every tool of the namespace");
    assert!(authz.can_call(&erin, &tool(&ns2, "a")).await.expect("decision"));
    assert_eq!(authz.reviews_sent() - before, 2, "one more for the other namespace");

    // The group without the prefix, or another user, gets nothing.
    assert!(!authz.can_call(&kube_user("erin", &["analysts"]), &tool(&ns, "a")).await.expect("decision"));
    assert!(!authz.can_call(&oidc_user("frank", &[]), &tool(&ns, "a")).await.expect("decision"));
    rbac::remove_cluster_grant(&name).await;
}

#[tokio::test]
async fn a_namespace_wide_role_grants_every_tool_there() {
    let env = TestEnv::get();
    let ns = env.namespace("authz-nw").await.expect("namespace");
    rbac::namespace_grant(&ns, "call-all", GROUP, "mcptools", &["call"], &[], vec![subject("Group", "quants")]).await;
    rbac::wait_for(call_all("alice", &["quants"], &ns), true).await;
    let authz = authorizer().await;
    let alice = kube_user("alice", &["quants", "viewers"]);
    assert!(authz.can_call(&alice, &tool(&ns, "anything")).await.expect("decision"));
    assert!(!authz.can_call(&kube_user("bob", &["ops"]), &tool(&ns, "anything")).await.expect("decision"));
    let other = env.namespace("authz-nw2").await.expect("namespace");
    assert!(!authz.can_call(&alice, &tool(&other, "anything")).await.expect("decision"));
}

#[tokio::test]
async fn coding_tasks_need_create_on_codingtasks() {
    let env = TestEnv::get();
    let ns = env.namespace("authz-task").await.expect("namespace");
    rbac::namespace_grant(&ns, "tasks", GROUP, "codingtasks", &["create"], &[], vec![subject("User", "alice")]).await;
    rbac::wait_for(Ask::new("alice", &[], &ns, GROUP, "codingtasks", "create"), true).await;
    let authz = authorizer().await;
    assert!(authz.can_create_task(&kube_user("alice", &["quants"]), &ns).await.expect("decision"));
    assert!(!authz.can_create_task(&kube_user("bob", &["ops"]), &ns).await.expect("decision"));
    // Calling tools is a different permission.
    assert!(!authz.can_call(&kube_user("alice", &["quants"]), &tool(&ns, "x")).await.expect("decision"));
}

#[tokio::test]
async fn decisions_are_cached_and_concurrent_questions_share_one_review() {
    let env = TestEnv::get();
    let ns = env.namespace("authz-cache").await.expect("namespace");
    rbac::namespace_grant(&ns, "call-one", GROUP, "mcptools", &["call"], &["one"], vec![subject("User", "alice")])
        .await;
    rbac::wait_for(call("alice", &[], &ns, "one"), true).await;
    let authz = authorizer().await;
    let alice = kube_user("alice", &[]);
    let one = Arc::new(tool(&ns, "one"));

    let answers = futures::future::join_all((0..16).map(|_| {
        let (authz, alice, one) = (authz.clone(), alice.clone(), Arc::clone(&one));
        async move { authz.can_call(&alice, &one).await.expect("decision") }
    }))
    .await;
    assert!(answers.iter().all(|a| *a));
    assert_eq!(authz.reviews_sent(), 2, "one broad review (denied) and one for the tool, shared by 16 callers");

    assert!(authz.can_call(&alice, &one).await.expect("decision"));
    assert!(!authz.can_call(&kube_user("bob", &[]), &one).await.expect("decision"));
    let after_bob = authz.reviews_sent();
    assert!(!authz.can_call(&kube_user("bob", &[]), &one).await.expect("decision"));
    assert_eq!(authz.reviews_sent(), after_bob, "the deny came from the cache");
    // Groups are part of the key: the same user with other groups is asked again.
    assert!(authz.can_call(&kube_user("alice", &["ops"]), &one).await.expect("decision"));
    assert!(authz.reviews_sent() > after_bob);
}

#[tokio::test]
async fn a_failing_review_denies_and_is_not_cached() {
    // bob may not create SubjectAccessReviews: every review fails with 403.
    let env = TestEnv::get();
    let ns = env.namespace("authz-err").await.expect("namespace");
    let metrics = AuthzMetrics::default();
    let authz = SarAuthorizer::new(env.client(User::Bob).await, SarSettings::default(), metrics.clone());
    let admin = kube_user("admin", &["system:masters"]);
    assert!(!authz.can_call(&admin, &tool(&ns, "x")).await.expect("decision"));
    assert!(!authz.can_create_task(&admin, &ns).await.expect("decision"));
    assert_eq!(metrics.review_errors.get(), 2);
    assert!(!authz.can_call(&admin, &tool(&ns, "x")).await.expect("decision"));
    assert_eq!(authz.reviews_sent(), 3, "errors are not cached");
}

/// A tool of McpServer `server` whose name on that server is `upstream_name`.
fn upstream_tool(namespace: &str, server: &str, upstream_name: &str) -> Tool {
    let link =
        toolyard_gateway::upstream::link::Link::new(format!("{namespace}/{server}"), Duration::from_secs(5), None);
    let upstream = toolyard_gateway::catalog::Upstream { tool: upstream_name.to_owned(), executor: Arc::new(link) };
    tool(namespace, server).with_upstream(upstream)
}

#[tokio::test]
async fn upstream_tools_are_granted_by_server_or_by_server_and_tool() {
    let env = TestEnv::get();
    let ns = env.namespace("authz-upstream").await.expect("namespace");
    // alice: every tool of market-data; bob: its get_quote only; carol: all McpTools, no server.
    rbac::namespace_grant(
        &ns,
        "md-all",
        GROUP,
        "mcpservers",
        &["call"],
        &["market-data"],
        vec![subject("User", "alice")],
    )
    .await;
    rbac::namespace_grant(
        &ns,
        "md-quote",
        GROUP,
        "mcpservers",
        &["call"],
        &["market-data/get_quote"],
        vec![subject("User", "bob")],
    )
    .await;
    rbac::namespace_grant(&ns, "tools", GROUP, "mcptools", &["call"], &[], vec![subject("User", "carol")]).await;
    rbac::wait_for(Ask::new("bob", &[], &ns, GROUP, "mcpservers", "call").named("market-data/get_quote"), true).await;
    rbac::wait_for(Ask::new("alice", &[], &ns, GROUP, "mcpservers", "call").named("market-data"), true).await;
    rbac::wait_for(call_all("carol", &[], &ns), true).await;
    let authz = authorizer().await;
    let quote = upstream_tool(&ns, "market-data", "get_quote");
    let history = upstream_tool(&ns, "market-data", "get_history");
    let other = upstream_tool(&ns, "research", "search");
    let decide = async |user: &str, t: &Tool| authz.can_call(&kube_user(user, &[]), t).await.expect("decision");
    assert!(decide("alice", &quote).await && decide("alice", &history).await);
    assert!(!decide("alice", &other).await, "another server is not granted");
    assert!(decide("bob", &quote).await);
    assert!(!decide("bob", &history).await, "a grant of one tool is not one of the server");
    assert!(!decide("carol", &quote).await, "McpTools grants do not cover servers' tools");
    assert!(decide("carol", &tool(&ns, "x")).await);

    // A server's prompts are granted the same way; its resources with the whole server.
    let link =
        Arc::new(toolyard_gateway::upstream::link::Link::new("market-data".into(), Duration::from_secs(5), None));
    let summary = toolyard_gateway::catalog::Prompt {
        namespace: ns.clone(),
        object_name: "market-data".into(),
        declared: false,
        name: "market_data_summary".into(),
        upstream_name: "summary".into(),
        toolset: None,
        listing: serde_json::Value::Null,
        required: Vec::new(),
        source: link.clone(),
        completer: link.clone(),
    };
    let get = async |user: &str| authz.can_get_prompt(&kube_user(user, &[]), &summary).await.expect("decision");
    assert!(get("alice").await, "the server's grant covers its prompts");
    assert!(!get("bob").await, "a grant of one tool is not one of its prompts");
    assert!(!get("carol").await);
    let quotes = toolyard_gateway::catalog::ServedResource {
        namespace: ns.clone(),
        object_name: "market-data".into(),
        toolset: None,
        uri: "quotes://ACME/last".into(),
        template_prefix: None,
        listing: serde_json::Value::Null,
        source: link.clone(),
        completer: link,
    };
    let read = async |user: &str| authz.can_read_resource(&kube_user(user, &[]), &quotes).await.expect("decision");
    assert!(read("alice").await, "the server's grant covers its resources");
    assert!(!read("bob").await, "a grant of one tool is not one of the server's resources");
    assert!(!read("carol").await);
}

/// A listing's batch decides as one-by-one questions do, with one broad review per namespace
/// (and per kind: McpTools, McpServers) and named reviews only where the broad one denies.
#[tokio::test]
async fn a_batch_decides_like_single_questions_with_one_broad_review_per_namespace() {
    let env = TestEnv::get();
    let wide = env.namespace("authz-batch-wide").await.expect("namespace");
    let named = env.namespace("authz-batch-named").await.expect("namespace");
    let none = env.namespace("authz-batch-none").await.expect("namespace");
    rbac::namespace_grant(&wide, "all", GROUP, "mcptools", &["call"], &[], vec![subject("User", "dora")]).await;
    rbac::namespace_grant(&named, "two", GROUP, "mcptools", &["call"], &["t1", "t3"], vec![subject("User", "dora")])
        .await;
    rbac::namespace_grant(&named, "md", GROUP, "mcpservers", &["call"], &["md"], vec![subject("User", "dora")]).await;
    rbac::wait_for(call_all("dora", &[], &wide), true).await;
    rbac::wait_for(call("dora", &[], &named, "t3"), true).await;
    rbac::wait_for(Ask::new("dora", &[], &named, GROUP, "mcpservers", "call").named("md"), true).await;

    let mut tools = Vec::new();
    for ns in [&wide, &named, &none] {
        for object in ["t0", "t1", "t2", "t3"] {
            tools.push(tool(ns, object));
        }
    }
    tools.push(upstream_tool(&named, "md", "get_quote"));
    tools.push(upstream_tool(&named, "research", "search"));
    let expected = [
        true, true, true, true, // every tool of `wide`
        false, true, false, true, // t1 and t3 of `named`
        false, false, false, false, // nothing in `none`
        true, false, // the md server's tool, not research's
    ];
    let dora = kube_user("dora", &[]);
    let refs: Vec<&Tool> = tools.iter().collect();

    let batch = authorizer().await;
    let asked_at = Instant::now();
    let decided = batch.can_call_each(&dora, &refs).await.expect("decisions");
    assert_eq!(decided.allowed, expected);
    // The answers hold until the first of their decisions expires: the denies, asked now.
    let hold_until = decided.hold_until.expect("the decisions hold for a while");
    let deny_ttl = SarSettings::default().deny_ttl;
    assert!(hold_until > asked_at + deny_ttl / 2 && hold_until <= Instant::now() + deny_ttl, "{hold_until:?}");
    // Broad: 3 namespaces for McpTools, 1 for McpServers. Named: the 8 tools of `named` and
    // `none`, the md server (which allows), the research server and research/search.
    let reviews = batch.reviews_sent();
    assert_eq!(reviews, 4 + 8 + 2 + 1, "one broad review per namespace and kind");

    let single = authorizer().await;
    for (tool, expected) in tools.iter().zip(expected) {
        assert_eq!(single.can_call(&dora, tool).await.expect("decision"), expected, "{}", tool.object_name);
    }
    assert_eq!(single.reviews_sent(), reviews, "the same questions, asked one by one");
    let before = batch.reviews_sent();
    let cached = batch.can_call_each(&dora, &refs).await.expect("decisions");
    assert_eq!(cached.allowed, expected);
    assert_eq!(batch.reviews_sent(), before, "cached");
    assert_eq!(cached.hold_until, Some(hold_until), "cached decisions hold only as long as they did");
}

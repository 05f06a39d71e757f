//! The gateway end to end over HTTP with a real MCP client (rmcp): tools from McpTool objects
//! on the real apiserver, calls as ToolCalls completed as the controller and runner will,
//! files in the real S3 server, TokenReview authentication and SubjectAccessReview
//! authorization with the test users' real tokens.

use crate::gateway_support;

use std::sync::Arc;
use std::time::Duration;

use gateway_support::{
    Behaviour, CountingStore, FakePlatform, Gateway, Options, create_tool, delete_tool, grant_call, grant_platform,
    spec, toolcalls,
};
use kube::api::Api;
use rmcp::ClientLifecycleMode;
use rmcp::model::{CallToolRequestParams, ProtocolVersion, SubscriptionFilter};
use serde_json::{Value, json};
use tokio::sync::Notify;
use toolyard_api::agent::ToolOutcome;
use toolyard_api::codingtask::{Budgets, ToolSelection};
use toolyard_api::conditions::reason;
use toolyard_api::protocol::{CallResult, path};
use toolyard_api::storage::CallFile;
use toolyard_api::token::{Claims, RunKind};
use toolyard_api::{OwnerKey, ToolCall};
use toolyard_gateway::Identity;
use toolyard_gateway::tasks::{NewTask, TaskRecord, new_task_id};
use toolyard_tests::legacy::LegacySession;
use toolyard_tests::{TestEnv, User, wait_until};

/// A namespace with the platform's RBAC, `tools` (object name, MCP name, timeout) Ready, and
/// alice allowed to call all of them.
async fn setup(prefix: &str, tools: &[(&str, &str, i32)]) -> String {
    let env = TestEnv::get();
    env.install_crds().await.expect("CRDs");
    let ns = env.namespace(prefix).await.expect("namespace");
    grant_platform(&ns).await;
    for (object, name, timeout) in tools {
        create_tool(&ns, object, spec(name, *timeout), true).await;
    }
    grant_call(&ns, "alice-calls", &[], &["alice"], &[]).await;
    gateway_support::wait_allowed("alice", &[], &ns, "toolyard.dev", "mcptools", "call", Some("anything")).await;
    ns
}

/// A coding task of `owner` created through the gateway's task backend (nothing runs it), and
/// the task token its agent would hold.
async fn task_of(gw: &Gateway, ns: &str, owner: &toolyard_api::Owner) -> (TaskRecord, String) {
    let tasks = gw.state.tasks.clone().expect("a task backend");
    let task = tasks
        .create(NewTask {
            id: new_task_id(),
            owner: Identity::from_owner(owner),
            prompt: "a task".into(),
            tools: ToolSelection::default(),
            budgets: Budgets::default(),
            profile: "default".into(),
            traceparent: None,
        })
        .await
        .expect("task");
    let claims = Claims {
        kind: RunKind::Task,
        ns: ns.to_owned(),
        id: task.id.to_string(),
        owner: owner.clone(),
        exp: k8s_openapi::jiff::Timestamp::now().as_second() + 600,
    };
    let token = gateway_support::signing_key().sign(&claims);
    (task, token)
}

/// Lets `user` start coding tasks in `ns` with any model profile.
async fn grant_tasks(ns: &str, user: &str) {
    gateway_support::apply_role(
        ns,
        &format!("{user}-tasks"),
        vec![
            gateway_support::rule(&["toolyard.dev"], &["codingtasks"], &["create"]),
            gateway_support::rule(&["toolyard.dev"], &["modelprofiles"], &["use"]),
        ],
        vec![gateway_support::user_subject(user)],
    )
    .await;
}

fn args(v: Value) -> serde_json::Map<String, Value> {
    v.as_object().expect("object").clone()
}

fn call(name: &str, arguments: Value) -> CallToolRequestParams {
    CallToolRequestParams::new(name.to_owned()).with_arguments(args(arguments))
}

fn text_of(result: &rmcp::model::CallToolResult) -> String {
    result.content.iter().filter_map(|c| c.as_text().map(|t| t.text.clone())).collect::<Vec<_>>().join("\n")
}

async fn wait_tools(
    client: &rmcp::service::RunningService<rmcp::RoleClient, rmcp::model::ClientConfig>,
    want: &[&str],
) {
    let mut want: Vec<String> = want.iter().map(|s| (*s).to_owned()).collect();
    want.sort();
    let mut last = Vec::new();
    for _ in 0..100 {
        last = Gateway::listed(client).await;
        if last == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("listed {last:?}, wanted {want:?}");
}

#[tokio::test]
async fn lists_ready_tools_with_their_schemas_and_calls_one_through_a_toolcall() {
    let ns = setup("gwmcp", &[("price-option", "price_option", 60), ("greeks", "calc_greeks", 60)]).await;
    create_tool(&ns, "not-ready", spec("not_ready", 60), false).await;
    let gw = Gateway::start(std::slice::from_ref(&ns), Options::default()).await;
    let mut platform = FakePlatform::start(&ns, &gw.internal).await;
    let client = gw.client(User::Alice).await;

    let tools = client.list_all_tools().await.expect("tools/list");
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert_eq!(
        names,
        ["calc_greeks", "cancel_call", "delete_call", "get_call_result", "price_option", "start_call"],
        "only Ready tools, sorted, and the call built-ins"
    );
    let price = tools.iter().find(|t| t.name == "price_option").expect("price_option");
    assert_eq!(price.title.as_deref(), Some("Tool price_option"));
    assert_eq!(price.description.as_deref(), Some("Test tool price_option"));
    assert_eq!(price.input_schema.get("required"), Some(&json!(["x"])));
    assert_eq!(price.annotations.as_ref().and_then(|a| a.read_only_hint), Some(true));
    assert!(price.output_schema.is_some());

    let result = client.call_tool(call("price_option", json!({"x": 1.5, "label": "a"}))).await.expect("tools/call");
    assert_eq!(result.is_error, Some(false), "{result:?}");
    assert_eq!(result.structured_content, Some(json!({"echo": {"x": 1.5, "label": "a"}})));
    assert_eq!(
        serde_json::from_str::<Value>(&text_of(&result)).expect("JSON text"),
        json!({"echo": {"x": 1.5, "label": "a"}})
    );

    // What the platform saw: one ToolCall with the caller as owner and the input in storage.
    let seen = platform.next().await;
    assert_eq!(seen.input, json!({"x": 1.5, "label": "a"}));
    let tc = seen.call;
    assert_eq!(tc.spec.tool, "price-option");
    assert_eq!(tc.spec.owner.user, "alice");
    assert_eq!(tc.spec.owner.issuer, "kubernetes");
    assert!(tc.spec.owner.groups.iter().any(|g| g == "quants"), "{:?}", tc.spec.owner.groups);
    assert_eq!(tc.spec.timeout_seconds, 60);
    assert!(!tc.spec.cancel_requested);
    let owner = tc.spec.owner.key();
    let id = toolyard_api::storage::RunId::parse(&kube::ResourceExt::name_any(&tc)).expect("id");
    assert!(id.as_str().starts_with("price-option-"), "{id}");
    assert_eq!(tc.spec.input.key, toolyard_api::storage::call_key(&owner, &id, CallFile::Input));
    let stored = gw.store.get(&owner, &format!("calls/{id}/input.json")).await.expect("get").expect("input stored");
    assert_eq!(serde_json::from_slice::<Value>(&stored).expect("json"), json!({"x": 1.5, "label": "a"}));
    let stored: CallResult =
        serde_json::from_slice(&gw.store.get(&owner, &format!("calls/{id}/result.json")).await.unwrap().unwrap())
            .unwrap();
    assert_eq!(stored.value, Some(json!({"echo": {"x": 1.5, "label": "a"}})));
    // The internal API recorded the result summary on the ToolCall as the gateway.
    let api: Api<ToolCall> = Api::namespaced(TestEnv::get().client(User::Admin).await, &ns);
    let tc = api.get(id.as_str()).await.expect("ToolCall");
    let summary = tc.status.and_then(|s| s.result).expect("status.result written by the gateway");
    assert!(!summary.is_error);
    assert_eq!(summary.key, toolyard_api::storage::call_key(&owner, &id, CallFile::Result));
    client.cancel().await.ok();
}

#[tokio::test]
async fn tool_failures_are_is_error_with_the_tools_own_message() {
    let ns =
        setup("gwfail", &[("fails", "fails", 60), ("timeouts", "times_out", 60), ("rejects", "rejects", 60)]).await;
    let gw = Gateway::start(std::slice::from_ref(&ns), Options::default()).await;
    let platform = FakePlatform::start(&ns, &gw.internal).await;
    platform.set("fails", Behaviour::ToolError("volatility must be positive".into()));
    platform.set("timeouts", Behaviour::ConditionOnly(reason::TIMED_OUT, "deadline of 60s exceeded".into()));
    platform.set("rejects", Behaviour::ConditionOnly(reason::IMAGE_PULL_FAILED, "image not found".into()));
    let client = gw.client(User::Alice).await;

    let r = client.call_tool(call("fails", json!({"x": 1}))).await.expect("call");
    assert_eq!(r.is_error, Some(true));
    assert_eq!(text_of(&r), "volatility must be positive");
    assert!(r.structured_content.is_none());

    let r = client.call_tool(call("times_out", json!({"x": 1}))).await.expect("call");
    assert_eq!(r.is_error, Some(true));
    assert_eq!(text_of(&r), "deadline of 60s exceeded", "no stored result: built from the condition");

    let r = client.call_tool(call("rejects", json!({"x": 1}))).await.expect("call");
    assert_eq!(r.is_error, Some(true));
    assert_eq!(text_of(&r), "the tool could not start: image not found");
    client.cancel().await.ok();
}

#[tokio::test]
async fn invalid_arguments_are_refused_naming_the_field_and_create_nothing() {
    let ns = setup("gwinv", &[("strict", "strictly_checked", 60)]).await;
    let gw = Gateway::start(std::slice::from_ref(&ns), Options::default()).await;
    let client = gw.client(User::Alice).await;
    let cases = [
        (json!({"x": "ten"}), "/x"),
        (json!({}), "\"x\" is a required property"),
        (json!({"x": 1, "extra": true}), "extra"),
    ];
    for (arguments, needle) in cases {
        let r = client.call_tool(call("strictly_checked", arguments.clone())).await.expect("call");
        assert_eq!(r.is_error, Some(true), "{arguments}");
        let text = text_of(&r);
        assert!(text.starts_with("invalid arguments: "), "{text}");
        assert!(text.contains(needle), "{text:?} should name {needle:?}");
    }
    // Nothing was created on the apiserver, and nothing was stored.
    assert!(toolcalls(&ns).await.is_empty(), "no ToolCall for invalid arguments");
    let owner = toolyard_api::OwnerKey::derive("kubernetes", "alice");
    let stored = gw.store.list(&owner, "calls/").await.expect("list");
    assert!(stored.iter().all(|o| !o.path.starts_with("calls/strictly-checked-")), "{stored:?}");
    client.cancel().await.ok();
}

#[tokio::test]
async fn unknown_and_unauthorized_tools_answer_identically() {
    let ns = setup("gwunk", &[("secret-tool", "secret_tool", 60)]).await;
    let gw = Gateway::start(std::slice::from_ref(&ns), Options::default()).await;
    let _platform = FakePlatform::start(&ns, &gw.internal).await;
    // bob has no grant: secret_tool is absent from his list and calling it looks unknown.
    let bob = gw.client(User::Bob).await;
    assert!(bob.list_all_tools().await.expect("tools/list").is_empty(), "not even the call built-ins");
    let unauthorized = bob.call_tool(call("secret_tool", json!({"x": 1}))).await.expect_err("refused");
    let unknown = bob.call_tool(call("no_such_tool", json!({"x": 1}))).await.expect_err("refused");
    let (a, b) = match (unauthorized, unknown) {
        (rmcp::ServiceError::McpError(a), rmcp::ServiceError::McpError(b)) => (a, b),
        other => panic!("expected JSON-RPC errors, got {other:?}"),
    };
    assert_eq!(a.code, b.code);
    assert_eq!(a.data, b.data);
    assert_eq!(a.message, "Unknown tool: \"secret_tool\"");
    assert_eq!(b.message, "Unknown tool: \"no_such_tool\"");
    // Invalid arguments to a tool bob may not call still say "unknown" (nothing is validated first).
    let e = bob.call_tool(call("secret_tool", json!({"x": "bad"}))).await.expect_err("refused");
    assert!(format!("{e:?}").contains("Unknown tool"), "{e:?}");
    assert!(toolcalls(&ns).await.is_empty());
    // alice, who may, can.
    let alice = gw.client(User::Alice).await;
    assert_eq!(Gateway::listed(&alice).await, ["secret_tool"]);
    let r = alice.call_tool(call("secret_tool", json!({"x": 2}))).await.expect("alice calls");
    assert_eq!(r.is_error, Some(false));
    bob.cancel().await.ok();
    alice.cancel().await.ok();
}

#[tokio::test]
async fn a_call_past_its_deadline_times_out_and_requests_cancellation() {
    let ns = setup("gwdead", &[("slow", "slow", 1)]).await;
    let options = Options { call_grace: Duration::from_secs(1), ..Options::default() };
    let gw = Gateway::start(std::slice::from_ref(&ns), options).await;
    let platform = FakePlatform::start(&ns, &gw.internal).await;
    platform.set("slow", Behaviour::Hold);
    let client = gw.client(User::Alice).await;
    let r = client.call_tool(call("slow", json!({"x": 1}))).await.expect("call");
    assert_eq!(r.is_error, Some(true));
    assert_eq!(text_of(&r), "timed out after 1s");
    wait_until(Duration::from_secs(10), "cancelRequested on the ToolCall", || {
        let ns = ns.clone();
        async move { Ok(toolcalls(&ns).await.iter().any(|tc| tc.spec.cancel_requested)) }
    })
    .await
    .expect("cancellation requested");
    client.cancel().await.ok();
}

#[tokio::test]
async fn a_client_that_goes_away_cancels_its_toolcall() {
    let ns = setup("gwgone", &[("held", "held", 300)]).await;
    let gw = Gateway::start(std::slice::from_ref(&ns), Options::default()).await;
    let mut platform = FakePlatform::start(&ns, &gw.internal).await;
    platform.set("held", Behaviour::Hold);
    let token = TestEnv::get().token(User::Alice).to_owned();
    let body =
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "held", "arguments": {"x": 1}}});
    let url = gw.mcp_url();
    let request = tokio::spawn(async move {
        gateway_support::post_raw(&url, Some(&token), body.to_string(), "application/json").await
    });
    let seen = platform.next().await;
    assert!(!seen.call.spec.cancel_requested);
    request.abort();
    let name = kube::ResourceExt::name_any(&seen.call);
    wait_until(Duration::from_secs(15), "cancelRequested after the client left", || {
        let ns = ns.clone();
        let name = name.clone();
        async move {
            Ok(toolcalls(&ns)
                .await
                .iter()
                .any(|tc| kube::ResourceExt::name_any(tc) == name && tc.spec.cancel_requested))
        }
    })
    .await
    .expect("cancelled");
}

#[tokio::test]
async fn new_and_deleted_tools_show_up_and_modern_clients_are_notified() {
    let ns = setup("gwwatch", &[("first", "first", 60)]).await;
    let gw = Gateway::start(std::slice::from_ref(&ns), Options::default()).await;
    let client = gw.modern_client(User::Alice).await;
    assert_eq!(client.peer_info().map(|i| i.protocol_version.clone()), Some(ProtocolVersion::V_2026_07_28));
    assert_eq!(Gateway::listed(&client).await, ["first"]);
    let mut subscription =
        client.listen(SubscriptionFilter::builder().tools_list_changed().build()).await.expect("subscriptions/listen");
    create_tool(&ns, "second", spec("second", 60), true).await;
    let note = tokio::time::timeout(Duration::from_secs(20), subscription.next()).await.expect("notified in time");
    assert!(matches!(note, Ok(Some(rmcp::model::ServerNotification::ToolListChangedNotification(_)))), "{note:?}");
    wait_tools(&client, &["first", "second"]).await;
    delete_tool(&ns, "first").await;
    wait_tools(&client, &["second"]).await;
    subscription.cancel().await.ok();
    client.cancel().await.ok();
}

/// A 2025-11-25 client's session is kept by no replica: opened at one, it is taken at
/// another, whose GET stream of it hears the catalog change. It is the caller's only: another
/// user sending it, or a forged id, gets 404.
#[tokio::test]
async fn a_2025_session_opened_at_one_replica_streams_changes_from_another() {
    let ns = setup("gwsession", &[("first", "first", 60)]).await;
    let a = Gateway::start(std::slice::from_ref(&ns), Options::default()).await;
    let b = Gateway::start(std::slice::from_ref(&ns), Options::default()).await;
    let env = TestEnv::get();
    let session = LegacySession::open(&a.mcp_url(), env.token(User::Alice)).await;
    let at_b = session.at(&b.mcp_url());
    let listed = at_b.post(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})).await;
    let names: Vec<&str> =
        listed["result"]["tools"].as_array().expect("tools").iter().filter_map(|t| t["name"].as_str()).collect();
    assert!(names.contains(&"first"), "{listed}");
    let bobs = at_b.as_other(env.token(User::Bob));
    assert_eq!(
        bobs.request(reqwest::Method::POST)
            .json(&json!({"jsonrpc": "2.0", "id": 3, "method": "ping"}))
            .send()
            .await
            .expect("POST")
            .status(),
        404
    );
    assert_eq!(bobs.get().await.status(), 404);
    let mut forged = at_b.clone();
    forged.id = format!("{}.{}", "0".repeat(32), "0".repeat(64));
    assert_eq!(forged.get().await.status(), 404);

    let mut stream = at_b.stream().await;
    create_tool(&ns, "second", spec("second", 60), true).await;
    let note = tokio::time::timeout(Duration::from_secs(20), stream.until("notifications/tools/list_changed"))
        .await
        .expect("notified in time");
    assert_eq!(note["jsonrpc"], "2.0", "{note}");
}

/// The error a refused `subscriptions/listen` ends with: the request's answer (the gateway
/// refuses it before acknowledging anything), or, for a listen served through rmcp, which
/// acknowledges a subscription before the server's handler runs, the answer right after it.
async fn refused_listen(client: &rmcp::service::RunningService<rmcp::RoleClient, rmcp::model::ClientConfig>) -> String {
    let filter = SubscriptionFilter::builder().tools_list_changed().build();
    let outcome = match client.listen(filter).await {
        Err(e) => Err(e),
        Ok(mut subscription) => tokio::time::timeout(Duration::from_secs(5), subscription.next())
            .await
            .expect("the refusal comes at once")
            .map(|n| format!("{n:?}")),
    };
    format!("{outcome:?}")
}

#[tokio::test]
async fn open_listen_streams_are_limited_per_user_and_a_closed_one_frees_its_slot() {
    let ns = setup("gwstreams", &[("first", "first", 60)]).await;
    let mut options = Options::default();
    options.settings.limits.max_streams_per_user = 2;
    let gw = Gateway::start(std::slice::from_ref(&ns), options).await;
    let alice = gw.modern_client(User::Alice).await;
    let filter = || SubscriptionFilter::builder().tools_list_changed().build();
    let mut first = alice.listen(filter()).await.expect("a first stream");
    let mut second = alice.listen(filter()).await.expect("a second stream");
    let refused = refused_listen(&alice).await;
    assert!(refused.contains("too many open subscriptions/listen streams for this user"), "{refused}");
    let metrics = reqwest::get(format!("{}/metrics", gw.base)).await.expect("metrics").text().await.expect("text");
    assert!(
        metrics.contains("toolyard_gateway_admission_rejections_total{reason=\"streams_user\"} 1"),
        "the refusal is counted: {metrics}"
    );
    // A 2025-era session's GET stream is held to the same limit.
    let session = LegacySession::open(&gw.mcp_url(), TestEnv::get().token(User::Alice)).await;
    let get = session.get().await;
    assert_eq!(get.status(), 429);
    assert!(get.headers().contains_key("retry-after"));

    // Another user is not held back, and the open streams still hear changes.
    let bob = gw.modern_client(User::Bob).await;
    let bobs = bob.listen(filter()).await.expect("bob's stream");
    create_tool(&ns, "second", spec("second", 60), true).await;
    let note = tokio::time::timeout(Duration::from_secs(20), second.next()).await.expect("notified in time");
    assert!(matches!(note, Ok(Some(rmcp::model::ServerNotification::ToolListChangedNotification(_)))), "{note:?}");

    // Closing a stream frees its slot.
    first.cancel().await.ok();
    let mut third = None;
    for _ in 0..50 {
        match alice.listen(filter()).await {
            Ok(mut s) => match tokio::time::timeout(Duration::from_millis(300), s.next()).await {
                // Still open after a moment: admitted.
                Err(_) => {
                    third = Some(s);
                    break;
                }
                Ok(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            },
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    assert!(third.is_some(), "a closed stream frees its slot");
    for mut s in [Some(second), Some(bobs), third].into_iter().flatten() {
        s.cancel().await.ok();
    }
    alice.cancel().await.ok();
    bob.cancel().await.ok();
}

/// Sends a raw 2026-07-28 `subscriptions/listen` for tool list changes and the resource
/// `uri`, with `accept` as its Accept header.
async fn send_listen(gw: &Gateway, accept: &str, uri: &str) -> reqwest::Response {
    let body = json!({"jsonrpc": "2.0", "id": "watch-1", "method": "subscriptions/listen", "params": {
    "notifications": {"toolsListChanged": true, "promptsListChanged": false, "resourceSubscriptions": [uri, "no-scheme"]},
    "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
    }}});
    reqwest::Client::new()
        .post(gw.mcp_url())
        .bearer_auth(TestEnv::get().token(User::Alice))
        .header("accept", accept)
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "subscriptions/listen")
        .json(&body)
        .send()
        .await
        .expect("listen")
}

/// [`send_listen`]'s stream.
async fn raw_listen(gw: &Gateway, accept: &str, uri: &str) -> toolyard_tests::legacy::SseReader {
    let response = send_listen(gw, accept, uri).await;
    assert_eq!(response.status(), 200, "{accept}");
    assert_eq!(response.headers()["content-type"], "text/event-stream", "{accept}");
    assert_eq!(response.headers()["x-accel-buffering"], "no", "{accept}");
    toolyard_tests::legacy::SseReader::new(response)
}

/// A plain `subscriptions/listen` is served by the gateway's direct path, without rmcp's
/// per-request service (which costs an open stream some 45 KB of channels). One rmcp would
/// read differently (an Accept with a quality weight) still goes through rmcp: both streams
/// must say the same, message for message. A listen past the limits is refused before anything
/// is acknowledged (rmcp acknowledges first, then ends it with the error).
#[tokio::test]
async fn a_listen_is_answered_alike_on_the_direct_path_and_through_rmcp() {
    let ns = setup("gwlisten", &[("first", "first", 60)]).await;
    let mut options = Options::default();
    options.settings.limits.max_streams_per_user = 2;
    let gw = Gateway::start(std::slice::from_ref(&ns), options).await;
    let uri = "toolyard://tasks/task-000000000000/result";
    let mut direct = raw_listen(&gw, "application/json, text/event-stream", uri).await;
    let mut rmcp = raw_listen(&gw, "application/json, text/event-stream;q=1", uri).await;
    let acknowledged = direct.next().await;
    assert_eq!(acknowledged["method"], "notifications/subscriptions/acknowledged", "{acknowledged}");
    assert_eq!(acknowledged["params"]["notifications"]["toolsListChanged"], true, "{acknowledged}");
    assert_eq!(acknowledged["params"]["notifications"]["resourceSubscriptions"], json!([uri]), "{acknowledged}");
    assert_eq!(acknowledged["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], "watch-1");
    assert_eq!(rmcp.next().await, acknowledged, "rmcp acknowledges the same");

    let refused = send_listen(&gw, "application/json, text/event-stream", uri).await;
    assert_eq!(refused.headers()["content-type"], "application/json");
    let refused: Value = refused.json().await.expect("a JSON-RPC error");
    assert_eq!(refused["id"], "watch-1", "{refused}");
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("too many open subscriptions/listen streams for this user"), "{refused}");

    create_tool(&ns, "second", spec("second", 60), true).await;
    let changed = tokio::time::timeout(Duration::from_secs(20), direct.next()).await.expect("notified in time");
    assert_eq!(changed["method"], "notifications/tools/list_changed", "{changed}");
    assert_eq!(changed["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], "watch-1", "{changed}");
    let through_rmcp = tokio::time::timeout(Duration::from_secs(20), rmcp.next()).await.expect("notified in time");
    assert_eq!(through_rmcp, changed, "rmcp notifies the same");

    // The gateway stops: each stream ends with the listen request's result.
    gw.tokens.trigger.cancel();
    let end = tokio::time::timeout(Duration::from_secs(20), direct.next()).await.expect("ended in time");
    assert_eq!(end["id"], "watch-1", "{end}");
    assert_eq!(end["result"]["resultType"], "complete", "{end}");
    assert_eq!(end["result"]["_meta"]["io.modelcontextprotocol/subscriptionId"], "watch-1", "{end}");
    let through_rmcp = tokio::time::timeout(Duration::from_secs(20), rmcp.next()).await.expect("ended in time");
    assert_eq!(through_rmcp, end, "rmcp ends the same");
}

#[tokio::test]
async fn both_protocol_revisions_list_and_call() {
    let ns = setup("gwproto", &[("echo", "echo", 60)]).await;
    let gw = Gateway::start(std::slice::from_ref(&ns), Options::default()).await;
    let _platform = FakePlatform::start(&ns, &gw.internal).await;
    for (mode, version) in [
        (ClientLifecycleMode::Initialize, ProtocolVersion::V_2025_11_25),
        (
            ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] },
            ProtocolVersion::V_2026_07_28,
        ),
    ] {
        let client = gw.client_at(&gw.mcp_url(), User::Alice, mode).await;
        assert_eq!(client.peer_info().map(|i| i.protocol_version.clone()), Some(version.clone()));
        assert_eq!(Gateway::listed(&client).await, ["echo"], "{version:?}");
        let r = client.call_tool(call("echo", json!({"x": 7}))).await.expect("call");
        assert_eq!(r.structured_content, Some(json!({"echo": {"x": 7}})), "{version:?}");
        // Both revisions can receive change notifications: a 2026-07-28 client through
        // subscriptions/listen, a 2025-11-25 client on its session's GET stream.
        let modern = version == ProtocolVersion::V_2026_07_28;
        let capabilities = client.peer_info().map(|i| i.capabilities.clone()).expect("server info");
        assert_eq!(capabilities.tools.and_then(|t| t.list_changed), Some(true), "{version:?}");
        assert_eq!(capabilities.resources.as_ref().and_then(|r| r.subscribe), Some(true), "{version:?}");
        assert_eq!(capabilities.resources.and_then(|r| r.list_changed), None, "never sent: {version:?}");
        // An unknown resource names its URI in `data`: -32602 from 2026-07-28 (SEP-2164).
        let uri = "toolyard://tasks/task-000000000000/result";
        match client.read_resource(rmcp::model::ReadResourceRequestParams::new(uri)).await {
            Err(rmcp::ServiceError::McpError(e)) => {
                let code = if modern { -32602 } else { -32002 };
                assert_eq!((e.code.0, e.data), (code, Some(json!({"uri": uri}))), "{version:?}");
            }
            other => panic!("{version:?}: {other:?}"),
        }
        client.cancel().await.ok();
    }
}

#[tokio::test]
async fn large_catalogs_are_paginated_and_toolsets_have_their_own_endpoint() {
    let env = TestEnv::get();
    env.install_crds().await.expect("CRDs");
    let ns = env.namespace("gwpage").await.expect("namespace");
    grant_platform(&ns).await;
    for i in 0..5 {
        let mut s = spec(&format!("tool_{i}"), 60);
        if i % 2 == 0 {
            s["toolset"] = json!("even");
        }
        create_tool(&ns, &format!("tool-{i}"), s, true).await;
    }
    grant_call(&ns, "alice-calls", &[], &["alice"], &[]).await;
    gateway_support::wait_allowed("alice", &[], &ns, "toolyard.dev", "mcptools", "call", Some("x")).await;
    let mut options = Options::default();
    options.settings.page_size = 2;
    let gw = Gateway::start(std::slice::from_ref(&ns), options).await;
    let client = gw.client(User::Alice).await;
    let first = client.list_tools(None).await.expect("first page");
    assert_eq!(first.tools.len(), 2);
    assert!(first.next_cursor.is_some());
    assert_eq!(Gateway::listed(&client).await, ["tool_0", "tool_1", "tool_2", "tool_3", "tool_4"]);

    let toolset =
        gw.client_at(&format!("{}/toolsets/even/mcp", gw.base), User::Alice, ClientLifecycleMode::Initialize).await;
    assert_eq!(Gateway::listed(&toolset).await, ["tool_0", "tool_2", "tool_4"]);
    let e = toolset.call_tool(call("tool_1", json!({"x": 1}))).await.expect_err("not in this toolset");
    assert!(format!("{e:?}").contains("Unknown tool"), "{e:?}");
    let bad = toolset
        .list_tools(Some(rmcp::model::PaginatedRequestParams::default().with_cursor(Some("garbage".into()))))
        .await
        .expect_err("bad cursor");
    assert!(format!("{bad:?}").contains("invalid cursor"), "{bad:?}");
    client.cancel().await.ok();
    toolset.cancel().await.ok();
}

#[tokio::test]
async fn a_user_over_the_call_limit_gets_server_busy() {
    let ns = setup("gwbusy", &[("held", "held", 300)]).await;
    let mut options = Options::default();
    options.settings.limits.max_calls_per_user = 1;
    let gw = Gateway::start(std::slice::from_ref(&ns), options).await;
    let mut platform = FakePlatform::start(&ns, &gw.internal).await;
    let release = Arc::new(Notify::new());
    platform.set("held", Behaviour::HoldThenEcho(release.clone()));
    let client = Arc::new(gw.client(User::Alice).await);
    let first = {
        let client = client.clone();
        tokio::spawn(async move { client.call_tool(call("held", json!({"x": 1}))).await })
    };
    platform.next().await;
    let e = client.call_tool(call("held", json!({"x": 2}))).await.expect_err("busy");
    match e {
        rmcp::ServiceError::McpError(e) => {
            assert_eq!(e.code, toolyard_gateway::mcp::errors::SERVER_BUSY);
            assert!(e.message.starts_with("server busy"), "{}", e.message);
        }
        other => panic!("expected a JSON-RPC error, got {other:?}"),
    }
    // bob is not affected by alice's limit.
    grant_call(&ns, "bob-calls", &["held"], &["bob"], &[]).await;
    gateway_support::wait_allowed("bob", &[], &ns, "toolyard.dev", "mcptools", "call", Some("held")).await;
    release.notify_one();
    let r = first.await.expect("join").expect("first call");
    assert_eq!(r.is_error, Some(false));
    // The slot is free again.
    let bob = gw.client(User::Bob).await;
    let second = tokio::spawn(async move { bob.call_tool(call("held", json!({"x": 3}))).await });
    platform.next().await;
    release.notify_one();
    assert_eq!(second.await.expect("join").expect("bob's call").is_error, Some(false));
    let metrics = reqwest::get(format!("{}/metrics", gw.base)).await.expect("metrics").text().await.expect("text");
    assert!(metrics.contains("toolyard_gateway_admission_rejections_total{reason=\"user_calls\"} 1"), "{metrics}");
    assert!(metrics.contains("toolyard_gateway_tool_calls_total{tool=\"held\",outcome=\"busy\"} 1"), "{metrics}");
    assert!(metrics.contains("toolyard_gateway_tool_calls_total{tool=\"held\",outcome=\"success\"} 2"), "{metrics}");
}

/// The per-user call limit holds across gateway replicas: each counts the user's unfinished
/// ToolCalls that the others started, from the shared ToolCall watch.
#[tokio::test]
async fn the_per_user_call_limit_holds_across_two_replicas() {
    let ns = setup("gwreplicas", &[("held", "held", 300)]).await;
    let mut options = Options::default();
    options.settings.limits.max_calls_per_user = 1;
    let a = Gateway::start(std::slice::from_ref(&ns), options.clone()).await;
    let b = Gateway::start(std::slice::from_ref(&ns), options).await;
    let mut platform = FakePlatform::start(&ns, &a.internal).await;
    let release = Arc::new(Notify::new());
    platform.set("held", Behaviour::HoldThenEcho(release.clone()));
    let on_a = Arc::new(a.client(User::Alice).await);
    let first = {
        let client = on_a.clone();
        tokio::spawn(async move { client.call_tool(call("held", json!({"x": 1}))).await })
    };
    let owner = platform.next().await.call.spec.owner;
    let alice = OwnerKey::derive(&owner.issuer, &owner.user);
    gateway_support::wait_running_elsewhere(&b, &alice, 1, "replica b sees alice's call on a").await.expect("watch");
    let on_b = b.client(User::Alice).await;
    match on_b.call_tool(call("held", json!({"x": 2}))).await.expect_err("busy on the other replica") {
        rmcp::ServiceError::McpError(e) => {
            assert_eq!(e.code, toolyard_gateway::mcp::errors::SERVER_BUSY);
            assert!(e.message.contains("too many concurrent calls for this user"), "{}", e.message);
        }
        other => panic!("expected a JSON-RPC error, got {other:?}"),
    }
    release.notify_one();
    assert_eq!(first.await.expect("join").expect("first call").is_error, Some(false));
    gateway_support::wait_running_elsewhere(&b, &alice, 0, "replica b sees the call finish").await.expect("watch");
    let second = tokio::spawn(async move { on_b.call_tool(call("held", json!({"x": 3}))).await });
    platform.next().await;
    release.notify_one();
    assert_eq!(second.await.expect("join").expect("the call on b").is_error, Some(false));
}

/// The per-user limit on running coding tasks holds across gateway replicas: each counts the
/// user's unfinished CodingTasks, whichever replica created them.
#[tokio::test]
async fn the_per_user_task_limit_holds_across_two_replicas() {
    let ns = setup("gwtasklimit", &[]).await;
    grant_tasks(&ns, "alice").await;
    gateway_support::wait_allowed("alice", &[], &ns, "toolyard.dev", "modelprofiles", "use", Some("default")).await;
    let mut options = Options::default();
    options.settings.limits.max_tasks_per_user = 1;
    let a = Gateway::start(std::slice::from_ref(&ns), options.clone()).await;
    let b = Gateway::start(std::slice::from_ref(&ns), options).await;
    let task = |prompt: &str| call("run_coding_task", json!({"task": prompt}));

    // Nothing runs the task here, so the call waits; its CodingTask counts from creation on.
    let on_a = a.client(User::Alice).await;
    let first = tokio::spawn(async move { on_a.call_tool(task("first")).await });
    let tasks: Api<toolyard_api::CodingTask> = Api::namespaced(TestEnv::get().client(User::Admin).await, &ns);
    wait_until(Duration::from_secs(30), "the first CodingTask", || {
        let tasks = tasks.clone();
        async move { Ok(!tasks.list(&Default::default()).await?.items.is_empty()) }
    })
    .await
    .expect("created");
    let created = tasks.list(&Default::default()).await.expect("list").items;
    let owner = &created[0].spec.owner;
    let alice = OwnerKey::derive(&owner.issuer, &owner.user);
    let backend_b = b.state.tasks.clone().expect("task backend");
    wait_until(Duration::from_secs(30), "replica b sees the task", || {
        let backend_b = backend_b.clone();
        let alice = alice.clone();
        async move { Ok(backend_b.running_of(&alice).await? == 1) }
    })
    .await
    .expect("watch");

    let on_b = b.client(User::Alice).await;
    match on_b.call_tool(task("second")).await.expect_err("busy on the other replica") {
        rmcp::ServiceError::McpError(e) => {
            assert_eq!(e.code, toolyard_gateway::mcp::errors::SERVER_BUSY);
            assert!(e.message.contains("too many running coding tasks for this user"), "{}", e.message);
        }
        other => panic!("expected a JSON-RPC error, got {other:?}"),
    }
    assert_eq!(tasks.list(&Default::default()).await.expect("list").items.len(), 1, "no second CodingTask");
    let metrics = reqwest::get(format!("{}/metrics", b.base)).await.expect("metrics").text().await.expect("text");
    assert!(metrics.contains("toolyard_gateway_admission_rejections_total{reason=\"user_tasks\"} 1"), "{metrics}");
    first.abort();
}

/// An agent's tool calls go through the same call service as the owner's MCP calls: they
/// count against the owner's limit and in the call metrics.
#[tokio::test]
async fn a_coding_tasks_tool_calls_count_against_its_owners_limit() {
    let ns = setup("gwtaskbusy", &[("held", "held", 300)]).await;
    let mut options = Options::default();
    options.settings.limits.max_calls_per_user = 1;
    let gw = Gateway::start(std::slice::from_ref(&ns), options).await;
    let mut platform = FakePlatform::start(&ns, &gw.internal).await;
    let release = Arc::new(Notify::new());
    platform.set("held", Behaviour::HoldThenEcho(release.clone()));
    let client = Arc::new(gw.client(User::Alice).await);
    let first = {
        let client = client.clone();
        tokio::spawn(async move { client.call_tool(call("held", json!({"x": 1}))).await })
    };
    // Alice's call holds her one slot; a task of hers asks for another call.
    let owner = platform.next().await.call.spec.owner;
    let (task, token) = task_of(&gw, &ns, &owner).await;
    let agent_call = |x: i64| {
        let url = format!("{}/internal/v1/tasks/{}/tools/held/call", gw.internal, task.id);
        let token = token.clone();
        async move {
            let response = reqwest::Client::new()
                .post(url)
                .bearer_auth(token)
                .json(&json!({"arguments": {"x": x}}))
                .send()
                .await
                .expect("agent call");
            assert_eq!(response.status(), 200);
            response.json::<ToolOutcome>().await.expect("a tool outcome")
        }
    };
    let busy = agent_call(2).await;
    assert!(busy.is_error && busy.text.starts_with("server busy"), "{busy:?}");
    assert_eq!(busy.call_id, None, "nothing ran");

    release.notify_one();
    assert_eq!(first.await.expect("join").expect("first call").is_error, Some(false));
    // With the slot free, the agent's call runs as alice, naming its task.
    let second = tokio::spawn(agent_call(3));
    let seen = platform.next().await;
    assert_eq!(seen.call.spec.owner, owner);
    assert_eq!(seen.input, json!({"x": 3}));
    release.notify_one();
    let done = second.await.expect("join");
    assert!(!done.is_error, "{done:?}");
    let metrics = reqwest::get(format!("{}/metrics", gw.base)).await.expect("metrics").text().await.expect("text");
    assert!(metrics.contains("toolyard_gateway_admission_rejections_total{reason=\"user_calls\"} 1"), "{metrics}");
    assert!(metrics.contains("toolyard_gateway_tool_calls_total{tool=\"held\",outcome=\"busy\"} 1"), "{metrics}");
    assert!(metrics.contains("toolyard_gateway_tool_calls_total{tool=\"held\",outcome=\"success\"} 2"), "{metrics}");
}

/// A task's artifacts are capped in number and in bytes; replacing one is always possible
/// within the byte cap.
#[tokio::test]
async fn a_tasks_artifacts_are_capped_in_number_and_bytes() {
    let ns = setup("gwartifacts", &[]).await;
    let mut options = Options::default();
    options.internal_limits.task_outputs = 2;
    options.internal_limits.task_output_bytes = 100;
    let gw = Gateway::start(std::slice::from_ref(&ns), options).await;
    let owner = toolyard_api::Owner { issuer: "apikey".into(), user: "alice".into(), groups: vec![] };
    let (task, token) = task_of(&gw, &ns, &owner).await;
    let put = |name: &str, bytes: usize| {
        let request = reqwest::Client::new()
            .put(format!("{}{}", gw.internal, toolyard_api::protocol::path::task_output(task.id.as_str(), name)))
            .bearer_auth(&token)
            .body(vec![b'x'; bytes]);
        async move {
            let response = request.send().await.expect("put");
            (response.status().as_u16(), response.text().await.expect("text"))
        }
    };
    assert_eq!(put("a.txt", 40).await.0, 204);
    assert_eq!(put("b.txt", 40).await.0, 204);
    let (status, body) = put("c.txt", 1).await;
    assert_eq!(status, 413, "{body}");
    assert!(body.contains("keeps 2 artifacts"), "{body}");
    assert_eq!(put("b.txt", 60).await.0, 204, "replacing one is not one more");
    let (status, body) = put("a.txt", 41).await;
    assert_eq!(status, 413, "{body}");
    assert!(body.contains("more than the 100 a task may keep"), "{body}");
    let files = gw.store.list(&owner.key(), &format!("tasks/{}/outputs/", task.id)).await.expect("list");
    assert_eq!(files.iter().map(|f| f.size).collect::<Vec<_>>(), [40, 60], "{files:?}");
}

/// A client without the tasks extension runs a long call without holding a request open:
/// `start_call` answers with the call's id once its ToolCall exists, `get_call_result` follows
/// it to the tool's answer, `cancel_call` asks a running one to stop. Another user's call id
/// is unknown; refusals answer as a plain call's would.
#[tokio::test]
async fn a_started_call_is_followed_to_its_result_and_cancelled_by_id() {
    let ns = setup("gwstart", &[("held", "held", 300)]).await;
    grant_call(&ns, "bob-calls", &[], &["bob"], &[]).await;
    gateway_support::wait_allowed("bob", &[], &ns, "toolyard.dev", "mcptools", "call", Some("held")).await;
    let gw = Gateway::start(std::slice::from_ref(&ns), Options::default()).await;
    let mut platform = FakePlatform::start(&ns, &gw.internal).await;
    let release = Arc::new(Notify::new());
    platform.set("held", Behaviour::HoldThenEcho(release.clone()));
    let alice = gw.client(User::Alice).await;
    let bob = gw.client(User::Bob).await;
    let state = |r: rmcp::model::CallToolResult| {
        assert_ne!(r.is_error, Some(true), "{}", text_of(&r));
        r.structured_content.expect("structured")
    };

    let started = state(
        alice.call_tool(call("start_call", json!({"tool": "held", "arguments": {"x": 1}}))).await.expect("start_call"),
    );
    assert_eq!(started["status"], "running", "{started}");
    let id = started["call_id"].as_str().expect("call_id").to_owned();
    assert_eq!(platform.next().await.call.metadata.name.as_deref(), Some(id.as_str()), "its ToolCall");
    let follow = |id: &str| call("get_call_result", json!({"call_id": id}));
    assert_eq!(state(alice.call_tool(follow(&id)).await.expect("get_call_result"))["status"], "running");
    let unknown = bob.call_tool(follow(&id)).await.expect("bob's get_call_result");
    assert_eq!(text_of(&unknown), format!("no such call: {id:?}"), "another user's call is unknown to bob");
    release.notify_one();
    let mut done = Value::Null;
    for _ in 0..300 {
        done = state(alice.call_tool(follow(&id)).await.expect("get_call_result"));
        if done["status"] != "running" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["structuredContent"], json!({"echo": {"x": 1}}), "{done}");
    assert_eq!(done["result"]["_meta"][toolyard_gateway::mcp::CALL_ID_META], json!(id), "{done}");

    // cancel_call: the running call's ToolCall is asked to stop; an ended one is left alone.
    let second = state(
        alice.call_tool(call("start_call", json!({"tool": "held", "arguments": {"x": 2}}))).await.expect("start_call"),
    );
    let second = second["call_id"].as_str().expect("call_id").to_owned();
    platform.next().await;
    let cancelled = state(alice.call_tool(call("cancel_call", json!({"call_id": second}))).await.expect("cancel_call"));
    assert_eq!((&cancelled["status"], &cancelled["cancel_requested"]), (&json!("running"), &json!(true)));
    let calls: Api<ToolCall> = Api::namespaced(TestEnv::get().client(User::Admin).await, &ns);
    wait_until(Duration::from_secs(30), "the ToolCall to be cancel-requested", || {
        let (calls, second) = (calls.clone(), second.clone());
        async move { Ok(calls.get(&second).await?.spec.cancel_requested) }
    })
    .await
    .expect("cancel requested");
    let ended = state(alice.call_tool(call("cancel_call", json!({"call_id": id}))).await.expect("cancel_call"));
    assert_eq!((&ended["status"], &ended["cancel_requested"]), (&json!("completed"), &json!(false)));

    // Refusals: bad arguments as a tool error, a tool alice may not call (or a built-in) as
    // unknown, bob's start_call of nothing he may call likewise.
    let invalid = alice
        .call_tool(call("start_call", json!({"tool": "held", "arguments": {"x": "one"}})))
        .await
        .expect("start_call");
    assert_eq!(invalid.is_error, Some(true), "{}", text_of(&invalid));
    assert!(text_of(&invalid).contains("invalid arguments"), "{}", text_of(&invalid));
    for tool in ["no_such_tool", "start_call", "delete_call"] {
        match alice.call_tool(call("start_call", json!({"tool": tool}))).await {
            Err(rmcp::ServiceError::McpError(e)) => assert_eq!(e.message, format!("Unknown tool: {tool:?}")),
            other => panic!("{tool}: {other:?}"),
        }
    }
    release.notify_one();
}

/// A user deletes their own finished calls and tasks: the ToolCall or CodingTask and every
/// stored file. A running one is refused; another user's, or an unknown id, reads as no such
/// call or task.
#[tokio::test]
async fn users_delete_their_own_finished_calls_and_tasks() {
    let ns = setup("gwdelete", &[("held", "held", 300)]).await;
    grant_call(&ns, "bob-calls", &[], &["bob"], &[]).await;
    grant_tasks(&ns, "alice").await;
    gateway_support::wait_allowed("alice", &[], &ns, "toolyard.dev", "codingtasks", "create", None).await;
    gateway_support::wait_allowed("bob", &[], &ns, "toolyard.dev", "mcptools", "call", Some("held")).await;
    let gw = Gateway::start(std::slice::from_ref(&ns), Options::default()).await;
    let mut platform = FakePlatform::start(&ns, &gw.internal).await;
    let release = Arc::new(Notify::new());
    platform.set("held", Behaviour::HoldThenEcho(release.clone()));
    let alice = Arc::new(gw.client(User::Alice).await);
    let bob = gw.client(User::Bob).await;
    let ok = |r: &rmcp::model::CallToolResult| {
        assert_ne!(r.is_error, Some(true), "{}", text_of(r));
        r.structured_content.clone().expect("structured")
    };

    // A call: refused while it runs, then deleted with its ToolCall and files.
    let running = {
        let alice = alice.clone();
        tokio::spawn(async move { alice.call_tool(call("held", json!({"x": 1}))).await })
    };
    let seen = platform.next().await.call;
    let id = seen.metadata.name.clone().expect("name");
    let owner = seen.spec.owner.clone();
    let key = OwnerKey::derive(&owner.issuer, &owner.user);
    let r = alice.call_tool(call("delete_call", json!({"call_id": id}))).await.expect("delete_call");
    assert_eq!(r.is_error, Some(true));
    assert!(text_of(&r).contains("is still running"), "{}", text_of(&r));
    release.notify_one();
    let result = running.await.expect("join").expect("the call");
    assert_eq!(result.is_error, Some(false));
    let meta = result.meta.expect("the result's _meta");
    assert_eq!(meta.0.get(toolyard_gateway::mcp::CALL_ID_META), Some(&json!(id)), "the call id");
    let folder = format!("calls/{id}/");
    wait_until(Duration::from_secs(30), "the call to finish", || async {
        let finished = toolcalls(&ns).await.iter().any(|c| {
            c.metadata.name.as_deref() == Some(id.as_str())
                && c.status.as_ref().is_some_and(|s| toolyard_api::conditions::is_finished(&s.conditions))
        });
        Ok(finished)
    })
    .await
    .expect("finished");
    assert!(!gw.store.list(&key, &folder).await.expect("list").is_empty());
    let r = bob.call_tool(call("delete_call", json!({"call_id": id}))).await.expect("bob's delete_call");
    assert_eq!(text_of(&r), format!("no such call: {id:?}"), "another user's call is unknown to bob");
    assert!(toolcalls(&ns).await.iter().any(|c| c.metadata.name.as_deref() == Some(&id)), "bob deleted nothing");
    let deleted = ok(&alice.call_tool(call("delete_call", json!({"call_id": id}))).await.expect("delete_call"));
    assert_eq!(deleted["deleted"], true, "{deleted}");
    assert!(deleted["files"].as_u64().unwrap_or_default() >= 2, "input and result at least: {deleted}");
    assert!(gw.store.list(&key, &folder).await.expect("list").is_empty());
    assert!(!toolcalls(&ns).await.iter().any(|c| c.metadata.name.as_deref() == Some(&id)), "the ToolCall is gone");
    for unknown in [id.as_str(), "no-such-000000000000", "../x"] {
        let r = alice.call_tool(call("delete_call", json!({"call_id": unknown}))).await.expect("delete_call");
        assert_eq!(text_of(&r), format!("no such call: {unknown:?}"));
    }

    // A task: deleting it while it runs cancels it first (the controller, played here, stops
    // it), then deletes its CodingTask and files.
    let (task, _) = task_of(&gw, &ns, &owner).await;
    let id = task.id.to_string();
    gw.store
        .put(&key, &format!("tasks/{id}/outputs/scenarios.csv"), bytes::Bytes::from_static(b"spot,price\n"))
        .await
        .expect("an artifact");
    let deleting = {
        let alice = alice.clone();
        let id = id.clone();
        tokio::spawn(async move { alice.call_tool(call("delete_task", json!({"task_id": id}))).await })
    };
    let tasks: Api<toolyard_api::CodingTask> = Api::namespaced(TestEnv::get().client(User::Admin).await, &ns);
    wait_until(Duration::from_secs(30), "the running task to be cancelled", || {
        let tasks = tasks.clone();
        let id = id.clone();
        async move { Ok(tasks.get(&id).await?.spec.cancel_requested) }
    })
    .await
    .expect("cancel requested");
    let cancelled = json!({
        "apiVersion": "toolyard.dev/v1alpha1", "kind": "CodingTask",
        "status": {"conditions": [toolyard_api::conditions::failed(reason::CANCELLED, "cancelled on request", None)]}
    });
    tasks
        .patch_status(
            &id,
            &kube::api::PatchParams::apply(toolyard_api::CONTROLLER_MANAGER).force(),
            &kube::api::Patch::Apply(&cancelled),
        )
        .await
        .expect("the task stops");
    let deleted = ok(&deleting.await.expect("join").expect("delete_task"));
    assert_eq!(deleted["deleted"], true, "{deleted}");
    assert!(deleted["files"].as_u64().unwrap_or_default() >= 1, "{deleted}");
    assert!(gw.store.list(&key, &format!("tasks/{id}/")).await.expect("list").is_empty(), "no file is left");
    assert!(tasks.get_opt(&id).await.expect("get").is_none(), "the CodingTask is gone");
    let r = alice.call_tool(call("delete_task", json!({"task_id": id}))).await.expect("delete_task");
    assert_eq!(text_of(&r), format!("no such task: {id:?}"));
    let listed = ok(&alice.call_tool(call("list_tasks", json!({}))).await.expect("list_tasks"));
    assert!(!listed.to_string().contains(&id), "{listed}");
}

/// At the storage quota, calls and coding tasks are refused with what to do, on the cluster
/// backend and the S3 store. (Alice's files from other tests share the bucket, so the quota
/// is one byte and she is over it; the local mode's test shows a deletion making room.)
#[tokio::test]
async fn calls_and_tasks_at_the_storage_quota_are_refused() {
    let ns = setup("gwquota", &[("echo", "echo", 60)]).await;
    grant_tasks(&ns, "alice").await;
    gateway_support::wait_allowed("alice", &[], &ns, "toolyard.dev", "modelprofiles", "use", Some("default")).await;
    let mut options = Options::default();
    options.settings.limits.storage_quota_bytes = 1;
    let gw = Gateway::start(std::slice::from_ref(&ns), options).await;
    let _platform = FakePlatform::start(&ns, &gw.internal).await;
    let alice = gw.client(User::Alice).await;
    let key = OwnerKey::derive("kubernetes", "alice");
    gw.store.put(&key, "calls/earlier-000000000001/result.json", bytes::Bytes::from_static(b"{}")).await.expect("put");

    let refused = alice.call_tool(call("echo", json!({"x": 1}))).await.expect("an answer");
    assert_eq!(refused.is_error, Some(true));
    let text = text_of(&refused);
    assert!(
        text.starts_with("storage quota reached: your stored calls and tasks take ")
            && text.contains(" of your 1 bytes; delete the ones you no longer need (delete_call, delete_task)"),
        "{text}"
    );
    assert!(toolcalls(&ns).await.is_empty(), "nothing ran");
    let task = alice.call_tool(call("run_coding_task", json!({"task": "anything"}))).await.expect("an answer");
    assert_eq!((task.is_error, text_of(&task)), (Some(true), text), "the same for a coding task");
    let tasks: Api<toolyard_api::CodingTask> = Api::namespaced(TestEnv::get().client(User::Admin).await, &ns);
    assert!(tasks.list(&Default::default()).await.expect("list").items.is_empty(), "no CodingTask");
    let metrics = reqwest::get(format!("{}/metrics", gw.base)).await.expect("metrics").text().await.expect("text");
    assert!(metrics.contains("toolyard_gateway_admission_rejections_total{reason=\"storage_quota\"} 2"), "{metrics}");
}

/// A Job call's log is written by the executor (its first and last segments) and by the
/// runner through the internal API (the rest). On one replica both share what they know of the
/// log's tail, so no writer lists the log to find its next segment.
#[tokio::test]
async fn a_job_calls_log_is_written_by_executor_and_runner_without_listing_it() {
    let ns = setup("gwlog", &[("held", "held", 300)]).await;
    let store = Arc::new(CountingStore::new(gateway_support::s3_store().await));
    let gw =
        Gateway::start(std::slice::from_ref(&ns), Options { store: Some(store.clone()), ..Options::default() }).await;
    let mut platform = FakePlatform::start(&ns, &gw.internal).await;
    let release = Arc::new(Notify::new());
    platform.set("held", Behaviour::HoldThenEcho(release.clone()));
    let client = Arc::new(gw.client(User::Alice).await);
    let call_task = {
        let client = client.clone();
        tokio::spawn(async move { client.call_tool(call("held", json!({"x": 1}))).await })
    };
    // The call's first segment (`call_accepted`) is stored before its ToolCall exists.
    let seen = platform.next().await;
    let id = seen.call.metadata.name.clone().expect("name");
    let folder = format!("calls/{id}/events/");
    store.watch(folder.clone(), String::new());
    let claims = Claims {
        kind: RunKind::Call,
        ns: ns.clone(),
        id: id.clone(),
        owner: seen.call.spec.owner.clone(),
        exp: k8s_openapi::jiff::Timestamp::now().as_second() + 600,
    };
    let token = gateway_support::signing_key().sign(&claims);
    let http = reqwest::Client::new();
    for batch in [
        "{\"time\":\"2026-01-01T00:00:00Z\",\"type\":\"call_started\"}\n",
        "{\"time\":\"2026-01-01T00:00:01Z\",\"type\":\"call_progress\",\"data\":{\"fraction\":0.5}}\n",
    ] {
        let posted = http
            .post(format!("{}{}", gw.internal, path::events("calls", &id)))
            .bearer_auth(&token)
            .body(batch)
            .send()
            .await
            .expect("events");
        assert_eq!(posted.status(), reqwest::StatusCode::NO_CONTENT);
    }
    release.notify_one();
    let answered = call_task.await.expect("join").expect("the call");
    assert_eq!(answered.is_error, Some(false), "{}", text_of(&answered));

    let owner = seen.call.spec.owner.key();
    let last = format!("{folder}000004.jsonl");
    wait_until(Duration::from_secs(10), "the call's call_finished", || async {
        Ok(gw.store.get(&owner, &last).await?.is_some())
    })
    .await
    .expect("the fourth segment");
    let mut types = Vec::new();
    for n in 1..=4 {
        let segment = gw.store.get(&owner, &format!("{folder}{n:06}.jsonl")).await.expect("get").expect("segment");
        let event: Value = serde_json::from_slice(segment.trim_ascii()).expect("one event");
        types.push(event["type"].as_str().expect("type").to_owned());
    }
    assert_eq!(types, ["call_accepted", "call_started", "call_progress", "call_finished"]);
    assert_eq!(store.counts().0, 0, "no writer of the log listed it");
}

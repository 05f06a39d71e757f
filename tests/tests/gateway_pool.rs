//! Pool-mode tools through the gateway: the Kubernetes executor calls the warm pool named in
//! the McpTool's status — here the real `toolyard-runner serve` running the fixture tools as
//! local processes — with a call token signed by the pool's derived key, and stores input,
//! result and logs under the caller's prefix. No ToolCall is created for pool calls.

use crate::gateway_support;

use std::process::Stdio;

use gateway_support::{
    Gateway, Options, create_tool, grant_call, grant_platform, set_tool_status, signing_key, toolcalls,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use toolyard_api::OwnerKey;
use toolyard_api::protocol::CallResult;
use toolyard_api::protocol::pool::{self, PoolCallRequest, key_purpose};
use toolyard_api::token::{Claims, RunKind, SigningKey};
use toolyard_tests::local::{self, TempDir};
use toolyard_tests::{TestEnv, User, wait_until};

/// A running `toolyard-runner serve` for `function` of the misbehaving fixtures.
struct PoolServer {
    endpoint: String,
    _child: tokio::process::Child,
    _dir: TempDir,
}

async fn start_pool(key: &SigningKey, function: &str) -> PoolServer {
    start_pool_with(key, function, &[]).await
}

/// [`start_pool`] with more `toolyard-runner serve` flags.
async fn start_pool_with(key: &SigningKey, function: &str, flags: &[&str]) -> PoolServer {
    start_pool_on("127.0.0.1", key, function, flags).await
}

/// [`start_pool_with`] listening on `host`.
async fn start_pool_on(host: &str, key: &SigningKey, function: &str, flags: &[&str]) -> PoolServer {
    let dir = TempDir::new("gw-pool");
    let key_file = dir.path().join("pool.key");
    std::fs::write(&key_file, key.to_hex()).expect("key file");
    let mut child = tokio::process::Command::new(local::binary("toolyard-runner"))
        .args(["serve", "--host", host, "--port", "0", "--key-file"])
        .arg(&key_file)
        .args(flags)
        .arg("--")
        .args([local::python(), "-m".into(), "toolyard.run".into(), format!("misbehaving:{function}")])
        .env("PYTHONPATH", local::misbehaving_pythonpath())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("toolyard-runner serve starts");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let addr = loop {
        let line = lines.next_line().await.expect("read").expect("the pool server prints its address");
        if let Some(addr) = line.strip_prefix("listening on ") {
            break addr.trim().to_owned();
        }
    };
    PoolServer { endpoint: format!("http://{addr}"), _child: child, _dir: dir }
}

fn pool_spec(name: &str, properties: Value, required: &[&str]) -> Value {
    json!({
        "name": name,
        "description": format!("pool tool {name}"),
        "inputSchema": {"type": "object", "properties": properties, "required": required},
        "runtime": {"image": "registry.example/misbehaving:1", "command": ["python3", "-m", "toolyard.run"]},
        "execution": {"mode": "Pool", "timeoutSeconds": 30, "pool": {"replicas": 1, "concurrency": 1}}
    })
}

/// A call of `tool` (the fixtures' `hang`) for `seconds`.
fn sleep_for(tool: &str, seconds: f64) -> rmcp::model::CallToolRequestParams {
    let params = json!({"seconds": seconds}).as_object().expect("object").clone();
    rmcp::model::CallToolRequestParams::new(tool.to_owned()).with_arguments(params)
}

fn text_of(result: &rmcp::model::CallToolResult) -> String {
    result.content.iter().filter_map(|c| c.as_text().map(|t| t.text.clone())).collect::<Vec<_>>().join("\n")
}

#[tokio::test]
async fn pool_tools_are_called_on_their_warm_pool_and_their_files_are_stored() {
    let env = TestEnv::get();
    env.install_crds().await.expect("CRDs");
    let ns = env.namespace("gwpool").await.expect("namespace");
    grant_platform(&ns).await;
    let derived = |object: &str| signing_key().derive(&key_purpose(&ns, object));
    let echo = start_pool(&derived("echo-pool"), "echo").await;
    let noisy = start_pool(&derived("noisy-pool"), "noisy").await;
    let fail = start_pool(&derived("fail-pool"), "fail").await;
    let steps = start_pool(&derived("steps-pool"), "steps").await;
    let chart = start_pool(&derived("chart-pool"), "chart").await;
    // A pool holding some other pool's key: the gateway's token must not be accepted there.
    let stranger = start_pool(&derived("someone-else"), "echo").await;
    for (object, name, props, required, pool) in [
        ("echo-pool", "echo_pool", json!({"value": {}}), vec!["value"], &echo),
        ("noisy-pool", "noisy_pool", json!({"n": {"type": "integer"}}), vec!["n"], &noisy),
        ("fail-pool", "fail_pool", json!({"message": {"type": "string"}}), vec!["message"], &fail),
        ("steps-pool", "steps_pool", json!({"n": {"type": "integer"}, "pause": {"type": "number"}}), vec!["n"], &steps),
        ("chart-pool", "chart_pool", json!({"points": {"type": "integer"}}), vec![], &chart),
        ("wrong-key", "wrong_key", json!({"value": {}}), vec!["value"], &stranger),
    ] {
        create_tool(&ns, object, pool_spec(name, props, &required), true).await;
        set_tool_status(&ns, object, true, Some(&pool.endpoint)).await;
    }
    grant_call(&ns, "alice-calls", &[], &["alice"], &[]).await;
    gateway_support::wait_allowed("alice", &[], &ns, "toolyard.dev", "mcptools", "call", Some("echo-pool")).await;
    let gw = Gateway::start(std::slice::from_ref(&ns), Options::default()).await;
    let client = gw.client(User::Alice).await;
    let args = |v: Value| v.as_object().expect("object").clone();

    let r = client
        .call_tool(
            rmcp::model::CallToolRequestParams::new("echo_pool")
                .with_arguments(args(json!({"value": [1, {"a": null}]}))),
        )
        .await
        .expect("echo");
    assert_eq!(r.is_error, Some(false), "{r:?}");
    assert_eq!(r.structured_content, Some(json!({"value": [1, {"a": null}]})));

    let r = client
        .call_tool(rmcp::model::CallToolRequestParams::new("noisy_pool").with_arguments(args(json!({"n": 3}))))
        .await
        .expect("noisy");
    assert_eq!(r.structured_content, Some(json!({"n": 3})), "prints never corrupt the result");

    let r = client
        .call_tool(
            rmcp::model::CallToolRequestParams::new("fail_pool")
                .with_arguments(args(json!({"message": "no quotes today"}))),
        )
        .await
        .expect("fail");
    assert_eq!(r.is_error, Some(true));
    assert!(text_of(&r).contains("no quotes today"), "{}", text_of(&r));

    let e = client
        .call_tool(rmcp::model::CallToolRequestParams::new("wrong_key").with_arguments(args(json!({"value": 1}))))
        .await
        .expect_err("a pool with another key refuses the call");
    assert!(
        matches!(e, rmcp::ServiceError::McpError(ref d) if d.code == rmcp::model::ErrorCode::INTERNAL_ERROR),
        "{e:?}"
    );

    // Files under alice's prefix; no ToolCall objects.
    assert!(toolcalls(&ns).await.is_empty(), "pool calls create no ToolCall");
    let owner = OwnerKey::derive("kubernetes", "alice");
    // A pool call's files are written just after its answer.
    let recorded = |files: &[String]| {
        files.iter().find(|p| p.starts_with("calls/noisy-pool-") && p.ends_with("/result.json")).is_some_and(|r| {
            files.contains(&r.replace("/result.json", "/stdout.log"))
                && files.contains(&r.replace("/result.json", "/input.json"))
        })
    };
    let list = || async {
        Ok::<_, anyhow::Error>(
            gw.store.list(&owner, "calls/").await?.into_iter().map(|o| o.path).collect::<Vec<String>>(),
        )
    };
    toolyard_tests::wait_until(std::time::Duration::from_secs(10), "the noisy pool call's files", || async {
        Ok(recorded(&list().await?))
    })
    .await
    .expect("recorded");
    let files = list().await.expect("list");
    let noisy_call = files
        .iter()
        .find(|p| p.starts_with("calls/noisy-pool-") && p.ends_with("/stdout.log"))
        .unwrap_or_else(|| panic!("no stdout.log of noisy_pool in {files:?}"));
    let id = noisy_call.trim_start_matches("calls/").trim_end_matches("/stdout.log");
    let stdout = gw.store.get(&owner, noisy_call).await.expect("get").expect("stdout");
    assert!(String::from_utf8_lossy(&stdout).contains("stdout line 2"));
    let input = gw.store.get(&owner, &format!("calls/{id}/input.json")).await.expect("get").expect("input");
    assert_eq!(serde_json::from_slice::<Value>(&input).expect("json"), json!({"n": 3}));
    let result: CallResult =
        serde_json::from_slice(&gw.store.get(&owner, &format!("calls/{id}/result.json")).await.unwrap().unwrap())
            .unwrap();
    assert_eq!(result.value, Some(json!({"n": 3})));

    // A function's progress in a warm pool: the pool returns the reports with the answer (it
    // holds no credential for the internal API) and the gateway keeps them in the call's log,
    // between its accepted, started and finished events.
    let r = client
        .call_tool(
            rmcp::model::CallToolRequestParams::new("steps_pool").with_arguments(args(json!({"n": 2, "pause": 0.2}))),
        )
        .await
        .expect("steps");
    assert_eq!(r.structured_content, Some(json!({"n": 2})), "{}", text_of(&r));
    let segment = |files: &[String]| {
        files.iter().find(|p| p.starts_with("calls/steps-pool-") && p.ends_with("/events/000001.jsonl")).cloned()
    };
    toolyard_tests::wait_until(std::time::Duration::from_secs(10), "the pool call's events", || async {
        Ok(segment(&list().await?).is_some())
    })
    .await
    .expect("recorded");
    let path = segment(&list().await.expect("list")).expect("the events segment");
    let log = gw.store.get(&owner, &path).await.expect("get").expect("events");
    let events: Vec<Value> =
        String::from_utf8_lossy(&log).lines().map(|l| serde_json::from_str(l).expect("an event")).collect();
    let types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(
        types,
        ["call_accepted", "call_started", "call_progress", "call_progress", "call_finished"],
        "{events:?}"
    );
    assert_eq!(events[3]["data"], json!({"fraction": 1.0, "message": "step 2 of 2"}));
    assert_eq!(events[0]["data"], json!({"tool": "steps_pool", "mode": "Pool"}));

    // Returned files travel in the pool's answer; the gateway stores them as alice's before it
    // answers with the image and links to both.
    let r = client
        .call_tool(rmcp::model::CallToolRequestParams::new("chart_pool").with_arguments(args(json!({"points": 2}))))
        .await
        .expect("chart");
    assert_eq!(r.structured_content, Some(json!({"points": 2, "image": "chart.png", "table": "data/points.csv"})));
    assert_eq!(r.content.iter().filter(|c| c.as_image().is_some()).count(), 1, "{r:?}");
    let id = r.meta.as_ref().and_then(|m| m.0[toolyard_gateway::mcp::CALL_ID_META].as_str()).expect("call id");
    let csv = gw.store.get(&owner, &format!("calls/{id}/outputs/data/points.csv")).await.expect("get");
    assert_eq!(csv.as_deref(), Some(&b"x,y\n0,0\n1,1\n"[..]), "stored before the answer");
    let links = r.content.iter().filter_map(|c| c.as_resource_link()).count();
    assert_eq!(links, 2);
    client.cancel().await.ok();
}

/// The per-user call limit counts warm-pool calls on every replica. Pool calls create no
/// ToolCall, so each replica publishes its own in a Lease that the others watch.
#[tokio::test]
async fn the_per_user_call_limit_counts_pool_calls_on_every_replica() {
    let env = TestEnv::get();
    env.install_crds().await.expect("CRDs");
    let ns = env.namespace("gwpoolrep").await.expect("namespace");
    grant_platform(&ns).await;
    let derived = |object: &str| signing_key().derive(&key_purpose(&ns, object));
    let hang = start_pool(&derived("hang-pool"), "hang").await;
    let echo = start_pool(&derived("echo-pool"), "echo").await;
    for (object, name, props, pool) in [
        ("hang-pool", "hang_pool", json!({"seconds": {"type": "number"}}), &hang),
        ("echo-pool", "echo_pool", json!({"value": {}}), &echo),
    ] {
        create_tool(&ns, object, pool_spec(name, props, &[]), true).await;
        set_tool_status(&ns, object, true, Some(&pool.endpoint)).await;
    }
    grant_call(&ns, "alice-calls", &[], &["alice"], &[]).await;
    gateway_support::wait_allowed("alice", &[], &ns, "toolyard.dev", "mcptools", "call", Some("hang-pool")).await;
    let mut options = Options::default();
    options.settings.limits.max_calls_per_user = 1;
    let a = Gateway::start(std::slice::from_ref(&ns), options.clone()).await;
    let b = Gateway::start(std::slice::from_ref(&ns), options).await;
    let alice = OwnerKey::derive("kubernetes", "alice");

    // A call held in alice's warm pool through replica a (plain JSON-RPC, so that it can be
    // cancelled by its request id).
    let http = reqwest::Client::new();
    let post = |base: &str, body: Value| {
        http.post(format!("{base}/mcp"))
            .bearer_auth(env.token(User::Alice))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .body(body.to_string())
            .send()
    };
    let held = tokio::spawn(post(
        &a.base,
        json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
               "params": {"name": "hang_pool", "arguments": {"seconds": 600}}}),
    ));
    gateway_support::wait_running_elsewhere(&b, &alice, 1, "replica b sees alice's pool call on a")
        .await
        .expect("the load Lease");
    let on_b = b.client(User::Alice).await;
    let args = |v: Value| v.as_object().expect("object").clone();
    let echo_call = || rmcp::model::CallToolRequestParams::new("echo_pool").with_arguments(args(json!({"value": 1})));
    match on_b.call_tool(echo_call()).await.expect_err("busy on the other replica") {
        rmcp::ServiceError::McpError(e) => {
            assert_eq!(e.code, toolyard_gateway::mcp::errors::SERVER_BUSY);
            assert!(e.message.contains("too many concurrent calls for this user"), "{}", e.message);
        }
        other => panic!("expected a JSON-RPC error, got {other:?}"),
    }
    let cancelled =
        post(&a.base, json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 5}}))
            .await
            .expect("POST");
    assert_eq!(cancelled.status(), 202);
    let body = held.await.expect("join").expect("response").text().await.expect("body");
    assert!(body.contains("cancelled"), "{body}");
    gateway_support::wait_running_elsewhere(&b, &alice, 0, "replica b sees the pool call end")
        .await
        .expect("the load Lease");
    let r = on_b.call_tool(echo_call()).await.expect("the call on b");
    assert_eq!(r.structured_content, Some(json!({"value": 1})), "{}", text_of(&r));
    on_b.cancel().await.ok();
}

/// A warm pool's queue is fair between callers: a full queue (alice's two waiting calls) makes
/// room for bob's call by refusing alice's newest waiting one, and alice is told why, not only
/// that the pool is busy.
#[tokio::test]
async fn a_call_that_gives_its_place_in_a_full_pool_queue_to_another_callers_is_told_so() {
    let env = TestEnv::get();
    env.install_crds().await.expect("CRDs");
    let ns = env.namespace("gwpoolfair").await.expect("namespace");
    grant_platform(&ns).await;
    let key = signing_key().derive(&key_purpose(&ns, "hang-pool"));
    let pool = start_pool_with(&key, "hang", &["--concurrency", "1", "--queue", "2"]).await;
    create_tool(&ns, "hang-pool", pool_spec("hang_pool", json!({"seconds": {"type": "number"}}), &[]), true).await;
    set_tool_status(&ns, "hang-pool", true, Some(&pool.endpoint)).await;
    grant_call(&ns, "callers", &[], &["alice", "bob"], &[]).await;
    for user in ["alice", "bob"] {
        gateway_support::wait_allowed(user, &[], &ns, "toolyard.dev", "mcptools", "call", Some("hang-pool")).await;
    }
    let gw = Gateway::start(std::slice::from_ref(&ns), Options::default()).await;
    let (alice, bob) = (std::sync::Arc::new(gw.client(User::Alice).await), gw.client(User::Bob).await);
    let hang = |seconds: f64| sleep_for("hang_pool", seconds);
    let load = |running, waiting| local::wait_pool_load(&pool.endpoint, running, waiting);
    let spawn = |seconds: f64| {
        let alice = std::sync::Arc::clone(&alice);
        tokio::spawn(async move { alice.call_tool(hang(seconds)).await })
    };
    let holding = spawn(3.0);
    load(1, 0).await;
    let first = spawn(0.0);
    load(1, 1).await;
    let newest = spawn(0.0);
    load(1, 2).await;

    let bobs = tokio::spawn(async move { bob.call_tool(hang(0.0)).await.map(|r| (r, bob)) });
    match newest.await.expect("join").expect_err("alice's newest waiting call gives its place to bob's") {
        rmcp::ServiceError::McpError(e) => {
            assert_eq!(e.code, toolyard_gateway::mcp::errors::SERVER_BUSY, "{e:?}");
            assert!(e.message.contains("the tool's warm pool is at capacity"), "{}", e.message);
            assert!(e.message.contains("this one gave its place to another caller's"), "{}", e.message);
        }
        other => panic!("expected a JSON-RPC error, got {other:?}"),
    }
    let (answered, bob) = bobs.await.expect("join").expect("bob's call runs once the slot is free");
    assert_ne!(answered.is_error, Some(true), "{}", text_of(&answered));
    for call in [holding, first] {
        let answered = call.await.expect("join").expect("alice's other calls");
        assert_ne!(answered.is_error, Some(true), "{}", text_of(&answered));
    }
    bob.cancel().await.ok();
}

/// An EndpointSlice of pool Service `service`, as Kubernetes makes it for one ready pod
/// serving at `endpoint` (`http://<ip>:<port>`).
fn pool_slice(name: &str, service: &str, endpoint: &str) -> EndpointSlice {
    let addr: std::net::SocketAddr = endpoint.trim_start_matches("http://").parse().expect("pool address");
    serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/service-name": service,
            "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
            pool::COMPONENT_LABEL: pool::COMPONENT,
        }},
        "addressType": "IPv4",
        "ports": [{"name": pool::PORT_NAME, "port": addr.port(), "protocol": "TCP"}],
        "endpoints": [{"addresses": [addr.ip().to_string()], "conditions": {"ready": true}}],
    }))
    .expect("EndpointSlice")
}

/// Takes pool `endpoint`'s one slot with a call of its own for `seconds` (not through the
/// gateway, as another replica's call would).
fn occupy(endpoint: &str, key: &SigningKey, ns: &str, seconds: f64) -> tokio::task::JoinHandle<reqwest::StatusCode> {
    let owner = toolyard_api::Owner { issuer: "apikey".into(), user: "carol".into(), groups: vec![] };
    let exp = jiff::Timestamp::now().as_second() + 600;
    let token = key.sign(&Claims { kind: RunKind::Call, ns: ns.into(), id: "occupier".into(), owner, exp });
    let request = PoolCallRequest {
        id: "occupier".into(),
        arguments: json!({"seconds": seconds}).as_object().expect("object").clone(),
        timeout_ms: 30_000,
        traceparent: None,
        caller: None,
    };
    let url = format!("{endpoint}{}", pool::CALL_PATH);
    tokio::spawn(async move {
        let sent = reqwest::Client::new().post(url).bearer_auth(token).json(&request).send().await;
        sent.expect("the occupying call").status()
    })
}

#[tokio::test]
async fn pool_calls_go_to_the_pod_with_room_and_a_pod_that_refuses_passes_them_on() {
    let env = TestEnv::get();
    env.install_crds().await.expect("CRDs");
    let ns = env.namespace("gwpoolpods").await.expect("namespace");
    grant_platform(&ns).await;
    let key = signing_key().derive(&key_purpose(&ns, "hold"));
    // Two pods of one slot and no queue each, where the test cluster's pods would be: on the
    // host's address (an EndpointSlice may not list a loopback one).
    let host = env.host_ip().to_string();
    let flags = ["--concurrency", "1", "--queue", "0"];
    let (a, b) = (start_pool_on(&host, &key, "hang", &flags).await, start_pool_on(&host, &key, "hang", &flags).await);
    create_tool(&ns, "hold", pool_spec("hold", json!({"seconds": {"type": "number"}}), &[]), true).await;
    // Without the EndpointSlices, every call would go to this one pod.
    set_tool_status(&ns, "hold", true, Some(&a.endpoint)).await;
    let slices: Api<EndpointSlice> = Api::namespaced(env.client(User::Admin).await, &ns);
    let service = pool::service_name("hold");
    for (name, pod) in [("hold-pool-a", &a), ("hold-pool-b", &b)] {
        slices.create(&PostParams::default(), &pool_slice(name, &service, &pod.endpoint)).await.expect("EndpointSlice");
    }
    grant_call(&ns, "callers", &[], &["alice"], &[]).await;
    gateway_support::wait_allowed("alice", &[], &ns, "toolyard.dev", "mcptools", "call", Some("hold")).await;
    let gw = Gateway::start(std::slice::from_ref(&ns), Options::default()).await;
    let alice = std::sync::Arc::new(gw.client(User::Alice).await);
    let hold = |seconds: f64| sleep_for("hold", seconds);
    let spawn = |seconds: f64| {
        let alice = std::sync::Arc::clone(&alice);
        tokio::spawn(async move { alice.call_tool(hold(seconds)).await })
    };
    let answered = |r: Result<rmcp::model::CallToolResult, rmcp::ServiceError>| {
        let r = r.expect("answered");
        assert_ne!(r.is_error, Some(true), "{}", text_of(&r));
    };

    // Pod a busy with a call the gateway does not know of (another replica's, say). Once the
    // gateway has seen the pods (its watch may start after its first calls, which then go to
    // the status's endpoint, pod a, and are refused), calls are answered by pod b.
    let occupier = occupy(&a.endpoint, &key, &ns, 10.0);
    local::wait_pool_load(&a.endpoint, 1, 0).await;
    wait_until(std::time::Duration::from_secs(30), "a call answered while pod a is busy", || async {
        Ok(alice.call_tool(hold(0.0)).await.is_ok_and(|r| r.is_error != Some(true)))
    })
    .await
    .expect("the gateway reaches pod b");
    // To the gateway both pods are free, and it takes them in turn: of two calls, one tries pod
    // a first, which refuses it, and pod b runs it.
    for _ in 0..2 {
        answered(alice.call_tool(hold(0.0)).await);
    }
    assert!(!occupier.is_finished(), "pod a was busy throughout (else the calls above may have gone to it)");
    assert_eq!(occupier.await.expect("join"), reqwest::StatusCode::OK);

    // Two calls at once: one on each pod.
    let (first, second) = (spawn(2.0), spawn(2.0));
    local::wait_pool_load(&a.endpoint, 1, 0).await;
    local::wait_pool_load(&b.endpoint, 1, 0).await;
    // A third finds every pod full: refused as busy.
    match alice.call_tool(hold(0.0)).await.expect_err("no pod has room") {
        rmcp::ServiceError::McpError(e) => {
            assert_eq!(e.code, toolyard_gateway::mcp::errors::SERVER_BUSY, "{e:?}");
            assert!(e.message.contains("the tool's warm pool is at capacity"), "{}", e.message);
        }
        other => panic!("expected a JSON-RPC error, got {other:?}"),
    }
    answered(first.await.expect("join"));
    answered(second.await.expect("join"));
    drop(alice);
}

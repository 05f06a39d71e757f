//! End to end on the test cluster with nothing stubbed: an MCP client calls tools on the real
//! `toolyard-gateway serve`; the call becomes a ToolCall, the real controller makes a Job, the
//! real Job controller a pod, the test node runs the real runner in it (from the real
//! images), which reads the input and writes the result through the gateway's internal API
//! into the real S3 server.

use crate::coding_support;
use crate::e2e_support;

use std::time::Duration;

use e2e_support::Platform;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::api::events::v1::Event as KubeEvent;
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::api::{Api, ListParams, PostParams};
use rmcp::model::CallToolRequestParams;
use serde_json::{Value, json};
use toolyard_api::{McpTool, ToolCall};
use toolyard_tests::{TestEnv, User};

fn call(name: &str, arguments: Value) -> CallToolRequestParams {
    let Value::Object(map) = arguments else { panic!("arguments must be an object") };
    CallToolRequestParams::new(name.to_owned()).with_arguments(map)
}

fn text_of(result: &rmcp::model::CallToolResult) -> String {
    result.content.iter().filter_map(|c| c.as_text().map(|t| t.text.clone())).collect::<Vec<_>>().join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tool_calls_run_as_jobs_through_the_whole_platform() {
    let mut node = toolyard_tests::claim_node(toolyard_tests::NodeShare::Whole).await;
    let mut platform = Platform::start(&[]).await;
    node.empty_at_end(&platform.ns);
    node.empty_at_end(&platform.release_ns);
    platform.apply_tools("examples/pricing/tools.yaml").await;
    platform.apply_tools("tests/fixtures/misbehaving/tools.yaml").await;
    platform.apply_tools("tests/fixtures/echo/tools.yaml").await;
    // alice may call every tool through the chart's tool-caller role.
    platform.grant_tool_caller("alice");

    let alice = platform.client(User::Alice).await;
    let mut names = Vec::new();
    for _ in 0..100 {
        names = alice.list_all_tools().await.expect("tools/list").into_iter().map(|t| t.name.to_string()).collect();
        if names.iter().any(|n| n == "price_option") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(names.contains(&"price_option".to_owned()) && names.contains(&"fail".to_owned()), "{names:?}");

    // The textbook value, computed by the pricing library in a Job pod.
    let priced = alice
        .call_tool(call(
            "price_option",
            json!({"spot": 100, "strike": 100, "time_to_expiry": 1, "volatility": 0.2, "rate": 0.05}),
        ))
        .await
        .expect("tools/call");
    if priced.is_error == Some(true) {
        platform.dump_logs();
    }
    assert_ne!(priced.is_error, Some(true), "{}", text_of(&priced));
    let price = priced.structured_content.as_ref().and_then(|s| s["price"].as_f64()).expect("structured price");
    assert!((price - 10.4506).abs() < 1e-4, "{price}");

    // It really was a ToolCall and a Job, owned and finished as the contracts say.
    let env = TestEnv::get();
    let calls: Vec<ToolCall> = Api::<ToolCall>::namespaced(env.client(User::Admin).await, &platform.ns)
        .list(&Default::default())
        .await
        .unwrap()
        .items;
    let priced_call = calls.iter().find(|c| c.spec.tool == "price-option").expect("a ToolCall for price-option");
    assert_eq!(priced_call.spec.owner.user, "alice");
    let status = priced_call.status.as_ref().expect("status");
    assert!(toolyard_api::conditions::is_true(&status.conditions, toolyard_api::conditions::SUCCEEDED));
    assert_eq!(status.result.as_ref().map(|r| r.is_error), Some(false));
    let job_name = status.job_name.clone().expect("job name");
    let job = Api::<Job>::namespaced(env.client(User::Admin).await, &platform.ns).get(&job_name).await.expect("job");
    assert_eq!(job.spec.as_ref().and_then(|s| s.backoff_limit), Some(0));
    // Its pod ran in a namespace enforcing the restricted Pod Security Standard, and the
    // chart's NetworkPolicies apply to it as a run pod (DNS and the gateway's internal port
    // only; agents reach their model through the gateway too).
    let pods = Api::<Pod>::namespaced(env.client(User::Admin).await, &platform.ns)
        .list(&ListParams::default().labels(&format!("job-name={job_name}")))
        .await
        .expect("pods")
        .items;
    let labels = pods.first().and_then(|p| p.metadata.labels.clone()).expect("the call's pod");
    assert!(platform.policy_selects("runs", &labels), "{labels:?}");

    // The statically linked runner runs in each kind of tool image: Debian with Python,
    // distroless (glibc as a library, no shell) and busybox (no libc at all); the tool runs
    // as the non-root UID the pod sets.
    for tool in ["echo_debian", "echo_distroless", "echo_busybox"] {
        let echoed = alice.call_tool(call(tool, json!({"x": 1, "tool": tool}))).await.expect("tools/call");
        assert_ne!(echoed.is_error, Some(true), "{tool}: {}", text_of(&echoed));
        assert_eq!(
            echoed.structured_content,
            Some(json!({"echo": {"x": 1, "tool": tool}, "uid": 65532})),
            "{tool}: {}",
            text_of(&echoed)
        );
    }

    // A function that raises: the tool's own message, as a tool error.
    let failed = alice.call_tool(call("fail", json!({"message": "no quotes today"}))).await.expect("tools/call");
    assert_eq!(failed.is_error, Some(true));
    assert!(text_of(&failed).contains("no quotes today"), "{}", text_of(&failed));

    // Noise on stdout does not corrupt the result.
    let noisy = alice.call_tool(call("noisy", json!({"n": 3}))).await.expect("tools/call");
    assert_eq!(noisy.structured_content.as_ref().map(|s| s["n"].clone()), Some(json!(3)), "{}", text_of(&noisy));

    // NaN is refused with a message that says so.
    let nan = alice.call_tool(call("nan", json!({}))).await.expect("tools/call");
    assert_eq!(nan.is_error, Some(true));
    assert!(text_of(&nan).contains("NaN"), "{}", text_of(&nan));

    // A Job-mode call from a client with the MCP tasks extension gets a task handle at once.
    // The call outlives the replica that started it (stopped as a rolling update stops a
    // pod), and tasks/get on another replica follows it to its result.
    let replica = platform.start_replica().await;
    let token = TestEnv::get().token(User::Alice).to_owned();
    let on_replica = coding_support::connect_with(platform.http(), &format!("{replica}/mcp"), &token, true).await;
    let started = on_replica.peer().call_tool_once(call("echo", json!({"value": "as a task"}))).await;
    let Ok(rmcp::model::CallToolResponse::Task(handle)) = started else {
        panic!("a tasks-extension client gets a task handle: {started:?}")
    };
    let id = handle.task.task_id.clone();
    // A client without the extension starts one with the start_call built-in.
    let plain = coding_support::connect_with(platform.http(), &format!("{replica}/mcp"), &token, false).await;
    let started = plain.call_tool(call("start_call", json!({"tool": "echo", "arguments": {"value": "started"}}))).await;
    let started = started.expect("start_call").structured_content.expect("structured");
    assert_eq!(started["status"], "running", "{started}");
    let started = started["call_id"].as_str().expect("call_id").to_owned();
    platform.stop_replicas().await;
    let on_main = coding_support::connect_with(platform.http(), &format!("{}/mcp", platform.base), &token, true).await;
    let Some(done) = coding_support::finished_task(&on_main, &id, Duration::from_secs(120)).await else {
        platform.dump_logs();
        panic!("the call task never completed")
    };
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["structuredContent"], json!({"value": "as a task"}), "{done}");
    assert_eq!(done["result"]["_meta"]["toolyard.dev/callId"], json!(id));
    let tool_call =
        Api::<ToolCall>::namespaced(env.client(User::Admin).await, &platform.ns).get(&id).await.expect("ToolCall");
    assert!(!tool_call.spec.cancel_requested, "stopping the replica did not cancel the call");
    let mut followed = Value::Null;
    for _ in 0..240 {
        let got = alice.call_tool(call("get_call_result", json!({"call_id": started}))).await.expect("get_call_result");
        followed = got.structured_content.expect("structured");
        if followed["status"] != "running" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(followed["status"], "completed", "{followed}");
    assert_eq!(followed["result"]["structuredContent"], json!({"value": "started"}), "{followed}");
    // Another user's task id is unknown to bob.
    let bob_token = TestEnv::get().token(User::Bob).to_owned();
    let bob = coding_support::connect_with(platform.http(), &format!("{}/mcp", platform.base), &bob_token, true).await;
    assert!(bob.peer().get_task(rmcp::model::GetTaskParams::new(id.clone())).await.is_err(), "bob cannot see it");

    // A function returns an image and a file from its Job's pod: the runner uploads them
    // through the internal API; the answer shows the image and links both, stored as alice's.
    let charted = alice.call_tool(call("chart", json!({"points": 2}))).await.expect("tools/call");
    assert_ne!(charted.is_error, Some(true), "{}", text_of(&charted));
    let images: Vec<_> = charted.content.iter().filter_map(|c| c.as_image()).collect();
    assert_eq!(images.iter().map(|i| i.mime_type.as_str()).collect::<Vec<_>>(), ["image/png"], "{charted:?}");
    let links: Vec<String> =
        charted.content.iter().filter_map(|c| c.as_resource_link()).map(|l| l.uri.clone()).collect();
    assert_eq!(links.len(), 2, "{links:?}");
    assert!(links[1].ends_with("/files/outputs/data/points.csv"), "{links:?}");
    let read =
        alice.read_resource(rmcp::model::ReadResourceRequestParams::new(&links[1])).await.expect("resources/read");
    match &read.contents[0] {
        rmcp::model::ResourceContents::TextResourceContents { text, .. } => assert_eq!(text, "x,y\n0,0\n1,1\n"),
        other => panic!("expected text, got {other:?}"),
    }

    // A hanging function ends at its deadline as a timeout.
    let hung = alice.call_tool(call("hang", json!({}))).await;
    let message = match hung {
        Ok(r) => {
            assert_eq!(r.is_error, Some(true));
            text_of(&r)
        }
        Err(e) => e.to_string(),
    };
    assert!(message.to_lowercase().contains("timed out") || message.to_lowercase().contains("deadline"), "{message}");

    // Invalid arguments: a clear error and no ToolCall.
    let before = Api::<ToolCall>::namespaced(env.client(User::Admin).await, &platform.ns)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .len();
    let invalid = alice.call_tool(call("price_option", json!({"spot": "a lot"}))).await;
    let message = match invalid {
        Ok(r) => text_of(&r),
        Err(e) => e.to_string(),
    };
    assert!(message.contains("spot"), "{message}");
    let after = Api::<ToolCall>::namespaced(env.client(User::Admin).await, &platform.ns)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .len();
    assert_eq!(before, after, "invalid arguments created a ToolCall");

    // bob may call nothing here: he lists nothing, and a call looks like an unknown tool.
    let bob = platform.client(User::Bob).await;
    assert!(bob.list_all_tools().await.expect("tools/list").is_empty());
    let bob_call = bob.call_tool(call("price_option", json!({"spot": 1}))).await;
    let unknown = alice.call_tool(call("no_such_tool", json!({}))).await;
    let describe = |r: Result<rmcp::model::CallToolResult, rmcp::ServiceError>| match r {
        Ok(r) => text_of(&r).replace("price_option", "X").replace("no_such_tool", "X"),
        Err(e) => e.to_string().replace("price_option", "X").replace("no_such_tool", "X"),
    };
    assert_eq!(describe(bob_call), describe(unknown));

    // A tool that asks for its caller gets the owner the gateway recorded on the ToolCall; the
    // same function under an McpTool that did not ask gets nothing.
    let who = alice.call_tool(call("whoami", json!({}))).await.expect("tools/call");
    let caller = who.structured_content.as_ref().map(|s| s["caller"].clone()).unwrap_or_default();
    assert_eq!((caller["issuer"].as_str(), caller["user"].as_str()), (Some("kubernetes"), Some("alice")), "{caller}");
    assert!(caller["groups"].as_array().is_some_and(|g| g.iter().any(|g| g == "quants")), "{caller}");
    let anonymous = alice.call_tool(call("whoami_anonymous", json!({}))).await.expect("tools/call");
    assert_eq!(anonymous.structured_content, Some(json!({"caller": null, "environment": false})));

    progress_and_call_events(&mut platform).await;
    placement_and_volumes(&platform).await;
    platform.stop().await;
}

/// An McpTool's placement (node selector, toleration, node affinity, runtime class) and
/// resources reach its call's pod on the node, and a ConfigMap mounted read-only is what the
/// function reads.
async fn placement_and_volumes(platform: &Platform) {
    let env = TestEnv::get();
    let admin = env.client(User::Admin).await;
    let ns = &platform.ns;
    let node = Api::<Node>::all(admin.clone()).list(&ListParams::default()).await.expect("nodes").items;
    let hostname = node
        .iter()
        .find_map(|n| n.metadata.labels.as_ref()?.get("kubernetes.io/hostname").cloned())
        .expect("a node with a hostname label");
    let handler: RuntimeClass = serde_json::from_value(json!({
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
        "metadata": {"name": "toolyard-test-runc"}, "handler": "runc"
    }))
    .expect("RuntimeClass");
    let classes = Api::<RuntimeClass>::all(admin.clone());
    if classes.get_opt("toolyard-test-runc").await.expect("get RuntimeClass").is_none() {
        classes.create(&PostParams::default(), &handler).await.expect("create RuntimeClass");
    }
    let rates: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "rates"}, "data": {"rates.json": "{\"eur\": 0.031, \"usd\": 0.045}"}
    }))
    .expect("ConfigMap");
    Api::<ConfigMap>::namespaced(admin.clone(), ns).create(&PostParams::default(), &rates).await.expect("ConfigMap");
    let tool: McpTool = serde_json::from_value(json!({
        "apiVersion": "toolyard.dev/v1alpha1", "kind": "McpTool",
        "metadata": {"name": "read-rates"},
        "spec": {
            "name": "read_rates", "description": "The reference rates from a mounted ConfigMap.",
            "inputSchema": {"type": "object"},
            "runtime": {
                "image": "ghcr.io/toolyard/test-misbehaving:0.1.0",
                "command": ["python3", "-c", "import json, os; json.dump(json.load(open('/data/rates/rates.json')), open(os.environ['TOOLYARD_RESULT_FILE'], 'w'))"],
                "resources": {"requests": {"cpu": "50m", "memory": "48Mi"}, "limits": {"memory": "96Mi"}},
                "volumes": [{"name": "rates", "mountPath": "/data/rates", "configMap": {"name": "rates"}}]
            },
            "placement": {
                "nodeSelector": {"kubernetes.io/hostname": hostname},
                "tolerations": [{"key": "toolyard.dev/dedicated", "operator": "Exists", "effect": "NoSchedule"}],
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]}]}}},
                "runtimeClassName": "toolyard-test-runc"
            }
        }
    }))
    .expect("McpTool");
    Api::<McpTool>::namespaced(admin.clone(), ns).create(&PostParams::default(), &tool).await.expect("McpTool");

    let alice = platform.client(User::Alice).await;
    for _ in 0..100 {
        let names: Vec<String> =
            alice.list_all_tools().await.expect("tools/list").into_iter().map(|t| t.name.to_string()).collect();
        if names.iter().any(|n| n == "read_rates") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let read = alice.call_tool(call("read_rates", json!({}))).await.expect("tools/call");
    if read.is_error == Some(true) {
        platform.dump_logs();
    }
    assert_eq!(read.structured_content, Some(json!({"eur": 0.031, "usd": 0.045})), "{}", text_of(&read));

    let calls = Api::<ToolCall>::namespaced(admin.clone(), ns).list(&ListParams::default()).await.expect("calls").items;
    let job = calls
        .iter()
        .find(|c| c.spec.tool == "read-rates")
        .and_then(|c| c.status.as_ref()?.job_name.clone())
        .expect("the call's Job");
    let pods = Api::<Pod>::namespaced(admin, ns)
        .list(&ListParams::default().labels(&format!("job-name={job}")))
        .await
        .expect("pods")
        .items;
    let spec = pods.first().and_then(|p| p.spec.clone()).expect("the call's pod");
    assert_eq!(spec.node_selector.as_ref().and_then(|s| s.get("kubernetes.io/hostname")), Some(&hostname));
    assert!(spec.tolerations.iter().flatten().any(|t| t.key.as_deref() == Some("toolyard.dev/dedicated")));
    assert!(spec.affinity.as_ref().and_then(|a| a.node_affinity.as_ref()).is_some());
    assert_eq!(spec.runtime_class_name.as_deref(), Some("toolyard-test-runc"));
    let main = spec.containers.iter().find(|c| c.name != "install-runner").expect("the tool container");
    let requests = main.resources.as_ref().and_then(|r| r.requests.clone()).expect("requests");
    assert_eq!(requests["cpu"].0, "50m");
    let mount = main.volume_mounts.iter().flatten().find(|m| m.mount_path == "/data/rates").expect("the mount");
    assert_eq!(mount.read_only, Some(true));
}

/// A function's progress reports reach the client as `notifications/progress`, whichever
/// replica it called: the runner posts them to the internal API of the replica the
/// controller names, which passes them on at once; a second replica reads them from the
/// call's events in storage. The call's log in S3 holds accepted, started, progress and
/// finished; the ToolCall has its Kubernetes Events.
async fn progress_and_call_events(platform: &mut Platform) {
    let env = TestEnv::get();
    let token = env.token(User::Alice).to_owned();
    let replica = platform.start_replica().await;
    for (base, replica_name) in [(platform.base.clone(), "the runner's"), (replica, "another")] {
        let client = coding_support::connect_with(platform.http(), &format!("{base}/mcp"), &token, false).await;
        let result = coding_support::call(&client, "steps", json!({"n": 3, "pause": 1.5})).await;
        assert_eq!(coding_support::structured(&result), json!({"n": 3}), "{}", coding_support::text_of(&result));
        // Notifications are handled in tasks of their own: the last may land after the answer.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let progress = coding_support::progress_of(&client);
        if progress.is_empty() {
            platform.dump_logs();
            panic!("no progress through {replica_name} replica");
        }
        assert!(progress.windows(2).all(|w| w[1].progress > w[0].progress), "{progress:?}");
        for p in &progress {
            let step = (p.progress * 3.0).round();
            assert_eq!(p.message.as_deref(), Some(format!("step {step} of 3").as_str()), "{progress:?}");
            assert_eq!(p.total, Some(1.0));
        }
    }

    let admin = env.client(User::Admin).await;
    let calls: Vec<ToolCall> = Api::<ToolCall>::namespaced(admin.clone(), &platform.ns)
        .list(&Default::default())
        .await
        .expect("ToolCalls")
        .items;
    let steps: Vec<&ToolCall> = calls.iter().filter(|c| c.spec.tool == "steps").collect();
    assert_eq!(steps.len(), 2);
    let s3 = env.s3();
    let storage = toolyard_tests::s3::client(&s3, &s3.access_key, &s3.secret_key);
    let owner = steps[0].spec.owner.key();
    for call in steps {
        let id = call.metadata.name.clone().expect("name");
        let prefix = format!("owners/{owner}/calls/{id}/events/");
        let read_log = || async {
            let listed = storage.list_objects_v2().bucket(&s3.bucket).prefix(&prefix).send().await?;
            let mut keys: Vec<String> = listed.contents().iter().filter_map(|o| o.key().map(str::to_owned)).collect();
            keys.sort();
            let mut events = Vec::new();
            for key in keys {
                let object = storage.get_object().bucket(&s3.bucket).key(&key).send().await?;
                let bytes = object.body.collect().await?.into_bytes();
                for line in String::from_utf8_lossy(&bytes).lines() {
                    events.push(serde_json::from_str::<Value>(line)?);
                }
            }
            anyhow::Ok(events)
        };
        toolyard_tests::wait_until(Duration::from_secs(30), "the call_finished event", || async {
            Ok(read_log().await?.last().is_some_and(|e| e["type"] == "call_finished"))
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
        let events = read_log().await.expect("the call's events");
        let types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
        assert_eq!(types[..2], ["call_accepted", "call_started"], "{events:?}");
        assert_eq!(types.last(), Some(&"call_finished"), "{events:?}");
        assert!(types[2..types.len() - 1].iter().all(|t| *t == "call_progress") && types.len() > 3, "{types:?}");
        assert_eq!(events.last().expect("finished")["data"]["outcome"], "ok");

        // And its Kubernetes Events, on the ToolCall.
        let reasons = || async {
            let list = Api::<KubeEvent>::namespaced(admin.clone(), &platform.ns).list(&ListParams::default()).await?;
            let reasons: Vec<String> = list
                .items
                .into_iter()
                .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(id.as_str()))
                .filter_map(|e| e.reason)
                .collect();
            anyhow::Ok(reasons)
        };
        let expected = ["JobCreated", "Running", "Succeeded"];
        let recorded = toolyard_tests::wait_until(Duration::from_secs(30), "the ToolCall's events", || async {
            let reasons = reasons().await?;
            Ok(expected.iter().all(|r| reasons.iter().any(|got| got == r)))
        })
        .await;
        assert!(recorded.is_ok(), "events {expected:?} in {:?}", reasons().await);
    }
}

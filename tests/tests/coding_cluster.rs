//! Coding tasks on the test cluster with nothing stubbed but the LLM: MCP client → the real
//! `toolyard-gateway serve` → CodingTask → the real controller → Job → the test node runs
//! `toolyard-runner agent` (no model setting, no key: its model calls go through the gateway,
//! which holds the model profiles) → the agent's tool calls come back through the gateway's
//! internal API as ToolCalls → more Jobs → results in the real S3 server. The model is the
//! deterministic scripted server.

use crate::coding_support;
use crate::e2e_support;

use std::time::Duration;

use coding_support::{Client, MODEL_KEY, call, connect_with, ok, structured, text_of, wait_final};
use e2e_support::Platform;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::Api;
use serde_json::{Value, json};
use toolyard_api::{CodingTask, ToolCall};
use toolyard_tests::model_server::{Gate, ScriptedModel, Turn, wait_for_requests};
use toolyard_tests::{TestEnv, User, wait_until};

fn kubectl(ns: &str, args: &[&str]) {
    let mut all = vec!["-n", ns];
    all.extend_from_slice(args);
    TestEnv::get().kubectl_as(User::Admin, &all).unwrap_or_else(|e| panic!("kubectl {args:?}: {e:#}"));
}

/// `user` may call the pricing functions (not the misbehaving tools) and start coding tasks
/// with the model profiles `profiles` (RBAC verb `use` on `modelprofiles`).
fn grant(ns: &str, user: &str, profiles: &[&str]) {
    let role = format!("coding-{user}");
    kubectl(
        ns,
        &[
            "create",
            "role",
            &role,
            "--verb=call",
            "--resource=mcptools.toolyard.dev",
            "--resource-name=price-option",
            "--resource-name=calc-greeks",
        ],
    );
    kubectl(ns, &["create", "rolebinding", &role, &format!("--role={role}"), &format!("--user={user}")]);
    let tasks = format!("tasks-{user}");
    kubectl(ns, &["create", "role", &tasks, "--verb=create", "--resource=codingtasks.toolyard.dev"]);
    kubectl(ns, &["create", "rolebinding", &tasks, &format!("--role={tasks}"), &format!("--user={user}")]);
    if profiles.is_empty() {
        return;
    }
    // (`kubectl create role` refuses resources the apiserver does not serve; RBAC does not.)
    let models = format!("models-{user}");
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": models, "namespace": ns},
        "rules": [{"apiGroups": ["toolyard.dev"], "resources": ["modelprofiles"], "verbs": ["use"],
                   "resourceNames": profiles}]});
    let dir = toolyard_tests::local::TempDir::new("role");
    let file = dir.path().join("role.json");
    std::fs::write(&file, role.to_string()).expect("role");
    kubectl(ns, &["apply", "-f", file.to_str().expect("utf-8")]);
    kubectl(ns, &["create", "rolebinding", &models, &format!("--role={models}"), &format!("--user={user}")]);
}

/// The gateway's model profiles, as a file in `dir`: each (name, base URL, API key).
fn profiles_file(dir: &toolyard_tests::local::TempDir, profiles: &[(&str, &str, &str)]) -> String {
    let mut yaml = String::from("profiles:\n");
    for (name, url, key) in profiles {
        let key_file = dir.path().join(format!("{name}.key"));
        std::fs::write(&key_file, key).expect("key file");
        yaml.push_str(&format!(
            "  - name: {name}\n    baseUrl: {url}\n    model: {name}-model\n    apiKeyFile: {}\n",
            key_file.display()
        ));
    }
    if let Some((first, _, _)) = profiles.first() {
        yaml = format!("default: {first}\n{yaml}");
    }
    let file = dir.path().join("profiles.yaml");
    std::fs::write(&file, yaml).expect("profiles");
    file.display().to_string()
}

/// The platform with these model profiles (the first is the default), the pricing and the
/// misbehaving tools.
async fn start(dir: &toolyard_tests::local::TempDir, profiles: &[(&str, &str, &str)]) -> Platform {
    let file = profiles_file(dir, profiles);
    let platform = Platform::start(&[("TOOLYARD_MODEL_PROFILES", &file)]).await;
    platform.apply_tools("examples/pricing/tools.yaml").await;
    platform.apply_tools("tests/fixtures/misbehaving/tools.yaml").await;
    platform
}

async fn client(platform: &Platform, user: User) -> Client {
    connect_with(platform.http(), &format!("{}/mcp", platform.base), TestEnv::get().token(user), false).await
}

/// Starts `run_coding_task` in the background and returns the task id (the one task of
/// `user` that list_tasks shows and did not show before; an earlier task may still be listed
/// as running until the controller sees its Job end) and the waiting call.
async fn start_task(
    platform: &Platform,
    user: User,
    arguments: Value,
    model: &ScriptedModel,
    requests_before: usize,
) -> (String, tokio::task::JoinHandle<Value>) {
    let c = client(platform, user).await;
    let ids = |listed: &Value| -> Vec<String> {
        listed["tasks"]
            .as_array()
            .expect("tasks")
            .iter()
            .filter_map(|t| t["task_id"].as_str().map(str::to_owned))
            .collect()
    };
    let known = ids(&ok(&call(&c, "list_tasks", json!({"limit": 100})).await));
    let waiting = {
        let client = client(platform, user).await;
        tokio::spawn(async move { structured(&call(&client, "run_coding_task", arguments).await) })
    };
    wait_for_requests(model, requests_before + 1, Duration::from_secs(120)).await.expect("the agent asks the model");
    let listed = ok(&call(&c, "list_tasks", json!({"limit": 100})).await);
    let new: Vec<String> = ids(&listed).into_iter().filter(|id| !known.contains(id)).collect();
    assert_eq!(new.len(), 1, "one new task: {listed}");
    (new[0].clone(), waiting)
}

/// A platform of a test's own on half of the node, with the scripted model as its one
/// model profile (`scripted`), which alice and bob may use.
struct Scripted {
    // Dropped after the platform has stopped: it empties the platform's namespaces.
    _node: toolyard_tests::NodeClaim,
    model: ScriptedModel,
    _profiles: toolyard_tests::local::TempDir,
    platform: Platform,
}

async fn scripted_platform() -> Scripted {
    let mut node = toolyard_tests::claim_node(toolyard_tests::NodeShare::Half).await;
    let model = ScriptedModel::start_on(TestEnv::get().host_ip(), MODEL_KEY, vec![]).await;
    let profiles = toolyard_tests::local::TempDir::new("profiles");
    let platform = start(&profiles, &[("scripted", &model.base_url(), MODEL_KEY)]).await;
    node.empty_at_end(&platform.ns);
    node.empty_at_end(&platform.release_ns);
    grant(&platform.ns, "alice", &["scripted"]);
    grant(&platform.ns, "bob", &["scripted"]);
    Scripted { _node: node, model, _profiles: profiles, platform }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn coding_tasks_run_as_jobs_through_the_whole_platform() {
    let Scripted { _node, model, _profiles, mut platform } = scripted_platform().await;
    let ns = platform.ns.clone();
    let admin = TestEnv::get().client(User::Admin).await;
    let alice = client(&platform, User::Alice).await;

    // The pricing scenario, with a step that raises and a final answer that breaks the contract.
    // The controller is killed in the middle of it: the model holds its second answer (the
    // step with the six tool calls) until the controller is dead, so those ToolCalls are
    // created while no controller runs, and a new controller process (once the dead one's
    // Lease expired) makes their Jobs and finishes the task.
    let gate = Gate::new();
    let mut turns = coding_support::pricing_turns();
    turns[1] = turns[1].clone().held(&gate);
    model.set_script(turns);
    let first_leader = platform.lease_holder().await.expect("the controller holds the Lease");
    let run = call(&alice, "run_coding_task", json!({"task": coding_support::PRICING_TASK}));
    let restart = async {
        wait_for_requests(&model, 2, Duration::from_secs(120)).await.expect("the agent asks for its second step");
        platform.kill_controller().await;
        gate.open();
        platform.start_controller().await;
    };
    let (result, ()) = tokio::join!(run, restart);
    let result = structured(&result);
    if result["status"] != "success" {
        platform.dump_logs();
    }
    let second_leader = platform.lease_holder().await.expect("the new controller holds the Lease");
    assert_ne!(first_leader, second_leader, "a new controller process took over");
    assert!(model.failures().is_empty(), "{:?}", model.failures());
    coding_support::check_pricing(&alice, &result, &model.requests()).await;
    let task = result["task_id"].as_str().expect("id").to_owned();
    assert!(!coding_support::progress_of(&alice).is_empty(), "progress notifications");
    // alice may not call the misbehaving tools: the agent was not told about them.
    let system = coding_support::system_prompt(&model.requests()[0]);
    assert!(system.contains("price_option(") && !system.contains("- fail("), "{system}");

    // The CodingTask: owned by alice, created by the gateway, result fields written by it.
    let object = Api::<CodingTask>::namespaced(admin.clone(), &ns).get(&task).await.expect("CodingTask");
    assert_eq!(object.spec.owner.user, "alice");
    let status = object.status.clone().expect("status");
    assert_eq!(status.task_type, Some(toolyard_api::codingtask::TaskType::Analysis));
    assert_eq!((status.steps, status.tool_calls), (Some(4), Some(7)));
    assert_eq!(status.artifacts.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(), ["scenarios.csv"]);
    assert!(toolyard_api::conditions::is_true(&status.conditions, toolyard_api::conditions::SUCCEEDED));
    let managers: Vec<String> =
        object.metadata.managed_fields.iter().flatten().filter_map(|m| m.manager.clone()).collect();
    assert!(managers.iter().any(|m| m == "toolyard-gateway"), "{managers:?}");
    // Each of its tool calls was a ToolCall like any other, naming the task.
    let calls =
        Api::<ToolCall>::namespaced(admin.clone(), &ns).list(&Default::default()).await.expect("ToolCalls").items;
    let children: Vec<&ToolCall> =
        calls.iter().filter(|c| c.spec.parent_task.as_deref() == Some(task.as_str())).collect();
    assert_eq!(children.len(), 7, "{}", calls.len());
    assert!(children.iter().all(|c| c.spec.owner.user == "alice"));
    // The chart's NetworkPolicies: the agent pod is a run pod like the tool pods it caused
    // (DNS and the gateway's internal port; it reaches its model through the gateway).
    let pods = Api::<Pod>::namespaced(admin.clone(), &ns).list(&Default::default()).await.expect("pods").items;
    let labels_of = |pod: &Pod| pod.metadata.labels.clone().unwrap_or_default();
    let agent: Vec<_> = pods.iter().map(labels_of).filter(|l| l.get("toolyard.dev/task") == Some(&task)).collect();
    assert_eq!(agent.len(), 1, "one agent pod for the task");
    assert!(platform.policy_selects("runs", &agent[0]));
    let tools: Vec<_> = pods.iter().map(labels_of).filter(|l| l.contains_key("toolyard.dev/call")).collect();
    assert!(!tools.is_empty());
    for labels in &tools {
        assert!(platform.policy_selects("runs", labels), "{labels:?}");
    }

    // A tool its owner may not call looks exactly like a tool that does not exist — to the
    // agent's code, and on the internal API (with the task's own token).
    let gate = Gate::new();
    let before = model.requests().len();
    model.set_script(vec![
        Turn::code(
            "for name in ('fail', 'no_such_tool'):\n    try:\n        globals()[name](message='x')\n    \
             except Exception as e:\n        print(name, '->', type(e).__name__, str(e).replace(name, 'X'))",
        )
        .held(&gate),
        Turn::code("final_answer({'task_type': 'unsupported', 'summary': 'no such tool for me'})")
            .expecting("fail -> KeyError 'X'")
            .expecting("no_such_tool -> KeyError 'X'"),
    ]);
    let (held, waiting) = start_task(&platform, User::Alice, json!({"task": "make it fail"}), &model, before).await;
    let secret = Api::<Secret>::namespaced(admin.clone(), &ns).get(&format!("{held}-token")).await.expect("token");
    let token = String::from_utf8(secret.data.expect("data")["token"].0.clone()).expect("utf-8");
    let internal = reqwest::Client::new();
    let mut answers = Vec::new();
    for tool in ["fail", "no_such_tool", "price_option"] {
        let url = format!("{}{}", platform.internal, toolyard_api::agent::path::tool_call(&held, tool));
        let response = internal
            .post(url)
            .bearer_auth(&token)
            .json(&json!({"arguments": {"message": "x"}}))
            .send()
            .await
            .expect("POST");
        assert_eq!(response.status(), 200);
        let outcome: Value = response.json().await.expect("outcome");
        answers.push(outcome);
    }
    let same = |v: &Value, name: &str| v.to_string().replace(name, "X");
    assert_eq!(same(&answers[0], "fail"), same(&answers[1], "no_such_tool"), "{answers:?}");
    assert_eq!(answers[0]["isError"], true);
    assert!(answers[2]["text"].as_str().unwrap_or_default().starts_with("invalid arguments"), "{answers:?}");
    gate.open();
    let result = tokio::time::timeout(Duration::from_secs(180), waiting).await.expect("ends").expect("join");
    assert_eq!(
        (result["status"].as_str(), result["task_type"].as_str()),
        (Some("success"), Some("unsupported")),
        "{result}"
    );
    // Once the task has ended its token opens nothing: its files cannot be rewritten, its
    // model cannot be called.
    for (method, path, body) in [
        (reqwest::Method::PUT, toolyard_api::agent::path::result(&held), json!({"status": "success"})),
        (reqwest::Method::PUT, toolyard_api::protocol::path::task_output(&held, "result.csv"), json!("x")),
        (reqwest::Method::POST, toolyard_api::agent::path::model_chat(&held), json!({"messages": []})),
        (reqwest::Method::GET, toolyard_api::agent::path::spec(&held), json!({})),
    ] {
        let answer = internal
            .request(method, format!("{}{path}", platform.internal))
            .bearer_auth(&token)
            .json(&body)
            .send()
            .await
            .expect("request");
        let status = answer.status();
        let text = answer.text().await.unwrap_or_default();
        assert_eq!(status, 403, "{path}: {text}");
        assert!(text.contains("the task has ended"), "{path}: {text}");
    }

    // alice cannot list, read or cancel bob's tasks: they answer like unknown ones.
    let gate = Gate::new();
    let before = model.requests().len();
    model.set_script(vec![Turn::code("final_answer({'task_type': 'answer', 'summary': 'bob is done'})").held(&gate)]);
    let (bobs, bob_waiting) = start_task(&platform, User::Bob, json!({"task": "bob's task"}), &model, before).await;
    let alices_list = ok(&call(&alice, "list_tasks", json!({"limit": 100})).await);
    assert!(!alices_list.to_string().contains(&bobs), "{alices_list}");
    let unknown = "task-000000000000";
    for (tool, extra) in [
        ("get_task_result", json!({})),
        ("cancel_task", json!({})),
        ("list_artifacts", json!({})),
        ("read_artifact", json!({"filename": "events/000001.jsonl"})),
    ] {
        let mut theirs = extra.clone();
        theirs["task_id"] = json!(bobs);
        let mut nobody = extra.clone();
        nobody["task_id"] = json!(unknown);
        let a = call(&alice, tool, theirs).await;
        let b = call(&alice, tool, nobody).await;
        assert_eq!(
            (a.is_error, text_of(&a).replace(&bobs, "ID")),
            (b.is_error, text_of(&b).replace(unknown, "ID")),
            "{tool}"
        );
        assert_eq!(a.is_error, Some(true), "{tool}");
    }
    let read = |uri: String| {
        let alice = &alice;
        async move {
            match alice.read_resource(rmcp::model::ReadResourceRequestParams::new(uri)).await {
                Ok(r) => format!("{r:?}"),
                Err(e) => e.to_string(),
            }
        }
    };
    let theirs = read(format!("toolyard://tasks/{bobs}/result")).await;
    let nobody = read(format!("toolyard://tasks/{unknown}/result")).await;
    assert_eq!(theirs.replace(&bobs, "ID"), nobody.replace(unknown, "ID"));
    gate.open();
    let bob_result = tokio::time::timeout(Duration::from_secs(180), bob_waiting).await.expect("ends").expect("join");
    assert_eq!(bob_result["status"], "success", "alice's cancel did not touch bob's task: {bob_result}");

    platform.stop().await;
}

/// A task ends on its step budget, on its owner's cancellation and at its deadline, and
/// outlives a gateway restart; the chart's dashboard and alerts query only series the
/// binaries expose.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn coding_tasks_end_on_budget_cancellation_and_deadline_and_outlive_a_gateway_restart() {
    let Scripted { _node, model, _profiles, mut platform } = scripted_platform().await;
    let ns = platform.ns.clone();
    let admin = TestEnv::get().client(User::Admin).await;
    let alice = client(&platform, User::Alice).await;

    // Budget exhaustion.
    model.set_script(vec![Turn::code("print('thinking')"), Turn::code("print('still thinking')")]);
    let result =
        structured(&call(&alice, "run_coding_task", json!({"task": "loop", "budgets": {"max_steps": 2}})).await);
    assert_eq!(result["status"], "failed", "{result}");
    assert!(result["error"].as_str().unwrap_or_default().contains("step budget of 2 was exhausted"), "{result}");

    // Cancel while the model thinks.
    let gate = Gate::new();
    let before = model.requests().len();
    model.set_script(vec![Turn::code("print('never')").held(&gate)]);
    let (cancelled, waiting) = start_task(&platform, User::Alice, json!({"task": "slow"}), &model, before).await;
    let asked = ok(&call(&alice, "cancel_task", json!({"task_id": cancelled})).await);
    assert_eq!(asked["cancel_requested"], true, "{asked}");
    let result = tokio::time::timeout(Duration::from_secs(120), waiting).await.expect("ends").expect("join");
    // The gate stays shut: the cancelled agent may live a moment longer than its task, and a
    // released answer would let it take the next test's scripted turns.
    let _held_for_good = gate;
    assert_eq!(result["status"], "cancelled", "{result}");
    let object = Api::<CodingTask>::namespaced(admin.clone(), &ns).get(&cancelled).await.expect("CodingTask");
    assert!(object.spec.cancel_requested);

    // A gateway restart in the middle of a task: the task finishes and its result is readable.
    let gate = Gate::new();
    let before = model.requests().len();
    model.set_script(vec![
        Turn::code("p = price_option(spot=100, strike=100, time_to_expiry=1, volatility=0.2, rate=0.05)\nprint(p)")
            .held(&gate),
        Turn::code("final_answer({'task_type': 'analysis', 'summary': 'priced across a restart', 'metrics': p})")
            .expecting("'price': 10.45"),
    ]);
    let (restarted, waiting) = start_task(&platform, User::Alice, json!({"task": "restart"}), &model, before).await;
    platform.restart_gateway().await;
    let lost = waiting.await;
    assert!(lost.is_err(), "the waiting request died with the gateway");
    gate.open();
    let alice = client(&platform, User::Alice).await;
    let result = wait_final(&alice, &restarted, Duration::from_secs(180)).await;
    if result["status"] != "success" {
        platform.dump_logs();
    }
    assert_eq!(
        (result["status"].as_str(), result["summary"].as_str()),
        (Some("success"), Some("priced across a restart")),
        "{result}"
    );
    assert!((result["metrics"]["price"].as_f64().unwrap_or_default() - 10.4506).abs() < 1e-4, "{result}");

    // The deadline: a step that sleeps past it (or a pod that never gets that far).
    model.set_script(vec![Turn::code("import time\ntime.sleep(300)")]);
    let result = structured(
        &call(&alice, "run_coding_task", json!({"task": "sleep", "budgets": {"timeout_seconds": 15}})).await,
    );
    assert_eq!(result["status"], "timed_out", "{result}");
    platform.check_dashboard_and_alerts().await;
    platform.stop().await;
}

/// A dead model endpoint fails the task; a profile its user may not use is refused; a
/// CodingTask made with kubectl runs with its profile; a cancellation reaches a call waiting
/// at another replica. (The node-claiming tests run in name order: the longest first.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn model_profiles_hold_and_a_cancellation_reaches_a_call_on_another_replica() {
    let mut node = toolyard_tests::claim_node(toolyard_tests::NodeShare::Half).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
    let dead = format!("http://{}:{port}/v1", TestEnv::get().host_ip());
    let own = ScriptedModel::start_on(
        TestEnv::get().host_ip(),
        "sk-working-key-0002",
        vec![Turn::code("final_answer({'task_type': 'answer', 'summary': 'the working profile'})")],
    )
    .await;
    let profiles = toolyard_tests::local::TempDir::new("profiles");
    let mut platform =
        start(&profiles, &[("default", &dead, ""), ("working", &own.base_url(), "sk-working-key-0002")]).await;
    node.empty_at_end(&platform.ns);
    node.empty_at_end(&platform.release_ns);
    let ns = platform.ns.clone();
    grant(&ns, "alice", &["default", "working"]);
    grant(&ns, "bob", &["default"]);
    let alice = client(&platform, User::Alice).await;

    let result = structured(&call(&alice, "run_coding_task", json!({"task": "anything"})).await);
    assert_eq!(result["status"], "failed", "{result}");
    let error = result["error"].as_str().unwrap_or_default();
    assert!(error.contains("the model endpoint of profile default is unreachable"), "{error}");

    // A profile a user may not use is refused before anything starts.
    let bob = client(&platform, User::Bob).await;
    let refused = call(&bob, "run_coding_task", json!({"task": "x", "model": "working"})).await;
    assert_eq!(refused.is_error, Some(true));
    assert!(text_of(&refused).contains("you may not use the model profile \"working\""), "{}", text_of(&refused));

    // A CodingTask made with kubectl names a profile (never an endpoint or a key): alice's
    // runs with that profile's model and key, and she reads its result.
    // Task files live under the owner's prefix, not the namespace's: a fixed name would find
    // the result of an earlier run on a reused test cluster.
    let own_task = format!("task-own-{}", &ns[ns.len().saturating_sub(6)..]);
    let task: CodingTask = serde_json::from_value(json!({
        "apiVersion": "toolyard.dev/v1alpha1", "kind": "CodingTask",
        "metadata": {"name": own_task, "namespace": ns},
        "spec": {"prompt": "use the working profile", "owner": {"issuer": "kubernetes", "user": "alice"},
                 "model": {"profile": "working"},
                 "budgets": {"maxSteps": 3, "maxModelCalls": 6, "maxToolCalls": 5, "timeoutSeconds": 300}},
    }))
    .expect("CodingTask");
    let as_alice = TestEnv::get().client(User::Alice).await;
    Api::<CodingTask>::namespaced(as_alice, &ns).create(&Default::default(), &task).await.expect("alice creates it");
    let result = wait_final(&alice, &own_task, Duration::from_secs(180)).await;
    assert_eq!((result["status"].as_str(), result["summary"].as_str()), (Some("success"), Some("the working profile")));
    assert_eq!(own.requests()[0]["model"], "working-model");
    assert_eq!(own.rejected(), 0, "the profile's key was sent, by the gateway");

    // notifications/cancelled, posted to another replica, stops a call waiting on this one.
    let fixture =
        std::fs::read_to_string(toolyard_tests::repo_path("tests/fixtures/misbehaving/tools.yaml")).expect("fixture");
    let hang = fixture.split("\n---\n").find(|d| d.contains("name: \"hang\"")).expect("hang manifest");
    let long = hang
        .replace("timeoutSeconds: 2", "timeoutSeconds: 600")
        .replace("name: \"hang\"\nspec:", "name: \"hang-long\"\nspec:")
        .replace("  name: \"hang\"", "  name: \"hang_long\"");
    let dir = toolyard_tests::local::TempDir::new("hang-long");
    let file = dir.path().join("hang-long.yaml");
    std::fs::write(&file, long).expect("manifest");
    platform.apply_tools(file.to_str().expect("utf-8")).await;
    kubectl(
        &ns,
        &["create", "role", "hang", "--verb=call", "--resource=mcptools.toolyard.dev", "--resource-name=hang-long"],
    );
    kubectl(&ns, &["create", "rolebinding", "hang", "--role=hang", "--user=alice"]);
    let replica = platform.start_replica().await;
    let token = TestEnv::get().token(User::Alice).to_owned();
    let http = platform.http();
    let post = |base: &str, body: Value| {
        http.post(format!("{base}/mcp"))
            .bearer_auth(&token)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .body(body.to_string())
            .send()
    };
    let waiting = tokio::spawn(post(
        &platform.base,
        json!({"jsonrpc": "2.0", "id": 77, "method": "tools/call", "params": {"name": "hang_long", "arguments": {"seconds": 600}}}),
    ));
    let admin = TestEnv::get().client(User::Admin).await;
    let calls: Api<ToolCall> = Api::namespaced(admin, &ns);
    let running = wait_until(Duration::from_secs(120), "the hang call's pod to run", || {
        let calls = calls.clone();
        async move {
            let list = calls.list(&Default::default()).await?.items;
            Ok(list.iter().any(|c| {
                c.spec.tool == "hang-long"
                    && c.status.as_ref().is_some_and(|s| {
                        toolyard_api::conditions::find(&s.conditions, toolyard_api::conditions::SUCCEEDED)
                            .is_some_and(|c| c.reason == toolyard_api::conditions::reason::RUNNING)
                    })
            }))
        }
    })
    .await;
    if running.is_err() {
        platform.dump_logs();
    }
    running.expect("running");
    let accepted =
        post(&replica, json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 77}}))
            .await
            .expect("POST");
    assert_eq!(accepted.status(), 202);
    let response = tokio::time::timeout(Duration::from_secs(120), waiting)
        .await
        .expect("the call ends")
        .expect("join")
        .expect("response");
    let body = response.text().await.expect("body");
    assert!(body.contains("cancelled"), "{body}");
    let call = calls
        .list(&Default::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .find(|c| c.spec.tool == "hang-long")
        .expect("ToolCall");
    assert!(call.spec.cancel_requested, "the other replica set cancelRequested");
    assert!(call.metadata.labels.as_ref().is_some_and(|l| l.contains_key("toolyard.dev/cancel-key")));
    platform.stop().await;
}

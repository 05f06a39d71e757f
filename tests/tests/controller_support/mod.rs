//! Support for the controller's integration tests: running controller replicas in-process
//! (each on its own runtime, so a test can stop one gracefully or kill it), objects to feed
//! them, and pod status driving (there is no kubelet: tests play its part through the pod
//! status subresource while the real Job controller does the rest).

#![allow(dead_code)]

use std::fmt::Debug;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use toolyard_api::conditions;
use toolyard_api::token::SigningKey;
use toolyard_api::{CodingTask, McpTool, ToolCall};
use toolyard_controller::{CancellationToken, Config, Controller, Metrics};
use toolyard_tests::{TestEnv, User, random_suffix};

/// Runner image every test controller uses.
pub const RUNNER_IMAGE: &str = "registry.example/toolyard-runner:test";
/// Image of the test tools.
pub const TOOL_IMAGE: &str = "registry.example/pricing:test";
/// Longest wait for anything the controller or the Job controller does.
pub const WAIT: Duration = Duration::from_secs(60);

/// A signing key in a temporary file, as the chart mounts it.
pub struct KeyFile {
    /// The file.
    pub path: PathBuf,
    /// The key.
    pub key: SigningKey,
}

impl KeyFile {
    /// A fresh random key.
    pub fn new() -> Self {
        let text = random_suffix(48);
        let path = std::env::temp_dir().join(format!("toolyard-controller-test-key-{}", random_suffix(10)));
        std::fs::write(&path, format!("{text}\n")).expect("write key file");
        Self { path, key: SigningKey::new(text.into_bytes()).expect("key") }
    }
}

impl Drop for KeyFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A controller configuration for tests watching `ns`: no leader election, short graces,
/// an ephemeral metrics port. `extra` flags come last and win.
pub fn config(ns: &str, key: &KeyFile, extra: &[&str]) -> Config {
    let mut args: Vec<String> = [
        "toolyard-controller",
        "--namespaces",
        ns,
        "--leader-elect",
        "false",
        "--metrics-addr",
        "127.0.0.1:0",
        "--runner-image",
        RUNNER_IMAGE,
        "--agent-image",
        "registry.example/toolyard-agent:test",
        "--gateway-internal-url",
        "http://toolyard-gateway-internal.toolyard.svc:8081",
        "--unschedulable-grace-seconds",
        "2",
        "--image-pull-grace-seconds",
        "2",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    args.push("--token-key-file".into());
    args.push(key.path.display().to_string());
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    Config::from_args(args).expect("test controller flags parse")
}

/// A controller replica on its own Tokio runtime.
pub struct Replica {
    runtime: Option<tokio::runtime::Runtime>,
    shutdown: CancellationToken,
    done: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    /// Its `/metrics`, `/healthz`, `/readyz` address.
    pub ops_addr: SocketAddr,
    /// Its metrics.
    pub metrics: Arc<Metrics>,
    /// Its identity.
    pub identity: String,
}

impl Replica {
    /// Starts a replica with `config`, acting as `user`.
    pub async fn start(config: Config, user: User) -> Self {
        let kube = TestEnv::get().config(user).await.expect("kubeconfig");
        Self::start_with(config, kube).await
    }

    /// Starts a replica with `config`, authenticating with `kube`.
    pub async fn start_with(config: Config, kube: kube::Config) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .thread_name("test-controller")
            .build()
            .expect("controller runtime");
        let shutdown = CancellationToken::new();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let stop = shutdown.clone();
        let done = runtime.spawn(async move {
            let controller = Controller::new(config, kube).await?;
            let _ = tx.send((controller.ops_addr(), controller.metrics(), controller.identity().to_owned()));
            controller.run(stop).await
        });
        let (ops_addr, metrics, identity) = match rx.await {
            Ok(v) => v,
            Err(_) => panic!("controller did not start: {:?}", done.await),
        };
        Self { runtime: Some(runtime), shutdown, done: Some(done), ops_addr, metrics, identity }
    }

    /// Stops gracefully (in-flight reconciles finish, the Lease is released) and checks the
    /// controller returned without error.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        let done = self.done.take().expect("running");
        let result = tokio::time::timeout(WAIT, done).await.expect("controller stops in time").expect("task");
        result.expect("controller ran without error");
    }

    /// Kills the replica: every task stops at once, nothing is cleaned up (no Lease release).
    pub fn kill(mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }

    /// The replica's `/metrics` text.
    pub async fn scrape(&self, path: &str) -> (u16, String) {
        let resp = reqwest::get(format!("http://{}{path}", self.ops_addr)).await.expect("ops endpoint answers");
        let status = resp.status().as_u16();
        (status, resp.text().await.expect("body"))
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            self.shutdown.cancel();
            rt.shutdown_background();
        }
    }
}

/// A Job-mode McpTool named `name` (tool name derived from it).
pub fn job_tool(name: &str) -> McpTool {
    tool(name, json!({"mode": "Job", "timeoutSeconds": 30}))
}

/// An McpTool with the given `execution`.
pub fn tool(name: &str, execution: Value) -> McpTool {
    serde_json::from_value(json!({
        "apiVersion": "toolyard.dev/v1alpha1",
        "kind": "McpTool",
        "metadata": {"name": name},
        "spec": {
            "name": name.replace('-', "_"),
            "description": "Price an option.",
            "inputSchema": {"type": "object", "properties": {"spot": {"type": "number"}}, "required": ["spot"]},
            "runtime": {
                "image": TOOL_IMAGE,
                "command": ["python3", "-m", "toolyard.run"],
                "args": ["pricing.options:price_option"],
                "workingDir": "/app",
                "env": [{"name": "REGION", "value": "eu"}],
            },
            "execution": execution,
        },
    }))
    .expect("tool manifest")
}

/// A ToolCall of `tool` by alice, as the gateway creates it.
pub fn call(name: &str, tool: &str, timeout_seconds: i32) -> ToolCall {
    serde_json::from_value(json!({
        "apiVersion": "toolyard.dev/v1alpha1",
        "kind": "ToolCall",
        "metadata": {"name": name, "annotations": {
            "toolyard.dev/traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}},
        "spec": {
            "tool": tool,
            "owner": {"issuer": "apikey", "user": "alice", "groups": ["quants"]},
            "input": {"key": format!("owners/0123456789abcdef0123456789abcdef/calls/{name}/input.json"), "sizeBytes": 42},
            "timeoutSeconds": timeout_seconds,
        },
    }))
    .expect("call manifest")
}

/// A CodingTask by alice with the given model settings.
pub fn task(name: &str, model: Value, timeout_seconds: i32) -> CodingTask {
    serde_json::from_value(json!({
        "apiVersion": "toolyard.dev/v1alpha1",
        "kind": "CodingTask",
        "metadata": {"name": name},
        "spec": {
            "prompt": "Compare a European call at spots 90, 100 and 110.",
            "owner": {"issuer": "apikey", "user": "alice", "groups": ["quants"]},
            "tools": {"toolset": "pricing"},
            "model": model,
            "budgets": {"maxSteps": 5, "maxModelCalls": 10, "maxToolCalls": 20, "timeoutSeconds": timeout_seconds},
        },
    }))
    .expect("task manifest")
}

/// Creates `obj` in `ns` as admin.
pub async fn create<K>(client: &Client, ns: &str, obj: &K) -> K
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned,
{
    Api::<K>::namespaced(client.clone(), ns).create(&PostParams::default(), obj).await.expect("create")
}

/// Waits until `check` holds for the object `name`; on timeout, fails with the object dumped.
pub async fn wait_for<K>(api: &Api<K>, name: &str, what: &str, check: impl Fn(&K) -> bool) -> K
where
    K: Resource + Clone + Debug + DeserializeOwned + Serialize,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let current = api.get_opt(name).await.expect("get");
        if let Some(obj) = &current
            && check(obj)
        {
            return obj.clone();
        }
        if tokio::time::Instant::now() >= deadline {
            let dump = current.map(|o| serde_json::to_string_pretty(&o).unwrap_or_default());
            panic!(
                "timed out after {WAIT:?} waiting for {what} of {name}; object: {}",
                dump.unwrap_or("<absent>".into())
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The `Succeeded` condition of a ToolCall or CodingTask.
pub fn succeeded(conditions: &[Condition]) -> Option<&Condition> {
    conditions::find(conditions, conditions::SUCCEEDED)
}

/// `(status, reason)` of a ToolCall's `Succeeded` condition.
pub fn call_state(call: &ToolCall) -> Option<(String, String)> {
    let status = call.status.as_ref()?;
    succeeded(&status.conditions).map(|c| (c.status.clone(), c.reason.clone()))
}

/// The `Succeeded` message of a ToolCall.
pub fn call_message(call: &ToolCall) -> String {
    call.status.as_ref().and_then(|s| succeeded(&s.conditions)).map(|c| c.message.clone()).unwrap_or_default()
}

/// `(status, reason)` of a CodingTask's `Succeeded` condition.
pub fn task_state(task: &CodingTask) -> Option<(String, String)> {
    let status = task.status.as_ref()?;
    succeeded(&status.conditions).map(|c| (c.status.clone(), c.reason.clone()))
}

/// Waits for a call's `Succeeded` condition to have `status`/`reason`.
pub async fn wait_call(api: &Api<ToolCall>, name: &str, status: &str, reason: &str) -> ToolCall {
    let want = Some((status.to_owned(), reason.to_owned()));
    wait_for(api, name, &format!("Succeeded={status}/{reason}"), |c| call_state(c) == want).await
}

/// The pod the Job controller made for run `name` (label `label` = `name`).
pub async fn pod_of(client: &Client, ns: &str, label: &str, name: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let selector = format!("{label}={name}");
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let list = pods.list(&ListParams::default().labels(&selector)).await.expect("list pods");
        if let Some(p) = list.items.into_iter().next() {
            return p;
        }
        assert!(tokio::time::Instant::now() < deadline, "no pod with {selector} after {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Writes a pod's status as a kubelet would.
pub async fn set_pod_status(client: &Client, ns: &str, pod: &str, status: Value) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.patch_status(pod, &PatchParams::default(), &Patch::Merge(json!({"status": status})))
        .await
        .unwrap_or_else(|e| panic!("patching status of pod {pod}: {e}"));
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

/// Pod status: `container` running (init container done).
pub fn running(container: &str, image: &str) -> Value {
    json!({
        "phase": "Running",
        "startTime": now(),
        "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
        "initContainerStatuses": [terminated_status("install-runner", RUNNER_IMAGE, 0, "")],
        "containerStatuses": [{"name": container, "image": image, "imageID": "", "ready": true, "restartCount": 0,
            "started": true, "state": {"running": {"startedAt": now()}}}],
    })
}

/// Pod status: `container` exited with `code` and termination `message`.
pub fn finished(container: &str, image: &str, code: i32, message: &str) -> Value {
    json!({
        "phase": if code == 0 { "Succeeded" } else { "Failed" },
        "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}],
        "initContainerStatuses": [terminated_status("install-runner", RUNNER_IMAGE, 0, "")],
        "containerStatuses": [terminated_status(container, image, code, message)],
    })
}

fn terminated_status(container: &str, image: &str, code: i32, message: &str) -> Value {
    json!({"name": container, "image": image, "imageID": "", "ready": false, "restartCount": 0, "started": false,
        "state": {"terminated": {"exitCode": code, "reason": if code == 0 { "Completed" } else { "Error" },
            "message": message, "startedAt": now(), "finishedAt": now()}}})
}

/// Pod status: `container` waiting with `reason` (e.g. `ImagePullBackOff`).
pub fn waiting(container: &str, image: &str, reason: &str) -> Value {
    json!({
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "True"}],
        "containerStatuses": [{"name": container, "image": image, "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": reason, "message": format!("failed to pull image {image:?}")}}}],
    })
}

/// Pod status: no node can take the pod.
pub fn unschedulable() -> Value {
    json!({
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/3 nodes are available: 3 Insufficient memory.", "lastTransitionTime": now()}],
    })
}

/// A fresh namespace with the CRDs installed, whose pods no scheduler binds and no kubelet runs.
pub async fn namespace(prefix: &str) -> (String, Client) {
    let env = TestEnv::get();
    env.install_crds().await.expect("CRDs");
    let ns = env.namespace(prefix).await.expect("namespace");
    // Its pods are never scheduled nor run (tests/cluster/unscheduled-pods.yaml): the tests
    // write their status as a kubelet would report it.
    env.kubectl_as(User::Admin, &["label", "namespace", &ns, "toolyard.dev/test-pods=unscheduled"])
        .expect("label namespace");
    (ns, env.client(User::Admin).await)
}

/// `Succeeded` condition's `observedGeneration`-independent view for assertions.
pub fn reason_of(conditions: &[Condition]) -> Option<&str> {
    succeeded(conditions).map(|c| c.reason.as_str())
}

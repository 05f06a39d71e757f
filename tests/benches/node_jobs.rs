//! Job mode on the real test node (not a test): for `TOOLYARD_BENCH_CALLS` (default 50)
//! sequential `price_option` calls through the gateway, the time from the ToolCall's creation
//! to its pod running and to its result; against a bare `kubectl run` of the same image
//! computing the same price, from the pod's creation to it running and to it succeeding, in
//! the same run (the two alternate, call by call).
//!
//! `tests/cluster/build.sh && cargo build --workspace --bins && tests/cluster/images.sh &&
//!  tests/cluster/cluster.sh start && TOOLYARD_BIN_DIR=$CARGO_TARGET_DIR/debug cargo bench -p toolyard-tests --bench node_jobs`
//! (the gateway and controller binaries: the debug builds the images hold)
//!
//! Times are taken here, when a watch on the apiserver delivers each change (the objects'
//! own timestamps have one-second resolution): "created" is the ToolCall's (or the bare
//! pod's) first event, "running" the first event of its pod in phase Running or later (a
//! pod that ends within the kubelet's status period is seen Succeeded first), "result" the
//! ToolCall's Succeeded condition (the bare pod's Succeeded phase). The gateway and the
//! controller run as processes here (as `e2e_cluster` runs them); the pods run on the node.

#[path = "../tests/e2e_support/mod.rs"]
mod e2e_support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use e2e_support::Platform;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::watcher;
use rmcp::model::CallToolRequestParams;
use serde_json::json;
use toolyard_api::ToolCall;
use toolyard_tests::{TestEnv, User, images};

/// When a watch saw each stage of one run (by object name).
#[derive(Clone, Copy, Debug, Default)]
struct Seen {
    created: Option<Instant>,
    running: Option<Instant>,
    done: Option<Instant>,
    failed: bool,
}

type Log = Arc<Mutex<HashMap<String, Seen>>>;

fn started(pod: &Pod) -> bool {
    matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Running" | "Succeeded" | "Failed"))
}

/// Records, by pod name (or by the ToolCall a pod belongs to), when each stage was first seen.
fn watch_pods(api: Api<Pod>, log: Log, by_call: bool) {
    tokio::spawn(async move {
        let mut events = watcher(api, watcher::Config::default()).boxed();
        while let Some(Ok(event)) = events.next().await {
            let now = Instant::now();
            let pods = match event {
                watcher::Event::Apply(p) | watcher::Event::InitApply(p) => vec![p],
                _ => continue,
            };
            for pod in pods {
                let key = if by_call {
                    match pod.metadata.labels.as_ref().and_then(|l| l.get("toolyard.dev/call")) {
                        Some(call) => call.clone(),
                        None => continue,
                    }
                } else {
                    pod.metadata.name.clone().unwrap_or_default()
                };
                let mut log = log.lock().expect("lock");
                let seen = log.entry(key).or_default();
                if !by_call {
                    seen.created.get_or_insert(now);
                }
                if started(&pod) {
                    seen.running.get_or_insert(now);
                }
                let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
                if !by_call && matches!(phase, Some("Succeeded" | "Failed")) {
                    seen.done.get_or_insert(now);
                    seen.failed = phase == Some("Failed");
                }
            }
        }
    });
}

fn watch_calls(api: Api<ToolCall>, log: Log) {
    tokio::spawn(async move {
        let mut events = watcher(api, watcher::Config::default()).boxed();
        while let Some(Ok(event)) = events.next().await {
            let now = Instant::now();
            let (watcher::Event::Apply(call) | watcher::Event::InitApply(call)) = event else { continue };
            let mut log = log.lock().expect("lock");
            let seen = log.entry(call.metadata.name.clone().unwrap_or_default()).or_default();
            seen.created.get_or_insert(now);
            let succeeded = call
                .status
                .as_ref()
                .is_some_and(|s| toolyard_api::conditions::is_true(&s.conditions, toolyard_api::conditions::SUCCEEDED));
            if succeeded {
                seen.done.get_or_insert(now);
            }
        }
    });
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn stats(label: &str, mut ms: Vec<f64>) -> (f64, f64) {
    ms.sort_by(f64::total_cmp);
    let (p50, p99) = (percentile(&ms, 0.5), percentile(&ms, 0.99));
    println!("{label:<44} p50 {p50:8.0} ms   p99 {p99:8.0} ms   (n={})", ms.len());
    (p50, p99)
}

async fn wait_for(log: &Log, name: &str, done: impl Fn(&Seen) -> bool) -> Seen {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(seen) = log.lock().expect("lock").get(name).copied().filter(|s| done(s)) {
            return seen;
        }
        assert!(Instant::now() < deadline, "{name} did not finish: {:?}", log.lock().expect("lock").get(name));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let calls: usize = std::env::var("TOOLYARD_BENCH_CALLS").ok().and_then(|v| v.parse().ok()).unwrap_or(50);
    let env = TestEnv::get();
    let platform = Platform::start(&[]).await;
    platform.apply_tools("examples/pricing/tools.yaml").await;
    platform.grant_tool_caller("alice");
    let alice = platform.client(User::Alice).await;
    // The bare pods run where no Pod Security level is enforced (kubectl run sets none).
    let bare_ns = env.namespace("bench-bare").await.expect("namespace");
    let admin = env.client(User::Admin).await;

    let toolyard: Log = Arc::default();
    let bare: Log = Arc::default();
    watch_calls(Api::namespaced(admin.clone(), &platform.ns), toolyard.clone());
    watch_pods(Api::namespaced(admin.clone(), &platform.ns), toolyard.clone(), true);
    watch_pods(Api::namespaced(admin.clone(), &bare_ns), bare.clone(), false);

    let arguments = json!({"spot": 100, "strike": 100, "time_to_expiry": 1, "volatility": 0.2, "rate": 0.05});
    let script = "import json; from pricing.options import price_option; \
                  print(json.dumps(price_option(spot=100, strike=100, time_to_expiry=1, volatility=0.2, rate=0.05).__dict__))";
    let call = || {
        let serde_json::Value::Object(map) = arguments.clone() else { unreachable!() };
        CallToolRequestParams::new("price_option").with_arguments(map)
    };
    // One of each first: the node has both images unpacked and warm afterwards.
    let first = alice.call_tool(call()).await.expect("tools/call");
    assert_ne!(first.is_error, Some(true), "{first:?}");

    let (mut ty_running, mut ty_result, mut ty_client) = (vec![], vec![], vec![]);
    let (mut bare_running, mut bare_done) = (vec![], vec![]);
    for i in 0..=calls {
        let before: Vec<String> = toolyard.lock().expect("lock").keys().cloned().collect();
        let t0 = Instant::now();
        let result = alice.call_tool(call()).await.expect("tools/call");
        let client_ms = t0.elapsed().as_secs_f64() * 1e3;
        assert_ne!(result.is_error, Some(true), "{result:?}");
        let name = {
            let log = toolyard.lock().expect("lock");
            log.keys().find(|k| !before.contains(k) && k.starts_with("price-option-")).cloned()
        };
        let name = name.expect("the call's ToolCall was seen");
        let seen = wait_for(&toolyard, &name, |s| s.created.is_some() && s.running.is_some() && s.done.is_some()).await;

        let pod = format!("bare-{i}");
        let out = tokio::process::Command::new(env.kubectl())
            .arg("--kubeconfig")
            .arg(env.kubeconfig(User::Admin))
            .args(["-n", &bare_ns, "run", &pod, "--image", images::PRICING, "--restart=Never", "--command", "--"])
            .args(["python3", "-c", script])
            .output()
            .await
            .expect("kubectl run");
        assert!(out.status.success(), "kubectl run: {}", String::from_utf8_lossy(&out.stderr));
        let bare_seen = wait_for(&bare, &pod, |s| s.done.is_some()).await;
        assert!(!bare_seen.failed, "{pod} failed: kubectl -n {bare_ns} logs {pod}");
        if i == 0 {
            continue; // warm-up of the alternation
        }
        let ms = |a: Option<Instant>, b: Option<Instant>| (b.expect("b") - a.expect("a")).as_secs_f64() * 1e3;
        ty_running.push(ms(seen.created, seen.running));
        ty_result.push(ms(seen.created, seen.done));
        ty_client.push(client_ms);
        bare_running.push(ms(bare_seen.created, bare_seen.running.or(bare_seen.done)));
        bare_done.push(ms(bare_seen.created, bare_seen.done));
    }

    println!("\nJob mode on the test node, {calls} sequential calls of price_option:");
    let (r50, r99) = stats("Toolyard: ToolCall created -> pod running", ty_running);
    let (d50, d99) = stats("Toolyard: ToolCall created -> result", ty_result);
    stats("Toolyard: tools/call round trip (client)", ty_client);
    let (br50, br99) = stats("kubectl run: pod created -> running", bare_running);
    let (bd50, bd99) = stats("kubectl run: pod created -> succeeded", bare_done);
    println!(
        "\nratios against kubectl run: to running p50 {:.2}x p99 {:.2}x; to result p50 {:.2}x p99 {:.2}x",
        r50 / br50,
        r99 / br99,
        d50 / bd50,
        d99 / bd99
    );
    platform.stop().await;
}

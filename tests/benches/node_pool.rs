//! Pool mode on the real test node (not a test): calls/s, p50 and p99 latency, and CPU per
//! call of the pricing example's `price_option` through the gateway to a warm pool pod,
//! against the official Python SDK server running the same function in-process in a pod on
//! the same node, at 1, 8 and 32 clients, in the same run (the two alternate, cell by cell).
//!
//! `cargo build --release --workspace --bins && TOOLYARD_IMAGE_PROFILE=release tests/cluster/images.sh &&
//!  tests/cluster/cluster.sh start && cargo bench -p toolyard-tests --bench node_pool`
//! (release images: the gateway and the pool pod's runner are what a release runs).
//! `TOOLYARD_BENCH_CLIENTS` (default `1,8,32`), `TOOLYARD_BENCH_SECONDS` (default 10) per cell.
//!
//! `TOOLYARD_BENCH_AGAINST=service` compares instead two ways the gateway reaches a warm pool of
//! two pods (2 slots each, `TOOLYARD_BENCH_POOL_QUEUE` waiting, default 0: a pool sized to its
//! load), in the same run, through the same gateway pod: the pods themselves, found in the
//! pool Service's EndpointSlice (each call to the pod with the fewest of the gateway's calls,
//! a pod that is full passing it on), and the pool's Service, which is what the gateway did
//! before and still does where it may not read EndpointSlices: the second team namespace's
//! gateway Role has that rule removed before the gateway (re)starts. Default clients `2,4,8`.
//!
//! Everything runs as a user installs it: `helm install` of the chart with the kind
//! walkthrough's values (one gateway replica) and its development S3 server, the example's
//! `price_option` McpTool switched to a warm pool (1 pod, 2 reused worker processes, a queue
//! of 64 so that every client of the 32-client cell can wait), called with a ServiceAccount's
//! token bound to the chart's `tool-caller` role. The gateway serves plain HTTP here
//! (`gateway.tls.plainHttp`), as the SDK server does, so that the two differ by what they do
//! and not by TLS. The SDK server (`tests/benches/python/pricing_server.py`: MCPServer,
//! stateless, JSON answers) runs in a pod of the team namespace from the pricing image plus
//! the SDK.
//!
//! The load generator is this program (`support/loadgen.rs`) on the host, sending to the pods'
//! own addresses (the host routes the node's pod network): the gateway's pod, which calls the
//! pool through its Service, and the SDK server's pod. Only answers with the right price
//! count. CPU per call is the pods' own CPU time (their cgroups' `cpu.stat`) over the answered
//! calls, read once the S3 server is idle again (the gateway writes each call's files after
//! its answer): gateway pod plus pool pod (printed `gateway+pool`) against the SDK server's pod; the development S3 server's
//! pod (where the gateway stores each call's files) is shown apart.

#[path = "support/loadgen.rs"]
mod loadgen;
#[path = "support/pricing.rs"]
mod pricing;

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use pricing::{call_body, priced};
use toolyard_tests::{TestEnv, User, chart, images, repo_path, wait_until};

/// The name the bench's clients use for the gateway (the chart's `gateway.allowedHosts`).
const GATEWAY_HOST: &str = "toolyard.bench";
const SDK_PORT: u16 = 8000;

fn kubectl(args: &[&str]) -> String {
    TestEnv::get().kubectl_as(User::Admin, args).unwrap_or_else(|e| panic!("{e:#}"))
}

/// The running pod of `ns` whose name starts with `prefix`.
async fn running_pod(ns: &str, prefix: &str) -> Pod {
    let pods = Api::<Pod>::namespaced(TestEnv::get().client(User::Admin).await, ns);
    let list = pods.list(&ListParams::default()).await.expect("pods").items;
    list.into_iter()
        .find(|p| {
            p.metadata.name.as_deref().is_some_and(|n| n.starts_with(prefix))
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        })
        .unwrap_or_else(|| panic!("no running pod {prefix}* in {ns}"))
}

fn pod_ip(pod: &Pod) -> String {
    pod.status.as_ref().and_then(|s| s.pod_ip.clone()).expect("pod IP")
}

/// A pod's cgroup folders: the kubelet (cgroupfs driver) names them `pod<uid>`, below the
/// cluster's cgroup and the pod's QoS class, one per hierarchy (cgroup v2 has one; a v1 or
/// hybrid host has one per controller, and v2's unified one without controllers).
#[derive(Clone, Debug)]
struct PodCgroup(Vec<PathBuf>);

impl PodCgroup {
    fn of(pod: &Pod) -> Self {
        let name = format!("pod{}", pod.metadata.uid.as_deref().expect("uid"));
        let (mut found, mut queue) = (Vec::new(), vec![PathBuf::from("/sys/fs/cgroup")]);
        while let Some(dir) = queue.pop() {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                if entry.file_name().to_string_lossy() == name {
                    found.push(entry.path());
                } else {
                    queue.push(entry.path());
                }
            }
        }
        assert!(!found.is_empty(), "no cgroup {name} under /sys/fs/cgroup");
        PodCgroup(found)
    }

    /// `key`'s value in the first of the folders' `file` that has it.
    fn stat(&self, file: &str, keys: &[&str]) -> f64 {
        for dir in &self.0 {
            let Ok(text) = std::fs::read_to_string(dir.join(file)) else { continue };
            for line in text.lines() {
                if let Some((key, value)) = line.split_once(' ')
                    && keys.contains(&key)
                {
                    return value.trim().parse().expect("a cgroup statistic is a number");
                }
            }
        }
        panic!("none of {keys:?} in {file} of {:?}", self.0)
    }

    /// CPU microseconds the pod's processes used so far (v2's `cpu.stat`, which the unified
    /// hierarchy keeps even without the cpu controller).
    fn cpu_usec(&self) -> f64 {
        self.stat("cpu.stat", &["usage_usec"])
    }

    /// Anonymous (resident, not page cache) memory of the pod's processes now, in MiB.
    fn memory_mib(&self) -> f64 {
        self.stat("memory.stat", &["anon", "total_rss"]) / (1024.0 * 1024.0)
    }
}

/// What the bench made on the cluster, removed when it ends, panics included: the release
/// (its cluster-wide roles too) and both namespaces.
struct Made {
    namespaces: Vec<String>,
    release: Option<chart::Release>,
}

impl Drop for Made {
    fn drop(&mut self) {
        if let Some(release) = &self.release {
            release.uninstall();
        }
        for ns in &self.namespaces {
            let _ = TestEnv::get().kubectl_as(User::Admin, &["delete", "namespace", ns, "--wait=false"]);
        }
    }
}

/// A server under test: where to send, and the pods whose CPU counts.
struct Target {
    name: &'static str,
    endpoint: loadgen::Endpoint,
    tool: &'static str,
    call: Call,
    cgroups: Vec<PodCgroup>,
}

/// What a target's clients send, and which answers count.
#[derive(Clone, Copy)]
enum Call {
    /// `price_option`: only the right price counts.
    Price,
    /// The misbehaving fixtures' `hang` for [`HOLD_SECONDS`]: only `slept` counts.
    Hold,
}

/// How long each call of [`Call::Hold`] takes in the function.
const HOLD_SECONDS: f64 = 0.05;

impl Call {
    fn body(self, tool: &str, id: u64) -> Vec<u8> {
        match self {
            Call::Price => call_body(tool, id),
            Call::Hold => serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": tool, "arguments": {"seconds": HOLD_SECONDS}}})
            .to_string()
            .into_bytes(),
        }
    }

    fn counts(self, answer: &loadgen::Answer) -> bool {
        match self {
            Call::Price => priced(answer),
            Call::Hold => {
                answer.json_text().and_then(|t| serde_json::from_str::<serde_json::Value>(t).ok()).is_some_and(|a| {
                    let result = &a["result"];
                    result["isError"] != true
                        && result["content"][0]["text"].as_str().is_some_and(|t| t.contains("slept"))
                })
            }
        }
    }
}

struct Cell {
    calls_per_second: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: u64,
    cpu_us_per_call: f64,
    /// `cpu_us_per_call` by pod, as `cgroups` lists them.
    cpu_split: Vec<f64>,
    /// The development S3 server's CPU per call (the gateway stores each call's files).
    storage_us_per_call: f64,
    memory_mib: f64,
}

/// Waits (up to a minute) until the S3 server is idle: the gateway stores a pool call's files
/// after answering it, so a cell's last records are still being written when it ends.
fn settle(storage: &PodCgroup) {
    for _ in 0..120 {
        let before = storage.cpu_usec();
        std::thread::sleep(Duration::from_millis(500));
        if storage.cpu_usec() - before < 25_000.0 {
            return;
        }
    }
}

async fn run_cell(target: &Target, storage: &PodCgroup, clients: usize, seconds: f64) -> Cell {
    let (endpoint, tool, call, cgroups, storage) =
        (target.endpoint.clone(), target.tool, target.call, target.cgroups.clone(), storage.clone());
    tokio::task::spawn_blocking(move || {
        // A short warm-up at this concurrency first (connections, the pool's workers).
        loadgen::run(&endpoint, clients, 1.0, move |id| call.body(tool, id), move |a| call.counts(a));
        settle(&storage);
        let cpu = |cgroups: &[PodCgroup]| cgroups.iter().map(PodCgroup::cpu_usec).collect::<Vec<_>>();
        let (before, storage_before) = (cpu(&cgroups), storage.cpu_usec());
        let measured =
            loadgen::run(&endpoint, clients, seconds, move |id| call.body(tool, id), move |a| call.counts(a));
        // The cell's last records are written after it: their CPU counts too.
        settle(&storage);
        let (after, storage_used) = (cpu(&cgroups), storage.cpu_usec() - storage_before);
        let calls = measured.latencies.len().max(1) as f64;
        let cpu_split: Vec<f64> = after.iter().zip(&before).map(|(a, b)| (a - b) / calls).collect();
        Cell {
            calls_per_second: measured.per_second(),
            p50_ms: measured.quantile_ms(0.5),
            p99_ms: measured.quantile_ms(0.99),
            errors: measured.errors,
            cpu_us_per_call: cpu_split.iter().sum(),
            cpu_split,
            storage_us_per_call: storage_used / calls,
            memory_mib: cgroups.iter().map(PodCgroup::memory_mib).sum(),
        }
    })
    .await
    .expect("cell")
}

/// The SDK server's pod, hardened as the restricted Pod Security Standard asks.
fn sdk_pod() -> Pod {
    let command = ["python3", "/opt/bench/pricing_server.py", &SDK_PORT.to_string(), "0.0.0.0"];
    toolyard_tests::restricted_pod("sdk-pricing", images::BENCH_SDK_PRICING, command.map(str::to_owned).to_vec())
}

/// Waits until one correct answer comes back from `endpoint`.
async fn wait_answers(endpoint: &loadgen::Endpoint, tool: &'static str, call: Call, what: &str) {
    let endpoint = endpoint.clone();
    wait_until(Duration::from_secs(120), what, || {
        let endpoint = endpoint.clone();
        async move {
            Ok(tokio::task::spawn_blocking(move || {
                loadgen::Connection::new(endpoint).post(&call.body(tool, 0)).is_ok_and(|a| call.counts(&a))
            })
            .await?)
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::var("TOOLYARD_BENCH_AGAINST").is_ok_and(|v| v == "service") {
        return against_service().await;
    }
    let (seconds, clients) = cells("1,8,32");
    let env = TestEnv::get();
    env.install_crds().await.expect("CRDs");
    let ns = env.namespace("bench-system").await.expect("namespace");
    let team = env.namespace("bench-team").await.expect("namespace");
    let mut made = Made { namespaces: vec![ns.clone(), team.clone()], release: None };
    for n in [&ns, &team] {
        kubectl(&["label", "namespace", n, "pod-security.kubernetes.io/enforce=restricted"]);
    }
    chart::deploy_dev_s3(&ns).unwrap_or_else(|e| panic!("{e:#}"));
    let sets = ["gateway.tls.plainHttp=true".to_owned(), format!("gateway.allowedHosts={{{GATEWAY_HOST}}}")];
    let release = made.release.insert(chart::install(&ns, &team, &sets).unwrap_or_else(|e| panic!("{e:#}")));

    // The example's tools, with price_option as a warm pool.
    kubectl(&["-n", &team, "apply", "-f", repo_path("examples/pricing/tools.yaml").to_str().expect("utf-8")]);
    let pool = r#"{"spec":{"execution":{"mode":"Pool","timeoutSeconds":30,
        "pool":{"replicas":1,"concurrency":2,"reuseProcess":true,"queue":64}}}}"#;
    kubectl(&["-n", &team, "patch", "mcptool", "price-option", "--type", "merge", "-p", pool]);
    chart::wait_tools_ready(&team).await.unwrap_or_else(|e| panic!("{e:#}"));

    // A caller: ServiceAccount quant with the chart's tool-caller role.
    let token = caller_token(&team, &release.name);

    let pods = Api::<Pod>::namespaced(env.client(User::Admin).await, &team);
    pods.create(&PostParams::default(), &sdk_pod()).await.expect("create the SDK server's pod");

    let gateway = running_pod(&ns, &format!("{}-gateway-", release.name)).await;
    let pool_pod = running_pod(&team, "price-option-pool-").await;
    let toolyard = Target {
        name: "Toolyard (gateway pod -> warm pool pod)",
        endpoint: loadgen::Endpoint::mcp(&format!("http://{}:8443/mcp", pod_ip(&gateway)), Some(&token))
            .with_host(GATEWAY_HOST),
        tool: "price_option",
        call: Call::Price,
        cgroups: vec![PodCgroup::of(&gateway), PodCgroup::of(&pool_pod)],
    };
    wait_answers(&toolyard.endpoint, toolyard.tool, toolyard.call, "the gateway's first priced answer").await;
    wait_until(Duration::from_secs(120), "the SDK server's pod running", || {
        let pods = pods.clone();
        async move { Ok(pods.get("sdk-pricing").await?.status.and_then(|s| s.phase).as_deref() == Some("Running")) }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    let sdk_pod = pods.get("sdk-pricing").await.expect("SDK pod");
    let sdk = Target {
        name: "Python SDK server (pod)",
        endpoint: loadgen::Endpoint::mcp(&format!("http://{}:{SDK_PORT}/mcp", pod_ip(&sdk_pod)), None),
        tool: "price_option",
        call: Call::Price,
        cgroups: vec![PodCgroup::of(&sdk_pod)],
    };
    wait_answers(&sdk.endpoint, sdk.tool, sdk.call, "the SDK server's first priced answer").await;

    let storage = PodCgroup::of(&running_pod(&ns, "toolyard-s3-").await);
    println!("\nprice_option on the test node, {seconds} s per cell (only answers with the right price count):");
    println!(
        "{:<42} {:>7} {:>10} {:>9} {:>9} {:>7} {:>12} {:>11} {:>11}",
        "server", "clients", "calls/s", "p50 ms", "p99 ms", "failed", "CPU µs/call", "S3 µs/call", "memory MiB"
    );
    let mut rows = Vec::new();
    for &n in &clients {
        let mut pair = Vec::new();
        for target in [&toolyard, &sdk] {
            let cell = run_cell(target, &storage, n, seconds).await;
            println!(
                "{:<42} {:>7} {:>10.0} {:>9.2} {:>9.2} {:>7} {:>12} {:>11.0} {:>11.1}",
                target.name,
                n,
                cell.calls_per_second,
                cell.p50_ms,
                cell.p99_ms,
                cell.errors,
                cell.cpu_split.iter().map(|us| format!("{us:.0}")).collect::<Vec<_>>().join("+"),
                cell.storage_us_per_call,
                cell.memory_mib
            );
            pair.push(cell);
        }
        rows.push((n, pair));
    }
    println!();
    for (n, pair) in &rows {
        let (ty, sdk) = (&pair[0], &pair[1]);
        println!(
            "clients {n}: Toolyard / SDK calls/s = {:.2}x; p99 {:.2}x; SDK / Toolyard CPU per call = {:.2}x \
             ({:.2}x with the S3 server's)",
            ty.calls_per_second / sdk.calls_per_second,
            ty.p99_ms / sdk.p99_ms,
            sdk.cpu_us_per_call / ty.cpu_us_per_call,
            sdk.cpu_us_per_call / (ty.cpu_us_per_call + ty.storage_us_per_call)
        );
    }
    drop(made);
}

/// The pods of `ns` whose names start with `prefix`, running and not being deleted.
async fn running_pods(ns: &str, prefix: &str) -> Vec<Pod> {
    let pods = Api::<Pod>::namespaced(TestEnv::get().client(User::Admin).await, ns);
    let list = pods.list(&ListParams::default()).await.expect("pods").items;
    list.into_iter()
        .filter(|p| {
            p.metadata.name.as_deref().is_some_and(|n| n.starts_with(prefix))
                && p.metadata.deletion_timestamp.is_none()
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        })
        .collect()
}

/// `TOOLYARD_BENCH_AGAINST=service`: a warm pool of two pods reached through its pods against
/// through its Service (see the module's comment).
async fn against_service() {
    let (seconds, clients) = cells("2,4,8");
    let queue: u32 = std::env::var("TOOLYARD_BENCH_POOL_QUEUE").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let env = TestEnv::get();
    env.install_crds().await.expect("CRDs");
    let ns = env.namespace("bench-system").await.expect("namespace");
    let pods_team = env.namespace("bench-pods").await.expect("namespace");
    let service_team = env.namespace("bench-service").await.expect("namespace");
    let mut made = Made { namespaces: vec![ns.clone(), pods_team.clone(), service_team.clone()], release: None };
    for n in [&ns, &pods_team, &service_team] {
        kubectl(&["label", "namespace", n, "pod-security.kubernetes.io/enforce=restricted"]);
    }
    chart::deploy_dev_s3(&ns).unwrap_or_else(|e| panic!("{e:#}"));
    let sets = [
        "gateway.tls.plainHttp=true".to_owned(),
        format!("gateway.allowedHosts={{{GATEWAY_HOST}}}"),
        format!("watchNamespaces={{{pods_team},{service_team}}}"),
    ];
    let release = made.release.insert(chart::install(&ns, &pods_team, &sets).unwrap_or_else(|e| panic!("{e:#}")));

    // Where the gateway may not read EndpointSlices, it calls the pool's Service, as before.
    let role = format!("{}-gateway", release.name);
    let mut gateway_role: serde_json::Value =
        serde_json::from_str(&kubectl(&["-n", &service_team, "get", "role", &role, "-o", "json"])).expect("Role");
    gateway_role["rules"]
        .as_array_mut()
        .expect("rules")
        .retain(|r| !r["resources"].as_array().is_some_and(|rs| rs.iter().any(|x| x == "endpointslices")));
    gateway_role["metadata"].as_object_mut().expect("metadata").remove("resourceVersion");
    let dir = toolyard_tests::local::TempDir::new("bench-role");
    let file = dir.path().join("role.json");
    std::fs::write(&file, gateway_role.to_string()).expect("role file");
    kubectl(&["-n", &service_team, "replace", "-f", file.to_str().expect("utf-8")]);

    // The misbehaving fixtures' `hang` as a warm pool of 2 pods: a function that takes 50 ms,
    // so that the pool's slots, not the gateway, bound the calls.
    let tool = |name: &str| {
        format!(
            "apiVersion: toolyard.dev/v1alpha1\nkind: McpTool\nmetadata:\n  name: hold\nspec:\n  name: {name}\n  \
             description: Sleep.\n  inputSchema:\n    type: object\n    properties: {{seconds: {{type: number}}}}\n  \
             runtime:\n    image: {}\n    command: [python3, -m, toolyard.run, \"misbehaving:hang\"]\n  \
             execution:\n    mode: Pool\n    timeoutSeconds: 30\n    \
             pool: {{replicas: 2, concurrency: 2, queue: {queue}, reuseProcess: true}}\n",
            images::MISBEHAVING
        )
    };
    for (team, name) in [(&pods_team, "hold"), (&service_team, "hold_via_service")] {
        let file = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&file, tool(name)).expect("tool file");
        kubectl(&["-n", team, "apply", "-f", file.to_str().expect("utf-8")]);
        chart::wait_tools_ready(team).await.unwrap_or_else(|e| panic!("{e:#}"));
    }
    // The gateway starts its EndpointSlice watches again, under the Roles as they are now.
    kubectl(&["-n", &ns, "rollout", "restart", &format!("deployment/{role}")]);
    kubectl(&["-n", &ns, "rollout", "status", &format!("deployment/{role}"), "--timeout=120s"]);

    let tokens = [caller_token(&pods_team, &release.name), caller_token(&service_team, &release.name)];
    let prefix = format!("{}-gateway-", release.name);
    wait_until(Duration::from_secs(120), "one gateway pod after the restart", || async {
        Ok(running_pods(&ns, &prefix).await.len() == 1)
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    let gateways = running_pods(&ns, &prefix).await;
    let gateway = &gateways[0];
    let mut targets = Vec::new();
    for (name, team, tool, token) in [
        ("gateway -> pool pods (EndpointSlice)", &pods_team, "hold", &tokens[0]),
        ("gateway -> pool Service (before)", &service_team, "hold_via_service", &tokens[1]),
    ] {
        let pool_pods = running_pods(team, "hold-pool-").await;
        assert_eq!(pool_pods.len(), 2, "two pool pods in {team}");
        let mut cgroups = vec![PodCgroup::of(gateway)];
        cgroups.extend(pool_pods.iter().map(PodCgroup::of));
        let endpoint = loadgen::Endpoint::mcp(&format!("http://{}:8443/mcp", pod_ip(gateway)), Some(token))
            .with_host(GATEWAY_HOST);
        wait_answers(&endpoint, tool, Call::Hold, &format!("the first answer of {tool}")).await;
        targets.push(Target { name, endpoint, tool, call: Call::Hold, cgroups });
    }
    let logs = kubectl(&["-n", &ns, "logs", &format!("deployment/{role}")]);
    assert!(logs.contains("EndpointSlice watch failed"), "the second namespace's watch is refused:\n{logs}");

    let storage = PodCgroup::of(&running_pod(&ns, "toolyard-s3-").await);
    println!(
        "\na {HOLD_SECONDS} s function on a warm pool of 2 pods x 2 slots, queue {queue}, {seconds} s per \
         cell (a refusal is an error):"
    );
    println!(
        "{:<38} {:>7} {:>10} {:>9} {:>9} {:>9} {:>9} {:>18}",
        "route", "clients", "calls/s", "errors/s", "p50 ms", "p99 ms", "errors", "CPU µs/call (gw+pods)"
    );
    let mut rows = Vec::new();
    for &n in &clients {
        let mut pair = Vec::new();
        for target in &targets {
            let cell = run_cell(target, &storage, n, seconds).await;
            println!(
                "{:<38} {:>7} {:>10.0} {:>9.1} {:>9.2} {:>9.2} {:>9} {:>18}",
                target.name,
                n,
                cell.calls_per_second,
                cell.errors as f64 / seconds,
                cell.p50_ms,
                cell.p99_ms,
                cell.errors,
                cell.cpu_split.iter().map(|us| format!("{us:.0}")).collect::<Vec<_>>().join("+"),
            );
            pair.push(cell);
        }
        rows.push((n, pair));
    }
    println!();
    for (n, pair) in &rows {
        let (pods, service) = (&pair[0], &pair[1]);
        println!(
            "clients {n}: pods / Service calls/s = {:.2}x; errors {} against {}; p99 Service / pods = {:.2}x",
            pods.calls_per_second / service.calls_per_second,
            pods.errors,
            service.errors,
            service.p99_ms / pods.p99_ms,
        );
    }
    drop(made);
}

/// Seconds per cell (`TOOLYARD_BENCH_SECONDS`, default 10) and the client counts
/// (`TOOLYARD_BENCH_CLIENTS`, else `default`).
fn cells(default: &str) -> (f64, Vec<usize>) {
    let seconds = std::env::var("TOOLYARD_BENCH_SECONDS").ok().and_then(|v| v.parse().ok()).unwrap_or(10.0);
    let clients = std::env::var("TOOLYARD_BENCH_CLIENTS")
        .unwrap_or_else(|_| default.into())
        .split(',')
        .map(|n| n.trim().parse().expect("TOOLYARD_BENCH_CLIENTS: numbers separated by commas"))
        .collect();
    (seconds, clients)
}

/// A caller: ServiceAccount `quant` of `team` with release `release`'s `tool-caller` role, and
/// a token of it for the gateway (audience `toolyard`).
fn caller_token(team: &str, release: &str) -> String {
    kubectl(&["-n", team, "create", "serviceaccount", "quant"]);
    let role = format!("--clusterrole={release}-tool-caller");
    let sa = format!("--serviceaccount={team}:quant");
    kubectl(&["-n", team, "create", "rolebinding", "quant-tool-caller", &role, &sa]);
    kubectl(&["-n", team, "create", "token", "quant", "--audience", "toolyard"]).trim().to_owned()
}

//! Benchmark (not a test): how fast ToolCalls become Jobs against the real apiserver.
//!
//! ```text
//! tests/cluster/build.sh && tests/cluster/cluster.sh start    # or an already running test cluster
//! cargo bench -p toolyard-controller --bench job_creation
//! ```
//!
//! Creates `TOOLYARD_BENCH_CALLS` (default 1000) ToolCalls at once (`TOOLYARD_BENCH_PARALLEL`
//! create requests in flight, default 64) in a fresh namespace of the test cluster, with the
//! controller running in this process (leader election off, default concurrency) and the real
//! Job controller of the test cluster creating the pods. Reports the time until every Job
//! exists and the distribution of ToolCall created -> Job created, both measured on this
//! machine's clock: "created" is when the apiserver answered the create request, "Job
//! created" when the Job's ADDED event arrived on a watch opened before the first create.
//! The namespace is deleted at the end.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher;
use serde_json::json;
use toolyard_api::{McpTool, ToolCall};
use toolyard_controller::{CancellationToken, Config, Controller};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The admin kubeconfig of the running test cluster (as `tests/cluster/cluster.sh` writes it).
fn kubeconfig_path() -> Result<PathBuf> {
    let run = std::env::var_os("TOOLYARD_CLUSTER_RUN")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("toolyard-cluster"));
    let env = std::fs::read_to_string(run.join("env")).with_context(|| {
        format!("no test cluster at {} (start one with tests/cluster/cluster.sh start)", run.display())
    })?;
    let dir = env
        .lines()
        .filter_map(|l| l.strip_prefix("export TOOLYARD_TEST_RUN="))
        .next()
        .context("TOOLYARD_TEST_RUN missing from the cluster env file")?;
    Ok(PathBuf::from(dir).join("admin.kubeconfig"))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

#[tokio::main]
async fn main() -> Result<()> {
    let calls = env_usize("TOOLYARD_BENCH_CALLS", 1000);
    let parallel = env_usize("TOOLYARD_BENCH_PARALLEL", 64);
    let kube_config =
        kube::Config::from_custom_kubeconfig(Kubeconfig::read_from(kubeconfig_path()?)?, &KubeConfigOptions::default())
            .await?;
    let client = kube::Client::try_from(kube_config.clone())?;

    // CRDs and a fresh namespace.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (_, crd) in toolyard_api::crdgen::all() {
        let name = crd.metadata.name.clone().context("crd name")?;
        crds.patch(&name, &PatchParams::apply("toolyard-bench").force(), &Patch::Apply(&crd)).await?;
    }
    let ns = format!("bench-jobs-{}", std::process::id());
    let namespace = Namespace {
        metadata: kube::api::ObjectMeta { name: Some(ns.clone()), ..Default::default() },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &namespace).await?;
    let result = run(&client, kube_config, &ns, calls, parallel).await;
    Api::<Namespace>::all(client.clone()).delete(&ns, &DeleteParams::background()).await?;
    result
}

async fn run(client: &kube::Client, kube_config: kube::Config, ns: &str, calls: usize, parallel: usize) -> Result<()> {
    // Wait for the namespace's default ServiceAccount (pods are refused before it exists).
    let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(client.clone(), ns);
    while sas.get_opt("default").await?.is_none() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let key_file = std::env::temp_dir().join(format!("toolyard-bench-key-{}", std::process::id()));
    std::fs::write(&key_file, "benchmark-key-benchmark-key-benchmark-key\n")?;
    let config = Config::from_args([
        "toolyard-controller",
        "--namespaces",
        ns,
        "--leader-elect",
        "false",
        "--metrics-addr",
        "127.0.0.1:0",
        "--token-key-file",
        key_file.to_str().context("key path")?,
        "--runner-image",
        "registry.example/toolyard-runner:bench",
    ])?;
    let controller = Controller::new(config, kube_config).await?;
    let metrics = controller.metrics();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(controller.run(shutdown.clone()));

    let tool: McpTool = serde_json::from_value(json!({
        "apiVersion": "toolyard.dev/v1alpha1", "kind": "McpTool", "metadata": {"name": "price-option"},
        "spec": {"name": "price_option", "description": "Price an option.", "inputSchema": {"type": "object"},
                 "runtime": {"image": "registry.example/pricing:bench", "command": ["python3", "-m", "toolyard.run"]}},
    }))?;
    Api::<McpTool>::namespaced(client.clone(), ns).create(&PostParams::default(), &tool).await?;

    // Watch Jobs from before the first create; record when each one appears.
    let seen: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let (synced_tx, synced_rx) = tokio::sync::oneshot::channel();
    let watch = {
        let seen = seen.clone();
        let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
        tokio::spawn(async move {
            let mut synced = Some(synced_tx);
            let mut events = std::pin::pin!(watcher(jobs, watcher::Config::default()));
            while let Some(event) = events.try_next().await.transpose() {
                let now = Instant::now();
                match event {
                    Ok(watcher::Event::InitDone) => {
                        if let Some(tx) = synced.take() {
                            let _ = tx.send(());
                        }
                    }
                    Ok(watcher::Event::Apply(job) | watcher::Event::InitApply(job)) => {
                        if let Some(name) = job.metadata.name {
                            seen.lock().expect("lock").entry(name).or_insert(now);
                        }
                    }
                    Ok(_) => {}
                    Err(e) => eprintln!("job watch: {e}"),
                }
            }
        })
    };
    synced_rx.await.context("job watch ended before it synced")?;

    println!("creating {calls} ToolCalls ({parallel} create requests in flight) in {ns}");
    let api: Api<ToolCall> = Api::namespaced(client.clone(), ns);
    let started = Instant::now();
    let created: Vec<(String, Instant)> = futures::stream::iter(0..calls)
        .map(|i| {
            let api = api.clone();
            async move {
                let name = format!("bench-{i:05}");
                let call: ToolCall = serde_json::from_value(json!({
                    "apiVersion": "toolyard.dev/v1alpha1", "kind": "ToolCall", "metadata": {"name": name},
                    "spec": {"tool": "price-option", "owner": {"issuer": "apikey", "user": "bench"},
                             "input": {"key": format!("owners/x/calls/{name}/input.json"), "sizeBytes": 2},
                             "timeoutSeconds": 600},
                }))?;
                api.create(&PostParams::default(), &call).await?;
                Ok::<_, anyhow::Error>((name, Instant::now()))
            }
        })
        .buffer_unordered(parallel)
        .try_collect()
        .await?;
    let all_created = started.elapsed();

    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        if seen.lock().expect("lock").len() >= calls {
            break;
        }
        if Instant::now() > deadline {
            bail!("only {} of {calls} Jobs after 10 minutes", seen.lock().expect("lock").len());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seen = seen.lock().expect("lock").clone();
    let last_job = seen.values().max().copied().unwrap_or(started);
    let mut latencies: Vec<Duration> = created
        .iter()
        .map(|(name, at)| seen.get(name).map(|s| s.saturating_duration_since(*at)).unwrap_or_default())
        .collect();
    latencies.sort();

    println!("all {calls} ToolCalls created after {}", ms(all_created));
    println!("all {calls} Jobs exist after          {} (from the first create request)", ms(last_job - started));
    println!(
        "ToolCall created -> Job created: p50 {}, p90 {}, p99 {}, max {}",
        ms(percentile(&latencies, 50.0)),
        ms(percentile(&latencies, 90.0)),
        ms(percentile(&latencies, 99.0)),
        ms(percentile(&latencies, 100.0)),
    );
    let text = metrics.encode();
    for line in text.lines().filter(|l| {
        l.starts_with("toolyard_controller_reconciles_total")
            || l.starts_with("toolyard_controller_status_writes_total")
            || l.starts_with("toolyard_controller_reconcile_duration_seconds_count")
            || l.starts_with("toolyard_controller_reconcile_duration_seconds_sum")
    }) {
        println!("  {line}");
    }

    shutdown.cancel();
    running.await??;
    watch.abort();
    let _ = std::fs::remove_file(&key_file);
    Ok(())
}

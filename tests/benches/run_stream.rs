//! Benchmark of a steady stream of runs through the controller (issue 24, runs; not a test).
//!
//! ```text
//! tests/cluster/cluster.sh start      # or an already running test cluster
//! cargo build --release -p toolyard-controller
//! cargo bench -p toolyard-tests --bench run_stream
//! ```
//!
//! `TOOLYARD_BENCH_CALLS` (default 10000) ToolCalls of a Job-mode tool are created at a steady
//! `TOOLYARD_BENCH_RATE` per second (default 20), not in one burst; before them, a hundredth as
//! many at the same rate, the baseline of the same run. Each size gets a namespace
//! of its own and a `toolyard-controller` process of its own (the release build, leader
//! election off, watching that namespace), whose CPU time and resident memory are read from
//! `/proc` and whose apiserver requests are read from its own client metrics
//! (`toolyard_controller_api_requests_total`).
//!
//! The pods do not run on the real node: at 20 pod starts a second the test cluster's one
//! 2-CPU node could not hold them (`node_jobs` measures Job mode there, one call at a time).
//! The namespaces are labelled `toolyard.dev/test-pods=unscheduled`, and this bench writes each
//! pod's status as a kubelet would: running at once, succeeded `TOOLYARD_BENCH_RUN_MS` later
//! (default 1000). Everything else is real: the apiserver, etcd, the Job controller, the
//! garbage collector, and the controller.
//!
//! Per size it reports:
//! - ToolCall created (the create request answered) -> Job created (its ADDED event on a
//!   watch opened before the first create), p50 and p99;
//! - the controller's CPU per run and its peak memory, its apiserver requests per run by verb
//!   and resource, and its reconcile errors;
//! - the objects present over time;
//! - a restart with every ToolCall present and finished (their retention is set to outlast the
//!   stream): the time from the new process's start to every ToolCall reconciled once, and the
//!   apiserver requests that cost (goal: lists and watches, no status write, no Job);
//! - cleanup: each finished ToolCall is deleted once its retention has passed; the lag beyond
//!   the retention, p50 and p99, of the deletions in the `TOOLYARD_BENCH_CLEANUP_SECONDS`
//!   (default 120) after the first shows whether deletion keeps the pace of finishing.
//!
//! The controller's retention is set to outlast the stream, so a run takes about twice the
//! stream's length. On a 2-CPU machine the apiserver saturates near 9 runs a second (it spends
//! about 100 ms of CPU on each run, see the per-process CPU line), so there a smaller stream
//! at a rate the machine holds shows the controller's own curve:
//! `TOOLYARD_BENCH_CALLS=5000 TOOLYARD_BENCH_RATE=8`.

#[path = "support/procs.rs"]
mod procs;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::TryStreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::{Value, json};
use toolyard_api::{McpTool, ToolCall};
use toolyard_tests::local::{TempDir, binary};
use toolyard_tests::{TestEnv, User};

fn env_parse<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// What the bench's watches saw, by ToolCall (= Job) name.
#[derive(Default)]
struct Seen {
    /// When the bench's create request was answered.
    created: HashMap<String, Instant>,
    /// When the Job's ADDED event arrived.
    jobs: HashMap<String, Instant>,
    jobs_gone: usize,
    /// When the ToolCall's `Succeeded` condition first turned True or False, its reason, and
    /// its `completionTime` (where its retention starts).
    finished: HashMap<String, (Instant, String, Option<k8s_openapi::jiff::Timestamp>)>,
    /// When the ToolCall's deletion arrived (wall clock, to compare with `completionTime`).
    deleted: HashMap<String, k8s_openapi::jiff::Timestamp>,
    /// Pods whose status this bench writes (as their kubelet).
    pods: HashSet<String>,
    pods_gone: usize,
    /// Errors of the watches, the creates and the pod status writes.
    errors: Vec<String>,
}

type Shared = Arc<Mutex<Seen>>;

fn lock(seen: &Shared) -> std::sync::MutexGuard<'_, Seen> {
    seen.lock().expect("lock")
}

/// A terminal `Succeeded` condition's reason.
fn finished_reason(call: &ToolCall) -> Option<String> {
    let status = call.status.as_ref()?;
    status.conditions.iter().find(|c| c.type_ == "Succeeded" && c.status != "Unknown").map(|c| c.reason.clone())
}

/// Runs a watch of `api` until the bench ends, feeding `on` every event; resolves once its
/// first list is in.
async fn watch<K, F>(api: Api<K>, seen: Shared, on: F) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    F: Fn(&Shared, watcher::Event<K>, Instant) + Send + 'static,
{
    let (synced_tx, synced_rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let mut synced = Some(synced_tx);
        let mut events = std::pin::pin!(watcher(api, watcher::Config::default()));
        while let Some(event) = events.try_next().await.transpose() {
            let now = Instant::now();
            match event {
                Ok(watcher::Event::InitDone) => {
                    if let Some(tx) = synced.take() {
                        let _ = tx.send(());
                    }
                }
                Ok(event) => on(&seen, event, now),
                Err(e) => lock(&seen).errors.push(format!("watch: {e}")),
            }
        }
    });
    let _ = synced_rx.await;
    task
}

/// Writes `pod`'s status as its kubelet would: running now, succeeded after `run`.
async fn play_kubelet(pods: Api<Pod>, pod: Pod, run: Duration, seen: Shared) {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let spec = pod.spec.unwrap_or_default();
    let now = || k8s_openapi::jiff::Timestamp::now().to_string();
    let terminated = |name: &str, image: &Option<String>| {
        json!({"name": name, "image": image, "imageID": "", "ready": false, "restartCount": 0, "started": false,
            "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now(), "finishedAt": now()}}})
    };
    let inits: Vec<Value> = spec.init_containers.iter().flatten().map(|c| terminated(&c.name, &c.image)).collect();
    let running: Vec<Value> = spec
        .containers
        .iter()
        .map(|c| {
            json!({"name": c.name, "image": c.image, "imageID": "", "ready": true, "restartCount": 0, "started": true,
                "state": {"running": {"startedAt": now()}}})
        })
        .collect();
    let status = |phase: &str, containers: Vec<Value>| {
        json!({"status": {"phase": phase, "startTime": now(),
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": if phase == "Running" { "True" } else { "False" }}],
            "initContainerStatuses": inits, "containerStatuses": containers}})
    };
    let write = |body: Value| {
        let pods = pods.clone();
        let name = name.clone();
        async move { pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(body)).await }
    };
    if let Err(e) = write(status("Running", running)).await {
        lock(&seen).errors.push(format!("pod {name} running: {e}"));
        return;
    }
    tokio::time::sleep(run).await;
    let done: Vec<Value> = spec.containers.iter().map(|c| terminated(&c.name, &c.image)).collect();
    if let Err(e) = write(status("Succeeded", done)).await {
        lock(&seen).errors.push(format!("pod {name} succeeded: {e}"));
    }
}

/// Makes the child of `command` get SIGKILL when this process ends, however it ends.
#[expect(unsafe_code, reason = "std has no safe call to ask for a parent-death signal")]
fn die_with_parent(command: &mut std::process::Command) {
    // SAFETY: prctl is async-signal-safe; the closure allocates nothing and takes no lock.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(command, || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// A `toolyard-controller` process watching one namespace.
struct ControllerProcess {
    child: procs::Killed,
    started: Instant,
    metrics_url: String,
}

impl ControllerProcess {
    fn start(ns: &str, dir: &Path, retention: Duration, log: &str) -> Result<Self> {
        let port = procs::free_port();
        let key = dir.join("token-key");
        std::fs::write(&key, "benchmark-key-benchmark-key-benchmark-key\n")?;
        let retention = retention.as_secs().to_string();
        let out = std::fs::File::create(dir.join(log))?;
        let mut command = std::process::Command::new(binary("toolyard-controller"));
        die_with_parent(&mut command);
        let child = command
            .args(["--namespaces", ns, "--leader-elect", "false", "--runner-image", "registry.example/runner:bench"])
            .args(["--metrics-addr", &format!("127.0.0.1:{port}"), "--token-key-file"])
            .arg(&key)
            .args(["--toolcall-retention-seconds", &retention, "--job-ttl-seconds", &retention])
            .env("KUBECONFIG", TestEnv::get().kubeconfig(User::Admin))
            .env("RUST_LOG", "warn")
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .context("starting toolyard-controller")?;
        Ok(Self {
            child: procs::Killed(child, None),
            started: Instant::now(),
            metrics_url: format!("http://127.0.0.1:{port}"),
        })
    }

    fn pid(&self) -> u32 {
        self.child.0.id()
    }

    async fn wait_ready(&self, http: &reqwest::Client) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            let ready = http.get(format!("{}/readyz", self.metrics_url)).send().await;
            if ready.is_ok_and(|r| r.status().is_success()) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("the controller was not ready after 60 s")
    }

    async fn metrics(&self, http: &reqwest::Client) -> Result<Metrics> {
        let text = http.get(format!("{}/metrics", self.metrics_url)).send().await?.text().await?;
        Ok(Metrics::parse(&text))
    }

    /// SIGTERM, then waits for the process to exit.
    fn stop(mut self) -> Result<()> {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid() as i32), nix::sys::signal::Signal::SIGTERM)?;
        self.child.0.wait()?;
        Ok(())
    }
}

/// The controller metrics the bench reads.
#[derive(Clone, Default)]
struct Metrics {
    /// `verb resource` -> requests (every response code).
    requests: BTreeMap<String, f64>,
    /// ToolCall reconciles by result.
    reconciles: BTreeMap<String, f64>,
}

impl Metrics {
    fn parse(text: &str) -> Self {
        let mut m = Metrics::default();
        for line in text.lines() {
            let Some((series, value)) = line.rsplit_once(' ') else { continue };
            let Ok(value) = value.parse::<f64>() else { continue };
            let label = |name: &str| {
                let start = series.find(&format!("{name}=\""))? + name.len() + 2;
                Some(series[start..].split('"').next()?.to_owned())
            };
            if series.starts_with("toolyard_controller_api_requests_total{") {
                let key = format!("{} {}", label("verb").unwrap_or_default(), label("resource").unwrap_or_default());
                *m.requests.entry(key).or_default() += value;
            } else if series.starts_with("toolyard_controller_reconciles_total{")
                && label("kind").as_deref() == Some("ToolCall")
            {
                *m.reconciles.entry(label("result").unwrap_or_default()).or_default() += value;
            }
        }
        m
    }

    fn reconcile_errors(&self) -> u64 {
        self.reconciles.iter().filter(|(r, _)| r.as_str() != "ok").map(|(_, v)| *v as u64).sum()
    }

    fn reconciles(&self) -> u64 {
        self.reconciles.values().map(|v| *v as u64).sum()
    }

    /// Requests since `before`, by `verb resource`, without the zero ones.
    fn since(&self, before: &Metrics) -> BTreeMap<String, f64> {
        self.requests
            .iter()
            .map(|(k, v)| (k.clone(), v - before.requests.get(k).copied().unwrap_or_default()))
            .filter(|(_, v)| *v > 0.0)
            .collect()
    }
}

/// The test cluster's processes whose CPU the bench reports beside the controller's.
const CLUSTER_PARTS: [&str; 3] = ["kube-apiserver", "etcd", "kube-controller-manager"];

/// CPU seconds so far of the test cluster's `part` (its pid file), if it runs on this machine.
fn cluster_cpu(part: &str) -> Option<f64> {
    let run = toolyard_tests::env_file().parent()?.to_path_buf();
    let pid: u32 = std::fs::read_to_string(run.join("pids").join(part)).ok()?.trim().parse().ok()?;
    std::path::Path::new(&format!("/proc/{pid}")).exists().then(|| procs::cpu_seconds(pid))
}

/// Busy and total CPU time of the whole machine so far, in clock ticks (`/proc/stat`).
fn machine_ticks() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<f64> =
        stat.lines().next().unwrap_or_default().split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
    let total: f64 = fields.iter().take(8).sum();
    let idle = fields.get(3).copied().unwrap_or_default() + fields.get(4).copied().unwrap_or_default();
    (total - idle, total)
}

/// CPU use over a stretch of time: per process (seconds) and the machine's busy share.
struct CpuWatch {
    start: Vec<(&'static str, f64)>,
    machine: (f64, f64),
}

impl CpuWatch {
    fn start(controller: u32) -> Self {
        Self { start: Self::now(controller), machine: machine_ticks() }
    }

    fn now(controller: u32) -> Vec<(&'static str, f64)> {
        let mut parts =
            vec![("controller", procs::cpu_seconds(controller)), ("bench", procs::cpu_seconds(std::process::id()))];
        parts.extend(CLUSTER_PARTS.iter().filter_map(|p| Some((*p, cluster_cpu(p)?))));
        parts
    }

    /// CPU seconds per process since the start, and the machine's busy share.
    fn since(&self, controller: u32) -> (Vec<(&'static str, f64)>, f64) {
        let now = Self::now(controller);
        let used = now
            .iter()
            .filter_map(|(name, cpu)| Some((*name, cpu - self.start.iter().find(|(n, _)| n == name)?.1)))
            .collect();
        let machine = machine_ticks();
        (used, (machine.0 - self.machine.0) / (machine.1 - self.machine.1).max(1.0))
    }
}

fn quantile(values: &mut [Duration], q: f64) -> Duration {
    values.sort();
    if values.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

fn secs(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{:.0} ms", d.as_secs_f64() * 1000.0)
    } else {
        format!("{:.2} s", d.as_secs_f64())
    }
}

fn show(requests: &BTreeMap<String, f64>, per: f64) -> String {
    requests.iter().map(|(k, v)| format!("{k} {:.2}", v / per)).collect::<Vec<_>>().join(", ")
}

/// One size's figures.
struct Report {
    calls: usize,
    to_job_p50: Duration,
    to_job_p99: Duration,
    cpu_per_run_ms: f64,
    machine_busy: f64,
    peak_rss: u64,
    requests_per_run: f64,
    reconcile_errors: u64,
    reconciles_per_run: f64,
    restart_objects: usize,
    resync: Duration,
    restart_requests: BTreeMap<String, f64>,
    /// Finished (seen by the bench) -> deleted, less the retention, in seconds.
    cleanup_lag_p50: f64,
    cleanup_lag_p99: f64,
}

async fn phase(calls: usize, rate: f64, run: Duration) -> Result<Report> {
    let env = TestEnv::get();
    env.install_crds().await?;
    let client = env.client(User::Admin).await;
    let ns = env.namespace("bench-stream").await?;
    let result = phase_in(&client, &ns, calls, rate, run).await;
    Api::<Namespace>::all(client.clone()).delete(&ns, &DeleteParams::background()).await?;
    result
}

async fn phase_in(client: &kube::Client, ns: &str, calls: usize, rate: f64, run: Duration) -> Result<Report> {
    let env = TestEnv::get();
    env.kubectl_as(User::Admin, &["label", "namespace", ns, "toolyard.dev/test-pods=unscheduled"])?;
    let tool: McpTool = serde_json::from_value(json!({
        "apiVersion": "toolyard.dev/v1alpha1", "kind": "McpTool", "metadata": {"name": "price-option"},
        "spec": {"name": "price_option", "description": "Price an option.", "inputSchema": {"type": "object"},
                 "runtime": {"image": "registry.example/pricing:bench", "command": ["python3", "-m", "toolyard.run"]}},
    }))?;
    Api::<McpTool>::namespaced(client.clone(), ns).create(&PostParams::default(), &tool).await?;

    let seen: Shared = Arc::default();
    let calls_api: Api<ToolCall> = Api::namespaced(client.clone(), ns);
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut watches = vec![
        watch(Api::<Job>::namespaced(client.clone(), ns), seen.clone(), |seen, event, now| match event {
            watcher::Event::Apply(job) | watcher::Event::InitApply(job) => {
                lock(seen).jobs.entry(job.metadata.name.unwrap_or_default()).or_insert(now);
            }
            watcher::Event::Delete(_) => lock(seen).jobs_gone += 1,
            _ => {}
        })
        .await,
        watch(calls_api.clone(), seen.clone(), |seen, event, now| match event {
            watcher::Event::Apply(call) | watcher::Event::InitApply(call) => {
                if let Some(reason) = finished_reason(&call) {
                    let completed = call.status.as_ref().and_then(|s| s.completion_time.as_ref()).map(|t| t.0);
                    lock(seen)
                        .finished
                        .entry(call.metadata.name.unwrap_or_default())
                        .or_insert((now, reason, completed));
                }
            }
            watcher::Event::Delete(call) => {
                let now = k8s_openapi::jiff::Timestamp::now();
                lock(seen).deleted.entry(call.metadata.name.unwrap_or_default()).or_insert(now);
            }
            _ => {}
        })
        .await,
    ];
    let kubelet_api = pods_api.clone();
    watches.push(
        watch(pods_api, seen.clone(), move |seen, event, _| match event {
            watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) => {
                let name = pod.metadata.name.clone().unwrap_or_default();
                if lock(seen).pods.insert(name) {
                    tokio::spawn(play_kubelet(kubelet_api.clone(), pod, run, seen.clone()));
                }
            }
            watcher::Event::Delete(_) => lock(seen).pods_gone += 1,
            _ => {}
        })
        .await,
    );

    // The retention outlasts the stream, so that the restart finds every ToolCall present;
    // afterwards they go at the pace they finished.
    let stream = Duration::from_secs_f64(calls as f64 / rate);
    let retention = Duration::from_secs((stream.as_secs_f64() * 1.2) as u64 + 60);
    let dir = TempDir::new("bench-stream");
    let http = reqwest::Client::new();
    let controller = ControllerProcess::start(ns, dir.path(), retention, "controller-1.log")?;
    controller.wait_ready(&http).await?;
    let before = controller.metrics(&http).await?;
    let cpu_watch = CpuWatch::start(controller.pid());

    // The stream, and a sample of memory and objects every 5 s meanwhile.
    println!("{calls} ToolCalls at {rate}/s in {ns} (retention {} s)", retention.as_secs());
    let started = Instant::now();
    let peak_rss = Arc::new(Mutex::new(0u64));
    let sampler = {
        let (seen, peak_rss, pid) = (seen.clone(), peak_rss.clone(), controller.pid());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(5));
            let mut last_print = Instant::now() - Duration::from_secs(60);
            loop {
                tick.tick().await;
                let rss = procs::rss_bytes(pid);
                let mut peak = peak_rss.lock().expect("lock");
                *peak = (*peak).max(rss);
                if last_print.elapsed() >= Duration::from_secs(60) {
                    last_print = Instant::now();
                    let s = lock(&seen);
                    println!(
                        "  t={:>4.0} s  created {:>5}  finished {:>5}  present: ToolCalls {:>5}, Jobs {:>5}, pods {:>5}  controller RSS {:.1} MiB",
                        started.elapsed().as_secs_f64(),
                        s.created.len(),
                        s.finished.len(),
                        s.created.len() - s.deleted.len(),
                        s.jobs.len().saturating_sub(s.jobs_gone),
                        s.pods.len().saturating_sub(s.pods_gone),
                        rss as f64 / 1048576.0
                    );
                }
            }
        })
    };
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    let mut creates = tokio::task::JoinSet::new();
    for i in 0..calls {
        tick.tick().await;
        let (api, seen) = (calls_api.clone(), seen.clone());
        creates.spawn(async move {
            let name = format!("run-{i:05}");
            let call: ToolCall = serde_json::from_value(json!({
                "apiVersion": "toolyard.dev/v1alpha1", "kind": "ToolCall", "metadata": {"name": name},
                "spec": {"tool": "price-option", "owner": {"issuer": "apikey", "user": "bench"},
                         "input": {"key": format!("owners/x/calls/{name}/input.json"), "sizeBytes": 2},
                         "timeoutSeconds": 600},
            }))
            .expect("a ToolCall");
            match api.create(&PostParams::default(), &call).await {
                Ok(_) => {
                    lock(&seen).created.insert(name, Instant::now());
                }
                Err(e) => lock(&seen).errors.push(format!("create {name}: {e}")),
            }
        });
    }
    creates.join_all().await;
    let created_in = started.elapsed();
    let patience = stream.max(Duration::from_secs(300));
    let deadline = Instant::now() + patience;
    while lock(&seen).finished.len() < calls {
        if Instant::now() > deadline {
            bail!("{} of {calls} ToolCalls finished {patience:?} after the last create", lock(&seen).finished.len());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (cpu_by_part, machine_busy) = cpu_watch.since(controller.pid());
    let cpu = cpu_by_part.iter().find(|(n, _)| *n == "controller").map(|(_, c)| *c).unwrap_or_default();
    println!(
        "  CPU per run: {}; the machine's CPUs were {:.0}% busy",
        cpu_by_part
            .iter()
            .map(|(n, c)| format!("{n} {:.1} ms", c * 1000.0 / calls as f64))
            .collect::<Vec<_>>()
            .join(", "),
        machine_busy * 100.0
    );
    let after = controller.metrics(&http).await?;
    let stream_requests = after.since(&before);
    let reconcile_errors = after.reconcile_errors();
    println!(
        "  created in {}, all finished after {}; reconciles {:?}",
        secs(created_in),
        secs(started.elapsed()),
        after.reconciles
    );
    println!("  apiserver requests per run: {}", show(&stream_requests, calls as f64));

    // Restart with every ToolCall present (the peak memory is the first process's).
    sampler.abort();
    let restart_objects = {
        let s = lock(&seen);
        s.created.len() - s.deleted.len()
    };
    controller.stop()?;
    let controller = ControllerProcess::start(ns, dir.path(), retention, "controller-2.log")?;
    controller.wait_ready(&http).await?;
    let resync = loop {
        let m = controller.metrics(&http).await?;
        if m.reconciles() >= restart_objects as u64 {
            break controller.started.elapsed();
        }
        if controller.started.elapsed() > Duration::from_secs(300) {
            bail!("the restarted controller reconciled {:?} of {restart_objects} ToolCalls in 300 s", m.reconciles);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Anything the restart redoes would show within seconds of the resync.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let restarted = controller.metrics(&http).await?;
    let restart_requests = restarted.since(&Metrics::default());
    println!(
        "  restart with {restart_objects} ToolCalls: every one reconciled {} after the process started; requests: {}",
        secs(resync),
        show(&restart_requests, 1.0)
    );

    // Cleanup at the pace of finishing: the deletions of a window after the first one (the
    // namespace's deletion removes the rest).
    let window = Duration::from_secs(env_parse("TOOLYARD_BENCH_CLEANUP_SECONDS", 120));
    let deadline = Instant::now() + retention + Duration::from_secs(300);
    while lock(&seen).deleted.is_empty() {
        if Instant::now() > deadline {
            bail!("no ToolCall deleted {} s after its retention", 300);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let window_end = Instant::now() + window;
    while lock(&seen).deleted.len() < calls && Instant::now() < window_end {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let final_metrics = controller.metrics(&http).await?;
    controller.stop()?;
    for w in watches {
        w.abort();
    }

    let s = lock(&seen);
    if !s.errors.is_empty() {
        bail!("{} errors, the first: {:?}", s.errors.len(), &s.errors[..s.errors.len().min(5)]);
    }
    let outcomes: HashSet<&str> = s.finished.values().map(|(_, r, _)| r.as_str()).collect();
    if outcomes != HashSet::from(["Succeeded"]) {
        bail!("outcomes other than Succeeded: {outcomes:?}");
    }
    let mut to_job: Vec<Duration> = s
        .created
        .iter()
        .map(|(name, at)| s.jobs.get(name).map(|j| j.saturating_duration_since(*at)).unwrap_or_default())
        .collect();
    let mut lag: Vec<f64> = s
        .deleted
        .iter()
        .filter_map(|(name, at)| {
            let completed = s.finished.get(name)?.2?;
            Some(at.duration_since(completed).as_secs_f64() - retention.as_secs_f64())
        })
        .collect();
    lag.sort_by(f64::total_cmp);
    let lag_at = |q: f64| lag.get(((q * lag.len() as f64).ceil() as usize).clamp(1, lag.len().max(1)) - 1).copied();
    Ok(Report {
        calls,
        to_job_p50: quantile(&mut to_job, 0.5),
        to_job_p99: quantile(&mut to_job, 0.99),
        cpu_per_run_ms: cpu * 1000.0 / calls as f64,
        machine_busy,
        peak_rss: *peak_rss.lock().expect("lock"),
        requests_per_run: stream_requests.values().sum::<f64>() / calls as f64,
        reconcile_errors: reconcile_errors + final_metrics.reconcile_errors(),
        reconciles_per_run: after.reconciles() as f64 / calls as f64,
        restart_objects,
        resync,
        restart_requests: restart_requests.clone(),
        cleanup_lag_p50: lag_at(0.5).unwrap_or_default(),
        cleanup_lag_p99: lag_at(0.99).unwrap_or_default(),
    })
}

#[tokio::main]
async fn main() -> Result<()> {
    let calls: usize = env_parse("TOOLYARD_BENCH_CALLS", 10_000);
    let rate: f64 = env_parse("TOOLYARD_BENCH_RATE", 20.0);
    let run = Duration::from_millis(env_parse("TOOLYARD_BENCH_RUN_MS", 1000));
    let small = phase((calls / 100).max(1), rate, run).await?;
    let large = phase(calls, rate, run).await?;

    println!();
    println!(
        "| ToolCalls | created -> Job p50 | p99 | machine CPU busy | controller CPU per run | peak RSS | apiserver requests per run | reconciles per run | reconcile errors | restart: ToolCalls present | resync | restart requests | finished -> deleted, less the retention, p50 | p99 |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in [&small, &large] {
        println!(
            "| {} | {} | {} | {:.0}% | {:.2} ms | {:.1} MiB | {:.2} | {:.1} | {} | {} | {} | {} | {:.0} ms | {:.0} ms |",
            r.calls,
            secs(r.to_job_p50),
            secs(r.to_job_p99),
            r.machine_busy * 100.0,
            r.cpu_per_run_ms,
            r.peak_rss as f64 / 1048576.0,
            r.requests_per_run,
            r.reconciles_per_run,
            r.reconcile_errors,
            r.restart_objects,
            secs(r.resync),
            r.restart_requests.values().sum::<f64>(),
            r.cleanup_lag_p50 * 1000.0,
            r.cleanup_lag_p99 * 1000.0
        );
    }
    let ratio = |a: f64, b: f64| if b > 0.0 { format!("{:.2}x", a / b) } else { "-".to_owned() };
    println!(
        "| ratio | {} | {} | | {} | {} | {} | {} | | | {} | {} | | |",
        ratio(large.to_job_p50.as_secs_f64(), small.to_job_p50.as_secs_f64()),
        ratio(large.to_job_p99.as_secs_f64(), small.to_job_p99.as_secs_f64()),
        ratio(large.cpu_per_run_ms, small.cpu_per_run_ms),
        ratio(large.peak_rss as f64, small.peak_rss as f64),
        ratio(large.requests_per_run, small.requests_per_run),
        ratio(large.reconciles_per_run, small.reconciles_per_run),
        ratio(large.resync.as_secs_f64(), small.resync.as_secs_f64()),
        ratio(large.restart_requests.values().sum(), small.restart_requests.values().sum()),
    );
    for r in [&small, &large] {
        // Work redone for a finished run would be a status write, a Job or a Secret; deletions
        // are retentions coming due.
        let redone: f64 = ["patch toolcalls/status", "patch jobs", "create secrets", "create events"]
            .iter()
            .filter_map(|k| r.restart_requests.get(*k))
            .fold(0.0, |a, b| a + b);
        println!("restart at {} ToolCalls: {} (work redone: {redone:.0})", r.calls, show(&r.restart_requests, 1.0));
    }
    Ok(())
}

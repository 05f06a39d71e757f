//! Benchmark of many connected clients (issue 24, connections; not a test): 1,000 MCP clients
//! of the 2026-07-28 revision, a third of them holding a `subscriptions/listen` stream and the
//! rest calling a tool now and then, against the gateway and against the official Python SDK
//! server under the same load.
//!
//! `cargo bench -p toolyard-tests --bench connections` (needs the test cluster and the Python
//! venv with `mcp`; see tests/run.sh). `TOOLYARD_BENCH_CLIENTS` sets the clients (default
//! 1000), `TOOLYARD_BENCH_SECONDS` the steady phase (default 20), `TOOLYARD_BENCH_CALL_EVERY_MS`
//! the time between one caller's calls (default 2000).
//!
//! Each server is measured alone, in a process of its own:
//! - its resident memory with one warm client, then with every caller connected (each has
//!   made one call and keeps its connection), then with every listener's stream open too:
//!   memory per connection and per stream;
//! - the steady phase: each caller calls `price_option` every interval (spread evenly) while
//!   the streams stay open; calls/s, p50 and p99 latency, the server's CPU per call, and calls
//!   that failed (every answer is checked, and each listener's stream must still be open).
//!
//! With `--features dhat-heap`, the gateway runs on dhat's allocator instead, and writes what
//! its heap holds once every listener's stream is open to `dhat-heap.json` (in the current
//! folder; read it with dhat's viewer). The figures of such a run are not comparable.
//!
//! The gateway is the benches' `serve`-built gateway (`support/gateway_role.rs`: TokenReview
//! and SubjectAccessReview with their caches, an executor that answers at once) serving one
//! McpTool; the clients are alice, as one user standing in for many (the role lifts the
//! per-user limits). The Python server is `python/fastmcp_server.py` (MCPServer, stateless,
//! JSON answers; a listen stream is SSE there as here). The load runs in this process with
//! rmcp clients, one HTTP connection pool each; the servers' figures are read from /proc.

#[path = "support/gateway_role.rs"]
mod gateway_role;
#[path = "../tests/gateway_support/mod.rs"]
mod gateway_support;
// Only its `Measured` (quantiles and rate of a cell's latencies).
#[path = "support/loadgen.rs"]
#[allow(dead_code)]
mod loadgen;
#[path = "support/procs.rs"]
mod procs;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::DeleteParams;
use rmcp::model::{CallToolRequestParams, ClientConfig, ProtocolVersion, SubscriptionFilter};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientLifecycleMode, ClientServiceExt, RoleClient};
use serde_json::json;
use toolyard_tests::{TestEnv, User, repo_path};

use procs::{Killed, ROLE, cpu_seconds, env_number, exit_when_stdin_closes, free_port, python_with_mcp, rss_bytes};

/// The allocator `toolyard-gateway` runs with (see its `main.rs`), for the gateway role.
#[cfg(not(feature = "dhat-heap"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[cfg(feature = "dhat-heap")]
#[global_allocator]
static ALLOCATOR: dhat::Alloc = dhat::Alloc;

/// The gateway role's heap profile, with the `dhat-heap` feature: the role profiles its heap
/// from the start and writes it when the bench creates the file [`HEAP_TRIGGER_VAR`] names; it then
/// removes that file.
#[cfg(feature = "dhat-heap")]
mod heap_profile {
    use std::path::{Path, PathBuf};
    use std::time::Duration;

    /// In the role: profiles from now on, and writes the profile when triggered.
    pub fn start() {
        let trigger = PathBuf::from(std::env::var(super::HEAP_TRIGGER_VAR).expect("trigger path"));
        let profiler = dhat::Profiler::builder().trim_backtraces(Some(24)).build();
        std::thread::spawn(move || {
            while !trigger.exists() {
                std::thread::sleep(Duration::from_millis(100));
            }
            drop(profiler);
            std::fs::remove_file(&trigger).expect("remove the trigger");
        });
    }

    /// In the bench: has the role write its profile now, and waits until it has.
    pub async fn write(trigger: &Path) {
        std::fs::write(trigger, b"").expect("trigger");
        while trigger.exists() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        eprintln!("the gateway's heap with its streams open is in dhat-heap.json");
    }
}

const NAMESPACES_VAR: &str = "TOOLYARD_BENCH_NAMESPACES";
/// The file whose creation has the gateway role write its heap profile (`dhat-heap` feature).
const HEAP_TRIGGER_VAR: &str = "TOOLYARD_BENCH_HEAP_TRIGGER";
/// Clients connecting at once while the load is set up.
const CONNECT_CONCURRENCY: usize = 32;

type Client = RunningService<RoleClient, ClientConfig>;

fn main() {
    if std::env::var_os(ROLE).is_some() {
        exit_when_stdin_closes();
        #[cfg(feature = "dhat-heap")]
        heap_profile::start();
        gateway_role::run(&std::env::var(NAMESPACES_VAR).expect("namespaces"), false);
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    runtime.block_on(run_benchmark());
}

/// A 2026-07-28 client of `url`, with `token` if any.
async fn connect(url: &str, token: Option<&str>) -> Client {
    let mut config = StreamableHttpClientTransportConfig::with_uri(url.to_owned());
    if let Some(token) = token {
        config = config.auth_header(token.to_owned());
    }
    // rmcp's default HTTP client keeps no idle connection (a new one per request); the Python
    // SDK's httpx and the TypeScript SDK's fetch keep theirs, so each client here does too, and
    // a caller holds its connection between calls.
    let http = reqwest::Client::new();
    let transport = StreamableHttpClientTransport::with_client(http, config);
    let mode = ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] };
    ClientConfig::default().serve_with_lifecycle(transport, mode).await.expect("MCP client connects")
}

fn price_call(x: f64) -> CallToolRequestParams {
    CallToolRequestParams::new("price_option").with_arguments(json!({"x": x}).as_object().cloned().unwrap_or_default())
}

/// Calls `price_option` and checks the answer; the latency, or `None` when it failed.
async fn call(client: &Client, x: f64) -> Option<Duration> {
    let started = Instant::now();
    let result = client.call_tool(price_call(x)).await.ok()?;
    // The gateway answers with structured content; the Python server's `-> dict` function
    // with the same JSON as text.
    let value = result
        .structured_content
        .clone()
        .or_else(|| result.content.first().and_then(|c| c.as_text()).and_then(|t| serde_json::from_str(&t.text).ok()));
    let answered = value.as_ref().and_then(|v| v.get("echo")).and_then(|e| e.get("x"));
    (result.is_error != Some(true) && answered == Some(&json!(x))).then(|| started.elapsed())
}

/// The sockets process `pid` has open (its connections among them).
fn open_sockets(pid: u32) -> usize {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).expect("the server's fds");
    fds.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with("socket:"))
        .count()
}

/// One server's figures.
struct Figures {
    per_connection_kib: f64,
    per_stream_kib: f64,
    rss_mib: f64,
    per_second: f64,
    p50_ms: f64,
    p99_ms: f64,
    cpu_ms: f64,
    failed: u64,
    streams_lost: usize,
}

/// Loads the server at `url` (process `pid`) and measures it.
async fn measure(url: &str, token: Option<&str>, pid: u32, clients: usize, heap_trigger: Option<&Path>) -> Figures {
    let listeners = clients / 3;
    let callers = clients - listeners;
    let warm = connect(url, token).await;
    if call(&warm, 1.0).await.is_none() {
        panic!("a first call failed: {:?}", warm.call_tool(price_call(1.0)).await);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle = rss_bytes(pid);
    let sockets_idle = open_sockets(pid);

    let connected: Vec<Client> = futures::stream::iter(0..callers)
        .map(|i| async move {
            let client = connect(url, token).await;
            call(&client, i as f64).await.expect("a caller's first call");
            client
        })
        .buffer_unordered(CONNECT_CONCURRENCY)
        .collect()
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let with_callers = rss_bytes(pid);
    // The figure per connection means something only if the callers hold theirs.
    let held = open_sockets(pid).saturating_sub(sockets_idle);
    assert!(held >= callers, "{callers} callers hold only {held} connections to the server");

    let filter = SubscriptionFilter::builder().tools_list_changed().build();
    let listening: Vec<(Client, rmcp::service::Subscription)> = futures::stream::iter(0..listeners)
        .map(|_| {
            let filter = filter.clone();
            async move {
                let client = connect(url, token).await;
                let subscription = client.listen(filter).await.expect("subscriptions/listen");
                (client, subscription)
            }
        })
        .buffer_unordered(CONNECT_CONCURRENCY)
        .collect()
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let with_streams = rss_bytes(pid);
    #[cfg(feature = "dhat-heap")]
    if let Some(trigger) = heap_trigger {
        heap_profile::write(trigger).await;
    }
    #[cfg(not(feature = "dhat-heap"))]
    let _ = heap_trigger;

    let every = Duration::from_millis(env_number("TOOLYARD_BENCH_CALL_EVERY_MS", 2000.0) as u64);
    let seconds = Duration::from_secs_f64(env_number("TOOLYARD_BENCH_SECONDS", 20.0));
    let failed = Arc::new(AtomicU64::new(0));
    let cpu_before = cpu_seconds(pid);
    let started = Instant::now();
    let connected = Arc::new(connected);
    let tasks: Vec<_> = (0..callers)
        .map(|i| {
            let (connected, failed) = (connected.clone(), failed.clone());
            tokio::spawn(async move {
                // Callers are spread evenly over the interval.
                tokio::time::sleep(every.mul_f64(i as f64 / callers as f64)).await;
                let mut ticks = tokio::time::interval(every);
                let mut latencies = Vec::new();
                while started.elapsed() < seconds {
                    ticks.tick().await;
                    match call(&connected[i], i as f64).await {
                        Some(latency) => latencies.push(latency),
                        None => {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.expect("caller"));
    }
    let cpu = cpu_seconds(pid) - cpu_before;
    latencies.sort();
    let measured = loadgen::Measured { latencies, errors: failed.load(Ordering::Relaxed), elapsed: started.elapsed() };

    // Every stream is still open: nothing arrives on it, and it has not ended.
    let mut listening = listening;
    let mut streams_lost = 0;
    for (_, subscription) in &mut listening {
        if tokio::time::timeout(Duration::from_millis(5), subscription.next()).await.is_ok() {
            streams_lost += 1;
        }
    }
    let rss = rss_bytes(pid);
    for (client, mut subscription) in listening {
        subscription.cancel().await.ok();
        client.cancel().await.ok();
    }
    let connected = Arc::try_unwrap(connected).unwrap_or_else(|_| panic!("callers still running"));
    for client in connected {
        client.cancel().await.ok();
    }
    warm.cancel().await.ok();
    let kib = |bytes: u64, n: usize| bytes as f64 / 1024.0 / n.max(1) as f64;
    Figures {
        per_connection_kib: kib(with_callers.saturating_sub(idle), callers),
        per_stream_kib: kib(with_streams.saturating_sub(with_callers), listeners),
        rss_mib: rss as f64 / 1024.0 / 1024.0,
        per_second: measured.per_second(),
        p50_ms: measured.quantile_ms(0.50),
        p99_ms: measured.quantile_ms(0.99),
        cpu_ms: cpu * 1000.0 / measured.latencies.len().max(1) as f64,
        failed: measured.errors,
        streams_lost,
    }
}

async fn run_benchmark() {
    let clients = env_number("TOOLYARD_BENCH_CLIENTS", 1000.0) as usize;
    let env = TestEnv::get();
    env.install_crds().await.expect("CRDs");
    let ns = env.namespace("connections").await.expect("namespace");
    gateway_support::grant_platform(&ns).await;
    gateway_support::create_tool(&ns, "price-option", gateway_support::spec("price_option", 60), true).await;
    gateway_support::grant_call(&ns, "alice-calls", &[], &["alice"], &[]).await;
    gateway_support::wait_allowed("alice", &[], &ns, "toolyard.dev", "mcptools", "call", Some("price-option")).await;

    let exe = std::env::current_exe().expect("exe");
    let heap_trigger = std::env::temp_dir().join(format!("toolyard-heap-trigger-{}", std::process::id()));
    let trigger = heap_trigger.to_str().expect("a UTF-8 temp folder");
    let (gateway, addr) =
        procs::spawn_server(&exe, "gateway", &[(NAMESPACES_VAR, ns.as_str()), (HEAP_TRIGGER_VAR, trigger)]);
    let url = format!("http://{addr}/mcp");
    let gateway_figures =
        measure(&url, Some(env.token(User::Alice)), gateway.0.id(), clients, Some(&heap_trigger)).await;
    drop(gateway);

    let port = free_port();
    let python = Command::new(python_with_mcp())
        .arg(repo_path("tests/benches/python/fastmcp_server.py"))
        .arg(port.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("python server");
    let python = Killed(python, None);
    let url = format!("http://127.0.0.1:{port}/mcp");
    for _ in 0..300 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let python_figures = measure(&url, None, python.0.id(), clients, None).await;
    drop(python);
    let namespaces: Api<Namespace> = Api::all(env.client(User::Admin).await);
    let _ = namespaces.delete(&ns, &DeleteParams::background()).await;

    let listeners = clients / 3;
    println!(
        "\n{clients} clients: {} calling every {} ms, {listeners} holding a subscriptions/listen stream",
        clients - listeners,
        env_number("TOOLYARD_BENCH_CALL_EVERY_MS", 2000.0)
    );
    println!(
        "| server | memory per connection | memory per stream | RSS loaded | calls/s | p50 ms | p99 ms | CPU per call | failed | streams lost |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (name, f) in [("toolyard-gateway", &gateway_figures), ("python-sdk (MCPServer)", &python_figures)] {
        println!(
            "| {name} | {:.1} KiB | {:.1} KiB | {:.1} MiB | {:.0} | {:.2} | {:.2} | {:.3} ms | {} | {} |",
            f.per_connection_kib,
            f.per_stream_kib,
            f.rss_mib,
            f.per_second,
            f.p50_ms,
            f.p99_ms,
            f.cpu_ms,
            f.failed,
            f.streams_lost
        );
    }
    let ratio = |g: f64, p: f64| if p > 0.0 { format!("{:.3}x", g / p) } else { "n/a".into() };
    println!(
        "\ngateway / python: memory per connection {}, per stream {}, CPU per call {}, p99 {}",
        ratio(gateway_figures.per_connection_kib, python_figures.per_connection_kib),
        ratio(gateway_figures.per_stream_kib, python_figures.per_stream_kib),
        ratio(gateway_figures.cpu_ms, python_figures.cpu_ms),
        ratio(gateway_figures.p99_ms, python_figures.p99_ms),
    );
}

//! Benchmark of the catalog at scale (issue 24; not a test): `tools/list` and `tools/call`
//! with 50, 500 and 5,000 McpTools across 50 namespaces, for a user whose RBAC allows a tenth
//! of them by `resourceNames`.
//!
//! `cargo bench -p toolyard-tests --bench catalog_scale` (needs the test cluster and the Python
//! venv with `mcp`; see tests/run.sh). `TOOLYARD_BENCH_SIZES` (like `50,5000`) picks the sizes,
//! `TOOLYARD_BENCH_SECONDS` the time per cell (default 5).
//!
//! For each size, in namespaces of its own on the test cluster's apiserver: the tools (a
//! schema and description like a real function's), and in each namespace a Role granting
//! `alice` verb `call` on the tenth of its tools whose number ends in 0. A gateway as `serve`
//! builds it (`support/gateway_role.rs`: TokenReview, SubjectAccessReview with its cache, an
//! executor that answers at once) is started fresh for the size, in a process of its own, and
//! measured:
//! - **first listing**: alice walks every page of `tools/list` on the fresh gateway — the
//!   time, the pages, and the SubjectAccessReviews it cost (from the gateway's `/metrics`);
//! - **cached listing**: one page of `tools/list` (the first), at 1 and 8 clients, with the
//!   decisions cached: calls/s, p50, p99 and the gateway's CPU per request;
//! - **call**: `tools/call` of an allowed tool at 8 clients;
//! - the gateway's resident memory after the cells.
//!
//! The official Python SDK server (MCPServer, stateless, JSON answers) serving as many tools
//! (`python/fastmcp_server.py PORT N`) is measured listing them (it lists all in one answer,
//! with no authorization) and calling one. The ratios compare each size with the smallest, in
//! the same run; the gateway's p50 and CPU per request against the Python server's.

#[path = "support/gateway_role.rs"]
mod gateway_role;
#[path = "../tests/gateway_support/mod.rs"]
mod gateway_support;
#[path = "support/loadgen.rs"]
mod loadgen;
#[path = "support/procs.rs"]
mod procs;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use gateway_support::{grant_call, grant_platform};
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::{Value, json};
use toolyard_api::McpTool;
use toolyard_tests::{TestEnv, User, repo_path};

use procs::{Killed, ROLE, cpu_seconds, exit_when_stdin_closes, free_port, python_with_mcp, rss_bytes};

/// The allocator `toolyard-gateway` runs with (see its `main.rs`), for the gateway role.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const NAMESPACES_VAR: &str = "TOOLYARD_BENCH_NAMESPACES";
/// Namespaces the tools of a size are spread over.
const NAMESPACES: usize = 50;
/// Tools and status writes sent to the apiserver at once while setting a size up.
const SETUP_CONCURRENCY: usize = 16;

fn main() {
    if std::env::var_os(ROLE).is_some() {
        exit_when_stdin_closes();
        gateway_role::run(&std::env::var(NAMESPACES_VAR).expect("namespaces"), true);
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    runtime.block_on(run_benchmark());
}

/// The MCP name of tool number `k`.
fn tool_name(k: usize) -> String {
    format!("tool_{k:05}")
}

/// Tool `k`'s McpTool: a schema and a description of a realistic size.
fn manifest(ns: &str, k: usize) -> McpTool {
    serde_json::from_value(json!({
        "apiVersion": "toolyard.dev/v1alpha1", "kind": "McpTool",
        "metadata": {"name": format!("tool-{k:05}"), "namespace": ns},
        "spec": {
            "name": tool_name(k),
            "title": format!("Catalog tool {k}"),
            "description": format!(
                "Catalog tool {k}: prices an instrument of the book from its market data and returns the value \
                 with its sensitivities. Used by the catalog benchmark."
            ),
            "inputSchema": {
                "type": "object",
                "properties": {
                    "x": {"type": "number", "description": "The instrument's notional."},
                    "label": {"type": "string", "description": "A label echoed back.", "maxLength": 64},
                    "currency": {"type": "string", "enum": ["USD", "EUR", "GBP", "JPY"]},
                },
                "required": ["x"],
                "additionalProperties": false
            },
            "runtime": {"image": "registry.example/bench:1", "command": ["run"]}
        }
    }))
    .expect("McpTool")
}

/// Creates `size` tools over [`NAMESPACES`] new namespaces, marked Ready, and grants alice a
/// tenth of them; returns the namespaces.
async fn set_up(env: &TestEnv, size: usize) -> Vec<String> {
    let mut namespaces = Vec::new();
    for i in 0..NAMESPACES {
        let ns = env.namespace(&format!("cat{size}-{i}")).await.expect("namespace");
        grant_platform(&ns).await;
        namespaces.push(ns);
    }
    let per_namespace = size / NAMESPACES;
    let admin = env.client(User::Admin).await;
    let controller = env.client(User::Controller).await;
    let work: Vec<(String, usize)> = (0..size).map(|k| (namespaces[k / per_namespace].clone(), k)).collect();
    futures::stream::iter(work)
        .map(|(ns, k)| {
            let (admin, controller) = (admin.clone(), controller.clone());
            async move {
                let created = Api::<McpTool>::namespaced(admin, &ns)
                    .create(&PostParams::default(), &manifest(&ns, k))
                    .await
                    .expect("create McpTool");
                let generation = created.metadata.generation;
                let ready = toolyard_api::conditions::ready(
                    toolyard_api::conditions::status::TRUE,
                    toolyard_api::conditions::reason::VALID,
                    "set by the bench",
                    generation,
                );
                let status = json!({
                    "apiVersion": "toolyard.dev/v1alpha1", "kind": "McpTool",
                    "status": {"conditions": [ready], "observedGeneration": generation}
                });
                Api::<McpTool>::namespaced(controller, &ns)
                    .patch_status(
                        &format!("tool-{k:05}"),
                        &kube::api::PatchParams::apply(toolyard_api::CONTROLLER_MANAGER).force(),
                        &kube::api::Patch::Apply(status),
                    )
                    .await
                    .expect("status");
            }
        })
        .buffer_unordered(SETUP_CONCURRENCY)
        .collect::<Vec<()>>()
        .await;
    for (i, ns) in namespaces.iter().enumerate() {
        let allowed: Vec<String> = (i * per_namespace..(i + 1) * per_namespace)
            .filter(|k| k % 10 == 0)
            .map(|k| format!("tool-{k:05}"))
            .collect();
        if !allowed.is_empty() {
            let names: Vec<&str> = allowed.iter().map(String::as_str).collect();
            grant_call(ns, "alice-calls", &names, &["alice"], &[]).await;
        }
    }
    // RBAC takes a moment to apply: wait for the last grant.
    let last = (size - 1) / 10 * 10;
    let (ns, name) = (&namespaces[last / per_namespace], format!("tool-{last:05}"));
    gateway_support::wait_allowed("alice", &[], ns, "toolyard.dev", "mcptools", "call", Some(&name)).await;
    namespaces
}

async fn tear_down(env: &TestEnv, namespaces: &[String]) {
    let api: Api<Namespace> = Api::all(env.client(User::Admin).await);
    for ns in namespaces {
        let _ = api.delete(ns, &DeleteParams::background()).await;
    }
}

fn list_body(id: u64, cursor: Option<&str>) -> Vec<u8> {
    match cursor {
        Some(c) => json!({"jsonrpc": "2.0", "id": id, "method": "tools/list", "params": {"cursor": c}}),
        None => json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"}),
    }
    .to_string()
    .into_bytes()
}

fn call_body(id: u64) -> Vec<u8> {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"tool_00000","arguments":{{"x":1.5}}}}}}"#
    )
    .into_bytes()
}

/// A successful JSON-RPC result that is not a tool error.
fn succeeded(answer: &loadgen::Answer) -> bool {
    answer
        .json_text()
        .and_then(|text| serde_json::from_str::<Value>(text).ok())
        .is_some_and(|reply| reply.get("result").is_some_and(|r| r["isError"] != json!(true)))
}

/// Results of one cell.
struct Cell {
    per_second: f64,
    p50_ms: f64,
    p99_ms: f64,
    cpu_ms: f64,
    errors: u64,
}

async fn run_cell(
    endpoint: &loadgen::Endpoint,
    pid: u32,
    clients: usize,
    seconds: f64,
    body: fn(u64) -> Vec<u8>,
) -> Cell {
    let endpoint = endpoint.clone();
    tokio::task::spawn_blocking(move || {
        let before = cpu_seconds(pid);
        let measured = loadgen::run(&endpoint, clients, seconds, body, succeeded);
        let cpu = cpu_seconds(pid) - before;
        let n = measured.latencies.len() as f64;
        Cell {
            per_second: measured.per_second(),
            p50_ms: measured.quantile_ms(0.50),
            p99_ms: measured.quantile_ms(0.99),
            cpu_ms: if n > 0.0 { cpu * 1000.0 / n } else { f64::NAN },
            errors: measured.errors,
        }
    })
    .await
    .expect("cell")
}

/// Walks every page of `tools/list`: the catalog tools seen, the pages, the time, and the
/// entries of the first page (built-ins included).
async fn walk_pages(endpoint: &loadgen::Endpoint) -> (usize, usize, Duration, usize) {
    let endpoint = endpoint.clone();
    tokio::task::spawn_blocking(move || {
        let mut connection = loadgen::Connection::new(endpoint);
        let (mut tools, mut pages, mut cursor, mut first_page) = (0, 0, None::<String>, 0);
        let started = Instant::now();
        loop {
            let answer = connection.post(&list_body(pages as u64, cursor.as_deref())).expect("tools/list");
            let reply: Value = serde_json::from_str(answer.json_text().expect("JSON")).expect("JSON");
            let result = &reply["result"];
            assert!(result.is_object(), "{reply}");
            let listed = result["tools"].as_array().expect("tools");
            if pages == 0 {
                first_page = listed.len();
            }
            tools += listed.iter().filter(|t| t["name"].as_str().is_some_and(|n| n.starts_with("tool_"))).count();
            pages += 1;
            match result["nextCursor"].as_str() {
                Some(next) => cursor = Some(next.to_owned()),
                None => break,
            }
        }
        (tools, pages, started.elapsed(), first_page)
    })
    .await
    .expect("walk")
}

/// SubjectAccessReviews the gateway at `addr` has sent, from its `/metrics`.
async fn reviews_sent(addr: &str) -> u64 {
    let text = reqwest::get(format!("http://{addr}/metrics")).await.expect("metrics").text().await.expect("text");
    text.lines()
        .find_map(|l| l.strip_prefix("toolyard_gateway_authz_reviews_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// The figures of one size.
struct Size {
    size: usize,
    first_walk: Duration,
    first_pages: usize,
    first_tools: usize,
    first_page: usize,
    first_reviews: u64,
    list1: Cell,
    list8: Cell,
    call8: Cell,
    cached_reviews: u64,
    rss: u64,
    python_list8: Cell,
    python_call8: Cell,
    python_rss: u64,
}

async fn measure(env: &TestEnv, size: usize, seconds: f64) -> Size {
    let started = Instant::now();
    let namespaces = set_up(env, size).await;
    eprintln!("size {size}: set up in {:.1} s", started.elapsed().as_secs_f64());
    let exe = std::env::current_exe().expect("exe");
    let (gateway, addr) = procs::spawn_server(&exe, "gateway", &[(NAMESPACES_VAR, namespaces.join(",").as_str())]);
    let pid = gateway.0.id();
    let endpoint = loadgen::Endpoint::mcp(&format!("http://{addr}/mcp"), Some(env.token(User::Alice)));

    let before = reviews_sent(&addr).await;
    let (first_tools, first_pages, first_walk, first_page) = walk_pages(&endpoint).await;
    let first_reviews = reviews_sent(&addr).await - before;
    assert_eq!(first_tools, size / 10, "alice sees a tenth of the tools");

    let before = reviews_sent(&addr).await;
    let list1 = run_cell(&endpoint, pid, 1, seconds, |id| list_body(id, None)).await;
    let list8 = run_cell(&endpoint, pid, 8, seconds, |id| list_body(id, None)).await;
    let call8 = run_cell(&endpoint, pid, 8, seconds, call_body).await;
    let cached_reviews = reviews_sent(&addr).await - before;
    let rss = rss_bytes(pid);
    drop(gateway);

    let port = free_port();
    let python = Command::new(python_with_mcp())
        .arg(repo_path("tests/benches/python/fastmcp_server.py"))
        .arg(port.to_string())
        .arg(size.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("python server");
    let python = Killed(python, None);
    let python_endpoint = loadgen::Endpoint::mcp(&format!("http://127.0.0.1:{port}/mcp"), None);
    wait_answering(&python_endpoint).await;
    let python_pid = python.0.id();
    let python_list8 = run_cell(&python_endpoint, python_pid, 8, seconds, |id| list_body(id, None)).await;
    let python_call8 = run_cell(&python_endpoint, python_pid, 8, seconds, call_body).await;
    let python_rss = rss_bytes(python_pid);
    drop(python);
    tear_down(env, &namespaces).await;
    Size {
        size,
        first_walk,
        first_pages,
        first_tools,
        first_page,
        first_reviews,
        list1,
        list8,
        call8,
        cached_reviews,
        rss,
        python_list8,
        python_call8,
        python_rss,
    }
}

async fn wait_answering(endpoint: &loadgen::Endpoint) {
    for _ in 0..300 {
        let endpoint = endpoint.clone();
        let ready = tokio::task::spawn_blocking(move || {
            loadgen::Connection::new(endpoint).post(&list_body(0, None)).is_ok_and(|a| succeeded(&a))
        });
        if ready.await.expect("probe") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the Python server did not answer tools/list");
}

async fn run_benchmark() {
    let seconds: f64 = std::env::var("TOOLYARD_BENCH_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(5.0);
    let sizes: Vec<usize> = match std::env::var("TOOLYARD_BENCH_SIZES") {
        Ok(list) => list.split(',').map(|s| s.trim().parse().expect("TOOLYARD_BENCH_SIZES: numbers")).collect(),
        Err(_) => vec![50, 500, 5000],
    };
    assert!(sizes.iter().all(|s| *s >= NAMESPACES && s % NAMESPACES == 0), "sizes are multiples of {NAMESPACES}");
    let env = TestEnv::get();
    env.install_crds().await.expect("CRDs");
    let mut results = Vec::new();
    for &size in &sizes {
        results.push(measure(env, size, seconds).await);
    }

    println!(
        "# Catalog at scale ({seconds} s per cell, {} CPUs; alice may call a tenth of the tools)",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!();
    println!(
        "| tools | first walk: pages, s, SARs | list page 1 client: /s, p50, p99 ms, CPU ms | list page 8 clients: /s, \
         p50, p99 ms, CPU ms | call 8 clients: /s, p50, p99 ms, CPU ms | SARs while cached | gateway RSS MB | \
         Python list 8: /s, p50 ms, CPU ms | Python call 8: /s, p50 ms, CPU ms | Python RSS MB | errors |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &results {
        let cell = |c: &Cell| format!("{:.0}, {:.2}, {:.2}, {:.3}", c.per_second, c.p50_ms, c.p99_ms, c.cpu_ms);
        println!(
            "| {} | {} ({} tools), {:.2} s, {} | {} | {} | {} | {} | {:.1} | {:.0}, {:.2}, {:.3} | {:.0}, {:.2}, {:.3} | {:.1} | {} |",
            r.size,
            r.first_pages,
            r.first_tools,
            r.first_walk.as_secs_f64(),
            r.first_reviews,
            cell(&r.list1),
            cell(&r.list8),
            cell(&r.call8),
            r.cached_reviews,
            r.rss as f64 / 1e6,
            r.python_list8.per_second,
            r.python_list8.p50_ms,
            r.python_list8.cpu_ms,
            r.python_call8.per_second,
            r.python_call8.p50_ms,
            r.python_call8.cpu_ms,
            r.python_rss as f64 / 1e6,
            r.list1.errors + r.list8.errors + r.call8.errors + r.python_list8.errors + r.python_call8.errors,
        );
    }
    let Some(base) = results.first() else { return };
    println!();
    println!("Ratios against {} tools (the same run), and against the Python SDK server at the same size:", base.size);
    println!();
    println!(
        "| tools | entries on page 1 | list page CPU / at {0} (8 clients) | CPU per listed entry / at {0} | list page \
         p50 / at {0} | call CPU / at {0} | first-walk SARs per tool | Python list CPU / gateway list-page CPU | Python \
         call CPU / gateway call CPU |",
        base.size
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let per_entry = |r: &Size| r.list8.cpu_ms / r.first_page as f64;
    for r in &results {
        println!(
            "| {} | {} | {:.2}x | {:.2}x | {:.2}x | {:.2}x | {:.2} | {:.1}x | {:.1}x |",
            r.size,
            r.first_page,
            r.list8.cpu_ms / base.list8.cpu_ms,
            per_entry(r) / per_entry(base),
            r.list8.p50_ms / base.list8.p50_ms,
            r.call8.cpu_ms / base.call8.cpu_ms,
            r.first_reviews as f64 / r.size as f64,
            r.python_list8.cpu_ms / r.list8.cpu_ms,
            r.python_call8.cpu_ms / r.call8.cpu_ms,
        );
    }
}

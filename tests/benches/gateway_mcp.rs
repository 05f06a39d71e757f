//! Benchmark of the gateway's MCP layer against the official Python SDK server (not a test).
//!
//! `cargo bench -p toolyard-tests --bench gateway_mcp` (needs the test cluster and the Python
//! venv with `mcp`; see tests/run.sh). Measures calls/s, p50/p99 latency and server CPU per
//! call of `tools/list` and `tools/call` at 1, 8 and 32 concurrent clients against:
//!
//! - the gateway as `serve` builds it (tools from McpTool objects on the real apiserver,
//!   bearer authentication by TokenReview with its cache, RBAC by SubjectAccessReview with its
//!   cache) in its own process, with an executor that answers at once — this measures the
//!   gateway, not a tool run (the end-to-end figure belongs to the local mode);
//! - the Python SDK's MCPServer (FastMCP) serving a function of the same shape, stateless with
//!   JSON responses, no authentication;
//! - the transport floor: a bare axum server answering a fixed JSON-RPC body (no MCP, no
//!   authentication), to show what the load generator and HTTP allow on this machine.
//!
//! The load generator is this Rust program (`support/loadgen.rs`: one thread per client, each
//! with one keep-alive HTTP/1.1 connection and blocking I/O, sending its next request when the
//! previous answer is complete). Server CPU is read from
//! `/proc/<pid>/stat` of each server process. `TOOLYARD_BENCH_SECONDS` sets the time per
//! cell (default 5); `TOOLYARD_BENCH_OPS` (like `tools/call`) and `TOOLYARD_BENCH_CLIENTS`
//! (like `1,8`) run only some cells, for profiling one of them. `TOOLYARD_BENCH_ROUNDS` runs
//! every cell that many times, the servers one after the other in each round; the ratios are
//! the median of the rounds' ratios, which keeps a change of load on a shared machine from
//! landing on one server only. `TOOLYARD_BENCH_NODE` (`idle`, `busy` or `both`, the default)
//! measures each round on an idle machine, whose CPUs halt between requests, and on a busy one,
//! where a `SCHED_IDLE` thread per CPU keeps them from halting (see
//! [`run_idle_spinner_process`]): at one client, waking a halted virtual CPU is a large part of
//! a fast server's round trip. `TOOLYARD_BENCH_BASELINE_EXE` names another build of this bench
//! (`target/release/deps/gateway_mcp-*`) whose gateway is measured too, in the same rounds, to
//! compare two builds of the gateway. `TOOLYARD_BENCH_TRACING=1` also measures the gateway with
//! OTLP export on (every call's spans sent to the test cluster's trace store, Jaeger), in the
//! same rounds, for the cost of tracing.

#[path = "support/gateway_role.rs"]
mod gateway_role;
#[path = "../tests/gateway_support/mod.rs"]
mod gateway_support;
#[path = "support/loadgen.rs"]
mod loadgen;
#[path = "support/procs.rs"]
mod procs;

use std::process::{Command, Stdio};
use std::time::Duration;

use gateway_support::{create_tool, grant_call, grant_platform};
use serde_json::json;
use toolyard_tests::{TestEnv, User, repo_path};

use procs::{Killed, ROLE, cpu_seconds, exit_when_stdin_closes, free_port, median, python_with_mcp, spawn_role};

/// The allocator `toolyard-gateway` runs with (see its `main.rs`), for the gateway role.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const NAMESPACE: &str = "TOOLYARD_BENCH_NAMESPACE";

fn main() {
    if std::env::var_os(ROLE).is_some() {
        exit_when_stdin_closes();
    }
    match std::env::var(ROLE).as_deref() {
        Ok("gateway") => return gateway_role::run(&std::env::var(NAMESPACE).expect("namespace"), false),
        Ok("floor") => return run_floor_process(),
        Ok("idle-spinner") => return run_idle_spinner_process(),
        _ => {}
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    runtime.block_on(run_benchmark());
}

/// The transport floor: a bare axum server (same runtime, same HTTP stack as the gateway)
/// that answers every POST with a fixed JSON-RPC result — no MCP, no authentication. Its
/// row shows what the load generator and HTTP on this machine allow; no server can beat it.
fn run_floor_process() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        const ANSWER: &str = r#"{"jsonrpc":"2.0","id":1,"result":{"content":[],"isError":false}}"#;
        let router = axum::Router::new().route(
            "/mcp",
            axum::routing::post(|body: bytes::Bytes| async move {
                let _ = body.len();
                ([(http::header::CONTENT_TYPE, "application/json")], ANSWER)
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        println!("listening on {}", listener.local_addr().expect("addr"));
        axum::serve(listener, router).await.expect("serve");
    });
}

/// Keeps every CPU from halting while the servers are measured "on a busy node": one thread per
/// CPU that spins under `SCHED_IDLE`, the policy whose threads run only when no other thread
/// wants the CPU and give it up the moment one does.
///
/// On an idle virtual machine a CPU with nothing to run halts, and waking it again (an
/// interrupt to a halted virtual CPU) adds tens of microseconds to every hand-over between
/// the client and the server. At one client that is a large part of a fast server's round
/// trip and a small part of a slow one's. On a node running other work the CPUs do not halt;
/// these threads stand in for that work without taking CPU time from the servers.
#[expect(unsafe_code, reason = "std has no call to set a thread's scheduling policy")]
fn run_idle_spinner_process() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sets the calling thread's policy; `param` is valid for the call. Threads spawned
    // below inherit the policy.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } != 0 {
        panic!("SCHED_IDLE: {}", std::io::Error::last_os_error());
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("spinning on {cpus} CPUs");
    let spinners: Vec<_> = (0..cpus)
        .map(|_| {
            std::thread::spawn(|| {
                loop {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    for spinner in spinners {
        spinner.join().ok();
    }
}

/// The state of the machine's CPUs while a round of cells is measured.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Node {
    /// Nothing else runs: CPUs halt between requests.
    Idle,
    /// [`run_idle_spinner_process`] keeps the CPUs from halting.
    Busy,
}

impl Node {
    fn name(self) -> &'static str {
        match self {
            Node::Idle => "idle",
            Node::Busy => "busy",
        }
    }

    /// `TOOLYARD_BENCH_NODE`: `idle`, `busy` or `both` (the default).
    fn from_env() -> Vec<Node> {
        match std::env::var("TOOLYARD_BENCH_NODE").as_deref() {
            Ok("idle") => vec![Node::Idle],
            Ok("busy") => vec![Node::Busy],
            Ok("both") | Err(_) => vec![Node::Idle, Node::Busy],
            Ok(other) => panic!("TOOLYARD_BENCH_NODE: `{other}` is none of idle, busy, both"),
        }
    }
}

/// One server under test.
struct Target {
    name: &'static str,
    url: String,
    token: Option<String>,
    pid: u32,
}

impl Target {
    fn endpoint(&self) -> loadgen::Endpoint {
        loadgen::Endpoint::mcp(&self.url, self.token.as_deref())
    }
}

/// One measured cell of a round.
struct Row {
    round: usize,
    node: Node,
    server: &'static str,
    op: &'static str,
    clients: usize,
    cell: Cell,
}

/// Results of one cell.
struct Cell {
    calls_per_second: f64,
    p50_ms: f64,
    p99_ms: f64,
    cpu_ms_per_call: f64,
    errors: u64,
}

/// The request body of `op`. Formatted directly: at one client, the load generator's time
/// per request is part of every round trip it measures.
fn body(op: &str, id: u64) -> Vec<u8> {
    match op {
        "tools/list" => format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/list"}}"#),
        _ => format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"price_option","arguments":{{"x":1.5}}}}}}"#
        ),
    }
    .into_bytes()
}

/// What [`succeeded`] reads of an answer; serde skips every other field without building it.
#[derive(serde::Deserialize)]
struct Reply {
    result: Option<ReplyResult>,
}

#[derive(serde::Deserialize)]
struct ReplyResult {
    #[serde(rename = "isError")]
    is_error: Option<bool>,
}

/// A successful JSON-RPC result that is not a tool error. Read into [`Reply`] rather than a
/// `serde_json::Value`, which would allocate the whole answer on every round trip.
fn succeeded(answer: &loadgen::Answer) -> bool {
    answer
        .json_text()
        .and_then(|text| serde_json::from_str::<Reply>(text).ok())
        .is_some_and(|reply| reply.result.is_some_and(|r| r.is_error != Some(true)))
}

async fn run_cell(target: &Target, op: &'static str, clients: usize, seconds: f64) -> Cell {
    let endpoint = target.endpoint();
    let pid = target.pid;
    tokio::task::spawn_blocking(move || {
        let cpu_before = cpu_seconds(pid);
        let measured = loadgen::run(&endpoint, clients, seconds, move |id| body(op, id), succeeded);
        let cpu = cpu_seconds(pid) - cpu_before;
        let n = measured.latencies.len() as f64;
        Cell {
            calls_per_second: measured.per_second(),
            p50_ms: measured.quantile_ms(0.50),
            p99_ms: measured.quantile_ms(0.99),
            cpu_ms_per_call: if n > 0.0 { cpu * 1000.0 / n } else { f64::NAN },
            errors: measured.errors,
        }
    })
    .await
    .expect("cell")
}

/// This program again in `role`, with its address read from its first line.
fn spawn_self(role: &str, namespace: &str) -> (Killed, String) {
    spawn_exe(&std::env::current_exe().expect("exe"), role, namespace)
}

/// A build of this bench (this one or `TOOLYARD_BENCH_BASELINE_EXE`) in `role`.
fn spawn_exe(exe: &std::path::Path, role: &str, namespace: &str) -> (Killed, String) {
    procs::spawn_server(exe, role, &[(NAMESPACE, namespace)])
}

/// [`run_idle_spinner_process`] in a process of its own (its CPU is no server's), running once
/// this returns.
fn spawn_idle_spinner() -> Killed {
    let (child, line) = spawn_role(&std::env::current_exe().expect("exe"), "idle-spinner", &[]);
    assert!(line.starts_with("spinning"), "spinner: {line}");
    child
}

async fn wait_ready(target: &Target) {
    for _ in 0..300 {
        let endpoint = target.endpoint();
        let ready = tokio::task::spawn_blocking(move || {
            loadgen::Connection::new(endpoint).post(&body("tools/list", 0)).is_ok_and(|a| succeeded(&a))
        });
        if ready.await.expect("probe") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{} did not answer tools/list", target.name);
}

async fn run_benchmark() {
    let seconds: f64 = std::env::var("TOOLYARD_BENCH_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(5.0);
    let env = TestEnv::get();
    env.install_crds().await.expect("CRDs");
    let ns = env.namespace("gwbench").await.expect("namespace");
    grant_platform(&ns).await;
    let spec = json!({
        "name": "price_option",
        "description": "Echo the argument (benchmark)",
        "inputSchema": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]},
        "runtime": {"image": "registry.example/bench:1", "command": ["run"]}
    });
    create_tool(&ns, "price-option", spec, true).await;
    grant_call(&ns, "alice-calls", &["price-option"], &["alice"], &[]).await;
    gateway_support::wait_allowed("alice", &[], &ns, "toolyard.dev", "mcptools", "call", Some("price-option")).await;

    let (gateway_child, addr) = spawn_self("gateway", &ns);
    let gateway = Target {
        name: "toolyard-gateway",
        url: format!("http://{addr}/mcp"),
        token: Some(env.token(User::Alice).to_owned()),
        pid: gateway_child.0.id(),
    };
    let (floor_child, addr) = spawn_self("floor", &ns);
    let floor =
        Target { name: "floor-bare-axum", url: format!("http://{addr}/mcp"), token: None, pid: floor_child.0.id() };

    // The Python SDK server.
    let port = free_port();
    let python = Command::new(python_with_mcp())
        .arg(repo_path("tests/benches/python/fastmcp_server.py"))
        .arg(port.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("python server");
    let fastmcp = Target {
        name: "python-sdk-fastmcp",
        url: format!("http://127.0.0.1:{port}/mcp"),
        token: None,
        pid: python.id(),
    };
    let _python_child = Killed(python, None);

    let mut targets = vec![gateway, fastmcp, floor];
    // Another build of this bench, serving as the gateway to compare against (A/B in one run).
    let baseline_child = std::env::var_os("TOOLYARD_BENCH_BASELINE_EXE").map(|exe| {
        let (child, addr) = spawn_exe(std::path::Path::new(&exe), "gateway", &ns);
        targets.push(Target {
            name: "baseline-gateway",
            url: format!("http://{addr}/mcp"),
            token: Some(env.token(User::Alice).to_owned()),
            pid: child.0.id(),
        });
        child
    });
    // The same gateway with its spans exported to the test cluster's trace store.
    let traced_child = std::env::var("TOOLYARD_BENCH_TRACING").is_ok_and(|v| v == "1").then(|| {
        let otlp = env.var("TOOLYARD_TEST_OTLP_ENDPOINT");
        let exe = std::env::current_exe().expect("exe");
        let (child, addr) =
            procs::spawn_server(&exe, "gateway", &[(NAMESPACE, ns.as_str()), ("OTEL_EXPORTER_OTLP_ENDPOINT", otlp)]);
        targets.push(Target {
            name: "traced-gateway",
            url: format!("http://{addr}/mcp"),
            token: Some(env.token(User::Alice).to_owned()),
            pid: child.0.id(),
        });
        child
    });
    for target in &targets {
        wait_ready(target).await;
    }
    // Warm up every server (caches, connection pools, Python imports).
    for target in &targets {
        for op in ["tools/list", "tools/call"] {
            run_cell(target, op, 4, 1.0).await;
        }
    }

    let rounds: usize = std::env::var("TOOLYARD_BENCH_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(1).max(1);
    let nodes = Node::from_env();
    println!(
        "# Gateway MCP benchmark ({seconds} s per cell, {rounds} round(s), {} CPUs)",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!("gateway executor: answers at once (gateway-only figure: auth + RBAC cache + catalog + validation + MCP)");
    println!(
        "node: `idle` = nothing else runs, CPUs halt between requests; `busy` = one SCHED_IDLE spinning \
         thread per CPU keeps them from halting and yields to every server at once"
    );
    println!();
    println!("| round | node | server | op | clients | calls/s | p50 ms | p99 ms | server CPU ms/call | errors |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let ops: Vec<&'static str> = match std::env::var("TOOLYARD_BENCH_OPS") {
        Ok(list) => ["tools/list", "tools/call"].into_iter().filter(|op| list.split(',').any(|o| o == *op)).collect(),
        Err(_) => vec!["tools/list", "tools/call"],
    };
    let client_counts: Vec<usize> = match std::env::var("TOOLYARD_BENCH_CLIENTS") {
        Ok(list) => list.split(',').map(|c| c.trim().parse().expect("TOOLYARD_BENCH_CLIENTS: numbers")).collect(),
        Err(_) => vec![1, 8, 32],
    };
    let mut rows = Vec::new();
    for round in 1..=rounds {
        for &node in &nodes {
            let _spinner = (node == Node::Busy).then(spawn_idle_spinner);
            for &op in &ops {
                for &clients in &client_counts {
                    for target in &targets {
                        let cell = run_cell(target, op, clients, seconds).await;
                        println!(
                            "| {round} | {} | {} | {op} | {clients} | {:.0} | {:.2} | {:.2} | {:.3} | {} |",
                            node.name(),
                            target.name,
                            cell.calls_per_second,
                            cell.p50_ms,
                            cell.p99_ms,
                            cell.cpu_ms_per_call,
                            cell.errors
                        );
                        rows.push(Row { round, node, server: target.name, op, clients, cell });
                    }
                }
            }
        }
    }
    println!();
    println!(
        "Ratios within each round (the servers of a round ran one after the other, under the same \
         load), median over the rounds:"
    );
    println!();
    let mut baseline_columns =
        if baseline_child.is_some() { " gateway / baseline calls/s | baseline / gateway CPU per call |" } else { "" }
            .to_owned();
    if traced_child.is_some() {
        baseline_columns.push_str(" traced / untraced calls/s | traced / untraced CPU per call |");
    }
    println!(
        "| node | op | clients | calls/s ratio (gateway / python) | CPU per call ratio (python / gateway) | \
         floor: bare axum / python calls/s | gateway / bare axum calls/s |{baseline_columns}"
    );
    println!(
        "|---|---|---|---|---|---|---|{}{}",
        if baseline_child.is_some() { "---|---|" } else { "" },
        if traced_child.is_some() { "---|---|" } else { "" }
    );
    for &node in &nodes {
        for &op in &ops {
            for &clients in &client_counts {
                // The median over the rounds of a ratio of two servers' cells in the same round.
                let ratio = |a: &str, b: &str, of: fn(&Cell) -> f64| {
                    let per_round: Vec<f64> = (1..=rounds)
                        .map(|round| {
                            let find = |server: &str| {
                                rows.iter()
                                    .find(|r| {
                                        r.round == round
                                            && r.node == node
                                            && r.server == server
                                            && r.op == op
                                            && r.clients == clients
                                    })
                                    .map(|r| &r.cell)
                                    .expect("row")
                            };
                            of(find(a)) / of(find(b))
                        })
                        .collect();
                    median(per_round)
                };
                let calls = |c: &Cell| c.calls_per_second;
                let cpu = |c: &Cell| c.cpu_ms_per_call;
                let (gateway, python, floor) = ("toolyard-gateway", "python-sdk-fastmcp", "floor-bare-axum");
                print!(
                    "| {} | {op} | {clients} | {:.1}x | {:.1}x | {:.1}x | {:.2} |",
                    node.name(),
                    ratio(gateway, python, calls),
                    ratio(python, gateway, cpu),
                    ratio(floor, python, calls),
                    ratio(gateway, floor, calls),
                );
                if baseline_child.is_some() {
                    print!(
                        " {:.2} | {:.2} |",
                        ratio(gateway, "baseline-gateway", calls),
                        ratio("baseline-gateway", gateway, cpu)
                    );
                }
                if traced_child.is_some() {
                    print!(
                        " {:.2} | {:.2} |",
                        ratio("traced-gateway", gateway, calls),
                        ratio("traced-gateway", gateway, cpu)
                    );
                }
                println!();
            }
        }
    }
    let own = cpu_seconds(std::process::id());
    println!();
    println!("load generator CPU over the whole run: {own:.1} s (same machine; it competes with the servers)");
}

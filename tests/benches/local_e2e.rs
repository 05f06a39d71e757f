//! End-to-end benchmark of the embedded local mode (not a test): calls/s and p50/p99 latency
//! of the pricing example's `price_option` through `toolyard-gateway local`
//!
//! - in Pool mode with process reuse (a warm worker answers over JSON lines),
//! - in Job mode (a fresh `toolyard-runner call` + Python process per call),
//! - through an McpServer (the SDK server below as an upstream of the gateway), against the
//!   same server called directly (the proxy's overhead), and the gateway's memory per
//!   upstream connection (50 connections against none),
//!
//! against the official Python SDK server (MCPServer/FastMCP, stateless JSON) calling the same
//! function in-process, and against two bare starts of the same interpreter (called directly,
//! not through a version manager's shim): `python3 -c pass` (the floor of any fresh process)
//! and `python3 -c` importing `price_option`, computing it once and printing its JSON (the
//! least work a fresh process must do for this call; the Job-mode target is judged against it,
//! since the function's own imports are not the platform's overhead).
//!
//! `cargo build --release -p toolyard-gateway -p toolyard-runner && cargo bench -p toolyard-tests --bench local_e2e`
//! Needs a Python with the `mcp` package for the SDK server (`TOOLYARD_TEST_PYTHON`, else
//! `~/.cache/toolyard/venv/bin/python` as tests/run.sh makes it). The tools run on
//! `TOOLYARD_BENCH_PYTHON`, else `python3` resolved to its real executable.
//! `TOOLYARD_BENCH_SECONDS` (default 5) per cell, `TOOLYARD_BENCH_CLIENTS` (default `1,4`),
//! `TOOLYARD_BENCH_DATA_DIR` (default: a temporary folder) for the gateway's call files.
//! `TOOLYARD_BENCH_BASELINE_BIN_DIR`: compare this build's Pool and Job calls with another
//! build's gateway and runner instead (see `compare_builds`).
//! Before measuring it compiles the bundled `toolyard` package and the example to bytecode, as
//! `pip install` and the container image do (with `PYTHONDONTWRITEBYTECODE` set, as on some
//! machines, each fresh process would otherwise compile them again).
//! Each server cell also reports the CPU time per answered call of the server process and of
//! every process below it (warm workers; a Job call's runner and Python), from `/proc`.
//! The load generator is this program (`support/loadgen.rs`, as in the `gateway_mcp` bench):
//! one thread per client with a blocking keep-alive HTTP/1.1 connection, each sending its next
//! stateless MCP `tools/call` when the previous answer is complete.

#[path = "support/loadgen.rs"]
mod loadgen;
#[path = "support/pricing.rs"]
mod pricing;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pricing::{call_body, priced};
use serde_json::{Value, json};
use toolyard_tests::local::{self, TempDir};
use toolyard_tests::repo_path;

const TOKEN: &str = "ty_local-benchmark-token-0001";

/// A server under test.
struct Target {
    name: String,
    url: String,
    token: Option<String>,
    tool: Arc<str>,
    /// The server's process, whose CPU time (and its children's) is measured per cell.
    pid: Option<u32>,
}

/// A measured cell.
#[derive(Default)]
struct Cell {
    calls_per_second: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: u64,
    /// CPU time per answered call, in µs: the server process itself, and every process below
    /// it (the warm workers, a Job call's runner and Python).
    server_cpu_us: f64,
    children_cpu_us: f64,
}

/// CPU time (user + system) in ms of `pid` itself, and of every process below it: children it
/// has reaped, and live ones with everything below them.
fn tree_cpu_ms(pid: u32) -> (f64, f64) {
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as f64;
    // Fields after the command's closing parenthesis: state, ppid, ..., utime, stime,
    // cutime, cstime (the 12th to 15th).
    let stat = |pid: u32| -> Option<(u32, f64, f64)> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let fields: Vec<&str> = text.rsplit_once(')')?.1.split_whitespace().collect();
        let n = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
        Some((fields.get(1)?.parse().ok()?, (n(11) + n(12)) * 1000.0 / ticks, (n(13) + n(14)) * 1000.0 / ticks))
    };
    let processes: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .map(|d| d.flatten().filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok()).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|p| stat(p).map(|(ppid, _, _)| (p, ppid)))
        .collect();
    fn below(pid: u32, processes: &[(u32, u32)], stat: &dyn Fn(u32) -> Option<(u32, f64, f64)>) -> f64 {
        let reaped = stat(pid).map_or(0.0, |(_, _, children)| children);
        let live: f64 = processes
            .iter()
            .filter(|(_, ppid)| *ppid == pid)
            .map(|(child, _)| stat(*child).map_or(0.0, |(_, own, _)| own) + below(*child, processes, stat))
            .sum();
        reaped + live
    }
    let own = stat(pid).map_or(0.0, |(_, own, _)| own);
    (own, below(pid, &processes, &stat))
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ =
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.0.id() as i32), nix::sys::signal::Signal::SIGTERM);
        let _ = self.0.wait();
    }
}

fn summarize(mut latencies: Vec<Duration>, elapsed: f64, errors: u64) -> Cell {
    latencies.sort();
    let pick = |q: f64| {
        if latencies.is_empty() {
            return f64::NAN;
        }
        let i = ((latencies.len() as f64 - 1.0) * q).round() as usize;
        latencies[i].as_secs_f64() * 1000.0
    };
    Cell {
        calls_per_second: latencies.len() as f64 / elapsed,
        p50_ms: pick(0.5),
        p99_ms: pick(0.99),
        errors,
        server_cpu_us: f64::NAN,
        children_cpu_us: f64::NAN,
    }
}

impl Target {
    fn endpoint(&self) -> loadgen::Endpoint {
        loadgen::Endpoint::mcp(&self.url, self.token.as_deref())
    }
}

async fn run_cell(target: &Arc<Target>, clients: usize, seconds: f64) -> Cell {
    let (endpoint, tool, pid) = (target.endpoint(), target.tool.clone(), target.pid);
    tokio::task::spawn_blocking(move || {
        let before = pid.map(tree_cpu_ms);
        let measured = loadgen::run(&endpoint, clients, seconds, move |id| call_body(&tool, id), priced);
        let after = pid.map(tree_cpu_ms);
        let calls = measured.latencies.len().max(1) as f64;
        let (server_cpu_us, children_cpu_us) = match (before, after) {
            (Some((own0, below0)), Some((own1, below1))) => {
                ((own1 - own0) * 1000.0 / calls, (below1 - below0).max(0.0) * 1000.0 / calls)
            }
            _ => (f64::NAN, f64::NAN),
        };
        Cell {
            calls_per_second: measured.per_second(),
            p50_ms: measured.quantile_ms(0.5),
            p99_ms: measured.quantile_ms(0.99),
            errors: measured.errors,
            server_cpu_us,
            children_cpu_us,
        }
    })
    .await
    .expect("cell")
}

/// The least a fresh process must do for this call: import the function, call it once,
/// print its result as JSON.
const BARE_PRICING: &str = "import json; from pricing.options import price_option; \
    r = price_option(100, 100, 1, 0.2, 0.05); print(json.dumps({'price': r.price, 'option_type': r.option_type}))";

/// Bare interpreter starts: `clients` loops of `python -c CODE` (with `examples/pricing` on
/// `PYTHONPATH`, as the tool has it).
async fn bare_starts(python: &Path, code: &'static str, clients: usize, seconds: f64) -> Cell {
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let pricing = repo_path("examples/pricing");
    let workers: Vec<_> = (0..clients)
        .map(|_| {
            let (python, pricing) = (python.to_owned(), pricing.clone());
            tokio::spawn(async move {
                let (mut latencies, mut errors) = (Vec::new(), 0u64);
                while Instant::now() < deadline {
                    let t = Instant::now();
                    let status = tokio::process::Command::new(&python)
                        .args(["-c", code])
                        .env("PYTHONPATH", &pricing)
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .status()
                        .await;
                    if status.is_ok_and(|s| s.success()) {
                        latencies.push(t.elapsed());
                    } else {
                        errors += 1;
                    }
                }
                (latencies, errors)
            })
        })
        .collect();
    let (mut latencies, mut errors) = (Vec::new(), 0);
    for w in workers {
        let (l, e) = w.await.expect("start task");
        latencies.extend(l);
        errors += e;
    }
    summarize(latencies, started.elapsed().as_secs_f64(), errors)
}

fn real_python() -> PathBuf {
    let name = std::env::var("TOOLYARD_BENCH_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(&name).args(["-c", "import sys; print(sys.executable)"]).output().expect("python3");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// Writes `__pycache__` for the bundled package and the pricing example.
fn compile_bytecode(python: &Path) {
    let status = Command::new(python)
        .args(["-m", "compileall", "-q"])
        .arg(repo_path("worker-image/python/toolyard"))
        .arg(repo_path("examples/pricing/pricing"))
        .status()
        .expect("python -m compileall");
    assert!(status.success(), "python -m compileall failed");
}

fn python_with_mcp() -> String {
    let python = std::env::var("TOOLYARD_TEST_PYTHON")
        .unwrap_or_else(|_| format!("{}/.cache/toolyard/venv/bin/python", std::env::var("HOME").expect("HOME")));
    assert!(
        Command::new(&python).args(["-c", "import mcp"]).status().is_ok_and(|s| s.success()),
        "{python} cannot import mcp: set TOOLYARD_TEST_PYTHON to a Python with `pip install mcp`"
    );
    python
}

/// The pricing example's `price_option` twice: as written (Job) and as a reused Pool worker.
fn write_manifests(dir: &Path, slots: usize) {
    let text = std::fs::read_to_string(repo_path("examples/pricing/tools.yaml")).expect("pricing manifests");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("pricing manifests parse");
    let mut job = docs.into_iter().find(|d| d["spec"]["name"] == "price_option").expect("price_option");
    // The tool runs in the example's folder (`python -m` imports `pricing` from there).
    job["spec"]["runtime"]["workingDir"] = json!(repo_path("examples/pricing"));
    let mut pool = job.clone();
    pool["metadata"]["name"] = json!("price-option-pool");
    pool["spec"]["name"] = json!("price_option_pool");
    // The queue holds every client of the largest cell (the default, 8 per slot, holds 16).
    let pool_settings = json!({"replicas": 1, "reuseProcess": true, "concurrency": slots, "queue": 64});
    pool["spec"]["execution"] = json!({"mode": "Pool", "timeoutSeconds": 30, "pool": pool_settings});
    let yaml = format!("{job}\n---\n{pool}\n");
    std::fs::write(dir.join("tools.yaml"), yaml).expect("write manifests");
}

/// `count` McpServers (`pricing`, `pricing-1`, ...) of the MCP server at `url`, each held on its
/// own connection by the gateway.
fn write_upstreams(dir: &Path, url: &str, count: usize) {
    let docs: Vec<String> = (0..count)
        .map(|i| {
            let name = if i == 0 { "pricing".to_owned() } else { format!("pricing-{i}") };
            format!(
                "apiVersion: toolyard.dev/v1alpha1\nkind: McpServer\nmetadata: {{name: {name}}}\nspec: {{url: \"{url}\", \
                 reconnectDelaysSeconds: [1]}}\n"
            )
        })
        .collect();
    std::fs::write(dir.join("upstreams.yaml"), docs.join("---\n")).expect("write McpServer manifests");
}

/// Resident memory of process `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Memory per upstream connection: the resident memory of a gateway holding `count`
/// connections (and serving their tools) against one holding none, both idle after a
/// `tools/list`.
async fn upstream_memory(dir: &Path, url: &str, python: &Path, count: usize) {
    let mut rss = Vec::new();
    for servers in [0, count] {
        let tools = dir.join(format!("memory-{servers}"));
        std::fs::create_dir_all(&tools).expect("tools folder");
        write_manifests(&tools, 1);
        if servers > 0 {
            write_upstreams(&tools, url, servers);
        }
        let data = dir.join(format!("memory-data-{servers}"));
        let (gateway, gateway_url) =
            start_gateway(&local::binary("toolyard-gateway"), &local::binary("toolyard-runner"), &tools, &data, python);
        let last =
            if servers > 1 { format!("pricing_{}_price_option", servers - 1) } else { "pricing_price_option".into() };
        let probe = Arc::new(Target {
            name: format!("{servers} upstreams"),
            url: gateway_url,
            token: Some(TOKEN.into()),
            tool: if servers > 0 { last.into() } else { "price_option_pool".into() },
            pid: Some(gateway.0.id()),
        });
        wait_ready(&probe).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        rss.push(rss_kib(gateway.0.id()));
    }
    println!(
        "memory: gateway RSS {} KiB with no McpServer, {} KiB with {count} connected: {:.0} KiB per upstream connection",
        rss[0],
        rss[1],
        (rss[1] as f64 - rss[0] as f64) / count as f64
    );
}

fn start_gateway(gateway: &Path, runner: &Path, tools: &Path, data: &Path, python: &Path) -> (Killed, String) {
    let mut child = Command::new(gateway)
        .arg("local")
        .arg(tools)
        .args(["--listen", "127.0.0.1:0", "--token", TOKEN, "--max-calls", "8"])
        .arg("--data-dir")
        .arg(data)
        .arg("--runner")
        .arg(runner)
        .arg("--python")
        .arg(python)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("toolyard-gateway local");
    let stdout = child.stdout.take().expect("stdout");
    let mut url = None;
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("banner");
        if let Some(u) = line.trim().strip_prefix("MCP URL:") {
            url = Some(u.trim().to_owned());
        }
        if line.contains("Stop with Ctrl-C") {
            break;
        }
    }
    (Killed(child), url.expect("the banner names the MCP URL"))
}

fn start_sdk_server() -> (Killed, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("port").local_addr().expect("addr").port();
    let child = Command::new(python_with_mcp())
        .arg(repo_path("tests/benches/python/pricing_server.py"))
        .arg(port.to_string())
        .env("PYTHONPATH", repo_path("examples/pricing"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("python SDK server");
    (Killed(child), format!("http://127.0.0.1:{port}/mcp"))
}

async fn wait_ready(target: &Target) {
    for _ in 0..600 {
        let (endpoint, tool) = (target.endpoint(), target.tool.clone());
        let ready = tokio::task::spawn_blocking(move || {
            loadgen::Connection::new(endpoint).post(&call_body(&tool, 0)).is_ok_and(|a| priced(&a))
        });
        if ready.await.expect("probe") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{} does not answer price_option", target.name);
}

fn row(name: &str, clients: usize, c: &Cell) {
    println!(
        "| {name} | {clients} | {:.1} | {:.2} | {:.2} | {} | {:.0} | {:.0} |",
        c.calls_per_second, c.p50_ms, c.p99_ms, c.errors, c.server_cpu_us, c.children_cpu_us
    );
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    runtime.block_on(run());
}

async fn run() {
    let seconds: f64 = std::env::var("TOOLYARD_BENCH_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(5.0);
    let clients: Vec<usize> = std::env::var("TOOLYARD_BENCH_CLIENTS")
        .unwrap_or_else(|_| "1,4".into())
        .split(',')
        .filter_map(|c| c.trim().parse().ok())
        .collect();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let python = real_python();
    compile_bytecode(&python);
    let dir = TempDir::new("local-bench");
    let tools = dir.path().join("tools");
    std::fs::create_dir_all(&tools).expect("tools folder");
    write_manifests(&tools, cpus);

    // TOOLYARD_BENCH_DATA_DIR: where the gateway keeps call files (e.g. a tmpfs, to leave out fsync).
    let data = std::env::var_os("TOOLYARD_BENCH_DATA_DIR").map_or_else(|| dir.path().join("data"), PathBuf::from);
    if let Some(baseline) = std::env::var_os("TOOLYARD_BENCH_BASELINE_BIN_DIR") {
        return compare_builds(&PathBuf::from(baseline), &tools, &data, &python, &clients, seconds).await;
    }
    let (sdk_server, sdk_url) = start_sdk_server();
    // The same SDK server as an upstream MCP server of the gateway (its tools prefixed `pricing_`).
    write_upstreams(&tools, &sdk_url, 1);
    let (gateway, gateway_url) =
        start_gateway(&local::binary("toolyard-gateway"), &local::binary("toolyard-runner"), &tools, &data, &python);
    let pool = Arc::new(Target {
        name: "toolyard local, Pool + reuse".into(),
        url: gateway_url.clone(),
        token: Some(TOKEN.into()),
        tool: "price_option_pool".into(),
        pid: Some(gateway.0.id()),
    });
    let job = Arc::new(Target {
        name: "toolyard local, Job (fresh process)".into(),
        url: gateway_url.clone(),
        token: Some(TOKEN.into()),
        tool: "price_option".into(),
        pid: Some(gateway.0.id()),
    });
    let proxied = Arc::new(Target {
        name: "toolyard local, the SDK server as an McpServer".into(),
        url: gateway_url,
        token: Some(TOKEN.into()),
        tool: "pricing_price_option".into(),
        pid: Some(gateway.0.id()),
    });
    let sdk = Arc::new(Target {
        name: "Python SDK server (in-process)".into(),
        url: sdk_url.clone(),
        token: None,
        tool: "price_option".into(),
        pid: Some(sdk_server.0.id()),
    });
    for target in [&pool, &job, &proxied, &sdk] {
        wait_ready(target).await;
        run_cell(target, 2, 1.0).await; // warm-up
    }
    bare_starts(&python, "pass", 1, 1.0).await;
    bare_starts(&python, BARE_PRICING, 1, 1.0).await;

    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    println!(
        "# Local mode end to end: price_option ({seconds} s per cell, {cpus} CPUs, load average {}, tools on {})",
        load.join(" "),
        python.display()
    );
    println!();
    println!("| target | clients | calls/s | p50 ms | p99 ms | errors | server CPU µs/call | below it µs/call |");
    println!("|---|---|---|---|---|---|---|---|");
    let mut results = Vec::new();
    for &n in &clients {
        let cells = [
            run_cell(&pool, n, seconds).await,
            run_cell(&job, n, seconds).await,
            run_cell(&sdk, n, seconds).await,
            bare_starts(&python, "pass", n, seconds).await,
            bare_starts(&python, BARE_PRICING, n, seconds).await,
            run_cell(&proxied, n, seconds).await,
        ];
        let names = [
            pool.name.as_str(),
            job.name.as_str(),
            sdk.name.as_str(),
            "bare `python3 -c pass`",
            "bare `python3 -c` price_option, print JSON",
            proxied.name.as_str(),
        ];
        for (name, cell) in names.iter().zip(&cells) {
            row(name, n, cell);
        }
        results.push((n, cells));
    }
    println!();
    for (n, [_, _, sdk, _, _, proxied]) in &results {
        println!(
            "clients {n}: through the gateway / direct to the SDK server: calls/s = {:.2}x, p50 = {:.2}x (+{:.2} ms); \
             gateway CPU per proxied call {:.0} µs (the server's own {:.0} µs)",
            proxied.calls_per_second / sdk.calls_per_second,
            proxied.p50_ms / sdk.p50_ms,
            proxied.p50_ms - sdk.p50_ms,
            proxied.server_cpu_us,
            sdk.server_cpu_us,
        );
    }
    for (n, [pool, job, sdk, pass, priced, _]) in &results {
        println!(
            "clients {n}: Pool+reuse / SDK server calls/s = {:.2}x (target >= 5x); SDK server / Pool+reuse CPU per \
             call = {:.2}x (target >= 5x; gateway {:.0} + workers {:.0} µs against {:.0} µs); Job p50 / bare \
             price_option p50 = {:.2}x (target <= 1.2x); Job p50 / bare `-c pass` p50 = {:.2}x",
            pool.calls_per_second / sdk.calls_per_second,
            (sdk.server_cpu_us + sdk.children_cpu_us) / (pool.server_cpu_us + pool.children_cpu_us),
            pool.server_cpu_us,
            pool.children_cpu_us,
            sdk.server_cpu_us + sdk.children_cpu_us,
            job.p50_ms / priced.p50_ms,
            job.p50_ms / pass.p50_ms,
        );
    }
    println!();
    upstream_memory(dir.path(), &sdk_url, &python, 50).await;
}

/// `TOOLYARD_BENCH_BASELINE_BIN_DIR`: this build's gateway and runner against those in that
/// folder (e.g. built from an earlier commit), both serving at once, in alternating cells
/// (three rounds per client count) so that the host's load hits both alike: Pool calls (a warm
/// worker) and Job calls (a fresh runner and Python process each).
async fn compare_builds(baseline: &Path, tools: &Path, data: &Path, python: &Path, clients: &[usize], seconds: f64) {
    let (base_gateway, base_url) = start_gateway(
        &baseline.join("toolyard-gateway"),
        &baseline.join("toolyard-runner"),
        tools,
        &data.join("baseline"),
        python,
    );
    let (this_gateway, this_url) = start_gateway(
        &local::binary("toolyard-gateway"),
        &local::binary("toolyard-runner"),
        tools,
        &data.join("this"),
        python,
    );
    for (mode, tool) in [("Pool + reuse", "price_option_pool"), ("Job", "price_option")] {
        let target = |name: String, url: &str, gateway: &Killed| {
            Arc::new(Target {
                name,
                url: url.to_owned(),
                token: Some(TOKEN.into()),
                tool: tool.into(),
                pid: Some(gateway.0.id()),
            })
        };
        let (base, this) = (
            target(format!("baseline build, {mode}"), &base_url, &base_gateway),
            target(format!("this build, {mode}"), &this_url, &this_gateway),
        );
        for t in [&base, &this] {
            wait_ready(t).await;
            run_cell(t, 2, 1.0).await;
        }
        println!("# Local mode, {mode}: this build against {} ({seconds} s per cell)", baseline.display());
        println!();
        println!("| target | clients | calls/s | p50 ms | p99 ms | errors | server CPU µs/call | below it µs/call |");
        println!("|---|---|---|---|---|---|---|---|");
        for &n in clients {
            let (mut sum_base, mut sum_this) = (0.0, 0.0);
            let (mut p50_base, mut p50_this) = (Vec::new(), Vec::new());
            for _ in 0..3 {
                for (t, sum, p50) in [(&base, &mut sum_base, &mut p50_base), (&this, &mut sum_this, &mut p50_this)] {
                    let cell = run_cell(t, n, seconds).await;
                    row(&t.name, n, &cell);
                    *sum += cell.calls_per_second;
                    p50.push(cell.p50_ms);
                }
            }
            let median = |v: &mut Vec<f64>| {
                v.sort_by(f64::total_cmp);
                v[v.len() / 2]
            };
            println!(
                "{mode}, clients {n}: this / baseline calls/s = {:.2}x, p50 = {:.2}x",
                sum_this / sum_base,
                median(&mut p50_this) / median(&mut p50_base)
            );
        }
        println!();
    }
}

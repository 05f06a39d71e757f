//! Benchmark of one user over their limits (issue 24, bad input under load; not a test): while
//! bob calls a tool at a steady rate, alice floods the same gateway with more concurrent calls
//! than her limits allow, sending the next one as soon as each answer (or refusal) is back.
//!
//! `cargo bench -p toolyard-tests --bench noisy_user` (needs the test cluster).
//! `TOOLYARD_BENCH_SECONDS` sets each phase (default 10), `TOOLYARD_BENCH_FLOOD` alice's
//! concurrent clients (default 96), `TOOLYARD_BENCH_CALL_MS_LIST` the times a call takes
//! (default `0,20`: answered at once, and a 20 ms function standing in for a tool's run).
//!
//! For each call time, the benches' `serve`-built gateway (`support/gateway_role.rs`:
//! TokenReview and SubjectAccessReview with their caches, an executor that answers after the
//! call time) runs with the **default per-user limits** (16 calls, 64 HTTP requests at once),
//! in a process of its own. Two phases of the same length, one after the other:
//! - bob alone: 8 clients, each calling `price_option` every 25 ms;
//! - bob the same, while alice's clients call in a closed loop, ignoring `Retry-After`.
//!
//! Reported: bob's p50 and p99 in each phase and their ratio (the goal: at most 2x),
//! bob's failed calls (every answer is checked: none may be lost or refused), alice's calls
//! answered, her refusals (HTTP 429, or the JSON-RPC "server busy" error) and their p99, and
//! anything else she got (none expected), and the gateway's CPU per request in the flood.
//! The load generator is `support/loadgen.rs` (one OS thread and keep-alive connection per
//! client) in this process, on the same 2 CPUs as the gateway.

#[path = "support/gateway_role.rs"]
mod gateway_role;
#[path = "../tests/gateway_support/mod.rs"]
mod gateway_support;
// Its connection alone, through `paced`.
#[path = "support/loadgen.rs"]
#[allow(dead_code)]
mod loadgen;
#[path = "support/paced.rs"]
mod paced;
#[path = "support/procs.rs"]
mod procs;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::DeleteParams;
use serde_json::{Value, json};
use toolyard_tests::{TestEnv, User};

use loadgen::{Answer, Endpoint};
use paced::{Outcome, Tally, clients, join, quantile_ms, quantile_text};
use procs::{ROLE, cpu_seconds, env_number, exit_when_stdin_closes};

/// The allocator `toolyard-gateway` runs with (see its `main.rs`), for the gateway role.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const NAMESPACES_VAR: &str = "TOOLYARD_BENCH_NAMESPACES";

/// Bob's clients, and the time between one client's calls.
const STEADY_CLIENTS: usize = 8;
const STEADY_EVERY: Duration = Duration::from_millis(25);

fn main() {
    if std::env::var_os(ROLE).is_some() {
        exit_when_stdin_closes();
        gateway_role::run(&std::env::var(NAMESPACES_VAR).expect("namespaces"), false);
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    runtime.block_on(run_benchmark());
}

/// A `tools/call` of `price_option` with `x`.
fn call_body(x: u64) -> Vec<u8> {
    json!({"jsonrpc": "2.0", "id": x, "method": "tools/call",
        "params": {"name": "price_option", "arguments": {"x": x}}})
    .to_string()
    .into_bytes()
}

/// Refused: HTTP 429 or the JSON-RPC "server busy" error.
fn outcome(answer: std::io::Result<Answer>, x: u64) -> Outcome {
    let Ok(answer) = answer else { return Outcome::Failed };
    if answer.status == 429 {
        return Outcome::Refused;
    }
    let Some(message) = answer.json_text().and_then(|t| serde_json::from_str::<Value>(t).ok()) else {
        return Outcome::Failed;
    };
    // Structured content, and the same JSON as text.
    let result = &message["result"];
    let text = result["content"][0]["text"].as_str().and_then(|t| serde_json::from_str::<Value>(t).ok());
    if result["structuredContent"]["echo"]["x"] == json!(x) && text.is_some_and(|t| t == result["structuredContent"]) {
        Outcome::Answered
    } else if message["error"]["message"].as_str().is_some_and(|m| m.starts_with("server busy")) {
        Outcome::Refused
    } else {
        Outcome::Failed
    }
}

/// One phase: bob's steady clients, with alice's `flood` clients if any, for `seconds`.
/// Returns bob's tally, alice's, and the gateway's CPU seconds.
fn phase(bob: &Endpoint, alice: &Endpoint, flood: usize, seconds: Duration, pid: u32) -> (Tally, Tally, f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let cpu_before = cpu_seconds(pid);
    let steady = clients(vec![bob.clone(); STEADY_CLIENTS], Some(STEADY_EVERY), &stop, call_body, outcome);
    let flooding = clients(vec![alice.clone(); flood], None, &stop, call_body, outcome);
    std::thread::sleep(seconds);
    stop.store(true, Ordering::Relaxed);
    let (bob, alice) = (join(steady), join(flooding));
    (bob, alice, cpu_seconds(pid) - cpu_before)
}

async fn run_benchmark() {
    let seconds = Duration::from_secs_f64(env_number("TOOLYARD_BENCH_SECONDS", 10.0));
    let flood = env_number("TOOLYARD_BENCH_FLOOD", 96.0) as usize;
    let call_times: Vec<u64> = std::env::var("TOOLYARD_BENCH_CALL_MS_LIST")
        .unwrap_or_else(|_| "0,20".into())
        .split(',')
        .filter_map(|v| v.trim().parse().ok())
        .collect();
    let env = TestEnv::get();
    env.install_crds().await.expect("CRDs");
    let ns = env.namespace("noisy").await.expect("namespace");
    gateway_support::grant_platform(&ns).await;
    gateway_support::create_tool(&ns, "price-option", gateway_support::spec("price_option", 60), true).await;
    gateway_support::grant_call(&ns, "callers", &[], &["alice", "bob"], &[]).await;
    for user in ["alice", "bob"] {
        gateway_support::wait_allowed(user, &[], &ns, "toolyard.dev", "mcptools", "call", Some("price-option")).await;
    }

    let exe = std::env::current_exe().expect("exe");
    let mut rows = Vec::new();
    for call_ms in call_times {
        let call_ms_text = call_ms.to_string();
        let (gateway, addr) = procs::spawn_server(
            &exe,
            "gateway",
            &[
                (NAMESPACES_VAR, ns.as_str()),
                (gateway_role::CALL_MS_VAR, call_ms_text.as_str()),
                (gateway_role::USER_LIMITS_VAR, "default"),
            ],
        );
        let url = format!("http://{addr}/mcp");
        let bob = Endpoint::mcp(&url, Some(env.token(User::Bob)));
        let alice = Endpoint::mcp(&url, Some(env.token(User::Alice)));
        let pid = gateway.0.id();
        let run = |flood: usize, seconds: Duration| {
            let (bob, alice) = (bob.clone(), alice.clone());
            tokio::task::spawn_blocking(move || phase(&bob, &alice, flood, seconds, pid))
        };
        // Warm: both users' tokens and decisions are cached, as in a running gateway.
        run(1, Duration::from_secs(1)).await.expect("warm-up");
        let (alone, _, _) = run(0, seconds).await.expect("bob alone");
        let (with_flood, flooding, cpu) = run(flood, seconds).await.expect("the flood");
        drop(gateway);
        rows.push((call_ms, alone, with_flood, flooding, cpu));
    }
    let namespaces: Api<Namespace> = Api::all(env.client(User::Admin).await);
    let _ = namespaces.delete(&ns, &DeleteParams::background()).await;

    let s = seconds.as_secs_f64();
    println!(
        "\nbob: {STEADY_CLIENTS} clients calling every {} ms; alice: {flood} clients in a closed loop; {s} s per phase; default per-user limits",
        STEADY_EVERY.as_millis()
    );
    println!(
        "| call time | bob p50 / p99 alone | bob p50 / p99 in the flood | bob p99 ratio | bob failed | alice answered/s | alice refused/s | refusal p99 | alice failed | gateway CPU per request |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (call_ms, alone, with_flood, flooding, cpu) in rows {
        let requests = (with_flood.answered.len() + flooding.answered.len() + flooding.refused.len()) as f64;
        println!(
            "| {call_ms} ms | {:.2} / {:.2} ms | {:.2} / {:.2} ms | **{:.2}x** | {} | {:.0} | {:.0} | {} | {} | {:.0} µs |",
            quantile_ms(&alone.answered, 0.50),
            quantile_ms(&alone.answered, 0.99),
            quantile_ms(&with_flood.answered, 0.50),
            quantile_ms(&with_flood.answered, 0.99),
            quantile_ms(&with_flood.answered, 0.99) / quantile_ms(&alone.answered, 0.99),
            alone.failed + with_flood.failed,
            flooding.answered.len() as f64 / s,
            flooding.refused.len() as f64 / s,
            quantile_text(&flooding.refused, 0.99),
            flooding.failed,
            cpu * 1e6 / requests.max(1.0),
        );
    }
}

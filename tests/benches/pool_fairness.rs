//! Benchmark of one warm pool shared by two users (issue 24, bad input under load; not a
//! test): while bob calls a pool's tool at a steady rate, alice floods the same pool with more
//! calls than its slots and queue hold, sending the next one as soon as each answer (or
//! refusal) is back.
//!
//! `cargo build --release -p toolyard-runner && cargo bench -p toolyard-tests --bench pool_fairness`
//! (no cluster needed). `TOOLYARD_BENCH_BASELINE_BIN_DIR`: also measure the `toolyard-runner`
//! in that folder (e.g. built from an earlier commit), in the same run, after this build's.
//! `TOOLYARD_BENCH_SECONDS` sets each phase (default 10), `TOOLYARD_BENCH_FLOOD` alice's
//! concurrent clients (default 24).
//!
//! The server is `toolyard-runner serve`, what a warm pool's pod runs: 2 reused workers and
//! the default queue (8 calls per slot: 16), running `misbehaving:hang` with `seconds: 0.01`
//! (a 10 ms function). Each client sends a call token signed as the gateway signs it, for its
//! user (one call id per client). Two phases of the same length, one after the other:
//! - bob alone: 2 clients, each calling every 50 ms;
//! - bob the same, while alice's clients call in a closed loop, ignoring `Retry-After`.
//!
//! Reported per build: bob's p50 and p99 in each phase and their ratio (the goal: at
//! most 2x), bob's refused and failed calls, alice's calls answered and refused (HTTP 503) per
//! second and the refusals' p99, and anything else she got (none expected). Every answer is
//! checked (`{"slept": 0.01}`). The load generator is `support/loadgen.rs` (one OS thread and
//! keep-alive connection per client) in this process, on the same 2 CPUs as the pool.

#[path = "support/loadgen.rs"]
#[allow(dead_code)]
mod loadgen;
#[path = "support/paced.rs"]
mod paced;
#[path = "support/procs.rs"]
mod procs;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::json;
use toolyard_api::Owner;
use toolyard_api::protocol::pool::{self, PoolCallResponse};
use toolyard_api::token::{Claims, RunKind, SigningKey};
use toolyard_tests::local;

use loadgen::{Answer, Endpoint};
use paced::{Outcome, Tally, clients, join, quantile_ms, quantile_text};
use procs::env_number;

/// Bob's clients, and the time between one client's calls.
const STEADY_CLIENTS: usize = 2;
const STEADY_EVERY: Duration = Duration::from_millis(50);
/// What each call asks the function to sleep, in seconds.
const CALL_SECONDS: f64 = 0.01;

fn key() -> SigningKey {
    SigningKey::new(b"pool-fairness-bench-master-key-0123456789".to_vec())
        .expect("a key")
        .derive(&pool::key_purpose("", "bench"))
}

/// A `toolyard-runner serve` process with a temporary folder of its own. It shuts down when
/// its standard input closes (when this is dropped, or the bench ends however it ends),
/// stopping its workers and removing their folders; the folder goes after it.
struct Server {
    child: Child,
    addr: String,
    _tmp: local::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        for _ in 0..200 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(runner: &Path) -> Server {
    let tmp = local::TempDir::new("pool-fairness");
    let mut child = Command::new(runner)
        .args(["serve", "--host", "127.0.0.1", "--port", "0", "--concurrency", "2", "--reuse", "--exit-on-stdin-eof"])
        .args(["--", local::python().as_str(), "-m", "toolyard.run", "misbehaving:hang"])
        .env(pool::env::KEY, key().to_hex())
        .env("PYTHONPATH", local::misbehaving_pythonpath())
        .env("RUST_LOG", "warn")
        .env("TMPDIR", tmp.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", runner.display()));
    // Printed once every worker has started.
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("its stdout")).read_line(&mut line).expect("the first line");
    let addr = line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("unexpected first line {line:?}"));
    Server { addr: addr.to_owned(), child, _tmp: tmp }
}

/// The endpoint of one client of `user`: its call id's token in every request.
fn endpoint(server: &Server, user: &str, id: &str) -> Endpoint {
    let owner = Owner { issuer: "https://issuer.example".into(), user: user.into(), groups: vec![] };
    let exp = jiff::Timestamp::now().as_second() + 3600;
    let token = key().sign(&Claims { kind: RunKind::Call, ns: String::new(), id: id.into(), owner, exp });
    Endpoint {
        addr: server.addr.clone(),
        path: pool::CALL_PATH.into(),
        headers: format!("content-type: application/json\r\nauthorization: Bearer {token}\r\n"),
        host: None,
    }
}

/// An answer of the pool: `{"slept": 0.01}`, or a refusal (HTTP 503).
fn outcome(answer: std::io::Result<Answer>, _: u64) -> Outcome {
    match answer {
        Ok(a) if a.status == 503 => Outcome::Refused,
        Ok(a)
            if a.status == 200
                && serde_json::from_slice::<PoolCallResponse>(&a.body)
                    .is_ok_and(|r| r.result.value == Some(json!({"slept": CALL_SECONDS}))) =>
        {
            Outcome::Answered
        }
        _ => Outcome::Failed,
    }
}

/// `user`'s `count` clients: client `c` sends call `{user}-{c}` with its token.
fn endpoints(server: &Server, user: &str, count: usize) -> Vec<Endpoint> {
    (0..count).map(|c| endpoint(server, user, &format!("{user}-{c}"))).collect()
}

/// The request body of client `x >> 32` of `user`.
fn body(user: &'static str) -> impl Fn(u64) -> Vec<u8> + Send + Sync + 'static {
    move |x| {
        let id = format!("{user}-{}", x >> 32);
        json!({"id": id, "arguments": {"seconds": CALL_SECONDS}, "timeoutMs": 30_000}).to_string().into_bytes()
    }
}

/// One phase: bob's steady clients, with alice's `flood` clients if any, for `seconds`.
fn phase(server: &Server, flood: usize, seconds: Duration) -> (Tally, Tally) {
    let stop = Arc::new(AtomicBool::new(false));
    let steady = clients(endpoints(server, "bob", STEADY_CLIENTS), Some(STEADY_EVERY), &stop, body("bob"), outcome);
    let flooding = clients(endpoints(server, "alice", flood), None, &stop, body("alice"), outcome);
    std::thread::sleep(seconds);
    stop.store(true, Ordering::Relaxed);
    (join(steady), join(flooding))
}

fn main() {
    let seconds = Duration::from_secs_f64(env_number("TOOLYARD_BENCH_SECONDS", 10.0));
    let flood = env_number("TOOLYARD_BENCH_FLOOD", 24.0) as usize;
    let mut builds = vec![("this build".to_owned(), local::binary("toolyard-runner"))];
    if let Some(dir) = std::env::var_os("TOOLYARD_BENCH_BASELINE_BIN_DIR") {
        builds.push(("baseline".to_owned(), PathBuf::from(dir).join("toolyard-runner")));
    }
    let mut rows = Vec::new();
    for (name, runner) in builds {
        let server = start(&runner);
        // Warm: the workers have answered and the connections are open.
        phase(&server, 1, Duration::from_secs(1));
        let (alone, _) = phase(&server, 0, seconds);
        let (with_flood, flooding) = phase(&server, flood, seconds);
        rows.push((name, alone, with_flood, flooding));
    }

    let s = seconds.as_secs_f64();
    println!(
        "\nA pool of 2 reused workers, queue 16, {} ms calls; bob: {STEADY_CLIENTS} clients calling every {} ms; alice: {flood} clients in a closed loop; {s} s per phase",
        CALL_SECONDS * 1000.0,
        STEADY_EVERY.as_millis()
    );
    println!(
        "| build | bob p50 / p99 alone | bob p50 / p99 in the flood | bob p99 ratio | bob refused | bob failed | alice answered/s | alice refused/s | refusal p99 | alice failed |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (name, alone, with_flood, flooding) in rows {
        println!(
            "| {name} | {:.2} / {:.2} ms | {:.2} / {:.2} ms | **{:.2}x** | {} | {} | {:.0} | {:.0} | {} | {} |",
            quantile_ms(&alone.answered, 0.50),
            quantile_ms(&alone.answered, 0.99),
            quantile_ms(&with_flood.answered, 0.50),
            quantile_ms(&with_flood.answered, 0.99),
            quantile_ms(&with_flood.answered, 0.99) / quantile_ms(&alone.answered, 0.99),
            alone.refused.len() + with_flood.refused.len(),
            alone.failed + with_flood.failed,
            flooding.answered.len() as f64 / s,
            flooding.refused.len() as f64 / s,
            quantile_text(&flooding.refused, 0.99),
            flooding.failed,
        );
    }
}

//! The storage cost of a 2025-era session's GET stream between changes (issue 24,
//! connections; not a test). Every 10 s such a stream checks whether its session subscribed
//! through another replica. It used to list the session's `subscriptions/` folder; it now reads
//! the session's `version` file and lists only when that moved. Both are measured here, one
//! after the other, for sessions that never subscribed (most never do), in the test cluster's
//! S3 server and in a local folder store, beside the owner's stored calls.
//!
//! `tests/cluster/cluster.sh start && cargo bench -p toolyard-tests --bench session_recheck`
//! `TOOLYARD_BENCH_SESSIONS` (default 200) rechecks per row, `TOOLYARD_BENCH_FILES` (default
//! 10,000) stored call files of the owner. Reported per recheck: the wall time, this process's
//! CPU (the gateway's side) and the S3 server's CPU (read from `/proc`, its pid from the test
//! cluster's run folder).

#[path = "support/procs.rs"]
mod procs;

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures::StreamExt;
use toolyard_api::OwnerKey;
use toolyard_gateway::store::ArtifactStore;
use toolyard_gateway::store::fs::FsStore;
use toolyard_gateway::store::s3::{S3Settings, S3Store};
use toolyard_tests::local::TempDir;
use toolyard_tests::{TestEnv, random_suffix};

use procs::{cpu_seconds, env_number};

/// Files written at once while seeding.
const SEED_CONCURRENCY: usize = 16;

/// Per recheck, in µs: wall time, this process's CPU, the S3 server's CPU.
#[derive(Clone, Copy, Default)]
struct Cost {
    wall: f64,
    cpu: f64,
    server: f64,
}

/// Runs `recheck` for each session; its cost per recheck.
async fn measure<F, Fut>(sessions: &[String], server: Option<u32>, recheck: F) -> Cost
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = ()>,
{
    let server_cpu = || server.map_or(0.0, cpu_seconds);
    let (cpu, served, started) = (cpu_seconds(std::process::id()), server_cpu(), Instant::now());
    for session in sessions {
        recheck(session.clone()).await;
    }
    let n = sessions.len() as f64;
    Cost {
        wall: started.elapsed().as_secs_f64() * 1e6 / n,
        cpu: (cpu_seconds(std::process::id()) - cpu) * 1e6 / n,
        server: (server_cpu() - served) * 1e6 / n,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let sessions = env_number("TOOLYARD_BENCH_SESSIONS", 200.0) as usize;
    let files = env_number("TOOLYARD_BENCH_FILES", 10000.0) as usize;
    let s3 = TestEnv::get().s3();
    let settings = S3Settings {
        endpoint: Some(s3.endpoint.clone()),
        region: s3.region.clone(),
        bucket: s3.bucket.clone(),
        access_key: Some(s3.access_key.clone()),
        secret_key: Some(s3.secret_key.clone()),
        ..Default::default()
    };
    let s3_pid = std::env::var("TOOLYARD_CLUSTER_RUN")
        .ok()
        .and_then(|run| std::fs::read_to_string(format!("{run}/pids/s3s-fs")).ok())
        .and_then(|pid| pid.trim().parse::<u32>().ok());
    let folder = TempDir::new("session-recheck");
    let stores: Vec<(&str, Arc<dyn ArtifactStore>, Option<u32>)> = vec![
        ("S3 (s3s-fs)", Arc::new(S3Store::new(&settings).await.expect("S3 store")), s3_pid),
        ("folder store", Arc::new(FsStore::new(folder.path()).expect("folder store")), None),
    ];
    let owner = OwnerKey::derive("bench", &format!("session-recheck-{}", random_suffix(6)));
    let ids: Vec<String> = (0..sessions).map(|_| random_suffix(32)).collect();

    println!("# A session's recheck between changes: {sessions} sessions, {files} stored calls of the owner\n");
    println!("| store | recheck | wall µs | gateway CPU µs | S3 server CPU µs |");
    println!("|---|---|---|---|---|");
    for (name, store, server) in &stores {
        futures::stream::iter(0..files)
            .map(|i| {
                let store = Arc::clone(store);
                let owner = owner.clone();
                async move {
                    let bytes = Bytes::from_static(br#"{"price":10.45}"#);
                    store.put(&owner, &format!("calls/c{i:06}/result.json"), bytes).await.expect("seed");
                }
            })
            .buffer_unordered(SEED_CONCURRENCY)
            .collect::<()>()
            .await;
        let list = |id: String| {
            let (store, owner) = (Arc::clone(store), owner.clone());
            async move {
                store.list(&owner, &format!("sessions/{id}/subscriptions/")).await.expect("list");
            }
        };
        let read = |id: String| {
            let (store, owner) = (Arc::clone(store), owner.clone());
            async move {
                store.get(&owner, &format!("sessions/{id}/version")).await.expect("get");
            }
        };
        // The first round warms connections and caches; the second is reported.
        let (mut before, mut now) = (Cost::default(), Cost::default());
        for _ in 0..2 {
            before = measure(&ids, *server, list).await;
            now = measure(&ids, *server, read).await;
        }
        for (what, cost) in [("list `subscriptions/` (before)", before), ("read `version` (now)", now)] {
            let server = if server.is_some() { format!("{:.0}", cost.server) } else { "—".into() };
            println!("| {name} | {what} | {:.0} | {:.0} | {server} |", cost.wall, cost.cpu);
        }
        let server_ratio = if server.is_some() { format!("{:.1}x", before.server / now.server) } else { "—".into() };
        println!(
            "| {name} | before / now | {:.1}x | {:.1}x | {server_ratio} |",
            before.wall / now.wall,
            before.cpu / now.cpu
        );
        store.delete_folder(&owner, "calls/").await.expect("clean up");
    }
}

//! Two listings of the gateway's storage that are now gone from frequent paths (issue 24; not
//! a test), each measured against what replaced it, one after the other, in the test
//! cluster's S3 server and in a local folder store, beside the owner's stored calls:
//!
//! - **A 2025-era session's GET stream between changes.** Every 10 s such a stream checks
//!   whether its session subscribed through another replica. It used to list the session's
//!   `subscriptions/` folder; it now reads the session's `version` file (and lists only when
//!   that moved). Measured for sessions that never subscribed (most never do).
//! - **An append to a call's event log** (a Job call's runner posts `call_started` and its
//!   progress, the gateway appends `call_finished`). Each append used to list the log for the
//!   next segment number; now the replica that wrote a log's last segment creates the next one
//!   at once (`EventLogs`). Measured as a Job call's log grows: the gateway's first segment,
//!   then three appends, through one `EventLogs` (now) and through a new one per append, which
//!   knows nothing and lists (before).
//!
//! `tests/cluster/cluster.sh start && cargo bench -p toolyard-tests --bench storage_listings`
//! `TOOLYARD_BENCH_SESSIONS` (default 100) sessions and calls per row, `TOOLYARD_BENCH_FILES`
//! (default 10,000) stored call files of the owner. Reported per recheck or call log: the wall
//! time, this process's CPU (the gateway's side) and the S3 server's CPU (each process's
//! threads' time on a CPU, from `/proc`; the S3 server's pid from the test cluster's run
//! folder).

// Only its `s3_store`.
#[path = "../tests/gateway_support/mod.rs"]
mod gateway_support;
#[path = "support/procs.rs"]
mod procs;

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures::StreamExt;
use toolyard_api::OwnerKey;
use toolyard_gateway::store::ArtifactStore;
use toolyard_gateway::store::events::EventLogs;
use toolyard_gateway::store::fs::FsStore;
use toolyard_tests::local::TempDir;
use toolyard_tests::random_suffix;

use procs::env_number;

/// Files written at once while seeding.
const SEED_CONCURRENCY: usize = 16;

/// Appends to a call's log after its first segment (`call_started`, a progress report,
/// `call_finished`).
const APPENDS: usize = 3;

/// Per session recheck or call log, in µs: wall time, this process's CPU, the S3 server's CPU.
#[derive(Clone, Copy, Default)]
struct Cost {
    wall: f64,
    cpu: f64,
    server: f64,
}

/// CPU seconds of the live threads of process `pid` (`/proc/<pid>/task/*/schedstat`, in ns:
/// finer than the 10 ms ticks of `/proc/<pid>/stat`, which a few hundred fast requests do not
/// fill).
fn cpu_seconds(pid: u32) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0.0 };
    let nanos: u64 = tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|stat| stat.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    nanos as f64 / 1e9
}

/// Runs `op` for each id; its cost per run.
async fn measure<F, Fut>(ids: &[String], server: Option<u32>, op: F) -> Cost
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = ()>,
{
    let server_cpu = || server.map_or(0.0, cpu_seconds);
    let (cpu, served, started) = (cpu_seconds(std::process::id()), server_cpu(), Instant::now());
    for id in ids {
        op(id.clone()).await;
    }
    let n = ids.len() as f64;
    Cost {
        wall: started.elapsed().as_secs_f64() * 1e6 / n,
        cpu: (cpu_seconds(std::process::id()) - cpu) * 1e6 / n,
        server: (server_cpu() - served) * 1e6 / n,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let sessions = env_number("TOOLYARD_BENCH_SESSIONS", 100.0) as usize;
    let files = env_number("TOOLYARD_BENCH_FILES", 10000.0) as usize;
    let s3_pid = std::env::var("TOOLYARD_CLUSTER_RUN")
        .ok()
        .and_then(|run| std::fs::read_to_string(format!("{run}/pids/s3s-fs")).ok())
        .and_then(|pid| pid.trim().parse::<u32>().ok());
    let folder = TempDir::new("storage-listings");
    let stores: Vec<(&str, Arc<dyn ArtifactStore>, Option<u32>)> = vec![
        ("S3 (s3s-fs)", gateway_support::s3_store().await, s3_pid),
        ("folder store", Arc::new(FsStore::new(folder.path()).expect("folder store")), None),
    ];
    let owner = OwnerKey::derive("bench", &format!("storage-listings-{}", random_suffix(6)));
    let ids: Vec<String> = (0..sessions).map(|_| random_suffix(32)).collect();

    println!("# Listings replaced: {sessions} sessions and calls, {files} stored calls of the owner\n");
    println!("| store | operation | wall µs | gateway CPU µs | S3 server CPU µs |");
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
        let logs = Arc::new(EventLogs::default());
        // A Job call's log: the gateway's first segment, then three appends, each through
        // `logs` (`Some`) or through an `EventLogs` of its own (`None`: it lists the log).
        let call_log = |id: String, logs: Option<Arc<EventLogs>>| {
            let (store, owner) = (Arc::clone(store), owner.clone());
            async move {
                let folder = format!("calls/{id}/events/");
                let segment = Bytes::from_static(b"{\"type\":\"call_progress\"}\n");
                store.put(&owner, &format!("{folder}000001.jsonl"), segment.clone()).await.expect("first");
                let logs = logs.inspect(|logs| logs.started(&owner, &folder, segment.len() as u64));
                for _ in 0..APPENDS {
                    let path = |n: u32| format!("{folder}{n:06}.jsonl");
                    let fresh = EventLogs::default();
                    let through = logs.as_deref().unwrap_or(&fresh);
                    through
                        .append(store.as_ref(), &owner, &folder, path, segment.clone(), u64::MAX)
                        .await
                        .expect("append");
                }
            }
        };
        // The first round warms connections and caches; the second is reported.
        let mut rows = Vec::new();
        for round in 0..2 {
            let listed = |id: String| call_log(format!("listed-{round}-{id}"), None);
            let known = |id: String| call_log(format!("known-{round}-{id}"), Some(Arc::clone(&logs)));
            rows = vec![
                ("session recheck", "list `subscriptions/` (before)", measure(&ids, *server, list).await),
                ("session recheck", "read `version` (now)", measure(&ids, *server, read).await),
                ("call log of 4 segments", "each append lists (before)", measure(&ids, *server, listed).await),
                ("call log of 4 segments", "appends after its own (now)", measure(&ids, *server, known).await),
            ];
        }
        for pair in rows.chunks(2) {
            let [(what, before_name, before), (_, now_name, now)] = pair else { unreachable!("pairs") };
            for (how, cost) in [(before_name, before), (now_name, now)] {
                let server = if server.is_some() { format!("{:.0}", cost.server) } else { "—".into() };
                println!("| {name} | {what}: {how} | {:.0} | {:.0} | {server} |", cost.wall, cost.cpu);
            }
            let server_ratio =
                if server.is_some() { format!("{:.1}x", before.server / now.server) } else { "—".into() };
            println!(
                "| {name} | {what}: before / now | {:.1}x | {:.1}x | {server_ratio} |",
                before.wall / now.wall,
                before.cpu / now.cpu
            );
        }
        store.delete_folder(&owner, "calls/").await.expect("clean up");
    }
}

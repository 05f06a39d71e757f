//! Benchmark of an owner's stored history (issue 24, storage; not a test): what `list_tasks`,
//! the running-task count and `list_artifacts` cost as one owner's tasks and stored calls
//! grow a hundredfold.
//!
//! `cargo bench -p toolyard-tests --bench task_history` (needs the test cluster; see
//! tests/run.sh). `TOOLYARD_BENCH_SIZES` (default `100,10000`) sets the sizes (tasks per user),
//! `TOOLYARD_BENCH_CALLS_PER_TASK` the stored calls per task (default 10: 100,000 stored calls
//! at the larger size), `TOOLYARD_BENCH_SECONDS` the time per cell (default 2).
//!
//! For each size, in a namespace of its own on the test cluster's apiserver: that many
//! CodingTasks of alice and as many of bob (as the gateway creates them), 99% of them
//! finished (a status patch) and 1% still pending; and in the test S3 server, ten times as
//! many (by default) stored calls of alice (`calls/<id>/result.json`) beside one task with 5
//! artifacts, and the same in a local folder store (the embedded mode's and a one-replica
//! deployment's). Then, in this process, with the gateway's Kubernetes task backend watching
//! the namespace:
//! - **page**: the first `list_tasks` page (20, newest first) — the backend's owner walk;
//! - **page of pending**: the first page of alice's pending tasks (`list_tasks` with a status
//!   filter of `pending` or `running` walks the owner's unfinished tasks alone);
//! - **running count**: alice's unfinished tasks (the per-user limit's check);
//! - **artifacts**: `list_artifacts` of the task (its outputs and its files), in S3 and in the
//!   folder store. The test S3 server (s3s-fs) answers a listing by walking its whole bucket,
//!   so there it costs what the bucket holds; S3 servers that index keys do not;
//!
//! and, as the baseline of the same run, the page and the count as the gateway computed them
//! before the owner index: every watched task of the namespace filtered by owner, then sorted
//! (a reflector store of its own over the same objects). Ratios compare each size with the
//! smallest.

#[path = "../tests/gateway_support/mod.rs"]
mod gateway_support;

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use toolyard_api::{CodingTask, Owner, OwnerKey, conditions};
use toolyard_gateway::store::ArtifactStore;
use toolyard_gateway::store::fs::FsStore;
use toolyard_gateway::tasks::kube::{KubeTasks, record_of};
use toolyard_gateway::tasks::view::{self, task_folder};
use toolyard_gateway::tasks::{Subset, TaskBackend, TaskRecord, new_task_id};
use toolyard_tests::{TestEnv, User};

/// Objects sent to the apiserver (and files to S3) at once while setting a size up.
const SETUP_CONCURRENCY: usize = 32;
/// `list_tasks`' default page.
const PAGE: usize = 20;

fn owner(user: &str) -> Owner {
    Owner { issuer: "apikey".into(), user: user.into(), groups: vec![] }
}

/// A CodingTask of `user` as the gateway creates it.
fn task(user: &str) -> CodingTask {
    let owner = owner(user);
    serde_json::from_value(json!({
        "apiVersion": "toolyard.dev/v1alpha1",
        "kind": "CodingTask",
        "metadata": {"name": new_task_id().as_str(), "labels": {
            "app.kubernetes.io/managed-by": "toolyard-gateway",
            "toolyard.dev/owner": owner.key().as_str(),
        }},
        "spec": {"prompt": format!("summarise the book of {user} and chart its exposures"), "owner": owner},
    }))
    .expect("CodingTask")
}

/// Creates `size` tasks of alice and of bob in `ns`, finishing all but every hundredth.
async fn create_tasks(env: &TestEnv, ns: &str, size: usize) {
    let api: Api<CodingTask> = Api::namespaced(env.client(User::Admin).await, ns);
    let done = json!({"status": {"conditions": [conditions::succeeded("done", None)]}});
    futures::stream::iter((0..2 * size).map(|i| (i, if i % 2 == 0 { "alice" } else { "bob" })))
        .map(|(i, user)| {
            let (api, done) = (api.clone(), done.clone());
            async move {
                let created = api.create(&PostParams::default(), &task(user)).await.expect("create");
                if (i / 2) % 100 != 0 {
                    let name = created.metadata.name.expect("name");
                    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&done)).await.expect("finish");
                }
            }
        })
        .buffer_unordered(SETUP_CONCURRENCY)
        .collect::<Vec<()>>()
        .await;
}

/// Stores `size` calls of `owner` and one task with 5 artifacts; returns the task's id.
async fn store_history(store: &Arc<dyn ArtifactStore>, owner: &OwnerKey, size: usize) -> toolyard_api::storage::RunId {
    futures::stream::iter(0..size)
        .map(|i| {
            let store = store.clone();
            async move {
                let path = format!("calls/call-{i:06}-{}/result.json", toolyard_tests::random_suffix(6));
                store.put(owner, &path, Bytes::from_static(b"{\"ok\":true}")).await.expect("put");
            }
        })
        .buffer_unordered(SETUP_CONCURRENCY)
        .collect::<Vec<()>>()
        .await;
    let id = new_task_id();
    let folder = task_folder(owner, &id);
    for n in 0..5 {
        let path = format!("{folder}outputs/chart-{n}.png");
        store.put(owner, &path, Bytes::from_static(b"not really a png")).await.expect("put");
    }
    store.put(owner, &format!("{folder}result.json"), Bytes::from_static(b"{}")).await.expect("put");
    id
}

/// Mean time of `op` over [`seconds`] (at least 5 runs).
async fn time<F, Fut>(mut op: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let budget = Duration::from_secs_f64(seconds());
    let started = Instant::now();
    let mut runs = 0u32;
    while runs < 5 || started.elapsed() < budget {
        op().await;
        runs += 1;
    }
    started.elapsed() / runs
}

fn seconds() -> f64 {
    std::env::var("TOOLYARD_BENCH_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(2.0)
}

fn calls_per_task() -> usize {
    std::env::var("TOOLYARD_BENCH_CALLS_PER_TASK").ok().and_then(|s| s.parse().ok()).unwrap_or(10)
}

/// The first page of `owner`'s tasks (those `keep` accepts) through the backend's walk.
async fn page(tasks: &KubeTasks, owner: &OwnerKey, subset: Subset, keep: fn(&TaskRecord) -> bool) -> usize {
    let mut page = Vec::new();
    let visit = &mut |r: TaskRecord| {
        if !keep(&r) {
            return ControlFlow::Continue(());
        }
        if page.len() == PAGE {
            return ControlFlow::Break(());
        }
        page.push(r);
        ControlFlow::Continue(())
    };
    tasks.walk(owner, subset, None, visit).await.expect("walk");
    page.len()
}

/// The same page as the gateway made it before the owner index: every watched task filtered
/// by owner, sorted newest first, then the page taken.
fn page_by_scan(store: &Store<CodingTask>, owner: &OwnerKey, keep: fn(&TaskRecord) -> bool) -> usize {
    let mut records: Vec<TaskRecord> = owners_tasks_by_scan(store, owner);
    records.sort_by(|a, b| (b.created_ms, b.id.as_str()).cmp(&(a.created_ms, a.id.as_str())));
    records.into_iter().filter(keep).take(PAGE).count()
}

fn owners_tasks_by_scan(store: &Store<CodingTask>, owner: &OwnerKey) -> Vec<TaskRecord> {
    store
        .state()
        .iter()
        .filter(|t| {
            t.metadata.labels.as_ref().and_then(|l| l.get("toolyard.dev/owner")).map(String::as_str)
                == Some(owner.as_str())
        })
        .filter_map(|t| record_of(t))
        .filter(|r| r.owned_by(owner))
        .collect()
}

fn pending(r: &TaskRecord) -> bool {
    !r.phase.is_finished()
}

/// One size's figures, microseconds per operation.
struct Figures {
    size: usize,
    calls: usize,
    page: f64,
    page_running: f64,
    running: f64,
    artifacts: f64,
    artifacts_fs: f64,
    scan_page: f64,
    scan_running: f64,
}

async fn measure(env: &TestEnv, store: &Arc<dyn ArtifactStore>, size: usize) -> Figures {
    let ns = env.namespace(&format!("history{size}")).await.expect("namespace");
    gateway_support::grant_platform(&ns).await;
    let started = Instant::now();
    create_tasks(env, &ns, size).await;
    let alice = owner("alice").key();
    // Each size stores under an owner of its own, so a size does not see the last one's files.
    let storer = Owner { user: format!("alice-{size}-{}", toolyard_tests::random_suffix(4)), ..owner("alice") }.key();
    let calls = size * calls_per_task();
    let task = store_history(store, &storer, calls).await;
    let folder = toolyard_tests::local::TempDir::new("bench-history");
    let fs: Arc<dyn ArtifactStore> = Arc::new(FsStore::new(folder.path()).expect("folder store"));
    let fs_task = store_history(&fs, &storer, calls).await;
    eprintln!("size {size}: set up in {:.0} s", started.elapsed().as_secs_f64());

    let client = env.client(User::Gateway).await;
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let tasks = KubeTasks::start(client.clone(), &ns, store.clone(), Duration::from_secs(10), stop.clone());
    let (scan_store, writer) = reflector::store();
    let config = watcher::Config::default().labels("app.kubernetes.io/managed-by=toolyard-gateway");
    let api: Api<CodingTask> = Api::namespaced(client, &ns);
    let reflect = watcher(api, config).default_backoff().reflect(writer).for_each(|_| async {});
    let scanning = tokio::spawn(async move {
        tokio::select! {
            () = reflect => {}
            () = stop.cancelled() => {}
        }
    });
    let expected_running = size.div_ceil(100);
    loop {
        let seen = owners_tasks_by_scan(&scan_store, &alice).len();
        if seen == size && tasks.running_of(&alice).await.expect("running") == expected_running {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let micros = |d: Duration| d.as_secs_f64() * 1e6;
    assert_eq!(page(&tasks, &alice, Subset::All, |_| true).await, PAGE.min(size));
    assert_eq!(page_by_scan(&scan_store, &alice, |_| true), PAGE.min(size));
    assert_eq!(page(&tasks, &alice, Subset::Unfinished, pending).await, PAGE.min(expected_running));
    let figures = Figures {
        size,
        calls,
        page: micros(time(|| async { assert!(page(&tasks, &alice, Subset::All, |_| true).await > 0) }).await),
        page_running: micros(
            time(|| async { assert!(page(&tasks, &alice, Subset::Unfinished, pending).await > 0) }).await,
        ),
        running: micros(
            time(|| async { assert_eq!(tasks.running_of(&alice).await.expect("count"), expected_running) }).await,
        ),
        artifacts: micros(
            time(|| async {
                let artifacts = view::artifacts(store.as_ref(), &storer, &task).await.expect("artifacts");
                let files = view::files(store.as_ref(), &storer, &task).await.expect("files");
                assert_eq!((artifacts.len(), files.len()), (5, 6));
            })
            .await,
        ),
        artifacts_fs: micros(
            time(|| async {
                let artifacts = view::artifacts(fs.as_ref(), &storer, &fs_task).await.expect("artifacts");
                let files = view::files(fs.as_ref(), &storer, &fs_task).await.expect("files");
                assert_eq!((artifacts.len(), files.len()), (5, 6));
            })
            .await,
        ),
        scan_page: micros(time(|| async { assert!(page_by_scan(&scan_store, &alice, |_| true) > 0) }).await),
        scan_running: micros(
            time(|| async {
                let n = owners_tasks_by_scan(&scan_store, &alice).iter().filter(|r| pending(r)).count();
                assert_eq!(n, expected_running);
            })
            .await,
        ),
    };
    scanning.abort();
    let deleted = store.delete_folder(&storer, "calls/").await.expect("delete calls");
    assert_eq!(deleted, calls);
    store.delete_folder(&storer, &task_folder(&storer, &task)).await.expect("delete task");
    let namespaces: Api<Namespace> = Api::all(env.client(User::Admin).await);
    let _ = namespaces.delete(&ns, &DeleteParams::default()).await;
    figures
}

#[tokio::main]
async fn main() {
    let sizes: Vec<usize> = std::env::var("TOOLYARD_BENCH_SIZES")
        .unwrap_or_else(|_| "100,10000".into())
        .split(',')
        .map(|s| s.trim().parse().expect("TOOLYARD_BENCH_SIZES: numbers"))
        .collect();
    let env = TestEnv::get();
    env.install_crds().await.expect("CRDs");
    let store = gateway_support::s3_store().await;
    let mut rows = Vec::new();
    for size in sizes {
        rows.push(measure(env, &store, size).await);
    }
    let base = &rows[0];
    println!(
        "\n| N: alice's tasks, and bob's | alice's stored calls | page µs | page of pending µs | running count µs | \
         list_artifacts µs (S3) | list_artifacts µs (folder) | before: page µs | before: running count µs |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        let ratio = |v: f64, b: f64| format!("{v:.1} ({:.2}x)", v / b);
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.size,
            r.calls,
            ratio(r.page, base.page),
            ratio(r.page_running, base.page_running),
            ratio(r.running, base.running),
            ratio(r.artifacts, base.artifacts),
            ratio(r.artifacts_fs, base.artifacts_fs),
            ratio(r.scan_page, base.scan_page),
            ratio(r.scan_running, base.scan_running),
        );
    }
    println!("\nratios: each size against {} in the same run", base.size);
}

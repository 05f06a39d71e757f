//! The artifact store contract, one suite run against both implementations: the S3 store on
//! the real S3 server of the test harness (s3s-fs, real SigV4) and the local folder store.

use std::sync::Arc;

use bytes::Bytes;
use toolyard_api::OwnerKey;
use toolyard_gateway::store::fs::FsStore;
use toolyard_gateway::store::{ArtifactStore, Chunk, ObjectInfo};
use toolyard_tests::local::TempDir;
use toolyard_tests::{TestEnv, random_suffix};

use crate::gateway_support;

/// A fresh owner per run, so runs against the shared bucket never see each other.
fn owners() -> (OwnerKey, OwnerKey) {
    let run = random_suffix(8);
    (OwnerKey::derive("apikey", &format!("alice-{run}")), OwnerKey::derive("apikey", &format!("bob-{run}")))
}

async fn suite(store: &dyn ArtifactStore) {
    let (alice, bob) = owners();
    store.health().await.expect("healthy");

    // Round trip, overwrite, missing objects.
    store.put(&alice, "calls/c1/input.json", Bytes::from_static(b"{\"x\":1}")).await.expect("put");
    assert_eq!(store.get(&alice, "calls/c1/input.json").await.expect("get"), Some(Bytes::from_static(b"{\"x\":1}")));
    store.put(&alice, "calls/c1/input.json", Bytes::from_static(b"{\"x\":2}")).await.expect("overwrite");
    assert_eq!(store.get(&alice, "calls/c1/input.json").await.expect("get"), Some(Bytes::from_static(b"{\"x\":2}")));
    assert_eq!(store.get(&alice, "calls/c1/nothing.json").await.expect("get"), None);
    assert_eq!(store.get_range(&alice, "calls/none/x", 0, 10).await.expect("range"), None);

    // Owners are separate: bob sees nothing of alice's under the same path.
    assert_eq!(store.get(&bob, "calls/c1/input.json").await.expect("get"), None);
    assert!(store.list(&bob, "calls/").await.expect("list").is_empty());

    // Ranges: start, middle, end, past the end, zero length.
    let body: Vec<u8> = (0u8..=99).collect();
    store.put(&alice, "tasks/t1/outputs/data.bin", Bytes::from(body.clone())).await.expect("put");
    let chunk = |b: &[u8]| Chunk { bytes: Bytes::copy_from_slice(b), total: 100 };
    assert_eq!(
        store.get_range(&alice, "tasks/t1/outputs/data.bin", 0, 10).await.expect("range"),
        Some(chunk(&body[..10]))
    );
    assert_eq!(
        store.get_range(&alice, "tasks/t1/outputs/data.bin", 45, 10).await.expect("range"),
        Some(chunk(&body[45..55]))
    );
    assert_eq!(
        store.get_range(&alice, "tasks/t1/outputs/data.bin", 95, 10).await.expect("range"),
        Some(chunk(&body[95..]))
    );
    assert_eq!(store.get_range(&alice, "tasks/t1/outputs/data.bin", 100, 10).await.expect("range"), Some(chunk(&[])));
    assert_eq!(store.get_range(&alice, "tasks/t1/outputs/data.bin", 500, 10).await.expect("range"), Some(chunk(&[])));
    assert_eq!(store.get_range(&alice, "tasks/t1/outputs/data.bin", 3, 0).await.expect("range"), Some(chunk(&[])));

    // Listing: nested paths relative to the owner, sorted, only under the folder asked for.
    store.put(&alice, "tasks/t1/outputs/reports/q3 summary.md", Bytes::from_static(b"# q3")).await.expect("put");
    store.put(&alice, "tasks/t1/result.json", Bytes::from_static(b"{}")).await.expect("put");
    store.put(&alice, "tasks/t10/result.json", Bytes::from_static(b"{}")).await.expect("put");
    let listed = store.list(&alice, "tasks/t1/outputs/").await.expect("list");
    assert_eq!(
        listed,
        vec![
            ObjectInfo { path: "tasks/t1/outputs/data.bin".into(), size: 100 },
            ObjectInfo { path: "tasks/t1/outputs/reports/q3 summary.md".into(), size: 4 },
        ]
    );
    let t1: Vec<String> = store.list(&alice, "tasks/t1/").await.expect("list").into_iter().map(|o| o.path).collect();
    assert!(t1.contains(&"tasks/t1/result.json".to_owned()));
    assert!(!t1.iter().any(|p| p.starts_with("tasks/t10/")), "a folder is not a name prefix: {t1:?}");
    assert!(store.list(&alice, "tasks/nothing/").await.expect("list").is_empty());

    // Traversal and odd names never reach storage, for reads, writes and listings.
    for bad in ["../x", "calls/../../other/calls/c1/input.json", "/etc/passwd", "a//b", "a\\b", "./a", "a\u{0}b", ""] {
        assert!(store.put(&alice, bad, Bytes::from_static(b"x")).await.is_err(), "put {bad:?}");
        assert!(store.get(&alice, bad).await.is_err(), "get {bad:?}");
        assert!(store.get_range(&alice, bad, 0, 1).await.is_err(), "range {bad:?}");
        assert!(store.list(&alice, bad).await.is_err(), "list {bad:?}");
    }
    // Batches: every file written, in one folder or several; a bad path writes nothing.
    let batch = vec![
        ("calls/c2/input.json".to_owned(), Bytes::from_static(b"{\"a\":1}")),
        ("calls/c2/result.json".to_owned(), Bytes::from_static(b"{\"ok\":true}")),
        ("calls/c2/logs/stderr.log".to_owned(), Bytes::from_static(b"warn")),
    ];
    store.put_all(&alice, batch).await.expect("put_all");
    let c2: Vec<String> = store.list(&alice, "calls/c2/").await.expect("list").into_iter().map(|o| o.path).collect();
    assert_eq!(c2, ["calls/c2/input.json", "calls/c2/logs/stderr.log", "calls/c2/result.json"]);
    assert_eq!(
        store.get(&alice, "calls/c2/result.json").await.expect("get"),
        Some(Bytes::from_static(b"{\"ok\":true}"))
    );
    let bad_batch = vec![
        ("calls/c3/input.json".to_owned(), Bytes::from_static(b"{}")),
        ("calls/c3/../../escape.json".to_owned(), Bytes::from_static(b"{}")),
    ];
    assert!(store.put_all(&alice, bad_batch).await.is_err(), "a batch with a traversal is refused");
    assert!(store.list(&alice, "calls/c3/").await.expect("list").is_empty(), "and writes nothing");

    // Create-only writes: the first wins, later ones change nothing; of many at once, one wins.
    assert!(store.create(&alice, "tasks/t1/events/000001.jsonl", Bytes::from_static(b"first")).await.expect("create"));
    assert!(!store.create(&alice, "tasks/t1/events/000001.jsonl", Bytes::from_static(b"again")).await.expect("create"));
    assert_eq!(
        store.get(&alice, "tasks/t1/events/000001.jsonl").await.expect("get"),
        Some(Bytes::from_static(b"first"))
    );
    assert!(store.create(&alice, "../x", Bytes::from_static(b"x")).await.is_err(), "create checks paths too");

    // A traversal attempt aimed at bob's file reads nothing of bob's.
    store.put(&bob, "calls/secret/input.json", Bytes::from_static(b"bob")).await.expect("put");
    let attempt = format!("../{bob}/calls/secret/input.json");
    assert!(store.get(&alice, &attempt).await.is_err());

    // Deleting a folder: everything under it, nothing beside it (t10 is not in t1), nobody
    // else's; again it finds nothing; traversal and file paths are refused.
    assert_eq!(store.delete_folder(&alice, "tasks/t1/").await.expect("delete"), 4);
    assert!(store.list(&alice, "tasks/t1/").await.expect("list").is_empty());
    assert_eq!(store.get(&alice, "tasks/t10/result.json").await.expect("get"), Some(Bytes::from_static(b"{}")));
    assert_eq!(store.delete_folder(&alice, "tasks/t1/").await.expect("delete again"), 0);
    for bad in ["../", &format!("../{bob}/calls/"), "calls/c2/input.json", "", "/calls/"] {
        assert!(store.delete_folder(&alice, bad).await.is_err(), "delete {bad:?}");
    }

    // Deleting files by path: exactly those (a missing one is no error), nothing beside them,
    // nobody else's; a bad path fails the call before anything is deleted.
    store.put(&alice, "asks/a1/answer.json", Bytes::from_static(b"{}")).await.expect("put");
    store.put(&alice, "asks/a2/answer.json", Bytes::from_static(b"{}")).await.expect("put");
    store.put(&alice, "asks/a2/held.json", Bytes::from_static(b"{}")).await.expect("put");
    let paths = ["asks/a1/answer.json", "asks/a2/answer.json", "asks/nothing/answer.json"].map(String::from);
    store.delete(&alice, &paths).await.expect("delete files");
    let left: Vec<String> = store.list(&alice, "asks/").await.expect("list").into_iter().map(|o| o.path).collect();
    assert_eq!(left, ["asks/a2/held.json"]);
    for bad in [format!("../{bob}/calls/secret/input.json"), "asks/a2/".into(), String::new()] {
        let paths = ["asks/a2/held.json".to_owned(), bad.clone()];
        assert!(store.delete(&alice, &paths).await.is_err(), "delete {bad:?}");
    }
    assert_eq!(store.get(&alice, "asks/a2/held.json").await.expect("get"), Some(Bytes::from_static(b"{}")));
    assert_eq!(store.get(&bob, "calls/secret/input.json").await.expect("get"), Some(Bytes::from_static(b"bob")));
}

/// Retention: `expire` deletes every owner's files written before the cutoff and nothing
/// newer. `age` makes a stored file look written `days` ago (each store keeps its own clock).
async fn retention_suite(store: &dyn ArtifactStore, age: impl Fn(&OwnerKey, &str, u64)) -> (OwnerKey, OwnerKey) {
    let (alice, bob) = owners();
    for (owner, path) in
        [(&alice, "calls/old/result.json"), (&bob, "tasks/old/outputs/a.csv"), (&alice, "calls/new/result.json")]
    {
        store.put(owner, path, Bytes::from_static(b"x")).await.expect("put");
    }
    age(&alice, "calls/old/result.json", 3);
    age(&bob, "tasks/old/outputs/a.csv", 3);
    let before = k8s_openapi::jiff::Timestamp::now() - std::time::Duration::from_secs(2 * 86_400);
    assert!(store.expire(before).await.expect("expire") >= 2);
    assert_eq!(store.get(&alice, "calls/old/result.json").await.expect("get"), None);
    assert_eq!(store.get(&bob, "tasks/old/outputs/a.csv").await.expect("get"), None);
    assert_eq!(store.get(&alice, "calls/new/result.json").await.expect("get"), Some(Bytes::from_static(b"x")));
    (alice, bob)
}

#[tokio::test]
async fn both_stores_expire_files_older_than_the_retention() {
    // s3s-fs keeps each object as a file of its folder and reports the file's time.
    let s3 = gateway_support::s3_store().await;
    let env = TestEnv::get();
    let bucket_dir = std::path::Path::new(env.var("TOOLYARD_TEST_RUN")).join("s3").join(env.s3().bucket);
    let set_age = |file: std::path::PathBuf, days: u64| {
        let file =
            std::fs::File::options().write(true).open(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        file.set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(days * 86_400)).expect("mtime");
    };
    retention_suite(s3.as_ref(), |owner, path, days| set_age(bucket_dir.join(format!("owners/{owner}/{path}")), days))
        .await;
    // s3s-fs has no lifecycle rules: the gateway sweeps instead.
    assert!(!s3.expire_after(30).await.expect("asked"), "s3s-fs takes no lifecycle rule");

    let dir = TempDir::new("gw-store-expire");
    let folder = FsStore::new(dir.path()).expect("store");
    let root = folder.root().to_owned();
    let (alice, bob) =
        retention_suite(&folder, |owner, path, days| set_age(root.join(format!("owners/{owner}/{path}")), days)).await;
    assert!(!folder.expire_after(30).await.expect("asked"), "a folder has no lifecycle rules");
    assert!(!root.join(format!("owners/{alice}/calls/old")).exists(), "emptied folders go too");
    assert!(!root.join(format!("owners/{bob}")).exists(), "up to the owner's own");
    assert!(root.join(format!("owners/{alice}/calls/new")).exists());
}

#[tokio::test]
async fn s3_store_keeps_the_contract_on_the_real_s3_server() {
    let store = gateway_support::s3_store().await;
    suite(store.as_ref()).await;
}

#[tokio::test]
async fn folder_store_keeps_the_contract() {
    let dir = TempDir::new("gw-store");
    let store = FsStore::new(dir.path().join("data")).expect("store");
    suite(&store).await;
}

#[tokio::test]
async fn s3_store_reports_a_missing_bucket_as_unhealthy() {
    let s3 = TestEnv::get().s3();
    let settings = toolyard_gateway::store::s3::S3Settings {
        endpoint: Some(s3.endpoint.clone()),
        region: s3.region.clone(),
        bucket: format!("missing-{}", random_suffix(8)),
        access_key: Some(s3.access_key.clone()),
        secret_key: Some(s3.secret_key.clone()),
        ..Default::default()
    };
    let store = toolyard_gateway::store::s3::S3Store::new(&settings).await.expect("store");
    assert!(store.health().await.is_err());
    let wrong_key = toolyard_gateway::store::s3::S3Settings {
        secret_key: Some("not-the-secret".into()),
        bucket: s3.bucket.clone(),
        ..settings
    };
    let store = toolyard_gateway::store::s3::S3Store::new(&wrong_key).await.expect("store");
    assert!(store.health().await.is_err(), "a bad signature is refused by the server");
}

#[tokio::test]
async fn folder_store_never_follows_links_out_of_its_root() {
    let dir = TempDir::new("gw-store-links");
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&outside).expect("outside");
    std::fs::write(outside.join("secret.txt"), b"top secret").expect("secret");
    let store = FsStore::new(dir.path().join("data")).expect("store");
    let (alice, _) = owners();
    store.put(&alice, "calls/c1/input.json", Bytes::from_static(b"{}")).await.expect("put");
    let owner_dir = store.root().join(format!("owners/{alice}"));
    // A link planted as a folder and one planted as a file.
    std::os::unix::fs::symlink(&outside, owner_dir.join("tasks")).expect("dir link");
    std::os::unix::fs::symlink(outside.join("secret.txt"), owner_dir.join("calls/c1/result.json")).expect("file link");
    assert!(store.get(&alice, "tasks/secret.txt").await.is_err());
    assert!(store.get_range(&alice, "tasks/secret.txt", 0, 5).await.is_err());
    assert!(store.get(&alice, "calls/c1/result.json").await.is_err());
    assert!(store.put(&alice, "tasks/t1/result.json", Bytes::from_static(b"x")).await.is_err());
    // In a batch too: the file after a checked one in the same folder is still checked.
    let batch = vec![
        ("calls/c1/input.json".to_owned(), Bytes::from_static(b"{}")),
        ("calls/c1/result.json".to_owned(), Bytes::from_static(b"overwritten")),
    ];
    assert!(store.put_all(&alice, batch).await.is_err(), "a planted file link in a batch is refused");
    assert!(store.put_all(&alice, vec![("tasks/t2/a.json".to_owned(), Bytes::from_static(b"x"))]).await.is_err());
    // And a file in a subfolder of the checked one: the subfolder is checked too.
    std::fs::create_dir_all(owner_dir.join("calls/c2")).expect("c2");
    std::os::unix::fs::symlink(&outside, owner_dir.join("calls/c2/events")).expect("subfolder link");
    let batch = vec![
        ("calls/c2/input.json".to_owned(), Bytes::from_static(b"{}")),
        ("calls/c2/events/000001.jsonl".to_owned(), Bytes::from_static(b"{}\n")),
    ];
    assert!(store.put_all(&alice, batch).await.is_err(), "a planted subfolder link in a batch is refused");
    assert!(!outside.join("000001.jsonl").exists(), "nothing was written through the subfolder link");
    assert!(!outside.join("t2").exists(), "nothing was written through the folder link");
    assert!(!outside.join("t1").exists(), "nothing was written through the link");
    assert!(store.list(&alice, "tasks/").await.is_err());
    let listed = store.list(&alice, "calls/").await.expect("list");
    assert_eq!(
        listed,
        vec![
            ObjectInfo { path: "calls/c1/input.json".into(), size: 2 },
            ObjectInfo { path: "calls/c2/input.json".into(), size: 2 },
        ],
        "links are not listed"
    );
    // Deleting a folder with a link inside removes the link, never what it points to; a
    // folder reached through a link is refused.
    assert_eq!(store.delete_folder(&alice, "calls/c2/").await.expect("delete"), 1);
    assert!(!owner_dir.join("calls/c2").exists());
    assert!(store.delete_folder(&alice, "tasks/").await.is_err());
    assert_eq!(std::fs::read(outside.join("secret.txt")).expect("read"), b"top secret");
}

/// Of creates racing for one path, exactly one wins (S3 gives the same guarantee for
/// `If-None-Match: *`; the test server, s3s-fs, checks and writes in two steps, so the race is
/// shown on the folder store only).
#[tokio::test]
async fn folder_store_creates_are_atomic() {
    let dir = TempDir::new("gw-store-create");
    let store = Arc::new(FsStore::new(dir.path()).expect("store"));
    let alice = owners().0;
    let racing = (0..16).map(|n| {
        let store = store.clone();
        let alice = alice.clone();
        tokio::spawn(
            async move { store.create(&alice, "tasks/t/events/000001.jsonl", Bytes::from(format!("{n}"))).await },
        )
    });
    let won = futures::future::join_all(racing)
        .await
        .into_iter()
        .filter(|r| *r.as_ref().expect("join").as_ref().expect("create"))
        .count();
    assert_eq!(won, 1, "exactly one of the racing creates wins");
    let files = store.list(&alice, "tasks/t/events/").await.expect("list");
    assert_eq!(files.len(), 1, "no temporary file is left: {files:?}");
}

#[tokio::test]
async fn folder_store_writes_are_atomic_and_leave_no_temporary_files() {
    let dir = TempDir::new("gw-store-atomic");
    let store = Arc::new(FsStore::new(dir.path().join("data")).expect("store"));
    let (alice, _) = owners();
    let big = Bytes::from(vec![b'a'; 1 << 20]);
    let small = Bytes::from(vec![b'b'; 10]);
    let mut writers = Vec::new();
    for i in 0..20 {
        let store = store.clone();
        let alice = alice.clone();
        let body = if i % 2 == 0 { big.clone() } else { small.clone() };
        writers.push(tokio::spawn(async move { store.put(&alice, "calls/c1/result.json", body).await }));
    }
    let reader = {
        let store = store.clone();
        let alice = alice.clone();
        let (big, small) = (big.clone(), small.clone());
        tokio::spawn(async move {
            for _ in 0..200 {
                if let Some(seen) = store.get(&alice, "calls/c1/result.json").await.expect("get") {
                    assert!(seen == big || seen == small, "a reader saw a partial file of {} bytes", seen.len());
                }
                tokio::task::yield_now().await;
            }
        })
    };
    for w in writers {
        w.await.expect("join").expect("put");
    }
    reader.await.expect("reader");
    let names: Vec<String> = std::fs::read_dir(store.root().join(format!("owners/{alice}/calls/c1")))
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["result.json"]);
}

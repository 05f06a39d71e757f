//! The client's CPU per object stored in S3 (not a test): the gateway's S3 store (the AWS SDK
//! for Rust, signed `PutObject`) against the same PUTs as bare HTTP requests through reqwest
//! (unsigned: the server refuses them, so only the HTTP exchange counts), one after another
//! against the test cluster's S3 server, in the same run. A warm pool call's record is two or
//! three such objects (`input.json`, `result.json`, its events), written by the gateway.
//!
//! `tests/cluster/cluster.sh start && cargo bench -p toolyard-tests --bench store_puts`
//! `TOOLYARD_BENCH_PUTS` (default 2,000) per row.

#[path = "support/procs.rs"]
mod procs;

use std::time::Instant;

use bytes::Bytes;
use toolyard_api::OwnerKey;
use toolyard_gateway::store::ArtifactStore;
use toolyard_gateway::store::s3::{S3Settings, S3Store};
use toolyard_tests::{TestEnv, random_suffix};

/// CPU seconds (user + system) of this process so far.
fn cpu_seconds() -> f64 {
    procs::cpu_seconds(std::process::id())
}

const BODY: &[u8] = br#"{"price":10.450583572185565,"option_type":"call"}"#;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let puts: usize = std::env::var("TOOLYARD_BENCH_PUTS").ok().and_then(|v| v.parse().ok()).unwrap_or(2000);
    let s3 = TestEnv::get().s3();
    let settings = S3Settings {
        endpoint: Some(s3.endpoint.clone()),
        region: s3.region.clone(),
        bucket: s3.bucket.clone(),
        access_key: Some(s3.access_key.clone()),
        secret_key: Some(s3.secret_key.clone()),
        ..Default::default()
    };
    let store = S3Store::new(&settings).await.expect("store");
    let owner = OwnerKey::derive("bench", &format!("store-puts-{}", random_suffix(6)));
    let http = reqwest::Client::new();
    let prefix = format!("{}/{}/bench-{}", s3.endpoint, s3.bucket, random_suffix(6));

    let mut rows = Vec::new();
    for round in 0..2 {
        // The first round warms connections and caches; the second is reported.
        let (cpu, started) = (cpu_seconds(), Instant::now());
        for i in 0..puts {
            store.put(&owner, &format!("calls/r{round}-{i}/result.json"), Bytes::from_static(BODY)).await.expect("put");
        }
        let sdk = ((cpu_seconds() - cpu) * 1e6 / puts as f64, started.elapsed().as_secs_f64() * 1e6 / puts as f64);
        let (cpu, started) = (cpu_seconds(), Instant::now());
        for i in 0..puts {
            let answer = http.put(format!("{prefix}/r{round}-{i}")).body(BODY).send().await.expect("PUT");
            answer.bytes().await.expect("answer body");
        }
        let bare = ((cpu_seconds() - cpu) * 1e6 / puts as f64, started.elapsed().as_secs_f64() * 1e6 / puts as f64);
        rows = vec![("S3 store (AWS SDK, signed PutObject)", sdk), ("bare reqwest PUT (unsigned)", bare)];
    }
    println!("\n{puts} PUTs of {} bytes, one after another:", BODY.len());
    for (name, (cpu, wall)) in &rows {
        println!("{name:<40} CPU {cpu:6.0} µs per PUT   wall {wall:6.0} µs");
    }
    println!("S3 store / bare PUT, CPU per PUT: {:.2}x", rows[0].1.0 / rows[1].1.0);
}

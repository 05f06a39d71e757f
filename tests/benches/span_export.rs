//! Span export when the collector is slow (not a test): how many spans per second reach an
//! OTLP/HTTP collector that takes 0 ms (the baseline), 100 ms or 1 s to answer each batch, and
//! how many are dropped, while 4 threads make spans as the gateway does for each call (a
//! `tools/call` span with `authorize` and `execute` children) as fast as they can.
//!
//! `cargo bench -p toolyard-tests --bench span_export` (no cluster needed).
//! `TOOLYARD_BENCH_SECONDS` (default 5) per collector.
//!
//! Each collector is measured with a fresh process of this bench (the tracing set-up is global
//! to a process), set up by `toolyard_telemetry::init` exactly as the binaries do, with the
//! standard variables pointing at the collector. The collector is this program too: an axum
//! server decoding each `ExportTraceServiceRequest` (opentelemetry-proto) to count its spans,
//! then waiting the configured delay before answering.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;

const ROLE: &str = "TOOLYARD_BENCH_ROLE";
const THREADS: usize = 4;

#[derive(Default)]
struct Received {
    spans: AtomicU64,
    requests: AtomicU64,
}

async fn collect(State((received, delay)): State<(Arc<Received>, Duration)>, body: Bytes) -> &'static [u8] {
    if let Ok(request) = ExportTraceServiceRequest::decode(body) {
        let spans: usize = request.resource_spans.iter().flat_map(|r| &r.scope_spans).map(|s| s.spans.len()).sum();
        received.spans.fetch_add(spans as u64, Ordering::Relaxed);
    }
    received.requests.fetch_add(1, Ordering::Relaxed);
    tokio::time::sleep(delay).await;
    // An empty ExportTraceServiceResponse.
    b""
}

/// The child: makes calls' spans for `seconds`, then flushes (bounded) and prints the count.
fn make_spans(seconds: f64) {
    let telemetry = toolyard_telemetry::init(toolyard_telemetry::Settings {
        service: "toolyard-gateway",
        format: toolyard_telemetry::LogFormat::Plain,
        filter_var: "RUST_LOG",
        default_filter: "warn",
    });
    assert!(telemetry.exporting(), "OTEL_EXPORTER_OTLP_ENDPOINT names the collector");
    let stop = Arc::new(AtomicBool::new(false));
    let made = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let (stop, made) = (stop.clone(), made.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let call = tracing::info_span!(target: "toolyard_gateway", "tools/call", "otel.kind" = "server");
                    call.in_scope(|| {
                        tracing::info_span!(target: "toolyard_gateway", "authorize").in_scope(|| {});
                        tracing::info_span!(target: "toolyard_gateway", "execute").in_scope(|| {});
                    });
                    drop(call);
                    made.fetch_add(3, Ordering::Relaxed);
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(seconds));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("span thread");
    }
    let flushing = Instant::now();
    telemetry.shutdown();
    println!("made {} flush_ms {}", made.load(Ordering::Relaxed), flushing.elapsed().as_millis());
}

fn main() {
    let seconds: f64 = std::env::var("TOOLYARD_BENCH_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(5.0);
    if std::env::var(ROLE).as_deref() == Ok("spans") {
        return make_spans(seconds);
    }
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    println!("# Span export to a slow collector ({seconds} s per collector, {THREADS} threads making spans)");
    println!();
    println!(
        "| collector answers in | spans made/s | spans received/s | received / made | batches | flush at exit ms | received/s against the 0 ms collector |"
    );
    println!("|---|---|---|---|---|---|---|");
    let mut baseline = None;
    for delay_ms in [0u64, 100, 1000] {
        let received = Arc::new(Received::default());
        let app = Router::new()
            .route("/v1/traces", post(collect))
            .with_state((received.clone(), Duration::from_millis(delay_ms)));
        let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = runtime.spawn(async move { axum::serve(listener, app).await });
        let out = std::process::Command::new(std::env::current_exe().expect("exe"))
            .env(ROLE, "spans")
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{addr}"))
            .env_remove("OTEL_BSP_SCHEDULE_DELAY")
            .output()
            .expect("the span process");
        server.abort();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "span process: {text}{}", String::from_utf8_lossy(&out.stderr));
        let mut words = text.split_whitespace();
        let made: f64 = words.nth(1).and_then(|n| n.parse().ok()).expect("made");
        let flush_ms: u64 = words.nth(1).and_then(|n| n.parse().ok()).expect("flush_ms");
        let got = received.spans.load(Ordering::Relaxed) as f64;
        let per_second = got / seconds;
        let base = *baseline.get_or_insert(per_second);
        println!(
            "| {delay_ms} ms | {:.0} | {:.0} | {:.3} | {} | {flush_ms} | {:.3} |",
            made / seconds,
            per_second,
            got / made,
            received.requests.load(Ordering::Relaxed),
            per_second / base
        );
    }
}

//! The operations listener: `/metrics` (Prometheus text), `/healthz` (the process serves) and
//! `/readyz` (caches synced while leading, or waiting as a standby replica).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// State of the operations endpoints.
#[derive(Clone)]
pub struct Ops {
    /// Metrics to expose.
    pub metrics: Arc<Metrics>,
    /// True when the replica is ready (see module docs).
    pub ready: Arc<AtomicBool>,
}

/// The router.
pub fn router(ops: Ops) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(ops)
}

async fn metrics(State(ops): State<Ops>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], ops.metrics.encode())
}

async fn readyz(State(ops): State<Ops>) -> impl IntoResponse {
    if ops.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced")
    }
}

/// Serves until `shutdown`.
pub async fn serve(listener: TcpListener, ops: Ops, shutdown: CancellationToken) -> std::io::Result<()> {
    axum::serve(listener, router(ops)).with_graceful_shutdown(async move { shutdown.cancelled().await }).await
}

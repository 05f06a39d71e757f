//! `toolyard-runner serve --port P -- CMD...`: the Pool-mode server of a warm pod, a
//! [`WorkerPool`] behind HTTP (the gateway's local mode calls its pools in-process instead).
//!
//! `POST /v1/call` with a call token signed by the pool's derived key runs one call: a fresh
//! CMD process per call, or, with `--reuse`, a call on one of the long-lived JSON-lines
//! workers (one per slot). The answer holds the result, the logs and the function's progress
//! reports. At most `--concurrency` calls run and `--queue` wait; beyond that
//! the answer is 503 with `Retry-After`. `GET /readyz` is 200 once the workers are up.

mod auth;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

use anyhow::Context;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use clap::Args;
use serde_json::json;
use toolyard_api::mcptool::DEFAULT_QUEUE_PER_SLOT;
use toolyard_api::protocol::pool::{self, PoolCallRequest, PoolCallResponse, PoolRefusal};
use toolyard_process::pool::{PoolCall, PoolSettings, Readiness, WorkerPool};
use toolyard_process::progress::ProgressLog;

use crate::capture::DEFAULT_LOG_LIMIT;
use crate::child::ToolCommand;

/// Largest request body (the arguments).
const MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;
/// Longest call accepted (the longest tool timeout plus slack).
const MAX_CALL_MS: u64 = 3_700_000;

/// Arguments of `serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "TOOLYARD_POOL_HOST", default_value = "0.0.0.0")]
    pub host: std::net::IpAddr,
    /// Port to listen on (0: any free port, printed on stdout as `listening on ADDR`).
    #[arg(long, env = "TOOLYARD_POOL_PORT", default_value_t = pool::DEFAULT_PORT)]
    pub port: u16,
    /// File holding the pool's derived key, hex-encoded.
    #[arg(long, env = pool::env::KEY_FILE)]
    pub key_file: Option<PathBuf>,
    /// Calls run at once.
    #[arg(long, env = pool::env::CONCURRENCY, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub concurrency: u16,
    /// Calls that may wait for a slot before the server answers 503 (default: 8 per slot). A
    /// waiting call's time counts toward its deadline.
    #[arg(long, env = pool::env::QUEUE, value_parser = clap::value_parser!(u16).range(0..=4096))]
    pub queue: Option<u16>,
    /// Keep one long-lived worker process per slot (JSON lines) instead of a fresh process per call.
    #[arg(long, env = pool::env::REUSE, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub reuse: bool,
    /// Seconds a reused worker may take to report ready.
    #[arg(long, env = "TOOLYARD_POOL_STARTUP_SECONDS", default_value_t = 120)]
    pub startup_timeout: u64,
    /// Seconds between SIGTERM and SIGKILL of a fresh call's process group at its deadline.
    #[arg(long, env = "TOOLYARD_KILL_GRACE_SECONDS", default_value_t = 2.0)]
    pub kill_grace: f64,
    /// Bytes kept of each of a call's stdout and stderr.
    #[arg(long, env = "TOOLYARD_LOG_LIMIT", default_value_t = DEFAULT_LOG_LIMIT)]
    pub log_limit: usize,
    /// Shut down when stdin closes: a local parent keeps the pipe open while it lives, so its
    /// workers never outlive it.
    #[arg(long)]
    pub exit_on_stdin_eof: bool,
    /// The tool command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// The server's shared state.
struct Server {
    key: toolyard_api::token::SigningKey,
    pool: Arc<WorkerPool>,
}

/// Runs the server until SIGTERM or SIGINT.
pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let key_env = std::env::var(pool::env::KEY).ok();
    let key = auth::load_key(args.key_file.as_deref(), key_env.as_deref()).map_err(anyhow::Error::msg)?;
    let kill_grace = Duration::try_from_secs_f64(args.kill_grace).context("--kill-grace must be non-negative")?;
    let slots = usize::from(args.concurrency);
    let pool = WorkerPool::new(PoolSettings {
        command: ToolCommand::new(args.command),
        reuse: args.reuse,
        concurrency: slots,
        queue: args.queue.map_or(slots * DEFAULT_QUEUE_PER_SLOT.unsigned_abs() as usize, usize::from),
        startup_timeout: Duration::from_secs(args.startup_timeout),
        kill_grace,
        log_limit: args.log_limit,
    });
    let server = Arc::new(Server { key, pool: Arc::clone(&pool) });

    let listener = tokio::net::TcpListener::bind(SocketAddr::new(args.host, args.port))
        .await
        .with_context(|| format!("cannot listen on {}:{}", args.host, args.port))?;
    let addr = listener.local_addr()?;
    // Before serving: a call never finds a slot without its worker because of start-up.
    pool.start().await;
    // The one line on stdout: how a parent that asked for port 0 learns the port.
    println!("listening on {addr}");
    tracing::info!(%addr, reuse = args.reuse, concurrency = slots, "pool server listening");

    let app = Router::new().route(pool::CALL_PATH, post(call)).route(pool::READY_PATH, get(ready)).with_state(server);
    axum::serve(listener, app).with_graceful_shutdown(shutdown_signal(args.exit_on_stdin_eof)).await?;
    // Idle workers are killed with their process groups.
    pool.close();
    Ok(())
}

async fn ready(State(server): State<Arc<Server>>) -> Response {
    match server.pool.readiness() {
        Readiness::Ready => {
            let load = server.pool.load();
            let body = json!({"ready": true, "running": load.running, "waiting": load.waiting});
            (StatusCode::OK, axum::Json(body)).into_response()
        }
        Readiness::Starting => error_response(StatusCode::SERVICE_UNAVAILABLE, "workers are starting"),
        Readiness::Failed(error) => error_response(StatusCode::SERVICE_UNAVAILABLE, &error),
    }
}

async fn call(State(server): State<Arc<Server>>, headers: HeaderMap, body: Body) -> Response {
    let bytes = match axum::body::to_bytes(body, MAX_REQUEST_BYTES).await {
        Ok(bytes) => bytes,
        Err(_) => {
            let message = format!("the request body is larger than {MAX_REQUEST_BYTES} bytes");
            return error_response(StatusCode::PAYLOAD_TOO_LARGE, &message);
        }
    };
    let request: PoolCallRequest = match serde_json::from_slice(&bytes) {
        Ok(r) => r,
        Err(e) => return error_response(StatusCode::BAD_REQUEST, &format!("the request is not a pool call: {e}")),
    };
    let owner = match auth::check(&server.key, &headers, &request.id, now()) {
        Ok(claims) => claims.owner.key(),
        Err((status, message)) => return error_response(status, &message),
    };
    if request.timeout_ms == 0 || request.timeout_ms > MAX_CALL_MS {
        return error_response(StatusCode::BAD_REQUEST, &format!("timeoutMs must be between 1 and {MAX_CALL_MS}"));
    }
    // The pool pod's span of the call (the gateway's `execute` is its parent); the function's
    // own span is its child.
    let span = tracing::info_span!("call", "otel.kind" = "server", "toolyard.call.id" = %request.id);
    let traceparent = toolyard_telemetry::continue_trace(&span, request.traceparent.clone());
    // The function's progress reports go back with the answer (a pool pod has no credential
    // for the gateway's internal API).
    let progress = ProgressLog::new(None);
    let reporter = progress.reporter();
    let call = PoolCall {
        id: &request.id,
        arguments: &request.arguments,
        timeout: Duration::from_millis(request.timeout_ms),
        traceparent: traceparent.as_deref(),
        progress: Some(&reporter),
        caller: request.caller.as_ref(),
        owner: &owner,
    };
    let called = server.pool.call(call).instrument(span).await;
    let progress = progress.events();
    let output = match called {
        Ok(output) => output,
        Err(refused) => {
            let body = PoolRefusal { error: refused.to_string(), reason: refused };
            let mut response = (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            return response;
        }
    };
    let result = output.result;
    tracing::debug!(call = %request.id, ok = !result.is_error(), duration_ms = result.duration_ms, "pool call finished");
    let files = output.files.iter().map(|o| B64.encode(&o.bytes)).collect();
    let response = PoolCallResponse {
        result,
        stdout: output.stdout.into_text(),
        stderr: output.stderr.into_text(),
        progress,
        files,
    };
    (StatusCode::OK, axum::Json(response)).into_response()
}

fn error_response(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(json!({"error": message}))).into_response()
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Returns on SIGTERM or SIGINT, or (with `stdin_eof`) when stdin closes.
pub(crate) async fn shutdown_signal(stdin_eof: bool) {
    use tokio::io::AsyncReadExt;
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).ok();
    let mut int = signal(SignalKind::interrupt()).ok();
    let parent_gone = async {
        if !stdin_eof {
            return std::future::pending().await;
        }
        let mut stdin = tokio::io::stdin();
        let mut buf = [0u8; 256];
        while matches!(stdin.read(&mut buf).await, Ok(n) if n > 0) {}
    };
    tokio::select! {
        Some(()) = async { term.as_mut()?.recv().await } => {},
        Some(()) = async { int.as_mut()?.recv().await } => {},
        () = parent_gone => {},
    }
    tracing::info!("shutting down");
}

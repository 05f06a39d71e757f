//! `toolyard-runner serve --port P -- CMD...`: the Pool-mode server of a warm pod (or a
//! local warm worker of the embedded mode).
//!
//! `POST /v1/call` with a call token signed by the pool's derived key runs one call: a fresh
//! CMD process per call, or, with `--reuse`, a call on one of the long-lived JSON-lines
//! workers (one per slot). At most `--concurrency` calls run and `--queue` wait; beyond that
//! the answer is 503 with `Retry-After`. `GET /readyz` is 200 once the workers are up.

mod admission;
mod auth;
mod worker;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use clap::Args;
use serde_json::json;
use tokio::sync::Mutex;
use toolyard_api::protocol::pool::{self, PoolCallRequest, PoolCallResponse};
use toolyard_api::protocol::{CallErrorKind, CallResult};

use crate::capture::{Captured, DEFAULT_LOG_LIMIT};
use crate::child::{self, RunSpec, StopReason};
use admission::Admission;
use worker::Worker;

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
    /// Calls that may wait for a slot before the server answers 503.
    #[arg(long, env = "TOOLYARD_POOL_QUEUE", default_value_t = 4)]
    pub queue: u16,
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
    /// Shut down when stdin closes: a local parent (the embedded gateway) keeps the pipe open
    /// while it lives, so its workers never outlive it.
    #[arg(long)]
    pub exit_on_stdin_eof: bool,
    /// The tool command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// The server's shared state.
struct Server {
    key: toolyard_api::token::SigningKey,
    admission: Admission,
    argv: Vec<String>,
    kill_grace: Duration,
    log_limit: usize,
    startup_timeout: Duration,
    /// Reuse mode: the idle workers (one per free slot; `None` where a start failed).
    workers: Option<Mutex<Vec<Option<Worker>>>>,
    ready: AtomicBool,
    startup_error: std::sync::Mutex<Option<String>>,
}

/// Runs the server until SIGTERM or SIGINT.
pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let key_env = std::env::var(pool::env::KEY).ok();
    let key = auth::load_key(args.key_file.as_deref(), key_env.as_deref()).map_err(anyhow::Error::msg)?;
    let kill_grace = Duration::try_from_secs_f64(args.kill_grace).context("--kill-grace must be non-negative")?;
    let slots = usize::from(args.concurrency);
    let server = Arc::new(Server {
        key,
        admission: Admission::new(slots, usize::from(args.queue)),
        argv: args.command,
        kill_grace,
        log_limit: args.log_limit,
        startup_timeout: Duration::from_secs(args.startup_timeout),
        workers: args.reuse.then(|| Mutex::new(Vec::new())),
        ready: AtomicBool::new(!args.reuse),
        startup_error: std::sync::Mutex::new(None),
    });

    let listener = tokio::net::TcpListener::bind(SocketAddr::new(args.host, args.port))
        .await
        .with_context(|| format!("cannot listen on {}:{}", args.host, args.port))?;
    let addr = listener.local_addr()?;
    if args.reuse {
        // Before serving: a call never finds a slot without its worker because of start-up.
        start_workers(&server, slots).await;
    }
    // The one line on stdout: how a parent that asked for port 0 learns the port.
    println!("listening on {addr}");
    tracing::info!(%addr, reuse = args.reuse, concurrency = slots, "pool server listening");

    let app = Router::new()
        .route(pool::CALL_PATH, post(call))
        .route(pool::READY_PATH, get(ready))
        .with_state(Arc::clone(&server));
    axum::serve(listener, app).with_graceful_shutdown(shutdown_signal(args.exit_on_stdin_eof)).await?;
    // Workers are killed with their process groups when the state drops.
    drop(server);
    Ok(())
}

/// Starts one worker per slot, concurrently; a failed start leaves its slot empty (a call
/// tries again) and makes `/readyz` answer 503 with the reason.
async fn start_workers(server: &Arc<Server>, slots: usize) {
    let handles: Vec<_> = (0..slots)
        .map(|_| {
            let server = Arc::clone(server);
            tokio::spawn(async move { Worker::start(&server.argv, server.startup_timeout, server.log_limit).await })
        })
        .collect();
    let mut workers = Vec::with_capacity(slots);
    let mut first_error = None;
    for handle in handles {
        match handle.await {
            Ok(Ok(worker)) => workers.push(Some(worker)),
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
                workers.push(None);
            }
            Err(e) => {
                first_error.get_or_insert(format!("worker start panicked: {e}"));
                workers.push(None);
            }
        }
    }
    if let Some(slot) = &server.workers {
        *slot.lock().await = workers;
    }
    match first_error {
        Some(error) => {
            tracing::error!(%error, "worker start failed");
            *server.startup_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(error);
        }
        None => {
            tracing::info!(workers = slots, "workers ready");
            server.ready.store(true, Ordering::Release);
        }
    }
}

async fn ready(State(server): State<Arc<Server>>) -> Response {
    if server.ready.load(Ordering::Acquire) {
        return (StatusCode::OK, axum::Json(json!({"ready": true}))).into_response();
    }
    let error = server.startup_error.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let message = error.unwrap_or_else(|| "workers are starting".into());
    error_response(StatusCode::SERVICE_UNAVAILABLE, &message)
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
    if let Err((status, message)) = auth::check(&server.key, &headers, &request.id, now()) {
        return error_response(status, &message);
    }
    if request.timeout_ms == 0 || request.timeout_ms > MAX_CALL_MS {
        return error_response(StatusCode::BAD_REQUEST, &format!("timeoutMs must be between 1 and {MAX_CALL_MS}"));
    }
    let Some(admitted) = server.admission.admit().await else {
        let mut response = error_response(StatusCode::SERVICE_UNAVAILABLE, "every slot and the queue are busy");
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        return response;
    };
    let timeout = Duration::from_millis(request.timeout_ms);
    let (result, stdout, stderr) = match &server.workers {
        None => {
            let spec = RunSpec {
                argv: server.argv.clone(),
                stdin: serde_json::to_vec(&request.arguments).unwrap_or_default(),
                traceparent: request.traceparent,
                log_limit: server.log_limit,
                kill_grace: server.kill_grace,
            };
            let output = child::run_once(spec, async {
                tokio::time::sleep(timeout).await;
                StopReason::Deadline(timeout)
            })
            .await;
            drop(admitted);
            (output.result, output.stdout, output.stderr)
        }
        Some(workers) => call_worker(&server, workers, &request.id, &request.arguments, timeout, admitted).await,
    };
    tracing::debug!(call = %request.id, ok = !result.is_error(), duration_ms = result.duration_ms, "pool call finished");
    let response = PoolCallResponse { result, stdout: stdout.into_text(), stderr: stderr.into_text() };
    (StatusCode::OK, axum::Json(response)).into_response()
}

/// One call on a reused worker: take an idle one (starting it if its slot has none or it
/// died while idle), call it, and give it back — or replace it in the background.
async fn call_worker(
    server: &Arc<Server>,
    workers: &Mutex<Vec<Option<Worker>>>,
    id: &str,
    arguments: &serde_json::Map<String, serde_json::Value>,
    timeout: Duration,
    admitted: admission::Admitted,
) -> (CallResult, Captured, Captured) {
    // Holding a slot guarantees an entry: there are as many entries as slots once started.
    let taken = workers.lock().await.pop().flatten().and_then(|mut w| w.is_alive().then_some(w));
    let mut worker = match taken {
        Some(w) => w,
        None => match Worker::start(&server.argv, server.startup_timeout, server.log_limit).await {
            Ok(w) => {
                server.mark_started();
                w
            }
            Err(e) => {
                workers.lock().await.push(None);
                let result = CallResult::err(CallErrorKind::SpawnFailed, e, None, 0);
                return (result, Captured::default(), Captured::default());
            }
        },
    };
    let outcome = worker.call(id, arguments, timeout).await;
    if outcome.reusable {
        workers.lock().await.push(Some(worker));
        drop(admitted);
    } else {
        drop(worker);
        tracing::warn!(call = %id, "replacing the worker");
        let server = Arc::clone(server);
        tokio::spawn(async move {
            let replacement = Worker::start(&server.argv, server.startup_timeout, server.log_limit).await;
            match &replacement {
                Ok(_) => server.mark_started(),
                Err(e) => tracing::error!(error = %e, "worker restart failed"),
            }
            if let Some(workers) = &server.workers {
                workers.lock().await.push(replacement.ok());
            }
            drop(admitted);
        });
    }
    (outcome.result, Captured::default(), outcome.stderr)
}

impl Server {
    /// A worker started after a failed start-up: the server is ready again.
    fn mark_started(&self) {
        if !self.ready.swap(true, Ordering::AcqRel) {
            self.startup_error.lock().unwrap_or_else(|e| e.into_inner()).take();
        }
    }
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

async fn shutdown_signal(stdin_eof: bool) {
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

//! Serving routers on listeners (hyper, plain or rustls) with header limits, a request body
//! deadline and a graceful shutdown shared by every listener.
//!
//! Each listener has its own accept loop; each connection is one task running hyper's
//! HTTP/1 + HTTP/2 connection, wrapped in [`RepollSelfWakes`] (hyper wakes a connection's own
//! task once per request with a body; see that module).
//!
//! Every request body has a deadline ([`ServerSettings::body_read_timeout`], tower-http's
//! [`RequestBodyDeadline`]): a body still arriving after it fails to read with an error
//! [`is_body_timeout`] recognizes, which the handlers answer with 408. A client trickling a body
//! byte by byte thus holds its request (and the admission slot it took) for that long at most.
//!
//! Shutdown, on SIGTERM/SIGINT or when the caller's trigger fires:
//! 1. the app's shutdown token is cancelled: new MCP requests get 503 with `Retry-After` and
//!    `Connection: close`, `/readyz` fails, subscription streams end;
//! 2. the listeners drained first (the public one) stop accepting; open connections finish
//!    their in-flight requests (tool calls run to completion) for up to the grace period,
//!    while the others (the internal runner API, ops) keep serving, so runners can still
//!    upload the results those calls wait for;
//! 3. at the end of the grace period the remaining MCP streams and connections are cut;
//! 4. then the other listeners drain (a few seconds at most).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tower_http::timeout::{RequestBodyDeadline, TimeoutError};

use crate::coarse_timer::CoarseTimer;
use crate::metrics::{Metrics, Rejection};
use crate::self_wake::RepollSelfWakes;
use crate::tls::TlsConfig;

/// HTTP server settings.
#[derive(Clone, Debug)]
pub struct ServerSettings {
    /// How long in-flight requests may run after shutdown starts.
    pub shutdown_grace: Duration,
    /// Most header fields in one HTTP/1 request (more: the connection gets 431).
    pub max_headers: usize,
    /// Largest header block in bytes (HTTP/1 read buffer, HTTP/2 header list).
    pub max_header_bytes: usize,
    /// Time a client has to send its request headers, counted on a keep-alive connection from
    /// the previous answer (so it is also the idle limit). Enforced on a one-second clock
    /// ([`CoarseTimer`]): the connection closes up to a second after it.
    pub header_read_timeout: Duration,
    /// Time a client has to send a request's whole body, counted from the end of its headers.
    pub body_read_timeout: Duration,
    /// Connections each listener holds open at once. One accepted beyond it is closed at once,
    /// before anything is read: each open connection holds about 30 KiB (hyper's buffers,
    /// docs/benchmarks.md), so a client opening connections without end cannot exhaust the
    /// replica's memory.
    pub max_connections: usize,
    /// Where refused connections are counted (`admission_rejections_total{reason="connections"}`).
    pub metrics: Option<Arc<Metrics>>,
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            shutdown_grace: Duration::from_secs(30),
            max_headers: 64,
            max_header_bytes: 64 * 1024,
            header_read_timeout: Duration::from_secs(30),
            body_read_timeout: Duration::from_secs(30),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            metrics: None,
        }
    }
}

/// How often at most a listener at its connection cap says so in the log.
const REFUSAL_WARNING_INTERVAL: Duration = Duration::from_secs(60);

/// Default of [`ServerSettings::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;

/// One listener and what it serves.
pub struct Listener {
    /// Name for logs (`public`, `internal`, `metrics`).
    pub name: &'static str,
    /// The bound socket.
    pub socket: std::net::TcpListener,
    /// The router.
    pub router: Router,
    /// TLS configuration (reloadable, see [`crate::tls::reloading_config`]), or plain HTTP.
    pub tls: Option<TlsConfig>,
    /// When this listener stops during shutdown.
    pub drain: Drain,
}

/// The order listeners stop in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drain {
    /// Stops accepting as soon as shutdown starts (the public listener).
    First,
    /// Keeps serving until the first ones have drained (internal API, ops).
    Last,
}

/// How long the listeners drained last may take once the first ones are done.
const LAST_DRAIN_GRACE: Duration = Duration::from_secs(5);

/// How long a client has to finish the TLS handshake.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the accept loop waits after an error that is not about one connection (like
/// running out of file descriptors) before accepting again.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener").field("name", &self.name).field("tls", &self.tls.is_some()).finish_non_exhaustive()
    }
}

/// The tokens the shutdown sequence fires.
#[derive(Clone, Debug, Default)]
pub struct ShutdownTokens {
    /// Fires shutdown from outside (tests, the local mode); signals fire it too.
    pub trigger: CancellationToken,
    /// The app's token (`AppState::shutdown`): fired at the start of shutdown.
    pub app: CancellationToken,
    /// Cuts the remaining MCP streams: fired at the end of the grace period.
    pub streams: CancellationToken,
}

/// Binds `addr` (a `host:port` string) with a clear error.
pub fn bind(name: &str, addr: &str) -> anyhow::Result<std::net::TcpListener> {
    let listener =
        std::net::TcpListener::bind(addr).with_context(|| format!("binding the {name} listener to {addr}"))?;
    listener.set_nonblocking(true).context("setting the listener non-blocking")?;
    Ok(listener)
}

/// hyper's connection settings: header limits and the header-read deadline.
fn builder(settings: &ServerSettings, timer: &CoarseTimer) -> Builder<TokioExecutor> {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(timer.clone())
        .max_headers(settings.max_headers)
        .max_buf_size(settings.max_header_bytes.max(8192))
        .header_read_timeout(settings.header_read_timeout);
    builder.http2().max_header_list_size(u32::try_from(settings.max_header_bytes).unwrap_or(u32::MAX));
    builder
}

/// Serves every listener until shutdown (signal or `tokens.trigger`), then drains them.
/// Returns an error if a listener fails.
pub async fn serve(listeners: Vec<Listener>, settings: &ServerSettings, tokens: ShutdownTokens) -> anyhow::Result<()> {
    let first = CancellationToken::new();
    let last = CancellationToken::new();
    let mut first_tasks = JoinSet::new();
    let mut last_tasks = JoinSet::new();
    let timer = CoarseTimer::start();
    let builder = Arc::new(builder(settings, &timer));
    for l in listeners {
        let addr = l.socket.local_addr().context("listener address")?;
        let (drain, grace, tasks) = match l.drain {
            Drain::First => (first.clone(), settings.shutdown_grace, &mut first_tasks),
            Drain::Last => (last.clone(), LAST_DRAIN_GRACE, &mut last_tasks),
        };
        let name = l.name;
        tracing::info!(listener = name, %addr, tls = l.tls.is_some(), "listening");
        let socket = tokio::net::TcpListener::from_std(l.socket).context("listener socket")?;
        let service = RequestBodyDeadline::new(l.router, settings.body_read_timeout);
        let served = Served {
            service,
            tls: l.tls,
            builder: Arc::clone(&builder),
            max_connections: settings.max_connections.max(1),
            metrics: settings.metrics.clone(),
        };
        tasks.spawn(async move { (name, accept_loop(name, socket, served, drain, grace).await) });
    }

    let failure = tokio::select! {
        () = tokens.trigger.cancelled() => None,
        () = termination_signal() => None,
        Some(done) = first_tasks.join_next() => Some(done),
        Some(done) = last_tasks.join_next() => Some(done),
    };
    tracing::info!(grace_seconds = settings.shutdown_grace.as_secs(), "shutting down");
    tokens.app.cancel();
    first.cancel();
    let streams = tokens.streams.clone();
    let grace = settings.shutdown_grace;
    let cutter = tokio::spawn(async move {
        tokio::time::sleep(grace).await;
        streams.cancel();
    });
    let mut result = match failure {
        Some(done) => listener_result(done),
        None => Ok(()),
    };
    while let Some(done) = first_tasks.join_next().await {
        if result.is_ok() {
            result = listener_result(done);
        }
    }
    cutter.abort();
    tokens.streams.cancel();
    last.cancel();
    while let Some(done) = last_tasks.join_next().await {
        if result.is_ok() {
            result = listener_result(done);
        }
    }
    tracing::info!("stopped");
    result
}

/// What a listener's connections are served with.
struct Served {
    service: RequestBodyDeadline<Router>,
    tls: Option<TlsConfig>,
    builder: Arc<Builder<TokioExecutor>>,
    max_connections: usize,
    metrics: Option<Arc<Metrics>>,
}

/// Accepts connections until `drain` fires, then lets them finish their in-flight requests
/// for up to `grace` and cuts the rest.
async fn accept_loop(
    name: &'static str,
    socket: tokio::net::TcpListener,
    served: Served,
    drain: CancellationToken,
    grace: Duration,
) -> std::io::Result<()> {
    let served = Arc::new(served);
    let graceful = GracefulShutdown::new();
    let mut connections = JoinSet::new();
    // Connections refused since the last warning, which comes at most once a minute.
    let (mut refused, mut warned_at) = (0u64, None::<std::time::Instant>);
    loop {
        let stream = tokio::select! {
            biased;
            () = drain.cancelled() => break,
            // Finished connection tasks are reaped as they end.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = socket.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    tracing::warn!(listener = name, error = %e, "accepting a connection failed; pausing");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    continue;
                }
            },
        };
        if connections.len() >= served.max_connections {
            drop(stream);
            if let Some(metrics) = &served.metrics {
                metrics.admission_rejected(Rejection::Connections);
            }
            refused += 1;
            if warned_at.is_none_or(|at| at.elapsed() >= REFUSAL_WARNING_INTERVAL) {
                tracing::warn!(
                    listener = name,
                    max_connections = served.max_connections,
                    refused,
                    "connection limit reached: new connections are closed until some end"
                );
                (refused, warned_at) = (0, Some(std::time::Instant::now()));
            }
            continue;
        }
        let _ = stream.set_nodelay(true);
        connections.spawn(serve_connection(stream, Arc::clone(&served), graceful.watcher(), drain.clone()));
    }
    drop(socket);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(grace) => {
            tracing::warn!(listener = name, grace_seconds = grace.as_secs(), "cutting connections still open after the grace period");
        }
    }
    connections.shutdown().await;
    Ok(())
}

/// Serves one connection: the TLS handshake if any, then HTTP/1 or HTTP/2 until the client
/// leaves or the listener drains.
async fn serve_connection(stream: TcpStream, served: Arc<Served>, watcher: Watcher, drain: CancellationToken) {
    match &served.tls {
        None => serve_http(stream, &served, watcher).await,
        Some(tls) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(tls.current());
            let stream = tokio::select! {
                biased;
                () = drain.cancelled() => return,
                handshake = tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)) => match handshake {
                    Ok(Ok(stream)) => stream,
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!("TLS handshake timed out");
                        return;
                    }
                },
            };
            serve_http(stream, &served, watcher).await;
        }
    }
}

/// HTTP/1 or HTTP/2 on `io` until the client leaves or the listener drains.
async fn serve_http<I>(io: I, served: &Served, watcher: Watcher)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = TowerToHyperService::new(served.service.clone());
    let conn = served.builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    if let Err(e) = RepollSelfWakes::new(watcher.watch(conn)).await {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

/// True when `error`, or an error it wraps, is a request body that missed its deadline
/// ([`ServerSettings::body_read_timeout`]): the answer is 408.
pub fn is_body_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    caused_by::<TimeoutError>(error)
}

/// True when `error` or an error in its `source` chain is an `E`.
pub fn caused_by<E: std::error::Error + 'static>(error: &(dyn std::error::Error + 'static)) -> bool {
    std::iter::successors(Some(error), |e| e.source()).any(|e| e.is::<E>())
}

/// Errors of `accept` that concern one connection only (the next accept can succeed).
fn is_connection_error(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}

fn listener_result(done: Result<(&'static str, std::io::Result<()>), tokio::task::JoinError>) -> anyhow::Result<()> {
    match done {
        Ok((_, Ok(()))) => Ok(()),
        Ok((name, Err(e))) => Err(anyhow::Error::new(e).context(format!("the {name} listener failed"))),
        Err(e) => Err(anyhow::anyhow!("a listener task failed: {e}")),
    }
}

/// Resolves on SIGTERM or SIGINT.
async fn termination_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = match signal(SignalKind::terminate()) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                return std::future::pending().await;
            }
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    use tokio::task::JoinHandle;

    use super::*;

    /// The request the tests send (the connection stays open after it).
    const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n";

    /// What the server sent until it closed the connection.
    async fn read_until_closed(stream: &mut TcpStream) -> Vec<u8> {
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return got,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    }

    /// A server with `settings` whose one listener answers `GET /` with `ok`: its address,
    /// its tokens and its task.
    fn start(settings: ServerSettings) -> (SocketAddr, ShutdownTokens, JoinHandle<anyhow::Result<()>>) {
        let socket = bind("public", "127.0.0.1:0").unwrap();
        let addr = socket.local_addr().unwrap();
        let router = Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let listeners = vec![Listener { name: "public", socket, router, tls: None, drain: Drain::First }];
        let tokens = ShutdownTokens::default();
        let server = tokio::spawn({
            let tokens = tokens.clone();
            async move { serve(listeners, &settings, tokens).await }
        });
        (addr, tokens, server)
    }

    #[tokio::test]
    async fn slow_and_idle_clients_are_cut_off_after_the_header_read_timeout() {
        let (addr, tokens, server) =
            start(ServerSettings { header_read_timeout: Duration::from_secs(1), ..ServerSettings::default() });

        // One client starts a request and never ends its headers; another sends one request and
        // then stays idle on the keep-alive connection.
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nX-Slow: 1\r\n").await.unwrap();
        let mut idle = TcpStream::connect(addr).await.unwrap();
        idle.write_all(GET).await.unwrap();

        // Bounds for a hang, not a speed check: the timeout is 1 s on a 1 s clock.
        let bound = Duration::from_secs(30);
        let slow_got = tokio::time::timeout(bound, read_until_closed(&mut slow)).await.expect("slow client cut off");
        let idle_got = tokio::time::timeout(bound, read_until_closed(&mut idle)).await.expect("idle client cut off");
        let idle_got = String::from_utf8_lossy(&idle_got);
        assert!(idle_got.starts_with("HTTP/1.1 200") && idle_got.ends_with("ok"), "{idle_got}");
        assert!(!String::from_utf8_lossy(&slow_got).contains(" 200 "), "the incomplete request was not served");

        tokens.trigger.cancel();
        server.await.unwrap().unwrap();
    }

    /// A request on `stream` and its answer (the connection stays open).
    async fn request(stream: &mut TcpStream) -> String {
        stream.write_all(GET).await.unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        while !got.ends_with(b"ok") {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed before the answer: {}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&got).into_owned()
    }

    #[tokio::test]
    async fn a_connection_beyond_the_cap_is_closed_unread_and_counted_until_one_ends() {
        let metrics = Arc::new(Metrics::new());
        let settings =
            ServerSettings { max_connections: 2, metrics: Some(Arc::clone(&metrics)), ..ServerSettings::default() };
        let (addr, tokens, server) = start(settings);

        // Two kept-alive connections fill the cap.
        let mut first = TcpStream::connect(addr).await.unwrap();
        let mut second = TcpStream::connect(addr).await.unwrap();
        assert!(request(&mut first).await.starts_with("HTTP/1.1 200"));
        assert!(request(&mut second).await.starts_with("HTTP/1.1 200"));

        // A third is closed without an answer (a bound for a hang, not a speed check).
        let bound = Duration::from_secs(30);
        let mut third = TcpStream::connect(addr).await.unwrap();
        let _ = third.write_all(GET).await;
        let got = tokio::time::timeout(bound, read_until_closed(&mut third)).await.expect("closed");
        assert!(got.is_empty(), "nothing is answered beyond the cap: {}", String::from_utf8_lossy(&got));
        let counted = "toolyard_gateway_admission_rejections_total{reason=\"connections\"} 1";
        assert!(metrics.encode().contains(counted), "{}", metrics.encode());
        // The two first are still served.
        assert!(request(&mut first).await.starts_with("HTTP/1.1 200"));

        // Once one ends, a new connection is served again.
        drop(second);
        let served = tokio::time::timeout(bound, async {
            loop {
                let mut next = TcpStream::connect(addr).await.unwrap();
                if next.write_all(GET).await.is_ok() {
                    let got = read_some(&mut next).await;
                    if !got.is_empty() {
                        return got;
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("a connection served once one ended");
        assert!(served.starts_with("HTTP/1.1 200"), "{served}");

        tokens.trigger.cancel();
        server.await.unwrap().unwrap();
    }

    /// What the server first sends on `stream`, or nothing if it closes it.
    async fn read_some(stream: &mut TcpStream) -> String {
        let mut buf = [0u8; 1024];
        match stream.read(&mut buf).await {
            Ok(n) => String::from_utf8_lossy(&buf[..n]).into_owned(),
            Err(_) => String::new(),
        }
    }
}

//! Serving routers on listeners (axum-server, plain or rustls) with header limits and a
//! graceful shutdown shared by every listener.
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

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum_server::tls_rustls::RustlsConfig;
use axum_server::{Control, Handle};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::coarse_timer::CoarseTimer;

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
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            shutdown_grace: Duration::from_secs(30),
            max_headers: 64,
            max_header_bytes: 64 * 1024,
            header_read_timeout: Duration::from_secs(30),
        }
    }
}

/// One listener and what it serves.
pub struct Listener {
    /// Name for logs (`public`, `internal`, `metrics`).
    pub name: &'static str,
    /// The bound socket.
    pub socket: std::net::TcpListener,
    /// The router.
    pub router: Router,
    /// TLS configuration (reloadable through its handle), or plain HTTP.
    pub tls: Option<RustlsConfig>,
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

fn configure<A: axum_server::Address, Acc>(
    server: &mut axum_server::Server<A, Acc>,
    settings: &ServerSettings,
    timer: &CoarseTimer,
) {
    let builder = server.http_builder();
    builder
        .http1()
        .timer(timer.clone())
        .max_headers(settings.max_headers)
        .max_buf_size(settings.max_header_bytes.max(8192))
        .header_read_timeout(settings.header_read_timeout);
    builder.http2().max_header_list_size(u32::try_from(settings.max_header_bytes).unwrap_or(u32::MAX));
}

/// Serves every listener until shutdown (signal or `tokens.trigger`), then drains them.
/// Returns an error if a listener fails.
pub async fn serve(listeners: Vec<Listener>, settings: &ServerSettings, tokens: ShutdownTokens) -> anyhow::Result<()> {
    let first = Control::new();
    let last = Control::new();
    let mut first_tasks = JoinSet::new();
    let mut last_tasks = JoinSet::new();
    let timer = CoarseTimer::start();
    for l in listeners {
        let addr = l.socket.local_addr().context("listener address")?;
        let (control, tasks) = match l.drain {
            Drain::First => (&first, &mut first_tasks),
            Drain::Last => (&last, &mut last_tasks),
        };
        let handle = Handle::<SocketAddr>::with_control(control.clone());
        let service = l.router.into_make_service();
        let name = l.name;
        tracing::info!(listener = name, %addr, tls = l.tls.is_some(), "listening");
        match l.tls {
            None => {
                let mut server = axum_server::from_tcp(l.socket)?;
                configure(&mut server, settings, &timer);
                let server = server.handle(handle);
                tasks.spawn(async move { (name, server.serve(service).await) });
            }
            Some(tls) => {
                let mut server = axum_server::from_tcp_rustls(l.socket, tls)?;
                configure(&mut server, settings, &timer);
                let server = server.handle(handle);
                tasks.spawn(async move { (name, server.serve(service).await) });
            }
        }
    }

    let failure = tokio::select! {
        () = tokens.trigger.cancelled() => None,
        () = termination_signal() => None,
        Some(done) = first_tasks.join_next() => Some(done),
        Some(done) = last_tasks.join_next() => Some(done),
    };
    tracing::info!(grace_seconds = settings.shutdown_grace.as_secs(), "shutting down");
    tokens.app.cancel();
    first.graceful_shutdown(Some(settings.shutdown_grace));
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
    last.graceful_shutdown(Some(LAST_DRAIN_GRACE));
    while let Some(done) = last_tasks.join_next().await {
        if result.is_ok() {
            result = listener_result(done);
        }
    }
    tracing::info!("stopped");
    result
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
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

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

    #[tokio::test]
    async fn slow_and_idle_clients_are_cut_off_after_the_header_read_timeout() {
        let socket = bind("public", "127.0.0.1:0").unwrap();
        let addr = socket.local_addr().unwrap();
        let router = Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let listeners = vec![Listener { name: "public", socket, router, tls: None, drain: Drain::First }];
        let settings = ServerSettings { header_read_timeout: Duration::from_secs(1), ..ServerSettings::default() };
        let tokens = ShutdownTokens::default();
        let server = tokio::spawn({
            let tokens = tokens.clone();
            async move { serve(listeners, &settings, tokens).await }
        });

        // One client starts a request and never ends its headers; another sends one request and
        // then stays idle on the keep-alive connection.
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nX-Slow: 1\r\n").await.unwrap();
        let mut idle = TcpStream::connect(addr).await.unwrap();
        idle.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n").await.unwrap();

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
}

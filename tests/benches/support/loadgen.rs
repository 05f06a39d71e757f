//! The benches' load generator: HTTP/1.1 over plain TCP, one OS thread per client, each with
//! one keep-alive connection, blocking writes and reads, and its next request sent when the
//! previous answer is complete.
//!
//! It is this small on purpose. With one client, the time of a round trip is the server's
//! time plus the client's, so a client that hands each request through an async runtime,
//! a connection pool and a connection task (as reqwest does) adds its own wake-ups to every
//! cell and flattens the differences between servers. Here a request is one `write` and
//! its answer one or a few `read`s on the thread that waits for it, and the request head is
//! formatted once per connection.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Where to send requests and which headers to send with each.
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// `host:port` to connect to.
    pub addr: String,
    /// The request target, like `/mcp`.
    pub path: String,
    /// Extra header lines, each ending in `\r\n`.
    pub headers: String,
    /// The `Host` header when it is not `addr` (a server that answers only for its name).
    pub host: Option<String>,
}

impl Endpoint {
    /// An MCP endpoint at an `http://host:port/path` URL: stateless JSON-RPC over POST with
    /// the 2025-11-25 revision header and, when given, a bearer token.
    pub fn mcp(url: &str, token: Option<&str>) -> Self {
        let rest = url.strip_prefix("http://").expect("the load generator speaks plain http");
        let (addr, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let mut headers = String::from(
            "content-type: application/json\r\naccept: application/json, text/event-stream\r\n\
             mcp-protocol-version: 2025-11-25\r\n",
        );
        if let Some(t) = token {
            headers.push_str(&format!("authorization: Bearer {t}\r\n"));
        }
        let path = if path.is_empty() { "/".into() } else { path.into() };
        Endpoint { addr: addr.to_owned(), path, headers, host: None }
    }

    /// The same endpoint, sending `Host: host`.
    #[allow(dead_code, reason = "each bench includes this module; only node_pool names a host")]
    pub fn with_host(self, host: &str) -> Self {
        Endpoint { host: Some(host.to_owned()), ..self }
    }
}

/// One keep-alive connection.
pub struct Connection {
    endpoint: Endpoint,
    stream: Option<TcpStream>,
    buf: Vec<u8>,
    /// The request head up to the `content-length` value, the same for every request.
    head: Vec<u8>,
    request: Vec<u8>,
}

/// An answer: status and body.
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Answer {
    /// The text of the JSON-RPC message of a 200 answer, sent as JSON or as one SSE event.
    pub fn json_text(&self) -> Option<&str> {
        if self.status != 200 {
            return None;
        }
        let text = std::str::from_utf8(&self.body).ok()?;
        Some(text.lines().find_map(|l| l.strip_prefix("data:")).map(str::trim).unwrap_or(text))
    }
}

impl Connection {
    pub fn new(endpoint: Endpoint) -> Self {
        let head = format!(
            "POST {} HTTP/1.1\r\nhost: {}\r\n{}content-length: ",
            endpoint.path,
            endpoint.host.as_deref().unwrap_or(&endpoint.addr),
            endpoint.headers
        )
        .into_bytes();
        Connection {
            endpoint,
            stream: None,
            buf: Vec::with_capacity(16 * 1024),
            head,
            request: Vec::with_capacity(1024),
        }
    }

    /// POSTs `body` and reads the whole answer. A connection the server closed is opened
    /// again on the next request.
    pub fn post(&mut self, body: &[u8]) -> io::Result<Answer> {
        let result = self.exchange(body);
        if result.is_err() {
            self.stream = None;
        }
        result
    }

    fn exchange(&mut self, body: &[u8]) -> io::Result<Answer> {
        if self.stream.is_none() {
            let stream = TcpStream::connect(&self.endpoint.addr)?;
            stream.set_nodelay(true)?;
            stream.set_read_timeout(Some(Duration::from_secs(30)))?;
            self.stream = Some(stream);
        }
        let stream = self.stream.as_mut().expect("connected");
        self.request.clear();
        self.request.extend_from_slice(&self.head);
        write!(self.request, "{}\r\n\r\n", body.len())?;
        self.request.extend_from_slice(body);
        stream.write_all(&self.request)?;

        self.buf.clear();
        let (status, head_len, framing, close) = loop {
            read_more(stream, &mut self.buf)?;
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut response = httparse::Response::new(&mut headers);
            if let httparse::Status::Complete(len) = response.parse(&self.buf).map_err(io::Error::other)? {
                let status = response.code.unwrap_or(0);
                let mut framing = Framing::UntilClose;
                let mut close = false;
                for h in response.headers.iter() {
                    if h.name.eq_ignore_ascii_case("content-length") {
                        let n = std::str::from_utf8(h.value).ok().and_then(|v| v.trim().parse().ok());
                        framing = Framing::Length(n.ok_or_else(|| io::Error::other("bad content-length"))?);
                    } else if h.name.eq_ignore_ascii_case("transfer-encoding")
                        && h.value.eq_ignore_ascii_case(b"chunked")
                    {
                        framing = Framing::Chunked;
                    } else if h.name.eq_ignore_ascii_case("connection") && h.value.eq_ignore_ascii_case(b"close") {
                        close = true;
                    }
                }
                break (status, len, framing, close);
            }
        };
        self.buf.drain(..head_len);
        let body = match framing {
            Framing::Length(n) => {
                while self.buf.len() < n {
                    read_more(stream, &mut self.buf)?;
                }
                self.buf[..n].to_vec()
            }
            Framing::Chunked => read_chunked(stream, &mut self.buf)?,
            Framing::UntilClose => {
                stream.read_to_end(&mut self.buf)?;
                self.stream = None;
                std::mem::take(&mut self.buf)
            }
        };
        if close {
            self.stream = None;
        }
        Ok(Answer { status, body })
    }
}

enum Framing {
    Length(usize),
    Chunked,
    UntilClose,
}

fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<()> {
    let mut chunk = [0u8; 8192];
    let n = stream.read(&mut chunk)?;
    if n == 0 {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed mid-answer"));
    }
    buf.extend_from_slice(&chunk[..n]);
    Ok(())
}

/// Decodes a chunked body whose first bytes are in `buf`.
fn read_chunked(stream: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    let mut at = 0;
    loop {
        let line_end = loop {
            if let Some(i) = buf[at..].windows(2).position(|w| w == b"\r\n") {
                break at + i;
            }
            read_more(stream, buf)?;
        };
        let size_text = std::str::from_utf8(&buf[at..line_end]).map_err(io::Error::other)?;
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| io::Error::other("bad chunk size"))?;
        let data = line_end + 2;
        // The chunk, its CRLF; after the last (empty) chunk, no trailers are expected.
        while buf.len() < data + size + 2 {
            read_more(stream, buf)?;
        }
        if size == 0 {
            return Ok(body);
        }
        body.extend_from_slice(&buf[data..data + size]);
        at = data + size + 2;
    }
}

/// What one cell of `clients` concurrent clients measured.
pub struct Measured {
    /// Latencies of the requests that `check` accepted, sorted.
    pub latencies: Vec<Duration>,
    pub errors: u64,
    pub elapsed: Duration,
}

impl Measured {
    /// The `q` quantile latency in milliseconds.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        if self.latencies.is_empty() {
            return f64::NAN;
        }
        let i = ((self.latencies.len() as f64 - 1.0) * q).round() as usize;
        self.latencies[i].as_secs_f64() * 1000.0
    }

    pub fn per_second(&self) -> f64 {
        self.latencies.len() as f64 / self.elapsed.as_secs_f64()
    }
}

/// Runs `clients` closed-loop clients against `endpoint` for `seconds`. `body` makes the
/// request body from a request number; `check` says whether an answer counts as a success.
pub fn run(
    endpoint: &Endpoint,
    clients: usize,
    seconds: f64,
    body: impl Fn(u64) -> Vec<u8> + Send + Sync + 'static,
    check: impl Fn(&Answer) -> bool + Send + Sync + 'static,
) -> Measured {
    let body = Arc::new(body);
    let check = Arc::new(check);
    let counter = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    let workers: Vec<_> = (0..clients)
        .map(|_| {
            let (endpoint, body, check) = (endpoint.clone(), body.clone(), check.clone());
            let (counter, errors) = (counter.clone(), errors.clone());
            std::thread::spawn(move || {
                let mut connection = Connection::new(endpoint);
                let mut latencies = Vec::new();
                while Instant::now() < deadline {
                    let request = body(counter.fetch_add(1, Ordering::Relaxed));
                    let t = Instant::now();
                    match connection.post(&request) {
                        Ok(answer) if check(&answer) => latencies.push(t.elapsed()),
                        _ => {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for w in workers {
        latencies.extend(w.join().expect("client thread"));
    }
    let elapsed = started.elapsed();
    latencies.sort();
    Measured { latencies, errors: errors.load(Ordering::Relaxed), elapsed }
}

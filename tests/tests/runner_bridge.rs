//! `toolyard-runner bridge` as a real process in front of the official Python SDK's server
//! speaking stdio (`tests/fixtures/python/upstream_server.py stdio`): a client that answers
//! the nonce with the server key's proof gets an MCP session with a process of its own; a
//! client without the key gets no process; a closed connection kills its process.

use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use toolyard_api::protocol::bridge;
use toolyard_api::token::SigningKey;
use toolyard_tests::local::{self, TempDir};
use toolyard_tests::repo_path;

fn server_key() -> SigningKey {
    SigningKey::new(b"runner-bridge-test-master-key-0123456789".to_vec())
        .expect("test setup")
        .derive(&bridge::key_purpose("team", "desk"))
}

/// The bridge on a free loopback port; killed (with its sessions) when dropped.
struct Bridge {
    address: String,
    child: tokio::process::Child,
}

impl Bridge {
    async fn start(markers: &TempDir) -> Self {
        let mut child = tokio::process::Command::new(local::binary("toolyard-runner"))
            .args(["bridge", "--host", "127.0.0.1", "--port", "0", "--max-sessions", "8", "--"])
            .arg(local::python())
            .arg(repo_path("tests/fixtures/python/upstream_server.py"))
            .arg("stdio")
            .arg(markers.path())
            .env(bridge::env::KEY, server_key().to_hex())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the bridge starts");
        let stdout = child.stdout.take().expect("piped");
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await
            .expect("the bridge says where it listens")
            .expect("stdout")
            .expect("a line");
        let address = line.strip_prefix("listening on ").unwrap_or_else(|| panic!("{line}")).to_owned();
        Self { address, child }
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// A connection that has read the bridge's nonce.
struct Session {
    reader: BufReader<tokio::net::tcp::OwnedReadHalf>,
    writer: tokio::net::tcp::OwnedWriteHalf,
    nonce: String,
}

impl Session {
    async fn open(address: &str) -> Self {
        let stream = TcpStream::connect(address).await.expect("connect");
        let (read, writer) = stream.into_split();
        let mut reader = BufReader::new(read);
        let mut nonce = String::new();
        reader.read_line(&mut nonce).await.expect("nonce");
        assert_eq!(nonce.trim().len(), 32, "a 128-bit nonce in hex: {nonce:?}");
        Self { reader, writer, nonce: nonce.trim().to_owned() }
    }

    async fn send(&mut self, line: &str) {
        self.writer.write_all(format!("{line}\n").as_bytes()).await.expect("write");
    }

    /// The next line, or `None` when the bridge closed (or reset) the connection.
    async fn line(&mut self) -> Option<String> {
        let mut line = String::new();
        match tokio::time::timeout(Duration::from_secs(20), self.reader.read_line(&mut line)).await {
            Ok(Ok(n)) if n > 0 => Some(line),
            Ok(_) => None,
            Err(_) => panic!("no answer and no close within 20 s"),
        }
    }

    async fn request(&mut self, id: u64, method: &str, params: Value) -> Value {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string()).await;
        loop {
            let line = self.line().await.expect("the session stays open");
            let message: Value = serde_json::from_str(&line).expect("JSON-RPC");
            if message["id"] == id {
                return message;
            }
        }
    }
}

/// Processes of the server (not the bridge) whose command line mentions `marker`.
fn processes_with(marker: &str) -> usize {
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).into_owned())
        .filter(|c| c.contains(marker) && !c.contains("toolyard-runner"))
        .count()
}

async fn wait_processes(marker: &str, count: usize) {
    for _ in 0..100 {
        if processes_with(marker) == count {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("expected {count} server processes, found {}", processes_with(marker));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bridge_serves_one_stdio_process_per_proven_connection() {
    let markers = TempDir::new("bridge-markers");
    let marker = markers.path().display().to_string();
    let bridge = Bridge::start(&markers).await;

    // A client that proves the key: an MCP session with the server, over the process's stdio.
    let mut session = Session::open(&bridge.address).await;
    let proof = server_key().prove(&session.nonce);
    session.send(&proof).await;
    let init =
        json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}});
    let answer = session.request(1, "initialize", init).await;
    assert_eq!(answer["result"]["serverInfo"]["name"], "upstream-fixture", "{answer}");
    session.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string()).await;
    let quote = session.request(2, "tools/call", json!({"name": "get_quote", "arguments": {"ticker": "ACME"}})).await;
    assert_eq!(quote["result"]["structuredContent"], json!({"ticker": "ACME", "price": 12.5}), "{quote}");
    wait_processes(&marker, 1).await;

    // The nonce changes per connection: the proof of another connection's nonce is refused,
    // and so is a key of another server. Neither starts a process.
    let mut replay = Session::open(&bridge.address).await;
    replay.send(&proof).await;
    assert_eq!(replay.line().await, None, "a replayed proof is refused");
    let other = SigningKey::new(b"runner-bridge-test-master-key-0123456789".to_vec())
        .expect("test setup")
        .derive(&bridge::key_purpose("team", "other"));
    let mut wrong = Session::open(&bridge.address).await;
    wrong.send(&other.prove(&wrong.nonce)).await;
    assert_eq!(wrong.line().await, None, "another server's key is refused");
    // The answer is read up to 256 bytes: a valid proof behind 300 spaces is never reached.
    let mut padded = Session::open(&bridge.address).await;
    let late = format!("{}{}", " ".repeat(300), server_key().prove(&padded.nonce));
    padded.send(&late).await;
    assert_eq!(padded.line().await, None, "an answer past the line limit is refused");
    assert_eq!(processes_with(&marker), 1, "no process for a client without the key");

    // A second proven session gets a process of its own; closing a connection kills its process.
    let mut second = Session::open(&bridge.address).await;
    second.send(&server_key().prove(&second.nonce)).await;
    let answer = second
        .request(
            1,
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}),
        )
        .await;
    assert!(answer["result"].is_object(), "{answer}");
    wait_processes(&marker, 2).await;
    drop(session);
    wait_processes(&marker, 1).await;
    drop(second);
    wait_processes(&marker, 0).await;
}

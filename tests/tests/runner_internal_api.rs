//! The gateway's internal runner API over real HTTP on loopback, with the real local folder
//! store: a runner token reaches exactly its own run's files under its owner's prefix.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use axum::body::Bytes;
use reqwest::StatusCode;
use serde_json::{Value, json};
use toolyard_api::protocol::{CallErrorKind, CallResult, path};
use toolyard_api::storage::RunId;
use toolyard_api::token::{Claims, RunKind, SigningKey};
use toolyard_api::{Owner, OwnerKey};
use toolyard_gateway::executor::ResultRecorder;
use toolyard_gateway::internal::{self, InternalLimits, InternalState};
use toolyard_gateway::store::ArtifactStore;
use toolyard_gateway::store::fs::FsStore;
use toolyard_tests::local::TempDir;

fn key() -> SigningKey {
    SigningKey::new(b"internal-api-test-key-0123456789abcdef".to_vec()).expect("test setup")
}

fn alice() -> Owner {
    Owner { issuer: "local".into(), user: "alice".into(), groups: vec![] }
}

fn bob() -> Owner {
    Owner { issuer: "local".into(), user: "bob".into(), groups: vec![] }
}

fn now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("test setup").as_secs() as i64
}

fn token(kind: RunKind, id: &str, owner: Owner) -> String {
    key().sign(&Claims { kind, ns: String::new(), id: id.into(), owner, exp: now() + 300 })
}

/// Records what the internal API hands to the recorder.
#[derive(Default)]
struct Recorded(Mutex<Vec<(String, OwnerKey, CallResult)>>);

#[async_trait]
impl ResultRecorder for Recorded {
    async fn record(
        &self,
        _ns: &str,
        call: &RunId,
        owner: &OwnerKey,
        result: &CallResult,
    ) -> toolyard_gateway::Result<()> {
        self.0.lock().expect("test setup").push((call.to_string(), owner.clone(), result.clone()));
        Ok(())
    }
}

struct Api {
    base: String,
    addr: SocketAddr,
    store: Arc<FsStore>,
    recorded: Arc<Recorded>,
    http: reqwest::Client,
    _dir: TempDir,
}

impl Api {
    async fn start() -> Self {
        let dir = TempDir::new("internal-api");
        let store = Arc::new(FsStore::new(dir.path()).expect("test setup"));
        let recorded = Arc::new(Recorded::default());
        let limits =
            InternalLimits { log_bytes: 1024, output_bytes: 4096, run_event_bytes: 1024, ..InternalLimits::default() };
        let state = InternalState::new(store.clone(), key()).with_recorder(recorded.clone()).with_limits(limits);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("test setup");
        let addr = listener.local_addr().expect("test setup");
        tokio::spawn(async move { axum::serve(listener, internal::router(state)).await.expect("test setup") });
        Self { base: format!("http://{addr}"), addr, store, recorded, http: reqwest::Client::new(), _dir: dir }
    }

    async fn put_input(&self, owner: &Owner, id: &str, input: Value) {
        let path = format!("calls/{id}/input.json");
        self.store.put(&owner.key(), &path, Bytes::from(input.to_string())).await.expect("test setup");
    }

    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        body: Option<Vec<u8>>,
    ) -> (StatusCode, String) {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.body(body);
        }
        let response = request.send().await.expect("test setup");
        (response.status(), response.text().await.expect("test setup"))
    }

    /// Sends a request line exactly as written (no client-side path normalization).
    async fn raw(&self, request_line: &str, token: &str, body: &[u8]) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(self.addr).await.expect("test setup");
        let head = format!(
            "{request_line} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).await.expect("test setup");
        stream.write_all(body).await.expect("test setup");
        let mut out = String::new();
        stream.read_to_string(&mut out).await.expect("test setup");
        out
    }

    async fn stored(&self, owner: &Owner, path: &str) -> Option<String> {
        self.store.get(&owner.key(), path).await.expect("test setup").map(|b| String::from_utf8_lossy(&b).into_owned())
    }
}

use reqwest::Method;

#[tokio::test]
async fn a_call_token_reads_its_input_and_stores_its_result_logs_and_events() {
    let api = Api::start().await;
    api.put_input(&alice(), "call-a", json!({"spot": 100})).await;
    let t = token(RunKind::Call, "call-a", alice());

    let (status, body) = api.send(Method::GET, &path::call_input("call-a"), Some(&t), None).await;
    assert_eq!((status, serde_json::from_str::<Value>(&body).unwrap()), (StatusCode::OK, json!({"spot": 100})));

    let (status, _) =
        api.send(Method::PUT, &path::call_log("call-a", "stdout"), Some(&t), Some(b"printed\n".to_vec())).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(api.stored(&alice(), "calls/call-a/stdout.log").await.as_deref(), Some("printed\n"));

    let result = CallResult::ok(json!({"price": 10.45}), 3);
    let (status, _) =
        api.send(Method::PUT, &path::call_result("call-a"), Some(&t), Some(serde_json::to_vec(&result).unwrap())).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let stored: CallResult =
        serde_json::from_str(&api.stored(&alice(), "calls/call-a/result.json").await.unwrap()).unwrap();
    assert_eq!(stored, result);
    assert_eq!(api.recorded.0.lock().unwrap().clone(), vec![("call-a".to_owned(), alice().key(), result)]);

    let events = "{\"time\":\"2026-01-01T00:00:00Z\",\"type\":\"tool_started\"}\n{\"time\":\"2026-01-01T00:00:01Z\",\"type\":\"tool_finished\",\"data\":{\"ok\":true}}\n";
    for _ in 0..2 {
        let (status, body) =
            api.send(Method::POST, &path::events("calls", "call-a"), Some(&t), Some(events.as_bytes().to_vec())).await;
        assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    }
    assert_eq!(api.stored(&alice(), "calls/call-a/events/000001.jsonl").await.unwrap().lines().count(), 2);
    assert!(
        api.stored(&alice(), "calls/call-a/events/000002.jsonl").await.is_some(),
        "a second batch is a new segment"
    );

    let (status, body) =
        api.send(Method::POST, &path::events("calls", "call-a"), Some(&t), Some(b"{\"type\": 1}\n".to_vec())).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("line 1 is not an event"), "{body}");
}

#[tokio::test]
async fn a_token_for_call_a_cannot_read_or_write_call_b_or_another_owners_files() {
    let api = Api::start().await;
    api.put_input(&alice(), "call-a", json!({"a": 1})).await;
    api.put_input(&alice(), "call-b", json!({"secret": "b"})).await;
    api.put_input(&bob(), "call-a", json!({"secret": "bob"})).await;
    let t = token(RunKind::Call, "call-a", alice());

    for (method, p) in [
        (Method::GET, path::call_input("call-b")),
        (Method::PUT, path::call_result("call-b")),
        (Method::PUT, path::call_log("call-b", "stderr")),
        (Method::POST, path::events("calls", "call-b")),
        (Method::POST, path::events("tasks", "call-a")),
        (Method::PUT, path::task_output("call-a", "x.txt")),
        (Method::GET, path::task_output("call-a", "x.txt")),
    ] {
        let (status, body) = api.send(method.clone(), &p, Some(&t), Some(b"{}".to_vec())).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method} {p}: {body}");
        assert!(body.starts_with("{\"error\":"), "JSON error for {p}: {body}");
    }
    assert_eq!(api.stored(&alice(), "calls/call-b/result.json").await, None);

    // Bob's call with the same id lives under Bob's prefix: Alice's token never reaches it.
    let (_, body) = api.send(Method::GET, &path::call_input("call-a"), Some(&t), None).await;
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap(), json!({"a": 1}));
    let result = serde_json::to_vec(&CallResult::err(CallErrorKind::ToolError, "x", Some(1), 1)).unwrap();
    api.send(Method::PUT, &path::call_result("call-a"), Some(&t), Some(result)).await;
    assert!(api.stored(&alice(), "calls/call-a/result.json").await.is_some());
    assert_eq!(api.stored(&bob(), "calls/call-a/result.json").await, None);

    // A task token is no call token either.
    let task = token(RunKind::Task, "call-a", alice());
    let (status, _) = api.send(Method::GET, &path::call_input("call-a"), Some(&task), None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn missing_expired_tampered_and_foreign_tokens_are_refused() {
    let api = Api::start().await;
    api.put_input(&alice(), "call-a", json!({})).await;
    let p = path::call_input("call-a");

    let expired = key().sign(&Claims {
        kind: RunKind::Call,
        ns: String::new(),
        id: "call-a".into(),
        owner: alice(),
        exp: now() - 1,
    });
    let foreign = SigningKey::new(vec![9; 32]).unwrap().sign(&Claims {
        kind: RunKind::Call,
        ns: String::new(),
        id: "call-a".into(),
        owner: alice(),
        exp: now() + 300,
    });
    let pool_key = key().derive(&toolyard_api::protocol::pool::key_purpose("", "echo"));
    let pool_token = pool_key.sign(&Claims {
        kind: RunKind::Call,
        ns: String::new(),
        id: "call-a".into(),
        owner: alice(),
        exp: now() + 300,
    });
    // Claims of Bob's call with Alice's signature.
    let good = token(RunKind::Call, "call-a", alice());
    let (_, body, sig) = {
        let mut parts = good.split('.');
        (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap())
    };
    let _ = body;
    let forged_claims = serde_json::to_vec(&Claims {
        kind: RunKind::Call,
        ns: String::new(),
        id: "call-a".into(),
        owner: bob(),
        exp: now() + 300,
    })
    .unwrap();
    use base64::Engine;
    let forged = format!("tyr1.{}.{sig}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(forged_claims));

    for (what, t, expect) in [
        ("expired", Some(expired.as_str()), "expired"),
        ("signed with another key", Some(foreign.as_str()), "signature"),
        ("signed with a pool's derived key", Some(pool_token.as_str()), "signature"),
        ("tampered claims", Some(forged.as_str()), "signature"),
        ("garbage", Some("not-a-token"), "malformed"),
        ("missing", None, "missing"),
    ] {
        let (status, body) = api.send(Method::GET, &p, t, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{what}: {body}");
        assert!(body.contains(expect), "{what}: {body}");
    }
    let (status, _) = api.send(Method::GET, &p, Some(&good), None).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn traversal_and_odd_artifact_names_are_refused() {
    // (Names are checked before anything else; a valid one needs a running task, which the
    // coding-task tests upload to.)
    let api = Api::start().await;
    let t = token(RunKind::Task, "task-1", alice());
    // Encoded forms reach the server decoded; the raw forms are sent as written.
    for name in ["%2E%2E%2Fresult.json", "a%2F%2E%2E%2F%2E%2E%2Fx", "%2Fetc%2Fpasswd", "a%0Ab", "a%5Cb", "a%2F%2Fb"] {
        let (status, body) =
            api.send(Method::PUT, &path::task_output("task-1", name), Some(&t), Some(b"x".to_vec())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{name}: {body}");
    }
    for raw in ["../result.json", "a/../../../calls/x/result.json", "./a"] {
        let answer = api.raw(&format!("PUT {}", path::task_output("task-1", raw)), &t, b"x").await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{raw}: {answer}");
    }
    let files = api.store.list(&alice().key(), "tasks/task-1/").await.unwrap();
    assert!(files.is_empty(), "{files:?}");
}

#[tokio::test]
async fn bodies_above_their_cap_get_413_and_task_routes_without_a_backend_say_so() {
    let api = Api::start().await;
    let t = token(RunKind::Call, "call-a", alice());
    let (status, body) =
        api.send(Method::PUT, &path::call_log("call-a", "stdout"), Some(&t), Some(vec![b'x'; 2048])).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert!(body.contains("larger than 1024 bytes"), "{body}");
    assert_eq!(api.stored(&alice(), "calls/call-a/stdout.log").await, None);

    let task = token(RunKind::Task, "task-1", alice());

    let (status, body) =
        api.send(Method::PUT, &path::call_result("call-a"), Some(&t), Some(b"{\"value\": NaN}".to_vec())).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, _) = api.send(Method::PUT, &path::call_log("call-a", "secrets"), Some(&t), Some(vec![])).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // This gateway has no task backend: the coding-task routes say so.
    for (method, p) in [
        (Method::GET, toolyard_api::agent::path::spec("task-1")),
        (Method::POST, toolyard_api::agent::path::tool_call("task-1", "price_option")),
        (Method::PUT, path::task_output("task-1", "big.bin")),
        (Method::POST, toolyard_api::agent::path::model_chat("task-1")),
    ] {
        let (status, body) = api.send(method, &p, Some(&task), Some(b"{}".to_vec())).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{p}");
        assert!(body.contains("coding tasks are not configured"), "{body}");
    }
}

#[tokio::test]
async fn a_runs_event_log_is_capped() {
    let api = Api::start().await;
    let t = token(RunKind::Call, "call-a", alice());
    let event = json!({"time": "2026-12-04T12:00:00Z", "type": "call_started", "data": {"pad": "x".repeat(200)}});
    let mut accepted = 0;
    let refusal = loop {
        let (status, body) = api
            .send(Method::POST, &path::events("calls", "call-a"), Some(&t), Some(event.to_string().into_bytes()))
            .await;
        match status {
            StatusCode::NO_CONTENT => accepted += 1,
            other => break (other, body),
        }
        assert!(accepted < 100, "the log was never full");
    };
    assert_eq!(refusal.0, StatusCode::PAYLOAD_TOO_LARGE, "{}", refusal.1);
    assert!(refusal.1.contains("the event log is full"), "{}", refusal.1);
    let stored: u64 =
        api.store.list(&alice().key(), "calls/call-a/events/").await.unwrap().iter().map(|o| o.size).sum();
    assert!(accepted >= 3 && stored <= 1024, "{accepted} segments, {stored} bytes");
}

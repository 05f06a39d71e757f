//! A deterministic OpenAI-compatible chat-completions server for tests: it replays a
//! scripted conversation, records every request and checks what it was sent. No live
//! model is ever called in CI.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// What the server answers to one request.
#[derive(Clone, Debug)]
pub enum Reply {
    /// An assistant message with this content.
    Content(String),
    /// An HTTP error with a JSON body (e.g. 401, 429 with `Retry-After`, 500).
    Error {
        /// HTTP status.
        status: u16,
        /// `Retry-After` seconds, for 429.
        retry_after: Option<u64>,
    },
    /// A 200 whose body is not a chat completion.
    Malformed(String),
}

/// A gate a test opens to let held turns answer (see [`Turn::held`]).
#[derive(Clone, Debug)]
pub struct Gate(Arc<tokio::sync::watch::Sender<bool>>);

impl Default for Gate {
    fn default() -> Self {
        Self(Arc::new(tokio::sync::watch::channel(false).0))
    }
}

impl Gate {
    /// A closed gate.
    pub fn new() -> Self {
        Self::default()
    }

    /// Opens the gate: held turns answer now.
    pub fn open(&self) {
        self.0.send_replace(true);
    }

    async fn passed(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|open| *open).await;
    }
}

/// One scripted turn: checks on the request, then the reply.
#[derive(Clone, Debug)]
pub struct Turn {
    /// Substrings that must appear in the last message of the request.
    pub expect_in_last_message: Vec<String>,
    /// What to answer.
    pub reply: Reply,
    /// Answer only once this gate is open.
    pub hold: Option<Gate>,
}

impl Turn {
    /// Answers `content` without checking the request.
    pub fn reply(content: impl Into<String>) -> Self {
        Self { expect_in_last_message: Vec::new(), reply: Reply::Content(content.into()), hold: None }
    }

    /// Answers `reply` (an error, a malformed body).
    pub fn with(reply: Reply) -> Self {
        Self { expect_in_last_message: Vec::new(), reply, hold: None }
    }

    /// Holds the answer until `gate` opens (a model that takes its time).
    pub fn held(mut self, gate: &Gate) -> Self {
        self.hold = Some(gate.clone());
        self
    }

    /// Answers with Python code in a fenced block (the agent's expected answer format).
    pub fn code(code: &str) -> Self {
        Self::reply(format!("Thought: next step.\n```python\n{}\n```", code.trim()))
    }

    /// Requires `needle` in the last message of the request (an observation, say).
    pub fn expecting(mut self, needle: impl Into<String>) -> Self {
        self.expect_in_last_message.push(needle.into());
        self
    }
}

#[derive(Default)]
struct Inner {
    script: VecDeque<Turn>,
    /// The last conversation given a held turn with content, and that turn: the same
    /// conversation sent again (the agent retrying because its request was lost while the
    /// turn was held, e.g. in a gateway restart) gets the same answer, as a deterministic model
    /// would give, and takes no new turn. Only held turns are given again: another task sending
    /// the same first messages gets its own turn.
    last_answered: Option<(Value, Turn)>,
    requests: Vec<Value>,
    arrivals: Vec<std::time::Instant>,
    failures: Vec<String>,
    rejected: usize,
}

/// A running scripted model server.
pub struct ScriptedModel {
    addr: SocketAddr,
    api_key: String,
    inner: Arc<Mutex<Inner>>,
    stop: CancellationToken,
}

#[derive(Clone)]
struct AppState {
    api_key: String,
    inner: Arc<Mutex<Inner>>,
}

impl ScriptedModel {
    /// Starts a server on 127.0.0.1 that requires `Authorization: Bearer <api_key>` and
    /// answers the turns in order.
    pub async fn start(api_key: &str, turns: Vec<Turn>) -> Self {
        Self::start_on(std::net::Ipv4Addr::LOCALHOST.into(), api_key, turns).await
    }

    /// The same on `ip`: the test cluster's host address ([`crate::TestEnv::host_ip`]) for a
    /// model that agent pods call.
    pub async fn start_on(ip: std::net::IpAddr, api_key: &str, turns: Vec<Turn>) -> Self {
        let inner = Arc::new(Mutex::new(Inner { script: turns.into(), ..Default::default() }));
        let state = AppState { api_key: api_key.to_owned(), inner: inner.clone() };
        let app = Router::new()
            .route("/v1/chat/completions", post(chat))
            .route("/v1/models", axum::routing::get(models))
            .with_state(state);
        let listener = tokio::net::TcpListener::bind((ip, 0)).await.expect("bind model server");
        let addr = listener.local_addr().expect("addr");
        let stop = CancellationToken::new();
        let shutdown = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).with_graceful_shutdown(async move { shutdown.cancelled().await }).await;
        });
        Self { addr, api_key: api_key.to_owned(), inner, stop }
    }

    /// Base URL to configure as the model endpoint (`http://<ip>:<port>/v1`).
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The API key the server requires.
    pub fn api_key(&self) -> &str {
        &self.api_key
    }

    /// Every request body received so far.
    pub fn requests(&self) -> Vec<Value> {
        self.inner.lock().expect("lock").requests.clone()
    }

    /// When each request of [`ScriptedModel::requests`] arrived.
    pub fn arrivals(&self) -> Vec<std::time::Instant> {
        self.inner.lock().expect("lock").arrivals.clone()
    }

    /// Requests refused for a wrong or missing API key.
    pub fn rejected(&self) -> usize {
        self.inner.lock().expect("lock").rejected
    }

    /// Expectation failures and requests beyond the script; empty when all went as scripted.
    pub fn failures(&self) -> Vec<String> {
        self.inner.lock().expect("lock").failures.clone()
    }

    /// Replaces the script (turns not consumed by an earlier task are dropped).
    pub fn set_script(&self, turns: Vec<Turn>) {
        let mut inner = self.inner.lock().expect("lock");
        inner.script = turns.into();
        inner.last_answered = None;
    }

    /// Appends turns to the script (for a server shared by several tasks run one after another).
    pub fn push(&self, turns: Vec<Turn>) {
        let mut inner = self.inner.lock().expect("lock");
        inner.script.extend(turns);
        inner.last_answered = None;
    }

    /// Turns not consumed yet.
    pub fn remaining(&self) -> usize {
        self.inner.lock().expect("lock").script.len()
    }
}

impl Drop for ScriptedModel {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn last_message_text(body: &Value) -> String {
    let Some(last) = body["messages"].as_array().and_then(|m| m.last()) else { return String::new() };
    match &last["content"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect::<Vec<_>>().join("\n"),
        _ => String::new(),
    }
}

/// `GET /v1/models`, as OpenAI answers it: the one model, for the right key only (the
/// gateway's reachability probe). Not counted in [`ScriptedModel::rejected`].
async fn models(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or_default();
    if auth != format!("Bearer {}", state.api_key) {
        return (StatusCode::UNAUTHORIZED, axum::Json(json!({"error": {"message": "Incorrect API key provided"}})))
            .into_response();
    }
    axum::Json(json!({"object": "list", "data": [{"id": "scripted-model", "object": "model"}]})).into_response()
}

async fn chat(State(state): State<AppState>, headers: HeaderMap, body: axum::body::Bytes) -> Response {
    let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or_default();
    if auth != format!("Bearer {}", state.api_key) {
        state.inner.lock().expect("lock").rejected += 1;
        return (StatusCode::UNAUTHORIZED, axum::Json(json!({"error": {"message": "Incorrect API key provided", "type": "invalid_request_error", "code": "invalid_api_key"}}))).into_response();
    }
    let body: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("not JSON: {e}")).into_response(),
    };
    let turn = {
        let mut inner = state.inner.lock().expect("lock");
        inner.requests.push(body.clone());
        inner.arrivals.push(std::time::Instant::now());
        let repeated = inner.last_answered.as_ref().filter(|(m, _)| *m == body["messages"]).map(|(_, t)| t.clone());
        let turn = match repeated {
            Some(turn) => Some(turn),
            None => {
                let turn = inner.script.pop_front();
                inner.last_answered = turn
                    .as_ref()
                    .filter(|t| t.hold.is_some() && matches!(t.reply, Reply::Content(_)))
                    .map(|t| (body["messages"].clone(), t.clone()));
                turn
            }
        };
        match &turn {
            None => {
                let n = inner.requests.len();
                inner.failures.push(format!("request {n} beyond the script"));
            }
            Some(t) => {
                let last = last_message_text(&body);
                for needle in &t.expect_in_last_message {
                    if !last.contains(needle.as_str()) {
                        let n = inner.requests.len();
                        inner
                            .failures
                            .push(format!("request {n}: expected {needle:?} in the last message, got {last:?}"));
                    }
                }
            }
        }
        turn
    };
    let Some(turn) = turn else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "script exhausted").into_response();
    };
    answer(&body, turn).await
}

/// The scripted reply of `turn` to `body`, once its gate (if any) is open.
async fn answer(body: &Value, turn: Turn) -> Response {
    if let Some(gate) = &turn.hold {
        gate.passed().await;
    }
    match turn.reply {
        Reply::Content(content) => axum::Json(json!({
            "id": "chatcmpl-scripted",
            "object": "chat.completion",
            "created": 1_764_000_000,
            "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
        }))
        .into_response(),
        Reply::Error { status, retry_after } => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let mut response =
                (status, axum::Json(json!({"error": {"message": format!("scripted {status}"), "type": "scripted"}})))
                    .into_response();
            if let Some(secs) = retry_after {
                response.headers_mut().insert("retry-after", secs.to_string().parse().expect("header value"));
            }
            response
        }
        Reply::Malformed(text) => (StatusCode::OK, [("content-type", "application/json")], text).into_response(),
    }
}

/// Waits until `model` has received `n` requests (bounded).
pub async fn wait_for_requests(model: &ScriptedModel, n: usize, timeout: Duration) -> anyhow::Result<()> {
    crate::wait_until(timeout, "model requests", || async { Ok(model.requests().len() >= n) }).await
}

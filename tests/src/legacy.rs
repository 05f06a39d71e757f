//! A 2025-11-25 client over raw HTTP: the `initialize` handshake, its session id, requests
//! in the session, and the session's GET stream.

use serde_json::{Value, json};

/// A 2025-11-25 session.
#[derive(Clone)]
pub struct LegacySession {
    url: String,
    token: String,
    /// The session id the `initialize` answer gave (empty: none sent).
    pub id: String,
    http: reqwest::Client,
}

impl LegacySession {
    /// Initializes at the MCP URL `url` as the holder of `token`, and keeps the session id the
    /// answer gives (it must give one).
    pub async fn open(url: &str, token: &str) -> Self {
        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}});
        let session = LegacySession {
            url: url.to_owned(),
            token: token.to_owned(),
            id: String::new(),
            http: reqwest::Client::new(),
        };
        let response = session.request(reqwest::Method::POST).json(&init).send().await.expect("initialize");
        assert_eq!(response.status(), 200);
        let id = response.headers().get("mcp-session-id").expect("a session id").to_str().expect("ascii").to_owned();
        let session = LegacySession { id, ..session };
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let accepted = session.request(reqwest::Method::POST).json(&initialized).send().await.expect("initialized");
        assert_eq!(accepted.status(), 202);
        session
    }

    /// The same client sending no session id.
    pub fn without_id(&self) -> Self {
        LegacySession { id: String::new(), ..self.clone() }
    }

    /// The same session id, sent by the holder of `token`.
    pub fn as_other(&self, token: &str) -> Self {
        LegacySession { token: token.to_owned(), ..self.clone() }
    }

    /// The same session at another MCP URL (another replica).
    pub fn at(&self, url: &str) -> Self {
        LegacySession { url: url.to_owned(), ..self.clone() }
    }

    /// A request in the session.
    pub fn request(&self, method: reqwest::Method) -> reqwest::RequestBuilder {
        let mut request = self
            .http
            .request(method, &self.url)
            .bearer_auth(&self.token)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25");
        if !self.id.is_empty() {
            request = request.header("mcp-session-id", &self.id);
        }
        request
    }

    /// Posts a request; its JSON answer.
    pub async fn post(&self, body: Value) -> Value {
        self.request(reqwest::Method::POST).json(&body).send().await.expect("POST").json().await.expect("JSON")
    }

    /// The response to the session's GET.
    pub async fn get(&self) -> reqwest::Response {
        self.request(reqwest::Method::GET).header("accept", "text/event-stream").send().await.expect("GET")
    }

    /// The session's GET stream.
    pub async fn stream(&self) -> SseReader {
        let response = self.get().await;
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        SseReader::new(response)
    }
}

/// The JSON messages of an SSE response.
pub struct SseReader {
    response: reqwest::Response,
    buffer: String,
}

impl SseReader {
    /// The messages of `response`, an SSE stream.
    pub fn new(response: reqwest::Response) -> Self {
        SseReader { response, buffer: String::new() }
    }

    /// The next message with `method`.
    pub async fn until(&mut self, method: &str) -> Value {
        loop {
            let message = self.next().await;
            if message["method"] == method {
                return message;
            }
        }
    }

    /// The next JSON message (events without one, as keep-alive comments, are skipped).
    pub async fn next(&mut self) -> Value {
        loop {
            while let Some(end) = self.buffer.find("\n\n") {
                let event: String = self.buffer.drain(..end + 2).collect();
                let data: String = event.lines().filter_map(|l| l.strip_prefix("data:")).map(str::trim).collect();
                if let Ok(message) = serde_json::from_str::<Value>(&data) {
                    return message;
                }
            }
            let chunk = self.response.chunk().await.expect("reading the stream").expect("the stream goes on");
            self.buffer.push_str(&String::from_utf8_lossy(&chunk));
        }
    }
}

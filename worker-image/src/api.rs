//! Client of the gateway's internal API, as one run (call or task) sees it through its scoped
//! token. The coding-task routes are in `tasks`.

mod tasks;

use std::time::Duration;

use bytes::Bytes;
use reqwest::{Method, StatusCode};
use serde_json::{Map, Value};
use toolyard_api::protocol::{CallResult, path};

/// Attempts for each request (transient failures: connection errors, 5xx, 429).
const ATTEMPTS: u32 = 4;
/// Longest wait between two attempts.
const MAX_DELAY: Duration = Duration::from_secs(5);
/// Timeout of one request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a request to the internal API failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The gateway could not be reached (after retries).
    #[error("cannot reach the gateway's internal API at {url}: {source}")]
    Unreachable {
        /// The URL.
        url: String,
        /// The transport error.
        source: reqwest::Error,
    },
    /// The gateway answered with an error status.
    #[error("the gateway's internal API refused {method} {path}: {status} {message}")]
    Refused {
        /// Method.
        method: Method,
        /// Path (no host, no token).
        path: String,
        /// Status.
        status: StatusCode,
        /// The error message of the answer.
        message: String,
    },
    /// The answer could not be understood.
    #[error("the gateway's internal API answered {path} with something unexpected: {0}", path = .1)]
    BadAnswer(String, String),
    /// The client could not be built.
    #[error("cannot build an HTTP client: {0}")]
    Client(reqwest::Error),
}

/// The internal API of one run.
#[derive(Clone, Debug)]
pub struct InternalApi {
    http: reqwest::Client,
    base: String,
    token: String,
    attempts: u32,
}

impl InternalApi {
    /// A client for `base` (the gateway's internal URL) presenting `token`.
    pub fn new(base: &str, token: String) -> Result<Self, ApiError> {
        // The gateway is reached directly: a proxy from the tool's environment must not apply.
        let mut builder =
            reqwest::Client::builder().no_proxy().timeout(REQUEST_TIMEOUT).connect_timeout(Duration::from_secs(10));
        if base.starts_with("http://") {
            // Plain HTTP needs no trust store; loading the system's costs milliseconds per call.
            builder = builder.tls_certs_only(Vec::new());
        }
        let http = builder.build().map_err(ApiError::Client)?;
        Ok(Self { http, base: base.trim_end_matches('/').to_owned(), token, attempts: ATTEMPTS })
    }

    /// The task's model as the agent reaches it: the gateway's model route for `task`, with
    /// this client's token as the API key (the gateway adds the real key).
    pub fn model_settings(&self, task: &str, model: &str) -> crate::agent::model::ModelSettings {
        crate::agent::model::ModelSettings {
            base_url: format!("{}{}", self.base, toolyard_api::agent::path::model_base(task)),
            model: model.to_owned(),
            api_key: self.token.clone(),
        }
    }

    /// The same client trying each request up to `attempts` times (waits grow from 0.1 s to
    /// at most 5 s): a coding task rides out a gateway restart this way.
    pub fn with_attempts(mut self, attempts: u32) -> Self {
        self.attempts = attempts.max(1);
        self
    }

    /// The call's arguments.
    pub async fn call_input(&self, id: &str) -> Result<Map<String, Value>, ApiError> {
        let p = path::call_input(id);
        let body = self.send(Method::GET, &p, None, "application/json").await?;
        match serde_json::from_slice::<Value>(&body) {
            Ok(Value::Object(map)) => Ok(map),
            Ok(_) => Err(ApiError::BadAnswer(p, "the input is not a JSON object".into())),
            Err(e) => Err(ApiError::BadAnswer(p, format!("the input is not JSON: {e}"))),
        }
    }

    /// Uploads one log stream (`stdout` or `stderr`).
    pub async fn put_log(&self, id: &str, stream: &str, bytes: Vec<u8>) -> Result<(), ApiError> {
        self.send(Method::PUT, &path::call_log(id, stream), Some(Bytes::from(bytes)), "text/plain; charset=utf-8")
            .await
            .map(drop)
    }

    /// Uploads a file the call returned (before its result).
    pub async fn put_output(&self, id: &str, name: &str, mime_type: &str, bytes: Vec<u8>) -> Result<(), ApiError> {
        self.send(Method::PUT, &path::call_output(id, name), Some(Bytes::from(bytes)), mime_type).await.map(drop)
    }

    /// Uploads the call's result.
    pub async fn put_result(&self, id: &str, result: &CallResult) -> Result<(), ApiError> {
        let body = serde_json::to_vec(result).map_err(|e| ApiError::BadAnswer(id.into(), e.to_string()))?;
        self.send(Method::PUT, &path::call_result(id), Some(Bytes::from(body)), "application/json").await.map(drop)
    }

    pub(crate) async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
        content_type: &str,
    ) -> Result<Bytes, ApiError> {
        let url = format!("{}{path}", self.base);
        // The trace context of the span the request is made in: a tool call the agent makes
        // is a child of its `tool.call` span.
        let traceparent = toolyard_telemetry::traceparent(&tracing::Span::current());
        let mut delay = Duration::from_millis(100);
        let mut attempt = 1;
        loop {
            let mut request = self.http.request(method.clone(), &url).bearer_auth(&self.token);
            if let Some(traceparent) = &traceparent {
                request = request.header("traceparent", traceparent);
            }
            if let Some(body) = &body {
                request = request.header(reqwest::header::CONTENT_TYPE, content_type).body(body.clone());
            }
            let retry = match request.send().await {
                Ok(response) if response.status().is_success() => {
                    return response.bytes().await.map_err(|source| ApiError::Unreachable { url, source });
                }
                Ok(response) => {
                    let status = response.status();
                    let text = response.text().await.unwrap_or_default();
                    let error = ApiError::Refused {
                        method: method.clone(),
                        path: path.to_owned(),
                        status,
                        message: error_message(&text),
                    };
                    if !(status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS)
                        || attempt >= self.attempts
                    {
                        return Err(error);
                    }
                    error
                }
                Err(source) => {
                    let error = ApiError::Unreachable { url: url.clone(), source };
                    if attempt >= self.attempts {
                        return Err(error);
                    }
                    error
                }
            };
            tracing::warn!(%method, path, attempt, error = %retry, "internal API request failed; retrying");
            tokio::time::sleep(delay).await;
            delay = (delay * 3).min(MAX_DELAY);
            attempt += 1;
        }
    }
}

/// The `error` field of a JSON error answer, or the (bounded) text.
fn error_message(text: &str) -> String {
    if let Ok(Value::Object(map)) = serde_json::from_str::<Value>(text)
        && let Some(Value::String(message)) = map.get("error")
    {
        return message.clone();
    }
    crate::capture::truncate_chars(text.trim(), 512)
}

//! The model: any OpenAI-compatible chat-completions endpoint.
//!
//! Requests and answers are async-openai's chat types; the HTTP exchange is our own (reqwest)
//! because the agent needs what async-openai's client hides: the `Retry-After` header of a
//! 429, and a precise classification of what went wrong. Every request is bounded by the
//! task's remaining time. Transient failures are retried inside one model call — 429 after
//! the time the endpoint asks for, 5xx and connection failures after a short backoff — then
//! turned into a [`ModelError`] that says exactly what went wrong. 401/403 and other 4xx are
//! not retried.

use std::time::Duration;
use tracing::Instrument;

use async_openai::types::chat::{
    ChatCompletionRequestAssistantMessage, ChatCompletionRequestMessage, ChatCompletionRequestSystemMessage,
    ChatCompletionRequestUserMessage, CreateChatCompletionRequest, CreateChatCompletionResponse,
};
use reqwest::StatusCode;
use reqwest::header::{HeaderMap, RETRY_AFTER};

/// Model settings (from the environment of the agent; the key never appears in logs).
#[derive(Clone)]
pub struct ModelSettings {
    /// Base URL, e.g. `https://api.openai.com/v1`.
    pub base_url: String,
    /// Model id.
    pub model: String,
    /// API key (empty: no `Authorization` header, for local endpoints that need none).
    pub api_key: String,
}

impl std::fmt::Debug for ModelSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelSettings")
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .finish_non_exhaustive()
    }
}

/// A chat message of the conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// The system prompt.
    System(String),
    /// Task and observations.
    User(String),
    /// The model's answers.
    Assistant(String),
}

/// Why a model call failed.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// 401/403: the key is wrong or lacks access. Not retried.
    #[error("the model endpoint {base_url} refused the API key ({status}): {message}")]
    Unauthorized {
        /// Endpoint.
        base_url: String,
        /// HTTP status.
        status: u16,
        /// The endpoint's message.
        message: String,
    },
    /// Still rate limited after retries.
    #[error("the model endpoint {base_url} is rate limiting (429) after {attempts} attempts: {message}")]
    RateLimited {
        /// Endpoint.
        base_url: String,
        /// Attempts made.
        attempts: u32,
        /// The endpoint's message.
        message: String,
    },
    /// A 429 whose `Retry-After` asks for a longer wait than the agent accepts.
    #[error(
        "the model endpoint {base_url} is rate limiting (429) and asks to wait {wait_secs}s, longer than the \
         {max_secs}s the agent waits: {message}"
    )]
    RetryAfterTooLong {
        /// Endpoint.
        base_url: String,
        /// The wait `Retry-After` asked for, in seconds.
        wait_secs: u64,
        /// The longest wait accepted, in seconds.
        max_secs: u64,
        /// The endpoint's message.
        message: String,
    },
    /// Any other error status (5xx after retries, 4xx at once).
    #[error("the model endpoint {base_url} answered {status}: {message}")]
    Status {
        /// Endpoint.
        base_url: String,
        /// HTTP status.
        status: u16,
        /// The endpoint's message.
        message: String,
    },
    /// Connection refused, DNS, TLS... after retries.
    #[error("the model endpoint {base_url} is unreachable: {message}")]
    Unreachable {
        /// Endpoint.
        base_url: String,
        /// Transport error.
        message: String,
    },
    /// The answer was not a chat completion, or had no content.
    #[error("the model endpoint {base_url} sent a malformed response: {message}")]
    Malformed {
        /// Endpoint.
        base_url: String,
        /// What was wrong.
        message: String,
    },
    /// The task's deadline came first.
    #[error("the model did not answer before the task's deadline")]
    Deadline,
}

impl ModelError {
    /// Worth another model call (within the model call budget): a malformed answer may be a
    /// one-off. Everything else was already retried inside the call.
    pub fn is_retryable(&self) -> bool {
        matches!(self, ModelError::Malformed { .. })
    }

    /// The `error.type` of the model call's span.
    pub fn kind(&self) -> &'static str {
        match self {
            ModelError::Unauthorized { .. } => "unauthorized",
            ModelError::RateLimited { .. } | ModelError::RetryAfterTooLong { .. } => "rate_limited",
            ModelError::Status { .. } => "status",
            ModelError::Unreachable { .. } => "unreachable",
            ModelError::Malformed { .. } => "malformed",
            ModelError::Deadline => "deadline",
        }
    }
}

/// How transient failures are retried inside one model call.
#[derive(Clone, Copy, Debug)]
pub struct RetryPolicy {
    /// Attempts for 429 answers.
    pub rate_limited_attempts: u32,
    /// Attempts for 5xx answers and connection failures.
    pub transient_attempts: u32,
    /// First backoff for 5xx and connection failures (doubled each time).
    pub backoff: Duration,
    /// Wait after a 429 without `Retry-After`.
    pub default_retry_after: Duration,
    /// Longest wait a `Retry-After` may ask for (longer waits end the call).
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            rate_limited_attempts: 4,
            transient_attempts: 3,
            backoff: Duration::from_millis(500),
            default_retry_after: Duration::from_secs(2),
            max_retry_after: Duration::from_secs(60),
        }
    }
}

/// A chat-completions client for one task.
pub struct Model {
    http: reqwest::Client,
    settings: ModelSettings,
    retry: RetryPolicy,
}

/// What one HTTP attempt gave.
enum Attempt {
    Done(String),
    Retry { wait: Duration, error: ModelError },
    Fail(ModelError),
}

impl Model {
    /// A client for `settings`; `request_timeout` bounds each HTTP request.
    pub fn new(settings: ModelSettings, request_timeout: Duration, retry: RetryPolicy) -> anyhow::Result<Self> {
        let http =
            reqwest::Client::builder().timeout(request_timeout).connect_timeout(Duration::from_secs(10)).build()?;
        Ok(Self { http, settings, retry })
    }

    /// The endpoint (for messages and events; no key).
    pub fn base_url(&self) -> &str {
        &self.settings.base_url
    }

    /// Sends the conversation and returns the assistant's text, within `remaining`.
    pub async fn complete(&self, messages: &[Message], remaining: Duration) -> Result<String, ModelError> {
        let request = CreateChatCompletionRequest {
            model: self.settings.model.clone(),
            messages: messages.iter().map(to_request_message).collect(),
            temperature: Some(0.0),
            ..Default::default()
        };
        let body =
            serde_json::to_vec(&request).map_err(|e| self.malformed(format!("cannot encode the request: {e}")))?;
        // One span per model call (retries included), with the token counts the answer gives.
        let span = tracing::info_span!(
            "model.generate",
            "otel.kind" = "client",
            "gen_ai.operation.name" = "chat",
            "gen_ai.request.model" = %self.settings.model,
            "gen_ai.response.model" = tracing::field::Empty,
            "gen_ai.usage.input_tokens" = tracing::field::Empty,
            "gen_ai.usage.output_tokens" = tracing::field::Empty,
            "otel.status_code" = tracing::field::Empty,
            "error.type" = tracing::field::Empty,
        );
        let result = match tokio::time::timeout(remaining, self.with_retries(body)).instrument(span.clone()).await {
            Ok(result) => result,
            Err(_) => Err(ModelError::Deadline),
        };
        if let Err(e) = &result {
            toolyard_telemetry::record_error(&span, e.kind());
        }
        result
    }

    async fn with_retries(&self, body: Vec<u8>) -> Result<String, ModelError> {
        let (mut rate_limited, mut transient) = (0, 0);
        let mut backoff = self.retry.backoff;
        loop {
            match self.attempt(body.clone()).await {
                Attempt::Done(text) => return Ok(text),
                Attempt::Fail(error) => return Err(error),
                Attempt::Retry { wait, error } => {
                    let limited = matches!(error, ModelError::RateLimited { .. });
                    let (count, limit) = if limited {
                        rate_limited += 1;
                        (rate_limited, self.retry.rate_limited_attempts)
                    } else {
                        transient += 1;
                        (transient, self.retry.transient_attempts)
                    };
                    let too_long = wait > self.retry.max_retry_after;
                    if count >= limit || too_long {
                        return Err(match error {
                            ModelError::RateLimited { base_url, message, .. } if too_long => {
                                ModelError::RetryAfterTooLong {
                                    base_url,
                                    wait_secs: wait.as_secs_f64().ceil() as u64,
                                    max_secs: self.retry.max_retry_after.as_secs(),
                                    message,
                                }
                            }
                            ModelError::RateLimited { base_url, message, .. } => {
                                ModelError::RateLimited { base_url, attempts: count, message }
                            }
                            other => other,
                        });
                    }
                    let wait = if limited { wait } else { backoff };
                    backoff *= 2;
                    tracing::warn!(error = %error, wait_ms = wait.as_millis() as u64, "model call failed; retrying");
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    async fn attempt(&self, body: Vec<u8>) -> Attempt {
        let url = format!("{}/chat/completions", self.settings.base_url.trim_end_matches('/'));
        let mut request = self.http.post(&url).header(reqwest::header::CONTENT_TYPE, "application/json").body(body);
        if !self.settings.api_key.is_empty() {
            request = request.bearer_auth(&self.settings.api_key);
        }
        // The gateway's proxy spans are children of this call's `model.generate` span.
        if let Some(traceparent) = toolyard_telemetry::traceparent(&tracing::Span::current()) {
            request = request.header("traceparent", traceparent);
        }
        let response = match request.send().await {
            Ok(r) => r,
            Err(e) => {
                let error = ModelError::Unreachable { base_url: self.base_url().to_owned(), message: error_chain(&e) };
                return Attempt::Retry { wait: self.retry.backoff, error };
            }
        };
        let status = response.status();
        let headers = response.headers().clone();
        let text = match response.text().await {
            Ok(t) => t,
            Err(e) => {
                let error = ModelError::Unreachable { base_url: self.base_url().to_owned(), message: error_chain(&e) };
                return Attempt::Retry { wait: self.retry.backoff, error };
            }
        };
        classify(self.base_url(), status, &headers, &text, &self.retry)
    }

    fn malformed(&self, message: String) -> ModelError {
        ModelError::Malformed { base_url: self.base_url().to_owned(), message }
    }
}

/// The answering model and its token counts, on the `model.generate` span.
fn record_usage(response: &CreateChatCompletionResponse) {
    let span = tracing::Span::current();
    span.record("gen_ai.response.model", response.model.as_str());
    if let Some(usage) = &response.usage {
        span.record("gen_ai.usage.input_tokens", usage.prompt_tokens)
            .record("gen_ai.usage.output_tokens", usage.completion_tokens);
    }
}

/// What an HTTP answer means: the content, a retry (with the wait) or a final error.
fn classify(base_url: &str, status: StatusCode, headers: &HeaderMap, body: &str, retry: &RetryPolicy) -> Attempt {
    let base_url = base_url.to_owned();
    if status.is_success() {
        return match serde_json::from_str::<CreateChatCompletionResponse>(body) {
            Err(e) => Attempt::Fail(ModelError::Malformed {
                base_url,
                message: format!("not a chat completion ({e}); the body starts with {:?}", prefix(body, 200)),
            }),
            Ok(response) => {
                record_usage(&response);
                match response.choices.into_iter().next().and_then(|c| c.message.content) {
                    Some(text) if !text.trim().is_empty() => Attempt::Done(text),
                    _ => Attempt::Fail(ModelError::Malformed {
                        base_url,
                        message: "the response has no message content".into(),
                    }),
                }
            }
        };
    }
    let message = error_message(body);
    let code = status.as_u16();
    match code {
        401 | 403 => Attempt::Fail(ModelError::Unauthorized { base_url, status: code, message }),
        429 => {
            let wait = retry_after(headers).unwrap_or(retry.default_retry_after);
            Attempt::Retry { wait, error: ModelError::RateLimited { base_url, attempts: 1, message } }
        }
        _ if status.is_server_error() => {
            Attempt::Retry { wait: retry.backoff, error: ModelError::Status { base_url, status: code, message } }
        }
        _ => Attempt::Fail(ModelError::Status { base_url, status: code, message }),
    }
}

/// `Retry-After` in seconds (the HTTP-date form is read as "now").
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    match value.parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs >= 0.0 => Some(Duration::from_secs_f64(secs)),
        _ => {
            let at = jiff::fmt::rfc2822::parse(value).ok()?.timestamp();
            let left = at.duration_since(jiff::Timestamp::now());
            Some(Duration::try_from(left).unwrap_or_default())
        }
    }
}

/// The `error.message` of an OpenAI-style error body, or the (bounded) body.
fn error_message(body: &str) -> String {
    let parsed: Option<String> = serde_json::from_str::<serde_json::Value>(body).ok().and_then(|v| {
        v["error"]["message"]
            .as_str()
            .or_else(|| v["error"].as_str())
            .or_else(|| v["message"].as_str())
            .map(str::to_owned)
    });
    match parsed {
        Some(m) => prefix(&m, 500),
        None if body.trim().is_empty() => "(no message)".to_owned(),
        None => prefix(body.trim(), 500),
    }
}

fn prefix(s: &str, chars: usize) -> String {
    s.chars().take(chars).collect()
}

fn to_request_message(m: &Message) -> ChatCompletionRequestMessage {
    match m {
        Message::System(t) => {
            ChatCompletionRequestSystemMessage { content: t.as_str().into(), ..Default::default() }.into()
        }
        Message::User(t) => {
            ChatCompletionRequestUserMessage { content: t.as_str().into(), ..Default::default() }.into()
        }
        Message::Assistant(t) => {
            ChatCompletionRequestAssistantMessage { content: Some(t.as_str().into()), ..Default::default() }.into()
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(retry: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(v) = retry {
            h.insert(RETRY_AFTER, v.parse().unwrap());
        }
        h
    }

    const COMPLETION: &str = r#"{"id":"x","object":"chat.completion","created":1,"model":"m",
        "choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}]}"#;

    #[test]
    fn answers_are_classified() {
        let policy = RetryPolicy::default();
        let ok = classify("http://m", StatusCode::OK, &headers(None), COMPLETION, &policy);
        assert!(matches!(ok, Attempt::Done(ref t) if t == "hello"));

        let unauthorized = classify(
            "http://m",
            StatusCode::UNAUTHORIZED,
            &headers(None),
            r#"{"error":{"message":"bad key"}}"#,
            &policy,
        );
        let Attempt::Fail(e) = unauthorized else { panic!("401 is final") };
        assert!(e.to_string().contains("refused the API key (401): bad key"), "{e}");

        let limited = classify("http://m", StatusCode::TOO_MANY_REQUESTS, &headers(Some("7")), "{}", &policy);
        assert!(matches!(limited, Attempt::Retry { wait, .. } if wait == Duration::from_secs(7)));
        let limited = classify("http://m", StatusCode::TOO_MANY_REQUESTS, &headers(None), "{}", &policy);
        assert!(matches!(limited, Attempt::Retry { wait, .. } if wait == policy.default_retry_after));

        assert!(matches!(
            classify("http://m", StatusCode::BAD_GATEWAY, &headers(None), "upstream down", &policy),
            Attempt::Retry { error: ModelError::Status { status: 502, .. }, .. }
        ));
        assert!(matches!(
            classify("http://m", StatusCode::BAD_REQUEST, &headers(None), "{}", &policy),
            Attempt::Fail(ModelError::Status { status: 400, .. })
        ));

        let Attempt::Fail(e) = classify("http://m", StatusCode::OK, &headers(None), "<html>", &policy) else {
            panic!("malformed is final for the attempt")
        };
        assert!(e.is_retryable() && e.to_string().contains("not a chat completion"), "{e}");
        let empty = COMPLETION.replace("\"hello\"", "\"  \"");
        let Attempt::Fail(e) = classify("http://m", StatusCode::OK, &headers(None), &empty, &policy) else {
            panic!("no content")
        };
        assert!(e.to_string().contains("no message content"), "{e}");
    }

    #[test]
    fn debug_output_never_shows_the_key() {
        let s = ModelSettings { base_url: "http://m".into(), model: "m".into(), api_key: "sk-secret".into() };
        assert!(!format!("{s:?}").contains("sk-secret"));
    }

    #[tokio::test]
    async fn an_unreachable_endpoint_fails_after_bounded_retries() {
        // A port that was just free: nothing listens there.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let settings = ModelSettings {
            base_url: format!("http://127.0.0.1:{port}/v1"),
            model: "m".into(),
            api_key: String::new(),
        };
        let retry = RetryPolicy { backoff: Duration::from_millis(1), ..RetryPolicy::default() };
        let model = Model::new(settings, Duration::from_secs(5), retry).unwrap();
        let e = model.complete(&[Message::User("hi".into())], Duration::from_secs(30)).await.unwrap_err();
        assert!(matches!(e, ModelError::Unreachable { .. }), "{e}");
        assert!(e.to_string().contains(&format!("127.0.0.1:{port}")), "{e}");
    }
}

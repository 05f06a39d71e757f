//! The model: any OpenAI-compatible chat-completions endpoint, through async-openai.
//!
//! async-openai retries 429 (honouring `Retry-After`), 5xx and connection errors a few
//! times; the agent bounds every request by the task's remaining time and turns what is
//! left into a [`ModelError`] that says exactly what went wrong.

use std::time::Duration;

use async_openai::Client;
use async_openai::config::OpenAIConfig;
use async_openai::error::OpenAIError;
use async_openai::types::chat::{
    ChatCompletionRequestAssistantMessage, ChatCompletionRequestMessage, ChatCompletionRequestSystemMessage,
    ChatCompletionRequestUserMessage, CreateChatCompletionRequest,
};

/// Model settings (from the environment of the agent; the key never appears in logs).
#[derive(Clone)]
pub struct ModelSettings {
    /// Base URL, e.g. `https://api.openai.com/v1`.
    pub base_url: String,
    /// Model id.
    pub model: String,
    /// API key.
    pub api_key: String,
}

impl std::fmt::Debug for ModelSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelSettings").field("base_url", &self.base_url).field("model", &self.model).finish_non_exhaustive()
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
    #[error("the model endpoint {base_url} is rate limiting (429) after retries: {message}")]
    RateLimited {
        /// Endpoint.
        base_url: String,
        /// The endpoint's message.
        message: String,
    },
    /// Any other error status.
    #[error("the model endpoint {base_url} answered {status}: {message}")]
    Status {
        /// Endpoint.
        base_url: String,
        /// HTTP status.
        status: u16,
        /// The endpoint's message.
        message: String,
    },
    /// Connection refused, DNS, TLS...
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
    /// Worth another try (within budget): malformed answers and server errors.
    pub fn is_retryable(&self) -> bool {
        matches!(self, ModelError::Malformed { .. }) || matches!(self, ModelError::Status { status, .. } if *status >= 500)
    }
}

/// A chat-completions client for one task.
pub struct Model {
    client: Client<OpenAIConfig>,
    settings: ModelSettings,
}

impl Model {
    /// A client for `settings`, with a request timeout.
    pub fn new(settings: ModelSettings, request_timeout: Duration) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder().timeout(request_timeout).connect_timeout(Duration::from_secs(10)).build()?;
        let config = OpenAIConfig::new().with_api_base(settings.base_url.trim_end_matches('/')).with_api_key(&settings.api_key);
        Ok(Self { client: Client::with_config(config).with_http_client(http), settings })
    }

    /// The endpoint (for messages and events; no key).
    pub fn base_url(&self) -> &str {
        &self.settings.base_url
    }

    /// Sends the conversation and returns the assistant's text, bounded by `remaining`.
    pub async fn complete(&self, messages: &[Message], remaining: Duration) -> Result<String, ModelError> {
        let request = CreateChatCompletionRequest {
            model: self.settings.model.clone(),
            messages: messages.iter().map(to_request_message).collect(),
            temperature: Some(0.0),
            ..Default::default()
        };
        let base_url = self.settings.base_url.clone();
        let response = match tokio::time::timeout(remaining, self.client.chat().create(request)).await {
            Err(_) => return Err(ModelError::Deadline),
            Ok(Err(e)) => return Err(classify(e, base_url)),
            Ok(Ok(r)) => r,
        };
        let content = response.choices.into_iter().next().and_then(|c| c.message.content);
        match content {
            Some(text) if !text.trim().is_empty() => Ok(text),
            _ => Err(ModelError::Malformed { base_url, message: "the response has no message content".into() }),
        }
    }
}

fn to_request_message(m: &Message) -> ChatCompletionRequestMessage {
    match m {
        Message::System(t) => {
            ChatCompletionRequestSystemMessage { content: t.as_str().into(), ..Default::default() }.into()
        }
        Message::User(t) => ChatCompletionRequestUserMessage { content: t.as_str().into(), ..Default::default() }.into(),
        Message::Assistant(t) => {
            ChatCompletionRequestAssistantMessage { content: Some(t.as_str().into()), ..Default::default() }.into()
        }
    }
}

fn classify(error: OpenAIError, base_url: String) -> ModelError {
    match error {
        OpenAIError::ApiError(api) => {
            let status = api.status_code.as_u16();
            let message = api.api_error.message.clone();
            match status {
                401 | 403 => ModelError::Unauthorized { base_url, status, message },
                429 => ModelError::RateLimited { base_url, message },
                _ => ModelError::Status { base_url, status, message },
            }
        }
        OpenAIError::Reqwest(e) if e.is_status() => {
            let status = e.status().map(|s| s.as_u16()).unwrap_or(0);
            match status {
                401 | 403 => ModelError::Unauthorized { base_url, status, message: e.to_string() },
                429 => ModelError::RateLimited { base_url, message: e.to_string() },
                _ => ModelError::Status { base_url, status, message: e.to_string() },
            }
        }
        OpenAIError::Reqwest(e) => ModelError::Unreachable { base_url, message: error_chain(&e) },
        OpenAIError::JSONDeserialize(e, body) => {
            let body: String = body.chars().take(200).collect();
            ModelError::Malformed { base_url, message: format!("{e}; body starts with {body:?}") }
        }
        other => ModelError::Malformed { base_url, message: other.to_string() },
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

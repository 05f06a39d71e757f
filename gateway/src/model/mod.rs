//! Coding agents' model calls, through the gateway: no model key ever enters a pod or an
//! agent process.
//!
//! The agent's model is an OpenAI-compatible API on the internal listener
//! (`POST /internal/v1/tasks/{id}/model/chat/completions`, [`toolyard_api::agent::path`]) with
//! the task token as its API key. For each request the gateway checks that the task is still
//! running, that its owner may use the task's [`profiles::ModelProfile`] (the same
//! authorizer as for tools: RBAC verb `use` on `modelprofiles` on Kubernetes), and that the
//! task's and the owner's token budgets are not used up; then it forwards the request to the
//! profile's endpoint with the profile's model id and key, counts the tokens the answer
//! reports (into the task's record, where every replica sees them, and into metrics by user
//! and profile) and returns the endpoint's answer as it came. Streaming is not offered.

pub mod config;
pub mod profiles;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::Instrument;

use bytes::Bytes;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use serde_json::Value;

pub use config::ModelArgs;
pub use profiles::{ModelProfile, ModelProfiles, ProfileError};

/// Largest request body the agent may send.
pub const MAX_REQUEST_BYTES: usize = 8 * 1024 * 1024;
/// Largest answer accepted from an endpoint.
const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;
/// Distinct users the metrics name; calls of further users are counted under `user="-"`.
const MAX_METRIC_USERS: usize = 1000;
/// The window of the per-user token budget.
pub const USER_BUDGET_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// Settings of the proxy.
#[derive(Clone, Debug)]
pub struct ProxySettings {
    /// Timeout of one request to an endpoint.
    pub timeout: Duration,
    /// Most model tokens one user's tasks may use in [`USER_BUDGET_WINDOW`] (`None`: no limit).
    pub user_tokens_per_day: Option<i64>,
}

impl Default for ProxySettings {
    fn default() -> Self {
        Self { timeout: Duration::from_secs(300), user_tokens_per_day: None }
    }
}

/// A refusal or failure of the proxy itself, answered to the agent as an OpenAI-style error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyError {
    /// HTTP status.
    pub status: u16,
    /// What happened, for the agent (and the task's result).
    pub message: String,
}

impl ProxyError {
    fn new(status: u16, message: impl Into<String>) -> Self {
        Self { status, message: message.into() }
    }

    /// The error body an OpenAI-compatible client understands.
    pub fn body(&self) -> Value {
        serde_json::json!({"error": {"message": self.message, "type": "toolyard_gateway"}})
    }
}

/// The endpoint's answer, passed on as it came.
#[derive(Debug)]
pub struct Forwarded {
    /// Its HTTP status.
    pub status: u16,
    /// Its `Retry-After`, if any (a 429).
    pub retry_after: Option<String>,
    /// Its body.
    pub body: Bytes,
    /// Tokens its `usage` reports (prompt and completion), when it says.
    pub tokens: Option<i64>,
}

/// The budgets a request is checked against.
#[derive(Clone, Copy, Debug)]
pub struct Usage {
    /// Tokens the task has used.
    pub task_used: i64,
    /// The task's budget.
    pub task_budget: i64,
    /// Tokens the task's owner used in the last [`USER_BUDGET_WINDOW`].
    pub owner_used: i64,
}

/// Forwards agents' model calls to their profiles' endpoints.
pub struct ModelProxy {
    profiles: Arc<ModelProfiles>,
    settings: ProxySettings,
    http: reqwest::Client,
    metrics: ModelMetrics,
    /// The last reachability probe of each profile, with its time.
    probes: std::sync::Mutex<std::collections::HashMap<String, (Instant, Reach)>>,
}

/// Whether the gateway reaches a profile's endpoint (`GET {baseUrl}/models` with its key).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Reach {
    /// The endpoint answered, and did not refuse the key.
    pub reachable: bool,
    /// Its HTTP status, when it answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// What went wrong.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// How long a probe's answer is reused.
const PROBE_TTL: Duration = Duration::from_secs(30);
/// How long a probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

impl std::fmt::Debug for ModelProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelProxy").field("profiles", &self.profiles).field("settings", &self.settings).finish()
    }
}

impl ModelProxy {
    /// A proxy for `profiles`, counting into `metrics`.
    pub fn new(profiles: Arc<ModelProfiles>, settings: ProxySettings, metrics: ModelMetrics) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(settings.timeout)
            .connect_timeout(Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        Ok(Self { profiles, settings, http, metrics, probes: Default::default() })
    }

    /// A proxy with no profile (a gateway without coding tasks).
    pub fn none() -> Self {
        Self {
            profiles: Arc::new(ModelProfiles::none()),
            settings: ProxySettings::default(),
            http: reqwest::Client::default(),
            metrics: ModelMetrics::new(),
            probes: Default::default(),
        }
    }

    /// Whether the gateway reaches `profile`'s endpoint: `GET {baseUrl}/models` with the
    /// profile's key (an OpenAI-compatible listing; any answer but 401, 403 or a 5xx counts).
    /// Answers are reused for 30 seconds, so a caller cannot make the gateway hammer an
    /// endpoint.
    pub async fn probe(&self, profile: &ModelProfile) -> Reach {
        let cached = self.probes.lock().unwrap_or_else(|e| e.into_inner()).get(&profile.name).cloned();
        if let Some((at, reach)) = cached
            && at.elapsed() < PROBE_TTL
        {
            return reach;
        }
        let mut request = self.http.get(format!("{}/models", profile.base_url)).timeout(PROBE_TIMEOUT);
        if let Some(key) = profile.api_key() {
            request = request.bearer_auth(key);
        }
        let reach = match request.send().await {
            Ok(response) => {
                let status = response.status().as_u16();
                let error = match status {
                    401 | 403 => Some(format!("the endpoint refuses the profile's key (HTTP {status})")),
                    500.. => Some(format!("the endpoint answers HTTP {status}")),
                    _ => None,
                };
                Reach { reachable: error.is_none(), status: Some(status), error }
            }
            Err(e) => {
                let why = if e.is_timeout() { "did not answer in time".to_owned() } else { without_url(&e) };
                Reach { reachable: false, status: None, error: Some(format!("unreachable: {why}")) }
            }
        };
        self.probes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(profile.name.clone(), (Instant::now(), reach.clone()));
        reach
    }

    /// The profiles.
    pub fn profiles(&self) -> &ModelProfiles {
        &self.profiles
    }

    /// Refuses a request that would go over a budget.
    pub fn check_budgets(&self, usage: Usage) -> Result<(), ProxyError> {
        if usage.task_used >= usage.task_budget {
            return Err(ProxyError::new(
                409,
                format!("the task's model token budget ({}) is used up ({} used)", usage.task_budget, usage.task_used),
            ));
        }
        if let Some(limit) = self.settings.user_tokens_per_day
            && usage.owner_used >= limit
        {
            return Err(ProxyError::new(
                429,
                format!("your model token budget of {limit} tokens a day is used up; try again later"),
            ));
        }
        Ok(())
    }

    /// Forwards one chat-completion request `body` of `user` to `profile`: the profile's
    /// model id replaces whatever the request names, and the profile's key is added.
    pub async fn forward(&self, profile: &ModelProfile, user: &str, body: &[u8]) -> Result<Forwarded, ProxyError> {
        let mut request: serde_json::Map<String, Value> = match serde_json::from_slice(body) {
            Ok(Value::Object(map)) => map,
            _ => return Err(ProxyError::new(400, "the body must be a JSON chat-completion request")),
        };
        if request.get("stream").and_then(Value::as_bool) == Some(true) {
            return Err(ProxyError::new(400, "streaming is not offered through the gateway: send stream=false"));
        }
        request.insert("model".into(), Value::String(profile.model.clone()));
        let url = format!("{}/chat/completions", profile.base_url);
        let mut http = self.http.post(&url).json(&request);
        if let Some(key) = profile.api_key() {
            http = http.bearer_auth(key);
        }
        let span = tracing::info_span!(
            "chat",
            "otel.name" = format!("chat {}", profile.model),
            "otel.kind" = "client",
            "gen_ai.operation.name" = "chat",
            "gen_ai.request.model" = %profile.model,
            "toolyard.model.profile" = %profile.name,
            "gen_ai.usage.input_tokens" = tracing::field::Empty,
            "gen_ai.usage.output_tokens" = tracing::field::Empty,
            "otel.status_code" = tracing::field::Empty,
        );
        let started = Instant::now();
        let result = http.send().instrument(span.clone()).await;
        let forwarded = match result {
            Ok(response) => {
                let status = response.status().as_u16();
                let retry_after = response
                    .headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned);
                match read_bounded(response).instrument(span.clone()).await {
                    Ok(body) => {
                        let tokens = (status < 300).then(|| tokens_of(&body, &span)).flatten();
                        Ok(Forwarded { status, retry_after, body, tokens })
                    }
                    Err(e) => Err(ProxyError::new(502, format!("the model endpoint of profile {}: {e}", profile.name))),
                }
            }
            Err(e) => {
                // Transport errors name the endpoint, never the key (reqwest does not print headers).
                let why = if e.is_timeout() { "did not answer in time".to_owned() } else { without_url(&e) };
                Err(ProxyError::new(
                    502,
                    format!("the model endpoint of profile {} is unreachable: {why}", profile.name),
                ))
            }
        };
        if !matches!(&forwarded, Ok(f) if f.status < 300) {
            span.record("otel.status_code", "ERROR");
        }
        let outcome = match &forwarded {
            Ok(f) if f.status < 300 => "ok",
            Ok(f) if f.status == 429 => "rate_limited",
            Ok(_) => "error",
            Err(_) => "unreachable",
        };
        let user = self.metrics.user_label(user);
        self.metrics
            .requests
            .get_or_create(&ModelLabels { profile: profile.name.clone(), user: user.clone(), outcome })
            .inc();
        self.metrics
            .duration
            .get_or_create(&ProfileLabel { profile: profile.name.clone() })
            .observe(started.elapsed().as_secs_f64());
        if let Ok(Forwarded { tokens: Some(n), .. }) = &forwarded {
            self.metrics
                .tokens
                .get_or_create(&TokenLabels { profile: profile.name.clone(), user })
                .inc_by(u64::try_from(*n).unwrap_or(0));
        }
        forwarded
    }
}

async fn read_bounded(mut response: reqwest::Response) -> Result<Bytes, String> {
    let mut body = Vec::new();
    while let Some(chunk) =
        response.chunk().await.map_err(|e| format!("reading its answer failed: {}", without_url(&e)))?
    {
        if body.len() + chunk.len() > MAX_RESPONSE_BYTES {
            return Err(format!("its answer is larger than {MAX_RESPONSE_BYTES} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(body))
}

fn without_url(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    if let Some(url) = e.url() {
        text = text.replace(url.as_str(), "(endpoint)");
    }
    text
}

/// Tokens an OpenAI-style answer's `usage` reports.
/// Tokens the answer's `usage` reports (also recorded on `span`).
fn tokens_of(body: &[u8], span: &tracing::Span) -> Option<i64> {
    let value: Value = serde_json::from_slice(body).ok()?;
    let usage = value.get("usage")?;
    if let Some(n) = usage.get("prompt_tokens").and_then(Value::as_i64) {
        span.record("gen_ai.usage.input_tokens", n);
    }
    if let Some(n) = usage.get("completion_tokens").and_then(Value::as_i64) {
        span.record("gen_ai.usage.output_tokens", n);
    }
    usage.get("total_tokens").and_then(Value::as_i64).or_else(|| {
        let prompt = usage.get("prompt_tokens").and_then(Value::as_i64).unwrap_or(0);
        let completion = usage.get("completion_tokens").and_then(Value::as_i64).unwrap_or(0);
        Some(prompt + completion)
    })
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabels {
    profile: String,
    user: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TokenLabels {
    profile: String,
    user: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProfileLabel {
    profile: String,
}

/// Metrics of model calls: requests and tokens by profile and user (at most
/// [`MAX_METRIC_USERS`] users are named), latency by profile.
#[derive(Clone)]
pub struct ModelMetrics {
    requests: Family<ModelLabels, Counter>,
    tokens: Family<TokenLabels, Counter>,
    duration: Family<ProfileLabel, Histogram, fn() -> Histogram>,
    users: Arc<Mutex<HashSet<String>>>,
}

fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.05, 2.0, 14))
}

impl Default for ModelMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl ModelMetrics {
    /// Fresh metrics.
    pub fn new() -> Self {
        Self {
            requests: Family::default(),
            tokens: Family::default(),
            duration: Family::new_with_constructor(duration_histogram),
            users: Arc::default(),
        }
    }

    /// Registers them in the gateway's registry (`toolyard_gateway_model_*`).
    pub fn register(&self, registry: &mut Registry) {
        registry.register("model_requests", "Model calls of coding agents through the gateway", self.requests.clone());
        registry.register(
            "model_tokens",
            "Model tokens (prompt and completion) used by coding agents",
            self.tokens.clone(),
        );
        registry.register(
            "model_request_duration_seconds",
            "Duration of model calls through the gateway",
            self.duration.clone(),
        );
    }

    fn user_label(&self, user: &str) -> String {
        let mut users = self.users.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if users.contains(user) {
            return user.to_owned();
        }
        if users.len() < MAX_METRIC_USERS {
            users.insert(user.to_owned());
            return user.to_owned();
        }
        "-".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxy(limit: Option<i64>) -> ModelProxy {
        let settings = ProxySettings { user_tokens_per_day: limit, ..ProxySettings::default() };
        ModelProxy::new(Arc::new(ModelProfiles::none()), settings, ModelMetrics::new()).unwrap()
    }

    #[test]
    fn budgets_refuse_with_what_is_used_up() {
        let p = proxy(Some(100));
        assert!(p.check_budgets(Usage { task_used: 10, task_budget: 1000, owner_used: 99 }).is_ok());
        let task = p.check_budgets(Usage { task_used: 1000, task_budget: 1000, owner_used: 0 }).unwrap_err();
        assert_eq!(task.status, 409);
        assert!(task.message.contains("task's model token budget (1000)"), "{}", task.message);
        let user = p.check_budgets(Usage { task_used: 0, task_budget: 1000, owner_used: 100 }).unwrap_err();
        assert_eq!(user.status, 429);
        assert!(proxy(None).check_budgets(Usage { task_used: 0, task_budget: 10, owner_used: i64::MAX }).is_ok());
    }

    #[test]
    fn tokens_come_from_usage() {
        assert_eq!(tokens_of(br#"{"usage": {"total_tokens": 42}}"#, &tracing::Span::none()), Some(42));
        assert_eq!(
            tokens_of(br#"{"usage": {"prompt_tokens": 40, "completion_tokens": 2}}"#, &tracing::Span::none()),
            Some(42)
        );
        assert_eq!(tokens_of(br#"{"choices": []}"#, &tracing::Span::none()), None);
        assert_eq!(tokens_of(b"not json", &tracing::Span::none()), None);
    }

    #[test]
    fn metrics_name_a_bounded_number_of_users() {
        let m = ModelMetrics::new();
        for i in 0..MAX_METRIC_USERS {
            assert_eq!(m.user_label(&format!("u{i}")), format!("u{i}"));
        }
        assert_eq!(m.user_label("one-too-many"), "-");
        assert_eq!(m.user_label("u0"), "u0");
    }
}

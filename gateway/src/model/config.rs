//! Flags of the model profiles and the model proxy (flattened into `serve` and `local`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use super::{ModelMetrics, ModelProfiles, ModelProxy, ProxySettings};
use crate::metrics::Metrics;

/// Where the model profiles come from, and the proxy's limits.
#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// YAML file of model profiles (see `toolyard_gateway::model::profiles`; the chart renders
    /// it from `model.profiles`).
    #[arg(long, env = "TOOLYARD_MODEL_PROFILES", conflicts_with = "model_base_url")]
    pub model_profiles: Option<PathBuf>,
    /// Without a profiles file, one profile named `default`: the base URL of an
    /// OpenAI-compatible chat-completions API (its key, if it needs one, from the environment
    /// variable TOOLYARD_MODEL_API_KEY, never a flag).
    #[arg(long, env = "TOOLYARD_MODEL_BASE_URL")]
    pub model_base_url: Option<String>,
    /// The model id of that profile.
    #[arg(long, env = "TOOLYARD_MODEL")]
    pub model: Option<String>,
    /// Timeout of one model request forwarded to an endpoint.
    #[arg(long, env = "TOOLYARD_MODEL_TIMEOUT_SECONDS", default_value_t = 300)]
    pub model_timeout_seconds: u64,
    /// Most model tokens one user's coding tasks may use in 24 hours (unset: no limit; each
    /// task also has its own budget, `maxModelTokens`).
    #[arg(long, env = "TOOLYARD_MODEL_USER_TOKENS_PER_DAY")]
    pub model_user_tokens_per_day: Option<i64>,
}

impl Default for ModelArgs {
    /// No profile (coding tasks refused), the default timeout, no per-user limit.
    fn default() -> Self {
        Self {
            model_profiles: None,
            model_base_url: None,
            model: None,
            model_timeout_seconds: 300,
            model_user_tokens_per_day: None,
        }
    }
}

impl ModelArgs {
    /// The profiles these flags name (none: coding tasks are refused with what to set).
    pub fn profiles(&self) -> anyhow::Result<ModelProfiles> {
        if let Some(file) = &self.model_profiles {
            return ModelProfiles::from_file(file);
        }
        let key = std::env::var("TOOLYARD_MODEL_API_KEY").ok().filter(|k| !k.trim().is_empty());
        let trimmed = |v: &Option<String>| v.as_ref().map(|s| s.trim().to_owned()).filter(|s| !s.is_empty());
        Ok(ModelProfiles::from_env_values(trimmed(&self.model_base_url), trimmed(&self.model), key)
            .map_err(anyhow::Error::msg)?
            .unwrap_or_default())
    }

    /// The proxy over these profiles, its metrics registered in `metrics`.
    pub fn build(&self, metrics: &Metrics) -> anyhow::Result<Arc<ModelProxy>> {
        let profiles = Arc::new(self.profiles()?);
        if profiles.is_empty() {
            tracing::info!("no model profile: coding tasks are refused until one is configured");
        } else {
            tracing::info!(profiles = ?profiles.names(), "model profiles");
        }
        let model_metrics = ModelMetrics::new();
        metrics.register(|r| model_metrics.register(r));
        let settings = ProxySettings {
            timeout: Duration::from_secs(self.model_timeout_seconds.max(1)),
            user_tokens_per_day: self.model_user_tokens_per_day,
        };
        Ok(Arc::new(ModelProxy::new(profiles, settings, model_metrics)?))
    }
}

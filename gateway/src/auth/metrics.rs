//! Authentication counters for Prometheus (prometheus-client), with bounded labels.
//!
//! Two ways to expose them: register the families with [`AuthMetrics::register`] (names
//! carry no prefix and no `_total`: under `Registry::with_prefix("toolyard_gateway")` they
//! become `toolyard_gateway_auth_failures_total{reason}` and
//! `toolyard_gateway_auth_successes_total{method}`), or, when the gateway already has its
//! own failure counter, forward every failure to it with [`AuthMetrics::with_failure_hook`]
//! (then don't register `auth_failures` twice).

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::identity::Identity;

/// Label of the failure counter: one of [`super::reason::ALL`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    /// Why the request was refused.
    pub reason: &'static str,
}

/// Label of the success counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SuccessLabels {
    /// `apikey`, `oidc`, `kubernetes`, `anonymous` or `local`.
    pub method: &'static str,
}

/// Called with the reason of every refusal.
pub type FailureHook = Arc<dyn Fn(&'static str) + Send + Sync>;

/// Authentication outcome counters. Cheap to clone (shared handles).
#[derive(Clone, Default)]
pub struct AuthMetrics {
    /// Refused requests by reason.
    pub failures: Family<FailureLabels, Counter>,
    /// Accepted requests by method.
    pub successes: Family<SuccessLabels, Counter>,
    hook: Option<FailureHook>,
}

impl std::fmt::Debug for AuthMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthMetrics").field("hook", &self.hook.is_some()).finish_non_exhaustive()
    }
}

impl AuthMetrics {
    /// Also calls `hook(reason)` on every refusal (e.g. the gateway's `Metrics::auth_failure`).
    pub fn with_failure_hook(mut self, hook: impl Fn(&'static str) + Send + Sync + 'static) -> Self {
        self.hook = Some(Arc::new(hook));
        self
    }

    /// Registers `auth_failures` and `auth_successes`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register("auth_failures", "Requests refused by authentication, by reason", self.failures.clone());
        registry.register("auth_successes", "Requests authenticated, by method", self.successes.clone());
    }

    /// Registers only `auth_successes` (when failures go to the gateway's own counter
    /// through [`Self::with_failure_hook`]).
    pub fn register_successes(&self, registry: &mut Registry) {
        registry.register("auth_successes", "Requests authenticated, by method", self.successes.clone());
    }

    /// Counts a refusal.
    pub fn failure(&self, reason: &'static str) {
        self.failures.get_or_create(&FailureLabels { reason }).inc();
        if let Some(hook) = &self.hook {
            hook(reason);
        }
    }

    /// Counts an accepted identity.
    pub fn success(&self, identity: &Identity) {
        self.successes.get_or_create(&SuccessLabels { method: method(&identity.issuer) }).inc();
    }

    /// Current failure count for `reason` (tests, debugging).
    pub fn failures_for(&self, reason: &'static str) -> u64 {
        self.failures.get_or_create(&FailureLabels { reason }).get()
    }
}

fn method(issuer: &str) -> &'static str {
    match issuer {
        super::apikey::ISSUER => "apikey",
        super::tokenreview::ISSUER => "kubernetes",
        super::chain::ANONYMOUS_ISSUER => "anonymous",
        "local" => "local",
        _ => "oidc",
    }
}

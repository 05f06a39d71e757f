//! Authorization counters (prometheus-client), bounded labels only.
//!
//! [`AuthzMetrics::register`] adds `authz_decisions{authorizer,action,outcome}`,
//! `authz_reviews` (SubjectAccessReviews sent) and `authz_review_errors` (reviews that
//! failed and were answered as deny); the counters add `_total`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Labels of a decision.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    /// `sar` or `static`.
    pub authorizer: &'static str,
    /// `call` (list or call a tool) or `task` (start a coding task).
    pub action: &'static str,
    /// `allow`, `deny` or `error` (an error is a deny).
    pub outcome: &'static str,
}

/// Authorization counters. Cheap to clone (shared handles).
#[derive(Clone, Debug, Default)]
pub struct AuthzMetrics {
    /// Decisions by authorizer, action and outcome (cache hits included).
    pub decisions: Family<DecisionLabels, Counter>,
    /// SubjectAccessReviews sent to the apiserver.
    pub reviews: Counter,
    /// SubjectAccessReviews that failed (timeout, apiserver error).
    pub review_errors: Counter,
}

impl AuthzMetrics {
    /// Registers the counters.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "authz_decisions",
            "Authorization decisions by authorizer, action and outcome",
            self.decisions.clone(),
        );
        registry.register("authz_reviews", "SubjectAccessReviews sent", self.reviews.clone());
        registry.register(
            "authz_review_errors",
            "SubjectAccessReviews that failed (answered as deny)",
            self.review_errors.clone(),
        );
    }

    /// Counts one decision.
    pub fn decision(&self, authorizer: &'static str, action: &'static str, outcome: &'static str) {
        self.decisions.get_or_create(&DecisionLabels { authorizer, action, outcome }).inc();
    }
}

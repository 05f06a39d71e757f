//! Prometheus metrics of the controller (prometheus-client). Labels are bounded: kinds,
//! results and condition reasons only, never object names.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::client::ApiRequestLabels;

/// Labels with the resource kind only.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// `ToolCall`, `CodingTask` or `McpTool`.
    pub kind: &'static str,
}

/// Labels of a reconcile outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileLabels {
    /// Resource kind.
    pub kind: &'static str,
    /// `ok` or an error class (`api`, `transport`, `invalid_object`).
    pub result: &'static str,
}

/// Labels of a finished run.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RunLabels {
    /// `ToolCall` or `CodingTask`.
    pub kind: &'static str,
    /// The `Succeeded` reason it ended with.
    pub outcome: &'static str,
}

type Histograms = Family<KindLabels, Histogram, fn() -> Histogram>;

/// Every metric of one controller process.
pub struct Metrics {
    registry: Registry,
    /// Reconcile passes by kind and result.
    pub reconciles: Family<ReconcileLabels, Counter>,
    /// Duration of reconcile passes.
    pub reconcile_duration: Histograms,
    /// ToolCall / CodingTask created -> its Job created.
    pub job_creation_latency: Histograms,
    /// Job created -> its pod running.
    pub job_start_latency: Histograms,
    /// Finished runs by kind and outcome.
    pub runs: Family<RunLabels, Counter>,
    /// Status writes by kind (patches of the `/status` subresource).
    pub status_writes: Family<KindLabels, Counter>,
    /// 1 while this replica holds the leader Lease (or runs without leader election).
    pub leader: Gauge,
    /// Requests this process sent to the apiserver, by verb, resource and code
    /// ([`crate::client`]).
    pub api_requests: Family<ApiRequestLabels, Counter>,
}

fn latency_histogram() -> Histogram {
    // 5 ms .. ~82 s.
    Histogram::new(exponential_buckets(0.005, 2.0, 15))
}

impl Metrics {
    /// Registers every metric under the `toolyard_controller` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("toolyard_controller");
        let reconciles = Family::<ReconcileLabels, Counter>::default();
        registry.register("reconciles", "Reconcile passes by kind and result", reconciles.clone());
        let reconcile_duration: Histograms = Family::new_with_constructor(latency_histogram);
        registry.register("reconcile_duration_seconds", "Duration of reconcile passes", reconcile_duration.clone());
        let job_creation_latency: Histograms = Family::new_with_constructor(latency_histogram);
        registry.register(
            "job_creation_latency_seconds",
            "Time from a ToolCall or CodingTask's creation to its Job's creation",
            job_creation_latency.clone(),
        );
        let job_start_latency: Histograms = Family::new_with_constructor(latency_histogram);
        registry.register(
            "job_start_latency_seconds",
            "Time from a Job's creation to its pod running",
            job_start_latency.clone(),
        );
        let runs = Family::<RunLabels, Counter>::default();
        registry.register("runs", "Finished runs by kind and outcome", runs.clone());
        let status_writes = Family::<KindLabels, Counter>::default();
        registry.register("status_writes", "Status subresource writes by kind", status_writes.clone());
        let leader = Gauge::default();
        registry.register("leader", "1 while this replica is the leader", leader.clone());
        let api_requests = Family::<ApiRequestLabels, Counter>::default();
        registry.register(
            "api_requests",
            "Requests sent to the Kubernetes apiserver by verb, resource and response code",
            api_requests.clone(),
        );
        Self {
            registry,
            reconciles,
            reconcile_duration,
            job_creation_latency,
            job_start_latency,
            runs,
            status_writes,
            leader,
            api_requests,
        }
    }

    /// The metrics in the Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_get_the_total_suffix_and_the_prefix() {
        let m = Metrics::new();
        m.reconciles.get_or_create(&ReconcileLabels { kind: "ToolCall", result: "ok" }).inc();
        m.runs.get_or_create(&RunLabels { kind: "ToolCall", outcome: "Succeeded" }).inc();
        m.job_creation_latency.get_or_create(&KindLabels { kind: "ToolCall" }).observe(0.02);
        m.leader.set(1);
        let text = m.encode();
        assert!(text.contains("toolyard_controller_reconciles_total{kind=\"ToolCall\",result=\"ok\"} 1"), "{text}");
        assert!(text.contains("toolyard_controller_runs_total{kind=\"ToolCall\",outcome=\"Succeeded\"} 1"), "{text}");
        assert!(text.contains("toolyard_controller_job_creation_latency_seconds_count{kind=\"ToolCall\"} 1"), "{text}");
        assert!(text.contains("toolyard_controller_leader 1"), "{text}");
    }
}

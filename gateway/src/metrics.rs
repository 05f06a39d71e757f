//! Prometheus metrics of the gateway (prometheus-client), served at `/metrics`.
//!
//! Authentication and authorization register their own counters into the same registry
//! ([`Metrics::register`]). Every label has a bounded set of values: routes are axum's matched route templates, MCP
//! methods and outcomes are fixed words, and tool names come from the catalog (a call of an
//! unknown tool is counted under `tool="-"`), never from client input.

use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of HTTP requests.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    /// Matched route template (`/mcp`, `/toolsets/{toolset}/mcp`, ...) or `unmatched`.
    pub route: String,
    /// HTTP method.
    pub method: String,
    /// Status code.
    pub status: u16,
}

/// Labels of MCP requests.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct McpLabels {
    /// JSON-RPC method (`tools/list`, `tools/call`, `subscriptions/listen`).
    pub method: &'static str,
    /// `ok` or an error kind.
    pub outcome: &'static str,
}

/// Labels of tool calls.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ToolLabels {
    /// MCP tool name, from the catalog.
    pub tool: String,
    /// See [`CallOutcome`].
    pub outcome: &'static str,
}

/// Label with only a tool name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ToolOnly {
    /// MCP tool name, from the catalog.
    pub tool: String,
}

/// Label with one bounded reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// A reason from a fixed vocabulary.
    pub reason: &'static str,
}

/// How a tool call ended, as counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallOutcome {
    /// The tool returned a value.
    Success,
    /// The tool ran and reported an error (isError).
    ToolError,
    /// Arguments did not match the input schema; nothing ran.
    InvalidArguments,
    /// The deadline passed.
    TimedOut,
    /// The client cancelled or went away.
    Cancelled,
    /// Refused by an admission limit.
    Busy,
    /// The platform failed (storage, apiserver, pool unreachable).
    Error,
}

impl CallOutcome {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            CallOutcome::Success => "success",
            CallOutcome::ToolError => "tool_error",
            CallOutcome::InvalidArguments => "invalid_arguments",
            CallOutcome::TimedOut => "timed_out",
            CallOutcome::Cancelled => "cancelled",
            CallOutcome::Busy => "busy",
            CallOutcome::Error => "error",
        }
    }
}

/// Which admission limit refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// Global concurrent tool calls.
    GlobalCalls,
    /// Concurrent tool calls of one user.
    UserCalls,
    /// Running coding tasks of one user.
    UserTasks,
    /// Global concurrent HTTP requests.
    HttpGlobal,
    /// Concurrent HTTP requests of one user.
    HttpUser,
    /// Open notification streams (`subscriptions/listen`, a session's GET) on this replica.
    StreamsGlobal,
    /// Open notification streams of one user.
    StreamsUser,
    /// Request body above the cap.
    BodyTooLarge,
    /// Request body not received within the body read timeout.
    BodyTimeout,
    /// The owner's stored files reached the storage quota.
    StorageQuota,
    /// The tool's warm pool had no free slot and a full queue.
    PoolBusy,
    /// The server is shutting down.
    ShuttingDown,
    /// A listener's open connections at their cap: a new one closed before it was read.
    Connections,
}

impl Rejection {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Rejection::GlobalCalls => "global_calls",
            Rejection::UserCalls => "user_calls",
            Rejection::UserTasks => "user_tasks",
            Rejection::HttpGlobal => "http_global",
            Rejection::HttpUser => "http_user",
            Rejection::StreamsGlobal => "streams_global",
            Rejection::StreamsUser => "streams_user",
            Rejection::BodyTooLarge => "body_too_large",
            Rejection::BodyTimeout => "body_timeout",
            Rejection::StorageQuota => "storage_quota",
            Rejection::PoolBusy => "pool_busy",
            Rejection::ShuttingDown => "shutting_down",
            Rejection::Connections => "connections",
        }
    }
}

/// The gateway's metrics and the registry they live in.
#[derive(Debug)]
pub struct Metrics {
    registry: Mutex<Registry>,
    http_requests: Family<HttpLabels, Counter>,
    http_duration: Family<HttpLabels, Histogram, fn() -> Histogram>,
    mcp_requests: Family<McpLabels, Counter>,
    tool_calls: Family<ToolLabels, Counter>,
    tool_call_duration: Family<ToolOnly, Histogram, fn() -> Histogram>,
    calls_in_flight: Gauge,
    authz_denials: Family<ReasonLabels, Counter>,
    admission_rejections: Family<ReasonLabels, Counter>,
    catalog_tools: Gauge,
}

fn latency_histogram() -> Histogram {
    // 1 ms .. ~33 min.
    Histogram::new(exponential_buckets(0.001, 2.0, 22))
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates the metrics and registers them under the `toolyard_gateway` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("toolyard_gateway");
        let m = Self {
            registry: Mutex::new(Registry::default()),
            http_requests: Family::default(),
            http_duration: Family::new_with_constructor(latency_histogram),
            mcp_requests: Family::default(),
            tool_calls: Family::default(),
            tool_call_duration: Family::new_with_constructor(latency_histogram),
            calls_in_flight: Gauge::default(),
            authz_denials: Family::default(),
            admission_rejections: Family::default(),
            catalog_tools: Gauge::default(),
        };
        registry.register("http_requests", "HTTP requests by route, method and status", m.http_requests.clone());
        registry.register(
            "http_request_duration_seconds",
            "HTTP request handling time (until the response head)",
            m.http_duration.clone(),
        );
        registry.register("mcp_requests", "MCP requests by JSON-RPC method and outcome", m.mcp_requests.clone());
        registry.register("tool_calls", "Tool calls by tool and outcome", m.tool_calls.clone());
        registry.register("tool_call_duration_seconds", "Tool call duration by tool", m.tool_call_duration.clone());
        registry.register("tool_calls_in_flight", "Tool calls running now", m.calls_in_flight.clone());
        registry.register(
            "authz_denials",
            "Authorization denials (call: a tools/call refused; list: tools hidden from a listing)",
            m.authz_denials.clone(),
        );
        registry.register(
            "admission_rejections",
            "Requests refused by an admission limit",
            m.admission_rejections.clone(),
        );
        registry.register("catalog_tools", "Tools in the catalog (Ready McpTools)", m.catalog_tools.clone());
        *m.registry.lock().unwrap_or_else(|e| e.into_inner()) = registry;
        m
    }

    /// Lets another part (authentication, the internal API) register its own metrics in the
    /// same registry, so one `/metrics` serves them all.
    pub fn register(&self, f: impl FnOnce(&mut Registry)) {
        f(&mut self.registry.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        out
    }

    /// Counts one HTTP request.
    pub fn http_request(&self, route: &str, method: &str, status: u16, elapsed: Duration) {
        let labels = HttpLabels { route: route.to_owned(), method: method.to_owned(), status };
        self.http_requests.get_or_create(&labels).inc();
        self.http_duration.get_or_create(&labels).observe(elapsed.as_secs_f64());
    }

    /// Counts one MCP request.
    pub fn mcp_request(&self, method: &'static str, outcome: &'static str) {
        self.mcp_requests.get_or_create(&McpLabels { method, outcome }).inc();
    }

    /// Counts one finished tool call. `tool` must come from the catalog.
    pub fn tool_call(&self, tool: &str, outcome: CallOutcome, elapsed: Duration) {
        self.tool_calls.get_or_create(&ToolLabels { tool: tool.to_owned(), outcome: outcome.as_str() }).inc();
        self.tool_call_duration.get_or_create(&ToolOnly { tool: tool.to_owned() }).observe(elapsed.as_secs_f64());
    }

    /// The in-flight gauge (incremented while a call runs).
    pub fn calls_in_flight(&self) -> &Gauge {
        &self.calls_in_flight
    }

    /// Counts authorization denials: `call` for a refused call, `list` per tool hidden from a listing.
    pub fn authz_denied(&self, action: &'static str, count: u64) {
        self.authz_denials.get_or_create(&ReasonLabels { reason: action }).inc_by(count);
    }

    /// Counts one admission rejection.
    pub fn admission_rejected(&self, why: Rejection) {
        self.admission_rejections.get_or_create(&ReasonLabels { reason: why.as_str() }).inc();
    }

    /// Sets the number of tools in the catalog.
    pub fn set_catalog_tools(&self, n: usize) {
        self.catalog_tools.set(i64::try_from(n).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_names_every_family_with_the_prefix() {
        let m = Metrics::new();
        m.http_request("/mcp", "POST", 200, Duration::from_millis(3));
        m.tool_call("price_option", CallOutcome::Success, Duration::from_millis(20));
        m.admission_rejected(Rejection::UserCalls);
        m.authz_denied("list", 2);
        m.mcp_request("tools/list", "ok");
        let text = m.encode();
        for needle in [
            "toolyard_gateway_http_requests_total{route=\"/mcp\",method=\"POST\",status=\"200\"} 1",
            "toolyard_gateway_tool_calls_total{tool=\"price_option\",outcome=\"success\"} 1",
            "toolyard_gateway_admission_rejections_total{reason=\"user_calls\"} 1",
            "toolyard_gateway_authz_denials_total{reason=\"list\"} 2",
            "toolyard_gateway_mcp_requests_total{method=\"tools/list\",outcome=\"ok\"} 1",
            "toolyard_gateway_tool_call_duration_seconds_count{tool=\"price_option\"} 1",
            "toolyard_gateway_tool_calls_in_flight 0",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
    }

    #[test]
    fn other_parts_can_register_into_the_same_registry() {
        let m = Metrics::new();
        let c: Counter = Counter::default();
        m.register(|r| r.register("extra", "an extra counter", c.clone()));
        c.inc();
        assert!(m.encode().contains("toolyard_gateway_extra_total 1"));
    }
}

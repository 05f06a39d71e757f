//! The test trace store: Jaeger v2 (started by tests/cluster/cluster.sh, traces in memory),
//! which the processes under test send OTLP to, and whose query API the tests read the span
//! tree from.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::TestEnv;

/// One span as the store returns it.
#[derive(Clone, Debug)]
pub struct Span {
    /// Hex span id.
    pub id: String,
    /// Hex id of the parent span, if any.
    pub parent: Option<String>,
    /// The span's name.
    pub name: String,
    /// `service.name` of the process that sent it.
    pub service: String,
    /// Attributes, as strings.
    pub tags: HashMap<String, String>,
}

/// The spans of one trace.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    /// Hex trace id.
    pub id: String,
    /// Its spans, in the store's order.
    pub spans: Vec<Span>,
}

impl Trace {
    /// The spans of `service` named `name`.
    pub fn named(&self, service: &str, name: &str) -> Vec<&Span> {
        self.spans.iter().filter(|s| s.service == service && s.name == name).collect()
    }

    /// The one span of `service` named `name`; panics with the tree when there is not exactly one.
    pub fn one(&self, service: &str, name: &str) -> &Span {
        let found = self.named(service, name);
        assert_eq!(found.len(), 1, "one {service} span {name:?} in\n{}", self.tree());
        found[0]
    }

    /// The parent of `span`; panics with the tree when it is not in this trace.
    pub fn parent(&self, span: &Span) -> &Span {
        let parent =
            span.parent.as_deref().unwrap_or_else(|| panic!("{} has no parent in\n{}", span.name, self.tree()));
        self.spans
            .iter()
            .find(|s| s.id == parent)
            .unwrap_or_else(|| panic!("the parent {parent} of {} is not in\n{}", span.name, self.tree()))
    }

    /// One line per span, indented under its parent (for failure messages).
    pub fn tree(&self) -> String {
        fn walk(trace: &Trace, parent: Option<&str>, depth: usize, out: &mut String) {
            for span in trace.spans.iter().filter(|s| s.parent.as_deref() == parent) {
                out.push_str(&format!("{}{} [{}] {}\n", "  ".repeat(depth), span.name, span.service, span.id));
                walk(trace, Some(&span.id), depth + 1, out);
            }
        }
        let ids: Vec<&str> = self.spans.iter().map(|s| s.id.as_str()).collect();
        let mut out = format!("trace {}\n", self.id);
        // Roots: no parent, or a parent outside the trace (the client's span).
        let mut roots: Vec<Option<&str>> =
            self.spans.iter().map(|s| s.parent.as_deref()).filter(|p| p.is_none_or(|p| !ids.contains(&p))).collect();
        roots.dedup();
        for root in roots {
            if let Some(id) = root {
                out.push_str(&format!("(outside the trace: {id})\n"));
            }
            walk(self, root, 1, &mut out);
        }
        out
    }
}

/// A client's span, as an MCP client sends it in `_meta.traceparent`: a fresh trace id and span id.
#[derive(Clone, Debug)]
pub struct ClientSpan {
    /// Hex trace id.
    pub trace_id: String,
    /// Hex span id.
    pub span_id: String,
    /// `00-<trace id>-<span id>-01` (sampled).
    pub traceparent: String,
}

impl ClientSpan {
    /// New random ids.
    pub fn new() -> Self {
        let trace_id = format!("{:032x}", random_u128());
        let span_id = format!("{:016x}", random_u128() as u64 | 1);
        let traceparent = format!("00-{trace_id}-{span_id}-01");
        Self { trace_id, span_id, traceparent }
    }
}

impl Default for ClientSpan {
    fn default() -> Self {
        Self::new()
    }
}

/// A random non-zero number from the OS.
pub fn random_u128() -> u128 {
    let mut bytes = [0u8; 16];
    let mut file = std::fs::File::open("/dev/urandom").expect("/dev/urandom");
    std::io::Read::read_exact(&mut file, &mut bytes).expect("random bytes");
    u128::from_le_bytes(bytes) | 1
}

/// The trace store's query API.
#[derive(Clone, Debug)]
pub struct TraceStore {
    query: String,
    /// Where processes send OTLP (HTTP): `http://<host>:<port>`, the value of
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub otlp_endpoint: String,
    http: reqwest::Client,
}

impl TraceStore {
    /// The store of the test cluster.
    pub fn get() -> Self {
        let env = TestEnv::get();
        Self {
            query: env.var("TOOLYARD_TEST_TRACES_URL").to_owned(),
            otlp_endpoint: env.var("TOOLYARD_TEST_OTLP_ENDPOINT").to_owned(),
            http: reqwest::Client::builder().timeout(Duration::from_secs(10)).build().expect("an HTTP client"),
        }
    }

    /// The port of [`Self::otlp_endpoint`].
    pub fn otlp_port(&self) -> u16 {
        self.otlp_endpoint.rsplit(':').next().and_then(|p| p.parse().ok()).expect("the OTLP endpoint has a port")
    }

    /// The trace `id` as stored now (empty when the store has none of its spans).
    pub async fn trace(&self, id: &str) -> Result<Trace> {
        let response = self.http.get(format!("{}/api/traces/{id}", self.query)).send().await?;
        if response.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(Trace { id: id.to_owned(), spans: Vec::new() });
        }
        let body: Value = response.error_for_status()?.json().await?;
        let data = body["data"].as_array().context("no data in the trace store's answer")?;
        Ok(data.first().map(parse_trace).transpose()?.unwrap_or_else(|| Trace { id: id.to_owned(), spans: Vec::new() }))
    }

    /// Waits until the trace `id` holds every `(service, span name)` of `expected`; returns it.
    pub async fn wait_for(&self, id: &str, expected: &[(&str, &str)], timeout: Duration) -> Result<Trace> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let trace = self.trace(id).await?;
            let missing: Vec<_> = expected.iter().filter(|(svc, name)| trace.named(svc, name).is_empty()).collect();
            if missing.is_empty() {
                return Ok(trace);
            }
            if tokio::time::Instant::now() >= deadline {
                bail!("after {timeout:?} the trace store lacks {missing:?}; it holds\n{}", trace.tree());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The ids of the traces of `service` with a span whose attribute `key` is `value`.
    pub async fn find(&self, service: &str, key: &str, value: &str) -> Result<Vec<String>> {
        let tags = serde_json::json!({ key: value }).to_string();
        let url = reqwest::Url::parse_with_params(
            &format!("{}/api/traces", self.query),
            [("service", service), ("tags", tags.as_str()), ("limit", "20"), ("lookback", "1h")],
        )?;
        let response = self.http.get(url).send().await?;
        let body: Value = response.error_for_status()?.json().await?;
        let data = body["data"].as_array().cloned().unwrap_or_default();
        Ok(data.iter().filter_map(|t| t["traceID"].as_str().map(str::to_owned)).collect())
    }
}

fn parse_trace(trace: &Value) -> Result<Trace> {
    let services: HashMap<&str, &str> = trace["processes"]
        .as_object()
        .context("no processes in the trace")?
        .iter()
        .filter_map(|(id, p)| Some((id.as_str(), p["serviceName"].as_str()?)))
        .collect();
    let spans = trace["spans"]
        .as_array()
        .context("no spans in the trace")?
        .iter()
        .map(|s| Span {
            id: s["spanID"].as_str().unwrap_or_default().to_owned(),
            parent: s["references"]
                .as_array()
                .and_then(|r| r.iter().find(|r| r["refType"] == "CHILD_OF"))
                .and_then(|r| r["spanID"].as_str())
                .map(str::to_owned),
            name: s["operationName"].as_str().unwrap_or_default().to_owned(),
            service: s["processID"].as_str().and_then(|p| services.get(p)).copied().unwrap_or_default().to_owned(),
            tags: s["tags"]
                .as_array()
                .map(|tags| {
                    tags.iter()
                        .filter_map(|t| {
                            let value = match &t["value"] {
                                Value::String(s) => s.clone(),
                                other => other.to_string(),
                            };
                            Some((t["key"].as_str()?.to_owned(), value))
                        })
                        .collect()
                })
                .unwrap_or_default(),
        })
        .collect();
    Ok(Trace { id: trace["traceID"].as_str().unwrap_or_default().to_owned(), spans })
}

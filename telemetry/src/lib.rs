//! Logs and traces for every Toolyard process (gateway, controller, runner): one set-up, and the
//! W3C trace context in and out.
//!
//! - **Logs** go to standard error, plain or one JSON object per line. JSON lines carry the
//!   `trace_id` and `span_id` of the span they were written in, when tracing is on.
//! - **Traces** are exported over OTLP (HTTP/protobuf) when the standard variables name a
//!   collector: `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, with
//!   `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_EXPORTER_OTLP_TIMEOUT`, `OTEL_TRACES_SAMPLER`,
//!   `OTEL_RESOURCE_ATTRIBUTES` and the batch processor's `OTEL_BSP_*`. `OTEL_SDK_DISABLED=true`
//!   or `OTEL_TRACES_EXPORTER=none` turn export off.
//! - **Exporting never blocks a call:** a finished span is queued (at most `OTEL_BSP_MAX_QUEUE_SIZE`,
//!   default 2048; more are dropped) and sent in batches from the processor's own thread. A
//!   collector that is down, slow or refusing costs dropped spans only. At exit a process waits
//!   at most [`FLUSH_LIMIT`] for its last spans.
//! - Only Toolyard's own spans are exported (not those of the libraries underneath).

use std::collections::HashMap;
use std::io::IsTerminal;
use std::time::Duration;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// The longest a process waits at exit for its last spans to be sent.
pub const FLUSH_LIMIT: Duration = Duration::from_secs(2);

/// The targets whose spans are exported: Toolyard's crates.
const EXPORTED_TARGETS: [&str; 4] =
    ["toolyard_gateway", "toolyard_controller", "toolyard_runner", "toolyard_telemetry"];

/// Log line format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Plain,
    /// One JSON object per line (for log collectors), with `trace_id` and `span_id`.
    Json,
}

/// What a process sets up.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// `service.name` of its spans (`toolyard-gateway`, ...).
    pub service: &'static str,
    /// Log line format.
    pub format: LogFormat,
    /// The variable holding the log filter (`RUST_LOG` syntax).
    pub filter_var: &'static str,
    /// The filter when that variable is unset or invalid.
    pub default_filter: &'static str,
}

/// The installed telemetry: flushes the last spans when dropped (at most [`FLUSH_LIMIT`]).
#[derive(Debug)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// True when spans are exported.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Sends the spans still queued, waiting at most [`FLUSH_LIMIT`], and stops exporting.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(e) = provider.shutdown_with_timeout(FLUSH_LIMIT)
        {
            tracing::warn!(error = %e, "the last spans were not all exported");
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Installs the global subscriber: the log layer and, when a collector is configured, the
/// OpenTelemetry layer. A second call keeps the first subscriber (tests may race) and exports
/// nothing. A configuration the exporter cannot use is logged as an error and export stays
/// off: telemetry never stops a process from serving.
pub fn init(settings: Settings) -> Telemetry {
    let filter =
        EnvFilter::try_from_env(settings.filter_var).unwrap_or_else(|_| EnvFilter::new(settings.default_filter));
    let (provider, problem) = match exporter_config() {
        Ok(Some(())) => match build_provider(settings.service) {
            Ok(provider) => (Some(provider), None),
            Err(e) => (None, Some(e)),
        },
        Ok(None) => (None, None),
        Err(e) => (None, Some(e)),
    };
    let otel = provider.as_ref().map(|provider| {
        let targets = EXPORTED_TARGETS.iter().fold(Targets::new(), |t, name| t.with_target(*name, LevelFilter::INFO));
        // No code location, thread or busy/idle attributes on every span: they cost more than
        // they tell at the rate of tool calls.
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer(settings.service))
            .with_location(false)
            .with_threads(false)
            .with_tracked_inactivity(false)
            .with_filter(targets)
    });
    let ansi = std::io::stderr().is_terminal();
    let logs = match settings.format {
        LogFormat::Plain => {
            tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(ansi).with_filter(filter).boxed()
        }
        LogFormat::Json => json_layer().with_filter(filter).boxed(),
    };
    let installed = tracing_subscriber::registry().with(otel).with(logs).try_init().is_ok();
    if let Some(problem) = problem {
        tracing::error!("traces are not exported: {problem}");
    }
    match (installed, provider) {
        (true, Some(provider)) => {
            tracing::info!(service = settings.service, "exporting traces over OTLP");
            Telemetry { provider: Some(provider) }
        }
        (_, provider) => {
            if let Some(provider) = provider {
                let _ = provider.shutdown_with_timeout(Duration::ZERO);
            }
            Telemetry { provider: None }
        }
    }
}

/// JSON lines like `tracing_subscriber`'s (event fields flattened, the current span's fields
/// under `span`), plus the OpenTelemetry `trace_id` and `span_id` of the current span.
fn json_layer<S>() -> impl Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let mut layer = json_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .flatten_event(true)
        .with_current_span(true)
        .with_span_list(false);
    layer.inner_layer_mut().add_multiple_dynamic_fields(|_event, context, writer| {
        let Some(span) = context.lookup_current() else { return };
        let otel =
            tracing::dispatcher::get_default(|dispatch| tracing_opentelemetry::get_otel_context(&span.id(), dispatch));
        let Some(otel) = otel else { return };
        let otel_span = otel.span();
        let ids = otel_span.span_context();
        if ids.is_valid() {
            let _ = writer.write_field("trace_id", ids.trace_id().to_string());
            let _ = writer.write_field("span_id", ids.span_id().to_string());
        }
    });
    layer
}

/// Why the OTLP exporter cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A variable asks for something this exporter does not do.
    #[error("{var}={value:?} is not supported: {hint}")]
    Unsupported {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What to use instead.
        hint: &'static str,
    },
    /// The exporter refused its configuration (an invalid endpoint, header or timeout).
    #[error("the OTLP exporter cannot be built: {0}")]
    Exporter(String),
}

/// `Ok(Some(()))` when the standard variables ask for OTLP export, `Ok(None)` when they do not.
fn exporter_config() -> Result<Option<()>, ConfigError> {
    exporter_config_from(|name| std::env::var(name).ok().filter(|v| !v.trim().is_empty()))
}

fn exporter_config_from(var: impl Fn(&str) -> Option<String>) -> Result<Option<()>, ConfigError> {
    if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return Ok(None);
    }
    match var("OTEL_TRACES_EXPORTER").map(|v| v.trim().to_ascii_lowercase()) {
        Some(v) if v == "none" => return Ok(None),
        Some(v) if v != "otlp" => {
            return Err(ConfigError::Unsupported { var: "OTEL_TRACES_EXPORTER", value: v, hint: "use otlp (or none)" });
        }
        _ => {}
    }
    if var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_none() && var("OTEL_EXPORTER_OTLP_ENDPOINT").is_none() {
        return Ok(None);
    }
    for name in ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"] {
        if let Some(value) = var(name) {
            if value.trim() != "http/protobuf" {
                return Err(ConfigError::Unsupported {
                    var: if name.contains("TRACES") {
                        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
                    } else {
                        "OTEL_EXPORTER_OTLP_PROTOCOL"
                    },
                    value,
                    hint: "Toolyard sends OTLP over HTTP: use http/protobuf and the collector's HTTP port (4318)",
                });
            }
            break;
        }
    }
    Ok(Some(()))
}

fn build_provider(service: &'static str) -> Result<SdkTracerProvider, ConfigError> {
    use opentelemetry_otlp::WithExportConfig as _;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .build()
        .map_err(|e| ConfigError::Exporter(e.to_string()))?;
    let resource = opentelemetry_sdk::Resource::builder().with_service_name(service).build();
    Ok(SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build())
}

/// Makes the W3C `traceparent` the parent of `span`; returns false (and leaves `span` a root,
/// which starts a new trace) when there is none, it is invalid, or tracing is off.
pub fn set_parent(span: &tracing::Span, traceparent: Option<&str>) -> bool {
    let Some(traceparent) = traceparent else { return false };
    let carrier = HashMap::from([("traceparent".to_owned(), traceparent.trim().to_owned())]);
    let context = TraceContextPropagator::new().extract(&carrier);
    if !context.span().span_context().is_valid() {
        return false;
    }
    span.set_parent(context).is_ok()
}

/// The W3C `traceparent` naming `span`, for the next process on the path; `None` when tracing
/// is off (the span has no OpenTelemetry context).
pub fn traceparent(span: &tracing::Span) -> Option<String> {
    let context = span.context();
    if !context.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&context, &mut carrier);
    carrier.remove("traceparent")
}

/// What to pass on from `span`: its own `traceparent` when tracing is on, else the one that
/// came in (so the trace id still reaches the next process).
pub fn pass_on(span: &tracing::Span, incoming: Option<String>) -> Option<String> {
    traceparent(span).or(incoming)
}

/// Marks `span` failed: `otel.status_code` ERROR and `error.type` (fields the span declares).
pub fn record_error(span: &tracing::Span, kind: &str) {
    span.record("otel.status_code", "ERROR").record("error.type", kind);
}

/// Continues the trace of `incoming` in `span` ([`set_parent`]) and returns what to pass on
/// from it ([`pass_on`]).
pub fn continue_trace(span: &tracing::Span, incoming: Option<String>) -> Option<String> {
    set_parent(span, incoming.as_deref());
    pass_on(span, incoming)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn export_is_on_only_when_a_collector_is_named() {
        assert!(exporter_config_from(vars(&[])).expect("valid").is_none());
        let on = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")];
        assert!(exporter_config_from(vars(&on)).expect("valid").is_some());
        let traces_only = [("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:4318/v1/traces")];
        assert!(exporter_config_from(vars(&traces_only)).expect("valid").is_some());
        let disabled = [on[0], ("OTEL_SDK_DISABLED", "true")];
        assert!(exporter_config_from(vars(&disabled)).expect("valid").is_none());
        let none = [on[0], ("OTEL_TRACES_EXPORTER", "none")];
        assert!(exporter_config_from(vars(&none)).expect("valid").is_none());
    }

    #[test]
    fn unsupported_settings_say_what_to_use() {
        let grpc = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")];
        let message = exporter_config_from(vars(&grpc)).expect_err("grpc is refused").to_string();
        assert!(message.contains("OTEL_EXPORTER_OTLP_PROTOCOL=\"grpc\"") && message.contains("4318"), "{message}");
        // The signal's own variable wins over the general one.
        let traces_http = [grpc[0], grpc[1], ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")];
        assert!(exporter_config_from(vars(&traces_http)).expect("valid").is_some());
        let zipkin = [grpc[0], ("OTEL_TRACES_EXPORTER", "zipkin")];
        assert!(exporter_config_from(vars(&zipkin)).expect_err("refused").to_string().contains("use otlp"));
    }

    #[test]
    fn without_tracing_nothing_is_made_up() {
        let span = tracing::info_span!("t");
        assert!(!set_parent(&span, Some("not-a-traceparent")));
        assert_eq!(traceparent(&span), None);
        let incoming = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned();
        assert_eq!(pass_on(&span, Some(incoming.clone())), Some(incoming));
    }
}

//! Log and trace setup shared by the gateway's commands (see [`toolyard_telemetry`]): the
//! `RUST_LOG` filter (default `info`, with rmcp's per-request lines off), plain or JSON lines on
//! standard error, and OTLP traces when the standard `OTEL_*` variables name a collector.

pub use toolyard_telemetry::{LogFormat, Telemetry};

/// The log filter when `RUST_LOG` is unset: rmcp writes three INFO lines per MCP request
/// ("Service initialized as server", "serve finished", ...), which say nothing an operator needs.
pub const DEFAULT_FILTER: &str = "info,rmcp=warn";

/// Installs the global subscriber; keep the returned value until the gateway stops (it sends
/// the last spans). Calling it twice keeps the first (tests may race).
pub fn init(format: LogFormat) -> Telemetry {
    toolyard_telemetry::init(toolyard_telemetry::Settings {
        service: "toolyard-gateway",
        format,
        filter_var: "RUST_LOG",
        default_filter: DEFAULT_FILTER,
    })
}

//! Images the test node holds, by the names pods use: built by `tests/cluster/images.sh`
//! from the Dockerfile (tagged with the chart's appVersion, as the chart and the examples
//! name them) and from the test fixtures.

/// The runner image (busybox-like: the runner and `cp`, no libc).
pub const RUNNER: &str = "ghcr.io/toolyard/runner:0.1.0";
/// The coding agent's image.
pub const AGENT: &str = "ghcr.io/toolyard/agent:0.1.0";
/// The gateway's image.
pub const GATEWAY: &str = "ghcr.io/toolyard/gateway:0.1.0";
/// The controller's image.
pub const CONTROLLER: &str = "ghcr.io/toolyard/controller:0.1.0";
/// The pricing example's tool image (Debian with Python).
pub const PRICING: &str = "ghcr.io/toolyard/pricing:0.1.0";
/// The development S3 server.
pub const DEV_S3: &str = "ghcr.io/toolyard/dev-s3:0.1.0";
/// The misbehaving fixtures' tool image (the pricing image plus `misbehaving.py`).
pub const MISBEHAVING: &str = "ghcr.io/toolyard/test-misbehaving:0.1.0";
/// A distroless-like tool image: glibc as a library, no shell; holds `/usr/local/bin/echo-tool`.
pub const ECHO_DISTROLESS: &str = "toolyard.local/test-echo-distroless:0.1.0";
/// A busybox tool image without any libc; holds `/bin/echo-tool` (a shell script) and `sh`.
pub const ECHO_BUSYBOX: &str = "toolyard.local/test-echo-busybox:0.1.0";
/// An MCP server image: Debian's Python with the official MCP Python SDK in `/app/site`
/// (`PYTHONPATH`) and `/app/upstream_server.py`, the upstream fixture server.
pub const MCP_PYTHON: &str = "toolyard.local/test-mcp-python:0.1.0";
/// The node_pool bench's comparison server: the official Python SDK serving the pricing
/// example's `price_option` (`tests/benches/python/pricing_server.py`) on the pricing image.
pub const BENCH_SDK_PRICING: &str = "toolyard.local/bench-sdk-pricing:0.1.0";

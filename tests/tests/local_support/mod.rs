//! The embedded local mode in the test process: `toolyard_gateway::local::start` on loopback
//! with the real runner binary and Python, for tests that drive it from outside.

// Each test file uses a part of this module.
#![allow(dead_code)]

use std::path::PathBuf;

use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientLifecycleMode, ClientServiceExt, RoleClient};
use toolyard_gateway::local::{LocalArgs, LocalGateway};
use toolyard_gateway::logging::LogFormat;
use toolyard_gateway::serve::DataArgs;
use toolyard_tests::local::{self, TempDir};
use toolyard_tests::repo_path;

/// Starts the local mode on the manifests of `dir` (relative to the repository), with its
/// files in `data`, the fixed `token` for user `local`, at most `max_calls` Job-mode calls at
/// once; returns once its warm workers have started.
pub async fn start(dir: &str, data: &TempDir, token: &str, max_calls: usize) -> Running {
    start_with(dir, data, token, max_calls, DataArgs::default()).await
}

/// [`start`] with these storage quota and retention settings.
pub async fn start_with(dir: &str, data: &TempDir, token: &str, max_calls: usize, lifecycle: DataArgs) -> Running {
    start_args(args(repo_path(dir), data, token, max_calls, lifecycle)).await
}

/// The local mode's flags for the manifests of `dir`, as [`start_with`] sets them.
pub fn args(dir: PathBuf, data: &TempDir, token: &str, max_calls: usize, lifecycle: DataArgs) -> LocalArgs {
    LocalArgs {
        dir,
        listen: "127.0.0.1:0".into(),
        token: Some(token.into()),
        token_file: None,
        user: "local".into(),
        anonymous: false,
        data_dir: data.path().to_owned(),
        policy: None,
        runner: Some(local::binary("toolyard-runner")),
        python: Some(PathBuf::from(local::python())),
        max_calls,
        kill_grace: 0.5,
        allowed_hosts: Vec::new(),
        allowed_origins: Vec::new(),
        metrics_listen: Some("127.0.0.1:0".into()),
        body_read_timeout_seconds: 30,
        log_format: LogFormat::Plain,
        models: toolyard_gateway::model::ModelArgs::default(),
        data: lifecycle,
        upstream: toolyard_gateway::upstream::UpstreamArgs::default(),
    }
}

/// Starts the local mode with `args`; returns once its warm workers have started.
pub async fn start_args(args: LocalArgs) -> Running {
    let gateway = toolyard_gateway::local::start(args).await.expect("the local gateway starts");
    gateway.pools.wait_started().await.expect("warm workers start");
    Running(Some(gateway))
}

/// A started local mode. Dropping it shuts it down gracefully first (a call's files and its
/// `call_finished` event are written just after the answer, and shutting down waits for
/// them), so nothing is written into its data folder after a test removes that folder. Tests
/// holding one run on a multi-threaded runtime.
pub struct Running(Option<LocalGateway>);

impl std::ops::Deref for Running {
    type Target = LocalGateway;

    fn deref(&self) -> &LocalGateway {
        self.0.as_ref().expect("running until shut down")
    }
}

impl Running {
    /// Shuts it down and says whether it stopped cleanly.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        self.0.take().expect("running until shut down").shutdown().await
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let Some(gateway) = self.0.take() else { return };
        let stopped = tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(gateway.shutdown()));
        if let Err(e) = stopped
            && !std::thread::panicking()
        {
            panic!("the local mode did not shut down cleanly: {e:#}");
        }
    }
}

/// An rmcp client with `handler` at MCP URL `url`, sending `token`, after the `initialize`
/// handshake (protocol 2025-11-25).
pub async fn legacy_client<H: rmcp::ClientHandler>(
    url: String,
    token: &str,
    handler: H,
) -> RunningService<RoleClient, H> {
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url).auth_header(token.to_owned()),
    );
    handler.serve_with_lifecycle(transport, ClientLifecycleMode::Initialize).await.expect("MCP client connects")
}

//! `toolyard-controller`: parses the configuration, sets up logging and runs the controller
//! until SIGTERM or Ctrl-C.

use anyhow::{Context, Result};
use clap::Parser;
use toolyard_controller::{CancellationToken, Config};

#[tokio::main]
async fn main() -> Result<()> {
    let config = Config::parse();
    let telemetry = toolyard_telemetry::init(toolyard_telemetry::Settings {
        service: "toolyard-controller",
        format: if config.log_json {
            toolyard_telemetry::LogFormat::Json
        } else {
            toolyard_telemetry::LogFormat::Plain
        },
        filter_var: "RUST_LOG",
        default_filter: "info,kube_runtime=warn",
    });

    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));
    let kube = kube::Config::infer().await.context("finding the Kubernetes API's address and credentials")?;
    let stopped = toolyard_controller::run(config, kube, shutdown).await;
    telemetry.shutdown();
    stopped
}

async fn stop_on_signal(shutdown: CancellationToken) {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGTERM");
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("shutdown requested");
    shutdown.cancel();
}

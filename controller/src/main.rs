//! `toolyard-controller`: parses the configuration, sets up logging and runs the controller
//! until SIGTERM or Ctrl-C.

use anyhow::{Context, Result};
use clap::Parser;
use toolyard_controller::{CancellationToken, Config};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> Result<()> {
    let config = Config::parse();
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,kube_runtime=warn"));
    // Colours only on a terminal: a pod's log or a file gets no escape codes.
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()));
    if config.log_json {
        subscriber.json().init();
    } else {
        subscriber.init();
    }

    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));
    let client = kube::Client::try_default().await.context("connecting to the Kubernetes API")?;
    toolyard_controller::run(config, client, shutdown).await
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

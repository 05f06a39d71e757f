//! Toolyard's Kubernetes controller.
//!
//! - **McpTool**: validates what the CRD schema cannot ([`mcptool::validate`]), sets `Ready`
//!   with observedGeneration; `mode: Pool` tools get a warm pool ([`mcptool::pool`]).
//! - **McpServer**: a server Toolyard runs (`spec.runtime`) gets a Deployment and Service
//!   hardened like tools' ([`mcpserver`]), stdio servers behind `toolyard-runner bridge`;
//!   `Ready` follows its available pods.
//! - **ToolCall**: one hardened Job per call ([`toolcall::job::desired_job`]) with a
//!   call-scoped token in a Secret it owns; the Job's and pod's state become the `Succeeded`
//!   condition ([`outcome`]).
//! - **CodingTask**: the same shape with the agent ([`codingtask::job::desired_job`]).
//! - Finished ToolCalls are deleted after a retention; CodingTasks are kept unless one is set.
//! - Leader election with a Lease ([`leader`]), Events on transitions, Prometheus metrics.
//!
//! Status ownership: the controller writes `conditions`, `jobName`, `startTime`,
//! `completionTime` (and all of McpTool's status, and McpServer's `conditions` and
//! `availableReplicas`) with field manager `toolyard-controller`
//! through server-side apply on `/status`; the gateway writes the result fields.
//!
//! Embed with [`run()`] (or [`Controller`] to learn the ops address first); the binary only parses
//! its configuration and calls it.

pub mod client;
pub mod codingtask;
pub mod config;
pub mod context;
pub mod controllers;
pub mod error;
pub mod labels;
pub mod leader;
pub mod mcpserver;
pub mod mcptool;
pub mod metrics;
pub mod ops;
pub mod outcome;
pub mod pod;
pub mod pod_index;
pub mod run;
pub mod toolcall;
pub mod workload;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context as _, Result};
use kube::runtime::events::{Recorder, Reporter};
use tokio::net::TcpListener;
use toolyard_api::token::SigningKey;
use tracing::info;

pub use config::Config;
pub use metrics::Metrics;
/// Stops [`run()`] / [`Controller::run`] gracefully when cancelled.
pub use tokio_util::sync::CancellationToken;

/// A controller process, bound and ready to run.
pub struct Controller {
    shared: Arc<context::Shared>,
    listener: TcpListener,
    identity: String,
}

impl Controller {
    /// Loads the signing key, binds the ops listener and connects with `kube` (every
    /// request counted in the metrics).
    pub async fn new(config: Config, kube: kube::Config) -> Result<Self> {
        let key = load_key(&config.token_key_file)?;
        let listener = TcpListener::bind(config.metrics_addr)
            .await
            .with_context(|| format!("binding the metrics address {}", config.metrics_addr))?;
        let identity = config.identity();
        let reporter =
            Reporter { controller: toolyard_api::CONTROLLER_MANAGER.to_owned(), instance: Some(identity.clone()) };
        let metrics = Arc::new(Metrics::new());
        let client = kube::client::ClientBuilder::try_from(kube)
            .context("building the Kubernetes client")?
            .with_layer(&client::CountRequests { requests: metrics.api_requests.clone() })
            .build();
        let recorder = Recorder::new(client.clone(), reporter);
        let shared = Arc::new(context::Shared::new(client, config, key, recorder, metrics));
        Ok(Self { shared, listener, identity })
    }

    /// Address of `/metrics`, `/healthz` and `/readyz`.
    pub fn ops_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("bound listener has an address")
    }

    /// This replica's identity (Lease holder, Events' reporting instance).
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The process's metrics.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.shared.metrics.clone()
    }

    /// Reconciles until `shutdown` is cancelled (only while leading, with leader election).
    pub async fn run(self, shutdown: CancellationToken) -> Result<()> {
        let ready = Arc::new(AtomicBool::new(false));
        let ops_stop = CancellationToken::new();
        let ops = ops::Ops { metrics: self.shared.metrics.clone(), ready: ready.clone() };
        let server = tokio::spawn(ops::serve(self.listener, ops, ops_stop.clone()));
        let scopes = self.shared.config.scopes();
        info!(identity = %self.identity, scopes = ?scopes, "toolyard-controller starting");
        let result = if self.shared.config.leader.enabled {
            leader::run(self.shared.clone(), scopes, self.identity.clone(), shutdown, ready).await
        } else {
            self.shared.metrics.leader.set(1);
            controllers::run(self.shared.clone(), scopes, shutdown, ready.clone()).await;
            ready.store(false, Ordering::Release);
            Ok(())
        };
        ops_stop.cancel();
        server.await.context("ops server task")?.context("ops server")?;
        info!("toolyard-controller stopped");
        result
    }
}

/// Runs a controller with `config`, connected with `kube`, until `shutdown` is cancelled.
pub async fn run(config: Config, kube: kube::Config, shutdown: CancellationToken) -> Result<()> {
    Controller::new(config, kube).await?.run(shutdown).await
}

/// Reads the shared signing key. The error names the file, never its contents.
fn load_key(path: &std::path::Path) -> Result<SigningKey> {
    let bytes = std::fs::read(path).with_context(|| format!("reading the token key file {}", path.display()))?;
    SigningKey::new(bytes).with_context(|| format!("the token key file {} holds no usable key", path.display()))
}

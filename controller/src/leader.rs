//! Leader election with a `coordination.k8s.io` Lease (kube-lease-manager): only the holder
//! runs the controllers. Losing the Lease stops them (in-flight reconciles finish) and the
//! replica goes back to waiting; shutdown releases the Lease so a standby takes over at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context as _, Result, bail};
use kube_lease_manager::LeaseManagerBuilder;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::Scope;
use crate::context::Shared;
use crate::controllers;

/// Runs the controllers whenever this replica holds the Lease, until `shutdown`.
pub async fn run(
    shared: Arc<Shared>,
    scopes: Vec<Scope>,
    identity: String,
    shutdown: CancellationToken,
    ready: Arc<AtomicBool>,
) -> Result<()> {
    let cfg = shared.config.leader.clone();
    if cfg.duration_seconds == 0 || cfg.grace_seconds == 0 || cfg.grace_seconds >= cfg.duration_seconds {
        bail!(
            "lease grace ({}s) must be above zero and below the lease duration ({}s)",
            cfg.grace_seconds,
            cfg.duration_seconds
        );
    }
    let namespace = cfg.namespace();
    let manager = LeaseManagerBuilder::new(shared.client.clone(), &cfg.lease_name)
        .with_namespace(&namespace)
        .with_identity(&identity)
        .with_duration(cfg.duration_seconds)
        .with_grace(cfg.grace_seconds)
        .build()
        .await
        .with_context(|| format!("preparing the leader Lease {namespace}/{}", cfg.lease_name))?;
    info!(lease = %cfg.lease_name, namespace = %namespace, identity = %identity, "waiting for leadership");
    let (mut leading, lease_task) = manager.watch().await;

    loop {
        // A standby replica is healthy and ready: it serves as soon as it leads.
        ready.store(true, Ordering::Release);
        while !*leading.borrow_and_update() {
            tokio::select! {
                () = shutdown.cancelled() => {
                    drop(leading);
                    let _ = lease_task.await;
                    return Ok(());
                }
                changed = leading.changed() => {
                    if changed.is_err() {
                        bail!("the leader election task stopped: {:?}", lease_task.await);
                    }
                }
            }
        }

        info!(identity = %identity, "leading: starting controllers");
        shared.metrics.leader.set(1);
        ready.store(false, Ordering::Release);
        let term = shutdown.child_token();
        let running = tokio::spawn(controllers::run(shared.clone(), scopes.clone(), term.clone(), ready.clone()));
        let lost = loop {
            tokio::select! {
                () = shutdown.cancelled() => break false,
                changed = leading.changed() => {
                    if changed.is_err() || !*leading.borrow_and_update() {
                        break true;
                    }
                }
            }
        };
        term.cancel();
        if let Err(e) = running.await {
            warn!(error = %e, "controllers ended abnormally");
        }
        shared.metrics.leader.set(0);
        if !lost {
            info!("shutting down: releasing the Lease");
            drop(leading);
            let _ = lease_task.await;
            return Ok(());
        }
        warn!(identity = %identity, "lost leadership: controllers stopped");
    }
}

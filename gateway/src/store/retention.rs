//! Retention: every owner's files are deleted a number of days after they were written.
//!
//! At start the gateway asks the store to do it itself ([`ArtifactStore::expire_after`]: an
//! S3 lifecycle rule on `owners/`, kept next to the bucket's other rules). Where the store
//! cannot (an S3-compatible server without lifecycle rules, credentials that may not set
//! them, the local folder), the gateway deletes expired files itself every
//! [`SWEEP_INTERVAL`] ([`ArtifactStore::expire`]); with several replicas each does, and
//! deleting what another already deleted is harmless.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::ArtifactStore;

/// How often the gateway deletes expired files when the store does not.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(3600);

/// Starts retention of `days` (0: keep everything) on `store` until `shutdown`.
pub async fn start(store: Arc<dyn ArtifactStore>, days: u32, shutdown: CancellationToken) {
    if days == 0 {
        tracing::info!("stored calls and tasks are kept until their owners delete them (no retention)");
        return;
    }
    match store.expire_after(days).await {
        Ok(true) => {
            tracing::info!(days, "the store deletes calls and tasks this many days after they were written");
            return;
        }
        Ok(false) => {}
        Err(e) => tracing::warn!(error = %e, "could not set the store's retention rule"),
    }
    tracing::info!(days, every = ?SWEEP_INTERVAL, "the gateway deletes calls and tasks this many days after they were written");
    tokio::spawn(async move {
        let mut sweep = tokio::time::interval(SWEEP_INTERVAL);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = sweep.tick() => {}
            }
            let before = jiff::Timestamp::now() - Duration::from_secs(u64::from(days) * 86_400);
            match store.expire(before).await {
                Ok(0) => {}
                Ok(files) => tracing::info!(files, "expired files deleted"),
                Err(e) => tracing::warn!(error = %e, "deleting expired files failed; trying again later"),
            }
        }
    });
}

//! Per-owner storage quota: a call, a coding task or a session's resource subscription is
//! refused while its owner's stored files (`calls/`, `tasks/`, `asks/` and `sessions/` under the
//! owner's prefix) reach the quota, with a message that says how much is used and how to free
//! it. Each file counts at least [`MIN_FILE_BYTES`], so that many small (or empty) files, a
//! session's subscriptions say, cannot pile up unbounded.
//!
//! The usage is measured by listing the owner's files in the store, so every replica sees the
//! same figure. Listing costs as much as the owner has stored (a request per 1,000 objects on
//! S3), so it stays off the call path: a check uses the last figure, and one older than
//! [`USAGE_TTL`] starts a measurement in the background that the checks after it will use.
//! While an owner is below half the quota, a figure stays in use one TTL per
//! [`OBJECTS_PER_TTL`] files they have (at least one, at most [`MAX_TTL_SCALE`] TTLs), so that a long history
//! is not listed again every 30 s: far from the quota, a later figure cannot let them pass it
//! by much.
//! Only an owner's first check (or the first after they deleted something through this
//! replica) waits for a measurement, and concurrent checks share one. One call or task
//! admitted just below the quota may still store its own files (each is capped on its own:
//! result, logs, artifacts).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use toolyard_api::OwnerKey;

use crate::store::ArtifactStore;

/// How long a measured usage is used before it is measured again.
pub const USAGE_TTL: Duration = Duration::from_secs(30);

/// Files per TTL a figure stays in use while its owner is below half the quota.
pub const OBJECTS_PER_TTL: usize = 10_000;

/// The most TTLs a figure stays in use (an hour at the default TTL).
pub const MAX_TTL_SCALE: u32 = 120;

/// How long a figure of `bytes` in `objects` files stays in use: `ttl`, and while that is
/// below half of `limit`, one `ttl` per [`OBJECTS_PER_TTL`] files (at least one), up to
/// [`MAX_TTL_SCALE`] of them.
fn validity(ttl: Duration, limit: u64, bytes: u64, objects: usize) -> Duration {
    if bytes >= limit / 2 {
        return ttl;
    }
    let scale = u32::try_from(objects / OBJECTS_PER_TTL).unwrap_or(u32::MAX).clamp(1, MAX_TTL_SCALE);
    ttl.saturating_mul(scale)
}

/// The top-level folders of an owner's files.
const FOLDERS: [&str; 4] = ["calls/", "tasks/", "asks/", "sessions/"];

/// The least a file counts for: a file system's block (an S3 server keeps each object's
/// metadata too).
pub const MIN_FILE_BYTES: u64 = 4096;

/// A measurement in flight, shared by whoever waits for it.
type Measuring = Shared<BoxFuture<'static, Result<u64, String>>>;

/// What is known of one owner's usage.
#[derive(Default)]
struct Usage {
    /// The last figure, when it was measured, and how long it stays in use ([`validity`]).
    measured: Option<(u64, Instant, Duration)>,
    /// The measurement running now, if any.
    measuring: Option<Measuring>,
    /// Bumped by a deletion: a measurement started before it records nothing.
    epoch: u64,
}

type Usages = Arc<Mutex<HashMap<String, Usage>>>;

/// Per-owner storage quota over one store.
pub struct StorageQuota {
    store: Arc<dyn ArtifactStore>,
    limit: u64,
    ttl: Duration,
    usages: Usages,
}

impl std::fmt::Debug for StorageQuota {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StorageQuota").field("limit", &self.limit).finish_non_exhaustive()
    }
}

impl StorageQuota {
    /// A quota of `limit` bytes per owner on `store`; 0: no quota.
    pub fn new(store: Arc<dyn ArtifactStore>, limit: u64) -> Self {
        Self { store, limit, ttl: USAGE_TTL, usages: Arc::default() }
    }

    /// The same quota with figures kept for `ttl` instead of [`USAGE_TTL`].
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// `Ok(Some(message))` when `owner` has reached the quota (the message says what to do),
    /// `Ok(None)` when they may store more.
    pub async fn check(&self, owner: &OwnerKey) -> crate::Result<Option<String>> {
        if self.limit == 0 {
            return Ok(None);
        }
        let used = self.usage(owner).await?;
        if used < self.limit {
            return Ok(None);
        }
        Ok(Some(format!(
            "storage quota reached: your stored calls and tasks take {} of your {}; delete the ones you no \
             longer need (delete_call, delete_task) or ask the operator for a larger quota",
            human_bytes(used),
            human_bytes(self.limit)
        )))
    }

    /// Forgets the measured usage of `owner` (after a deletion), so the next check measures.
    pub fn forget(&self, owner: &OwnerKey) {
        if let Some(usage) = lock(&self.usages).get_mut(owner.as_str()) {
            *usage = Usage { epoch: usage.epoch + 1, ..Usage::default() };
        }
    }

    /// The owner's usage: the last figure (measuring again in the background once it is older
    /// than the TTL), or, with none yet, the figure of a measurement shared with concurrent
    /// checks.
    async fn usage(&self, owner: &OwnerKey) -> crate::Result<u64> {
        let measuring = {
            let mut usages = lock(&self.usages);
            let usage = usages.entry(owner.as_str().to_owned()).or_default();
            match usage.measured {
                Some((bytes, at, valid)) if at.elapsed() < valid => return Ok(bytes),
                Some((bytes, _, _)) => {
                    if usage.measuring.is_none() {
                        let measuring = self.measure(owner, usage.epoch);
                        usage.measuring = Some(measuring.clone());
                        tokio::spawn(measuring);
                    }
                    return Ok(bytes);
                }
                None => {
                    let epoch = usage.epoch;
                    usage.measuring.get_or_insert_with(|| self.measure(owner, epoch)).clone()
                }
            }
        };
        measuring.await.map_err(crate::Error::Unavailable)
    }

    /// A measurement of `owner`'s usage that records its figure when it ends, unless the owner
    /// deleted something since `epoch`.
    fn measure(&self, owner: &OwnerKey, epoch: u64) -> Measuring {
        let (store, usages, owner) = (Arc::clone(&self.store), Arc::clone(&self.usages), owner.clone());
        let (ttl, limit) = (self.ttl, self.limit);
        async move {
            let total: crate::Result<(u64, usize)> = async {
                let (mut sum, mut objects) = (0u64, 0usize);
                for folder in FOLDERS {
                    let listed = store.list(&owner, folder).await?;
                    objects += listed.len();
                    sum = listed.iter().fold(sum, |sum, o| sum.saturating_add(o.size.max(MIN_FILE_BYTES)));
                }
                Ok((sum, objects))
            }
            .await;
            let mut usages = lock(&usages);
            let usage = usages.entry(owner.as_str().to_owned()).or_default();
            let current = usage.epoch == epoch;
            if current {
                usage.measuring = None;
            }
            match total {
                Ok((bytes, objects)) => {
                    if current {
                        usage.measured = Some((bytes, Instant::now(), validity(ttl, limit, bytes, objects)));
                    }
                    Ok(bytes)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "measuring an owner's storage failed");
                    Err(e.public_message())
                }
            }
        }
        .boxed()
        .shared()
    }
}

fn lock(usages: &Usages) -> std::sync::MutexGuard<'_, HashMap<String, Usage>> {
    usages.lock().unwrap_or_else(|e| e.into_inner())
}

/// `1.5 GiB`, `12.0 MiB`, `512 bytes`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} bytes");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use bytes::Bytes;

    use super::*;
    use crate::store::{Chunk, ObjectInfo, fs::FsStore};

    /// A folder store that counts its listings and holds each one until told to go on.
    struct Counting {
        inner: FsStore,
        lists: AtomicUsize,
        gate: tokio::sync::Semaphore,
    }

    #[async_trait::async_trait]
    impl ArtifactStore for Counting {
        async fn put(&self, owner: &OwnerKey, path: &str, bytes: Bytes) -> crate::Result<()> {
            self.inner.put(owner, path, bytes).await
        }
        async fn create(&self, owner: &OwnerKey, path: &str, bytes: Bytes) -> crate::Result<bool> {
            self.inner.create(owner, path, bytes).await
        }
        async fn get(&self, owner: &OwnerKey, path: &str) -> crate::Result<Option<Bytes>> {
            self.inner.get(owner, path).await
        }
        async fn get_range(&self, owner: &OwnerKey, path: &str, offset: u64, len: u64) -> crate::Result<Option<Chunk>> {
            self.inner.get_range(owner, path, offset, len).await
        }
        async fn list(&self, owner: &OwnerKey, folder: &str) -> crate::Result<Vec<ObjectInfo>> {
            self.lists.fetch_add(1, Ordering::SeqCst);
            self.gate.acquire().await.expect("open").forget();
            self.inner.list(owner, folder).await
        }
        async fn delete_folder(&self, owner: &OwnerKey, folder: &str) -> crate::Result<usize> {
            self.inner.delete_folder(owner, folder).await
        }
        async fn delete(&self, owner: &OwnerKey, paths: &[String]) -> crate::Result<()> {
            self.inner.delete(owner, paths).await
        }
        async fn expire(&self, before: jiff::Timestamp) -> crate::Result<usize> {
            self.inner.expire(before).await
        }
        async fn health(&self) -> crate::Result<()> {
            self.inner.health().await
        }
    }

    #[tokio::test]
    async fn checks_share_one_measurement_and_a_stale_figure_is_used_while_it_is_measured_again() {
        let dir = std::env::temp_dir().join(format!("toolyard-quota-{}", std::process::id()));
        let _cleanup = RemoveOnDrop(dir.clone());
        let store = Arc::new(Counting {
            inner: FsStore::new(&dir).unwrap(),
            lists: AtomicUsize::new(0),
            gate: tokio::sync::Semaphore::new(0),
        });
        let owner = OwnerKey::derive("local", "dev");
        store.put(&owner, "calls/c1/result.json", Bytes::from_static(&[b'x'; 5000])).await.unwrap();
        let quota = Arc::new(StorageQuota::new(store.clone(), 8000).with_ttl(Duration::from_millis(50)));

        // The first checks wait for one measurement (a listing per folder counted).
        let waiting: Vec<_> = (0..8)
            .map(|_| {
                let (quota, owner) = (quota.clone(), owner.clone());
                tokio::spawn(async move { quota.check(&owner).await.unwrap() })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        store.gate.add_permits(FOLDERS.len());
        for w in waiting {
            let checked = tokio::time::timeout(Duration::from_secs(10), w).await.expect("a check answers");
            assert_eq!(checked.unwrap(), None, "5,000 of 8,000 bytes");
        }
        assert_eq!(store.lists.load(Ordering::SeqCst), FOLDERS.len(), "one measurement for eight checks");

        // Past the TTL, checks answer at once from the last figure; one measurement runs. An
        // empty file of a session's subscription counts MIN_FILE_BYTES.
        store.put(&owner, "sessions/s1/subscriptions/dXJp/on", Bytes::new()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(60)).await;
        for _ in 0..8 {
            assert_eq!(quota.check(&owner).await.unwrap(), None, "the stale figure, without waiting");
        }
        store.gate.add_permits(FOLDERS.len());
        let mut reached = None;
        for _ in 0..100 {
            reached = quota.check(&owner).await.unwrap();
            if reached.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(reached.as_ref().is_some_and(|m| m.contains("8.9 KiB of your 7.8 KiB")), "the new figure: {reached:?}");
        assert_eq!(store.lists.load(Ordering::SeqCst), 2 * FOLDERS.len(), "one more measurement");
    }

    /// Removes a test's folder when dropped, when the test fails too.
    struct RemoveOnDrop(std::path::PathBuf);

    impl Drop for RemoveOnDrop {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_long_history_far_from_the_quota_is_measured_less_often() {
        let (ttl, limit) = (USAGE_TTL, 10 << 30);
        assert_eq!(validity(ttl, limit, 1 << 20, 0), ttl);
        assert_eq!(validity(ttl, limit, 1 << 20, 9_999), ttl);
        // 100,000 calls of four files each, 1 GiB in all: listed every 20 minutes, not 30 s.
        assert_eq!(validity(ttl, limit, 1 << 30, 400_000), ttl * 40);
        assert_eq!(validity(ttl, limit, 1 << 30, 100_000_000), ttl * MAX_TTL_SCALE, "bounded");
        // Near the quota, every TTL, however long the history.
        assert_eq!(validity(ttl, limit, limit / 2, 400_000), ttl);
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(human_bytes(0), "0 bytes");
        assert_eq!(human_bytes(1023), "1023 bytes");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(10 * 1024 * 1024 * 1024), "10.0 GiB");
        assert_eq!(human_bytes(u64::MAX), "16777216.0 TiB");
    }
}

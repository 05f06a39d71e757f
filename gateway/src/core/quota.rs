//! Per-owner storage quota: a call or a coding task is refused while its owner's stored files
//! (`calls/` and `tasks/` under the owner's prefix) reach the quota, with a message that says
//! how much is used and how to free it.
//!
//! The usage is measured by listing the owner's files in the store, so every replica sees the
//! same figure; a replica keeps it for [`USAGE_TTL`] and measures again after that, or at once
//! after the owner deleted something through it. One call or task admitted just below the
//! quota may still store its own files (each is capped on its own: result, logs, artifacts).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use toolyard_api::OwnerKey;

use crate::store::ArtifactStore;

/// How long a measured usage is used before it is measured again.
pub const USAGE_TTL: Duration = Duration::from_secs(30);

/// The top-level folders of an owner's files.
const FOLDERS: [&str; 2] = ["calls/", "tasks/"];

/// Per-owner storage quota over one store.
pub struct StorageQuota {
    store: Arc<dyn ArtifactStore>,
    limit: u64,
    measured: Mutex<HashMap<String, (u64, Instant)>>,
}

impl std::fmt::Debug for StorageQuota {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StorageQuota").field("limit", &self.limit).finish_non_exhaustive()
    }
}

impl StorageQuota {
    /// A quota of `limit` bytes per owner on `store`; 0: no quota.
    pub fn new(store: Arc<dyn ArtifactStore>, limit: u64) -> Self {
        Self { store, limit, measured: Mutex::default() }
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
        self.lock().remove(owner.as_str());
    }

    async fn usage(&self, owner: &OwnerKey) -> crate::Result<u64> {
        if let Some((bytes, at)) = self.lock().get(owner.as_str())
            && at.elapsed() < USAGE_TTL
        {
            return Ok(*bytes);
        }
        let mut bytes = 0u64;
        for folder in FOLDERS {
            bytes = self.store.list(owner, folder).await?.iter().fold(bytes, |sum, o| sum.saturating_add(o.size));
        }
        self.lock().insert(owner.as_str().to_owned(), (bytes, Instant::now()));
        Ok(bytes)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (u64, Instant)>> {
        self.measured.lock().unwrap_or_else(|e| e.into_inner())
    }
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
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(human_bytes(0), "0 bytes");
        assert_eq!(human_bytes(1023), "1023 bytes");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(10 * 1024 * 1024 * 1024), "10.0 GiB");
        assert_eq!(human_bytes(u64::MAX), "16777216.0 TiB");
    }
}

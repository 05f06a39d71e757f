//! Event logs in storage: a run's `events/` folder holds numbered segments
//! (`000001.jsonl`, ...), each a few JSON lines, written create-only so that writers on
//! different replicas never overwrite each other's. A task's log and a direct call's log are
//! written the same way, by runners through the internal API and by the gateway itself.

use bytes::Bytes;
use toolyard_api::OwnerKey;
use toolyard_api::protocol::Event;

use super::ArtifactStore;

/// Segment numbers tried by one append before giving up (each taken one means another writer
/// stored a segment in between).
const MAX_SEGMENT_ATTEMPTS: usize = 16;

/// Serializes this process's appends to one log (chosen by a hash of owner and folder, over
/// a fixed set of locks), which would otherwise all race for the same next number; appends to
/// other logs mostly go on in parallel. Writers in other processes are kept apart by the
/// create-only writes alone.
#[derive(Debug)]
pub struct AppendLocks([tokio::sync::Mutex<()>; 32]);

impl Default for AppendLocks {
    fn default() -> Self {
        Self(std::array::from_fn(|_| tokio::sync::Mutex::new(())))
    }
}

impl AppendLocks {
    /// Holds the lock of `owner`'s log in `folder`.
    pub async fn lock(&self, owner: &OwnerKey, folder: &str) -> tokio::sync::MutexGuard<'_, ()> {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (owner.as_str(), folder).hash(&mut hasher);
        let slot = usize::try_from(hasher.finish() % self.0.len() as u64).unwrap_or(0);
        self.0[slot].lock().await
    }
}

/// Why an append stored nothing.
#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    /// The log already holds `stored` bytes, and the segment would take it past `limit`.
    #[error("the event log is full: it holds {stored} bytes of at most {limit}")]
    Full {
        /// Bytes stored.
        stored: u64,
        /// The log's bound.
        limit: u64,
    },
    /// No segment number left (more than `u32::MAX` segments).
    #[error("too many event segments")]
    TooManySegments,
    /// The store failed, or other writers took every number tried.
    #[error(transparent)]
    Store(#[from] crate::Error),
}

/// `events` as one segment: one JSON line each.
pub fn segment(events: &[Event]) -> Bytes {
    let mut bytes = Vec::new();
    for event in events {
        // An `Event` is plain JSON data: serializing it cannot fail.
        if serde_json::to_writer(&mut bytes, event).is_ok() {
            bytes.push(b'\n');
        }
    }
    Bytes::from(bytes)
}

/// The number of the segment at `path` (`.../000012.jsonl` is 12).
pub fn segment_number(path: &str) -> Option<u32> {
    path.rsplit('/').next()?.strip_suffix(".jsonl")?.parse().ok()
}

/// Stores `segment` as the next segment of the log in `folder` (relative to the owner's
/// prefix, ending in `/`), at `segment_path(n)`: the number after the highest stored, created
/// only if no other writer took it meanwhile (then the one after). `limit` bounds the log's
/// total size.
pub async fn append(
    store: &dyn ArtifactStore,
    owner: &OwnerKey,
    folder: &str,
    segment_path: impl Fn(u32) -> String,
    segment: Bytes,
    limit: u64,
) -> Result<(), AppendError> {
    let existing = store.list(owner, folder).await?;
    let stored: u64 = existing.iter().map(|o| o.size).sum();
    if stored + segment.len() as u64 > limit {
        return Err(AppendError::Full { stored, limit });
    }
    let mut next = existing.iter().filter_map(|o| segment_number(&o.path)).max().unwrap_or(0);
    for _ in 0..MAX_SEGMENT_ATTEMPTS {
        next = next.checked_add(1).ok_or(AppendError::TooManySegments)?;
        if store.create(owner, &segment_path(next), segment.clone()).await? {
            return Ok(());
        }
    }
    Err(crate::Error::Unavailable("the event segment numbers are contended; retry".into()).into())
}

/// The events of the segments in `folder` numbered `from` or higher, in order, and the number
/// to read from next time. A segment that cannot be read back as JSON lines adds nothing.
pub async fn read_from(
    store: &dyn ArtifactStore,
    owner: &OwnerKey,
    folder: &str,
    from: u32,
) -> crate::Result<(Vec<Event>, u32)> {
    let existing = store.list(owner, folder).await?;
    let mut found: Vec<(u32, &str)> = existing
        .iter()
        .filter_map(|o| Some((segment_number(&o.path)?, o.path.as_str())))
        .filter(|(n, _)| *n >= from)
        .collect();
    found.sort_unstable();
    let mut events = Vec::new();
    let mut next = from;
    for (n, path) in found {
        if let Some(bytes) = store.get(owner, path).await? {
            events.extend(String::from_utf8_lossy(&bytes).lines().filter_map(|l| serde_json::from_str(l).ok()));
        }
        next = n + 1;
    }
    Ok((events, next))
}

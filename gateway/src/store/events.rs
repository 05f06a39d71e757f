//! Event logs in storage: a run's `events/` folder holds numbered segments
//! (`000001.jsonl`, ...), each a few JSON lines, written create-only so that writers on
//! different replicas never overwrite each other's. A task's log and a direct call's log are
//! written the same way, by runners through the internal API and by the gateway itself.

use std::time::Duration;

use bytes::Bytes;
use toolyard_api::OwnerKey;
use toolyard_api::protocol::Event;

use super::ArtifactStore;
use crate::auth::cache::TtlCache;

/// Segment numbers tried by one append before giving up (each taken one means another writer
/// stored a segment in between).
const MAX_SEGMENT_ATTEMPTS: usize = 16;

/// Longest time this process keeps what it knows of a log's tail after its last append here.
const TAIL_TTL: Duration = Duration::from_secs(600);

/// Logs whose tails this process keeps at most (more, and they are all forgotten: the next
/// append to each lists its log again).
const MAX_TAILS: usize = 16_384;

/// This process's appends to event logs.
///
/// - Appends to one log are serialized here (by a hash of owner and folder, over a fixed set
///   of locks), since they would otherwise all race for the same next number; appends to
///   other logs mostly go on in parallel. Writers in other processes are kept apart by the
///   create-only writes alone.
/// - The tail of each log this process wrote (its next number and the bytes it holds) is
///   kept for a while, so that the next append here creates its segment at once, without
///   listing the log. When another writer stored a segment meanwhile, that number is taken:
///   the create fails, and the log is listed as if nothing were known. A log's segments are
///   numbered without gaps (a writer takes the number after the highest it saw, or after the
///   one it knows it wrote), so a free known number means that the known tail is the whole
///   log, and its byte count is exact.
#[derive(Debug)]
pub struct EventLogs {
    locks: [tokio::sync::Mutex<()>; 32],
    tails: TtlCache<(OwnerKey, String), Tail>,
}

/// The end of a log: the number its next segment takes, and the bytes of those before it.
#[derive(Clone, Copy, Debug)]
struct Tail {
    next: u32,
    stored: u64,
}

impl Default for EventLogs {
    fn default() -> Self {
        Self { locks: std::array::from_fn(|_| tokio::sync::Mutex::new(())), tails: TtlCache::new(MAX_TAILS) }
    }
}

impl EventLogs {
    /// Holds the lock of `owner`'s log in `folder`.
    async fn lock(&self, owner: &OwnerKey, folder: &str) -> tokio::sync::MutexGuard<'_, ()> {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (owner.as_str(), folder).hash(&mut hasher);
        let slot = usize::try_from(hasher.finish() % self.locks.len() as u64).unwrap_or(0);
        self.locks[slot].lock().await
    }

    /// Records that `owner`'s log in `folder` was just created with one segment of `bytes`
    /// (numbered 1) by this process.
    pub fn started(&self, owner: &OwnerKey, folder: &str, bytes: u64) {
        self.tails.insert((owner.clone(), folder.to_owned()), Tail { next: 2, stored: bytes }, TAIL_TTL);
    }

    /// Stores `segment` as the next segment of the log in `folder` (relative to the owner's
    /// prefix, ending in `/`), at `segment_path(n)`: the number after the highest stored,
    /// created only if no other writer took it meanwhile (then the one after). `limit` bounds
    /// the log's total size.
    pub async fn append(
        &self,
        store: &dyn ArtifactStore,
        owner: &OwnerKey,
        folder: &str,
        segment_path: impl Fn(u32) -> String,
        segment: Bytes,
        limit: u64,
    ) -> Result<(), AppendError> {
        let _serialized = self.lock(owner, folder).await;
        let key = (owner.clone(), folder.to_owned());
        // The log holds at least what is known of it: full by that, full indeed.
        let known = match self.tails.get(&key) {
            Some(tail) => create_at(store, owner, &segment_path, tail, &segment, limit).await?,
            None => None,
        };
        let tail = match known {
            Some(tail) => tail,
            None => append_listed(store, owner, folder, &segment_path, &segment, limit).await?,
        };
        self.tails.insert(key, tail, TAIL_TTL);
        Ok(())
    }
}

/// Creates `segment` as segment `at.next` of a log holding `at.stored` bytes, unless that
/// takes the log past `limit`: the log's tail after it, or `None` when another writer took
/// that number.
async fn create_at(
    store: &dyn ArtifactStore,
    owner: &OwnerKey,
    segment_path: impl Fn(u32) -> String,
    at: Tail,
    segment: &Bytes,
    limit: u64,
) -> Result<Option<Tail>, AppendError> {
    let (stored, size) = (at.stored, segment.len() as u64);
    if stored + size > limit {
        return Err(AppendError::Full { stored, limit });
    }
    if !store.create(owner, &segment_path(at.next), segment.clone()).await? {
        return Ok(None);
    }
    let next = at.next.checked_add(1).ok_or(AppendError::TooManySegments)?;
    Ok(Some(Tail { next, stored: stored + size }))
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

/// Stores `segment` as the next segment of the log in `folder`, after listing the log: at the
/// number after the highest stored, created only if no other writer took it meanwhile (then
/// the one after); the log's tail after it.
async fn append_listed(
    store: &dyn ArtifactStore,
    owner: &OwnerKey,
    folder: &str,
    segment_path: impl Fn(u32) -> String,
    segment: &Bytes,
    limit: u64,
) -> Result<Tail, AppendError> {
    let existing = store.list(owner, folder).await?;
    let stored: u64 = existing.iter().map(|o| o.size).sum();
    let mut next = existing.iter().filter_map(|o| segment_number(&o.path)).max().unwrap_or(0);
    for _ in 0..MAX_SEGMENT_ATTEMPTS {
        next = next.checked_add(1).ok_or(AppendError::TooManySegments)?;
        if let Some(tail) = create_at(store, owner, &segment_path, Tail { next, stored }, segment, limit).await? {
            return Ok(tail);
        }
    }
    Err(crate::Error::Unavailable("the event segment numbers are contended; retry".into()).into())
}

/// The events of the segments at `segment_path(n)` numbered `from` or higher, in order, and
/// the number to read from next time. The segments are read one number after the other
/// until one is missing (a log's segments are numbered without gaps, see [`EventLogs`]), so
/// a log that did not move costs one read of a missing file, not a listing. A segment that
/// cannot be read back as JSON lines adds nothing.
pub async fn read_from(
    store: &dyn ArtifactStore,
    owner: &OwnerKey,
    segment_path: impl Fn(u32) -> String,
    from: u32,
) -> crate::Result<(Vec<Event>, u32)> {
    let mut events = Vec::new();
    let mut next = from;
    while let Some(bytes) = store.get(owner, &segment_path(next)).await? {
        events.extend(String::from_utf8_lossy(&bytes).lines().filter_map(|l| serde_json::from_str(l).ok()));
        let Some(after) = next.checked_add(1) else { break };
        next = after;
    }
    Ok((events, next))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::fs::FsStore;
    use crate::store::fs::tests::Scratch;

    fn path(n: u32) -> String {
        format!("calls/c1/events/{n:06}.jsonl")
    }

    async fn numbers(store: &FsStore, owner: &OwnerKey) -> Vec<u32> {
        let listed = store.list(owner, "calls/c1/events/").await.unwrap();
        listed.iter().filter_map(|o| segment_number(&o.path)).collect()
    }

    /// A segment planted past the end (as no writer leaves one) shows whether an append
    /// listed the log: a listing appends after it, a known tail does not.
    #[tokio::test]
    async fn a_known_tail_is_appended_to_without_listing_and_a_taken_number_lists_again() {
        let scratch = Scratch::new("events-tail");
        let (store, owner) = scratch.store("s");
        let (logs, folder) = (EventLogs::default(), "calls/c1/events/");
        let line = || Bytes::from_static(b"{}\n");

        // The log's start, written by this process: the next append takes 2 at once.
        store.put(&owner, &path(1), line()).await.unwrap();
        logs.started(&owner, folder, 3);
        store.put(&owner, &path(9), line()).await.unwrap();
        logs.append(&store, &owner, folder, path, line(), u64::MAX).await.unwrap();
        assert_eq!(numbers(&store, &owner).await, [1, 2, 9], "no listing: 2 is taken, not 10");

        // Another process's segment at the known number: this one lists and goes after all.
        store.put(&owner, &path(3), line()).await.unwrap();
        logs.append(&store, &owner, folder, path, line(), u64::MAX).await.unwrap();
        assert_eq!(numbers(&store, &owner).await, [1, 2, 3, 9, 10]);
        // And knows the tail again: 11, with a segment planted at 20.
        store.put(&owner, &path(20), line()).await.unwrap();
        logs.append(&store, &owner, folder, path, line(), u64::MAX).await.unwrap();
        assert_eq!(numbers(&store, &owner).await, [1, 2, 3, 9, 10, 11, 20]);

        // The bytes known bound the log: the 6 segments of 3 bytes it knew of (18), plus 3, are
        // over 20.
        let full = logs.append(&store, &owner, folder, path, line(), 20).await.unwrap_err();
        assert!(matches!(full, AppendError::Full { stored: 18, limit: 20 }), "{full}");

        // Another process that knows nothing lists, and appends after everything.
        EventLogs::default().append(&store, &owner, folder, path, line(), u64::MAX).await.unwrap();
        assert_eq!(numbers(&store, &owner).await, [1, 2, 3, 9, 10, 11, 20, 21]);
    }

    #[tokio::test]
    async fn a_log_is_read_from_a_number_on_until_its_first_missing_segment() {
        let scratch = Scratch::new("events-read");
        let (store, owner) = scratch.store("s");
        let logs = EventLogs::default();
        let event = |n: u32| Event { time: format!("t{n}"), type_: "call_progress".into(), data: n.into() };
        for n in 1..=3 {
            let segment = super::segment(&[event(n)]);
            logs.append(&store, &owner, "calls/c1/events/", path, segment, u64::MAX).await.unwrap();
        }
        let data = |events: Vec<Event>| events.into_iter().map(|e| e.data).collect::<Vec<_>>();
        let (events, next) = read_from(&store, &owner, path, 1).await.unwrap();
        assert_eq!((data(events), next), (vec![1.into(), 2.into(), 3.into()], 4));
        let (events, next) = read_from(&store, &owner, path, 2).await.unwrap();
        assert_eq!((data(events), next), (vec![2.into(), 3.into()], 4));
        let (events, next) = read_from(&store, &owner, path, 4).await.unwrap();
        assert_eq!((data(events), next), (vec![], 4), "nothing new: read again from 4");
    }
}

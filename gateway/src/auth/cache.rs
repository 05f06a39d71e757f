//! A small bounded cache with per-entry time-to-live, for authentication and
//! authorization decisions, and other state that is cheap to find again.
//!
//! Keys are hashes or names, never tokens. When full, expired entries are dropped first;
//! if it is still full the whole cache is cleared (decisions are cheap to redo, and an
//! attacker filling the cache only costs extra reviews, never a wrong decision).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A bounded map whose entries expire.
#[derive(Debug)]
pub struct TtlCache<K, V> {
    entries: Mutex<HashMap<K, (Instant, V)>>,
    max_entries: usize,
}

impl<K: Hash + Eq, V: Clone> TtlCache<K, V> {
    /// A cache holding at most `max_entries` entries.
    pub fn new(max_entries: usize) -> Self {
        Self { entries: Mutex::new(HashMap::new()), max_entries: max_entries.max(1) }
    }

    /// The value for `key` if present and not expired.
    pub fn get(&self, key: &K) -> Option<V> {
        self.get_with_expiry(key).map(|(value, _)| value)
    }

    /// The value for `key` if present and not expired, and when it expires.
    pub fn get_with_expiry(&self, key: &K) -> Option<(V, Instant)> {
        let mut entries = self.lock();
        match entries.get(key) {
            Some((expires, value)) if *expires > Instant::now() => Some((value.clone(), *expires)),
            Some(_) => {
                entries.remove(key);
                None
            }
            None => None,
        }
    }

    /// Stores `value` for `ttl`, and returns when it expires. A zero `ttl` stores nothing.
    pub fn insert(&self, key: K, value: V, ttl: Duration) -> Option<Instant> {
        if ttl.is_zero() {
            return None;
        }
        let now = Instant::now();
        let mut entries = self.lock();
        if entries.len() >= self.max_entries && !entries.contains_key(&key) {
            entries.retain(|_, (expires, _)| *expires > now);
            if entries.len() >= self.max_entries {
                entries.clear();
            }
        }
        entries.insert(key, (now + ttl, value));
        Some(now + ttl)
    }

    /// Number of entries (expired ones included until touched).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, (Instant, V)>> {
        // A panic while holding this lock cannot leave the map inconsistent.
        self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_expire_and_zero_ttl_stores_nothing() {
        let cache = TtlCache::new(10);
        cache.insert("a", 1, Duration::from_secs(60));
        cache.insert("b", 2, Duration::ZERO);
        cache.insert("c", 3, Duration::from_nanos(1));
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(cache.get(&"a"), Some(1));
        assert_eq!(cache.get(&"b"), None);
        assert_eq!(cache.get(&"c"), None);
    }

    #[test]
    fn a_full_cache_stays_bounded() {
        let cache = TtlCache::new(3);
        for i in 0..10 {
            cache.insert(i, i, Duration::from_secs(60));
            assert!(cache.len() <= 3);
        }
        assert_eq!(cache.get(&9), Some(9));
    }
}

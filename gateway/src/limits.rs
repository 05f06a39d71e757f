//! Admission limits: how many tool calls and HTTP requests run at once, globally and per user.
//!
//! Tool calls are limited at the MCP level (a refused call gets a JSON-RPC "server busy"
//! error); HTTP requests are limited in middleware (503 globally, 429 per user, both with
//! `Retry-After`). A `subscriptions/listen` stream outlives its request's admission, so open
//! streams have limits of their own (a busy error beyond). Permits are released on drop, so a
//! cancelled request or a closed stream frees its slot.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::metrics::Rejection;

/// Limit settings.
#[derive(Clone, Debug)]
pub struct LimitSettings {
    /// Tool calls running at once on this replica.
    pub max_calls: usize,
    /// Tool calls one user runs at once, on all replicas together.
    pub max_calls_per_user: usize,
    /// Coding tasks of one user not finished yet, on all replicas together.
    pub max_tasks_per_user: usize,
    /// HTTP requests handled at once on this replica (answered 503 beyond).
    pub max_http_in_flight: usize,
    /// HTTP requests of one user handled at once (answered 429 beyond).
    pub max_http_in_flight_per_user: usize,
    /// Notification streams (`subscriptions/listen`, a session's GET) open at once on this
    /// replica.
    pub max_streams: usize,
    /// Notification streams one user holds open at once on this replica.
    pub max_streams_per_user: usize,
    /// Largest request body in bytes (answered 413 beyond).
    pub max_body_bytes: usize,
    /// The `Retry-After` sent with 429/503 and suggested in "server busy" errors.
    pub retry_after: Duration,
    /// Bytes of stored calls and tasks per owner; at it, new calls and tasks are refused
    /// (0: no quota). See [`crate::core::quota`].
    pub storage_quota_bytes: u64,
}

/// The default storage quota per owner: 10 GiB.
pub const DEFAULT_STORAGE_QUOTA_BYTES: u64 = 10 * 1024 * 1024 * 1024;

impl Default for LimitSettings {
    fn default() -> Self {
        Self {
            max_calls: 256,
            max_calls_per_user: 16,
            max_tasks_per_user: 4,
            max_http_in_flight: 1024,
            max_http_in_flight_per_user: 64,
            max_streams: 4096,
            max_streams_per_user: 16,
            max_body_bytes: 4 * 1024 * 1024,
            retry_after: Duration::from_secs(1),
            storage_quota_bytes: DEFAULT_STORAGE_QUOTA_BYTES,
        }
    }
}

/// Per-key counters with a cap.
#[derive(Debug)]
struct PerKey {
    max: usize,
    counts: Mutex<HashMap<String, usize>>,
}

impl PerKey {
    fn new(max: usize) -> Arc<Self> {
        Arc::new(Self { max: max.max(1), counts: Mutex::new(HashMap::new()) })
    }

    /// One slot of `key`, unless its slots in use here plus `elsewhere` (held outside this
    /// process) reach the cap.
    fn try_acquire(self: &Arc<Self>, key: &str, elsewhere: usize) -> Option<KeyPermit> {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let n = counts.entry(key.to_owned()).or_insert(0);
        if *n + elsewhere >= self.max {
            if *n == 0 {
                counts.remove(key);
            }
            return None;
        }
        *n += 1;
        Some(KeyPermit { owner: self.clone(), key: key.to_owned() })
    }

    fn in_use(&self, key: &str) -> usize {
        self.counts.lock().unwrap_or_else(|e| e.into_inner()).get(key).copied().unwrap_or(0)
    }
}

/// One slot of a per-key counter; released on drop.
#[derive(Debug)]
struct KeyPermit {
    owner: Arc<PerKey>,
    key: String,
}

impl Drop for KeyPermit {
    fn drop(&mut self) {
        let mut counts = self.owner.counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = counts.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.key);
            }
        }
    }
}

/// A running tool call's slots (global and per user); released on drop.
#[derive(Debug)]
pub struct CallPermit {
    _global: OwnedSemaphorePermit,
    _user: KeyPermit,
}

/// An HTTP request's slots; released on drop.
#[derive(Debug)]
pub struct HttpPermit {
    _global: Option<OwnedSemaphorePermit>,
    _user: Option<KeyPermit>,
}

/// An open stream's slots; released on drop.
#[derive(Debug)]
pub struct StreamPermit {
    _global: OwnedSemaphorePermit,
    _user: KeyPermit,
}

/// The admission state of one replica.
#[derive(Debug)]
pub struct Limits {
    settings: LimitSettings,
    calls: Arc<Semaphore>,
    calls_per_user: Arc<PerKey>,
    http: Arc<Semaphore>,
    http_per_user: Arc<PerKey>,
    streams: Arc<Semaphore>,
    streams_per_user: Arc<PerKey>,
    /// Held while a task is counted and created, so this replica's own starts cannot race.
    task_starts: tokio::sync::Mutex<()>,
}

impl Limits {
    /// Limits with the given settings.
    pub fn new(settings: LimitSettings) -> Self {
        Self {
            calls: Arc::new(Semaphore::new(settings.max_calls.max(1))),
            calls_per_user: PerKey::new(settings.max_calls_per_user),
            http: Arc::new(Semaphore::new(settings.max_http_in_flight.max(1))),
            http_per_user: PerKey::new(settings.max_http_in_flight_per_user),
            streams: Arc::new(Semaphore::new(settings.max_streams.max(1))),
            streams_per_user: PerKey::new(settings.max_streams_per_user),
            task_starts: tokio::sync::Mutex::new(()),
            settings,
        }
    }

    /// The settings.
    pub fn settings(&self) -> &LimitSettings {
        &self.settings
    }

    /// Admits one tool call of the user with storage key `user`, who runs `elsewhere` calls
    /// on other replicas, or says which limit refused it. The per-user limit is checked first
    /// so one busy user does not show as global load.
    pub fn try_admit_call(&self, user: &str, elsewhere: usize) -> Result<CallPermit, Rejection> {
        let user_permit = self.calls_per_user.try_acquire(user, elsewhere).ok_or(Rejection::UserCalls)?;
        let global = self.calls.clone().try_acquire_owned().map_err(|_| Rejection::GlobalCalls)?;
        Ok(CallPermit { _global: global, _user: user_permit })
    }

    /// Admits one HTTP request before authentication (global limit only).
    pub fn try_admit_http(&self) -> Result<HttpPermit, Rejection> {
        let global = self.http.clone().try_acquire_owned().map_err(|_| Rejection::HttpGlobal)?;
        Ok(HttpPermit { _global: Some(global), _user: None })
    }

    /// Admits one HTTP request of an authenticated user (per-user limit).
    pub fn try_admit_http_user(&self, user: &str) -> Result<HttpPermit, Rejection> {
        let user = self.http_per_user.try_acquire(user, 0).ok_or(Rejection::HttpUser)?;
        Ok(HttpPermit { _global: None, _user: Some(user) })
    }

    /// Admits one `subscriptions/listen` stream of the user with storage key `user`, held for
    /// as long as the stream is open.
    pub fn try_admit_stream(&self, user: &str) -> Result<StreamPermit, Rejection> {
        let user_permit = self.streams_per_user.try_acquire(user, 0).ok_or(Rejection::StreamsUser)?;
        let global = self.streams.clone().try_acquire_owned().map_err(|_| Rejection::StreamsGlobal)?;
        Ok(StreamPermit { _global: global, _user: user_permit })
    }

    /// Admission of a coding task: held while the owner's running tasks are counted and the
    /// new one is created, so that this replica's concurrent starts see each other.
    pub async fn task_start(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.task_starts.lock().await
    }

    /// Tool calls of `user` running now (for tests and diagnostics).
    pub fn calls_of(&self, user: &str) -> usize {
        self.calls_per_user.in_use(user)
    }

    /// Tool calls running now on this replica.
    pub fn calls_running(&self) -> usize {
        self.settings.max_calls.max(1) - self.calls.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_calls: usize, per_user: usize) -> Limits {
        Limits::new(LimitSettings { max_calls, max_calls_per_user: per_user, ..LimitSettings::default() })
    }

    #[test]
    fn streams_are_limited_per_user_and_per_replica_until_closed() {
        let l = Limits::new(LimitSettings { max_streams: 3, max_streams_per_user: 2, ..LimitSettings::default() });
        let a1 = l.try_admit_stream("alice").unwrap();
        let _a2 = l.try_admit_stream("alice").unwrap();
        assert_eq!(l.try_admit_stream("alice").unwrap_err(), Rejection::StreamsUser);
        let _b1 = l.try_admit_stream("bob").unwrap();
        assert_eq!(l.try_admit_stream("carol").unwrap_err(), Rejection::StreamsGlobal);
        drop(a1);
        assert!(l.try_admit_stream("alice").is_ok(), "a closed stream frees its slots");
    }

    #[test]
    fn per_user_limit_refuses_the_extra_call_and_frees_on_drop() {
        let l = limits(10, 2);
        let a = l.try_admit_call("alice", 0).unwrap();
        let _b = l.try_admit_call("alice", 0).unwrap();
        assert_eq!(l.try_admit_call("alice", 0).unwrap_err(), Rejection::UserCalls);
        assert!(l.try_admit_call("bob", 0).is_ok(), "another user is not affected");
        drop(a);
        assert!(l.try_admit_call("alice", 0).is_ok());
        assert_eq!(l.calls_of("alice"), 1, "the permit from the line above was dropped at once");
    }

    #[test]
    fn calls_elsewhere_count_against_the_per_user_limit() {
        let l = limits(10, 2);
        let _a = l.try_admit_call("alice", 1).unwrap();
        assert_eq!(l.try_admit_call("alice", 1).unwrap_err(), Rejection::UserCalls);
        assert_eq!(l.try_admit_call("bob", 2).unwrap_err(), Rejection::UserCalls);
        assert_eq!(l.calls_of("bob"), 0, "a refusal keeps no slot");
    }

    #[test]
    fn global_limit_refuses_when_full_and_does_not_leak_user_slots() {
        let l = limits(2, 5);
        let _a = l.try_admit_call("alice", 0).unwrap();
        let _b = l.try_admit_call("bob", 0).unwrap();
        assert_eq!(l.try_admit_call("carol", 0).unwrap_err(), Rejection::GlobalCalls);
        assert_eq!(l.calls_of("carol"), 0, "a refused call keeps no per-user slot");
        assert_eq!(l.calls_running(), 2);
    }

    #[test]
    fn http_limits() {
        let l = Limits::new(LimitSettings {
            max_http_in_flight: 1,
            max_http_in_flight_per_user: 1,
            ..LimitSettings::default()
        });
        let g = l.try_admit_http().unwrap();
        assert_eq!(l.try_admit_http().unwrap_err(), Rejection::HttpGlobal);
        drop(g);
        assert!(l.try_admit_http().is_ok());
        let _u = l.try_admit_http_user("alice").unwrap();
        assert_eq!(l.try_admit_http_user("alice").unwrap_err(), Rejection::HttpUser);
        assert!(l.try_admit_http_user("bob").is_ok());
    }
}

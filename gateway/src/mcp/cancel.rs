//! MCP-level cancellation over a stateless transport.
//!
//! A client cancels a running `tools/call` with `notifications/cancelled` naming the
//! request's id. With no session, that notification is a separate POST which may reach
//! another replica, and rmcp's stateless transport drops notifications before any handler
//! sees them. So the HTTP layer ([`crate::app`]) reads it itself and calls [`on_cancelled`]:
//!
//! - calls waited on by this process are found in the in-process [`CancelRegistry`], keyed
//!   by a [`cancel_key`] of the caller's owner key and the request id (a client can only
//!   cancel its own user's calls), and cancelled through their token;
//! - every executor is also asked ([`crate::executor::Executor::cancel_by_key`]): on
//!   Kubernetes each ToolCall carries the key as a label, so any replica finds it and sets
//!   `spec.cancelRequested`.
//!
//! Request ids are chosen by clients, so two concurrent clients of the same user may use the
//! same id; a cancellation then stops both calls. Calls of other users are never touched.
//!
//! Asking the executor costs apiserver requests on Kubernetes (a list, then patches), so at
//! most [`MAX_EXECUTOR_CANCELS`] such requests run at once on a replica; a cancellation that
//! arrives while they are busy still stops the calls waited on here, and the rest of it is
//! dropped with a debug log. Cancellation is advisory in MCP: a client flooding the gateway
//! with them cannot multiply the load on the apiserver.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use toolyard_api::OwnerKey;

use crate::identity::Identity;
use crate::state::AppState;

/// The key of a call: 32 hex characters of SHA-256(owner key, 0, request id as JSON). A
/// valid label value, and neither reveals the user nor lets another user guess it.
pub fn cancel_key(owner: &OwnerKey, request_id: &Value) -> String {
    let mut hasher = Sha256::new();
    hasher.update(owner.as_str().as_bytes());
    hasher.update([0u8]);
    hasher.update(serde_json::to_string(request_id).unwrap_or_default().as_bytes());
    hex::encode(&hasher.finalize()[..16])
}

/// Most cancellations handed to the executor at once ([`Executor::cancel_by_key`]).
///
/// [`Executor::cancel_by_key`]: crate::executor::Executor::cancel_by_key
pub const MAX_EXECUTOR_CANCELS: usize = 4;

/// Calls waited on by this process, by cancel key, and the bound on executor cancellations.
#[derive(Debug)]
pub struct CancelRegistry {
    calls: Mutex<HashMap<String, Vec<(u64, CancellationToken)>>>,
    next: AtomicU64,
    executor_cancels: Arc<Semaphore>,
}

impl Default for CancelRegistry {
    fn default() -> Self {
        Self {
            calls: Mutex::default(),
            next: AtomicU64::new(0),
            executor_cancels: Arc::new(Semaphore::new(MAX_EXECUTOR_CANCELS)),
        }
    }
}

/// Removes a registration when the call ends.
#[derive(Debug)]
pub struct Registration<'a> {
    registry: &'a CancelRegistry,
    key: String,
    n: u64,
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        let mut calls = self.registry.calls.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(list) = calls.get_mut(&self.key) {
            list.retain(|(n, _)| *n != self.n);
            if list.is_empty() {
                calls.remove(&self.key);
            }
        }
    }
}

impl CancelRegistry {
    /// Registers `token` under `key` until the returned guard is dropped.
    pub fn register(&self, key: String, token: CancellationToken) -> Registration<'_> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).entry(key.clone()).or_default().push((n, token));
        Registration { registry: self, key, n }
    }

    /// Cancels every call registered under `key`; returns how many.
    pub fn cancel(&self, key: &str) -> usize {
        let calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        let list = calls.get(key).map(Vec::as_slice).unwrap_or_default();
        for (_, token) in list {
            token.cancel();
        }
        list.len()
    }

    /// Calls registered now (for tests and metrics).
    pub fn len(&self) -> usize {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).values().map(Vec::len).sum()
    }

    /// True when no call is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs `work` in a task of its own if fewer than [`MAX_EXECUTOR_CANCELS`] such tasks run;
    /// otherwise drops it and returns false.
    fn spawn_bounded(&self, work: impl Future<Output = ()> + Send + 'static) -> bool {
        let Ok(permit) = Arc::clone(&self.executor_cancels).try_acquire_owned() else { return false };
        tokio::spawn(async move {
            work.await;
            drop(permit);
        });
        true
    }
}

/// The request id a JSON-RPC `notifications/cancelled` body names, if that is what it is.
pub fn cancelled_request_id(body: &[u8]) -> Option<Value> {
    let message: Value = serde_json::from_slice(body).ok()?;
    if message.get("method").and_then(Value::as_str) != Some("notifications/cancelled") || message.get("id").is_some() {
        return None;
    }
    let id = message.get("params")?.get("requestId")?;
    (id.is_string() || id.is_i64() || id.is_u64()).then(|| id.clone())
}

/// Handles a `notifications/cancelled` from `who` for `request_id`: cancels the calls this
/// process waits on at once, then, in a task of its own and only while fewer than
/// [`MAX_EXECUTOR_CANCELS`] run, asks the executor to cancel runs started elsewhere.
pub fn on_cancelled(state: &AppState, who: &Identity, request_id: &Value) {
    let owner = who.owner_key();
    let key = cancel_key(&owner, request_id);
    let here = state.cancels.cancel(&key);
    let executor = Arc::clone(&state.executor);
    let asked = state.cancels.spawn_bounded(async move {
        let elsewhere = match executor.cancel_by_key(&owner, &key).await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(error = %e, "cancelling runs by request failed");
                0
            }
        };
        tracing::info!(here, elsewhere, "notifications/cancelled handled");
    });
    if !asked {
        tracing::debug!(
            here,
            "notifications/cancelled: too many cancellations in flight, only calls waited on here were cancelled"
        );
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn keys_separate_users_and_ids() {
        let alice = OwnerKey::derive("apikey", "alice");
        let bob = OwnerKey::derive("apikey", "bob");
        let k = cancel_key(&alice, &json!(5));
        assert_eq!(k.len(), 32);
        assert_eq!(k, cancel_key(&alice, &json!(5)));
        assert_ne!(k, cancel_key(&bob, &json!(5)));
        assert_ne!(k, cancel_key(&alice, &json!("5")));
    }

    #[test]
    fn only_cancel_notifications_are_read() {
        let n = br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7,"reason":"x"}}"#;
        assert_eq!(cancelled_request_id(n), Some(json!(7)));
        let s = br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"a"}}"#;
        assert_eq!(cancelled_request_id(s), Some(json!("a")));
        for other in [
            &br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{}}"#[..],
            br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{}}"#,
            br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":{"x":1}}}"#,
            b"not json",
        ] {
            assert_eq!(cancelled_request_id(other), None);
        }
    }

    #[test]
    fn registrations_cancel_and_clean_up() {
        let registry = CancelRegistry::default();
        let token = CancellationToken::new();
        {
            let _r = registry.register("k".into(), token.clone());
            assert_eq!(registry.len(), 1);
            assert_eq!(registry.cancel("other"), 0);
            assert_eq!(registry.cancel("k"), 1);
        }
        assert!(token.is_cancelled());
        assert!(registry.is_empty());
    }

    /// An executor whose `cancel_by_key` waits until `gate` opens, counting calls and the most
    /// at once.
    #[derive(Default)]
    struct SlowCancels {
        gate: tokio::sync::watch::Sender<bool>,
        calls: std::sync::atomic::AtomicUsize,
        running: std::sync::atomic::AtomicUsize,
        most: std::sync::atomic::AtomicUsize,
    }

    #[async_trait::async_trait]
    impl crate::executor::Executor for SlowCancels {
        async fn call(&self, _: crate::executor::CallRequest) -> crate::Result<toolyard_api::protocol::CallResult> {
            Err(crate::Error::Internal("not used".into()))
        }

        async fn cancel_by_key(&self, _: &OwnerKey, _: &str) -> crate::Result<usize> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(now, Ordering::SeqCst);
            let _ = self.gate.subscribe().wait_for(|open| *open).await;
            self.running.fetch_sub(1, Ordering::SeqCst);
            Ok(0)
        }
    }

    struct NoTools(tokio::sync::watch::Sender<u64>);

    impl crate::catalog::ToolCatalog for NoTools {
        fn tools(&self) -> Arc<[Arc<crate::catalog::Tool>]> {
            Arc::new([])
        }
        fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
            self.0.subscribe()
        }
        fn is_synced(&self) -> bool {
            true
        }
    }

    /// Waits (letting the spawned tasks run) until `done` holds; a bound for a hang only.
    async fn until(what: &str, done: impl Fn() -> bool) {
        let wait = async {
            while !done() {
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(10), wait).await.unwrap_or_else(|_| panic!("{what}"));
    }

    #[tokio::test]
    async fn a_flood_of_cancellations_asks_the_executor_a_bounded_number_of_times_at_once() {
        let executor = Arc::new(SlowCancels::default());
        let dir = std::env::temp_dir().join(format!("toolyard-cancel-flood-{}", std::process::id()));
        let state = AppState::new(
            Arc::new(NoTools(tokio::sync::watch::channel(0).0)),
            executor.clone(),
            Arc::new(crate::store::fs::FsStore::new(&dir).unwrap()),
            Arc::new(crate::authz::PolicyAuthorizer::deny_all()),
            crate::state::Settings::default(),
        );
        let who = Identity { issuer: "apikey".into(), user: "alice".into(), groups: Vec::new(), scopes: Vec::new() };
        let waited = CancellationToken::new();
        let _registered = state.cancels.register(cancel_key(&who.owner_key(), &json!(999)), waited.clone());

        for id in 0..1000 {
            on_cancelled(&state, &who, &json!(id));
        }
        on_cancelled(&state, &who, &json!(999));
        assert!(waited.is_cancelled(), "a call waited on here is cancelled even when the executor is busy");
        until("the admitted cancellations reach the executor", || {
            executor.running.load(Ordering::SeqCst) == MAX_EXECUTOR_CANCELS
        })
        .await;
        assert_eq!(executor.calls.load(Ordering::SeqCst), MAX_EXECUTOR_CANCELS, "the rest were dropped");

        executor.gate.send_replace(true);
        until("the executor finishes", || state.cancels.executor_cancels.available_permits() == MAX_EXECUTOR_CANCELS)
            .await;
        on_cancelled(&state, &who, &json!("later"));
        until("a later cancellation is asked again", || {
            executor.calls.load(Ordering::SeqCst) == MAX_EXECUTOR_CANCELS + 1
        })
        .await;
        assert_eq!(executor.most.load(Ordering::SeqCst), MAX_EXECUTOR_CANCELS, "never more at once");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

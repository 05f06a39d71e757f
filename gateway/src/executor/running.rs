//! Unfinished ToolCalls that other gateway replicas started, counted per owner from the
//! shared ToolCall watch. A per-user call limit adds them to the calls this replica runs, so
//! the limit holds across replicas: it is counted from the cluster's state, not from one
//! process's memory. Each replica labels its ToolCalls with its own id ([`REPLICA_LABEL`]);
//! ToolCalls without the label (created with kubectl) count as started elsewhere.
//!
//! The count is as fresh as the watch: two replicas admitting a user's calls in the same few
//! milliseconds can each let one through before seeing the other's.

use std::collections::HashMap;
use std::sync::Mutex;

use kube::ResourceExt;
use kube::runtime::watcher::Event;
use toolyard_api::conditions;
use toolyard_api::{OwnerKey, ToolCall};

/// The label naming the gateway replica that created a ToolCall.
pub const REPLICA_LABEL: &str = "toolyard.dev/gateway-replica";

/// `(namespace, name)` of a ToolCall.
type Key = (String, String);

/// A counted ToolCall: its owner key and the watch stream that reported it.
type Entry = (String, usize);

/// Per-owner counts of unfinished ToolCalls started by other replicas.
#[derive(Debug)]
pub struct RunningElsewhere {
    me: String,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Counted ToolCalls.
    calls: HashMap<Key, Entry>,
    /// Counted ToolCalls per owner key.
    per_owner: HashMap<String, usize>,
    /// A watch stream's relist in progress: what it has delivered so far.
    relisting: HashMap<usize, HashMap<Key, String>>,
}

impl Inner {
    fn insert(&mut self, key: Key, owner: String, stream: usize) {
        *self.per_owner.entry(owner.clone()).or_default() += 1;
        if let Some((previous, _)) = self.calls.insert(key, (owner, stream)) {
            self.release(&previous);
        }
    }

    fn remove(&mut self, key: &Key) {
        if let Some((owner, _)) = self.calls.remove(key) {
            self.release(&owner);
        }
    }

    fn release(&mut self, owner: &str) {
        if let Some(n) = self.per_owner.get_mut(owner) {
            *n -= 1;
            if *n == 0 {
                self.per_owner.remove(owner);
            }
        }
    }
}

impl RunningElsewhere {
    /// Counts for the replica `me` (the value of [`REPLICA_LABEL`] on its own ToolCalls).
    pub fn new(me: impl Into<String>) -> Self {
        Self { me: me.into(), inner: Mutex::default() }
    }

    /// This replica's id.
    pub fn replica(&self) -> &str {
        &self.me
    }

    /// Unfinished ToolCalls of `owner` that other replicas started.
    pub fn of(&self, owner: &OwnerKey) -> usize {
        self.lock().per_owner.get(owner.as_str()).copied().unwrap_or(0)
    }

    /// Takes in one event of ToolCall watch stream number `stream` (one per watched
    /// namespace, or one for all namespaces).
    pub fn observe(&self, stream: usize, event: &Event<ToolCall>) {
        let mut inner = self.lock();
        match event {
            Event::Apply(tc) => match self.counted(tc) {
                Some(owner) => inner.insert(key_of(tc), owner, stream),
                None => inner.remove(&key_of(tc)),
            },
            Event::Delete(tc) => inner.remove(&key_of(tc)),
            Event::Init => {
                inner.relisting.insert(stream, HashMap::new());
            }
            Event::InitApply(tc) => {
                if let Some(owner) = self.counted(tc) {
                    inner.relisting.entry(stream).or_default().insert(key_of(tc), owner);
                }
            }
            Event::InitDone => {
                let fresh = inner.relisting.remove(&stream).unwrap_or_default();
                let stale: Vec<Key> =
                    inner.calls.iter().filter(|(_, (_, s))| *s == stream).map(|(k, _)| k.clone()).collect();
                for key in &stale {
                    inner.remove(key);
                }
                for (key, owner) in fresh {
                    inner.insert(key, owner, stream);
                }
            }
        }
    }

    /// The owner key `tc` counts for: unfinished and not started by this replica.
    fn counted(&self, tc: &ToolCall) -> Option<String> {
        if tc.labels().get(REPLICA_LABEL).is_some_and(|r| *r == self.me) {
            return None;
        }
        if tc.status.as_ref().is_some_and(|s| conditions::is_finished(&s.conditions)) {
            return None;
        }
        Some(OwnerKey::derive(&tc.spec.owner.issuer, &tc.spec.owner.user).as_str().to_owned())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn key_of(tc: &ToolCall) -> Key {
    (tc.namespace().unwrap_or_default(), tc.name_any())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn call(name: &str, user: &str, replica: Option<&str>, finished: bool) -> ToolCall {
        let mut tc: ToolCall = serde_json::from_value(json!({
            "apiVersion": "toolyard.dev/v1alpha1", "kind": "ToolCall",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"tool": "t", "owner": {"issuer": "apikey", "user": user},
                     "input": {"key": "k", "sizeBytes": 1}, "timeoutSeconds": 60},
        }))
        .unwrap();
        if let Some(r) = replica {
            tc.labels_mut().insert(REPLICA_LABEL.into(), r.into());
        }
        if finished {
            tc.status = serde_json::from_value(json!({"conditions": [{
                "type": "Succeeded", "status": "True", "reason": "Succeeded", "message": "",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}]}))
            .unwrap();
        }
        tc
    }

    #[test]
    fn counts_other_replicas_unfinished_calls_per_owner() {
        let alice = OwnerKey::derive("apikey", "alice");
        let r = RunningElsewhere::new("me");
        r.observe(0, &Event::Apply(call("a1", "alice", Some("other"), false)));
        r.observe(0, &Event::Apply(call("a2", "alice", None, false)));
        r.observe(0, &Event::Apply(call("a3", "alice", Some("me"), false)));
        r.observe(0, &Event::Apply(call("b1", "bob", Some("other"), false)));
        assert_eq!(r.of(&alice), 2, "its own calls are counted by the replica itself");
        r.observe(0, &Event::Apply(call("a1", "alice", Some("other"), false)));
        assert_eq!(r.of(&alice), 2, "an update counts once");
        r.observe(0, &Event::Apply(call("a1", "alice", Some("other"), true)));
        assert_eq!(r.of(&alice), 1, "finished calls do not count");
        r.observe(0, &Event::Delete(call("a2", "alice", None, false)));
        assert_eq!(r.of(&alice), 0);
        assert_eq!(r.of(&OwnerKey::derive("apikey", "bob")), 1);
    }

    #[test]
    fn a_relist_replaces_what_the_namespace_had() {
        let alice = OwnerKey::derive("apikey", "alice");
        let r = RunningElsewhere::new("me");
        r.observe(0, &Event::Apply(call("gone", "alice", Some("other"), false)));
        r.observe(0, &Event::Init);
        r.observe(0, &Event::InitApply(call("new", "alice", Some("other"), false)));
        assert_eq!(r.of(&alice), 1, "the old state holds until the relist is done");
        r.observe(0, &Event::InitDone);
        assert_eq!(r.of(&alice), 1);
        r.observe(0, &Event::Delete(call("new", "alice", Some("other"), false)));
        assert_eq!(r.of(&alice), 0, "the call deleted while the watch was down is gone");
    }
}

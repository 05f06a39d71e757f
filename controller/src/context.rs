//! What every reconciler shares: client, configuration, signing key, event recorder,
//! metrics and per-object retry backoff; plus each controller's own caches.

use std::collections::HashMap;
use std::future::Future;
use std::ops::Deref;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Client, Resource};
use toolyard_api::token::SigningKey;
use tracing::{Instrument, warn};

use crate::config::Config;
use crate::error::{Error, Result};
use crate::metrics::{KindLabels, Metrics, ReconcileLabels};

/// Shared by every controller of one process.
pub struct Shared {
    /// Client acting as the controller.
    pub client: Client,
    /// Configuration.
    pub config: Config,
    /// The shared key that signs runner tokens.
    pub key: SigningKey,
    /// Publishes Kubernetes Events.
    pub recorder: Recorder,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    backoff: Mutex<HashMap<String, u32>>,
    /// Statuses written but not yet seen through the watch.
    pub written: Written,
}

/// The status last written per object uid, kept until the cached object shows it.
///
/// A pass triggered by a child's event before our own status write came back through the
/// watch sees the old status and would write the same thing again (at 1,000 calls, hundreds
/// of extra requests). Values are [`crate::run::RunStatus::fingerprint`]s.
#[derive(Default)]
pub struct Written(Mutex<HashMap<String, serde_json::Value>>);

impl Written {
    /// True when `next` was already written for `uid` and the cache (`current`) just has not
    /// caught up. Forgets the write once the cache shows it.
    pub fn unseen(&self, uid: &str, current: &serde_json::Value, next: &serde_json::Value) -> bool {
        let mut written = self.0.lock().expect("written lock");
        match written.get(uid) {
            Some(last) if last == current => {
                written.remove(uid);
                false
            }
            Some(last) => last == next,
            None => false,
        }
    }

    /// Records that `status` was written for `uid`.
    pub fn wrote(&self, uid: &str, status: serde_json::Value) {
        self.0.lock().expect("written lock").insert(uid.to_owned(), status);
    }

    /// Forgets a deleted object.
    pub fn forget(&self, uid: &str) {
        self.0.lock().expect("written lock").remove(uid);
    }

    /// Number of writes not yet seen.
    pub fn len(&self) -> usize {
        self.0.lock().expect("written lock").len()
    }

    /// True when every write has been seen.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Context of one controller: the shared parts plus its caches `S`.
pub struct Context<S> {
    /// Shared parts.
    pub shared: Arc<Shared>,
    /// Caches this controller reads.
    pub stores: S,
}

impl<S> Deref for Context<S> {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.shared
    }
}

/// First retry delay after a failed reconcile.
const BACKOFF_BASE: Duration = Duration::from_millis(500);
/// Longest retry delay.
const BACKOFF_MAX: Duration = Duration::from_secs(300);

impl Shared {
    /// Puts the parts together.
    pub fn new(client: Client, config: Config, key: SigningKey, recorder: Recorder, metrics: Arc<Metrics>) -> Self {
        Self { client, config, key, recorder, metrics, backoff: Mutex::default(), written: Written::default() }
    }

    /// Publishes an Event about `reference`. Failures are logged, never fatal.
    pub async fn publish(&self, reference: &ObjectReference, warning: bool, reason: &str, action: &str, note: String) {
        let event = Event {
            type_: if warning { EventType::Warning } else { EventType::Normal },
            reason: reason.to_owned(),
            note: Some(note),
            action: action.to_owned(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, reference).await {
            warn!(%error, reason, name = reference.name.as_deref().unwrap_or_default(), "event not published");
        }
    }

    /// Runs one reconcile pass, recording its duration and result; a success resets the
    /// object's retry backoff. The pass runs in a `reconcile {kind}` span, in the trace of the
    /// call or task that made the object (its `toolyard.dev/traceparent` annotation).
    pub async fn instrument<K: Resource>(
        &self,
        kind: &'static str,
        obj: &K,
        pass: impl Future<Output = Result<Action>>,
    ) -> Result<Action> {
        let span = tracing::info_span!(
            "reconcile",
            "otel.name" = format!("reconcile {kind}"),
            "k8s.namespace.name" = obj.meta().namespace.as_deref().unwrap_or_default(),
            "toolyard.object.name" = obj.meta().name.as_deref().unwrap_or_default(),
            "otel.status_code" = tracing::field::Empty,
            "error.type" = tracing::field::Empty,
        );
        let traceparent = obj
            .meta()
            .annotations
            .as_ref()
            .and_then(|a| a.get(crate::labels::TRACEPARENT_ANNOTATION))
            .map(String::as_str);
        toolyard_telemetry::set_parent(&span, traceparent);
        let started = Instant::now();
        let result = pass.instrument(span.clone()).await;
        self.metrics.reconcile_duration.get_or_create(&KindLabels { kind }).observe(started.elapsed().as_secs_f64());
        let label = match &result {
            Ok(_) => {
                self.backoff.lock().expect("backoff lock").remove(&backoff_key(kind, obj));
                "ok"
            }
            Err(e) => {
                toolyard_telemetry::record_error(&span, e.metric_label());
                e.metric_label()
            }
        };
        self.metrics.reconciles.get_or_create(&ReconcileLabels { kind, result: label }).inc();
        result
    }

    /// The delay before retrying `obj` after an error: doubles per consecutive failure.
    pub fn retry_delay<K: Resource>(&self, kind: &'static str, obj: &K) -> Duration {
        let mut map = self.backoff.lock().expect("backoff lock");
        let attempts = map.entry(backoff_key(kind, obj)).or_insert(0);
        let delay = BACKOFF_BASE.saturating_mul(1u32 << (*attempts).min(16)).min(BACKOFF_MAX);
        *attempts = attempts.saturating_add(1);
        delay
    }
}

fn backoff_key<K: Resource>(kind: &str, obj: &K) -> String {
    format!(
        "{kind}/{}/{}",
        obj.meta().namespace.as_deref().unwrap_or_default(),
        obj.meta().name.as_deref().unwrap_or_default()
    )
}

/// The error policy of every controller: log, then retry with per-object exponential backoff.
pub fn error_policy<K: Resource, S>(kind: &'static str, obj: &K, error: &Error, ctx: &Context<S>) -> Action {
    let delay = ctx.retry_delay(kind, obj);
    warn!(
        kind,
        namespace = obj.meta().namespace.as_deref().unwrap_or_default(),
        name = obj.meta().name.as_deref().unwrap_or_default(),
        %error,
        retry_in_ms = delay.as_millis() as u64,
        "reconcile failed"
    );
    Action::requeue(delay)
}

/// Namespace and name of a namespaced object.
pub fn namespaced_name<K: Resource>(obj: &K, kind: &'static str) -> Result<(String, String)> {
    let ns = obj.meta().namespace.clone().ok_or(Error::MissingField { kind, field: "metadata.namespace" })?;
    let name = obj.meta().name.clone().ok_or(Error::MissingField { kind, field: "metadata.name" })?;
    Ok((ns, name))
}

/// An owner reference making `obj` the controller of a child.
pub fn controller_owner_ref<K: Resource<DynamicType = ()>>(
    obj: &K,
    kind: &'static str,
) -> Result<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference> {
    obj.controller_owner_ref(&()).ok_or(Error::MissingField { kind, field: "metadata.uid" })
}

/// The object's reference for Events.
pub fn reference<K: Resource<DynamicType = ()>>(obj: &K) -> ObjectReference {
    obj.object_ref(&())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::Written;

    #[test]
    fn a_write_suppresses_the_same_write_until_the_cache_shows_it() {
        let w = Written::default();
        let old = json!({"reason": "none"});
        let pending = json!({"reason": "Pending"});
        assert!(!w.unseen("u1", &old, &pending), "nothing written yet");
        w.wrote("u1", pending.clone());
        assert!(w.unseen("u1", &old, &pending), "stale cache, same status: skip");
        assert!(!w.unseen("u1", &old, &json!({"reason": "Running"})), "a different status is written");
        assert!(!w.unseen("u1", &pending, &pending), "cache caught up: forgotten");
        assert!(w.is_empty());
        w.wrote("u2", pending);
        w.forget("u2");
        assert_eq!(w.len(), 0);
    }
}

//! Warm-pool calls in flight per owner, shared between gateway replicas. Pool calls create no
//! ToolCall, so the shared ToolCall watch ([`super::running`]) cannot count them. Instead each
//! replica publishes its own counts in a Lease of its own ([`LEASE_PREFIX`] and its id, labelled
//! [`LOAD_LABEL`]) in the gateway's namespace, and watches the other replicas' Leases. A
//! per-user call limit adds the others' counts to its own, so it holds across replicas.
//!
//! A replica writes its Lease when its counts change (at most once per [`LoadSettings::debounce`])
//! and renews it every [`LoadSettings::heartbeat`]; a Lease not renewed within its duration (a
//! replica that died) no longer counts. It deletes its Lease when it stops. The counts are as
//! fresh as the debounce plus the watch: two replicas admitting a user's calls in the same
//! instant can each let one through before seeing the other's.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use toolyard_api::OwnerKey;

/// The label on every replica's load Lease (its value: the replica's id).
pub const LOAD_LABEL: &str = "toolyard.dev/gateway-load";

/// The name of a replica's load Lease is this prefix and the replica's id (the chart's
/// admission policy lets the gateway write no other Lease).
pub const LEASE_PREFIX: &str = "toolyard-gateway-load-";

/// The annotation holding a replica's pool calls in flight: a JSON object, owner key to count.
pub const POOL_CALLS_ANNOTATION: &str = "toolyard.dev/pool-calls";

const FIELD_MANAGER: &str = "toolyard-gateway";

/// How a replica publishes its load.
#[derive(Clone, Debug)]
pub struct LoadSettings {
    /// Namespace of the Leases (the gateway's own).
    pub namespace: String,
    /// Delay between a change and its publication (changes meanwhile are published together).
    pub debounce: Duration,
    /// How often an unchanged Lease is renewed.
    pub heartbeat: Duration,
    /// How long a Lease counts after its last renewal.
    pub lease_duration: Duration,
}

impl LoadSettings {
    /// Leases in `namespace`, published 100 ms after a change, renewed every 10 s, counting
    /// for 30 s.
    pub fn new(namespace: impl Into<String>) -> Self {
        Self { namespace: namespace.into(), ..Self::default() }
    }
}

impl Default for LoadSettings {
    /// Leases in `toolyard` (the gateway's default namespace).
    fn default() -> Self {
        Self {
            namespace: "toolyard".into(),
            debounce: Duration::from_millis(100),
            heartbeat: Duration::from_secs(10),
            lease_duration: Duration::from_secs(30),
        }
    }
}

/// A replica's published pool calls per owner, valid until `until`.
#[derive(Debug)]
struct Report {
    until: jiff::Timestamp,
    per_owner: HashMap<String, usize>,
}

/// This replica's pool calls in flight and the other replicas' published ones.
#[derive(Debug)]
pub struct PoolLoad {
    me: String,
    mine: Mutex<BTreeMap<String, usize>>,
    changed: Notify,
    others: Mutex<HashMap<String, Report>>,
}

impl PoolLoad {
    /// The load of replica `me`, not yet published (see [`PoolLoad::start`]).
    pub fn new(me: impl Into<String>) -> Arc<Self> {
        Arc::new(Self { me: me.into(), mine: Mutex::default(), changed: Notify::new(), others: Mutex::default() })
    }

    /// Publishes this replica's load and watches the others' until `shutdown`, then deletes
    /// this replica's Lease.
    pub fn start(self: &Arc<Self>, client: Client, settings: LoadSettings, shutdown: CancellationToken) {
        let api: Api<Lease> = Api::namespaced(client, &settings.namespace);
        tokio::spawn(Arc::clone(self).publish(api.clone(), settings, shutdown.clone()));
        tokio::spawn(Arc::clone(self).watch(api, shutdown));
    }

    /// Counts one pool call of `owner` on this replica until the guard is dropped.
    pub fn enter(self: &Arc<Self>, owner: &OwnerKey) -> InFlight {
        *self.lock_mine().entry(owner.as_str().to_owned()).or_default() += 1;
        self.changed.notify_one();
        InFlight { load: Arc::clone(self), owner: owner.as_str().to_owned() }
    }

    /// Pool calls of `owner` in flight on the other replicas, as last published.
    pub fn elsewhere(&self, owner: &OwnerKey) -> usize {
        let now = jiff::Timestamp::now();
        let others = self.others.lock().unwrap_or_else(|e| e.into_inner());
        others.values().filter(|r| r.until > now).filter_map(|r| r.per_owner.get(owner.as_str())).sum()
    }

    fn lock_mine(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, usize>> {
        self.mine.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lease_name(&self) -> String {
        format!("{LEASE_PREFIX}{}", self.me)
    }

    fn lease(&self, settings: &LoadSettings) -> Lease {
        let counts = serde_json::to_string(&*self.lock_mine()).unwrap_or_else(|_| "{}".into());
        Lease {
            metadata: ObjectMeta {
                name: Some(self.lease_name()),
                labels: Some([(LOAD_LABEL.to_owned(), self.me.clone())].into()),
                annotations: Some([(POOL_CALLS_ANNOTATION.to_owned(), counts)].into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.me.clone()),
                lease_duration_seconds: Some(i32::try_from(settings.lease_duration.as_secs()).unwrap_or(i32::MAX)),
                renew_time: Some(MicroTime(jiff::Timestamp::now())),
                ..LeaseSpec::default()
            }),
        }
    }

    async fn publish(self: Arc<Self>, api: Api<Lease>, settings: LoadSettings, shutdown: CancellationToken) {
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let mut failing = false;
        loop {
            let mut lease = serde_json::to_value(self.lease(&settings)).unwrap_or_default();
            lease["apiVersion"] = "coordination.k8s.io/v1".into();
            lease["kind"] = "Lease".into();
            match api.patch(&self.lease_name(), &params, &Patch::Apply(&lease)).await {
                Ok(_) if failing => {
                    failing = false;
                    tracing::info!("publishing this replica's pool calls works again");
                }
                Ok(_) => {}
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(
                        error = %e, namespace = %settings.namespace,
                        "cannot publish this replica's pool calls in its Lease (the gateway needs to \
                         create and patch leases in its namespace); other replicas do not count them"
                    );
                }
                Err(_) => {}
            }
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = self.changed.notified() => {
                    tokio::select! {
                        () = shutdown.cancelled() => break,
                        () = tokio::time::sleep(settings.debounce) => {}
                    }
                }
                () = tokio::time::sleep(settings.heartbeat) => {}
            }
        }
        match api.delete(&self.lease_name(), &DeleteParams::default()).await {
            Ok(_) | Err(kube::Error::Api(_)) => {}
            Err(e) => tracing::warn!(error = %e, "could not delete this replica's load Lease"),
        }
    }

    async fn watch(self: Arc<Self>, api: Api<Lease>, shutdown: CancellationToken) {
        let config = watcher::Config::default().labels(LOAD_LABEL);
        let mut events = watcher::watcher(api, config).default_backoff().boxed();
        let mut relisted: HashMap<String, Report> = HashMap::new();
        loop {
            let event = tokio::select! {
                () = shutdown.cancelled() => return,
                event = events.next() => event,
            };
            match event {
                Some(Ok(Event::Apply(lease))) => {
                    if let Some((name, report)) = self.report_of(&lease) {
                        self.others.lock().unwrap_or_else(|e| e.into_inner()).insert(name, report);
                    }
                }
                Some(Ok(Event::Delete(lease))) => {
                    self.others.lock().unwrap_or_else(|e| e.into_inner()).remove(&lease.name_any());
                }
                Some(Ok(Event::Init)) => relisted.clear(),
                Some(Ok(Event::InitApply(lease))) => {
                    if let Some((name, report)) = self.report_of(&lease) {
                        relisted.insert(name, report);
                    }
                }
                Some(Ok(Event::InitDone)) => {
                    *self.others.lock().unwrap_or_else(|e| e.into_inner()) = std::mem::take(&mut relisted);
                }
                Some(Err(e)) => tracing::warn!(error = %e, "load Lease watch failed; retrying with backoff"),
                None => return,
            }
        }
    }

    /// The report in another replica's Lease (`None` for this replica's own).
    fn report_of(&self, lease: &Lease) -> Option<(String, Report)> {
        if lease.labels().get(LOAD_LABEL).is_some_and(|me| *me == self.me) {
            return None;
        }
        let spec = lease.spec.as_ref()?;
        let renewed = spec.renew_time.as_ref()?.0;
        let until = renewed + Duration::from_secs(u64::try_from(spec.lease_duration_seconds?).unwrap_or(0));
        let per_owner = lease
            .annotations()
            .get(POOL_CALLS_ANNOTATION)
            .and_then(|counts| serde_json::from_str(counts).ok())
            .unwrap_or_default();
        Some((lease.name_any(), Report { until, per_owner }))
    }
}

/// One pool call counted on this replica; dropping it uncounts the call.
#[derive(Debug)]
pub struct InFlight {
    load: Arc<PoolLoad>,
    owner: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut mine = self.load.lock_mine();
        if let Some(n) = mine.get_mut(&self.owner) {
            *n -= 1;
            if *n == 0 {
                mine.remove(&self.owner);
            }
        }
        drop(mine);
        self.load.changed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(replica: &str, renewed: jiff::Timestamp, counts: &str) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(format!("{LEASE_PREFIX}{replica}")),
                labels: Some([(LOAD_LABEL.to_owned(), replica.to_owned())].into()),
                annotations: Some([(POOL_CALLS_ANNOTATION.to_owned(), counts.to_owned())].into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                lease_duration_seconds: Some(30),
                renew_time: Some(MicroTime(renewed)),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn counts_are_kept_per_owner_and_released_by_the_guard() {
        let load = PoolLoad::new("me");
        let alice = OwnerKey::derive("kubernetes", "alice");
        let a = load.enter(&alice);
        let b = load.enter(&alice);
        assert_eq!(load.lock_mine().get(alice.as_str()), Some(&2));
        drop(a);
        assert_eq!(load.lock_mine().get(alice.as_str()), Some(&1));
        drop(b);
        assert!(load.lock_mine().is_empty(), "owners without calls are not published");
        let published = load.lease(&LoadSettings::new("toolyard"));
        assert_eq!(published.annotations()[POOL_CALLS_ANNOTATION], "{}");
        assert_eq!(published.labels()[LOAD_LABEL], "me");
    }

    #[test]
    fn only_other_replicas_fresh_reports_count() {
        let load = PoolLoad::new("me");
        let alice = OwnerKey::derive("kubernetes", "alice");
        let now = jiff::Timestamp::now();
        let counts = format!(r#"{{"{}": 2}}"#, alice.as_str());
        assert!(load.report_of(&lease("me", now, &counts)).is_none(), "its own Lease is not another's");
        for (replica, renewed) in [("b", now), ("c", now - Duration::from_secs(60))] {
            let (name, report) = load.report_of(&lease(replica, renewed, &counts)).expect("a report");
            load.others.lock().unwrap().insert(name, report);
        }
        assert_eq!(load.elsewhere(&alice), 2, "c's Lease expired: that replica died");
        assert_eq!(load.elsewhere(&OwnerKey::derive("kubernetes", "bob")), 0);
        let (_, garbled) = load.report_of(&lease("d", now, "not json")).expect("a report");
        assert!(garbled.per_owner.is_empty());
    }
}

//! The pods of each warm pool, as Kubernetes lists them in the EndpointSlices of the pool's
//! Service, and the calls this replica has in flight on each.
//!
//! A pool call goes to the ready pod with the fewest of this replica's calls (in turn among
//! equals). A pod that does not run it (its slots and queue are full, or it is shutting down)
//! or cannot be connected to passes it on to the next pod, so a call is refused only when
//! every pod refused it. Through the Service instead, each connection would reach a pod picked
//! at random and keep it: calls could wait, or be refused, at one pod while another had free
//! slots.
//!
//! One watch of pool EndpointSlices ([`pool::COMPONENT_LABEL`]) per served namespace, or one
//! for all. Until an EndpointSlice of a pool has been seen (the watch is starting, or the
//! gateway may not read EndpointSlices), its calls go to the pool's Service.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};
use tokio_util::sync::CancellationToken;
use toolyard_api::protocol::pool;

use crate::catalog::kube::{Namespaces, watch_each};

/// The label Kubernetes puts on an EndpointSlice to name its Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// `(namespace, name)` of a Service.
type Service = (String, String);

/// One EndpointSlice: the watch stream that reported it and its ready pods.
#[derive(Debug)]
struct Slice {
    stream: usize,
    pods: Vec<SocketAddr>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Each pool Service's EndpointSlices, by slice name.
    services: HashMap<Service, HashMap<String, Slice>>,
    /// A watch stream's relist in progress: what it has delivered so far.
    relisting: HashMap<usize, Vec<(Service, String, Vec<SocketAddr>)>>,
    /// This replica's calls in flight per pod.
    in_flight: HashMap<SocketAddr, usize>,
    /// Turns among pods with as few calls.
    turn: usize,
}

impl Inner {
    fn insert(&mut self, service: Service, slice: String, stream: usize, pods: Vec<SocketAddr>) {
        self.services.entry(service).or_default().insert(slice, Slice { stream, pods });
    }

    fn remove(&mut self, service: &Service, slice: &str) {
        if let Some(slices) = self.services.get_mut(service) {
            slices.remove(slice);
            if slices.is_empty() {
                self.services.remove(service);
            }
        }
    }
}

/// The ready pods of every pool Service, and this replica's calls on each.
#[derive(Debug, Default)]
pub struct PoolPods {
    inner: Mutex<Inner>,
}

impl PoolPods {
    /// Watches the pool EndpointSlices of `namespaces` until `shutdown`.
    pub fn start(client: &Client, namespaces: &Namespaces, shutdown: &CancellationToken) -> Arc<Self> {
        let pods = Arc::new(Self::default());
        let config = watcher::Config::default().labels(&format!("{}={}", pool::COMPONENT_LABEL, pool::COMPONENT));
        let observer = Arc::clone(&pods);
        watch_each(
            namespaces.apis::<EndpointSlice>(client),
            &config,
            "EndpointSlice",
            shutdown,
            move |stream, event| {
                observer.observe(stream, &event);
            },
        );
        pods
    }

    /// Takes in one event of EndpointSlice watch stream number `stream`.
    pub fn observe(&self, stream: usize, event: &Event<EndpointSlice>) {
        let mut inner = self.lock();
        match event {
            Event::Apply(slice) => {
                if let Some(service) = service_of(slice) {
                    inner.insert(service, slice.name_any(), stream, ready_pods(slice));
                }
            }
            Event::Delete(slice) => {
                if let Some(service) = service_of(slice) {
                    inner.remove(&service, &slice.name_any());
                }
            }
            Event::Init => {
                inner.relisting.insert(stream, Vec::new());
            }
            Event::InitApply(slice) => {
                if let Some(service) = service_of(slice) {
                    let entry = (service, slice.name_any(), ready_pods(slice));
                    inner.relisting.entry(stream).or_default().push(entry);
                }
            }
            Event::InitDone => {
                let fresh = inner.relisting.remove(&stream).unwrap_or_default();
                for slices in inner.services.values_mut() {
                    slices.retain(|_, s| s.stream != stream);
                }
                inner.services.retain(|_, slices| !slices.is_empty());
                for (service, slice, pods) in fresh {
                    inner.insert(service, slice, stream, pods);
                }
            }
        }
    }

    /// Whether an EndpointSlice of Service `service` of `namespace` has been seen (it may
    /// list no ready pod).
    pub fn seen(&self, namespace: &str, service: &str) -> bool {
        self.lock().services.contains_key(&(namespace.to_owned(), service.to_owned()))
    }

    /// The ready pod behind Service `service` of `namespace`, other than those `tried`, with
    /// the fewest of this replica's calls (in turn among equals), counting one more call on it
    /// until the returned guard is dropped. `None` when no such pod is left.
    pub fn choose(self: &Arc<Self>, namespace: &str, service: &str, tried: &[SocketAddr]) -> Option<OnPod> {
        let mut inner = self.lock();
        let slices = inner.services.get(&(namespace.to_owned(), service.to_owned()))?;
        let mut pods: Vec<SocketAddr> =
            slices.values().flat_map(|s| s.pods.iter().copied()).filter(|p| !tried.contains(p)).collect();
        pods.sort_unstable();
        pods.dedup();
        let load = |p: &SocketAddr| inner.in_flight.get(p).copied().unwrap_or(0);
        let least = pods.iter().map(load).min()?;
        let equals: Vec<SocketAddr> = pods.into_iter().filter(|p| load(p) == least).collect();
        let pod = equals[inner.turn % equals.len()];
        inner.turn = inner.turn.wrapping_add(1);
        *inner.in_flight.entry(pod).or_default() += 1;
        Some(OnPod { pods: Arc::clone(self), addr: pod })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One call on one pod, counted until dropped.
#[derive(Debug)]
pub struct OnPod {
    pods: Arc<PoolPods>,
    addr: SocketAddr,
}

impl OnPod {
    /// The pod's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The pod's base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for OnPod {
    fn drop(&mut self) {
        let mut inner = self.pods.lock();
        if let Some(n) = inner.in_flight.get_mut(&self.addr) {
            *n -= 1;
            if *n == 0 {
                inner.in_flight.remove(&self.addr);
            }
        }
    }
}

/// The pool Service `slice` belongs to.
fn service_of(slice: &EndpointSlice) -> Option<Service> {
    let service = slice.labels().get(SERVICE_NAME_LABEL)?;
    Some((slice.namespace().unwrap_or_default(), service.clone()))
}

/// The addresses of the ready endpoints of `slice`, on its port named [`pool::PORT_NAME`]
/// (a slice without that port lists none).
fn ready_pods(slice: &EndpointSlice) -> Vec<SocketAddr> {
    let port = slice
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some(pool::PORT_NAME))
        .and_then(|p| p.port)
        .and_then(|p| u16::try_from(p).ok());
    let Some(port) = port else { return Vec::new() };
    slice
        .endpoints
        .iter()
        // Kubernetes: a missing `ready` means ready.
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
        .flat_map(|e| e.addresses.iter())
        .filter_map(|a| a.parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, port))
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn slice(name: &str, service: &str, port: u16, endpoints: &[(&str, bool)]) -> EndpointSlice {
        let endpoints: Vec<_> =
            endpoints.iter().map(|(ip, ready)| json!({"addresses": [ip], "conditions": {"ready": ready}})).collect();
        serde_json::from_value(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": "ns", "labels": {SERVICE_NAME_LABEL: service}},
            "addressType": "IPv4",
            "ports": [{"name": pool::PORT_NAME, "port": port, "protocol": "TCP"}],
            "endpoints": endpoints,
        }))
        .unwrap()
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn calls_go_to_the_ready_pod_with_the_fewest_calls_in_turn() {
        let pods = Arc::new(PoolPods::default());
        assert!(!pods.seen("ns", "p-pool"));
        pods.observe(0, &Event::Apply(slice("p-pool-1", "p-pool", 8080, &[("10.0.0.1", true), ("10.0.0.9", false)])));
        pods.observe(0, &Event::Apply(slice("p-pool-2", "p-pool", 8080, &[("10.0.0.2", true)])));
        assert!(pods.seen("ns", "p-pool"));
        let first = pods.choose("ns", "p-pool", &[]).unwrap();
        let second = pods.choose("ns", "p-pool", &[]).unwrap();
        let mut both = [first.addr(), second.addr()];
        both.sort();
        assert_eq!(both, [addr("10.0.0.1:8080"), addr("10.0.0.2:8080")], "the unready pod gets no call");
        let left = first.addr();
        drop(first);
        let next = pods.choose("ns", "p-pool", &[]).unwrap();
        assert_eq!(next.addr(), left, "the pod a call just left has the fewest");
        assert!(pods.choose("ns", "p-pool", &[addr("10.0.0.1:8080"), addr("10.0.0.2:8080")]).is_none());
        assert!(pods.choose("ns", "other-pool", &[]).is_none());
    }

    #[test]
    fn slices_come_and_go_and_a_relist_replaces_them() {
        let pods = Arc::new(PoolPods::default());
        pods.observe(0, &Event::Apply(slice("p-pool-1", "p-pool", 8080, &[("10.0.0.1", false)])));
        assert!(pods.seen("ns", "p-pool"));
        assert!(pods.choose("ns", "p-pool", &[]).is_none(), "no ready pod");
        pods.observe(0, &Event::Init);
        pods.observe(0, &Event::InitApply(slice("p-pool-2", "p-pool", 9090, &[("10.0.0.2", true)])));
        assert!(pods.choose("ns", "p-pool", &[]).is_none(), "the old state holds until the relist is done");
        pods.observe(0, &Event::InitDone);
        let on = pods.choose("ns", "p-pool", &[]).unwrap();
        assert_eq!(on.addr(), addr("10.0.0.2:9090"));
        pods.observe(0, &Event::Delete(slice("p-pool-2", "p-pool", 9090, &[])));
        assert!(!pods.seen("ns", "p-pool"));
        drop(on);
        assert!(pods.lock().in_flight.is_empty(), "a finished call leaves no count behind");
    }
}

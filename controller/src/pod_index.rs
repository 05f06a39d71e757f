//! Run pods by the run they belong to, kept from the pods' watch events.
//!
//! The reflector's store finds a pod by its name only, and a Job's pod is named by the Job
//! controller (`<job>-<random>`). Without this index, every pass over a run that has a Job
//! scanned every cached pod: its cost grew with the runs present (the finished ones kept
//! until their retention ends), not with the run itself.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::watcher;

type Runs = HashMap<(String, String), BTreeSet<String>>;

#[derive(Default)]
struct Inner {
    live: Runs,
    /// A relist in progress: built apart and swapped in at its end, so lookups meanwhile see
    /// the previous state rather than a partial one (as the reflector's store does).
    relist: Option<Runs>,
}

/// Pod names by (namespace, run name), the run name read from the pod's run label.
#[derive(Clone)]
pub struct PodsByRun {
    label: &'static str,
    inner: Arc<RwLock<Inner>>,
}

impl PodsByRun {
    /// An empty index of the pods labelled `label` (`toolyard.dev/call` or `toolyard.dev/task`).
    pub fn new(label: &'static str) -> Self {
        Self { label, inner: Arc::default() }
    }

    fn key(&self, pod: &Pod) -> Option<((String, String), String)> {
        let run = pod.labels().get(self.label)?.clone();
        Some(((pod.namespace()?, run), pod.name_any()))
    }

    /// Applies one event of the pods' watch.
    pub fn apply(&self, event: &watcher::Event<Pod>) {
        let mut inner = self.inner.write().expect("pod index lock");
        match event {
            watcher::Event::Init => inner.relist = Some(Runs::new()),
            watcher::Event::InitApply(pod) => {
                if let (Some(relist), Some((run, name))) = (inner.relist.as_mut(), self.key(pod)) {
                    relist.entry(run).or_default().insert(name);
                }
            }
            watcher::Event::InitDone => {
                if let Some(relist) = inner.relist.take() {
                    inner.live = relist;
                }
            }
            watcher::Event::Apply(pod) => {
                if let Some((run, name)) = self.key(pod) {
                    inner.live.entry(run).or_default().insert(name);
                }
            }
            watcher::Event::Delete(pod) => {
                if let Some((run, name)) = self.key(pod)
                    && let Some(names) = inner.live.get_mut(&run)
                {
                    names.remove(&name);
                    if names.is_empty() {
                        inner.live.remove(&run);
                    }
                }
            }
        }
    }

    /// The names of run `name`'s pods in `ns`.
    pub fn pods_of(&self, ns: &str, name: &str) -> Vec<String> {
        let inner = self.inner.read().expect("pod index lock");
        inner
            .live
            .get(&(ns.to_owned(), name.to_owned()))
            .map(|names| names.iter().cloned().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str, run: &str) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.namespace = Some(ns.to_owned());
        pod.metadata.name = Some(name.to_owned());
        pod.metadata.labels = Some([("toolyard.dev/call".to_owned(), run.to_owned())].into());
        pod
    }

    #[test]
    fn pods_are_found_by_their_run_and_a_relist_replaces_the_index_at_its_end() {
        let index = PodsByRun::new("toolyard.dev/call");
        index.apply(&watcher::Event::Apply(pod("a", "c1-x1", "c1")));
        index.apply(&watcher::Event::Apply(pod("a", "c1-x2", "c1")));
        index.apply(&watcher::Event::Apply(pod("b", "c1-y1", "c1")));
        index.apply(&watcher::Event::Apply(Pod::default()));
        assert_eq!(index.pods_of("a", "c1"), ["c1-x1", "c1-x2"]);
        assert_eq!(index.pods_of("b", "c1"), ["c1-y1"]);
        index.apply(&watcher::Event::Delete(pod("a", "c1-x1", "c1")));
        assert_eq!(index.pods_of("a", "c1"), ["c1-x2"]);

        // A relist: until it ends, lookups see the state before it.
        index.apply(&watcher::Event::Init);
        index.apply(&watcher::Event::InitApply(pod("a", "c2-z1", "c2")));
        assert_eq!(index.pods_of("a", "c1"), ["c1-x2"]);
        assert!(index.pods_of("a", "c2").is_empty());
        index.apply(&watcher::Event::InitDone);
        assert!(index.pods_of("a", "c1").is_empty(), "gone from the relist");
        assert_eq!(index.pods_of("a", "c2"), ["c2-z1"]);
    }
}

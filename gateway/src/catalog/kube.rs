//! [`ToolCatalog`] from McpTool objects: a watch (kube-runtime watcher) per served namespace,
//! or one cluster-wide. The McpPrompts of the same namespaces come with it
//! ([`DeclaredPrompts`]).
//!
//! Only tools whose `Ready` condition is True for their current generation are listed.
//! Input schemas are compiled once per (uid, generation). When two McpTools in served
//! namespaces declare the same MCP name, the oldest wins (then namespace/name order) and
//! the others are logged and left out, so a name always means one tool.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};

use futures::StreamExt;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use serde_json::Value;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use toolyard_api::McpTool;
use toolyard_api::mcptool::ExecutionMode;

use super::prompts::DeclaredPrompts;
use super::{Prompt, Tool, ToolCatalog, compile_schema};

/// Which namespaces the gateway serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Namespaces {
    /// Every namespace (one cluster-wide watch; needs cluster-wide list/watch).
    All,
    /// These namespaces only (one watch each).
    Only(Vec<String>),
}

impl Namespaces {
    /// From a list of names; empty or `*` means all.
    pub fn from_list(names: &[String]) -> Self {
        let names: Vec<String> = names.iter().map(|n| n.trim().to_owned()).filter(|n| !n.is_empty()).collect();
        if names.is_empty() || names.iter().any(|n| n == "*") {
            Namespaces::All
        } else {
            let mut names = names;
            names.sort();
            names.dedup();
            Namespaces::Only(names)
        }
    }

    /// One API handle per watch.
    pub fn apis<K>(&self, client: &Client) -> Vec<Api<K>>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        match self {
            Namespaces::All => vec![Api::all(client.clone())],
            Namespaces::Only(names) => names.iter().map(|ns| Api::namespaced(client.clone(), ns)).collect(),
        }
    }

    /// True when `namespace` is served.
    pub fn contains(&self, namespace: &str) -> bool {
        match self {
            Namespaces::All => true,
            Namespaces::Only(names) => names.iter().any(|n| n == namespace),
        }
    }
}

/// Follows each API in `apis` with a watch (kube's default backoff) until `shutdown`, passing
/// each event to `on_event` with the index of its watch in `apis`. `what` names the kind in
/// the log of a failed watch.
pub fn watch_each<K>(
    apis: Vec<Api<K>>,
    config: &watcher::Config,
    what: &'static str,
    shutdown: &CancellationToken,
    on_event: impl Fn(usize, Event<K>) + Send + Sync + 'static,
) where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let on_event = Arc::new(on_event);
    for (index, api) in apis.into_iter().enumerate() {
        let on_event = Arc::clone(&on_event);
        let shutdown = shutdown.clone();
        let mut events = watcher::watcher(api, config.clone()).default_backoff().boxed();
        tokio::spawn(async move {
            loop {
                let event = tokio::select! {
                    () = shutdown.cancelled() => return,
                    event = events.next() => event,
                };
                match event {
                    Some(Ok(event)) => on_event(index, event),
                    Some(Err(e)) => tracing::warn!(error = %e, "{what} watch failed; retrying with backoff"),
                    None => return,
                }
            }
        });
    }
}

/// Keeps one reflector store per API in `apis` current (a watch each, with kube's default
/// backoff) until `shutdown`, and calls `changed` with every store after each change, except
/// while a watch (re)lists. `what` names the kind in the log of a failed watch.
pub fn reflect_all<K>(
    apis: Vec<Api<K>>,
    what: &'static str,
    shutdown: CancellationToken,
    changed: impl Fn(&[Store<K>]) + Send + 'static,
) -> Vec<Store<K>>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let (stores, writers): (Vec<Store<K>>, Vec<_>) = apis.iter().map(|_| reflector::store()).unzip();
    // One lock for the writers and `changed`: watches of different namespaces take turns.
    let reflected = Mutex::new((writers, changed, stores.clone()));
    watch_each(apis, &watcher::Config::default(), what, &shutdown, move |index, event| {
        let mut guard = reflected.lock().unwrap_or_else(|e| e.into_inner());
        let (writers, changed, stores) = &mut *guard;
        writers[index].apply_watcher_event(&event);
        if !matches!(event, Event::Init | Event::InitApply(_)) {
            changed(stores);
        }
    });
    stores
}

/// Objects seen by one watch, keyed by (namespace, name).
#[derive(Default)]
struct StreamState {
    objects: BTreeMap<(String, String), Arc<McpTool>>,
    /// Objects of a relist in progress (between `Init` and `InitDone`).
    relist: Option<BTreeMap<(String, String), Arc<McpTool>>>,
    synced: bool,
}

/// The listed tools, sorted by name (lookups binary-search them).
#[derive(Default)]
struct Snapshot {
    tools: Arc<[Arc<Tool>]>,
    /// What identifies the listed set, to bump the version only on real changes.
    fingerprint: Vec<(String, String, i64, Option<String>)>,
}

/// Built tools and already-logged problems, by (uid, generation): a rebuild after one
/// object changed builds that one alone (a tool's pool endpoint, from its status, may change
/// within a generation: then it is rebuilt with the same validator).
#[derive(Default)]
struct Compiled {
    tools: HashMap<(String, i64), Arc<Tool>>,
    warned: HashSet<(String, i64)>,
}

struct Shared {
    streams: Mutex<Vec<StreamState>>,
    compiled: Mutex<Compiled>,
    snapshot: RwLock<Snapshot>,
    version: watch::Sender<u64>,
}

/// Tools from McpTool objects, and prompts from McpPrompt objects, kept current by watches.
#[derive(Clone)]
pub struct KubeCatalog {
    shared: Arc<Shared>,
    prompts: Arc<DeclaredPrompts>,
}

impl std::fmt::Debug for KubeCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeCatalog").field("synced", &self.is_synced()).finish_non_exhaustive()
    }
}

impl KubeCatalog {
    /// Starts watching McpTools and McpPrompts in `namespaces`; the watches stop when
    /// `shutdown` fires.
    pub fn start(client: Client, namespaces: &Namespaces, shutdown: CancellationToken) -> Self {
        let apis: Vec<Api<McpTool>> = namespaces.apis(&client);
        let shared = Arc::new(Shared {
            streams: Mutex::new(apis.iter().map(|_| StreamState::default()).collect()),
            compiled: Mutex::new(Compiled::default()),
            snapshot: RwLock::new(Snapshot::default()),
            version: watch::channel(0).0,
        });
        let applied = shared.clone();
        watch_each(apis, &watcher::Config::default(), "McpTool", &shutdown, move |index, event| {
            applied.apply(index, event);
        });
        let bump = shared.clone();
        let prompts = DeclaredPrompts::watch(namespaces.apis(&client), shutdown, move || {
            bump.version.send_modify(|v| *v += 1);
        });
        Self { shared, prompts }
    }
}

impl Shared {
    fn apply(&self, index: usize, event: Event<McpTool>) {
        let rebuild = {
            let mut streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
            let stream = &mut streams[index];
            match event {
                Event::Init => {
                    stream.relist = Some(BTreeMap::new());
                    false
                }
                Event::InitApply(obj) => {
                    let obj = trimmed(obj);
                    let key = (obj.namespace().unwrap_or_default(), obj.name_any());
                    stream.relist.get_or_insert_default().insert(key, Arc::new(obj));
                    false
                }
                Event::InitDone => {
                    stream.objects = stream.relist.take().unwrap_or_default();
                    stream.synced = true;
                    true
                }
                Event::Apply(obj) => {
                    let obj = trimmed(obj);
                    let key = (obj.namespace().unwrap_or_default(), obj.name_any());
                    stream.objects.insert(key, Arc::new(obj));
                    stream.synced
                }
                Event::Delete(obj) => {
                    let key = (obj.namespace().unwrap_or_default(), obj.name_any());
                    stream.objects.remove(&key);
                    stream.synced
                }
            }
        };
        if rebuild {
            self.rebuild();
        }
    }

    /// Recomputes the listed tools from every stream's objects.
    fn rebuild(&self) {
        let objects: Vec<Arc<McpTool>> = {
            let streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
            streams.iter().flat_map(|s| s.objects.values().cloned()).collect()
        };
        let tools = {
            let mut compiled = self.compiled.lock().unwrap_or_else(|e| e.into_inner());
            build_tools(&objects, &mut compiled)
        };
        let fingerprint: Vec<_> = tools
            .iter()
            .map(|t| (t.namespace.clone(), t.object_name.clone(), t.generation, t.endpoint.clone()))
            .collect();
        let mut snapshot = self.snapshot.write().unwrap_or_else(|e| e.into_inner());
        if snapshot.fingerprint == fingerprint {
            return;
        }
        snapshot.tools = tools.into();
        snapshot.fingerprint = fingerprint;
        drop(snapshot);
        self.version.send_modify(|v| *v += 1);
    }
}

/// `obj` without what the catalog never reads and can be large: its managed fields and
/// `kubectl apply`'s copy of the whole object in an annotation.
fn trimmed(mut obj: McpTool) -> McpTool {
    obj.managed_fields_mut().clear();
    obj.annotations_mut().remove("kubectl.kubernetes.io/last-applied-configuration");
    obj
}

/// The Ready tools among `objects`, one per MCP name, sorted by name.
fn build_tools(objects: &[Arc<McpTool>], compiled: &mut Compiled) -> Vec<Arc<Tool>> {
    let mut candidates: Vec<&Arc<McpTool>> = objects.iter().filter(|o| o.is_ready()).collect();
    // Oldest first, then namespace/name: the first of each MCP name wins.
    candidates.sort_by(|a, b| {
        let created = |o: &McpTool| o.metadata.creation_timestamp.as_ref().map(|t| t.0);
        created(a)
            .cmp(&created(b))
            .then_with(|| a.namespace().cmp(&b.namespace()))
            .then_with(|| a.name_any().cmp(&b.name_any()))
    });
    let mut live = HashSet::new();
    let mut by_name: BTreeMap<String, Arc<Tool>> = BTreeMap::new();
    for obj in candidates {
        let uid = obj.uid().unwrap_or_default();
        let generation = obj.metadata.generation.unwrap_or(0);
        let key = (uid, generation);
        live.insert(key.clone());
        let namespace = obj.namespace().unwrap_or_default();
        let name = obj.name_any();
        if let Some(winner) = by_name.get(&obj.spec.name) {
            if compiled.warned.insert(key.clone()) {
                tracing::warn!(
                    tool = %obj.spec.name, namespace = %namespace, mcptool = %name,
                    served_from = %format!("{}/{}", winner.namespace, winner.object_name),
                    "duplicate MCP tool name; this McpTool is not served"
                );
            }
            continue;
        }
        let endpoint = match obj.spec.execution.mode {
            ExecutionMode::Pool => obj.status.as_ref().and_then(|s| s.endpoint.clone()),
            ExecutionMode::Job => None,
        };
        let tool = match compiled.tools.get(&key) {
            Some(built) if built.endpoint == endpoint => built.clone(),
            Some(built) => {
                let validator = built.validator.clone();
                Arc::new(
                    Tool::with_validator(namespace, name, generation, obj.spec.clone(), validator)
                        .with_endpoint(endpoint),
                )
            }
            None => match compile_schema(&Value::Object(obj.spec.input_schema.clone())) {
                Ok(validator) => Arc::new(
                    Tool::with_validator(namespace, name, generation, obj.spec.clone(), Arc::new(validator))
                        .with_endpoint(endpoint),
                ),
                Err(e) => {
                    if compiled.warned.insert(key.clone()) {
                        tracing::warn!(namespace = %namespace, mcptool = %name, error = %e, "McpTool not served");
                    }
                    continue;
                }
            },
        };
        compiled.tools.insert(key, tool.clone());
        by_name.insert(tool.spec.name.clone(), tool);
    }
    compiled.tools.retain(|k, _| live.contains(k));
    compiled.warned.retain(|k| live.contains(k));
    by_name.into_values().collect()
}

impl ToolCatalog for KubeCatalog {
    fn tools(&self) -> Arc<[Arc<Tool>]> {
        self.shared.snapshot.read().unwrap_or_else(|e| e.into_inner()).tools.clone()
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.shared.version.subscribe()
    }

    fn is_synced(&self) -> bool {
        self.shared.streams.lock().unwrap_or_else(|e| e.into_inner()).iter().all(|s| s.synced)
    }

    fn prompts(&self) -> Vec<Arc<Prompt>> {
        self.prompts.list()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;
    use toolyard_api::conditions;

    use super::*;

    fn mcptool(ns: &str, name: &str, tool: &str, uid: &str, created: i64, ready: bool) -> Arc<McpTool> {
        let mut obj: McpTool = serde_json::from_value(json!({
            "apiVersion": "toolyard.dev/v1alpha1", "kind": "McpTool",
            "metadata": {"name": name, "namespace": ns, "uid": uid, "generation": 2},
            "spec": {
                "name": tool, "description": "d",
                "inputSchema": {"type": "object", "properties": {"x": {"type": "number"}}},
                "runtime": {"image": "img", "command": ["run"]}
            }
        }))
        .unwrap();
        obj.metadata.creation_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::from_second(created).unwrap()));
        let status = if ready { conditions::status::TRUE } else { conditions::status::FALSE };
        obj.status = Some(toolyard_api::McpToolStatus {
            conditions: vec![conditions::ready(status, conditions::reason::VALID, "", Some(2))],
            ..Default::default()
        });
        Arc::new(obj)
    }

    #[test]
    fn only_ready_tools_are_listed_sorted_by_name() {
        let mut c = Compiled::default();
        let tools = build_tools(
            &[
                mcptool("a", "zeta", "zeta", "u1", 1, true),
                mcptool("a", "alpha", "alpha", "u2", 2, true),
                mcptool("a", "broken", "broken", "u3", 3, false),
            ],
            &mut c,
        );
        let names: Vec<&str> = tools.iter().map(|t| t.name()).collect();
        assert_eq!(names, ["alpha", "zeta"]);
        assert_eq!(tools[0].generation, 2);
        assert!(tools[0].validate(&json!({"x": "no"})).is_err());
    }

    #[test]
    fn duplicate_names_keep_the_oldest_and_built_tools_are_reused() {
        let mut c = Compiled::default();
        let objs = [mcptool("b", "p2", "price", "new", 20, true), mcptool("a", "p1", "price", "old", 10, true)];
        let first = build_tools(&objs, &mut c);
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].namespace, "a", "the oldest object wins");
        let again = build_tools(&objs, &mut c);
        assert!(Arc::ptr_eq(&first[0], &again[0]), "built once per uid+generation");
    }

    #[test]
    fn namespaces_from_flags() {
        assert_eq!(Namespaces::from_list(&[]), Namespaces::All);
        assert_eq!(Namespaces::from_list(&["*".into()]), Namespaces::All);
        assert_eq!(
            Namespaces::from_list(&["b".into(), " a ".into(), "b".into()]),
            Namespaces::Only(vec!["a".into(), "b".into()])
        );
    }
}

//! Upstream MCP servers (McpServer objects): a second tool source next to the functions.
//!
//! [`Upstreams`] is the gateway's catalog: the functions' catalog plus the tools of every
//! connected server. Each server has one connection ([`link::Connection`]) held by one task:
//! it connects, lists the tools, lists them again when the server says they changed, pings
//! the server every `ping_interval`, and after a failure waits the server's next reconnect
//! delay (30 s, 1 min, then 5 min by default; the last one repeats). A server's failures
//! touch only its own task: its tools leave the catalog while it is away and come back (with a
//! `list_changed` to clients) once it answers again.
//!
//! Its resources and resource templates are served with their URIs unchanged (a URI another
//! server listed first is left out), to whoever may use the whole server.
//!
//! A server's tool is served as `<prefix><name>` (characters other than letters, digits and
//! '_' become '_'). A name already taken (by a function, a built-in or a server listed
//! before it, in namespace/name order) is left out and reported in the server's status.
//! Each state change is reported through a [`StatusSink`] (the McpServer's status on
//! Kubernetes, the log locally).

pub mod kube;
pub mod link;
pub mod logs;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use http::{HeaderName, HeaderValue};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use toolyard_api::mcpserver::{Connection as ConnectionStatus, ConnectionState, McpServerSpec, UpstreamAuth};
use toolyard_api::mcptool::{Execution, ExecutionMode, McpToolSpec, RESERVED_TOOL_NAMES, Runtime, ToolAnnotations};

pub use self::link::Endpoint;
use self::link::{Connection, Link, Listing};
use crate::catalog::{
    CompletionSource, Prompt, PromptSource, ResourceSource, ServedResource, Tool, ToolCatalog, Upstream,
};
use crate::executor::local::LaunchSettings;
use crate::executor::pool::CallRecords;

/// Longest tool name served (MCP allows 128 characters).
pub const MAX_TOOL_NAME: usize = 128;

/// One McpServer as the gateway should connect to it.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerConfig {
    /// Namespace of the McpServer (empty locally).
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its `metadata.generation`.
    pub generation: i64,
    /// Its spec.
    pub spec: McpServerSpec,
    /// False while a `runtime` server has no pod available (the controller's `Ready`): no
    /// attempt is made until it has one.
    pub available: bool,
}

impl ServerConfig {
    fn key(&self) -> Key {
        (self.namespace.clone(), self.name.clone())
    }

    fn display(&self) -> String {
        if self.namespace.is_empty() { self.name.clone() } else { format!("{}/{}", self.namespace, self.name) }
    }
}

type Key = (String, String);

/// Where each state change of a server's connection goes.
#[async_trait]
pub trait StatusSink: Send + Sync + 'static {
    /// This replica's connection to server `name` in `namespace` is now `connection`.
    async fn report(&self, namespace: &str, name: &str, connection: &ConnectionStatus);

    /// This replica stops: its connection to server `name` is no longer reported.
    async fn withdraw(&self, namespace: &str, name: &str) {
        let _ = (namespace, name);
    }
}

/// Where each server is reached, on this backend: a `url` server at its URL (with the
/// credential of its `auth`, read at each connection attempt, so a changed Secret is used from
/// the next one on), a `runtime` server through the cluster's Service or as a local process.
#[async_trait]
pub trait Dialer: Send + Sync + 'static {
    /// How to reach `server` now.
    async fn endpoint(&self, server: &ServerConfig) -> Result<Endpoint, String>;
}

/// The local mode's [`Dialer`]: URLs without credentials (manifests with `auth` are refused
/// when loaded), `runtime` commands started on this machine as [`LaunchSettings`] says.
#[derive(Debug)]
pub struct LocalDialer {
    launch: LaunchSettings,
}

impl LocalDialer {
    /// Starts runtime commands as `launch` says (in the tools folder, interpreters resolved).
    pub fn new(launch: LaunchSettings) -> Self {
        Self { launch }
    }
}

#[async_trait]
impl Dialer for LocalDialer {
    async fn endpoint(&self, server: &ServerConfig) -> Result<Endpoint, String> {
        let spec = &server.spec;
        if spec.auth.is_some() {
            return Err("credentials from Secrets are not available in local mode".into());
        }
        match (&spec.url, &spec.runtime) {
            (Some(url), _) => Ok(Endpoint::Http { url: url.clone(), credential: None }),
            (None, Some(runtime)) => {
                let launch = self.launch.launch_runtime(runtime);
                Ok(match &spec.streamable_http {
                    Some(http) => {
                        Endpoint::HttpProcess { launch, url: format!("http://127.0.0.1:{}{}", http.port, http.path) }
                    }
                    None => Endpoint::Process(launch),
                })
            }
            (None, None) => Err("the McpServer has neither url nor runtime".into()),
        }
    }
}

/// `<header>: <scheme> <value>` (`<value>` alone with an empty scheme), never logged.
pub fn credential_header(auth: &UpstreamAuth, value: &str) -> Result<(HeaderName, HeaderValue), String> {
    let name =
        HeaderName::try_from(auth.header.as_str()).map_err(|_| format!("{:?} is not a header name", auth.header))?;
    let value = value.trim();
    let text = if auth.scheme.is_empty() { value.to_owned() } else { format!("{} {value}", auth.scheme) };
    let mut value = HeaderValue::try_from(text).map_err(|_| "the credential is not a valid header value".to_owned())?;
    value.set_sensitive(true);
    Ok((name, value))
}

/// Reports connection changes in the log (local mode).
#[derive(Debug, Default)]
pub struct LogStatus;

#[async_trait]
impl StatusSink for LogStatus {
    async fn report(&self, _namespace: &str, name: &str, c: &ConnectionStatus) {
        match c.state {
            ConnectionState::Connected => {
                tracing::info!(server = name, tools = c.tools, skipped = ?c.skipped, "MCP server connected")
            }
            ConnectionState::Connecting => tracing::info!(server = name, "connecting to the MCP server"),
            ConnectionState::Waiting => tracing::warn!(
                server = name,
                error = c.last_error.as_deref().unwrap_or_default(),
                failures = c.failures,
                next_retry = c.next_retry.as_ref().map(|t| t.0.to_string()).unwrap_or_default(),
                "MCP server unavailable"
            ),
        }
    }
}

/// How connections behave.
#[derive(Clone, Debug)]
pub struct UpstreamSettings {
    /// This replica's name in status entries.
    pub replica: String,
    /// Limit of a connection's handshake and of a tool listing.
    pub connect_timeout: Duration,
    /// How often a connected server is pinged.
    pub ping_interval: Duration,
    /// How often this replica rewrites its status entries (Kubernetes); another replica's
    /// entry not rewritten for three times this long is removed.
    pub status_interval: Duration,
}

/// The upstream servers' flags, shared by `serve` and `local`.
#[derive(clap::Args, Clone, Debug)]
pub struct UpstreamArgs {
    /// Seconds between pings of each connected MCP server (a server that stops answering is
    /// noticed within this time plus the connect timeout).
    #[arg(long, env = "TOOLYARD_UPSTREAM_PING_SECONDS", default_value_t = 15, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub upstream_ping_seconds: u64,
    /// Seconds an MCP server has to complete the handshake, a tool listing or a ping.
    #[arg(long, env = "TOOLYARD_UPSTREAM_CONNECT_TIMEOUT_SECONDS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=300))]
    pub upstream_connect_timeout_seconds: u64,
    /// Seconds between rewrites of this replica's entry in each McpServer's status; an entry
    /// not rewritten for three times this long (a replica that was killed) is removed by the
    /// other replicas.
    #[arg(long, env = "TOOLYARD_UPSTREAM_STATUS_SECONDS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub upstream_status_seconds: u64,
}

impl Default for UpstreamArgs {
    fn default() -> Self {
        Self { upstream_ping_seconds: 15, upstream_connect_timeout_seconds: 10, upstream_status_seconds: 60 }
    }
}

impl UpstreamArgs {
    /// The settings of replica `replica`.
    pub fn settings(&self, replica: String) -> UpstreamSettings {
        UpstreamSettings {
            replica,
            connect_timeout: Duration::from_secs(self.upstream_connect_timeout_seconds),
            ping_interval: Duration::from_secs(self.upstream_ping_seconds),
            status_interval: Duration::from_secs(self.upstream_status_seconds),
        }
    }
}

impl Default for UpstreamSettings {
    fn default() -> Self {
        Self {
            replica: "local".into(),
            connect_timeout: Duration::from_secs(10),
            ping_interval: Duration::from_secs(15),
            status_interval: Duration::from_secs(60),
        }
    }
}

struct Server {
    config: ServerConfig,
    link: Arc<Link>,
    status: watch::Sender<ConnectionStatus>,
    /// Its tools and prompts as it listed them (none while it is not connected).
    listed: Listing,
    stop: CancellationToken,
}

struct Inner {
    functions: Arc<dyn ToolCatalog>,
    settings: UpstreamSettings,
    http: reqwest::Client,
    sink: Arc<dyn StatusSink>,
    dialer: Arc<dyn Dialer>,
    records: Option<Arc<CallRecords>>,
    servers: Mutex<BTreeMap<Key, Server>>,
    /// The served tools, sorted by name.
    tools: RwLock<Arc<[Arc<Tool>]>>,
    prompts: RwLock<Arc<Vec<Arc<Prompt>>>>,
    resources: RwLock<Arc<Vec<Arc<ServedResource>>>>,
    version: watch::Sender<u64>,
    background: CancellationToken,
}

/// The catalog of functions and upstream servers' tools; see the module documentation.
#[derive(Clone)]
pub struct Upstreams {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Upstreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstreams").field("settings", &self.inner.settings).finish_non_exhaustive()
    }
}

impl Upstreams {
    /// The catalog over `functions`, with no server yet ([`Upstreams::apply`] sets them);
    /// connection states go to `sink`, `dialer` says how each server is reached, `records`
    /// stores each call's files (the executor's: flushed with it). Its tasks stop with
    /// `background`.
    pub fn new(
        functions: Arc<dyn ToolCatalog>,
        settings: UpstreamSettings,
        sink: Arc<dyn StatusSink>,
        dialer: Arc<dyn Dialer>,
        records: Option<Arc<CallRecords>>,
        background: CancellationToken,
    ) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .connect_timeout(settings.connect_timeout)
            .build()
            .map_err(|e| anyhow::anyhow!("building the upstream HTTP client: {e}"))?;
        let this = Self {
            inner: Arc::new(Inner {
                functions,
                settings,
                http,
                sink,
                dialer,
                records,
                servers: Mutex::default(),
                tools: RwLock::default(),
                prompts: RwLock::default(),
                resources: RwLock::default(),
                version: watch::Sender::new(1),
                background,
            }),
        };
        this.rebuild();
        let mut changes = this.inner.functions.changes();
        let weak = Arc::downgrade(&this.inner);
        let stop = this.inner.background.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    changed = changes.changed() => if changed.is_err() { return },
                }
                let Some(inner) = weak.upgrade() else { return };
                Upstreams { inner }.rebuild();
            }
        });
        Ok(this)
    }

    /// Connects to exactly these servers: new ones are started, changed ones restarted,
    /// missing ones closed.
    pub fn apply(&self, configs: Vec<ServerConfig>) {
        let wanted: BTreeMap<Key, ServerConfig> = configs.into_iter().map(|c| (c.key(), c)).collect();
        let mut servers = self.inner.servers.lock().unwrap_or_else(|e| e.into_inner());
        let mut changed = false;
        servers.retain(|key, server| {
            let keep = wanted.get(key).is_some_and(|c| *c == server.config);
            if !keep {
                server.stop.cancel();
                let l = &server.listed;
                changed |=
                    !(l.tools.is_empty() && l.prompts.is_empty() && l.resources.is_empty() && l.templates.is_empty());
            }
            keep
        });
        for (key, config) in wanted {
            if servers.contains_key(&key) {
                continue;
            }
            let server = self.start(config);
            servers.insert(key, server);
        }
        drop(servers);
        if changed {
            self.rebuild();
        }
    }

    /// Closes every connection and withdraws this replica's status entries (at shutdown).
    pub async fn withdraw_all(&self) {
        let keys: Vec<Key> = {
            let mut servers = self.inner.servers.lock().unwrap_or_else(|e| e.into_inner());
            servers.values().for_each(|s| s.stop.cancel());
            std::mem::take(&mut *servers).into_keys().collect()
        };
        for (namespace, name) in keys {
            self.inner.sink.withdraw(&namespace, &name).await;
        }
    }

    /// How connections behave.
    pub fn settings(&self) -> &UpstreamSettings {
        &self.inner.settings
    }

    /// This replica's connection to each server, by `namespace/name`.
    pub fn connections(&self) -> BTreeMap<String, ConnectionStatus> {
        let servers = self.inner.servers.lock().unwrap_or_else(|e| e.into_inner());
        servers.values().map(|s| (s.config.display(), s.status.borrow().clone())).collect()
    }

    fn start(&self, config: ServerConfig) -> Server {
        let stop = self.inner.background.child_token();
        let link = Arc::new(Link::new(config.display(), timeout_of(&config.spec), self.inner.records.clone()));
        let first = ConnectionStatus {
            replica: self.inner.settings.replica.clone(),
            observed_generation: config.generation,
            updated: Some(now()),
            ..ConnectionStatus::default()
        };
        let (status, mut reports) = watch::channel(first);
        // The reporter passes on the latest state, one report at a time.
        let sink = self.inner.sink.clone();
        let (namespace, name) = config.key();
        let stopped = stop.clone();
        tokio::spawn(async move {
            loop {
                let latest = reports.borrow_and_update().clone();
                sink.report(&namespace, &name, &latest).await;
                tokio::select! {
                    () = stopped.cancelled() => return,
                    changed = reports.changed() => if changed.is_err() { return },
                }
            }
        });
        let task =
            ServerTask { upstreams: self.clone(), config: config.clone(), link: link.clone(), stop: stop.clone() };
        tokio::spawn(task.run());
        Server { config, link, status, listed: Listing::default(), stop }
    }

    /// Updates the state of server `key` (if it is still the one `link` belongs to) and its
    /// listed tools, then the catalog.
    fn update(&self, key: &Key, link: &Arc<Link>, listed: Option<Listing>, f: impl FnOnce(&mut ConnectionStatus)) {
        {
            let mut servers = self.inner.servers.lock().unwrap_or_else(|e| e.into_inner());
            let Some(server) = servers.get_mut(key).filter(|s| Arc::ptr_eq(&s.link, link)) else { return };
            server.status.send_modify(|s| {
                s.updated = Some(now());
                f(s);
            });
            let Some(listed) = listed else { return };
            server.listed = listed;
        }
        self.rebuild();
    }

    /// Recomputes the catalog: the functions and declared prompts, then each connected
    /// server's tools and prompts under their served names, leaving out names already taken. Names of the gateway's built-in tools
    /// are taken from the start: the McpTool schema refuses them, but an object stored before
    /// a name was reserved may still carry one.
    fn rebuild(&self) {
        let servers = self.inner.servers.lock().unwrap_or_else(|e| e.into_inner());
        let mut tools: Vec<Arc<Tool>> =
            self.inner.functions.tools().iter().filter(|t| !RESERVED_TOOL_NAMES.contains(&t.name())).cloned().collect();
        let mut taken: BTreeSet<String> = tools.iter().map(|t| t.name().to_owned()).collect();
        taken.extend(RESERVED_TOOL_NAMES.iter().map(|n| (*n).to_owned()));
        // Declared prompts (McpPrompts) first: an upstream prompt of the same name is left out.
        let mut prompts: Vec<Arc<Prompt>> = self.inner.functions.prompts();
        let mut prompt_names: BTreeSet<String> = prompts.iter().map(|p| p.name.clone()).collect();
        let mut resources: Vec<Arc<ServedResource>> = Vec::new();
        let mut uris: BTreeSet<String> = BTreeSet::new();
        for server in servers.values() {
            let prefix = server.config.spec.prefix(&server.config.name);
            let mut served = 0;
            let mut skipped = Vec::new();
            for listed in &server.listed.tools {
                let name = served_name(&prefix, &listed.name);
                if name.len() > MAX_TOOL_NAME {
                    skipped
                        .push(format!("{}: its name {name:?} is longer than {MAX_TOOL_NAME} characters", listed.name));
                } else if !name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
                    skipped.push(format!(
                        "{}: {name:?} does not start with a letter or '_' (set a toolPrefix)",
                        listed.name
                    ));
                } else if taken.contains(&name) {
                    skipped.push(format!("{}: {name:?} is taken by another tool", listed.name));
                } else {
                    match upstream_tool(&server.config, &server.link, listed, name.clone()) {
                        Ok(tool) => {
                            taken.insert(name);
                            tools.push(Arc::new(tool));
                            served += 1;
                        }
                        Err(e) => skipped.push(format!("{}: {e}", listed.name)),
                    }
                }
            }
            for listed in &server.listed.prompts {
                let name = served_name(&prefix, &listed.name);
                if name.len() > MAX_TOOL_NAME || !name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
                    skipped.push(format!("prompt {}: {name:?} is not a valid name", listed.name));
                } else if !prompt_names.insert(name.clone()) {
                    skipped.push(format!("prompt {}: {name:?} is taken by another prompt", listed.name));
                } else {
                    prompts.push(Arc::new(upstream_prompt(&server.config, &server.link, listed, name)));
                }
            }
            let listed_resources =
                server.listed.resources.iter().map(|r| (r.uri.clone(), None, serde_json::to_value(r)));
            let listed_templates = server.listed.templates.iter().map(|t| {
                let prefix = t.uri_template.split('{').next().unwrap_or_default().to_owned();
                (t.uri_template.clone(), Some(prefix), serde_json::to_value(t))
            });
            for (uri, template_prefix, listing) in listed_resources.chain(listed_templates) {
                if !uris.insert(uri.clone()) {
                    skipped.push(format!("resource {uri}: another server lists it"));
                    continue;
                }
                let source: Arc<dyn ResourceSource> = server.link.clone();
                let completer: Arc<dyn CompletionSource> = server.link.clone();
                resources.push(Arc::new(ServedResource {
                    namespace: server.config.namespace.clone(),
                    object_name: server.config.name.clone(),
                    toolset: server.config.spec.toolset.clone(),
                    uri,
                    template_prefix,
                    listing: listing.unwrap_or_default(),
                    source,
                    completer,
                }));
            }
            server.status.send_if_modified(|s| {
                let same = s.tools == served && s.skipped == skipped;
                s.tools = served;
                s.skipped = skipped;
                !same
            });
        }
        // Published before the servers' lock is released: rebuilds run one at a time, so the
        // last one published saw the latest listings (two servers connecting at once each
        // rebuild; had the one that saw only the first published last, the second's tools
        // would be missing while its status said they were served).
        tools.sort_by(|a, b| a.name().cmp(b.name()));
        *self.inner.tools.write().unwrap_or_else(|e| e.into_inner()) = tools.into();
        prompts.sort_by(|a, b| a.name.cmp(&b.name));
        *self.inner.prompts.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(prompts);
        *self.inner.resources.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(resources);
        drop(servers);
        self.inner.version.send_modify(|v| *v += 1);
    }
}

impl ToolCatalog for Upstreams {
    fn tools(&self) -> Arc<[Arc<Tool>]> {
        self.inner.tools.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.inner.version.subscribe()
    }

    fn is_synced(&self) -> bool {
        self.inner.functions.is_synced()
    }

    fn prompts(&self) -> Vec<Arc<Prompt>> {
        self.inner.prompts.read().unwrap_or_else(|e| e.into_inner()).as_ref().clone()
    }

    fn resources(&self) -> Vec<Arc<ServedResource>> {
        self.inner.resources.read().unwrap_or_else(|e| e.into_inner()).as_ref().clone()
    }
}

/// The served prompt for `listed` of `config`'s server, under `name`.
fn upstream_prompt(config: &ServerConfig, link: &Arc<Link>, listed: &rmcp::model::Prompt, name: String) -> Prompt {
    let mut served = listed.clone();
    served.name = name.clone();
    let required =
        listed.arguments.iter().flatten().filter(|a| a.required == Some(true)).map(|a| a.name.clone()).collect();
    let source: Arc<dyn PromptSource> = link.clone();
    let completer: Arc<dyn CompletionSource> = link.clone();
    Prompt {
        namespace: config.namespace.clone(),
        object_name: config.name.clone(),
        declared: false,
        name,
        upstream_name: listed.name.clone(),
        toolset: config.spec.toolset.clone(),
        listing: serde_json::to_value(&served).unwrap_or_default(),
        required,
        source,
        completer,
    }
}

/// `prefix` then `name` with every character other than letters, digits and '_' as '_'.
pub fn served_name(prefix: &str, name: &str) -> String {
    let mapped: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
    format!("{prefix}{mapped}")
}

fn timeout_of(spec: &McpServerSpec) -> Duration {
    Duration::from_secs(u64::try_from(spec.timeout_seconds.clamp(1, 3600)).unwrap_or(60))
}

fn now() -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now())
}

/// The catalog's tool for `listed` of `config`'s server, served as `name`.
fn upstream_tool(
    config: &ServerConfig,
    link: &Arc<Link>,
    listed: &rmcp::model::Tool,
    name: String,
) -> Result<Tool, String> {
    let annotations = listed.annotations.as_ref().map(|a| ToolAnnotations {
        read_only_hint: a.read_only_hint,
        destructive_hint: a.destructive_hint,
        idempotent_hint: a.idempotent_hint,
        open_world_hint: a.open_world_hint,
    });
    let title = listed.title.clone().or_else(|| listed.annotations.as_ref().and_then(|a| a.title.clone()));
    let spec = McpToolSpec {
        name,
        title,
        description: listed.description.as_deref().unwrap_or_default().to_owned(),
        input_schema: listed.input_schema.as_ref().clone(),
        output_schema: listed.output_schema.as_ref().map(|s| s.as_ref().clone()),
        annotations,
        toolset: config.spec.toolset.clone(),
        runtime: Runtime::default(),
        // Answered in this process, like a warm pool's call.
        execution: Execution { mode: ExecutionMode::Pool, timeout_seconds: config.spec.timeout_seconds, pool: None },
        caller_identity: false,
        placement: None,
    };
    let tool = Tool::new(config.namespace.clone(), config.name.clone(), config.generation, spec)?;
    Ok(tool.with_upstream(Upstream { tool: listed.name.to_string(), executor: link.clone() }))
}

/// The task holding one server's connection.
struct ServerTask {
    upstreams: Upstreams,
    config: ServerConfig,
    link: Arc<Link>,
    stop: CancellationToken,
}

impl ServerTask {
    async fn run(self) {
        let key = self.config.key();
        let settings = self.upstreams.inner.settings.clone();
        let delays: Vec<u64> = self
            .config
            .spec
            .reconnect_delays_seconds
            .iter()
            .map(|d| u64::try_from((*d).max(1)).unwrap_or(30))
            .collect();
        if !self.config.available {
            self.upstreams.update(&key, &self.link, None, |s| {
                s.state = ConnectionState::Waiting;
                s.last_error = Some(format!(
                    "no pod of the server is available yet (Deployment {}); connecting once one is",
                    toolyard_api::mcpserver::workload_name(&self.config.name)
                ));
            });
            return;
        }
        let mut failures: usize = 0;
        loop {
            let error = tokio::select! {
                () = self.stop.cancelled() => break,
                error = self.connected_session(&key, &settings) => error,
            };
            failures += 1;
            let delay = Duration::from_secs(delays.get(failures - 1).or(delays.last()).copied().unwrap_or(30));
            let failed = jiff::Timestamp::now();
            let next = failed + jiff::SignedDuration::try_from(delay).unwrap_or_default();
            self.upstreams.update(&key, &self.link, Some(Listing::default()), |s| {
                s.updated = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(failed));
                s.state = ConnectionState::Waiting;
                s.last_error = Some(error.clone());
                s.next_retry = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(next));
                s.failures = i32::try_from(failures).unwrap_or(i32::MAX);
            });
            tokio::select! {
                () = self.stop.cancelled() => break,
                () = tokio::time::sleep(delay) => {}
            }
        }
        self.link.set_peer(None);
    }

    /// Connects, serves the server's tools while it answers, and returns why it stopped.
    async fn connected_session(&self, key: &Key, settings: &UpstreamSettings) -> String {
        let inner = &self.upstreams.inner;
        let endpoint = match inner.dialer.endpoint(&self.config).await {
            Ok(endpoint) => endpoint,
            Err(e) => return e,
        };
        let connection =
            match Connection::open(&endpoint, inner.http.clone(), settings.connect_timeout, &self.link).await {
                Ok(c) => c,
                Err(e) => return e,
            };
        let error = self.serve(&connection, key, settings).await;
        self.link.set_peer(None);
        connection.close().await;
        error
    }

    async fn serve(&self, connection: &Connection, key: &Key, settings: &UpstreamSettings) -> String {
        let listed = match connection.list(settings.connect_timeout).await {
            Ok(tools) => tools,
            Err(e) => return e,
        };
        self.link.set_peer(Some(connection.peer()));
        self.link.resubscribe().await;
        self.upstreams.update(key, &self.link, Some(listed), |s| {
            s.state = ConnectionState::Connected;
            s.last_error = None;
            s.next_retry = None;
            s.failures = 0;
        });
        let mut ping = tokio::time::interval(settings.ping_interval);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ping.tick().await;
        loop {
            tokio::select! {
                () = self.link.list_changed.notified() => {
                    match connection.list(settings.connect_timeout).await {
                        Ok(listed) => self.upstreams.update(key, &self.link, Some(listed), |_| {}),
                        Err(e) => return e,
                    }
                }
                _ = ping.tick() => {
                    if let Err(e) = connection.ping(settings.connect_timeout).await {
                        return e;
                    }
                }
                () = self.link.broken.notified() => {
                    if let Err(e) = connection.ping(settings.connect_timeout).await {
                        return e;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn served_names_are_prefixed_identifiers() {
        assert_eq!(served_name("md_", "get-quote"), "md_get_quote");
        assert_eq!(served_name("everything_", "echo"), "everything_echo");
        assert_eq!(served_name("x_", "a.b/c"), "x_a_b_c");
    }

    #[test]
    fn credentials_become_one_sensitive_header() {
        let auth: UpstreamAuth =
            serde_json::from_value(serde_json::json!({"secretKeyRef": {"name": "s", "key": "k"}})).unwrap();
        let (name, value) = credential_header(&auth, "tok-123\n").unwrap();
        assert_eq!((name.as_str(), value.to_str().unwrap()), ("authorization", "Bearer tok-123"));
        assert!(value.is_sensitive());
        let raw = UpstreamAuth { header: "X-Api-Key".into(), scheme: String::new(), ..auth };
        let (name, value) = credential_header(&raw, "k").unwrap();
        assert_eq!((name.as_str(), value.to_str().unwrap()), ("x-api-key", "k"));
        assert!(credential_header(&raw, "bad\u{7f}value").is_err());
    }
}

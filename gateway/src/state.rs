//! The state shared by every request: the backends (as traits: catalog, executor, store,
//! authorizer, coding tasks), limits, metrics and settings. The Kubernetes mode and the
//! embedded local mode build the same [`AppState`] with different implementations and serve
//! it with the same [`crate::app::app`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::authz::Authorizer;
use crate::catalog::ToolCatalog;
use crate::core::quota::StorageQuota;
use crate::core::{Access, Calls};
use crate::executor::Executor;
use crate::limits::{LimitSettings, Limits};
use crate::mcp::cancel::CancelRegistry;
use crate::metrics::Metrics;
use crate::model::ModelProxy;
use crate::store::ArtifactStore;
use crate::tasks::TaskBackend;

/// Settings of the HTTP/MCP layer.
#[derive(Clone, Debug)]
pub struct Settings {
    /// `Host` header values (host or host:port) accepted on the MCP routes; requests with
    /// any other host get 403 (DNS rebinding protection). Empty: any host (not recommended).
    pub allowed_hosts: Vec<String>,
    /// Browser `Origin`s accepted; any other `Origin` gets 403 (empty: every request with an
    /// `Origin` is refused). Requests without `Origin` pass.
    pub allowed_origins: Vec<String>,
    /// Tools per `tools/list` page.
    pub page_size: usize,
    /// Name announced in `serverInfo`.
    pub server_name: String,
    /// Serve `/metrics` on the public router too (off when a separate metrics listener exists,
    /// so unauthenticated clients cannot read tool names from it).
    pub metrics_on_public: bool,
    /// Longest time `/readyz` waits for the storage check.
    pub readiness_timeout: Duration,
    /// Admission limits.
    pub limits: LimitSettings,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            allowed_hosts: loopback_hosts(),
            allowed_origins: Vec::new(),
            page_size: 100,
            server_name: "toolyard-gateway".to_owned(),
            metrics_on_public: true,
            readiness_timeout: Duration::from_secs(2),
            limits: LimitSettings::default(),
        }
    }
}

/// The loopback host names rmcp accepts by default.
pub fn loopback_hosts() -> Vec<String> {
    vec!["localhost".into(), "127.0.0.1".into(), "::1".into()]
}

/// Everything a request handler needs. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    /// Which tools exist.
    pub catalog: Arc<dyn ToolCatalog>,
    /// Runs calls.
    pub executor: Arc<dyn Executor>,
    /// Call and task files.
    pub store: Arc<dyn ArtifactStore>,
    /// Who may call what.
    pub authorizer: Arc<dyn Authorizer>,
    /// Where coding tasks run (`None`: no task tools).
    pub tasks: Option<Arc<dyn TaskBackend>>,
    /// The model profiles coding tasks may name, and the proxy to their endpoints.
    pub models: Arc<ModelProxy>,
    /// Every tool call, from MCP clients and coding tasks, runs through this service; its
    /// access filter decides listings too.
    pub calls: Arc<Calls>,
    /// Tool calls this process waits on, for `notifications/cancelled`.
    pub cancels: Arc<CancelRegistry>,
    /// The requests for callers this process waits on an answer for.
    pub asks: Arc<crate::mcp::asks::Asks>,
    /// 2025-era clients' sessions: their ids, and the GET streams held here.
    pub sessions: Arc<crate::mcp::sessions::Sessions>,
    /// Admission state.
    pub limits: Arc<Limits>,
    /// Metrics registry.
    pub metrics: Arc<Metrics>,
    /// HTTP/MCP settings.
    pub settings: Arc<Settings>,
    /// Cancelled when the server shuts down: ends long-lived streams (subscriptions).
    pub shutdown: CancellationToken,
    health: Arc<HealthCache>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").field("settings", &self.settings).finish_non_exhaustive()
    }
}

impl AppState {
    /// Builds the state; limits come from `settings.limits`, metrics are fresh.
    pub fn new(
        catalog: Arc<dyn ToolCatalog>,
        executor: Arc<dyn Executor>,
        store: Arc<dyn ArtifactStore>,
        authorizer: Arc<dyn Authorizer>,
        settings: Settings,
    ) -> Self {
        let limits = Arc::new(Limits::new(settings.limits.clone()));
        let quota = Arc::new(StorageQuota::new(store.clone(), settings.limits.storage_quota_bytes));
        let metrics = Arc::new(Metrics::new());
        Self {
            calls: calls(&catalog, &authorizer, &executor, &limits, &quota, &metrics),
            catalog,
            executor,
            store,
            authorizer,
            tasks: None,
            models: Arc::new(ModelProxy::none()),
            cancels: Arc::new(CancelRegistry::default()),
            asks: Arc::default(),
            sessions: Arc::default(),
            limits,
            metrics,
            settings: Arc::new(settings),
            shutdown: CancellationToken::new(),
            health: Arc::new(HealthCache::default()),
        }
    }

    /// The same state with sessions made and checked under `key` (shared by every replica).
    pub fn with_session_key(mut self, key: toolyard_api::token::SigningKey) -> Self {
        self.sessions = Arc::new(crate::mcp::sessions::Sessions::new(key));
        self
    }

    /// The same state with the given metrics (to share a registry with other parts).
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.calls = calls(&self.catalog, &self.authorizer, &self.executor, &self.limits, self.calls.quota(), &metrics);
        self.metrics = metrics;
        self
    }

    /// The access filter: which tools a caller sees and may use.
    pub fn access(&self) -> &Access {
        self.calls.access()
    }

    /// The same state with coding tasks run by `backend`.
    pub fn with_tasks(mut self, backend: Arc<dyn TaskBackend>) -> Self {
        self.tasks = Some(backend);
        self
    }

    /// The same state with these model profiles.
    pub fn with_models(mut self, models: Arc<ModelProxy>) -> Self {
        self.models = models;
        self
    }

    /// The same state with the given shutdown token.
    pub fn with_shutdown(mut self, shutdown: CancellationToken) -> Self {
        self.shutdown = shutdown;
        self
    }

    /// Readiness: not shutting down, the catalog has its first full listing and the store answers. The store
    /// result is cached for a second so probes do not hammer S3.
    pub async fn readiness(&self) -> Result<(), String> {
        if self.shutdown.is_cancelled() {
            return Err("shutting down".into());
        }
        if !self.catalog.is_synced() {
            return Err("tool catalog not synced yet".into());
        }
        if let Some(ok) = self.health.fresh() {
            return ok;
        }
        let result = match tokio::time::timeout(self.settings.readiness_timeout, self.store.health()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "storage health check failed");
                Err("storage not reachable".to_owned())
            }
            Err(_) => {
                tracing::warn!(timeout = ?self.settings.readiness_timeout, "storage health check timed out");
                Err("storage health check timed out".to_owned())
            }
        };
        self.health.set(result.clone());
        result
    }
}

/// The call service over the state's parts.
fn calls(
    catalog: &Arc<dyn ToolCatalog>,
    authorizer: &Arc<dyn Authorizer>,
    executor: &Arc<dyn Executor>,
    limits: &Arc<Limits>,
    quota: &Arc<StorageQuota>,
    metrics: &Arc<Metrics>,
) -> Arc<Calls> {
    let access = Access::new(catalog.clone(), authorizer.clone(), metrics.clone());
    Arc::new(Calls::new(access, executor.clone(), limits.clone(), quota.clone(), metrics.clone()))
}

/// The last storage health result, valid for a short time.
#[derive(Debug, Default)]
struct HealthCache(std::sync::Mutex<Option<(Instant, Result<(), String>)>>);

impl HealthCache {
    const TTL: Duration = Duration::from_secs(1);

    fn fresh(&self) -> Option<Result<(), String>> {
        let guard = self.0.lock().unwrap_or_else(|e| e.into_inner());
        guard.as_ref().filter(|(at, _)| at.elapsed() < Self::TTL).map(|(_, r)| r.clone())
    }

    fn set(&self, result: Result<(), String>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), result));
    }
}

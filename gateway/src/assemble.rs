//! Backends to routers, in one place for both modes: `serve` (Kubernetes) and the embedded
//! local mode each build their [`Backends`] and hand them to [`assemble`], which wires the
//! shared state, the call service, the public MCP router and the internal runner API the
//! same way for both.

use std::sync::Arc;

use axum::Router;
use toolyard_api::token::SigningKey;

use crate::app::app_with;
use crate::auth::AuthState;
use crate::auth::metadata::metadata_router;
use crate::authz::Authorizer;
use crate::catalog::ToolCatalog;
use crate::executor::{Executor, ResultRecorder};
use crate::internal::{InternalLimits, InternalState, TaskApi};
use crate::metrics::Metrics;
use crate::model::ModelProxy;
use crate::server::ShutdownTokens;
use crate::state::{AppState, Settings};
use crate::store::ArtifactStore;
use crate::tasks::TaskBackend;

/// One mode's implementations of the gateway's ports.
pub struct Backends {
    /// Which tools exist.
    pub catalog: Arc<dyn ToolCatalog>,
    /// Runs calls.
    pub executor: Arc<dyn Executor>,
    /// Call and task files.
    pub store: Arc<dyn ArtifactStore>,
    /// Who may call what.
    pub authorizer: Arc<dyn Authorizer>,
    /// Where coding tasks run.
    pub tasks: Arc<dyn TaskBackend>,
    /// The tasks' model calls.
    pub models: Arc<ModelProxy>,
    /// Records results the runners store where run state lives.
    pub recorder: Arc<dyn ResultRecorder>,
    /// Signs and checks runner tokens.
    pub signing_key: SigningKey,
    /// Who is calling (API keys, JWTs, TokenReview, ...), and the protected resource
    /// metadata the public listener serves.
    pub auth: Arc<AuthState>,
    /// More public routes, served without authentication (the local mode's authorization
    /// server).
    pub public_routes: Router,
}

/// The assembled gateway: its state and its two routers.
pub struct Assembled {
    /// The state every public request sees.
    pub state: AppState,
    /// The public router: MCP, metadata, health (and metrics when settings say so).
    pub public: Router,
    /// The internal runner API, for its own listener.
    pub internal: Router,
}

/// Wires `backends` into the state and the routers. Tool calls from MCP clients and from
/// coding tasks share one call service, so they count against the same limits and metrics.
pub fn assemble(
    backends: Backends,
    settings: Settings,
    internal_limits: InternalLimits,
    metrics: Arc<Metrics>,
    tokens: &ShutdownTokens,
) -> Assembled {
    let Backends { catalog, executor, store, authorizer, tasks, models, recorder, signing_key, auth, public_routes } =
        backends;
    let session_key = signing_key.derive("mcp-session");
    let mut internal_state = InternalState::new(store.clone(), signing_key);
    if let Some(hub) = executor.progress_hub() {
        internal_state = internal_state.with_progress(hub);
    }
    if let Some(records) = executor.records() {
        internal_state = internal_state.with_event_logs(Arc::clone(records.event_logs()));
    }
    let state = AppState::new(catalog, executor, store.clone(), authorizer, settings)
        .with_tasks(tasks.clone())
        .with_models(models.clone())
        .with_metrics(metrics)
        .with_session_key(session_key)
        .with_shutdown(tokens.app.clone());
    let task_api = TaskApi { backend: tasks, calls: state.calls.clone(), models };
    let internal = crate::internal::router(
        internal_state.with_recorder(recorder).with_tasks(task_api).with_limits(internal_limits),
    );
    let extra = metadata_router(auth.metadata.clone()).merge(public_routes);
    let public = app_with(state.clone(), auth, extra, tokens.streams.clone());
    Assembled { state, public, internal }
}

//! The gateway under test as `serve` builds it, in a process of its own (a bench role, see
//! `procs.rs`) so that its CPU and memory can be measured alone: tools from McpTool objects
//! on the test cluster's apiserver, bearer authentication by TokenReview with its cache, RBAC
//! by SubjectAccessReview with its cache, and an executor that answers every call at once —
//! the figures are the gateway's, not a tool run's — or after a fixed time
//! ([`CALL_MS_VAR`]). Per-user limits are lifted unless [`USER_LIMITS_VAR`] keeps them.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;
use toolyard_api::protocol::CallResult;
use toolyard_gateway::app::app_with;
use toolyard_gateway::auth::config::AuthContext;
use toolyard_gateway::auth::{AuthMetrics, metadata_router};
use toolyard_gateway::authz::{AuthzMetrics, SarAuthorizer, SarSettings};
use toolyard_gateway::catalog::kube::{KubeCatalog, Namespaces};
use toolyard_gateway::executor::{CallRequest, Executor};
use toolyard_gateway::metrics::Metrics;
use toolyard_gateway::server::{self, Drain, Listener, ServerSettings, ShutdownTokens};
use toolyard_gateway::state::{AppState, Settings};
use toolyard_gateway::store::fs::FsStore;
use toolyard_tests::{TestEnv, User, wait_until};

/// The variable giving the time each call takes, in milliseconds (default 0: answered at once).
#[allow(dead_code, reason = "each bench includes this module; only noisy_user sets it")]
pub const CALL_MS_VAR: &str = "TOOLYARD_BENCH_CALL_MS";

/// The variable that, set to `default`, keeps the gateway's default per-user limits (otherwise
/// lifted: a bench's one user stands in for many).
#[allow(dead_code, reason = "each bench includes this module; only noisy_user sets it")]
pub const USER_LIMITS_VAR: &str = "TOOLYARD_BENCH_USER_LIMITS";

/// The executor of the benches' gateway: answers every call with `{"echo": arguments}`, at
/// once or after its fixed time (a function's run, standing in).
struct InstantExecutor(Duration);

#[async_trait]
impl Executor for InstantExecutor {
    async fn call(&self, request: CallRequest) -> toolyard_gateway::Result<CallResult> {
        if !self.0.is_zero() {
            tokio::time::sleep(self.0).await;
        }
        Ok(CallResult::ok(json!({"echo": request.arguments}), 0))
    }
}

/// Serves the McpTools of `namespaces` (comma-separated) on a loopback port, printing
/// `listening on ADDR` once its catalog is in. With `metrics`, `/metrics` is served on the same
/// port (the SubjectAccessReviews sent are read there). Its runtime has one worker per CPU, as
/// `toolyard-gateway serve` has; `TOOLYARD_BENCH_GATEWAY_WORKERS` sets another count.
pub fn run(namespaces: &str, metrics: bool) {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = std::env::var("TOOLYARD_BENCH_GATEWAY_WORKERS").ok().and_then(|n| n.parse().ok()) {
        builder.worker_threads(n);
    }
    // As `toolyard-gateway` sets it up: export on when `OTEL_EXPORTER_OTLP_ENDPOINT` is set.
    let telemetry = toolyard_gateway::logging::init(toolyard_gateway::logging::LogFormat::Plain);
    let runtime = builder.enable_all().build().expect("runtime");
    runtime.block_on(async {
        let _telemetry = telemetry;
        let env = TestEnv::get();
        let namespaces: Vec<String> = namespaces.split(',').map(str::to_owned).collect();
        let client = env.client(User::Gateway).await;
        let background = tokio_util::sync::CancellationToken::new();
        let catalog = KubeCatalog::start(client.clone(), &Namespaces::Only(namespaces), background.clone());
        // In the folder the bench made this process's `TMPDIR` (`procs::spawn_role`), which
        // the bench removes.
        let store_dir = std::env::temp_dir().join("store");
        let store = Arc::new(FsStore::new(&store_dir).expect("store"));
        let registry = Arc::new(Metrics::new());
        let authz_metrics = AuthzMetrics::default();
        registry.register(|r| authz_metrics.register(r));
        let authorizer = SarAuthorizer::new(client.clone(), SarSettings::default(), authz_metrics);
        // The test cluster's users hold static (opaque) tokens.
        let flags = ["--tokenreview", "--tokenreview-audience", "toolyard", "--tokenreview-opaque-tokens"];
        let auth = crate::gateway_support::auth_args(&flags)
            .build(AuthContext {
                kube: Some(client),
                namespace: "toolyard".into(),
                public_url: None,
                default_scheme: "http".into(),
                allowed_hosts: Vec::new(),
                metrics: AuthMetrics::default(),
                shutdown: background.clone(),
            })
            .await
            .expect("auth");
        let mut settings = Settings::default();
        if std::env::var(USER_LIMITS_VAR).as_deref() != Ok("default") {
            settings.limits.max_calls_per_user = 1024;
            settings.limits.max_http_in_flight_per_user = 1024;
            settings.limits.max_streams_per_user = 1024;
        }
        let call_ms = std::env::var(CALL_MS_VAR).ok().and_then(|v| v.parse().ok()).unwrap_or(0);
        let executor = InstantExecutor(Duration::from_millis(call_ms));
        settings.metrics_on_public = metrics;
        let tokens = ShutdownTokens::default();
        let state = AppState::new(Arc::new(catalog.clone()), Arc::new(executor), store, Arc::new(authorizer), settings)
            .with_metrics(registry)
            .with_shutdown(tokens.app.clone());
        let router =
            app_with(state, auth.state.clone(), metadata_router(auth.metadata.clone()), tokens.streams.clone());
        wait_until(Duration::from_secs(120), "catalog sync", || {
            let catalog = catalog.clone();
            async move { Ok(toolyard_gateway::catalog::ToolCatalog::is_synced(&catalog)) }
        })
        .await
        .expect("sync");
        let socket = server::bind("public", "127.0.0.1:0").expect("bind");
        println!("listening on {}", socket.local_addr().expect("addr"));
        let listeners = vec![Listener { name: "public", socket, router, tls: None, drain: Drain::First }];
        server::serve(listeners, &ServerSettings::default(), tokens).await.expect("serve");
    });
}

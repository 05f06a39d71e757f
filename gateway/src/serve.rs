//! `toolyard-gateway serve`: the gateway on Kubernetes.
//!
//! Three listeners: the public MCP endpoint (TLS unless `--plain-http`), the internal runner
//! API (reachable only from runner pods), and ops (`/metrics`, `/healthz`, `/readyz`).
//! Tools come from McpTool objects, calls become ToolCalls, coding tasks CodingTasks (in
//! `--task-namespace`), files go to S3 (or a folder),
//! callers are authenticated by [`crate::auth`] and authorized by [`crate::authz`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use tokio_util::sync::CancellationToken;

use crate::assemble::{Assembled, Backends, assemble};
use crate::auth::{AuthArgs, AuthMetrics};
use crate::authz::{AuthzArgs, AuthzMetrics};
use crate::catalog::kube::{KubeCatalog, Namespaces};
use crate::executor::Executor;
use crate::executor::kube::{KubeExecutor, KubeExecutorSettings, KubeResultRecorder};
use crate::executor::load::LoadSettings;
use crate::executor::pool::PoolClient;
use crate::internal::InternalArgs;
use crate::limits::LimitSettings;
use crate::logging::LogFormat;
use crate::metrics::Metrics;
use crate::server::{Drain, Listener, ServerSettings, ShutdownTokens, bind};
use crate::state::{Settings, loopback_hosts};
use crate::store::ArtifactStore;
use crate::store::fs::FsStore;
use crate::store::s3::{S3Settings, S3Store};
use crate::tasks::kube::KubeTasks;
use crate::tls::TlsArgs;
use crate::upstream::Upstreams;
use crate::upstream::kube::{KubeDialer, StatusPatcher};

/// Flags of `serve` (every flag has a `TOOLYARD_*` environment fallback).
#[derive(Args, Clone, Debug)]
pub struct ServeArgs {
    /// Address of the public MCP listener.
    #[arg(long = "listen", env = "TOOLYARD_LISTEN", default_value = "0.0.0.0:8443")]
    pub public_listen: String,
    /// Address of the ops listener (`/metrics`, `/healthz`, `/readyz`). Empty: serve them on
    /// the public listener instead.
    #[arg(long, env = "TOOLYARD_METRICS_LISTEN", default_value = "0.0.0.0:9090")]
    pub metrics_listen: String,
    /// Namespaces whose McpTools are served (comma-separated; empty or `*`: all namespaces).
    #[arg(long, env = "TOOLYARD_NAMESPACES", value_delimiter = ',')]
    pub namespaces: Vec<String>,
    /// The gateway's own namespace (for Secrets named without a namespace, and the Leases in
    /// which replicas share their warm-pool calls in flight).
    #[arg(long, env = "TOOLYARD_POD_NAMESPACE", default_value = "toolyard")]
    pub gateway_namespace: String,
    /// Namespace where coding tasks (CodingTask objects) are created; the controller must watch
    /// it. Default: the served namespace when there is exactly one, else the gateway's own.
    #[arg(long, env = "TOOLYARD_TASK_NAMESPACE")]
    pub task_namespace: Option<String>,
    /// Public base URL of the gateway (`https://toolyard.example.com`), used in the OAuth
    /// protected resource metadata. Without it the request's Host header is used.
    #[arg(long, env = "TOOLYARD_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// Accepted `Host` header values of MCP requests (comma-separated host or host:port;
    /// `*` accepts any host). Defaults to loopback names only.
    #[arg(long, env = "TOOLYARD_ALLOWED_HOSTS", value_delimiter = ',')]
    pub allowed_hosts: Vec<String>,
    /// Browser `Origin`s allowed to call the MCP endpoint (comma-separated `scheme://host:port`,
    /// `:*` for any port). A request with any other `Origin` gets 403; empty: every request with
    /// an `Origin` is refused. Requests without `Origin` (non-browser clients) pass.
    #[arg(long, env = "TOOLYARD_ALLOWED_ORIGINS", value_delimiter = ',')]
    pub allowed_origins: Vec<String>,
    /// Tools per `tools/list` page.
    #[arg(long, env = "TOOLYARD_PAGE_SIZE", default_value_t = 100)]
    pub page_size: usize,
    /// This replica's name in McpServer statuses (the chart sets the pod name). Default: the
    /// host name.
    #[arg(long, env = "TOOLYARD_POD_NAME")]
    pub pod_name: Option<String>,

    #[command(flatten)]
    #[allow(missing_docs)]
    pub storage: StorageArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub limits: LimitArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub data: DataArgs,

    /// How long in-flight calls may finish after SIGTERM.
    #[arg(long, env = "TOOLYARD_SHUTDOWN_GRACE_SECONDS", default_value_t = 30)]
    pub shutdown_grace_seconds: u64,
    /// Extra wait after a tool's timeout before a call is answered as timed out.
    #[arg(long, env = "TOOLYARD_CALL_GRACE_SECONDS", default_value_t = 15)]
    pub call_grace_seconds: u64,
    /// Timeout of single Kubernetes API requests made for calls.
    #[arg(long, env = "TOOLYARD_KUBE_TIMEOUT_SECONDS", default_value_t = 10)]
    pub kube_timeout_seconds: u64,
    /// Log format.
    #[arg(long, env = "TOOLYARD_LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain)]
    pub log_format: LogFormat,

    #[command(flatten)]
    #[allow(missing_docs)]
    pub tls: TlsArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub internal: InternalArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub auth: AuthArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub authz: AuthzArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub models: crate::model::ModelArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub upstream: crate::upstream::UpstreamArgs,
}

/// Where call and task files go.
#[derive(Args, Clone, Debug)]
pub struct StorageArgs {
    /// Keep files in this folder instead of S3 (single replica only).
    #[arg(long, env = "TOOLYARD_STORAGE_DIR", conflicts_with = "s3_bucket")]
    pub storage_dir: Option<PathBuf>,
    /// S3 bucket.
    #[arg(long, env = "TOOLYARD_S3_BUCKET")]
    pub s3_bucket: Option<String>,
    /// S3 endpoint URL (S3-compatible servers); empty: AWS.
    #[arg(long, env = "TOOLYARD_S3_ENDPOINT")]
    pub s3_endpoint: Option<String>,
    /// S3 region (the signing region for S3-compatible servers).
    #[arg(long, env = "TOOLYARD_S3_REGION", default_value = "us-east-1")]
    pub s3_region: String,
    /// Path-style addressing (most S3-compatible servers need it).
    #[arg(long, env = "TOOLYARD_S3_PATH_STYLE", default_value_t = true, action = clap::ArgAction::Set)]
    pub s3_path_style: bool,
    /// Static access key id; unset: the AWS environment chain (AWS_*, web identity, ...).
    #[arg(long, env = "TOOLYARD_S3_ACCESS_KEY_ID", hide_env_values = true)]
    pub s3_access_key_id: Option<String>,
    /// Static secret access key (prefer the environment variable, from a Secret).
    #[arg(long, env = "TOOLYARD_S3_SECRET_ACCESS_KEY", hide_env_values = true)]
    pub s3_secret_access_key: Option<String>,
    /// S3 connect timeout.
    #[arg(long, env = "TOOLYARD_S3_CONNECT_TIMEOUT_SECONDS", default_value_t = 5)]
    pub s3_connect_timeout_seconds: u64,
    /// Timeout of one S3 operation, retries included.
    #[arg(long, env = "TOOLYARD_S3_TIMEOUT_SECONDS", default_value_t = 60)]
    pub s3_timeout_seconds: u64,
}

impl StorageArgs {
    /// The configured store.
    pub async fn build(&self) -> anyhow::Result<Arc<dyn ArtifactStore>> {
        if let Some(dir) = &self.storage_dir {
            return Ok(Arc::new(FsStore::new(dir).with_context(|| format!("storage folder {}", dir.display()))?));
        }
        let bucket = self.s3_bucket.clone().context("set --s3-bucket (or --storage-dir for a local folder)")?;
        let settings = S3Settings {
            endpoint: self.s3_endpoint.clone().filter(|e| !e.is_empty()),
            region: self.s3_region.clone(),
            bucket,
            path_style: self.s3_path_style,
            access_key: self.s3_access_key_id.clone(),
            secret_key: self.s3_secret_access_key.clone(),
            connect_timeout: Duration::from_secs(self.s3_connect_timeout_seconds.max(1)),
            operation_timeout: Duration::from_secs(self.s3_timeout_seconds.max(1)),
        };
        Ok(Arc::new(S3Store::new(&settings).await.context("S3 settings")?))
    }
}

/// Admission and size limits.
#[derive(Args, Clone, Debug)]
pub struct LimitArgs {
    /// Tool calls running at once on this replica.
    #[arg(long, env = "TOOLYARD_MAX_CALLS", default_value_t = 256)]
    pub max_calls: usize,
    /// Tool calls one user runs at once, on all replicas together (counted from the
    /// cluster's ToolCalls).
    #[arg(long, env = "TOOLYARD_MAX_CALLS_PER_USER", default_value_t = 16)]
    pub max_calls_per_user: usize,
    /// Coding tasks of one user not finished yet, on all replicas together (counted from the
    /// cluster's CodingTasks).
    #[arg(long, env = "TOOLYARD_MAX_TASKS_PER_USER", default_value_t = 4)]
    pub max_tasks_per_user: usize,
    /// HTTP requests handled at once (503 beyond).
    #[arg(long, env = "TOOLYARD_MAX_HTTP_IN_FLIGHT", default_value_t = 1024)]
    pub max_http_in_flight: usize,
    /// HTTP requests of one user handled at once (429 beyond).
    #[arg(long, env = "TOOLYARD_MAX_HTTP_IN_FLIGHT_PER_USER", default_value_t = 64)]
    pub max_http_in_flight_per_user: usize,
    /// Notification streams (`subscriptions/listen`, a session's GET) open at once (a busy
    /// error beyond).
    #[arg(long, env = "TOOLYARD_MAX_STREAMS", default_value_t = 4096)]
    pub max_streams: usize,
    /// Notification streams (`subscriptions/listen`, a session's GET) one user holds open at
    /// once (a busy error beyond).
    #[arg(long, env = "TOOLYARD_MAX_STREAMS_PER_USER", default_value_t = 16)]
    pub max_streams_per_user: usize,
    /// Connections each listener holds open at once; one beyond it is closed before anything
    /// is read, counted as a `connections` admission rejection. Each open connection holds
    /// about 30 KiB.
    #[arg(long, env = "TOOLYARD_MAX_CONNECTIONS", default_value_t = crate::server::DEFAULT_MAX_CONNECTIONS, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_connections: usize,
    /// Largest request body in bytes (413 beyond).
    #[arg(long, env = "TOOLYARD_MAX_BODY_BYTES", default_value_t = 4 * 1024 * 1024)]
    pub max_body_bytes: usize,
    /// Most header fields per request.
    #[arg(long, env = "TOOLYARD_MAX_HEADERS", default_value_t = 64)]
    pub max_headers: usize,
    /// Largest header block in bytes.
    #[arg(long, env = "TOOLYARD_MAX_HEADER_BYTES", default_value_t = 64 * 1024)]
    pub max_header_bytes: usize,
    /// Seconds a client has to send a request's headers, counted on a keep-alive connection
    /// from the previous answer (so also the idle limit); the connection is closed after it.
    #[arg(long, env = "TOOLYARD_HEADER_READ_TIMEOUT_SECONDS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub header_read_timeout_seconds: u64,
    /// Seconds a client has to send a request's body, counted from the end of its headers; a
    /// body still arriving after it gets 408 and the request's admission slot is freed.
    #[arg(long, env = "TOOLYARD_BODY_READ_TIMEOUT_SECONDS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub body_read_timeout_seconds: u64,
    /// `Retry-After` of busy answers, in seconds.
    #[arg(long, env = "TOOLYARD_RETRY_AFTER_SECONDS", default_value_t = 1)]
    pub retry_after_seconds: u64,
}

/// What is kept of each owner's stored calls and tasks (`serve` and the local mode alike).
#[derive(Args, Clone, Debug)]
pub struct DataArgs {
    /// Bytes of stored calls and tasks per owner (each file counts at least 4 KiB); at it, new
    /// calls, coding tasks and session subscriptions are refused with a message saying how to
    /// free space (0: no quota).
    #[arg(long, env = "TOOLYARD_STORAGE_QUOTA_BYTES", default_value_t = crate::limits::DEFAULT_STORAGE_QUOTA_BYTES)]
    pub storage_quota_bytes: u64,
    /// Days after which stored calls and tasks are deleted (an S3 lifecycle rule where the
    /// store takes one, else the gateway deletes them hourly); 0: kept until deleted.
    #[arg(long, env = "TOOLYARD_RETENTION_DAYS", default_value_t = 0)]
    pub retention_days: u32,
}

impl Default for DataArgs {
    /// The flags' defaults.
    fn default() -> Self {
        Self { storage_quota_bytes: crate::limits::DEFAULT_STORAGE_QUOTA_BYTES, retention_days: 0 }
    }
}

impl LimitArgs {
    /// The admission settings.
    pub fn settings(&self) -> LimitSettings {
        LimitSettings {
            max_calls: self.max_calls,
            max_calls_per_user: self.max_calls_per_user,
            max_tasks_per_user: self.max_tasks_per_user,
            max_http_in_flight: self.max_http_in_flight,
            max_http_in_flight_per_user: self.max_http_in_flight_per_user,
            max_streams: self.max_streams,
            max_streams_per_user: self.max_streams_per_user,
            max_body_bytes: self.max_body_bytes,
            retry_after: Duration::from_secs(self.retry_after_seconds.max(1)),
            storage_quota_bytes: crate::limits::DEFAULT_STORAGE_QUOTA_BYTES,
        }
    }
}

/// Allowed hosts from the flag: empty means loopback only, `*` means any.
pub fn allowed_hosts(list: &[String]) -> Vec<String> {
    let list: Vec<String> = list.iter().map(|h| h.trim().to_owned()).filter(|h| !h.is_empty()).collect();
    if list.is_empty() {
        loopback_hosts()
    } else if list.iter().any(|h| h == "*") {
        Vec::new()
    } else {
        list
    }
}

/// Allowed origins from the flag, blank entries dropped: empty refuses every `Origin`.
pub fn allowed_origins(list: &[String]) -> Vec<String> {
    list.iter().map(|o| o.trim().to_owned()).filter(|o| !o.is_empty()).collect()
}

impl ServeArgs {
    /// This replica's name: `--pod-name`, else the host name.
    pub fn replica(&self) -> String {
        self.pod_name
            .clone()
            .filter(|n| !n.trim().is_empty())
            .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|h| h.trim().to_owned()))
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "gateway".into())
    }

    /// The namespace coding tasks are created in (see `--task-namespace`).
    pub fn task_namespace(&self) -> String {
        if let Some(ns) = self.task_namespace.as_deref().map(str::trim).filter(|ns| !ns.is_empty()) {
            return ns.to_owned();
        }
        match Namespaces::from_list(&self.namespaces) {
            Namespaces::Only(names) if names.len() == 1 => names[0].clone(),
            _ => self.gateway_namespace.clone(),
        }
    }
}

/// Runs the gateway until SIGTERM/SIGINT.
pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let telemetry = crate::logging::init(args.log_format);
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let tokens = ShutdownTokens::default();
    // Background work (watches, reloads) stops only after the listeners have drained.
    let background = CancellationToken::new();

    let tls_files = args.tls.files()?;
    let key_file = args.internal.token_key_file.clone().context("set --token-key-file (the runner token key)")?;
    let signing_key = crate::internal::load_signing_key(&key_file)?;

    let mut kube_config =
        kube::Config::infer().await.context("no Kubernetes configuration (in-cluster or KUBECONFIG)")?;
    kube_config.connect_timeout = Some(Duration::from_secs(10));
    let client = kube::Client::try_from(kube_config).context("Kubernetes client")?;

    let store = args.storage.build().await?;
    crate::store::retention::start(store.clone(), args.data.retention_days, background.clone()).await;
    let namespaces = Namespaces::from_list(&args.namespaces);
    let catalog = KubeCatalog::start(client.clone(), &namespaces, background.clone());
    let pool = PoolClient::new(Duration::from_secs(5))?;
    let executor = KubeExecutor::start(
        client.clone(),
        store.clone(),
        &namespaces,
        Some(signing_key.clone()),
        pool,
        KubeExecutorSettings {
            grace: Duration::from_secs(args.call_grace_seconds),
            api_timeout: Duration::from_secs(args.kube_timeout_seconds.max(1)),
            load: LoadSettings::new(args.gateway_namespace.clone()),
            ..KubeExecutorSettings::default()
        },
        background.clone(),
    );
    let replica = args.replica();
    let status = StatusPatcher::new(client.clone(), &replica);
    let upstreams = Upstreams::new(
        Arc::new(catalog),
        args.upstream.settings(replica.clone()),
        Arc::new(status.clone()),
        Arc::new(KubeDialer::new(client.clone(), signing_key.clone())),
        executor.records(),
        background.clone(),
    )?;
    crate::upstream::kube::watch(&client, &namespaces, upstreams.clone(), status, background.clone());

    let metrics = Arc::new(Metrics::new());
    let authz_metrics = AuthzMetrics::default();
    let auth_metrics = AuthMetrics::default();
    metrics.register(|r| {
        authz_metrics.register(r);
        auth_metrics.register(r);
    });
    args.authz.check_issuers(&args.auth.oidc_issuers)?;
    let authorizer = args.authz.build(Some(client.clone()), authz_metrics)?;
    let models = args.models.build(&metrics)?;
    let auth = args
        .auth
        .build(crate::auth::config::AuthContext {
            kube: Some(client.clone()),
            namespace: args.gateway_namespace.clone(),
            public_url: args.public_url.clone(),
            default_scheme: if tls_files.is_some() { "https" } else { "http" }.to_owned(),
            allowed_hosts: allowed_hosts(&args.allowed_hosts),
            metrics: auth_metrics,
            shutdown: background.clone(),
        })
        .await?;

    let metrics_listener = (!args.metrics_listen.trim().is_empty()).then(|| args.metrics_listen.trim().to_owned());
    let settings = Settings {
        allowed_hosts: allowed_hosts(&args.allowed_hosts),
        allowed_origins: allowed_origins(&args.allowed_origins),
        page_size: args.page_size.max(1),
        metrics_on_public: metrics_listener.is_none(),
        limits: LimitSettings { storage_quota_bytes: args.data.storage_quota_bytes, ..args.limits.settings() },
        ..Settings::default()
    };
    let executor = Arc::new(executor);
    let flushed = executor.clone();
    let task_namespace = args.task_namespace();
    let tasks = Arc::new(KubeTasks::start(
        client.clone(),
        &task_namespace,
        store.clone(),
        Duration::from_secs(args.kube_timeout_seconds.max(1)),
        background.clone(),
    ));
    tracing::info!(namespace = %task_namespace, "coding tasks are created in this namespace");
    let backends = Backends {
        catalog: Arc::new(upstreams.clone()),
        executor,
        store,
        authorizer,
        tasks,
        models,
        recorder: Arc::new(KubeResultRecorder::new(client)),
        signing_key,
        auth: auth.state,
        public_routes: axum::Router::new(),
    };
    let Assembled { state, public, internal } = assemble(backends, settings, args.internal.limits(), metrics, &tokens);

    let public_tls = match tls_files {
        Some(files) => {
            Some(crate::tls::reloading_config(files, args.tls.reload_interval(), background.clone()).await?.config)
        }
        None => None,
    };
    let mut listeners = vec![
        Listener {
            name: "public",
            socket: bind("public", &args.public_listen)?,
            router: public,
            tls: public_tls,
            drain: Drain::First,
        },
        Listener {
            name: "internal",
            socket: bind("internal", &args.internal.listen)?,
            router: internal,
            tls: None,
            drain: Drain::Last,
        },
    ];
    if let Some(addr) = metrics_listener {
        let ops = crate::app::ops_router(state.clone());
        listeners.push(Listener {
            name: "metrics",
            socket: bind("metrics", &addr)?,
            router: ops,
            tls: None,
            drain: Drain::Last,
        });
    }
    let server = ServerSettings {
        shutdown_grace: Duration::from_secs(args.shutdown_grace_seconds),
        max_headers: args.limits.max_headers,
        max_header_bytes: args.limits.max_header_bytes,
        header_read_timeout: Duration::from_secs(args.limits.header_read_timeout_seconds),
        body_read_timeout: Duration::from_secs(args.limits.body_read_timeout_seconds),
        max_connections: args.limits.max_connections,
        metrics: Some(Arc::clone(&state.metrics)),
    };
    let result = crate::server::serve(listeners, &server, tokens).await;
    flushed.flush().await;
    background.cancel();
    upstreams.withdraw_all().await;
    telemetry.shutdown();
    result
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    #[test]
    fn flags_parse_with_defaults() {
        let cli = Cli::try_parse_from([
            "x",
            "--namespaces",
            "a,b",
            "--s3-bucket",
            "calls",
            "--plain-http",
            "--listen",
            "127.0.0.1:9443",
            "--internal-listen",
            "127.0.0.1:9081",
        ])
        .unwrap();
        assert_eq!(cli.serve.public_listen, "127.0.0.1:9443");
        assert_eq!(cli.serve.internal.listen, "127.0.0.1:9081");
        assert_eq!(cli.serve.namespaces, ["a", "b"]);
        assert_eq!(cli.serve.limits.settings().max_calls_per_user, 16);
        assert_eq!(cli.serve.limits.body_read_timeout_seconds, 30);
        assert!(cli.serve.storage.s3_path_style);
        assert!(cli.serve.tls.plain_http);
        assert!(Cli::try_parse_from(["x", "--storage-dir", "/d", "--s3-bucket", "b"]).is_err(), "one store only");
        assert_eq!(cli.serve.task_namespace(), "toolyard", "several served namespaces: the gateway's own");
        let one = Cli::try_parse_from(["x", "--namespaces", "team"]).unwrap();
        assert_eq!(one.serve.task_namespace(), "team");
        let set = Cli::try_parse_from(["x", "--namespaces", "team", "--task-namespace", "tasks"]).unwrap();
        assert_eq!(set.serve.task_namespace(), "tasks");
    }

    #[test]
    fn allowed_hosts_default_to_loopback_and_star_means_any() {
        assert_eq!(allowed_hosts(&[]), loopback_hosts());
        assert!(allowed_hosts(&["*".into()]).is_empty());
        assert_eq!(allowed_hosts(&["toolyard.example.com".into()]), ["toolyard.example.com"]);
    }

    #[test]
    fn allowed_origins_default_to_none_and_blank_entries_are_dropped() {
        let cli = Cli::try_parse_from(["x"]).unwrap();
        assert!(allowed_origins(&cli.serve.allowed_origins).is_empty(), "no Origin is allowed by default");
        let listed =
            Cli::try_parse_from(["x", "--allowed-origins", "http://localhost:6274, ,https://app.example.com:443"])
                .unwrap();
        assert_eq!(
            allowed_origins(&listed.serve.allowed_origins),
            ["http://localhost:6274", "https://app.example.com:443"]
        );
    }
}

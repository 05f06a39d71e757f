//! `toolyard-gateway local <dir>`: the embedded mode. Everything on one machine, no cluster:
//! tools from the McpTool manifests of a folder ([`crate::catalog::local`]), calls as local
//! `toolyard-runner` processes ([`crate::executor::local`]) and warm workers ([`workers`]),
//! files in a local folder ([`crate::store::fs`]), a generated (or given) API key for one
//! local user, and a static policy ([`crate::authz::policy`]) — served by the same
//! [`crate::app`] as the cluster gateway. The runners reach the internal API on a second
//! loopback listener. Coding tasks run as local agent processes ([`crate::tasks::local`])
//! whose model calls the gateway forwards ([`crate::model`]) to the profiles of
//! `--model-profiles`, or to one profile from `TOOLYARD_MODEL_BASE_URL`, `TOOLYARD_MODEL` and
//! `TOOLYARD_MODEL_API_KEY` (only tasks need them; the key stays in the gateway).
//!
//! `/metrics` is never served on the MCP listener: the metrics name tools and users and have no
//! authentication, so they get a listener of their own, only with `--metrics-listen`.

mod banner;
pub mod oauth;
pub mod setup;
pub mod workers;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use tokio_util::sync::CancellationToken;
use toolyard_api::token::SigningKey;

use crate::assemble::{Assembled, Backends, assemble};
use crate::auth::apikey::{API_KEY_PREFIX, ApiKey, ApiKeyAuthenticator, generate_api_key, hash_api_key};
use crate::auth::{AuthChain, AuthMetrics, AuthState, Authenticator, ProtectedResourceMetadata};
use crate::authz::{AuthzMetrics, PolicyAuthorizer};
use crate::catalog::ToolCatalog;
use crate::catalog::local::LocalCatalog;
use crate::executor::Executor;
use crate::executor::local::{LaunchSettings, LocalExecutor, LocalResults};
use crate::hosts::AllowedHosts;
use crate::internal::InternalLimits;
use crate::logging::LogFormat;
use crate::metrics::Metrics;
use crate::server::{Drain, Listener, ServerSettings, ShutdownTokens};
use crate::state::{Settings, loopback_hosts};
use crate::store::fs::{Durability, FsStore};
use crate::tasks::local::{LocalTaskBackend, LocalTaskSettings, LocalTasks};
use crate::upstream::{LocalDialer, LogStatus, ServerConfig, Upstreams};
use oauth::LocalAuthorization;
use setup::DataDirLock;
use workers::WarmPools;

/// Default address of the MCP endpoint.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8787";

/// Flags of `local` (every flag has a `TOOLYARD_*` environment fallback).
#[derive(Args, Clone, Debug)]
pub struct LocalArgs {
    /// Folder with McpTool manifests (`*.yaml`, `*.yml`), e.g. examples/pricing.
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// Address of the MCP endpoint. Loopback by default; anything else exposes your tools.
    #[arg(long, env = "TOOLYARD_LOCAL_LISTEN", default_value = DEFAULT_LISTEN, value_name = "ADDR:PORT")]
    pub listen: String,
    /// A fixed bearer token for the local user: `ty_` and at least 16 characters of
    /// A-Z a-z 0-9 - . _ ~ + /. By default a new one is generated and printed at each start.
    #[arg(long, env = "TOOLYARD_LOCAL_TOKEN", hide_env_values = true, conflicts_with = "token_file")]
    pub token: Option<String>,
    /// A file holding the bearer token (kept off the command line, where `ps` shows it). If
    /// the file does not exist, a new token is written to it (mode 600) for clients to read.
    #[arg(long, env = "TOOLYARD_LOCAL_TOKEN_FILE", value_name = "PATH")]
    pub token_file: Option<PathBuf>,
    /// User name the token authenticates (policy rules and the storage prefix use it).
    #[arg(long, env = "TOOLYARD_LOCAL_USER", default_value = "local")]
    pub user: String,
    /// Let requests without a token in as the local user, for MCP clients that cannot send
    /// one. Only with a loopback --listen; any program of any user on this machine can then
    /// call your tools.
    #[arg(long, env = "TOOLYARD_LOCAL_ANONYMOUS")]
    pub anonymous: bool,
    /// Folder for call and task files.
    #[arg(long, env = "TOOLYARD_DATA_DIR", default_value = ".toolyard/data")]
    pub data_dir: PathBuf,
    /// Policy file (`rules: [{users, groups, tools, codingTasks}]`); default: the local user may
    /// call every tool and start coding tasks.
    #[arg(long, env = "TOOLYARD_POLICY_FILE", value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// The toolyard-runner binary (default: next to this program, then on PATH).
    #[arg(long, env = "TOOLYARD_RUNNER", value_name = "PATH")]
    pub runner: Option<PathBuf>,
    /// Python interpreter for tools whose command is `python3`/`python` (default: that command,
    /// resolved once to the real interpreter).
    #[arg(long, env = "TOOLYARD_PYTHON", value_name = "PATH")]
    pub python: Option<PathBuf>,
    /// Job-mode calls running at once (more wait).
    #[arg(long, env = "TOOLYARD_LOCAL_MAX_CALLS", default_value_t = 8)]
    pub max_calls: usize,
    /// Seconds between SIGTERM and SIGKILL of a tool at its deadline.
    #[arg(long, env = "TOOLYARD_KILL_GRACE_SECONDS", default_value_t = 2.0)]
    pub kill_grace: f64,
    /// Accepted `Host` header values besides loopback names (needed with a non-loopback --listen).
    #[arg(long, env = "TOOLYARD_ALLOWED_HOSTS", value_delimiter = ',')]
    pub allowed_hosts: Vec<String>,
    /// Browser `Origin`s allowed to call the MCP endpoint (comma-separated `scheme://host:port`,
    /// `:*` for any port), e.g. `http://localhost:6274` for MCP Inspector's direct connection.
    /// Requests with any other `Origin` get 403; requests without one pass.
    #[arg(long, env = "TOOLYARD_ALLOWED_ORIGINS", value_delimiter = ',')]
    pub allowed_origins: Vec<String>,
    /// Address of a separate listener for `/metrics` (Prometheus), e.g. `127.0.0.1:9464`. Off by
    /// default: metrics name tools and users and are served without authentication, so they
    /// are never on the MCP listener. Keep it on loopback.
    #[arg(long, env = "TOOLYARD_METRICS_LISTEN", value_name = "ADDR:PORT")]
    pub metrics_listen: Option<String>,
    /// Seconds a client has to send a request's body, counted from the end of its headers; a
    /// body still arriving after it gets 408.
    #[arg(long, env = "TOOLYARD_BODY_READ_TIMEOUT_SECONDS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub body_read_timeout_seconds: u64,
    /// Log format.
    #[arg(long, env = "TOOLYARD_LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain)]
    pub log_format: LogFormat,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub models: crate::model::ModelArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub data: crate::serve::DataArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub upstream: crate::upstream::UpstreamArgs,
}

/// A running local gateway.
#[derive(Debug)]
pub struct LocalGateway {
    /// Address of the MCP endpoint.
    pub addr: SocketAddr,
    /// Address of the `/metrics` listener (`--metrics-listen`), if any.
    pub metrics_addr: Option<SocketAddr>,
    /// The bearer token of the local user.
    pub token: String,
    /// The data folder.
    pub data_dir: PathBuf,
    /// The loaded catalog.
    pub catalog: Arc<LocalCatalog>,
    /// The catalog served: the functions and the McpServers' tools.
    pub upstreams: Upstreams,
    /// The warm workers of Pool-mode tools.
    pub pools: Arc<WarmPools>,
    tokens: ShutdownTokens,
    background: CancellationToken,
    served: tokio::task::JoinHandle<anyhow::Result<()>>,
    _lock: DataDirLock,
}

impl LocalGateway {
    /// `http://ADDR/mcp`.
    pub fn mcp_url(&self) -> String {
        format!("http://{}{}", self.addr, crate::app::MCP_PATH)
    }

    /// Stops serving (as SIGTERM would) and waits until everything is down.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        self.tokens.trigger.cancel();
        self.wait().await
    }

    /// Waits until the gateway stops (SIGTERM/SIGINT or [`Self::shutdown`]).
    pub async fn wait(self) -> anyhow::Result<()> {
        let result = self.served.await.context("the server task failed")?;
        self.background.cancel();
        // Give the worker supervisors a moment to stop their processes.
        tokio::time::sleep(Duration::from_millis(50)).await;
        result
    }
}

/// The token in `path`, or a new one written there (readable by this user only) when the
/// file does not exist.
fn token_from_file(path: &std::path::Path) -> anyhow::Result<String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::read_to_string(path) {
        Ok(text) => return Ok(text.trim().to_owned()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => bail!("cannot read the token file {}: {e}", path.display()),
    }
    let token = generate_api_key().0;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot create the token file {}", path.display()))?;
    writeln!(file, "{token}").with_context(|| format!("writing the token file {}", path.display()))?;
    Ok(token)
}

/// A fixed token is an API key: `ty_` and at least 16 bearer-token characters.
fn check_token(token: &str) -> anyhow::Result<()> {
    let rest = token.strip_prefix(API_KEY_PREFIX).unwrap_or_default();
    if rest.len() < 16 || !rest.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~+/".contains(&b)) {
        bail!(
            "--token must look like an API key: {API_KEY_PREFIX:?} followed by at least 16 characters of \
             A-Z a-z 0-9 - . _ ~ + / (e.g. {API_KEY_PREFIX}local-dev-token-0001)"
        );
    }
    Ok(())
}

/// Checks everything, binds both listeners and starts serving. Returns once `/healthz`
/// answers; the warm workers may still be starting ([`WarmPools::wait_started`]).
pub async fn start(args: LocalArgs) -> anyhow::Result<LocalGateway> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let dir =
        args.dir.canonicalize().with_context(|| format!("the tool folder {} does not exist", args.dir.display()))?;
    let catalog = Arc::new(LocalCatalog::load(&dir).map_err(|e| anyhow::anyhow!("{e}"))?);
    let tools = catalog.local_tools();
    let fixed_token = match (&args.token, &args.token_file) {
        (Some(token), _) => Some(token.clone()),
        (None, Some(path)) => Some(token_from_file(path)?),
        (None, None) => None,
    };
    if let Some(token) = &fixed_token {
        check_token(token)?;
    }
    let kill_grace =
        Duration::try_from_secs_f64(args.kill_grace).context("--kill-grace must be a non-negative number")?;

    let runner = setup::find_runner(args.runner.as_deref())?;
    let interpreters = setup::resolve_interpreters(&tools, &dir, args.python.as_deref())?;
    let python_package = setup::find_python_package(&dir);
    setup::check_python_package(&tools, python_package.as_deref(), &interpreters)?;

    let lock = DataDirLock::acquire(&args.data_dir)?;
    let data_dir = args.data_dir.canonicalize().unwrap_or_else(|_| args.data_dir.clone());
    // Call files are flushed by the OS, not on every write: a local call needs no disk flush.
    let store = FsStore::new(&data_dir).with_context(|| format!("data folder {}", data_dir.display()))?;
    let store = Arc::new(store.with_durability(Durability::Buffered));

    let public_socket = listen(&args.listen, "--listen")?;
    let addr = public_socket.local_addr()?;
    if args.anonymous && !addr.ip().is_loopback() {
        bail!("--anonymous lets requests without a token in: use it only with a loopback --listen, not {addr}");
    }
    let metrics_socket = match args.metrics_listen.as_deref().map(str::trim).filter(|a| !a.is_empty()) {
        Some(metrics_addr) => Some(listen(metrics_addr, "--metrics-listen")?),
        None => None,
    };
    let metrics_addr = metrics_socket.as_ref().map(std::net::TcpListener::local_addr).transpose()?;
    let internal_socket = std::net::TcpListener::bind("127.0.0.1:0").context("binding the internal listener")?;
    internal_socket.set_nonblocking(true)?;
    let internal_url = format!("http://{}", internal_socket.local_addr()?);

    // A fresh master key per start: runner tokens live no longer than this process.
    let key = SigningKey::from_bytes(rand::random());
    let background = CancellationToken::new();
    // Agents' temporary folders; what a killed gateway left there goes (the lock is ours).
    let scratch = data_dir.join("scratch");
    match std::fs::remove_dir_all(&scratch) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            bail!("cannot clear the agents' temporary folders in {}: {e}", scratch.display())
        }
        _ => {}
    }
    let task_settings = LocalTaskSettings {
        runner: runner.clone(),
        internal_url: internal_url.clone(),
        workdir: data_dir.clone(),
        scratch,
        python: setup::agent_python(args.python.as_deref(), &interpreters),
        python_package: python_package.clone(),
        kill_grace,
        max_running: args.max_calls,
    };
    let launch =
        LaunchSettings { runner, internal_url, tools_dir: dir.clone(), python_package, interpreters, kill_grace };
    crate::store::retention::start(store.clone(), args.data.retention_days, background.clone()).await;
    let pools = Arc::new(WarmPools::start(&catalog.tools(), &launch, background.clone()));
    let results = Arc::new(LocalResults::default());
    let dialer = LocalDialer::new(launch.clone());
    let executor =
        LocalExecutor::new(launch, key.clone(), store.clone(), results.clone(), pools.clone(), args.max_calls)?;

    let metrics = Arc::new(Metrics::new());
    let (authz_metrics, auth_metrics) = (AuthzMetrics::default(), AuthMetrics::default());
    metrics.register(|r| {
        authz_metrics.register(r);
        auth_metrics.register(r);
    });
    let models = args.models.build(&metrics)?;
    if nix::unistd::geteuid().is_root() && !models.profiles().is_empty() {
        tracing::warn!(
            "running as root: coding agents' model-written code runs as root too (with no capability, but it \
             reads every file root owns); run the local mode as an ordinary user"
        );
    }
    let authorizer = match &args.policy {
        Some(path) => PolicyAuthorizer::from_file(path)?,
        None => PolicyAuthorizer::parse(&default_policy(&args.user), "the default local policy")?,
    }
    .with_metrics(authz_metrics);

    let token = fixed_token.unwrap_or_else(|| generate_api_key().0);
    let key_entry = ApiKey::new(args.user.clone(), Vec::new(), &hash_api_key(&token)).map_err(anyhow::Error::msg)?;
    let local_key: Arc<dyn Authenticator> = Arc::new(ApiKeyAuthenticator::from_keys(vec![key_entry]));
    let mut allowed_hosts = loopback_hosts();
    allowed_hosts.extend(args.allowed_hosts.iter().map(|h| h.trim().to_owned()).filter(|h| !h.is_empty()));
    let metadata = ProtectedResourceMetadata {
        default_scheme: "http".into(),
        resource_name: Some("Toolyard (local)".into()),
        allowed_hosts: AllowedHosts::new(&allowed_hosts),
        own_authorization_server: true,
        ..ProtectedResourceMetadata::default()
    };
    // Clients that sign in only through OAuth get their tokens from the gateway itself.
    let authorization = LocalAuthorization::new(local_key.clone(), &args.user, metadata.clone());
    let mut chain = AuthChain::new(vec![local_key, authorization.clone()]).with_metrics(auth_metrics);
    if args.anonymous {
        tracing::warn!(user = %args.user, "--anonymous: requests without a token act as the local user");
        let local_user = crate::Identity {
            issuer: "apikey".into(),
            user: args.user.clone(),
            groups: Vec::new(),
            scopes: Vec::new(),
        };
        chain = chain.with_anonymous(local_user);
    }
    let auth = Arc::new(AuthState { chain, metadata, required_scopes: Vec::new(), scoped_issuers: Vec::new() });

    let settings = Settings {
        allowed_hosts,
        allowed_origins: crate::serve::allowed_origins(&args.allowed_origins),
        metrics_on_public: false,
        // One token, one user: the per-user call limit is the gateway's own.
        limits: crate::limits::LimitSettings {
            storage_quota_bytes: args.data.storage_quota_bytes,
            max_calls_per_user: crate::limits::LimitSettings::default().max_calls,
            ..crate::limits::LimitSettings::default()
        },
        ..Settings::default()
    };
    let tokens = ShutdownTokens::default();
    let executor: Arc<dyn Executor> = Arc::new(executor);
    let flushed = executor.clone();
    let upstreams = Upstreams::new(
        catalog.clone(),
        args.upstream.settings("local".into()),
        Arc::new(LogStatus),
        Arc::new(dialer),
        executor.records(),
        background.clone(),
    )?;
    upstreams.apply(
        catalog
            .servers()
            .iter()
            .map(|s| ServerConfig {
                namespace: String::new(),
                name: s.name.clone(),
                generation: 1,
                spec: s.spec.clone(),
                available: true,
            })
            .collect(),
    );
    let backends = Backends {
        catalog: Arc::new(upstreams.clone()),
        executor,
        store: store.clone(),
        authorizer: Arc::new(authorizer),
        tasks: Arc::new(LocalTaskBackend(LocalTasks::new(store, key.clone(), task_settings, background.clone()))),
        models,
        recorder: results,
        signing_key: key,
        auth,
        public_routes: oauth::router(authorization),
    };
    let Assembled { state, public, internal } =
        assemble(backends, settings, InternalLimits::default(), metrics, &tokens);
    let server_metrics = Arc::clone(&state.metrics);

    let mut listeners = vec![
        Listener { name: "public", socket: public_socket, router: public, tls: None, drain: Drain::First },
        Listener { name: "internal", socket: internal_socket, router: internal, tls: None, drain: Drain::Last },
    ];
    if let Some(socket) = metrics_socket {
        let router = crate::app::ops_router(state);
        listeners.push(Listener { name: "metrics", socket, router, tls: None, drain: Drain::Last });
    }
    let server = ServerSettings {
        shutdown_grace: Duration::from_secs(5),
        body_read_timeout: Duration::from_secs(args.body_read_timeout_seconds),
        metrics: Some(server_metrics),
        ..ServerSettings::default()
    };
    let serve_tokens = tokens.clone();
    let served = tokio::spawn(async move {
        let result = crate::server::serve(listeners, &server, serve_tokens).await;
        flushed.flush().await;
        result
    });
    wait_healthy(addr).await?;
    Ok(LocalGateway {
        addr,
        metrics_addr,
        token,
        data_dir,
        catalog,
        upstreams,
        pools,
        tokens,
        background,
        served,
        _lock: lock,
    })
}

/// A non-blocking listener on `addr`, with errors that name `flag`.
fn listen(addr: &str, flag: &str) -> anyhow::Result<std::net::TcpListener> {
    let socket = std::net::TcpListener::bind(addr).map_err(|e| match e.kind() {
        std::io::ErrorKind::AddrInUse => anyhow::anyhow!(
            "cannot listen on {addr}: the port is already in use (another toolyard-gateway, or another program). \
             Stop it or choose another address with {flag} 127.0.0.1:PORT"
        ),
        _ => anyhow::anyhow!("cannot listen on {addr}: {e}"),
    })?;
    socket.set_nonblocking(true)?;
    Ok(socket)
}

/// The policy without `--policy`: the local user may do everything.
pub fn default_policy(user: &str) -> String {
    format!(
        "rules:\n  - users: [{}]\n    tools: [\"*\"]\n    codingTasks: true\n",
        serde_json::Value::String(user.to_owned())
    )
}

async fn wait_healthy(addr: SocketAddr) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    let url = format!("http://{addr}/healthz");
    for _ in 0..200 {
        if client.get(&url).send().await.is_ok_and(|r| r.status().is_success()) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    bail!("the gateway did not answer on {url}")
}

/// Runs `toolyard-gateway local` until SIGTERM/SIGINT.
pub async fn run(args: LocalArgs) -> anyhow::Result<()> {
    let telemetry = crate::logging::init(args.log_format);
    let gateway = start(args).await?;
    if let Err(e) = gateway.pools.wait_started().await {
        tracing::warn!(error = %e, "a warm worker did not start; its tool fails until it does (see above)");
    }
    print!("{}", banner::text(&gateway));
    let stopped = gateway.wait().await;
    telemetry.shutdown();
    stopped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_tokens_must_be_api_keys_and_the_default_policy_parses() {
        assert!(check_token("ty_local-dev-token-0001").is_ok());
        let dir = std::env::temp_dir().join(format!("toolyard-token-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        let made = token_from_file(&path).unwrap();
        assert!(check_token(&made).is_ok(), "{made}");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(token_from_file(&path).unwrap(), made, "the file's token is read back");
        std::fs::remove_dir_all(&dir).ok();
        for bad in ["local-dev-token-0001", "ty_short", "ty_has space in it ok", ""] {
            assert!(check_token(bad).is_err(), "{bad:?}");
        }
        assert!(PolicyAuthorizer::parse(&default_policy("me: \"odd\""), "test").is_ok());
    }
}

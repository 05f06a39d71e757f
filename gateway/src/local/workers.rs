//! Warm local workers for Pool-mode tools: one `toolyard-runner serve` process per tool on a
//! loopback port, holding the tool's derived pool key, restarted when it dies.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_util::sync::CancellationToken;
use toolyard_api::protocol::pool;
use toolyard_api::token::SigningKey;

use crate::catalog::Tool;
use crate::executor::local::{LaunchSettings, ProcessTree, runner_command};

/// Longest a worker may take to start (import the tool, report ready, listen).
const STARTUP_TIMEOUT: Duration = Duration::from_secs(180);
/// A worker that ran this long before dying is restarted at once, not after a back-off.
const STABLE_AFTER: Duration = Duration::from_secs(60);

/// The warm worker of one tool.
#[derive(Debug)]
pub struct WarmPool {
    tool: String,
    key: SigningKey,
    endpoint: RwLock<Option<String>>,
    last_error: RwLock<Option<String>>,
    up: tokio::sync::watch::Sender<bool>,
}

impl WarmPool {
    /// The pool's base URL while its server runs.
    pub fn endpoint(&self) -> Option<String> {
        self.endpoint.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The pool's derived key (the gateway signs its call tokens with it).
    pub fn key(&self) -> &SigningKey {
        &self.key
    }

    /// Why the last start failed, if it did.
    pub fn last_error(&self) -> Option<String> {
        self.last_error.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set(&self, endpoint: Option<String>, error: Option<String>) {
        let up = endpoint.is_some();
        *self.endpoint.write().unwrap_or_else(|e| e.into_inner()) = endpoint;
        if error.is_some() || up {
            *self.last_error.write().unwrap_or_else(|e| e.into_inner()) = error;
        }
        self.up.send_replace(up);
    }
}

/// The warm workers of every Pool-mode tool, by McpTool object name.
#[derive(Debug, Default)]
pub struct WarmPools {
    pools: HashMap<String, Arc<WarmPool>>,
}

impl WarmPools {
    /// Starts (and keeps running until `shutdown`) a worker for each Pool-mode tool.
    pub fn start(
        tools: &[Arc<Tool>],
        settings: &LaunchSettings,
        master: &SigningKey,
        shutdown: CancellationToken,
    ) -> Self {
        let mut pools = HashMap::new();
        for tool in tools.iter().filter(|t| t.spec.execution.mode == toolyard_api::mcptool::ExecutionMode::Pool) {
            let pool = Arc::new(WarmPool {
                tool: tool.name().to_owned(),
                key: master.derive(&pool::key_purpose(&tool.namespace, &tool.object_name)),
                endpoint: RwLock::new(None),
                last_error: RwLock::new(None),
                up: tokio::sync::watch::Sender::new(false),
            });
            tokio::spawn(supervise(Arc::clone(&pool), Arc::clone(tool), settings.clone(), shutdown.clone()));
            pools.insert(tool.object_name.clone(), pool);
        }
        Self { pools }
    }

    /// The pool of a tool.
    pub fn get(&self, object_name: &str) -> Option<Arc<WarmPool>> {
        self.pools.get(object_name).cloned()
    }

    /// Waits until every worker listens, or returns the first start failure
    /// (`tool name: error`). For start-up messages; calls never wait on this.
    pub async fn wait_started(&self) -> Result<(), String> {
        for pool in self.pools.values() {
            let mut up = pool.up.subscribe();
            loop {
                if *up.borrow_and_update() {
                    break;
                }
                if let Some(error) = pool.last_error() {
                    return Err(format!("{}: {error}", pool.tool));
                }
                if up.changed().await.is_err() {
                    return Err(format!("{}: the worker supervisor stopped", pool.tool));
                }
            }
        }
        Ok(())
    }
}

/// Runs the tool's `toolyard-runner serve`, restarting it (with a back-off) when it ends.
async fn supervise(pool: Arc<WarmPool>, tool: Arc<Tool>, settings: LaunchSettings, shutdown: CancellationToken) {
    let mut backoff = Duration::from_secs(1);
    loop {
        let started = Instant::now();
        let outcome = tokio::select! {
            outcome = run_once(&pool, &tool, &settings) => outcome,
            () = shutdown.cancelled() => return,
        };
        pool.set(None, Some(outcome.clone()));
        if started.elapsed() >= STABLE_AFTER {
            backoff = Duration::from_secs(1);
        }
        tracing::warn!(tool = %pool.tool, error = %outcome, retry_in_s = backoff.as_secs(), "warm worker stopped; restarting");
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = shutdown.cancelled() => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(30));
    }
}

/// One life of the worker: start, publish its address, wait for its end. Returns why it ended.
async fn run_once(pool: &WarmPool, tool: &Tool, settings: &LaunchSettings) -> String {
    let launch = settings.launch(tool);
    let execution = &tool.spec.execution;
    let pool_spec = execution.pool.clone().unwrap_or_default();
    let slots = (pool_spec.replicas.max(1) * pool_spec.concurrency.max(1)).clamp(1, 64);
    let mut command = runner_command(&settings.runner, &launch);
    command
        .args(["serve", "--host", "127.0.0.1", "--port", "0", "--exit-on-stdin-eof"])
        .arg("--concurrency")
        .arg(slots.to_string())
        .arg(format!("--reuse={}", pool_spec.reuse_process))
        .arg("--kill-grace")
        .arg(format!("{:.3}", settings.kill_grace.as_secs_f64()))
        .arg("--")
        .args(&launch.argv)
        .env(pool::env::KEY, pool.key.to_hex())
        // The worker exits when the gateway goes away and this pipe closes.
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => return format!("cannot start the runner {}: {e}", settings.runner.display()),
    };
    let tree = ProcessTree::new(child.id());
    let _stdin = child.stdin.take();
    let Some(stdout) = child.stdout.take() else { return "the worker's stdout is missing".into() };
    let mut lines = BufReader::new(stdout).lines();
    let first = tokio::time::timeout(STARTUP_TIMEOUT, lines.next_line()).await;
    let addr = match first {
        Ok(Ok(Some(line))) => match line.strip_prefix("listening on ") {
            Some(addr) => addr.to_owned(),
            None => return format!("unexpected first line from the worker: {line:?}"),
        },
        Ok(_) => {
            let status = child.wait().await.ok();
            return format!(
                "the worker exited while starting ({})",
                status.map_or("unknown status".into(), |s| s.to_string())
            );
        }
        Err(_) => return format!("the worker did not start within {}s", STARTUP_TIMEOUT.as_secs()),
    };
    let endpoint = format!("http://{addr}");
    tracing::info!(tool = %pool.tool, %endpoint, slots, reuse = pool_spec.reuse_process, "warm worker listening");
    pool.set(Some(endpoint), None);
    // Keep reading stdout so the worker never blocks on a full pipe.
    let drain = tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let status = child.wait().await;
    drain.abort();
    tree.disarm();
    match status {
        Ok(s) => format!("the worker exited ({s})"),
        Err(e) => format!("cannot wait for the worker: {e}"),
    }
}

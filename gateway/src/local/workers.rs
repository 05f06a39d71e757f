//! Warm local workers for Pool-mode tools: one [`WorkerPool`] per tool, run by the gateway
//! process itself (no pool server, no HTTP hop): a fresh tool process per call, or with
//! `reuseProcess` one long-lived JSON-lines worker per slot, each in its own process group.
//!
//! A worker that dies or hangs is killed and replaced by its pool; a slot whose worker could
//! not start starts one when a call needs it. [`WarmPools::close`] (at shutdown) kills the
//! idle workers; the others end with their call, or when their stdin (held by this process)
//! closes.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use toolyard_api::mcptool::ExecutionMode;
use toolyard_process::capture::DEFAULT_LOG_LIMIT;
use toolyard_process::child::ToolCommand;
use toolyard_process::pool::{PoolSettings, WorkerPool};

use crate::catalog::Tool;
use crate::executor::local::{Launch, LaunchSettings};

/// Longest a worker may take to start (import the tool, report ready).
const STARTUP_TIMEOUT: Duration = Duration::from_secs(180);
/// Most slots of one tool.
const MAX_SLOTS: usize = 64;

/// The warm workers of every Pool-mode tool, by McpTool object name.
#[derive(Debug, Default)]
pub struct WarmPools {
    pools: HashMap<String, Arc<WorkerPool>>,
}

impl WarmPools {
    /// Creates a pool for each Pool-mode tool and starts its workers in the background; the
    /// pools are closed when `shutdown` is cancelled.
    pub fn start(tools: &[Arc<Tool>], settings: &LaunchSettings, shutdown: CancellationToken) -> Self {
        let mut pools = HashMap::new();
        for tool in tools.iter().filter(|t| t.spec.execution.mode == ExecutionMode::Pool) {
            let pool = WorkerPool::new(pool_settings(tool, &settings.launch(tool), settings.kill_grace));
            let (name, reuse, slots) = (tool.name().to_owned(), pool.settings().reuse, pool.settings().concurrency);
            tokio::spawn({
                let pool = Arc::clone(&pool);
                async move {
                    pool.start().await;
                    match pool.wait_started().await {
                        Ok(()) => tracing::info!(tool = %name, slots, reuse, "warm workers ready"),
                        Err(error) => tracing::warn!(tool = %name, %error, "a warm worker did not start"),
                    }
                }
            });
            tokio::spawn({
                let (pool, shutdown) = (Arc::clone(&pool), shutdown.clone());
                async move {
                    shutdown.cancelled().await;
                    pool.close();
                }
            });
            pools.insert(tool.object_name.clone(), pool);
        }
        Self { pools }
    }

    /// The pool of a tool.
    pub fn get(&self, object_name: &str) -> Option<Arc<WorkerPool>> {
        self.pools.get(object_name).cloned()
    }

    /// Waits until every pool's workers started, or returns the first start failure
    /// (`tool name: error`). For start-up messages; calls never wait on this.
    pub async fn wait_started(&self) -> Result<(), String> {
        for (name, pool) in &self.pools {
            pool.wait_started().await.map_err(|e| format!("{name}: {e}"))?;
        }
        Ok(())
    }

    /// Closes every pool: idle workers are killed, further calls refused.
    pub fn close(&self) {
        self.pools.values().for_each(|p| p.close());
    }
}

/// The pool of `tool` as it runs here: `replicas × concurrency` slots and `replicas × queue`
/// waiting calls (the machine is every replica), the tool's folder and environment, the
/// gateway's own settings kept away.
pub fn pool_settings(tool: &Tool, launch: &Launch, kill_grace: Duration) -> PoolSettings {
    let spec = tool.spec.execution.pool.clone().unwrap_or_default();
    let slots = usize::try_from(spec.replicas.max(1) * spec.concurrency.max(1)).unwrap_or(1).clamp(1, MAX_SLOTS);
    PoolSettings {
        command: ToolCommand {
            argv: launch.argv.clone(),
            cwd: Some(launch.cwd.clone()),
            env: launch.env.clone(),
            env_remove: crate::executor::local::gateway_only_env(),
        },
        reuse: spec.reuse_process,
        concurrency: slots,
        queue: usize::try_from(spec.replicas.max(1) * spec.queue_length()).unwrap_or(0),
        startup_timeout: STARTUP_TIMEOUT,
        kill_grace,
        log_limit: DEFAULT_LOG_LIMIT,
    }
}

//! [`Executor`] for the embedded local mode: each Job-mode call is a `toolyard-runner call`
//! child process (in its own process group, with the same environment contract as a Job
//! pod), each Pool-mode call runs on the tool's warm `WorkerPool` in this process
//! ([`crate::local::workers`]), its input, result and logs stored as a Job call's.
//!
//! Job calls: the input is stored, a call token is minted with the master key, the runner
//! fetches the input and uploads logs and result through the local internal API, and
//! [`LocalResults`] (the internal API's [`ResultRecorder`]) hands the result back here. At
//! most `max_concurrent_calls` runners run at once. The runner enforces the tool's timeout
//! itself (`--timeout`); as a backstop the whole tree (the runner's group and its tool's
//! group) is killed at the deadline plus a grace, and on cancellation.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::io::AsyncReadExt;
use tokio::sync::{Semaphore, oneshot};
use toolyard_api::OwnerKey;
use toolyard_api::mcptool::{ExecutionMode, Runtime};
use toolyard_api::protocol::{CallErrorKind, CallResult, env};
use toolyard_api::storage::{CallFile, RunId};
use toolyard_api::token::{Claims, RunKind, SigningKey};
use toolyard_process::pool::{PoolCall, Readiness};
use toolyard_process::progress::ProgressLog;

use super::events::{self, ProgressHub};
use super::pool::{CallRecord, CallRecords, call_file};
use super::{CallRequest, CallState, Executor, ResultRecorder};
use crate::catalog::Tool;
use crate::local::workers::WarmPools;
use crate::store::ArtifactStore;
use crate::{Error, Result};

/// Extra time after the tool's deadline and kill grace before the runner's tree is killed.
const BACKSTOP_SLACK: Duration = Duration::from_secs(10);
/// Bytes kept of a runner's own stderr (for its error messages).
const RUNNER_STDERR_LIMIT: usize = 64 * 1024;

/// How tool processes are started on this machine.
#[derive(Clone, Debug)]
pub struct LaunchSettings {
    /// The `toolyard-runner` binary.
    pub runner: PathBuf,
    /// Base URL of the local internal API.
    pub internal_url: String,
    /// The folder of the manifests (working directories are relative to it).
    pub tools_dir: PathBuf,
    /// The bundled Python package folder (`worker-image/python`), added to `PYTHONPATH`.
    pub python_package: Option<PathBuf>,
    /// Bare interpreter names (`python3`) resolved to the real interpreter, so a call does
    /// not go through a version manager's shim.
    pub interpreters: HashMap<String, PathBuf>,
    /// Time between SIGTERM and SIGKILL of a tool's process group.
    pub kill_grace: Duration,
}

/// The command line, folder and environment of one tool's processes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    /// Program and arguments (`command` + `args`, interpreter resolved).
    pub argv: Vec<String>,
    /// Working directory.
    pub cwd: PathBuf,
    /// Variables set for the tool (its manifest's `env`, `PYTHONPATH`).
    pub env: Vec<(String, String)>,
}

impl LaunchSettings {
    /// How `tool` runs here.
    pub fn launch(&self, tool: &Tool) -> Launch {
        self.launch_runtime(&tool.spec.runtime)
    }

    /// How a command of `runtime` (a tool's, or an McpServer's) runs here.
    pub fn launch_runtime(&self, runtime: &Runtime) -> Launch {
        let mut argv: Vec<String> = runtime.command.iter().chain(&runtime.args).cloned().collect();
        if let Some(real) = argv.first().and_then(|p| self.interpreters.get(p)) {
            argv[0] = real.display().to_string();
        }
        let cwd = match &runtime.working_dir {
            Some(dir) => self.tools_dir.join(dir),
            None => self.tools_dir.clone(),
        };
        let mut env: Vec<(String, String)> =
            runtime.env.iter().filter_map(|e| Some((e.name.clone(), e.value.clone()?))).collect();
        if !env.iter().any(|(name, _)| name == "PYTHONPATH") {
            let mut parts = vec![self.tools_dir.display().to_string()];
            parts.extend(self.python_package.iter().map(|p| p.display().to_string()));
            parts.extend(std::env::var("PYTHONPATH").ok().filter(|p| !p.is_empty()));
            env.push(("PYTHONPATH".into(), parts.join(":")));
        }
        Launch { argv, cwd, env }
    }
}

/// Variables of the gateway's environment that its tool processes must not inherit: every
/// `TOOLYARD_*` variable (the local token, key paths, settings) and `TRACEPARENT`.
pub fn gateway_only_env() -> Vec<String> {
    std::env::vars_os()
        .filter_map(|(name, _)| name.into_string().ok())
        .filter(|name| name.starts_with("TOOLYARD_") || name == env::TRACEPARENT)
        .collect()
}

/// A command for a runner process of `launch`: its own process group, the gateway's
/// environment without [`gateway_only_env`], plus the tool's.
pub fn runner_command(runner: &Path, launch: &Launch) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(runner);
    command.current_dir(&launch.cwd).process_group(0).stdin(Stdio::null());
    for name in gateway_only_env() {
        command.env_remove(name);
    }
    command.envs(launch.env.iter().map(|(k, v)| (k, v)));
    command
}

/// Waiters for call results, woken by the internal API when a runner uploads one.
#[derive(Debug, Default)]
pub struct LocalResults {
    waiters: Mutex<HashMap<(OwnerKey, String), oneshot::Sender<CallResult>>>,
}

impl LocalResults {
    fn waits_for(&self, owner: &OwnerKey, id: &RunId) -> bool {
        self.waiters.lock().unwrap_or_else(|e| e.into_inner()).contains_key(&(owner.clone(), id.to_string()))
    }

    fn register(&self, owner: &OwnerKey, id: &RunId) -> oneshot::Receiver<CallResult> {
        let (tx, rx) = oneshot::channel();
        self.waiters.lock().unwrap_or_else(|e| e.into_inner()).insert((owner.clone(), id.to_string()), tx);
        rx
    }

    fn forget(&self, owner: &OwnerKey, id: &RunId) {
        self.waiters.lock().unwrap_or_else(|e| e.into_inner()).remove(&(owner.clone(), id.to_string()));
    }
}

#[async_trait]
impl ResultRecorder for LocalResults {
    async fn record(&self, _namespace: &str, call: &RunId, owner: &OwnerKey, result: &CallResult) -> Result<()> {
        let waiter = self.waiters.lock().unwrap_or_else(|e| e.into_inner()).remove(&(owner.clone(), call.to_string()));
        if let Some(tx) = waiter {
            let _ = tx.send(result.clone());
        }
        Ok(())
    }
}

/// The local executor.
pub struct LocalExecutor {
    settings: LaunchSettings,
    key: SigningKey,
    store: Arc<dyn ArtifactStore>,
    results: Arc<LocalResults>,
    slots: Arc<Semaphore>,
    pools: Arc<WarmPools>,
    records: Arc<CallRecords>,
    progress: Arc<ProgressHub>,
}

impl std::fmt::Debug for LocalExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalExecutor").field("settings", &self.settings).finish_non_exhaustive()
    }
}

impl LocalExecutor {
    /// An executor running at most `max_concurrent_calls` Job-mode runners at once; Pool-mode
    /// calls go to `pools`. `results` must be the internal API's recorder.
    pub fn new(
        settings: LaunchSettings,
        key: SigningKey,
        store: Arc<dyn ArtifactStore>,
        results: Arc<LocalResults>,
        pools: Arc<WarmPools>,
        max_concurrent_calls: usize,
    ) -> Result<Self> {
        let records = Arc::new(CallRecords::new(Arc::clone(&store)));
        let slots = Arc::new(Semaphore::new(max_concurrent_calls.max(1)));
        Ok(Self { settings, key, store, results, slots, pools, records, progress: Arc::default() })
    }

    /// A Pool-mode call on the tool's warm pool in this process: the call runs (bounded by
    /// the tool's timeout; a call that must first start a worker is bounded by the timeout
    /// plus a grace), then its input, result and logs are recorded as for a call on a
    /// Kubernetes pool ([`CallRecords`]: written after the answer).
    async fn call_pool(&self, request: CallRequest) -> Result<CallResult> {
        let name = &request.tool.object_name;
        let pool = self.pools.get(name).ok_or_else(|| Error::Internal(format!("no warm workers for tool {name}")))?;
        if pool.readiness() == Readiness::Starting {
            return Err(Error::Unavailable(format!(
                "the warm workers of tool {} are still starting; try again shortly",
                request.tool.name()
            )));
        }
        let owner = request.caller.owner_key();
        let id = request.id.as_str();
        let timeout = request.tool.timeout();
        let input = serde_json::to_vec(&request.arguments).map_err(|e| Error::Internal(e.to_string()))?;
        // The function's reports go to the waiting caller as they come, and into the call's log.
        let progress = ProgressLog::new(request.progress.clone());
        let reporter = progress.reporter();
        let caller = request.tool.spec.caller_identity.then(|| request.caller.owner());
        let call = PoolCall {
            id,
            arguments: &request.arguments,
            timeout,
            traceparent: request.traceparent.as_deref(),
            progress: Some(&reporter),
            caller: caller.as_ref(),
            owner: &owner,
        };
        let started = std::time::Instant::now();
        let limit = timeout + self.settings.kill_grace + Duration::from_secs(5);
        let outcome = tokio::select! {
            () = request.cancel.cancelled() => None,
            r = tokio::time::timeout(limit, pool.call(call)) => Some(r),
        };
        let mut files = Vec::new();
        let (mut result, stdout, stderr) = match outcome {
            None => (cancelled(ms(started.elapsed())), None, None),
            Some(Ok(Ok(output))) => {
                files = output.files.into_iter().map(|o| o.bytes).collect();
                (output.result, Some(output.stdout.into_text()), Some(output.stderr.into_text()))
            }
            Some(Ok(Err(refused))) => return Err(super::pool_refused(refused)),
            Some(Err(_)) => {
                let message = format!("timed out after {}s", timeout.as_secs());
                (CallResult::err(CallErrorKind::TimedOut, message, None, ms(started.elapsed())), None, None)
            }
        };
        super::pool::store_outputs(self.records.store(), &owner, id, &mut result, files).await?;
        let log = events::pool_log(&request, progress.events(), &result);
        self.records.record(CallRecord::new(owner, id, input, &result, stdout, stderr).with_events(log)).await;
        Ok(result)
    }

    /// A Job-mode call: its runner reports progress through the internal API, which passes it
    /// on to the caller through [`ProgressHub`]; `call_finished` closes its log.
    async fn call_job(&self, request: CallRequest) -> Result<CallResult> {
        events::run_job_call(&self.progress, &self.records, request, |request| self.run_job(request)).await
    }

    async fn run_job(&self, mut request: CallRequest) -> Result<CallResult> {
        let _slot = tokio::select! {
            slot = Arc::clone(&self.slots).acquire_owned() => slot.map_err(|_| Error::Unavailable("shutting down".into()))?,
            () = request.cancel.cancelled() => return Ok(cancelled(0)),
        };
        let owner = request.caller.owner_key();
        let id = request.id.clone();
        let timeout = request.tool.timeout();
        let input = serde_json::to_vec(&request.arguments).map_err(|e| Error::Internal(e.to_string()))?;
        events::store_start(self.store.as_ref(), self.records.event_logs(), &owner, &request, Bytes::from(input))
            .await?;

        let backstop = timeout + self.settings.kill_grace + BACKSTOP_SLACK;
        let claims = Claims {
            kind: RunKind::Call,
            ns: String::new(),
            id: id.to_string(),
            owner: request.caller.owner(),
            exp: now() + i64::try_from(backstop.as_secs()).unwrap_or(3600) + 60,
        };
        let launch = self.settings.launch(&request.tool);
        let mut command = runner_command(&self.settings.runner, &launch);
        command
            .arg("call")
            .arg("--timeout")
            .arg(timeout.as_secs().to_string())
            .arg("--kill-grace")
            .arg(format!("{:.3}", self.settings.kill_grace.as_secs_f64()))
            .arg("--")
            .args(&launch.argv)
            .env(env::GATEWAY_URL, &self.settings.internal_url)
            .env(env::TOKEN, self.key.sign(&claims))
            .env(env::RUN_ID, id.as_str())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(tp) = &request.traceparent {
            command.env(env::TRACEPARENT, tp);
        }
        if request.tool.spec.caller_identity {
            let caller = serde_json::to_string(&request.caller.owner()).map_err(|e| Error::Internal(e.to_string()))?;
            command.env(env::CALLER, caller);
        }

        let notified = self.results.register(&owner, &id);
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                self.results.forget(&owner, &id);
                let runner = self.settings.runner.display();
                return Err(Error::Unavailable(format!("cannot start the runner {runner}: {e}")));
            }
        };
        let tree = ProcessTree::new(child.id());
        let stderr = child.stderr.take().map(|s| tokio::spawn(read_bounded(s, RUNNER_STDERR_LIMIT)));
        tracing::debug!(call = %id, "runner started");
        if let Some(started) = request.task_started.take() {
            // The runner is a child of this process: an MCP task's run ends with it (and then
            // reads as lost).
            let _ = started.send(());
        }

        enum Ended {
            Notified(CallResult),
            Exited(std::io::Result<std::process::ExitStatus>),
            Backstop,
            Cancelled,
        }
        let ended = tokio::select! {
            Ok(result) = notified => Ended::Notified(result),
            status = child.wait() => Ended::Exited(status),
            () = tokio::time::sleep(backstop) => Ended::Backstop,
            () = request.cancel.cancelled() => Ended::Cancelled,
        };
        let result = match ended {
            Ended::Notified(result) => {
                // The runner exits right after its upload; reap it without waiting here.
                tokio::spawn(async move {
                    if tokio::time::timeout(Duration::from_secs(10), child.wait()).await.is_err() {
                        tree.kill();
                    }
                    tree.disarm();
                });
                return Ok(result);
            }
            Ended::Exited(status) => {
                tree.disarm();
                self.results.forget(&owner, &id);
                match self.store.get(&owner, &call_file(id.as_str(), CallFile::Result)).await? {
                    Some(bytes) => serde_json::from_slice(&bytes)
                        .map_err(|e| Error::Internal(format!("the stored result of {id} is not a call result: {e}")))?,
                    None => {
                        let stderr = match stderr {
                            Some(task) => task.await.unwrap_or_default(),
                            None => String::new(),
                        };
                        let last = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no message");
                        tracing::error!(call = %id, status = ?status.ok(), runner_error = last, "the runner failed");
                        return Err(Error::Internal(format!("the runner of call {id} failed: {last}")));
                    }
                }
            }
            Ended::Backstop => {
                tree.kill();
                self.results.forget(&owner, &id);
                let _ = child.wait().await;
                let message = format!("the call timed out after {}s and its processes were killed", timeout.as_secs());
                CallResult::err(CallErrorKind::TimedOut, message, None, ms(backstop))
            }
            Ended::Cancelled => {
                self.results.forget(&owner, &id);
                // The runner forwards SIGTERM to the tool's group and reports; then the backstop.
                tree.terminate_runner();
                if tokio::time::timeout(self.settings.kill_grace + Duration::from_secs(5), child.wait()).await.is_err()
                {
                    tree.kill();
                    let _ = child.wait().await;
                }
                tree.disarm();
                cancelled(0)
            }
        };
        Ok(result)
    }
}

#[async_trait]
impl Executor for LocalExecutor {
    async fn call(&self, request: CallRequest) -> Result<CallResult> {
        match request.tool.spec.execution.mode {
            ExecutionMode::Pool => self.call_pool(request).await,
            ExecutionMode::Job => self.call_job(request).await,
        }
    }

    /// A Job-mode call runs while its runner's result is awaited in this process; runners do
    /// not outlive the process, so nothing else runs.
    async fn call_state(&self, owner: &OwnerKey, id: &RunId) -> Result<CallState> {
        Ok(if self.results.waits_for(owner, id) { CallState::Running } else { CallState::Unknown })
    }

    async fn flush(&self) {
        self.records.flush().await;
    }

    fn records(&self) -> Option<Arc<CallRecords>> {
        Some(Arc::clone(&self.records))
    }

    fn progress_hub(&self) -> Option<Arc<ProgressHub>> {
        Some(Arc::clone(&self.progress))
    }
}

fn cancelled(duration_ms: u64) -> CallResult {
    CallResult::err(CallErrorKind::Cancelled, "the call was cancelled", None, duration_ms)
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Reads a child's stderr to its end, keeping its first `limit` bytes (the rest is drained so
/// the child never blocks on a full pipe).
pub async fn read_bounded(mut stream: tokio::process::ChildStderr, limit: usize) -> String {
    let mut kept = Vec::new();
    let mut buf = [0u8; 8192];
    while let Ok(n) = stream.read(&mut buf).await {
        if n == 0 {
            break;
        }
        let room = limit.saturating_sub(kept.len());
        kept.extend_from_slice(&buf[..n.min(room)]);
    }
    String::from_utf8_lossy(&kept).into_owned()
}

/// A runner process, the leader of its own group, whose tool runs in a group of its own.
/// Killing the tree kills both groups; dropping an armed tree kills it (a dropped call future
/// never leaves processes behind).
#[derive(Debug)]
pub struct ProcessTree {
    pid: Option<Pid>,
    armed: std::sync::atomic::AtomicBool,
}

impl ProcessTree {
    /// The tree of the runner `pid`.
    pub fn new(pid: Option<u32>) -> Self {
        Self {
            pid: pid.and_then(|p| i32::try_from(p).ok()).map(Pid::from_raw),
            armed: std::sync::atomic::AtomicBool::new(true),
        }
    }

    /// SIGTERM to the runner only: it stops its tool and reports.
    pub fn terminate_runner(&self) {
        if let Some(pid) = self.pid {
            let _ = kill(pid, Signal::SIGTERM);
        }
    }

    /// SIGKILL to the groups of the runner's children (its tool) and to the runner's group.
    pub fn kill(&self) {
        let Some(pid) = self.pid else { return };
        for child in children_of(pid.as_raw()) {
            let _ = killpg(Pid::from_raw(child), Signal::SIGKILL);
        }
        let _ = killpg(pid, Signal::SIGKILL);
    }

    /// The runner ended by itself: nothing to kill on drop.
    pub fn disarm(&self) {
        self.armed.store(false, std::sync::atomic::Ordering::Release);
    }
}

impl Drop for ProcessTree {
    fn drop(&mut self) {
        if self.armed.load(std::sync::atomic::Ordering::Acquire) {
            self.kill();
        }
    }
}

/// Children of `pid` (Linux `/proc/<pid>/task/*/children`; empty elsewhere).
fn children_of(pid: i32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| c.split_whitespace().filter_map(|p| p.parse().ok()).collect::<Vec<i32>>())
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use toolyard_api::mcptool::{EnvVar, McpToolSpec};

    use super::*;

    fn tool(command: &[&str], working_dir: Option<&str>, env: &[(&str, &str)]) -> Tool {
        let mut spec: McpToolSpec = serde_json::from_value(json!({
            "name": "t", "description": "d", "inputSchema": {"type": "object"},
            "runtime": {"image": "i", "command": command, "args": ["m:f"]},
        }))
        .unwrap();
        spec.runtime.working_dir = working_dir.map(str::to_owned);
        spec.runtime.env = env
            .iter()
            .map(|(n, v)| EnvVar { name: (*n).into(), value: Some((*v).into()), secret_key_ref: None })
            .collect();
        Tool::new(String::new(), "t".into(), 1, spec).unwrap()
    }

    fn settings() -> LaunchSettings {
        LaunchSettings {
            runner: "/bin/toolyard-runner".into(),
            internal_url: "http://127.0.0.1:1".into(),
            tools_dir: "/tools".into(),
            python_package: Some("/repo/worker-image/python".into()),
            interpreters: HashMap::from([("python3".to_owned(), PathBuf::from("/usr/bin/python3.11"))]),
            kill_grace: Duration::from_secs(1),
        }
    }

    #[test]
    fn interpreter_working_dir_and_pythonpath_are_resolved() {
        let launch = settings().launch(&tool(&["python3", "-m", "toolyard.run"], None, &[]));
        assert_eq!(launch.argv, ["/usr/bin/python3.11", "-m", "toolyard.run", "m:f"]);
        assert_eq!(launch.cwd, PathBuf::from("/tools"));
        let pythonpath = &launch.env.iter().find(|(k, _)| k == "PYTHONPATH").unwrap().1;
        assert!(pythonpath.starts_with("/tools:/repo/worker-image/python"), "{pythonpath}");

        let launch = settings().launch(&tool(&["./run.sh"], Some("sub"), &[("PYTHONPATH", "/mine"), ("A", "1")]));
        assert_eq!(launch.argv[0], "./run.sh");
        assert_eq!(launch.cwd, PathBuf::from("/tools/sub"));
        assert_eq!(launch.env, [("PYTHONPATH".to_owned(), "/mine".to_owned()), ("A".to_owned(), "1".to_owned())]);
        assert_eq!(settings().launch(&tool(&["x"], Some("/abs"), &[])).cwd, PathBuf::from("/abs"));
    }
}

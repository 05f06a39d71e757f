//! [`TaskBackend`] for the embedded mode: each task is a `toolyard-runner agent` child
//! process (its own process group, a task token minted with the local master key; its model
//! calls go through the gateway's model route, so it holds no model key), and its state is a `tasks/<id>/task.json`
//! record next to its other files in the store, so records and results survive restarts.
//!
//! A supervisor per agent waits for it to exit and stops it on cancellation (SIGTERM, then
//! SIGKILL of its tree after a grace) or at its deadline plus a backstop. If the agent ends
//! without uploading a result, the supervisor stores one saying why.
//!
//! Restarts: agents are children of the gateway, and runner tokens are signed with a key
//! made at each start, so a task cannot outlive the gateway that started it. At shutdown its
//! agent is killed; a task found pending or running without an agent (after a restart, or a
//! crash) ends as `failed` with a message saying the gateway stopped while it ran. Its files
//! (actions, events, artifacts) stay readable.

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use toolyard_api::agent::env::{AGENT_PYTHON, AGENT_PYTHONPATH};
use toolyard_api::agent::{TaskResult, TaskStatus};
use toolyard_api::codingtask::{Budgets, TaskType, ToolSelection};
use toolyard_api::protocol::env;
use toolyard_api::storage::{RunId, TaskFile};
use toolyard_api::token::{Claims, RunKind, SigningKey};
use toolyard_api::{Owner, OwnerKey};

use super::view::{self, task_folder, task_path};
use super::{NewTask, Phase, Position, Subset, TaskBackend, TaskRecord, now_ms};
use crate::executor::local::{Launch, ProcessTree, read_bounded, runner_command};
use crate::store::ArtifactStore;
use crate::store::fs::create_private_dirs;
use crate::{Error, Result};

/// Time after the deadline before a still-running agent is stopped by the gateway (the agent
/// stops itself at the deadline; this is the backstop).
const BACKSTOP_SLACK: Duration = Duration::from_secs(30);
/// Bytes kept of an agent's stderr (its log), for the message when it fails.
const STDERR_LIMIT: usize = 64 * 1024;
/// Name of the task record inside the task folder.
const RECORD_FILE: &str = "task.json";

/// How agents are started on this machine.
#[derive(Clone, Debug)]
pub struct LocalTaskSettings {
    /// The `toolyard-runner` binary.
    pub runner: PathBuf,
    /// Base URL of the local internal API.
    pub internal_url: String,
    /// Working directory of agent processes.
    pub workdir: PathBuf,
    /// Where each agent gets a folder of its own as its `TMPDIR` (`<scratch>/<task id>`), which
    /// the gateway removes when the agent exits, even when the agent was killed.
    pub scratch: PathBuf,
    /// The interpreter running the model's code.
    pub python: PathBuf,
    /// The folder holding the `toolyard` Python package (the harness), if not installed.
    pub python_package: Option<PathBuf>,
    /// Time between SIGTERM and SIGKILL when an agent is stopped.
    pub kill_grace: Duration,
    /// Agents running at once; more tasks are refused as busy until one ends.
    pub max_running: usize,
}

/// `task.json`: what the local backend records about a task.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredTask {
    id: String,
    owner: Owner,
    prompt: String,
    #[serde(default)]
    tools: ToolSelection,
    #[serde(default)]
    budgets: Budgets,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    profile: Option<String>,
    #[serde(default)]
    model_tokens: i64,
    created_ms: i64,
    state: Phase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    task_type: Option<TaskType>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    summary: Option<String>,
}

impl StoredTask {
    fn record(&self) -> Option<TaskRecord> {
        Some(TaskRecord {
            id: RunId::parse(&self.id).ok()?,
            namespace: String::new(),
            owner: self.owner.clone(),
            prompt: self.prompt.clone(),
            tools: self.tools.clone(),
            budgets: self.budgets.clone(),
            profile: self.profile.clone(),
            model_tokens: self.model_tokens,
            created_ms: self.created_ms,
            phase: self.state.clone(),
            task_type: self.task_type,
            summary: self.summary.clone(),
        })
    }
}

/// An agent running in this process.
struct Agent {
    stop: CancellationToken,
}

/// Tasks as local agent processes.
pub struct LocalTasks {
    store: Arc<dyn ArtifactStore>,
    key: SigningKey,
    settings: LocalTaskSettings,
    agents: Mutex<HashMap<String, Agent>>,
    /// Serializes read-modify-write of task records.
    writes: tokio::sync::Mutex<()>,
    version: watch::Sender<u64>,
    shutdown: CancellationToken,
}

impl std::fmt::Debug for LocalTasks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalTasks").field("settings", &self.settings).finish_non_exhaustive()
    }
}

/// How an agent's supervision ended.
enum End {
    Exited(String),
    Deadline,
    Cancelled,
    Shutdown,
}

impl LocalTasks {
    /// A backend starting agents with `settings`; runner tokens are signed with `key` (the
    /// internal API's master key). Agents are killed when `shutdown` fires.
    pub fn new(
        store: Arc<dyn ArtifactStore>,
        key: SigningKey,
        settings: LocalTaskSettings,
        shutdown: CancellationToken,
    ) -> Arc<Self> {
        Arc::new(Self {
            store,
            key,
            settings,
            agents: Mutex::new(HashMap::new()),
            writes: tokio::sync::Mutex::new(()),
            version: watch::channel(0).0,
            shutdown,
        })
    }

    fn bump(&self) {
        self.version.send_modify(|v| *v = v.wrapping_add(1));
    }

    fn running_here(&self, id: &str) -> bool {
        self.agents.lock().unwrap_or_else(|e| e.into_inner()).contains_key(id)
    }

    fn record_path(owner: &OwnerKey, id: &RunId) -> String {
        format!("{}{RECORD_FILE}", task_folder(owner, id))
    }

    async fn read(&self, owner: &OwnerKey, id: &RunId) -> Result<Option<StoredTask>> {
        let Some(bytes) = self.store.get(owner, &Self::record_path(owner, id)).await? else { return Ok(None) };
        match serde_json::from_slice::<StoredTask>(&bytes) {
            Ok(stored) if stored.id == id.as_str() && &stored.owner.key() == owner => Ok(Some(stored)),
            Ok(_) => Ok(None),
            Err(e) => Err(Error::Storage(format!("the record of task {id} does not parse: {e}"))),
        }
    }

    async fn write(&self, stored: &StoredTask) -> Result<()> {
        let owner = stored.owner.key();
        let id = RunId::parse(&stored.id).map_err(|e| Error::Internal(e.to_string()))?;
        let bytes = serde_json::to_vec_pretty(stored).map_err(|e| Error::Internal(e.to_string()))?;
        self.store.put(&owner, &Self::record_path(&owner, &id), Bytes::from(bytes)).await
    }

    /// Reads a record; one left pending or running without an agent here (the gateway
    /// stopped while it ran) is ended first.
    async fn load(&self, owner: &OwnerKey, id: &RunId) -> Result<Option<TaskRecord>> {
        let Some(stored) = self.read(owner, id).await? else { return Ok(None) };
        if stored.state.is_finished() || self.running_here(id.as_str()) {
            return Ok(stored.record());
        }
        let reason = "the gateway stopped while the task was running (in the embedded mode a task's agent is a \
                      child process of the gateway); its files are kept — start the task again";
        self.end(owner, id, TaskStatus::Failed, reason).await?;
        Ok(self.read(owner, id).await?.and_then(|s| s.record()))
    }

    /// Ends a task without an uploaded result: stores one saying `reason` (unless the agent
    /// stored its own meanwhile) and marks the record finished.
    async fn end(&self, owner: &OwnerKey, id: &RunId, status: TaskStatus, reason: &str) -> Result<()> {
        let _guard = self.writes.lock().await;
        let Some(mut stored) = self.read(owner, id).await? else {
            // Deleted meanwhile (`delete_task` cancels a running task, then deletes it).
            return Ok(());
        };
        let result = match view::stored_result(self.store.as_ref(), owner, id).await? {
            Some(result) => result,
            None => {
                let mut result = TaskResult::failed(status, reason);
                result.artifacts = view::artifacts(self.store.as_ref(), owner, id).await?;
                let bytes = serde_json::to_vec(&result).map_err(|e| Error::Internal(e.to_string()))?;
                self.store.put(owner, &task_path(owner, id, &TaskFile::Result), Bytes::from(bytes)).await?;
                tracing::warn!(task = %id, reason, "task ended without a result from its agent");
                result
            }
        };
        apply_result(&mut stored, &result);
        self.write(&stored).await?;
        self.bump();
        Ok(())
    }

    /// The agent's own temporary folder.
    fn scratch_of(&self, id: &RunId) -> PathBuf {
        self.settings.scratch.join(id.as_str())
    }

    fn spawn_agent(self: &Arc<Self>, record: &TaskRecord, traceparent: Option<&str>) -> Result<tokio::process::Child> {
        let claims = Claims {
            kind: RunKind::Task,
            ns: String::new(),
            id: record.id.to_string(),
            owner: record.owner.clone(),
            exp: record.deadline_ms() / 1000 + 300,
        };
        let tmp = self.scratch_of(&record.id);
        create_private_dirs(&tmp)
            .map_err(|e| Error::Unavailable(format!("cannot create the agent's folder {}: {e}", tmp.display())))?;
        let launch = Launch { argv: Vec::new(), cwd: self.settings.workdir.clone(), env: Vec::new() };
        let mut command = runner_command(&self.settings.runner, &launch);
        command
            .arg("agent")
            .env("TMPDIR", &tmp)
            .env(env::GATEWAY_URL, &self.settings.internal_url)
            .env(env::TOKEN, self.key.sign(&claims))
            .env(env::RUN_ID, record.id.as_str())
            .env(AGENT_PYTHON, &self.settings.python)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(package) = &self.settings.python_package {
            command.env(AGENT_PYTHONPATH, package);
        }
        if let Some(tp) = traceparent {
            command.env(env::TRACEPARENT, tp);
        }
        command
            .spawn()
            .map_err(|e| Error::Unavailable(format!("cannot start the runner {}: {e}", self.settings.runner.display())))
    }

    async fn supervise(self: Arc<Self>, record: TaskRecord, mut child: tokio::process::Child, stop: CancellationToken) {
        let (owner, id) = (record.owner.key(), record.id.clone());
        let tree = ProcessTree::new(child.id());
        let stderr = child.stderr.take().map(|s| tokio::spawn(read_bounded(s, STDERR_LIMIT)));
        let left = u64::try_from(record.deadline_ms().saturating_sub(now_ms())).unwrap_or(0);
        let backstop = Duration::from_millis(left) + BACKSTOP_SLACK;
        let end = tokio::select! {
            status = child.wait() => End::Exited(status.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string())),
            () = tokio::time::sleep(backstop) => End::Deadline,
            () = stop.cancelled() => End::Cancelled,
            () = self.shutdown.cancelled() => End::Shutdown,
        };
        match end {
            End::Exited(_) => {}
            End::Shutdown => tree.kill(),
            End::Deadline | End::Cancelled => {
                // The agent stops its step, uploads its result and exits; then the backstop.
                tree.terminate_runner();
                let grace = self.settings.kill_grace + Duration::from_secs(10);
                if tokio::time::timeout(grace, child.wait()).await.is_err() {
                    tree.kill();
                }
            }
        }
        let _ = child.wait().await;
        tree.disarm();
        let tmp = self.scratch_of(&id);
        if let Err(e) = tokio::fs::remove_dir_all(&tmp).await
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(task = %id, folder = %tmp.display(), error = %e, "could not remove the agent's folder");
        }
        let log = match stderr {
            Some(task) => task.await.unwrap_or_default(),
            None => String::new(),
        };
        let (status, reason) = match &end {
            End::Exited(how) => {
                let last = log.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no message");
                (TaskStatus::Failed, format!("the agent exited ({how}) without a result: {last}"))
            }
            End::Deadline => (TaskStatus::TimedOut, "the task's deadline passed and its agent was stopped".to_owned()),
            End::Cancelled => (TaskStatus::Cancelled, "the task was cancelled".to_owned()),
            End::Shutdown => (
                TaskStatus::Failed,
                "the gateway stopped while the task was running (in the embedded mode a task's agent is a child \
                 process of the gateway); its files are kept — start the task again"
                    .to_owned(),
            ),
        };
        if let Err(e) = self.end(&owner, &id, status, &reason).await {
            tracing::error!(task = %id, error = %e, "recording the end of a task failed");
        }
        self.agents.lock().unwrap_or_else(|e| e.into_inner()).remove(id.as_str());
        self.bump();
        tracing::info!(task = %id, "agent finished");
    }
}

fn apply_result(stored: &mut StoredTask, result: &TaskResult) {
    stored.state = Phase::Finished {
        status: result.status,
        message: result.error.clone().unwrap_or_else(|| result.summary.clone()),
    };
    stored.task_type = Some(result.task_type);
    stored.summary = Some(result.summary.chars().take(toolyard_api::agent::MAX_SUMMARY_CHARS).collect());
}

/// The local backend behind an `Arc` (the trait needs `&self`; supervisors need the `Arc`).
#[derive(Clone, Debug)]
pub struct LocalTaskBackend(pub Arc<LocalTasks>);

#[async_trait]
impl TaskBackend for LocalTaskBackend {
    fn namespace(&self) -> &str {
        ""
    }

    async fn create(&self, task: NewTask) -> Result<TaskRecord> {
        let this = &self.0;
        let owner = task.owner.owner();
        let stored = StoredTask {
            id: task.id.to_string(),
            owner: owner.clone(),
            prompt: task.prompt.clone(),
            tools: task.tools.clone(),
            budgets: task.budgets.clone(),
            profile: Some(task.profile.clone()),
            model_tokens: 0,
            created_ms: now_ms(),
            state: Phase::Running,
            task_type: None,
            summary: None,
        };
        let record = stored.record().ok_or_else(|| Error::Internal("invalid task id".into()))?;
        let stop = CancellationToken::new();
        {
            let mut agents = this.agents.lock().unwrap_or_else(|e| e.into_inner());
            if agents.len() >= this.settings.max_running.max(1) {
                return Err(Error::Busy(format!(
                    "{} coding tasks are running, the most this gateway runs at once; wait for one to finish",
                    agents.len()
                )));
            }
            agents.insert(task.id.to_string(), Agent { stop: stop.clone() });
        }
        let started = async {
            this.write(&stored).await?;
            view::write_created_event(this.store.as_ref(), &record).await?;
            this.spawn_agent(&record, task.traceparent.as_deref())
        };
        match started.await {
            Ok(child) => {
                tracing::info!(task = %task.id, "agent started");
                tokio::spawn(this.clone().supervise(record.clone(), child, stop));
                this.bump();
                Ok(record)
            }
            Err(e) => {
                this.agents.lock().unwrap_or_else(|e| e.into_inner()).remove(task.id.as_str());
                let reason = format!("the agent could not start: {}", e.public_message());
                let _ = this.end(&owner.key(), &task.id, TaskStatus::Failed, &reason).await;
                Err(e)
            }
        }
    }

    async fn get(&self, owner: &OwnerKey, id: &RunId) -> Result<Option<TaskRecord>> {
        self.0.load(owner, id).await
    }

    /// Reads every record of the owner (an embedded gateway serves one person's tasks).
    async fn walk(
        &self,
        owner: &OwnerKey,
        subset: Subset,
        before: Option<&Position>,
        visit: &mut (dyn FnMut(TaskRecord) -> ControlFlow<()> + Send),
    ) -> Result<()> {
        let objects = self.0.store.list(owner, "tasks/").await?;
        let mut records = Vec::new();
        for o in objects {
            let Some(id) = o.path.strip_prefix("tasks/").and_then(|r| r.strip_suffix(&format!("/{RECORD_FILE}")))
            else {
                continue;
            };
            let Ok(id) = RunId::parse(id) else { continue };
            if let Some(record) = self.0.load(owner, &id).await?
                && (subset == Subset::All || !record.phase.is_finished())
            {
                records.push((record.position(), record));
            }
        }
        records.sort_by(|a, b| b.0.cmp(&a.0));
        for (_, record) in records.into_iter().filter(|(at, _)| before.is_none_or(|b| at < b)) {
            if visit(record).is_break() {
                break;
            }
        }
        Ok(())
    }

    async fn cancel(&self, owner: &OwnerKey, id: &RunId) -> Result<bool> {
        let Some(record) = self.0.load(owner, id).await? else { return Ok(false) };
        if !record.phase.is_finished() {
            let agents = self.0.agents.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(agent) = agents.get(id.as_str()) {
                agent.stop.cancel();
                tracing::info!(task = %id, "cancellation requested");
            }
        }
        Ok(true)
    }

    /// Removes the task's folder (its record is a file there) under the lock its end is
    /// recorded under, so a late write of a cancelled task's supervisor cannot bring it back.
    async fn delete(&self, owner: &OwnerKey, id: &RunId) -> Result<bool> {
        let _guard = self.0.writes.lock().await;
        let existed = self.0.read(owner, id).await?.is_some();
        self.0.store.delete_folder(owner, &task_folder(owner, id)).await?;
        Ok(existed)
    }

    async fn for_runner(&self, namespace: &str, id: &RunId, owner: &OwnerKey) -> Result<Option<TaskRecord>> {
        if !namespace.is_empty() {
            return Ok(None);
        }
        Ok(self.0.read(owner, id).await?.and_then(|s| s.record()))
    }

    async fn set_model_tokens(&self, _namespace: &str, id: &RunId, owner: &OwnerKey, total: i64) -> Result<()> {
        let this = &self.0;
        let _guard = this.writes.lock().await;
        if let Some(mut stored) = this.read(owner, id).await? {
            stored.model_tokens = total;
            this.write(&stored).await?;
        }
        Ok(())
    }

    async fn record_result(&self, _namespace: &str, id: &RunId, owner: &OwnerKey, result: &TaskResult) -> Result<()> {
        let this = &self.0;
        let _guard = this.writes.lock().await;
        if let Some(mut stored) = this.read(owner, id).await? {
            apply_result(&mut stored, result);
            this.write(&stored).await?;
        }
        this.bump();
        Ok(())
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.0.version.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let stored = StoredTask {
            id: "task-1".into(),
            owner: Owner { issuer: "apikey".into(), user: "local".into(), groups: vec![] },
            prompt: "p".into(),
            tools: ToolSelection::default(),
            budgets: Budgets::default(),
            profile: Some("default".into()),
            model_tokens: 7,
            created_ms: 5,
            state: Phase::Finished { status: TaskStatus::Cancelled, message: "m".into() },
            task_type: Some(TaskType::Failed),
            summary: None,
        };
        let json = serde_json::to_value(&stored).unwrap();
        assert_eq!(json["state"]["phase"], "finished");
        let back: StoredTask = serde_json::from_value(json).unwrap();
        assert_eq!(back.record().unwrap().phase, stored.state);
    }
}

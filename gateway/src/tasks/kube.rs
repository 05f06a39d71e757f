//! [`TaskBackend`] on Kubernetes: one CodingTask object per task in a configured namespace;
//! the controller runs it as a Job (`toolyard-runner agent` with a task token).
//!
//! A watch over the gateway's CodingTasks (label `app.kubernetes.io/managed-by:
//! toolyard-gateway`) keeps a cache: reads and lists come from it, with a direct read when
//! a task is not cached yet (just created, maybe by another replica). Each object carries
//! the owner key as a label; a task whose `spec.owner` is not the caller is "not found".
//! The same watch keeps an index of each owner's tasks by creation ([`super::index`]), so
//! listing a page or counting running tasks costs what the owner has, not the namespace.
//! Cancelling sets `spec.cancelRequested`; the controller stops the Job and the agent
//! uploads a `cancelled` result. Results are recorded in the CodingTask's status
//! (taskType, summary, metrics, artifacts, counters) with field manager `toolyard-gateway`;
//! the controller owns the conditions.

use std::collections::{BTreeMap, HashMap};
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use toolyard_api::agent::{TaskResult, TaskStatus};
use toolyard_api::codingtask::ModelChoice;
use toolyard_api::conditions::{self, reason, status};
use toolyard_api::storage::RunId;
use toolyard_api::{CodingTask, CodingTaskSpec, GATEWAY_MANAGER, OwnerKey};

use super::index::OwnerIndex;
use super::{NewTask, Phase, Position, Subset, TaskBackend, TaskRecord};
use crate::executor::kube::{MANAGED_BY_LABEL, OWNER_LABEL, TRACEPARENT_ANNOTATION};
use crate::store::ArtifactStore;
use crate::{Error, Result};

/// Largest `metrics` object copied into the status (the full result is in storage).
const MAX_STATUS_METRICS_BYTES: usize = 4096;
/// Most artifacts listed in the status.
const MAX_STATUS_ARTIFACTS: usize = 100;
/// Positions an owner walk takes from the index at a time.
const WALK_BATCH: usize = 64;
/// Field manager of `status.modelTokens`.
const MODEL_TOKENS_MANAGER: &str = "toolyard-gateway-model";

/// CodingTasks in one namespace.
#[derive(Clone)]
pub struct KubeTasks {
    api: Api<CodingTask>,
    client: Client,
    namespace: String,
    cache: Store<CodingTask>,
    /// The cached tasks by owner, newest first.
    index: OwnerIndex,
    version: watch::Receiver<u64>,
    api_timeout: Duration,
    store: std::sync::Arc<dyn ArtifactStore>,
    /// Tasks this replica created that the watch has not shown yet, with their owners.
    created: std::sync::Arc<std::sync::Mutex<HashMap<RunId, (OwnerKey, Instant)>>>,
}

/// How long a created task counts without the watch showing it (then it is gone or the
/// watch is down, and the watch decides again once it is back).
const CREATED_UNSEEN_TTL: Duration = Duration::from_secs(60);

impl std::fmt::Debug for KubeTasks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeTasks").field("namespace", &self.namespace).finish_non_exhaustive()
    }
}

impl KubeTasks {
    /// Starts the watch over the gateway's CodingTasks in `namespace` (stopped by `shutdown`).
    /// The gateway needs get, list, watch, create and patch on `codingtasks` there, and patch
    /// on `codingtasks/status`.
    pub fn start(
        client: Client,
        namespace: &str,
        store: std::sync::Arc<dyn ArtifactStore>,
        api_timeout: Duration,
        shutdown: CancellationToken,
    ) -> Self {
        let api: Api<CodingTask> = Api::namespaced(client.clone(), namespace);
        let (cache, writer) = reflector::store();
        let (tx, version) = watch::channel(0u64);
        let config = watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={GATEWAY_MANAGER}"));
        let stream = watcher(api.clone(), config).default_backoff().reflect(writer);
        let (index, mut index_writer) = OwnerIndex::new();
        tokio::spawn(async move {
            let mut stream = stream.boxed();
            loop {
                let event = tokio::select! {
                    () = shutdown.cancelled() => return,
                    event = stream.next() => event,
                };
                match event {
                    Some(Ok(event)) => {
                        index_writer.apply(&event);
                        tx.send_modify(|v| *v = v.wrapping_add(1));
                    }
                    Some(Err(e)) => tracing::warn!(error = %e, "CodingTask watch failed; retrying with backoff"),
                    None => return,
                }
            }
        });
        Self {
            api,
            client,
            namespace: namespace.to_owned(),
            cache,
            index,
            version,
            api_timeout,
            store,
            created: std::sync::Arc::default(),
        }
    }

    async fn timed<T>(&self, fut: impl Future<Output = kube::Result<T>>) -> Result<T> {
        match tokio::time::timeout(self.api_timeout, fut).await {
            Ok(r) => r.map_err(Error::from),
            Err(_) => Err(Error::Unavailable("the Kubernetes API did not answer in time".into())),
        }
    }

    /// The task from the cache, else from the API (a task created a moment ago).
    async fn object(&self, namespace: &str, id: &RunId) -> Result<Option<CodingTask>> {
        if namespace == self.namespace
            && let Some(task) = self.cache.get(&ObjectRef::new(id.as_str()).within(namespace))
        {
            return Ok(Some((*task).clone()));
        }
        let api: Api<CodingTask> = Api::namespaced(self.client.clone(), namespace);
        self.timed(api.get_opt(id.as_str())).await
    }
}

/// The CodingTask for `task` in `namespace`.
pub fn coding_task(task: &NewTask, namespace: &str) -> CodingTask {
    let owner = task.owner.owner();
    let labels = BTreeMap::from([
        (MANAGED_BY_LABEL.to_owned(), GATEWAY_MANAGER.to_owned()),
        (OWNER_LABEL.to_owned(), owner.key().to_string()),
    ]);
    let annotations: BTreeMap<String, String> =
        task.traceparent.iter().map(|tp| (TRACEPARENT_ANNOTATION.to_owned(), tp.clone())).collect();
    CodingTask {
        metadata: ObjectMeta {
            name: Some(task.id.to_string()),
            namespace: Some(namespace.to_owned()),
            labels: Some(labels),
            annotations: (!annotations.is_empty()).then_some(annotations),
            ..ObjectMeta::default()
        },
        spec: CodingTaskSpec {
            prompt: task.prompt.clone(),
            owner,
            tools: task.tools.clone(),
            model: ModelChoice { profile: Some(task.profile.clone()), ..ModelChoice::default() },
            budgets: task.budgets.clone(),
            cancel_requested: false,
        },
        status: None,
    }
}

/// What the backend knows of a CodingTask.
pub fn record_of(task: &CodingTask) -> Option<TaskRecord> {
    let id = RunId::parse(task.metadata.name.as_deref()?).ok()?;
    let created_ms = task.metadata.creation_timestamp.as_ref().map(|t| t.0.as_millisecond()).unwrap_or_default();
    let status = task.status.clone().unwrap_or_default();
    Some(TaskRecord {
        id,
        namespace: task.metadata.namespace.clone().unwrap_or_default(),
        owner: task.spec.owner.clone(),
        prompt: task.spec.prompt.clone(),
        tools: task.spec.tools.clone(),
        budgets: task.spec.budgets.clone(),
        profile: task.spec.model.profile.clone(),
        model_tokens: status.model_tokens.unwrap_or(0),
        created_ms,
        phase: phase_of(&status.conditions),
        task_type: status.task_type,
        summary: status.summary,
    })
}

/// The phase a `Succeeded` condition says.
pub fn phase_of(list: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition]) -> Phase {
    let Some(c) = conditions::find(list, conditions::SUCCEEDED) else { return Phase::Pending };
    match c.status.as_str() {
        status::TRUE => Phase::Finished { status: TaskStatus::Success, message: c.message.clone() },
        status::FALSE => {
            let status = match c.reason.as_str() {
                reason::TIMED_OUT => TaskStatus::TimedOut,
                reason::CANCELLED => TaskStatus::Cancelled,
                _ => TaskStatus::Failed,
            };
            Phase::Finished { status, message: c.message.clone() }
        }
        _ if c.reason == reason::RUNNING => Phase::Running,
        _ => Phase::Pending,
    }
}

/// The status fields the gateway owns, from a stored result.
pub fn result_status(result: &TaskResult) -> Value {
    let summary: String = result.summary.chars().take(toolyard_api::agent::MAX_SUMMARY_CHARS).collect();
    let metrics = serde_json::to_vec(&result.metrics)
        .ok()
        .filter(|m| m.len() <= MAX_STATUS_METRICS_BYTES)
        .map(|_| Value::Object(result.metrics.clone()));
    let artifacts: Vec<Value> = result
        .artifacts
        .iter()
        .filter(|a| a.name.len() <= 512)
        .take(MAX_STATUS_ARTIFACTS)
        .map(|a| json!({"name": a.name, "sizeBytes": i64::try_from(a.size).unwrap_or(i64::MAX)}))
        .collect();
    let count = |n: u32| i32::try_from(n).unwrap_or(i32::MAX);
    let mut status = json!({
        "taskType": result.task_type,
        "summary": summary,
        "artifacts": artifacts,
        "steps": count(result.steps),
        "modelCalls": count(result.model_calls),
        "toolCalls": count(result.tool_calls),
    });
    if let Some(metrics) = metrics {
        status["metrics"] = metrics;
    }
    status
}

#[async_trait]
impl TaskBackend for KubeTasks {
    fn namespace(&self) -> &str {
        &self.namespace
    }

    async fn create(&self, task: NewTask) -> Result<TaskRecord> {
        let object = coding_task(&task, &self.namespace);
        let params = PostParams { field_manager: Some(GATEWAY_MANAGER.to_owned()), ..PostParams::default() };
        let created = self.timed(self.api.create(&params, &object)).await?;
        tracing::info!(task = %task.id, namespace = %self.namespace, "CodingTask created");
        self.created
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(task.id.clone(), (task.owner.owner_key(), Instant::now()));
        let record = record_of(&created).ok_or_else(|| Error::Internal("the created CodingTask has no name".into()))?;
        if let Err(e) = super::view::write_created_event(self.store.as_ref(), &record).await {
            tracing::warn!(task = %task.id, error = %e, "could not save the task_created event");
        }
        Ok(record)
    }

    async fn get(&self, owner: &OwnerKey, id: &RunId) -> Result<Option<TaskRecord>> {
        let namespace = self.namespace.clone();
        Ok(self.object(&namespace, id).await?.and_then(|t| record_of(&t)).filter(|r| r.owned_by(owner)))
    }

    async fn walk(
        &self,
        owner: &OwnerKey,
        subset: Subset,
        before: Option<&Position>,
        visit: &mut (dyn FnMut(TaskRecord) -> ControlFlow<()> + Send),
    ) -> Result<()> {
        let mut from = before.cloned();
        loop {
            let batch = self.index.newest(owner.as_str(), subset, from.as_ref(), WALK_BATCH);
            let Some(last) = batch.last().cloned() else { return Ok(()) };
            for (_, name) in batch {
                let Some(task) = self.cache.get(&ObjectRef::new(&name).within(&self.namespace)) else { continue };
                let Some(record) = record_of(&task).filter(|r| r.owned_by(owner)) else { continue };
                if visit(record).is_break() {
                    return Ok(());
                }
            }
            from = Some(last);
        }
    }

    /// The owner's unfinished CodingTasks the watch shows (every replica's), plus the ones
    /// this replica created that it does not show yet.
    async fn running_of(&self, owner: &OwnerKey) -> Result<usize> {
        let seen = self.index.unfinished(owner.as_str());
        let mut created = self.created.lock().unwrap_or_else(|e| e.into_inner());
        created.retain(|id, (_, at)| {
            at.elapsed() < CREATED_UNSEEN_TTL
                && self.cache.get(&ObjectRef::new(id.as_str()).within(&self.namespace)).is_none()
        });
        Ok(seen + created.values().filter(|(o, _)| o == owner).count())
    }

    async fn cancel(&self, owner: &OwnerKey, id: &RunId) -> Result<bool> {
        if self.get(owner, id).await?.is_none() {
            return Ok(false);
        }
        let patch = json!({"spec": {"cancelRequested": true}});
        let params = PatchParams { field_manager: Some(GATEWAY_MANAGER.to_owned()), ..PatchParams::default() };
        match self.timed(self.api.patch(id.as_str(), &params, &Patch::Merge(&patch))).await {
            Ok(_) => {
                tracing::info!(task = %id, "cancellation requested");
                Ok(true)
            }
            Err(Error::Kube(kube::Error::Api(e))) if e.code == 404 => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn delete(&self, owner: &OwnerKey, id: &RunId) -> Result<bool> {
        if self.get(owner, id).await?.is_none() {
            return Ok(false);
        }
        match self.timed(self.api.delete(id.as_str(), &Default::default())).await {
            Ok(_) => {
                tracing::info!(task = %id, "CodingTask deleted");
                Ok(true)
            }
            Err(Error::Kube(kube::Error::Api(e))) if e.code == 404 => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn for_runner(&self, namespace: &str, id: &RunId, owner: &OwnerKey) -> Result<Option<TaskRecord>> {
        Ok(self.object(namespace, id).await?.and_then(|t| record_of(&t)).filter(|r| r.owned_by(owner)))
    }

    async fn set_model_tokens(&self, namespace: &str, id: &RunId, _owner: &OwnerKey, total: i64) -> Result<()> {
        let api: Api<CodingTask> = Api::namespaced(self.client.clone(), namespace);
        let body = json!({
            "apiVersion": toolyard_api::API_VERSION,
            "kind": "CodingTask",
            "status": {"modelTokens": total},
        });
        // A field manager of its own: the result's apply (below) leaves this field alone.
        let params = PatchParams::apply(MODEL_TOKENS_MANAGER).force();
        self.timed(api.patch_status(id.as_str(), &params, &Patch::Apply(&body))).await.map(drop)
    }

    async fn record_result(&self, namespace: &str, id: &RunId, _owner: &OwnerKey, result: &TaskResult) -> Result<()> {
        let api: Api<CodingTask> = Api::namespaced(self.client.clone(), namespace);
        let body = json!({
            "apiVersion": toolyard_api::API_VERSION,
            "kind": "CodingTask",
            "status": result_status(result),
        });
        let params = PatchParams::apply(GATEWAY_MANAGER).force();
        self.timed(api.patch_status(id.as_str(), &params, &Patch::Apply(&body))).await.map(drop)
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.version.clone()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Map;
    use toolyard_api::agent::ArtifactEntry;
    use toolyard_api::codingtask::{Budgets, TaskType, ToolSelection};

    use super::*;
    use crate::identity::Identity;

    #[test]
    fn new_tasks_carry_owner_labels_and_conditions_map_to_phases() {
        let owner =
            Identity { issuer: "apikey".into(), user: "alice".into(), groups: vec!["quants".into()], scopes: vec![] };
        let task = NewTask {
            id: RunId::parse("task-1").unwrap(),
            owner,
            prompt: "compare".into(),
            tools: ToolSelection { names: vec!["price_option".into()], toolset: None },
            budgets: Budgets::default(),
            profile: "default".into(),
            traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
        };
        let object = coding_task(&task, "team");
        let labels = object.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[OWNER_LABEL], OwnerKey::derive("apikey", "alice").to_string());
        assert_eq!(labels[MANAGED_BY_LABEL], GATEWAY_MANAGER);
        assert_eq!(object.spec.owner.groups, ["quants"]);
        assert_eq!(object.spec.model.profile.as_deref(), Some("default"));
        assert!(object.metadata.annotations.unwrap().contains_key(TRACEPARENT_ANNOTATION));

        assert_eq!(phase_of(&[]), Phase::Pending);
        assert_eq!(phase_of(&[conditions::running(reason::RUNNING, "", None)]), Phase::Running);
        assert_eq!(
            phase_of(&[conditions::failed(reason::CANCELLED, "cancelled on request", None)]),
            Phase::Finished { status: TaskStatus::Cancelled, message: "cancelled on request".into() }
        );
        assert!(matches!(
            phase_of(&[conditions::failed(reason::REJECTED, "no model endpoint", None)]),
            Phase::Finished { status: TaskStatus::Failed, .. }
        ));
    }

    #[test]
    fn result_status_is_small() {
        let mut result = TaskResult::failed(TaskStatus::Success, "s".repeat(10_000));
        result.task_type = TaskType::Analysis;
        result.metrics = Map::from_iter([("big".to_owned(), Value::String("x".repeat(5000)))]);
        result.artifacts =
            (0..150).map(|i| ArtifactEntry { name: format!("{i}.csv"), path: String::new(), size: 1 }).collect();
        let s = result_status(&result);
        assert_eq!(s["summary"].as_str().unwrap().len(), toolyard_api::agent::MAX_SUMMARY_CHARS);
        assert!(s.get("metrics").is_none(), "large metrics stay in storage");
        assert_eq!(s["artifacts"].as_array().unwrap().len(), MAX_STATUS_ARTIFACTS);
        assert_eq!(s["taskType"], "analysis");
    }
}

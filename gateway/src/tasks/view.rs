//! What a client sees of a task: its record from the backend plus its files in the store.
//!
//! A stored `result.json` is final and wins; without one, a finished backend phase becomes a
//! failed result saying why (the agent never started, was killed at its deadline...), and
//! anything else is `pending` or `running`. Events are read from `events/` for progress.

use bytes::Bytes;
use serde::Serialize;
use serde_json::{Map, Value, json};
use toolyard_api::OwnerKey;
use toolyard_api::agent::{ArtifactEntry, TaskResult, TaskStatus, event};
use toolyard_api::codingtask::TaskType;
use toolyard_api::protocol::Event;
use toolyard_api::storage::{self, RunId, TaskFile};

use super::{Phase, TaskRecord};
use crate::store::ArtifactStore;

/// Status of a task as the MCP tools report it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ViewStatus {
    /// Created, the agent has not started.
    Pending,
    /// The agent runs.
    Running,
    /// Finished with an accepted final answer.
    Success,
    /// Failed (budget, model errors, crash, contract never met).
    Failed,
    /// Deadline passed.
    TimedOut,
    /// Cancelled by its owner.
    Cancelled,
}

impl ViewStatus {
    /// True for the four final statuses.
    pub fn is_final(self) -> bool {
        !matches!(self, ViewStatus::Pending | ViewStatus::Running)
    }

    /// The status as written in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            ViewStatus::Pending => "pending",
            ViewStatus::Running => "running",
            ViewStatus::Success => "success",
            ViewStatus::Failed => "failed",
            ViewStatus::TimedOut => "timed_out",
            ViewStatus::Cancelled => "cancelled",
        }
    }

    /// Parses [`ViewStatus::as_str`].
    pub fn parse(s: &str) -> Option<Self> {
        serde_json::from_value(Value::String(s.to_owned())).ok()
    }
}

impl From<TaskStatus> for ViewStatus {
    fn from(s: TaskStatus) -> Self {
        match s {
            TaskStatus::Success => ViewStatus::Success,
            TaskStatus::Failed => ViewStatus::Failed,
            TaskStatus::TimedOut => ViewStatus::TimedOut,
            TaskStatus::Cancelled => ViewStatus::Cancelled,
        }
    }
}

/// A task as the client sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskView {
    /// Task id.
    pub id: RunId,
    /// Status.
    pub status: ViewStatus,
    /// The final result (stored or synthesized), once final.
    pub result: Option<TaskResult>,
}

impl TaskView {
    /// The structured content of `run_coding_task` and `get_task_result`: `task_id`,
    /// `status`, `task_type`, `summary`, `metrics`, `assumptions`, `artifacts` (name, path,
    /// size), the counters and, for failures, `error`.
    pub fn to_json(&self) -> Value {
        match &self.result {
            Some(r) => {
                let artifacts: Vec<Value> =
                    r.artifacts.iter().map(|a| json!({"name": a.name, "path": a.path, "size": a.size})).collect();
                let mut out = json!({
                    "task_id": self.id.as_str(),
                    "status": self.status.as_str(),
                    "task_type": r.task_type,
                    "summary": r.summary,
                    "metrics": r.metrics,
                    "assumptions": r.assumptions,
                    "artifacts": artifacts,
                    "steps": r.steps,
                    "model_calls": r.model_calls,
                    "tool_calls": r.tool_calls,
                });
                if let Some(e) = &r.error {
                    out["error"] = Value::String(e.clone());
                }
                out
            }
            None => json!({
                "task_id": self.id.as_str(),
                "status": self.status.as_str(),
                "task_type": Value::Null,
                "summary": format!(
                    "the task is {}; ask again with get_task_result(task_id={:?})",
                    self.status.as_str(),
                    self.id.as_str()
                ),
                "metrics": {},
                "assumptions": [],
                "artifacts": [],
            }),
        }
    }
}

/// A path relative to the owner's prefix, as the store takes it.
pub fn task_path(owner: &OwnerKey, id: &RunId, file: &TaskFile) -> String {
    relative(owner, storage::task_key(owner, id, file))
}

/// The task folder relative to the owner's prefix (`tasks/<id>/`).
pub fn task_folder(owner: &OwnerKey, id: &RunId) -> String {
    relative(owner, storage::task_prefix(owner, id))
}

fn relative(owner: &OwnerKey, key: String) -> String {
    let prefix = storage::owner_prefix(owner);
    key.strip_prefix(&prefix).map(str::to_owned).unwrap_or(key)
}

/// The stored `result.json`, if there is one and it parses.
pub async fn stored_result(
    store: &dyn ArtifactStore,
    owner: &OwnerKey,
    id: &RunId,
) -> crate::Result<Option<TaskResult>> {
    let Some(bytes) = store.get(owner, &task_path(owner, id, &TaskFile::Result)).await? else { return Ok(None) };
    match serde_json::from_slice(&bytes) {
        Ok(result) => Ok(Some(result)),
        Err(e) => {
            tracing::error!(task = %id, error = %e, "a stored task result does not parse");
            Ok(Some(TaskResult::failed(TaskStatus::Failed, "the task's stored result is unreadable")))
        }
    }
}

/// The view of task `id` of `owner`: `None` when neither the backend nor the store knows it.
pub async fn view(
    store: &dyn ArtifactStore,
    owner: &OwnerKey,
    id: &RunId,
    record: Option<&TaskRecord>,
) -> crate::Result<Option<TaskView>> {
    if let Some(result) = stored_result(store, owner, id).await? {
        return Ok(Some(TaskView { id: id.clone(), status: result.status.into(), result: Some(result) }));
    }
    let Some(record) = record else { return Ok(None) };
    Ok(Some(match &record.phase {
        Phase::Pending => TaskView { id: id.clone(), status: ViewStatus::Pending, result: None },
        Phase::Running => TaskView { id: id.clone(), status: ViewStatus::Running, result: None },
        Phase::Finished { status, message } => {
            let result = synthesized(*status, message, store, owner, id).await?;
            TaskView { id: id.clone(), status: result.status.into(), result: Some(result) }
        }
    }))
}

/// The result of a task that ended without storing one.
async fn synthesized(
    status: TaskStatus,
    message: &str,
    store: &dyn ArtifactStore,
    owner: &OwnerKey,
    id: &RunId,
) -> crate::Result<TaskResult> {
    let (status, reason) = match status {
        TaskStatus::Success => (TaskStatus::Failed, "the agent finished but stored no result".to_owned()),
        other if message.is_empty() => (other, "the task ended without a result".to_owned()),
        other => (other, message.to_owned()),
    };
    let mut result = TaskResult::failed(status, reason);
    result.artifacts = artifacts(store, owner, id).await?;
    Ok(result)
}

/// The artifacts under `outputs/`, listed from storage.
pub async fn artifacts(store: &dyn ArtifactStore, owner: &OwnerKey, id: &RunId) -> crate::Result<Vec<ArtifactEntry>> {
    let folder = format!("{}outputs/", task_folder(owner, id));
    Ok(store
        .list(owner, &folder)
        .await?
        .into_iter()
        .filter_map(|o| {
            let name = o.path.strip_prefix(&folder)?.to_owned();
            Some(ArtifactEntry { path: format!("outputs/{name}"), name, size: o.size })
        })
        .collect())
}

/// A file of a task: its path relative to the task folder (as `read_artifact` takes it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TaskFileInfo {
    /// E.g. `result.json`, `outputs/scenarios.csv`, `actions/0001.py`.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
}

/// Every file of the task that `read_artifact` serves (result, tool calls, events, actions,
/// outputs), sorted by path.
pub async fn files(store: &dyn ArtifactStore, owner: &OwnerKey, id: &RunId) -> crate::Result<Vec<TaskFileInfo>> {
    let folder = task_folder(owner, id);
    Ok(store
        .list(owner, &folder)
        .await?
        .into_iter()
        .filter_map(|o| {
            let path = o.path.strip_prefix(&folder)?.to_owned();
            // Only names that read back as the same file (not the local backend's task.json).
            let served = storage::parse_task_file(&path).is_ok_and(|f| task_path(owner, id, &f) == o.path);
            served.then_some(TaskFileInfo { path, size: o.size })
        })
        .collect())
}

/// The numbers of a task's event segments from `from` on, in order. Callers read them one
/// by one ([`segment_events`]), so a long log is never held in memory at once.
pub async fn event_segments(
    store: &dyn ArtifactStore,
    owner: &OwnerKey,
    id: &RunId,
    from: u32,
) -> crate::Result<Vec<u32>> {
    let folder = format!("{}events/", task_folder(owner, id));
    let mut segments: Vec<u32> = store
        .list(owner, &folder)
        .await?
        .iter()
        .filter_map(|o| crate::store::events::segment_number(&o.path))
        .filter(|n| *n >= from)
        .collect();
    segments.sort_unstable();
    Ok(segments)
}

/// The events of segment `n` of a task (none when it is gone).
pub async fn segment_events(
    store: &dyn ArtifactStore,
    owner: &OwnerKey,
    id: &RunId,
    n: u32,
) -> crate::Result<Vec<Event>> {
    Ok(store
        .get(owner, &task_path(owner, id, &TaskFile::Events(n)))
        .await?
        .map(|b| parse_events(&b))
        .unwrap_or_default())
}

fn parse_events(bytes: &Bytes) -> Vec<Event> {
    String::from_utf8_lossy(bytes).lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

/// A short sentence for a progress notification.
pub fn describe(event: &Event) -> String {
    let d = &event.data;
    let text = |k: &str| d.get(k).and_then(Value::as_str).unwrap_or("?").to_owned();
    let num = |k: &str| d.get(k).and_then(Value::as_u64).unwrap_or(0);
    match event.type_.as_str() {
        event::TASK_CREATED => "task created".to_owned(),
        event::AGENT_STARTED => "the agent started".to_owned(),
        event::MODEL_CALL_STARTED => format!("asking the model (call {})", num("call")),
        event::MODEL_CALL_FINISHED if d["ok"] == Value::Bool(false) => {
            format!("the model call failed: {}", text("error"))
        }
        event::MODEL_CALL_FINISHED => format!("the model answered (call {})", num("call")),
        event::TOOL_CALL_STARTED => format!("step {}: calling {}", num("step"), text("tool")),
        event::TOOL_CALL_FINISHED if d["is_error"] == Value::Bool(true) => {
            format!("step {}: {} failed", num("step"), text("tool"))
        }
        event::TOOL_CALL_FINISHED => format!("step {}: {} returned", num("step"), text("tool")),
        event::ARTIFACT_WRITTEN => format!("saved {}", text("name")),
        event::STEP_FINISHED if d["error"] == Value::Bool(true) => format!("step {} raised an error", num("step")),
        event::STEP_FINISHED => format!("step {} finished", num("step")),
        event::AGENT_FINISHED => format!("the agent finished: {}", text("status")),
        other => other.to_owned(),
    }
}

/// The `task_created` event the gateway writes as the task's first event segment.
pub fn created_event(record: &TaskRecord) -> Event {
    let mut data = Map::new();
    data.insert("tools".into(), serde_json::to_value(&record.tools).unwrap_or(Value::Null));
    data.insert("budgets".into(), serde_json::to_value(&record.budgets).unwrap_or(Value::Null));
    Event { time: jiff::Timestamp::now().to_string(), type_: event::TASK_CREATED.to_owned(), data: Value::Object(data) }
}

/// Writes the `task_created` event (segment 1).
pub async fn write_created_event(store: &dyn ArtifactStore, record: &TaskRecord) -> crate::Result<()> {
    let owner = record.owner.key();
    let mut line = serde_json::to_vec(&created_event(record)).map_err(|e| crate::Error::Internal(e.to_string()))?;
    line.push(b'\n');
    store.put(&owner, &task_path(&owner, &record.id, &TaskFile::Events(1)), Bytes::from(line)).await
}

/// The kind of answer for list entries (`None` until the result is recorded).
pub fn task_type_of(view: &TaskView) -> Option<TaskType> {
    view.result.as_ref().map(|r| r.task_type)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_round_trip_and_running_views_say_how_to_ask_again() {
        for s in ["pending", "running", "success", "failed", "timed_out", "cancelled"] {
            assert_eq!(ViewStatus::parse(s).unwrap().as_str(), s);
        }
        assert!(ViewStatus::parse("done").is_none());
        let v = TaskView { id: RunId::parse("task-1").unwrap(), status: ViewStatus::Running, result: None };
        let j = v.to_json();
        assert_eq!(j["status"], "running");
        assert!(j["summary"].as_str().unwrap().contains("get_task_result"));
        let mut r = TaskResult::failed(TaskStatus::TimedOut, "deadline");
        r.artifacts.push(ArtifactEntry { name: "a.csv".into(), path: "outputs/a.csv".into(), size: 3 });
        let v = TaskView { id: RunId::parse("task-1").unwrap(), status: ViewStatus::TimedOut, result: Some(r) };
        let j = v.to_json();
        assert_eq!(j["artifacts"][0], json!({"name": "a.csv", "path": "outputs/a.csv", "size": 3}));
        assert_eq!((j["status"].as_str(), j["error"].as_str()), (Some("timed_out"), Some("deadline")));
    }

    #[test]
    fn events_read_as_progress_sentences() {
        let e = |t: &str, d: Value| Event { time: String::new(), type_: t.into(), data: d };
        assert_eq!(
            describe(&e(event::TOOL_CALL_STARTED, json!({"tool": "price_option", "step": 2}))),
            "step 2: calling price_option"
        );
        assert_eq!(describe(&e(event::STEP_FINISHED, json!({"step": 1, "error": true}))), "step 1 raised an error");
    }
}

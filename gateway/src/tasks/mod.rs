//! Coding tasks: where they run and what the MCP layer and the internal API need to know
//! about them, behind one trait with a Kubernetes and a local implementation.
//!
//! | | Kubernetes ([`kube::KubeTasks`]) | embedded mode ([`local::LocalTasks`]) |
//! |---|---|---|
//! | a task is | a CodingTask object (the controller runs it as a Job) | a `toolyard-runner agent` child process |
//! | its state | the object's `Succeeded` condition (a watch keeps a cache) | `tasks/<id>/task.json` in the store |
//! | cancel | `spec.cancelRequested` | SIGTERM to the agent |
//!
//! Either way the task's files live in the artifact store under its owner's prefix, and a
//! stored `result.json` is the final word on how it ended ([`view`]).

pub mod index;
pub mod kube;
pub mod local;
pub mod tools;
pub mod view;

use std::ops::ControlFlow;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use toolyard_api::agent::TaskResult;
use toolyard_api::agent::TaskStatus;
use toolyard_api::codingtask::{Budgets, TaskType, ToolSelection};
use toolyard_api::storage::RunId;
use toolyard_api::{Owner, OwnerKey};

use crate::identity::Identity;

/// A task to start.
#[derive(Clone, Debug)]
pub struct NewTask {
    /// Its id (object name, storage folder).
    pub id: RunId,
    /// Who starts it; the task and every tool call it makes run as this identity.
    pub owner: Identity,
    /// What the user asked for.
    pub prompt: String,
    /// Tools it may use (further limited by what the owner may call).
    pub tools: ToolSelection,
    /// Limits.
    pub budgets: Budgets,
    /// The model profile (already resolved: exists and the owner may use it).
    pub profile: String,
    /// W3C trace context of the request that started it.
    pub traceparent: Option<String>,
}

/// Where a task stands, as its backend sees it (a stored result may say more: see [`view`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "phase")]
pub enum Phase {
    /// Created; the agent has not started yet.
    Pending,
    /// The agent runs.
    Running,
    /// Over.
    Finished {
        /// How it ended.
        status: TaskStatus,
        /// Why, in a sentence (the backend's view: a condition message, an exit status).
        message: String,
    },
}

impl Phase {
    /// True once the task is over.
    pub fn is_finished(&self) -> bool {
        matches!(self, Phase::Finished { .. })
    }
}

/// A task as its backend records it.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskRecord {
    /// Task id.
    pub id: RunId,
    /// Namespace of the CodingTask (empty in embedded mode).
    pub namespace: String,
    /// Who it runs as.
    pub owner: Owner,
    /// What the user asked for.
    pub prompt: String,
    /// Tools it may use.
    pub tools: ToolSelection,
    /// Limits.
    pub budgets: Budgets,
    /// The model profile it names (`None`: the gateway's default).
    pub profile: Option<String>,
    /// Model tokens used so far (counted by the gateway's model proxy).
    pub model_tokens: i64,
    /// Creation time, Unix milliseconds (the deadline counts from here).
    pub created_ms: i64,
    /// Where it stands.
    pub phase: Phase,
    /// Kind of result, once recorded.
    pub task_type: Option<TaskType>,
    /// Summary of the result, once recorded.
    pub summary: Option<String>,
}

impl TaskRecord {
    /// The task's hard deadline, Unix milliseconds.
    pub fn deadline_ms(&self) -> i64 {
        self.created_ms.saturating_add(i64::from(self.budgets.timeout_seconds).saturating_mul(1000))
    }

    /// True when `owner` owns the task.
    pub fn owned_by(&self, owner: &OwnerKey) -> bool {
        &self.owner.key() == owner
    }

    /// Its place in its owner's history.
    pub fn position(&self) -> Position {
        (self.created_ms, self.id.to_string())
    }
}

/// Which of an owner's tasks a walk visits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Subset {
    /// All of them.
    All,
    /// Those not finished (pending or running).
    Unfinished,
}

/// A task's place in its owner's history, which lists newest first: creation time (Unix
/// milliseconds), then id.
pub type Position = (i64, String);

/// Where coding tasks run.
#[async_trait]
pub trait TaskBackend: Send + Sync + 'static {
    /// Namespace tasks are created in (what `create codingtasks` is authorized against;
    /// empty in embedded mode).
    fn namespace(&self) -> &str;

    /// Starts a task and writes its `task_created` event.
    async fn create(&self, task: NewTask) -> crate::Result<TaskRecord>;

    /// The task `id` of `owner`; `None` when it does not exist or belongs to someone else.
    async fn get(&self, owner: &OwnerKey, id: &RunId) -> crate::Result<Option<TaskRecord>>;

    /// Visits `owner`'s tasks of `subset` newest first ([`TaskRecord::position`] descending),
    /// starting with the first older than `before` (the newest when `None`), until `visit`
    /// breaks. On Kubernetes it costs what it visits, whatever the namespace holds (an owner
    /// index over the watch); the local backend reads the owner's records.
    async fn walk(
        &self,
        owner: &OwnerKey,
        subset: Subset,
        before: Option<&Position>,
        visit: &mut (dyn FnMut(TaskRecord) -> ControlFlow<()> + Send),
    ) -> crate::Result<()>;

    /// How many tasks of `owner` have not finished, wherever they were started (every
    /// replica's tasks: the cluster's state). A per-user limit on running tasks counts these.
    async fn running_of(&self, owner: &OwnerKey) -> crate::Result<usize> {
        let mut running = 0;
        self.walk(owner, Subset::Unfinished, None, &mut |r| {
            running += usize::from(!r.phase.is_finished());
            ControlFlow::Continue(())
        })
        .await?;
        Ok(running)
    }

    /// Forgets finished task `id` of `owner`, for `delete_task` (which deletes its files
    /// first): on Kubernetes its CodingTask object; locally its folder (the record is a file
    /// there) once more, under the lock a task's end is written under. `false` when there is
    /// no such task of `owner`.
    async fn delete(&self, owner: &OwnerKey, id: &RunId) -> crate::Result<bool>;

    /// Asks the task to stop. `false` when there is no such task of `owner`.
    async fn cancel(&self, owner: &OwnerKey, id: &RunId) -> crate::Result<bool>;

    /// The task a runner token names (its claims' namespace, id and owner), for the
    /// internal API; `None` when it does not exist or the owner differs.
    async fn for_runner(&self, namespace: &str, id: &RunId, owner: &OwnerKey) -> crate::Result<Option<TaskRecord>>;

    /// Sets the model tokens task `id` has used to `total`, where every replica sees it
    /// (Kubernetes: the CodingTask's `status.modelTokens`; local: the task record).
    async fn set_model_tokens(&self, namespace: &str, id: &RunId, owner: &OwnerKey, total: i64) -> crate::Result<()>;

    /// Records a stored result where the backend keeps task state (Kubernetes: the
    /// CodingTask's status result fields; local: the task record).
    async fn record_result(
        &self,
        namespace: &str,
        id: &RunId,
        owner: &OwnerKey,
        result: &TaskResult,
    ) -> crate::Result<()>;

    /// A value that changes whenever some task changes (a hint to look again; waiters also
    /// look again periodically, so a missed change only delays them).
    fn changes(&self) -> watch::Receiver<u64>;
}

/// How often waiters look again when no change was signalled (changes made by another
/// replica, results stored through another replica's internal API).
pub const RECHECK: Duration = Duration::from_secs(1);

pub use crate::core::ids::new_task_id;

/// Unix milliseconds now.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_ids_are_run_ids_and_deadlines_count_from_creation() {
        let id = new_task_id();
        let record = TaskRecord {
            id,
            namespace: String::new(),
            owner: Owner { issuer: "apikey".into(), user: "alice".into(), groups: vec![] },
            prompt: "p".into(),
            tools: ToolSelection::default(),
            budgets: Budgets { timeout_seconds: 60, ..Budgets::default() },
            profile: None,
            model_tokens: 0,
            created_ms: 1_000,
            phase: Phase::Pending,
            task_type: None,
            summary: None,
        };
        assert_eq!(record.deadline_ms(), 61_000);
        assert!(record.owned_by(&OwnerKey::derive("apikey", "alice")));
        assert!(!record.owned_by(&OwnerKey::derive("apikey", "bob")));
        let json = serde_json::to_value(Phase::Finished { status: TaskStatus::TimedOut, message: "m".into() }).unwrap();
        assert_eq!(json, serde_json::json!({"phase": "finished", "status": "timed_out", "message": "m"}));
    }
}

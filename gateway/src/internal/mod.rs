//! The internal runner API: what a runner process (a Job pod, a local child process) may do
//! with its scoped token. Served on its own listener, never merged into the public router.
//!
//! ```text
//! GET  /internal/v1/calls/{id}/input            the call's arguments
//! PUT  /internal/v1/calls/{id}/result           the call's CallResult (then the ResultRecorder runs)
//! PUT  /internal/v1/calls/{id}/logs/{stream}    stdout | stderr, raw bytes
//! POST /internal/v1/calls/{id}/events           lifecycle events, JSON lines (a new segment)
//! POST /internal/v1/tasks/{id}/events           the same for a coding task
//! PUT  /internal/v1/tasks/{id}/outputs/{*path}  a task artifact (validated relative path)
//! GET  /internal/v1/tasks/{id}/outputs/{*path}  read it back
//! GET  /internal/v1/tasks/{id}/spec             the task: prompt, allowed tools, budgets, deadline
//! POST /internal/v1/tasks/{id}/tools/{tool}/call a tool call as the task's owner
//! GET  /internal/v1/tasks/{id}/outputs          the artifacts, listed from storage
//! PUT  /internal/v1/tasks/{id}/actions/{step}   the code of one step
//! PUT  /internal/v1/tasks/{id}/tool_calls       every tool call with its outcome
//! PUT  /internal/v1/tasks/{id}/result           the TaskResult (then the task backend records it)
//! POST /internal/v1/tasks/{id}/model/chat/completions   a model call through the task's profile
//! ```
//!
//! The task routes (`tasks`) answer 503 on a gateway built without a task backend.
//!
//! Every request carries `Authorization: Bearer <runner token>`, verified with the master
//! [`SigningKey`]; the claims' kind and id must match the path, and storage is addressed
//! through the claims' owner, so a token for one run can touch nothing of another run or
//! another owner. Every body has a size cap (413); errors are JSON `{"error": "..."}`.

mod auth;
mod error;
mod handlers;
mod tasks;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use axum::Router;
use axum::routing::{get, post, put};
use toolyard_api::protocol::path::PREFIX;
use toolyard_api::token::SigningKey;

use crate::executor::ResultRecorder;
use crate::executor::events::ProgressHub;
use crate::store::ArtifactStore;
use crate::store::events::EventLogs;

pub use auth::RunClaims;
pub use error::ApiError;
pub use tasks::TaskApi;

/// Size caps of request bodies.
#[derive(Clone, Debug)]
pub struct InternalLimits {
    /// A call's result document.
    pub result_bytes: usize,
    /// One log stream (the runner keeps 1 MiB per stream plus a note).
    pub log_bytes: usize,
    /// One batch of events.
    pub events_bytes: usize,
    /// One task artifact.
    pub output_bytes: usize,
    /// Artifacts one task may keep.
    pub task_outputs: usize,
    /// Bytes of all of one task's artifacts together.
    pub task_output_bytes: u64,
    /// Bytes of one run's (task's or call's) event log.
    pub run_event_bytes: u64,
}

impl Default for InternalLimits {
    fn default() -> Self {
        Self {
            result_bytes: 8 * 1024 * 1024,
            log_bytes: 2 * 1024 * 1024,
            events_bytes: 1024 * 1024,
            output_bytes: 64 * 1024 * 1024,
            task_outputs: 1000,
            task_output_bytes: 1024 * 1024 * 1024,
            run_event_bytes: 16 * 1024 * 1024,
        }
    }
}

/// Flags of the internal listener (flattened into the gateway's `serve` command).
#[derive(clap::Args, Clone, Debug)]
pub struct InternalArgs {
    /// Address of the internal runner API listener; reachable only by runners, never public.
    #[arg(long = "internal-listen", env = "TOOLYARD_INTERNAL_LISTEN", default_value = "0.0.0.0:8081")]
    pub listen: String,
    /// File holding the master key that signs runner tokens (at least 32 bytes; a mounted Secret).
    #[arg(long, env = "TOOLYARD_TOKEN_KEY_FILE")]
    pub token_key_file: Option<PathBuf>,
    /// Largest task artifact a runner may upload, in bytes.
    #[arg(long, env = "TOOLYARD_MAX_OUTPUT_BYTES", default_value_t = InternalLimits::default().output_bytes)]
    pub max_output_bytes: usize,
    /// Artifacts one coding task may keep.
    #[arg(long, env = "TOOLYARD_MAX_TASK_ARTIFACTS", default_value_t = InternalLimits::default().task_outputs)]
    pub max_task_artifacts: usize,
    /// Bytes of all of one coding task's artifacts together.
    #[arg(long, env = "TOOLYARD_MAX_TASK_ARTIFACT_BYTES", default_value_t = InternalLimits::default().task_output_bytes)]
    pub max_task_artifact_bytes: u64,
    /// Bytes of one task's or call's event log.
    #[arg(long, env = "TOOLYARD_MAX_EVENT_LOG_BYTES", default_value_t = InternalLimits::default().run_event_bytes)]
    pub max_event_log_bytes: u64,
}

impl InternalArgs {
    /// The body limits these flags ask for.
    pub fn limits(&self) -> InternalLimits {
        InternalLimits {
            output_bytes: self.max_output_bytes,
            task_outputs: self.max_task_artifacts,
            task_output_bytes: self.max_task_artifact_bytes,
            run_event_bytes: self.max_event_log_bytes,
            ..InternalLimits::default()
        }
    }
}

/// Reads the master signing key from a file, with errors that name the file.
pub fn load_signing_key(path: &Path) -> anyhow::Result<SigningKey> {
    let bytes = std::fs::read(path).with_context(|| format!("reading the token key file {}", path.display()))?;
    SigningKey::new(bytes).with_context(|| format!("the token key file {} is not usable", path.display()))
}

/// What the internal API needs.
#[derive(Clone)]
pub struct InternalState {
    /// Where call and task files go.
    pub store: Arc<dyn ArtifactStore>,
    /// The master key runner tokens are signed with.
    pub key: SigningKey,
    /// Runs after a call's result is stored (Kubernetes: patch the ToolCall status; local:
    /// wake the waiting executor).
    pub recorder: Option<Arc<dyn ResultRecorder>>,
    /// Body size caps.
    pub limits: InternalLimits,
    /// The coding-task routes' backends (`None`: those routes answer 503).
    pub tasks: Option<TaskApi>,
    /// Callers waiting for calls in this process: a call's progress events reach them here.
    pub progress: Option<Arc<ProgressHub>>,
    /// This process's appends to event logs (shared with the executor's, see
    /// [`InternalState::with_event_logs`]).
    event_logs: Arc<EventLogs>,
}

impl std::fmt::Debug for InternalState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InternalState").field("limits", &self.limits).finish_non_exhaustive()
    }
}

impl InternalState {
    /// State with default limits and no recorder.
    pub fn new(store: Arc<dyn ArtifactStore>, key: SigningKey) -> Self {
        Self {
            store,
            key,
            recorder: None,
            limits: InternalLimits::default(),
            tasks: None,
            progress: None,
            event_logs: Arc::default(),
        }
    }

    /// The same state passing calls' progress events to `hub`.
    pub fn with_progress(mut self, hub: Arc<ProgressHub>) -> Self {
        self.progress = Some(hub);
        self
    }

    /// The same state appending to event logs through `logs`: the executor's, which appends
    /// to the same logs, so that each knows the segments the other wrote.
    pub fn with_event_logs(mut self, logs: Arc<EventLogs>) -> Self {
        self.event_logs = logs;
        self
    }

    /// The same state with a result recorder.
    pub fn with_recorder(mut self, recorder: Arc<dyn ResultRecorder>) -> Self {
        self.recorder = Some(recorder);
        self
    }

    /// The same state with the coding-task routes served.
    pub fn with_tasks(mut self, tasks: TaskApi) -> Self {
        self.tasks = Some(tasks);
        self
    }

    /// The same state with other limits.
    pub fn with_limits(mut self, limits: InternalLimits) -> Self {
        self.limits = limits;
        self
    }
}

/// The internal API router (for its own listener).
pub fn router(state: InternalState) -> Router {
    let state = Arc::new(state);
    Router::new()
        .route(&format!("{PREFIX}/calls/{{id}}/input"), get(handlers::call_input))
        .route(&format!("{PREFIX}/calls/{{id}}/result"), put(handlers::call_result))
        .route(&format!("{PREFIX}/calls/{{id}}/logs/{{stream}}"), put(handlers::call_log))
        .route(&format!("{PREFIX}/calls/{{id}}/outputs/{{*name}}"), put(handlers::put_call_output))
        .route(&format!("{PREFIX}/calls/{{id}}/events"), post(handlers::call_events))
        .route(&format!("{PREFIX}/tasks/{{id}}/events"), post(handlers::task_events))
        .route(
            &format!("{PREFIX}/tasks/{{id}}/outputs/{{*path}}"),
            put(handlers::put_task_output).get(handlers::get_task_output),
        )
        .route(&format!("{PREFIX}/tasks/{{id}}/spec"), get(tasks::spec))
        .route(&format!("{PREFIX}/tasks/{{id}}/tools/{{tool}}/call"), post(tasks::tool_call))
        .route(&format!("{PREFIX}/tasks/{{id}}/tools/search"), post(tasks::tool_search))
        .route(&format!("{PREFIX}/tasks/{{id}}/outputs"), get(tasks::outputs))
        .route(&format!("{PREFIX}/tasks/{{id}}/actions/{{step}}"), put(tasks::action))
        .route(&format!("{PREFIX}/tasks/{{id}}/tool_calls"), put(tasks::tool_calls))
        .route(&format!("{PREFIX}/tasks/{{id}}/result"), put(tasks::result))
        .route(&format!("{PREFIX}/tasks/{{id}}/model/chat/completions"), post(tasks::model_chat))
        .fallback(handlers::not_found)
        .with_state(state)
}

//! The task built-ins and the MCP tasks extension (SEP-2663), over the
//! [`crate::tasks::TaskBackend`] and the artifact store.
//!
//! Every lookup is scoped to the caller's owner key: another user's task id answers exactly
//! like an unknown one. `run_coding_task` waits for the result, sending progress
//! notifications (one per new lifecycle event) when the client sent a progress token; a
//! client that goes away only stops the waiting, never the task. A client that declared the
//! tasks extension gets a task handle at once instead and polls `tasks/get`.

use std::ops::ControlFlow;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD as B64, URL_SAFE_NO_PAD as B64URL};
use rmcp::model::{
    CallToolResponse, CallToolResult, ContentBlock, CreateTaskResult, DetailedTask, ProgressNotificationParam,
    ProgressToken, Task, TaskPayload, TaskStatus as McpTaskStatus,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;
use toolyard_api::OwnerKey;
use toolyard_api::codingtask::{Budgets, ToolSelection};
use toolyard_api::storage::{self, RunId};
use tracing::Instrument;

use super::builtin::MAX_CHUNK;
use super::errors;
use crate::core::Selection;
use crate::executor::Forgotten;
use crate::identity::Identity;
use crate::metrics::Rejection;
use crate::state::AppState;
use crate::tasks::view::{self, TaskView, ViewStatus, task_path};
use crate::tasks::{NewTask, RECHECK, Subset, TaskBackend, TaskRecord, new_task_id};

/// Default page size of `list_tasks`.
const DEFAULT_LIST_LIMIT: usize = 20;
/// Poll interval suggested to tasks-extension clients.
const POLL_INTERVAL_MS: u64 = 2000;

/// Progress notifications of one waiting `run_coding_task`: one per lifecycle event of the
/// task, numbered so they only grow (there is no known total).
struct Progress {
    token: Option<ProgressToken>,
    next_segment: u32,
    reported: f64,
}

impl Progress {
    async fn notify(&mut self, context: &RequestContext<RoleServer>, message: String) -> Result<(), ErrorData> {
        let Some(token) = &self.token else { return Ok(()) };
        let param = ProgressNotificationParam::new(token.clone(), self.reported).with_message(message);
        self.reported += 1.0;
        context.peer.notify_progress(param).await.map_err(|_| ErrorData::internal_error("the client went away", None))
    }

    /// Reports the events stored since the last call.
    async fn report(
        &mut self,
        state: &AppState,
        owner: &OwnerKey,
        id: &RunId,
        context: &RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        if self.token.is_none() {
            return Ok(());
        }
        let segments = view::event_segments(state.store.as_ref(), owner, id, self.next_segment)
            .await
            .map_err(|e| internal(state, &e))?;
        for n in segments {
            let events =
                view::segment_events(state.store.as_ref(), owner, id, n).await.map_err(|e| internal(state, &e))?;
            for event in &events {
                self.notify(context, view::describe(event)).await?;
            }
            self.next_segment = n + 1;
        }
        Ok(())
    }
}

/// The task tools for one request.
pub struct TaskTools<'a> {
    /// Shared state.
    pub state: &'a AppState,
    /// The caller.
    pub who: &'a Identity,
}

/// Longest `delete_task` waits for a running task it cancelled to stop.
pub const DELETE_STOP_WAIT: Duration = Duration::from_secs(30);

/// A tool result holding `value` as structured content (and as JSON text).
pub fn json_result(value: Value) -> CallToolResult {
    CallToolResult::structured(value)
}

/// A tool-level error the caller (or its model) reads.
pub fn error_result(message: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(message.into())])
}

/// The answer for an unknown task id — and for another user's, word for word.
pub fn no_such_task(id: &str) -> CallToolResult {
    let shown: String = id.chars().take(64).collect();
    error_result(format!("no such task: {shown:?}"))
}

fn string_arg<'v>(args: &'v Map<String, Value>, key: &str) -> &'v str {
    args.get(key).and_then(Value::as_str).unwrap_or_default()
}

fn u64_arg(args: &Map<String, Value>, key: &str) -> Option<u64> {
    args.get(key).and_then(Value::as_u64)
}

fn internal(state: &AppState, e: &crate::Error) -> ErrorData {
    tracing::error!(error = %e, "task request failed in the platform");
    errors::from_error(e, state.limits.settings().retry_after.as_secs().max(1))
}

/// A task result as a tool result: failures of the task are tool errors with the same
/// structured content.
pub fn view_result(view: &TaskView) -> CallToolResult {
    match view.status {
        ViewStatus::Failed | ViewStatus::TimedOut | ViewStatus::Cancelled => {
            CallToolResult::structured_error(view.to_json())
        }
        _ => json_result(view.to_json()),
    }
}

impl TaskTools<'_> {
    fn backend(&self) -> Result<&dyn TaskBackend, ErrorData> {
        self.state.tasks.as_deref().ok_or_else(|| errors::unknown_tool("run_coding_task"))
    }

    fn owner(&self) -> OwnerKey {
        self.who.owner_key()
    }

    /// The task's view, or `None` for unknown and other users' ids.
    async fn find(&self, raw_id: &str) -> Result<Option<(RunId, Option<TaskRecord>, TaskView)>, ErrorData> {
        let Ok(id) = RunId::parse(raw_id) else { return Ok(None) };
        let backend = self.backend()?;
        let owner = self.owner();
        let record = backend.get(&owner, &id).await.map_err(|e| internal(self.state, &e))?;
        let found = view::view(self.state.store.as_ref(), &owner, &id, record.as_ref())
            .await
            .map_err(|e| internal(self.state, &e))?;
        Ok(found.map(|v| (id, record, v)))
    }

    /// True when `id` names a task of the caller (in the backend, or only in storage).
    async fn exists(&self, id: &RunId) -> Result<bool, ErrorData> {
        let owner = self.owner();
        if self.backend()?.get(&owner, id).await.map_err(|e| internal(self.state, &e))?.is_some() {
            return Ok(true);
        }
        let files = view::files(self.state.store.as_ref(), &owner, id).await.map_err(|e| internal(self.state, &e))?;
        Ok(!files.is_empty())
    }

    /// `run_coding_task(task, tools?, model?, budgets?)`.
    /// The wait ends (the task goes on) when `stop` fires: the client cancelled the request
    /// or went away.
    /// The call is a `tools/call run_coding_task` span of the request's trace; the agent's
    /// `agent.run` span is its child.
    pub async fn run(
        &self,
        args: &Map<String, Value>,
        context: &RequestContext<RoleServer>,
        traceparent: Option<String>,
        stop: CancellationToken,
    ) -> Result<CallToolResponse, ErrorData> {
        let span = tracing::info_span!(
            "tools/call",
            "otel.name" = "tools/call run_coding_task",
            "otel.kind" = "server",
            "mcp.method.name" = "tools/call",
            "gen_ai.operation.name" = "invoke_agent",
            "gen_ai.tool.name" = "run_coding_task",
            "enduser.id" = %self.who.user,
            "toolyard.auth.issuer" = %self.who.issuer,
            "toolyard.task.id" = tracing::field::Empty,
        );
        let traceparent = toolyard_telemetry::continue_trace(&span, traceparent);
        self.start_and_wait(args, context, traceparent, stop).instrument(span).await
    }

    async fn start_and_wait(
        &self,
        args: &Map<String, Value>,
        context: &RequestContext<RoleServer>,
        traceparent: Option<String>,
        stop: CancellationToken,
    ) -> Result<CallToolResponse, ErrorData> {
        let backend = self.backend()?;
        let requested = args.get("model").and_then(Value::as_str);
        let profile = match self.state.models.profiles().resolve(requested) {
            Ok(p) => p.name.clone(),
            Err(e) => return Ok(error_result(e.to_string()).into()),
        };
        let may_use = self
            .state
            .authorizer
            .can_use_model(self.who, backend.namespace(), &profile)
            .await
            .map_err(|e| internal(self.state, &e))?;
        if !may_use {
            return Ok(error_result(format!("you may not use the model profile {profile:?}")).into());
        }
        let selection = match self.selection(args).await? {
            Ok(s) => s,
            Err(message) => return Ok(error_result(message).into()),
        };
        let budgets = match budgets(args.get("budgets")) {
            Ok(b) => b,
            Err(message) => return Ok(error_result(message).into()),
        };
        let quota = self.state.calls.quota().check(&self.owner()).await.map_err(|e| internal(self.state, &e))?;
        if let Some(message) = quota {
            self.state.metrics.admission_rejected(Rejection::StorageQuota);
            return Ok(error_result(message).into());
        }
        // Counted and created under this replica's start lock; other replicas' tasks are
        // counted from the cluster's state.
        let _start = self.state.limits.task_start().await;
        let running = backend.running_of(&self.owner()).await.map_err(|e| internal(self.state, &e))?;
        if running >= self.state.limits.settings().max_tasks_per_user.max(1) {
            self.state.metrics.admission_rejected(Rejection::UserTasks);
            let retry_after = self.state.limits.settings().retry_after.as_secs().max(1);
            return Err(errors::busy("too many running coding tasks for this user", retry_after));
        }
        let task = NewTask {
            id: new_task_id(),
            owner: self.who.clone(),
            prompt: string_arg(args, "task").to_owned(),
            tools: selection,
            budgets,
            profile,
            traceparent,
        };
        let record = match backend.create(task).await {
            Ok(r) => r,
            Err(crate::Error::Unavailable(why)) => return Ok(error_result(why).into()),
            Err(e) => return Err(internal(self.state, &e)),
        };
        tracing::Span::current().record("toolyard.task.id", tracing::field::display(&record.id));
        tracing::info!(task = %record.id, user = %self.who.user, "coding task started");
        if context.client_capabilities().is_some_and(|c| c.supports_tasks()) {
            let now = jiff::Timestamp::now().to_string();
            let created =
                jiff::Timestamp::from_millisecond(record.created_ms).map(|t| t.to_string()).unwrap_or(now.clone());
            let handle = Task::new(record.id.to_string(), McpTaskStatus::Working, created, now)
                .with_poll_interval_ms(POLL_INTERVAL_MS)
                .with_status_message("the coding task is running");
            return Ok(CallToolResponse::Task(CreateTaskResult::new(handle)));
        }
        self.wait(record, context, stop).await.map(Into::into)
    }

    /// The tool selection from `tools`: every name must be a tool the caller may call
    /// (unknown and forbidden names are refused alike).
    async fn selection(&self, args: &Map<String, Value>) -> Result<Result<ToolSelection, String>, ErrorData> {
        let Some(names) = args.get("tools").and_then(Value::as_array) else { return Ok(Ok(ToolSelection::default())) };
        let mut wanted: Vec<String> = names.iter().filter_map(Value::as_str).map(str::to_owned).collect();
        wanted.sort();
        wanted.dedup();
        let mut unknown = Vec::new();
        let all = Selection::all();
        for name in &wanted {
            let found =
                self.state.access().resolve(self.who, &all, name).await.map_err(|e| internal(self.state, &e))?;
            if found.is_none() {
                unknown.push(format!("{:?}", name.chars().take(64).collect::<String>()));
            }
        }
        if !unknown.is_empty() {
            return Ok(Err(format!("unknown tools: {}", unknown.join(", "))));
        }
        if wanted.is_empty() {
            return Ok(Err("tools must name at least one tool (leave it out to allow every tool you may call)".into()));
        }
        Ok(Ok(ToolSelection { names: wanted, toolset: None }))
    }

    /// Waits for the task's result, sending progress notifications; returns early (the task
    /// goes on) when `stop` fires (the client cancelled or went away) or the gateway shuts down.
    async fn wait(
        &self,
        record: TaskRecord,
        context: &RequestContext<RoleServer>,
        stop: CancellationToken,
    ) -> Result<CallToolResult, ErrorData> {
        let backend = self.backend()?;
        let owner = self.owner();
        let id = record.id.clone();
        let mut changes = backend.changes();
        let mut progress = Progress { token: context.meta.get_progress_token(), next_segment: 1, reported: 0.0 };
        let started =
            format!("task {id} started; if you stop waiting it goes on: get_task_result(task_id={:?})", id.as_str());
        progress.notify(context, started).await?;
        loop {
            let Some(last) = backend.get(&owner, &id).await.map_err(|e| internal(self.state, &e))? else {
                // Deleted meanwhile (`delete_task` cancels a running task first).
                return Ok(view_result(&TaskView { id, status: ViewStatus::Cancelled, result: None }));
            };
            progress.report(self.state, &owner, &id, context).await?;
            let current = view::view(self.state.store.as_ref(), &owner, &id, Some(&last))
                .await
                .map_err(|e| internal(self.state, &e))?
                .unwrap_or(TaskView { id: id.clone(), status: ViewStatus::Pending, result: None });
            if current.status.is_final() {
                // Events written between the read above and the result: every event is reported.
                let _ = progress.report(self.state, &owner, &id, context).await;
                return Ok(view_result(&current));
            }
            tokio::select! {
                changed = changes.changed() => {
                    if changed.is_err() {
                        tokio::time::sleep(RECHECK).await;
                    }
                }
                () = tokio::time::sleep(RECHECK) => {}
                () = stop.cancelled() => {
                    tracing::info!(task = %id, "the client stopped waiting; the task goes on");
                    return Err(ErrorData::internal_error("the request was cancelled; the task goes on", None));
                }
                () = self.state.shutdown.cancelled() => {
                    let mut interim = TaskView { id: id.clone(), status: ViewStatus::Running, result: None }.to_json();
                    interim["summary"] = Value::String(format!(
                        "the gateway is restarting; the task goes on: ask with get_task_result(task_id={:?})",
                        id.as_str()
                    ));
                    return Ok(json_result(interim));
                }
            }
        }
    }

    /// `get_task_result(task_id)`.
    pub async fn get_result(&self, args: &Map<String, Value>) -> Result<CallToolResult, ErrorData> {
        let raw = string_arg(args, "task_id");
        Ok(match self.find(raw).await? {
            Some((_, _, view)) => view_result(&view),
            None => no_such_task(raw),
        })
    }

    /// `cancel_task(task_id)`.
    pub async fn cancel(&self, args: &Map<String, Value>) -> Result<CallToolResult, ErrorData> {
        let raw = string_arg(args, "task_id");
        let Some((id, _, before)) = self.find(raw).await? else { return Ok(no_such_task(raw)) };
        if before.status.is_final() {
            return Ok(json_result(
                json!({"task_id": id.as_str(), "status": before.status.as_str(), "cancel_requested": false}),
            ));
        }
        let asked = self.backend()?.cancel(&self.owner(), &id).await.map_err(|e| internal(self.state, &e))?;
        tracing::info!(task = %id, asked, "task cancellation requested");
        Ok(json_result(json!({"task_id": id.as_str(), "status": before.status.as_str(), "cancel_requested": asked})))
    }

    /// `delete_task(task_id)`: a finished task's record and files.
    pub async fn delete(&self, args: &Map<String, Value>) -> Result<CallToolResult, ErrorData> {
        let raw = string_arg(args, "task_id");
        let Some((id, _, view)) = self.find(raw).await? else { return Ok(no_such_task(raw)) };
        let owner = self.owner();
        if !view.status.is_final() && !self.cancel_and_wait(&owner, &id).await? {
            return Ok(error_result(format!(
                "task {:?} was cancelled but has not stopped yet; delete it again in a moment",
                id.as_str()
            )));
        }
        let files = self
            .state
            .store
            .delete_folder(&owner, &view::task_folder(&owner, &id))
            .await
            .map_err(|e| internal(self.state, &e))?;
        self.backend()?.delete(&owner, &id).await.map_err(|e| internal(self.state, &e))?;
        self.state.calls.quota().forget(&owner);
        tracing::info!(task = %id, files, "task deleted");
        Ok(json_result(json!({"task_id": id.as_str(), "deleted": true, "files": files})))
    }

    /// Cancels task `id` of `owner` and waits (at most [`DELETE_STOP_WAIT`]) until it has
    /// stopped; `false` when it has not by then.
    async fn cancel_and_wait(&self, owner: &OwnerKey, id: &RunId) -> Result<bool, ErrorData> {
        let backend = self.backend()?;
        backend.cancel(owner, id).await.map_err(|e| internal(self.state, &e))?;
        tracing::info!(task = %id, "cancelling a task to delete it");
        let mut changes = backend.changes();
        let deadline = tokio::time::Instant::now() + DELETE_STOP_WAIT;
        loop {
            let record = backend.get(owner, id).await.map_err(|e| internal(self.state, &e))?;
            if record.is_none_or(|r| r.phase.is_finished()) {
                return Ok(true);
            }
            if tokio::time::timeout_at(deadline, async {
                tokio::select! {
                    _ = changes.changed() => {}
                    () = tokio::time::sleep(RECHECK) => {}
                }
            })
            .await
            .is_err()
            {
                return Ok(false);
            }
        }
    }

    /// `delete_call(call_id)`: a finished call's files, and its ToolCall on Kubernetes.
    pub async fn delete_call(&self, args: &Map<String, Value>) -> Result<CallToolResult, ErrorData> {
        let raw = string_arg(args, "call_id");
        let no_such_call = || error_result(format!("no such call: {:?}", raw.chars().take(64).collect::<String>()));
        let Ok(id) = RunId::parse(raw) else { return Ok(no_such_call()) };
        let owner = self.owner();
        let folder = format!("calls/{id}/");
        let forgotten = self.state.executor.forget(&owner, &id).await.map_err(|e| internal(self.state, &e))?;
        if forgotten == Forgotten::Running {
            return Ok(error_result(format!(
                "call {:?} is still running: cancel it or let it end, then delete it",
                id.as_str()
            )));
        }
        let files = self.state.store.delete_folder(&owner, &folder).await.map_err(|e| internal(self.state, &e))?;
        if files == 0 && forgotten == Forgotten::Nothing {
            return Ok(no_such_call());
        }
        self.state.calls.quota().forget(&owner);
        tracing::info!(call = %id, files, "call deleted");
        Ok(json_result(json!({"call_id": id.as_str(), "deleted": true, "files": files})))
    }

    /// `list_tasks(status?, limit?, cursor?)`: newest first.
    pub async fn list(&self, args: &Map<String, Value>) -> Result<CallToolResult, ErrorData> {
        let backend = self.backend()?;
        let wanted = args.get("status").and_then(Value::as_str).and_then(ViewStatus::parse);
        let limit =
            u64_arg(args, "limit").map_or(DEFAULT_LIST_LIMIT, |l| usize::try_from(l).unwrap_or(100)).clamp(1, 100);
        let after = match args.get("cursor").and_then(Value::as_str) {
            Some(c) => match decode_cursor(c) {
                Some(position) => Some(position),
                None => return Ok(error_result("invalid cursor")),
            },
            None => None,
        };
        let mut page = Vec::new();
        let mut more = false;
        let visit = &mut |record: TaskRecord| {
            let status = list_status(&record);
            if wanted.is_some_and(|w| w != status) {
                return ControlFlow::Continue(());
            }
            if page.len() == limit {
                more = true;
                return ControlFlow::Break(());
            }
            page.push((record, status));
            ControlFlow::Continue(())
        };
        // Pending and running tasks are walked apart from the (many more) finished ones.
        let subset = if wanted.is_some_and(|w| !w.is_final()) { Subset::Unfinished } else { Subset::All };
        backend.walk(&self.owner(), subset, after.as_ref(), visit).await.map_err(|e| internal(self.state, &e))?;
        let next_cursor =
            if more { page.last().map(|(r, _)| encode_cursor(r.created_ms, r.id.as_str())) } else { None };
        let tasks: Vec<Value> = page
            .iter()
            .map(|(r, status)| {
                json!({
                    "task_id": r.id.as_str(),
                    "status": status.as_str(),
                    "task_type": r.task_type,
                    "summary": r.summary,
                    "created_at": jiff::Timestamp::from_millisecond(r.created_ms).map(|t| t.to_string()).unwrap_or_default(),
                    "task": r.prompt.chars().take(200).collect::<String>(),
                })
            })
            .collect();
        Ok(json_result(json!({"tasks": tasks, "next_cursor": next_cursor})))
    }

    /// `list_artifacts(task_id)`.
    pub async fn list_artifacts(&self, args: &Map<String, Value>) -> Result<CallToolResult, ErrorData> {
        let raw = string_arg(args, "task_id");
        let Ok(id) = RunId::parse(raw) else { return Ok(no_such_task(raw)) };
        if !self.exists(&id).await? {
            return Ok(no_such_task(raw));
        }
        let store = self.state.store.as_ref();
        let owner = self.owner();
        let artifacts = view::artifacts(store, &owner, &id).await.map_err(|e| internal(self.state, &e))?;
        let files = view::files(store, &owner, &id).await.map_err(|e| internal(self.state, &e))?;
        Ok(json_result(json!({"task_id": id.as_str(), "artifacts": artifacts, "files": files})))
    }

    /// `read_artifact(task_id | call_id, filename, offset?, length?, encoding?)`.
    pub async fn read_artifact(&self, args: &Map<String, Value>) -> Result<CallToolResult, ErrorData> {
        match (args.get("task_id"), args.get("call_id")) {
            (Some(_), Some(_)) | (None, None) => return Ok(error_result("give either task_id or call_id")),
            (None, Some(_)) => return self.read_call_file(args).await,
            (Some(_), None) => {}
        }
        let raw = string_arg(args, "task_id");
        let Ok(id) = RunId::parse(raw) else { return Ok(no_such_task(raw)) };
        if !self.exists(&id).await? {
            return Ok(no_such_task(raw));
        }
        let filename = string_arg(args, "filename");
        let file = match storage::parse_task_file(filename) {
            Ok(f) => f,
            Err(e) => return Ok(error_result(format!("invalid filename {filename:?}: {e}"))),
        };
        let offset = u64_arg(args, "offset").unwrap_or(0);
        let length = u64_arg(args, "length").unwrap_or(MAX_CHUNK).clamp(1, MAX_CHUNK);
        let base64 = string_arg(args, "encoding") == "base64";
        let owner = self.owner();
        let chunk = self
            .state
            .store
            .get_range(&owner, &task_path(&owner, &id, &file), offset, length)
            .await
            .map_err(|e| internal(self.state, &e))?;
        let Some(chunk) = chunk else {
            return Ok(error_result(format!("no file {filename:?} in task {:?}", id.as_str())));
        };
        Ok(match encode_chunk(&chunk.bytes, offset, chunk.total, base64) {
            Ok(answer) => json_result(answer),
            Err(message) => error_result(message),
        })
    }

    /// `read_artifact(call_id, filename, ...)`: a file a call of the caller returned, or one
    /// of its records.
    async fn read_call_file(&self, args: &Map<String, Value>) -> Result<CallToolResult, ErrorData> {
        let raw = string_arg(args, "call_id");
        let no_such_call = || error_result(format!("no such call: {:?}", raw.chars().take(64).collect::<String>()));
        let Ok(id) = RunId::parse(raw) else { return Ok(no_such_call()) };
        let filename = string_arg(args, "filename");
        let path = match filename {
            "input.json" | "result.json" | "stdout.log" | "stderr.log" => format!("calls/{id}/{filename}"),
            _ => match storage::RelativePath::parse(filename.strip_prefix("outputs/").unwrap_or(filename)) {
                Ok(name) => format!("calls/{id}/outputs/{name}"),
                Err(e) => return Ok(error_result(format!("invalid filename {filename:?}: {e}"))),
            },
        };
        let offset = u64_arg(args, "offset").unwrap_or(0);
        let length = u64_arg(args, "length").unwrap_or(MAX_CHUNK).clamp(1, MAX_CHUNK);
        let base64 = string_arg(args, "encoding") == "base64";
        let owner = self.owner();
        let store = &self.state.store;
        let chunk = store.get_range(&owner, &path, offset, length).await.map_err(|e| internal(self.state, &e))?;
        let Some(chunk) = chunk else {
            let folder = format!("calls/{id}/");
            let known = !store.list(&owner, &folder).await.map_err(|e| internal(self.state, &e))?.is_empty();
            return Ok(if known {
                error_result(format!("no file {filename:?} in call {:?}", id.as_str()))
            } else {
                no_such_call()
            });
        };
        Ok(match encode_chunk(&chunk.bytes, offset, chunk.total, base64) {
            Ok(answer) => json_result(answer),
            Err(message) => error_result(message),
        })
    }

    /// `tool_search(query, limit?)` over the tools the caller may call, best match first
    /// ([`crate::core::search`]).
    pub async fn tool_search(&self, args: &Map<String, Value>) -> Result<CallToolResult, ErrorData> {
        let limit = u64_arg(args, "limit").map_or(10, |l| usize::try_from(l).unwrap_or(50)).clamp(1, 50);
        let tools = self.state.catalog.tools().to_vec();
        let candidates = crate::core::search::rank(string_arg(args, "query"), tools);
        let (found, _) = self
            .state
            .access()
            .visible(self.who, candidates, |t| Some(t.as_ref()), limit)
            .await
            .map_err(|e| internal(self.state, &e))?;
        let found: Vec<Value> = found
            .iter()
            .map(|tool| {
                json!({
                    "name": tool.name(),
                    "title": tool.spec.title,
                    "description": tool.spec.description,
                    "input_schema": tool.input_schema,
                })
            })
            .collect();
        Ok(json_result(json!({"tools": found})))
    }

    /// `tasks/get` of the tasks extension.
    pub async fn extension_get(&self, raw_id: &str) -> Result<DetailedTask, ErrorData> {
        let Some((id, record, view)) = self.find(raw_id).await? else {
            return Err(ErrorData::invalid_params(
                format!("no such task: {:?}", raw_id.chars().take(64).collect::<String>()),
                None,
            ));
        };
        let now = jiff::Timestamp::now().to_string();
        let created = record
            .as_ref()
            .and_then(|r| jiff::Timestamp::from_millisecond(r.created_ms).ok())
            .map_or(now.clone(), |t| t.to_string());
        let task =
            Task::new(id.to_string(), McpTaskStatus::Working, created, now).with_poll_interval_ms(POLL_INTERVAL_MS);
        let payload = match view.status {
            ViewStatus::Pending | ViewStatus::Running => TaskPayload::Working,
            ViewStatus::Cancelled => TaskPayload::Cancelled,
            _ => {
                let result = serde_json::to_value(view_result(&view))
                    .ok()
                    .and_then(|v| v.as_object().cloned())
                    .unwrap_or_default();
                TaskPayload::Completed { result }
            }
        };
        Ok(DetailedTask::new(task, payload))
    }

    /// `tasks/cancel` of the tasks extension.
    pub async fn extension_cancel(&self, raw_id: &str) -> Result<(), ErrorData> {
        let known = match RunId::parse(raw_id) {
            Ok(id) => self.backend()?.cancel(&self.owner(), &id).await.map_err(|e| internal(self.state, &e))?,
            Err(_) => false,
        };
        if known {
            Ok(())
        } else {
            Err(ErrorData::invalid_params(
                format!("no such task: {:?}", raw_id.chars().take(64).collect::<String>()),
                None,
            ))
        }
    }
}

/// Budgets from the `budgets` argument: the given values over the defaults; more model calls
/// than steps (every step needs one) unless set explicitly.
pub fn budgets(value: Option<&Value>) -> Result<Budgets, String> {
    let mut b = Budgets::default();
    let Some(Value::Object(given)) = value else { return Ok(b) };
    let get = |k: &str| given.get(k).and_then(Value::as_i64).and_then(|v| i32::try_from(v).ok());
    if let Some(v) = get("max_steps") {
        b.max_steps = v;
        b.max_model_calls = b.max_model_calls.max(v.saturating_mul(2).min(1000));
    }
    if let Some(v) = get("max_model_calls") {
        b.max_model_calls = v;
    }
    if let Some(v) = get("max_tool_calls") {
        b.max_tool_calls = v;
    }
    if let Some(v) = get("timeout_seconds") {
        b.timeout_seconds = v;
    }
    if let Some(v) = given.get("max_model_tokens").and_then(Value::as_i64) {
        b.max_model_tokens = v;
    }
    if b.max_model_calls < b.max_steps {
        return Err(format!(
            "budgets: max_model_calls ({}) must be at least max_steps ({}): every step needs a model call",
            b.max_model_calls, b.max_steps
        ));
    }
    Ok(b)
}

/// The status shown in `list_tasks` (from the backend's record; `get_task_result` reads the
/// stored result too).
fn list_status(record: &TaskRecord) -> ViewStatus {
    match &record.phase {
        crate::tasks::Phase::Pending => ViewStatus::Pending,
        crate::tasks::Phase::Running => ViewStatus::Running,
        crate::tasks::Phase::Finished { status, .. } => (*status).into(),
    }
}

/// One `read_artifact` answer: `{content, encoding, offset, next_offset, size}`.
///
/// Text chunks end on a character boundary (the rest comes with the next chunk) and must
/// start on one; base64 chunks are the base64 of exactly their bytes, so each decodes alone.
pub fn encode_chunk(bytes: &[u8], offset: u64, size: u64, base64: bool) -> Result<Value, String> {
    if offset > size {
        return Err(format!("offset {offset} is past the end of the file ({size} bytes)"));
    }
    let at_end = offset + bytes.len() as u64 >= size;
    let (content, consumed) = if base64 {
        (B64.encode(bytes), bytes.len())
    } else {
        if bytes.first().is_some_and(|b| (0x80..0xC0).contains(b)) {
            return Err(format!(
                "offset {offset} is inside a UTF-8 character; start at a character boundary (a next_offset) or use \
                 encoding \"base64\""
            ));
        }
        let valid = match std::str::from_utf8(bytes) {
            Ok(_) => bytes.len(),
            // A character cut at the end of the chunk: it comes with the next one.
            Err(e) if e.error_len().is_none() && !at_end && e.valid_up_to() > 0 => e.valid_up_to(),
            Err(e) if e.error_len().is_none() && !at_end => {
                return Err("length is too small to hold one character; ask for more bytes".to_owned());
            }
            Err(_) => return Err("the file is not UTF-8 text; read it with encoding \"base64\"".to_owned()),
        };
        (String::from_utf8_lossy(&bytes[..valid]).into_owned(), valid)
    };
    let next = offset + consumed as u64;
    Ok(json!({
        "content": content,
        "encoding": if base64 { "base64" } else { "text" },
        "offset": offset,
        "next_offset": if next >= size { Value::Null } else { json!(next) },
        "size": size,
    }))
}

const CURSOR_PREFIX: &str = "tyt1:";

fn encode_cursor(created_ms: i64, id: &str) -> String {
    B64URL.encode(format!("{CURSOR_PREFIX}{created_ms}:{id}"))
}

fn decode_cursor(cursor: &str) -> Option<(i64, String)> {
    if cursor.len() > 256 {
        return None;
    }
    let text = String::from_utf8(B64URL.decode(cursor).ok()?).ok()?;
    let (ms, id) = text.strip_prefix(CURSOR_PREFIX)?.split_once(':')?;
    Some((ms.parse().ok()?, RunId::parse(id).ok()?.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(v: &Value) -> Vec<u8> {
        match v["encoding"].as_str() {
            Some("base64") => B64.decode(v["content"].as_str().unwrap()).unwrap(),
            _ => v["content"].as_str().unwrap().as_bytes().to_vec(),
        }
    }

    /// Reads `data` in chunks of `len` as read_artifact does.
    fn read_all(data: &[u8], len: usize, base64: bool) -> Vec<u8> {
        let mut out = Vec::new();
        let mut offset = 0u64;
        loop {
            let start = usize::try_from(offset).unwrap();
            let chunk = &data[start..(start + len).min(data.len())];
            let answer = encode_chunk(chunk, offset, data.len() as u64, base64).unwrap();
            assert_eq!(answer["offset"], offset);
            assert_eq!(answer["size"], data.len());
            out.extend(decode(&answer));
            match answer["next_offset"].as_u64() {
                Some(next) => offset = next,
                None => return out,
            }
        }
    }

    #[test]
    fn chunks_reassemble_in_both_encodings_and_text_never_splits_a_character() {
        let text = "spot,price\n90,1.23\nprix élevé ✓ 100\n".repeat(50);
        for len in [4, 5, 7, 64, 1000, 100_000] {
            assert_eq!(read_all(text.as_bytes(), len, false), text.as_bytes(), "text, len {len}");
            assert_eq!(read_all(text.as_bytes(), len, true), text.as_bytes(), "base64, len {len}");
        }
        let binary: Vec<u8> = (0..=255u8).cycle().take(3000).collect();
        assert_eq!(read_all(&binary, 1000, true), binary);
        assert!(encode_chunk(&binary[200..300], 200, 3000, false).unwrap_err().contains("base64"));
        assert!(encode_chunk("é".as_bytes().get(1..).unwrap(), 1, 2, false).unwrap_err().contains("inside a UTF-8"));
        let empty = encode_chunk(b"", 0, 0, false).unwrap();
        assert_eq!((empty["content"].as_str(), empty["next_offset"].is_null()), (Some(""), true));
        assert!(encode_chunk(b"", 5, 3, true).unwrap_err().contains("past the end"));
    }

    #[test]
    fn budgets_fill_defaults_and_keep_model_calls_above_steps() {
        assert_eq!(budgets(None).unwrap(), Budgets::default());
        let b = budgets(Some(&json!({"max_steps": 50}))).unwrap();
        assert_eq!((b.max_steps, b.max_model_calls), (50, 100));
        let b = budgets(Some(&json!({"max_steps": 3, "max_tool_calls": 2, "timeout_seconds": 60}))).unwrap();
        assert_eq!((b.max_steps, b.max_model_calls, b.max_tool_calls, b.timeout_seconds), (3, 40, 2, 60));
        assert!(
            budgets(Some(&json!({"max_steps": 5, "max_model_calls": 2}))).unwrap_err().contains("at least max_steps")
        );
    }

    #[test]
    fn cursors_round_trip_and_reject_junk() {
        assert_eq!(decode_cursor(&encode_cursor(17, "task-abc")), Some((17, "task-abc".to_owned())));
        assert_eq!(decode_cursor("junk"), None);
        assert_eq!(decode_cursor(&B64URL.encode("tyt1:x:task")), None);
    }
}

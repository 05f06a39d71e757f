//! The coding-task routes of the internal API, as a task's agent uses them with its task
//! token. The task is the one the token names (kind `task`, same id); its record comes from
//! the [`TaskBackend`] and must have the token's owner; storage is addressed through that
//! owner. Once the task has ended (its result is recorded, or its backend says it is over)
//! the token opens nothing: every route answers 403, so a finished task's files cannot be
//! rewritten. Tool calls go through [`crate::core::Calls`], the service MCP calls use: they
//! run as the owner, within the task's tool selection, with the same authorization,
//! argument validation, per-user admission limits and metrics as the owner's own calls; each
//! is a call like any other (a ToolCall on Kubernetes) naming the task as its parent.

use std::ops::ControlFlow;
use std::sync::Arc;
use tracing::Instrument;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use toolyard_api::agent::{
    ArtifactEntry, ReturnedFile, TaskResult, TaskSpec, ToolCallBody, ToolOutcome, ToolSearchBody,
};
use toolyard_api::protocol::structured_content;
use toolyard_api::storage::{RelativePath, RunId, TaskFile};
use toolyard_api::token::RunKind;

use super::InternalState;
use super::auth::RunClaims;
use super::error::ApiError;
use super::handlers::{read_body, store_task_output};
use crate::core::ids::is_traceparent;
use crate::core::{CallError, CallInput, Called, Calls, Selection};
use crate::identity::Identity;
use crate::model::{ModelProxy, ProxyError, USER_BUDGET_WINDOW, Usage};
use crate::tasks::view::{self, task_path};
use crate::tasks::{Subset, TaskBackend, TaskRecord, now_ms, tools};

type St = State<Arc<InternalState>>;

/// Largest step code accepted.
const MAX_ACTION_BYTES: usize = 1024 * 1024;
/// Largest `tool_calls.json` accepted.
const MAX_TOOL_CALLS_BYTES: usize = 16 * 1024 * 1024;
/// Largest tool call body accepted.
const MAX_CALL_BYTES: usize = 4 * 1024 * 1024;

/// What the task routes need besides storage.
#[derive(Clone)]
pub struct TaskApi {
    /// Where tasks run.
    pub backend: Arc<dyn TaskBackend>,
    /// The call service the MCP server uses too: the tasks' tool calls are resolved,
    /// admitted, counted and traced like direct calls, against the owner's limits.
    pub calls: Arc<Calls>,
    /// The tasks' model calls.
    pub models: Arc<ModelProxy>,
}

/// The task routes' context, or 503 when this gateway has no task backend.
fn api(state: &InternalState) -> Result<&TaskApi, ApiError> {
    state.tasks.as_ref().ok_or_else(|| {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "coding tasks are not configured on this gateway")
    })
}

/// The token's task, with its record, while it has not ended.
pub(super) async fn live_task(
    state: &InternalState,
    claims: &RunClaims,
    id: &str,
) -> Result<(RunId, TaskRecord), ApiError> {
    let id = claims.require(RunKind::Task, id)?;
    let record = api(state)?
        .backend
        .for_runner(&claims.0.ns, &id, &claims.owner_key())
        .await?
        .ok_or_else(|| ApiError::not_found("no such task"))?;
    if record.phase.is_finished() || record.task_type.is_some() {
        return Err(ApiError::forbidden("the task has ended: its token no longer opens anything"));
    }
    Ok((id, record))
}

/// `GET tasks/{id}/spec`: prompt, the tools the owner may call within the task's selection,
/// budgets, deadline and the artifact size cap.
pub async fn spec(State(state): St, claims: RunClaims, Path(id): Path<String>) -> Result<Json<TaskSpec>, ApiError> {
    let (id, record) = live_task(&state, &claims, &id).await?;
    let api = api(&state)?;
    let owner = Identity::from_owner(&claims.0.owner);
    let allowed = api.calls.access().tools(&owner, &Selection::from(&record.tools)).await?;
    let model = api.models.profiles().resolve(record.profile.as_deref()).map(|p| p.model.clone()).unwrap_or_default();
    Ok(Json(TaskSpec {
        id: id.to_string(),
        prompt: record.prompt.clone(),
        tools: allowed.iter().map(|t| tools::info(t)).collect(),
        budgets: record.budgets.clone(),
        deadline_unix_ms: record.deadline_ms(),
        max_artifact_bytes: state.limits.output_bytes as u64,
        model,
    }))
}

/// Most tools a search returns.
const MAX_SEARCH_RESULTS: usize = 50;

/// `POST tasks/{id}/tools/search`: the task's tools matching the query, best first (the
/// ranking of `tool_search` on MCP, [`crate::core::search`]).
pub async fn tool_search(
    State(state): St,
    claims: RunClaims,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Vec<toolyard_api::agent::ToolInfo>>, ApiError> {
    let (_, record) = live_task(&state, &claims, &id).await?;
    let api = api(&state)?;
    let bytes = read_body(&headers, body, MAX_CALL_BYTES, "the tool search").await?;
    let search: ToolSearchBody = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("the body is not a tool search: {e}")))?;
    let owner = Identity::from_owner(&claims.0.owner);
    let allowed = api.calls.access().tools(&owner, &Selection::from(&record.tools)).await?;
    let limit =
        search.limit.map_or(10, |l| usize::try_from(l).unwrap_or(MAX_SEARCH_RESULTS)).clamp(1, MAX_SEARCH_RESULTS);
    let found = crate::core::search::rank(&search.query, allowed);
    Ok(Json(found.iter().take(limit).map(|t| tools::info(t)).collect()))
}

/// `POST tasks/{id}/tools/{tool}/call`: one tool call as the task's owner.
pub async fn tool_call(
    State(state): St,
    claims: RunClaims,
    Path((id, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<ToolOutcome>, ApiError> {
    let (id, record) = live_task(&state, &claims, &id).await?;
    let api = api(&state)?;
    let bytes = read_body(&headers, body, MAX_CALL_BYTES, "the tool call").await?;
    let call: ToolCallBody = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("the body is not a tool call: {e}")))?;
    // The agent's request going away (agent killed) cancels the call.
    let cancel = CancellationToken::new();
    let _cancel_on_drop = cancel.clone().drop_guard();
    let input = CallInput {
        who: Identity::from_owner(&claims.0.owner),
        selection: Selection::from(&record.tools),
        tool: name,
        arguments: call.arguments,
        traceparent: headers
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .filter(|t| is_traceparent(t))
            .map(str::to_owned),
        parent_task: Some(id.clone()),
        cancel,
        cancel_key: None,
        progress: None,
        logs: None,
        asker: None,
        task: None,
    };
    let failed = |text: String, call_id: Option<&RunId>| ToolOutcome {
        is_error: true,
        structured_content: None,
        text,
        call_id: call_id.map(ToString::to_string),
        files: Vec::new(),
    };
    Ok(Json(match api.calls.call(input).await {
        Ok(Called { id: call_id, result }) => match (result.error, result.value) {
            (Some(error), _) => failed(error.message, Some(&call_id)),
            (None, value) => {
                let value = value.unwrap_or(Value::Null);
                let owner = claims.owner_key();
                ToolOutcome {
                    is_error: false,
                    text: serde_json::to_string(&value).unwrap_or_default(),
                    structured_content: Some(Value::Object(structured_content(&value))),
                    files: keep_returned_files(&state, &owner, &id, &call_id, &result.files).await,
                    call_id: Some(call_id.to_string()),
                }
            }
        },
        Err(e @ CallError::UnknownTool(_)) => {
            tracing::info!(task = %id, "a task asked for a tool it may not use or that does not exist");
            failed(e.to_string(), None)
        }
        Err(e @ CallError::InvalidArguments(_)) => failed(e.to_string(), None),
        Err(CallError::Busy(what)) => failed(format!("server busy: {what}; retry later"), None),
        Err(CallError::QuotaReached(message)) => failed(message, None),
        Err(CallError::Platform(e)) => {
            tracing::warn!(task = %id, error = %e, "a task's tool call failed in the platform");
            failed(e.public_message(), None)
        }
    }))
}

/// Saves the files a task's call returned as artifacts of the task (`<call id>/<name>`),
/// within the task's artifact limits, so that they are part of what the task hands back and
/// its code can read them.
async fn keep_returned_files(
    state: &InternalState,
    owner: &toolyard_api::OwnerKey,
    task: &RunId,
    call: &RunId,
    files: &[toolyard_api::protocol::outputs::OutputFile],
) -> Vec<ReturnedFile> {
    let mut kept = Vec::with_capacity(files.len());
    for file in files {
        let name = format!("{call}/{}", file.name);
        let saved = match (
            RelativePath::parse(&name),
            state.store.get(owner, &format!("calls/{call}/outputs/{}", file.name)).await,
        ) {
            (Ok(path), Ok(Some(bytes))) => {
                store_task_output(state, owner, task, path, bytes).await.map_err(|e| e.message)
            }
            (Err(e), _) => Err(e.to_string()),
            (_, Ok(None)) => Err("the call's file is not stored".to_owned()),
            (_, Err(e)) => {
                tracing::warn!(task = %task, call = %call, error = %e, "reading a returned file failed");
                Err(e.public_message())
            }
        };
        let (artifact, not_saved) = match saved {
            Ok(()) => (Some(name), None),
            Err(why) => (None, Some(why)),
        };
        kept.push(ReturnedFile {
            name: file.name.clone(),
            mime_type: file.mime_type.clone(),
            size: file.size,
            artifact,
            not_saved,
        });
    }
    kept
}

/// `GET tasks/{id}/outputs`: the artifacts, listed from storage.
pub async fn outputs(
    State(state): St,
    claims: RunClaims,
    Path(id): Path<String>,
) -> Result<Json<Vec<ArtifactEntry>>, ApiError> {
    let (id, _record) = live_task(&state, &claims, &id).await?;
    Ok(Json(view::artifacts(state.store.as_ref(), &claims.owner_key(), &id).await?))
}

/// `PUT tasks/{id}/actions/{step}`: the code of one step.
pub async fn action(
    State(state): St,
    claims: RunClaims,
    Path((id, step)): Path<(String, u32)>,
    headers: HeaderMap,
    body: Body,
) -> Result<StatusCode, ApiError> {
    let (id, _record) = live_task(&state, &claims, &id).await?;
    let owner = claims.owner_key();
    let bytes = read_body(&headers, body, MAX_ACTION_BYTES, "the step's code").await?;
    state.store.put(&owner, &task_path(&owner, &id, &TaskFile::Action(step)), bytes).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `PUT tasks/{id}/tool_calls`: every tool call of the task with its outcome.
pub async fn tool_calls(
    State(state): St,
    claims: RunClaims,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<StatusCode, ApiError> {
    let (id, _record) = live_task(&state, &claims, &id).await?;
    let owner = claims.owner_key();
    let bytes = read_body(&headers, body, MAX_TOOL_CALLS_BYTES, "tool_calls.json").await?;
    if !matches!(serde_json::from_slice::<Value>(&bytes), Ok(Value::Array(_))) {
        return Err(ApiError::bad_request("tool_calls.json must be a JSON array"));
    }
    state.store.put(&owner, &task_path(&owner, &id, &TaskFile::ToolCalls), bytes).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `PUT tasks/{id}/result`: stores `result.json` (artifacts re-listed from storage, never
/// taken from the upload), then the backend records it.
pub async fn result(
    State(state): St,
    claims: RunClaims,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<StatusCode, ApiError> {
    let (id, _record) = live_task(&state, &claims, &id).await?;
    let owner = claims.owner_key();
    let bytes = read_body(&headers, body, state.limits.result_bytes, "the result").await?;
    let mut result: TaskResult = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("the body is not a task result: {e}")))?;
    result.artifacts = view::artifacts(state.store.as_ref(), &owner, &id).await?;
    let canonical = serde_json::to_vec(&result).map_err(|e| crate::Error::Internal(e.to_string()))?;
    state.store.put(&owner, &task_path(&owner, &id, &TaskFile::Result), Bytes::from(canonical)).await?;
    tracing::info!(task = %id, status = ?result.status, "task result stored");
    if let Err(e) = api(&state)?.backend.record_result(&claims.0.ns, &id, &owner, &result).await {
        tracing::warn!(task = %id, error = %e, "recording the task result failed");
        return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the result was stored but not recorded; retry"));
    }
    Ok(StatusCode::NO_CONTENT)
}

/// `POST tasks/{id}/model/chat/completions`: one model call of the task, forwarded to its
/// model profile with the profile's key (see [`crate::model`]). Refusals and failures of the
/// gateway answer in the OpenAI error format; the endpoint's own answers pass through.
pub async fn model_chat(
    State(state): St,
    claims: RunClaims,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let refuse = |e: ProxyError| {
        let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_GATEWAY);
        let mut response = (status, Json(e.body())).into_response();
        if e.status == 429 {
            // The per-user budget frees up over the day: an agent should not wait for it.
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from_static("3600"));
        }
        response
    };
    let (id, record) = match live_task(&state, &claims, &id).await {
        Ok(task) => task,
        Err(e) => return refuse(ProxyError { status: e.status.as_u16(), message: e.message }),
    };
    let api = match api(&state) {
        Ok(api) => api,
        Err(e) => return refuse(ProxyError { status: e.status.as_u16(), message: e.message }),
    };
    let bytes = match read_body(&headers, body, crate::model::MAX_REQUEST_BYTES, "the model request").await {
        Ok(b) => b,
        Err(e) => return refuse(ProxyError { status: e.status.as_u16(), message: e.message }),
    };
    // In the agent's trace: a child of its `model.generate` span.
    let span = tracing::info_span!("model.proxy", "otel.kind" = "server", "toolyard.task.id" = %id);
    toolyard_telemetry::set_parent(&span, headers.get("traceparent").and_then(|v| v.to_str().ok()));
    match model_call(api, &id, &record, &bytes).instrument(span).await {
        Ok(forwarded) => {
            let status = StatusCode::from_u16(forwarded.status).unwrap_or(StatusCode::BAD_GATEWAY);
            let mut response =
                (status, [(axum::http::header::CONTENT_TYPE, "application/json")], forwarded.body).into_response();
            if let Some(value) = forwarded.retry_after.and_then(|v| axum::http::HeaderValue::from_str(&v).ok()) {
                response.headers_mut().insert(axum::http::header::RETRY_AFTER, value);
            }
            response
        }
        Err(e) => refuse(e),
    }
}

async fn model_call(
    api: &TaskApi,
    id: &RunId,
    record: &TaskRecord,
    body: &[u8],
) -> Result<crate::model::Forwarded, ProxyError> {
    let platform = |e: crate::Error| {
        tracing::warn!(task = %id, error = %e, "model call: the gateway could not check the task");
        ProxyError { status: 503, message: e.public_message() }
    };
    let profile = api
        .models
        .profiles()
        .resolve(record.profile.as_deref())
        .map_err(|e| ProxyError { status: 503, message: e.to_string() })?
        .clone();
    let owner = Identity::from_owner(&record.owner);
    if !api
        .calls
        .access()
        .authorizer()
        .can_use_model(&owner, &record.namespace, &profile.name)
        .await
        .map_err(platform)?
    {
        return Err(ProxyError {
            status: 403,
            message: format!("the task's owner may not use the model profile {:?}", profile.name),
        });
    }
    let since = now_ms() - i64::try_from(USER_BUDGET_WINDOW.as_millis()).unwrap_or(i64::MAX);
    // The owner's tasks of the window: the newest, up to the first older than it.
    let mut owner_used: i64 = 0;
    let visit = &mut |t: TaskRecord| {
        if t.created_ms < since {
            return ControlFlow::Break(());
        }
        owner_used = owner_used.saturating_add(t.model_tokens);
        ControlFlow::Continue(())
    };
    api.backend.walk(&record.owner.key(), Subset::All, None, visit).await.map_err(platform)?;
    api.models.check_budgets(Usage {
        task_used: record.model_tokens,
        task_budget: record.budgets.max_model_tokens,
        owner_used,
    })?;
    let forwarded = api.models.forward(&profile, &record.owner.user, body).await?;
    if let Some(tokens) = forwarded.tokens {
        let total = record.model_tokens.saturating_add(tokens);
        if let Err(e) = api.backend.set_model_tokens(&record.namespace, id, &record.owner.key(), total).await {
            tracing::warn!(task = %id, error = %e, "could not record the task's model tokens");
        }
    }
    Ok(forwarded)
}

//! Handlers of the internal API routes (see the module docs of [`super`]).

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use toolyard_api::OwnerKey;
use toolyard_api::protocol::{CallResult, Event, Progress, outputs};
use toolyard_api::storage::{self, CallFile, RelativePath, RunId, TaskFile};
use toolyard_api::token::RunKind;

use super::InternalState;
use super::auth::RunClaims;
use super::error::ApiError;
use crate::executor::events as call_events;
use crate::store::events::{self, AppendError};

type St = State<Arc<InternalState>>;

/// `owners/<key>/x` → `x`: the store takes paths relative to the owner's prefix.
fn relative(owner: &OwnerKey, key: String) -> String {
    let prefix = storage::owner_prefix(owner);
    key.strip_prefix(&prefix).map(str::to_owned).unwrap_or(key)
}

fn call_path(owner: &OwnerKey, id: &RunId, file: CallFile) -> String {
    relative(owner, storage::call_key(owner, id, file))
}

fn task_path(owner: &OwnerKey, id: &RunId, file: &TaskFile) -> String {
    relative(owner, storage::task_key(owner, id, file))
}

/// Reads a body of at most `limit` bytes (413 beyond, checked on the declared length first; 408
/// when it misses the server's body deadline; 400 when the connection fails).
pub(super) async fn read_body(headers: &HeaderMap, body: Body, limit: usize, what: &str) -> Result<Bytes, ApiError> {
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::too_large(what, limit));
    }
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        if crate::server::is_body_timeout(&e) {
            ApiError::new(StatusCode::REQUEST_TIMEOUT, format!("{what} was not received in time"))
        } else if crate::server::caused_by::<http_body_util::LengthLimitError>(&e) {
            ApiError::too_large(what, limit)
        } else {
            ApiError::bad_request(format!("could not read {what}"))
        }
    })
}

/// `GET calls/{id}/input`.
pub async fn call_input(State(state): St, claims: RunClaims, Path(id): Path<String>) -> Result<Response, ApiError> {
    let id = claims.require(RunKind::Call, &id)?;
    let owner = claims.owner_key();
    let bytes = state
        .store
        .get(&owner, &call_path(&owner, &id, CallFile::Input))
        .await?
        .ok_or_else(|| ApiError::not_found("the call has no input"))?;
    Ok(([(header::CONTENT_TYPE, "application/json")], bytes).into_response())
}

/// `PUT calls/{id}/result`: stores `result.json`, then runs the recorder.
pub async fn call_result(
    State(state): St,
    claims: RunClaims,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<StatusCode, ApiError> {
    let id = claims.require(RunKind::Call, &id)?;
    let owner = claims.owner_key();
    let bytes = read_body(&headers, body, state.limits.result_bytes, "the result").await?;
    let mut result: CallResult = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("the body is not a call result: {e}")))?;
    // The result lists only the returned files that were uploaded, as uploaded.
    if !result.files.is_empty() {
        let folder = call_outputs_folder(&id);
        let stored = state.store.list(&owner, &folder).await?;
        result.files.retain(|f| {
            stored.iter().any(|o| o.path == format!("{folder}{}", f.name) && o.size == f.size)
                && outputs::is_media_type(&f.mime_type)
                && (!f.image || outputs::IMAGE_TYPES.contains(&f.mime_type.as_str()))
        });
    }
    let canonical = serde_json::to_vec(&result).map_err(|e| crate::Error::Internal(e.to_string()))?;
    state.store.put(&owner, &call_path(&owner, &id, CallFile::Result), Bytes::from(canonical)).await?;
    tracing::debug!(call = %id, is_error = result.is_error(), "call result stored");
    if let Some(recorder) = &state.recorder
        && let Err(e) = recorder.record(&claims.0.ns, &id, &owner, &result).await
    {
        tracing::warn!(call = %id, error = %e, "recording the call result failed");
        return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the result was stored but not recorded; retry"));
    }
    Ok(StatusCode::NO_CONTENT)
}

/// `PUT calls/{id}/outputs/{*name}`: a file the call returned (an image, a CSV), before its
/// result; at most [`outputs::MAX_FILES`] per call of [`outputs::MAX_FILE_BYTES`] each.
pub async fn put_call_output(
    State(state): St,
    claims: RunClaims,
    Path((id, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<StatusCode, ApiError> {
    let id = claims.require(RunKind::Call, &id)?;
    let name = RelativePath::parse(&name).map_err(|e| ApiError::bad_request(format!("invalid file name: {e}")))?;
    let owner = claims.owner_key();
    let folder = call_outputs_folder(&id);
    let target = format!("{folder}{name}");
    let others = state.store.list(&owner, &folder).await?.into_iter().filter(|o| o.path != target).count();
    if others >= outputs::MAX_FILES {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("a call returns at most {} files", outputs::MAX_FILES),
        ));
    }
    let limit = usize::try_from(outputs::MAX_FILE_BYTES).unwrap_or(usize::MAX);
    let bytes = read_body(&headers, body, limit, "the returned file").await?;
    state.store.put(&owner, &target, bytes).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `calls/<id>/outputs/`, relative to the owner's prefix.
pub fn call_outputs_folder(id: &RunId) -> String {
    format!("calls/{id}/outputs/")
}

/// `PUT calls/{id}/logs/{stream}`.
pub async fn call_log(
    State(state): St,
    claims: RunClaims,
    Path((id, stream)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<StatusCode, ApiError> {
    let id = claims.require(RunKind::Call, &id)?;
    let file = match stream.as_str() {
        "stdout" => CallFile::Stdout,
        "stderr" => CallFile::Stderr,
        _ => return Err(ApiError::not_found("log streams are 'stdout' and 'stderr'")),
    };
    let owner = claims.owner_key();
    let bytes = read_body(&headers, body, state.limits.log_bytes, "the log").await?;
    state.store.put(&owner, &call_path(&owner, &id, file), bytes).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST calls/{id}/events`.
pub async fn call_events(
    State(state): St,
    claims: RunClaims,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<StatusCode, ApiError> {
    let id = claims.require(RunKind::Call, &id)?;
    let owner = claims.owner_key();
    let folder = call_events::folder(id.as_str());
    let stored =
        append_events(&state, &owner, &headers, body, &folder, |n| call_events::segment_path(id.as_str(), n)).await?;
    // A caller waiting for this call in this process sees its progress at once.
    if let Some(hub) = &state.progress
        && let Some(progress) = stored.iter().rev().find_map(Progress::of_event)
    {
        hub.report(&owner, id.as_str(), progress);
    }
    Ok(StatusCode::NO_CONTENT)
}

/// `POST tasks/{id}/events`.
pub async fn task_events(
    State(state): St,
    claims: RunClaims,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<StatusCode, ApiError> {
    let (id, _record) = super::tasks::live_task(&state, &claims, &id).await?;
    let owner = claims.owner_key();
    let folder = format!("{}events/", relative(&owner, storage::task_prefix(&owner, &id)));
    append_events(&state, &owner, &headers, body, &folder, |n| task_path(&owner, &id, &TaskFile::Events(n))).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Checks a batch of JSON-lines events and stores it as the next numbered segment; returns
/// the events stored.
async fn append_events(
    state: &InternalState,
    owner: &OwnerKey,
    headers: &HeaderMap,
    body: Body,
    folder: &str,
    segment_path: impl Fn(u32) -> String,
) -> Result<Vec<Event>, ApiError> {
    let bytes = read_body(headers, body, state.limits.events_bytes, "the events").await?;
    let text = std::str::from_utf8(&bytes).map_err(|_| ApiError::bad_request("events must be UTF-8 JSON lines"))?;
    let mut parsed = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let event: Event = serde_json::from_str(line)
            .map_err(|e| ApiError::bad_request(format!("line {} is not an event: {e}", i + 1)))?;
        parsed.push(event);
    }
    if parsed.is_empty() {
        return Err(ApiError::bad_request("no events in the body"));
    }
    let segment = events::segment(&parsed);
    let store = state.store.as_ref();
    let appended =
        state.event_logs.append(store, owner, folder, segment_path, segment, state.limits.run_event_bytes).await;
    match appended {
        Ok(()) => Ok(parsed),
        Err(e @ AppendError::Full { .. }) => Err(ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, e.to_string())),
        Err(e @ AppendError::TooManySegments) => Err(ApiError::bad_request(e.to_string())),
        Err(AppendError::Store(e)) => Err(e.into()),
    }
}

fn output_path(raw: &str) -> Result<RelativePath, ApiError> {
    RelativePath::parse(raw).map_err(|e| ApiError::bad_request(e.to_string()))
}

/// `PUT tasks/{id}/outputs/{*path}`.
pub async fn put_task_output(
    State(state): St,
    claims: RunClaims,
    Path((id, path)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<StatusCode, ApiError> {
    let path = output_path(&path)?;
    let (id, _record) = super::tasks::live_task(&state, &claims, &id).await?;
    let bytes = read_body(&headers, body, state.limits.output_bytes, "the artifact").await?;
    store_task_output(&state, &claims.owner_key(), &id, path, bytes).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Stores one artifact of a task within the task's limits (count and bytes; the artifact it
/// replaces, if any, does not count).
pub(super) async fn store_task_output(
    state: &InternalState,
    owner: &OwnerKey,
    id: &RunId,
    path: RelativePath,
    bytes: Bytes,
) -> Result<(), ApiError> {
    if bytes.len() > state.limits.output_bytes {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the artifact has {} bytes, more than the {} one may have", bytes.len(), state.limits.output_bytes),
        ));
    }
    let owner = owner.clone();
    let target = task_path(&owner, id, &TaskFile::Output(path));
    // The task's other artifacts (the one replaced, if any, does not count).
    let folder = format!("{}outputs/", relative(&owner, storage::task_prefix(&owner, id)));
    let others: Vec<_> = state.store.list(&owner, &folder).await?.into_iter().filter(|o| o.path != target).collect();
    let limits = &state.limits;
    if others.len() >= limits.task_outputs {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the task keeps {} artifacts, the most it may; replace one instead", others.len()),
        ));
    }
    let kept: u64 = others.iter().map(|o| o.size).sum();
    if kept + bytes.len() as u64 > limits.task_output_bytes {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the task's artifacts would take {} bytes, more than the {} a task may keep",
                kept + bytes.len() as u64,
                limits.task_output_bytes
            ),
        ));
    }
    state.store.put(&owner, &target, bytes).await?;
    Ok(())
}

/// `GET tasks/{id}/outputs/{*path}`.
pub async fn get_task_output(
    State(state): St,
    claims: RunClaims,
    Path((id, path)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let path = output_path(&path)?;
    let (id, _record) = super::tasks::live_task(&state, &claims, &id).await?;
    let owner = claims.owner_key();
    let bytes = state
        .store
        .get(&owner, &task_path(&owner, &id, &TaskFile::Output(path)))
        .await?
        .ok_or_else(|| ApiError::not_found("no such artifact"))?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response())
}

/// Any other path.
pub async fn not_found() -> ApiError {
    ApiError::not_found("no such internal API route")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::StreamExt;
    use tower_http::timeout::DeadlineBody;

    use super::*;

    #[tokio::test]
    async fn a_body_is_refused_by_why_it_cannot_be_read() {
        let headers = HeaderMap::new();
        let pieces = |pieces: Vec<Result<Bytes, std::io::Error>>| Body::from_stream(futures::stream::iter(pieces));
        let ok = pieces(vec![Ok(Bytes::from_static(b"ab")), Ok(Bytes::from_static(b"cd"))]);
        assert_eq!(read_body(&headers, ok, 4, "the log").await.unwrap(), Bytes::from_static(b"abcd"));
        let long = pieces(vec![Ok(Bytes::from_static(b"ab")), Ok(Bytes::from_static(b"cde"))]);
        assert_eq!(read_body(&headers, long, 4, "the log").await.unwrap_err().status, StatusCode::PAYLOAD_TOO_LARGE);
        let broken = pieces(vec![Ok(Bytes::from_static(b"ab")), Err(std::io::Error::other("connection reset"))]);
        assert_eq!(read_body(&headers, broken, 4, "the log").await.unwrap_err().status, StatusCode::BAD_REQUEST);
        // A body that never ends, behind the deadline the server puts on every request body.
        let stalled = futures::stream::iter([Ok::<_, std::io::Error>(Bytes::from_static(b"a"))])
            .chain(futures::stream::pending());
        let stalled = Body::new(DeadlineBody::new(Duration::from_millis(20), Body::from_stream(stalled)));
        let e = read_body(&headers, stalled, 4, "the log").await.unwrap_err();
        assert_eq!((e.status, e.message.as_str()), (StatusCode::REQUEST_TIMEOUT, "the log was not received in time"));
    }
}

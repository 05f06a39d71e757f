//! Task results, events and files as MCP resources, and change notifications for them.
//!
//! ```text
//! toolyard://tasks/{task_id}/result        the result (or status while running), JSON
//! toolyard://tasks/{task_id}/events        every lifecycle event, JSON lines
//! toolyard://tasks/{task_id}/files/{+path} one file: outputs/…, actions/…, tool_calls.json, …
//! ```
//!
//! `resources/list` lists the result resource of each of the caller's tasks (newest first).
//! Reads are owner-scoped like the task tools: another user's task reads as not found. Files
//! larger than [`MAX_RESOURCE_BYTES`] are refused with a pointer to `read_artifact`.
//!
//! Subscriptions: on protocol 2026-07-28 a `subscriptions/listen` stream may subscribe to
//! these URIs and gets `notifications/resources/updated` when the task's events or result
//! change ([`Watcher`]). Older revisions subscribe with `resources/subscribe` in a session,
//! and get them on the session's GET stream ([`super::sessions`]).

use std::collections::HashMap;
use std::ops::ControlFlow;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use rmcp::ErrorData;
use rmcp::model::{
    ListResourceTemplatesResult, ListResourcesResult, ReadResourceResult, Resource, ResourceContents, ResourceTemplate,
};
use toolyard_api::OwnerKey;
use toolyard_api::storage::{self, RunId, TaskFile};

use super::cursor;
use crate::identity::Identity;
use crate::state::AppState;
use crate::tasks::view::{self, task_path};
use crate::tasks::{Position, Subset};

/// URI scheme and prefix of task resources.
pub const PREFIX: &str = "toolyard://tasks/";
/// The gateway's own URI scheme (task and call resources).
pub const SCHEME: &str = "toolyard://";
/// Largest file served as a resource (larger ones: `read_artifact` in chunks).
pub const MAX_RESOURCE_BYTES: u64 = 4 * 1024 * 1024;
/// Resources per `resources/list` page.
const PAGE: usize = 100;

/// What a task resource URI names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskResource {
    /// `…/result`.
    Result(RunId),
    /// `…/events`.
    Events(RunId),
    /// `…/files/{path}`.
    File(RunId, TaskFile, String),
}

impl TaskResource {
    /// Parses a task resource URI.
    pub fn parse(uri: &str) -> Option<Self> {
        let rest = uri.strip_prefix(PREFIX)?;
        let (id, what) = rest.split_once('/')?;
        let id = RunId::parse(id).ok()?;
        match what {
            "result" => Some(Self::Result(id)),
            "events" => Some(Self::Events(id)),
            _ => {
                let path = what.strip_prefix("files/")?;
                let file = storage::parse_task_file(path).ok()?;
                Some(Self::File(id, file, path.to_owned()))
            }
        }
    }

    /// The task it belongs to.
    pub fn task(&self) -> &RunId {
        match self {
            Self::Result(id) | Self::Events(id) | Self::File(id, ..) => id,
        }
    }
}

/// Prefix of call resources.
pub const CALLS_PREFIX: &str = "toolyard://calls/";

/// The URI of a file call `id` returned.
pub fn call_output_uri(id: &RunId, name: &str) -> String {
    format!("{CALLS_PREFIX}{id}/files/outputs/{name}")
}

/// The call and returned file a `toolyard://calls/{call_id}/files/outputs/{+name}` URI names.
pub fn parse_call_output(uri: &str) -> Option<(RunId, storage::RelativePath)> {
    let rest = uri.strip_prefix(CALLS_PREFIX)?;
    let (id, path) = rest.split_once("/files/outputs/")?;
    Some((RunId::parse(id).ok()?, storage::RelativePath::parse(path).ok()?))
}

/// The URI of a task's result.
pub fn result_uri(id: &RunId) -> String {
    format!("{PREFIX}{id}/result")
}

/// The three URI templates.
pub fn templates() -> ListResourceTemplatesResult {
    let t = |uri: &str, name: &str, description: &str, mime: &str| {
        ResourceTemplate::new(uri, name).with_description(description).with_mime_type(mime)
    };
    ListResourceTemplatesResult::with_all_items(vec![
        t(
            "toolyard://tasks/{task_id}/result",
            "task-result",
            "The result of one of your coding tasks (its status while it runs).",
            "application/json",
        ),
        t(
            "toolyard://tasks/{task_id}/events",
            "task-events",
            "The lifecycle events of one of your coding tasks, as JSON lines.",
            "application/x-ndjson",
        ),
        t(
            "toolyard://tasks/{task_id}/files/{+path}",
            "task-file",
            "One file of one of your coding tasks: outputs/<name>, actions/<step>.py, tool_calls.json, result.json.",
            "application/octet-stream",
        ),
        t(
            "toolyard://calls/{call_id}/files/outputs/{+name}",
            "call-file",
            "A file one of your tool calls returned (an image, a CSV...); the call id is in its result's _meta.",
            "application/octet-stream",
        ),
    ])
}

fn internal(e: &crate::Error) -> ErrorData {
    tracing::error!(error = %e, "resource request failed");
    super::errors::from_error(e, 1)
}

/// An unknown (or another user's) resource: -32002 with the URI in `data` (the MCP handler
/// turns the code into -32602 for 2026-07-28 clients, SEP-2164).
/// The error of a resource nobody has: -32002 with the URI in `data`.
pub fn not_found(uri: &str) -> ErrorData {
    let shown: String = uri.chars().take(200).collect();
    ErrorData::resource_not_found(format!("no such resource: {shown:?}"), Some(serde_json::json!({"uri": shown})))
}

/// A position as a cursor's text.
fn position_key((created_ms, id): &Position) -> String {
    format!("{created_ms}:{id}")
}

/// The position a cursor's text names.
fn parse_position(key: &str) -> Option<Position> {
    let (ms, id) = key.split_once(':')?;
    Some((ms.parse().ok()?, RunId::parse(id).ok()?.to_string()))
}

/// `resources/list`: the caller's task results, newest first.
pub async fn list(state: &AppState, who: &Identity, after: Option<&str>) -> Result<ListResourcesResult, ErrorData> {
    let Some(backend) = &state.tasks else { return Ok(ListResourcesResult::default()) };
    let after = match after {
        Some(c) => Some(
            cursor::decode_cursor(c).and_then(|key| parse_position(&key)).ok_or_else(super::errors::invalid_cursor)?,
        ),
        None => None,
    };
    let mut page = Vec::new();
    let mut more = false;
    let visit = &mut |record: crate::tasks::TaskRecord| {
        if page.len() == PAGE {
            more = true;
            return ControlFlow::Break(());
        }
        page.push(record);
        ControlFlow::Continue(())
    };
    backend.walk(&who.owner_key(), Subset::All, after.as_ref(), visit).await.map_err(|e| internal(&e))?;
    let next = if more { page.last().map(|r| cursor::encode_cursor(&position_key(&r.position()))) } else { None };
    let mut result = ListResourcesResult::with_all_items(
        page.iter()
            .map(|r| {
                let prompt: String = r.prompt.chars().take(120).collect();
                Resource::new(result_uri(&r.id), format!("{} result", r.id))
                    .with_description(prompt)
                    .with_mime_type("application/json")
            })
            .collect(),
    );
    result.next_cursor = next;
    Ok(result)
}

/// `resources/read`.
pub async fn read(state: &AppState, who: &Identity, uri: &str) -> Result<ReadResourceResult, ErrorData> {
    if let Some((id, name)) = parse_call_output(uri) {
        return read_call_output(state, &who.owner_key(), uri, &id, &name).await;
    }
    let Some(backend) = &state.tasks else { return Err(not_found(uri)) };
    let Some(resource) = TaskResource::parse(uri) else { return Err(not_found(uri)) };
    let owner = who.owner_key();
    let id = resource.task();
    let store = state.store.as_ref();
    let record = backend.get(&owner, id).await.map_err(|e| internal(&e))?;
    let text = |text: String, mime: &str| ResourceContents::text(text, uri).with_mime_type(mime);
    let contents = match &resource {
        TaskResource::Result(id) => {
            let Some(v) = view::view(store, &owner, id, record.as_ref()).await.map_err(|e| internal(&e))? else {
                return Err(not_found(uri));
            };
            text(serde_json::to_string_pretty(&v.to_json()).unwrap_or_default(), "application/json")
        }
        TaskResource::Events(id) => {
            // Segment by segment: the answer is the only whole copy of the log held.
            let segments = view::event_segments(store, &owner, id, 0).await.map_err(|e| internal(&e))?;
            if segments.is_empty() && record.is_none() {
                return Err(not_found(uri));
            }
            let mut lines = String::new();
            for n in segments {
                for event in view::segment_events(store, &owner, id, n).await.map_err(|e| internal(&e))? {
                    if let Ok(line) = serde_json::to_string(&event) {
                        lines.push_str(&line);
                        lines.push('\n');
                    }
                }
            }
            text(lines, "application/x-ndjson")
        }
        TaskResource::File(id, file, path) => {
            let chunk = small_file(store, &owner, &task_path(&owner, id, file), uri, path).await?;
            let mime = mime_of(path);
            match String::from_utf8(chunk.bytes.to_vec()) {
                Ok(s) => text(s, mime),
                Err(_) => ResourceContents::blob(B64.encode(&chunk.bytes), uri).with_mime_type(mime),
            }
        }
    };
    Ok(ReadResourceResult::new(vec![contents]))
}

/// A stored file of `owner` small enough for a resource (`shown` names it in the error).
async fn small_file(
    store: &dyn crate::store::ArtifactStore,
    owner: &OwnerKey,
    path: &str,
    uri: &str,
    shown: &str,
) -> Result<crate::store::Chunk, ErrorData> {
    let chunk = store
        .get_range(owner, path, 0, MAX_RESOURCE_BYTES + 1)
        .await
        .map_err(|e| internal(&e))?
        .ok_or_else(|| not_found(uri))?;
    if chunk.total > MAX_RESOURCE_BYTES {
        return Err(ErrorData::invalid_params(
            format!(
                "{shown} has {} bytes, more than a resource carries ({MAX_RESOURCE_BYTES}); read it with \
                 read_artifact in chunks",
                chunk.total
            ),
            None,
        ));
    }
    Ok(chunk)
}

/// A file call `id` of `owner` returned, with the media type its result gave it.
async fn read_call_output(
    state: &AppState,
    owner: &OwnerKey,
    uri: &str,
    id: &RunId,
    name: &storage::RelativePath,
) -> Result<ReadResourceResult, ErrorData> {
    let store = state.store.as_ref();
    let chunk = small_file(store, owner, &format!("calls/{id}/outputs/{name}"), uri, name.as_str()).await?;
    let listed = store.get(owner, &format!("calls/{id}/result.json")).await.map_err(|e| internal(&e))?;
    let mime = listed
        .and_then(|bytes| serde_json::from_slice::<toolyard_api::protocol::CallResult>(&bytes).ok())
        .and_then(|r| r.files.into_iter().find(|f| f.name == name.as_str()).map(|f| f.mime_type))
        .unwrap_or_else(|| mime_of(name.as_str()).to_owned());
    let contents = if mime.starts_with("text/") || mime == "application/json" {
        match String::from_utf8(chunk.bytes.to_vec()) {
            Ok(s) => ResourceContents::text(s, uri).with_mime_type(mime),
            Err(_) => ResourceContents::blob(B64.encode(&chunk.bytes), uri).with_mime_type(mime),
        }
    } else {
        ResourceContents::blob(B64.encode(&chunk.bytes), uri).with_mime_type(mime)
    };
    Ok(ReadResourceResult::new(vec![contents]))
}

/// A MIME type from a file name.
pub fn mime_of(path: &str) -> &'static str {
    match path.rsplit('.').next().unwrap_or_default().to_ascii_lowercase().as_str() {
        "csv" => "text/csv",
        "json" => "application/json",
        "jsonl" => "application/x-ndjson",
        "py" => "text/x-python",
        "md" => "text/markdown",
        "txt" | "log" => "text/plain",
        "html" => "text/html",
        "png" => "image/png",
        "svg" => "image/svg+xml",
        _ => "application/octet-stream",
    }
}

/// Watches the task resources one subscription asked for: returns the URIs whose task
/// changed (new events, a result) since the last call. URIs of tasks the caller does not own
/// never change.
#[derive(Debug, Default)]
pub struct Watcher {
    seen: HashMap<String, (usize, Option<u64>)>,
}

impl Watcher {
    /// The subscribed URIs (of `owner`) whose task changed since the previous call. The
    /// first call records the current state and reports nothing.
    pub async fn changed(&mut self, state: &AppState, owner: &OwnerKey, uris: &[String]) -> Vec<String> {
        let mut tasks: HashMap<RunId, (usize, Option<u64>)> = HashMap::new();
        let mut out = Vec::new();
        for uri in uris {
            let Some(resource) = TaskResource::parse(uri) else { continue };
            let id = resource.task().clone();
            let fingerprint = match tasks.get(&id) {
                Some(f) => *f,
                None => {
                    let f = fingerprint(state, owner, &id).await;
                    tasks.insert(id, f);
                    f
                }
            };
            let previous = self.seen.insert(uri.clone(), fingerprint);
            if previous.is_some_and(|p| p != fingerprint) {
                out.push(uri.clone());
            }
        }
        out
    }
}

/// (number of event segments, size of result.json) of a task of `owner`.
async fn fingerprint(state: &AppState, owner: &OwnerKey, id: &RunId) -> (usize, Option<u64>) {
    let folder = format!("{}events/", view::task_folder(owner, id));
    let segments = state.store.list(owner, &folder).await.map(|l| l.len()).unwrap_or(0);
    let result = state
        .store
        .get_range(owner, &task_path(owner, id, &TaskFile::Result), 0, 0)
        .await
        .ok()
        .flatten()
        .map(|c| c.total);
    (segments, result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_parse_and_refuse_traversal() {
        let id = RunId::parse("task-1").unwrap();
        assert_eq!(TaskResource::parse("toolyard://tasks/task-1/result"), Some(TaskResource::Result(id.clone())));
        assert_eq!(TaskResource::parse("toolyard://tasks/task-1/events"), Some(TaskResource::Events(id.clone())));
        let file = TaskResource::parse("toolyard://tasks/task-1/files/outputs/scenarios.csv").unwrap();
        assert!(matches!(file, TaskResource::File(_, TaskFile::Output(_), ref p) if p == "outputs/scenarios.csv"));
        assert!(matches!(
            TaskResource::parse("toolyard://tasks/task-1/files/actions/0001.py"),
            Some(TaskResource::File(_, TaskFile::Action(1), _))
        ));
        for bad in [
            "toolyard://tasks/task-1/files/../../x",
            "toolyard://tasks/TASK/result",
            "toolyard://tasks/task-1/other",
            "file:///etc/passwd",
            "toolyard://tasks/task-1",
        ] {
            assert_eq!(TaskResource::parse(bad), None, "{bad}");
        }
        assert_eq!(result_uri(&id), "toolyard://tasks/task-1/result");
        assert_eq!(mime_of("outputs/a.CSV"), "text/csv");
    }
}

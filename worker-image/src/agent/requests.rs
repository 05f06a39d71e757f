//! What the harness asks of the runner during a step — tool calls (through the gateway, as
//! the task's owner), artifact writes and reads — and the counters and records of the run.

use std::time::Instant;

use async_trait::async_trait;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde::Serialize;
use serde_json::{Value, json};
use toolyard_api::agent::{ReturnedFile, TaskSpec, event};
use toolyard_api::storage::RelativePath;
use tracing::Instrument;

use super::Events;
use super::harness::{Requests, ToolReply};
use crate::api::InternalApi;

/// One tool call of the task, as saved in `tool_calls.json`.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct ToolCallRecord {
    step: u32,
    tool: String,
    /// The call's id (its ToolCall, or its folder under `calls/`), when the gateway ran it.
    #[serde(skip_serializing_if = "Option::is_none")]
    call_id: Option<String>,
    arguments: Value,
    is_error: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    /// The files the tool returned, and the artifacts they are saved as.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    files: Vec<ReturnedFile>,
    duration_ms: u64,
}

/// Counters and records of a run.
#[derive(Default)]
pub(crate) struct Tally {
    pub(crate) steps: u32,
    pub(crate) model_calls: u32,
    pub(crate) tool_calls: u32,
    pub(crate) successful_tool_calls: u32,
    pub(crate) records: Vec<ToolCallRecord>,
    pub(crate) tool_budget_exhausted: bool,
}

/// Serves the harness's requests during one step.
pub(crate) struct StepRequests<'a> {
    pub(crate) api: &'a InternalApi,
    pub(crate) events: &'a Events<'a>,
    pub(crate) spec: &'a TaskSpec,
    pub(crate) tally: &'a mut Tally,
    pub(crate) step: u32,
}

#[async_trait]
impl Requests for StepRequests<'_> {
    async fn call_tool(&mut self, name: &str, arguments: Value) -> Result<ToolReply, String> {
        let budget = u32::try_from(self.spec.budgets.max_tool_calls).unwrap_or(0);
        if self.tally.tool_calls >= budget {
            self.tally.tool_budget_exhausted = true;
            return Err(format!("the tool call budget of {budget} is exhausted"));
        }
        let Value::Object(arguments) = arguments else { return Err("tool arguments must be a dict".into()) };
        self.tally.tool_calls += 1;
        let started = Instant::now();
        self.events.emit(event::TOOL_CALL_STARTED, json!({"tool": name, "step": self.step})).await;
        // The gateway's spans of the call are children of this one (the request carries it).
        let span = tracing::info_span!(
            "tool.call",
            "otel.kind" = "client",
            "gen_ai.operation.name" = "execute_tool",
            "gen_ai.tool.name" = name,
            "toolyard.step" = self.step,
            "otel.status_code" = tracing::field::Empty,
        );
        let outcome = self.api.task_tool_call(&self.spec.id, name, &arguments).instrument(span.clone()).await;
        if !matches!(&outcome, Ok(o) if !o.is_error) {
            span.record("otel.status_code", "ERROR");
        }
        let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let (call_id, result, error, files) = match outcome {
            Ok(o) if !o.is_error => {
                (o.call_id, Some(o.structured_content.unwrap_or(Value::String(o.text))), None, o.files)
            }
            Ok(o) => (o.call_id, None, Some(o.text), o.files),
            Err(e) => (None, None, Some(e.to_string()), Vec::new()),
        };
        let is_error = error.is_some();
        if !is_error {
            self.tally.successful_tool_calls += 1;
        }
        self.events
            .emit(
                event::TOOL_CALL_FINISHED,
                json!({"tool": name, "step": self.step, "call_id": call_id, "is_error": is_error,
                    "duration_ms": duration_ms}),
            )
            .await;
        self.tally.records.push(ToolCallRecord {
            step: self.step,
            tool: name.to_owned(),
            call_id,
            arguments: Value::Object(arguments),
            is_error,
            result: result.clone(),
            error: error.clone(),
            files: files.clone(),
            duration_ms,
        });
        match error {
            Some(e) => Err(e),
            None => Ok(ToolReply { value: result.unwrap_or(Value::Null), notes: file_notes(name, &files) }),
        }
    }

    async fn write_artifact(&mut self, filename: &str, content_base64: &str) -> Result<(), String> {
        let name = RelativePath::parse(filename).map_err(|e| e.to_string())?;
        let bytes = B64.decode(content_base64).map_err(|e| format!("invalid base64: {e}"))?;
        if bytes.len() as u64 > self.spec.max_artifact_bytes {
            return Err(format!("{filename} has {} bytes; the limit is {}", bytes.len(), self.spec.max_artifact_bytes));
        }
        let size = bytes.len();
        self.api.put_task_output(&self.spec.id, name.as_str(), bytes).await.map_err(|e| e.to_string())?;
        self.events
            .emit(event::ARTIFACT_WRITTEN, json!({"name": name.as_str(), "size": size, "step": self.step}))
            .await;
        Ok(())
    }

    async fn tool_search(&mut self, query: &str) -> Result<Value, String> {
        let found = self.api.task_tool_search(&self.spec.id, query, 10).await.map_err(|e| e.to_string())?;
        Ok(Value::Array(found.into_iter().map(|t| json!({"name": t.name, "description": t.description})).collect()))
    }

    async fn read_artifact(&mut self, filename: &str) -> Result<String, String> {
        let name = RelativePath::parse(filename).map_err(|e| e.to_string())?;
        let bytes = self.api.get_task_output(&self.spec.id, name.as_str()).await.map_err(|e| e.to_string())?;
        Ok(B64.encode(bytes))
    }
}

/// What the step's output says of the files a tool returned: each one's name, type and size,
/// and the artifact the code reads it as (`read_written_artifact`), or why it was not saved.
fn file_notes(tool: &str, files: &[ReturnedFile]) -> Vec<String> {
    files
        .iter()
        .map(|f| {
            let what = format!("[{tool} returned {} ({}, {} bytes)", f.name, f.mime_type, f.size);
            match (&f.artifact, &f.not_saved) {
                (Some(artifact), _) => format!("{what}, saved as the artifact {artifact:?}]"),
                (None, why) => format!("{what}, not saved: {}]", why.as_deref().unwrap_or("unknown reason")),
            }
        })
        .collect()
}

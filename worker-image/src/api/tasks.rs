//! The coding-task routes of the internal API, as the agent of one task uses them.

use bytes::Bytes;
use reqwest::Method;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use toolyard_api::agent::{
    ArtifactEntry, TaskResult, TaskSpec, ToolCallBody, ToolInfo, ToolOutcome, ToolSearchBody, path,
};
use toolyard_api::protocol::{self, Event};

use super::{ApiError, InternalApi};

impl InternalApi {
    async fn json<T: DeserializeOwned>(&self, method: Method, p: &str, body: Option<Bytes>) -> Result<T, ApiError> {
        let bytes = self.send(method, p, body, "application/json").await?;
        serde_json::from_slice(&bytes).map_err(|e| ApiError::BadAnswer(p.to_owned(), e.to_string()))
    }

    fn encode<T: Serialize>(p: &str, value: &T) -> Result<Bytes, ApiError> {
        serde_json::to_vec(value).map(Bytes::from).map_err(|e| ApiError::BadAnswer(p.to_owned(), e.to_string()))
    }

    /// The task's prompt, tools and budgets.
    pub async fn task_spec(&self, id: &str) -> Result<TaskSpec, ApiError> {
        self.json(Method::GET, &path::spec(id), None).await
    }

    /// Calls a tool as the task's owner.
    pub async fn task_tool_call(
        &self,
        id: &str,
        tool: &str,
        arguments: &Map<String, Value>,
    ) -> Result<ToolOutcome, ApiError> {
        let p = path::tool_call(id, tool);
        let body = Self::encode(&p, &ToolCallBody { arguments: arguments.clone() })?;
        self.json(Method::POST, &p, Some(body)).await
    }

    /// The task's tools matching `query`, best first (at most `limit`).
    pub async fn task_tool_search(&self, id: &str, query: &str, limit: u32) -> Result<Vec<ToolInfo>, ApiError> {
        let p = path::tool_search(id);
        let body = Self::encode(&p, &ToolSearchBody { query: query.to_owned(), limit: Some(limit) })?;
        self.json(Method::POST, &p, Some(body)).await
    }

    /// Saves an artifact under `outputs/`.
    pub async fn put_task_output(&self, id: &str, name: &str, bytes: Vec<u8>) -> Result<(), ApiError> {
        self.send(
            Method::PUT,
            &protocol::path::task_output(id, name),
            Some(Bytes::from(bytes)),
            "application/octet-stream",
        )
        .await
        .map(drop)
    }

    /// Reads an artifact from `outputs/`.
    pub async fn get_task_output(&self, id: &str, name: &str) -> Result<Bytes, ApiError> {
        self.send(Method::GET, &protocol::path::task_output(id, name), None, "application/octet-stream").await
    }

    /// Lists the artifacts under `outputs/`.
    pub async fn list_task_outputs(&self, id: &str) -> Result<Vec<ArtifactEntry>, ApiError> {
        self.json(Method::GET, &path::outputs(id), None).await
    }

    /// Saves the code of one step.
    pub async fn put_task_action(&self, id: &str, step: u32, code: String) -> Result<(), ApiError> {
        self.send(Method::PUT, &path::action(id, step), Some(Bytes::from(code)), "text/x-python; charset=utf-8")
            .await
            .map(drop)
    }

    /// Saves every tool call with its outcome.
    pub async fn put_task_tool_calls(&self, id: &str, records: &Value) -> Result<(), ApiError> {
        let p = path::tool_calls(id);
        let body = Self::encode(&p, records)?;
        self.send(Method::PUT, &p, Some(body), "application/json").await.map(drop)
    }

    /// Uploads the task's result.
    pub async fn put_task_result(&self, id: &str, result: &TaskResult) -> Result<(), ApiError> {
        let p = path::result(id);
        let body = Self::encode(&p, result)?;
        self.send(Method::PUT, &p, Some(body), "application/json").await.map(drop)
    }

    /// Appends lifecycle events (`kind` is `calls` or `tasks`).
    pub async fn post_events(&self, kind: &str, id: &str, events: &[Event]) -> Result<(), ApiError> {
        let p = protocol::path::events(kind, id);
        let mut lines = Vec::new();
        for event in events {
            serde_json::to_writer(&mut lines, event).map_err(|e| ApiError::BadAnswer(p.clone(), e.to_string()))?;
            lines.push(b'\n');
        }
        self.send(Method::POST, &p, Some(Bytes::from(lines)), "application/x-ndjson").await.map(drop)
    }
}

//! The coding-agent protocol: the task spec the agent fetches from the gateway, tool
//! outcomes, the stored task result, event names, and the result contract the agent's
//! final answer must meet before a task may finish.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::codingtask::{Budgets, TaskType};

/// Paths of the task routes of the internal API (events and `outputs/<name>` are in
/// [`crate::protocol::path`]).
pub mod path {
    use crate::protocol::path::PREFIX;

    /// `GET`: the [`super::TaskSpec`].
    pub fn spec(id: &str) -> String {
        format!("{PREFIX}/tasks/{id}/spec")
    }
    /// `POST` a [`super::ToolCallBody`]: call a tool as the task's owner → [`super::ToolOutcome`].
    pub fn tool_call(id: &str, tool: &str) -> String {
        format!("{PREFIX}/tasks/{id}/tools/{tool}/call")
    }
    /// `POST` a [`super::ToolSearchBody`]: the task's tools matching it, best first →
    /// `Vec<`[`super::ToolInfo`]`>`.
    pub fn tool_search(id: &str) -> String {
        format!("{PREFIX}/tasks/{id}/tools/search")
    }
    /// `GET`: the artifacts under `outputs/` → `Vec<`[`super::ArtifactEntry`]`>`.
    pub fn outputs(id: &str) -> String {
        format!("{PREFIX}/tasks/{id}/outputs")
    }
    /// `PUT`: the code of one step (`actions/<step>.py`).
    pub fn action(id: &str, step: u32) -> String {
        format!("{PREFIX}/tasks/{id}/actions/{step}")
    }
    /// `PUT`: every tool call with its outcome (`tool_calls.json`).
    pub fn tool_calls(id: &str) -> String {
        format!("{PREFIX}/tasks/{id}/tool_calls")
    }
    /// `PUT`: the final [`super::TaskResult`] (`result.json`).
    pub fn result(id: &str) -> String {
        format!("{PREFIX}/tasks/{id}/result")
    }
    /// Base URL of the task's model: an OpenAI-compatible API (`POST .../chat/completions`)
    /// served by the gateway with the task token as the API key; the gateway forwards each
    /// request to the task's model profile with the profile's key.
    pub fn model_base(id: &str) -> String {
        format!("{PREFIX}/tasks/{id}/model")
    }
    /// `POST`: one chat completion through the gateway (see [`model_base`]).
    pub fn model_chat(id: &str) -> String {
        format!("{}/chat/completions", model_base(id))
    }
}

/// Environment of `toolyard-runner agent`, besides the runner protocol's
/// ([`crate::protocol::env`]). There is no model setting among them: the agent reaches the
/// model through the gateway ([`path::model_base`]) with its task token.
pub mod env {
    /// The Python interpreter of the agent's harness.
    pub const AGENT_PYTHON: &str = "TOOLYARD_AGENT_PYTHON";
    /// `PYTHONPATH` of the harness (where the `toolyard` package is).
    pub const AGENT_PYTHONPATH: &str = "TOOLYARD_AGENT_PYTHONPATH";
}

/// Event types of a task's `events/` log, in lifecycle order.
pub mod event {
    /// The task object was created.
    pub const TASK_CREATED: &str = "task_created";
    /// The agent process started.
    pub const AGENT_STARTED: &str = "agent_started";
    /// A model request was sent.
    pub const MODEL_CALL_STARTED: &str = "model_call_started";
    /// A model request finished (or failed).
    pub const MODEL_CALL_FINISHED: &str = "model_call_finished";
    /// A tool call was sent.
    pub const TOOL_CALL_STARTED: &str = "tool_call_started";
    /// A tool call finished.
    pub const TOOL_CALL_FINISHED: &str = "tool_call_finished";
    /// An artifact was saved.
    pub const ARTIFACT_WRITTEN: &str = "artifact_written";
    /// A code step finished.
    pub const STEP_FINISHED: &str = "step_finished";
    /// The agent finished (with the task status).
    pub const AGENT_FINISHED: &str = "agent_finished";
}

/// What the agent needs to know about one tool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolInfo {
    /// MCP name (a Python identifier).
    pub name: String,
    /// Description for the model.
    pub description: String,
    /// JSON Schema of the arguments.
    pub input_schema: Value,
    /// JSON Schema of the structured result, if declared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
}

/// Everything the agent fetches at start (`GET` [`path::spec`]). Model settings are not in
/// here: they come from the agent's environment (the API key from a Secret).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskSpec {
    /// Task id.
    pub id: String,
    /// What the user asked for.
    pub prompt: String,
    /// Tools the task may use, already limited to what its owner may call.
    pub tools: Vec<ToolInfo>,
    /// Limits.
    pub budgets: Budgets,
    /// Deadline of the whole task, Unix milliseconds.
    pub deadline_unix_ms: i64,
    /// Largest artifact accepted, in bytes.
    pub max_artifact_bytes: u64,
    /// Model id of the task's profile (what the gateway asks the endpoint for; it names the
    /// model in the agent's requests, which the gateway overrides).
    pub model: String,
}

/// Body of a tool call made by the agent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCallBody {
    /// Arguments (validated by the gateway against the tool's input schema).
    pub arguments: Map<String, Value>,
}

/// A tool search of the agent (`POST` [`path::tool_search`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolSearchBody {
    /// Words to look for in the tools' names, titles and descriptions.
    pub query: String,
    /// Most tools returned (default 10, at most 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// Outcome of a tool call made by the agent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolOutcome {
    /// The tool failed (or the arguments were invalid, or the tool is unknown to this owner).
    pub is_error: bool,
    /// The tool's structured result (success) — what the Python stub returns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured_content: Option<Value>,
    /// Text: the error message on failure.
    #[serde(default)]
    pub text: String,
    /// Id of the call that ran (its ToolCall name, or its `calls/<id>` folder), when one ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    /// The files the tool returned (images, CSVs…), each saved as an artifact of the task.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<ReturnedFile>,
}

/// A file a tool returned to a coding task's call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReturnedFile {
    /// Its name as the function gave it.
    pub name: String,
    /// Its media type.
    pub mime_type: String,
    /// Size in bytes.
    pub size: u64,
    /// The task artifact it is saved as (`<call id>/<name>`), or `None` when it was not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact: Option<String>,
    /// Why it was not saved (the task's artifact limits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_saved: Option<String>,
}

/// An artifact as listed from storage.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ArtifactEntry {
    /// File name relative to `outputs/`.
    pub name: String,
    /// Path relative to the task folder (`outputs/<name>`), as `read_artifact` takes it.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
}

/// Final status of a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    /// Finished with a final answer that meets the contract.
    Success,
    /// Failed: budget exhausted, model errors, contract never met, crash.
    Failed,
    /// Deadline passed.
    TimedOut,
    /// Cancelled by its owner.
    Cancelled,
}

/// The stored result of a task (`result.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskResult {
    /// Final status.
    pub status: TaskStatus,
    /// Kind of answer.
    pub task_type: TaskType,
    /// One-paragraph summary (for failures: what went wrong).
    pub summary: String,
    /// Numbers the task produced.
    #[serde(default)]
    pub metrics: Map<String, Value>,
    /// Assumptions the agent made.
    #[serde(default)]
    pub assumptions: Vec<String>,
    /// Artifacts, listed from storage (never from the model's claim).
    #[serde(default)]
    pub artifacts: Vec<ArtifactEntry>,
    /// Code steps taken.
    pub steps: u32,
    /// Model calls made.
    pub model_calls: u32,
    /// Tool calls made.
    pub tool_calls: u32,
    /// The failure reason, when `status` is not success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl TaskResult {
    /// A failed result with `reason` as summary and error.
    pub fn failed(status: TaskStatus, reason: impl Into<String>) -> Self {
        let reason = reason.into();
        Self {
            status,
            task_type: TaskType::Failed,
            summary: reason.clone(),
            metrics: Map::new(),
            assumptions: Vec::new(),
            artifacts: Vec::new(),
            steps: 0,
            model_calls: 0,
            tool_calls: 0,
            error: Some(reason),
        }
    }
}

/// A final answer that meets the contract.
#[derive(Clone, Debug, PartialEq)]
pub struct FinalAnswer {
    /// Kind of answer.
    pub task_type: TaskType,
    /// Summary.
    pub summary: String,
    /// Metrics.
    pub metrics: Map<String, Value>,
    /// Assumptions.
    pub assumptions: Vec<String>,
}

/// Longest accepted summary, in characters.
pub const MAX_SUMMARY_CHARS: usize = 4096;

const KEYS: [&str; 4] = ["task_type", "summary", "metrics", "assumptions"];

/// Checks a `final_answer(...)` value against the result contract. The errors are written
/// for the model (they go back to it as an observation): each says what must hold.
pub fn check_final_answer(answer: &Value, successful_tool_calls: u32) -> Result<FinalAnswer, Vec<String>> {
    let Some(obj) = answer.as_object() else {
        return Err(vec![format!("final_answer needs a dict with keys {KEYS:?}; got {}", type_name(answer))]);
    };
    let mut errors = Vec::new();
    let unknown: Vec<&String> = obj.keys().filter(|k| !KEYS.contains(&k.as_str())).collect();
    if !unknown.is_empty() {
        errors.push(format!("unknown keys {unknown:?}; allowed keys are {KEYS:?} (put extra numbers in metrics)"));
    }
    let task_type = match obj.get("task_type") {
        Some(v) => match serde_json::from_value::<TaskType>(v.clone()) {
            Ok(t) => Some(t),
            Err(_) => {
                errors.push(format!(
                    "task_type must be one of 'analysis', 'answer', 'needs_input', 'unsupported', 'failed'; got {v}"
                ));
                None
            }
        },
        None => {
            errors.push("task_type is required".to_owned());
            None
        }
    };
    let summary = match obj.get("summary") {
        Some(Value::String(s)) if !s.trim().is_empty() && s.chars().count() <= MAX_SUMMARY_CHARS => Some(s.clone()),
        Some(Value::String(s)) if !s.trim().is_empty() => {
            errors.push(format!("summary has {} characters; at most {MAX_SUMMARY_CHARS}", s.chars().count()));
            None
        }
        Some(other) => {
            errors.push(format!("summary must be a non-empty string; got {}", type_name(other)));
            None
        }
        None => {
            errors.push("summary is required".to_owned());
            None
        }
    };
    let metrics = match obj.get("metrics") {
        Some(Value::Object(m)) => m.clone(),
        None => Map::new(),
        Some(other) => {
            errors.push(format!("metrics must be a dict; got {}", type_name(other)));
            Map::new()
        }
    };
    let assumptions = match obj.get("assumptions") {
        None => Vec::new(),
        Some(Value::Array(items)) if items.iter().all(Value::is_string) => {
            items.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect()
        }
        Some(other) => {
            errors.push(format!("assumptions must be a list of strings; got {other}"));
            Vec::new()
        }
    };
    if task_type == Some(TaskType::Analysis) && successful_tool_calls == 0 {
        errors.push(
            "task_type 'analysis' needs at least one successful tool call; compute with the tools first, \
             or use 'answer' for a direct answer"
                .to_owned(),
        );
    }
    match (task_type, summary, errors.is_empty()) {
        (Some(task_type), Some(summary), true) => Ok(FinalAnswer { task_type, summary, metrics, assumptions }),
        _ => Err(errors),
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "None",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "str",
        Value::Array(_) => "list",
        Value::Object(_) => "dict",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_complete_answer_meets_the_contract() {
        let answer = json!({"task_type": "analysis", "summary": "Call prices rise with spot.",
            "metrics": {"price_100": 5.6}, "assumptions": ["no dividends"]});
        let ok = check_final_answer(&answer, 3).unwrap();
        assert_eq!(ok.task_type, TaskType::Analysis);
        assert_eq!(ok.metrics["price_100"], json!(5.6));
        assert_eq!(ok.assumptions, vec!["no dividends".to_owned()]);
    }

    #[test]
    fn analysis_needs_a_successful_tool_call() {
        let answer = json!({"task_type": "analysis", "summary": "guessed"});
        let errors = check_final_answer(&answer, 0).unwrap_err();
        assert!(errors[0].contains("at least one successful tool call"), "{errors:?}");
        assert!(check_final_answer(&json!({"task_type": "answer", "summary": "s"}), 0).is_ok());
    }

    #[test]
    fn every_problem_is_named() {
        let answer = json!({"task_type": "essay", "summary": "", "metrics": [1], "assumptions": "none", "extra": 1});
        let errors = check_final_answer(&answer, 1).unwrap_err();
        let all = errors.join("\n");
        for needle in [
            "unknown keys [\"extra\"]",
            "task_type must be one of",
            "summary must be a non-empty string",
            "metrics must be a dict",
            "assumptions must be a list of strings",
        ] {
            assert!(all.contains(needle), "{needle} missing from {all}");
        }
        assert!(check_final_answer(&json!("done"), 1).unwrap_err()[0].contains("needs a dict"));
        assert!(check_final_answer(&json!({}), 1).unwrap_err().len() == 2);
    }

    #[test]
    fn result_json_shape() {
        let r = TaskResult::failed(TaskStatus::TimedOut, "deadline of 60s passed");
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["status"], "timed_out");
        assert_eq!(v["task_type"], "failed");
        assert_eq!(v["error"], "deadline of 60s passed");
    }
}

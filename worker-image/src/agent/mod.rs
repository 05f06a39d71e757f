//! `toolyard-runner agent`: the code agent of one coding task.
//!
//! The loop: the model is told the task, the tools and the rules ([`prompt`]); it answers
//! with Python code, which runs in a persistent interpreter ([`harness`]) whose tool stubs
//! call back through this runner to the gateway, as the task's owner; the printed output or
//! the traceback goes back to the model as an observation; until `final_answer(...)` meets
//! the result contract or a budget runs out. Every step's code, every tool call with its
//! outcome, lifecycle events and the result are saved through the internal API.

pub mod harness;
pub mod model;
pub mod prompt;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde::Serialize;
use serde_json::{Map, Value, json};
use toolyard_api::agent::{self as contract, TaskResult, TaskSpec, TaskStatus, event};
use toolyard_api::codingtask::TaskType;
use toolyard_api::protocol::runner_exit;

use crate::api::InternalApi;
use harness::{Harness, PythonSettings, Requests, StepOutcome};
use model::{Message, Model, ModelError, ModelSettings};

/// Settings of one agent run (from the environment and flags).
#[derive(Clone, Debug)]
pub struct AgentSettings {
    /// The task id.
    pub task_id: String,
    /// The model.
    pub model: ModelSettings,
    /// The interpreter.
    pub python: PathBuf,
    /// `PYTHONPATH` for the interpreter (the `toolyard` package).
    pub pythonpath: Option<String>,
}

/// One tool call of the task, as saved in `tool_calls.json`.
#[derive(Clone, Debug, Serialize)]
struct ToolCallRecord {
    step: u32,
    tool: String,
    arguments: Value,
    is_error: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    duration_ms: u64,
}

/// Counters and records of a run.
#[derive(Default)]
struct Tally {
    steps: u32,
    model_calls: u32,
    tool_calls: u32,
    successful_tool_calls: u32,
    records: Vec<ToolCallRecord>,
    tool_budget_exhausted: bool,
}

/// Serves the harness's requests during one step.
struct StepRequests<'a> {
    api: &'a InternalApi,
    spec: &'a TaskSpec,
    tally: &'a mut Tally,
    step: u32,
}

#[async_trait]
impl Requests for StepRequests<'_> {
    async fn call_tool(&mut self, name: &str, arguments: Value) -> Result<Value, String> {
        if self.tally.tool_calls >= self.spec.budgets.max_tool_calls as u32 {
            self.tally.tool_budget_exhausted = true;
            return Err(format!("tool call budget of {} is exhausted", self.spec.budgets.max_tool_calls));
        }
        let Value::Object(arguments) = arguments else { return Err("tool arguments must be a dict".into()) };
        self.tally.tool_calls += 1;
        let started = Instant::now();
        let _ = self.api.post_events("tasks", &self.spec.id, &[ev(event::TOOL_CALL_STARTED, json!({"tool": name, "step": self.step}))]).await;
        let outcome = self.api.task_tool_call(&self.spec.id, name, &arguments).await;
        let duration_ms = started.elapsed().as_millis() as u64;
        let (result, error) = match outcome {
            Ok(o) if !o.is_error => (Some(o.structured_content.unwrap_or_else(|| Value::String(o.text))), None),
            Ok(o) => (None, Some(o.text)),
            Err(e) => (None, Some(e.to_string())),
        };
        let is_error = error.is_some();
        if !is_error {
            self.tally.successful_tool_calls += 1;
        }
        let _ = self
            .api
            .post_events("tasks", &self.spec.id, &[ev(event::TOOL_CALL_FINISHED, json!({"tool": name, "step": self.step, "is_error": is_error, "duration_ms": duration_ms}))])
            .await;
        self.tally.records.push(ToolCallRecord {
            step: self.step,
            tool: name.to_owned(),
            arguments: Value::Object(arguments),
            is_error,
            result: result.clone(),
            error: error.clone(),
            duration_ms,
        });
        match (result, error) {
            (_, Some(e)) => Err(e),
            (Some(r), None) => Ok(r),
            (None, None) => Ok(Value::Null),
        }
    }

    async fn write_artifact(&mut self, filename: &str, content_base64: &str) -> Result<(), String> {
        let bytes = B64.decode(content_base64).map_err(|e| format!("invalid base64: {e}"))?;
        let size = bytes.len();
        self.api.put_task_output(&self.spec.id, filename, bytes).await.map_err(|e| e.to_string())?;
        let _ = self.api.post_events("tasks", &self.spec.id, &[ev(event::ARTIFACT_WRITTEN, json!({"name": filename, "size": size, "step": self.step}))]).await;
        Ok(())
    }

    async fn read_artifact(&mut self, filename: &str) -> Result<String, String> {
        let bytes = self.api.get_task_output(&self.spec.id, filename).await.map_err(|e| e.to_string())?;
        Ok(B64.encode(bytes))
    }
}

fn ev(type_: &str, data: Value) -> toolyard_api::protocol::Event {
    toolyard_api::protocol::Event { time: jiff::Timestamp::now().to_string(), type_: type_.to_owned(), data }
}

/// Runs the task to its end and returns the runner exit code. The result is always
/// uploaded when the gateway is reachable.
pub async fn run(api: InternalApi, settings: AgentSettings) -> i32 {
    let spec = match api.task_spec(&settings.task_id).await {
        Ok(spec) => spec,
        Err(e) => {
            tracing::error!(error = %e, "cannot fetch the task");
            return runner_exit::RUNNER_ERROR;
        }
    };
    let mut tally = Tally::default();
    let result = drive(&api, &settings, &spec, &mut tally).await;
    finish(&api, &spec, tally, result).await
}

/// How the loop ended, before artifacts and counters are added.
struct Ending {
    status: TaskStatus,
    task_type: TaskType,
    summary: String,
    metrics: Map<String, Value>,
    assumptions: Vec<String>,
    error: Option<String>,
}

impl Ending {
    fn failed(status: TaskStatus, reason: impl Into<String>) -> Self {
        let reason = reason.into();
        Self {
            status,
            task_type: TaskType::Failed,
            summary: reason.clone(),
            metrics: Map::new(),
            assumptions: Vec::new(),
            error: Some(reason),
        }
    }
}

fn remaining(spec: &TaskSpec) -> Option<Duration> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis() as i64;
    let left = spec.deadline_unix_ms - now;
    (left > 0).then(|| Duration::from_millis(left as u64))
}

async fn drive(api: &InternalApi, settings: &AgentSettings, spec: &TaskSpec, tally: &mut Tally) -> Ending {
    let _ = api.post_events("tasks", &spec.id, &[ev(event::AGENT_STARTED, json!({"model": settings.model.model, "tools": spec.tools.len()}))]).await;
    let model = match Model::new(settings.model.clone(), Duration::from_secs(300)) {
        Ok(m) => m,
        Err(e) => return Ending::failed(TaskStatus::Failed, format!("cannot set up the model client: {e}")),
    };
    let scratch = std::env::temp_dir().join(format!("toolyard-agent-{}", spec.id));
    if let Err(e) = std::fs::create_dir_all(&scratch) {
        return Ending::failed(TaskStatus::Failed, format!("cannot create a scratch folder: {e}"));
    }
    let python = PythonSettings { python: settings.python.clone(), pythonpath: settings.pythonpath.clone(), workdir: scratch.clone() };
    let mut harness = match Harness::start(&python, &spec.tools, spec.max_artifact_bytes).await {
        Ok(h) => h,
        Err(e) => return Ending::failed(TaskStatus::Failed, e.to_string()),
    };
    let ending = conversation(api, &model, &mut harness, spec, tally).await;
    harness.kill().await;
    let _ = std::fs::remove_dir_all(&scratch);
    ending
}

async fn conversation(api: &InternalApi, model: &Model, harness: &mut Harness, spec: &TaskSpec, tally: &mut Tally) -> Ending {
    let budgets = &spec.budgets;
    let mut messages = vec![Message::System(prompt::system_prompt(spec)), Message::User(format!("Task:\n{}", spec.prompt))];
    let mut malformed_in_a_row = 0;
    loop {
        let Some(left) = remaining(spec) else {
            return Ending::failed(TaskStatus::TimedOut, "the task's deadline passed");
        };
        if tally.steps >= budgets.max_steps as u32 {
            return Ending::failed(TaskStatus::Failed, format!("step budget of {} exhausted without a final answer", budgets.max_steps));
        }
        if tally.model_calls >= budgets.max_model_calls as u32 {
            return Ending::failed(TaskStatus::Failed, format!("model call budget of {} exhausted without a final answer", budgets.max_model_calls));
        }
        tally.model_calls += 1;
        let call_no = tally.model_calls;
        let _ = api.post_events("tasks", &spec.id, &[ev(event::MODEL_CALL_STARTED, json!({"call": call_no}))]).await;
        let started = Instant::now();
        let answer = model.complete(&messages, left).await;
        let finished = json!({"call": call_no, "ok": answer.is_ok(), "duration_ms": started.elapsed().as_millis() as u64,
            "error": answer.as_ref().err().map(|e| e.to_string())});
        let _ = api.post_events("tasks", &spec.id, &[ev(event::MODEL_CALL_FINISHED, finished)]).await;
        let answer = match answer {
            Ok(a) => {
                malformed_in_a_row = 0;
                a
            }
            Err(ModelError::Deadline) => return Ending::failed(TaskStatus::TimedOut, "the task's deadline passed while waiting for the model"),
            Err(e) if e.is_retryable() && malformed_in_a_row < 2 => {
                malformed_in_a_row += 1;
                tracing::warn!(error = %e, "model call failed; retrying");
                continue;
            }
            Err(e) => return Ending::failed(TaskStatus::Failed, e.to_string()),
        };
        let Some(code) = prompt::extract_code(&answer) else {
            messages.push(Message::Assistant(answer));
            messages.push(Message::User(prompt::NO_CODE.to_owned()));
            continue;
        };
        tally.steps += 1;
        let step = tally.steps;
        if let Err(e) = api.put_task_action(&spec.id, step, code.clone()).await {
            tracing::warn!(error = %e, step, "could not save the step's code");
        }
        let outcome = {
            let mut requests = StepRequests { api, spec, tally, step };
            let left = remaining(spec).unwrap_or_default();
            match tokio::time::timeout(left, harness.exec(step, &code, &mut requests)).await {
                Err(_) => return Ending::failed(TaskStatus::TimedOut, format!("the task's deadline passed during step {step}")),
                Ok(Err(e)) => return Ending::failed(TaskStatus::Failed, e.to_string()),
                Ok(Ok(o)) => o,
            }
        };
        let StepOutcome { output, error, final_answer } = outcome;
        let _ = api
            .post_events("tasks", &spec.id, &[ev(event::STEP_FINISHED, json!({"step": step, "error": error.is_some(), "final_answer": final_answer.is_some()}))])
            .await;
        messages.push(Message::Assistant(answer));
        if tally.tool_budget_exhausted {
            return Ending::failed(TaskStatus::Failed, format!("tool call budget of {} exhausted", budgets.max_tool_calls));
        }
        if let Some(answer) = final_answer {
            match contract::check_final_answer(&answer, tally.successful_tool_calls) {
                Ok(ok) => {
                    return Ending {
                        status: TaskStatus::Success,
                        task_type: ok.task_type,
                        summary: ok.summary,
                        metrics: ok.metrics,
                        assumptions: ok.assumptions,
                        error: None,
                    };
                }
                Err(errors) => {
                    messages.push(Message::User(prompt::contract_violation(&errors)));
                    continue;
                }
            }
        }
        messages.push(Message::User(prompt::observation(&output, error.as_deref())));
    }
}

async fn finish(api: &InternalApi, spec: &TaskSpec, tally: Tally, ending: Ending) -> i32 {
    let artifacts = api.list_task_outputs(&spec.id).await.unwrap_or_else(|e| {
        tracing::warn!(error = %e, "could not list the artifacts");
        Vec::new()
    });
    if let Err(e) = api.put_task_tool_calls(&spec.id, &serde_json::to_value(&tally.records).unwrap_or_default()).await {
        tracing::warn!(error = %e, "could not save tool_calls.json");
    }
    let result = TaskResult {
        status: ending.status,
        task_type: ending.task_type,
        summary: ending.summary,
        metrics: ending.metrics,
        assumptions: ending.assumptions,
        artifacts,
        steps: tally.steps,
        model_calls: tally.model_calls,
        tool_calls: tally.tool_calls,
        error: ending.error,
    };
    let status = result.status;
    let _ = api
        .post_events("tasks", &spec.id, &[ev(event::AGENT_FINISHED, json!({"status": status, "steps": tally.steps,
            "model_calls": tally.model_calls, "tool_calls": tally.tool_calls}))])
        .await;
    if let Err(e) = api.put_task_result(&spec.id, &result).await {
        tracing::error!(error = %e, "could not upload the task result");
        return runner_exit::RUNNER_ERROR;
    }
    write_termination_message(&result);
    match status {
        TaskStatus::Success => runner_exit::OK,
        TaskStatus::TimedOut => runner_exit::TIMED_OUT,
        TaskStatus::Failed | TaskStatus::Cancelled => runner_exit::TOOL_FAILED,
    }
}

fn write_termination_message(result: &TaskResult) {
    let path = std::env::var_os("TOOLYARD_TERMINATION_LOG").map(PathBuf::from).unwrap_or_else(|| "/dev/termination-log".into());
    let line: String = match &result.error {
        Some(e) => e.chars().take(1024).collect(),
        None => format!("{:?}: {}", result.task_type, result.summary.chars().take(200).collect::<String>()),
    };
    let _ = std::fs::write(path, line);
}

/// Builds the uploaded result for a task stopped from outside (SIGTERM).
pub fn stopped_result(spec: &TaskSpec) -> TaskResult {
    if remaining(spec).is_none() {
        TaskResult::failed(TaskStatus::TimedOut, "the task's deadline passed")
    } else {
        TaskResult::failed(TaskStatus::Cancelled, "the task was cancelled")
    }
}

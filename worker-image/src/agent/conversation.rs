//! The agent loop of one task: model call → Python step → observation → ..., until a final
//! answer meets the result contract, a budget or the deadline runs out, the model fails for
//! good, or the task is stopped.

use std::time::Instant;

use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;
use toolyard_api::agent::{self as contract, TaskSpec, TaskStatus, event};
use toolyard_api::codingtask::TaskType;

use super::harness::{Harness, PythonSettings, StepOutcome};
use super::model::{Message, Model, ModelError, RetryPolicy};
use super::requests::{StepRequests, Tally};
use super::{AgentSettings, Events, prompt, remaining, stopped_status};
use crate::api::InternalApi;

/// Malformed model answers accepted in a row before the task fails.
const MAX_MALFORMED_IN_A_ROW: u32 = 3;

/// How the loop ended, before artifacts and counters are added.
pub(crate) struct Ending {
    pub(crate) status: TaskStatus,
    pub(crate) task_type: TaskType,
    pub(crate) summary: String,
    pub(crate) metrics: Map<String, Value>,
    pub(crate) assumptions: Vec<String>,
    pub(crate) error: Option<String>,
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

    fn stopped(spec: &TaskSpec) -> Self {
        match stopped_status(spec) {
            TaskStatus::TimedOut => Self::failed(TaskStatus::TimedOut, "the task's deadline passed"),
            _ => Self::failed(TaskStatus::Cancelled, "the task was cancelled"),
        }
    }

    fn deadline(during: &str) -> Self {
        Self::failed(TaskStatus::TimedOut, format!("the task's deadline passed {during}"))
    }
}

/// Starts the model client and the interpreter, runs the conversation, cleans up.
pub(crate) async fn drive(
    api: &InternalApi,
    events: &Events<'_>,
    settings: &AgentSettings,
    spec: &TaskSpec,
    tally: &mut Tally,
    stop: &CancellationToken,
) -> Ending {
    events
        .emit(event::AGENT_STARTED, json!({"model": spec.model, "tools": spec.tools.len(), "budgets": spec.budgets}))
        .await;
    let model =
        match Model::new(api.model_settings(&spec.id, &spec.model), settings.model_timeout, RetryPolicy::default()) {
            Ok(m) => m,
            Err(e) => return Ending::failed(TaskStatus::Failed, format!("cannot set up the model client: {e}")),
        };
    let scratch = std::env::temp_dir().join(format!("toolyard-agent-{}-{}", spec.id, std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    if let Err(e) = std::fs::create_dir_all(&scratch) {
        return Ending::failed(TaskStatus::Failed, format!("cannot create a scratch folder: {e}"));
    }
    let python = PythonSettings {
        python: settings.python.clone(),
        pythonpath: settings.pythonpath.clone(),
        workdir: scratch.clone(),
    };
    let ending = match Harness::start(&python, &spec.tools, spec.max_artifact_bytes).await {
        Ok(mut harness) => {
            let ending = conversation(api, events, &model, &mut harness, spec, tally, stop).await;
            harness.kill().await;
            ending
        }
        Err(e) => Ending::failed(TaskStatus::Failed, e.to_string()),
    };
    let _ = std::fs::remove_dir_all(&scratch);
    ending
}

async fn conversation(
    api: &InternalApi,
    events: &Events<'_>,
    model: &Model,
    harness: &mut Harness,
    spec: &TaskSpec,
    tally: &mut Tally,
    stop: &CancellationToken,
) -> Ending {
    let budgets = &spec.budgets;
    let max_steps = u32::try_from(budgets.max_steps).unwrap_or(0);
    let max_model_calls = u32::try_from(budgets.max_model_calls).unwrap_or(0);
    let mut messages =
        vec![Message::System(prompt::system_prompt(spec)), Message::User(format!("Task:\n{}", spec.prompt))];
    let mut malformed_in_a_row = 0;
    loop {
        if stop.is_cancelled() {
            return Ending::stopped(spec);
        }
        let Some(left) = remaining(spec) else { return Ending::deadline("between steps") };
        if tally.steps >= max_steps {
            return Ending::failed(
                TaskStatus::Failed,
                format!("the step budget of {max_steps} was exhausted without an accepted final answer"),
            );
        }
        if tally.model_calls >= max_model_calls {
            return Ending::failed(
                TaskStatus::Failed,
                format!("the model call budget of {max_model_calls} was exhausted without an accepted final answer"),
            );
        }

        tally.model_calls += 1;
        let call = tally.model_calls;
        events.emit(event::MODEL_CALL_STARTED, json!({"call": call, "step": tally.steps + 1})).await;
        let started = Instant::now();
        let answer = tokio::select! {
            answer = model.complete(&messages, left) => answer,
            () = stop.cancelled() => return Ending::stopped(spec),
        };
        let finished = json!({"call": call, "ok": answer.is_ok(), "duration_ms": millis(started),
            "error": answer.as_ref().err().map(ToString::to_string)});
        events.emit(event::MODEL_CALL_FINISHED, finished).await;
        let answer = match answer {
            Ok(a) => {
                malformed_in_a_row = 0;
                a
            }
            Err(ModelError::Deadline) => return Ending::deadline("while waiting for the model"),
            Err(e) if e.is_retryable() && malformed_in_a_row + 1 < MAX_MALFORMED_IN_A_ROW => {
                malformed_in_a_row += 1;
                tracing::warn!(error = %e, "the model's answer was malformed; asking again");
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
            let mut requests = StepRequests { api, events, spec, tally, step };
            let left = remaining(spec).unwrap_or_default();
            tokio::select! {
                outcome = tokio::time::timeout(left, harness.exec(step, &code, &mut requests)) => outcome,
                () = stop.cancelled() => return Ending::stopped(spec),
            }
        };
        let StepOutcome { output, error, final_answer } = match outcome {
            Err(_) => return Ending::deadline(&format!("during step {step}")),
            Ok(Err(e)) => return Ending::failed(TaskStatus::Failed, e.to_string()),
            Ok(Ok(o)) => o,
        };
        events
            .emit(
                event::STEP_FINISHED,
                json!({"step": step, "error": error.is_some(), "final_answer": final_answer.is_some()}),
            )
            .await;
        messages.push(Message::Assistant(answer));
        if tally.tool_budget_exhausted {
            return Ending::failed(
                TaskStatus::Failed,
                format!("the tool call budget of {} was exhausted", budgets.max_tool_calls),
            );
        }
        if let Some(answer) = final_answer.filter(|_| error.is_none()) {
            match check(&answer, tally.successful_tool_calls) {
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
                    messages.push(Message::User(prompt::contract_violation(&output, &errors)));
                    continue;
                }
            }
        }
        messages.push(Message::User(prompt::observation(&output, error.as_deref())));
    }
}

/// The result contract, plus the harness's marker for a value that is not JSON data.
fn check(answer: &Value, successful_tool_calls: u32) -> Result<contract::FinalAnswer, Vec<String>> {
    if let Some(problem) = answer.get("__invalid__").and_then(Value::as_str) {
        return Err(vec![problem.to_owned()]);
    }
    contract::check_final_answer(answer, successful_tool_calls)
}

fn millis(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

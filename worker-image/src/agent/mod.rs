//! `toolyard-runner agent`: the code agent of one coding task.
//!
//! The loop (`conversation`): the model (reached through the gateway's model route with the
//! task token: no model key is ever in the agent's environment) is told the task, the tools
//! and the rules ([`prompt`]); it answers with Python code, which runs in a persistent interpreter
//! ([`harness`]) whose tool stubs call back through this runner to the gateway, as the task's
//! owner (`requests`); the printed output or the traceback goes back to the model as an
//! observation; until `final_answer(...)` meets the result contract or a budget runs out.
//! Every step's code, every tool call with its outcome, lifecycle events and the result are
//! saved through the internal API. SIGTERM (cancellation, the Job's deadline) ends the loop
//! at once and still uploads a result.

mod conversation;
pub mod harness;
pub mod model;
pub mod prompt;
mod requests;

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use toolyard_api::agent::{TaskResult, TaskSpec, TaskStatus, event};
use toolyard_api::protocol::{Event, env, runner_exit};
use tracing::Instrument;

use crate::api::InternalApi;
use conversation::Ending;
use requests::Tally;

use toolyard_api::agent::env::{AGENT_PYTHON, AGENT_PYTHONPATH};

/// Attempts per internal API request (about half a minute of retries in all).
const INTERNAL_API_ATTEMPTS: u32 = 9;

/// Where Kubernetes reads a container's termination message.
const POD_TERMINATION_LOG: &str = "/dev/termination-log";

/// Arguments of `agent` (all from the environment the controller or the local gateway sets).
#[derive(Args, Debug)]
pub struct AgentArgs {
    /// Base URL of the gateway's internal API.
    #[arg(long, env = env::GATEWAY_URL, hide_env_values = true)]
    pub gateway_url: String,
    /// The task-scoped token.
    #[arg(long, env = env::TOKEN, hide_env_values = true)]
    pub token: String,
    /// The task id.
    #[arg(long, env = env::RUN_ID)]
    pub run_id: String,
    /// Python interpreter running the model's code.
    #[arg(long, env = AGENT_PYTHON, default_value = "python3")]
    pub python: PathBuf,
    /// `PYTHONPATH` of that interpreter (the `toolyard` package, nothing else).
    #[arg(long, env = AGENT_PYTHONPATH)]
    pub pythonpath: Option<String>,
    /// Timeout of one HTTP request to the model, in seconds.
    #[arg(long, env = "TOOLYARD_MODEL_TIMEOUT_SECONDS", default_value_t = 300)]
    pub model_timeout_seconds: u64,
    /// Where to write the one-line summary (default: /dev/termination-log when it exists).
    #[arg(long, env = "TOOLYARD_TERMINATION_LOG")]
    pub termination_log: Option<PathBuf>,
    /// W3C trace context of the request that started the task (the `agent.run` span's parent).
    #[arg(long, env = env::TRACEPARENT)]
    pub traceparent: Option<String>,
}

/// Settings of one agent run.
#[derive(Clone, Debug)]
pub struct AgentSettings {
    /// The task id.
    pub task_id: String,
    /// Timeout of one model request.
    pub model_timeout: Duration,
    /// The interpreter.
    pub python: PathBuf,
    /// `PYTHONPATH` for the interpreter (the `toolyard` package).
    pub pythonpath: Option<String>,
}

/// Runs `toolyard-runner agent` until the task ends or SIGTERM; returns the exit code.
pub async fn main(args: AgentArgs) -> i32 {
    let stop = CancellationToken::new();
    install_stop_signals(stop.clone());
    let termination_log = args.termination_log.clone();
    // Patient with the gateway: a restart or a rolling update must not end the task.
    let api = match InternalApi::new(&args.gateway_url, args.token) {
        Ok(api) => api.with_attempts(INTERNAL_API_ATTEMPTS),
        Err(e) => {
            eprintln!("toolyard-runner agent: {e}");
            return runner_exit::RUNNER_ERROR;
        }
    };
    let settings = AgentSettings {
        task_id: args.run_id,
        model_timeout: Duration::from_secs(args.model_timeout_seconds.max(1)),
        python: args.python,
        pythonpath: args.pythonpath.filter(|p| !p.is_empty()),
    };
    let span = tracing::info_span!(
        "agent.run",
        "gen_ai.operation.name" = "invoke_agent",
        "toolyard.task.id" = %settings.task_id,
        "otel.status_code" = tracing::field::Empty,
        "error.type" = tracing::field::Empty,
    );
    toolyard_telemetry::set_parent(&span, args.traceparent.as_deref());
    let (code, summary) = run(&api, &settings, stop).instrument(span.clone()).await;
    if code != runner_exit::OK {
        toolyard_telemetry::record_error(&span, "task_failed");
    }
    write_termination_log(termination_log, &summary);
    code
}

/// SIGTERM / SIGINT cancel `stop` (a cancellation, or the Job's deadline).
fn install_stop_signals(stop: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (term, int) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()));
    tokio::spawn(async move {
        let (mut term, mut int) = (term.ok(), int.ok());
        tokio::select! {
            Some(()) = async { term.as_mut()?.recv().await } => {}
            Some(()) = async { int.as_mut()?.recv().await } => {}
        }
        tracing::info!("stop signal received; ending the task");
        stop.cancel();
    });
}

/// Runs the task to its end and returns the exit code and a one-line summary. The result
/// is uploaded whenever the gateway is reachable, including after `stop`.
pub async fn run(api: &InternalApi, settings: &AgentSettings, stop: CancellationToken) -> (i32, String) {
    let spec = tokio::select! {
        spec = api.task_spec(&settings.task_id) => spec,
        () = stop.cancelled() => {
            // Stopped before the task was even read: still say so.
            let result = TaskResult::failed(TaskStatus::Cancelled, "the task was stopped before the agent started");
            return upload(api, &settings.task_id, &result).await;
        }
    };
    let spec = match spec {
        Ok(spec) => spec,
        Err(e) => {
            tracing::error!(error = %e, "cannot read the task");
            return (runner_exit::RUNNER_ERROR, format!("runner error: cannot read the task: {e}"));
        }
    };
    let events = Events { api, task: &spec.id };
    let mut tally = Tally::default();
    let ending = conversation::drive(api, &events, settings, &spec, &mut tally, &stop).await;
    let result = finish(api, &events, &spec, tally, ending).await;
    upload(api, &spec.id, &result).await
}

async fn upload(api: &InternalApi, task: &str, result: &TaskResult) -> (i32, String) {
    if let Err(e) = api.put_task_result(task, result).await {
        tracing::error!(error = %e, "could not upload the task result");
        return (runner_exit::RUNNER_ERROR, format!("runner error: cannot upload the result: {e}"));
    }
    let code = match result.status {
        TaskStatus::Success => runner_exit::OK,
        TaskStatus::TimedOut => runner_exit::TIMED_OUT,
        TaskStatus::Failed | TaskStatus::Cancelled => runner_exit::TOOL_FAILED,
    };
    (code, summary(result))
}

/// Lists the artifacts, saves `tool_calls.json`, emits `agent_finished` and builds the result.
async fn finish(api: &InternalApi, events: &Events<'_>, spec: &TaskSpec, tally: Tally, ending: Ending) -> TaskResult {
    let artifacts = api.list_task_outputs(&spec.id).await.unwrap_or_else(|e| {
        tracing::warn!(error = %e, "could not list the artifacts");
        Vec::new()
    });
    let records = serde_json::to_value(&tally.records).unwrap_or_default();
    if let Err(e) = api.put_task_tool_calls(&spec.id, &records).await {
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
    events
        .emit(
            event::AGENT_FINISHED,
            json!({"status": result.status, "task_type": result.task_type, "steps": result.steps,
                "model_calls": result.model_calls, "tool_calls": result.tool_calls, "error": result.error}),
        )
        .await;
    result
}

/// Appends lifecycle events to the task's `events/` (best effort: a lost event never stops
/// the task).
pub(crate) struct Events<'a> {
    api: &'a InternalApi,
    task: &'a str,
}

impl Events<'_> {
    pub(crate) async fn emit(&self, type_: &str, data: Value) {
        let event = Event { time: jiff::Timestamp::now().to_string(), type_: type_.to_owned(), data };
        if let Err(e) = self.api.post_events("tasks", self.task, &[event]).await {
            tracing::warn!(error = %e, event = type_, "could not save an event");
        }
    }
}

/// The task's remaining time; `None` once its deadline has passed.
pub(crate) fn remaining(spec: &TaskSpec) -> Option<Duration> {
    let now = jiff::Timestamp::now().as_millisecond();
    let left = spec.deadline_unix_ms.saturating_sub(now);
    (left > 0).then(|| Duration::from_millis(u64::try_from(left).unwrap_or(0)))
}

/// The status of a task stopped from outside: past its deadline it timed out, else it was
/// cancelled.
pub fn stopped_status(spec: &TaskSpec) -> TaskStatus {
    if remaining(spec).is_none() { TaskStatus::TimedOut } else { TaskStatus::Cancelled }
}

/// The result uploaded for a task stopped from outside before any step (see [`stopped_status`]).
pub fn stopped_result(spec: &TaskSpec) -> TaskResult {
    match stopped_status(spec) {
        TaskStatus::TimedOut => TaskResult::failed(TaskStatus::TimedOut, "the task's deadline passed"),
        _ => TaskResult::failed(TaskStatus::Cancelled, "the task was cancelled"),
    }
}

/// One line saying how the task ended (the pod's termination message).
fn summary(result: &TaskResult) -> String {
    let status = serde_json::to_value(result.status).ok().and_then(|v| v.as_str().map(str::to_owned));
    let line = match &result.error {
        Some(e) => format!("{}: {e}", status.unwrap_or_default()),
        None => format!("{}: {}", status.unwrap_or_default(), result.summary),
    };
    crate::capture::truncate_chars(&line.replace(['\n', '\r'], " "), 1024)
}

fn write_termination_log(path: Option<PathBuf>, summary: &str) {
    use std::io::Write;
    let file = match path {
        Some(path) => std::fs::File::create(path),
        None => std::fs::OpenOptions::new().write(true).truncate(true).open(POD_TERMINATION_LOG),
    };
    if let Ok(mut file) = file {
        let _ = file.write_all(summary.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use toolyard_api::codingtask::Budgets;

    use super::*;

    fn spec(deadline_unix_ms: i64) -> TaskSpec {
        TaskSpec {
            id: "t".into(),
            prompt: "p".into(),
            tools: vec![],
            budgets: Budgets::default(),
            deadline_unix_ms,
            max_artifact_bytes: 1,
            model: "m".into(),
        }
    }

    #[test]
    fn a_stopped_task_is_cancelled_before_its_deadline_and_timed_out_after() {
        let future = jiff::Timestamp::now().as_millisecond() + 60_000;
        assert_eq!(stopped_result(&spec(future)).status, TaskStatus::Cancelled);
        assert_eq!(stopped_result(&spec(1)).status, TaskStatus::TimedOut);
        assert!(remaining(&spec(future)).is_some() && remaining(&spec(1)).is_none());
    }

    #[test]
    fn summaries_are_one_line() {
        let mut r = TaskResult::failed(TaskStatus::Failed, "model\nunreachable");
        assert_eq!(summary(&r), "failed: model unreachable");
        r.error = None;
        r.status = TaskStatus::Success;
        r.summary = "done".into();
        assert_eq!(summary(&r), "success: done");
    }
}

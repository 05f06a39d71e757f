//! `toolyard-runner call -- CMD...`: one tool call, as a Job pod or the local executor runs it.
//!
//! Reads the call's arguments from the gateway's internal API (storing its `call_started`
//! event meanwhile), runs CMD once (see [`crate::child`]) while posting its progress reports
//! as `call_progress` events, uploads its logs and result, writes a one-line summary to the
//! termination log and exits with a [`runner_exit`] code.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use serde_json::json;
use tokio::sync::watch;
use toolyard_api::protocol::{CallErrorKind, CallResult, Event, Progress, call_event, env, runner_exit};
use tracing::Instrument;

use crate::api::InternalApi;
use crate::capture::{DEFAULT_LOG_LIMIT, truncate_chars};
use crate::child::{self, RunSpec, StopReason, ToolCommand};
use toolyard_process::progress::ProgressReporter;

/// Where Kubernetes reads a container's termination message.
const POD_TERMINATION_LOG: &str = "/dev/termination-log";
/// Kubernetes keeps at most 4096 bytes of it.
const TERMINATION_LOG_MAX: usize = 4096;

/// Arguments of `call`.
#[derive(Args, Debug)]
pub struct CallArgs {
    /// Base URL of the gateway's internal API.
    #[arg(long, env = env::GATEWAY_URL, hide_env_values = true)]
    pub gateway_url: String,
    /// The call-scoped token (never passed to the tool).
    #[arg(long, env = env::TOKEN, hide_env_values = true)]
    pub token: String,
    /// The call id.
    #[arg(long, env = env::RUN_ID)]
    pub run_id: String,
    /// W3C trace context passed on to the tool.
    #[arg(long, env = env::TRACEPARENT)]
    pub traceparent: Option<String>,
    /// Stop the tool after this many seconds (the local executor's deadline; in a pod the
    /// Job's activeDeadlineSeconds sends SIGTERM instead).
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<f64>,
    /// Seconds between SIGTERM and SIGKILL of the tool's process group at a stop.
    #[arg(long, env = "TOOLYARD_KILL_GRACE_SECONDS", default_value_t = 2.0, value_name = "SECONDS")]
    pub kill_grace: f64,
    /// Bytes kept of each of the tool's stdout and stderr.
    #[arg(long, env = "TOOLYARD_LOG_LIMIT", default_value_t = DEFAULT_LOG_LIMIT)]
    pub log_limit: usize,
    /// Where to write the one-line summary (default: /dev/termination-log when it exists).
    #[arg(long, env = "TOOLYARD_TERMINATION_LOG")]
    pub termination_log: Option<PathBuf>,
    /// The tool command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// Runs one call; returns the process exit code.
pub async fn run(args: CallArgs) -> i32 {
    let termination_log = args.termination_log.clone();
    let (code, summary) = match call(args).await {
        Ok((code, summary)) => (code, summary),
        Err(message) => {
            eprintln!("toolyard-runner: {message}");
            (runner_exit::RUNNER_ERROR, format!("runner error: {message}"))
        }
    };
    write_termination_log(termination_log, &summary);
    code
}

/// One call in a `call` span, whose parent is the call's `traceparent` (the gateway's span).
async fn call(mut args: CallArgs) -> Result<(i32, String), String> {
    let span = tracing::info_span!(
        "call",
        "otel.kind" = "server",
        "toolyard.call.id" = %args.run_id,
        "otel.status_code" = tracing::field::Empty,
        "error.type" = tracing::field::Empty,
    );
    args.traceparent = toolyard_telemetry::continue_trace(&span, args.traceparent.take());
    let outcome = run_call(args).instrument(span.clone()).await;
    match &outcome {
        Err(_) => {
            toolyard_telemetry::record_error(&span, "runner_error");
        }
        Ok((code, _)) if *code != runner_exit::OK => {
            toolyard_telemetry::record_error(&span, "tool_error");
        }
        Ok(_) => {}
    }
    outcome
}

async fn run_call(args: CallArgs) -> Result<(i32, String), String> {
    // Before anything else: a SIGTERM from now on stops the call instead of killing the runner.
    let signals = StopSignals::install();
    let timeout = match args.timeout {
        Some(s) if !(s.is_finite() && s > 0.0) => return Err(format!("--timeout must be a positive number, got {s}")),
        Some(s) => Some(Duration::from_secs_f64(s)),
        None => None,
    };
    let kill_grace = Duration::try_from_secs_f64(args.kill_grace)
        .map_err(|_| format!("--kill-grace must be a non-negative number, got {}", args.kill_grace))?;
    let api = InternalApi::new(&args.gateway_url, args.token).map_err(|e| e.to_string())?;
    // The caller, when the tool asked for it (set on the pod by the controller, or by the local
    // gateway); passed on to the command as the same variable.
    let caller = match std::env::var(env::CALLER) {
        Ok(text) => Some(
            serde_json::from_str::<toolyard_api::Owner>(&text)
                .map_err(|e| format!("{} is not a caller ({{issuer, user, groups}}): {e}", env::CALLER))?,
        ),
        Err(_) => None,
    };
    let id = args.run_id;

    // The call's `call_started` event is stored while the input is read.
    let started = [event(call_event::STARTED, json!({}))];
    let (input, started) = tokio::join!(
        api.call_input(&id).instrument(tracing::info_span!("read input")),
        api.post_events("calls", &id, &started),
    );
    let input = input.map_err(|e| format!("cannot read the call's input: {e}"))?;
    if let Err(e) = started {
        tracing::warn!(error = %e, "could not save the call_started event");
    }
    let stdin = serde_json::to_vec(&input).map_err(|e| e.to_string())?;
    tracing::debug!(call = %id, "tool started");

    // The function's own span (when it makes one) is a child of this one.
    let function = tracing::info_span!("function.call", "process.executable.name" = %args.command[0]);
    let (progress, mut reports) = watch::channel(None);
    let spec = RunSpec {
        command: ToolCommand::new(args.command),
        stdin,
        traceparent: toolyard_telemetry::pass_on(&function, args.traceparent),
        caller,
        log_limit: args.log_limit,
        kill_grace,
        progress: Some(ProgressReporter::to_sender(progress)),
    };
    let mut posted = None;
    let output = tokio::select! {
        output = child::run_once(spec, signals.stop(timeout)).instrument(function) => output,
        never = post_progress(&api, &id, &mut reports, &mut posted) => match never {},
    };
    // The last report, if the function made one since the last post.
    let last = reports.borrow().clone();
    if last.is_some() && last != posted {
        post_progress_event(&api, &id, last.as_ref()).await;
    }
    let result = output.result;
    let files = output.files;

    // Logs and returned files first (both at once; an empty stream is not uploaded): whoever waits for the
    // result finds the logs already there.
    let upload = |stream: &'static str, log: Vec<u8>| {
        let (api, id) = (&api, &id);
        async move {
            if log.is_empty() {
                return Ok(());
            }
            api.put_log(id, stream, log).await.map_err(|e| format!("cannot upload {stream}: {e}"))
        }
    };
    async {
        let (out, err) =
            tokio::join!(upload("stdout", output.stdout.into_log()), upload("stderr", output.stderr.into_log()));
        out?;
        err?;
        for output in files {
            let file = &output.file;
            api.put_output(&id, &file.name, &file.mime_type, output.bytes)
                .await
                .map_err(|e| format!("cannot upload the returned file {}: {e}", file.name))?;
        }
        api.put_result(&id, &result).await.map_err(|e| format!("cannot upload the result: {e}"))
    }
    .instrument(tracing::info_span!("upload"))
    .await?;
    tracing::debug!(call = %id, ok = !result.is_error(), duration_ms = result.duration_ms, "tool finished");
    Ok((exit_code_of(&result), summary(&result)))
}

/// Least time between two posts of progress events: a function reporting often costs the
/// gateway one stored segment per interval (the latest report), not one per report.
const PROGRESS_POST_INTERVAL: Duration = Duration::from_millis(500);

/// A call event of `type_` stamped now.
fn event(type_: &str, data: serde_json::Value) -> Event {
    Event { time: jiff::Timestamp::now().to_string(), type_: type_.to_owned(), data }
}

/// Posts the function's progress reports as `call_progress` events while it runs: the latest
/// one, at most every [`PROGRESS_POST_INTERVAL`]. `posted` is the last report posted.
async fn post_progress(
    api: &InternalApi,
    id: &str,
    reports: &mut watch::Receiver<Option<Progress>>,
    posted: &mut Option<Progress>,
) -> std::convert::Infallible {
    loop {
        if reports.changed().await.is_err() {
            return std::future::pending().await;
        }
        let latest = reports.borrow_and_update().clone();
        post_progress_event(api, id, latest.as_ref()).await;
        *posted = latest;
        tokio::time::sleep(PROGRESS_POST_INTERVAL).await;
    }
}

async fn post_progress_event(api: &InternalApi, id: &str, progress: Option<&Progress>) {
    let Some(progress) = progress else { return };
    let event = progress.event(jiff::Timestamp::now().to_string());
    if let Err(e) = api.post_events("calls", id, &[event]).await {
        tracing::warn!(error = %e, "could not save a progress event");
    }
}

/// The runner's exit code for a call's result.
pub fn exit_code_of(result: &CallResult) -> i32 {
    match &result.error {
        None => runner_exit::OK,
        Some(e) if e.kind == CallErrorKind::TimedOut => runner_exit::TIMED_OUT,
        Some(_) => runner_exit::TOOL_FAILED,
    }
}

/// One line saying how the call ended (the pod's termination message).
pub fn summary(result: &CallResult) -> String {
    let line = match &result.error {
        None => format!("ok in {} ms", result.duration_ms),
        Some(e) => {
            let kind =
                serde_json::to_value(e.kind).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default();
            format!("{kind} after {} ms: {}", result.duration_ms, e.message)
        }
    };
    truncate_chars(&line.replace(['\n', '\r'], " "), TERMINATION_LOG_MAX)
}

/// SIGTERM and SIGINT handlers, installed for the whole call.
struct StopSignals {
    term: Option<tokio::signal::unix::Signal>,
    int: Option<tokio::signal::unix::Signal>,
}

impl StopSignals {
    fn install() -> Self {
        use tokio::signal::unix::{SignalKind, signal};
        Self { term: signal(SignalKind::terminate()).ok(), int: signal(SignalKind::interrupt()).ok() }
    }

    /// Resolves at the deadline, or at SIGTERM / SIGINT (a pod's deadline, a cancellation).
    async fn stop(mut self, timeout: Option<Duration>) -> StopReason {
        let deadline = async {
            match timeout {
                Some(limit) => {
                    tokio::time::sleep(limit).await;
                    limit
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            limit = deadline => StopReason::Deadline(limit),
            Some(()) = async { self.term.as_mut()?.recv().await } => StopReason::Signal("SIGTERM"),
            Some(()) = async { self.int.as_mut()?.recv().await } => StopReason::Signal("SIGINT"),
        }
    }
}

/// Writes the summary to the termination log: the given path, else `/dev/termination-log`
/// when it already exists (inside a pod); never creates files under /dev.
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
    use super::*;

    #[test]
    fn exit_codes_and_summaries_follow_the_result() {
        let ok = CallResult::ok(json!({}), 12);
        assert_eq!((exit_code_of(&ok), summary(&ok).as_str()), (0, "ok in 12 ms"));
        let timed_out = CallResult::err(CallErrorKind::TimedOut, "the call timed out after 2s", None, 2001);
        assert_eq!(exit_code_of(&timed_out), 3);
        assert_eq!(summary(&timed_out), "timed_out after 2001 ms: the call timed out after 2s");
        let failed = CallResult::err(CallErrorKind::ToolError, "RuntimeError: a\nb", Some(1), 5);
        assert_eq!((exit_code_of(&failed), summary(&failed).as_str()), (1, "tool_error after 5 ms: RuntimeError: a b"));
        let long = CallResult::err(CallErrorKind::ToolError, "x".repeat(10_000), Some(1), 5);
        assert!(summary(&long).len() <= TERMINATION_LOG_MAX);
    }
}

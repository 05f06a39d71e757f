//! The call service: every tool call, from an MCP client or from a coding task's agent, runs
//! through [`Calls::call`]: resolve (through the [`Access`] filter), validate the arguments,
//! admit (the owner's and the replica's limits), execute, count and log, in one span that
//! carries the call's trace context.

use std::sync::Arc;
use std::time::Instant;

use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;
use toolyard_api::protocol::{CallErrorKind, CallResult, Progress};
use toolyard_api::storage::RunId;
use tracing::Instrument;

use super::access::{Access, Selection};
use super::ids::new_call_id;
use super::quota::StorageQuota;
use crate::catalog::Tool;
use crate::executor::{CallRequest, Executor};
use crate::identity::Identity;
use crate::limits::Limits;
use crate::metrics::{CallOutcome, Metrics, Rejection};
use crate::upstream::logs::{self, LogMessage, LogReceiver};

/// One tool call as a front door hands it over.
#[derive(Debug)]
pub struct CallInput {
    /// The caller; the call runs as this identity (a task's owner for an agent's call).
    pub who: Identity,
    /// The part of the catalog the request may reach.
    pub selection: Selection,
    /// The tool's MCP name.
    pub tool: String,
    /// The arguments, not validated yet.
    pub arguments: Map<String, Value>,
    /// W3C `traceparent` of the request, if well-formed.
    pub traceparent: Option<String>,
    /// The coding task making the call, if any.
    pub parent_task: Option<RunId>,
    /// Fires when the caller cancels or goes away.
    pub cancel: CancellationToken,
    /// Recorded with the run so a cancellation arriving at any replica finds it
    /// ([`CallRequest::cancel_key`]).
    pub cancel_key: Option<String>,
    /// Where the function's progress goes while the caller waits (`None`: nobody asked).
    pub progress: Option<Arc<dyn ProgressSink>>,
    /// Where the log messages an upstream server sends during the call go (`None`: nobody
    /// listens).
    pub logs: Option<Arc<dyn LogSink>>,
    /// Who answers the requests an upstream server sends its caller during the call
    /// (sampling, elicitation; `None`: nobody can, and the server is told so).
    pub asker: Option<Arc<dyn ClientAsker>>,
    /// Set for a call run as an MCP task: its id (chosen by the front door, which answers
    /// with it), and a signal sent once its run is started where it outlives the request and
    /// this process ([`CallRequest::task_started`]).
    pub task: Option<TaskStart>,
}

/// How a call started as an MCP task begins: see [`CallInput::task`].
#[derive(Debug)]
pub struct TaskStart {
    /// The call id.
    pub id: RunId,
    /// Receives `()` once the run is started (dropped unsent when the call is refused, or
    /// when the executor cannot run it detached: it is then answered when it ends).
    pub started: tokio::sync::oneshot::Sender<()>,
}

/// Takes a call's progress reports while its caller waits: an MCP client's
/// `notifications/progress`.
#[async_trait::async_trait]
pub trait ProgressSink: Send + Sync {
    /// One report; each has a larger fraction than the one before.
    async fn report(&self, progress: &Progress);
}

impl std::fmt::Debug for dyn ProgressSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProgressSink")
    }
}

/// Takes the log messages an upstream server sends during a call while its caller waits: an
/// MCP client's `notifications/message`.
#[async_trait::async_trait]
pub trait LogSink: Send + Sync {
    /// One message.
    async fn log(&self, message: LogMessage);
}

impl std::fmt::Debug for dyn LogSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LogSink")
    }
}

/// Answers the requests an upstream server sends its caller during a call
/// (`sampling/createMessage`, `elicitation/create`): the MCP client asked on the stream of the
/// request that made the call ([`crate::mcp::asks`]).
#[async_trait::async_trait]
pub trait ClientAsker: Send + Sync {
    /// The client's answer to request `method` with `params`: the JSON-RPC result, or the error
    /// it answered with (or why it could not be asked).
    async fn ask(&self, method: &str, params: Value) -> Result<Value, rmcp::ErrorData>;
}

impl std::fmt::Debug for dyn ClientAsker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientAsker")
    }
}

/// The most log messages one call passes on to its caller; the rest are counted.
pub const MAX_LOG_MESSAGES: usize = 1000;

/// Awaits `execution` while passing the log messages `logs` gets on to `sink` (at most
/// [`MAX_LOG_MESSAGES`]), then those still queued, all before the answer. When some were not
/// passed on (over the limit, or dropped while the caller was slower than the server), a last
/// warning from logger `toolyard` says how many.
async fn relay_logs<T>(execution: impl Future<Output = T>, mut logs: LogReceiver, sink: &dyn LogSink) -> T {
    let mut count = LogCount::default();
    let mut execution = std::pin::pin!(execution);
    let outcome = loop {
        tokio::select! {
            outcome = &mut execution => break outcome,
            Some(message) = logs.recv() => count.pass(message, sink).await,
        }
    };
    while let Some(message) = logs.try_recv() {
        count.pass(message, sink).await;
    }
    let missed = count.over + logs.dropped();
    if missed > 0 {
        let text =
            format!("{missed} log message(s) of this call were not passed on (at most {MAX_LOG_MESSAGES} per call)");
        sink.log(logs::warning(text)).await;
    }
    outcome
}

/// The log messages of one call passed on, and those over [`MAX_LOG_MESSAGES`].
#[derive(Default)]
struct LogCount {
    passed: usize,
    over: usize,
}

impl LogCount {
    async fn pass(&mut self, message: LogMessage, sink: &dyn LogSink) {
        if self.passed < MAX_LOG_MESSAGES {
            self.passed += 1;
            sink.log(message).await;
        } else {
            self.over += 1;
        }
    }
}

/// Awaits `execution` while passing the reports `reports` gets on to `sink`, only those whose
/// fraction grew (MCP progress must increase), then the last one if the call ended before it
/// was passed on. A report being sent is never cut short by the call's end: it would be lost,
/// and the call's result would go out without it.
async fn relay_progress<T>(
    execution: impl Future<Output = T>,
    mut reports: tokio::sync::watch::Receiver<Option<Progress>>,
    sink: &dyn ProgressSink,
) -> T {
    let mut reported = f64::NEG_INFINITY;
    let mut execution = std::pin::pin!(execution);
    let mut open = true;
    let outcome = loop {
        tokio::select! {
            outcome = &mut execution => break outcome,
            changed = reports.changed(), if open => {
                open = changed.is_ok();
                let latest = reports.borrow_and_update().clone();
                if let Some(progress) = latest.filter(|p| p.fraction > reported) {
                    reported = progress.fraction;
                    sink.report(&progress).await;
                }
            }
        }
    };
    let last = reports.borrow().clone();
    if let Some(progress) = last.filter(|p| p.fraction > reported) {
        sink.report(&progress).await;
    }
    outcome
}

/// A call that ran: its id and the runner protocol's result (which may be a tool error).
#[derive(Debug)]
pub struct Called {
    /// The call id.
    pub id: RunId,
    /// What the tool returned.
    pub result: CallResult,
}

/// Why a call did not run, or failed in the platform.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// Unknown, outside the selection, or not allowed: the same answer for all three.
    #[error("{}", unknown_tool_message(.0))]
    UnknownTool(String),
    /// The arguments do not match the tool's input schema (each problem with its JSON pointer).
    #[error("invalid arguments: {0}")]
    InvalidArguments(String),
    /// An admission limit refused the call; retry later.
    #[error("{0}")]
    Busy(&'static str),
    /// The owner's stored files reached the storage quota (the message says what to do).
    #[error("{0}")]
    QuotaReached(String),
    /// The platform failed (authorization backend, storage, apiserver, pool).
    #[error(transparent)]
    Platform(#[from] crate::Error),
}

impl CallError {
    /// The `error.type` of the call's span.
    pub fn kind(&self) -> &'static str {
        match self {
            CallError::UnknownTool(_) => "unknown_tool",
            CallError::InvalidArguments(_) => "invalid_arguments",
            CallError::Busy(_) => "busy",
            CallError::QuotaReached(_) => "storage_quota",
            CallError::Platform(_) => "platform",
        }
    }
}

/// Longest tool name echoed back in an error.
const MAX_ECHOED_NAME: usize = 64;

/// `Unknown tool: "<name>"` (the name quoted and cut short), for unknown, unauthorized and
/// out-of-scope tools alike.
pub fn unknown_tool_message(name: &str) -> String {
    let shown: String = name.chars().take(MAX_ECHOED_NAME).collect();
    format!("Unknown tool: {shown:?}")
}

/// The call service.
#[derive(Clone)]
pub struct Calls {
    access: Access,
    executor: Arc<dyn Executor>,
    limits: Arc<Limits>,
    quota: Arc<StorageQuota>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Calls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Calls").finish_non_exhaustive()
    }
}

impl Calls {
    /// The service over these parts.
    pub fn new(
        access: Access,
        executor: Arc<dyn Executor>,
        limits: Arc<Limits>,
        quota: Arc<StorageQuota>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self { access, executor, limits, quota, metrics }
    }

    /// The per-owner storage quota calls (and tasks) are admitted under.
    pub fn quota(&self) -> &Arc<StorageQuota> {
        &self.quota
    }

    /// The access filter calls are resolved through.
    pub fn access(&self) -> &Access {
        &self.access
    }

    /// Runs one call: resolve, validate, admit, execute, count, in one `tools/call` span whose
    /// parent is the request's `traceparent` (a new trace when it has none or an invalid one).
    pub async fn call(&self, mut input: CallInput) -> Result<Called, CallError> {
        let span = tracing::info_span!(
            "tools/call",
            "otel.name" = format!("tools/call {}", input.tool),
            "otel.kind" = "server",
            "otel.status_code" = tracing::field::Empty,
            "mcp.method.name" = "tools/call",
            "gen_ai.operation.name" = "execute_tool",
            "gen_ai.tool.name" = %input.tool,
            "enduser.id" = %input.who.user,
            "toolyard.auth.issuer" = %input.who.issuer,
            "toolyard.call.id" = tracing::field::Empty,
            "toolyard.task.id" = input.parent_task.as_ref().map(tracing::field::display),
            "error.type" = tracing::field::Empty,
        );
        input.traceparent = toolyard_telemetry::continue_trace(&span, input.traceparent.take());
        let outcome = self.run(input).instrument(span.clone()).await;
        if let Err(e) = &outcome {
            toolyard_telemetry::record_error(&span, e.kind());
        }
        outcome
    }

    async fn run(&self, input: CallInput) -> Result<Called, CallError> {
        let started = Instant::now();
        let resolved = self
            .access
            .resolve(&input.who, &input.selection, &input.tool)
            .instrument(tracing::info_span!("authorize"))
            .await;
        let tool = match resolved {
            Ok(Some(tool)) => tool,
            Ok(None) => return Err(CallError::UnknownTool(input.tool)),
            Err(e) => {
                tracing::error!(error = %e, tool = %input.tool, "authorization check failed");
                return Err(e.into());
            }
        };
        let arguments = Value::Object(input.arguments);
        if let Err(problems) = tool.validate(&arguments) {
            self.metrics.tool_call(tool.name(), CallOutcome::InvalidArguments, started.elapsed());
            return Err(CallError::InvalidArguments(problems));
        }
        let Value::Object(arguments) = arguments else { unreachable!("built from an object above") };

        let owner = input.who.owner_key();
        if let Some(message) = self.quota.check(&owner).await? {
            self.metrics.admission_rejected(Rejection::StorageQuota);
            self.metrics.tool_call(tool.name(), CallOutcome::Busy, started.elapsed());
            return Err(CallError::QuotaReached(message));
        }
        // Admission takes microseconds: its refusal is the root span's `error.type` (busy).
        let elsewhere = self.executor.running_elsewhere(&owner);
        let _permit = match self.limits.try_admit_call(owner.as_str(), elsewhere) {
            Ok(permit) => permit,
            Err(rejection) => {
                self.metrics.admission_rejected(rejection);
                self.metrics.tool_call(tool.name(), CallOutcome::Busy, started.elapsed());
                return Err(CallError::Busy(match rejection {
                    Rejection::UserCalls => "too many concurrent calls for this user",
                    _ => "too many concurrent calls",
                }));
            }
        };

        let (id, task_started) = match input.task {
            Some(task) => (task.id, Some(task.started)),
            None => (new_call_id(tool.name()), None),
        };
        tracing::Span::current().record("toolyard.call.id", tracing::field::display(&id));
        // The executor's span is the parent of everything the call runs elsewhere (the
        // controller's reconcile, the runner, the function).
        let execute = tracing::info_span!("execute");
        let (progress, relay) = match input.progress {
            Some(sink) => {
                let (sender, reports) = tokio::sync::watch::channel(None);
                (Some(sender), Some((reports, sink)))
            }
            None => (None, None),
        };
        // Only an upstream server's tool has log messages to pass on.
        let (logs, log_relay) = match input.logs.filter(|_| tool.upstream.is_some()) {
            Some(sink) => {
                let (sender, receiver) = logs::channel();
                (Some(sender), Some((receiver, sink)))
            }
            None => (None, None),
        };
        let request = CallRequest {
            id: id.clone(),
            tool: tool.clone(),
            caller: input.who,
            arguments,
            traceparent: toolyard_telemetry::pass_on(&execute, input.traceparent),
            parent_task: input.parent_task,
            cancel: input.cancel,
            cancel_key: input.cancel_key,
            progress,
            logs,
            // Only an upstream server's tool has requests for its caller.
            asker: input.asker.filter(|_| tool.upstream.is_some()),
            accepted_at: jiff::Timestamp::now(),
            task_started,
        };
        self.metrics.calls_in_flight().inc();
        // An upstream server's tool runs on its server's connection, every other on the executor.
        let executor = tool.upstream.as_ref().map_or(&self.executor, |u| &u.executor);
        let execution = executor.call(request).instrument(execute);
        let execution = async {
            match relay {
                Some((reports, sink)) => relay_progress(execution, reports, sink.as_ref()).await,
                None => execution.await,
            }
        };
        let outcome = match log_relay {
            Some((receiver, sink)) => relay_logs(execution, receiver, sink.as_ref()).await,
            None => execution.await,
        };
        self.metrics.calls_in_flight().dec();
        self.count(&tool, &outcome, started);
        match outcome {
            Ok(result) => Ok(Called { id, result }),
            Err(e) => Err(e.into()),
        }
    }

    /// Counts and logs a finished call.
    fn count(&self, tool: &Tool, outcome: &crate::Result<CallResult>, started: Instant) {
        let counted = match outcome {
            Ok(result) => match result.error.as_ref().map(|e| e.kind) {
                None => CallOutcome::Success,
                Some(CallErrorKind::TimedOut) => CallOutcome::TimedOut,
                Some(CallErrorKind::Cancelled) => CallOutcome::Cancelled,
                Some(_) => CallOutcome::ToolError,
            },
            Err(crate::Error::Busy(_)) => {
                // Admission limits answered before the call ran; this is the executor's: the
                // tool's warm pool was full.
                self.metrics.admission_rejected(Rejection::PoolBusy);
                CallOutcome::Busy
            }
            Err(_) => CallOutcome::Error,
        };
        self.metrics.tool_call(tool.name(), counted, started.elapsed());
        // A platform failure is recorded by `call` (as `platform`); here only the tool's own.
        if outcome.is_ok() && counted != CallOutcome::Success {
            let span = tracing::Span::current();
            toolyard_telemetry::record_error(&span, counted.as_str());
        }
        match outcome {
            Ok(_) => tracing::info!(
                outcome = counted.as_str(),
                elapsed_ms = started.elapsed().as_millis() as u64,
                "call finished"
            ),
            Err(e) => tracing::error!(error = %e, "call failed in the platform"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// Records each report; each takes a while to send, and says when it starts.
    struct SlowSink {
        sent: Mutex<Vec<f64>>,
        started: tokio::sync::Notify,
    }

    #[async_trait::async_trait]
    impl ProgressSink for SlowSink {
        async fn report(&self, progress: &Progress) {
            self.started.notify_one();
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            self.sent.lock().unwrap().push(progress.fraction);
        }
    }

    #[tokio::test]
    async fn a_report_being_sent_when_the_call_ends_is_sent_and_the_last_follows() {
        let sink = SlowSink { sent: Mutex::default(), started: tokio::sync::Notify::new() };
        let (sender, reports) = tokio::sync::watch::channel(None);
        let execution = async {
            sender.send_replace(Some(Progress { fraction: 0.5, message: None }));
            // The call ends while 0.5 is being sent, after its last report.
            sink.started.notified().await;
            sender.send_replace(Some(Progress { fraction: 1.0, message: None }));
            "answer"
        };
        let outcome = relay_progress(execution, reports, &sink).await;
        assert_eq!(outcome, "answer");
        assert_eq!(*sink.sent.lock().unwrap(), [0.5, 1.0], "no report lost, none repeated");
    }

    /// Records each log message's data.
    #[derive(Default)]
    struct Messages(Mutex<Vec<Value>>);

    #[allow(deprecated)]
    #[async_trait::async_trait]
    impl LogSink for Messages {
        async fn log(&self, message: LogMessage) {
            self.0.lock().unwrap().push(message.data);
        }
    }

    #[allow(deprecated)]
    fn info(n: usize) -> LogMessage {
        LogMessage::new(rmcp::model::LoggingLevel::Info, Value::from(n))
    }

    #[tokio::test]
    async fn log_messages_reach_the_caller_before_the_answer_and_a_flood_is_capped_and_counted() {
        let sink = Messages::default();
        let (sender, receiver) = logs::channel();
        let execution = async {
            for n in 0..3 {
                sender.send(info(n));
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            // The last ones arrive with the answer, still queued when the call ends.
            sender.send(info(3));
            "answer"
        };
        assert_eq!(relay_logs(execution, receiver, &sink).await, "answer");
        assert_eq!(*sink.0.lock().unwrap(), [0, 1, 2, 3].map(Value::from), "all of them, in order");

        let sink = Messages::default();
        let (sender, receiver) = logs::channel();
        let execution = async {
            for n in 0..MAX_LOG_MESSAGES + 500 {
                sender.send(info(n));
                // The caller keeps up: nothing finds the queue full.
                tokio::task::yield_now().await;
            }
        };
        relay_logs(execution, receiver, &sink).await;
        let sent = sink.0.lock().unwrap();
        assert_eq!(sent.len(), MAX_LOG_MESSAGES + 1, "the limit, then one warning");
        let warning = sent.last().unwrap().as_str().unwrap();
        assert!(warning.starts_with("500 log message(s) of this call were not passed on"), "{warning}");
    }

    #[tokio::test]
    async fn reports_that_do_not_grow_are_not_passed_on() {
        let sink = SlowSink { sent: Mutex::default(), started: tokio::sync::Notify::new() };
        let (sender, reports) = tokio::sync::watch::channel(None);
        let execution = async {
            for fraction in [0.2, 0.1, 0.2, 0.6] {
                sender.send_replace(Some(Progress { fraction, message: None }));
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            drop(sender);
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        };
        relay_progress(execution, reports, &sink).await;
        assert_eq!(*sink.sent.lock().unwrap(), [0.2, 0.6]);
    }
}

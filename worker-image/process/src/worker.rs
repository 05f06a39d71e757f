//! A reused worker process: the tool command started once with `TOOLYARD_PROTOCOL=jsonl`,
//! answering one request line per call (see `toolyard/run.py`).
//!
//! The worker owns its stdout for the protocol; what the function prints goes to its stderr,
//! which is captured and handed out per call. A worker that dies, hangs past a call's
//! deadline or breaks the protocol is killed with its process group and replaced.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};
use toolyard_api::protocol::{CallErrorKind, CallResult, env};

use crate::capture::{Capture, Captured};
use crate::child::{ProcessGroup, StopReason, TempDir, ToolCommand};
use crate::outcome::{Exit, MAX_RESULT_BYTES, signal_name};
use crate::outputs::{self, Output};

/// Longest answer line accepted (the result plus its envelope).
const MAX_LINE: u64 = MAX_RESULT_BYTES + 64 * 1024;

/// A started worker process.
#[derive(Debug)]
pub struct Worker {
    child: Child,
    group: ProcessGroup,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    stderr: Capture,
    /// The task reading stderr; awaited (bounded) once the process died, for its last line.
    stderr_drained: Option<tokio::task::JoinHandle<()>>,
    /// The worker's private folder; each call's output folder is a numbered path in it, made
    /// by the `toolyard` package only when the call returns a file.
    outputs: TempDir,
    calls: u64,
}

/// One request line of the jsonl protocol.
#[derive(Serialize)]
struct Request<'a> {
    id: &'a str,
    arguments: &'a Map<String, Value>,
    /// The W3C trace context of the call, for the function's span.
    #[serde(skip_serializing_if = "Option::is_none")]
    traceparent: Option<&'a str>,
    /// The caller, for a tool with `callerIdentity: true` (`toolyard.caller()` during this call).
    #[serde(skip_serializing_if = "Option::is_none")]
    caller: Option<&'a toolyard_api::Owner>,
    /// Where the call's returned files go (`TOOLYARD_OUTPUT_DIR` during this call).
    #[serde(rename = "outputDir")]
    output_dir: &'a std::path::Path,
}

/// One answer line of the jsonl protocol.
#[derive(Debug, Deserialize)]
struct Answer {
    #[serde(default)]
    id: Option<String>,
    ok: bool,
    #[serde(default)]
    result: Option<Value>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

/// What one call on a worker produced.
#[derive(Debug)]
pub struct WorkerCall {
    /// The outcome.
    pub result: CallResult,
    /// The files it returned (listed in `result.files`).
    pub files: Vec<Output>,
    /// What the function printed during the call.
    pub stderr: Captured,
    /// False when the worker must be replaced (it died, hung or broke the protocol).
    pub reusable: bool,
}

impl Worker {
    /// Starts the command and waits for its `{"ready": true}` line.
    pub async fn start(tool: &ToolCommand, startup_timeout: Duration, log_limit: usize) -> Result<Self, String> {
        let mut command = tool.command()?;
        command
            .env(env::PROTOCOL, "jsonl")
            .env_remove(env::RESULT_FILE)
            .env_remove(env::ERROR_FILE)
            .env_remove(env::OUTPUT_DIR)
            .env_remove(env::TRACEPARENT);
        let program = tool.program();
        let outputs =
            TempDir::new("toolyard-outputs").map_err(|e| format!("cannot create the worker's output folder: {e}"))?;
        let mut child = command.spawn().map_err(|e| format!("cannot start the worker command {program:?}: {e}"))?;
        let group = ProcessGroup::new(child.id());
        let (Some(stdin), Some(stdout), Some(stderr_pipe)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err("the worker's pipes are missing".into());
        };
        let stderr = Capture::new(log_limit);
        let stderr_drained = Some(tokio::spawn({
            let stderr = stderr.clone();
            async move { stderr.drain(stderr_pipe).await }
        }));
        let mut worker =
            Self { child, group, stdin, stdout: BufReader::new(stdout), stderr, stderr_drained, outputs, calls: 0 };

        let line = tokio::time::timeout(startup_timeout, worker.read_line()).await;
        let failure = match line {
            Err(_) => format!("the worker did not report ready within {}s", startup_timeout.as_secs()),
            Ok(Err(e)) => worker.death_message(&e).await,
            Ok(Ok(line)) => match serde_json::from_slice::<Value>(&line) {
                Ok(v) if v.get("ready") == Some(&Value::Bool(true)) => {
                    // Start-up output is not part of the first call's logs.
                    let startup = worker.stderr.take();
                    if !startup.bytes.is_empty() {
                        tracing::debug!(bytes = startup.bytes.len(), "worker wrote to stderr while starting");
                    }
                    return Ok(worker);
                }
                Ok(v) => match v.get("error").and_then(Value::as_str) {
                    Some(e) => format!("the worker could not start: {e}"),
                    None => "the worker's first line was not {\"ready\": true}".into(),
                },
                Err(_) => {
                    "the worker's first line was not protocol JSON (is the command a toolyard.run worker?)".into()
                }
            },
        };
        Err(failure)
    }

    /// True while the process runs.
    pub fn is_alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Runs one call; the worker must be dropped when the answer says it is not reusable.
    pub async fn call(&mut self, call: &crate::pool::PoolCall<'_>) -> WorkerCall {
        let crate::pool::PoolCall { id, arguments, traceparent, caller, timeout, progress, owner: _ } = *call;
        let started = Instant::now();
        let ms = move || u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.stderr.take();
        // Not created here: most calls return no file, and a folder made and removed per call
        // cost more than the rest of the call's file work.
        self.calls += 1;
        let output_dir = self.outputs.path().join(self.calls.to_string());
        let output_dir = output_dir.as_path();
        let exchange = async {
            let request = Request { id, arguments, traceparent, caller, output_dir };
            let mut line = serde_json::to_vec(&request).map_err(|e| e.to_string())?;
            line.push(b'\n');
            self.stdin.write_all(&line).await.map_err(|e| format!("cannot write to the worker: {e}"))?;
            self.stdin.flush().await.map_err(|e| format!("cannot write to the worker: {e}"))?;
            // Progress lines of this call come first, then its answer.
            loop {
                let line = self.read_line().await?;
                match serde_json::from_slice::<Answer>(&line) {
                    Ok(answer) => return Ok::<_, String>(Some(answer)),
                    Err(_) if is_progress_of(&line, id) => {
                        if let Some(reporter) = progress
                            && let Some(reported) = crate::progress::parse_line(&line)
                        {
                            reporter.report(reported);
                        }
                    }
                    Err(_) => return Ok(None),
                }
            }
        };
        let answer = tokio::time::timeout(timeout, exchange).await;
        let (mut result, reusable) = match answer {
            Err(_) => {
                self.group.kill();
                (CallResult::err(CallErrorKind::TimedOut, StopReason::Deadline(timeout).message(), None, ms()), false)
            }
            Ok(Err(e)) => {
                let message = self.death_message(&e).await;
                (CallResult::err(CallErrorKind::Crashed, message, None, ms()), false)
            }
            Ok(Ok(answer)) => match answer {
                Some(answer) if answer.id.as_deref() == Some(id) => (answer_result(answer, ms()), true),
                Some(answer) if answer.kind.as_deref() == Some("protocol") => {
                    let message = format!("worker protocol error: {}", answer.error.unwrap_or_default());
                    (CallResult::err(CallErrorKind::ToolError, message, None, ms()), false)
                }
                _ => {
                    let message = "the worker answered with a line that is not a protocol answer for this call";
                    (CallResult::err(CallErrorKind::BadResult, message, None, ms()), false)
                }
            },
        };
        if !reusable {
            self.group.kill();
        }
        // Give the stderr reader a moment to catch what was printed just before the answer.
        tokio::task::yield_now().await;
        let files = outputs::finish(&mut result, output_dir);
        let _ = std::fs::remove_dir_all(output_dir);
        WorkerCall { result, files, stderr: self.stderr.take(), reusable }
    }

    /// Reads one line (without the newline), bounded by [`MAX_LINE`].
    async fn read_line(&mut self) -> Result<Vec<u8>, String> {
        let mut line = Vec::new();
        let n = (&mut self.stdout)
            .take(MAX_LINE)
            .read_until(b'\n', &mut line)
            .await
            .map_err(|e| format!("cannot read from the worker: {e}"))?;
        if n == 0 {
            return Err("the worker closed its output".into());
        }
        if line.last() != Some(&b'\n') {
            return Err(if n as u64 >= MAX_LINE {
                format!("the worker's answer is longer than {MAX_LINE} bytes")
            } else {
                "the worker closed its output in the middle of a line".into()
            });
        }
        line.pop();
        Ok(line)
    }

    /// Why the worker stopped answering: its exit status if it ended, else `fallback`.
    async fn death_message(&mut self, fallback: &str) -> String {
        self.group.kill();
        let status = tokio::time::timeout(Duration::from_secs(2), self.child.wait()).await;
        let how = match status {
            Ok(Ok(status)) => match Exit::from_status(status) {
                Exit::Code(code) => format!("the worker process exited with status {code}"),
                Exit::Signal(signal) => format!("the worker process was killed by signal {}", signal_name(signal)),
            },
            _ => fallback.to_owned(),
        };
        // The process is gone: its last words are in the pipe until the reader sees its end
        // (bounded: a process outside the group may still hold the pipe open).
        if let Some(drained) = self.stderr_drained.take() {
            let _ = tokio::time::timeout(Duration::from_secs(1), drained).await;
        }
        match self.stderr.take().last_line() {
            Some(line) => format!("{how}; last line of its stderr: {line}"),
            None => how,
        }
    }
}

/// A progress line of call `id`: `{"id": id, "progress": ...}` without `ok`.
fn is_progress_of(line: &[u8], id: &str) -> bool {
    #[derive(Deserialize)]
    struct Line<'a> {
        #[serde(borrow)]
        id: Option<std::borrow::Cow<'a, str>>,
        ok: Option<serde::de::IgnoredAny>,
        progress: Option<serde::de::IgnoredAny>,
    }
    serde_json::from_slice::<Line<'_>>(line)
        .is_ok_and(|l| l.ok.is_none() && l.progress.is_some() && l.id.as_deref() == Some(id))
}

fn answer_result(answer: Answer, ms: u64) -> CallResult {
    if answer.ok {
        return CallResult::ok(answer.result.unwrap_or(Value::Null), ms);
    }
    let kind = match answer.kind.as_deref() {
        Some("invalid_arguments") => CallErrorKind::InvalidArguments,
        Some("bad_result") => CallErrorKind::BadResult,
        _ => CallErrorKind::ToolError,
    };
    CallResult::err(kind, answer.error.unwrap_or_else(|| "the tool failed without a message".into()), None, ms)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn progress_lines_are_told_from_answers() {
        assert!(is_progress_of(br#"{"id":"c1","progress":0.5,"message":"half"}"#, "c1"));
        assert!(!is_progress_of(br#"{"id":"c2","progress":0.5}"#, "c1"), "another call's");
        assert!(!is_progress_of(br#"{"id":"c1","ok":true,"progress":0.5}"#, "c1"), "an answer");
        assert!(!is_progress_of(br#"{"id":"c1"}"#, "c1"));
        assert!(!is_progress_of(b"progress", "c1"));
    }

    #[test]
    fn answer_kinds_map_to_error_kinds() {
        let a: Answer =
            serde_json::from_str(r#"{"id":"1","ok":false,"kind":"invalid_arguments","error":"spot: missing"}"#)
                .unwrap();
        let r = answer_result(a, 1);
        assert_eq!(r.error.unwrap().kind, CallErrorKind::InvalidArguments);
        let a: Answer = serde_json::from_str(r#"{"id":"1","ok":true,"result":{"x":1}}"#).unwrap();
        assert_eq!(answer_result(a, 1).value, Some(json!({"x": 1})));
        let a: Answer =
            serde_json::from_str(r#"{"id":"1","ok":false,"kind":"error","error":"RuntimeError: x"}"#).unwrap();
        assert_eq!(answer_result(a, 1).error.unwrap().kind, CallErrorKind::ToolError);
    }
}

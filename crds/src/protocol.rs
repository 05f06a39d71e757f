//! The runner protocol: what a runner process gets in its environment, the gateway's
//! internal API it talks to, and the JSON documents it exchanges.
//!
//! The same contract holds in a Job pod, a warm pool pod and a local child process.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Environment variable names.
pub mod env {
    /// Base URL of the gateway's internal API, e.g. `http://toolyard-gateway-internal:8081`.
    pub const GATEWAY_URL: &str = "TOOLYARD_GATEWAY_URL";
    /// The call- or task-scoped token (see [`crate::token`]).
    pub const TOKEN: &str = "TOOLYARD_TOKEN";
    /// The call or task id.
    pub const RUN_ID: &str = "TOOLYARD_RUN_ID";
    /// W3C trace context of the request that started the run.
    pub const TRACEPARENT: &str = "TRACEPARENT";
    /// Set for the tool command: where it writes its JSON result.
    pub const RESULT_FILE: &str = "TOOLYARD_RESULT_FILE";
    /// Set for the tool command: where it may write a short error message.
    pub const ERROR_FILE: &str = "TOOLYARD_ERROR_FILE";
    /// Set to `jsonl` for a reused worker process (Pool mode with `reuseProcess`).
    pub const PROTOCOL: &str = "TOOLYARD_PROTOCOL";
    /// Set for the tool command (file protocol): where it may append [`super::Progress`]
    /// reports, one JSON object per line (`toolyard.progress(...)` does).
    pub const PROGRESS_FILE: &str = "TOOLYARD_PROGRESS_FILE";
    /// Set for the tool command when its McpTool asks for the caller's identity
    /// (`callerIdentity: true`): the caller as JSON, `{"issuer", "user", "groups"}`, as the
    /// gateway authenticated it (a reused jsonl worker gets it per request instead).
    pub const CALLER: &str = "TOOLYARD_CALLER";
    /// Set for the tool command: a folder where `toolyard.image()` and `toolyard.file()` put
    /// the files the call returns (see [`super::outputs`]); a reused jsonl worker gets it per
    /// request (`outputDir`) instead.
    pub const OUTPUT_DIR: &str = "TOOLYARD_OUTPUT_DIR";
}

/// Files a call returns besides its value: images (returned to the caller as MCP image
/// content) and other files, stored as the caller's under `calls/<id>/outputs/<name>`.
///
/// The function writes each file to `<OUTPUT_DIR>/files/<name>` and appends a line
/// `{"name", "mimeType", "image"}` to `<OUTPUT_DIR>/manifest.jsonl`; the runner checks every
/// entry against the limits below (the function is not trusted) and lists the files in the
/// call's [`CallResult::files`].
pub mod outputs {
    use serde::{Deserialize, Serialize};

    /// Most files one call returns.
    pub const MAX_FILES: usize = 32;
    /// Largest file in bytes.
    pub const MAX_FILE_BYTES: u64 = 8 * 1024 * 1024;
    /// Most bytes of all of a call's files together.
    pub const MAX_TOTAL_BYTES: u64 = 32 * 1024 * 1024;
    /// Largest image returned inline as MCP image content (larger ones only as a link).
    pub const MAX_INLINE_IMAGE_BYTES: u64 = 1024 * 1024;
    /// The image types a call may return as images.
    pub const IMAGE_TYPES: [&str; 4] = ["image/png", "image/jpeg", "image/gif", "image/webp"];
    /// The manifest's file name in the output folder.
    pub const MANIFEST: &str = "manifest.jsonl";
    /// The folder of the files in the output folder.
    pub const FILES: &str = "files";

    /// One returned file, as the call's result lists it.
    #[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct OutputFile {
        /// Its path under the call's `outputs/` (a relative path, see
        /// [`crate::storage::RelativePath`]).
        pub name: String,
        /// Its media type, e.g. `image/png` or `text/csv`.
        pub mime_type: String,
        /// Size in bytes.
        pub size: u64,
        /// Returned as an image (one of [`IMAGE_TYPES`]).
        #[serde(default)]
        pub image: bool,
    }

    /// Whether `s` is a media type: `type/subtype`, each a token of letters, digits and
    /// `!#$&^_.+-`, with no parameters.
    pub fn is_media_type(s: &str) -> bool {
        let token = |t: &str| {
            !t.is_empty() && t.len() <= 127 && t.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$&^_.+-".contains(&b))
        };
        s.split_once('/').is_some_and(|(kind, sub)| token(kind) && token(sub))
    }
}

/// Exit codes of the tool command, as the Python function runner uses them.
pub mod exit_code {
    /// The result file holds the result.
    pub const OK: i32 = 0;
    /// The function raised; the error file says what.
    pub const TOOL_ERROR: i32 = 1;
    /// The arguments did not fit the function.
    pub const INVALID_ARGUMENTS: i32 = 2;
    /// The result could not be encoded as JSON (e.g. NaN).
    pub const BAD_RESULT: i32 = 3;
}

/// Exit codes of `toolyard-runner call` (what the Job's pod reports). The runner also writes a
/// one-line summary to the pod's termination message (`/dev/termination-log`).
pub mod runner_exit {
    /// The tool succeeded and its result was uploaded.
    pub const OK: i32 = 0;
    /// The tool failed (error, invalid arguments, bad result, crash) and the error result was uploaded.
    pub const TOOL_FAILED: i32 = 1;
    /// The tool was stopped at its deadline (or by SIGTERM) and a timeout result was uploaded.
    pub const TIMED_OUT: i32 = 3;
    /// The runner itself could not work: bad environment, internal API unreachable, upload refused.
    pub const RUNNER_ERROR: i32 = 4;
}

/// `toolyard-runner bridge`: the network side of a `runtime` McpServer that speaks MCP on
/// stdio. On each TCP connection the bridge first sends a random nonce line; the client answers
/// with the nonce's proof under the server's derived key (`SigningKey::prove`), and only then
/// does the bridge start one process of the server's command. From then on the connection
/// carries the process's stdin and stdout: newline-delimited JSON-RPC, MCP's stdio transport.
pub mod bridge {
    /// Port the bridge listens on.
    pub const PORT: u16 = 8080;
    /// Longest answer line (the proof) the bridge reads.
    pub const MAX_KEY_LINE: usize = 256;

    /// Environment of `toolyard-runner bridge`.
    pub mod env {
        /// The server's derived key, hex-encoded (`SigningKey::to_hex`); not passed on to the
        /// command.
        pub const KEY: &str = "TOOLYARD_BRIDGE_KEY";
    }

    /// Purpose string for deriving the key of one McpServer from the shared signing key.
    pub fn key_purpose(namespace: &str, server: &str) -> String {
        format!("mcp-server/{namespace}/{server}")
    }
}

/// The HTTP API of `toolyard-runner serve` (a warm pool pod, or a local warm worker).
///
/// The gateway posts a [`PoolCallRequest`](pool::PoolCallRequest) with `Authorization: Bearer <token>`, a call token
/// signed with the pool's derived key (`SigningKey::derive(&pool_key_purpose(ns, tool))`), so a
/// pool pod holds no key that the internal API accepts. The answer is a [`PoolCallResponse`](pool::PoolCallResponse).
/// `503` with `Retry-After` when every slot and the bounded queue are full.
pub mod pool {
    use serde::{Deserialize, Serialize};
    use serde_json::{Map, Value};

    use super::CallResult;

    /// `POST`: run one call.
    pub const CALL_PATH: &str = "/v1/call";
    /// `GET`: 200 once the worker processes are up.
    pub const READY_PATH: &str = "/readyz";
    /// Default port of the pool server.
    pub const DEFAULT_PORT: u16 = 8080;

    /// Environment of `toolyard-runner serve`.
    pub mod env {
        /// The pool's derived key, hex-encoded (`SigningKey::to_hex`).
        pub const KEY: &str = "TOOLYARD_POOL_KEY";
        /// A file holding the pool's derived key, hex-encoded (e.g. a mounted Secret key).
        pub const KEY_FILE: &str = "TOOLYARD_POOL_KEY_FILE";
        /// Calls one server runs at once (the McpTool's `pool.concurrency`).
        pub const CONCURRENCY: &str = "TOOLYARD_POOL_CONCURRENCY";
        /// `true`: one long-lived worker per slot (the McpTool's `pool.reuseProcess`).
        pub const REUSE: &str = "TOOLYARD_POOL_REUSE";
        /// Calls that may wait for a slot (the McpTool's `pool.queue`, or its default).
        pub const QUEUE: &str = "TOOLYARD_POOL_QUEUE";
    }

    /// Suffix of the name of a Pool-mode McpTool's Deployment and Service.
    pub const SERVICE_SUFFIX: &str = "-pool";
    /// Name of the serving port of the pool's Service (and of its pods' container port).
    pub const PORT_NAME: &str = "http";
    /// Label on the pool's Deployment, pods and Service (Kubernetes copies a Service's labels
    /// to its EndpointSlices), with the value [`COMPONENT`].
    pub const COMPONENT_LABEL: &str = "toolyard.dev/component";
    /// Value of [`COMPONENT_LABEL`] on a warm pool's objects.
    pub const COMPONENT: &str = "pool";

    /// Name of the Deployment and Service of the warm pool of McpTool `mcptool`.
    pub fn service_name(mcptool: &str) -> String {
        format!("{mcptool}{SERVICE_SUFFIX}")
    }

    /// Purpose string for deriving the key of one pool from the shared signing key.
    pub fn key_purpose(namespace: &str, mcptool: &str) -> String {
        format!("pool/{namespace}/{mcptool}")
    }

    /// One call sent to a pool.
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct PoolCallRequest {
        /// Call id; must equal the token's `id`.
        pub id: String,
        /// Validated arguments.
        pub arguments: Map<String, Value>,
        /// Hard limit of this call in milliseconds.
        pub timeout_ms: u64,
        /// W3C trace context.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub traceparent: Option<String>,
        /// The caller, for a tool with `callerIdentity: true` (see [`super::env::CALLER`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub caller: Option<crate::Owner>,
    }

    /// The pool's answer: the result plus the call's bounded logs.
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct PoolCallResponse {
        /// The outcome.
        pub result: CallResult,
        /// Captured standard output (bounded, may be cut).
        #[serde(default)]
        pub stdout: String,
        /// Captured standard error (bounded, may be cut).
        #[serde(default)]
        pub stderr: String,
        /// The function's progress reports ([`super::call_event::PROGRESS`] events), the
        /// latest ones when there were more than [`super::MAX_PROGRESS_EVENTS`].
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub progress: Vec<super::Event>,
        /// The bytes of the files the result lists ([`CallResult::files`]), base64, in the
        /// same order.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub files: Vec<String>,
    }

    /// Why a pool did not run a call: the `reason` of its 503 answer ([`PoolRefusal`]).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "snake_case")]
    pub enum Refused {
        /// Every slot and the queue were taken when the call came.
        Busy,
        /// The call waited, and gave its place to a call of an owner with fewer waiting
        /// (its own owner had the most calls waiting).
        PushedOut,
        /// The server is shutting down.
        ShuttingDown,
    }

    impl std::fmt::Display for Refused {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(match self {
                Refused::Busy => "every slot and the queue are busy",
                Refused::PushedOut => {
                    "the queue was full: this call gave its place to a call of an owner with fewer calls waiting"
                }
                Refused::ShuttingDown => "the pool is shutting down",
            })
        }
    }

    impl std::error::Error for Refused {}

    /// The body of a pool's 503 answer (sent with `Retry-After`).
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    pub struct PoolRefusal {
        /// What happened, for people.
        pub error: String,
        /// What happened, for the gateway.
        pub reason: Refused,
    }
}

/// Paths of the gateway's internal API (a separate listener, reachable only from runners).
pub mod path {
    /// Prefix of every internal route.
    pub const PREFIX: &str = "/internal/v1";

    /// `GET`: the call's arguments (a JSON object).
    pub fn call_input(id: &str) -> String {
        format!("{PREFIX}/calls/{id}/input")
    }
    /// `PUT`: the call's [`super::CallResult`].
    pub fn call_result(id: &str) -> String {
        format!("{PREFIX}/calls/{id}/result")
    }
    /// `PUT`: a log stream (`stdout` or `stderr`) of the call, raw bytes.
    pub fn call_log(id: &str, stream: &str) -> String {
        format!("{PREFIX}/calls/{id}/logs/{stream}")
    }
    /// `POST`: lifecycle [`super::Event`]s of a call or task (`kind` is `calls` or `tasks`).
    pub fn events(kind: &str, id: &str) -> String {
        format!("{PREFIX}/{kind}/{id}/events")
    }
    /// `PUT`: a file the call returned (see [`super::outputs`]), raw bytes; before its result.
    pub fn call_output(id: &str, name: &str) -> String {
        format!("{PREFIX}/calls/{id}/outputs/{name}")
    }
    /// `PUT` / `GET`: a task's artifact under `outputs/`. The other task routes are in
    /// [`crate::agent::path`].
    pub fn task_output(id: &str, artifact: &str) -> String {
        format!("{PREFIX}/tasks/{id}/outputs/{artifact}")
    }
}

/// Why a call did not produce a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallErrorKind {
    /// The tool reported a failure (it raised, or exited non-zero).
    ToolError,
    /// The tool refused its arguments.
    InvalidArguments,
    /// The result file was missing, not JSON, or held NaN/Infinity.
    BadResult,
    /// The tool was killed by a signal.
    Crashed,
    /// The deadline passed.
    TimedOut,
    /// The tool command could not be started.
    SpawnFailed,
    /// The run was cancelled.
    Cancelled,
}

/// The outcome of a failed call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallError {
    /// Classification.
    pub kind: CallErrorKind,
    /// A message for the user: the tool's own message when it gave one.
    pub message: String,
}

/// What the runner uploads when a call ends (`result.json` of the call).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CallResult {
    /// The JSON value the tool wrote, when it succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Value>,
    /// The failure, when it did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<CallError>,
    /// Exit code of the tool command, when it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Wall time of the tool command in milliseconds.
    #[serde(default)]
    pub duration_ms: u64,
    /// The files the call returned (see [`outputs`]), stored under `calls/<id>/outputs/`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<outputs::OutputFile>,
    /// The MCP `CallToolResult` as an upstream MCP server answered it (content blocks,
    /// `structuredContent`, `isError`), passed on to the MCP caller unchanged; `value` and
    /// `error` then say the same for callers that are not MCP clients (a coding task's code).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp: Option<Value>,
}

impl CallResult {
    /// A successful result.
    pub fn ok(value: Value, duration_ms: u64) -> Self {
        Self { value: Some(value), error: None, exit_code: Some(0), duration_ms, files: Vec::new(), mcp: None }
    }

    /// A failed result.
    pub fn err(kind: CallErrorKind, message: impl Into<String>, exit_code: Option<i32>, duration_ms: u64) -> Self {
        Self {
            value: None,
            error: Some(CallError { kind, message: message.into() }),
            exit_code,
            duration_ms,
            files: Vec::new(),
            mcp: None,
        }
    }

    /// True when the call failed.
    pub fn is_error(&self) -> bool {
        self.error.is_some()
    }
}

/// MCP `structuredContent` for a tool result value: objects as they are, anything else as
/// `{"result": value}` (the generated `outputSchema` describes the same wrapping).
pub fn structured_content(value: &Value) -> serde_json::Map<String, Value> {
    match value {
        Value::Object(map) => map.clone(),
        other => {
            let mut map = serde_json::Map::new();
            map.insert("result".into(), other.clone());
            map
        }
    }
}

/// Types of a direct call's lifecycle events (`calls/<id>/events/`).
pub mod call_event {
    /// The gateway admitted the call (`data`: `tool`, `mode`).
    pub const ACCEPTED: &str = "call_accepted";
    /// The function started (written by the runner, or by the gateway for pool calls).
    pub const STARTED: &str = "call_started";
    /// The function reported progress (`data`: `fraction`, `message`).
    pub const PROGRESS: &str = "call_progress";
    /// The call ended (`data`: `outcome`, `durationMs`, `error`).
    pub const FINISHED: &str = "call_finished";
}

/// Most progress events kept for one call (the latest; a pool call returns at most these).
pub const MAX_PROGRESS_EVENTS: usize = 64;

/// Longest progress message kept, in characters.
pub const MAX_PROGRESS_MESSAGE: usize = 200;

/// A function's progress report: how far it is (0 to 1) and, optionally, what it does.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// Done so far, from 0 to 1.
    pub fraction: f64,
    /// A short sentence for the caller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl Progress {
    /// Reads a report written by a function: `{"progress": <0..1>, "message": "..."}` (the
    /// jsonl protocol's line and the progress file's line have this shape). `None` for
    /// anything else: a fraction that is not a number from 0 to 1, a message that is not a
    /// string. The message is cut to [`MAX_PROGRESS_MESSAGE`] characters, control characters
    /// replaced by spaces.
    pub fn from_report(report: &Value) -> Option<Self> {
        let fraction = report.get("progress")?.as_f64().filter(|f| (0.0..=1.0).contains(f))?;
        let message = match report.get("message") {
            None | Some(Value::Null) => None,
            Some(Value::String(m)) => {
                Some(m.chars().take(MAX_PROGRESS_MESSAGE).map(|c| if c.is_control() { ' ' } else { c }).collect())
            }
            Some(_) => return None,
        };
        Some(Self { fraction, message })
    }

    /// The [`call_event::PROGRESS`] event of this report, at `time`.
    pub fn event(&self, time: String) -> Event {
        let data = serde_json::to_value(self).unwrap_or(Value::Null);
        Event { time, type_: call_event::PROGRESS.to_owned(), data }
    }

    /// The report a [`call_event::PROGRESS`] event holds.
    pub fn of_event(event: &Event) -> Option<Self> {
        if event.type_ != call_event::PROGRESS {
            return None;
        }
        let fraction = event.data.get("fraction")?.as_f64().filter(|f| (0.0..=1.0).contains(f))?;
        let message = event.data.get("message").and_then(Value::as_str).map(str::to_owned);
        Some(Self { fraction, message })
    }
}

/// One lifecycle event, as stored in `events/<segment>.jsonl`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// RFC 3339 time.
    pub time: String,
    /// Event type, e.g. `tool_call_started`.
    #[serde(rename = "type")]
    pub type_: String,
    /// Event details (never secrets or argument values of other users).
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub data: Value,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn progress_reports_are_checked_and_cut() {
        let p = Progress::from_report(&json!({"progress": 0.5, "message": "half\nway"})).unwrap();
        assert_eq!(p, Progress { fraction: 0.5, message: Some("half way".into()) });
        assert_eq!(Progress::of_event(&p.event("t".into())), Some(p));
        assert_eq!(Progress::from_report(&json!({"progress": 1})).unwrap().fraction, 1.0);
        let long = Progress::from_report(&json!({"progress": 0, "message": "x".repeat(1000)})).unwrap();
        assert_eq!(long.message.unwrap().len(), MAX_PROGRESS_MESSAGE);
        for bad in [
            json!({"progress": 1.5}),
            json!({"progress": -0.1}),
            json!({"progress": "0.5"}),
            json!({"progress": 0.5, "message": 3}),
            json!({"message": "no fraction"}),
        ] {
            assert_eq!(Progress::from_report(&bad), None, "{bad}");
        }
    }

    #[test]
    fn call_result_json_shape_is_stable() {
        let ok = CallResult::ok(json!({"price": 10.45}), 12);
        assert_eq!(
            serde_json::to_value(&ok).unwrap(),
            json!({"value": {"price": 10.45}, "exitCode": 0, "durationMs": 12})
        );
        let err = CallResult::err(CallErrorKind::TimedOut, "timed out after 2s", None, 2000);
        assert_eq!(
            serde_json::to_value(&err).unwrap(),
            json!({"error": {"kind": "timed_out", "message": "timed out after 2s"}, "durationMs": 2000})
        );
        assert!(err.is_error());
    }

    #[test]
    fn non_object_values_are_wrapped() {
        assert_eq!(Value::Object(structured_content(&json!(3.5))), json!({"result": 3.5}));
        assert_eq!(Value::Object(structured_content(&json!({"a": 1}))), json!({"a": 1}));
    }

    #[test]
    fn paths() {
        assert_eq!(path::call_input("c1"), "/internal/v1/calls/c1/input");
        assert_eq!(path::task_output("t1", "a/b.csv"), "/internal/v1/tasks/t1/outputs/a/b.csv");
    }
}

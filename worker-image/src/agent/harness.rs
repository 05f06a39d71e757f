//! The persistent Python process of a task (`python3 -m toolyard.agent`) and its protocol.
//!
//! The process gets no credentials and a minimal environment; its requests (tool calls,
//! artifacts) are served by the runner through a [`Requests`] handler.

use std::path::PathBuf;
use std::process::Stdio;

use async_trait::async_trait;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use toolyard_api::agent::ToolInfo;

/// How to start the interpreter.
#[derive(Clone, Debug)]
pub struct PythonSettings {
    /// The interpreter (`python3` by default).
    pub python: PathBuf,
    /// `PYTHONPATH` giving access to the `toolyard` package only.
    pub pythonpath: Option<String>,
    /// Working directory (an empty scratch folder).
    pub workdir: PathBuf,
}

/// Serves the harness's requests during a step.
#[async_trait]
pub trait Requests: Send {
    /// Calls a tool; `Err` is the message of the `ToolError` the code sees.
    async fn call_tool(&mut self, name: &str, arguments: Value) -> Result<ToolReply, String>;
    /// Saves an artifact.
    async fn write_artifact(&mut self, filename: &str, content_base64: &str) -> Result<(), String>;
    /// Reads back an artifact (base64).
    async fn read_artifact(&mut self, filename: &str) -> Result<String, String>;
    /// The task's tools matching `query`, best first: `[{name, description}]`.
    async fn tool_search(&mut self, query: &str) -> Result<Value, String>;
}

/// A tool's answer to the task's code.
#[derive(Debug, Default)]
pub struct ToolReply {
    /// What the tool's Python function returns to the code.
    pub value: Value,
    /// Lines the step's output shows after the call (the files the tool returned).
    pub notes: Vec<String>,
}

/// The outcome of one step.
#[derive(Debug, Default)]
pub struct StepOutcome {
    /// What the code printed (bounded by the harness).
    pub output: String,
    /// The traceback, if the code raised.
    pub error: Option<String>,
    /// The value passed to `final_answer`, if called.
    pub final_answer: Option<Value>,
}

/// Errors of the harness process itself (not of the model's code).
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// The interpreter could not start.
    #[error("cannot start the Python interpreter {python}: {source}")]
    Spawn {
        /// The interpreter.
        python: String,
        /// Why.
        source: std::io::Error,
    },
    /// The process exited or broke the protocol.
    #[error("the Python harness stopped: {0}")]
    Broken(String),
}

/// A running harness process.
pub struct Harness {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Harness {
    /// Starts the interpreter and sends the tool stubs.
    pub async fn start(
        settings: &PythonSettings,
        tools: &[ToolInfo],
        max_artifact_bytes: u64,
    ) -> Result<Self, HarnessError> {
        let mut cmd = Command::new(&settings.python);
        cmd.args(["-u", "-m", "toolyard.agent"])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into()))
            .env("HOME", &settings.workdir)
            .env("TMPDIR", &settings.workdir)
            .env("LANG", "C.UTF-8")
            .env("PYTHONIOENCODING", "utf-8")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .current_dir(&settings.workdir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .process_group(0)
            .kill_on_drop(true);
        if let Some(path) = &settings.pythonpath {
            cmd.env("PYTHONPATH", path);
        }
        let mut child = cmd
            .spawn()
            .map_err(|source| HarnessError::Spawn { python: settings.python.display().to_string(), source })?;
        let stdin = child.stdin.take().ok_or_else(|| HarnessError::Broken("no stdin".into()))?;
        let stdout = child.stdout.take().ok_or_else(|| HarnessError::Broken("no stdout".into()))?;
        let mut harness = Self { child, stdin, lines: BufReader::new(stdout).lines() };
        let tools: Vec<Value> = tools
            .iter()
            .map(|t| {
                json!({"name": t.name, "description": t.description, "input_schema": t.input_schema,
                    "params": crate::agent::prompt::parameters(t)})
            })
            .collect();
        harness.send(&json!({"type": "init", "tools": tools, "max_artifact_bytes": max_artifact_bytes})).await?;
        match harness.receive().await?.get("type").and_then(Value::as_str) {
            Some("ready") => Ok(harness),
            other => Err(HarnessError::Broken(format!("expected ready, got {other:?}"))),
        }
    }

    async fn send(&mut self, message: &Value) -> Result<(), HarnessError> {
        let mut line = serde_json::to_vec(message).map_err(|e| HarnessError::Broken(e.to_string()))?;
        line.push(b'\n');
        self.stdin.write_all(&line).await.map_err(|e| HarnessError::Broken(format!("writing to it: {e}")))?;
        self.stdin.flush().await.map_err(|e| HarnessError::Broken(format!("writing to it: {e}")))
    }

    async fn receive(&mut self) -> Result<Value, HarnessError> {
        match self.lines.next_line().await {
            Ok(Some(line)) => {
                serde_json::from_str(&line).map_err(|e| HarnessError::Broken(format!("bad message {line:?}: {e}")))
            }
            Ok(None) => {
                let status = self.child.wait().await.map(|s| s.to_string()).unwrap_or_default();
                Err(HarnessError::Broken(format!("the interpreter exited ({status})")))
            }
            Err(e) => Err(HarnessError::Broken(e.to_string())),
        }
    }

    /// Runs one step, serving its requests with `requests`.
    pub async fn exec(
        &mut self,
        step: u32,
        code: &str,
        requests: &mut dyn Requests,
    ) -> Result<StepOutcome, HarnessError> {
        self.send(&json!({"type": "exec", "step": step, "code": code})).await?;
        loop {
            let message = self.receive().await?;
            match message["type"].as_str() {
                Some("done") => {
                    return Ok(StepOutcome {
                        output: message["output"].as_str().unwrap_or_default().to_owned(),
                        error: message["error"].as_str().map(str::to_owned),
                        final_answer: Some(message["final_answer"].clone()).filter(|v| !v.is_null()),
                    });
                }
                Some("request") => {
                    let id = message["id"].clone();
                    let mut notes = Vec::new();
                    let reply = match message["op"].as_str() {
                        Some("call_tool") => {
                            let name = message["name"].as_str().unwrap_or_default();
                            requests.call_tool(name, message["arguments"].clone()).await.map(|reply| {
                                notes = reply.notes;
                                Some(reply.value)
                            })
                        }
                        Some("write_artifact") => requests
                            .write_artifact(
                                message["filename"].as_str().unwrap_or_default(),
                                message["content_base64"].as_str().unwrap_or_default(),
                            )
                            .await
                            .map(|()| None),
                        Some("tool_search") => {
                            requests.tool_search(message["query"].as_str().unwrap_or_default()).await.map(Some)
                        }
                        Some("read_artifact") => requests
                            .read_artifact(message["filename"].as_str().unwrap_or_default())
                            .await
                            .map(|s| Some(Value::String(s))),
                        other => Err(format!("unknown request {other:?}")),
                    };
                    let answer = match reply {
                        Ok(result) if notes.is_empty() => {
                            json!({"type": "reply", "id": id, "ok": true, "result": result})
                        }
                        Ok(result) => json!({"type": "reply", "id": id, "ok": true, "result": result, "notes": notes}),
                        Err(error) => json!({"type": "reply", "id": id, "ok": false, "error": error}),
                    };
                    self.send(&answer).await?;
                }
                other => return Err(HarnessError::Broken(format!("unexpected message type {other:?}"))),
            }
        }
    }

    /// Kills the interpreter and everything it started.
    pub async fn kill(mut self) {
        if let Some(pid) = self.child.id() {
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL);
        }
        let _ = self.child.wait().await;
    }
}

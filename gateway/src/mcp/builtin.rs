//! The built-in tools of `/mcp`: coding tasks (`run_coding_task`, `get_task_result`,
//! `list_tasks`, `cancel_task`, `delete_task`), their files (`list_artifacts`,
//! `read_artifact`), `tool_search`, and the call tools: `start_call`, `get_call_result` and
//! `cancel_call` run a long call without holding a request open (for clients without the MCP
//! tasks extension), `delete_call` deletes a stored call.
//!
//! Where they appear: only on `/mcp` (a toolset endpoint serves exactly its toolset's tools),
//! but for `/search/mcp`, which serves `tool_search` and `call_tool` alone (every tool the
//! caller may call, found by words and called by name: for models with small context windows).
//! The call tools are there for every caller who may call some tool there (or start coding
//! tasks). The others are the coding-task surface: only on a gateway with a task backend, and only for
//! callers allowed to start coding tasks (`create codingtasks`, or `codingTasks: true` in
//! the local policy). For anyone else they are absent from `tools/list` and calling one
//! answers like an unknown tool, as for any tool the caller may not call. A registered
//! McpTool with a built-in's name is hidden on `/mcp` (still served on its toolset endpoint).

use std::sync::{Arc, LazyLock};

use rmcp::model::{Tool as McpTool, ToolAnnotations};
use serde_json::{Map, Value, json};

use crate::catalog::compile_schema;

/// Largest chunk `read_artifact` returns, in bytes.
pub const MAX_CHUNK: u64 = 256 * 1024;

/// One built-in tool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Builtin {
    /// Start a coding task and wait for its result.
    RunCodingTask,
    /// The result (or state) of a task.
    GetTaskResult,
    /// The caller's tasks.
    ListTasks,
    /// Stop a task.
    CancelTask,
    /// Delete a finished task and its files.
    DeleteTask,
    /// Delete a finished call's files.
    DeleteCall,
    /// Start a tool call without waiting for it.
    StartCall,
    /// The state, then the result, of a started call.
    GetCallResult,
    /// Stop a started call.
    CancelCall,
    /// A task's files.
    ListArtifacts,
    /// A chunk of one file of a task.
    ReadArtifact,
    /// Find tools by words.
    ToolSearch,
    /// Call any tool by name (`/search/mcp` only).
    CallTool,
}

impl Builtin {
    /// Every built-in.
    pub const ALL: [Builtin; 13] = [
        Builtin::CallTool,
        Builtin::CancelCall,
        Builtin::CancelTask,
        Builtin::DeleteCall,
        Builtin::DeleteTask,
        Builtin::GetCallResult,
        Builtin::GetTaskResult,
        Builtin::ListArtifacts,
        Builtin::ListTasks,
        Builtin::ReadArtifact,
        Builtin::RunCodingTask,
        Builtin::StartCall,
        Builtin::ToolSearch,
    ];

    /// MCP name.
    pub fn name(self) -> &'static str {
        match self {
            Builtin::RunCodingTask => "run_coding_task",
            Builtin::GetTaskResult => "get_task_result",
            Builtin::ListTasks => "list_tasks",
            Builtin::CancelTask => "cancel_task",
            Builtin::DeleteTask => "delete_task",
            Builtin::DeleteCall => "delete_call",
            Builtin::StartCall => "start_call",
            Builtin::GetCallResult => "get_call_result",
            Builtin::CancelCall => "cancel_call",
            Builtin::ListArtifacts => "list_artifacts",
            Builtin::ReadArtifact => "read_artifact",
            Builtin::ToolSearch => "tool_search",
            Builtin::CallTool => "call_tool",
        }
    }

    /// Whether the built-in belongs to the coding-task surface (see the module docs).
    pub fn is_task_tool(self) -> bool {
        !matches!(
            self,
            Builtin::DeleteCall | Builtin::StartCall | Builtin::GetCallResult | Builtin::CancelCall | Builtin::CallTool
        )
    }

    /// The built-in called `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|b| b.name() == name)
    }

    /// The MCP tool definition.
    pub fn definition(self) -> McpTool {
        let (title, description, input, output, read_only) = spec(self);
        let input = input.as_object().cloned().unwrap_or_default();
        let mut tool = McpTool::new_with_raw(self.name(), Some(description.into()), Arc::new(input)).with_title(title);
        // `call_tool` answers as the tool it calls: it declares no output schema.
        if let Some(output) = output.as_object() {
            tool = tool.with_raw_output_schema(Arc::new(output.clone()));
        }
        tool.with_annotations(ToolAnnotations::from_raw(
            None,
            Some(read_only),
            Some(matches!(self, Builtin::CancelTask | Builtin::DeleteTask | Builtin::DeleteCall | Builtin::CancelCall)),
            Some(read_only),
            Some(matches!(self, Builtin::RunCodingTask | Builtin::StartCall)),
        ))
    }

    /// Checks arguments against the input schema (same wording as for registered tools).
    pub fn validate(self, arguments: &Map<String, Value>) -> Result<(), String> {
        static VALIDATORS: LazyLock<Vec<(Builtin, jsonschema::Validator)>> = LazyLock::new(|| {
            Builtin::ALL
                .into_iter()
                .map(|b| (b, compile_schema(&spec(b).2).expect("built-in schemas compile")))
                .collect()
        });
        let validator = &VALIDATORS.iter().find(|(b, _)| *b == self).expect("every built-in has a validator").1;
        let value = Value::Object(arguments.clone());
        let problems: Vec<String> = validator
            .iter_errors(&value)
            .map(|e| {
                let path = e.instance_path().to_string();
                if path.is_empty() { e.to_string() } else { format!("{path}: {e}") }
            })
            .collect();
        if problems.is_empty() { Ok(()) } else { Err(problems.join("; ")) }
    }
}

fn task_id_schema() -> Value {
    json!({"type": "string", "minLength": 1, "maxLength": 63, "description": "The task id (from run_coding_task or list_tasks)."})
}

fn call_id_schema() -> Value {
    json!({"type": "string", "minLength": 1, "maxLength": 63, "description": "The call id (from start_call, or a tool result's _meta)."})
}

fn call_state_schema() -> Value {
    json!({"type": "object", "properties": {
        "call_id": {"type": "string"},
        "status": {"type": "string", "enum": ["running", "completed", "failed", "cancelled"]},
        "result": {"type": ["object", "null"], "description": "The tool's answer once completed: content, structuredContent, isError."},
        "error": {"type": ["string", "null"]}},
        "required": ["call_id", "status", "result"]})
}

fn result_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "task_id": {"type": "string"},
            "status": {"type": "string", "enum": ["pending", "running", "success", "failed", "timed_out", "cancelled"]},
            "task_type": {"type": ["string", "null"], "enum": ["analysis", "answer", "needs_input", "unsupported", "failed", null]},
            "summary": {"type": "string"},
            "metrics": {"type": "object"},
            "assumptions": {"type": "array", "items": {"type": "string"}},
            "artifacts": {"type": "array", "items": {"type": "object", "properties": {
                "name": {"type": "string"}, "path": {"type": "string"}, "size": {"type": "integer"}}}},
            "steps": {"type": "integer"},
            "model_calls": {"type": "integer"},
            "tool_calls": {"type": "integer"},
            "error": {"type": "string"}
        },
        "required": ["task_id", "status", "task_type", "summary", "metrics", "assumptions", "artifacts"]
    })
}

/// Title, description, input schema, output schema, read-only.
fn spec(b: Builtin) -> (&'static str, &'static str, Value, Value, bool) {
    match b {
        Builtin::RunCodingTask => (
            "Run a coding task",
            "Starts a coding agent that writes and runs Python composing the registered tools (as you, with your \
             permissions) to answer `task`, waits for it and returns its result: status, task_type, summary, \
             metrics, assumptions and the artifacts it saved. Progress notifications are sent while it runs. If \
             you stop waiting the task goes on: use get_task_result with its task_id. `tools` limits the tools it \
             may use (default: every tool you may call); `model` names a model profile of the gateway (default: \
             its default profile).",
            json!({
                "type": "object",
                "properties": {
                    "task": {"type": "string", "minLength": 1, "maxLength": 65536, "description": "What to do, in plain words."},
                    "tools": {"type": "array", "maxItems": 256, "items": {"type": "string", "minLength": 1, "maxLength": 64},
                              "description": "Names of the tools the task may use (default: all you may call)."},
                    "model": {"type": "string", "minLength": 1, "maxLength": 63, "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
                              "description": "A model profile of the gateway (default: its default profile)."},
                    "budgets": {
                        "type": "object",
                        "properties": {
                            "max_steps": {"type": "integer", "minimum": 1, "maximum": 200},
                            "max_model_calls": {"type": "integer", "minimum": 1, "maximum": 1000},
                            "max_tool_calls": {"type": "integer", "minimum": 0, "maximum": 10000},
                            "timeout_seconds": {"type": "integer", "minimum": 10, "maximum": 86400},
                            "max_model_tokens": {"type": "integer", "minimum": 1000, "maximum": 1000000000}
                        },
                        "additionalProperties": false
                    }
                },
                "required": ["task"],
                "additionalProperties": false
            }),
            result_schema(),
            false,
        ),
        Builtin::GetTaskResult => (
            "Get a task's result",
            "The result of one of your coding tasks, or its status while it runs.",
            json!({"type": "object", "properties": {"task_id": task_id_schema()}, "required": ["task_id"], "additionalProperties": false}),
            result_schema(),
            true,
        ),
        Builtin::ListTasks => (
            "List your tasks",
            "Your coding tasks, newest first, optionally only those with a status. Pages with `cursor`.",
            json!({
                "type": "object",
                "properties": {
                    "status": {"type": "string", "enum": ["pending", "running", "success", "failed", "timed_out", "cancelled"]},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 100, "default": 20},
                    "cursor": {"type": "string", "maxLength": 256}
                },
                "additionalProperties": false
            }),
            json!({"type": "object", "properties": {
                "tasks": {"type": "array", "items": {"type": "object"}},
                "next_cursor": {"type": ["string", "null"]}}, "required": ["tasks", "next_cursor"]}),
            true,
        ),
        Builtin::CancelTask => (
            "Cancel a task",
            "Stops one of your coding tasks. Its files stay readable; its result says `cancelled`.",
            json!({"type": "object", "properties": {"task_id": task_id_schema()}, "required": ["task_id"], "additionalProperties": false}),
            json!({"type": "object", "properties": {"task_id": {"type": "string"}, "status": {"type": "string"},
                "cancel_requested": {"type": "boolean"}}, "required": ["task_id", "status", "cancel_requested"]}),
            false,
        ),
        Builtin::DeleteTask => (
            "Delete a task",
            "Deletes one of your coding tasks: its record and every file it stored (result, events, \
             artifacts). A task still running is cancelled first. This cannot be undone.",
            json!({"type": "object", "properties": {"task_id": task_id_schema()}, "required": ["task_id"], "additionalProperties": false}),
            json!({"type": "object", "properties": {"task_id": {"type": "string"}, "deleted": {"type": "boolean"},
                "files": {"type": "integer"}}, "required": ["task_id", "deleted", "files"]}),
            false,
        ),
        Builtin::DeleteCall => (
            "Delete a call",
            "Deletes what is stored of one of your finished tool calls: its input, result, logs and events. The \
             call id is in each tool result's `_meta` (`toolyard.dev/callId`). This cannot be undone.",
            json!({"type": "object", "properties": {"call_id": {"type": "string", "minLength": 1, "maxLength": 63,
                "description": "The call id (from a tool result's _meta)."}}, "required": ["call_id"], "additionalProperties": false}),
            json!({"type": "object", "properties": {"call_id": {"type": "string"}, "deleted": {"type": "boolean"},
                "files": {"type": "integer"}}, "required": ["call_id", "deleted", "files"]}),
            false,
        ),
        Builtin::StartCall => (
            "Start a call",
            "Starts a call of one of your tools and answers with its call_id without waiting for it: use \
             get_call_result to follow it and cancel_call to stop it. The call goes on if you disconnect or the \
             gateway restarts. A tool that runs in a warm pool answers at once (status `completed`). Clients with \
             the MCP tasks extension get the same from a plain tools/call.",
            json!({
                "type": "object",
                "properties": {
                    "tool": {"type": "string", "minLength": 1, "maxLength": 64, "description": "The tool to call."},
                    "arguments": {"type": "object", "description": "The tool's arguments.", "default": {}}
                },
                "required": ["tool"],
                "additionalProperties": false
            }),
            call_state_schema(),
            false,
        ),
        Builtin::GetCallResult => (
            "Get a call's result",
            "The state of a call started with start_call (or any of your calls): `running`, or `completed` with \
             the tool's answer in `result` (its images and file links follow as content), or `failed`/`cancelled`.",
            json!({"type": "object", "properties": {"call_id": call_id_schema()}, "required": ["call_id"], "additionalProperties": false}),
            call_state_schema(),
            true,
        ),
        Builtin::CancelCall => (
            "Cancel a call",
            "Stops one of your running calls (started with start_call). A call that has ended is left as it is.",
            json!({"type": "object", "properties": {"call_id": call_id_schema()}, "required": ["call_id"], "additionalProperties": false}),
            json!({"type": "object", "properties": {"call_id": {"type": "string"}, "status": {"type": "string"},
                "cancel_requested": {"type": "boolean"}}, "required": ["call_id", "status", "cancel_requested"]}),
            false,
        ),
        Builtin::ListArtifacts => (
            "List a task's files",
            "The artifacts a coding task saved (under outputs/) and every other file of the task \
             (result.json, tool_calls.json, events/…, actions/…), each readable with read_artifact.",
            json!({"type": "object", "properties": {"task_id": task_id_schema()}, "required": ["task_id"], "additionalProperties": false}),
            json!({"type": "object", "properties": {"task_id": {"type": "string"},
                "artifacts": {"type": "array", "items": {"type": "object"}},
                "files": {"type": "array", "items": {"type": "object"}}}, "required": ["task_id", "artifacts", "files"]}),
            true,
        ),
        Builtin::ReadArtifact => (
            "Read a task's or a call's file",
            "Reads a file of one of your coding tasks (`task_id`) or tool calls (`call_id`, from a result's _meta) \
             in chunks of at most 256 KiB. For a task, `filename` as list_artifacts gives it (an artifact name \
             like `scenarios.csv`, or `outputs/…`, `result.json`, `tool_calls.json`, `events/…`, `actions/…`); \
             for a call, a file it returned (`plot.png` or `outputs/plot.png`) or `input.json`, `result.json`, \
             `stdout.log`, `stderr.log`. Answers {content, encoding, offset, next_offset, size}; read on from \
             `next_offset` until it is null. With encoding \"base64\" each chunk decodes on its own; \"text\" \
             needs UTF-8 and never splits a character.",
            json!({
                "type": "object",
                "properties": {
                    "task_id": task_id_schema(),
                    "call_id": {"type": "string", "minLength": 1, "maxLength": 63, "description": "The call id (instead of task_id)."},
                    "filename": {"type": "string", "minLength": 1, "maxLength": 600},
                    "offset": {"type": "integer", "minimum": 0, "default": 0},
                    "length": {"type": "integer", "minimum": 1, "maximum": MAX_CHUNK, "default": MAX_CHUNK},
                    "encoding": {"type": "string", "enum": ["text", "base64"], "default": "text"}
                },
                "required": ["filename"],
                "additionalProperties": false
            }),
            json!({"type": "object", "properties": {
                "content": {"type": "string"}, "encoding": {"type": "string"}, "offset": {"type": "integer"},
                "next_offset": {"type": ["integer", "null"]}, "size": {"type": "integer"}},
                "required": ["content", "encoding", "offset", "next_offset", "size"]}),
            true,
        ),
        Builtin::CallTool => (
            "Call a tool",
            "Calls the tool `name` (as `tool_search` found it) with `arguments`, and answers as that tool does.",
            json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string", "minLength": 1, "maxLength": 256},
                    "arguments": {"type": "object"}
                },
                "required": ["name"],
                "additionalProperties": false
            }),
            Value::Null,
            false,
        ),
        Builtin::ToolSearch => (
            "Search tools",
            "Finds the tools you may call by words of their name, title or description, best match first, with \
             their input schemas.",
            json!({
                "type": "object",
                "properties": {
                    "query": {"type": "string", "minLength": 1, "maxLength": 512},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 50, "default": 10}
                },
                "required": ["query"],
                "additionalProperties": false
            }),
            json!({"type": "object", "properties": {"tools": {"type": "array", "items": {"type": "object"}}}, "required": ["tools"]}),
            true,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The catalog leaves out functions named like a built-in, and listings merge the two
    /// sorted: both rely on the reserved names being exactly the built-ins', sorted like them.
    #[test]
    fn the_reserved_tool_names_are_the_builtins_names_sorted() {
        let names: Vec<&str> = Builtin::ALL.iter().map(|b| b.name()).collect();
        assert_eq!(names, toolyard_api::mcptool::RESERVED_TOOL_NAMES);
        assert!(names.is_sorted());
    }

    #[test]
    fn every_builtin_has_a_valid_definition_and_checks_its_arguments() {
        for b in Builtin::ALL {
            assert_eq!(Builtin::from_name(b.name()), Some(b));
            let def = serde_json::to_value(b.definition()).unwrap();
            assert_eq!(def["inputSchema"]["type"], "object", "{b:?}");
            if b != Builtin::CallTool {
                assert_eq!(def["outputSchema"]["type"], "object", "{b:?}");
            }
        }
        assert!(Builtin::from_name("price_option").is_none());
        let args = |v: Value| v.as_object().unwrap().clone();
        assert!(Builtin::RunCodingTask.validate(&args(json!({"task": "x"}))).is_ok());
        let e = Builtin::RunCodingTask.validate(&args(json!({"task": "", "budgets": {"max_steps": 0}}))).unwrap_err();
        assert!(e.contains("/task") && e.contains("/budgets/max_steps"), "{e}");
        let e = Builtin::ReadArtifact
            .validate(&args(json!({"task_id": "t", "filename": "a", "length": 300000})))
            .unwrap_err();
        assert!(e.contains("/length"), "{e}");
        assert!(
            Builtin::ReadArtifact.validate(&args(json!({"task_id": "t", "filename": "a", "encoding": "hex"}))).is_err()
        );
    }
}

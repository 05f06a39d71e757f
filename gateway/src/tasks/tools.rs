//! What a coding task's agent is told about the tools it may use (which ones those are is
//! decided by [`crate::core::Access`] with the task's selection).

use serde_json::Value;
use toolyard_api::agent::ToolInfo;

use crate::catalog::Tool;

/// What the agent is told about a tool.
pub fn info(tool: &Tool) -> ToolInfo {
    ToolInfo {
        name: tool.name().to_owned(),
        description: tool.spec.description.clone(),
        input_schema: Value::Object(tool.input_schema.as_ref().clone()),
        output_schema: tool.output_schema.as_deref().cloned().map(Value::Object),
    }
}

//! Conversions between Toolyard types and rmcp's MCP model.

use rmcp::model::{CallToolResult, ContentBlock, Tool as McpTool, ToolAnnotations};
use serde_json::Value;
use serde_json::value::RawValue;
use toolyard_api::protocol::{CallResult, structured_content};

use crate::catalog::Tool;

/// The MCP description of a tool: name, title, description, schemas and annotations as
/// declared on the McpTool (the schemas are shared with the catalog, not copied).
pub fn to_mcp_tool(tool: &Tool) -> McpTool {
    let spec = &tool.spec;
    let mut out =
        McpTool::new_with_raw(spec.name.clone(), Some(spec.description.clone().into()), tool.input_schema.clone());
    if let Some(title) = &spec.title {
        out = out.with_title(title.clone());
    }
    if let Some(schema) = &tool.output_schema {
        out = out.with_raw_output_schema(schema.clone());
    }
    if let Some(a) = &spec.annotations {
        out = out.with_annotations(ToolAnnotations::from_raw(
            None,
            a.read_only_hint,
            a.destructive_hint,
            a.idempotent_hint,
            a.open_world_hint,
        ));
    }
    out
}

/// [`to_mcp_tool`] as JSON, serialized once per tool (kept in [`Tool::mcp_json`]).
pub fn to_mcp_json(tool: &Tool) -> &RawValue {
    tool.mcp_json.get_or_init(|| {
        // Strings, maps with string keys and booleans: nothing in a tool's definition can
        // fail to serialize.
        serde_json::value::to_raw_value(&to_mcp_tool(tool)).expect("a tool definition is JSON")
    })
}

/// The MCP result of a finished call: an upstream server's answer as it came; otherwise on
/// success the value as JSON text plus `structuredContent`, on failure `isError` with the
/// tool's own message.
pub fn call_result_to_mcp(result: CallResult) -> CallToolResult {
    // An upstream server's answer goes on as it came.
    if let Some(answer) = result.mcp.as_ref().and_then(|a| serde_json::from_value::<CallToolResult>(a.clone()).ok()) {
        return answer;
    }
    if let Some(error) = result.error {
        return CallToolResult::error(vec![ContentBlock::text(error.message)]);
    }
    let value = result.value.unwrap_or(Value::Null);
    let text = serde_json::to_string(&value).unwrap_or_else(|_| "null".to_owned());
    let mut out = CallToolResult::success(vec![ContentBlock::text(text)]);
    out.structured_content = Some(Value::Object(structured_content(&value)));
    out
}

/// The `isError` result of arguments that do not match the input schema (MCP reports input
/// validation problems as tool errors so the model can correct itself).
pub fn invalid_arguments(problems: &str) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(format!("invalid arguments: {problems}"))])
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use toolyard_api::protocol::CallErrorKind;

    use super::*;

    fn tool() -> crate::catalog::Tool {
        let spec: toolyard_api::McpToolSpec = serde_json::from_value(json!({
            "name": "price_option",
            "title": "Price an option",
            "description": "Black-Scholes price",
            "inputSchema": {"type": "object", "properties": {"spot": {"type": "number"}}, "required": ["spot"]},
            "outputSchema": {"type": "object", "properties": {"price": {"type": "number"}}},
            "annotations": {"readOnlyHint": true, "idempotentHint": true},
            "runtime": {"image": "img", "command": ["python"]}
        }))
        .unwrap();
        crate::catalog::Tool::new("ns".into(), "price-option".into(), 1, spec).unwrap()
    }

    #[test]
    fn tool_fields_are_carried_over() {
        let t = serde_json::to_value(to_mcp_tool(&tool())).unwrap();
        assert_eq!(t["name"], "price_option");
        assert_eq!(t["title"], "Price an option");
        assert_eq!(t["description"], "Black-Scholes price");
        assert_eq!(t["inputSchema"]["required"], json!(["spot"]));
        assert_eq!(t["outputSchema"]["properties"]["price"]["type"], "number");
        assert_eq!(t["annotations"], json!({"readOnlyHint": true, "idempotentHint": true}));
    }

    #[test]
    fn results_carry_text_and_structured_content() {
        let ok = serde_json::to_value(call_result_to_mcp(CallResult::ok(json!({"price": 10.45}), 3))).unwrap();
        assert_eq!(ok["structuredContent"], json!({"price": 10.45}));
        assert_eq!(ok["content"][0]["text"], "{\"price\":10.45}");
        assert_eq!(ok["isError"], false);

        let scalar = serde_json::to_value(call_result_to_mcp(CallResult::ok(json!(3.5), 1))).unwrap();
        assert_eq!(scalar["structuredContent"], json!({"result": 3.5}));

        let err =
            call_result_to_mcp(CallResult::err(CallErrorKind::ToolError, "volatility must be positive", Some(1), 2));
        let err = serde_json::to_value(err).unwrap();
        assert_eq!(err["isError"], true);
        assert_eq!(err["content"][0]["text"], "volatility must be positive");
        assert!(err.get("structuredContent").is_none());
    }
}

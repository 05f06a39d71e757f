//! What the model is told, and how its answers are read: the system prompt (rules, tools,
//! helpers, result contract), observations, and extraction of the Python code block.

use toolyard_api::agent::{TaskSpec, ToolInfo};

/// With more tools than this, the prompt lists names only and points at `tool_search`.
pub const FULL_LISTING_MAX_TOOLS: usize = 30;

/// The system prompt for a task.
pub fn system_prompt(spec: &TaskSpec) -> String {
    let mut tools = String::new();
    if spec.tools.len() <= FULL_LISTING_MAX_TOOLS {
        for tool in &spec.tools {
            tools.push_str(&signature(tool));
            tools.push('\n');
        }
    } else {
        tools.push_str(&format!(
            "There are {} tools; their names are below. Call `tool_search(\"words\")` to get descriptions.\n",
            spec.tools.len()
        ));
        for tool in &spec.tools {
            tools.push_str(&format!("- {}\n", tool.name));
        }
    }
    if spec.tools.is_empty() {
        tools.push_str("(no tools are available to this task)\n");
    }
    format!(
        "You are a careful analyst who solves tasks by writing Python code.\n\
         \n\
         Answer every turn with a short thought and exactly one fenced code block:\n\
         ```python\n\
         # your code\n\
         ```\n\
         The code runs in a persistent Python interpreter: variables and imports stay between steps. \
         You then see what it printed (and the value of a last bare expression, as in a REPL), or the error with \
         its traceback, and continue. Use print() to see values.\n\
         \n\
         Tools are Python functions already defined in the interpreter. Call them with keyword arguments; they \
         return dicts. A failing tool raises ToolError with the tool's message. Do not import the tools' modules, \
         read files of the host or access the network: use only the tools.\n\
         \n\
         Tools:\n{tools}\n\
         Helpers:\n\
         - write_artifact(filename, content, encoding=\"text\"|\"base64\"): save a file for the user (max {max} bytes).\n\
         - read_written_artifact(filename): read back a file you saved.\n\
         - tool_search(query): find tools by words in their names and descriptions.\n\
         - final_answer(answer): finish the task. `answer` is a dict with:\n\
           task_type: one of \"analysis\" (computed with tools; needs at least one successful tool call), \
         \"answer\" (a direct answer), \"needs_input\" (you need more information from the user), \
         \"unsupported\" (the tools cannot do this), \"failed\";\n\
           summary: a short paragraph for the user;\n\
           metrics: a dict of the key numbers (may be empty);\n\
           assumptions: a list of strings (may be empty).\n\
         Files you saved are listed with the result automatically.\n\
         \n\
         Limits: at most {steps} code steps and {tools_budget} tool calls.",
        max = spec.max_artifact_bytes,
        steps = spec.budgets.max_steps,
        tools_budget = spec.budgets.max_tool_calls,
    )
}

/// Parameter names in Python order: required ones in the order of the schema's `required`
/// list (an array, so its order survives storage that sorts object keys, as the Kubernetes
/// API does), then optional ones in the schema's order. The harness maps positional
/// arguments with the same order.
pub fn parameters(tool: &ToolInfo) -> Vec<String> {
    let schema = &tool.input_schema;
    let names: Vec<&String> = schema["properties"].as_object().map(|p| p.keys().collect()).unwrap_or_default();
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|r| r.iter().filter_map(|v| v.as_str()).filter(|n| names.iter().any(|m| m == n)).collect())
        .unwrap_or_default();
    let optional = names.into_iter().filter(|n| !required.contains(&n.as_str())).cloned();
    required.iter().map(|n| (*n).to_owned()).chain(optional).collect()
}

/// `name(arg: type, ...) -> returns: description` for the prompt.
pub fn signature(tool: &ToolInfo) -> String {
    let schema = &tool.input_schema;
    let required: Vec<&str> =
        schema["required"].as_array().map(|r| r.iter().filter_map(|v| v.as_str()).collect()).unwrap_or_default();
    let mut args = Vec::new();
    for name in parameters(tool) {
        let prop = &schema["properties"][&name];
        let mut arg = format!("{name}: {}", type_hint(prop));
        if !required.contains(&name.as_str()) {
            match prop.get("default") {
                Some(d) => arg.push_str(&format!(" = {d}")),
                None => arg.push_str(" = None"),
            }
        }
        args.push(arg);
    }
    let mut line = format!("- {}({}) -> dict", tool.name, args.join(", "));
    let description = tool.description.lines().next().unwrap_or_default().trim();
    if !description.is_empty() {
        line.push_str(&format!(": {description}"));
    }
    if let Some(props) = schema["properties"].as_object() {
        for (name, prop) in props {
            if let Some(d) = prop["description"].as_str() {
                line.push_str(&format!("\n    {name}: {d}"));
            }
        }
    }
    if let Some(out) = tool.output_schema.as_ref().and_then(|o| o["properties"].as_object()) {
        let keys: Vec<&str> = out.keys().map(String::as_str).collect();
        line.push_str(&format!("\n    returns keys: {}", keys.join(", ")));
    }
    line
}

fn type_hint(prop: &serde_json::Value) -> String {
    if let Some(values) = prop["enum"].as_array() {
        let items: Vec<String> = values.iter().map(|v| v.to_string()).collect();
        return format!("Literal[{}]", items.join(", "));
    }
    match prop["type"].as_str() {
        Some("number") => "float".into(),
        Some("integer") => "int".into(),
        Some("string") => "str".into(),
        Some("boolean") => "bool".into(),
        Some("array") => format!("list[{}]", type_hint(&prop["items"])),
        Some("object") => "dict".into(),
        _ => "Any".into(),
    }
}

/// The Python code of a model answer: the first ```python (or ```py, or bare ```) block.
pub fn extract_code(answer: &str) -> Option<String> {
    let mut rest = answer;
    while let Some(start) = rest.find("```") {
        let after = &rest[start + 3..];
        let (lang, body) = after.split_once('\n')?;
        let lang = lang.trim().to_ascii_lowercase();
        let end = body.find("```")?;
        let code = body[..end].trim_end();
        if (lang.is_empty() || lang == "python" || lang == "py") && !code.trim().is_empty() {
            return Some(code.to_owned());
        }
        rest = &body[end + 3..];
    }
    None
}

/// The message sent back when an answer had no code block.
pub const NO_CODE: &str = "Your answer had no ```python code block. Reply with a short thought and exactly one \
                           ```python block; call final_answer({...}) when you are done.";

/// The observation after a step.
pub fn observation(output: &str, error: Option<&str>) -> String {
    let mut text = String::from("Observation:\n");
    if output.is_empty() && error.is_none() {
        text.push_str("(the code printed nothing)\n");
    } else {
        text.push_str(output);
        if !output.ends_with('\n') && !output.is_empty() {
            text.push('\n');
        }
    }
    if let Some(error) = error {
        text.push_str("Error:\n");
        text.push_str(error);
        text.push_str("\nFix the code and try again.");
    }
    text
}

/// The observation when `final_answer` broke the result contract (with what the step printed).
pub fn contract_violation(output: &str, errors: &[String]) -> String {
    let mut text = String::from("Observation:\n");
    if !output.is_empty() {
        text.push_str(output);
        if !output.ends_with('\n') {
            text.push('\n');
        }
    }
    text.push_str(&format!(
        "final_answer was not accepted:\n- {}\nCall final_answer again with a corrected dict.",
        errors.join("\n- ")
    ));
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use toolyard_api::codingtask::Budgets;

    fn tool() -> ToolInfo {
        ToolInfo {
            name: "price_option".into(),
            description: "Price a European option.\nMore text.".into(),
            input_schema: json!({"type": "object", "properties": {
                "spot": {"type": "number", "description": "Spot price"},
                "option_type": {"type": "string", "enum": ["call", "put"], "default": "call"}},
                "required": ["spot"]}),
            output_schema: Some(json!({"type": "object", "properties": {"price": {"type": "number"}}})),
        }
    }

    #[test]
    fn required_parameters_keep_their_declared_order_whatever_the_key_order() {
        let mut t = tool();
        t.input_schema = json!({"type": "object", "properties": {
            "a_opt": {"type": "number"}, "rate": {"type": "number"}, "spot": {"type": "number"}},
            "required": ["spot", "rate"]});
        assert_eq!(parameters(&t), ["spot", "rate", "a_opt"]);
    }

    #[test]
    fn signatures_read_like_python() {
        let s = signature(&tool());
        assert!(s.starts_with("- price_option(spot: float, option_type: Literal[\"call\", \"put\"] = \"call\") -> dict: Price a European option."), "{s}");
        assert!(s.contains("spot: Spot price") && s.contains("returns keys: price"), "{s}");
    }

    #[test]
    fn many_tools_are_listed_by_name_with_tool_search() {
        let mut spec = TaskSpec {
            id: "t".into(),
            prompt: "p".into(),
            tools: vec![tool()],
            budgets: Budgets::default(),
            deadline_unix_ms: 0,
            max_artifact_bytes: 1024,
            model: "m".into(),
        };
        assert!(system_prompt(&spec).contains("- price_option(spot: float"));
        spec.tools = (0..40).map(|i| ToolInfo { name: format!("t{i}"), ..tool() }).collect();
        let prompt = system_prompt(&spec);
        assert!(prompt.contains("There are 40 tools") && prompt.contains("- t39\n") && !prompt.contains("t39(spot"));
    }

    #[test]
    fn code_blocks_are_extracted() {
        assert_eq!(extract_code("Thought.\n```python\nx = 1\nprint(x)\n```\nmore").as_deref(), Some("x = 1\nprint(x)"));
        assert_eq!(extract_code("```py\na=2\n```").as_deref(), Some("a=2"));
        assert_eq!(extract_code("```json\n{}\n```\n```\nb=3\n```").as_deref(), Some("b=3"));
        assert_eq!(extract_code("no code here"), None);
        assert_eq!(extract_code("```python\n\n```"), None);
        assert_eq!(extract_code("```python\nunterminated"), None);
    }

    #[test]
    fn observations_show_output_and_errors() {
        assert_eq!(observation("", None), "Observation:\n(the code printed nothing)\n");
        let o = observation("1\n", Some("Traceback...\nNameError: x"));
        assert!(o.contains("1\nError:\nTraceback") && o.ends_with("try again."));
        assert!(contract_violation("", &["summary is required".into()]).contains("- summary is required"));
        assert!(contract_violation("42\n", &["x".into()]).starts_with("Observation:\n42\nfinal_answer was not"));
    }
}

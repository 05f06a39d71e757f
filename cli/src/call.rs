//! `toolyard tools` and `toolyard call`: list the tools you may call, call one with
//! `key=value` arguments.

use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use rmcp::model::{CallToolRequestParams, CallToolResult};
use serde_json::{Map, Value};

use crate::connect::{Client, Connection};

/// `toolyard call`.
#[derive(Debug, clap::Args)]
pub struct CallArgs {
    /// The tool's name (as `toolyard tools` lists it)
    pub tool: String,
    /// Arguments: key=value (a string where the tool's schema wants one, else JSON:
    /// spot=100, tags='["a"]') or key:=JSON (always JSON)
    pub arguments: Vec<String>,
    /// All arguments as one JSON object, or @FILE holding one (key=value pairs are added)
    #[arg(long)]
    pub json: Option<String>,
    /// Stop waiting (and cancel the call) after this many seconds
    #[arg(long)]
    pub timeout: Option<u64>,
    /// Print the whole MCP result as JSON instead of its content
    #[arg(long)]
    pub raw: bool,
    /// Do not show progress
    #[arg(long, short)]
    pub quiet: bool,
}

/// `toolyard tools`: one line per tool (name, then its title or description's first line).
pub async fn tools(conn: &Connection, json: bool) -> Result<u8> {
    let client = conn.connect(true).await?;
    let tools = client.list_all_tools().await.context("tools/list")?;
    if json {
        println!("{}", serde_json::to_string_pretty(&tools)?);
    } else {
        let width = tools.iter().map(|t| t.name.len()).max().unwrap_or(0);
        for t in &tools {
            println!("{:width$}  {}", t.name, headline(t.title.as_deref(), t.description.as_deref()));
        }
    }
    let _ = client.cancel().await;
    Ok(0)
}

/// A listing's one line about an item: its title, else its description's first line.
pub fn headline(title: Option<&str>, description: Option<&str>) -> String {
    title.or(description).unwrap_or_default().lines().next().unwrap_or_default().to_owned()
}

/// `toolyard call`: exit code 0 on success, 1 when the tool answered an error.
pub async fn call(conn: &Connection, args: CallArgs) -> Result<u8> {
    let client = conn.connect(args.quiet).await?;
    let tools = client.list_all_tools().await.context("tools/list")?;
    let Some(tool) = tools.iter().find(|t| t.name == args.tool) else {
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
        bail!(
            "no tool {:?} that you may call; the server lists {}: {}",
            args.tool,
            names.len(),
            if names.is_empty() { "none".to_owned() } else { names.join(", ") }
        );
    };
    let mut arguments = match &args.json {
        Some(json) => json_object(json)?,
        None => Map::new(),
    };
    for pair in &args.arguments {
        let (key, value) = parse_pair(pair, &Value::Object((*tool.input_schema).clone()))?;
        arguments.insert(key, value);
    }
    let timeout = args.timeout.map(Duration::from_secs);
    let result = call_tool(&client, &args.tool, arguments, timeout).await;
    client.service().end_progress();
    let result = result?;
    let code = print_result(&result, args.raw)?;
    let _ = client.cancel().await;
    Ok(code)
}

/// Calls `name`; with a timeout the call is cancelled (`notifications/cancelled`) when it
/// passes.
pub async fn call_tool(
    client: &Client,
    name: &str,
    arguments: Map<String, Value>,
    timeout: Option<Duration>,
) -> Result<CallToolResult> {
    let params = CallToolRequestParams::new(name.to_owned()).with_arguments(arguments);
    let call = client.call_tool(params);
    let answer = match timeout {
        Some(limit) => tokio::time::timeout(limit, call)
            .await
            .map_err(|_| anyhow!("{name}: no answer within {} s; the call was cancelled", limit.as_secs()))?,
        None => call.await,
    };
    answer.map_err(|e| anyhow!("{name}: {}", crate::connect::error_chain(&e)))
}

/// A JSON object from `text`, or from the file `@path`.
fn json_object(text: &str) -> Result<Map<String, Value>> {
    let body = match text.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?,
        None => text.to_owned(),
    };
    match serde_json::from_str(&body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => bail!("--json must be a JSON object"),
        Err(e) => bail!("--json is not valid JSON: {e}"),
    }
}

/// `key=value` or `key:=json`; a plain value is a string when the schema's property takes
/// a string (and nothing else), else JSON when it parses as JSON, else a string.
pub fn parse_pair(pair: &str, schema: &Value) -> Result<(String, Value)> {
    if let Some((key, json)) = pair.split_once(":=")
        && !key.contains('=')
    {
        let value = serde_json::from_str(json).with_context(|| format!("{key}:= needs JSON, not {json:?}"))?;
        return Ok((checked_key(key)?, value));
    }
    let Some((key, text)) = pair.split_once('=') else {
        bail!("argument {pair:?}: write key=value (or key:=JSON)");
    };
    let key = checked_key(key)?;
    let types = schema.pointer(&format!("/properties/{key}/type"));
    let only_string = match types {
        Some(Value::String(t)) => t == "string",
        Some(Value::Array(ts)) => ts.iter().all(|t| t == "string" || t == "null") && ts.iter().any(|t| t == "string"),
        _ => false,
    };
    if only_string {
        return Ok((key, Value::String(text.to_owned())));
    }
    Ok((key, serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))))
}

fn checked_key(key: &str) -> Result<String> {
    if key.is_empty() {
        bail!("an argument has no name before '='");
    }
    Ok(key.to_owned())
}

/// Prints a result: its structured content as JSON, else its content (text as is, other
/// kinds as one line each). A tool error goes to stderr with exit code 1.
pub fn print_result(result: &CallToolResult, raw: bool) -> Result<u8> {
    let failed = result.is_error == Some(true);
    if raw {
        println!("{}", serde_json::to_string_pretty(result)?);
        return Ok(u8::from(failed));
    }
    let text = match (&result.structured_content, failed) {
        (Some(structured), false) => serde_json::to_string_pretty(structured)?,
        _ => content_text(result),
    };
    if failed {
        eprintln!("error: {text}");
        return Ok(1);
    }
    println!("{text}");
    Ok(0)
}

/// The content blocks of a result as text: text as is, an image or audio as its type and
/// size, a resource by its URI.
pub fn content_text(result: &CallToolResult) -> String {
    let blocks = serde_json::to_value(&result.content).unwrap_or_default();
    let lines: Vec<String> = blocks
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|b| match b.get("type").and_then(Value::as_str).unwrap_or_default() {
            "text" => b["text"].as_str().unwrap_or_default().to_owned(),
            kind @ ("image" | "audio") => format!(
                "[{kind} {}, {} bytes]",
                b["mimeType"].as_str().unwrap_or("?"),
                b["data"].as_str().map_or(0, |d| d.len() * 3 / 4)
            ),
            "resource_link" => format!("[resource {}]", b["uri"].as_str().unwrap_or_default()),
            "resource" => match b.pointer("/resource/text").and_then(Value::as_str) {
                Some(text) => text.to_owned(),
                None => {
                    format!("[resource {}]", b.pointer("/resource/uri").and_then(Value::as_str).unwrap_or_default())
                }
            },
            other => format!("[{other} content]"),
        })
        .collect();
    lines.join("\n")
}

/// The structured content of a successful result, or why there is none.
pub fn structured(name: &str, result: &CallToolResult) -> Result<Value> {
    if result.is_error == Some(true) {
        bail!("{name}: {}", content_text(result));
    }
    result.structured_content.clone().ok_or_else(|| anyhow!("{name} answered without structured content"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pairs_follow_the_schema_and_json() {
        let schema = json!({"properties": {"symbol": {"type": "string"}, "spot": {"type": "number"},
            "tag": {"type": ["string", "null"]}}});
        assert_eq!(parse_pair("symbol=123", &schema).unwrap(), ("symbol".into(), json!("123")));
        assert_eq!(parse_pair("tag=true", &schema).unwrap(), ("tag".into(), json!("true")));
        assert_eq!(parse_pair("spot=100.5", &schema).unwrap(), ("spot".into(), json!(100.5)));
        assert_eq!(parse_pair("other=[1,2]", &schema).unwrap(), ("other".into(), json!([1, 2])));
        assert_eq!(parse_pair("other=hello world", &schema).unwrap(), ("other".into(), json!("hello world")));
        assert_eq!(parse_pair("symbol:=\"x\"", &schema).unwrap(), ("symbol".into(), json!("x")));
        assert_eq!(parse_pair("url=a:=b", &schema).unwrap(), ("url".into(), json!("a:=b")));
        assert!(parse_pair("symbol:=nope", &schema).unwrap_err().to_string().contains("needs JSON"));
        assert!(parse_pair("novalue", &schema).unwrap_err().to_string().contains("key=value"));
        assert!(parse_pair("=1", &schema).is_err());
    }
}

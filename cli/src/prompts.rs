//! `toolyard prompts` and `toolyard prompt`: list the prompts you may get, get one with
//! `key=value` arguments (prompt arguments are text).

use anyhow::{Context, Result, anyhow, bail};
use rmcp::model::{GetPromptRequestParams, Prompt};
use serde_json::{Map, Value};

use crate::connect::Connection;

/// `toolyard prompt`.
#[derive(Debug, clap::Args)]
pub struct PromptArgs {
    /// The prompt's name (as `toolyard prompts` lists it)
    pub name: String,
    /// Arguments: key=value (values are text)
    pub arguments: Vec<String>,
    /// Print the whole MCP result as JSON instead of its messages
    #[arg(long)]
    pub raw: bool,
}

/// `toolyard prompts`: one line per prompt (name, its title or description's first line, and
/// its arguments, required ones marked `*`).
pub async fn prompts(conn: &Connection, json: bool) -> Result<u8> {
    let client = conn.connect(true).await?;
    let prompts = client.list_all_prompts().await.context("prompts/list")?;
    if json {
        println!("{}", serde_json::to_string_pretty(&prompts)?);
    } else {
        let width = prompts.iter().map(|p| p.name.len()).max().unwrap_or(0);
        for p in &prompts {
            let headline = crate::call::headline(p.title.as_deref(), p.description.as_deref());
            println!("{:width$}  {headline}{}", p.name, arguments(p));
        }
    }
    let _ = client.cancel().await;
    Ok(0)
}

fn arguments(p: &Prompt) -> String {
    let names: Vec<String> = p
        .arguments
        .iter()
        .flatten()
        .map(|a| if a.required == Some(true) { format!("{}*", a.name) } else { a.name.clone() })
        .collect();
    if names.is_empty() { String::new() } else { format!(" ({})", names.join(", ")) }
}

/// `toolyard prompt`: prints each message as `[role]` and its text.
pub async fn prompt(conn: &Connection, args: PromptArgs) -> Result<u8> {
    let mut arguments = Map::new();
    for pair in &args.arguments {
        let Some((key, value)) = pair.split_once('=').filter(|(key, _)| !key.is_empty()) else {
            bail!("argument {pair:?}: write key=value");
        };
        arguments.insert(key.to_owned(), Value::String(value.to_owned()));
    }
    let client = conn.connect(true).await?;
    let mut params = GetPromptRequestParams::new(args.name.clone());
    params.arguments = Some(arguments);
    let result =
        client.get_prompt(params).await.map_err(|e| anyhow!("{}: {}", args.name, crate::connect::error_chain(&e)))?;
    if args.raw {
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else {
        let messages = serde_json::to_value(&result.messages)?;
        for message in messages.as_array().map(Vec::as_slice).unwrap_or_default() {
            let role = message["role"].as_str().unwrap_or("?");
            let content = &message["content"];
            let text = match content["type"].as_str() {
                Some("text") => content["text"].as_str().unwrap_or_default().to_owned(),
                Some(kind) => format!("[{kind} content]"),
                None => String::new(),
            };
            println!("[{role}]\n{text}");
        }
    }
    let _ = client.cancel().await;
    Ok(0)
}

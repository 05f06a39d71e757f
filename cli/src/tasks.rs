//! `toolyard tasks` and `toolyard artifacts`: your coding tasks, their results and files,
//! through the gateway's task tools (`list_tasks`, `get_task_result`, `cancel_task`,
//! `delete_task`, `list_artifacts`, `read_artifact`).

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Map, Value, json};

use crate::call::{call_tool, structured};
use crate::connect::{Client, Connection};

/// `toolyard tasks`.
#[derive(Debug, clap::Args)]
pub struct TasksArgs {
    /// A task id: show its result (without one: list your tasks, newest first)
    pub task_id: Option<String>,
    /// With a task id: wait until the task has finished, showing its state meanwhile
    #[arg(long)]
    pub wait: bool,
    /// With a task id: cancel the task
    #[arg(long, conflicts_with = "wait")]
    pub cancel: bool,
    /// With a task id: delete the task (cancelled first if it runs) and every file it stored
    #[arg(long, conflicts_with_all = ["wait", "cancel"])]
    pub delete: bool,
    /// Without a task id: only tasks with this status (pending, running, success, failed, timed_out, cancelled)
    #[arg(long)]
    pub status: Option<String>,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

/// `toolyard artifacts`.
#[derive(Debug, clap::Args)]
pub struct ArtifactsArgs {
    /// The task id
    pub task_id: String,
    /// A file to fetch (as listed); without one, list the task's files
    pub filename: Option<String>,
    /// Write the file here instead of standard output
    #[arg(long, short)]
    pub output: Option<PathBuf>,
}

const FINAL: [&str; 4] = ["success", "failed", "timed_out", "cancelled"];

async fn builtin(client: &Client, name: &str, args: Value) -> Result<Value> {
    let args = args.as_object().cloned().unwrap_or_default();
    structured(name, &call_tool(client, name, args, None).await?)
}

/// Exit code 0, or 1 for a task that did not succeed (with a task id).
pub async fn tasks(conn: &Connection, args: TasksArgs) -> Result<u8> {
    let client = conn.connect(true).await?;
    let code = match &args.task_id {
        None => {
            let mut all = Vec::new();
            let mut cursor: Option<String> = None;
            loop {
                let mut query = Map::new();
                query.insert("limit".into(), json!(100));
                if let Some(s) = &args.status {
                    query.insert("status".into(), json!(s));
                }
                if let Some(c) = &cursor {
                    query.insert("cursor".into(), json!(c));
                }
                let page = builtin(&client, "list_tasks", Value::Object(query)).await?;
                all.extend(page["tasks"].as_array().cloned().unwrap_or_default());
                match page["next_cursor"].as_str() {
                    Some(c) => cursor = Some(c.to_owned()),
                    None => break,
                }
            }
            if args.json {
                println!("{}", serde_json::to_string_pretty(&all)?);
            } else {
                for t in &all {
                    println!(
                        "{}  {:<9}  {}",
                        str_of(t, "task_id"),
                        str_of(t, "status"),
                        first_line(str_of(t, "summary"))
                    );
                }
            }
            0
        }
        Some(id) if args.delete => {
            let answer = builtin(&client, "delete_task", json!({"task_id": id})).await?;
            println!("{id}: deleted ({} files)", answer["files"].as_u64().unwrap_or_default());
            0
        }
        Some(id) if args.cancel => {
            let answer = builtin(&client, "cancel_task", json!({"task_id": id})).await?;
            println!("{id}: {}", str_of(&answer, "status"));
            0
        }
        Some(id) => {
            let mut shown = String::new();
            let result = loop {
                let result = builtin(&client, "get_task_result", json!({"task_id": id})).await?;
                let status = str_of(&result, "status").to_owned();
                if !args.wait || FINAL.contains(&status.as_str()) {
                    break result;
                }
                if status != shown {
                    eprintln!("{id}: {status}");
                    shown = status;
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
            };
            if args.json {
                println!("{}", serde_json::to_string_pretty(&result)?);
            } else {
                print_task(&result);
            }
            u8::from(FINAL.contains(&str_of(&result, "status")) && str_of(&result, "status") != "success")
        }
    };
    let _ = client.cancel().await;
    Ok(code)
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or_default()
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or_default()
}

fn print_task(r: &Value) {
    println!("task:    {}", str_of(r, "task_id"));
    println!("status:  {}", str_of(r, "status"));
    if let Some(t) = r["task_type"].as_str() {
        println!("type:    {t}");
    }
    if let Some(e) = r["error"].as_str() {
        println!("error:   {e}");
    }
    println!("summary: {}", str_of(r, "summary"));
    if let Some(metrics) = r["metrics"].as_object().filter(|m| !m.is_empty()) {
        println!("metrics: {}", Value::Object(metrics.clone()));
    }
    for a in r["artifacts"].as_array().map(Vec::as_slice).unwrap_or_default() {
        println!("artifact: {} ({} bytes)", str_of(a, "name"), a["size"]);
    }
}

/// Lists a task's files, or writes one to `--output` or standard output.
pub async fn artifacts(conn: &Connection, args: ArtifactsArgs) -> Result<u8> {
    let client = conn.connect(true).await?;
    let id = &args.task_id;
    match &args.filename {
        None => {
            let listing = builtin(&client, "list_artifacts", json!({"task_id": id})).await?;
            for section in ["artifacts", "files"] {
                for f in listing[section].as_array().map(Vec::as_slice).unwrap_or_default() {
                    let name = f.get("name").or_else(|| f.get("path")).and_then(Value::as_str).unwrap_or_default();
                    println!("{name}  {}", f["size"]);
                }
            }
        }
        Some(filename) => {
            let mut sink: Box<dyn Write> = match &args.output {
                Some(path) => {
                    Box::new(std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?)
                }
                None => Box::new(std::io::stdout().lock()),
            };
            let mut offset = 0u64;
            loop {
                let chunk = builtin(
                    &client,
                    "read_artifact",
                    json!({"task_id": id, "filename": filename, "offset": offset, "encoding": "base64"}),
                )
                .await?;
                let bytes = B64.decode(str_of(&chunk, "content")).context("read_artifact answered bad base64")?;
                sink.write_all(&bytes)?;
                match chunk["next_offset"].as_u64() {
                    Some(next) if next > offset => offset = next,
                    Some(_) => bail!("read_artifact did not advance past offset {offset}"),
                    None => break,
                }
            }
            sink.flush()?;
        }
    }
    let _ = client.cancel().await;
    Ok(0)
}

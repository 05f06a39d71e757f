//! Checks of a folder of McpTool (and McpPrompt) manifests: each is valid as the API server checks it (the
//! local mode's own loader), and each `toolyard.run` function imports and still matches
//! its schemas (`python -m toolyard.verify`, run exactly as the local mode runs the tool).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use toolyard_gateway::catalog::ToolCatalog;
use toolyard_gateway::catalog::local::LocalCatalog;
use toolyard_gateway::executor::local::{Launch, LaunchSettings, gateway_only_env};
use toolyard_gateway::local::setup;

use super::Line;

const REGENERATE: &str = "regenerate the manifests with `python -m toolyard.manifest` (see the README)";

/// The manifest lines, then one line per tool's function.
pub async fn check(dir: &Path, python: Option<&Path>) -> Vec<Line> {
    let catalog = match LocalCatalog::load(dir) {
        Ok(catalog) => catalog,
        Err(e) => {
            return e
                .0
                .iter()
                .map(|problem| {
                    Line::fail("manifests", problem.to_string(), "fix the field, or regenerate the manifest")
                })
                .collect();
        }
    };
    let tools = catalog.local_tools();
    let files: std::collections::BTreeSet<&PathBuf> = tools.iter().map(|t| &t.file).collect();
    let mut lines = vec![Line::pass(
        "manifests",
        format!(
            "{} McpTool(s) in {} file(s) and {} McpPrompt(s) of {}, valid as the API server checks them",
            tools.len(),
            files.len(),
            catalog.prompts().len(),
            dir.display()
        ),
    )];
    let interpreters = match setup::resolve_interpreters(&tools, dir, python) {
        Ok(found) => found,
        Err(e) => {
            lines.push(Line::fail("python", format!("{e:#}"), "install Python 3.10 or newer, or pass --python PATH"));
            return lines;
        }
    };
    let settings = LaunchSettings {
        runner: PathBuf::new(),
        internal_url: String::new(),
        tools_dir: dir.to_owned(),
        python_package: setup::find_python_package(dir),
        interpreters,
        kill_grace: Duration::from_secs(1),
    };
    for local in &tools {
        let tool = &local.tool;
        let check = format!("function {}", tool.name());
        let launch = settings.launch(tool);
        let Some(target) = python_target(&launch.argv) else {
            lines.push(Line::skip(&check, format!("runs `{}`, not a toolyard.run function", launch.argv.join(" "))));
            continue;
        };
        let entry = json!([{
            "tool": tool.name(),
            "target": target,
            "inputSchema": Value::Object(tool.spec.input_schema.clone()),
            "outputSchema": tool.spec.output_schema.clone().map(Value::Object),
        }]);
        lines.push(match verify(&launch, &entry).await {
            Ok(answer) => {
                let detail = answer.pointer("/0/detail").and_then(Value::as_str).unwrap_or_default().to_owned();
                match answer.pointer("/0/status").and_then(Value::as_str) {
                    Some("pass") => Line::pass(&check, detail),
                    Some("warn") => Line::warn(&check, detail, REGENERATE),
                    _ => Line::fail(&check, detail, format!("fix the function, or {REGENERATE}")),
                }
            }
            Err(e) => Line::fail(&check, e, "check that the tool's Python and the toolyard package are installed"),
        });
    }
    lines
}

/// `module:function` of `python3 -m toolyard.run module:function`.
fn python_target(argv: &[String]) -> Option<String> {
    let at = argv.windows(2).position(|w| w[0] == "-m" && w[1] == "toolyard.run")?;
    argv.get(at + 2).cloned()
}

async fn verify(launch: &Launch, entries: &Value) -> Result<Value, String> {
    let mut command = tokio::process::Command::new(&launch.argv[0]);
    command
        .args(["-m", "toolyard.verify"])
        .current_dir(&launch.cwd)
        .envs(launch.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    // The function's import must not see this command's token or settings.
    for name in gateway_only_env() {
        command.env_remove(name);
    }
    let mut child = command.spawn().map_err(|e| format!("cannot start {}: {e}", launch.argv[0]))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(entries.to_string().as_bytes()).await.map_err(|e| format!("writing to Python: {e}"))?;
    }
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .map_err(|_| "importing the function took more than 60 s".to_owned())?
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default();
        return Err(format!("python -m toolyard.verify failed ({}): {last}", out.status));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("python -m toolyard.verify answered no JSON: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_come_from_toolyard_run_commands() {
        let argv = |s: &str| s.split(' ').map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(python_target(&argv("/usr/bin/python3 -m toolyard.run a.b:f")).as_deref(), Some("a.b:f"));
        assert_eq!(python_target(&argv("./tool.sh")), None);
        assert_eq!(python_target(&argv("python3 -m toolyard.run")), None);
    }
}

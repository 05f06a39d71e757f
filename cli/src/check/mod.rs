//! `toolyard check`: a preflight of a folder of manifests, a gateway, and a cluster install.
//! Each check prints PASS, WARN, FAIL or SKIP with one line of diagnosis and, when it is not
//! a PASS, what to do. The exit code is 1 when a check FAILs.

mod cluster;
mod gateway;
mod manifests;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use serde::Serialize;

use crate::connect::Connection;

/// `toolyard check`.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// A folder of McpTool manifests to check (each valid; each Python function imports and
    /// matches its schemas)
    pub manifests: Option<PathBuf>,
    /// Also check the cluster install through the current kubeconfig (CRDs, controller,
    /// gateway, storage)
    #[arg(long)]
    pub kube: bool,
    /// Namespace Toolyard is installed in
    #[arg(long, default_value = "toolyard")]
    pub namespace: String,
    /// Fail when no model profile is reachable (coding tasks are required)
    #[arg(long)]
    pub require_agent: bool,
    /// Seconds each network check may take
    #[arg(long, default_value_t = 10)]
    pub timeout: u64,
    /// Print the results as JSON
    #[arg(long)]
    pub json: bool,
    /// Python interpreter for the manifests' functions (default: the one a tool names)
    #[arg(long)]
    pub python: Option<PathBuf>,
}

/// A check's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Status {
    /// Fine.
    Pass,
    /// Works, but needs attention.
    Warn,
    /// Broken.
    Fail,
    /// Not checked (and why).
    Skip,
}

/// One line of the report.
#[derive(Clone, Debug, Serialize)]
pub struct Line {
    /// What was checked, e.g. `gateway.tls`.
    pub check: String,
    /// The verdict.
    pub status: Status,
    /// One line of diagnosis.
    pub detail: String,
    /// What to do, for anything but a PASS.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Line {
    fn new(check: &str, status: Status, detail: impl Into<String>) -> Self {
        Self { check: check.to_owned(), status, detail: detail.into(), fix: None }
    }
    /// A PASS.
    pub fn pass(check: &str, detail: impl Into<String>) -> Self {
        Self::new(check, Status::Pass, detail)
    }
    /// A SKIP.
    pub fn skip(check: &str, detail: impl Into<String>) -> Self {
        Self::new(check, Status::Skip, detail)
    }
    /// A WARN with what to do.
    pub fn warn(check: &str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { fix: Some(fix.into()), ..Self::new(check, Status::Warn, detail) }
    }
    /// A FAIL with what to do.
    pub fn fail(check: &str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { fix: Some(fix.into()), ..Self::new(check, Status::Fail, detail) }
    }
}

/// Runs the checks the arguments ask for; exit code 1 when one FAILs.
pub async fn run(conn: &Connection, args: CheckArgs) -> Result<u8> {
    let limit = Duration::from_secs(args.timeout);
    let mut lines = Vec::new();
    if let Some(dir) = &args.manifests {
        lines.extend(manifests::check(dir, args.python.as_deref()).await);
    }
    if args.kube {
        lines.extend(cluster::check(&args.namespace, conn, limit).await);
    }
    if conn.url.is_some() {
        lines.extend(gateway::check(conn, limit, args.require_agent).await);
    }
    if lines.is_empty() {
        anyhow::bail!("nothing to check: give a folder of manifests, --url (or TOOLYARD_URL), and/or --kube");
    }
    let failed = lines.iter().filter(|l| l.status == Status::Fail).count();
    if args.json {
        let count = |s: Status| lines.iter().filter(|l| l.status == s).count();
        let summary = serde_json::json!({
            "pass": count(Status::Pass), "warn": count(Status::Warn),
            "fail": failed, "skip": count(Status::Skip),
        });
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({"checks": lines, "summary": summary}))?);
    } else {
        let width = lines.iter().map(|l| l.check.len()).max().unwrap_or(0);
        for l in &lines {
            let status = serde_json::to_value(l.status)?;
            println!("{:<4}  {:width$}  {}", status.as_str().unwrap_or_default(), l.check, l.detail);
            if let Some(fix) = &l.fix {
                println!("      {:width$}  -> {fix}", "");
            }
        }
        println!("\n{} checks, {failed} failed", lines.len());
    }
    Ok(u8::from(failed > 0))
}

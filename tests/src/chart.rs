//! The chart installed on the test node as the kind walkthrough installs it: `helm install`
//! with `examples/kind/values.yaml`, storage on the walkthrough's development S3 server
//! (`examples/kind/s3.yaml`) in the release namespace, tools watched in one team namespace.
//! `e2e_node` adds its own settings (model, traces); the `node_pool` bench serves plain HTTP.

use anyhow::{Context, Result, bail};

use crate::{TestEnv, User, random_suffix, repo_path};

/// One Helm release of the chart.
#[derive(Debug)]
pub struct Release {
    /// `toolyard-<random>`: its objects are `<name>-gateway` and so on, like the walkthrough's
    /// `toolyard-gateway`, and a release left by an earlier run on the same cluster is no
    /// obstacle.
    pub name: String,
    /// The release namespace.
    pub ns: String,
}

/// Runs the walkthrough's development S3 server in `ns` and waits for it.
pub fn deploy_dev_s3(ns: &str) -> Result<()> {
    let env = TestEnv::get();
    let s3 = std::fs::read_to_string(repo_path("examples/kind/s3.yaml")).context("examples/kind/s3.yaml")?;
    let dir = crate::local::TempDir::new("s3");
    let file = dir.path().join("s3.yaml");
    std::fs::write(&file, s3.replace("namespace: toolyard", &format!("namespace: {ns}")))?;
    env.kubectl_as(User::Admin, &["-n", ns, "apply", "-f", file.to_str().context("utf-8")?])?;
    env.kubectl_as(User::Admin, &["-n", ns, "rollout", "status", "deployment/toolyard-s3", "--timeout=120s"])?;
    Ok(())
}

/// `helm install --wait` of a new release in `ns` (which has the development S3 server,
/// [`deploy_dev_s3`]) watching `team`, with the walkthrough's values and `sets` (each a
/// `--set` argument).
pub fn install(ns: &str, team: &str, sets: &[String]) -> Result<Release> {
    let env = TestEnv::get();
    let name = format!("toolyard-{}", random_suffix(5));
    let mut helm = std::process::Command::new(env.bin_dir().join("helm"));
    helm.env("KUBECONFIG", env.kubeconfig(User::Admin))
        .args(["install", &name, repo_path("charts/toolyard").to_str().context("utf-8")?, "-n", ns])
        .args(["-f", repo_path("examples/kind/values.yaml").to_str().context("utf-8")?])
        .args(["--set", &format!("watchNamespaces={{{team}}}")])
        .args(["--set", &format!("gateway.storage.s3.endpoint=http://toolyard-s3.{ns}.svc:9000")]);
    for set in sets {
        helm.args(["--set", set]);
    }
    let out = helm.args(["--wait", "--timeout", "5m"]).output().context("running helm")?;
    if !out.status.success() {
        bail!("helm install: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(Release { name, ns: ns.to_owned() })
}

impl Release {
    /// `helm uninstall --wait`; errors are ignored (the namespaces go with the cluster).
    pub fn uninstall(&self) {
        let env = TestEnv::get();
        let _ = std::process::Command::new(env.bin_dir().join("helm"))
            .env("KUBECONFIG", env.kubeconfig(User::Admin))
            .args(["uninstall", &self.name, "-n", &self.ns, "--wait", "--timeout", "2m"])
            .output();
    }
}

/// Waits (up to 3 minutes) until `ns` has McpTools and every one is Ready, warm pools
/// included.
pub async fn wait_tools_ready(ns: &str) -> Result<()> {
    let tools: kube::Api<toolyard_api::McpTool> = kube::Api::namespaced(TestEnv::get().client(User::Admin).await, ns);
    crate::wait_until(std::time::Duration::from_secs(180), "every McpTool Ready (warm pools included)", || {
        let tools = tools.clone();
        async move {
            let list = tools.list(&Default::default()).await?.items;
            Ok(!list.is_empty() && list.iter().all(toolyard_api::McpTool::is_ready))
        }
    })
    .await
}

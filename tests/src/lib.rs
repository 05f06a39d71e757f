//! Test support: handles on the test control plane and S3 server started by
//! `tests/cluster/cluster.sh`, for the integration tests of every crate.
//!
//! Tests call [`TestEnv::get`]; when no cluster is running it panics with the command to
//! start one. Cluster tests are never skipped silently.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, Config};
use tokio::sync::{OnceCell, Semaphore, SemaphorePermit};

pub mod chart;
pub mod fixtures;
pub mod images;
pub mod legacy;
pub mod local;
pub mod model_server;
pub mod s3;
pub mod traces;
pub mod upstream;

/// How much of the node's capacity a test's pods take (see [`claim_node`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeShare {
    /// Half: two such tests may run side by side.
    Half,
    /// All of it: the test runs alone on the node.
    Whole,
}

/// Waits until the node has room for a test that fills it, and holds that room until the
/// claim is dropped. The node has 2 CPUs and every pod requests some: tests that run many
/// pods at once (a Helm release, bursts of Jobs, coding tasks) would leave each other's pods
/// unschedulable if they ran together. The integration tests are one binary, so this is
/// shared by every test; a test that runs a pod or two needs no claim.
pub async fn claim_node(share: NodeShare) -> NodeClaim {
    static NODE: Semaphore = Semaphore::const_new(2);
    let permits = match share {
        NodeShare::Half => 1,
        NodeShare::Whole => 2,
    };
    let permit = NODE.acquire_many(permits).await.expect("the node's semaphore is never closed");
    NodeClaim { namespaces: Vec::new(), _permit: permit }
}

/// A test's room on the node (see [`claim_node`]).
pub struct NodeClaim {
    namespaces: Vec<String>,
    // Dropped after `drop` below has emptied the namespaces.
    _permit: SemaphorePermit<'static>,
}

impl NodeClaim {
    /// Deletes `namespace`, and waits until it is gone, before the room is given back: the
    /// pods a test leaves running (warm pools, servers) would hold the node's CPU for the
    /// tests after it.
    pub fn empty_at_end(&mut self, namespace: &str) {
        self.namespaces.push(namespace.to_owned());
    }
}

impl Drop for NodeClaim {
    fn drop(&mut self) {
        if self.namespaces.is_empty() {
            return;
        }
        let mut args = vec!["delete", "namespace", "--timeout=180s"];
        args.extend(self.namespaces.iter().map(String::as_str));
        if let Err(e) = TestEnv::get().kubectl_as(User::Admin, &args) {
            eprintln!("the node's room is given back with pods left on it: {e:#}");
        }
    }
}

/// A static-token user of the test cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum User {
    /// In `system:masters`.
    Admin,
    /// User `alice`, groups `quants` and `viewers`.
    Alice,
    /// User `bob`, group `ops`.
    Bob,
    /// User `toolyard-controller`, no permissions until a test grants them.
    Controller,
    /// User `toolyard-gateway`, no permissions until a test grants them.
    Gateway,
}

impl User {
    /// User name as the apiserver knows it.
    pub fn name(self) -> &'static str {
        match self {
            User::Admin => "admin",
            User::Alice => "alice",
            User::Bob => "bob",
            User::Controller => "toolyard-controller",
            User::Gateway => "toolyard-gateway",
        }
    }

    fn file_stem(self) -> &'static str {
        match self {
            User::Admin => "admin",
            User::Alice => "alice",
            User::Bob => "bob",
            User::Controller => "controller",
            User::Gateway => "gateway",
        }
    }

    fn env_suffix(self) -> &'static str {
        match self {
            User::Admin => "ADMIN",
            User::Alice => "ALICE",
            User::Bob => "BOB",
            User::Controller => "CONTROLLER",
            User::Gateway => "GATEWAY",
        }
    }
}

/// The running test cluster, as described by its env file.
#[derive(Debug)]
pub struct TestEnv {
    vars: HashMap<String, String>,
}

/// Where `cluster.sh` writes its env file unless `TOOLYARD_CLUSTER_RUN` says otherwise.
pub fn env_file() -> PathBuf {
    let run = std::env::var_os("TOOLYARD_CLUSTER_RUN")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("toolyard-cluster"));
    run.join("env")
}

impl TestEnv {
    /// The running test cluster. Panics with instructions when none is running.
    pub fn get() -> &'static TestEnv {
        static ENV: OnceLock<TestEnv> = OnceLock::new();
        ENV.get_or_init(|| {
            let path = env_file();
            Self::load(&path).unwrap_or_else(|e| {
                panic!(
                    "no test cluster: {e:#}\nStart one with `tests/cluster/build.sh && tests/cluster/cluster.sh start` \
                     (or run everything with `tests/run.sh`)."
                )
            })
        })
    }

    fn load(path: &Path) -> Result<TestEnv> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let vars = text
            .lines()
            .filter_map(|l| l.strip_prefix("export "))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        Ok(TestEnv { vars })
    }

    /// A variable of the env file (`TOOLYARD_TEST_...`).
    pub fn var(&self, name: &str) -> &str {
        self.vars
            .get(name)
            .map(String::as_str)
            .unwrap_or_else(|| panic!("{name} missing from {}", env_file().display()))
    }

    /// `https://<host address>:<port>` of the apiserver.
    pub fn api_url(&self) -> &str {
        self.var("TOOLYARD_TEST_API")
    }

    /// This host's address on the test node's network: pods reach servers that tests bind
    /// here (an MCP gateway run as a process, a model endpoint). Nothing else reaches it.
    pub fn host_ip(&self) -> std::net::IpAddr {
        self.var("TOOLYARD_TEST_HOST_IP").parse().expect("TOOLYARD_TEST_HOST_IP is an IP address")
    }

    /// Name of the test node (kubelet with containerd) every pod runs on.
    pub fn node(&self) -> &str {
        self.var("TOOLYARD_TEST_NODE")
    }

    /// Bearer token of a user.
    pub fn token(&self, user: User) -> &str {
        self.var(&format!("TOOLYARD_TEST_TOKEN_{}", user.env_suffix()))
    }

    /// Kubeconfig file of a user.
    pub fn kubeconfig(&self, user: User) -> PathBuf {
        Path::new(self.var("TOOLYARD_TEST_RUN")).join(format!("{}.kubeconfig", user.file_stem()))
    }

    /// The kubectl binary the cluster was checked with.
    pub fn kubectl(&self) -> &str {
        self.var("TOOLYARD_TEST_KUBECTL")
    }

    /// Folder of the cluster binaries (etcd, kube-apiserver, helm, ...).
    pub fn bin_dir(&self) -> PathBuf {
        PathBuf::from(self.var("TOOLYARD_TEST_BIN"))
    }

    /// Client config of a user.
    pub async fn config(&self, user: User) -> Result<Config> {
        let kubeconfig = Kubeconfig::read_from(self.kubeconfig(user))?;
        Ok(Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?)
    }

    /// A client acting as `user`.
    pub async fn client(&self, user: User) -> Client {
        let config = self.config(user).await.expect("kubeconfig of test user");
        Client::try_from(config).expect("kube client")
    }

    /// Installs (server-side apply) every Toolyard CRD and waits until they are established.
    /// Safe to call from many tests and processes.
    pub async fn install_crds(&self) -> Result<()> {
        static DONE: OnceCell<()> = OnceCell::const_new();
        DONE.get_or_try_init(|| async {
            let client = self.client(User::Admin).await;
            let api: Api<CustomResourceDefinition> = Api::all(client);
            for (_, crd) in toolyard_api::crdgen::all() {
                let name = crd.metadata.name.clone().expect("crd name");
                api.patch(&name, &PatchParams::apply("toolyard-tests").force(), &Patch::Apply(&crd))
                    .await
                    .with_context(|| format!("applying CRD {name}"))?;
                let established = await_condition(api.clone(), &name, conditions::is_crd_established());
                tokio::time::timeout(Duration::from_secs(30), established)
                    .await
                    .map_err(|_| anyhow!("CRD {name} not established after 30s"))??;
            }
            Ok::<(), anyhow::Error>(())
        })
        .await?;
        Ok(())
    }

    /// Creates a fresh namespace `<prefix>-<random>` and waits until its `default`
    /// ServiceAccount exists (so pods can be admitted). Namespaces go away with the cluster.
    pub async fn namespace(&self, prefix: &str) -> Result<String> {
        let client = self.client(User::Admin).await;
        let name = format!("{prefix}-{}", random_suffix(6));
        let ns = Namespace {
            metadata: kube::api::ObjectMeta { name: Some(name.clone()), ..Default::default() },
            ..Default::default()
        };
        Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await?;
        let sas: Api<ServiceAccount> = Api::namespaced(client, &name);
        wait_until(Duration::from_secs(30), "default ServiceAccount", || async {
            Ok(sas.get_opt("default").await?.is_some())
        })
        .await?;
        Ok(name)
    }

    /// Runs kubectl as `user` and returns stdout; fails with stderr on a non-zero exit.
    pub fn kubectl_as(&self, user: User, args: &[&str]) -> Result<String> {
        let out = std::process::Command::new(self.kubectl())
            .arg("--kubeconfig")
            .arg(self.kubeconfig(user))
            .args(args)
            .output()
            .context("running kubectl")?;
        if !out.status.success() {
            bail!("kubectl {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// Polls `check` every 100 ms until it returns true, failing after `timeout` with `what`.
pub async fn wait_until<F, Fut>(timeout: Duration, what: &str, mut check: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last_err = None;
    loop {
        match check().await {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => last_err = Some(e),
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(match last_err {
                Some(e) => e.context(format!("timed out after {timeout:?} waiting for {what}")),
                None => anyhow!("timed out after {timeout:?} waiting for {what}"),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `n` random lowercase alphanumeric characters.
pub fn random_suffix(n: usize) -> String {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut out = String::with_capacity(n);
    while out.len() < n {
        let mut h = RandomState::new().build_hasher();
        h.write_usize(out.len());
        let mut x = h.finish();
        while x > 0 && out.len() < n {
            out.push(ALPHABET[(x % 36) as usize] as char);
            x /= 36;
        }
    }
    out
}

/// Path of a file in the repository.
pub fn repo_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("repo root").join(rel)
}

/// A pod that passes the restricted Pod Security Standard (non-root user 65532, the runtime's
/// seccomp profile, no privilege escalation, no capabilities, no ServiceAccount token) running
/// `command` in `image` once (`restartPolicy: Never`).
pub fn restricted_pod(name: &str, image: &str, command: Vec<String>) -> k8s_openapi::api::core::v1::Pod {
    use k8s_openapi::api::core::v1::{
        Capabilities, Container, Pod, PodSecurityContext, PodSpec, SeccompProfile, SecurityContext,
    };
    Pod {
        metadata: kube::api::ObjectMeta { name: Some(name.to_owned()), ..Default::default() },
        spec: Some(PodSpec {
            restart_policy: Some("Never".into()),
            automount_service_account_token: Some(false),
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(65532),
                seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".into(), localhost_profile: None }),
                ..Default::default()
            }),
            containers: vec![Container {
                name: "main".into(),
                image: Some(image.to_owned()),
                command: Some(command),
                security_context: Some(SecurityContext {
                    allow_privilege_escalation: Some(false),
                    capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), add: None }),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

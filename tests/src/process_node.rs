//! A test-only "process node": a stand-in kubelet that runs the pods of one namespace as
//! local processes, so end-to-end tests exercise the real path
//! gateway -> ToolCall -> controller -> Job -> real Job controller -> Pod -> runner -> gateway.
//!
//! It registers a Node, binds every unscheduled pod of its namespace to it (it is also the
//! scheduler), runs init containers then containers as local processes, and reports phases,
//! exit codes and termination messages through the pod status subresource, exactly where a
//! kubelet would. Everything but container isolation is real. What is mapped:
//! - images: only those given in [`Images`] can "run"; any other image fails to pull
//!   (`ErrImagePull`), as a missing image would;
//! - `emptyDir` volumes: a fresh folder per pod; absolute paths under a mount are rewritten;
//!   other absolute paths are looked up in the image's root folder, then on the host;
//! - env: literal values, `secretKeyRef` (read from the API) and `fieldRef` to name/namespace;
//! - the termination message: the runner honours `TOOLYARD_TERMINATION_LOG`;
//! - deletion (Job deadline, cancellation): SIGTERM to the process group, SIGKILL after the
//!   grace period, then the pod object is removed as a kubelet would.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use futures::StreamExt;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, Node, NodeCondition, NodeStatus, Pod, ProjectedVolumeSource, Secret, ServiceAccount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::json;
use tokio::process::Command;
use tokio_util::sync::CancellationToken;

use crate::{TestEnv, User};

/// How one container image "runs" on the process node.
#[derive(Clone, Debug, Default)]
pub struct ImageSpec {
    /// Folder standing for the image's filesystem: absolute paths in commands and arguments
    /// are looked up here first (e.g. `/toolyard-runner`).
    pub root: Option<PathBuf>,
    /// Environment the image provides (e.g. `PYTHONPATH` where the image has packages).
    pub env: Vec<(String, String)>,
}

/// Images the node can run, by exact image reference.
pub type Images = HashMap<String, ImageSpec>;

/// A running process node for one namespace. Stop it with [`ProcessNode::stop`].
pub struct ProcessNode {
    /// Name of the Node object.
    pub name: String,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    work: PathBuf,
}

struct Shared {
    client: Client,
    namespace: String,
    node: String,
    images: Images,
    work: PathBuf,
    running: Mutex<HashMap<String, CancellationToken>>,
}

impl ProcessNode {
    /// Registers a node and starts running the pods of `namespace` on it.
    pub async fn start(env: &TestEnv, namespace: &str, images: Images) -> Result<Self> {
        let client = env.client(User::Admin).await;
        let name = format!("process-{namespace}");
        register_node(&client, &name).await?;
        let work = std::env::temp_dir().join(format!("toolyard-process-node-{}", crate::random_suffix(8)));
        std::fs::create_dir_all(&work)?;
        let shared = Arc::new(Shared {
            client,
            namespace: namespace.to_owned(),
            node: name.clone(),
            images,
            work: work.clone(),
            running: Mutex::new(HashMap::new()),
        });
        let cancel = CancellationToken::new();
        let task = tokio::spawn(run(shared, cancel.clone()));
        Ok(Self { name, cancel, task, work })
    }

    /// Stops the node: kills every process it started.
    pub async fn stop(self) {
        self.cancel.cancel();
        let _ = self.task.await;
        let _ = std::fs::remove_dir_all(&self.work);
    }
}

async fn register_node(client: &Client, name: &str) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node =
        Node { metadata: ObjectMeta { name: Some(name.to_owned()), ..Default::default() }, ..Default::default() };
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    let capacity: BTreeMap<String, Quantity> = [("cpu", "64"), ("memory", "256Gi"), ("pods", "1000")]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), Quantity(v.to_owned())))
        .collect();
    let status = NodeStatus {
        capacity: Some(capacity.clone()),
        allocatable: Some(capacity),
        conditions: Some(vec![NodeCondition {
            type_: "Ready".into(),
            status: "True".into(),
            reason: Some("ProcessNodeReady".into()),
            last_heartbeat_time: Some(Time(Timestamp::now())),
            ..Default::default()
        }]),
        ..Default::default()
    };
    nodes.patch_status(name, &PatchParams::default(), &Patch::Merge(json!({ "status": status }))).await?;
    Ok(())
}

async fn heartbeat(client: &Client, node: &str) -> Result<()> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let lease = Lease {
        metadata: ObjectMeta { name: Some(node.to_owned()), ..Default::default() },
        spec: Some(LeaseSpec {
            holder_identity: Some(node.to_owned()),
            lease_duration_seconds: Some(40),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..Default::default()
        }),
    };
    leases.patch(node, &PatchParams::apply("toolyard-process-node").force(), &Patch::Apply(&lease)).await?;
    Ok(())
}

async fn run(shared: Arc<Shared>, cancel: CancellationToken) {
    let pods: Api<Pod> = Api::namespaced(shared.client.clone(), &shared.namespace);
    let mut events = watcher(pods, watcher::Config::default()).boxed();
    let mut beat = tokio::time::interval(Duration::from_secs(10));
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = beat.tick() => {
                if let Err(e) = heartbeat(&shared.client, &shared.node).await {
                    tracing::warn!(error = %e, "process node heartbeat failed");
                }
            }
            event = events.next() => match event {
                Some(Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod))) => on_pod(&shared, pod).await,
                Some(Ok(watcher::Event::Delete(pod))) => stop_pod(&shared, &pod.name_any()),
                Some(Ok(_)) => {}
                Some(Err(e)) => tracing::warn!(error = %e, "process node watch error"),
                None => break,
            }
        }
    }
    for (_, token) in shared.running.lock().expect("lock").drain() {
        token.cancel();
    }
}

fn stop_pod(shared: &Shared, name: &str) {
    if let Some(token) = shared.running.lock().expect("lock").get(name) {
        token.cancel();
    }
}

async fn on_pod(shared: &Arc<Shared>, pod: Pod) {
    let name = pod.name_any();
    let spec = pod.spec.clone().unwrap_or_default();
    if pod.metadata.deletion_timestamp.is_some() {
        let running = shared.running.lock().expect("lock").contains_key(&name);
        if running {
            stop_pod(shared, &name);
        } else {
            // Nothing runs for it here: finish the deletion as a kubelet would.
            let _ = Api::<Pod>::namespaced(shared.client.clone(), &shared.namespace)
                .delete(&name, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() })
                .await;
        }
        return;
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
    if phase == "Succeeded" || phase == "Failed" {
        return;
    }
    match spec.node_name.as_deref() {
        None | Some("") => {
            if let Err(e) = bind(shared, &name).await {
                tracing::warn!(pod = %name, error = %e, "binding failed");
            }
        }
        Some(node) if node == shared.node => {
            let token = {
                let mut running = shared.running.lock().expect("lock");
                if running.contains_key(&name) {
                    return;
                }
                let token = CancellationToken::new();
                running.insert(name.clone(), token.clone());
                token
            };
            let shared = shared.clone();
            tokio::spawn(async move {
                if let Err(e) = run_pod(&shared, &pod, token).await {
                    tracing::warn!(pod = %name, error = %format!("{e:#}"), "process node could not run pod");
                    let _ = set_status(
                        &shared,
                        &name,
                        json!({"phase": "Failed", "reason": "ProcessNodeError", "message": format!("{e:#}")}),
                    )
                    .await;
                }
                shared.running.lock().expect("lock").remove(&name);
            });
        }
        Some(_) => {}
    }
}

async fn bind(shared: &Shared, pod: &str) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(shared.client.clone(), &shared.namespace);
    let binding = json!({
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": pod},
        "target": {"apiVersion": "v1", "kind": "Node", "name": shared.node},
    });
    let _: serde_json::Value = pods.create_subresource("binding", pod, &PostParams::default(), &binding).await?;
    Ok(())
}

async fn set_status(shared: &Shared, pod: &str, status: serde_json::Value) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(shared.client.clone(), &shared.namespace);
    pods.patch_status(pod, &PatchParams::default(), &Patch::Merge(json!({ "status": status }))).await?;
    Ok(())
}

fn now() -> String {
    Timestamp::now().to_string()
}

/// Outcome of one container process.
struct Exit {
    code: i32,
    message: String,
    started: String,
    finished: String,
}

fn terminated(container: &str, image: &str, exit: &Exit) -> serde_json::Value {
    json!({
        "name": container, "image": image, "imageID": "", "ready": false, "restartCount": 0,
        "state": {"terminated": {
            "exitCode": exit.code,
            "reason": if exit.code == 0 { "Completed" } else { "Error" },
            "message": exit.message,
            "startedAt": exit.started, "finishedAt": exit.finished,
        }},
    })
}

async fn run_pod(shared: &Arc<Shared>, pod: &Pod, cancel: CancellationToken) -> Result<()> {
    let name = pod.name_any();
    let spec = pod.spec.clone().context("pod without spec")?;
    let grace = Duration::from_secs(spec.termination_grace_period_seconds.unwrap_or(30).clamp(0, 30) as u64);
    let pod_dir = shared.work.join(pod.uid().unwrap_or_else(|| name.clone()));
    let mut mounts = Vec::new();
    for volume in spec.volumes.iter().flatten() {
        let dir = pod_dir.join("volumes").join(&volume.name);
        std::fs::create_dir_all(&dir)?;
        if let Some(secret) = &volume.secret {
            let secret_name = secret.secret_name.clone().context("secret volume without secretName")?;
            let data = Api::<Secret>::namespaced(shared.client.clone(), &shared.namespace)
                .get(&secret_name)
                .await?
                .data
                .unwrap_or_default();
            for (key, value) in data {
                std::fs::write(dir.join(key), value.0)?;
            }
        } else if let Some(projected) = &volume.projected {
            project(shared, pod, projected, &dir).await.with_context(|| format!("projected volume {}", volume.name))?;
        } else if volume.empty_dir.is_none() {
            bail!("volume {} is not emptyDir, secret or projected; the process node cannot provide it", volume.name);
        }
        mounts.push((volume.name.clone(), dir));
    }

    // Images first: an unknown image cannot be pulled.
    let all: Vec<&Container> = spec.init_containers.iter().flatten().chain(spec.containers.iter()).collect();
    if let Some(c) = all.iter().find(|c| !shared.images.contains_key(c.image.as_deref().unwrap_or_default())) {
        let image = c.image.clone().unwrap_or_default();
        let waiting = json!({"name": c.name, "image": image, "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ErrImagePull", "message": format!("image {image:?} is not available on the process node")}}});
        let key = if spec.init_containers.iter().flatten().any(|i| i.name == c.name) {
            "initContainerStatuses"
        } else {
            "containerStatuses"
        };
        set_status(shared, &name, json!({"phase": "Pending", "startTime": now(), key: [waiting]})).await?;
        cancel.cancelled().await;
        return finish_deletion(shared, &name).await;
    }

    set_status(
        shared,
        &name,
        json!({
            "phase": "Pending", "startTime": now(), "hostIP": "127.0.0.1", "podIP": "127.0.0.1",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
        }),
    )
    .await?;

    let mut init_statuses = Vec::new();
    for c in spec.init_containers.iter().flatten() {
        let exit = run_container(shared, pod, c, &mounts, &pod_dir, &cancel, grace).await?;
        init_statuses.push(terminated(&c.name, c.image.as_deref().unwrap_or_default(), &exit));
        if cancel.is_cancelled() {
            return finish_deletion(shared, &name).await;
        }
        if exit.code != 0 {
            set_status(shared, &name, json!({"phase": "Failed", "initContainerStatuses": init_statuses})).await?;
            return Ok(());
        }
    }
    let running: Vec<serde_json::Value> = spec
        .containers
        .iter()
        .map(|c| {
            json!({"name": c.name, "image": c.image, "imageID": "", "ready": true, "started": true, "restartCount": 0,
            "state": {"running": {"startedAt": now()}}})
        })
        .collect();
    set_status(
        shared,
        &name,
        json!({
            "phase": "Running", "initContainerStatuses": init_statuses, "containerStatuses": running,
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Initialized", "status": "True"},
                           {"type": "ContainersReady", "status": "True"}, {"type": "Ready", "status": "True"}],
        }),
    )
    .await?;

    let runs = spec.containers.iter().map(|c| run_container(shared, pod, c, &mounts, &pod_dir, &cancel, grace));
    let exits = futures::future::join_all(runs).await;
    if cancel.is_cancelled() {
        return finish_deletion(shared, &name).await;
    }
    let mut statuses = Vec::new();
    let mut ok = true;
    for (c, exit) in spec.containers.iter().zip(exits) {
        let exit = exit?;
        ok &= exit.code == 0;
        statuses.push(terminated(&c.name, c.image.as_deref().unwrap_or_default(), &exit));
    }
    set_status(
        shared,
        &name,
        json!({
            "phase": if ok { "Succeeded" } else { "Failed" },
            "containerStatuses": statuses,
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Initialized", "status": "True"},
                           {"type": "ContainersReady", "status": "False"}, {"type": "Ready", "status": "False"}],
        }),
    )
    .await?;
    let _ = std::fs::remove_dir_all(&pod_dir);
    Ok(())
}

/// Fills a projected volume: ServiceAccount tokens through the real TokenRequest API,
/// ConfigMap keys, and the namespace from the downward API.
async fn project(shared: &Shared, pod: &Pod, projected: &ProjectedVolumeSource, dir: &Path) -> Result<()> {
    let sa = pod.spec.as_ref().and_then(|s| s.service_account_name.clone()).unwrap_or_else(|| "default".into());
    for source in projected.sources.iter().flatten() {
        if let Some(t) = &source.service_account_token {
            let request = TokenRequest {
                spec: TokenRequestSpec {
                    audiences: t.audience.clone().map(|a| vec![a]).unwrap_or_default(),
                    expiration_seconds: t.expiration_seconds,
                    ..Default::default()
                },
                ..Default::default()
            };
            let sas: Api<ServiceAccount> = Api::namespaced(shared.client.clone(), &shared.namespace);
            let token: TokenRequest = sas.create_subresource("token", &sa, &PostParams::default(), &request).await?;
            let token = token.status.context("TokenRequest without status")?.token;
            std::fs::write(dir.join(&t.path), token)?;
        }
        if let Some(cm) = &source.config_map {
            let data = Api::<ConfigMap>::namespaced(shared.client.clone(), &shared.namespace)
                .get(&cm.name)
                .await?
                .data
                .unwrap_or_default();
            match &cm.items {
                Some(items) => {
                    for item in items {
                        std::fs::write(dir.join(&item.path), data.get(&item.key).cloned().unwrap_or_default())?;
                    }
                }
                None => {
                    for (k, v) in data {
                        std::fs::write(dir.join(k), v)?;
                    }
                }
            }
        }
        if let Some(downward) = &source.downward_api {
            for item in downward.items.iter().flatten() {
                let value = match item.field_ref.as_ref().map(|f| f.field_path.as_str()) {
                    Some("metadata.namespace") => shared.namespace.clone(),
                    Some("metadata.name") => pod.name_any(),
                    other => bail!("downward API field {other:?} is not supported by the process node"),
                };
                std::fs::write(dir.join(&item.path), value)?;
            }
        }
    }
    Ok(())
}

async fn finish_deletion(shared: &Shared, pod: &str) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(shared.client.clone(), &shared.namespace);
    match pods.delete(pod, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Maps an absolute container path to a host path: under a mount, then in the image root.
fn map_path(path: &str, c: &Container, mounts: &[(String, PathBuf)], image: &ImageSpec) -> Option<PathBuf> {
    if !path.starts_with('/') {
        return None;
    }
    for m in c.volume_mounts.iter().flatten() {
        let mount = m.mount_path.trim_end_matches('/');
        if path == mount || path.starts_with(&format!("{mount}/")) {
            let dir = &mounts.iter().find(|(n, _)| *n == m.name)?.1;
            return Some(dir.join(path[mount.len()..].trim_start_matches('/')));
        }
    }
    let in_image = image.root.as_ref()?.join(path.trim_start_matches('/'));
    in_image.exists().then_some(in_image)
}

async fn env_value(shared: &Shared, pod: &Pod, var: &k8s_openapi::api::core::v1::EnvVar) -> Result<Option<String>> {
    if let Some(v) = &var.value {
        return Ok(Some(v.clone()));
    }
    let Some(from) = &var.value_from else { return Ok(Some(String::new())) };
    if let Some(s) = &from.secret_key_ref {
        let secret = Api::<Secret>::namespaced(shared.client.clone(), &shared.namespace).get_opt(&s.name).await?;
        let value =
            secret.and_then(|s| s.data).and_then(|d| d.get(&s.key).map(|b| String::from_utf8_lossy(&b.0).into_owned()));
        if value.is_none() && !s.optional.unwrap_or(false) {
            bail!("secret {}/{} key {} not found (CreateContainerConfigError)", shared.namespace, s.name, s.key);
        }
        return Ok(value);
    }
    if let Some(f) = &from.field_ref {
        return Ok(match f.field_path.as_str() {
            "metadata.name" => Some(pod.name_any()),
            "metadata.namespace" => Some(shared.namespace.clone()),
            "metadata.uid" => pod.uid(),
            other => bail!("fieldRef {other} is not supported by the process node"),
        });
    }
    bail!("env {} uses a valueFrom the process node does not support", var.name)
}

async fn run_container(
    shared: &Shared,
    pod: &Pod,
    c: &Container,
    mounts: &[(String, PathBuf)],
    pod_dir: &Path,
    cancel: &CancellationToken,
    grace: Duration,
) -> Result<Exit> {
    let image = shared.images.get(c.image.as_deref().unwrap_or_default()).cloned().unwrap_or_default();
    let argv: Vec<String> = c.command.iter().flatten().chain(c.args.iter().flatten()).cloned().collect();
    let (program, args) = argv.split_first().ok_or_else(|| anyhow!("container {} has no command", c.name))?;
    let map = |s: &String| {
        map_path(s, c, mounts, &image).map(|p| p.to_string_lossy().into_owned()).unwrap_or_else(|| s.clone())
    };
    let container_dir = pod_dir.join("containers").join(&c.name);
    std::fs::create_dir_all(&container_dir)?;
    let termination_log = container_dir.join("termination-log");

    let mut cmd = Command::new(map(program));
    cmd.args(args.iter().map(map));
    cmd.env_clear();
    cmd.env("PATH", std::env::var("PATH").unwrap_or_default());
    cmd.env("HOME", &container_dir);
    for (k, v) in &image.env {
        cmd.env(k, v);
    }
    for var in c.env.iter().flatten() {
        if let Some(v) = env_value(shared, pod, var).await? {
            cmd.env(&var.name, map(&v));
        }
    }
    cmd.env("TOOLYARD_TERMINATION_LOG", &termination_log);
    if let Some(tmp) = map_path("/tmp", c, mounts, &image) {
        cmd.env("TMPDIR", tmp);
    }
    let workdir = c
        .working_dir
        .as_ref()
        .map(map)
        .map(PathBuf::from)
        .or_else(|| image.root.clone())
        .unwrap_or(container_dir.clone());
    cmd.current_dir(workdir);
    cmd.process_group(0);
    cmd.stdin(Stdio::null());
    cmd.stdout(std::fs::File::create(container_dir.join("stdout.log"))?);
    cmd.stderr(std::fs::File::create(container_dir.join("stderr.log"))?);
    cmd.kill_on_drop(true);

    let started = now();
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            return Ok(Exit {
                code: 128,
                message: format!("cannot start {program}: {e}"),
                started: started.clone(),
                finished: now(),
            });
        }
    };
    let pgid = Pid::from_raw(child.id().context("child pid")? as i32);
    let status = tokio::select! {
        status = child.wait() => status?,
        _ = cancel.cancelled() => {
            let _ = killpg(pgid, Signal::SIGTERM);
            match tokio::time::timeout(grace, child.wait()).await {
                Ok(status) => status?,
                Err(_) => {
                    let _ = killpg(pgid, Signal::SIGKILL);
                    child.wait().await?
                }
            }
        }
    };
    // The whole group goes with the container, as with a container runtime.
    let _ = killpg(pgid, Signal::SIGKILL);
    use std::os::unix::process::ExitStatusExt;
    let code = status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    let mut message = std::fs::read_to_string(&termination_log).unwrap_or_default();
    if message.is_empty() && code != 0 && c.termination_message_policy.as_deref() == Some("FallbackToLogsOnError") {
        let logs = std::fs::read_to_string(container_dir.join("stderr.log")).unwrap_or_default();
        let tail: Vec<&str> = logs.lines().rev().take(20).collect();
        message = tail.into_iter().rev().collect::<Vec<_>>().join("\n");
    }
    Ok(Exit { code, message, started, finished: now() })
}

//! McpServer reconciler: for a server Toolyard runs (`spec.runtime`), a Deployment and a
//! Service named `<name>-mcp`, and a Secret with the server's derived key; `Ready` follows the
//! Deployment's available pods, which the gateway waits for before it connects.
//!
//! The pods are hardened like tools' ([`crate::pod`]). A stdio server's container runs
//! `toolyard-runner bridge -- <command>`: one process of the command per gateway connection,
//! started only for a client that proves it holds the server's key. A `streamableHttp` server's
//! container runs the command itself and the Service forwards to its port. The chart's
//! NetworkPolicy lets only the gateway in. A `url` server has nothing to run: anything left from
//! an earlier `runtime` is removed, and the status is the gateways' alone.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, ContainerPort, Probe, Secret, Service, TCPSocketAction};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use serde_json::json;
use toolyard_api::conditions::{self, reason, status};
use toolyard_api::mcpserver::{WORKLOAD_SUFFIX, workload_name};
use toolyard_api::mcptool::Runtime;
use toolyard_api::protocol::bridge;
use toolyard_api::token::SigningKey;
use toolyard_api::{CONTROLLER_MANAGER, McpServer};
use tracing::info;

use crate::config::Config;
use crate::context::{Context, controller_owner_ref, error_policy as shared_error_policy, namespaced_name, reference};
use crate::error::{Error, Result};
use crate::labels;
use crate::mcptool::validate::{self, Invalid};
use crate::metrics::KindLabels;
use crate::{pod, workload};

/// Kind label of this controller.
pub const KIND: &str = "McpServer";
/// Key of the derived key in the server's Secret.
pub const KEY_KEY: &str = "key";
/// Name of the serving port.
const PORT_NAME: &str = "mcp";

/// Caches the McpServer controller reads.
#[derive(Clone)]
pub struct ServerStores {
    /// The servers' Deployments.
    pub deployments: Store<Deployment>,
}

/// Name of the Secret with a server's derived key.
pub fn key_secret_name(server: &str) -> String {
    format!("{}-key", workload_name(server))
}

/// Labels that select a server's pods.
pub fn selector(server: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (labels::SERVER.to_owned(), labels::value(server)),
        (labels::COMPONENT.to_owned(), labels::COMPONENT_MCP_SERVER.to_owned()),
    ])
}

fn meta(server: &McpServer, name: String) -> Result<ObjectMeta> {
    let (ns, server_name) = namespaced_name(server, KIND)?;
    let mut l = labels::base();
    l.extend(selector(&server_name));
    Ok(ObjectMeta {
        name: Some(name),
        namespace: Some(ns),
        labels: Some(l),
        owner_references: Some(vec![controller_owner_ref(server, KIND)?]),
        ..Default::default()
    })
}

/// The port the server's pods serve on: the command's own (`streamableHttp`) or the bridge's.
fn port(server: &McpServer) -> i32 {
    server.spec.streamable_http.as_ref().map_or(i32::from(bridge::PORT), |h| h.port)
}

/// The Secret holding the server's key, derived from the shared key for this namespace and
/// server.
pub fn desired_key_secret(server: &McpServer, key: &SigningKey) -> Result<Secret> {
    let (ns, name) = namespaced_name(server, KIND)?;
    let derived = key.derive(&bridge::key_purpose(&ns, &name));
    Ok(Secret {
        metadata: meta(server, key_secret_name(&name))?,
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([(KEY_KEY.to_owned(), ByteString(derived.to_hex().into_bytes()))])),
        ..Default::default()
    })
}

/// The Deployment of `server`, which runs `runtime` (its `spec.runtime`).
pub fn desired_deployment(server: &McpServer, runtime: &Runtime, config: &Config) -> Result<Deployment> {
    let (_, name) = namespaced_name(server, KIND)?;
    let stdio = server.spec.streamable_http.is_none();
    let mut command = Vec::new();
    let mut vars = Vec::new();
    if stdio {
        command.extend([pod::RUNNER.to_owned(), "bridge".to_owned(), "--".to_owned()]);
        vars.push(pod::secret_env(bridge::env::KEY, &key_secret_name(&name), KEY_KEY));
    }
    command.extend(runtime.command.iter().cloned());
    command.extend(runtime.args.iter().cloned());
    vars.extend(pod::telemetry_env(config));
    vars.extend(pod::tool_env(&runtime.env));
    let container = Container {
        name: "server".into(),
        image: Some(runtime.image.clone()),
        command: Some(command),
        working_dir: runtime.working_dir.clone(),
        env: Some(vars),
        ports: Some(vec![ContainerPort {
            name: Some(PORT_NAME.into()),
            container_port: port(server),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        readiness_probe: Some(Probe {
            tcp_socket: Some(TCPSocketAction { port: IntOrString::String(PORT_NAME.into()), host: None }),
            period_seconds: Some(2),
            failure_threshold: Some(3),
            ..Default::default()
        }),
        resources: Some(pod::runtime_resources(runtime, config)),
        ..Default::default()
    };
    let pod_spec = pod::runtime_pod_spec(container, config, runtime, server.spec.placement.as_ref(), "Always");
    let mut template_labels = labels::base();
    template_labels.extend(selector(&name));
    let replicas = server.spec.replicas.unwrap_or(1);
    Ok(workload::deployment(meta(server, workload_name(&name))?, selector(&name), template_labels, pod_spec, replicas))
}

/// The server's ClusterIP Service.
pub fn desired_service(server: &McpServer) -> Result<Service> {
    let (_, name) = namespaced_name(server, KIND)?;
    Ok(workload::service(meta(server, workload_name(&name))?, selector(&name), PORT_NAME, port(server)))
}

/// Checks a `runtime` server named `name`.
pub fn check(name: &str, server: &McpServer) -> std::result::Result<(), Invalid> {
    let Some(runtime) = &server.spec.runtime else { return Ok(()) };
    let mut problems = Vec::new();
    validate::check_runtime(runtime, &mut problems);
    problems.extend(validate::check_service_name(name, WORKLOAD_SUFFIX, "an McpServer with a runtime"));
    if problems.is_empty() { Ok(()) } else { Err(Invalid(problems)) }
}

/// What the reconciler found out about a `runtime` server in this pass.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// The spec has problems (the message names the fields).
    Invalid(String),
    /// Its Deployment has `available` of `desired` pods.
    Deployed {
        /// Pods asked for.
        desired: i32,
        /// Pods available.
        available: i32,
    },
}

/// The `Ready` condition and available pods of a `runtime` server. Pure.
pub fn ready(
    verdict: &Verdict,
    generation: Option<i64>,
) -> (k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition, Option<i32>) {
    match verdict {
        Verdict::Invalid(message) => {
            (conditions::ready(status::FALSE, reason::INVALID_SPEC, message.as_str(), generation), None)
        }
        Verdict::Deployed { desired, available } => {
            let message = format!("{available} of {desired} server pods available");
            let condition = if *available > 0 {
                conditions::ready(status::TRUE, reason::SERVER_AVAILABLE, message, generation)
            } else {
                conditions::ready(status::FALSE, reason::SERVER_PROGRESSING, message, generation)
            };
            (condition, Some(*available))
        }
    }
}

/// Reconciles one McpServer.
pub async fn reconcile(server: Arc<McpServer>, ctx: Arc<Context<ServerStores>>) -> Result<Action> {
    ctx.instrument(KIND, server.as_ref(), reconcile_server(&server, &ctx)).await
}

/// Retries with backoff.
pub fn error_policy(server: Arc<McpServer>, error: &Error, ctx: Arc<Context<ServerStores>>) -> Action {
    shared_error_policy(KIND, server.as_ref(), error, &ctx)
}

async fn reconcile_server(server: &McpServer, ctx: &Context<ServerStores>) -> Result<Action> {
    let (ns, name) = namespaced_name(server, KIND)?;
    if server.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let current = server.status.clone().unwrap_or_default();
    let current_ready = conditions::find(&current.conditions, conditions::READY);
    let Some(runtime) = &server.spec.runtime else {
        remove(ctx, &ns, &name).await?;
        if current_ready.is_some() || current.available_replicas.is_some() {
            // The controller's fields go; the gateways' connections stay.
            write_status(ctx, &ns, &name, json!({})).await?;
        }
        return Ok(Action::await_change());
    };
    let verdict = match check(&name, server) {
        Err(invalid) => Verdict::Invalid(invalid.to_string()),
        Ok(()) => apply(ctx, server, runtime, &ns, &name).await?,
    };
    let (next, available) = ready(&verdict, server.metadata.generation);
    let mut list = current.conditions.clone();
    let changed = conditions::upsert(&mut list, next.clone()) || current.available_replicas != available;
    if changed {
        write_status(ctx, &ns, &name, json!({"conditions": list, "availableReplicas": available})).await?;
        if current_ready.map(|c| (&c.status, &c.reason)) != Some((&next.status, &next.reason)) {
            info!(namespace = %ns, name = %name, ready = %next.status, reason = %next.reason, "MCP server readiness changed");
            let warning = next.reason == reason::INVALID_SPEC;
            ctx.publish(&reference(server), warning, &next.reason, "Deploy", next.message.clone()).await;
        }
    }
    Ok(Action::await_change())
}

/// Applies the controller's part of the status (server-side apply: the gateways' entries in
/// `connections` are theirs and stay).
async fn write_status(ctx: &Context<ServerStores>, ns: &str, name: &str, status: serde_json::Value) -> Result<()> {
    let body = json!({"apiVersion": toolyard_api::API_VERSION, "kind": KIND, "status": status});
    Api::<McpServer>::namespaced(ctx.client.clone(), ns)
        .patch_status(name, &PatchParams::apply(CONTROLLER_MANAGER).force(), &Patch::Apply(&body))
        .await?;
    ctx.metrics.status_writes.get_or_create(&KindLabels { kind: KIND }).inc();
    Ok(())
}

/// Applies the key Secret, Deployment and Service; reads availability from the Deployment.
async fn apply(
    ctx: &Context<ServerStores>,
    server: &McpServer,
    runtime: &Runtime,
    ns: &str,
    name: &str,
) -> Result<Verdict> {
    let params = PatchParams::apply(CONTROLLER_MANAGER).force();
    crate::run::create_secret(ctx, ns, &desired_key_secret(server, &ctx.key)?).await?;
    let deployment = desired_deployment(server, runtime, &ctx.config)?;
    let applied = Api::<Deployment>::namespaced(ctx.client.clone(), ns)
        .patch(&workload_name(name), &params, &Patch::Apply(&deployment))
        .await?;
    Api::<Service>::namespaced(ctx.client.clone(), ns)
        .patch(&workload_name(name), &params, &Patch::Apply(&desired_service(server)?))
        .await?;
    let desired = deployment.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let available = applied.status.as_ref().and_then(|s| s.available_replicas).unwrap_or(0);
    Ok(Verdict::Deployed { desired, available })
}

/// Deletes the Deployment and Service left from a `runtime` after the server moved to a `url`.
async fn remove(ctx: &Context<ServerStores>, ns: &str, name: &str) -> Result<()> {
    // The key Secret stays until the McpServer goes (it owns it), as a warm pool's does.
    if workload::remove(&ctx.client, &ctx.stores.deployments, ns, &workload_name(name)).await? {
        info!(namespace = %ns, name = %name, "MCP server workload removed");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn server(extra: serde_json::Value) -> McpServer {
        let mut spec = json!({
            "runtime": {
                "image": "ghcr.io/acme/research-mcp:1.0",
                "command": ["python3", "-m", "research.server"],
                "env": [{"name": "REGION", "value": "eu"}],
            },
        });
        spec.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        serde_json::from_value(json!({
            "apiVersion": "toolyard.dev/v1alpha1",
            "kind": "McpServer",
            "metadata": {"name": "research", "namespace": "team-a", "uid": "server-uid", "generation": 1},
            "spec": spec,
        }))
        .unwrap()
    }

    fn config() -> Config {
        Config::try_parse_from(["toolyard-controller", "--runner-image", "runner:1"]).unwrap()
    }

    #[test]
    fn a_stdio_server_runs_behind_the_bridge_hardened() {
        let s = server(json!({}));
        let d = desired_deployment(&s, s.spec.runtime.as_ref().unwrap(), &config()).unwrap();
        assert_eq!(d.metadata.name.as_deref(), Some("research-mcp"));
        assert_eq!(d.metadata.owner_references.as_ref().unwrap()[0].kind, "McpServer");
        let spec = d.spec.as_ref().unwrap();
        assert_eq!(spec.replicas, Some(1));
        let pod = spec.template.spec.as_ref().unwrap();
        assert_eq!(pod.automount_service_account_token, Some(false));
        assert_eq!(pod.security_context.as_ref().unwrap().run_as_non_root, Some(true));
        assert_eq!(pod.init_containers.as_ref().unwrap()[0].image.as_deref(), Some("runner:1"));
        let c = &pod.containers[0];
        assert_eq!(
            c.command.as_deref().unwrap(),
            ["/toolyard/bin/toolyard-runner", "bridge", "--", "python3", "-m", "research.server"]
        );
        let security = c.security_context.as_ref().unwrap();
        assert_eq!(security.read_only_root_filesystem, Some(true));
        assert_eq!(security.allow_privilege_escalation, Some(false));
        let env = c.env.as_ref().unwrap();
        let key = env.iter().find(|e| e.name == "TOOLYARD_BRIDGE_KEY").unwrap();
        let secret = key.value_from.as_ref().unwrap().secret_key_ref.as_ref().unwrap();
        assert_eq!((secret.name.as_str(), secret.key.as_str()), ("research-mcp-key", "key"));
        assert!(env.iter().any(|e| e.name == "REGION" && e.value.as_deref() == Some("eu")));
        assert_eq!(c.ports.as_ref().unwrap()[0].container_port, 8080);
        let labels = spec.template.metadata.as_ref().unwrap().labels.as_ref().unwrap();
        assert_eq!(labels["app.kubernetes.io/managed-by"], "toolyard", "the runs NetworkPolicy selects it");
        assert_eq!(labels["toolyard.dev/component"], "mcp-server");
        let service = desired_service(&s).unwrap();
        assert_eq!(service.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].port, 8080);
        assert_eq!(service.spec.as_ref().unwrap().selector.as_ref(), Some(&selector("research")));
    }

    #[test]
    fn an_http_server_runs_its_command_on_its_port() {
        let s = server(json!({"streamableHttp": {"port": 3001}, "replicas": 2}));
        let d = desired_deployment(&s, s.spec.runtime.as_ref().unwrap(), &config()).unwrap();
        let c = &d.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers[0];
        assert_eq!(c.command.as_deref().unwrap(), ["python3", "-m", "research.server"]);
        assert!(c.env.as_ref().unwrap().iter().all(|e| e.name != "TOOLYARD_BRIDGE_KEY"), "no key without a bridge");
        assert_eq!(c.ports.as_ref().unwrap()[0].container_port, 3001);
        assert_eq!(d.spec.as_ref().unwrap().replicas, Some(2));
        assert_eq!(desired_service(&s).unwrap().spec.unwrap().ports.unwrap()[0].port, 3001);
    }

    #[test]
    fn url_servers_run_nothing_and_bad_names_are_reported() {
        let url: McpServer = serde_json::from_value(json!({
            "apiVersion": "toolyard.dev/v1alpha1", "kind": "McpServer",
            "metadata": {"name": "x", "namespace": "n", "uid": "u"},
            "spec": {"url": "https://x.example/mcp"},
        }))
        .unwrap();
        assert!(check("x", &url).is_ok());
        let problems = check("9research.v2", &server(json!({}))).unwrap_err().to_string();
        assert!(problems.contains("metadata.name"), "{problems}");
        assert!(problems.contains("research-mcp") || problems.contains("9research.v2-mcp"), "{problems}");
    }

    #[test]
    fn readiness_follows_available_pods() {
        let (c, available) = ready(&Verdict::Deployed { desired: 1, available: 0 }, Some(2));
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "ServerProgressing"));
        assert_eq!(available, Some(0));
        let (c, _) = ready(&Verdict::Deployed { desired: 1, available: 1 }, Some(2));
        assert_eq!(
            (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
            ("True", "ServerAvailable", "1 of 1 server pods available")
        );
        let (c, available) = ready(&Verdict::Invalid("spec.runtime.image: bad".into()), Some(2));
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "InvalidSpec"));
        assert_eq!(available, None);
    }
}

//! The warm pool of a `mode: Pool` McpTool: a Deployment of `toolyard-runner serve` pods in
//! front of the tool's command, a Service the gateway calls, and a Secret with the pool's
//! derived key. Pool pods get neither the shared signing key nor a ServiceAccount token. Pure.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, ContainerPort, HTTPGetAction, Probe, Secret, Service};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::ObjectMeta;
use toolyard_api::McpTool;
use toolyard_api::mcptool::Pool;
use toolyard_api::protocol::pool;
use toolyard_api::token::SigningKey;

use super::validate::POOL_SUFFIX;
use crate::config::Config;
use crate::context::{controller_owner_ref, namespaced_name};
use crate::error::Result;
use crate::labels;
use crate::{pod, workload};

const KIND: &str = "McpTool";
/// Key of the derived key in the pool's Secret.
pub const KEY_KEY: &str = "key";
/// Name of the serving port.
const PORT_NAME: &str = pool::PORT_NAME;
/// Extra seconds a pool pod gets beyond the tool's timeout to finish in-flight calls on shutdown.
const DRAIN_SECONDS: i64 = 5;

/// Name of a tool's pool Deployment and Service.
pub fn pool_name(tool: &str) -> String {
    pool::service_name(tool)
}

/// Name of the Secret with a pool's derived key.
pub fn key_secret_name(tool: &str) -> String {
    format!("{tool}{POOL_SUFFIX}-key")
}

/// The URL the gateway calls.
pub fn endpoint(tool: &str, ns: &str) -> String {
    format!("http://{}.{ns}.svc:{}", pool_name(tool), pool::DEFAULT_PORT)
}

/// Labels that select a tool's pool pods.
pub fn selector(tool: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (labels::TOOL.to_owned(), labels::value(tool)),
        (labels::COMPONENT.to_owned(), labels::COMPONENT_POOL.to_owned()),
    ])
}

fn pool_labels(tool: &str) -> BTreeMap<String, String> {
    let mut l = labels::base();
    l.extend(selector(tool));
    l
}

fn meta(tool: &McpTool, name: String) -> Result<ObjectMeta> {
    let (ns, tool_name) = namespaced_name(tool, KIND)?;
    Ok(ObjectMeta {
        name: Some(name),
        namespace: Some(ns),
        labels: Some(pool_labels(&tool_name)),
        owner_references: Some(vec![controller_owner_ref(tool, KIND)?]),
        ..Default::default()
    })
}

/// The Secret holding the pool's key, derived from the shared key for this namespace and tool.
pub fn desired_key_secret(tool: &McpTool, key: &SigningKey) -> Result<Secret> {
    let (ns, name) = namespaced_name(tool, KIND)?;
    let derived = key.derive(&pool::key_purpose(&ns, &name));
    Ok(Secret {
        metadata: meta(tool, key_secret_name(&name))?,
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([(KEY_KEY.to_owned(), ByteString(derived.to_hex().into_bytes()))])),
        ..Default::default()
    })
}

/// The pool's Deployment.
pub fn desired_deployment(tool: &McpTool, config: &Config) -> Result<Deployment> {
    let (_, name) = namespaced_name(tool, KIND)?;
    let runtime = &tool.spec.runtime;
    let settings = tool.spec.execution.pool.clone().unwrap_or_default();
    let queue = settings.queue_length();
    let Pool { replicas, reuse_process, concurrency, .. } = settings;

    let mut command = vec![
        pod::RUNNER.to_owned(),
        "serve".to_owned(),
        "--port".to_owned(),
        pool::DEFAULT_PORT.to_string(),
        "--".to_owned(),
    ];
    command.extend(runtime.command.iter().cloned());
    command.extend(runtime.args.iter().cloned());

    let mut vars = vec![
        pod::env(pool::env::CONCURRENCY, concurrency.to_string()),
        pod::env(pool::env::QUEUE, queue.to_string()),
        pod::env(pool::env::REUSE, reuse_process.to_string()),
        pod::secret_env(pool::env::KEY, &key_secret_name(&name), KEY_KEY),
    ];
    vars.extend(pod::telemetry_env(config));
    vars.extend(pod::tool_env(&runtime.env));

    let container = Container {
        name: "tool".into(),
        image: Some(runtime.image.clone()),
        command: Some(command),
        working_dir: runtime.working_dir.clone(),
        env: Some(vars),
        ports: Some(vec![ContainerPort {
            name: Some(PORT_NAME.into()),
            container_port: pool::DEFAULT_PORT.into(),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        readiness_probe: Some(Probe {
            http_get: Some(HTTPGetAction {
                path: Some(pool::READY_PATH.into()),
                port: IntOrString::String(PORT_NAME.into()),
                ..Default::default()
            }),
            period_seconds: Some(2),
            failure_threshold: Some(3),
            ..Default::default()
        }),
        resources: Some(pod::runtime_resources(runtime, config)),
        ..Default::default()
    };
    let mut pod_spec = pod::tool_pod_spec(container, config, &tool.spec, "Always");
    pod_spec.termination_grace_period_seconds = Some(i64::from(tool.spec.execution.timeout_seconds) + DRAIN_SECONDS);
    Ok(workload::deployment(meta(tool, pool_name(&name))?, selector(&name), pool_labels(&name), pod_spec, replicas))
}

/// The pool's ClusterIP Service.
pub fn desired_service(tool: &McpTool) -> Result<Service> {
    let (_, name) = namespaced_name(tool, KIND)?;
    Ok(workload::service(meta(tool, pool_name(&name))?, selector(&name), PORT_NAME, pool::DEFAULT_PORT.into()))
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use serde_json::json;

    use super::*;

    fn tool() -> McpTool {
        serde_json::from_value(json!({
            "apiVersion": "toolyard.dev/v1alpha1",
            "kind": "McpTool",
            "metadata": {"name": "get-quote", "namespace": "team-a", "uid": "tool-uid", "generation": 2},
            "spec": {
                "name": "get_quote",
                "description": "d",
                "inputSchema": {"type": "object"},
                "runtime": {
                    "image": "ghcr.io/toolyard/pricing:0.1.0",
                    "command": ["python3", "-m", "toolyard.run"],
                    "args": ["pricing.quotes:get_quote"],
                    "workingDir": "/app",
                    "env": [{"name": "QUOTES_REGION", "value": "eu"}],
                },
                "execution": {"mode": "Pool", "timeoutSeconds": 30,
                              "pool": {"replicas": 2, "reuseProcess": true, "concurrency": 4}},
            },
        }))
        .unwrap()
    }

    fn config() -> Config {
        Config::try_parse_from(["toolyard-controller", "--runner-image", "runner:1"]).unwrap()
    }

    #[test]
    fn deployment_runs_the_pool_server_hardened() {
        let d = desired_deployment(&tool(), &config()).unwrap();
        assert_eq!(d.metadata.name.as_deref(), Some("get-quote-pool"));
        assert_eq!(d.metadata.owner_references.as_ref().unwrap()[0].kind, "McpTool");
        assert_eq!(d.metadata.owner_references.as_ref().unwrap()[0].controller, Some(true));
        let spec = d.spec.as_ref().unwrap();
        assert_eq!(spec.replicas, Some(2));
        let selector = spec.selector.match_labels.as_ref().unwrap();
        assert_eq!(selector["toolyard.dev/tool"], "get-quote");
        assert_eq!(selector["toolyard.dev/component"], "pool");
        let template_labels = spec.template.metadata.as_ref().unwrap().labels.as_ref().unwrap();
        assert!(selector.iter().all(|(k, v)| template_labels.get(k) == Some(v)), "selector matches the template");
        let pod = spec.template.spec.as_ref().unwrap();
        assert_eq!(pod.restart_policy.as_deref(), Some("Always"));
        assert_eq!(pod.automount_service_account_token, Some(false));
        assert_eq!(pod.termination_grace_period_seconds, Some(35));
        assert_eq!(pod.security_context.as_ref().unwrap().run_as_non_root, Some(true));
        assert_eq!(pod.init_containers.as_ref().unwrap()[0].image.as_deref(), Some("runner:1"));
        let c = &pod.containers[0];
        assert_eq!(
            c.command.as_deref().unwrap(),
            [
                "/toolyard/bin/toolyard-runner",
                "serve",
                "--port",
                "8080",
                "--",
                "python3",
                "-m",
                "toolyard.run",
                "pricing.quotes:get_quote"
            ]
        );
        assert_eq!(c.working_dir.as_deref(), Some("/app"));
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        let env = c.env.as_ref().unwrap();
        let names: Vec<&str> = env.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "TOOLYARD_POOL_CONCURRENCY",
                "TOOLYARD_POOL_QUEUE",
                "TOOLYARD_POOL_REUSE",
                "TOOLYARD_POOL_KEY",
                "QUOTES_REGION"
            ]
        );
        assert_eq!(env[0].value.as_deref(), Some("4"));
        assert_eq!(env[1].value.as_deref(), Some("32"), "8 waiting calls per slot by default");
        assert_eq!(env[2].value.as_deref(), Some("true"));
        let key = env[3].value_from.as_ref().unwrap().secret_key_ref.as_ref().unwrap();
        assert_eq!((key.name.as_str(), key.key.as_str()), ("get-quote-pool-key", "key"));
        assert!(!names.contains(&"TOOLYARD_TOKEN") && !names.contains(&"TOOLYARD_GATEWAY_URL"));
        let probe = c.readiness_probe.as_ref().unwrap().http_get.as_ref().unwrap();
        assert_eq!(probe.path.as_deref(), Some("/readyz"));
        assert_eq!(c.ports.as_ref().unwrap()[0].container_port, 8080);
    }

    #[test]
    fn service_selects_the_pool_and_endpoint_names_it() {
        let s = desired_service(&tool()).unwrap();
        assert_eq!(s.metadata.name.as_deref(), Some("get-quote-pool"));
        let spec = s.spec.unwrap();
        assert_eq!(spec.selector, Some(selector("get-quote")));
        assert_eq!(spec.ports.unwrap()[0].port, 8080);
        assert_eq!(endpoint("get-quote", "team-a"), "http://get-quote-pool.team-a.svc:8080");
    }

    #[test]
    fn key_secret_holds_the_derived_key_not_the_shared_one() {
        let shared = SigningKey::new(vec![9u8; 32]).unwrap();
        let s = desired_key_secret(&tool(), &shared).unwrap();
        assert_eq!(s.metadata.name.as_deref(), Some("get-quote-pool-key"));
        let text = String::from_utf8(s.data.unwrap()["key"].0.clone()).unwrap();
        let derived = SigningKey::from_hex(&text).unwrap();
        assert_eq!(derived.to_hex(), shared.derive("pool/team-a/get-quote").to_hex());
        assert_ne!(derived.to_hex(), shared.to_hex());
    }
}

//! `desired_job` for a ToolCall: every field of the hardened Job.

use std::collections::BTreeMap;

use clap::Parser;
use k8s_openapi::api::core::v1::{EnvVar, PodSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;
use toolyard_api::token::{RunKind as TokenKind, SigningKey};

use super::*;

fn config() -> Config {
    Config::try_parse_from([
        "toolyard-controller",
        "--runner-image",
        "ghcr.io/toolyard/toolyard-runner:9.9.9",
        "--gateway-internal-url",
        "http://gw-internal.toolyard.svc:8081",
        "--job-ttl-seconds",
        "120",
        "--tmp-size-limit",
        "64Mi",
    ])
    .unwrap()
}

fn call(annotations: serde_json::Value) -> ToolCall {
    serde_json::from_value(json!({
        "apiVersion": "toolyard.dev/v1alpha1",
        "kind": "ToolCall",
        "metadata": {
            "name": "price-option-7k2m9q",
            "namespace": "team-a",
            "uid": "0000-call-uid",
            "creationTimestamp": "2026-12-01T10:00:00Z",
            "annotations": annotations,
        },
        "spec": {
            "tool": "price-option",
            "owner": {"issuer": "apikey", "user": "alice", "groups": ["quants"]},
            "input": {"key": "owners/x/calls/price-option-7k2m9q/input.json", "sizeBytes": 10},
            "timeoutSeconds": 30,
        },
    }))
    .unwrap()
}

fn tool(runtime: serde_json::Value) -> McpTool {
    serde_json::from_value(json!({
        "apiVersion": "toolyard.dev/v1alpha1",
        "kind": "McpTool",
        "metadata": {"name": "price-option", "namespace": "team-a", "uid": "tool-uid"},
        "spec": {
            "name": "price_option",
            "description": "d",
            "inputSchema": {"type": "object"},
            "runtime": runtime,
        },
    }))
    .unwrap()
}

fn pricing_runtime() -> serde_json::Value {
    json!({
        "image": "ghcr.io/toolyard/pricing:0.1.0",
        "command": ["python3", "-m", "toolyard.run"],
        "args": ["pricing.options:price_option"],
        "workingDir": "/app",
        "env": [
            {"name": "REGION", "value": "eu"},
            {"name": "FEED_KEY", "secretKeyRef": {"name": "feed", "key": "key"}},
        ],
    })
}

fn now() -> Timestamp {
    "2026-12-01T10:00:02Z".parse().unwrap()
}

fn pod_spec(job: &Job) -> &PodSpec {
    job.spec.as_ref().unwrap().template.spec.as_ref().unwrap()
}

#[test]
fn job_metadata_names_labels_and_owner() {
    let job = desired_job(&call(json!({})), &tool(pricing_runtime()), &config(), now()).unwrap();
    assert_eq!(job.metadata.name.as_deref(), Some("price-option-7k2m9q"));
    assert_eq!(job.metadata.namespace.as_deref(), Some("team-a"));
    let owner_key = toolyard_api::OwnerKey::derive("apikey", "alice").to_string();
    let expected_labels = BTreeMap::from([
        ("app.kubernetes.io/managed-by".to_owned(), "toolyard".to_owned()),
        ("toolyard.dev/tool".to_owned(), "price-option".to_owned()),
        ("toolyard.dev/call".to_owned(), "price-option-7k2m9q".to_owned()),
        ("toolyard.dev/owner".to_owned(), owner_key),
    ]);
    assert_eq!(job.metadata.labels.as_ref(), Some(&expected_labels));
    assert!(!format!("{:?}", job.metadata.labels).contains("alice"), "no raw user name in labels");
    let template_labels = job.spec.as_ref().unwrap().template.metadata.as_ref().unwrap().labels.as_ref();
    assert_eq!(template_labels, Some(&expected_labels));
    let owners = job.metadata.owner_references.as_ref().unwrap();
    assert_eq!(owners.len(), 1);
    assert_eq!(owners[0].api_version, "toolyard.dev/v1alpha1");
    assert_eq!(owners[0].kind, "ToolCall");
    assert_eq!(owners[0].name, "price-option-7k2m9q");
    assert_eq!(owners[0].uid, "0000-call-uid");
    assert_eq!(owners[0].controller, Some(true));
}

#[test]
fn job_spec_is_one_attempt_with_the_remaining_deadline() {
    let job = desired_job(&call(json!({})), &tool(pricing_runtime()), &config(), now()).unwrap();
    let spec = job.spec.as_ref().unwrap();
    assert_eq!(spec.backoff_limit, Some(0));
    assert_eq!(spec.completions, Some(1));
    assert_eq!(spec.parallelism, Some(1));
    assert_eq!(spec.active_deadline_seconds, Some(28), "30 s from creation, 2 s already gone");
    assert_eq!(spec.ttl_seconds_after_finished, Some(120));
    let late =
        desired_job(&call(json!({})), &tool(pricing_runtime()), &config(), "2026-12-01T11:00:00Z".parse().unwrap())
            .unwrap();
    assert_eq!(late.spec.unwrap().active_deadline_seconds, Some(1), "never zero or negative");
}

#[test]
fn pod_is_hardened() {
    let job = desired_job(&call(json!({})), &tool(pricing_runtime()), &config(), now()).unwrap();
    let pod = pod_spec(&job);
    assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
    assert_eq!(pod.automount_service_account_token, Some(false));
    assert_eq!(pod.enable_service_links, Some(false));
    assert_eq!(pod.service_account_name, None);
    let psc = pod.security_context.as_ref().unwrap();
    assert_eq!(psc.run_as_non_root, Some(true));
    assert_eq!(psc.run_as_user, Some(65532));
    assert_eq!(psc.run_as_group, Some(65532));
    assert_eq!(psc.fs_group, Some(65532));
    assert_eq!(psc.seccomp_profile.as_ref().unwrap().type_, "RuntimeDefault");

    let all: Vec<_> = pod.init_containers.iter().flatten().chain(pod.containers.iter()).collect();
    assert_eq!(all.len(), 2);
    for c in all {
        let sc = c.security_context.as_ref().unwrap_or_else(|| panic!("{} has no securityContext", c.name));
        assert_eq!(sc.allow_privilege_escalation, Some(false), "{}", c.name);
        assert_eq!(sc.privileged, Some(false), "{}", c.name);
        assert_eq!(sc.read_only_root_filesystem, Some(true), "{}", c.name);
        assert_eq!(sc.run_as_non_root, Some(true), "{}", c.name);
        assert_eq!(sc.run_as_user, Some(65532), "{}", c.name);
        assert_eq!(sc.capabilities.as_ref().unwrap().drop, Some(vec!["ALL".to_owned()]), "{}", c.name);
        assert_eq!(sc.capabilities.as_ref().unwrap().add, None, "{}", c.name);
        assert_eq!(sc.seccomp_profile.as_ref().unwrap().type_, "RuntimeDefault", "{}", c.name);
        assert_eq!(c.termination_message_policy.as_deref(), Some("FallbackToLogsOnError"), "{}", c.name);
        assert!(c.resources.is_some(), "{}", c.name);
    }

    let volumes = pod.volumes.as_ref().unwrap();
    assert_eq!(volumes.len(), 2);
    assert_eq!(volumes[0].name, "toolyard-bin");
    assert!(volumes[0].empty_dir.is_some());
    assert_eq!(volumes[1].name, "tmp");
    assert_eq!(volumes[1].empty_dir.as_ref().unwrap().size_limit, Some(Quantity("64Mi".into())));
}

#[test]
fn init_container_installs_the_runner_from_the_runner_image() {
    let job = desired_job(&call(json!({})), &tool(pricing_runtime()), &config(), now()).unwrap();
    let init = &pod_spec(&job).init_containers.as_ref().unwrap()[0];
    assert_eq!(init.name, "install-runner");
    assert_eq!(init.image.as_deref(), Some("ghcr.io/toolyard/toolyard-runner:9.9.9"));
    assert_eq!(
        init.command.as_deref(),
        Some(&["cp".to_owned(), "/toolyard-runner".into(), "/toolyard/bin/toolyard-runner".into()][..])
    );
    let mounts = init.volume_mounts.as_ref().unwrap();
    assert_eq!(mounts.len(), 1);
    assert_eq!((mounts[0].name.as_str(), mounts[0].mount_path.as_str()), ("toolyard-bin", "/toolyard/bin"));
    assert_ne!(mounts[0].read_only, Some(true), "the init container writes the binary");
    assert!(init.env.is_none(), "the init container gets no token");
}

#[test]
fn tool_container_runs_the_tool_command_under_the_runner() {
    let job = desired_job(&call(json!({})), &tool(pricing_runtime()), &config(), now()).unwrap();
    let c = &pod_spec(&job).containers[0];
    assert_eq!(c.name, "tool");
    assert_eq!(c.image.as_deref(), Some("ghcr.io/toolyard/pricing:0.1.0"));
    assert_eq!(
        c.command.as_deref().unwrap(),
        [
            "/toolyard/bin/toolyard-runner",
            "call",
            "--",
            "python3",
            "-m",
            "toolyard.run",
            "pricing.options:price_option"
        ]
    );
    assert_eq!(c.args, None);
    assert_eq!(c.working_dir.as_deref(), Some("/app"));
    let mounts = c.volume_mounts.as_ref().unwrap();
    assert_eq!(mounts.len(), 2);
    assert_eq!((mounts[0].mount_path.as_str(), mounts[0].read_only), ("/toolyard/bin", Some(true)));
    assert_eq!((mounts[1].name.as_str(), mounts[1].mount_path.as_str()), ("tmp", "/tmp"));
    let res = c.resources.as_ref().unwrap();
    assert_eq!(res.requests.as_ref().unwrap()["cpu"], Quantity("100m".into()));
    assert_eq!(res.requests.as_ref().unwrap()["memory"], Quantity("128Mi".into()));
    assert_eq!(res.limits.as_ref().unwrap()["memory"], Quantity("512Mi".into()));
}

#[test]
fn environment_follows_the_runner_contract_then_the_tool() {
    let job = desired_job(
        &call(json!({"toolyard.dev/traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})),
        &tool(pricing_runtime()),
        &config(),
        now(),
    )
    .unwrap();
    let env = pod_spec(&job).containers[0].env.clone().unwrap();
    let names: Vec<&str> = env.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(
        names,
        ["TOOLYARD_GATEWAY_URL", "TOOLYARD_RUN_ID", "TOOLYARD_TOKEN", "TRACEPARENT", "REGION", "FEED_KEY"]
    );
    assert_eq!(env[0].value.as_deref(), Some("http://gw-internal.toolyard.svc:8081"));
    assert_eq!(env[1].value.as_deref(), Some("price-option-7k2m9q"));
    let token = env[2].value_from.as_ref().unwrap().secret_key_ref.as_ref().unwrap();
    assert_eq!((token.name.as_str(), token.key.as_str()), ("price-option-7k2m9q-token", "token"));
    assert!(env[2].value.is_none(), "the token never appears in the Job spec");
    assert_eq!(env[3].value.as_deref(), Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"));
    assert_eq!(env[4], EnvVar { name: "REGION".into(), value: Some("eu".into()), value_from: None });
    let feed = env[5].value_from.as_ref().unwrap().secret_key_ref.as_ref().unwrap();
    assert_eq!((feed.name.as_str(), feed.key.as_str()), ("feed", "key"));

    let without = desired_job(&call(json!({})), &tool(pricing_runtime()), &config(), now()).unwrap();
    let env = pod_spec(&without).containers[0].env.clone().unwrap();
    assert!(!env.iter().any(|e| e.name == "TRACEPARENT"), "no trace context, no variable");
}

#[test]
fn declared_resources_and_service_account_are_used() {
    let mut runtime = pricing_runtime();
    runtime["resources"] = json!({"requests": {"cpu": "2"}, "limits": {"memory": "4Gi"}});
    runtime["serviceAccountName"] = json!("pricing-reader");
    let job = desired_job(&call(json!({})), &tool(runtime), &config(), now()).unwrap();
    let pod = pod_spec(&job);
    assert_eq!(pod.service_account_name.as_deref(), Some("pricing-reader"));
    assert_eq!(pod.automount_service_account_token, Some(false), "still no token mounted");
    let res = pod.containers[0].resources.as_ref().unwrap();
    assert_eq!(res.requests.as_ref().unwrap().len(), 1);
    assert_eq!(res.requests.as_ref().unwrap()["cpu"], Quantity("2".into()));
    assert_eq!(res.limits.as_ref().unwrap()["memory"], Quantity("4Gi".into()));
}

#[test]
fn only_a_tool_that_asks_gets_the_caller() {
    let env_of = |tool: &McpTool| -> Vec<EnvVar> {
        let job = desired_job(&call(json!({})), tool, &config(), now()).unwrap();
        pod_spec(&job).containers[0].env.clone().unwrap_or_default()
    };
    let mut asking = tool(pricing_runtime());
    assert!(env_of(&asking).iter().all(|e| e.name != "TOOLYARD_CALLER"), "nothing unless asked");
    asking.spec.caller_identity = true;
    let vars = env_of(&asking);
    let caller = vars.iter().find(|e| e.name == "TOOLYARD_CALLER").and_then(|e| e.value.clone()).expect("the caller");
    let caller: serde_json::Value = serde_json::from_str(&caller).unwrap();
    assert_eq!(caller, json!({"issuer": "apikey", "user": "alice", "groups": ["quants"]}));
}

#[test]
fn placement_and_read_only_volumes_reach_the_pod() {
    let mut runtime = pricing_runtime();
    runtime["resources"] = json!({"limits": {"nvidia.com/gpu": "1"}});
    runtime["volumes"] = json!([
        {"name": "rates", "mountPath": "/data/rates", "configMap": {"name": "reference-rates"}},
        {"name": "feed", "mountPath": "/etc/feed", "secret": {"name": "feed-credentials"}},
        {"name": "history", "mountPath": "/data/history", "persistentVolumeClaim": {"name": "history"}},
    ]);
    let mut tool = tool(runtime);
    tool.spec.placement = Some(
        serde_json::from_value(json!({
            "nodeSelector": {"nvidia.com/gpu.present": "true"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}},
            "runtimeClassName": "gvisor",
        }))
        .unwrap(),
    );
    let job = desired_job(&call(json!({})), &tool, &config(), now()).unwrap();
    let pod = pod_spec(&job);
    assert_eq!(pod.node_selector.as_ref().unwrap()["nvidia.com/gpu.present"], "true");
    assert_eq!(pod.tolerations.as_ref().unwrap()[0].key.as_deref(), Some("nvidia.com/gpu"));
    assert!(pod.affinity.as_ref().unwrap().node_affinity.is_some());
    assert_eq!(pod.runtime_class_name.as_deref(), Some("gvisor"));
    let limits = pod.containers[0].resources.as_ref().unwrap().limits.as_ref().unwrap();
    assert_eq!(limits["nvidia.com/gpu"], Quantity("1".into()));

    let volumes = pod.volumes.as_ref().unwrap();
    let named = |n: &str| volumes.iter().find(|v| v.name == n).unwrap_or_else(|| panic!("{n} in {volumes:?}"));
    assert_eq!(named("tool-rates").config_map.as_ref().unwrap().name, "reference-rates");
    assert_eq!(named("tool-feed").secret.as_ref().unwrap().secret_name.as_deref(), Some("feed-credentials"));
    let claim = named("tool-history").persistent_volume_claim.as_ref().unwrap();
    assert_eq!((claim.claim_name.as_str(), claim.read_only), ("history", Some(true)));
    let mounts = pod.containers[0].volume_mounts.as_ref().unwrap();
    for (name, path) in [("tool-rates", "/data/rates"), ("tool-feed", "/etc/feed"), ("tool-history", "/data/history")] {
        let mount = mounts.iter().find(|m| m.name == name).unwrap();
        assert_eq!((mount.mount_path.as_str(), mount.read_only), (path, Some(true)), "{name}");
    }
    assert!(mounts.iter().any(|m| m.mount_path == "/tmp"), "Toolyard's own mounts stay");
    assert!(
        pod.init_containers.as_ref().unwrap()[0]
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .all(|m| !m.name.starts_with("tool-"))
    );
}

#[test]
fn token_secret_holds_a_call_token_for_this_call_and_owner() {
    let key = SigningKey::new(vec![7u8; 32]).unwrap();
    let secret = desired_token_secret(&call(json!({})), &tool(pricing_runtime()), &key).unwrap();
    assert_eq!(secret.metadata.name.as_deref(), Some("price-option-7k2m9q-token"));
    assert_eq!(secret.metadata.owner_references.as_ref().unwrap()[0].uid, "0000-call-uid");
    assert_eq!(secret.metadata.labels.as_ref().unwrap()["toolyard.dev/call"], "price-option-7k2m9q");
    let token = String::from_utf8(secret.data.unwrap()["token"].0.clone()).unwrap();
    let deadline: Timestamp = "2026-12-01T10:00:30Z".parse().unwrap();
    let claims = key.verify(&token, deadline.as_second()).unwrap();
    assert_eq!(claims.kind, TokenKind::Call);
    assert_eq!(claims.ns, "team-a");
    assert_eq!(claims.id, "price-option-7k2m9q");
    assert_eq!(claims.owner.user, "alice");
    assert_eq!(claims.exp, deadline.as_second() + 300);
    assert!(key.verify(&token, deadline.as_second() + 300).is_err(), "expired after the grace");
}

#[test]
fn objects_without_uid_or_creation_time_are_errors() {
    let mut c = call(json!({}));
    c.metadata.uid = None;
    assert!(desired_job(&c, &tool(pricing_runtime()), &config(), now()).is_err());
    let mut c = call(json!({}));
    c.metadata.creation_timestamp = None;
    assert!(desired_job(&c, &tool(pricing_runtime()), &config(), now()).is_err());
}

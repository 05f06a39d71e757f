//! McpTool readiness and warm pools against the real apiserver and the real Deployment and
//! ReplicaSet controllers (pool pods are made ready through the pod status subresource).

use crate::controller_support;

use controller_support::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;
use toolyard_api::conditions::{self, READY};
use toolyard_api::token::SigningKey;
use toolyard_api::{McpTool, McpToolStatus};
use toolyard_tests::User;

fn ready(tool: &McpTool) -> Option<(String, String, String)> {
    let status = tool.status.as_ref()?;
    conditions::find(&status.conditions, READY).map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

fn ready_is(tool: &McpTool, status: &str, reason: &str) -> bool {
    ready(tool).is_some_and(|(s, r, _)| s == status && r == reason)
}

fn observed_current(tool: &McpTool) -> bool {
    let status = tool.status.clone().unwrap_or_default();
    let condition_generation = conditions::find(&status.conditions, READY).and_then(|c| c.observed_generation);
    status.observed_generation == tool.metadata.generation && condition_generation == tool.metadata.generation
}

#[tokio::test]
async fn invalid_mcptool_is_not_ready_with_a_useful_message_until_fixed() {
    let (ns, client) = namespace("ctl-tool").await;
    let key = KeyFile::new();
    let controller = Replica::start(config(&ns, &key, &[]), User::Admin).await;
    let mut bad = job_tool("price-option");
    bad.spec.input_schema = serde_json::from_value(json!({
        "type": "object",
        "properties": {"spot": {"type": "numbr"}},
    }))
    .unwrap();
    create(&client, &ns, &bad).await;
    let tools: Api<McpTool> = Api::namespaced(client.clone(), &ns);
    let invalid = wait_for(&tools, "price-option", "Ready=False/InvalidSpec", |t| {
        ready_is(t, "False", "InvalidSpec") && observed_current(t)
    })
    .await;
    let (_, _, message) = ready(&invalid).unwrap();
    assert!(message.starts_with("spec.inputSchema: "), "{message}");
    assert!(message.contains("/properties/spot/type"), "names the place: {message}");
    assert!(message.contains("numbr"), "names the bad value: {message}");

    let fix = json!({"spec": {"inputSchema": {"type": "object", "properties": {"spot": {"type": "number"}}}}});
    tools.patch("price-option", &PatchParams::default(), &Patch::Merge(fix)).await.unwrap();
    let fixed =
        wait_for(&tools, "price-option", "Ready=True/Valid", |t| ready_is(t, "True", "Valid") && observed_current(t))
            .await;
    assert_eq!(fixed.metadata.generation, Some(2));
    assert!(fixed.is_ready());
    assert_eq!(fixed.status.as_ref().unwrap().endpoint, None);
    controller.stop().await;
}

#[tokio::test]
async fn pool_tool_gets_a_hardened_pool_and_is_ready_when_a_replica_is_available() {
    let (ns, client) = namespace("ctl-pool").await;
    let key = KeyFile::new();
    let controller = Replica::start(config(&ns, &key, &[]), User::Admin).await;
    let pool_tool = tool(
        "get-quote",
        json!({"mode": "Pool", "timeoutSeconds": 20,
        "pool": {"replicas": 1, "reuseProcess": true, "concurrency": 3}}),
    );
    create(&client, &ns, &pool_tool).await;
    let tools: Api<McpTool> = Api::namespaced(client.clone(), &ns);
    let progressing =
        wait_for(&tools, "get-quote", "Ready=False/PoolProgressing", |t| ready_is(t, "False", "PoolProgressing")).await;
    let status: McpToolStatus = progressing.status.clone().unwrap();
    assert_eq!(status.endpoint.as_deref(), Some(format!("http://get-quote-pool.{ns}.svc:8080").as_str()));
    assert_eq!(status.available_replicas, Some(0));

    let deployment = Api::<Deployment>::namespaced(client.clone(), &ns).get("get-quote-pool").await.unwrap();
    assert_eq!(deployment.metadata.owner_references.as_ref().unwrap()[0].kind, "McpTool");
    let spec = deployment.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(1));
    let pod_spec = spec.template.spec.as_ref().unwrap();
    assert_eq!(pod_spec.automount_service_account_token, Some(false));
    assert_eq!(pod_spec.security_context.as_ref().unwrap().run_as_non_root, Some(true));
    let c = &pod_spec.containers[0];
    assert_eq!(c.command.as_deref().unwrap()[..5], ["/toolyard/bin/toolyard-runner", "serve", "--port", "8080", "--"]);
    assert_eq!(c.security_context.as_ref().unwrap().read_only_root_filesystem, Some(true));
    let env: Vec<(&str, Option<&str>)> =
        c.env.iter().flatten().map(|e| (e.name.as_str(), e.value.as_deref())).collect();
    assert_eq!(
        env,
        [
            ("TOOLYARD_POOL_CONCURRENCY", Some("3")),
            ("TOOLYARD_POOL_QUEUE", Some("24")),
            ("TOOLYARD_POOL_REUSE", Some("true")),
            ("TOOLYARD_POOL_KEY", None),
            ("REGION", Some("eu"))
        ]
    );
    let service = Api::<Service>::namespaced(client.clone(), &ns).get("get-quote-pool").await.unwrap();
    assert_eq!(service.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].port, 8080);
    let secret = Api::<Secret>::namespaced(client.clone(), &ns).get("get-quote-pool-key").await.unwrap();
    let hex = String::from_utf8(secret.data.unwrap()["key"].0.clone()).unwrap();
    let derived = key.key.derive(&toolyard_api::protocol::pool::key_purpose(&ns, "get-quote"));
    assert_eq!(SigningKey::from_hex(&hex).unwrap().to_hex(), derived.to_hex(), "the pool gets only its derived key");
    assert_ne!(hex.as_bytes(), std::fs::read_to_string(&key.path).unwrap().trim().as_bytes());

    // The ReplicaSet controller made the pod; make it ready as a kubelet would.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let selector = "toolyard.dev/tool=get-quote,toolyard.dev/component=pool";
    let pod = loop {
        if let Some(p) = pods.list(&ListParams::default().labels(selector)).await.unwrap().items.into_iter().next() {
            break p;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    set_pod_status(&client, &ns, pod.metadata.name.as_deref().unwrap(), running("tool", TOOL_IMAGE)).await;
    let available =
        wait_for(&tools, "get-quote", "Ready=True/PoolAvailable", |t| ready_is(t, "True", "PoolAvailable")).await;
    assert_eq!(available.status.as_ref().unwrap().available_replicas, Some(1));
    assert_eq!(ready(&available).unwrap().2, "1 of 1 warm pool replicas available");

    // Back to Job mode: the pool goes away, and so does the endpoint.
    let to_job = json!({"spec": {"execution": {"mode": "Job", "pool": null}}});
    tools.patch("get-quote", &PatchParams::default(), &Patch::Merge(to_job)).await.unwrap();
    let job_mode =
        wait_for(&tools, "get-quote", "Ready=True/Valid", |t| ready_is(t, "True", "Valid") && observed_current(t))
            .await;
    assert_eq!(job_mode.status.as_ref().unwrap().endpoint, None);
    assert_eq!(job_mode.status.as_ref().unwrap().available_replicas, None);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    toolyard_tests::wait_until(WAIT, "the pool to be removed", || async {
        Ok(deployments.get_opt("get-quote-pool").await?.is_none()
            && services.get_opt("get-quote-pool").await?.is_none())
    })
    .await
    .unwrap();
    controller.stop().await;
}

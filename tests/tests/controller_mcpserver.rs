//! McpServers Toolyard runs (`spec.runtime`), against the real apiserver and the real
//! Deployment and ReplicaSet controllers (the pod is made ready through the pod status
//! subresource): the hardened Deployment behind the stdio bridge, its Service and key Secret,
//! `Ready` following its pods next to the gateways' connection entries, the schema's rules, a
//! name that cannot name a Service, and the move to a `url` removing what ran.

use crate::controller_support;

use std::time::Duration;

use controller_support::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use toolyard_api::McpServer;
use toolyard_api::conditions::{self, READY};
use toolyard_api::protocol::bridge;
use toolyard_api::token::SigningKey;
use toolyard_tests::User;

fn server(name: &str, spec: Value) -> McpServer {
    serde_json::from_value(json!({
        "apiVersion": "toolyard.dev/v1alpha1",
        "kind": "McpServer",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .expect("McpServer manifest")
}

fn runtime() -> Value {
    json!({"image": TOOL_IMAGE, "command": ["python3", "-m", "research.server"], "env": [{"name": "REGION", "value": "eu"}]})
}

fn ready_is(server: &McpServer, status: &str, reason: &str) -> bool {
    let conditions = server.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    conditions::find(conditions, READY).is_some_and(|c| c.status == status && c.reason == reason)
}

#[tokio::test]
async fn a_runtime_server_gets_a_hardened_bridged_deployment_and_is_ready_with_a_pod() {
    let (ns, client) = namespace("ctl-server").await;
    let key = KeyFile::new();
    let controller = Replica::start(config(&ns, &key, &[]), User::Admin).await;
    let servers: Api<McpServer> = Api::namespaced(client.clone(), &ns);

    // The schema's rules, enforced by the apiserver.
    let both = server("both", json!({"url": "https://x.example/mcp", "runtime": runtime()}));
    let refused = servers.create(&PostParams::default(), &both).await.expect_err("url and runtime together");
    assert!(refused.to_string().contains("set exactly one of url"), "{refused}");
    let stray = server("stray", json!({"url": "https://x.example/mcp", "streamableHttp": {"port": 3001}}));
    let refused = servers.create(&PostParams::default(), &stray).await.expect_err("streamableHttp without runtime");
    assert!(refused.to_string().contains("streamableHttp describes"), "{refused}");

    create(&client, &ns, &server("research", json!({"runtime": runtime()}))).await;
    // A gateway replica's connection entry, written before the controller's first pass is seen.
    let entry = json!({"apiVersion": "toolyard.dev/v1alpha1", "kind": "McpServer", "status": {"connections": [
        {"replica": "gw-0", "state": "Waiting", "tools": 0, "failures": 0, "observedGeneration": 1,
         "lastError": "no pod of the server is available yet"}]}});
    servers
        .patch_status("research", &PatchParams::apply("toolyard-gateway/gw-0").force(), &Patch::Apply(&entry))
        .await
        .expect("the gateway's entry");
    let progressing =
        wait_for(&servers, "research", "Ready=False/ServerProgressing", |s| ready_is(s, "False", "ServerProgressing"))
            .await;
    assert_eq!(progressing.status.as_ref().unwrap().available_replicas, Some(0));

    let deployment = Api::<Deployment>::namespaced(client.clone(), &ns).get("research-mcp").await.unwrap();
    assert_eq!(deployment.metadata.owner_references.as_ref().unwrap()[0].kind, "McpServer");
    let pod_spec = deployment.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    assert_eq!(pod_spec.automount_service_account_token, Some(false));
    assert_eq!(pod_spec.security_context.as_ref().unwrap().run_as_non_root, Some(true));
    let c = &pod_spec.containers[0];
    assert_eq!(
        c.command.as_deref().unwrap(),
        ["/toolyard/bin/toolyard-runner", "bridge", "--", "python3", "-m", "research.server"]
    );
    assert_eq!(c.security_context.as_ref().unwrap().read_only_root_filesystem, Some(true));
    let service = Api::<Service>::namespaced(client.clone(), &ns).get("research-mcp").await.unwrap();
    assert_eq!(service.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].port, 8080);
    let secret = Api::<Secret>::namespaced(client.clone(), &ns).get("research-mcp-key").await.unwrap();
    let hex = String::from_utf8(secret.data.unwrap()["key"].0.clone()).unwrap();
    let derived = key.key.derive(&bridge::key_purpose(&ns, "research"));
    assert_eq!(SigningKey::from_hex(&hex).unwrap().to_hex(), derived.to_hex(), "the pod gets only its derived key");

    // The ReplicaSet controller made the pod; make it ready as a kubelet would.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let selector = "toolyard.dev/server=research,toolyard.dev/component=mcp-server";
    let pod = loop {
        if let Some(p) = pods.list(&ListParams::default().labels(selector)).await.unwrap().items.into_iter().next() {
            break p;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    set_pod_status(&client, &ns, pod.metadata.name.as_deref().unwrap(), running("server", TOOL_IMAGE)).await;
    let available =
        wait_for(&servers, "research", "Ready=True/ServerAvailable", |s| ready_is(s, "True", "ServerAvailable")).await;
    let status = available.status.clone().unwrap();
    assert_eq!(status.available_replicas, Some(1));
    assert_eq!(status.connections.len(), 1, "the gateway's entry stays: {status:?}");
    assert_eq!(status.connections[0].replica, "gw-0");

    // A move to a url: what ran goes, and so does the controller's part of the status.
    servers
        .patch(
            "research",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"runtime": null, "url": "https://research.example/mcp"}})),
        )
        .await
        .expect("to a url");
    let moved = wait_for(&servers, "research", "the controller's status removed", |s| {
        s.status.as_ref().is_some_and(|st| st.conditions.is_empty() && st.available_replicas.is_none())
    })
    .await;
    assert_eq!(moved.status.unwrap().connections.len(), 1, "the gateway's entry stays");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    for _ in 0..100 {
        if deployments.get_opt("research-mcp").await.unwrap().is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(deployments.get_opt("research-mcp").await.unwrap().is_none(), "the Deployment is removed");
    assert!(Api::<Service>::namespaced(client.clone(), &ns).get_opt("research-mcp").await.unwrap().is_none());

    // A name that cannot name the Service: not ready, and the message says why.
    create(&client, &ns, &server("9lives", json!({"runtime": runtime()}))).await;
    let invalid =
        wait_for(&servers, "9lives", "Ready=False/InvalidSpec", |s| ready_is(s, "False", "InvalidSpec")).await;
    let conditions = invalid.status.unwrap().conditions;
    let message = &conditions::find(&conditions, READY).unwrap().message;
    assert!(message.contains("metadata.name") && message.contains("9lives-mcp"), "{message}");
    assert!(deployments.get_opt("9lives-mcp").await.unwrap().is_none(), "nothing runs for an invalid server");
    controller.stop().await;
}

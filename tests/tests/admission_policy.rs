//! The chart's admission policies on the real apiserver: only the gateway creates runs owned
//! by someone else; anyone else may only create runs owned by themselves, without groups
//! they do not have. McpTools use only the runtime classes, tolerations and volumes the
//! operator lists.

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
use toolyard_api::{McpTool, ToolCall};
use toolyard_tests::{TestEnv, User, random_suffix, repo_path, wait_until};

fn call(name: &str, issuer: &str, user: &str, groups: &[&str]) -> ToolCall {
    serde_json::from_value(json!({
        "apiVersion": "toolyard.dev/v1alpha1", "kind": "ToolCall",
        "metadata": {"name": name},
        "spec": {"tool": "echo", "owner": {"issuer": issuer, "user": user, "groups": groups},
                 "input": {"key": "k", "sizeBytes": 2}, "timeoutSeconds": 30}
    }))
    .expect("a valid ToolCall")
}

fn render_policy(env: &TestEnv, release: &str, label: &str) -> String {
    render(env, release, label, "templates/admission/owner-policy.yaml", &[])
}

fn render(env: &TestEnv, release: &str, label: &str, template: &str, sets: &[&str]) -> String {
    let helm = env.bin_dir().join("helm");
    let out = std::process::Command::new(helm)
        .args([
            "template",
            release,
            repo_path("charts/toolyard").to_str().expect("utf-8 path"),
            "-n",
            "toolyard-system",
        ])
        .args(["--kube-version", "1.34.4", "--show-only", template])
        .args(["-f", repo_path("charts/toolyard/ci/test-values.yaml").to_str().expect("utf-8 path")])
        .args(["--set", "admission.enabled=true", "--set", "admission.trustedUsers={toolyard-gateway}"])
        .args(["--set", &format!("admission.namespaceSelector.matchLabels.toolyard-test-admission={label}")])
        .args(sets.iter().flat_map(|s| ["--set", s]))
        .output()
        .expect("helm runs");
    assert!(out.status.success(), "helm template failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8 manifest")
}

/// A fresh namespace with a random `toolyard-test-admission` label (the policies' binding
/// selects it, so no other test's namespace is affected): its name and the label.
async fn labelled_namespace(env: &TestEnv, prefix: &str) -> (String, String) {
    env.install_crds().await.expect("CRDs");
    let ns = env.namespace(prefix).await.expect("namespace");
    let label = random_suffix(8);
    Api::<Namespace>::all(env.client(User::Admin).await)
        .patch(
            &ns,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"toolyard-test-admission": label}}})),
        )
        .await
        .expect("label the namespace");
    (ns, label)
}

/// Role `name` in `ns` with `verbs` on toolyard.dev `resources`, bound to `users`.
async fn grant(env: &TestEnv, ns: &str, name: &str, resources: &[&str], verbs: &[&str], users: &[&str]) {
    let client = env.client(User::Admin).await;
    let strings = |items: &[&str]| items.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let role = Role {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["toolyard.dev".into()]),
            resources: Some(strings(resources)),
            verbs: strings(verbs),
            ..Default::default()
        }]),
    };
    Api::<Role>::namespaced(client.clone(), ns).create(&PostParams::default(), &role).await.expect("role");
    let subjects = users
        .iter()
        .map(|u| Subject {
            kind: "User".into(),
            name: (*u).into(),
            api_group: Some("rbac.authorization.k8s.io".into()),
            ..Default::default()
        })
        .collect();
    let binding = RoleBinding {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        role_ref: RoleRef { api_group: "rbac.authorization.k8s.io".into(), kind: "Role".into(), name: name.into() },
        subjects: Some(subjects),
    };
    Api::<RoleBinding>::namespaced(client, ns).create(&PostParams::default(), &binding).await.expect("binding");
}

#[tokio::test]
async fn only_the_gateway_creates_runs_owned_by_someone_else() {
    let env = TestEnv::get();
    let (ns, label) = labelled_namespace(env, "admission").await;
    let admin = env.client(User::Admin).await;
    let runs = ["toolcalls", "codingtasks"];
    grant(env, &ns, "create-runs", &runs, &["create", "get", "delete"], &["alice", "bob", "toolyard-gateway"]).await;

    let release = format!("adm-{label}");
    let manifest = render_policy(env, &release, &label);
    let file = std::env::temp_dir().join(format!("{release}.yaml"));
    std::fs::write(&file, &manifest).unwrap();
    env.kubectl_as(User::Admin, &["apply", "-f", file.to_str().unwrap()]).unwrap();

    let alice: Api<ToolCall> = Api::namespaced(env.client(User::Alice).await, &ns);
    let gateway: Api<ToolCall> = Api::namespaced(env.client(User::Gateway).await, &ns);
    let as_admin: Api<ToolCall> = Api::namespaced(admin.clone(), &ns);

    // The policy is enforced once the apiserver has loaded it: probe until alice's forged
    // run is refused (deleting any probe that slipped through).
    wait_until(Duration::from_secs(30), "the policy to be enforced", || async {
        let name = format!("probe-{}", random_suffix(5));
        match alice.create(&PostParams::default(), &call(&name, "kubernetes", "bob", &[])).await {
            Ok(_) => {
                as_admin.delete(&name, &DeleteParams::default()).await?;
                Ok(false)
            }
            Err(kube::Error::Api(e)) if e.code == 403 && e.message.contains("spec.owner must name the requester") => {
                Ok(true)
            }
            Err(e) => Err(e.into()),
        }
    })
    .await
    .unwrap();

    // Her own run, with her own group, is allowed.
    alice.create(&PostParams::default(), &call("own", "kubernetes", "alice", &["quants"])).await.unwrap();

    let refused = |result: Result<ToolCall, kube::Error>, needle: &str| match result {
        Err(kube::Error::Api(e)) => assert!(e.code == 403 && e.message.contains(needle), "{e:?}"),
        Ok(_) => panic!("accepted; expected a refusal containing {needle:?}"),
        Err(e) => panic!("{e}"),
    };
    refused(
        alice.create(&PostParams::default(), &call("as-bob", "kubernetes", "bob", &[])).await,
        "spec.owner must name the requester",
    );
    refused(
        alice.create(&PostParams::default(), &call("other-issuer", "apikey", "alice", &[])).await,
        "issuer: kubernetes",
    );
    refused(
        alice.create(&PostParams::default(), &call("more-groups", "kubernetes", "alice", &["system:masters"])).await,
        "spec.owner.groups may only list groups the requester has",
    );
    // Not even a cluster admin may forge an owner; the gateway may set any.
    refused(
        as_admin.create(&PostParams::default(), &call("admin-forges", "apikey", "alice", &[])).await,
        "spec.owner must name",
    );
    gateway.create(&PostParams::default(), &call("via-gateway", "apikey", "bob", &["ops"])).await.unwrap();

    env.kubectl_as(User::Admin, &["delete", "-f", file.to_str().unwrap()]).unwrap();
    let _ = std::fs::remove_file(file);
}

fn tool(name: &str, placement: serde_json::Value, volumes: serde_json::Value) -> McpTool {
    serde_json::from_value(json!({
        "apiVersion": "toolyard.dev/v1alpha1", "kind": "McpTool",
        "metadata": {"name": name},
        "spec": {"name": name.replace('-', "_"), "description": "d", "inputSchema": {"type": "object"},
                 "runtime": {"image": "example/tool:1", "command": ["python3"], "volumes": volumes},
                 "placement": placement}
    }))
    .expect("a valid McpTool")
}

#[tokio::test]
async fn mcptools_use_only_the_runtime_classes_tolerations_and_volumes_the_operator_lists() {
    let env = TestEnv::get();
    let (ns, label) = labelled_namespace(env, "admtools").await;
    let admin = env.client(User::Admin).await;
    let verbs = ["create", "get", "patch", "delete"];
    grant(env, &ns, "tools", &["mcptools"], &verbs, &["alice", "toolyard-gateway"]).await;

    let release = format!("admt-{label}");
    let rates = format!("admission.tools.configMaps={{{ns}/rates}}");
    let sets = [
        "admission.tools.runtimeClasses={gvisor}",
        "admission.tools.tolerationKeys={nvidia.com/gpu}",
        rates.as_str(),
        "admission.trustedUsers={toolyard-gateway}",
    ];
    let manifest = render(env, &release, &label, "templates/admission/tool-policy.yaml", &sets);
    let file = std::env::temp_dir().join(format!("{release}.yaml"));
    std::fs::write(&file, &manifest).unwrap();
    env.kubectl_as(User::Admin, &["apply", "-f", file.to_str().unwrap()]).unwrap();

    let alice: Api<McpTool> = Api::namespaced(env.client(User::Alice).await, &ns);
    let as_admin: Api<McpTool> = Api::namespaced(admin.clone(), &ns);
    let kata = json!({"runtimeClassName": "kata"});
    wait_until(Duration::from_secs(30), "the policy to be enforced", || async {
        let name = format!("probe-{}", random_suffix(5));
        match alice.create(&PostParams::default(), &tool(&name, kata.clone(), json!([]))).await {
            Ok(_) => {
                as_admin.delete(&name, &DeleteParams::default()).await?;
                Ok(false)
            }
            Err(kube::Error::Api(e)) if e.code == 403 && e.message.contains("runtimeClassName kata") => Ok(true),
            Err(e) => Err(e.into()),
        }
    })
    .await
    .unwrap();

    let refused = |result: Result<McpTool, kube::Error>, needle: &str| match result {
        Err(kube::Error::Api(e)) => assert!(e.code == 403 && e.message.contains(needle), "{e:?}"),
        Ok(_) => panic!("accepted; expected a refusal containing {needle:?}"),
        Err(e) => panic!("{e}"),
    };
    let create = |name: &str, placement: serde_json::Value, volumes: serde_json::Value| {
        let alice = alice.clone();
        let tool = tool(name, placement, volumes);
        async move { alice.create(&PostParams::default(), &tool).await }
    };
    // What the operator listed, and a tool with no extras.
    create("plain", json!(null), json!([])).await.unwrap();
    let gpu = json!({"runtimeClassName": "gvisor", "nodeSelector": {"gpu": "true"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]});
    create("gpu", gpu, json!([{"name": "rates", "mountPath": "/data", "configMap": {"name": "rates"}}])).await.unwrap();

    // Anything else, each with what to ask the operator for.
    refused(
        create("kata", json!({"runtimeClassName": "kata"}), json!([])).await,
        "runtimeClassName kata is not allowed here: the operator lists the allowed runtime classes in admission.tools.runtimeClasses",
    );
    refused(
        create("dedicated", json!({"tolerations": [{"key": "dedicated", "operator": "Exists"}]}), json!([])).await,
        "admission.tools.tolerationKeys",
    );
    refused(create("everything", json!({"tolerations": [{"operator": "Exists"}]}), json!([])).await, "without a key");
    refused(
        create("other-map", json!(null), json!([{"name": "m", "mountPath": "/m", "configMap": {"name": "other"}}]))
            .await,
        "ConfigMap other is not allowed here",
    );
    refused(
        create("secret", json!(null), json!([{"name": "s", "mountPath": "/s", "secret": {"name": "feed"}}])).await,
        "Secret feed is not allowed here",
    );
    refused(
        create("claim", json!(null), json!([{"name": "c", "mountPath": "/c", "persistentVolumeClaim": {"name": "h"}}]))
            .await,
        "PersistentVolumeClaim h is not allowed here",
    );
    // Not by a later update either.
    let patch =
        json!({"spec": {"runtime": {"volumes": [{"name": "s", "mountPath": "/s", "secret": {"name": "feed"}}]}}});
    let updated = alice.patch("plain", &PatchParams::default(), &Patch::Merge(&patch)).await;
    refused(updated, "Secret feed is not allowed here");
    // A trusted user is not limited.
    let gateway: Api<McpTool> = Api::namespaced(env.client(User::Gateway).await, &ns);
    let secret = tool("by-gateway", json!(null), json!([{"name": "s", "mountPath": "/s", "secret": {"name": "feed"}}]));
    gateway.create(&PostParams::default(), &secret).await.unwrap();

    env.kubectl_as(User::Admin, &["delete", "-f", file.to_str().unwrap()]).unwrap();
    let _ = std::fs::remove_file(file);
}

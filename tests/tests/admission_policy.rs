//! The chart's admission policy on the real apiserver: only the gateway creates runs owned
//! by someone else; anyone else may only create runs owned by themselves, without groups
//! they do not have.

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
use toolyard_api::ToolCall;
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
    let helm = env.bin_dir().join("helm");
    let out = std::process::Command::new(helm)
        .args([
            "template",
            release,
            repo_path("charts/toolyard").to_str().expect("utf-8 path"),
            "-n",
            "toolyard-system",
        ])
        .args(["--kube-version", "1.34.4", "--show-only", "templates/admission/owner-policy.yaml"])
        .args(["-f", repo_path("charts/toolyard/ci/test-values.yaml").to_str().expect("utf-8 path")])
        .args(["--set", "admission.enabled=true", "--set", "admission.trustedUsers={toolyard-gateway}"])
        .args(["--set", &format!("admission.namespaceSelector.matchLabels.toolyard-test-admission={label}")])
        .output()
        .expect("helm runs");
    assert!(out.status.success(), "helm template failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8 manifest")
}

async fn grant_create_toolcalls(env: &TestEnv, ns: &str) {
    let client = env.client(User::Admin).await;
    let role = Role {
        metadata: ObjectMeta { name: Some("create-runs".into()), ..Default::default() },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["toolyard.dev".into()]),
            resources: Some(vec!["toolcalls".into(), "codingtasks".into()]),
            verbs: vec!["create".into(), "get".into(), "delete".into()],
            ..Default::default()
        }]),
    };
    Api::<Role>::namespaced(client.clone(), ns).create(&PostParams::default(), &role).await.expect("role");
    let subjects = ["alice", "bob", "toolyard-gateway"]
        .iter()
        .map(|u| Subject {
            kind: "User".into(),
            name: (*u).into(),
            api_group: Some("rbac.authorization.k8s.io".into()),
            ..Default::default()
        })
        .collect();
    let binding = RoleBinding {
        metadata: ObjectMeta { name: Some("create-runs".into()), ..Default::default() },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: "create-runs".into(),
        },
        subjects: Some(subjects),
    };
    Api::<RoleBinding>::namespaced(client, ns).create(&PostParams::default(), &binding).await.expect("binding");
}

#[tokio::test]
async fn only_the_gateway_creates_runs_owned_by_someone_else() {
    let env = TestEnv::get();
    env.install_crds().await.unwrap();
    let ns = env.namespace("admission").await.unwrap();
    let label = random_suffix(8);
    let admin = env.client(User::Admin).await;
    Api::<Namespace>::all(admin.clone())
        .patch(
            &ns,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"toolyard-test-admission": label}}})),
        )
        .await
        .unwrap();
    grant_create_toolcalls(env, &ns).await;

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

//! Least privilege, proven: the chart's controller RBAC is rendered with `helm template`,
//! applied, and the controller runs as the chart's ServiceAccount (a token from the
//! TokenRequest API) through every path it has: Jobs, Secrets, Events, pool Deployments and
//! Services, status writes, deletion after retention, leader election. Any missing permission
//! shows up as an API error; extra permissions are refused by SubjectAccessReviews.

use crate::controller_support;

use std::process::Command;

use controller_support::*;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use toolyard_api::{CodingTask, McpTool, ToolCall};
use toolyard_tests::{TestEnv, User, random_suffix, repo_path, wait_until};

const RBAC_KINDS: [&str; 5] = ["ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"];

/// `helm template` of the chart (the controller's objects only), as JSON documents.
fn render_chart(release: &str, namespace: &str, args: &[&str]) -> Vec<Value> {
    let env = TestEnv::get();
    let helm = env.bin_dir().join("helm");
    let out = Command::new(&helm)
        .args(["template", release])
        .arg(repo_path("charts/toolyard"))
        .args(["--namespace", namespace, "--kube-version", "1.34.4"])
        .arg("-f")
        .arg(repo_path("charts/toolyard/ci/test-values.yaml"))
        .args(args)
        .output()
        .expect("running helm");
    assert!(out.status.success(), "helm template failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).expect("utf-8");
    text.split("\n---")
        .map(|doc| doc.trim())
        .filter(|doc| doc.lines().any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#')))
        .map(|doc| serde_saphyr::from_str::<Value>(doc).unwrap_or_else(|e| panic!("rendered YAML: {e}\n{doc}")))
        .filter(|v| !v.is_null())
        .filter(|v| v["metadata"]["labels"]["app.kubernetes.io/component"] == "controller")
        .collect()
}

async fn allowed(admin: &kube::Client, user: &str, groups: &[String], attrs: ResourceAttributes) -> bool {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.to_owned()),
            groups: Some(groups.to_vec()),
            resource_attributes: Some(attrs),
            ..Default::default()
        },
        ..Default::default()
    };
    let out = Api::<SubjectAccessReview>::all(admin.clone())
        .create(&PostParams::default(), &review)
        .await
        .expect("test step");
    out.status.is_some_and(|s| s.allowed)
}

fn attrs(ns: &str, verb: &str, group: &str, resource: &str) -> ResourceAttributes {
    ResourceAttributes {
        namespace: Some(ns.to_owned()),
        verb: Some(verb.to_owned()),
        group: Some(group.to_owned()),
        resource: Some(resource.to_owned()),
        ..Default::default()
    }
}

#[tokio::test]
async fn controller_runs_with_exactly_the_chart_rbac() {
    let env = TestEnv::get();
    let (ns, admin) = namespace("ctl-rbac").await;
    let system_ns = env.namespace("ctl-sys").await.unwrap();
    let release = format!("rbac-{}", random_suffix(5));
    let fullname = format!("{release}-toolyard-controller");

    // The chart's RBAC for a controller that serves `ns`, applied as an admin would.
    let docs = render_chart(&release, &system_ns, &["--set", &format!("watchNamespaces={{{ns}}}")]);
    let rbac: Vec<Value> =
        docs.into_iter().filter(|d| RBAC_KINDS.contains(&d["kind"].as_str().unwrap_or_default())).collect();
    let kinds: Vec<&str> = rbac.iter().filter_map(|d| d["kind"].as_str()).collect();
    assert_eq!(kinds, ["ServiceAccount", "Role", "Role", "RoleBinding", "RoleBinding"], "namespaced RBAC only");
    let file = std::env::temp_dir().join(format!("toolyard-rbac-{}.json", random_suffix(8)));
    std::fs::write(&file, serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "List", "items": rbac})).unwrap())
        .unwrap();
    env.kubectl_as(User::Admin, &["apply", "-f", file.to_str().unwrap()]).expect("apply chart RBAC");
    let _ = std::fs::remove_file(&file);

    // A token for the chart's ServiceAccount, from the TokenRequest API.
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), &system_ns);
    let request = TokenRequest {
        spec: TokenRequestSpec { audiences: vec![], expiration_seconds: Some(3600), ..Default::default() },
        ..Default::default()
    };
    let token: TokenRequest =
        sas.create_subresource("token", &fullname, &PostParams::default(), &request).await.expect("TokenRequest");
    let token = token.status.expect("token status").token;
    let mut kube_config = env.config(User::Admin).await.unwrap();
    kube_config.auth_info = kube::config::AuthInfo { token: Some(token.into()), ..Default::default() };

    let sa_user = format!("system:serviceaccount:{system_ns}:{fullname}");
    let sa_groups = vec![
        "system:serviceaccounts".to_owned(),
        format!("system:serviceaccounts:{system_ns}"),
        "system:authenticated".to_owned(),
    ];
    wait_until(WAIT, "the Role to take effect", || async {
        Ok(allowed(&admin, &sa_user, &sa_groups, attrs(&ns, "watch", "batch", "jobs")).await)
    })
    .await
    .unwrap();

    // Deny by default: what the controller must not be able to do.
    for (namespace, verb, group, resource) in [
        (ns.as_str(), "get", "", "secrets"),
        (ns.as_str(), "list", "", "secrets"),
        (ns.as_str(), "watch", "", "secrets"),
        (ns.as_str(), "patch", "", "secrets"),
        (ns.as_str(), "delete", "", "secrets"),
        (ns.as_str(), "create", "", "pods"),
        (ns.as_str(), "get", "", "pods"),
        (ns.as_str(), "update", "toolyard.dev", "mcptools"),
        (ns.as_str(), "patch", "toolyard.dev", "toolcalls"),
        (ns.as_str(), "create", "toolyard.dev", "toolcalls"),
        (ns.as_str(), "create", "rbac.authorization.k8s.io", "roles"),
        ("default", "list", "batch", "jobs"),
        (system_ns.as_str(), "list", "", "secrets"),
    ] {
        let can = allowed(&admin, &sa_user, &sa_groups, attrs(namespace, verb, group, resource)).await;
        assert!(!can, "the controller must not {verb} {resource} in {namespace}");
    }
    let other_lease = ResourceAttributes {
        name: Some("someone-elses".into()),
        ..attrs(&system_ns, "patch", "coordination.k8s.io", "leases")
    };
    assert!(!allowed(&admin, &sa_user, &sa_groups, other_lease).await, "only its own Lease");

    // Run the controller as that identity, with leader election as in the chart.
    let key = KeyFile::new();
    let flags = [
        "--leader-elect",
        "true",
        "--lease-namespace",
        system_ns.as_str(),
        "--lease-name",
        fullname.as_str(),
        "--lease-duration-seconds",
        "4",
        "--lease-grace-seconds",
        "1",
        "--toolcall-retention-seconds",
        "3",
    ];
    let controller = Replica::start_with(config(&ns, &key, &flags), kube_config).await;
    let leases: Api<Lease> = Api::namespaced(admin.clone(), &system_ns);
    wait_for(&leases, &fullname, "the controller to hold its Lease", |l| {
        l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some(controller.identity.as_str())
    })
    .await;

    // Every path: a call that succeeds, one that fails, one cancelled, one whose image cannot be pulled.
    create(&admin, &ns, &job_tool("price-option")).await;
    for name in ["rbac-ok", "rbac-fail", "rbac-cancel", "rbac-pull"] {
        create(&admin, &ns, &call(name, "price-option", 120)).await;
    }
    let calls: Api<ToolCall> = Api::namespaced(admin.clone(), &ns);
    let pod = pod_of(&admin, &ns, "toolyard.dev/call", "rbac-ok").await;
    set_pod_status(&admin, &ns, pod.metadata.name.as_deref().unwrap(), running("tool", TOOL_IMAGE)).await;
    wait_call(&calls, "rbac-ok", "Unknown", "Running").await;
    set_pod_status(&admin, &ns, pod.metadata.name.as_deref().unwrap(), finished("tool", TOOL_IMAGE, 0, "")).await;
    let pod = pod_of(&admin, &ns, "toolyard.dev/call", "rbac-fail").await;
    set_pod_status(&admin, &ns, pod.metadata.name.as_deref().unwrap(), finished("tool", TOOL_IMAGE, 1, "boom")).await;
    let pod = pod_of(&admin, &ns, "toolyard.dev/call", "rbac-pull").await;
    set_pod_status(&admin, &ns, pod.metadata.name.as_deref().unwrap(), waiting("tool", TOOL_IMAGE, "InvalidImageName"))
        .await;
    pod_of(&admin, &ns, "toolyard.dev/call", "rbac-cancel").await;
    calls
        .patch("rbac-cancel", &PatchParams::default(), &Patch::Merge(json!({"spec": {"cancelRequested": true}})))
        .await
        .unwrap();

    wait_call(&calls, "rbac-ok", "True", "Succeeded").await;
    wait_call(&calls, "rbac-fail", "False", "Failed").await;
    wait_call(&calls, "rbac-pull", "False", "ImagePullFailed").await;
    wait_call(&calls, "rbac-cancel", "False", "Cancelled").await;
    let jobs: Api<Job> = Api::namespaced(admin.clone(), &ns);
    wait_until(WAIT, "stopped Jobs to be deleted", || async {
        Ok(jobs.get_opt("rbac-cancel").await?.is_none() && jobs.get_opt("rbac-pull").await?.is_none())
    })
    .await
    .unwrap();
    // Retention deletes finished calls.
    wait_until(WAIT, "finished calls to be deleted after the retention", || async {
        Ok(calls.list(&ListParams::default()).await?.items.is_empty())
    })
    .await
    .unwrap();

    // A coding task.
    create(&admin, &ns, &task("rbac-task", json!({}), 600)).await;
    let tasks: Api<CodingTask> = Api::namespaced(admin.clone(), &ns);
    let pod = pod_of(&admin, &ns, "toolyard.dev/task", "rbac-task").await;
    set_pod_status(
        &admin,
        &ns,
        pod.metadata.name.as_deref().unwrap(),
        finished("agent", "registry.example/toolyard-agent:test", 0, ""),
    )
    .await;
    wait_for(&tasks, "rbac-task", "the task to succeed", |t| {
        task_state(t) == Some(("True".into(), "Succeeded".into()))
    })
    .await;

    // A warm pool: created, made available, then removed when the tool moves to Job mode.
    create(&admin, &ns, &tool("get-quote", json!({"mode": "Pool", "pool": {"replicas": 1}}))).await;
    let tools: Api<McpTool> = Api::namespaced(admin.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns);
    let pool_pod = loop {
        let list = pods.list(&ListParams::default().labels("toolyard.dev/component=pool")).await.unwrap();
        if let Some(p) = list.items.into_iter().next() {
            break p;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    set_pod_status(&admin, &ns, pool_pod.metadata.name.as_deref().unwrap(), running("tool", TOOL_IMAGE)).await;
    wait_for(&tools, "get-quote", "the pool to be available", |t| {
        t.status.as_ref().and_then(|s| s.available_replicas) == Some(1) && t.is_ready()
    })
    .await;
    tools
        .patch(
            "get-quote",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"execution": {"mode": "Job", "pool": null}}})),
        )
        .await
        .unwrap();
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(admin.clone(), &ns);
    wait_until(WAIT, "the pool to be removed", || async { Ok(deployments.get_opt("get-quote-pool").await?.is_none()) })
        .await
        .unwrap();

    // Nothing was refused along the way, and Events were published as the controller.
    let (_, metrics) = controller.scrape("/metrics").await;
    for line in metrics.lines().filter(|l| l.starts_with("toolyard_controller_reconciles_total")) {
        assert!(line.contains("result=\"ok\""), "a reconcile failed under the chart's RBAC: {line}\n{metrics}");
    }
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(admin.clone(), &ns)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(events.items.iter().any(|e| e.reporting_controller.as_deref() == Some("toolyard-controller")));
    controller.stop().await;
}

#[test]
fn cluster_wide_mode_renders_a_cluster_role_with_the_same_rules() {
    let docs = render_chart("wide", "toolyard", &["--set-json", "watchNamespaces=[]"]);
    let cluster_role = docs.iter().find(|d| d["kind"] == "ClusterRole").expect("a ClusterRole without watchNamespaces");
    let binding = docs.iter().find(|d| d["kind"] == "ClusterRoleBinding").expect("its binding");
    assert_eq!(binding["subjects"][0]["name"], "wide-toolyard-controller");
    let namespaced = render_chart("wide", "toolyard", &["--set", "watchNamespaces={team-a}"]);
    let role = namespaced.iter().find(|d| d["kind"] == "Role" && d["metadata"]["namespace"] == "team-a").unwrap();
    assert_eq!(cluster_role["rules"], role["rules"], "one set of rules for both modes");
    let secrets: Vec<&Value> = role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["resources"].as_array().unwrap().iter().any(|x| x == "secrets"))
        .collect();
    assert_eq!(secrets.len(), 1);
    assert_eq!(secrets[0]["verbs"], json!(["create"]), "Secrets: create only, never read");
    let lease_role = docs
        .iter()
        .find(|d| d["kind"] == "Role" && d["metadata"]["name"] == "wide-toolyard-controller-leader-election");
    assert!(lease_role.is_some(), "leader election Role in the release namespace");
}

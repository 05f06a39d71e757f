//! Checks of a cluster install through the current kubeconfig: the CRDs at this binary's
//! version, a controller holding the Lease, the gateway ready (its readiness includes the
//! storage check), and which tools the token's identity may call according to the
//! cluster's own SelfSubjectAccessReview.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ListParams, LogParams, PostParams};
use kube::{Api, Client, CustomResourceExt};
use serde_json::Value;
use toolyard_api::{CodingTask, McpTool, ToolCall};

use super::Line;
use crate::connect::Connection;

/// The cluster lines.
pub async fn check(namespace: &str, conn: &Connection, limit: Duration) -> Vec<Line> {
    let client = match tokio::time::timeout(limit, Client::try_default()).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            return vec![Line::fail(
                "kube",
                format!("no Kubernetes client: {e}"),
                "set KUBECONFIG or run inside the cluster",
            )];
        }
        Err(_) => return vec![Line::fail("kube", "the kubeconfig did not load in time", "check KUBECONFIG")],
    };
    let mut lines = Vec::new();
    for (crd, kind) in [(McpTool::crd(), "McpTool"), (ToolCall::crd(), "ToolCall"), (CodingTask::crd(), "CodingTask")] {
        lines.push(within(limit, &format!("crd.{kind}"), crd_line(&client, crd, kind)).await);
    }
    lines.push(within(limit, "controller", controller(&client, namespace)).await);
    let (gateway, storage) = tokio::time::timeout(limit, gateway(&client, namespace)).await.unwrap_or_else(|_| {
        let late = || Line::fail("gateway", "the apiserver did not answer in time", "check the kubeconfig's cluster");
        (late(), Line::skip("storage", "not checked"))
    });
    lines.push(gateway);
    lines.push(storage);
    lines.push(within(limit, "access", access(&client, conn)).await);
    lines
}

async fn within(limit: Duration, check: &str, line: impl Future<Output = Line>) -> Line {
    tokio::time::timeout(limit, line)
        .await
        .unwrap_or_else(|_| Line::fail(check, "the apiserver did not answer in time", "check the kubeconfig's cluster"))
}

const INSTALL: &str = "install or upgrade the chart (helm upgrade --install toolyard charts/toolyard ...)";

async fn crd_line(client: &Client, expected: CustomResourceDefinition, kind: &str) -> Line {
    let check = format!("crd.{kind}");
    let name = expected.metadata.name.clone().unwrap_or_default();
    let installed = match Api::<CustomResourceDefinition>::all(client.clone()).get_opt(&name).await {
        Ok(Some(crd)) => crd,
        Ok(None) => return Line::fail(&check, format!("{name} is not installed"), INSTALL),
        Err(e) => {
            return Line::fail(
                &check,
                format!("reading {name}: {e}"),
                "allow this identity to get customresourcedefinitions",
            );
        }
    };
    let version = toolyard_api::API_VERSION.rsplit('/').next().unwrap_or_default();
    let served = installed.spec.versions.iter().find(|v| v.name == version && v.served);
    let Some(served) = served else {
        return Line::fail(&check, format!("{name} does not serve {version}, which this binary speaks"), INSTALL);
    };
    let established = installed
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Established" && c.status == "True"));
    if !established {
        return Line::fail(
            &check,
            format!("{name} is not Established yet"),
            "wait, or see `kubectl describe crd NAME`",
        );
    }
    let schema = |v: Option<
        &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceValidation,
    >| { serde_json::to_value(v.and_then(|s| s.open_api_v3_schema.as_ref())).unwrap_or(Value::Null) };
    let ours = expected.spec.versions.iter().find(|v| v.name == version).and_then(|v| v.schema.as_ref());
    if schema(served.schema.as_ref()) != schema(ours) {
        return Line::warn(
            &check,
            format!("{name} serves {version} with a schema other than this binary's (another Toolyard version)"),
            "use the toolyard binary of the installed version, or upgrade the chart",
        );
    }
    Line::pass(&check, format!("{name} serves {version}, as this binary expects"))
}

/// Deployments of the install with this component label.
async fn deployments(client: &Client, namespace: &str, component: &str) -> kube::Result<Vec<Deployment>> {
    let selector = format!("app.kubernetes.io/part-of=toolyard,app.kubernetes.io/component={component}");
    Ok(Api::<Deployment>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(&selector))
        .await?
        .items)
}

fn env_of(d: &Deployment, name: &str) -> Option<String> {
    let containers = &d.spec.as_ref()?.template.spec.as_ref()?.containers;
    containers.iter().flat_map(|c| c.env.iter().flatten()).find(|e| e.name == name).and_then(|e| e.value.clone())
}

async fn controller(client: &Client, namespace: &str) -> Line {
    const CHECK: &str = "controller";
    let found = match deployments(client, namespace, "controller").await {
        Ok(found) => found,
        Err(e) => {
            return Line::fail(
                CHECK,
                format!("listing Deployments in {namespace}: {e}"),
                "allow this identity to list deployments",
            );
        }
    };
    let Some(deployment) = found.first() else {
        return Line::fail(
            CHECK,
            format!("no Toolyard controller Deployment in namespace {namespace}"),
            format!("{INSTALL}, or pass --namespace"),
        );
    };
    let name = deployment.metadata.name.clone().unwrap_or_default();
    let ready = deployment.status.as_ref().and_then(|s| s.ready_replicas).unwrap_or(0);
    if ready == 0 {
        return Line::fail(
            CHECK,
            format!("Deployment {name} has no ready replica"),
            format!("kubectl -n {namespace} describe deployment {name}; kubectl -n {namespace} logs deployment/{name}"),
        );
    }
    if env_of(deployment, "TOOLYARD_LEADER_ELECT").as_deref() == Some("false") {
        return Line::pass(CHECK, format!("{ready} ready replica(s), leader election off"));
    }
    let lease_name = env_of(deployment, "TOOLYARD_LEASE_NAME").unwrap_or_else(|| "toolyard-controller".into());
    let duration = env_of(deployment, "TOOLYARD_LEASE_DURATION_SECONDS").and_then(|s| s.parse().ok()).unwrap_or(15i64);
    let lease = match Api::<Lease>::namespaced(client.clone(), namespace).get_opt(&lease_name).await {
        Ok(lease) => lease,
        Err(e) => {
            return Line::fail(CHECK, format!("reading Lease {lease_name}: {e}"), "allow this identity to get leases");
        }
    };
    let spec = lease.and_then(|l| l.spec).unwrap_or_default();
    let holder = spec.holder_identity.filter(|h| !h.is_empty());
    let age = spec.renew_time.map(|t| jiff_age(&t.0));
    match (holder, age) {
        (Some(holder), Some(age)) if age <= 2 * duration => {
            Line::pass(CHECK, format!("{ready} ready replica(s); {holder} leads (Lease renewed {age} s ago)"))
        }
        (holder, age) => Line::fail(
            CHECK,
            format!(
                "no replica leads: Lease {lease_name} is held by {} and was renewed {} ago",
                holder.as_deref().unwrap_or("nobody"),
                age.map_or("never".into(), |a| format!("{a} s"))
            ),
            format!("kubectl -n {namespace} logs deployment/{name} (the controller reconciles only while it leads)"),
        ),
    }
}

fn jiff_age(t: &k8s_openapi::jiff::Timestamp) -> i64 {
    k8s_openapi::jiff::Timestamp::now().duration_since(*t).as_secs()
}

async fn gateway(client: &Client, namespace: &str) -> (Line, Line) {
    const CHECK: &str = "gateway";
    let found = match deployments(client, namespace, "gateway").await {
        Ok(found) => found,
        Err(e) => {
            let fail = Line::fail(
                CHECK,
                format!("listing Deployments in {namespace}: {e}"),
                "allow this identity to list deployments",
            );
            return (fail, Line::skip("storage", "not checked"));
        }
    };
    let Some(deployment) = found.first() else {
        let fail = Line::fail(
            CHECK,
            format!("no Toolyard gateway Deployment in namespace {namespace}"),
            format!("{INSTALL}, or pass --namespace"),
        );
        return (fail, Line::skip("storage", "not checked"));
    };
    let name = deployment.metadata.name.clone().unwrap_or_default();
    let wanted = deployment.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let ready = deployment.status.as_ref().and_then(|s| s.ready_replicas).unwrap_or(0);
    if ready >= wanted && ready > 0 {
        return (
            Line::pass(CHECK, format!("Deployment {name}: {ready} of {wanted} replica(s) ready")),
            Line::pass("storage", "reachable from every gateway replica (their readiness checks the bucket)"),
        );
    }
    // Why not: the readiness probes' last failures, and the gateway's own log line for a
    // storage check that failed (the probe's event carries only the status code).
    let (reasons, storage_error) = probe_failures(client, namespace, deployment).await;
    let storage = match storage_error {
        Some(line) => Line::fail(
            "storage",
            format!("the gateway cannot reach its bucket: {line}"),
            "check gateway.storage.s3 (endpoint, bucket, region), the credentials Secret and that the S3 service answers",
        ),
        None => Line::skip("storage", "not known: no gateway replica reported on it"),
    };
    let why = if reasons.is_empty() { "no probe failure recorded".to_owned() } else { reasons.join("; ") };
    let fail = Line::fail(
        CHECK,
        format!("Deployment {name}: {ready} of {wanted} replica(s) ready ({why})"),
        format!("kubectl -n {namespace} describe deployment {name}; kubectl -n {namespace} logs deployment/{name}"),
    );
    (fail, storage)
}

/// The latest readiness-probe failure of each of the Deployment's pods that is not ready,
/// and the last storage health failure in their logs.
async fn probe_failures(client: &Client, namespace: &str, deployment: &Deployment) -> (Vec<String>, Option<String>) {
    let labels = deployment.spec.as_ref().and_then(|s| s.selector.match_labels.clone()).unwrap_or_default();
    let selector: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let pods_api = Api::<Pod>::namespaced(client.clone(), namespace);
    let pods =
        pods_api.list(&ListParams::default().labels(&selector.join(","))).await.map(|l| l.items).unwrap_or_default();
    let events = Api::<Event>::namespaced(client.clone(), namespace);
    let mut reasons = Vec::new();
    let mut storage = None;
    for pod in pods {
        let ready = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        if ready {
            continue;
        }
        let pod_name = pod.metadata.name.unwrap_or_default();
        let fields = format!("involvedObject.name={pod_name},reason=Unhealthy");
        if let Ok(list) = events.list(&ListParams::default().fields(&fields)).await
            && let Some(latest) = list.items.iter().max_by_key(|e| e.last_timestamp.as_ref().map(|t| t.0))
            && let Some(message) = &latest.message
        {
            reasons.push(format!("{pod_name}: {}", message.trim()));
        }
        let tail = LogParams { tail_lines: Some(300), ..Default::default() };
        if let Ok(log) = pods_api.logs(&pod_name, &tail).await
            && let Some(line) = log.lines().rev().find(|l| l.contains("storage health check"))
        {
            storage.get_or_insert_with(|| format!("{pod_name}: {}", line.trim()));
        }
    }
    (reasons, storage)
}

/// The tools the token's identity may call, by the apiserver's SelfSubjectAccessReview.
async fn access(operator: &Client, conn: &Connection) -> Line {
    const CHECK: &str = "access";
    let token = match conn.token() {
        Ok(Some(token)) => token,
        _ => return Line::skip(CHECK, "not checked: no token (--token-file or TOOLYARD_TOKEN)"),
    };
    let tools = match Api::<McpTool>::all(operator.clone()).list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(e) => return Line::fail(CHECK, format!("listing McpTools: {e}"), "allow this identity to list mcptools"),
    };
    let mut config = match kube::Config::infer().await {
        Ok(c) => c,
        Err(e) => return Line::fail(CHECK, format!("kubeconfig: {e}"), "set KUBECONFIG"),
    };
    config.auth_info = kube::config::AuthInfo { token: Some(secrecy::SecretString::from(token)), ..Default::default() };
    let Ok(as_token) = Client::try_from(config) else {
        return Line::fail(CHECK, "no client for the token", "check the kubeconfig");
    };
    let reviews = Api::<SelfSubjectAccessReview>::all(as_token);
    let mut allowed = Vec::new();
    for tool in &tools {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    group: Some("toolyard.dev".into()),
                    resource: Some("mcptools".into()),
                    verb: Some("call".into()),
                    namespace: tool.metadata.namespace.clone(),
                    name: tool.metadata.name.clone(),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        match reviews.create(&PostParams::default(), &review).await {
            Ok(answer) if answer.status.as_ref().is_some_and(|s| s.allowed) => allowed.push(tool.spec.name.clone()),
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 401 => {
                return Line::skip(
                    CHECK,
                    "not checked: the apiserver does not accept this token (not a Kubernetes token)",
                );
            }
            Err(e) => return Line::fail(CHECK, format!("SelfSubjectAccessReview: {e}"), "check the apiserver"),
        }
    }
    allowed.sort();
    allowed.dedup();
    if allowed.is_empty() {
        return Line::warn(
            CHECK,
            format!("RBAC lets this identity call none of the {} McpTool(s)", tools.len()),
            "kubectl create rolebinding NAME -n TOOLS_NS --clusterrole=toolyard-tool-caller --serviceaccount=NS:NAME",
        );
    }
    Line::pass(CHECK, format!("RBAC lets this identity call {} tool(s): {}", allowed.len(), allowed.join(", ")))
}

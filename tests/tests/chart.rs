//! The Helm chart: it renders for the default (required settings only) and the non-default
//! values, the real apiserver accepts every object it renders (server-side dry run: schema
//! validation, RBAC escalation checks, admission), wrong values fail against
//! `values.schema.json`, and `helm install` into the test apiserver gives a release whose
//! admission policy is active, whose user roles work and whose pods pass the restricted Pod
//! Security Standard.

use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use toolyard_api::CodingTask;
use toolyard_tests::{TestEnv, User, random_suffix, repo_path, wait_until};

const CI_VALUES: &str = "charts/toolyard/ci/test-values.yaml";
const FULL_VALUES: &str = "charts/toolyard/ci/full-values.yaml";

fn helm(env: &TestEnv, args: &[&str]) -> std::process::Output {
    Command::new(env.bin_dir().join("helm")).args(args).output().expect("helm runs")
}

fn helm_template(env: &TestEnv, namespace: &str, values: &str, extra: &[&str]) -> String {
    let chart = repo_path("charts/toolyard");
    let values = repo_path(values);
    let mut args = vec!["template", "ty", chart.to_str().expect("utf-8"), "-n", namespace];
    args.extend(["--kube-version", "1.34.4", "-f", values.to_str().expect("utf-8")]);
    args.extend(extra);
    let out = helm(env, &args);
    assert!(out.status.success(), "helm template failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8 manifest")
}

/// The rendered documents as JSON.
fn documents(manifest: &str) -> Vec<Value> {
    manifest
        .split("\n---")
        .map(str::trim)
        .filter(|doc| doc.lines().any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#')))
        .map(|doc| serde_saphyr::from_str::<Value>(doc).unwrap_or_else(|e| panic!("rendered YAML: {e}\n{doc}")))
        .filter(|v| !v.is_null())
        .collect()
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{kind} {name} is not rendered"))
}

fn dry_run(env: &TestEnv, name: &str, manifest: &str) -> String {
    let file = std::env::temp_dir().join(format!("{name}-{}.yaml", random_suffix(6)));
    std::fs::write(&file, manifest).expect("write manifest");
    let out = env
        .kubectl_as(User::Admin, &["apply", "--dry-run=server", "-f", file.to_str().expect("utf-8 path")])
        .unwrap_or_else(|e| panic!("the apiserver refused the chart: {e:#}"));
    let _ = std::fs::remove_file(file);
    out
}

#[tokio::test]
async fn every_rendered_object_passes_a_server_side_dry_run() {
    let env = TestEnv::get();
    env.install_crds().await.unwrap();
    let release_ns = env.namespace("chart").await.unwrap();
    let served = env.namespace("chart-served").await.unwrap();
    let watch = format!("watchNamespaces={{{served}}}");
    let manifest = helm_template(
        env,
        &release_ns,
        CI_VALUES,
        &["--set", &watch, "--set", "admission.namespaceSelector.matchLabels.none=none"],
    );
    for kind in [
        "kind: Deployment",
        "kind: NetworkPolicy",
        "kind: ValidatingAdmissionPolicy",
        "kind: Role",
        "kind: PodDisruptionBudget",
    ] {
        assert!(manifest.contains(kind), "{kind} missing from the rendered chart");
    }
    let out = dry_run(env, &release_ns, &manifest);
    assert!(
        out.contains("deployment.apps/ty-toolyard-gateway") && out.contains("deployment.apps/ty-toolyard-controller"),
        "{out}"
    );
    assert!(out.contains("networkpolicy.networking.k8s.io/ty-toolyard-runs"), "{out}");
}

#[tokio::test]
async fn the_non_default_values_render_every_optional_part_and_pass_a_server_side_dry_run() {
    let env = TestEnv::get();
    env.install_crds().await.unwrap();
    let release_ns = env.namespace("chart-full").await.unwrap();
    let manifest = helm_template(
        env,
        &release_ns,
        FULL_VALUES,
        &["--set", "admission.namespaceSelector.matchLabels.none=none", "--set", "fullnameOverride="],
    );
    let docs = documents(&manifest);
    let gateway = find(&docs, "Deployment", "ty-toolyard-gateway");
    assert!(gateway["spec"].get("replicas").is_none(), "the HPA owns the replica count");
    let hpa = find(&docs, "HorizontalPodAutoscaler", "ty-toolyard-gateway");
    assert_eq!((hpa["spec"]["minReplicas"].as_i64(), hpa["spec"]["maxReplicas"].as_i64()), (Some(3), Some(6)));
    let ingress = find(&docs, "Ingress", "ty-toolyard-gateway");
    assert_eq!(ingress["spec"]["rules"][0]["host"], "mcp.example.com");
    assert_eq!(ingress["spec"]["tls"][0]["secretName"], "toolyard-ingress-tls");
    assert_eq!(find(&docs, "PodDisruptionBudget", "ty-toolyard-gateway")["spec"]["maxUnavailable"], 2);
    // TLS at the Ingress: no certificate Secret, plain HTTP behind it.
    assert!(!docs.iter().any(|d| d["kind"] == "Secret"), "own token key, no generated TLS Secret");
    let env_of = |deployment: &Value, name: &str| -> Option<Value> {
        deployment["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()
            .and_then(|e| e.iter().find(|v| v["name"] == name).map(|v| v["value"].clone()))
    };
    assert_eq!(env_of(gateway, "TOOLYARD_PLAIN_HTTP"), Some(json!("true")));
    let controller = find(&docs, "Deployment", "ty-toolyard-controller");
    assert_eq!(controller["spec"]["replicas"], 3);
    // Model profiles go to the gateway alone: the controller (and so every agent pod it makes)
    // gets no model setting and no key.
    let controller_env = controller["spec"]["template"]["spec"]["containers"][0]["env"].to_string();
    assert!(!controller_env.contains("MODEL"), "{controller_env}");
    assert_eq!(env_of(gateway, "TOOLYARD_MODEL_PROFILES"), Some(json!("/etc/toolyard/model-profiles/profiles.yaml")));
    assert_eq!(env_of(gateway, "TOOLYARD_MODEL_USER_TOKENS_PER_DAY"), Some(json!("5000000")));
    let profiles = find(&docs, "ConfigMap", "ty-toolyard-gateway-model-profiles")["data"]["profiles.yaml"]
        .as_str()
        .expect("profiles.yaml")
        .to_owned();
    assert!(
        profiles.contains("default: \"local\"")
            && profiles.contains("apiKeyFile: \"/etc/toolyard/model-keys/openai/key\"")
    );
    let volumes = gateway["spec"]["template"]["spec"]["volumes"].to_string();
    assert!(volumes.contains(r#""path":"openai/key""#) && volumes.contains(r#""name":"openai""#), "{volumes}");
    assert_eq!(env_of(controller, "TOOLYARD_CODINGTASK_RETENTION_SECONDS"), Some(json!("86400")));
    // Every namespace served: cluster-wide roles, and no per-namespace run policies to render.
    find(&docs, "ClusterRole", "ty-toolyard-controller");
    find(&docs, "ClusterRole", "ty-toolyard-gateway");
    assert!(!docs.iter().any(|d| d["kind"] == "NetworkPolicy" && d["metadata"]["name"] == "ty-toolyard-runs"));

    let out = dry_run(env, &release_ns, &manifest);
    for object in [
        "ingress.networking.k8s.io/ty-toolyard-gateway",
        "horizontalpodautoscaler.autoscaling/ty-toolyard-gateway",
        "poddisruptionbudget.policy/ty-toolyard-gateway",
    ] {
        assert!(out.contains(object), "{object} in {out}");
    }
}

#[tokio::test]
async fn the_controller_runs_two_replicas_with_leader_election_by_default() {
    let env = TestEnv::get();
    let docs = documents(&helm_template(env, "toolyard", CI_VALUES, &[]));
    let controller = find(&docs, "Deployment", "ty-toolyard-controller");
    assert_eq!(controller["spec"]["replicas"], 2);
    let container = &controller["spec"]["template"]["spec"]["containers"][0];
    let leader = container["env"].as_array().unwrap().iter().find(|v| v["name"] == "TOOLYARD_LEADER_ELECT").unwrap();
    assert_eq!(leader["value"], "true");
    find(&docs, "Role", "ty-toolyard-controller-leader-election");
}

#[tokio::test]
async fn the_gateway_needs_allowed_hosts_and_a_bucket() {
    let env = TestEnv::get();
    let chart = repo_path("charts/toolyard");
    let out = helm(env, &["template", "ty", chart.to_str().unwrap(), "--kube-version", "1.34.4"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("set gateway.allowedHosts") || err.contains("set gateway.storage.s3.bucket"), "{err}");
}

#[tokio::test]
async fn wrong_values_fail_against_the_schema() {
    let env = TestEnv::get();
    let chart = repo_path("charts/toolyard");
    let values = repo_path(CI_VALUES);
    for (set, error) in [
        ("controller.replicas=two", "/controller/replicas"),
        ("gateway.replica=3", "'replica' not allowed"),
        ("gateway.service.type=Internal", "/gateway/service/type"),
        ("gateway.image.pullPolicy=Sometimes", "/gateway/image/pullPolicy"),
        ("gateway.storage.s3.endpoint=s3.example.com", "/gateway/storage/s3/endpoint"),
        ("watchNamespaces={Team_A}", "/watchNamespaces/0"),
        ("controller.leaderElection.enabled=false", "/controller/leaderElection/enabled"),
        ("controller.runDefaults.tool.memoryLimit=lots", "/controller/runDefaults/tool/memoryLimit"),
        ("gateway.limits.maxCalls=0", "/gateway/limits/maxCalls"),
    ] {
        let out = helm(
            env,
            &[
                "template",
                "ty",
                chart.to_str().unwrap(),
                "--kube-version",
                "1.34.4",
                "-f",
                values.to_str().unwrap(),
                "--set",
                set,
            ],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(error), "{set}: expected {error:?} in {err}");
    }
    // One replica without leader election is fine.
    let out = helm(
        env,
        &[
            "template",
            "ty",
            chart.to_str().unwrap(),
            "--kube-version",
            "1.34.4",
            "-f",
            values.to_str().unwrap(),
            "--set",
            "controller.replicas=1,controller.leaderElection.enabled=false",
        ],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

fn coding_task(name: &str, user: &str) -> CodingTask {
    serde_json::from_value(json!({
        "apiVersion": "toolyard.dev/v1alpha1", "kind": "CodingTask",
        "metadata": {"name": name},
        "spec": {"prompt": "What is the delta of an at-the-money call?",
                 "owner": {"issuer": "kubernetes", "user": user}}
    }))
    .expect("a valid CodingTask")
}

async fn label_namespace(admin: &kube::Client, ns: &str, labels: Value) {
    Api::<Namespace>::all(admin.clone())
        .patch(ns, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": labels}})))
        .await
        .expect("label namespace");
}

#[tokio::test]
async fn helm_install_gives_a_working_release_on_the_real_apiserver() {
    let env = TestEnv::get();
    env.install_crds().await.unwrap();
    let admin = env.client(User::Admin).await;
    let release_ns = env.namespace("chart-install").await.unwrap();
    let served = env.namespace("chart-install-served").await.unwrap();
    // A namespace this release does not watch (another team's, say).
    let elsewhere = env.namespace("chart-install-elsewhere").await.unwrap();
    // Restricted Pod Security enforced where the chart's pods run. The admission policies
    // apply to the watched namespace alone (no `admission.namespaceSelector` is set), so
    // concurrent tests, and other releases, are not affected.
    let restricted =
        json!({"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/warn": "restricted"});
    label_namespace(&admin, &release_ns, restricted.clone()).await;
    label_namespace(&admin, &served, restricted).await;

    let release = format!("inst-{}", random_suffix(5));
    let chart = repo_path("charts/toolyard");
    let values = repo_path(CI_VALUES);
    let kubeconfig = env.kubeconfig(User::Admin);
    let watch = format!("watchNamespaces={{{served}}}");
    let out = helm(
        env,
        &[
            "install",
            &release,
            chart.to_str().unwrap(),
            "-n",
            &release_ns,
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "-f",
            values.to_str().unwrap(),
            "--set",
            &watch,
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "helm install failed: {stderr}");
    assert!(stdout.contains("STATUS: deployed") && stdout.contains("Create your first McpTool"), "{stdout}");
    assert!(!stderr.contains("PodSecurity"), "pod templates break the restricted standard: {stderr}");

    // Every pod the chart runs passes the restricted Pod Security Standard where it is enforced.
    let deployments =
        env.kubectl_as(User::Admin, &["-n", &release_ns, "get", "deployments", "-o", "json"]).expect("get deployments");
    let deployments: Value = serde_json::from_str(&deployments).expect("json");
    let items = deployments["items"].as_array().expect("items");
    assert_eq!(items.len(), 2, "gateway and controller");
    for deployment in items {
        let name = deployment["metadata"]["name"].as_str().expect("name");
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("{name}-psa"), "namespace": release_ns},
            "spec": deployment["spec"]["template"]["spec"]});
        let file = std::env::temp_dir().join(format!("{release}-{name}-pod.json"));
        std::fs::write(&file, pod.to_string()).unwrap();
        let created = env.kubectl_as(User::Admin, &["create", "--dry-run=server", "-f", file.to_str().unwrap()]);
        let _ = std::fs::remove_file(&file);
        created.unwrap_or_else(|e| panic!("{name}'s pod is refused in a restricted namespace: {e:#}"));
    }

    // The chart's task-runner role lets alice start tasks in the served namespace…
    env.kubectl_as(
        User::Admin,
        &[
            "-n",
            &served,
            "create",
            "rolebinding",
            "alice-tasks",
            &format!("--clusterrole={release}-toolyard-task-runner"),
            "--user=alice",
        ],
    )
    .expect("bind task-runner");
    let alice: Api<CodingTask> = Api::namespaced(env.client(User::Alice).await, &served);
    let as_admin: Api<CodingTask> = Api::namespaced(admin.clone(), &served);
    // …only as herself, once the policy is loaded (probe until alice's forged task is refused).
    wait_until(Duration::from_secs(30), "the installed policy to be enforced", || async {
        let name = format!("probe-{}", random_suffix(5));
        match alice.create(&PostParams::default(), &coding_task(&name, "bob")).await {
            Ok(_) => {
                as_admin.delete(&name, &DeleteParams::default()).await?;
                Ok(false)
            }
            Err(kube::Error::Api(e)) if e.code == 403 && e.message.contains("spec.owner must name the requester") => {
                Ok(true)
            }
            Err(kube::Error::Api(e)) if e.code == 403 => Ok(false),
            Err(e) => Err(e.into()),
        }
    })
    .await
    .unwrap();
    alice.create(&PostParams::default(), &coding_task("own", "alice")).await.expect("alice's own task");
    // The policy is this release's, for the namespace it watches: in another namespace (where
    // another release's policy would decide) it refuses nothing.
    env.kubectl_as(
        User::Admin,
        &[
            "-n",
            &elsewhere,
            "create",
            "rolebinding",
            "alice-tasks",
            &format!("--clusterrole={release}-toolyard-task-runner"),
            "--user=alice",
        ],
    )
    .expect("bind task-runner elsewhere");
    let alice_elsewhere: Api<CodingTask> = Api::namespaced(env.client(User::Alice).await, &elsewhere);
    alice_elsewhere
        .create(&PostParams::default(), &coding_task("for-bob", "bob"))
        .await
        .expect("a namespace the release does not watch is not its policy's business");

    // The installed gateway ServiceAccount may create runs for anyone.
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), &release_ns);
    let request = TokenRequest {
        spec: TokenRequestSpec { audiences: vec![], expiration_seconds: Some(3600), ..Default::default() },
        ..Default::default()
    };
    let token: TokenRequest = sas
        .create_subresource("token", &format!("{release}-toolyard-gateway"), &PostParams::default(), &request)
        .await
        .expect("TokenRequest");
    let token = token.status.expect("status").token;
    let mut config = env.config(User::Admin).await.unwrap();
    config.auth_info = kube::config::AuthInfo { token: Some(token.into()), ..Default::default() };
    let gateway_client = kube::Client::try_from(config).unwrap();
    let gateway: Api<CodingTask> = Api::namespaced(gateway_client.clone(), &served);
    gateway.create(&PostParams::default(), &coding_task("for-bob", "bob")).await.expect("the gateway creates for bob");

    // It writes its own load Leases in the release namespace, and no other Lease (the
    // controller's leader election is not its business): the RBAC allows any name, the
    // admission policy only `toolyard-gateway-load-*`.
    let leases: Api<Lease> = Api::namespaced(gateway_client, &release_ns);
    let lease = |name: &str| Lease {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        spec: Some(LeaseSpec { holder_identity: Some("gateway".into()), ..Default::default() }),
    };
    let controller_lease = format!("{release}-toolyard-controller");
    wait_until(Duration::from_secs(30), "the gateway Lease policy to be enforced", || async {
        let mut probe = serde_json::to_value(lease(&controller_lease)).unwrap();
        probe["apiVersion"] = "coordination.k8s.io/v1".into();
        probe["kind"] = "Lease".into();
        match leases.patch(&controller_lease, &PatchParams::apply("probe").force(), &Patch::Apply(&probe)).await {
            Ok(_) => {
                Api::<Lease>::namespaced(admin.clone(), &release_ns)
                    .delete(&controller_lease, &DeleteParams::default())
                    .await?;
                Ok(false)
            }
            Err(kube::Error::Api(e)) if e.code == 403 => {
                assert!(e.message.contains("writes only its load Leases"), "{}", e.message);
                Ok(true)
            }
            Err(e) => Err(e.into()),
        }
    })
    .await
    .unwrap();
    let own = format!("{}test", toolyard_gateway::executor::load::LEASE_PREFIX);
    leases.create(&PostParams::default(), &lease(&own)).await.expect("the gateway creates its load Lease");
    leases.delete(&own, &DeleteParams::default()).await.expect("and deletes it");

    // The gateway's RBAC, as installed: what it needs and nothing else (no Jobs, no pods, no
    // Secrets but the API key Secret (and, when listed, upstream credentials), no writes to
    // McpTools or McpServers but their status, deletes of runs only).
    let gateway_user = format!("system:serviceaccount:{release_ns}:{release}-toolyard-gateway");
    let (tc, ct, mt) = ("toolcalls", "codingtasks", "mcptools");
    for (ns, verb, group, resource, name, expected) in [
        (&served, "list", "toolyard.dev", mt, "", true),
        (&served, "watch", "toolyard.dev", mt, "", true),
        (&served, "create", "toolyard.dev", tc, "", true),
        (&served, "get", "toolyard.dev", ct, "", true),
        (&served, "watch", "toolyard.dev", ct, "", true),
        (&served, "patch", "toolyard.dev", "codingtasks/status", "", true),
        (&served, "watch", "toolyard.dev", "mcpservers", "", true),
        (&served, "patch", "toolyard.dev", "mcpservers/status", "", true),
        (&served, "patch", "toolyard.dev", "mcpservers", "", false),
        (&served, "watch", "toolyard.dev", "mcpprompts", "", true),
        (&served, "patch", "toolyard.dev", "mcpprompts", "", false),
        (&release_ns, "get", "", "secrets", "toolyard-api-keys", true),
        (&String::new(), "create", "authentication.k8s.io", "tokenreviews", "", true),
        (&String::new(), "create", "authorization.k8s.io", "subjectaccessreviews", "", true),
        (&served, "create", "toolyard.dev", mt, "", false),
        (&served, "patch", "toolyard.dev", mt, "", false),
        (&served, "delete", "toolyard.dev", tc, "", true),
        (&served, "delete", "toolyard.dev", ct, "", true),
        (&served, "create", "batch", "jobs", "", false),
        (&served, "list", "", "pods", "", false),
        (&served, "get", "", "secrets", "", false),
        (&release_ns, "get", "", "secrets", &format!("{release}-toolyard-token-key"), false),
        (&release_ns, "list", "", "secrets", "", false),
        (&release_ns, "create", "coordination.k8s.io", "leases", "", true),
        (&served, "create", "coordination.k8s.io", "leases", "", false),
        (&served, "watch", "discovery.k8s.io", "endpointslices", "", true),
        (&served, "create", "discovery.k8s.io", "endpointslices", "", false),
        (&served, "create", "rbac.authorization.k8s.io", "rolebindings", "", false),
    ] {
        let (resource, subresource) = resource.split_once('/').map_or((resource, None), |(r, s)| (r, Some(s)));
        let attrs = ResourceAttributes {
            namespace: (!ns.is_empty()).then(|| ns.clone()),
            verb: Some(verb.into()),
            group: Some(group.into()),
            resource: Some(resource.into()),
            subresource: subresource.map(Into::into),
            name: (!name.is_empty()).then(|| name.to_owned()),
            ..Default::default()
        };
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(gateway_user.clone()),
                groups: Some(vec!["system:serviceaccounts".into(), format!("system:serviceaccounts:{release_ns}")]),
                resource_attributes: Some(attrs),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = Api::<SubjectAccessReview>::all(admin.clone())
            .create(&PostParams::default(), &review)
            .await
            .expect("SubjectAccessReview");
        let allowed = answer.status.is_some_and(|s| s.allowed);
        assert_eq!(allowed, expected, "gateway {verb} {group}/{resource} {name} in {ns:?}");
    }

    // It reads the cluster's ServiceAccount keys, to check a JWT's signature before a review.
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(gateway_user.clone()),
            non_resource_attributes: Some(NonResourceAttributes {
                path: Some("/openid/v1/jwks".into()),
                verb: Some("get".into()),
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer =
        Api::<SubjectAccessReview>::all(admin.clone()).create(&PostParams::default(), &review).await.expect("SAR");
    assert!(answer.status.is_some_and(|s| s.allowed), "the gateway may get /openid/v1/jwks (without its groups)");

    let out = helm(env, &["uninstall", &release, "-n", &release_ns, "--kubeconfig", kubeconfig.to_str().unwrap()]);
    assert!(out.status.success(), "helm uninstall failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// The README's "Try it on kind" steps name objects and values; they must be what the chart
/// renders with `examples/kind/values.yaml` (release `toolyard` in namespace `toolyard`), what
/// the dev S3 manifest creates and what the Dockerfile builds.
#[tokio::test]
async fn the_kind_walkthrough_matches_the_chart() {
    let env = TestEnv::get();
    env.install_crds().await.unwrap();
    let readme = std::fs::read_to_string(repo_path("README.md")).expect("README");
    let section = readme
        .split("### Try it on a local cluster")
        .nth(1)
        .expect("a local cluster section")
        .split("\n## ")
        .next()
        .unwrap();
    let script = std::fs::read_to_string(repo_path("scripts/kind.sh")).expect("scripts/kind.sh")
        + &std::fs::read_to_string(repo_path("scripts/install-example.sh")).expect("scripts/install-example.sh");
    let dockerfile = std::fs::read_to_string(repo_path("Dockerfile")).expect("Dockerfile");
    let s3 = documents(&std::fs::read_to_string(repo_path("examples/kind/s3.yaml")).expect("s3.yaml"));

    // The images: built by the Dockerfile, loaded by the README and the script, used by the chart.
    let chart_yaml = std::fs::read_to_string(repo_path("charts/toolyard/Chart.yaml")).expect("Chart.yaml");
    assert!(chart_yaml.contains("appVersion: \"0.1.0\""), "the README's tags are the appVersion");
    for target in ["gateway", "controller", "runner", "agent", "pricing", "dev-s3"] {
        assert!(dockerfile.contains(&format!(" AS {target}\n")), "Dockerfile target {target}");
        assert!(section.contains(&format!(" {target}")) && script.contains(&format!(" {target}")), "{target}");
    }
    assert!(section.contains("ghcr.io/toolyard/$t:0.1.0"), "image names in the README");

    let release_ns = env.namespace("chart-kind").await.unwrap();
    let chart = repo_path("charts/toolyard");
    let values = repo_path("examples/kind/values.yaml");
    let out = helm(
        env,
        &[
            "template",
            "toolyard",
            chart.to_str().unwrap(),
            "-n",
            &release_ns,
            "--kube-version",
            "1.34.4",
            "-f",
            values.to_str().unwrap(),
            "--set",
            "admission.namespaceSelector.matchLabels.none=none",
        ],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let manifest = String::from_utf8(out.stdout).unwrap();
    let docs = documents(&manifest);
    // Names the walkthrough uses.
    let service = find(&docs, "Service", "toolyard-gateway");
    assert!(section.contains("service/toolyard-gateway 8443:443") && service["spec"]["ports"][0]["port"] == 443);
    find(&docs, "Secret", "toolyard-gateway-tls");
    assert!(section.contains("secret toolyard-gateway-tls"));
    find(&docs, "ClusterRole", "toolyard-tool-caller");
    assert!(
        section.contains("--clusterrole=toolyard-tool-caller") && script.contains("--clusterrole=toolyard-tool-caller")
    );
    find(&docs, "Role", "toolyard-gateway");
    assert_eq!(find(&docs, "Role", "toolyard-controller")["metadata"]["namespace"], "team-a", "team-a is served");
    let gateway = find(&docs, "Deployment", "toolyard-gateway");
    let env_of = |name: &str| -> String {
        gateway["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .and_then(|v| v["value"].as_str())
            .unwrap_or_else(|| panic!("{name}"))
            .to_owned()
    };
    assert!(env_of("TOOLYARD_ALLOWED_HOSTS").split(',').any(|h| h == "localhost"), "https://localhost:8443 is allowed");
    assert_eq!(env_of("TOOLYARD_TOKENREVIEW_AUDIENCE"), "toolyard", "`create token --audience toolyard`");
    // Numbers reach the binaries as integers (Helm reads them as floats: 4194304 printed as
    // 4.194304e+06 once, and the gateway refused to start).
    assert_eq!(env_of("TOOLYARD_MAX_BODY_BYTES"), "4194304");
    // The S3 settings point at the dev server's Service and Secret.
    let s3_service = s3.iter().find(|d| d["kind"] == "Service").expect("S3 Service");
    let s3_secret = s3.iter().find(|d| d["kind"] == "Secret").expect("S3 Secret");
    let endpoint = format!(
        "http://{}.{}.svc:{}",
        s3_service["metadata"]["name"].as_str().unwrap(),
        s3_service["metadata"]["namespace"].as_str().unwrap(),
        s3_service["spec"]["ports"][0]["port"]
    );
    assert_eq!(env_of("TOOLYARD_S3_ENDPOINT"), endpoint);
    assert_eq!(env_of("TOOLYARD_S3_BUCKET"), "toolyard", "the bucket baked into the dev-s3 image");
    assert!(dockerfile.contains("mkdir -p /out/data/toolyard"));
    let secret_ref = gateway["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "TOOLYARD_S3_ACCESS_KEY_ID")
        .expect("S3 credentials")["valueFrom"]["secretKeyRef"]
        .clone();
    assert_eq!(secret_ref["name"], s3_secret["metadata"]["name"]);
    assert!(s3_secret["stringData"].get(secret_ref["key"].as_str().unwrap()).is_some());
    // The tool's image the walkthrough loads is the one the pricing manifests name.
    let tools = std::fs::read_to_string(repo_path("examples/pricing/tools.yaml")).expect("tools.yaml");
    assert!(tools.contains("ghcr.io/toolyard/pricing:0.1.0"));

    // And the apiserver accepts the kind release and the dev S3 manifest.
    let served = env.namespace("chart-kind-team").await.unwrap();
    dry_run(env, &release_ns, &manifest.replace("namespace: team-a", &format!("namespace: {served}")));
    let s3_manifest = std::fs::read_to_string(repo_path("examples/kind/s3.yaml"))
        .unwrap()
        .replace("namespace: toolyard", &format!("namespace: {release_ns}"));
    dry_run(env, &release_ns, &s3_manifest);
}

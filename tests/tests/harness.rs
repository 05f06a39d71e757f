//! Proof that the test control plane is real: CRDs install into a real kube-apiserver and
//! its validation runs, authentication and RBAC are real, the real Job controller creates
//! pods, and the S3 server checks SigV4 signatures.

use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, PodTemplateSpec};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, ObjectMeta, PostParams};
use kube::discovery;
use toolyard_tests::{TestEnv, User, fixtures, s3, wait_until};

async fn dynamic_api(client: &kube::Client, ns: &str, obj: &DynamicObject) -> Api<DynamicObject> {
    let types = obj.types.as_ref().expect("fixture has apiVersion and kind");
    let gvk = GroupVersionKind::try_from(types).expect("gvk");
    let (resource, _) = discovery::pinned_kind(client, &gvk).await.expect("kind is served");
    Api::namespaced_with(client.clone(), ns, &ApiResource::from_gvk_with_plural(&gvk, &resource.plural))
}

#[tokio::test]
async fn crds_install_and_kubectl_shows_printer_columns() {
    let env = TestEnv::get();
    env.install_crds().await.unwrap();
    let ns = env.namespace("crds").await.unwrap();
    env.kubectl_as(
        User::Admin,
        &[
            "-n",
            &ns,
            "apply",
            "-f",
            toolyard_tests::repo_path("crds/tests/fixtures/valid/mcptool-pool.yaml").to_str().unwrap(),
        ],
    )
    .unwrap();
    let out = env.kubectl_as(User::Admin, &["-n", &ns, "get", "mcptools"]).unwrap();
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "TOOL", "MODE", "TOOLSET", "READY", "REASON", "AGE"], "{out}");
    assert!(
        out.contains("get-quote") && out.contains("get_quote") && out.contains("Pool") && out.contains("pricing"),
        "{out}"
    );
    let wide = env.kubectl_as(User::Admin, &["-n", &ns, "get", "mcpt", "-o", "wide"]).unwrap();
    assert!(wide.lines().next().unwrap().contains("IMAGE"), "{wide}");
    // The category lists every kind.
    let all = env.kubectl_as(User::Admin, &["-n", &ns, "get", "toolyard"]).unwrap();
    assert!(all.contains("mcptool.toolyard.dev/get-quote"), "{all}");
}

#[tokio::test]
async fn valid_fixtures_are_accepted_by_the_apiserver() {
    let env = TestEnv::get();
    env.install_crds().await.unwrap();
    let ns = env.namespace("valid").await.unwrap();
    let client = env.client(User::Admin).await;
    let all = fixtures::load("valid").unwrap();
    assert!(all.len() >= 5);
    for fixture in all {
        for obj in &fixture.objects {
            let api = dynamic_api(&client, &ns, obj).await;
            api.create(&PostParams::default(), obj)
                .await
                .unwrap_or_else(|e| panic!("{} was rejected: {e}", fixture.path.display()));
        }
    }
}

#[tokio::test]
async fn invalid_fixtures_are_rejected_with_the_message_they_name() {
    let env = TestEnv::get();
    env.install_crds().await.unwrap();
    let client = env.client(User::Admin).await;
    let all = fixtures::load("invalid").unwrap();
    assert!(all.len() >= 20);
    let mut failures = Vec::new();
    for fixture in all {
        let ns = env.namespace("invalid").await.unwrap();
        let expect = fixture.expect.clone().expect("invalid fixture names its error");
        let (last, setup) = fixture.objects.split_last().expect("at least one object");
        for obj in setup {
            let api = dynamic_api(&client, &ns, obj).await;
            api.create(&PostParams::default(), obj)
                .await
                .unwrap_or_else(|e| panic!("{}: setup object rejected: {e}", fixture.path.display()));
        }
        let api = dynamic_api(&client, &ns, last).await;
        let result = if setup.is_empty() {
            api.create(&PostParams::default(), last).await
        } else {
            let mut update = last.clone();
            let current = api.get(last.metadata.name.as_deref().unwrap()).await.unwrap();
            update.metadata.resource_version = current.metadata.resource_version;
            api.replace(last.metadata.name.as_deref().unwrap(), &PostParams::default(), &update).await
        };
        match result {
            Ok(_) => {
                failures.push(format!("{}: accepted, expected an error containing {expect:?}", fixture.path.display()))
            }
            Err(kube::Error::Api(status)) if status.message.contains(&expect) => {}
            Err(e) => failures.push(format!("{}: expected {expect:?}, got: {e}", fixture.path.display())),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test]
async fn token_review_returns_alice_and_her_groups() {
    let env = TestEnv::get();
    let client = env.client(User::Admin).await;
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: Some(env.token(User::Alice).to_owned()),
            audiences: Some(vec!["toolyard".into()]),
        },
        ..Default::default()
    };
    let out = Api::<TokenReview>::all(client.clone()).create(&PostParams::default(), &review).await.unwrap();
    let status = out.status.expect("status");
    assert_eq!(status.authenticated, Some(true), "{status:?}");
    let user = status.user.expect("user");
    assert_eq!(user.username.as_deref(), Some("alice"));
    let groups = user.groups.unwrap_or_default();
    for g in ["quants", "viewers", "system:authenticated"] {
        assert!(groups.iter().any(|x| x == g), "{g} missing from {groups:?}");
    }

    let bogus = TokenReview {
        spec: TokenReviewSpec { token: Some("not-a-token".into()), audiences: Some(vec!["toolyard".into()]) },
        ..Default::default()
    };
    let out = Api::<TokenReview>::all(client).create(&PostParams::default(), &bogus).await.unwrap();
    assert_ne!(out.status.and_then(|s| s.authenticated), Some(true));
}

fn call_review(ns: &str, user: &str, groups: &[&str], tool: &str) -> SubjectAccessReview {
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.into()),
            groups: Some(groups.iter().map(|g| g.to_string()).collect()),
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(ns.into()),
                verb: Some("call".into()),
                group: Some("toolyard.dev".into()),
                resource: Some("mcptools".into()),
                name: Some(tool.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    }
}

#[tokio::test]
async fn subject_access_review_is_denied_until_a_role_binding_grants_call() {
    let env = TestEnv::get();
    let ns = env.namespace("rbac").await.unwrap();
    let client = env.client(User::Admin).await;
    let sar: Api<SubjectAccessReview> = Api::all(client.clone());
    let allowed = |review: SubjectAccessReview| {
        let sar = sar.clone();
        async move {
            Ok::<bool, anyhow::Error>(
                sar.create(&PostParams::default(), &review).await?.status.map(|s| s.allowed).unwrap_or(false),
            )
        }
    };
    let alice = || call_review(&ns, "alice", &["quants", "viewers", "system:authenticated"], "price-option");
    assert!(!allowed(alice()).await.unwrap(), "denied by default");

    let role = Role {
        metadata: ObjectMeta { name: Some("call-price-option".into()), ..Default::default() },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["toolyard.dev".into()]),
            resources: Some(vec!["mcptools".into()]),
            resource_names: Some(vec!["price-option".into()]),
            verbs: vec!["call".into()],
            ..Default::default()
        }]),
    };
    Api::<Role>::namespaced(client.clone(), &ns).create(&PostParams::default(), &role).await.unwrap();
    let binding = RoleBinding {
        metadata: ObjectMeta { name: Some("alice-calls".into()), ..Default::default() },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: "call-price-option".into(),
        },
        subjects: Some(vec![Subject {
            kind: "User".into(),
            name: "alice".into(),
            api_group: Some("rbac.authorization.k8s.io".into()),
            ..Default::default()
        }]),
    };
    Api::<RoleBinding>::namespaced(client.clone(), &ns).create(&PostParams::default(), &binding).await.unwrap();

    wait_until(Duration::from_secs(10), "alice to be allowed", || allowed(alice())).await.unwrap();
    // The grant names one tool, one user: other tools and bob stay denied.
    assert!(!allowed(call_review(&ns, "alice", &["quants"], "calc-greeks")).await.unwrap());
    assert!(!allowed(call_review(&ns, "bob", &["ops"], "price-option")).await.unwrap());
}

#[tokio::test]
async fn a_job_gets_a_pod_from_the_real_job_controller() {
    let env = TestEnv::get();
    let ns = env.namespace("jobs").await.unwrap();
    let client = env.client(User::Admin).await;
    let job = Job {
        metadata: ObjectMeta { name: Some("hello".into()), ..Default::default() },
        spec: Some(JobSpec {
            backoff_limit: Some(0),
            template: PodTemplateSpec {
                spec: Some(PodSpec {
                    restart_policy: Some("Never".into()),
                    containers: vec![Container {
                        name: "main".into(),
                        image: Some("busybox:1.36".into()),
                        command: Some(vec!["true".into()]),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        }),
        ..Default::default()
    };
    Api::<Job>::namespaced(client.clone(), &ns).create(&PostParams::default(), &job).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client, &ns);
    wait_until(Duration::from_secs(60), "a pod of job hello", || async {
        Ok(!pods.list(&ListParams::default().labels("job-name=hello")).await?.items.is_empty())
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn s3_server_checks_signatures() {
    let env = TestEnv::get();
    let settings = env.s3();
    let good = s3::client(&settings, &settings.access_key, &settings.secret_key);
    let key = format!("harness/{}.txt", toolyard_tests::random_suffix(8));
    good.put_object().bucket(&settings.bucket).key(&key).body(b"hello s3".to_vec().into()).send().await.unwrap();
    let got = good.get_object().bucket(&settings.bucket).key(&key).send().await.unwrap();
    assert_eq!(got.body.collect().await.unwrap().into_bytes().as_ref(), b"hello s3");

    let wrong_secret = s3::client(&settings, &settings.access_key, "wrong-secret-key-wrong-secret-key");
    let err = wrong_secret.get_object().bucket(&settings.bucket).key(&key).send().await.unwrap_err();
    assert!(format!("{err:?}").contains("SignatureDoesNotMatch"), "{err:?}");
    let wrong_key = s3::client(&settings, "nobody", &settings.secret_key);
    assert!(wrong_key.put_object().bucket(&settings.bucket).key("x").body(b"x".to_vec().into()).send().await.is_err());
}

#[tokio::test]
async fn every_example_manifest_is_accepted_by_the_apiserver() {
    let env = TestEnv::get();
    env.install_crds().await.unwrap();
    let ns = env.namespace("examples").await.unwrap();
    let client = env.client(User::Admin).await;
    let files = [
        toolyard_tests::repo_path("examples/pricing/tools.yaml"),
        toolyard_tests::repo_path("tests/fixtures/misbehaving/tools.yaml"),
        toolyard_tests::repo_path("tests/fixtures/misbehaving/local.yaml"),
    ];
    let mut names = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let objects: Vec<DynamicObject> = serde_saphyr::from_multiple(&text).unwrap();
        assert!(!objects.is_empty(), "{}", file.display());
        for obj in objects {
            // The typed form must parse too: manifests and Rust types agree.
            let typed: toolyard_api::McpTool = serde_json::from_value(serde_json::to_value(&obj).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            names.push(typed.spec.name.clone());
            dynamic_api(&client, &ns, &obj)
                .await
                .create(&PostParams::default(), &obj)
                .await
                .unwrap_or_else(|e| panic!("{}: {} rejected: {e}", file.display(), typed.spec.name));
        }
    }
    for expected in ["price_option", "calc_greeks", "get_quote", "get_quote_fresh", "fail", "hang", "echo_pool"] {
        assert!(names.iter().any(|n| n == expected), "{expected} missing from {names:?}");
    }
}

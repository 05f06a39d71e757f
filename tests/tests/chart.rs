//! The Helm chart renders, and the real apiserver accepts every object it renders (server-side
//! dry run: schema validation, RBAC escalation checks, admission).

use toolyard_tests::{TestEnv, User, repo_path};

fn helm_template(env: &TestEnv, namespace: &str, extra: &[&str]) -> String {
    let out = std::process::Command::new(env.bin_dir().join("helm"))
        .args(["template", "ty", repo_path("charts/toolyard").to_str().expect("utf-8 path"), "-n", namespace])
        .args([
            "--kube-version",
            "1.34.4",
            "-f",
            repo_path("charts/toolyard/ci/test-values.yaml").to_str().expect("utf-8"),
        ])
        .args(extra)
        .output()
        .expect("helm runs");
    assert!(out.status.success(), "helm template failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8 manifest")
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
        &["--set", &watch, "--set", "admission.namespaceSelector.matchLabels.none=none"],
    );
    for kind in ["kind: Deployment", "kind: NetworkPolicy", "kind: ValidatingAdmissionPolicy", "kind: Role"] {
        assert!(manifest.contains(kind), "{kind} missing from the rendered chart");
    }
    let file = std::env::temp_dir().join(format!("{release_ns}.yaml"));
    std::fs::write(&file, &manifest).unwrap();
    let out = env
        .kubectl_as(User::Admin, &["apply", "--dry-run=server", "-f", file.to_str().unwrap()])
        .unwrap_or_else(|e| panic!("the apiserver refused the chart: {e:#}"));
    assert!(
        out.contains("deployment.apps/ty-toolyard-gateway") && out.contains("deployment.apps/ty-toolyard-controller"),
        "{out}"
    );
    let _ = std::fs::remove_file(file);
}

#[tokio::test]
async fn the_gateway_needs_allowed_hosts_and_a_bucket() {
    let env = TestEnv::get();
    let out = std::process::Command::new(env.bin_dir().join("helm"))
        .args(["template", "ty", repo_path("charts/toolyard").to_str().unwrap(), "--kube-version", "1.34.4"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("set gateway.allowedHosts") || err.contains("set gateway.storage.s3.bucket"), "{err}");
}

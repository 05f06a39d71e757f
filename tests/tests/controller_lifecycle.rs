//! Controller lifecycle: a killed controller picks up where it left off; with leader election
//! only the Lease holder reconciles and writes; the ops endpoints answer.

use crate::controller_support;

use controller_support::*;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use toolyard_api::ToolCall;
use toolyard_tests::User;

async fn finish_call(client: &kube::Client, ns: &str, name: &str) {
    let pod = pod_of(client, ns, "toolyard.dev/call", name).await;
    set_pod_status(client, ns, pod.metadata.name.as_deref().expect("pod name"), finished("tool", TOOL_IMAGE, 0, ""))
        .await;
}

/// `reportingInstance` of every Event about `name`.
async fn reporters(client: &kube::Client, ns: &str, name: &str) -> Vec<String> {
    let events = Api::<Event>::namespaced(client.clone(), ns).list(&ListParams::default()).await.expect("test step");
    events
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .filter_map(|e| e.reporting_instance)
        .collect()
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn killed_controller_restarts_and_the_call_still_finishes() {
    let (ns, client) = namespace("ctl-kill").await;
    let key = KeyFile::new();
    let first = Replica::start(config(&ns, &key, &[]), User::Admin).await;
    create(&client, &ns, &job_tool("price-option")).await;
    create(&client, &ns, &call("call-survives", "price-option", 120)).await;
    let calls: Api<ToolCall> = Api::namespaced(client.clone(), &ns);
    let pod = pod_of(&client, &ns, "toolyard.dev/call", "call-survives").await;
    set_pod_status(&client, &ns, pod.metadata.name.as_deref().unwrap(), running("tool", TOOL_IMAGE)).await;
    wait_call(&calls, "call-survives", "Unknown", "Running").await;
    let job_uid = Api::<Job>::namespaced(client.clone(), &ns).get("call-survives").await.unwrap().metadata.uid;

    first.kill();
    // The tool finishes while no controller runs.
    finish_call(&client, &ns, "call-survives").await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    wait_for(&jobs, "call-survives", "Job Complete", |j| {
        j.status.as_ref().and_then(|s| s.succeeded).unwrap_or_default() == 1
    })
    .await;
    assert_eq!(call_state(&calls.get("call-survives").await.unwrap()), Some(("Unknown".into(), "Running".into())));

    let second = Replica::start(config(&ns, &key, &[]), User::Admin).await;
    let done = wait_call(&calls, "call-survives", "True", "Succeeded").await;
    assert!(done.status.unwrap().start_time.is_some(), "startTime from before the restart is kept");
    let job = jobs.get("call-survives").await.unwrap();
    assert_eq!(job.metadata.uid, job_uid, "the restarted controller adopted the Job instead of making another");
    second.stop().await;
}

#[tokio::test]
async fn a_controller_stopped_before_its_caches_list_stops_at_once() {
    // bob may list nothing in the namespace: the controller's watches never list.
    let (ns, _client) = namespace("ctl-unlisted").await;
    let key = KeyFile::new();
    let replica = Replica::start(config(&ns, &key, &[]), User::Bob).await;
    let (ready, _) = replica.scrape("/readyz").await;
    assert_eq!(ready, 503, "not ready before its caches have listed");
    // Waits at most WAIT; kube-runtime would hold each controller until its cache listed.
    replica.stop().await;
}

#[tokio::test]
async fn with_two_replicas_only_the_leader_reconciles_and_writes() {
    let (ns, client) = namespace("ctl-leader").await;
    let key = KeyFile::new();
    let lease_flags = |identity: &'static str| {
        vec![
            "--leader-elect",
            "true",
            "--lease-namespace",
            ns.as_str(),
            "--lease-name",
            "toolyard-controller",
            "--lease-duration-seconds",
            "4",
            "--lease-grace-seconds",
            "1",
            "--identity",
            identity,
        ]
    };
    let a = Replica::start(config(&ns, &key, &lease_flags("replica-a")), User::Admin).await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    wait_for(&leases, "toolyard-controller", "replica-a to hold the Lease", |l| {
        l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some("replica-a")
    })
    .await;
    let b = Replica::start(config(&ns, &key, &lease_flags("replica-b")), User::Admin).await;

    create(&client, &ns, &job_tool("price-option")).await;
    create(&client, &ns, &call("call-one", "price-option", 120)).await;
    let calls: Api<ToolCall> = Api::namespaced(client.clone(), &ns);
    finish_call(&client, &ns, "call-one").await;
    wait_call(&calls, "call-one", "True", "Succeeded").await;

    let (_, metrics_a) = a.scrape("/metrics").await;
    let (_, metrics_b) = b.scrape("/metrics").await;
    assert_eq!(metric(&metrics_a, "toolyard_controller_leader"), 1.0);
    assert_eq!(metric(&metrics_b, "toolyard_controller_leader"), 0.0);
    assert!(metric(&metrics_a, "toolyard_controller_status_writes_total") >= 2.0, "{metrics_a}");
    assert_eq!(metric(&metrics_b, "toolyard_controller_status_writes_total"), 0.0, "the standby wrote: {metrics_b}");
    assert_eq!(metric(&metrics_b, "toolyard_controller_reconciles_total"), 0.0, "the standby reconciled: {metrics_b}");
    let reporting = reporters(&client, &ns, "call-one").await;
    assert!(!reporting.is_empty());
    assert!(reporting.iter().all(|r| r == "replica-a"), "only the leader emits events: {reporting:?}");
    let (standby_ready, _) = b.scrape("/readyz").await;
    assert_eq!(standby_ready, 200, "a standby is ready to take over");

    // The leader dies without releasing the Lease: the standby takes over once it expires.
    a.kill();
    wait_for(&leases, "toolyard-controller", "replica-b to take the Lease", |l| {
        l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some("replica-b")
    })
    .await;
    create(&client, &ns, &call("call-two", "price-option", 120)).await;
    finish_call(&client, &ns, "call-two").await;
    wait_call(&calls, "call-two", "True", "Succeeded").await;
    let reporting = reporters(&client, &ns, "call-two").await;
    assert!(!reporting.is_empty() && reporting.iter().all(|r| r == "replica-b"), "{reporting:?}");
    let (_, metrics_b) = b.scrape("/metrics").await;
    assert_eq!(metric(&metrics_b, "toolyard_controller_leader"), 1.0);

    // A graceful stop releases the Lease for the next replica.
    let c = Replica::start(config(&ns, &key, &lease_flags("replica-c")), User::Admin).await;
    b.stop().await;
    wait_for(&leases, "toolyard-controller", "replica-c to take the released Lease", |l| {
        l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some("replica-c")
    })
    .await;
    c.stop().await;
}

#[tokio::test]
async fn ops_endpoints_report_health_readiness_and_metrics() {
    let (ns, client) = namespace("ctl-ops").await;
    let key = KeyFile::new();
    let controller = Replica::start(config(&ns, &key, &[]), User::Admin).await;
    assert_eq!(controller.scrape("/healthz").await.0, 200);
    toolyard_tests::wait_until(WAIT, "/readyz", || async { Ok(controller.scrape("/readyz").await.0 == 200) })
        .await
        .unwrap();
    create(&client, &ns, &call("call-x", "missing", 30)).await;
    let calls: Api<ToolCall> = Api::namespaced(client.clone(), &ns);
    wait_call(&calls, "call-x", "False", "Rejected").await;
    let (status, text) = controller.scrape("/metrics").await;
    assert_eq!(status, 200);
    for name in [
        "toolyard_controller_reconciles_total{kind=\"ToolCall\",result=\"ok\"}",
        "toolyard_controller_reconcile_duration_seconds_bucket",
        "toolyard_controller_runs_total{kind=\"ToolCall\",outcome=\"Rejected\"} 1",
        "toolyard_controller_leader 1",
    ] {
        assert!(text.contains(name), "{name} missing from:\n{text}");
    }
    controller.stop().await;
}

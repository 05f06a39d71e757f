//! Condition mapping: every Job and pod state a run can be in.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};
use toolyard_api::conditions::reason;

use super::*;

const NOW: &str = "2026-12-01T10:00:30Z";
const CREATED: &str = "2026-12-01T10:00:00Z";

fn now() -> Timestamp {
    NOW.parse().unwrap()
}

fn graces() -> Graces {
    Graces { image_pull: Duration::from_secs(5), unschedulable: Duration::from_secs(60) }
}

fn job(conditions: Value) -> Job {
    serde_json::from_value(json!({
        "metadata": {"name": "c1"},
        "spec": {"activeDeadlineSeconds": 30, "template": {}},
        "status": {"conditions": conditions},
    }))
    .unwrap()
}

fn pod(status: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "c1-abc", "creationTimestamp": CREATED},
        "status": status,
    }))
    .unwrap()
}

fn terminated(code: i32, message: &str) -> Value {
    json!({"phase": if code == 0 {"Succeeded"} else {"Failed"}, "containerStatuses": [{
        "name": "tool", "image": "img", "imageID": "", "ready": false, "restartCount": 0,
        "state": {"terminated": {"exitCode": code, "message": message,
            "startedAt": "2026-12-01T10:00:05Z", "finishedAt": "2026-12-01T10:00:09Z"}}}]})
}

fn waiting(container: &str, why: &str) -> Value {
    json!({"phase": "Pending", "containerStatuses": [{
        "name": container, "image": "registry.example/tool:1", "imageID": "", "ready": false, "restartCount": 0,
        "state": {"waiting": {"reason": why, "message": "pull failed"}}}]})
}

fn finished(o: Observed) -> Finish {
    match o {
        Observed::Finished(f) => f,
        other => panic!("expected finished, got {other:?}"),
    }
}

fn observe_one(job: &Job, pod: Option<&Pod>) -> Observed {
    observe(job, pod, "tool", "tool", now(), &graces())
}

#[test]
fn complete_job_is_succeeded_with_container_times() {
    let j = job(json!([{"type": "Complete", "status": "True", "lastTransitionTime": "2026-12-01T10:00:10Z"}]));
    let p = pod(terminated(0, ""));
    let f = finished(observe_one(&j, Some(&p)));
    assert_eq!(f.reason, reason::SUCCEEDED);
    assert!(f.succeeded());
    assert_eq!(f.started, Some("2026-12-01T10:00:05Z".parse().unwrap()));
    assert_eq!(f.finished, "2026-12-01T10:00:09Z".parse::<Timestamp>().unwrap());
    assert!(!f.stop_job);
}

#[test]
fn success_criteria_met_counts_as_success_before_complete() {
    let j = job(json!([{"type": "SuccessCriteriaMet", "status": "True"}]));
    assert!(finished(observe_one(&j, None)).succeeded());
}

#[test]
fn tool_failure_carries_exit_code_and_termination_message() {
    let j = job(json!([{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]));
    let p = pod(terminated(1, "ValueError: spot must be positive\n"));
    let f = finished(observe_one(&j, Some(&p)));
    assert_eq!(f.reason, reason::FAILED);
    assert_eq!(f.message, "the tool failed (exit code 1): ValueError: spot must be positive");
}

#[test]
fn runner_exit_codes_map_to_reasons() {
    let j = job(json!([{"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded"}]));
    let timed_out = finished(observe_one(&j, Some(&pod(terminated(3, "timed out after 30s")))));
    assert_eq!(timed_out.reason, reason::TIMED_OUT);
    assert!(timed_out.message.contains("exit code 3") && timed_out.message.contains("timed out after 30s"));
    let runner = finished(observe_one(&j, Some(&pod(terminated(4, "internal API unreachable")))));
    assert_eq!(runner.reason, reason::FAILED);
    assert_eq!(runner.message, "the runner failed (exit code 4): internal API unreachable");
    let mut oom = pod(terminated(137, ""));
    oom.status.as_mut().unwrap().container_statuses.as_mut().unwrap()[0]
        .state
        .as_mut()
        .unwrap()
        .terminated
        .as_mut()
        .unwrap()
        .reason = Some("OOMKilled".into());
    let oom = finished(observe_one(&j, Some(&oom)));
    assert_eq!(oom.reason, reason::FAILED);
    assert_eq!(oom.message, "the tool container exited with code 137, OOMKilled");
}

#[test]
fn deadline_exceeded_is_timed_out() {
    let j = job(json!([{"type": "Failed", "status": "True", "reason": "DeadlineExceeded",
        "lastTransitionTime": "2026-12-01T10:00:31Z"}]));
    let f = finished(observe_one(&j, None));
    assert_eq!(f.reason, reason::TIMED_OUT);
    assert!(f.message.contains("deadline"), "{}", f.message);
    assert_eq!(f.finished, "2026-12-01T10:00:31Z".parse::<Timestamp>().unwrap());
}

#[test]
fn failed_job_without_pod_details_says_why() {
    let j = job(json!([{"type": "Failed", "status": "True", "reason": "PodFailurePolicy", "message": "x"}]));
    let f = finished(observe_one(&j, None));
    assert_eq!(f.reason, reason::FAILED);
    assert_eq!(f.message, "the tool's Job failed (PodFailurePolicy): x");
}

#[test]
fn failed_runner_install_is_reported_as_such() {
    let j = job(json!([{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]));
    let p = pod(json!({"phase": "Failed", "initContainerStatuses": [{
        "name": "install-runner", "image": "runner", "imageID": "", "ready": false, "restartCount": 0,
        "state": {"terminated": {"exitCode": 127, "message": "exec: not found"}}}]}));
    let f = finished(observe_one(&j, Some(&p)));
    assert_eq!(f.message, "the runner could not be installed (init container exited with code 127): exec: not found");
}

#[test]
fn running_container_is_running_since_it_started() {
    let j = job(json!([]));
    let p = pod(json!({"phase": "Running", "containerStatuses": [{
        "name": "tool", "image": "img", "imageID": "", "ready": true, "restartCount": 0,
        "state": {"running": {"startedAt": "2026-12-01T10:00:02Z"}}}]}));
    assert_eq!(observe_one(&j, Some(&p)), Observed::Running { started: "2026-12-01T10:00:02Z".parse().unwrap() });
    let phase_only = pod(json!({"phase": "Running"}));
    assert_eq!(observe_one(&j, Some(&phase_only)), Observed::Running { started: now() });
}

#[test]
fn no_pod_or_pending_pod_is_pending() {
    let j = job(json!([]));
    assert!(matches!(observe_one(&j, None), Observed::Pending { recheck_after: None, .. }));
    let p = pod(json!({"phase": "Pending"}));
    assert!(matches!(observe_one(&j, Some(&p)), Observed::Pending { recheck_after: None, .. }));
}

#[test]
fn invalid_image_name_fails_at_once() {
    let j = job(json!([]));
    let mut p = pod(waiting("tool", "InvalidImageName"));
    p.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()));
    let f = finished(observe_one(&j, Some(&p)));
    assert_eq!(f.reason, reason::IMAGE_PULL_FAILED);
    assert!(f.stop_job);
    assert!(f.message.contains("registry.example/tool:1") && f.message.contains("InvalidImageName"), "{}", f.message);
}

#[test]
fn image_pull_back_off_fails_after_the_grace() {
    let j = job(json!([]));
    let mut young = pod(waiting("tool", "ImagePullBackOff"));
    young.metadata.creation_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time("2026-12-01T10:00:28Z".parse().unwrap()));
    assert_eq!(
        observe_one(&j, Some(&young)),
        Observed::Pending {
            message: "waiting for the pod to start".into(),
            recheck_after: Some(Duration::from_secs(3))
        }
    );
    let old = pod(waiting("tool", "ErrImagePull"));
    let f = finished(observe_one(&j, Some(&old)));
    assert_eq!(f.reason, reason::IMAGE_PULL_FAILED);
    assert!(f.stop_job);
}

#[test]
fn runner_image_pull_failure_names_the_runner_image() {
    let j = job(json!([]));
    let p = pod(json!({"phase": "Pending", "initContainerStatuses": [{
        "name": "install-runner", "image": "runner:x", "imageID": "", "ready": false, "restartCount": 0,
        "state": {"waiting": {"reason": "ImagePullBackOff"}}}]}));
    let f = finished(observe_one(&j, Some(&p)));
    assert!(f.message.starts_with("the runner image \"runner:x\""), "{}", f.message);
}

#[test]
fn missing_secret_fails_after_the_grace() {
    let j = job(json!([]));
    let p = pod(json!({"phase": "Pending", "containerStatuses": [{
        "name": "tool", "image": "img", "imageID": "", "ready": false, "restartCount": 0,
        "state": {"waiting": {"reason": "CreateContainerConfigError", "message": "secret \"feed\" not found"}}}]}));
    let f = finished(observe_one(&j, Some(&p)));
    assert_eq!(f.reason, reason::FAILED);
    assert_eq!(f.message, "container tool cannot start: CreateContainerConfigError: secret \"feed\" not found");
}

#[test]
fn unschedulable_pod_fails_after_the_grace() {
    let j = job(json!([]));
    let cond = |since: &str| {
        pod(json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
            "reason": "Unschedulable", "message": "0/3 nodes are available", "lastTransitionTime": since}]}))
    };
    let recent = cond("2026-12-01T10:00:00Z");
    assert_eq!(
        observe_one(&j, Some(&recent)),
        Observed::Pending {
            message: "waiting for a node to run the pod".into(),
            recheck_after: Some(Duration::from_secs(30))
        }
    );
    let long_ago = cond("2026-12-01T09:58:00Z");
    let f = finished(observe_one(&j, Some(&long_ago)));
    assert_eq!(f.reason, reason::UNSCHEDULABLE);
    assert!(f.stop_job);
    assert_eq!(f.message, "no node could run the pod for 60s: 0/3 nodes are available");
}

#[test]
fn long_termination_messages_are_bounded_and_single_line() {
    let j = job(json!([{"type": "Failed", "status": "True"}]));
    let p = pod(terminated(1, &format!("line one\nline two {}", "x".repeat(5000))));
    let f = finished(observe_one(&j, Some(&p)));
    assert!(f.message.len() < 1200, "{}", f.message.len());
    assert!(!f.message.contains('\n'));
    assert!(f.message.ends_with('…'));
}

#[test]
fn newest_pod_wins() {
    let mut a = pod(json!({}));
    let mut b = pod(json!({}));
    a.metadata.name = Some("a".into());
    b.metadata.name = Some("b".into());
    b.metadata.creation_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time("2026-12-01T10:00:20Z".parse().unwrap()));
    assert_eq!(newest([&a, &b]).and_then(|p| p.metadata.name.as_deref()), Some("b"));
}

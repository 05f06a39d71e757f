//! The controller turns ToolCalls into hardened Jobs and maps Job and pod outcomes to the
//! `Succeeded` condition, against the real apiserver and the real Job controller (pods are
//! finished through the pod status subresource, as a kubelet would).

use crate::controller_support;

use controller_support::*;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;
use toolyard_api::ToolCall;
use toolyard_api::token::RunKind;
use toolyard_tests::User;

#[tokio::test]
async fn toolcall_becomes_a_hardened_job_and_succeeds() {
    let (ns, client) = namespace("ctl-ok").await;
    let key = KeyFile::new();
    let controller = Replica::start(config(&ns, &key, &["--job-ttl-seconds", "77"]), User::Admin).await;
    create(&client, &ns, &job_tool("price-option")).await;
    let created = create(&client, &ns, &call("call-ok", "price-option", 30)).await;
    let calls: Api<ToolCall> = Api::namespaced(client.clone(), &ns);

    let pending = wait_call(&calls, "call-ok", "Unknown", "Pending").await;
    assert_eq!(pending.status.as_ref().unwrap().job_name.as_deref(), Some("call-ok"));
    let condition = succeeded(&pending.status.as_ref().unwrap().conditions).unwrap().clone();
    assert_eq!(condition.observed_generation, created.metadata.generation);

    // The Job as the apiserver stores it.
    let job = Api::<Job>::namespaced(client.clone(), &ns).get("call-ok").await.unwrap();
    let owner = &job.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("ToolCall", "call-ok"));
    assert_eq!(owner.uid, created.metadata.uid.clone().unwrap());
    assert_eq!(owner.controller, Some(true));
    let labels = job.metadata.labels.as_ref().unwrap();
    assert_eq!(labels["app.kubernetes.io/managed-by"], "toolyard");
    assert_eq!(labels["toolyard.dev/tool"], "price-option");
    assert_eq!(labels["toolyard.dev/call"], "call-ok");
    assert_eq!(labels["toolyard.dev/owner"], toolyard_api::OwnerKey::derive("apikey", "alice").to_string());
    assert!(!labels.values().any(|v| v.contains("alice")));
    let managers: Vec<&str> =
        job.metadata.managed_fields.iter().flatten().filter_map(|m| m.manager.as_deref()).collect();
    assert!(managers.contains(&"toolyard-controller"), "Job applied by the controller: {managers:?}");
    let spec = job.spec.as_ref().unwrap();
    assert_eq!(spec.backoff_limit, Some(0));
    assert_eq!(spec.ttl_seconds_after_finished, Some(77));
    let deadline = spec.active_deadline_seconds.unwrap();
    assert!((1..=30).contains(&deadline), "activeDeadlineSeconds {deadline} within the call's 30 s");
    let pod_spec = spec.template.spec.as_ref().unwrap();
    assert_eq!(pod_spec.restart_policy.as_deref(), Some("Never"));
    assert_eq!(pod_spec.automount_service_account_token, Some(false));
    assert_eq!(pod_spec.enable_service_links, Some(false));
    let psc = pod_spec.security_context.as_ref().unwrap();
    assert_eq!((psc.run_as_non_root, psc.run_as_user), (Some(true), Some(65532)));
    assert_eq!(psc.seccomp_profile.as_ref().unwrap().type_, "RuntimeDefault");
    let init = &pod_spec.init_containers.as_ref().unwrap()[0];
    assert_eq!(init.image.as_deref(), Some(RUNNER_IMAGE));
    let tool = &pod_spec.containers[0];
    assert_eq!(tool.image.as_deref(), Some(TOOL_IMAGE));
    assert_eq!(
        tool.command.as_deref().unwrap(),
        [
            "/toolyard/bin/toolyard-runner",
            "call",
            "--",
            "python3",
            "-m",
            "toolyard.run",
            "pricing.options:price_option"
        ]
    );
    assert_eq!(tool.working_dir.as_deref(), Some("/app"));
    assert_eq!(tool.termination_message_policy.as_deref(), Some("FallbackToLogsOnError"));
    for c in [init, tool] {
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.allow_privilege_escalation, Some(false), "{}", c.name);
        assert_eq!(sc.read_only_root_filesystem, Some(true), "{}", c.name);
        assert_eq!(sc.capabilities.as_ref().unwrap().drop.as_deref(), Some(&["ALL".to_owned()][..]), "{}", c.name);
    }
    let env: Vec<(&str, Option<&str>)> =
        tool.env.iter().flatten().map(|e| (e.name.as_str(), e.value.as_deref())).collect();
    assert_eq!(
        env,
        [
            ("TOOLYARD_GATEWAY_URL", Some("http://toolyard-gateway-internal.toolyard.svc:8081")),
            ("TOOLYARD_RUN_ID", Some("call-ok")),
            ("TOOLYARD_TOKEN", None),
            ("TRACEPARENT", Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")),
            ("REGION", Some("eu")),
        ]
    );

    // The token Secret: owned by the call, holding a token for exactly this call and owner.
    let secret = Api::<Secret>::namespaced(client.clone(), &ns).get("call-ok-token").await.unwrap();
    assert_eq!(secret.metadata.owner_references.as_ref().unwrap()[0].uid, created.metadata.uid.clone().unwrap());
    let token = String::from_utf8(secret.data.unwrap()["token"].0.clone()).unwrap();
    let claims = key.key.verify(&token, k8s_openapi::jiff::Timestamp::now().as_second()).expect("token verifies");
    assert_eq!((claims.kind, claims.ns.as_str(), claims.id.as_str()), (RunKind::Call, ns.as_str(), "call-ok"));
    assert_eq!(claims.owner.user, "alice");

    // The real Job controller makes the pod; we play the kubelet.
    let pod = pod_of(&client, &ns, "toolyard.dev/call", "call-ok").await;
    let pod_name = pod.metadata.name.clone().unwrap();
    set_pod_status(&client, &ns, &pod_name, running("tool", TOOL_IMAGE)).await;
    let running_call = wait_call(&calls, "call-ok", "Unknown", "Running").await;
    assert!(running_call.status.as_ref().unwrap().start_time.is_some());

    // The gateway writes the result summary with its own field manager; the controller never touches it.
    let result = json!({"apiVersion": "toolyard.dev/v1alpha1", "kind": "ToolCall",
        "status": {"result": {"key": "owners/x/calls/call-ok/result.json", "isError": false, "exitCode": 0}}});
    calls
        .patch_status("call-ok", &PatchParams::apply("toolyard-gateway").force(), &Patch::Apply(&result))
        .await
        .unwrap();

    set_pod_status(&client, &ns, &pod_name, finished("tool", TOOL_IMAGE, 0, "")).await;
    let done = wait_call(&calls, "call-ok", "True", "Succeeded").await;
    let status = done.status.as_ref().unwrap();
    assert!(status.completion_time.is_some());
    assert!(status.start_time <= status.completion_time);
    assert_eq!(status.result.as_ref().unwrap().key, "owners/x/calls/call-ok/result.json", "gateway field kept");
    let status_managers: Vec<(String, String)> = done
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| m.subresource.as_deref() == Some("status"))
        .map(|m| (m.manager.clone().unwrap_or_default(), serde_json::to_string(&m.fields_v1).unwrap()))
        .collect();
    let controller_fields = &status_managers.iter().find(|(m, _)| m == "toolyard-controller").unwrap().1;
    let gateway_fields = &status_managers.iter().find(|(m, _)| m == "toolyard-gateway").unwrap().1;
    for f in ["f:conditions", "f:jobName", "f:startTime", "f:completionTime"] {
        assert!(controller_fields.contains(f), "controller owns {f}: {controller_fields}");
        assert!(!gateway_fields.contains(f), "gateway does not own {f}");
    }
    assert!(!controller_fields.contains("f:result"), "controller never owns result: {controller_fields}");

    // Events on the transitions. An event is recorded after the status it reports, so the last
    // one may land just after the status was read above.
    let events = Api::<Event>::namespaced(client.clone(), &ns);
    let reasons = || async {
        let list = events.list(&ListParams::default()).await?;
        let reasons: Vec<String> = list
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("call-ok"))
            .filter_map(|e| e.reason)
            .collect();
        anyhow::Ok(reasons)
    };
    let expected = ["JobCreated", "Running", "Succeeded"];
    let recorded = toolyard_tests::wait_until(WAIT, "the transition events", || async {
        let reasons = reasons().await?;
        Ok(expected.iter().all(|r| reasons.iter().any(|got| got == r)))
    })
    .await;
    let reasons = reasons().await.unwrap();
    assert!(recorded.is_ok(), "events {expected:?} in {reasons:?}");
    // The outcome is counted just after its event is recorded.
    let succeeded = "toolyard_controller_runs_total{kind=\"ToolCall\",outcome=\"Succeeded\"} 1";
    let counted = toolyard_tests::wait_until(WAIT, "the outcome to be counted", || async {
        Ok(controller.scrape("/metrics").await.1.contains(succeeded))
    })
    .await;
    let (_, metrics) = controller.scrape("/metrics").await;
    assert!(counted.is_ok(), "{succeeded} in {metrics}");
    assert!(metrics.contains("toolyard_controller_job_creation_latency_seconds_count{kind=\"ToolCall\"} 1"));
    assert!(metrics.contains("toolyard_controller_job_start_latency_seconds_count{kind=\"ToolCall\"} 1"));
    // What the run cost the apiserver, as the controller's client counted it: one Job created,
    // (by server-side apply: 201 when it creates), the status written at each transition, the
    // ToolCalls watched.
    let requests = |verb: &str, resource: &str, code: &str| {
        let name = format!(
            "toolyard_controller_api_requests_total{{verb=\"{verb}\",resource=\"{resource}\",code=\"{code}\"}} "
        );
        metrics.lines().find_map(|l| l.strip_prefix(name.as_str())).and_then(|v| v.parse::<u64>().ok())
    };
    assert_eq!(requests("patch", "jobs", "201"), Some(1), "{metrics}");
    let writes = requests("patch", "toolcalls/status", "200").unwrap_or_default();
    assert!((3..=4).contains(&writes), "JobCreated, Running, Succeeded (and Pending): {writes} in {metrics}");
    assert!(requests("watch", "toolcalls", "200").is_some_and(|n| n >= 1), "{metrics}");
    controller.stop().await;
}

#[tokio::test]
async fn tool_failure_ends_failed_with_exit_code_and_runner_message() {
    let (ns, client) = namespace("ctl-fail").await;
    let key = KeyFile::new();
    let controller = Replica::start(config(&ns, &key, &[]), User::Admin).await;
    create(&client, &ns, &job_tool("price-option")).await;
    create(&client, &ns, &call("call-fail", "price-option", 30)).await;
    create(&client, &ns, &call("call-runner", "price-option", 30)).await;
    create(&client, &ns, &call("call-slow", "price-option", 30)).await;
    let calls: Api<ToolCall> = Api::namespaced(client.clone(), &ns);

    for (name, code, message) in [
        ("call-fail", 1, "ValueError: spot must be positive"),
        ("call-runner", 4, "internal API unreachable: connection refused"),
        ("call-slow", 3, "timed out after 30s"),
    ] {
        let pod = pod_of(&client, &ns, "toolyard.dev/call", name).await;
        set_pod_status(
            &client,
            &ns,
            pod.metadata.name.as_deref().unwrap(),
            finished("tool", TOOL_IMAGE, code, message),
        )
        .await;
    }
    let failed = wait_call(&calls, "call-fail", "False", "Failed").await;
    assert_eq!(call_message(&failed), "the tool failed (exit code 1): ValueError: spot must be positive");
    assert!(failed.status.as_ref().unwrap().completion_time.is_some());
    let runner = wait_call(&calls, "call-runner", "False", "Failed").await;
    assert_eq!(call_message(&runner), "the runner failed (exit code 4): internal API unreachable: connection refused");
    let slow = wait_call(&calls, "call-slow", "False", "TimedOut").await;
    assert!(call_message(&slow).contains("exit code 3"), "{}", call_message(&slow));
    controller.stop().await;
}

#[tokio::test]
async fn deadline_passing_ends_timed_out() {
    let (ns, client) = namespace("ctl-deadline").await;
    let key = KeyFile::new();
    let controller = Replica::start(config(&ns, &key, &[]), User::Admin).await;
    create(&client, &ns, &job_tool("price-option")).await;
    create(&client, &ns, &call("call-late", "price-option", 3)).await;
    let calls: Api<ToolCall> = Api::namespaced(client.clone(), &ns);
    let pod = pod_of(&client, &ns, "toolyard.dev/call", "call-late").await;
    set_pod_status(&client, &ns, pod.metadata.name.as_deref().unwrap(), running("tool", TOOL_IMAGE)).await;
    // Nobody finishes the pod: the Job's activeDeadlineSeconds does.
    let late = wait_call(&calls, "call-late", "False", "TimedOut").await;
    assert!(call_message(&late).contains("deadline"), "{}", call_message(&late));
    // The real Job controller ended it (FailureTarget first, then Failed once the pod is gone).
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    wait_for(&jobs, "call-late", "Job Failed/DeadlineExceeded", |job| {
        job.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "Failed" && c.status == "True" && c.reason.as_deref() == Some("DeadlineExceeded"))
        })
    })
    .await;
    controller.stop().await;
}

#[tokio::test]
async fn cancel_request_deletes_the_job_and_ends_cancelled() {
    let (ns, client) = namespace("ctl-cancel").await;
    let key = KeyFile::new();
    let controller = Replica::start(config(&ns, &key, &[]), User::Admin).await;
    create(&client, &ns, &job_tool("price-option")).await;
    create(&client, &ns, &call("call-cancel", "price-option", 60)).await;
    let calls: Api<ToolCall> = Api::namespaced(client.clone(), &ns);
    let pod = pod_of(&client, &ns, "toolyard.dev/call", "call-cancel").await;
    set_pod_status(&client, &ns, pod.metadata.name.as_deref().unwrap(), running("tool", TOOL_IMAGE)).await;
    wait_call(&calls, "call-cancel", "Unknown", "Running").await;

    // What the gateway does when the client goes away.
    calls
        .patch("call-cancel", &PatchParams::default(), &Patch::Merge(json!({"spec": {"cancelRequested": true}})))
        .await
        .unwrap();
    let cancelled = wait_call(&calls, "call-cancel", "False", "Cancelled").await;
    assert_eq!(call_message(&cancelled), "cancelled on request");
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    toolyard_tests::wait_until(WAIT, "the Job to be deleted", || async {
        Ok(jobs.get_opt("call-cancel").await?.is_none())
    })
    .await
    .unwrap();
    controller.stop().await;
}

#[tokio::test]
async fn unpullable_images_end_image_pull_failed_quickly() {
    let (ns, client) = namespace("ctl-pull").await;
    let key = KeyFile::new();
    // A long deadline: the run must end from the pod's state, not from the deadline.
    let controller = Replica::start(config(&ns, &key, &[]), User::Admin).await;
    create(&client, &ns, &job_tool("price-option")).await;
    create(&client, &ns, &call("call-badname", "price-option", 600)).await;
    create(&client, &ns, &call("call-backoff", "price-option", 600)).await;
    let calls: Api<ToolCall> = Api::namespaced(client.clone(), &ns);

    let pod = pod_of(&client, &ns, "toolyard.dev/call", "call-badname").await;
    set_pod_status(
        &client,
        &ns,
        pod.metadata.name.as_deref().unwrap(),
        waiting("tool", TOOL_IMAGE, "InvalidImageName"),
    )
    .await;
    let pod = pod_of(&client, &ns, "toolyard.dev/call", "call-backoff").await;
    set_pod_status(
        &client,
        &ns,
        pod.metadata.name.as_deref().unwrap(),
        waiting("tool", TOOL_IMAGE, "ImagePullBackOff"),
    )
    .await;

    let bad = wait_call(&calls, "call-badname", "False", "ImagePullFailed").await;
    assert!(call_message(&bad).contains(TOOL_IMAGE) && call_message(&bad).contains("InvalidImageName"));
    let backoff = wait_call(&calls, "call-backoff", "False", "ImagePullFailed").await;
    assert!(call_message(&backoff).contains("ImagePullBackOff"), "{}", call_message(&backoff));
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    for name in ["call-badname", "call-backoff"] {
        toolyard_tests::wait_until(WAIT, "the Job to be deleted", || async { Ok(jobs.get_opt(name).await?.is_none()) })
            .await
            .unwrap();
    }
    controller.stop().await;
}

#[tokio::test]
async fn unschedulable_pod_ends_unschedulable_after_the_grace() {
    let (ns, client) = namespace("ctl-sched").await;
    let key = KeyFile::new();
    let controller = Replica::start(config(&ns, &key, &[]), User::Admin).await;
    create(&client, &ns, &job_tool("price-option")).await;
    create(&client, &ns, &call("call-nonode", "price-option", 600)).await;
    let calls: Api<ToolCall> = Api::namespaced(client.clone(), &ns);
    let pod = pod_of(&client, &ns, "toolyard.dev/call", "call-nonode").await;
    set_pod_status(&client, &ns, pod.metadata.name.as_deref().unwrap(), unschedulable()).await;
    let stuck = wait_call(&calls, "call-nonode", "False", "Unschedulable").await;
    assert!(call_message(&stuck).contains("Insufficient memory"), "{}", call_message(&stuck));
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    toolyard_tests::wait_until(WAIT, "the pod to go with its Job", || async {
        Ok(pods.list(&ListParams::default().labels("toolyard.dev/call=call-nonode")).await?.items.is_empty())
    })
    .await
    .unwrap();
    controller.stop().await;
}

#[tokio::test]
async fn call_of_a_missing_or_invalid_tool_is_rejected() {
    let (ns, client) = namespace("ctl-reject").await;
    let key = KeyFile::new();
    let controller = Replica::start(config(&ns, &key, &[]), User::Admin).await;
    let mut bad = job_tool("bad-tool");
    bad.spec.runtime.image = "Registry.Example/UPPER/case:1".into();
    create(&client, &ns, &bad).await;
    create(&client, &ns, &call("call-nothing", "no-such-tool", 30)).await;
    create(&client, &ns, &call("call-bad", "bad-tool", 30)).await;
    let calls: Api<ToolCall> = Api::namespaced(client.clone(), &ns);
    let missing = wait_call(&calls, "call-nothing", "False", "Rejected").await;
    assert_eq!(call_message(&missing), format!("McpTool \"no-such-tool\" does not exist in namespace {ns:?}"));
    let invalid = wait_call(&calls, "call-bad", "False", "Rejected").await;
    assert!(call_message(&invalid).contains("spec.runtime.image"), "{}", call_message(&invalid));
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    assert!(jobs.list(&ListParams::default()).await.unwrap().items.is_empty(), "a rejected call starts nothing");
    controller.stop().await;
}

#[tokio::test]
async fn finished_calls_are_deleted_after_the_retention() {
    let (ns, client) = namespace("ctl-retain").await;
    let key = KeyFile::new();
    let controller = Replica::start(config(&ns, &key, &["--toolcall-retention-seconds", "2"]), User::Admin).await;
    create(&client, &ns, &call("call-old", "no-such-tool", 30)).await;
    let calls: Api<ToolCall> = Api::namespaced(client.clone(), &ns);
    wait_call(&calls, "call-old", "False", "Rejected").await;
    toolyard_tests::wait_until(WAIT, "the finished call to be deleted", || async {
        Ok(calls.get_opt("call-old").await?.is_none())
    })
    .await
    .unwrap();
    controller.stop().await;
}

#[tokio::test]
async fn pool_mode_call_is_decided_by_the_result_the_gateway_writes() {
    let (ns, client) = namespace("ctl-poolcall").await;
    let key = KeyFile::new();
    let controller = Replica::start(config(&ns, &key, &[]), User::Admin).await;
    create(&client, &ns, &tool("get-quote", json!({"mode": "Pool", "pool": {"replicas": 1}}))).await;
    create(&client, &ns, &call("pool-ok", "get-quote", 30)).await;
    create(&client, &ns, &call("pool-err", "get-quote", 30)).await;
    create(&client, &ns, &call("pool-none", "get-quote", 2)).await;
    let calls: Api<ToolCall> = Api::namespaced(client.clone(), &ns);
    let pending = wait_call(&calls, "pool-ok", "Unknown", "Pending").await;
    assert!(call_message(&pending).contains("warm pool"), "{}", call_message(&pending));
    assert_eq!(pending.status.unwrap().job_name, None, "no Job for a pool call");

    for (name, result) in [
        ("pool-ok", json!({"key": "k", "isError": false, "exitCode": 0})),
        ("pool-err", json!({"key": "k", "isError": true, "exitCode": 1, "message": "unknown symbol XYZ"})),
    ] {
        let body = json!({"apiVersion": "toolyard.dev/v1alpha1", "kind": "ToolCall", "status": {"result": result}});
        calls.patch_status(name, &PatchParams::apply("toolyard-gateway").force(), &Patch::Apply(&body)).await.unwrap();
    }
    wait_call(&calls, "pool-ok", "True", "Succeeded").await;
    let err = wait_call(&calls, "pool-err", "False", "Failed").await;
    assert_eq!(call_message(&err), "the tool failed (exit code 1): unknown symbol XYZ");
    let none = wait_call(&calls, "pool-none", "False", "TimedOut").await;
    assert_eq!(call_message(&none), "no result arrived before the deadline of 2s");
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    assert!(jobs.list(&ListParams::default()).await.unwrap().items.is_empty(), "pool calls never start Jobs");
    controller.stop().await;
}

#[tokio::test]
async fn a_started_call_finishes_even_when_its_tool_is_deleted() {
    let (ns, client) = namespace("ctl-toolgone").await;
    let key = KeyFile::new();
    let controller = Replica::start(config(&ns, &key, &[]), User::Admin).await;
    create(&client, &ns, &job_tool("price-option")).await;
    create(&client, &ns, &call("call-orphan", "price-option", 60)).await;
    let calls: Api<ToolCall> = Api::namespaced(client.clone(), &ns);
    let pod = pod_of(&client, &ns, "toolyard.dev/call", "call-orphan").await;
    let pod_name = pod.metadata.name.clone().unwrap();
    set_pod_status(&client, &ns, &pod_name, running("tool", TOOL_IMAGE)).await;
    wait_call(&calls, "call-orphan", "Unknown", "Running").await;
    Api::<toolyard_api::McpTool>::namespaced(client.clone(), &ns)
        .delete("price-option", &Default::default())
        .await
        .unwrap();
    set_pod_status(&client, &ns, &pod_name, finished("tool", TOOL_IMAGE, 0, "")).await;
    wait_call(&calls, "call-orphan", "True", "Succeeded").await;
    controller.stop().await;
}

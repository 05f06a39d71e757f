//! CodingTasks become agent Jobs: a task-scoped token and no model setting (the agent reaches
//! its model through the gateway), the `Succeeded` condition from the Job, and the gateway's
//! result fields left alone. A CodingTask naming an endpoint or a key Secret is refused by the
//! apiserver with what to use instead.

use crate::controller_support;

use controller_support::*;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use toolyard_api::CodingTask;
use toolyard_api::token::RunKind;
use toolyard_tests::User;

fn task_api(client: &kube::Client, ns: &str) -> Api<CodingTask> {
    Api::namespaced(client.clone(), ns)
}

async fn wait_task(api: &Api<CodingTask>, name: &str, status: &str, reason: &str) -> CodingTask {
    let want = Some((status.to_owned(), reason.to_owned()));
    wait_for(api, name, &format!("Succeeded={status}/{reason}"), |t| task_state(t) == want).await
}

#[tokio::test]
async fn coding_task_runs_the_agent_job_and_keeps_the_gateway_result() {
    let (ns, client) = namespace("ctl-task").await;
    let key = KeyFile::new();
    let controller = Replica::start(config(&ns, &key, &[]), User::Admin).await;
    let created = create(&client, &ns, &task("task-ok", json!({"profile": "cheap"}), 900)).await;
    let tasks = task_api(&client, &ns);
    let pending = wait_task(&tasks, "task-ok", "Unknown", "Pending").await;
    assert_eq!(pending.status.as_ref().unwrap().job_name.as_deref(), Some("task-ok"));

    let job = Api::<Job>::namespaced(client.clone(), &ns).get("task-ok").await.unwrap();
    assert_eq!(job.metadata.owner_references.as_ref().unwrap()[0].uid, created.metadata.uid.clone().unwrap());
    assert_eq!(job.metadata.labels.as_ref().unwrap()["toolyard.dev/task"], "task-ok");
    let spec = job.spec.as_ref().unwrap();
    assert!(spec.active_deadline_seconds.unwrap() <= 900);
    let pod = spec.template.spec.as_ref().unwrap();
    assert_eq!(pod.automount_service_account_token, Some(false));
    let agent = &pod.containers[0];
    assert_eq!(agent.name, "agent");
    assert_eq!(agent.image.as_deref(), Some("registry.example/toolyard-agent:test"));
    assert_eq!(agent.command.as_deref().unwrap(), ["/toolyard/bin/toolyard-runner", "agent"]);
    assert_eq!(agent.security_context.as_ref().unwrap().read_only_root_filesystem, Some(true));
    let env: Vec<(&str, Option<&str>)> =
        agent.env.iter().flatten().map(|e| (e.name.as_str(), e.value.as_deref())).collect();
    assert_eq!(
        env,
        [
            ("TOOLYARD_GATEWAY_URL", Some("http://toolyard-gateway-internal.toolyard.svc:8081")),
            ("TOOLYARD_RUN_ID", Some("task-ok")),
            ("TOOLYARD_TOKEN", None),
        ],
        "no model setting and no model key reach the agent's pod"
    );

    let secret = Api::<Secret>::namespaced(client.clone(), &ns).get("task-ok-token").await.unwrap();
    let token = String::from_utf8(secret.data.unwrap()["token"].0.clone()).unwrap();
    let claims = key.key.verify(&token, k8s_openapi::jiff::Timestamp::now().as_second()).unwrap();
    assert_eq!((claims.kind, claims.id.as_str()), (RunKind::Task, "task-ok"));

    let pod = pod_of(&client, &ns, "toolyard.dev/task", "task-ok").await;
    let pod_name = pod.metadata.name.clone().unwrap();
    set_pod_status(&client, &ns, &pod_name, running("agent", "registry.example/toolyard-agent:test")).await;
    wait_task(&tasks, "task-ok", "Unknown", "Running").await;

    // The gateway writes the result fields from the stored result.
    let result = json!({"apiVersion": "toolyard.dev/v1alpha1", "kind": "CodingTask", "status": {
        "taskType": "analysis", "summary": "Delta rises with spot.", "metrics": {"calls": 3},
        "artifacts": [{"name": "scenarios.csv", "sizeBytes": 120}], "steps": 3, "modelCalls": 4, "toolCalls": 6}});
    tasks
        .patch_status("task-ok", &PatchParams::apply("toolyard-gateway").force(), &Patch::Apply(&result))
        .await
        .unwrap();
    set_pod_status(&client, &ns, &pod_name, finished("agent", "registry.example/toolyard-agent:test", 0, "")).await;
    let done = wait_task(&tasks, "task-ok", "True", "Succeeded").await;
    let status = done.status.unwrap();
    assert!(status.completion_time.is_some() && status.start_time.is_some());
    assert_eq!(status.summary.as_deref(), Some("Delta rises with spot."));
    assert_eq!(status.steps, Some(3));
    assert_eq!(status.artifacts.len(), 1);
    // Finished tasks are kept (no retention configured).
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert!(tasks.get_opt("task-ok").await.unwrap().is_some(), "task history is kept");
    controller.stop().await;
}

#[tokio::test]
async fn a_coding_task_naming_an_endpoint_or_a_key_is_refused_with_what_to_use() {
    let (ns, client) = namespace("ctl-oldmodel").await;
    let api = task_api(&client, &ns);
    for (name, model) in [
        ("task-url", json!({"baseUrl": "https://attacker.example/v1"})),
        ("task-key", json!({"apiKeySecretRef": {"name": "task-other-token", "key": "token"}})),
        ("task-id", json!({"profile": "default", "model": "gpt-x"})),
    ] {
        let refused = api.create(&kube::api::PostParams::default(), &task(name, model, 900)).await.unwrap_err();
        let message = refused.to_string();
        assert!(
            message.contains("spec.model names a model profile (spec.model.profile)")
                && message.contains("no longer accepted"),
            "{name}: {message}"
        );
    }
    let bad_name = task("task-bad", json!({"profile": "Not A Name"}), 900);
    let refused = api.create(&kube::api::PostParams::default(), &bad_name).await.unwrap_err();
    assert!(refused.to_string().contains("profile must be a lowercase name"), "{refused}");
    assert!(api.list(&Default::default()).await.unwrap().items.is_empty(), "nothing was created");
}

#[tokio::test]
async fn failed_and_cancelled_coding_tasks_end_their_jobs() {
    let (ns, client) = namespace("ctl-taskend").await;
    let key = KeyFile::new();
    let controller = Replica::start(config(&ns, &key, &[]), User::Admin).await;
    let model = json!({});
    create(&client, &ns, &task("task-fail", model.clone(), 900)).await;
    create(&client, &ns, &task("task-cancel", model, 900)).await;
    let tasks = task_api(&client, &ns);

    let pod = pod_of(&client, &ns, "toolyard.dev/task", "task-fail").await;
    let image = "registry.example/toolyard-agent:test";
    set_pod_status(
        &client,
        &ns,
        pod.metadata.name.as_deref().unwrap(),
        finished("agent", image, 1, "model endpoint unreachable"),
    )
    .await;
    let failed = wait_task(&tasks, "task-fail", "False", "Failed").await;
    let message = succeeded(&failed.status.unwrap().conditions).unwrap().message.clone();
    assert_eq!(message, "the agent failed (exit code 1): model endpoint unreachable");

    pod_of(&client, &ns, "toolyard.dev/task", "task-cancel").await;
    tasks
        .patch("task-cancel", &PatchParams::default(), &Patch::Merge(json!({"spec": {"cancelRequested": true}})))
        .await
        .unwrap();
    wait_task(&tasks, "task-cancel", "False", "Cancelled").await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    toolyard_tests::wait_until(WAIT, "the task's Job to be deleted", || async {
        Ok(jobs.get_opt("task-cancel").await?.is_none())
    })
    .await
    .unwrap();
    controller.stop().await;
}

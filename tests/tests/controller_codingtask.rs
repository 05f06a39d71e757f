//! CodingTasks become agent Jobs: model settings by reference, a task-scoped token, the
//! `Succeeded` condition from the Job, and the gateway's result fields left alone.

mod controller_support;

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
    let flags = [
        "--model-base-url",
        "http://llm.models.svc:8000/v1",
        "--model",
        "qwen3-coder",
        "--model-api-key-secret",
        "llm/api-key",
    ];
    let controller = Replica::start(config(&ns, &key, &flags), User::Admin).await;
    let created = create(&client, &ns, &task("task-ok", json!({"model": "own-model"}), 900)).await;
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
            ("TOOLYARD_MODEL_BASE_URL", Some("http://llm.models.svc:8000/v1")),
            ("TOOLYARD_MODEL", Some("own-model")),
            ("TOOLYARD_MODEL_API_KEY", None),
        ]
    );
    let api_key = agent.env.as_ref().unwrap()[5].value_from.as_ref().unwrap().secret_key_ref.as_ref().unwrap();
    assert_eq!((api_key.name.as_str(), api_key.key.as_str()), ("llm", "api-key"));

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
async fn coding_task_without_model_settings_is_rejected_with_what_to_set() {
    let (ns, client) = namespace("ctl-nomodel").await;
    let key = KeyFile::new();
    let controller = Replica::start(config(&ns, &key, &[]), User::Admin).await;
    create(&client, &ns, &task("task-nomodel", json!({}), 900)).await;
    let tasks = task_api(&client, &ns);
    let rejected = wait_task(&tasks, "task-nomodel", "False", "Rejected").await;
    let message = succeeded(&rejected.status.unwrap().conditions).unwrap().message.clone();
    assert!(message.contains("spec.model.baseUrl") && message.contains("--model-base-url"), "{message}");
    controller.stop().await;
}

#[tokio::test]
async fn failed_and_cancelled_coding_tasks_end_their_jobs() {
    let (ns, client) = namespace("ctl-taskend").await;
    let key = KeyFile::new();
    let controller = Replica::start(config(&ns, &key, &[]), User::Admin).await;
    let model = json!({"baseUrl": "http://llm/v1", "model": "m"});
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

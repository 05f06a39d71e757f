//! The process node runs Job pods as local processes and the real Job controller sees the
//! outcome: completion, failure with the termination message, deadline, unknown images.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{Container, EmptyDirVolumeSource, Pod, PodSpec, PodTemplateSpec, Volume, VolumeMount};
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use toolyard_tests::process_node::{ImageSpec, ProcessNode};
use toolyard_tests::{TestEnv, User, wait_until};

const SHELL: &str = "toolyard-test/shell:1";

fn job(name: &str, script: &str, deadline: Option<i64>, image: &str) -> Job {
    Job {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        spec: Some(JobSpec {
            backoff_limit: Some(0),
            active_deadline_seconds: deadline,
            template: PodTemplateSpec {
                spec: Some(PodSpec {
                    restart_policy: Some("Never".into()),
                    termination_grace_period_seconds: Some(1),
                    volumes: Some(vec![Volume {
                        name: "work".into(),
                        empty_dir: Some(EmptyDirVolumeSource::default()),
                        ..Default::default()
                    }]),
                    containers: vec![Container {
                        name: "main".into(),
                        image: Some(image.into()),
                        command: Some(vec!["sh".into(), "-c".into(), script.into()]),
                        volume_mounts: Some(vec![VolumeMount {
                            name: "work".into(),
                            mount_path: "/work".into(),
                            ..Default::default()
                        }]),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn job_condition(jobs: &Api<Job>, name: &str) -> Option<(String, String)> {
    let job = jobs.get(name).await.ok()?;
    job.status?
        .conditions?
        .into_iter()
        .find(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
        .map(|c| (c.type_, c.reason.unwrap_or_default()))
}

#[tokio::test]
async fn process_node_runs_job_pods_and_the_job_controller_sees_the_outcome() {
    let env = TestEnv::get();
    let ns = env.namespace("pnode").await.unwrap();
    let node = ProcessNode::start(env, &ns, HashMap::from([(SHELL.to_owned(), ImageSpec::default())])).await.unwrap();
    let client = env.client(User::Admin).await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client, &ns);

    jobs.create(&PostParams::default(), &job("ok", "echo hi > /work/out && test -s /work/out", None, SHELL))
        .await
        .unwrap();
    jobs.create(
        &PostParams::default(),
        &job("fails", "echo 'bad input' > \"$TOOLYARD_TERMINATION_LOG\"; exit 3", None, SHELL),
    )
    .await
    .unwrap();
    jobs.create(&PostParams::default(), &job("slow", "sleep 300", Some(2), SHELL)).await.unwrap();
    jobs.create(&PostParams::default(), &job("no-image", "true", None, "registry.invalid/nothing:1")).await.unwrap();

    let finished = |name: &'static str| {
        let jobs = jobs.clone();
        async move {
            wait_until(Duration::from_secs(90), name, || async { Ok(job_condition(&jobs, name).await.is_some()) }).await
        }
    };
    finished("ok").await.unwrap();
    assert_eq!(job_condition(&jobs, "ok").await.unwrap().0, "Complete");

    finished("fails").await.unwrap();
    assert_eq!(job_condition(&jobs, "fails").await.unwrap().0, "Failed");
    let pod = pods.list(&ListParams::default().labels("job-name=fails")).await.unwrap().items.remove(0);
    let term = pod.status.unwrap().container_statuses.unwrap().remove(0).state.unwrap().terminated.unwrap();
    assert_eq!(term.exit_code, 3);
    assert_eq!(term.message.as_deref().map(str::trim), Some("bad input"));

    finished("slow").await.unwrap();
    assert_eq!(job_condition(&jobs, "slow").await.unwrap(), ("Failed".to_owned(), "DeadlineExceeded".to_owned()));

    wait_until(Duration::from_secs(30), "ErrImagePull on the pod", || async {
        let list = pods.list(&ListParams::default().labels("job-name=no-image")).await?;
        Ok(list.items.iter().any(|p| {
            p.status.as_ref().and_then(|s| s.container_statuses.as_ref()).is_some_and(|cs| {
                cs.iter().any(|c| {
                    c.state.as_ref().and_then(|s| s.waiting.as_ref()).and_then(|w| w.reason.as_deref())
                        == Some("ErrImagePull")
                })
            })
        }))
    })
    .await
    .unwrap();
    node.stop().await;
}

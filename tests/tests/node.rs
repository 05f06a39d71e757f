//! The test node is a real one: the kubelet runs Job pods in containerd with runc, and the
//! real Job controller sees the outcome (completion, failure with the termination message,
//! deadline, an image that does not exist). (`e2e_cluster` runs the runner in each kind of
//! tool image through the whole platform.)

use std::time::Duration;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, Pod, PodSecurityContext, PodSpec, PodTemplateSpec, SeccompProfile, Volume,
    VolumeMount,
};
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use toolyard_tests::{TestEnv, User, images, wait_until};

fn volume(name: &str) -> Volume {
    Volume { name: name.into(), empty_dir: Some(EmptyDirVolumeSource::default()), ..Default::default() }
}

fn mount(name: &str, path: &str) -> VolumeMount {
    VolumeMount { name: name.into(), mount_path: path.into(), ..Default::default() }
}

fn job(name: &str, deadline: Option<i64>, main: Container, volumes: Vec<Volume>) -> Job {
    Job {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        spec: Some(JobSpec {
            backoff_limit: Some(0),
            active_deadline_seconds: deadline,
            template: PodTemplateSpec {
                spec: Some(PodSpec {
                    restart_policy: Some("Never".into()),
                    termination_grace_period_seconds: Some(1),
                    automount_service_account_token: Some(false),
                    security_context: Some(PodSecurityContext {
                        run_as_non_root: Some(true),
                        run_as_user: Some(65532),
                        run_as_group: Some(65532),
                        seccomp_profile: Some(SeccompProfile {
                            type_: "RuntimeDefault".into(),
                            localhost_profile: None,
                        }),
                        ..Default::default()
                    }),
                    containers: vec![main],
                    volumes: Some(volumes),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A Job whose one container runs `script` with `sh` in the busybox test image.
fn shell_job(name: &str, script: &str, deadline: Option<i64>, image: &str) -> Job {
    let main = Container {
        name: "main".into(),
        image: Some(image.into()),
        command: Some(vec!["sh".into(), "-c".into(), script.into()]),
        volume_mounts: Some(vec![mount("work", "/work")]),
        ..Default::default()
    };
    job(name, deadline, main, vec![volume("work")])
}

async fn job_condition(jobs: &Api<Job>, name: &str) -> Option<(String, String)> {
    let job = jobs.get(name).await.ok()?;
    job.status?
        .conditions?
        .into_iter()
        .find(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
        .map(|c| (c.type_, c.reason.unwrap_or_default()))
}

async fn finished(jobs: &Api<Job>, name: &str) -> (String, String) {
    wait_until(Duration::from_secs(90), name, || async { Ok(job_condition(jobs, name).await.is_some()) })
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    job_condition(jobs, name).await.expect("finished")
}

async fn pod_of(pods: &Api<Pod>, job: &str) -> Pod {
    pods.list(&ListParams::default().labels(&format!("job-name={job}"))).await.expect("pods").items.remove(0)
}

#[tokio::test]
async fn the_node_runs_job_pods_and_the_job_controller_sees_the_outcome() {
    let env = TestEnv::get();
    let ns = env.namespace("node").await.unwrap();
    let client = env.client(User::Admin).await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client, &ns);
    let sh = images::ECHO_BUSYBOX;

    let create = |job: Job| {
        let jobs = jobs.clone();
        async move { jobs.create(&PostParams::default(), &job).await.expect("create job") }
    };
    create(shell_job("ok", "echo hi > /work/out && test -s /work/out", None, sh)).await;
    create(shell_job("fails", "echo 'bad input' > /dev/termination-log; exit 3", None, sh)).await;
    create(shell_job("slow", "sleep 300", Some(2), sh)).await;
    create(shell_job("no-image", "true", None, "registry.invalid/nothing:1")).await;

    assert_eq!(finished(&jobs, "ok").await.0, "Complete");
    let ok = pod_of(&pods, "ok").await;
    assert_eq!(ok.spec.as_ref().and_then(|s| s.node_name.as_deref()), Some(env.node()), "scheduled on the real node");

    assert_eq!(finished(&jobs, "fails").await.0, "Failed");
    let pod = pod_of(&pods, "fails").await;
    let term = pod.status.unwrap().container_statuses.unwrap().remove(0).state.unwrap().terminated.unwrap();
    assert_eq!(term.exit_code, 3);
    assert_eq!(term.message.as_deref().map(str::trim), Some("bad input"));

    assert_eq!(finished(&jobs, "slow").await, ("Failed".to_owned(), "DeadlineExceeded".to_owned()));

    wait_until(Duration::from_secs(60), "ErrImagePull on the pod", || async {
        let list = pods.list(&ListParams::default().labels("job-name=no-image")).await?;
        Ok(list.items.iter().any(|p| {
            p.status.as_ref().and_then(|s| s.container_statuses.as_ref()).is_some_and(|cs| {
                cs.iter().any(|c| {
                    let reason = c.state.as_ref().and_then(|s| s.waiting.as_ref()).and_then(|w| w.reason.as_deref());
                    matches!(reason, Some("ErrImagePull" | "ImagePullBackOff"))
                })
            })
        }))
    })
    .await
    .unwrap();
}

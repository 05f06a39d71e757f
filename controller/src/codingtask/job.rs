//! `desired_job` for a CodingTask: the agent (`toolyard-runner agent`) in the agent image, with
//! the same hardened pod as a tool call and a task-scoped token. No model setting and no key:
//! the agent calls its model through the gateway, which holds the model profiles. Pure.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Container, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use toolyard_api::CodingTask;
use toolyard_api::protocol::env;
use toolyard_api::token::SigningKey;

use crate::config::Config;
use crate::context::{controller_owner_ref, namespaced_name};
use crate::error::{Error, Result};
use crate::labels;
use crate::pod;
use crate::run::{self, RunKind};

/// The Job running `task`'s agent, created at `now`.
pub fn desired_job(task: &CodingTask, config: &Config, now: Timestamp) -> Result<Job> {
    const KIND: &str = "CodingTask";
    let (ns, name) = namespaced_name(task, KIND)?;
    let deadline = deadline_of(task)?;

    let mut vars = vec![
        pod::env(env::GATEWAY_URL, config.gateway_internal_url.clone()),
        pod::env(env::RUN_ID, name.clone()),
        pod::secret_env(env::TOKEN, &run::token_secret_name(&name), run::TOKEN_KEY),
    ];
    if let Some(tp) = task.annotations().get(labels::TRACEPARENT_ANNOTATION) {
        vars.push(pod::env(env::TRACEPARENT, tp.clone()));
    }
    vars.extend(pod::telemetry_env(config));

    let r = &config.resources;
    let container = Container {
        name: RunKind::Task.container().to_owned(),
        image: Some(config.agent_image.clone()),
        command: Some(vec![pod::RUNNER.to_owned(), "agent".to_owned()]),
        env: Some(vars),
        resources: Some(pod::resources(None, &r.agent_cpu_request, &r.agent_memory_request, &r.agent_memory_limit)),
        ..Default::default()
    };
    let mut pod_spec = pod::hardened_pod_spec(container, &config.runner_image, None, &r.tmp_size_limit, "Never");
    pod_spec.runtime_class_name = config.agent_runtime_class.clone();
    Ok(run::run_job(
        &name,
        &ns,
        controller_owner_ref(task, KIND)?,
        run::run_labels(RunKind::Task, &name, &task.spec.owner, &[]),
        pod_spec,
        run::remaining_seconds(deadline, now),
        config.timing.job_ttl_seconds,
    ))
}

/// The Secret with the task's token (kind `task`: it may also call tools as the owner).
pub fn desired_token_secret(task: &CodingTask, key: &SigningKey) -> Result<Secret> {
    const KIND: &str = "CodingTask";
    let (ns, name) = namespaced_name(task, KIND)?;
    let claims = run::claims(RunKind::Task, &ns, &name, &task.spec.owner, deadline_of(task)?);
    Ok(run::token_secret(
        &name,
        &ns,
        controller_owner_ref(task, KIND)?,
        run::run_labels(RunKind::Task, &name, &task.spec.owner, &[]),
        key.sign(&claims),
    ))
}

fn deadline_of(task: &CodingTask) -> Result<Timestamp> {
    let created = task
        .metadata
        .creation_timestamp
        .as_ref()
        .ok_or(Error::MissingField { kind: "CodingTask", field: "metadata.creationTimestamp" })?;
    Ok(run::deadline(created.0, task.spec.budgets.timeout_seconds.into()))
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use serde_json::json;
    use toolyard_api::token::RunKind as TokenKind;

    use super::*;

    fn config(extra: &[&str]) -> Config {
        let mut args = vec![
            "toolyard-controller",
            "--agent-image",
            "ghcr.io/toolyard/toolyard-agent:9.9.9",
            "--runner-image",
            "ghcr.io/toolyard/toolyard-runner:9.9.9",
        ];
        args.extend_from_slice(extra);
        Config::try_parse_from(args).unwrap()
    }

    fn task(model: serde_json::Value) -> CodingTask {
        serde_json::from_value(json!({
            "apiVersion": "toolyard.dev/v1alpha1",
            "kind": "CodingTask",
            "metadata": {"name": "task-4f8q2m", "namespace": "team-a", "uid": "task-uid",
                         "creationTimestamp": "2026-12-01T10:00:00Z",
                         "annotations": {"toolyard.dev/traceparent": "00-aa-bb-01"}},
            "spec": {
                "prompt": "compare calls",
                "owner": {"issuer": "apikey", "user": "alice"},
                "model": model,
                "budgets": {"maxSteps": 5, "maxModelCalls": 10, "maxToolCalls": 20, "timeoutSeconds": 900},
            },
        }))
        .unwrap()
    }

    #[test]
    fn agent_job_is_hardened_and_runs_the_agent() {
        let cfg = config(&[]);
        let job =
            desired_job(&task(json!({"profile": "default"})), &cfg, "2026-12-01T10:00:10Z".parse().unwrap()).unwrap();
        assert_eq!(job.metadata.name.as_deref(), Some("task-4f8q2m"));
        let labels = job.metadata.labels.as_ref().unwrap();
        assert_eq!(labels["toolyard.dev/task"], "task-4f8q2m");
        assert_eq!(labels["toolyard.dev/owner"], toolyard_api::OwnerKey::derive("apikey", "alice").to_string());
        assert_eq!(labels["app.kubernetes.io/managed-by"], "toolyard");
        assert_eq!(job.metadata.owner_references.as_ref().unwrap()[0].kind, "CodingTask");
        let spec = job.spec.as_ref().unwrap();
        assert_eq!(spec.active_deadline_seconds, Some(890));
        assert_eq!(spec.backoff_limit, Some(0));
        assert_eq!(spec.ttl_seconds_after_finished, Some(300));
        let pod = spec.template.spec.as_ref().unwrap();
        assert_eq!(pod.automount_service_account_token, Some(false));
        assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
        assert_eq!(pod.security_context.as_ref().unwrap().run_as_non_root, Some(true));
        assert_eq!(
            pod.init_containers.as_ref().unwrap()[0].image.as_deref(),
            Some("ghcr.io/toolyard/toolyard-runner:9.9.9")
        );
        let c = &pod.containers[0];
        assert_eq!(c.name, "agent");
        assert_eq!(c.image.as_deref(), Some("ghcr.io/toolyard/toolyard-agent:9.9.9"));
        assert_eq!(c.command.as_deref().unwrap(), ["/toolyard/bin/toolyard-runner", "agent"]);
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.capabilities.as_ref().unwrap().drop, Some(vec!["ALL".to_owned()]));
        assert_eq!(c.resources.as_ref().unwrap().limits.as_ref().unwrap()["memory"], Quantity("1Gi".into()));
        let env = c.env.as_ref().unwrap();
        let names: Vec<&str> = env.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            names,
            ["TOOLYARD_GATEWAY_URL", "TOOLYARD_RUN_ID", "TOOLYARD_TOKEN", "TRACEPARENT"],
            "no model setting and no model key in the agent's pod"
        );
        assert!(env[2].value.is_none(), "the token only by Secret reference");
    }

    #[test]
    fn task_token_is_a_task_token() {
        let key = SigningKey::new(vec![3u8; 32]).unwrap();
        let s = desired_token_secret(&task(json!({})), &key).unwrap();
        let token = String::from_utf8(s.data.unwrap()["token"].0.clone()).unwrap();
        let claims = key.verify(&token, 0).unwrap();
        assert_eq!(claims.kind, TokenKind::Task);
        assert_eq!(claims.id, "task-4f8q2m");
        let deadline: Timestamp = "2026-12-01T10:15:00Z".parse().unwrap();
        assert_eq!(claims.exp, deadline.as_second() + 300);
    }
}

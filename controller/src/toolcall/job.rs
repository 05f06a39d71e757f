//! `desired_job`: the hardened Job that runs one ToolCall, and its token Secret. Pure.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Container, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use toolyard_api::protocol::env;
use toolyard_api::token::SigningKey;
use toolyard_api::{McpTool, ToolCall};

use crate::config::Config;
use crate::context::{controller_owner_ref, namespaced_name};
use crate::error::{Error, Result};
use crate::labels;
use crate::pod;
use crate::run::{self, RunKind};

/// The Job running `call` with `tool`, created at `now` (for `activeDeadlineSeconds`).
pub fn desired_job(call: &ToolCall, tool: &McpTool, config: &Config, now: Timestamp) -> Result<Job> {
    const KIND: &str = "ToolCall";
    let (ns, name) = namespaced_name(call, KIND)?;
    let created = call
        .metadata
        .creation_timestamp
        .as_ref()
        .ok_or(Error::MissingField { kind: KIND, field: "metadata.creationTimestamp" })?;
    let deadline = run::deadline(created.0, call.spec.timeout_seconds.into());
    let runtime = &tool.spec.runtime;

    let mut command = vec![pod::RUNNER.to_owned(), "call".to_owned(), "--".to_owned()];
    command.extend(runtime.command.iter().cloned());
    command.extend(runtime.args.iter().cloned());

    let mut vars = vec![
        pod::env(env::GATEWAY_URL, config.gateway_internal_url.clone()),
        pod::env(env::RUN_ID, name.clone()),
        pod::secret_env(env::TOKEN, &run::token_secret_name(&name), run::TOKEN_KEY),
    ];
    if let Some(tp) = call.annotations().get(labels::TRACEPARENT_ANNOTATION) {
        vars.push(pod::env(env::TRACEPARENT, tp.clone()));
    }
    vars.extend(pod::telemetry_env(config));
    if tool.spec.caller_identity {
        // The owner the gateway recorded from the authenticated caller (the admission policy
        // keeps anyone else from setting it).
        let owner = &call.spec.owner;
        let caller = serde_json::json!({"issuer": owner.issuer, "user": owner.user, "groups": owner.groups});
        vars.push(pod::env(env::CALLER, caller.to_string()));
    }
    vars.extend(pod::tool_env(&runtime.env));

    let container = Container {
        name: RunKind::Call.container().to_owned(),
        image: Some(runtime.image.clone()),
        command: Some(command),
        working_dir: runtime.working_dir.clone(),
        env: Some(vars),
        resources: Some(pod::runtime_resources(runtime, config)),
        ..Default::default()
    };
    let pod_spec = pod::tool_pod_spec(container, config, &tool.spec, "Never");
    Ok(run::run_job(
        &name,
        &ns,
        controller_owner_ref(call, KIND)?,
        job_labels(call, tool),
        pod_spec,
        run::remaining_seconds(deadline, now),
        config.timing.job_ttl_seconds,
    ))
}

/// Labels of a call's Job, pod and token Secret: managed-by, tool, call, owner key.
pub fn job_labels(call: &ToolCall, tool: &McpTool) -> std::collections::BTreeMap<String, String> {
    run::run_labels(
        RunKind::Call,
        &call.name_any(),
        &call.spec.owner,
        &[(labels::TOOL, labels::value(&tool.name_any()))],
    )
}

/// The Secret with the call's token, signed with `key`.
pub fn desired_token_secret(call: &ToolCall, tool: &McpTool, key: &SigningKey) -> Result<Secret> {
    const KIND: &str = "ToolCall";
    let (ns, name) = namespaced_name(call, KIND)?;
    let created = call
        .metadata
        .creation_timestamp
        .as_ref()
        .ok_or(Error::MissingField { kind: KIND, field: "metadata.creationTimestamp" })?;
    let deadline = run::deadline(created.0, call.spec.timeout_seconds.into());
    let claims = run::claims(RunKind::Call, &ns, &name, &call.spec.owner, deadline);
    Ok(run::token_secret(&name, &ns, controller_owner_ref(call, KIND)?, job_labels(call, tool), key.sign(&claims)))
}

#[cfg(test)]
mod tests;

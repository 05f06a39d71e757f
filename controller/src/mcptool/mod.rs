//! McpTool reconciler: validates what the schema cannot, sets `Ready` with observedGeneration,
//! and for `mode: Pool` owns the warm pool (Deployment, Service, key Secret) whose available
//! replicas decide `Ready` and whose Service is the `endpoint` the gateway calls.

pub mod image;
pub mod pool;
pub mod validate;

use std::sync::Arc;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use toolyard_api::conditions::{self, reason, status};
use toolyard_api::mcptool::ExecutionMode;
use toolyard_api::{CONTROLLER_MANAGER, McpTool, McpToolStatus};
use tracing::info;

use crate::context::{Context, error_policy as shared_error_policy, namespaced_name, reference};
use crate::error::{Error, Result};
use crate::metrics::KindLabels;

/// Kind label of this controller.
pub const KIND: &str = "McpTool";

/// Caches the McpTool controller reads.
#[derive(Clone)]
pub struct ToolStores {
    /// Pool Deployments.
    pub deployments: Store<Deployment>,
}

/// What the reconciler found out about a tool in this pass.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// The spec has problems (the message names the fields).
    Invalid(String),
    /// Valid, calls run as Jobs.
    JobMode,
    /// Valid, served by a warm pool.
    Pool {
        /// Replicas asked for.
        desired: i32,
        /// Replicas available.
        available: i32,
        /// The pool Service's URL.
        endpoint: String,
    },
}

/// The tool's next status (all of it is the controller's). Pure.
pub fn next_status(current: &McpToolStatus, verdict: &Verdict, generation: Option<i64>) -> McpToolStatus {
    let mut next = McpToolStatus {
        conditions: current.conditions.clone(),
        observed_generation: generation,
        endpoint: None,
        available_replicas: None,
    };
    let ready = match verdict {
        Verdict::Invalid(message) => {
            conditions::ready(status::FALSE, reason::INVALID_SPEC, message.as_str(), generation)
        }
        Verdict::JobMode => {
            conditions::ready(status::TRUE, reason::VALID, "the tool is valid; each call runs as a Job", generation)
        }
        Verdict::Pool { desired, available, endpoint } => {
            next.endpoint = Some(endpoint.clone());
            next.available_replicas = Some(*available);
            let message = format!("{available} of {desired} warm pool replicas available");
            if *available > 0 {
                conditions::ready(status::TRUE, reason::POOL_AVAILABLE, message, generation)
            } else {
                conditions::ready(status::FALSE, reason::POOL_PROGRESSING, message, generation)
            }
        }
    };
    conditions::upsert(&mut next.conditions, ready);
    next
}

/// Reconciles one McpTool.
pub async fn reconcile(tool: Arc<McpTool>, ctx: Arc<Context<ToolStores>>) -> Result<Action> {
    ctx.instrument(KIND, tool.as_ref(), reconcile_tool(&tool, &ctx)).await
}

/// Retries with backoff.
pub fn error_policy(tool: Arc<McpTool>, error: &Error, ctx: Arc<Context<ToolStores>>) -> Action {
    shared_error_policy(KIND, tool.as_ref(), error, &ctx)
}

async fn reconcile_tool(tool: &McpTool, ctx: &Context<ToolStores>) -> Result<Action> {
    let (ns, name) = namespaced_name(tool, KIND)?;
    let generation = tool.metadata.generation;
    if tool.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let verdict = match validate::check(&name, &tool.spec) {
        Err(invalid) => Verdict::Invalid(invalid.to_string()),
        Ok(()) if tool.spec.execution.mode == ExecutionMode::Job => {
            remove_pool(ctx, &ns, &name).await?;
            Verdict::JobMode
        }
        Ok(()) => apply_pool(ctx, tool, &ns, &name).await?,
    };

    let current = tool.status.clone().unwrap_or_default();
    let next = next_status(&current, &verdict, generation);
    if next != current {
        let body = serde_json::json!({
            "apiVersion": toolyard_api::API_VERSION,
            "kind": KIND,
            "metadata": {"name": name},
            "status": next,
        });
        Api::<McpTool>::namespaced(ctx.client.clone(), &ns)
            .patch_status(&name, &PatchParams::apply(CONTROLLER_MANAGER).force(), &Patch::Apply(&body))
            .await?;
        ctx.metrics.status_writes.get_or_create(&KindLabels { kind: KIND }).inc();
        let before = conditions::find(&current.conditions, conditions::READY);
        let after = conditions::find(&next.conditions, conditions::READY).expect("next_status sets Ready");
        if before.map(|c| (&c.status, &c.reason)) != Some((&after.status, &after.reason))
            || (after.reason == reason::INVALID_SPEC && before.map(|c| &c.message) != Some(&after.message))
        {
            info!(namespace = %ns, name = %name, ready = %after.status, reason = %after.reason, "tool readiness changed");
            let warning = after.status != status::TRUE && after.reason == reason::INVALID_SPEC;
            ctx.publish(&reference(tool), warning, &after.reason, "Validate", after.message.clone()).await;
        }
    }
    Ok(Action::await_change())
}

/// Applies the pool's Secret, Deployment and Service; reads availability from the Deployment.
async fn apply_pool(ctx: &Context<ToolStores>, tool: &McpTool, ns: &str, name: &str) -> Result<Verdict> {
    let params = PatchParams::apply(CONTROLLER_MANAGER).force();
    crate::run::create_secret(ctx, ns, &pool::desired_key_secret(tool, &ctx.key)?).await?;
    let deployment = pool::desired_deployment(tool, &ctx.config)?;
    let applied = Api::<Deployment>::namespaced(ctx.client.clone(), ns)
        .patch(&pool::pool_name(name), &params, &Patch::Apply(&deployment))
        .await?;
    let service = pool::desired_service(tool)?;
    Api::<Service>::namespaced(ctx.client.clone(), ns)
        .patch(&pool::pool_name(name), &params, &Patch::Apply(&service))
        .await?;
    let desired = deployment.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let available = applied.status.as_ref().and_then(|s| s.available_replicas).unwrap_or(0);
    Ok(Verdict::Pool { desired, available, endpoint: pool::endpoint(name, ns) })
}

/// Deletes a pool left from `mode: Pool` after the tool moved to `mode: Job`.
async fn remove_pool(ctx: &Context<ToolStores>, ns: &str, name: &str) -> Result<()> {
    // The key Secret stays until the McpTool goes (it is owned by it): deleting it would need a
    // Secret verb that returns Secret data, which the controller does not have.
    if crate::workload::remove(&ctx.client, &ctx.stores.deployments, ns, &pool::pool_name(name)).await? {
        info!(namespace = %ns, name = %name, "warm pool removed");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready(s: &McpToolStatus) -> (&str, &str, &str) {
        let c = conditions::find(&s.conditions, conditions::READY).unwrap();
        (c.status.as_str(), c.reason.as_str(), c.message.as_str())
    }

    #[test]
    fn job_mode_tool_is_ready_valid() {
        let s = next_status(&McpToolStatus::default(), &Verdict::JobMode, Some(3));
        assert_eq!(ready(&s).0, "True");
        assert_eq!(ready(&s).1, "Valid");
        assert_eq!(s.observed_generation, Some(3));
        assert_eq!(conditions::find(&s.conditions, "Ready").unwrap().observed_generation, Some(3));
        assert_eq!((s.endpoint, s.available_replicas), (None, None));
    }

    #[test]
    fn invalid_tool_is_not_ready_and_says_why() {
        let s = next_status(&McpToolStatus::default(), &Verdict::Invalid("spec.inputSchema: bad".into()), Some(1));
        assert_eq!(ready(&s), ("False", "InvalidSpec", "spec.inputSchema: bad"));
    }

    #[test]
    fn pool_readiness_follows_available_replicas() {
        let progressing = Verdict::Pool { desired: 2, available: 0, endpoint: "http://p.ns.svc:8080".into() };
        let s = next_status(&McpToolStatus::default(), &progressing, Some(1));
        assert_eq!(ready(&s), ("False", "PoolProgressing", "0 of 2 warm pool replicas available"));
        assert_eq!(s.endpoint.as_deref(), Some("http://p.ns.svc:8080"));
        assert_eq!(s.available_replicas, Some(0));
        let available = Verdict::Pool { desired: 2, available: 1, endpoint: "http://p.ns.svc:8080".into() };
        let s2 = next_status(&s, &available, Some(1));
        assert_eq!(ready(&s2), ("True", "PoolAvailable", "1 of 2 warm pool replicas available"));
        let back_to_job = next_status(&s2, &Verdict::JobMode, Some(2));
        assert_eq!(back_to_job.endpoint, None, "a Job-mode tool has no endpoint");
    }

    #[test]
    fn unchanged_verdict_is_no_change() {
        let s = next_status(&McpToolStatus::default(), &Verdict::JobMode, Some(1));
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert_eq!(next_status(&s, &Verdict::JobMode, Some(1)), s);
    }
}

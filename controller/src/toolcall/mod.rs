//! ToolCall reconciler: a Job per call for Job-mode tools; for Pool-mode tools the gateway
//! sends the call to the warm pool and writes `status.result`, and the controller turns that
//! result (or its absence at the deadline) into the `Succeeded` condition.

pub mod job;

use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use toolyard_api::conditions::reason;
use toolyard_api::mcptool::ExecutionMode;
use toolyard_api::storage::RunId;
use toolyard_api::{McpTool, ToolCall};

use crate::context::{Context, error_policy as shared_error_policy};
use crate::error::{Error, Result};
use crate::mcptool::validate;
use crate::outcome::Finish;
use crate::run::{JobState, RunCtx, RunStores};

/// Kind label of this controller.
pub const KIND: &str = "ToolCall";

/// Caches the ToolCall controller reads.
#[derive(Clone)]
pub struct CallStores {
    /// Jobs and pods of calls.
    pub run: RunStores,
    /// McpTools.
    pub tools: Store<McpTool>,
}

/// Reconciles one ToolCall.
pub async fn reconcile(call: Arc<ToolCall>, ctx: Arc<Context<CallStores>>) -> Result<Action> {
    ctx.instrument(KIND, call.as_ref(), reconcile_call(&call, &ctx)).await
}

/// Retries with backoff.
pub fn error_policy(call: Arc<ToolCall>, error: &Error, ctx: Arc<Context<CallStores>>) -> Action {
    shared_error_policy(KIND, call.as_ref(), error, &ctx)
}

async fn reconcile_call(call: &ToolCall, ctx: &Context<CallStores>) -> Result<Action> {
    let run = RunCtx::new(call, ctx)?;
    if let Some(action) = run.settle(ctx, &ctx.stores.run).await? {
        return Ok(action);
    }
    // A call whose Job exists is only observed: the tool may change or go away meanwhile.
    let state = run.job_state(ctx, &ctx.stores.run).await?;
    if let JobState::Exists(job) = &state {
        return run.observe_job(ctx, &ctx.stores.run, job).await;
    }
    if let Some(action) = run.end_if_job_lost(ctx, &state).await? {
        return Ok(action);
    }
    if let Err(e) = RunId::parse(&run.name) {
        return run.reject(ctx, format!("the ToolCall's name cannot be used as a run id: {e}")).await;
    }
    let Some(tool) = find_tool(ctx, &run.ns, &call.spec.tool).await? else {
        let message = format!("McpTool {:?} does not exist in namespace {:?}", call.spec.tool, run.ns);
        return run.reject(ctx, message).await;
    };
    if let Err(invalid) = validate::check(&call.spec.tool, &tool.spec) {
        return run.reject(ctx, format!("McpTool {:?} is invalid: {invalid}", call.spec.tool)).await;
    }
    match tool.spec.execution.mode {
        ExecutionMode::Pool => {
            let result = call.status.as_ref().and_then(|s| s.result.as_ref()).map(|r| {
                let (reason, message) = if r.is_error {
                    let message = r.message.clone().unwrap_or_else(|| "the tool reported an error".to_owned());
                    let code = r.exit_code.map(|c| format!(" (exit code {c})")).unwrap_or_default();
                    (reason::FAILED, format!("the tool failed{code}: {message}"))
                } else {
                    (reason::SUCCEEDED, "the warm pool returned the tool's result".to_owned())
                };
                Finish { reason, message, started: None, finished: Timestamp::now(), stop_job: false }
            });
            let pending = format!("sent to the warm pool of McpTool {:?} by the gateway", call.spec.tool);
            run.await_result(ctx, result, &pending).await
        }
        ExecutionMode::Job => {
            let job = job::desired_job(call, &tool, &ctx.config, Timestamp::now())?;
            let secret = job::desired_token_secret(call, &tool, &ctx.key)?;
            run.create_job(ctx, &job, &secret).await
        }
    }
}

/// The McpTool from the cache, or from the API when the cache does not have it (yet).
async fn find_tool(ctx: &Context<CallStores>, ns: &str, name: &str) -> Result<Option<Arc<McpTool>>> {
    if let Some(tool) = ctx.stores.tools.get(&ObjectRef::new(name).within(ns)) {
        return Ok(Some(tool));
    }
    let api: Api<McpTool> = Api::namespaced(ctx.client.clone(), ns);
    Ok(api.get_opt(name).await?.map(Arc::new))
}

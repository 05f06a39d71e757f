//! CodingTask reconciler: one Job per task running `toolyard-runner agent`. The controller
//! owns the task's `Succeeded` condition, `jobName`, `startTime` and `completionTime`; the
//! gateway writes the result fields (taskType, summary, metrics, artifacts, step counts).

pub mod job;

use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use toolyard_api::CodingTask;
use toolyard_api::storage::RunId;

use crate::context::{Context, error_policy as shared_error_policy};
use crate::error::{Error, Result};
use crate::run::{JobState, RunCtx, RunStores};

/// Kind label of this controller.
pub const KIND: &str = "CodingTask";

/// Reconciles one CodingTask.
pub async fn reconcile(task: Arc<CodingTask>, ctx: Arc<Context<RunStores>>) -> Result<Action> {
    ctx.instrument(KIND, task.as_ref(), reconcile_task(&task, &ctx)).await
}

/// Retries with backoff.
pub fn error_policy(task: Arc<CodingTask>, error: &Error, ctx: Arc<Context<RunStores>>) -> Action {
    shared_error_policy(KIND, task.as_ref(), error, &ctx)
}

async fn reconcile_task(task: &CodingTask, ctx: &Context<RunStores>) -> Result<Action> {
    let run = RunCtx::new(task, ctx)?;
    if let Some(action) = run.settle(ctx, &ctx.stores).await? {
        return Ok(action);
    }
    let state = run.job_state(ctx, &ctx.stores).await?;
    if let JobState::Exists(job) = &state {
        return run.observe_job(ctx, &ctx.stores, job).await;
    }
    if let Some(action) = run.end_if_job_lost(ctx, &state).await? {
        return Ok(action);
    }
    if let Err(e) = RunId::parse(&run.name) {
        return run.reject(ctx, format!("the CodingTask's name cannot be used as a run id: {e}")).await;
    }
    let job = job::desired_job(task, &ctx.config, Timestamp::now())?;
    let secret = job::desired_token_secret(task, &ctx.key)?;
    run.create_job(ctx, &job, &secret).await
}

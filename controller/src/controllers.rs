//! Wiring: per watch scope (the cluster or one namespace), one watch per kind feeds both the
//! reconcile triggers and the caches the reconcilers read; the McpTool, McpServer, ToolCall
//! and CodingTask controllers run until `shutdown`, finishing in-flight reconciles.

use std::fmt::Debug;
use std::future::ready;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::{Stream, StreamExt};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use toolyard_api::{CodingTask, McpServer, McpTool, ToolCall};
use tracing::{info, warn};

use crate::codingtask;
use crate::config::Scope;
use crate::context::{Context, Shared};
use crate::labels;
use crate::mcpserver::{self, ServerStores};
use crate::mcptool::{self, ToolStores};
use crate::pod_index::PodsByRun;
use crate::run::RunStores;
use crate::toolcall::{self, CallStores};

/// Runs every controller for every scope until `shutdown`; sets `synced` once all caches
/// have their first full list.
pub async fn run(shared: Arc<Shared>, scopes: Vec<Scope>, shutdown: CancellationToken, synced: Arc<AtomicBool>) {
    let mut set = JoinSet::new();
    let mut readiness = Vec::new();
    for scope in scopes {
        let (future, ready) = scope_controllers(shared.clone(), scope, shutdown.clone());
        set.spawn(future);
        readiness.push(ready);
    }
    let stop = shutdown.clone();
    let listed = synced.clone();
    set.spawn(async move {
        let all = async {
            for ready in readiness {
                ready.await;
            }
        };
        tokio::select! {
            () = all => {
                listed.store(true, Ordering::Release);
                info!("caches synced");
            }
            () = stop.cancelled() => {}
        }
    });
    // A stop lets in-flight reconciles finish. But kube-runtime holds a controller's runner
    // until its cache has listed, and after the stop nothing lists any more: a stop that comes
    // before every cache has listed would wait for ever. No reconcile has run in a controller
    // whose cache has not listed, so then the controllers are stopped at once (any other one's
    // in-flight reconcile ends as if the replica had died, and is done again by the next leader).
    let unsynced_stop = async {
        shutdown.cancelled().await;
        if synced.load(Ordering::Acquire) {
            std::future::pending::<()>().await;
        }
    };
    let finished = tokio::select! {
        () = async { while set.join_next().await.is_some() {} } => true,
        () = unsynced_stop => false,
    };
    if !finished {
        warn!("stopped before the caches listed: stopping the controllers at once");
        set.abort_all();
        while set.join_next().await.is_some() {}
    }
}

fn api<K>(client: &Client, scope: &Scope) -> Api<K>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
{
    match scope {
        Scope::Cluster => Api::all(client.clone()),
        Scope::Namespace(ns) => Api::namespaced(client.clone(), ns),
    }
}

/// A watch of `K` in `scope` (optionally by label selector), reflected into a cache, and a
/// flag that turns true once the cache holds the first full list.
///
/// The flag is ours rather than `Store::wait_until_ready`: that future shares one waker slot
/// among all its waiters, and a second waiter can keep a controller from being woken.
fn reflected<K>(
    client: &Client,
    scope: &Scope,
    labels: Option<&str>,
    trim: fn(&mut K),
    observe: impl Fn(&watcher::Event<K>) + Send + 'static,
) -> (Store<K>, impl Stream<Item = Result<K, watcher::Error>> + Send + 'static, watch::Receiver<bool>)
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + Debug
        + DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let mut config = watcher::Config::default();
    if let Some(l) = labels {
        config = config.labels(l);
    }
    let (listed, listed_rx) = watch::channel(false);
    let stream = watcher(api::<K>(client, scope), config)
        .default_backoff()
        .modify(trim)
        .inspect(move |event| {
            if let Ok(event) = event {
                observe(event);
            }
        })
        .reflect(writer)
        .inspect(move |event| {
            if matches!(event, Ok(watcher::Event::InitDone)) {
                listed.send_replace(true);
            }
        })
        .touched_objects();
    (reader, stream, listed_rx)
}

fn trim_meta<K: Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
}

fn trim_job(job: &mut Job) {
    trim_meta(job);
    if let Some(spec) = job.spec.as_mut() {
        spec.template.spec = None;
    }
}

fn trim_pod(pod: &mut Pod) {
    trim_meta(pod);
    pod.spec = None;
}

/// The run a Job pod belongs to, from its run label.
fn run_of<K: Resource<DynamicType = ()>>(pod: &Pod, label: &str) -> Option<ObjectRef<K>> {
    let name = pod.labels().get(label)?;
    Some(ObjectRef::new(name).within(&pod.namespace()?))
}

/// Logs what the controller stream reports: failures of watches (e.g. missing permissions)
/// and of reconciles (already logged with backoff by the error policy, so debug only).
fn log_result<K: Resource, E: std::error::Error, W: std::error::Error>(
    kind: &'static str,
    result: Result<(ObjectRef<K>, controller::Action), controller::Error<E, W>>,
) {
    match result {
        Ok(_) => {}
        Err(controller::Error::ReconcilerFailed(error, obj)) => {
            tracing::debug!(kind, name = %obj.name, %error, "reconcile failed");
        }
        Err(error) => warn!(kind, %error, "controller error"),
    }
}

fn scope_controllers(
    shared: Arc<Shared>,
    scope: Scope,
    shutdown: CancellationToken,
) -> (impl std::future::Future<Output = ()> + Send + 'static, impl std::future::Future<Output = ()> + Send + 'static) {
    let client = shared.client.clone();
    let settings = controller::Config::default().concurrency(shared.config.concurrency);
    let stop = |token: &CancellationToken| {
        let token = token.clone();
        async move { token.cancelled().await }
    };

    let (tools, tool_events, tools_listed) = reflected::<McpTool>(&client, &scope, None, trim_meta, |_| {});
    let (deployments, deployment_events, deployments_listed) = reflected::<Deployment>(
        &client,
        &scope,
        Some(&format!("{}={}", labels::COMPONENT, labels::COMPONENT_POOL)),
        trim_meta,
        |_| {},
    );
    let (servers, server_events, servers_listed) = reflected::<McpServer>(&client, &scope, None, trim_meta, |_| {});
    let (server_deployments, server_deployment_events, server_deployments_listed) = reflected::<Deployment>(
        &client,
        &scope,
        Some(&format!("{}={}", labels::COMPONENT, labels::COMPONENT_MCP_SERVER)),
        trim_meta,
        |_| {},
    );
    let (call_jobs, call_job_events, call_jobs_listed) =
        reflected::<Job>(&client, &scope, Some(labels::CALL), trim_job, |_| {});
    let call_pods_by_run = PodsByRun::new(labels::CALL);
    let (call_pods, call_pod_events, call_pods_listed) = {
        let index = call_pods_by_run.clone();
        reflected::<Pod>(&client, &scope, Some(labels::CALL), trim_pod, move |e| index.apply(e))
    };
    let (task_jobs, task_job_events, task_jobs_listed) =
        reflected::<Job>(&client, &scope, Some(labels::TASK), trim_job, |_| {});
    let task_pods_by_run = PodsByRun::new(labels::TASK);
    let (task_pods, task_pod_events, task_pods_listed) = {
        let index = task_pods_by_run.clone();
        reflected::<Pod>(&client, &scope, Some(labels::TASK), trim_pod, move |e| index.apply(e))
    };
    // The runs themselves are cached without their managed fields too (a few kilobytes each,
    // kept for every finished run until its retention ends).
    let (calls, call_events, calls_listed) = reflected::<ToolCall>(&client, &scope, None, trim_meta, |_| {});
    let (tasks, task_events, tasks_listed) = reflected::<CodingTask>(&client, &scope, None, trim_meta, |_| {});

    let synced = async move {
        for mut listed in [
            tools_listed,
            deployments_listed,
            servers_listed,
            server_deployments_listed,
            call_jobs_listed,
            call_pods_listed,
            task_jobs_listed,
            task_pods_listed,
            calls_listed,
            tasks_listed,
        ] {
            // An error means the watch is gone (shutdown); readiness no longer matters then.
            let _ = listed.wait_for(|done| *done).await;
        }
    };

    let tool_ctx = Arc::new(Context { shared: shared.clone(), stores: ToolStores { deployments } });
    let tool_controller = Controller::for_stream(tool_events, tools.clone())
        .owns_stream(deployment_events)
        .with_config(settings.clone())
        .graceful_shutdown_on(stop(&shutdown))
        .run(mcptool::reconcile, mcptool::error_policy, tool_ctx)
        .for_each(|r| {
            log_result(mcptool::KIND, r);
            ready(())
        });

    let server_ctx =
        Arc::new(Context { shared: shared.clone(), stores: ServerStores { deployments: server_deployments } });
    let server_controller = Controller::for_stream(server_events, servers)
        .owns_stream(server_deployment_events)
        .with_config(settings.clone())
        .graceful_shutdown_on(stop(&shutdown))
        .run(mcpserver::reconcile, mcpserver::error_policy, server_ctx)
        .for_each(|r| {
            log_result(mcpserver::KIND, r);
            ready(())
        });

    let call_ctx = Arc::new(Context {
        shared: shared.clone(),
        stores: CallStores {
            run: RunStores { jobs: call_jobs, pods: call_pods, pods_by_run: call_pods_by_run },
            tools,
        },
    });
    let call_controller = Controller::for_stream(call_events, calls)
        .owns_stream(call_job_events)
        .watches_stream(call_pod_events, |pod| run_of::<ToolCall>(&pod, labels::CALL))
        .with_config(settings.clone())
        .graceful_shutdown_on(stop(&shutdown))
        .run(toolcall::reconcile, toolcall::error_policy, call_ctx)
        .for_each(|r| {
            log_result(toolcall::KIND, r);
            ready(())
        });

    let task_ctx = Arc::new(Context {
        shared,
        stores: RunStores { jobs: task_jobs, pods: task_pods, pods_by_run: task_pods_by_run },
    });
    let task_controller = Controller::for_stream(task_events, tasks)
        .owns_stream(task_job_events)
        .watches_stream(task_pod_events, |pod| run_of::<CodingTask>(&pod, labels::TASK))
        .with_config(settings)
        .graceful_shutdown_on(stop(&shutdown))
        .run(codingtask::reconcile, codingtask::error_policy, task_ctx)
        .for_each(|r| {
            log_result(codingtask::KIND, r);
            ready(())
        });

    let all = async move {
        info!(scope = ?scope, "controllers started");
        futures::join!(tool_controller, server_controller, call_controller, task_controller);
        info!(scope = ?scope, "controllers stopped");
    };
    (all, synced)
}

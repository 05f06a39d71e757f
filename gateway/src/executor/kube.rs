//! [`Executor`] on Kubernetes: a ToolCall per call, run by the controller as a Job; Pool-mode
//! tools are called on their warm pool's pods directly ([`super::pool`], [`super::pool_pods`]).
//!
//! A Job-mode call: the input goes to storage (`calls/<id>/input.json` under the caller's
//! prefix); a ToolCall is created (name = call id, owner = the caller, input reference,
//! timeout from the tool, trace context as an annotation); one shared watch over ToolCalls
//! tells the waiting call when its `Succeeded` condition is final (with a periodic re-read in
//! case a watch event is lost); the result is read from `calls/<id>/result.json`, which the
//! runner uploaded through the internal API, or built from the condition when there is none.
//! At the deadline (tool timeout + grace) or when the client cancels or goes away, the gateway
//! sets `spec.cancelRequested` and the controller stops the Job.
//!
//! Pool calls create no ToolCall (the controller would otherwise start a Job for them).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use toolyard_api::conditions::{self, reason};
use toolyard_api::mcptool::ExecutionMode;
use toolyard_api::protocol::pool::{self, key_purpose};
use toolyard_api::protocol::{CallErrorKind, CallResult};
use toolyard_api::storage::{CallFile, RunId, call_key};
use toolyard_api::token::SigningKey;
use toolyard_api::toolcall::{InputRef, ResultSummary};
use toolyard_api::{GATEWAY_MANAGER, OwnerKey, ToolCall, ToolCallSpec};

use super::events::{self, ProgressHub};
use super::load::{LoadSettings, PoolLoad};
use super::pool::{CallRecords, PoolClient, PoolTarget, Route, call_file, run_pool_call};
use super::pool_pods::PoolPods;
use super::running::{REPLICA_LABEL, RunningElsewhere};
use super::{CallRequest, CallState, Executor, Forgotten, ResultRecorder};
use crate::catalog::kube::{Namespaces, watch_each};
use crate::store::ArtifactStore;
use crate::{Error, Result};

/// How often a call waited on with progress wanted reads its stored progress events (those
/// that reached another replica's internal API).
const PROGRESS_POLL: Duration = Duration::from_secs(1);

/// Annotation carrying the W3C trace context of the request that made the call.
pub const TRACEPARENT_ANNOTATION: &str = "toolyard.dev/traceparent";
/// Label with the owner key (a hash; never the raw user name).
pub const OWNER_LABEL: &str = "toolyard.dev/owner";
/// Label with the hash of the caller's owner key and MCP request id: how any replica finds the
/// ToolCall a `notifications/cancelled` names.
pub const CANCEL_KEY_LABEL: &str = "toolyard.dev/cancel-key";
/// Standard label naming the creator.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";

/// Settings of the Kubernetes executor.
#[derive(Clone, Debug)]
pub struct KubeExecutorSettings {
    /// Extra time after the tool's timeout before the gateway gives up (pod start, upload).
    pub grace: Duration,
    /// How often a waiting call re-reads its ToolCall, in case a watch event was missed.
    pub recheck: Duration,
    /// Timeout of single apiserver requests made by the executor.
    pub api_timeout: Duration,
    /// Where this replica publishes its pool calls in flight ([`PoolLoad`]).
    pub load: LoadSettings,
}

impl Default for KubeExecutorSettings {
    fn default() -> Self {
        Self {
            grace: Duration::from_secs(15),
            recheck: Duration::from_secs(15),
            api_timeout: Duration::from_secs(10),
            load: LoadSettings::default(),
        }
    }
}

/// What the shared watch knows about one ToolCall.
#[derive(Clone, Debug)]
enum Seen {
    Unknown,
    Object(Arc<ToolCall>),
    Deleted,
}

type WaiterMap = Mutex<HashMap<(String, String), watch::Sender<Seen>>>;

/// Calls waiting for their ToolCall, fed by one shared watch.
#[derive(Default)]
struct Waiters(WaiterMap);

impl Waiters {
    fn register(self: &Arc<Self>, namespace: &str, name: &str) -> (watch::Receiver<Seen>, WaiterGuard) {
        let (tx, rx) = watch::channel(Seen::Unknown);
        let key = (namespace.to_owned(), name.to_owned());
        self.0.lock().unwrap_or_else(|e| e.into_inner()).insert(key.clone(), tx);
        (rx, WaiterGuard { waiters: self.clone(), key })
    }

    fn notify(&self, namespace: &str, name: &str, seen: Seen) {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tx) = map.get(&(namespace.to_owned(), name.to_owned())) {
            let _ = tx.send(seen);
        }
    }
}

/// Removes a waiter when its call ends.
struct WaiterGuard {
    waiters: Arc<Waiters>,
    key: (String, String),
}

impl Drop for WaiterGuard {
    fn drop(&mut self) {
        self.waiters.0.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.key);
    }
}

/// Sets `spec.cancelRequested` when dropped while armed: a call whose future is dropped
/// (client gone) still stops its Job.
struct CancelOnDrop {
    api: Option<Api<ToolCall>>,
    name: String,
}

impl CancelOnDrop {
    fn disarm(&mut self) {
        self.api = None;
    }

    /// Requests cancellation now (in a detached task, so it completes even if the caller's
    /// future is dropped next) and disarms.
    fn fire(&mut self) {
        if let Some(api) = self.api.take() {
            let name = self.name.clone();
            tokio::spawn(async move { request_cancel(&api, &name).await });
        }
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if self.api.is_some() && tokio::runtime::Handle::try_current().is_ok() {
            self.fire();
        }
    }
}

async fn request_cancel(api: &Api<ToolCall>, name: &str) {
    let patch = json!({"spec": {"cancelRequested": true}});
    let params = PatchParams { field_manager: Some(GATEWAY_MANAGER.to_owned()), ..PatchParams::default() };
    match tokio::time::timeout(Duration::from_secs(10), api.patch(name, &params, &Patch::Merge(&patch))).await {
        Ok(Ok(_)) => tracing::info!(call = %name, "cancellation requested"),
        Ok(Err(kube::Error::Api(e))) if e.code == 404 => {}
        Ok(Err(e)) => tracing::warn!(call = %name, error = %e, "requesting cancellation failed"),
        Err(_) => tracing::warn!(call = %name, "requesting cancellation timed out"),
    }
}

/// The Kubernetes executor.
#[derive(Clone)]
pub struct KubeExecutor {
    client: Client,
    store: Arc<dyn ArtifactStore>,
    waiters: Arc<Waiters>,
    running: Arc<RunningElsewhere>,
    load: Arc<PoolLoad>,
    pool: PoolClient,
    pool_pods: Arc<PoolPods>,
    records: Arc<CallRecords>,
    signing_key: Option<SigningKey>,
    settings: KubeExecutorSettings,
    namespaces: Namespaces,
    progress: Arc<ProgressHub>,
}

impl std::fmt::Debug for KubeExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeExecutor").field("settings", &self.settings).finish_non_exhaustive()
    }
}

impl KubeExecutor {
    /// Starts the shared ToolCall watch over `namespaces`, the watch of their warm pools' pods
    /// ([`PoolPods`]) and this replica's [`PoolLoad`]
    /// (stopped by `shutdown`). `signing_key` signs Pool-mode call tokens (pool calls fail
    /// clearly without it).
    pub fn start(
        client: Client,
        store: Arc<dyn ArtifactStore>,
        namespaces: &Namespaces,
        signing_key: Option<SigningKey>,
        pool: PoolClient,
        settings: KubeExecutorSettings,
        shutdown: CancellationToken,
    ) -> Self {
        let waiters = Arc::new(Waiters::default());
        let replica = format!("gw-{}", crate::core::ids::random_hex12());
        let running = Arc::new(RunningElsewhere::new(replica.clone()));
        let load = PoolLoad::new(replica);
        load.start(client.clone(), settings.load.clone(), shutdown.clone());
        let pool_pods = PoolPods::start(&client, namespaces, &shutdown);
        let (notified, counted) = (waiters.clone(), running.clone());
        let apis = namespaces.apis::<ToolCall>(&client);
        watch_each(apis, &watcher::Config::default(), "ToolCall", &shutdown, move |stream, event| {
            counted.observe(stream, &event);
            match event {
                Event::Apply(tc) | Event::InitApply(tc) => {
                    let (ns, name) = (tc.namespace().unwrap_or_default(), tc.name_any());
                    notified.notify(&ns, &name, Seen::Object(Arc::new(tc)));
                }
                Event::Delete(tc) => {
                    notified.notify(&tc.namespace().unwrap_or_default(), &tc.name_any(), Seen::Deleted);
                }
                Event::Init | Event::InitDone => {}
            }
        });
        let records = Arc::new(CallRecords::new(Arc::clone(&store)));
        Self {
            client,
            store,
            waiters,
            running,
            load,
            pool,
            pool_pods,
            records,
            signing_key,
            settings,
            namespaces: namespaces.clone(),
            progress: Arc::default(),
        }
    }

    /// A Job-mode call: its runner reports progress through the internal API of some replica,
    /// which passes it on when the caller waits here ([`ProgressHub`]); reports stored
    /// through another replica are read from storage every [`PROGRESS_POLL`]. `call_finished`
    /// closes its log.
    async fn call_job(&self, request: CallRequest) -> Result<CallResult> {
        events::run_job_call(&self.progress, &self.records, request, |request| self.run_job(request)).await
    }

    async fn run_job(&self, request: CallRequest) -> Result<CallResult> {
        let started = Instant::now();
        let tool = request.tool.clone();
        let namespace = tool.namespace.clone();
        let id = request.id.clone();
        let owner = request.caller.owner_key();
        let api: Api<ToolCall> = Api::namespaced(self.client.clone(), &namespace);
        let timeout_seconds =
            tool.spec.execution.timeout_seconds.clamp(1, toolyard_api::mcptool::MAX_TOOL_TIMEOUT_SECONDS);

        let input = serde_json::to_vec(&request.arguments).map_err(|e| Error::Internal(e.to_string()))?;
        let size_bytes = i64::try_from(input.len()).unwrap_or(i64::MAX);
        events::store_start(self.store.as_ref(), self.records.event_logs(), &owner, &request, Bytes::from(input))
            .await?;

        let (mut seen, _waiter) = self.waiters.register(&namespace, id.as_str());
        let object = tool_call_object(&request, &owner, self.running.replica(), size_bytes, timeout_seconds);
        let params = PostParams { field_manager: Some(GATEWAY_MANAGER.to_owned()), ..PostParams::default() };
        self.with_timeout(api.create(&params, &object)).await?;
        let mut cancel_guard = CancelOnDrop { api: Some(api.clone()), name: id.to_string() };
        if let Some(started) = request.task_started {
            // An MCP task's run outlives this wait (a restart of this process, say): it is
            // the ToolCall, created now.
            cancel_guard.disarm();
            let _ = started.send(());
        }
        tracing::info!(namespace = %namespace, "ToolCall created");

        let deadline = tokio::time::Instant::now()
            + Duration::from_secs(u64::try_from(timeout_seconds).unwrap_or(60))
            + self.settings.grace;
        let mut recheck = tokio::time::interval(self.settings.recheck);
        recheck.tick().await;
        let mut progress_poll = tokio::time::interval(PROGRESS_POLL);
        progress_poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut next_segment = 1;
        let condition = loop {
            let current = seen.borrow_and_update().clone();
            match current {
                Seen::Object(tc) => {
                    if let Some(c) = finished_condition(&tc) {
                        break c;
                    }
                }
                Seen::Deleted => {
                    cancel_guard.disarm();
                    return Ok(CallResult::err(
                        CallErrorKind::Cancelled,
                        "the call's ToolCall was deleted before it finished",
                        None,
                        elapsed_ms(started),
                    ));
                }
                Seen::Unknown => {}
            }
            tokio::select! {
                () = request.cancel.cancelled() => {
                    cancel_guard.fire();
                    return Ok(CallResult::err(CallErrorKind::Cancelled, "the call was cancelled", None, elapsed_ms(started)));
                }
                () = tokio::time::sleep_until(deadline) => {
                    cancel_guard.fire();
                    return Ok(CallResult::err(
                        CallErrorKind::TimedOut,
                        format!("timed out after {timeout_seconds}s"),
                        None,
                        elapsed_ms(started),
                    ));
                }
                changed = seen.changed() => {
                    if changed.is_err() {
                        return Err(Error::Internal("ToolCall watch closed".into()));
                    }
                }
                _ = progress_poll.tick(), if request.progress.is_some() => {
                    if let Some(sender) = &request.progress
                        && let Err(e) = events::poll_progress(self.store.as_ref(), &owner, id.as_str(), &mut next_segment, sender).await
                    {
                        tracing::debug!(error = %e, "reading the call's progress failed");
                    }
                }
                _ = recheck.tick() => {
                    match self.with_timeout(api.get_opt(id.as_str())).await {
                        Ok(Some(tc)) => self.waiters_send(&namespace, &id, Seen::Object(Arc::new(tc))),
                        Ok(None) => self.waiters_send(&namespace, &id, Seen::Deleted),
                        Err(e) => tracing::warn!(error = %e, "re-reading the ToolCall failed"),
                    }
                }
            }
        };
        cancel_guard.disarm();
        self.result_of(&owner, &id, &condition, started).await
    }

    fn waiters_send(&self, namespace: &str, id: &RunId, seen: Seen) {
        self.waiters.notify(namespace, id.as_str(), seen);
    }

    /// The stored result, or one built from the final condition when the runner stored none.
    async fn result_of(
        &self,
        owner: &OwnerKey,
        id: &RunId,
        condition: &Condition,
        started: Instant,
    ) -> Result<CallResult> {
        let path = call_file(id.as_str(), CallFile::Result);
        if let Some(bytes) = self.store.get(owner, &path).await? {
            return match serde_json::from_slice::<CallResult>(&bytes) {
                Ok(result) => Ok(result),
                Err(e) => {
                    tracing::error!(error = %e, "stored result is not a CallResult");
                    Ok(CallResult::err(
                        CallErrorKind::BadResult,
                        "the stored result is unreadable",
                        None,
                        elapsed_ms(started),
                    ))
                }
            };
        }
        Ok(result_from_condition(condition, elapsed_ms(started)))
    }

    async fn call_pool(&self, request: CallRequest) -> Result<CallResult> {
        let tool = request.tool.clone();
        let Some(endpoint) = tool.endpoint.clone() else {
            return Err(Error::Unavailable("the tool's warm pool has no endpoint yet".into()));
        };
        let Some(key) = &self.signing_key else {
            return Err(Error::Unavailable("pool calls need the token signing key (--token-key-file)".into()));
        };
        let pool_key = key.derive(&key_purpose(&tool.namespace, &tool.object_name));
        let _counted = self.load.enter(&request.caller.owner_key());
        let service = pool::service_name(&tool.object_name);
        let route = if self.pool_pods.seen(&tool.namespace, &service) {
            Route::Pods { pods: &self.pool_pods, namespace: &tool.namespace, service: &service }
        } else {
            Route::Url(&endpoint)
        };
        let target = PoolTarget { route, key: &pool_key, namespace: &tool.namespace, grace: self.settings.grace };
        run_pool_call(&self.pool, &self.records, target, request).await
    }

    /// The caller's ToolCalls named `id` in the served namespaces (one, or none).
    async fn tool_calls_named(&self, owner: &OwnerKey, id: &RunId) -> Result<Vec<ToolCall>> {
        let params = kube::api::ListParams::default()
            .labels(&format!("{OWNER_LABEL}={owner}"))
            .fields(&format!("metadata.name={id}"));
        let mut found = Vec::new();
        for api in self.namespaces.apis::<ToolCall>(&self.client) {
            let calls = self.with_timeout(api.list(&params)).await?.items;
            found.extend(calls.into_iter().filter(|c| c.spec.owner.key() == *owner));
        }
        Ok(found)
    }

    async fn with_timeout<T>(&self, fut: impl Future<Output = kube::Result<T>>) -> Result<T> {
        match tokio::time::timeout(self.settings.api_timeout, fut).await {
            Ok(r) => r.map_err(Error::from),
            Err(_) => Err(Error::Unavailable("the Kubernetes API did not answer in time".into())),
        }
    }
}

#[async_trait]
impl Executor for KubeExecutor {
    async fn call(&self, request: CallRequest) -> Result<CallResult> {
        match request.tool.spec.execution.mode {
            ExecutionMode::Job => self.call_job(request).await,
            ExecutionMode::Pool => self.call_pool(request).await,
        }
    }

    fn running_elsewhere(&self, owner: &OwnerKey) -> usize {
        self.running.of(owner) + self.load.elsewhere(owner)
    }

    /// Finds the caller's ToolCall named `id` in the served namespaces; deletes it when it
    /// has finished. Pool calls have no ToolCall.
    async fn forget(&self, owner: &OwnerKey, id: &RunId) -> Result<Forgotten> {
        let mut found = Forgotten::Nothing;
        for call in self.tool_calls_named(owner, id).await? {
            if finished_condition(&call).is_none() {
                return Ok(Forgotten::Running);
            }
            let namespaced: Api<ToolCall> = Api::namespaced(self.client.clone(), &call.namespace().unwrap_or_default());
            match self.with_timeout(namespaced.delete(id.as_str(), &Default::default())).await {
                Err(Error::Kube(kube::Error::Api(e))) if e.code == 404 => {}
                Err(e) => return Err(e),
                Ok(_) => {}
            }
            found = Forgotten::Removed;
        }
        Ok(found)
    }

    /// The caller's ToolCall named `id`: running, or ended as its condition says.
    async fn call_state(&self, owner: &OwnerKey, id: &RunId) -> Result<CallState> {
        Ok(match self.tool_calls_named(owner, id).await?.first() {
            None => CallState::Unknown,
            Some(call) => match finished_condition(call) {
                None => CallState::Running,
                Some(condition) => CallState::Ended(Box::new(result_from_condition(&condition, 0))),
            },
        })
    }

    async fn flush(&self) {
        self.records.flush().await;
    }

    fn records(&self) -> Option<Arc<CallRecords>> {
        Some(Arc::clone(&self.records))
    }

    fn progress_hub(&self) -> Option<Arc<ProgressHub>> {
        Some(Arc::clone(&self.progress))
    }

    /// Finds the caller's unfinished ToolCalls labelled with `cancel_key` in the served
    /// namespaces and sets `spec.cancelRequested` on each. Pool calls have no ToolCall: they
    /// stop only through the replica that runs them.
    async fn cancel_by_key(&self, owner: &OwnerKey, cancel_key: &str) -> Result<usize> {
        let selector = format!("{OWNER_LABEL}={owner},{CANCEL_KEY_LABEL}={cancel_key}");
        let params = kube::api::ListParams::default().labels(&selector);
        let mut asked = 0;
        for api in self.namespaces.apis::<ToolCall>(&self.client) {
            let calls = self.with_timeout(api.list(&params)).await?;
            for call in calls.items {
                if call.spec.cancel_requested || finished_condition(&call).is_some() || call.spec.owner.key() != *owner
                {
                    continue;
                }
                let ns = call.namespace().unwrap_or_default();
                request_cancel(&Api::namespaced(self.client.clone(), &ns), &call.name_any()).await;
                asked += 1;
            }
        }
        Ok(asked)
    }
}

/// The ToolCall for `request`.
fn tool_call_object(
    request: &CallRequest,
    owner: &OwnerKey,
    replica: &str,
    size_bytes: i64,
    timeout_seconds: i32,
) -> ToolCall {
    let mut annotations = std::collections::BTreeMap::new();
    if let Some(tp) = &request.traceparent {
        annotations.insert(TRACEPARENT_ANNOTATION.to_owned(), tp.clone());
    }
    let mut labels = std::collections::BTreeMap::from([
        (MANAGED_BY_LABEL.to_owned(), GATEWAY_MANAGER.to_owned()),
        (OWNER_LABEL.to_owned(), owner.to_string()),
        (REPLICA_LABEL.to_owned(), replica.to_owned()),
    ]);
    if let Some(key) = &request.cancel_key {
        labels.insert(CANCEL_KEY_LABEL.to_owned(), key.clone());
    }
    ToolCall {
        metadata: ObjectMeta {
            name: Some(request.id.to_string()),
            namespace: Some(request.tool.namespace.clone()),
            labels: Some(labels),
            annotations: (!annotations.is_empty()).then_some(annotations),
            ..ObjectMeta::default()
        },
        spec: ToolCallSpec {
            tool: request.tool.object_name.clone(),
            owner: request.caller.owner(),
            input: InputRef { key: call_key(owner, &request.id, CallFile::Input), size_bytes },
            parent_task: request.parent_task.as_ref().map(ToString::to_string),
            timeout_seconds,
            cancel_requested: false,
        },
        status: None,
    }
}

/// The `Succeeded` condition when it is final.
fn finished_condition(tc: &ToolCall) -> Option<Condition> {
    let status = tc.status.as_ref()?;
    if !conditions::is_finished(&status.conditions) {
        return None;
    }
    conditions::find(&status.conditions, conditions::SUCCEEDED).cloned()
}

/// A result for a call that ended without a stored result.
pub fn result_from_condition(condition: &Condition, duration_ms: u64) -> CallResult {
    let message = |fallback: &str| {
        if condition.message.is_empty() { fallback.to_owned() } else { condition.message.clone() }
    };
    if condition.status == conditions::status::TRUE {
        return CallResult::err(CallErrorKind::BadResult, "the call finished but stored no result", None, duration_ms);
    }
    let (kind, text) = match condition.reason.as_str() {
        reason::TIMED_OUT => (CallErrorKind::TimedOut, message("the call timed out")),
        reason::CANCELLED => (CallErrorKind::Cancelled, message("the call was cancelled")),
        reason::REJECTED => {
            (CallErrorKind::ToolError, format!("the call was rejected: {}", message("no reason given")))
        }
        reason::UNSCHEDULABLE | reason::IMAGE_PULL_FAILED => {
            (CallErrorKind::SpawnFailed, format!("the tool could not start: {}", message(&condition.reason)))
        }
        _ => (CallErrorKind::ToolError, message("the call failed")),
    };
    CallResult::err(kind, text, None, duration_ms)
}

fn elapsed_ms(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Records a stored result's summary in the ToolCall's `status.result` (server-side apply,
/// field manager `toolyard-gateway`), for the internal API to call after `result.json` is
/// stored. The controller owns the conditions; the gateway owns only this field.
#[derive(Clone)]
pub struct KubeResultRecorder {
    client: Client,
}

impl std::fmt::Debug for KubeResultRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeResultRecorder").finish_non_exhaustive()
    }
}

impl KubeResultRecorder {
    /// A recorder using `client` (needs `patch` on `toolcalls/status`).
    pub fn new(client: Client) -> Self {
        Self { client }
    }
}

/// The summary written to `status.result`.
pub fn result_summary(owner: &OwnerKey, call: &RunId, result: &CallResult) -> ResultSummary {
    ResultSummary {
        key: call_key(owner, call, CallFile::Result),
        is_error: result.is_error(),
        message: result.error.as_ref().map(|e| truncate(&e.message, conditions::MAX_MESSAGE)),
        exit_code: result.exit_code,
    }
}

fn truncate(s: &str, max: usize) -> String {
    let mut cut = s.len().min(max);
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    s[..cut].to_owned()
}

#[async_trait]
impl ResultRecorder for KubeResultRecorder {
    async fn record(&self, namespace: &str, call: &RunId, owner: &OwnerKey, result: &CallResult) -> Result<()> {
        let api: Api<ToolCall> = Api::namespaced(self.client.clone(), namespace);
        let patch = json!({
            "apiVersion": toolyard_api::API_VERSION,
            "kind": "ToolCall",
            "status": {"result": result_summary(owner, call, result)},
        });
        let params = PatchParams::apply(GATEWAY_MANAGER).force();
        let patch = Patch::Apply(&patch);
        let fut = api.patch_status(call.as_str(), &params, &patch);
        match tokio::time::timeout(Duration::from_secs(10), fut).await {
            Ok(r) => r.map(|_| ()).map_err(Error::from),
            Err(_) => Err(Error::Unavailable("the Kubernetes API did not answer in time".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use toolyard_api::protocol::CallErrorKind as K;

    use super::*;

    #[test]
    fn conditions_map_to_results() {
        let cases = [
            (
                conditions::failed(reason::TIMED_OUT, "deadline of 2s exceeded", None),
                K::TimedOut,
                "deadline of 2s exceeded",
            ),
            (conditions::failed(reason::CANCELLED, "", None), K::Cancelled, "the call was cancelled"),
            (conditions::failed(reason::FAILED, "exit code 1: boom", None), K::ToolError, "exit code 1: boom"),
            (
                conditions::failed(reason::REJECTED, "tool missing", None),
                K::ToolError,
                "the call was rejected: tool missing",
            ),
            (
                conditions::failed(reason::IMAGE_PULL_FAILED, "no such image", None),
                K::SpawnFailed,
                "the tool could not start: no such image",
            ),
            (conditions::succeeded("", None), K::BadResult, "the call finished but stored no result"),
        ];
        for (condition, kind, message) in cases {
            let r = result_from_condition(&condition, 5);
            let e = r.error.unwrap();
            assert_eq!((e.kind, e.message.as_str()), (kind, message), "{condition:?}");
        }
    }

    #[test]
    fn summaries_point_at_the_result_and_cut_long_messages() {
        let owner = OwnerKey::derive("apikey", "alice");
        let id = RunId::parse("c1").unwrap();
        let s = result_summary(&owner, &id, &CallResult::err(K::ToolError, "é".repeat(3000), Some(1), 3));
        assert_eq!(s.key, format!("owners/{owner}/calls/c1/result.json"));
        assert!(s.is_error);
        assert!(s.message.unwrap().len() <= conditions::MAX_MESSAGE);
        assert_eq!(s.exit_code, Some(1));
    }
}

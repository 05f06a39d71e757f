//! Calls to a warm pool (`toolyard-runner serve`): a pod of a Pool-mode McpTool on Kubernetes,
//! or a local warm worker in embedded mode.
//!
//! [`PoolClient`] is the HTTP client (`POST` [`pool::CALL_PATH`] with a call token signed by
//! the pool's derived key). [`run_pool_call`] is a whole call: it calls the pool (on
//! Kubernetes, one pod after another while they refuse it: [`Route::Pods`]) and has
//! [`CallRecords`] store the input, result and logs under the caller's prefix, as a Job
//! call's files.
//!
//! A pool call's files are a record, not its input channel (the arguments travel in the
//! request), so they are written after the answer, off the caller's path: on a local disk
//! the files of one call cost about as much as the whole call otherwise.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use reqwest::StatusCode;
use toolyard_api::protocol::pool::{self, PoolCallRequest, PoolCallResponse, PoolRefusal, Refused};
use toolyard_api::protocol::{CallErrorKind, CallResult, Event};
use toolyard_api::storage::CallFile;
use toolyard_api::token::{Claims, RunKind, SigningKey};

use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;
use toolyard_api::OwnerKey;

use super::pool_pods::PoolPods;
use super::{CallRequest, events};
use crate::store::ArtifactStore;
use crate::store::events::EventLogs;
use crate::{Error, Result};

/// Records being written at most at once; a call finding none free waits for one, so a slow
/// store slows callers down instead of piling up memory.
const MAX_PENDING_RECORDS: usize = 256;

/// Writes pool calls' files (`input.json`, `result.json`, `stdout.log`, `stderr.log`) in
/// the background. Write failures are logged: the caller already has its result.
#[derive(Clone)]
pub struct CallRecords {
    store: Arc<dyn ArtifactStore>,
    logs: Arc<EventLogs>,
    pending: TaskTracker,
    room: Arc<Semaphore>,
}

impl std::fmt::Debug for CallRecords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallRecords").field("pending", &self.pending.len()).finish_non_exhaustive()
    }
}

/// The files of one finished pool call.
#[derive(Debug)]
pub struct CallRecord {
    /// Whose call it was (the storage prefix).
    pub owner: OwnerKey,
    /// The call id.
    pub id: String,
    /// The arguments as JSON.
    pub input: Vec<u8>,
    /// The result as returned, as JSON.
    pub result: Vec<u8>,
    /// What the tool printed to stdout and stderr (empty logs are not stored).
    pub stdout: Option<String>,
    /// See `stdout`.
    pub stderr: Option<String>,
    /// The call's whole event log (stored as its first segment; none when empty).
    pub events: Vec<Event>,
}

impl CallRecord {
    /// The record of call `id`: its input JSON, its result (serialized here, instead of
    /// copied for the writer) and its logs.
    pub fn new(
        owner: OwnerKey,
        id: &str,
        input: Vec<u8>,
        result: &CallResult,
        stdout: Option<String>,
        stderr: Option<String>,
    ) -> Self {
        let result = serde_json::to_vec(result).unwrap_or_default();
        Self { owner, id: id.to_owned(), input, result, stdout, stderr, events: Vec::new() }
    }

    /// The same record with the call's event log.
    pub fn with_events(mut self, events: Vec<Event>) -> Self {
        self.events = events;
        self
    }
}

impl CallRecords {
    /// Records written to `store`.
    pub fn new(store: Arc<dyn ArtifactStore>) -> Self {
        let room = Arc::new(Semaphore::new(MAX_PENDING_RECORDS));
        Self { store, logs: Arc::default(), pending: TaskTracker::new(), room }
    }

    /// The store records are written to.
    pub fn store(&self) -> &dyn ArtifactStore {
        self.store.as_ref()
    }

    /// This process's appends to calls' event logs.
    pub fn event_logs(&self) -> &Arc<EventLogs> {
        &self.logs
    }

    /// Starts writing `record`; returns once it is queued (waiting while
    /// `MAX_PENDING_RECORDS` are in flight).
    pub async fn record(&self, record: CallRecord) {
        let Ok(permit) = Arc::clone(&self.room).acquire_owned().await else { return };
        let store = Arc::clone(&self.store);
        self.pending.spawn(async move {
            write_record(store.as_ref(), record).await;
            drop(permit);
        });
    }

    /// Starts appending the `call_finished` event of Job-mode call `id` (its runner wrote the
    /// rest of the log as it ran); returns once it is queued, as [`CallRecords::record`].
    pub async fn finished(&self, owner: OwnerKey, id: String, result: &CallResult) {
        let Ok(permit) = Arc::clone(&self.room).acquire_owned().await else { return };
        let (store, logs) = (Arc::clone(&self.store), Arc::clone(&self.logs));
        let event = events::finished(result);
        self.pending.spawn(async move {
            if let Err(e) = events::append(store.as_ref(), &logs, &owner, &id, &[event]).await {
                tracing::error!(error = %e, call = %id, "storing a call's call_finished event failed");
            }
            drop(permit);
        });
    }

    /// Waits until every record started so far is written (at shutdown, after the listeners
    /// stopped taking calls).
    pub async fn flush(&self) {
        self.pending.close();
        self.pending.wait().await;
        self.pending.reopen();
    }
}

async fn write_record(store: &dyn ArtifactStore, record: CallRecord) {
    let CallRecord { owner, id, input, result, stdout, stderr, events } = record;
    let mut files = vec![(CallFile::Input, input), (CallFile::Result, result)];
    let log = (!events.is_empty()).then(|| (events::segment_path(&id, 1), crate::store::events::segment(&events)));
    if let Some(out) = stdout.filter(|s| !s.is_empty()) {
        files.push((CallFile::Stdout, out.into_bytes()));
    }
    if let Some(err) = stderr.filter(|s| !s.is_empty()) {
        files.push((CallFile::Stderr, err.into_bytes()));
    }
    let files = files.into_iter().map(|(file, bytes)| (call_file(&id, file), Bytes::from(bytes))).chain(log).collect();
    if let Err(e) = store.put_all(&owner, files).await {
        tracing::error!(error = %e, call = %id, "storing a pool call's files failed");
    }
}

/// Largest pool response accepted (result, bounded logs and the returned files in base64).
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;

/// Why a pool call did not produce a [`PoolCallResponse`].
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// The pool did not run the call (HTTP 503), for the reason its answer gives (an answer
    /// that gives none counts as busy).
    #[error("the warm pool did not run the call: {0}")]
    NotRun(Refused),
    /// No answer before the deadline.
    #[error("the warm pool did not answer in time")]
    TimedOut,
    /// No connection could be made: the call was not sent.
    #[error("the warm pool is unreachable: {0}")]
    NotConnected(String),
    /// The connection failed after the call may have been sent.
    #[error("the warm pool is unreachable: {0}")]
    Unreachable(String),
    /// The pool's EndpointSlices list no ready pod.
    #[error("the warm pool has no ready pod")]
    NoReadyPod,
    /// The pool refused the call token (HTTP 401/403): the keys do not match.
    #[error("the warm pool refused the call token (HTTP {0})")]
    Refused(u16),
    /// Any other answer.
    #[error("the warm pool answered badly: {0}")]
    BadResponse(String),
}

/// HTTP client for pool servers.
#[derive(Clone, Debug)]
pub struct PoolClient {
    http: reqwest::Client,
}

impl PoolClient {
    /// A client with the given connect timeout (each call sets its own total timeout).
    pub fn new(connect_timeout: Duration) -> Result<Self> {
        let http = reqwest::Client::builder()
            .connect_timeout(connect_timeout)
            .pool_idle_timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| Error::Internal(format!("building the pool HTTP client: {e}")))?;
        Ok(Self { http })
    }

    /// Posts one call to `endpoint` (a base URL such as `http://pool.ns.svc:8080`) with `token`,
    /// waiting at most `timeout`.
    pub async fn call(
        &self,
        endpoint: &str,
        token: &str,
        request: &PoolCallRequest,
        timeout: Duration,
    ) -> Result<PoolCallResponse, PoolError> {
        let url = format!("{}{}", endpoint.trim_end_matches('/'), pool::CALL_PATH);
        let sent = self.http.post(&url).bearer_auth(token).json(request).timeout(timeout).send().await;
        let mut response = match sent {
            Ok(r) => r,
            Err(e) if e.is_timeout() => return Err(PoolError::TimedOut),
            Err(e) if e.is_connect() => return Err(PoolError::NotConnected(without_url(&e))),
            Err(e) => return Err(PoolError::Unreachable(without_url(&e))),
        };
        let status = response.status();
        if status == StatusCode::SERVICE_UNAVAILABLE || status == StatusCode::TOO_MANY_REQUESTS {
            // The reason is in the body (a few dozen bytes); a body that does not say counts as busy.
            let body = tokio::time::timeout(Duration::from_secs(1), read_body(&mut response, MAX_REFUSAL_BYTES)).await;
            let refusal = body.ok().and_then(Result::ok).and_then(|b| serde_json::from_slice::<PoolRefusal>(&b).ok());
            return Err(PoolError::NotRun(refusal.map_or(Refused::Busy, |r| r.reason)));
        }
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(PoolError::Refused(status.as_u16()));
        }
        let body = read_body(&mut response, MAX_RESPONSE_BYTES).await?;
        if !status.is_success() {
            let text: String = String::from_utf8_lossy(&body).chars().take(300).collect();
            return Err(PoolError::BadResponse(format!("HTTP {}: {text}", status.as_u16())));
        }
        serde_json::from_slice(&body).map_err(|e| PoolError::BadResponse(format!("not a pool call response: {e}")))
    }
}

/// Largest refusal (503) body read for its reason.
const MAX_REFUSAL_BYTES: usize = 4096;

/// The answer's body, refused beyond `limit` bytes.
async fn read_body(response: &mut reqwest::Response, limit: usize) -> Result<Vec<u8>, PoolError> {
    let mut body = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > limit {
                    return Err(PoolError::BadResponse(format!("answer larger than {limit} bytes")));
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(body),
            Err(e) if e.is_timeout() => return Err(PoolError::TimedOut),
            Err(e) => return Err(PoolError::Unreachable(without_url(&e))),
        }
    }
}

fn without_url(e: &reqwest::Error) -> String {
    // The URL is an internal address: keep it in logs only through the caller's fields.
    let mut text = e.to_string();
    if let Some(url) = e.url() {
        text = text.replace(url.as_str(), "<pool>");
    }
    text
}

/// Where a pool call goes.
#[derive(Debug)]
pub enum Route<'a> {
    /// One base URL (such as the pool's Service, `http://pool.ns.svc:8080`).
    Url(&'a str),
    /// The ready pods behind Service `service` of `namespace`: the one with the fewest of this
    /// replica's calls first, then the next while they refuse the call or cannot be reached.
    Pods {
        /// The pods of every pool.
        pods: &'a Arc<PoolPods>,
        /// The pool's namespace.
        namespace: &'a str,
        /// The pool's Service.
        service: &'a str,
    },
}

impl Route<'_> {
    /// Posts the call on this route. On [`Route::Pods`] a pod that did not run it hands it to
    /// the next; when every pod did, the refusal that says the most is returned.
    async fn post(
        &self,
        client: &PoolClient,
        token: &str,
        request: &PoolCallRequest,
        timeout: Duration,
    ) -> Result<PoolCallResponse, PoolError> {
        let (pods, namespace, service) = match self {
            Route::Url(url) => return client.call(url, token, request, timeout).await,
            Route::Pods { pods, namespace, service } => (pods, namespace, service),
        };
        let deadline = Instant::now() + timeout;
        let mut tried = Vec::new();
        let mut refused = PoolError::NoReadyPod;
        while let Some(pod) = pods.choose(namespace, service, &tried) {
            tried.push(pod.addr());
            let left = deadline.saturating_duration_since(Instant::now());
            match client.call(&pod.url(), token, request, left).await {
                Err(e @ (PoolError::NotRun(_) | PoolError::NotConnected(_))) => {
                    tracing::debug!(pod = %pod.addr(), error = %e, "a pool pod did not run the call; trying another");
                    if says_more(&e, &refused) {
                        refused = e;
                    }
                }
                answered => return answered,
            }
        }
        Err(refused)
    }
}

/// Whether refusal `a` tells the caller more than `b`: that their own calls filled a queue,
/// then that the pool is busy, then that it is shutting down, then that it is unreachable.
fn says_more(a: &PoolError, b: &PoolError) -> bool {
    fn rank(e: &PoolError) -> u8 {
        match e {
            PoolError::NotRun(Refused::PushedOut) => 4,
            PoolError::NotRun(Refused::Busy) => 3,
            PoolError::NotRun(Refused::ShuttingDown) => 2,
            PoolError::NotConnected(_) => 1,
            _ => 0,
        }
    }
    rank(a) > rank(b)
}

/// Everything a pool call needs besides the request.
#[derive(Debug)]
pub struct PoolTarget<'a> {
    /// Where the call goes.
    pub route: Route<'a>,
    /// The pool's derived key (`SigningKey::derive(&pool::key_purpose(ns, mcptool))`).
    pub key: &'a SigningKey,
    /// Namespace recorded in the token (empty in embedded mode).
    pub namespace: &'a str,
    /// Extra time on top of the tool's timeout before the gateway gives up.
    pub grace: Duration,
}

/// Runs one call on a pool: posts the call, has `records` store its files, and returns the
/// result. Tool failures and timeouts are `Ok` results; an unreachable or misconfigured pool
/// is an `Err` (and leaves no files).
pub async fn run_pool_call(
    client: &PoolClient,
    records: &CallRecords,
    target: PoolTarget<'_>,
    request: CallRequest,
) -> Result<CallResult> {
    let owner = request.caller.owner_key();
    let id = request.id.as_str();
    let timeout = request.tool.timeout();
    let input = serde_json::to_vec(&request.arguments).map_err(|e| Error::Internal(e.to_string()))?;

    let exp = jiff_now() + i64::try_from((timeout + target.grace).as_secs()).unwrap_or(i64::MAX / 2) + 60;
    let claims = Claims {
        kind: RunKind::Call,
        ns: target.namespace.to_owned(),
        id: id.to_owned(),
        owner: request.caller.owner(),
        exp,
    };
    let token = target.key.sign(&claims);
    let body = PoolCallRequest {
        id: id.to_owned(),
        arguments: request.arguments.clone(),
        timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        traceparent: request.traceparent.clone(),
        caller: request.tool.spec.caller_identity.then(|| request.caller.owner()),
    };
    let started = Instant::now();
    let outcome = tokio::select! {
        () = request.cancel.cancelled() => None,
        r = target.route.post(client, &token, &body, timeout + target.grace) => Some(r),
    };
    let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let mut files = Vec::new();
    let (mut result, stdout, stderr, progress) = match outcome {
        None => {
            (CallResult::err(CallErrorKind::Cancelled, "the call was cancelled", None, elapsed_ms), None, None, vec![])
        }
        Some(Ok(response)) => {
            files = response.files;
            (response.result, Some(response.stdout), Some(response.stderr), response.progress)
        }
        Some(Err(PoolError::TimedOut)) => (
            CallResult::err(
                CallErrorKind::TimedOut,
                format!("timed out after {}s", timeout.as_secs()),
                None,
                elapsed_ms,
            ),
            None,
            None,
            vec![],
        ),
        Some(Err(PoolError::NotRun(refused))) => return Err(super::pool_refused(refused)),
        Some(Err(e @ PoolError::Refused(_))) => {
            tracing::error!(error = %e, "pool refused the gateway's call token; are the signing keys the same?");
            return Err(Error::Internal(e.to_string()));
        }
        Some(Err(PoolError::NoReadyPod)) => {
            return Err(Error::Unavailable("the tool's warm pool has no ready pod; try again shortly".into()));
        }
        Some(Err(e)) => {
            tracing::warn!(error = %e, "pool call failed");
            return Err(Error::Unavailable("the tool's warm pool is not reachable; try again shortly".into()));
        }
    };
    let bytes: std::result::Result<Vec<Vec<u8>>, _> = files.iter().map(|f| B64.decode(f)).collect();
    match bytes {
        Ok(bytes) => store_outputs(records.store(), &owner, id, &mut result, bytes).await?,
        Err(_) => {
            result =
                CallResult::err(CallErrorKind::BadResult, "the warm pool's returned files are not base64", None, 0);
        }
    }
    let log = events::pool_log(&request, progress, &result);
    records.record(CallRecord::new(owner, id, input, &result, stdout, stderr).with_events(log)).await;
    Ok(result)
}

/// Stores the files a warm-pool call returned (`bytes`, in the order of `result.files`) under
/// `calls/<id>/outputs/` before the call is answered: its answer links them and shows its
/// images. Files that do not match the listing (a pool is not trusted more than a runner)
/// fail the call.
pub async fn store_outputs(
    store: &dyn ArtifactStore,
    owner: &OwnerKey,
    id: &str,
    result: &mut CallResult,
    bytes: Vec<Vec<u8>>,
) -> Result<()> {
    use toolyard_api::protocol::outputs;
    if result.files.is_empty() && bytes.is_empty() {
        return Ok(());
    }
    let fits = !result.is_error()
        && bytes.len() == result.files.len()
        && result.files.len() <= outputs::MAX_FILES
        && result.files.iter().zip(&bytes).all(|(f, b)| {
            f.size == b.len() as u64
                && f.size <= outputs::MAX_FILE_BYTES
                && toolyard_api::storage::RelativePath::parse(&f.name).is_ok()
                && outputs::is_media_type(&f.mime_type)
                && (!f.image || outputs::IMAGE_TYPES.contains(&f.mime_type.as_str()))
        });
    if !fits {
        *result = CallResult::err(
            CallErrorKind::BadResult,
            "the warm pool's returned files do not match its result",
            result.exit_code,
            result.duration_ms,
        );
        return Ok(());
    }
    let files = result
        .files
        .iter()
        .zip(bytes)
        .map(|(f, b)| (format!("calls/{id}/outputs/{}", f.name), Bytes::from(b)))
        .collect();
    store.put_all(owner, files).await
}

/// `calls/<id>/<file>` relative to the owner's prefix.
pub fn call_file(id: &str, file: CallFile) -> String {
    format!("calls/{id}/{}", file.file_name())
}

fn jiff_now() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_second()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use async_trait::async_trait;

    use super::*;
    use crate::store::{Chunk, ObjectInfo};

    #[test]
    fn when_every_pod_refuses_the_caller_gets_the_refusal_that_says_the_most() {
        let order = [
            PoolError::NotRun(Refused::PushedOut),
            PoolError::NotRun(Refused::Busy),
            PoolError::NotRun(Refused::ShuttingDown),
            PoolError::NotConnected("refused".into()),
            PoolError::NoReadyPod,
        ];
        for (i, a) in order.iter().enumerate() {
            for (j, b) in order.iter().enumerate() {
                assert_eq!(says_more(a, b), i < j, "{a:?} against {b:?}");
            }
        }
    }

    /// A store whose writes take a while (in memory; only `put` and `get` are used).
    #[derive(Default)]
    struct SlowStore(Mutex<BTreeMap<String, Bytes>>);

    #[async_trait]
    impl ArtifactStore for SlowStore {
        async fn put(&self, owner: &OwnerKey, path: &str, bytes: Bytes) -> Result<()> {
            tokio::time::sleep(Duration::from_millis(200)).await;
            self.0.lock().unwrap().insert(format!("{owner}/{path}"), bytes);
            Ok(())
        }
        async fn create(&self, _: &OwnerKey, _: &str, _: Bytes) -> Result<bool> {
            unimplemented!("not used")
        }
        async fn get(&self, owner: &OwnerKey, path: &str) -> Result<Option<Bytes>> {
            Ok(self.0.lock().unwrap().get(&format!("{owner}/{path}")).cloned())
        }
        async fn get_range(&self, _: &OwnerKey, _: &str, _: u64, _: u64) -> Result<Option<Chunk>> {
            unimplemented!("not used")
        }
        async fn list(&self, _: &OwnerKey, _: &str) -> Result<Vec<ObjectInfo>> {
            unimplemented!("not used")
        }
        async fn delete_folder(&self, _: &OwnerKey, _: &str) -> Result<usize> {
            unimplemented!("not used")
        }
        async fn delete(&self, _: &OwnerKey, _: &[String]) -> Result<()> {
            unimplemented!("not used")
        }
        async fn expire(&self, _: jiff::Timestamp) -> Result<usize> {
            unimplemented!("not used")
        }
        async fn health(&self) -> Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn flush_waits_for_every_record_and_records_keep_only_non_empty_logs() {
        let store = Arc::new(SlowStore::default());
        let records = CallRecords::new(store.clone());
        let owner = OwnerKey::derive("local", "dev");
        for n in 0..3 {
            let result = CallResult::ok(serde_json::json!({"n": n}), n);
            let stdout = Some(if n == 0 { String::new() } else { format!("out {n}") });
            records
                .record(CallRecord::new(owner.clone(), &format!("c{n}"), b"{}".to_vec(), &result, stdout, None))
                .await;
        }
        records.flush().await;
        for n in 0..3u64 {
            let result = store.get(&owner, &format!("calls/c{n}/result.json")).await.unwrap().expect("result");
            let result: CallResult = serde_json::from_slice(&result).unwrap();
            assert_eq!(result.value, Some(serde_json::json!({"n": n})));
            assert_eq!(
                store.get(&owner, &format!("calls/c{n}/input.json")).await.unwrap().as_deref(),
                Some(&b"{}"[..])
            );
            let stdout = store.get(&owner, &format!("calls/c{n}/stdout.log")).await.unwrap();
            assert_eq!(stdout, (n > 0).then(|| Bytes::from(format!("out {n}"))), "call {n}");
            assert_eq!(store.get(&owner, &format!("calls/c{n}/stderr.log")).await.unwrap(), None);
        }
        // Records can still be written after a flush.
        let result = CallResult::ok(serde_json::json!(1), 0);
        records.record(CallRecord::new(owner.clone(), "late", Vec::new(), &result, None, None)).await;
        records.flush().await;
        assert!(store.get(&owner, "calls/late/result.json").await.unwrap().is_some());
    }
}

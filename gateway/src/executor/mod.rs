//! Executors run one tool call and return the runner protocol's [`CallResult`].

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;
use toolyard_api::OwnerKey;
use toolyard_api::protocol::CallResult;
use toolyard_api::protocol::pool::Refused;
use toolyard_api::storage::{CallFile, RunId};

use crate::catalog::Tool;
use crate::identity::Identity;
use crate::store::ArtifactStore;

pub mod events;
pub mod kube;
pub mod load;
pub mod local;
pub mod pool;
pub mod pool_pods;
pub mod running;

/// Everything an executor needs for one call. Arguments are already validated.
#[derive(Debug)]
pub struct CallRequest {
    /// The call id (ToolCall name, storage folder).
    pub id: RunId,
    /// The tool.
    pub tool: Arc<Tool>,
    /// The caller; the call runs as this identity.
    pub caller: Identity,
    /// Validated arguments.
    pub arguments: Map<String, Value>,
    /// W3C `traceparent` of the request, if any.
    pub traceparent: Option<String>,
    /// The coding task making this call, if any.
    pub parent_task: Option<RunId>,
    /// Cancelled when the client cancels or disconnects: the executor stops the run.
    pub cancel: CancellationToken,
    /// Hash of the caller's owner key and the MCP request id ([`crate::mcp::cancel::cancel_key`]):
    /// recorded with the run so that a `notifications/cancelled` arriving at any replica can
    /// find it ([`Executor::cancel_by_key`]). `None` for calls no MCP request names.
    pub cancel_key: Option<String>,
    /// Where the function's progress reports go while the caller waits (`None`: nobody asked).
    pub progress: Option<events::ProgressSender>,
    /// Where an upstream server's log messages for the call go while the caller waits
    /// (`None`: nobody listens).
    pub logs: Option<crate::upstream::logs::LogSender>,
    /// Who answers the requests an upstream server sends the caller during the call (`None`:
    /// nobody can).
    pub asker: Option<std::sync::Arc<dyn crate::core::ClientAsker>>,
    /// When the gateway admitted the call (the `call_accepted` event's time).
    pub accepted_at: jiff::Timestamp,
    /// Set for a call run as an MCP task: its run outlives the request and this process
    /// (dropping the call's future does not stop it; [`CallRequest::cancel`] still does), its
    /// state is read back with [`Executor::call_state`], and the executor sends `()` here
    /// once the run is started where it outlives this process (the ToolCall created). An
    /// executor that cannot drops it unsent: the call is then answered when it ends.
    pub task_started: Option<tokio::sync::oneshot::Sender<()>>,
}

/// Where a call stands, as the platform knows it (see [`Executor::call_state`]).
#[derive(Clone, Debug, PartialEq)]
pub enum CallState {
    /// It runs.
    Running,
    /// It ended; the result as the platform recorded it (the stored `result.json` is read
    /// first, so this is the result of a run that stored none: a timeout, a cancellation).
    Ended(Box<CallResult>),
    /// The platform knows nothing of it (or no more).
    Unknown,
}

/// Where a call stands, from its stored files and its executor ([`standing`]).
#[derive(Debug)]
pub enum Standing {
    /// It runs.
    Running,
    /// It ended with this result.
    Ended(Box<CallResult>),
    /// It was accepted, has no stored result, and its executor knows nothing of it: its run
    /// was lost (its process or replica ended with it).
    Lost,
}

/// Where call `id` of `owner` stands; `None` when no such call was accepted. A stored
/// `result.json` is final; without one, the executor is asked. A run's result is stored
/// before its executor forgets the run, so a call the executor no longer knows has its result
/// read again before it counts as lost: it may have ended between the two reads.
pub async fn standing(
    store: &dyn ArtifactStore,
    executor: &dyn Executor,
    owner: &OwnerKey,
    id: &RunId,
) -> crate::Result<Option<Standing>> {
    let stored_result = async || -> crate::Result<Option<CallResult>> {
        let bytes = store.get(owner, &pool::call_file(id.as_str(), CallFile::Result)).await?;
        Ok(bytes.and_then(|b| serde_json::from_slice(&b).ok()))
    };
    if let Some(result) = stored_result().await? {
        return Ok(Some(Standing::Ended(Box::new(result))));
    }
    Ok(Some(match executor.call_state(owner, id).await? {
        CallState::Running => Standing::Running,
        CallState::Ended(result) => Standing::Ended(result),
        CallState::Unknown => match stored_result().await? {
            Some(result) => Standing::Ended(Box::new(result)),
            None if store.get(owner, &pool::call_file(id.as_str(), CallFile::Input)).await?.is_none() => {
                return Ok(None);
            }
            None => Standing::Lost,
        },
    }))
}

/// A warm pool's refusal as the caller sees it: every slot and the queue were taken; the call
/// waited and gave its place to another caller's, because this caller had the most calls
/// waiting (see `toolyard_process::admission`); or the pool is stopping.
pub fn pool_refused(refused: Refused) -> crate::Error {
    match refused {
        Refused::Busy => crate::Error::Busy("the tool's warm pool is at capacity".into()),
        Refused::PushedOut => crate::Error::Busy(
            "the tool's warm pool is at capacity, and your calls filled most of its queue: this one gave its \
             place to another caller's"
                .into(),
        ),
        Refused::ShuttingDown => {
            crate::Error::Unavailable("the tool's warm pool is shutting down; try again shortly".into())
        }
    }
}

/// Runs tool calls.
#[async_trait]
pub trait Executor: Send + Sync + 'static {
    /// Runs one call to completion (or deadline, or cancellation).
    ///
    /// Tool failures (non-zero exit, invalid result, timeout) are `Ok` with an error
    /// [`CallResult`]; `Err` is for failures of the platform itself.
    async fn call(&self, request: CallRequest) -> crate::Result<CallResult>;

    /// Cancels the runs of `owner` recorded with `cancel_key` wherever they were started (any
    /// replica); returns how many were asked to stop. Runs waited on in this process are also
    /// cancelled through their [`CallRequest::cancel`] token, so executors whose runs live only
    /// in one process need nothing here.
    async fn cancel_by_key(&self, owner: &OwnerKey, cancel_key: &str) -> crate::Result<usize> {
        let _ = (owner, cancel_key);
        Ok(0)
    }

    /// Calls of `owner` that other gateway replicas run now, as the cluster's state shows
    /// them; a per-user limit counts them with this replica's own. Executors whose runs live
    /// in one process have none.
    fn running_elsewhere(&self, owner: &OwnerKey) -> usize {
        let _ = owner;
        0
    }

    /// Where call `id` of `owner` stands, wherever it was started (for MCP tasks: a call
    /// started through another replica, or before a restart).
    async fn call_state(&self, owner: &OwnerKey, id: &RunId) -> crate::Result<CallState> {
        let _ = (owner, id);
        Ok(CallState::Unknown)
    }

    /// Removes what the platform keeps of call `id` of `owner` besides its files (its
    /// ToolCall on Kubernetes), for `delete_call`. Executors that keep nothing have nothing
    /// to remove.
    async fn forget(&self, owner: &OwnerKey, id: &RunId) -> crate::Result<Forgotten> {
        let _ = (owner, id);
        Ok(Forgotten::Nothing)
    }

    /// Waits until work the executor finishes after answering (pool calls' files) is done.
    /// Called at shutdown, once no new calls arrive.
    async fn flush(&self) {}

    /// Where this executor stores the files of calls it answers itself (warm-pool calls), for
    /// other call paths to store theirs the same way (upstream servers' calls); `None` when
    /// it stores none.
    fn records(&self) -> Option<Arc<pool::CallRecords>> {
        None
    }

    /// Where the internal API passes the progress events of calls this executor waits for
    /// (runners post them there); `None` when no runner reports through the internal API.
    fn progress_hub(&self) -> Option<Arc<events::ProgressHub>> {
        None
    }
}

/// What [`Executor::forget`] found of a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forgotten {
    /// The call is still running: nothing was removed.
    Running,
    /// Its run state was removed.
    Removed,
    /// The platform kept nothing of it (besides files).
    Nothing,
}

/// Records a call's result where the platform keeps run state (the ToolCall's `status.result`
/// on Kubernetes). The internal API calls it after storing `result.json` for a runner.
#[async_trait]
pub trait ResultRecorder: Send + Sync + 'static {
    /// Records `result` of call `call` (owned by `owner`) in `namespace`.
    async fn record(&self, namespace: &str, call: &RunId, owner: &OwnerKey, result: &CallResult) -> crate::Result<()>;
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::store::fs::tests::Scratch;

    /// A pushed-out call says so, a full pool is busy, a stopping pool is unavailable (not a
    /// limit of the caller's).
    #[test]
    fn each_pool_refusal_is_the_callers_error() {
        let busy = |e: crate::Error| match e {
            crate::Error::Busy(what) => what,
            other => panic!("not busy: {other:?}"),
        };
        assert_eq!(busy(pool_refused(Refused::Busy)), "the tool's warm pool is at capacity");
        assert!(busy(pool_refused(Refused::PushedOut)).ends_with("this one gave its place to another caller's"));
        assert!(matches!(pool_refused(Refused::ShuttingDown), crate::Error::Unavailable(_)));
    }

    /// An executor whose call ends while it is asked: the result is stored, then the run is
    /// forgotten, as the local and Kubernetes executors do.
    struct EndsWhileAsked(Arc<dyn ArtifactStore>);

    #[async_trait]
    impl Executor for EndsWhileAsked {
        async fn call(&self, _: CallRequest) -> crate::Result<CallResult> {
            unimplemented!("not used")
        }
        async fn call_state(&self, owner: &OwnerKey, id: &RunId) -> crate::Result<CallState> {
            let result = serde_json::to_vec(&CallResult::ok(serde_json::json!({"price": 1.5}), 3)).unwrap();
            self.0.put(owner, &pool::call_file(id.as_str(), CallFile::Result), Bytes::from(result)).await?;
            Ok(CallState::Unknown)
        }
    }

    #[tokio::test]
    async fn a_call_that_ends_between_the_reads_is_ended_not_lost_and_a_call_never_accepted_is_none() {
        let scratch = Scratch::new("standing");
        let (store, owner) = scratch.store("store");
        let store: Arc<dyn ArtifactStore> = Arc::new(store);
        let id = RunId::parse("price-option-0123456789ab").unwrap();
        store.put(&owner, &pool::call_file(id.as_str(), CallFile::Input), Bytes::from_static(b"{}")).await.unwrap();
        let executor = EndsWhileAsked(Arc::clone(&store));
        match standing(store.as_ref(), &executor, &owner, &id).await.unwrap() {
            Some(Standing::Ended(result)) => assert_eq!(result.value, Some(serde_json::json!({"price": 1.5}))),
            other => panic!("ended, not {other:?}"),
        }

        struct Forgets;
        #[async_trait]
        impl Executor for Forgets {
            async fn call(&self, _: CallRequest) -> crate::Result<CallResult> {
                unimplemented!("not used")
            }
        }
        let lost = RunId::parse("price-option-111111111111").unwrap();
        store.put(&owner, &pool::call_file(lost.as_str(), CallFile::Input), Bytes::from_static(b"{}")).await.unwrap();
        assert!(matches!(standing(store.as_ref(), &Forgets, &owner, &lost).await.unwrap(), Some(Standing::Lost)));
        let never = RunId::parse("price-option-222222222222").unwrap();
        assert!(standing(store.as_ref(), &Forgets, &owner, &never).await.unwrap().is_none());
    }
}

//! A direct call's lifecycle in storage and its live progress.
//!
//! Its events go to `calls/<id>/events/` as numbered segments ([`crate::store::events`]):
//! - Job mode: the executor stores `call_accepted` with the input, before the run starts; the
//!   runner appends `call_started` and the function's `call_progress` reports while it runs;
//!   the executor appends `call_finished` once the result is in (in the background).
//! - Pool mode: the executor stores the whole log with the call's other files after the
//!   answer: `call_accepted`, `call_started` (the answer's time less the function's own
//!   duration), the progress reports the pool returned, `call_finished`.
//!
//! A caller waiting for a call gets its progress through a [`ProgressSender`]: from this
//! process's internal API ([`ProgressHub`], when the runner's post reaches this replica),
//! from the stored events ([`poll_progress`], when it reaches another one), or directly from
//! a local warm pool.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use toolyard_api::OwnerKey;
use toolyard_api::protocol::{CallResult, Event, Progress, call_event};

use super::CallRequest;
use crate::store::ArtifactStore;
use crate::store::events;

pub use toolyard_process::progress::ProgressSender;

/// `calls/<id>/events/`, relative to the owner's prefix.
pub fn folder(id: &str) -> String {
    format!("calls/{id}/events/")
}

/// Segment `n` of call `id`'s log.
pub fn segment_path(id: &str, n: u32) -> String {
    format!("calls/{id}/events/{n:06}.jsonl")
}

fn event(time: jiff::Timestamp, type_: &str, data: Value) -> Event {
    Event { time: time.to_string(), type_: type_.to_owned(), data }
}

/// `call_accepted` of `request`, at the time the gateway admitted it.
pub fn accepted(request: &CallRequest) -> Event {
    let mode = serde_json::to_value(request.tool.spec.execution.mode).unwrap_or(Value::Null);
    event(request.accepted_at, call_event::ACCEPTED, json!({"tool": request.tool.name(), "mode": mode}))
}

/// `call_started` at `time`.
pub fn started(time: jiff::Timestamp) -> Event {
    event(time, call_event::STARTED, json!({}))
}

/// `call_finished` for `result`, now: the outcome (`ok` or the error kind), the function's
/// duration and the error message.
pub fn finished(result: &CallResult) -> Event {
    let outcome = match &result.error {
        None => Value::from("ok"),
        Some(e) => serde_json::to_value(e.kind).unwrap_or(Value::Null),
    };
    let mut data = json!({"outcome": outcome, "durationMs": result.duration_ms});
    if let Some(e) = &result.error {
        data["error"] = Value::from(e.message.chars().take(500).collect::<String>());
    }
    event(jiff::Timestamp::now(), call_event::FINISHED, data)
}

/// Stores a Job-mode call's input and the first segment of its log (`call_accepted`) at once,
/// before its runner starts (whose `call_started` then comes second).
pub async fn store_start(
    store: &dyn ArtifactStore,
    logs: &events::EventLogs,
    owner: &OwnerKey,
    request: &CallRequest,
    input: bytes::Bytes,
) -> crate::Result<()> {
    let id = request.id.as_str();
    let log = events::segment(&[accepted(request)]);
    let (input_path, log_path) =
        (super::pool::call_file(id, toolyard_api::storage::CallFile::Input), segment_path(id, 1));
    let bytes = log.len() as u64;
    tokio::try_join!(store.put(owner, &input_path, input), store.put(owner, &log_path, log))?;
    logs.started(owner, &folder(id), bytes);
    Ok(())
}

/// The whole log of a pool call that ended with `result`, now: accepted, started (now less
/// the function's own duration, as the pool measured it), the `progress` events the pool
/// returned, finished.
pub fn pool_log(request: &CallRequest, progress: Vec<Event>, result: &CallResult) -> Vec<Event> {
    let now = jiff::Timestamp::now();
    let ran = jiff::SignedDuration::from_millis(i64::try_from(result.duration_ms).unwrap_or(i64::MAX));
    let started_at = now.checked_sub(ran).unwrap_or(now).max(request.accepted_at);
    let mut log = vec![accepted(request), started(started_at)];
    log.extend(progress.into_iter().filter(|e| e.type_ == call_event::PROGRESS));
    log.push(finished(result));
    log
}

/// Appends `events` to call `id`'s log (the gateway's own events: not bounded by the runner's
/// event budget, so a log that a chatty function filled still ends with `call_finished`).
pub async fn append(
    store: &dyn ArtifactStore,
    logs: &events::EventLogs,
    owner: &OwnerKey,
    id: &str,
    events: &[Event],
) -> crate::Result<()> {
    let segment = events::segment(events);
    let appended = logs.append(store, owner, &folder(id), |n| segment_path(id, n), segment, u64::MAX).await;
    appended.map_err(|e| match e {
        events::AppendError::Store(e) => e,
        other => crate::Error::Internal(other.to_string()),
    })
}

/// Reads the segments of call `id`'s log from `*next` on and sends the latest progress
/// report among them (if any); moves `*next` past what it read.
pub async fn poll_progress(
    store: &dyn ArtifactStore,
    owner: &OwnerKey,
    id: &str,
    next: &mut u32,
    sender: &ProgressSender,
) -> crate::Result<()> {
    let (events, after) = events::read_from(store, owner, |n| segment_path(id, n), *next).await?;
    *next = after;
    if let Some(progress) = events.iter().rev().find_map(Progress::of_event) {
        sender.send_replace(Some(progress));
    }
    Ok(())
}

/// Runs a Job-mode call with `run`: while it runs, the caller gets the progress reports that
/// reach `hub` for it (when it asked for them); once it has a result, `records` appends its
/// `call_finished` event.
pub async fn run_job_call<F>(
    hub: &Arc<ProgressHub>,
    records: &super::pool::CallRecords,
    request: CallRequest,
    run: impl FnOnce(CallRequest) -> F,
) -> crate::Result<CallResult>
where
    F: Future<Output = crate::Result<CallResult>>,
{
    let owner = request.caller.owner_key();
    let id = request.id.to_string();
    let _waiting = request.progress.clone().map(|sender| hub.wait(&owner, &id, sender));
    let result = run(request).await;
    if let Ok(result) = &result {
        records.finished(owner, id, result).await;
    }
    result
}

/// Callers in this process waiting for calls' progress, by owner and call id.
#[derive(Debug, Default)]
pub struct ProgressHub {
    waiting: Mutex<HashMap<(OwnerKey, String), ProgressSender>>,
}

/// A waiting caller's place in the [`ProgressHub`]; leaves it when dropped.
#[derive(Debug)]
pub struct Waiting {
    hub: Arc<ProgressHub>,
    key: (OwnerKey, String),
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.hub.lock().remove(&self.key);
    }
}

impl ProgressHub {
    /// Passes call `id`'s progress reports (owner `owner`) to `sender` until the returned
    /// guard is dropped.
    pub fn wait(self: &Arc<Self>, owner: &OwnerKey, id: &str, sender: ProgressSender) -> Waiting {
        let key = (owner.clone(), id.to_owned());
        self.lock().insert(key.clone(), sender);
        Waiting { hub: Arc::clone(self), key }
    }

    /// A report of call `id` of `owner` (from its runner): to the caller waiting, if any.
    pub fn report(&self, owner: &OwnerKey, id: &str, progress: Progress) {
        if let Some(sender) = self.lock().get(&(owner.clone(), id.to_owned())) {
            sender.send_replace(Some(progress));
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(OwnerKey, String), ProgressSender>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::watch;

    use super::*;

    #[test]
    fn reports_reach_the_waiting_caller_of_that_owner_and_call_only() {
        let hub = Arc::new(ProgressHub::default());
        let (alice, bob) = (OwnerKey::derive("apikey", "alice"), OwnerKey::derive("apikey", "bob"));
        let (tx, rx) = watch::channel(None);
        let waiting = hub.wait(&alice, "call-1", tx);
        let half = Progress { fraction: 0.5, message: None };
        hub.report(&bob, "call-1", Progress { fraction: 0.9, message: None });
        hub.report(&alice, "call-2", Progress { fraction: 0.9, message: None });
        assert_eq!(*rx.borrow(), None, "another owner's or call's report");
        hub.report(&alice, "call-1", half.clone());
        assert_eq!(*rx.borrow(), Some(half));
        drop(waiting);
        assert!(hub.lock().is_empty(), "the guard leaves the hub");
    }

    #[test]
    fn finished_events_say_the_outcome() {
        let ok = finished(&CallResult::ok(json!(1), 7));
        assert_eq!((ok.type_.as_str(), &ok.data), ("call_finished", &json!({"outcome": "ok", "durationMs": 7})));
        let failed = finished(&CallResult::err(toolyard_api::protocol::CallErrorKind::TimedOut, "late", None, 9));
        assert_eq!(failed.data, json!({"outcome": "timed_out", "durationMs": 9, "error": "late"}));
    }
}

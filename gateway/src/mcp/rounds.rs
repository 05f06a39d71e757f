//! The requests an upstream server sends a 2026-07-28 caller during a call, in the
//! multi-round-trip form (SEP-2322: `inputRequests`, then a retry with `inputResponses` and
//! `requestState`).
//!
//! Such a caller's `tools/call` has no stream the gateway could ask on. So the upstream call
//! is **held**: it runs on in a task of its own while its requests go to the caller as an
//! `input_required` result, and the caller's retry carries the answers.
//!
//! - **First round.** The call starts as any other. When it ends before asking anything, the
//!   request is answered with its result. When the server asks, the request is answered with
//!   `input_required`: the requests (each under an ask id of [`super::asks`]; requests asked
//!   at about the same moment come together) and a `requestState` of `<held id>.1`. The held
//!   call is recorded in the caller's own storage (`asks/toolyard-round-<held id>/held.json`,
//!   with its deadline).
//! - **Each retry**, at any replica: the `requestState` must name a held call of the caller
//!   (else invalid params, at once). Its answers are passed on as a 2025-era client's answers
//!   are ([`super::asks::pass_on`]: handed to the wait on this replica, or stored for the
//!   replica that holds the call). Then it waits for the held call's next event: more
//!   requests (answered `input_required` again, `requestState` `<held id>.<n + 1>`) or the
//!   call's end. The replica that holds the call passes each event on the same way, under
//!   the id `toolyard-round-<held id>-<n>`.
//!
//! A round's cancellation stops the held call when the call is held on the replica serving
//! the round. The held call ends at its own deadline like any call; a request of it waits no longer. A
//! caller that never retries leaves its stored event behind until retention deletes it. The
//! requests reach only a caller that declared the capability they need (`sampling`,
//! `elicitation`); the server is told at once that any other caller cannot be asked.
//! Progress and log messages of a held call reach the request of the round being answered
//! when the replica holding the call serves it. Between rounds, and while another replica
//! serves one, they are kept (the latest progress, the latest 32 log messages) and sent by the
//! next round before its answer, an error included: passed on with its event, or at once when
//! that round reaches the replica holding the call.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rmcp::ErrorData;
use rmcp::model::{
    CallToolResponse, CallToolResult, ClientCapabilities, InputRequest, InputRequiredResult, InputResponses,
};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use toolyard_api::OwnerKey;

use super::asks::{self, Asks, Undelivered};
use super::cancel::{CancelRegistry, cancel_key};
use crate::core::quota::StorageQuota;
use crate::core::{ClientAsker, LogSink, ProgressSink};
use crate::store::ArtifactStore;
use crate::upstream::logs::LogMessage;

/// How a held call's ids begin.
const ROUND_PREFIX: &str = "toolyard-round-";

/// How long after its deadline a retry still waits for a held call's last event (the call
/// ends at its deadline; its end may take a moment to be stored).
const DEADLINE_GRACE: Duration = Duration::from_secs(10);

/// What a held call sends, one message at a time.
enum Message {
    /// A request for the caller, under its ask id.
    Ask(String, Box<InputRequest>),
    /// The call's end.
    Done(Result<CallToolResult, ErrorData>),
}

/// What a held call does next, as a round answers it.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
enum Event {
    /// Requests for the caller, by ask id.
    Input(BTreeMap<String, InputRequest>),
    /// The call's result.
    Done(CallToolResult),
    /// The call's error.
    Failed(ErrorData),
}

/// An event as it is passed on to the round that answers it, with the messages kept for that
/// round.
#[derive(serde::Serialize, serde::Deserialize)]
struct Passed {
    #[serde(flatten)]
    event: Event,
    #[serde(default)]
    kept: Kept,
}

/// A held call's events: the requests waiting in the queue together come as one.
struct Events {
    queue: mpsc::Receiver<Message>,
    next: Option<Message>,
}

impl Events {
    /// The next event (the call's error when it ended with one). `None` once the call is gone.
    async fn next(&mut self) -> Option<Event> {
        let first = match self.next.take() {
            Some(message) => message,
            None => self.queue.recv().await?,
        };
        let (key, request) = match first {
            Message::Done(result) => return Some(result.map_or_else(Event::Failed, Event::Done)),
            Message::Ask(key, request) => (key, request),
        };
        let mut requests = BTreeMap::from([(key, *request)]);
        while let Ok(message) = self.queue.try_recv() {
            match message {
                Message::Ask(key, request) => {
                    requests.insert(key, *request);
                }
                done => {
                    self.next = Some(done);
                    break;
                }
            }
        }
        Some(Event::Input(requests))
    }
}

/// Asks a 2026-07-28 caller: each request becomes an event of its held call, and waits for
/// the answer a retry passes on.
struct RoundAsker {
    asks: Arc<Asks>,
    store: Arc<dyn ArtifactStore>,
    owner: OwnerKey,
    capabilities: ClientCapabilities,
    events: mpsc::Sender<Message>,
}

#[async_trait::async_trait]
impl ClientAsker for RoundAsker {
    async fn ask(&self, method: &str, params: Value) -> Result<Value, ErrorData> {
        let declared = match method {
            "sampling/createMessage" => self.capabilities.sampling.is_some(),
            "elicitation/create" => self.capabilities.elicitation.is_some(),
            _ => false,
        };
        if !declared {
            return Err(ErrorData::invalid_request(
                format!("the caller cannot be asked {method}: it did not declare the capability"),
                None,
            ));
        }
        let request: InputRequest = serde_json::from_value(serde_json::json!({"method": method, "params": params}))
            .map_err(|e| {
                ErrorData::invalid_params(format!("the {method} request is not one a caller can be asked: {e}"), None)
            })?;
        let send = async |id: String| self.events.send(Message::Ask(id, Box::new(request))).await.is_ok();
        self.asks.ask(self.store.as_ref(), &self.owner, send, self.events.closed()).await
    }
}

/// A call about to be held: its asker, for the call's input, and its events.
pub(super) struct Holding {
    events: Events,
    sender: mpsc::Sender<Message>,
    /// Stops the held call.
    pub stop: CancellationToken,
    /// Where the held call's progress and log messages go: the round being answered.
    pub sinks: Arc<RoundSinks>,
}

/// Most log messages of a held call kept for the next round (the latest are kept).
const KEPT_LOGS: usize = 32;

/// The progress and log messages of a held call: passed to the request of the round being
/// answered on the replica holding the call; otherwise (between rounds, and while another
/// replica answers one) kept for the next round, which sends them before its answer.
#[derive(Default)]
pub(super) struct RoundSinks {
    current: std::sync::Mutex<Sinks>,
}

#[derive(Default)]
struct Sinks {
    progress: Option<Arc<dyn ProgressSink>>,
    logs: Option<Arc<dyn LogSink>>,
    kept: Kept,
}

/// What a held call reported while no round was answered on its replica: its latest progress
/// and its latest log messages.
#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Kept {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    progress: Option<toolyard_api::protocol::Progress>,
    #[serde(default, skip_serializing_if = "VecDeque::is_empty")]
    logs: VecDeque<LogMessage>,
}

impl Kept {
    fn is_empty(&self) -> bool {
        self.progress.is_none() && self.logs.is_empty()
    }

    /// Sends the kept messages to a round's sinks.
    async fn send(self, progress: Option<&Arc<dyn ProgressSink>>, logs: Option<&Arc<dyn LogSink>>) {
        if let (Some(sink), Some(reported)) = (progress, self.progress) {
            sink.report(&reported).await;
        }
        if let Some(sink) = logs {
            for message in self.logs {
                sink.log(message).await;
            }
        }
    }
}

impl RoundSinks {
    fn lock(&self) -> std::sync::MutexGuard<'_, Sinks> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// From now on the messages go to these sinks, after those kept until now.
    pub async fn attach(&self, progress: Option<Arc<dyn ProgressSink>>, logs: Option<Arc<dyn LogSink>>) {
        loop {
            let kept = {
                let mut sinks = self.lock();
                if sinks.kept.is_empty() {
                    (sinks.progress, sinks.logs) = (progress, logs);
                    return;
                }
                std::mem::take(&mut sinks.kept)
            };
            kept.send(progress.as_ref(), logs.as_ref()).await;
        }
    }

    /// From now on the messages are kept for the next round.
    pub fn detach(&self) {
        let mut sinks = self.lock();
        (sinks.progress, sinks.logs) = (None, None);
    }

    /// The messages kept until now (the next round's, passed on with the event).
    fn take_kept(&self) -> Kept {
        std::mem::take(&mut self.lock().kept)
    }
}

#[async_trait::async_trait]
impl ProgressSink for RoundSinks {
    async fn report(&self, progress: &toolyard_api::protocol::Progress) {
        let sink = {
            let mut sinks = self.lock();
            if sinks.progress.is_none() {
                sinks.kept.progress = Some(progress.clone());
            }
            sinks.progress.clone()
        };
        if let Some(sink) = sink {
            sink.report(progress).await;
        }
    }
}

#[async_trait::async_trait]
impl LogSink for RoundSinks {
    async fn log(&self, message: LogMessage) {
        let sink = {
            let mut sinks = self.lock();
            match sinks.logs.clone() {
                Some(sink) => sink,
                None => {
                    sinks.kept.logs.push_back(message);
                    if sinks.kept.logs.len() > KEPT_LOGS {
                        sinks.kept.logs.pop_front();
                    }
                    return;
                }
            }
        };
        sink.log(message).await;
    }
}

/// A call to hold for `owner`, a 2026-07-28 caller with `capabilities`: the asker to run it
/// with, and what [`first_round`] needs.
pub(super) fn hold(
    asks: Arc<Asks>,
    store: Arc<dyn ArtifactStore>,
    owner: OwnerKey,
    capabilities: ClientCapabilities,
) -> (Arc<dyn ClientAsker>, Holding) {
    let (sender, queue) = mpsc::channel(crate::upstream::logs::MAX_ASKS_AT_ONCE + 1);
    let asker = RoundAsker { asks, store, owner, capabilities, events: sender.clone() };
    let holding =
        Holding { events: Events { queue, next: None }, sender, stop: CancellationToken::new(), sinks: Arc::default() };
    (Arc::new(asker), holding)
}

/// The record of a held call in its caller's storage.
#[derive(serde::Serialize, serde::Deserialize)]
struct Held {
    /// When the call ends at the latest.
    deadline: jiff::Timestamp,
}

fn held_path(held: &str) -> String {
    format!("asks/{ROUND_PREFIX}{held}/held.json")
}

/// The id a held call's `n`th event is passed on under.
fn event_id(held: &str, n: u32) -> String {
    format!("{ROUND_PREFIX}{held}-{n}")
}

fn request_state(held: &str, n: u32) -> String {
    format!("{held}.{n}")
}

/// `(held id, round)` from a `requestState` this gateway gave.
fn parse_request_state(state: &str) -> Option<(&str, u32)> {
    let (held, n) = state.split_once('.')?;
    let round = n.parse().ok().filter(|n| *n >= 1)?;
    (held.len() == 32 && held.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()))
        .then_some((held, round))
}

fn input_required(requests: BTreeMap<String, InputRequest>, held: &str, n: u32) -> CallToolResponse {
    InputRequiredResult::new(Some(requests), Some(request_state(held, n))).into()
}

/// Where a caller's rounds wait, are stored and are cancelled.
pub(super) struct Rounds<'a> {
    pub asks: &'a Arc<Asks>,
    pub store: &'a Arc<dyn ArtifactStore>,
    pub cancels: &'a CancelRegistry,
    pub owner: &'a OwnerKey,
}

impl Rounds<'_> {
    /// The first round: runs `call` (made with [`hold`]'s asker) held, and answers with its
    /// result when it ends before asking, or with its first requests. `cancel` (the request's)
    /// stops the call while this round waits; `timeout` is the call's own.
    pub async fn first_round(
        &self,
        call: impl Future<Output = Result<CallToolResult, ErrorData>> + Send + 'static,
        holding: Holding,
        cancel: &CancellationToken,
        timeout: Duration,
    ) -> Result<CallToolResponse, ErrorData> {
        let Holding { mut events, sender, stop, sinks } = holding;
        let stop_unless_held = stop.clone().drop_guard();
        tokio::spawn(async move {
            let result = call.await;
            let _ = sender.send(Message::Done(result)).await;
        });
        let first = tokio::select! {
            event = events.next() => event,
            () = cancel.cancelled() => return Err(ErrorData::internal_error("the call was cancelled", None)),
        };
        let requests = match first {
            None => return Err(ErrorData::internal_error("the call ended without an answer", None)),
            Some(Event::Failed(error)) => return Err(error),
            Some(Event::Done(result)) => return Ok(result.into()),
            Some(Event::Input(requests)) => requests,
        };
        let held = uuid::Uuid::new_v4().simple().to_string();
        let deadline = jiff::Timestamp::now() + timeout;
        let record = serde_json::to_vec(&Held { deadline }).unwrap_or_default();
        if let Err(e) = self.store.put(self.owner, &held_path(&held), Bytes::from(record)).await {
            tracing::warn!(error = %e, "recording a held call failed");
            return Err(ErrorData::internal_error(
                "the call asks for input, and could not be held for the answer; try again",
                None,
            ));
        }
        stop_unless_held.disarm();
        sinks.detach();
        self.asks.hold(held.clone(), self.owner.clone(), stop, sinks.clone());
        let (asks, store, owner) = (self.asks.clone(), self.store.clone(), self.owner.clone());
        tokio::spawn(pass_events_on(asks, store, owner, held.clone(), events, sinks));
        Ok(input_required(requests, &held, 1))
    }

    /// A retry with `request_state` and `responses` (request `request_id`): passes the answers
    /// on, then answers with the held call's next event. `cancel` (the request's) ends the
    /// wait; it, or a `notifications/cancelled` for the request, also stops the call when the
    /// call is held on this replica (as any call is cancelled only where it runs). The call's
    /// progress and log messages meanwhile go to `progress` and `logs` when it is held here.
    #[allow(clippy::too_many_arguments)]
    pub async fn later_round(
        &self,
        quota: &StorageQuota,
        state: &str,
        responses: Option<InputResponses>,
        request_id: &Value,
        cancel: &CancellationToken,
        progress: Option<Arc<dyn ProgressSink>>,
        logs: Option<Arc<dyn LogSink>>,
    ) -> Result<CallToolResponse, ErrorData> {
        let unknown = || {
            ErrorData::invalid_params(
                "requestState names no call of yours that waits for input (it ended, or it is not one this gateway gave)",
                None,
            )
        };
        let (held, n) = parse_request_state(state).ok_or_else(unknown)?;
        let record = match self.store.get(self.owner, &held_path(held)).await {
            Ok(Some(bytes)) => serde_json::from_slice::<Held>(&bytes).map_err(|_| unknown())?,
            Ok(None) => return Err(unknown()),
            Err(e) => {
                tracing::warn!(error = %e, "reading a held call's record failed");
                return Err(ErrorData::internal_error("the call's state could not be read; try again", None));
            }
        };
        let responses = responses.unwrap_or_default();
        if let Some(key) = responses.keys().find(|k| !asks::is_ask_id(k)) {
            return Err(ErrorData::invalid_params(
                format!("inputResponses has a key no request was asked under: {key:?}"),
                None,
            ));
        }
        // A call held here stops with this request: a `notifications/cancelled` for it, or its
        // end (how a 2026-07-28 client cancels).
        let here = self.asks.held_here(held, self.owner);
        let stop = here.as_ref().map(|(stop, _)| stop.clone());
        let _registration = stop.clone().map(|stop| self.cancels.register(cancel_key(self.owner, request_id), stop));
        let _sinks = match here {
            Some((_, sinks)) => {
                sinks.attach(progress.clone(), logs.clone()).await;
                Some(SinksReset(sinks))
            }
            None => None,
        };
        // Registered before the answers go on, so that an event they cause at once finds it.
        let waiting = self.asks.wait(event_id(held, n), self.owner.clone());
        for (key, answer) in responses {
            match asks::pass_on(self.asks, self.store.as_ref(), Some(quota), self.owner, &key, Ok(answer)).await {
                Ok(()) => {}
                Err(Undelivered::Quota(message)) => return Err(ErrorData::invalid_request(message, None)),
                Err(Undelivered::Failed) => {
                    return Err(ErrorData::internal_error("an answer could not be passed on; try again", None));
                }
            }
        }
        let left = Duration::try_from(record.deadline.duration_since(jiff::Timestamp::now())).unwrap_or_default()
            + DEADLINE_GRACE;
        let answer = waiting
            .answer(self.store.as_ref(), async {
                tokio::select! {
                    () = cancel.cancelled() => {
                        stop.as_ref().inspect(|stop| stop.cancel());
                        ErrorData::internal_error("the request was cancelled", None)
                    }
                    () = tokio::time::sleep(left) => ErrorData::internal_error("the held call did not answer by its deadline", None),
                }
            })
            .await;
        let passed = answer.and_then(|value| {
            serde_json::from_value::<Passed>(value)
                .map_err(|e| ErrorData::internal_error(format!("the held call's event is unreadable: {e}"), None))
        });
        let event = match passed {
            Ok(Passed { event, kept }) => {
                kept.send(progress.as_ref(), logs.as_ref()).await;
                Ok(event)
            }
            Err(e) => Err(e),
        };
        match event {
            Ok(Event::Input(requests)) => Ok(input_required(requests, held, n + 1)),
            ended => {
                if let Err(e) = self.store.delete(self.owner, &[held_path(held)]).await {
                    tracing::warn!(error = %e, "deleting a held call's record failed");
                }
                match ended? {
                    Event::Done(result) => Ok(result.into()),
                    Event::Failed(error) => Err(error),
                    Event::Input(_) => unreachable!("matched above"),
                }
            }
        }
    }
}

/// Keeps a held call's messages for the next round again when this round ends.
struct SinksReset(Arc<RoundSinks>);

impl Drop for SinksReset {
    fn drop(&mut self) {
        self.0.detach();
    }
}

/// Passes a held call's events after the first on, each to the retry that waits for it (here,
/// or through storage), until the call ends.
async fn pass_events_on(
    asks: Arc<Asks>,
    store: Arc<dyn ArtifactStore>,
    owner: OwnerKey,
    held: String,
    mut events: Events,
    sinks: Arc<RoundSinks>,
) {
    let mut n = 1;
    while let Some(event) = events.next().await {
        let end = !matches!(event, Event::Input(_));
        // An error too comes with the messages kept for its round (they may tell why).
        let answer = serde_json::to_value(Passed { event, kept: sinks.take_kept() })
            .map_err(|e| ErrorData::internal_error(format!("the call's event: {e}"), None));
        if asks::pass_on(&asks, store.as_ref(), None, &owner, &event_id(&held, n), answer).await.is_err() {
            tracing::warn!(held = %held, round = n, "a held call's event could not be passed on");
        }
        if end {
            break;
        }
        n += 1;
    }
    asks.release(&held);
}

#[cfg(test)]
// The log messages of these tests use rmcp's deprecated logging types (see upstream/logs.rs).
#[allow(deprecated)]
mod tests {
    use super::*;

    #[test]
    fn only_request_states_of_the_gateways_form_are_read() {
        let held = "0123456789abcdef0123456789abcdef";
        assert_eq!(parse_request_state(&request_state(held, 3)), Some((held, 3)));
        for bad in [
            "",
            "0123456789abcdef0123456789abcdef",
            "0123456789abcdef0123456789abcdef.0",
            "0123456789abcdef0123456789abcdef.-1",
            "0123456789ABCDEF0123456789abcdef.1",
            "../../calls/x.1",
            "0123456789abcdef0123456789abcde.1",
        ] {
            assert_eq!(parse_request_state(bad), None, "{bad}");
        }
    }

    #[tokio::test]
    async fn requests_asked_together_come_as_one_event_and_the_end_after_them() {
        let (sender, queue) = mpsc::channel(8);
        let mut events = Events { queue, next: None };
        let request = |message: &str| {
            let value = serde_json::json!({"method": "elicitation/create", "params": {
                "mode": "form", "message": message, "requestedSchema": {"type": "object", "properties": {}}}});
            Box::new(serde_json::from_value::<InputRequest>(value).expect("an elicitation"))
        };
        sender.send(Message::Ask("a".into(), request("first"))).await.unwrap();
        sender.send(Message::Ask("b".into(), request("second"))).await.unwrap();
        sender.send(Message::Done(Ok(CallToolResult::success(vec![])))).await.unwrap();
        sender.send(Message::Ask("c".into(), request("late"))).await.unwrap();
        drop(sender);
        let Some(Event::Input(first)) = events.next().await else { panic!("requests first") };
        assert_eq!(first.keys().collect::<Vec<_>>(), ["a", "b"]);
        assert!(matches!(events.next().await, Some(Event::Done(_))));
        assert!(matches!(events.next().await, Some(Event::Input(_))));
        assert!(events.next().await.is_none());
    }

    /// Collects what reaches it.
    #[derive(Default)]
    struct Heard(std::sync::Mutex<Vec<Value>>);

    #[async_trait::async_trait]
    impl LogSink for Heard {
        async fn log(&self, message: LogMessage) {
            self.0.lock().unwrap().push(message.data);
        }
    }

    #[async_trait::async_trait]
    impl ProgressSink for Heard {
        async fn report(&self, progress: &toolyard_api::protocol::Progress) {
            self.0.lock().unwrap().push(serde_json::json!(progress.fraction));
        }
    }

    fn line(n: usize) -> LogMessage {
        LogMessage::new(rmcp::model::LoggingLevel::Info, serde_json::json!(n))
    }

    #[tokio::test]
    async fn messages_between_rounds_are_kept_for_the_next_round_in_order() {
        let sinks = RoundSinks::default();
        let heard = Arc::new(Heard::default());
        let (progress, logs) = (heard.clone() as Arc<dyn ProgressSink>, heard.clone() as Arc<dyn LogSink>);
        // No round answered here: kept, the latest KEPT_LOGS of them, and the latest progress.
        for n in 0..KEPT_LOGS + 3 {
            sinks.log(line(n)).await;
        }
        sinks.report(&toolyard_api::protocol::Progress { fraction: 0.2, message: None }).await;
        sinks.report(&toolyard_api::protocol::Progress { fraction: 0.5, message: None }).await;
        // A round answered here hears them first, then the live ones.
        sinks.attach(Some(progress.clone()), Some(logs.clone())).await;
        sinks.log(line(100)).await;
        let expected: Vec<Value> = std::iter::once(serde_json::json!(0.5))
            .chain((3..KEPT_LOGS + 3).map(|n| serde_json::json!(n)))
            .chain(std::iter::once(serde_json::json!(100)))
            .collect();
        assert_eq!(*heard.0.lock().unwrap(), expected);
        // Detached again: kept for the event a round at another replica reads.
        sinks.detach();
        sinks.log(line(101)).await;
        let passed = Passed { event: Event::Done(CallToolResult::success(vec![])), kept: sinks.take_kept() };
        let value = serde_json::to_value(&passed).unwrap();
        assert_eq!(value["kept"]["logs"][0]["data"], 101, "{value}");
        let read: Passed = serde_json::from_value(value).unwrap();
        assert!(matches!(read.event, Event::Done(_)));
        assert_eq!(read.kept.logs.len(), 1);
        assert!(sinks.take_kept().is_empty(), "taken once");
        // An event without kept messages reads as one.
        let bare = serde_json::to_value(Event::Done(CallToolResult::success(vec![]))).unwrap();
        assert!(serde_json::from_value::<Passed>(bare).unwrap().kept.is_empty());
        // A call's error comes with the messages kept for its round.
        sinks.log(line(102)).await;
        let failed =
            Passed { event: Event::Failed(ErrorData::internal_error("it broke", None)), kept: sinks.take_kept() };
        let read: Passed = serde_json::from_value(serde_json::to_value(&failed).unwrap()).unwrap();
        assert!(matches!(read.event, Event::Failed(e) if e.message == "it broke"));
        assert_eq!(read.kept.logs.len(), 1);
    }
}

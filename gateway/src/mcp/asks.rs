//! The requests an upstream server sends a call's caller during the call
//! (`sampling/createMessage`, `elicitation/create`: see [`crate::upstream::logs`]), asked of the
//! MCP client on the SSE stream of its `tools/call` request ([`super::direct`]), and the
//! client's answers. (A 2026-07-28 client is asked in rounds instead, [`super::rounds`], whose
//! answers and events go through the same waits.)
//!
//! The gateway keeps no session: the client posts its answer as a request of its own, which
//! may reach any replica. Each request asked therefore gets an id of its own,
//! `toolyard-ask-<32 hex digits>` (random, so no one can answer a request they were not
//! asked), and waits in [`Asks`] for the answer:
//!
//! - an answer that reaches the replica that asked is handed over at once;
//! - one that reaches another replica is stored in the sender's own storage
//!   (`asks/<id>/answer.json`, written create-only), where the replica that asked looks every
//!   second while it waits, then deletes it.
//!
//! Either way only the caller who was asked can answer: an answer is taken only from the
//! owner the request was asked of (the replica that asked reads that owner's storage only).
//! The wait ends with the call: when its stream ends, the request is answered with an error.
//! An answer that comes after that, to another replica, stays stored until retention deletes
//! it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::StatusCode;
use rmcp::ErrorData;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use toolyard_api::OwnerKey;

use crate::core::ClientAsker;
use crate::core::quota::StorageQuota;
use crate::store::ArtifactStore;

/// How a request id the gateway asked with begins.
const ASK_ID_PREFIX: &str = "toolyard-ask-";

/// How often a replica waiting for an answer looks for it in storage.
const STORED_ANSWER_POLL: Duration = Duration::from_secs(1);

/// A client's answer: its result, or its error.
type Answer = Result<Value, ErrorData>;

/// The requests this replica waits on an answer for, by id.
#[derive(Default)]
pub struct Asks {
    waiting: Mutex<HashMap<String, Waiter>>,
    /// The calls held here between a 2026-07-28 caller's rounds ([`super::rounds`]), by held
    /// id: whose, and how to stop each.
    held: Mutex<HashMap<String, HeldCall>>,
}

/// A call held here: whose, how to stop it, where its messages go.
struct HeldCall {
    owner: OwnerKey,
    stop: CancellationToken,
    sinks: Arc<super::rounds::RoundSinks>,
}

struct Waiter {
    owner: OwnerKey,
    answer: oneshot::Sender<Answer>,
}

/// One wait for an answer, registered in [`Asks`] until it ends, however it ends.
pub(super) struct Waiting<'a> {
    asks: &'a Asks,
    id: String,
    owner: OwnerKey,
    answered: oneshot::Receiver<Answer>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.asks.waiting.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.id);
    }
}

impl Waiting<'_> {
    /// The answer: handed over here, or stored by another replica (looked for at once, then
    /// every second, and deleted once read). `gone` ends the wait with its error.
    pub async fn answer(mut self, store: &dyn ArtifactStore, gone: impl Future<Output = ErrorData>) -> Answer {
        let path = answer_path(&self.id);
        let mut look = tokio::time::interval(STORED_ANSWER_POLL);
        look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut gone = std::pin::pin!(gone);
        loop {
            tokio::select! {
                answer = &mut self.answered => {
                    return answer.unwrap_or_else(|_| Err(ErrorData::internal_error("the wait for an answer was replaced", None)));
                }
                error = &mut gone => return Err(error),
                _ = look.tick() => match store.get(&self.owner, &path).await {
                    Ok(Some(bytes)) => {
                        if let Err(e) = store.delete(&self.owner, &[path]).await {
                            tracing::warn!(error = %e, "deleting a stored answer failed");
                        }
                        return match serde_json::from_slice::<StoredAnswer>(&bytes) {
                            Ok(StoredAnswer::Result(result)) => Ok(result),
                            Ok(StoredAnswer::Error(error)) => Err(error),
                            Err(e) => Err(ErrorData::internal_error(format!("the stored answer is unreadable: {e}"), None)),
                        };
                    }
                    Ok(None) => {}
                    Err(e) => tracing::warn!(error = %e, "looking for a stored answer failed"),
                },
            }
        }
    }
}

impl Asks {
    /// Registers a wait for `owner`'s answer to `id` (before the question goes out, so that
    /// an answer that comes at once finds it).
    pub(super) fn wait(&self, id: String, owner: OwnerKey) -> Waiting<'_> {
        let (sender, answered) = oneshot::channel();
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.clone(), Waiter { owner: owner.clone(), answer: sender });
        Waiting { asks: self, id, owner, answered }
    }

    /// Records the call held here under `id` for `owner`, stopped by `stop`, its messages
    /// going to `sinks`.
    pub(super) fn hold(
        &self,
        id: String,
        owner: OwnerKey,
        stop: CancellationToken,
        sinks: Arc<super::rounds::RoundSinks>,
    ) {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).insert(id, HeldCall { owner, stop, sinks });
    }

    /// Forgets the held call `id` (it ended).
    pub(super) fn release(&self, id: &str) {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
    }

    /// How to stop `owner`'s call held here under `id`, and where its messages go, if it is
    /// held here.
    pub(super) fn held_here(
        &self,
        id: &str,
        owner: &OwnerKey,
    ) -> Option<(CancellationToken, Arc<super::rounds::RoundSinks>)> {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.get(id).filter(|h| &h.owner == owner).map(|h| (h.stop.clone(), h.sinks.clone()))
    }

    /// Asks `owner` a request under a new ask id: `send` gives it to the caller (`false`: it
    /// could not), then the answer is waited for until `closed` (the way to the caller is gone).
    pub(super) async fn ask(
        &self,
        store: &dyn ArtifactStore,
        owner: &OwnerKey,
        send: impl AsyncFnOnce(String) -> bool,
        closed: impl Future<Output = ()>,
    ) -> Answer {
        let gone = || ErrorData::internal_error("the caller's request ended before the caller answered", None);
        let id = new_ask_id();
        let waiting = self.wait(id.clone(), owner.clone());
        if !send(id).await {
            return Err(gone());
        }
        waiting
            .answer(store, async {
                closed.await;
                gone()
            })
            .await
    }

    /// Hands `answer` to the request `id` waiting here for `owner`'s answer; gives it back
    /// when there is none.
    fn hand_over(&self, id: &str, owner: &OwnerKey, answer: Answer) -> Option<Answer> {
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        match waiting.get(id) {
            Some(w) if &w.owner == owner => {
                let w = waiting.remove(id).expect("present");
                // The waiter may have just given up: the answer then goes nowhere, as it would a
                // moment later.
                let _ = w.answer.send(answer);
                None
            }
            _ => Some(answer),
        }
    }
}

/// A new id to ask a request with ([`ASK_ID_PREFIX`] and 32 random hex digits).
fn new_ask_id() -> String {
    format!("{ASK_ID_PREFIX}{}", uuid::Uuid::new_v4().simple())
}

/// Whether `id` is of the form [`new_ask_id`] makes.
pub(super) fn is_ask_id(id: &str) -> bool {
    id.strip_prefix(ASK_ID_PREFIX)
        .is_some_and(|random| random.len() == 32 && random.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// A client's JSON-RPC answer to a request the gateway asked ([`answer_of`]).
pub struct ClientAnswer {
    id: String,
    answer: Answer,
}

/// The body as an answer to a request the gateway asked: a JSON-RPC response or error whose id
/// is one of [`ASK_ID_PREFIX`]'s form. `None` for anything else.
pub fn answer_of(body: &[u8]) -> Option<ClientAnswer> {
    #[derive(serde::Deserialize)]
    struct Message {
        jsonrpc: String,
        id: String,
        result: Option<Value>,
        error: Option<ErrorData>,
    }
    let message: Message = serde_json::from_slice(body).ok()?;
    if message.jsonrpc != "2.0" || !is_ask_id(&message.id) {
        return None;
    }
    let answer = match (message.result, message.error) {
        (Some(result), None) => Ok(result),
        (None, Some(error)) => Err(error),
        _ => return None,
    };
    Some(ClientAnswer { id: message.id, answer })
}

/// Why an answer was not passed on.
pub(super) enum Undelivered {
    /// The owner's storage is at its quota (the message says so).
    Quota(String),
    /// The store failed; the sender may try again.
    Failed,
}

/// Passes `owner`'s answer to `id` on: to the wait here, or stored (create-only: the first
/// answer counts) for the replica that waits. `quota`: the owner's storage quota to store it
/// under (`None` for the gateway's own answers).
pub(super) async fn pass_on(
    asks: &Asks,
    store: &dyn ArtifactStore,
    quota: Option<&StorageQuota>,
    owner: &OwnerKey,
    id: &str,
    answer: Answer,
) -> Result<(), Undelivered> {
    let Some(answer) = asks.hand_over(id, owner, answer) else { return Ok(()) };
    if let Some(quota) = quota {
        match quota.check(owner).await {
            Ok(None) => {}
            Ok(Some(message)) => return Err(Undelivered::Quota(message)),
            Err(e) => {
                tracing::warn!(error = %e, "checking the storage quota for an answer failed");
                return Err(Undelivered::Failed);
            }
        }
    }
    let stored = serde_json::to_vec(&StoredAnswer::from(answer)).unwrap_or_default();
    store.create(owner, &answer_path(id), Bytes::from(stored)).await.map(drop).map_err(|e| {
        tracing::warn!(error = %e, "storing an answer for another replica failed");
        Undelivered::Failed
    })
}

/// Takes `owner`'s answer ([`pass_on`], under the owner's quota). Answered 202, as the
/// transport answers a response; 507 when the owner's storage is at its quota (stored answers
/// count), 503 when it could not be stored.
pub async fn deliver(
    asks: &Asks,
    store: &dyn ArtifactStore,
    quota: &StorageQuota,
    owner: &OwnerKey,
    answer: ClientAnswer,
) -> Response {
    match pass_on(asks, store, Some(quota), owner, &answer.id, answer.answer).await {
        Ok(()) => StatusCode::ACCEPTED.into_response(),
        Err(Undelivered::Quota(message)) => (StatusCode::INSUFFICIENT_STORAGE, format!("{message}\n")).into_response(),
        Err(Undelivered::Failed) => {
            (StatusCode::SERVICE_UNAVAILABLE, "the answer could not be passed on; try again\n").into_response()
        }
    }
}

/// An answer as stored for another replica.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
enum StoredAnswer {
    Result(Value),
    Error(ErrorData),
}

impl From<Answer> for StoredAnswer {
    fn from(answer: Answer) -> Self {
        match answer {
            Ok(result) => StoredAnswer::Result(result),
            Err(error) => StoredAnswer::Error(error),
        }
    }
}

fn answer_path(id: &str) -> String {
    format!("asks/{id}/answer.json")
}

/// Asks the client on a request's SSE stream (`out` carries serialized messages to it).
pub(super) struct StreamAsker {
    /// Where this replica's requests wait.
    pub asks: Arc<Asks>,
    /// Where an answer that reached another replica is.
    pub store: Arc<dyn ArtifactStore>,
    /// The caller asked.
    pub owner: OwnerKey,
    /// The caller's request's SSE stream.
    pub out: mpsc::Sender<String>,
}

#[async_trait::async_trait]
impl ClientAsker for StreamAsker {
    async fn ask(&self, method: &str, params: Value) -> Result<Value, ErrorData> {
        let send = async |id: String| {
            let request = serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
            self.out.send(request.to_string()).await.is_ok()
        };
        self.asks.ask(self.store.as_ref(), &self.owner, send, self.out.closed()).await
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn only_answers_to_the_gateways_own_ids_are_taken() {
        let id = format!("{ASK_ID_PREFIX}{}", "a".repeat(32));
        let ok = json!({"jsonrpc": "2.0", "id": id, "result": {"action": "accept"}}).to_string();
        let answer = answer_of(ok.as_bytes()).expect("an answer");
        assert_eq!(answer.answer.expect("a result"), json!({"action": "accept"}));
        let error = json!({"jsonrpc": "2.0", "id": id, "error": {"code": -1, "message": "no"}}).to_string();
        assert_eq!(answer_of(error.as_bytes()).expect("an answer").answer.expect_err("an error").message, "no");
        for other in [
            json!({"jsonrpc": "2.0", "id": 1, "result": {}}),
            json!({"jsonrpc": "2.0", "id": format!("{ASK_ID_PREFIX}../x"), "result": {}}),
            json!({"jsonrpc": "2.0", "id": format!("{ASK_ID_PREFIX}{}", "g".repeat(32)), "result": {}}),
            json!({"jsonrpc": "2.0", "id": id, "result": {}, "error": {"code": 1, "message": "x"}}),
            json!({"jsonrpc": "2.0", "id": id, "method": "ping"}),
        ] {
            assert!(answer_of(other.to_string().as_bytes()).is_none(), "{other} is not taken");
        }
    }

    #[test]
    fn an_answer_is_handed_only_to_the_owner_asked() {
        let asks = Asks::default();
        let (alice, bob) = (OwnerKey::derive("issuer", "alice"), OwnerKey::derive("issuer", "bob"));
        let mut waiting = asks.wait("id".into(), alice.clone());
        assert!(asks.hand_over("id", &bob, Ok(json!(1))).is_some(), "bob's answer is not alice's");
        assert!(waiting.answered.try_recv().is_err());
        assert!(asks.hand_over("id", &alice, Ok(json!(2))).is_none());
        assert_eq!(waiting.answered.try_recv().expect("answered").expect("a result"), json!(2));
    }
}

//! The requests an upstream server sends a call's caller during the call
//! (`sampling/createMessage`, `elicitation/create`: see [`crate::upstream::logs`]), asked of the
//! MCP client on the SSE stream of its `tools/call` request ([`super::direct`]), and the
//! client's answers.
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
    waiting: Mutex<HashMap<String, Waiting>>,
}

struct Waiting {
    owner: OwnerKey,
    answer: oneshot::Sender<Answer>,
}

/// Removes a request from [`Asks`] when its wait ends, however it ends.
struct WaitGuard<'a> {
    asks: &'a Asks,
    id: String,
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        self.asks.waiting.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.id);
    }
}

impl Asks {
    fn wait(&self, id: String, owner: OwnerKey) -> (WaitGuard<'_>, oneshot::Receiver<Answer>) {
        let (sender, receiver) = oneshot::channel();
        self.waiting.lock().unwrap_or_else(|e| e.into_inner()).insert(id.clone(), Waiting { owner, answer: sender });
        (WaitGuard { asks: self, id }, receiver)
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
    let random = message.id.strip_prefix(ASK_ID_PREFIX)?;
    if message.jsonrpc != "2.0" || random.len() != 32 || !random.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let answer = match (message.result, message.error) {
        (Some(result), None) => Ok(result),
        (None, Some(error)) => Err(error),
        _ => return None,
    };
    Some(ClientAnswer { id: message.id, answer })
}

/// Takes `owner`'s answer: hands it to the request waiting here, or stores it for the replica
/// that asked. Answered 202, as the transport answers a response; 507 when the owner's storage
/// is at its quota (stored answers count), 503 when it could not be stored.
pub async fn deliver(
    asks: &Asks,
    store: &dyn ArtifactStore,
    quota: &StorageQuota,
    owner: &OwnerKey,
    answer: ClientAnswer,
) -> Response {
    let ClientAnswer { id, answer } = answer;
    let Some(answer) = asks.hand_over(&id, owner, answer) else { return StatusCode::ACCEPTED.into_response() };
    match quota.check(owner).await {
        Ok(None) => {}
        Ok(Some(message)) => return (StatusCode::INSUFFICIENT_STORAGE, format!("{message}\n")).into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "checking the storage quota for a client's answer failed");
            return (StatusCode::SERVICE_UNAVAILABLE, "the answer could not be passed on; try again\n").into_response();
        }
    }
    let stored = serde_json::to_vec(&StoredAnswer::from(answer)).unwrap_or_default();
    match store.create(owner, &answer_path(&id), Bytes::from(stored)).await {
        // Already there: the first answer counts.
        Ok(_) => StatusCode::ACCEPTED.into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "storing a client's answer for another replica failed");
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
        let gone = || ErrorData::internal_error("the caller's request ended before the caller answered", None);
        let id = format!("{ASK_ID_PREFIX}{}", uuid::Uuid::new_v4().simple());
        let (_guard, mut answered) = self.asks.wait(id.clone(), self.owner.clone());
        let request = serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        if self.out.send(request.to_string()).await.is_err() {
            return Err(gone());
        }
        let path = answer_path(&id);
        let mut look = tokio::time::interval(STORED_ANSWER_POLL);
        look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        look.tick().await;
        loop {
            tokio::select! {
                answer = &mut answered => return answer.unwrap_or_else(|_| Err(gone())),
                () = self.out.closed() => return Err(gone()),
                _ = look.tick() => match self.store.get(&self.owner, &path).await {
                    Ok(Some(bytes)) => {
                        if let Err(e) = self.store.delete_folder(&self.owner, &format!("asks/{id}/")).await {
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
        let (_guard, mut answered) = asks.wait("id".into(), alice.clone());
        assert!(asks.hand_over("id", &bob, Ok(json!(1))).is_some(), "bob's answer is not alice's");
        assert!(answered.try_recv().is_err());
        assert!(asks.hand_over("id", &alice, Ok(json!(2))).is_none());
        assert_eq!(answered.try_recv().expect("answered").expect("a result"), json!(2));
    }
}

//! Sessions of 2025-era clients (protocol 2025-11-25 and older), kept by no replica.
//!
//! The `initialize` response gives an `Mcp-Session-Id`: 32 random hex digits, a dot, and an
//! HMAC of them and the caller's owner key under a key every replica shares (derived from the
//! runner token key). Any replica checks it without looking anything up; a request that
//! sends one that is not the caller's (forged, another user's) gets 404, as the transport
//! says an ended session does, and the client starts a new one.
//!
//! What a session gives its client:
//!
//! - **A GET stream** (`Accept: text/event-stream`) of the notifications a 2026-07-28 client
//!   asks for with `subscriptions/listen` ([`super::changes`]): tool and prompt list changes,
//!   and updates of the resources the session subscribed to. It counts as one of the user's
//!   open streams (the same limits as `subscriptions/listen`).
//! - **`resources/subscribe`** and **`resources/unsubscribe`** of task resources and of
//!   upstream servers' resources ([`super::changes`]). A subscription is stored in the
//!   caller's own storage
//!   (`sessions/<session>/subscriptions/<URI, base64url>/on`), since the GET stream may be held
//!   by another replica than the one the request reached, and each change writes a new
//!   `sessions/<session>/version`. The stream reads the subscriptions at once when the
//!   request reached its own replica; otherwise it reads the version every
//!   [`SUBSCRIPTIONS_RECHECK`] (one small read, not a listing) and lists the subscriptions
//!   when it moved.
//!
//! A session cannot be ended: with no record of it anywhere, none could be refused later, so
//! `DELETE` is answered 405, as the transport allows. Its subscriptions stay stored until
//! retention deletes them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use bytes::Bytes;
use futures::StreamExt;
use http::{HeaderValue, StatusCode, header};
use rmcp::ErrorData;
use rmcp::model::ServerJsonRpcMessage;
use rmcp::model::ServerNotification;
use tokio::sync::Notify;
use toolyard_api::OwnerKey;
use toolyard_api::token::SigningKey;

use super::Scope;
use super::changes::{ChangeFeed, MAX_RESOURCE_SUBSCRIPTIONS, Wants};
use super::handler::McpHandler;
use crate::identity::Identity;
use crate::limits::StreamPermit;
use crate::metrics::Rejection;
use crate::state::AppState;
use crate::store::ArtifactStore;

/// The session header.
pub const HEADER: &str = "mcp-session-id";

/// How often a session's GET stream reads its subscriptions again (those made through another
/// replica; those made through its own are read at once).
pub const SUBSCRIPTIONS_RECHECK: Duration = Duration::from_secs(10);

/// Makes and checks session ids; wakes the GET streams held here when their session's
/// subscriptions change.
pub struct Sessions {
    key: SigningKey,
    streams: Mutex<HashMap<String, Arc<Notify>>>,
}

impl Default for Sessions {
    /// Sessions under a key of this process only (one replica).
    fn default() -> Self {
        let mut bytes = [0u8; toolyard_api::token::MIN_KEY_LEN];
        bytes[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
        bytes[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
        Self::new(SigningKey::from_bytes(bytes))
    }
}

/// A session a request was checked to belong to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session(String);

impl Sessions {
    /// Sessions under `key` (shared by every replica).
    pub fn new(key: SigningKey) -> Self {
        Sessions { key, streams: Mutex::default() }
    }

    /// A new session id for `owner`.
    pub fn open(&self, owner: &OwnerKey) -> String {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let proof = self.key.prove(&format!("{owner}:{id}"));
        format!("{id}.{proof}")
    }

    /// The session `header` names, when it is one of `owner`'s.
    pub fn check(&self, header: &str, owner: &OwnerKey) -> Option<Session> {
        let (id, proof) = header.split_once('.')?;
        let well_formed = id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase());
        (well_formed && self.key.check_proof(&format!("{owner}:{id}"), proof)).then(|| Session(id.to_owned()))
    }

    /// Wakes the GET stream of `session` held here, if any.
    fn wake(&self, session: &Session) {
        if let Some(notify) = self.streams.lock().unwrap_or_else(|e| e.into_inner()).get(&session.0) {
            notify.notify_one();
        }
    }

    fn hold(&self, session: &Session) -> Arc<Notify> {
        let notify = Arc::new(Notify::new());
        self.streams.lock().unwrap_or_else(|e| e.into_inner()).insert(session.0.clone(), notify.clone());
        notify
    }

    fn release(&self, session: &Session, notify: &Arc<Notify>) {
        let mut streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        if streams.get(&session.0).is_some_and(|n| Arc::ptr_eq(n, notify)) {
            streams.remove(&session.0);
        }
    }
}

fn subscriptions_folder(session: &Session) -> String {
    format!("sessions/{}/subscriptions/", session.0)
}

/// The file whose content changes whenever `session`'s subscriptions do (a new random value
/// written after each change), read by the session's GET stream on another replica to tell
/// whether to list them again.
fn version_path(session: &Session) -> String {
    format!("sessions/{}/version", session.0)
}

/// The file that stands for `session`'s subscription to `uri`.
fn subscription_path(session: &Session, uri: &str) -> String {
    format!("{}{}/on", subscriptions_folder(session), B64.encode(uri))
}

/// Longest URI a session may subscribe to (it is stored in a storage path).
pub const MAX_URI_BYTES: usize = 512;

/// Subscribes `session` of `owner` to `uri` (at most [`MAX_RESOURCE_SUBSCRIPTIONS`], each at
/// most [`MAX_URI_BYTES`] long).
pub async fn subscribe(state: &AppState, owner: &OwnerKey, session: &Session, uri: &str) -> Result<(), ErrorData> {
    if uri.len() > MAX_URI_BYTES {
        return Err(ErrorData::invalid_params(format!("a subscribed URI has at most {MAX_URI_BYTES} bytes"), None));
    }
    let store = state.store.as_ref();
    let now = subscribed(store, owner, session).await.map_err(unavailable)?;
    if !now.iter().any(|u| u == uri) {
        if now.len() >= MAX_RESOURCE_SUBSCRIPTIONS {
            return Err(ErrorData::invalid_request(
                format!("a session may subscribe to at most {MAX_RESOURCE_SUBSCRIPTIONS} resources"),
                None,
            ));
        }
        // Each subscription is a file of its owner's, and sessions are free to open: the
        // storage quota bounds them.
        if let Some(reached) = state.calls.quota().check(owner).await.map_err(unavailable)? {
            return Err(ErrorData::invalid_request(reached, None));
        }
        store.put(owner, &subscription_path(session, uri), Bytes::new()).await.map_err(unavailable)?;
        changed(store, owner, session).await?;
    }
    state.sessions.wake(session);
    Ok(())
}

/// Ends the subscription of `session` of `owner` to `uri` (none is no error, and changes
/// nothing).
pub async fn unsubscribe(state: &AppState, owner: &OwnerKey, session: &Session, uri: &str) -> Result<(), ErrorData> {
    let store = state.store.as_ref();
    if subscribed(store, owner, session).await.map_err(unavailable)?.iter().any(|u| u == uri) {
        store.delete(owner, &[subscription_path(session, uri)]).await.map_err(unavailable)?;
        changed(store, owner, session).await?;
    }
    state.sessions.wake(session);
    Ok(())
}

/// Writes a new version of `session`'s subscriptions (after they changed).
async fn changed(store: &dyn ArtifactStore, owner: &OwnerKey, session: &Session) -> Result<(), ErrorData> {
    let version = Bytes::from(uuid::Uuid::new_v4().simple().to_string());
    store.put(owner, &version_path(session), version).await.map_err(unavailable)
}

fn unavailable(e: crate::Error) -> ErrorData {
    tracing::warn!(error = %e, "reading or writing a session's subscriptions failed");
    ErrorData::internal_error("the session's subscriptions could not be read or changed; try again", None)
}

/// The URIs `session` of `owner` is subscribed to.
async fn subscribed(store: &dyn ArtifactStore, owner: &OwnerKey, session: &Session) -> crate::Result<Vec<String>> {
    let folder = subscriptions_folder(session);
    let objects = store.list(owner, &folder).await?;
    Ok(objects
        .iter()
        .filter_map(|o| o.path.strip_prefix(&folder)?.strip_suffix("/on"))
        .filter_map(|name| String::from_utf8(B64.decode(name).ok()?).ok())
        .take(MAX_RESOURCE_SUBSCRIPTIONS)
        .collect())
}

/// The GET stream of `session` for `who`: its notifications as SSE, until the client goes
/// away or the gateway stops. Refused 429 beyond the user's (or 503 beyond the replica's)
/// open streams.
pub async fn stream(handler: &McpHandler, who: &Identity, scope: Scope, session: Session) -> Response {
    let state = handler.state();
    let owner = who.owner_key();
    let permit = match state.limits.try_admit_stream(owner.as_str()) {
        Ok(permit) => permit,
        Err(rejection) => {
            state.metrics.admission_rejected(rejection);
            let (status, what) = match rejection {
                Rejection::StreamsUser => (StatusCode::TOO_MANY_REQUESTS, "too many open streams for this user"),
                _ => (StatusCode::SERVICE_UNAVAILABLE, "too many open streams"),
            };
            let retry = state.limits.settings().retry_after.as_secs().max(1);
            let mut response = (status, format!("{what}; retry later\n")).into_response();
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(retry));
            return response;
        }
    };
    let stream = GetStream::open(handler, who, scope, session, permit).await;
    let shutdown = state.shutdown.clone();
    let notifications = futures::stream::unfold(stream, GetStream::next).flatten();
    super::sse_response(
        notifications
            .take_until(shutdown.cancelled_owned())
            .map(|notification| super::to_json(&ServerJsonRpcMessage::notification(notification))),
    )
}

/// The state of a session's GET stream, polled by its connection: the session's subscriptions
/// as last read, and the feed of what to tell about them.
struct GetStream {
    handler: McpHandler,
    owner: OwnerKey,
    held: Held,
    uris: Vec<String>,
    /// The version of the subscriptions `uris` were read at (see [`read_version`]).
    version: Option<Option<Bytes>>,
    feed: ChangeFeed,
    reread: tokio::time::Interval,
    _permit: StreamPermit,
}

/// A session's GET stream held on this replica: woken when a request here changes the
/// session's subscriptions; no longer once dropped.
struct Held {
    handler: McpHandler,
    session: Session,
    wake: Arc<Notify>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.handler.state().sessions.release(&self.session, &self.wake);
    }
}

impl GetStream {
    async fn open(handler: &McpHandler, who: &Identity, scope: Scope, session: Session, permit: StreamPermit) -> Self {
        let wake = handler.state().sessions.hold(&session);
        let held = Held { handler: handler.clone(), session, wake };
        let owner = who.owner_key();
        // The version first: a change made between the two reads is seen at the next recheck.
        let version = read_version(handler.state(), &owner, &held.session).await;
        let uris = read_subscribed(handler.state(), &owner, &held.session).await;
        let feed = ChangeFeed::new(handler, who, scope, Wants { tools: true, prompts: true }, &uris).await;
        let start = tokio::time::Instant::now() + SUBSCRIPTIONS_RECHECK;
        let reread = tokio::time::interval_at(start, SUBSCRIPTIONS_RECHECK);
        GetStream { handler: handler.clone(), owner, held, uris, version, feed, reread, _permit: permit }
    }

    /// Waits for the next notifications (possibly none); `None` once the catalog is gone.
    async fn next(mut self) -> Option<(futures::stream::Iter<std::vec::IntoIter<ServerNotification>>, Self)> {
        let changed = tokio::select! {
            _ = self.reread.tick() => None,
            () = self.held.wake.notified() => None,
            next = self.feed.next(&self.uris) => Some(next?),
        };
        let notifications = match changed {
            Some(notifications) => notifications,
            // The subscriptions again, when their version moved (or cannot be read): a new
            // one is watched from now on. Then the task resources' updates.
            None => {
                let state = self.handler.state();
                let version = read_version(state, &self.owner, &self.held.session).await;
                if version.is_none() || version != self.version {
                    self.uris = read_subscribed(state, &self.owner, &self.held.session).await;
                    self.version = version;
                }
                self.feed.updates(&self.uris).await
            }
        };
        Some((futures::stream::iter(notifications), self))
    }
}

/// The version of `session`'s subscriptions: `Some(None)` when they never changed, `None` when
/// it cannot be read now (the stream lists them then).
async fn read_version(state: &AppState, owner: &OwnerKey, session: &Session) -> Option<Option<Bytes>> {
    state
        .store
        .get(owner, &version_path(session))
        .await
        .inspect_err(|e| tracing::warn!(error = %e, "reading the version of a session's subscriptions failed"))
        .ok()
}

/// [`subscribed`], or none when they cannot be read now (the stream reads them again later).
async fn read_subscribed(state: &AppState, owner: &OwnerKey, session: &Session) -> Vec<String> {
    subscribed(state.store.as_ref(), owner, session).await.unwrap_or_else(|e| {
        tracing::warn!(error = %e, "reading a session's subscriptions failed");
        Vec::new()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_id_is_its_owners_only_and_cannot_be_forged() {
        let sessions = Sessions::default();
        let (alice, bob) = (OwnerKey::derive("issuer", "alice"), OwnerKey::derive("issuer", "bob"));
        let id = sessions.open(&alice);
        let session = sessions.check(&id, &alice).expect("alice's session");
        assert!(sessions.check(&id, &bob).is_none(), "not bob's");
        assert!(Sessions::default().check(&id, &alice).is_none(), "not under another key");
        let (random, proof) = id.split_once('.').unwrap();
        let other = format!("{}{}", &random[..31], if random.ends_with('0') { '1' } else { '0' });
        assert!(sessions.check(&format!("{other}.{proof}"), &alice).is_none(), "the proof covers the id");
        for bad in ["", ".", "x.y", &format!("{}.{proof}", random.to_uppercase()), &format!("../{random}.{proof}")] {
            assert!(sessions.check(bad, &alice).is_none(), "{bad}");
        }
        assert_eq!(subscriptions_folder(&session), format!("sessions/{random}/subscriptions/"));
    }
}

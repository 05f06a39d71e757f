//! The direct path: a plain stateless `tools/list`, `tools/call` or `subscriptions/listen` is
//! served in the HTTP request's own task instead of through rmcp's per-request service.
//!
//! rmcp serves each stateless request by building a service for it: it spawns a service task
//! and a handler task and passes the request and the answer through channels. At low
//! concurrency those hand-offs and the worker-thread wake-ups they cause cost several times
//! what the gateway's own work does (the `gateway_mcp` bench shows it), and for as long as a
//! listen stream is open its channels cost some 45 KB (the `connections` bench). The two
//! methods a client sends on every call, and the one it keeps open, are therefore answered
//! here, with the same handler code and the same JSON-RPC types, serialized the way rmcp
//! serializes them.
//!
//! [`take`] only takes a request rmcp would accept and would answer the same way; everything
//! else goes to rmcp unchanged, which keeps every other rule (and every rejection) in one place:
//!
//! - `Accept` names both `application/json` and `text/event-stream` with no parameters, and
//!   `Content-Type` is JSON (checked by the caller);
//! - no `Origin` header, and the `Host` is one of the allowed hosts (compared as rmcp does);
//! - the body is one JSON-RPC request, read as the one request type its method names rather
//!   than through rmcp's untagged enums ([`parse_request`]);
//! - with `MCP-Protocol-Version` absent or a known revision older than 2026-07-28: a
//!   `tools/list` or `tools/call` (not a built-in tool, no `inputResponses`/`requestState`),
//!   without a per-request `_meta` protocol version;
//! - with one `MCP-Protocol-Version` of 2026-07-28 or later that the gateway speaks: a
//!   `subscriptions/listen` with one `Mcp-Method` naming it, and the same revision and the
//!   client's capabilities in its `_meta` (what rmcp checks of such a request).
//!
//! A listing's answer is written from each tool's definition serialized once
//! ([`super::convert::to_mcp_json`]), in the shape rmcp gives the same page for these
//! revisions (no `resultType`). A call runs in the request's task, and is answered in JSON
//! unless a message for the client comes first: its progress, its upstream server's log
//! messages, or a request that server sends the caller ([`super::asks`]). The answer is then an
//! SSE stream of those messages and the answer, as rmcp's JSON response mode falls back to
//! (rmcp's stateless service could not ask the caller: it numbers its own requests from 0 in
//! every request, so answers could not be told apart). A client that goes away cancels the
//! call, as under rmcp: the rest of the call moves to a task of its own (see [`Detached`]),
//! where the executor stops the run and the outcome is counted, rather than the call being
//! dropped half-way. A listen is an SSE stream polled by its connection alone ([`listen`]):
//! no task and no channel of its own.

use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};

use std::sync::Arc;

use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use http::header::{ACCEPT, CONTENT_TYPE, ORIGIN};
use http::{HeaderMap, HeaderValue, StatusCode};
use rmcp::ErrorData;
use rmcp::ServerHandler;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, ClientRequest, GetMeta, JsonRpcRequest, ListToolsRequest,
    NotificationMetaObject, PaginatedRequestParams, ProtocolVersion, RequestId, RequestMetaObject,
    ServerJsonRpcMessage, ServerNotification, ServerResult, SubscriptionFilter, SubscriptionsAcknowledgedNotification,
    SubscriptionsAcknowledgedNotificationParams, SubscriptionsListenRequest, SubscriptionsListenResult,
    Tool as McpTool,
};
use serde::Serialize;
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::core::{ClientAsker, ProgressSink};
use crate::hosts::AllowedHosts;
use crate::identity::Identity;

use super::asks::StreamAsker;
use super::changes::ChangeFeed;
use super::handler::{
    ClientLogs, ClientOut, ClientProgress, Entry, McpHandler, RequestInfo, SUPPORTED_PROTOCOL_VERSIONS, builtin_of,
    watched,
};
use super::{Scope, convert, errors};

/// The header that names the protocol revision a request speaks.
const MCP_PROTOCOL_VERSION: &str = "mcp-protocol-version";

/// The header that names a 2026-07-28 request's method.
const MCP_METHOD: &str = "mcp-method";

/// A request the direct path serves.
pub(super) enum Direct {
    /// `tools/list`.
    List { id: RequestId, params: Option<PaginatedRequestParams> },
    /// `tools/call` of a registered tool.
    Call { id: RequestId, params: CallToolRequestParams, meta: RequestMetaObject },
    /// `subscriptions/listen` (2026-07-28).
    Listen { id: RequestId, requested: SubscriptionFilter },
}

/// `Some` when the direct path serves this request (see the module docs); `None` sends it to
/// rmcp. `allowed_hosts` is the setting rmcp enforces.
pub(super) fn take(parts: &http::request::Parts, body: &[u8], allowed_hosts: &AllowedHosts) -> Option<Direct> {
    let headers = &parts.headers;
    if !accepts_json_and_sse(headers)
        || !super::declares_json(headers)
        || headers.contains_key(ORIGIN)
        || !allowed_hosts.allows(&parts.headers, &parts.uri)
    {
        return None;
    }
    if is_legacy_version(headers) { take_list_or_call(parts, body) } else { take_listen(headers, body) }
}

/// A plain `tools/list` or `tools/call` of a 2025-era client.
fn take_list_or_call(parts: &http::request::Parts, body: &[u8]) -> Option<Direct> {
    let request = parse_request(body)?;
    let meta = request.request.get_meta().clone();
    if meta.protocol_version().is_some() {
        return None;
    }
    let scope = parts.extensions.get::<Scope>().cloned().unwrap_or(Scope::All);
    let id = request.id;
    match request.request {
        ClientRequest::ListToolsRequest(list) => Some(Direct::List { id, params: list.params }),
        ClientRequest::CallToolRequest(call)
            if scope != Scope::Search
                && builtin_of(&scope, &call.params.name).is_none()
                && call.params.input_responses.is_none()
                && call.params.request_state.is_none() =>
        {
            Some(Direct::Call { id, params: call.params, meta })
        }
        _ => None,
    }
}

/// A `subscriptions/listen` that names its revision as rmcp requires it to: one
/// `MCP-Protocol-Version` of 2026-07-28 or later that the gateway speaks, the same in the
/// request's `_meta` with the client's capabilities, and one `Mcp-Method` naming the method.
fn take_listen(headers: &HeaderMap, body: &[u8]) -> Option<Direct> {
    let version = single(headers, MCP_PROTOCOL_VERSION)?;
    let speaks = SUPPORTED_PROTOCOL_VERSIONS
        .iter()
        .any(|v| v.as_str() == version && version >= ProtocolVersion::V_2026_07_28.as_str());
    if !speaks || single(headers, MCP_METHOD)? != "subscriptions/listen" {
        return None;
    }
    let request = parse_request(body)?;
    let meta = request.request.get_meta();
    if meta.protocol_version().is_none_or(|v| v.as_str() != version)
        || !meta.missing_required_keys(&ProtocolVersion::V_2026_07_28).is_empty()
    {
        return None;
    }
    match request.request {
        ClientRequest::SubscriptionsListenRequest(listen) => {
            Some(Direct::Listen { id: request.id, requested: listen.params.notifications })
        }
        _ => None,
    }
}

/// The one value of header `name`, as text.
fn single<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    let mut values = headers.get_all(name).iter();
    let value = values.next()?;
    values.next().is_none().then(|| value.to_str().ok()).flatten()
}

/// The body as the `tools/list` or `tools/call` request rmcp reads from it, or `None` for
/// anything else (rmcp then reads it and answers).
///
/// rmcp reads every message as `ClientJsonRpcMessage`: an untagged enum buffered through
/// serde's `Content`, whose request variant holds `ClientRequest`, an untagged enum of some
/// twenty request types tried in order, each failing attempt building an error. Here the
/// top-level keys are read first and classified as rmcp classifies them (a request has
/// `method` and `id` and neither `result` nor `error`), then the body is read as the one
/// request type its method names, the type rmcp's own reading ends at: every `ClientRequest`
/// type before it accepts only its own method. A key given twice, a key or method written
/// with escapes, or a body the typed read refuses goes to rmcp unchanged.
fn parse_request(body: &[u8]) -> Option<JsonRpcRequest<ClientRequest>> {
    let keys = serde_json::from_slice::<TopLevelKeys>(body).ok()?;
    if !(keys.id && !keys.result && !keys.error) {
        return None;
    }
    let (id, request) = match keys.method? {
        "tools/list" => {
            let list = serde_json::from_slice::<JsonRpcRequest<ListToolsRequest>>(body).ok()?;
            (list.id, ClientRequest::from(list.request))
        }
        "tools/call" => {
            let call = serde_json::from_slice::<JsonRpcRequest<CallToolRequest>>(body).ok()?;
            (call.id, ClientRequest::from(call.request))
        }
        "subscriptions/listen" => {
            let listen = serde_json::from_slice::<JsonRpcRequest<SubscriptionsListenRequest>>(body).ok()?;
            (listen.id, ClientRequest::from(listen.request))
        }
        _ => return None,
    };
    Some(JsonRpcRequest::new(id, request))
}

/// The top-level keys that decide a JSON-RPC message's shape, and the method.
#[derive(Default)]
struct TopLevelKeys<'a> {
    method: Option<&'a str>,
    id: bool,
    result: bool,
    error: bool,
}

impl<'de> Deserialize<'de> for TopLevelKeys<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Keys;

        impl<'de> Visitor<'de> for Keys {
            type Value = TopLevelKeys<'de>;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON-RPC message")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<TopLevelKeys<'de>, A::Error> {
                let mut keys = TopLevelKeys::default();
                while let Some(key) = map.next_key::<&'de str>()? {
                    let seen_before = match key {
                        "method" => keys.method.replace(map.next_value()?).is_some(),
                        other => {
                            map.next_value::<IgnoredAny>()?;
                            match other {
                                "id" => std::mem::replace(&mut keys.id, true),
                                "result" => std::mem::replace(&mut keys.result, true),
                                "error" => std::mem::replace(&mut keys.error, true),
                                _ => false,
                            }
                        }
                    };
                    if seen_before {
                        return Err(serde::de::Error::custom("a key given twice"));
                    }
                }
                Ok(keys)
            }
        }

        deserializer.deserialize_map(Keys)
    }
}

impl Direct {
    /// Answers the request as rmcp's JSON response mode does: one JSON-RPC message, HTTP 200,
    /// or an SSE stream for a call with messages before its answer ([`call`]). `stop` is the
    /// server's hard stop at the end of the shutdown grace period.
    pub(super) async fn serve(
        self,
        handler: &McpHandler,
        parts: http::request::Parts,
        stop: &CancellationToken,
    ) -> Response {
        match self {
            Direct::List { id, params } => {
                let info = RequestInfo {
                    parts: Some(&parts),
                    request_id: serde_json::to_value(&id).unwrap_or(Value::Null),
                    cancel: CancellationToken::new(),
                    meta_traceparent: None,
                    progress: None,
                    logs: None,
                    asker: None,
                };
                let result =
                    handler.list_page(params, &info, |page, next_cursor| list_answer(&id, page, next_cursor)).await;
                handler.count("tools/list", result.is_ok());
                match result {
                    Ok(Ok(body)) => json_response(body),
                    Ok(Err(e)) => serialization_failed(&e),
                    Err(error) => respond(Err(error), id),
                }
            }
            Direct::Call { id, params, meta } => call(handler, parts, id, params, meta, stop).await,
            Direct::Listen { id, requested } => listen(handler, &parts, id, &requested).await,
        }
    }
}

/// How many messages for the client wait at most while the answer to the call is being sent.
const CLIENT_MESSAGES: usize = 16;

/// Runs a `tools/call` and answers it: in JSON when the answer comes before anything else,
/// else on an SSE stream that carries the call's progress, its upstream server's log messages
/// and requests for the caller ([`super::asks`]), then the answer (as rmcp's JSON response
/// mode does).
async fn call(
    handler: &McpHandler,
    parts: http::request::Parts,
    id: RequestId,
    params: CallToolRequestParams,
    meta: RequestMetaObject,
    stop: &CancellationToken,
) -> Response {
    let (out, messages) = mpsc::channel::<String>(CLIENT_MESSAGES);
    let cancel = CancellationToken::new();
    let request_id = serde_json::to_value(&id).unwrap_or(Value::Null);
    let task_handler = handler.clone();
    let task_cancel = cancel.clone();
    let asker = parts.extensions.get::<Identity>().map(|who| {
        let state = handler.state();
        Arc::new(StreamAsker {
            asks: state.asks.clone(),
            store: state.store.clone(),
            owner: who.owner_key(),
            out: out.clone(),
        }) as Arc<dyn ClientAsker>
    });
    let run = AssertUnwindSafe(async move {
        let info = RequestInfo {
            parts: Some(&parts),
            request_id,
            cancel: task_cancel,
            meta_traceparent: meta.0.get_traceparent(),
            progress: meta.get_progress_token().map(|token| {
                Arc::new(ClientProgress { out: ClientOut::Stream(out.clone()), token }) as Arc<dyn ProgressSink>
            }),
            logs: Some(Arc::new(ClientLogs::new(ClientOut::Stream(out), &meta))),
            asker,
        };
        let result = task_handler.call_registered(params, &info).await;
        task_handler.count("tools/call", result.is_ok());
        result
    })
    .catch_unwind();
    answer(Detached::new(run, cancel), messages, id, stop).await
}

/// Answers call `id` run by `run`, which sends the client `messages` on its way: in JSON when
/// it ends with none sent, else on an SSE stream of those messages, then the answer.
async fn answer<F>(
    mut run: Detached<F>,
    mut messages: mpsc::Receiver<String>,
    id: RequestId,
    stop: &CancellationToken,
) -> Response
where
    F: Future<Output = std::thread::Result<Result<CallToolResult, ErrorData>>> + Send + 'static,
{
    let (first, stream) = tokio::select! {
        biased;
        Some(message) = messages.recv() => (message, ClientStream { run: Some(run), messages, id, answer: None }),
        result = &mut run => {
            let result = call_answer(result);
            // The poll that ended the call may have sent messages too (an upstream server's log
            // messages read with its answer): they go first.
            let Ok(first) = messages.try_recv() else { return respond(result, id) };
            let answer = Some(super::to_json(&answer_message(result, id.clone())));
            (first, ClientStream { run: None, messages, id, answer })
        }
        () = stop.cancelled() => {
            // `run` is dropped here: the call is cancelled and finishes in a task of its own.
            return (StatusCode::SERVICE_UNAVAILABLE, "the server is shutting down\n").into_response();
        }
    };
    let messages = futures::stream::once(std::future::ready(first))
        .chain(futures::stream::unfold(stream, ClientStream::next))
        .take_until(stop.clone().cancelled_owned());
    super::sse_response(messages)
}

/// Serves a `subscriptions/listen` as rmcp's service does, without the service: an SSE stream
/// of the acknowledgment of what was accepted, then the notifications, each naming the
/// subscription (the request's id), and the final result when the gateway stops. A stream
/// past the limits, and an unauthenticated one, is answered with the error alone, before
/// anything is acknowledged.
async fn listen(
    handler: &McpHandler,
    parts: &http::request::Parts,
    id: RequestId,
    requested: &SubscriptionFilter,
) -> Response {
    let opened = parts
        .extensions
        .get::<Identity>()
        .ok_or_else(errors::unauthenticated)
        .and_then(|who| Ok((who, handler.admit_stream(who)?)));
    let (who, permit) = match opened {
        Ok(opened) => opened,
        Err(error) => return respond(Err(error), id),
    };
    let accepted = handler.subscription_filter(requested);
    let (wants, uris) = watched(&accepted);
    let scope = parts.extensions.get::<Scope>().cloned().unwrap_or(Scope::All);
    let feed = ChangeFeed::new(handler, who, scope, wants, &uris).await;
    let mut acknowledgment =
        SubscriptionsAcknowledgedNotification::new(SubscriptionsAcknowledgedNotificationParams::new(accepted));
    let mut meta = NotificationMetaObject::new();
    meta.set_subscription_id(id.clone());
    acknowledgment.extensions.insert(meta);
    let acknowledgment = ServerNotification::SubscriptionsAcknowledgedNotification(acknowledgment);
    let subscription = id.clone();
    let notifications = feed.into_stream(uris).map(move |mut notification| {
        notification.get_meta_mut().set_subscription_id(subscription.clone());
        ServerJsonRpcMessage::notification(notification)
    });
    let mut end = SubscriptionsListenResult::complete(id.clone());
    end.meta.set_server_info(handler.get_info().server_info);
    let end = ServerJsonRpcMessage::response(ServerResult::SubscriptionsListenResult(end), id);
    let messages = futures::stream::once(std::future::ready(ServerJsonRpcMessage::notification(acknowledgment)))
        .chain(notifications)
        .chain(futures::stream::once(std::future::ready(end)))
        .map(move |message| {
            let _open = &permit;
            super::to_json(&message)
        });
    super::sse_response(messages)
}

/// A call's result, or an error for a call that panicked in the gateway.
fn call_answer(result: std::thread::Result<Result<CallToolResult, ErrorData>>) -> Result<ServerResult, ErrorData> {
    let result = result.unwrap_or_else(|_panic| {
        tracing::error!("a tool call panicked in the gateway");
        Err(ErrorData::internal_error("the call failed in the gateway", None))
    });
    result.map(ServerResult::CallToolResult)
}

/// The rest of a call's SSE answer: its messages while it runs, those still queued when it
/// ends, then the answer. Dropped before the end (the client went away), the call is cancelled
/// as [`Detached`] says.
struct ClientStream<F: Future<Output: Send + 'static> + Send + 'static> {
    run: Option<Detached<F>>,
    messages: mpsc::Receiver<String>,
    id: RequestId,
    answer: Option<String>,
}

impl<F> ClientStream<F>
where
    F: Future<Output = std::thread::Result<Result<CallToolResult, ErrorData>>> + Send + 'static,
{
    async fn next(mut self) -> Option<(String, Self)> {
        if let Some(run) = self.run.as_mut() {
            tokio::select! {
                biased;
                Some(message) = self.messages.recv() => return Some((message, self)),
                result = run => {
                    self.run = None;
                    self.answer = Some(super::to_json(&answer_message(call_answer(result), self.id.clone())));
                }
            }
        }
        if let Ok(message) = self.messages.try_recv() {
            return Some((message, self));
        }
        let answer = self.answer.take()?;
        Some((answer, self))
    }
}

/// A call run in the request's own task that outlives the request if the request goes away.
///
/// Polled to the end, it is the call itself: no task is spawned and no wake-up crosses
/// threads. Dropped before the end (the client disconnected, or the server stopped waiting),
/// it cancels `cancel` and moves the rest of the call into a task of its own, so the call
/// still ends as a cancelled call does: the executor stops the run and the outcome is
/// counted, instead of the call being cut off half-way.
struct Detached<F: Future<Output: Send + 'static> + Send + 'static> {
    call: Option<Pin<Box<F>>>,
    cancel: CancellationToken,
}

impl<F: Future<Output: Send + 'static> + Send + 'static> Detached<F> {
    fn new(call: F, cancel: CancellationToken) -> Self {
        Detached { call: Some(Box::pin(call)), cancel }
    }
}

impl<F: Future<Output: Send + 'static> + Send + 'static> Future for Detached<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let Some(call) = self.call.as_mut() else { panic!("Detached polled after it completed") };
        let output = std::task::ready!(call.as_mut().poll(cx));
        self.call = None;
        Poll::Ready(output)
    }
}

impl<F: Future<Output: Send + 'static> + Send + 'static> Drop for Detached<F> {
    fn drop(&mut self) {
        let Some(call) = self.call.take() else { return };
        self.cancel.cancel();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(call);
            }
            // No runtime left (the process is exiting): nothing could run the rest.
            Err(_) => tracing::warn!("a tool call was dropped while its runtime shut down"),
        }
    }
}

/// The JSON-RPC answer, with the legacy shape older revisions expect (as rmcp's handler
/// produces it for them).
fn answer_message(result: Result<ServerResult, ErrorData>, id: RequestId) -> ServerJsonRpcMessage {
    match result {
        Ok(mut result) => {
            result.strip_result_type_for_legacy_peer();
            result.strip_non_object_output_for_legacy_peer();
            ServerJsonRpcMessage::response(result, id)
        }
        Err(error) => ServerJsonRpcMessage::error(error, Some(id)),
    }
}

/// [`answer_message`] as a JSON body.
fn respond(result: Result<ServerResult, ErrorData>, id: RequestId) -> Response {
    match serde_json::to_vec(&answer_message(result, id)) {
        Ok(body) => json_response(body),
        Err(e) => serialization_failed(&e),
    }
}

fn json_response(body: Vec<u8>) -> Response {
    ([(CONTENT_TYPE, HeaderValue::from_static("application/json"))], Bytes::from(body)).into_response()
}

fn serialization_failed(e: &serde_json::Error) -> Response {
    tracing::error!(error = %e, "serializing a JSON-RPC answer failed");
    (StatusCode::INTERNAL_SERVER_ERROR, "could not serialize the answer\n").into_response()
}

/// A `tools/list` answer: the JSON-RPC response rmcp writes for these revisions.
#[derive(Serialize)]
struct ListAnswer<'a> {
    jsonrpc: &'static str,
    id: &'a RequestId,
    result: ListPage<'a>,
}

#[derive(Serialize)]
struct ListPage<'a> {
    #[serde(rename = "nextCursor", skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
    tools: Vec<Listed<'a>>,
}

/// One tool of a listing: a registered tool's definition as serialized once, or a built-in's.
#[derive(Serialize)]
#[serde(untagged)]
enum Listed<'a> {
    Kept(&'a RawValue),
    Builtin(McpTool),
}

/// The body answering `tools/list` request `id` with `page`.
fn list_answer(id: &RequestId, page: &[Entry<'_>], next_cursor: Option<String>) -> serde_json::Result<Vec<u8>> {
    let tools = page
        .iter()
        .map(|e| match e {
            Entry::Catalog(t) => Listed::Kept(convert::to_mcp_json(t)),
            Entry::Builtin(b) => Listed::Builtin(b.definition()),
        })
        .collect();
    serde_json::to_vec(&ListAnswer { jsonrpc: "2.0", id, result: ListPage { next_cursor, tools } })
}

/// `Accept` names both types. An entry with parameters makes it false: a quality weight may
/// exclude a type, and rmcp decides those.
fn accepts_json_and_sse(headers: &HeaderMap) -> bool {
    let (mut json, mut sse) = (false, false);
    for value in headers.get_all(ACCEPT) {
        let Ok(value) = value.to_str() else { return false };
        for entry in value.split(',') {
            let entry = entry.trim();
            if entry.contains(';') || entry.contains('"') {
                return false;
            }
            json |= entry.eq_ignore_ascii_case("application/json");
            sse |= entry.eq_ignore_ascii_case("text/event-stream");
        }
    }
    json && sse
}

/// Absent, or a known revision older than 2026-07-28.
fn is_legacy_version(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(MCP_PROTOCOL_VERSION) else { return true };
    let Ok(version) = value.to_str() else { return false };
    version < ProtocolVersion::V_2026_07_28.as_str()
        && ProtocolVersion::KNOWN_VERSIONS.iter().any(|v| v.as_str() == version)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const LIST: &str = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;

    #[tokio::test]
    async fn a_detached_call_dropped_half_way_is_cancelled_and_runs_to_its_end() {
        let cancel = CancellationToken::new();
        let (ended, end) = tokio::sync::oneshot::channel();
        let seen = cancel.clone();
        let mut run = Detached::new(
            async move {
                seen.cancelled().await;
                ended.send("stopped after the cancellation").ok();
            },
            cancel.clone(),
        );
        assert!(futures::poll!(&mut run).is_pending(), "the call waits");
        assert!(!cancel.is_cancelled());
        drop(run);
        assert!(cancel.is_cancelled(), "dropping the request cancels the call");
        assert_eq!(end.await, Ok("stopped after the cancellation"), "the rest of the call ran in a task");
    }

    /// The listing's answer written from serialized definitions is the one rmcp writes for the
    /// same page (through `respond`, as every other direct answer).
    #[test]
    fn a_listing_answers_as_rmcp_does_for_the_same_page() {
        use std::sync::Arc;

        use rmcp::model::ListToolsResult;

        use crate::catalog::Tool;
        use crate::mcp::builtin::Builtin;

        let tool = |spec: Value| {
            Arc::new(Tool::new("ns".into(), "t".into(), 1, serde_json::from_value(spec).unwrap()).unwrap())
        };
        let plain = tool(json!({
            "name": "a_plain", "description": "d \"quoted\" \u{e9}\n", "inputSchema": {"type": "object"},
            "runtime": {"image": "i", "command": ["x"]},
        }));
        let full = tool(json!({
            "name": "b_full", "title": "Full", "description": "Prices it.",
            "inputSchema": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]},
            "outputSchema": {"type": "object", "properties": {"price": {"type": "number"}}},
            "annotations": {"readOnlyHint": true, "openWorldHint": false},
            "runtime": {"image": "i", "command": ["x"]},
        }));
        for (id, next_cursor) in
            [(RequestId::Number(7), None), (RequestId::String("p2".into()), Some("Yl9mdWxs".to_owned()))]
        {
            let page = [Entry::Catalog(&plain), Entry::Builtin(Builtin::ListTasks), Entry::Catalog(&full)];
            let written = list_answer(&id, &page, next_cursor.clone()).unwrap();
            let mut result = ListToolsResult::with_all_items(vec![
                convert::to_mcp_tool(&plain),
                Builtin::ListTasks.definition(),
                convert::to_mcp_tool(&full),
            ]);
            result.next_cursor = next_cursor;
            let response = respond(Ok(ServerResult::ListToolsResult(result)), id);
            let expected = futures::executor::block_on(axum::body::to_bytes(response.into_body(), usize::MAX)).unwrap();
            assert_eq!(
                serde_json::from_slice::<Value>(&written).unwrap(),
                serde_json::from_slice::<Value>(&expected).unwrap()
            );
        }
    }

    /// The messages a call sends its client in the poll that ends it (an upstream server's log
    /// messages read with its answer) reach the client before the answer; a call that sends
    /// none is answered in JSON.
    #[tokio::test]
    async fn messages_sent_by_the_poll_that_ends_a_call_come_before_its_answer() {
        let answered = |sent: &'static [&'static str]| async move {
            let (out, messages) = mpsc::channel(CLIENT_MESSAGES);
            let run = async move {
                for message in sent {
                    out.send((*message).to_owned()).await.expect("queued");
                }
                Ok(Ok(CallToolResult::success(vec![])))
            };
            let response = answer(
                Detached::new(run, CancellationToken::new()),
                messages,
                RequestId::Number(1),
                &CancellationToken::new(),
            )
            .await;
            let kind = response.headers()[CONTENT_TYPE].to_str().unwrap().to_owned();
            let body = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
            (kind, String::from_utf8(body.to_vec()).unwrap())
        };

        let (kind, body) = answered(&["{\"n\":1}", "{\"n\":2}"]).await;
        assert_eq!(kind, "text/event-stream");
        let events: Vec<&str> = body.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
        assert_eq!(events.len(), 3, "{body}");
        assert_eq!(events[..2], ["{\"n\":1}", "{\"n\":2}"]);
        assert_eq!(serde_json::from_str::<Value>(events[2]).unwrap()["id"], 1, "the answer comes last");

        let (kind, body) = answered(&[]).await;
        assert_eq!(kind, "application/json");
        assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["id"], 1);
    }

    #[tokio::test]
    async fn a_detached_call_polled_to_its_end_is_not_cancelled() {
        let cancel = CancellationToken::new();
        assert_eq!(Detached::new(async { 7 }, cancel.clone()).await, 7);
        assert!(!cancel.is_cancelled());
    }

    fn parts(headers: &[(&str, &str)], scope: Scope) -> http::request::Parts {
        let mut builder = http::Request::post("/mcp")
            .header("host", "127.0.0.1:8080")
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let (mut parts, ()) = builder.body(()).expect("request").into_parts();
        // A later header of the same name replaces the default one.
        for (name, value) in headers {
            parts
                .headers
                .insert(http::HeaderName::from_bytes(name.as_bytes()).expect("name"), value.parse().expect("v"));
        }
        parts.extensions.insert(scope);
        parts
    }

    fn hosts() -> AllowedHosts {
        AllowedHosts::new(&crate::state::loopback_hosts())
    }

    fn call(name: &str) -> String {
        json!({"jsonrpc": "2.0", "id": "a", "method": "tools/call", "params": {"name": name, "arguments": {"x": 1}}})
            .to_string()
    }

    #[test]
    fn plain_list_and_call_requests_take_the_direct_path() {
        let plain = parts(&[], Scope::All);
        assert!(matches!(take(&plain, LIST.as_bytes(), &hosts()), Some(Direct::List { .. })));
        assert!(matches!(take(&plain, call("price_option").as_bytes(), &hosts()), Some(Direct::Call { .. })));
        for version in ["2025-11-25", "2025-06-18", "2025-03-26"] {
            let p = parts(&[("mcp-protocol-version", version)], Scope::All);
            assert!(take(&p, LIST.as_bytes(), &hosts()).is_some(), "{version}");
        }
        for host in ["localhost", "LOCALHOST:1", "[::1]:8080", "127.0.0.1"] {
            assert!(take(&parts(&[("host", host)], Scope::All), LIST.as_bytes(), &hosts()).is_some(), "{host}");
        }
        assert!(
            take(&parts(&[("host", "gw.example:443")], Scope::All), LIST.as_bytes(), &AllowedHosts::new(&[])).is_some(),
            "no list"
        );
        // A call with a progress token is answered on an SSE stream when progress comes first.
        let progress = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "t", "arguments": {}, "_meta": {"progressToken": 7}}});
        assert!(matches!(take(&plain, progress.to_string().as_bytes(), &hosts()), Some(Direct::Call { .. })));
        // A built-in's name on a toolset endpoint is just a tool name there.
        let toolset = parts(&[], Scope::Toolset("pricing".into()));
        assert!(take(&toolset, call("run_coding_task").as_bytes(), &hosts()).is_some());
    }

    #[test]
    fn everything_else_is_left_to_rmcp() {
        let plain = parts(&[], Scope::All);
        let meta_version = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list",
            "params": {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}});
        let mrtr = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "t", "arguments": {}, "requestState": "abc"}});
        for body in [
            call("run_coding_task"),
            call("list_tasks"),
            meta_version.to_string(),
            mrtr.to_string(),
            r#"{"jsonrpc":"2.0","id":1,"method":"resources/list"}"#.to_owned(),
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}"#.to_owned(),
            r#"[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]"#.to_owned(),
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list""#.to_owned(),
            r#"{"jsonrpc":"2.0","id":1,"result":{}}"#.to_owned(),
        ] {
            assert!(take(&plain, body.as_bytes(), &hosts()).is_none(), "{body}");
        }
        for headers in [
            vec![("mcp-protocol-version", "2026-07-28")],
            vec![("mcp-protocol-version", "1999-01-01")],
            vec![("accept", "application/json;q=1, text/event-stream")],
            vec![("accept", "application/json")],
            vec![("accept", "text/event-stream")],
            vec![("content-type", "text/plain")],
            vec![("origin", "http://127.0.0.1:8080")],
            vec![("host", "evil.example")],
            vec![("host", "localhost.evil.example:8080")],
            vec![("host", "not a host")],
        ] {
            assert!(take(&parts(&headers, Scope::All), LIST.as_bytes(), &hosts()).is_none(), "{headers:?}");
        }
        let pinned = AllowedHosts::new(&["127.0.0.1:9000".to_owned()]);
        assert!(take(&plain, LIST.as_bytes(), &pinned).is_none(), "an allowed host with a port pins the port");
    }

    /// A 2026-07-28 `subscriptions/listen` as rmcp's client sends it, with `meta` as its `_meta`.
    fn listen_body(meta: Value) -> String {
        json!({"jsonrpc": "2.0", "id": 9, "method": "subscriptions/listen",
            "params": {"notifications": {"toolsListChanged": true}, "_meta": meta}})
        .to_string()
    }

    fn modern_meta() -> Value {
        json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}})
    }

    const MODERN: [(&str, &str); 2] = [("mcp-protocol-version", "2026-07-28"), ("mcp-method", "subscriptions/listen")];

    #[test]
    fn a_listen_naming_its_revision_takes_the_direct_path() {
        let body = listen_body(modern_meta());
        match take(&parts(&MODERN, Scope::All), body.as_bytes(), &hosts()) {
            Some(Direct::Listen { id, requested }) => {
                assert_eq!(id, RequestId::Number(9));
                assert_eq!(requested.tools_list_changed, Some(true));
            }
            _ => panic!("not taken: {body}"),
        }
    }

    #[test]
    fn a_listen_rmcp_would_refuse_or_read_otherwise_is_left_to_it() {
        let body = listen_body(modern_meta());
        // Headers: a missing, wrong or second Mcp-Method; another revision; no revision.
        for headers in [
            vec![("mcp-protocol-version", "2026-07-28")],
            vec![("mcp-protocol-version", "2026-07-28"), ("mcp-method", "tools/list")],
            vec![("mcp-protocol-version", "2025-11-25"), ("mcp-method", "subscriptions/listen")],
            vec![("mcp-protocol-version", "2099-01-01"), ("mcp-method", "subscriptions/listen")],
            vec![("mcp-method", "subscriptions/listen")],
            vec![MODERN[0], MODERN[1], ("origin", "http://127.0.0.1:8080")],
        ] {
            assert!(take(&parts(&headers, Scope::All), body.as_bytes(), &hosts()).is_none(), "{headers:?}");
        }
        let mut twice = parts(&MODERN, Scope::All);
        twice.headers.append("mcp-method", HeaderValue::from_static("subscriptions/listen"));
        assert!(take(&twice, body.as_bytes(), &hosts()).is_none(), "two Mcp-Method headers");
        // The body's _meta: without the revision or the capabilities, or with another revision.
        for meta in [
            json!({"io.modelcontextprotocol/clientCapabilities": {}}),
            json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28"}),
            json!({"io.modelcontextprotocol/protocolVersion": "2025-11-25",
                "io.modelcontextprotocol/clientCapabilities": {}}),
        ] {
            let body = listen_body(meta);
            assert!(take(&parts(&MODERN, Scope::All), body.as_bytes(), &hosts()).is_none(), "{body}");
        }
        // Any other 2026-07-28 request.
        let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": modern_meta()}});
        let list_headers = [MODERN[0], ("mcp-method", "tools/list")];
        assert!(take(&parts(&list_headers, Scope::All), list.to_string().as_bytes(), &hosts()).is_none());
        // A listen of a 2025-era client (rmcp refuses it: not found).
        assert!(take(&parts(&[], Scope::All), body.as_bytes(), &hosts()).is_none());
    }

    /// rmcp's own reading of a body, for comparison.
    fn rmcp_reads(body: &str) -> Option<JsonRpcRequest<ClientRequest>> {
        match serde_json::from_str::<rmcp::model::ClientJsonRpcMessage>(body) {
            Ok(rmcp::model::ClientJsonRpcMessage::Request(request)) => Some(request),
            _ => None,
        }
    }

    #[test]
    fn the_typed_read_takes_what_rmcp_reads_as_list_or_call_and_reads_it_the_same() {
        let taken = [
            LIST,
            r#"{"jsonrpc":"2.0","id":"x","method":"tools/list","params":{"cursor":"abc"}}"#,
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/list","params":null}"#,
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{"_meta":{"progressToken":"p"}}}"#,
            r#"{"method":"tools/list","extra":[1,{"id":2,"result":3}],"id":4,"jsonrpc":"2.0"}"#,
            r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"t","arguments":{"x":[1.5,"\u00e9"]}}}"#,
            r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"t","_meta":{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}}"#,
            r#"{"jsonrpc":"2.0","id":7,"method":"subscriptions/listen","params":{"notifications":{"toolsListChanged":true,"resourceSubscriptions":["a://b"]},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}"#,
            r#"{"jsonrpc":"2.0","id":8,"method":"subscriptions/listen","params":{"notifications":{}}}"#,
        ];
        for body in taken {
            let ours = parse_request(body.as_bytes()).unwrap_or_else(|| panic!("not taken: {body}"));
            let theirs = rmcp_reads(body).unwrap_or_else(|| panic!("rmcp does not read it: {body}"));
            assert_eq!(ours.id, theirs.id, "{body}");
            assert_eq!(ours.request.method(), theirs.request.method(), "{body}");
            assert_eq!(ours.request.get_meta(), theirs.request.get_meta(), "{body}");
            assert_eq!(serde_json::to_value(&ours).unwrap(), serde_json::to_value(&theirs).unwrap(), "{body}");
        }
    }

    #[test]
    fn the_typed_read_leaves_every_other_shape_to_rmcp() {
        // Where rmcp reads one of these as a list or a call (escaped keys, say), it answers.
        for body in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","result":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","error":null}"#,
            r#"{"jsonrpc":"2.0","method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","id":2}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","method":"tools/call"}"#,
            r#"{"jsonrpc":"2.0","id":1,"\u006dethod":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools\/list"}"#,
            r#"{"jsonrpc":"1.0","id":1,"method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":"oops"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen","params":{"notifications":7}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":7}"#,
            r#"[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list""#,
        ] {
            assert!(parse_request(body.as_bytes()).is_none(), "{body}");
        }
    }
}

//! The log messages (`notifications/message`) and the requests for its caller
//! (`sampling/createMessage`, `elicitation/create`) an upstream server sends during a call, on
//! their way to the call's caller.
//!
//! rmcp's client hands every notification and request of a connection to one handler, without
//! the request it came with. Over Streamable HTTP, though, a server sends a call's messages on
//! that call's own response stream. [`CallStreams`] is the HTTP client under rmcp's transport:
//! it sends as reqwest's does, and reads each SSE stream that answers a request carrying a
//! [`LogRoute`] or an [`AskRoute`] (put there by the call's [`super::link::Link`]):
//!
//! - each log message is handed to the log route as it goes by, and reaches rmcp too;
//! - each request for the caller is taken off the stream and asked of the ask route, in a task
//!   of its own (the stream goes on meanwhile); the caller's answer (or error) is posted back
//!   to the server as rmcp would post it, with the request's own id, session and headers. At
//!   most [`MAX_ASKS_AT_ONCE`] of a call's requests wait for the caller at once; the others
//!   are answered with an error at once.
//!
//! A server on stdio has one stream for everything, so its messages are tied to no call: log
//! messages reach nobody, and requests reach rmcp's handler, which answers that there is
//! nobody to ask.
//!
//! A call's messages wait in a queue of [`LOG_QUEUE`]; one that finds it full is dropped and
//! counted ([`LogReceiver::dropped`]), so a server that floods slows neither the connection nor
//! the caller.
//!
//! MCP deprecates logging (SEP-2577) but keeps it in 2025-11-25 and 2026-07-28, and rmcp marks
//! its logging types deprecated: they are used here, and only named elsewhere.
#![allow(deprecated)]

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::StreamExt;
use futures::stream::BoxStream;
use http::{HeaderName, HeaderValue};
use rmcp::model::{ClientJsonRpcMessage, GetExtensions};
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse, StreamableHttpResponseLimits,
};
use serde_json::Value;
use sse_stream::Sse;
use tokio::sync::mpsc;

use crate::core::ClientAsker;

/// One log message, as MCP's `notifications/message` carries it.
pub type LogMessage = rmcp::model::LoggingMessageNotificationParam;

/// How many of a call's log messages wait for its caller at most.
pub const LOG_QUEUE: usize = 64;

/// Where a call's log messages go ([`crate::executor::CallRequest::logs`]).
#[derive(Clone, Debug)]
pub struct LogSender {
    queue: mpsc::Sender<LogMessage>,
    dropped: Arc<AtomicUsize>,
}

/// The caller's end of a [`LogSender`].
#[derive(Debug)]
pub struct LogReceiver {
    queue: mpsc::Receiver<LogMessage>,
    dropped: Arc<AtomicUsize>,
}

/// A new queue for one call's log messages.
pub fn channel() -> (LogSender, LogReceiver) {
    let (sender, receiver) = mpsc::channel(LOG_QUEUE);
    let dropped = Arc::new(AtomicUsize::new(0));
    (LogSender { queue: sender, dropped: dropped.clone() }, LogReceiver { queue: receiver, dropped })
}

impl LogSender {
    /// Queues `message`, or drops and counts it when the queue is full (never waits).
    pub fn send(&self, message: LogMessage) {
        if self.queue.try_send(message).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl LogReceiver {
    /// The next message (`None` once every sender is gone and the queue is empty).
    pub async fn recv(&mut self) -> Option<LogMessage> {
        self.queue.recv().await
    }

    /// A message already queued, if any.
    pub fn try_recv(&mut self) -> Option<LogMessage> {
        self.queue.try_recv().ok()
    }

    /// How many messages found the queue full.
    pub fn dropped(&self) -> usize {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// Set in a call request's extensions: the SSE stream answering it hands its log messages here.
#[derive(Clone, Debug)]
pub struct LogRoute(pub LogSender);

/// Set in a call request's extensions: the requests for the caller on the SSE stream answering
/// it are asked here, at most [`MAX_ASKS_AT_ONCE`] at a time.
#[derive(Clone, Debug)]
pub struct AskRoute {
    asker: Arc<dyn ClientAsker>,
    at_once: Arc<tokio::sync::Semaphore>,
}

impl AskRoute {
    /// The route to `asker`, for one call.
    pub fn new(asker: Arc<dyn ClientAsker>) -> Self {
        AskRoute { asker, at_once: Arc::new(tokio::sync::Semaphore::new(MAX_ASKS_AT_ONCE)) }
    }

    /// The caller's answer to `request`, or an error when the call already has
    /// [`MAX_ASKS_AT_ONCE`] requests waiting for one (a server that floods its caller gets
    /// errors, at once, rather than a pile of waiting requests).
    async fn ask(&self, request: Relayed) -> Result<Value, rmcp::ErrorData> {
        let Ok(_permit) = self.at_once.clone().try_acquire_owned() else {
            return Err(rmcp::ErrorData::invalid_request(
                format!("the caller already has {MAX_ASKS_AT_ONCE} requests of this call to answer; ask again later"),
                None,
            ));
        };
        self.asker.ask(&request.method, request.params).await
    }
}

/// The most requests of one call that wait for the caller's answer at once.
pub const MAX_ASKS_AT_ONCE: usize = 4;

/// The methods a server may ask a call's caller, through the gateway.
const RELAYED_METHODS: [&str; 2] = ["sampling/createMessage", "elicitation/create"];

/// reqwest's Streamable HTTP client, reading the log messages off each call's response stream
/// (see the module docs).
#[derive(Clone)]
pub struct CallStreams(pub reqwest::Client);

impl StreamableHttpClient for CallStreams {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let taps = self.taps(&message, &uri, &session_id, &auth_header, &custom_headers);
        let response = self.0.post_message(uri, message, session_id, auth_header, custom_headers).await?;
        Ok(tapped(response, taps))
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let taps = self.taps(&message, &uri, &session_id, &auth_header, &custom_headers);
        let response = self
            .0
            .post_message_with_response_limits(uri, message, session_id, auth_header, custom_headers, limits)
            .await?;
        Ok(tapped(response, taps))
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<Self::Error>> {
        self.0.delete_session(uri, session_id, auth_header, custom_headers).await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, StreamableHttpError<Self::Error>> {
        self.0.get_stream(uri, session_id, last_event_id, auth_header, custom_headers).await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, StreamableHttpError<Self::Error>> {
        self.0
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await
    }
}

/// What reads a request's SSE answer: the request's log route, and its ask route with the way
/// back to the server.
struct Taps {
    logs: Option<LogRoute>,
    asks: Option<(AskRoute, Back)>,
}

impl CallStreams {
    /// The routes `message` carries, if it is a request that has them; an ask route comes with
    /// how `message` is posted, to post answers the same way.
    fn taps(
        &self,
        message: &ClientJsonRpcMessage,
        uri: &Arc<str>,
        session_id: &Option<Arc<str>>,
        auth_header: &Option<String>,
        custom_headers: &HashMap<HeaderName, HeaderValue>,
    ) -> Taps {
        let ClientJsonRpcMessage::Request(request) = message else { return Taps { logs: None, asks: None } };
        let extensions = request.request.extensions();
        let asks = extensions.get::<AskRoute>().map(|route| {
            let back = Back {
                http: self.0.clone(),
                uri: uri.clone(),
                session_id: session_id.clone(),
                auth_header: auth_header.clone(),
                custom_headers: custom_headers.clone(),
            };
            (route.clone(), back)
        });
        Taps { logs: extensions.get::<LogRoute>().cloned(), asks }
    }
}

/// How to post an answer back to the server: as the request the stream answers was posted.
#[derive(Clone)]
struct Back {
    http: reqwest::Client,
    uri: Arc<str>,
    session_id: Option<Arc<str>>,
    auth_header: Option<String>,
    custom_headers: HashMap<HeaderName, HeaderValue>,
}

impl Back {
    /// Posts the caller's answer to the server's request `id`.
    async fn answer(self, id: Value, answer: Result<Value, rmcp::ErrorData>) {
        let message = match answer {
            Ok(result) => serde_json::json!({"jsonrpc": "2.0", "id": id, "result": result}),
            Err(error) => serde_json::json!({"jsonrpc": "2.0", "id": id, "error": error}),
        };
        let message = match serde_json::from_value::<ClientJsonRpcMessage>(message) {
            Ok(message) => message,
            Err(e) => {
                tracing::warn!(error = %e, "a caller's answer to an upstream server's request is not a JSON-RPC answer");
                return;
            }
        };
        if let Err(e) =
            self.http.post_message(self.uri, message, self.session_id, self.auth_header, self.custom_headers).await
        {
            tracing::warn!(error = %e, "posting a caller's answer to an upstream server failed");
        }
    }
}

/// `response`, its SSE stream (if it is one) handing its log messages to the log route and its
/// requests for the caller to the ask route.
fn tapped(response: StreamableHttpPostResponse, taps: Taps) -> StreamableHttpPostResponse {
    let StreamableHttpPostResponse::Sse(stream, session) = response else { return response };
    let Taps { logs, asks } = taps;
    if logs.is_none() && asks.is_none() {
        return StreamableHttpPostResponse::Sse(stream, session);
    }
    let stream = stream.filter(move |event| {
        let mut keep = true;
        if let Ok(Sse { data: Some(data), .. }) = event {
            if let Some(LogRoute(sender)) = &logs
                && let Some(message) = log_message(data)
            {
                sender.send(message);
            } else if let Some((route, back)) = &asks
                && let Some(request) = relayed_request(data)
            {
                let (route, back) = (route.clone(), back.clone());
                tokio::spawn(async move {
                    let id = request.id.clone();
                    let answer = route.ask(request).await;
                    back.answer(id, answer).await;
                });
                keep = false;
            }
        }
        std::future::ready(keep)
    });
    StreamableHttpPostResponse::Sse(stream.boxed(), session)
}

/// A server's request for the caller.
#[derive(serde::Deserialize)]
struct Relayed {
    id: Value,
    method: String,
    #[serde(default)]
    params: Value,
}

/// The request for the caller an SSE event's data holds, if it is one of [`RELAYED_METHODS`]
/// (only data that names one is read).
fn relayed_request(data: &str) -> Option<Relayed> {
    if !RELAYED_METHODS.iter().any(|m| data.contains(m)) {
        return None;
    }
    let request: Relayed = serde_json::from_str(data).ok()?;
    let id_ok = matches!(request.id, Value::String(_) | Value::Number(_));
    (id_ok && RELAYED_METHODS.contains(&request.method.as_str())).then_some(request)
}

/// The log message an SSE event's data holds, if it is a `notifications/message` (only data
/// that names the method is read).
fn log_message(data: &str) -> Option<LogMessage> {
    #[derive(serde::Deserialize)]
    struct Notification {
        method: String,
        params: LogMessage,
    }
    if !data.contains("notifications/message") {
        return None;
    }
    let notification: Notification = serde_json::from_str(data).ok()?;
    (notification.method == "notifications/message").then_some(notification.params)
}

/// A warning from logger `toolyard` (the gateway speaking for itself).
pub fn warning(text: String) -> LogMessage {
    let mut message = LogMessage::new(rmcp::model::LoggingLevel::Warning, serde_json::Value::String(text));
    message.logger = Some("toolyard".into());
    message
}

/// How severe `message` is ([`severity`]).
pub fn severity_of(message: &LogMessage) -> u8 {
    severity(message.level)
}

/// How severe `level` is: 0 for `debug` up to 7 for `emergency` (RFC 5424's order).
pub fn severity(level: rmcp::model::LoggingLevel) -> u8 {
    use rmcp::model::LoggingLevel::*;
    match level {
        Debug => 0,
        Info => 1,
        Notice => 2,
        Warning => 3,
        Error => 4,
        Critical => 5,
        Alert => 6,
        Emergency => 7,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn only_log_notifications_are_read_from_a_stream() {
        let note = json!({"jsonrpc": "2.0", "method": "notifications/message",
            "params": {"level": "info", "logger": "fx", "data": "started"}});
        let message = log_message(&note.to_string()).expect("a log message");
        assert_eq!(message.data, json!("started"));
        assert_eq!(message.logger.as_deref(), Some("fx"));
        let answer = json!({"jsonrpc": "2.0", "id": 1, "result": {"content": [
            {"type": "text", "text": "notifications/message"}]}});
        assert!(log_message(&answer.to_string()).is_none(), "an answer that names the method is no message");
        let progress = json!({"jsonrpc": "2.0", "method": "notifications/progress",
            "params": {"progressToken": 1, "progress": 1}});
        assert!(log_message(&progress.to_string()).is_none());
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_instead_of_waiting() {
        let (sender, mut receiver) = channel();
        for n in 0..LOG_QUEUE + 10 {
            sender.send(LogMessage::new(rmcp::model::LoggingLevel::Info, json!(n)));
        }
        assert_eq!(receiver.dropped(), 10);
        assert_eq!(receiver.recv().await.map(|m| m.data), Some(json!(0)), "the first ones are kept, in order");
    }
}

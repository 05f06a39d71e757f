//! The rmcp [`ServerHandler`]: tools (registered and built-in), resources, the tasks
//! extension and subscriptions/listen.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use itertools::Itertools;
#[allow(deprecated)]
use rmcp::model::LoggingMessageNotification;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, CompleteRequestParams, CompleteResult,
    GetTaskParams, GetTaskResult, Implementation, InitializeRequestParams, InitializeResult,
    ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams, ProtocolVersion,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Reference, Resource, ResourceTemplate,
    ServerCapabilities, ServerConfig, SubscriptionFilter, Tool as McpTool,
};
use rmcp::model::{GetPromptRequestParams, GetPromptResponse, GetPromptResult, ListPromptsResult, Prompt as McpPrompt};
use rmcp::model::{
    ProgressNotification, ProgressNotificationParam, ProgressToken, ServerJsonRpcMessage, ServerNotification,
};
use rmcp::service::{Peer, RequestContext, SubscriptionContext};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::builtin::Builtin;
use super::changes::{ChangeFeed, MAX_RESOURCE_SUBSCRIPTIONS, Wants};
use super::rounds;
use super::tasks::TaskTools;
use super::{Scope, cancel, convert, cursor, errors, resources};
use crate::catalog::{Prompt, PromptError, ResourceError, ServedResource, Tool};
use crate::core::access::Selection;
use crate::core::ids::is_traceparent;
use crate::core::{CallError, CallInput, ClientAsker, LogSink, ProgressSink, TaskStart};
use crate::executor::Standing;
use crate::identity::Identity;
use crate::limits::StreamPermit;
use crate::metrics::{CallOutcome, Rejection};
use crate::state::AppState;
use crate::upstream::logs::{LogMessage, severity, severity_of};
use rmcp::model::{CreateTaskResult, DetailedTask, Task, TaskPayload, TaskStatus as McpTaskStatus};
use toolyard_api::mcptool::ExecutionMode;
use toolyard_api::protocol::CallErrorKind;
use toolyard_api::protocol::{Progress, outputs};
use toolyard_api::storage::RunId;

/// Protocol revisions served: the newest rmcp knows, the previous one, and 2025-06-18 for
/// clients that have not moved on yet.
pub const SUPPORTED_PROTOCOL_VERSIONS: &[ProtocolVersion] =
    &[ProtocolVersion::V_2026_07_28, ProtocolVersion::V_2025_11_25, ProtocolVersion::V_2025_06_18];

/// The `_meta` key of a tool result holding the call's id (what `delete_call` takes).
pub const CALL_ID_META: &str = "toolyard.dev/callId";

/// How often a client should poll `tasks/get` of a call started as a task.
const CALL_TASK_POLL_MS: u64 = 1000;

/// The request id a call started as a task is cancelled by (`tasks/cancel` names the task,
/// not a request): the same mechanism as `notifications/cancelled`, wherever it runs.
fn task_request_id(id: &impl std::fmt::Display) -> Value {
    Value::String(format!("task:{id}"))
}

/// How a detached call began ([`McpHandler::start_detached`]).
enum Detached {
    /// Running where it outlives this replica.
    Started(RunId),
    /// Ended before that (a warm-pool call: its id), or refused (no id): its answer.
    Answered(Option<RunId>, CallToolResult),
}

/// Where a call stands ([`McpHandler::call_progress`]).
enum CallProgress {
    Running,
    Completed(Box<CallToolResult>),
    Cancelled,
    /// Accepted, but its run is gone without a result.
    Lost,
}

const LOST_CALL: &str = "the call ended without a result (its run was lost)";

fn json_object(value: &impl serde::Serialize) -> rmcp::model::JsonObject {
    serde_json::to_value(value).ok().and_then(|v| v.as_object().cloned()).unwrap_or_default()
}

/// The answer of `start_call`, `get_call_result` and `cancel_call`: `{call_id, status, result,
/// error}` (and `cancel_requested` for `cancel_call`) as structured content and text, then
/// the images and file links of a completed call's answer.
fn call_state_result(id: &RunId, progress: &CallProgress, cancel: bool) -> CallToolResult {
    let (status, result, error) = match progress {
        CallProgress::Running => ("running", Value::Null, Value::Null),
        CallProgress::Completed(answer) => ("completed", Value::Object(json_object(answer)), Value::Null),
        CallProgress::Cancelled => ("cancelled", Value::Null, Value::Null),
        CallProgress::Lost => ("failed", Value::Null, Value::String(LOST_CALL.to_owned())),
    };
    let mut value = serde_json::json!({"call_id": id.as_str(), "status": status, "result": result, "error": error});
    if cancel {
        value["cancel_requested"] = Value::Bool(matches!(progress, CallProgress::Running));
    }
    let mut answer = super::tasks::json_result(value);
    if let CallProgress::Completed(called) = progress {
        answer.content.extend(called.content.iter().filter(|c| c.as_text().is_none()).cloned());
    }
    answer
}

/// One entry of `tools/list`: a registered tool or a built-in.
pub(super) enum Entry<'a> {
    Catalog(&'a Arc<Tool>),
    Builtin(Builtin),
}

impl Entry<'_> {
    fn name(&self) -> &str {
        match self {
            Entry::Catalog(t) => t.name(),
            Entry::Builtin(b) => b.name(),
        }
    }

    /// The tool the entry stands for (none for a built-in).
    fn tool(&self) -> Option<&Tool> {
        match self {
            Entry::Catalog(t) => Some(t),
            Entry::Builtin(_) => None,
        }
    }
}

/// What serving `tools/list` and a registered tool's `tools/call` needs from the request,
/// whichever way it came in: through rmcp's service ([`RequestInfo::from_context`]) or the
/// direct path ([`super::direct`]).
pub(super) struct RequestInfo<'a> {
    /// The HTTP request (its extensions hold the caller's [`Identity`] and the [`Scope`]).
    pub parts: Option<&'a http::request::Parts>,
    /// The JSON-RPC request id, as JSON (part of the cancellation key).
    pub request_id: Value,
    /// Fires when the client cancels or goes away.
    pub cancel: CancellationToken,
    /// `_meta.traceparent` of the request, if any.
    pub meta_traceparent: Option<&'a str>,
    /// Where the call's progress goes: the client's `notifications/progress`, when its request
    /// carried a progress token.
    pub progress: Option<Arc<dyn ProgressSink>>,
    /// Where an upstream server's log messages during the call go: the client's
    /// `notifications/message`, on the request's SSE stream.
    pub logs: Option<Arc<dyn LogSink>>,
    /// Who answers an upstream server's requests to the caller during the call: the client,
    /// on the request's SSE stream (only the direct path has one it can ask on: rmcp's
    /// stateless service numbers its own requests from 0 in every request, so an answer could
    /// not be told from another request's). 2026-07-28 callers are asked in rounds instead
    /// ([`rounds`]).
    pub asker: Option<Arc<dyn ClientAsker>>,
}

/// Where a request's notifications go: rmcp's peer for the request, or the direct path's
/// SSE stream ([`super::direct`]), as serialized messages.
#[derive(Clone)]
pub(super) enum ClientOut {
    Peer(Peer<RoleServer>),
    Stream(tokio::sync::mpsc::Sender<String>),
}

impl ClientOut {
    /// Sends `notification`; a client that went away gets nothing more (the call's own end
    /// follows).
    async fn notify(&self, notification: ServerNotification) {
        match self {
            ClientOut::Peer(peer) => {
                let _ = peer.send_notification(notification).await;
            }
            ClientOut::Stream(out) => match serde_json::to_string(&ServerJsonRpcMessage::notification(notification)) {
                Ok(message) => {
                    let _ = out.send(message).await;
                }
                Err(e) => tracing::error!(error = %e, "serializing a notification failed"),
            },
        }
    }
}

/// A call's progress as `notifications/progress` for the request's progress token: the
/// fraction done out of a total of 1, and the function's message.
pub(super) struct ClientProgress {
    pub out: ClientOut,
    pub token: ProgressToken,
}

#[async_trait::async_trait]
impl ProgressSink for ClientProgress {
    async fn report(&self, progress: &Progress) {
        let mut param = ProgressNotificationParam::new(self.token.clone(), progress.fraction).with_total(1.0);
        if let Some(message) = &progress.message {
            param = param.with_message(message.clone());
        }
        self.out.notify(ServerNotification::ProgressNotification(ProgressNotification::new(param))).await;
    }
}

/// An upstream server's log messages as `notifications/message`, those at least as severe as
/// the request's `_meta` `io.modelcontextprotocol/logLevel` (all of them without one).
pub(super) struct ClientLogs {
    pub out: ClientOut,
    pub least: u8,
}

impl ClientLogs {
    /// The logs of a request with `meta`.
    pub fn new(out: ClientOut, meta: &rmcp::model::RequestMetaObject) -> Self {
        ClientLogs { out, least: meta.log_level().map_or(0, severity) }
    }
}

#[async_trait::async_trait]
impl LogSink for ClientLogs {
    async fn log(&self, message: LogMessage) {
        if severity_of(&message) >= self.least {
            #[allow(deprecated)]
            let notification = ServerNotification::LoggingMessageNotification(LoggingMessageNotification::new(message));
            self.out.notify(notification).await;
        }
    }
}

impl<'a> RequestInfo<'a> {
    /// The request as rmcp's service hands it to the handler.
    pub fn from_context(context: &'a RequestContext<RoleServer>) -> Self {
        Self {
            parts: context.extensions.get::<http::request::Parts>(),
            request_id: serde_json::to_value(&context.id).unwrap_or(Value::Null),
            cancel: context.ct.clone(),
            meta_traceparent: context.meta.0.get_traceparent(),
            progress: context.meta.get_progress_token().map(|token| {
                Arc::new(ClientProgress { out: ClientOut::Peer(context.peer.clone()), token }) as Arc<dyn ProgressSink>
            }),
            logs: Some(Arc::new(ClientLogs::new(ClientOut::Peer(context.peer.clone()), &context.meta))),
            asker: None,
        }
    }

    /// The authenticated caller (the authentication layer put it in the HTTP extensions).
    pub fn identity(&self) -> Result<&'a Identity, ErrorData> {
        self.parts.and_then(|p| p.extensions.get::<Identity>()).ok_or_else(errors::unauthenticated)
    }

    /// The endpoint's scope (set by the router).
    pub fn scope(&self) -> Scope {
        self.parts.and_then(|p| p.extensions.get::<Scope>()).cloned().unwrap_or(Scope::All)
    }

    /// The W3C traceparent of the request: `_meta.traceparent` first, then the HTTP header.
    /// Only well-formed values are kept (they end up in an annotation and an environment
    /// variable).
    pub fn traceparent(&self) -> Option<String> {
        let from_header = || self.parts.and_then(|p| p.headers.get("traceparent")).and_then(|v| v.to_str().ok());
        self.meta_traceparent.or_else(from_header).filter(|t| is_traceparent(t)).map(str::to_owned)
    }
}

/// What `tools/list` on `scope` may show after the cursor `after`: the catalog's tools of
/// `selection` merged with `builtins`, sorted by name (both are, and the catalog holds no
/// built-in's name), walked only as far as the page needs.
fn list_candidates<'a>(
    catalog: &'a [Arc<Tool>],
    scope: &Scope,
    selection: &'a Selection,
    builtins: Vec<Builtin>,
    after: Option<&'a str>,
) -> impl Iterator<Item = Entry<'a>> + Send + 'a {
    let start = match (scope, after) {
        (Scope::Search, _) => catalog.len(),
        (_, Some(after)) => catalog.partition_point(|t| t.name() <= after),
        (_, None) => 0,
    };
    let functions = selection.of(&catalog[start..]).map(Entry::Catalog);
    let builtins = builtins.into_iter().filter(move |b| after.is_none_or(|a| b.name() > a)).map(Entry::Builtin);
    functions.merge_by(builtins, |a, b| a.name() <= b.name())
}

/// The built-in a `tools/call` of `name` on `scope` names, if any (built-ins live on `/mcp`
/// only; on a toolset endpoint the name is looked up in the catalog like any other).
pub(super) fn builtin_of(scope: &Scope, name: &str) -> Option<Builtin> {
    match scope {
        Scope::All => Builtin::from_name(name).filter(|b| *b != Builtin::CallTool),
        Scope::Search => Builtin::from_name(name).filter(|b| matches!(b, Builtin::ToolSearch | Builtin::CallTool)),
        Scope::Toolset(_) => None,
    }
}

/// The MCP handler. One is cloned per request (the transport is stateless).
#[derive(Clone)]
pub struct McpHandler {
    state: AppState,
}

impl McpHandler {
    /// A handler over `state`.
    pub fn new(state: AppState) -> Self {
        Self { state }
    }

    fn identity(context: &RequestContext<RoleServer>) -> Result<&Identity, ErrorData> {
        RequestInfo::from_context(context).identity()
    }

    /// The shared state.
    pub(super) fn state(&self) -> &AppState {
        &self.state
    }

    /// Counts one MCP request of `method` by outcome.
    pub(super) fn count(&self, method: &'static str, ok: bool) {
        self.state.metrics.mcp_request(method, if ok { "ok" } else { "error" });
    }

    /// The built-ins `who` sees on `scope` (see [`super::builtin`]), only on `/mcp`: the task
    /// tools for callers allowed to start coding tasks (on a gateway with a task backend), and
    /// `delete_call` for them and for anyone who may call some tool there.
    async fn visible_builtins(&self, who: &Identity, scope: &Scope) -> Result<Vec<Builtin>, ErrorData> {
        match scope {
            Scope::Toolset(_) => Ok(Vec::new()),
            Scope::Search => Ok(if self.may_call_some_tool(who).await? {
                vec![Builtin::CallTool, Builtin::ToolSearch]
            } else {
                Vec::new()
            }),
            Scope::All => {
                let tasks = self.may_create_tasks(who).await?;
                let calls = tasks || self.may_call_some_tool(who).await?;
                Ok(Builtin::ALL
                    .into_iter()
                    .filter(|b| *b != Builtin::CallTool)
                    .filter(|b| if b.is_task_tool() { tasks } else { calls })
                    .collect())
            }
        }
    }

    /// Whether `who` may call at least one registered tool on `/mcp` (so has calls to delete).
    async fn may_call_some_tool(&self, who: &Identity) -> Result<bool, ErrorData> {
        let catalog = self.state.catalog.tools();
        let (first, _) = self
            .state
            .access()
            .visible(who, catalog.iter(), |t| Some(t.as_ref()), 1)
            .await
            .map_err(|e| self.platform_error(&e))?;
        Ok(!first.is_empty())
    }

    async fn may_create_tasks(&self, who: &Identity) -> Result<bool, ErrorData> {
        let Some(backend) = &self.state.tasks else { return Ok(false) };
        match self.state.authorizer.can_create_task(who, backend.namespace()).await {
            Ok(allowed) => Ok(allowed),
            Err(e) => {
                tracing::error!(error = %e, "authorization check failed");
                Err(errors::from_error(&e, self.retry_after()))
            }
        }
    }

    fn retry_after(&self) -> u64 {
        self.state.limits.settings().retry_after.as_secs().max(1)
    }

    /// `tools/list` through rmcp's service.
    async fn list(
        &self,
        request: Option<PaginatedRequestParams>,
        info: &RequestInfo<'_>,
    ) -> Result<ListToolsResult, ErrorData> {
        self.list_page(request, info, |page, next_cursor| {
            let tools: Vec<McpTool> = page
                .iter()
                .map(|e| match e {
                    Entry::Catalog(t) => convert::to_mcp_tool(t),
                    Entry::Builtin(b) => b.definition(),
                })
                .collect();
            let mut result = ListToolsResult::with_all_items(tools);
            result.next_cursor = next_cursor;
            result
        })
        .await
    }

    /// `tools/list`, whichever path the request came by: the page's entries and the cursor
    /// of the next page, as `render` makes them into the answer.
    pub(super) async fn list_page<R>(
        &self,
        request: Option<PaginatedRequestParams>,
        info: &RequestInfo<'_>,
        render: impl FnOnce(&[Entry<'_>], Option<String>) -> R,
    ) -> Result<R, ErrorData> {
        let who = info.identity()?;
        let scope = info.scope();
        let after = match request.and_then(|r| r.cursor) {
            Some(c) => Some(cursor::decode_cursor(&c).ok_or_else(errors::invalid_cursor)?),
            None => None,
        };
        let after = after.as_deref();
        let builtins = self.visible_builtins(who, &scope).await?;
        let selection = scope.selection();
        let catalog = self.state.catalog.tools();
        let candidates = list_candidates(&catalog, &scope, &selection, builtins, after);
        let (page, more) = self
            .state
            .access()
            .visible(who, candidates, Entry::tool, self.state.settings.page_size.max(1))
            .await
            .map_err(|e| self.platform_error(&e))?;
        let next_cursor = if more { page.last().map(|e| cursor::encode_cursor(e.name())) } else { None };
        Ok(render(&page, next_cursor))
    }

    /// A built-in call: arguments validated, then the tool.
    async fn call_builtin(
        &self,
        builtin: Builtin,
        who: &Identity,
        request: CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let arguments = request.arguments.unwrap_or_default();
        if let Err(problems) = builtin.validate(&arguments) {
            return Ok(convert::invalid_arguments(&problems).into());
        }
        let tools = TaskTools { state: &self.state, who };
        let started = Instant::now();
        let result = match builtin {
            Builtin::RunCodingTask => {
                // `notifications/cancelled` for this request ends the wait (not the task).
                let request_id = serde_json::to_value(&context.id).unwrap_or(Value::Null);
                let stop = context.ct.child_token();
                let _registration =
                    self.state.cancels.register(cancel::cancel_key(&who.owner_key(), &request_id), stop.clone());
                tools.run(&arguments, context, RequestInfo::from_context(context).traceparent(), stop).await
            }
            Builtin::GetTaskResult => tools.get_result(&arguments).await.map(Into::into),
            Builtin::ListTasks => tools.list(&arguments).await.map(Into::into),
            Builtin::CancelTask => tools.cancel(&arguments).await.map(Into::into),
            Builtin::DeleteTask => tools.delete(&arguments).await.map(Into::into),
            Builtin::DeleteCall => tools.delete_call(&arguments).await.map(Into::into),
            Builtin::StartCall => self.start_call_builtin(&arguments, context).await.map(Into::into),
            Builtin::GetCallResult => self.follow_call_builtin(who, &arguments, false).await.map(Into::into),
            Builtin::CancelCall => self.follow_call_builtin(who, &arguments, true).await.map(Into::into),
            Builtin::ListArtifacts => tools.list_artifacts(&arguments).await.map(Into::into),
            Builtin::ReadArtifact => tools.read_artifact(&arguments).await.map(Into::into),
            Builtin::ToolSearch => tools.tool_search(&arguments).await.map(Into::into),
            Builtin::CallTool => {
                let name = arguments.get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
                let mut call = CallToolRequestParams::new(name);
                call.arguments = arguments.get("arguments").and_then(Value::as_object).cloned();
                self.call_registered(call, &RequestInfo::from_context(context)).await.map(Into::into)
            }
        };
        let outcome = match &result {
            Ok(CallToolResponse::Complete(r)) if r.is_error == Some(true) => CallOutcome::ToolError,
            Ok(_) => CallOutcome::Success,
            Err(_) => CallOutcome::Error,
        };
        self.state.metrics.tool_call(builtin.name(), outcome, started.elapsed());
        result
    }

    async fn call(
        &self,
        mut request: CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let info = RequestInfo::from_context(context);
        let who = info.identity()?;
        let scope = info.scope();
        if let Some(builtin) = builtin_of(&scope, &request.name) {
            if !self.visible_builtins(who, &scope).await?.contains(&builtin) {
                return Err(errors::unknown_tool(&request.name));
            }
            return self.call_builtin(builtin, who, request, context).await;
        }
        // `/search/mcp` serves its two tools only; the others are called through `call_tool`.
        if scope == Scope::Search {
            return Err(errors::unknown_tool(&request.name));
        }
        let modern = context.protocol_version() == Some(ProtocolVersion::V_2026_07_28);
        if modern && let Some(state) = request.request_state.take() {
            let owner = who.owner_key();
            let responses = request.input_responses.take();
            return self
                .rounds(&owner)
                .later_round(
                    self.state.calls.quota(),
                    &state,
                    responses,
                    &info.request_id,
                    &info.cancel,
                    info.progress.clone(),
                    info.logs.clone(),
                )
                .await;
        }
        let tool = self.state.catalog.get(&request.name).filter(|t| scope.selection().contains(t));
        if modern && let Some(tool) = tool.as_ref().filter(|t| t.upstream.is_some()) {
            let capabilities = context.client_capabilities().unwrap_or_default();
            return self.call_in_rounds(request, &info, capabilities, tool.timeout()).await;
        }
        let job = tool.is_some_and(|t| t.spec.execution.mode == ExecutionMode::Job);
        if job && context.client_capabilities().is_some_and(|c| c.supports_tasks()) {
            return self.call_as_task(request, &info).await;
        }
        self.call_registered(request, &info).await.map(Into::into)
    }

    /// The caller and the session of a request that needs one.
    fn session_of(context: &RequestContext<RoleServer>) -> Result<(&Identity, super::sessions::Session), ErrorData> {
        let who = Self::identity(context)?;
        let session = context.extensions.get::<http::request::Parts>().and_then(|p| p.extensions.get()).cloned();
        let Some(session) = session else {
            return Err(ErrorData::invalid_request(
                "resources/subscribe needs a session: send the Mcp-Session-Id header the initialize answer gave \
                 (2026-07-28 clients subscribe with subscriptions/listen)",
                None,
            ));
        };
        Ok((who, session))
    }

    /// The caller and session of a `resources/subscribe` of `uri`, from a request with a
    /// session: a task resource URI, or one an upstream server serves to the caller and takes
    /// a subscription to (unknown and unauthorized URIs answer alike).
    async fn session_subscription<'c>(
        &self,
        uri: &str,
        context: &'c RequestContext<RoleServer>,
    ) -> Result<(&'c Identity, super::sessions::Session), ErrorData> {
        let (who, session) = Self::session_of(context)?;
        if resources::TaskResource::parse(uri).is_some() && self.state.tasks.is_some() {
            return Ok((who, session));
        }
        // An upstream server's resource: the server must take the subscription (asked here
        // once; the session's stream holds it on the replica it is served by).
        let scope = RequestInfo::from_context(context).scope();
        let Some(resource) = self.serving(who, &scope, uri).await? else {
            return Err(resources::not_found(uri));
        };
        resource.source.subscribe(uri).await.map_err(|e| ErrorData::invalid_request(e, None))?;
        resource.source.unsubscribe(uri);
        Ok((who, session))
    }

    /// The multi-round-trip request of the caller with storage key `owner` ([`rounds`]).
    fn rounds<'a>(&'a self, owner: &'a toolyard_api::OwnerKey) -> rounds::Rounds<'a> {
        rounds::Rounds { asks: &self.state.asks, store: &self.state.store, cancels: &self.state.cancels, owner }
    }

    /// `tools/call` of an upstream server's tool from a 2026-07-28 client: the call is held
    /// ([`rounds`]), so that the server's requests reach the caller as `input_required`
    /// results, answered by the caller's retries.
    async fn call_in_rounds(
        &self,
        request: CallToolRequestParams,
        info: &RequestInfo<'_>,
        capabilities: rmcp::model::ClientCapabilities,
        timeout: Duration,
    ) -> Result<CallToolResponse, ErrorData> {
        let who = info.identity()?.clone();
        let owner = who.owner_key();
        let (asker, holding) =
            rounds::hold(self.state.asks.clone(), self.state.store.clone(), owner.clone(), capabilities);
        let input = CallInput {
            who,
            selection: info.scope().selection(),
            tool: request.name.into_owned(),
            arguments: request.arguments.unwrap_or_default(),
            traceparent: info.traceparent(),
            parent_task: None,
            cancel: holding.stop.clone(),
            cancel_key: None,
            progress: Some(holding.sinks.clone()),
            logs: Some(holding.sinks.clone()),
            asker: Some(asker),
            task: None,
        };
        holding.sinks.attach(info.progress.clone(), info.logs.clone()).await;
        // A `notifications/cancelled` for this request stops the call while it answers it.
        let cancel_key = cancel::cancel_key(&owner, &info.request_id);
        let _registration = self.state.cancels.register(cancel_key, info.cancel.clone());
        let handler = self.clone();
        let key = owner.clone();
        let call = async move {
            match handler.state.calls.call(input).await {
                Ok(called) => Ok(handler.answer(&key, called.id, called.result).await),
                Err(e) => handler.refused(e),
            }
        };
        self.rounds(&owner).first_round(call, holding, &info.cancel, timeout).await
    }

    /// `tools/call` of a Job-mode tool from a client with the tasks extension: admitted like
    /// any call, then answered at once with a task handle (the call id) while the call runs
    /// detached from the request and from this process (see [`McpHandler::start_detached`]).
    /// `tasks/get` follows it ([`McpHandler::call_task`]); `tasks/cancel` stops it.
    async fn call_as_task(
        &self,
        request: CallToolRequestParams,
        info: &RequestInfo<'_>,
    ) -> Result<CallToolResponse, ErrorData> {
        let arguments = request.arguments.unwrap_or_default();
        match self.start_detached(request.name.into_owned(), arguments, info).await? {
            Detached::Started(id) => {
                let now = jiff::Timestamp::now().to_string();
                let handle = Task::new(id.to_string(), McpTaskStatus::Working, now.clone(), now)
                    .with_poll_interval_ms(CALL_TASK_POLL_MS)
                    .with_status_message("the call is running");
                Ok(CallToolResponse::Task(CreateTaskResult::new(handle)))
            }
            Detached::Answered(_, answer) => Ok(answer.into()),
        }
    }

    /// Starts a call that runs detached from the request and from this process: admitted like
    /// any call (a refusal is answered at once), then [`Detached::Started`] once its run exists
    /// where it outlives this replica (the ToolCall, or the local runner). A call that ends
    /// before that (a warm-pool call) is [`Detached::Answered`]. It is followed with
    /// [`McpHandler::call_progress`] on any replica, and cancelled by the request id
    /// [`task_request_id`] of its id.
    async fn start_detached(
        &self,
        tool: String,
        arguments: rmcp::model::JsonObject,
        info: &RequestInfo<'_>,
    ) -> Result<Detached, ErrorData> {
        let who = info.identity()?.clone();
        let owner_key = who.owner_key();
        let id = crate::core::ids::new_call_id(&tool);
        let cancel_key = cancel::cancel_key(&owner_key, &task_request_id(&id));
        let cancel = CancellationToken::new();
        let (admitted, started) = tokio::sync::oneshot::channel();
        let input = CallInput {
            who,
            selection: info.scope().selection(),
            tool,
            arguments,
            traceparent: info.traceparent(),
            parent_task: None,
            cancel: cancel.clone(),
            cancel_key: Some(cancel_key.clone()),
            progress: None,
            logs: None,
            asker: None,
            task: Some(TaskStart { id: id.clone(), started: admitted }),
        };
        let (calls, cancels) = (Arc::clone(&self.state.calls), Arc::clone(&self.state.cancels));
        let mut run = tokio::spawn(async move {
            let _registration = cancels.register(cancel_key, cancel);
            calls.call(input).await
        });
        tokio::select! {
            Ok(()) = started => Ok(Detached::Started(id)),
            joined = &mut run => match joined {
                Ok(Ok(called)) => {
                    let answer = self.answer(&owner_key, called.id.clone(), called.result).await;
                    Ok(Detached::Answered(Some(called.id), answer))
                }
                Ok(Err(e)) => self.refused(e).map(|answer| Detached::Answered(None, answer)),
                Err(e) => Err(ErrorData::internal_error(format!("the call failed: {e}"), None)),
            },
        }
    }

    /// Where a call of `who` stands: its stored result, else what the platform knows of its
    /// run; `None` when `raw_id` names no call of `who`.
    async fn call_progress(&self, who: &Identity, raw_id: &str) -> Result<Option<(RunId, CallProgress)>, ErrorData> {
        let Ok(id) = RunId::parse(raw_id) else { return Ok(None) };
        let owner = who.owner_key();
        let standing = crate::executor::standing(self.state.store.as_ref(), self.state.executor.as_ref(), &owner, &id)
            .await
            .map_err(|e| self.platform_error(&e))?;
        let progress = match standing {
            None => return Ok(None),
            Some(Standing::Running) => CallProgress::Running,
            Some(Standing::Lost) => CallProgress::Lost,
            Some(Standing::Ended(r)) if r.error.as_ref().is_some_and(|e| e.kind == CallErrorKind::Cancelled) => {
                CallProgress::Cancelled
            }
            Some(Standing::Ended(r)) => CallProgress::Completed(Box::new(self.answer(&owner, id.clone(), *r).await)),
        };
        Ok(Some((id, progress)))
    }

    /// `tasks/get` of a call started as a task; `None` when `raw_id` names no call of `who`.
    async fn call_task(&self, who: &Identity, raw_id: &str) -> Result<Option<DetailedTask>, ErrorData> {
        let Some((id, progress)) = self.call_progress(who, raw_id).await? else { return Ok(None) };
        let payload = match progress {
            CallProgress::Running => TaskPayload::Working,
            CallProgress::Cancelled => TaskPayload::Cancelled,
            CallProgress::Completed(answer) => TaskPayload::Completed { result: json_object(&answer) },
            CallProgress::Lost => {
                TaskPayload::Failed { error: json_object(&ErrorData::internal_error(LOST_CALL, None)) }
            }
        };
        let now = jiff::Timestamp::now().to_string();
        let task = Task::new(id.to_string(), McpTaskStatus::Working, now.clone(), now)
            .with_poll_interval_ms(CALL_TASK_POLL_MS);
        Ok(Some(DetailedTask::new(task, payload)))
    }

    /// `tasks/cancel` of a call started as a task: `false` when `raw_id` names no call of
    /// `who`; a call that has ended is left as it is.
    async fn cancel_call_task(&self, who: &Identity, raw_id: &str) -> Result<bool, ErrorData> {
        Ok(self.cancel_call(who, raw_id).await?.is_some())
    }

    /// Cancels a running call of `who`; `None` when `raw_id` names no call of `who`, else
    /// where it stood and whether it was asked to stop.
    async fn cancel_call(&self, who: &Identity, raw_id: &str) -> Result<Option<(RunId, CallProgress)>, ErrorData> {
        let Some((id, progress)) = self.call_progress(who, raw_id).await? else { return Ok(None) };
        if matches!(progress, CallProgress::Running) {
            cancel::on_cancelled(&self.state, who, &task_request_id(&id));
        }
        Ok(Some((id, progress)))
    }

    /// `start_call(tool, arguments)`: a 2025-11-25 client's way to a detached call.
    async fn start_call_builtin(
        &self,
        arguments: &rmcp::model::JsonObject,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let info = RequestInfo::from_context(context);
        let tool = arguments.get("tool").and_then(Value::as_str).unwrap_or_default().to_owned();
        if Builtin::from_name(&tool).is_some() {
            return Err(errors::unknown_tool(&tool));
        }
        let tool_arguments = arguments.get("arguments").and_then(Value::as_object).cloned().unwrap_or_default();
        match self.start_detached(tool, tool_arguments, &info).await? {
            Detached::Started(id) => Ok(call_state_result(&id, &CallProgress::Running, false)),
            Detached::Answered(Some(id), answer) => {
                Ok(call_state_result(&id, &CallProgress::Completed(Box::new(answer)), false))
            }
            // Refused before it ran: the refusal itself.
            Detached::Answered(None, answer) => Ok(answer),
        }
    }

    /// `get_call_result(call_id)` and `cancel_call(call_id)`.
    async fn follow_call_builtin(
        &self,
        who: &Identity,
        arguments: &rmcp::model::JsonObject,
        cancel: bool,
    ) -> Result<CallToolResult, ErrorData> {
        let raw = arguments.get("call_id").and_then(Value::as_str).unwrap_or_default();
        let found = if cancel { self.cancel_call(who, raw).await? } else { self.call_progress(who, raw).await? };
        match found {
            Some((id, progress)) => Ok(call_state_result(&id, &progress, cancel)),
            None => {
                Ok(super::tasks::error_result(format!("no such call: {:?}", raw.chars().take(64).collect::<String>())))
            }
        }
    }

    /// The MCP answer of a call: its value, the files it returned, and its id in `_meta`.
    async fn answer(
        &self,
        owner: &toolyard_api::OwnerKey,
        id: RunId,
        result: toolyard_api::protocol::CallResult,
    ) -> CallToolResult {
        let files = result.files.clone();
        let mut answer = convert::call_result_to_mcp(result);
        self.add_outputs(owner, &id, &files, &mut answer.content).await;
        let mut meta = rmcp::model::MetaObject::new();
        meta.0.insert(CALL_ID_META.to_owned(), id.as_str().into());
        answer.meta = Some(meta);
        answer
    }

    /// The answer to a call that did not run (or failed in the platform).
    fn refused(&self, e: CallError) -> Result<CallToolResult, ErrorData> {
        match e {
            CallError::InvalidArguments(problems) => Ok(convert::invalid_arguments(&problems)),
            CallError::UnknownTool(name) => Err(errors::unknown_tool(&name)),
            CallError::Busy(what) => Err(errors::busy(what, self.retry_after())),
            CallError::QuotaReached(message) => Ok(super::tasks::error_result(message)),
            CallError::Platform(e) => Err(errors::from_error(&e, self.retry_after())),
        }
    }

    /// `tools/call` of a registered tool (not a built-in: see [`builtin_of`]), whichever path
    /// the request came by.
    pub(super) async fn call_registered(
        &self,
        request: CallToolRequestParams,
        info: &RequestInfo<'_>,
    ) -> Result<CallToolResult, ErrorData> {
        let who = info.identity()?;
        // A `notifications/cancelled` for this request, wherever it arrives, finds the call
        // by this key (see `super::cancel`).
        let owner_key = who.owner_key();
        let cancel_key = cancel::cancel_key(&owner_key, &info.request_id);
        let cancel = info.cancel.child_token();
        let _registration = self.state.cancels.register(cancel_key.clone(), cancel.clone());
        let input = CallInput {
            who: who.clone(),
            selection: info.scope().selection(),
            tool: request.name.into_owned(),
            arguments: request.arguments.unwrap_or_default(),
            traceparent: info.traceparent(),
            parent_task: None,
            cancel,
            cancel_key: Some(cancel_key),
            progress: info.progress.clone(),
            logs: info.logs.clone(),
            asker: info.asker.clone(),
            task: None,
        };
        match self.state.calls.call(input).await {
            Ok(called) => Ok(self.answer(&owner_key, called.id, called.result).await),
            Err(e) => self.refused(e),
        }
    }

    /// The files a call returned, after its value: each image (up to
    /// [`outputs::MAX_INLINE_IMAGE_BYTES`]) as image content, and every file as a link to the
    /// caller's stored copy (`toolyard://calls/<id>/files/outputs/<name>`). An image that
    /// cannot be read back is only linked.
    async fn add_outputs(
        &self,
        owner: &toolyard_api::OwnerKey,
        id: &toolyard_api::storage::RunId,
        files: &[outputs::OutputFile],
        content: &mut Vec<rmcp::model::ContentBlock>,
    ) {
        use base64::Engine;
        for file in files {
            if file.image && file.size <= outputs::MAX_INLINE_IMAGE_BYTES {
                match self.state.store.get(owner, &format!("calls/{id}/outputs/{}", file.name)).await {
                    Ok(Some(bytes)) => content.push(rmcp::model::ContentBlock::image(
                        base64::engine::general_purpose::STANDARD.encode(&bytes),
                        file.mime_type.clone(),
                    )),
                    Ok(None) => tracing::warn!(call = %id, file = %file.name, "a returned image is not stored"),
                    Err(e) => {
                        tracing::warn!(call = %id, file = %file.name, error = %e, "reading a returned image failed")
                    }
                }
            }
            let link = rmcp::model::Resource::new(super::resources::call_output_uri(id, &file.name), file.name.clone())
                .with_mime_type(file.mime_type.clone())
                .with_size(file.size);
            content.push(rmcp::model::ContentBlock::resource_link(link));
        }
    }

    /// The JSON-RPC error of a failed platform check (logged here; details stay out of the
    /// answer).
    /// The upstream prompts of the request's endpoint that `info`'s caller may get.
    /// The upstream servers' prompts that `wanted` picks and the caller may get here (only
    /// those picked are authorized).
    async fn visible_prompts(
        &self,
        info: &RequestInfo<'_>,
        wanted: impl Fn(&Prompt) -> bool,
    ) -> Result<Vec<Arc<Prompt>>, ErrorData> {
        let who = info.identity()?;
        let scope = info.scope();
        let candidates = self
            .state
            .catalog
            .prompts()
            .into_iter()
            .filter(|p| scope.shows_server_of(p.toolset.as_deref()) && wanted(p))
            .collect();
        let authorizer = &self.state.authorizer;
        self.permitted(candidates, |p| async move { authorizer.can_get_prompt(who, &p).await.map(|ok| (p, ok)) }).await
    }

    /// The upstream servers' resources and resource templates that `wanted` picks and the
    /// caller may read here (only those picked are authorized).
    async fn visible_resources(
        &self,
        info: &RequestInfo<'_>,
        wanted: impl Fn(&ServedResource) -> bool,
    ) -> Result<Vec<Arc<ServedResource>>, ErrorData> {
        self.resources_for(info.identity()?, &info.scope(), wanted).await
    }

    /// The upstream resource (or template) serving `uri` that `who` may read through
    /// `scope`: the one listing it, else the template with the longest literal prefix of it.
    pub(super) async fn serving(
        &self,
        who: &Identity,
        scope: &Scope,
        uri: &str,
    ) -> Result<Option<Arc<ServedResource>>, ErrorData> {
        let visible = self.resources_for(who, scope, |r| r.matches(uri).is_some()).await?;
        Ok(visible
            .into_iter()
            .filter_map(|r| r.matches(uri).map(|rank| (rank, r)))
            .max_by_key(|(rank, _)| *rank)
            .map(|(_, r)| r))
    }

    async fn resources_for(
        &self,
        who: &Identity,
        scope: &Scope,
        wanted: impl Fn(&ServedResource) -> bool,
    ) -> Result<Vec<Arc<ServedResource>>, ErrorData> {
        let candidates = self
            .state
            .catalog
            .resources()
            .into_iter()
            .filter(|r| scope.shows_server_of(r.toolset.as_deref()) && wanted(r))
            .collect();
        let authorizer = &self.state.authorizer;
        self.permitted(candidates, |r| async move { authorizer.can_read_resource(who, &r).await.map(|ok| (r, ok)) })
            .await
    }

    /// The `candidates` that `decide` allows (decided 16 at a time, in order).
    async fn permitted<T, F, Fut>(&self, candidates: Vec<Arc<T>>, decide: F) -> Result<Vec<Arc<T>>, ErrorData>
    where
        F: Fn(Arc<T>) -> Fut,
        Fut: std::future::Future<Output = crate::Result<(Arc<T>, bool)>>,
    {
        let decisions: Vec<_> = futures::stream::iter(candidates).map(decide).buffered(16).collect().await;
        let mut visible = Vec::new();
        for decision in decisions {
            let (item, allowed) = decision.map_err(|e| self.platform_error(&e))?;
            if allowed {
                visible.push(item);
            }
        }
        Ok(visible)
    }

    /// `resources/read` of an upstream server's resource: the one listed with `uri`, else
    /// the template with the longest prefix of it; `None` when no server has it.
    async fn upstream_resource(
        &self,
        uri: &str,
        info: &RequestInfo<'_>,
    ) -> Option<Result<ReadResourceResult, ErrorData>> {
        if uri.starts_with(resources::SCHEME) {
            return None;
        }
        let who = match info.identity() {
            Ok(who) => who,
            Err(e) => return Some(Err(e)),
        };
        let best = match self.serving(who, &info.scope(), uri).await {
            Ok(best) => best?,
            Err(e) => return Some(Err(e)),
        };
        let answer = match best.source.read(uri).await {
            Ok(value) => serde_json::from_value(value).map_err(|e| {
                ErrorData::internal_error(
                    format!("the MCP server answered resources/read with something else: {e}"),
                    None,
                )
            }),
            Err(ResourceError::NotFound) => Err(resources::not_found(uri)),
            Err(ResourceError::Failed(message)) => Err(ErrorData::internal_error(message, None)),
        };
        Some(answer)
    }

    async fn prompt(
        &self,
        request: GetPromptRequestParams,
        info: &RequestInfo<'_>,
    ) -> Result<GetPromptResult, ErrorData> {
        let unknown = || {
            let shown: String = request.name.chars().take(64).collect();
            ErrorData::invalid_params(format!("Unknown prompt: {shown:?}"), None)
        };
        let prompts = self.visible_prompts(info, |p| p.name == request.name).await?;
        let prompt = prompts.first().ok_or_else(unknown)?;
        let arguments = request.arguments.clone().unwrap_or_default();
        let missing: Vec<&str> =
            prompt.required.iter().filter(|a| !arguments.contains_key(a.as_str())).map(String::as_str).collect();
        if !missing.is_empty() {
            return Err(ErrorData::invalid_params(format!("missing required arguments: {}", missing.join(", ")), None));
        }
        let answer = prompt.source.get(&prompt.upstream_name, arguments).await.map_err(|e| match e {
            PromptError::InvalidArguments(message) => ErrorData::invalid_params(message, None),
            PromptError::Failed(message) => ErrorData::internal_error(message, None),
        })?;
        serde_json::from_value(answer).map_err(|e| {
            ErrorData::internal_error(format!("the MCP server answered prompts/get with something else: {e}"), None)
        })
    }

    /// `completion/complete` for an upstream prompt's or resource template's argument, from
    /// its server (a prompt as the server names it). The gateway's own templates have no
    /// suggestions; an unknown prompt and one the caller may not get answer alike.
    async fn completion(
        &self,
        mut request: CompleteRequestParams,
        info: &RequestInfo<'_>,
    ) -> Result<CompleteResult, ErrorData> {
        let completer = match &mut request.r#ref {
            Reference::Prompt(reference) => {
                let name = reference.name.clone();
                let prompts = self.visible_prompts(info, |p| p.name == name).await?;
                let Some(prompt) = prompts.first() else {
                    let shown: String = reference.name.chars().take(64).collect();
                    return Err(ErrorData::invalid_params(format!("Unknown prompt: {shown:?}"), None));
                };
                reference.name = prompt.upstream_name.clone();
                prompt.completer.clone()
            }
            Reference::Resource(reference) => {
                let uri = reference.uri.clone();
                let templates = self.visible_resources(info, |r| r.template_prefix.is_some() && r.uri == uri).await?;
                match templates.first() {
                    Some(template) => template.completer.clone(),
                    None => return Ok(CompleteResult::default()),
                }
            }
            // A kind of reference of a later revision: no suggestions.
            _ => return Ok(CompleteResult::default()),
        };
        let request = serde_json::to_value(&request).map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        let answer = completer.complete(request).await.map_err(|e| ErrorData::internal_error(e, None))?;
        serde_json::from_value(answer).map_err(|e| {
            ErrorData::internal_error(
                format!("the MCP server answered completion/complete with something else: {e}"),
                None,
            )
        })
    }

    fn platform_error(&self, e: &crate::Error) -> ErrorData {
        tracing::error!(error = %e, "authorization check failed");
        errors::from_error(e, self.retry_after())
    }
}

impl ServerHandler for McpHandler {
    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(SUPPORTED_PROTOCOL_VERSIONS)
    }

    /// A 2025-11-25 (or older) client is told only what it can get: list changes and
    /// resource updates on its session's GET stream ([`super::sessions`]; the session id comes
    /// with this answer), but no `notifications/resources/list_changed`, which the gateway
    /// never sends.
    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        context.peer.set_peer_info(request.clone());
        let mut result = self.negotiate_initialize(&request)?;
        if let Some(resources) = result.capabilities.resources.as_mut() {
            resources.list_changed = None;
        }
        Ok(result)
    }

    /// `resources/subscribe` of a 2025-era session: updates of a task resource, or of an
    /// upstream server's resource, reach the session's GET stream. Without a session there is
    /// no stream to send them on.
    async fn subscribe(
        &self,
        request: rmcp::model::SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let result = match self.session_subscription(&request.uri, &context).await {
            Ok((who, session)) => {
                super::sessions::subscribe(&self.state, &who.owner_key(), &session, &request.uri).await
            }
            Err(e) => Err(e),
        };
        self.count("resources/subscribe", result.is_ok());
        result
    }

    async fn unsubscribe(
        &self,
        request: rmcp::model::UnsubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let result = match Self::session_of(&context) {
            Ok((who, session)) => {
                super::sessions::unsubscribe(&self.state, &who.owner_key(), &session, &request.uri).await
            }
            Err(e) => Err(e),
        };
        self.count("resources/unsubscribe", result.is_ok());
        result
    }

    // Logging is deprecated in MCP (SEP-2577), not gone: it stays advertised while served.
    #[allow(deprecated)]
    fn get_info(&self) -> ServerConfig {
        let capabilities = if self.state.tasks.is_some() {
            ServerCapabilities::builder()
                .enable_completions()
                .enable_prompts()
                .enable_prompts_list_changed()
                .enable_tools()
                .enable_tool_list_changed()
                .enable_resources()
                .enable_resources_subscribe()
                .enable_tasks()
                .enable_logging()
                .build()
        } else {
            ServerCapabilities::builder()
                .enable_completions()
                .enable_prompts()
                .enable_prompts_list_changed()
                .enable_tools()
                .enable_tool_list_changed()
                .enable_resources()
                .enable_logging()
                .build()
        };
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new(self.state.settings.server_name.clone(), env!("CARGO_PKG_VERSION")))
    }

    /// `logging/setLevel` (2025 revisions) is accepted, but the gateway keeps no session to
    /// hold a level for later requests: every log message a server sends during a call is
    /// passed on, unless the call itself names a level (`_meta`
    /// `io.modelcontextprotocol/logLevel`, as 2026-07-28 clients send it).
    #[allow(deprecated)]
    async fn set_level(
        &self,
        _request: rmcp::model::SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.count("logging/setLevel", true);
        Ok(())
    }

    /// Suggestions for an argument of an upstream prompt or resource template.
    async fn complete(
        &self,
        request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        let result = self.completion(request, &RequestInfo::from_context(&context)).await;
        self.count("completion/complete", result.is_ok());
        result
    }

    /// The prompts of connected upstream servers the caller may get (`/mcp`, and a toolset's
    /// endpoint for the servers of that toolset), in one page.
    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        let result = self.visible_prompts(&RequestInfo::from_context(&context), |_| true).await.map(|prompts| {
            let items = prompts.iter().filter_map(|p| serde_json::from_value::<McpPrompt>(p.listing.clone()).ok());
            ListPromptsResult::with_all_items(items.collect())
        });
        self.count("prompts/list", result.is_ok());
        result
    }

    /// An upstream server's prompt, from that server; an unknown prompt and one the caller may
    /// not get answer alike.
    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        let result = self.prompt(request, &RequestInfo::from_context(&context)).await;
        self.count("prompts/get", result.is_ok());
        result.map(Into::into)
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let result = self.list(request, &RequestInfo::from_context(&context)).await;
        self.count("tools/list", result.is_ok());
        result
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let result = self.call(request, &context).await;
        self.count("tools/call", result.is_ok());
        result
    }

    /// The caller's task results (paginated), then, on the first page, the resources of the
    /// upstream servers the caller may use.
    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let who = Self::identity(&context)?;
        let cursor = request.and_then(|r| r.cursor);
        let mut result = resources::list(&self.state, who, cursor.as_deref()).await;
        if let Ok(page) = result.as_mut()
            && cursor.is_none()
        {
            match self.visible_resources(&RequestInfo::from_context(&context), |r| r.template_prefix.is_none()).await {
                Ok(upstream) => page
                    .resources
                    .extend(upstream.iter().filter_map(|r| serde_json::from_value::<Resource>(r.listing.clone()).ok())),
                Err(e) => result = Err(e),
            }
        }
        self.count("resources/list", result.is_ok());
        result
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Self::identity(&context)?;
        let mut templates =
            if self.state.tasks.is_some() { resources::templates() } else { ListResourceTemplatesResult::default() };
        let result = self
            .visible_resources(&RequestInfo::from_context(&context), |r| r.template_prefix.is_some())
            .await
            .map(|upstream| {
                templates.resource_templates.extend(
                    upstream.iter().filter_map(|r| serde_json::from_value::<ResourceTemplate>(r.listing.clone()).ok()),
                );
                templates
            });
        self.count("resources/templates/list", result.is_ok());
        result
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let who = Self::identity(&context)?;
        let mut result = match self.upstream_resource(&request.uri, &RequestInfo::from_context(&context)).await {
            Some(answer) => answer,
            None => resources::read(&self.state, who, &request.uri).await,
        };
        self.count("resources/read", result.is_ok());
        // SEP-2164: from 2026-07-28 an unknown resource is invalid params (the URI in `data`);
        // older revisions keep -32002.
        if let Err(e) = result.as_mut()
            && e.code == rmcp::model::ErrorCode::RESOURCE_NOT_FOUND
            && context.protocol_version() == Some(ProtocolVersion::V_2026_07_28)
        {
            e.code = rmcp::model::ErrorCode::INVALID_PARAMS;
        }
        result.map(Into::into)
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let who = Self::identity(&context)?;
        let tools = TaskTools { state: &self.state, who };
        let result = match tools.extension_get(&request.task_id).await {
            Err(unknown) => self.call_task(who, &request.task_id).await.and_then(|t| t.ok_or(unknown)),
            found => found,
        };
        self.count("tasks/get", result.is_ok());
        result.map(GetTaskResult::new)
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let who = Self::identity(&context)?;
        let tools = TaskTools { state: &self.state, who };
        let result = match tools.extension_cancel(&request.task_id).await {
            Err(unknown) => match self.cancel_call_task(who, &request.task_id).await {
                Ok(true) => Ok(()),
                Ok(false) => Err(unknown),
                Err(e) => Err(e),
            },
            found => found,
        };
        self.count("tasks/cancel", result.is_ok());
        result
    }

    /// A request rmcp could read as no request type: invalid params of a served method
    /// (`tools/call` without `name`, say), or an unknown method.
    async fn on_custom_request(
        &self,
        request: rmcp::model::CustomRequest,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CustomResult, ErrorData> {
        Err(errors::unreadable_request(&request.method, request.params.as_ref()))
    }

    fn accepted_subscription_filter(&self, requested: &SubscriptionFilter) -> Option<SubscriptionFilter> {
        let mut accepted = SubscriptionFilter::new();
        accepted.tools_list_changed = requested.tools_list_changed.filter(|on| *on);
        accepted.prompts_list_changed = requested.prompts_list_changed.filter(|on| *on);
        // Task resources (when tasks are served), and any other URI: an upstream server's
        // resource is watched once the stream found it served to the caller, so an unknown
        // URI and one the caller may not read are accepted alike, and never updated.
        let tasks = self.state.tasks.is_some();
        let uris: Vec<String> = requested
            .resource_subscriptions
            .iter()
            .flatten()
            .filter(|uri| match resources::TaskResource::parse(uri) {
                Some(_) => tasks,
                None => !uri.starts_with(resources::SCHEME) && has_scheme(uri),
            })
            .take(MAX_RESOURCE_SUBSCRIPTIONS)
            .cloned()
            .collect();
        accepted.resource_subscriptions = (!uris.is_empty()).then_some(uris);
        Some(accepted)
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        let who = Self::identity(context.request_context())?;
        let _permit = self.admit_stream(who)?;
        let scope = RequestInfo::from_context(context.request_context()).scope();
        let (wants, uris) = watched(context.accepted());
        let notifications = ChangeFeed::new(self, who, scope, wants, &uris).await.into_stream(uris);
        let mut notifications = std::pin::pin!(notifications);
        loop {
            let next = tokio::select! {
                () = context.cancelled() => return Ok(()),
                next = notifications.next() => next,
            };
            let Some(notification) = next else { return Ok(()) };
            if context.sink().send(notification).await.is_err() {
                return Ok(());
            }
        }
    }
}

impl McpHandler {
    /// Admits one `subscriptions/listen` stream of `who`, held while the stream is open (the
    /// request's own admission ends with its head), and counts the request.
    pub(super) fn admit_stream(&self, who: &Identity) -> Result<StreamPermit, ErrorData> {
        match self.state.limits.try_admit_stream(who.owner_key().as_str()) {
            Ok(permit) => {
                self.count("subscriptions/listen", true);
                Ok(permit)
            }
            Err(rejection) => {
                self.state.metrics.admission_rejected(rejection);
                self.count("subscriptions/listen", false);
                let what = match rejection {
                    Rejection::StreamsUser => "too many open subscriptions/listen streams for this user",
                    _ => "too many open subscriptions/listen streams",
                };
                Err(errors::busy(what, self.retry_after()))
            }
        }
    }

    /// What a `subscriptions/listen` asking for `requested` is given, as rmcp decides it: what
    /// the gateway accepts of it, within the capabilities it advertises.
    pub(super) fn subscription_filter(&self, requested: &SubscriptionFilter) -> SubscriptionFilter {
        let accepted = self.accepted_subscription_filter(requested).unwrap_or_default();
        let advertised = requested.supported_by(&self.get_info().capabilities);
        requested.intersection(&accepted).intersection(&advertised)
    }
}

/// What a stream with the accepted `filter` is told: the list changes, and the resources
/// watched.
pub(super) fn watched(filter: &SubscriptionFilter) -> (Wants, Vec<String>) {
    let wants =
        Wants { tools: filter.tools_list_changed == Some(true), prompts: filter.prompts_list_changed == Some(true) };
    (wants, filter.resource_subscriptions.clone().unwrap_or_default())
}

/// True when `uri` starts with a URI scheme (`scheme:`).
fn has_scheme(uri: &str) -> bool {
    uri.split_once(':').is_some_and(|(scheme, _)| {
        scheme.starts_with(|c: char| c.is_ascii_alphabetic())
            && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn tool(name: &str) -> Arc<Tool> {
        let spec = serde_json::from_value(json!({
            "name": name, "description": "d", "inputSchema": {"type": "object"},
            "runtime": {"image": "i", "command": ["x"]},
        }))
        .unwrap();
        Arc::new(Tool::new(String::new(), name.replace('_', "-"), 1, spec).unwrap())
    }

    fn names<'a>(entries: impl Iterator<Item = Entry<'a>>) -> Vec<String> {
        entries.map(|e| e.name().to_owned()).collect()
    }

    #[test]
    fn only_uris_with_a_scheme_are_watched() {
        for uri in ["test://watched-resource", "quotes://ACME/last", "urn:isbn:0451450523", "a+b.c-d:x"] {
            assert!(has_scheme(uri), "{uri}");
        }
        for uri in ["", "no-scheme", ":x", "1a://x", "a b://x", "/abs/path"] {
            assert!(!has_scheme(uri), "{uri}");
        }
    }

    #[test]
    fn listings_merge_the_catalog_and_the_builtins_by_name_from_the_cursor() {
        let catalog = [tool("a_tool"), tool("delete_old"), tool("zeta")];
        let builtins = || vec![Builtin::CancelCall, Builtin::ListTasks, Builtin::StartCall];
        let all = Selection::all();
        let listed = |scope: &Scope, after| names(list_candidates(&catalog, scope, &all, builtins(), after));
        assert_eq!(
            listed(&Scope::All, None),
            ["a_tool", "cancel_call", "delete_old", "list_tasks", "start_call", "zeta"]
        );
        assert_eq!(listed(&Scope::All, Some("cancel_call")), ["delete_old", "list_tasks", "start_call", "zeta"]);
        assert_eq!(listed(&Scope::All, Some("delete_o")), ["delete_old", "list_tasks", "start_call", "zeta"]);
        assert_eq!(listed(&Scope::All, Some("zeta")), Vec::<String>::new());
        assert_eq!(listed(&Scope::Search, None), ["cancel_call", "list_tasks", "start_call"]);
        let toolset = Selection::toolset("none");
        assert_eq!(names(list_candidates(&catalog, &Scope::All, &toolset, Vec::new(), None)), Vec::<String>::new());
    }
}

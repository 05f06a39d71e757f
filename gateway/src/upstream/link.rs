//! One connection to an upstream MCP server (an rmcp client over Streamable HTTP, or over
//! the stdio of a process: local, or in a pod behind `toolyard-runner bridge`), and the
//! [`Executor`] its tools' calls run on.
//!
//! The connection sends only the server's own credential (from its McpServer), never a
//! caller's token. A call passes on its arguments, the caller's trace context (`_meta.traceparent`),
//! its progress (the server's `notifications/progress` with a `total` become the caller's), its
//! log messages (over Streamable HTTP: [`super::logs`]) and its cancellation
//! (`notifications/cancelled` to the server); the answer comes back unchanged in
//! [`CallResult::mcp`].

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use http::{HeaderName, HeaderValue};
use rmcp::ErrorData;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, ClientRequest,
    CompleteRequestParams, CompleteResult, ElicitRequestParams, ElicitResult, ElicitationCapability, ErrorCode,
    FormElicitationCapability, GetPromptRequestParams, Implementation, PingRequest, ProgressNotificationParam,
    ProgressToken, ReadResourceRequestParams, RequestMetaObject, SamplingCapability, ServerResult,
};
use rmcp::service::{NotificationContext, Peer, PeerRequestOptions, RequestContext, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, ClientLifecycleMode, ClientServiceExt, RoleClient};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::Notify;
use toolyard_api::protocol::{CallErrorKind, CallResult, Progress};
use toolyard_api::token::SigningKey;
use toolyard_process::child::ProcessGroup;

use crate::catalog::{CompletionSource, PromptError, PromptSource, ResourceError, ResourceSource};
use crate::executor::events::{self, ProgressSender};
use crate::executor::local::{Launch, gateway_only_env};
use crate::executor::pool::{CallRecord, CallRecords};
use crate::executor::{CallRequest, Executor};
use crate::upstream::logs::{AskRoute, CallStreams, LogRoute};

/// Largest answer (one JSON body or SSE event) taken from an upstream server.
pub const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// Longest line of a process's stdio transport (one JSON-RPC message) and of the bridge's
/// nonce.
const MAX_NONCE_LINE: u64 = 256;

/// How to reach one server.
#[derive(Clone, Debug)]
pub enum Endpoint {
    /// Streamable HTTP.
    Http {
        /// Its URL.
        url: String,
        /// A header sent with every request (the server's credential), never logged.
        credential: Option<(HeaderName, HeaderValue)>,
    },
    /// `toolyard-runner bridge` at `address` (`host:port`), in front of a process speaking
    /// stdio; `key` answers its nonce.
    Bridge {
        /// `host:port`.
        address: String,
        /// The server's derived key.
        key: SigningKey,
    },
    /// A local process speaking MCP on stdio, started for this connection.
    Process(Launch),
    /// A local process serving Streamable HTTP at `url`, started for this connection.
    HttpProcess {
        /// How it starts.
        launch: Launch,
        /// Where it serves.
        url: String,
    },
}

/// What the connection's client side hears from the server.
#[derive(Clone)]
struct Listener {
    info: ClientConfig,
    progress: Arc<ProgressRoutes>,
    list_changed: Arc<Notify>,
    updates: tokio::sync::broadcast::Sender<String>,
}

/// Where each running call's progress goes, by progress token. The server may report before
/// the call's route is in (it answers fast, and rmcp hands notifications to the handler on
/// tasks of their own): the latest such early report is kept, for [`EARLY_REPORT_TTL`] and at
/// most [`MAX_EARLY_REPORTS`] tokens, and handed over when the route comes.
#[derive(Default)]
struct ProgressRoutes {
    slots: Mutex<HashMap<ProgressToken, Slot>>,
}

enum Slot {
    Route(ProgressSender),
    Early(Progress, Instant),
}

/// How long a report for a call not registered yet is kept.
const EARLY_REPORT_TTL: Duration = Duration::from_secs(10);
/// Tokens whose early reports are kept at once (an upstream inventing tokens gets no more).
const MAX_EARLY_REPORTS: usize = 256;

impl ProgressRoutes {
    fn report(&self, token: &ProgressToken, progress: Progress) {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        match slots.get_mut(token) {
            Some(Slot::Route(sender)) => {
                sender.send_replace(Some(progress));
            }
            Some(Slot::Early(early, _)) => *early = progress,
            None => {
                slots.retain(|_, slot| !matches!(slot, Slot::Early(_, at) if at.elapsed() > EARLY_REPORT_TTL));
                if slots.len() < MAX_EARLY_REPORTS {
                    slots.insert(token.clone(), Slot::Early(progress, Instant::now()));
                }
            }
        }
    }

    fn register(&self, token: ProgressToken, sender: ProgressSender) {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(Slot::Early(early, _)) = slots.remove(&token) {
            sender.send_replace(Some(early));
        }
        slots.insert(token, Slot::Route(sender));
    }

    fn remove(&self, token: &ProgressToken) {
        self.slots.lock().unwrap_or_else(|e| e.into_inner()).remove(token);
    }
}

impl ClientHandler for Listener {
    fn get_info(&self) -> ClientConfig {
        self.info.clone()
    }

    async fn on_progress(&self, params: ProgressNotificationParam, _context: NotificationContext<RoleClient>) {
        // Only reports with a total have a fraction; MCP progress must grow, which the caller's
        // relay makes sure of.
        let Some(total) = params.total.filter(|t| *t > 0.0) else { return };
        let message = params.message.map(|m| m.chars().take(toolyard_api::protocol::MAX_PROGRESS_MESSAGE).collect());
        let progress = Progress { fraction: (params.progress / total).clamp(0.0, 1.0), message };
        self.progress.report(&params.progress_token, progress);
    }

    // A server's request reaches these only when it is tied to no call whose caller can be
    // asked (see `super::logs`): one sent on stdio, on its own stream, or during a call made
    // through rmcp's service (protocol 2026-07-28 clients).
    #[allow(deprecated)]
    async fn create_message(
        &self,
        _params: rmcp::model::CreateMessageRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<rmcp::model::CreateMessageResult, ErrorData> {
        Err(unrelayed("sampling/createMessage"))
    }

    async fn create_elicitation(
        &self,
        _request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        Err(unrelayed("elicitation/create"))
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.list_changed.notify_one();
    }

    async fn on_prompt_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.list_changed.notify_one();
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.list_changed.notify_one();
    }

    async fn on_resource_updated(
        &self,
        params: rmcp::model::ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        // Nobody listening is no error.
        let _ = self.updates.send(params.uri);
    }
}

/// What the gateway tells a server it may ask: sampling and elicitation, which it passes on
/// to the caller of the call the server asks during ([`super::logs`]).
fn relayed_capabilities() -> ClientCapabilities {
    let mut capabilities = ClientCapabilities::default();
    capabilities.sampling = Some(SamplingCapability::default());
    capabilities.elicitation = Some(ElicitationCapability::new().with_form(FormElicitationCapability::default()));
    capabilities
}

/// The error a server's request gets when there is no caller to ask.
fn unrelayed(method: &str) -> ErrorData {
    ErrorData::invalid_request(
        format!(
            "Toolyard passes {method} on only to the caller of a call to this server, made over Streamable HTTP; \
             there is none to ask for this request"
        ),
        None,
    )
}

/// What a server lists.
#[derive(Clone, Debug, Default)]
pub struct Listing {
    /// Its tools.
    pub tools: Vec<rmcp::model::Tool>,
    /// Its prompts.
    pub prompts: Vec<rmcp::model::Prompt>,
    /// Its resources.
    pub resources: Vec<rmcp::model::Resource>,
    /// Its resource templates.
    pub templates: Vec<rmcp::model::ResourceTemplate>,
}

/// A live connection, and the local process it started, if any (killed with it).
pub struct Connection {
    service: RunningService<RoleClient, Listener>,
    _process: Option<Process>,
}

/// A process started for a connection: its whole group is killed when dropped.
struct Process {
    child: tokio::process::Child,
    _group: ProcessGroup,
}

impl Process {
    fn start(launch: &Launch, stdio: bool) -> Result<Self, String> {
        let Some(program) = launch.argv.first() else { return Err("the runtime has no command".into()) };
        let mut command = tokio::process::Command::new(program);
        command.args(&launch.argv[1..]).current_dir(&launch.cwd).process_group(0).kill_on_drop(true);
        for name in gateway_only_env() {
            command.env_remove(name);
        }
        command.envs(launch.env.iter().map(|(k, v)| (k, v)));
        command.stdin(if stdio { Stdio::piped() } else { Stdio::null() }).stdout(if stdio {
            Stdio::piped()
        } else {
            Stdio::inherit()
        });
        let child = command.spawn().map_err(|e| format!("cannot start {program:?}: {e}"))?;
        let group = ProcessGroup::new(child.id());
        Ok(Self { child, _group: group })
    }
}

/// An `initialize` handshake under way.
type Handshake = std::pin::Pin<
    Box<
        dyn std::future::Future<
                Output = Result<RunningService<RoleClient, Listener>, rmcp::service::ClientInitializeError>,
            > + Send,
    >,
>;

/// The handshake of a Streamable HTTP session with `url`.
fn http_session(
    listener: Listener,
    http: reqwest::Client,
    url: &str,
    credential: Option<&(HeaderName, HeaderValue)>,
) -> Handshake {
    let mut config = StreamableHttpClientTransportConfig::with_uri(url.to_owned());
    config.max_json_response_size = MAX_RESPONSE_BYTES;
    config.max_sse_event_size = MAX_RESPONSE_BYTES;
    if let Some((name, value)) = credential {
        config = config.custom_headers(HashMap::from([(name.clone(), value.clone())]));
    }
    let transport = StreamableHttpClientTransport::with_client(CallStreams(http), config);
    Box::pin(listener.serve_with_lifecycle(transport, ClientLifecycleMode::Initialize))
}

/// Waits until something accepts connections at `url`'s host and port (a process starting).
async fn listening(url: &str, timeout: Duration) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    let address =
        format!("{}:{}", parsed.host_str().unwrap_or("127.0.0.1"), parsed.port_or_known_default().unwrap_or(80));
    let wait = async {
        loop {
            if tokio::net::TcpStream::connect(&address).await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(timeout, wait)
        .await
        .map_err(|_| format!("the server's command does not listen on {address} within {} s", timeout.as_secs()))
}

/// Connects to `toolyard-runner bridge` at `address` and answers its nonce with `key`.
async fn bridge(
    address: &str,
    key: &SigningKey,
) -> Result<(BufReader<tokio::net::tcp::OwnedReadHalf>, tokio::net::tcp::OwnedWriteHalf), String> {
    let stream =
        tokio::net::TcpStream::connect(address).await.map_err(|e| format!("cannot connect to {address}: {e}"))?;
    let _ = stream.set_nodelay(true);
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    let mut nonce = String::new();
    match (&mut reader).take(MAX_NONCE_LINE).read_line(&mut nonce).await {
        Ok(n) if n > 0 && nonce.ends_with('\n') => {}
        Ok(_) => return Err(format!("{address} is not a Toolyard bridge (no nonce line)")),
        Err(e) => return Err(format!("reading the bridge's nonce failed: {e}")),
    }
    let proof = key.prove(nonce.trim_end());
    write.write_all(format!("{proof}\n").as_bytes()).await.map_err(|e| format!("answering the bridge failed: {e}"))?;
    Ok((reader, write))
}

impl Connection {
    /// Connects (starting the server's process if it is a local one) and completes the
    /// `initialize` handshake within `timeout`.
    pub async fn open(
        endpoint: &Endpoint,
        http: reqwest::Client,
        timeout: Duration,
        link: &Link,
    ) -> Result<Self, String> {
        let listener = Listener {
            info: ClientConfig::new(
                relayed_capabilities(),
                Implementation::new("toolyard-gateway", env!("CARGO_PKG_VERSION")),
            ),
            progress: link.progress.clone(),
            list_changed: link.list_changed.clone(),
            updates: link.updates.clone(),
        };
        let started = Instant::now();
        let (handshake, process) = match endpoint {
            Endpoint::Http { url, credential } => (http_session(listener, http, url, credential.as_ref()), None),
            Endpoint::HttpProcess { launch, url } => {
                let process = Process::start(launch, false)?;
                listening(url, timeout).await?;
                (http_session(listener, http, url, None), Some(process))
            }
            Endpoint::Process(launch) => {
                let mut process = Process::start(launch, true)?;
                let (Some(stdout), Some(stdin)) = (process.child.stdout.take(), process.child.stdin.take()) else {
                    return Err("the server's stdio is not piped".into());
                };
                (
                    Box::pin(listener.serve_with_lifecycle((stdout, stdin), ClientLifecycleMode::Initialize))
                        as Handshake,
                    Some(process),
                )
            }
            Endpoint::Bridge { address, key } => {
                let transport = tokio::time::timeout(timeout, bridge(address, key))
                    .await
                    .map_err(|_| format!("no answer from {address} within {} s", timeout.as_secs()))??;
                (Box::pin(listener.serve_with_lifecycle(transport, ClientLifecycleMode::Initialize)) as Handshake, None)
            }
        };
        let left = timeout.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, handshake).await {
            Ok(Ok(service)) => Ok(Self { service, _process: process }),
            Ok(Err(e)) => Err(format!("the MCP handshake failed: {}", error_chain(&e))),
            Err(_) => Err(format!("no answer to the MCP handshake within {} s", timeout.as_secs())),
        }
    }

    /// Every tool and, if the server has them, every prompt, resource and resource template it
    /// lists (all pages), each listing within `timeout`.
    pub async fn list(&self, timeout: Duration) -> Result<Listing, String> {
        let peer = self.service.peer();
        let capabilities = peer.peer_info().map(|info| info.capabilities.clone()).unwrap_or_default();
        let tools = within(timeout, "tools/list", peer.list_all_tools()).await?;
        let prompts = match capabilities.prompts {
            Some(_) => within(timeout, "prompts/list", peer.list_all_prompts()).await?,
            None => Vec::new(),
        };
        let (resources, templates) = match capabilities.resources {
            Some(_) => (
                within(timeout, "resources/list", peer.list_all_resources()).await?,
                within(timeout, "resources/templates/list", peer.list_all_resource_templates()).await?,
            ),
            None => (Vec::new(), Vec::new()),
        };
        Ok(Listing { tools, prompts, resources, templates })
    }

    /// Pings the server; an error says why it is unreachable.
    pub async fn ping(&self, timeout: Duration) -> Result<(), String> {
        let ping = self.service.peer().send_request(ClientRequest::PingRequest(PingRequest::default()));
        match tokio::time::timeout(timeout, ping).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!("ping failed: {}", error_chain(&e))),
            Err(_) => Err(format!("no answer to ping within {} s", timeout.as_secs())),
        }
    }

    /// The peer calls are sent through.
    pub fn peer(&self) -> Peer<RoleClient> {
        self.service.peer().clone()
    }

    /// Closes the connection (ends the server's session).
    pub async fn close(self) {
        let _ = tokio::time::timeout(Duration::from_secs(5), self.service.cancel()).await;
    }
}

/// The calls of one server's tools: sent on its current connection, if any.
pub struct Link {
    /// `namespace/name` of the McpServer, for messages.
    server: String,
    timeout: Duration,
    peer: RwLock<Option<Peer<RoleClient>>>,
    progress: Arc<ProgressRoutes>,
    /// Told when the server says its tools changed.
    pub list_changed: Arc<Notify>,
    /// Told when a call found the connection broken.
    pub broken: Notify,
    /// Where calls' files go (none: not stored).
    records: Option<Arc<CallRecords>>,
    /// The URIs the server says were updated (`notifications/resources/updated`).
    updates: tokio::sync::broadcast::Sender<String>,
    /// The resources subscribed to on the server, each with how many watch it here.
    subscribed: Mutex<HashMap<String, usize>>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link").field("server", &self.server).finish_non_exhaustive()
    }
}

impl Link {
    /// The link of server `server` (`namespace/name`), whose calls may take `timeout`, their
    /// files stored by `records`.
    pub fn new(server: String, timeout: Duration, records: Option<Arc<CallRecords>>) -> Self {
        Self {
            records,
            server,
            timeout,
            peer: RwLock::new(None),
            progress: Arc::default(),
            list_changed: Arc::default(),
            broken: Notify::new(),
            updates: tokio::sync::broadcast::channel(RESOURCE_UPDATES).0,
            subscribed: Mutex::default(),
        }
    }

    /// Subscribes the server (a new connection) to every resource watched here.
    pub async fn resubscribe(&self) {
        let uris: Vec<String> = self.subscribed.lock().unwrap_or_else(|e| e.into_inner()).keys().cloned().collect();
        for uri in uris {
            if let Err(e) = self.subscribe_on_server(&uri).await {
                tracing::warn!(server = %self.server, error = %String::from(e), "subscribing again to a resource failed");
            }
        }
    }

    // The connection is a 2025-era session: `resources/subscribe` is how it subscribes.
    #[allow(deprecated)]
    async fn subscribe_on_server(&self, uri: &str) -> Result<(), Unanswered> {
        let params = rmcp::model::SubscribeRequestParams::new(uri.to_owned());
        let server = self.server.clone();
        self.ask("resources/subscribe", |peer| async move {
            if peer
                .peer_info()
                .is_none_or(|i| i.capabilities.resources.as_ref().and_then(|r| r.subscribe) != Some(true))
            {
                let refusal = format!("the MCP server {server} offers no resource subscriptions");
                return Err(rmcp::ServiceError::McpError(ErrorData::invalid_params(refusal, None)));
            }
            peer.subscribe(params).await.map(|()| Value::Null)
        })
        .await
        .map(drop)
    }

    /// Calls go to `peer` from now on (`None`: the server is not connected).
    pub fn set_peer(&self, peer: Option<Peer<RoleClient>>) {
        *self.peer.write().unwrap_or_else(|e| e.into_inner()) = peer;
    }

    fn current(&self) -> Option<Peer<RoleClient>> {
        self.peer.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Removes a call's progress route when the call ends.
struct Route<'a> {
    routes: &'a ProgressRoutes,
    token: ProgressToken,
}

impl Drop for Route<'_> {
    fn drop(&mut self) {
        self.routes.remove(&self.token);
    }
}

#[async_trait]
impl Executor for Link {
    /// Forwards the call, then stores its files (input, result, event log) under the caller's
    /// prefix like a warm-pool call's.
    async fn call(&self, request: CallRequest) -> crate::Result<CallResult> {
        let result = self.forward(&request).await?;
        if let Some(records) = &self.records {
            let input = serde_json::to_vec(&request.arguments).unwrap_or_default();
            let log = events::pool_log(&request, Vec::new(), &result);
            let owner = request.caller.owner_key();
            records
                .record(CallRecord::new(owner, request.id.as_str(), input, &result, None, None).with_events(log))
                .await;
        }
        Ok(result)
    }
}

impl Link {
    /// The server's answer to `request`, or why there is none.
    async fn forward(&self, request: &CallRequest) -> crate::Result<CallResult> {
        let started = Instant::now();
        let ms = || started.elapsed().as_millis() as u64;
        let Some(upstream) = request.tool.upstream.as_ref() else {
            return Err(crate::Error::Internal(format!("{} is not an upstream tool", request.tool.name())));
        };
        let Some(peer) = self.current() else {
            return Ok(CallResult::err(
                CallErrorKind::Crashed,
                format!("the MCP server {} is not connected; try again later", self.server),
                None,
                ms(),
            ));
        };
        let mut params = CallToolRequestParams::new(upstream.tool.clone()).with_arguments(request.arguments.clone());
        if let Some(traceparent) = &request.traceparent {
            let mut meta = RequestMetaObject::default();
            meta.0.insert("traceparent".into(), Value::String(traceparent.clone()));
            params.meta = Some(meta);
        }
        let mut call = CallToolRequest::new(params);
        if let Some(logs) = &request.logs {
            call.extensions.insert(LogRoute(logs.clone()));
        }
        if let Some(asker) = &request.asker {
            call.extensions.insert(AskRoute::new(asker.clone()));
        }
        // The call's deadline is kept below, where a cancellation also ends the wait.
        let options = PeerRequestOptions::no_options();
        let handle = match peer.send_request_with_option(ClientRequest::CallToolRequest(call), options).await {
            Ok(handle) => handle,
            Err(e) => {
                self.broken.notify_one();
                return Ok(CallResult::err(
                    CallErrorKind::Crashed,
                    format!("the MCP server {} is not reachable: {}", self.server, error_chain(&e)),
                    None,
                    ms(),
                ));
            }
        };
        let progress = request.progress.clone();
        let _route = progress.clone().map(|sender| {
            let token = handle.progress_token.clone();
            self.progress.register(token.clone(), sender);
            Route { routes: &self.progress, token }
        });
        let id = handle.id.clone();
        let answer = tokio::select! {
            answer = tokio::time::timeout(self.timeout, handle.await_response()) => answer,
            () = request.cancel.cancelled() => {
                cancel(&peer, id, "the caller cancelled the call").await;
                return Ok(CallResult::err(CallErrorKind::Cancelled, "the call was cancelled", None, ms()));
            }
        };
        let result = match answer {
            Err(_) => {
                cancel(&peer, id, "timed out").await;
                return Ok(CallResult::err(
                    CallErrorKind::TimedOut,
                    format!("the MCP server {} did not answer within {} s", self.server, self.timeout.as_secs()),
                    None,
                    ms(),
                ));
            }
            Ok(Err(e)) => {
                let message = match &e {
                    rmcp::ServiceError::McpError(error) => {
                        format!("the MCP server {} refused the call: {}", self.server, error.message)
                    }
                    rmcp::ServiceError::TransportClosed => {
                        self.broken.notify_one();
                        format!(
                            "the connection to the MCP server {} closed during the call (the server went away, or sent a \
                             message above the {} MiB limit)",
                            self.server,
                            MAX_RESPONSE_BYTES / (1024 * 1024)
                        )
                    }
                    _ => {
                        self.broken.notify_one();
                        format!("the MCP server {} failed: {}", self.server, error_chain(&e))
                    }
                };
                return Ok(CallResult::err(CallErrorKind::ToolError, message, None, ms()));
            }
            Ok(Ok(ServerResult::CallToolResult(result))) => result,
            Ok(Ok(_)) => {
                return Ok(CallResult::err(
                    CallErrorKind::BadResult,
                    format!(
                        "the MCP server {} answered tools/call with something else than a tool result",
                        self.server
                    ),
                    None,
                    ms(),
                ));
            }
        };
        // The server's last report may come after its answer (rmcp hands notifications over
        // on tasks of their own): a call that reported progress ends at 100%.
        if let Some(sender) = progress
            && result.is_error != Some(true)
            && sender.borrow().as_ref().is_some_and(|p| p.fraction < 1.0)
        {
            sender.send_replace(Some(Progress { fraction: 1.0, message: None }));
        }
        Ok(passed_on(result, ms()))
    }
}

#[async_trait]
impl PromptSource for Link {
    async fn get(&self, name: &str, arguments: serde_json::Map<String, Value>) -> Result<Value, PromptError> {
        let mut params = GetPromptRequestParams::new(name.to_owned());
        params.arguments = Some(arguments);
        self.ask("prompts/get", |peer| async move { peer.get_prompt(params).await })
            .await
            .map_err(|e| PromptError::Failed(e.into()))
    }
}

/// Resource updates of one server that may wait for a slow watcher (one that falls further
/// behind is told every resource it watches may have changed).
const RESOURCE_UPDATES: usize = 64;

/// Why [`Link::ask`] got no answer.
enum Unanswered {
    /// The server answered with an error.
    Refused(rmcp::ErrorData, String),
    /// Not connected, a broken connection, or no answer in time (the message says which).
    Failed(String),
}

impl From<Unanswered> for String {
    fn from(u: Unanswered) -> String {
        match u {
            Unanswered::Refused(_, message) | Unanswered::Failed(message) => message,
        }
    }
}

impl Link {
    /// `method` (sent by `send`) on the current connection, its answer as JSON within the
    /// server's timeout; a broken connection is reported for the next ping.
    async fn ask<T, F, Fut>(&self, method: &str, send: F) -> Result<Value, Unanswered>
    where
        T: serde::Serialize,
        F: FnOnce(Peer<RoleClient>) -> Fut,
        Fut: std::future::Future<Output = Result<T, rmcp::ServiceError>>,
    {
        let server = &self.server;
        let Some(peer) = self.current() else {
            return Err(Unanswered::Failed(format!("the MCP server {server} is not connected; try again later")));
        };
        match tokio::time::timeout(self.timeout, send(peer)).await {
            Ok(Ok(answer)) => serde_json::to_value(&answer).map_err(|e| Unanswered::Failed(e.to_string())),
            Ok(Err(rmcp::ServiceError::McpError(error))) => {
                let message = format!("the MCP server {server} refused {method}: {}", error.message);
                Err(Unanswered::Refused(error, message))
            }
            Ok(Err(e)) => {
                self.broken.notify_one();
                Err(Unanswered::Failed(format!("the MCP server {server} failed: {}", error_chain(&e))))
            }
            Err(_) => Err(Unanswered::Failed(format!(
                "the MCP server {server} did not answer within {} s",
                self.timeout.as_secs()
            ))),
        }
    }
}

/// `listing`'s answer within `timeout`, or why not (`method` names it).
async fn within<T>(
    timeout: Duration,
    method: &str,
    listing: impl std::future::Future<Output = Result<T, rmcp::ServiceError>>,
) -> Result<T, String> {
    match tokio::time::timeout(timeout, listing).await {
        Ok(Ok(items)) => Ok(items),
        Ok(Err(e)) => Err(format!("{method} failed: {}", error_chain(&e))),
        Err(_) => Err(format!("no answer to {method} within {} s", timeout.as_secs())),
    }
}

#[async_trait]
impl ResourceSource for Link {
    async fn read(&self, uri: &str) -> Result<Value, ResourceError> {
        let params = ReadResourceRequestParams::new(uri.to_owned());
        match self.ask("resources/read", |peer| async move { peer.read_resource(params).await }).await {
            Ok(answer) => Ok(answer),
            Err(Unanswered::Refused(error, _))
                if error.code == ErrorCode::RESOURCE_NOT_FOUND || error.code == ErrorCode::INVALID_PARAMS =>
            {
                Err(ResourceError::NotFound)
            }
            Err(other) => Err(ResourceError::Failed(other.into())),
        }
    }

    /// The server is asked (`resources/subscribe`) only by the first watcher of `uri` here;
    /// one that cannot be asked now (not connected, no answer) is asked again once connected.
    async fn subscribe(&self, uri: &str) -> Result<tokio::sync::broadcast::Receiver<String>, String> {
        let updates = self.updates.subscribe();
        let first = {
            let mut subscribed = self.subscribed.lock().unwrap_or_else(|e| e.into_inner());
            let count = subscribed.entry(uri.to_owned()).or_default();
            *count += 1;
            *count == 1
        };
        if first {
            match self.subscribe_on_server(uri).await {
                Ok(()) => {}
                Err(Unanswered::Refused(_, message)) => {
                    self.unsubscribe(uri);
                    return Err(message);
                }
                Err(Unanswered::Failed(message)) => {
                    tracing::info!(server = %self.server, error = %message, "a resource is subscribed to once the server answers");
                }
            }
        }
        Ok(updates)
    }

    /// The server is told (`resources/unsubscribe`, in a task of its own) when the last
    /// watcher of `uri` here stops.
    #[allow(deprecated)]
    fn unsubscribe(&self, uri: &str) {
        let mut subscribed = self.subscribed.lock().unwrap_or_else(|e| e.into_inner());
        let Some(count) = subscribed.get_mut(uri) else { return };
        *count -= 1;
        if *count > 0 {
            return;
        }
        subscribed.remove(uri);
        // A watcher dropped while the runtime shuts down has nobody to tell.
        let (Some(peer), Ok(runtime)) = (self.current(), tokio::runtime::Handle::try_current()) else { return };
        let params = rmcp::model::UnsubscribeRequestParams::new(uri.to_owned());
        let timeout = self.timeout;
        runtime.spawn(async move {
            let _ = tokio::time::timeout(timeout, peer.unsubscribe(params)).await;
        });
    }
}

#[async_trait]
impl CompletionSource for Link {
    async fn complete(&self, request: Value) -> Result<Value, String> {
        let params: CompleteRequestParams = serde_json::from_value(request).map_err(|e| e.to_string())?;
        let complete = |peer: Peer<RoleClient>| async move {
            if peer.peer_info().is_none_or(|info| info.capabilities.completions.is_none()) {
                // A server without completions has no suggestions.
                return Ok(CompleteResult::default());
            }
            peer.complete(params).await
        };
        self.ask("completion/complete", complete).await.map_err(String::from)
    }
}

/// Tells the server to stop request `id`.
async fn cancel(peer: &Peer<RoleClient>, id: rmcp::model::RequestId, reason: &str) {
    let params = rmcp::model::CancelledNotificationParam::new(Some(id), Some(reason.to_owned()));
    let _ = tokio::time::timeout(Duration::from_secs(5), peer.notify_cancelled(params)).await;
}

/// The runner protocol's result of an upstream answer: the answer itself in `mcp`, and for
/// callers that are not MCP clients `value` (its `structuredContent`, else its text parsed as
/// JSON where it is JSON) or `error` (its text).
pub fn passed_on(result: CallToolResult, duration_ms: u64) -> CallResult {
    let text: Vec<&str> = result.content.iter().filter_map(|c| c.as_text().map(|t| t.text.as_str())).collect();
    let text = text.join("\n");
    let mut out = if result.is_error == Some(true) {
        let message = if text.is_empty() { "the tool failed".to_owned() } else { text };
        CallResult::err(CallErrorKind::ToolError, message, None, duration_ms)
    } else {
        let value = match &result.structured_content {
            Some(v) => v.clone(),
            None => serde_json::from_str(&text).unwrap_or(Value::String(text)),
        };
        CallResult::ok(value, duration_ms)
    };
    out.exit_code = None;
    out.mcp = serde_json::to_value(&result).ok();
    out
}

/// What `e` comes down to: its innermost source (e.g. `Connection refused (os error 111)`,
/// a JSON syntax error), without the transport's wrappers; the whole chain goes to the debug
/// log.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut innermost = e;
    let mut chain = e.to_string();
    while let Some(source) = innermost.source() {
        chain.push_str(": ");
        chain.push_str(&source.to_string());
        innermost = source;
    }
    tracing::debug!(error = chain, "upstream MCP error");
    innermost.to_string()
}

#[cfg(test)]
mod tests {
    use rmcp::model::ContentBlock;
    use serde_json::json;

    use super::*;

    #[test]
    fn a_report_before_its_route_is_handed_over_and_unknown_tokens_are_bounded() {
        let routes = ProgressRoutes::default();
        let token = ProgressToken(rmcp::model::NumberOrString::Number(7));
        routes.report(&token, Progress { fraction: 0.0, message: None });
        routes.report(&token, Progress { fraction: 0.25, message: None });
        let (sender, receiver) = tokio::sync::watch::channel(None);
        routes.register(token.clone(), sender);
        assert_eq!(receiver.borrow().as_ref().map(|p| p.fraction), Some(0.25), "the early report is handed over");
        routes.report(&token, Progress { fraction: 0.5, message: None });
        assert_eq!(receiver.borrow().as_ref().map(|p| p.fraction), Some(0.5));
        routes.remove(&token);
        for n in 0..1000 {
            let other = ProgressToken(rmcp::model::NumberOrString::Number(1000 + n));
            routes.report(&other, Progress { fraction: 0.1, message: None });
        }
        assert_eq!(routes.slots.lock().unwrap().len(), MAX_EARLY_REPORTS);
    }

    #[test]
    fn answers_keep_their_content_and_say_it_for_other_callers() {
        let mut ok = CallToolResult::success(vec![ContentBlock::text("{\"price\": 3}")]);
        let r = passed_on(ok.clone(), 5);
        assert_eq!(r.value, Some(json!({"price": 3})));
        assert_eq!(r.mcp.as_ref().unwrap()["content"][0]["text"], "{\"price\": 3}");
        ok.structured_content = Some(json!({"price": 4}));
        assert_eq!(passed_on(ok, 5).value, Some(json!({"price": 4})));
        let plain = passed_on(CallToolResult::success(vec![ContentBlock::text("hello")]), 1);
        assert_eq!(plain.value, Some(json!("hello")));
        let failed = passed_on(CallToolResult::error(vec![ContentBlock::text("no such ticker")]), 1);
        assert_eq!(failed.error.as_ref().unwrap().message, "no such ticker");
        assert_eq!(failed.mcp.as_ref().unwrap()["isError"], true);
    }
}

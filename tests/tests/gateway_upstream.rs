//! Upstream MCP servers on the real apiserver: McpServer objects watched by the gateway, the
//! credential from a Secret labelled for the server (and from no other), RBAC on
//! `mcpservers` deciding who sees the tools, and this replica's connection in the object's
//! status, through a server that goes away and comes back. The upstream is the official
//! Python SDK's server (`tests/fixtures/python/upstream_server.py`).

use crate::gateway_support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use gateway_support::{
    CountingStore, Gateway, Options, REPLICA, UPSTREAM_SECRET, apply_role, grant_platform, named_rule, user_subject,
};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use rmcp::ClientLifecycleMode;
use rmcp::model::{CallToolRequestParams, CallToolResponse, ClientConfig, ProtocolVersion, ReadResourceRequestParams};
use serde_json::{Value, json};
use toolyard_api::McpServer;
use toolyard_api::mcpserver::{CREDENTIAL_LABEL, Connection, ConnectionState};
use toolyard_gateway::mcp::sessions::SUBSCRIPTIONS_RECHECK;
use toolyard_tests::legacy::LegacySession;
use toolyard_tests::local::TempDir;
use toolyard_tests::upstream::{ServerProcess, UpstreamServer, free_port};
use toolyard_tests::{TestEnv, User, wait_until};

const CREDENTIAL: &str = "upstream-s3cret-0001";

async fn create_server(ns: &str, name: &str, port: u16, with_auth: bool) {
    let admin = TestEnv::get().client(User::Admin).await;
    let mut spec = json!({"url": UpstreamServer::url(port), "reconnectDelaysSeconds": [1, 2, 3], "timeoutSeconds": 20});
    if with_auth {
        spec["auth"] = json!({"secretKeyRef": {"name": UPSTREAM_SECRET, "key": "token"}});
    }
    let object: McpServer = serde_json::from_value(json!({
        "apiVersion": "toolyard.dev/v1alpha1", "kind": "McpServer", "metadata": {"name": name}, "spec": spec,
    }))
    .expect("McpServer");
    Api::<McpServer>::namespaced(admin, ns).create(&PostParams::default(), &object).await.expect("McpServer created");
}

/// This replica's connection in the status of McpServer `name`, once `done` holds for it.
async fn connection(ns: &str, name: &str, what: &str, done: impl Fn(&Connection) -> bool) -> Connection {
    let api: Api<McpServer> = Api::namespaced(TestEnv::get().client(User::Admin).await, ns);
    let found = std::sync::Mutex::new(None);
    wait_until(Duration::from_secs(60), what, || async {
        let server = api.get(name).await?;
        let entry = server.status.unwrap_or_default().connections.into_iter().find(|c| c.replica == REPLICA);
        let matched = entry.filter(|c| done(c));
        let ok = matched.is_some();
        *found.lock().expect("lock") = matched;
        Ok(ok)
    })
    .await
    .unwrap_or_else(|e| panic!("{what}: {e}"));
    found.into_inner().expect("lock").expect("found")
}

async fn listed(client: &rmcp::service::RunningService<rmcp::RoleClient, rmcp::model::ClientConfig>) -> Vec<String> {
    let tools = client.list_all_tools().await.expect("tools/list");
    let mut names: Vec<String> = tools.into_iter().map(|t| t.name.to_string()).collect();
    names.sort();
    names
}

#[tokio::test]
async fn an_mcpserver_is_served_with_its_own_credential_to_the_users_rbac_allows() {
    let env = TestEnv::get();
    env.install_crds().await.expect("CRDs");
    let ns = env.namespace("gwup").await.expect("namespace");
    grant_platform(&ns).await;
    // alice may use every tool of market-data; bob nothing.
    apply_role(
        &ns,
        "market-data-callers",
        vec![named_rule(&["toolyard.dev"], &["mcpservers"], &["call"], &["market-data"])],
        vec![user_subject("alice")],
    )
    .await;
    gateway_support::wait_allowed("alice", &[], &ns, "toolyard.dev", "mcpservers", "call", Some("market-data")).await;
    let admin = env.client(User::Admin).await;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(UPSTREAM_SECRET.into()),
            labels: Some(BTreeMap::from([(CREDENTIAL_LABEL.to_owned(), "market-data".to_owned())])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([("token".to_owned(), ByteString(CREDENTIAL.as_bytes().to_vec()))])),
        ..Secret::default()
    };
    Api::<Secret>::namespaced(admin, &ns).create(&PostParams::default(), &secret).await.expect("Secret created");

    let markers = TempDir::new("gwup-markers");
    let port = free_port();
    let upstream = UpstreamServer::start(port, markers.path());
    create_server(&ns, "market-data", port, true).await;
    // The same Secret named by another server: it is not labelled for it, so it is not sent.
    create_server(&ns, "research", port, true).await;
    // The entry of a replica that was killed an hour ago, before it could withdraw it.
    let api: Api<McpServer> = Api::namespaced(env.client(User::Admin).await, &ns);
    let dead = json!({"apiVersion": "toolyard.dev/v1alpha1", "kind": "McpServer", "status": {"connections": [
        {"replica": "gw-killed", "state": "Connected", "tools": 8, "failures": 0, "observedGeneration": 1,
         "updated": "2026-01-01T00:00:00Z"}]}});
    api.patch_status("market-data", &PatchParams::apply("toolyard-gateway/gw-killed").force(), &Patch::Apply(&dead))
        .await
        .expect("a dead replica's entry");
    let gw = Gateway::start(std::slice::from_ref(&ns), Options::default()).await;

    let up = connection(&ns, "market-data", "market-data connected", |c| c.state == ConnectionState::Connected).await;
    assert_eq!((up.tools, up.failures, up.last_error.as_deref()), (10, 0, None), "{up:?}");
    // The killed replica's entry is removed; this replica's stays, rewritten.
    wait_until(Duration::from_secs(30), "the killed replica's entry removed", || async {
        let status = api.get("market-data").await?.status.unwrap_or_default();
        Ok(status.connections.iter().all(|c| c.replica != "gw-killed"))
    })
    .await
    .expect("a gone replica's entry is pruned");
    let rewritten = connection(&ns, "market-data", "its own entry rewritten", |c| c.updated > up.updated).await;
    assert_eq!(rewritten.state, ConnectionState::Connected);
    let refused =
        connection(&ns, "research", "research refused its credential", |c| c.state == ConnectionState::Waiting).await;
    let error = refused.last_error.as_deref().unwrap_or_default();
    assert!(error.contains("is not labelled toolyard.dev/mcp-server=research"), "{error}");
    assert!(refused.next_retry.is_some(), "{refused:?}");

    let alice = gw.client(User::Alice).await;
    let names = listed(&alice).await;
    assert!(names.contains(&"market_data_get_quote".to_owned()), "{names:?}");
    assert!(!names.iter().any(|n| n.starts_with("research_")), "research is not connected: {names:?}");
    let quote = alice
        .call_tool(
            CallToolRequestParams::new("market_data_get_quote")
                .with_arguments(json!({"ticker": "ACME"}).as_object().expect("object").clone()),
        )
        .await
        .expect("call");
    assert_eq!(quote.structured_content, Some(json!({"ticker": "ACME", "price": 12.5})));
    // The server sees its own credential, never alice's token.
    let who = alice.call_tool(CallToolRequestParams::new("market_data_whoami")).await.expect("call");
    let who = who.structured_content.expect("structured");
    assert_eq!(who["authorization"], Value::String(format!("Bearer {CREDENTIAL}")), "{who}");

    // Its resources, under their own URIs: one listed, the others through its template.
    let resources = alice.list_all_resources().await.expect("resources/list");
    assert!(resources.iter().any(|r| r.uri == "quotes://ACME/last"), "{resources:?}");
    let templates = alice.list_all_resource_templates().await.expect("resources/templates/list");
    assert!(templates.iter().any(|t| t.uri_template == "quotes://{ticker}/history"), "{templates:?}");
    let read = |uri: &str| ReadResourceRequestParams::new(uri.to_owned());
    let last =
        serde_json::to_value(alice.read_resource(read("quotes://ACME/last")).await.expect("read")).expect("json");
    assert_eq!(last["contents"][0]["text"], r#"{"ticker": "ACME", "price": 12.5}"#, "{last}");
    let history =
        serde_json::to_value(alice.read_resource(read("quotes://INITECH/history")).await.expect("read")).expect("json");
    assert_eq!(history["contents"][0]["text"], "INITECH: 12.0, 12.25, 12.5", "{history}");

    // bob may not: he sees none of the tools or resources, and a call or a read is answered as
    // for an unknown tool or resource.
    let bob = gw.client(User::Bob).await;
    assert!(!listed(&bob).await.iter().any(|n| n.starts_with("market_data_")));
    let denied = bob.call_tool(CallToolRequestParams::new("market_data_get_quote")).await;
    assert!(denied.is_err_and(|e| e.to_string().contains("Unknown tool")));
    let resources = bob.list_all_resources().await.expect("resources/list");
    assert!(!resources.iter().any(|r| r.uri.starts_with("quotes://")), "{resources:?}");
    let unread = bob.read_resource(read("quotes://ACME/last")).await.expect_err("not bob's");
    let unknown = bob.read_resource(read("quotes://nothing")).await.expect_err("nobody's");
    assert_eq!(unread.to_string().replace("ACME/last", "nothing"), unknown.to_string(), "alike: {unread}");

    // Away: the status says so with the next retry, and the tools leave the listing.
    drop(upstream);
    let away = connection(&ns, "market-data", "market-data away", |c| c.state == ConnectionState::Waiting).await;
    assert!(away.failures >= 1 && away.next_retry.is_some() && away.last_error.is_some(), "{away:?}");
    wait_until(Duration::from_secs(30), "tools gone", || async {
        Ok(!listed(&alice).await.contains(&"market_data_get_quote".to_owned()))
    })
    .await
    .expect("the tools of a server that is away are not listed");
    // Back: connected again, tools served again.
    let _upstream = UpstreamServer::start(port, markers.path());
    let back = connection(&ns, "market-data", "market-data back", |c| c.state == ConnectionState::Connected).await;
    assert_eq!((back.failures, back.tools), (0, 10), "{back:?}");
    wait_until(Duration::from_secs(30), "tools back", || async {
        Ok(listed(&alice).await.contains(&"market_data_get_quote".to_owned()))
    })
    .await
    .expect("the tools are listed again");

    // A stopping replica withdraws its entry (once its watches stopped, as `serve` does).
    let upstreams = gw.upstreams.clone();
    drop(gw);
    upstreams.withdraw_all().await;
    let status = api.get("market-data").await.expect("get").status.unwrap_or_default();
    assert!(status.connections.iter().all(|c| c.replica != REPLICA), "{status:?}");
}

/// The SSE events of a streamed answer, one `data` field at a time.
struct Events {
    response: reqwest::Response,
    buffer: String,
}

impl Events {
    /// The next event's data, parsed (at most 30 s away).
    async fn next(&mut self) -> Value {
        tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                if let Some(end) = self.buffer.find("\n\n") {
                    let event: String = self.buffer.drain(..end + 2).collect();
                    let data: Vec<&str> =
                        event.lines().filter_map(|l| l.strip_prefix("data:")).map(str::trim).collect();
                    if !data.is_empty() && !data.concat().is_empty() {
                        return serde_json::from_str(&data.concat()).expect("an event's data is JSON");
                    }
                    continue;
                }
                let chunk = self.response.chunk().await.expect("the stream reads").expect("the stream goes on");
                self.buffer.push_str(std::str::from_utf8(&chunk).expect("UTF-8"));
            }
        })
        .await
        .expect("an event within 30 s")
    }
}

/// A POST of `body` to `url` as `user`, as a 2025-11-25 client sends it.
async fn post(url: &str, user: User, body: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(url)
        .bearer_auth(TestEnv::get().token(user))
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .json(body)
        .send()
        .await
        .expect("the gateway answers")
}

/// A request an upstream server sends its caller during a call (an elicitation here) is asked
/// on the caller's stream at one replica, and the caller's answer, posted to another replica,
/// reaches the call through the shared store. Only the caller asked can answer: another user's
/// answer to the same id is never taken, and the stored answer is deleted once read.
#[tokio::test]
async fn a_server_asks_the_caller_at_one_replica_and_the_answer_comes_through_another() {
    let (_upstream, a, b) = fixtures_at_two_replicas("gwask", Options::default()).await;

    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": "fixtures_test_elicitation", "arguments": {"message": "Who are you?"}}});
    let response = post(&a.mcp_url(), User::Alice, &call).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut events = Events { response, buffer: String::new() };
    let asked = events.next().await;
    assert_eq!(asked["method"], "elicitation/create", "{asked}");
    assert_eq!(asked["params"]["message"], "Who are you?", "{asked}");
    assert_eq!(asked["params"]["requestedSchema"]["required"], json!(["username", "email"]), "{asked}");
    let id = asked["id"].clone();
    assert!(id.as_str().is_some_and(|id| id.starts_with("toolyard-ask-")), "{asked}");

    let answer = |name: &str| {
        json!({"jsonrpc": "2.0", "id": id, "result": {"action": "accept",
            "content": {"username": name, "email": format!("{name}@example.com")}}})
    };
    // bob answers alice's request first, through replica b: stored for bob, never read.
    assert_eq!(post(&b.mcp_url(), User::Bob, &answer("bob")).await.status(), 202);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(post(&b.mcp_url(), User::Alice, &answer("alice")).await.status(), 202);
    let answered = events.next().await;
    assert_eq!(answered["id"], 7, "{answered}");
    let text = answered["result"]["content"][0]["text"].as_str().unwrap_or_default().to_owned();
    assert!(text.contains("action=accept") && text.contains("'username': 'alice'"), "{answered}");
    assert!(!text.contains("bob"), "{answered}");

    let path = format!("asks/{}/answer.json", id.as_str().expect("a string id"));
    let stored = |user: &str| {
        let owner = toolyard_api::OwnerKey::derive("kubernetes", user);
        let (store, path) = (a.store.clone(), path.clone());
        async move { store.get(&owner, &path).await.expect("reading").is_some() }
    };
    assert!(!stored("alice").await, "alice's answer is deleted once read");
    assert!(stored("bob").await, "bob's answer stays in bob's own storage until retention");
}

/// A 2026-07-28 caller gets an upstream server's request as an `input_required` result at
/// one replica, and its retry, with the answer, reaches the held call through another replica
/// and the shared store. Another user's retry with the same request state is refused at once,
/// and nothing of the held call stays stored once it ended.
#[tokio::test]
async fn a_2026_callers_retry_reaches_the_call_held_at_another_replica() {
    let (_upstream, a, b) = fixtures_at_two_replicas("gwround", Options::default()).await;
    /// A 2026-07-28 client of `user` at `gw` that can be asked to elicit.
    async fn modern(gw: &Gateway, user: User) -> rmcp::service::RunningService<rmcp::RoleClient, ClientConfig> {
        let mut capabilities = rmcp::model::ClientCapabilities::default();
        capabilities.elicitation = Some(Default::default());
        let config = ClientConfig::new(capabilities, rmcp::model::Implementation::new("rounds-test", "1"));
        let mode = ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] };
        gw.client_with(&gw.mcp_url(), user, mode, config).await
    }
    let call = || {
        CallToolRequestParams::new("fixtures_test_elicitation")
            .with_arguments(json!({"message": "Who are you?"}).as_object().expect("object").clone())
    };

    let first = modern(&a, User::Alice).await.call_tool_once(call()).await.expect("first round");
    let CallToolResponse::InputRequired(asked) = first else { panic!("input required: {first:?}") };
    let (key, request) = asked.input_requests.as_ref().and_then(|r| r.iter().next()).expect("a request");
    let request = serde_json::to_value(request).expect("request");
    assert_eq!(request["method"], "elicitation/create", "{request}");
    assert_eq!(request["params"]["message"], "Who are you?", "{request}");
    let state = asked.request_state.clone().expect("a request state");
    let round = format!("toolyard-round-{}", state.split('.').next().expect("held id"));
    let held = format!("asks/{round}/held.json");
    let retry = |name: &str| {
        let answer = json!({"action": "accept", "content": {"username": name, "email": format!("{name}@example.com")}});
        call().with_input_responses([(key.clone(), answer)].into()).with_request_state(state.clone())
    };

    // bob's retry names no call of his: refused at once, his answer passed on nowhere.
    let refused = modern(&b, User::Bob).await.call_tool_once(retry("bob")).await.expect_err("bob's retry");
    assert!(refused.to_string().contains("requestState names no call of yours"), "{refused}");

    let done = modern(&b, User::Alice).await.call_tool_once(retry("alice")).await.expect("retry");
    let CallToolResponse::Complete(result) = done else { panic!("complete: {done:?}") };
    let text =
        serde_json::to_value(&result.content).expect("content")[0]["text"].as_str().unwrap_or_default().to_owned();
    assert!(text.contains("action=accept") && text.contains("'username': 'alice'"), "{result:?}");

    let alice = toolyard_api::OwnerKey::derive("kubernetes", "alice");
    // Only this call's files: the other tests' held calls of alice may be in flight.
    let mut stored = a.store.list(&alice, "asks/").await.expect("listing");
    stored.retain(|o| o.path.starts_with(&format!("asks/{round}")));
    assert!(stored.is_empty(), "nothing of the held call stays: {stored:?}");
    assert!(a.store.get(&alice, &held).await.expect("reading").is_none());
}

/// A 2026-07-28 client that can be asked to elicit, keeping the log messages it hears.
#[derive(Clone, Default)]
struct Eliciting {
    logs: std::sync::Arc<std::sync::Mutex<Vec<Value>>>,
}

impl rmcp::ClientHandler for Eliciting {
    fn get_info(&self) -> ClientConfig {
        let mut capabilities = rmcp::model::ClientCapabilities::default();
        capabilities.elicitation = Some(Default::default());
        ClientConfig::new(capabilities, rmcp::model::Implementation::new("rounds-test", "1"))
    }

    #[allow(deprecated)]
    async fn on_logging_message(
        &self,
        params: rmcp::model::LoggingMessageNotificationParam,
        _context: rmcp::service::NotificationContext<rmcp::RoleClient>,
    ) {
        self.logs.lock().unwrap_or_else(|e| e.into_inner()).push(params.data);
    }
}

impl Eliciting {
    async fn connect(&self, gw: &Gateway) -> rmcp::service::RunningService<rmcp::RoleClient, Eliciting> {
        use rmcp::ClientServiceExt;
        let config =
            rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(gw.mcp_url())
                .auth_header(TestEnv::get().token(User::Alice).to_owned());
        let transport = rmcp::transport::StreamableHttpClientTransport::from_config(config);
        let mode = ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] };
        self.clone().serve_with_lifecycle(transport, mode).await.expect("client connects")
    }

    /// Whether `message` was heard (within 10 s: rmcp hands each log message to the handler on
    /// a task of its own, so it may follow the answer).
    async fn heard(&self, message: &str) -> bool {
        for _ in 0..100 {
            if self.logs.lock().unwrap_or_else(|e| e.into_inner()).contains(&json!(message)) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }
}

/// A held call's log message sent while no round is answered on its replica is kept, and the
/// next round sends it before its answer, even from another replica.
#[tokio::test]
async fn a_held_calls_log_message_reaches_the_round_another_replica_answers() {
    let markers = TempDir::new("gwheld-markers");
    let start = |port: u16| UpstreamServer::start(port, markers.path());
    let (_upstream, a, b) = at_two_replicas("gwheld", "market", start, "market_ask_flood", Options::default()).await;
    let call = || {
        CallToolRequestParams::new("market_ask_flood")
            .with_arguments(json!({"count": 1}).as_object().expect("object").clone())
    };
    let first = Eliciting::default().connect(&a).await.call_tool_once(call()).await.expect("first round");
    let CallToolResponse::InputRequired(asked) = first else { panic!("input required: {first:?}") };
    let key = asked.input_requests.as_ref().and_then(|r| r.keys().next()).expect("a request").clone();
    let state = asked.request_state.clone().expect("a request state");
    let round = format!("asks/toolyard-round-{}", state.split('.').next().expect("held id"));

    // The server logs "asked 1" once answered, at replica a, while replica b answers the round.
    let answering = Eliciting::default();
    let retry = call()
        .with_input_responses([(key, json!({"action": "accept", "content": {}}))].into())
        .with_request_state(state);
    let done = answering.connect(&b).await.call_tool_once(retry).await.expect("retry");
    let CallToolResponse::Complete(result) = done else { panic!("complete: {done:?}") };
    let text =
        serde_json::to_value(&result.content).expect("content")[0]["text"].as_str().unwrap_or_default().to_owned();
    assert!(text.starts_with("answered 1; refused 0"), "{result:?}");
    assert!(answering.heard("asked 1").await, "the round at b hears the log message sent at a");
    let alice = toolyard_api::OwnerKey::derive("kubernetes", "alice");
    let mut stored = a.store.list(&alice, "asks/").await.expect("listing");
    stored.retain(|o| o.path.starts_with(&round));
    assert!(stored.is_empty(), "nothing of the held call stays: {stored:?}");
}

/// A 2025-era session subscribes through one replica while its GET stream is held by another:
/// the stream takes the subscription up at its next recheck and hears the server's update.
/// A recheck with nothing changed reads one small file (the subscriptions' version) and lists
/// nothing.
#[tokio::test]
async fn a_session_subscription_made_at_one_replica_reaches_its_stream_at_another() {
    let store = Arc::new(CountingStore::new(gateway_support::s3_store().await));
    let options = Options { store: Some(store.clone()), ..Options::default() };
    let (_upstream, a, b) = fixtures_at_two_replicas("gwsub", options).await;
    let session = LegacySession::open(&a.mcp_url(), TestEnv::get().token(User::Alice)).await;
    let id = session.id.split('.').next().expect("session id");
    store.watch(format!("sessions/{id}/subscriptions/"), format!("sessions/{id}/version"));
    let mut stream = session.at(&b.mcp_url()).stream().await;

    // Nothing changed: each recheck reads the version and lists nothing.
    let opened = store.counts();
    tokio::time::sleep(SUBSCRIPTIONS_RECHECK * 2 + Duration::from_secs(1)).await;
    let (lists, reads) = store.counts();
    assert_eq!(lists, opened.0, "no listing while nothing changed");
    assert!(reads >= opened.1 + 2, "a read of the version at each recheck: {reads} after {opened:?}");

    let uri = "test://watched-resource";
    let subscribe = json!({"jsonrpc": "2.0", "id": 2, "method": "resources/subscribe", "params": {"uri": uri}});
    let subscribed = session.post(subscribe).await;
    assert_eq!(subscribed["result"], json!({}), "{subscribed}");
    let update = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "fixtures_update_watched_resource", "arguments": {}}});
    // Replica b subscribes upstream at its next recheck; until then the updates reach nobody.
    // (The fixture tells the update to the connection that called the tool: b's.)
    let at_b = session.at(&b.mcp_url());
    let heard = tokio::time::timeout(SUBSCRIPTIONS_RECHECK * 3, async {
        loop {
            let answered = at_b.post(update.clone()).await;
            assert_eq!(answered["result"]["isError"], false, "{answered}");
            if let Ok(heard) =
                tokio::time::timeout(Duration::from_secs(2), stream.until("notifications/resources/updated")).await
            {
                return heard;
            }
        }
    })
    .await
    .expect("the stream at b hears the update of the subscription made at a");
    assert_eq!(heard["params"]["uri"], uri, "{heard}");
    assert!(store.counts().0 > lists, "the moved version made the stream list the subscriptions");
}

/// The conformance fixture server as the McpServer `fixtures` (callable by alice and bob) in a
/// new namespace named from `prefix`, served by two gateway replicas that both list its tools.
async fn fixtures_at_two_replicas(prefix: &str, b: Options) -> (ServerProcess, Gateway, Gateway) {
    let start = |port: u16| {
        UpstreamServer::start_script("tests/fixtures/python/conformance_server.py", port, &[port.to_string()])
    };
    at_two_replicas(prefix, "fixtures", start, "fixtures_test_elicitation", b).await
}

/// The fixture server `start` starts, as the McpServer `name` (callable by alice and bob) in a
/// new namespace named from `prefix`, served by two gateway replicas that both list its tool
/// `tool`.
async fn at_two_replicas(
    prefix: &str,
    name: &str,
    start: impl FnOnce(u16) -> ServerProcess,
    tool: &str,
    b: Options,
) -> (ServerProcess, Gateway, Gateway) {
    let env = TestEnv::get();
    env.install_crds().await.expect("CRDs");
    let ns = env.namespace(prefix).await.expect("namespace");
    grant_platform(&ns).await;
    apply_role(
        &ns,
        "fixture-callers",
        vec![named_rule(&["toolyard.dev"], &["mcpservers"], &["call"], &[name])],
        vec![user_subject("alice"), user_subject("bob")],
    )
    .await;
    gateway_support::wait_allowed("alice", &[], &ns, "toolyard.dev", "mcpservers", "call", Some(name)).await;
    let port = free_port();
    let upstream = start(port);
    create_server(&ns, name, port, false).await;
    let a = Gateway::start(std::slice::from_ref(&ns), Options::default()).await;
    let b = Gateway::start(std::slice::from_ref(&ns), b).await;
    for gw in [&a, &b] {
        wait_until(Duration::from_secs(60), "the fixture tools listed", || async {
            Ok(listed(&gw.client(User::Alice).await).await.contains(&tool.to_owned()))
        })
        .await
        .expect("served");
    }
    (upstream, a, b)
}

//! Shared pieces of the gateway tests: the gateway assembled as `serve` assembles it (kube
//! catalog, kube executor, S3 store, TokenReview authentication, SubjectAccessReview
//! authorization, the internal API) on 127.0.0.1 ports, running as the `toolyard-gateway`
//! user with exactly the RBAC it needs; McpTools made Ready as the controller would; and a
//! stand-in for the controller and runner that completes ToolCalls exactly as they will
//! (input read and result written through the real internal API with a call token, then
//! the `Succeeded` condition set through the status subresource as `toolyard-controller`).

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use rmcp::model::{ClientConfig, ProtocolVersion};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientLifecycleMode, ClientServiceExt, RoleClient};
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;
use toolyard_api::conditions;
use toolyard_api::protocol::{CallErrorKind, CallResult, path};
use toolyard_api::token::{Claims, RunKind, SigningKey};
use toolyard_api::{McpTool, OwnerKey, ToolCall};
use toolyard_gateway::assemble::{Assembled, Backends, assemble};
use toolyard_gateway::auth::config::AuthContext;
use toolyard_gateway::auth::{AuthArgs, AuthMetrics};
use toolyard_gateway::authz::{AuthzMetrics, SarAuthorizer, SarSettings};
use toolyard_gateway::catalog::kube::{KubeCatalog, Namespaces};
use toolyard_gateway::executor::kube::{KubeExecutor, KubeExecutorSettings, KubeResultRecorder};
use toolyard_gateway::executor::load::LoadSettings;
use toolyard_gateway::executor::pool::PoolClient;
use toolyard_gateway::internal::InternalLimits;
use toolyard_gateway::metrics::Metrics;
use toolyard_gateway::model::{ModelMetrics, ModelProfile, ModelProfiles, ModelProxy, ProxySettings};
use toolyard_gateway::server::{self, Drain, Listener, ServerSettings, ShutdownTokens};
use toolyard_gateway::state::{AppState, Settings};
use toolyard_gateway::store::s3::S3Store;
use toolyard_gateway::store::{ArtifactStore, Chunk, ObjectInfo};
use toolyard_gateway::tasks::kube::KubeTasks;
use toolyard_gateway::upstream::kube::{KubeDialer, StatusPatcher};
use toolyard_gateway::upstream::{UpstreamArgs, Upstreams};
use toolyard_tests::{TestEnv, User, wait_until};

/// A fixed runner token key for the tests.
pub fn signing_key() -> SigningKey {
    SigningKey::new(b"toolyard-gateway-tests-signing-key-0123456789".to_vec()).expect("key")
}

/// The S3 store of the test cluster, through the gateway's own S3 implementation.
pub async fn s3_store() -> Arc<dyn ArtifactStore> {
    let s3 = TestEnv::get().s3();
    let settings = toolyard_gateway::store::s3::S3Settings {
        endpoint: Some(s3.endpoint.clone()),
        region: s3.region.clone(),
        bucket: s3.bucket.clone(),
        path_style: true,
        access_key: Some(s3.access_key.clone()),
        secret_key: Some(s3.secret_key.clone()),
        ..Default::default()
    };
    Arc::new(S3Store::new(&settings).await.expect("s3 store"))
}

pub fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(groups.iter().map(|s| (*s).to_owned()).collect()),
        resources: Some(resources.iter().map(|s| (*s).to_owned()).collect()),
        verbs: verbs.iter().map(|s| (*s).to_owned()).collect(),
        ..Default::default()
    }
}

/// [`rule`] for the objects `names` only.
pub fn named_rule(groups: &[&str], resources: &[&str], verbs: &[&str], names: &[&str]) -> PolicyRule {
    PolicyRule {
        resource_names: Some(names.iter().map(|s| (*s).to_owned()).collect()),
        ..rule(groups, resources, verbs)
    }
}

pub fn user_subject(name: &str) -> Subject {
    Subject {
        kind: "User".into(),
        name: name.into(),
        api_group: Some("rbac.authorization.k8s.io".into()),
        namespace: None,
    }
}

/// Applies (server-side, as admin) a Role and its RoleBinding to `subjects`.
pub async fn apply_role(ns: &str, name: &str, rules: Vec<PolicyRule>, subjects: Vec<Subject>) {
    let client = TestEnv::get().client(User::Admin).await;
    let pp = PatchParams::apply("toolyard-gateway-tests").force();
    let role = Role {
        metadata: ObjectMeta { name: Some(name.into()), namespace: Some(ns.into()), ..Default::default() },
        rules: Some(rules),
    };
    Api::<Role>::namespaced(client.clone(), ns).patch(name, &pp, &Patch::Apply(&role)).await.expect("role");
    let binding = RoleBinding {
        metadata: ObjectMeta { name: Some(name.into()), namespace: Some(ns.into()), ..Default::default() },
        role_ref: RoleRef { api_group: "rbac.authorization.k8s.io".into(), kind: "Role".into(), name: name.into() },
        subjects: Some(subjects),
    };
    Api::<RoleBinding>::namespaced(client, ns).patch(name, &pp, &Patch::Apply(&binding)).await.expect("binding");
}

/// Applies (as admin) a ClusterRole and a ClusterRoleBinding to `subjects`.
pub async fn apply_cluster_role(name: &str, rules: Vec<PolicyRule>, subjects: Vec<Subject>) {
    let client = TestEnv::get().client(User::Admin).await;
    let pp = PatchParams::apply("toolyard-gateway-tests").force();
    let role = ClusterRole {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        rules: Some(rules),
        ..Default::default()
    };
    Api::<ClusterRole>::all(client.clone()).patch(name, &pp, &Patch::Apply(&role)).await.expect("cluster role");
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: name.into(),
        },
        subjects: Some(subjects),
    };
    Api::<ClusterRoleBinding>::all(client).patch(name, &pp, &Patch::Apply(&binding)).await.expect("cluster binding");
}

/// Asks the apiserver (as admin) whether `user` may `verb` `resource` in `ns`.
pub async fn allowed(
    user: &str,
    groups: &[&str],
    ns: &str,
    group: &str,
    resource: &str,
    verb: &str,
    name: Option<&str>,
) -> bool {
    let client = TestEnv::get().client(User::Admin).await;
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.into()),
            groups: Some(groups.iter().map(|g| (*g).to_owned()).collect()),
            resource_attributes: Some(ResourceAttributes {
                group: Some(group.into()),
                resource: Some(resource.into()),
                verb: Some(verb.into()),
                namespace: (!ns.is_empty()).then(|| ns.to_owned()),
                name: name.map(str::to_owned),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SubjectAccessReview>::all(client).create(&PostParams::default(), &review).await.expect("sar");
    answer.status.is_some_and(|s| s.allowed)
}

/// Waits until RBAC gives `user` the permission (bindings take a moment to apply).
pub async fn wait_allowed(
    user: &str,
    groups: &[&str],
    ns: &str,
    group: &str,
    resource: &str,
    verb: &str,
    name: Option<&str>,
) {
    let what = format!("{user} may {verb} {resource} {name:?} in {ns:?}");
    wait_until(Duration::from_secs(30), &what, || async {
        Ok(allowed(user, groups, ns, group, resource, verb, name).await)
    })
    .await
    .expect("RBAC propagation");
}

/// The gateway's and the controller's permissions in `ns`, exactly what they need.
pub async fn grant_platform(ns: &str) {
    apply_cluster_role(
        "toolyard-test-gateway-reviews",
        vec![
            rule(&["authorization.k8s.io"], &["subjectaccessreviews"], &["create"]),
            rule(&["authentication.k8s.io"], &["tokenreviews"], &["create"]),
        ],
        vec![user_subject(User::Gateway.name())],
    )
    .await;
    apply_role(
        ns,
        "toolyard-gateway",
        vec![
            rule(&["toolyard.dev"], &["mcptools", "mcpservers", "mcpprompts"], &["get", "list", "watch"]),
            rule(&["toolyard.dev"], &["mcpservers/status"], &["patch"]),
            named_rule(&[""], &["secrets"], &["get"], &[UPSTREAM_SECRET]),
            rule(&["toolyard.dev"], &["toolcalls"], &["create", "get", "list", "watch", "patch", "delete"]),
            rule(&["toolyard.dev"], &["toolcalls/status"], &["patch"]),
            rule(&["toolyard.dev"], &["codingtasks"], &["create", "get", "list", "watch", "patch", "delete"]),
            rule(&["toolyard.dev"], &["codingtasks/status"], &["patch"]),
            // Each replica's warm-pool calls in flight (executor::load).
            rule(&["coordination.k8s.io"], &["leases"], &["create", "get", "list", "watch", "patch", "delete"]),
            // The warm pools' pods (executor::pool_pods).
            rule(&["discovery.k8s.io"], &["endpointslices"], &["get", "list", "watch"]),
        ],
        vec![user_subject(User::Gateway.name())],
    )
    .await;
    apply_role(
        ns,
        "toolyard-controller",
        vec![
            rule(&["toolyard.dev"], &["toolcalls", "mcptools"], &["get", "list", "watch"]),
            rule(&["toolyard.dev"], &["toolcalls/status", "mcptools/status"], &["get", "patch", "update"]),
        ],
        vec![user_subject(User::Controller.name())],
    )
    .await;
    let gw = User::Gateway.name();
    wait_allowed(gw, &[], "", "authorization.k8s.io", "subjectaccessreviews", "create", None).await;
    wait_allowed(gw, &[], "", "authentication.k8s.io", "tokenreviews", "create", None).await;
    wait_allowed(gw, &[], ns, "toolyard.dev", "toolcalls", "create", None).await;
    wait_allowed(gw, &[], ns, "toolyard.dev", "mcptools", "watch", None).await;
    wait_allowed(gw, &[], ns, "toolyard.dev", "codingtasks", "watch", None).await;
    wait_allowed(gw, &[], ns, "coordination.k8s.io", "leases", "watch", None).await;
    wait_allowed(User::Controller.name(), &[], ns, "toolyard.dev", "toolcalls", "watch", None).await;
    wait_allowed(User::Controller.name(), &[], ns, "toolyard.dev", "mcptools", "get", None).await;
}

/// Lets `users` and `groups` call the McpTools named (all in `ns` when `names` is empty).
pub async fn grant_call(ns: &str, binding: &str, names: &[&str], users: &[&str], groups: &[&str]) {
    let mut r = rule(&["toolyard.dev"], &["mcptools"], &["call"]);
    if !names.is_empty() {
        r.resource_names = Some(names.iter().map(|n| (*n).to_owned()).collect());
    }
    let mut subjects: Vec<Subject> = users.iter().map(|u| user_subject(u)).collect();
    subjects.extend(groups.iter().map(|g| Subject {
        kind: "Group".into(),
        name: (*g).into(),
        api_group: Some("rbac.authorization.k8s.io".into()),
        namespace: None,
    }));
    apply_role(ns, binding, vec![r], subjects).await;
}

/// An McpTool spec with one required number `x` (and optional string `label`).
pub fn spec(tool: &str, timeout_seconds: i32) -> Value {
    json!({
        "name": tool,
        "title": format!("Tool {tool}"),
        "description": format!("Test tool {tool}"),
        "inputSchema": {
            "type": "object",
            "properties": {"x": {"type": "number"}, "label": {"type": "string"}},
            "required": ["x"],
            "additionalProperties": false
        },
        "outputSchema": {"type": "object"},
        "annotations": {"readOnlyHint": true, "openWorldHint": false},
        "runtime": {"image": "registry.example/tool:1", "command": ["run"]},
        "execution": {"mode": "Job", "timeoutSeconds": timeout_seconds}
    })
}

/// Creates an McpTool (as admin) and sets its `Ready` condition as the controller would.
pub async fn create_tool(ns: &str, object_name: &str, spec: Value, ready: bool) -> McpTool {
    let env = TestEnv::get();
    let admin: Api<McpTool> = Api::namespaced(env.client(User::Admin).await, ns);
    let obj: McpTool = serde_json::from_value(json!({
        "apiVersion": "toolyard.dev/v1alpha1", "kind": "McpTool",
        "metadata": {"name": object_name, "namespace": ns},
        "spec": spec,
    }))
    .expect("McpTool");
    let created = admin.create(&PostParams::default(), &obj).await.expect("create McpTool");
    set_tool_status(ns, object_name, ready, None).await;
    created
}

/// Sets an McpTool's `Ready` condition (and pool endpoint) as `toolyard-controller`.
pub async fn set_tool_status(ns: &str, object_name: &str, ready: bool, endpoint: Option<&str>) {
    let env = TestEnv::get();
    let api: Api<McpTool> = Api::namespaced(env.client(User::Controller).await, ns);
    let current = api.get(object_name).await.expect("get McpTool");
    let status = if ready { conditions::status::TRUE } else { conditions::status::FALSE };
    let reason = if ready { conditions::reason::VALID } else { conditions::reason::INVALID_SPEC };
    let cond = conditions::ready(status, reason, "set by the test", current.metadata.generation);
    let patch = json!({
        "apiVersion": "toolyard.dev/v1alpha1", "kind": "McpTool",
        "status": {"conditions": [cond], "observedGeneration": current.metadata.generation, "endpoint": endpoint}
    });
    api.patch_status(object_name, &PatchParams::apply(toolyard_api::CONTROLLER_MANAGER).force(), &Patch::Apply(&patch))
        .await
        .expect("McpTool status");
}

/// Deletes an McpTool.
pub async fn delete_tool(ns: &str, object_name: &str) {
    let api: Api<McpTool> = Api::namespaced(TestEnv::get().client(User::Admin).await, ns);
    api.delete(object_name, &DeleteParams::default()).await.expect("delete McpTool");
}

/// Waits (30 s at most) until replica `gw` counts `n` calls of `owner` running on other
/// replicas (`what` names the wait).
pub async fn wait_running_elsewhere(
    gw: &Gateway,
    owner: &toolyard_api::OwnerKey,
    n: usize,
    what: &str,
) -> anyhow::Result<()> {
    let executor = gw.state.executor.clone();
    toolyard_tests::wait_until(Duration::from_secs(30), what, || {
        let executor = executor.clone();
        async move { Ok(executor.running_elsewhere(owner) == n) }
    })
    .await
}

/// ToolCalls in `ns` (as admin).
pub async fn toolcalls(ns: &str) -> Vec<ToolCall> {
    let api: Api<ToolCall> = Api::namespaced(TestEnv::get().client(User::Admin).await, ns);
    api.list(&ListParams::default()).await.expect("list ToolCalls").items
}

/// Authentication flags as `serve` parses them.
pub fn auth_args(flags: &[&str]) -> AuthArgs {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        auth: AuthArgs,
    }
    let argv = std::iter::once("test").chain(flags.iter().copied());
    <Cli as clap::Parser>::try_parse_from(argv).expect("auth flags").auth
}

/// The running gateway of one test.
pub struct Gateway {
    /// Namespaces served.
    pub namespaces: Vec<String>,
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    /// Internal API base URL.
    pub internal: String,
    /// The app state (metrics, limits).
    pub state: AppState,
    /// The store.
    pub store: Arc<dyn ArtifactStore>,
    /// Shutdown tokens of the server.
    pub tokens: ShutdownTokens,
    /// The server task.
    pub server: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    /// The catalog served, with its McpServer connections.
    pub upstreams: Upstreams,
    background: CancellationToken,
}

/// The replica name the test gateway writes McpServer statuses as.
pub const REPLICA: &str = "test-replica";

/// The Secret a test McpServer may take its credential from (the gateway may read it).
pub const UPSTREAM_SECRET: &str = "upstream-token";

impl Drop for Gateway {
    fn drop(&mut self) {
        self.tokens.trigger.cancel();
        self.background.cancel();
    }
}

/// Options of [`Gateway::start`].
#[derive(Clone)]
pub struct Options {
    /// Settings of the MCP layer.
    pub settings: Settings,
    /// Grace after a tool's timeout.
    pub call_grace: Duration,
    /// Shutdown grace.
    pub shutdown_grace: Duration,
    /// Caps of the internal API.
    pub internal_limits: InternalLimits,
    /// The store (default: the test S3 server's bucket, [`s3_store`]).
    pub store: Option<Arc<dyn ArtifactStore>>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            settings: Settings::default(),
            call_grace: Duration::from_secs(15),
            shutdown_grace: Duration::from_secs(30),
            internal_limits: InternalLimits::default(),
            store: None,
        }
    }
}

impl Gateway {
    /// Starts a gateway serving `namespaces` (already granted with [`grant_platform`]).
    pub async fn start(namespaces: &[String], options: Options) -> Gateway {
        let env = TestEnv::get();
        env.install_crds().await.expect("CRDs");
        let client = env.client(User::Gateway).await;
        let store = match &options.store {
            Some(store) => Arc::clone(store),
            None => s3_store().await,
        };
        let background = CancellationToken::new();
        let tokens = ShutdownTokens::default();
        let ns = Namespaces::Only(namespaces.to_vec());
        let catalog = KubeCatalog::start(client.clone(), &ns, background.clone());
        // McpServers are pinged every second and given two seconds to answer; status entries
        // are rewritten every second (others' pruned after three).
        let upstream_args =
            UpstreamArgs { upstream_ping_seconds: 1, upstream_connect_timeout_seconds: 2, upstream_status_seconds: 1 };
        let executor = KubeExecutor::start(
            client.clone(),
            store.clone(),
            &ns,
            Some(signing_key()),
            PoolClient::new(Duration::from_secs(2)).expect("pool client"),
            KubeExecutorSettings {
                grace: options.call_grace,
                recheck: Duration::from_secs(5),
                load: LoadSettings::new(&namespaces[0]),
                ..Default::default()
            },
            background.clone(),
        );
        let status = StatusPatcher::new(client.clone(), REPLICA);
        let upstreams = Upstreams::new(
            Arc::new(catalog.clone()),
            upstream_args.settings(REPLICA.into()),
            Arc::new(status.clone()),
            Arc::new(KubeDialer::new(client.clone(), signing_key())),
            toolyard_gateway::executor::Executor::records(&executor),
            background.clone(),
        )
        .expect("upstreams");
        toolyard_gateway::upstream::kube::watch(&client, &ns, upstreams.clone(), status, background.clone());
        let authorizer = SarAuthorizer::new(client.clone(), SarSettings::default(), AuthzMetrics::default());
        // The test cluster's users hold static (opaque) tokens.
        let auth_args =
            auth_args(&["--tokenreview", "--tokenreview-audience", "toolyard", "--tokenreview-opaque-tokens"]);
        let auth = auth_args
            .build(AuthContext {
                kube: Some(client.clone()),
                namespace: "toolyard".into(),
                public_url: None,
                default_scheme: "http".into(),
                allowed_hosts: Vec::new(),
                metrics: AuthMetrics::default(),
                shutdown: background.clone(),
            })
            .await
            .expect("auth");
        // Coding tasks (CodingTask objects, run by nobody here) live in the first namespace.
        let tasks = KubeTasks::start(
            client.clone(),
            &namespaces[0],
            store.clone(),
            Duration::from_secs(10),
            background.clone(),
        );
        // One profile, so tasks can be started; no agent runs here, so nothing calls it.
        let profile = ModelProfile::new("default", "http://127.0.0.1:9/v1", "none", None).expect("profile");
        let profiles = ModelProfiles::new(vec![profile], Some("default".into())).expect("profiles");
        let models =
            ModelProxy::new(Arc::new(profiles), ProxySettings::default(), ModelMetrics::new()).expect("model proxy");
        let backends = Backends {
            catalog: Arc::new(upstreams.clone()),
            executor: Arc::new(executor),
            store: store.clone(),
            authorizer: Arc::new(authorizer),
            tasks: Arc::new(tasks),
            models: Arc::new(models),
            recorder: Arc::new(KubeResultRecorder::new(client)),
            signing_key: signing_key(),
            auth: auth.state,
            public_routes: axum::Router::new(),
        };
        let metrics = Arc::new(Metrics::new());
        let Assembled { state, public, internal: internal_router } =
            assemble(backends, options.settings, options.internal_limits, metrics, &tokens);
        let public_socket = server::bind("public", "127.0.0.1:0").expect("bind");
        let internal_socket = server::bind("internal", "127.0.0.1:0").expect("bind");
        let base = format!("http://{}", public_socket.local_addr().expect("addr"));
        let internal = format!("http://{}", internal_socket.local_addr().expect("addr"));
        let listeners = vec![
            Listener { name: "public", socket: public_socket, router: public, tls: None, drain: Drain::First },
            Listener {
                name: "internal",
                socket: internal_socket,
                router: internal_router,
                tls: None,
                drain: Drain::Last,
            },
        ];
        let settings = ServerSettings { shutdown_grace: options.shutdown_grace, ..ServerSettings::default() };
        let server_tokens = tokens.clone();
        let server = tokio::spawn(async move { server::serve(listeners, &settings, server_tokens).await });
        wait_until(Duration::from_secs(30), "catalog synced", || {
            let catalog = catalog.clone();
            async move { Ok(toolyard_gateway::catalog::ToolCatalog::is_synced(&catalog)) }
        })
        .await
        .expect("catalog sync");
        Gateway {
            namespaces: namespaces.to_vec(),
            base,
            internal,
            state,
            store,
            tokens,
            server: Some(server),
            upstreams,
            background,
        }
    }

    /// The all-tools MCP endpoint.
    pub fn mcp_url(&self) -> String {
        format!("{}/mcp", self.base)
    }

    /// An rmcp client for `user` with the `initialize` handshake (protocol 2025-11-25).
    pub async fn client(&self, user: User) -> RunningService<RoleClient, ClientConfig> {
        self.client_at(&self.mcp_url(), user, ClientLifecycleMode::Initialize).await
    }

    /// An rmcp client for `user` speaking protocol 2026-07-28 (`server/discover`, stateless).
    pub async fn modern_client(&self, user: User) -> RunningService<RoleClient, ClientConfig> {
        let mode = ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] };
        self.client_at(&self.mcp_url(), user, mode).await
    }

    /// An rmcp client at `url`.
    pub async fn client_at(
        &self,
        url: &str,
        user: User,
        mode: ClientLifecycleMode,
    ) -> RunningService<RoleClient, ClientConfig> {
        self.client_with(url, user, mode, ClientConfig::default()).await
    }

    /// An rmcp client at `url` that declares `config` (its capabilities).
    pub async fn client_with(
        &self,
        url: &str,
        user: User,
        mode: ClientLifecycleMode,
        config: ClientConfig,
    ) -> RunningService<RoleClient, ClientConfig> {
        let token = TestEnv::get().token(user).to_owned();
        let transport = StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(url.to_owned()).auth_header(token),
        );
        config.serve_with_lifecycle(transport, mode).await.expect("MCP client connects")
    }

    /// Names of the tools `client` can list (all pages).
    /// The tools `client` lists, sorted, without the call built-ins (listed for anyone who may
    /// call some tool: see [`CALL_TOOLS`]).
    pub async fn listed(client: &RunningService<RoleClient, ClientConfig>) -> Vec<String> {
        let mut names: Vec<String> = client
            .list_all_tools()
            .await
            .expect("tools/list")
            .into_iter()
            .map(|t| t.name.to_string())
            .filter(|n| !CALL_TOOLS.contains(&n.as_str()))
            .collect();
        names.sort();
        names
    }
}

/// The built-ins `/mcp` lists for anyone who may call some tool there.
pub const CALL_TOOLS: [&str; 4] = ["cancel_call", "delete_call", "get_call_result", "start_call"];

/// What the stand-in runner does with calls of one tool (by McpTool object name).
#[derive(Clone, Debug)]
pub enum Behaviour {
    /// Succeed with `{"echo": <arguments>}`.
    Echo,
    /// Upload an error result with this message, then `Succeeded=False Failed`.
    ToolError(String),
    /// Upload nothing; set `Succeeded=False` with this reason and message.
    ConditionOnly(&'static str, String),
    /// Never finish the call.
    Hold,
    /// Wait for the notify, then echo.
    HoldThenEcho(Arc<Notify>),
}

/// What the stand-in saw of one call.
#[derive(Clone, Debug)]
pub struct Seen {
    /// The ToolCall as first seen.
    pub call: ToolCall,
    /// The arguments it read through the internal API.
    pub input: Value,
}

/// Completes ToolCalls in one namespace as the controller and runner will.
pub struct FakePlatform {
    behaviours: Arc<Mutex<HashMap<String, Behaviour>>>,
    /// Calls seen, in order.
    pub seen: mpsc::UnboundedReceiver<Seen>,
    stop: CancellationToken,
}

impl Drop for FakePlatform {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl FakePlatform {
    /// Starts watching ToolCalls of `ns` as the controller; `internal` is the gateway's internal API.
    pub async fn start(ns: &str, internal: &str) -> FakePlatform {
        let env = TestEnv::get();
        let client = env.client(User::Controller).await;
        let behaviours: Arc<Mutex<HashMap<String, Behaviour>>> = Arc::default();
        let (tx, seen) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        let api: Api<ToolCall> = Api::namespaced(client.clone(), ns);
        let task_behaviours = behaviours.clone();
        let internal = internal.to_owned();
        let task_stop = stop.clone();
        tokio::spawn(async move {
            let mut started: HashSet<String> = HashSet::new();
            let mut events = watcher::watcher(api.clone(), watcher::Config::default()).boxed();
            loop {
                let event = tokio::select! {
                    () = task_stop.cancelled() => return,
                    e = events.next() => e,
                };
                let Some(Ok(event)) = event else { continue };
                let calls = match event {
                    watcher::Event::Apply(tc) | watcher::Event::InitApply(tc) => vec![tc],
                    _ => vec![],
                };
                for tc in calls {
                    let name = tc.name_any();
                    let finished = tc.status.as_ref().is_some_and(|s| conditions::is_finished(&s.conditions));
                    if finished || !started.insert(name) {
                        continue;
                    }
                    let behaviour =
                        task_behaviours.lock().expect("lock").get(&tc.spec.tool).cloned().unwrap_or(Behaviour::Echo);
                    let api = api.clone();
                    let internal = internal.clone();
                    let tx = tx.clone();
                    tokio::spawn(async move { complete(api, &internal, tc, behaviour, tx).await });
                }
            }
        });
        FakePlatform { behaviours, seen, stop }
    }

    /// Sets the behaviour for calls of the McpTool `object_name`.
    pub fn set(&self, object_name: &str, behaviour: Behaviour) {
        self.behaviours.lock().expect("lock").insert(object_name.to_owned(), behaviour);
    }

    /// The next call seen (waiting at most 30 s).
    pub async fn next(&mut self) -> Seen {
        tokio::time::timeout(Duration::from_secs(30), self.seen.recv()).await.expect("a call within 30s").expect("open")
    }
}

async fn complete(
    api: Api<ToolCall>,
    internal: &str,
    tc: ToolCall,
    behaviour: Behaviour,
    tx: mpsc::UnboundedSender<Seen>,
) {
    let id = tc.name_any();
    let claims = Claims {
        kind: RunKind::Call,
        ns: tc.namespace().unwrap_or_default(),
        id: id.clone(),
        owner: tc.spec.owner.clone(),
        exp: k8s_openapi::jiff::Timestamp::now().as_second() + 600,
    };
    let token = signing_key().sign(&claims);
    let http = reqwest::Client::new();
    let input: Value = http
        .get(format!("{internal}{}", path::call_input(&id)))
        .bearer_auth(&token)
        .send()
        .await
        .expect("input request")
        .error_for_status()
        .expect("input status")
        .json()
        .await
        .expect("input json");
    let _ = tx.send(Seen { call: tc.clone(), input: input.clone() });
    let upload = |result: CallResult| {
        let http = http.clone();
        let url = format!("{internal}{}", path::call_result(&id));
        let token = token.clone();
        async move {
            http.put(url)
                .bearer_auth(token)
                .json(&result)
                .send()
                .await
                .expect("result")
                .error_for_status()
                .expect("result status");
        }
    };
    let condition = match behaviour {
        Behaviour::Hold => return,
        Behaviour::HoldThenEcho(notify) => {
            notify.notified().await;
            upload(CallResult::ok(json!({"echo": input}), 5)).await;
            conditions::succeeded("done", None)
        }
        Behaviour::Echo => {
            upload(CallResult::ok(json!({"echo": input}), 5)).await;
            conditions::succeeded("done", None)
        }
        Behaviour::ToolError(message) => {
            upload(CallResult::err(CallErrorKind::ToolError, message.clone(), Some(1), 5)).await;
            conditions::failed(conditions::reason::FAILED, format!("exit code 1: {message}"), None)
        }
        Behaviour::ConditionOnly(reason, message) => conditions::failed(reason, message, None),
    };
    let patch = json!({
        "apiVersion": "toolyard.dev/v1alpha1", "kind": "ToolCall",
        "status": {"conditions": [condition]}
    });
    api.patch_status(&id, &PatchParams::apply(toolyard_api::CONTROLLER_MANAGER).force(), &Patch::Apply(&patch))
        .await
        .expect("ToolCall status");
}

/// Labels of `obj` as a map (empty when none).
pub fn labels_of(meta: &ObjectMeta) -> BTreeMap<String, String> {
    meta.labels.clone().unwrap_or_default()
}

/// A JSON-RPC POST to `url` with `token` and `body`, returning status, headers and body text.
pub async fn post_raw(
    url: &str,
    token: Option<&str>,
    body: impl Into<reqwest::Body>,
    content_type: &str,
) -> (u16, reqwest::header::HeaderMap, String) {
    let mut request = reqwest::Client::new()
        .post(url)
        .header("content-type", content_type)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .body(body);
    if let Some(t) = token {
        request = request.bearer_auth(t);
    }
    let response = request.send().await.expect("request");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    (status, headers, response.text().await.unwrap_or_default())
}

/// A store that counts the listings of one folder and the reads of one file (both set by
/// [`CountingStore::watch`] once known), and passes everything on to the store it wraps.
pub struct CountingStore {
    inner: Arc<dyn ArtifactStore>,
    /// The folder and the file counted, once known.
    watched: Mutex<(String, String)>,
    lists: AtomicUsize,
    reads: AtomicUsize,
}

impl CountingStore {
    /// Wraps `inner`, watching nothing yet.
    pub fn new(inner: Arc<dyn ArtifactStore>) -> Self {
        Self { inner, watched: Mutex::default(), lists: AtomicUsize::new(0), reads: AtomicUsize::new(0) }
    }
    /// Counts from now on the listings of `folder` and the reads of `file`.
    pub fn watch(&self, folder: String, file: String) {
        *self.watched.lock().expect("lock") = (folder, file);
    }
    /// The listings and reads counted so far.
    pub fn counts(&self) -> (usize, usize) {
        (self.lists.load(Ordering::SeqCst), self.reads.load(Ordering::SeqCst))
    }
}

#[async_trait::async_trait]
impl ArtifactStore for CountingStore {
    async fn put(&self, owner: &OwnerKey, path: &str, bytes: Bytes) -> toolyard_gateway::Result<()> {
        self.inner.put(owner, path, bytes).await
    }
    async fn create(&self, owner: &OwnerKey, path: &str, bytes: Bytes) -> toolyard_gateway::Result<bool> {
        self.inner.create(owner, path, bytes).await
    }
    async fn get(&self, owner: &OwnerKey, path: &str) -> toolyard_gateway::Result<Option<Bytes>> {
        if self.watched.lock().expect("lock").1 == path {
            self.reads.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.get(owner, path).await
    }
    async fn get_range(
        &self,
        owner: &OwnerKey,
        path: &str,
        offset: u64,
        len: u64,
    ) -> toolyard_gateway::Result<Option<Chunk>> {
        self.inner.get_range(owner, path, offset, len).await
    }
    async fn list(&self, owner: &OwnerKey, folder: &str) -> toolyard_gateway::Result<Vec<ObjectInfo>> {
        if self.watched.lock().expect("lock").0 == folder {
            self.lists.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.list(owner, folder).await
    }
    async fn delete_folder(&self, owner: &OwnerKey, folder: &str) -> toolyard_gateway::Result<usize> {
        self.inner.delete_folder(owner, folder).await
    }
    async fn delete(&self, owner: &OwnerKey, paths: &[String]) -> toolyard_gateway::Result<()> {
        self.inner.delete(owner, paths).await
    }
    async fn expire(&self, before: jiff::Timestamp) -> toolyard_gateway::Result<usize> {
        self.inner.expire(before).await
    }
    async fn health(&self) -> toolyard_gateway::Result<()> {
        self.inner.health().await
    }
}

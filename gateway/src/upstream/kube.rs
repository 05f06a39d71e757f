//! McpServer objects on Kubernetes: a watch per served namespace feeding [`Upstreams`], how
//! each server is reached ([`KubeDialer`]: a URL with its credential from a Secret labelled for
//! it, or a `runtime` server's Service), and this replica's connection in each
//! object's `status.connections` (server-side apply, one field manager per replica, so
//! replicas never overwrite each other's entry). A replica rewrites its entries every
//! `status_interval` and removes other replicas' entries not rewritten for three times that:
//! those of a replica that was killed before it could withdraw them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use toolyard_api::conditions::{self, status};
use toolyard_api::mcpserver::{CREDENTIAL_LABEL, Connection as ConnectionStatus, InCluster, UpstreamAuth};
use toolyard_api::protocol::bridge;
use toolyard_api::token::SigningKey;
use toolyard_api::{API_VERSION, GATEWAY_MANAGER, McpServer};

use super::{Dialer, Endpoint, ServerConfig, StatusSink, Upstreams, credential_header};
use crate::catalog::kube::{Namespaces, reflect_all};

/// Limit of one status write or Secret read.
const API_TIMEOUT: Duration = Duration::from_secs(10);

/// Watches the McpServers of `namespaces` and keeps `upstreams` connected to exactly them,
/// and keeps the status entries of `status` (this replica's) fresh and the others' pruned,
/// until `shutdown` fires.
pub fn watch(
    client: &Client,
    namespaces: &Namespaces,
    upstreams: Upstreams,
    status: StatusPatcher,
    shutdown: CancellationToken,
) {
    let apis: Vec<Api<McpServer>> = namespaces.apis(client);
    let interval = upstreams.settings().status_interval;
    let stores = reflect_all(apis, "McpServers", shutdown.clone(), move |stores| upstreams.apply(configs(stores)));
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(interval) => {}
            }
            status.refresh().await;
            status.prune(&stores, interval * 3).await;
        }
    });
}

fn configs(stores: &[Store<McpServer>]) -> Vec<ServerConfig> {
    stores
        .iter()
        .flat_map(Store::state)
        .map(|server| ServerConfig {
            namespace: server.namespace().unwrap_or_default(),
            name: server.name_any(),
            generation: server.metadata.generation.unwrap_or_default(),
            spec: server.spec.clone(),
            available: server.spec.runtime.is_none() || is_ready(&server),
        })
        .collect()
}

/// The controller's `Ready` condition of a `runtime` server is True.
fn is_ready(server: &McpServer) -> bool {
    let conditions = server.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    conditions::find(conditions, conditions::READY).is_some_and(|c| c.status == status::TRUE)
}

/// The cluster's [`Dialer`]: a `url` server with the credential of its `auth` (a key of a
/// Secret in the McpServer's namespace, used only when the Secret is labelled
/// `toolyard.dev/mcp-server: <the McpServer's name>`); a `runtime` server through its Service,
/// answering its bridge's nonce with the server's key derived from the shared signing key.
#[derive(Clone)]
pub struct KubeDialer {
    client: Client,
    key: SigningKey,
}

impl KubeDialer {
    /// Reads Secrets with `client` (which may `get` them); derives bridge keys from `key`.
    pub fn new(client: Client, key: SigningKey) -> Self {
        Self { client, key }
    }
}

#[async_trait::async_trait]
impl Dialer for KubeDialer {
    async fn endpoint(&self, server: &ServerConfig) -> Result<Endpoint, String> {
        let (namespace, name) = (server.namespace.as_str(), server.name.as_str());
        match server.spec.in_cluster(name, namespace) {
            Some(InCluster::Http(url)) => return Ok(Endpoint::Http { url, credential: None }),
            Some(InCluster::Bridge(address)) => {
                let key = self.key.derive(&bridge::key_purpose(namespace, name));
                return Ok(Endpoint::Bridge { address, key });
            }
            None => {}
        }
        let url = server.spec.url.clone().ok_or("the McpServer has neither url nor runtime")?;
        let credential = match &server.spec.auth {
            Some(auth) => Some(self.header(namespace, name, auth).await?),
            None => None,
        };
        Ok(Endpoint::Http { url, credential })
    }
}

impl KubeDialer {
    async fn header(
        &self,
        namespace: &str,
        server: &str,
        auth: &UpstreamAuth,
    ) -> Result<(http::HeaderName, http::HeaderValue), String> {
        let name = &auth.secret_key_ref.name;
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let secret = match tokio::time::timeout(API_TIMEOUT, api.get_opt(name)).await {
            Ok(Ok(Some(secret))) => secret,
            Ok(Ok(None)) => return Err(format!("the Secret {name:?} (spec.auth.secretKeyRef) does not exist")),
            Ok(Err(kube::Error::Api(e))) if e.code == 403 => {
                return Err(format!(
                    "the gateway may not read the Secret {name:?}: add it to the chart's \
                     gateway.upstreamCredentialSecrets"
                ));
            }
            Ok(Err(e)) => return Err(format!("reading the Secret {name:?} failed: {e}")),
            Err(_) => return Err(format!("reading the Secret {name:?} timed out")),
        };
        if secret.labels().get(CREDENTIAL_LABEL).map(String::as_str) != Some(server) {
            return Err(format!(
                "the Secret {name:?} is not labelled {CREDENTIAL_LABEL}={server}: label it to let the gateway send \
                 it to this server"
            ));
        }
        let key = &auth.secret_key_ref.key;
        let value = secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .ok_or_else(|| format!("the Secret {name:?} has no key {key:?}"))?;
        let value =
            std::str::from_utf8(&value.0).map_err(|_| format!("the key {key:?} of the Secret {name:?} is not text"))?;
        credential_header(auth, value)
    }
}

/// Writes this replica's connection into each McpServer's `status.connections`.
#[derive(Clone)]
pub struct StatusPatcher {
    client: Client,
    replica: String,
    manager: String,
    /// The entries this replica has written, by namespace and name, to rewrite.
    reported: Arc<Mutex<BTreeMap<(String, String), ConnectionStatus>>>,
}

impl StatusPatcher {
    /// Writes as replica `replica` with `client` (which may patch `mcpservers/status`).
    pub fn new(client: Client, replica: &str) -> Self {
        let manager: String = format!("{GATEWAY_MANAGER}/{replica}").chars().take(128).collect();
        Self { client, replica: replica.to_owned(), manager, reported: Arc::default() }
    }

    /// Rewrites every entry of this replica with the current time in `updated`.
    async fn refresh(&self) {
        let entries: Vec<((String, String), ConnectionStatus)> = self
            .reported
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for ((namespace, name), mut connection) in entries {
            connection.updated = Some(Time(jiff::Timestamp::now()));
            self.apply(&namespace, &name, json!({"connections": [connection]})).await;
        }
    }

    /// Removes the entries of other replicas not rewritten within `stale` (a replica that
    /// was killed). The write names the resourceVersion read: a concurrent change wins, and
    /// the next round looks again.
    async fn prune(&self, stores: &[Store<McpServer>], stale: Duration) {
        let now = jiff::Timestamp::now();
        let is_stale = |c: &ConnectionStatus| {
            c.replica != self.replica
                && c.updated.as_ref().is_none_or(|t| now.duration_since(t.0).unsigned_abs() > stale)
        };
        for server in stores.iter().flat_map(Store::state) {
            let connections = server.status.as_ref().map(|s| s.connections.as_slice()).unwrap_or_default();
            if !connections.iter().any(is_stale) {
                continue;
            }
            let kept: Vec<&ConnectionStatus> = connections.iter().filter(|c| !is_stale(c)).collect();
            let gone: Vec<&str> = connections.iter().filter(|c| is_stale(c)).map(|c| c.replica.as_str()).collect();
            let (namespace, name) = (server.namespace().unwrap_or_default(), server.name_any());
            let patch = json!({
                "metadata": {"resourceVersion": server.resource_version()},
                "status": {"connections": kept},
            });
            let api: Api<McpServer> = Api::namespaced(self.client.clone(), &namespace);
            let params = PatchParams { field_manager: Some(self.manager.clone()), ..PatchParams::default() };
            let patch = Patch::Merge(&patch);
            match tokio::time::timeout(API_TIMEOUT, api.patch_status(&name, &params, &patch)).await {
                Ok(Ok(_)) => {
                    tracing::info!(namespace, name, replicas = ?gone, "removed the status entries of gone gateway replicas")
                }
                Ok(Err(kube::Error::Api(e))) if e.code == 404 || e.code == 409 => {}
                Ok(Err(e)) => tracing::warn!(namespace, name, error = %e, "removing stale status entries failed"),
                Err(_) => tracing::warn!(namespace, name, "removing stale status entries timed out"),
            }
        }
    }

    async fn apply(&self, namespace: &str, name: &str, status: serde_json::Value) {
        let api: Api<McpServer> = Api::namespaced(self.client.clone(), namespace);
        let patch = json!({"apiVersion": API_VERSION, "kind": "McpServer", "status": status});
        let params = PatchParams::apply(&self.manager).force();
        match tokio::time::timeout(API_TIMEOUT, api.patch_status(name, &params, &Patch::Apply(&patch))).await {
            Ok(Ok(_)) => {}
            // Deleted meanwhile: nothing to report on.
            Ok(Err(kube::Error::Api(e))) if e.code == 404 => {}
            Ok(Err(e)) => {
                tracing::warn!(server = %ObjectRef::<McpServer>::new(name).within(namespace), error = %e, "writing the McpServer status failed")
            }
            Err(_) => tracing::warn!(server = name, namespace, "writing the McpServer status timed out"),
        }
    }
}

#[async_trait::async_trait]
impl StatusSink for StatusPatcher {
    async fn report(&self, namespace: &str, name: &str, connection: &ConnectionStatus) {
        let key = (namespace.to_owned(), name.to_owned());
        self.reported.lock().unwrap_or_else(|e| e.into_inner()).insert(key, connection.clone());
        self.apply(namespace, name, json!({"connections": [connection]})).await;
    }

    async fn withdraw(&self, namespace: &str, name: &str) {
        self.reported.lock().unwrap_or_else(|e| e.into_inner()).remove(&(namespace.to_owned(), name.to_owned()));
        // Fields this manager owned and no longer applies are removed: its entry goes.
        self.apply(namespace, name, json!({})).await;
    }
}

//! `McpServer`: an MCP server whose tools the gateway serves next to its own functions.
//!
//! The server runs elsewhere (`url`, Streamable HTTP) or Toolyard runs it (`runtime`): on
//! Kubernetes the controller runs it as a Deployment with a Service named `<name>-mcp`, locally
//! the gateway starts its command. A `runtime` server speaks MCP on stdin and stdout (one
//! process per gateway connection, bridged to the network by `toolyard-runner bridge`) or,
//! with `streamableHttp`, serves Streamable HTTP itself.
//!
//! Each gateway replica holds one connection per server (Streamable HTTP), lists its tools on
//! connect and when the server says they changed, and reconnects after the delays of
//! `reconnectDelaysSeconds` (30 s, 1 min, then 5 min by default). Each replica reports its
//! own connection in `status.connections` (one entry per replica).

// `printcolumn(...)` repeats `type_ = ...` by design; the lint mistakes it for duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};

use crate::common::{SecretKeyRef, conditions_schema};
use crate::mcptool::{Placement, Runtime};

/// Label a Secret must carry, with the McpServer's name as its value, before the gateway
/// sends its key to that server: an McpServer names its Secret, the Secret names the server
/// it may go to, so writing an McpServer cannot send any other Secret of the namespace away.
pub const CREDENTIAL_LABEL: &str = "toolyard.dev/mcp-server";

/// Delays before reconnecting, in seconds, when `reconnectDelaysSeconds` is not set.
pub const DEFAULT_RECONNECT_DELAYS_SECONDS: [i32; 3] = [30, 60, 300];

/// Suffix of the Deployment, Service and key Secret of a `runtime` server (`<name>-mcp`).
pub const WORKLOAD_SUFFIX: &str = "-mcp";

/// Name of the Deployment and Service of the `runtime` server `server`.
pub fn workload_name(server: &str) -> String {
    format!("{server}{WORKLOAD_SUFFIX}")
}

/// An MCP server whose tools the gateway serves: at a URL, or run by Toolyard.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "toolyard.dev",
    version = "v1alpha1",
    kind = "McpServer",
    plural = "mcpservers",
    shortname = "mcps",
    category = "toolyard",
    namespaced,
    status = "McpServerStatus",
    derive = "PartialEq",
    doc = "An MCP server whose tools the Toolyard gateway serves next to its functions.",
    printcolumn(name = "URL", type_ = "string", json_path = ".spec.url"),
    printcolumn(name = "Image", type_ = "string", json_path = ".spec.runtime.image"),
    printcolumn(name = "Prefix", type_ = "string", json_path = ".spec.toolPrefix"),
    printcolumn(name = "Pods Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "State", type_ = "string", json_path = ".status.connections[0].state"),
    printcolumn(name = "Tools", type_ = "integer", json_path = ".status.connections[0].tools"),
    printcolumn(name = "Next Retry", type_ = "date", json_path = ".status.connections[0].nextRetry"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(name = "Last Error", type_ = "string", json_path = ".status.connections[0].lastError", priority = 1)
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.url) != has(self.runtime)").message("set exactly one of url (a server running elsewhere) and runtime (a server Toolyard runs)"),
    validation = Rule::new("has(self.runtime) || !has(self.streamableHttp)").message("streamableHttp describes how a runtime's command serves; a url is Streamable HTTP already"),
    validation = Rule::new("has(self.runtime) || (!has(self.replicas) && !has(self.placement))").message("replicas and placement are for a runtime's pods"),
    validation = Rule::new("has(self.url) || !has(self.auth)").message("auth is sent to a url; a runtime's command gets its credentials from runtime.env")
)]
pub struct McpServerSpec {
    /// Streamable HTTP endpoint of a server running elsewhere, e.g.
    /// `https://market-data.example.com/mcp`. Set exactly one of `url` and `runtime`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.startsWith('https://') || self.startsWith('http://')").message("url must start with https:// or http://"))]
    #[schemars(length(min = 8, max = 2048))]
    pub url: Option<String>,
    /// A server Toolyard runs: `command` + `args` of `image`. On Kubernetes the controller runs
    /// it as a Deployment `<name>-mcp` (pods hardened like tools': non-root, read-only root,
    /// no capabilities, no ServiceAccount token; reachable only from the gateway) with a
    /// Service of the same name; locally the gateway starts the command in the manifest's
    /// folder. Without `streamableHttp` the command speaks MCP on stdin and stdout, one
    /// process per gateway connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<Runtime>,
    /// The runtime's command serves Streamable HTTP itself, on this port and path (instead of
    /// stdio).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streamable_http: Option<ServedHttp>,
    /// Pods of a runtime's Deployment (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10))]
    pub replicas: Option<i32>,
    /// Scheduling of a runtime's pods, as for tools (the operator's admission policy applies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
    /// Put before each of its tools' names on the gateway (tool names are letters, digits and
    /// '_'; other characters of an upstream name become '_'). Default: the object's name
    /// with '-' as '_', then '_' (`market-data` serves `get_quote` as `market_data_get_quote`).
    /// Empty: its tools keep their names (a name another tool has is left out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == '' || self.matches('^[A-Za-z_][A-Za-z0-9_]*$')").message("toolPrefix must be empty or start with a letter or '_' and contain only letters, digits and '_'"))]
    #[schemars(length(max = 32))]
    pub tool_prefix: Option<String>,
    /// Toolset its tools belong to (a DNS label): they are then also served on
    /// `/toolsets/<toolset>/mcp`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')").message("toolset must be a DNS label: lowercase letters, digits and '-'"))]
    #[schemars(length(min = 1, max = 63))]
    pub toolset: Option<String>,
    /// A credential sent with every request to the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<UpstreamAuth>,
    /// Hard limit of one call, in seconds (1 to 3600).
    #[serde(default = "default_timeout")]
    #[schemars(range(min = 1, max = 3600))]
    pub timeout_seconds: i32,
    /// Waits before each reconnection attempt after the connection fails, in seconds; the
    /// last one repeats. Default: 30, 60, 300.
    #[serde(default = "default_delays")]
    #[schemars(length(min = 1, max = 10), inner(range(min = 1, max = 3600)))]
    pub reconnect_delays_seconds: Vec<i32>,
}

fn default_timeout() -> i32 {
    60
}

/// Where a runtime's command serves Streamable HTTP.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServedHttp {
    /// TCP port it listens on (all addresses in a pod; locally, loopback).
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// Path of its MCP endpoint.
    #[serde(default = "default_path")]
    #[x_kube(validation = Rule::new("self.startsWith('/') && !self.contains(' ')").message("path must start with '/' and contain no spaces"))]
    #[schemars(length(min = 1, max = 1024))]
    pub path: String,
}

fn default_path() -> String {
    "/mcp".into()
}

fn default_delays() -> Vec<i32> {
    DEFAULT_RECONNECT_DELAYS_SECONDS.to_vec()
}

impl McpServerSpec {
    /// The prefix of its tools' names: `toolPrefix`, or `name` with '-' as '_' then '_'.
    pub fn prefix(&self, name: &str) -> String {
        match &self.tool_prefix {
            Some(prefix) => prefix.clone(),
            None => format!("{}_", name.replace(['-', '.'], "_")),
        }
    }

    /// Where the gateway reaches the `runtime` server `name` of namespace `ns` in the cluster
    /// (`None` for a `url` server).
    pub fn in_cluster(&self, name: &str, ns: &str) -> Option<InCluster> {
        self.runtime.as_ref()?;
        let host = format!("{}.{ns}.svc", workload_name(name));
        Some(match &self.streamable_http {
            Some(http) => InCluster::Http(format!("http://{host}:{}{}", http.port, http.path)),
            None => InCluster::Bridge(format!("{host}:{}", crate::protocol::bridge::PORT)),
        })
    }
}

/// How the gateway reaches a `runtime` server in the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InCluster {
    /// Its command serves Streamable HTTP at this URL.
    Http(String),
    /// `toolyard-runner bridge` at this `host:port` relays to its command's stdio.
    Bridge(String),
}

/// A credential the gateway sends to an upstream server: `<header>: <scheme> <secret value>`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamAuth {
    /// The Secret key holding the credential, in the McpServer's namespace. The Secret must be
    /// labelled `toolyard.dev/mcp-server: <this McpServer's name>`.
    pub secret_key_ref: SecretKeyRef,
    /// HTTP header carrying it.
    #[serde(default = "default_header")]
    #[x_kube(validation = Rule::new("self.matches('^[A-Za-z0-9-]+$')").message("header must be a header name: letters, digits and '-'"))]
    #[schemars(length(min = 1, max = 128))]
    pub header: String,
    /// Written before the value with a space (`Bearer`); empty: the value alone.
    #[serde(default = "default_scheme")]
    #[x_kube(validation = Rule::new("self.matches('^[A-Za-z0-9-]*$')").message("scheme must be letters, digits and '-'"))]
    #[schemars(length(max = 32))]
    pub scheme: String,
}

fn default_header() -> String {
    "Authorization".into()
}

fn default_scheme() -> String {
    "Bearer".into()
}

/// Observed state of an McpServer: the controller's `Ready` condition for a `runtime` server's
/// pods, and one connection per gateway replica.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct McpServerStatus {
    /// `Ready` (a runtime server only, written by the controller): its pods are available.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
    /// Pods of a runtime server available (written by the controller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_replicas: Option<i32>,
    /// Each gateway replica's connection, written by that replica.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "connections_schema")]
    pub connections: Vec<Connection>,
}

fn connections_schema(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = <Vec<Connection>>::json_schema(generator);
    let object = schema.ensure_object();
    object.insert("x-kubernetes-list-type".into(), "map".into());
    object.insert("x-kubernetes-list-map-keys".into(), serde_json::json!(["replica"]));
    object.insert("maxItems".into(), 64.into());
    schema
}

/// One gateway replica's connection to the server.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Connection {
    /// The gateway replica (its pod name).
    pub replica: String,
    /// `Connecting`, `Connected` or `Waiting` (to reconnect).
    pub state: ConnectionState,
    /// The server's tools served (after names that collide or are invalid are left out).
    #[serde(default)]
    pub tools: i32,
    /// Why the last attempt or the connection failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When the next attempt is due (state `Waiting`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_retry: Option<Time>,
    /// Attempts failed in a row.
    #[serde(default)]
    pub failures: i32,
    /// Upstream tools left out, each with why (a name that collides with another tool).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
    /// The `metadata.generation` this state is for.
    #[serde(default)]
    pub observed_generation: i64,
    /// When this entry was last written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated: Option<Time>,
}

/// Where a connection stands.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ConnectionState {
    /// The first attempt (or one after a change of the spec) runs.
    #[default]
    Connecting,
    /// Connected; its tools are served.
    Connected,
    /// The last attempt failed; the next is due at `nextRetry`. Its tools are not served.
    Waiting,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn defaults_and_prefix() {
        let spec: McpServerSpec = serde_json::from_value(json!({"url": "http://127.0.0.1:9000/mcp"})).unwrap();
        assert_eq!(spec.in_cluster("market-data", "team"), None);
        assert_eq!(spec.timeout_seconds, 60);
        assert_eq!(spec.reconnect_delays_seconds, [30, 60, 300]);
        assert_eq!(spec.prefix("market-data"), "market_data_");
        let spec: McpServerSpec = serde_json::from_value(
            json!({"url": "https://x/mcp", "toolPrefix": "md_", "auth": {"secretKeyRef": {"name": "s", "key": "k"}}}),
        )
        .unwrap();
        assert_eq!(spec.prefix("market-data"), "md_");
        let auth = spec.auth.unwrap();
        assert_eq!((auth.header.as_str(), auth.scheme.as_str()), ("Authorization", "Bearer"));
    }

    #[test]
    fn runtime_servers_are_reached_through_their_service() {
        let runtime = json!({"image": "i", "command": ["python3", "server.py"]});
        let stdio: McpServerSpec = serde_json::from_value(json!({"runtime": runtime})).unwrap();
        assert_eq!(stdio.in_cluster("research", "team"), Some(InCluster::Bridge("research-mcp.team.svc:8080".into())));
        let http: McpServerSpec =
            serde_json::from_value(json!({"runtime": runtime, "streamableHttp": {"port": 3001}})).unwrap();
        assert_eq!(
            http.in_cluster("research", "team"),
            Some(InCluster::Http("http://research-mcp.team.svc:3001/mcp".into()))
        );
    }
}

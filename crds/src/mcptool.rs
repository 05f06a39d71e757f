//! `McpTool`: one function exposed as an MCP tool.

// `printcolumn(...)` repeats `type_ = ...` by design; the lint mistakes it for duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::common::{SecretKeyRef, conditions_schema, json_schema_object, optional_json_schema_object};

/// Names of the gateway's built-in tools; an McpTool may not take them (the McpTool schema's
/// rule on `spec.name` lists the same names; a test checks that the two agree).
pub const RESERVED_TOOL_NAMES: &[&str] = &[
    "call_tool",
    "cancel_call",
    "cancel_task",
    "delete_call",
    "delete_task",
    "get_call_result",
    "get_task_result",
    "list_artifacts",
    "list_tasks",
    "read_artifact",
    "run_coding_task",
    "start_call",
    "tool_search",
];

/// The McpTool schema's CEL rule refusing [`RESERVED_TOOL_NAMES`] for `spec.name`.
pub const RESERVED_NAME_RULE: &str = "!(self in ['call_tool', 'cancel_call', 'cancel_task', 'delete_call', 'delete_task', 'get_call_result', 'get_task_result', 'list_artifacts', 'list_tasks', 'read_artifact', 'run_coding_task', 'start_call', 'tool_search'])";

/// Longest allowed call timeout of a tool.
pub const MAX_TOOL_TIMEOUT_SECONDS: i32 = 3600;

/// One function exposed as an MCP tool: its MCP description and how to run it.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "toolyard.dev",
    version = "v1alpha1",
    kind = "McpTool",
    plural = "mcptools",
    shortname = "mcpt",
    category = "toolyard",
    namespaced,
    status = "McpToolStatus",
    derive = "PartialEq",
    doc = "A function exposed as an MCP tool on the Toolyard gateway.",
    printcolumn(name = "Tool", type_ = "string", json_path = ".spec.name"),
    printcolumn(name = "Mode", type_ = "string", json_path = ".spec.execution.mode"),
    printcolumn(name = "Toolset", type_ = "string", json_path = ".spec.toolset"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Reason", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].reason"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(name = "Image", type_ = "string", json_path = ".spec.runtime.image", priority = 1),
    printcolumn(name = "Endpoint", type_ = "string", json_path = ".status.endpoint", priority = 1)
)]
#[serde(rename_all = "camelCase")]
pub struct McpToolSpec {
    /// MCP tool name: a letter or '_' then letters, digits or '_' (it is also a Python
    /// function name in coding tasks). Unique among the tools a gateway serves.
    #[x_kube(
        validation = Rule::new("self.matches('^[A-Za-z_][A-Za-z0-9_]*$')").message("name must start with a letter or '_' and contain only letters, digits and '_'"),
        validation = Rule::new(RESERVED_NAME_RULE).message("name is reserved for a built-in tool of the gateway")
    )]
    #[schemars(length(min = 1, max = 64))]
    pub name: String,

    /// Human-readable title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub title: Option<String>,

    /// What the tool does, for the model and the user.
    #[schemars(length(min = 1, max = 8192))]
    pub description: String,

    /// JSON Schema of the arguments (`type: object`). Arguments are checked against it before
    /// anything runs.
    #[schemars(schema_with = "json_schema_object")]
    pub input_schema: Map<String, Value>,

    /// JSON Schema of the structured result (`type: object`), if declared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "optional_json_schema_object")]
    pub output_schema: Option<Map<String, Value>>,

    /// MCP behaviour hints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<ToolAnnotations>,

    /// Named group with its own endpoint `/toolsets/<toolset>/mcp`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')").message("toolset must be a DNS label: lowercase letters, digits and '-'"))]
    #[schemars(length(min = 1, max = 63))]
    pub toolset: Option<String>,

    /// What runs for a call.
    pub runtime: Runtime,

    /// How calls are executed.
    #[serde(default)]
    pub execution: Execution,
    /// Give the function the caller's identity (issuer, user, groups; `toolyard.caller()` in
    /// Python, `TOOLYARD_CALLER` for any command), for entitlements and audit. Off: the
    /// function learns nothing about who called.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub caller_identity: bool,
    /// Where the tool's pods run (Job and pool pods; ignored by the local mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
}

/// MCP tool annotations (hints for clients; not enforced).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolAnnotations {
    /// The tool does not modify its environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only_hint: Option<bool>,
    /// The tool may perform destructive updates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destructive_hint: Option<bool>,
    /// Calling twice with the same arguments has no additional effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotent_hint: Option<bool>,
    /// The tool interacts with an open world of external entities.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_world_hint: Option<bool>,
}

/// The container (or, in embedded mode, the local command) that runs a call.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Runtime {
    /// Container image of the tool. Any image works: the runner is added by an init container.
    #[x_kube(validation = Rule::new("!self.contains(' ')").message("image must not contain spaces"))]
    #[schemars(length(min = 1, max = 512))]
    pub image: String,
    /// Command of the tool; it gets the arguments as JSON on stdin.
    #[schemars(length(min = 1, max = 64), inner(length(min = 1, max = 4096)))]
    pub command: Vec<String>,
    /// Extra arguments appended to the command.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 4096)))]
    pub args: Vec<String>,
    /// Working directory of the command (defaults to the image's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub working_dir: Option<String>,
    /// Environment of the command.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[x_kube(validation = Rule::new("self.all(e, self.exists_one(f, f.name == e.name))").message("environment variable names must be unique"))]
    pub env: Vec<EnvVar>,
    /// CPU and memory of the tool container (defaults come from the controller's config).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// ServiceAccount of the pod. Its token is still not mounted unless the tool asks for it
    /// through a projected volume of its own; by default calls carry no Kubernetes credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub service_account_name: Option<String>,
    /// Read-only volumes of the tool's container: ConfigMaps, Secrets and
    /// PersistentVolumeClaims of the tool's namespace that the operator allows (the chart's
    /// admission policy). Refused by the local mode.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[x_kube(
        validation = Rule::new("self.all(v, self.exists_one(w, w.name == v.name))").message("volume names must be unique"),
        validation = Rule::new("self.all(v, self.exists_one(w, w.mountPath == v.mountPath))").message("mount paths must be unique")
    )]
    pub volumes: Vec<ToolVolume>,
}

/// The scheduling fields of a tool's pods.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// Labels the node must have (e.g. `nvidia.com/gpu.present: "true"`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Taints the pods tolerate (the admission policy allows the keys the operator lists).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub tolerations: Vec<Toleration>,
    /// Node and pod (anti-)affinity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// RuntimeClass of the pods, e.g. gVisor or Kata where the cluster has them (the admission
    /// policy allows the classes the operator lists).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub runtime_class_name: Option<String>,
}

/// A read-only volume of the tool's container, from one object of the tool's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("[has(self.configMap), has(self.secret), has(self.persistentVolumeClaim)].filter(x, x).size() == 1").message("set exactly one of configMap, secret and persistentVolumeClaim"))]
pub struct ToolVolume {
    /// Volume name (a DNS label).
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')").message("name must be a DNS label: lowercase letters, digits and '-'"))]
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// Absolute path of the mount; not `/`, `/tmp` or under `/toolyard` (Toolyard's own).
    #[x_kube(validation = Rule::new("self.startsWith('/') && self != '/' && self != '/tmp' && !self.startsWith('/tmp/') && self != '/toolyard' && !self.startsWith('/toolyard/')").message("mountPath must be absolute and not /, /tmp or under /toolyard"))]
    #[schemars(length(min = 2, max = 1024))]
    pub mount_path: String,
    /// A ConfigMap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ObjectRef>,
    /// A Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<ObjectRef>,
    /// A PersistentVolumeClaim (mounted read-only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim: Option<ObjectRef>,
}

/// An object of the tool's namespace, by name.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct ObjectRef {
    /// Its name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// One environment variable: a literal value or a key of a Secret.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.value) != has(self.secretKeyRef)").message("set exactly one of value and secretKeyRef"))]
pub struct EnvVar {
    /// Variable name.
    #[x_kube(
        validation = Rule::new("self.matches('^[A-Za-z_][A-Za-z0-9_]*$')").message("environment variable names are letters, digits and '_', not starting with a digit"),
        validation = Rule::new("!self.startsWith('TOOLYARD_') && self != 'TRACEPARENT'").message("TOOLYARD_* and TRACEPARENT are set by Toolyard")
    )]
    #[schemars(length(min = 1, max = 256))]
    pub name: String,
    /// Literal value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32768))]
    pub value: Option<String>,
    /// Value from a Secret in the tool's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_key_ref: Option<SecretKeyRef>,
}

/// How calls of a tool are executed.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.mode == 'Pool' || !has(self.pool)").message("pool settings are only allowed with mode: Pool"))]
pub struct Execution {
    /// `Job`: a Job per call (default). `Pool`: a warm Deployment of runner pods.
    #[serde(default)]
    pub mode: ExecutionMode,
    /// Hard limit of one call, in seconds (1 to 3600).
    #[serde(default = "default_timeout")]
    #[schemars(range(min = 1, max = 3600))]
    pub timeout_seconds: i32,
    /// Warm pool settings (`mode: Pool` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<Pool>,
}

fn default_timeout() -> i32 {
    60
}

impl Default for Execution {
    fn default() -> Self {
        Self { mode: ExecutionMode::Job, timeout_seconds: default_timeout(), pool: None }
    }
}

/// Execution mode.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ExecutionMode {
    /// One Kubernetes Job (or local child process) per call.
    #[default]
    Job,
    /// A warm pool of runner pods (or local worker processes).
    Pool,
}

/// Warm pool settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Pool {
    /// Number of warm pods.
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 50))]
    pub replicas: i32,
    /// Keep one worker process per slot that handles calls one after another (JSON lines),
    /// instead of a fresh process per call.
    #[serde(default)]
    pub reuse_process: bool,
    /// Calls one pod runs at once.
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 64))]
    pub concurrency: i32,
    /// Calls one pod keeps waiting for a free slot; beyond them a call is refused as busy at
    /// once. Default: 8 × `concurrency`. A waiting call's time counts toward its deadline.
    /// Waiting calls take turns by user, and a full queue makes room for a user with fewer
    /// waiting calls by refusing the newest waiting call of the user with the most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 4096))]
    pub queue: Option<i32>,
}

fn one() -> i32 {
    1
}

/// Waiting calls a pod keeps per slot when `queue` is not set.
pub const DEFAULT_QUEUE_PER_SLOT: i32 = 8;

impl Pool {
    /// Calls one pod keeps waiting: `queue`, or [`DEFAULT_QUEUE_PER_SLOT`] × `concurrency`.
    pub fn queue_length(&self) -> i32 {
        self.queue.unwrap_or(DEFAULT_QUEUE_PER_SLOT * self.concurrency.max(1)).clamp(0, 4096)
    }
}

impl Default for Pool {
    fn default() -> Self {
        Self { replicas: 1, reuse_process: false, concurrency: 1, queue: None }
    }
}

/// Observed state of an McpTool, written by the controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct McpToolStatus {
    /// `Ready`.
    #[serde(default)]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
    /// Generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Pool mode: URL of the pool Service the gateway calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Pool mode: available replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_replicas: Option<i32>,
}

impl McpTool {
    /// True when the tool's `Ready` condition is True for the current generation.
    pub fn is_ready(&self) -> bool {
        let Some(status) = &self.status else { return false };
        crate::conditions::find(&status.conditions, crate::conditions::READY).is_some_and(|c| {
            c.status == crate::conditions::status::TRUE
                && (c.observed_generation.is_none() || c.observed_generation == self.metadata.generation)
        })
    }
}

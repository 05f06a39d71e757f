//! `ToolCall`: one call of one McpTool, created by the gateway.

// `printcolumn(...)` repeats `type_ = ...` by design; the lint mistakes it for duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{Owner, conditions_schema};

/// One call of one McpTool. Arguments and results live in storage, never in the object.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "toolyard.dev",
    version = "v1alpha1",
    kind = "ToolCall",
    plural = "toolcalls",
    shortname = "tc",
    category = "toolyard",
    namespaced,
    status = "ToolCallStatus",
    derive = "PartialEq",
    doc = "One call of an McpTool, executed as a Job or by a warm pool.",
    printcolumn(name = "Tool", type_ = "string", json_path = ".spec.tool"),
    printcolumn(
        name = "Succeeded",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Succeeded\")].status"
    ),
    printcolumn(name = "Reason", type_ = "string", json_path = ".status.conditions[?(@.type==\"Succeeded\")].reason"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(name = "Owner", type_ = "string", json_path = ".spec.owner.user", priority = 1),
    printcolumn(name = "Job", type_ = "string", json_path = ".status.jobName", priority = 1),
    printcolumn(name = "Task", type_ = "string", json_path = ".spec.parentTask", priority = 1)
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(oldSelf.cancelRequested) || !oldSelf.cancelRequested || (has(self.cancelRequested) && self.cancelRequested)").message("cancelRequested cannot be reverted"))]
pub struct ToolCallSpec {
    /// Name of the McpTool object (in this namespace).
    #[x_kube(validation = Rule::new("self == oldSelf").message("tool is immutable"))]
    #[schemars(length(min = 1, max = 253))]
    pub tool: String,

    /// Identity the call runs as (set by the gateway from the authenticated caller).
    #[x_kube(validation = Rule::new("self == oldSelf").message("owner is immutable"))]
    pub owner: Owner,

    /// Where the arguments are stored and how large they are.
    #[x_kube(validation = Rule::new("self == oldSelf").message("input is immutable"))]
    pub input: InputRef,

    /// CodingTask that made this call, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("parentTask is immutable"))]
    #[schemars(length(min = 1, max = 63))]
    pub parent_task: Option<String>,

    /// Hard limit of the call in seconds, counted from the object's creation.
    #[x_kube(validation = Rule::new("self == oldSelf").message("timeoutSeconds is immutable"))]
    #[schemars(range(min = 1, max = 3600))]
    pub timeout_seconds: i32,

    /// Set by the gateway when the client cancels or goes away; the Job is then deleted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cancel_requested: bool,
}

/// Where a call's input is stored.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InputRef {
    /// Storage key of `input.json` (under the owner's prefix).
    #[schemars(length(min = 1, max = 1024))]
    pub key: String,
    /// Size of the input in bytes.
    #[schemars(range(min = 0, max = 16_777_216))]
    pub size_bytes: i64,
}

/// Observed state of a ToolCall.
///
/// Writers: the controller writes `conditions`, `jobName`, `startTime` and `completionTime`
/// (field manager `toolyard-controller`); the gateway writes `result` when the runner
/// uploads it (field manager `toolyard-gateway`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolCallStatus {
    /// `Succeeded`.
    #[serde(default)]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
    /// Name of the Job running the call (Job mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_name: Option<String>,
    /// When the tool process started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the call finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// Summary of the stored result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<ResultSummary>,
}

/// A small summary of a stored result.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResultSummary {
    /// Storage key of `result.json`.
    #[schemars(length(max = 1024))]
    pub key: String,
    /// The tool reported an error.
    pub is_error: bool,
    /// Short error message (the tool's own), when `isError`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048))]
    pub message: Option<String>,
    /// Exit code of the tool command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
}

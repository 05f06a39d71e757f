//! `CodingTask`: one run of the code agent.

// `printcolumn(...)` repeats `type_ = ...` by design; the lint mistakes it for duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::common::{Owner, SecretKeyRef, conditions_schema, free_form_object};

/// One coding-agent run: a prompt, the tools it may use, model settings and budgets.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "toolyard.dev",
    version = "v1alpha1",
    kind = "CodingTask",
    plural = "codingtasks",
    shortname = "ct",
    category = "toolyard",
    namespaced,
    status = "CodingTaskStatus",
    derive = "PartialEq",
    doc = "A coding-agent run that writes Python composing registered tools.",
    printcolumn(name = "Type", type_ = "string", json_path = ".status.taskType"),
    printcolumn(
        name = "Succeeded",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Succeeded\")].status"
    ),
    printcolumn(name = "Reason", type_ = "string", json_path = ".status.conditions[?(@.type==\"Succeeded\")].reason"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(name = "Owner", type_ = "string", json_path = ".spec.owner.user", priority = 1),
    printcolumn(name = "Steps", type_ = "integer", json_path = ".status.steps", priority = 1),
    printcolumn(name = "Summary", type_ = "string", json_path = ".status.summary", priority = 1)
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(oldSelf.cancelRequested) || !oldSelf.cancelRequested || (has(self.cancelRequested) && self.cancelRequested)").message("cancelRequested cannot be reverted"))]
pub struct CodingTaskSpec {
    /// What the user asked for.
    #[x_kube(validation = Rule::new("self == oldSelf").message("prompt is immutable"))]
    #[schemars(length(min = 1, max = 65536))]
    pub prompt: String,

    /// Identity the task (and every tool call it makes) runs as.
    #[x_kube(validation = Rule::new("self == oldSelf").message("owner is immutable"))]
    pub owner: Owner,

    /// Tools the agent may use (always further limited by what the owner may call).
    #[serde(default)]
    #[x_kube(validation = Rule::new("self == oldSelf").message("tools is immutable"))]
    pub tools: ToolSelection,

    /// The model profile; unset: the gateway's default profile.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self == oldSelf").message("model is immutable"))]
    pub model: ModelChoice,

    /// Limits of the run.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self == oldSelf").message("budgets are immutable"))]
    pub budgets: Budgets,

    /// Set when the owner cancels the task; the Job is then deleted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cancel_requested: bool,
}

/// Which tools a task may use.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!(has(self.names) && size(self.names) > 0 && has(self.toolset))").message("set tools.names or tools.toolset, not both"))]
pub struct ToolSelection {
    /// Tool names (MCP names). Empty with no toolset: every tool the owner may call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256), inner(length(min = 1, max = 64)))]
    pub names: Vec<String>,
    /// A toolset name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub toolset: Option<String>,
}

/// Which model a task uses: the name of a model profile the operator configured on the
/// gateway (endpoint, model id and key). A task never names an endpoint or a key: the agent
/// reaches the model only through the gateway, which adds the key, so no key enters a pod.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.baseUrl) && !has(self.model) && !has(self.apiKeySecretRef)").message("spec.model names a model profile (spec.model.profile); baseUrl, model and apiKeySecretRef are no longer accepted: the operator configures endpoints, models and keys as model profiles of the gateway"))]
pub struct ModelChoice {
    /// Name of a model profile of the gateway; unset: its default profile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')").message("profile must be a lowercase name of letters, digits and '-'"))]
    #[schemars(length(min = 1, max = 63))]
    pub profile: Option<String>,
    /// No longer accepted (the validation rule above refuses it with a message): kept in the
    /// schema so that an old manifest is refused instead of silently pruned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048))]
    pub base_url: Option<String>,
    /// No longer accepted (see `baseUrl`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub model: Option<String>,
    /// No longer accepted (see `baseUrl`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_secret_ref: Option<SecretKeyRef>,
}

/// Budgets of a task. Exhausting one ends the task as `failed` with the reason.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.maxModelCalls >= self.maxSteps").message("maxModelCalls must be at least maxSteps (every step needs a model call)"))]
pub struct Budgets {
    /// Most code steps.
    #[serde(default = "default_steps")]
    #[schemars(range(min = 1, max = 200))]
    pub max_steps: i32,
    /// Most model calls (including retries after a malformed answer).
    #[serde(default = "default_model_calls")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_model_calls: i32,
    /// Most tool calls.
    #[serde(default = "default_tool_calls")]
    #[schemars(range(min = 0, max = 10000))]
    pub max_tool_calls: i32,
    /// Deadline of the whole task in seconds, counted from creation.
    #[serde(default = "default_task_timeout")]
    #[schemars(range(min = 10, max = 86400))]
    pub timeout_seconds: i32,
    /// Most model tokens (prompt and completion) the task may use, counted by the gateway.
    #[serde(default = "default_model_tokens")]
    #[schemars(range(min = 1000, max = 1_000_000_000))]
    pub max_model_tokens: i64,
}

fn default_steps() -> i32 {
    20
}
fn default_model_calls() -> i32 {
    40
}
fn default_tool_calls() -> i32 {
    200
}
fn default_task_timeout() -> i32 {
    1800
}
fn default_model_tokens() -> i64 {
    2_000_000
}

impl Default for Budgets {
    fn default() -> Self {
        Self {
            max_steps: default_steps(),
            max_model_calls: default_model_calls(),
            max_tool_calls: default_tool_calls(),
            timeout_seconds: default_task_timeout(),
            max_model_tokens: default_model_tokens(),
        }
    }
}

/// Kind of answer a task produced (the task result contract).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TaskType {
    /// Computed with tools; needs at least one successful tool call.
    Analysis,
    /// A direct answer.
    Answer,
    /// The request needs more input from the user.
    NeedsInput,
    /// The request cannot be served with the available tools.
    Unsupported,
    /// The run failed.
    Failed,
}

/// An artifact of a task, as listed from storage.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ArtifactInfo {
    /// File name relative to `outputs/`.
    #[schemars(length(min = 1, max = 512))]
    pub name: String,
    /// Size in bytes.
    pub size_bytes: i64,
}

/// Observed state of a CodingTask.
///
/// Writers: the controller writes `conditions`, `jobName`, `startTime`, `completionTime`
/// (field manager `toolyard-controller`); the gateway writes the result fields `taskType`,
/// `summary`, `metrics`, `artifacts`, `steps`, `modelCalls`, `toolCalls` from the stored
/// result, and `modelTokens` as the task's model calls go through it (field manager
/// `toolyard-gateway`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CodingTaskStatus {
    /// `Succeeded`.
    #[serde(default)]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
    /// Kind of result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_type: Option<TaskType>,
    /// One-paragraph summary of the result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub summary: Option<String>,
    /// Small metrics of the result (the full result is in storage).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form_object")]
    pub metrics: Option<Map<String, Value>>,
    /// Artifacts in storage.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100))]
    pub artifacts: Vec<ArtifactInfo>,
    /// Steps taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<i32>,
    /// Model calls made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_calls: Option<i32>,
    /// Tool calls made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<i32>,
    /// Model tokens used so far (prompt and completion), counted by the gateway's model proxy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_tokens: Option<i64>,
    /// Name of the Job running the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_name: Option<String>,
    /// When the agent started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the task finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
}

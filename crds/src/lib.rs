//! Toolyard's API: the custom resources (`McpTool`, `McpServer`, `McpPrompt`, `ToolCall`, `CodingTask`), their condition
//! vocabulary, the runner protocol, the storage key layout and the scoped runner tokens.
//!
//! This crate is plain data and pure functions. It depends on no other Toolyard crate and
//! needs no Kubernetes client, so every part (gateway, controller, runner, tests) shares it.

pub mod agent;
pub mod codingtask;
pub mod common;
pub mod conditions;
pub mod crdgen;
pub mod mcpprompt;
pub mod mcpserver;
pub mod mcptool;
pub mod owner;
pub mod protocol;
pub mod storage;
pub mod token;
pub mod toolcall;

pub use codingtask::{CodingTask, CodingTaskSpec, CodingTaskStatus};
pub use common::{Owner, SecretKeyRef};
pub use mcpprompt::{McpPrompt, McpPromptSpec};
pub use mcpserver::{McpServer, McpServerSpec, McpServerStatus};
pub use mcptool::{McpTool, McpToolSpec, McpToolStatus};
pub use owner::OwnerKey;
pub use toolcall::{ToolCall, ToolCallSpec, ToolCallStatus};

/// API group of every Toolyard resource.
pub const GROUP: &str = "toolyard.dev";
/// API version served and stored.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` as written in manifests.
pub const API_VERSION: &str = "toolyard.dev/v1alpha1";
/// Category that `kubectl get toolyard` lists.
pub const CATEGORY: &str = "toolyard";
/// Field manager used for everything the gateway writes.
pub const GATEWAY_MANAGER: &str = "toolyard-gateway";
/// Field manager used for everything the controller writes.
pub const CONTROLLER_MANAGER: &str = "toolyard-controller";

//! The tool catalog: which tools exist, with compiled argument validators.

use std::sync::{Arc, OnceLock};

use serde_json::value::RawValue;
use serde_json::{Map, Value};
use toolyard_api::mcptool::McpToolSpec;

use crate::executor::Executor;

pub mod kube;
pub mod local;
pub mod manifest;
pub mod prompts;

/// A tool as the MCP layer sees it: the McpTool spec plus its compiled input validator.
#[derive(Debug)]
pub struct Tool {
    /// Namespace of the McpTool or McpServer (empty in embedded mode).
    pub namespace: String,
    /// McpTool object name: the RBAC `resourceName` and the ToolCall's `spec.tool`; for an
    /// upstream server's tool, the McpServer's name.
    pub object_name: String,
    /// Generation the validator was compiled for.
    pub generation: i64,
    /// The declared spec.
    pub spec: McpToolSpec,
    /// Compiled `inputSchema` (never fetches remote `$ref`s).
    pub validator: Arc<jsonschema::Validator>,
    /// `spec.inputSchema`, shared: a listing clones the `Arc` instead of the schema.
    pub input_schema: Arc<Map<String, Value>>,
    /// `spec.outputSchema`, shared likewise.
    pub output_schema: Option<Arc<Map<String, Value>>>,
    /// Pool mode: base URL of the warm pool serving this tool (the McpTool's
    /// `status.endpoint`, or a local warm worker in embedded mode).
    pub endpoint: Option<String>,
    /// Set for a tool of an upstream MCP server (an McpServer): where its calls go. `spec` then
    /// describes it as the server listed it, under its name on the gateway, with no runtime.
    pub upstream: Option<Upstream>,
    /// The tool's MCP definition as JSON, made by the MCP layer the first time a listing needs
    /// it (`mcp::convert::to_mcp_json`); later listings copy it instead of serializing the tool.
    pub mcp_json: OnceLock<Box<RawValue>>,
}

/// Where the calls of an upstream server's tool go.
#[derive(Clone)]
pub struct Upstream {
    /// The tool's name on its server.
    pub tool: String,
    /// The server's connection, which runs the calls.
    pub executor: Arc<dyn Executor>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream").field("tool", &self.tool).finish_non_exhaustive()
    }
}

impl Tool {
    /// The hard limit of one call (`spec.execution.timeoutSeconds`, within 1 s and
    /// [`toolyard_api::mcptool::MAX_TOOL_TIMEOUT_SECONDS`], as the schema requires).
    pub fn timeout(&self) -> std::time::Duration {
        let seconds = self.spec.execution.timeout_seconds.clamp(1, toolyard_api::mcptool::MAX_TOOL_TIMEOUT_SECONDS);
        std::time::Duration::from_secs(u64::try_from(seconds).unwrap_or(60))
    }

    /// Builds a tool, compiling its input schema. Errors name what is wrong with the schema.
    pub fn new(namespace: String, object_name: String, generation: i64, spec: McpToolSpec) -> Result<Self, String> {
        let validator = compile_schema(&Value::Object(spec.input_schema.clone()))?;
        Ok(Self::with_validator(namespace, object_name, generation, spec, Arc::new(validator)))
    }

    /// Builds a tool with its input schema already compiled (`validator`, cached by the
    /// caller per generation).
    pub fn with_validator(
        namespace: String,
        object_name: String,
        generation: i64,
        spec: McpToolSpec,
        validator: Arc<jsonschema::Validator>,
    ) -> Self {
        let input_schema = Arc::new(spec.input_schema.clone());
        let output_schema = spec.output_schema.clone().map(Arc::new);
        Self {
            namespace,
            object_name,
            generation,
            spec,
            validator,
            input_schema,
            output_schema,
            endpoint: None,
            upstream: None,
            mcp_json: OnceLock::new(),
        }
    }

    /// The same tool with a pool endpoint.
    pub fn with_endpoint(mut self, endpoint: Option<String>) -> Self {
        self.endpoint = endpoint;
        self
    }

    /// The same tool as one of an upstream server's.
    pub fn with_upstream(mut self, upstream: Upstream) -> Self {
        self.upstream = Some(upstream);
        self
    }

    /// MCP tool name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// Checks arguments against the input schema; the error lists each problem with its
    /// JSON pointer (e.g. `/spot: "x" is not of type "number"`).
    pub fn validate(&self, arguments: &Value) -> Result<(), String> {
        let problems: Vec<String> = self
            .validator
            .iter_errors(arguments)
            .map(|e| {
                let path = e.instance_path().to_string();
                if path.is_empty() { e.to_string() } else { format!("{path}: {e}") }
            })
            .collect();
        if problems.is_empty() { Ok(()) } else { Err(problems.join("; ")) }
    }
}

/// Compiles a JSON Schema without any network or file access.
pub fn compile_schema(schema: &Value) -> Result<jsonschema::Validator, String> {
    jsonschema::options().build(schema).map_err(|e| format!("inputSchema is not a valid JSON Schema: {e}"))
}

/// A prompt as the gateway serves it (under its served name): an upstream MCP server's, or
/// one an operator declared (an McpPrompt).
pub struct Prompt {
    /// Namespace of its McpServer or McpPrompt (empty in embedded mode).
    pub namespace: String,
    /// Its McpServer's name (what RBAC names, like for the server's tools), or its McpPrompt's.
    pub object_name: String,
    /// An McpPrompt (granted on `mcpprompts`), not an upstream server's prompt.
    pub declared: bool,
    /// Served name (the server's prefix, then its name there; an McpPrompt's object name).
    pub name: String,
    /// Its name on the server (an McpPrompt's: its name).
    pub upstream_name: String,
    /// Its McpServer's or McpPrompt's toolset.
    pub toolset: Option<String>,
    /// The MCP `Prompt` as the server lists it, with the served name.
    pub listing: Value,
    /// Its required arguments.
    pub required: Vec<String>,
    /// Where `prompts/get` goes.
    pub source: Arc<dyn PromptSource>,
    /// Where `completion/complete` of its arguments goes.
    pub completer: Arc<dyn CompletionSource>,
}

impl std::fmt::Debug for Prompt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prompt").field("name", &self.name).field("server", &self.object_name).finish_non_exhaustive()
    }
}

/// Why a prompt was not given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PromptError {
    /// The arguments do not fit the prompt (the message says how).
    InvalidArguments(String),
    /// The server failed or is unreachable (the message says which).
    Failed(String),
}

/// Answers `prompts/get` for the prompts of one server (or one McpPrompt).
#[async_trait::async_trait]
pub trait PromptSource: Send + Sync + 'static {
    /// The MCP `GetPromptResult` of the server's prompt `name` with `arguments`, or why not.
    async fn get(&self, name: &str, arguments: Map<String, Value>) -> Result<Value, PromptError>;
}

/// A resource, or a resource template, of an upstream MCP server as the gateway serves it:
/// its URI unchanged, readable by whoever may use the server as a whole.
pub struct ServedResource {
    /// Namespace of its McpServer (empty in embedded mode).
    pub namespace: String,
    /// Its McpServer's name: what RBAC names.
    pub object_name: String,
    /// Its McpServer's toolset.
    pub toolset: Option<String>,
    /// Its URI, or for a template its `uriTemplate`.
    pub uri: String,
    /// A template: the part of its `uriTemplate` before the first `{`, which every URI it
    /// expands to starts with.
    pub template_prefix: Option<String>,
    /// The MCP `Resource` (or `ResourceTemplate`) as the server lists it.
    pub listing: Value,
    /// Where `resources/read` goes.
    pub source: Arc<dyn ResourceSource>,
    /// Where `completion/complete` of a template's arguments goes.
    pub completer: Arc<dyn CompletionSource>,
}

impl std::fmt::Debug for ServedResource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServedResource")
            .field("uri", &self.uri)
            .field("server", &self.object_name)
            .finish_non_exhaustive()
    }
}

impl ServedResource {
    /// How well this resource answers for `uri`: `Some(len)` for the resource itself (the
    /// longest) or for a template whose prefix `uri` starts with, `None` otherwise.
    pub fn matches(&self, uri: &str) -> Option<usize> {
        match &self.template_prefix {
            None => (self.uri == uri).then_some(usize::MAX),
            Some(prefix) => (uri.starts_with(prefix.as_str()) && uri.len() > prefix.len()).then_some(prefix.len()),
        }
    }
}

/// Why an upstream server did not give a resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResourceError {
    /// The server does not have it.
    NotFound,
    /// The server failed or is unreachable (the message says which).
    Failed(String),
}

/// Answers `resources/read` for the resources of one server, and subscribes to their updates.
#[async_trait::async_trait]
pub trait ResourceSource: Send + Sync + 'static {
    /// The MCP `ReadResourceResult` of `uri`, or why not.
    async fn read(&self, uri: &str) -> Result<Value, ResourceError>;

    /// Subscribes to updates of `uri`, until as many [`ResourceSource::unsubscribe`] calls as
    /// subscriptions were made; the receiver gets the URIs the server says were updated (any
    /// of its subscribed ones). The message says why not.
    async fn subscribe(&self, uri: &str) -> Result<tokio::sync::broadcast::Receiver<String>, String>;

    /// Ends one subscription to `uri` made with [`ResourceSource::subscribe`].
    fn unsubscribe(&self, uri: &str);
}

/// Answers `completion/complete` for the prompts and resource templates of one server.
#[async_trait::async_trait]
pub trait CompletionSource: Send + Sync + 'static {
    /// The MCP `CompleteResult` for the `CompleteRequestParams` `request` (naming the prompt
    /// as the server knows it), or why not.
    async fn complete(&self, request: Value) -> Result<Value, String>;
}

/// Source of tools. Implementations keep a current snapshot and bump a version on change.
pub trait ToolCatalog: Send + Sync + 'static {
    /// Every tool that can be listed (Ready), sorted by name (a snapshot: listings walk it
    /// from a cursor without copying it).
    fn tools(&self) -> Arc<[Arc<Tool>]>;
    /// One tool by MCP name.
    fn get(&self, name: &str) -> Option<Arc<Tool>> {
        let tools = self.tools();
        tools.binary_search_by(|t| t.name().cmp(name)).ok().map(|i| tools[i].clone())
    }
    /// A receiver whose value changes whenever the tool set changes (for `list_changed`).
    fn changes(&self) -> tokio::sync::watch::Receiver<u64>;
    /// True once the first full listing is in.
    fn is_synced(&self) -> bool;
    /// The prompts served: the declared ones (McpPrompts), and those of connected upstream
    /// servers, sorted by name (none by default).
    fn prompts(&self) -> Vec<Arc<Prompt>> {
        Vec::new()
    }
    /// The resources and resource templates of connected upstream servers (none without
    /// servers).
    fn resources(&self) -> Vec<Arc<ServedResource>> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Nowhere;

    #[async_trait::async_trait]
    impl ResourceSource for Nowhere {
        async fn read(&self, _uri: &str) -> Result<Value, ResourceError> {
            Err(ResourceError::NotFound)
        }

        async fn subscribe(&self, _uri: &str) -> Result<tokio::sync::broadcast::Receiver<String>, String> {
            Err("nowhere".into())
        }

        fn unsubscribe(&self, _uri: &str) {}
    }

    #[async_trait::async_trait]
    impl CompletionSource for Nowhere {
        async fn complete(&self, _request: Value) -> Result<Value, String> {
            Err("nowhere".into())
        }
    }

    fn resource(uri: &str, template: bool) -> ServedResource {
        ServedResource {
            namespace: String::new(),
            object_name: "s".into(),
            toolset: None,
            uri: uri.into(),
            template_prefix: template.then(|| uri.split('{').next().unwrap_or_default().to_owned()),
            listing: Value::Null,
            source: Arc::new(Nowhere),
            completer: Arc::new(Nowhere),
        }
    }

    #[test]
    fn a_listed_uri_beats_templates_and_longer_template_prefixes_win() {
        let exact = resource("quotes://ACME/last", false);
        let broad = resource("quotes://{ticker}/history", true);
        let narrow = resource("quotes://ACME/{field}", true);
        assert_eq!(exact.matches("quotes://ACME/last"), Some(usize::MAX));
        assert_eq!(exact.matches("quotes://ACME/lastx"), None, "a listed URI matches itself only");
        assert!(narrow.matches("quotes://ACME/open") > broad.matches("quotes://ACME/open"));
        assert_eq!(broad.matches("quotes://"), None, "a template needs something after its prefix");
        assert_eq!(broad.matches("files://x"), None);
    }
}

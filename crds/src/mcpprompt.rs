//! `McpPrompt`: a prompt an operator declares, served by the gateway (`prompts/list`,
//! `prompts/get`) next to the prompts of upstream MCP servers.
//!
//! Its MCP name is the object's name. Its messages are text in which `{{argument}}` stands for
//! the value of a declared argument; an argument with `values` takes only those, and offers
//! them as completions. Whoever may `call` the McpPrompt (RBAC, as for tools) sees and gets it.

// `printcolumn(...)` repeats `type_ = ...` by design; the lint mistakes it for duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// A prompt template served by the gateway as an MCP prompt named after the object.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "toolyard.dev",
    version = "v1alpha1",
    kind = "McpPrompt",
    plural = "mcpprompts",
    shortname = "mcpp",
    category = "toolyard",
    namespaced,
    derive = "PartialEq",
    doc = "A prompt template the Toolyard gateway serves as an MCP prompt.",
    printcolumn(name = "Title", type_ = "string", json_path = ".spec.title"),
    printcolumn(name = "Arguments", type_ = "string", json_path = ".spec.arguments[*].name"),
    printcolumn(name = "Toolset", type_ = "string", json_path = ".spec.toolset"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(name = "Description", type_ = "string", json_path = ".spec.description", priority = 1)
)]
#[serde(rename_all = "camelCase")]
pub struct McpPromptSpec {
    /// Human-readable name shown by clients.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128))]
    pub title: Option<String>,
    /// What the prompt is for.
    #[schemars(length(min = 1, max = 1024))]
    pub description: String,
    /// Arguments the messages name as `{{name}}`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(validation = Rule::new("self.all(v, self.exists_one(w, w.name == v.name))").message("argument names must be unique"))]
    #[schemars(length(max = 32))]
    pub arguments: Vec<PromptArgument>,
    /// The messages `prompts/get` returns, in order, with the arguments' values in place of
    /// their `{{name}}`.
    #[schemars(length(min = 1, max = 32))]
    pub messages: Vec<PromptMessage>,
    /// Named group with its own endpoint `/toolsets/<toolset>/mcp`, as for tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')").message("toolset must be a DNS label: lowercase letters, digits and '-'"))]
    #[schemars(length(min = 1, max = 63))]
    pub toolset: Option<String>,
}

/// One argument of a prompt.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PromptArgument {
    /// Its name, written `{{name}}` in the messages: letters, digits and '_'.
    #[x_kube(validation = Rule::new("self.matches('^[A-Za-z_][A-Za-z0-9_]*$')").message("an argument name must start with a letter or '_' and contain only letters, digits and '_'"))]
    #[schemars(length(min = 1, max = 64))]
    pub name: String,
    /// What to give.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub description: Option<String>,
    /// `prompts/get` without it is refused (default: optional, empty when not given).
    #[serde(default)]
    pub required: bool,
    /// The only values it takes, offered as completions (`completion/complete`). Empty: any
    /// text.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256), inner(length(min = 1, max = 256)))]
    pub values: Vec<String>,
}

/// One message of a prompt.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PromptMessage {
    /// Who says it.
    pub role: PromptRole,
    /// Its text; `{{name}}` is replaced by argument `name`'s value.
    #[schemars(length(min = 1, max = 65536))]
    pub text: String,
}

/// The speaker of a prompt message.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum PromptRole {
    /// The user.
    User,
    /// The assistant.
    Assistant,
}

/// The `{{name}}` placeholders of `text`, in order, with their byte ranges: `{{`, optional
/// spaces, an argument-name-shaped word, optional spaces, `}}`. Other braces are text.
pub fn placeholders(text: &str) -> Vec<(std::ops::Range<usize>, &str)> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(open) = text[from..].find("{{").map(|i| from + i) {
        let inner_start = open + 2;
        let Some(close) = text[inner_start..].find("}}").map(|i| inner_start + i) else { break };
        let name = text[inner_start..close].trim_matches(' ');
        let is_name = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if is_name {
            found.push((open..close + 2, name));
            from = close + 2;
        } else {
            from = open + 1;
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_names_in_double_braces() {
        let text = "Price {{ticker}} at {{ strike }}; {{not a name}} {{}} {\"json\": {{x}}} {{1x}} {{ticker";
        let names: Vec<&str> = placeholders(text).into_iter().map(|(_, n)| n).collect();
        assert_eq!(names, ["ticker", "strike", "x"]);
        let (range, _) = &placeholders(text)[1];
        assert_eq!(&text[range.clone()], "{{ strike }}");
    }
}

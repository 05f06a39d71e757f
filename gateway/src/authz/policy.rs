//! A static policy file for embedded mode, with the same meaning as the RBAC rules:
//!
//! ```yaml
//! rules:
//!   - users: [alice]        # and/or groups: [quants]; "*" = every authenticated identity
//!     issuers: [apikey]     # whose identities: apikey (the default), kubernetes, an OIDC
//!                           # issuer URL, anonymous; "*" = any issuer
//!     tools: ["*"]          # MCP tool names, McpTool object names or McpServer names
//!                           # (all of its tools and prompts), upstream prompt names;
//!                           # "*" = all
//!     codingTasks: true     # may start coding tasks (default false)
//!     modelProfiles: [default]  # with codingTasks: the model profiles its tasks may use
//!                           # (default: every profile)
//! ```
//!
//! A rule applies to an identity of one of its `issuers` named in `users` or belonging to one
//! of `groups` (so `alice` of an identity provider is never the API key user `alice`); it
//! grants the listed tools and, with `codingTasks: true`, coding tasks with the listed model
//! profiles. Default deny: an
//! empty file or rule list denies everything. `"*"` does not cover the anonymous identity
//! (it is not authenticated); name it in `users` to grant it something.

use std::path::Path;

use async_trait::async_trait;
use serde::Deserialize;

use super::Authorizer;
use super::metrics::AuthzMetrics;
use crate::auth::chain::ANONYMOUS_ISSUER;
use crate::catalog::{Prompt, ServedResource, Tool};
use crate::identity::Identity;

/// Problems with a policy file; each names the file and, for content, the field.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The file could not be read.
    #[error("reading policy file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// Not YAML of the expected shape (unknown fields included).
    #[error("{origin}: {message}")]
    Parse {
        /// The file.
        origin: String,
        /// The parser's message (names the field and position).
        message: String,
    },
    /// A field has a bad value.
    #[error("{origin}: {field}: {message}")]
    Field {
        /// The file.
        origin: String,
        /// E.g. `rules[1].users[0]`.
        field: String,
        /// What must hold.
        message: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    #[serde(default)]
    rules: Option<Vec<RawRule>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawRule {
    #[serde(default)]
    users: Vec<String>,
    #[serde(default)]
    groups: Vec<String>,
    #[serde(default)]
    issuers: Option<Vec<String>>,
    #[serde(default)]
    tools: Vec<String>,
    #[serde(default)]
    coding_tasks: bool,
    #[serde(default)]
    model_profiles: Option<Vec<String>>,
}

/// The issuer a rule's identities have when it names none: API keys (the local mode's
/// token is one).
const DEFAULT_ISSUER: &str = crate::auth::apikey::ISSUER;

/// Issuer names: `"*"` or names without spaces (an OIDC issuer is its URL).
fn issuer_names(
    list: Vec<String>,
    at: &str,
    field: &impl Fn(String, &str) -> PolicyError,
) -> Result<Names, PolicyError> {
    let mut out = Names::default();
    for (j, name) in list.into_iter().enumerate() {
        if name == "*" {
            out.all = true;
        } else if name.is_empty() || name.chars().any(char::is_whitespace) {
            return Err(field(
                format!("{at}[{j}]"),
                "an issuer is apikey, kubernetes, anonymous or an OIDC issuer URL",
            ));
        } else {
            out.names.push(name);
        }
    }
    Ok(out)
}

/// A "*"-or-names matcher.
#[derive(Clone, Debug, Default)]
struct Names {
    all: bool,
    names: Vec<String>,
}

impl Names {
    fn contains(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name)
    }
}

#[derive(Clone, Debug)]
struct Rule {
    users: Names,
    groups: Names,
    issuers: Names,
    tools: Names,
    coding_tasks: bool,
    /// `None`: every profile.
    model_profiles: Option<Names>,
}

impl Rule {
    fn applies_to(&self, who: &Identity) -> bool {
        if !(self.issuers.all || self.issuers.contains(&who.issuer)) {
            return false;
        }
        let authenticated = who.issuer != ANONYMOUS_ISSUER;
        ((self.users.all || self.groups.all) && authenticated)
            || self.users.contains(&who.user)
            || who.groups.iter().any(|g| self.groups.contains(g))
    }
}

/// Authorizer over a static rule list.
#[derive(Clone, Debug, Default)]
pub struct PolicyAuthorizer {
    rules: Vec<Rule>,
    metrics: AuthzMetrics,
}

impl PolicyAuthorizer {
    /// Denies everything.
    pub fn deny_all() -> Self {
        Self::default()
    }

    /// Reads and checks a policy file.
    pub fn from_file(path: &Path) -> Result<Self, PolicyError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| PolicyError::Read { path: path.display().to_string(), source })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses policy YAML; `origin` names the file in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self, PolicyError> {
        let raw: RawPolicy = if text.trim().is_empty() {
            RawPolicy { rules: None }
        } else {
            serde_saphyr::from_str(text)
                .map_err(|e| PolicyError::Parse { origin: origin.to_owned(), message: e.to_string() })?
        };
        let field = |field: String, message: &str| PolicyError::Field {
            origin: origin.to_owned(),
            field,
            message: message.to_owned(),
        };
        let mut rules = Vec::new();
        for (i, r) in raw.rules.unwrap_or_default().into_iter().enumerate() {
            if r.users.is_empty() && r.groups.is_empty() {
                return Err(field(
                    format!("rules[{i}]"),
                    "set users and/or groups (\"*\" = every authenticated identity)",
                ));
            }
            if r.tools.is_empty() && !r.coding_tasks {
                return Err(field(format!("rules[{i}]"), "grants nothing: list tools and/or set codingTasks: true"));
            }
            let users = names(r.users, &format!("rules[{i}].users"), &field)?;
            let groups = names(r.groups, &format!("rules[{i}].groups"), &field)?;
            let issuers = match r.issuers {
                Some(list) if list.is_empty() => {
                    return Err(field(format!("rules[{i}].issuers"), "name at least one issuer (\"*\" = any)"));
                }
                Some(list) => issuer_names(list, &format!("rules[{i}].issuers"), &field)?,
                None => Names { all: false, names: vec![DEFAULT_ISSUER.to_owned()] },
            };
            let tools = names(r.tools, &format!("rules[{i}].tools"), &field)?;
            if r.model_profiles.is_some() && !r.coding_tasks {
                return Err(field(
                    format!("rules[{i}].modelProfiles"),
                    "applies to coding tasks: set codingTasks: true",
                ));
            }
            let model_profiles = match r.model_profiles {
                Some(list) => Some(names(list, &format!("rules[{i}].modelProfiles"), &field)?),
                None => None,
            };
            rules.push(Rule { users, groups, issuers, tools, coding_tasks: r.coding_tasks, model_profiles });
        }
        Ok(Self { rules, metrics: AuthzMetrics::default() })
    }

    /// Counts decisions into `metrics`.
    pub fn with_metrics(mut self, metrics: AuthzMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// May `who` list and call the tool with MCP name `tool_name` / object name `object_name`?
    pub fn allows_tool(&self, who: &Identity, tool_name: &str, object_name: &str) -> bool {
        self.rules.iter().filter(|r| r.applies_to(who)).any(|r| {
            r.tools.all || r.tools.contains(tool_name) || (!object_name.is_empty() && r.tools.contains(object_name))
        })
    }

    /// May `who` start coding tasks?
    pub fn allows_tasks(&self, who: &Identity) -> bool {
        self.rules.iter().any(|r| r.coding_tasks && r.applies_to(who))
    }

    /// May `who`'s coding tasks use the model profile `profile`?
    pub fn allows_model(&self, who: &Identity, profile: &str) -> bool {
        self.rules
            .iter()
            .filter(|r| r.coding_tasks && r.applies_to(who))
            .any(|r| r.model_profiles.as_ref().is_none_or(|p| p.all || p.contains(profile)))
    }
}

fn names(list: Vec<String>, path: &str, field: &impl Fn(String, &str) -> PolicyError) -> Result<Names, PolicyError> {
    let mut out = Names::default();
    for (j, n) in list.into_iter().enumerate() {
        if n.is_empty() || n.trim() != n || n.len() > 256 {
            return Err(field(format!("{path}[{j}]"), "must be a non-empty name without surrounding spaces"));
        }
        if n == "*" {
            out.all = true;
        } else if n.contains('*') {
            return Err(field(format!("{path}[{j}]"), "\"*\" stands alone (no patterns)"));
        } else {
            out.names.push(n);
        }
    }
    Ok(out)
}

#[async_trait]
impl Authorizer for PolicyAuthorizer {
    async fn can_call(&self, who: &Identity, tool: &Tool) -> crate::Result<bool> {
        let allowed = self.allows_tool(who, tool.name(), &tool.object_name);
        self.metrics.decision("static", "call", if allowed { "allow" } else { "deny" });
        Ok(allowed)
    }

    async fn can_get_prompt(&self, who: &Identity, prompt: &Prompt) -> crate::Result<bool> {
        let allowed = self.allows_tool(who, &prompt.name, &prompt.object_name);
        self.metrics.decision("static", "prompt", if allowed { "allow" } else { "deny" });
        Ok(allowed)
    }

    async fn can_read_resource(&self, who: &Identity, resource: &ServedResource) -> crate::Result<bool> {
        let allowed = self.allows_tool(who, &resource.object_name, &resource.object_name);
        self.metrics.decision("static", "resource", if allowed { "allow" } else { "deny" });
        Ok(allowed)
    }

    async fn can_create_task(&self, who: &Identity, _namespace: &str) -> crate::Result<bool> {
        let allowed = self.allows_tasks(who);
        self.metrics.decision("static", "task", if allowed { "allow" } else { "deny" });
        Ok(allowed)
    }

    async fn can_use_model(&self, who: &Identity, _namespace: &str, profile: &str) -> crate::Result<bool> {
        let allowed = self.allows_model(who, profile);
        self.metrics.decision("static", "model", if allowed { "allow" } else { "deny" });
        Ok(allowed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(user: &str, groups: &[&str]) -> Identity {
        Identity {
            issuer: "apikey".into(),
            user: user.into(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
            scopes: vec![],
        }
    }

    #[test]
    fn users_groups_and_wildcards_grant_what_they_list() {
        let p = PolicyAuthorizer::parse(
            "rules:\n  - users: [alice]\n    tools: ['*']\n    codingTasks: true\n  - groups: [ops]\n    tools: [price_option, greeks-tool]\n  - users: ['*']\n    tools: [get_quote]\n",
            "policy.yaml",
        )
        .expect("policy");
        let alice = id("alice", &[]);
        let bob = id("bob", &["ops"]);
        let carol = id("carol", &[]);
        assert!(p.allows_tool(&alice, "anything", "x") && p.allows_tasks(&alice));
        assert!(p.allows_tool(&bob, "price_option", "price-option"));
        assert!(p.allows_tool(&bob, "calc_greeks", "greeks-tool"), "object names match too");
        assert!(!p.allows_tool(&bob, "calc_greeks", "calc-greeks"));
        assert!(!p.allows_tasks(&bob));
        assert!(p.allows_tool(&carol, "get_quote", "q") && !p.allows_tool(&carol, "price_option", "p"));
        let mut anon = id("anonymous", &[]);
        anon.issuer = ANONYMOUS_ISSUER.into();
        assert!(!p.allows_tool(&anon, "get_quote", "q"), "* is every authenticated identity");
    }

    #[test]
    fn model_profiles_are_granted_with_coding_tasks() {
        let p = PolicyAuthorizer::parse(
            "rules:\n  - users: [alice]\n    codingTasks: true\n  - users: [bob]\n    codingTasks: true\n    modelProfiles: [cheap]\n  - users: [carol]\n    tools: ['*']\n",
            "policy.yaml",
        )
        .expect("policy");
        assert!(p.allows_model(&id("alice", &[]), "expensive"), "no list: every profile");
        assert!(p.allows_model(&id("bob", &[]), "cheap") && !p.allows_model(&id("bob", &[]), "expensive"));
        assert!(!p.allows_model(&id("carol", &[]), "cheap"), "no coding tasks, no profile");
        let e = PolicyAuthorizer::parse("rules:\n  - users: [a]\n    tools: [x]\n    modelProfiles: [p]\n", "p.yaml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("rules[0].modelProfiles") && e.contains("codingTasks"), "{e}");
    }

    #[test]
    fn empty_or_missing_rules_deny_everything() {
        for doc in ["", "rules: []\n", "{}\n", "rules:\n"] {
            let p = PolicyAuthorizer::parse(doc, "p.yaml").expect(doc);
            assert!(!p.allows_tool(&id("alice", &["quants"]), "t", "t"));
            assert!(!p.allows_tasks(&id("alice", &[])));
        }
    }

    #[test]
    fn malformed_rules_name_file_and_field() {
        let cases = [
            ("rules:\n  - users: [a]\n    tool: ['*']\n", "tool"),
            ("rules:\n  - tools: ['*']\n", "rules[0]"),
            ("rules:\n  - users: [a]\n", "rules[0]: grants nothing"),
            ("rules:\n  - users: [a]\n    tools: ['']\n", "rules[0].tools[0]"),
            ("rules:\n  - users: [a]\n    tools: [x]\n  - groups: ['ops*']\n    tools: [x]\n", "rules[1].groups[0]"),
            ("rules:\n  - users: [a]\n    tools: [x]\n    codingTasks: maybe\n", "codingTasks"),
            ("rule:\n  - users: [a]\n", "rule"),
        ];
        for (doc, needle) in cases {
            let e = PolicyAuthorizer::parse(doc, "policy.yaml").expect_err(doc).to_string();
            assert!(e.starts_with("policy.yaml: "), "{e}");
            assert!(e.contains(needle), "{e:?} should mention {needle:?}");
        }
    }
}

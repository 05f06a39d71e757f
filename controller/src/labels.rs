//! Label keys and values of the objects the controller creates.
//!
//! Label values are bounded (63 characters, `[A-Za-z0-9._-]`); names that do not fit are
//! shortened with a hash so the label stays unique. Users appear only as their owner key
//! (a hash of issuer and subject), never by name.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

/// `app.kubernetes.io/managed-by`.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY`] on everything the controller creates.
pub const MANAGED_BY_VALUE: &str = "toolyard";
/// The McpTool (object name) a Job, pool or pod belongs to.
pub const TOOL: &str = "toolyard.dev/tool";
/// The ToolCall a Job or pod runs.
pub const CALL: &str = "toolyard.dev/call";
/// The CodingTask a Job or pod runs.
pub const TASK: &str = "toolyard.dev/task";
/// Owner key of the identity a run acts as.
pub const OWNER: &str = "toolyard.dev/owner";
/// The McpServer (object name) a Deployment, Service or pod runs.
pub const SERVER: &str = "toolyard.dev/server";
/// What a Deployment, Service or pod is (`pool`, `mcp-server`).
pub const COMPONENT: &str = toolyard_api::protocol::pool::COMPONENT_LABEL;
/// Value of [`COMPONENT`] for warm pools.
pub const COMPONENT_POOL: &str = toolyard_api::protocol::pool::COMPONENT;
/// Value of [`COMPONENT`] for McpServers Toolyard runs.
pub const COMPONENT_MCP_SERVER: &str = "mcp-server";

/// Annotation on ToolCalls and CodingTasks carrying the W3C trace context of the request.
pub const TRACEPARENT_ANNOTATION: &str = "toolyard.dev/traceparent";

/// Longest label value.
const MAX_VALUE: usize = 63;

/// `s` if it is a valid label value, else a shortened form with a hash suffix.
pub fn value(s: &str) -> String {
    if is_valid_value(s) {
        return s.to_owned();
    }
    let cleaned: String = s
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '-' })
        .take(MAX_VALUE - 11)
        .collect();
    let cleaned = cleaned.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    let hash = short_hash(s, 10);
    if cleaned.is_empty() { hash } else { format!("{cleaned}-{hash}") }
}

fn is_valid_value(s: &str) -> bool {
    s.len() <= MAX_VALUE
        && (s.is_empty()
            || (s.starts_with(|c: char| c.is_ascii_alphanumeric())
                && s.ends_with(|c: char| c.is_ascii_alphanumeric())
                && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))))
}

/// The first `n` hex characters of SHA-256 of `s`.
pub fn short_hash(s: &str, n: usize) -> String {
    let mut hex = hex::encode(Sha256::digest(s.as_bytes()));
    hex.truncate(n);
    hex
}

/// The labels every object of the controller carries.
pub fn base() -> BTreeMap<String, String> {
    BTreeMap::from([(MANAGED_BY.to_owned(), MANAGED_BY_VALUE.to_owned())])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_values_pass_through() {
        assert_eq!(value("price-option"), "price-option");
        assert_eq!(value("a.b_c-1"), "a.b_c-1");
    }

    #[test]
    fn long_or_odd_values_are_shortened_with_a_hash() {
        let long = "x".repeat(200);
        let v = value(&long);
        assert!(v.len() <= 63, "{v}");
        assert!(is_valid_value(&v), "{v}");
        assert_ne!(value(&"x".repeat(201)), v, "different inputs, different values");
        let odd = value("-weird/name-");
        assert!(is_valid_value(&odd), "{odd}");
    }
}

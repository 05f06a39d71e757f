//! Identifiers the gateway makes: call ids, task ids, and the W3C `traceparent` check for the
//! ones it receives.

use toolyard_api::storage::RunId;

/// A new call id: the tool name as a DNS label prefix plus 12 random characters, e.g.
/// `price-option-3f9c0a1b2c4d`.
pub fn new_call_id(tool_name: &str) -> RunId {
    let mut prefix: String =
        tool_name.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect();
    prefix.truncate(40);
    let prefix = prefix.trim_matches('-');
    let random = random_hex12();
    let id = if prefix.is_empty() { format!("call-{random}") } else { format!("{prefix}-{random}") };
    // Collapse runs of '-' that came from several odd characters in a row.
    let mut clean = String::with_capacity(id.len());
    for c in id.chars() {
        if !(c == '-' && clean.ends_with('-')) {
            clean.push(c);
        }
    }
    RunId::parse(&clean).expect("built from [a-z0-9-] without leading or trailing '-'")
}

/// A new task id: `task-` and 12 random lowercase hex characters.
pub fn new_task_id() -> RunId {
    RunId::parse(&format!("task-{}", random_hex12())).expect("task- and hex digits make a valid id")
}

/// 12 random lowercase hex characters (48 bits) from the thread's CSPRNG, which is seeded
/// from the OS: no system call per id, unlike a fresh OS read for a UUID.
pub(crate) fn random_hex12() -> String {
    hex::encode(rand::random::<[u8; 6]>())
}

/// True for a well-formed W3C `traceparent` (`vv-<32 hex>-<16 hex>-ff`). Only such values are
/// passed on: they end up in an annotation and an environment variable.
pub fn is_traceparent(value: &str) -> bool {
    let parts: Vec<&str> = value.split('-').collect();
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    parts.len() == 4 && hex(parts[0], 2) && hex(parts[1], 32) && hex(parts[2], 16) && hex(parts[3], 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_ids_are_dns_labels_named_after_the_tool() {
        let id = new_call_id("price_option");
        assert!(id.as_str().starts_with("price-option-"), "{id}");
        assert_eq!(id.as_str().len(), "price-option-".len() + 12);
        assert!(new_call_id("__Weird__Name__").as_str().starts_with("weird-name-"));
        assert!(new_call_id("_").as_str().starts_with("call-"));
        let long = new_call_id(&"a".repeat(64));
        assert!(long.as_str().len() <= RunId::MAX_LEN);
        assert_ne!(new_call_id("x"), new_call_id("x"));
    }

    #[test]
    fn task_ids_are_run_ids() {
        let id = new_task_id();
        assert!(id.as_str().starts_with("task-") && id.as_str().len() == 17, "{id}");
        assert_ne!(new_task_id(), id);
    }

    #[test]
    fn traceparent_shape() {
        assert!(is_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
        for bad in ["", "00-xyz-00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", "a\nb"] {
            assert!(!is_traceparent(bad), "{bad:?}");
        }
    }
}

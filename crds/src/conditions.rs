//! The condition vocabulary: types, reasons and constructors.
//!
//! `McpTool` has a `Ready` condition; `ToolCall` and `CodingTask` have `Succeeded`
//! (Unknown while pending or running, then True, or False with a reason), as Tekton runs do.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Condition type of `McpTool`: the tool can be listed and called.
pub const READY: &str = "Ready";
/// Condition type of `ToolCall` and `CodingTask`: the run finished (True/False) or not (Unknown).
pub const SUCCEEDED: &str = "Succeeded";

/// Condition status values.
pub mod status {
    /// The condition holds.
    pub const TRUE: &str = "True";
    /// The condition does not hold.
    pub const FALSE: &str = "False";
    /// Not decided yet.
    pub const UNKNOWN: &str = "Unknown";
}

/// Reasons. CamelCase, stable: clients and alerts match on them.
pub mod reason {
    // McpTool / Ready
    /// The spec is valid and the tool runs as a Job per call.
    pub const VALID: &str = "Valid";
    /// The warm pool has at least one available replica.
    pub const POOL_AVAILABLE: &str = "PoolAvailable";
    /// The warm pool has no available replica yet.
    pub const POOL_PROGRESSING: &str = "PoolProgressing";
    /// McpServer / Ready: a runtime server has at least one available pod.
    pub const SERVER_AVAILABLE: &str = "ServerAvailable";
    /// McpServer / Ready: a runtime server has no available pod yet.
    pub const SERVER_PROGRESSING: &str = "ServerProgressing";
    /// The spec is invalid in a way the schema cannot express; the message says what to fix.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// The controller has not looked at this generation yet.
    pub const RECONCILING: &str = "Reconciling";

    // ToolCall, CodingTask / Succeeded
    /// Created, waiting for its Job or pod to start.
    pub const PENDING: &str = "Pending";
    /// The process is running.
    pub const RUNNING: &str = "Running";
    /// Finished and produced a result.
    pub const SUCCEEDED: &str = "Succeeded";
    /// The process failed (exit code, crash, invalid result, tool error).
    pub const FAILED: &str = "Failed";
    /// The deadline passed.
    pub const TIMED_OUT: &str = "TimedOut";
    /// Cancelled by its owner or because the client went away.
    pub const CANCELLED: &str = "Cancelled";
    /// Refused before running (unknown tool, not allowed, invalid reference).
    pub const REJECTED: &str = "Rejected";
    /// No node could take the pod.
    pub const UNSCHEDULABLE: &str = "Unschedulable";
    /// The image of the tool or runner could not be pulled.
    pub const IMAGE_PULL_FAILED: &str = "ImagePullFailed";
}

fn condition(
    type_: &str,
    status: &str,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: truncate(message.into(), MAX_MESSAGE),
        observed_generation: generation,
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
    }
}

/// Longest condition message kept; the API server allows 32768, we keep them readable.
pub const MAX_MESSAGE: usize = 2048;

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

/// `Ready` with the given status.
pub fn ready(status: &str, reason: &str, message: impl Into<String>, generation: Option<i64>) -> Condition {
    condition(READY, status, reason, message, generation)
}

/// `Succeeded=Unknown` (pending or running).
pub fn running(reason: &str, message: impl Into<String>, generation: Option<i64>) -> Condition {
    condition(SUCCEEDED, status::UNKNOWN, reason, message, generation)
}

/// `Succeeded=True`.
pub fn succeeded(message: impl Into<String>, generation: Option<i64>) -> Condition {
    condition(SUCCEEDED, status::TRUE, reason::SUCCEEDED, message, generation)
}

/// `Succeeded=False` with one of the failure reasons.
pub fn failed(reason: &str, message: impl Into<String>, generation: Option<i64>) -> Condition {
    condition(SUCCEEDED, status::FALSE, reason, message, generation)
}

/// The condition of the given type, if present.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// True when the condition of `type_` exists with status True.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == status::TRUE)
}

/// True when a `Succeeded` condition is final (True or False).
pub fn is_finished(conditions: &[Condition]) -> bool {
    find(conditions, SUCCEEDED).is_some_and(|c| c.status != status::UNKNOWN)
}

/// Puts `new` into `conditions`, replacing the one of the same type.
///
/// Keeps the old `lastTransitionTime` when the status did not change. Returns whether
/// anything other than `lastTransitionTime` changed, so callers patch status only then.
pub fn upsert(conditions: &mut Vec<Condition>, mut new: Condition) -> bool {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(old) => {
            if old.status == new.status {
                new.last_transition_time = old.last_transition_time.clone();
            }
            let changed = *old != new;
            *old = new;
            changed
        }
        None => {
            conditions.push(new);
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upsert_keeps_transition_time_when_status_is_unchanged() {
        let mut list = vec![running(reason::PENDING, "waiting", Some(1))];
        let first = list[0].last_transition_time.clone();
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(!upsert(&mut list, running(reason::PENDING, "waiting", Some(1))));
        assert_eq!(list[0].last_transition_time, first);
        assert!(upsert(&mut list, running(reason::RUNNING, "pod running", Some(1))));
        assert_eq!(list[0].last_transition_time, first, "same status keeps the time");
        assert!(upsert(&mut list, succeeded("done", Some(1))));
        assert_ne!(list[0].last_transition_time, first);
        assert!(is_finished(&list));
        assert_eq!(list.len(), 1);
    }

    #[test]
    fn messages_are_truncated_on_a_char_boundary() {
        let c = failed(reason::FAILED, "é".repeat(MAX_MESSAGE), None);
        assert!(c.message.len() <= MAX_MESSAGE);
        assert!(c.message.chars().all(|ch| ch == 'é'));
    }

    #[test]
    fn is_true_and_find() {
        let list = vec![ready(status::TRUE, reason::VALID, "ok", Some(3))];
        assert!(is_true(&list, READY));
        assert!(!is_true(&list, SUCCEEDED));
        assert_eq!(find(&list, READY).and_then(|c| c.observed_generation), Some(3));
        assert!(!is_finished(&list));
    }
}

//! The storage key layout shared by the S3 store and the local folder store.
//!
//! ```text
//! owners/<owner-key>/tasks/<task-id>/result.json
//!                                   /events/<segment>.jsonl
//!                                   /outputs/<artifact path>
//!                                   /actions/<step>.py
//!                                   /tool_calls.json
//! owners/<owner-key>/calls/<call-id>/input.json | result.json | stdout.log | stderr.log
//! ```
//!
//! Keys are only ever built here, from an [`OwnerKey`] (derived from the identity), a
//! validated run id and a validated relative path. Anything a client or a runner names is
//! checked by [`RunId::parse`] and [`RelativePath::parse`] first.

use std::fmt;

use thiserror::Error;

use crate::owner::OwnerKey;

/// Why a name cannot be used in a storage key.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum NameError {
    /// Empty name.
    #[error("{what} is empty")]
    Empty {
        /// What was named.
        what: &'static str,
    },
    /// Longer than allowed.
    #[error("{what} is longer than {max} bytes")]
    TooLong {
        /// What was named.
        what: &'static str,
        /// The limit.
        max: usize,
    },
    /// A character outside the allowed set.
    #[error("{what} contains a character that is not allowed: {found:?}")]
    BadChar {
        /// What was named.
        what: &'static str,
        /// The offending character.
        found: char,
    },
    /// `..`, `.`, an empty segment or an absolute path.
    #[error("{what} must be a relative path without '.', '..' or empty segments: {path:?}")]
    BadSegment {
        /// What was named.
        what: &'static str,
        /// The path as given.
        path: String,
    },
    /// Too many directory levels.
    #[error("{what} is nested deeper than {max} levels")]
    TooDeep {
        /// What was named.
        what: &'static str,
        /// The limit.
        max: usize,
    },
}

/// The id of a call or task: also its object name, so a DNS-1123 label of at most 63 chars.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunId(String);

impl RunId {
    /// Longest id.
    pub const MAX_LEN: usize = 63;

    /// Checks `s`: lowercase letters, digits and '-', starting with a letter or digit.
    pub fn parse(s: &str) -> Result<Self, NameError> {
        const WHAT: &str = "id";
        if s.is_empty() {
            return Err(NameError::Empty { what: WHAT });
        }
        if s.len() > Self::MAX_LEN {
            return Err(NameError::TooLong { what: WHAT, max: Self::MAX_LEN });
        }
        if let Some(found) = s.chars().find(|c| !matches!(c, 'a'..='z' | '0'..='9' | '-')) {
            return Err(NameError::BadChar { what: WHAT, found });
        }
        if s.starts_with('-') || s.ends_with('-') {
            return Err(NameError::BadChar { what: WHAT, found: '-' });
        }
        Ok(Self(s.to_owned()))
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A relative file path inside a task's `outputs/` (an artifact name).
///
/// Segments separated by '/', none empty, '.' or '..'; no backslash, no control characters,
/// no leading '/'; at most [`RelativePath::MAX_LEN`] bytes and [`RelativePath::MAX_DEPTH`] levels.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RelativePath(String);

impl RelativePath {
    /// Longest path in bytes.
    pub const MAX_LEN: usize = 512;
    /// Most segments.
    pub const MAX_DEPTH: usize = 8;

    /// Checks `s` (see the type's documentation).
    pub fn parse(s: &str) -> Result<Self, NameError> {
        const WHAT: &str = "artifact path";
        if s.is_empty() {
            return Err(NameError::Empty { what: WHAT });
        }
        if s.len() > Self::MAX_LEN {
            return Err(NameError::TooLong { what: WHAT, max: Self::MAX_LEN });
        }
        if let Some(found) = s.chars().find(|c| c.is_control() || *c == '\\' || *c == ':') {
            return Err(NameError::BadChar { what: WHAT, found });
        }
        let segments: Vec<&str> = s.split('/').collect();
        if segments.iter().any(|seg| seg.is_empty() || *seg == "." || *seg == "..") {
            return Err(NameError::BadSegment { what: WHAT, path: s.to_owned() });
        }
        if segments.len() > Self::MAX_DEPTH {
            return Err(NameError::TooDeep { what: WHAT, max: Self::MAX_DEPTH });
        }
        Ok(Self(s.to_owned()))
    }

    /// The path as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RelativePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A file of a tool call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallFile {
    /// The arguments, as written by the gateway.
    Input,
    /// The result, as written through the runner protocol.
    Result,
    /// The tool's standard output (bounded).
    Stdout,
    /// The tool's standard error (bounded).
    Stderr,
}

impl CallFile {
    /// File name inside the call's folder.
    pub fn file_name(self) -> &'static str {
        match self {
            CallFile::Input => "input.json",
            CallFile::Result => "result.json",
            CallFile::Stdout => "stdout.log",
            CallFile::Stderr => "stderr.log",
        }
    }
}

/// A file of a coding task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskFile {
    /// The final result.
    Result,
    /// One segment of the lifecycle event log (JSON lines).
    Events(u32),
    /// An artifact written by the agent.
    Output(RelativePath),
    /// The code of one step.
    Action(u32),
    /// Every tool call of the task with its outcome.
    ToolCalls,
}

/// Prefix of everything one owner has: `owners/<key>/`.
pub fn owner_prefix(owner: &OwnerKey) -> String {
    format!("owners/{owner}/")
}

/// Prefix of one call: `owners/<key>/calls/<id>/`.
pub fn call_prefix(owner: &OwnerKey, call: &RunId) -> String {
    format!("owners/{owner}/calls/{call}/")
}

/// Prefix of one task: `owners/<key>/tasks/<id>/`.
pub fn task_prefix(owner: &OwnerKey, task: &RunId) -> String {
    format!("owners/{owner}/tasks/{task}/")
}

/// Prefix of all tasks of one owner: `owners/<key>/tasks/`.
pub fn tasks_prefix(owner: &OwnerKey) -> String {
    format!("owners/{owner}/tasks/")
}

/// Key of a call's file.
pub fn call_key(owner: &OwnerKey, call: &RunId, file: CallFile) -> String {
    format!("{}{}", call_prefix(owner, call), file.file_name())
}

/// Key of a task's file.
pub fn task_key(owner: &OwnerKey, task: &RunId, file: &TaskFile) -> String {
    let prefix = task_prefix(owner, task);
    match file {
        TaskFile::Result => format!("{prefix}result.json"),
        TaskFile::Events(segment) => format!("{prefix}events/{segment:06}.jsonl"),
        TaskFile::Output(path) => format!("{prefix}outputs/{path}"),
        TaskFile::Action(step) => format!("{prefix}actions/{step:04}.py"),
        TaskFile::ToolCalls => format!("{prefix}tool_calls.json"),
    }
}

/// Parses a file name relative to a task folder (as `read_artifact` accepts it:
/// `result.json`, `tool_calls.json`, `events/000001.jsonl`, `actions/0001.py`,
/// `outputs/<path>`, or a bare artifact path meaning `outputs/<path>`).
pub fn parse_task_file(name: &str) -> Result<TaskFile, NameError> {
    match name {
        "result.json" => return Ok(TaskFile::Result),
        "tool_calls.json" => return Ok(TaskFile::ToolCalls),
        _ => {}
    }
    if let Some(n) = name.strip_prefix("events/").and_then(|r| r.strip_suffix(".jsonl")).and_then(|n| n.parse().ok()) {
        return Ok(TaskFile::Events(n));
    }
    if let Some(n) = name.strip_prefix("actions/").and_then(|r| r.strip_suffix(".py")).and_then(|n| n.parse().ok()) {
        return Ok(TaskFile::Action(n));
    }
    let path = name.strip_prefix("outputs/").unwrap_or(name);
    RelativePath::parse(path).map(TaskFile::Output)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner() -> OwnerKey {
        OwnerKey::derive("local", "dev")
    }

    #[test]
    fn layout_matches_the_architecture() {
        let o = owner();
        let call = RunId::parse("price-option-abc12").unwrap();
        assert_eq!(call_key(&o, &call, CallFile::Input), format!("owners/{o}/calls/price-option-abc12/input.json"));
        assert_eq!(call_key(&o, &call, CallFile::Stderr), format!("owners/{o}/calls/price-option-abc12/stderr.log"));
        let task = RunId::parse("task-1").unwrap();
        let out = TaskFile::Output(RelativePath::parse("reports/scenarios.csv").unwrap());
        assert_eq!(task_key(&o, &task, &out), format!("owners/{o}/tasks/task-1/outputs/reports/scenarios.csv"));
        assert_eq!(task_key(&o, &task, &TaskFile::Action(3)), format!("owners/{o}/tasks/task-1/actions/0003.py"));
        assert_eq!(task_key(&o, &task, &TaskFile::Events(1)), format!("owners/{o}/tasks/task-1/events/000001.jsonl"));
        assert!(task_key(&o, &task, &TaskFile::Result).starts_with(&task_prefix(&o, &task)));
    }

    #[test]
    fn traversal_and_odd_names_are_refused() {
        for bad in [
            "",
            "..",
            "../x",
            "a/../b",
            "/etc/passwd",
            "a//b",
            "./a",
            "a/.",
            "a\\b",
            "c:x",
            "a\nb",
            "a\u{0}b",
            "x/y/z/a/b/c/d/e/f",
        ] {
            assert!(RelativePath::parse(bad).is_err(), "{bad:?} should be refused");
        }
        assert!(RelativePath::parse(&"a".repeat(513)).is_err());
        for good in ["scenarios.csv", "reports/q3 summary.md", "données.txt", "a.b.c"] {
            assert!(RelativePath::parse(good).is_ok(), "{good:?} should be accepted");
        }
    }

    #[test]
    fn run_ids_are_dns_labels() {
        assert!(RunId::parse("abc-123").is_ok());
        for bad in ["", "-a", "a-", "A", "a_b", "a/b", "..", &"a".repeat(64)] {
            assert!(RunId::parse(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn task_file_names_round_trip() {
        let o = owner();
        let t = RunId::parse("t1").unwrap();
        for name in ["result.json", "tool_calls.json", "events/000002.jsonl", "actions/0007.py", "outputs/a/b.csv"] {
            let file = parse_task_file(name).unwrap();
            assert_eq!(task_key(&o, &t, &file), format!("{}{name}", task_prefix(&o, &t)));
        }
        assert_eq!(parse_task_file("b.csv").unwrap(), TaskFile::Output(RelativePath::parse("b.csv").unwrap()));
        assert!(parse_task_file("outputs/../result.json").is_err());
        assert!(parse_task_file("../../other/tasks/x/result.json").is_err());
    }
}

//! Turning how a tool command ended into the protocol's [`CallResult`].
//!
//! The tool command follows the exit codes of `toolyard.run` ([`exit_code`]): 0 with a JSON
//! result file, 1 a tool error, 2 invalid arguments, 3 a result that is not JSON; a message
//! for the user in the error file. Anything else (a missing or non-JSON result file, another
//! exit code, a signal) is classified here with a message that says what happened.

use serde_json::Value;
use toolyard_api::protocol::{CallErrorKind, CallResult, exit_code};

use crate::capture::truncate_chars;

/// Largest result file accepted.
pub const MAX_RESULT_BYTES: u64 = 4 * 1024 * 1024;
/// Longest error message kept from the error file.
pub const MAX_ERROR_MESSAGE: usize = 4096;

/// How the tool process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// It exited with this status code.
    Code(i32),
    /// A signal killed it.
    Signal(i32),
}

impl Exit {
    /// From the standard library's status.
    pub fn from_status(status: std::process::ExitStatus) -> Self {
        use std::os::unix::process::ExitStatusExt;
        match (status.code(), status.signal()) {
            (Some(code), _) => Exit::Code(code),
            (None, Some(signal)) => Exit::Signal(signal),
            // Neither: stopped/continued statuses are not reported by wait(); treat as a crash.
            (None, None) => Exit::Signal(0),
        }
    }
}

/// The result file as found after the tool ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResultFile {
    /// Not there (or empty: `toolyard.run` never writes an empty file).
    Missing,
    /// Larger than [`MAX_RESULT_BYTES`].
    TooLarge(u64),
    /// Its bytes.
    Bytes(Vec<u8>),
}

/// Reads the result file, bounded.
pub fn read_result_file(path: &std::path::Path) -> ResultFile {
    match std::fs::metadata(path) {
        Err(_) => ResultFile::Missing,
        Ok(meta) if meta.len() > MAX_RESULT_BYTES => ResultFile::TooLarge(meta.len()),
        Ok(_) => match std::fs::read(path) {
            Ok(bytes) if bytes.is_empty() => ResultFile::Missing,
            Ok(bytes) => ResultFile::Bytes(bytes),
            Err(_) => ResultFile::Missing,
        },
    }
}

/// Reads the error file's message, trimmed and bounded; `None` when absent or blank.
pub fn read_error_file(path: &std::path::Path) -> Option<String> {
    use std::io::Read;
    let file = std::fs::File::open(path).ok()?;
    let mut bytes = Vec::new();
    file.take(MAX_ERROR_MESSAGE as u64 * 2).read_to_end(&mut bytes).ok()?;
    let text = String::from_utf8_lossy(&bytes);
    let text = text.trim();
    (!text.is_empty()).then(|| truncate_chars(text, MAX_ERROR_MESSAGE))
}

/// Everything known about a finished tool process.
#[derive(Clone, Debug)]
pub struct Finished {
    /// How it ended.
    pub exit: Exit,
    /// The result file.
    pub result: ResultFile,
    /// The error file's message.
    pub error_message: Option<String>,
    /// The last non-empty line of stderr, for tools that wrote no error message.
    pub stderr_last_line: Option<String>,
    /// Wall time in milliseconds.
    pub duration_ms: u64,
}

/// Classifies a finished tool process.
pub fn classify(f: Finished) -> CallResult {
    let ms = f.duration_ms;
    let code = match f.exit {
        Exit::Signal(signal) => {
            let message = format!("the tool was killed by signal {}", signal_name(signal));
            return CallResult::err(CallErrorKind::Crashed, with_hint(message, &f.stderr_last_line), None, ms);
        }
        Exit::Code(code) => code,
    };
    if code == exit_code::OK {
        return match f.result {
            ResultFile::Bytes(bytes) => match parse_strict_json(&bytes) {
                Ok(value) => CallResult::ok(value, ms),
                Err(e) => CallResult::err(
                    CallErrorKind::BadResult,
                    format!("the tool's result file is not valid JSON: {e}"),
                    Some(code),
                    ms,
                ),
            },
            ResultFile::Missing => CallResult::err(
                CallErrorKind::BadResult,
                "the tool exited successfully but wrote no result file (TOOLYARD_RESULT_FILE)",
                Some(code),
                ms,
            ),
            ResultFile::TooLarge(size) => CallResult::err(
                CallErrorKind::BadResult,
                format!("the tool's result file has {size} bytes; the limit is {MAX_RESULT_BYTES}"),
                Some(code),
                ms,
            ),
        };
    }
    let kind = match code {
        exit_code::INVALID_ARGUMENTS => CallErrorKind::InvalidArguments,
        exit_code::BAD_RESULT => CallErrorKind::BadResult,
        _ => CallErrorKind::ToolError,
    };
    let message = match (f.error_message, code) {
        (Some(message), exit_code::TOOL_ERROR | exit_code::INVALID_ARGUMENTS | exit_code::BAD_RESULT) => message,
        (Some(message), _) => format!("the tool exited with status {code}: {message}"),
        (None, _) => {
            with_hint(format!("the tool exited with status {code} and wrote no error message"), &f.stderr_last_line)
        }
    };
    CallResult::err(kind, message, Some(code), ms)
}

fn with_hint(message: String, stderr_last_line: &Option<String>) -> String {
    match stderr_last_line {
        Some(line) => format!("{message}; last line of its stderr: {line}"),
        None => message,
    }
}

/// Parses JSON as the protocol requires it: standard JSON only (`NaN`, `Infinity` and numbers
/// out of the double range are refused).
pub fn parse_strict_json(bytes: &[u8]) -> Result<Value, serde_json::Error> {
    serde_json::from_slice(bytes)
}

/// `SIGKILL (9)` for a signal number.
pub fn signal_name(signal: i32) -> String {
    match nix::sys::signal::Signal::try_from(signal) {
        Ok(s) => format!("{} ({signal})", s.as_str()),
        Err(_) => format!("{signal}"),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn finished(exit: Exit, result: ResultFile, error_message: Option<&str>) -> Finished {
        Finished {
            exit,
            result,
            error_message: error_message.map(str::to_owned),
            stderr_last_line: Some("Traceback: boom".into()),
            duration_ms: 7,
        }
    }

    fn error_of(r: &CallResult) -> (CallErrorKind, &str) {
        let e = r.error.as_ref().expect("an error result");
        (e.kind, e.message.as_str())
    }

    #[test]
    fn exit_zero_with_a_json_file_is_the_value() {
        let r = classify(finished(Exit::Code(0), ResultFile::Bytes(br#"{"price":10.45}"#.to_vec()), None));
        assert_eq!(r, CallResult::ok(json!({"price": 10.45}), 7));
    }

    #[test]
    fn exit_zero_without_valid_json_is_a_bad_result_that_says_which() {
        let missing = classify(finished(Exit::Code(0), ResultFile::Missing, None));
        assert_eq!(error_of(&missing).0, CallErrorKind::BadResult);
        assert!(error_of(&missing).1.contains("wrote no result file"), "{missing:?}");

        for bad in [&b"{\"v\": NaN}"[..], b"Infinity", b"{\"v\": 1e999}", b"not json", b"{\"a\":1} trailing"] {
            let r = classify(finished(Exit::Code(0), ResultFile::Bytes(bad.to_vec()), None));
            assert_eq!(error_of(&r).0, CallErrorKind::BadResult, "{}", String::from_utf8_lossy(bad));
            assert!(error_of(&r).1.starts_with("the tool's result file is not valid JSON"), "{r:?}");
        }

        let big = classify(finished(Exit::Code(0), ResultFile::TooLarge(MAX_RESULT_BYTES + 1), None));
        assert!(error_of(&big).1.contains("limit"), "{big:?}");
    }

    #[test]
    fn python_runner_exit_codes_keep_their_messages() {
        let cases = [
            (1, CallErrorKind::ToolError, "RuntimeError: boom"),
            (2, CallErrorKind::InvalidArguments, "missing required argument 'spot'"),
            (3, CallErrorKind::BadResult, "result.value is NaN"),
        ];
        for (code, kind, message) in cases {
            let r = classify(finished(Exit::Code(code), ResultFile::Missing, Some(message)));
            assert_eq!(error_of(&r), (kind, message));
            assert_eq!(r.exit_code, Some(code));
        }
    }

    #[test]
    fn other_exits_and_signals_say_what_happened() {
        let r = classify(finished(Exit::Code(7), ResultFile::Missing, None));
        assert_eq!(
            error_of(&r),
            (
                CallErrorKind::ToolError,
                "the tool exited with status 7 and wrote no error message; last line of its stderr: Traceback: boom"
            )
        );
        let r = classify(finished(Exit::Code(7), ResultFile::Missing, Some("disk full")));
        assert_eq!(error_of(&r).1, "the tool exited with status 7: disk full");

        let r = classify(finished(Exit::Signal(11), ResultFile::Bytes(b"{}".to_vec()), None));
        assert_eq!(error_of(&r).0, CallErrorKind::Crashed);
        assert!(error_of(&r).1.starts_with("the tool was killed by signal SIGSEGV (11)"), "{r:?}");
        assert_eq!(r.exit_code, None);
    }

    #[test]
    fn error_file_is_trimmed_and_bounded() {
        let dir = std::env::temp_dir().join(format!("toolyard-outcome-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("error.txt");
        std::fs::write(&path, "  message \n").unwrap();
        assert_eq!(read_error_file(&path).as_deref(), Some("message"));
        std::fs::write(&path, "x".repeat(10_000)).unwrap();
        assert!(read_error_file(&path).unwrap().len() <= MAX_ERROR_MESSAGE);
        std::fs::write(&path, "\n").unwrap();
        assert_eq!(read_error_file(&path), None);
        assert_eq!(read_result_file(&dir.join("absent")), ResultFile::Missing);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

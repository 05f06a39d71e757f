//! JSON-RPC errors of the MCP layer, in one place.
//!
//! An unauthorized tool and an unknown tool produce the very same error (no existence leak).
//! Internal details never reach the client: [`from_error`] uses [`crate::Error::public_message`].

use rmcp::ErrorData;
use rmcp::model::ErrorCode;
use serde_json::json;

/// JSON-RPC error code of "server busy" (an admission limit refused the call; retry later).
pub const SERVER_BUSY: ErrorCode = ErrorCode(-32003);
/// JSON-RPC error code of "not authenticated" (no identity reached the handler).
pub const UNAUTHENTICATED: ErrorCode = ErrorCode(-32001);

/// `Unknown tool: <name>` — for unknown, unauthorized and out-of-scope tools alike.
pub fn unknown_tool(name: &str) -> ErrorData {
    ErrorData::invalid_params(crate::core::calls::unknown_tool_message(name), None)
}

/// Refused by an admission limit; `data.retryAfterSeconds` says when to try again.
pub fn busy(what: &str, retry_after_secs: u64) -> ErrorData {
    ErrorData::new(
        SERVER_BUSY,
        format!("server busy: {what}; retry later"),
        Some(json!({"retryAfterSeconds": retry_after_secs})),
    )
}

/// No authenticated identity (the auth layer is missing or did not run).
pub fn unauthenticated() -> ErrorData {
    ErrorData::new(UNAUTHENTICATED, "unauthenticated", None)
}

/// Invalid pagination cursor.
pub fn invalid_cursor() -> ErrorData {
    ErrorData::invalid_params("invalid cursor", None)
}

/// Maps a gateway error to a JSON-RPC error; internal failures are logged by the caller and
/// answered with a generic message.
pub fn from_error(error: &crate::Error, retry_after_secs: u64) -> ErrorData {
    use crate::Error as E;
    match error {
        E::Busy(what) => busy(what, retry_after_secs),
        E::NotFound(_) | E::InvalidRequest(_) | E::TooLarge(_) => {
            ErrorData::invalid_params(error.public_message(), None)
        }
        E::Unauthenticated(_) => unauthenticated(),
        E::Forbidden(_) => ErrorData::invalid_request(error.public_message(), None),
        E::Timeout(_) | E::Unavailable(_) | E::Kube(_) | E::Storage(_) | E::Internal(_) => {
            ErrorData::internal_error(error.public_message(), None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_tool_message_is_bounded_and_quoted() {
        let e = unknown_tool(&"x".repeat(1000));
        assert_eq!(e.code, ErrorCode::INVALID_PARAMS);
        assert!(e.message.len() < 100, "{}", e.message);
        assert_eq!(unknown_tool("a\"b").message, "Unknown tool: \"a\\\"b\"");
    }

    #[test]
    fn internal_errors_do_not_leak_details() {
        let e = from_error(&crate::Error::Storage("s3://bucket/owners/abc: AccessDenied".into()), 1);
        assert_eq!(e.code, ErrorCode::INTERNAL_ERROR);
        assert!(!e.message.contains("bucket"), "{}", e.message);
        let b = from_error(&crate::Error::Busy("too many calls".into()), 2);
        assert_eq!(b.code, SERVER_BUSY);
        assert_eq!(b.data, Some(json!({"retryAfterSeconds": 2})));
    }
}

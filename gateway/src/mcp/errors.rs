//! JSON-RPC errors of the MCP layer, in one place.
//!
//! An unauthorized tool and an unknown tool produce the very same error (no existence leak).
//! Internal details never reach the client: [`from_error`] uses [`crate::Error::public_message`].

use rmcp::ErrorData;
use rmcp::model::{
    CallToolRequestMethod, CallToolRequestParams, CancelTaskMethod, ConstString, DiscoverRequestMethod, ErrorCode,
    GetTaskMethod, InitializeResultMethod, ListResourceTemplatesRequestMethod, ListResourcesRequestMethod,
    ListToolsRequestMethod, PingRequestMethod, ReadResourceRequestMethod, SubscriptionsListenRequestMethod,
};
use serde_json::{Value, json};

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

/// The methods this server answers. rmcp reads each into its own request type; a request of
/// one of them that does not fit that type reaches the handler as a custom request.
const SERVED_METHODS: &[&str] = &[
    CallToolRequestMethod::VALUE,
    ListToolsRequestMethod::VALUE,
    ListResourcesRequestMethod::VALUE,
    ListResourceTemplatesRequestMethod::VALUE,
    ReadResourceRequestMethod::VALUE,
    GetTaskMethod::VALUE,
    CancelTaskMethod::VALUE,
    SubscriptionsListenRequestMethod::VALUE,
    InitializeResultMethod::VALUE,
    DiscoverRequestMethod::VALUE,
    PingRequestMethod::VALUE,
];

/// Longest client text (a method name, a parse error quoting a value) echoed in an error.
const MAX_ECHO: usize = 200;

/// The answer to a request rmcp read as no request type it knows (a custom request): `-32602`
/// (invalid params) when the method is one this server answers, such as a `tools/call` without
/// `name` or with `arguments` that are not an object; `-32601` (method not found) otherwise.
pub fn unreadable_request(method: &str, params: Option<&Value>) -> ErrorData {
    if !SERVED_METHODS.contains(&method) {
        return ErrorData::new(ErrorCode::METHOD_NOT_FOUND, bounded(method.to_owned()), None);
    }
    let reason = if method == CallToolRequestMethod::VALUE {
        match params {
            None => "params with a tool `name` are required".to_owned(),
            Some(params) => serde_json::from_value::<CallToolRequestParams>(params.clone())
                .err()
                .map_or_else(|| "params do not fit tools/call".to_owned(), |e| e.to_string()),
        }
    } else {
        format!("params do not fit {method}")
    };
    ErrorData::invalid_params(bounded(format!("Invalid params: {reason}")), None)
}

/// `text` cut to [`MAX_ECHO`] bytes (at a character boundary).
fn bounded(mut text: String) -> String {
    if text.len() > MAX_ECHO {
        text.truncate(text.floor_char_boundary(MAX_ECHO));
        text.push('…');
    }
    text
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
    fn unreadable_requests_of_served_methods_have_invalid_params() {
        let no_name = unreadable_request("tools/call", Some(&json!({"arguments": {"x": 1}})));
        assert_eq!(no_name.code, ErrorCode::INVALID_PARAMS);
        assert!(no_name.message.contains("missing field `name`"), "{}", no_name.message);
        let list_arguments = unreadable_request("tools/call", Some(&json!({"name": "t", "arguments": [1]})));
        assert_eq!(list_arguments.code, ErrorCode::INVALID_PARAMS);
        assert_eq!(unreadable_request("tools/call", None).code, ErrorCode::INVALID_PARAMS);
        assert_eq!(unreadable_request("resources/read", Some(&json!({}))).code, ErrorCode::INVALID_PARAMS);
        let long = unreadable_request("tools/call", Some(&json!({"name": 5, "arguments": "x".repeat(10_000)})));
        assert!(long.message.len() <= MAX_ECHO + '…'.len_utf8(), "{}", long.message);

        let unknown = unreadable_request("tools/explode", Some(&json!({})));
        assert_eq!((unknown.code, unknown.message.as_ref()), (ErrorCode::METHOD_NOT_FOUND, "tools/explode"));
        assert!(unreadable_request(&"m".repeat(10_000), None).message.len() <= MAX_ECHO + '…'.len_utf8());
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

//! Opaque `tools/list` cursors.
//!
//! A cursor names the last tool of the previous page (tools are listed by name), so paging
//! works on any replica and stays consistent when tools come and go between pages: a new
//! tool sorting after the cursor shows up, a deleted one simply is not there.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;

const PREFIX: &str = "ty1:";
/// Longest cursor accepted (a tool name is at most 64 characters).
const MAX_LEN: usize = 256;

/// The cursor that continues after `last_name`.
pub fn encode_cursor(last_name: &str) -> String {
    B64.encode(format!("{PREFIX}{last_name}"))
}

/// The tool name a cursor continues after; `None` for anything not made by [`encode_cursor`].
pub fn decode_cursor(cursor: &str) -> Option<String> {
    if cursor.len() > MAX_LEN {
        return None;
    }
    let bytes = B64.decode(cursor).ok()?;
    let text = String::from_utf8(bytes).ok()?;
    text.strip_prefix(PREFIX).map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_junk() {
        assert_eq!(decode_cursor(&encode_cursor("price_option")).as_deref(), Some("price_option"));
        for junk in ["", "!!!", "dHkxOg", &"a".repeat(300), "aGVsbG8"] {
            let decoded = decode_cursor(junk);
            assert!(decoded.is_none() || decoded.as_deref() == Some(""), "{junk:?} -> {decoded:?}");
        }
        assert_eq!(decode_cursor("aGVsbG8"), None, "base64 of 'hello' has no prefix");
    }
}

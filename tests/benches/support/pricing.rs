//! The pricing example's `price_option` call the benches make, and the check that counts an
//! answer: only an answer with the right price is a correct one.

use serde_json::{Value, json};

use super::loadgen;

/// The call's arguments (a one-year at-the-money call: price 10.4506).
pub fn arguments() -> Value {
    json!({"spot": 100, "strike": 100, "time_to_expiry": 1, "volatility": 0.2, "rate": 0.05})
}

/// A stateless `tools/call` of `tool` with [`arguments`], as request number `id`.
pub fn call_body(tool: &str, id: u64) -> Vec<u8> {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": arguments()}})
        .to_string()
        .into_bytes()
}

/// The answer carries the right price, from the structured result or from the text content
/// (the SDK server's dict).
pub fn priced(answer: &loadgen::Answer) -> bool {
    let Some(answer) = answer.json_text().and_then(|text| serde_json::from_str::<Value>(text).ok()) else {
        return false;
    };
    let result = &answer["result"];
    let price = result["structuredContent"]["price"].as_f64().or_else(|| {
        let text = result["content"][0]["text"].as_str()?;
        serde_json::from_str::<Value>(text).ok()?["price"].as_f64()
    });
    result.get("isError") != Some(&json!(true)) && price.is_some_and(|p| (p - 10.4506).abs() < 1e-3)
}

//! Checking an McpTool manifest the way the Kubernetes API server checks the object: against
//! the CRD's generated OpenAPI schema (types, bounds, enums, required and unknown fields)
//! and its CEL rules, with the API server's wording. The local tool folder uses it, so a
//! manifest that loads locally also applies to a cluster and the other way round.
//!
//! The schema is `McpTool::crd()` itself, so a new bound in the types is checked here without
//! a change. CEL rules are not interpreted: each rule string of the schema maps to a Rust
//! check in [`cel_rule`]; a unit test fails when the schema has a rule without one.

use serde_json::{Map, Value};
use toolyard_api::mcptool::{RESERVED_NAME_RULE, RESERVED_TOOL_NAMES};

/// One problem, at a field path like `spec.runtime.env[0].name`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// Dotted path of the field (empty for the document itself).
    pub field: String,
    /// What is wrong, in the API server's words.
    pub message: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.field.is_empty() { f.write_str(&self.message) } else { write!(f, "{}: {}", self.field, self.message) }
    }
}

/// The `openAPIV3Schema` of the McpTool CRD.
pub fn mcptool_schema() -> Value {
    openapi_schema::<toolyard_api::McpTool>()
}

/// The `openAPIV3Schema` of the McpServer CRD.
pub fn mcpserver_schema() -> Value {
    openapi_schema::<toolyard_api::McpServer>()
}

/// The `openAPIV3Schema` of the McpPrompt CRD.
pub fn mcpprompt_schema() -> Value {
    openapi_schema::<toolyard_api::McpPrompt>()
}

fn openapi_schema<K: kube::CustomResourceExt>() -> Value {
    let crd = serde_json::to_value(K::crd()).unwrap_or_default();
    crd.pointer("/spec/versions/0/schema/openAPIV3Schema").cloned().unwrap_or_default()
}

/// Checks `doc` (a whole McpTool manifest) against `schema`; `apiVersion`, `kind` and
/// `metadata` are the caller's (the API server checks them apart from the schema too).
pub fn check_document(doc: &Value, schema: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let Some(map) = doc.as_object() else {
        errors.push(FieldError { field: String::new(), message: "a manifest must be a mapping".into() });
        return errors;
    };
    let mut body = map.clone();
    for meta in ["apiVersion", "kind", "metadata"] {
        body.remove(meta);
    }
    check(&Value::Object(body), schema, "", &mut errors);
    errors
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() { key.to_owned() } else { format!("{path}.{key}") }
}

fn short(value: &Value) -> String {
    let text = value.to_string();
    if text.len() > 64 {
        format!("{}...", &text[..text.char_indices().nth(60).map_or(text.len(), |(i, _)| i)])
    } else {
        text
    }
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_matches(expected: &str, value: &Value) -> bool {
    match expected {
        "number" => value.is_number(),
        "integer" => value.as_f64().is_some_and(|f| f.fract() == 0.0),
        other => type_name(value) == other,
    }
}

fn check(value: &Value, schema: &Value, path: &str, errors: &mut Vec<FieldError>) {
    let Some(schema) = schema.as_object() else { return };
    let mut push = |message: String| errors.push(FieldError { field: path.to_owned(), message });
    if value.is_null() {
        // Optional fields are `nullable`; a null is the field left out.
        if !schema.get("nullable").and_then(Value::as_bool).unwrap_or(false) && schema.contains_key("type") {
            push(format!(
                "Invalid value: \"null\": {path} in body must be of type {}",
                schema["type"].as_str().unwrap_or("?")
            ));
        }
        return;
    }
    if schema.get("x-kubernetes-int-or-string").and_then(Value::as_bool) == Some(true) {
        if !(value.is_string() || value.as_f64().is_some_and(|f| f.fract() == 0.0)) {
            push(format!("Invalid value: {}: {path} in body must be of type integer or string", short(value)));
        }
        return;
    }
    if let Some(expected) = schema.get("type").and_then(Value::as_str)
        && !type_matches(expected, value)
    {
        push(format!(
            "Invalid value: \"{}\": {path} in body must be of type {expected}: {}",
            type_name(value),
            short(value)
        ));
        return;
    }
    if let Some(options) = schema.get("enum").and_then(Value::as_array)
        && !options.contains(value)
    {
        let supported: Vec<String> = options.iter().map(|o| o.to_string()).collect();
        push(format!("Unsupported value: {}: supported values: {}", short(value), supported.join(", ")));
    }
    match value {
        Value::String(s) => {
            let chars = s.chars().count() as u64;
            if let Some(max) = schema.get("maxLength").and_then(Value::as_u64)
                && chars > max
            {
                push(format!("Too long: may not be more than {max} bytes"));
            }
            if let Some(min) = schema.get("minLength").and_then(Value::as_u64)
                && chars < min
            {
                push(format!("Invalid value: {}: {path} in body should be at least {min} chars long", short(value)));
            }
        }
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or(f64::NAN);
            if let Some(max) = schema.get("maximum").and_then(Value::as_f64)
                && x > max
            {
                push(format!("Invalid value: {n}: {path} in body should be less than or equal to {max}"));
            }
            if let Some(min) = schema.get("minimum").and_then(Value::as_f64)
                && x < min
            {
                push(format!("Invalid value: {n}: {path} in body should be greater than or equal to {min}"));
            }
        }
        Value::Array(items) => {
            let n = items.len() as u64;
            if let Some(max) = schema.get("maxItems").and_then(Value::as_u64)
                && n > max
            {
                push(format!("Too many: {n}: must have at most {max} items"));
            }
            if let Some(min) = schema.get("minItems").and_then(Value::as_u64)
                && n < min
            {
                push(format!("Invalid value: {n}: {path} in body should have at least {min} items"));
            }
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    check(item, item_schema, &format!("{path}[{i}]"), errors);
                }
            }
        }
        Value::Object(map) => check_object(map, schema, path, errors),
        _ => {}
    }
    if let Some(rules) = schema.get("x-kubernetes-validations").and_then(Value::as_array) {
        for rule in rules {
            let text = rule.get("rule").and_then(Value::as_str).unwrap_or_default();
            let message = rule.get("message").and_then(Value::as_str).unwrap_or(text);
            match cel_rule(text) {
                Some(holds) if !holds(value) => errors.push(FieldError {
                    field: path.to_owned(),
                    message: format!("Invalid value: {}: {message}", short_kind(value)),
                }),
                Some(_) => {}
                None => errors.push(FieldError {
                    field: path.to_owned(),
                    message: format!("rule not supported locally: {text}"),
                }),
            }
        }
    }
}

/// How the API server names a value in a CEL rule failure.
fn short_kind(value: &Value) -> String {
    format!("\"{}\"", type_name(value))
}

fn check_object(map: &Map<String, Value>, schema: &Map<String, Value>, path: &str, errors: &mut Vec<FieldError>) {
    if let Some(required) = schema.get("required").and_then(Value::as_array) {
        for name in required.iter().filter_map(Value::as_str) {
            if map.get(name).is_none_or(Value::is_null) {
                errors.push(FieldError { field: join(path, name), message: "Required value".into() });
            }
        }
    }
    let properties = schema.get("properties").and_then(Value::as_object);
    let additional = schema.get("additionalProperties");
    let preserve = schema.get("x-kubernetes-preserve-unknown-fields").and_then(Value::as_bool) == Some(true);
    for (key, child) in map {
        let child_path = join(path, key);
        match (properties.and_then(|p| p.get(key)), additional) {
            (Some(child_schema), _) => check(child, child_schema, &child_path, errors),
            (None, Some(additional_schema)) if additional_schema.is_object() => {
                check(child, additional_schema, &child_path, errors)
            }
            (None, _) if preserve => {}
            (None, _) => {
                errors.push(FieldError { field: String::new(), message: format!("unknown field \"{child_path}\"") })
            }
        }
    }
}

type Rule = fn(&Value) -> bool;

/// The Rust check of a CEL rule of the McpTool and McpServer schemas, by its exact text.
pub fn cel_rule(rule: &str) -> Option<Rule> {
    let check: Rule = match rule {
        "self.mode == 'Pool' || !has(self.pool)" => {
            |v| v.get("mode").and_then(Value::as_str) == Some("Pool") || v.get("pool").is_none_or(Value::is_null)
        }
        "self.matches('^[A-Za-z_][A-Za-z0-9_]*$')" => |v| v.as_str().is_some_and(is_identifier),
        "self == '' || self.matches('^[A-Za-z_][A-Za-z0-9_]*$')" => {
            |v| v.as_str().is_some_and(|s| s.is_empty() || is_identifier(s))
        }
        RESERVED_NAME_RULE => |v| v.as_str().is_some_and(|s| !RESERVED_TOOL_NAMES.contains(&s)),
        "!self.startsWith('TOOLYARD_') && self != 'TRACEPARENT'" => {
            |v| v.as_str().is_some_and(|s| !s.starts_with("TOOLYARD_") && s != "TRACEPARENT")
        }
        "has(self.value) != has(self.secretKeyRef)" => {
            |v| v.get("value").is_some_and(|x| !x.is_null()) != v.get("secretKeyRef").is_some_and(|x| !x.is_null())
        }
        "self.all(e, self.exists_one(f, f.name == e.name))" | "self.all(v, self.exists_one(w, w.name == v.name))" => {
            |v| unique(v, "name")
        }
        "self.all(v, self.exists_one(w, w.mountPath == v.mountPath))" => |v| unique(v, "mountPath"),
        "[has(self.configMap), has(self.secret), has(self.persistentVolumeClaim)].filter(x, x).size() == 1" => |v| {
            ["configMap", "secret", "persistentVolumeClaim"]
                .iter()
                .filter(|k| v.get(**k).is_some_and(|x| !x.is_null()))
                .count()
                == 1
        },
        "self.startsWith('/') && self != '/' && self != '/tmp' && !self.startsWith('/tmp/') && self != '/toolyard' && !self.startsWith('/toolyard/')" => {
            |v| {
                v.as_str().is_some_and(|s| {
                    s.starts_with('/')
                        && s != "/"
                        && s != "/tmp"
                        && !s.starts_with("/tmp/")
                        && s != "/toolyard"
                        && !s.starts_with("/toolyard/")
                })
            }
        }
        "!self.contains(' ')" => |v| v.as_str().is_some_and(|s| !s.contains(' ')),
        "self.startsWith('/') && !self.contains(' ')" => {
            |v| v.as_str().is_some_and(|s| s.starts_with('/') && !s.contains(' '))
        }
        "has(self.url) != has(self.runtime)" => |v| present(v, "url") != present(v, "runtime"),
        "has(self.runtime) || !has(self.streamableHttp)" => |v| present(v, "runtime") || !present(v, "streamableHttp"),
        "has(self.runtime) || (!has(self.replicas) && !has(self.placement))" => {
            |v| present(v, "runtime") || (!present(v, "replicas") && !present(v, "placement"))
        }
        "has(self.url) || !has(self.auth)" => |v| present(v, "url") || !present(v, "auth"),
        "self.startsWith('https://') || self.startsWith('http://')" => {
            |v| v.as_str().is_some_and(|s| s.starts_with("https://") || s.starts_with("http://"))
        }
        "self.matches('^[A-Za-z0-9-]+$')" => {
            |v| v.as_str().is_some_and(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
        }
        "self.matches('^[A-Za-z0-9-]*$')" => {
            |v| v.as_str().is_some_and(|s| s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
        }
        "self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')" => |v| v.as_str().is_some_and(is_dns_label),
        _ => return None,
    };
    Some(check)
}

/// CEL's `has(v.key)`: the field is set (and not null).
fn present(v: &Value, key: &str) -> bool {
    v.get(key).is_some_and(|x| !x.is_null())
}

/// Every element of the array `v` has a `key` no other element has.
fn unique(v: &Value, key: &str) -> bool {
    let values: Vec<&Value> = v.as_array().map(|a| a.iter().filter_map(|e| e.get(key)).collect()).unwrap_or_default();
    values.iter().all(|x| values.iter().filter(|y| *y == x).count() == 1)
}

/// `^[A-Za-z_][A-Za-z0-9_]*$`
pub fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A Kubernetes object name (DNS-1123 subdomain): lowercase alphanumerics, '-' and '.', at most 253.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(|label| label.len() <= 63 && is_dns_label(label))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Every CEL rule and every keyword of the generated schema is checked here; a new one
    /// in the types must be added before local manifests can drift from the cluster's rules.
    #[test]
    fn every_rule_and_keyword_of_the_generated_schema_is_implemented() {
        const KNOWN: &[&str] = &[
            "type",
            "properties",
            "required",
            "items",
            "additionalProperties",
            "enum",
            "maxLength",
            "minLength",
            "maximum",
            "minimum",
            "maxItems",
            "minItems",
            "nullable",
            "x-kubernetes-validations",
            "x-kubernetes-preserve-unknown-fields",
            "x-kubernetes-int-or-string",
            "description",
            "default",
            "format",
            "anyOf",
            "title",
            "x-kubernetes-list-type",
            "x-kubernetes-list-map-keys",
            "x-kubernetes-map-type",
        ];
        fn walk(schema: &Value, path: &str) {
            let Some(map) = schema.as_object() else { return };
            for (key, child) in map {
                assert!(KNOWN.contains(&key.as_str()), "keyword {key:?} at {path} is not checked locally");
                match key.as_str() {
                    "properties" => {
                        child.as_object().unwrap().iter().for_each(|(k, s)| walk(s, &format!("{path}.{k}")))
                    }
                    "items" | "additionalProperties" => walk(child, path),
                    "anyOf" => child.as_array().unwrap().iter().for_each(|s| walk(s, path)),
                    "x-kubernetes-validations" => {
                        for rule in child.as_array().unwrap() {
                            let text = rule["rule"].as_str().unwrap();
                            assert!(cel_rule(text).is_some(), "CEL rule {text:?} at {path} has no local check");
                        }
                    }
                    _ => {}
                }
            }
        }
        for schema in [mcptool_schema(), mcpserver_schema(), mcpprompt_schema()] {
            assert!(schema.get("properties").is_some(), "schema found");
            walk(&schema, "");
        }
    }

    fn doc(spec: Value) -> Value {
        json!({"apiVersion": "toolyard.dev/v1alpha1", "kind": "McpTool", "metadata": {"name": "t"}, "spec": spec})
    }

    fn spec() -> Value {
        json!({"name": "t", "description": "d", "inputSchema": {"type": "object"}, "runtime": {"image": "i", "command": ["python3"]}})
    }

    fn errors(spec: Value) -> Vec<String> {
        check_document(&doc(spec), &mcptool_schema()).iter().map(ToString::to_string).collect()
    }

    #[test]
    fn a_minimal_manifest_passes_and_nulls_are_absent_fields() {
        assert_eq!(errors(spec()), Vec::<String>::new());
        let mut s = spec();
        s["title"] = Value::Null;
        s["runtime"]["env"] = json!([{"name": "A", "value": "1", "secretKeyRef": null}]);
        assert_eq!(errors(s), Vec::<String>::new());
    }

    #[test]
    fn errors_name_the_field_in_the_api_servers_words() {
        let mut s = spec();
        s["execution"] = json!({"timeoutSeconds": 0, "mode": "Lambda"});
        s["runtime"]["imagee"] = json!("x");
        s["runtime"]["env"] = json!([{"name": "TOOLYARD_X", "value": "1"}, {"name": "TOOLYARD_X", "value": "2"}]);
        s["inputSchema"] = json!({"type": "string"});
        let found = errors(s);
        for expected in [
            "spec.execution.timeoutSeconds: Invalid value: 0: spec.execution.timeoutSeconds in body should be greater than or equal to 1",
            "spec.execution.mode: Unsupported value: \"Lambda\": supported values: \"Job\", \"Pool\"",
            "unknown field \"spec.runtime.imagee\"",
            "spec.runtime.env[0].name: Invalid value: \"string\": TOOLYARD_* and TRACEPARENT are set by Toolyard",
            "spec.runtime.env: Invalid value: \"array\": environment variable names must be unique",
            "spec.inputSchema.type: Unsupported value: \"string\": supported values: \"object\"",
        ] {
            assert!(found.iter().any(|e| e == expected), "missing {expected:?} in {found:#?}");
        }
        let mut s = spec();
        s.as_object_mut().unwrap().remove("description");
        assert_eq!(errors(s), vec!["spec.description: Required value"]);
    }

    #[test]
    fn names() {
        assert!(is_identifier("price_option") && is_identifier("_x1"));
        assert!(!is_identifier("1x") && !is_identifier("a-b") && !is_identifier(""));
        assert!(is_dns_subdomain("get-quote.v1") && !is_dns_subdomain("Get") && !is_dns_subdomain("a..b"));
    }
}

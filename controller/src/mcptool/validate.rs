//! McpTool checks the CRD schema cannot express: the schemas compile as JSON Schema, the image
//! reference is well-formed, names fit where they are used. Every problem names its field.

use std::fmt;

use serde_json::Value;
use toolyard_api::mcptool::{ExecutionMode, McpToolSpec, Runtime};

use super::image;

/// One problem with an McpTool spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// JSON path of the field, e.g. `spec.inputSchema`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// All problems of a spec, joined for a condition message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid(pub Vec<Problem>);

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&parts.join("; "))
    }
}

/// Suffix of a pool's Deployment and Service names.
pub const POOL_SUFFIX: &str = toolyard_api::protocol::pool::SERVICE_SUFFIX;

/// Checks an McpTool named `object_name`.
pub fn check(object_name: &str, spec: &McpToolSpec) -> Result<(), Invalid> {
    let mut problems = Vec::new();
    let mut problem = |field: &str, message: String| problems.push(Problem { field: field.to_owned(), message });

    if let Err(e) = compile_schema(&spec.input_schema) {
        problem("spec.inputSchema", e);
    }
    if let Some(out) = &spec.output_schema
        && let Err(e) = compile_schema(out)
    {
        problem("spec.outputSchema", e);
    }
    if let Some(toolset) = &spec.toolset
        && !is_dns_label(toolset)
    {
        problem("spec.toolset", format!("{toolset:?} must be a DNS label (lowercase letters, digits, '-')"));
    }
    check_runtime(&spec.runtime, &mut problems);
    if spec.execution.mode == ExecutionMode::Pool
        && let Some(p) = check_service_name(object_name, POOL_SUFFIX, "a Pool-mode tool")
    {
        problems.push(p);
    }
    if problems.is_empty() { Ok(()) } else { Err(Invalid(problems)) }
}

/// The problems of a `runtime` (an McpTool's or an McpServer's), at `spec.runtime`.
pub fn check_runtime(runtime: &Runtime, problems: &mut Vec<Problem>) {
    let mut problem = |field: &str, message: String| problems.push(Problem { field: field.to_owned(), message });
    if let Err(e) = image::check(&runtime.image) {
        problem("spec.runtime.image", format!("{:?} is not a valid image reference: {e}", runtime.image));
    }
    if let Some(dir) = &runtime.working_dir
        && !dir.starts_with('/')
    {
        problem("spec.runtime.workingDir", format!("{dir:?} must be an absolute path"));
    }
    if let Some(sa) = &runtime.service_account_name
        && !is_dns_subdomain(sa)
    {
        problem("spec.runtime.serviceAccountName", format!("{sa:?} is not a valid ServiceAccount name"));
    }
    for (i, var) in runtime.env.iter().enumerate() {
        if let Some(r) = &var.secret_key_ref {
            if !is_dns_subdomain(&r.name) {
                problem(
                    &format!("spec.runtime.env[{i}].secretKeyRef.name"),
                    format!("{:?} is not a valid Secret name", r.name),
                );
            }
            if !is_secret_key(&r.key) {
                problem(
                    &format!("spec.runtime.env[{i}].secretKeyRef.key"),
                    format!("{:?} is not a valid Secret key (letters, digits, '-', '_', '.')", r.key),
                );
            }
        }
    }
    if let Some(resources) = &runtime.resources {
        for (section, map) in [("requests", &resources.requests), ("limits", &resources.limits)] {
            for (name, q) in map.iter().flatten() {
                if !is_quantity(&q.0) {
                    problem(
                        &format!("spec.runtime.resources.{section}.{name}"),
                        format!("{:?} is not a valid quantity (e.g. 100m, 0.5, 128Mi)", q.0),
                    );
                }
            }
        }
    }
}

/// A problem with `metadata.name` when `<object_name><suffix>` cannot name a Service (`what`
/// says whose: "a Pool-mode tool").
pub fn check_service_name(object_name: &str, suffix: &str, what: &str) -> Option<Problem> {
    let service = format!("{object_name}{suffix}");
    (!is_dns_label(&service) || !service.starts_with(|c: char| c.is_ascii_lowercase())).then(|| Problem {
        field: "metadata.name".into(),
        message: format!(
            "{what}'s name must start with a letter and be at most {} characters of lowercase letters, digits and '-' (it names the Service {service:?})",
            63 - suffix.len()
        ),
    })
}

/// Compiles a JSON Schema document without fetching anything: remote `$ref`s fail.
fn compile_schema(schema: &serde_json::Map<String, Value>) -> Result<(), String> {
    let value = Value::Object(schema.clone());
    match jsonschema::validator_for(&value) {
        Ok(_) => Ok(()),
        Err(e) => {
            let at = e.instance_path().to_string();
            if at.is_empty() {
                Err(format!("not a valid JSON Schema: {e}"))
            } else {
                Err(format!("not a valid JSON Schema at {at}: {e}"))
            }
        }
    }
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

fn is_secret_key(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Kubernetes quantity syntax: a signed decimal number with an optional binary (Ki..Ei),
/// decimal (n, u, m, k, M..E) or exponent suffix.
pub fn is_quantity(s: &str) -> bool {
    let s = s.strip_prefix(['+', '-']).unwrap_or(s);
    let digits_end = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (number, suffix) = s.split_at(digits_end);
    let number_ok = !number.is_empty()
        && number != "."
        && number.matches('.').count() <= 1
        && number.chars().any(|c| c.is_ascii_digit());
    let suffix_ok = matches!(
        suffix,
        "" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" | "n" | "u" | "m" | "k" | "M" | "G" | "T" | "P" | "E"
    ) || suffix
        .strip_prefix(['e', 'E'])
        .map(|e| e.strip_prefix(['+', '-']).unwrap_or(e))
        .is_some_and(|e| !e.is_empty() && e.chars().all(|c| c.is_ascii_digit()));
    number_ok && suffix_ok
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn spec(patch: serde_json::Value) -> McpToolSpec {
        let mut base = json!({
            "name": "price_option",
            "description": "d",
            "inputSchema": {"type": "object", "properties": {"spot": {"type": "number"}}},
            "runtime": {"image": "ghcr.io/toolyard/pricing:0.1.0", "command": ["python3"]},
        });
        merge(&mut base, patch);
        serde_json::from_value(base).unwrap()
    }

    fn merge(a: &mut Value, b: Value) {
        match (a, b) {
            (Value::Object(a), Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    fn fields(r: Result<(), Invalid>) -> Vec<String> {
        r.err().map(|i| i.0.into_iter().map(|p| p.field).collect()).unwrap_or_default()
    }

    #[test]
    fn a_good_tool_passes() {
        assert_eq!(check("price-option", &spec(json!({}))), Ok(()));
        let pool = spec(json!({"execution": {"mode": "Pool", "pool": {"replicas": 2}}}));
        assert_eq!(check("get-quote", &pool), Ok(()));
    }

    #[test]
    fn a_schema_that_does_not_compile_names_the_field_and_place() {
        let bad = spec(json!({"inputSchema": {"type": "object", "properties": {"spot": {"type": "nonsense"}}}}));
        let err = check("t", &bad).unwrap_err();
        assert_eq!(err.0[0].field, "spec.inputSchema");
        assert!(err.to_string().contains("/properties/spot/type"), "{err}");
        let bad_out = spec(json!({"outputSchema": {"type": "object", "required": "price"}}));
        assert_eq!(fields(check("t", &bad_out)), ["spec.outputSchema"]);
    }

    #[test]
    fn remote_refs_are_never_fetched() {
        let remote = spec(json!({"inputSchema": {"type": "object", "$ref": "https://example.com/schema.json"}}));
        assert_eq!(fields(check("t", &remote)), ["spec.inputSchema"]);
    }

    #[test]
    fn image_and_names_are_checked() {
        let bad = spec(json!({
            "runtime": {
                "image": "GHCR.io/Toolyard/Pricing",
                "workingDir": "app",
                "serviceAccountName": "Not_Valid",
                "env": [{"name": "K", "secretKeyRef": {"name": "s", "key": "bad/key"}}],
                "resources": {"limits": {"memory": "lots"}},
            },
        }));
        let all = fields(check("t", &bad));
        assert_eq!(
            all,
            [
                "spec.runtime.image",
                "spec.runtime.workingDir",
                "spec.runtime.serviceAccountName",
                "spec.runtime.env[0].secretKeyRef.key",
                "spec.runtime.resources.limits.memory",
            ]
        );
    }

    #[test]
    fn pool_names_must_fit_a_service_name() {
        let pool = spec(json!({"execution": {"mode": "Pool"}}));
        assert_eq!(fields(check(&"a".repeat(59), &pool)), ["metadata.name"]);
        assert_eq!(fields(check("1tool", &pool)), ["metadata.name"]);
        assert_eq!(fields(check("my.tool", &pool)), ["metadata.name"]);
        assert_eq!(check(&"a".repeat(58), &pool), Ok(()));
        assert_eq!(check("my.tool", &spec(json!({}))), Ok(()), "Job mode needs no Service");
    }

    #[test]
    fn quantities() {
        for ok in ["1", "0.5", "100m", "128Mi", "1Gi", "1e3", "1.5E-2", "+2k", ".5"] {
            assert!(is_quantity(ok), "{ok}");
        }
        for bad in ["", "lots", "1Mb", "1..2", "m", "1e", ".", "1 Gi"] {
            assert!(!is_quantity(bad), "{bad}");
        }
    }
}

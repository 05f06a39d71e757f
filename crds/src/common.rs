//! Small types shared by several resources, and schema helpers for the CRD generator.

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

use crate::owner::OwnerKey;

/// The authenticated identity a `ToolCall` or `CodingTask` runs as.
///
/// Set by the gateway from the caller's credentials, never from client input; an admission
/// policy rejects objects whose owner differs from the requester unless the gateway sent them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Owner {
    /// Who vouched for the identity: `apikey`, an OIDC issuer URL, `kubernetes` or `local`.
    #[schemars(length(min = 1, max = 512))]
    pub issuer: String,
    /// User name (subject) as the issuer knows it.
    #[schemars(length(min = 1, max = 512))]
    pub user: String,
    /// Groups of the user at the time of the request.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 256)))]
    pub groups: Vec<String>,
}

impl Owner {
    /// The storage key of this identity (`owners/<key>/...`).
    pub fn key(&self) -> OwnerKey {
        OwnerKey::derive(&self.issuer, &self.user)
    }
}

/// A key of a Secret in the object's namespace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// Name of the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key inside the Secret's data.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// Schema of a free-form JSON object field (tool schemas, metrics): kept as written.
pub fn free_form_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// Schema of an embedded JSON Schema document: an object whose `type` must be `object`
/// (MCP requires tool input and output schemas to describe objects); everything else is kept.
pub fn json_schema_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
        "required": ["type"],
        "properties": {
            "type": {"type": "string", "enum": ["object"]},
        },
    })
}

/// Same as [`json_schema_object`] for an optional field.
pub fn optional_json_schema_object(generator: &mut SchemaGenerator) -> Schema {
    json_schema_object(generator)
}

/// `conditions` list schema: standard Kubernetes conditions, a map keyed by `type`.
pub fn conditions_schema(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = <Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>>::json_schema(generator);
    let object = schema.ensure_object();
    object.insert("x-kubernetes-list-type".into(), "map".into());
    object.insert("x-kubernetes-list-map-keys".into(), serde_json::json!(["type"]));
    object.insert("maxItems".into(), 16.into());
    schema
}

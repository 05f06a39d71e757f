//! Prompts operators declare (McpPrompt objects, or manifests in local mode), served next to
//! the upstream servers' prompts under the object's name.
//!
//! `prompts/get` puts each argument's value in place of its `{{name}}` (an optional argument
//! not given: nothing), after checking the arguments: no unknown one, every required one,
//! values that are text, and one of `values` where the argument lists them. Completions offer
//! those `values` that start with what the client typed.
//!
//! On Kubernetes, [`DeclaredPrompts::watch`] keeps them current with one watch per served
//! namespace (or one cluster-wide). When two McpPrompts of served namespaces have the same
//! name, the oldest is served (then namespace order), as for tools.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Arc, Mutex, RwLock};

use kube::runtime::reflector::Store;
use kube::{Api, ResourceExt};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;
use toolyard_api::McpPrompt;
use toolyard_api::mcpprompt::{McpPromptSpec, PromptRole, placeholders};

use super::kube::reflect_all;
use super::manifest::FieldError;
use super::{CompletionSource, Prompt, PromptError, PromptSource};

/// Most completion values returned at once (MCP's limit).
const MAX_COMPLETIONS: usize = 100;

/// The served prompt of McpPrompt `name` in `namespace`, or why its messages do not fit its
/// arguments (a `{{name}}` that names none of them).
pub fn declared_prompt(namespace: &str, name: &str, spec: &McpPromptSpec) -> Result<Prompt, FieldError> {
    let declared: BTreeSet<&str> = spec.arguments.iter().map(|a| a.name.as_str()).collect();
    for (i, message) in spec.messages.iter().enumerate() {
        for (_, placeholder) in placeholders(&message.text) {
            if !declared.contains(placeholder) {
                let known = if declared.is_empty() {
                    "it declares no arguments".to_owned()
                } else {
                    format!("its arguments are {}", declared.iter().copied().collect::<Vec<_>>().join(", "))
                };
                return Err(FieldError {
                    field: format!("spec.messages[{i}].text"),
                    message: format!("{{{{{placeholder}}}}} names no argument ({known})"),
                });
            }
        }
    }
    let arguments: Vec<Value> = spec
        .arguments
        .iter()
        .map(|a| {
            let mut argument = json!({"name": a.name, "required": a.required});
            if let Some(description) = &a.description {
                argument["description"] = description.clone().into();
            }
            argument
        })
        .collect();
    let mut listing = json!({"name": name, "description": spec.description});
    if let Some(title) = &spec.title {
        listing["title"] = title.clone().into();
    }
    if !arguments.is_empty() {
        listing["arguments"] = arguments.into();
    }
    let template = Arc::new(Template { spec: spec.clone() });
    Ok(Prompt {
        namespace: namespace.to_owned(),
        object_name: name.to_owned(),
        declared: true,
        name: name.to_owned(),
        upstream_name: name.to_owned(),
        toolset: spec.toolset.clone(),
        listing,
        required: spec.arguments.iter().filter(|a| a.required).map(|a| a.name.clone()).collect(),
        source: template.clone(),
        completer: template,
    })
}

/// An McpPrompt's messages and arguments: renders `prompts/get` and offers completions.
struct Template {
    spec: McpPromptSpec,
}

impl Template {
    /// The arguments' values as text, checked against the declared arguments.
    fn values(&self, name: &str, arguments: &Map<String, Value>) -> Result<BTreeMap<String, String>, PromptError> {
        let invalid = |m: String| Err(PromptError::InvalidArguments(m));
        let mut values = BTreeMap::new();
        for (key, value) in arguments {
            let Some(declared) = self.spec.arguments.iter().find(|a| &a.name == key) else {
                let shown: String = key.chars().take(64).collect();
                let takes: Vec<&str> = self.spec.arguments.iter().map(|a| a.name.as_str()).collect();
                let takes = if takes.is_empty() { "no arguments".to_owned() } else { takes.join(", ") };
                return invalid(format!("prompt {name:?} has no argument {shown:?}; it takes: {takes}"));
            };
            let Some(text) = value.as_str() else {
                return invalid(format!("argument {key:?} must be a string"));
            };
            if !declared.values.is_empty() && !declared.values.iter().any(|v| v == text) {
                return invalid(format!("argument {key:?} must be one of: {}", declared.values.join(", ")));
            }
            values.insert(key.clone(), text.to_owned());
        }
        let missing: Vec<&str> = self
            .spec
            .arguments
            .iter()
            .filter(|a| a.required && !values.contains_key(&a.name))
            .map(|a| a.name.as_str())
            .collect();
        if !missing.is_empty() {
            return invalid(format!("missing required arguments: {}", missing.join(", ")));
        }
        Ok(values)
    }
}

/// `text` with each `{{name}}` replaced by `values[name]` (nothing when not given).
fn render(text: &str, values: &BTreeMap<String, String>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut from = 0;
    for (range, name) in placeholders(text) {
        out.push_str(&text[from..range.start]);
        out.push_str(values.get(name).map_or("", String::as_str));
        from = range.end;
    }
    out.push_str(&text[from..]);
    out
}

#[async_trait::async_trait]
impl PromptSource for Template {
    async fn get(&self, name: &str, arguments: Map<String, Value>) -> Result<Value, PromptError> {
        let values = self.values(name, &arguments)?;
        let messages: Vec<Value> = self
            .spec
            .messages
            .iter()
            .map(|m| {
                let role = match m.role {
                    PromptRole::User => "user",
                    PromptRole::Assistant => "assistant",
                };
                json!({"role": role, "content": {"type": "text", "text": render(&m.text, &values)}})
            })
            .collect();
        Ok(json!({"description": self.spec.description, "messages": messages}))
    }
}

#[async_trait::async_trait]
impl CompletionSource for Template {
    async fn complete(&self, request: Value) -> Result<Value, String> {
        let argument = request.pointer("/argument/name").and_then(Value::as_str).unwrap_or_default();
        let typed = request.pointer("/argument/value").and_then(Value::as_str).unwrap_or_default().to_lowercase();
        let matching: Vec<&String> = self
            .spec
            .arguments
            .iter()
            .filter(|a| a.name == argument)
            .flat_map(|a| &a.values)
            .filter(|v| v.to_lowercase().starts_with(&typed))
            .collect();
        let total = matching.len();
        let values: Vec<&String> = matching.into_iter().take(MAX_COMPLETIONS).collect();
        Ok(json!({"completion": {"values": values, "total": total, "hasMore": total > MAX_COMPLETIONS}}))
    }
}

/// The McpPrompts of the served namespaces, kept current by watches.
pub struct DeclaredPrompts {
    /// Invalid objects already logged, by (uid, generation).
    warned: Mutex<HashSet<(String, i64)>>,
    /// The (uid, generation) of each watched object at the last rebuild: a relist that
    /// changes nothing tells nobody.
    seen: Mutex<Vec<(String, i64)>>,
    served: RwLock<Vec<Arc<Prompt>>>,
    changed: Box<dyn Fn() + Send + Sync>,
}

impl std::fmt::Debug for DeclaredPrompts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeclaredPrompts").field("served", &self.list().len()).finish_non_exhaustive()
    }
}

impl DeclaredPrompts {
    /// Starts watching the McpPrompts of `apis` (one per served namespace, or one for all)
    /// until `shutdown`; `changed` is called after each change of the served set.
    pub fn watch(
        apis: Vec<Api<McpPrompt>>,
        shutdown: CancellationToken,
        changed: impl Fn() + Send + Sync + 'static,
    ) -> Arc<Self> {
        let this = Arc::new(Self {
            warned: Mutex::default(),
            seen: Mutex::default(),
            served: RwLock::default(),
            changed: Box::new(changed),
        });
        let rebuilt = this.clone();
        reflect_all(apis, "McpPrompts", shutdown, move |stores| {
            rebuilt.rebuild(stores.iter().flat_map(Store::state).collect());
        });
        this
    }

    /// Recomputes the served prompts from the watched objects.
    fn rebuild(&self, mut objects: Vec<Arc<McpPrompt>>) {
        objects.sort_by(|a, b| {
            (a.creation_timestamp(), a.namespace(), a.name_any()).cmp(&(
                b.creation_timestamp(),
                b.namespace(),
                b.name_any(),
            ))
        });
        let fingerprint: Vec<(String, i64)> =
            objects.iter().map(|o| (o.uid().unwrap_or_default(), o.metadata.generation.unwrap_or_default())).collect();
        {
            let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            if *seen == fingerprint {
                return;
            }
            *seen = fingerprint;
        }
        let mut served: BTreeMap<String, Arc<Prompt>> = BTreeMap::new();
        let mut warned = self.warned.lock().unwrap_or_else(|e| e.into_inner());
        for object in objects {
            let (namespace, name) = (object.namespace().unwrap_or_default(), object.name_any());
            let seen = (object.uid().unwrap_or_default(), object.metadata.generation.unwrap_or_default());
            if served.contains_key(&name) {
                if warned.insert(seen) {
                    tracing::warn!(%namespace, %name, "McpPrompt left out: an older McpPrompt has the same name");
                }
                continue;
            }
            match declared_prompt(&namespace, &name, &object.spec) {
                Ok(prompt) => {
                    served.insert(name, Arc::new(prompt));
                }
                Err(e) => {
                    if warned.insert(seen) {
                        tracing::warn!(%namespace, %name, error = %e, "McpPrompt left out");
                    }
                }
            }
        }
        drop(warned);
        *self.served.write().unwrap_or_else(|e| e.into_inner()) = served.into_values().collect();
        (self.changed)();
    }

    /// The served prompts, sorted by name.
    pub fn list(&self) -> Vec<Arc<Prompt>> {
        self.served.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use toolyard_api::mcpprompt::{PromptArgument, PromptMessage};

    use super::*;

    fn spec() -> McpPromptSpec {
        McpPromptSpec {
            title: Some("Price check".into()),
            description: "Prices an option.".into(),
            arguments: vec![
                PromptArgument {
                    name: "ticker".into(),
                    description: Some("The underlying.".into()),
                    required: true,
                    values: vec!["AAPL".into(), "AMD".into(), "MSFT".into()],
                },
                PromptArgument { name: "note".into(), description: None, required: false, values: Vec::new() },
            ],
            messages: vec![
                PromptMessage { role: PromptRole::User, text: "Price {{ticker}}.{{ note }}".into() },
                PromptMessage { role: PromptRole::Assistant, text: "Pricing {{ticker}} {not a placeholder}.".into() },
            ],
            toolset: None,
        }
    }

    fn args(pairs: &[(&str, Value)]) -> Map<String, Value> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect()
    }

    #[tokio::test]
    async fn a_declared_prompt_renders_its_arguments_and_checks_them() {
        let prompt = declared_prompt("ns", "price-check", &spec()).unwrap();
        assert_eq!(prompt.listing["title"], "Price check");
        assert_eq!(
            prompt.listing["arguments"][0],
            json!({"name": "ticker", "description": "The underlying.", "required": true})
        );
        assert_eq!(prompt.required, ["ticker"]);
        let got = prompt.source.get("price-check", args(&[("ticker", json!("MSFT"))])).await.unwrap();
        assert_eq!(got["messages"][0], json!({"role": "user", "content": {"type": "text", "text": "Price MSFT."}}));
        assert_eq!(got["messages"][1]["content"]["text"], "Pricing MSFT {not a placeholder}.");
        let got =
            prompt.source.get("price-check", args(&[("ticker", json!("AAPL")), ("note", json!(" Quickly."))])).await;
        assert_eq!(got.unwrap()["messages"][0]["content"]["text"], "Price AAPL. Quickly.");

        for (arguments, expect) in [
            (args(&[("ticker", json!("IBM"))]), "argument \"ticker\" must be one of: AAPL, AMD, MSFT"),
            (args(&[("ticker", json!(1))]), "argument \"ticker\" must be a string"),
            (
                args(&[("ticker", json!("AAPL")), ("strike", json!("1"))]),
                "has no argument \"strike\"; it takes: ticker, note",
            ),
            (args(&[]), "missing required arguments: ticker"),
        ] {
            match prompt.source.get("price-check", arguments).await {
                Err(PromptError::InvalidArguments(message)) => assert!(message.contains(expect), "{message}"),
                other => panic!("expected invalid arguments ({expect}), got {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn completions_are_the_listed_values_starting_with_what_was_typed() {
        let prompt = declared_prompt("ns", "price-check", &spec()).unwrap();
        let complete = |name: &str, value: &str| {
            prompt.completer.complete(json!({"ref": {"type": "ref/prompt", "name": "price-check"}, "argument": {"name": name, "value": value}}))
        };
        assert_eq!(
            complete("ticker", "a").await.unwrap()["completion"],
            json!({"values": ["AAPL", "AMD"], "total": 2, "hasMore": false})
        );
        assert_eq!(complete("ticker", "").await.unwrap()["completion"]["total"], 3);
        assert_eq!(complete("note", "x").await.unwrap()["completion"]["values"], json!([]));
    }

    #[test]
    fn a_placeholder_naming_no_argument_is_refused() {
        let mut spec = spec();
        spec.messages[1].text = "{{tickr}}".into();
        let error = declared_prompt("ns", "p", &spec).unwrap_err().to_string();
        assert_eq!(error, "spec.messages[1].text: {{tickr}} names no argument (its arguments are note, ticker)");
    }
}

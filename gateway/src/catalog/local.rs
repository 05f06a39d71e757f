//! [`ToolCatalog`] from McpTool manifests in a folder (the embedded local mode).
//!
//! Every `*.yaml` / `*.yml` file of the folder (not its subfolders) is read, each document
//! must be an McpTool, an McpServer or an McpPrompt (`toolyard.dev/v1alpha1`), and each is checked as the
//! API server would ([`super::manifest`]) plus what only matters locally (no Secrets to read).
//! All problems are reported at once, each naming the file, the document and the field. The
//! McpServers are connected to by [`crate::upstream::Upstreams`].

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use serde_json::Value;
use tokio::sync::watch;
use toolyard_api::{McpPrompt, McpServer, McpServerSpec, McpTool};

use super::manifest::{self, FieldError};
use super::{Prompt, Tool, ToolCatalog, compile_schema};

/// One problem in one document of one file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManifestError {
    /// The file.
    pub file: PathBuf,
    /// 1-based document number inside the file (0: the file as a whole).
    pub document: usize,
    /// The problem.
    pub error: FieldError,
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.document == 0 {
            write!(f, "{}: {}", self.file.display(), self.error)
        } else {
            write!(f, "{} (document {}): {}", self.file.display(), self.document, self.error)
        }
    }
}

/// Why a tool folder could not be loaded: every problem found.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct LoadError(pub Vec<ManifestError>);

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.len();
        writeln!(f, "{n} problem{} in the tool manifests:", if n == 1 { "" } else { "s" })?;
        for e in &self.0 {
            writeln!(f, "  {e}")?;
        }
        Ok(())
    }
}

/// A loaded tool and where it came from.
#[derive(Clone, Debug)]
pub struct LocalTool {
    /// The tool.
    pub tool: Arc<Tool>,
    /// The manifest file.
    pub file: PathBuf,
    /// 1-based document number in the file.
    pub document: usize,
}

/// A loaded McpServer and where it came from.
#[derive(Clone, Debug)]
pub struct LocalServer {
    /// Its `metadata.name`.
    pub name: String,
    /// Its spec, defaults applied.
    pub spec: McpServerSpec,
    /// The manifest file.
    pub file: PathBuf,
    /// 1-based document number in the file.
    pub document: usize,
}

/// A loaded McpPrompt and where it came from.
#[derive(Clone, Debug)]
pub struct LocalPrompt {
    /// The prompt.
    pub prompt: Arc<Prompt>,
    /// The manifest file.
    pub file: PathBuf,
    /// 1-based document number in the file.
    pub document: usize,
}

/// What a folder's manifests declare.
#[derive(Clone, Debug, Default)]
pub struct Loaded {
    /// The McpTools.
    pub tools: Vec<LocalTool>,
    /// The McpServers.
    pub servers: Vec<LocalServer>,
    /// The McpPrompts.
    pub prompts: Vec<LocalPrompt>,
}

/// Tools from a folder of manifests.
#[derive(Debug)]
pub struct LocalCatalog {
    dir: PathBuf,
    tools: RwLock<Vec<LocalTool>>,
    prompts: RwLock<Vec<Arc<Prompt>>>,
    servers: Vec<LocalServer>,
    version: watch::Sender<u64>,
}

impl LocalCatalog {
    /// Loads every manifest of `dir`.
    pub fn load(dir: &Path) -> Result<Self, LoadError> {
        let Loaded { tools, servers, prompts } = load_dir(dir)?;
        Ok(Self {
            dir: dir.to_owned(),
            tools: RwLock::new(tools),
            prompts: RwLock::new(served_prompts(prompts)),
            servers,
            version: watch::Sender::new(1),
        })
    }

    /// The McpServers of the folder (as loaded at start).
    pub fn servers(&self) -> &[LocalServer] {
        &self.servers
    }

    /// The folder the manifests come from (working directories are relative to it).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The tools with their origins.
    pub fn local_tools(&self) -> Vec<LocalTool> {
        self.tools.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Reads the folder again; on success the tools and prompts are replaced and watchers are
    /// told. On failure the current ones stay.
    pub fn reload(&self) -> Result<(), LoadError> {
        let loaded = load_dir(&self.dir)?;
        *self.tools.write().unwrap_or_else(|e| e.into_inner()) = loaded.tools;
        *self.prompts.write().unwrap_or_else(|e| e.into_inner()) = served_prompts(loaded.prompts);
        self.version.send_modify(|v| *v += 1);
        Ok(())
    }
}

impl ToolCatalog for LocalCatalog {
    fn tools(&self) -> Arc<[Arc<Tool>]> {
        let mut tools: Vec<Arc<Tool>> =
            self.tools.read().unwrap_or_else(|e| e.into_inner()).iter().map(|t| Arc::clone(&t.tool)).collect();
        tools.sort_by(|a, b| a.name().cmp(b.name()));
        tools.into()
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    fn is_synced(&self) -> bool {
        true
    }

    fn prompts(&self) -> Vec<Arc<Prompt>> {
        self.prompts.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The prompts, sorted by name.
fn served_prompts(loaded: Vec<LocalPrompt>) -> Vec<Arc<Prompt>> {
    let mut prompts: Vec<Arc<Prompt>> = loaded.into_iter().map(|p| p.prompt).collect();
    prompts.sort_by(|a, b| a.name.cmp(&b.name));
    prompts
}

/// The manifest files of `dir`, sorted.
fn manifest_files(dir: &Path) -> Result<Vec<PathBuf>, LoadError> {
    let whole = |message: String| {
        LoadError(vec![ManifestError {
            file: dir.to_owned(),
            document: 0,
            error: FieldError { field: String::new(), message },
        }])
    };
    let entries = std::fs::read_dir(dir).map_err(|e| whole(format!("cannot read the tool folder: {e}")))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(whole("no *.yaml or *.yml files with McpTool or McpServer manifests in this folder".into()));
    }
    Ok(files)
}

/// The schemas documents are checked against.
pub struct Schemas {
    tool: Value,
    server: Value,
    prompt: Value,
}

impl Schemas {
    /// The McpTool, McpServer and McpPrompt schemas.
    pub fn new() -> Self {
        Self {
            tool: manifest::mcptool_schema(),
            server: manifest::mcpserver_schema(),
            prompt: manifest::mcpprompt_schema(),
        }
    }
}

impl Default for Schemas {
    fn default() -> Self {
        Self::new()
    }
}

fn load_dir(dir: &Path) -> Result<Loaded, LoadError> {
    let schemas = Schemas::new();
    let mut errors = Vec::new();
    let mut loaded = Loaded::default();
    for file in manifest_files(dir)? {
        match std::fs::read_to_string(&file) {
            Ok(text) => load_file(&file, &text, &schemas, &mut loaded, &mut errors),
            Err(e) => errors.push(error(&file, 0, "", format!("cannot read the file: {e}"))),
        }
    }
    check_unique(&loaded, &mut errors);
    if errors.is_empty() { Ok(loaded) } else { Err(LoadError(errors)) }
}

fn error(file: &Path, document: usize, field: &str, message: impl Into<String>) -> ManifestError {
    ManifestError {
        file: file.to_owned(),
        document,
        error: FieldError { field: field.into(), message: message.into() },
    }
}

/// Parses the documents of one file into tools and servers, or errors.
pub fn load_file(file: &Path, text: &str, schemas: &Schemas, loaded: &mut Loaded, errors: &mut Vec<ManifestError>) {
    let docs: Vec<Value> = match serde_saphyr::from_multiple(text) {
        Ok(docs) => docs,
        Err(e) => {
            errors.push(error(file, 0, "", format!("not valid YAML: {e}")));
            return;
        }
    };
    for (i, doc) in docs.into_iter().enumerate() {
        let n = i + 1;
        if doc.is_null() {
            continue; // an empty document (e.g. a leading `---`)
        }
        let before = errors.len();
        let kind = doc.get("kind").and_then(Value::as_str).unwrap_or_default();
        let api_version = doc.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
        if !["McpTool", "McpServer", "McpPrompt"].contains(&kind) {
            let found = if kind.is_empty() { "no kind".to_owned() } else { format!("kind {kind:?}") };
            errors.push(error(
                file,
                n,
                "kind",
                format!("{found}: a tool folder holds only McpTool, McpServer and McpPrompt manifests"),
            ));
            continue;
        }
        if api_version != toolyard_api::API_VERSION {
            errors.push(error(
                file,
                n,
                "apiVersion",
                format!("must be {:?}, not {api_version:?}", toolyard_api::API_VERSION),
            ));
            continue;
        }
        let name = doc.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_owned();
        let name = name.as_str();
        if name.is_empty() {
            errors.push(error(file, n, "metadata.name", "Required value"));
        } else if !manifest::is_dns_subdomain(name) {
            errors.push(error(
                file,
                n,
                "metadata.name",
                format!("Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'"),
            ));
        }
        let schema = match kind {
            "McpServer" => &schemas.server,
            "McpPrompt" => &schemas.prompt,
            _ => &schemas.tool,
        };
        for e in manifest::check_document(&doc, schema) {
            errors.push(ManifestError { file: file.to_owned(), document: n, error: e });
        }
        // Local mode has no Secrets to read (an McpServer's runtime is checked the same way).
        if let Some(env) = doc.pointer("/spec/runtime/env").and_then(Value::as_array) {
            for (j, var) in env.iter().enumerate() {
                if var.get("secretKeyRef").is_some_and(|r| !r.is_null()) {
                    errors.push(error(
                        file,
                        n,
                        &format!("spec.runtime.env[{j}].secretKeyRef"),
                        "not available in local mode (there are no Kubernetes Secrets); use `value` instead",
                    ));
                }
            }
        }
        if doc.pointer("/spec/runtime/volumes").and_then(Value::as_array).is_some_and(|v| !v.is_empty()) {
            errors.push(error(
                file,
                n,
                "spec.runtime.volumes",
                "not available in local mode (there are no ConfigMaps, Secrets or volume claims); put the files in \
                 the tool folder instead",
            ));
        }
        if kind == "McpServer" {
            load_server(file, n, &doc, before, loaded, errors);
            continue;
        }
        if kind == "McpPrompt" {
            if errors.len() == before {
                load_prompt(file, n, name, &doc, loaded, errors);
            }
            continue;
        }
        if errors.len() > before {
            continue;
        }
        let object: McpTool = match serde_path_to_error::deserialize(&doc) {
            Ok(o) => o,
            Err(e) => {
                errors.push(error(file, n, &e.path().to_string(), e.inner().to_string()));
                continue;
            }
        };
        if let Some(output) = &object.spec.output_schema
            && let Err(e) = compile_schema(&Value::Object(output.clone()))
        {
            errors.push(error(file, n, "spec.outputSchema", e.replace("inputSchema", "outputSchema")));
            continue;
        }
        match Tool::new(String::new(), name.to_owned(), 1, object.spec) {
            Ok(tool) => loaded.tools.push(LocalTool { tool: Arc::new(tool), file: file.to_owned(), document: n }),
            Err(e) => errors.push(error(file, n, "spec.inputSchema", e)),
        }
    }
}

/// An McpServer document already checked against the schema (`before`: the error count before
/// its checks).
fn load_server(
    file: &Path,
    n: usize,
    doc: &Value,
    before: usize,
    loaded: &mut Loaded,
    errors: &mut Vec<ManifestError>,
) {
    if doc.pointer("/spec/auth/secretKeyRef").is_some_and(|r| !r.is_null()) {
        errors.push(error(
            file,
            n,
            "spec.auth.secretKeyRef",
            "not available in local mode (there are no Kubernetes Secrets); use a server that needs no credential \
             locally, or run on a cluster",
        ));
    }
    if errors.len() > before {
        return;
    }
    match serde_path_to_error::deserialize::<_, McpServer>(doc) {
        Ok(object) => loaded.servers.push(LocalServer {
            name: object.metadata.name.unwrap_or_default(),
            spec: object.spec,
            file: file.to_owned(),
            document: n,
        }),
        Err(e) => errors.push(error(file, n, &e.path().to_string(), e.inner().to_string())),
    }
}

/// An McpPrompt document already checked against the schema, without errors.
fn load_prompt(file: &Path, n: usize, name: &str, doc: &Value, loaded: &mut Loaded, errors: &mut Vec<ManifestError>) {
    match serde_path_to_error::deserialize::<_, McpPrompt>(doc) {
        Ok(object) => match super::prompts::declared_prompt("", name, &object.spec) {
            Ok(prompt) => {
                loaded.prompts.push(LocalPrompt { prompt: Arc::new(prompt), file: file.to_owned(), document: n })
            }
            Err(e) => errors.push(ManifestError { file: file.to_owned(), document: n, error: e }),
        },
        Err(e) => errors.push(error(file, n, &e.path().to_string(), e.inner().to_string())),
    }
}

fn check_unique(loaded: &Loaded, errors: &mut Vec<ManifestError>) {
    let mut prompts: HashMap<&str, &LocalPrompt> = HashMap::new();
    for p in &loaded.prompts {
        if let Some(first) = prompts.insert(&p.prompt.name, p) {
            let message = format!(
                "McpPrompt {:?} is already defined in {} (document {})",
                p.prompt.name,
                first.file.display(),
                first.document
            );
            errors.push(error(&p.file, p.document, "metadata.name", message));
        }
    }
    let mut servers: HashMap<&str, &LocalServer> = HashMap::new();
    for s in &loaded.servers {
        if let Some(first) = servers.insert(&s.name, s) {
            let message = format!(
                "McpServer {:?} is already defined in {} (document {})",
                s.name,
                first.file.display(),
                first.document
            );
            errors.push(error(&s.file, s.document, "metadata.name", message));
        }
    }
    let tools = &loaded.tools;
    let mut by_name: HashMap<&str, &LocalTool> = HashMap::new();
    let mut by_object: HashMap<&str, &LocalTool> = HashMap::new();
    for t in tools {
        let place = |o: &LocalTool| format!("{} (document {})", o.file.display(), o.document);
        if let Some(first) = by_name.insert(t.tool.name(), t) {
            let message = format!("tool name {:?} is already used by {}", t.tool.name(), place(first));
            errors.push(error(&t.file, t.document, "spec.name", message));
        }
        if let Some(first) = by_object.insert(&t.tool.object_name, t) {
            let message = format!("McpTool {:?} is already defined in {}", t.tool.object_name, place(first));
            errors.push(error(&t.file, t.document, "metadata.name", message));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_text(text: &str) -> Result<Vec<LocalTool>, Vec<String>> {
        let (mut loaded, mut errors) = (Loaded::default(), Vec::new());
        load_file(Path::new("t.yaml"), text, &Schemas::new(), &mut loaded, &mut errors);
        check_unique(&loaded, &mut errors);
        if errors.is_empty() { Ok(loaded.tools) } else { Err(errors.iter().map(ToString::to_string).collect()) }
    }

    const TOOL: &str = "apiVersion: toolyard.dev/v1alpha1\nkind: McpTool\nmetadata: {name: echo}\nspec:\n  name: echo\n  description: d\n  inputSchema: {type: object}\n  runtime: {image: i, command: [python3]}\n";

    #[test]
    fn documents_load_with_defaults_applied() {
        let tools = load_text(&format!("---\n{TOOL}")).unwrap();
        assert_eq!(tools.len(), 1);
        assert_eq!(tools[0].tool.spec.execution.timeout_seconds, 60);
        assert_eq!(tools[0].document, 1, "an empty leading document is not counted");
    }

    #[test]
    fn other_kinds_duplicates_secrets_and_bad_schemas_name_file_document_and_field() {
        let text = format!(
            "{TOOL}---\nkind: Deployment\napiVersion: apps/v1\n---\n{TOOL}---\n{}---\n{}",
            TOOL.replace("name: echo\n  description", "name: e2\n  description")
                .replace("{name: echo}", "{name: e2}")
                .replace(
                    "command: [python3]}",
                    "command: [python3], env: [{name: K, secretKeyRef: {name: s, key: k}}]}"
                ),
            TOOL.replace("{name: echo}", "{name: e3}")
                .replace("name: echo\n", "name: e3\n")
                .replace("inputSchema: {type: object}", "inputSchema: {type: object, properties: {a: {type: 12}}}"),
        ) + &format!(
            "---\n{}---\n{}",
            TOOL.replace("{name: echo}", "{name: e4}").replace("name: echo\n", "name: e4\n").replace(
                "command: [python3]}",
                "command: [python3], volumes: [{name: data, mountPath: /data, configMap: {name: rates}}]}"
            ),
            TOOL.replace("{name: echo}", "{name: e5}").replace("name: echo\n", "name: e5\n").replace(
                "command: [python3]}",
                "command: [python3], volumes: [{name: data, mountPath: /tmp/x, configMap: {name: a}, secret: {name: b}}]}"
            ),
        );
        let errors = load_text(&text).unwrap_err();
        let expect = [
            "t.yaml (document 2): kind: kind \"Deployment\": a tool folder holds only McpTool, McpServer and McpPrompt manifests",
            "t.yaml (document 4): spec.runtime.env[0].secretKeyRef: not available in local mode",
            "t.yaml (document 5): spec.inputSchema: inputSchema is not a valid JSON Schema",
            "t.yaml (document 6): spec.runtime.volumes: not available in local mode",
            "t.yaml (document 7): spec.runtime.volumes[0]: Invalid value: \"object\": set exactly one of configMap, secret and persistentVolumeClaim",
            "t.yaml (document 7): spec.runtime.volumes[0].mountPath: Invalid value: \"string\": mountPath must be absolute",
            "t.yaml (document 7): spec.runtime.volumes: not available in local mode",
            "t.yaml (document 3): spec.name: tool name \"echo\" is already used by t.yaml (document 1)",
            "t.yaml (document 3): metadata.name: McpTool \"echo\" is already defined in t.yaml (document 1)",
        ];
        for e in expect {
            assert!(errors.iter().any(|x| x.starts_with(e)), "missing {e:?} in {errors:#?}");
        }
        assert_eq!(errors.len(), expect.len(), "{errors:#?}");
    }

    #[test]
    fn yaml_syntax_errors_name_the_file() {
        let errors = load_text("spec: [unclosed").unwrap_err();
        assert!(errors[0].starts_with("t.yaml: not valid YAML"), "{errors:?}");
    }
}

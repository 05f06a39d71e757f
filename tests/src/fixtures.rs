//! CRD fixtures under `crds/tests/fixtures/`: valid ones the apiserver must accept, invalid
//! ones it must reject with the message named on their first line (`# expect: ...`).

use std::path::PathBuf;

use anyhow::{Context, Result};
use kube::api::DynamicObject;

/// One fixture file.
#[derive(Debug)]
pub struct Fixture {
    /// File path.
    pub path: PathBuf,
    /// Objects in order. For an invalid fixture with two documents, the first is created
    /// and the second applied as an update that must fail.
    pub objects: Vec<DynamicObject>,
    /// Expected error substring (invalid fixtures).
    pub expect: Option<String>,
}

/// Loads every fixture of `kind` ("valid" or "invalid").
pub fn load(kind: &str) -> Result<Vec<Fixture>> {
    let dir = crate::repo_path("crds/tests/fixtures").join(kind);
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    paths.retain(|p| p.extension().is_some_and(|x| x == "yaml"));
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path)?;
            let expect = text.lines().next().and_then(|l| l.strip_prefix("# expect: ")).map(str::to_owned);
            let objects: Vec<DynamicObject> =
                serde_saphyr::from_multiple(&text).with_context(|| format!("parsing {}", path.display()))?;
            Ok(Fixture { path, objects, expect })
        })
        .collect()
}

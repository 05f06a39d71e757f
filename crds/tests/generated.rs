//! The committed CRD YAML matches the Rust types, and the fixtures are well-formed.
//! (The apiserver's verdict on every fixture is checked in `tests/` against a real cluster.)

use std::path::{Path, PathBuf};

use toolyard_api::{CodingTask, McpPrompt, McpTool, ToolCall};

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn committed_crd_yaml_matches_the_types() {
    let chart = crate_dir().join(toolyard_api::crdgen::CHART_CRDS_DIR);
    for (file, crd) in toolyard_api::crdgen::all() {
        for path in [crate_dir().join(file), chart.join(file)] {
            let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let generated = toolyard_api::crdgen::render(&crd);
            assert!(
                committed == generated,
                "{} is out of date: run `cargo run -p toolyard-api --bin crdgen`",
                path.display()
            );
        }
    }
}

#[test]
fn crd_files_are_the_same_in_the_crate_and_the_chart() {
    let chart = crate_dir().join(toolyard_api::crdgen::CHART_CRDS_DIR);
    let names = |dir: &Path| -> Vec<String> {
        yaml_files(dir).iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect()
    };
    assert_eq!(names(&crate_dir()), names(&chart), "the chart ships exactly the generated CRDs");
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

#[test]
fn valid_fixtures_deserialize_into_the_types() {
    let files = yaml_files(&crate_dir().join("tests/fixtures/valid"));
    assert!(files.len() >= 5);
    for path in files {
        let text = std::fs::read_to_string(&path).expect("read fixture");
        let value: serde_json::Value = serde_saphyr::from_str(&text).expect("fixture is YAML");
        let kind = value["kind"].as_str().expect("kind");
        let result = match kind {
            "McpTool" => serde_json::from_value::<McpTool>(value).map(drop),
            "McpPrompt" => serde_json::from_value::<McpPrompt>(value).map(drop),
            "ToolCall" => serde_json::from_value::<ToolCall>(value).map(drop),
            "CodingTask" => serde_json::from_value::<CodingTask>(value).map(drop),
            other => panic!("{}: unexpected kind {other}", path.display()),
        };
        result.unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}

#[test]
fn every_invalid_fixture_names_the_error_it_must_produce() {
    let files = yaml_files(&crate_dir().join("tests/fixtures/invalid"));
    assert!(files.len() >= 20);
    for path in files {
        let text = std::fs::read_to_string(&path).expect("read fixture");
        let first = text.lines().next().unwrap_or_default();
        let expect = first
            .strip_prefix("# expect: ")
            .unwrap_or_else(|| panic!("{}: first line must be '# expect: <message>'", path.display()));
        assert!(!expect.trim().is_empty(), "{}", path.display());
    }
}

#[test]
fn the_reserved_name_rule_lists_exactly_the_reserved_names() {
    let (_, crd) = toolyard_api::crdgen::all().into_iter().find(|(f, _)| *f == "mcptools.yaml").expect("McpTool CRD");
    let crd = serde_json::to_value(crd).expect("CRD as JSON");
    let rules =
        crd.pointer("/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/name/x-kubernetes-validations");
    let rule = rules
        .and_then(|r| r.as_array())
        .into_iter()
        .flatten()
        .filter_map(|r| r["rule"].as_str())
        .find(|r| r.starts_with("!(self in ["))
        .expect("a rule refusing reserved names");
    let listed: Vec<&str> = rule
        .trim_start_matches("!(self in [")
        .trim_end_matches("])")
        .split(", ")
        .map(|n| n.trim_matches('\''))
        .collect();
    assert_eq!(listed, toolyard_api::mcptool::RESERVED_TOOL_NAMES);
}

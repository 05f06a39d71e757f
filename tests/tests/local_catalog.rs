//! The local tool folder loads the same manifests the API server accepts and refuses the ones
//! it refuses, with the same messages (the CRD fixtures under crds/tests/fixtures), and the
//! example and fixture tool folders load.

use toolyard_gateway::catalog::ToolCatalog;
use toolyard_gateway::catalog::local::LocalCatalog;
use toolyard_tests::local::TempDir;
use toolyard_tests::repo_path;

fn load_one(fixture: &std::path::Path) -> Result<LocalCatalog, String> {
    let dir = TempDir::new("local-catalog");
    std::fs::copy(fixture, dir.path().join("tool.yaml")).expect("test setup");
    LocalCatalog::load(dir.path()).map_err(|e| e.to_string())
}

#[test]
fn every_invalid_mcptool_fixture_is_refused_with_the_api_servers_message() {
    let fixtures = toolyard_tests::fixtures::load("invalid").unwrap();
    let mut checked = 0;
    for fixture in fixtures.iter().filter(|f| f.path.file_name().unwrap().to_string_lossy().starts_with("mcptool-")) {
        let expect = fixture.expect.as_deref().expect("invalid fixtures name their error");
        let error = match load_one(&fixture.path) {
            Ok(_) => panic!("{} loaded but the API server refuses it with {expect:?}", fixture.path.display()),
            Err(e) => e,
        };
        assert!(error.contains(expect), "{}: expected {expect:?} in\n{error}", fixture.path.display());
        assert!(error.contains("tool.yaml (document 1)"), "the error names file and document: {error}");
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} McpTool fixtures found");
}

#[test]
fn valid_fixtures_load_except_secrets_which_local_mode_cannot_read() {
    let job = load_one(&repo_path("crds/tests/fixtures/valid/mcptool-job.yaml")).unwrap();
    assert_eq!(job.tools().len(), 1);
    let pool = load_one(&repo_path("crds/tests/fixtures/valid/mcptool-pool.yaml")).unwrap_err();
    assert!(pool.contains("spec.runtime.env[1].secretKeyRef: not available in local mode"), "{pool}");
    assert!(pool.starts_with("1 problem in the tool manifests"), "{pool}");
}

#[test]
fn the_example_and_fixture_folders_load() {
    let pricing = LocalCatalog::load(&repo_path("examples/pricing")).unwrap();
    let names: Vec<String> = pricing.tools().iter().map(|t| t.name().to_owned()).collect();
    assert_eq!(names, ["calc_greeks", "get_quote", "get_quote_fresh", "price_option"], "sorted by name");
    let misbehaving = LocalCatalog::load(&repo_path("tests/fixtures/misbehaving")).unwrap();
    assert!(misbehaving.get("hang").is_some_and(|t| t.spec.execution.timeout_seconds == 2));
    let empty = TempDir::new("local-catalog-empty");
    let error = LocalCatalog::load(empty.path()).unwrap_err().to_string();
    assert!(error.contains("no *.yaml or *.yml files"), "{error}");
}

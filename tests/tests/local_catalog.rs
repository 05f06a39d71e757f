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
fn every_invalid_mcptool_and_mcpprompt_fixture_is_refused_with_the_api_servers_message() {
    let fixtures = toolyard_tests::fixtures::load("invalid").unwrap();
    let mut checked = 0;
    let local = |f: &&toolyard_tests::fixtures::Fixture| {
        let name = f.path.file_name().unwrap().to_string_lossy().into_owned();
        name.starts_with("mcptool-") || name.starts_with("mcpprompt-")
    };
    for fixture in fixtures.iter().filter(local) {
        let expect = fixture.expect.as_deref().expect("invalid fixtures name their error");
        let error = match load_one(&fixture.path) {
            Ok(_) => panic!("{} loaded but the API server refuses it with {expect:?}", fixture.path.display()),
            Err(e) => e,
        };
        assert!(error.contains(expect), "{}: expected {expect:?} in\n{error}", fixture.path.display());
        assert!(error.contains("tool.yaml (document 1)"), "the error names file and document: {error}");
        checked += 1;
    }
    assert!(checked >= 14, "only {checked} McpTool and McpPrompt fixtures found");
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
    let prompts: Vec<String> = pricing.prompts().iter().map(|p| p.name.clone()).collect();
    assert_eq!(prompts, ["price-and-explain"]);
    let misbehaving = LocalCatalog::load(&repo_path("tests/fixtures/misbehaving")).unwrap();
    assert!(misbehaving.get("hang").is_some_and(|t| t.spec.execution.timeout_seconds == 2));
    let empty = TempDir::new("local-catalog-empty");
    let error = LocalCatalog::load(empty.path()).unwrap_err().to_string();
    assert!(error.contains("no *.yaml or *.yml files"), "{error}");
}

#[tokio::test]
async fn a_declared_prompt_loads_and_renders_and_a_placeholder_naming_no_argument_is_refused() {
    let catalog = load_one(&repo_path("crds/tests/fixtures/valid/mcpprompt.yaml")).unwrap();
    assert!(catalog.tools().is_empty());
    let prompts = catalog.prompts();
    let names: Vec<&str> = prompts.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["price-check"]);
    let prompt = &prompts[0];
    assert_eq!(
        (prompt.toolset.as_deref(), prompt.required.as_slice()),
        (Some("pricing"), ["ticker".to_owned()].as_slice())
    );
    let arguments = serde_json::json!({"ticker": "NVDA", "horizon": "30"}).as_object().unwrap().clone();
    let got = prompt.source.get(&prompt.upstream_name, arguments).await.expect("rendered");
    assert_eq!(
        got["messages"][0]["content"]["text"],
        "Price a call on NVDA expiring in 30 days with price_option, then explain the greeks."
    );
    assert_eq!(got["messages"][1]["role"], "assistant");

    let dir = TempDir::new("local-catalog-prompt");
    let text = std::fs::read_to_string(repo_path("crds/tests/fixtures/valid/mcpprompt.yaml")).unwrap();
    std::fs::write(dir.path().join("p.yaml"), format!("{text}---\n{text}")).unwrap();
    let error = LocalCatalog::load(dir.path()).unwrap_err().to_string();
    assert!(
        error.contains("p.yaml (document 2): metadata.name: McpPrompt \"price-check\" is already defined"),
        "{error}"
    );
    std::fs::write(dir.path().join("p.yaml"), text.replace("{{ticker}} expiring", "{{tickr}} expiring")).unwrap();
    let error = LocalCatalog::load(dir.path()).unwrap_err().to_string();
    assert!(
        error.contains("p.yaml (document 1): spec.messages[0].text: {{tickr}} names no argument (its arguments are horizon, ticker)"),
        "{error}"
    );
}

//! The `toolyard` command against the embedded local mode: `call` (arguments, errors,
//! progress), `prompts` and `prompt`, `test` (the pricing suite, failures with file and line, JUnit XML, timeouts,
//! malformed suites) and `check` (manifests, functions that drifted from their schemas, the
//! gateway, a refused token).

use crate::local_support;

use serde_json::Value;
use toolyard_tests::local::{self, CliRun, TempDir, toolyard};
use toolyard_tests::repo_path;

const TOKEN: &str = "ty_cli-local-test-token-0001";

async fn gateway(dir: &str, data: &TempDir) -> local_support::Running {
    local_support::start(dir, data, TOKEN, 8).await
}

fn assert_code(run: &CliRun, code: i32) {
    assert_eq!(run.code, code, "stdout:\n{}\nstderr:\n{}", run.stdout, run.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn call_and_test_the_pricing_tools_with_the_suite_in_the_repository() {
    let data = TempDir::new("cli-pricing");
    let gw = gateway("examples/pricing", &data).await;
    let url = gw.mcp_url();

    // key=value arguments follow the schema: numbers as numbers, `symbol` as a string.
    let priced = toolyard(
        &url,
        TOKEN,
        &["call", "price_option", "spot=100", "strike=100", "time_to_expiry=1", "volatility=0.2", "rate=0.05"],
    )
    .await;
    assert_code(&priced, 0);
    let answer: Value = serde_json::from_str(&priced.stdout).expect("the structured result as JSON");
    assert!((answer["price"].as_f64().unwrap() - 10.4506).abs() < 1e-4, "{answer}");
    let quote = toolyard(&url, TOKEN, &["call", "get_quote", "symbol=AAPL", "--json", "{}"]).await;
    assert_code(&quote, 0);
    assert!(quote.stdout.contains("\"currency\": \"USD\""), "{}", quote.stdout);

    // A tool's own error: exit code 1, its message on stderr.
    let refused = toolyard(
        &url,
        TOKEN,
        &["call", "price_option", "spot=-1", "strike=100", "time_to_expiry=1", "volatility=0.2", "rate=0.05"],
    )
    .await;
    assert_code(&refused, 1);
    assert!(refused.stderr.contains("spot must be a positive number"), "{}", refused.stderr);
    // Not a tool, or no way in: exit code 2 and what to do.
    let unknown = toolyard(&url, TOKEN, &["call", "price_optoin"]).await;
    assert_code(&unknown, 2);
    assert!(
        unknown.stderr.contains("no tool \"price_optoin\"") && unknown.stderr.contains("price_option"),
        "{}",
        unknown.stderr
    );
    let bad_token = toolyard(&url, "ty_wrong", &["tools"]).await;
    assert_code(&bad_token, 2);
    assert!(bad_token.stderr.contains("refused the token"), "{}", bad_token.stderr);

    // The example's prompt: listed with its arguments, got with their values in place.
    let listed = toolyard(&url, TOKEN, &["prompts"]).await;
    assert_code(&listed, 0);
    assert!(
        listed.stdout.contains("price-and-explain  Price and explain an option (kind*, spot*, strike*)"),
        "{}",
        listed.stdout
    );
    let got = toolyard(&url, TOKEN, &["prompt", "price-and-explain", "kind=call", "spot=100", "strike=95"]).await;
    assert_code(&got, 0);
    assert!(
        got.stdout.starts_with("[user]\nPrice a European call with spot 100 and strike 95 using price_option,"),
        "{}",
        got.stdout
    );
    let refused = toolyard(&url, TOKEN, &["prompt", "price-and-explain", "kind=swap", "spot=1", "strike=1"]).await;
    assert_code(&refused, 2);
    assert!(refused.stderr.contains("argument \"kind\" must be one of: call, put"), "{}", refused.stderr);

    // The repository's suite passes, with a JUnit report of every test.
    let junit = data.path().join("junit.xml");
    let suite = repo_path("examples/pricing/tests/suite.yaml");
    let run = toolyard(&url, TOKEN, &["test", suite.to_str().unwrap(), "--junit", junit.to_str().unwrap()]).await;
    assert_code(&run, 0);
    assert!(run.stdout.contains("pricing: 9 passed, 0 failed"), "{}", run.stdout);
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(xml.contains("tests=\"9\"") && xml.contains("failures=\"0\""), "{xml}");

    // A failing suite: each failure names the test, the file and line, and why.
    let failing = data.path().join("failing.yaml");
    std::fs::write(
        &failing,
        "tests:\n  - name: wrong price\n    call: price_option\n    arguments: {spot: 100, strike: 100, time_to_expiry: 1, volatility: 0.2, rate: 0.05}\n    expect:\n      values:\n        - {path: $.price, equals: 11, tolerance: 0.01}\n  - name: expects an error that does not come\n    call: get_quote\n    arguments: {symbol: MSFT}\n    expect: {isError: true}\n  - name: listing\n    tools: {includes: [price_option], excludes: [get_quote]}\n",
    )
    .unwrap();
    let run = toolyard(&url, TOKEN, &["test", failing.to_str().unwrap(), "--junit", junit.to_str().unwrap()]).await;
    assert_code(&run, 1);
    let at = failing.display();
    assert!(run.stdout.contains(&format!("FAIL  wrong price ({at}:2): $.price is 10.45")), "{}", run.stdout);
    assert!(run.stdout.contains("expected 11 (within 0.01)"), "{}", run.stdout);
    assert!(
        run.stdout.contains(&format!("FAIL  expects an error that does not come ({at}:8): answered no error")),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("tools/list lists [\"get_quote\"], which it must not"), "{}", run.stdout);
    assert!(run.stdout.contains("0 passed, 3 failed"), "{}", run.stdout);
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(xml.contains("failures=\"3\"") && xml.contains("$.price is 10.45"), "{xml}");

    // A malformed suite is refused before anything runs, with its file and line.
    let malformed = data.path().join("malformed.yaml");
    std::fs::write(&malformed, "tests:\n  - name: a\n    call: price_option\n    expcet: {isError: true}\n").unwrap();
    let run = toolyard(&url, TOKEN, &["test", malformed.to_str().unwrap()]).await;
    assert_code(&run, 2);
    assert!(
        run.stderr.contains(&malformed.display().to_string())
            && run.stderr.contains("expcet")
            && run.stderr.contains("line 4"),
        "{}",
        run.stderr
    );
    gw.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn progress_is_shown_and_a_timeout_can_be_expected() {
    let data = TempDir::new("cli-misbehaving");
    let gw = gateway("tests/fixtures/misbehaving", &data).await;
    let url = gw.mcp_url();

    let steps = toolyard(&url, TOKEN, &["call", "steps", "n=3", "pause=0.3"]).await;
    assert_code(&steps, 0);
    assert!(steps.stdout.contains("\"n\": 3"), "{}", steps.stdout);
    // Not a terminal: one line per notification, the last one complete.
    assert!(steps.stderr.lines().any(|l| l.starts_with("[100%] step 3 of 3")), "{}", steps.stderr);

    // A call that outlives --timeout is cancelled, and says so.
    let cut = toolyard(&url, TOKEN, &["call", "hang", "seconds=60", "--timeout", "1"]).await;
    assert_code(&cut, 2);
    assert!(cut.stderr.contains("no answer within 1 s; the call was cancelled"), "{}", cut.stderr);

    let suite = data.path().join("timeouts.yaml");
    std::fs::write(
        &suite,
        "tests:\n  - name: hang is cut off\n    call: hang\n    arguments: {seconds: 60}\n    timeout: 1\n    expect: {timeout: true}\n  - name: steps answers in time\n    call: steps\n    arguments: {n: 2, pause: 0.1}\n    timeout: 30\n    expect: {timeout: true}\n",
    )
    .unwrap();
    let run = toolyard(&url, TOKEN, &["test", suite.to_str().unwrap()]).await;
    assert_code(&run, 1);
    assert!(run.stdout.contains("PASS  hang is cut off"), "{}", run.stdout);
    assert!(
        run.stdout.contains("FAIL  steps answers in time") && run.stdout.contains("a timeout was expected"),
        "{}",
        run.stdout
    );

    // `--jobs 2`: two tests of a second each run at once, their lines in the suite's order.
    let together = data.path().join("together.yaml");
    let test = |name: &str| format!("  - name: {name}\n    call: steps\n    arguments: {{n: 2, pause: 0.5}}\n");
    std::fs::write(&together, format!("name: together\ntests:\n{}{}", test("first"), test("second"))).unwrap();
    let run = toolyard(&url, TOKEN, &["test", together.to_str().unwrap(), "--jobs", "2"]).await;
    assert_code(&run, 0);
    let seconds = |text: &str| -> f64 { text.trim_end_matches(')').trim_end_matches(" s").parse().unwrap() };
    let took: Vec<f64> = run
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("PASS  "))
        .map(|l| seconds(l.rsplit_once(" (").expect("a duration").1))
        .collect();
    assert!(run.stdout.find("PASS  first").unwrap() < run.stdout.find("PASS  second").unwrap(), "{}", run.stdout);
    let summary = run.stdout.lines().find(|l| l.starts_with("together: 2 passed, 0 failed in "));
    let total = seconds(summary.and_then(|l| l.rsplit_once(" in ")).expect("the summary").1);
    // One after another, the suite would take the sum of its tests; at once, about the longer.
    let (sum, shorter) = (took.iter().sum::<f64>(), took.iter().copied().fold(f64::MAX, f64::min));
    assert!(took.len() == 2 && total < sum - shorter / 2.0, "the tests overlapped: {}", run.stdout);
    let zero = toolyard(&url, TOKEN, &["test", together.to_str().unwrap(), "--jobs", "0"]).await;
    assert_code(&zero, 2);
    assert!(zero.stderr.contains("--jobs"), "{}", zero.stderr);
    gw.shutdown().await.unwrap();
}

fn line<'a>(run: &'a CliRun, check: &str) -> &'a str {
    run.stdout
        .lines()
        .find(|l| l.get(6..).is_some_and(|rest| rest.starts_with(check) && rest[check.len()..].starts_with(' ')))
        .unwrap_or_else(|| panic!("no {check} line in\n{}", run.stdout))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn check_passes_the_example_and_names_each_broken_part() {
    let data = TempDir::new("cli-check");
    let gw = gateway("examples/pricing", &data).await;
    let url = gw.mcp_url();
    let python = local::python();

    // The example and its gateway: every line passes.
    let pricing = repo_path("examples/pricing");
    let run = toolyard(&url, TOKEN, &["check", pricing.to_str().unwrap(), "--python", &python]).await;
    assert_code(&run, 0);
    for check in [
        "manifests",
        "function price_option",
        "function get_quote",
        "gateway.http",
        "gateway.token",
        "mcp.2025-11-25",
        "mcp.2026-07-28",
        "tools",
    ] {
        assert!(line(&run, check).starts_with("PASS"), "{check}: {}", run.stdout);
    }
    // What `check` reads: `/status`, for an authenticated caller only, about itself.
    let status_url = url.replace("/mcp", "/status");
    assert_eq!(reqwest::get(&status_url).await.unwrap().status(), reqwest::StatusCode::UNAUTHORIZED);
    let report: Value =
        reqwest::Client::new().get(&status_url).bearer_auth(TOKEN).send().await.unwrap().json().await.unwrap();
    assert_eq!(report["identity"]["user"], "local", "{report}");
    assert_eq!(report["storage"], serde_json::json!({"writable": true}), "{report}");
    assert_eq!((report["codingTasks"].as_bool(), report["models"].as_array().map(Vec::len)), (Some(true), Some(0)));
    let owners = std::fs::read_dir(data.path().join("owners")).unwrap().flatten().collect::<Vec<_>>();
    assert_eq!(owners.len(), 1, "one owner folder");
    assert!(owners[0].path().join("status/write-probe").is_file(), "the probe is under the caller's own prefix");

    // No model profile: a SKIP, and a FAIL when coding tasks are required.
    assert!(line(&run, "coding-tasks").starts_with("SKIP"), "{}", run.stdout);
    let run = toolyard(&url, TOKEN, &["check", "--require-agent", "--json"]).await;
    assert_code(&run, 1);
    let report: Value = serde_json::from_str(&run.stdout).expect("--json prints JSON");
    let agent = report["checks"].as_array().unwrap().iter().find(|c| c["check"] == "coding-tasks").unwrap();
    assert_eq!(agent["status"], "FAIL", "{report}");
    assert!(agent["detail"].as_str().unwrap().contains("no model profile"), "{report}");
    assert!(agent["fix"].as_str().unwrap().contains("model.profiles"), "{report}");

    // A refused token fails its own line, and the handshakes are skipped, not failed.
    let run = toolyard(&url, "ty_wrong", &["check"]).await;
    assert_code(&run, 1);
    assert!(
        line(&run, "gateway.token").starts_with("FAIL") && run.stdout.contains("refuses the token"),
        "{}",
        run.stdout
    );
    assert!(line(&run, "mcp.2025-11-25").starts_with("SKIP"), "{}", run.stdout);

    // Manifests that drifted from their functions, a function that does not import, and an
    // invalid manifest: each named on its own line.
    let broken = TempDir::new("cli-check-broken");
    std::fs::create_dir_all(broken.path().join("pricing")).unwrap();
    for file in ["__init__.py", "options.py", "quotes.py", "quotes.csv"] {
        std::fs::copy(pricing.join("pricing").join(file), broken.path().join("pricing").join(file)).unwrap();
    }
    let tools = std::fs::read_to_string(pricing.join("tools.yaml")).unwrap();
    let drifted = tools
        .replacen("      dividend_yield:", "      dividend:", 1)
        .replace("pricing.quotes:get_quote_fresh", "pricing.gone:get_quote_fresh");
    std::fs::write(broken.path().join("tools.yaml"), &drifted).unwrap();
    let run = toolyard(&url, TOKEN, &["check", broken.path().to_str().unwrap(), "--python", &python]).await;
    assert_code(&run, 1);
    let price = line(&run, "function price_option");
    assert!(
        price.starts_with("FAIL") && price.contains("the function has 'dividend_yield', the manifest does not"),
        "{}",
        run.stdout
    );
    assert!(line(&run, "function calc_greeks").starts_with("PASS"), "{}", run.stdout);
    let gone = line(&run, "function get_quote_fresh");
    assert!(gone.starts_with("FAIL") && gone.contains("pricing.gone"), "{}", run.stdout);

    let invalid = tools.replacen("timeoutSeconds: 30", "timeoutSeconds: -5", 1);
    assert_ne!(invalid, tools, "the example has a timeoutSeconds: 30 to break");
    std::fs::write(broken.path().join("tools.yaml"), &invalid).unwrap();
    let run = toolyard(&url, TOKEN, &["check", broken.path().to_str().unwrap()]).await;
    assert_code(&run, 1);
    let manifests = line(&run, "manifests");
    assert!(manifests.starts_with("FAIL") && manifests.contains("spec.execution.timeoutSeconds"), "{}", run.stdout);
    gw.shutdown().await.unwrap();
}

#[tokio::test]
async fn every_binary_says_its_version() {
    for name in ["toolyard", "toolyard-gateway", "toolyard-controller", "toolyard-runner", "crdgen"] {
        let out = tokio::process::Command::new(local::binary(name)).arg("--version").output().await.expect(name);
        assert!(out.status.success(), "{name}: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(text.trim(), format!("{name} {}", env!("CARGO_PKG_VERSION")), "{name}");
    }
}

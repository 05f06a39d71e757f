//! Running a suite: its tests in order (`--jobs` at once), a line per test in the suite's order,
//! a summary, JUnit XML on request.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures::StreamExt;
use rmcp::model::{CallToolResult, Tool};
use serde_json::{Map, Value, json};

use super::{Expect, Planned, ValueCheck};
use crate::call::content_text;
use crate::connect::{Client, Connection, error_chain};

/// `toolyard test`.
#[derive(Debug, clap::Args)]
pub struct TestArgs {
    /// The suite file (YAML)
    pub suite: PathBuf,
    /// Also write a JUnit XML report here
    #[arg(long)]
    pub junit: Option<PathBuf>,
    /// Run only the tests whose name contains this
    #[arg(long)]
    pub filter: Option<String>,
    /// Tests run at once (their lines still print in the suite's order)
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub jobs: u16,
}

/// Default seconds per call, and per coding task.
const CALL_TIMEOUT: u64 = 60;
const TASK_TIMEOUT: u64 = 900;

/// One test's outcome.
struct Outcome {
    name: String,
    line: u64,
    took: Duration,
    failure: Option<String>,
}

/// Runs the suite: exit code 0 when every test passed, 1 when one failed.
pub async fn run(conn: &Connection, args: TestArgs) -> Result<u8> {
    let (suite_name, suite_timeout, tests) = super::load(&args.suite)?;
    let tests: Vec<Planned> =
        tests.into_iter().filter(|p| args.filter.as_deref().is_none_or(|f| p.test.name.contains(f))).collect();
    let client = conn.connect(true).await?;
    // The tools' definitions (for output contracts) once; a `tools` test lists again.
    let catalog = client.list_all_tools().await.map_err(|e| anyhow::anyhow!("tools/list: {}", error_chain(&e)))?;
    let started = Instant::now();
    let mut outcomes = Vec::new();
    let mut finished = futures::stream::iter(&tests)
        .map(|planned| async {
            let begun = Instant::now();
            let failure = run_test(&client, &catalog, planned, suite_timeout).await.err();
            Outcome { name: planned.test.name.clone(), line: planned.line, took: begun.elapsed(), failure }
        })
        .buffered(usize::from(args.jobs));
    while let Some(outcome) = finished.next().await {
        match &outcome.failure {
            None => println!("PASS  {} ({:.2} s)", outcome.name, outcome.took.as_secs_f64()),
            Some(why) => println!("FAIL  {} ({}:{}): {why}", outcome.name, args.suite.display(), outcome.line),
        }
        outcomes.push(outcome);
    }
    drop(finished);
    let _ = client.cancel().await;
    let failed = outcomes.iter().filter(|o| o.failure.is_some()).count();
    println!(
        "\n{suite_name}: {} passed, {failed} failed in {:.1} s",
        outcomes.len() - failed,
        started.elapsed().as_secs_f64()
    );
    if let Some(path) = &args.junit {
        let xml = junit(&suite_name, &args.suite, &outcomes, started.elapsed())?;
        std::fs::write(path, xml).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(u8::from(failed > 0))
}

fn junit(name: &str, file: &std::path::Path, outcomes: &[Outcome], took: Duration) -> Result<String> {
    use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestSuite};
    let mut suite = TestSuite::new(name);
    suite.set_time(took);
    for o in outcomes {
        let status = match &o.failure {
            None => TestCaseStatus::success(),
            Some(why) => {
                let mut status = TestCaseStatus::non_success(NonSuccessKind::Failure);
                status.set_message(why.as_str());
                status
            }
        };
        let mut case = TestCase::new(o.name.as_str(), status);
        case.set_time(o.took);
        case.set_classname(format!("{}:{}", file.display(), o.line));
        suite.add_test_case(case);
    }
    let mut report = Report::new("toolyard test");
    report.add_test_suite(suite);
    report.to_string().context("writing the JUnit report")
}

async fn run_test(
    client: &Client,
    tools: &[Tool],
    planned: &Planned,
    suite_timeout: Option<u64>,
) -> Result<(), String> {
    let test = &planned.test;
    if let Some(listing) = &test.tools {
        let now = client.list_all_tools().await.map_err(|e| format!("tools/list: {}", error_chain(&e)))?;
        return check_listing(listing, &now);
    }
    let (name, arguments, default_timeout) = match (&test.call, &test.coding_task) {
        (Some(tool), _) => (tool.as_str(), test.arguments.clone().unwrap_or_default(), CALL_TIMEOUT),
        (None, Some(task)) => {
            let mut args = Map::new();
            args.insert("task".into(), json!(task.task));
            if let Some(m) = &task.model {
                args.insert("model".into(), json!(m));
            }
            if let Some(t) = &task.tools {
                args.insert("tools".into(), json!(t));
            }
            ("run_coding_task", args, TASK_TIMEOUT)
        }
        (None, None) => return Err("nothing to run".into()),
    };
    let tool = tools.iter().find(|t| t.name == name);
    let expects_error = test.expect.is_error == Some(true) || test.expect.error_contains.is_some();
    if tool.is_none() && !expects_error {
        return Err(format!("the server lists no tool {name:?} for this identity"));
    }
    // An unknown tool is one way of answering an error; the call shows which.
    let seconds = test.timeout.or(suite_timeout).unwrap_or(default_timeout);
    let call = Call { client, tool, name, arguments: &arguments, planned, seconds };
    let copies = test.repeat.or(test.concurrency).unwrap_or(1);
    let at_once = test.concurrency.unwrap_or(1);
    let failures: Vec<String> = futures::stream::iter(0..copies)
        .map(|_| call.once())
        .buffer_unordered(at_once)
        .filter_map(|r| async move { r.err() })
        .collect()
        .await;
    match failures.first() {
        None => Ok(()),
        Some(first) if copies == 1 => Err(first.clone()),
        Some(first) => Err(format!("{} of {copies} calls failed; the first: {first}", failures.len())),
    }
}

fn check_listing(listing: &super::Listing, tools: &[Tool]) -> Result<(), String> {
    let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    names.sort_unstable();
    let mut problems = Vec::new();
    if let Some(expected) = &listing.equals {
        let mut expected: Vec<&str> = expected.iter().map(String::as_str).collect();
        expected.sort_unstable();
        if expected != names {
            problems.push(format!("lists {names:?}, expected exactly {expected:?}"));
        }
    }
    let missing: Vec<&String> = listing.includes.iter().filter(|n| !names.contains(&n.as_str())).collect();
    if !missing.is_empty() {
        problems.push(format!("does not list {missing:?}"));
    }
    let present: Vec<&String> = listing.excludes.iter().filter(|n| names.contains(&n.as_str())).collect();
    if !present.is_empty() {
        problems.push(format!("lists {present:?}, which it must not"));
    }
    if problems.is_empty() { Ok(()) } else { Err(format!("tools/list {}", problems.join("; "))) }
}

/// One call of a test, as often as it says.
#[derive(Clone, Copy)]
struct Call<'a> {
    client: &'a Client,
    tool: Option<&'a Tool>,
    name: &'a str,
    arguments: &'a Map<String, Value>,
    planned: &'a Planned,
    /// Seconds to wait for an answer.
    seconds: u64,
}

impl Call<'_> {
    async fn once(&self) -> Result<(), String> {
        let Self { client, tool, name, arguments, planned, seconds } = *self;
        let test = &planned.test;
        let answer = crate::call::call_tool(client, name, arguments.clone(), None);
        let answer = match tokio::time::timeout(Duration::from_secs(seconds), answer).await {
            Err(_) if test.expect.timeout => return Ok(()),
            Err(_) => return Err(format!("no answer within {seconds} s")),
            Ok(_) if test.expect.timeout => return Err(format!("answered within {seconds} s; a timeout was expected")),
            Ok(answer) => answer,
        };
        let expect = &test.expect;
        let wants_error = expect.is_error.unwrap_or(expect.error_contains.is_some());
        let (failed, text, result) = match answer {
            Ok(result) => (result.is_error == Some(true), content_text(&result), Some(result)),
            // A JSON-RPC error (unknown tool, invalid arguments) is an error answer too.
            Err(e) => (true, e.to_string(), None),
        };
        if failed != wants_error {
            return Err(if failed {
                format!("answered an error: {text}")
            } else {
                format!("answered no error: {text}")
            });
        }
        if let Some(needle) = &expect.error_contains
            && !text.contains(needle.as_str())
        {
            return Err(format!("the error does not contain {needle:?}: {text}"));
        }
        let Some(result) = result.filter(|_| !failed) else { return Ok(()) };
        if test.contract != Some(false)
            && let Some(schema) = tool.and_then(|t| t.output_schema.as_ref())
        {
            check_contract(&Value::Object((**schema).clone()), &result)?;
        }
        if test.coding_task.is_some() && expect.values.is_empty() {
            // A coding task passes when it succeeds, unless the test checks its result itself.
            let status = result.structured_content.as_ref().and_then(|s| s["status"].as_str()).unwrap_or("unknown");
            if status != "success" {
                return Err(format!("the task ended {status}: {text}"));
            }
        }
        check_values(expect, planned, &answer_document(&result, &text))
    }
}

fn check_contract(schema: &Value, result: &CallToolResult) -> Result<(), String> {
    let Some(structured) = &result.structured_content else {
        return Err("the tool declares an outputSchema but answered no structuredContent".into());
    };
    let validator =
        jsonschema::validator_for(schema).map_err(|e| format!("the tool's outputSchema does not compile: {e}"))?;
    let problems: Vec<String> = validator
        .iter_errors(structured)
        .map(|e| {
            let at = e.instance_path().to_string();
            if at.is_empty() { e.to_string() } else { format!("{at}: {e}") }
        })
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("the result breaks the tool's outputSchema: {}", problems.join("; ")))
    }
}

/// What `values` paths look into: the structured content, else the text parsed as JSON,
/// else the text.
fn answer_document(result: &CallToolResult, text: &str) -> Value {
    result
        .structured_content
        .clone()
        .or_else(|| serde_json::from_str(text).ok())
        .unwrap_or_else(|| Value::String(text.to_owned()))
}

fn check_values(expect: &Expect, planned: &Planned, doc: &Value) -> Result<(), String> {
    for (check, path) in expect.values.iter().zip(&planned.paths) {
        let nodes = path.query(doc).all();
        check_value(check, &nodes, doc)?;
    }
    Ok(())
}

fn short(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(200) {
        Some((i, _)) => format!("{}...", &text[..i]),
        None => text,
    }
}

/// One check on the nodes a path matched (one node: that value; several: their array).
fn check_value(check: &ValueCheck, nodes: &[&Value], doc: &Value) -> Result<(), String> {
    let path = &check.path;
    if let Some(exists) = check.exists {
        return match (exists, nodes.is_empty()) {
            (true, true) => Err(format!("{path} matches nothing in {}", short(doc))),
            (false, false) => Err(format!("{path} matches {}, expected nothing", short(nodes[0]))),
            _ => Ok(()),
        };
    }
    let value = match nodes {
        [] => return Err(format!("{path} matches nothing in {}", short(doc))),
        [one] => (*one).clone(),
        many => Value::Array(many.iter().map(|v| (*v).clone()).collect()),
    };
    if let Some(expected) = &check.equals {
        let equal = match (value.as_f64(), expected.as_f64()) {
            (Some(a), Some(b)) => (a - b).abs() <= check.tolerance.unwrap_or(0.0),
            _ => &value == expected,
        };
        if !equal {
            let within = check.tolerance.map(|t| format!(" (within {t})")).unwrap_or_default();
            return Err(format!("{path} is {}, expected {}{within}", short(&value), short(expected)));
        }
    }
    if let Some((low, high)) = check.between
        && !value.as_f64().is_some_and(|v| (low..=high).contains(&v))
    {
        return Err(format!("{path} is {}, expected a number in [{low}, {high}]", short(&value)));
    }
    if let Some(needle) = &check.contains {
        let found = match &value {
            Value::String(s) => s.contains(needle.as_str()),
            Value::Array(items) => items.iter().any(|i| i.as_str() == Some(needle.as_str())),
            _ => false,
        };
        if !found {
            return Err(format!("{path} is {}, which does not contain {needle:?}", short(&value)));
        }
    }
    if let Some(length) = check.length {
        let actual = match &value {
            Value::String(s) => Some(s.chars().count()),
            Value::Array(a) => Some(a.len()),
            Value::Object(o) => Some(o.len()),
            _ => None,
        };
        if actual != Some(length) {
            return Err(format!("{path} is {}, expected a length of {length}", short(&value)));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(yaml: &str, doc: Value) -> Result<(), String> {
        let check: ValueCheck = serde_saphyr::from_str(yaml).unwrap();
        let path = serde_json_path::JsonPath::parse(&check.path).unwrap();
        check_value(&check, &path.query(&doc).all(), &doc)
    }

    #[test]
    fn value_checks() {
        let doc = json!({"price": 10.4506, "type": "call", "legs": [{"d": 0.5}, {"d": 0.7}]});
        assert!(check("{path: $.price, equals: 10.45, tolerance: 0.001}", doc.clone()).is_ok());
        let e = check("{path: $.price, equals: 10.0, tolerance: 0.001}", doc.clone()).unwrap_err();
        assert_eq!(e, "$.price is 10.4506, expected 10.0 (within 0.001)");
        assert!(check("{path: $.type, equals: call}", doc.clone()).is_ok());
        assert!(check("{path: '$.legs[*].d', between: [0, 1]}", doc.clone()).is_err(), "two matches are an array");
        assert!(check("{path: '$.legs[1].d', between: [0, 1]}", doc.clone()).is_ok());
        assert!(check("{path: $.legs, length: 2}", doc.clone()).is_ok());
        assert!(check("{path: $.type, contains: al}", doc.clone()).is_ok());
        assert!(check("{path: $.nope, exists: false}", doc.clone()).is_ok());
        assert!(check("{path: $.nope, equals: 1}", doc.clone()).unwrap_err().contains("matches nothing"));
    }

    #[test]
    fn contracts_and_listings() {
        let schema = json!({"type": "object", "properties": {"price": {"type": "number"}}, "required": ["price"]});
        let good = CallToolResult::structured(json!({"price": 1.0}));
        assert!(check_contract(&schema, &good).is_ok());
        let bad = CallToolResult::structured(json!({"price": "1"}));
        assert!(check_contract(&schema, &bad).unwrap_err().contains("/price"));
        let listing = super::super::Listing { equals: None, includes: vec!["a".into()], excludes: vec!["b".into()] };
        let tool = |n: &str| Tool::new(n.to_owned(), "", std::sync::Arc::new(Map::new()));
        assert!(check_listing(&listing, &[tool("a")]).is_ok());
        let e = check_listing(&listing, &[tool("b")]).unwrap_err();
        assert!(e.contains("does not list [\"a\"]") && e.contains("lists [\"b\"], which it must not"), "{e}");
    }
}

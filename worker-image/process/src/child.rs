//! Running the tool command once, as a fresh process in its own process group.
//!
//! The arguments go to its stdin as JSON; it gets `TOOLYARD_RESULT_FILE`,
//! `TOOLYARD_ERROR_FILE` and (when progress is wanted) `TOOLYARD_PROGRESS_FILE` in a private
//! temporary folder, `TRACEPARENT`, and the environment of
//! this process without its credentials (see [`ToolCommand`]). Its stdout and stderr are
//! captured (bounded). At a stop (deadline or SIGTERM) the whole group gets SIGTERM, then
//! SIGKILL after a short grace; when the command ends, whatever it left behind in its group
//! is killed too, so a call's processes end with the call.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;
use toolyard_api::protocol::{CallErrorKind, CallResult, env, pool};

use crate::capture::{Capture, Captured};
use crate::outcome::{self, Exit, Finished};
use crate::outputs::{self, Output};
use crate::progress::{ProgressFile, ProgressReporter};

/// Variables of the runner that never reach the tool command: the tool gets no credentials.
pub const SCRUBBED_ENV: &[&str] = &[env::TOKEN, env::GATEWAY_URL, pool::env::KEY, pool::env::KEY_FILE];

/// How the tool command is started: program and arguments, and where it runs with which
/// variables. It inherits this process's environment minus [`SCRUBBED_ENV`] and
/// [`ToolCommand::env_remove`], plus [`ToolCommand::env`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolCommand {
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Working directory (default: this process's).
    pub cwd: Option<PathBuf>,
    /// Variables set for the tool.
    pub env: Vec<(String, String)>,
    /// Variables of this process the tool must not inherit (e.g. a gateway's own settings).
    pub env_remove: Vec<String>,
}

impl ToolCommand {
    /// `argv` with this process's folder and environment.
    pub fn new(argv: Vec<String>) -> Self {
        Self { argv, ..Self::default() }
    }

    /// A command in a process group of its own, with stdin, stdout and stderr piped and the
    /// environment prepared (the caller adds the protocol's variables).
    pub fn command(&self) -> Result<Command, String> {
        let (program, args) = self.argv.split_first().ok_or("the tool command is empty")?;
        let mut command = Command::new(program);
        command.args(args).process_group(0).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        if let Some(dir) = &self.cwd {
            command.current_dir(dir);
        }
        for name in &self.env_remove {
            command.env_remove(name);
        }
        command.envs(self.env.iter().map(|(k, v)| (k, v)));
        // Last: not even the tool's own variables may carry the runner's credentials.
        for name in SCRUBBED_ENV {
            command.env_remove(name);
        }
        Ok(command)
    }

    /// The program, for messages.
    pub fn program(&self) -> &str {
        self.argv.first().map_or("", String::as_str)
    }
}

/// How long to wait for pipes to close after the process group is gone (a process that left
/// the group may still hold them).
const PIPE_DRAIN_WAIT: Duration = Duration::from_secs(2);

/// Why a run was stopped before the command ended by itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The call's own deadline passed.
    Deadline(Duration),
    /// The runner received this signal (a pod's deadline, a cancellation, Ctrl-C).
    Signal(&'static str),
}

impl StopReason {
    /// The message of the resulting `TimedOut` result.
    pub fn message(&self) -> String {
        match self {
            StopReason::Deadline(limit) => format!("the call timed out after {}", human_duration(*limit)),
            StopReason::Signal(name) => {
                format!("the call was stopped by {name} (its deadline passed or it was cancelled)")
            }
        }
    }
}

fn human_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 { format!("{}s", d.as_secs()) } else { format!("{:.3}s", d.as_secs_f64()) }
}

/// One fresh run of the tool command.
#[derive(Clone, Debug)]
pub struct RunSpec {
    /// The tool command.
    pub command: ToolCommand,
    /// Bytes for the command's stdin (the arguments as JSON).
    pub stdin: Vec<u8>,
    /// W3C trace context passed on as `TRACEPARENT`.
    pub traceparent: Option<String>,
    /// The caller, passed on as `TOOLYARD_CALLER` (a tool with `callerIdentity: true`); the
    /// command gets no such variable otherwise.
    pub caller: Option<toolyard_api::Owner>,
    /// Bytes kept of each of stdout and stderr.
    pub log_limit: usize,
    /// Time between SIGTERM and SIGKILL at a stop.
    pub kill_grace: Duration,
    /// Where the function's progress reports go; `None` leaves the function without a
    /// progress file (its reports are dropped).
    pub progress: Option<ProgressReporter>,
}

/// What a run produced.
#[derive(Clone, Debug)]
pub struct RunOutput {
    /// The outcome.
    pub result: CallResult,
    /// The files it returned (listed in `result.files`).
    pub files: Vec<Output>,
    /// Captured standard output.
    pub stdout: Captured,
    /// Captured standard error.
    pub stderr: Captured,
}

/// Signals (and finally kills) a process group; kills it when dropped, so no path out of a
/// run (including a dropped future) leaves the tool's processes running.
#[derive(Debug)]
pub struct ProcessGroup {
    pgid: Option<Pid>,
}

impl ProcessGroup {
    /// The group led by the process `pid` (started with `process_group(0)`).
    pub fn new(pid: Option<u32>) -> Self {
        Self { pgid: pid.and_then(|p| i32::try_from(p).ok()).map(Pid::from_raw) }
    }

    /// Sends `signal` to every process of the group (a group that is gone is not an error).
    pub fn signal(&self, signal: Signal) {
        if let Some(pgid) = self.pgid {
            let _ = killpg(pgid, signal);
        }
    }

    /// SIGKILLs the group.
    pub fn kill(&self) {
        self.signal(Signal::SIGKILL);
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A private temporary folder (mode 0700 under `$TMPDIR`), removed when dropped.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates a fresh folder; `create` fails rather than reuse an existing path.
    pub fn new(prefix: &str) -> std::io::Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
        let name = format!("{prefix}-{}-{}-{nanos:08x}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
        let path = std::env::temp_dir().join(name);
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        Ok(Self(path))
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the command once; `stop` resolving first stops it with a `TimedOut` result.
pub async fn run_once(spec: RunSpec, stop: impl Future<Output = StopReason>) -> RunOutput {
    let started = Instant::now();
    let elapsed_ms = || u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let fail = |kind, message: String| RunOutput {
        result: CallResult::err(kind, message, None, elapsed_ms()),
        files: Vec::new(),
        stdout: Captured::default(),
        stderr: Captured::default(),
    };

    let dir = match TempDir::new("toolyard-call") {
        Ok(dir) => dir,
        Err(e) => {
            let message = format!("cannot create a temporary folder in {}: {e}", std::env::temp_dir().display());
            return fail(CallErrorKind::SpawnFailed, message);
        }
    };
    let result_file = dir.path().join("result.json");
    let error_file = dir.path().join("error.txt");
    let progress_file = dir.path().join("progress.jsonl");
    let output_dir = dir.path().join("outputs");
    if let Err(e) = std::fs::create_dir(&output_dir).and_then(|()| outputs::prepare(&output_dir)) {
        return fail(CallErrorKind::SpawnFailed, format!("cannot create the call's output folder: {e}"));
    }

    let mut command = match spec.command.command() {
        Ok(command) => command,
        Err(e) => return fail(CallErrorKind::SpawnFailed, e),
    };
    command
        .env(env::RESULT_FILE, &result_file)
        .env(env::ERROR_FILE, &error_file)
        .env(env::OUTPUT_DIR, &output_dir)
        .env_remove(env::PROTOCOL);
    match &spec.traceparent {
        Some(tp) => command.env(env::TRACEPARENT, tp),
        None => command.env_remove(env::TRACEPARENT),
    };
    match &spec.progress {
        Some(_) => command.env(env::PROGRESS_FILE, &progress_file),
        None => command.env_remove(env::PROGRESS_FILE),
    };
    match spec.caller.as_ref().map(serde_json::to_string) {
        Some(Ok(caller)) => command.env(env::CALLER, caller),
        _ => command.env_remove(env::CALLER),
    };
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            let program = spec.command.program();
            return fail(CallErrorKind::SpawnFailed, format!("cannot start the tool command {program:?}: {e}"));
        }
    };
    let group = ProcessGroup::new(child.id());
    let progress = spec.progress.map(|report| {
        let (done, stopped) = tokio::sync::oneshot::channel();
        (done, tokio::spawn(ProgressFile::new(progress_file).follow(report, stopped)))
    });

    if let Some(mut stdin) = child.stdin.take() {
        let data = spec.stdin;
        // The tool may never read its stdin; a broken pipe is not an error of the call.
        tokio::spawn(async move {
            let _ = stdin.write_all(&data).await;
        });
    }
    let out = Capture::new(spec.log_limit);
    let err = Capture::new(spec.log_limit);
    let readers = [
        child.stdout.take().map(|s| {
            tokio::spawn({
                let out = out.clone();
                async move { out.drain(s).await }
            })
        }),
        child.stderr.take().map(|s| {
            tokio::spawn({
                let err = err.clone();
                async move { err.drain(s).await }
            })
        }),
    ];

    let (status, stopped) = tokio::select! {
        status = child.wait() => (status, None),
        reason = stop => {
            group.signal(Signal::SIGTERM);
            let status = match tokio::time::timeout(spec.kill_grace, child.wait()).await {
                Ok(status) => status,
                Err(_) => {
                    group.kill();
                    child.wait().await
                }
            };
            (status, Some(reason))
        }
    };
    // Whatever the command left running in its group ends with the call.
    group.kill();
    let _ = tokio::time::timeout(PIPE_DRAIN_WAIT, async {
        for reader in readers.into_iter().flatten() {
            let _ = reader.await;
        }
    })
    .await;
    let (stdout, stderr) = (out.take(), err.take());
    if let Some((done, follower)) = progress {
        let _ = done.send(());
        let _ = follower.await;
    }

    let mut result = match (stopped, status) {
        (Some(reason), _) => CallResult::err(CallErrorKind::TimedOut, reason.message(), None, elapsed_ms()),
        (None, Err(e)) => CallResult::err(
            CallErrorKind::Crashed,
            format!("cannot wait for the tool process: {e}"),
            None,
            elapsed_ms(),
        ),
        (None, Ok(status)) => outcome::classify(Finished {
            exit: Exit::from_status(status),
            result: outcome::read_result_file(&result_file),
            error_message: outcome::read_error_file(&error_file),
            stderr_last_line: stderr.last_line(),
            duration_ms: elapsed_ms(),
        }),
    };
    let files = outputs::finish(&mut result, &output_dir);
    RunOutput { result, files, stdout, stderr }
}

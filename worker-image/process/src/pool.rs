//! A bounded pool of tool processes for Pool-mode tools: a fresh process per call
//! ([`crate::child::run_once`]), or, with reuse, one long-lived JSON-lines [`Worker`] per
//! slot.
//!
//! At most `concurrency` calls run and `queue` wait ([`Admission`], fair between the calls'
//! owners); beyond that a call is refused at once ([`Refused::Busy`]), or, while it waits,
//! gives its place to another owner's call ([`Refused::PushedOut`]). A reused worker that dies,
//! hangs past a call's deadline or breaks the protocol is killed with its process group and
//! replaced in the background while its slot stays taken; a slot whose worker could not start
//! starts one when a call needs it. `toolyard-runner serve` puts a pool behind HTTP in a
//! warm pod; the gateway's local mode calls its pools in-process.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};
use tokio::sync::watch;
use toolyard_api::OwnerKey;
/// Why a call was not run (what a pool server's 503 answer says).
pub use toolyard_api::protocol::pool::Refused;
use toolyard_api::protocol::{CallErrorKind, CallResult};

use crate::admission::{Admission, Admitted, Denied, Load};
use crate::capture::Captured;
use crate::child::{self, RunSpec, StopReason, ToolCommand};
use crate::progress::ProgressReporter;
use crate::worker::Worker;

/// How a pool runs its tool.
#[derive(Clone, Debug)]
pub struct PoolSettings {
    /// The tool command.
    pub command: ToolCommand,
    /// Keep one long-lived worker per slot instead of a fresh process per call.
    pub reuse: bool,
    /// Calls run at once (at least 1).
    pub concurrency: usize,
    /// Calls that may wait for a slot before calls are refused.
    pub queue: usize,
    /// Longest a reused worker may take to report ready.
    pub startup_timeout: Duration,
    /// Time between SIGTERM and SIGKILL of a fresh call's process group at its deadline.
    pub kill_grace: Duration,
    /// Bytes kept of each of a call's stdout and stderr.
    pub log_limit: usize,
}

/// Whether the pool's workers are up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// Reused workers are starting.
    Starting,
    /// Calls run (fresh processes, or every reused worker started).
    Ready,
    /// A worker failed to start (the message says why); calls try to start one again.
    Failed(String),
}

/// One call.
#[derive(Clone, Copy, Debug)]
pub struct PoolCall<'a> {
    /// The call id (in the jsonl request; for logs).
    pub id: &'a str,
    /// The arguments.
    pub arguments: &'a Map<String, Value>,
    /// The call's deadline, counted from when it reaches the pool: time spent waiting for a
    /// slot counts toward it.
    pub timeout: Duration,
    /// W3C trace context for a fresh process.
    pub traceparent: Option<&'a str>,
    /// Where the function's progress reports go, if anywhere.
    pub progress: Option<&'a ProgressReporter>,
    /// The caller, for a tool with `callerIdentity: true`.
    pub caller: Option<&'a toolyard_api::Owner>,
    /// Whose call this is, for every tool: waiting calls take turns by owner
    /// ([`crate::admission`]). Never passed to the function.
    pub owner: &'a OwnerKey,
}

/// What a call produced.
#[derive(Clone, Debug)]
pub struct PoolOutput {
    /// The outcome (tool failures and timeouts are error results, not errors).
    pub result: CallResult,
    /// The files it returned (listed in `result.files`).
    pub files: Vec<crate::outputs::Output>,
    /// Captured stdout (always empty for a reused worker: its stdout is the protocol).
    pub stdout: Captured,
    /// Captured stderr (a reused worker's function prints land here).
    pub stderr: Captured,
}

/// A pool of tool processes.
#[derive(Debug)]
pub struct WorkerPool {
    settings: PoolSettings,
    admission: Admission,
    /// Reuse: the idle workers (one entry per free slot; `None` where a start failed).
    idle: Mutex<Vec<Option<Worker>>>,
    readiness: watch::Sender<Readiness>,
    closed: AtomicBool,
}

impl WorkerPool {
    /// A pool with no worker started yet (see [`Self::start`]).
    pub fn new(mut settings: PoolSettings) -> Arc<Self> {
        settings.concurrency = settings.concurrency.max(1);
        let readiness = if settings.reuse { Readiness::Starting } else { Readiness::Ready };
        Arc::new(Self {
            admission: Admission::new(settings.concurrency, settings.queue),
            idle: Mutex::new(Vec::new()),
            readiness: watch::Sender::new(readiness),
            closed: AtomicBool::new(false),
            settings,
        })
    }

    /// The pool's settings.
    pub fn settings(&self) -> &PoolSettings {
        &self.settings
    }

    /// With reuse: starts one worker per slot, concurrently, and returns once each started or
    /// failed. A failed start leaves its slot empty (a call tries again) and makes the pool
    /// [`Readiness::Failed`] with the first reason. Without reuse there is nothing to start.
    pub async fn start(self: &Arc<Self>) {
        if !self.settings.reuse {
            return;
        }
        let starts: Vec<_> = (0..self.settings.concurrency)
            .map(|_| {
                let pool = Arc::clone(self);
                tokio::spawn(async move {
                    let s = &pool.settings;
                    Worker::start(&s.command, s.startup_timeout, s.log_limit).await
                })
            })
            .collect();
        let mut first_error = None;
        let mut started = Vec::with_capacity(starts.len());
        for start in starts {
            match start.await {
                Ok(Ok(worker)) => started.push(Some(worker)),
                Ok(Err(e)) => {
                    first_error.get_or_insert(e);
                    started.push(None);
                }
                Err(e) => {
                    first_error.get_or_insert(format!("worker start panicked: {e}"));
                    started.push(None);
                }
            }
        }
        if self.closed.load(Ordering::Acquire) {
            return;
        }
        self.lock_idle().extend(started);
        match first_error {
            Some(error) => {
                tracing::error!(%error, "worker start failed");
                self.readiness.send_replace(Readiness::Failed(error));
            }
            None => {
                tracing::debug!(workers = self.settings.concurrency, "workers ready");
                self.readiness.send_replace(Readiness::Ready);
            }
        }
    }

    /// The calls running and waiting now.
    pub fn load(&self) -> Load {
        self.admission.load()
    }

    /// Whether the workers are up.
    pub fn readiness(&self) -> Readiness {
        self.readiness.borrow().clone()
    }

    /// Waits until the start is over: `Ok` when ready, else why a worker did not start.
    pub async fn wait_started(&self) -> Result<(), String> {
        let mut readiness = self.readiness.subscribe();
        let settled = readiness.wait_for(|r| *r != Readiness::Starting).await;
        match settled.as_deref() {
            Ok(Readiness::Ready) => Ok(()),
            Ok(Readiness::Failed(error)) => Err(error.clone()),
            _ => Err("the pool stopped while starting".into()),
        }
    }

    /// Runs one call: waits for a slot (unless every slot and the queue are taken), then runs
    /// it on a fresh process or an idle worker.
    pub async fn call(self: &Arc<Self>, call: PoolCall<'_>) -> Result<PoolOutput, Refused> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Refused::ShuttingDown);
        }
        let arrived = Instant::now();
        let admitted = match tokio::time::timeout(call.timeout, self.admission.admit(call.owner)).await {
            Ok(Ok(admitted)) => admitted,
            Ok(Err(Denied::Full)) => return Err(Refused::Busy),
            Ok(Err(Denied::PushedOut)) => return Err(Refused::PushedOut),
            Err(_) => {
                let message = format!("timed out after {}s waiting for a free slot", call.timeout.as_secs());
                let waited = u64::try_from(arrived.elapsed().as_millis()).unwrap_or(u64::MAX);
                return Ok(PoolOutput {
                    result: CallResult::err(CallErrorKind::TimedOut, message, None, waited),
                    files: Vec::new(),
                    stdout: Captured::default(),
                    stderr: Captured::default(),
                });
            }
        };
        let call = PoolCall { timeout: call.timeout.saturating_sub(arrived.elapsed()), ..call };
        if !self.settings.reuse {
            let spec = RunSpec {
                command: self.settings.command.clone(),
                stdin: serde_json::to_vec(call.arguments).unwrap_or_default(),
                traceparent: call.traceparent.map(str::to_owned),
                caller: call.caller.cloned(),
                log_limit: self.settings.log_limit,
                kill_grace: self.settings.kill_grace,
                progress: call.progress.cloned(),
            };
            let timeout = call.timeout;
            let output = child::run_once(spec, async move {
                tokio::time::sleep(timeout).await;
                StopReason::Deadline(timeout)
            })
            .await;
            drop(admitted);
            return Ok(PoolOutput {
                result: output.result,
                files: output.files,
                stdout: output.stdout,
                stderr: output.stderr,
            });
        }
        Ok(self.call_worker(call, admitted).await)
    }

    /// One call on a reused worker: take an idle one (starting it if its slot has none or it
    /// died while idle), call it, and give it back — or replace it in the background.
    async fn call_worker(self: &Arc<Self>, call: PoolCall<'_>, admitted: Admitted) -> PoolOutput {
        let s = &self.settings;
        // Holding a slot guarantees an entry once started (one per slot); a slot without one
        // (a start still running, a dropped call) starts its own.
        let taken = self.lock_idle().pop().flatten();
        let taken = taken.and_then(|mut w| w.is_alive().then_some(w));
        let mut worker = match taken {
            Some(w) => w,
            None => match Worker::start(&s.command, s.startup_timeout, s.log_limit).await {
                Ok(w) => {
                    self.mark_started();
                    w
                }
                Err(e) => {
                    self.lock_idle().push(None);
                    let result = CallResult::err(CallErrorKind::SpawnFailed, e, None, 0);
                    return PoolOutput {
                        result,
                        files: Vec::new(),
                        stdout: Captured::default(),
                        stderr: Captured::default(),
                    };
                }
            },
        };
        let outcome = worker.call(&call).await;
        if outcome.reusable {
            self.give_back(worker);
            drop(admitted);
        } else {
            drop(worker);
            tracing::warn!(call = %call.id, "replacing the worker");
            let pool = Arc::clone(self);
            tokio::spawn(async move {
                if pool.closed.load(Ordering::Acquire) {
                    return;
                }
                let s = &pool.settings;
                let replacement = Worker::start(&s.command, s.startup_timeout, s.log_limit).await;
                match &replacement {
                    Ok(_) => pool.mark_started(),
                    Err(e) => tracing::error!(error = %e, "worker restart failed"),
                }
                match replacement {
                    Ok(worker) => pool.give_back(worker),
                    Err(_) => pool.lock_idle().push(None),
                }
                drop(admitted);
            });
        }
        PoolOutput { result: outcome.result, files: outcome.files, stdout: Captured::default(), stderr: outcome.stderr }
    }

    /// Stops the idle workers (killing their process groups) and refuses further calls;
    /// workers busy with a call are stopped when their call ends.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let idle = std::mem::take(&mut *self.lock_idle());
        drop(idle);
    }

    fn give_back(&self, worker: Worker) {
        if self.closed.load(Ordering::Acquire) {
            return; // dropped: its group is killed
        }
        self.lock_idle().push(Some(worker));
    }

    /// A worker started after a failed start-up: the pool is ready again.
    fn mark_started(&self) {
        self.readiness.send_if_modified(|r| {
            let changed = *r != Readiness::Ready;
            *r = Readiness::Ready;
            changed
        });
    }

    fn lock_idle(&self) -> std::sync::MutexGuard<'_, Vec<Option<Worker>>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn settings(argv: &[&str], reuse: bool) -> PoolSettings {
        PoolSettings {
            command: ToolCommand::new(argv.iter().map(|a| (*a).to_owned()).collect()),
            reuse,
            concurrency: 1,
            queue: 0,
            startup_timeout: Duration::from_secs(10),
            kill_grace: Duration::from_millis(100),
            log_limit: 1024,
        }
    }

    fn owner() -> OwnerKey {
        toolyard_api::Owner { issuer: "local".into(), user: "dev".into(), groups: vec![] }.key()
    }

    fn call<'a>(arguments: &'a Map<String, Value>, owner: &'a OwnerKey) -> PoolCall<'a> {
        PoolCall {
            id: "c1",
            arguments,
            timeout: Duration::from_secs(10),
            traceparent: None,
            progress: None,
            caller: None,
            owner,
        }
    }

    #[tokio::test]
    async fn a_fresh_process_pool_is_ready_at_once_and_runs_the_command_per_call() {
        let script = r#"cat > /dev/null; printf '{"ok":true}' > "$TOOLYARD_RESULT_FILE"; echo hello"#;
        let pool = WorkerPool::new(settings(&["/bin/sh", "-c", script], false));
        assert_eq!(pool.readiness(), Readiness::Ready);
        pool.start().await;
        let (arguments, owner) = (json!({"a": 1}).as_object().cloned().unwrap(), owner());
        let output = pool.call(call(&arguments, &owner)).await.unwrap();
        assert_eq!(output.result.value, Some(json!({"ok": true})), "{:?}", output.result);
        assert_eq!(output.stdout.bytes, b"hello\n");
    }

    #[tokio::test]
    async fn a_worker_that_cannot_start_makes_the_pool_failed_with_the_reason() {
        let pool = WorkerPool::new(settings(&["/bin/sh", "-c", "echo not-protocol; exit 0"], true));
        assert_eq!(pool.readiness(), Readiness::Starting);
        pool.start().await;
        let error = pool.wait_started().await.unwrap_err();
        assert!(error.contains("first line was not protocol JSON"), "{error}");
        let (arguments, owner) = (Map::new(), owner());
        let output = pool.call(call(&arguments, &owner)).await.unwrap();
        assert_eq!(output.result.error.map(|e| e.kind), Some(CallErrorKind::SpawnFailed), "a call tries again");
    }

    #[tokio::test]
    async fn a_full_pool_is_busy_and_a_closed_one_refuses_calls() {
        let pool = WorkerPool::new(settings(&["/bin/sh", "-c", "exit 0"], false));
        let (arguments, owner) = (Map::new(), owner());
        let held = pool.admission.admit(&owner).await.expect("the only slot");
        assert_eq!(pool.call(call(&arguments, &owner)).await.unwrap_err(), Refused::Busy, "no slot and no queue");
        drop(held);
        assert!(pool.call(call(&arguments, &owner)).await.is_ok(), "the slot is free again");
        pool.close();
        assert_eq!(pool.call(call(&arguments, &owner)).await.unwrap_err(), Refused::ShuttingDown);
    }

    #[tokio::test]
    async fn waiting_for_a_slot_counts_toward_the_deadline() {
        let pool = WorkerPool::new(PoolSettings { queue: 1, ..settings(&["/bin/sh", "-c", "exit 0"], false) });
        let (arguments, owner) = (Map::new(), owner());
        let held = pool.admission.admit(&owner).await.expect("the only slot");
        let short = PoolCall { timeout: Duration::from_millis(200), ..call(&arguments, &owner) };
        let output = pool.call(short).await.expect("queued, then timed out");
        let error = output.result.error.expect("an error result");
        assert_eq!(error.kind, CallErrorKind::TimedOut);
        assert!(error.message.contains("waiting for a free slot"), "{}", error.message);
        drop(held);
        assert!(pool.call(call(&arguments, &owner)).await.is_ok(), "its place in the queue was given back");
    }
}

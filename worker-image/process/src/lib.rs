//! `toolyard-process`: tool processes under the Toolyard runner protocol, shared by
//! `toolyard-runner` (Job pods, warm pool pods) and the gateway's embedded local mode.
//!
//! - [`child`]: one fresh run of the tool command in its own process group (arguments on
//!   stdin, result file, bounded logs, deadline with SIGTERM then SIGKILL of the group).
//! - [`worker`]: a reused JSON-lines worker process (`TOOLYARD_PROTOCOL=jsonl`).
//! - [`pool`]: a bounded pool of either (one slot per concurrent call, a bounded queue),
//!   what `toolyard-runner serve` puts behind HTTP and the local mode calls in-process.
//! - [`outcome`]: how a finished tool process becomes a [`toolyard_api::protocol::CallResult`].
//! - [`outputs`]: the files a call returns (images and others), checked.
//! - [`capture`]: bounded capture of a process's output.
//! - [`progress`]: the function's progress reports (a file, or jsonl protocol lines).
//!
//! The tool command never sees the runner's or gateway's credentials ([`child::SCRUBBED_ENV`]
//! plus what a [`child::ToolCommand`] removes).

pub mod admission;
pub mod capture;
pub mod child;
pub mod outcome;
pub mod outputs;
pub mod pool;
pub mod progress;
pub mod worker;

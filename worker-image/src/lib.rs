//! `toolyard-runner`: runs a tool command under the Toolyard runner protocol.
//!
//! - `call -- CMD...` ([`call`]): one call in a Job pod or as a local child process: input
//!   from the gateway's internal API, CMD run once ([`child`]), logs and result uploaded.
//! - `serve -- CMD...` ([`serve`]): the Pool-mode HTTP server of a warm pod, with a fresh
//!   process per call or reused JSON-lines workers.
//! - `bridge -- CMD...` ([`bridge`]): the network side of an McpServer that speaks MCP on
//!   stdio, one process of CMD per authenticated TCP connection.
//! - `agent` ([`agent`]): the code agent of one coding task: model → Python code run in a
//!   persistent interpreter whose tool stubs call back through the gateway → observations.
//!
//! The tool command never sees the runner's credentials; its outcome is classified by
//! [`outcome`] with the exit codes of the Python function runner `toolyard.run`.

pub mod agent;
pub mod api;
pub mod bridge;
pub mod call;
pub mod harden;
pub mod serve;

// Tool processes live in the `toolyard-process` crate, shared with the gateway's local mode.
pub use toolyard_process::{capture, child, outcome};

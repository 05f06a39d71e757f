//! The gateway's use cases, below both front doors (the MCP server and the internal runner
//! API): which tools a caller may see and use ([`access`]), how a tool call runs
//! ([`calls`]) and how tools are found by words ([`search`]). Nothing here knows about Kubernetes, rmcp or axum; the front doors convert
//! their requests into these types and the results back into their wire formats, and the
//! backends plug in through the traits of [`crate::catalog`], [`crate::executor`] and
//! [`crate::authz`].

pub mod access;
pub mod calls;
pub mod ids;
pub mod quota;
pub mod search;

pub use access::{Access, Selection};
pub use calls::{CallError, CallInput, Called, Calls, ClientAsker, LogSink, ProgressSink, TaskStart};

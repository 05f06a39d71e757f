//! The Toolyard gateway: MCP over Streamable HTTP for remote clients, the internal runner
//! API for runner processes, and the embedded local mode.
//!
//! The HTTP/MCP layer depends only on the traits in this crate, each with a Kubernetes
//! implementation and a local one:
//!
//! | trait | Kubernetes | local (embedded mode) |
//! |---|---|---|
//! | [`catalog::ToolCatalog`] | reflector over McpTool objects | YAML manifests in a folder |
//! | [`executor::Executor`] | ToolCall objects run by the controller | `toolyard-runner` child processes |
//! | [`store::ArtifactStore`] | S3 | a local folder |
//! | [`authz::Authorizer`] | SubjectAccessReview | a static policy file |
//! | [`auth::Authenticator`] | API keys, OIDC JWTs, TokenReview | a generated local token |
//! | [`tasks::TaskBackend`] | CodingTask objects run by the controller | `toolyard-runner agent` child processes |

pub mod app;
pub mod assemble;
pub mod auth;
pub mod authz;
pub mod catalog;
pub mod coarse_timer;
pub mod core;
pub mod error;
pub mod executor;
pub mod hosts;
pub mod identity;
pub mod internal;
pub mod limits;
pub mod local;
pub mod logging;
pub mod mcp;
pub mod metrics;
pub mod model;
pub mod self_wake;
pub mod serve;
pub mod server;
pub mod state;
pub mod status;
pub mod store;
pub mod tasks;
pub mod tls;
pub mod upstream;

pub use error::{Error, Result};
pub use identity::Identity;
pub use state::{AppState, Settings};

//! Toolyard's integration tests, one module per part or scenario, built as one test binary
//! (one link instead of one per file, and libtest runs the tests of every module side by
//! side). Run one module with `cargo test -p toolyard-tests --test integration <module>::`.
//! The modules and what each needs are listed in docs/testing.md.

// Helpers shared by several modules (the benches include some of them by path).
mod auth_support;
mod coding_support;
mod controller_support;
mod e2e_support;
mod gateway_support;
mod local_support;

mod admission_policy;
mod auth_apikey;
mod auth_jwt;
mod auth_middleware;
mod auth_tls;
mod auth_tokenreview;
mod authz_policy;
mod authz_sar;
mod chart;
mod cli_local;
mod coding_cluster;
mod coding_local;
mod conformance;
mod controller_codingtask;
mod controller_lifecycle;
mod controller_mcpserver;
mod controller_mcptool;
mod controller_rbac;
mod controller_toolcall;
mod e2e_cluster;
mod e2e_node;
mod gateway_authz;
mod gateway_http;
mod gateway_mcp;
mod gateway_pool;
mod gateway_python_client;
mod gateway_store;
mod gateway_tasks;
mod gateway_upstream;
mod harness;
mod licences;
mod local_cancel;
mod local_catalog;
mod local_cli;
mod local_e2e;
mod local_http;
mod local_inspector;
mod local_upstream;
mod node;
mod runner_bridge;
mod runner_call;
mod runner_internal_api;
mod runner_serve;
mod tracing_local;

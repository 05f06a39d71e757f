//! `toolyard-gateway`: parses the command line and runs a command of the library.

use clap::{Parser, Subcommand};

/// The Toolyard gateway: MCP tools from McpTool objects over authenticated HTTPS.
#[derive(Parser, Debug)]
#[command(name = "toolyard-gateway", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve on Kubernetes: tools from McpTool objects, calls as ToolCalls, files in S3.
    Serve(Box<toolyard_gateway::serve::ServeArgs>),
    /// Run everything on this machine: tools from a folder of manifests, calls as local processes.
    Local(Box<toolyard_gateway::local::LocalArgs>),
}

/// mimalloc rather than the C library's allocator: the request path allocates and frees many
/// small objects, and glibc's malloc took about 8% of the gateway's CPU samples.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Not dumpable: another process of the same user (in the local mode, the tools and the
    // coding agents' code run as this user) cannot read this one's environment or memory
    // through /proc, nor attach to it. The gateway holds the model keys and the signing key.
    nix::sys::prctl::set_dumpable(false).map_err(|e| anyhow::anyhow!("cannot make the process non-dumpable: {e}"))?;
    match Cli::parse().command {
        Command::Serve(args) => toolyard_gateway::serve::run(*args).await,
        Command::Local(args) => toolyard_gateway::local::run(*args).await,
    }
}

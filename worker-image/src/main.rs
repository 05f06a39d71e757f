//! `toolyard-runner`: parses the command line and runs a subcommand (see the library docs).

use clap::{Parser, Subcommand};
use toolyard_api::protocol::runner_exit;
use toolyard_runner::{agent, bridge, call, serve};

/// Runs a tool command under the Toolyard runner protocol.
#[derive(Parser, Debug)]
#[command(name = "toolyard-runner", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run one call: read the input from the gateway, run CMD once, upload logs and result.
    Call(call::CallArgs),
    /// Serve a warm pool: run calls posted by the gateway (fresh process or reused worker).
    Serve(serve::ServeArgs),
    /// Bridge an MCP server that speaks stdio to TCP: one process of CMD per connection.
    Bridge(bridge::BridgeArgs),
    /// Run a coding task's agent: model -> Python code -> tools through the gateway -> result.
    Agent(agent::AgentArgs),
}

fn main() {
    // Before anything else: the runner holds the run's token; the code it starts must not
    // reach it (see `harden`).
    if let Err(e) = toolyard_runner::harden::harden() {
        eprintln!("toolyard-runner: {e}");
        std::process::exit(runner_exit::RUNNER_ERROR);
    }
    let cli = Cli::parse();
    let telemetry = toolyard_telemetry::init(toolyard_telemetry::Settings {
        service: "toolyard-runner",
        format: log_format(),
        filter_var: "TOOLYARD_LOG",
        default_filter: "warn,toolyard_runner=info",
    });
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("toolyard-runner: cannot start the async runtime: {e}");
            std::process::exit(runner_exit::RUNNER_ERROR);
        }
    };
    let code = runtime.block_on(async {
        match cli.command {
            Command::Call(args) => call::run(args).await,
            Command::Serve(args) => match serve::run(args).await {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("toolyard-runner serve: {e:#}");
                    runner_exit::RUNNER_ERROR
                }
            },
            Command::Bridge(args) => match bridge::run(args).await {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("toolyard-runner bridge: {e:#}");
                    runner_exit::RUNNER_ERROR
                }
            },
            Command::Agent(args) => agent::main(args).await,
        }
    });
    // Do not wait for detached tasks (e.g. a stdin writer to a tool that never read it).
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    // The last spans, at most `FLUSH_LIMIT` (the result is already uploaded).
    telemetry.shutdown();
    std::process::exit(code);
}

/// `TOOLYARD_LOG_FORMAT`: `plain` (default) or `json`; anything else is plain, with a warning.
fn log_format() -> toolyard_telemetry::LogFormat {
    use clap::ValueEnum as _;
    match std::env::var("TOOLYARD_LOG_FORMAT") {
        Ok(value) => toolyard_telemetry::LogFormat::from_str(&value, true).unwrap_or_else(|_| {
            eprintln!("toolyard-runner: TOOLYARD_LOG_FORMAT={value:?} is not plain or json; writing plain lines");
            toolyard_telemetry::LogFormat::Plain
        }),
        Err(_) => toolyard_telemetry::LogFormat::Plain,
    }
}

//! `toolyard`: the command for operators and function authors. `check` is a preflight of
//! manifests, a gateway and a cluster install; `test` runs scenario suites against any MCP
//! URL; `tools`, `call`, `prompts`, `prompt`, `tasks` and `artifacts` are the quick commands
//! to try a tool or a prompt, or fetch a result.
//!
//! Exit codes: 0 success; 1 a tool answered an error, a test or check failed, or a task did
//! not succeed; 2 the command could not run (bad arguments, a malformed suite, no
//! connection).

mod call;
mod check;
mod connect;
mod prompts;
mod suite;
mod tasks;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "toolyard",
    version,
    about = "Check, test and call Toolyard tools (or any MCP server's)",
    after_help = "Connection: --url or TOOLYARD_URL; the token from --token-file or TOOLYARD_TOKEN (never an argument)."
)]
struct Cli {
    #[command(flatten)]
    connection: connect::Connection,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Preflight: manifests, the gateway at --url, the cluster install (--kube)
    Check(check::CheckArgs),
    /// Run a scenario suite (YAML) against --url
    Test(suite::run::TestArgs),
    /// List the tools you may call
    Tools {
        /// Print the full definitions as JSON
        #[arg(long)]
        json: bool,
    },
    /// Call a tool: toolyard call price_option spot=100 strike=100 ...
    Call(call::CallArgs),
    /// List the prompts you may get
    Prompts {
        /// Print the full definitions as JSON
        #[arg(long)]
        json: bool,
    },
    /// Get a prompt's messages: toolyard prompt price-and-explain kind=call spot=100 strike=95
    Prompt(prompts::PromptArgs),
    /// Your coding tasks, one task's result, or cancel one
    Tasks(tasks::TasksArgs),
    /// A coding task's files: list them, or fetch one
    Artifacts(tasks::ArtifactsArgs),
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let conn = &cli.connection;
    let outcome = match cli.command {
        Command::Check(args) => check::run(conn, args).await,
        Command::Test(args) => suite::run::run(conn, args).await,
        Command::Tools { json } => call::tools(conn, json).await,
        Command::Call(args) => call::call(conn, args).await,
        Command::Prompts { json } => prompts::prompts(conn, json).await,
        Command::Prompt(args) => prompts::prompt(conn, args).await,
        Command::Tasks(args) => tasks::tasks(conn, args).await,
        Command::Artifacts(args) => tasks::artifacts(conn, args).await,
    };
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("toolyard: {e:#}");
            ExitCode::from(2)
        }
    }
}

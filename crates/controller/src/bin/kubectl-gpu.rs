//! `kubectl-gpu`: the kubectl plugin. Put it on the `PATH` and kubectl finds it:
//! `kubectl gpu explain NODE`, `kubectl gpu validate PATH`, `kubectl gpu approve NAME`,
//! `kubectl gpu history NODE`. The same code as `gpu-remediator`'s subcommands
//! (`gpu_remediator::cli`); only the command line differs.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use gpu_remediator::cli::{
    Connection,
    commands::{PluginCommand, run_plugin},
};

/// GPU node remediation from kubectl: explain a node, validate policies, approve a remediation,
/// list a node's history.
#[derive(Parser, Debug)]
#[command(name = "kubectl gpu", bin_name = "kubectl gpu", version)]
struct Cli {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: PluginCommand,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run_plugin(&cli.command, &cli.connection).await {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

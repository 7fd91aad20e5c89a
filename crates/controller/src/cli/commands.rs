//! The subcommands' arguments and what each prints and exits with, for both binaries:
//! `gpu-remediator validate|explain` and `kubectl gpu validate|explain|approve|history`.

use std::{path::PathBuf, process::ExitCode};

use clap::{Args, Subcommand};

use super::{
    CliError, Connection, approve_remediation, connect, explain::Outcome, explain_node, node_history,
    validate_files,
};

/// `validate PATH…`.
#[derive(Args, Debug)]
pub struct ValidateArgs {
    /// Policy files, or directories of `*.yaml` files; documents of other kinds are skipped.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Fail on warnings too.
    #[arg(long)]
    pub strict: bool,
}

/// `explain NODE`.
#[derive(Args, Debug)]
pub struct ExplainArgs {
    /// The node.
    pub node: String,
    /// Consider only the policies matching this label selector, as a controller started with it.
    #[arg(long)]
    pub policy_selector: Option<String>,
}

/// The subcommands of the kubectl plugin (`kubectl gpu …`).
#[derive(Subcommand, Debug)]
pub enum PluginCommand {
    /// Say why a node is or is not being remediated; exits 1 when there is no such node.
    Explain(ExplainArgs),
    /// Check policy files offline, in the API server's words; exits 1 on errors.
    Validate(ValidateArgs),
    /// Approve a remediation awaiting a person (`AwaitingApproval` or `ManualRequired`), in your name.
    Approve {
        /// The `GpuRemediation` (as `kubectl get gpur` lists it).
        name: String,
    },
    /// List a node's remediations, oldest first: phase, reason, action, started, finished.
    History {
        /// The node.
        node: String,
    },
}

/// `validate`: findings on stdout, a summary on stderr; exits 1 on errors.
///
/// # Errors
/// When a file cannot be read.
pub fn validate(args: &ValidateArgs) -> Result<ExitCode, CliError> {
    validate_files(&args.paths, args.strict)
}

/// `explain`: the explanation on stdout; exits 1 when the cluster has no such node, so a
/// script can tell a typo from a healthy node.
///
/// # Errors
/// When the cluster cannot be read.
pub async fn explain(args: &ExplainArgs, connection: &Connection) -> Result<ExitCode, CliError> {
    let client = connect(connection).await?;
    let explanation = explain_node(client, &args.node, args.policy_selector.as_deref()).await?;
    print!("{explanation}");
    Ok(if explanation.outcome == Outcome::NoSuchNode {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Runs one plugin subcommand.
///
/// # Errors
/// When the files or the cluster cannot be read, or an approval is refused.
pub async fn run_plugin(command: &PluginCommand, connection: &Connection) -> Result<ExitCode, CliError> {
    match command {
        PluginCommand::Explain(args) => explain(args, connection).await,
        PluginCommand::Validate(args) => validate(args),
        PluginCommand::Approve { name } => {
            println!("{}", approve_remediation(connect(connection).await?, name).await?);
            Ok(ExitCode::SUCCESS)
        }
        PluginCommand::History { node } => {
            print!("{}", node_history(connect(connection).await?, node).await?);
            Ok(ExitCode::SUCCESS)
        }
    }
}

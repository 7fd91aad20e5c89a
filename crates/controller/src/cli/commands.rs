//! The subcommands' arguments and what each prints and exits with, for both binaries:
//! `gpu-remediator validate|explain` and `kubectl gpu validate|explain|approve|history`.

use std::{path::PathBuf, process::ExitCode};

use clap::{Args, Subcommand};

use super::{
    CliError, Connection, approve_remediation, connect, explain::Outcome, explain_node,
    node_and_gpus_history, node_history, serial_history, validate_files,
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
    /// List a node's remediations, oldest first (`NODE`), every recycle involving a GPU across
    /// nodes (`--serial`), or both for a node and the GPUs it holds (`--node`).
    History(HistoryArgs),
}

/// `history NODE | --node NODE | --serial SERIAL`.
#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["node", "node_and_gpus", "serial"])))]
pub struct HistoryArgs {
    /// The node: its remediations, oldest first: phase, reason, action, started, finished.
    pub node: Option<String>,
    /// The node's remediations, then every recycle elsewhere of each GPU it holds now.
    #[arg(long = "node", value_name = "NODE")]
    pub node_and_gpus: Option<String>,
    /// A GPU's board serial: every recycle involving it, on any node, including those whose
    /// remediation has expired (from its `GpuHardwareRecord`).
    #[arg(long)]
    pub serial: Option<String>,
}

/// `history`: the table on stdout.
///
/// # Errors
/// When the cluster cannot be read.
pub async fn history(args: &HistoryArgs, connection: &Connection) -> Result<ExitCode, CliError> {
    let client = connect(connection).await?;
    let text = match (&args.node, &args.node_and_gpus, &args.serial) {
        (_, _, Some(serial)) => serial_history(client, serial).await?,
        (_, Some(node), _) => node_and_gpus_history(client, node).await?,
        (Some(node), ..) => node_history(client, node).await?,
        (None, None, None) => unreachable!("clap requires one of NODE, --node, --serial"),
    };
    print!("{text}");
    Ok(ExitCode::SUCCESS)
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
        PluginCommand::History(args) => history(args, connection).await,
    }
}

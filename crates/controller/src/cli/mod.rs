//! The command line's subcommands besides `run`, shared by `gpu-remediator` and the kubectl
//! plugin `kubectl-gpu`: `validate` (policy files, offline), `explain` (why a node is or is not
//! being remediated), `approve` (a remediation awaiting a person) and `history` (a node's
//! remediations). Their decisions are pure and unit-tested in the submodules; the functions here
//! only read files or the cluster, write the one patch `approve` decides, and print. Our kinds are
//! listed through `stored`: an object that does not decode is skipped and named on stderr.

pub mod approve;
pub mod commands;
pub mod explain;
pub mod hardware_history;
pub mod history;
pub mod ladder_steps;
pub mod locate;
pub mod overlap;
pub mod server_words;
pub mod stored;
pub mod validate;

use std::{path::PathBuf, process::ExitCode, sync::Arc};

use gpu_remediation_api::{
    GpuHardwareRecord, GpuRemediation, GpuRemediationPolicy,
    constants::NODE_LABEL,
    hardware::{HardwareKind, record_name},
};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client,
    api::ListParams,
    config::{KubeConfigOptions, Kubeconfig},
};

/// The field manager of `approve`'s patch.
const FIELD_MANAGER: &str = "kubectl-gpu";

/// Which cluster to talk to: a kubeconfig and context, or (neither given) `$KUBECONFIG`,
/// `~/.kube/config` or the in-cluster account, as kubectl would pick.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct Connection {
    /// Path to the kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster).
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: the current context).
    #[arg(long, global = true)]
    pub context: Option<String>,
}

/// Why a subcommand could not do its job.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Policy files could not be read.
    #[error(transparent)]
    Load(#[from] validate::LoadPolicyFilesError),
    /// No kubeconfig or in-cluster credentials.
    #[error("loading Kubernetes credentials: {0}")]
    Credentials(#[from] kube::config::InferConfigError),
    /// The kubeconfig named by `--kubeconfig`/`--context` could not be used.
    #[error("loading the kubeconfig: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    /// The client could not be built.
    #[error("building the Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    /// An API call failed.
    #[error("{what}: {source}")]
    Api {
        /// The call.
        what: String,
        /// The API error.
        source: kube::Error,
    },
    /// The API server's `SelfSubjectReview` named nobody.
    #[error("the API server did not say who you are (its SelfSubjectReview has no username)")]
    NoUsername,
    /// The remediation is past approval.
    #[error(transparent)]
    NotAwaitingApproval(#[from] approve::NotAwaitingApproval),
}

fn api_error(what: impl Into<String>) -> impl FnOnce(kube::Error) -> CliError {
    let what = what.into();
    move |source| CliError::Api { what, source }
}

/// A client for the cluster `connection` names.
///
/// # Errors
/// When no credentials are found or the kubeconfig cannot be used.
pub async fn connect(connection: &Connection) -> Result<Client, CliError> {
    let config = if connection.kubeconfig.is_none() && connection.context.is_none() {
        kube::Config::infer().await?
    } else {
        let options = KubeConfigOptions {
            context: connection.context.clone(),
            ..KubeConfigOptions::default()
        };
        match &connection.kubeconfig {
            Some(path) => {
                kube::Config::from_custom_kubeconfig(Kubeconfig::read_from(path)?, &options).await?
            }
            None => kube::Config::from_kubeconfig(&options).await?,
        }
    };
    Client::try_from(config).map_err(CliError::Client)
}

/// `validate`: prints each finding (`file:line: field: message`) on stdout and a summary on
/// stderr. Fails (exit 1) on errors, and on warnings too when `strict`.
///
/// # Errors
/// When a file cannot be read.
pub fn validate_files(paths: &[PathBuf], strict: bool) -> Result<ExitCode, CliError> {
    let report = validate::check(&validate::load(paths)?);
    let mut text = String::new();
    for finding in &report.findings {
        text.push_str(&finding.to_string());
        text.push('\n');
    }
    // A reader that stops early (`| head`) is not an error of ours; the exit status still tells.
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes());
    eprintln!("{}", report.summary());
    Ok(if report.passes(strict) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `explain NODE`: reads nodes, policies (those `policy_selector` matches, as the controller
/// would enforce) and remediations, and explains the node.
///
/// # Errors
/// When a list call fails.
pub async fn explain_node(
    client: Client,
    node: &str,
    policy_selector: Option<&str>,
) -> Result<explain::Explanation, CliError> {
    let mut policy_params = ListParams::default();
    if let Some(selector) = policy_selector {
        policy_params = policy_params.labels(selector);
    }
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(api_error("listing nodes"))?;
    let policies = stored::list::<GpuRemediationPolicy>(client.clone(), &policy_params)
        .await
        .map_err(api_error("listing gpuremediationpolicies"))?;
    let remediations = stored::list::<GpuRemediation>(client, &ListParams::default())
        .await
        .map_err(api_error("listing gpuremediations"))?;
    Ok(explain::explain(
        node,
        &shared(nodes.items),
        &shared(policies),
        &shared(remediations),
        jiff::Timestamp::now(),
    ))
}

fn shared<T>(items: Vec<T>) -> Vec<Arc<T>> {
    items.into_iter().map(Arc::new).collect()
}

/// The name the API server knows the caller by (`SelfSubjectReview`, authentication.k8s.io/v1).
///
/// # Errors
/// When the review fails or names nobody.
pub async fn whoami(client: Client) -> Result<String, CliError> {
    let review = crate::write::person::review_self(client)
        .await
        .map_err(api_error("asking the API server who you are (SelfSubjectReview)"))?;
    review
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username)
        .filter(|name| !name.is_empty())
        .ok_or(CliError::NoUsername)
}

/// `approve NAME`: approves the remediation in the caller's name, unless it already is approved.
/// Returns the sentence to print.
///
/// # Errors
/// When the record cannot be read or patched, or is past approval.
pub async fn approve_remediation(client: Client, name: &str) -> Result<String, CliError> {
    let remediations = Api::<GpuRemediation>::all(client.clone());
    let record = remediations
        .get(name)
        .await
        .map_err(api_error(format!("reading gpuremediation {name}")))?;
    let user = whoami(client.clone()).await?;
    match approve::decide(&record, &user)? {
        approve::Decision::AlreadyApproved { by } => Ok(format!(
            "gpuremediation/{name} was already approved{}",
            by.map(|by| format!(" by {by}")).unwrap_or_default()
        )),
        approve::Decision::Patch(mut patch) => {
            // Only the version read: a record that moved on meanwhile is re-read, not approved blind.
            patch["metadata"]["resourceVersion"] = record.metadata.resource_version.clone().into();
            crate::write::person::patch::<GpuRemediation>(client.clone(), name, FIELD_MANAGER, &patch)
                .await
                .map_err(api_error(format!("approving gpuremediation {name}")))?;
            Ok(format!("gpuremediation/{name} approved by {user}"))
        }
    }
}

/// `history NODE`: the node's remediation records, oldest first, as a table.
///
/// # Errors
/// When the list call fails.
pub async fn node_history(client: Client, node: &str) -> Result<String, CliError> {
    // Records carry the node as a label when the name fits one (63 characters); longer names are
    // found through the spec alone.
    let params = if node.len() <= 63 {
        ListParams::default().labels(&format!("{NODE_LABEL}={node}"))
    } else {
        ListParams::default()
    };
    let list = stored::list::<GpuRemediation>(client, &params)
        .await
        .map_err(api_error("listing gpuremediations"))?;
    Ok(history::render(node, &history::rows(node, &list)))
}

/// `history --serial S`: every recycle involving GPU `serial` across nodes, from its hardware
/// record and the remediations on record.
///
/// # Errors
/// When a read fails.
pub async fn serial_history(client: Client, serial: &str) -> Result<String, CliError> {
    let (record, remediations) = serial_sources(&client, serial).await?;
    let recycles = hardware_history::recycles_of_serial(serial, record.as_ref(), &remediations);
    Ok(hardware_history::render_serial(
        serial,
        record.as_ref(),
        &recycles,
    ))
}

/// `history --node N`: the node's remediations, then the recycles elsewhere of each GPU it holds.
///
/// # Errors
/// When a read fails.
pub async fn node_and_gpus_history(client: Client, node: &str) -> Result<String, CliError> {
    let remediations = stored::list::<GpuRemediation>(client.clone(), &ListParams::default())
        .await
        .map_err(api_error("listing gpuremediations"))?;
    let rows = history::rows(node, &remediations);
    let held = Api::<Node>::all(client.clone())
        .get_opt(node)
        .await
        .map_err(api_error(format!("reading node {node}")))?
        .map(|n| crate::hardware::ledger::inventory_of(&n))
        .unwrap_or_default();
    let mut serials: Vec<String> = held.into_iter().filter_map(|g| g.serial).collect();
    serials.sort();
    serials.dedup();
    let records = Api::<GpuHardwareRecord>::all(client);
    let mut per_serial = Vec::new();
    for serial in serials {
        let record = records
            .get_opt(&record_name(HardwareKind::Gpu, &serial))
            .await
            .map_err(api_error("reading gpuhardwarerecords"))?;
        let recycles = hardware_history::recycles_of_serial(&serial, record.as_ref(), &remediations);
        per_serial.push((serial, recycles));
    }
    Ok(hardware_history::render_node(node, &rows, &per_serial))
}

async fn serial_sources(
    client: &Client,
    serial: &str,
) -> Result<(Option<GpuHardwareRecord>, Vec<GpuRemediation>), CliError> {
    let record = Api::<GpuHardwareRecord>::all(client.clone())
        .get_opt(&record_name(HardwareKind::Gpu, serial))
        .await
        .map_err(api_error("reading gpuhardwarerecords"))?;
    // Every remediation: one that only held the GPU (another failed) carries no serial label.
    let remediations = stored::list::<GpuRemediation>(client.clone(), &ListParams::default())
        .await
        .map_err(api_error("listing gpuremediations"))?;
    Ok((record, remediations))
}

//! The command line's own subcommands besides `run`: `validate` (policy files, offline) and
//! `explain` (why a node is or is not being remediated). Their logic is pure and unit-tested in
//! the submodules; the two functions here only read files or the cluster and print.

pub mod explain;
pub mod locate;
pub mod overlap;
pub mod validate;

use std::{path::PathBuf, sync::Arc};

use gpu_remediation_api::{GpuRemediation, GpuRemediationPolicy};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client, api::ListParams};

/// `gpu-remediator validate`: prints each finding (`file:line: field: message`) on stdout and a
/// summary on stderr. Returns whether the files pass (the exit status).
pub fn validate_files(paths: &[PathBuf], strict: bool) -> Result<bool, validate::LoadPolicyFilesError> {
    let report = validate::check(&validate::load(paths)?);
    let mut text = String::new();
    for finding in &report.findings {
        text.push_str(&finding.to_string());
        text.push('\n');
    }
    // A reader that stops early (`| head`) is not an error of ours; the exit status still tells.
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes());
    eprintln!("{}", report.summary());
    Ok(report.passes(strict))
}

/// Why `explain` could not read the cluster.
#[derive(Debug, thiserror::Error)]
pub enum ExplainNodeError {
    /// No kubeconfig or in-cluster credentials.
    #[error("loading Kubernetes credentials: {0}")]
    Credentials(#[from] kube::config::InferConfigError),
    /// The client could not be built.
    #[error("building the Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    /// A list call failed.
    #[error("listing {what}: {source}")]
    List {
        /// What was listed.
        what: &'static str,
        /// The API error.
        source: kube::Error,
    },
}

/// `gpu-remediator explain NODE`: reads nodes, policies (those `policy_selector` matches, as the
/// controller would enforce) and remediations, and explains the node.
pub async fn explain_node(
    node: &str,
    policy_selector: Option<&str>,
) -> Result<explain::Explanation, ExplainNodeError> {
    let config = kube::Config::infer().await?;
    let client = Client::try_from(config).map_err(ExplainNodeError::Client)?;
    let list_error = |what| move |source| ExplainNodeError::List { what, source };
    let mut policy_params = ListParams::default();
    if let Some(selector) = policy_selector {
        policy_params = policy_params.labels(selector);
    }
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(list_error("nodes"))?;
    let policies = Api::<GpuRemediationPolicy>::all(client.clone())
        .list(&policy_params)
        .await
        .map_err(list_error("gpuremediationpolicies"))?;
    let remediations = Api::<GpuRemediation>::all(client)
        .list(&ListParams::default())
        .await
        .map_err(list_error("gpuremediations"))?;
    Ok(explain::explain(
        node,
        &shared(nodes.items),
        &shared(policies.items),
        &shared(remediations.items),
        jiff::Timestamp::now(),
    ))
}

fn shared<T>(items: Vec<T>) -> Vec<Arc<T>> {
    items.into_iter().map(Arc::new).collect()
}

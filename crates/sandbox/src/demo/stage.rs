//! What every part of the demo shares: where it plays (the namespaces, the controller's service
//! account, the policy file), how a step of it fails ([`RunDemoError`], [`step`]) and how it
//! speaks ([`Clock`]).

use std::time::Instant;

/// The manifests' namespace and the controller's service account in it.
pub const NAMESPACE: &str = "gpu-remediation";
/// The controller's service account.
pub const SERVICE_ACCOUNT: &str = "gpu-remediator";
/// The sample policy the demo applies.
pub const POLICY_FILE: &str = "config/policy-h100-replace.yaml";
/// Where the demo's GPU workloads run.
pub const WORKLOAD_NAMESPACE: &str = "training";

/// Why the demo stopped short.
#[derive(Debug, thiserror::Error)]
pub enum RunDemoError {
    /// The control plane did not start.
    #[error("starting the control plane: {0}")]
    ControlPlane(#[from] crate::StartControlPlaneError),
    /// A step failed.
    #[error("{step}: {message}")]
    Step {
        /// What was being done.
        step: &'static str,
        /// What went wrong.
        message: String,
    },
    /// The remediation did not finish in time, or ended otherwise than `Succeeded`.
    #[error("the remediation did not succeed: {0}")]
    NotSucceeded(String),
}

pub(crate) fn step<E: std::fmt::Display>(step: &'static str) -> impl FnOnce(E) -> RunDemoError {
    move |error| RunDemoError::Step {
        step,
        message: error.to_string(),
    }
}

/// Prints a line with the time since the demo started.
pub(crate) struct Clock(pub(crate) Instant);

impl Clock {
    pub(crate) fn say(&self, text: &str) {
        println!("[{:>6.1}s] {text}", self.0.elapsed().as_secs_f64());
    }
}

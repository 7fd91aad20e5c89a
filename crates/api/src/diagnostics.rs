//! Diagnostics before destruction: the policy's `diagnostics` section (a Job run on the node
//! once it is drained, before the first step that wipes what the node could tell: a GPU reset, a
//! reboot, a replacement), the record a remediation keeps of the run, and the pure checks of the
//! section. Diagnostics never keep a broken node in service and never block its repair for
//! longer than their timeout: whatever the Job does, the repair goes on.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{duration::Duration, violation::Violation};

/// The longest a diagnostics Job may be given: the repair waits for it.
pub const TIMEOUT_MAX: std::time::Duration = std::time::Duration::from_secs(3600);
/// The label (value `true`) on a diagnostics Job's pods: the sandbox's simulated kubelet finishes
/// such a pod as a collected bug report.
pub const POD_LABEL: &str = "gpuremediation.dev/diagnostics";

/// A Job run on the node before the first step that destroys its state (`ResetGpu`, `Reboot`,
/// `Replace` on a ladder; `action: Reboot` or `Replace` without one), once per remediation, e.g.
/// one collecting `nvidia-bug-report.sh`. The controller pins the Job's pod to the node, lets it
/// tolerate every taint (the node is cordoned and tainted), sets `restartPolicy: Never`,
/// `backoffLimit: 0` unless given, `activeDeadlineSeconds` from `timeout` and
/// `ttlSecondsAfterFinished` (a day) unless given, and owns the Job. The step waits until the Job
/// completes, fails, or `timeout` passes, then goes on whatever it did; a node that is not
/// reachable (`Ready=Unknown`) is not waited for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = diagnostics_schema)]
pub struct Diagnostics {
    /// A `batch/v1` Job (`apiVersion`, `kind`, `metadata.namespace`, `spec`). `{{nodeName}}` and
    /// `{{remediationName}}` are substituted. Unnamed, it is named `<remediation>-diagnostics`.
    #[schemars(schema_with = "crate::node_job::job_schema")]
    pub job: Value,
    /// How long the repair waits for the Job (1s to 1h).
    #[serde(default = "default_timeout")]
    pub timeout: Duration,
}

fn default_timeout() -> Duration {
    Duration::from_mins(10)
}

fn diagnostics_schema(schema: &mut schemars::Schema) {
    crate::node_job::section_rules(schema, "1h", TIMEOUT_MESSAGE, JOB_MESSAGE);
}

/// A diagnostics timeout out of range.
pub const TIMEOUT_MESSAGE: &str = "diagnostics.timeout must be from 1s to 1h";
/// A diagnostics job that is not a namespaced `batch/v1` Job with a spec.
pub const JOB_MESSAGE: &str = "diagnostics.job must be a batch/v1 Job with metadata.namespace and a spec (its template runs on the node)";

/// How a diagnostics run ended. Every outcome lets the repair go on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum DiagnosticsOutcome {
    /// The Job reported `Complete`: what it collected is where the Job put it.
    Collected,
    /// The Job reported `Failed`, was deleted before it reported, or could not be created.
    Failed,
    /// The Job reported nothing within `diagnostics.timeout`.
    TimedOut,
    /// The node was not reachable (`Ready=Unknown`): no Job can run there, none was waited for.
    Unreachable,
}

/// The diagnostics run a remediation made.
pub type DiagnosticsRecord = crate::node_job::JobRecord<DiagnosticsOutcome>;

/// The rules `diagnostics` breaks (`field` is where it sits, e.g. `spec.diagnostics`).
#[must_use]
pub fn check(field: &str, diagnostics: &Diagnostics) -> Vec<Violation> {
    crate::node_job::check(
        field,
        &diagnostics.job,
        diagnostics.timeout.as_std(),
        TIMEOUT_MAX,
        (TIMEOUT_MESSAGE, JOB_MESSAGE),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sample_diagnostics_is_valid_and_a_timeout_past_an_hour_is_refused() {
        let sample: Diagnostics =
            serde_yaml::from_str(include_str!("../../../config/diagnostics/nvidia-bug-report.yaml")).unwrap();
        assert_eq!(check("spec.diagnostics", &sample), Vec::new());
        let policy: crate::GpuRemediationPolicy =
            serde_yaml::from_str(include_str!("../../../config/policy-ladder.yaml")).unwrap();
        assert_eq!(crate::validate::validate_spec(&policy.spec), Vec::new());
        assert_eq!(
            policy.spec.diagnostics.as_ref(),
            Some(&sample),
            "the ladder sample carries it"
        );
        let rendered = sample.job["spec"]["template"]["spec"].to_string();
        assert!(rendered.contains("nvidia-bug-report.sh"), "{rendered}");
        let long = Diagnostics {
            timeout: Duration::from_mins(61),
            ..sample
        };
        let found = check("spec.diagnostics", &long);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].field, "spec.diagnostics.timeout");
    }

    #[test]
    fn an_unset_timeout_is_ten_minutes() {
        let bare: Diagnostics = serde_json::from_value(serde_json::json!({"job": {
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"namespace": "ops"},
            "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}}}))
        .unwrap();
        assert_eq!(bare.timeout.as_std(), std::time::Duration::from_secs(600));
        assert_eq!(check("spec.diagnostics", &bare), Vec::new());
    }
}

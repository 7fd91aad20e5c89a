//! Validation before release: the policy's `validation` section (a Job run on the node once a
//! repair shows evidence, whose success alone lets the node back into service), the record a
//! remediation keeps of each validation run, and the pure checks of the section.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use crate::node_job::MESSAGE_MAX;
use crate::{duration::Duration, violation::Violation};

/// The longest a validation Job may be given.
pub const TIMEOUT_MAX: std::time::Duration = std::time::Duration::from_secs(6 * 3600);
/// The label (value `true`) on a validation Job's pods: the sandbox's simulated kubelet decides
/// such a pod's outcome from the node's simulated GPUs.
pub const POD_LABEL: &str = "gpuremediation.dev/validation";

/// A Job run on a repaired node before it is released: a node returns to service only when the
/// Job succeeds. The controller pins the Job's pod to the node (`spec.nodeName`), lets it tolerate
/// every taint (the node is still cordoned and tainted), sets `restartPolicy: Never`,
/// `backoffLimit: 0` unless given and `activeDeadlineSeconds` from `timeout`, and owns the Job
/// (deleted when the remediation goes).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = validation_schema)]
pub struct Validation {
    /// A `batch/v1` Job (`apiVersion`, `kind`, `metadata.namespace`, `spec`), e.g. one running
    /// `dcgmi diag -r 2`. `{{nodeName}}` and `{{remediationName}}` are substituted. Unnamed, it is
    /// named `<remediation>-validate-<step>`. Pass: the Job reports `Complete`; fail: `Failed`.
    #[schemars(schema_with = "crate::node_job::job_schema")]
    pub job: Value,
    /// How long the Job may run before it counts as failed (1s to 6h).
    #[serde(default = "default_timeout")]
    pub timeout: Duration,
    /// Validate new nodes too, before they take work: a node this policy governs that registers
    /// with the [`UNVALIDATED_TAINT_KEY`](crate::constants::UNVALIDATED_TAINT_KEY) taint (kubelet
    /// `--register-with-taints`, Karpenter `startupTaints`) runs the same Job, and the controller
    /// lifts that taint only when it passes. Unset: new nodes are not validated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_nodes: Option<NewNodes>,
}

/// How new nodes are validated (see [`Validation::new_nodes`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::new_nodes)]
pub struct NewNodes {
    /// At most this many new nodes' validation Jobs run at once (1 to 1000; default 1), oldest
    /// node first; the others wait, and their `GpuValidated` condition says why.
    #[serde(default = "default_new_nodes_max")]
    pub max: u32,
}

fn default_new_nodes_max() -> u32 {
    1
}

fn default_timeout() -> Duration {
    Duration::from_mins(15)
}

fn validation_schema(schema: &mut schemars::Schema) {
    crate::node_job::section_rules(schema, "6h", TIMEOUT_MESSAGE, JOB_MESSAGE);
}

/// A validation timeout out of range.
pub const TIMEOUT_MESSAGE: &str = "validation.timeout must be from 1s to 6h";
/// A validation job that is not a namespaced `batch/v1` Job with a spec.
pub const JOB_MESSAGE: &str = "validation.job must be a batch/v1 Job with metadata.namespace and a spec (its template runs on the node)";

/// How a validation run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ValidationOutcome {
    /// The Job reported `Complete`: the node may return to service.
    Passed,
    /// The Job reported `Failed` (or was deleted before it reported): evidence against the repair.
    Failed,
    /// The Job reported nothing within `validation.timeout`: evidence against the repair.
    TimedOut,
}

/// One validation run a remediation made.
pub type ValidationRecord = crate::node_job::JobRecord<ValidationOutcome>;

/// The rules `validation` breaks (`field` is where it sits, e.g. `spec.validation`).
#[must_use]
pub fn check(field: &str, validation: &Validation) -> Vec<Violation> {
    let mut out = crate::node_job::check(
        field,
        &validation.job,
        validation.timeout.as_std(),
        TIMEOUT_MAX,
        (TIMEOUT_MESSAGE, JOB_MESSAGE),
    );
    if let Some(new_nodes) = &validation.new_nodes {
        let at = format!("{field}.newNodes.max");
        if new_nodes.max < 1 {
            out.push(Violation::new(at, crate::schema::messages::NEW_NODES_MAX));
        } else if new_nodes.max > crate::bounds::NEW_NODES_MAX {
            out.push(Violation::new(at, crate::schema::messages::NEW_NODES_MAX_ABOVE));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn job() -> Value {
        json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"namespace": "gpu-ops"},
               "spec": {"template": {"spec": {"containers": [{"name": "diag", "image": "dcgm", "command": ["dcgmi", "diag", "-r", "2"]}]}}}})
    }

    #[test]
    fn the_sample_validation_and_the_ladder_policy_that_carries_it_are_valid() {
        let sample: Validation =
            serde_yaml::from_str(include_str!("../../../config/validation/dcgm-diag.yaml")).unwrap();
        assert_eq!(check("validation", &sample), Vec::new());
        assert_eq!(sample.new_nodes.as_ref().map(|n| n.max), Some(2));
        let policy: crate::GpuRemediationPolicy =
            serde_yaml::from_str(include_str!("../../../config/policy-ladder.yaml")).unwrap();
        assert_eq!(crate::validate::validate_spec(&policy.spec), Vec::new());
        let carried = policy.spec.validation.expect("the ladder sample validates");
        assert_eq!(carried.job["spec"], sample.job["spec"]);
        let nccl: Validation =
            serde_yaml::from_str(include_str!("../../../config/validation/nccl-all-reduce.yaml")).unwrap();
        assert_eq!(check("validation", &nccl), Vec::new());
        assert!(nccl.job["spec"].to_string().contains("all_reduce_perf"));
    }

    #[test]
    fn new_nodes_default_to_one_at_a_time_and_must_be_from_1_to_1000() {
        let parsed: Validation = serde_json::from_value(json!({"job": job(), "newNodes": {}})).unwrap();
        assert_eq!(parsed.new_nodes.as_ref().map(|n| n.max), Some(1));
        assert_eq!(check("spec.validation", &parsed), Vec::new());
        for max in [0, 1001] {
            let mut bad = parsed.clone();
            bad.new_nodes = Some(NewNodes { max });
            let found = check("spec.validation", &bad);
            assert_eq!(found.len(), 1, "{found:?}");
            assert_eq!(found[0].field, "spec.validation.newNodes.max");
        }
    }

    #[test]
    fn a_namespaced_job_with_a_spec_and_a_timeout_in_range_is_valid() {
        let v = Validation {
            job: job(),
            timeout: Duration::from_mins(10),
            new_nodes: None,
        };
        assert_eq!(check("spec.validation", &v), Vec::new());
    }

    #[test]
    fn another_kind_a_job_without_namespace_or_a_timeout_past_6h_is_refused() {
        let mut other = job();
        other["kind"] = json!("Pod");
        let mut bare = job();
        bare["metadata"] = json!({});
        let mut broken = job();
        broken["spec"]["template"] = json!("not a pod template");
        for (job, field) in [
            (other, "spec.validation.job"),
            (bare, "spec.validation.job"),
            (broken, "spec.validation.job.spec"),
        ] {
            let found = check(
                "spec.validation",
                &Validation {
                    job,
                    timeout: Duration::from_mins(1),
                    new_nodes: None,
                },
            );
            assert_eq!(found.len(), 1, "{found:?}");
            assert_eq!(found[0].field, field);
        }
        let long = Validation {
            job: job(),
            timeout: Duration::from_hours(7),
            new_nodes: None,
        };
        assert_eq!(
            check("spec.validation", &long)[0].field,
            "spec.validation.timeout"
        );
    }
}

//! Objects the unit tests of several modules build alike (test-only).

use gpu_remediation_api::{
    GpuRemediation, GpuRemediationSpec,
    policy::{Action, ConditionStatus, Mode},
    remediation::TriggerRecord,
};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Remediation `name` of `node` under `policy`, enforced, with action `action`: its trigger
/// `GpuHealthy=False` (`XID79`, no message), its episode begun at `since`; no status.
pub(crate) fn remediation(
    name: &str,
    node: &str,
    policy: &str,
    since: Option<Timestamp>,
    action: Action,
) -> GpuRemediation {
    GpuRemediation::new(
        name,
        GpuRemediationSpec {
            node_name: node.into(),
            policy_name: policy.into(),
            trigger: TriggerRecord {
                condition_type: "GpuHealthy".into(),
                status: ConditionStatus::False,
                reason: "XID79".into(),
                message: String::new(),
                since: since.map(Time),
            },
            action,
            mode: Mode::Enforce,
            node_uid: None,
            previous_incident: None,
            policy_snapshot: None,
            hardware: None,
        },
    )
}

/// `secs` seconds after a fixed instant (2027-01-15), the clock the unit tests reason in.
pub(crate) fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

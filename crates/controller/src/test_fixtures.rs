//! Objects the unit tests of several modules build alike (test-only).

use gpu_remediation_api::{
    GpuRemediation, GpuRemediationSpec,
    policy::{Action, ConditionStatus, Mode},
    remediation::TriggerRecord,
};
use jiff::Timestamp;
use k8s_openapi::{
    api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
};

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

/// Node `name` (UID `uid-<name>`, resourceVersion 1): `GpuHealthy=False` (`XID79`, "GPU 1 fell off
/// the bus") since `broken_since`, or `True` without it.
pub(crate) fn node(name: &str, broken_since: Option<Timestamp>) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            resource_version: Some("1".into()),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec::default()),
        status: Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "GpuHealthy".into(),
                status: if broken_since.is_some() { "False" } else { "True" }.into(),
                reason: Some("XID79".into()),
                message: broken_since.map(|_| "GPU 1 fell off the bus".into()),
                last_transition_time: Some(Time(broken_since.unwrap_or(Timestamp::UNIX_EPOCH))),
                ..NodeCondition::default()
            }]),
            ..NodeStatus::default()
        }),
    }
}

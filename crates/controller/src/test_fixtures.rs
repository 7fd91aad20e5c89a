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

/// Node `name` carrying `labels`, and nothing else.
pub(crate) fn labelled(name: &str, labels: &[(&str, &str)]) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        },
        ..Node::default()
    }
}

/// What a lifecycle pass sees of `node` (if any) with `answers`: no pods, no budget, nothing in
/// flight, no object looked at, a 1 s pod poll, a 5 s eviction backoff.
pub(crate) fn seen<'a>(
    node: Option<&'a Node>,
    answers: &'a crate::lifecycle::Answers,
) -> crate::lifecycle::Seen<'a> {
    static NONE_IN_FLIGHT: std::sync::LazyLock<std::collections::BTreeMap<String, u32>> =
        std::sync::LazyLock::new(std::collections::BTreeMap::new);
    fn never(_: &str) -> Option<Timestamp> {
        None
    }
    crate::lifecycle::Seen {
        node: node.map(|n| n as &dyn crate::observe::NodeView),
        pods: None,
        drain_scope: None,
        gangs: &[],
        budgets: &[],
        in_flight: &NONE_IN_FLIGHT,
        asked_at: &never,
        replacement: None,
        validation: None,
        diagnostics: None,
        answers,
        pace: crate::lifecycle::Pace {
            pod_poll: jiff::SignedDuration::from_secs(1),
            eviction_backoff: jiff::SignedDuration::from_secs(5),
            replacement_poll: jiff::SignedDuration::from_secs(2),
        },
    }
}

/// A running, ready pod `work/<name>` (UID `uid-<name>`) labelled `app=<app>`, to be evicted.
pub(crate) fn leaving(name: &str, app: &str) -> crate::drain::Leaving {
    crate::drain::Leaving {
        namespace: "work".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        terminating: false,
        gone_by: None,
        labels: [("app".to_owned(), app.to_owned())].into(),
        readiness: crate::drain::Readiness::Ready,
        notice: crate::drain::Notice::default(),
        gpus: 0,
    }
}

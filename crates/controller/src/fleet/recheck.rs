//! The last look before a remediation is created: the plan is made from cached nodes, which can be
//! a moment behind, so admission reads each admitted node afresh (at least as fresh as our cache,
//! from the API server's watch cache: `read::node_read`) and this module decides, from that
//! read, whether the node is still due. A node that recovered in the meantime (a burst's node
//! healthy again 13 ms before it would have been cordoned) is not remediated; the next pass plans
//! again from what the cache then holds. Pure.

use gpu_remediation_api::{
    GpuRemediation,
    policy::{GpuRemediationPolicyStatus, Mode, Trigger},
};
use jiff::Timestamp;

use crate::{
    detect::{self, Verdict},
    first_seen::FirstSeen,
    observe::{NodeConditionRef, NodeView},
};

/// Why an admitted node is no longer due, as a sentence; `None`: it is, create its remediation.
#[must_use]
pub fn no_longer_due(
    remediation: &GpuRemediation,
    fresh: Option<&(impl NodeView + ?Sized)>,
    triggers: &[Trigger],
    first_seen: &FirstSeen,
    now: Timestamp,
) -> Option<String> {
    let node = &remediation.spec.node_name;
    let Some(fresh) = fresh else {
        return Some(format!("node {node} is gone"));
    };
    if remediation.spec.node_uid.is_some() && fresh.node_uid() != remediation.spec.node_uid.as_deref() {
        return Some(format!("node {node} was replaced by another of the same name"));
    }
    let conditions = fresh.conditions();
    let since = |condition: NodeConditionRef<'_>| first_seen.since(node, condition, now);
    match detect::evaluate_with(conditions, triggers, now, since) {
        Verdict::Unhealthy { .. } => None,
        Verdict::Healthy { since } => Some(format!(
            "node {node} recovered{} (no trigger holds on a fresh read): not cordoned",
            since.map_or_else(String::new, |t| format!(" at {t}"))
        )),
        Verdict::Pending { due, .. } => Some(format!(
            "node {node} recovered and broke again: its new episode is due at {due}, not now"
        )),
    }
}

/// Gives a remediation the plan counted back to the status the pass writes, when its node was
/// no longer due: one fewer in flight, its slot free again (a dry run counted nothing).
pub fn not_started(status: &mut GpuRemediationPolicyStatus, mode: Mode) {
    if mode == Mode::DryRun {
        return;
    }
    status.in_flight = status.in_flight.saturating_sub(1);
    if let Some(budget) = status.budget.as_mut() {
        budget.remaining += 1;
        budget.started_in_window = budget.started_in_window.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use gpu_remediation_api::{GpuRemediationPolicySpec, GpuRemediationSpec};
    use k8s_openapi::{
        api::core::v1::{NodeCondition, NodeStatus},
        apimachinery::pkg::apis::meta::v1::Time,
    };
    use kube::api::ObjectMeta;

    use super::*;
    use crate::test_fixtures::at;
    use k8s_openapi::api::core::v1::Node;

    fn triggers() -> Vec<Trigger> {
        let spec: GpuRemediationPolicySpec = serde_json::from_value(serde_json::json!({
            "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "5s"}],
        }))
        .unwrap();
        spec.triggers
    }

    fn admitted() -> GpuRemediation {
        let spec: GpuRemediationSpec = serde_json::from_value(serde_json::json!({
            "nodeName": "gpu-1", "nodeUID": "uid-1", "policyName": "p", "action": "None",
            "trigger": {"conditionType": "GpuHealthy", "status": "False", "reason": "XID79"},
        }))
        .unwrap();
        GpuRemediation::new("r", spec)
    }

    fn node(uid: &str, status: &str, changed: i64) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("gpu-1".into()),
                uid: Some(uid.into()),
                ..ObjectMeta::default()
            },
            spec: None,
            status: Some(NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: "GpuHealthy".into(),
                    status: status.into(),
                    last_transition_time: Some(Time(at(changed))),
                    ..NodeCondition::default()
                }]),
                ..NodeStatus::default()
            }),
        }
    }

    #[test]
    fn a_node_still_broken_on_the_fresh_read_is_due() {
        assert_eq!(
            no_longer_due(
                &admitted(),
                Some(&node("uid-1", "False", 0)),
                &triggers(),
                &FirstSeen::default(),
                at(10)
            ),
            None
        );
    }

    #[test]
    fn a_node_that_recovered_since_the_cached_read_is_not_cordoned() {
        let why = no_longer_due(
            &admitted(),
            Some(&node("uid-1", "True", 10)),
            &triggers(),
            &FirstSeen::default(),
            at(10),
        )
        .unwrap();
        assert!(
            why.contains("recovered at 2027") && why.ends_with("not cordoned"),
            "{why}"
        );
    }

    #[test]
    fn a_node_that_broke_again_within_for_waits_for_its_new_episode() {
        let why = no_longer_due(
            &admitted(),
            Some(&node("uid-1", "False", 8)),
            &triggers(),
            &FirstSeen::default(),
            at(10),
        )
        .unwrap();
        assert!(why.contains("broke again"), "{why}");
    }

    #[test]
    fn a_remediation_not_started_gives_its_slot_back_unless_it_was_a_dry_run() {
        let mut status = GpuRemediationPolicyStatus {
            in_flight: 2,
            budget: Some(gpu_remediation_api::policy::BudgetStatus {
                remaining: 0,
                started_in_window: 2,
                next_slot_at: None,
            }),
            ..GpuRemediationPolicyStatus::default()
        };
        not_started(&mut status, Mode::DryRun);
        assert_eq!(status.in_flight, 2);
        not_started(&mut status, Mode::Enforce);
        let budget = status.budget.unwrap();
        assert_eq!(
            (status.in_flight, budget.remaining, budget.started_in_window),
            (1, 1, 1)
        );
    }

    #[test]
    fn a_gone_or_replaced_node_is_not_due() {
        assert!(
            no_longer_due(
                &admitted(),
                None::<&Node>,
                &triggers(),
                &FirstSeen::default(),
                at(10)
            )
            .is_some_and(|w| w.contains("gone"))
        );
        let replaced = no_longer_due(
            &admitted(),
            Some(&node("uid-2", "False", 0)),
            &triggers(),
            &FirstSeen::default(),
            at(10),
        );
        assert!(replaced.is_some_and(|w| w.contains("replaced")));
    }
}

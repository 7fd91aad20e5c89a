//! Recoveries arriving together are judged together: a node whose trigger stopped holding less
//! than [`RECOVERY_SETTLE`] ago is *recovering*, and while counting the recovering nodes as still
//! unhealthy would keep the circuit breaker open, the breaker's closing waits for them to settle.
//! Without it, the first of two recoveries 100 ms apart closes the breaker, and the second
//! recovering node, broken still in the snapshot (and in the fresh read just before admission, if
//! that came first), is admitted and cordoned. Pure.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;

use crate::detect::Verdict;
use crate::first_seen::FirstSeen;
use crate::time::{minus, plus, signed};

/// How long a recovery counts as arriving with the others. Condition times are whole seconds
/// (an agent's recovery at 12:00:05.9 reads 12:00:05), so a recovery is recent for one to two
/// seconds of the controller's clock.
pub const RECOVERY_SETTLE: std::time::Duration = std::time::Duration::from_secs(2);

/// The policy's recovering nodes among `nodes` (by its triggers, at `now`): how many, and when
/// the last of them is settled. `None` when none is recovering.
#[must_use]
pub fn recovering(
    spec: &gpu_remediation_api::GpuRemediationPolicySpec,
    nodes: &[&Node],
    first_seen: &FirstSeen,
    now: Timestamp,
) -> Option<(u32, Timestamp)> {
    let horizon = minus(now, signed(RECOVERY_SETTLE));
    let mut count = 0u32;
    let mut settled = None;
    for node in nodes {
        if let Verdict::Healthy { since: Some(since) } = super::verdict(node, spec, first_seen, now)
            && since > horizon
            && since <= now
        {
            count += 1;
            settled = settled.max(Some(plus(since, signed(RECOVERY_SETTLE))));
        }
    }
    settled.map(|at| (count, at))
}

/// When a condition of `node` of a trigger's type turned to a status no trigger of that type
/// matches, if after `horizon` (the latest such time): the node may be recovering. `signals` are
/// the live triggers' (type, status).
#[must_use]
pub fn recent_recovery(node: &Node, signals: &[(String, String)], horizon: Timestamp) -> Option<Timestamp> {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default()
        .iter()
        .filter(|c| {
            signals.iter().any(|(type_, _)| *type_ == c.type_)
                && !signals
                    .iter()
                    .any(|(type_, status)| *type_ == c.type_ && *status == c.status)
        })
        .filter_map(|c| c.last_transition_time.as_ref().map(|t| t.0))
        .filter(|at| *at > horizon)
        .max()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::core::v1::{NodeCondition, NodeStatus},
        apimachinery::pkg::apis::meta::v1::Time,
    };

    use super::*;
    use crate::test_fixtures::at;

    fn node(status: &str, since: i64) -> Node {
        Node {
            status: Some(NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: "GpuHealthy".into(),
                    status: status.into(),
                    last_transition_time: Some(Time(at(since))),
                    ..NodeCondition::default()
                }]),
                ..NodeStatus::default()
            }),
            ..Node::default()
        }
    }

    fn spec() -> gpu_remediation_api::GpuRemediationPolicySpec {
        serde_json::from_value(serde_json::json!({
            "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "1s"}],
        }))
        .unwrap()
    }

    #[test]
    fn nodes_healthy_again_within_the_settle_are_recovering_until_the_last_settles() {
        let (a, b, old, broken) = (
            node("True", 9),
            node("True", 10),
            node("True", 2),
            node("False", 10),
        );
        assert_eq!(
            recovering(&spec(), &[&a, &b, &old, &broken], &FirstSeen::default(), at(10)),
            Some((2, plus(at(10), signed(RECOVERY_SETTLE))))
        );
        assert_eq!(
            recovering(&spec(), &[&old, &broken], &FirstSeen::default(), at(10)),
            None
        );
    }

    #[test]
    fn the_index_keeps_a_node_whose_trigger_condition_turned_recently() {
        let signals = [("GpuHealthy".to_owned(), "False".to_owned())];
        let horizon = at(8);
        assert_eq!(recent_recovery(&node("True", 9), &signals, horizon), Some(at(9)));
        assert_eq!(recent_recovery(&node("True", 7), &signals, horizon), None);
        assert_eq!(
            recent_recovery(&node("False", 9), &signals, horizon),
            None,
            "still broken"
        );
    }
}

//! Recoveries arriving together are judged together: a node whose trigger stopped holding less
//! than [`RECOVERY_SETTLE`] ago is *recovering*, and while counting the recovering nodes as still
//! unhealthy would keep the circuit breaker open, the breaker's closing waits for them to settle.
//! Without it, the first of two recoveries 100 ms apart closes the breaker, and the second
//! recovering node, broken still in the snapshot (and in the fresh read just before admission, if
//! that came first), is admitted and cordoned. Pure.

use jiff::Timestamp;

use crate::{
    observe::NodeView,
    time::{minus, plus, signed},
};

/// How long a recovery counts as arriving with the others. Condition times are whole seconds
/// (an agent's recovery at 12:00:05.9 reads 12:00:05), so a recovery is recent for one to two
/// seconds of the controller's clock.
pub const RECOVERY_SETTLE: std::time::Duration = std::time::Duration::from_secs(2);

/// The policy's recovering nodes, counted over its nodes' verdicts (by its triggers, at `now`;
/// `fleet::detect_all` notes each healthy one): how many, and when the last of them is settled.
pub struct Recovering {
    now: Timestamp,
    horizon: Timestamp,
    count: u32,
    settled: Option<Timestamp>,
}

impl Recovering {
    /// None counted yet, at `now`.
    #[must_use]
    pub fn new(now: Timestamp) -> Self {
        Self {
            now,
            horizon: minus(now, signed(RECOVERY_SETTLE)),
            count: 0,
            settled: None,
        }
    }

    /// Notes a node healthy by the policy's triggers since `since` (`None`: no trigger's condition
    /// present): recovering if that was within [`RECOVERY_SETTLE`].
    pub fn note(&mut self, since: Option<Timestamp>) {
        if let Some(since) = since
            && since > self.horizon
            && since <= self.now
        {
            self.count += 1;
            self.settled = self.settled.max(Some(plus(since, signed(RECOVERY_SETTLE))));
        }
    }

    /// How many are recovering, and when the last is settled. `None` when none is.
    #[must_use]
    pub fn found(self) -> Option<(u32, Timestamp)> {
        self.settled.map(|at| (self.count, at))
    }
}

/// When a condition of `node` of a trigger's type turned to a status no trigger of that type
/// matches, if after `horizon` (the latest such time): the node may be recovering. `signals` are
/// the live triggers' (type, status).
#[must_use]
pub fn recent_recovery(
    node: &(impl NodeView + ?Sized),
    signals: &[(String, String)],
    horizon: Timestamp,
) -> Option<Timestamp> {
    node.conditions()
        .iter()
        .filter(|c| {
            signals.iter().any(|(type_, _)| *type_ == c.type_)
                && !signals
                    .iter()
                    .any(|(type_, status)| *type_ == c.type_ && *status == c.status)
        })
        .filter_map(|c| c.last_transition_time)
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
    use crate::{first_seen::FirstSeen, test_fixtures::at};
    use k8s_openapi::api::core::v1::Node;

    /// The recovering nodes among `nodes`, as the fleet plan counts them.
    fn recovering(
        spec: &gpu_remediation_api::GpuRemediationPolicySpec,
        nodes: &[&Node],
        first_seen: &FirstSeen,
        now: Timestamp,
    ) -> Option<(u32, Timestamp)> {
        super::super::detect_all(nodes, spec, first_seen, now).recovering
    }

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

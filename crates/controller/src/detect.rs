//! Detection: whether a node is unhealthy under a policy's triggers, given its conditions and the
//! time. Pure: no API call, no clock of its own.
//!
//! The clock of a trigger is the matching condition's `lastTransitionTime`. The API server stores
//! whatever time the condition's writer sends; writers (this project's agent, node-problem-detector)
//! move it only when the condition's *status* changes, so a change of reason within the same status
//! does not restart the clock, and a return to healthy (a status change) does: exactly the
//! semantics the policy documents. Since the writer chooses the time, a `lastTransitionTime` in the
//! future counts as now (the clock starts no earlier than the controller sees the condition); the
//! agent's admission policy (`manifests/agent/`) refuses future times and other nodes' conditions.

use gpu_remediation_api::policy::Trigger;
use jiff::Timestamp;

use crate::{
    observe::{NodeConditionRef, NodeConditions},
    time::{plus, signed},
};

/// The node condition that made a verdict, as observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Evidence {
    /// Index of the trigger in the policy's `triggers`.
    pub trigger: usize,
    /// The condition type.
    pub condition_type: String,
    /// The condition's reason (empty when the writer set none).
    pub reason: String,
    /// The condition's message.
    pub message: String,
    /// Since when the condition has held (its `lastTransitionTime`).
    pub since: Timestamp,
}

/// What the triggers say about a node now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// No trigger's condition holds. `since` is when the last of the triggers' conditions changed
    /// to a non-matching status (`None` when none of them is present, i.e. healthy forever).
    Healthy {
        /// Since when the node has been healthy, as far as the conditions tell.
        since: Option<Timestamp>,
    },
    /// A trigger's condition holds but not yet for its `for`; it becomes unhealthy at `due`.
    Pending {
        /// The condition, and since when it holds.
        evidence: Evidence,
        /// When the node turns unhealthy if the condition keeps holding.
        due: Timestamp,
    },
    /// A trigger's condition has held for at least its `for`.
    Unhealthy {
        /// The condition, and since when it holds.
        evidence: Evidence,
    },
}

impl Verdict {
    /// Whether the node counts as unhealthy now.
    #[must_use]
    pub const fn is_unhealthy(&self) -> bool {
        matches!(self, Self::Unhealthy { .. })
    }
}

/// Whether `condition` is the state `trigger` describes: same type, same status, and (when the
/// trigger lists reasons) one of its reasons.
#[must_use]
pub fn condition_matches(trigger: &Trigger, condition: NodeConditionRef<'_>) -> bool {
    condition.type_ == trigger.condition_type
        && condition.status == trigger.status.as_str()
        && (trigger.reasons.is_empty()
            || condition
                .reason
                .is_some_and(|reason| trigger.reasons.iter().any(|r| r == reason)))
}

/// The verdict of `triggers` (OR-ed) on a node with `conditions`, at `now`.
///
/// When several triggers hold, the one that has held longest decides, so a node is reported
/// unhealthy as early as any trigger allows. A matching condition without `lastTransitionTime`
/// counts as having just started: the clock cannot be trusted, so the node is not condemned on it
/// (the controller's passes use [`evaluate_with`] and remember when they first saw it, see
/// `first_seen`).
#[must_use]
pub fn evaluate<'a>(
    conditions: impl Into<NodeConditions<'a>>,
    triggers: &[Trigger],
    now: Timestamp,
) -> Verdict {
    // A time in the future is the writer's clock or a forgery; it counts as now.
    evaluate_with(conditions, triggers, now, |condition| {
        condition.last_transition_time.map_or(now, |t| t.min(now))
    })
}

/// [`evaluate`], each condition's clock (since when it holds) given by `since`.
#[must_use]
pub fn evaluate_with<'a>(
    conditions: impl Into<NodeConditions<'a>>,
    triggers: &[Trigger],
    now: Timestamp,
    since: impl Fn(NodeConditionRef<'_>) -> Timestamp,
) -> Verdict {
    let conditions = conditions.into();
    let mut unhealthy: Option<Evidence> = None;
    let mut pending: Option<(Evidence, Timestamp)> = None;
    let mut healthy_since: Option<Timestamp> = None;

    for (index, trigger) in triggers.iter().enumerate() {
        let Some(condition) = conditions.iter().find(|c| c.type_ == trigger.condition_type) else {
            continue;
        };
        let changed_at = since(condition).min(now);
        if !condition_matches(trigger, condition) {
            healthy_since = Some(healthy_since.map_or(changed_at, |t| t.max(changed_at)));
            continue;
        }
        let evidence = Evidence {
            trigger: index,
            condition_type: condition.type_.to_owned(),
            reason: condition.reason.unwrap_or_default().to_owned(),
            message: condition.message.unwrap_or_default().to_owned(),
            since: changed_at,
        };
        let due = plus(changed_at, signed(trigger.for_.as_std()));
        if due <= now {
            if unhealthy.as_ref().is_none_or(|held| evidence.since < held.since) {
                unhealthy = Some(evidence);
            }
        } else if pending.as_ref().is_none_or(|(_, soonest)| due < *soonest) {
            pending = Some((evidence, due));
        }
    }

    match (unhealthy, pending) {
        (Some(evidence), _) => Verdict::Unhealthy { evidence },
        (None, Some((evidence, due))) => Verdict::Pending { evidence, due },
        (None, None) => Verdict::Healthy { since: healthy_since },
    }
}

#[cfg(test)]
mod tests {
    use gpu_remediation_api::{Duration, policy::ConditionStatus};
    use k8s_openapi::{api::core::v1::NodeCondition, apimachinery::pkg::apis::meta::v1::Time};

    use super::*;
    use crate::test_fixtures::at;

    fn condition(type_: &str, status: &str, reason: &str, since: i64) -> NodeCondition {
        NodeCondition {
            type_: type_.into(),
            status: status.into(),
            reason: Some(reason.into()),
            message: Some(format!("{reason} on GPU 0")),
            last_transition_time: Some(Time(at(since))),
            ..NodeCondition::default()
        }
    }

    fn trigger(reasons: &[&str], for_secs: u64) -> Trigger {
        Trigger {
            condition_type: "GpuHealthy".into(),
            status: ConditionStatus::False,
            reasons: reasons.iter().map(|r| (*r).to_owned()).collect(),
            for_: Duration::from_secs(for_secs),
            action: None,
            quarantine: None,
            start_at: None,
        }
    }

    #[test]
    fn a_condition_held_for_its_full_toleration_makes_the_node_unhealthy() {
        let verdict = evaluate(
            &[condition("GpuHealthy", "False", "XID79", 0)],
            &[trigger(&[], 120)],
            at(120),
        );
        let Verdict::Unhealthy { evidence } = verdict else {
            panic!("expected unhealthy, got {verdict:?}")
        };
        assert_eq!(evidence.reason, "XID79");
        assert_eq!(evidence.since, at(0));
    }

    #[test]
    fn a_condition_held_for_less_than_its_toleration_is_pending_until_it_elapses() {
        let verdict = evaluate(
            &[condition("GpuHealthy", "False", "XID79", 0)],
            &[trigger(&[], 120)],
            at(119),
        );
        assert!(
            matches!(verdict, Verdict::Pending { due, .. } if due == at(120)),
            "{verdict:?}"
        );
    }

    #[test]
    fn a_reason_outside_the_trigger_list_does_not_count() {
        let verdict = evaluate(
            &[condition("GpuHealthy", "False", "XID13", 0)],
            &[trigger(&["XID79"], 10)],
            at(600),
        );
        assert!(
            matches!(verdict, Verdict::Healthy { since: Some(t) } if t == at(0)),
            "{verdict:?}"
        );
    }

    #[test]
    fn a_trigger_selects_the_agents_nvlink_and_fabric_faults_by_reason() {
        use gpu_remediation_api::constants::gpu_reasons::{FABRIC_NOT_READY, NVLINK_DOWN, NVLINK_ERRORS};
        let nvlink_only = trigger(&[NVLINK_DOWN, NVLINK_ERRORS], 10);
        for reason in [NVLINK_DOWN, NVLINK_ERRORS] {
            assert!(
                condition_matches(
                    &nvlink_only,
                    (&condition("GpuHealthy", "False", reason, 0)).into()
                ),
                "{reason}"
            );
        }
        assert!(!condition_matches(
            &nvlink_only,
            (&condition("GpuHealthy", "False", FABRIC_NOT_READY, 0)).into()
        ));
        let verdict = evaluate(
            &[condition("GpuHealthy", "False", FABRIC_NOT_READY, 0)],
            &[nvlink_only, trigger(&[FABRIC_NOT_READY], 10)],
            at(10),
        );
        let Verdict::Unhealthy { evidence } = verdict else {
            panic!("expected unhealthy, got {verdict:?}")
        };
        assert_eq!(evidence.reason, "FabricNotReady");
    }

    #[test]
    fn a_healthy_condition_reports_since_when_it_has_been_healthy() {
        let verdict = evaluate(
            &[condition("GpuHealthy", "True", "GpusHealthy", 30)],
            &[trigger(&[], 10)],
            at(600),
        );
        assert_eq!(verdict, Verdict::Healthy { since: Some(at(30)) });
    }

    #[test]
    fn a_node_without_the_condition_is_healthy_forever() {
        let verdict = evaluate(
            &[condition("Ready", "True", "KubeletReady", 0)],
            &[trigger(&[], 10)],
            at(600),
        );
        assert_eq!(verdict, Verdict::Healthy { since: None });
    }

    #[test]
    fn the_trigger_that_has_held_longest_decides() {
        let triggers = [
            trigger(&[], 10),
            Trigger {
                condition_type: "GpuMissing".into(),
                status: ConditionStatus::True,
                ..trigger(&[], 10)
            },
        ];
        let conditions = [
            condition("GpuHealthy", "False", "XID79", 50),
            condition("GpuMissing", "True", "Lost", 20),
        ];
        let Verdict::Unhealthy { evidence } = evaluate(&conditions, &triggers, at(100)) else {
            panic!()
        };
        assert_eq!((evidence.trigger, evidence.since), (1, at(20)));
    }

    #[test]
    fn an_elapsed_trigger_wins_over_one_still_pending() {
        let triggers = [
            trigger(&[], 1000),
            Trigger {
                condition_type: "GpuMissing".into(),
                status: ConditionStatus::True,
                ..trigger(&[], 10)
            },
        ];
        let conditions = [
            condition("GpuHealthy", "False", "XID79", 0),
            condition("GpuMissing", "True", "Lost", 50),
        ];
        let Verdict::Unhealthy { evidence } = evaluate(&conditions, &triggers, at(100)) else {
            panic!()
        };
        assert_eq!(evidence.trigger, 1);
    }

    #[test]
    fn a_matching_condition_without_a_transition_time_has_only_just_started() {
        let mut c = condition("GpuHealthy", "False", "XID79", 0);
        c.last_transition_time = None;
        let verdict = evaluate(&[c], &[trigger(&[], 10)], at(100));
        assert!(
            matches!(verdict, Verdict::Pending { due, .. } if due == at(110)),
            "{verdict:?}"
        );
    }

    #[test]
    fn a_transition_time_in_the_future_counts_as_now_so_the_clock_starts_when_seen() {
        let triggers = [trigger(&[], 60)];
        let conditions = [condition("GpuHealthy", "False", "XID79", 1000 + 3600)];
        match evaluate(&conditions, &triggers, at(1000)) {
            Verdict::Pending { evidence, due } => {
                assert_eq!(evidence.since, at(1000));
                assert_eq!(due, at(1060));
            }
            other => panic!("a future time must not condemn nor be kept: {other:?}"),
        }
        assert!(!evaluate(&conditions, &triggers, at(1059)).is_unhealthy());
    }

    #[test]
    fn a_zero_toleration_condemns_at_once() {
        let verdict = evaluate(
            &[condition("GpuHealthy", "False", "XID79", 100)],
            &[trigger(&[], 0)],
            at(100),
        );
        assert!(verdict.is_unhealthy());
    }
}

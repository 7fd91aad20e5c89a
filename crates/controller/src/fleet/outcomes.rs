//! The outcomes of a policy's finished remediations, read from the records kept in the API
//! server and the nodes as they are now, for slow start. Pure.
//!
//! A `Failed` remediation is a failure when it failed. A `Succeeded` one is proven
//! `release.healthyFor` after it ended, if its node (or, replaced under the same name, its
//! replacement) is Ready and its trigger has not held since before that time; a trigger
//! that began to hold again within that time makes it a failure (a relapse). A replaced node that
//! left under its name is judged by the record alone: `Succeeded` already means its replacement
//! was Ready. Cancelled, dry-run and `ManualRequired` records say nothing, nor does a `DeleteNode`
//! that ended with its node gone but no replacement seen to join (`Complete` reason
//! `ReplacementNotSeen`): nothing proves the capacity came back.

use std::sync::Arc;

use gpu_remediation_api::{GpuRemediation, GpuRemediationPolicySpec, Phase, policy::Mode};
use jiff::Timestamp;
use kube::ResourceExt;

use crate::{
    budget::slow_start::{Allowance, Outcome, OutcomeKind, allowance},
    detect::{self, Verdict},
    first_seen::FirstSeen,
    observe::NodeView,
    time::{plus, signed},
};

/// With `safety.slowStart`: the policy's allowance now, the outcomes it was folded from (each
/// failure domain folds its own nodes' into its allowance), `maxConcurrent` resolved, and when the
/// next success will be proven.
pub(super) struct SlowStart {
    /// The policy's allowance.
    pub allowance: Allowance,
    /// The outcomes on record.
    pub outcomes: Vec<Outcome>,
    /// `maxConcurrent`, resolved over the governed nodes.
    pub max_concurrent: u32,
}

/// With `safety.slowStart`, the allowance now; and when the next success will be proven.
pub(super) fn slow_start<N: NodeView>(
    policy: &str,
    spec: &GpuRemediationPolicySpec,
    selected: u32,
    nodes: &[&N],
    remediations: &[Arc<GpuRemediation>],
    first_seen: &FirstSeen,
    now: Timestamp,
) -> (Option<SlowStart>, Option<Timestamp>) {
    if !spec.safety.slow_start {
        return (None, None);
    }
    let (found, wake) = outcomes(policy, spec, nodes, remediations, first_seen, now);
    let max_concurrent = crate::budget::max_concurrent(&spec.safety, selected);
    (
        Some(SlowStart {
            allowance: allowance(&found, max_concurrent),
            outcomes: found,
            max_concurrent,
        }),
        wake,
    )
}

/// The outcomes so far, and when the next success will be proven (to plan again then).
fn outcomes<N: NodeView>(
    policy: &str,
    spec: &GpuRemediationPolicySpec,
    nodes: &[&N],
    remediations: &[Arc<GpuRemediation>],
    first_seen: &FirstSeen,
    now: Timestamp,
) -> (Vec<Outcome>, Option<Timestamp>) {
    let mut found = Vec::new();
    let mut wake: Option<Timestamp> = None;
    let healthy_for = signed(spec.release.healthy_for.as_std());
    let by_name: std::collections::HashMap<&str, &N> = nodes.iter().map(|n| (n.node_name(), *n)).collect();
    for record in remediations
        .iter()
        .filter(|r| r.spec.policy_name == policy && r.spec.mode != Mode::DryRun)
    {
        let Some(status) = &record.status else { continue };
        let ended = status
            .phase_history
            .last()
            .map(|t| t.at.0)
            .or_else(|| record.creation_timestamp().map(|t| t.0));
        let Some(ended) = ended else { continue };
        let outcome = |at, kind| Outcome {
            remediation: record.name_any(),
            node: record.spec.node_name.clone(),
            at,
            kind,
        };
        match status.phase {
            Phase::Failed => found.push(outcome(ended, OutcomeKind::Failed)),
            Phase::Succeeded if replacement_not_seen(status) => {}
            Phase::Succeeded => {
                let proven_at = plus(ended, healthy_for);
                let node = by_name.get(record.spec.node_name.as_str());
                match node.map(|n| health_since(n, spec, first_seen, now)) {
                    Some(Health::BrokenSince(since)) if since >= ended && since < proven_at => {
                        found.push(outcome(since, OutcomeKind::Failed));
                    }
                    Some(Health::BrokenSince(since)) if since >= proven_at => {
                        found.push(outcome(proven_at, OutcomeKind::Proven));
                    }
                    Some(Health::BrokenSince(_) | Health::NotReady) => {}
                    Some(Health::Healthy) | None if proven_at <= now => {
                        found.push(outcome(proven_at, OutcomeKind::Proven));
                    }
                    Some(Health::Healthy) | None => {
                        wake = Some(wake.map_or(proven_at, |w| w.min(proven_at)));
                    }
                }
            }
            _ => {}
        }
    }
    (found, wake)
}

/// Whether the record ended with its node gone and no replacement seen (see
/// `replace::verify::REPLACEMENT_NOT_SEEN`).
fn replacement_not_seen(status: &gpu_remediation_api::GpuRemediationStatus) -> bool {
    status.conditions.iter().any(|c| {
        c.type_ == gpu_remediation_api::constants::remediation_conditions::COMPLETE
            && c.reason == crate::replace::verify::REPLACEMENT_NOT_SEEN
    })
}

enum Health {
    Healthy,
    NotReady,
    BrokenSince(Timestamp),
}

/// The node's health by the policy's triggers, a condition without a trustworthy clock holding
/// since it was first seen (as for detection: `fleet::verdict`).
fn health_since(
    node: &(impl NodeView + ?Sized),
    spec: &GpuRemediationPolicySpec,
    first_seen: &FirstSeen,
    now: Timestamp,
) -> Health {
    let conditions = node.conditions();
    let name = node.node_name();
    match detect::evaluate_with(conditions, &spec.triggers, now, |c| {
        first_seen.since(name, c, now)
    }) {
        Verdict::Unhealthy { evidence } | Verdict::Pending { evidence, .. } => {
            Health::BrokenSince(evidence.since)
        }
        Verdict::Healthy { .. }
            if conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status != "True") =>
        {
            Health::NotReady
        }
        Verdict::Healthy { .. } => Health::Healthy,
    }
}

#[cfg(test)]
mod tests {
    use gpu_remediation_api::{GpuRemediationStatus, policy::Action, remediation::PhaseTransition};
    use k8s_openapi::{
        api::core::v1::{NodeCondition, NodeStatus},
        apimachinery::pkg::apis::meta::v1::Time,
    };
    use kube::api::ObjectMeta;

    use super::*;
    use crate::test_fixtures::at;
    use k8s_openapi::api::core::v1::Node;

    fn spec() -> GpuRemediationPolicySpec {
        serde_json::from_value(serde_json::json!({
            "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "0s"}],
            "release": {"healthyFor": "60s"},
        }))
        .unwrap()
    }

    fn record(node: &str, phase: Phase, ended: i64) -> Arc<GpuRemediation> {
        let mut r =
            crate::test_fixtures::remediation(&format!("{node}-r"), node, "p", Some(at(0)), Action::Replace);
        r.status = Some(GpuRemediationStatus {
            phase,
            phase_history: vec![PhaseTransition {
                phase,
                at: Time(at(ended)),
                message: None,
            }],
            ..GpuRemediationStatus::default()
        });
        Arc::new(r)
    }

    fn node(name: &str, gpu_broken_since: Option<i64>, ready: bool) -> Node {
        let gpu = NodeCondition {
            type_: "GpuHealthy".into(),
            status: if gpu_broken_since.is_some() {
                "False"
            } else {
                "True"
            }
            .into(),
            last_transition_time: Some(Time(at(gpu_broken_since.unwrap_or(0)))),
            ..NodeCondition::default()
        };
        let ready = NodeCondition {
            type_: "Ready".into(),
            status: if ready { "True" } else { "False" }.into(),
            ..NodeCondition::default()
        };
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            spec: None,
            status: Some(NodeStatus {
                conditions: Some(vec![gpu, ready]),
                ..NodeStatus::default()
            }),
        }
    }

    #[test]
    fn a_success_is_proven_once_its_node_stayed_healthy_for_healthy_for() {
        let healthy = node("n1", None, true);
        let rems = [record("n1", Phase::Succeeded, 100)];
        let (early, wake) = outcomes("p", &spec(), &[&healthy], &rems, &FirstSeen::default(), at(150));
        assert!(early.is_empty());
        assert_eq!(wake, Some(at(160)), "plan again when it is proven");
        let (proven, wake) = outcomes("p", &spec(), &[&healthy], &rems, &FirstSeen::default(), at(160));
        assert_eq!(proven.len(), 1);
        assert_eq!((proven[0].kind, proven[0].at), (OutcomeKind::Proven, at(160)));
        assert_eq!(wake, None);
    }

    #[test]
    fn a_replaced_node_that_left_is_proven_by_its_record() {
        let rems = [record("gone", Phase::Succeeded, 100)];
        let (proven, _) = outcomes::<Node>("p", &spec(), &[], &rems, &FirstSeen::default(), at(200));
        assert_eq!(proven[0].kind, OutcomeKind::Proven);
    }

    #[test]
    fn a_node_broken_again_within_healthy_for_makes_the_success_a_failure() {
        let relapsed = node("n1", Some(130), true);
        let rems = [record("n1", Phase::Succeeded, 100)];
        let (found, _) = outcomes("p", &spec(), &[&relapsed], &rems, &FirstSeen::default(), at(500));
        assert_eq!((found[0].kind, found[0].at), (OutcomeKind::Failed, at(130)));
        let later = node("n1", Some(400), true);
        let (found, _) = outcomes("p", &spec(), &[&later], &rems, &FirstSeen::default(), at(500));
        assert_eq!(
            found[0].kind,
            OutcomeKind::Proven,
            "it broke after proving itself"
        );
    }

    #[test]
    fn a_fault_without_a_clock_holds_since_first_seen_not_since_each_pass() {
        let mut broken = node("n1", Some(0), true);
        broken.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].last_transition_time = None;
        let rems = [record("n1", Phase::Succeeded, 100)];
        // Broken since before the remediation ended (seen at 90): no relapse at 130.
        let mut first_seen = FirstSeen::default();
        first_seen.observe([&broken], at(90));
        first_seen.observe([&broken], at(130));
        let (found, _) = outcomes("p", &spec(), &[&broken], &rems, &first_seen, at(130));
        assert!(found.is_empty(), "{found:?}");
        // Broken again within healthyFor (seen at 130): still a relapse at 500.
        let mut first_seen = FirstSeen::default();
        first_seen.observe([&broken], at(130));
        first_seen.observe([&broken], at(500));
        let (found, _) = outcomes("p", &spec(), &[&broken], &rems, &first_seen, at(500));
        assert_eq!((found[0].kind, found[0].at), (OutcomeKind::Failed, at(130)));
    }

    #[test]
    fn a_not_ready_node_proves_nothing_and_a_failed_remediation_is_a_failure() {
        let not_ready = node("n1", None, false);
        let rems = [
            record("n1", Phase::Succeeded, 100),
            record("n2", Phase::Failed, 120),
            record("n3", Phase::Cancelled, 130),
        ];
        let (found, _) = outcomes("p", &spec(), &[&not_ready], &rems, &FirstSeen::default(), at(500));
        assert_eq!(found.len(), 1);
        assert_eq!(
            (found[0].node.as_str(), found[0].kind),
            ("n2", OutcomeKind::Failed)
        );
    }
}

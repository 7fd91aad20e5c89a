//! Nodes carrying known-bad hardware: a node whose inventory holds a GPU serial (or whose host is)
//! past its governing policy's `safety.repeatOffender` limit is flagged (label
//! `gpuremediation.dev/repeat-offender`, condition `GpuRepeatOffender`, an Event) and, with
//! `cordonOnJoin`, cordoned; a node that registered with the `gpuremediation.dev/hardware-unchecked`
//! taint keeps it until the agent has published its inventory and the check is made. A flag whose
//! hardware has aged out of the window is taken back (and the cordon it made lifted). Nodes with a
//! remediation in flight are left to it. A serial another live node lists as well is a conflict,
//! never a reason to flag (`trust`). The cordons made at join are bounded per policy, like
//! quarantines: at most `cordonOnJoinMax` (default `safety.maxUnhealthy`) of its selected nodes;
//! past it a node is flagged and the withheld cordon reported. Pure: the steps to take, and the
//! node edits they are.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use gpu_remediation_api::{
    GpuRemediation, GpuRemediationPolicy,
    constants::{CORDONED_BY_ANNOTATION, HARDWARE_UNCHECKED_TAINT_KEY, REPEAT_OFFENDER_LABEL},
    hardware::{LedgerGpu, RepeatOffence},
};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, NodeSpec};
use kube::ResourceExt;

use super::{
    history::{Failures, carried_hardware, offence},
    ledger::{host_of, inventory_of},
    trust::Claims,
};
use crate::{governance, observe::NodeView};

/// The owner a repeat offender's cordon is recorded under (`gpuremediation.dev/cordoned-by`): no
/// remediation has that name, so a remediation that follows treats the cordon as another's and
/// never lifts it.
pub const JOIN_CORDON_OWNER: &str = "repeat-offender";

/// What to do about one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JoinStep {
    /// The node is checked and clean: lift the unchecked taint.
    Lift {
        /// The node.
        node: String,
        /// Its UID.
        uid: Option<String>,
    },
    /// The node carries a repeat offender: flag it (and cordon it when `cordon`).
    Flag {
        /// The node.
        node: String,
        /// Its UID.
        uid: Option<String>,
        /// The offence.
        offence: RepeatOffence,
        /// Whether to cordon it (its policy says `cordonOnJoin`, within `cordonOnJoinMax`).
        cordon: bool,
        /// Why a cordon `cordonOnJoin` asked for is not made (`cordonOnJoinMax` reached).
        withheld: Option<String>,
    },
    /// The node is flagged but its hardware is no longer past the limit: take the flag back.
    Unflag {
        /// The node.
        node: String,
        /// Its UID.
        uid: Option<String>,
    },
}

/// Whether [`steps`] must look at every node: when some hardware has failed and some policy flags
/// repeat offenders, any node may carry it. Otherwise only the nodes already flagged or tainted
/// (all carrying something of ours) can need a step.
#[must_use]
pub fn needs_every_node(policies: &[Arc<GpuRemediationPolicy>], failures: &Failures) -> bool {
    !failures.is_empty()
        && policies
            .iter()
            .any(|p| p.metadata.deletion_timestamp.is_none() && p.spec.safety.repeat_offender.is_some())
}

/// The steps the fleet needs now.
#[must_use]
pub fn steps<N: NodeView>(
    policies: &[Arc<GpuRemediationPolicy>],
    nodes: &[Arc<N>],
    remediations: &[Arc<GpuRemediation>],
    failures: &Failures,
    now: Timestamp,
) -> Vec<JoinStep> {
    let live: Vec<&Arc<GpuRemediationPolicy>> = policies
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    let claimants = governance::claimants(live.iter().copied());
    // Looked up per node, not searched for: a pass costs the same with 1 or 100 in flight.
    let in_flight: HashSet<&str> = remediations
        .iter()
        .filter(|r| !r.status.as_ref().is_some_and(|s| s.phase.is_terminal()))
        .map(|r| r.spec.node_name.as_str())
        .collect();
    let every_node = needs_every_node(policies, failures);
    let live_nodes: Vec<&Arc<N>> = nodes.iter().filter(|n| n.deleting().is_none()).collect();
    // Each node's policy, and each policy's cordons at join, counted before any is decided.
    let governed: Vec<Option<&str>> = live_nodes
        .iter()
        .map(|n| {
            if every_node {
                governance::governing(n.node_labels(), &claimants)
            } else {
                None
            }
        })
        .collect();
    let mut room = CordonRoom::of(&live, &live_nodes, &governed);
    // Each inventory read once: for the conflicts (every live node's, when any node may be
    // flagged) and for the node's own check.
    let inventories: Vec<Vec<LedgerGpu>> = live_nodes
        .iter()
        .map(|n| if every_node { inventory_of(n) } else { Vec::new() })
        .collect();
    let names: Vec<String> = live_nodes.iter().map(|n| n.node_name().to_owned()).collect();
    let claims = Claims::of_inventories(
        names
            .iter()
            .map(String::as_str)
            .zip(inventories.iter().map(Vec::as_slice)),
    );
    let mut out = Vec::new();
    for (((node, policy), name), inventory) in live_nodes.iter().zip(&governed).zip(names).zip(inventories) {
        let flagged = node.label(REPEAT_OFFENDER_LABEL).is_some_and(|v| v == "true");
        let unchecked = has_unchecked_taint(node);
        if !every_node && !flagged && !unchecked {
            // No failure on record anywhere, or no rule to flag by: nothing to flag, nothing
            // flagged, no taint to lift (the cheapest look, asked first of every node).
            continue;
        }
        if in_flight.contains(node.node_name()) {
            continue;
        }
        let rule = policy.and_then(|policy| {
            live.iter()
                .find(|p| p.metadata.name.as_deref() == Some(policy))
                .and_then(|p| p.spec.safety.repeat_offender.as_ref())
        });
        // No rule to flag it by, nothing flagged to clear and no taint to lift: the node's
        // inventory need not be read.
        if rule.is_none() && !flagged && !unchecked {
            continue;
        }
        let inventory = if every_node { inventory } else { inventory_of(node) };
        let ledger = gpu_remediation_api::hardware::HardwareLedger {
            gpus: inventory.clone(),
            host: host_of(node),
            ..Default::default()
        };
        // A serial another live node lists too is a conflict: it flags neither node.
        let hardware: Vec<_> = carried_hardware(&ledger)
            .into_iter()
            .filter(|(kind, id)| {
                *kind != gpu_remediation_api::hardware::HardwareKind::Gpu
                    || claims.others(id, &name).is_empty()
            })
            .collect();
        let found = rule.and_then(|rule| {
            offence(
                failures,
                hardware.iter().map(|(kind, id)| (*kind, id.as_str())),
                rule,
                now,
                None,
            )
        });
        let uid = node.node_uid().map(str::to_owned);
        match (found, rule, *policy) {
            (Some(offence), Some(rule), Some(policy)) if !flagged || unchecked => {
                let (cordon, withheld) = if rule.cordon_on_join {
                    room.take(policy)
                } else {
                    (false, None)
                };
                out.push(JoinStep::Flag {
                    node: name,
                    uid,
                    offence,
                    cordon,
                    withheld,
                });
            }
            (None, _, _) if flagged => out.push(JoinStep::Unflag { node: name, uid }),
            (None, _, _) if unchecked && !inventory.is_empty() => {
                out.push(JoinStep::Lift { node: name, uid });
            }
            // Already flagged and checked, or clean and nothing to lift.
            _ => {}
        }
    }
    out
}

/// Each policy's room for cordons at join: its limit (`cordonOnJoinMax`, else
/// `safety.maxUnhealthy`, of its selected nodes) and the nodes it has cordoned at join so far.
struct CordonRoom<'p> {
    by_policy: HashMap<&'p str, (u32, u32)>,
    limits: HashMap<&'p str, String>,
}

impl<'p> CordonRoom<'p> {
    fn of<N: NodeView>(
        policies: &[&'p Arc<GpuRemediationPolicy>],
        nodes: &[&Arc<N>],
        governed: &[Option<&'p str>],
    ) -> Self {
        let mut selected: HashMap<&str, u32> = HashMap::new();
        let mut cordoned: HashMap<&str, u32> = HashMap::new();
        for (node, policy) in nodes.iter().zip(governed) {
            let Some(policy) = *policy else { continue };
            *selected.entry(policy).or_default() += 1;
            if is_join_cordoned(node) {
                *cordoned.entry(policy).or_default() += 1;
            }
        }
        let mut by_policy = HashMap::new();
        let mut limits = HashMap::new();
        for policy in policies {
            let (Some(name), Some(rule)) = (
                policy.metadata.name.as_deref(),
                policy.spec.safety.repeat_offender.as_ref(),
            ) else {
                continue;
            };
            let max = rule
                .cordon_on_join_max
                .as_ref()
                .unwrap_or(&policy.spec.safety.max_unhealthy);
            let of = selected.get(name).copied().unwrap_or(0);
            let limit = max.resolve(of).unwrap_or(0);
            by_policy.insert(name, (limit, cordoned.get(name).copied().unwrap_or(0)));
            limits.insert(name, format!("limit {max} of {of} selected nodes ({limit})"));
        }
        Self { by_policy, limits }
    }

    /// Takes one cordon of `policy`'s room: whether to cordon, or why not.
    fn take(&mut self, policy: &str) -> (bool, Option<String>) {
        let Some((limit, used)) = self.by_policy.get_mut(policy) else {
            return (false, None);
        };
        if *used < *limit {
            *used += 1;
            return (true, None);
        }
        let limit_text = self.limits.get(policy).cloned().unwrap_or_default();
        (
            false,
            Some(format!(
                "not cordoned: {used} node(s) already cordoned at join, safety.repeatOffender.cordonOnJoinMax reached ({limit_text})"
            )),
        )
    }
}

/// Whether the node is cordoned by a join check (not by a remediation or a person), by our note.
#[must_use]
fn is_join_cordoned(node: &(impl NodeView + ?Sized)) -> bool {
    node.unschedulable()
        && node
            .annotation(CORDONED_BY_ANNOTATION)
            .is_some_and(|by| by == JOIN_CORDON_OWNER)
}

/// Whether the node still carries the unchecked taint.
#[must_use]
pub fn has_unchecked_taint(node: &(impl NodeView + ?Sized)) -> bool {
    node.taints()
        .iter()
        .any(|t| t.key == HARDWARE_UNCHECKED_TAINT_KEY)
}

/// Lifts the unchecked taint; whether anything changed.
pub fn lift(node: &mut Node) -> bool {
    let Some(taints) = node.spec.as_mut().and_then(|s| s.taints.as_mut()) else {
        return false;
    };
    let before = taints.len();
    taints.retain(|t| t.key != HARDWARE_UNCHECKED_TAINT_KEY);
    taints.len() != before
}

/// Flags the node (and cordons it when `cordon`, unless it is already unschedulable), lifting the
/// unchecked taint: the check is made. Whether anything changed.
pub fn flag(node: &mut Node, cordon: bool) -> bool {
    let mut changed = lift(node);
    if node.label(REPEAT_OFFENDER_LABEL).is_none_or(|v| v != "true") {
        node.labels_mut()
            .insert(REPEAT_OFFENDER_LABEL.to_owned(), "true".to_owned());
        changed = true;
    }
    let spec = node.spec.get_or_insert_with(NodeSpec::default);
    if cordon && spec.unschedulable != Some(true) {
        spec.unschedulable = Some(true);
        node.annotations_mut()
            .insert(CORDONED_BY_ANNOTATION.to_owned(), JOIN_CORDON_OWNER.to_owned());
        changed = true;
    }
    changed
}

/// Takes the flag back, and the cordon it made (never another's, nor one another party laid again
/// over it: `cordon::cordon_laid_by_another`). Whether anything changed.
pub fn unflag(node: &mut Node) -> bool {
    let mut changed = node.labels_mut().remove(REPEAT_OFFENDER_LABEL).is_some();
    if node
        .annotation(CORDONED_BY_ANNOTATION)
        .is_some_and(|by| by == JOIN_CORDON_OWNER)
    {
        let laid_by_another = crate::cordon::cordon_laid_by_another(node).is_some();
        node.annotations_mut().remove(CORDONED_BY_ANNOTATION);
        if let Some(spec) = node.spec.as_mut()
            && !laid_by_another
        {
            spec.unschedulable = None;
        }
        changed = true;
    }
    changed
}

#[cfg(test)]
mod tests {
    use gpu_remediation_api::{
        GpuRemediationPolicySpec, constants::GPU_INVENTORY_ANNOTATION, policy::Trigger,
    };
    use k8s_openapi::api::core::v1::Taint;

    use super::*;
    use crate::hardware::history::{
        failures,
        tests::{at, remediation, rule},
    };

    fn policy(cordon_on_join: bool) -> Arc<GpuRemediationPolicy> {
        let mut spec: GpuRemediationPolicySpec = serde_json::from_value(serde_json::json!({
            "triggers": [{"conditionType": "GpuHealthy", "status": "False"}],
        }))
        .unwrap();
        spec.triggers = vec![Trigger {
            ..spec.triggers[0].clone()
        }];
        let mut offender = rule(1, 24);
        offender.cordon_on_join = cordon_on_join;
        spec.safety.repeat_offender = Some(offender);
        Arc::new(GpuRemediationPolicy::new("p", spec))
    }

    fn node(name: &str, serial: &str, unchecked: bool) -> Arc<Node> {
        let mut node = Node::default();
        node.metadata.name = Some(name.to_owned());
        node.metadata.uid = Some(format!("uid-{name}"));
        node.metadata.annotations = Some(
            [(
                GPU_INVENTORY_ANNOTATION.to_owned(),
                format!(r#"[{{"index":0,"uuid":"GPU-{serial}","serial":"{serial}"}}]"#),
            )]
            .into(),
        );
        if unchecked {
            node.spec = Some(NodeSpec {
                taints: Some(vec![Taint {
                    key: HARDWARE_UNCHECKED_TAINT_KEY.to_owned(),
                    effect: "NoSchedule".to_owned(),
                    ..Taint::default()
                }]),
                ..NodeSpec::default()
            });
        }
        Arc::new(node)
    }

    #[test]
    fn a_node_joining_with_a_serial_past_the_limit_is_flagged_and_cordoned_when_the_policy_says_so() {
        let history = [remediation("a-1", "node-a", 0, "S1", None)];
        let all = failures(&[], &history);
        let steps = steps(
            &[policy(true)],
            &[node("node-c", "S1", true)],
            &history,
            &all,
            at(1),
        );
        let [
            JoinStep::Flag {
                node,
                offence,
                cordon,
                ..
            },
        ] = steps.as_slice()
        else {
            panic!("{steps:?}")
        };
        assert_eq!(
            (node.as_str(), offence.id.as_str(), *cordon),
            ("node-c", "S1", true)
        );
        assert_eq!(offence.earlier[0].node, "node-a");
    }

    #[test]
    fn a_clean_node_has_its_unchecked_taint_lifted_once_its_inventory_is_published() {
        let all = failures(&[], &[]);
        let steps = steps(&[policy(true)], &[node("node-c", "S2", true)], &[], &all, at(1));
        assert!(matches!(steps.as_slice(), [JoinStep::Lift { node, .. }] if node == "node-c"));
        let mut bare = Node::default();
        bare.metadata.name = Some("node-d".to_owned());
        bare.spec = node("x", "S", true).spec.clone();
        assert!(super::steps(&[policy(true)], &[Arc::new(bare)], &[], &all, at(1)).is_empty());
    }

    #[test]
    fn a_node_with_a_remediation_in_flight_is_left_to_it() {
        let history = [remediation("a-1", "node-c", 0, "S1", None)];
        let all = failures(&[], &history);
        assert!(
            steps(
                &[policy(true)],
                &[node("node-c", "S1", true)],
                &history,
                &all,
                at(1)
            )
            .is_empty()
        );
    }

    #[test]
    fn a_flag_whose_failures_left_the_window_is_taken_back_with_its_cordon_only() {
        let history = [remediation("a-1", "node-a", 0, "S1", None)];
        let all = failures(&[], &history);
        let mut flagged = Node::clone(&node("node-c", "S1", true));
        assert!(flag(&mut flagged, true));
        assert!(!has_unchecked_taint(&flagged));
        assert!(!flag(&mut flagged, true), "flagging is idempotent");
        let steps = steps(&[policy(true)], &[Arc::new(flagged.clone())], &[], &all, at(48));
        assert!(matches!(steps.as_slice(), [JoinStep::Unflag { .. }]), "{steps:?}");
        assert!(unflag(&mut flagged));
        assert_eq!(flagged.spec.as_ref().and_then(|s| s.unschedulable), None);
        // A person's cordon stays.
        let mut theirs = Node::clone(&node("node-e", "S1", false));
        theirs.spec = Some(NodeSpec {
            unschedulable: Some(true),
            ..NodeSpec::default()
        });
        flag(&mut theirs, true);
        unflag(&mut theirs);
        assert_eq!(theirs.spec.as_ref().and_then(|s| s.unschedulable), Some(true));
        // And so does one a person laid again over our join cordon (the field's manager says).
        let mut laid_again = Node::clone(&node("node-f", "S1", false));
        flag(&mut laid_again, true);
        assert!(is_join_cordoned(&laid_again));
        laid_again.metadata.managed_fields = Some(vec![crate::cordon::managing_the_cordon("kubectl-cordon")]);
        assert!(unflag(&mut laid_again));
        assert_eq!(laid_again.spec.as_ref().and_then(|s| s.unschedulable), Some(true));
        assert!(!is_join_cordoned(&laid_again), "our note is gone");
    }

    #[test]
    fn a_serial_another_live_node_lists_too_flags_neither() {
        let history = [remediation("a-1", "node-a", 0, "S1", None)];
        let all = failures(&[], &history);
        let both = [node("node-b", "S1", true), node("node-c", "S1", true)];
        let steps = steps(&[policy(true)], &both, &[], &all, at(1));
        assert!(
            steps.iter().all(|s| matches!(s, JoinStep::Lift { .. })),
            "a conflict is no offence: {steps:?}"
        );
    }

    #[test]
    fn cordons_at_join_stop_at_cordon_on_join_max_and_the_rest_are_flagged_and_reported() {
        let mut bounded = GpuRemediationPolicy::clone(&policy(true));
        let rule = bounded.spec.safety.repeat_offender.as_mut().unwrap();
        rule.cordon_on_join_max = Some(gpu_remediation_api::selector::IntOrPercent::Percent(
            "20%".to_owned(),
        ));
        // Ten nodes: three carry a board that failed (each its own), seven are clean.
        let history: Vec<_> = (0..3)
            .map(|i| remediation(&format!("x-{i}"), "node-x", 0, &format!("S{i}"), None))
            .collect();
        let all_three = failures(&[], &history);
        let nodes: Vec<Arc<Node>> = (0..10)
            .map(|i| node(&format!("node-{i}"), &format!("S{i}"), true))
            .collect();
        let steps = steps(&[Arc::new(bounded)], &nodes, &[], &all_three, at(1));
        let flags: Vec<(bool, bool)> = steps
            .iter()
            .filter_map(|s| match s {
                JoinStep::Flag { cordon, withheld, .. } => Some((*cordon, withheld.is_some())),
                _ => None,
            })
            .collect();
        // 20 % of ten: two cordoned, the third flagged with its cordon withheld.
        assert_eq!(flags, [(true, false), (true, false), (false, true)], "{steps:?}");
        let JoinStep::Flag {
            withheld: Some(why), ..
        } = &steps
            .iter()
            .find(|s| matches!(s, JoinStep::Flag { cordon: false, .. }))
            .unwrap()
        else {
            unreachable!()
        };
        assert!(why.contains("cordonOnJoinMax"), "{why}");
    }
}

//! The ledger at admission: each remediation a policy's plan creates records its node's hardware
//! (spec `hardware`, labels by failed serial and host), and one whose failed GPU or host is past
//! the policy's `safety.repeatOffender` limit goes straight to the last rung, naming the earlier
//! failures: action `Replace` whatever its trigger said, or, for `ManualRequired`, a record that
//! waits for a person (it joins the plan's `manual_required`, like a node past
//! `maxAttemptsPerNode`). A failed GPU counts only as `trust` allows (listed by the node before
//! the fault, claimed by no other live node); the others are recorded as untrusted. Pure.

use std::{
    collections::{BTreeSet, HashMap},
    sync::Arc,
};

use gpu_remediation_api::{
    GpuRemediation,
    constants::{ATTEMPTS_EXHAUSTED_ANNOTATION, REPEAT_OFFENDER_LABEL},
    policy::Action,
    safety::{OffenderAction, RepeatOffender},
};
use jiff::Timestamp;
use kube::ResourceExt;

use super::{
    claimants::Claimants,
    history::{Failures, describe, failed_hardware, offence},
    ledger::{failed_serials, labels_of, ledger_of},
    trust::{self, Claims},
};
use crate::{fleet::FleetPlan, observe::NodeView};

/// Up to how many records [`amend`] finds their nodes by walking the fleet.
const FEW: usize = 4;

/// Records each created remediation's hardware and sends repeat offenders to the last rung.
/// `claimants` says which node lists each serial; `fleet` gives every node, asked for only when
/// `claimants` cannot rule out that a node other than the records' own lists a failed serial.
pub fn amend<N: NodeView>(
    plan: &mut FleetPlan,
    nodes: &[Arc<N>],
    claimants: &Claimants,
    fleet: impl FnOnce() -> Vec<Arc<N>>,
    failures: &Failures,
    now: Timestamp,
) {
    let records: usize = plan
        .policies
        .iter()
        .map(|p| p.create.len() + p.manual_required.len())
        .sum();
    if records == 0 {
        return;
    }
    // A few records: a walk each (no copy of a name); many admitted at once: one index of the
    // fleet, so a hundred cost one walk instead of a hundred.
    let by_name: Option<HashMap<&str, &N>> =
        (records > FEW).then(|| nodes.iter().map(|n| (n.node_name(), n.as_ref())).collect());
    let node_of = |record: &GpuRemediation| node_named(&record.spec.node_name, nodes, by_name.as_ref());
    let claims = claims_of(plan, node_of, claimants, fleet);
    for policy_plan in &mut plan.policies {
        let rule = policy_plan.policy.spec.safety.repeat_offender.clone();
        let mut kept = Vec::with_capacity(policy_plan.create.len());
        for mut record in std::mem::take(&mut policy_plan.create) {
            let node = node_of(&record);
            let rung = record_hardware(&mut record, node, rule.as_ref(), failures, &claims, now);
            if rung == Some(OffenderAction::ManualRequired) {
                policy_plan.manual_required.push(record);
            } else {
                kept.push(record);
            }
        }
        policy_plan.create = kept;
        for record in &mut policy_plan.manual_required {
            if record.spec.hardware.is_none() {
                let node = node_of(record);
                record_hardware(record, node, None, failures, &claims, now);
            }
        }
    }
}

/// Who claims the serials the records' nodes name as failed: read from those nodes alone when
/// `claimants` shows no other node lists them (the usual case), else from the walk of `fleet`
/// (none asked about: no claims, and `fleet` is not called).
fn claims_of<'n, N: NodeView + 'n>(
    plan: &FleetPlan,
    node_of: impl Fn(&GpuRemediation) -> Option<&'n N>,
    claimants: &Claimants,
    fleet: impl FnOnce() -> Vec<Arc<N>>,
) -> Claims {
    let record_nodes: Vec<&N> = plan
        .policies
        .iter()
        .flat_map(|p| p.create.iter().chain(&p.manual_required))
        .filter_map(node_of)
        .collect();
    let named: BTreeSet<String> = record_nodes
        .iter()
        .filter_map(|node| ledger_of(node, ""))
        .flat_map(|ledger| failed_serials(&ledger))
        .collect();
    if named.is_empty() {
        return Claims::default();
    }
    let asking = record_nodes.iter().map(NodeView::node_name);
    if claimants.none_but(&named, asking) {
        Claims::of(record_nodes.iter().copied(), &named)
    } else {
        Claims::of(fleet().iter().map(AsRef::as_ref), &named)
    }
}

/// The node named `name`: from the index when there is one, else by a walk of `nodes`.
fn node_named<'n, N: NodeView>(
    name: &str,
    nodes: &'n [Arc<N>],
    by_name: Option<&HashMap<&str, &'n N>>,
) -> Option<&'n N> {
    match by_name {
        Some(by_name) => by_name.get(name).copied(),
        None => nodes.iter().find(|n| n.node_name() == name).map(AsRef::as_ref),
    }
}

/// Fills `record`'s ledger and labels from `node`, counting only the failed GPUs `trust` allows;
/// with `rule`, checks the failed hardware against it and returns the last rung when it is a
/// repeat offender (already applied to `record`).
pub fn record_hardware(
    record: &mut GpuRemediation,
    node: Option<&(impl NodeView + ?Sized)>,
    rule: Option<&RepeatOffender>,
    failures: &Failures,
    claims: &Claims,
    now: Timestamp,
) -> Option<OffenderAction> {
    let node = node?;
    let mut ledger = ledger_of(node, &record.spec.trigger.reason)?;
    let fault_at = record.spec.trigger.since.as_ref().map_or(now, |t| t.0).min(now);
    trust::sift(
        &mut ledger,
        &record.spec.node_name,
        &trust::first_seen_of(node),
        fault_at,
        claims,
    );
    let labels = labels_of(&ledger);
    record.labels_mut().extend(labels);
    let name = record.name_any();
    let found = rule.and_then(|rule| {
        let hardware = failed_hardware(&ledger);
        offence(
            failures,
            hardware.iter().map(|(kind, id)| (*kind, id.as_str())),
            rule,
            now,
            Some(&name),
        )
    });
    let rung = found.as_ref().map(|o| o.action);
    if let Some(offence) = found {
        record
            .labels_mut()
            .insert(REPEAT_OFFENDER_LABEL.to_owned(), "true".to_owned());
        match offence.action {
            OffenderAction::Replace => record.spec.action = Action::Replace,
            OffenderAction::ManualRequired => {
                record.annotations_mut().insert(
                    ATTEMPTS_EXHAUSTED_ANNOTATION.to_owned(),
                    format!(
                        "{}: safety.repeatOffender hands it to a person",
                        describe(&offence)
                    ),
                );
            }
        }
        ledger.repeat_offender = Some(offence);
    }
    record.spec.hardware = Some(ledger);
    rung
}

#[cfg(test)]
mod tests {
    use gpu_remediation_api::{
        constants::{
            FAILED_GPUS_ANNOTATION, FAILED_SERIAL_LABEL, GPU_FIRST_SEEN_ANNOTATION, GPU_INVENTORY_ANNOTATION,
        },
        hardware::HardwareKind,
    };

    use super::*;
    use crate::hardware::history::{
        failures,
        tests::{at, remediation, rule},
    };
    use k8s_openapi::api::core::v1::Node;

    fn node_with_failed(serial: &str) -> Node {
        let mut node = Node::default();
        node.metadata.name = Some("node-b".to_owned());
        node.metadata.annotations = Some(
            [
                (
                    GPU_INVENTORY_ANNOTATION.to_owned(),
                    format!(r#"[{{"index":0,"uuid":"GPU-x","serial":"{serial}"}}]"#),
                ),
                (
                    FAILED_GPUS_ANNOTATION.to_owned(),
                    r#"[{"uuid":"GPU-x","reason":"XID79"}]"#.to_owned(),
                ),
                (
                    GPU_FIRST_SEEN_ANNOTATION.to_owned(),
                    format!(r#"{{"{serial}":"{}"}}"#, at(0)),
                ),
            ]
            .into(),
        );
        node
    }

    fn new_record() -> GpuRemediation {
        GpuRemediation::clone(&remediation("b-1", "node-b", 5, "ignored", None))
    }

    #[test]
    fn a_new_remediation_records_the_failed_serial_and_is_selectable_by_it() {
        let mut record = new_record();
        record.spec.hardware = None;
        let rung = record_hardware(
            &mut record,
            Some(&node_with_failed("1650000000001")),
            None,
            &failures(&[], &[]),
            &Claims::default(),
            at(5),
        );
        assert_eq!(rung, None);
        assert_eq!(record.labels()[FAILED_SERIAL_LABEL], "1650000000001");
        let ledger = record.spec.hardware.expect("a ledger");
        assert_eq!(ledger.failed[0].serial.as_deref(), Some("1650000000001"));
        assert_eq!(record.spec.action, Action::None);
    }

    #[test]
    fn a_repeat_offender_goes_straight_to_replace_and_names_the_earlier_failure() {
        let history = failures(&[], &[remediation("a-1", "node-a", 0, "1650000000001", None)]);
        let mut record = new_record();
        let rung = record_hardware(
            &mut record,
            Some(&node_with_failed("1650000000001")),
            Some(&rule(1, 24)),
            &history,
            &Claims::default(),
            at(5),
        );
        assert_eq!(rung, Some(OffenderAction::Replace));
        assert_eq!(record.spec.action, Action::Replace);
        assert_eq!(record.labels()[REPEAT_OFFENDER_LABEL], "true");
        let offence = record
            .spec
            .hardware
            .and_then(|h| h.repeat_offender)
            .expect("an offence");
        assert_eq!(
            (offence.kind, offence.earlier[0].remediation.as_str()),
            (HardwareKind::Gpu, "a-1")
        );
    }

    #[test]
    fn a_hand_off_makes_the_record_wait_for_a_person() {
        let history = failures(&[], &[remediation("a-1", "node-a", 0, "1650000000001", None)]);
        let mut record = new_record();
        let mut hand_off = rule(1, 24);
        hand_off.action = OffenderAction::ManualRequired;
        let rung = record_hardware(
            &mut record,
            Some(&node_with_failed("1650000000001")),
            Some(&hand_off),
            &history,
            &Claims::default(),
            at(5),
        );
        assert_eq!(rung, Some(OffenderAction::ManualRequired));
        assert!(record.annotations()[ATTEMPTS_EXHAUSTED_ANNOTATION].contains("remediation a-1"));
        assert!(crate::lifecycle::status::awaits_person_past_attempts(&record));
    }
}

//! Which finished remediations `history.ttl` removes, and which it keeps because they still hold
//! their node. Pure, like the rest of the fleet plan.
//!
//! Deleting a record gives back what it holds on its node (its finalizer releases the cordon and
//! the hand-off label). A record that ended holding its node for a person (`Failed`, a hand-off,
//! a `ManualRequired` node whose fault persists under its quarantine) is therefore never deleted by
//! expiry: nobody has acted, and the broken node would take new pods. It waits for a person, and
//! its status says so once (condition `AwaitingPerson`, with one Event on the record).

use std::{collections::HashMap, sync::Arc};

use gpu_remediation_api::{
    GpuRemediation, GpuRemediationStatus, Phase,
    constants::{reasons, remediation_conditions},
};
use jiff::Timestamp;
use kube::ResourceExt;

use crate::{
    observe::NodeView,
    {lifecycle::status, quarantine},
};

/// What `history.ttl` does to one policy's finished records this pass.
#[derive(Clone, Debug, Default)]
pub struct Expiry {
    /// Records past the ttl that hold nothing: to delete.
    pub delete: Vec<String>,
    /// Records past the ttl that still hold their node and do not say so yet: the status to write
    /// (condition `AwaitingPerson=True`), with the record as read (its resourceVersion is the
    /// write's precondition). Each gets one Event.
    pub awaiting_person: Vec<AwaitingPerson>,
    /// When the next finished record's ttl runs out (the pass then decides it).
    pub wake_at: Option<Timestamp>,
}

/// A record past the ttl that still holds its node, newly saying so.
#[derive(Clone, Debug)]
pub struct AwaitingPerson {
    /// The record as read (its resourceVersion is the write's precondition).
    pub record: Arc<GpuRemediation>,
    /// Its status to write, with condition `AwaitingPerson=True`.
    pub status: GpuRemediationStatus,
    /// What the condition says, for the Event.
    pub message: String,
}

/// The policy `name`'s finished remediations whose last phase change is older than `ttl`: the audit
/// trail keeps them that long (validation makes it longer than the rate and attempts windows, which
/// count them), then they go, unless they still hold their node (see [`holds_node`]). `nodes`:
/// the nodes looked at this pass, by name (every node a remediation names is among them).
pub(super) fn expiry<N: NodeView>(
    name: &str,
    remediations: &[Arc<GpuRemediation>],
    nodes: &HashMap<&str, &N>,
    ttl: gpu_remediation_api::Duration,
    now: Timestamp,
) -> Expiry {
    let horizon = crate::time::minus(now, crate::time::signed(ttl.as_std()));
    let mut out = Expiry::default();
    for record in remediations
        .iter()
        .filter(|r| r.spec.policy_name == name && r.metadata.deletion_timestamp.is_none())
    {
        let status = record.status.as_ref();
        let finished = status.is_some_and(|s| s.phase.is_terminal());
        let last = status
            .and_then(|s| s.phase_history.last())
            .map(|t| t.at.0)
            .or_else(|| record.creation_timestamp().map(|t| t.0));
        let Some(last) = last.filter(|_| finished) else {
            continue;
        };
        if last >= horizon {
            let due = crate::time::plus(last, crate::time::signed(ttl.as_std()));
            out.wake_at = super::candidates::earliest(out.wake_at, Some(due));
            continue;
        }
        let node = nodes.get(record.spec.node_name.as_str()).copied();
        match holds_node(record, node) {
            None => out.delete.push(record.name_any()),
            Some(what) => {
                let mut status = status.cloned().unwrap_or_default();
                if status::has_true(&status, remediation_conditions::AWAITING_PERSON) {
                    continue;
                }
                let message = format!(
                    "past history.ttl ({ttl}) but kept: it still holds node {} ({what}); it waits for a person \
                     to act (uncordon or repair the node, approve, or delete this record to release it)",
                    record.spec.node_name
                );
                status::set_condition(
                    &mut status,
                    remediation_conditions::AWAITING_PERSON,
                    true,
                    reasons::HELD_PAST_TTL,
                    &message,
                    now,
                );
                out.awaiting_person.push(AwaitingPerson {
                    record: record.clone(),
                    status,
                    message,
                });
            }
        }
    }
    out
}

/// What a finished record still holds on its node, if anything: our cordon or taint (its
/// annotation names the record), the hand-off label, or, for a `ManualRequired` record, the
/// policy's quarantine kept while the fault persists. A node re-created under the same name (a
/// new UID), or gone, holds nothing of the record's.
#[must_use]
pub fn holds_node(record: &GpuRemediation, node: Option<&(impl NodeView + ?Sized)>) -> Option<&'static str> {
    let node = node?;
    if record.spec.node_uid.is_some() && node.node_uid() != record.spec.node_uid.as_deref() {
        return None;
    }
    // What its release would give back (`cordon::release`).
    let held = crate::cordon::holds(node, record.metadata.name.as_deref().unwrap_or_default());
    if held.handed_off {
        return Some("handed off to a person: labelled gpuremediation.dev/hand-off");
    }
    if held.cordon() {
        return Some("cordoned and tainted by it");
    }
    let manual = record
        .status
        .as_ref()
        .is_some_and(|s| s.phase == Phase::ManualRequired);
    let quarantined = quarantine::taint::owner(node) == Some(record.spec.policy_name.as_str())
        && (quarantine::taint::has_taint(node) || quarantine::device::is_device_level(node));
    (manual && quarantined).then_some("quarantined while its fault persists")
}

#[cfg(test)]
mod tests {
    use gpu_remediation_api::{
        constants::CORDONED_BY_ANNOTATION, ladder::HANDED_OFF_BY_ANNOTATION, remediation::PhaseTransition,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use crate::{
        fleet::tests::{existing, node},
        test_fixtures::at,
    };
    use k8s_openapi::api::core::v1::Node;

    fn finished(name: &str, phase: Phase, at_secs: i64) -> Arc<GpuRemediation> {
        let mut r = (*existing(name, "p", 0, phase, 0)).clone();
        let status = r.status.as_mut().unwrap();
        status.phase_history.push(PhaseTransition {
            phase,
            at: Time(at(at_secs)),
            message: None,
        });
        Arc::new(r)
    }

    fn annotated(name: &str, key: &str, value: &str) -> Node {
        let mut n = (*node(name, "a", Some(0))).clone();
        n.annotations_mut().insert(key.to_owned(), value.to_owned());
        n
    }

    fn run(records: &[Arc<GpuRemediation>], nodes: &[&Node]) -> Expiry {
        let by_name = nodes
            .iter()
            .map(|n| (n.metadata.name.as_deref().unwrap(), *n))
            .collect();
        expiry(
            "p",
            records,
            &by_name,
            gpu_remediation_api::Duration::from_secs(3600),
            at(5000),
        )
    }

    #[test]
    fn a_failed_record_still_cordoning_its_node_is_kept_and_says_it_waits_for_a_person() {
        let record = finished("n1", Phase::Failed, 100);
        let n = annotated("n1", CORDONED_BY_ANNOTATION, &record.name_any());
        let out = run(std::slice::from_ref(&record), &[&n]);
        assert!(out.delete.is_empty(), "{:?}", out.delete);
        let AwaitingPerson {
            record: kept,
            status,
            message,
        } = &out.awaiting_person[0];
        assert_eq!(kept.name_any(), record.name_any());
        let condition = status
            .conditions
            .iter()
            .find(|c| c.type_ == remediation_conditions::AWAITING_PERSON)
            .unwrap();
        assert_eq!(
            (condition.status.as_str(), condition.reason.as_str()),
            ("True", reasons::HELD_PAST_TTL)
        );
        assert!(
            condition.message.contains("waits for a person"),
            "{}",
            condition.message
        );
        assert!(condition.message.contains("cordoned"), "{}", condition.message);
        assert_eq!(
            *message, condition.message,
            "the Event says what the condition says"
        );
    }

    #[test]
    fn a_record_that_already_says_it_waits_is_kept_without_another_write() {
        let record = finished("n1", Phase::Failed, 100);
        let n = annotated("n1", CORDONED_BY_ANNOTATION, &record.name_any());
        let first = run(std::slice::from_ref(&record), &[&n]);
        let mut said = (*record).clone();
        said.status = Some(first.awaiting_person[0].status.clone());
        let again = run(&[Arc::new(said)], &[&n]);
        assert!(again.delete.is_empty() && again.awaiting_person.is_empty());
    }

    #[test]
    fn a_handed_off_record_is_kept() {
        let record = finished("n1", Phase::ManualRequired, 100);
        let n = annotated("n1", HANDED_OFF_BY_ANNOTATION, &record.name_any());
        let out = run(std::slice::from_ref(&record), &[&n]);
        assert!(out.delete.is_empty());
        assert!(
            out.awaiting_person[0].status.conditions[0]
                .message
                .contains("hand-off")
        );
    }

    #[test]
    fn a_manual_required_record_whose_node_keeps_the_quarantine_is_kept_and_without_it_goes() {
        let record = finished("n1", Phase::ManualRequired, 100);
        let mut n = annotated("n1", "unrelated", "x");
        quarantine::taint::quarantine(&mut n, "p");
        assert_eq!(run(std::slice::from_ref(&record), &[&n]).awaiting_person.len(), 1);
        let plain = annotated("n1", "unrelated", "x");
        assert_eq!(
            run(std::slice::from_ref(&record), &[&plain]).delete,
            [record.name_any()]
        );
    }

    #[test]
    fn records_holding_nothing_expire_a_failed_one_whose_node_a_person_took_or_that_is_gone() {
        let succeeded = finished("n1", Phase::Succeeded, 100);
        let failed_released = finished("n2", Phase::Failed, 100);
        let failed_gone = finished("n3", Phase::Failed, 100);
        let recent = finished("n4", Phase::Failed, 4000);
        let records = [
            succeeded.clone(),
            failed_released.clone(),
            failed_gone.clone(),
            recent,
        ];
        let n1 = annotated("n1", "unrelated", "x");
        let n2 = annotated("n2", "unrelated", "x");
        let n4 = annotated("n4", CORDONED_BY_ANNOTATION, "other");
        let out = run(&records, &[&n1, &n2, &n4]);
        assert_eq!(
            out.delete,
            [
                succeeded.name_any(),
                failed_released.name_any(),
                failed_gone.name_any()
            ]
        );
        assert!(out.awaiting_person.is_empty());
    }

    #[test]
    fn a_node_recreated_under_the_same_name_holds_nothing_of_the_old_record() {
        let mut record = (*finished("n1", Phase::Failed, 100)).clone();
        record.spec.node_uid = Some("old-uid".into());
        let mut n = annotated("n1", CORDONED_BY_ANNOTATION, &record.name_any());
        n.metadata.uid = Some("new-uid".into());
        assert_eq!(holds_node(&record, Some(&n)), None);
        n.metadata.uid = Some("old-uid".into());
        assert!(holds_node(&record, Some(&n)).is_some());
    }
}

//! Which of a policy's unhealthy nodes are candidates this pass, and the records its decision
//! writes: new remediations, approved records readmitted, records past the attempts limit, and the
//! finished ones whose audit time ran out. Pure, like the rest of the fleet plan.

use std::{collections::BTreeMap, sync::Arc};

use gpu_remediation_api::{
    GpuRemediation, GpuRemediationPolicy, GpuRemediationStatus, Phase,
    constants::{ATTEMPTS_EXHAUSTED_ANNOTATION, CANCELLED_ANNOTATION},
    policy::Mode,
    remediation::PhaseTransition,
};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

use super::record::new_remediation;
use crate::lifecycle::status::awaits_person_past_attempts;
use crate::{
    budget::{self, Candidate, Deferral, Started},
    detect::Evidence,
    observe::NodeView,
    record_name::remediation_name,
};

/// The records a policy's decision writes.
pub(super) struct Records {
    /// New remediations the budget admitted.
    pub(super) create: Vec<GpuRemediation>,
    /// Approved `ManualRequired` records the budget admitted, with their status back in `Pending`.
    pub(super) readmit: Vec<(GpuRemediation, GpuRemediationStatus)>,
    /// New records for nodes past `maxAttemptsPerNode`, marked to enter `ManualRequired`.
    pub(super) manual_required: Vec<GpuRemediation>,
}

/// The records to write for `decision` (none for an invalid policy).
pub(super) fn records<N: NodeView>(
    policy: &GpuRemediationPolicy,
    decision: &budget::Decision,
    found: &Found<'_, '_, N>,
    remediations: &[Arc<GpuRemediation>],
    valid: bool,
    now: Timestamp,
) -> Records {
    let previous =
        |node: &N, evidence: &Evidence| previous_incident(node.node_name(), evidence.since, remediations);
    if !valid {
        return Records {
            create: Vec::new(),
            readmit: Vec::new(),
            manual_required: Vec::new(),
        };
    }
    let create = decision
        .admitted
        .iter()
        .filter(|c| !found.approved_records.contains_key(&c.node))
        .filter_map(|c| found.evidence_of.get(&c.node))
        .map(|(node, evidence)| new_remediation(policy, node, evidence, previous(node, evidence)))
        .collect();
    let readmit = decision
        .admitted
        .iter()
        .filter_map(|c| found.approved_records.get(&c.node))
        .map(|record| ((*record).clone(), readmitted_status(record, now)))
        .collect();
    let manual_required = decision
        .waiting
        .iter()
        .filter(|_| policy.spec.mode != Mode::DryRun)
        .filter(|w| matches!(w.deferral, Deferral::AttemptsExhausted { .. }))
        .filter_map(|w| {
            let (node, evidence) = found.evidence_of.get(&w.candidate.node)?;
            let mut record = new_remediation(policy, node, evidence, previous(node, evidence));
            record
                .annotations_mut()
                .insert(ATTEMPTS_EXHAUSTED_ANNOTATION.to_owned(), w.deferral.message());
            Some(record)
        })
        .collect();
    Records {
        create,
        readmit,
        manual_required,
    }
}

/// The status of an approved `ManualRequired` record the budget admitted: back in `Pending`.
pub(super) fn readmitted_status(record: &GpuRemediation, now: Timestamp) -> GpuRemediationStatus {
    let mut status = record.status.clone().unwrap_or_default();
    let message = "a person approved going past maxAttemptsPerNode and the budget admitted it: proceeding";
    status.phase = Phase::Pending;
    status.message = Some(message.to_owned());
    status.phase_history.push(PhaseTransition {
        phase: Phase::Pending,
        at: Time(now),
        message: Some(message.to_owned()),
    });
    status
}

/// The candidates of one policy, with what admitting each needs.
pub(super) struct Found<'n, 'r, N> {
    /// Nodes that may start (or, approved, resume) a remediation.
    pub(super) candidates: Vec<Candidate>,
    /// The evidence each new candidate was found unhealthy on.
    pub(super) evidence_of: BTreeMap<String, (&'n N, Evidence)>,
    /// This episode's `ManualRequired` record a person approved, by node.
    pub(super) approved_records: BTreeMap<String, &'r GpuRemediation>,
}

/// Unhealthy nodes free to start a remediation: none in flight for the node, and none yet for
/// this episode, or this episode's `ManualRequired` record approved by a person.
pub(super) fn candidates<'n, 'r, N: NodeView>(
    policy: &str,
    unhealthy: &[(&'n N, Evidence)],
    remediations: &'r [Arc<GpuRemediation>],
) -> Found<'n, 'r, N> {
    let mut candidates = Vec::new();
    let mut evidence_of: BTreeMap<String, (&N, Evidence)> = BTreeMap::new();
    let mut approved_records = BTreeMap::new();
    for (node, evidence) in unhealthy {
        let node_name = node.node_name().to_owned();
        let approved = remediations.iter().find(|r| {
            r.spec.node_name == node_name
                && r.metadata.deletion_timestamp.is_none()
                && r.status
                    .as_ref()
                    .is_some_and(|s| s.phase == Phase::ManualRequired)
                && r.spec
                    .trigger
                    .since
                    .as_ref()
                    .is_some_and(|t| t.0 == evidence.since)
                && crate::lifecycle::status::approved(r)
        });
        if let Some(record) = approved {
            candidates.push(Candidate {
                node: node_name.clone(),
                since: evidence.since,
                approved_past_attempts: true,
            });
            approved_records.insert(node_name.clone(), record.as_ref());
            continue;
        }
        let busy = remediations
            .iter()
            .filter(|r| r.spec.node_name == node_name)
            .any(|r| {
                let phase = r.status.as_ref().map(|s| s.phase).unwrap_or_default();
                !phase.is_terminal()
                    || r.spec
                        .trigger
                        .since
                        .as_ref()
                        .is_some_and(|t| t.0 == evidence.since)
            });
        // A person cancelled this episode by deleting its record: not again until it ends.
        let cancelled = node
            .annotation(CANCELLED_ANNOTATION)
            .is_some_and(|n| *n == remediation_name(&node_name, policy, evidence.since));
        if !busy && !cancelled {
            candidates.push(Candidate {
                node: node_name.clone(),
                since: evidence.since,
                approved_past_attempts: false,
            });
            evidence_of.insert(node_name, (node, evidence.clone()));
        }
    }

    Found {
        candidates,
        evidence_of,
        approved_records,
    }
}

/// The policy's remediations that count against its budget (dry runs do not).
pub(super) fn started(name: &str, remediations: &[Arc<GpuRemediation>], now: Timestamp) -> Vec<Started> {
    remediations
        .iter()
        .filter(|r| r.spec.policy_name == name && r.spec.mode != Mode::DryRun)
        .filter(|r| !awaits_person_past_attempts(r))
        .map(|r| Started {
            node: r.spec.node_name.clone(),
            at: admitted_at(r).unwrap_or(now),
            in_flight: !r
                .status
                .as_ref()
                .map(|s| s.phase)
                .unwrap_or_default()
                .is_terminal(),
        })
        .collect()
}

/// When `node`'s latest incident before `since` started, among the records still kept (any
/// policy's).
pub(super) fn previous_incident(
    node: &str,
    since: Timestamp,
    remediations: &[Arc<GpuRemediation>],
) -> Option<Timestamp> {
    remediations
        .iter()
        .filter(|r| r.spec.node_name == node)
        .filter_map(|r| r.spec.trigger.since.as_ref().map(|t| t.0))
        .filter(|t| *t < since)
        .max()
}

/// When a record was (last) admitted by the budget: its readmission after a person's approval
/// past `maxAttemptsPerNode`, else its creation. Limits count it from then.
pub(super) fn admitted_at(record: &GpuRemediation) -> Option<Timestamp> {
    let readmitted = record.status.as_ref().and_then(|s| {
        s.phase_history
            .iter()
            .skip(1)
            .rev()
            .find(|t| t.phase == Phase::Pending)
            .map(|t| t.at.0)
    });
    readmitted.or_else(|| record.creation_timestamp().map(|t| t.0))
}

pub(super) fn earliest(a: Option<Timestamp>, b: Option<Timestamp>) -> Option<Timestamp> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

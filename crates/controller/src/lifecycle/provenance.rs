//! Whether a record's status is one the lifecycle could have produced. The controller reads a
//! `GpuRemediation`'s status as its memory of what it did to the node, so a status written by
//! anyone else (a person or component granted `patch gpuremediations/status` where the records
//! admission policy, `manifests/controller/records-policy.yaml`, is not installed) could steer it:
//! a record awaiting approval moved to `Replacing` would have its node deleted, with no approval,
//! cordon or drain. [`judge`] looks for the evidence each phase that acts on the node stands on,
//! in parts of the record the lifecycle writes on the way there; [`hold`] is what a record without
//! it gets: a `Tampered` condition and a Warning Event, and nothing done to the node.
//!
//! The checks are precise, not broad: each names evidence that every path of the lifecycle writes
//! before (or with) the phase that needs it, and the property test in `lifecycle::paths` holds
//! [`judge`] to that on every status the lifecycle produces.

use gpu_remediation_api::{
    GpuRemediation, GpuRemediationStatus, Phase,
    bounds::LIST_MAX_ITEMS,
    constants::{APPROVED_ANNOTATION, ATTEMPTS_EXHAUSTED_ANNOTATION, reasons, remediation_conditions},
    policy::Mode,
};
use jiff::Timestamp;
use kube::{ResourceExt, runtime::events::EventType};

use super::{Next, Note, Settlement, status};

/// What [`judge`] finds of a record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Provenance {
    /// Its status is one the lifecycle could have produced (or touches nothing yet).
    Ours,
    /// Its status claims what nothing backs: each finding says what is missing.
    Tampered(Vec<String>),
}

/// Whether the phases that act on the node (cordon, drain, replacement) stand on the evidence
/// the lifecycle writes on the way to them:
///
/// - a `DryRun` record never leaves `Pending` but for `DryRun`;
/// - a record that waits for a person (mode `Manual`, or created past `maxAttemptsPerNode`) goes
///   on only with `gpuremediation.dev/approved=true` on it (which the approval policy reserves to
///   approvers, and which a status write cannot set);
/// - the phase is the last one the history records (a history cut at the schema's list limit
///   excepted);
/// - past `Cordoned`, the history and the conditions record the cordon; past the drain, the
///   conditions record the drain.
#[must_use]
pub fn judge(remediation: &GpuRemediation) -> Provenance {
    let Some(status) = &remediation.status else {
        return Provenance::Ours;
    };
    let phase = status.phase;
    let acting = matches!(
        phase,
        Phase::Cordoned | Phase::Draining | Phase::Blocked | Phase::Replacing | Phase::Verifying
    );
    let mut findings = Vec::new();
    if acting && remediation.spec.mode == Mode::DryRun {
        findings.push(format!("a DryRun record is never {phase}: it touches nothing"));
    }
    // A `ManualRequired` record back in `Pending` was readmitted, which only an approval does.
    let readmitted = status.phase == Phase::Pending && super::status::readmitted(status);
    if (acting || readmitted) && awaits_person(remediation) && !super::status::approved(remediation) {
        findings.push(format!(
            "{phase} without an approval: the record waits for a person and carries no {APPROVED_ANNOTATION}=true"
        ));
    }
    if acting {
        findings.extend(history_findings(status));
        findings.extend(condition_findings(status));
    }
    if findings.is_empty() {
        Provenance::Ours
    } else {
        Provenance::Tampered(findings)
    }
}

/// Whether the record waits for a person before it touches the node.
fn awaits_person(remediation: &GpuRemediation) -> bool {
    remediation.spec.mode == Mode::Manual
        || remediation
            .annotations()
            .contains_key(ATTEMPTS_EXHAUSTED_ANNOTATION)
}

fn history_findings(status: &GpuRemediationStatus) -> Vec<String> {
    let phase = status.phase;
    let history = &status.phase_history;
    let mut findings = Vec::new();
    let cut = u64::try_from(history.len()).is_ok_and(|n| n >= LIST_MAX_ITEMS);
    match history.last() {
        Some(last) if last.phase != phase && !cut => findings.push(format!(
            "status.phase is {phase} but the last phase the history records is {}",
            last.phase
        )),
        None => findings.push(format!("{phase} with no phase history")),
        Some(_) => {}
    }
    if phase != Phase::Cordoned && !history.iter().any(|t| t.phase == Phase::Cordoned) {
        findings.push(format!(
            "{phase} but the history never entered Cordoned: a step was skipped"
        ));
    }
    findings
}

fn condition_findings(status: &GpuRemediationStatus) -> Vec<String> {
    let phase = status.phase;
    let mut findings = Vec::new();
    if !status::has_condition(status, remediation_conditions::CORDONED) {
        findings.push(format!("{phase} with no cordon recorded (no Cordoned condition)"));
    }
    if matches!(phase, Phase::Replacing | Phase::Verifying)
        && !status::has_condition(status, remediation_conditions::DRAINED)
    {
        findings.push(format!("{phase} with no drain recorded (no Drained condition)"));
    }
    findings
}

/// The settlement of a record [`judge`] found tampered: its status as it is, with the `Tampered`
/// condition; a Warning Event when the condition is new or its findings changed; no release,
/// ask or next look (nothing is done to the node). A record a person deletes lets go of its
/// finalizer, still touching nothing: whatever the node carries stays for the person.
#[must_use]
pub fn hold(remediation: &GpuRemediation, findings: &[String], now: Timestamp) -> Settlement {
    let mut status = remediation.status.clone().unwrap_or_default();
    let message = format!(
        "held: this status was not written by the controller ({}); nothing is done to node {} \
         while it stands. Only the controller's service account may write a record's status \
         (manifests/controller/records-policy.yaml); delete the record to cancel it",
        findings.join("; "),
        remediation.spec.node_name
    );
    let already = status
        .conditions
        .iter()
        .any(|c| c.type_ == remediation_conditions::TAMPERED && c.status == "True" && c.message == message);
    if !already {
        status::set_condition(
            &mut status,
            remediation_conditions::TAMPERED,
            true,
            reasons::STATUS_TAMPERED,
            &message,
            now,
        );
    }
    Settlement {
        release: None,
        notes: if already {
            Vec::new()
        } else {
            vec![Note::new(reasons::STATUS_TAMPERED, EventType::Warning, &message)]
        },
        status,
        drop_finalizer: remediation.metadata.deletion_timestamp.is_some(),
        next: Next::Idle,
    }
}

#[cfg(test)]
#[path = "provenance_tests.rs"]
mod tests;

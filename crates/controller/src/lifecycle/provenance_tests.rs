use gpu_remediation_api::{
    GpuRemediation, GpuRemediationStatus, Phase,
    constants::{APPROVED_ANNOTATION, ATTEMPTS_EXHAUSTED_ANNOTATION, reasons, remediation_conditions},
    policy::{Action, Mode},
};
use kube::ResourceExt;

use super::{Provenance, hold, judge};
use crate::{
    lifecycle::status::{enter, set_condition},
    test_fixtures::{at, remediation},
};

fn record(mode: Mode) -> GpuRemediation {
    let mut record = remediation("gpu-1-abcde", "gpu-1", "p", Some(at(0)), Action::Replace);
    record.spec.mode = mode;
    record
}

/// The status the lifecycle writes on its way to `phase`: each phase entered in order, the
/// cordon and drain recorded as they happen.
fn walked_to(phases: &[Phase]) -> GpuRemediationStatus {
    let mut status = GpuRemediationStatus::default();
    for (i, &phase) in (0..).zip(phases) {
        if phase == Phase::Cordoned {
            set_condition(
                &mut status,
                remediation_conditions::CORDONED,
                true,
                "Cordoned",
                "ours",
                at(i),
            );
        }
        if matches!(phase, Phase::Replacing | Phase::Verifying) {
            set_condition(
                &mut status,
                remediation_conditions::DRAINED,
                true,
                "Drained",
                "gone",
                at(i),
            );
        }
        enter(&mut status, phase, "entered", at(i));
    }
    status
}

fn with(mut record: GpuRemediation, status: GpuRemediationStatus) -> GpuRemediation {
    record.status = Some(status);
    record
}

/// Asserts that some finding says each of `says`.
fn assert_finds(found: &[String], says: &[&str]) {
    for said in says {
        assert!(found.iter().any(|f| f.contains(said)), "{said:?} in {found:?}");
    }
}

fn findings(provenance: Provenance) -> Vec<String> {
    match provenance {
        Provenance::Ours => Vec::new(),
        Provenance::Tampered(findings) => findings,
    }
}

const TO_REPLACING: &[Phase] = &[Phase::Pending, Phase::Cordoned, Phase::Draining, Phase::Replacing];

/// A `Manual` record's way to `Replacing`: the approval between `AwaitingApproval` and the cordon.
const THROUGH_APPROVAL: &[Phase] = &[
    Phase::Pending,
    Phase::AwaitingApproval,
    Phase::Cordoned,
    Phase::Draining,
    Phase::Replacing,
];

fn approve(record: &mut GpuRemediation) {
    record
        .annotations_mut()
        .insert(APPROVED_ANNOTATION.into(), "true".into());
}

#[test]
fn every_phase_the_lifecycle_walks_through_is_its_own() {
    for end in 1..=TO_REPLACING.len() {
        let walked = with(record(Mode::Enforce), walked_to(&TO_REPLACING[..end]));
        assert_eq!(judge(&walked), Provenance::Ours, "{:?}", &TO_REPLACING[..end]);
    }
    let verifying = [TO_REPLACING, &[Phase::Verifying]].concat();
    assert_eq!(
        judge(&with(record(Mode::Enforce), walked_to(&verifying))),
        Provenance::Ours
    );
    let blocked = [Phase::Pending, Phase::Cordoned, Phase::Draining, Phase::Blocked];
    assert_eq!(
        judge(&with(record(Mode::Enforce), walked_to(&blocked))),
        Provenance::Ours
    );
    assert_eq!(judge(&record(Mode::Manual)), Provenance::Ours, "no status yet");
}

#[test]
fn an_approved_manual_record_goes_on() {
    let mut approved = record(Mode::Manual);
    approve(&mut approved);
    assert_eq!(
        judge(&with(approved, walked_to(THROUGH_APPROVAL))),
        Provenance::Ours
    );
}

#[test]
fn a_record_awaiting_approval_moved_to_replacing_by_hand_is_held() {
    let mut status = walked_to(&[Phase::Pending, Phase::AwaitingApproval]);
    status.phase = Phase::Replacing;
    let found = findings(judge(&with(record(Mode::Manual), status)));
    assert_finds(
        &found,
        &[
            "without an approval",
            "last phase the history records is AwaitingApproval",
            "never entered Cordoned",
            "no cordon recorded",
            "no drain recorded",
        ],
    );
}

#[test]
fn a_forged_history_does_not_stand_in_for_an_approval() {
    // Everything a status write can forge, forged: only the approval (metadata) is missing.
    let found = findings(judge(&with(record(Mode::Manual), walked_to(THROUGH_APPROVAL))));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("Replacing without an approval"), "{found:?}");
}

#[test]
fn a_record_past_its_attempts_needs_an_approval_even_back_in_pending() {
    let mut exhausted = record(Mode::Enforce);
    exhausted
        .annotations_mut()
        .insert(ATTEMPTS_EXHAUSTED_ANNOTATION.into(), "3 attempts in 24h".into());
    let readmitted = walked_to(&[Phase::Pending, Phase::ManualRequired, Phase::Pending]);
    let found = findings(judge(&with(exhausted.clone(), readmitted.clone())));
    assert!(found[0].starts_with("Pending without an approval"), "{found:?}");
    approve(&mut exhausted);
    assert_eq!(judge(&with(exhausted, readmitted)), Provenance::Ours);
}

#[test]
fn a_dry_run_record_never_acts() {
    let found = findings(judge(&with(record(Mode::DryRun), walked_to(TO_REPLACING))));
    assert_eq!(found, ["a DryRun record is never Replacing: it touches nothing"]);
    let dry = with(record(Mode::DryRun), walked_to(&[Phase::Pending, Phase::DryRun]));
    assert_eq!(judge(&dry), Provenance::Ours);
}

#[test]
fn a_skipped_step_is_found() {
    // Draining entered straight from Pending: no cordon in the history or the conditions.
    let found = findings(judge(&with(
        record(Mode::Enforce),
        walked_to(&[Phase::Pending, Phase::Draining]),
    )));
    assert_finds(&found, &["never entered Cordoned", "no cordon recorded"]);
    // A replacement with the cordon but no drain on record.
    let mut status = walked_to(&[Phase::Pending, Phase::Cordoned, Phase::Draining]);
    enter(&mut status, Phase::Replacing, "by hand", at(9));
    let found = findings(judge(&with(record(Mode::Enforce), status)));
    assert_eq!(found, ["Replacing with no drain recorded (no Drained condition)"]);
}

#[test]
fn a_hold_reports_once_and_touches_nothing() {
    let mut status = walked_to(&[Phase::Pending, Phase::AwaitingApproval]);
    status.phase = Phase::Replacing;
    let tampered = with(record(Mode::Manual), status);
    let Provenance::Tampered(found) = judge(&tampered) else {
        panic!("tampered")
    };
    let held = hold(&tampered, &found, at(5));
    assert!(held.release.is_none());
    assert!(!held.drop_finalizer);
    assert_eq!(held.next, crate::lifecycle::Next::Idle);
    assert_eq!(held.status.phase, Phase::Replacing, "the phase is left as found");
    assert_eq!(held.notes.len(), 1);
    assert_eq!(held.notes[0].reason, reasons::STATUS_TAMPERED);
    assert!(held.notes[0].warning);
    assert!(
        held.notes[0].text.contains("nothing is done to node gpu-1"),
        "{}",
        held.notes[0].text
    );
    let condition = held
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == remediation_conditions::TAMPERED)
        .expect("the Tampered condition");
    assert_eq!(condition.status, "True");
    let again = hold(&with(tampered.clone(), held.status.clone()), &found, at(9));
    assert!(again.notes.is_empty(), "one Event while the findings stand");
    assert_eq!(again.status, held.status);
    let mut deleted = tampered;
    deleted.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(7)));
    let let_go = hold(&deleted, &found, at(9));
    assert!(
        let_go.drop_finalizer && let_go.release.is_none(),
        "deleted: let go, touching nothing"
    );
}

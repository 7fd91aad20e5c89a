//! Editing a remediation's status: entering a phase (with its time in the history), conditions,
//! refusals, and the Event that says each change; and reading what the record says of a person
//! (approved, readmitted, waiting past its attempts). Pure; the one home of these helpers.

use gpu_remediation_api::{
    GpuRemediationStatus, Phase,
    constants::remediation_conditions,
    remediation::{PhaseTransition, Refusal},
};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::events::EventType;

use super::{Next, Release, Settlement, Words, dated};

use super::note::Note;

/// Dates `Pending` from the record's creation (creation cannot set a status): the record counts
/// from its admission, whatever happens to it later.
#[must_use]
pub fn with_admission(mut status: GpuRemediationStatus, created: Option<Timestamp>) -> GpuRemediationStatus {
    if status
        .phase_history
        .first()
        .is_none_or(|t| t.phase != Phase::Pending)
        && let Some(created) = created
    {
        let admitted = PhaseTransition {
            phase: Phase::Pending,
            at: Time(created),
            message: Some("admitted by the budget".to_owned()),
        };
        status.phase_history.insert(0, admitted);
    }
    status
}

/// When the record was admitted (entered `Pending`).
#[must_use]
pub fn admitted_at(status: &GpuRemediationStatus) -> Option<Timestamp> {
    status
        .phase_history
        .first()
        .filter(|t| t.phase == Phase::Pending)
        .map(|t| t.at.0)
}

/// Enters `phase`: records it with its time in the history and as the current message.
pub fn enter(status: &mut GpuRemediationStatus, phase: Phase, message: &str, now: Timestamp) {
    status.phase = phase;
    status.phase_history.push(PhaseTransition {
        phase,
        at: Time(now),
        message: Some(message.to_owned()),
    });
    status.message = Some(message.to_owned());
}

/// When `phase` was last entered.
#[must_use]
pub fn phase_entered(status: &GpuRemediationStatus, phase: Phase) -> Option<Timestamp> {
    status
        .phase_history
        .iter()
        .rev()
        .find(|t| t.phase == phase)
        .map(|t| t.at.0)
}

/// When `phase` was entered, for its deadline: the latest entry into it, else (a phase written by
/// hand) the latest transition recorded, else `now`. Never a time that moves on with each look.
#[must_use]
pub fn deadline_base(status: &GpuRemediationStatus, phase: Phase, now: Timestamp) -> Timestamp {
    phase_entered(status, phase)
        .or_else(|| status.phase_history.last().map(|t| t.at.0))
        .unwrap_or(now)
}

/// Sets a condition, moving its transition time only when its status changes.
pub fn set_condition(
    status: &mut GpuRemediationStatus,
    type_: &str,
    value: bool,
    reason: &str,
    message: &str,
    now: Timestamp,
) {
    let updated = crate::status_condition::condition(
        &status.conditions,
        type_,
        value,
        reason.to_owned(),
        message.to_owned(),
        None,
        now,
    );
    match status.conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(existing) => *existing = updated,
        None => status.conditions.push(updated),
    }
}

/// Whether the status has a condition of this type, whatever its value.
#[must_use]
pub fn has_condition(status: &GpuRemediationStatus, type_: &str) -> bool {
    status.conditions.iter().any(|c| c.type_ == type_)
}

/// Whether the status has this condition `True`.
#[must_use]
pub fn has_true(status: &GpuRemediationStatus, type_: &str) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == "True")
}

/// The refusal `words` as of `now`, keeping the time it started if the same step was refused
/// before.
#[must_use]
pub fn refusal(status: &GpuRemediationStatus, words: &Words, now: Timestamp) -> Refusal {
    let since = status
        .refusal
        .as_ref()
        .filter(|r| r.action == words.action)
        .map_or(now, |r| r.since.0);
    dated(words, since)
}

/// A pass that changes nothing but, perhaps, drops the finalizer.
#[must_use]
pub fn unchanged(status: GpuRemediationStatus, drop_finalizer: bool, next: Next) -> Settlement {
    Settlement {
        release: None,
        status,
        notes: Vec::new(),
        drop_finalizer,
        next,
    }
}

/// Enters `phase` with an Event saying so. A terminal phase drops the finalizer, except
/// `ManualRequired`, which a person's approval may bring back, and `Failed`, which gives back
/// the node when a person deletes the record.
#[must_use]
pub fn move_to(
    mut status: GpuRemediationStatus,
    phase: Phase,
    message: &str,
    reason: &str,
    type_: EventType,
    now: Timestamp,
    next: Next,
) -> Settlement {
    let before = status.phase;
    enter(&mut status, phase, message, now);
    if phase.is_terminal() && phase != Phase::ManualRequired {
        set_condition(
            &mut status,
            remediation_conditions::COMPLETE,
            true,
            reason,
            message,
            now,
        );
    }
    Settlement {
        release: None,
        notes: vec![Note::phase(before, &status, reason, type_)],
        drop_finalizer: phase.is_terminal() && !matches!(phase, Phase::ManualRequired | Phase::Failed),
        status,
        next,
    }
}

/// Records a refusal; an Event only when the server's words change.
#[must_use]
pub fn refused(mut status: GpuRemediationStatus, refusal: Refusal, next: Next) -> Settlement {
    let changed = status
        .refusal
        .as_ref()
        .is_none_or(|r| r.action != refusal.action || r.message != refusal.message);
    let text = format!(
        "{} refused{}: {}",
        refusal.action,
        refusal.code.map(|c| format!(" ({c})")).unwrap_or_default(),
        refusal.message
    );
    status.message = Some(text.clone());
    status.refusal = Some(refusal);
    Settlement {
        release: None,
        notes: if changed {
            vec![Note::new("Refused", EventType::Warning, &text)]
        } else {
            Vec::new()
        },
        status,
        drop_finalizer: false,
        next,
    }
}

/// Ends the remediation `Succeeded`, giving back what it holds on a node still standing.
#[must_use]
pub fn succeed(
    mut status: GpuRemediationStatus,
    release: Option<Release>,
    message: &str,
    reason: &str,
    now: Timestamp,
) -> Settlement {
    status.refusal = None;
    if release.is_some() || has_condition(&status, remediation_conditions::CORDONED) {
        set_condition(
            &mut status,
            remediation_conditions::CORDONED,
            false,
            reason,
            "released",
            now,
        );
    }
    let mut settled = move_to(
        status,
        Phase::Succeeded,
        message,
        reason,
        EventType::Normal,
        now,
        Next::Idle,
    );
    settled.release = release;
    settled
}

/// Whether `remediation` was created past `maxAttemptsPerNode` and has not been admitted since:
/// it waits for a person (in `ManualRequired`, or in `Pending` on its way there) and counts
/// against neither concurrency, rate nor attempts.
#[must_use]
pub fn awaits_person_past_attempts(remediation: &gpu_remediation_api::GpuRemediation) -> bool {
    kube::ResourceExt::annotations(remediation)
        .contains_key(gpu_remediation_api::constants::ATTEMPTS_EXHAUSTED_ANNOTATION)
        && !remediation.status.as_ref().is_some_and(readmitted)
}

/// Whether the history shows a `ManualRequired` record brought back to `Pending` (which only an
/// approval does).
#[must_use]
pub fn readmitted(status: &GpuRemediationStatus) -> bool {
    status
        .phase_history
        .iter()
        .skip_while(|t| t.phase != Phase::ManualRequired)
        .any(|t| t.phase == Phase::Pending)
}

/// Whether a person approved the record: its approval annotation says `true`.
#[must_use]
pub fn approved(remediation: &gpu_remediation_api::GpuRemediation) -> bool {
    kube::ResourceExt::annotations(remediation)
        .get(gpu_remediation_api::constants::APPROVED_ANNOTATION)
        .is_some_and(|v| v == "true")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_fixtures::at;

    #[test]
    fn entering_a_phase_records_it_with_its_time_and_message() {
        let mut status = GpuRemediationStatus::default();
        enter(&mut status, Phase::Cordoned, "cordoned", at(1));
        enter(&mut status, Phase::Draining, "draining", at(2));
        assert_eq!(status.phase, Phase::Draining);
        assert_eq!(status.message.as_deref(), Some("draining"));
        assert_eq!(phase_entered(&status, Phase::Cordoned), Some(at(1)));
        assert_eq!(phase_entered(&status, Phase::Draining), Some(at(2)));
    }

    #[test]
    fn a_record_is_dated_from_its_creation_once() {
        let status = with_admission(GpuRemediationStatus::default(), Some(at(5)));
        assert_eq!(admitted_at(&status), Some(at(5)));
        let again = with_admission(status.clone(), Some(at(9)));
        assert_eq!(again, status);
    }

    #[test]
    fn a_refusal_keeps_the_time_it_started_while_the_same_step_is_refused() {
        let words = |action: &str| Words::answered(action.to_owned(), 403, "forbidden".to_owned());
        let mut status = GpuRemediationStatus::default();
        status.refusal = Some(refusal(&status, &words("creating X"), at(1)));
        assert_eq!(refusal(&status, &words("creating X"), at(9)).since.0, at(1));
        assert_eq!(refusal(&status, &words("deleting Y"), at(9)).since.0, at(9));
    }

    #[test]
    fn the_same_refusal_twice_is_one_event() {
        let words = Words::answered("creating X".to_owned(), 403, "forbidden".to_owned());
        let first = refused(GpuRemediationStatus::default(), dated(&words, at(1)), Next::Idle);
        assert_eq!(first.notes.len(), 1);
        let second = refused(first.status, dated(&words, at(1)), Next::Idle);
        assert!(second.notes.is_empty());
    }
}

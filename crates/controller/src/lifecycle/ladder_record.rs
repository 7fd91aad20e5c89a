//! The records a ladder's steps leave in a remediation's status (`status.steps`): opening and
//! closing a step, which steps a status write ended (for the metrics), whether a recycle was
//! replaced or handed off, and which object the acting layer looks at. Pure.

use gpu_remediation_api::{
    GpuRemediationStatus, Phase,
    ladder::{Rung, STEP_MESSAGE_MAX, STEP_RECORDS_MAX, StepOutcome, StepRecord},
    policy::Strategy,
    remediation::PolicySnapshot,
};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Whether a status was ended by a hand-off (its node stays cordoned for a person).
#[must_use]
pub fn handed_off(status: &GpuRemediationStatus) -> bool {
    status.phase == Phase::ManualRequired && status.steps.last().is_some_and(|s| s.step == Rung::HandOff)
}

pub(super) fn new_record(step: Rung, now: Timestamp) -> StepRecord {
    StepRecord {
        step,
        start: Time(now),
        end: None,
        outcome: None,
        message: None,
        object: None,
        evidence: gpu_remediation_api::ladder::StepEvidence::default(),
        evicted_pods: Vec::new(),
    }
}

/// Opens `record` as the current step (a step still open, left by a phase written by hand, ends
/// `Superseded`).
pub(super) fn open(status: &mut GpuRemediationStatus, record: StepRecord) {
    let now = record.start.0;
    close(status, StepOutcome::Superseded, "another step started", now);
    status.current_step = Some(record.step);
    status.steps.push(record);
    let excess = status.steps.len().saturating_sub(STEP_RECORDS_MAX);
    status.steps.drain(..excess);
}

/// Ends the open step (if any) with `outcome`.
pub(super) fn close(status: &mut GpuRemediationStatus, outcome: StepOutcome, message: &str, now: Timestamp) {
    if let Some(open) = status.steps.last_mut().filter(|s| s.end.is_none()) {
        open.end = Some(Time(now));
        open.outcome = Some(outcome);
        open.message = Some(gpu_remediation_api::text::truncate(message, STEP_MESSAGE_MAX));
    }
}

/// Which object the acting layer looks at in `Verifying`: the open step's template object (looked
/// at as the `Template` strategy does) or, for `Replace`, the replacement's.
#[must_use]
pub fn looked_at(
    status: &GpuRemediationStatus,
    rules: &PolicySnapshot,
) -> Option<(Strategy, gpu_remediation_api::object_reference::ObjectReference)> {
    if rules.ladder.is_empty() || status.phase != Phase::Verifying {
        return None;
    }
    let open = status.steps.last().filter(|s| s.end.is_none())?;
    match open.step {
        Rung::ResetGpu | Rung::Reboot => open.object.clone().map(|o| (Strategy::Template, o)),
        Rung::Replace => status
            .replacement
            .clone()
            .map(|o| (rules.replacement.strategy, o)),
        Rung::HandOff => None,
    }
}

/// The steps `after` ended that `before` had not (for the metrics of a status just written).
#[must_use]
pub fn newly_ended<'a>(
    before: Option<&GpuRemediationStatus>,
    after: &'a GpuRemediationStatus,
) -> Vec<&'a StepRecord> {
    let ended_before = |step: &StepRecord| {
        before.is_some_and(|b| {
            b.steps
                .iter()
                .any(|s| s.step == step.step && s.start == step.start && s.end.is_some())
        })
    };
    after
        .steps
        .iter()
        .filter(|s| s.end.is_some() && !ended_before(s))
        .collect()
}

/// Whether a recycle's `Replace` step was triggered (its node was, or was being, replaced).
#[must_use]
pub fn replaced(status: &GpuRemediationStatus) -> bool {
    status
        .steps
        .iter()
        .any(|s| s.step == Rung::Replace && s.object.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(second: i64) -> Time {
        Time(Timestamp::from_second(1_800_000_000 + second).expect("a time"))
    }

    fn step(rung: Rung, start: i64, end: Option<i64>) -> StepRecord {
        let mut record = new_record(rung, at(start).0);
        record.end = end.map(at);
        record.outcome = end.map(|_| StepOutcome::Permanent);
        record
    }

    #[test]
    fn only_the_steps_this_write_ended_are_newly_ended() {
        let before = GpuRemediationStatus {
            steps: vec![step(Rung::ResetGpu, 0, Some(10)), step(Rung::Reboot, 10, None)],
            ..GpuRemediationStatus::default()
        };
        let after = GpuRemediationStatus {
            steps: vec![
                step(Rung::ResetGpu, 0, Some(10)),
                step(Rung::Reboot, 10, Some(50)),
                step(Rung::Replace, 50, None),
            ],
            ..GpuRemediationStatus::default()
        };
        let ended: Vec<Rung> = newly_ended(Some(&before), &after)
            .iter()
            .map(|s| s.step)
            .collect();
        assert_eq!(ended, [Rung::Reboot]);
        assert!(!replaced(&after), "the Replace step has no object yet");
    }

    #[test]
    fn opening_a_step_supersedes_one_left_open_and_keeps_the_latest_sixteen() {
        let mut status = GpuRemediationStatus::default();
        for i in 0..20 {
            open(&mut status, new_record(Rung::ResetGpu, at(i).0));
        }
        assert_eq!(status.steps.len(), STEP_RECORDS_MAX);
        assert_eq!(status.steps.iter().filter(|s| s.end.is_none()).count(), 1);
        assert!(
            status.steps[..STEP_RECORDS_MAX - 1]
                .iter()
                .all(|s| s.outcome == Some(StepOutcome::Superseded))
        );
    }
}

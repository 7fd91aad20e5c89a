//! How often a drain's progress reaches the API server: a status that differs from the one written
//! only in the drain's progress (counts, blockers, the message) while the phase stays `Draining`
//! or `Blocked` is written at most once per [`PROGRESS_INTERVAL`]; in between it is held here and
//! the next pass decides from it, as if it had been written. A phase change is always written at
//! once (with every progress held before it). A held status lasts only as long as the record's
//! version it was based on: any other write to the record (a person's, a restart's) drops it, and
//! at worst the counts of a few seconds of evictions go unreported.

use std::{
    collections::HashMap,
    sync::{Mutex, PoisonError},
};

use gpu_remediation_api::{GpuRemediation, GpuRemediationStatus, Phase};
use jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;

/// The least time between two progress writes of one remediation.
pub const PROGRESS_INTERVAL: SignedDuration = SignedDuration::from_secs(5);

/// Whether `after` differs from `written` only in the drain's progress, in a phase that drains.
#[must_use]
pub fn progress_only(written: Option<&GpuRemediationStatus>, after: &GpuRemediationStatus) -> bool {
    let Some(written) = written else { return false };
    if written.phase != after.phase || !matches!(after.phase, Phase::Draining | Phase::Blocked) {
        return false;
    }
    let bare = |s: &GpuRemediationStatus| GpuRemediationStatus {
        drain: None,
        message: None,
        ..s.clone()
    };
    bare(written) == bare(after)
}

/// What to do with a new status.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The API server already has it.
    Unchanged,
    /// Progress only, written less than [`PROGRESS_INTERVAL`] ago: hold it until this time.
    HoldUntil(Timestamp),
    /// Write it now.
    Write,
}

/// Decides for a new status against the status the API server has and when it was last written.
#[must_use]
pub fn verdict(
    written: Option<&GpuRemediationStatus>,
    written_at: Option<Timestamp>,
    after: &GpuRemediationStatus,
    now: Timestamp,
) -> Verdict {
    if written == Some(after) {
        return Verdict::Unchanged;
    }
    match written_at.map(|at| crate::time::plus(at, PROGRESS_INTERVAL)) {
        Some(due) if now < due && progress_only(written, after) => Verdict::HoldUntil(due),
        _ => Verdict::Write,
    }
}

#[derive(Debug)]
struct Entry {
    written_at: Timestamp,
    /// The record's version the held status builds on, the status the server has at that version,
    /// and the status held.
    held: Option<(Option<String>, Option<GpuRemediationStatus>, GpuRemediationStatus)>,
}

/// The held progress of every remediation, and when each last had its status written.
#[derive(Debug, Default)]
pub struct HeldProgress {
    entries: Mutex<HashMap<String, Entry>>,
}

impl HeldProgress {
    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `remediation` with its held status, if one builds on this very version; and the status the
    /// server has.
    #[must_use]
    pub fn resume(&self, remediation: &GpuRemediation) -> (GpuRemediation, Option<GpuRemediationStatus>) {
        let mut entries = self.entries();
        let version = remediation.resource_version();
        if let Some(entry) = entries.get_mut(&remediation.name_any()) {
            match &entry.held {
                Some((base, written, held)) if *base == version => {
                    let mut resumed = remediation.clone();
                    resumed.status = Some(held.clone());
                    return (resumed, written.clone());
                }
                Some(_) => entry.held = None,
                None => {}
            }
        }
        (remediation.clone(), remediation.status.clone())
    }

    /// When `name`'s status was last written by this replica.
    #[must_use]
    pub fn written_at(&self, name: &str) -> Option<Timestamp> {
        self.entries().get(name).map(|e| e.written_at)
    }

    /// Holds `status` for `name`, built on `version` where the server has `written`.
    pub fn hold(
        &self,
        name: &str,
        version: Option<String>,
        written: Option<GpuRemediationStatus>,
        status: GpuRemediationStatus,
    ) {
        if let Some(entry) = self.entries().get_mut(name) {
            entry.held = Some((version, written, status));
        }
    }

    /// Records a write of `name`'s status at `now`: nothing is held any more.
    pub fn wrote(&self, name: &str, now: Timestamp) {
        self.entries().insert(
            name.to_owned(),
            Entry {
                written_at: now,
                held: None,
            },
        );
    }

    /// Drops what is held for `name` (the server has it already).
    pub fn release(&self, name: &str) {
        if let Some(entry) = self.entries().get_mut(name) {
            entry.held = None;
        }
    }

    /// Forgets `name` (finished, or gone).
    pub fn forget(&self, name: &str) {
        self.entries().remove(name);
    }
}

#[cfg(test)]
mod tests {
    use gpu_remediation_api::remediation::DrainStatus;

    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn draining(evicted: u32) -> GpuRemediationStatus {
        GpuRemediationStatus {
            phase: Phase::Draining,
            drain: Some(DrainStatus {
                pods_total: 20,
                pods_evicted: evicted,
                pods_remaining: 20 - evicted,
                ..DrainStatus::default()
            }),
            message: Some(format!("{evicted} evicted")),
            ..GpuRemediationStatus::default()
        }
    }

    #[test]
    fn progress_within_the_interval_is_held_and_written_once_it_has_passed() {
        let written = draining(2);
        assert_eq!(
            verdict(Some(&written), Some(at(0)), &draining(5), at(1)),
            Verdict::HoldUntil(at(5))
        );
        assert_eq!(
            verdict(Some(&written), Some(at(0)), &draining(5), at(5)),
            Verdict::Write
        );
        assert_eq!(
            verdict(Some(&written), None, &draining(5), at(1)),
            Verdict::Write,
            "never written by this replica: write"
        );
        assert_eq!(
            verdict(Some(&written), Some(at(0)), &draining(2), at(1)),
            Verdict::Unchanged
        );
    }

    #[test]
    fn a_phase_change_or_any_other_field_is_written_at_once() {
        let written = draining(2);
        let mut verifying = draining(20);
        verifying.phase = Phase::Verifying;
        assert_eq!(
            verdict(Some(&written), Some(at(0)), &verifying, at(1)),
            Verdict::Write
        );
        let mut approved = draining(3);
        approved.approved_by = Some("alice".into());
        assert_eq!(
            verdict(Some(&written), Some(at(0)), &approved, at(1)),
            Verdict::Write
        );
        let mut cordoned = draining(0);
        cordoned.phase = Phase::Cordoned;
        assert!(
            !progress_only(Some(&cordoned), &cordoned.clone()),
            "only draining phases hold"
        );
    }

    #[test]
    fn a_held_status_lasts_only_as_long_as_the_version_it_builds_on() {
        let held = HeldProgress::default();
        let mut record: GpuRemediation = serde_json::from_value(serde_json::json!({
            "apiVersion": "gpuremediation.dev/v1alpha1",
            "kind": "GpuRemediation",
            "metadata": {"name": "r"},
            "spec": {
                "nodeName": "gpu-1",
                "policyName": "p",
                "action": "None",
                "mode": "Enforce",
                "trigger": {"conditionType": "GpuHealthy", "status": "False", "reason": "XID79"},
            },
        }))
        .expect("a valid remediation");
        record.metadata.resource_version = Some("10".into());
        record.status = Some(draining(2));
        held.wrote("r", at(0));
        held.hold("r", Some("10".into()), Some(draining(2)), draining(5));
        let (resumed, written) = held.resume(&record);
        assert_eq!(resumed.status, Some(draining(5)));
        assert_eq!(written, Some(draining(2)));
        record.metadata.resource_version = Some("11".into());
        let (resumed, written) = held.resume(&record);
        assert_eq!(
            resumed.status,
            Some(draining(2)),
            "someone wrote since: theirs stands"
        );
        assert_eq!(written, Some(draining(2)));
    }
}

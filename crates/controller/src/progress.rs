//! How often a drain's progress reaches the API server: a status that differs from the one written
//! only in the drain's progress (counts, blockers, the message) while the phase stays `Draining`
//! or `Blocked` is written at most once per [`PROGRESS_INTERVAL`]; in between it is held here and
//! the next pass decides from it, as if it had been written. A phase change is always written at
//! once (with every progress held before it). A held status lasts only as long as the record's
//! version it was based on: any other write to the record (a person's, a restart's) drops it, and
//! at worst the counts of a few seconds of evictions go unreported.
//!
//! The cordon is the one phase change held on a timer: the drain follows it at once in the other
//! lane, so `Cordoned`, and `Draining` with the drain's progress, reach the server together at most
//! [`PROGRESS_INTERVAL`] after the cordon, or sooner with the next phase change (a drain done
//! within the interval: `Verifying`); the phase history keeps every change with its time, and
//! their Events are folded into that write's Event ([`fold`]). The node's taint names the
//! remediation, so a restart in between finds the cordon its own and goes on. A drain that cannot
//! start (its pods cannot be listed) still shows `Cordoned` once the interval is over; a drain
//! refused by its budgets shows `Draining` with its blockers then.
//!
//! A status that the next step of the same advance follows at once ([`passed_through`]: a drain
//! that has just ended, then `Verifying`) is held the same way and carried by that step's write,
//! its Events folded into that write's: one status write and one Event for a chain of phase
//! changes made within one advance. If the next step fails, the pass after it resumes from the
//! held status and writes it. `Replacing` is never held: the replacement it triggers cannot be
//! taken back, so the record says so first.

use std::{
    collections::HashMap,
    sync::{Mutex, PoisonError},
};

use gpu_remediation_api::{GpuRemediation, GpuRemediationStatus, Phase, constants::reasons};
use jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;

use crate::lifecycle::{self, Note};

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

/// Whether `after` has entered `Cordoned` (and is still there, or draining) where the server has
/// the record from before the cordon, and when it entered it: the cordon and the drain's first
/// progress are held together, at most [`PROGRESS_INTERVAL`] from the cordon.
#[must_use]
pub fn cordon_entered(
    written: Option<&GpuRemediationStatus>,
    after: &GpuRemediationStatus,
) -> Option<Timestamp> {
    let before_cordon = written.is_none_or(|w| matches!(w.phase, Phase::Pending | Phase::AwaitingApproval));
    (matches!(after.phase, Phase::Cordoned | Phase::Draining) && before_cordon)
        .then(|| lifecycle::status::phase_entered(after, Phase::Cordoned))
        .flatten()
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
    if let Some(cordoned) = cordon_entered(written, after) {
        let due = crate::time::plus(cordoned, PROGRESS_INTERVAL);
        return if now < due {
            Verdict::HoldUntil(due)
        } else {
            Verdict::Write
        };
    }
    match written_at.map(|at| crate::time::plus(at, PROGRESS_INTERVAL)) {
        Some(due) if now < due && progress_only(written, after) => Verdict::HoldUntil(due),
        _ => Verdict::Write,
    }
}

/// Whether a settlement's `status` may pass through without a write of its own because the next
/// step of the same advance follows at once (its write carries this status's phase history and,
/// folded, its Events): not a finished remediation's, not one whose settlement releases the node
/// or drops the finalizer (those are written as they happen), and not `Replacing`. The step after
/// `Replacing` deletes a Machine, a `NodeClaim` or the node, or creates a reboot's object: what
/// cannot be taken back is on record before it is done, so a replica that stops in between (or a
/// status write that fails after it) leaves a record that says `Replacing` and triggers again,
/// idempotently, never one that says `Draining` about a node that is gone.
#[must_use]
pub fn passed_through(status: &GpuRemediationStatus, releases: bool, drops_finalizer: bool) -> bool {
    !status.phase.is_terminal() && status.phase != Phase::Replacing && !releases && !drops_finalizer
}

/// The Events of a write that carries an earlier held phase change: the phase changes told in one
/// Event (`Pending → Cordoned: …; Cordoned → Draining: …`), every other Event as it is, in order.
#[must_use]
pub fn fold(held: Vec<Note>, new: Vec<Note>) -> Vec<Note> {
    let mut folded: Vec<Note> = Vec::new();
    for note in held.into_iter().chain(new) {
        match folded
            .iter_mut()
            .find(|n| n.reason == reasons::PHASE_CHANGED && note.reason == reasons::PHASE_CHANGED)
        {
            Some(first) => {
                let text = format!("{}; {}", first.text, note.text);
                *first = Note::new(
                    reasons::PHASE_CHANGED,
                    if first.warning || note.warning {
                        kube::runtime::events::EventType::Warning
                    } else {
                        kube::runtime::events::EventType::Normal
                    },
                    &text,
                );
            }
            None => folded.push(note),
        }
    }
    folded
}

/// What is held of one remediation's status.
#[derive(Debug)]
struct Held {
    /// The record's version the held status builds on.
    base: Option<String>,
    /// The status the server has at that version.
    written: Option<GpuRemediationStatus>,
    /// The status held.
    status: GpuRemediationStatus,
    /// The Events of a held phase change, published with the write that carries it.
    notes: Vec<Note>,
}

#[derive(Debug, Default)]
struct Entry {
    /// When this replica last wrote the status (never, for a record it has only held).
    written_at: Option<Timestamp>,
    held: Option<Held>,
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
                Some(held) if held.base == version => {
                    let mut resumed = remediation.clone();
                    resumed.status = Some(held.status.clone());
                    return (resumed, held.written.clone());
                }
                Some(_) => entry.held = None,
                None => {}
            }
        }
        (remediation.clone(), remediation.status.clone())
    }

    /// `f` of `remediation`'s status as this replica sees it: the held one if it builds on this
    /// very version, else the record's.
    pub fn with_status<R>(
        &self,
        remediation: &GpuRemediation,
        f: impl FnOnce(Option<&GpuRemediationStatus>) -> R,
    ) -> R {
        let version = remediation.resource_version();
        let entries = self.entries();
        let held = entries
            .get(&remediation.name_any())
            .and_then(|e| e.held.as_ref())
            .filter(|held| held.base == version);
        match held {
            Some(held) => f(Some(&held.status)),
            None => f(remediation.status.as_ref()),
        }
    }

    /// The phase `remediation` is in once its held status (if it builds on this version) counts.
    #[must_use]
    pub fn phase(&self, remediation: &GpuRemediation) -> Phase {
        self.with_status(remediation, |s| s.map(|s| s.phase).unwrap_or_default())
    }

    /// When `name`'s status was last written by this replica.
    #[must_use]
    pub fn written_at(&self, name: &str) -> Option<Timestamp> {
        self.entries().get(name).and_then(|e| e.written_at)
    }

    /// Holds `status` for `name`, built on `version` where the server has `written`, with the
    /// Events of a held phase change (`notes`, added to those still held).
    pub fn hold(
        &self,
        name: &str,
        version: Option<String>,
        written: Option<GpuRemediationStatus>,
        status: GpuRemediationStatus,
        notes: Vec<Note>,
    ) {
        let mut entries = self.entries();
        let entry = entries.entry(name.to_owned()).or_default();
        let mut kept = entry
            .held
            .take()
            .filter(|held| held.base == version)
            .map(|held| held.notes)
            .unwrap_or_default();
        kept.extend(notes);
        entry.held = Some(Held {
            base: version,
            written,
            status,
            notes: kept,
        });
    }

    /// Records a write of `name`'s status at `now`: nothing is held any more. Returns the Events
    /// of the held phase change the write carries.
    pub fn wrote(&self, name: &str, now: Timestamp) -> Vec<Note> {
        let previous = self.entries().insert(
            name.to_owned(),
            Entry {
                written_at: Some(now),
                held: None,
            },
        );
        previous
            .and_then(|e| e.held)
            .map(|held| held.notes)
            .unwrap_or_default()
    }

    /// Moves what is held for `name` over `from` onto `to`: the record's version changed by a
    /// write of this replica's own that leaves the status alone (see `replace::Triggered`).
    pub fn rebase(&self, name: &str, from: Option<&str>, to: Option<String>) {
        if let Some(held) = self
            .entries()
            .get_mut(name)
            .and_then(|entry| entry.held.as_mut())
            .filter(|held| held.base.as_deref() == from)
        {
            held.base = to;
        }
    }

    /// Drops what is held for `name` (the server has it already); returns the Events still held.
    pub fn release(&self, name: &str) -> Vec<Note> {
        self.entries()
            .get_mut(name)
            .and_then(|entry| entry.held.take())
            .map(|held| held.notes)
            .unwrap_or_default()
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
    use crate::test_fixtures::at;

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
    fn a_status_passes_through_unless_it_ends_releases_or_drops_the_finalizer() {
        let drained = draining(20);
        assert!(passed_through(&drained, false, false));
        assert!(
            !passed_through(&drained, true, false),
            "a release is written as it happens"
        );
        assert!(!passed_through(&drained, false, true));
        let mut succeeded = draining(20);
        succeeded.phase = Phase::Succeeded;
        assert!(
            !passed_through(&succeeded, false, false),
            "a finished remediation is written"
        );
        let mut replacing = draining(20);
        replacing.phase = Phase::Replacing;
        assert!(
            !passed_through(&replacing, false, false),
            "Replacing is on record before the replacement is triggered"
        );
    }

    #[test]
    fn a_held_status_follows_the_records_version_across_our_own_write() {
        let held = HeldProgress::default();
        let mut record = record("10");
        held.hold("r", Some("10".into()), Some(draining(2)), draining(5), Vec::new());
        held.rebase("r", Some("10"), Some("11".into()));
        record.metadata.resource_version = Some("11".into());
        assert_eq!(held.resume(&record).0.status, Some(draining(5)));
        held.rebase("r", Some("10"), Some("12".into()));
        record.metadata.resource_version = Some("12".into());
        assert_eq!(
            held.resume(&record).0.status,
            Some(draining(2)),
            "a rebase from a version the held status is not over moves nothing"
        );
    }

    #[test]
    fn a_chain_of_phase_changes_is_told_in_one_event() {
        let held = vec![
            Note::new(
                reasons::PHASE_CHANGED,
                kube::runtime::events::EventType::Normal,
                "Pending → Cordoned: a",
            ),
            Note::new(
                reasons::PHASE_CHANGED,
                kube::runtime::events::EventType::Normal,
                "Cordoned → Draining: b",
            ),
        ];
        let new = vec![Note::new(
            reasons::PHASE_CHANGED,
            kube::runtime::events::EventType::Normal,
            "Draining → Verifying: c",
        )];
        let folded = fold(held, new);
        assert_eq!(folded.len(), 1);
        assert_eq!(
            folded[0].text,
            "Pending → Cordoned: a; Cordoned → Draining: b; Draining → Verifying: c"
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

    /// Record `r` at `version`, whose server status is `draining(2)`.
    fn record(version: &str) -> GpuRemediation {
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
        record.metadata.resource_version = Some(version.into());
        record.status = Some(draining(2));
        record
    }

    #[test]
    fn a_held_status_lasts_only_as_long_as_the_version_it_builds_on() {
        let held = HeldProgress::default();
        let mut record = record("10");
        let _ = held.wrote("r", at(0));
        held.hold("r", Some("10".into()), Some(draining(2)), draining(5), Vec::new());
        let (resumed, written) = held.resume(&record);
        assert_eq!(resumed.status, Some(draining(5)));
        assert_eq!(written, Some(draining(2)));
        let expected = draining(5);
        assert!(
            held.with_status(&record, |s| s == Some(&expected)),
            "what wakes the drain (its blockers) is judged on the held status"
        );
        assert_eq!(held.phase(&record), Phase::Draining);
        record.metadata.resource_version = Some("11".into());
        let (resumed, written) = held.resume(&record);
        assert_eq!(
            resumed.status,
            Some(draining(2)),
            "someone wrote since: theirs stands"
        );
        assert_eq!(written, Some(draining(2)));
    }

    fn pending() -> GpuRemediationStatus {
        GpuRemediationStatus::default()
    }

    fn cordoned_at(secs: i64) -> GpuRemediationStatus {
        let mut status = pending();
        lifecycle::status::enter(&mut status, Phase::Cordoned, "cordoned", at(secs));
        status
    }

    #[test]
    fn the_cordon_and_the_drains_first_progress_are_held_at_most_one_interval() {
        assert_eq!(
            verdict(Some(&pending()), None, &cordoned_at(0), at(0)),
            Verdict::HoldUntil(at(5))
        );
        assert_eq!(
            verdict(None, None, &cordoned_at(0), at(1)),
            Verdict::HoldUntil(at(5)),
            "a record never written by this replica holds its cordon too"
        );
        assert_eq!(
            verdict(Some(&pending()), None, &cordoned_at(0), at(5)),
            Verdict::Write,
            "a drain that has not written within the interval: the cordon is written"
        );
        let mut draining = cordoned_at(0);
        lifecycle::status::enter(&mut draining, Phase::Draining, "evicting", at(1));
        assert_eq!(
            verdict(Some(&pending()), None, &draining, at(1)),
            Verdict::HoldUntil(at(5)),
            "the drain's progress is held with the cordon"
        );
        assert_eq!(
            verdict(Some(&pending()), None, &draining, at(5)),
            Verdict::Write,
            "once the interval is over, one write carries the cordon and the drain"
        );
        let mut verifying = draining.clone();
        lifecycle::status::enter(&mut verifying, Phase::Verifying, "drained", at(3));
        assert_eq!(
            verdict(Some(&pending()), None, &verifying, at(3)),
            Verdict::Write,
            "the next phase change is written at once, carrying both"
        );
        assert_eq!(
            verdict(Some(&cordoned_at(0)), Some(at(0)), &cordoned_at(0), at(1)),
            Verdict::Unchanged
        );
    }

    #[test]
    fn phase_changes_held_together_are_told_in_one_event_and_other_events_stay_apart() {
        use kube::runtime::events::EventType;
        let cordoned = Note::new(
            reasons::PHASE_CHANGED,
            EventType::Normal,
            "Pending → Cordoned: cordoned",
        );
        let refused = Note::new("Refused", EventType::Warning, "evicting refused");
        let draining = Note::new(
            reasons::PHASE_CHANGED,
            EventType::Normal,
            "Cordoned → Draining: evicting",
        );
        let folded = fold(vec![cordoned], vec![refused.clone(), draining]);
        assert_eq!(folded.len(), 2, "{folded:?}");
        assert_eq!(
            folded[0].text,
            "Pending → Cordoned: cordoned; Cordoned → Draining: evicting"
        );
        assert!(!folded[0].warning);
        assert_eq!(folded[1], refused);
        assert_eq!(fold(Vec::new(), vec![refused.clone()]), vec![refused]);
    }

    #[test]
    fn held_events_go_with_the_write_that_carries_them_and_die_with_their_version() {
        use kube::runtime::events::EventType;
        let held = HeldProgress::default();
        let note = Note::new(reasons::PHASE_CHANGED, EventType::Normal, "Pending → Cordoned");
        held.hold("r", Some("1".into()), None, cordoned_at(0), vec![note.clone()]);
        assert_eq!(held.written_at("r"), None);
        assert_eq!(held.wrote("r", at(1)), vec![note.clone()]);
        assert_eq!(held.wrote("r", at(2)), Vec::new(), "published once");
        held.hold("r", Some("1".into()), None, cordoned_at(0), vec![note.clone()]);
        held.hold("r", Some("2".into()), None, cordoned_at(0), Vec::new());
        assert_eq!(
            held.release("r"),
            Vec::new(),
            "a newer version drops what the older one held"
        );
    }
}

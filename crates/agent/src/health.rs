//! The agent's verdict over time: fatal signals latch until the node is recycled or a person
//! clears them, a detector fault reads `Unknown` (never `False`), and a warning becomes an Event
//! only after it repeats enough within a window. Pure: time is passed in.

use std::{
    collections::{BTreeMap, VecDeque},
    time::Duration,
};

use gpu_remediation_api::constants::gpu_reasons;
use jiff::Timestamp;

use crate::assess::{Signal, SignalKind};

/// The three values of a Kubernetes condition status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConditionStatus {
    /// Every expected GPU present and healthy.
    True,
    /// A fatal fault.
    False,
    /// The detector cannot tell.
    Unknown,
}

impl ConditionStatus {
    /// The API spelling.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        }
    }
}

/// The `GpuHealthy` condition the agent wants on its node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredCondition {
    /// `True`, `False` or `Unknown`.
    pub status: ConditionStatus,
    /// `GpusHealthy`, `GpuMissing`, `XID79`, `NvmlUnavailable`, ...
    pub reason: String,
    /// Names the GPU by index, UUID and PCI address.
    pub message: String,
}

/// A fatal fault held until the node is recycled or cleared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Latch {
    /// The reason of the first fatal signal.
    pub reason: String,
    /// Its message.
    pub message: String,
    /// When it was first seen (the condition's `lastTransitionTime`).
    pub since: Timestamp,
    /// The UUIDs of the GPUs the fatal signals named, in order, without repeats.
    pub failed_gpus: Vec<String>,
}

/// A warning that repeated often enough to tell people, as an Event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarningEvent {
    /// The Event reason.
    pub reason: String,
    /// The Event note.
    pub message: String,
}

/// What one observation produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The condition to publish.
    pub condition: DesiredCondition,
    /// Warnings to publish as Events now.
    pub warnings: Vec<WarningEvent>,
}

/// How many times a warning must occur within how long before it becomes an Event (and at most one
/// Event per warning per window).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WarningPolicy {
    /// Occurrences needed.
    pub threshold: usize,
    /// The window they must fall in.
    pub window: Duration,
}

/// The state carried between observations.
#[derive(Debug, Clone)]
pub struct HealthState {
    latch: Option<Latch>,
    policy: WarningPolicy,
    occurrences: BTreeMap<String, VecDeque<Timestamp>>,
    last_published: BTreeMap<String, Timestamp>,
}

impl HealthState {
    /// A fresh state with no latch.
    #[must_use]
    pub fn new(policy: WarningPolicy) -> Self {
        Self {
            latch: None,
            policy,
            occurrences: BTreeMap::new(),
            last_published: BTreeMap::new(),
        }
    }

    /// The current latch, if any.
    #[must_use]
    pub fn latch(&self) -> Option<&Latch> {
        self.latch.as_ref()
    }

    /// Adopts a latch found on the node at start-up, so an agent restart keeps a fault latched.
    pub fn restore(&mut self, latch: Latch) {
        self.latch = Some(latch);
    }

    /// Drops the latch if it began at or before `cleared_at` (the time a person wrote into the
    /// clear annotation). Returns whether it dropped one. A fault seen after that time stays.
    pub fn clear_if_before(&mut self, cleared_at: Timestamp) -> bool {
        if self.latch.as_ref().is_some_and(|latch| latch.since <= cleared_at) {
            self.latch = None;
            return true;
        }
        false
    }

    /// Folds one observation in. `signals` come from a successful read; a failed read (NVML
    /// unavailable, hung) arrives as one `DetectorFault` signal.
    pub fn observe(&mut self, signals: &[Signal], now: Timestamp, healthy_message: &str) -> Verdict {
        if self.latch.is_none()
            && let Some(first) = signals.iter().find(|signal| signal.kind == SignalKind::Fatal)
        {
            let others = signals
                .iter()
                .filter(|signal| signal.kind == SignalKind::Fatal)
                .count()
                - 1;
            let message = if others == 0 {
                first.message.clone()
            } else {
                format!("{} (and {others} more fatal signals)", first.message)
            };
            let mut failed_gpus: Vec<String> = Vec::new();
            for uuid in signals
                .iter()
                .filter(|signal| signal.kind == SignalKind::Fatal)
                .filter_map(|signal| signal.gpu_uuid.clone())
            {
                if !failed_gpus.contains(&uuid) {
                    failed_gpus.push(uuid);
                }
            }
            self.latch = Some(Latch {
                reason: first.reason.clone(),
                message,
                since: now,
                failed_gpus,
            });
        }
        let condition = if let Some(latch) = &self.latch {
            DesiredCondition {
                status: ConditionStatus::False,
                reason: latch.reason.clone(),
                message: latch.message.clone(),
            }
        } else if let Some(fault) = signals
            .iter()
            .find(|signal| signal.kind == SignalKind::DetectorFault)
        {
            DesiredCondition {
                status: ConditionStatus::Unknown,
                reason: fault.reason.clone(),
                message: fault.message.clone(),
            }
        } else {
            DesiredCondition {
                status: ConditionStatus::True,
                reason: gpu_reasons::HEALTHY.to_owned(),
                message: healthy_message.to_owned(),
            }
        };
        let warnings = self.count_warnings(signals, now);
        Verdict { condition, warnings }
    }

    fn count_warnings(&mut self, signals: &[Signal], now: Timestamp) -> Vec<WarningEvent> {
        let window = jiff::SignedDuration::try_from(self.policy.window).unwrap_or(jiff::SignedDuration::MAX);
        let horizon = now.checked_sub(window).unwrap_or(Timestamp::MIN);
        let mut events = Vec::new();
        for signal in signals.iter().filter(|signal| signal.kind == SignalKind::Warning) {
            let seen = self.occurrences.entry(signal.key.clone()).or_default();
            seen.push_back(now);
            while seen.front().is_some_and(|at| *at <= horizon) {
                seen.pop_front();
            }
            let recently_published = self
                .last_published
                .get(&signal.key)
                .is_some_and(|at| *at > horizon);
            if seen.len() >= self.policy.threshold && !recently_published {
                events.push(WarningEvent {
                    reason: signal.reason.clone(),
                    message: format!(
                        "{} ({} times within {}s)",
                        signal.message,
                        seen.len(),
                        self.policy.window.as_secs()
                    ),
                });
                self.last_published.insert(signal.key.clone(), now);
            }
        }
        // Forget warnings that stopped, so the map does not grow with every GPU ever warned about.
        self.occurrences
            .retain(|_, seen| seen.back().is_some_and(|at| *at > horizon));
        self.last_published.retain(|_, at| *at > horizon);
        events
    }
}

/// The signal for a read that failed outright (NVML missing, failing or hung).
#[must_use]
pub fn detector_fault(message: String) -> Signal {
    Signal {
        kind: SignalKind::DetectorFault,
        reason: gpu_reasons::NVML_UNAVAILABLE.to_owned(),
        message,
        key: format!("{}/node", gpu_reasons::NVML_UNAVAILABLE),
        gpu_uuid: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    fn fatal(reason: &str) -> Signal {
        Signal {
            kind: SignalKind::Fatal,
            reason: reason.to_owned(),
            message: format!("{reason} on GPU 0"),
            key: format!("{reason}/GPU-0"),
            gpu_uuid: Some("GPU-0".to_owned()),
        }
    }

    fn warning(reason: &str) -> Signal {
        Signal {
            kind: SignalKind::Warning,
            reason: reason.to_owned(),
            message: format!("{reason} on GPU 0"),
            key: format!("{reason}/GPU-0"),
            gpu_uuid: Some("GPU-0".to_owned()),
        }
    }

    fn state() -> HealthState {
        HealthState::new(WarningPolicy {
            threshold: 3,
            window: Duration::from_secs(60),
        })
    }

    #[test]
    fn no_signals_read_healthy() {
        let verdict = state().observe(&[], at(0), "2 of 2 GPUs healthy");
        assert_eq!(verdict.condition.status, ConditionStatus::True);
        assert_eq!(verdict.condition.reason, gpu_reasons::HEALTHY);
        assert_eq!(verdict.condition.message, "2 of 2 GPUs healthy");
    }

    #[test]
    fn a_fatal_signal_stays_latched_after_it_stops() {
        let mut state = state();
        let first = state.observe(&[fatal("XID79")], at(0), "ok");
        assert_eq!(first.condition.status, ConditionStatus::False);
        assert_eq!(first.condition.reason, "XID79");
        let later = state.observe(&[], at(30), "ok");
        assert_eq!(later.condition.status, ConditionStatus::False);
        assert_eq!(later.condition.reason, "XID79");
        assert_eq!(state.latch().unwrap().since, at(0));
    }

    #[test]
    fn the_first_fatal_cause_names_the_condition_and_later_ones_do_not_replace_it() {
        let mut state = state();
        state.observe(&[fatal("GpuMissing"), fatal("XID79")], at(0), "ok");
        let later = state.observe(&[fatal("DoubleBitEcc")], at(5), "ok");
        assert_eq!(later.condition.reason, "GpuMissing");
        assert!(
            later.condition.message.contains("and 1 more"),
            "{}",
            later.condition.message
        );
    }

    #[test]
    fn a_detector_fault_reads_unknown_never_false() {
        let verdict = state().observe(&[detector_fault("NVML init failed".to_owned())], at(0), "ok");
        assert_eq!(verdict.condition.status, ConditionStatus::Unknown);
        assert_eq!(verdict.condition.reason, gpu_reasons::NVML_UNAVAILABLE);
        assert_eq!(verdict.condition.message, "NVML init failed");
    }

    #[test]
    fn a_detector_fault_does_not_hide_a_latched_fault() {
        let mut state = state();
        state.observe(&[fatal("XID48")], at(0), "ok");
        let verdict = state.observe(&[detector_fault("hung".to_owned())], at(1), "ok");
        assert_eq!(verdict.condition.status, ConditionStatus::False);
        assert_eq!(verdict.condition.reason, "XID48");
    }

    #[test]
    fn clearing_with_a_time_after_the_fault_releases_the_latch() {
        let mut state = state();
        state.observe(&[fatal("XID79")], at(0), "ok");
        assert!(state.clear_if_before(at(10)));
        let verdict = state.observe(&[], at(11), "ok");
        assert_eq!(verdict.condition.status, ConditionStatus::True);
    }

    #[test]
    fn a_latch_names_the_gpus_of_every_fatal_signal_once() {
        let mut state = state();
        let other = Signal {
            gpu_uuid: Some("GPU-1".to_owned()),
            ..fatal("XID79")
        };
        let unnamed = Signal {
            gpu_uuid: None,
            ..fatal("GpuMissing")
        };
        state.observe(
            &[
                fatal("XID79"),
                other,
                fatal("XID48"),
                unnamed,
                warning("PcieReplays"),
            ],
            at(0),
            "ok",
        );
        assert_eq!(state.latch().unwrap().failed_gpus, ["GPU-0", "GPU-1"]);
    }

    #[test]
    fn a_clear_written_before_the_fault_does_not_release_it() {
        let mut state = state();
        state.observe(&[fatal("XID79")], at(20), "ok");
        assert!(!state.clear_if_before(at(10)));
        assert_eq!(
            state.observe(&[], at(21), "ok").condition.status,
            ConditionStatus::False
        );
    }

    #[test]
    fn a_fault_still_present_after_a_clear_latches_again_with_a_new_time() {
        let mut state = state();
        state.observe(&[fatal("GpuMissing")], at(0), "ok");
        state.clear_if_before(at(10));
        let verdict = state.observe(&[fatal("GpuMissing")], at(12), "ok");
        assert_eq!(verdict.condition.status, ConditionStatus::False);
        assert_eq!(state.latch().unwrap().since, at(12));
    }

    #[test]
    fn a_restored_latch_holds_the_condition_false() {
        let mut state = state();
        state.restore(Latch {
            failed_gpus: Vec::new(),
            reason: "XID79".to_owned(),
            message: "GPU 0 fell".to_owned(),
            since: at(-100),
        });
        let verdict = state.observe(&[], at(0), "ok");
        assert_eq!(verdict.condition.status, ConditionStatus::False);
        assert_eq!(verdict.condition.message, "GPU 0 fell");
    }

    #[test]
    fn a_warning_becomes_an_event_only_at_the_threshold() {
        let mut state = state();
        assert!(
            state
                .observe(&[warning("PcieReplays")], at(0), "ok")
                .warnings
                .is_empty()
        );
        assert!(
            state
                .observe(&[warning("PcieReplays")], at(10), "ok")
                .warnings
                .is_empty()
        );
        let third = state.observe(&[warning("PcieReplays")], at(20), "ok");
        assert_eq!(third.warnings.len(), 1);
        assert_eq!(third.warnings[0].reason, "PcieReplays");
        assert!(
            third.warnings[0].message.contains("3 times within 60s"),
            "{}",
            third.warnings[0].message
        );
        assert_eq!(
            third.condition.status,
            ConditionStatus::True,
            "warnings never change the condition"
        );
    }

    #[test]
    fn warnings_spread_wider_than_the_window_never_become_an_event() {
        let mut state = state();
        for minute in 0..5 {
            let verdict = state.observe(&[warning("PcieReplays")], at(minute * 40), "ok");
            assert!(verdict.warnings.is_empty(), "minute {minute}");
        }
    }

    #[test]
    fn a_repeating_warning_is_published_once_per_window() {
        let mut state = state();
        let published: usize = (0..12)
            .map(|tick| {
                state
                    .observe(&[warning("GpuTemperatureHigh")], at(tick * 10), "ok")
                    .warnings
                    .len()
            })
            .sum();
        // Threshold reached at 20s (published), next publication allowed after 80s.
        assert_eq!(published, 2);
    }

    #[test]
    fn warnings_on_different_gpus_count_separately() {
        let mut state = state();
        let other = Signal {
            key: "PcieReplays/GPU-1".to_owned(),
            ..warning("PcieReplays")
        };
        state.observe(&[warning("PcieReplays")], at(0), "ok");
        state.observe(std::slice::from_ref(&other), at(1), "ok");
        let verdict = state.observe(&[warning("PcieReplays")], at(2), "ok");
        assert!(verdict.warnings.is_empty());
    }
}

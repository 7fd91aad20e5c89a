//! What earlier reads showed of the NVLink links and fabrics, so a reading can be judged against
//! time: each link's error counters over the last [`MAX_WINDOW`] (thinned to one sample per
//! [`SPACING`]), the links seen up, and since when each fabric has been waiting to register.
//!
//! A counter that went down (the driver reset it, or it wrapped) starts the link's history again:
//! the drop is not growth, and what came before is no base for a rate.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    time::{Duration, Instant},
};

use crate::{
    catalog::nvlink::MAX_WINDOW,
    readings::{
        Snapshot,
        nvlink::{Counter, NvLinkErrors},
    },
};

/// Samples closer together than this replace one another, bounding the history per link.
pub const SPACING: Duration = Duration::from_secs(10);

/// One read of a link's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// When it was read.
    pub at: Instant,
    /// What was read.
    pub errors: NvLinkErrors,
}

/// The memory of NVLink and fabric reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkHistory {
    samples: BTreeMap<(String, u32), VecDeque<Sample>>,
    seen_up: BTreeSet<(String, u32)>,
    fabric_waiting_since: BTreeMap<String, Instant>,
}

/// How much `counter` grew on a link within `window` before `now`, reading `current`: `None`
/// when there is nothing to compare with (no earlier sample of it, or it went down since the last
/// one: a reset or wrap).
#[must_use]
pub fn growth(
    history: &VecDeque<Sample>,
    counter: Counter,
    current: u64,
    now: Instant,
    window: Duration,
) -> Option<u64> {
    let latest = history
        .iter()
        .rev()
        .find_map(|sample| sample.errors.get(counter))?;
    if current < latest {
        return None;
    }
    let base = history
        .iter()
        .filter(|sample| now.saturating_duration_since(sample.at) <= window)
        .find_map(|sample| sample.errors.get(counter))?;
    Some(current - base)
}

impl LinkHistory {
    /// The samples of `link` on the GPU `uuid`, oldest first.
    #[must_use]
    pub fn samples(&self, uuid: &str, link: u32) -> Option<&VecDeque<Sample>> {
        self.samples.get(&(uuid.to_owned(), link))
    }

    /// Whether `link` of `uuid` was ever read up.
    #[must_use]
    pub fn was_up(&self, uuid: &str, link: u32) -> bool {
        self.seen_up.contains(&(uuid.to_owned(), link))
    }

    /// Since when the fabric of `uuid` has been waiting to register, if it is.
    #[must_use]
    pub fn fabric_waiting_since(&self, uuid: &str) -> Option<Instant> {
        self.fabric_waiting_since.get(uuid).copied()
    }

    /// Records a snapshot. Without its read time only the links seen up are recorded.
    pub fn remember(&mut self, snapshot: &Snapshot) {
        for gpu in &snapshot.gpus {
            for link in gpu.nvlinks.iter().filter(|link| link.active) {
                self.seen_up.insert((gpu.uuid.clone(), link.link));
            }
            let Some(at) = snapshot.taken_at else { continue };
            for link in &gpu.nvlinks {
                let history = self.samples.entry((gpu.uuid.clone(), link.link)).or_default();
                let went_down = Counter::ALL.iter().any(|counter| {
                    let latest = history.iter().rev().find_map(|sample| sample.errors.get(*counter));
                    matches!((link.errors.get(*counter), latest), (Some(current), Some(latest)) if current < latest)
                });
                if went_down {
                    history.clear();
                }
                // Thin: the newest sample replaces one taken less than SPACING after its
                // predecessor, so the oldest samples (the bases of rates) stay.
                if history.len() >= 2
                    && history[history.len() - 1]
                        .at
                        .saturating_duration_since(history[history.len() - 2].at)
                        < SPACING
                {
                    history.pop_back();
                }
                history.push_back(Sample {
                    at,
                    errors: link.errors,
                });
                while history
                    .front()
                    .is_some_and(|oldest| at.saturating_duration_since(oldest.at) > MAX_WINDOW)
                {
                    history.pop_front();
                }
            }
            match gpu.fabric {
                Some(fabric) if !fabric.is_ready() => {
                    self.fabric_waiting_since.entry(gpu.uuid.clone()).or_insert(at);
                }
                _ => {
                    self.fabric_waiting_since.remove(&gpu.uuid);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(replay: Option<u64>) -> NvLinkErrors {
        NvLinkErrors {
            replay,
            ..NvLinkErrors::default()
        }
    }

    fn history(start: Instant, values: &[(u64, Option<u64>)]) -> VecDeque<Sample> {
        values
            .iter()
            .map(|(seconds, replay)| Sample {
                at: start + Duration::from_secs(*seconds),
                errors: errors(*replay),
            })
            .collect()
    }

    #[test]
    fn growth_is_measured_from_the_oldest_sample_inside_the_window() {
        let start = Instant::now();
        let samples = history(start, &[(0, Some(0)), (100, Some(40)), (200, Some(50))]);
        let now = start + Duration::from_secs(250);
        assert_eq!(
            growth(&samples, Counter::Replay, 90, now, Duration::from_secs(300)),
            Some(90)
        );
        assert_eq!(
            growth(&samples, Counter::Replay, 90, now, Duration::from_secs(160)),
            Some(50),
            "the sample at 0 s is outside a 160 s window"
        );
    }

    #[test]
    fn a_counter_that_went_down_is_a_reset_not_growth() {
        let start = Instant::now();
        let samples = history(start, &[(0, Some(1_000)), (10, Some(1_000))]);
        let now = start + Duration::from_secs(20);
        assert_eq!(
            growth(&samples, Counter::Replay, 3, now, Duration::from_secs(300)),
            None
        );
    }

    #[test]
    fn a_missing_sample_is_skipped_and_no_sample_at_all_is_no_growth() {
        let start = Instant::now();
        let samples = history(start, &[(0, Some(5)), (10, None)]);
        let now = start + Duration::from_secs(20);
        assert_eq!(
            growth(&samples, Counter::Replay, 8, now, Duration::from_secs(300)),
            Some(3)
        );
        let unread = history(start, &[(0, None), (10, None)]);
        assert_eq!(
            growth(&unread, Counter::Replay, 8, now, Duration::from_secs(300)),
            None
        );
        assert_eq!(
            growth(
                &VecDeque::new(),
                Counter::Replay,
                8,
                now,
                Duration::from_secs(300)
            ),
            None
        );
    }

    #[test]
    fn a_reset_starts_the_history_again_and_samples_are_thinned() {
        use crate::readings::{GpuReading, nvlink::NvLinkReading};
        let start = Instant::now();
        let snapshot = |seconds: u64, replay: u64| Snapshot {
            gpus: vec![GpuReading {
                uuid: "GPU-a".to_owned(),
                nvlinks: vec![NvLinkReading {
                    link: 3,
                    active: true,
                    errors: errors(Some(replay)),
                }],
                ..GpuReading::default()
            }],
            taken_at: Some(start + Duration::from_secs(seconds)),
            ..Snapshot::default()
        };
        let mut memory = LinkHistory::default();
        for (seconds, replay) in [(0, 10), (1, 11), (2, 12), (3, 13)] {
            memory.remember(&snapshot(seconds, replay));
        }
        let kept: Vec<Option<u64>> = memory
            .samples("GPU-a", 3)
            .unwrap()
            .iter()
            .map(|sample| sample.errors.replay)
            .collect();
        assert_eq!(
            kept,
            vec![Some(10), Some(13)],
            "the first sample stays as the base"
        );
        memory.remember(&snapshot(20, 2));
        assert_eq!(
            memory.samples("GPU-a", 3).unwrap().len(),
            1,
            "reset: history restarts"
        );
        assert!(memory.was_up("GPU-a", 3));
    }
}

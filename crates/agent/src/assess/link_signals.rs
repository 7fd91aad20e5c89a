//! The faults NVLink and fabric readings mean:
//! - `NvlinkDown`: a link reads down on a node that uses NVLink (some link of some GPU is up), or a
//!   link seen up before reads down. A GPU without NVLink lists no links, so it never fires there.
//! - `NvlinkErrors`: a link's error counter grew by more than the catalog's limit within its
//!   window (a rate; the absolute count says nothing after months of uptime). A reset or wrapped
//!   counter, or a counter not read this time, decides nothing.
//! - `FabricNotReady`: the fabric has not registered within the grace since the agent first saw
//!   the GPU waiting, or registration completed with a failure.
//!
//! Without a read time (a recorded snapshot), nothing time-based is decided.

use gpu_remediation_api::constants::gpu_reasons;

use super::{
    Signal, SignalKind,
    link_history::{LinkHistory, growth},
};
use crate::{
    catalog::{Severity, nvlink::LinkPolicy},
    readings::{
        GpuReading, Snapshot,
        nvlink::{Counter, FabricState},
    },
};

/// Every NVLink and fabric fault of `snapshot`.
#[must_use]
pub fn link_signals(snapshot: &Snapshot, history: &LinkHistory, policy: &LinkPolicy) -> Vec<Signal> {
    let node_uses_nvlink = snapshot
        .gpus
        .iter()
        .any(|gpu| gpu.nvlinks.iter().any(|link| link.active));
    let mut signals = Vec::new();
    for gpu in &snapshot.gpus {
        signals.extend(link_down(gpu, history, policy, node_uses_nvlink));
        signals.extend(link_errors(gpu, snapshot, history, policy));
        signals.extend(fabric_not_ready(gpu, snapshot, history, policy));
    }
    signals
}

fn link_down(
    gpu: &GpuReading,
    history: &LinkHistory,
    policy: &LinkPolicy,
    node_uses_nvlink: bool,
) -> Option<Signal> {
    let down: Vec<String> = gpu
        .nvlinks
        .iter()
        .filter(|link| !link.active && (node_uses_nvlink || history.was_up(&gpu.uuid, link.link)))
        .map(|link| link.link.to_string())
        .collect();
    if down.is_empty() {
        return None;
    }
    let up = gpu.nvlinks.iter().filter(|link| link.active).count();
    Some(Signal::new(
        SignalKind::Fatal,
        gpu_reasons::NVLINK_DOWN,
        Some(&gpu.uuid),
        format!(
            "{}: NVLink link {} down ({up} of {} links up); recommended action {}",
            gpu.describe(),
            down.join(", "),
            gpu.nvlinks.len(),
            policy.link_down_action
        ),
    ))
}

fn link_errors(
    gpu: &GpuReading,
    snapshot: &Snapshot,
    history: &LinkHistory,
    policy: &LinkPolicy,
) -> Option<Signal> {
    let kind = match policy.errors_severity {
        Severity::Fatal => SignalKind::Fatal,
        Severity::Warning => SignalKind::Warning,
        Severity::Ignore => return None,
    };
    let now = snapshot.taken_at?;
    let mut over = Vec::new();
    for link in &gpu.nvlinks {
        let Some(samples) = history.samples(&gpu.uuid, link.link) else {
            continue;
        };
        for counter in Counter::ALL {
            let limit = policy.max_increase.get(counter);
            if let Some(current) = link.errors.get(counter)
                && let Some(grown) = growth(samples, counter, current, now, policy.window)
                && grown > limit
            {
                over.push(format!(
                    "link {} {} errors +{grown} (limit {limit})",
                    link.link,
                    counter.name()
                ));
            }
        }
    }
    if over.is_empty() {
        return None;
    }
    Some(Signal::new(
        kind,
        gpu_reasons::NVLINK_ERRORS,
        Some(&gpu.uuid),
        format!(
            "{}: NVLink error counters rising within {}s: {}; recommended action {}",
            gpu.describe(),
            policy.window.as_secs(),
            over.join(", "),
            policy.errors_action
        ),
    ))
}

fn fabric_not_ready(
    gpu: &GpuReading,
    snapshot: &Snapshot,
    history: &LinkHistory,
    policy: &LinkPolicy,
) -> Option<Signal> {
    let fabric = gpu.fabric?;
    let what = if fabric.failed() {
        let error = nvml_wrapper::error::nvml_try(fabric.status)
            .err()
            .map_or_else(|| "success".to_owned(), |err| err.to_string());
        format!("NVLink fabric registration failed ({error})")
    } else if fabric.is_ready() {
        return None;
    } else {
        let now = snapshot.taken_at?;
        let since = history.fabric_waiting_since(&gpu.uuid).unwrap_or(now);
        let waited = now.saturating_duration_since(since);
        if waited < policy.fabric_grace {
            return None;
        }
        let state = match fabric.state {
            FabricState::NotStarted => "not started",
            FabricState::InProgress => "in progress",
            FabricState::Completed => "completed",
        };
        format!(
            "NVLink fabric registration {state} for {}s, past the {}s grace",
            waited.as_secs(),
            policy.fabric_grace.as_secs()
        )
    };
    Some(Signal::new(
        SignalKind::Fatal,
        gpu_reasons::FABRIC_NOT_READY,
        Some(&gpu.uuid),
        format!(
            "{}: {what}; recommended action {}",
            gpu.describe(),
            policy.fabric_action
        ),
    ))
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::readings::nvlink::{FabricReading, NvLinkErrors, NvLinkReading};

    fn recorded() -> Snapshot {
        serde_json::from_str(include_str!(
            "../../tests/fixtures/hgx-h100-nvlink-down-fabric-pending.json"
        ))
        .unwrap()
    }

    fn reasons(signals: &[Signal]) -> Vec<(SignalKind, &str, Option<&str>)> {
        signals
            .iter()
            .map(|signal| (signal.kind, signal.reason.as_str(), signal.gpu_uuid.as_deref()))
            .collect()
    }

    /// One GPU with one link whose replay counter reads `replay`, read `seconds` after `start`.
    fn one_link(start: Instant, seconds: u64, replay: Option<u64>) -> Snapshot {
        Snapshot {
            gpus: vec![GpuReading {
                index: 5,
                uuid: "GPU-5".to_owned(),
                pci_bus_id: "00000000:9A:00.0".to_owned(),
                nvlinks: vec![NvLinkReading {
                    link: 7,
                    active: true,
                    errors: NvLinkErrors {
                        replay,
                        ..NvLinkErrors::default()
                    },
                }],
                ..GpuReading::default()
            }],
            taken_at: Some(start + Duration::from_secs(seconds)),
            ..Snapshot::default()
        }
    }

    /// Feeds `reads` (seconds, replay counter) one by one; the signals of each.
    fn replay_run(policy: &LinkPolicy, reads: &[(u64, Option<u64>)]) -> Vec<Vec<Signal>> {
        let start = Instant::now();
        let mut history = LinkHistory::default();
        reads
            .iter()
            .map(|(seconds, replay)| {
                let snapshot = one_link(start, *seconds, *replay);
                let signals = link_signals(&snapshot, &history, policy);
                history.remember(&snapshot);
                signals
            })
            .collect()
    }

    #[test]
    fn a_link_down_on_a_node_using_nvlink_names_the_gpu_and_the_link() {
        let signals = link_signals(&recorded(), &LinkHistory::default(), &LinkPolicy::default());
        assert_eq!(
            reasons(&signals),
            vec![(
                SignalKind::Fatal,
                "NvlinkDown",
                Some("GPU-7d0e2c11-4b5a-4f39-8a61-0c2e9b1f4a01")
            )],
            "no time in a recorded snapshot: the pending fabric and counters decide nothing"
        );
        let message = &signals[0].message;
        assert!(message.starts_with("GPU 1 (UUID GPU-7d0e2c11"), "{message}");
        assert!(
            message.contains("NVLink link 2 down (2 of 3 links up)"),
            "{message}"
        );
        assert!(
            message.contains("recommended action WORKFLOW_NVLINK_ERR"),
            "{message}"
        );
    }

    #[test]
    fn an_idle_link_on_a_node_without_nvlink_in_use_is_no_fault_unless_it_was_up() {
        let mut snapshot = recorded();
        for gpu in &mut snapshot.gpus {
            for link in &mut gpu.nvlinks {
                link.active = false;
            }
        }
        let policy = LinkPolicy::default();
        assert_eq!(link_signals(&snapshot, &LinkHistory::default(), &policy), vec![]);
        let mut history = LinkHistory::default();
        history.remember(&recorded());
        let signals = link_signals(&snapshot, &history, &policy);
        assert_eq!(signals.len(), 2, "every link seen up before is down now");
        assert!(
            signals[0].message.contains("link 0, 1, 2, 3 down"),
            "{}",
            signals[0].message
        );
        assert!(
            signals[1].message.contains("link 0, 1 down"),
            "{}",
            signals[1].message
        );
    }

    #[test]
    fn a_gpu_without_nvlink_or_fabric_gives_nothing() {
        let mut snapshot = recorded();
        for gpu in &mut snapshot.gpus {
            gpu.nvlinks.clear();
            gpu.fabric = None;
        }
        snapshot.taken_at = Some(Instant::now());
        assert_eq!(
            link_signals(&snapshot, &LinkHistory::default(), &LinkPolicy::default()),
            vec![]
        );
    }

    #[test]
    fn counters_rising_faster_than_the_limit_within_the_window_are_a_fault() {
        let policy = LinkPolicy::default();
        let runs = replay_run(
            &policy,
            &[(0, Some(1_000)), (60, Some(1_050)), (120, Some(1_101))],
        );
        assert_eq!(runs[0], vec![], "a first sample is no rate");
        assert_eq!(runs[1], vec![], "+50 within the window is under 100");
        assert_eq!(
            reasons(&runs[2]),
            vec![(SignalKind::Fatal, "NvlinkErrors", Some("GPU-5"))]
        );
        assert!(
            runs[2][0]
                .message
                .contains("link 7 replay errors +101 (limit 100)"),
            "{}",
            runs[2][0].message
        );
    }

    #[test]
    fn the_same_growth_spread_over_more_than_the_window_is_no_fault() {
        let runs = replay_run(
            &LinkPolicy::default(),
            &[(0, Some(0)), (200, Some(60)), (400, Some(120)), (600, Some(180))],
        );
        assert!(runs.iter().all(Vec::is_empty), "{runs:?}");
    }

    #[test]
    fn a_reset_or_wrapped_counter_is_not_a_spike() {
        let runs = replay_run(
            &LinkPolicy::default(),
            &[
                (0, Some(u64::MAX - 5)),
                (10, Some(3)),
                (20, Some(40)),
                (30, Some(90)),
            ],
        );
        assert!(runs.iter().all(Vec::is_empty), "{runs:?}");
    }

    #[test]
    fn a_missing_sample_is_not_a_fault_and_the_rate_resumes_after_it() {
        let runs = replay_run(
            &LinkPolicy::default(),
            &[(0, Some(0)), (10, None), (20, None), (30, Some(150))],
        );
        assert_eq!(runs[1], vec![]);
        assert_eq!(runs[2], vec![]);
        assert_eq!(
            reasons(&runs[3]),
            vec![(SignalKind::Fatal, "NvlinkErrors", Some("GPU-5"))]
        );
    }

    #[test]
    fn link_errors_follow_the_catalog_severity() {
        let mut policy = LinkPolicy {
            errors_severity: Severity::Warning,
            ..LinkPolicy::default()
        };
        let runs = replay_run(&policy, &[(0, Some(0)), (10, Some(500))]);
        assert_eq!(
            reasons(&runs[1]),
            vec![(SignalKind::Warning, "NvlinkErrors", Some("GPU-5"))]
        );
        policy.errors_severity = Severity::Ignore;
        let runs = replay_run(&policy, &[(0, Some(0)), (10, Some(500))]);
        assert_eq!(runs[1], vec![]);
    }

    fn with_fabric(start: Instant, seconds: u64, fabric: FabricReading) -> Snapshot {
        let mut snapshot = one_link(start, seconds, Some(0));
        snapshot.gpus[0].fabric = Some(fabric);
        snapshot
    }

    #[test]
    fn a_fabric_not_registered_past_the_grace_is_fabric_not_ready() {
        let policy = LinkPolicy {
            fabric_grace: Duration::from_secs(60),
            ..LinkPolicy::default()
        };
        let pending = FabricReading {
            state: FabricState::InProgress,
            status: 0,
        };
        let start = Instant::now();
        let mut history = LinkHistory::default();
        let mut signals_at = |seconds, fabric| {
            let snapshot = with_fabric(start, seconds, fabric);
            let signals = link_signals(&snapshot, &history, &policy);
            history.remember(&snapshot);
            signals
        };
        assert_eq!(signals_at(0, pending), vec![]);
        assert_eq!(signals_at(59, pending), vec![]);
        let late = signals_at(60, pending);
        assert_eq!(
            reasons(&late),
            vec![(SignalKind::Fatal, "FabricNotReady", Some("GPU-5"))]
        );
        assert!(
            late[0]
                .message
                .contains("registration in progress for 60s, past the 60s grace")
                && late[0].message.contains("recommended action RESTART_BM"),
            "{}",
            late[0].message
        );
        let ready = FabricReading {
            state: FabricState::Completed,
            status: 0,
        };
        assert_eq!(signals_at(61, ready), vec![]);
        assert_eq!(signals_at(62, pending), vec![], "a new wait starts a new grace");
    }

    #[test]
    fn a_registration_that_completed_with_an_error_is_fabric_not_ready_at_once() {
        let failed = FabricReading {
            state: FabricState::Completed,
            status: 999,
        };
        let snapshot = with_fabric(Instant::now(), 0, failed);
        let signals = link_signals(&snapshot, &LinkHistory::default(), &LinkPolicy::default());
        assert_eq!(
            reasons(&signals),
            vec![(SignalKind::Fatal, "FabricNotReady", Some("GPU-5"))]
        );
        assert!(
            signals[0].message.contains("registration failed"),
            "{}",
            signals[0].message
        );
    }

    #[test]
    fn the_shipped_catalog_states_the_nvlink_thresholds_and_an_override_changes_them() {
        let mut catalog = crate::catalog::XidCatalog::shipped().unwrap();
        assert_eq!(catalog.nvlink, LinkPolicy::default());
        catalog
            .merge_yaml("nvlink:\n  fabricGraceSeconds: 5\n", "override")
            .unwrap();
        assert_eq!(catalog.nvlink.fabric_grace, Duration::from_secs(5));
        assert!(
            catalog
                .merge_yaml("nvlink:\n  windowSeconds: 0\n", "bad")
                .is_err()
        );
    }
}

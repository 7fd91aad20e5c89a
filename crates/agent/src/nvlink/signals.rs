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
    history::{LinkHistory, growth},
    policy::LinkPolicy,
    readings::{Counter, FabricState},
};
use crate::{
    assess::{Signal, SignalKind},
    catalog::Severity,
    readings::{GpuReading, Snapshot},
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

fn link_down(gpu: &GpuReading, history: &LinkHistory, policy: &LinkPolicy, node_uses_nvlink: bool) -> Option<Signal> {
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

fn link_errors(gpu: &GpuReading, snapshot: &Snapshot, history: &LinkHistory, policy: &LinkPolicy) -> Option<Signal> {
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

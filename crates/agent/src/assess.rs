//! Turns one snapshot into signals: which readings mean a broken GPU (fatal), which are worth a
//! warning, and which mean the detector itself cannot tell. Pure: the only state it sees is the
//! memory of what earlier snapshots showed, passed in.

use std::collections::BTreeMap;

use gpu_remediation_api::constants::gpu_reasons;

pub mod link_history;
pub mod link_signals;

use crate::{
    catalog::{Severity, XidCatalog},
    readings::{GpuReading, Snapshot, mig},
};

/// Warning reason: the GPU reached its hardware slowdown temperature.
pub const REASON_TEMPERATURE: &str = "GpuTemperatureHigh";
/// Warning reason: the PCI Express link trained at fewer lanes than the GPU supports.
pub const REASON_PCIE_DOWNGRADED: &str = "PcieLinkDowngraded";
/// Warning reason: the PCI Express replay counter grew (link errors the link layer retried).
pub const REASON_PCIE_REPLAYS: &str = "PcieReplays";

/// How serious a signal is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SignalKind {
    /// The GPU is broken: `GpuHealthy=False`, latched.
    Fatal,
    /// The detector cannot read the GPUs: `GpuHealthy=Unknown`, never `False`.
    DetectorFault,
    /// Worth an Event once it repeats.
    Warning,
}

/// One finding from one snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signal {
    /// How serious it is.
    pub kind: SignalKind,
    /// The condition or Event reason: `GpuMissing`, `XID79`, `PcieReplays`, ...
    pub reason: String,
    /// What happened, naming the GPU by index, UUID and PCI address.
    pub message: String,
    /// What repeats of the same warning share (reason and GPU), for counting occurrences.
    pub key: String,
    /// The UUID of the GPU it is about, when it names one.
    pub gpu_uuid: Option<String>,
}

impl Signal {
    pub(crate) fn new(kind: SignalKind, reason: &str, gpu: Option<&str>, message: String) -> Self {
        let key = format!("{reason}/{}", gpu.unwrap_or("node"));
        Self {
            kind,
            reason: reason.to_owned(),
            message,
            key,
            gpu_uuid: gpu.map(str::to_owned),
        }
    }
}

/// What earlier snapshots showed: every GPU ever seen (to name one that vanished) and the last
/// PCI Express replay counters (to see them grow).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Memory {
    known: BTreeMap<String, GpuReading>,
    replay_counters: BTreeMap<String, u32>,
    nvlink: link_history::LinkHistory,
}

impl Memory {
    /// The last reading of the GPU with `uuid`, present or since vanished.
    #[must_use]
    pub fn known(&self, uuid: &str) -> Option<&GpuReading> {
        self.known.get(uuid)
    }

    /// The MIG device with `uuid` of a GPU last read, with that GPU.
    #[must_use]
    pub fn known_mig(&self, uuid: &str) -> Option<(&GpuReading, &mig::MigReading)> {
        mig::parent_of(self.known.values(), uuid)
    }

    /// Records a snapshot that was read successfully.
    pub fn remember(&mut self, snapshot: &Snapshot) {
        for gpu in &snapshot.gpus {
            self.known.insert(gpu.uuid.clone(), gpu.clone());
            if let Some(pcie) = gpu.pcie {
                self.replay_counters.insert(gpu.uuid.clone(), pcie.replay_counter);
            }
        }
        self.nvlink.remember(snapshot);
    }
}

/// Everything one snapshot means. `expected` is the GPU count the node should have, when known.
#[must_use]
pub fn assess(
    snapshot: &Snapshot,
    memory: &Memory,
    expected: Option<u32>,
    catalog: &XidCatalog,
) -> Vec<Signal> {
    let mut signals = missing_gpus(snapshot, memory, expected);
    signals.extend(xid_signals(snapshot, memory, catalog));
    for gpu in &snapshot.gpus {
        signals.extend(memory_signals(gpu));
    }
    for gpu in &snapshot.gpus {
        signals.extend(warning_signals(gpu, memory));
    }
    signals.extend(link_signals::link_signals(
        snapshot,
        &memory.nvlink,
        &catalog.nvlink,
    ));
    if !snapshot.failed_calls.is_empty() {
        signals.push(Signal::new(
            SignalKind::DetectorFault,
            gpu_reasons::NVML_UNAVAILABLE,
            None,
            format!("NVML calls failed: {}", snapshot.failed_calls.join("; ")),
        ));
    }
    // Fatal first, in the order above: the first fatal signal names the condition.
    signals.sort_by_key(|signal| signal.kind);
    signals
}

/// The fallen-off-the-bus case, which may show no XID: a device answering `GPU_IS_LOST`, fewer
/// devices than expected, or a GPU seen before that is gone.
fn missing_gpus(snapshot: &Snapshot, memory: &Memory, expected: Option<u32>) -> Vec<Signal> {
    let mut signals = Vec::new();
    for index in &snapshot.lost_indices {
        let known = memory.known.values().find(|gpu| gpu.index == *index);
        let name = known.map_or_else(|| format!("GPU {index}"), GpuReading::describe);
        signals.push(Signal::new(
            SignalKind::Fatal,
            gpu_reasons::GPU_MISSING,
            known.map(|gpu| gpu.uuid.as_str()),
            format!("{name} is lost to NVML (GPU_IS_LOST: fallen off the bus)"),
        ));
    }
    let vanished: Vec<&GpuReading> = memory
        .known
        .values()
        .filter(|known| !snapshot.gpus.iter().any(|gpu| gpu.uuid == known.uuid))
        .filter(|known| !snapshot.lost_indices.contains(&known.index))
        .filter(|known| !snapshot.unreadable_indices.contains(&known.index))
        .collect();
    for gone in &vanished {
        signals.push(Signal::new(
            SignalKind::Fatal,
            gpu_reasons::GPU_MISSING,
            Some(&gone.uuid),
            format!("{} is no longer visible to NVML", gone.describe()),
        ));
    }
    // A device NVML could not open is not known to be missing: that is the detector's fault.
    let present = snapshot.gpus.len() + snapshot.unreadable_indices.len();
    let present = u32::try_from(present).unwrap_or(u32::MAX);
    if let Some(expected) = expected
        && present < expected
        && signals.is_empty()
    {
        let visible: Vec<String> = snapshot.gpus.iter().map(GpuReading::describe).collect();
        signals.push(Signal::new(
            SignalKind::Fatal,
            gpu_reasons::GPU_MISSING,
            None,
            format!(
                "{present} of {expected} expected GPUs visible (driver counts {}); visible: {}",
                snapshot.device_count,
                if visible.is_empty() {
                    "none".to_owned()
                } else {
                    visible.join(", ")
                }
            ),
        ));
    }
    signals
}

/// The signals of a snapshot's XID events, through the catalog (also for XIDs other paths report).
pub fn xid_signals<'a>(
    snapshot: &'a Snapshot,
    memory: &'a Memory,
    catalog: &'a XidCatalog,
) -> impl Iterator<Item = Signal> + 'a {
    snapshot.xid_events.iter().filter_map(move |event| {
        let entry = catalog.classify(event.xid);
        let kind = match entry.severity {
            Severity::Fatal => SignalKind::Fatal,
            Severity::Warning => SignalKind::Warning,
            Severity::Ignore => return None,
        };
        let gpu = event.gpu_uuid.as_deref();
        let reading = gpu.and_then(|uuid| {
            snapshot
                .gpus
                .iter()
                .find(|g| g.uuid == uuid)
                .or_else(|| memory.known.get(uuid))
        });
        // On a partitioned GPU, an XID naming a GPU instance is that MIG device's fault.
        let instance = reading
            .zip(event.gpu_instance)
            .and_then(|(reading, gi)| mig::instance_of(reading, gi, event.compute_instance));
        let name = match (reading, instance) {
            (Some(reading), Some(instance)) => format!("{}, {}", reading.describe(), instance.describe()),
            (Some(reading), None) => reading.describe(),
            (None, _) => gpu.map_or_else(|| "an unidentified GPU".to_owned(), |uuid| format!("GPU {uuid}")),
        };
        let gpu = instance.map_or(gpu, |instance| Some(instance.uuid.as_str()));
        let reason = format!("{}{}", gpu_reasons::XID_PREFIX, event.xid);
        let description = if entry.description.is_empty() {
            "not in the XID catalog"
        } else {
            &entry.description
        };
        Some(Signal::new(
            kind,
            &reason,
            gpu,
            format!(
                "{name}: XID {} ({description}); recommended action {}",
                event.xid, entry.action
            ),
        ))
    })
}

/// Uncorrectable memory errors and pending repairs: the GPU needs at least a reset.
fn memory_signals(gpu: &GpuReading) -> Vec<Signal> {
    let mut signals = Vec::new();
    let mut fatal = |reason: &str, what: String| {
        signals.push(Signal::new(
            SignalKind::Fatal,
            reason,
            Some(&gpu.uuid),
            format!("{}: {what}", gpu.describe()),
        ));
    };
    if let Some(count) = gpu.ecc_volatile_uncorrected
        && count > 0
    {
        fatal(
            gpu_reasons::DOUBLE_BIT_ECC,
            format!("{count} volatile double-bit ECC errors"),
        );
    }
    if let Some(remap) = gpu.row_remap {
        if remap.failed {
            fatal(gpu_reasons::ROW_REMAP_FAILURE, "row remapping failed".to_owned());
        } else if remap.pending {
            fatal(
                gpu_reasons::ROW_REMAP_PENDING,
                "row remapping pending, the GPU needs a reset".to_owned(),
            );
        }
    }
    if gpu.retired_pages_pending == Some(true) {
        fatal(
            gpu_reasons::RETIRED_PAGES_PENDING,
            "retired pages pending, the GPU needs a reset".to_owned(),
        );
    }
    signals
}

/// Thermals and the PCI Express link: degraded, not broken.
fn warning_signals(gpu: &GpuReading, memory: &Memory) -> Vec<Signal> {
    let mut signals = Vec::new();
    let mut warn = |reason: &str, what: String| {
        signals.push(Signal::new(
            SignalKind::Warning,
            reason,
            Some(&gpu.uuid),
            format!("{}: {what}", gpu.describe()),
        ));
    };
    if let (Some(temperature), Some(threshold)) = (gpu.temperature_c, gpu.slowdown_threshold_c)
        && temperature >= threshold
    {
        warn(
            REASON_TEMPERATURE,
            format!("{temperature} °C, at or above its slowdown threshold {threshold} °C"),
        );
    }
    if let Some(pcie) = gpu.pcie {
        // Only the width counts: the link generation drops at idle to save power, by design.
        if pcie.current_width < pcie.max_width {
            warn(
                REASON_PCIE_DOWNGRADED,
                format!(
                    "PCIe link at x{} of x{} (gen {} of {})",
                    pcie.current_width, pcie.max_width, pcie.current_gen, pcie.max_gen
                ),
            );
        }
        if let Some(previous) = memory.replay_counters.get(&gpu.uuid)
            && pcie.replay_counter > *previous
        {
            warn(
                REASON_PCIE_REPLAYS,
                format!(
                    "PCIe replay counter grew by {} to {}",
                    pcie.replay_counter - previous,
                    pcie.replay_counter
                ),
            );
        }
    }
    signals
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorded(json: &str) -> Snapshot {
        serde_json::from_str(json).expect("fixture parses")
    }

    fn healthy_h100() -> Snapshot {
        recorded(include_str!("../tests/fixtures/h100-healthy.json"))
    }

    fn catalog() -> XidCatalog {
        XidCatalog::shipped().unwrap()
    }

    fn after(snapshot: &Snapshot) -> Memory {
        let mut memory = Memory::default();
        memory.remember(snapshot);
        memory
    }

    fn reasons(signals: &[Signal]) -> Vec<(SignalKind, &str)> {
        signals
            .iter()
            .map(|signal| (signal.kind, signal.reason.as_str()))
            .collect()
    }

    #[test]
    fn a_healthy_node_gives_no_signal_even_with_an_idle_link_at_gen_1() {
        assert_eq!(
            assess(&healthy_h100(), &Memory::default(), Some(2), &catalog()),
            vec![]
        );
    }

    #[test]
    fn a_gpu_lost_to_nvml_is_missing_and_named_from_memory() {
        let memory = after(&healthy_h100());
        let snapshot = recorded(include_str!("../tests/fixtures/h100-gpu1-lost.json"));
        let signals = assess(&snapshot, &memory, Some(2), &catalog());
        assert_eq!(
            reasons(&signals),
            vec![(SignalKind::Fatal, "GpuMissing"), (SignalKind::Fatal, "XID79")]
        );
        let message = &signals[0].message;
        assert!(message.contains("GPU 1"), "{message}");
        assert!(
            message.contains("GPU-5a1c3f0e-8d2b-4c4e-9f11-2a7d3b6e0c02"),
            "{message}"
        );
        assert!(message.contains("00000000:2A:00.0"), "{message}");
        assert!(
            signals[1].message.contains("RESTART_BM"),
            "{}",
            signals[1].message
        );
    }

    #[test]
    fn a_gpu_gone_from_the_count_without_any_xid_is_missing() {
        let memory = after(&healthy_h100());
        let snapshot = recorded(include_str!("../tests/fixtures/h100-gpu1-gone-from-count.json"));
        let signals = assess(&snapshot, &memory, Some(2), &catalog());
        assert_eq!(reasons(&signals), vec![(SignalKind::Fatal, "GpuMissing")]);
        assert!(
            signals[0].message.contains("00000000:2A:00.0"),
            "{}",
            signals[0].message
        );
    }

    #[test]
    fn fewer_gpus_than_expected_at_start_up_is_missing_even_with_nothing_remembered() {
        let snapshot = recorded(include_str!("../tests/fixtures/h100-gpu1-gone-from-count.json"));
        let signals = assess(&snapshot, &Memory::default(), Some(2), &catalog());
        assert_eq!(reasons(&signals), vec![(SignalKind::Fatal, "GpuMissing")]);
        assert!(
            signals[0].message.starts_with("1 of 2 expected GPUs visible"),
            "{}",
            signals[0].message
        );
    }

    #[test]
    fn an_expected_count_one_too_high_gives_gpu_missing() {
        let signals = assess(&healthy_h100(), &Memory::default(), Some(3), &catalog());
        assert_eq!(reasons(&signals), vec![(SignalKind::Fatal, "GpuMissing")]);
    }

    #[test]
    fn without_an_expected_count_the_visible_gpus_are_taken_as_they_are() {
        let snapshot = recorded(include_str!("../tests/fixtures/h100-gpu1-gone-from-count.json"));
        assert_eq!(assess(&snapshot, &Memory::default(), None, &catalog()), vec![]);
    }

    #[test]
    fn uncorrectable_memory_errors_and_a_failed_remap_are_fatal() {
        let snapshot = recorded(include_str!("../tests/fixtures/a100-row-remap-failed.json"));
        let signals = assess(&snapshot, &Memory::default(), Some(1), &catalog());
        assert_eq!(
            reasons(&signals),
            vec![
                (SignalKind::Fatal, "DoubleBitEcc"),
                (SignalKind::Fatal, "RowRemapFailure")
            ]
        );
        assert!(signals[0].message.contains("2 volatile double-bit ECC errors"));
    }

    #[test]
    fn a_pending_row_remap_alone_asks_for_a_reset() {
        let mut snapshot = healthy_h100();
        snapshot.gpus[1].row_remap = Some(crate::readings::RowRemap {
            pending: true,
            failed: false,
        });
        let signals = assess(&snapshot, &Memory::default(), Some(2), &catalog());
        assert_eq!(reasons(&signals), vec![(SignalKind::Fatal, "RowRemapPending")]);
    }

    #[test]
    fn retired_pages_pending_on_a_pre_ampere_gpu_is_fatal() {
        let snapshot = recorded(include_str!("../tests/fixtures/v100-retired-pages-pending.json"));
        let signals = assess(&snapshot, &Memory::default(), Some(1), &catalog());
        assert_eq!(
            reasons(&signals),
            vec![(SignalKind::Fatal, "RetiredPagesPending")]
        );
    }

    #[test]
    fn heat_a_narrow_link_growing_replays_and_application_xids_are_warnings() {
        let snapshot = recorded(include_str!("../tests/fixtures/l40s-degraded-link-hot.json"));
        let mut earlier = snapshot.clone();
        earlier.gpus[0].pcie.as_mut().unwrap().replay_counter = 50;
        let signals = assess(&snapshot, &after(&earlier), Some(1), &catalog());
        let mut found = reasons(&signals);
        found.sort_unstable();
        assert_eq!(
            found,
            vec![
                (SignalKind::Warning, "GpuTemperatureHigh"),
                (SignalKind::Warning, "PcieLinkDowngraded"),
                (SignalKind::Warning, "PcieReplays"),
                (SignalKind::Warning, "XID13"),
            ],
            "XID 45 is ignored"
        );
        let replays = signals
            .iter()
            .find(|signal| signal.reason == "PcieReplays")
            .unwrap();
        assert!(replays.message.contains("grew by 7 to 57"), "{}", replays.message);
    }

    #[test]
    fn a_replay_counter_first_seen_is_not_counted_as_growth() {
        let snapshot = recorded(include_str!("../tests/fixtures/l40s-degraded-link-hot.json"));
        let signals = assess(&snapshot, &Memory::default(), Some(1), &catalog());
        assert!(signals.iter().all(|signal| signal.reason != "PcieReplays"));
    }

    #[test]
    fn nvml_calls_that_fail_are_a_detector_fault_not_a_missing_gpu() {
        let memory = after(&healthy_h100());
        let snapshot = recorded(include_str!("../tests/fixtures/nvml-field-failures.json"));
        let signals = assess(&snapshot, &memory, Some(2), &catalog());
        assert_eq!(
            reasons(&signals),
            vec![(SignalKind::DetectorFault, "NvmlUnavailable")]
        );
        assert!(signals[0].message.contains("nvmlDeviceGetHandleByIndex"));
    }

    #[test]
    fn an_xid_the_catalog_does_not_list_is_a_warning() {
        let mut snapshot = healthy_h100();
        snapshot.xid_events.push(crate::readings::XidEvent {
            xid: 4242,
            gpu_uuid: None,
            ..crate::readings::XidEvent::default()
        });
        let signals = assess(&snapshot, &Memory::default(), Some(2), &catalog());
        assert_eq!(reasons(&signals), vec![(SignalKind::Warning, "XID4242")]);
        assert!(
            signals[0].message.contains("an unidentified GPU"),
            "{}",
            signals[0].message
        );
    }

    #[test]
    fn an_overridden_catalog_changes_the_decision() {
        let mut catalog = catalog();
        catalog
            .merge_yaml(
                "xids:\n  - {xid: 13, severity: fatal, action: RESET_GPU}\n",
                "override",
            )
            .unwrap();
        let mut snapshot = healthy_h100();
        snapshot.xid_events.push(crate::readings::XidEvent {
            xid: 13,
            gpu_uuid: Some("GPU-5a1c3f0e-8d2b-4c4e-9f11-2a7d3b6e0c01".to_owned()),
            ..crate::readings::XidEvent::default()
        });
        let signals = assess(&snapshot, &Memory::default(), Some(2), &catalog);
        assert_eq!(reasons(&signals), vec![(SignalKind::Fatal, "XID13")]);
        assert!(signals[0].message.contains("00000000:18:00.0"));
    }

    #[test]
    fn an_xid_naming_a_gpu_instance_is_its_mig_devices_fault_and_otherwise_the_whole_gpus() {
        let mut snapshot = healthy_h100();
        let parent = snapshot.gpus[0].uuid.clone();
        snapshot.gpus[0].mig = (1..=7)
            .map(|gi| crate::readings::mig::MigReading {
                uuid: format!("MIG-{gi}"),
                gpu_instance: gi,
                compute_instance: 0,
                name: "NVIDIA H100 80GB HBM3 MIG 1g.10gb".to_owned(),
            })
            .collect();
        let xid = |gpu_instance| crate::readings::XidEvent {
            xid: 95,
            gpu_uuid: Some(parent.clone()),
            gpu_instance,
            compute_instance: None,
        };
        snapshot.xid_events = vec![xid(Some(4)), xid(None), xid(Some(9))];
        let signals = assess(&snapshot, &Memory::default(), Some(2), &catalog());
        let gpus: Vec<Option<&str>> = signals.iter().map(|s| s.gpu_uuid.as_deref()).collect();
        assert_eq!(
            gpus,
            [Some("MIG-4"), Some(parent.as_str()), Some(parent.as_str())],
            "instance 4; no instance; an instance the GPU does not have"
        );
        assert!(
            signals[0]
                .message
                .contains("MIG GPU instance 4 (UUID MIG-4, profile 1g.10gb)"),
            "{}",
            signals[0].message
        );
    }
}

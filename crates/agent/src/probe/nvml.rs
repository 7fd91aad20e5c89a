//! The NVML probe: reads the real GPUs through `nvml-wrapper`, which loads `libnvidia-ml.so` at
//! run time. A host without the library or the driver gets [`ReadGpusError::NvmlUnavailable`] on
//! each read (and a retry on the next), never a crash. XID events are collected by their own
//! thread blocked in `nvmlEventSetWait`, and handed over with the next snapshot.
//!
//! `NotSupported` answers are normal (no ECC on this board, no row remapper before Ampere) and
//! read as `None`; `GPU_IS_LOST` marks the device lost; any other failed call is recorded as a
//! detector fault.

use std::{
    ffi::OsString,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use nvml_wrapper::{
    Device, Nvml,
    bitmasks::event::EventTypes,
    enum_wrappers::device::{EccCounter, MemoryError, TemperatureSensor, TemperatureThreshold},
    enums::device::SampleValue,
    error::NvmlError,
    structs::device::FieldId,
    sys_exports::field_id::{NVML_FI_DEV_REMAPPED_FAILURE, NVML_FI_DEV_REMAPPED_PENDING},
};

mod links;
mod mig;

use super::{Probe, ReadGpusError};
use crate::readings::{GpuReading, PcieLink, RowRemap, Snapshot, XidEvent};

/// How long the XID thread blocks in one wait; its heartbeat older than a few of these is a hang.
const XID_WAIT: Duration = Duration::from_secs(1);
/// How long before a silent XID thread counts as hung.
const XID_STALE_AFTER: Duration = Duration::from_secs(30);
/// How long the XID thread waits before registering again after a failure.
const XID_RETRY: Duration = Duration::from_secs(10);

/// What the XID thread shares with reads.
#[derive(Debug)]
struct XidInbox {
    events: Vec<XidEvent>,
    heartbeat: Instant,
    problem: Option<String>,
}

/// Reads GPUs through NVML.
pub struct NvmlProbe {
    library: Option<OsString>,
    nvml: Mutex<Option<&'static Nvml>>,
    inbox: Arc<Mutex<XidInbox>>,
    watch_xids: bool,
}

impl NvmlProbe {
    /// A probe loading NVML from `library` (default: `libnvidia-ml.so` on the loader path).
    /// Nothing is loaded until the first read. `watch_xids: false` skips the event thread (for
    /// one-shot reads).
    #[must_use]
    pub fn new(library: Option<OsString>, watch_xids: bool) -> Self {
        Self {
            library,
            nvml: Mutex::new(None),
            inbox: Arc::new(Mutex::new(XidInbox {
                events: Vec::new(),
                heartbeat: Instant::now(),
                problem: None,
            })),
            watch_xids,
        }
    }

    /// NVML, initialised on first success and kept for the life of the process (NVML is meant to
    /// be initialised once; the XID thread borrows it forever).
    fn nvml(&self) -> Result<&'static Nvml, ReadGpusError> {
        let mut slot = self.nvml.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(nvml) = *slot {
            return Ok(nvml);
        }
        let mut builder = Nvml::builder();
        if let Some(library) = &self.library {
            builder.lib_path(library);
        }
        let nvml: &'static Nvml =
            Box::leak(Box::new(builder.init().map_err(|err| {
                ReadGpusError::NvmlUnavailable(format!("nvmlInit: {err}"))
            })?));
        *slot = Some(nvml);
        if self.watch_xids {
            let inbox = Arc::clone(&self.inbox);
            inbox.lock().unwrap_or_else(PoisonError::into_inner).heartbeat = Instant::now();
            std::thread::Builder::new()
                .name("gpu-xid-events".to_owned())
                .spawn(move || watch_xids(nvml, &inbox))
                .map_err(|err| ReadGpusError::ThreadFailed(err.to_string()))?;
        }
        Ok(nvml)
    }
}

impl Probe for NvmlProbe {
    fn name(&self) -> &'static str {
        "nvml"
    }

    fn read(&self) -> Result<Snapshot, ReadGpusError> {
        let nvml = self.nvml()?;
        let device_count = nvml
            .device_count()
            .map_err(|err| ReadGpusError::NvmlUnavailable(format!("nvmlDeviceGetCount: {err}")))?;
        let mut snapshot = Snapshot {
            device_count,
            taken_at: Some(Instant::now()),
            ..Snapshot::default()
        };
        for index in 0..device_count {
            match read_device(nvml, index, &mut snapshot.failed_calls) {
                DeviceRead::Read(gpu) => snapshot.gpus.push(*gpu),
                DeviceRead::Lost => snapshot.lost_indices.push(index),
                DeviceRead::Unreadable => snapshot.unreadable_indices.push(index),
            }
        }
        if self.watch_xids {
            let mut inbox = self.inbox.lock().unwrap_or_else(PoisonError::into_inner);
            snapshot.xid_events = std::mem::take(&mut inbox.events);
            if let Some(problem) = &inbox.problem {
                snapshot.failed_calls.push(format!("XID events: {problem}"));
            }
            let silent = inbox.heartbeat.elapsed();
            if silent > XID_STALE_AFTER {
                snapshot.failed_calls.push(format!(
                    "XID events: nvmlEventSetWait hung for {}s",
                    silent.as_secs()
                ));
            }
        }
        Ok(snapshot)
    }
}

enum DeviceRead {
    Read(Box<GpuReading>),
    Lost,
    Unreadable,
}

/// A failed call: lost GPU, unsupported feature, or a real failure (recorded).
pub(super) enum CallError {
    Lost,
    Failed,
}

/// Sorts one call's result: `NotSupported` is `None`, `GpuLost` ends the device's read, anything
/// else is recorded as a failed call.
pub(super) fn optional<T>(
    result: Result<T, NvmlError>,
    index: u32,
    call: &str,
    failed: &mut Vec<String>,
) -> Result<Option<T>, CallError> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(NvmlError::NotSupported) => Ok(None),
        Err(NvmlError::GpuLost) => Err(CallError::Lost),
        Err(err) => {
            failed.push(format!("device {index}: {call}: {err}"));
            Err(CallError::Failed)
        }
    }
}

fn read_device(nvml: &Nvml, index: u32, failed: &mut Vec<String>) -> DeviceRead {
    let device = match nvml.device_by_index(index) {
        Ok(device) => device,
        Err(NvmlError::GpuLost) => return DeviceRead::Lost,
        Err(err) => {
            failed.push(format!("device {index}: nvmlDeviceGetHandleByIndex: {err}"));
            return DeviceRead::Unreadable;
        }
    };
    match read_fields(&device, index, failed) {
        Ok(gpu) => DeviceRead::Read(Box::new(gpu)),
        Err(CallError::Lost) => DeviceRead::Lost,
        Err(CallError::Failed) => DeviceRead::Unreadable,
    }
}

/// Identity fields are required (a GPU we cannot name is unreadable); health fields degrade to
/// `None` one by one, each failure recorded.
fn read_fields(device: &Device<'_>, index: u32, failed: &mut Vec<String>) -> Result<GpuReading, CallError> {
    let uuid = optional(device.uuid(), index, "nvmlDeviceGetUUID", failed)?.unwrap_or_default();
    let pci_bus_id = optional(device.pci_info(), index, "nvmlDeviceGetPciInfo", failed)?
        .map(|pci| pci.bus_id)
        .unwrap_or_default();
    let mut gpu = GpuReading {
        index,
        uuid,
        pci_bus_id,
        ..GpuReading::default()
    };
    let keep_unless_lost = |result: Result<(), CallError>| match result {
        Err(CallError::Lost) => Err(CallError::Lost),
        Ok(()) | Err(CallError::Failed) => Ok(()),
    };
    keep_unless_lost(
        optional(device.name(), index, "nvmlDeviceGetName", failed).map(|name| {
            gpu.name = name.unwrap_or_default();
        }),
    )?;
    keep_unless_lost(
        optional(device.serial(), index, "nvmlDeviceGetSerial", failed).map(|serial| gpu.serial = serial),
    )?;
    keep_unless_lost(
        optional(
            device.board_part_number(),
            index,
            "nvmlDeviceGetBoardPartNumber",
            failed,
        )
        .map(|part| gpu.board_part_number = part),
    )?;
    keep_unless_lost(
        optional(device.vbios_version(), index, "nvmlDeviceGetVbiosVersion", failed)
            .map(|vbios| gpu.vbios_version = vbios),
    )?;
    keep_unless_lost(
        optional(
            device.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile),
            index,
            "nvmlDeviceGetTotalEccErrors",
            failed,
        )
        .map(|count| gpu.ecc_volatile_uncorrected = count),
    )?;
    keep_unless_lost(read_row_remap(device, index, failed).map(|remap| gpu.row_remap = remap))?;
    if gpu.row_remap.is_none() {
        // Pages are retired only before Ampere; newer GPUs remap rows instead.
        keep_unless_lost(
            optional(
                device.are_pages_pending_retired(),
                index,
                "nvmlDeviceGetRetiredPagesPendingStatus",
                failed,
            )
            .map(|pending| gpu.retired_pages_pending = pending),
        )?;
    }
    keep_unless_lost(
        optional(
            device.temperature(TemperatureSensor::Gpu),
            index,
            "nvmlDeviceGetTemperature",
            failed,
        )
        .map(|celsius| gpu.temperature_c = celsius),
    )?;
    keep_unless_lost(
        optional(
            device.temperature_threshold(TemperatureThreshold::Slowdown),
            index,
            "nvmlDeviceGetTemperatureThreshold",
            failed,
        )
        .map(|celsius| gpu.slowdown_threshold_c = celsius),
    )?;
    keep_unless_lost(read_pcie(device, index, failed).map(|pcie| gpu.pcie = pcie))?;
    gpu.nvlinks = links::read_nvlinks(device, index, failed)?;
    gpu.fabric = links::read_fabric(device, index, failed)?;
    gpu.mig = mig::read_mig(device, index, failed)?;
    Ok(gpu)
}

fn read_row_remap(
    device: &Device<'_>,
    index: u32,
    failed: &mut Vec<String>,
) -> Result<Option<RowRemap>, CallError> {
    let ids = [
        FieldId(NVML_FI_DEV_REMAPPED_PENDING),
        FieldId(NVML_FI_DEV_REMAPPED_FAILURE),
    ];
    let Some(samples) = optional(
        device.field_values_for(&ids),
        index,
        "nvmlDeviceGetFieldValues",
        failed,
    )?
    else {
        return Ok(None);
    };
    let mut flags = Vec::with_capacity(2);
    for sample in samples {
        let value = optional(sample, index, "nvmlDeviceGetFieldValues", failed)?
            .map(|sample| sample.value)
            .map(|value| optional(value, index, "row remap field value", failed))
            .transpose()?
            .flatten();
        let Some(value) = value else { return Ok(None) };
        flags.push(match value {
            SampleValue::U32(v) => v != 0,
            SampleValue::U64(v) => v != 0,
            SampleValue::I64(v) => v != 0,
            SampleValue::F64(v) => v != 0.0,
        });
    }
    Ok(Some(RowRemap {
        pending: flags[0],
        failed: flags[1],
    }))
}

fn read_pcie(
    device: &Device<'_>,
    index: u32,
    failed: &mut Vec<String>,
) -> Result<Option<PcieLink>, CallError> {
    let current_gen = optional(
        device.current_pcie_link_gen(),
        index,
        "nvmlDeviceGetCurrPcieLinkGeneration",
        failed,
    )?;
    let max_gen = optional(
        device.max_pcie_link_gen(),
        index,
        "nvmlDeviceGetMaxPcieLinkGeneration",
        failed,
    )?;
    let current_width = optional(
        device.current_pcie_link_width(),
        index,
        "nvmlDeviceGetCurrPcieLinkWidth",
        failed,
    )?;
    let max_width = optional(
        device.max_pcie_link_width(),
        index,
        "nvmlDeviceGetMaxPcieLinkWidth",
        failed,
    )?;
    let replay_counter = optional(
        device.pcie_replay_counter(),
        index,
        "nvmlDeviceGetPcieReplayCounter",
        failed,
    )?;
    Ok(match (current_gen, max_gen, current_width, max_width) {
        (Some(current_gen), Some(max_gen), Some(current_width), Some(max_width)) => Some(PcieLink {
            current_gen,
            max_gen,
            current_width,
            max_width,
            replay_counter: replay_counter.unwrap_or(0),
        }),
        _ => None,
    })
}

/// The XID thread: registers every device for critical XID events, then waits for them forever,
/// re-registering after a failure. Its heartbeat tells reads it is alive.
fn watch_xids(nvml: &'static Nvml, inbox: &Mutex<XidInbox>) {
    let report = |problem: Option<String>| {
        let mut inbox = inbox.lock().unwrap_or_else(PoisonError::into_inner);
        inbox.heartbeat = Instant::now();
        inbox.problem = problem;
    };
    loop {
        let set = match register_xid_events(nvml) {
            Ok(set) => set,
            Err(problem) => {
                tracing::warn!(%problem, "cannot watch XID events; retrying");
                report(Some(problem));
                std::thread::sleep(XID_RETRY);
                continue;
            }
        };
        report(None);
        loop {
            let wait_ms = u32::try_from(XID_WAIT.as_millis()).unwrap_or(u32::MAX);
            match nvml_unwrapped::event::wait(&set, nvml, wait_ms) {
                Ok(event) => {
                    if !event.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
                        continue;
                    }
                    let xid = event.data;
                    let gpu_uuid = event.device.uuid().ok();
                    tracing::warn!(
                        xid,
                        gpu = gpu_uuid.as_deref().unwrap_or("unknown"),
                        gpu_instance = event.gpu_instance,
                        "XID event"
                    );
                    let mut inbox = inbox.lock().unwrap_or_else(PoisonError::into_inner);
                    inbox.events.push(XidEvent {
                        xid,
                        gpu_uuid,
                        gpu_instance: event.gpu_instance,
                        compute_instance: event.compute_instance,
                    });
                    inbox.heartbeat = Instant::now();
                }
                Err(NvmlError::Timeout) => report(None),
                // A lost GPU breaks the wait; the count probe reports the GPU, so re-register.
                Err(err) => {
                    tracing::warn!(error = %err, "nvmlEventSetWait failed; re-registering");
                    report(None);
                    break;
                }
            }
        }
        let _ = set.release_events();
        std::thread::sleep(XID_RETRY);
    }
}

fn register_xid_events(nvml: &'static Nvml) -> Result<nvml_wrapper::EventSet<'static>, String> {
    let mut set = nvml
        .create_event_set()
        .map_err(|err| format!("nvmlEventSetCreate: {err}"))?;
    let count = nvml
        .device_count()
        .map_err(|err| format!("nvmlDeviceGetCount: {err}"))?;
    for index in 0..count {
        let device = match nvml.device_by_index(index) {
            Ok(device) => device,
            // A lost or unreadable device is reported by the snapshot; watch the others.
            Err(err) => {
                tracing::warn!(index, error = %err, "not watching XID events of this device");
                continue;
            }
        };
        // Ask first: a failed registration frees the whole set, losing the devices before it.
        match device.supported_event_types() {
            Ok(supported) if supported.contains(EventTypes::CRITICAL_XID_ERROR) => {}
            Ok(_) | Err(NvmlError::NotSupported | NvmlError::GpuLost) => {
                tracing::warn!(index, "XID events not available for this device");
                continue;
            }
            Err(err) => return Err(format!("device {index}: nvmlDeviceGetSupportedEventTypes: {err}")),
        }
        set = device
            .register_events(EventTypes::CRITICAL_XID_ERROR, set)
            .map_err(|err| format!("device {index}: nvmlDeviceRegisterEvents: {}", err.error))?;
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unsupported_feature_reads_as_absent_and_is_no_fault() {
        let mut failed = Vec::new();
        assert!(matches!(
            optional::<u32>(Err(NvmlError::NotSupported), 0, "call", &mut failed),
            Ok(None)
        ));
        assert!(failed.is_empty());
    }

    #[test]
    fn a_lost_gpu_ends_the_device_read_without_a_detector_fault() {
        let mut failed = Vec::new();
        assert!(matches!(
            optional::<u32>(Err(NvmlError::GpuLost), 3, "call", &mut failed),
            Err(CallError::Lost)
        ));
        assert!(failed.is_empty());
    }

    #[test]
    fn any_other_failure_is_recorded_naming_the_device_and_the_call() {
        let mut failed = Vec::new();
        let result = optional::<u32>(
            Err(NvmlError::Unknown),
            2,
            "nvmlDeviceGetTemperature",
            &mut failed,
        );
        assert!(matches!(result, Err(CallError::Failed)));
        assert_eq!(failed.len(), 1);
        assert!(
            failed[0].starts_with("device 2: nvmlDeviceGetTemperature: "),
            "{}",
            failed[0]
        );
    }

    #[test]
    fn a_value_read_is_passed_through() {
        let mut failed = Vec::new();
        assert!(matches!(
            optional(Ok(87_u32), 0, "call", &mut failed),
            Ok(Some(87))
        ));
    }

    #[test]
    fn a_host_without_nvml_gets_a_read_error_not_a_crash() {
        let probe = NvmlProbe::new(Some("/nonexistent/libnvidia-ml.so.1".into()), false);
        let err = probe.read().unwrap_err();
        assert!(matches!(err, ReadGpusError::NvmlUnavailable(_)), "{err}");
        assert!(probe.read().is_err(), "and retries on the next read");
    }
}

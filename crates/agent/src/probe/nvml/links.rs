//! The NVML probe's NVLink and fabric reads: each link's state (`nvmlDeviceGetNvLinkState`) and
//! error counters (`nvmlDeviceGetNvLinkErrorCounter`) through nvml-wrapper's `NvLink`, and the
//! fabric registration (`nvmlDeviceGetGpuFabricInfo`) through `nvml-unwrapped`, since nvml-wrapper
//! has no method for it.
//!
//! A link NVML answers `NotSupported` (no NVLink) or `InvalidArg` (past the links this GPU has) for
//! is absent, not down; a fabric in state `NOT_SUPPORTED` (or `NotSupported` itself, or a library
//! without the function) is no fabric, not a fault. Any other failure is a detector fault recorded in `failed_calls`, never a GPU
//! fault; `GPU_IS_LOST` ends the device's read as everywhere in the probe.

use nvml_unwrapped::{FabricState as NvmlFabricState, gpu_fabric_info};
use nvml_wrapper::{Device, enum_wrappers::nv_link::ErrorCounter, error::NvmlError};

use super::{CallError, optional};
use crate::readings::nvlink::{FabricReading, FabricState, NvLinkErrors, NvLinkReading};

/// `NVML_NVLINK_MAX_LINKS` of the NVML headers nvml-wrapper 0.13 is built from.
pub const MAX_LINKS: u32 = 18;

/// The links the GPU has, in link order.
pub(super) fn read_nvlinks(
    device: &Device<'_>,
    index: u32,
    failed: &mut Vec<String>,
) -> Result<Vec<NvLinkReading>, CallError> {
    let mut links = Vec::new();
    for link in 0..MAX_LINKS {
        let wrapper = device.link_wrapper_for(link);
        let active = match wrapper.is_active() {
            Ok(active) => active,
            Err(NvmlError::NotSupported | NvmlError::InvalidArg) => continue,
            Err(err) => match optional::<bool>(
                Err(err),
                index,
                &format!("nvmlDeviceGetNvLinkState({link})"),
                failed,
            ) {
                Err(CallError::Lost) => return Err(CallError::Lost),
                Ok(_) | Err(CallError::Failed) => continue,
            },
        };
        let mut counter = |which: ErrorCounter| -> Result<Option<u64>, CallError> {
            match optional(
                wrapper.error_counter(which),
                index,
                &format!("nvmlDeviceGetNvLinkErrorCounter({link})"),
                failed,
            ) {
                Ok(value) => Ok(value),
                Err(CallError::Lost) => Err(CallError::Lost),
                Err(CallError::Failed) => Ok(None),
            }
        };
        let errors = NvLinkErrors {
            crc_flit: counter(ErrorCounter::DlCrcFlit)?,
            crc_data: counter(ErrorCounter::DlCrcData)?,
            replay: counter(ErrorCounter::DlReplay)?,
            recovery: counter(ErrorCounter::DlRecovery)?,
        };
        links.push(NvLinkReading { link, active, errors });
    }
    Ok(links)
}

/// The fabric registration, `None` where the GPU has no fabric (or the read failed, recorded).
pub(super) fn read_fabric(
    device: &Device<'_>,
    index: u32,
    failed: &mut Vec<String>,
) -> Result<Option<FabricReading>, CallError> {
    let info = match gpu_fabric_info(device) {
        // A driver older than the fabric API has no fabric to report.
        Err(NvmlError::FailedToLoadSymbol(_)) => Ok(None),
        read => optional(read, index, "nvmlDeviceGetGpuFabricInfo", failed),
    };
    let info = match info {
        Ok(info) => info,
        Err(CallError::Lost) => return Err(CallError::Lost),
        Err(CallError::Failed) => None,
    };
    Ok(info.and_then(|info| {
        let state = match info.state {
            NvmlFabricState::NotSupported => return None,
            NvmlFabricState::NotStarted => FabricState::NotStarted,
            NvmlFabricState::InProgress => FabricState::InProgress,
            NvmlFabricState::Completed => FabricState::Completed,
        };
        Some(FabricReading {
            state,
            status: info.status,
        })
    }))
}

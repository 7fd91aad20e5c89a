//! The NVML probe's MIG read: where MIG is enabled (`nvmlDeviceGetMigMode`, current mode), each
//! MIG device of the GPU (`nvmlDeviceGetMigDeviceHandleByIndex` up to
//! `nvmlDeviceGetMaxMigDeviceCount`), its UUID and name through nvml-wrapper, its GPU and compute
//! instance through `nvml-unwrapped` (nvml-wrapper has no method for them).
//!
//! A GPU without MIG (`NotSupported`, mode disabled, or a library without the functions) has no
//! MIG devices; an index with no device behind it (`NotFound`) is an empty slot. Any other failure
//! is a detector fault recorded in `failed_calls`, never a GPU fault; `GPU_IS_LOST` ends the
//! device's read as everywhere in the probe.

use nvml_unwrapped::mig::{compute_instance_id, gpu_instance_id};
use nvml_wrapper::{Device, error::NvmlError};

use super::{CallError, optional};
use crate::readings::mig::{MIG_DEVICES_MAX, MigReading};

/// `NVML_DEVICE_MIG_ENABLE`.
const MIG_ENABLED: u32 = 1;

/// The GPU's MIG devices, in MIG index order (none where MIG is off).
pub(super) fn read_mig(
    device: &Device<'_>,
    index: u32,
    failed: &mut Vec<String>,
) -> Result<Vec<MigReading>, CallError> {
    let mode = match device.mig_mode() {
        Err(NvmlError::FailedToLoadSymbol(_)) => return Ok(Vec::new()),
        result => match optional(result, index, "nvmlDeviceGetMigMode", failed) {
            Ok(mode) => mode,
            Err(CallError::Lost) => return Err(CallError::Lost),
            Err(CallError::Failed) => return Ok(Vec::new()),
        },
    };
    if mode.is_none_or(|mode| mode.current != MIG_ENABLED) {
        return Ok(Vec::new());
    }
    let slots = match optional(
        device.mig_device_count(),
        index,
        "nvmlDeviceGetMaxMigDeviceCount",
        failed,
    ) {
        Ok(count) => count.unwrap_or(0),
        Err(CallError::Lost) => return Err(CallError::Lost),
        Err(CallError::Failed) => return Ok(Vec::new()),
    };
    let mut devices = Vec::new();
    for slot in 0..slots {
        if devices.len() >= MIG_DEVICES_MAX {
            break;
        }
        let mig = match device.mig_device_by_index(slot) {
            Err(NvmlError::NotFound) => continue,
            result => match optional(
                result,
                index,
                &format!("nvmlDeviceGetMigDeviceHandleByIndex({slot})"),
                failed,
            ) {
                Ok(Some(mig)) => mig,
                Ok(None) | Err(CallError::Failed) => continue,
                Err(CallError::Lost) => return Err(CallError::Lost),
            },
        };
        let call = |name: &str| format!("MIG device {slot}: {name}");
        let (Some(uuid), Some(gpu_instance)) = (
            optional(mig.uuid(), index, &call("nvmlDeviceGetUUID"), failed)?,
            optional(
                gpu_instance_id(&mig),
                index,
                &call("nvmlDeviceGetGpuInstanceId"),
                failed,
            )?,
        ) else {
            continue;
        };
        let compute_instance = optional(
            compute_instance_id(&mig),
            index,
            &call("nvmlDeviceGetComputeInstanceId"),
            failed,
        )?
        .unwrap_or(0);
        let name = optional(mig.name(), index, &call("nvmlDeviceGetName"), failed)?.unwrap_or_default();
        devices.push(MigReading {
            uuid,
            gpu_instance,
            compute_instance,
            name,
        });
    }
    Ok(devices)
}

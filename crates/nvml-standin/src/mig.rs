//! How the scenario's MIG devices (`mig` of a GPU, [`Mig`]) become NVML answers. A GPU with a `mig` list is in MIG
//! mode (`nvmlDeviceGetMigMode` answers enabled, current and pending); one without answers
//! `NOT_SUPPORTED`, as a GPU without MIG does. `nvmlDeviceGetMaxMigDeviceCount` answers
//! [`MAX_MIG_DEVICES`]; `nvmlDeviceGetMigDeviceHandleByIndex(i)` the `i`-th entry, `NOT_FOUND` past
//! the list. A MIG handle answers `nvmlDeviceGetUUID`, `nvmlDeviceGetName`,
//! `nvmlDeviceGetGpuInstanceId` and `nvmlDeviceGetComputeInstanceId` from its entry; its parent
//! lost or gone, `GPU_IS_LOST`. An XID event's `gpuInstance` and `computeInstance` are delivered in
//! the event's `gpuInstanceId` and `computeInstanceId`.

use crate::{
    scenario::{Mig, Slot},
    state::{Handle, StandIn},
};
use nvml_wrapper_sys::bindings::{
    nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST, nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
    nvmlReturn_enum_NVML_ERROR_NOT_FOUND, nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED, nvmlReturn_t,
};

/// What `nvmlDeviceGetMaxMigDeviceCount` answers for a GPU in MIG mode (an H100's 7).
pub const MAX_MIG_DEVICES: u32 = 7;

/// `NVML_DEVICE_MIG_ENABLE`.
const MIG_ENABLED: u32 = 1;

impl StandIn {
    /// `nvmlDeviceGetMigMode`: `(current, pending)`.
    pub fn mig_mode(&self, handle: usize) -> Result<(u32, u32), nvmlReturn_t> {
        self.with_gpu(handle, "nvmlDeviceGetMigMode", |gpu| {
            if gpu.mig.is_empty() {
                Err(nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED)
            } else {
                Ok((MIG_ENABLED, MIG_ENABLED))
            }
        })
    }

    /// `nvmlDeviceGetMaxMigDeviceCount`.
    pub fn max_mig_devices(&self, handle: usize) -> Result<u32, nvmlReturn_t> {
        self.with_gpu(handle, "nvmlDeviceGetMaxMigDeviceCount", |gpu| {
            if gpu.mig.is_empty() {
                Err(nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED)
            } else {
                Ok(MAX_MIG_DEVICES)
            }
        })
    }

    /// `nvmlDeviceGetMigDeviceHandleByIndex`.
    pub fn mig_handle(&self, handle: usize, index: u32) -> Result<Handle, nvmlReturn_t> {
        self.with_gpu(handle, "nvmlDeviceGetMigDeviceHandleByIndex", |gpu| {
            let slot = u8::try_from(index).map_err(|_| nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)?;
            if gpu.mig.is_empty() {
                Err(nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED)
            } else if gpu.mig.get(usize::from(slot)).is_some() {
                Ok(Handle::Mig { gpu: gpu.index, slot })
            } else {
                Err(nvmlReturn_enum_NVML_ERROR_NOT_FOUND)
            }
        })
    }

    /// Answers a call `function` on the MIG device `handle` names from its entry: its parent lost
    /// or gone, `GPU_IS_LOST`; a handle that is not a MIG device's, `INVALID_ARGUMENT`.
    pub fn with_mig<T>(
        &self,
        handle: usize,
        function: &str,
        read: impl FnOnce(&Mig) -> Result<T, nvmlReturn_t>,
    ) -> Result<T, nvmlReturn_t> {
        let scenario = self.initialised()?;
        let Some(Handle::Mig { gpu, slot }) = Handle::decode(handle) else {
            return Err(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
        };
        let parent = scenario.slots().into_iter().find(|s| s.declared_index() == gpu);
        match parent {
            Some(Slot::Gpu(parent)) => match scenario.injected_failure(gpu, function) {
                Some(code) => Err(code),
                None => parent
                    .mig
                    .get(usize::from(slot))
                    .ok_or(nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST)
                    .and_then(read),
            },
            _ => Err(nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn standin(json: &str) -> (StandIn, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("nvml-standin-mig-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("scenario.json");
        std::fs::write(&path, json).unwrap();
        let standin = StandIn::new(Some(path.clone()));
        standin.init().unwrap();
        (standin, path)
    }

    #[test]
    fn a_partitioned_gpu_hands_out_its_mig_devices_and_a_whole_one_has_none() {
        let (standin, path) = standin(
            r#"{"gpus": [
                {"index": 0, "uuid": "GPU-a", "pciBusId": "00000000:18:00.0"},
                {"index": 1, "uuid": "GPU-b", "pciBusId": "00000000:28:00.0",
                 "mig": [{"uuid": "MIG-b1", "gpuInstance": 1, "name": "X MIG 1g.10gb"},
                         {"uuid": "MIG-b2", "gpuInstance": 2, "computeInstance": 0}]}]}"#,
        );
        let whole = standin.handle_by_index(0).unwrap().encode();
        let partitioned = standin.handle_by_index(1).unwrap().encode();
        assert_eq!(
            standin.mig_mode(whole),
            Err(nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED)
        );
        assert_eq!(standin.mig_mode(partitioned), Ok((1, 1)));
        assert_eq!(standin.max_mig_devices(partitioned), Ok(MAX_MIG_DEVICES));
        let second = standin.mig_handle(partitioned, 1).unwrap().encode();
        assert_eq!(standin.uuid(second).as_deref(), Ok("MIG-b2"));
        assert_eq!(
            standin.with_mig(second, "nvmlDeviceGetGpuInstanceId", |m| Ok(m.gpu_instance)),
            Ok(2)
        );
        assert_eq!(
            standin.mig_handle(partitioned, 2),
            Err(nvmlReturn_enum_NVML_ERROR_NOT_FOUND),
            "an empty slot"
        );
        assert_eq!(
            standin.with_mig(whole, "nvmlDeviceGetGpuInstanceId", |m| Ok(m.gpu_instance)),
            Err(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT),
            "not a MIG handle"
        );
        std::fs::remove_file(path).unwrap();
    }
}

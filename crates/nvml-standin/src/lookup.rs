//! The answers that look across the scenario's GPUs rather than at one: a handle by UUID
//! (`nvmlDeviceGetHandleByUUID`) and the common ancestor of two GPUs
//! (`nvmlDeviceGetTopologyCommonAncestor`). [`crate::plugin`] says what they answer.

use nvml_wrapper_sys::bindings::{nvmlReturn_enum_NVML_ERROR_NOT_FOUND, nvmlReturn_t};

use crate::{
    plugin::{DEFAULT_TOPOLOGY, TopologyLevel},
    scenario::Slot,
    state::{Handle, StandIn},
};

impl StandIn {
    /// `nvmlDeviceGetHandleByUUID`: the GPU or MIG device with `uuid` among the slots NVML reaches,
    /// unless a `failedCalls` entry fails the call on its GPU; `NOT_FOUND` where none has it.
    pub fn handle_by_uuid(&self, uuid: &str) -> Result<Handle, nvmlReturn_t> {
        let scenario = self.initialised()?;
        let reachable = usize::try_from(scenario.device_count()).unwrap_or(usize::MAX);
        for slot in scenario.slots().into_iter().take(reachable) {
            let Slot::Gpu(gpu) = slot else { continue };
            let found = if gpu.uuid == uuid {
                Some(Handle::Device(gpu.index))
            } else {
                let position = gpu.mig.iter().position(|mig| mig.uuid == uuid);
                position
                    .and_then(|position| u8::try_from(position).ok())
                    .map(|slot| Handle::Mig { gpu: gpu.index, slot })
            };
            if let Some(handle) = found {
                return match scenario.injected_failure(gpu.index, "nvmlDeviceGetHandleByUUID") {
                    Some(code) => Err(code),
                    None => Ok(handle),
                };
            }
        }
        Err(nvmlReturn_enum_NVML_ERROR_NOT_FOUND)
    }

    /// `nvmlDeviceGetTopologyCommonAncestor` of the GPUs `first` and `second` name: `internal` for a
    /// GPU with itself, else the level either GPU's `topology` gives the other (the first GPU's
    /// first), else [`DEFAULT_TOPOLOGY`]. A handle that names no GPU fails as in any GPU call.
    pub fn common_ancestor(&self, first: usize, second: usize) -> Result<TopologyLevel, nvmlReturn_t> {
        const FUNCTION: &str = "nvmlDeviceGetTopologyCommonAncestor";
        let (index, uuid, topology) = self.with_gpu(first, FUNCTION, |gpu| {
            Ok((gpu.index, gpu.uuid.clone(), gpu.topology.clone()))
        })?;
        self.with_gpu(second, FUNCTION, |other| {
            if other.index == index {
                return Ok(TopologyLevel::Internal);
            }
            let stated = topology.get(&other.uuid).or_else(|| other.topology.get(&uuid));
            Ok(stated.copied().unwrap_or(DEFAULT_TOPOLOGY))
        })
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use nvml_wrapper_sys::bindings::{
        nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST, nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
        nvmlReturn_enum_NVML_ERROR_TIMEOUT, nvmlReturn_enum_NVML_ERROR_UNINITIALIZED,
    };

    use super::*;

    const SCENARIO: &str = r#"{"gpus": [
        {"index": 0, "uuid": "GPU-a", "pciBusId": "0", "topology": {"GPU-b": "node"},
         "mig": [{"uuid": "MIG-a0", "gpuInstance": 1}, {"uuid": "MIG-a1", "gpuInstance": 2}]},
        {"index": 1, "uuid": "GPU-b", "pciBusId": "1", "topology": {"GPU-c": "single"}},
        {"index": 2, "uuid": "GPU-c", "pciBusId": "2", "topology": {"GPU-b": "hostbridge"}},
        {"index": 4, "uuid": "GPU-e", "pciBusId": "4"}],
        "lostIndices": [3],
        "failedCalls": ["device 2: nvmlDeviceGetHandleByUUID: Timeout"]}"#;

    fn started(name: &str, json: &str) -> StandIn {
        let dir = std::env::temp_dir().join(format!("nvml-standin-lookup-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path: PathBuf = dir.join("scenario.json");
        std::fs::write(&path, json).unwrap();
        let standin = StandIn::new(Some(path));
        standin.init().unwrap();
        standin
    }

    #[test]
    fn a_uuid_finds_its_gpu_or_mig_device_and_an_unknown_one_is_not_found() {
        let standin = started("uuid", SCENARIO);
        assert_eq!(standin.handle_by_uuid("GPU-b"), Ok(Handle::Device(1)));
        assert_eq!(standin.handle_by_uuid("GPU-e"), Ok(Handle::Device(4)));
        assert_eq!(
            standin.handle_by_uuid("MIG-a1"),
            Ok(Handle::Mig { gpu: 0, slot: 1 })
        );
        let handle = standin.handle_by_uuid("GPU-a").unwrap();
        assert_eq!(
            standin.uuid(handle.encode()).as_deref(),
            Ok("GPU-a"),
            "the handle answers"
        );
        assert_eq!(
            standin.handle_by_uuid("GPU-nowhere"),
            Err(nvmlReturn_enum_NVML_ERROR_NOT_FOUND)
        );
        assert_eq!(
            standin.handle_by_uuid(""),
            Err(nvmlReturn_enum_NVML_ERROR_NOT_FOUND)
        );
        assert_eq!(
            standin.handle_by_uuid("GPU-c"),
            Err(nvmlReturn_enum_NVML_ERROR_TIMEOUT),
            "a failedCalls entry fails it"
        );
    }

    #[test]
    fn a_gpu_past_the_device_count_is_not_found_and_nothing_before_init() {
        let standin = started(
            "uuid-count",
            r#"{"deviceCount": 1, "gpus": [{"index": 0, "uuid": "GPU-a", "pciBusId": "0"},
                                           {"index": 1, "uuid": "GPU-b", "pciBusId": "1"}]}"#,
        );
        assert_eq!(standin.handle_by_uuid("GPU-a"), Ok(Handle::Device(0)));
        assert_eq!(
            standin.handle_by_uuid("GPU-b"),
            Err(nvmlReturn_enum_NVML_ERROR_NOT_FOUND)
        );
        standin.shutdown().unwrap();
        assert_eq!(
            standin.handle_by_uuid("GPU-a"),
            Err(nvmlReturn_enum_NVML_ERROR_UNINITIALIZED)
        );
    }

    #[test]
    fn the_common_ancestor_is_either_gpus_statement_else_system_and_internal_with_itself() {
        let standin = started("topology", SCENARIO);
        let handle = |index| Handle::Device(index).encode();
        let level = |first, second| standin.common_ancestor(handle(first), handle(second));
        assert_eq!(level(0, 1), Ok(TopologyLevel::Node), "the first GPU's statement");
        assert_eq!(level(1, 0), Ok(TopologyLevel::Node), "the second GPU's statement");
        assert_eq!(
            level(1, 2),
            Ok(TopologyLevel::Single),
            "the first GPU's, where both state one"
        );
        assert_eq!(level(2, 1), Ok(TopologyLevel::Hostbridge));
        assert_eq!(level(0, 4), Ok(TopologyLevel::System), "the default");
        assert_eq!(level(4, 4), Ok(TopologyLevel::Internal));
        assert_eq!(level(0, 3), Err(nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST));
        assert_eq!(
            standin.common_ancestor(0, handle(0)),
            Err(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT),
            "no handle"
        );
        let mig = Handle::Mig { gpu: 0, slot: 0 }.encode();
        assert_eq!(
            standin.common_ancestor(handle(1), mig),
            Err(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)
        );
    }
}

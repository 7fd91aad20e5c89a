//! The scenario's fields for what the NVIDIA device plugin (v0.18.0, through go-nvml and
//! go-gpuallocator) asks NVML beyond the agent's calls. Each is optional in a GPU's entry and has a
//! stated default, so a scenario written for the agent serves the plugin as it is:
//!
//! ```json
//! "minorNumber": 0,
//! "memory": {"totalBytes": 85899345920, "usedBytes": 0},
//! "cudaComputeCapability": {"major": 9, "minor": 0},
//! "topology": {"GPU-b": "node"},
//! "nvlinkRemoteBusIds": {"0": "00000000:19:00.0"}
//! ```
//!
//! - `minorNumber`: `nvmlDeviceGetMinorNumber` (the plugin's `/dev/nvidia<minor>`); default: the
//!   GPU's `index`.
//! - `memory`: `nvmlDeviceGetMemoryInfo` in bytes, free = total − used (none when used exceeds
//!   total); default [`Memory::default`]: an H100 80GB's 80 GiB, all free.
//! - `cudaComputeCapability`: `nvmlDeviceGetCudaComputeCapability`; default
//!   [`ComputeCapability::default`]: 9.0, Hopper (an H100).
//! - `topology`: `nvmlDeviceGetTopologyCommonAncestor` of this GPU and the GPU with that UUID, as a
//!   [`TopologyLevel`] (`internal`, `single`, `multiple`, `hostbridge`, `node`, `system`), read from
//!   either GPU's entry (the first one's first); default [`DEFAULT_TOPOLOGY`]; a GPU with itself is
//!   `internal`.
//! - `nvlinkRemoteBusIds`: `nvmlDeviceGetNvLinkRemotePciInfo_v2` of a link the GPU's `nvlinks` list
//!   as active: the PCI bus id at the link's other end (a GPU's for a direct GPU-to-GPU link);
//!   default [`NVSWITCH_BUS_ID`]. A link not listed, or listed inactive, is `NOT_SUPPORTED`.
//! - `nvmlDeviceGetHandleByUUID` finds the GPU (or MIG device) with that `uuid` among the slots
//!   `nvmlDeviceGetCount_v2` reaches: `NOT_FOUND` where none has it (a lost slot has no UUID).
//!
//! `failedCalls` names these functions without their version suffix, a link's call with the link in
//! brackets (`device 0: nvmlDeviceGetNvLinkRemotePciInfo(2): Unknown`).
//!
//! The agent's `file` probe takes a GPU entry's unknown fields without complaint, so these fields
//! keep one scenario format for both probes.

use nvml_wrapper_sys::bindings::{
    nvmlGpuLevel_enum_NVML_TOPOLOGY_HOSTBRIDGE, nvmlGpuLevel_enum_NVML_TOPOLOGY_INTERNAL,
    nvmlGpuLevel_enum_NVML_TOPOLOGY_MULTIPLE, nvmlGpuLevel_enum_NVML_TOPOLOGY_NODE,
    nvmlGpuLevel_enum_NVML_TOPOLOGY_SINGLE, nvmlGpuLevel_enum_NVML_TOPOLOGY_SYSTEM, nvmlGpuTopologyLevel_t,
};
use serde::Deserialize;

/// The common ancestor of two GPUs the scenario does not relate: `NVML_TOPOLOGY_SYSTEM` (50), the
/// farthest path NVML names (across the CPUs' interconnect). The stand-in claims no closeness the
/// scenario did not state: a test that wants two GPUs preferred together says so (`node` or
/// closer), and no unrelated pair ever looks closer than a related one to the plugin's allocator.
pub const DEFAULT_TOPOLOGY: TopologyLevel = TopologyLevel::System;

/// The remote end of an active NVLink the scenario gives no bus id for: an NVSwitch, as every link
/// of an HGX H100 board ends at one. It names no GPU (bus `FF` is the last of domain 0, where no
/// board of ours sits), so the plugin's allocator counts no GPU-to-GPU link from it.
pub const NVSWITCH_BUS_ID: &str = "00000000:FF:00.0";

/// A GPU's framebuffer memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Memory {
    /// Total, bytes.
    pub total_bytes: u64,
    /// In use, bytes.
    #[serde(default)]
    pub used_bytes: u64,
}

impl Default for Memory {
    /// An H100 80GB's 80 GiB, all free.
    fn default() -> Self {
        Self {
            total_bytes: 80 << 30,
            used_bytes: 0,
        }
    }
}

impl Memory {
    /// Free, bytes: what is not in use.
    #[must_use]
    pub fn free_bytes(&self) -> u64 {
        self.total_bytes.saturating_sub(self.used_bytes)
    }
}

/// A GPU's CUDA compute capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ComputeCapability {
    /// Major version.
    pub major: i32,
    /// Minor version.
    pub minor: i32,
}

impl Default for ComputeCapability {
    /// 9.0: Hopper, an H100's.
    fn default() -> Self {
        Self { major: 9, minor: 0 }
    }
}

/// NVML's `nvmlGpuTopologyLevel_t`, as the scenario spells it: from the closest to the farthest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TopologyLevel {
    /// `NVML_TOPOLOGY_INTERNAL`: the same board.
    Internal,
    /// `NVML_TOPOLOGY_SINGLE`: one PCI Express switch.
    Single,
    /// `NVML_TOPOLOGY_MULTIPLE`: several PCI Express switches, no host bridge.
    Multiple,
    /// `NVML_TOPOLOGY_HOSTBRIDGE`: one host bridge.
    Hostbridge,
    /// `NVML_TOPOLOGY_NODE`: host bridges within one NUMA node (one CPU).
    Node,
    /// `NVML_TOPOLOGY_SYSTEM`: across NUMA nodes (the CPUs' interconnect).
    System,
}

impl TopologyLevel {
    /// Its `nvmlGpuTopologyLevel_t` value.
    #[must_use]
    pub fn code(self) -> nvmlGpuTopologyLevel_t {
        match self {
            TopologyLevel::Internal => nvmlGpuLevel_enum_NVML_TOPOLOGY_INTERNAL,
            TopologyLevel::Single => nvmlGpuLevel_enum_NVML_TOPOLOGY_SINGLE,
            TopologyLevel::Multiple => nvmlGpuLevel_enum_NVML_TOPOLOGY_MULTIPLE,
            TopologyLevel::Hostbridge => nvmlGpuLevel_enum_NVML_TOPOLOGY_HOSTBRIDGE,
            TopologyLevel::Node => nvmlGpuLevel_enum_NVML_TOPOLOGY_NODE,
            TopologyLevel::System => nvmlGpuLevel_enum_NVML_TOPOLOGY_SYSTEM,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_an_h100s_and_the_farthest_topology() {
        let memory = Memory::default();
        assert_eq!(memory.total_bytes, 85_899_345_920);
        assert_eq!(memory.free_bytes(), memory.total_bytes);
        assert_eq!(
            ComputeCapability::default(),
            ComputeCapability { major: 9, minor: 0 }
        );
        assert_eq!(DEFAULT_TOPOLOGY.code(), 50, "NVML_TOPOLOGY_SYSTEM");
    }

    #[test]
    fn memory_in_use_leaves_the_rest_free_and_never_less_than_none() {
        let memory: Memory = serde_json::from_str(r#"{"totalBytes": 1000, "usedBytes": 300}"#).unwrap();
        assert_eq!(memory.free_bytes(), 700);
        let overfull = Memory {
            total_bytes: 1,
            used_bytes: 2,
        };
        assert_eq!(overfull.free_bytes(), 0);
        let unused: Memory = serde_json::from_str(r#"{"totalBytes": 1000}"#).unwrap();
        assert_eq!(unused.used_bytes, 0);
    }

    #[test]
    fn topology_levels_are_nvmls_codes_and_a_misspelt_one_is_refused() {
        let levels: Vec<TopologyLevel> =
            serde_json::from_str(r#"["internal", "single", "multiple", "hostbridge", "node", "system"]"#)
                .unwrap();
        let codes: Vec<nvmlGpuTopologyLevel_t> = levels.into_iter().map(TopologyLevel::code).collect();
        assert_eq!(codes, [0, 10, 20, 30, 40, 50]);
        assert!(serde_json::from_str::<TopologyLevel>(r#""NODE""#).is_err());
        assert!(serde_json::from_str::<ComputeCapability>(r#"{"major": 8}"#).is_err());
    }
}

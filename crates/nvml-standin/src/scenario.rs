//! The scenario: the JSON file the agent's `file` probe reads (see
//! `crates/agent/src/probe/file.rs`), read here to answer NVML calls instead. One format drives
//! both probes, so a test scenario runs through either; `crates/agent/tests/standin_parity.rs`
//! reads every recorded fixture through both and compares the readings, so the two parsers cannot
//! drift apart unnoticed.
//!
//! How the file's fields become NVML answers:
//! - `nvmlError`: `nvmlInit_v2` and `nvmlDeviceGetCount_v2` fail with the code it names (an
//!   `nvmlErrorString` text such as `Driver Not Loaded`, or an enum name such as
//!   `NVML_ERROR_DRIVER_NOT_LOADED`; any other text is `NVML_ERROR_UNKNOWN`).
//! - `hangSeconds`: `nvmlDeviceGetCount_v2` (the first call of every read) blocks that long, or
//!   until the scenario no longer asks for a hang.
//! - `gpus`, `lostIndices`, `unreadableIndices`: the device slots, ordered by their `index`; NVML
//!   index `i` is the `i`-th slot, as a driver renumbers the GPUs it still sees. A lost slot answers
//!   every call with `NVML_ERROR_GPU_IS_LOST`; an unreadable one fails `nvmlDeviceGetHandleByIndex`
//!   with `NVML_ERROR_UNKNOWN`. An absent optional reading is `NVML_ERROR_NOT_SUPPORTED`.
//! - `deviceCount`: what `nvmlDeviceGetCount_v2` answers (default: the number of slots); slots past
//!   it are not reachable, a count past the slots reaches indices that fail with `INVALID_ARGUMENT`.
//! - `xidEvents`: delivered once each (keyed by `id`, else position) through `nvmlEventSetWait_v2`.
//! - `nvlinks`, `fabric`: see [`crate::nvlink`]; `mig` (a GPU's MIG devices, with `gpuInstance` on
//!   an XID event): see [`crate::mig`]; `minorNumber`, `memory`, `cudaComputeCapability`,
//!   `topology`, `nvlinkRemoteBusIds` (for the NVIDIA device plugin): see [`crate::plugin`].
//! - `failedCalls`: `device <index>: <nvml function>: <error>` makes that call on that device
//!   (`index` as in the file) fail with that error; any other form is refused.
//! - `kernelLog`: no NVML answer; the harness writes these lines to the agent's kernel log.
//!
//! Which file: the one `GPU_STANDIN_SCENARIO` names, else `scenario.json` beside the library.

use std::{collections::BTreeMap, path::Path, time::SystemTime};

use nvml_wrapper_sys::bindings::{
    nvmlReturn_enum_NVML_ERROR_ALREADY_INITIALIZED, nvmlReturn_enum_NVML_ERROR_CORRUPTED_INFOROM,
    nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED, nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND,
    nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST, nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_POWER,
    nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE, nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
    nvmlReturn_enum_NVML_ERROR_IRQ_ISSUE, nvmlReturn_enum_NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    nvmlReturn_enum_NVML_ERROR_LIBRARY_NOT_FOUND, nvmlReturn_enum_NVML_ERROR_NO_PERMISSION,
    nvmlReturn_enum_NVML_ERROR_NOT_FOUND, nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
    nvmlReturn_enum_NVML_ERROR_OPERATING_SYSTEM, nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED,
    nvmlReturn_enum_NVML_ERROR_TIMEOUT, nvmlReturn_enum_NVML_ERROR_UNINITIALIZED,
    nvmlReturn_enum_NVML_ERROR_UNKNOWN, nvmlReturn_enum_NVML_SUCCESS, nvmlReturn_t,
};
use serde::Deserialize;

use crate::plugin::{ComputeCapability, Memory, TopologyLevel};

/// The file's shape (the agent's `ProbeFile`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Scenario {
    #[serde(default)]
    nvml_error: Option<String>,
    #[serde(default)]
    hang_seconds: u64,
    #[serde(default)]
    device_count: Option<u32>,
    #[serde(default)]
    gpus: Vec<Gpu>,
    #[serde(default)]
    lost_indices: Vec<u32>,
    #[serde(default)]
    unreadable_indices: Vec<u32>,
    #[serde(default)]
    xid_events: Vec<ScenarioXid>,
    #[serde(default)]
    failed_calls: Vec<String>,
    /// Kernel-log lines (`/dev/kmsg` records): no NVML call answers them; the harness writes them
    /// to the file the agent reads as its kernel log (`--kernel-log`).
    #[serde(default, rename = "kernelLog")]
    _kernel_log: Vec<String>,
    /// `failed_calls`, parsed.
    #[serde(skip)]
    failures: Vec<FailedCall>,
}

/// One GPU's readings (the agent's `GpuReading`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Gpu {
    /// The index the file gives it (orders the slots; NVML indices are positions).
    pub index: u32,
    /// `GPU-...`.
    pub uuid: String,
    /// `00000000:18:00.0`.
    pub pci_bus_id: String,
    /// Product name.
    #[serde(default)]
    pub name: String,
    /// Board serial number.
    #[serde(default)]
    pub serial: Option<String>,
    /// Board part number.
    #[serde(default)]
    pub board_part_number: Option<String>,
    /// VBIOS version.
    #[serde(default)]
    pub vbios_version: Option<String>,
    /// Volatile uncorrected ECC count.
    #[serde(default)]
    pub ecc_volatile_uncorrected: Option<u64>,
    /// Row remapper flags.
    #[serde(default)]
    pub row_remap: Option<RowRemap>,
    /// Retired pages pending.
    #[serde(default)]
    pub retired_pages_pending: Option<bool>,
    /// Core temperature, °C.
    #[serde(default)]
    pub temperature_c: Option<u32>,
    /// Slowdown threshold, °C.
    #[serde(default)]
    pub slowdown_threshold_c: Option<u32>,
    /// PCI Express link.
    #[serde(default)]
    pub pcie: Option<Pcie>,
    /// NVLink links (see [`crate::nvlink`]).
    #[serde(default)]
    pub nvlinks: Vec<crate::nvlink::NvLink>,
    /// Fabric registration (see [`crate::nvlink`]).
    #[serde(default)]
    pub fabric: Option<crate::nvlink::Fabric>,
    /// MIG devices (see [`crate::mig`]).
    #[serde(default)]
    pub mig: Vec<Mig>,
    /// Its `/dev/nvidia<minor>` (this and the rest: see [`crate::plugin`]).
    #[serde(default)]
    pub minor_number: Option<u32>,
    /// Framebuffer memory.
    #[serde(default)]
    pub memory: Option<Memory>,
    /// CUDA compute capability.
    #[serde(default)]
    pub cuda_compute_capability: Option<ComputeCapability>,
    /// The common ancestor with the GPU of each UUID.
    #[serde(default)]
    pub topology: BTreeMap<String, TopologyLevel>,
    /// The PCI bus id at the other end of each active NVLink, by link.
    #[serde(default)]
    pub nvlink_remote_bus_ids: BTreeMap<u32, String>,
}

/// One MIG device (the agent's `MigReading`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Mig {
    /// `MIG-...`.
    pub uuid: String,
    /// Its GPU instance.
    pub gpu_instance: u32,
    /// Its compute instance.
    #[serde(default)]
    pub compute_instance: u32,
    /// Its name (`NVIDIA H100 80GB HBM3 MIG 1g.10gb`).
    #[serde(default)]
    pub name: String,
}

/// Row remapper field values.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RowRemap {
    /// `NVML_FI_DEV_REMAPPED_PENDING`.
    pub pending: bool,
    /// `NVML_FI_DEV_REMAPPED_FAILURE`.
    pub failed: bool,
}

/// PCI Express link state.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Pcie {
    /// Current generation.
    pub current_gen: u32,
    /// Maximum generation.
    pub max_gen: u32,
    /// Current width.
    pub current_width: u32,
    /// Maximum width.
    pub max_width: u32,
    /// Replay counter.
    pub replay_counter: u32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ScenarioXid {
    #[serde(default)]
    id: Option<u64>,
    xid: u64,
    #[serde(default)]
    gpu_uuid: Option<String>,
    #[serde(default)]
    gpu_instance: Option<u32>,
    #[serde(default)]
    compute_instance: Option<u32>,
}

/// One XID event of the scenario, with the key that delivers it once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Xid {
    /// `id`, else the event's position in the list.
    pub key: u64,
    /// The XID code.
    pub xid: u64,
    /// The GPU it names.
    pub gpu_uuid: Option<String>,
    /// The MIG GPU instance it names.
    pub gpu_instance: Option<u32>,
    /// The MIG compute instance it names.
    pub compute_instance: Option<u32>,
}

/// A `failedCalls` entry: `device <index>: <function>: <error>`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FailedCall {
    index: u32,
    function: String,
    code: nvmlReturn_t,
}

/// What NVML index `i` reaches.
#[derive(Debug, Clone, Copy)]
pub enum Slot<'a> {
    /// A GPU that answers.
    Gpu(&'a Gpu),
    /// Fallen off the bus: `GPU_IS_LOST`.
    Lost(u32),
    /// The driver cannot give its handle.
    Unreadable(u32),
}

impl Slot<'_> {
    /// The index the file gives this slot.
    #[must_use]
    pub fn declared_index(&self) -> u32 {
        match self {
            Slot::Gpu(gpu) => gpu.index,
            Slot::Lost(index) | Slot::Unreadable(index) => *index,
        }
    }
}

impl Scenario {
    /// Parses a scenario; a malformed `failedCalls` entry is an error, as a typo in a field is.
    ///
    /// # Errors
    /// Text that is not a scenario: the JSON error, or the `failedCalls` entry refused.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut scenario: Scenario = serde_json::from_str(text).map_err(|err| err.to_string())?;
        scenario.failures = scenario
            .failed_calls
            .iter()
            .map(|entry| parse_failed_call(entry))
            .collect::<Result<_, _>>()?;
        Ok(scenario)
    }

    /// The code `nvmlInit_v2` and `nvmlDeviceGetCount_v2` fail with, if NVML is unavailable.
    #[must_use]
    pub fn nvml_error(&self) -> Option<nvmlReturn_t> {
        self.nvml_error.as_deref().map(code_of)
    }

    /// How long a read blocks.
    #[must_use]
    pub fn hang_seconds(&self) -> u64 {
        self.hang_seconds
    }

    /// The device slots in NVML order.
    #[must_use]
    pub fn slots(&self) -> Vec<Slot<'_>> {
        let mut slots: Vec<Slot<'_>> = self
            .gpus
            .iter()
            .map(Slot::Gpu)
            .chain(self.lost_indices.iter().map(|index| Slot::Lost(*index)))
            .chain(
                self.unreadable_indices
                    .iter()
                    .map(|index| Slot::Unreadable(*index)),
            )
            .collect();
        slots.sort_by_key(Slot::declared_index);
        slots
    }

    /// What `nvmlDeviceGetCount_v2` answers.
    #[must_use]
    pub fn device_count(&self) -> u32 {
        self.device_count.unwrap_or_else(|| {
            let slots = self.gpus.len() + self.lost_indices.len() + self.unreadable_indices.len();
            u32::try_from(slots).unwrap_or(u32::MAX)
        })
    }

    /// The slot NVML index `index` reaches; `None` past the count or the slots.
    #[must_use]
    pub fn slot(&self, index: u32) -> Option<Slot<'_>> {
        if index >= self.device_count() {
            return None;
        }
        self.slots().into_iter().nth(usize::try_from(index).ok()?)
    }

    /// The GPU with `uuid`, if the scenario lists it.
    #[must_use]
    pub fn gpu_by_uuid(&self, uuid: &str) -> Option<&Gpu> {
        self.gpus.iter().find(|gpu| gpu.uuid == uuid)
    }

    /// The code `function` fails with on the device the file calls `declared_index`, if listed.
    #[must_use]
    pub fn injected_failure(&self, declared_index: u32, function: &str) -> Option<nvmlReturn_t> {
        self.failures
            .iter()
            .find(|failure| failure.index == declared_index && failure.function == function)
            .map(|failure| failure.code)
    }

    /// The XID events, each with its delivery key.
    #[must_use]
    pub fn xids(&self) -> Vec<Xid> {
        self.xid_events
            .iter()
            .enumerate()
            .map(|(position, event)| Xid {
                key: event.id.unwrap_or(position as u64),
                xid: event.xid,
                gpu_uuid: event.gpu_uuid.clone(),
                gpu_instance: event.gpu_instance,
                compute_instance: event.compute_instance,
            })
            .collect()
    }
}

fn parse_failed_call(entry: &str) -> Result<FailedCall, String> {
    let refuse = || format!("failedCalls entry {entry:?} is not `device <index>: <nvml function>: <error>`");
    let rest = entry.strip_prefix("device ").ok_or_else(refuse)?;
    let mut parts = rest.splitn(3, ": ");
    let (Some(index), Some(function), Some(error)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(refuse());
    };
    if !function.starts_with("nvml") {
        return Err(refuse());
    }
    Ok(FailedCall {
        index: index.parse().map_err(|_| refuse())?,
        function: function.to_owned(),
        code: code_of(error),
    })
}

/// Every return code the stand-in speaks of, with `nvmlErrorString`'s text and its enum name.
const CODES: &[(nvmlReturn_t, &str, &str)] = &[
    (nvmlReturn_enum_NVML_SUCCESS, "Success", "SUCCESS"),
    (
        nvmlReturn_enum_NVML_ERROR_UNINITIALIZED,
        "Uninitialized",
        "UNINITIALIZED",
    ),
    (
        nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
        "Invalid Argument",
        "INVALID_ARGUMENT",
    ),
    (
        nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
        "Not Supported",
        "NOT_SUPPORTED",
    ),
    (
        nvmlReturn_enum_NVML_ERROR_NO_PERMISSION,
        "Insufficient Permissions",
        "NO_PERMISSION",
    ),
    (
        nvmlReturn_enum_NVML_ERROR_ALREADY_INITIALIZED,
        "Already Initialized",
        "ALREADY_INITIALIZED",
    ),
    (nvmlReturn_enum_NVML_ERROR_NOT_FOUND, "Not Found", "NOT_FOUND"),
    (
        nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE,
        "Insufficient Size",
        "INSUFFICIENT_SIZE",
    ),
    (
        nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_POWER,
        "Insufficient External Power",
        "INSUFFICIENT_POWER",
    ),
    (
        nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED,
        "Driver Not Loaded",
        "DRIVER_NOT_LOADED",
    ),
    (nvmlReturn_enum_NVML_ERROR_TIMEOUT, "Timeout", "TIMEOUT"),
    (
        nvmlReturn_enum_NVML_ERROR_IRQ_ISSUE,
        "Interrupt request issue",
        "IRQ_ISSUE",
    ),
    (
        nvmlReturn_enum_NVML_ERROR_LIBRARY_NOT_FOUND,
        "NVML Shared Library Not Found",
        "LIBRARY_NOT_FOUND",
    ),
    (
        nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND,
        "Function Not Found",
        "FUNCTION_NOT_FOUND",
    ),
    (
        nvmlReturn_enum_NVML_ERROR_CORRUPTED_INFOROM,
        "Corrupted infoROM",
        "CORRUPTED_INFOROM",
    ),
    (
        nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST,
        "GPU is lost",
        "GPU_IS_LOST",
    ),
    (
        nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED,
        "GPU requires restart",
        "RESET_REQUIRED",
    ),
    (
        nvmlReturn_enum_NVML_ERROR_OPERATING_SYSTEM,
        "The operating system has blocked the request",
        "OPERATING_SYSTEM",
    ),
    (
        nvmlReturn_enum_NVML_ERROR_LIB_RM_VERSION_MISMATCH,
        "RM has detected an NVML/RM version mismatch",
        "LIB_RM_VERSION_MISMATCH",
    ),
    (nvmlReturn_enum_NVML_ERROR_UNKNOWN, "Unknown Error", "UNKNOWN"),
];

/// The code a scenario's error text names: `nvmlErrorString`'s text or the enum name, in any case,
/// with or without `NVML_ERROR_`; anything else is `NVML_ERROR_UNKNOWN`.
#[must_use]
pub fn code_of(text: &str) -> nvmlReturn_t {
    let squash = |text: &str| -> String {
        text.chars()
            .filter(char::is_ascii_alphanumeric)
            .map(|c| c.to_ascii_lowercase())
            .collect()
    };
    let wanted = squash(text.trim().trim_start_matches("NVML_ERROR_"));
    CODES
        .iter()
        .find(|(_, message, name)| squash(message) == wanted || squash(name) == wanted)
        .map_or(nvmlReturn_enum_NVML_ERROR_UNKNOWN, |(code, _, _)| *code)
}

/// `nvmlErrorString`'s text for `code`.
#[must_use]
pub fn message_of(code: nvmlReturn_t) -> &'static str {
    CODES
        .iter()
        .find(|(known, _, _)| *known == code)
        .map_or("Unknown Error", |(_, message, _)| message)
}

/// What identifies one version of the scenario file: a writer that replaces it (rename) changes the
/// inode, one that rewrites it changes the modification time or length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

impl FileStamp {
    /// The stamp of `path` now.
    ///
    /// # Errors
    /// When `path` cannot be read (`std::fs::metadata`).
    pub fn of(path: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::MetadataExt as _;
        let metadata = std::fs::metadata(path)?;
        Ok(Self {
            modified: metadata.modified().ok(),
            len: metadata.len(),
            inode: metadata.ino(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_texts_map_to_their_codes_and_anything_else_to_unknown() {
        assert_eq!(
            code_of("Driver Not Loaded"),
            nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED
        );
        assert_eq!(
            code_of("NVML_ERROR_GPU_IS_LOST"),
            nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST
        );
        assert_eq!(code_of("gpu_is_lost"), nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST);
        assert_eq!(code_of("Unknown"), nvmlReturn_enum_NVML_ERROR_UNKNOWN);
        assert_eq!(
            code_of("the driver caught fire"),
            nvmlReturn_enum_NVML_ERROR_UNKNOWN
        );
        assert_eq!(message_of(nvmlReturn_enum_NVML_ERROR_TIMEOUT), "Timeout");
    }

    #[test]
    fn slots_are_ordered_by_declared_index_and_nvml_indices_are_positions() {
        let scenario = Scenario::parse(
            r#"{"gpus": [{"index": 3, "uuid": "GPU-d", "pciBusId": "3"},
                         {"index": 0, "uuid": "GPU-a", "pciBusId": "0"}],
                "lostIndices": [1], "unreadableIndices": [2]}"#,
        )
        .unwrap();
        assert_eq!(scenario.device_count(), 4);
        let declared: Vec<u32> = scenario.slots().iter().map(Slot::declared_index).collect();
        assert_eq!(declared, [0, 1, 2, 3]);
        assert!(matches!(scenario.slot(1), Some(Slot::Lost(1))));
        assert!(matches!(scenario.slot(2), Some(Slot::Unreadable(2))));
        assert!(matches!(scenario.slot(3), Some(Slot::Gpu(gpu)) if gpu.uuid == "GPU-d"));
        assert!(scenario.slot(4).is_none());
    }

    #[test]
    fn a_gpu_gone_from_the_list_renumbers_the_ones_after_it() {
        let scenario = Scenario::parse(
            r#"{"gpus": [{"index": 0, "uuid": "GPU-a", "pciBusId": "0"},
                         {"index": 2, "uuid": "GPU-c", "pciBusId": "2"}]}"#,
        )
        .unwrap();
        assert_eq!(scenario.device_count(), 2);
        assert!(matches!(scenario.slot(1), Some(Slot::Gpu(gpu)) if gpu.uuid == "GPU-c"));
    }

    #[test]
    fn a_smaller_device_count_hides_the_slots_past_it() {
        let scenario = Scenario::parse(
            r#"{"deviceCount": 1, "gpus": [{"index": 0, "uuid": "GPU-a", "pciBusId": "0"},
                                           {"index": 1, "uuid": "GPU-b", "pciBusId": "1"}]}"#,
        )
        .unwrap();
        assert_eq!(scenario.device_count(), 1);
        assert!(scenario.slot(1).is_none());
    }

    #[test]
    fn failed_calls_name_a_device_a_function_and_an_error() {
        let scenario = Scenario::parse(
            r#"{"failedCalls": ["device 0: nvmlDeviceGetFieldValues: Unknown",
                                "device 1: nvmlDeviceGetTemperature: Timeout"]}"#,
        )
        .unwrap();
        assert_eq!(
            scenario.injected_failure(0, "nvmlDeviceGetFieldValues"),
            Some(nvmlReturn_enum_NVML_ERROR_UNKNOWN)
        );
        assert_eq!(
            scenario.injected_failure(1, "nvmlDeviceGetTemperature"),
            Some(nvmlReturn_enum_NVML_ERROR_TIMEOUT)
        );
        assert_eq!(scenario.injected_failure(1, "nvmlDeviceGetFieldValues"), None);
        let err = Scenario::parse(r#"{"failedCalls": ["temperature read failed"]}"#).unwrap_err();
        assert!(err.contains("not `device <index>"), "{err}");
    }

    #[test]
    fn xid_events_are_keyed_by_id_else_position_and_typos_are_refused() {
        let scenario =
            Scenario::parse(r#"{"xidEvents": [{"xid": 79, "gpuUuid": "GPU-a"}, {"id": 9, "xid": 48}]}"#)
                .unwrap();
        let keys: Vec<(u64, u64)> = scenario.xids().iter().map(|xid| (xid.key, xid.xid)).collect();
        assert_eq!(keys, [(0, 79), (9, 48)]);
        assert!(Scenario::parse(r#"{"gpu": []}"#).is_err());
        assert!(
            Scenario::parse(r#"{"gpus": [{"index": 0, "uuid": "a", "pciBusId": "b", "temp": 3}]}"#).is_err()
        );
    }

    #[test]
    fn kernel_log_lines_are_accepted_and_answer_no_nvml_call() {
        let scenario = Scenario::parse(
            r#"{"gpus": [], "kernelLog": ["3,1,5000000,-;NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus."]}"#,
        )
        .unwrap();
        assert!(scenario.xids().is_empty());
        assert!(Scenario::parse(r#"{"kernelLog": "not a list"}"#).is_err());
    }

    #[test]
    fn every_agent_fixture_parses() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../agent/tests/fixtures");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            Scenario::parse(&text).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
            seen += 1;
        }
        assert!(seen >= 7, "the agent's fixtures were found");
    }
}

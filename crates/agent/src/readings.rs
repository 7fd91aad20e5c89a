//! What a probe read from the GPUs at one moment: the recorded form every probe produces and every
//! decision consumes. It is serde-friendly on purpose: the `file` probe reads it from JSON, and unit
//! tests replay recorded readings from fixtures.

use serde::{Deserialize, Serialize};

pub mod mig;
pub mod nvlink;

/// One read of every GPU on the host, plus the XID events that arrived since the previous read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    /// The number of GPUs the driver reports (`nvmlDeviceGetCount`).
    pub device_count: u32,
    /// One entry per device index that answered, in index order.
    #[serde(default)]
    pub gpus: Vec<GpuReading>,
    /// Device indices the driver counts but that answered `GPU_IS_LOST`: fallen off the bus.
    #[serde(default)]
    pub lost_indices: Vec<u32>,
    /// Device indices whose handle NVML failed to give for another reason: the detector cannot
    /// tell whether they are healthy (listed in `failed_calls` too).
    #[serde(default)]
    pub unreadable_indices: Vec<u32>,
    /// XID events delivered since the previous snapshot.
    #[serde(default)]
    pub xid_events: Vec<XidEvent>,
    /// NVML calls that failed unexpectedly while reading (not `NotSupported`): a detector fault,
    /// never evidence that a GPU is broken.
    #[serde(default)]
    pub failed_calls: Vec<String>,
    /// When the probe took it (rates and graces count from here); `None` in recorded readings,
    /// where nothing time-based is decided.
    #[serde(skip)]
    pub taken_at: Option<std::time::Instant>,
}

/// The readings of one GPU. A field is `None` when the GPU does not support it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuReading {
    /// NVML device index.
    pub index: u32,
    /// `GPU-xxxxxxxx-...`, stable across reboots.
    pub uuid: String,
    /// PCI bus id, e.g. `00000000:3B:00.0`.
    pub pci_bus_id: String,
    /// Product name, e.g. `NVIDIA H100 80GB HBM3`.
    #[serde(default)]
    pub name: String,
    /// Board serial number (`nvmlDeviceGetSerial`): the physical board, whichever node holds it.
    /// `None` where the board has none (consumer parts).
    #[serde(default)]
    pub serial: Option<String>,
    /// Board part number (`nvmlDeviceGetBoardPartNumber`).
    #[serde(default)]
    pub board_part_number: Option<String>,
    /// VBIOS version (`nvmlDeviceGetVbiosVersion`).
    #[serde(default)]
    pub vbios_version: Option<String>,
    /// Volatile (since driver load) uncorrectable ECC error count.
    #[serde(default)]
    pub ecc_volatile_uncorrected: Option<u64>,
    /// Row remapper state (Ampere and newer).
    #[serde(default)]
    pub row_remap: Option<RowRemap>,
    /// Whether retired pages wait for a reset to take effect (pre-Ampere; `None` where rows are
    /// remapped instead).
    #[serde(default)]
    pub retired_pages_pending: Option<bool>,
    /// Core temperature in °C.
    #[serde(default)]
    pub temperature_c: Option<u32>,
    /// Temperature at which the GPU starts hardware slowdown, in °C.
    #[serde(default)]
    pub slowdown_threshold_c: Option<u32>,
    /// PCI Express link state.
    #[serde(default)]
    pub pcie: Option<PcieLink>,
    /// The NVLink links the GPU has (a link NVML answers `NotSupported` for is absent, not down).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvlinks: Vec<nvlink::NvLinkReading>,
    /// The NVLink fabric (NVSwitch / Fabric Manager) registration; `None` where the GPU has no
    /// fabric.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<nvlink::FabricReading>,
    /// Its MIG devices, where MIG is enabled (empty otherwise; at most [`mig::MIG_DEVICES_MAX`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig: Vec<mig::MigReading>,
}

/// Row remapper field values (`NVML_FI_DEV_REMAPPED_PENDING`, `NVML_FI_DEV_REMAPPED_FAILURE`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RowRemap {
    /// A row is marked for remapping: the GPU needs a reset to apply it.
    pub pending: bool,
    /// A remap failed: the memory cannot repair itself any more.
    pub failed: bool,
}

/// PCI Express link generation and width, current against maximum, and the replay counter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PcieLink {
    /// Current link generation.
    pub current_gen: u32,
    /// Maximum generation the GPU and slot support.
    pub max_gen: u32,
    /// Current link width (lanes).
    pub current_width: u32,
    /// Maximum link width.
    pub max_width: u32,
    /// Cumulative PCI Express replay counter.
    pub replay_counter: u32,
}

/// One XID event as NVML delivers it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct XidEvent {
    /// The XID code.
    pub xid: u64,
    /// The GPU it was reported on, when NVML could name it.
    #[serde(default)]
    pub gpu_uuid: Option<String>,
    /// The MIG GPU instance the driver attributed it to, on a partitioned GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_instance: Option<u32>,
    /// The MIG compute instance, where the driver names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_instance: Option<u32>,
}

impl GpuReading {
    /// How messages name this GPU: index, UUID and PCI address, so a person can find the board.
    #[must_use]
    pub fn describe(&self) -> String {
        format!("GPU {} (UUID {}, PCI {})", self.index, self.uuid, self.pci_bus_id)
    }
}

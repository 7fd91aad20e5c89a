//! What a probe reads of a GPU's NVLink links (`nvmlDeviceGetNvLinkState`,
//! `nvmlDeviceGetNvLinkErrorCounter`) and of its fabric registration
//! (`nvmlDeviceGetGpuFabricInfo`), in the recorded form both probes produce.

use serde::{Deserialize, Serialize};

/// One NVLink link of a GPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NvLinkReading {
    /// The link number, `0..NVML_NVLINK_MAX_LINKS`.
    pub link: u32,
    /// `NVML_FEATURE_ENABLED`: the link is up.
    pub active: bool,
    /// The link's error counters.
    #[serde(default)]
    pub errors: NvLinkErrors,
}

/// The cumulative error counters of one link; a counter is `None` where the GPU does not count it
/// (or its read failed: then the failure is in `failedCalls`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NvLinkErrors {
    /// `NVML_NVLINK_ERROR_DL_CRC_FLIT`: flow-control digits received with a bad CRC.
    #[serde(default)]
    pub crc_flit: Option<u64>,
    /// `NVML_NVLINK_ERROR_DL_CRC_DATA`: data received with a bad CRC.
    #[serde(default)]
    pub crc_data: Option<u64>,
    /// `NVML_NVLINK_ERROR_DL_REPLAY`: transmissions the link layer replayed.
    #[serde(default)]
    pub replay: Option<u64>,
    /// `NVML_NVLINK_ERROR_DL_RECOVERY`: times the link retrained to recover.
    #[serde(default)]
    pub recovery: Option<u64>,
}

/// Which counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Counter {
    /// CRC flit errors.
    CrcFlit,
    /// CRC data errors.
    CrcData,
    /// Replays.
    Replay,
    /// Recoveries.
    Recovery,
}

impl Counter {
    /// Every counter, in the order messages list them.
    pub const ALL: [Counter; 4] = [
        Counter::CrcFlit,
        Counter::CrcData,
        Counter::Replay,
        Counter::Recovery,
    ];

    /// How messages name it.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Counter::CrcFlit => "CRC flit",
            Counter::CrcData => "CRC data",
            Counter::Replay => "replay",
            Counter::Recovery => "recovery",
        }
    }
}

impl NvLinkErrors {
    /// The value of `counter`, when read.
    #[must_use]
    pub fn get(&self, counter: Counter) -> Option<u64> {
        match counter {
            Counter::CrcFlit => self.crc_flit,
            Counter::CrcData => self.crc_data,
            Counter::Replay => self.replay,
            Counter::Recovery => self.recovery,
        }
    }
}

/// Where the GPU's fabric registration stands (`nvmlGpuFabricState_t`, less `NOT_SUPPORTED`,
/// which reads as no fabric at all).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum FabricState {
    /// `NVML_GPU_FABRIC_STATE_NOT_STARTED`.
    NotStarted,
    /// `NVML_GPU_FABRIC_STATE_IN_PROGRESS`.
    InProgress,
    /// `NVML_GPU_FABRIC_STATE_COMPLETED`.
    Completed,
}

/// The GPU's fabric registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FabricReading {
    /// Where registration stands.
    pub state: FabricState,
    /// The registration's result, an `nvmlReturn_t` (0: success); meaningful once completed.
    #[serde(default)]
    pub status: u32,
}

impl FabricReading {
    /// Registered: completed, successfully.
    #[must_use]
    pub fn is_ready(&self) -> bool {
        self.state == FabricState::Completed && self.status == 0
    }

    /// Completed with a failure: it will not register without help.
    #[must_use]
    pub fn failed(&self) -> bool {
        self.state == FabricState::Completed && self.status != 0
    }
}

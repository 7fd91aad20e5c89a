//! The scenario's NVLink and fabric fields of a GPU (the agent's `nvlink::readings`):
//!
//! ```json
//! "nvlinks": [{"link": 0, "active": true, "errors": {"crcFlit": 0, "crcData": 0, "replay": 0, "recovery": 0}}],
//! "fabric": {"state": "completed", "status": 0}
//! ```
//!
//! - `nvlinks`: `nvmlDeviceGetNvLinkState` answers each listed link (`active`), and
//!   `nvmlDeviceGetNvLinkErrorCounter` its counters (a counter left out is `NOT_SUPPORTED`); a link
//!   not listed is `NOT_SUPPORTED`, as on a GPU without it.
//! - `fabric`: `nvmlDeviceGetGpuFabricInfo` answers its `state` (`notStarted`, `inProgress`,
//!   `completed`) and `status` (an `nvmlReturn_t`); without it, `NOT_SUPPORTED`.
//!
//! A `failedCalls` entry names a link's call with the link in brackets, as the agent reports it:
//! `device 5: nvmlDeviceGetNvLinkState(3): Unknown Error`.

use nvml_wrapper_sys::bindings::{
    NVML_GPU_FABRIC_STATE_COMPLETED, NVML_GPU_FABRIC_STATE_IN_PROGRESS, NVML_GPU_FABRIC_STATE_NOT_STARTED,
    nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_DL_CRC_DATA,
    nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_DL_CRC_FLIT,
    nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_DL_RECOVERY,
    nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_DL_REPLAY, nvmlNvLinkErrorCounter_t,
};
use std::collections::BTreeMap;

use serde::Deserialize;

/// One NVLink link.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NvLink {
    /// The link number.
    pub link: u32,
    /// Up.
    pub active: bool,
    /// Its error counters.
    #[serde(default)]
    pub errors: NvLinkErrors,
}

/// A link's cumulative error counters by name; a counter left out (or `null`) is `NOT_SUPPORTED`.
pub type NvLinkErrors = BTreeMap<Counter, Option<u64>>;

/// The counters NVML names, as the scenario spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Counter {
    /// `NVML_NVLINK_ERROR_DL_CRC_FLIT`.
    CrcFlit,
    /// `NVML_NVLINK_ERROR_DL_CRC_DATA`.
    CrcData,
    /// `NVML_NVLINK_ERROR_DL_REPLAY`.
    Replay,
    /// `NVML_NVLINK_ERROR_DL_RECOVERY`.
    Recovery,
}

/// The value `errors` gives NVML's `counter`; `None` for one it leaves out, or one NVML does not
/// define.
#[must_use]
pub fn counter_value(errors: &NvLinkErrors, counter: nvmlNvLinkErrorCounter_t) -> Option<u64> {
    let named = [
        (
            nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_DL_CRC_FLIT,
            Counter::CrcFlit,
        ),
        (
            nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_DL_CRC_DATA,
            Counter::CrcData,
        ),
        (
            nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_DL_REPLAY,
            Counter::Replay,
        ),
        (
            nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_DL_RECOVERY,
            Counter::Recovery,
        ),
    ]
    .into_iter()
    .find(|(code, _)| *code == counter)?
    .1;
    errors.get(&named).copied().flatten()
}

/// Fabric registration state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum FabricState {
    /// Not started.
    NotStarted,
    /// In progress.
    InProgress,
    /// Completed (with `status`).
    Completed,
}

/// The GPU's fabric registration.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Fabric {
    /// Where it stands.
    pub state: FabricState,
    /// Its result, an `nvmlReturn_t`.
    #[serde(default)]
    pub status: u32,
}

impl Fabric {
    /// `nvmlGpuFabricState_t` of the state.
    #[must_use]
    pub fn state_code(&self) -> u8 {
        let code = match self.state {
            FabricState::NotStarted => NVML_GPU_FABRIC_STATE_NOT_STARTED,
            FabricState::InProgress => NVML_GPU_FABRIC_STATE_IN_PROGRESS,
            FabricState::Completed => NVML_GPU_FABRIC_STATE_COMPLETED,
        };
        u8::try_from(code).unwrap_or(u8::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_answer_by_nvml_code_and_one_left_out_or_null_is_not_supported() {
        let link: NvLink =
            serde_json::from_str(r#"{"link": 3, "active": true, "errors": {"replay": 7, "recovery": null}}"#)
                .unwrap();
        let value = |code| counter_value(&link.errors, code);
        assert_eq!(
            value(nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_DL_REPLAY),
            Some(7)
        );
        assert_eq!(
            value(nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_DL_RECOVERY),
            None
        );
        assert_eq!(
            value(nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_DL_CRC_FLIT),
            None
        );
        assert_eq!(value(99), None, "a counter NVML does not define");
    }

    #[test]
    fn a_misspelt_counter_or_fabric_state_is_refused() {
        assert!(
            serde_json::from_str::<NvLink>(r#"{"link": 0, "active": true, "errors": {"replays": 1}}"#)
                .is_err()
        );
        assert!(serde_json::from_str::<Fabric>(r#"{"state": "done"}"#).is_err());
        let fabric: Fabric = serde_json::from_str(r#"{"state": "inProgress"}"#).unwrap();
        assert_eq!(u32::from(fabric.state_code()), NVML_GPU_FABRIC_STATE_IN_PROGRESS);
    }
}

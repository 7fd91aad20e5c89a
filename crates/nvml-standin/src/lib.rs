//! `libnvml_standin.so`: a stand-in for `libnvidia-ml.so`, so the agent's real NVML probe (and
//! nvml-wrapper underneath it), and the NVIDIA device plugin (v0.18.0, through go-nvml), run in
//! tests on a machine without a GPU. Load it with
//! `gpu-health-agent --probe nvml --nvml-library target/debug/libnvml_standin.so` and name the
//! scenario in `GPU_STANDIN_SCENARIO`: the same JSON file the agent's `file` probe reads,
//! re-read whenever it changes. Where that variable is unset (a pod a Helm chart starts), the
//! scenario is `scenario.json` in the directory the library was loaded from (found with `dladdr`).
//!
//! Exports: init and shutdown (`nvmlInit_v2`, `nvmlInitWithFlags`, `nvmlShutdown`,
//! `nvmlErrorString`, `nvmlSystemGetDriverVersion`); devices (`nvmlDeviceGetCount_v2`,
//! `…GetHandleByIndex_v2`, `…GetHandleByUUID`, `…GetUUID`, `…GetName`, `…GetPciInfo_v3`,
//! `…GetSerial`, `…GetBoardPartNumber`, `…GetVbiosVersion`, `…GetMinorNumber`, `…GetMemoryInfo`,
//! `…GetCudaComputeCapability`, `…GetTopologyCommonAncestor`); health (`…GetTotalEccErrors`,
//! `…GetFieldValues`, `…GetRetiredPagesPendingStatus`, `…GetTemperature`,
//! `…GetTemperatureThreshold`, five PCI Express getters); events (`nvmlEventSetCreate`,
//! `nvmlDeviceGetSupportedEventTypes`, `nvmlDeviceRegisterEvents`, `nvmlEventSetWait_v2`,
//! `nvmlEventSetFree`); NVLink and fabric (`…GetNvLinkState`, `…GetNvLinkErrorCounter`,
//! `…GetNvLinkRemotePciInfo_v2`, `…GetGpuFabricInfo`); MIG (`…GetMigMode`,
//! `…GetMaxMigDeviceCount`, `…GetMigDeviceHandleByIndex`, `…GetGpuInstanceId`,
//! `…GetComputeInstanceId`). Any other NVML function is absent.
//!
//! - [`scenario`]: the file's format and how it becomes NVML answers; [`nvlink`]: its NVLink and
//!   fabric fields; [`mig`]: its MIG devices; [`plugin`]: the fields for the device plugin's calls.
//! - `location`: where the scenario file is found.
//! - `state`: the answers, without raw pointers (init count, handles, event sets, XID delivery);
//!   `lookup`: the answers across GPUs (a handle by UUID, the common ancestor of two).
//! - `ffi`: the exported C functions; the only `unsafe` in the workspace outside its dependencies.
//!
//! This library is for tests only: nothing in it talks to a GPU.

mod ffi;
mod location;
mod lookup;
pub mod mig;
pub mod nvlink;
pub mod plugin;
pub mod scenario;
mod state;

pub use location::{SCENARIO_ENV, SCENARIO_FILE};

//! `nvmlDeviceGetGpuFabricInfo`: the GPU's NVLink fabric registration (NVSwitch / Fabric Manager).
//! A library without the symbol (a driver older than R525) answers
//! [`NvmlError::FailedToLoadSymbol`], as nvml-wrapper's own methods do.

use nvml_wrapper::{
    Device,
    error::{NvmlError, nvml_sym, nvml_try},
};
use nvml_wrapper_sys::bindings::{
    NVML_GPU_FABRIC_STATE_COMPLETED, NVML_GPU_FABRIC_STATE_IN_PROGRESS, NVML_GPU_FABRIC_STATE_NOT_STARTED,
    NVML_GPU_FABRIC_STATE_NOT_SUPPORTED, nvmlGpuFabricInfo_t,
};

/// Where the GPU's fabric registration stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FabricState {
    /// `NVML_GPU_FABRIC_STATE_NOT_SUPPORTED`: the GPU has no fabric.
    NotSupported,
    /// `NVML_GPU_FABRIC_STATE_NOT_STARTED`.
    NotStarted,
    /// `NVML_GPU_FABRIC_STATE_IN_PROGRESS`.
    InProgress,
    /// `NVML_GPU_FABRIC_STATE_COMPLETED`.
    Completed,
}

/// The fabric's answer for one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FabricInfo {
    /// Where registration stands.
    pub state: FabricState,
    /// The registration's result (`nvmlReturn_t`, 0 for success); meaningful once completed.
    pub status: u32,
}

/// `nvmlDeviceGetGpuFabricInfo` on `device`. A state NVML does not define is
/// [`NvmlError::UnexpectedVariant`].
pub fn gpu_fabric_info(device: &Device<'_>) -> Result<FabricInfo, NvmlError> {
    let sym = nvml_sym(device.nvml().lib().nvmlDeviceGetGpuFabricInfo.as_ref())?;
    let mut info = nvmlGpuFabricInfo_t {
        clusterUuid: [0; 16],
        status: 0,
        cliqueId: 0,
        state: 0,
    };
    // SAFETY: `sym` is the library's `nvmlDeviceGetGpuFabricInfo`, whose C signature the binding
    // states; the handle is a live device handle of that library (borrowed from `device`, which
    // cannot outlive its `Nvml`), and `info` is a properly aligned, initialised struct of the type
    // the function writes.
    let code = unsafe { sym(device.handle(), &raw mut info) };
    nvml_try(code)?;
    let state = match u32::from(info.state) {
        NVML_GPU_FABRIC_STATE_NOT_SUPPORTED => FabricState::NotSupported,
        NVML_GPU_FABRIC_STATE_NOT_STARTED => FabricState::NotStarted,
        NVML_GPU_FABRIC_STATE_IN_PROGRESS => FabricState::InProgress,
        NVML_GPU_FABRIC_STATE_COMPLETED => FabricState::Completed,
        other => return Err(NvmlError::UnexpectedVariant(other)),
    };
    Ok(FabricInfo {
        state,
        status: info.status,
    })
}

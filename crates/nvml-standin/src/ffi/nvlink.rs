//! The exported NVLink and fabric functions (see `crate::nvlink` for what they answer), under the
//! contract of the parent module.

use std::ffi::{c_uint, c_ulonglong};

use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlEnableState_enum_NVML_FEATURE_DISABLED, nvmlEnableState_enum_NVML_FEATURE_ENABLED,
    nvmlEnableState_t, nvmlGpuFabricInfo_t, nvmlNvLinkErrorCounter_t, nvmlReturn_t,
};

use super::{answer, field};

/// `nvmlDeviceGetNvLinkState`: `NOT_SUPPORTED` for a link the scenario does not list.
///
/// # Safety
/// See the module's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    device: nvmlDevice_t,
    link: c_uint,
    is_active: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    let state = field(device, &format!("nvmlDeviceGetNvLinkState({link})"), |gpu| {
        gpu.nvlinks
            .iter()
            .find(|listed| listed.link == link)
            .map(|listed| {
                if listed.active {
                    nvmlEnableState_enum_NVML_FEATURE_ENABLED
                } else {
                    nvmlEnableState_enum_NVML_FEATURE_DISABLED
                }
            })
    });
    // SAFETY: forwarded from the caller's contract.
    unsafe { answer(is_active, state) }
}

/// `nvmlDeviceGetNvLinkErrorCounter`: `NOT_SUPPORTED` for a link or counter the scenario leaves
/// out.
///
/// # Safety
/// See the module's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkErrorCounter(
    device: nvmlDevice_t,
    link: c_uint,
    counter: nvmlNvLinkErrorCounter_t,
    value: *mut c_ulonglong,
) -> nvmlReturn_t {
    let count = field(
        device,
        &format!("nvmlDeviceGetNvLinkErrorCounter({link})"),
        |gpu| {
            gpu.nvlinks
                .iter()
                .find(|listed| listed.link == link)
                .and_then(|listed| crate::nvlink::counter_value(&listed.errors, counter))
        },
    );
    // SAFETY: forwarded from the caller's contract.
    unsafe { answer(value, count) }
}

/// `nvmlDeviceGetGpuFabricInfo`: `NOT_SUPPORTED` without a `fabric`.
///
/// # Safety
/// See the module's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuFabricInfo(
    device: nvmlDevice_t,
    info: *mut nvmlGpuFabricInfo_t,
) -> nvmlReturn_t {
    let fabric = field(device, "nvmlDeviceGetGpuFabricInfo", |gpu| {
        gpu.fabric.map(|fabric| nvmlGpuFabricInfo_t {
            clusterUuid: [0; 16],
            status: fabric.status,
            cliqueId: 0,
            state: fabric.state_code(),
        })
    });
    // SAFETY: forwarded from the caller's contract.
    unsafe { answer(info, fabric) }
}

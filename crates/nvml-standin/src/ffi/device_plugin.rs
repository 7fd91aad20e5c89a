//! The exported functions the NVIDIA device plugin calls beyond the agent's (see `crate::plugin`
//! for what they answer), under the contract of the parent module.

use std::ffi::{CStr, c_char, c_int, c_uint};

use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlGpuTopologyLevel_t, nvmlMemory_t, nvmlPciInfo_t,
    nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT, nvmlReturn_enum_NVML_SUCCESS, nvmlReturn_t,
};

use super::{answer, field, pci_info, standin};
use crate::plugin::{NVSWITCH_BUS_ID, TopologyLevel};

/// `nvmlDeviceGetMinorNumber`: the scenario's `minorNumber`, else the GPU's `index`.
///
/// # Safety
/// See the module's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(device: nvmlDevice_t, minor: *mut c_uint) -> nvmlReturn_t {
    let answered = field(device, "nvmlDeviceGetMinorNumber", |gpu| {
        Some(gpu.minor_number.unwrap_or(gpu.index))
    });
    // SAFETY: forwarded from the caller's contract.
    unsafe { answer(minor, answered) }
}

/// `nvmlDeviceGetMemoryInfo`: the scenario's `memory`, else 80 GiB, all free.
///
/// # Safety
/// See the module's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    let answered = field(device, "nvmlDeviceGetMemoryInfo", |gpu| {
        let stated = gpu.memory.unwrap_or_default();
        Some(nvmlMemory_t {
            total: stated.total_bytes,
            free: stated.free_bytes(),
            used: stated.used_bytes,
        })
    });
    // SAFETY: forwarded from the caller's contract.
    unsafe { answer(memory, answered) }
}

/// `nvmlDeviceGetCudaComputeCapability`: the scenario's `cudaComputeCapability`, else 9.0.
///
/// # Safety
/// See the module's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> nvmlReturn_t {
    if minor.is_null() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    let capability = field(device, "nvmlDeviceGetCudaComputeCapability", |gpu| {
        Some(gpu.cuda_compute_capability.unwrap_or_default())
    });
    // SAFETY: forwarded from the caller's contract.
    let code = unsafe { answer(major, capability.map(|capability| capability.major)) };
    if let (true, Ok(capability)) = (code == nvmlReturn_enum_NVML_SUCCESS, capability) {
        // SAFETY: `minor` is not null, and the caller guarantees it is valid for a write.
        unsafe { minor.write(capability.minor) };
    }
    code
}

/// `nvmlDeviceGetHandleByUUID`: the GPU or MIG device with that UUID; `NVML_ERROR_NOT_FOUND` where
/// none has it, `NVML_ERROR_INVALID_ARGUMENT` for a UUID that is not UTF-8.
///
/// # Safety
/// See the module's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    if uuid.is_null() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: `uuid` is not null, and the caller guarantees it is a NUL-terminated string that
    // outlives the call.
    let uuid = unsafe { CStr::from_ptr(uuid) };
    let handle = uuid
        .to_str()
        .map_err(|_| nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)
        .and_then(|uuid| standin().handle_by_uuid(uuid))
        .map(|handle| std::ptr::without_provenance_mut(handle.encode()));
    // SAFETY: forwarded from the caller's contract.
    unsafe { answer(device, handle) }
}

/// `nvmlDeviceGetTopologyCommonAncestor`: what the scenario's `topology` says of the two GPUs,
/// else `NVML_TOPOLOGY_SYSTEM`; `NVML_TOPOLOGY_INTERNAL` for a GPU with itself.
///
/// # Safety
/// See the module's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTopologyCommonAncestor(
    device1: nvmlDevice_t,
    device2: nvmlDevice_t,
    path_info: *mut nvmlGpuTopologyLevel_t,
) -> nvmlReturn_t {
    let level = standin()
        .common_ancestor(device1.addr(), device2.addr())
        .map(TopologyLevel::code);
    // SAFETY: forwarded from the caller's contract.
    unsafe { answer(path_info, level) }
}

/// `nvmlDeviceGetNvLinkRemotePciInfo_v2`: for a link the scenario lists active, the bus id its
/// `nvlinkRemoteBusIds` gives, else an NVSwitch's; `NOT_SUPPORTED` for any other link.
///
/// # Safety
/// See the module's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo_v2(
    device: nvmlDevice_t,
    link: c_uint,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    let function = format!("nvmlDeviceGetNvLinkRemotePciInfo({link})");
    let info = field(device, &function, |gpu| {
        let active = gpu
            .nvlinks
            .iter()
            .any(|listed| listed.link == link && listed.active);
        let remote = gpu.nvlink_remote_bus_ids.get(&link);
        active.then(|| pci_info(remote.map_or(NVSWITCH_BUS_ID, String::as_str)))?
    });
    // SAFETY: forwarded from the caller's contract.
    unsafe { answer(pci, info) }
}

//! The exported MIG functions (see `crate::mig` for what they answer), and `nvmlDeviceGetName`,
//! which answers for a GPU and for a MIG device, under the contract of the parent module.

use std::ffi::{c_char, c_uint};

use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT, nvmlReturn_enum_NVML_SUCCESS, nvmlReturn_t,
};

use super::{answer, answer_text, field, standin};
use crate::state::Handle;

/// `nvmlDeviceGetName`, of a GPU or of a MIG device.
///
/// # Safety
/// See the module's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    let text = if let Some(Handle::Mig { .. }) = Handle::decode(device.addr()) {
        standin().with_mig(device.addr(), "nvmlDeviceGetName", |mig| Ok(mig.name.clone()))
    } else {
        field(device, "nvmlDeviceGetName", |gpu| Some(gpu.name.clone()))
    };
    // SAFETY: forwarded from the caller's contract.
    unsafe { answer_text(name, length, text) }
}
/// `nvmlDeviceGetMigMode`: enabled where the scenario lists MIG devices.
///
/// # Safety
/// See the module's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> nvmlReturn_t {
    if pending.is_null() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    let mode = standin().mig_mode(device.addr());
    // SAFETY: forwarded from the caller's contract.
    let code = unsafe { answer(current, mode.map(|(current, _)| current)) };
    if let (true, Ok((_, next))) = (code == nvmlReturn_enum_NVML_SUCCESS, mode) {
        // SAFETY: `pending` is not null, and the caller guarantees it is valid for a write.
        unsafe { pending.write(next) };
    }
    code
}

/// `nvmlDeviceGetMaxMigDeviceCount`.
///
/// # Safety
/// See the module's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: nvmlDevice_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: forwarded from the caller's contract.
    unsafe { answer(count, standin().max_mig_devices(device.addr())) }
}

/// `nvmlDeviceGetMigDeviceHandleByIndex`.
///
/// # Safety
/// See the module's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nvmlDevice_t,
    index: c_uint,
    mig: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    let handle = standin()
        .mig_handle(device.addr(), index)
        .map(|handle| std::ptr::without_provenance_mut(handle.encode()));
    // SAFETY: forwarded from the caller's contract.
    unsafe { answer(mig, handle) }
}

/// `nvmlDeviceGetGpuInstanceId` of a MIG device.
///
/// # Safety
/// See the module's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(device: nvmlDevice_t, id: *mut c_uint) -> nvmlReturn_t {
    let answered = standin().with_mig(device.addr(), "nvmlDeviceGetGpuInstanceId", |mig| {
        Ok(mig.gpu_instance)
    });
    // SAFETY: forwarded from the caller's contract.
    unsafe { answer(id, answered) }
}

/// `nvmlDeviceGetComputeInstanceId` of a MIG device.
///
/// # Safety
/// See the module's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    let answered = standin().with_mig(device.addr(), "nvmlDeviceGetComputeInstanceId", |mig| {
        Ok(mig.compute_instance)
    });
    // SAFETY: forwarded from the caller's contract.
    unsafe { answer(id, answered) }
}

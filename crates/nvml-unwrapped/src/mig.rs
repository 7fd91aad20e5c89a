//! The GPU instance and compute instance of a MIG device handle (from
//! `Device::mig_device_by_index`): what a driver's XID names the device by.

use nvml_wrapper::{
    Device,
    error::{NvmlError, nvml_sym, nvml_try},
};

/// `nvmlDeviceGetGpuInstanceId` of the MIG device `device`.
pub fn gpu_instance_id(device: &Device<'_>) -> Result<u32, NvmlError> {
    let sym = nvml_sym(device.nvml().lib().nvmlDeviceGetGpuInstanceId.as_ref())?;
    let mut id: u32 = 0;
    // SAFETY: `sym` is the library's `nvmlDeviceGetGpuInstanceId(nvmlDevice_t, unsigned int *)`, as
    // the binding states; the handle is a live device handle of that library (borrowed from
    // `device`, which cannot outlive its `Nvml`), and `id` is a valid, aligned `unsigned int`.
    let code = unsafe { sym(device.handle(), &raw mut id) };
    nvml_try(code)?;
    Ok(id)
}

/// `nvmlDeviceGetComputeInstanceId` of the MIG device `device`.
pub fn compute_instance_id(device: &Device<'_>) -> Result<u32, NvmlError> {
    let sym = nvml_sym(device.nvml().lib().nvmlDeviceGetComputeInstanceId.as_ref())?;
    let mut id: u32 = 0;
    // SAFETY: as in `gpu_instance_id`, for `nvmlDeviceGetComputeInstanceId(nvmlDevice_t,
    // unsigned int *)`.
    let code = unsafe { sym(device.handle(), &raw mut id) };
    nvml_try(code)?;
    Ok(id)
}

//! `nvmlEventSetWait_v2` with the whole event: nvml-wrapper's `EventSet::wait` returns the device,
//! the type and the XID, and drops `gpuInstanceId` and `computeInstanceId`, which on a
//! MIG-partitioned GPU say which MIG device the XID concerns.

use nvml_wrapper::{
    Device, EventSet, Nvml,
    bitmasks::event::EventTypes,
    error::{NvmlError, nvml_sym, nvml_try},
};
use nvml_wrapper_sys::bindings::nvmlEventData_t;

/// What NVML writes in an instance field that does not apply (`0xFFFFFFFF`).
const NO_INSTANCE: u32 = u32::MAX;

/// One event as NVML delivers it.
#[derive(Debug)]
pub struct Event<'nvml> {
    /// The GPU it was raised on (the parent GPU, for a MIG device's event).
    pub device: Device<'nvml>,
    /// Its type.
    pub event_type: EventTypes,
    /// The event's data: the XID, for a critical XID event (999: unknown).
    pub data: u64,
    /// The MIG GPU instance, where the driver attributed it to one.
    pub gpu_instance: Option<u32>,
    /// The MIG compute instance, where the driver attributed it to one.
    pub compute_instance: Option<u32>,
}

/// Waits up to `timeout_ms` for the next event of `set`, created from `nvml`.
pub fn wait<'nvml>(
    set: &EventSet<'nvml>,
    nvml: &'nvml Nvml,
    timeout_ms: u32,
) -> Result<Event<'nvml>, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlEventSetWait_v2.as_ref())?;
    let mut data = nvmlEventData_t {
        device: std::ptr::null_mut(),
        eventType: 0,
        eventData: 0,
        gpuInstanceId: NO_INSTANCE,
        computeInstanceId: NO_INSTANCE,
    };
    // SAFETY: `sym` is the library's `nvmlEventSetWait_v2(nvmlEventSet_t, nvmlEventData_t *,
    // unsigned int)`, as the binding states; `set.handle()` is the live set `set` owns (it is only
    // read, never freed or copied into another `EventSet`), and `data` is an initialised, aligned
    // struct of the type the function writes.
    let code = unsafe { sym(set.handle(), &raw mut data, timeout_ms) };
    nvml_try(code)?;
    let instance = |id: u32| (id != NO_INSTANCE).then_some(id);
    Ok(Event {
        // SAFETY: NVML wrote a device handle of `nvml`'s library into `data.device` (it names the
        // device the event was raised on), and the `Device` borrows `nvml`, so it cannot outlive it.
        device: unsafe { Device::new(data.device, nvml) },
        event_type: EventTypes::from_bits_truncate(data.eventType),
        data: data.eventData,
        gpu_instance: instance(data.gpuInstanceId),
        compute_instance: instance(data.computeInstanceId),
    })
}

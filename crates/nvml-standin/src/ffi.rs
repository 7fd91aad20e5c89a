//! The exported NVML C functions: each takes the caller's arguments, asks [`StandIn`] and copies
//! the answer into the caller's out-parameters. This is the only place raw pointers are touched.
//!
//! nvml-wrapper binds symbols lazily (each is a `Result` resolved at load, failing only when that
//! function is called), so only the functions the agent calls are here; any other NVML function is
//! absent and reads as `FailedToLoadSymbol` in the caller.
//!
//! Contract for every function (as NVML's): pointer arguments are either null (answered
//! `NVML_ERROR_INVALID_ARGUMENT`) or valid for writes of the pointed type, a `(buffer, length)`
//! pair is valid for `length` bytes, and a `const char *` is a NUL-terminated string.
#![allow(non_snake_case, reason = "NVML's exported names")]

mod device_plugin;
mod library;
mod mig;
mod nvlink;

use std::{
    ffi::{c_char, c_int, c_uint, c_ulonglong},
    sync::OnceLock,
    time::Duration,
};

use nvml_wrapper_sys::bindings::{
    field_id::{NVML_FI_DEV_REMAPPED_FAILURE, NVML_FI_DEV_REMAPPED_PENDING},
    nvmlDevice_t, nvmlEccCounterType_enum_NVML_VOLATILE_ECC, nvmlEccCounterType_t,
    nvmlEnableState_enum_NVML_FEATURE_DISABLED, nvmlEnableState_enum_NVML_FEATURE_ENABLED, nvmlEnableState_t,
    nvmlEventData_t, nvmlEventSet_t, nvmlFieldValue_t,
    nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvmlMemoryErrorType_t, nvmlPciInfo_t,
    nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE, nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
    nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED, nvmlReturn_enum_NVML_SUCCESS, nvmlReturn_t,
    nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU, nvmlTemperatureSensors_t,
    nvmlTemperatureThresholds_enum_NVML_TEMPERATURE_THRESHOLD_SLOWDOWN, nvmlTemperatureThresholds_t,
    nvmlValue_t, nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT,
};

use crate::{
    location::{SCENARIO_ENV, scenario_path},
    scenario::{Gpu, message_of},
    state::{StandIn, XID_EVENT_TYPE},
};

/// What NVML writes in an event's instance field that does not apply.
const NO_INSTANCE: c_uint = c_uint::MAX;

/// The process's stand-in, reading the scenario named by `GPU_STANDIN_SCENARIO`, else the one
/// beside this library (`crate::location`).
fn standin() -> &'static StandIn {
    static STANDIN: OnceLock<StandIn> = OnceLock::new();
    STANDIN.get_or_init(|| {
        let library = library::own_path();
        StandIn::new(scenario_path(std::env::var_os(SCENARIO_ENV), library.as_deref()))
    })
}

/// The driver version the stand-in reports: not a real driver's, so nothing mistakes it for one.
const DRIVER_VERSION: &str = "0.0-nvml-standin";

const NOT_SUPPORTED: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;

fn code(result: Result<(), nvmlReturn_t>) -> nvmlReturn_t {
    result.err().unwrap_or(nvmlReturn_enum_NVML_SUCCESS)
}

/// Writes `result`'s value through `out`.
///
/// # Safety
/// `out` is null or valid for a write of `T`.
unsafe fn answer<T>(out: *mut T, result: Result<T, nvmlReturn_t>) -> nvmlReturn_t {
    if out.is_null() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    match result {
        Ok(value) => {
            // SAFETY: `out` is not null, and the caller guarantees it is valid for a write of `T`.
            unsafe { out.write(value) };
            nvmlReturn_enum_NVML_SUCCESS
        }
        Err(code) => code,
    }
}

/// Copies `result`'s text, NUL-terminated, into `buffer` of `length` bytes.
///
/// # Safety
/// `buffer` is null or valid for writes of `length` bytes.
unsafe fn answer_text(
    buffer: *mut c_char,
    length: c_uint,
    result: Result<String, nvmlReturn_t>,
) -> nvmlReturn_t {
    if buffer.is_null() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    let text = match result {
        Ok(text) => text,
        Err(code) => return code,
    };
    let bytes = text.as_bytes();
    if bytes.len() + 1 > length as usize {
        return nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
    }
    // SAFETY: the caller guarantees `buffer` is valid for `length` bytes, and `bytes.len() + 1`
    // (the text and its NUL) fits in `length`; a Rust string never overlaps the caller's buffer.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), buffer, bytes.len());
        buffer.add(bytes.len()).write(0);
    }
    nvmlReturn_enum_NVML_SUCCESS
}

/// A field of the GPU, or `NOT_SUPPORTED` when the scenario leaves it out.
fn field<T>(
    device: nvmlDevice_t,
    function: &str,
    read: impl FnOnce(&Gpu) -> Option<T>,
) -> Result<T, nvmlReturn_t> {
    standin().with_gpu(device.addr(), function, |gpu| read(gpu).ok_or(NOT_SUPPORTED))
}

/// `nvmlInit_v2`. Fails with the scenario's `nvmlError`.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    code(standin().init())
}

/// `nvmlInitWithFlags`: as `nvmlInit_v2` (no flag changes what the stand-in does).
#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    code(standin().init())
}

/// `nvmlShutdown`.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    code(standin().shutdown())
}

/// `nvmlErrorString`: a static NUL-terminated text.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    static TEXTS: OnceLock<Vec<(nvmlReturn_t, std::ffi::CString)>> = OnceLock::new();
    let texts = TEXTS.get_or_init(|| {
        (0..=20)
            .chain([999])
            .map(|code| (code, std::ffi::CString::new(message_of(code)).unwrap_or_default()))
            .collect()
    });
    texts
        .iter()
        .find(|(code, _)| *code == result)
        .or_else(|| texts.last())
        .map_or(c"Unknown Error".as_ptr(), |(_, text)| text.as_ptr())
}

/// `nvmlSystemGetDriverVersion`.
///
/// # Safety
/// See the module's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> nvmlReturn_t {
    // SAFETY: forwarded from the caller's contract.
    unsafe { answer_text(version, length, Ok(DRIVER_VERSION.to_owned())) }
}

/// `nvmlDeviceGetCount_v2`. Blocks for the scenario's `hangSeconds`.
///
/// # Safety
/// See the module's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: forwarded from the caller's contract.
    unsafe { answer(count, standin().device_count()) }
}

/// `nvmlDeviceGetHandleByIndex_v2`.
///
/// # Safety
/// See the module's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    let handle = standin()
        .handle_by_index(index)
        .map(|handle| std::ptr::without_provenance_mut(handle.encode()));
    // SAFETY: forwarded from the caller's contract.
    unsafe { answer(device, handle) }
}

macro_rules! text_getter {
    ($(#[$doc:meta])* $name:ident, $read:expr) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// See the module's contract.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(device: nvmlDevice_t, buffer: *mut c_char, length: c_uint) -> nvmlReturn_t {
            let read: fn(&Gpu) -> Option<String> = $read;
            let text = field(device, stringify!($name), read);
            // SAFETY: forwarded from the caller's contract.
            unsafe { answer_text(buffer, length, text) }
        }
    };
}

/// `nvmlDeviceGetUUID`, which also names the device of an XID event.
///
/// # Safety
/// See the module's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    // SAFETY: forwarded from the caller's contract.
    unsafe { answer_text(uuid, length, standin().uuid(device.addr())) }
}

text_getter!(
    /// `nvmlDeviceGetSerial`: `NOT_SUPPORTED` without a `serial`.
    nvmlDeviceGetSerial,
    |gpu| gpu.serial.clone()
);
text_getter!(
    /// `nvmlDeviceGetBoardPartNumber`: `NOT_SUPPORTED` without a `boardPartNumber`.
    nvmlDeviceGetBoardPartNumber,
    |gpu| gpu.board_part_number.clone()
);
text_getter!(
    /// `nvmlDeviceGetVbiosVersion`: `NOT_SUPPORTED` without a `vbiosVersion`.
    nvmlDeviceGetVbiosVersion,
    |gpu| gpu.vbios_version.clone()
);

/// `nvmlDeviceGetPciInfo_v3`: the bus id (domain, bus and device parsed from it when they parse).
///
/// # Safety
/// See the module's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    let info = field(device, "nvmlDeviceGetPciInfo", |gpu| pci_info(&gpu.pci_bus_id));
    // SAFETY: forwarded from the caller's contract.
    unsafe { answer(pci, info) }
}

/// `nvmlPciInfo_t` for a bus id such as `00000000:18:00.0`; `None` if it does not fit the struct.
fn pci_info(bus_id: &str) -> Option<nvmlPciInfo_t> {
    let mut info = nvmlPciInfo_t {
        busIdLegacy: [0; 16],
        domain: 0,
        bus: 0,
        device: 0,
        pciDeviceId: 0,
        pciSubSystemId: 0,
        busId: [0; 32],
    };
    if bus_id.len() >= info.busId.len() {
        return None;
    }
    for (slot, byte) in info.busId.iter_mut().zip(bus_id.bytes()) {
        *slot = byte.cast_signed();
    }
    for (slot, byte) in info.busIdLegacy.iter_mut().take(15).zip(bus_id.bytes()) {
        *slot = byte.cast_signed();
    }
    let mut parts = bus_id.split([':', '.']);
    let mut hex = || parts.next().and_then(|part| u32::from_str_radix(part, 16).ok());
    if let (Some(domain), Some(bus), Some(device)) = (hex(), hex(), hex()) {
        (info.domain, info.bus, info.device) = (domain, bus, device);
    }
    Some(info)
}

/// `nvmlDeviceGetTotalEccErrors`: the volatile uncorrected count; other counters `NOT_SUPPORTED`.
///
/// # Safety
/// See the module's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: nvmlDevice_t,
    error_type: nvmlMemoryErrorType_t,
    counter_type: nvmlEccCounterType_t,
    count: *mut c_ulonglong,
) -> nvmlReturn_t {
    let value = field(device, "nvmlDeviceGetTotalEccErrors", |gpu| {
        (error_type == nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_UNCORRECTED
            && counter_type == nvmlEccCounterType_enum_NVML_VOLATILE_ECC)
            .then_some(gpu.ecc_volatile_uncorrected)
            .flatten()
    });
    // SAFETY: forwarded from the caller's contract.
    unsafe { answer(count, value) }
}

/// `nvmlDeviceGetFieldValues`: the row remapper's pending and failure fields; any other field (and
/// these without `rowRemap`) is `NOT_SUPPORTED` in its own entry.
///
/// # Safety
/// See the module's contract; `values` is valid for reads and writes of `count` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: nvmlDevice_t,
    count: c_int,
    values: *mut nvmlFieldValue_t,
) -> nvmlReturn_t {
    let Ok(count) = usize::try_from(count) else {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    };
    if values.is_null() || count == 0 {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    let remap = match standin().with_gpu(device.addr(), "nvmlDeviceGetFieldValues", |gpu| Ok(gpu.row_remap)) {
        Ok(remap) => remap,
        Err(code) => return code,
    };
    // SAFETY: `values` is not null and the caller guarantees it holds `count` initialised entries
    // it lends us for reading and writing until we return.
    let values = unsafe { std::slice::from_raw_parts_mut(values, count) };
    for value in values {
        let flag = match value.fieldId {
            NVML_FI_DEV_REMAPPED_PENDING => remap.map(|remap| remap.pending),
            NVML_FI_DEV_REMAPPED_FAILURE => remap.map(|remap| remap.failed),
            _ => None,
        };
        match flag {
            Some(flag) => {
                value.nvmlReturn = nvmlReturn_enum_NVML_SUCCESS;
                value.valueType = nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT;
                value.value = nvmlValue_t {
                    uiVal: c_uint::from(flag),
                };
            }
            None => value.nvmlReturn = NOT_SUPPORTED,
        }
    }
    nvmlReturn_enum_NVML_SUCCESS
}

/// `nvmlDeviceGetRetiredPagesPendingStatus`.
///
/// # Safety
/// See the module's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPagesPendingStatus(
    device: nvmlDevice_t,
    pending: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    let state = field(device, "nvmlDeviceGetRetiredPagesPendingStatus", |gpu| {
        gpu.retired_pages_pending.map(|pending| {
            if pending {
                nvmlEnableState_enum_NVML_FEATURE_ENABLED
            } else {
                nvmlEnableState_enum_NVML_FEATURE_DISABLED
            }
        })
    });
    // SAFETY: forwarded from the caller's contract.
    unsafe { answer(pending, state) }
}

/// `nvmlDeviceGetTemperature`: the GPU core sensor.
///
/// # Safety
/// See the module's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: nvmlDevice_t,
    sensor: nvmlTemperatureSensors_t,
    celsius: *mut c_uint,
) -> nvmlReturn_t {
    let value = field(device, "nvmlDeviceGetTemperature", |gpu| {
        (sensor == nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU)
            .then_some(gpu.temperature_c)
            .flatten()
    });
    // SAFETY: forwarded from the caller's contract.
    unsafe { answer(celsius, value) }
}

/// `nvmlDeviceGetTemperatureThreshold`: the slowdown threshold.
///
/// # Safety
/// See the module's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperatureThreshold(
    device: nvmlDevice_t,
    threshold: nvmlTemperatureThresholds_t,
    celsius: *mut c_uint,
) -> nvmlReturn_t {
    let value = field(device, "nvmlDeviceGetTemperatureThreshold", |gpu| {
        (threshold == nvmlTemperatureThresholds_enum_NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
            .then_some(gpu.slowdown_threshold_c)
            .flatten()
    });
    // SAFETY: forwarded from the caller's contract.
    unsafe { answer(celsius, value) }
}

macro_rules! pcie_getter {
    ($(#[$doc:meta])* $name:ident, $read:expr) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// See the module's contract.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(device: nvmlDevice_t, value: *mut c_uint) -> nvmlReturn_t {
            let read: fn(&crate::scenario::Pcie) -> u32 = $read;
            let answered = field(device, stringify!($name), |gpu| gpu.pcie.as_ref().map(read));
            // SAFETY: forwarded from the caller's contract.
            unsafe { answer(value, answered) }
        }
    };
}

pcie_getter!(
    /// `nvmlDeviceGetCurrPcieLinkGeneration`.
    nvmlDeviceGetCurrPcieLinkGeneration,
    |pcie| pcie.current_gen
);
pcie_getter!(
    /// `nvmlDeviceGetMaxPcieLinkGeneration`.
    nvmlDeviceGetMaxPcieLinkGeneration,
    |pcie| pcie.max_gen
);
pcie_getter!(
    /// `nvmlDeviceGetCurrPcieLinkWidth`.
    nvmlDeviceGetCurrPcieLinkWidth,
    |pcie| pcie.current_width
);
pcie_getter!(
    /// `nvmlDeviceGetMaxPcieLinkWidth`.
    nvmlDeviceGetMaxPcieLinkWidth,
    |pcie| pcie.max_width
);
pcie_getter!(
    /// `nvmlDeviceGetPcieReplayCounter`.
    nvmlDeviceGetPcieReplayCounter,
    |pcie| pcie.replay_counter
);

/// `nvmlEventSetCreate`.
///
/// # Safety
/// See the module's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> nvmlReturn_t {
    let created = standin().create_event_set().map(std::ptr::without_provenance_mut);
    // SAFETY: forwarded from the caller's contract.
    unsafe { answer(set, created) }
}

/// `nvmlDeviceGetSupportedEventTypes`: critical XID errors.
///
/// # Safety
/// See the module's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: nvmlDevice_t,
    types: *mut c_ulonglong,
) -> nvmlReturn_t {
    // SAFETY: forwarded from the caller's contract.
    unsafe { answer(types, standin().supported_event_types(device.addr())) }
}

/// `nvmlDeviceRegisterEvents`.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceRegisterEvents(
    device: nvmlDevice_t,
    types: c_ulonglong,
    set: nvmlEventSet_t,
) -> nvmlReturn_t {
    code(standin().register_events(device.addr(), types, set.addr()))
}

/// `nvmlEventSetWait_v2`: the next XID event of the scenario, or `NVML_ERROR_TIMEOUT`.
///
/// # Safety
/// See the module's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> nvmlReturn_t {
    let event = standin()
        .wait(set.addr(), Duration::from_millis(u64::from(timeout_ms)))
        .map(|event| nvmlEventData_t {
            device: event.device.map_or(std::ptr::null_mut(), |handle| {
                std::ptr::without_provenance_mut(handle.encode())
            }),
            eventType: XID_EVENT_TYPE,
            eventData: event.xid,
            gpuInstanceId: event.gpu_instance.unwrap_or(NO_INSTANCE),
            computeInstanceId: event.compute_instance.unwrap_or(NO_INSTANCE),
        });
    // SAFETY: forwarded from the caller's contract.
    unsafe { answer(data, event) }
}

/// `nvmlEventSetFree`.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> nvmlReturn_t {
    code(standin().free_event_set(set.addr()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(buffer: &[c_char]) -> String {
        let bytes: Vec<u8> = buffer
            .iter()
            .take_while(|c| **c != 0)
            .map(|c| c.cast_unsigned())
            .collect();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn pci_info_carries_the_bus_id_and_its_numbers() {
        let info = pci_info("00000000:3B:00.0").unwrap();
        assert_eq!(text(&info.busId), "00000000:3B:00.0");
        assert_eq!((info.domain, info.bus, info.device), (0, 0x3B, 0));
        assert!(pci_info(&"0".repeat(40)).is_none());
    }

    #[test]
    fn text_answers_are_nul_terminated_and_refuse_a_short_buffer() {
        let mut buffer = [1 as c_char; 8];
        // SAFETY: `buffer` is valid for its 8 bytes.
        let code = unsafe { answer_text(buffer.as_mut_ptr(), 8, Ok("GPU-abc".to_owned())) };
        assert_eq!(code, nvmlReturn_enum_NVML_SUCCESS);
        assert_eq!(text(&buffer), "GPU-abc");
        // SAFETY: as above.
        let code = unsafe { answer_text(buffer.as_mut_ptr(), 8, Ok("GPU-abcd".to_owned())) };
        assert_eq!(code, nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE);
        // SAFETY: a null buffer is refused before any write.
        let code = unsafe { answer_text(std::ptr::null_mut(), 8, Ok(String::new())) };
        assert_eq!(code, nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
    }

    #[test]
    fn error_strings_are_nvmls() {
        let text = |code| {
            // SAFETY: nvmlErrorString returns a static NUL-terminated string.
            unsafe { std::ffi::CStr::from_ptr(nvmlErrorString(code)) }
                .to_str()
                .unwrap()
        };
        assert_eq!(
            text(nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST),
            "GPU is lost"
        );
        assert_eq!(text(12_345), "Unknown Error");
    }
}

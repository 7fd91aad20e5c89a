//! The built `libnvml_standin.so` as the NVIDIA device plugin meets it on a node: copied into a
//! directory as `libnvidia-ml.so.1` with the node's `scenario.json` beside it and no
//! `GPU_STANDIN_SCENARIO` set, loaded through nvml-wrapper-sys's dynamic bindings (by symbol name,
//! as go-nvml binds), and asked what the plugin asks. Each test loads its own copy, so each has its
//! own stand-in state.

use std::{
    ffi::{CStr, c_char, c_uint},
    path::PathBuf,
};

#[path = "support/built.rs"]
mod support;

use nvml_wrapper_sys::bindings::{
    NvmlLib, nvmlDevice_t, nvmlMemory_t, nvmlPciInfo_t, nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
    nvmlReturn_enum_NVML_ERROR_NOT_FOUND, nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
    nvmlReturn_enum_NVML_ERROR_UNKNOWN, nvmlReturn_enum_NVML_SUCCESS, nvmlReturn_t,
};

/// `value` after `call` wrote it, or the code `call` failed with.
fn out<T>(mut value: T, call: impl FnOnce(*mut T) -> nvmlReturn_t) -> Result<T, nvmlReturn_t> {
    let code = call(&raw mut value);
    if code == nvmlReturn_enum_NVML_SUCCESS {
        Ok(value)
    } else {
        Err(code)
    }
}

/// An `nvmlPciInfo_t` for NVML to fill.
fn blank_pci() -> nvmlPciInfo_t {
    nvmlPciInfo_t {
        busIdLegacy: [0; 16],
        domain: 0,
        bus: 0,
        device: 0,
        pciDeviceId: 0,
        pciSubSystemId: 0,
        busId: [0; 32],
    }
}

/// The handle of the device at NVML index `index`.
fn handle(nvml: &NvmlLib, index: c_uint) -> nvmlDevice_t {
    // SAFETY: `device` points at a live handle.
    out(std::ptr::null_mut(), |device| unsafe {
        nvml.nvmlDeviceGetHandleByIndex_v2(index, device)
    })
    .expect("a handle by index")
}

/// Two GPUs speaking for themselves and one left to the defaults.
const SCENARIO: &str = r#"{"gpus": [
    {"index": 0, "uuid": "GPU-a", "pciBusId": "00000000:18:00.0", "name": "NVIDIA H100 80GB HBM3",
     "nvlinks": [{"link": 0, "active": true}, {"link": 1, "active": true}, {"link": 2, "active": false}],
     "nvlinkRemoteBusIds": {"0": "00000000:2A:00.0"}},
    {"index": 1, "uuid": "GPU-b", "pciBusId": "00000000:2A:00.0", "minorNumber": 7,
     "memory": {"totalBytes": 42949672960, "usedBytes": 1073741824},
     "cudaComputeCapability": {"major": 8, "minor": 0}, "topology": {"GPU-a": "node"}},
    {"index": 2, "uuid": "GPU-c", "pciBusId": "00000000:3A:00.0"}]}"#;

/// A copy of the library in a directory of its own, with `scenario` (if any) beside it.
struct Node {
    dir: PathBuf,
    nvml: NvmlLib,
}

impl Node {
    fn new(name: &str, scenario: Option<&str>) -> Self {
        assert!(
            std::env::var_os("GPU_STANDIN_SCENARIO").is_none(),
            "these tests prove the scenario beside the library: run them without GPU_STANDIN_SCENARIO"
        );
        let dir = std::env::temp_dir().join(format!("nvml-standin-beside-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let library = dir.join("libnvidia-ml.so.1");
        std::fs::copy(support::standin_library(), &library).unwrap();
        if let Some(scenario) = scenario {
            std::fs::write(dir.join("scenario.json"), scenario).unwrap();
        }
        // SAFETY: loading runs only Rust's std setup (the stand-in has no initialisers of its own).
        let nvml = unsafe { NvmlLib::new(&library) }.expect("loading the copied stand-in");
        Self { dir, nvml }
    }

    /// As `new`, and `nvmlInit_v2` called.
    fn started(name: &str) -> Self {
        let node = Self::new(name, Some(SCENARIO));
        // SAFETY: no arguments.
        assert_eq!(unsafe { node.nvml.nvmlInit_v2() }, nvmlReturn_enum_NVML_SUCCESS);
        node
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn every_function_the_device_plugin_calls_resolves() {
    let node = Node::new("symbols", None);
    macro_rules! resolved {
        ($($name:ident),* $(,)?) => { [$((stringify!($name), node.nvml.$name.is_ok())),*] };
    }
    // docs/plans/real-node.md §3: start, health, preferred allocation; and the MIG ids.
    let missing: Vec<&str> = resolved!(
        nvmlInit_v2,
        nvmlShutdown,
        nvmlErrorString,
        nvmlDeviceGetCount_v2,
        nvmlDeviceGetHandleByIndex_v2,
        nvmlDeviceGetName,
        nvmlDeviceGetMigMode,
        nvmlDeviceGetUUID,
        nvmlDeviceGetMinorNumber,
        nvmlDeviceGetPciInfo_v3,
        nvmlDeviceGetMemoryInfo,
        nvmlDeviceGetCudaComputeCapability,
        nvmlEventSetCreate,
        nvmlDeviceGetHandleByUUID,
        nvmlDeviceGetSupportedEventTypes,
        nvmlDeviceRegisterEvents,
        nvmlEventSetWait_v2,
        nvmlEventSetFree,
        nvmlDeviceGetTopologyCommonAncestor,
        nvmlDeviceGetNvLinkState,
        nvmlDeviceGetNvLinkRemotePciInfo_v2,
        nvmlDeviceGetGpuInstanceId,
        nvmlDeviceGetComputeInstanceId,
    )
    .into_iter()
    .filter_map(|(name, found)| (!found).then_some(name))
    .collect();
    assert!(missing.is_empty(), "not exported: {missing:?}");
}

#[test]
fn without_the_variable_the_scenario_beside_the_library_answers() {
    let node = Node::started("beside");
    // SAFETY: `count` points at a live u32.
    let count = out(0, |count| unsafe { node.nvml.nvmlDeviceGetCount_v2(count) });
    assert_eq!(count, Ok(3));
}

#[test]
fn without_a_scenario_beside_the_library_init_fails_as_unknown() {
    let node = Node::new("nothing-beside", None);
    // SAFETY: no arguments.
    let code = unsafe { node.nvml.nvmlInit_v2() };
    assert_eq!(code, nvmlReturn_enum_NVML_ERROR_UNKNOWN);
    std::fs::write(node.dir.join("scenario.json"), SCENARIO).unwrap();
    // SAFETY: as above.
    let code = unsafe { node.nvml.nvmlInit_v2() };
    assert_eq!(
        code, nvmlReturn_enum_NVML_SUCCESS,
        "a scenario put there later is read"
    );
}

#[test]
fn minor_number_memory_and_compute_capability_answer_defaults_and_overrides() {
    let node = Node::started("start-calls");
    let nvml = &node.nvml;
    let (first, second) = (handle(nvml, 0), handle(nvml, 1));
    // SAFETY: `minor` points at a live value.
    let minor = |device| out(0, |minor| unsafe { nvml.nvmlDeviceGetMinorNumber(device, minor) });
    assert_eq!(minor(first), Ok(0), "the GPU's index");
    assert_eq!(minor(second), Ok(7), "the scenario's minorNumber");

    let blank = nvmlMemory_t {
        total: 0,
        free: 0,
        used: 0,
    };
    let memory = |device| {
        // SAFETY: `memory` points at a live value.
        out(blank, |memory| unsafe {
            nvml.nvmlDeviceGetMemoryInfo(device, memory)
        })
    };
    let default = memory(first).unwrap();
    assert_eq!(
        (default.total, default.free, default.used),
        (80 << 30, 80 << 30, 0)
    );
    let stated = memory(second).unwrap();
    assert_eq!(
        (stated.total, stated.free, stated.used),
        (40 << 30, 39 << 30, 1 << 30)
    );

    let capability = |device| {
        let mut minor = -1;
        // SAFETY: `major` and `minor` point at live values.
        let major = out(-1, |major| unsafe {
            nvml.nvmlDeviceGetCudaComputeCapability(device, major, &raw mut minor)
        });
        major.map(|major| (major, minor))
    };
    assert_eq!(capability(first), Ok((9, 0)), "Hopper");
    assert_eq!(capability(second), Ok((8, 0)), "the scenario's");

    let mut number = 0;
    // SAFETY: null out-parameters are refused before any write; `number` is live.
    let nulls = unsafe {
        [
            nvml.nvmlDeviceGetMinorNumber(first, std::ptr::null_mut()),
            nvml.nvmlDeviceGetMemoryInfo(first, std::ptr::null_mut()),
            nvml.nvmlDeviceGetCudaComputeCapability(first, std::ptr::null_mut(), &raw mut number),
            nvml.nvmlDeviceGetCudaComputeCapability(first, &raw mut number, std::ptr::null_mut()),
        ]
    };
    assert_eq!(nulls, [nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT; 4]);
}

#[test]
fn a_uuid_finds_its_gpu_and_an_unknown_one_is_not_found() {
    let node = Node::started("uuid");
    let nvml = &node.nvml;
    let by_uuid = |uuid: &CStr| {
        // SAFETY: `uuid` is NUL-terminated and `device` points at a live handle.
        out(std::ptr::null_mut(), |device| unsafe {
            nvml.nvmlDeviceGetHandleByUUID(uuid.as_ptr(), device)
        })
    };
    let device = by_uuid(c"GPU-b").expect("GPU-b is found");
    let mut text = [0 as c_char; 96];
    // SAFETY: `text` is valid for its 96 bytes.
    let code = unsafe { nvml.nvmlDeviceGetUUID(device, text.as_mut_ptr(), 96) };
    assert_eq!(code, nvmlReturn_enum_NVML_SUCCESS);
    // SAFETY: a successful nvmlDeviceGetUUID wrote a NUL-terminated string into `text`.
    let uuid = unsafe { CStr::from_ptr(text.as_ptr()) };
    assert_eq!(uuid, c"GPU-b", "the handle is GPU-b's");
    assert_eq!(device, handle(nvml, 1), "the same handle as by index");

    assert_eq!(by_uuid(c"GPU-zz"), Err(nvmlReturn_enum_NVML_ERROR_NOT_FOUND));
    let mut device = std::ptr::null_mut();
    // SAFETY: null arguments are refused before any read or write; `device` is live.
    let nulls = unsafe {
        [
            nvml.nvmlDeviceGetHandleByUUID(std::ptr::null(), &raw mut device),
            nvml.nvmlDeviceGetHandleByUUID(c"GPU-b".as_ptr(), std::ptr::null_mut()),
        ]
    };
    assert_eq!(nulls, [nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT; 2]);
}

#[test]
fn topology_and_nvlink_remotes_answer_what_the_allocator_reads() {
    let node = Node::started("allocator");
    let nvml = &node.nvml;
    let (first, second, third) = (handle(nvml, 0), handle(nvml, 1), handle(nvml, 2));
    let level = |one, other| {
        // SAFETY: `level` points at a live value.
        out(99, |level| unsafe {
            nvml.nvmlDeviceGetTopologyCommonAncestor(one, other, level)
        })
    };
    assert_eq!(
        level(first, second),
        Ok(40),
        "NVML_TOPOLOGY_NODE, as GPU-b states of GPU-a"
    );
    assert_eq!(level(second, first), Ok(40));
    assert_eq!(level(first, third), Ok(50), "NVML_TOPOLOGY_SYSTEM by default");
    assert_eq!(level(third, third), Ok(0), "NVML_TOPOLOGY_INTERNAL with itself");
    assert_eq!(
        level(first, std::ptr::null_mut()),
        Err(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)
    );
    // SAFETY: a null out-parameter is refused before any write.
    let null = unsafe { nvml.nvmlDeviceGetTopologyCommonAncestor(first, second, std::ptr::null_mut()) };
    assert_eq!(null, nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);

    let remote = |device, link| {
        // SAFETY: `pci` points at a live `nvmlPciInfo_t`.
        out(blank_pci(), |pci| unsafe {
            nvml.nvmlDeviceGetNvLinkRemotePciInfo_v2(device, link, pci)
        })
        .map(|pci| {
            // SAFETY: a successful call wrote a NUL-terminated bus id.
            let bus_id = unsafe { CStr::from_ptr(pci.busId.as_ptr()) };
            (bus_id.to_str().unwrap().to_owned(), pci.bus)
        })
    };
    assert_eq!(
        remote(first, 0),
        Ok(("00000000:2A:00.0".to_owned(), 0x2A)),
        "GPU-b"
    );
    assert_eq!(
        remote(first, 1),
        Ok(("00000000:FF:00.0".to_owned(), 0xFF)),
        "an NVSwitch"
    );
    assert_eq!(
        remote(first, 2),
        Err(nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED),
        "inactive"
    );
    assert_eq!(
        remote(first, 5),
        Err(nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED),
        "not listed"
    );
    assert_eq!(
        remote(second, 0),
        Err(nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED),
        "no NVLink"
    );
    // SAFETY: as above.
    let null = unsafe { nvml.nvmlDeviceGetNvLinkRemotePciInfo_v2(first, 0, std::ptr::null_mut()) };
    assert_eq!(null, nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
}

//! The stand-in's behaviour, free of raw pointers: initialisation count, the scenario (re-read
//! when the file changes), device handles, event sets and XID delivery. Every answer is a
//! `Result<T, nvmlReturn_t>`; `ffi` only copies it into the caller's memory.
//!
//! A device handle names the device the scenario calls `index` (not its NVML position), so a handle
//! taken before a GPU vanished keeps naming the same board and then answers `GPU_IS_LOST`. An XID
//! event naming a UUID the scenario does not list as a GPU (a lost board, say) carries a handle that
//! answers only `nvmlDeviceGetUUID`.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::{Duration, Instant},
};

use nvml_wrapper_sys::bindings::{
    nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST, nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
    nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED, nvmlReturn_enum_NVML_ERROR_TIMEOUT,
    nvmlReturn_enum_NVML_ERROR_UNINITIALIZED, nvmlReturn_enum_NVML_ERROR_UNKNOWN, nvmlReturn_t,
};

use crate::{
    location::{SCENARIO_ENV, SCENARIO_FILE},
    scenario::{FileStamp, Gpu, Scenario, Slot},
};

/// How often a hung call or an event wait looks at the scenario again.
const POLL: Duration = Duration::from_millis(50);

/// The NVML event type the stand-in delivers (`nvmlEventTypeXidCriticalError`).
pub const XID_EVENT_TYPE: u64 = nvml_wrapper_sys::bindings::nvmlEventTypeXidCriticalError as u64;

/// What a device handle names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handle {
    /// The device the scenario gives this index.
    Device(u32),
    /// A UUID only an XID event named (position in the stand-in's list of them).
    EventOnly(u32),
    /// The MIG device in `slot` (its position in the GPU's `mig` list) of the device the scenario
    /// gives index `gpu`.
    Mig {
        /// The parent GPU's index in the file.
        gpu: u32,
        /// The MIG index (`nvmlDeviceGetMigDeviceHandleByIndex`).
        slot: u8,
    },
}

impl Handle {
    /// The handle as the pointer-sized value NVML hands out: never 0. The two low bits say what it
    /// names.
    #[must_use]
    pub fn encode(self) -> usize {
        match self {
            Handle::Device(index) => (index as usize + 1) << 2,
            Handle::EventOnly(index) => ((index as usize + 1) << 2) | 1,
            Handle::Mig { gpu, slot } => ((((gpu as usize + 1) << 8) | usize::from(slot)) << 2) | 2,
        }
    }

    /// The handle `value` encodes, if any.
    #[must_use]
    pub fn decode(value: usize) -> Option<Self> {
        let rest = value >> 2;
        match value & 3 {
            0 => Some(Handle::Device(u32::try_from(rest.checked_sub(1)?).ok()?)),
            1 => Some(Handle::EventOnly(u32::try_from(rest.checked_sub(1)?).ok()?)),
            2 => Some(Handle::Mig {
                gpu: u32::try_from((rest >> 8).checked_sub(1)?).ok()?,
                slot: u8::try_from(rest & 0xff).ok()?,
            }),
            _ => None,
        }
    }
}

/// One event delivered by `nvmlEventSetWait_v2`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveredXid {
    /// The device it names, if any.
    pub device: Option<Handle>,
    /// The XID code.
    pub xid: u64,
    /// The MIG GPU instance it names, if any.
    pub gpu_instance: Option<u32>,
    /// The MIG compute instance it names, if any.
    pub compute_instance: Option<u32>,
}

#[derive(Debug)]
struct Cached {
    path: PathBuf,
    stamp: FileStamp,
    parsed: Result<Arc<Scenario>, String>,
}

#[derive(Debug, Default)]
struct EventSet {
    /// Devices registered for XID events.
    devices: BTreeSet<usize>,
}

/// The whole stand-in library state.
#[derive(Debug)]
pub struct StandIn {
    path: Option<PathBuf>,
    init_count: Mutex<u32>,
    cache: Mutex<Option<Cached>>,
    sets: Mutex<BTreeMap<usize, EventSet>>,
    next_set: Mutex<usize>,
    delivered: Mutex<BTreeSet<u64>>,
    event_only_uuids: Mutex<Vec<String>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl StandIn {
    /// A stand-in reading the scenario at `path` (`None`: every call fails, saying why).
    #[must_use]
    pub fn new(path: Option<PathBuf>) -> Self {
        Self {
            path,
            init_count: Mutex::new(0),
            cache: Mutex::new(None),
            sets: Mutex::default(),
            next_set: Mutex::new(1),
            delivered: Mutex::default(),
            event_only_uuids: Mutex::default(),
        }
    }

    /// The scenario as the file says now, re-read when it changed. A missing or malformed file is
    /// `NVML_ERROR_UNKNOWN`, told on stderr once per version of the file.
    pub fn scenario(&self) -> Result<Arc<Scenario>, nvmlReturn_t> {
        let Some(path) = &self.path else {
            eprintln!(
                "nvml-standin: {SCENARIO_ENV} is not set and the library's own path (for a {SCENARIO_FILE} \
                 beside it) is unknown: no scenario to answer from"
            );
            return Err(nvmlReturn_enum_NVML_ERROR_UNKNOWN);
        };
        let stamp = FileStamp::of(path).map_err(|err| {
            eprintln!("nvml-standin: scenario {}: {err}", path.display());
            nvmlReturn_enum_NVML_ERROR_UNKNOWN
        })?;
        let mut cache = lock(&self.cache);
        let fresh = cache
            .as_ref()
            .is_some_and(|cached| cached.path == *path && cached.stamp == stamp);
        if !fresh {
            let parsed = read(path).map(Arc::new);
            if let Err(err) = &parsed {
                eprintln!("nvml-standin: scenario {}: {err}", path.display());
            }
            *cache = Some(Cached {
                path: path.clone(),
                stamp,
                parsed,
            });
        }
        let cached = cache.as_ref().map(|cached| cached.parsed.clone());
        match cached {
            Some(Ok(scenario)) => Ok(scenario),
            _ => Err(nvmlReturn_enum_NVML_ERROR_UNKNOWN),
        }
    }

    /// `nvmlInit_v2`: counts up, unless the scenario says NVML is unavailable.
    pub fn init(&self) -> Result<(), nvmlReturn_t> {
        let scenario = self.scenario()?;
        if let Some(code) = scenario.nvml_error() {
            return Err(code);
        }
        *lock(&self.init_count) += 1;
        Ok(())
    }

    /// `nvmlShutdown`: counts down.
    pub fn shutdown(&self) -> Result<(), nvmlReturn_t> {
        let mut count = lock(&self.init_count);
        if *count == 0 {
            return Err(nvmlReturn_enum_NVML_ERROR_UNINITIALIZED);
        }
        *count -= 1;
        Ok(())
    }

    /// The scenario, if NVML is initialised.
    pub(crate) fn initialised(&self) -> Result<Arc<Scenario>, nvmlReturn_t> {
        if *lock(&self.init_count) == 0 {
            return Err(nvmlReturn_enum_NVML_ERROR_UNINITIALIZED);
        }
        self.scenario()
    }

    /// `nvmlDeviceGetCount_v2`: blocks while the scenario asks for a hang, then fails if it says
    /// NVML is unavailable.
    pub fn device_count(&self) -> Result<u32, nvmlReturn_t> {
        let started = Instant::now();
        loop {
            let scenario = self.initialised()?;
            if started.elapsed() >= Duration::from_secs(scenario.hang_seconds()) {
                if let Some(code) = scenario.nvml_error() {
                    return Err(code);
                }
                return Ok(scenario.device_count());
            }
            std::thread::sleep(POLL);
        }
    }

    /// `nvmlDeviceGetHandleByIndex_v2`.
    pub fn handle_by_index(&self, index: u32) -> Result<Handle, nvmlReturn_t> {
        let scenario = self.initialised()?;
        match scenario.slot(index) {
            None => Err(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT),
            Some(Slot::Unreadable(_)) => Err(nvmlReturn_enum_NVML_ERROR_UNKNOWN),
            Some(slot) => {
                let declared = slot.declared_index();
                match scenario.injected_failure(declared, "nvmlDeviceGetHandleByIndex") {
                    Some(code) => Err(code),
                    None => Ok(Handle::Device(declared)),
                }
            }
        }
    }

    /// Answers a per-device call `function` from the GPU `handle` names: lost, gone or injected
    /// failures first, then `read`.
    pub fn with_gpu<T>(
        &self,
        handle: usize,
        function: &str,
        read: impl FnOnce(&Gpu) -> Result<T, nvmlReturn_t>,
    ) -> Result<T, nvmlReturn_t> {
        let scenario = self.initialised()?;
        let declared = match Handle::decode(handle) {
            // No handle, or a MIG device's: the stand-in answers those calls in `mig`, and the agent
            // makes no others on one.
            None | Some(Handle::Mig { .. }) => return Err(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT),
            Some(Handle::EventOnly(_)) => return Err(nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST),
            Some(Handle::Device(declared)) => declared,
        };
        let slot = scenario
            .slots()
            .into_iter()
            .find(|slot| slot.declared_index() == declared);
        match slot {
            Some(Slot::Gpu(gpu)) => match scenario.injected_failure(declared, function) {
                Some(code) => Err(code),
                None => read(gpu),
            },
            Some(Slot::Unreadable(_)) => Err(nvmlReturn_enum_NVML_ERROR_UNKNOWN),
            // Lost, or no longer in the scenario at all: fallen off the bus.
            Some(Slot::Lost(_)) | None => Err(nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST),
        }
    }

    /// `nvmlDeviceGetUUID`, which also answers for a UUID only an XID event named.
    pub fn uuid(&self, handle: usize) -> Result<String, nvmlReturn_t> {
        match Handle::decode(handle) {
            Some(Handle::EventOnly(index)) => {
                self.initialised()?;
                return lock(&self.event_only_uuids)
                    .get(index as usize)
                    .cloned()
                    .ok_or(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
            }
            Some(Handle::Mig { .. }) => {
                return self.with_mig(handle, "nvmlDeviceGetUUID", |mig| Ok(mig.uuid.clone()));
            }
            _ => {}
        }
        self.with_gpu(handle, "nvmlDeviceGetUUID", |gpu| Ok(gpu.uuid.clone()))
    }

    /// `nvmlEventSetCreate`: a new, empty set.
    pub fn create_event_set(&self) -> Result<usize, nvmlReturn_t> {
        self.initialised()?;
        let mut next = lock(&self.next_set);
        let id = *next;
        *next += 1;
        lock(&self.sets).insert(id, EventSet::default());
        Ok(id)
    }

    /// `nvmlDeviceGetSupportedEventTypes`: XID events, on every GPU that answers.
    pub fn supported_event_types(&self, handle: usize) -> Result<u64, nvmlReturn_t> {
        self.with_gpu(handle, "nvmlDeviceGetSupportedEventTypes", |_| Ok(XID_EVENT_TYPE))
    }

    /// `nvmlDeviceRegisterEvents`.
    pub fn register_events(&self, handle: usize, types: u64, set: usize) -> Result<(), nvmlReturn_t> {
        self.with_gpu(handle, "nvmlDeviceRegisterEvents", |_| Ok(()))?;
        if types & !XID_EVENT_TYPE != 0 {
            return Err(nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED);
        }
        let mut sets = lock(&self.sets);
        let set = sets
            .get_mut(&set)
            .ok_or(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)?;
        if types & XID_EVENT_TYPE != 0 {
            set.devices.insert(handle);
        }
        Ok(())
    }

    /// `nvmlEventSetWait_v2`: the next XID of the scenario not yet delivered (to any set), once a
    /// device of this set is registered; `NVML_ERROR_TIMEOUT` when none comes within `timeout`.
    pub fn wait(&self, set: usize, timeout: Duration) -> Result<DeliveredXid, nvmlReturn_t> {
        let started = Instant::now();
        loop {
            let registered = match lock(&self.sets).get(&set) {
                None => return Err(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT),
                Some(set) => !set.devices.is_empty(),
            };
            let scenario = self.initialised()?;
            if registered && let Some(delivered) = self.next_xid(&scenario) {
                return Ok(delivered);
            }
            let left = timeout.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Err(nvmlReturn_enum_NVML_ERROR_TIMEOUT);
            }
            std::thread::sleep(left.min(POLL));
        }
    }

    fn next_xid(&self, scenario: &Scenario) -> Option<DeliveredXid> {
        let mut delivered = lock(&self.delivered);
        let xid = scenario
            .xids()
            .into_iter()
            .find(|xid| !delivered.contains(&xid.key))?;
        delivered.insert(xid.key);
        let device = xid.gpu_uuid.as_deref().map(|uuid| {
            if let Some(gpu) = scenario.gpu_by_uuid(uuid) {
                return Handle::Device(gpu.index);
            }
            let mut uuids = lock(&self.event_only_uuids);
            let position = uuids.iter().position(|known| known == uuid).unwrap_or_else(|| {
                uuids.push(uuid.to_owned());
                uuids.len() - 1
            });
            Handle::EventOnly(u32::try_from(position).unwrap_or(u32::MAX))
        });
        Some(DeliveredXid {
            device,
            xid: xid.xid,
            gpu_instance: xid.gpu_instance,
            compute_instance: xid.compute_instance,
        })
    }

    /// `nvmlEventSetFree`.
    pub fn free_event_set(&self, set: usize) -> Result<(), nvmlReturn_t> {
        lock(&self.sets)
            .remove(&set)
            .map(drop)
            .ok_or(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)
    }
}

fn read(path: &Path) -> Result<Scenario, String> {
    let text = std::fs::read_to_string(path).map_err(|err| err.to_string())?;
    Scenario::parse(&text)
}

#[cfg(test)]
mod tests {
    use nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED;

    use super::*;

    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("nvml-standin-{name}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir.join("scenario.json"))
        }

        /// Replaces the file by rename, as test writers do.
        fn write(&self, json: &str) {
            let temporary = self.0.with_extension("tmp");
            std::fs::write(&temporary, json).unwrap();
            std::fs::rename(&temporary, &self.0).unwrap();
        }
    }

    const TWO_GPUS: &str = r#"{"gpus": [
        {"index": 0, "uuid": "GPU-a", "pciBusId": "0", "temperatureC": 40},
        {"index": 1, "uuid": "GPU-b", "pciBusId": "1"}]}"#;

    fn started(scratch: &Scratch, json: &str) -> StandIn {
        scratch.write(json);
        let standin = StandIn::new(Some(scratch.0.clone()));
        standin.init().unwrap();
        standin
    }

    #[test]
    fn handles_round_trip_and_zero_is_no_handle() {
        for handle in [
            Handle::Device(0),
            Handle::Device(7),
            Handle::EventOnly(0),
            Handle::EventOnly(3),
            Handle::Mig { gpu: 0, slot: 0 },
            Handle::Mig { gpu: 7, slot: 6 },
        ] {
            assert_ne!(handle.encode(), 0);
            assert_eq!(Handle::decode(handle.encode()), Some(handle));
        }
        assert_eq!(Handle::decode(0), None);
        assert_eq!(Handle::decode(1), None);
    }

    #[test]
    fn calls_before_init_are_uninitialised_and_a_failing_init_counts_nothing() {
        let scratch = Scratch::new("init");
        scratch.write(r#"{"nvmlError": "Driver Not Loaded"}"#);
        let standin = StandIn::new(Some(scratch.0.clone()));
        assert_eq!(standin.init(), Err(nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED));
        assert_eq!(
            standin.device_count(),
            Err(nvmlReturn_enum_NVML_ERROR_UNINITIALIZED)
        );
        scratch.write(TWO_GPUS);
        standin.init().unwrap();
        assert_eq!(standin.device_count(), Ok(2));
        standin.shutdown().unwrap();
        assert_eq!(standin.shutdown(), Err(nvmlReturn_enum_NVML_ERROR_UNINITIALIZED));
    }

    #[test]
    fn no_scenario_or_a_garbled_one_fails_every_call_as_unknown() {
        assert_eq!(StandIn::new(None).init(), Err(nvmlReturn_enum_NVML_ERROR_UNKNOWN));
        let scratch = Scratch::new("garbled");
        let standin = started(&scratch, TWO_GPUS);
        scratch.write(r#"{"gpus": [{"index": 0"#);
        assert_eq!(standin.device_count(), Err(nvmlReturn_enum_NVML_ERROR_UNKNOWN));
        scratch.write(TWO_GPUS);
        assert_eq!(standin.device_count(), Ok(2), "re-read once the file changed");
    }

    #[test]
    fn a_lost_gpu_answers_gpu_is_lost_and_a_vanished_one_too() {
        let scratch = Scratch::new("lost");
        let standin = started(
            &scratch,
            r#"{"gpus": [{"index": 0, "uuid": "GPU-a", "pciBusId": "0"}], "lostIndices": [1]}"#,
        );
        let lost = standin.handle_by_index(1).unwrap();
        assert_eq!(
            standin.uuid(lost.encode()),
            Err(nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST)
        );
        let first = standin.handle_by_index(0).unwrap();
        assert_eq!(standin.uuid(first.encode()).as_deref(), Ok("GPU-a"));
        scratch.write(r#"{"gpus": []}"#);
        assert_eq!(standin.device_count(), Ok(0));
        assert_eq!(
            standin.uuid(first.encode()),
            Err(nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST)
        );
        assert_eq!(
            standin.handle_by_index(0),
            Err(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)
        );
    }

    #[test]
    fn an_injected_failure_fails_that_call_on_that_device_only() {
        let scratch = Scratch::new("injected");
        let standin = started(
            &scratch,
            r#"{"gpus": [{"index": 0, "uuid": "GPU-a", "pciBusId": "0", "temperatureC": 40}],
                "failedCalls": ["device 0: nvmlDeviceGetTemperature: Timeout"]}"#,
        );
        let handle = standin.handle_by_index(0).unwrap().encode();
        let temperature = standin.with_gpu(handle, "nvmlDeviceGetTemperature", |gpu| {
            gpu.temperature_c.ok_or(nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED)
        });
        assert_eq!(temperature, Err(nvmlReturn_enum_NVML_ERROR_TIMEOUT));
        assert_eq!(standin.uuid(handle).as_deref(), Ok("GPU-a"));
    }

    #[test]
    fn a_hung_count_blocks_until_the_scenario_stops_hanging() {
        let scratch = Scratch::new("hang");
        let standin = started(&scratch, TWO_GPUS);
        scratch.write(&TWO_GPUS.replacen('{', r#"{"hangSeconds": 30, "#, 1));
        let writer = {
            let path = Scratch(scratch.0.clone());
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(400));
                path.write(TWO_GPUS);
            })
        };
        let started_at = Instant::now();
        assert_eq!(standin.device_count(), Ok(2));
        let blocked = started_at.elapsed();
        writer.join().unwrap();
        assert!(blocked >= Duration::from_millis(350), "blocked {blocked:?}");
        assert!(
            blocked < Duration::from_secs(5),
            "released by the new scenario: {blocked:?}"
        );
    }

    #[test]
    fn each_xid_is_delivered_once_to_a_registered_set_naming_its_device() {
        let scratch = Scratch::new("xid");
        let standin = started(&scratch, TWO_GPUS);
        let set = standin.create_event_set().unwrap();
        scratch.write(&TWO_GPUS.replacen(
            '{',
            r#"{"xidEvents": [{"id": 1, "xid": 79, "gpuUuid": "GPU-b"}, {"id": 2, "xid": 48, "gpuUuid": "GPU-gone"}], "#,
            1,
        ));
        assert_eq!(
            standin.wait(set, Duration::from_millis(100)),
            Err(nvmlReturn_enum_NVML_ERROR_TIMEOUT),
            "nothing for a set without registrations"
        );
        let device = standin.handle_by_index(1).unwrap().encode();
        assert_eq!(standin.supported_event_types(device), Ok(XID_EVENT_TYPE));
        standin.register_events(device, XID_EVENT_TYPE, set).unwrap();
        let first = standin.wait(set, Duration::from_secs(1)).unwrap();
        assert_eq!(
            first,
            DeliveredXid {
                device: Some(Handle::Device(1)),
                xid: 79,
                gpu_instance: None,
                compute_instance: None,
            }
        );
        let second = standin.wait(set, Duration::from_secs(1)).unwrap();
        assert_eq!(second.xid, 48);
        let ghost = second.device.unwrap().encode();
        assert_eq!(
            standin.uuid(ghost).as_deref(),
            Ok("GPU-gone"),
            "an event-only UUID is named"
        );
        assert_eq!(
            standin.with_gpu(ghost, "nvmlDeviceGetName", |gpu| Ok(gpu.name.clone())),
            Err(nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST)
        );
        assert_eq!(
            standin.wait(set, Duration::from_millis(100)),
            Err(nvmlReturn_enum_NVML_ERROR_TIMEOUT),
            "each event once"
        );
        standin.free_event_set(set).unwrap();
        assert_eq!(
            standin.wait(set, Duration::from_millis(10)),
            Err(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)
        );
    }
}

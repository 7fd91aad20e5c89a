//! The `file` probe: a JSON file stands in for NVML, so the sandbox and e2e tests can drive the
//! real agent binary. The file is re-read on every tick; writers should replace it atomically
//! (write a temporary file, then rename), since a half-written file reads as a detector fault.
//!
//! ```json
//! {
//!   "nvmlError": null,          // a string here makes every read fail: NVML unavailable
//!   "hangSeconds": 0,           // each read blocks this long: a hung NVML
//!   "deviceCount": 2,           // optional; defaults to gpus + lostIndices + unreadableIndices
//!   "gpus": [{"index": 0, "uuid": "GPU-...", "pciBusId": "00000000:18:00.0", ...,
//!             "nvlinks": [{"link": 0, "active": true, "errors": {"replay": 0, ...}}],
//!             "fabric": {"state": "completed", "status": 0}}],
//!   "lostIndices": [],
//!   "xidEvents": [{"id": 1, "xid": 79, "gpuUuid": "GPU-..."}],
//!   "failedCalls": [],
//!   "kernelLog": ["3,1,5000000,-;NVRM: Xid (PCI:0000:18:00): 79, ..."] // for the harness
//! }
//! ```
//!
//! Each XID event is delivered once, keyed by its `id` (its position when it has none), so a file
//! that keeps listing an event does not repeat it.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    sync::Mutex,
    time::Duration,
};

use serde::Deserialize;

use super::{Probe, ReadGpusError};
use crate::readings::{GpuReading, Snapshot, XidEvent};

/// The file's shape.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ProbeFile {
    #[serde(default)]
    nvml_error: Option<String>,
    #[serde(default)]
    hang_seconds: u64,
    #[serde(default)]
    device_count: Option<u32>,
    #[serde(default)]
    gpus: Vec<GpuReading>,
    #[serde(default)]
    lost_indices: Vec<u32>,
    #[serde(default)]
    unreadable_indices: Vec<u32>,
    #[serde(default)]
    xid_events: Vec<FileXidEvent>,
    #[serde(default)]
    failed_calls: Vec<String>,
    /// Kernel-log lines: the harness writes them to the file `--kernel-log` reads, not the probe.
    #[serde(default, rename = "kernelLog")]
    _kernel_log: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileXidEvent {
    #[serde(default)]
    id: Option<u64>,
    xid: u64,
    #[serde(default)]
    gpu_uuid: Option<String>,
    #[serde(default)]
    gpu_instance: Option<u32>,
    #[serde(default)]
    compute_instance: Option<u32>,
}

/// Reads GPUs from a JSON file.
pub struct FileProbe {
    path: PathBuf,
    delivered: Mutex<BTreeSet<u64>>,
}

impl FileProbe {
    /// A probe reading `path`.
    #[must_use]
    pub fn new(path: &Path) -> Self {
        Self {
            path: path.to_owned(),
            delivered: Mutex::default(),
        }
    }

    fn error(&self, message: &dyn std::fmt::Display) -> ReadGpusError {
        ReadGpusError::ProbeFile {
            path: self.path.display().to_string(),
            message: message.to_string(),
        }
    }
}

impl Probe for FileProbe {
    fn name(&self) -> &'static str {
        "file"
    }

    fn read(&self) -> Result<Snapshot, ReadGpusError> {
        let text = std::fs::read_to_string(&self.path).map_err(|err| self.error(&err))?;
        let file: ProbeFile = serde_json::from_str(&text).map_err(|err| self.error(&err))?;
        if file.hang_seconds > 0 {
            std::thread::sleep(Duration::from_secs(file.hang_seconds));
        }
        if let Some(message) = file.nvml_error {
            return Err(ReadGpusError::Simulated(message));
        }
        let mut delivered = self
            .delivered
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut xid_events = Vec::new();
        for (position, event) in file.xid_events.into_iter().enumerate() {
            let id = event.id.unwrap_or(position as u64);
            if delivered.insert(id) {
                xid_events.push(XidEvent {
                    xid: event.xid,
                    gpu_uuid: event.gpu_uuid,
                    gpu_instance: event.gpu_instance,
                    compute_instance: event.compute_instance,
                });
            }
        }
        let counted = file.gpus.len() + file.lost_indices.len() + file.unreadable_indices.len();
        Ok(Snapshot {
            device_count: file
                .device_count
                .unwrap_or_else(|| u32::try_from(counted).unwrap_or(u32::MAX)),
            gpus: file.gpus,
            lost_indices: file.lost_indices,
            unreadable_indices: file.unreadable_indices,
            xid_events,
            failed_calls: file.failed_calls,
            taken_at: Some(std::time::Instant::now()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, json: &str) -> PathBuf {
        let path = dir.join("gpus.json");
        std::fs::write(&path, json).unwrap();
        path
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "gpu-health-agent-file-probe-{name}-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_file_of_gpus_reads_as_a_snapshot_with_a_derived_count() {
        let dir = temp_dir("gpus");
        let path = write(&dir, include_str!("../../tests/fixtures/h100-healthy.json"));
        let snapshot = FileProbe::new(&path).read().unwrap();
        assert_eq!(snapshot.device_count, 2);
        assert_eq!(snapshot.gpus[1].pci_bus_id, "00000000:2A:00.0");
        let path = write(
            &dir,
            r#"{"gpus": [{"index": 0, "uuid": "GPU-a", "pciBusId": "0:1:0"}], "lostIndices": [1]}"#,
        );
        assert_eq!(FileProbe::new(&path).read().unwrap().device_count, 2);
    }

    #[test]
    fn each_xid_event_is_delivered_once() {
        let dir = temp_dir("xids");
        let path = write(
            &dir,
            r#"{"xidEvents": [{"id": 7, "xid": 79, "gpuUuid": "GPU-a"}]}"#,
        );
        let probe = FileProbe::new(&path);
        assert_eq!(
            probe.read().unwrap().xid_events,
            vec![XidEvent {
                xid: 79,
                gpu_uuid: Some("GPU-a".to_owned()),
                ..XidEvent::default()
            }]
        );
        assert_eq!(probe.read().unwrap().xid_events, vec![]);
        write(
            &dir,
            r#"{"xidEvents": [{"id": 7, "xid": 79}, {"id": 8, "xid": 48}]}"#,
        );
        assert_eq!(
            probe.read().unwrap().xid_events,
            vec![XidEvent {
                xid: 48,
                gpu_uuid: None,
                ..XidEvent::default()
            }]
        );
    }

    #[test]
    fn kernel_log_lines_are_left_to_the_kernel_log_reader() {
        let dir = temp_dir("kernel-log");
        let path = write(
            &dir,
            r#"{"kernelLog": ["3,1,5000000,-;NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus."]}"#,
        );
        assert_eq!(FileProbe::new(&path).read().unwrap().xid_events, vec![]);
    }

    #[test]
    fn a_simulated_nvml_error_fails_the_read() {
        let dir = temp_dir("nvml-error");
        let path = write(&dir, r#"{"nvmlError": "Driver Not Loaded"}"#);
        assert_eq!(
            FileProbe::new(&path).read(),
            Err(ReadGpusError::Simulated("Driver Not Loaded".to_owned()))
        );
    }

    #[test]
    fn a_missing_or_garbled_file_is_a_read_error_not_an_empty_node() {
        let dir = temp_dir("garbled");
        assert!(matches!(
            FileProbe::new(&dir.join("absent.json")).read(),
            Err(ReadGpusError::ProbeFile { .. })
        ));
        let path = write(&dir, r#"{"gpus": [{"index": 0"#);
        assert!(matches!(
            FileProbe::new(&path).read(),
            Err(ReadGpusError::ProbeFile { .. })
        ));
        let path = write(&dir, r#"{"gpu": []}"#);
        assert!(
            matches!(FileProbe::new(&path).read(), Err(ReadGpusError::ProbeFile { .. })),
            "typo refused"
        );
    }
}

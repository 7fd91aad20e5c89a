//! The XID paths besides NVML's event API (the kernel log), merged with it: each path's reports
//! pass [`XidDedup`] (one XID seen by two paths counts once), and the new ones become signals
//! through the same catalog and assessment as NVML's events. A path that cannot be read is a
//! detector fault with its own reason, never a GPU fault.

use jiff::Timestamp;

use crate::{
    assess::{Memory, Signal, SignalKind, xid_signals},
    catalog::XidCatalog,
    kernel_log::{KernelLog, REASON_KERNEL_LOG_UNREADABLE, ReportedXid},
    probe::ReadGpusError,
    readings::{Snapshot, XidEvent},
    xid_dedup::{XidDedup, XidPath, gpu_key},
};

/// The paths read besides the probe, and what they reported recently.
#[derive(Default)]
pub struct XidPaths {
    kernel_log: Option<KernelLog>,
    dedup: XidDedup,
}

impl XidPaths {
    /// Reads `log` too.
    pub fn set_kernel_log(&mut self, log: KernelLog) {
        self.kernel_log = Some(log);
    }

    /// The kernel log, where it is read.
    pub fn kernel_log_mut(&mut self) -> Option<&mut KernelLog> {
        self.kernel_log.as_mut()
    }

    /// Drops from `read` the NVML events another path already reported, reads the other paths,
    /// and returns the signals of what they newly report (or of their failure to read).
    pub fn collect(
        &mut self,
        read: &mut Result<Snapshot, ReadGpusError>,
        memory: &Memory,
        catalog: &XidCatalog,
        now: Timestamp,
    ) -> Vec<Signal> {
        if let Ok(snapshot) = read.as_mut() {
            let dedup = &mut self.dedup;
            snapshot.xid_events.retain(|event| {
                dedup.admit(
                    XidPath::Nvml,
                    &gpu_key(event.gpu_uuid.as_deref(), None),
                    event.xid,
                    now,
                )
            });
        }
        let Some(log) = self.kernel_log.as_mut() else {
            return Vec::new();
        };
        let gpus = match read.as_ref() {
            Ok(snapshot) => {
                log.learn_read(&snapshot.gpus);
                snapshot.gpus.clone()
            }
            Err(_) => Vec::new(),
        };
        match log.read(now) {
            Ok(xids) => xids
                .into_iter()
                .filter(|reported| {
                    let pci = reported.xid.pci.to_string();
                    self.dedup.admit(
                        XidPath::KernelLog,
                        &gpu_key(reported.gpu_uuid.as_deref(), Some(&pci)),
                        reported.xid.xid,
                        reported.at,
                    )
                })
                .flat_map(|reported| kernel_xid_signals(&reported, gpus.clone(), memory, catalog))
                .collect(),
            Err(err) => vec![Signal {
                kind: SignalKind::DetectorFault,
                reason: REASON_KERNEL_LOG_UNREADABLE.to_owned(),
                message: err.to_string(),
                key: format!("{REASON_KERNEL_LOG_UNREADABLE}/node"),
                gpu_uuid: None,
            }],
        }
    }
}

/// The signal of one kernel-log XID: the catalog's, as for an NVML event, and what the line adds.
fn kernel_xid_signals(
    reported: &ReportedXid,
    gpus: Vec<crate::readings::GpuReading>,
    memory: &Memory,
    catalog: &XidCatalog,
) -> Vec<Signal> {
    let snapshot = Snapshot {
        gpus,
        xid_events: vec![XidEvent {
            xid: reported.xid.xid,
            gpu_uuid: reported.gpu_uuid.clone(),
        }],
        ..Snapshot::default()
    };
    xid_signals(&snapshot, memory, catalog)
        .map(|mut signal| {
            signal.message = format!("{} ({})", signal.message, reported.describe());
            signal
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;
    use crate::{
        health::{ConditionStatus, HealthState, WarningPolicy},
        readings::GpuReading,
    };

    fn boot() -> Timestamp {
        Timestamp::from_second(1_800_000_000).unwrap()
    }

    fn log_file(name: &str, text: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("gpu-health-agent-xid-paths-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn gpu() -> GpuReading {
        GpuReading {
            index: 2,
            uuid: "GPU-c".to_owned(),
            pci_bus_id: "00000000:38:00.0".to_owned(),
            ..GpuReading::default()
        }
    }

    fn paths(log: &Path) -> XidPaths {
        let mut paths = XidPaths::default();
        paths.set_kernel_log(KernelLog::new(log, Some(boot())));
        paths
    }

    fn read(events: Vec<XidEvent>) -> Snapshot {
        Snapshot {
            device_count: 1,
            gpus: vec![gpu()],
            xid_events: events,
            ..Snapshot::default()
        }
    }

    #[test]
    fn a_kernel_log_xid_is_assessed_like_an_nvml_event_and_names_the_gpu() {
        let log = log_file(
            "79",
            "3,5,10000000,-;NVRM: Xid (PCI:0000:38:00): 79, pid=1234, GPU has fallen off the bus.\n",
        );
        let catalog = XidCatalog::shipped().unwrap();
        let signals = paths(&log).collect(&mut Ok(read(vec![])), &Memory::default(), &catalog, boot());
        assert_eq!(signals.len(), 1);
        assert_eq!(
            (signals[0].kind, signals[0].reason.as_str()),
            (SignalKind::Fatal, "XID79")
        );
        assert_eq!(signals[0].gpu_uuid.as_deref(), Some("GPU-c"));
        let message = &signals[0].message;
        assert!(
            message.contains("GPU 2 (UUID GPU-c, PCI 00000000:38:00.0)"),
            "{message}"
        );
        assert!(message.contains("kernel log at"), "{message}");
    }

    #[test]
    fn one_xid_in_the_kernel_log_and_from_nvml_counts_once() {
        let log = log_file(
            "both",
            "3,5,10000000,-;NVRM: Xid (PCI:0000:38:00): 13, pid=1, Graphics Exception\n",
        );
        let catalog = XidCatalog::shipped().unwrap();
        let mut paths = paths(&log);
        let now = boot() + jiff::SignedDuration::from_secs(12);
        let nvml = XidEvent {
            xid: 13,
            gpu_uuid: Some("GPU-c".to_owned()),
        };
        let mut first = Ok(read(vec![nvml.clone()]));
        let other = paths.collect(&mut first, &Memory::default(), &catalog, now);
        assert_eq!(first.unwrap().xid_events, vec![nvml.clone()], "NVML's came first");
        assert_eq!(other, vec![], "the log's line is its twin");
        // A second XID 13 reaches NVML only: a new occurrence.
        let mut second = Ok(read(vec![nvml.clone()]));
        paths.collect(&mut second, &Memory::default(), &catalog, now);
        assert_eq!(second.unwrap().xid_events, vec![nvml]);
    }

    #[test]
    fn an_unreadable_kernel_log_reads_unknown_with_its_own_reason() {
        let catalog = XidCatalog::shipped().unwrap();
        let signals = paths(Path::new("/nonexistent/kmsg")).collect(
            &mut Ok(read(vec![])),
            &Memory::default(),
            &catalog,
            boot(),
        );
        assert_eq!(signals.len(), 1);
        assert_eq!(signals[0].kind, SignalKind::DetectorFault);
        let verdict = HealthState::new(WarningPolicy {
            threshold: 1,
            window: std::time::Duration::from_secs(60),
        })
        .observe(&signals, boot(), "ok");
        assert_eq!(verdict.condition.status, ConditionStatus::Unknown);
        assert_eq!(verdict.condition.reason, REASON_KERNEL_LOG_UNREADABLE);
        assert!(
            verdict.condition.message.contains("/nonexistent/kmsg"),
            "{}",
            verdict.condition.message
        );
    }
}

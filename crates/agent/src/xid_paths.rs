//! The XID paths besides NVML's event API (the kernel log, a DCGM exporter), merged with it: each
//! path's reports
//! pass [`XidDedup`] (one XID seen by two paths counts once), and the new ones become signals
//! through the same catalog and assessment as NVML's events. A path that cannot be read is a
//! detector fault with its own reason, never a GPU fault.

use jiff::Timestamp;

use crate::{
    assess::{Memory, Signal, SignalKind, xid_signals},
    catalog::XidCatalog,
    dcgm::{DcgmError, DcgmSource, REASON_DCGM_UNAVAILABLE},
    kernel_log::{KernelLog, REASON_KERNEL_LOG_UNREADABLE},
    probe::ReadGpusError,
    readings::{GpuReading, Snapshot, XidEvent},
    xid_dedup::{XidDedup, XidPath, gpu_key},
};

/// The paths read besides the probe, and what they reported recently.
#[derive(Default)]
pub struct XidPaths {
    kernel_log: Option<KernelLog>,
    dcgm: Option<DcgmSource>,
    dedup: XidDedup,
}

impl XidPaths {
    /// Reads `log` too.
    pub fn set_kernel_log(&mut self, log: KernelLog) {
        self.kernel_log = Some(log);
    }

    /// Scrapes `source` too.
    pub fn set_dcgm(&mut self, source: DcgmSource) {
        self.dcgm = Some(source);
    }

    /// One scrape of the DCGM exporter, where one is configured (before [`Self::collect`]).
    pub async fn scrape_dcgm(&self) -> Option<Result<String, DcgmError>> {
        match &self.dcgm {
            Some(source) => Some(source.scrape().await),
            None => None,
        }
    }

    /// The kernel log, where it is read.
    pub fn kernel_log_mut(&mut self) -> Option<&mut KernelLog> {
        self.kernel_log.as_mut()
    }

    /// Drops from `read` the NVML events another path already reported, reads the other paths,
    /// and returns the signals of what they newly report (or of their failure to read). `dcgm` is
    /// the DCGM exporter's scrape, where one is configured.
    pub fn collect(
        &mut self,
        read: &mut Result<Snapshot, ReadGpusError>,
        dcgm: Option<Result<String, DcgmError>>,
        memory: &Memory,
        catalog: &XidCatalog,
        now: Timestamp,
    ) -> Vec<Signal> {
        if let Ok(snapshot) = read.as_mut() {
            let dedup = &mut self.dedup;
            snapshot.xid_events.retain(|event| {
                dedup.admit(
                    XidPath::Nvml,
                    &gpu_key(event.gpu_uuid.as_deref(), None, event.gpu_instance),
                    event.xid,
                    now,
                )
            });
        }
        let gpus = read
            .as_ref()
            .map(|snapshot| snapshot.gpus.clone())
            .unwrap_or_default();
        let mut signals = self.kernel_log_signals(&gpus, memory, catalog, now);
        signals.extend(self.dcgm_signals(dcgm, &gpus, memory, catalog, now));
        signals
    }

    fn kernel_log_signals(
        &mut self,
        gpus: &[GpuReading],
        memory: &Memory,
        catalog: &XidCatalog,
        now: Timestamp,
    ) -> Vec<Signal> {
        let Some(log) = self.kernel_log.as_mut() else {
            return Vec::new();
        };
        log.learn_read(gpus);
        match log.read(now) {
            Ok(xids) => xids
                .into_iter()
                .filter(|reported| {
                    let pci = reported.xid.pci.to_string();
                    self.dedup.admit(
                        XidPath::KernelLog,
                        &gpu_key(
                            reported.gpu_uuid.as_deref(),
                            Some(&pci),
                            reported.xid.gpu_instance,
                        ),
                        reported.xid.xid,
                        reported.at,
                    )
                })
                .flat_map(|reported| {
                    let note = reported.describe();
                    let event = XidEvent {
                        xid: reported.xid.xid,
                        gpu_uuid: reported.gpu_uuid,
                        gpu_instance: reported.xid.gpu_instance,
                        compute_instance: reported.xid.compute_instance,
                    };
                    path_xid_signals(event, &note, gpus, memory, catalog)
                })
                .collect(),
            Err(err) => vec![detector_fault(REASON_KERNEL_LOG_UNREADABLE, err.to_string())],
        }
    }

    fn dcgm_signals(
        &mut self,
        scrape: Option<Result<String, DcgmError>>,
        gpus: &[GpuReading],
        memory: &Memory,
        catalog: &XidCatalog,
        now: Timestamp,
    ) -> Vec<Signal> {
        let (Some(source), Some(scrape)) = (self.dcgm.as_mut(), scrape) else {
            return Vec::new();
        };
        let body = match scrape {
            Ok(body) => body,
            Err(err) => return vec![detector_fault(REASON_DCGM_UNAVAILABLE, err.to_string())],
        };
        let report = source.report(&body);
        let mut signals = Vec::new();
        for (uuid, pci, xid) in report.xids {
            if self
                .dedup
                .admit(XidPath::Dcgm, &gpu_key(Some(&uuid), None, None), xid, now)
            {
                let note = format!("DCGM exporter, PCI {}", pci.as_deref().unwrap_or("unlabelled"));
                let event = XidEvent {
                    xid,
                    gpu_uuid: Some(uuid),
                    ..XidEvent::default()
                };
                signals.extend(path_xid_signals(event, &note, gpus, memory, catalog));
            }
        }
        for (uuid, reason, what) in report.faults {
            let name = gpus
                .iter()
                .find(|gpu| gpu.uuid == uuid)
                .or_else(|| memory.known(&uuid))
                .map_or_else(|| format!("GPU {uuid}"), GpuReading::describe);
            signals.push(Signal {
                kind: SignalKind::Fatal,
                reason: reason.to_owned(),
                message: format!("{name}: {what}"),
                key: format!("{reason}/{uuid}"),
                gpu_uuid: Some(uuid),
            });
        }
        signals
    }
}

/// A detector fault of one path: `GpuHealthy=Unknown` with `reason`.
fn detector_fault(reason: &str, message: String) -> Signal {
    Signal {
        kind: SignalKind::DetectorFault,
        reason: reason.to_owned(),
        message,
        key: format!("{reason}/node"),
        gpu_uuid: None,
    }
}

/// The signal of one XID another path reported: the catalog's, as for an NVML event, and `note`
/// (what that path adds) in its message.
fn path_xid_signals(
    event: XidEvent,
    note: &str,
    gpus: &[GpuReading],
    memory: &Memory,
    catalog: &XidCatalog,
) -> Vec<Signal> {
    let snapshot = Snapshot {
        gpus: gpus.to_vec(),
        xid_events: vec![event],
        ..Snapshot::default()
    };
    xid_signals(&snapshot, memory, catalog)
        .map(|mut signal| {
            signal.message = format!("{} ({note})", signal.message);
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
        let signals = paths(&log).collect(&mut Ok(read(vec![])), None, &Memory::default(), &catalog, boot());
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
            ..XidEvent::default()
        };
        let mut first = Ok(read(vec![nvml.clone()]));
        let other = paths.collect(&mut first, None, &Memory::default(), &catalog, now);
        assert_eq!(first.unwrap().xid_events, vec![nvml.clone()], "NVML's came first");
        assert_eq!(other, vec![], "the log's line is its twin");
        // A second XID 13 reaches NVML only: a new occurrence.
        let mut second = Ok(read(vec![nvml.clone()]));
        paths.collect(&mut second, None, &Memory::default(), &catalog, now);
        assert_eq!(second.unwrap().xid_events, vec![nvml]);
    }

    #[test]
    fn an_unreadable_kernel_log_reads_unknown_with_its_own_reason() {
        let catalog = XidCatalog::shipped().unwrap();
        let signals = paths(Path::new("/nonexistent/kmsg")).collect(
            &mut Ok(read(vec![])),
            None,
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

    #[test]
    fn a_dcgm_xid_counts_once_with_nvml_and_an_unreachable_dcgm_is_unknown() {
        let catalog = XidCatalog::shipped().unwrap();
        let mut paths = XidPaths::default();
        paths.set_dcgm(
            crate::dcgm::DcgmSource::new("http://127.0.0.1:9/metrics", std::time::Duration::from_secs(1))
                .unwrap(),
        );
        let body = |xid: u64| Some(Ok(format!("DCGM_FI_DEV_XID_ERRORS{{UUID=\"GPU-c\"}} {xid}\n")));
        let baseline = paths.collect(
            &mut Ok(read(vec![])),
            body(0),
            &Memory::default(),
            &catalog,
            boot(),
        );
        assert_eq!(baseline, vec![]);
        // DCGM alone reports XID 79: the catalog's signal, naming the GPU.
        let alone = paths.collect(
            &mut Ok(read(vec![])),
            body(79),
            &Memory::default(),
            &catalog,
            boot(),
        );
        assert_eq!((alone.len(), alone[0].reason.as_str()), (1, "XID79"));
        assert!(
            alone[0].message.contains("GPU 2 (UUID GPU-c"),
            "{}",
            alone[0].message
        );
        // XID 48 from NVML and DCGM in one tick: NVML's counts, DCGM's is its twin.
        let nvml = XidEvent {
            xid: 48,
            gpu_uuid: Some("GPU-c".to_owned()),
            ..XidEvent::default()
        };
        let mut both = Ok(read(vec![nvml.clone()]));
        let dcgm = paths.collect(&mut both, body(48), &Memory::default(), &catalog, boot());
        assert_eq!((both.unwrap().xid_events, dcgm), (vec![nvml], vec![]));
        let unreachable = paths.collect(
            &mut Ok(read(vec![])),
            Some(Err(DcgmError {
                url: "http://127.0.0.1:9/metrics".to_owned(),
                message: "connection refused".to_owned(),
            })),
            &Memory::default(),
            &catalog,
            boot(),
        );
        assert_eq!(
            (unreachable[0].kind, unreachable[0].reason.as_str()),
            (SignalKind::DetectorFault, REASON_DCGM_UNAVAILABLE)
        );
    }
}

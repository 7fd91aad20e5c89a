//! XIDs from the kernel log. The driver writes every XID there (`NVRM: Xid (PCI:...): 79, ...`),
//! including those NVML's event API misses: raised while no event set was registered (the agent
//! was down or restarting), and on a GPU that fell off the bus, after which NVML calls on it fail.
//!
//! [`reader`] takes new records from `/dev/kmsg` (or a plain file, in tests); [`parse`] reads the
//! XID lines; [`KernelLog`] places each in time, names its GPU and drops those already handled.
//!
//! - **GPU.** The line names a PCI address; the UUID comes from the GPUs NVML listed (every read
//!   since the agent started), else from the inventory the node carries (a GPU that fell off the
//!   bus before this agent started). An address neither knows stays unnamed (the message gives
//!   the address).
//! - **What the buffer holds.** The first read takes what the kernel's ring buffer still holds
//!   since the boot, so an XID raised while the agent was down is seen.
//! - **Not raising a handled XID again.** A record's time is the host's boot time plus its
//!   microseconds since boot. Records at or before the *horizon* are dropped: the latest of the
//!   boot, the node's clear annotation (a person accepted the GPUs as they were then), and the
//!   time the node's `GpuHealthy` last turned `True` (a GPU that recovered, or an earlier agent
//!   that read the same log and found nothing fatal). A fault still latched on the node is
//!   restored from it, not from the log. Without a boot time (no `/proc/stat`), records cannot be
//!   placed, so the first read only sets the starting point and later records count from there.
//! - **Unreadable.** A log the agent cannot open or read (missing, permission denied) is a
//!   detector fault: `GpuHealthy=Unknown` with reason [`REASON_KERNEL_LOG_UNREADABLE`], never a
//!   GPU fault.

pub mod parse;
pub mod reader;

use std::{collections::BTreeMap, path::Path};

use jiff::{SignedDuration, Timestamp};

use self::{
    parse::{KernelXid, PciDevice},
    reader::{KernelLogError, KernelLogReader, SkipCounts},
};
use crate::readings::GpuReading;

/// Detector-fault reason: the kernel log cannot be read.
pub const REASON_KERNEL_LOG_UNREADABLE: &str = "KernelLogUnreadable";

/// The default kernel log.
pub const DEFAULT_PATH: &str = "/dev/kmsg";

/// One XID from the kernel log, placed in time and, where known, on a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportedXid {
    /// When it was logged.
    pub at: Timestamp,
    /// The GPU's UUID, where its address is known.
    pub gpu_uuid: Option<String>,
    /// The line's fields.
    pub xid: KernelXid,
}

impl ReportedXid {
    /// What the line adds to the XID's message: its address, MIG instance, process and detail.
    #[must_use]
    pub fn describe(&self) -> String {
        let mut parts = vec![format!("kernel log at {}: PCI {}", self.at, self.xid.pci)];
        if let Some(instance) = self.xid.gpu_instance {
            parts.push(format!("GPU instance {instance}"));
        }
        if let Some(instance) = self.xid.compute_instance {
            parts.push(format!("compute instance {instance}"));
        }
        if let Some(pid) = &self.xid.pid {
            parts.push(match &self.xid.process {
                Some(process) => format!("pid {pid} ({process})"),
                None => format!("pid {pid}"),
            });
        }
        let mut text = parts.join(", ");
        if !self.xid.detail.is_empty() {
            text = format!("{text}: {}", self.xid.detail);
        }
        text
    }
}

/// The kernel log as the agent reads it.
pub struct KernelLog {
    reader: KernelLogReader,
    booted_at: Option<Timestamp>,
    horizon: Option<Timestamp>,
    /// PCI address → UUID of every GPU seen.
    addresses: BTreeMap<PciDevice, String>,
    /// Whether a read succeeded yet (without a boot time, the first read only sets the start).
    started: bool,
    /// What was skipped, as last logged.
    logged_skips: SkipCounts,
}

impl KernelLog {
    /// Reads `path`; records are placed in time from `booted_at`.
    #[must_use]
    pub fn new(path: &Path, booted_at: Option<Timestamp>) -> Self {
        Self {
            reader: KernelLogReader::new(path),
            booted_at,
            horizon: booted_at,
            addresses: BTreeMap::new(),
            started: false,
            logged_skips: SkipCounts::default(),
        }
    }

    /// The path read.
    #[must_use]
    pub fn path(&self) -> &Path {
        self.reader.path()
    }

    /// Records at or before `at` are taken as handled (see the module header); the horizon only
    /// moves forward.
    pub fn handled_until(&mut self, at: Timestamp) {
        if self.horizon.is_none_or(|horizon| horizon < at) {
            self.horizon = Some(at);
        }
    }

    /// Learns the PCI addresses of GPUs (from a read, or the node's inventory).
    pub fn learn<'a>(&mut self, gpus: impl IntoIterator<Item = (&'a str, &'a str)>) {
        for (pci_bus_id, uuid) in gpus {
            if let Some(pci) = PciDevice::parse(pci_bus_id) {
                self.addresses.insert(pci, uuid.to_owned());
            }
        }
    }

    /// Learns the addresses of the GPUs of one read.
    pub fn learn_read(&mut self, gpus: &[GpuReading]) {
        self.learn(
            gpus.iter()
                .map(|gpu| (gpu.pci_bus_id.as_str(), gpu.uuid.as_str())),
        );
    }

    /// The XIDs logged since the last read, newer than the horizon.
    pub fn read(&mut self, now: Timestamp) -> Result<Vec<ReportedXid>, KernelLogError> {
        let logged = self.reader.read()?;
        let skipped = self.reader.skipped();
        if skipped != self.logged_skips {
            tracing::warn!(
                path = %self.path().display(), too_long = skipped.too_long,
                malformed = skipped.malformed, lost = skipped.lost,
                "kernel log lines skipped (totals since start)"
            );
            self.logged_skips = skipped;
        }
        let first = !std::mem::replace(&mut self.started, true);
        let mut xids = Vec::new();
        for logged in logged {
            let at = match self.booted_at {
                Some(booted) => {
                    let micros = i64::try_from(logged.micros_since_boot).unwrap_or(i64::MAX);
                    booted
                        .checked_add(SignedDuration::from_micros(micros))
                        .unwrap_or(now)
                }
                // Placed at its read; what the buffer held at the first read is the starting point.
                None if first => continue,
                None => now,
            };
            if self.horizon.is_some_and(|horizon| at <= horizon) {
                continue;
            }
            xids.push(ReportedXid {
                at,
                gpu_uuid: self.addresses.get(&logged.xid.pci).cloned(),
                xid: logged.xid,
            });
        }
        Ok(xids)
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn log_file(name: &str, text: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("gpu-health-agent-kernel-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn boot() -> Timestamp {
        Timestamp::from_second(1_800_000_000).unwrap()
    }

    const TWO_XIDS: &str = "3,1,10000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n3,2,20000000,-;NVRM: Xid (PCI:0000:5e:00 GPU-I:04): 43, pid=9, Ch 00000010\n";

    #[test]
    fn an_xid_is_placed_after_the_boot_and_named_by_its_address() {
        let mut log = KernelLog::new(&log_file("named", TWO_XIDS), Some(boot()));
        log.learn([("00000000:3B:00.0", "GPU-a")]);
        let xids = log.read(boot()).unwrap();
        assert_eq!(xids.len(), 2);
        assert_eq!(xids[0].at, boot() + SignedDuration::from_secs(10));
        assert_eq!(xids[0].gpu_uuid.as_deref(), Some("GPU-a"));
        assert_eq!(xids[1].gpu_uuid, None, "an address no read listed");
        assert!(
            xids[1]
                .describe()
                .contains("PCI 0000:5e:00, GPU instance 4, pid 9: Ch 00000010")
        );
    }

    #[test]
    fn an_xid_at_or_before_the_horizon_was_handled_and_is_not_raised_again() {
        let mut log = KernelLog::new(&log_file("handled", TWO_XIDS), Some(boot()));
        // The node turned healthy 15 s after the boot: the XID 79 at 10 s was handled then.
        log.handled_until(boot() + SignedDuration::from_secs(15));
        log.handled_until(boot());
        let xids = log.read(boot()).unwrap();
        assert_eq!(xids.iter().map(|x| x.xid.xid).collect::<Vec<_>>(), vec![43]);
    }

    #[test]
    fn without_a_boot_time_only_records_after_the_first_read_count() {
        let path = log_file("no-boot", TWO_XIDS);
        let mut log = KernelLog::new(&path, None);
        assert_eq!(log.read(boot()).unwrap(), vec![]);
        std::fs::write(
            &path,
            format!("{TWO_XIDS}3,3,30000000,-;NVRM: Xid (PCI:0000:3b:00): 48, DBE\n"),
        )
        .unwrap();
        let xids = log.read(boot()).unwrap();
        assert_eq!((xids.len(), xids[0].xid.xid, xids[0].at), (1, 48, boot()));
    }
}

//! One XID, however many paths report it. NVML's event API, the kernel log and DCGM may each
//! report the same XID; it must count once (a warning's occurrences, the fault's signals).
//!
//! - **Key**: the GPU (its UUID; the PCI address where the path could not name the UUID), the MIG
//!   GPU instance where the path names one (two instances' XIDs are two faults), and the XID code.
//! - **Window**: [`WINDOW`] either side. A report is a duplicate when another path reported the same
//!   key within the window and that report has not yet absorbed one from this path. So the driver
//!   raising XID 13 three times gives three occurrences on every path, and each path's copies
//!   pair off one to one instead of collapsing into one.
//! - **Times**: an NVML event is placed at the read that delivered it (the event API gives no
//!   time); a kernel-log line at its own time (boot + microseconds since boot). The window covers
//!   the event thread's delay and the read interval.

use std::{collections::VecDeque, time::Duration};

use jiff::{SignedDuration, Timestamp};

/// How far apart two paths' reports of one XID may be.
pub const WINDOW: Duration = Duration::from_secs(60);

/// The most reports remembered (older ones are forgotten first).
const REMEMBERED: usize = 4096;

/// Where an XID report came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum XidPath {
    /// NVML's event API (`nvmlEventSetWait`).
    Nvml,
    /// The kernel log (`/dev/kmsg`).
    KernelLog,
    /// A DCGM exporter's metrics.
    Dcgm,
}

/// The GPU part of the key: the UUID where known, else the PCI address, else nothing; then the
/// MIG GPU instance, where named.
#[must_use]
pub fn gpu_key(uuid: Option<&str>, pci: Option<&str>, gpu_instance: Option<u32>) -> String {
    let gpu = match (uuid, pci) {
        (Some(uuid), _) => uuid.to_owned(),
        (None, Some(pci)) => format!("pci:{pci}"),
        (None, None) => "unidentified".to_owned(),
    };
    match gpu_instance {
        Some(instance) => format!("{gpu}/gi:{instance}"),
        None => gpu,
    }
}

#[derive(Debug, Clone)]
struct Seen {
    gpu: String,
    xid: u64,
    path: XidPath,
    at: Timestamp,
    /// The other paths' reports it stood for.
    absorbed: Vec<XidPath>,
}

/// The reports of the last window.
#[derive(Debug, Clone, Default)]
pub struct XidDedup {
    seen: VecDeque<Seen>,
}

impl XidDedup {
    /// Whether this report is new (count it) or another path's report of one already counted.
    pub fn admit(&mut self, path: XidPath, gpu: &str, xid: u64, at: Timestamp) -> bool {
        let window = SignedDuration::try_from(WINDOW).unwrap_or(SignedDuration::MAX);
        let horizon = at.checked_sub(window * 2).unwrap_or(Timestamp::MIN);
        self.seen.retain(|seen| seen.at >= horizon);
        if let Some(original) = self.seen.iter_mut().find(|seen| {
            seen.gpu == gpu
                && seen.xid == xid
                && seen.path != path
                && !seen.absorbed.contains(&path)
                && seen.at.duration_since(at).abs() <= window
        }) {
            original.absorbed.push(path);
            return false;
        }
        if self.seen.len() >= REMEMBERED {
            self.seen.pop_front();
        }
        self.seen.push_back(Seen {
            gpu: gpu.to_owned(),
            xid,
            path,
            at,
            absorbed: Vec::new(),
        });
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    #[test]
    fn one_xid_on_two_paths_counts_once_in_either_order() {
        let mut dedup = XidDedup::default();
        assert!(dedup.admit(XidPath::KernelLog, "GPU-a", 79, at(0)));
        assert!(!dedup.admit(XidPath::Nvml, "GPU-a", 79, at(3)));
        assert!(dedup.admit(XidPath::Nvml, "GPU-b", 48, at(10)));
        assert!(
            !dedup.admit(XidPath::KernelLog, "GPU-b", 48, at(8)),
            "the log's time may be earlier"
        );
        assert!(
            !dedup.admit(XidPath::Dcgm, "GPU-b", 48, at(12)),
            "a third path pairs too"
        );
    }

    #[test]
    fn repeats_on_each_path_pair_off_one_to_one() {
        let mut dedup = XidDedup::default();
        let kernel: Vec<bool> = (0..3)
            .map(|i| dedup.admit(XidPath::KernelLog, "GPU-a", 13, at(i)))
            .collect();
        assert_eq!(kernel, vec![true, true, true], "three XIDs the driver raised");
        let nvml: Vec<bool> = (0..4)
            .map(|i| dedup.admit(XidPath::Nvml, "GPU-a", 13, at(i)))
            .collect();
        assert_eq!(nvml, vec![false, false, false, true], "the fourth had no twin");
    }

    #[test]
    fn another_gpu_another_code_or_a_report_outside_the_window_is_new() {
        let mut dedup = XidDedup::default();
        assert!(dedup.admit(XidPath::KernelLog, "GPU-a", 79, at(0)));
        assert!(dedup.admit(XidPath::Nvml, "GPU-b", 79, at(0)));
        assert!(dedup.admit(XidPath::Nvml, "GPU-a", 48, at(0)));
        assert!(dedup.admit(XidPath::Nvml, "GPU-a", 79, at(61)));
    }

    #[test]
    fn the_key_falls_back_to_the_address() {
        assert_eq!(gpu_key(Some("GPU-a"), Some("0000:3b:00"), None), "GPU-a");
        assert_eq!(gpu_key(None, Some("0000:3b:00"), None), "pci:0000:3b:00");
        assert_eq!(gpu_key(None, None, None), "unidentified");
        assert_eq!(
            gpu_key(Some("GPU-a"), None, Some(4)),
            "GPU-a/gi:4",
            "two MIG instances' XIDs are two faults"
        );
    }
}

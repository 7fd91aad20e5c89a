//! What each control plane component costs: resident memory and CPU time, read from `/proc`.

use std::path::Path;

/// One component's resource use at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct ComponentUsage {
    /// The component (`etcd`, `kube-apiserver`, ...).
    pub name: String,
    /// Resident set size in bytes (`VmRSS`).
    pub rss_bytes: u64,
    /// Peak resident set size in bytes (`VmHWM`).
    pub peak_rss_bytes: u64,
    /// CPU time used since it started (user + system), in seconds.
    pub cpu_seconds: f64,
}

impl ComponentUsage {
    /// Peak resident set size in MiB.
    #[must_use]
    #[allow(clippy::cast_precision_loss, reason = "bytes shown in MiB")]
    pub fn peak_rss_mib(&self) -> f64 {
        self.peak_rss_bytes as f64 / (1024.0 * 1024.0)
    }
}

/// The machine's load averages over 1, 5 and 15 minutes, as `/proc/loadavg` has them (figures taken
/// under load are upper bounds), or `unknown`.
#[must_use]
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg").map_or_else(
        |_| "unknown".to_owned(),
        |l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
    )
}

/// Reads the usage of process `pid`, or `None` if it is gone.
#[must_use]
#[allow(
    clippy::cast_precision_loss,
    reason = "CPU ticks stay far below 2^52 for any process lifetime"
)]
pub fn read(name: &str, pid: u32, ticks_per_second: u64) -> Option<ComponentUsage> {
    let proc_dir = Path::new("/proc").join(pid.to_string());
    let status = std::fs::read_to_string(proc_dir.join("status")).ok()?;
    let stat = std::fs::read_to_string(proc_dir.join("stat")).ok()?;
    Some(ComponentUsage {
        name: name.to_owned(),
        rss_bytes: status_kib(&status, "VmRSS:")? * 1024,
        peak_rss_bytes: status_kib(&status, "VmHWM:")? * 1024,
        cpu_seconds: cpu_ticks(&stat)? as f64 / ticks_per_second as f64,
    })
}

/// A `kB` field of `/proc/<pid>/status`.
#[must_use]
pub fn status_kib(status: &str, field: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// `utime + stime` from `/proc/<pid>/stat` (fields 14 and 15; the command name in field 2 may hold
/// spaces, so count from the closing parenthesis).
#[must_use]
pub fn cpu_ticks(stat: &str) -> Option<u64> {
    let (_, after_name) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // after_name starts at field 3 (state): utime is field 14, so index 11.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// The kernel's clock ticks per second (`getconf CLK_TCK`; 100 on every common Linux).
#[must_use]
pub fn ticks_per_second() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_user_plus_system_even_when_the_name_has_spaces() {
        let stat = "42 (kube apiserver) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 12 0 5";
        assert_eq!(cpu_ticks(stat), Some(300));
    }

    #[test]
    fn rss_is_read_from_its_status_line() {
        let status = "Name:\tetcd\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\n";
        assert_eq!(status_kib(status, "VmRSS:"), Some(102_400));
        assert_eq!(status_kib(status, "VmHWM:"), Some(204_800));
        assert_eq!(status_kib(status, "VmSwap:"), None);
    }
}

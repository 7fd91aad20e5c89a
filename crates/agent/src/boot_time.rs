//! When the host last booted, from `/proc/stat` (`btime`, host-wide even inside a container). A
//! latched fault older than the boot belongs to a node that has since been recycled.

use jiff::Timestamp;

/// The host's boot time, or `None` where `/proc/stat` is unavailable (then latches never lapse by
/// boot, only by a clear).
#[must_use]
pub fn host_boot_time() -> Option<Timestamp> {
    std::fs::read_to_string("/proc/stat")
        .ok()
        .as_deref()
        .and_then(parse_btime)
}

/// Reads the `btime <seconds since the epoch>` line.
#[must_use]
pub fn parse_btime(proc_stat: &str) -> Option<Timestamp> {
    proc_stat
        .lines()
        .find_map(|line| line.strip_prefix("btime "))
        .and_then(|seconds| seconds.trim().parse::<i64>().ok())
        .and_then(|seconds| Timestamp::from_second(seconds).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_boot_time_is_read_from_the_btime_line() {
        let stat = "cpu  1 2 3\nintr 5\nctxt 99\nbtime 1764403200\nprocesses 7\n";
        assert_eq!(
            parse_btime(stat),
            Some(Timestamp::from_second(1_764_403_200).unwrap())
        );
    }

    #[test]
    fn a_stat_without_btime_gives_no_boot_time() {
        assert_eq!(parse_btime("cpu 1 2 3\n"), None);
    }
}

//! The kernel log a test agent reads (`--kernel-log`) in place of the node's `/dev/kmsg`: records
//! of XIDs logged now, and writing them the way the harness does.

use std::path::Path;

use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

/// The host's boot time (`btime` of `/proc/stat`): the agent places kernel-log records after it.
pub fn booted_at() -> Timestamp {
    let stat = std::fs::read_to_string("/proc/stat").unwrap();
    let seconds = stat
        .lines()
        .find_map(|line| line.strip_prefix("btime "))
        .and_then(|seconds| seconds.trim().parse().ok())
        .expect("btime in /proc/stat");
    Timestamp::from_second(seconds).unwrap()
}

/// A `/dev/kmsg` record of an XID logged now, on the simulated GPU `index` (PCI bus 0x18 + 0x10
/// per index, as `agent_support::gpu` gives it).
pub fn xid_record(sequence: u64, index: u32, xid: u64, text: &str) -> String {
    mig_xid_record(sequence, index, None, xid, text)
}

/// [`xid_record`], attributed by the driver to MIG GPU instance `gpu_instance` when given
/// (`(PCI:0000:38:00 GPU-I:04)`).
pub fn mig_xid_record(sequence: u64, index: u32, gpu_instance: Option<u32>, xid: u64, text: &str) -> String {
    let micros = Timestamp::now().duration_since(booted_at()).as_micros();
    let instance = gpu_instance.map_or_else(String::new, |gi| format!(" GPU-I:{gi:02}"));
    format!(
        "3,{sequence},{micros},-;NVRM: Xid (PCI:0000:{:02x}:00{instance}): {xid}, pid=4242, name=python3, {text}",
        0x18 + index * 0x10
    )
}

/// Writes the scenario's `kernelLog` lines to the agent's kernel log, atomically (what the
/// harness does for the node's `/dev/kmsg`).
pub fn write_kernel_log(path: &Path, scenario: &Value) {
    let lines: Vec<&str> = scenario["kernelLog"]
        .as_array()
        .map(|lines| lines.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let temporary = path.with_extension("tmp");
    std::fs::write(
        &temporary,
        lines.iter().flat_map(|line| [*line, "\n"]).collect::<String>(),
    )
    .unwrap();
    std::fs::rename(&temporary, path).unwrap();
}

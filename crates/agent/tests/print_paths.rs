//! `--once --print` reads every path the loop reads, not NVML alone: an XID only the kernel log
//! holds is reported, a kernel log that cannot be read is a detector fault, and `--kernel-log=`
//! leaves the log out. The real agent binary, with the `file` probe over a recorded fixture.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const AGENT: &str = env!("CARGO_BIN_EXE_gpu-health-agent");
/// GPU 0 of the fixture, at PCI `00000000:18:00.0`.
const GPU0: &str = "GPU-5a1c3f0e-8d2b-4c4e-9f11-2a7d3b6e0c01";

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/h100-healthy.json")
}

/// A kernel log of `records` (`/dev/kmsg`'s format), in a file of this test's own.
fn kernel_log(name: &str, records: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("print-paths-{}-{name}", std::process::id()));
    std::fs::write(&path, records).unwrap();
    path
}

fn print_once(kernel_log: &str) -> Value {
    let fixture = fixture();
    let output = Command::new(AGENT)
        .args(["--once", "--print", "--probe", "file", "--probe-file"])
        .arg(&fixture)
        .arg(format!("--kernel-log={kernel_log}"))
        .output()
        .expect("running the agent");
    assert!(
        output.status.success(),
        "agent failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("--print prints JSON")
}

fn condition(report: &Value) -> (&str, &str, &str) {
    let condition = &report["condition"];
    (
        condition["status"].as_str().unwrap(),
        condition["reason"].as_str().unwrap(),
        condition["message"].as_str().unwrap(),
    )
}

#[test]
fn an_xid_only_the_kernel_log_holds_is_printed_against_its_gpu() {
    let log = kernel_log(
        "xid79",
        "3,1,10000000,-;NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus.\n",
    );
    let report = print_once(log.to_str().unwrap());
    let (status, reason, message) = condition(&report);
    assert_eq!((status, reason), ("False", "XID79"), "{report:#}");
    assert!(message.contains(GPU0), "the message names GPU 0: {message}");
    assert_eq!(report["kernelLog"], log.to_str().unwrap());
    std::fs::remove_file(log).unwrap();
}

#[test]
fn a_kernel_log_that_cannot_be_read_is_a_detector_fault_in_print() {
    let missing = std::env::temp_dir().join(format!("print-paths-{}-absent", std::process::id()));
    let report = print_once(missing.to_str().unwrap());
    let (status, reason, _) = condition(&report);
    assert_eq!((status, reason), ("Unknown", "KernelLogUnreadable"), "{report:#}");
}

#[test]
fn an_empty_kernel_log_flag_reads_the_probe_alone() {
    let report = print_once("");
    let (status, reason, _) = condition(&report);
    assert_eq!((status, reason), ("True", "GpusHealthy"), "{report:#}");
    assert_eq!(report["kernelLog"], Value::Null);
}

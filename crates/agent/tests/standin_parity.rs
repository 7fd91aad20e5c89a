//! The stand-in NVML library (`crates/nvml-standin`) against the `file` probe: every recorded
//! fixture, read once by the real agent binary through each probe, gives the same readings. This
//! runs nvml-wrapper and the agent's NVML probe (symbol binding, error mapping, `NotSupported`
//! handling, `GPU_IS_LOST`) without a GPU, and keeps the stand-in's reading of the scenario format
//! from drifting from the file probe's. And `gpu-check.sh` passes with the stand-in in NVML's place.
//!
//! XID events are left out: `--once` runs no event thread (the e2e tests cover it), and a failed
//! call's error text is NVML's, not the fixture's, so failed calls compare by device and function.

use std::{path::Path, process::Command};

use serde_json::Value;

#[path = "../../nvml-standin/tests/support/built.rs"]
mod support;

const AGENT: &str = env!("CARGO_BIN_EXE_gpu-health-agent");

fn print_once(args: &[&str], scenario: Option<&Path>) -> Value {
    let mut command = Command::new(AGENT);
    // The kernel log only where a test names one: the host's would speak for the host.
    command.args(["--once", "--print", "--kernel-log="]).args(args);
    if let Some(scenario) = scenario {
        command.env("GPU_STANDIN_SCENARIO", scenario);
    }
    let output = command.output().expect("running the agent");
    assert!(
        output.status.success(),
        "agent {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("--print prints JSON")
}

/// The readings without what the two probes legitimately tell differently.
fn comparable(readings: &Value) -> Value {
    let mut readings = readings.clone();
    let object = readings.as_object_mut().expect("readings, not an error");
    object.remove("xidEvents");
    let mut calls: Vec<String> = object
        .remove("failedCalls")
        .and_then(|calls| serde_json::from_value(calls).ok())
        .unwrap_or_default();
    calls = calls
        .iter()
        .map(|call| {
            call.rsplit_once(": ")
                .map_or(call.clone(), |(place, _)| place.to_owned())
        })
        .collect();
    calls.sort();
    object.insert("failedCalls".to_owned(), calls.into());
    readings
}

#[test]
fn every_fixture_reads_the_same_through_the_file_probe_and_the_standin_nvml() {
    let library = support::standin_library();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut compared = Vec::new();
    for entry in std::fs::read_dir(&fixtures).unwrap() {
        let fixture = entry.unwrap().path();
        let file = print_once(
            &["--probe", "file", "--probe-file", fixture.to_str().unwrap()],
            None,
        );
        let nvml = print_once(
            &["--probe", "nvml", "--nvml-library", library.to_str().unwrap()],
            Some(&fixture),
        );
        assert_eq!(nvml["probe"], "nvml");
        assert_eq!(
            comparable(&nvml["readings"]),
            comparable(&file["readings"]),
            "{}: the stand-in NVML read differently from the file",
            fixture.display()
        );
        compared.push(fixture.file_name().unwrap().to_string_lossy().into_owned());
    }
    assert!(compared.len() >= 7, "fixtures found: {compared:?}");
}

#[test]
fn nvml_init_failing_reads_unknown_through_the_standin() {
    let library = support::standin_library();
    let dir = std::env::temp_dir().join(format!("standin-parity-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let scenario = dir.join("driver-not-loaded.json");
    std::fs::write(&scenario, r#"{"nvmlError": "Driver Not Loaded"}"#).unwrap();
    let report = print_once(
        &["--probe", "nvml", "--nvml-library", library.to_str().unwrap()],
        Some(&scenario),
    );
    assert_eq!(report["condition"]["status"], "Unknown", "{report:#}");
    assert_eq!(report["condition"]["reason"], "NvmlUnavailable");
    let error = report["readings"]["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("nvmlInit") && error.contains("NVIDIA driver is not loaded"),
        "{error}"
    );
}

/// `gpu-check.sh`, the real-GPU check, run as on a GPU machine: the stand-in is found on the loader
/// path under NVML's own name (`libnvidia-ml.so.1`), as the driver's library would be.
#[test]
fn gpu_check_sh_passes_with_the_standin_as_libnvidia_ml() {
    let library = support::standin_library();
    let loader_dir = std::env::temp_dir().join(format!("standin-gpu-check-{}", std::process::id()));
    std::fs::create_dir_all(&loader_dir).unwrap();
    let soname = loader_dir.join("libnvidia-ml.so.1");
    let _ = std::fs::remove_file(&soname);
    std::os::unix::fs::symlink(library, &soname).unwrap();
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let run = |scenario: &str| {
        Command::new("bash")
            .arg(manifest.join("gpu-check.sh"))
            .env("AGENT_BIN", AGENT)
            .env("LD_LIBRARY_PATH", &loader_dir)
            .env(
                "GPU_STANDIN_SCENARIO",
                manifest.join("tests/fixtures").join(scenario),
            )
            .output()
            .expect("running gpu-check.sh")
    };
    let healthy = run("h100-healthy.json");
    let stdout = String::from_utf8_lossy(&healthy.stdout);
    assert!(
        healthy.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&healthy.stderr)
    );
    assert!(
        stdout.contains("ok: GpuHealthy=True/GpusHealthy with 2 GPUs"),
        "{stdout}"
    );
    assert!(
        stdout.contains("ok: GpuHealthy=False/GpuMissing when one GPU more is expected"),
        "{stdout}"
    );
    let broken = run("a100-row-remap-failed.json");
    assert!(
        !broken.status.success(),
        "a broken GPU fails the check: {}",
        String::from_utf8_lossy(&broken.stdout)
    );
}

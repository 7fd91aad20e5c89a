//! `make demo` as a user runs it, minus the wait for Ctrl-C: the real `gpu-sandbox demo` and
//! `gpu-remediator` binaries, built here, end to end (its own control plane, fleet, manifests,
//! sample policy, the controller process under its service account). It must reach `Succeeded`,
//! print its summary with every figure, say the PDBs held, show a new pod held off the quarantined
//! node while `for` runs, show the escalation ladder on a node whose GPU reset leaves it broken:
//! validation fails, the node stays cordoned, the ladder climbs to a reboot that heals it, and
//! validation passes (no replacement); and tear everything down.

use std::time::{Duration, Instant};

#[test]
fn the_demo_recycles_a_node_and_prints_its_summary_with_budgets_honoured() {
    // Both binaries, as `make demo` builds them.
    let bin = e2e::build_binaries(&[
        ("gpu-remediator", "gpu-remediator"),
        ("gpu-sandbox", "gpu-sandbox"),
    ]);
    let started = Instant::now();
    let output = std::process::Command::new("timeout")
        .arg("600")
        .arg(bin.join("gpu-sandbox"))
        .args(["demo", "--exit-after", "--controller"])
        .arg(bin.join("gpu-remediator"))
        .arg("--repo")
        .arg(e2e::WORKSPACE)
        .env(
            "RUST_LOG",
            "warn,kube_client::client::builder=off,gpu_sandbox::fleet::heartbeat=error",
        )
        .output()
        .expect("running gpu-sandbox demo");
    let wall = started.elapsed();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the demo failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    for expected in [
        "FAULT on gpu-",
        "QUARANTINED gpu-",
        "stays Pending (0/",
        "untolerated taint",
        "not remediated yet: a trigger holds",
        "policy h100-replace-on-gpu-loss governs the node",
        " Cordoned",
        " Draining",
        " Succeeded",
        "summary: gpu-",
        "time to cordon:    ",
        "time to drained:   ",
        "time to replaced:  ",
        "through the Eviction API",
        "attempts refused by a PDB (429)",
        "training job llm-train: 2 pods on gpu-",
        "PDBs honoured:     yes",
        "the node group brought up gpu-",
        "LADDER: policy demo-repair-before-replace governs gpu-",
        "proven by a validation Job (dcgmi diag)",
        "VALIDATION FAILED, climbing: ResetGpu",
        "validation Job gpu-remediation/",
        "ResetGpu Permanent, Reboot Succeeded in ",
        "validation failed after the reset (the GPU still broken) and passed after the reboot",
        "nothing replaced",
        "torn down",
    ] {
        assert!(stdout.contains(expected), "{expected:?} missing from:\n{stdout}");
    }
    assert!(
        !stdout.contains("not reached"),
        "a phase was never reached:\n{stdout}"
    );
    assert!(
        wall < Duration::from_secs(180),
        "the demo took {wall:?} (the point is to show it in a minute)"
    );
    eprintln!("figure: the demo ran in {:.1}s\n{stdout}", wall.as_secs_f64());
}

//! e2e: XIDs from the kernel log. The real `gpu-health-agent` reads a kernel-log file (the
//! scenario's `kernelLog` lines, written by the harness where the agent reads `/dev/kmsg` on a
//! node) next to its probe, under both probes (`name::file`, `name::nvml` with the stand-in
//! library): an XID only the kernel log shows sets the condition once, naming the GPU; one XID
//! on both paths counts once; an XID raised while the agent was down is seen at its start, one a
//! person already cleared is not; a log the agent cannot read is `Unknown`, never a GPU fault.

#[macro_use]
mod agent_support;
mod common;

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use agent_support::{
    AgentGround, AgentProcess, Probe, assert_condition_stays, count_events, current_condition, healthy_gpus,
    kernel_log::{write_kernel_log, xid_record},
    wait_for_condition, wait_for_event, wait_for_fault_set_once, wait_until_healthy, write_probe_file,
};
use gpu_remediation_api::constants::{CLEAR_ANNOTATION, FAILED_GPUS_ANNOTATION};
use k8s_openapi::{api::core::v1::Node, jiff::Timestamp};
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use serde_json::{Value, json};

for_both_probes!(
    an_xid_79_only_in_the_kernel_log_sets_the_condition_once_and_an_xid_on_both_paths_counts_once,
    an_xid_raised_while_the_agent_was_down_is_seen_and_a_cleared_one_is_not_raised_again,
    an_unreadable_kernel_log_reads_unknown_never_a_gpu_fault,
);

/// Appends `line` to the scenario's kernel log and writes both files (the log first).
fn log(scenario: &mut Value, line: &str, kernel_log: &Path, probe_file: &Path) {
    scenario["kernelLog"].as_array_mut().unwrap().push(json!(line));
    write_kernel_log(kernel_log, scenario);
    write_probe_file(probe_file, scenario);
}

/// A scenario of healthy GPUs whose kernel log holds only other drivers' lines and junk.
fn quiet_scenario(node: &str) -> Value {
    let mut scenario = healthy_gpus(node);
    scenario["kernelLog"] = json!([
        "6,1,1000000,-;usb 1-1: new high-speed USB device number 2 using xhci_hcd",
        "not a kernel log record",
        "4,2,2000000,-;NVRM: GPU at PCI:0000:18:00: GPU-0 loaded",
    ]);
    scenario
}

/// Starts `node`'s agent on `scenario`, reading `kernel_log` (written first).
async fn start(
    ground: &AgentGround,
    probe: Probe,
    node: &str,
    scenario: &Value,
    kernel_log: &Path,
) -> AgentProcess {
    write_kernel_log(kernel_log, scenario);
    let flag = format!("--kernel-log={}", kernel_log.display());
    ground
        .start_agent(
            probe,
            node,
            scenario,
            &[&flag, "--warning-threshold", "2", "--warning-window", "5m"],
        )
        .await
}

fn kernel_log_of(ground: &AgentGround, node: &str) -> PathBuf {
    ground.dir.join(format!("{node}.kmsg"))
}

async fn an_xid_79_only_in_the_kernel_log_sets_the_condition_once_and_an_xid_on_both_paths_counts_once(
    probe: Probe,
) {
    let ground = AgentGround::new(&format!("kmsg-once-{probe:?}"), 1).await;
    let client = ground.client.clone();
    let node = ground.fleet.node_names().remove(0);
    let (kernel_log, probe_file) = (kernel_log_of(&ground, &node), ground.probe_file(&node));
    let mut scenario = quiet_scenario(&node);
    let agent = start(&ground, probe, &node, &scenario, &kernel_log).await;
    wait_until_healthy(&client, &node, &agent).await;

    // One XID 13 on GPU 1, reported by NVML's event API and by the kernel log: one occurrence,
    // short of the warning threshold of two.
    scenario["xidEvents"] = json!([{"id": 1, "xid": 13, "gpuUuid": format!("GPU-{node}-0001")}]);
    log(
        &mut scenario,
        &xid_record(3, 1, 13, "Graphics SM Warp Exception"),
        &kernel_log,
        &probe_file,
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        count_events(&client, &node, "XID13").await,
        0,
        "one XID on two paths counted twice\nagent log:\n{}",
        agent.log_tail()
    );
    // A second XID 13, in the kernel log only: the second occurrence, so the warning Event.
    log(
        &mut scenario,
        &xid_record(4, 1, 13, "Graphics SM Warp Exception"),
        &kernel_log,
        &probe_file,
    );
    let warning = wait_for_event(&client, &node, "XID13", &agent).await;
    assert!(
        warning.note.as_deref().unwrap_or_default().contains("2 times"),
        "{:?}",
        warning.note
    );

    // XID 79 on GPU 2, in the kernel log only (NVML's event API silent, the GPU still listed).
    log(
        &mut scenario,
        &xid_record(5, 2, 79, "GPU has fallen off the bus."),
        &kernel_log,
        &probe_file,
    );
    let uuid = format!("GPU-{node}-0002");
    wait_for_fault_set_once(
        &client,
        &node,
        "XID79",
        &[&uuid, "00000000:38:00.0", "kernel log at"],
        &agent,
    )
    .await;
    drop(agent);
    ground.stop().await;
}

async fn an_xid_raised_while_the_agent_was_down_is_seen_and_a_cleared_one_is_not_raised_again(probe: Probe) {
    let ground = AgentGround::new(&format!("kmsg-down-{probe:?}"), 1).await;
    let client = ground.client.clone();
    let node = ground.fleet.node_names().remove(0);
    let (kernel_log, probe_file) = (kernel_log_of(&ground, &node), ground.probe_file(&node));
    let mut scenario = quiet_scenario(&node);
    let agent = start(&ground, probe, &node, &scenario, &kernel_log).await;
    wait_until_healthy(&client, &node, &agent).await;
    drop(agent);
    tokio::time::sleep(Duration::from_secs(2)).await;

    // While no agent runs, the driver logs XID 79 on GPU 3; the next agent finds it in the log.
    log(
        &mut scenario,
        &xid_record(3, 3, 79, "GPU has fallen off the bus."),
        &kernel_log,
        &probe_file,
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let agent = start(&ground, probe, &node, &scenario, &kernel_log).await;
    let latched = wait_for_condition(&client, &node, "False", "XID79", Duration::from_secs(60), &agent).await;
    assert!(
        latched
            .message
            .as_deref()
            .unwrap_or_default()
            .contains(&format!("GPU-{node}-0003")),
        "{latched:?}"
    );

    // A person clears it (the GPU was reset): healthy again, and a restarted agent reading the
    // same log does not raise the handled XID again.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let patch = json!({"metadata": {"annotations": {CLEAR_ANNOTATION: Timestamp::now().to_string()}}});
    Api::<Node>::all(client.clone())
        .patch(&node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    wait_until_healthy(&client, &node, &agent).await;
    drop(agent);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let agent = start(&ground, probe, &node, &scenario, &kernel_log).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let condition = current_condition(&client, &node).await;
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_deref()),
        ("True", Some("GpusHealthy")),
        "the cleared XID came back\nagent log:\n{}",
        agent.log_tail()
    );
    drop(agent);
    ground.stop().await;
}

async fn an_unreadable_kernel_log_reads_unknown_never_a_gpu_fault(probe: Probe) {
    let ground = AgentGround::new(&format!("kmsg-unreadable-{probe:?}"), 1).await;
    let client = ground.client.clone();
    let node = ground.fleet.node_names().remove(0);
    let absent = ground.dir.join(format!("{node}-absent.kmsg"));
    let flag = format!("--kernel-log={}", absent.display());
    let agent = ground
        .start_agent(probe, &node, &healthy_gpus(&node), &[&flag])
        .await;
    let condition = wait_for_condition(
        &client,
        &node,
        "Unknown",
        "KernelLogUnreadable",
        Duration::from_secs(60),
        &agent,
    )
    .await;
    let message = condition.message.unwrap_or_default();
    assert!(
        message.contains(&absent.display().to_string()),
        "names the log: {message}"
    );
    assert!(message.contains("cannot be read"), "{message}");
    // Never a GPU fault: no False while it stays unreadable, nothing latched, nothing to remediate.
    assert_condition_stays(&client, &node, "Unknown").await;
    let nodes: Api<Node> = Api::all(client.clone());
    let annotations = nodes
        .get(&node)
        .await
        .unwrap()
        .metadata
        .annotations
        .unwrap_or_default();
    assert!(
        !annotations.contains_key(FAILED_GPUS_ANNOTATION),
        "no failed GPUs: {annotations:?}"
    );
    // Once the log can be read, the detector fault lifts.
    std::fs::write(&absent, "6,1,1000000,-;usb 1-1: new device\n").unwrap();
    wait_until_healthy(&client, &node, &agent).await;
    drop(agent);
    ground.stop().await;
}

//! e2e: NVLink and fabric faults through the real `gpu-health-agent`, under both probes (the `file`
//! probe, and the real NVML probe loading the stand-in library, which answers
//! `nvmlDeviceGetNvLinkState`, `nvmlDeviceGetNvLinkErrorCounter` and `nvmlDeviceGetGpuFabricInfo`
//! from the same scenario). An 8-GPU HGX node whose GPU 5 loses a link reads `NvlinkDown` naming
//! GPU 5 and the link, records GPU 5 as the failed GPU, and a policy whose trigger selects
//! `NvlinkDown` by reason admits the node (the controller, in-process, creates its
//! `GpuRemediation`); a fabric that never registers reads `FabricNotReady` once the catalog's grace
//! (overridden to a few seconds) has passed, not before; a link's replay counter rising past the
//! catalog's limit within its window reads `NvlinkErrors` naming the GPU, link and counter.

#[macro_use]
mod agent_support;
mod common;

use std::time::{Duration, Instant};

use agent_support::{AgentGround, Probe, gpu, wait_for_condition, wait_until_healthy, write_probe_file};
use gpu_remediation_api::{
    GpuRemediation, GpuRemediationPolicy,
    constants::{FAILED_GPUS_ANNOTATION, gpu_reasons},
};
use gpu_sandbox::fleet::FLEET_LABEL;
use k8s_openapi::api::core::v1::Node;
use kube::{Api, api::ListParams};
use serde_json::{Value, json};

for_both_probes!(
    a_link_down_on_gpu_5_of_8_is_nvlink_down_naming_it_and_a_trigger_on_that_reason_admits_the_node,
    a_fabric_that_never_registers_is_fabric_not_ready_after_the_grace,
    link_errors_rising_past_the_catalog_rate_are_nvlink_errors,
);

/// GPUs on an HGX H100 board.
const HGX_GPUS: u32 = 8;
/// NVLink links per H100.
const LINKS: u32 = 18;

/// An HGX node: 8 GPUs, every link up with clean counters, the fabric registered.
fn hgx(node: &str) -> Value {
    let gpus: Vec<Value> = (0..HGX_GPUS)
        .map(|index| {
            let mut reading = gpu(node, index);
            reading["nvlinks"] = (0..LINKS)
                .map(|link| {
                    json!({"link": link, "active": true,
                           "errors": {"crcFlit": 0, "crcData": 0, "replay": 0, "recovery": 0}})
                })
                .collect();
            reading["fabric"] = json!({"state": "completed", "status": 0});
            reading
        })
        .collect();
    json!({ "gpus": gpus })
}

fn expect_eight() -> [&'static str; 2] {
    ["--expected-gpus", "8"]
}

/// A policy over this fleet only, admitting a node on `NvlinkDown` or `FabricNotReady` held 2s.
fn nvlink_policy(fleet: &str) -> GpuRemediationPolicy {
    serde_json::from_value(json!({
        "apiVersion": "gpuremediation.dev/v1alpha1",
        "kind": "GpuRemediationPolicy",
        "metadata": {"name": fleet, "labels": {"e2e.gpuremediation.dev/scope": fleet}},
        "spec": {
            "nodeSelector": {"matchLabels": {FLEET_LABEL: fleet}},
            "triggers": [{
                "conditionType": "GpuHealthy",
                "status": "False",
                "reasons": [gpu_reasons::NVLINK_DOWN, gpu_reasons::FABRIC_NOT_READY],
                "for": "2s",
            }],
            "action": "Replace",
            "replacement": {"strategy": "DeleteNode", "timeout": "5s"},
            "safety": {"maxConcurrent": 1, "maxUnhealthy": "100%"},
            "mode": "Enforce",
        },
    }))
    .expect("the policy parses")
}

async fn a_link_down_on_gpu_5_of_8_is_nvlink_down_naming_it_and_a_trigger_on_that_reason_admits_the_node(
    probe: Probe,
) {
    let client = common::cluster().await.client();
    common::install_generated_crds(&client).await;
    let ground = AgentGround::new(&format!("nvlink-down-{probe:?}"), 1).await;
    let node = ground.fleet.node_names().remove(0);
    let agent = ground
        .start_agent(probe, &node, &hgx(&node), &expect_eight())
        .await;
    let healthy = wait_until_healthy(&client, &node, &agent).await;
    assert_eq!(
        healthy.message.as_deref(),
        Some("8 of 8 expected GPUs present and healthy")
    );
    let stop_controller =
        common::run_controller_over(&client, &nvlink_policy(ground.fleet.name()), ground.fleet.name()).await;

    // Link 11 of GPU 5 goes down; every other link of the board stays up.
    let mut broken = hgx(&node);
    broken["gpus"][5]["nvlinks"][11]["active"] = json!(false);
    write_probe_file(&ground.probe_file(&node), &broken);
    let condition = wait_for_condition(
        &client,
        &node,
        "False",
        gpu_reasons::NVLINK_DOWN,
        Duration::from_secs(10),
        &agent,
    )
    .await;
    let message = condition.message.unwrap_or_default();
    assert!(
        message.starts_with(&format!("GPU 5 (UUID GPU-{node}-0005, PCI 00000000:68:00.0)")),
        "names GPU 5: {message}"
    );
    assert!(
        message.contains("NVLink link 11 down (17 of 18 links up)"),
        "names the link: {message}"
    );
    let annotated = Api::<Node>::all(client.clone()).get(&node).await.unwrap();
    let failed: Value = serde_json::from_str(
        annotated
            .metadata
            .annotations
            .as_ref()
            .and_then(|annotations| annotations.get(FAILED_GPUS_ANNOTATION))
            .expect("the failed GPUs are recorded"),
    )
    .unwrap();
    assert_eq!(failed.as_array().map(Vec::len), Some(1), "only GPU 5: {failed}");
    assert_eq!(failed[0]["uuid"], json!(format!("GPU-{node}-0005")));
    assert_eq!(failed[0]["reason"], json!(gpu_reasons::NVLINK_DOWN));

    // The policy's trigger selects the reason: the controller admits the node.
    let remediations: Api<GpuRemediation> = Api::all(client.clone());
    let admitted = common::eventually(
        "a GpuRemediation of the node triggered by NvlinkDown",
        Duration::from_secs(30),
        || async {
            remediations
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .find(|remediation| remediation.spec.node_name == node)
        },
    )
    .await;
    let trigger = &admitted.spec.trigger;
    assert_eq!(trigger.reason, gpu_reasons::NVLINK_DOWN);
    assert!(
        trigger.message.contains(&format!("GPU-{node}-0005")),
        "{}",
        trigger.message
    );

    let _ = stop_controller.send(());
    drop(agent);
    ground.stop().await;
}

async fn a_fabric_that_never_registers_is_fabric_not_ready_after_the_grace(probe: Probe) {
    const GRACE: Duration = Duration::from_secs(4);
    let ground = AgentGround::new(&format!("fabric-{probe:?}"), 1).await;
    let client = ground.client.clone();
    let node = ground.fleet.node_names().remove(0);
    let override_file = ground.dir.join("catalog-override.yaml");
    std::fs::write(
        &override_file,
        format!("nvlink:\n  fabricGraceSeconds: {}\n", GRACE.as_secs()),
    )
    .unwrap();
    // GPU 3's fabric never gets past "not started" (Fabric Manager down, say).
    let mut stuck = hgx(&node);
    stuck["gpus"][3]["fabric"] = json!({"state": "notStarted", "status": 0});
    let started = Instant::now();
    let override_path = override_file.display().to_string();
    let mut flags = expect_eight().to_vec();
    flags.extend(["--xid-catalog-override", &override_path]);
    let agent = ground.start_agent(probe, &node, &stuck, &flags).await;
    // Within the grace it is healthy.
    wait_until_healthy(&client, &node, &agent).await;
    let condition = wait_for_condition(
        &client,
        &node,
        "False",
        gpu_reasons::FABRIC_NOT_READY,
        Duration::from_secs(30),
        &agent,
    )
    .await;
    assert!(
        started.elapsed() >= GRACE,
        "FabricNotReady before the grace: {:?}",
        started.elapsed()
    );
    let message = condition.message.unwrap_or_default();
    assert!(
        message.starts_with(&format!("GPU 3 (UUID GPU-{node}-0003")),
        "names GPU 3: {message}"
    );
    assert!(
        message.contains("NVLink fabric registration not started for")
            && message.contains("past the 4s grace; recommended action RESTART_BM"),
        "{message}"
    );
    drop(agent);
    ground.stop().await;
}

async fn link_errors_rising_past_the_catalog_rate_are_nvlink_errors(probe: Probe) {
    let ground = AgentGround::new(&format!("nvlink-errors-{probe:?}"), 1).await;
    let client = ground.client.clone();
    let node = ground.fleet.node_names().remove(0);
    let agent = ground
        .start_agent(probe, &node, &hgx(&node), &expect_eight())
        .await;
    wait_until_healthy(&client, &node, &agent).await;
    // 40 replays on GPU 2's link 4: under the shipped 100 per 300 s, still healthy.
    let mut errors = hgx(&node);
    errors["gpus"][2]["nvlinks"][4]["errors"]["replay"] = json!(40);
    write_probe_file(&ground.probe_file(&node), &errors);
    tokio::time::sleep(Duration::from_secs(3)).await;
    wait_until_healthy(&client, &node, &agent).await;
    // 460 more within seconds: past the limit.
    errors["gpus"][2]["nvlinks"][4]["errors"]["replay"] = json!(500);
    write_probe_file(&ground.probe_file(&node), &errors);
    let condition = wait_for_condition(
        &client,
        &node,
        "False",
        gpu_reasons::NVLINK_ERRORS,
        Duration::from_secs(10),
        &agent,
    )
    .await;
    let message = condition.message.unwrap_or_default();
    assert!(
        message.starts_with(&format!("GPU 2 (UUID GPU-{node}-0002"))
            && message.contains("link 4 replay errors +500 (limit 100)"),
        "{message}"
    );
    drop(agent);
    ground.stop().await;
}

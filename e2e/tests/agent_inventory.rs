//! e2e: the hardware the agent publishes on its own node, under its own role and through both
//! probes (under `nvml` the serial, part number and VBIOS come through nvml-wrapper from the
//! stand-in library): the GPU inventory annotation appears, is rewritten only when the GPUs
//! change, a fault's GPUs appear in the failed-GPUs annotation with their serials, and an agent
//! restarted on a node whose NVML fails keeps both as they were.

#[macro_use]
mod agent_support;
mod common;

use std::time::Duration;

use agent_support::{
    GPUS, Probe, healthy_gpus, one_healthy_agent, serial, wait_until_gpu_missing, write_probe_file,
};
use gpu_remediation_api::constants::{FAILED_GPUS_ANNOTATION, GPU_INVENTORY_ANNOTATION};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};
use serde_json::{Value, json};

for_both_probes!(the_agent_publishes_its_gpus_and_the_failed_ones_on_its_node);

/// What the agent logs each time it writes changed annotations.
const CHANGED: &str = "node GPU annotations changed";

async fn annotation(client: &Client, node: &str, key: &str) -> Option<Value> {
    let node = Api::<Node>::all(client.clone()).get(node).await.ok()?;
    let text = node.metadata.annotations?.get(key)?.clone();
    Some(serde_json::from_str(&text).unwrap_or_else(|e| panic!("{key} is not JSON ({e}): {text}")))
}

/// The inventory of the scenario GPUs `indices`. NVML numbers the GPUs it sees from 0, so under
/// `nvml` a GPU after a vanished one moves down; the file probe keeps the file's index.
fn expected_inventory(probe: Probe, node: &str, indices: &[u32]) -> Value {
    indices
        .iter()
        .enumerate()
        .map(|(position, index)| {
            json!({
                "index": if probe == Probe::Nvml { u32::try_from(position).unwrap() } else { *index },
                "uuid": format!("GPU-{node}-{index:04}"),
                "serial": serial(node, *index),
                "pciBusId": format!("00000000:{:02X}:00.0", 0x18 + index * 0x10),
                "boardPartNumber": "692-2G520-0200-000",
                "vbiosVersion": "96.00.5E.00.01",
                "name": "NVIDIA H100 80GB HBM3",
            })
        })
        .collect()
}

async fn the_agent_publishes_its_gpus_and_the_failed_ones_on_its_node(probe: Probe) {
    let (ground, node, agent) = one_healthy_agent(&format!("inventory-{probe:?}"), probe).await;
    let client = ground.client.clone();
    let scenario = ground.probe_file(&node);

    let all: Vec<u32> = (0..GPUS).collect();
    let inventory = common::eventually("the inventory annotation", Duration::from_secs(10), || {
        annotation(&client, &node, GPU_INVENTORY_ANNOTATION)
    })
    .await;
    assert_eq!(inventory, expected_inventory(probe, &node, &all));
    assert_eq!(
        annotation(&client, &node, FAILED_GPUS_ANNOTATION).await,
        None,
        "nothing failed"
    );

    // Five more reads of the same GPUs: no new write.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        agent.log().matches(CHANGED).count(),
        1,
        "written once while unchanged:\n{}",
        agent.log_tail()
    );
    let managers: Vec<(Option<String>, Option<String>)> = Api::<Node>::all(client.clone())
        .get(&node)
        .await
        .unwrap()
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter(|entry| {
            entry
                .fields_v1
                .as_ref()
                .is_some_and(|fields| fields.0.to_string().contains(GPU_INVENTORY_ANNOTATION))
        })
        .map(|entry| (entry.manager, entry.subresource))
        .collect();
    assert_eq!(
        managers,
        [(Some("gpu-health-agent".to_owned()), Some("status".to_owned()))],
        "written by the agent through nodes/status"
    );

    // GPU 2 falls off: the inventory loses it, the failed list names it with its serial.
    let mut fallen = healthy_gpus(&node);
    fallen["gpus"].as_array_mut().unwrap().remove(2);
    write_probe_file(&scenario, &fallen);
    wait_until_gpu_missing(&client, &node, &agent).await;
    let failed = common::eventually("the failed-GPUs annotation", Duration::from_secs(5), || {
        annotation(&client, &node, FAILED_GPUS_ANNOTATION)
    })
    .await;
    assert_eq!(
        failed,
        json!([{
            "uuid": format!("GPU-{node}-0002"),
            "serial": serial(&node, 2),
            "index": 2,
            "pciBusId": "00000000:38:00.0",
            "reason": "GpuMissing",
        }])
    );
    let inventory = Some(expected_inventory(probe, &node, &[0, 1, 3]));
    assert_eq!(
        annotation(&client, &node, GPU_INVENTORY_ANNOTATION).await,
        inventory
    );
    drop(agent);

    // A new agent that cannot read the GPUs at all keeps the latch, the failed GPUs (serial
    // included) and the inventory as they were: nothing is rewritten.
    let agent = ground
        .start_agent(probe, &node, &json!({"nvmlError": "Driver Not Loaded"}), &[])
        .await;
    common::eventually(
        "the new agent to restore the latch",
        Duration::from_secs(30),
        || async { agent.log().contains("restoring latched fault").then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let condition = agent_support::gpu_condition(&Api::<Node>::all(client.clone()).get(&node).await.unwrap());
    assert_eq!(condition.map(|c| c.status).as_deref(), Some("False"));
    assert_eq!(
        annotation(&client, &node, FAILED_GPUS_ANNOTATION).await,
        Some(failed)
    );
    assert_eq!(
        annotation(&client, &node, GPU_INVENTORY_ANNOTATION).await,
        inventory
    );
    assert_eq!(agent.log().matches(CHANGED).count(), 0, "{}", agent.log_tail());
    drop(agent);
    ground.stop().await;
}

//! e2e: the real agent on a DRA-only node (the GPU Operator's DRA mode: no device plugin, no GPU
//! Feature Discovery, so no `nvidia.com/gpu.count` label). Its GPUs are published as the devices of
//! the sandbox's DRA driver in the node's `ResourceSlice` (`gpu_sandbox::dra`, named to the agent
//! by `--dra-driver` in place of NVIDIA's `gpu.nvidia.com`); the agent, under the shipped RBAC,
//! lists them and expects their whole GPUs, so a node that comes up with a
//! GPU already gone is `GpuMissing` without any label. With `--dra-driver=` (slices not read) the
//! same node reads healthy with no expected count: the slices are what made the difference.
//!
//! The GPU-scoped drain on DRA (a claim's device to the pods holding it) is `dra.rs` and
//! `quarantine_dra.rs`.

#[macro_use]
mod agent_support;
mod common;

use std::time::Duration;

use agent_support::{AgentGround, GPUS, Probe, agent_kubeconfig, gpu, scratch, wait_for_condition};
use common::cluster_with;
use gpu_remediation_api::constants::{GPU_COUNT_LABEL, gpu_reasons};
use gpu_sandbox::{ControlPlaneOptions, Dra, Fleet, FleetOptions};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use serde_json::json;

fn with_dra() -> ControlPlaneOptions {
    ControlPlaneOptions {
        dra: Dra::On,
        ..ControlPlaneOptions::default()
    }
}

/// A one-node DRA fleet whose node has no count label, as an agent test's ground, and the node.
async fn dra_only_node(name: &str) -> (AgentGround, String) {
    let client = cluster_with(with_dra).await.client();
    let fleet = Fleet::start(
        client.clone(),
        FleetOptions {
            nodes: 1,
            name_prefix: common::unique_name("dra-only"),
            gpus_per_node: GPUS,
            dra: true,
            ..FleetOptions::default()
        },
    )
    .await
    .expect("starting the DRA fleet");
    let node = fleet.node_names().remove(0);
    // No GPU Feature Discovery on a DRA-only node: no count label.
    let unlabel = json!({"metadata": {"labels": {GPU_COUNT_LABEL: null}}});
    Api::<Node>::all(client.clone())
        .patch(&node, &PatchParams::default(), &Patch::Merge(&unlabel))
        .await
        .unwrap();
    let dir = scratch(name);
    let kubeconfig = agent_kubeconfig(&client, &dir).await;
    let ground = AgentGround {
        client,
        dir,
        kubeconfig,
        fleet,
    };
    (ground, node)
}

/// The node's GPUs less the last: it came up with one already gone.
fn one_gone(node: &str) -> serde_json::Value {
    json!({"gpus": (0..GPUS - 1).map(|index| gpu(node, index)).collect::<Vec<_>>()})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dra_only_node_expects_the_gpus_its_slices_list_and_one_gone_at_start_up_is_missing() {
    let (ground, node) = dra_only_node("dra-only-missing").await;
    let driver = format!("--dra-driver={}", gpu_sandbox::dra::DRIVER);
    let agent = ground
        .start_agent(Probe::File, &node, &one_gone(&node), &[&driver])
        .await;
    let condition = wait_for_condition(
        &ground.client,
        &node,
        "False",
        gpu_reasons::GPU_MISSING,
        Duration::from_secs(30),
        &agent,
    )
    .await;
    let message = condition.message.unwrap_or_default();
    assert!(
        message.starts_with(&format!("{} of {GPUS} expected GPUs visible", GPUS - 1)),
        "{message}"
    );
    assert!(
        agent
            .log()
            .contains("expected GPU count from the node's DRA ResourceSlices"),
        "the agent says where its count came from:\n{}",
        agent.log_tail()
    );
    drop(agent);
    ground.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_reading_the_slices_the_same_node_has_no_expected_count_and_reads_healthy() {
    let (ground, node) = dra_only_node("dra-only-unread").await;
    let agent = ground
        .start_agent(Probe::File, &node, &one_gone(&node), &["--dra-driver="])
        .await;
    let condition = wait_for_condition(
        &ground.client,
        &node,
        "True",
        "GpusHealthy",
        Duration::from_secs(30),
        &agent,
    )
    .await;
    let message = condition.message.unwrap_or_default();
    assert!(
        message.contains(&format!(
            "{} GPUs present and healthy (no expected count)",
            GPUS - 1
        )),
        "{message}"
    );
    drop(agent);
    ground.stop().await;
}

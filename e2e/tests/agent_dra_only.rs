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

use agent_support::{AgentProcess, GPUS, Probe, agent_kubeconfig, gpu, scratch, wait_for_condition};
use common::cluster_with;
use gpu_remediation_api::constants::{GPU_COUNT_LABEL, gpu_reasons};
use gpu_sandbox::{ControlPlaneOptions, Dra, Fleet, FleetOptions};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use serde_json::json;

fn with_dra() -> ControlPlaneOptions {
    ControlPlaneOptions {
        dra: Dra::On,
        ..ControlPlaneOptions::default()
    }
}

/// A one-node DRA fleet whose node has no count label, its agent's scratch directory and
/// kubeconfig, and the node's name.
async fn dra_only_node(name: &str) -> (Client, Fleet, std::path::PathBuf, std::path::PathBuf, String) {
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
    (client, fleet, dir, kubeconfig, node)
}

/// The node's GPUs less the last: it came up with one already gone.
fn one_gone(node: &str) -> serde_json::Value {
    json!({"gpus": (0..GPUS - 1).map(|index| gpu(node, index)).collect::<Vec<_>>()})
}

fn start(
    node: &str,
    dir: &std::path::Path,
    kubeconfig: &std::path::Path,
    extra: &[&str],
) -> impl Future<Output = AgentProcess> {
    let probe_file = dir.join(format!("{node}.json"));
    agent_support::write_probe_file(&probe_file, &one_gone(node));
    let (node, kubeconfig, dir) = (node.to_owned(), kubeconfig.to_owned(), dir.to_owned());
    let extra: Vec<String> = extra.iter().map(|e| (*e).to_owned()).collect();
    async move {
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        AgentProcess::start(Probe::File, &node, &kubeconfig, &probe_file, &dir, &extra).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dra_only_node_expects_the_gpus_its_slices_list_and_one_gone_at_start_up_is_missing() {
    let (client, fleet, dir, kubeconfig, node) = dra_only_node("dra-only-missing").await;
    let driver = format!("--dra-driver={}", gpu_sandbox::dra::DRIVER);
    let agent = start(&node, &dir, &kubeconfig, &[&driver]).await;
    let condition = wait_for_condition(
        &client,
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
    fleet.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_reading_the_slices_the_same_node_has_no_expected_count_and_reads_healthy() {
    let (client, fleet, dir, kubeconfig, node) = dra_only_node("dra-only-unread").await;
    let agent = start(&node, &dir, &kubeconfig, &["--dra-driver="]).await;
    let condition = wait_for_condition(
        &client,
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
    fleet.stop().await.unwrap();
}

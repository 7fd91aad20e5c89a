//! The escalation ladder's GPU-scoped drain for device-plugin pods, on the real control plane: on
//! an 8-GPU node running 8 single-GPU pods handed their GPUs by the simulated device plugin, the
//! real agent reads the (simulated) kubelet's pod-resources API over its unix socket and publishes
//! which pod holds which GPU (`gpuremediation.dev/gpu-pods`); a `RESET_GPU`-class XID on GPU 3
//! then evicts only the pod on GPU 3, the reset runs (the repair operator writes the agent's clear
//! annotation, as the reset Job sample does), the agent reports the GPU healthy, the remediation
//! succeeds after the dwell, and the other 7 pods never restart. On a node whose assignment is
//! missing, the whole node is drained and the status says why.

#[macro_use]
mod agent_support;
mod common;
mod scenario;

use std::time::Duration;

use agent_support::{Probe, gpu, pod_resources};
use gpu_remediation_api::{
    Phase,
    constants::GPU_PODS_ANNOTATION,
    ladder::{Rung, StepOutcome},
};
use gpu_sandbox::{
    dra,
    hardware::{SimGpu, set_inventory},
    repair::{self, Behaviour, Heal, Repairer},
    workload::Workload,
};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use scenario::{
    RunningController, Scenario,
    ladder::{setup, step, steps},
};
use serde_json::{Value, json};

/// A `ResetGpu` → `Reboot` ladder whose steps are objects of the stand-in kind
/// (`common::REBOOT_CRD`), carried out by the sandbox's repair operator under `behaviour`.
async fn ladder(s: &Scenario, behaviour: Behaviour) -> Repairer {
    let spec = json!({
        "ladder": [step(s, "ResetGpu", Some("1m")), step(s, "Reboot", Some("1m"))],
        "release": {"healthyFor": "3s"},
    });
    setup(s, spec, behaviour).await
}

/// 8 pods of one GPU each through the device plugin, on `node`, running.
async fn eight_training_pods(s: &Scenario, node: &str) -> Vec<Pod> {
    let app = Workload::new(&s.namespace, "train")
        .replicas(8)
        .on_nodes(&[node])
        .gpus(1);
    s.run_workload(&app, 8, Duration::from_secs(60), "8 pods running on their GPUs")
        .await
}

/// The probe file of `node`'s 8 GPUs (the UUIDs and serials the simulated device plugin hands
/// out), with `xid` on GPU 3 when given.
fn probe_file(node: &str, gpus: &[SimGpu], xid: Option<u64>) -> Value {
    let readings: Vec<Value> = gpus
        .iter()
        .map(|g| {
            let mut reading = gpu(node, g.index);
            reading["uuid"] = json!(g.uuid);
            reading["serial"] = json!(g.serial);
            reading
        })
        .collect();
    let mut file = json!({"gpus": readings});
    if let Some(xid) = xid {
        file["xidEvents"] = json!([{"id": 1, "xid": xid, "gpuUuid": gpus[3].uuid}]);
    }
    file
}

/// Each pod's name and UID.
fn identities(pods: &[Pod]) -> Vec<(String, Option<String>)> {
    pods.iter().map(|p| (p.name_any(), p.uid())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_gpu_xid_on_gpu_3_evicts_only_its_device_plugin_pod_and_the_other_seven_never_restart() {
    let s = Scenario::new(1).await;
    let node = s.nodes()[0].clone();
    let gpus = dra::node_gpus(&node, 8);
    let behaviour = Behaviour {
        heal_by: Heal::ClearAnnotation,
        ..Behaviour::default()
    };
    let repairer = ladder(&s, behaviour).await;
    // The pods first: the agent then reads them well past the clock slack of their creation.
    let before = eight_training_pods(&s, &node).await;
    let agent = pod_resources::start(
        &s.fleet,
        &s.client,
        Probe::File,
        &node,
        &probe_file(&node, &gpus, None),
        &[],
    )
    .await;

    // The agent publishes the kubelet's assignment: 8 pods, one GPU each, as the plugin handed them.
    let held = s.fleet.device_plugin_holders(&node);
    assert_eq!(held.len(), 8, "{held:?}");
    let published = pod_resources::assignment_covering(&s.client, &node, &before).await;
    for entry in &published.pods {
        assert_eq!(
            held.get(&format!("{}/{}", entry.namespace, entry.name)),
            Some(&entry.gpus),
            "the agent publishes what the kubelet handed out"
        );
    }
    let holder = held
        .iter()
        .find(|(_, uuids)| uuids.contains(&gpus[3].uuid))
        .map(|(pod, _)| pod.clone())
        .expect("a pod on GPU 3");
    let others: Vec<(String, Option<String>)> = identities(&before)
        .into_iter()
        .filter(|(name, _)| format!("{}/{name}", s.namespace) != holder)
        .collect();
    assert_eq!(others.len(), 7);
    let controller = RunningController::start(&s.scope).await;

    // XID 95 (uncontained ECC: the catalog recommends RESET_GPU) on GPU 3.
    agent.write(&probe_file(&node, &gpus, Some(95)));
    let done = s
        .wait_phase(&node, Phase::Succeeded, Duration::from_secs(60))
        .await;

    assert_eq!(steps(&done), [(Rung::ResetGpu, Some(StepOutcome::Succeeded))]);
    let status = done.status.as_ref().unwrap();
    let reset = &status.steps[0];
    let scope = status
        .drain
        .as_ref()
        .and_then(|d| d.scope.clone())
        .unwrap_or_default();
    assert_eq!(
        reset.evicted_pods,
        std::slice::from_ref(&holder),
        "only GPU 3's pod was evicted; the drain's scope: {scope}"
    );
    assert_eq!(
        reset.evidence.gpus_answering,
        std::slice::from_ref(&gpus[3].uuid),
        "the same UUID answers"
    );
    assert!(
        scope.starts_with("GPU-scoped drain") && scope.contains(&holder),
        "{scope}"
    );
    scenario::assert_untouched(&s, &others).await;
    let repairs = repairer.repaired();
    assert_eq!(repairs.len(), 1, "{repairs:?}");
    assert_eq!(repairs[0].action, "ResetGpu");
    scenario::reboots::released(&s, &node).await;
    controller.stop().await;
    drop(agent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_an_assignment_is_drained_whole_and_the_status_says_why() {
    let s = Scenario::new(1).await;
    let node = s.nodes()[0].clone();
    // No agent reads this node's kubelet: its inventory is published, its assignment is not.
    let gpus = dra::node_gpus(&node, 8);
    set_inventory(&s.client, &node, &gpus).await.unwrap();
    let _repairer = ladder(&s, Behaviour::default()).await;
    let before = eight_training_pods(&s, &node).await;
    let controller = RunningController::start(&s.scope).await;

    repair::xid(&s.client, &node, &gpus[3], 95, "RESET_GPU")
        .await
        .unwrap();
    let done = s
        .wait_phase(&node, Phase::Succeeded, Duration::from_secs(60))
        .await;

    assert_eq!(steps(&done), [(Rung::ResetGpu, Some(StepOutcome::Succeeded))]);
    let status = done.status.as_ref().unwrap();
    let mut evicted = status.steps[0].evicted_pods.clone();
    evicted.sort();
    let mut all: Vec<String> = before
        .iter()
        .map(|p| format!("{}/{}", s.namespace, p.name_any()))
        .collect();
    all.sort();
    assert_eq!(evicted, all, "the whole node was drained");
    let scope = status
        .drain
        .as_ref()
        .and_then(|d| d.scope.clone())
        .unwrap_or_default();
    assert!(
        scope.starts_with("GPU-to-pod mapping unknown")
            && scope.contains("asks for nvidia.com/gpu through the device plugin")
            && scope.contains(&format!(
                "node {node} carries no {GPU_PODS_ANNOTATION} assignment"
            )),
        "{scope}"
    );
    controller.stop().await;
}

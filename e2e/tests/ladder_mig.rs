//! The escalation ladder's drain scoped to one MIG device, on the real control plane: GPU 2 of an
//! 8-GPU node is partitioned into 7 MIG devices (`nvidia.com/mig-1g.10gb`, GPU instances 1 to 7),
//! each held by one pod through the simulated device plugin. The real agent reads the GPUs (with
//! GPU 2's MIG devices) and the (simulated) kubelet's pod-resources API, and publishes each pod with
//! its MIG device and that device's parent GPU. An XID the driver attributes to GPU instance 4 is
//! that MIG device's fault: the reset's drain evicts only the pod on instance 4, the other six
//! instances' pods keep running (same UIDs, never restarted), and the step's evidence is the MIG
//! device answering again under its UUID.

#[macro_use]
mod agent_support;
mod common;
mod scenario;

use std::{collections::BTreeMap, time::Duration};

use agent_support::{Probe, gpu, kernel_log::mig_xid_record, pod_resources};
use common::eventually;
use gpu_remediation_api::{
    Phase,
    constants::{FAILED_GPUS_ANNOTATION, GPU_RESOURCE},
    ladder::{Rung, StepOutcome},
};
use gpu_sandbox::{
    dra,
    fleet::device_plugin::{SimMig, mig_devices},
    hardware::SimGpu,
    repair::{Behaviour, Heal},
    workload::Workload,
};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
};
use scenario::{
    Scenario,
    ladder::{setup, step, steps},
};
use serde_json::{Value, json};

/// The MIG profile's resource.
const MIG_RESOURCE: &str = "nvidia.com/mig-1g.10gb";

/// How the XID reaches the agent.
#[derive(Clone, Copy, PartialEq, Eq)]
enum XidVia {
    /// The probe's XID events (the file's, or NVML's event API on the stand-in library).
    Event,
    /// Only the kernel log (`--kernel-log`), as the driver writes it.
    KernelLog,
}

/// The probe file of `node`'s 8 GPUs, GPU 2 partitioned into `migs`, with an XID 95 on GPU 2's
/// GPU instance `xid_on` when given, by `via`.
fn probe_file(node: &str, gpus: &[SimGpu], migs: &[SimMig], xid_on: Option<(u32, XidVia)>) -> Value {
    let readings: Vec<Value> = gpus
        .iter()
        .map(|g| {
            let mut reading = gpu(node, g.index);
            reading["uuid"] = json!(g.uuid);
            reading["serial"] = json!(g.serial);
            if g.index == 2 {
                reading["mig"] = migs
                    .iter()
                    .map(|m| {
                        json!({"uuid": m.uuid, "gpuInstance": m.gpu_instance, "computeInstance": 0,
                               "name": "NVIDIA H100 80GB HBM3 MIG 1g.10gb"})
                    })
                    .collect();
            }
            reading
        })
        .collect();
    let mut file = json!({"gpus": readings, "kernelLog": []});
    match xid_on {
        Some((instance, XidVia::Event)) => {
            file["xidEvents"] =
                json!([{"id": 1, "xid": 95, "gpuUuid": gpus[2].uuid, "gpuInstance": instance}]);
        }
        Some((instance, XidVia::KernelLog)) => {
            file["kernelLog"] = json!([mig_xid_record(
                1,
                2,
                Some(instance),
                95,
                "Uncontained: FBHUB. RST: Yes, D-RST: No"
            )]);
        }
        None => {}
    }
    file
}

/// The node advertises 7 whole GPUs and GPU 2's 7 MIG devices, as the device plugin's `mixed`
/// strategy registers them.
async fn advertise_mig(s: &Scenario, node: &str) {
    let patch = json!({"status": {
        "capacity": {GPU_RESOURCE: "7", MIG_RESOURCE: "7"},
        "allocatable": {GPU_RESOURCE: "7", MIG_RESOURCE: "7"},
    }});
    Api::<Node>::all(s.client.clone())
        .patch_status(node, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
}

/// Waits for the agent's assignment covering `pods` and checks each pod is published with its MIG
/// device and that device's parent GPU `parent`; returns what the device plugin handed out.
async fn assignment_with_parents(
    s: &Scenario,
    node: &str,
    pods: &[Pod],
    parent: &SimGpu,
) -> BTreeMap<String, Vec<String>> {
    let published = pod_resources::assignment_covering(&s.client, node, pods).await;
    let held = s.fleet.device_plugin_holders(node);
    for entry in &published.pods {
        let mig = &held[&format!("{}/{}", entry.namespace, entry.name)];
        let mut expected = vec![parent.uuid.clone(), mig[0].clone()];
        expected.sort();
        assert_eq!(entry.gpus, expected, "a MIG device with its parent");
        assert!(entry.unmapped.is_empty(), "{entry:?}");
    }
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_xid_event_on_mig_instance_4_evicts_only_that_instances_pod_under_the_file_probe() {
    only_instance_4s_pod_is_evicted(Probe::File, XidVia::Event).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_nvml_event_on_mig_instance_4_evicts_only_that_instances_pod_under_the_nvml_probe() {
    only_instance_4s_pod_is_evicted(Probe::Nvml, XidVia::Event).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_xid_on_mig_instance_4_only_in_the_kernel_log_evicts_only_that_instances_pod() {
    only_instance_4s_pod_is_evicted(Probe::Nvml, XidVia::KernelLog).await;
}

/// The file's scenario: 7 pods on GPU 2's 7 MIG devices, an XID on GPU instance 4 reaching the agent
/// under `probe` by `via`; only instance 4's pod is evicted, the other six keep running.
async fn only_instance_4s_pod_is_evicted(probe: Probe, via: XidVia) {
    let s = Scenario::new(1).await;
    let node = s.nodes()[0].clone();
    let gpus = dra::node_gpus(&node, 8);
    let migs = mig_devices(&gpus[2], "1g.10gb", 7);
    s.fleet.partition(&node, migs.clone());
    advertise_mig(&s, &node).await;
    let behaviour = Behaviour {
        heal_by: Heal::ClearAnnotation,
        ..Behaviour::default()
    };
    let spec = json!({
        "ladder": [step(&s, "ResetGpu", Some("1m")), step(&s, "Reboot", Some("1m"))],
        "release": {"healthyFor": "3s"},
    });
    let repairer = setup(&s, spec, behaviour).await;
    let app = Workload::new(&s.namespace, "infer")
        .replicas(7)
        .on_nodes(&[&node])
        .devices(MIG_RESOURCE, 1);
    let before = s
        .run_workload(
            &app,
            7,
            Duration::from_secs(60),
            "7 pods running on their MIG devices",
        )
        .await;

    let agent = pod_resources::start(
        &s.fleet,
        &s.client,
        probe,
        &node,
        &probe_file(&node, &gpus, &migs, None),
        &[],
    )
    .await;
    let held = assignment_with_parents(&s, &node, &before, &gpus[2]).await;
    let instance_4 = &migs[3];
    assert_eq!(instance_4.gpu_instance, 4);
    let holder = held
        .iter()
        .find(|(_, uuids)| uuids.contains(&instance_4.uuid))
        .map(|(pod, _)| pod.clone())
        .expect("a pod on instance 4");
    let others: Vec<(String, Option<String>)> = before
        .iter()
        .map(|p| (p.name_any(), p.uid()))
        .filter(|(name, _)| format!("{}/{name}", s.namespace) != holder)
        .collect();
    assert_eq!(others.len(), 6);
    let controller = scenario::RunningController::start(&s.scope).await;

    // XID 95 (the catalog recommends RESET_GPU), attributed by the driver to GPU instance 4.
    agent.write(&probe_file(&node, &gpus, &migs, Some((4, via))));
    let failed = eventually(
        "the fault naming the MIG device",
        Duration::from_secs(30),
        || async {
            let node = s.node(&node).await;
            node.annotations().get(FAILED_GPUS_ANNOTATION).cloned()
        },
    )
    .await;
    let failed: Value = serde_json::from_str(&failed).unwrap();
    assert_eq!(failed[0]["uuid"], json!(instance_4.uuid), "{failed}");
    assert_eq!(failed[0]["parentUuid"], json!(gpus[2].uuid), "{failed}");
    assert_eq!(
        failed[0]["serial"],
        json!(gpus[2].serial),
        "the board is the parent's: {failed}"
    );
    let done = s
        .wait_phase(&node, Phase::Succeeded, Duration::from_secs(60))
        .await;

    assert_eq!(steps(&done), [(Rung::ResetGpu, Some(StepOutcome::Succeeded))]);
    let status = done.status.as_ref().unwrap();
    let scope = status
        .drain
        .as_ref()
        .and_then(|d| d.scope.clone())
        .unwrap_or_default();
    assert_eq!(
        status.steps[0].evicted_pods,
        std::slice::from_ref(&holder),
        "only instance 4's pod was evicted; the drain's scope: {scope}"
    );
    assert!(
        scope.starts_with("GPU-scoped drain") && scope.contains(&holder),
        "{scope}"
    );
    assert_eq!(
        status.steps[0].evidence.gpus_answering,
        std::slice::from_ref(&instance_4.uuid),
        "the MIG device answers again under its UUID"
    );
    scenario::assert_untouched(&s, &others).await;
    assert_eq!(repairer.repaired().len(), 1);
    scenario::reboots::released(&s, &node).await;
    controller.stop().await;
    drop(agent);
}

//! The simulated DRA driver on the real control plane: the real kube-scheduler allocates the
//! fleet's published GPUs to pods claiming them through a `ResourceClaimTemplate`, one distinct
//! device per pod, and `gpu_remediator::dra` maps a failed GPU to exactly the pod holding it.
//! Without `DeviceTaintRule` served (DRA on, its gates off), a quarantine falls back to the node
//! taint and the policy says why.

mod common;
mod scenario;

use std::{collections::BTreeSet, time::Duration};

use common::{cluster_with, eventually, namespace, unique_name};
use gpu_remediator::dra::{
    Holders, pods_holding_on,
    wire::{self, AllocatedDevice, ResourceClaim},
};
use gpu_sandbox::{
    ControlPlaneOptions, Dra, Fleet, FleetOptions, dra,
    workload::{self, Workload},
};
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, ResourceExt, api::ListParams};

/// The devices allocated to the (allocated) claim `claim`.
fn allocated_devices(claim: &ResourceClaim) -> &[AllocatedDevice] {
    &claim
        .status
        .as_ref()
        .unwrap()
        .allocation
        .as_ref()
        .unwrap()
        .devices
        .results
}

fn with_dra() -> ControlPlaneOptions {
    ControlPlaneOptions {
        dra: Dra::On,
        ..ControlPlaneOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_single_gpu_pods_get_eight_distinct_devices_and_gpu_3_maps_to_exactly_one_pod() {
    let client = cluster_with(with_dra).await.client();
    let fleet = Fleet::start(
        client.clone(),
        FleetOptions {
            nodes: 1,
            name_prefix: unique_name("dra"),
            heartbeat_interval: Duration::from_secs(2),
            dra: true,
            ..FleetOptions::default()
        },
    )
    .await
    .expect("a fleet with DRA");
    let node = fleet.node_names()[0].clone();
    let ns = namespace().await;
    dra::create_claim_template(&client, &ns, "one-gpu", 1)
        .await
        .expect("the claim template");
    let app = Workload::new(&ns, "train")
        .replicas(8)
        .on_nodes(&[&node])
        .gpus_claimed_from("one-gpu");
    workload::create(&client, &app.deployment())
        .await
        .expect("the deployment");
    workload::wait_ready_pods(&client, &ns, &app.selector(), 8, Duration::from_secs(90))
        .await
        .expect("8 pods running on their claimed GPUs");

    // Every pod's claim is allocated one device of the node's pool, and no two share one.
    let claims_api = Api::<ResourceClaim>::namespaced_with(client.clone(), &ns, &wire::resource_claims());
    let claims = eventually("8 allocated claims", Duration::from_secs(30), || async {
        let claims = claims_api.list(&ListParams::default()).await.ok()?.items;
        let allocated: Vec<_> = claims
            .into_iter()
            .filter(|c| c.status.as_ref().is_some_and(|s| s.allocation.is_some()))
            .collect();
        (allocated.len() == 8).then_some(allocated)
    })
    .await;
    let devices: BTreeSet<(String, String, String)> = claims
        .iter()
        .flat_map(|c| allocated_devices(c).to_vec())
        .map(|r| (r.driver, r.pool, r.device))
        .collect();
    let expected: BTreeSet<_> = (0..8)
        .map(|i| (dra::DRIVER.to_owned(), dra::pool_name(&node), dra::device_name(i)))
        .collect();
    assert_eq!(
        devices, expected,
        "8 claims, 8 distinct devices: the node's 8 GPUs"
    );

    // GPU 3, by the UUID the node's agent reports, is held by exactly the pod of device gpu-3.
    let gpu3 = dra::node_gpus(&node, 8)[3].uuid.clone();
    let pods = Api::<Pod>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .expect("the node's pods")
        .items;
    let holders = pods_holding_on(
        &gpu_remediator::read::Reader::new(client.clone()),
        &node,
        &[gpu3],
        &pods,
    )
    .await
    .expect("the mapping");
    let Holders::Known(holders) = holders else {
        panic!("the mapping of a DRA-only node is known, got {holders:?}");
    };
    let holding_gpu3: Vec<String> = claims
        .iter()
        .filter(|c| {
            allocated_devices(c)
                .iter()
                .any(|r| r.device == dra::device_name(3))
        })
        .flat_map(|c| {
            c.status
                .as_ref()
                .unwrap()
                .reserved_for
                .iter()
                .map(|r| r.name.clone())
        })
        .collect();
    assert_eq!(holding_gpu3.len(), 1, "one pod is reserved GPU 3's claim");
    assert_eq!(
        holders.iter().map(|p| p.name.clone()).collect::<Vec<_>>(),
        holding_gpu3,
        "the mapping names exactly the pod holding GPU 3"
    );
    assert!(
        pods.iter().any(|p| p.name_any() == holding_gpu3[0]),
        "that pod runs on the node"
    );

    fleet.stop().await.expect("stopping the fleet");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_device_taint_rules_served_a_dra_gpu_fault_quarantines_the_node_and_the_policy_says_why() {
    use gpu_remediation_api::{
        GpuRemediationPolicy,
        constants::{QUARANTINE_TAINT_KEY, QUARANTINED_DEVICES_ANNOTATION, policy_conditions, reasons},
    };

    cluster_with(with_dra).await;
    let s = scenario::Scenario::with_fleet(1, |o| o.dra = true).await;
    let node = s.nodes()[0].clone();
    s.policy(serde_json::json!({
        "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "60s"}],
        "safety": {"maxUnhealthy": "100%"},
    }))
    .await;
    let _controller = scenario::RunningController::start(&s.scope).await;
    let gpu3 = dra::node_gpus(&node, 8)[3].clone();
    gpu_sandbox::hardware::fail_gpu(&s.client, &node, &gpu3, "XID79")
        .await
        .expect("failing GPU 3");
    let tainted = eventually("the node taint", Duration::from_secs(10), || async {
        let n = s.node(&node).await;
        let taints = n.spec.as_ref()?.taints.clone()?;
        taints.iter().any(|t| t.key == QUARANTINE_TAINT_KEY).then_some(n)
    })
    .await;
    assert!(!tainted.annotations().contains_key(QUARANTINED_DEVICES_ANNOTATION));
    let policies = Api::<GpuRemediationPolicy>::all(s.client.clone());
    let condition = eventually(
        "the policy's DeviceQuarantine condition",
        Duration::from_secs(10),
        || async {
            let status = policies.get(&s.scope).await.ok()?.status?;
            status
                .conditions
                .into_iter()
                .find(|c| c.type_ == policy_conditions::DEVICE_QUARANTINE)
        },
    )
    .await;
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        ("False", reasons::DEVICE_TAINT_RULES_NOT_SERVED)
    );
    assert!(condition.message.contains("1.33"), "{}", condition.message);
    let status = policies
        .get(&s.scope)
        .await
        .expect("the policy")
        .status
        .expect("its status");
    assert_eq!(
        status.device_taints.as_deref(),
        Some("None: node taint used"),
        "the status says no DeviceTaintRule version is spoken"
    );
}

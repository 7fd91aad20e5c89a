//! Device-level quarantine on the real control plane with DRA and the `DRADeviceTaints` gates on:
//! a fault naming GPU 3 of an 8-GPU node under `for: 60s` takes only GPU 3 out of allocation with
//! a `DeviceTaintRule` (no node taint, no cordon); the real scheduler keeps placing new DRA pods
//! on the node's 7 healthy GPUs and gives none of them GPU 3; when the signal clears, the rule is
//! deleted after the hysteresis and GPU 3 takes work again. The rules' writes pass the shipped
//! RBAC and the fence policy admits them only under the current leader claim.

mod common;
mod scenario;

use std::{collections::BTreeSet, time::Duration};

use common::{cluster_with, eventually};
use gpu_remediation_api::GpuRemediationPolicy;
use gpu_remediation_api::constants::{
    DEVICE_QUARANTINE_LABEL, QUARANTINE_TAINT_KEY, QUARANTINED_BY_ANNOTATION, QUARANTINED_DEVICES_ANNOTATION,
    policy_conditions,
};
use gpu_remediator::dra::wire::{self, DeviceTaintRule, ResourceClaim};
use gpu_sandbox::{ControlPlaneOptions, Dra, dra, hardware};
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, ResourceExt, api::ListParams};
use scenario::{RunningController, Scenario, is_unschedulable};

/// The `DeviceTaintRule` version this binary's control plane serves.
async fn served_version() -> wire::TaintRuleVersion {
    scenario::device_taint_rule_version(cluster_with(with_device_taints).await.minor())
}

fn with_device_taints() -> ControlPlaneOptions {
    ControlPlaneOptions {
        dra: Dra::DeviceTaints,
        ..ControlPlaneOptions::default()
    }
}

fn has_quarantine_taint(node: &k8s_openapi::api::core::v1::Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == QUARANTINE_TAINT_KEY))
}

/// The devices allocated to the namespace's claims.
async fn allocated(claims: &Api<ResourceClaim>) -> Vec<String> {
    let listed = claims
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    listed
        .iter()
        .filter_map(|c| c.status.as_ref()?.allocation.as_ref())
        .flat_map(|a| a.devices.results.iter().map(|r| r.device.clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_failed_gpu_is_tainted_and_new_pods_keep_landing_on_the_nodes_healthy_gpus() {
    cluster_with(with_device_taints).await;
    let s = Scenario::with_fleet(1, |o| o.dra = true).await;
    let node = s.nodes()[0].clone();
    s.policy(serde_json::json!({
        "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "60s"}],
        "safety": {"maxUnhealthy": "100%"},
        "quarantine": {"hysteresis": "3s"},
    }))
    .await;
    let _controller = RunningController::start(&s.scope).await;

    // GPU 3 fails, as the agent reports it: the failed-GPUs annotation, then GpuHealthy=False.
    let gpu3 = dra::node_gpus(&node, 8)[3].clone();
    let broke_at = std::time::Instant::now();
    hardware::fail_gpu(&s.client, &node, &gpu3, "XID79")
        .await
        .expect("failing GPU 3");
    only_gpu_3_is_taken_out(&s, &node, &gpu3.uuid).await;
    eprintln!("fault to device quarantine: {:?}", broke_at.elapsed());

    let claims =
        Api::<ResourceClaim>::namespaced_with(s.client.clone(), &s.namespace, &wire::resource_claims());
    new_pods_land_on_the_healthy_gpus_only(&s, &node, &claims).await;

    // The signal clears: after the hysteresis the rule goes, the node's record with it, and GPU 3
    // takes the waiting pod.
    s.heal_gpu(&node).await;
    eventually(
        "the rule deleted after the hysteresis",
        Duration::from_secs(20),
        || async { our_rules(&s).await.is_empty().then_some(()) },
    )
    .await;
    let lifted = s.node(&node).await;
    assert!(!lifted.annotations().contains_key(QUARANTINED_DEVICES_ANNOTATION));
    assert!(!lifted.annotations().contains_key(QUARANTINED_BY_ANNOTATION));
    eventually("GPU 3 allocated again", Duration::from_secs(60), || async {
        allocated(&claims)
            .await
            .contains(&dra::device_name(3))
            .then_some(())
    })
    .await;
    assert!(
        s.remediations().await.is_empty(),
        "no remediation: the signal cleared before `for`"
    );
}

/// The controller's rules owned by the scenario's policy.
async fn our_rules(s: &Scenario) -> Vec<DeviceTaintRule> {
    let rules = Api::<DeviceTaintRule>::all_with(
        s.client.clone(),
        &wire::device_taint_rules(served_version().await),
    );
    let ours = ListParams::default().labels(&format!("{DEVICE_QUARANTINE_LABEL}=true"));
    let listed = rules.list(&ours).await.map(|l| l.items).unwrap_or_default();
    listed
        .into_iter()
        .filter(|r| r.annotations().get(QUARANTINED_BY_ANNOTATION) == Some(&s.scope))
        .collect()
}

/// One `DeviceTaintRule`, selecting GPU 3's device; no node taint, no cordon; the node and the
/// policy say the quarantine is device-level.
async fn only_gpu_3_is_taken_out(s: &Scenario, node: &str, uuid: &str) {
    let rule = eventually("a DeviceTaintRule for GPU 3", Duration::from_secs(10), || async {
        let mine = our_rules(s).await;
        (!mine.is_empty()).then_some(mine)
    })
    .await;
    assert_eq!(rule.len(), 1, "one rule, for GPU 3 only: {rule:?}");
    let selector = rule[0].spec.device_selector.clone().expect("a device selector");
    assert_eq!(
        (
            selector.driver.as_deref(),
            selector.pool.as_deref(),
            selector.device.as_deref()
        ),
        (
            Some(dra::DRIVER),
            Some(dra::pool_name(node).as_str()),
            Some(dra::device_name(3).as_str())
        ),
    );
    assert_eq!(rule[0].spec.taint.effect, "NoSchedule");
    let quarantined = s.node(node).await;
    assert!(
        !has_quarantine_taint(&quarantined),
        "no node taint: the node keeps taking work"
    );
    assert!(!is_unschedulable(&quarantined), "no cordon");
    assert!(
        quarantined.annotations()[QUARANTINED_DEVICES_ANNOTATION].contains(uuid),
        "the node records the device quarantine"
    );
    let policy = Api::<GpuRemediationPolicy>::all(s.client.clone());
    eventually(
        "the policy to say quarantines are device-level",
        Duration::from_secs(10),
        || async {
            let status = policy.get(&s.scope).await.ok()?.status?;
            status
                .conditions
                .iter()
                .any(|c| c.type_ == policy_conditions::DEVICE_QUARANTINE && c.status == "True")
                .then_some(())
        },
    )
    .await;
}

/// 8 new DRA pods on the node: 7 run on its 7 healthy GPUs, none gets GPU 3, and the 8th waits
/// (GPU 3 is the only free device and it is tainted).
async fn new_pods_land_on_the_healthy_gpus_only(s: &Scenario, node: &str, claims: &Api<ResourceClaim>) {
    let app = s.eight_pods_claiming_a_gpu_each(node).await;
    s.run_workload(
        &app,
        7,
        Duration::from_secs(30),
        "7 pods placed on the node's healthy GPUs during the quarantine",
    )
    .await;
    // Give the scheduler time to try the 8th pod (it would get GPU 3 without the taint).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let devices = allocated(claims).await;
    let distinct: BTreeSet<&String> = devices.iter().collect();
    assert_eq!(devices.len(), 7, "7 claims allocated: {devices:?}");
    assert_eq!(distinct.len(), 7);
    assert!(
        !distinct.contains(&dra::device_name(3)),
        "no pod got GPU 3: {devices:?}"
    );
    let pods = Api::<Pod>::namespaced(s.client.clone(), &s.namespace)
        .list(&ListParams::default().labels(&app.selector()))
        .await
        .expect("the pods")
        .items;
    let unbound: Vec<String> = pods
        .iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none())
        .map(ResourceExt::name_any)
        .collect();
    assert_eq!(
        unbound.len(),
        1,
        "the 8th pod waits for a healthy GPU: {unbound:?}"
    );
    let still = s.node(node).await;
    assert!(!has_quarantine_taint(&still) && !is_unschedulable(&still));
}

/// The controller's own code, as its service account under the shipped `ClusterRole`
/// (`manifests/controller/rbac.yaml`), with `claim` as its claim on the leader Lease.
fn controller_ops(
    client: &kube::Client,
    claim: (&str, i32),
) -> (gpu_remediator::write::Writer, gpu_remediator::leader::FenceKeeper) {
    let (fence, keeper) = gpu_remediator::leader::Fence::keeper(None);
    keeper.hold_until(tokio::time::Instant::now() + Duration::from_secs(600));
    keeper.claimed_as(claim.0, claim.1);
    let reporter = kube::runtime::events::Reporter {
        controller: "gpu-remediator".into(),
        instance: Some("e2e-device-fence".into()),
    };
    let ops = gpu_remediator::write::Writer::from_clients(client.clone(), client.clone(), fence, reporter);
    (ops, keeper)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_taint_rule_writes_are_fenced_and_allowed_by_the_shipped_rbac() {
    use gpu_remediator::act::quarantine_device::{create_rule, delete_rule};
    use gpu_remediator::quarantine::device::{self, QuarantinedDevice};
    use k8s_openapi::api::{coordination::v1::Lease, core::v1::ServiceAccount};

    let admin = cluster_with(with_device_taints).await.client();
    common::kubectl_apply("manifests/namespace.yaml").await;
    common::kubectl_apply("manifests/controller/rbac.yaml").await;
    let lease: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "gpu-remediator", "namespace": "gpu-remediation"},
        "spec": {"holderIdentity": "replica-b", "leaseTransitions": 4, "leaseDurationSeconds": 15},
    }))
    .unwrap();
    let _ = Api::<Lease>::namespaced(admin.clone(), "gpu-remediation")
        .create(&kube::api::PostParams::default(), &lease)
        .await;
    common::kubectl_apply("manifests/controller/fence-policy.yaml").await;
    let request = serde_json::from_value(serde_json::json!({"spec": {"expirationSeconds": 3600}})).unwrap();
    let token = Api::<ServiceAccount>::namespaced(admin.clone(), "gpu-remediation")
        .create_token_request("gpu-remediator", &kube::api::PostParams::default(), &request)
        .await
        .expect("a token")
        .status
        .expect("a token status")
        .token;
    let controller = common::cluster().await.client_with_token(&token);
    let version = served_version().await;
    let rule = device::rule(
        version,
        "fenced",
        "gpu-fence-0000",
        &QuarantinedDevice {
            uuid: "GPU-fence-3".into(),
            driver: dra::DRIVER.into(),
            pool: "gpu-fence-0000".into(),
            device: dra::device_name(3),
        },
    );

    // A deposed leader's create is refused by the API server (once the policy is loaded).
    let (deposed, _deposed_keeper) = controller_ops(&controller, ("replica-a", 3));
    let refused = eventually("the stale claim refused", Duration::from_secs(30), || async {
        if let Err(error) = create_rule(&deposed, version, &rule).await {
            return Some(format!("{error:?}"));
        }
        // Created before the policy was loaded: take it away and try again.
        let _ = Api::<DeviceTaintRule>::all_with(admin.clone(), &wire::device_taint_rules(version))
            .delete(&rule.name_any(), &kube::api::DeleteParams::default())
            .await;
        None
    })
    .await;
    assert!(
        refused.contains("fenced: this write carries the claim replica-a/3"),
        "{refused}"
    );

    // The current leader creates it (the shipped RBAC allows it), carrying its claim.
    let (current, _current_keeper) = controller_ops(&controller, ("replica-b", 4));
    create_rule(&current, version, &rule)
        .await
        .expect("the current claim creates the rule");
    let rules = Api::<DeviceTaintRule>::all_with(admin.clone(), &wire::device_taint_rules(version));
    let stored = rules.get(&rule.name_any()).await.expect("the rule");
    assert_eq!(
        stored
            .annotations()
            .get("gpuremediation.dev/claim")
            .map(String::as_str),
        Some("replica-b/4")
    );

    // A deposed leader cannot delete it; the current one can.
    let message = format!("{:?}", delete_rule(&deposed, version, &stored).await);
    assert!(
        message.contains("fenced: this write carries the claim replica-a/3"),
        "{message}"
    );
    assert!(
        rules.get_opt(&rule.name_any()).await.unwrap().is_some(),
        "still there"
    );
    delete_rule(&current, version, &stored)
        .await
        .expect("the current claim deletes the rule");
    assert!(rules.get_opt(&rule.name_any()).await.unwrap().is_none(), "gone");
}

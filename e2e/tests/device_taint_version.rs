//! The `DeviceTaintRule` version is discovered, not assumed. Each supported minor, with what it needs
//! for device taints (`Dra::DeviceTaints`), serves one version: `resource.k8s.io/v1alpha3` on 1.35
//! (behind the gates), `v1beta2` on 1.36 (a beta API turned on), `v1` on 1.37 (GA, nothing turned
//! on). The controller finds it by discovery and speaks it: a fault naming GPU 3 takes only GPU 3's
//! device out of allocation with a rule of that version, and the policy's `status.deviceTaints`
//! names it. `make test` runs this on 1.35 and, in its compatibility runs, on 1.36 and 1.37. (With
//! the gates off the node taint is used and the status says so: `dra.rs`, whose control plane has
//! DRA without device taints.)

mod common;
mod scenario;

use std::time::Duration;

use common::{cluster_with, eventually};
use gpu_remediation_api::GpuRemediationPolicy;
use gpu_remediation_api::constants::{
    DEVICE_QUARANTINE_LABEL, QUARANTINE_TAINT_KEY, QUARANTINED_BY_ANNOTATION, policy_conditions,
};
use gpu_remediator::dra::wire::{self, DeviceTaintRule, TaintRuleVersion};
use gpu_sandbox::{ControlPlaneOptions, Dra, dra, hardware};
use kube::{Api, ResourceExt, api::ListParams};
use scenario::{RunningController, Scenario, is_unschedulable};

fn with_device_taints() -> ControlPlaneOptions {
    ControlPlaneOptions {
        dra: Dra::DeviceTaints,
        ..ControlPlaneOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_version_the_minor_serves_is_discovered_spoken_and_named_in_the_policy_status() {
    let minor = cluster_with(with_device_taints).await.minor();
    let s = Scenario::with_fleet(1, |o| o.dra = true).await;
    let expected = scenario::device_taint_rule_version(minor);

    // What the server serves: one of the three.
    let discovery = s.client.clone();
    let mut served = Vec::new();
    for version in TaintRuleVersion::PREFERRED {
        let rules = discovery
            .list_api_group_resources(&version.group_version())
            .await
            .is_ok_and(|l| l.resources.iter().any(|r| r.name == wire::TAINT_RULES));
        if rules {
            served.push(version);
        }
    }
    assert_eq!(served, [expected], "Kubernetes 1.{minor} serves {expected} only");

    let node = s.nodes()[0].clone();
    s.policy(serde_json::json!({
        "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "60s"}],
        "safety": {"maxUnhealthy": "100%"},
    }))
    .await;
    let _controller = RunningController::start(&s.scope).await;
    let gpu3 = dra::node_gpus(&node, 8)[3].clone();
    hardware::fail_gpu(&s.client, &node, &gpu3, "XID79")
        .await
        .expect("failing GPU 3");

    let rules = Api::<DeviceTaintRule>::all_with(s.client.clone(), &wire::device_taint_rules(expected));
    let ours = ListParams::default().labels(&format!("{DEVICE_QUARANTINE_LABEL}=true"));
    let mine = eventually(
        "a DeviceTaintRule of the served version for GPU 3",
        Duration::from_secs(15),
        || async {
            let listed = rules.list(&ours).await.ok()?.items;
            let mine: Vec<DeviceTaintRule> = listed
                .into_iter()
                .filter(|r| r.annotations().get(QUARANTINED_BY_ANNOTATION) == Some(&s.scope))
                .collect();
            (!mine.is_empty()).then_some(mine)
        },
    )
    .await;
    assert_eq!(mine.len(), 1, "one rule, GPU 3's: {mine:?}");
    let selector = mine[0].spec.device_selector.clone().expect("a selector");
    assert_eq!(selector.device.as_deref(), Some(dra::device_name(3).as_str()));
    assert_eq!(selector.pool.as_deref(), Some(dra::pool_name(&node).as_str()));
    let quarantined = s.node(&node).await;
    let node_tainted = quarantined
        .spec
        .as_ref()
        .and_then(|spec| spec.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == QUARANTINE_TAINT_KEY));
    assert!(
        !node_tainted && !is_unschedulable(&quarantined),
        "only the GPU, not the node"
    );

    let policies = Api::<GpuRemediationPolicy>::all(s.client.clone());
    let status = eventually(
        "the policy naming the version spoken",
        Duration::from_secs(15),
        || async {
            let status = policies.get(&s.scope).await.ok()?.status?;
            (status.device_taints == Some(expected.group_version())).then_some(status)
        },
    )
    .await;
    let condition = status
        .conditions
        .iter()
        .find(|c| c.type_ == policy_conditions::DEVICE_QUARANTINE)
        .expect("the DeviceQuarantine condition");
    assert_eq!(condition.status, "True");
    assert!(
        condition.message.contains(&expected.group_version()),
        "{}",
        condition.message
    );
}

//! `DeleteNodeClaim` against Karpenter itself: upstream Karpenter with its KWOK cloud provider
//! (built from the pinned module in `tools/karpenter-kwok`), not the sandbox's fake provider. The
//! nodes are Karpenter's: it launches them for pending GPU pods and the fleet adopts them. The
//! controller (in-process, scoped to this test's policy) drains a broken Karpenter node and deletes
//! its `NodeClaim`; Karpenter's own termination (finalizer, taint, drain through the Eviction API)
//! removes the node, and Karpenter's provisioner launches one replacement for the evicted pod.
//! Karpenter's disruption is on (empty-node consolidation after 5s, and the `NodeRepair` gate), so
//! the test also shows the two controllers do not fight: one new `NodeClaim`, not two.
//!
//! Ignored by plain `cargo test` (it needs the Karpenter binary); `make e2e-real` builds it and runs
//! this with `--ignored`.

mod common;
mod scenario;

use std::{collections::BTreeSet, time::Duration};

use gpu_remediation_api::Phase;
use gpu_sandbox::karpenter::{Disruption, Karpenter, KarpenterOptions, node_claim_resource};
use k8s_openapi::jiff::Timestamp;
use kube::{
    Api, Client, ResourceExt as _,
    api::{DynamicObject, ListParams},
};
use scenario::{BudgetWatch, RunningController, Scenario};

/// The pool's `NodeClaims`: name to (created, node name, being deleted).
async fn claims(client: &Client, pool: &str) -> Vec<(String, Timestamp, Option<String>, bool)> {
    let listed = Api::<DynamicObject>::all_with(client.clone(), &node_claim_resource())
        .list(&ListParams::default().labels(&format!("karpenter.sh/nodepool={pool}")))
        .await
        .expect("listing NodeClaims");
    listed
        .items
        .into_iter()
        .map(|claim| {
            (
                claim.name_any(),
                claim
                    .metadata
                    .creation_timestamp
                    .clone()
                    .expect("a creation time")
                    .0,
                claim
                    .data
                    .pointer("/status/nodeName")
                    .and_then(serde_json::Value::as_str)
                    .map(str::to_owned),
                claim.metadata.deletion_timestamp.is_some(),
            )
        })
        .collect()
}

#[tokio::test]
#[ignore = "needs the Karpenter binary: make e2e-real"]
async fn delete_node_claim_recycles_a_karpenter_node_through_karpenters_own_termination() {
    let cluster = common::cluster().await;
    // No nodes of its own: every node of this fleet is one Karpenter launched.
    let s = Scenario::new(0).await;
    s.fleet.adopt_joining_nodes();
    let options = KarpenterOptions {
        node_repair: true,
        disruption: Disruption::default(),
        kubeconfig: None,
    };
    let karpenter = Karpenter::start(cluster, &s.fleet, &options)
        .await
        .unwrap_or_else(|e| panic!("starting Karpenter: {e}"));
    let pool = karpenter.pool().to_owned();

    // Karpenter launches one 8-GPU node for each pod.
    let app = s
        .two_training_pods(Duration::from_secs(120), || karpenter.log_tail(40), |app| app)
        .await;
    // Karpenter writes a claim's status.nodeName when it registers the node, which may trail the
    // pods starting there.
    let before = common::eventually(
        "two NodeClaims naming their nodes",
        Duration::from_secs(30),
        || async {
            let seen = claims(&s.client, &pool).await;
            seen.iter().all(|(_, _, node, _)| node.is_some()).then_some(seen)
        },
    )
    .await;
    assert_eq!(before.len(), 2, "one NodeClaim per 8-GPU pod: {before:?}");
    let running = s.pods_of(&app).await;
    let broken = running[0]
        .spec
        .as_ref()
        .and_then(|spec| spec.node_name.clone())
        .expect("a scheduled pod");
    let (broken_claim, ..) = before
        .iter()
        .find(|(_, _, node, _)| node.as_deref() == Some(broken.as_str()))
        .cloned()
        .expect("the broken node's NodeClaim");

    let budget = BudgetWatch::start(&s.client, &s.namespace, &app.selector());
    s.policy(serde_json::json!({
        "action": "Replace",
        "replacement": {"strategy": "DeleteNodeClaim", "timeout": "3m"},
    }))
    .await;
    let controller = RunningController::start(&s.scope).await;
    let fault_at = Timestamp::now();
    s.break_gpu(&broken).await;

    let done = s
        .wait_phase(&broken, Phase::Succeeded, Duration::from_secs(180))
        .await;
    common::assert_replaced_through(&done, "NodeClaim", &broken_claim);
    assert!(
        s.node_is_gone(&broken).await,
        "Karpenter's termination deleted the broken node"
    );

    // The evicted pod runs again, on the node Karpenter launched for it.
    s.wait_ready_pods_showing(&app, Duration::from_secs(90), || karpenter.log_tail(40))
        .await;
    // Longer than a provisioning batch and the pool's consolidateAfter: a second replacement or a
    // consolidation would show by now.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let after = claims(&s.client, &pool).await;
    let new: Vec<_> = after
        .iter()
        .filter(|(_, created, ..)| *created >= fault_at)
        .collect();
    assert_eq!(
        new.len(),
        1,
        "one replacement NodeClaim, not two: before {before:?}, after {after:?}"
    );
    let survivors: BTreeSet<&str> = after.iter().map(|(name, ..)| name.as_str()).collect();
    assert!(!survivors.contains(broken_claim.as_str()), "{after:?}");
    assert_eq!(after.len(), 2, "the healthy node and the replacement: {after:?}");
    let new_node = new[0]
        .2
        .clone()
        .expect("the replacement NodeClaim names its node");
    s.assert_the_evicted_pod_runs_on(&app, &new_node).await;

    budget.assert_kept_across_both_drains();
    print_karpenter_log(&karpenter, &broken, &new_node);
    controller.stop().await;
    karpenter.stop().await;
}

/// What Karpenter logged about the broken node and the replacement (for `--nocapture`).
fn print_karpenter_log(karpenter: &Karpenter, broken: &str, new_node: &str) {
    let log = std::fs::read_to_string(karpenter.log_path()).expect("Karpenter's log");
    eprintln!("Karpenter's log about {broken} and the replacement:");
    for line in log
        .lines()
        .filter(|l| l.contains(broken) || l.contains(new_node) || l.contains("launched"))
    {
        eprintln!("  {line}");
    }
}

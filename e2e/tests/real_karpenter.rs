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
use gpu_sandbox::{
    karpenter::{Disruption, Karpenter, KarpenterOptions, node_claim_resource},
    workload,
};
use k8s_openapi::{api::core::v1::Pod, jiff::Timestamp};
use kube::{
    Api, Client, ResourceExt as _,
    api::{DynamicObject, ListParams},
};
use scenario::{BudgetWatch, RunningController, Scenario, is_ready};

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

async fn pods(client: &Client, namespace: &str, selector: &str) -> Vec<Pod> {
    Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(selector))
        .await
        .expect("listing pods")
        .items
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
        .two_training_pods(Duration::from_secs(120), || karpenter.log_tail(40))
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
    let running = pods(&s.client, &s.namespace, &app.selector()).await;
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
    workload::wait_pdb_allows(&s.client, &s.namespace, &app.name, 1, Duration::from_secs(30))
        .await
        .expect("the PDB allows one disruption");

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
    let replacement = done
        .status
        .expect("status")
        .replacement
        .expect("the NodeClaim is recorded");
    assert_eq!(
        (replacement.kind.as_str(), replacement.name.as_str()),
        ("NodeClaim", broken_claim.as_str())
    );
    assert!(
        Api::<k8s_openapi::api::core::v1::Node>::all(s.client.clone())
            .get_opt(&broken)
            .await
            .expect("reading the broken node")
            .is_none(),
        "Karpenter's termination deleted the broken node"
    );

    // The evicted pod runs again, on the node Karpenter launched for it.
    workload::wait_ready_pods(
        &s.client,
        &s.namespace,
        &app.selector(),
        2,
        Duration::from_secs(90),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}; Karpenter's log ends:\n{}", karpenter.log_tail(40)));
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
    let node = Api::<k8s_openapi::api::core::v1::Node>::all(s.client.clone())
        .get(&new_node)
        .await
        .expect("the replacement node");
    assert!(
        gpu_remediator::replace::verify::node_is_ready(&node),
        "{new_node} is Ready"
    );
    let on_new = pods(&s.client, &s.namespace, &app.selector())
        .await
        .into_iter()
        .filter(|pod| pod.spec.as_ref().and_then(|spec| spec.node_name.as_deref()) == Some(new_node.as_str()))
        .filter(is_ready)
        .count();
    assert_eq!(
        on_new, 1,
        "the evicted pod runs on the replacement node {new_node}"
    );

    assert_budget_kept(&budget);
    print_karpenter_log(&karpenter, &broken, &new_node);
    controller.stop().await;
    karpenter.stop().await;
}

/// No PDB broken across both drains (ours, then Karpenter's), and every pod that left was evicted.
fn assert_budget_kept(budget: &BudgetWatch) {
    assert!(
        budget.fewest_healthy() >= 1,
        "fewest healthy: {}",
        budget.fewest_healthy()
    );
    let left = budget.left();
    assert!(!left.is_empty(), "the broken node's pod left");
    assert!(
        left.values().all(|evicted| *evicted),
        "every pod left through the Eviction API: {left:?}"
    );
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

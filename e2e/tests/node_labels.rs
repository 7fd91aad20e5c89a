//! The node cache keeps only the labels policies read (`observe::labels`), against the real control
//! plane: a policy changed to read a label the cache did not keep makes the controller list every
//! node afresh, says so in an Event (and in a gauge while it lists), and then governs by that
//! label: a `DoesNotExist` selector over a pruned label would otherwise take every node.

mod common;
mod scenario;

use std::time::Duration;

use common::eventually;
use gpu_remediation_api::{GpuRemediationPolicy, Phase, constants::reasons};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use scenario::{RunningController, Scenario};

/// A label no policy reads when the controller starts.
const POOL: &str = "e2e.gpuremediation.dev/pool";

#[tokio::test]
async fn a_policy_changed_to_read_a_label_the_cache_did_not_keep_governs_by_it_after_a_relist() {
    let s = Scenario::new(4).await;
    let nodes = s.nodes();
    let (pooled, others) = nodes.split_at(2);
    for node in pooled {
        let patch = serde_json::json!({"metadata": {"labels": {POOL: "training"}}});
        Api::<Node>::all(s.client.clone())
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }
    s.policy(serde_json::json!({"safety": {"maxConcurrent": 4, "maxUnhealthy": "100%"}}))
        .await;
    let metrics = gpu_remediator::telemetry::Metrics::new();
    let controller = RunningController::start_reporting(&s.scope, metrics.clone()).await;
    let policies = Api::<GpuRemediationPolicy>::all(s.client.clone());
    let selected = |count: u32| {
        let policies = policies.clone();
        let scope = s.scope.clone();
        move || {
            let policies = policies.clone();
            let scope = scope.clone();
            async move {
                let status = policies.get(&scope).await.ok()?.status?;
                (status.selected_nodes == count).then_some(())
            }
        }
    };
    eventually(
        "the policy to select its four nodes",
        Duration::from_secs(30),
        selected(4),
    )
    .await;

    // The policy now leaves the pool's nodes alone: it reads `POOL`, which the cache dropped.
    policies
        .patch(
            &s.scope,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"nodeSelector": {
                "matchExpressions": [{"key": POOL, "operator": "DoesNotExist"}],
            }}})),
        )
        .await
        .unwrap();
    let said = eventually("the relist announced", Duration::from_secs(30), || async {
        let listed = scenario::event_notes(&s.client, &s.scope, reasons::NODE_LABELS_LISTING).await;
        (!listed.is_empty()).then_some(listed)
    })
    .await;
    assert!(said[0].contains(POOL), "{said:?}");
    eventually(
        "the policy to select the two nodes outside the pool",
        Duration::from_secs(30),
        selected(2),
    )
    .await;

    // A fault on a pool node is not the policy's; one outside the pool is.
    s.break_gpu(&pooled[0]).await;
    s.break_gpu(&others[0]).await;
    s.wait_phase(&others[0], Phase::Verifying, Duration::from_secs(30))
        .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        s.remediation_of(&pooled[0]).await.is_none(),
        "the pool's node was taken"
    );
    let events = scenario::events_about(&s.client, &s.scope).await;
    assert_eq!(
        events.get(reasons::NODE_LABELS_LISTING),
        Some(&1),
        "one relist, said once: {events:?}"
    );
    let listing = metrics
        .encode()
        .lines()
        .find(|line| line.starts_with("gpu_remediator_node_labels_listing "))
        .map(str::to_owned);
    assert_eq!(
        listing.as_deref(),
        Some("gpu_remediator_node_labels_listing 0"),
        "passes no longer wait once the list is done"
    );
    controller.stop().await;
}

//! People and the controller against the real control plane: a person's cordon is never lifted
//! (also one laid again over ours while no controller looked), a person's uncordon cancels, a
//! deleted record is a person's cancel, and a vanished node ends its remediation.

mod common;
mod scenario;

use std::time::Duration;

use common::eventually;
use gpu_remediation_api::{GpuRemediation, Phase, constants::CORDONED_BY_ANNOTATION};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
};
use scenario::{has_our_taint, is_unschedulable};

#[tokio::test]
async fn a_node_a_person_cordoned_stays_cordoned_after_its_remediation_is_cancelled() {
    // A budget that allows nothing keeps the remediation in flight until the node recovers.
    let (s, broken, _) = scenario::pinned::pinned_behind_a_closed_budget().await;
    s.set_unschedulable(&broken, true).await;
    let (controller, draining) = s.replace_held_in_draining(&broken).await;
    let node = s.node(&broken).await;
    assert!(has_our_taint(&node));
    assert_eq!(
        node.annotations().get(CORDONED_BY_ANNOTATION),
        None,
        "the cordon is not recorded as ours"
    );
    s.heal_gpu(&broken).await;
    let cancelled = s
        .wait_phase(&broken, Phase::Cancelled, Duration::from_secs(30))
        .await;
    assert_eq!(cancelled.name_any(), draining.name_any());
    let node = s.node(&broken).await;
    assert!(is_unschedulable(&node), "the person's cordon stays");
    assert!(!has_our_taint(&node), "our taint is gone");
    controller.stop().await;
}

#[tokio::test]
async fn a_person_uncordoning_the_node_cancels_and_the_controller_does_not_fight_back() {
    let (s, broken, _) = scenario::pinned::pinned_behind_a_closed_budget().await;
    let (controller, _) = s.replace_held_in_draining(&broken).await;
    s.set_unschedulable(&broken, false).await;
    s.wait_phase(&broken, Phase::Cancelled, Duration::from_secs(30))
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let node = s.node(&broken).await;
    assert!(!is_unschedulable(&node) && !has_our_taint(&node));
    assert_eq!(node.annotations().get(CORDONED_BY_ANNOTATION), None);
    assert_eq!(
        s.remediations().await.len(),
        1,
        "no second remediation for the same episode"
    );
    controller.stop().await;
}

/// A person's cancel: the node opted out (or the controller would rightly start over on a
/// still-broken node), then `record` deleted; returns once our finalizer has let it go.
async fn opt_out_and_delete(s: &scenario::Scenario, broken: &str, record: &GpuRemediation) {
    let patch =
        serde_json::json!({"metadata": {"labels": {gpu_remediation_api::constants::OPT_OUT_LABEL: "true"}}});
    Api::<Node>::all(s.client.clone())
        .patch(broken, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let remediations = Api::<GpuRemediation>::all(s.client.clone());
    remediations
        .delete(&record.name_any(), &kube::api::DeleteParams::default())
        .await
        .unwrap();
    eventually("the record to be gone", Duration::from_secs(30), || async {
        remediations
            .get_opt(&record.name_any())
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn deleting_a_remediation_before_the_replacement_releases_the_cordon() {
    let (s, broken, _) = scenario::pinned::pinned_behind_a_closed_budget().await;
    let (controller, draining) = s.replace_held_in_draining(&broken).await;
    assert!(is_unschedulable(&s.node(&broken).await));
    opt_out_and_delete(&s, &broken, &draining).await;
    let node = s.node(&broken).await;
    assert!(
        !is_unschedulable(&node) && !has_our_taint(&node),
        "our cordon was released"
    );
    assert_eq!(node.annotations().get(CORDONED_BY_ANNOTATION), None);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        s.remediations().await.is_empty(),
        "an opted-out node gets no new remediation"
    );
    controller.stop().await;
}

/// Our note alone cannot tell our cordon from one a person laid again over it while no controller
/// looked: the server's record of the field's manager (`kubectl-cordon` here) can, on the release's
/// fresh read.
#[tokio::test]
async fn a_cordon_a_person_laid_again_over_ours_unseen_stays_theirs_when_the_record_goes() {
    let (s, broken, _) = scenario::pinned::pinned_behind_a_closed_budget().await;
    let (controller, draining) = s.replace_held_in_draining(&broken).await;
    assert_eq!(
        s.node(&broken).await.annotations().get(CORDONED_BY_ANNOTATION),
        Some(&draining.name_any()),
        "the cordon is ours"
    );
    controller.stop().await;
    s.set_unschedulable(&broken, false).await;
    s.set_unschedulable(&broken, true).await;
    let controller = scenario::RunningController::start(&s.scope).await;
    opt_out_and_delete(&s, &broken, &draining).await;
    let node = s.node(&broken).await;
    assert!(is_unschedulable(&node), "the person's cordon stays");
    assert!(!has_our_taint(&node), "our taint is gone");
    assert_eq!(
        node.annotations().get(CORDONED_BY_ANNOTATION),
        None,
        "our note is gone"
    );
    let kept = scenario::event_notes(
        &s.client,
        &draining.name_any(),
        gpu_remediation_api::constants::reasons::CORDON_KEPT,
    )
    .await;
    assert!(
        kept.iter().any(|note| note.contains("kubectl-cordon")),
        "the release says whose cordon stays: {kept:?}"
    );
    controller.stop().await;
}

#[tokio::test]
async fn a_node_that_vanishes_mid_drain_cancels_its_remediation() {
    let (s, broken, _) = scenario::pinned::pinned_behind_a_closed_budget().await;
    let (controller, _) = s.replace_held_in_draining(&broken).await;
    Api::<Node>::all(s.client.clone())
        .delete(&broken, &kube::api::DeleteParams::default())
        .await
        .unwrap();
    let cancelled = s
        .wait_phase(&broken, Phase::Cancelled, Duration::from_secs(30))
        .await;
    assert!(
        cancelled
            .status
            .unwrap()
            .message
            .unwrap()
            .contains("no longer exists")
    );
    controller.stop().await;
}

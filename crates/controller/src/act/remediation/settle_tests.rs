//! Settling a remediation against a recording writer: a record deleted while its node is cordoned
//! releases the node (ours only) and drops our finalizer, each through the writer; a record whose
//! status another hand wrote is held, its node untouched.

use std::sync::Arc;

use gpu_remediation_api::{GpuRemediationStatus, Phase};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::write::recording::{Recording, context, node_path, remediation_path};

/// The record, deleted while draining, as the lifecycle writes it: the cordon in the history and
/// the conditions.
fn deleted_mid_drain(since: Timestamp) -> gpu_remediation_api::GpuRemediation {
    let mut record = super::super::tests::record(since);
    record.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
    let mut status = GpuRemediationStatus::default();
    for phase in [Phase::Pending, Phase::Cordoned, Phase::Draining] {
        crate::lifecycle::status::enter(&mut status, phase, "on the way", since);
    }
    crate::lifecycle::status::set_condition(
        &mut status,
        gpu_remediation_api::constants::remediation_conditions::CORDONED,
        true,
        "Cordoned",
        "ours",
        since,
    );
    record.status = Some(status);
    record
}

/// Settles the record [`deleted_mid_drain`] over its node, cordoned by it (and, when `laid_again_by`
/// names a manager, its cordon since lifted and laid again by that one); what was written.
async fn settle_deleted_mid_drain(laid_again_by: Option<&str>) -> (crate::context::Context, Recording) {
    let since = Timestamp::now() - SignedDuration::from_secs(60);
    let mut node = super::super::tests::broken_node(since);
    assert!(
        crate::cordon::cordon(&mut node, "gpu-1-abcde"),
        "cordoned by the record"
    );
    if let Some(manager) = laid_again_by {
        node.metadata.managed_fields = Some(vec![crate::cordon::managing_the_cordon(manager)]);
    }
    let record = deleted_mid_drain(since);
    let (ctx, recording) = context(
        vec![super::super::tests::policy()],
        vec![record.clone()],
        vec![node],
    );
    super::super::advance(&ctx, Arc::new(record))
        .await
        .expect("the remediation settles");
    (ctx, recording)
}

#[tokio::test]
async fn a_record_deleted_mid_drain_releases_our_cordon_and_drops_its_finalizer() {
    let (ctx, recording) = Box::pin(settle_deleted_mid_drain(None)).await;
    let writes = recording.writes();
    let path = remediation_path("gpu-1-abcde");
    // A release that lifts our cordon replaces a fresh read (which names the cordon's manager).
    assert_eq!(
        writes.first(),
        Some(&format!("PUT {}", node_path("gpu-1"))),
        "{writes:#?}"
    );
    assert_eq!(
        writes.last(),
        Some(&format!("PATCH {path}")),
        "the finalizer last: {writes:#?}"
    );
    let released = recording.object(&node_path("gpu-1")).expect("the node");
    assert!(
        released["spec"]["unschedulable"].is_null() || released["spec"]["unschedulable"] == false,
        "uncordoned: {released}"
    );
    let stored = recording.object(&path).expect("the record");
    assert_eq!(stored["metadata"]["finalizers"], serde_json::json!([]));
    assert!(
        !ctx.writer
            .overlays()
            .remediations
            .names()
            .contains(&"gpu-1-abcde".to_owned()),
        "a record whose last finalizer went is not laid over the cache"
    );
}

#[tokio::test]
async fn a_cordon_a_person_laid_again_over_ours_stays_when_the_record_goes_and_is_announced() {
    // Our cordon lifted and laid again by a person before a pass dropped our note.
    let (_ctx, recording) = Box::pin(settle_deleted_mid_drain(Some("kubectl-cordon"))).await;
    let released = recording.object(&node_path("gpu-1")).expect("the node");
    assert_eq!(
        released["spec"]["unschedulable"], true,
        "the person's cordon stays: {released}"
    );
    let annotations = released["metadata"]["annotations"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    assert!(
        !annotations.contains_key(gpu_remediation_api::constants::CORDONED_BY_ANNOTATION),
        "our note goes: {released}"
    );
    let reasons = recording.event_reasons();
    assert!(
        reasons
            .iter()
            .any(|r| r == gpu_remediation_api::constants::reasons::CORDON_KEPT),
        "{reasons:?}"
    );
}

#[tokio::test]
async fn a_record_moved_to_replacing_by_someone_else_is_held_and_its_node_left_alone() {
    let since = Timestamp::now() - SignedDuration::from_secs(60);
    let mut record = super::super::tests::record(since);
    record.spec.mode = gpu_remediation_api::policy::Mode::Manual;
    record.spec.action = gpu_remediation_api::policy::Action::Replace;
    // Awaiting approval as the lifecycle wrote it, then `status.phase: Replacing` by another hand.
    let mut status = GpuRemediationStatus::default();
    for phase in [Phase::Pending, Phase::AwaitingApproval] {
        crate::lifecycle::status::enter(&mut status, phase, "on the way", since);
    }
    status.phase = Phase::Replacing;
    record.status = Some(status);
    let (ctx, recording) = context(
        vec![super::super::tests::policy()],
        vec![record.clone()],
        vec![super::super::tests::broken_node(since)],
    );

    let next = super::super::advance(&ctx, Arc::new(record))
        .await
        .expect("the record is held");

    assert_eq!(next, super::super::Next::Idle);
    let path = remediation_path("gpu-1-abcde");
    assert_eq!(
        recording.writes(),
        [format!("PATCH {path}/status")],
        "the hold's status, and nothing on the node"
    );
    assert_eq!(recording.event_reasons(), ["StatusTampered"]);
    let stored = recording.object(&path).expect("the record");
    assert_eq!(stored["status"]["phase"], "Replacing", "left as found");
    let tampered = stored["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Tampered"))
        .expect("the Tampered condition");
    assert!(
        tampered["message"]
            .as_str()
            .is_some_and(|m| m.contains("Replacing without an approval")),
        "{tampered}"
    );
    assert!(
        ctx.metrics
            .encode()
            .contains("gpu_remediator_records_held_total{policy=\"p\"} 1"),
        "counted once"
    );
}

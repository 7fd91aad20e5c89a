//! Settling a remediation against a recording writer: a record deleted while its node is cordoned
//! releases the node (ours only) and drops our finalizer, each through the writer.

use std::sync::Arc;

use gpu_remediation_api::{GpuRemediationStatus, Phase};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::write::recording::{context, node_path, remediation_path};

#[tokio::test]
async fn a_record_deleted_mid_drain_releases_our_cordon_and_drops_its_finalizer() {
    let since = Timestamp::now() - SignedDuration::from_secs(60);
    let mut node = super::super::tests::broken_node(since);
    assert!(
        crate::cordon::cordon(&mut node, "gpu-1-abcde"),
        "cordoned by the record"
    );
    let mut record = super::super::tests::record(since);
    record.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
    record.status = Some(GpuRemediationStatus {
        phase: Phase::Draining,
        ..GpuRemediationStatus::default()
    });
    let (ctx, recording) = context(
        vec![super::super::tests::policy()],
        vec![record.clone()],
        vec![node],
    );

    super::super::advance(&ctx, Arc::new(record))
        .await
        .expect("the remediation settles");

    let writes = recording.writes();
    let path = remediation_path("gpu-1-abcde");
    assert_eq!(
        writes.first(),
        Some(&format!("PATCH {}", node_path("gpu-1"))),
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

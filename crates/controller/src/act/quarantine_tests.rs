//! The quarantine's acting half against a recording writer: which writes a plan turns into.

use std::sync::Arc;

use gpu_remediation_api::{
    GpuRemediationPolicy,
    constants::{QUARANTINE_TAINT_KEY, QUARANTINED_BY_ANNOTATION, reasons},
};
use jiff::{SignedDuration, Timestamp};

use crate::{
    fleet,
    write::recording::{context, node_path},
};

fn policy() -> GpuRemediationPolicy {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "gpuremediation.dev/v1alpha1", "kind": "GpuRemediationPolicy",
        "metadata": {"name": "p", "uid": "uid-p", "generation": 1},
        "spec": {
            "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "10m"}],
            "action": "None",
            "safety": {"maxUnhealthy": "100%"},
            "quarantine": {"enabled": true},
        },
    }))
    .expect("a valid policy")
}

use crate::test_fixtures::node;

#[tokio::test]
async fn a_fresh_signal_is_one_taint_patch_on_its_node_and_one_event_and_a_healthy_node_is_left_alone() {
    let now = Timestamp::now();
    let broken = node("gpu-1", Some(now - SignedDuration::from_secs(5)));
    let healthy = node("gpu-2", None);
    let (ctx, recording) = context(vec![policy()], Vec::new(), vec![broken.clone(), healthy.clone()]);
    let mut plan = fleet::plan(
        &[Arc::new(policy())],
        &[Arc::new(broken), Arc::new(healthy)],
        &[],
        now,
    );
    let mut policy_plan = plan.policies.remove(0);
    super::apply(&ctx, &mut policy_plan, &["gpu-1".to_owned(), "gpu-2".to_owned()])
        .await
        .expect("the quarantine is written");

    assert_eq!(recording.writes(), [format!("PATCH {}", node_path("gpu-1"))]);
    let written = recording.object(&node_path("gpu-1")).expect("the node");
    assert_eq!(written["spec"]["taints"][0]["key"], QUARANTINE_TAINT_KEY);
    assert_eq!(written["spec"]["taints"][0]["effect"], "NoSchedule");
    assert_eq!(written["metadata"]["annotations"][QUARANTINED_BY_ANNOTATION], "p");
    let patch = recording.first_patch().expect("the patch");
    assert_eq!(
        patch.body["metadata"]["resourceVersion"], "1",
        "preconditioned on the version it was decided from"
    );
    assert!(
        patch.query.contains("fieldManager=gpu-remediator"),
        "{}",
        patch.query
    );
    assert_eq!(recording.events_sent(1).await, [reasons::QUARANTINED]);
    // The next pass sees the write before any watch does: planning again writes nothing more.
    let mut again = fleet::plan(&[Arc::new(policy())], &ctx.caches.all_nodes(), &[], now);
    super::apply(&ctx, &mut again.policies.remove(0), &["gpu-1".to_owned()])
        .await
        .expect("nothing to write");
    assert_eq!(recording.writes().len(), 1, "{:?}", recording.writes());
}

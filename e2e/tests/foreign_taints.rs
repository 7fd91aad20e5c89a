//! Other actors write taints on the same nodes: the Node Readiness Controller (run by GKE and by
//! `DigitalOcean`: `readiness.k8s.io/...`) and the cloud provider
//! (`node.cloudprovider.kubernetes.io/shutdown`). A node's taints are one list, so every write of ours is a read-modify-write over one
//! resourceVersion; through our quarantine, our remediation's cordon and our release, their taints
//! stay exactly as they wrote them (key, value, effect), and a taint they add while we hold ours
//! survives our release.

mod common;
mod scenario;

use std::time::Duration;

use common::eventually;
use gpu_remediation_api::{
    Phase,
    constants::{QUARANTINE_TAINT_KEY, REMEDIATION_TAINT_KEY},
};
use k8s_openapi::api::core::v1::{Node, Taint};
use scenario::{RunningController, Scenario, is_unschedulable};

const READINESS: &str = "readiness.k8s.io/gpu-driver-ready";
const CLOUD_SHUTDOWN: &str = "node.cloudprovider.kubernetes.io/shutdown";
const READINESS_LATE: &str = "readiness.k8s.io/network-ready";

fn taint(key: &str, value: Option<&str>) -> Taint {
    Taint {
        key: key.into(),
        value: value.map(Into::into),
        effect: "NoSchedule".into(),
        ..Taint::default()
    }
}

/// The node's taints that are not ours, without the server's `timeAdded`. The node-lifecycle
/// controller's `node.kubernetes.io/unschedulable` is left out too: it mirrors our cordon
/// (`spec.unschedulable`) a moment after it, and goes a moment after the uncordon, so it is ours
/// in effect, and its timing is the controller-manager's.
fn foreign(node: &Node) -> Vec<Taint> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|t| !t.key.starts_with("gpuremediation.dev/") && t.key != "node.kubernetes.io/unschedulable")
        .map(|t| Taint {
            time_added: None,
            ..t
        })
        .collect()
}

fn keys(node: &Node) -> Vec<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|t| t.iter().map(|t| t.key.clone()).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_actors_taints_survive_our_quarantine_cordon_and_release_unchanged() {
    let s = Scenario::new(2).await;
    let target = s.nodes()[0].clone();
    let theirs = vec![taint(READINESS, Some("false")), taint(CLOUD_SHUTDOWN, None)];
    for t in &theirs {
        s.add_taint(&target, t).await;
    }
    assert_eq!(foreign(&s.node(&target).await), theirs);
    s.policy(serde_json::json!({
        "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "5s"}],
        "safety": {"maxUnhealthy": "100%"},
        "release": {"healthyFor": "2s"},
    }))
    .await;
    let _controller = RunningController::start(&s.scope).await;

    // Quarantine: our taint joins theirs.
    s.break_gpu(&target).await;
    let quarantined = eventually("the quarantine taint", Duration::from_secs(10), || async {
        let n = s.node(&target).await;
        keys(&n).iter().any(|k| k == QUARANTINE_TAINT_KEY).then_some(n)
    })
    .await;
    assert_eq!(foreign(&quarantined), theirs, "after our quarantine");

    // The remediation's cordon.
    let cordoned = eventually("the remediation's cordon", Duration::from_secs(30), || async {
        let n = s.node(&target).await;
        (is_unschedulable(&n) && keys(&n).iter().any(|k| k == REMEDIATION_TAINT_KEY)).then_some(n)
    })
    .await;
    assert_eq!(foreign(&cordoned), theirs, "after our cordon");

    // While we hold ours, the readiness controller adds another.
    let late = taint(READINESS_LATE, Some("false"));
    s.add_taint(&target, &late).await;
    let mut expected = theirs.clone();
    expected.push(late);

    // The node recovers: the remediation releases it.
    s.heal_gpu(&target).await;
    let released = eventually("the release", Duration::from_secs(60), || async {
        let n = s.node(&target).await;
        let ours = keys(&n).iter().any(|k| k.starts_with("gpuremediation.dev/"));
        (!ours && !is_unschedulable(&n)).then_some(n)
    })
    .await;
    assert_eq!(foreign(&released), expected, "after our release");
    let record = s.remediation_of(&target).await.expect("the remediation");
    assert!(
        scenario::phase_at(&record, Phase::Cordoned).is_some(),
        "the release was the remediation's, after its cordon"
    );
}

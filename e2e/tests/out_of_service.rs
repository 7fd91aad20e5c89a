//! Dead nodes released with the out-of-service taint, on the real control plane (its node
//! lifecycle controller, pod garbage collector and `StatefulSet` controller): a node whose simulated
//! kubelet stops (heartbeats and Lease stop) runs a `StatefulSet`'s only pod; its GPU fault's
//! remediation (`action: Reboot`, the default `drain.onTimeout: Block` and timeout) evicts the pod,
//! which stays `Terminating` (no kubelet finalises it); the node being unreachable (Ready=Unknown),
//! the pod counts as gone once its `deletionTimestamp` is `drain.unreachableAfter` past, so the
//! drain ends (Event `UnreachablePodsSkipped`, never `Blocked`) and the reboot is triggered. Once
//! the node is confirmed down (the reboot triggered, Ready=Unknown and the Lease unrenewed for
//! `DOWN_FOR`), the controller adds
//! `node.kubernetes.io/out-of-service=nodeshutdown:NoExecute`, the pod garbage collector
//! force-deletes the stuck pod and the `StatefulSet` recreates it on the other node; when the node
//! reports again, the taint is lifted.

mod common;
mod scenario;

use std::time::{Duration, Instant};

use common::{cluster_with, eventually};
use gpu_remediation_api::{
    Phase,
    constants::{OUT_OF_SERVICE_BY_ANNOTATION, OUT_OF_SERVICE_TAINT_KEY, remediation_conditions},
};
use gpu_remediator::out_of_service;
use gpu_sandbox::{
    ControlPlaneOptions,
    workload::{self, Workload},
};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{Api, ResourceExt};
use scenario::{RunningController, Scenario};

fn with_short_node_grace() -> ControlPlaneOptions {
    ControlPlaneOptions {
        node_monitor_grace_period: Some(Duration::from_secs(4)),
        ..ControlPlaneOptions::default()
    }
}

fn taint_of(node: &Node) -> Option<(Option<String>, String)> {
    node.spec
        .as_ref()?
        .taints
        .as_ref()?
        .iter()
        .find(|t| t.key == OUT_OF_SERVICE_TAINT_KEY)
        .map(|t| (t.value.clone(), t.effect.clone()))
}

fn node_of(pod: &Pod) -> Option<String> {
    pod.spec.as_ref()?.node_name.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_nodes_stuck_statefulset_pod_moves_once_it_is_confirmed_down_and_the_taint_goes_when_it_returns()
 {
    let down_for = Duration::try_from(out_of_service::DOWN_FOR).expect("a positive bound");
    cluster_with(with_short_node_grace).await;
    let s = Scenario::new(2).await;
    common::install_crd(&s.client, common::REBOOT_CRD).await;
    let (target, other) = (s.nodes()[0].clone(), s.nodes()[1].clone());

    // The StatefulSet's pod runs on the target (the other node cordoned while it starts).
    s.set_unschedulable(&other, true).await;
    let app = Workload::new(&s.namespace, "db")
        .replicas(1)
        .on_nodes(&[&target, &other]);
    workload::create(&s.client, &app.stateful_set())
        .await
        .expect("the StatefulSet");
    let pods = Api::<Pod>::namespaced(s.client.clone(), &s.namespace);
    let first = eventually("db-0 running on the target", Duration::from_secs(60), || async {
        let pod = pods.get("db-0").await.ok()?;
        (workload::is_ready(&pod) && node_of(&pod).as_deref() == Some(target.as_str())).then_some(pod)
    })
    .await;
    s.set_unschedulable(&other, false).await;

    // The host dies, its GPU's last report a fault.
    assert!(s.fleet.stop_kubelet(&target));
    let died = Instant::now();
    s.break_gpu(&target).await;
    // The evicted pod stays terminating on the dead node; with the default onTimeout (Block) and
    // timeout (30m), only `unreachableAfter` lets the drain end.
    let mut policy = scenario::reboot_policy(&s, "10m");
    policy["drain"] = serde_json::json!({"unreachableAfter": "5s"});
    s.policy(policy).await;
    let _controller = RunningController::start(&s.scope).await;

    let tainted = eventually(
        "the out-of-service taint",
        down_for + Duration::from_secs(60),
        || async {
            let node = s.node(&target).await;
            taint_of(&node).map(|taint| (node, taint))
        },
    )
    .await;
    let after = died.elapsed();
    eprintln!("kubelet stopped to out-of-service taint: {after:?}");
    assert!(
        after >= down_for,
        "added {after:?} after the kubelet stopped, before {down_for:?}"
    );
    assert_eq!(
        tainted.1,
        (Some("nodeshutdown".to_owned()), "NoExecute".to_owned())
    );
    let record = s.remediation_of(&target).await.expect("the remediation");
    assert_eq!(
        tainted.0.annotations().get(OUT_OF_SERVICE_BY_ANNOTATION),
        Some(&record.name_any())
    );
    let status = record.status.as_ref().expect("a status");
    assert!(status.replacement.is_some(), "the reboot was triggered first");
    let drain = status.drain.as_ref().expect("the drain's record");
    assert!(
        drain.pods_evicted >= 1 && drain.pods_remaining == 0,
        "the eviction accepted, then the pod counted gone: {drain:?}"
    );
    let drained = status
        .conditions
        .iter()
        .find(|c| c.type_ == remediation_conditions::DRAINED)
        .expect("the Drained condition");
    assert!(
        drained.status == "True"
            && drained
                .message
                .contains("1 counted gone: the node is unreachable"),
        "{drained:?}"
    );
    assert!(
        status.phase_history.iter().all(|t| t.phase != Phase::Blocked),
        "the drain never blocked: {:?}",
        status.phase_history
    );
    let skipped = eventually(
        "the UnreachablePodsSkipped Event",
        Duration::from_secs(10),
        || async {
            scenario::events_about(&s.client, &record.name_any())
                .await
                .get("UnreachablePodsSkipped")
                .copied()
        },
    )
    .await;
    assert_eq!(skipped, 1, "said once");

    // The pod GC force-deletes the stuck pod; the StatefulSet recreates it on the other node.
    let moved = eventually(
        "db-0 recreated on the other node",
        Duration::from_secs(90),
        || async {
            let pod = pods.get("db-0").await.ok()?;
            (pod.uid() != first.uid() && node_of(&pod).as_deref() == Some(other.as_str())).then_some(pod)
        },
    )
    .await;
    eprintln!(
        "kubelet stopped to db-0 recreated on {}: {:?}",
        other,
        died.elapsed()
    );
    assert!(moved.metadata.deletion_timestamp.is_none());

    // The node comes back: the taint is lifted.
    s.fleet.start_kubelet(&target).await.expect("the kubelet back");
    let back = eventually("the taint lifted", Duration::from_secs(30), || async {
        let node = s.node(&target).await;
        taint_of(&node).is_none().then_some(node)
    })
    .await;
    assert!(!back.annotations().contains_key(OUT_OF_SERVICE_BY_ANNOTATION));
}

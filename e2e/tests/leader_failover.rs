//! Two controller replicas as processes, each under its own service account with the project's
//! real RBAC: kill -9 of the leader mid-drain; the follower takes over within the lease duration
//! and finishes the same remediation; the rate budget holds across the failover; and the API
//! server's audit log shows that at no instant did both act (every mutating request of the old
//! leader completed before the first of the new one).

mod leader_support;

use std::time::Duration;

use e2e::eventually;
use gpu_remediation_api::Phase;
use gpu_sandbox::{
    provider::Provider,
    workload::{self, Budget, Workload},
};
use k8s_openapi::{
    api::{core::v1::Node, policy::v1::PodDisruptionBudget},
    jiff::Timestamp,
};
use kube::{
    Api, Client, ResourceExt as _,
    api::{Patch, PatchParams},
};
use leader_support::{
    ReplicaProcess, cluster, create_namespace,
    fleet::{create_replace_policy, fleet_with_provider, remediations_of, start_leader_then_follower},
    lease_holder, mutating_requests, username,
};
use serde_json::json;

/// The controller's default lease duration (`ElectionTimings::default()`).
const LEASE_DURATION: Duration = Duration::from_secs(15);

/// The fleet and everything on it.
struct Scenario {
    admin: Client,
    test: String,
    controller_namespace: String,
    workload_namespace: String,
    broken: String,
    also_broken: String,
    provider: Provider,
}

/// Three nodes; three pods pinned to the first behind a PDB allowing one disruption, so the drain
/// evicts one pod and is then refused (the evicted pod's replacement cannot be scheduled on the
/// cordoned node) until the test relaxes the PDB; and a policy allowing one recycle per hour, so
/// the second broken node must wait whoever leads.
async fn set_up() -> Scenario {
    let cluster = cluster().await;
    let admin = cluster.control_plane.client();
    let test = format!("failover-{}", std::process::id());
    let controller_namespace = format!("{test}-ctrl");
    let workload_namespace = format!("{test}-work");
    create_namespace(&admin, &controller_namespace).await;
    create_namespace(&admin, &workload_namespace).await;
    let (fleet, provider) = fleet_with_provider(&admin, &test, 3).await;
    let nodes = fleet.node_names();
    let (broken, also_broken) = (nodes[0].clone(), nodes[1].clone());
    let app = Workload::new(&workload_namespace, "trainer")
        .replicas(3)
        .on_nodes(&[broken.as_str()]);
    workload::create(&admin, &app.deployment())
        .await
        .expect("deployment");
    workload::create(&admin, &app.pdb(&Budget::max_unavailable(1)))
        .await
        .expect("pdb");
    workload::wait_ready_pods(
        &admin,
        &workload_namespace,
        &app.selector(),
        3,
        Duration::from_secs(60),
    )
    .await
    .expect("pods ready");
    workload::wait_pdb_observed(&admin, &workload_namespace, "trainer", Duration::from_secs(30))
        .await
        .expect("pdb observed");
    create_replace_policy(
        &admin,
        &test,
        json!({"maxConcurrent": 1, "maxUnhealthy": "100%", "rate": {"limit": 1, "per": "1h"}}),
        Some(json!({"timeout": "10m", "onTimeout": "Block"})),
    )
    .await;
    Scenario {
        admin,
        test,
        controller_namespace,
        workload_namespace,
        broken,
        also_broken,
        provider,
    }
}

/// Starts `replica-a`, waits (up to 120 s) until it leads, then starts `replica-b`.
async fn start_replicas(scenario: &Scenario) -> (ReplicaProcess, ReplicaProcess) {
    start_leader_then_follower(
        cluster().await,
        &scenario.controller_namespace,
        &scenario.test,
        ["replica-a", "replica-b"],
        Duration::from_secs(120),
    )
    .await
}

/// Reads the audit log: both replicas acted (the old leader started the drain, the new one
/// evicted what was left), every write of the old leader completed before the first of the new
/// one, and the new one started within the lease duration (plus its polling) of the kill.
fn assert_replicas_never_acted_together(
    cluster: &leader_support::AuditedCluster,
    controller_namespace: &str,
    killed_at: Timestamp,
    took_over_after: k8s_openapi::jiff::SignedDuration,
    provider: &Provider,
) {
    let acting = |account: &str| -> Vec<_> {
        mutating_requests(cluster, &username(controller_namespace, account))
            .into_iter()
            .filter(|event| !event.is_lease_write())
            .collect()
    };
    let by_a = acting("replica-a");
    let by_b = acting("replica-b");
    let evictions = |events: &[leader_support::AuditEvent]| {
        events
            .iter()
            .filter(|e| e.subresource.as_deref() == Some("eviction") && e.code == 201)
            .count()
    };
    assert!(evictions(&by_a) >= 1, "replica-a started the drain: {by_a:#?}");
    assert!(
        evictions(&by_b) >= 2,
        "replica-b evicted the pods the leader could not: {by_b:#?}"
    );
    let a_last = by_a
        .iter()
        .map(|event| event.stage_timestamp)
        .max()
        .expect("some");
    let b_first = by_b
        .iter()
        .min_by_key(|event| event.request_received_timestamp)
        .expect("some");
    assert!(
        a_last < b_first.request_received_timestamp,
        "both replicas acted at once: replica-b's first write {} came before replica-a's last completed at {a_last}",
        b_first.describe()
    );
    let b_started_after = b_first.request_received_timestamp.duration_since(killed_at);
    assert!(
        // Its polling (2s), its allowance for the caches (1s) and its fence probe: 4s.
        b_started_after.unsigned_abs() <= LEASE_DURATION + Duration::from_secs(4),
        "replica-b acted only {b_started_after:?} after the kill"
    );
    eprintln!(
        "failover: Lease held by replica-b {took_over_after:?} after kill -9 of replica-a, first write \
         {b_started_after:?} after; writes: replica-a {} ({} evictions), replica-b {} ({} evictions); gap \
         between a's last and b's first: {:?}; replaced by the provider: {:?}",
        by_a.len(),
        evictions(&by_a),
        by_b.len(),
        evictions(&by_b),
        b_first.request_received_timestamp.duration_since(a_last),
        provider.replacements(),
    );
}

#[tokio::test]
async fn killing_the_leader_mid_drain_hands_the_same_remediation_to_the_follower_without_overlap() {
    let cluster = cluster().await;
    let scenario = set_up().await;
    let (mut a, mut b) = start_replicas(&scenario).await;
    let Scenario {
        admin,
        controller_namespace,
        workload_namespace,
        broken,
        also_broken,
        provider,
        ..
    } = &scenario;

    gpu_sandbox::fault::set_gpu_condition(admin, broken, "False", "XID79", "GPU fell off the bus")
        .await
        .expect("fault");
    let first = eventually(
        "one eviction, then the PDB refusing the next",
        Duration::from_secs(60),
        || async {
            let remediation = remediations_of(admin, broken).await.into_iter().next()?;
            let status = remediation.status.as_ref()?;
            let drain = status.drain.as_ref()?;
            let refused = drain.pods_evicted == 1 && !drain.blockers.is_empty();
            (status.phase == Phase::Draining && refused).then_some(remediation)
        },
    )
    .await;
    gpu_sandbox::fault::set_gpu_condition(admin, also_broken, "False", "XID79", "GPU fell off the bus")
        .await
        .expect("fault");
    // Let the leader see the second node and defer it (the rate window is full).
    tokio::time::sleep(Duration::from_secs(3)).await;

    let killed_at = Timestamp::now();
    a.kill_9().await;
    eventually(
        "replica-b to take over",
        LEASE_DURATION + Duration::from_secs(10),
        || async {
            lease_holder(admin, controller_namespace)
                .await
                .is_some_and(|h| h.starts_with("replica-b_"))
                .then_some(())
        },
    )
    .await;
    let took_over_after = Timestamp::now().duration_since(killed_at);
    // Room in the budget again: the rest of the drain is the new leader's.
    Api::<PodDisruptionBudget>::namespaced(admin.clone(), workload_namespace)
        .patch(
            "trainer",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"maxUnavailable": 3}})),
        )
        .await
        .expect("relaxing the PDB");
    let finished = eventually(
        "the same remediation to succeed under replica-b",
        Duration::from_secs(120),
        || async {
            let remediation = remediations_of(admin, broken).await.into_iter().next()?;
            let phase = remediation.status.as_ref()?.phase;
            assert_ne!(
                phase,
                Phase::Failed,
                "{remediation:?}\n--- replica-b log ---\n{}",
                b.log_tail()
            );
            (phase == Phase::Succeeded).then_some(remediation)
        },
    )
    .await;

    assert_eq!(
        finished.uid(),
        first.uid(),
        "the follower finished the remediation the leader started"
    );
    assert_eq!(
        remediations_of(admin, broken).await.len(),
        1,
        "no second remediation of the same node"
    );
    assert!(
        remediations_of(admin, also_broken).await.is_empty(),
        "the rate budget (1 per hour) was spent before the failover and must still hold after it"
    );
    assert!(
        Api::<Node>::all(admin.clone())
            .get_opt(broken)
            .await
            .expect("node")
            .is_none(),
        "DeleteNode"
    );
    assert!(
        b.exited().is_none(),
        "the new leader keeps running:\n{}",
        b.log_tail()
    );

    assert_replicas_never_acted_together(
        cluster,
        controller_namespace,
        killed_at,
        took_over_after,
        provider,
    );
    let status = b.terminate().await;
    assert!(
        status.success(),
        "SIGTERM is a clean exit: {status:?}\n{}",
        b.log_tail()
    );
    assert_eq!(
        lease_holder(admin, controller_namespace).await,
        None,
        "the leader released the Lease on SIGTERM"
    );
}

//! Two controller replicas as processes, each under its own service account with the project's
//! real RBAC: kill -9 of the leader mid-drain; the follower takes over within the lease duration
//! and finishes the same remediation; the rate budget holds across the failover; and the API
//! server's audit log shows that at no instant did both act (every mutating request of the old
//! leader completed before the first of the new one).

mod leader_support;

use std::{sync::Arc, time::Duration};

use e2e::eventually;
use gpu_remediation_api::{GpuRemediation, GpuRemediationPolicy, Phase, constants::NODE_LABEL};
use gpu_sandbox::{
    Fleet, FleetOptions,
    fleet::FLEET_LABEL,
    provider::{Provider, ProviderKind},
    workload::{self, Budget, Workload},
};
use k8s_openapi::{
    api::{core::v1::Node, policy::v1::PodDisruptionBudget},
    jiff::Timestamp,
};
use kube::{
    Api, Client, ResourceExt as _,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use leader_support::{
    ReplicaOptions, ReplicaProcess, cluster, controller_account, create_namespace, kubeconfig_with_token,
    lease_holder, mutating_requests, username,
};
use serde_json::json;

/// The controller's default lease duration (`ElectionTimings::default()`).
const LEASE_DURATION: Duration = Duration::from_secs(15);

async fn remediations_of(client: &Client, node: &str) -> Vec<GpuRemediation> {
    Api::<GpuRemediation>::all(client.clone())
        .list(&ListParams::default().labels(&format!("{NODE_LABEL}={node}")))
        .await
        .expect("listing remediations")
        .items
}

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
    let options = FleetOptions {
        nodes: 3,
        name_prefix: test.clone(),
        ..FleetOptions::default()
    };
    let fleet = Arc::new(Fleet::start(admin.clone(), options).await.expect("fleet"));
    let provider = Provider::start(admin.clone(), Arc::clone(&fleet), ProviderKind::NodeGroup)
        .await
        .expect("provider");
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
    let policy: GpuRemediationPolicy = serde_json::from_value(json!({
        "apiVersion": "gpuremediation.dev/v1alpha1",
        "kind": "GpuRemediationPolicy",
        "metadata": {"name": test, "labels": {"e2e": test}},
        "spec": {
            "nodeSelector": {"matchLabels": {FLEET_LABEL: test}},
            "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "1s"}],
            "action": "Replace",
            "replacement": {"strategy": "DeleteNode", "timeout": "5m"},
            "safety": {"maxConcurrent": 1, "maxUnhealthy": "100%", "rate": {"limit": 1, "per": "1h"}},
            "drain": {"timeout": "10m", "onTimeout": "Block"},
        },
    }))
    .expect("a policy");
    Api::<GpuRemediationPolicy>::all(admin.clone())
        .create(&PostParams::default(), &policy)
        .await
        .expect("policy");
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

/// Starts `replica-a`, waits until it leads, then starts `replica-b`.
async fn start_replicas(scenario: &Scenario) -> (ReplicaProcess, ReplicaProcess) {
    let cluster = cluster().await;
    let admin = &scenario.admin;
    let selector = format!("e2e={}", scenario.test);
    let mut replicas = Vec::new();
    for identity in ["replica-a", "replica-b"] {
        let token = controller_account(admin, &scenario.controller_namespace, identity).await;
        let kubeconfig = kubeconfig_with_token(cluster, identity, &token);
        let options = ReplicaOptions {
            identity,
            lease_namespace: &scenario.controller_namespace,
            kubeconfig: &kubeconfig,
            policy_selector: &selector,
            extra_args: Vec::new(),
        };
        replicas.push(ReplicaProcess::start(cluster, options).await);
        if identity == "replica-a" {
            eventually("replica-a to lead", Duration::from_secs(120), || async {
                let holder = lease_holder(admin, &scenario.controller_namespace).await;
                holder.is_some_and(|h| h.starts_with("replica-a-")).then_some(())
            })
            .await;
        }
    }
    let b = replicas.pop().expect("replica-b");
    let a = replicas.pop().expect("replica-a");
    (a, b)
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
        b_started_after.unsigned_abs() <= LEASE_DURATION + Duration::from_secs(3),
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
                .is_some_and(|h| h.starts_with("replica-b-"))
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

//! A deposed leader, on the real control plane under the shipped RBAC and the shipped fence policy
//! (`manifests/controller/fence-policy.yaml`), both replicas as the manifests' service account
//! `gpu-remediation/gpu-remediator`, as a real installation runs them.
//!
//! The leader is frozen with a real SIGSTOP at a chosen write, after its local fence check passed
//! and its claim was put on the request (the test-only hook `GPU_REMEDIATOR_TEST_FREEZE_BEFORE`
//! of `gpu_remediator::leader::freeze` picks the instant; nothing else about the replica differs).
//! It stays stopped past its lease; then it is resumed and its write goes out late, as after a GC
//! pause or a stopped VM. The refusals come from the real API server, and its audit log (`Request`
//! level, so the claim each write carries is on record) shows them:
//!
//! - an eviction in flight: replica B takes over and carries the remediation to `Succeeded`; A's
//!   eviction is refused by the fence policy, every write carrying A's claim after the resume is
//!   refused, A exits, and B's phase (and B's claim in the status) stands;
//! - a node delete sent after losing the Lease: A froze after stamping the node and before
//!   deleting it; the Lease moves on; A's delete is refused by the policy (the stored object's
//!   claim is not current) and the node stays.

mod leader_support;

use std::time::Duration;

use e2e::eventually;
use gpu_remediation_api::{GpuRemediation, Phase, constants::NODE_LABEL};
use gpu_sandbox::{Fleet, FleetOptions, workload, workload::Workload};
use k8s_openapi::{
    api::{
        coordination::v1::Lease,
        core::v1::{Namespace, Node},
    },
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{ListParams, PostParams},
};
use leader_support::{
    AuditEvent, AuditedCluster, ReplicaOptions, ReplicaProcess, cluster, controller_account,
    fleet::create_replace_policy, kubeconfig_with_token, mutating_requests, username,
};
use serde_json::json;
use tokio::sync::{Mutex, OnceCell};

const NAMESPACE: &str = "gpu-remediation";
const ACCOUNT: &str = "gpu-remediator";
const FREEZE_BEFORE: &str = gpu_remediator::leader::freeze::FREEZE_BEFORE_ENV;
/// The controller's default lease duration (`ElectionTimings::default()`).
const LEASE_DURATION: Duration = Duration::from_secs(15);

/// The two scenarios share the Lease: one at a time.
static TURN: Mutex<()> = Mutex::const_new(());

/// The controller's namespace, service account (the manifests' RBAC) and fence policy, once; the
/// kubeconfig both replicas use.
async fn installed() -> &'static std::path::Path {
    static KUBECONFIG: OnceCell<std::path::PathBuf> = OnceCell::const_new();
    KUBECONFIG
        .get_or_init(|| async {
            let cluster = cluster().await;
            let admin = cluster.control_plane.client();
            let namespace: Namespace =
                serde_json::from_value(json!({"metadata": {"name": NAMESPACE}})).expect("namespace");
            Api::<Namespace>::all(admin.clone())
                .create(&PostParams::default(), &namespace)
                .await
                .expect("namespace");
            // The manifests' RBAC, and the fence policy exactly as shipped.
            let token = controller_account(&admin, NAMESPACE, ACCOUNT).await;
            kubeconfig_with_token(cluster, "controller", &token)
        })
        .await
}

/// One broken node's world: a fleet, a policy selecting it, the policy's scope label.
struct World {
    admin: Client,
    scope: String,
    fleet: Fleet,
}

async fn world(scope: &str, nodes: usize) -> World {
    let cluster = cluster().await;
    let admin = cluster.control_plane.client();
    let options = FleetOptions {
        nodes,
        name_prefix: scope.to_owned(),
        ..FleetOptions::default()
    };
    let fleet = Fleet::start(admin.clone(), options).await.expect("fleet");
    create_replace_policy(
        &admin,
        scope,
        json!({"maxConcurrent": 1, "maxUnhealthy": "100%"}),
        Some(json!({"timeout": "10m", "onTimeout": "Block"})),
    )
    .await;
    World {
        admin,
        scope: scope.to_owned(),
        fleet,
    }
}

async fn replica(world: &World, identity: &str, env: &[(&str, &str)]) -> ReplicaProcess {
    let cluster = cluster().await;
    let selector = format!("e2e={}", world.scope);
    let options = ReplicaOptions {
        identity,
        lease_namespace: NAMESPACE,
        kubeconfig: installed().await,
        policy_selector: &selector,
        extra_args: Vec::new(),
    };
    ReplicaProcess::start_with_env(cluster, options, env).await
}

/// The Lease's current claim, `<holder>/<leaseTransitions>`, once `identity`'s process holds it.
async fn claim_of(admin: &Client, identity: &str, within: Duration) -> String {
    let prefix = format!("{identity}_");
    eventually(&format!("{identity} to lead"), within, || async {
        let lease = Api::<Lease>::namespaced(admin.clone(), NAMESPACE)
            .get_opt("gpu-remediator")
            .await
            .ok()??;
        let spec = lease.spec?;
        let holder = spec.holder_identity.filter(|h| h.starts_with(&prefix))?;
        Some(format!("{holder}/{}", spec.lease_transitions.unwrap_or(0)))
    })
    .await
}

async fn remediation_of(admin: &Client, node: &str) -> Option<GpuRemediation> {
    Api::<GpuRemediation>::all(admin.clone())
        .list(&ListParams::default().labels(&format!("{NODE_LABEL}={node}")))
        .await
        .ok()?
        .items
        .into_iter()
        .next()
}

async fn frozen(a: &ReplicaProcess, within: Duration) {
    eventually("the leader to freeze at its write", within, || async {
        a.is_stopped().then_some(())
    })
    .await;
}

/// The controller's writes after `since` that carry `claim` (in their body, or, for a delete,
/// in the policy's refusal naming the stored object's claim).
fn writes_carrying(cluster: &AuditedCluster, claim: &str, since: Timestamp) -> Vec<AuditEvent> {
    mutating_requests(cluster, &username(NAMESPACE, ACCOUNT))
        .into_iter()
        .filter(|event| event.request_received_timestamp >= since && !event.is_lease_write())
        .filter(|event| event.line.contains(&format!("\"{claim}\"")) || event.line.contains(claim))
        .collect()
}

fn assert_all_refused(writes: &[AuditEvent], claim: &str) {
    assert!(
        !writes.is_empty(),
        "no write carrying {claim} reached the API server"
    );
    for write in writes {
        assert!(
            write.code >= 400,
            "a write of the deposed leader landed: {}",
            write.describe()
        );
    }
}

fn fence_denial(write: &AuditEvent) -> Option<String> {
    write
        .policy_denial()
        .filter(|denial| denial.contains("gpu-remediator-fence"))
}

#[tokio::test]
async fn a_deposed_leaders_eviction_in_flight_is_refused_and_its_successors_phase_stands() {
    let _turn = TURN.lock().await;
    installed().await;
    let cluster = cluster().await;
    let world = world("deposed-evict", 2).await;
    let admin = &world.admin;
    let broken = world.fleet.node_names()[0].clone();
    let namespace = "deposed-evict";
    leader_support::create_namespace(admin, namespace).await;
    let app = Workload::new(namespace, "trainer")
        .replicas(2)
        .on_nodes(&[broken.as_str()]);
    workload::create(admin, &app.deployment())
        .await
        .expect("deployment");
    workload::wait_ready_pods(admin, namespace, &app.selector(), 2, Duration::from_secs(60))
        .await
        .expect("pods ready");

    let mut a = replica(&world, "deposed-a", &[(FREEZE_BEFORE, "eviction")]).await;
    let a_claim = claim_of(admin, "deposed-a", Duration::from_secs(60)).await;
    let mut b = replica(&world, "successor-b", &[]).await;
    gpu_sandbox::fault::set_gpu_condition(admin, &broken, "False", "XID79", "GPU fell off the bus")
        .await
        .expect("fault");
    frozen(&a, Duration::from_secs(60)).await;
    let frozen_at = Timestamp::now();

    let b_claim = claim_of(admin, "successor-b", LEASE_DURATION + Duration::from_secs(15)).await;
    let moved_on = eventually(
        "the successor to carry the remediation to Succeeded",
        Duration::from_secs(90),
        || async {
            let remediation = remediation_of(admin, &broken).await?;
            let phase = remediation.status.as_ref()?.phase;
            assert_ne!(phase, Phase::Failed, "{remediation:?}\n{}", b.log_tail());
            // Finished by B, its finalizer dropped too: B writes the record no more.
            let finished = remediation.metadata.finalizers.as_ref().is_none_or(Vec::is_empty);
            (phase == Phase::Succeeded && finished).then_some(remediation)
        },
    )
    .await;

    let resumed_at = Timestamp::now();
    a.resume();
    let exited = a.exit_within(Duration::from_secs(30)).await.unwrap_or_else(|| {
        panic!(
            "the deposed leader exits once it sees the Lease lost:\n{}",
            a.log_tail()
        )
    });
    assert!(
        !exited.success(),
        "losing the Lease is a failure exit: {exited:?}"
    );

    let late = writes_carrying(cluster, &a_claim, resumed_at);
    assert_all_refused(&late, &a_claim);
    let eviction = late
        .iter()
        .find(|w| w.subresource.as_deref() == Some("eviction"))
        .unwrap_or_else(|| panic!("the eviction in flight reached the server: {late:#?}"));
    assert_eq!(eviction.code, 403, "{}", eviction.describe());
    let denial = fence_denial(eviction).unwrap_or_else(|| panic!("no fence denial: {}", eviction.line));
    assert!(
        denial.contains(&format!("carries the claim {a_claim}")) && denial.contains(&b_claim),
        "{denial}"
    );

    let after = remediation_of(admin, &broken).await.expect("the record");
    let status = after.status.expect("a status");
    assert_eq!(status.phase, Phase::Succeeded, "the successor's phase stands");
    assert_eq!(status.claim.as_deref(), Some(b_claim.as_str()));
    assert_eq!(
        after.metadata.resource_version, moved_on.metadata.resource_version,
        "nothing of the deposed leader's landed on the record"
    );
    eprintln!(
        "deposed leader: frozen at {frozen_at}, resumed at {resumed_at}; {} late write(s) carrying \
         {a_claim}, all refused ({}); the successor {b_claim} finished the remediation",
        late.len(),
        late.iter()
            .map(AuditEvent::describe)
            .collect::<Vec<_>>()
            .join("; ")
    );
    let status = b.terminate().await;
    assert!(status.success(), "{status:?}\n{}", b.log_tail());
    world.fleet.stop().await.expect("stopping the fleet");
}

#[tokio::test]
async fn a_node_delete_sent_after_the_lease_was_lost_is_refused_and_the_node_stays() {
    let _turn = TURN.lock().await;
    installed().await;
    let cluster = cluster().await;
    let world = world("deposed-delete", 1).await;
    let admin = &world.admin;
    let broken = world.fleet.node_names()[0].clone();

    let mut a = replica(&world, "deposed-d", &[(FREEZE_BEFORE, "delete nodes")]).await;
    let a_claim = claim_of(admin, "deposed-d", LEASE_DURATION + Duration::from_secs(45)).await;
    gpu_sandbox::fault::set_gpu_condition(admin, &broken, "False", "XID79", "GPU fell off the bus")
        .await
        .expect("fault");
    frozen(&a, Duration::from_secs(60)).await;
    let nodes = Api::<Node>::all(admin.clone());
    let stamped = nodes.get(&broken).await.expect("the node");
    assert_eq!(
        stamped
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("gpuremediation.dev/claim")),
        Some(&a_claim),
        "the leader stamped its claim on the node before its delete"
    );
    assert_eq!(
        stamped
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("gpuremediation.dev/fenced")),
        None,
        "a Node carries our claim, never the fail-closed label: were our Lease deleted, the \
         node-lifecycle controller and people must still write it"
    );

    // The Lease moves on, as when another replica takes it after the lease duration.
    let leases = Api::<Lease>::namespaced(admin.clone(), NAMESPACE);
    let mut lease = leases.get("gpu-remediator").await.expect("the Lease");
    let spec = lease.spec.as_mut().expect("a spec");
    let transitions = spec.lease_transitions.unwrap_or(0) + 1;
    spec.holder_identity = Some("usurper".into());
    spec.lease_transitions = Some(transitions);
    spec.renew_time = Some(MicroTime(Timestamp::now()));
    spec.acquire_time = Some(MicroTime(Timestamp::now()));
    leases
        .replace("gpu-remediator", &PostParams::default(), &lease)
        .await
        .expect("taking the Lease");
    let current = format!("usurper/{transitions}");

    let resumed_at = Timestamp::now();
    a.resume();
    let exited = a
        .exit_within(Duration::from_secs(30))
        .await
        .unwrap_or_else(|| panic!("the deposed leader exits:\n{}", a.log_tail()));
    assert!(!exited.success(), "{exited:?}");

    let late = writes_carrying(cluster, &a_claim, resumed_at);
    assert_all_refused(&late, &a_claim);
    let delete = late
        .iter()
        .find(|w| w.verb == "delete" && w.resource == "nodes" && w.name.as_deref() == Some(broken.as_str()))
        .unwrap_or_else(|| panic!("the node delete reached the server: {late:#?}"));
    assert_eq!(delete.code, 403, "{}", delete.describe());
    let denial = fence_denial(delete).unwrap_or_else(|| panic!("no fence denial: {}", delete.line));
    assert!(
        denial.contains(&format!("carries the claim {a_claim}")) && denial.contains(&current),
        "{denial}"
    );
    assert!(
        nodes.get_opt(&broken).await.expect("node").is_some(),
        "the node stays"
    );
    eprintln!(
        "deposed leader: resumed at {resumed_at}; node delete after losing the Lease refused: {}",
        delete.describe()
    );
    // The fleet first: without the Lease, the fence refuses every write to the nodes the
    // controller labelled, the admin's delete included (a missing Lease fails closed).
    world.fleet.stop().await.expect("stopping the fleet");
    // Give the Lease back so nothing else waits on the usurper.
    leases
        .delete("gpu-remediator", &kube::api::DeleteParams::default())
        .await
        .expect("deleting the Lease");
}

//! Fault suite, the leader dying: two replicas elect a leader on the Lease, and the leader is
//! killed with `SIGKILL` (no shutdown, no release) in the middle of a cordon, and in the middle of
//! a replacement. The follower takes over once the lease expires and finishes the same
//! remediation: none lost, none repeated, no PDB violated (see `chaos_support`).

mod chaos_support;

use std::time::Duration;

use chaos_support::{Invariants, World, leader};
use gpu_remediation_api::Phase;
use gpu_sandbox::bench::{actor::ControllerProcess, setup::eventually};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api,
    api::{Patch, PatchParams},
};

/// Starts replicas `a` and `b` and waits for one to lead; returns (leader, follower).
async fn elect(world: &World) -> (ControllerProcess, ControllerProcess, String) {
    let a = world.controller("replica-a", true, None);
    let b = world.controller("replica-b", true, None);
    let holder = eventually("a leader", Duration::from_secs(60), || leader(&world.env))
        .await
        .expect("one replica leads");
    // The binary appends its pid to `--identity` on the Lease.
    if holder.starts_with("replica-a") {
        (a, b, holder)
    } else {
        assert!(holder.starts_with("replica-b"), "an unknown holder: {holder}");
        (b, a, holder)
    }
}

/// Watches the invariants, creates the default policy, elects a leader among two replicas and
/// breaks `broken`: the invariants, the leader, the follower and the leader's identity.
async fn elected_then_broken(
    world: &World,
    broken: &[String],
) -> (Invariants, ControllerProcess, ControllerProcess, String) {
    let invariants = world.invariants().await;
    world.policy(serde_json::json!({})).await;
    let (leader_process, follower, holder) = elect(world).await;
    world.break_nodes(broken).await;
    (invariants, leader_process, follower, holder)
}

/// Waits until the Lease names a holder other than `old`.
async fn new_leader(world: &World, old: &str) -> String {
    eventually("a new leader", Duration::from_secs(60), || async {
        leader(&world.env).await.filter(|holder| holder != old)
    })
    .await
    .expect("the follower takes the Lease")
}

#[tokio::test]
#[ignore = "fault suite (minutes, own control plane per test): make chaos"]
async fn the_leader_killed_during_the_cordon_is_replaced_and_the_remediation_finishes_once() {
    let world = World::start("kill-cordon", 4).await;
    let broken = vec![world.nodes()[0].clone()];
    // Pods that take 3 s to terminate keep the drain under way long enough to be caught: with the
    // quarantine already holding the node, a drain of pods that go at once ends (create to
    // Succeeded) within one of this test's polls.
    world.apps_on(&broken[0], "app", &[5, 3], Some("3s")).await;
    let (invariants, mut leader_process, follower, holder) = elected_then_broken(&world, &broken).await;
    // The instant the leader has recorded the remediation (its first acts: the record, the
    // cordon, the first evictions), before the drain ends.
    world
        .wait_any(
            "the leader to record the remediation",
            Duration::from_secs(60),
            |phase| {
                phase.is_none_or(|phase| matches!(phase, Phase::Pending | Phase::Cordoned | Phase::Draining))
            },
        )
        .await;
    leader_process.kill_9().await;

    new_leader(&world, &holder).await;
    world
        .all_succeed_once(&broken, Duration::from_secs(180), &invariants)
        .await;
    world.end(follower).await;
}

#[tokio::test]
#[ignore = "fault suite (minutes, own control plane per test): make chaos"]
async fn the_leader_killed_during_the_replacement_is_replaced_and_the_node_is_replaced_once() {
    let world = World::start("kill-replace", 4).await;
    let broken = vec![world.nodes()[0].clone()];
    world.apps_on(&broken[0], "app", &[4], None).await;
    // A finalizer holds the Node object after its deletion, so the replacement stays under way
    // (Replacing/Verifying) until the test lets it go.
    let nodes: Api<Node> = Api::all(world.env.client.clone());
    let hold = serde_json::json!({"metadata": {"finalizers": ["chaos.gpuremediation.dev/hold"]}});
    nodes
        .patch(&broken[0], &PatchParams::default(), &Patch::Merge(&hold))
        .await
        .expect("adding the finalizer");
    let (invariants, mut leader_process, follower, holder) = elected_then_broken(&world, &broken).await;
    world
        .wait_any(
            "the leader to trigger the replacement",
            Duration::from_secs(120),
            |phase| phase.is_some_and(|phase| matches!(phase, Phase::Replacing | Phase::Verifying)),
        )
        .await;
    leader_process.kill_9().await;
    new_leader(&world, &holder).await;
    nodes
        .patch(
            &broken[0],
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("releasing the finalizer");

    world
        .all_succeed_once(&broken, Duration::from_secs(180), &invariants)
        .await;
    assert!(
        nodes
            .get_opt(&broken[0])
            .await
            .expect("reading the node")
            .is_none(),
        "the replaced node is gone"
    );
    world.end(follower).await;
}

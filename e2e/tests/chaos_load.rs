//! Fault suite, faults that arrive in bulk or from people: a flood of condition flaps, 30% of the
//! fleet failing at once, and a remediation hand-edited into nonsense. Every scenario ends with
//! the suite's invariants asserted (see `chaos_support`).

mod chaos_support;

use std::time::Duration;

use chaos_support::World;
use futures::future::join_all;
use gpu_remediation_api::{GpuRemediation, Phase};
use gpu_sandbox::{bench::setup::eventually, fault};
use k8s_openapi::api::{core::v1::Pod, policy::v1::PodDisruptionBudget};
use kube::{
    Api, ResourceExt as _,
    api::{ListParams, Patch, PatchParams},
};

#[tokio::test]
#[ignore = "fault suite (minutes, own control plane per test): make chaos"]
async fn a_flood_of_flaps_faster_than_for_starts_nothing_and_a_real_fault_after_it_is_handled_once() {
    let world = World::start("flaps", 10).await;
    let nodes = world.nodes();
    world.apps_spread("web", &[10]).await;
    let invariants = world.invariants().await;
    // `for: 5s`; every node flaps with 1 s holds for 20 s, all at once. (With a `for` of 2 s a
    // loaded machine can delay a flap's return to True past it, which is a real fault.)
    world
        .policy(serde_json::json!({"triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "5s"}]}))
        .await;
    let controller = world.controller("solo", false, None);
    let client = world.env.client.clone();
    let flaps = nodes.iter().map(|node| {
        let client = client.clone();
        async move { fault::flap(&client, node, "XID79", 10, Duration::from_secs(1)).await }
    });
    for result in join_all(flaps).await {
        result.expect("flapping a node");
    }
    // Give a late decision time to show up before judging that nothing started.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(invariants.remediation_count(), 0, "a flap started a remediation");
    assert!(
        invariants.cordons.first_held().is_empty(),
        "a flap cordoned a node"
    );

    let broken = vec![nodes[3].clone()];
    world.break_nodes(&broken).await;
    world
        .all_succeed_once(&broken, Duration::from_secs(120), &invariants)
        .await;
    world.end(controller).await;
}

#[tokio::test]
#[ignore = "fault suite (minutes, own control plane per test): make chaos"]
async fn thirty_percent_failing_at_once_are_taken_one_at_a_time_and_each_once() {
    let world = World::start("thirty", 10).await;
    let nodes = world.nodes();
    world.apps_spread("web", &[10, 10, 10]).await;
    let invariants = world.invariants().await;
    world
        .policy(serde_json::json!({"safety": {"maxConcurrent": 1, "maxUnhealthy": "30%"}}))
        .await;
    let controller = world.controller("solo", false, None);
    let broken: Vec<String> = nodes[..3].to_vec();
    world.break_nodes(&broken).await;
    world
        .all_succeed_once(&broken, Duration::from_secs(300), &invariants)
        .await;
    world.end(controller).await;
}

#[tokio::test]
#[ignore = "fault suite (minutes, own control plane per test): make chaos"]
async fn a_remediation_hand_edited_into_nonsense_is_carried_to_the_end_once() {
    let world = World::start("nonsense", 3).await;
    let broken = vec![world.nodes()[0].clone()];
    let apps = world.apps_on(&broken[0], "app", &[4], None).await;
    // Nothing may leave until the test says so: the drain waits in Draining with a blocker.
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(world.env.client.clone(), &world.scope);
    let set_budget = |max_unavailable: i32| {
        let pdbs = pdbs.clone();
        let name = apps[0].name.clone();
        async move {
            pdbs.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"spec": {"maxUnavailable": max_unavailable}})),
            )
            .await
            .expect("patching the PDB");
        }
    };
    // The sampler holds the budget to `maxUnavailable: 1`, the one it ends with; while the test
    // blocks the drain with `maxUnavailable: 0` the real budget is only stricter.
    let invariants = world.invariants().await;
    set_budget(0).await;
    gpu_sandbox::workload::wait_pdb_allows(
        &world.env.client,
        &world.scope,
        &apps[0].name,
        0,
        Duration::from_secs(60),
    )
    .await
    .expect("the disruption controller observes the blocking budget");
    world.policy(serde_json::json!({})).await;
    let controller = world.controller("solo", false, None);
    world.break_nodes(&broken).await;
    let blocked = world
        .wait_phase(&broken[0], Phase::Draining, Duration::from_secs(60))
        .await;
    let uid = blocked.uid().expect("a UID");

    // A person edits the record into nonsense: the phase back to Pending with the node already
    // cordoned, the history wiped, impossible drain counts, and the node label changed.
    let remediations: Api<GpuRemediation> = Api::all(world.env.client.clone());
    let name = blocked.name_any();
    remediations
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {
                "phase": "Pending",
                "phaseHistory": [],
                "drain": {"podsTotal": 0, "podsEvicted": 999, "podsRemaining": 0, "blockers": []},
                "message": "hand-edited nonsense",
            }})),
        )
        .await
        .expect("editing the status");
    remediations
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(
                serde_json::json!({"metadata": {"labels": {"gpuremediation.dev/node": "somewhere-else"}}}),
            ),
        )
        .await
        .expect("editing the labels");
    tokio::time::sleep(Duration::from_secs(3)).await;
    set_budget(1).await;

    let done = world
        .wait_phase(&broken[0], Phase::Succeeded, Duration::from_secs(180))
        .await;
    assert_eq!(
        done.uid().as_deref(),
        Some(uid.as_str()),
        "the same remediation finished"
    );
    let drain = done.status.and_then(|s| s.drain).expect("drain status");
    assert_eq!(drain.pods_remaining, 0, "{drain:?}");
    let pods: Api<Pod> = Api::namespaced(world.env.client.clone(), &world.scope);
    let on_node = ListParams::default().fields(&format!("spec.nodeName={}", broken[0]));
    eventually("the broken node to be empty", Duration::from_secs(30), || async {
        pods.list(&on_node).await.ok()?.items.is_empty().then_some(())
    })
    .await
    .expect("every pod left the broken node");
    invariants.assert_hold(&broken, 1, Phase::Succeeded).await;
    world.end(controller).await;
}

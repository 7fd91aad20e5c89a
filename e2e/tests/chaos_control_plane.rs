//! Fault suite, the control plane itself failing under a drain: the API server killed and
//! restarted, and etcd frozen. Each test has a control plane of its own (these faults would break
//! every other test sharing it), and asserts the suite's invariants (see `chaos_support`).

mod chaos_support;

use std::time::Duration;

use chaos_support::{Invariants, World};
use gpu_sandbox::bench::actor::ControllerProcess;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, api::ListParams};

/// Deployments of these sizes on the broken node: ten evictions in a row for the largest, each
/// waiting for a replacement (PDB `maxUnavailable: 1`), and each evicted pod taking 3 s to
/// terminate, so the drain lasts long enough to be hit in the middle.
const SIZES: [i32; 3] = [10, 6, 4];

/// Waits until the drain of `node` is under way: some of its pods evicted (terminating), some
/// still to go. Read from the pods, not the record: the drain's progress is written at most once per
/// 5 s (`progress`), and these 20 pods leave in a few seconds.
async fn mid_drain(world: &World, node: &str) {
    let pods = Api::<Pod>::namespaced(world.env.client.clone(), &world.scope);
    let on_node = ListParams::default().fields(&format!("spec.nodeName={node}"));
    gpu_sandbox::bench::setup::eventually("the drain to be under way", Duration::from_secs(120), || async {
        let listed = pods.list(&on_node).await.ok()?.items;
        let evicted = listed
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_some())
            .count();
        (evicted >= 1 && evicted < listed.len()).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
}

/// A world of four nodes of its own (`scope`), the apps of `SIZES` on the first (the one that
/// breaks), the invariants watched, the default policy and one controller; returns once the
/// broken node's drain is under way: the world, the broken node, the invariants and the
/// controller.
async fn drain_under_way(scope: &str) -> (World, Vec<String>, Invariants, ControllerProcess) {
    let world = World::start(scope, 4).await;
    let broken = vec![world.nodes()[0].clone()];
    world.apps_on(&broken[0], "app", &SIZES, Some("3s")).await;
    let invariants = world.invariants().await;
    world.policy(serde_json::json!({})).await;
    let controller = world.controller("solo", false, None);
    world.break_nodes(&broken).await;
    mid_drain(&world, &broken[0]).await;
    (world, broken, invariants, controller)
}

#[tokio::test]
#[ignore = "fault suite (minutes, own control plane per test): make chaos"]
async fn an_api_server_restart_mid_drain_loses_nothing_and_breaks_no_budget() {
    let (mut world, broken, invariants, controller) = drain_under_way("api-restart").await;

    world
        .env
        .control_plane
        .restart("kube-apiserver", Duration::from_secs(3))
        .await
        .expect("restarting the API server");

    world
        .all_succeed_once(&broken, Duration::from_secs(240), &invariants)
        .await;
    world.end(controller).await;
}

#[tokio::test]
#[ignore = "fault suite (minutes, own control plane per test): make chaos"]
async fn etcd_frozen_for_fifteen_seconds_mid_drain_loses_nothing_and_breaks_no_budget() {
    let (mut world, broken, invariants, controller) = drain_under_way("etcd-pause").await;
    let command_lines = world
        .env
        .control_plane
        .command_lines()
        .expect("reading command lines");

    world.env.control_plane.pause("etcd").expect("pausing etcd");
    tokio::time::sleep(Duration::from_secs(15)).await;
    world.env.control_plane.resume("etcd").expect("resuming etcd");
    // kube-controller-manager and kube-scheduler lose their leader leases while etcd is frozen
    // and exit, as upstream does; a kubelet would start them again, so the test does. The
    // controller under test gets no such help.
    let mut revived = Vec::new();
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        revived.extend(
            world
                .env
                .control_plane
                .respawn_exited(&command_lines)
                .await
                .expect("restarting exited components"),
        );
    }
    eprintln!("restarted after the freeze, as a kubelet would: {revived:?}");

    world
        .all_succeed_once(&broken, Duration::from_secs(240), &invariants)
        .await;
    world.end(controller).await;
}

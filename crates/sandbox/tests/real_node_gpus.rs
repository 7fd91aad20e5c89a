//! NVIDIA's device plugin on a real node (issue 43, `docs/plans/real-node.md` S5): the plugin,
//! built from its pinned module and run from an image built here by a `DaemonSet` shaped as NVIDIA
//! ships it (its socket directory a `hostPath`, the driver root mounted at `/driver-root`), finds
//! the node's two GPUs through the NVML stand-in in the node's driver root and registers them with
//! the real kubelet: the Node advertises `nvidia.com/gpu: 2` and a pod asking for one GPU runs.
//! An XID 79 on GPU 1, written into the stand-in's scenario, makes the plugin report that GPU
//! unhealthy, and the kubelet takes it out of the allocatable count (capacity stays 2).
//!
//! `#[ignore]`d: it needs root and the built binaries (`make real-node-test` builds them and names
//! them in the environment: the real node's, `GPU_REMEDIATOR_DEVICE_PLUGIN` and
//! `GPU_REMEDIATOR_NVML_STANDIN`).

use std::time::Duration;

use gpu_sandbox::real_node::{
    chart,
    cluster::{Cluster, Wanted, built, eventually},
    nvidia::{Scenario, install_standin, plugin_image_tar},
};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{Api, api::PostParams};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root, the real node's built binaries, the device plugin and the stand-in: make real-node-test"]
async fn the_device_plugin_advertises_the_nodes_gpus_and_withdraws_the_one_an_xid_79_took_off_the_bus() {
    let plugin = built("GPU_REMEDIATOR_DEVICE_PLUGIN");
    let standin = built("GPU_REMEDIATOR_NVML_STANDIN");
    let cluster = Cluster::with_ready_nodes(&[Wanted {
        name: "real-2",
        index: 2,
        gpus: true,
    }])
    .await;
    let node = cluster.node();
    let scenario = Scenario::new("22222222", 2);
    install_standin(&standin, &node.driver_root(), &scenario).unwrap();

    let tar = plugin_image_tar(&plugin, &standin, cluster.control_plane.data_dir()).unwrap();
    node.import(&tar).await.unwrap();
    let client = cluster.control_plane.client();
    chart::install_device_plugin(&client).await;
    let nodes = Api::<Node>::all(client.clone());
    eventually(
        "the node's two GPUs advertised",
        Duration::from_secs(120),
        || async {
            chart::gpu_counts(&nodes, node.name())
                .await
                .filter(|counts| *counts == ("2".into(), "2".into()))
        },
    )
    .await;
    cluster.say("the device plugin registered: nvidia.com/gpu capacity 2, allocatable 2");

    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "trainer"},
        "spec": {
            "containers": [{"name": "pause", "image": gpu_sandbox::real_node::config::PAUSE_IMAGE,
                            "imagePullPolicy": "Never",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    eventually("the one-GPU pod Running", Duration::from_secs(60), || async {
        let pod = pods.get("trainer").await.ok()?;
        (pod.status?.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;
    cluster.say("a pod asking for one GPU scheduled and Running");

    scenario.with_xid(79, 1).write(&node.driver_root()).unwrap();
    eventually(
        "GPU 1 withdrawn after its XID 79",
        Duration::from_secs(60),
        || async {
            chart::gpu_counts(&nodes, node.name())
                .await
                .filter(|counts| *counts == ("2".into(), "1".into()))
        },
    )
    .await;
    cluster.say("XID 79 on GPU 1: nvidia.com/gpu capacity 2, allocatable 1");

    let plugins = Api::<Pod>::namespaced(client, "kube-system")
        .list(&kube::api::ListParams::default().labels("name=nvidia-device-plugin-ds"))
        .await
        .unwrap();
    let restarts: i32 = plugins
        .items
        .iter()
        .flat_map(|pod| {
            pod.status
                .iter()
                .flat_map(|s| s.container_statuses.iter().flatten())
        })
        .map(|status| status.restart_count)
        .sum();
    assert_eq!(plugins.items.len(), 1, "one plugin pod, on the real node");
    assert_eq!(
        restarts, 0,
        "the plugin never died (a missing NVML symbol kills it)"
    );
    cluster.stop().await;
}

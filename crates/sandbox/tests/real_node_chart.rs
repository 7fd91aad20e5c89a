//! The chart installed as shipped on real nodes (issue 43, `docs/plans/real-node.md` S6): two GPU
//! nodes (labelled `nvidia.com/gpu.present=true` at registration, the NVML stand-in in their
//! driver roots, which appear at `/run/nvidia/driver` inside each, as the GPU Operator puts it)
//! and a CPU-only node for the controller, whose required affinity keeps it off GPU nodes.
//! `helm install`, with the values a user of such a cluster sets (`shipped::chart_values`: our
//! images built here from their Dockerfiles, tag `sandbox`, `IfNotPresent`; the agent's host
//! library directory under the driver root), starts everything: nothing here runs as a process
//! what the chart runs as a pod.
//!
//! Shown: the agent's pods Running and Ready on both GPU nodes with the kubelet's projected,
//! pod-bound tokens, each setting its own node's `GpuHealthy` through the agent's admission
//! policy; the controller's two replicas on the CPU node, one of them holding the leader Lease
//! (a replica leads only once it has proven the API server enforces the fence admission policy);
//! and the agent's policy in force: a token bound to the agent's pod on one node is refused on the
//! other node's status.
//!
//! `#[ignore]`d: it needs root and the built binaries (`make real-node-test` builds them and names
//! them in the environment: the real node's, `GPU_REMEDIATOR_HELM`, the agent's and the
//! controller's binaries and `GPU_REMEDIATOR_NVML_STANDIN`).

use std::time::Duration;

use gpu_sandbox::{
    real_node::{
        chart::{self, Images, NAMESPACE, condition_status, node_of, pods_labelled},
        cluster::{Cluster, Wanted, eventually},
        config::DRIVER_ROOT_IN_NODE,
        nvidia::Scenario,
        shipped,
    },
    workload,
};
use k8s_openapi::api::{
    authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec},
    coordination::v1::Lease,
    core::v1::{Node, Pod, ServiceAccount},
};
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams, PostParams},
};

const GPU_NODES: [&str; 2] = ["real-gpu-1", "real-gpu-2"];
const CPU_NODE: &str = "real-cpu";

/// A token of the agent's service account bound to `pod`, as the kubelet projects it.
async fn token_bound_to(client: &kube::Client, pod: &Pod) -> String {
    let request = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(3600),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(pod.name_any()),
                uid: pod.metadata.uid.clone(),
            }),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    Api::<ServiceAccount>::namespaced(client.clone(), NAMESPACE)
        .create_token_request("gpu-health-agent", &PostParams::default(), &request)
        .await
        .expect("a token request")
        .status
        .expect("its status")
        .token
}

/// Builds our two images, imports the agent's into the GPU nodes (with the stand-in, serving two
/// healthy GPUs each) and the controller's into the CPU node, and installs the chart as a user does.
async fn install_as_shipped(cluster: &Cluster) {
    let images = Images::build(cluster.control_plane.data_dir(), false);
    for (node, serial) in [(GPU_NODES[0], "33333333"), (GPU_NODES[1], "44444444")] {
        chart::prepare_gpu_node(cluster.named(node), &images, &Scenario::new(serial, 2)).await;
    }
    cluster.named(CPU_NODE).import(&images.controller).await.unwrap();
    cluster.say("our images built from their Dockerfiles and imported; the stand-in on the GPU nodes");
    chart::helm_install(cluster, &shipped::chart_values()).await;
}

/// Waits for the agent's pods Running and Ready on both GPU nodes, each with the kubelet's
/// projected token and the host library directory under the driver root, and for each to set
/// its own node's `GpuHealthy`; returns the pods.
async fn agents_running(cluster: &Cluster, pods: &Api<Pod>) -> Vec<Pod> {
    let agents = eventually(
        "the agent Running and Ready on both GPU nodes",
        Duration::from_secs(180),
        || async {
            let agents = pods_labelled(pods, "gpu-health-agent").await;
            let mut on: Vec<&str> = agents
                .iter()
                .filter(|p| workload::is_ready(p))
                .map(node_of)
                .collect();
            on.sort_unstable();
            (on == GPU_NODES).then_some(agents)
        },
    )
    .await;
    cluster.say("the agent Running and Ready on both GPU nodes");
    for agent in &agents {
        let spec = agent.spec.as_ref().unwrap();
        let projected_token = spec.volumes.iter().flatten().any(|volume| {
            volume.projected.as_ref().is_some_and(|projected| {
                projected
                    .sources
                    .iter()
                    .flatten()
                    .any(|source| source.service_account_token.is_some())
            })
        });
        assert!(
            projected_token,
            "{}: no projected service-account token",
            agent.name_any()
        );
        let host_lib = serde_json::to_string(&spec.volumes).unwrap();
        assert!(
            host_lib.contains(&format!("{DRIVER_ROOT_IN_NODE}/usr/lib")),
            "{host_lib}"
        );
    }
    let nodes = Api::<Node>::all(cluster.control_plane.client());
    for node in GPU_NODES {
        eventually(
            &format!("{node}'s GpuHealthy set by its agent"),
            Duration::from_secs(60),
            || async {
                (condition_status(&nodes, node, "GpuHealthy").await.as_deref() == Some("True")).then_some(())
            },
        )
        .await;
    }
    cluster.say("each agent set its own node's GpuHealthy=True (NVML read through the stand-in)");
    agents
}

/// Waits for the controller's two replicas on the CPU node, one of them holding the leader Lease.
async fn a_leader_on_the_cpu_node(cluster: &Cluster, pods: &Api<Pod>) {
    let leases = Api::<Lease>::namespaced(cluster.control_plane.client(), NAMESPACE);
    let (controllers, holder) = eventually(
        "two controller replicas on the CPU node, one holding the leader Lease",
        Duration::from_secs(180),
        || async {
            let controllers = pods_labelled(pods, "gpu-remediator").await;
            let ready = controllers.iter().filter(|p| workload::is_ready(p)).count();
            let holder = leases
                .get_opt("gpu-remediator")
                .await
                .ok()??
                .spec?
                .holder_identity?;
            (controllers.len() == 2 && ready >= 1).then_some((controllers, holder))
        },
    )
    .await;
    for controller in &controllers {
        assert_eq!(
            node_of(controller),
            CPU_NODE,
            "{}: off the GPU nodes",
            controller.name_any()
        );
    }
    assert!(
        controllers.iter().any(|c| holder.contains(&c.name_any())),
        "the Lease's holder {holder} is one of the chart's replicas"
    );
    cluster.say(&format!(
        "both controller replicas on {CPU_NODE}; the leader: {holder}"
    ));
}

/// The agent's admission policy, installed by the chart, in force: a token bound to the agent's
/// pod on the first GPU node writes nothing on the second's status.
async fn the_agent_is_refused_on_another_node(cluster: &Cluster, agents: &[Pod]) {
    let client = cluster.control_plane.client();
    let first = agents.iter().find(|p| node_of(p) == GPU_NODES[0]).unwrap();
    let agent = cluster
        .control_plane
        .client_with_token(&token_bound_to(&client, first).await);
    let patch = serde_json::json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": GPU_NODES[1]},
        "status": {"conditions": [{"type": "GpuHealthy", "status": "False", "reason": "XID79",
            "message": "not this agent's node", "lastTransitionTime": "2026-01-01T00:00:00Z",
            "lastHeartbeatTime": "2026-01-01T00:00:00Z"}]},
    });
    let refused = Api::<Node>::all(agent)
        .patch_status(
            GPU_NODES[1],
            &PatchParams::apply("gpu-health-agent").force(),
            &Patch::Apply(&patch),
        )
        .await;
    match refused {
        Err(kube::Error::Api(status)) if status.code == 403 || status.code == 422 => assert!(
            status
                .message
                .contains("ValidatingAdmissionPolicy 'gpu-health-agent-own-node"),
            "refused by another than the agent's policy: {status:?}"
        ),
        other => panic!("the agent's token on another node's status: {other:?}"),
    }
    let nodes = Api::<Node>::all(client);
    assert_eq!(
        condition_status(&nodes, GPU_NODES[1], "GpuHealthy")
            .await
            .as_deref(),
        Some("True")
    );
    cluster.say("the agent's token refused on another node's status");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root, the real node's built binaries, helm, our binaries and the stand-in: make real-node-test"]
async fn the_chart_installed_as_shipped_runs_the_agent_on_gpu_nodes_and_a_fenced_leader_on_a_cpu_node() {
    let wanted = |name, index, gpus| Wanted { name, index, gpus };
    let cluster = Cluster::with_ready_nodes(&[
        wanted(GPU_NODES[0], 3, true),
        wanted(GPU_NODES[1], 4, true),
        wanted(CPU_NODE, 5, false),
    ])
    .await;
    install_as_shipped(&cluster).await;
    let pods = Api::<Pod>::namespaced(cluster.control_plane.client(), NAMESPACE);
    let agents = agents_running(&cluster, &pods).await;
    a_leader_on_the_cpu_node(&cluster, &pods).await;
    the_agent_is_refused_on_another_node(&cluster, &agents).await;
    cluster.stop().await;
}

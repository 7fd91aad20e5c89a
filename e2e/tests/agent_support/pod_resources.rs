//! A real agent reading the simulated kubelet's pod-resources API, and the assignment it publishes
//! (`gpuremediation.dev/gpu-pods`): what the GPU-scoped drain tests (`ladder_device_plugin`,
//! `ladder_mig`) share.

use std::{path::PathBuf, time::Duration};

use gpu_remediation_api::{
    constants::GPU_PODS_ANNOTATION,
    gpu_pods::{GPU_PODS_CLOCK_SLACK_SECONDS, GpuPods},
};
use gpu_sandbox::{Fleet, fleet::pod_resources::PodResourcesServer};
use k8s_openapi::{
    api::core::v1::{Node, Pod},
    jiff::SignedDuration,
};
use kube::{Api, Client, ResourceExt};
use serde_json::Value;

use super::{
    AgentProcess, Probe, agent_kubeconfig, kernel_log::write_kernel_log, scratch, wait_until_healthy,
    write_probe_file,
};
use crate::common::eventually;

/// A running agent with what it reads.
pub struct PodResourcesAgent {
    /// The simulated kubelet's pod-resources API it reads (served while this lives).
    pub server: PodResourcesServer,
    /// The agent.
    pub agent: AgentProcess,
    /// Its scenario file (write a new one to change what its probe reads).
    pub scenario: PathBuf,
    /// Its kernel log (`--kernel-log`).
    pub kernel_log: PathBuf,
}

/// Starts the real agent on `node` of `fleet` under `probe`, reading `scenario` (its probe and its
/// kernel log), the simulated kubelet's pod-resources API over a unix socket, and `extra` flags, in
/// a directory of its own (tests of one binary run side by side); returns once it reports the node
/// healthy.
pub async fn start(
    fleet: &Fleet,
    client: &Client,
    probe: Probe,
    node: &str,
    scenario: &Value,
    extra: &[&str],
) -> PodResourcesAgent {
    let dir = scratch(&format!("pod-resources-{node}"));
    let socket = dir.join("kubelet.sock");
    let server = fleet
        .serve_pod_resources(node, &socket)
        .expect("serving the pod-resources API");
    let scenario_path = dir.join("gpus.json");
    let kernel_log = dir.join("kmsg");
    write_kernel_log(&kernel_log, scenario);
    write_probe_file(&scenario_path, scenario);
    let kubeconfig = agent_kubeconfig(client, &dir).await;
    let kernel_log_flag = format!("--kernel-log={}", kernel_log.display());
    let mut flags = vec![
        "--pod-resources-socket",
        socket.to_str().unwrap(),
        &kernel_log_flag,
    ];
    flags.extend_from_slice(extra);
    let agent = AgentProcess::start(probe, node, &kubeconfig, &scenario_path, &dir, &flags).await;
    wait_until_healthy(client, node, &agent).await;
    PodResourcesAgent {
        server,
        agent,
        scenario: scenario_path,
        kernel_log,
    }
}

impl PodResourcesAgent {
    /// Writes `scenario` for its probe and its kernel log (the log first).
    pub fn write(&self, scenario: &Value) {
        write_kernel_log(&self.kernel_log, scenario);
        write_probe_file(&self.scenario, scenario);
    }
}

/// The assignment `node`'s agent publishes once it covers every one of `pods`: as many entries, read
/// past the newest pod's creation by the clock slack (a pod read within the slack of its creation
/// is covered once the agent stamps the assignment again, `GPU_PODS_SETTLE_SECONDS` later).
pub async fn assignment_covering(client: &Client, node: &str, pods: &[Pod]) -> GpuPods {
    let newest = pods
        .iter()
        .filter_map(|p| p.metadata.creation_timestamp.as_ref().map(|t| t.0))
        .max()
        .expect("pods");
    let covering = newest + SignedDuration::from_secs(GPU_PODS_CLOCK_SLACK_SECONDS);
    let nodes = Api::<Node>::all(client.clone());
    eventually(
        "the agent's assignment covering the pods",
        Duration::from_secs(30),
        || async {
            let node = nodes.get(node).await.ok()?;
            let assignment = GpuPods::parse(node.annotations().get(GPU_PODS_ANNOTATION)?).ok()?;
            (assignment.pods.len() == pods.len() && assignment.read_at.0 > covering).then_some(assignment)
        },
    )
    .await
}

//! Our chart installed on real nodes as a user installs it (`docs/plans/real-node.md` S6, S7): our
//! two images built from their Dockerfiles and NVIDIA's device plugin's ([`Images`]), a GPU node
//! prepared as the GPU Operator leaves one (the NVML stand-in in its driver root, the images in its
//! containerd: [`prepare_gpu_node`]; NVIDIA's device plugin: [`install_device_plugin`]), the
//! namespace from `manifests/namespace.yaml` and `helm install` with a user's values
//! ([`helm_install`]); and what the tests read back of it (the chart's pods by name, a pod's node,
//! a node condition's status, a node's GPU counts). Test harness: its steps panic with what failed.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use gpu_remediation_api::constants::GPU_RESOURCE;
use k8s_openapi::{
    api::{
        apps::v1::DaemonSet,
        core::v1::{Node, Pod},
    },
    apimachinery::pkg::api::resource::Quantity,
};
use kube::{
    Api,
    api::{ListParams, PostParams},
};

use super::{
    RealNode,
    cluster::{Cluster, built},
    config::DRIVER_ROOT_IN_NODE,
    nvidia::{self, Scenario, install_standin},
    shipped,
};
use crate::demo::install;

/// The namespace `manifests/namespace.yaml` creates and the chart installs into.
pub const NAMESPACE: &str = "gpu-remediation";

/// The repository's root (the chart, the manifests).
#[must_use]
pub fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The images the real nodes import, as OCI layout tars.
pub struct Images {
    /// The agent's, from `crates/agent/Dockerfile` around `GPU_REMEDIATOR_AGENT_BINARY`.
    pub agent: PathBuf,
    /// The controller's, from its Dockerfile around `GPU_REMEDIATOR_CONTROLLER_BINARY`.
    pub controller: PathBuf,
    /// NVIDIA's device plugin's (`GPU_REMEDIATOR_DEVICE_PLUGIN`), where asked for.
    pub plugin: Option<PathBuf>,
}

impl Images {
    /// Builds our two images under `dir`, and the device plugin's where `with_plugin`.
    #[must_use]
    pub fn build(dir: &Path, with_plugin: bool) -> Self {
        let ours = |shipped: shipped::Shipped| {
            shipped
                .image_tar(&built(shipped.binary_env), dir)
                .unwrap_or_else(|error| panic!("{error}"))
        };
        let plugin = with_plugin.then(|| {
            nvidia::plugin_image_tar(
                &built("GPU_REMEDIATOR_DEVICE_PLUGIN"),
                &built("GPU_REMEDIATOR_NVML_STANDIN"),
                dir,
            )
            .unwrap_or_else(|error| panic!("the device plugin's image: {error}"))
        });
        Self {
            agent: ours(shipped::AGENT),
            controller: ours(shipped::CONTROLLER),
            plugin,
        }
    }
}

/// Prepares `node` as a GPU node: the NVML stand-in in its driver root serving `scenario`, and the
/// agent's image (and the device plugin's, where built) in its containerd.
pub async fn prepare_gpu_node(node: &RealNode, images: &Images, scenario: &Scenario) {
    install_standin(
        &built("GPU_REMEDIATOR_NVML_STANDIN"),
        &node.driver_root(),
        scenario,
    )
    .unwrap_or_else(|error| panic!("the stand-in on {}: {error}", node.name()));
    for image in std::iter::once(&images.agent).chain(images.plugin.as_ref()) {
        node.import(image).await.unwrap_or_else(|error| panic!("{error}"));
    }
}

/// NVIDIA's device plugin's `DaemonSet` ([`nvidia::device_plugin_daemonset`]) in `kube-system`, on
/// every GPU node, over the driver root where the GPU Operator puts it
/// ([`DRIVER_ROOT_IN_NODE`]), as the GPU Operator installs it.
pub async fn install_device_plugin(client: &kube::Client) {
    Api::<DaemonSet>::namespaced(client.clone(), "kube-system")
        .create(
            &PostParams::default(),
            &nvidia::device_plugin_daemonset(Path::new(DRIVER_ROOT_IN_NODE)),
        )
        .await
        .unwrap_or_else(|error| panic!("NVIDIA's device plugin's DaemonSet: {error}"));
}

/// Creates the namespace as `manifests/namespace.yaml` says, then runs `helm install` of the chart
/// with `values` (written as a values file), as a user does.
pub async fn helm_install(cluster: &Cluster, values: &serde_json::Value) {
    let namespace = install::parse_documents(
        &std::fs::read_to_string(repository().join("manifests/namespace.yaml")).unwrap(),
    )
    .unwrap();
    install::apply(&cluster.control_plane.client(), &namespace)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let file = cluster.control_plane.data_dir().join("values.json");
    std::fs::write(&file, values.to_string()).unwrap();
    let output = std::process::Command::new(built("GPU_REMEDIATOR_HELM"))
        .arg("install")
        .arg("gpu-remediator")
        .arg(repository().join("charts/gpu-remediator"))
        .args(["--namespace", NAMESPACE, "--values"])
        .arg(&file)
        .arg("--kubeconfig")
        .arg(cluster.control_plane.kubeconfig_path())
        .output()
        .expect("running helm");
    assert!(
        output.status.success(),
        "helm install: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    cluster.say("helm install done");
}

/// The pods labelled `app.kubernetes.io/name=name` in `pods`' namespace.
pub async fn pods_labelled(pods: &Api<Pod>, name: &str) -> Vec<Pod> {
    pods.list(&ListParams::default().labels(&format!("app.kubernetes.io/name={name}")))
        .await
        .map(|list| list.items)
        .unwrap_or_default()
}

/// The node `pod` is bound to ("" before it is scheduled).
#[must_use]
pub fn node_of(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or("")
}

/// The node's `nvidia.com/gpu` capacity and allocatable count, as the device plugin registered
/// them.
pub async fn gpu_counts(nodes: &Api<Node>, node: &str) -> Option<(String, String)> {
    let status = nodes.get(node).await.ok()?.status?;
    let count = |list: Option<BTreeMap<String, Quantity>>| Some(list?.get(GPU_RESOURCE)?.0.clone());
    Some((count(status.capacity)?, count(status.allocatable)?))
}

/// The status of the node's condition `type_`, where it has one.
pub async fn condition_status(nodes: &Api<Node>, node: &str, type_: &str) -> Option<String> {
    let node = nodes.get(node).await.ok()?;
    node.status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.status)
}

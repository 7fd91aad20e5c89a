//! Simulated GPU boards for the hardware ledger: the inventory and failed-GPUs annotations the
//! agent publishes on its node (`gpuremediation.dev/gpu-inventory`, `gpuremediation.dev/failed-gpus`),
//! written here for simulated nodes, so a test can move a board from one node to another, fail
//! it, and register a node that joins carrying it.

use gpu_remediation_api::constants::{
    FAILED_GPUS_ANNOTATION, GPU_FIRST_SEEN_ANNOTATION, GPU_INVENTORY_ANNOTATION, HARDWARE_UNCHECKED_TAINT_KEY,
};
use k8s_openapi::api::core::v1::{Node, NodeSpec, Taint};
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
};
use serde_json::json;

use crate::fault::{self, SetGpuConditionError};

/// One simulated GPU board.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimGpu {
    /// NVML index in its current node.
    pub index: u32,
    /// `GPU-...`.
    pub uuid: String,
    /// The board serial.
    pub serial: String,
}

impl SimGpu {
    /// A board with a made-up UUID derived from its serial.
    #[must_use]
    pub fn new(index: u32, serial: &str) -> Self {
        Self {
            index,
            uuid: format!("GPU-{serial}-0000-0000-0000-sandbox"),
            serial: serial.to_owned(),
        }
    }
}

/// The inventory annotation's text for `gpus`, as the agent writes it.
#[must_use]
pub fn inventory_text(gpus: &[SimGpu]) -> String {
    let list: Vec<_> = gpus
        .iter()
        .map(|g| {
            json!({"index": g.index, "uuid": g.uuid, "serial": g.serial,
                   "pciBusId": format!("00000000:{:02X}:00.0", g.index + 1), "name": "NVIDIA H100 80GB HBM3"})
        })
        .collect();
    serde_json::Value::Array(list).to_string()
}

/// Makes `node` carry `gpus` as a node of an installed fleet does: the agent's inventory, and the
/// controller's first-seen stamp of each serial, as written when it first saw them at `seen` (whole
/// seconds, as the controller stamps), so that a controller started over it has nothing to stamp.
pub fn installed_with(node: &mut Node, gpus: &[SimGpu], seen: jiff::Timestamp) {
    let seen = jiff::Timestamp::from_second(seen.as_second())
        .unwrap_or(seen)
        .to_string();
    let stamps: serde_json::Map<String, serde_json::Value> =
        gpus.iter().map(|g| (g.serial.clone(), json!(seen))).collect();
    let annotations = node.annotations_mut();
    annotations.insert(GPU_INVENTORY_ANNOTATION.to_owned(), inventory_text(gpus));
    annotations.insert(
        GPU_FIRST_SEEN_ANNOTATION.to_owned(),
        serde_json::Value::Object(stamps).to_string(),
    );
}

/// Makes `node` register carrying `gpus`, with the `gpuremediation.dev/hardware-unchecked` taint a
/// GPU node registers with (for `Fleet::add_nodes_prepared`).
pub fn joining_with(node: &mut Node, gpus: &[SimGpu]) {
    node.annotations_mut()
        .insert(GPU_INVENTORY_ANNOTATION.to_owned(), inventory_text(gpus));
    node.spec
        .get_or_insert_with(NodeSpec::default)
        .taints
        .get_or_insert_with(Vec::new)
        .push(Taint {
            key: HARDWARE_UNCHECKED_TAINT_KEY.to_owned(),
            effect: "NoSchedule".to_owned(),
            ..Taint::default()
        });
}

/// Publishes `gpus` as `node`'s inventory (a board moved in or out), as the agent would.
///
/// # Errors
/// When the patch is refused.
pub async fn set_inventory(client: &Client, node: &str, gpus: &[SimGpu]) -> Result<(), kube::Error> {
    let patch = json!({"metadata": {"annotations": {GPU_INVENTORY_ANNOTATION: inventory_text(gpus)}}});
    Api::<Node>::all(client.clone())
        .patch(node, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map(|_| ())
}

/// Why failing a board failed.
#[derive(Debug, thiserror::Error)]
pub enum FailGpuError {
    /// The failed-GPUs annotation was refused.
    #[error("annotating node {node}'s failed GPUs: {source}")]
    Annotate {
        /// The node.
        node: String,
        /// The API error.
        source: kube::Error,
    },
    /// The condition was refused.
    #[error(transparent)]
    Condition(#[from] SetGpuConditionError),
}

/// Fails board `gpu` in `node` with `reason` (`XID79`): the failed-GPUs annotation naming it, then
/// `GpuHealthy=False`, as the agent publishes them.
///
/// # Errors
/// When either write is refused.
pub async fn fail_gpu(client: &Client, node: &str, gpu: &SimGpu, reason: &str) -> Result<(), FailGpuError> {
    name_failed_gpu(client, node, gpu, reason).await?;
    let message = format!("GPU {} (serial {}) has fallen off the bus", gpu.index, gpu.serial);
    fault::set_gpu_condition(client, node, "False", reason, &message).await?;
    Ok(())
}

/// Names board `gpu` of `node` as failed with `reason` in the failed-GPUs annotation alone (the
/// condition left to the caller).
///
/// # Errors
/// When the annotation is refused.
pub async fn name_failed_gpu(
    client: &Client,
    node: &str,
    gpu: &SimGpu,
    reason: &str,
) -> Result<(), FailGpuError> {
    let failed = json!([{"uuid": gpu.uuid, "serial": gpu.serial, "index": gpu.index, "reason": reason}]);
    let patch = json!({"metadata": {"annotations": {FAILED_GPUS_ANNOTATION: failed.to_string()}}});
    Api::<Node>::all(client.clone())
        .patch(node, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map_err(|source| FailGpuError::Annotate {
            node: node.to_owned(),
            source,
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_installed_node_carries_its_inventory_and_a_whole_second_stamp_per_serial() {
        let gpus = crate::dra::node_gpus("gpu-7", 2);
        let mut node = Node::default();
        let seen: jiff::Timestamp = "2026-12-06T07:30:05.250Z".parse().unwrap();

        installed_with(&mut node, &gpus, seen);

        let annotations = node.annotations();
        assert_eq!(annotations[GPU_INVENTORY_ANNOTATION], inventory_text(&gpus));
        // What the controller reads back (`trust::first_seen_of`): every serial, at whole seconds.
        let stamps: std::collections::BTreeMap<String, jiff::Timestamp> =
            serde_json::from_str(&annotations[GPU_FIRST_SEEN_ANNOTATION]).unwrap();
        let whole: jiff::Timestamp = "2026-12-06T07:30:05Z".parse().unwrap();
        assert_eq!(
            stamps,
            [("gpu-7-0".to_owned(), whole), ("gpu-7-1".to_owned(), whole)].into()
        );
    }
}

//! What a simulated GPU node looks like: the Node object a kubelet would register, its status,
//! and its heartbeat Lease. Pure builders, no IO.

use std::collections::BTreeMap;

use gpu_remediation_api::constants::{GPU_COUNT_LABEL, GPU_PRESENT_LABEL, GPU_PRODUCT_LABEL, GPU_RESOURCE};
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use serde_json::{Value, json};

/// Label on every node of a fleet, naming the fleet (its name prefix), so a test selects only
/// its own nodes even when other tests' nodes share the cluster.
pub const FLEET_LABEL: &str = "gpuremediation.dev/sim-fleet";

/// The namespace where kubelets keep their heartbeat Leases.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// How a fleet's nodes are shaped.
#[derive(Debug, Clone)]
pub struct NodeShape {
    /// The fleet's name, also the node name prefix.
    pub fleet: String,
    /// `nvidia.com/gpu` capacity and the `nvidia.com/gpu.count` label.
    pub gpus: u32,
    /// The `nvidia.com/gpu.product` label.
    pub product: String,
    /// Extra labels on every node.
    pub labels: BTreeMap<String, String>,
}

/// The name of node `index` of fleet `fleet`.
#[must_use]
pub fn node_name(fleet: &str, index: usize) -> String {
    format!("{fleet}-{index:04}")
}

/// A made-up but stable internal IP for node `index`.
#[must_use]
pub fn node_ip(index: usize) -> String {
    format!(
        "10.{}.{}.{}",
        64 + (index >> 16) % 64,
        (index >> 8) % 256,
        index % 256
    )
}

/// The labels every node of `shape` carries: the fleet's, the GPU ones, then the shape's own
/// (which win).
#[must_use]
pub fn shape_labels(shape: &NodeShape) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([
        (GPU_PRESENT_LABEL.to_owned(), "true".to_owned()),
        (GPU_PRODUCT_LABEL.to_owned(), shape.product.clone()),
        (GPU_COUNT_LABEL.to_owned(), shape.gpus.to_string()),
        (FLEET_LABEL.to_owned(), shape.fleet.clone()),
    ]);
    labels.extend(shape.labels.clone());
    labels
}

/// The labels node `name` of `shape` registers with: the host's, then [`shape_labels`].
#[must_use]
pub fn node_labels(shape: &NodeShape, name: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([
        ("kubernetes.io/hostname".to_owned(), name.to_owned()),
        ("kubernetes.io/os".to_owned(), "linux".to_owned()),
        ("kubernetes.io/arch".to_owned(), "amd64".to_owned()),
    ]);
    labels.extend(shape_labels(shape));
    labels
}

/// The Node as a kubelet registers it: labels, capacity, `Ready=True`.
///
/// # Panics
/// Never: the JSON is a valid Node by construction.
#[must_use]
pub fn simulated_node(shape: &NodeShape, index: usize, now: Timestamp) -> Node {
    let name = node_name(&shape.fleet, index);
    let labels = node_labels(shape, &name);
    let resources = json!({
        "cpu": "96",
        "memory": "1Ti",
        "pods": "110",
        "ephemeral-storage": "2Ti",
        GPU_RESOURCE: shape.gpus.to_string(),
    });
    serde_json::from_value(json!({
        "metadata": { "name": name, "labels": labels },
        "spec": { "providerID": format!("gpu-sandbox://{name}") },
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": base_conditions(now),
            "addresses": [
                { "type": "InternalIP", "address": node_ip(index) },
                { "type": "Hostname", "address": name },
            ],
            "daemonEndpoints": { "kubeletEndpoint": { "Port": 10250 } },
            "nodeInfo": {
                "machineID": format!("{index:032x}"),
                // Unique per fleet and node: the hardware ledger tracks hosts by system UUID.
                "systemUUID": format!("{:08x}-0000-0000-0000-{index:012x}", fleet_hash(&shape.fleet)),
                "bootID": format!("boot-{index}"),
                "kernelVersion": "6.8.0-gpu-sandbox",
                "osImage": "gpu-sandbox",
                "containerRuntimeVersion": "sim://1.0",
                "kubeletVersion": "v1.35.4",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    }))
    .expect("a simulated node is a valid Node")
}

/// 32 bits of FNV-1a of the fleet's name.
fn fleet_hash(fleet: &str) -> u32 {
    fleet.bytes().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

/// The conditions a healthy kubelet reports.
fn base_conditions(now: Timestamp) -> Value {
    let condition = |kind: &str, status: &str, reason: &str| {
        json!({
            "type": kind,
            "status": status,
            "reason": reason,
            "message": format!("simulated kubelet: {reason}"),
            "lastHeartbeatTime": now.to_string(),
            "lastTransitionTime": now.to_string(),
        })
    };
    json!([
        condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
        condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
        condition("PIDPressure", "False", "KubeletHasSufficientPID"),
        condition("Ready", "True", "KubeletReady"),
    ])
}

/// A strategic merge patch for node status that sets `Ready=True` now, as a kubelet does when it
/// comes back (conditions merge by type, so other writers' conditions stay).
#[must_use]
pub fn ready_status_patch(now: Timestamp) -> Value {
    json!({ "status": { "conditions": base_conditions(now) } })
}

/// The node's heartbeat Lease, owned by the node so it goes when the node goes.
///
/// # Panics
/// Never: the JSON is a valid Lease by construction.
#[must_use]
pub fn heartbeat_lease(node: &str, node_uid: &str, duration_seconds: i32, now: Timestamp) -> Lease {
    serde_json::from_value(json!({
        "metadata": {
            "name": node,
            "namespace": NODE_LEASE_NAMESPACE,
            "ownerReferences": [{
                "apiVersion": "v1",
                "kind": "Node",
                "name": node,
                "uid": node_uid,
            }],
        },
        "spec": {
            "holderIdentity": node,
            "leaseDurationSeconds": duration_seconds,
            "renewTime": micro_time(now),
        },
    }))
    .expect("a heartbeat lease is a valid Lease")
}

/// A merge patch that renews a heartbeat Lease.
#[must_use]
pub fn renew_patch(now: Timestamp) -> Value {
    json!({ "spec": { "renewTime": micro_time(now) } })
}

/// `MicroTime` wire format: RFC 3339 with exactly six fractional digits.
fn micro_time(now: Timestamp) -> String {
    now.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> NodeShape {
        NodeShape {
            fleet: "gpu".to_owned(),
            gpus: 8,
            product: "NVIDIA-H100-80GB-HBM3".to_owned(),
            labels: BTreeMap::from([("zone".to_owned(), "a".to_owned())]),
        }
    }

    #[test]
    fn a_simulated_node_carries_gpu_labels_capacity_and_a_ready_condition() {
        let node = simulated_node(&shape(), 7, Timestamp::UNIX_EPOCH);
        let labels = node.metadata.labels.unwrap();
        assert_eq!(node.metadata.name.as_deref(), Some("gpu-0007"));
        assert_eq!(labels[GPU_PRESENT_LABEL], "true");
        assert_eq!(labels[GPU_COUNT_LABEL], "8");
        assert_eq!(labels[GPU_PRODUCT_LABEL], "NVIDIA-H100-80GB-HBM3");
        assert_eq!(labels[FLEET_LABEL], "gpu");
        assert_eq!(labels["zone"], "a");
        let status = node.status.unwrap();
        assert_eq!(status.capacity.unwrap()[GPU_RESOURCE].0, "8");
        let ready = status
            .conditions
            .unwrap()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(ready.status, "True");
    }

    #[test]
    fn node_ips_differ_between_nodes() {
        assert_ne!(node_ip(1), node_ip(257));
        assert_ne!(node_ip(0), node_ip(65_536));
    }

    #[test]
    fn lease_renew_times_have_microsecond_precision() {
        let at: Timestamp = "2026-01-02T03:04:05.123456789Z".parse().unwrap();
        assert_eq!(
            renew_patch(at)["spec"]["renewTime"],
            "2026-01-02T03:04:05.123456Z"
        );
    }
}

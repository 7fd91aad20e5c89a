//! What the sandbox gives Karpenter for one fleet: a KWOK instance type shaped like the fleet's
//! nodes (GPUs, CPU, memory), a `KWOKNodeClass`, and a `NodePool` whose nodes carry the fleet's
//! label and GPU labels. Pure builders, no IO.

use std::time::Duration;

use gpu_remediation_api::constants::GPU_RESOURCE;
use serde_json::{Value, json};

use crate::fleet::node::{NodeShape, shape_labels};

/// The KWOK provider's node class group.
pub const NODE_CLASS_GROUP: &str = "karpenter.kwok.sh";
/// The zone every offering is in (the KWOK provider's own test zone name).
pub const ZONE: &str = "test-zone-a";

/// The instance type name for a fleet's shape: `gpu-<n>x-<product>` (lower case).
#[must_use]
pub fn instance_type_name(shape: &NodeShape) -> String {
    format!("gpu-{}x-{}", shape.gpus, shape.product.to_lowercase())
}

/// The KWOK provider's instance-types file (`INSTANCE_TYPES_FILE_PATH`): one on-demand type with
/// the fleet's node resources, so Karpenter launches nodes shaped like the fleet's.
#[must_use]
pub fn instance_types(shape: &NodeShape) -> Value {
    json!([{
        "name": instance_type_name(shape),
        "offerings": [{
            "Price": 98.32,
            "Available": true,
            "Requirements": [
                {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
                {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [ZONE]},
            ],
        }],
        "architecture": "amd64",
        "operatingSystems": ["linux"],
        "resources": {
            "cpu": "96",
            "memory": "1Ti",
            "ephemeral-storage": "2Ti",
            "pods": "110",
            GPU_RESOURCE: shape.gpus.to_string(),
        },
    }])
}

/// The instance-types file for several fleets: each distinct shape's type once (fleets of one
/// shape share it).
#[must_use]
pub fn instance_types_of(shapes: &[&NodeShape]) -> Value {
    let mut types: Vec<Value> = Vec::new();
    for shape in shapes {
        for instance in instance_types(shape).as_array().into_iter().flatten() {
            if !types.iter().any(|t| t["name"] == instance["name"]) {
                types.push(instance.clone());
            }
        }
    }
    Value::Array(types)
}

/// The fleet's `KWOKNodeClass` (named after the fleet).
#[must_use]
pub fn node_class(shape: &NodeShape) -> Value {
    json!({
        "apiVersion": format!("{NODE_CLASS_GROUP}/v1alpha1"),
        "kind": "KWOKNodeClass",
        "metadata": {"name": shape.fleet},
        "spec": {},
    })
}

/// The status that marks a node class usable. Nothing in the KWOK provider reconciles its node
/// class's status (Karpenter's own KWOK tests write it too), and a `NodePool` whose class is not
/// `Ready=True` launches nothing.
#[must_use]
pub fn node_class_ready_status(now: &str) -> Value {
    json!({"status": {"conditions": [{
        "type": "Ready",
        "status": "True",
        "reason": "Ready",
        "message": "",
        "lastTransitionTime": now,
        "observedGeneration": 1,
    }]}})
}

/// How Karpenter may disrupt the pool's nodes on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disruption {
    /// `WhenEmpty` or `WhenEmptyOrUnderutilized`.
    pub consolidation_policy: &'static str,
    /// `consolidateAfter`.
    pub consolidate_after: Duration,
}

impl Default for Disruption {
    /// Empty nodes consolidated after 5 seconds: Karpenter acts on a node our drain emptied.
    fn default() -> Self {
        Self {
            consolidation_policy: "WhenEmpty",
            consolidate_after: Duration::from_secs(5),
        }
    }
}

/// The fleet's `NodePool` (named after the fleet): its nodes carry the fleet's label and the GPU
/// labels a GPU node has, and are of the fleet's instance type.
#[must_use]
pub fn node_pool(shape: &NodeShape, disruption: &Disruption) -> Value {
    let labels = shape_labels(shape);
    json!({
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": shape.fleet},
        "spec": {
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeClassRef": {"group": NODE_CLASS_GROUP, "kind": "KWOKNodeClass", "name": shape.fleet},
                    "requirements": [{
                        "key": "node.kubernetes.io/instance-type",
                        "operator": "In",
                        "values": [instance_type_name(shape)],
                    }],
                    "expireAfter": "Never",
                },
            },
            "disruption": {
                "consolidationPolicy": disruption.consolidation_policy,
                "consolidateAfter": format!("{}s", disruption.consolidate_after.as_secs()),
            },
        },
    })
}

#[cfg(test)]
mod tests {
    use gpu_remediation_api::constants::{GPU_COUNT_LABEL, GPU_PRODUCT_LABEL};

    use crate::fleet::FLEET_LABEL;
    use std::collections::BTreeMap;

    use super::*;

    fn shape() -> NodeShape {
        NodeShape {
            fleet: "kp-1".to_owned(),
            gpus: 8,
            product: "NVIDIA-H100-80GB-HBM3".to_owned(),
            labels: BTreeMap::from([("team".to_owned(), "ml".to_owned())]),
        }
    }

    #[test]
    fn the_instance_type_offers_the_fleets_gpus() {
        let types = instance_types(&shape());
        assert_eq!(types[0]["name"], "gpu-8x-nvidia-h100-80gb-hbm3");
        assert_eq!(types[0]["resources"][GPU_RESOURCE], "8");
    }

    #[test]
    fn fleets_of_one_shape_share_one_instance_type() {
        let (a, mut b) = (shape(), shape());
        b.fleet = "kp-2".to_owned();
        let mut c = shape();
        c.gpus = 4;
        let types = instance_types_of(&[&a, &b, &c]);
        let names: Vec<&str> = types
            .as_array()
            .expect("a list")
            .iter()
            .filter_map(|t| t["name"].as_str())
            .collect();
        assert_eq!(
            names,
            ["gpu-8x-nvidia-h100-80gb-hbm3", "gpu-4x-nvidia-h100-80gb-hbm3"]
        );
    }

    #[test]
    fn pool_nodes_carry_the_fleet_label_and_gpu_labels_and_only_the_fleets_instance_type() {
        let pool = node_pool(&shape(), &Disruption::default());
        let labels = &pool["spec"]["template"]["metadata"]["labels"];
        assert_eq!(labels[FLEET_LABEL], "kp-1");
        assert_eq!(labels[GPU_COUNT_LABEL], "8");
        assert_eq!(labels[GPU_PRODUCT_LABEL], "NVIDIA-H100-80GB-HBM3");
        assert_eq!(labels["team"], "ml");
        let requirement = &pool["spec"]["template"]["spec"]["requirements"][0];
        assert_eq!(requirement["values"][0], "gpu-8x-nvidia-h100-80gb-hbm3");
        assert_eq!(pool["spec"]["template"]["spec"]["nodeClassRef"]["name"], "kp-1");
        assert_eq!(pool["spec"]["disruption"]["consolidateAfter"], "5s");
    }
}

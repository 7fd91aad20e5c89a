//! What of each watched object the controller keeps and what of it wakes a pass: the pruning
//! applied as objects arrive (so memory grows with what decisions read, not with what kubelets and
//! other controllers write) and the fingerprints compared to decide whether a change matters.
//!
//! Pure: no IO.

use std::{
    collections::hash_map::DefaultHasher,
    hash::{Hash, Hasher},
};

use gpu_remediation_api::{GpuRemediation, GpuRemediationPolicy};
use k8s_openapi::api::{core::v1::Node, policy::v1::PodDisruptionBudget};
use kube::ResourceExt;
use serde::Serialize;

/// Keeps what decisions read of a Node: metadata without managedFields and with only our own
/// annotations, `unschedulable`, taints, and conditions without heartbeat times.
///
/// No decision reads another controller's annotation, and every node carries some: the TTL
/// controller's on every node, on real hosts also the attach-detach one and Node Feature
/// Discovery's, which run to kilobytes. Leaving them out is safe for writes: an edit over a cached
/// node is sent as a merge patch of what it changed (`node_patch`), and a replace is made over a
/// fresh read.
pub fn prune_node(node: &mut Node) {
    // `None`, not an emptied Vec, which would keep the decoded entries' buffer.
    node.metadata.managed_fields = None;
    if let Some(annotations) = node.metadata.annotations.as_mut() {
        annotations.retain(|key, _| is_ours(key));
        if annotations.is_empty() {
            node.metadata.annotations = None;
        }
    }
    if let Some(spec) = node.spec.as_mut() {
        spec.config_source = None;
        spec.pod_cidrs = None;
        spec.pod_cidr = None;
    }
    if let Some(taints) = node.spec.as_mut().and_then(|spec| spec.taints.as_mut()) {
        taints.shrink_to_fit();
    }
    if let Some(status) = node.status.as_mut() {
        // A decoded list keeps the room its growth made (five conditions in room for eight: about
        // 400 bytes a node, 8% of a bare node in the cache); what is kept is trimmed to its length.
        let conditions = status.conditions.take().map(|mut conditions| {
            for condition in &mut conditions {
                condition.last_heartbeat_time = None;
            }
            conditions.shrink_to_fit();
            conditions
        });
        // The system UUID identifies the host for the hardware ledger, the boot ID proves a
        // ladder's reboot, and `safety.suspect` may name the kernel, kubelet, OS image or runtime
        // (`fleet::suspects`, `nodeInfo.*`); the rest of nodeInfo goes.
        let node_info = status
            .node_info
            .take()
            .map(|info| k8s_openapi::api::core::v1::NodeSystemInfo {
                system_uuid: info.system_uuid,
                boot_id: info.boot_id,
                kernel_version: info.kernel_version,
                kubelet_version: info.kubelet_version,
                os_image: info.os_image,
                container_runtime_version: info.container_runtime_version,
                ..Default::default()
            });
        *status = k8s_openapi::api::core::v1::NodeStatus {
            conditions,
            node_info,
            ..Default::default()
        };
    }
}

// `status.disruptedPods` stays: it names the pods whose eviction the budget has already granted
// (a blocker explains a refusal with it), and it holds entries only while evictions settle.
pub(super) fn prune_budget(budget: &mut PodDisruptionBudget) {
    budget.metadata.managed_fields = None;
    budget.metadata.annotations = None;
}

pub(crate) fn hash_of<T: Serialize>(value: &T) -> u64 {
    let mut hasher = DefaultHasher::new();
    // Serialising our own in-memory values cannot fail.
    serde_json::to_vec(value).unwrap_or_default().hash(&mut hasher);
    hasher.finish()
}

/// `value` hashed with the standard hasher (for keys kept hashed to spare their strings).
pub(crate) fn hash_one(value: &(impl Hash + ?Sized)) -> u64 {
    let mut hasher = DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

pub(super) fn node_fingerprint(node: &Node) -> u64 {
    let conditions = node.status.as_ref().and_then(|s| s.conditions.as_ref());
    let conditions: Vec<_> = conditions
        .into_iter()
        .flatten()
        .map(|c| {
            (
                &c.type_,
                &c.status,
                &c.reason,
                c.last_transition_time.as_ref().map(|t| t.0),
            )
        })
        .collect();
    // The annotations are ours only (`prune_node` left out the others): some controllers write
    // theirs on every node at once (the TTL controller re-annotates the whole fleet when its size
    // crosses a boundary), which must not start passes.
    hash_of(&(
        node.labels(),
        node.annotations(),
        node.spec.as_ref().map(|s| (&s.unschedulable, &s.taints)),
        conditions,
        node.metadata.deletion_timestamp.as_ref().map(|t| t.0),
    ))
}

/// Whether an annotation, label or taint key is in our group (`gpuremediation.dev/…`).
#[must_use]
pub fn is_ours(key: &str) -> bool {
    key.strip_prefix(gpu_remediation_api::GROUP)
        .is_some_and(|rest| rest.starts_with('/'))
}

pub(super) fn policy_fingerprint(policy: &GpuRemediationPolicy) -> u64 {
    hash_of(&(
        &policy.spec,
        policy.labels(),
        policy.metadata.deletion_timestamp.as_ref().map(|t| t.0),
    ))
}

pub(super) fn remediation_fingerprint(remediation: &GpuRemediation) -> u64 {
    hash_of(&(
        remediation.annotations(),
        remediation.finalizers(),
        remediation.metadata.deletion_timestamp.as_ref().map(|t| t.0),
        remediation.status.as_ref().map(|s| s.phase),
    ))
}

pub(super) fn budget_fingerprint(budget: &PodDisruptionBudget) -> u64 {
    hash_of(&(
        &budget.spec,
        budget.status.as_ref().map(|s| {
            (
                s.disruptions_allowed,
                s.current_healthy,
                s.desired_healthy,
                s.observed_generation,
            )
        }),
    ))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::core::v1::{NodeCondition, NodeStatus},
        apimachinery::pkg::apis::meta::v1::Time,
    };

    use super::*;

    #[test]
    fn heartbeats_do_not_change_a_nodes_fingerprint_but_conditions_do() {
        let condition = |status: &str, heartbeat: i64| NodeCondition {
            type_: "GpuHealthy".into(),
            status: status.into(),
            last_heartbeat_time: Some(Time(jiff::Timestamp::from_second(heartbeat).unwrap())),
            ..NodeCondition::default()
        };
        let node = |status: &str, heartbeat: i64| {
            let mut n = Node {
                status: Some(NodeStatus {
                    conditions: Some(vec![condition(status, heartbeat)]),
                    ..NodeStatus::default()
                }),
                ..Node::default()
            };
            prune_node(&mut n);
            n
        };
        assert_eq!(
            node_fingerprint(&node("True", 1)),
            node_fingerprint(&node("True", 2))
        );
        assert_ne!(
            node_fingerprint(&node("True", 1)),
            node_fingerprint(&node("False", 1))
        );
    }

    #[test]
    fn a_cached_node_keeps_our_annotations_only_and_no_managed_fields() {
        let mut node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "gpu-1",
                "annotations": {
                    "node.alpha.kubernetes.io/ttl": "0",
                    "nfd.node.kubernetes.io/feature-labels": "cpu-cpuid.AVX512F,cpu-cpuid.AMXTILE",
                    "gpuremediation.dev/cordoned-by": "gpu-1-r",
                },
                "managedFields": [{"manager": "kubelet", "operation": "Update"}],
            },
        }))
        .expect("a node");
        prune_node(&mut node);
        assert_eq!(
            node.metadata.annotations,
            Some([("gpuremediation.dev/cordoned-by".to_owned(), "gpu-1-r".to_owned())].into())
        );
        assert_eq!(node.metadata.managed_fields, None);

        node.metadata.annotations =
            Some([("node.alpha.kubernetes.io/ttl".to_owned(), "0".to_owned())].into());
        prune_node(&mut node);
        assert_eq!(node.metadata.annotations, None, "none of ours: no map at all");
    }

    #[test]
    fn a_cached_nodes_lists_keep_no_room_to_grow() {
        let conditions: Vec<_> = [
            "Ready",
            "MemoryPressure",
            "DiskPressure",
            "PIDPressure",
            "GpuHealthy",
        ]
        .map(|type_| serde_json::json!({"type": type_, "status": "False"}))
        .into();
        let taints: Vec<_> = ["a", "b", "c"]
            .map(|key| serde_json::json!({"key": key, "effect": "NoSchedule"}))
            .into();
        // Decoded from text, as the watch decodes: a list grows as its items come.
        let mut node: Node = serde_json::from_str(
            &serde_json::json!({
                "metadata": {"name": "gpu-1"},
                "spec": {"taints": taints},
                "status": {"conditions": conditions},
            })
            .to_string(),
        )
        .expect("a node");
        let spare = |node: &Node| {
            let conditions = node
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .expect("conditions");
            let taints = node
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .expect("taints");
            (
                conditions.capacity() - conditions.len(),
                taints.capacity() - taints.len(),
            )
        };
        assert_ne!(spare(&node), (0, 0), "decoded lists grow by doubling");
        prune_node(&mut node);
        assert_eq!(spare(&node), (0, 0));
    }

    #[test]
    fn another_controllers_annotation_does_not_change_a_nodes_fingerprint_but_ours_do() {
        // As the watch delivers it: pruned.
        let node = |annotations: &[(&str, &str)]| {
            let mut n = Node::default();
            n.metadata.annotations = Some(
                annotations
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            );
            prune_node(&mut n);
            n
        };
        let plain = node_fingerprint(&node(&[]));
        assert_eq!(
            node_fingerprint(&node(&[("node.alpha.kubernetes.io/ttl", "30")])),
            plain
        );
        assert_eq!(
            node_fingerprint(&node(&[("gpuremediation.devx/other", "x")])),
            plain,
            "a group that only starts like ours"
        );
        assert_ne!(
            node_fingerprint(&node(&[("gpuremediation.dev/cordoned-by", "r")])),
            plain
        );
    }
}

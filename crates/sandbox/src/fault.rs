//! Fault injection, as a GPU agent (or the hardware) would cause it: set the `GpuHealthy` node
//! condition, flap it, drop a GPU from the node's capacity. Stopping a node's heartbeat needs the
//! fleet's own tasks: see [`crate::Fleet::stop_heartbeat`].

use std::time::Duration;

use gpu_remediation_api::constants::{GPU_RESOURCE, gpu_reasons, node_conditions};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};

/// Failure to change a node's `GpuHealthy` condition.
#[derive(Debug, thiserror::Error)]
pub enum SetGpuConditionError {
    /// The node could not be read.
    #[error("reading node {node}: {source}")]
    ReadNode {
        /// The node.
        node: String,
        /// The API error.
        source: kube::Error,
    },
    /// The condition could not be written.
    #[error("writing the {condition} condition of node {node}: {source}")]
    WriteCondition {
        /// The node.
        node: String,
        /// The condition type.
        condition: &'static str,
        /// The API error.
        source: kube::Error,
    },
}

/// Failure to drop a GPU from a node's capacity.
#[derive(Debug, thiserror::Error)]
pub enum DropGpuError {
    /// The node could not be read.
    #[error("reading node {node}: {source}")]
    ReadNode {
        /// The node.
        node: String,
        /// The API error.
        source: kube::Error,
    },
    /// The node has no GPU left to drop (or no readable `nvidia.com/gpu` capacity).
    #[error("node {node} has no GPU capacity to drop (capacity: {capacity:?})")]
    NoGpu {
        /// The node.
        node: String,
        /// The capacity found.
        capacity: Option<String>,
    },
    /// The new capacity could not be written.
    #[error("writing the GPU capacity of node {node}: {source}")]
    WriteCapacity {
        /// The node.
        node: String,
        /// The API error.
        source: kube::Error,
    },
}

/// The strategic merge patch that sets one node condition, keeping its transition time when the
/// status does not change (as a kubelet or agent does). Other conditions are untouched: node
/// conditions merge by `type`.
#[must_use]
pub fn condition_patch(
    existing: Option<&NodeCondition>,
    condition_type: &str,
    status: &str,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> Value {
    let transition = match existing {
        Some(c) if c.status == status => c
            .last_transition_time
            .as_ref()
            .map_or_else(|| now.to_string(), |t| t.0.to_string()),
        _ => now.to_string(),
    };
    json!({
        "status": {
            "conditions": [{
                "type": condition_type,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": now.to_string(),
                "lastTransitionTime": transition,
            }]
        }
    })
}

/// Sets node `node`'s `GpuHealthy` condition, e.g. `("False", "XID79", "GPU fell off the bus")`.
pub async fn set_gpu_condition(
    client: &Client,
    node: &str,
    status: &str,
    reason: &str,
    message: &str,
) -> Result<(), SetGpuConditionError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let current = nodes
        .get(node)
        .await
        .map_err(|source| SetGpuConditionError::ReadNode {
            node: node.to_owned(),
            source,
        })?;
    let existing = current
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == node_conditions::GPU_HEALTHY));
    let patch = condition_patch(
        existing,
        node_conditions::GPU_HEALTHY,
        status,
        reason,
        message,
        Timestamp::now(),
    );
    nodes
        .patch_status(node, &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .map(|_| ())
        .map_err(|source| SetGpuConditionError::WriteCondition {
            node: node.to_owned(),
            condition: node_conditions::GPU_HEALTHY,
            source,
        })
}

/// Sets `GpuHealthy=False` with `reason`, then `True` (`GpusHealthy`), `cycles` times, holding
/// each state for `hold`. Ends healthy.
pub async fn flap(
    client: &Client,
    node: &str,
    reason: &str,
    cycles: usize,
    hold: Duration,
) -> Result<(), SetGpuConditionError> {
    for cycle in 1..=cycles {
        let message = format!("simulated flap {cycle}/{cycles}");
        set_gpu_condition(client, node, "False", reason, &message).await?;
        tokio::time::sleep(hold).await;
        set_gpu_condition(client, node, "True", gpu_reasons::HEALTHY, &message).await?;
        if cycle < cycles {
            tokio::time::sleep(hold).await;
        }
    }
    Ok(())
}

/// Removes one GPU from node `node`'s `nvidia.com/gpu` capacity and allocatable, as when a GPU falls
/// off the bus and the device plugin re-registers; the `nvidia.com/gpu.count` label (the expected
/// count) stays. Returns the GPUs left.
pub async fn drop_gpu(client: &Client, node: &str) -> Result<u32, DropGpuError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let current = nodes.get(node).await.map_err(|source| DropGpuError::ReadNode {
        node: node.to_owned(),
        source,
    })?;
    let capacity = current
        .status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get(GPU_RESOURCE))
        .map(|q| q.0.clone());
    let left = match capacity.as_deref().map(str::parse::<u32>) {
        Some(Ok(n)) if n > 0 => n - 1,
        _ => {
            return Err(DropGpuError::NoGpu {
                node: node.to_owned(),
                capacity,
            });
        }
    };
    let patch = json!({
        "status": {
            "capacity": { GPU_RESOURCE: left.to_string() },
            "allocatable": { GPU_RESOURCE: left.to_string() },
        }
    });
    nodes
        .patch_status(node, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map_err(|source| DropGpuError::WriteCapacity {
            node: node.to_owned(),
            source,
        })?;
    Ok(left)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn healthy_since(at: Timestamp) -> NodeCondition {
        NodeCondition {
            type_: "GpuHealthy".to_owned(),
            status: "True".to_owned(),
            last_transition_time: Some(Time(at)),
            ..NodeCondition::default()
        }
    }

    #[test]
    fn a_changed_status_moves_the_transition_time() {
        let now: Timestamp = "2026-01-01T00:10:00Z".parse().unwrap();
        let before = healthy_since("2026-01-01T00:00:00Z".parse().unwrap());
        let patch = condition_patch(Some(&before), "GpuHealthy", "False", "XID79", "m", now);
        let condition = &patch["status"]["conditions"][0];
        assert_eq!(condition["lastTransitionTime"], "2026-01-01T00:10:00Z");
        assert_eq!(condition["reason"], "XID79");
    }

    #[test]
    fn an_unchanged_status_keeps_the_transition_time() {
        let now: Timestamp = "2026-01-01T00:10:00Z".parse().unwrap();
        let before = healthy_since("2026-01-01T00:00:00Z".parse().unwrap());
        let patch = condition_patch(Some(&before), "GpuHealthy", "True", "GpusHealthy", "m", now);
        let condition = &patch["status"]["conditions"][0];
        assert_eq!(condition["lastTransitionTime"], "2026-01-01T00:00:00Z");
        assert_eq!(condition["lastHeartbeatTime"], "2026-01-01T00:10:00Z");
    }

    #[test]
    fn a_first_condition_starts_now() {
        let now: Timestamp = "2026-01-01T00:10:00Z".parse().unwrap();
        let patch = condition_patch(None, "GpuHealthy", "False", "XID79", "m", now);
        assert_eq!(
            patch["status"]["conditions"][0]["lastTransitionTime"],
            "2026-01-01T00:10:00Z"
        );
    }
}

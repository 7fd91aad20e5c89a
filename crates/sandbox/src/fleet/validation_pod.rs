//! The simulated outcome of a validation Job's pod (the controller's `spec.validation`, e.g. a
//! `dcgmi diag -r 2` in a real cluster): no diagnostic runs here. The simulated kubelet finishes a
//! pod labelled `gpuremediation.dev/validation=true` from its node's simulated GPU state: a node
//! carrying [`SIM_GPU_FAULT_ANNOTATION`] (a GPU still broken, whatever its conditions say) fails
//! it, a healed one passes it. Pure: the status patch for a node.

use gpu_remediation_api::validation::POD_LABEL;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{Value, json};

/// The node annotation that says a simulated GPU is broken in its hardware: set by a simulated
/// XID (`repair::xid`), removed only by a repair that heals the hardware. The agent's report (the
/// `GpuHealthy` condition) may say healthy while it is there, as after a reboot that resets the
/// agent's latch but not the GPU.
pub const SIM_GPU_FAULT_ANNOTATION: &str = "gpuremediation.dev/sim-gpu-fault";

/// Whether `pod` is a validation Job's pod.
#[must_use]
pub fn is_validation(pod: &Pod) -> bool {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(POD_LABEL))
        .is_some_and(|v| v == "true")
}

/// The status patch that finishes a validation pod on `node` (read just now): `Failed` with exit
/// code 1 when the node's simulated GPU is still broken, else `Succeeded`.
#[must_use]
pub fn finished_patch(pod: &Pod, node: Option<&Node>, now: Timestamp) -> Value {
    let fault = node
        .and_then(|n| n.metadata.annotations.as_ref())
        .and_then(|a| a.get(SIM_GPU_FAULT_ANNOTATION));
    let (phase, code, reason, message) = match (node, fault) {
        (None, _) => (
            "Failed",
            1,
            "Error",
            "simulated diagnostic: the node is gone".to_owned(),
        ),
        (Some(_), Some(fault)) => (
            "Failed",
            1,
            "Error",
            format!("simulated diagnostic failed: GPU still broken ({fault})"),
        ),
        (Some(_), None) => (
            "Succeeded",
            0,
            "Completed",
            "simulated diagnostic passed".to_owned(),
        ),
    };
    let now = now.to_string();
    let containers: Vec<Value> = pod
        .spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .map(|c| {
            let state = json!({"terminated": {"exitCode": code, "reason": reason, "message": message,
                                              "startedAt": now, "finishedAt": now}});
            super::pod_status::container_status(c, false, &state)
        })
        .collect();
    json!({"status": {"phase": phase, "message": message, "startTime": now, "containerStatuses": containers}})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "v", "labels": {POD_LABEL: "true"}},
            "spec": {"containers": [{"name": "diag", "image": "dcgm"}]}}))
        .unwrap()
    }

    fn node(fault: Option<&str>) -> Node {
        let mut node = Node::default();
        if let Some(fault) = fault {
            node.metadata.annotations =
                Some([(SIM_GPU_FAULT_ANNOTATION.to_owned(), fault.to_owned())].into());
        }
        node
    }

    #[test]
    fn a_still_broken_gpu_fails_the_diagnostic_and_a_healed_one_passes_it() {
        assert!(is_validation(&pod()));
        assert!(!is_validation(&Pod::default()));
        let now = Timestamp::UNIX_EPOCH;
        let failed = finished_patch(&pod(), Some(&node(Some("XID79 on GPU-3"))), now);
        assert_eq!(failed["status"]["phase"], "Failed");
        assert_eq!(
            failed["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"],
            1
        );
        let passed = finished_patch(&pod(), Some(&node(None)), now);
        assert_eq!(passed["status"]["phase"], "Succeeded");
        assert_eq!(finished_patch(&pod(), None, now)["status"]["phase"], "Failed");
    }
}

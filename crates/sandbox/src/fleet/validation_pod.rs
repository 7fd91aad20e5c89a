//! The simulated outcome of a validation Job's pod (the controller's `spec.validation`, e.g. a
//! `dcgmi diag -r 2` in a real cluster): no diagnostic runs here. The simulated kubelet finishes a
//! pod labelled `gpuremediation.dev/validation=true` from its node's simulated GPU state: a node
//! carrying [`SIM_GPU_FAULT_ANNOTATION`] (a GPU still broken, whatever its conditions say) fails
//! it, a healed one passes it. Pure: the status patch for a node.
//!
//! A diagnostics Job's pod (`gpuremediation.dev/diagnostics=true`, the controller's
//! `spec.diagnostics`, e.g. `nvidia-bug-report.sh`) is finished as a bundle collected, unless its
//! template carries [`SIM_HANG_ANNOTATION`]: then it runs and never ends, as a bug report stuck on
//! a wedged GPU does.

use gpu_remediation_api::{diagnostics::POD_LABEL as DIAGNOSTICS_LABEL, validation::POD_LABEL};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{Value, json};

/// The node annotation that says a simulated GPU is broken in its hardware: set by a simulated
/// XID (`repair::xid`), removed only by a repair that heals the hardware. The agent's report (the
/// `GpuHealthy` condition) may say healthy while it is there, as after a reboot that resets the
/// agent's latch but not the GPU.
pub const SIM_GPU_FAULT_ANNOTATION: &str = "gpuremediation.dev/sim-gpu-fault";

/// A pod annotation (`true`) that keeps a diagnostics pod running forever.
pub const SIM_HANG_ANNOTATION: &str = "gpuremediation.dev/sim-hang";

fn labelled(pod: &Pod, label: &str) -> bool {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(label))
        .is_some_and(|v| v == "true")
}

/// Whether `pod` is a validation Job's pod.
#[must_use]
pub fn is_validation(pod: &Pod) -> bool {
    labelled(pod, POD_LABEL)
}

/// Whether the simulated kubelet finishes `pod` itself ([`finished_patch`]): a validation pod, or
/// a diagnostics pod not told to hang.
#[must_use]
pub fn finishes(pod: &Pod) -> bool {
    let hangs = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SIM_HANG_ANNOTATION))
        .is_some_and(|v| v == "true");
    is_validation(pod) || (labelled(pod, DIAGNOSTICS_LABEL) && !hangs)
}

/// The status patch that finishes a validation pod on `node` (read just now): `Failed` with exit
/// code 1 when the node's simulated GPU is still broken, else `Succeeded`. A diagnostics pod
/// succeeds on any node that stands (a bug report is collected from a broken GPU too).
#[must_use]
pub fn finished_patch(pod: &Pod, node: Option<&Node>, now: Timestamp) -> Value {
    let fault = node
        .and_then(|n| n.metadata.annotations.as_ref())
        .and_then(|a| a.get(SIM_GPU_FAULT_ANNOTATION));
    let fault = fault.filter(|_| is_validation(pod));
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
        (Some(_), None) if is_validation(pod) => (
            "Succeeded",
            0,
            "Completed",
            "simulated diagnostic passed".to_owned(),
        ),
        (Some(_), None) => (
            "Succeeded",
            0,
            "Completed",
            "simulated bug report collected".to_owned(),
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

    #[test]
    fn a_diagnostics_pod_collects_on_a_broken_gpu_and_hangs_when_told_to() {
        let mut diagnostics: Pod = serde_json::from_value(json!({"metadata": {"name": "d",
            "labels": {DIAGNOSTICS_LABEL: "true"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}))
        .unwrap();
        assert!(finishes(&diagnostics) && !is_validation(&diagnostics));
        let collected = finished_patch(
            &diagnostics,
            Some(&node(Some("XID79 on GPU-3"))),
            Timestamp::UNIX_EPOCH,
        );
        assert_eq!(collected["status"]["phase"], "Succeeded");
        diagnostics.metadata.annotations = Some([(SIM_HANG_ANNOTATION.to_owned(), "true".to_owned())].into());
        assert!(!finishes(&diagnostics), "a hanging one runs as any pod");
        assert!(!finishes(&Pod::default()));
    }
}

//! A node whose drain a budget holds back: three nodes, two pods pinned to the first behind a
//! budget that allows no disruption, so a remediation of that node stays in `Draining` (or meets
//! its drain timeout) until the test moves it on.

use std::time::Duration;

use gpu_remediation_api::{GpuRemediation, Phase};
use gpu_sandbox::workload::{Budget, Workload};

use super::{RunningController, Scenario};

/// The scenario, its broken-to-be node (the first) and the `pinned` workload on it: two pods
/// behind `minAvailable: 2`, the second node spare for them.
pub async fn pinned_behind_a_closed_budget() -> (Scenario, String, Workload) {
    let s = Scenario::new(3).await;
    let nodes = s.nodes();
    let (broken, spares) = (nodes[0].clone(), nodes[1..2].to_vec());
    let app = s
        .protected_workload("pinned", &broken, &spares, 2, &Budget::min_available(2))
        .await;
    (s, broken, app)
}

impl Scenario {
    /// Creates the policy (`spec` over the base, see [`Self::policy`]), starts its controller and
    /// breaks the GPU of `broken`; returns the controller.
    pub async fn enforce_and_break(&self, spec: serde_json::Value, broken: &str) -> RunningController {
        self.policy(spec).await;
        let controller = RunningController::start(&self.scope).await;
        self.break_gpu(broken).await;
        controller
    }
}

impl Scenario {
    /// Enforces a `Replace` policy (`maxUnhealthy: 100%`) on the pinned node `broken`, breaks its
    /// GPU and waits (up to 30 s) until its remediation drains, held by the closed budget: the
    /// controller and the remediation in `Draining`.
    pub async fn replace_held_in_draining(&self, broken: &str) -> (RunningController, GpuRemediation) {
        let controller = self
            .enforce_and_break(
                serde_json::json!({"action": "Replace", "safety": {"maxUnhealthy": "100%"}}),
                broken,
            )
            .await;
        let draining = self
            .wait_phase(broken, Phase::Draining, Duration::from_secs(30))
            .await;
        (controller, draining)
    }
}

//! One 8-GPU node under a ladder policy whose steps are objects of the stand-in kind
//! (`common::REBOOT_CRD`), carried out by the sandbox's repair operator, with the controller
//! running: what the ladder and validation tests share.

use std::time::Duration;

use gpu_remediation_api::{
    GpuRemediation, Phase,
    ladder::{Rung, StepOutcome},
};
use gpu_sandbox::{
    hardware::{SimGpu, set_inventory},
    repair::{self, Behaviour, Repairer},
};
use k8s_openapi::api::core::v1::Node;
use kube::{api::ApiResource, core::GroupVersionKind};
use serde_json::json;

use super::{RunningController, Scenario};
use crate::common::{self, eventually};

/// The stand-in kind the step objects are made of (`common::REBOOT_CRD`; `super::reboots` reads
/// them).
pub fn step_kind() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "e2e.gpuremediation.dev",
        "v1",
        "FakeReboot",
    ))
}

/// The template of an object of the stand-in kind asking for `action` on the node.
pub fn step_template(s: &Scenario, action: &str) -> serde_json::Value {
    json!({
        "apiVersion": "e2e.gpuremediation.dev/v1",
        "kind": "FakeReboot",
        "metadata": {"namespace": s.namespace},
        "spec": {"node": "{{nodeName}}", "action": action},
    })
}

/// A ladder step: `ResetGpu` and `Reboot` are carried out by an object of the stand-in kind,
/// `Replace` and `HandOff` by the controller itself.
pub fn step(s: &Scenario, rung: &str, timeout: Option<&str>) -> serde_json::Value {
    let mut step = json!({"step": rung});
    if let Some(timeout) = timeout {
        step["timeout"] = json!(timeout);
    }
    if matches!(rung, "ResetGpu" | "Reboot") {
        step["template"] = step_template(s, rung);
    }
    step
}

/// An 8-GPU inventory on `node`, as the agent publishes it; returns GPU 3.
pub async fn eight_gpus(s: &Scenario, node: &str) -> SimGpu {
    let gpus: Vec<SimGpu> = (0..8)
        .map(|i| SimGpu::new(i, &format!("{}-{i}", s.fleet.name())))
        .collect();
    set_inventory(&s.client, node, &gpus).await.unwrap();
    gpus[3].clone()
}

/// Installs the stand-in kind and the policy `spec` merged over no unhealthy limit; starts the
/// repair operator under `behaviour`.
pub async fn setup(s: &Scenario, spec: serde_json::Value, behaviour: Behaviour) -> Repairer {
    common::install_crd(&s.client, common::REBOOT_CRD).await;
    let mut full = json!({"safety": {"maxUnhealthy": "100%"}});
    for (key, value) in spec.as_object().into_iter().flatten() {
        full[key] = value.clone();
    }
    s.policy(full).await;
    Repairer::start(s.client.clone(), &step_kind(), &s.namespace, behaviour)
}

/// Each step of the remediation and its outcome.
pub fn steps(r: &GpuRemediation) -> Vec<(Rung, Option<StepOutcome>)> {
    r.status
        .as_ref()
        .map(|s| s.steps.iter().map(|st| (st.step, st.outcome)).collect())
        .unwrap_or_default()
}

/// The node's boot ID.
pub fn boot_id(node: &Node) -> String {
    node.status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.boot_id.clone())
        .unwrap_or_default()
}

/// One 8-GPU node under a ladder policy, with the repair operator and the controller running.
pub struct LadderRun {
    pub s: Scenario,
    /// The node that faults.
    pub node: String,
    /// Its GPU 3, the one that faults.
    pub gpu: SimGpu,
    /// The node's boot ID before anything happened.
    pub boot_before: String,
    pub repairer: Repairer,
    pub controller: RunningController,
}

impl LadderRun {
    /// The first node of `s` under the policy `spec` (merged as [`setup`] does), the repairer
    /// under `behaviour`.
    pub async fn start(s: Scenario, spec: serde_json::Value, behaviour: Behaviour) -> Self {
        let node = s.nodes()[0].clone();
        let repairer = setup(&s, spec, behaviour).await;
        let gpu = eight_gpus(&s, &node).await;
        let boot_before = boot_id(&s.node(&node).await);
        let controller = RunningController::start(&s.scope).await;
        Self {
            s,
            node,
            gpu,
            boot_before,
            repairer,
            controller,
        }
    }

    /// What `pick` finds in the node's remediation, once it finds something (within 40 s).
    pub async fn wait_for<T>(&self, what: &str, pick: impl Fn(GpuRemediation) -> Option<T>) -> T {
        eventually(what, Duration::from_secs(40), || async {
            pick(self.s.remediation_of(&self.node).await?)
        })
        .await
    }

    /// GPU 3 reports XID `code`, whose catalog entry recommends `action`.
    pub async fn xid(&self, code: u32, action: &str) {
        repair::xid(&self.s.client, &self.node, &self.gpu, code, action)
            .await
            .unwrap();
    }

    /// The node's remediation once in `phase` (within `within`).
    pub async fn wait_phase_within(&self, phase: Phase, within: Duration) -> GpuRemediation {
        self.s.wait_phase(&self.node, phase, within).await
    }

    /// The node's remediation once in `phase` (within 60 s).
    pub async fn wait_phase(&self, phase: Phase) -> GpuRemediation {
        self.wait_phase_within(phase, Duration::from_secs(60)).await
    }

    /// Waits until the node is gone (within 20 s).
    pub async fn node_deleted(&self) {
        eventually("the node deleted", Duration::from_secs(20), || async {
            self.s.node_is_gone(&self.node).await.then_some(())
        })
        .await;
    }
}

//! The demo's second story: the escalation ladder on one node, each step proven by validation. A
//! policy with a ladder (`ResetGpu`, `Reboot`, `Replace`) and a validation Job (`dcgmi diag`)
//! governs one healthy node; a `RESET_GPU`-class XID hits its GPU 3; the controller (the real
//! process, under its own RBAC plus a role for the repair kind) cordons and drains it and creates
//! a `DemoGpuReset` object, which the sandbox's repair operator carries out. The GPU answers again
//! and the node reports healthy, but its hardware is still broken: the validation Job fails (the
//! simulated kubelet fails a validation pod on a broken GPU), the node stays cordoned and the
//! ladder climbs to `Reboot`, which heals it; validation passes and the node is released, without
//! a replacement.

use std::time::{Duration, Instant};

use gpu_remediation_api::{GpuRemediation, GpuRemediationPolicy, Phase};
use kube::{
    Api, Client,
    api::{ApiResource, PostParams},
    core::GroupVersionKind,
};
use serde_json::{Value, json};

use super::stage::{Clock, NAMESPACE, RunDemoError, SERVICE_ACCOUNT, step};
use crate::{
    hardware::{SimGpu, set_inventory},
    repair::{self, Behaviour, Repairer},
};

/// The ladder policy's name.
pub const POLICY: &str = "demo-repair-before-replace";
const GROUP: &str = "demo.gpuremediation.dev";
const KIND: &str = "DemoGpuReset";
const PLURAL: &str = "demogpuresets";

/// What the ladder story shows, for the summary.
#[derive(Debug, Clone, Default)]
pub struct LadderFigures {
    /// The node.
    pub node: String,
    /// The steps taken, with their outcomes.
    pub steps: Vec<String>,
    /// From the fault to `Succeeded`.
    pub took: Option<Duration>,
}

/// The kind a reset step is carried out by, and the controller's permission to create it.
fn objects() -> Vec<Value> {
    vec![
        json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{PLURAL}.{GROUP}")},
            "spec": {"group": GROUP, "scope": "Namespaced",
                "names": {"plural": PLURAL, "singular": "demogpureset", "kind": KIND, "listKind": "DemoGpuResetList"},
                "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]},
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "gpu-remediator-demo-gpu-reset"},
            "rules": [{"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["get", "list", "watch", "create", "delete"]}],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "gpu-remediator-demo-gpu-reset"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "gpu-remediator-demo-gpu-reset"},
            "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}],
        }),
    ]
}

fn policy(node: &str) -> Result<GpuRemediationPolicy, serde_json::Error> {
    serde_json::from_value(json!({
        "apiVersion": "gpuremediation.dev/v1alpha1", "kind": "GpuRemediationPolicy",
        "metadata": {"name": POLICY},
        "spec": {
            "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}},
            "priority": 10,
            "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "2s"}],
            "ladder": [
                {"step": "ResetGpu", "timeout": "2m", "template": {
                    "apiVersion": format!("{GROUP}/v1"), "kind": KIND,
                    "metadata": {"namespace": NAMESPACE},
                    "spec": {"node": "{{nodeName}}", "action": "ResetGpu", "gpu": "{{gpuUUID}}"}}},
                {"step": "Reboot", "timeout": "2m", "template": {
                    "apiVersion": format!("{GROUP}/v1"), "kind": KIND,
                    "metadata": {"namespace": NAMESPACE},
                    "spec": {"node": "{{nodeName}}", "action": "Reboot"}}},
                {"step": "Replace", "timeout": "10m"},
            ],
            // The shipped sample's `dcgmi diag -r 2` (config/validation/dcgm-diag.yaml): nothing
            // runs it here, the simulated kubelet decides from the node's simulated GPU.
            "validation": {
                "job": {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"namespace": NAMESPACE},
                        "spec": {"template": {"spec": {"containers": [{"name": "dcgm-diag",
                            "image": "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04",
                            "command": ["dcgmi", "diag", "-r", "2"]}]}}}},
                "timeout": "1m",
            },
            "release": {"healthyFor": "5s"},
            "safety": {"maxUnhealthy": "100%"},
        },
    }))
}

/// The story on a fresh node of `fleet` (no workload uses it), told as it goes.
pub(super) async fn story(admin: &Client, fleet: &crate::Fleet, clock: &Clock) -> Result<(), RunDemoError> {
    let fresh = fleet
        .add_nodes(1)
        .await
        .map_err(step("adding a node for the ladder"))?;
    let climbed = run(admin, &fresh[0], clock).await?;
    clock.say(&format!(
        "ladder on {}: {} in {:.1}s; validation failed after the reset (the GPU still broken) and passed after the reboot; the node was released, nothing replaced",
        climbed.node,
        climbed.steps.join(", "),
        climbed.took.unwrap_or_default().as_secs_f64()
    ));
    Ok(())
}

/// Runs the ladder story on `node`.
async fn run(admin: &Client, node: &str, clock: &Clock) -> Result<LadderFigures, RunDemoError> {
    super::install::apply(admin, &objects())
        .await
        .map_err(step("installing the reset kind"))?;
    let resource = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, "v1", KIND), PLURAL);
    // The kind is served a moment after its CRD is applied.
    let resets: Api<kube::api::DynamicObject> = Api::namespaced_with(admin.clone(), NAMESPACE, &resource);
    let served = Instant::now() + Duration::from_secs(30);
    while resets.list(&kube::api::ListParams::default()).await.is_err() {
        if Instant::now() > served {
            return Err(RunDemoError::NotSucceeded(format!("{KIND} was never served")));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A reset that makes the GPU answer again but leaves its hardware broken; a reboot heals it.
    let behaviour = Behaviour {
        reset_heals_hardware: false,
        ..Behaviour::default()
    };
    let _repairer = Repairer::start(admin.clone(), &resource, NAMESPACE, behaviour);
    let policy = policy(node).map_err(step("building the ladder policy"))?;
    Api::<GpuRemediationPolicy>::all(admin.clone())
        .create(&PostParams::default(), &policy)
        .await
        .map_err(step("creating the ladder policy"))?;
    let gpus: Vec<SimGpu> = (0..8).map(|i| SimGpu::new(i, &format!("{node}-{i}"))).collect();
    set_inventory(admin, node, &gpus)
        .await
        .map_err(step("publishing the GPU inventory"))?;
    clock.say(&format!(
        "LADDER: policy {POLICY} governs {node}: ResetGpu -> Reboot (each a {KIND} object) -> Replace, each judged by evidence and proven by a validation Job (dcgmi diag) before the node is released"
    ));
    let fault_at = Instant::now();
    repair::xid(admin, node, &gpus[3], 48, "RESET_GPU")
        .await
        .map_err(step("reporting the XID"))?;
    clock.say(&format!(
        "FAULT on {node}: XID 48 on GPU 3 ({}); the catalog recommends RESET_GPU",
        gpus[3].uuid
    ));
    follow(admin, node, fault_at, clock).await
}

async fn follow(
    admin: &Client,
    node: &str,
    fault_at: Instant,
    clock: &Clock,
) -> Result<LadderFigures, RunDemoError> {
    let remediations = Api::<GpuRemediation>::all(admin.clone());
    let mut said = String::new();
    let mut told = 0;
    let deadline = fault_at + Duration::from_secs(120);
    while Instant::now() < deadline {
        let found = remediations
            .list(&kube::api::ListParams::default())
            .await
            .map_err(step("listing remediations"))?
            .items
            .into_iter()
            .find(|r| r.spec.node_name == node && r.spec.policy_name == POLICY);
        if let Some(status) = found.and_then(|r| r.status) {
            let now = format!(
                "{} {}",
                status.phase,
                status.current_step.map(|s| s.to_string()).unwrap_or_default()
            );
            if now != said {
                clock.say(&format!(
                    "ladder {node}: {now}: {}",
                    status.message.clone().unwrap_or_default()
                ));
                said = now;
            }
            for step in status.steps.iter().skip(told) {
                let Some(outcome) = step.outcome else { break };
                let proof = step.evidence.validation.as_ref().map_or_else(String::new, |v| {
                    format!(
                        "; validation Job {}/{} {}",
                        v.namespace,
                        v.job,
                        v.outcome
                            .map_or_else(|| "running".to_owned(), |o| format!("{o:?}"))
                    )
                });
                let failed_validation = step.evidence.validation.as_ref().is_some_and(|v| {
                    v.outcome
                        .is_some_and(|o| o != gpu_remediation_api::validation::ValidationOutcome::Passed)
                });
                let verdict = if failed_validation {
                    "VALIDATION FAILED, climbing"
                } else {
                    "step ended"
                };
                clock.say(&format!(
                    "ladder {node}: {verdict}: {} {outcome:?}{proof}: {}",
                    step.step,
                    step.message.clone().unwrap_or_default()
                ));
                told += 1;
            }
            if status.phase.is_terminal() {
                let steps: Vec<String> = status
                    .steps
                    .iter()
                    .map(|s| {
                        let outcome = s.outcome.map_or_else(|| "open".to_owned(), |o| format!("{o:?}"));
                        format!("{} {outcome}", s.step)
                    })
                    .collect();
                if status.phase != Phase::Succeeded {
                    return Err(RunDemoError::NotSucceeded(format!(
                        "the ladder ended {}",
                        status.phase
                    )));
                }
                return Ok(LadderFigures {
                    node: node.to_owned(),
                    steps,
                    took: Some(fault_at.elapsed()),
                });
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(RunDemoError::NotSucceeded(
        "the ladder did not finish within 120s".to_owned(),
    ))
}

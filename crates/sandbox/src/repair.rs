//! A simulated repair operator for the escalation ladder's e2e tests and the demo: it plays the
//! controllers behind a ladder step's object (a GPU reset Job, `NVSentinel`'s GPU reset resource, a
//! Self Node Remediation), just far enough to be judged by evidence.
//!
//! It polls (every 200ms) the objects of one namespaced kind in one namespace. An object with
//! `spec.node` and `spec.action` (`ResetGpu` or `Reboot`) and no `status` yet is carried out:
//! - `ResetGpu`: the reset GPU answers again, as the agent reports it after a reset (its file probe
//!   reads the GPU healthy): `GpuHealthy=True` (`GpusHealthy`) and no `failed-gpus` annotation;
//!   the GPU inventory is left as it is (the same UUIDs answer). Where a real agent runs on the
//!   node ([`Heal::ClearAnnotation`]), the operator only writes the agent's clear annotation, as the
//!   reset Job sample does, and the agent reports the rest;
//! - `Reboot`: the node boots again: a new `status.nodeInfo.bootID`, `Ready=True`, and the agent
//!   (whose latch does not survive a boot) reports `GpuHealthy=True`;
//!
//! then the object reports `Succeeded=True`. [`Behaviour`] makes a repair that does not help (the
//! fault stays), a reboot that reports done without booting (the boot ID stays), or an object that
//! reports failure, so the ladder's escalations can be shown.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use gpu_remediation_api::constants::{CLEAR_ANNOTATION, FAILED_GPUS_ANNOTATION};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams},
};
use serde_json::json;
use tokio::task::JoinHandle;

use crate::{fault, fleet::validation_pod::SIM_GPU_FAULT_ANNOTATION};

/// What the simulated operator does with the next objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(
    clippy::struct_excessive_bools,
    reason = "each flag is one independent way a simulated repair can go"
)]
pub struct Behaviour {
    /// A reset brings the GPU back healthy.
    pub reset_heals: bool,
    /// A reboot really boots the node (a new boot ID).
    pub reboot_boots: bool,
    /// A reboot brings the GPUs back healthy.
    pub reboot_heals: bool,
    /// The object reports `Failed` instead of `Succeeded` (nothing is done).
    pub fails: bool,
    /// How long a repair takes before it reports.
    pub takes: Duration,
    /// How a repair that helps shows on the node.
    pub heal_by: Heal,
    /// A repair that makes the node report healthy also heals its simulated GPU (false: the node
    /// reports healthy, as the agent does after a reboot resets its latch, yet the GPU stays
    /// broken: [`crate::fleet::validation_pod::SIM_GPU_FAULT_ANNOTATION`] stays, and a
    /// validation Job on the node fails).
    pub heals_hardware: bool,
    /// With `heals_hardware`: a reset heals the simulated GPU too (false: a reset leaves it broken
    /// while the node reports healthy, and only a reboot heals it: the demo's failed validation).
    pub reset_heals_hardware: bool,
}

/// How a repair that helps makes the node report healthy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Heal {
    /// The operator writes what the agent would (`GpuHealthy=True`, no `failed-gpus`): no agent
    /// runs on the node.
    #[default]
    Condition,
    /// The operator writes the agent's clear annotation (`gpuremediation.dev/clear`, now), as the
    /// reset Job sample does after `nvidia-smi --gpu-reset`: the real agent on the node drops its
    /// latch, reads its GPUs again and reports them itself.
    ClearAnnotation,
}

impl Default for Behaviour {
    fn default() -> Self {
        Self {
            reset_heals: true,
            reboot_boots: true,
            reboot_heals: true,
            fails: false,
            takes: Duration::from_millis(500),
            heal_by: Heal::Condition,
            heals_hardware: true,
            reset_heals_hardware: true,
        }
    }
}

/// One repair the operator carried out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repaired {
    /// The object's name.
    pub object: String,
    /// `ResetGpu` or `Reboot`.
    pub action: String,
    /// The node.
    pub node: String,
    /// The behaviour it was carried out under.
    pub behaviour: Behaviour,
}

/// The running operator; dropping it stops it.
pub struct Repairer {
    task: JoinHandle<()>,
    behaviour: Arc<Mutex<Behaviour>>,
    repaired: Arc<Mutex<Vec<Repaired>>>,
}

impl Drop for Repairer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Repairer {
    /// Starts carrying out the objects of `resource` in `namespace`.
    #[must_use]
    pub fn start(client: Client, resource: &ApiResource, namespace: &str, behaviour: Behaviour) -> Self {
        let behaviour = Arc::new(Mutex::new(behaviour));
        let repaired = Arc::new(Mutex::new(Vec::new()));
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, resource);
        let task = tokio::spawn(run(client, api, behaviour.clone(), repaired.clone()));
        Self {
            task,
            behaviour,
            repaired,
        }
    }

    /// Changes what the next objects get.
    pub fn set(&self, behaviour: Behaviour) {
        *self.behaviour.lock().unwrap_or_else(PoisonError::into_inner) = behaviour;
    }

    /// The repairs carried out so far, in order.
    #[must_use]
    pub fn repaired(&self) -> Vec<Repaired> {
        self.repaired
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

async fn run(
    client: Client,
    api: Api<DynamicObject>,
    behaviour: Arc<Mutex<Behaviour>>,
    repaired: Arc<Mutex<Vec<Repaired>>>,
) {
    let mut boots = 0_u64;
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let Ok(list) = api.list(&ListParams::default()).await else {
            continue;
        };
        for object in list.items {
            if object.data.get("status").is_some_and(|s| !s.is_null()) {
                continue;
            }
            let spec = object.data.get("spec");
            let field = |name: &str| {
                spec.and_then(|s| s.get(name))
                    .and_then(|v| v.as_str())
                    .map(str::to_owned)
            };
            let (Some(node), Some(action), Some(name)) =
                (field("node"), field("action"), object.metadata.name)
            else {
                continue;
            };
            let now = *behaviour.lock().unwrap_or_else(PoisonError::into_inner);
            tokio::time::sleep(now.takes).await;
            boots += 1;
            let outcome = if now.fails {
                Ok(())
            } else {
                carry_out(&client, &node, &action, now, boots).await
            };
            let condition = match (&outcome, now.fails) {
                (Ok(()), false) => {
                    json!({"type": "Succeeded", "status": "True", "reason": "Repaired", "message": format!("{action} of {node} done")})
                }
                (Ok(()), true) => {
                    json!({"type": "Failed", "status": "True", "reason": "RepairFailed", "message": format!("{action} of {node} failed")})
                }
                (Err(error), _) => {
                    json!({"type": "Failed", "status": "True", "reason": "RepairFailed", "message": error.to_string()})
                }
            };
            let status = json!({"status": {"conditions": [condition]}});
            if api
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                .await
                .is_ok()
            {
                repaired
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(Repaired {
                        object: name,
                        action,
                        node,
                        behaviour: now,
                    });
            }
        }
    }
}

async fn carry_out(
    client: &Client,
    node: &str,
    action: &str,
    behaviour: Behaviour,
    boots: u64,
) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let heals = match action {
        "ResetGpu" => behaviour.reset_heals,
        "Reboot" => {
            if behaviour.reboot_boots {
                let patch = json!({
                    "status": {"nodeInfo": {"bootID": format!("boot-{node}-{boots}-{}", Timestamp::now().as_millisecond())}}
                });
                nodes
                    .patch_status(node, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                nodes
                    .patch_status(
                        node,
                        &PatchParams::default(),
                        &Patch::Strategic(crate::fleet::node::ready_status_patch(Timestamp::now())),
                    )
                    .await?;
            }
            behaviour.reboot_heals
        }
        _ => false,
    };
    let hardware = hardware(behaviour, action);
    if heals && behaviour.heal_by == Heal::ClearAnnotation {
        let cleared = Timestamp::from_second(Timestamp::now().as_second()).unwrap_or(Timestamp::UNIX_EPOCH);
        let patch = json!({"metadata": {"annotations": {CLEAR_ANNOTATION: cleared.to_string(), SIM_GPU_FAULT_ANNOTATION: hardware}}});
        nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    } else if heals {
        let patch = json!({"metadata": {"annotations": {FAILED_GPUS_ANNOTATION: null, SIM_GPU_FAULT_ANNOTATION: hardware}}});
        nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        fault::set_gpu_condition(client, node, "True", "GpusHealthy", "all GPUs healthy")
            .await
            .map_err(|e| match e {
                fault::SetGpuConditionError::ReadNode { source, .. }
                | fault::SetGpuConditionError::WriteCondition { source, .. } => source,
            })?;
    }
    Ok(())
}

/// The simulated GPU fault after a repair (`action`) that makes the node report healthy: gone
/// (`null`) when it heals the hardware, else still there.
fn hardware(behaviour: Behaviour, action: &str) -> serde_json::Value {
    let heals = behaviour.heals_hardware && (action != "ResetGpu" || behaviour.reset_heals_hardware);
    if heals {
        serde_json::Value::Null
    } else {
        json!("the repair left the GPU broken")
    }
}

/// A fatal XID on `gpu` as the agent publishes it: the `failed-gpus` annotation naming the GPU
/// (UUID, serial, index, PCI address) and `GpuHealthy=False` with reason `XID<xid>` and the
/// catalog's recommended action in the message (`RESET_GPU`, `RESTART_BM`, ...).
///
/// # Errors
/// When a write is refused.
pub async fn xid(
    client: &Client,
    node: &str,
    gpu: &crate::hardware::SimGpu,
    xid: u32,
    action: &str,
) -> Result<(), kube::Error> {
    let pci = format!("00000000:{:02X}:00.0", gpu.index + 1);
    let reason = format!("XID{xid}");
    let failed = json!([{"uuid": gpu.uuid, "serial": gpu.serial, "index": gpu.index, "pciBusId": pci, "reason": reason}]);
    let patch = json!({"metadata": {"annotations": {
        FAILED_GPUS_ANNOTATION: failed.to_string(),
        SIM_GPU_FAULT_ANNOTATION: format!("{reason} on {}", gpu.uuid),
    }}});
    Api::<Node>::all(client.clone())
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let message = format!(
        "GPU {} ({}, {pci}): XID {xid} (simulated); recommended action {action}",
        gpu.index, gpu.uuid
    );
    fault::set_gpu_condition(client, node, "False", &reason, &message)
        .await
        .map_err(|e| match e {
            fault::SetGpuConditionError::ReadNode { source, .. }
            | fault::SetGpuConditionError::WriteCondition { source, .. } => source,
        })
}

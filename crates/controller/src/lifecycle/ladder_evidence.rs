//! What a ladder step's evidence is read from, pure: the node's boot ID and `Ready` condition, the
//! GPUs the agent's inventory lists, where a recycle starts on the ladder, and the words that name
//! a node's GPUs for a person.

use crate::observe::{NodeConditionRef, NodeView};
use gpu_remediation_api::{
    GpuRemediation,
    constants::GPU_INVENTORY_ANNOTATION,
    hardware::LedgerGpu,
    ladder::{self, LadderStep, Rung},
    remediation::PolicySnapshot,
};

/// `status.nodeInfo.bootID`, when the kubelet reported one.
#[must_use]
pub fn boot_id(node: &(impl NodeView + ?Sized)) -> Option<&str> {
    node.node_info()
        .map(|info| info.boot_id)
        .filter(|id| !id.is_empty())
}

/// Whether the node's `Ready` condition is `True`.
#[must_use]
pub fn is_ready(node: &(impl NodeView + ?Sized)) -> bool {
    ready(node) == Some("True")
}

/// The status of the node's `Ready` condition (`True`, `False`, `Unknown`), if it has one.
#[must_use]
pub fn ready(node: &(impl NodeView + ?Sized)) -> Option<&str> {
    ready_condition(node).map(|c| c.status)
}

/// The node's `Ready` condition, if it has one.
#[must_use]
pub fn ready_condition(node: &(impl NodeView + ?Sized)) -> Option<NodeConditionRef<'_>> {
    node.condition("Ready")
}

/// The UUIDs the agent's `gpuremediation.dev/gpu-inventory` annotation lists now: each GPU's, then
/// its MIG devices' (a fault on one MIG device names that device's UUID).
#[must_use]
pub fn inventory_uuids(node: &(impl NodeView + ?Sized)) -> Vec<String> {
    #[derive(serde::Deserialize)]
    struct Mig {
        uuid: String,
    }
    #[derive(serde::Deserialize)]
    struct Listed {
        uuid: String,
        #[serde(default)]
        mig: Vec<Mig>,
    }
    node.annotation(GPU_INVENTORY_ANNOTATION)
        .and_then(|text| serde_json::from_str::<Vec<Listed>>(text).ok())
        .map(|gpus| {
            gpus.into_iter()
                .flat_map(|gpu| std::iter::once(gpu.uuid).chain(gpu.mig.into_iter().map(|mig| mig.uuid)))
                .collect()
        })
        .unwrap_or_default()
}

/// The GPUs the fault named at admission (the ledger's failed GPUs).
#[must_use]
pub fn failed_gpus(remediation: &GpuRemediation) -> &[LedgerGpu] {
    remediation
        .spec
        .hardware
        .as_ref()
        .map_or(&[], |hardware| hardware.failed.as_slice())
}

/// The UUIDs of the failed GPUs a reset may name: those of NVML's form
/// ([`gpu_remediation_api::names::is_gpu_uuid`]). The node reported them, and a step's template
/// may put them on a command line, so anything else is left out; a reset with none left starts a
/// rung higher, as one without a known GPU does.
#[must_use]
pub fn resettable_gpus(remediation: &GpuRemediation) -> Vec<&str> {
    failed_gpus(remediation)
        .iter()
        .map(|gpu| gpu.uuid.as_str())
        .filter(|uuid| gpu_remediation_api::names::is_gpu_uuid(uuid))
        .collect()
}

/// The rung a recycle starts at: the matching trigger's `startAt`, else the last rung for a repeat
/// offender, else what the trigger's reason recommends; a reset needs to know which GPU failed
/// (by a UUID of NVML's form), so without one it starts a rung higher.
#[must_use]
pub fn start_index(remediation: &GpuRemediation, rules: &PolicySnapshot) -> usize {
    let trigger = &remediation.spec.trigger;
    let start_at = rules
        .triggers
        .iter()
        .filter(|t| t.condition_type == trigger.condition_type && t.status == trigger.status)
        .find(|t| t.reasons.is_empty() || t.reasons.contains(&trigger.reason))
        .and_then(|t| t.start_at);
    let offender = remediation
        .spec
        .hardware
        .as_ref()
        .is_some_and(|h| h.repeat_offender.is_some());
    let wanted = start_at
        .or_else(|| offender.then_some(Rung::Replace))
        .or_else(|| ladder::recommended_rung(&trigger.reason, &trigger.message));
    let index = ladder::start_index(&rules.ladder, wanted);
    let reset_without_gpu = rules.ladder.get(index).is_some_and(|s| s.step == Rung::ResetGpu)
        && resettable_gpus(remediation).is_empty();
    if reset_without_gpu && index + 1 < rules.ladder.len() {
        index + 1
    } else {
        index
    }
}

/// The failed GPUs a drain is scoped to: only for the drain before a recycle's first step when
/// that step is `ResetGpu` (a re-drain after an escalation takes the whole node).
#[must_use]
pub fn reset_scope(
    remediation: &GpuRemediation,
    rules: &PolicySnapshot,
    status: &gpu_remediation_api::GpuRemediationStatus,
) -> Option<Vec<String>> {
    if rules.ladder.is_empty() || !status.steps.is_empty() {
        return None;
    }
    let first = rules.ladder.get(start_index(remediation, rules))?;
    let uuids: Vec<String> = failed_gpus(remediation).iter().map(|g| g.uuid.clone()).collect();
    (first.step == Rung::ResetGpu && !uuids.is_empty()).then_some(uuids)
}

/// The step of the ladder for `rung`.
#[must_use]
pub fn step_of(rules: &PolicySnapshot, rung: Rung) -> Option<&LadderStep> {
    rules.ladder.iter().find(|s| s.step == rung)
}

/// The GPUs named for a person: each failed GPU (else every GPU of the ledger) by index, UUID,
/// serial and PCI address.
#[must_use]
pub fn name_gpus(remediation: &GpuRemediation) -> String {
    let hardware = remediation.spec.hardware.as_ref();
    let gpus = match hardware {
        Some(h) if !h.failed.is_empty() => &h.failed,
        Some(h) => &h.gpus,
        None => return "no GPU inventory was published on the node".to_owned(),
    };
    if gpus.is_empty() {
        return "no GPU inventory was published on the node".to_owned();
    }
    gpus.iter()
        .map(|gpu| {
            format!(
                "GPU {} (UUID {}, serial {}, PCI {})",
                gpu.index.map_or_else(|| "?".to_owned(), |i| i.to_string()),
                gpu.uuid,
                gpu.serial.as_deref().unwrap_or("unknown"),
                gpu.pci_bus_id.as_deref().unwrap_or("unknown"),
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use gpu_remediation_api::{
        GpuRemediationSpec,
        hardware::HardwareLedger,
        policy::{ConditionStatus, Trigger},
        remediation::TriggerRecord,
    };
    use k8s_openapi::api::core::v1::{NodeStatus, NodeSystemInfo};

    use super::*;
    use k8s_openapi::api::core::v1::Node;

    fn step(rung: Rung) -> LadderStep {
        LadderStep {
            step: rung,
            timeout: gpu_remediation_api::Duration::from_mins(1),
            template: None,
        }
    }

    fn rules(start_at: Option<Rung>) -> PolicySnapshot {
        PolicySnapshot {
            generation: None,
            triggers: vec![Trigger {
                condition_type: "GpuHealthy".into(),
                status: ConditionStatus::False,
                reasons: Vec::new(),
                for_: gpu_remediation_api::Duration::from_secs(1),
                action: None,
                quarantine: None,
                start_at,
            }],
            drain: gpu_remediation_api::policy::Drain::default(),
            replacement: gpu_remediation_api::policy::Replacement::default(),
            release: gpu_remediation_api::policy::Release::default(),
            ladder: vec![
                step(Rung::ResetGpu),
                step(Rung::Reboot),
                step(Rung::Replace),
                step(Rung::HandOff),
            ],
            validation: None,
            diagnostics: None,
        }
    }

    fn remediation(reason: &str, message: &str, failed: &[&str]) -> GpuRemediation {
        GpuRemediation::new(
            "n-1",
            GpuRemediationSpec {
                node_name: "n".into(),
                policy_name: "p".into(),
                trigger: TriggerRecord {
                    condition_type: "GpuHealthy".into(),
                    status: ConditionStatus::False,
                    reason: reason.into(),
                    message: message.into(),
                    since: None,
                },
                action: gpu_remediation_api::policy::Action::Replace,
                mode: gpu_remediation_api::policy::Mode::Enforce,
                node_uid: None,
                previous_incident: None,
                policy_snapshot: None,
                hardware: Some(HardwareLedger {
                    failed: failed
                        .iter()
                        .map(|uuid| LedgerGpu {
                            uuid: (*uuid).into(),
                            serial: Some("S3".into()),
                            index: Some(3),
                            pci_bus_id: Some("0000:3b:00.0".into()),
                            reason: None,
                            first_seen: None,
                        })
                        .collect(),
                    ..HardwareLedger::default()
                }),
            },
        )
    }

    #[test]
    fn a_reset_gpu_xid_on_a_known_gpu_starts_at_the_reset() {
        let r = remediation("XID48", "GPU 3: XID 48; recommended action RESET_GPU", &["GPU-3"]);
        assert_eq!(start_index(&r, &rules(None)), 0);
    }

    #[test]
    fn a_reset_without_a_known_gpu_starts_at_the_reboot() {
        let r = remediation("XID48", "recommended action RESET_GPU", &[]);
        assert_eq!(start_index(&r, &rules(None)), 1);
    }

    #[test]
    fn a_reset_whose_only_gpu_uuid_is_not_nvmls_starts_at_the_reboot_and_names_no_gpu() {
        let hostile = remediation("XID48", "recommended action RESET_GPU", &["GPU-3\"; reboot; \""]);
        assert_eq!(start_index(&hostile, &rules(None)), 1);
        assert!(resettable_gpus(&hostile).is_empty());
        let mixed = remediation("XID48", "recommended action RESET_GPU", &["GPU-$(id)", "GPU-3"]);
        assert_eq!(start_index(&mixed, &rules(None)), 0);
        assert_eq!(resettable_gpus(&mixed), ["GPU-3"]);
    }

    #[test]
    fn a_triggers_start_at_overrides_the_reason() {
        let r = remediation("XID48", "recommended action RESET_GPU", &["GPU-3"]);
        assert_eq!(start_index(&r, &rules(Some(Rung::Replace))), 2);
        let missing = remediation("GpuMissing", "GPU 3 is gone", &["GPU-3"]);
        assert_eq!(start_index(&missing, &rules(None)), 1);
    }

    #[test]
    fn the_boot_id_and_the_inventory_are_read_from_the_node() {
        let mut node = Node::default();
        assert_eq!(boot_id(&node), None);
        node.status = Some(NodeStatus {
            node_info: Some(NodeSystemInfo {
                boot_id: "b-1".into(),
                ..NodeSystemInfo::default()
            }),
            ..NodeStatus::default()
        });
        node.metadata.annotations = Some(
            [(
                GPU_INVENTORY_ANNOTATION.to_owned(),
                concat!(
                    r#"[{"index":3,"uuid":"GPU-3","pciBusId":"0000:3b:00.0"},"#,
                    r#"{"index":4,"uuid":"GPU-4","mig":[{"uuid":"MIG-4a","gpuInstance":1}]}]"#
                )
                .to_owned(),
            )]
            .into(),
        );
        assert_eq!(boot_id(&node), Some("b-1"));
        assert_eq!(
            inventory_uuids(&node),
            ["GPU-3", "GPU-4", "MIG-4a"],
            "MIG devices too"
        );
    }

    #[test]
    fn a_hand_off_names_each_failed_gpu_by_index_uuid_serial_and_pci_address() {
        let r = remediation("XID79", "", &["GPU-3"]);
        assert_eq!(name_gpus(&r), "GPU 3 (UUID GPU-3, serial S3, PCI 0000:3b:00.0)");
    }
}

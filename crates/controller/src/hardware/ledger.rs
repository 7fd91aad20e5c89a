//! What a remediation records of its node's hardware at admission: the GPUs of the agent's
//! inventory annotation, the failed ones of its failed-GPUs annotation (serial and UUID), the host
//! (system UUID, else provider ID), and the labels that select remediations by failed serial and
//! by host. Pure.

use std::collections::BTreeMap;

use crate::observe::NodeView;
use gpu_remediation_api::{
    constants::{
        FAILED_GPUS_ANNOTATION, FAILED_SERIAL_LABEL, FAILED_SERIAL_LABELS_MAX, GPU_INVENTORY_ANNOTATION,
        HOST_LABEL,
    },
    hardware::{GPU_INDEX_MAX, HardwareLedger, LEDGER_GPUS_MAX, LedgerGpu, label_value},
};
use serde::Deserialize;

/// One GPU as the agent's annotations spell it (unknown fields ignored, absent ones empty).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct AnnotatedGpu {
    index: Option<u32>,
    uuid: String,
    serial: Option<String>,
    pci_bus_id: Option<String>,
    reason: Option<String>,
}

impl AnnotatedGpu {
    fn into_ledger(self) -> LedgerGpu {
        LedgerGpu {
            uuid: self.uuid,
            serial: self.serial.filter(|s| !s.is_empty()),
            // A node's own words: one past the schema's bound would have its record refused.
            index: self.index.filter(|i| *i <= GPU_INDEX_MAX),
            pci_bus_id: self.pci_bus_id.filter(|p| !p.is_empty()),
            reason: self.reason.filter(|r| !r.is_empty()),
            first_seen: None,
        }
    }
}

fn annotated(node: &(impl NodeView + ?Sized), key: &str) -> Vec<LedgerGpu> {
    node.annotation(key)
        .and_then(|text| serde_json::from_str::<Vec<AnnotatedGpu>>(text).ok())
        .unwrap_or_default()
        .into_iter()
        .filter(|gpu| !gpu.uuid.is_empty())
        .take(LEDGER_GPUS_MAX)
        .map(AnnotatedGpu::into_ledger)
        .collect()
}

/// The node's GPUs, from the agent's inventory annotation (none when absent or unreadable).
#[must_use]
pub fn inventory_of(node: &(impl NodeView + ?Sized)) -> Vec<LedgerGpu> {
    annotated(node, GPU_INVENTORY_ANNOTATION)
}

/// The machine under the node: its system UUID, else its provider ID.
#[must_use]
pub fn host_of(node: &(impl NodeView + ?Sized)) -> Option<String> {
    let system_uuid = node.node_info().map(|i| i.system_uuid).filter(|u| !u.is_empty());
    system_uuid
        .or_else(|| node.provider_id())
        .filter(|h| !h.is_empty())
        .map(str::to_owned)
}

/// The ledger of `node` for a fault whose reason is `reason`: its GPUs, the failed ones (their
/// serial completed from the inventory when the failed-GPUs annotation lacks it) and its host.
/// `None` when the node says nothing of its hardware.
#[must_use]
pub fn ledger_of(node: &(impl NodeView + ?Sized), reason: &str) -> Option<HardwareLedger> {
    let gpus = inventory_of(node);
    let failed: Vec<LedgerGpu> = annotated(node, FAILED_GPUS_ANNOTATION)
        .into_iter()
        .map(|mut failed| {
            let listed = gpus.iter().find(|gpu| gpu.uuid == failed.uuid);
            if failed.serial.is_none() {
                failed.serial = listed.and_then(|gpu| gpu.serial.clone());
            }
            if failed.index.is_none() {
                failed.index = listed.and_then(|gpu| gpu.index);
            }
            if failed.reason.is_none() && !reason.is_empty() {
                failed.reason = Some(reason.to_owned());
            }
            failed
        })
        .collect();
    let host = host_of(node);
    (!gpus.is_empty() || !failed.is_empty() || host.is_some()).then_some(HardwareLedger {
        gpus,
        failed,
        host,
        repeat_offender: None,
        untrusted: Vec::new(),
    })
}

/// Whether `serial` counts as failed in `ledger`: named failed, and not untrusted (`trust`).
#[must_use]
pub fn counts(ledger: &HardwareLedger, serial: &str) -> bool {
    ledger.failed.iter().any(|g| g.serial.as_deref() == Some(serial))
        && !ledger
            .untrusted
            .iter()
            .any(|g| g.serial.as_deref() == Some(serial))
}

/// The failed GPUs' serials that count (none the ledger marks untrusted), sorted, each once.
#[must_use]
pub fn failed_serials(ledger: &HardwareLedger) -> Vec<String> {
    let mut serials: Vec<String> = ledger
        .failed
        .iter()
        .filter_map(|g| g.serial.clone())
        .filter(|serial| counts(ledger, serial))
        .collect();
    serials.sort();
    serials.dedup();
    serials
}

/// The label key of the `n`th failed serial (from 1): `failed-serial`, then `failed-serial-2`, ...
#[must_use]
pub fn failed_serial_key(n: usize) -> String {
    if n <= 1 {
        FAILED_SERIAL_LABEL.to_owned()
    } else {
        format!("{FAILED_SERIAL_LABEL}-{n}")
    }
}

/// The labels that select a remediation by failed serial and by host.
#[must_use]
pub fn labels_of(ledger: &HardwareLedger) -> BTreeMap<String, String> {
    let mut labels: BTreeMap<String, String> = failed_serials(ledger)
        .iter()
        .take(FAILED_SERIAL_LABELS_MAX)
        .enumerate()
        .map(|(i, serial)| (failed_serial_key(i + 1), label_value(serial)))
        .collect();
    if let Some(host) = &ledger.host {
        labels.insert(HOST_LABEL.to_owned(), label_value(host));
    }
    labels
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus, NodeSystemInfo};

    use super::*;
    use k8s_openapi::api::core::v1::Node;

    const INVENTORY: &str = r#"[{"index":0,"uuid":"GPU-a","serial":"1650000000001","pciBusId":"00000000:01:00.0"},{"index":1,"uuid":"GPU-b","serial":"1650000000002","pciBusId":"00000000:02:00.0","boardPartNumber":"692"}]"#;

    fn node(annotations: &[(&str, &str)]) -> Node {
        let mut node = Node::default();
        node.metadata.name = Some("gpu-node-1".to_owned());
        node.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
        node
    }

    #[test]
    fn the_ledger_lists_the_inventory_and_completes_a_failed_gpu_s_serial_from_it() {
        let node = node(&[
            (GPU_INVENTORY_ANNOTATION, INVENTORY),
            (FAILED_GPUS_ANNOTATION, r#"[{"uuid":"GPU-b","reason":"XID79"}]"#),
        ]);
        let ledger = ledger_of(&node, "XID79").expect("a ledger");
        assert_eq!(ledger.gpus.len(), 2);
        assert_eq!(
            ledger.failed,
            vec![LedgerGpu {
                uuid: "GPU-b".to_owned(),
                serial: Some("1650000000002".to_owned()),
                index: Some(1),
                pci_bus_id: None,
                reason: Some("XID79".to_owned()),
                first_seen: None,
            }]
        );
        assert_eq!(failed_serials(&ledger), ["1650000000002"]);
    }

    #[test]
    fn an_index_past_the_schema_s_bound_is_left_out_not_recorded() {
        let inventory = r#"[{"index":5000,"uuid":"GPU-a"},{"index":1024,"uuid":"GPU-b"}]"#;
        let ledger = ledger_of(&node(&[(GPU_INVENTORY_ANNOTATION, inventory)]), "XID79").unwrap();
        let indexes: Vec<Option<u32>> = ledger.gpus.iter().map(|g| g.index).collect();
        assert_eq!(indexes, [None, Some(GPU_INDEX_MAX)]);
    }

    #[test]
    fn a_node_that_says_nothing_of_its_hardware_has_no_ledger() {
        assert_eq!(ledger_of(&node(&[]), "XID79"), None);
        assert_eq!(
            ledger_of(&node(&[(GPU_INVENTORY_ANNOTATION, "not json")]), "XID79"),
            None
        );
    }

    #[test]
    fn the_host_is_the_system_uuid_else_the_provider_id() {
        let mut node = node(&[]);
        node.spec = Some(NodeSpec {
            provider_id: Some("aws:///us-east-1a/i-0abc".to_owned()),
            ..NodeSpec::default()
        });
        assert_eq!(host_of(&node).as_deref(), Some("aws:///us-east-1a/i-0abc"));
        node.status = Some(NodeStatus {
            node_info: Some(NodeSystemInfo {
                system_uuid: "4c4c4544-0042".to_owned(),
                ..NodeSystemInfo::default()
            }),
            ..NodeStatus::default()
        });
        assert_eq!(host_of(&node).as_deref(), Some("4c4c4544-0042"));
    }

    #[test]
    fn each_failed_serial_gets_a_label_and_the_host_one_that_is_a_valid_label_value() {
        let ledger = HardwareLedger {
            failed: ["1650000000009", "1650000000002", "1650000000002"]
                .iter()
                .map(|s| LedgerGpu {
                    uuid: format!("GPU-{s}"),
                    serial: Some((*s).to_owned()),
                    ..LedgerGpu::default()
                })
                .collect(),
            host: Some("aws:///us-east-1a/i-0abc".to_owned()),
            ..HardwareLedger::default()
        };
        let labels = labels_of(&ledger);
        assert_eq!(labels[FAILED_SERIAL_LABEL], "1650000000002");
        assert_eq!(labels[&format!("{FAILED_SERIAL_LABEL}-2")], "1650000000009");
        assert_eq!(labels.len(), 3);
        assert!(labels[HOST_LABEL].starts_with("hash-"));
    }
}

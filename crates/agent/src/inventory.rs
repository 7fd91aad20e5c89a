//! The hardware the agent publishes on its node, for a ledger that follows a GPU across nodes: the
//! node's GPUs (`gpuremediation.dev/gpu-inventory`) and, next to a `False` condition, the GPUs the
//! fault names (`gpuremediation.dev/failed-gpus`), both as JSON. Pure: the texts are built here and
//! written with the condition (see `condition::PublishedCondition`), so they change only when
//! their content does.

use serde::{Deserialize, Serialize};

use crate::{
    assess::Memory,
    health::Latch,
    readings::{Snapshot, mig::MigReading},
};

/// One GPU of the inventory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InventoryGpu {
    /// NVML index.
    pub index: u32,
    /// `GPU-...`.
    pub uuid: String,
    /// Board serial, where the board has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// PCI bus id.
    pub pci_bus_id: String,
    /// Board part number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub board_part_number: Option<String>,
    /// VBIOS version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vbios_version: Option<String>,
    /// Product name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Its MIG devices, where MIG is enabled: the `MIG-...` UUIDs the device plugin and DRA hand
    /// out, each with its GPU instance.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig: Vec<MigReading>,
}

/// One GPU (or MIG device) a latched fault names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FailedGpu {
    /// `GPU-...`, or `MIG-...` for a fault on one MIG device (its board's serial, index and PCI
    /// address then those of its parent GPU).
    pub uuid: String,
    /// Board serial, when the agent read one for this GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// NVML index when last read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    /// PCI bus id when last read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
    /// The condition's reason (`GpuMissing`, `XID79`, ...).
    pub reason: String,
    /// For a MIG device: its parent GPU's UUID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_uuid: Option<String>,
    /// For a MIG device: its GPU instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_instance: Option<u32>,
}

/// The inventory of a successful read, in index order.
#[must_use]
pub fn inventory_of(snapshot: &Snapshot) -> Vec<InventoryGpu> {
    let mut gpus: Vec<InventoryGpu> = snapshot
        .gpus
        .iter()
        .map(|gpu| InventoryGpu {
            index: gpu.index,
            uuid: gpu.uuid.clone(),
            serial: gpu.serial.clone(),
            pci_bus_id: gpu.pci_bus_id.clone(),
            board_part_number: gpu.board_part_number.clone(),
            vbios_version: gpu.vbios_version.clone(),
            name: gpu.name.clone(),
            mig: gpu.mig.clone(),
        })
        .collect();
    gpus.sort_by_key(|gpu| gpu.index);
    gpus
}

/// The GPUs `latch` names, described from what the agent read of them (`memory`, which keeps GPUs
/// that vanished; a MIG device by its parent), else from what an earlier agent recorded on the node
/// (`recorded`), else by UUID alone.
#[must_use]
pub fn failed_gpus(latch: &Latch, memory: &Memory, recorded: &[FailedGpu]) -> Vec<FailedGpu> {
    latch
        .failed_gpus
        .iter()
        .map(|uuid| {
            if let Some(gpu) = memory.known(uuid) {
                return FailedGpu {
                    uuid: uuid.clone(),
                    serial: gpu.serial.clone(),
                    index: Some(gpu.index),
                    pci_bus_id: Some(gpu.pci_bus_id.clone()),
                    reason: latch.reason.clone(),
                    parent_uuid: None,
                    gpu_instance: None,
                };
            }
            if let Some((parent, mig)) = memory.known_mig(uuid) {
                return FailedGpu {
                    uuid: uuid.clone(),
                    serial: parent.serial.clone(),
                    index: Some(parent.index),
                    pci_bus_id: Some(parent.pci_bus_id.clone()),
                    reason: latch.reason.clone(),
                    parent_uuid: Some(parent.uuid.clone()),
                    gpu_instance: Some(mig.gpu_instance),
                };
            }
            recorded
                .iter()
                .find(|failed| failed.uuid == *uuid)
                .cloned()
                .unwrap_or_else(|| FailedGpu {
                    uuid: uuid.clone(),
                    serial: None,
                    index: None,
                    pci_bus_id: None,
                    reason: latch.reason.clone(),
                    parent_uuid: None,
                    gpu_instance: None,
                })
        })
        .collect()
}

/// The annotation text of a list: compact JSON.
#[must_use]
pub fn annotation_text<T: Serialize>(items: &[T]) -> String {
    serde_json::to_string(items).unwrap_or_else(|_| "[]".to_owned())
}

#[cfg(test)]
mod tests {
    use jiff::Timestamp;

    use super::*;
    use crate::readings::GpuReading;

    fn reading(index: u32, serial: Option<&str>) -> GpuReading {
        GpuReading {
            index,
            uuid: format!("GPU-{index}"),
            pci_bus_id: format!("00000000:{index:02X}:00.0"),
            name: "NVIDIA H100 80GB HBM3".to_owned(),
            serial: serial.map(str::to_owned),
            board_part_number: Some("692-2G520-0200-000".to_owned()),
            vbios_version: None,
            ..GpuReading::default()
        }
    }

    #[test]
    fn the_inventory_lists_each_gpu_in_index_order_leaving_out_what_the_board_does_not_report() {
        let snapshot = Snapshot {
            device_count: 2,
            gpus: vec![reading(1, None), reading(0, Some("1652023012345"))],
            ..Snapshot::default()
        };
        assert_eq!(
            annotation_text(&inventory_of(&snapshot)),
            concat!(
                r#"[{"index":0,"uuid":"GPU-0","serial":"1652023012345","pciBusId":"00000000:00:00.0","#,
                r#""boardPartNumber":"692-2G520-0200-000","name":"NVIDIA H100 80GB HBM3"},"#,
                r#"{"index":1,"uuid":"GPU-1","pciBusId":"00000000:01:00.0","#,
                r#""boardPartNumber":"692-2G520-0200-000","name":"NVIDIA H100 80GB HBM3"}]"#
            )
        );
    }

    #[test]
    fn a_failed_gpu_is_described_from_memory_then_from_the_node_then_by_uuid() {
        let mut memory = Memory::default();
        memory.remember(&Snapshot {
            device_count: 1,
            gpus: vec![reading(0, Some("S0"))],
            ..Snapshot::default()
        });
        let recorded = [FailedGpu {
            uuid: "GPU-7".to_owned(),
            serial: Some("S7".to_owned()),
            index: Some(7),
            pci_bus_id: None,
            reason: "XID79".to_owned(),
            parent_uuid: None,
            gpu_instance: None,
        }];
        let latch = Latch {
            reason: "XID79".to_owned(),
            message: String::new(),
            since: Timestamp::UNIX_EPOCH,
            failed_gpus: vec!["GPU-0".to_owned(), "GPU-7".to_owned(), "GPU-9".to_owned()],
        };
        let failed = failed_gpus(&latch, &memory, &recorded);
        assert_eq!(failed[0].serial.as_deref(), Some("S0"));
        assert_eq!(failed[0].pci_bus_id.as_deref(), Some("00000000:00:00.0"));
        assert_eq!(failed[1], recorded[0]);
        assert_eq!(
            failed[2],
            FailedGpu {
                uuid: "GPU-9".to_owned(),
                serial: None,
                index: None,
                pci_bus_id: None,
                reason: "XID79".to_owned(),
                parent_uuid: None,
                gpu_instance: None,
            }
        );
        let parsed: Vec<FailedGpu> = serde_json::from_str(&annotation_text(&failed)).unwrap();
        assert_eq!(parsed, failed, "the annotation reads back");
    }

    #[test]
    fn a_mig_device_is_listed_under_its_gpu_and_a_fault_on_it_names_its_parent_board() {
        let mut partitioned = reading(2, Some("S2"));
        partitioned.mig = vec![MigReading {
            uuid: "MIG-2-4".to_owned(),
            gpu_instance: 4,
            compute_instance: 0,
            name: "NVIDIA H100 80GB HBM3 MIG 1g.10gb".to_owned(),
        }];
        let snapshot = Snapshot {
            device_count: 1,
            gpus: vec![partitioned],
            ..Snapshot::default()
        };
        let text = annotation_text(&inventory_of(&snapshot));
        assert!(
            text.contains(r#""mig":[{"uuid":"MIG-2-4","gpuInstance":4,"computeInstance":0,"#),
            "{text}"
        );
        let mut memory = Memory::default();
        memory.remember(&snapshot);
        let latch = Latch {
            reason: "XID94".to_owned(),
            message: String::new(),
            since: Timestamp::UNIX_EPOCH,
            failed_gpus: vec!["MIG-2-4".to_owned()],
        };
        assert_eq!(
            failed_gpus(&latch, &memory, &[]),
            [FailedGpu {
                uuid: "MIG-2-4".to_owned(),
                serial: Some("S2".to_owned()),
                index: Some(2),
                pci_bus_id: Some("00000000:02:00.0".to_owned()),
                reason: "XID94".to_owned(),
                parent_uuid: Some("GPU-2".to_owned()),
                gpu_instance: Some(4),
            }]
        );
    }
}

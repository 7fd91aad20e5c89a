//! What a probe reads of a MIG-partitioned GPU: its MIG devices (`nvmlDeviceGetMigDeviceHandleByIndex`
//! on the parent, then each device's UUID, GPU instance, compute instance and name), in the
//! recorded form both probes produce, and how an XID naming a GPU instance finds its device. Pure.
//!
//! A MIG device is one compute instance of one GPU instance; the driver's XID names the GPU instance
//! (`GPU-I`) and, where it knows it, the compute instance (`GPU-CI`). The device plugin and DRA name
//! a MIG device by its own `MIG-...` UUID, so that UUID is what a fault on one instance publishes.

use serde::{Deserialize, Serialize};

use super::GpuReading;

/// The most MIG devices read of one GPU (NVML's `NVML_MAX_MIG_DEVICES` is 7 per GPU on today's
/// parts; a node's word past this is not read).
pub const MIG_DEVICES_MAX: usize = 16;

/// One MIG device of a GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MigReading {
    /// `MIG-...`: how the device plugin and DRA name it.
    pub uuid: String,
    /// Its GPU instance (`nvmlDeviceGetGpuInstanceId`), what an XID's `GPU-I` names.
    pub gpu_instance: u32,
    /// Its compute instance within the GPU instance (`nvmlDeviceGetComputeInstanceId`).
    #[serde(default)]
    pub compute_instance: u32,
    /// Its name, which carries the profile (`NVIDIA H100 80GB HBM3 MIG 1g.10gb`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
}

impl MigReading {
    /// How messages name it beside its parent GPU.
    #[must_use]
    pub fn describe(&self) -> String {
        let profile = self.name.rsplit_once(" MIG ").map_or("", |(_, profile)| profile);
        if profile.is_empty() {
            format!("MIG GPU instance {} (UUID {})", self.gpu_instance, self.uuid)
        } else {
            format!(
                "MIG GPU instance {} (UUID {}, profile {profile})",
                self.gpu_instance, self.uuid
            )
        }
    }
}

/// The MIG device of `gpu` an XID names by its GPU instance (and compute instance, where given):
/// the one with both, else the first of that GPU instance. `None` when the GPU is not partitioned
/// or has no such instance (the XID then concerns the whole GPU).
#[must_use]
pub fn instance_of(
    gpu: &GpuReading,
    gpu_instance: u32,
    compute_instance: Option<u32>,
) -> Option<&MigReading> {
    let mut of_instance = gpu.mig.iter().filter(|mig| mig.gpu_instance == gpu_instance);
    match compute_instance {
        Some(ci) => gpu
            .mig
            .iter()
            .find(|mig| mig.gpu_instance == gpu_instance && mig.compute_instance == ci)
            .or_else(|| of_instance.next()),
        None => of_instance.next(),
    }
}

/// The GPU among `gpus` that `mig_uuid` is a MIG device of, with that device.
#[must_use]
pub fn parent_of<'a>(
    gpus: impl IntoIterator<Item = &'a GpuReading>,
    mig_uuid: &str,
) -> Option<(&'a GpuReading, &'a MigReading)> {
    gpus.into_iter().find_map(|gpu| {
        gpu.mig
            .iter()
            .find(|mig| mig.uuid == mig_uuid)
            .map(|mig| (gpu, mig))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn partitioned() -> GpuReading {
        let mig = |gi: u32, ci: u32| MigReading {
            uuid: format!("MIG-{gi}-{ci}"),
            gpu_instance: gi,
            compute_instance: ci,
            name: "NVIDIA H100 80GB HBM3 MIG 1g.10gb".to_owned(),
        };
        GpuReading {
            index: 2,
            uuid: "GPU-2".to_owned(),
            mig: vec![mig(7, 0), mig(8, 0), mig(8, 1)],
            ..GpuReading::default()
        }
    }

    #[test]
    fn an_xid_finds_its_instance_by_gpu_instance_and_compute_instance_where_given() {
        let gpu = partitioned();
        assert_eq!(
            instance_of(&gpu, 7, None).map(|m| m.uuid.as_str()),
            Some("MIG-7-0")
        );
        assert_eq!(
            instance_of(&gpu, 8, Some(1)).map(|m| m.uuid.as_str()),
            Some("MIG-8-1")
        );
        assert_eq!(
            instance_of(&gpu, 8, Some(5)).map(|m| m.uuid.as_str()),
            Some("MIG-8-0"),
            "an unknown compute instance: the GPU instance's first"
        );
        assert_eq!(
            instance_of(&gpu, 9, None),
            None,
            "no such instance: the whole GPU"
        );
        assert_eq!(
            instance_of(&GpuReading::default(), 7, None),
            None,
            "not partitioned"
        );
    }

    #[test]
    fn a_mig_device_names_its_parent_and_profile() {
        let gpus = [GpuReading::default(), partitioned()];
        let (parent, mig) = parent_of(&gpus, "MIG-8-1").unwrap();
        assert_eq!((parent.uuid.as_str(), mig.compute_instance), ("GPU-2", 1));
        assert_eq!(parent_of(&gpus, "MIG-9-9"), None);
        assert_eq!(
            mig.describe(),
            "MIG GPU instance 8 (UUID MIG-8-1, profile 1g.10gb)"
        );
    }
}

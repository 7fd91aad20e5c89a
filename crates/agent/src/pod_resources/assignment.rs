//! The device-plugin assignment from what the kubelet says: every pod holding a device of an
//! `nvidia.com/...` resource, with the GPU UUIDs those devices are. Pure.
//!
//! Device IDs to GPUs: NVIDIA's device plugin names a whole GPU by its UUID (`GPU-...`, its default
//! `deviceIDStrategy`) or by its NVML index (`deviceIDStrategy: index`, mapped through the GPU
//! inventory the agent reads); a time-sliced replica carries a `::<n>` suffix, dropped. A MIG
//! device is named by its own `MIG-...` UUID, whose parent GPU the kubelet does not say: the agent's
//! own read of the GPUs does, so a MIG device it read is published with its parent (a fault on the
//! whole GPU reaches the pod, a fault on another instance does not). A device it cannot tie to a GPU
//! is published as `unmapped`, so the controller knows the mapping is incomplete (and drains the
//! whole node) rather than guessing.

use std::collections::BTreeMap;

use gpu_remediation_api::gpu_pods::{GPU_PODS_SETTLE_SECONDS, GpuPods, PodDevices};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::proto::ListPodResourcesResponse;
use crate::readings::GpuReading;

/// Resources under this prefix are NVIDIA's device plugin's.
pub const NVIDIA_RESOURCE_PREFIX: &str = "nvidia.com/";

/// How the kubelet's device IDs become GPUs, from the agent's last read of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceNames {
    /// NVML index → GPU UUID, for index-named devices.
    by_index: BTreeMap<u32, String>,
    /// MIG device UUID → its parent GPU's UUID.
    mig_parents: BTreeMap<String, String>,
}

impl DeviceNames {
    /// The names of the GPUs (and their MIG devices) `gpus` read.
    #[must_use]
    pub fn of(gpus: &[GpuReading]) -> Self {
        Self {
            by_index: gpus.iter().map(|g| (g.index, g.uuid.clone())).collect(),
            mig_parents: gpus
                .iter()
                .flat_map(|g| g.mig.iter().map(|mig| (mig.uuid.clone(), g.uuid.clone())))
                .collect(),
        }
    }
}

/// The assignment of `response`: each pod holding an `nvidia.com/...` device, sorted, its GPUs as
/// UUIDs (a MIG device's and its parent's), through `names`.
#[must_use]
pub fn assignment_of(response: &ListPodResourcesResponse, names: &DeviceNames) -> Vec<PodDevices> {
    let mut pods: Vec<PodDevices> = response
        .pod_resources
        .iter()
        .filter_map(|pod| {
            let mut entry = PodDevices {
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
                ..PodDevices::default()
            };
            let devices = pod
                .containers
                .iter()
                .flat_map(|c| c.devices.iter())
                .filter(|d| d.resource_name.starts_with(NVIDIA_RESOURCE_PREFIX));
            for device in devices {
                for id in &device.device_ids {
                    let uuids = gpus_of(id, names);
                    if uuids.is_empty() {
                        entry.unmapped.push(format!("{}={id}", device.resource_name));
                    }
                    entry.gpus.extend(uuids);
                }
            }
            entry.gpus.sort();
            entry.gpus.dedup();
            entry.unmapped.sort();
            entry.unmapped.dedup();
            (!entry.gpus.is_empty() || !entry.unmapped.is_empty()).then_some(entry)
        })
        .collect();
    pods.sort();
    pods
}

/// The UUIDs a device ID names: a whole GPU's, or a MIG device's and its parent's; none when it
/// names neither.
fn gpus_of(id: &str, names: &DeviceNames) -> Vec<String> {
    let id = id.split_once("::").map_or(id, |(device, _replica)| device);
    if id.len() > 4 && id[..4].eq_ignore_ascii_case("GPU-") {
        return vec![id.to_owned()];
    }
    if let Some(parent) = names.mig_parents.get(id) {
        return vec![id.to_owned(), parent.clone()];
    }
    id.parse::<u32>()
        .ok()
        .and_then(|index| names.by_index.get(&index).cloned())
        .into_iter()
        .collect()
}

/// Whether the published assignment (stamped `published_at`) is to be stamped again now: at every
/// resync, and once [`GPU_PODS_SETTLE_SECONDS`] after its pods last changed (`changed_at`) when its
/// stamp is older than that, so a pod read in its first seconds (which the controller counts as
/// created after the read) is covered seconds later.
#[must_use]
pub fn restamp_due(
    published_at: Option<Timestamp>,
    changed_at: Timestamp,
    now: Timestamp,
    resync_due: bool,
) -> bool {
    let settled = changed_at + SignedDuration::from_secs(GPU_PODS_SETTLE_SECONDS);
    resync_due || published_at.is_some_and(|stamp| stamp < settled && now >= settled)
}

/// The annotation to publish for `pods`, read successfully at `read_at`: the `previous` text as it
/// is when it already says the same pods and no `refresh` is due (so nothing is written), else the
/// pods stamped with `read_at`.
#[must_use]
pub fn annotation_to_publish(
    pods: &[PodDevices],
    read_at: Timestamp,
    previous: Option<&str>,
    refresh: bool,
) -> String {
    let stamped = |at: Timestamp| {
        GpuPods {
            read_at: Time(at),
            pods: pods.to_vec(),
            omitted: 0,
        }
        .to_annotation()
    };
    if !refresh
        && let Some(previous) = previous
        && let Ok(published) = GpuPods::parse(previous)
        && stamped(published.read_at.0) == previous
    {
        return previous.to_owned();
    }
    stamped(read_at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod_resources::proto::{ContainerDevices, ContainerResources, PodResources};

    fn pod(namespace: &str, name: &str, devices: &[(&str, &[&str])]) -> PodResources {
        PodResources {
            name: name.into(),
            namespace: namespace.into(),
            containers: vec![ContainerResources {
                name: "main".into(),
                devices: devices
                    .iter()
                    .map(|(resource, ids)| ContainerDevices {
                        resource_name: (*resource).into(),
                        device_ids: ids.iter().map(|id| (*id).to_owned()).collect(),
                    })
                    .collect(),
            }],
        }
    }

    fn inventory() -> DeviceNames {
        let mut gpus: Vec<GpuReading> = (0..8)
            .map(|i| GpuReading {
                index: i,
                uuid: format!("GPU-{i}"),
                ..GpuReading::default()
            })
            .collect();
        gpus[2].mig = (1..=7)
            .map(|gi| crate::readings::mig::MigReading {
                uuid: format!("MIG-2-{gi}"),
                gpu_instance: gi,
                ..Default::default()
            })
            .collect();
        DeviceNames::of(&gpus)
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    #[test]
    fn each_gpu_pod_is_listed_with_its_gpu_uuids_and_other_pods_are_left_out() {
        let response = ListPodResourcesResponse {
            pod_resources: vec![
                pod("train", "worker-3", &[("nvidia.com/gpu", &["GPU-3"])]),
                pod("web", "frontend", &[]),
                pod("sriov", "nic", &[("intel.com/sriov", &["0000:18:00.1"])]),
                pod("train", "worker-1", &[("nvidia.com/gpu", &["GPU-1", "GPU-0"])]),
            ],
        };
        let pods = assignment_of(&response, &inventory());
        assert_eq!(
            pods,
            [
                PodDevices {
                    namespace: "train".into(),
                    name: "worker-1".into(),
                    gpus: vec!["GPU-0".into(), "GPU-1".into()],
                    unmapped: vec![],
                },
                PodDevices {
                    namespace: "train".into(),
                    name: "worker-3".into(),
                    gpus: vec!["GPU-3".into()],
                    unmapped: vec![],
                },
            ]
        );
    }

    #[test]
    fn index_named_devices_and_time_sliced_replicas_map_to_their_gpu_uuid() {
        let response = ListPodResourcesResponse {
            pod_resources: vec![
                pod("a", "by-index", &[("nvidia.com/gpu", &["5"])]),
                pod("a", "replica", &[("nvidia.com/gpu.shared", &["GPU-2::3"])]),
            ],
        };
        let pods = assignment_of(&response, &inventory());
        assert_eq!(pods[0].gpus, ["GPU-5"]);
        assert_eq!(pods[1].gpus, ["GPU-2"]);
    }

    #[test]
    fn a_mig_device_the_agent_read_is_published_with_its_parent_gpu() {
        let response = ListPodResourcesResponse {
            pod_resources: vec![pod("a", "small", &[("nvidia.com/mig-1g.10gb", &["MIG-2-4"])])],
        };
        let pods = assignment_of(&response, &inventory());
        assert_eq!(pods[0].gpus, ["GPU-2", "MIG-2-4"]);
        assert!(pods[0].unmapped.is_empty());
    }

    #[test]
    fn a_mig_partition_or_an_unknown_index_is_published_unmapped() {
        let response = ListPodResourcesResponse {
            pod_resources: vec![pod(
                "a",
                "small",
                &[
                    ("nvidia.com/mig-1g.10gb", &["MIG-9a7f"]),
                    ("nvidia.com/gpu", &["12"]),
                ],
            )],
        };
        let pods = assignment_of(&response, &inventory());
        assert!(pods[0].gpus.is_empty());
        assert_eq!(
            pods[0].unmapped,
            ["nvidia.com/gpu=12", "nvidia.com/mig-1g.10gb=MIG-9a7f"]
        );
    }

    #[test]
    fn the_same_pods_keep_the_published_text_so_nothing_is_written() {
        let pods = assignment_of(
            &ListPodResourcesResponse {
                pod_resources: vec![pod("train", "w", &[("nvidia.com/gpu", &["GPU-1"])])],
            },
            &inventory(),
        );
        let first = annotation_to_publish(&pods, at(0), None, false);
        assert_eq!(annotation_to_publish(&pods, at(60), Some(&first), false), first);
        let refreshed = annotation_to_publish(&pods, at(60), Some(&first), true);
        assert_ne!(refreshed, first, "a refresh stamps the new read");
        assert_eq!(GpuPods::parse(&refreshed).unwrap().read_at, Time(at(60)));
    }

    #[test]
    fn a_changed_assignment_is_stamped_once_more_after_it_settles_then_only_at_resync() {
        // Changed at 0 and published stamped 1: not yet, then once at 10, then no more.
        assert!(!restamp_due(Some(at(1)), at(0), at(5), false));
        assert!(restamp_due(Some(at(1)), at(0), at(10), false));
        assert!(!restamp_due(Some(at(10)), at(0), at(30), false));
        assert!(restamp_due(Some(at(10)), at(0), at(30), true), "at resync");
        assert!(
            !restamp_due(None, at(0), at(30), false),
            "nothing published: a first write anyway"
        );
    }

    #[test]
    fn changed_pods_are_stamped_with_the_read_that_saw_them() {
        let one = vec![PodDevices {
            namespace: "a".into(),
            name: "p".into(),
            gpus: vec!["GPU-1".into()],
            unmapped: vec![],
        }];
        let first = annotation_to_publish(&one, at(0), None, false);
        let changed = annotation_to_publish(&[], at(5), Some(&first), false);
        let read = GpuPods::parse(&changed).unwrap();
        assert_eq!((read.read_at, read.pods.len()), (Time(at(5)), 0));
    }
}

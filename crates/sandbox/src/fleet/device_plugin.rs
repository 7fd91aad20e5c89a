//! The simulated NVIDIA device plugin of the fleet's kubelets: pods asking for `nvidia.com/gpu`
//! are handed whole GPUs of their node (the lowest free NVML indices), named by UUID as NVIDIA's
//! plugin names them, the same UUIDs as the node's simulated GPUs (`dra::node_gpus`, the inventory
//! the fleet and the tests publish); a pod that finished or is gone gives its GPUs back. What the
//! kubelet's pod-resources API then reports ([`DevicePlugin::list`], served by
//! `fleet::pod_resources`). A node's GPU can be partitioned ([`DevicePlugin::partition`]): its MIG
//! devices are then handed out, by their own `MIG-...` UUIDs, to pods asking for their profile's
//! resource (`nvidia.com/mig-1g.10gb`), as the plugin's `mixed` MIG strategy does. Pure state; the
//! kubelet calls it.

use std::collections::BTreeMap;

use gpu_health_agent::pod_resources::proto::{
    ContainerDevices, ContainerResources, ListPodResourcesResponse, PodResources,
};
use gpu_remediation_api::constants::GPU_RESOURCE;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use crate::{dra::node_gpus, hardware::SimGpu};

/// A pod holding GPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Holder {
    namespace: String,
    name: String,
    uid: String,
    container: String,
}

/// One MIG device of a partitioned GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimMig {
    /// The resource it is advertised under (`nvidia.com/mig-1g.10gb`).
    pub resource: String,
    /// `MIG-...`.
    pub uuid: String,
    /// Its GPU's NVML index.
    pub gpu: u32,
    /// Its GPU instance (what an XID names it by).
    pub gpu_instance: u32,
}

/// `count` MIG devices of profile `profile` (`1g.10gb`) on `gpu`, GPU instances 1 to `count`, each
/// named after its parent's UUID.
#[must_use]
pub fn mig_devices(gpu: &SimGpu, profile: &str, count: u32) -> Vec<SimMig> {
    let parent = gpu.uuid.strip_prefix("GPU-").unwrap_or(&gpu.uuid);
    (1..=count)
        .map(|gpu_instance| SimMig {
            resource: format!("nvidia.com/mig-{profile}"),
            uuid: format!("MIG-{parent}-{gpu_instance}"),
            gpu: gpu.index,
            gpu_instance,
        })
        .collect()
}

/// The GPUs handed out on each node.
#[derive(Debug)]
pub struct DevicePlugin {
    gpus_per_node: u32,
    /// node → NVML index → the pod holding it.
    held: BTreeMap<String, BTreeMap<u32, Holder>>,
    /// node → its MIG devices.
    mig: BTreeMap<String, Vec<SimMig>>,
    /// node → MIG UUID → the pod holding it.
    held_mig: BTreeMap<String, BTreeMap<String, Holder>>,
}

/// A pod asked for more devices than its node has free (the real kubelet fails it with
/// `UnexpectedAdmissionError`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pod {pod} asks for {asked} {resource} but node {node} has {free} free")]
pub struct NoFreeGpus {
    /// The pod.
    pub pod: String,
    /// The node.
    pub node: String,
    /// The resource.
    pub resource: String,
    /// How many it asked for.
    pub asked: u32,
    /// How many were free.
    pub free: u32,
}

impl DevicePlugin {
    /// A plugin for nodes of `gpus_per_node` GPUs each.
    #[must_use]
    pub fn new(gpus_per_node: u32) -> Self {
        Self {
            gpus_per_node,
            held: BTreeMap::new(),
            mig: BTreeMap::new(),
            held_mig: BTreeMap::new(),
        }
    }

    /// Partitions GPUs of `node` into `devices` (their GPUs are no longer handed out whole).
    pub fn partition(&mut self, node: &str, devices: Vec<SimMig>) {
        self.mig.insert(node.to_owned(), devices);
    }

    /// Hands `pod` (bound to `node`) the GPUs it asks for, once: a pod already holding GPUs keeps
    /// them. Returns the UUIDs it holds (none for a pod that asks for none).
    pub fn allocate(&mut self, node: &str, pod: &Pod) -> Result<Vec<String>, NoFreeGpus> {
        let Some((container, asked)) = gpus_asked(pod) else {
            return self.allocate_mig(node, pod);
        };
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let gpus = node_gpus(node, self.gpus_per_node);
        let held = self.held.entry(node.to_owned()).or_default();
        let mine: Vec<u32> = held
            .iter()
            .filter(|(_, h)| h.uid == uid)
            .map(|(i, _)| *i)
            .collect();
        if !mine.is_empty() {
            return Ok(uuids(&gpus, &mine));
        }
        let partitioned: Vec<u32> = self.mig.get(node).into_iter().flatten().map(|m| m.gpu).collect();
        let free: Vec<u32> = (0..self.gpus_per_node)
            .filter(|i| !held.contains_key(i) && !partitioned.contains(i))
            .collect();
        if free.len() < asked as usize {
            return Err(NoFreeGpus {
                pod: format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any()),
                node: node.to_owned(),
                resource: GPU_RESOURCE.to_owned(),
                asked,
                free: u32::try_from(free.len()).unwrap_or(u32::MAX),
            });
        }
        let taken: Vec<u32> = free.into_iter().take(asked as usize).collect();
        for index in &taken {
            held.insert(
                *index,
                Holder {
                    namespace: pod.namespace().unwrap_or_default(),
                    name: pod.name_any(),
                    uid: uid.clone(),
                    container: container.clone(),
                },
            );
        }
        Ok(uuids(&gpus, &taken))
    }

    /// Hands `pod` the MIG devices it asks for, once, as [`Self::allocate`] does GPUs.
    fn allocate_mig(&mut self, node: &str, pod: &Pod) -> Result<Vec<String>, NoFreeGpus> {
        let Some((container, resource, asked)) = mig_asked(pod) else {
            return Ok(Vec::new());
        };
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let held = self.held_mig.entry(node.to_owned()).or_default();
        let mine: Vec<String> = held
            .iter()
            .filter(|(_, h)| h.uid == uid)
            .map(|(uuid, _)| uuid.clone())
            .collect();
        if !mine.is_empty() {
            return Ok(mine);
        }
        let free: Vec<String> = self
            .mig
            .get(node)
            .into_iter()
            .flatten()
            .filter(|m| m.resource == resource && !held.contains_key(&m.uuid))
            .map(|m| m.uuid.clone())
            .collect();
        if free.len() < asked as usize {
            return Err(NoFreeGpus {
                pod: format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any()),
                node: node.to_owned(),
                resource,
                asked,
                free: u32::try_from(free.len()).unwrap_or(u32::MAX),
            });
        }
        let taken: Vec<String> = free.into_iter().take(asked as usize).collect();
        for uuid in &taken {
            held.insert(
                uuid.clone(),
                Holder {
                    namespace: pod.namespace().unwrap_or_default(),
                    name: pod.name_any(),
                    uid: uid.clone(),
                    container: container.clone(),
                },
            );
        }
        Ok(taken)
    }

    /// Gives back the GPUs and MIG devices of the pod with `uid` (finished, deleted).
    pub fn release(&mut self, uid: &str) {
        for held in self.held.values_mut() {
            held.retain(|_, h| h.uid != uid);
        }
        for held in self.held_mig.values_mut() {
            held.retain(|_, h| h.uid != uid);
        }
    }

    /// What the kubelet's pod-resources `List` reports for `node`: each pod holding devices, with
    /// their UUIDs under their resource (`nvidia.com/gpu`, a MIG profile's).
    #[must_use]
    pub fn list(&self, node: &str) -> ListPodResourcesResponse {
        type Key = (String, String, String);
        let gpus = node_gpus(node, self.gpus_per_node);
        let mut pods: BTreeMap<Key, BTreeMap<String, Vec<String>>> = BTreeMap::new();
        let key = |h: &Holder| (h.namespace.clone(), h.name.clone(), h.container.clone());
        for (index, h) in self.held.get(node).into_iter().flatten() {
            pods.entry(key(h))
                .or_default()
                .entry(GPU_RESOURCE.to_owned())
                .or_default()
                .extend(uuids(&gpus, &[*index]));
        }
        let resource_of = |uuid: &str| {
            self.mig
                .get(node)
                .into_iter()
                .flatten()
                .find(|m| m.uuid == uuid)
                .map(|m| m.resource.clone())
                .unwrap_or_default()
        };
        for (uuid, h) in self.held_mig.get(node).into_iter().flatten() {
            pods.entry(key(h))
                .or_default()
                .entry(resource_of(uuid))
                .or_default()
                .push(uuid.clone());
        }
        ListPodResourcesResponse {
            pod_resources: pods
                .into_iter()
                .map(|((namespace, name, container), devices)| PodResources {
                    name,
                    namespace,
                    containers: vec![ContainerResources {
                        name: container,
                        devices: devices
                            .into_iter()
                            .map(|(resource_name, device_ids)| ContainerDevices {
                                resource_name,
                                device_ids,
                            })
                            .collect(),
                    }],
                })
                .collect(),
        }
    }

    /// The GPU and MIG device UUIDs each pod (`namespace/name`) holds on `node`.
    #[must_use]
    pub fn holders(&self, node: &str) -> BTreeMap<String, Vec<String>> {
        let gpus = node_gpus(node, self.gpus_per_node);
        let mut pods: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (index, h) in self.held.get(node).into_iter().flatten() {
            pods.entry(format!("{}/{}", h.namespace, h.name))
                .or_default()
                .extend(uuids(&gpus, &[*index]));
        }
        for (uuid, h) in self.held_mig.get(node).into_iter().flatten() {
            pods.entry(format!("{}/{}", h.namespace, h.name))
                .or_default()
                .push(uuid.clone());
        }
        pods
    }
}

fn uuids(gpus: &[SimGpu], indices: &[u32]) -> Vec<String> {
    indices
        .iter()
        .filter_map(|i| gpus.get(*i as usize).map(|g| g.uuid.clone()))
        .collect()
}

/// The first container asking for `nvidia.com/gpu` (limits, else requests) and how many the pod
/// asks for in all.
fn gpus_asked(pod: &Pod) -> Option<(String, u32)> {
    let spec = pod.spec.as_ref()?;
    let mut first = None;
    let mut total = 0_u32;
    for container in &spec.containers {
        let count = gpu_remediation_api::pod_gpus::of_container(container);
        if count > 0 {
            first.get_or_insert_with(|| container.name.clone());
            total += count;
        }
    }
    first.map(|c| (c, total))
}

/// The first container asking for a MIG profile's resource (`nvidia.com/mig-...`, limits), the
/// resource, and how many it asks for.
fn mig_asked(pod: &Pod) -> Option<(String, String, u32)> {
    pod.spec.as_ref()?.containers.iter().find_map(|container| {
        let limits = container.resources.as_ref()?.limits.as_ref()?;
        let (resource, count) = limits
            .iter()
            .find(|(resource, _)| resource.starts_with("nvidia.com/mig-"))?;
        let count = count.0.parse::<u32>().ok().filter(|n| *n > 0)?;
        Some((container.name.clone(), resource.clone(), count))
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(name: &str, gpus: u32) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "train", "uid": format!("uid-{name}")},
            "spec": {"nodeName": "n", "containers": [{"name": "main",
                     "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}]},
        }))
        .unwrap()
    }

    #[test]
    fn eight_single_gpu_pods_get_the_eight_gpus_of_their_node_by_uuid() {
        let mut plugin = DevicePlugin::new(8);
        let gpus = node_gpus("n", 8);
        for (i, gpu) in gpus.iter().enumerate() {
            assert_eq!(
                plugin.allocate("n", &pod(&format!("w-{i}"), 1)).unwrap(),
                std::slice::from_ref(&gpu.uuid)
            );
        }
        let listed = plugin.list("n");
        assert_eq!(listed.pod_resources.len(), 8);
        assert_eq!(
            listed.pod_resources[3].containers[0].devices[0].device_ids,
            [gpus[3].uuid.clone()]
        );
        assert_eq!(plugin.allocate("n", &pod("one-too-many", 1)).unwrap_err().free, 0);
    }

    #[test]
    fn a_pod_keeps_its_gpus_and_gives_them_back_when_it_goes() {
        let mut plugin = DevicePlugin::new(2);
        let first = plugin.allocate("n", &pod("a", 1)).unwrap();
        assert_eq!(plugin.allocate("n", &pod("a", 1)).unwrap(), first, "once");
        plugin.release("uid-a");
        assert!(plugin.list("n").pod_resources.is_empty());
        assert_eq!(plugin.allocate("n", &pod("b", 2)).unwrap().len(), 2);
    }

    #[test]
    fn a_partitioned_gpu_hands_out_its_mig_devices_by_uuid_and_no_longer_whole() {
        let mut plugin = DevicePlugin::new(2);
        let gpus = node_gpus("n", 2);
        let migs = mig_devices(&gpus[1], "1g.10gb", 3);
        plugin.partition("n", migs.clone());
        let small = |name: &str| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "infer", "uid": format!("uid-{name}")},
                "spec": {"nodeName": "n", "containers": [{"name": "main",
                         "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}]},
            }))
            .unwrap()
        };
        for (i, mig) in migs.iter().enumerate() {
            assert_eq!(
                plugin.allocate("n", &small(&format!("s-{i}"))).unwrap(),
                std::slice::from_ref(&mig.uuid)
            );
        }
        let refused = plugin.allocate("n", &small("s-3")).unwrap_err();
        assert_eq!(
            (refused.resource.as_str(), refused.free),
            ("nvidia.com/mig-1g.10gb", 0)
        );
        assert_eq!(
            plugin.allocate("n", &pod("whole", 2)).unwrap_err().free,
            1,
            "GPU 1 is partitioned"
        );
        let listed = plugin.list("n");
        let devices = &listed.pod_resources[1].containers[0].devices[0];
        assert_eq!(
            (devices.resource_name.as_str(), devices.device_ids.clone()),
            ("nvidia.com/mig-1g.10gb", vec![migs[1].uuid.clone()])
        );
        assert!(migs[1].uuid.starts_with("MIG-") && migs[1].gpu_instance == 2);
        plugin.release("uid-s-1");
        assert_eq!(
            plugin.allocate("n", &small("s-4")).unwrap(),
            [migs[1].uuid.clone()]
        );
    }

    #[test]
    fn a_pod_asking_for_no_gpu_holds_none() {
        let mut plugin = DevicePlugin::new(8);
        assert!(plugin.allocate("n", &pod("cpu", 0)).unwrap().is_empty());
        assert!(plugin.holders("n").is_empty());
    }
}

//! The simulated NVIDIA device plugin of the fleet's kubelets: pods asking for `nvidia.com/gpu`
//! are handed whole GPUs of their node (the lowest free NVML indices), named by UUID as NVIDIA's
//! plugin names them, the same UUIDs as the node's simulated GPUs (`dra::node_gpus`, the inventory
//! the fleet and the tests publish); a pod that finished or is gone gives its GPUs back. What the
//! kubelet's pod-resources API then reports ([`DevicePlugin::list`], served by
//! `fleet::pod_resources`). Pure state; the kubelet calls it.

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

/// The GPUs handed out on each node.
#[derive(Debug)]
pub struct DevicePlugin {
    gpus_per_node: u32,
    /// node → NVML index → the pod holding it.
    held: BTreeMap<String, BTreeMap<u32, Holder>>,
}

/// A pod asked for more GPUs than its node has free (the real kubelet fails it with
/// `UnexpectedAdmissionError`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pod {pod} asks for {asked} {GPU_RESOURCE} but node {node} has {free} free")]
pub struct NoFreeGpus {
    /// The pod.
    pub pod: String,
    /// The node.
    pub node: String,
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
        }
    }

    /// Hands `pod` (bound to `node`) the GPUs it asks for, once: a pod already holding GPUs keeps
    /// them. Returns the UUIDs it holds (none for a pod that asks for none).
    pub fn allocate(&mut self, node: &str, pod: &Pod) -> Result<Vec<String>, NoFreeGpus> {
        let Some((container, asked)) = gpus_asked(pod) else {
            return Ok(Vec::new());
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
        let free: Vec<u32> = (0..self.gpus_per_node)
            .filter(|i| !held.contains_key(i))
            .collect();
        if free.len() < asked as usize {
            return Err(NoFreeGpus {
                pod: format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any()),
                node: node.to_owned(),
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

    /// Gives back the GPUs of the pod with `uid` (finished, deleted).
    pub fn release(&mut self, uid: &str) {
        for held in self.held.values_mut() {
            held.retain(|_, h| h.uid != uid);
        }
    }

    /// What the kubelet's pod-resources `List` reports for `node`: each pod holding GPUs, with
    /// their UUIDs under `nvidia.com/gpu`.
    #[must_use]
    pub fn list(&self, node: &str) -> ListPodResourcesResponse {
        let gpus = node_gpus(node, self.gpus_per_node);
        let mut pods: BTreeMap<(String, String, String), Vec<String>> = BTreeMap::new();
        for (index, h) in self.held.get(node).into_iter().flatten() {
            pods.entry((h.namespace.clone(), h.name.clone(), h.container.clone()))
                .or_default()
                .extend(uuids(&gpus, &[*index]));
        }
        ListPodResourcesResponse {
            pod_resources: pods
                .into_iter()
                .map(|((namespace, name, container), device_ids)| PodResources {
                    name,
                    namespace,
                    containers: vec![ContainerResources {
                        name: container,
                        devices: vec![ContainerDevices {
                            resource_name: GPU_RESOURCE.to_owned(),
                            device_ids,
                        }],
                    }],
                })
                .collect(),
        }
    }

    /// The GPU UUIDs each pod (`namespace/name`) holds on `node`.
    #[must_use]
    pub fn holders(&self, node: &str) -> BTreeMap<String, Vec<String>> {
        let gpus = node_gpus(node, self.gpus_per_node);
        let mut pods: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (index, h) in self.held.get(node).into_iter().flatten() {
            pods.entry(format!("{}/{}", h.namespace, h.name))
                .or_default()
                .extend(uuids(&gpus, &[*index]));
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
    fn a_pod_asking_for_no_gpu_holds_none() {
        let mut plugin = DevicePlugin::new(8);
        assert!(plugin.allocate("n", &pod("cpu", 0)).unwrap().is_empty());
        assert!(plugin.holders("n").is_empty());
    }
}

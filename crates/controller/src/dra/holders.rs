//! Which pods hold a node's failed GPUs, from what the API server says about Dynamic Resource
//! Allocation. Pure: it reads the node's `ResourceSlices`, the `ResourceClaims` of its pods'
//! namespaces and the node's pods, and answers either the pods (a GPU-scoped drain evicts only
//! those) or why it cannot tell (the caller then drains the whole node and says why).
//!
//! The chain: a failed GPU's UUID → the device of a current `ResourceSlice` on the node whose
//! `uuid` (or, for a partition such as a MIG device, `parentUUID`) attribute carries it → the
//! `ResourceClaims` whose `status.allocation.devices.results` name that device (driver, pool,
//! device) → the pods those claims are reserved for (`status.reservedFor`) or that name them
//! (`spec.resourceClaims[].resourceClaimName`, `status.resourceClaimStatuses[]`).
//!
//! Pods asking for an `nvidia.com/...` extended resource hold GPUs through the device plugin,
//! which the API does not map to devices: those come from the assignment the node's agent
//! publishes ([`super::device_plugin`]), and the answer is the union of both ways.
//!
//! Unknown rather than a guess whenever a holder could escape the chain: a device-plugin pod the
//! agent's assignment does not cover (see [`super::device_plugin`]); a GPU no slice on the node
//! publishes while a pod on the node uses claims; a claim on a failed GPU reserved for something
//! other than a pod; claims used on a server that does not serve DRA.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, Pod};
use kube::ResourceExt;

use super::{
    device_plugin::{PluginPod, plugin_holders},
    pod_key::{PodKey, finished, key},
    wire::{ResourceClaim, ResourceSlice},
};

/// Resource names under this prefix are GPUs (or their partitions) handed out by a device plugin.
pub const DEVICE_PLUGIN_GPU_PREFIX: &str = "nvidia.com/";

/// The answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Holders {
    /// Exactly these pods hold the failed GPUs (sorted; may be empty: the GPUs are idle).
    Known(Vec<PodKey>),
    /// The mapping cannot be told from the API; the reason, for status and Events.
    Unknown(String),
}

/// A device as a claim's allocation names it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct DeviceId {
    /// The driver.
    pub driver: String,
    /// The pool.
    pub pool: String,
    /// The device's name in the pool.
    pub device: String,
}

impl std::fmt::Display for DeviceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.driver, self.pool, self.device)
    }
}

/// What the mapping reads of one node, besides its pods.
#[derive(Clone, Copy, Debug)]
pub struct Sources<'a> {
    /// The `ResourceClaims` of the namespaces of the node's pods that use claims.
    pub claims: &'a [ResourceClaim],
    /// The node's `ResourceSlices`.
    pub slices: &'a [ResourceSlice],
    /// Whether the server serves `resource.k8s.io/v1` (else nothing is allocated through DRA).
    pub dra_served: bool,
    /// The node's `gpuremediation.dev/gpu-pods` annotation: its agent's device-plugin assignment.
    pub gpu_pods: Option<&'a str>,
    /// The pods the assignment gives a failed GPU that the server has bound to other nodes
    /// (looked up for [`super::device_plugin::named_off_node`]).
    pub named_elsewhere: &'a [Pod],
    /// Now, to judge the assignment's age.
    pub now: jiff::Timestamp,
}

/// The pods on `node` holding any of the GPUs `gpu_uuids`, from `sources` (claims and slices for
/// DRA, the agent's assignment for the device plugin) and `pods` (those bound to the node).
/// Objects of other nodes among the inputs are ignored.
#[must_use]
pub fn pods_holding(node: &str, gpu_uuids: &[String], sources: &Sources<'_>, pods: &[Pod]) -> Holders {
    if gpu_uuids.is_empty() {
        return Holders::Unknown("the fault names no GPU".to_owned());
    }
    let node_pods: Vec<&Pod> = pods.iter().filter(|p| on_node(p, node)).collect();
    let live: Vec<&Pod> = node_pods.iter().copied().filter(|p| !finished(p)).collect();
    let plugin_pods: Vec<(&Pod, String)> = live
        .iter()
        .filter_map(|p| device_plugin_gpu(p).map(|r| (*p, r)))
        .collect();
    let plugin_pods: Vec<PluginPod<'_>> = plugin_pods
        .iter()
        .map(|(pod, resource)| PluginPod { pod, resource })
        .collect();
    let mut holders = match plugin_holders(
        node,
        gpu_uuids,
        &node_pods,
        &plugin_pods,
        sources.named_elsewhere,
        sources.gpu_pods,
        sources.now,
    ) {
        Ok(holders) => holders,
        Err(why) => return Holders::Unknown(why),
    };
    let claim_users = live.iter().find(|p| uses_claims(p));
    let Some(claim_user) = claim_users else {
        // No live pod on the node uses a claim: nothing holds a GPU through DRA.
        return Holders::Known(holders.into_iter().collect());
    };
    if !sources.dra_served {
        return Holders::Unknown(format!(
            "pod {} uses resource claims, but the API server does not serve {}/{} (no Dynamic Resource \
             Allocation)",
            key(claim_user),
            super::wire::GROUP,
            super::wire::VERSION
        ));
    }
    let (claims, slices) = (sources.claims, sources.slices);
    let mut failed = BTreeSet::new();
    for uuid in gpu_uuids {
        let devices = devices_of_gpu(node, uuid, slices);
        if devices.is_empty() {
            return Holders::Unknown(format!(
                "no ResourceSlice of node {node} publishes GPU {uuid} (not allocated through DRA)"
            ));
        }
        failed.extend(devices);
    }
    for claim in claims.iter().filter(|c| allocates_any(c, &failed)) {
        let namespace = claim.namespace().unwrap_or_default();
        let status = claim.status.as_ref();
        for consumer in status.map(|s| s.reserved_for.as_slice()).unwrap_or_default() {
            if consumer.resource != "pods" || !consumer.api_group.is_empty() {
                return Holders::Unknown(format!(
                    "claim {namespace}/{} on a failed GPU is reserved for {} {} (not a pod)",
                    claim.name_any(),
                    consumer.resource,
                    consumer.name
                ));
            }
        }
        holders.extend(
            live.iter()
                .filter(|pod| pod.namespace().unwrap_or_default() == namespace)
                .filter(|pod| uses_claim(pod, claim))
                .map(|pod| key(pod)),
        );
    }
    Holders::Known(holders.into_iter().collect())
}

/// The devices of the node's current slices whose `uuid` or `parentUUID` attribute is `uuid`.
#[must_use]
pub fn devices_of_gpu(node: &str, uuid: &str, slices: &[ResourceSlice]) -> Vec<DeviceId> {
    let current = current_generations(node, slices);
    slices
        .iter()
        .filter(|s| s.spec.node_name.as_deref() == Some(node))
        .filter(|s| {
            current.get(&(s.spec.driver.as_str(), s.spec.pool.name.as_str())) == Some(&s.spec.pool.generation)
        })
        .flat_map(|s| {
            s.spec
                .devices
                .iter()
                .filter(|d| {
                    d.attributes.iter().any(|(name, value)| {
                        is_gpu_identity(name)
                            && value
                                .string
                                .as_deref()
                                .is_some_and(|v| v.eq_ignore_ascii_case(uuid))
                    })
                })
                .map(|d| DeviceId {
                    driver: s.spec.driver.clone(),
                    pool: s.spec.pool.name.clone(),
                    device: d.name.clone(),
                })
        })
        .collect()
}

/// The highest generation of each (driver, pool) on the node: older slices are stale.
fn current_generations<'a>(node: &str, slices: &'a [ResourceSlice]) -> BTreeMap<(&'a str, &'a str), i64> {
    let mut current = BTreeMap::new();
    for s in slices
        .iter()
        .filter(|s| s.spec.node_name.as_deref() == Some(node))
    {
        let generation = current
            .entry((s.spec.driver.as_str(), s.spec.pool.name.as_str()))
            .or_insert(s.spec.pool.generation);
        *generation = (*generation).max(s.spec.pool.generation);
    }
    current
}

/// `uuid` or `parentUUID`, bare (in the driver's own domain) or domain-qualified.
fn is_gpu_identity(attribute: &str) -> bool {
    let name = attribute.rsplit('/').next().unwrap_or(attribute);
    name.eq_ignore_ascii_case("uuid") || name.eq_ignore_ascii_case("parentUUID")
}

fn allocates_any(claim: &ResourceClaim, devices: &BTreeSet<DeviceId>) -> bool {
    claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .is_some_and(|a| {
            a.devices.results.iter().any(|r| {
                devices.contains(&DeviceId {
                    driver: r.driver.clone(),
                    pool: r.pool.clone(),
                    device: r.device.clone(),
                })
            })
        })
}

/// Whether `pod` uses `claim`: the claim is reserved for it, or the pod names it.
fn uses_claim(pod: &Pod, claim: &ResourceClaim) -> bool {
    let claim_name = claim.name_any();
    let reserved = claim.status.as_ref().is_some_and(|s| {
        s.reserved_for
            .iter()
            .any(|c| match (&pod.metadata.uid, c.uid.is_empty()) {
                (Some(uid), false) => *uid == c.uid,
                _ => c.name == pod.name_any(),
            })
    });
    let named_in_spec = pod
        .spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .is_some_and(|rc| {
            rc.iter()
                .any(|c| c.resource_claim_name.as_deref() == Some(claim_name.as_str()))
        });
    let named_in_status = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref())
        .is_some_and(|rc| {
            rc.iter()
                .any(|c| c.resource_claim_name.as_deref() == Some(claim_name.as_str()))
        });
    reserved || named_in_spec || named_in_status
}

/// The first `nvidia.com/...` extended resource any of the pod's containers asks for.
fn device_plugin_gpu(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    containers
        .flat_map(container_resources)
        .find(|r| r.starts_with(DEVICE_PLUGIN_GPU_PREFIX))
}

fn container_resources(container: &Container) -> Vec<String> {
    let Some(resources) = &container.resources else {
        return Vec::new();
    };
    let requests = resources.requests.iter().flat_map(|r| r.keys());
    let limits = resources.limits.iter().flat_map(|r| r.keys());
    requests.chain(limits).cloned().collect()
}

fn on_node(pod: &Pod, node: &str) -> bool {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
}

/// Whether the pod's spec names resource claims.
fn uses_claims(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .is_some_and(|c| !c.is_empty())
}

#[cfg(test)]
#[path = "holders_tests.rs"]
mod tests;

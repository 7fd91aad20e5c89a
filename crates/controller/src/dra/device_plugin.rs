//! Which device-plugin pods hold a node's failed GPUs, from the assignment the node's agent
//! publishes (`gpuremediation.dev/gpu-pods`, read from the kubelet's pod-resources API; see
//! `gpu_remediation_api::gpu_pods`). Pure.
//!
//! Trusted only as far as it can be checked against the API server's pods, and unknown (the caller
//! drains the whole node, saying why) whenever a holder could escape it:
//! - no assignment on the node, one that does not parse, or one older than
//!   [`GPU_PODS_MAX_AGE_SECONDS`];
//! - a live pod on the node asking for an `nvidia.com/...` resource that the assignment does not
//!   name, or that was created after the assignment was read (the kubelet names pods without a
//!   UID, so a newer pod of the same name is not the one it saw);
//! - a pod named with a device the agent could not tie to a GPU (a MIG device it did not read: one
//!   it read is named with its parent GPU, so a MIG device's fault reaches only its own pods);
//! - the assignment giving a failed GPU to a pod that runs on another node: a node's agent (perhaps
//!   compromised) never makes the controller act on pods elsewhere (holders are only ever taken
//!   from the node's own pods), and a mapping that does not match the node's pods is not believed
//!   for the rest either. A named pod that is merely gone (evicted since the read) holds nothing.

use std::collections::{BTreeMap, BTreeSet};

use gpu_remediation_api::gpu_pods::{
    GPU_PODS_ANNOTATION, GPU_PODS_CLOCK_SLACK_SECONDS, GPU_PODS_MAX_AGE_SECONDS, GpuPods, PodDevices,
};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Pod;

use super::pod_key::{PodKey, finished, key};

/// How far the node's clock (which stamps `readAt`) may be behind the API server's (which stamps
/// a pod's creation): a pod created this close before the read counts as created after it (the
/// agent stamps a changed assignment again once this has passed).
pub const CLOCK_SLACK: SignedDuration = SignedDuration::from_secs(GPU_PODS_CLOCK_SLACK_SECONDS);

/// A live pod of the node asking for an `nvidia.com/...` resource, and the first such resource.
#[derive(Clone, Copy, Debug)]
pub struct PluginPod<'a> {
    /// The pod.
    pub pod: &'a Pod,
    /// The resource it asks for (for the reason).
    pub resource: &'a str,
}

/// The pods among `node_pods` (every pod bound to the node, finished ones too) holding any of
/// `gpu_uuids` through the device plugin, as the node's `annotation` says; `plugin_pods` are the
/// live ones that ask for an `nvidia.com/...` resource; `elsewhere`, the pods the assignment names
/// as holders that the API server has on other nodes (see [`named_off_node`]). `Err`: why the
/// assignment cannot be trusted.
pub fn plugin_holders(
    node: &str,
    gpu_uuids: &[String],
    node_pods: &[&Pod],
    plugin_pods: &[PluginPod<'_>],
    elsewhere: &[Pod],
    annotation: Option<&str>,
    now: Timestamp,
) -> Result<BTreeSet<PodKey>, String> {
    let first = plugin_pods.first();
    let Some(text) = annotation else {
        return match first {
            // No device-plugin pod, no assignment needed.
            None => Ok(BTreeSet::new()),
            Some(p) => Err(format!(
                "pod {} asks for {} through the device plugin, and node {node} carries no {GPU_PODS_ANNOTATION} \
                 assignment (no agent reading the kubelet's pod-resources API)",
                key(p.pod),
                p.resource
            )),
        };
    };
    let assignment = GpuPods::parse(text)
        .map_err(|e| format!("the {GPU_PODS_ANNOTATION} assignment on node {node} does not parse: {e}"))?;
    let read_at = assignment.read_at.0;
    let age = now.duration_since(read_at);
    if age > SignedDuration::from_secs(GPU_PODS_MAX_AGE_SECONDS) {
        return Err(format!(
            "the {GPU_PODS_ANNOTATION} assignment on node {node} was read at {read_at}, {}s ago: stale (older \
             than {GPU_PODS_MAX_AGE_SECONDS}s; is the node's agent running?)",
            age.as_secs()
        ));
    }
    let by_name: BTreeMap<(&str, &str), Vec<&PodDevices>> =
        assignment.pods.iter().fold(BTreeMap::new(), |mut map, entry| {
            map.entry((entry.namespace.as_str(), entry.name.as_str()))
                .or_insert_with(Vec::new)
                .push(entry);
            map
        });
    let omitted = if assignment.omitted > 0 {
        format!(" ({} pods were left out of it)", assignment.omitted)
    } else {
        String::new()
    };
    for p in plugin_pods {
        let (namespace, name) = (
            p.pod.metadata.namespace.as_deref().unwrap_or_default(),
            p.pod.metadata.name.as_deref().unwrap_or_default(),
        );
        let Some(entries) = by_name.get(&(namespace, name)) else {
            return Err(format!(
                "pod {} asks for {} through the device plugin but is not in node {node}'s {GPU_PODS_ANNOTATION} \
                 assignment read at {read_at}{omitted}",
                key(p.pod),
                p.resource
            ));
        };
        if let Some(created) = p.pod.metadata.creation_timestamp.as_ref().map(|t| t.0)
            && created > read_at - CLOCK_SLACK
        {
            return Err(format!(
                "pod {} was created at {created}, after node {node}'s {GPU_PODS_ANNOTATION} assignment was read \
                 at {read_at} (the kubelet names pods without a UID, so the assignment may be another pod's)",
                key(p.pod)
            ));
        }
        if let Some(device) = entries.iter().flat_map(|e| e.unmapped.iter()).next() {
            return Err(format!(
                "pod {} holds device {device}, which node {node}'s agent could not tie to a GPU UUID (a MIG \
                 device the agent did not read, or an index it does not know)",
                key(p.pod)
            ));
        }
    }
    let failed = |uuid: &String| gpu_uuids.iter().any(|f| f.eq_ignore_ascii_case(uuid));
    let mut holders = BTreeSet::new();
    for entry in assignment.pods.iter().filter(|e| e.gpus.iter().any(failed)) {
        let named = |pod: &&&Pod| {
            pod.metadata.namespace.as_deref() == Some(entry.namespace.as_str())
                && pod.metadata.name.as_deref() == Some(entry.name.as_str())
        };
        match node_pods.iter().find(named) {
            Some(pod) if !finished(pod) => {
                holders.insert(key(pod));
            }
            // A finished pod holds nothing any more.
            Some(_) => {}
            None => {
                let bound_elsewhere = |pod: &&Pod| {
                    let bound = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
                    bound.is_some_and(|n| n != node)
                        && pod.metadata.namespace.as_deref() == Some(entry.namespace.as_str())
                        && pod.metadata.name.as_deref() == Some(entry.name.as_str())
                };
                if let Some(other) = elsewhere.iter().find(bound_elsewhere) {
                    return Err(format!(
                        "node {node}'s {GPU_PODS_ANNOTATION} assignment gives failed GPU {} to pod {}/{}, which \
                         runs on node {}: the assignment does not match the node's pods",
                        entry.gpus.iter().find(|u| failed(u)).map_or("", String::as_str),
                        entry.namespace,
                        entry.name,
                        other
                            .spec
                            .as_ref()
                            .and_then(|s| s.node_name.as_deref())
                            .unwrap_or("none")
                    ));
                }
                // Gone since the agent's read (evicted, deleted): it holds nothing.
            }
        }
    }
    Ok(holders)
}

/// The pods (namespace, name) the node's assignment gives any of `gpu_uuids` that are not bound to
/// the node (`node_pods`): the caller looks them up, so a pod named there that runs on another
/// node is told from one that is merely gone. Nothing for an assignment that does not parse.
#[must_use]
pub fn named_off_node(
    gpu_uuids: &[String],
    node_pods: &[&Pod],
    annotation: Option<&str>,
) -> Vec<(String, String)> {
    let Some(assignment) = annotation.and_then(|text| GpuPods::parse(text).ok()) else {
        return Vec::new();
    };
    assignment
        .pods
        .into_iter()
        .filter(|e| {
            e.gpus
                .iter()
                .any(|u| gpu_uuids.iter().any(|f| f.eq_ignore_ascii_case(u)))
        })
        .filter(|e| {
            !node_pods.iter().any(|pod| {
                pod.metadata.namespace.as_deref() == Some(e.namespace.as_str())
                    && pod.metadata.name.as_deref() == Some(e.name.as_str())
            })
        })
        .map(|e| (e.namespace, e.name))
        .collect()
}

#[cfg(test)]
#[path = "device_plugin_tests.rs"]
mod tests;

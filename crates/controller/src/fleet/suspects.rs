//! The failures a policy's suspect cause is looked for among, read from the records kept and the
//! nodes unhealthy now, and the nodes carrying the suspect value. Pure.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use gpu_remediation_api::{GpuRemediation, GpuRemediationPolicySpec, correlated::SuspectStatus};
use jiff::Timestamp;

use crate::{
    budget::suspect::{Failure, suspect},
    detect::Evidence,
    observe::NodeView,
    time::{minus, signed},
};

/// With `safety.suspect`: the suspect named now (if any), and the governed nodes carrying it.
pub(super) fn named<N: NodeView>(
    policy: &str,
    spec: &GpuRemediationPolicySpec,
    nodes: &[&N],
    unhealthy: &[(&N, Evidence)],
    remediations: &[Arc<GpuRemediation>],
    now: Timestamp,
) -> Option<(SuspectStatus, BTreeSet<String>)> {
    let config = spec.safety.suspect.as_ref()?;
    let attributes = config.attributes();
    let since = minus(now, signed(config.window.as_std()));
    // One failure per node and episode (when its trigger began to hold).
    let mut episodes: BTreeSet<(String, Timestamp)> = remediations
        .iter()
        .filter(|r| r.spec.policy_name == policy)
        .filter_map(|r| Some((r.spec.node_name.clone(), r.spec.trigger.since.as_ref()?.0)))
        .filter(|(_, at)| *at >= since)
        .collect();
    episodes.extend(
        unhealthy
            .iter()
            .filter(|(_, e)| e.since >= since)
            .map(|(n, e)| (n.node_name().to_owned(), e.since)),
    );
    let by_name: BTreeMap<String, &N> = nodes.iter().map(|n| (n.node_name().to_owned(), *n)).collect();
    let failures: Vec<Failure> = episodes
        .iter()
        .map(|(node, _)| Failure {
            attributes: by_name
                .get(node)
                .map(|n| values(n, &attributes))
                .unwrap_or_default(),
        })
        .collect();
    let mut found = suspect(
        &failures,
        &attributes,
        &config.share,
        config.min_failures,
        config.window,
    )?;
    found.holding = config.hold;
    let carrying = by_name
        .iter()
        .filter(|(_, n)| values(n, &attributes).get(&found.attribute) == Some(&found.value))
        .map(|(name, _)| name.clone())
        .collect();
    Some((found, carrying))
}

/// The suspect named now, if no suspect or another was named before: one Event.
pub(super) fn newly_named(
    now: Option<&SuspectStatus>,
    before: Option<&SuspectStatus>,
) -> Option<SuspectStatus> {
    now.filter(|s| before.is_none_or(|p| (&p.attribute, &p.value) != (&s.attribute, &s.value)))
        .cloned()
}

/// A node's values of `attributes`: its labels, and `nodeInfo.*` from its status.
fn values(node: &(impl NodeView + ?Sized), attributes: &[String]) -> BTreeMap<String, String> {
    let info = node.node_info();
    attributes
        .iter()
        .filter_map(|attribute| {
            let value = match attribute.strip_prefix("nodeInfo.") {
                Some("kernelVersion") => info.map(|i| i.kernel_version),
                Some("kubeletVersion") => info.map(|i| i.kubelet_version),
                Some("osImage") => info.map(|i| i.os_image),
                Some("containerRuntimeVersion") => info.map(|i| i.container_runtime_version),
                _ => node.label(attribute),
            }?;
            (!value.is_empty()).then(|| (attribute.clone(), value.to_owned()))
        })
        .collect()
}

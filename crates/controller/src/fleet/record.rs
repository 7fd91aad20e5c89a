//! The record a policy's admission creates for one node: its name (the same node, policy and
//! episode always give the same name), its spec with the node's UID and the policy's snapshot,
//! its labels and finalizer. Pure.

use std::collections::BTreeMap;

use gpu_remediation_api::{
    GpuRemediation, GpuRemediationPolicy, GpuRemediationSpec,
    constants::{NODE_LABEL, POLICY_LABEL, REMEDIATION_FINALIZER},
    remediation::{PolicySnapshot, TriggerRecord},
};
use jiff::Timestamp;
use k8s_openapi::{api::core::v1::Node, apimachinery::pkg::apis::meta::v1::Time};
use kube::ResourceExt;

use crate::detect::Evidence;

/// The remediation to create for a node admitted under a policy; `previous` is when the node's
/// previous incident on record started.
#[must_use]
pub fn new_remediation(
    policy: &GpuRemediationPolicy,
    node: &Node,
    evidence: &Evidence,
    previous: Option<Timestamp>,
) -> GpuRemediation {
    let node_name = node.name_any();
    let policy_name = policy.name_any();
    let trigger = &policy.spec.triggers[evidence.trigger];
    let mut remediation = GpuRemediation::new(
        &remediation_name(&node_name, &policy_name, evidence.since),
        GpuRemediationSpec {
            node_name: node_name.clone(),
            policy_name: policy_name.clone(),
            trigger: TriggerRecord {
                condition_type: evidence.condition_type.clone(),
                status: trigger.status,
                reason: evidence.reason.clone(),
                message: evidence.message.clone(),
                since: Some(Time(evidence.since)),
            },
            action: trigger.action.unwrap_or(policy.spec.action),
            mode: policy.spec.mode,
            node_uid: node.metadata.uid.clone(),
            previous_incident: previous.map(Time),
            policy_snapshot: Some(snapshot_of(policy)),
            hardware: None,
        },
    );
    // The policy's labels travel with the record, so a controller scoped by a policy selector
    // keeps governing its records after the policy is deleted (and never sees another's).
    let mut labels: BTreeMap<String, String> = policy.labels().clone();
    for (key, value) in [(NODE_LABEL, &node_name), (POLICY_LABEL, &policy_name)] {
        // Label values are limited to 63 characters; longer names are still in the spec.
        if value.len() <= 63 {
            labels.insert(key.to_owned(), value.clone());
        }
    }
    remediation.metadata.labels = Some(labels);
    remediation.metadata.finalizers = Some(vec![REMEDIATION_FINALIZER.to_owned()]);
    remediation
}

/// The rules a recycle follows once admitted: the policy as it is now.
#[must_use]
pub fn snapshot_of(policy: &GpuRemediationPolicy) -> PolicySnapshot {
    PolicySnapshot {
        generation: policy.metadata.generation,
        triggers: policy.spec.triggers.clone(),
        drain: policy.spec.drain.clone(),
        replacement: policy.spec.replacement.clone(),
        release: policy.spec.release.clone(),
        ladder: policy.spec.ladder.clone(),
    }
}

/// `<node>-<6 hex digits>`: the same node, policy and episode always give the same name, so a
/// repeated create (a retried pass, a new leader) finds the existing record instead of a second.
#[must_use]
pub fn remediation_name(node: &str, policy: &str, since: Timestamp) -> String {
    // FNV-1a: small, stable across builds and platforms (std's hasher is not).
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in node
        .bytes()
        .chain([0])
        .chain(policy.bytes())
        .chain([0])
        .chain(since.as_second().to_be_bytes())
    {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    let suffix = format!("{:06x}", hash & 0xff_ffff);
    // Keep the whole name a valid object name (at most 253 characters).
    let prefix: String = node.chars().take(253 - 7).collect();
    format!("{prefix}-{suffix}")
}

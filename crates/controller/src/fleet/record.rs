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
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

use crate::{
    observe::NodeView,
    {detect::Evidence, record_name::remediation_name},
};

/// The remediation to create for a node admitted under a policy; `previous` is when the node's
/// previous incident on record started.
#[must_use]
pub fn new_remediation(
    policy: &GpuRemediationPolicy,
    node: &(impl NodeView + ?Sized),
    evidence: &Evidence,
    previous: Option<Timestamp>,
) -> GpuRemediation {
    let node_name = node.node_name().to_owned();
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
            node_uid: node.node_uid().map(str::to_owned),
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
        validation: policy.spec.validation.clone(),
        diagnostics: policy.spec.diagnostics.clone(),
    }
}

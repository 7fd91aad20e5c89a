//! The leak, measured: pods the scheduler placed on a node after its fault began, which a
//! quarantine exists to prevent. Pure: it reads pods and remediation records.
//!
//! A pod counts when its `PodScheduled` condition turned `True` at or after the fault's start
//! (the trigger condition's `lastTransitionTime`, as the remediation records it). `DaemonSet`
//! pods (they go wherever the node is, tolerating every taint) and mirror pods (static, never
//! scheduled) are not placements a quarantine could stop, and are not counted. Both times are to
//! the second (the API's), so a pod placed within the fault's own second counts even if it came
//! just before it.

use std::sync::Arc;

use gpu_remediation_api::GpuRemediation;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

/// The annotation the kubelet puts on the API copy of a static pod.
const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// How many of `pods` the scheduler placed at or after `since`.
#[must_use]
pub fn scheduled_after(pods: &[Pod], since: Timestamp) -> u32 {
    let count = pods
        .iter()
        .filter(|pod| {
            !pod.annotations().contains_key(MIRROR_ANNOTATION)
                && !pod.owner_references().iter().any(|o| o.kind == "DaemonSet")
        })
        .filter_map(scheduled_at)
        .filter(|at| *at >= since)
        .count();
    u32::try_from(count).unwrap_or(u32::MAX)
}

/// When the pod's `PodScheduled` condition turned `True`, if it has.
#[must_use]
pub fn scheduled_at(pod: &Pod) -> Option<Timestamp> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "PodScheduled" && c.status == "True")?
        .last_transition_time
        .as_ref()
        .map(|t| t.0)
}

/// The leak summed over `policy`'s remediations on record.
#[must_use]
pub fn on_record(policy: &str, remediations: &[Arc<GpuRemediation>]) -> u32 {
    remediations
        .iter()
        .filter(|r| r.spec.policy_name == policy)
        .filter_map(|r| r.status.as_ref().and_then(|s| s.leaked_pods))
        .fold(0, u32::saturating_add)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::core::v1::{PodCondition, PodStatus},
        apimachinery::pkg::apis::meta::v1::{OwnerReference, Time},
    };
    use kube::api::ObjectMeta;

    use super::*;
    use crate::test_fixtures::at;

    fn pod(scheduled: Option<i64>) -> Pod {
        Pod {
            metadata: ObjectMeta::default(),
            spec: None,
            status: Some(PodStatus {
                conditions: scheduled.map(|secs| {
                    vec![PodCondition {
                        type_: "PodScheduled".into(),
                        status: "True".into(),
                        last_transition_time: Some(Time(at(secs))),
                        ..PodCondition::default()
                    }]
                }),
                ..PodStatus::default()
            }),
        }
    }

    #[test]
    fn pods_scheduled_at_or_after_the_fault_are_the_leak_and_earlier_ones_are_not() {
        let pods = [pod(Some(90)), pod(Some(100)), pod(Some(130)), pod(None)];
        assert_eq!(scheduled_after(&pods, at(100)), 2);
    }

    #[test]
    fn daemon_set_and_mirror_pods_are_not_counted() {
        let mut daemon = pod(Some(120));
        daemon.metadata.owner_references = Some(vec![OwnerReference {
            kind: "DaemonSet".into(),
            name: "agent".into(),
            ..OwnerReference::default()
        }]);
        let mut mirror = pod(Some(120));
        mirror
            .annotations_mut()
            .insert(MIRROR_ANNOTATION.into(), "abc".into());
        assert_eq!(scheduled_after(&[daemon, mirror, pod(Some(120))], at(100)), 1);
    }

    #[test]
    fn the_policy_sums_the_leak_of_its_own_records() {
        let record = |policy: &str, leaked: Option<u32>| {
            let mut r: GpuRemediation = serde_json::from_value(serde_json::json!({
                "apiVersion": "gpuremediation.dev/v1alpha1",
                "kind": "GpuRemediation",
                "metadata": {"name": "r"},
                "spec": {
                    "nodeName": "n1", "policyName": policy, "action": "None", "mode": "Enforce",
                    "trigger": {"conditionType": "GpuHealthy", "status": "False", "reason": "XID79"},
                },
            }))
            .unwrap();
            r.status = Some(gpu_remediation_api::GpuRemediationStatus {
                leaked_pods: leaked,
                ..gpu_remediation_api::GpuRemediationStatus::default()
            });
            Arc::new(r)
        };
        let records = [
            record("p", Some(3)),
            record("p", None),
            record("p", Some(2)),
            record("q", Some(7)),
        ];
        assert_eq!(on_record("p", &records), 5);
    }
}

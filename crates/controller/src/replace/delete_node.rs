//! `DeleteNode`: delete the Node object. The pod garbage collector then removes its pods, and the
//! cloud provider or node group brings a new machine on its own schedule (not one-to-one, so no
//! replacement is awaited).
//!
//! Pure: [`plan`] from the node read; what it observes is [`super::deletion_observed`] of the
//! node read again.

use gpu_remediation_api::GpuRemediation;
use k8s_openapi::api::core::v1::Node;
use kube::api::ApiResource;

use super::{
    AdmittedNode,
    plan::{Plan, Write, node_reference},
};
use crate::observe::NodeView;

/// What deleting `remediation`'s node writes, given the node read by name (`node`): a delete of
/// the node admitted, pinned to its UID (a node re-registered under the same name between the read
/// and the delete is not deleted in its place); nothing when it is gone already or is another
/// machine under the same name.
#[must_use]
pub fn plan(remediation: &GpuRemediation, node: Option<&Node>) -> Plan {
    let name = &remediation.spec.node_name;
    let admitted = AdmittedNode::of(remediation, node);
    if let Some(reason) = admitted.gone_because(name) {
        return Plan::nothing(node_reference(name, None), reason);
    }
    let Some(uid) = node.and_then(|node| node.node_uid().map(str::to_owned)) else {
        return Plan::nothing(
            node_reference(name, None),
            format!("node {name} was read without a UID: nothing identifies what to delete"),
        );
    };
    Plan {
        reference: node_reference(name, Some(uid.clone())),
        writes: vec![Write::DeleteWithUid {
            resource: ApiResource::erase::<Node>(&()),
            namespace: None,
            name: name.clone(),
            uid,
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replace::{
        Presence, ReplacementNode, deletion_observed,
        fixtures::{node, remediation},
    };

    fn observe(
        found: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>,
        reference: &gpu_remediation_api::object_reference::ObjectReference,
        node: Presence,
    ) -> crate::replace::Observation {
        deletion_observed(found, reference, node, ReplacementNode::NotExpected)
    }

    #[test]
    fn the_node_admitted_is_deleted_pinned_to_its_uid() {
        let planned = plan(&remediation(Some("uid-gpu-1")), Some(&node()));
        assert_eq!(
            planned.reference,
            node_reference("gpu-1", Some("uid-gpu-1".to_owned()))
        );
        assert_eq!(
            planned.writes,
            [Write::DeleteWithUid {
                resource: ApiResource::erase::<Node>(&()),
                namespace: None,
                name: "gpu-1".to_owned(),
                uid: "uid-gpu-1".to_owned(),
            }]
        );
    }

    #[test]
    fn a_node_gone_already_is_nothing_to_delete() {
        let planned = plan(&remediation(Some("uid-gpu-1")), None);
        assert_eq!(
            planned,
            Plan::nothing(
                node_reference("gpu-1", None),
                "node gpu-1 is gone already".to_owned()
            )
        );
    }

    #[test]
    fn a_node_re_registered_under_the_same_name_is_not_deleted() {
        let planned = plan(&remediation(Some("uid-old")), Some(&node()));
        assert_eq!(
            planned.writes,
            [Write::Nothing {
                reason: "node gpu-1 is another machine (UID uid-gpu-1) than the one admitted: ours is gone"
                    .to_owned()
            }]
        );
        assert_eq!(planned.reference.uid, None);
    }

    #[test]
    fn a_record_from_before_uids_were_kept_deletes_the_node_of_that_name() {
        let planned = plan(&remediation(None), Some(&node()));
        assert!(matches!(
            planned.writes.as_slice(),
            [Write::DeleteWithUid { uid, .. }] if uid == "uid-gpu-1"
        ));
    }

    #[test]
    fn the_target_is_the_node_of_the_recorded_uid() {
        let reference = node_reference("gpu-1", Some("uid-gpu-1".to_owned()));
        let seen = node();
        let observed = observe(Some(&seen.metadata), &reference, Presence::Present);
        assert_eq!(observed.target, Presence::Present);
        let other = node_reference("gpu-1", Some("uid-older".to_owned()));
        assert_eq!(
            observe(Some(&seen.metadata), &other, Presence::Gone).target,
            Presence::Gone
        );
        assert_eq!(observe(None, &reference, Presence::Gone).target, Presence::Gone);
    }
}

//! `DeleteNodeClaim`: delete the Karpenter `NodeClaim` whose `status.nodeName` names the node.
//! Karpenter's termination finalizer then deletes the node and the instance. Karpenter provisions
//! for pending pods on its own schedule (often while the drain runs), not one-to-one per deleted
//! claim, so no replacement is awaited.
//!
//! The claim's status is Karpenter's, not the node's: it is deleted only if its
//! `status.providerID` is also the node's `spec.providerID` (the instance the node runs on), so a
//! node re-registered under the name of another claim's node never has that claim deleted.
//!
//! Pure: [`plan`] from the claims listed and the node read; what it observes is
//! [`super::deletion_observed`] of the claim read.

use gpu_remediation_api::{GpuRemediation, object_reference::ObjectReference};
use k8s_openapi::api::core::v1::Node;
use kube::{
    api::{ApiResource, DynamicObject},
    core::GroupVersionKind,
};
use serde_json::Value;

use super::{
    AdmittedNode, TriggerReplacementError,
    plan::{Plan, Write, node_reference},
};
use crate::observe::NodeView;

/// Karpenter's API group.
pub const GROUP: &str = "karpenter.sh";

/// The claim whose `status.nodeName` is `node`, among `claims`.
#[must_use]
pub fn claim_for_node<'a>(claims: &'a [DynamicObject], node: &str) -> Option<&'a DynamicObject> {
    claims
        .iter()
        .find(|claim| claim.data.pointer("/status/nodeName").and_then(Value::as_str) == Some(node))
}

/// What deleting `remediation`'s `NodeClaim` writes, given the claims listed (of kind `resource`)
/// and the node read by name: the claim naming the node deleted, pinned to its UID, once its
/// provider ID is the node's. Nothing when the claim is being deleted already, when neither claim
/// nor node is left (a retry), or when the node is another machine than the one admitted; a
/// refusal, writing nothing, when no claim names a live node or the provider IDs differ.
pub fn plan(
    remediation: &GpuRemediation,
    node: Option<&Node>,
    resource: &ApiResource,
    claims: &[DynamicObject],
) -> Result<Plan, TriggerReplacementError> {
    let node_name = &remediation.spec.node_name;
    let admitted = AdmittedNode::of(remediation, node);
    if let AdmittedNode::Another { .. } = admitted {
        // The claim naming this name now is the new machine's.
        let reason = admitted.gone_because(node_name).unwrap_or_default();
        return Ok(Plan::nothing(node_reference(node_name, None), reason));
    }
    let Some(claim) = claim_for_node(claims, node_name) else {
        return match admitted {
            AdmittedNode::Present(_) => Err(TriggerReplacementError::NodeClaimNotFound {
                node: node_name.clone(),
            }),
            _ => Ok(Plan::nothing(
                node_reference(node_name, None),
                format!("no NodeClaim names node {node_name}, and the node is gone: nothing left to delete"),
            )),
        };
    };
    let name = claim.metadata.name.clone().unwrap_or_default();
    let reference = ObjectReference {
        api_version: resource.api_version.clone(),
        kind: resource.kind.clone(),
        name: name.clone(),
        namespace: None,
        uid: claim.metadata.uid.clone(),
    };
    if claim.metadata.deletion_timestamp.is_some() {
        return Ok(Plan::nothing(
            reference,
            format!("NodeClaim {name} is being deleted already"),
        ));
    }
    if let AdmittedNode::Present(node) = admitted {
        same_instance(claim, node).map_err(|why| TriggerReplacementError::NodeClaimNotTheNodes {
            claim: name.clone(),
            node: node_name.clone(),
            why,
        })?;
    }
    let Some(uid) = reference.uid.clone() else {
        return Err(TriggerReplacementError::Unidentified {
            kind: resource.kind.clone(),
            name,
        });
    };
    Ok(Plan {
        reference,
        writes: vec![Write::DeleteWithUid {
            resource: resource.clone(),
            namespace: None,
            name,
            uid,
        }],
    })
}

/// Whether `claim`'s `status.providerID` is `node`'s `spec.providerID`; what differs, if not.
fn same_instance(claim: &DynamicObject, node: &Node) -> Result<(), String> {
    let claimed = claim.data.pointer("/status/providerID").and_then(Value::as_str);
    let actual = node.provider_id();
    match (claimed, actual) {
        (Some(claimed), Some(actual)) if claimed == actual => Ok(()),
        (claimed, actual) => Err(format!(
            "its status.providerID is {} and the node's spec.providerID is {}",
            claimed.unwrap_or("unset"),
            actual.unwrap_or("unset")
        )),
    }
}

/// The API resource of a recorded reference (Karpenter's `v1` when it names none).
#[must_use]
pub fn resource_of(reference: &ObjectReference) -> ApiResource {
    let (group, version) = reference.api_version.split_once('/').unwrap_or((GROUP, "v1"));
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(group, version, &reference.kind),
        "nodeclaims",
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::replace::fixtures::{node, node_claims, remediation};

    fn served() -> ApiResource {
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, "v1", "NodeClaim"), "nodeclaims")
    }

    fn claim(name: &str, node: Option<&str>) -> DynamicObject {
        let mut claim = DynamicObject::new(name, &served());
        if let Some(node) = node {
            claim.data = json!({"status": {"nodeName": node}});
        }
        claim
    }

    #[test]
    fn the_claim_is_the_one_whose_status_names_the_node() {
        let claims = [
            claim("default-a", Some("ip-1")),
            claim("default-b", None),
            claim("default-c", Some("ip-3")),
        ];
        assert_eq!(
            claim_for_node(&claims, "ip-3").and_then(|c| c.metadata.name.as_deref()),
            Some("default-c")
        );
        assert!(claim_for_node(&claims, "ip-9").is_none());
    }

    #[test]
    fn the_claim_naming_the_node_and_its_instance_is_deleted_pinned_to_its_uid() {
        let planned = plan(
            &remediation(Some("uid-gpu-1")),
            Some(&node()),
            &served(),
            &node_claims(),
        )
        .expect("corroborated");
        assert_eq!(
            planned.writes,
            [Write::DeleteWithUid {
                resource: served(),
                namespace: None,
                name: "gpu-pool-x7k2p".to_owned(),
                uid: "uid-claim-1".to_owned(),
            }]
        );
        assert_eq!(
            (planned.reference.kind.as_str(), planned.reference.uid.as_deref()),
            ("NodeClaim", Some("uid-claim-1"))
        );
    }

    #[test]
    fn a_claim_naming_the_node_on_another_instance_deletes_nothing() {
        let mut claims = node_claims();
        claims[0].data["status"]["providerID"] = "aws:///us-east-1b/i-0ffffff".into();
        let refused =
            plan(&remediation(Some("uid-gpu-1")), Some(&node()), &served(), &claims).expect_err("refused");
        assert_eq!(
            refused.to_string(),
            "NodeClaim gpu-pool-x7k2p is not node gpu-1's (its status.providerID is \
             aws:///us-east-1b/i-0ffffff and the node's spec.providerID is aws:///us-east-1a/i-0a1b2c3d): \
             nothing was deleted"
        );
    }

    #[test]
    fn a_node_without_a_provider_id_deletes_no_claim() {
        let mut bare = node();
        bare.spec = None;
        let refused = plan(
            &remediation(Some("uid-gpu-1")),
            Some(&bare),
            &served(),
            &node_claims(),
        )
        .expect_err("refused");
        assert!(
            matches!(&refused, TriggerReplacementError::NodeClaimNotTheNodes { why, .. }
                if why == "its status.providerID is aws:///us-east-1a/i-0a1b2c3d and the node's spec.providerID is unset"),
            "{refused:?}"
        );
    }

    #[test]
    fn a_node_no_claim_names_is_not_a_karpenter_node() {
        let others = [node_claims().remove(1)];
        let refused =
            plan(&remediation(Some("uid-gpu-1")), Some(&node()), &served(), &others).expect_err("refused");
        assert!(matches!(
            refused,
            TriggerReplacementError::NodeClaimNotFound { .. }
        ));
    }

    #[test]
    fn a_retry_after_the_claim_and_the_node_went_is_done() {
        let others = [node_claims().remove(1)];
        let planned = plan(&remediation(Some("uid-gpu-1")), None, &served(), &others).expect("done");
        assert_eq!(planned.reference, node_reference("gpu-1", None));
        assert!(matches!(planned.writes.as_slice(), [Write::Nothing { .. }]));
    }

    #[test]
    fn a_claim_still_naming_a_node_gone_already_is_deleted_on_its_name_alone() {
        // Nothing is left to compare the provider ID with, and a node that is gone can claim nothing.
        let planned =
            plan(&remediation(Some("uid-gpu-1")), None, &served(), &node_claims()).expect("no refusal");
        assert!(
            matches!(planned.writes.as_slice(), [Write::DeleteWithUid { name, uid, .. }]
                if name == "gpu-pool-x7k2p" && uid == "uid-claim-1"),
            "{:?}",
            planned.writes
        );
    }

    #[test]
    fn a_claim_being_deleted_is_not_deleted_again() {
        let mut claims = node_claims();
        claims[0].metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::UNIX_EPOCH,
        ));
        let planned =
            plan(&remediation(Some("uid-gpu-1")), Some(&node()), &served(), &claims).expect("no refusal");
        assert_eq!(
            planned,
            Plan::nothing(
                planned.reference.clone(),
                "NodeClaim gpu-pool-x7k2p is being deleted already".to_owned()
            )
        );
        assert_eq!(planned.reference.uid.as_deref(), Some("uid-claim-1"));
    }

    #[test]
    fn a_new_machine_under_the_nodes_name_keeps_its_claim() {
        let planned = plan(
            &remediation(Some("uid-gpu-1-before")),
            Some(&node()),
            &served(),
            &node_claims(),
        )
        .expect("no refusal");
        assert_eq!(planned.reference, node_reference("gpu-1", None));
        assert!(matches!(planned.writes.as_slice(), [Write::Nothing { .. }]));
    }
}

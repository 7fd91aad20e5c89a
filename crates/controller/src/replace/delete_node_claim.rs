//! `DeleteNodeClaim`: delete the Karpenter `NodeClaim` whose `status.nodeName` names the node.
//! Karpenter's termination finalizer then deletes the node and the instance. Karpenter provisions
//! for pending pods on its own schedule (often while the drain runs), not one-to-one per deleted
//! claim, so no replacement is awaited.

use futures::{FutureExt as _, TryFutureExt as _, future::BoxFuture};
use gpu_remediation_api::{GpuRemediation, object_reference::ObjectReference, policy::Replacement};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::{
    api::{ApiResource, DeleteParams, DynamicObject, ListParams},
    core::GroupVersionKind,
};
use serde_json::Value;

use crate::read::{ReadApi, Scope};

use super::{
    Kube, ObserveReplacementError, Replace, TriggerReplacementError, Triggered, node_presence, presence,
    verify::{Observation, ReplacementNode, Reported},
};

/// Karpenter's API group.
pub const GROUP: &str = "karpenter.sh";

/// The `DeleteNodeClaim` strategy.
pub struct DeleteNodeClaim {
    kube: Kube,
}

/// The name of the claim whose `status.nodeName` is `node`, among `claims`.
#[must_use]
pub fn claim_for_node<'a>(claims: &'a [DynamicObject], node: &str) -> Option<&'a DynamicObject> {
    claims
        .iter()
        .find(|claim| claim.data.pointer("/status/nodeName").and_then(Value::as_str) == Some(node))
}

impl DeleteNodeClaim {
    pub(crate) fn new(kube: Kube) -> Self {
        Self { kube }
    }

    async fn delete(&self, remediation: &GpuRemediation) -> Result<ObjectReference, TriggerReplacementError> {
        let node_name = &remediation.spec.node_name;
        let resource = self.kube.served_resource(GROUP, "NodeClaim").await?;
        let claims: ReadApi<DynamicObject> = self.kube.reader.api(Scope::Cluster, &resource);
        // NodeClaims offer no field selector on status.nodeName; their number is the number of
        // Karpenter nodes, and this runs once per replacement.
        let listed =
            claims
                .list(&ListParams::default())
                .await
                .map_err(|source| TriggerReplacementError::Api {
                    action: "listing NodeClaims".to_owned(),
                    source,
                })?;
        let Some(claim) = claim_for_node(&listed.items, node_name) else {
            let nodes: ReadApi<Node> = self.kube.reader.api(Scope::Cluster, &());
            let node = nodes
                .get_opt(node_name)
                .await
                .map_err(|source| TriggerReplacementError::Api {
                    action: format!("reading node {node_name}"),
                    source,
                })?;
            if node.is_none() {
                // A retry after the claim and its node went: nothing left to delete.
                return Ok(ObjectReference {
                    api_version: "v1".to_owned(),
                    kind: "Node".to_owned(),
                    name: node_name.clone(),
                    namespace: None,
                    uid: None,
                });
            }
            return Err(TriggerReplacementError::NodeClaimNotFound {
                node: node_name.clone(),
            });
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
            return Ok(reference);
        }
        self.kube
            .delete_stamped(&claims, &name, reference.uid.as_deref(), &DeleteParams::default())
            .await
            .map_err(|error| error.during(format!("deleting NodeClaim {name}")))?;
        Ok(reference)
    }

    async fn look(
        &self,
        remediation: &GpuRemediation,
        reference: &ObjectReference,
        triggered_at: Timestamp,
    ) -> Result<Observation, ObserveReplacementError> {
        let nodes: ReadApi<Node> = self.kube.reader.api(Scope::Cluster, &());
        let node = nodes
            .get_opt(&remediation.spec.node_name)
            .await
            .map_err(|source| ObserveReplacementError::Api {
                action: format!("reading node {}", remediation.spec.node_name),
                source,
            })?;
        let node = node_presence(
            node.as_ref().map(|node| &node.metadata),
            remediation.spec.node_uid.as_deref(),
            triggered_at,
        );
        if reference.kind == "Node" {
            return Ok(Observation {
                target: node,
                node,
                reported: Reported::Nothing,
                replacement: ReplacementNode::NotExpected,
            });
        }
        let (group, version) = reference.api_version.split_once('/').unwrap_or((GROUP, "v1"));
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(group, version, &reference.kind),
            "nodeclaims",
        );
        let claims: ReadApi<DynamicObject> = self.kube.reader.api(Scope::Cluster, &resource);
        let claim = claims
            .get_opt(&reference.name)
            .await
            .map_err(|source| ObserveReplacementError::Api {
                action: format!("reading NodeClaim {}", reference.name),
                source,
            })?;
        Ok(Observation {
            target: presence(
                claim.as_ref().map(|claim| &claim.metadata),
                reference.uid.as_deref(),
            ),
            node,
            reported: Reported::Nothing,
            replacement: ReplacementNode::NotExpected,
        })
    }
}

impl Replace for DeleteNodeClaim {
    fn trigger<'a>(
        &'a self,
        remediation: &'a GpuRemediation,
        _replacement: &'a Replacement,
    ) -> BoxFuture<'a, Result<Triggered, TriggerReplacementError>> {
        self.delete(remediation).map_ok(Triggered::from).boxed()
    }

    fn observe<'a>(
        &'a self,
        remediation: &'a GpuRemediation,
        reference: &'a ObjectReference,
        triggered_at: Timestamp,
    ) -> BoxFuture<'a, Result<Observation, ObserveReplacementError>> {
        self.look(remediation, reference, triggered_at).boxed()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn claim(name: &str, node: Option<&str>) -> DynamicObject {
        let mut claim = DynamicObject::new(
            name,
            &ApiResource::from_gvk(&GroupVersionKind::gvk(GROUP, "v1", "NodeClaim")),
        );
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
}

//! `DeleteNode`: delete the Node object. The pod garbage collector then removes its pods, and the
//! cloud provider or node group brings a new machine on its own schedule (not one-to-one, so no
//! replacement is awaited).

use futures::{FutureExt as _, TryFutureExt as _, future::BoxFuture};
use gpu_remediation_api::{GpuRemediation, object_reference::ObjectReference, policy::Replacement};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::api::DeleteParams;

use super::{
    Kube, ObserveReplacementError, Replace, TriggerReplacementError, Triggered, node_presence, presence,
};
use crate::{
    read::{ReadApi, Scope},
    replace::verify::{Observation, ReplacementNode, Reported},
};

/// The `DeleteNode` strategy.
pub struct DeleteNode {
    kube: Kube,
}

impl DeleteNode {
    pub(crate) fn new(kube: Kube) -> Self {
        Self { kube }
    }

    async fn delete(&self, remediation: &GpuRemediation) -> Result<ObjectReference, TriggerReplacementError> {
        let node_name = &remediation.spec.node_name;
        let nodes: ReadApi<Node> = self.kube.reader.api(Scope::Cluster, &());
        let action = |verb: &str| format!("{verb} node {node_name}");
        let node = nodes
            .get_opt(node_name)
            .await
            .map_err(|source| TriggerReplacementError::Api {
                action: action("reading"),
                source,
            })?;
        // Only the node admitted: a node re-registered under the same name since is another
        // machine, and ours is gone already.
        let admitted = remediation.spec.node_uid.as_deref();
        let uid = node
            .as_ref()
            .and_then(|node| node.metadata.uid.clone())
            .filter(|uid| admitted.is_none_or(|admitted| admitted == uid));
        if let Some(uid) = &uid {
            // The UID precondition makes sure a node re-registered under the same name between
            // the read and the delete is not deleted in its place; gone already, or replaced by
            // another node of the same name, is done. The claim is stamped first (issue 13).
            self.kube
                .delete_stamped(&nodes, node_name, Some(uid), &DeleteParams::default())
                .await
                .map_err(|error| error.during(action("deleting")))?;
        }
        Ok(ObjectReference {
            api_version: "v1".to_owned(),
            kind: "Node".to_owned(),
            name: node_name.clone(),
            namespace: None,
            uid,
        })
    }

    async fn look(
        &self,
        remediation: &GpuRemediation,
        reference: &ObjectReference,
        triggered_at: Timestamp,
    ) -> Result<Observation, ObserveReplacementError> {
        let nodes: ReadApi<Node> = self.kube.reader.api(Scope::Cluster, &());
        let node = nodes
            .get_opt(&reference.name)
            .await
            .map_err(|source| ObserveReplacementError::Api {
                action: format!("reading node {}", reference.name),
                source,
            })?;
        let meta = node.as_ref().map(|node| &node.metadata);
        Ok(Observation {
            target: presence(meta, reference.uid.as_deref()),
            node: node_presence(meta, remediation.spec.node_uid.as_deref(), triggered_at),
            reported: Reported::Nothing,
            replacement: ReplacementNode::NotExpected,
        })
    }
}

impl Replace for DeleteNode {
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

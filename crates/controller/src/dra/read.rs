//! Reads what [`super::holders`] decides from: the `ResourceSlices` of one node (listed by the
//! `spec.nodeName` field selector, so the cost follows the node, not the fleet), the
//! `ResourceClaims` of the namespaces where the node's pods use claims, and the node itself (its
//! agent's device-plugin assignment). Nothing is cached: the
//! mapping is needed once per GPU-scoped drain.

use std::collections::BTreeSet;

use gpu_remediation_api::gpu_pods::GPU_PODS_ANNOTATION;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    ResourceExt,
    api::{ListParams, ObjectList},
};

use super::{
    device_plugin::named_off_node,
    holders::{Holders, Sources, pods_holding},
    wire::{self, ResourceClaim, ResourceSlice},
};
use crate::{
    observe::NodeView,
    read::{Reader, Scope},
};

/// What the mapping reads of one node.
#[derive(Clone, Debug, Default)]
pub struct NodeDevices {
    /// The node's `ResourceSlices`.
    pub slices: Vec<ResourceSlice>,
    /// The `ResourceClaims` of every namespace where a pod on the node uses a claim.
    pub claims: Vec<ResourceClaim>,
}

/// A read the API server refused.
#[derive(Debug, thiserror::Error)]
pub enum ReadDevicesError {
    /// Listing the node's `ResourceSlices` failed.
    #[error("listing the ResourceSlices of node {node}: {source}")]
    Slices {
        /// The node.
        node: String,
        /// The API error.
        source: kube::Error,
    },
    /// Reading the node (for its agent's device-plugin assignment) failed.
    #[error("reading node {node}: {source}")]
    Node {
        /// The node.
        node: String,
        /// The API error.
        source: kube::Error,
    },
    /// Reading a pod the node's device-plugin assignment names failed.
    #[error("reading pod {pod}, named by the node's GPU assignment: {source}")]
    NamedPod {
        /// The pod.
        pod: String,
        /// The API error.
        source: kube::Error,
    },
    /// Listing a namespace's `ResourceClaims` failed.
    #[error("listing the ResourceClaims of namespace {namespace}: {source}")]
    Claims {
        /// The namespace.
        namespace: String,
        /// The API error.
        source: kube::Error,
    },
}

/// Reads `node`'s slices and the claims its `pods` may use. `None`: the server does not serve
/// `resource.k8s.io/v1` (before Kubernetes 1.34, or DRA turned off), so nothing is allocated
/// through DRA.
pub async fn node_devices(
    reader: &Reader,
    node: &str,
    pods: &[Pod],
) -> Result<Option<NodeDevices>, ReadDevicesError> {
    let params = ListParams::default().fields(&format!("spec.nodeName={node}"));
    let slices = match reader
        .list::<ResourceSlice>(Scope::Cluster, &wire::resource_slices(), &params)
        .await
    {
        Ok(list) => list.items,
        Err(kube::Error::Api(status)) if status.is_not_found() => return Ok(None),
        Err(source) => {
            return Err(ReadDevicesError::Slices {
                node: node.to_owned(),
                source,
            });
        }
    };
    let namespaces: BTreeSet<String> = pods
        .iter()
        .filter(|p| {
            p.spec
                .as_ref()
                .is_some_and(|s| s.resource_claims.as_ref().is_some_and(|c| !c.is_empty()))
        })
        .filter_map(ResourceExt::namespace)
        .collect();
    let mut claims = Vec::new();
    for namespace in namespaces {
        let listed: ObjectList<ResourceClaim> = reader
            .list(
                Scope::Namespace(&namespace),
                &wire::resource_claims(),
                &ListParams::default(),
            )
            .await
            .map_err(|source| ReadDevicesError::Claims { namespace, source })?;
        claims.extend(listed.items);
    }
    Ok(Some(NodeDevices { slices, claims }))
}

/// The pods on `node` (among `pods`, the node's pods) holding the GPUs `gpu_uuids`: reads the
/// node's slices and claims and its agent's device-plugin assignment (the node's
/// `gpuremediation.dev/gpu-pods` annotation), then decides with [`pods_holding`].
pub async fn pods_holding_on(
    reader: &Reader,
    node: &str,
    gpu_uuids: &[String],
    pods: &[Pod],
) -> Result<Holders, ReadDevicesError> {
    let gpu_pods = reader
        .get_opt::<Node>(Scope::Cluster, &(), node)
        .await
        .map_err(|source| ReadDevicesError::Node {
            node: node.to_owned(),
            source,
        })?
        .and_then(|n| n.annotation(GPU_PODS_ANNOTATION).map(str::to_owned));
    let devices = node_devices(reader, node, pods).await?;
    let on_node: Vec<&Pod> = pods
        .iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        .collect();
    let mut named_elsewhere = Vec::new();
    for (namespace, name) in named_off_node(gpu_uuids, &on_node, gpu_pods.as_deref()) {
        let found = reader
            .get_opt::<Pod>(Scope::Namespace(&namespace), &(), &name)
            .await
            .map_err(|source| ReadDevicesError::NamedPod {
                pod: format!("{namespace}/{name}"),
                source,
            })?;
        named_elsewhere.extend(found);
    }
    let sources = Sources {
        named_elsewhere: &named_elsewhere,
        claims: devices.as_ref().map_or(&[], |d| d.claims.as_slice()),
        slices: devices.as_ref().map_or(&[], |d| d.slices.as_slice()),
        dra_served: devices.is_some(),
        gpu_pods: gpu_pods.as_deref(),
        now: jiff::Timestamp::now(),
    };
    Ok(pods_holding(node, gpu_uuids, &sources, pods))
}

//! A fake infrastructure provider for the replacement e2e tests: it plays a cloud node group,
//! Cluster API (the Machine and `MachineSet` controllers) or Karpenter, just far enough for node
//! replacement. When the object standing for a node goes away (the Node itself, its Machine or its
//! `NodeClaim`), it does what the real controllers would: delete the node, then bring up a new
//! simulated node in the same [`Fleet`] with a new Machine or `NodeClaim`.
//!
//! Realism that matters to the controller under test:
//! - Machines and `NodeClaims` carry the real finalizers (`machine.cluster.x-k8s.io`,
//!   `karpenter.sh/termination`), so a delete first shows a deletion timestamp, and the object
//!   disappears only after the node is gone.
//! - Nodes carry the annotations Cluster API sets (`cluster.x-k8s.io/machine`,
//!   `cluster.x-k8s.io/cluster-namespace`); Machines carry `cluster.x-k8s.io/set-name` and
//!   `status.nodeRef`; `NodeClaims` carry `status.nodeName` and `status.providerID` (the node's).
//! - Machines are written at `cluster.x-k8s.io/v1beta2` and `NodeClaims` at `karpenter.sh/v1`, the
//!   upstream storage versions of the CRDs vendored in `e2e/fixtures/`.
//!
//! The provider polls (every 200ms) rather than watching: it is test scaffolding, and polling keeps
//! it obviously correct after restarts of the API server's watch caches.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client,
    api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams},
    core::GroupVersionKind,
};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::fleet::{AddNodesError, Fleet};

/// Node annotation naming the node's Machine (set by Cluster API).
pub const MACHINE_ANNOTATION: &str = "cluster.x-k8s.io/machine";
/// Node annotation naming the namespace of the node's cluster (set by Cluster API).
pub const CLUSTER_NAMESPACE_ANNOTATION: &str = "cluster.x-k8s.io/cluster-namespace";
/// Machine label naming its `MachineSet`.
pub const MACHINE_SET_LABEL: &str = "cluster.x-k8s.io/set-name";
/// Machine label naming its cluster.
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
/// Finalizer the Cluster API Machine controller puts on every Machine.
pub const MACHINE_FINALIZER: &str = "machine.cluster.x-k8s.io";
/// Finalizer Karpenter puts on every `NodeClaim`.
pub const NODE_CLAIM_FINALIZER: &str = "karpenter.sh/termination";
/// `NodeClaim` (and node) label naming the `NodePool`.
pub const NODE_POOL_LABEL: &str = "karpenter.sh/nodepool";

/// Which provider to play.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderKind {
    /// A cloud node group: a deleted Node is replaced by a new one.
    NodeGroup,
    /// Cluster API: every node has a Machine of `MachineSet` `set` in `namespace`.
    ClusterApi {
        /// Namespace of the Machines (and the cluster).
        namespace: String,
        /// Cluster name (`spec.clusterName`).
        cluster: String,
        /// `MachineSet` name (the `cluster.x-k8s.io/set-name` label).
        set: String,
    },
    /// Karpenter: every node has a `NodeClaim` of `NodePool` `pool`.
    Karpenter {
        /// `NodePool` name.
        pool: String,
    },
}

/// A replacement the provider carried out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replaced {
    /// The node that went.
    pub old_node: String,
    /// The node that came.
    pub new_node: String,
}

/// Failure of the provider.
#[derive(Debug, thiserror::Error)]
pub enum RunProviderError {
    /// An API call failed.
    #[error("{action}: {source}")]
    Api {
        /// What was being done.
        action: String,
        /// The error.
        source: kube::Error,
    },
    /// A replacement node could not be registered.
    #[error(transparent)]
    AddNodes(#[from] AddNodesError),
}

fn api_error(action: impl Into<String>) -> impl FnOnce(kube::Error) -> RunProviderError {
    let action = action.into();
    move |source| RunProviderError::Api { action, source }
}

/// The API resource of Cluster API Machines at the storage version.
#[must_use]
pub fn machine_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Machine"),
        "machines",
    )
}

/// The API resource of Karpenter `NodeClaims`.
#[must_use]
pub fn node_claim_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("karpenter.sh", "v1", "NodeClaim"),
        "nodeclaims",
    )
}

/// A running fake provider. Dropping it stops it.
pub struct Provider {
    replaced: Arc<Mutex<Vec<Replaced>>>,
    errors: Arc<Mutex<Vec<String>>>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Provider")
            .field("replaced", &self.replacements())
            .finish_non_exhaustive()
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Provider {
    /// Adopts the fleet's current nodes (creating a Machine or `NodeClaim` for each, as the real
    /// provider would have when it created them) and starts replacing what goes away.
    pub async fn start(
        client: Client,
        fleet: Arc<Fleet>,
        kind: ProviderKind,
    ) -> Result<Self, RunProviderError> {
        let state = ProviderState {
            client,
            fleet,
            kind,
            nodes: BTreeMap::new(),
        };
        let mut state = state;
        for node in state.fleet.node_names() {
            state.adopt(&node).await?;
        }
        let replaced = Arc::new(Mutex::new(Vec::new()));
        let errors = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn(state.run(Arc::clone(&replaced), Arc::clone(&errors)));
        Ok(Self {
            replaced,
            errors,
            task,
        })
    }

    /// The replacements carried out so far, in order.
    #[must_use]
    pub fn replacements(&self) -> Vec<Replaced> {
        self.replaced.lock().expect("provider lock").clone()
    }

    /// Errors met so far (the provider keeps going after one), for test failure messages.
    #[must_use]
    pub fn errors(&self) -> Vec<String> {
        self.errors.lock().expect("provider lock").clone()
    }
}

/// What the provider tracks: node name → the name of the object standing for it (the node's own
/// name for a node group).
struct ProviderState {
    client: Client,
    fleet: Arc<Fleet>,
    kind: ProviderKind,
    nodes: BTreeMap<String, String>,
}

impl ProviderState {
    async fn run(mut self, replaced: Arc<Mutex<Vec<Replaced>>>, errors: Arc<Mutex<Vec<String>>>) {
        loop {
            match self.reconcile().await {
                Ok(done) => replaced.lock().expect("provider lock").extend(done),
                Err(error) => errors.lock().expect("provider lock").push(error.to_string()),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Creates the object standing for `node` and labels the node as the provider would.
    async fn adopt(&mut self, node: &str) -> Result<(), RunProviderError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let object = match &self.kind {
            ProviderKind::NodeGroup => node.to_owned(),
            ProviderKind::ClusterApi {
                namespace,
                cluster,
                set,
            } => {
                let name = format!("{set}-{node}");
                let machine = json!({
                    "apiVersion": "cluster.x-k8s.io/v1beta2",
                    "kind": "Machine",
                    "metadata": {
                        "name": name,
                        "namespace": namespace,
                        "labels": {MACHINE_SET_LABEL: set, CLUSTER_NAME_LABEL: cluster},
                        "finalizers": [MACHINE_FINALIZER],
                    },
                    "spec": {
                        "clusterName": cluster,
                        "bootstrap": {"dataSecretName": format!("{name}-bootstrap")},
                        "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "SandboxMachine", "name": name},
                        "providerID": format!("sandbox://{node}"),
                    },
                });
                let machines: Api<DynamicObject> =
                    Api::namespaced_with(self.client.clone(), namespace, &machine_resource());
                let object: DynamicObject =
                    serde_json::from_value(machine).expect("a Machine is a valid object");
                machines
                    .create(&PostParams::default(), &object)
                    .await
                    .map_err(api_error(format!("creating Machine {namespace}/{name}")))?;
                machines
                    .patch_status(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"status": {"nodeRef": {"name": node}}})),
                    )
                    .await
                    .map_err(api_error(format!("reporting Machine {namespace}/{name} status")))?;
                let annotations = json!({"metadata": {"annotations": {
                    MACHINE_ANNOTATION: name, CLUSTER_NAMESPACE_ANNOTATION: namespace,
                }}});
                nodes
                    .patch(node, &PatchParams::default(), &Patch::Merge(annotations))
                    .await
                    .map_err(api_error(format!("annotating node {node}")))?;
                name
            }
            ProviderKind::Karpenter { pool } => {
                let name = format!("{pool}-{node}");
                let claim = json!({
                    "apiVersion": "karpenter.sh/v1",
                    "kind": "NodeClaim",
                    "metadata": {"name": name, "labels": {NODE_POOL_LABEL: pool}, "finalizers": [NODE_CLAIM_FINALIZER]},
                    "spec": {
                        "nodeClassRef": {"group": "karpenter.sandbox.dev", "kind": "SandboxNodeClass", "name": "default"},
                        "requirements": [],
                    },
                });
                let claims: Api<DynamicObject> = Api::all_with(self.client.clone(), &node_claim_resource());
                let object: DynamicObject =
                    serde_json::from_value(claim).expect("a NodeClaim is a valid object");
                claims
                    .create(&PostParams::default(), &object)
                    .await
                    .map_err(api_error(format!("creating NodeClaim {name}")))?;
                // Karpenter's claim carries the instance's ID, which the node's spec carries too (the
                // controller deletes a claim only when the two match).
                let provider_id = nodes
                    .get(node)
                    .await
                    .map_err(api_error(format!("reading node {node}")))?
                    .spec
                    .and_then(|spec| spec.provider_id)
                    .unwrap_or_else(|| format!("sandbox://{node}"));
                let status = json!({"status": {"nodeName": node, "providerID": provider_id}});
                claims
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(status))
                    .await
                    .map_err(api_error(format!("reporting NodeClaim {name} status")))?;
                nodes
                    .patch(
                        node,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {"labels": {NODE_POOL_LABEL: pool}}})),
                    )
                    .await
                    .map_err(api_error(format!("labelling node {node}")))?;
                name
            }
        };
        self.nodes.insert(node.to_owned(), object);
        Ok(())
    }

    /// One pass: finish the deletion of every object being deleted, and replace every node whose
    /// object went.
    async fn reconcile(&mut self) -> Result<Vec<Replaced>, RunProviderError> {
        let mut replaced = Vec::new();
        let tracked: Vec<(String, String)> = self
            .nodes
            .iter()
            .map(|(node, object)| (node.clone(), object.clone()))
            .collect();
        for (node, object) in tracked {
            if !self.finish_deletion(&node, &object).await? {
                continue;
            }
            self.nodes.remove(&node);
            let new_node = self
                .fleet
                .add_nodes(1)
                .await?
                .into_iter()
                .next()
                .expect("one node was added");
            self.adopt(&new_node).await?;
            replaced.push(Replaced {
                old_node: node,
                new_node,
            });
        }
        Ok(replaced)
    }

    /// Whether the object standing for `node` is gone, after playing its finalizer if it is being
    /// deleted (delete the node, then release the object).
    async fn finish_deletion(&self, node: &str, object: &str) -> Result<bool, RunProviderError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let (api, finalizer) = match &self.kind {
            ProviderKind::NodeGroup => {
                let present = nodes
                    .get_opt(node)
                    .await
                    .map_err(api_error(format!("reading node {node}")))?;
                return Ok(present.is_none());
            }
            ProviderKind::ClusterApi { namespace, .. } => (
                Api::<DynamicObject>::namespaced_with(self.client.clone(), namespace, &machine_resource()),
                MACHINE_FINALIZER,
            ),
            ProviderKind::Karpenter { .. } => (
                Api::<DynamicObject>::all_with(self.client.clone(), &node_claim_resource()),
                NODE_CLAIM_FINALIZER,
            ),
        };
        let Some(current) = api
            .get_opt(object)
            .await
            .map_err(api_error(format!("reading {object}")))?
        else {
            return Ok(true);
        };
        if current.metadata.deletion_timestamp.is_none() {
            return Ok(false);
        }
        match nodes.delete(node, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.is_not_found() => {}
            Err(source) => {
                return Err(RunProviderError::Api {
                    action: format!("deleting node {node}"),
                    source,
                });
            }
        }
        let remaining: Vec<Value> = current
            .metadata
            .finalizers
            .iter()
            .flatten()
            .filter(|name| name.as_str() != finalizer)
            .map(|name| Value::String(name.clone()))
            .collect();
        // The resourceVersion makes this a compare-and-swap on the finalizer list.
        let patch = json!({"metadata": {"finalizers": remaining, "resourceVersion": current.metadata.resource_version}});
        match api
            .patch(object, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.is_not_found() => {}
            Err(source) => {
                return Err(RunProviderError::Api {
                    action: format!("releasing {object}"),
                    source,
                });
            }
        }
        Ok(false)
    }
}

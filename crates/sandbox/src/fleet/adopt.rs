//! Adopting nodes another controller creates: Karpenter's KWOK provider and the sandbox's Cluster
//! API infrastructure provider create Node objects themselves (there is no kubelet to register
//! them). The adopter polls for Nodes with the fleet's label and does for each what a kubelet does
//! after registering: reports its status (`Ready`, addresses, the fleet's capacity), creates its
//! heartbeat Lease and runs its pods; when the Node is deleted it forgets the node.
//!
//! It polls (every 200ms) rather than watching, like the fake provider: scaffolding that stays
//! obviously correct across API server restarts.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tokio::task::JoinHandle;

use super::heartbeat;
use super::node::{self, NODE_LEASE_NAMESPACE, NodeShape};
use super::registry::NodeRegistry;

/// How often the adopter looks for new and deleted nodes.
const POLL: Duration = Duration::from_millis(200);

/// Failure to adopt one node (retried at the next poll).
#[derive(Debug, thiserror::Error)]
enum AdoptNodeError {
    /// Its status could not be reported.
    #[error("reporting the status of adopted node {node}: {source}")]
    ReportStatus { node: String, source: kube::Error },
    /// Its heartbeat Lease could not be created.
    #[error("creating the heartbeat lease of adopted node {node}: {source}")]
    CreateLease { node: String, source: kube::Error },
}

/// What the adoption task shares with its fleet.
pub(super) struct Adopter {
    pub(super) client: Client,
    pub(super) shape: NodeShape,
    pub(super) selector: String,
    pub(super) heartbeat_interval: Duration,
    pub(super) lease_duration_seconds: i32,
    pub(super) registry: Arc<NodeRegistry>,
    pub(super) next_index: Arc<AtomicUsize>,
    pub(super) tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Adopter {
    /// Adopts new labelled nodes and forgets deleted adopted ones, until aborted.
    pub(super) async fn run(self) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let params = ListParams::default().labels(&self.selector);
        let mut adopted: BTreeSet<String> = BTreeSet::new();
        loop {
            match nodes.list(&params).await {
                Ok(listed) => {
                    let present: BTreeSet<String> = listed
                        .items
                        .iter()
                        .filter(|n| n.metadata.deletion_timestamp.is_none())
                        .filter_map(|n| n.metadata.name.clone())
                        .collect();
                    for gone in adopted.difference(&present).cloned().collect::<Vec<_>>() {
                        self.registry.remove(&gone);
                        adopted.remove(&gone);
                        tracing::info!(node = %gone, "fleet: adopted node deleted, forgotten");
                    }
                    for found in &listed.items {
                        let Some(name) = found.metadata.name.as_deref() else {
                            continue;
                        };
                        if !present.contains(name) || self.registry.contains(name) {
                            continue;
                        }
                        match self.adopt(found).await {
                            Ok(()) => {
                                adopted.insert(name.to_owned());
                                tracing::info!(node = %name, "fleet: adopted a node another controller created");
                            }
                            Err(error) => tracing::warn!(%error, "fleet: adopting a node failed; retrying"),
                        }
                    }
                }
                Err(error) => tracing::warn!(%error, "fleet: listing nodes to adopt failed"),
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// What a kubelet does once its Node exists: status, Lease, heartbeat, pods.
    async fn adopt(&self, found: &Node) -> Result<(), AdoptNodeError> {
        let name = found.metadata.name.clone().unwrap_or_default();
        let index = self.next_index.fetch_add(1, Ordering::Relaxed);
        let now = Timestamp::now();
        // The fleet's own node shape supplies the status (capacity, conditions, addresses, node
        // info); the Node's name and labels stay the creator's.
        let status = node::simulated_node(&self.shape, index, now).status;
        let mut status = serde_json::to_value(status).unwrap_or_default();
        if let Some(addresses) = status.get_mut("addresses") {
            *addresses = json!([
                { "type": "InternalIP", "address": node::node_ip(index) },
                { "type": "Hostname", "address": name },
            ]);
        }
        // Known to the kubelet before the node reports Ready, so before the scheduler can bind a
        // pod to it (the kubelet ignores pods of nodes it does not know).
        let entry = self.registry.insert(&name, &node::node_ip(index));
        let nodes: Api<Node> = Api::all(self.client.clone());
        if let Err(source) = nodes
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await
        {
            self.registry.remove(&name);
            return Err(AdoptNodeError::ReportStatus {
                node: name.clone(),
                source,
            });
        }
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), NODE_LEASE_NAMESPACE);
        let uid = found.metadata.uid.clone().unwrap_or_default();
        match leases
            .create(
                &PostParams::default(),
                &node::heartbeat_lease(&name, &uid, self.lease_duration_seconds, now),
            )
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.is_already_exists() => {}
            Err(source) => {
                self.registry.remove(&name);
                return Err(AdoptNodeError::CreateLease {
                    node: name.clone(),
                    source,
                });
            }
        }
        let task = tokio::spawn(heartbeat::run(
            leases,
            name,
            entry.heartbeat,
            self.heartbeat_interval,
            Duration::ZERO,
        ));
        self.tasks.lock().expect("fleet task list lock").push(task);
        Ok(())
    }
}

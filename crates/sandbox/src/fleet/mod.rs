//! A simulated GPU fleet: nodes registered as a kubelet registers them (GPU labels and capacity,
//! `Ready=True`), each with a heartbeat Lease, and a simulated kubelet for the pods bound to them.
//! Everything runs as tasks on the caller's tokio runtime; dropping the fleet stops them, and
//! [`Fleet::stop`] also deletes its nodes (their Leases follow through owner references, their
//! pods through the pod garbage collector).

mod adopt;
pub mod device_plugin;
pub mod gang;
mod heartbeat;
pub mod kubelet;
pub mod node;
pub mod operator_labels;
pub mod pod_resources;
mod pod_status;
mod registry;
pub mod validation_pod;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use gpu_remediation_api::constants::GPU_INVENTORY_ANNOTATION;
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt as _};
use tokio::task::JoinHandle;

pub use node::{FLEET_LABEL, NODE_LEASE_NAMESPACE, NodeShape};
use registry::NodeRegistry;

/// How to build a [`Fleet`].
#[derive(Debug, Clone)]
pub struct FleetOptions {
    /// How many nodes to register at start.
    pub nodes: usize,
    /// The fleet's name: node names are `<prefix>-0000`, ... and every node carries
    /// [`FLEET_LABEL`]`=<prefix>`. Make it unique per test.
    pub name_prefix: String,
    /// GPUs per node (`nvidia.com/gpu` capacity and the `nvidia.com/gpu.count` label).
    pub gpus_per_node: u32,
    /// The `nvidia.com/gpu.product` label.
    pub product: String,
    /// Extra labels on every node.
    pub labels: BTreeMap<String, String>,
    /// How often each node renews its Lease (kubelet default: 10s).
    pub heartbeat_interval: Duration,
    /// The Lease's `leaseDurationSeconds` (kubelet default: 40).
    pub lease_duration_seconds: i32,
    /// How many API requests the simulated kubelets make at once.
    pub kubelet_concurrency: usize,
    /// How many nodes are registered at once.
    pub registration_concurrency: usize,
    /// Publish each node's GPUs through the simulated DRA driver ([`crate::dra`]): a
    /// `ResourceSlice` per node, the `DeviceClass`, and the node's inventory annotation naming the
    /// same GPUs. Needs a control plane started with DRA on (`ControlPlaneOptions::dra`).
    pub dra: bool,
}

impl Default for FleetOptions {
    fn default() -> Self {
        Self {
            nodes: 3,
            name_prefix: "gpu-node".to_owned(),
            gpus_per_node: 8,
            product: "NVIDIA-H100-80GB-HBM3".to_owned(),
            labels: BTreeMap::new(),
            heartbeat_interval: Duration::from_secs(10),
            lease_duration_seconds: 40,
            kubelet_concurrency: 32,
            registration_concurrency: 16,
            dra: false,
        }
    }
}

/// Failure to register nodes.
#[derive(Debug, thiserror::Error)]
pub enum AddNodesError {
    /// The Node could not be created.
    #[error("creating node {node}: {source}")]
    CreateNode {
        /// The node.
        node: String,
        /// The API error.
        source: kube::Error,
    },
    /// The Node's status could not be reported.
    #[error("reporting the status of node {node}: {source}")]
    ReportStatus {
        /// The node.
        node: String,
        /// The API error.
        source: kube::Error,
    },
    /// The node's GPUs could not be published through the simulated DRA driver.
    #[error("publishing the DRA devices of node {node}: {source}")]
    PublishDevices {
        /// The node (empty for the fleet's `DeviceClass`).
        node: String,
        /// The API error.
        source: kube::Error,
    },
    /// The fleet's nodes could not be listed.
    #[error("listing the fleet's nodes: {source}")]
    ListNodes {
        /// The API error.
        source: kube::Error,
    },
    /// Nodes kept their `node.kubernetes.io/not-ready` taint.
    #[error("nodes still not schedulable after {waited:?}: {nodes:?}")]
    NotSchedulable {
        /// How long was waited.
        waited: Duration,
        /// The nodes still tainted (or not yet listed).
        nodes: Vec<String>,
    },
    /// The Node's heartbeat Lease could not be created.
    #[error("creating the heartbeat lease of node {node}: {source}")]
    CreateLease {
        /// The node.
        node: String,
        /// The API error.
        source: kube::Error,
    },
}

/// How long new nodes may take to lose their `not-ready` taint.
const NODE_READY_TIMEOUT: Duration = Duration::from_secs(120);

fn has_not_ready_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == "node.kubernetes.io/not-ready"))
}

/// Failure to restart a node's heartbeat.
#[derive(Debug, thiserror::Error)]
pub enum ResumeHeartbeatError {
    /// The node is not part of this fleet.
    #[error("node {0} is not part of this fleet")]
    UnknownNode(String),
    /// Its `Ready` condition could not be reported.
    #[error("reporting node {node} Ready: {source}")]
    ReportReady {
        /// The node.
        node: String,
        /// The API error.
        source: kube::Error,
    },
}

/// Failure to bring a stopped node back.
#[derive(Debug, thiserror::Error)]
pub enum StartKubeletError {
    /// Its heartbeat could not be resumed.
    #[error(transparent)]
    Resume(#[from] ResumeHeartbeatError),
    /// Its pods could not be listed.
    #[error("listing the pods of node {node}: {source}")]
    ListPods {
        /// The node.
        node: String,
        /// The API error.
        source: kube::Error,
    },
}

/// Failure to delete a fleet's nodes.
#[derive(Debug, thiserror::Error)]
#[error("deleting the nodes of fleet {fleet}: {source}")]
pub struct DeleteFleetError {
    /// The fleet.
    pub fleet: String,
    /// The API error.
    pub source: kube::Error,
}

/// A running simulated fleet.
pub struct Fleet {
    client: Client,
    shape: NodeShape,
    options: FleetOptions,
    registry: Arc<NodeRegistry>,
    kubelet: Arc<kubelet::Kubelet>,
    next_index: Arc<AtomicUsize>,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("fleet", &self.shape.fleet)
            .field("nodes", &self.registry.len())
            .finish_non_exhaustive()
    }
}

impl Fleet {
    /// Starts the simulated kubelet, then registers `options.nodes` nodes and starts their
    /// heartbeats.
    pub async fn start(client: Client, options: FleetOptions) -> Result<Self, AddNodesError> {
        let shape = NodeShape {
            fleet: options.name_prefix.clone(),
            gpus: options.gpus_per_node,
            product: options.product.clone(),
            labels: options.labels.clone(),
        };
        let registry = Arc::new(NodeRegistry::default());
        let kubelet = Arc::new(kubelet::Kubelet::new(
            client.clone(),
            Arc::clone(&registry),
            options.kubelet_concurrency,
            options.gpus_per_node,
        ));
        let kubelet_task = tokio::spawn(Arc::clone(&kubelet).run());
        let fleet = Self {
            client,
            shape,
            options,
            registry,
            kubelet,
            next_index: Arc::new(AtomicUsize::new(0)),
            tasks: Arc::new(Mutex::new(vec![kubelet_task])),
        };
        if fleet.options.dra {
            crate::dra::install_device_class(&fleet.client)
                .await
                .map_err(|source| AddNodesError::PublishDevices {
                    node: String::new(),
                    source,
                })?;
        }
        fleet.add_nodes(fleet.options.nodes).await?;
        Ok(fleet)
    }

    /// Registers `count` more nodes and starts their heartbeats; returns their names.
    pub async fn add_nodes(&self, count: usize) -> Result<Vec<String>, AddNodesError> {
        self.add_nodes_prepared(count, &|_: &mut Node| {}).await
    }

    /// [`Fleet::add_nodes`], each node edited by `prepare` before it registers (annotations or
    /// taints a kubelet or agent would register it with, e.g. `hardware::joining_with`).
    pub async fn add_nodes_prepared(
        &self,
        count: usize,
        prepare: &(dyn Fn(&mut Node) + Sync),
    ) -> Result<Vec<String>, AddNodesError> {
        let first = self.next_index.fetch_add(count, Ordering::Relaxed);
        let names = futures::stream::iter(first..first + count)
            .map(|index| self.register(index, first + count, prepare))
            .buffer_unordered(self.options.registration_concurrency.max(1))
            .try_collect::<Vec<_>>()
            .await?;
        let mut names = names;
        names.sort();
        self.wait_schedulable(&names).await?;
        Ok(names)
    }

    /// The `TaintNodesByCondition` admission plugin taints every new node
    /// `node.kubernetes.io/not-ready`; the node-lifecycle controller lifts it once it sees
    /// `Ready=True` (it looks every 5s). Until then nothing schedules there, so wait.
    async fn wait_schedulable(&self, names: &[String]) -> Result<(), AddNodesError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let params = ListParams::default().labels(&self.selector());
        let deadline = tokio::time::Instant::now() + NODE_READY_TIMEOUT;
        loop {
            let listed = nodes
                .list(&params)
                .await
                .map_err(|source| AddNodesError::ListNodes { source })?;
            let mut missing: std::collections::BTreeSet<&str> = names.iter().map(String::as_str).collect();
            let mut tainted = Vec::new();
            for node in &listed.items {
                let name = node.metadata.name.as_deref().unwrap_or_default();
                if missing.remove(name) && has_not_ready_taint(node) {
                    tainted.push(name.to_owned());
                }
            }
            tainted.extend(missing.into_iter().map(str::to_owned));
            if tainted.is_empty() {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(AddNodesError::NotSchedulable {
                    waited: NODE_READY_TIMEOUT,
                    nodes: tainted,
                });
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    async fn register(
        &self,
        index: usize,
        total: usize,
        prepare: &(dyn Fn(&mut Node) + Sync),
    ) -> Result<String, AddNodesError> {
        let now = Timestamp::now();
        let mut node = node::simulated_node(&self.shape, index, now);
        let name = node::node_name(&self.shape.fleet, index);
        let gpus = crate::dra::node_gpus(&name, self.shape.gpus);
        if self.options.dra {
            node.annotations_mut().insert(
                GPU_INVENTORY_ANNOTATION.to_owned(),
                crate::hardware::inventory_text(&gpus),
            );
        }
        prepare(&mut node);
        // Known to the kubelet before the scheduler can bind anything to it.
        let entry = self.registry.insert(&name, &node::node_ip(index));
        let nodes: Api<Node> = Api::all(self.client.clone());
        let created = nodes
            .create(&PostParams::default(), &node)
            .await
            .map_err(|source| AddNodesError::CreateNode {
                node: name.clone(),
                source,
            })?;
        // The create keeps the status a kubelet registers with on some versions and drops it on
        // others; report it explicitly so the node is Ready either way. Strategic, as a kubelet's:
        // conditions merge by type, so one a controller wrote since the create (the ledger's
        // GpuRepeatOffender on a joining node) is kept, where a merge patch replaced the list.
        nodes
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Strategic(serde_json::json!({ "status": node.status })),
            )
            .await
            .map_err(|source| AddNodesError::ReportStatus {
                node: name.clone(),
                source,
            })?;
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), NODE_LEASE_NAMESPACE);
        let uid = created.metadata.uid.unwrap_or_default();
        if self.options.dra {
            crate::dra::publish_slice(&self.client, &name, &uid, &gpus)
                .await
                .map_err(|source| AddNodesError::PublishDevices {
                    node: name.clone(),
                    source,
                })?;
        }
        leases
            .create(
                &PostParams::default(),
                &node::heartbeat_lease(&name, &uid, self.options.lease_duration_seconds, now),
            )
            .await
            .map_err(|source| AddNodesError::CreateLease {
                node: name.clone(),
                source,
            })?;
        let interval = self.options.heartbeat_interval;
        let task = tokio::spawn(heartbeat::run(
            leases,
            name.clone(),
            entry.heartbeat,
            interval,
            heartbeat::stagger(index, total, interval),
        ));
        self.tasks.lock().expect("fleet task list lock").push(task);
        Ok(name)
    }

    /// Adopts, from now on, every Node that another controller creates with this fleet's label
    /// ([`FLEET_LABEL`]`=<name>`): Karpenter's KWOK provider and the sandbox's Cluster API
    /// infrastructure provider create Node objects themselves, as a cloud's kubelet would register
    /// them. An adopted node is reported `Ready` with the fleet's capacity, gets a heartbeat Lease
    /// and runs its pods, like a registered one; when its Node is deleted the fleet forgets it.
    /// The adoption runs until the fleet stops.
    pub fn adopt_joining_nodes(&self) {
        let adopter = adopt::Adopter {
            client: self.client.clone(),
            shape: self.shape.clone(),
            selector: self.selector(),
            heartbeat_interval: self.options.heartbeat_interval,
            lease_duration_seconds: self.options.lease_duration_seconds,
            registry: Arc::clone(&self.registry),
            next_index: Arc::clone(&self.next_index),
            tasks: Arc::clone(&self.tasks),
        };
        let task = tokio::spawn(adopter.run());
        self.tasks.lock().expect("fleet task list lock").push(task);
    }

    /// The fleet's nodes, sorted by name.
    #[must_use]
    pub fn node_names(&self) -> Vec<String> {
        self.registry.names()
    }

    /// The fleet's name (node name prefix and [`FLEET_LABEL`] value).
    #[must_use]
    pub fn name(&self) -> &str {
        &self.shape.fleet
    }

    /// The shape of the fleet's nodes.
    #[must_use]
    pub fn shape(&self) -> &NodeShape {
        &self.shape
    }

    /// A label selector matching exactly this fleet's nodes.
    #[must_use]
    pub fn selector(&self) -> String {
        format!("{FLEET_LABEL}={}", self.shape.fleet)
    }

    /// Fault: node `node` stops renewing its Lease, as when its kubelet or host dies. Its pods'
    /// kubelet keeps working; kube-controller-manager marks the node `Unknown` after its grace
    /// period. Returns `false` if the node is not in this fleet.
    #[must_use]
    pub fn stop_heartbeat(&self, node: &str) -> bool {
        self.registry.set_heartbeat(node, false)
    }

    /// Restarts node `node`'s heartbeat and reports it `Ready` again, as a kubelet that comes back.
    pub async fn resume_heartbeat(&self, node: &str) -> Result<(), ResumeHeartbeatError> {
        if !self.registry.set_heartbeat(node, true) {
            return Err(ResumeHeartbeatError::UnknownNode(node.to_owned()));
        }
        Api::<Node>::all(self.client.clone())
            .patch_status(
                node,
                &PatchParams::default(),
                &Patch::Strategic(node::ready_status_patch(Timestamp::now())),
            )
            .await
            .map(|_| ())
            .map_err(|source| ResumeHeartbeatError::ReportReady {
                node: node.to_owned(),
                source,
            })
    }

    /// Fault: node `node` goes down entirely. Its heartbeat stops and its kubelet no longer runs
    /// pods nor finalises terminating ones (they stay terminating, as on a dead host). Returns
    /// `false` if the node is not in this fleet.
    #[must_use]
    pub fn stop_kubelet(&self, node: &str) -> bool {
        self.registry.set_kubelet(node, false) && self.registry.set_heartbeat(node, false)
    }

    /// Brings a node stopped by [`Fleet::stop_kubelet`] back: heartbeat, `Ready`, and a fresh look
    /// at every pod bound to it.
    pub async fn start_kubelet(&self, node: &str) -> Result<(), StartKubeletError> {
        if !self.registry.set_kubelet(node, true) {
            return Err(StartKubeletError::Resume(ResumeHeartbeatError::UnknownNode(
                node.to_owned(),
            )));
        }
        self.resume_heartbeat(node).await?;
        self.kubelet
            .resync_node(node)
            .await
            .map_err(|source| StartKubeletError::ListPods {
                node: node.to_owned(),
                source,
            })
    }

    /// Serves node `node`'s kubelet pod-resources API (which pod holds which GPU through the
    /// simulated device plugin) on the unix socket `socket`, for a real agent run with
    /// `--pod-resources-socket`, until the returned server is dropped.
    pub fn serve_pod_resources(
        &self,
        node: &str,
        socket: &std::path::Path,
    ) -> std::io::Result<pod_resources::PodResourcesServer> {
        pod_resources::serve(socket, node, self.kubelet.devices())
    }

    /// The GPU UUIDs each pod (`namespace/name`) of node `node` holds through the simulated
    /// device plugin.
    #[must_use]
    pub fn device_plugin_holders(&self, node: &str) -> BTreeMap<String, Vec<String>> {
        self.kubelet
            .devices()
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .holders(node)
    }

    /// Partitions GPUs of node `node` into MIG `devices` in the simulated device plugin (see
    /// [`device_plugin::mig_devices`]); the node's advertised resources are the caller's to set.
    pub fn partition(&self, node: &str, devices: Vec<device_plugin::SimMig>) {
        self.kubelet
            .devices()
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .partition(node, devices);
    }

    /// Stops every heartbeat and kubelet task and deletes the fleet's nodes.
    pub async fn stop(self) -> Result<(), DeleteFleetError> {
        self.abort_tasks();
        let nodes = Api::<Node>::all(self.client.clone());
        let (params, list) = (
            DeleteParams::default(),
            ListParams::default().labels(&self.selector()),
        );
        // Deleting thousands of nodes in one request can outlast a loaded server's patience; the
        // deletion is idempotent, so a request that got no answer is simply asked again.
        crate::retry::retrying(&format!("deleting fleet {}", self.shape.fleet), || {
            nodes.delete_collection(&params, &list)
        })
        .await
        .map(|_| ())
        .map_err(|source| DeleteFleetError {
            fleet: self.shape.fleet.clone(),
            source,
        })
    }

    fn abort_tasks(&self) {
        for task in self.tasks.lock().expect("fleet task list lock").drain(..) {
            task.abort();
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.abort_tasks();
    }
}

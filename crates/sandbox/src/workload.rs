//! Workloads to put on a fleet: `Deployments` and `StatefulSets` behind `PodDisruptionBudgets`
//! (`minAvailable`, `maxUnavailable`, integers or percentages), `DaemonSets`, bare pods, `emptyDir`
//! pods, mirror pods and GPU-requesting pods, pinned to chosen nodes. [`Workload`] builds the
//! objects (pure); [`create`] and the `wait_*` functions talk to the server.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::time::Duration;

use gpu_remediation_api::constants::{GPU_RESOURCE, SIM_TERMINATION_ANNOTATION};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Node, Pod, PodTemplateSpec};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// The image every simulated container names (nothing pulls it).
pub const IMAGE: &str = "registry.k8s.io/pause:3.10";

/// The annotation that marks a mirror pod (a static pod's API copy).
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// A `PodDisruptionBudget`'s one rule.
#[derive(Debug, Clone, PartialEq)]
pub enum Budget {
    /// `minAvailable`: pods that must stay available.
    MinAvailable(IntOrString),
    /// `maxUnavailable`: pods that may be unavailable.
    MaxUnavailable(IntOrString),
}

impl Budget {
    /// `minAvailable: n`.
    #[must_use]
    pub fn min_available(n: i32) -> Self {
        Self::MinAvailable(IntOrString::Int(n))
    }

    /// `maxUnavailable: n`.
    #[must_use]
    pub fn max_unavailable(n: i32) -> Self {
        Self::MaxUnavailable(IntOrString::Int(n))
    }

    /// `minAvailable: "<percent>%"`.
    #[must_use]
    pub fn min_available_percent(percent: u32) -> Self {
        Self::MinAvailable(IntOrString::String(format!("{percent}%")))
    }

    /// `maxUnavailable: "<percent>%"`.
    #[must_use]
    pub fn max_unavailable_percent(percent: u32) -> Self {
        Self::MaxUnavailable(IntOrString::String(format!("{percent}%")))
    }
}

/// One application: its pods' shape and where they may run. Build the objects with its methods.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Name of the workload, its pods' `app` label, and its PDB.
    pub name: String,
    /// Its namespace.
    pub namespace: String,
    /// Replicas of a Deployment or `StatefulSet`.
    pub replicas: i32,
    /// Nodes its pods may run on (by `kubernetes.io/hostname`); empty: anywhere.
    pub nodes: Vec<String>,
    /// `nvidia.com/gpu` each pod requests (0: none).
    pub gpus: u32,
    /// The simulated termination time (`30s`, or `stall`); `None`: immediate.
    pub termination: Option<String>,
    /// The pods' `terminationGracePeriodSeconds`; `None`: the server default (30).
    pub grace_period_seconds: Option<i64>,
    /// The pods' `nodeSelector` (e.g. a fleet's label, to spread over a whole fleet).
    pub node_selector: BTreeMap<String, String>,
    /// The `ResourceClaimTemplate` each pod's GPUs are claimed from through DRA (see
    /// [`crate::dra::claim_template`]); `None`: no claim.
    pub gpu_claim_template: Option<String>,
    /// Devices of another extended resource each pod asks for (a MIG profile's
    /// `nvidia.com/mig-1g.10gb`), and how many.
    pub devices: Option<(String, u32)>,
}

impl Workload {
    /// One replica, no GPUs, anywhere.
    #[must_use]
    pub fn new(namespace: &str, name: &str) -> Self {
        Self {
            name: name.to_owned(),
            namespace: namespace.to_owned(),
            replicas: 1,
            nodes: Vec::new(),
            gpus: 0,
            termination: None,
            grace_period_seconds: None,
            node_selector: BTreeMap::new(),
            gpu_claim_template: None,
            devices: None,
        }
    }

    /// Makes each pod ask for `count` devices of the extended resource `resource` (a MIG profile's,
    /// such as `nvidia.com/mig-1g.10gb`), instead of whole GPUs.
    #[must_use]
    pub fn devices(mut self, resource: &str, count: u32) -> Self {
        self.devices = Some((resource.to_owned(), count));
        self
    }

    /// Makes each pod claim its GPUs through DRA, from the `ResourceClaimTemplate` `template`
    /// (one claim per pod, allocated by the scheduler).
    #[must_use]
    pub fn gpus_claimed_from(mut self, template: &str) -> Self {
        self.gpu_claim_template = Some(template.to_owned());
        self
    }

    /// Restricts the pods to nodes labelled `key=value` (e.g. one fleet's nodes).
    #[must_use]
    pub fn node_selector(mut self, key: &str, value: &str) -> Self {
        self.node_selector.insert(key.to_owned(), value.to_owned());
        self
    }

    /// Sets the replica count.
    #[must_use]
    pub fn replicas(mut self, replicas: i32) -> Self {
        self.replicas = replicas;
        self
    }

    /// Pins the pods to `nodes`.
    #[must_use]
    pub fn on_nodes<S: AsRef<str>>(mut self, nodes: &[S]) -> Self {
        self.nodes = nodes.iter().map(|n| n.as_ref().to_owned()).collect();
        self
    }

    /// Makes each pod request `gpus` GPUs.
    #[must_use]
    pub fn gpus(mut self, gpus: u32) -> Self {
        self.gpus = gpus;
        self
    }

    /// Makes the simulated kubelet take `termination` (`30s`, or `stall`) to finalise each pod.
    #[must_use]
    pub fn termination(mut self, termination: &str) -> Self {
        self.termination = Some(termination.to_owned());
        self
    }

    /// Sets the pods' `terminationGracePeriodSeconds`.
    #[must_use]
    pub fn grace_period_seconds(mut self, seconds: i64) -> Self {
        self.grace_period_seconds = Some(seconds);
        self
    }

    /// The pods' labels: `app: <name>`.
    #[must_use]
    pub fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([("app".to_owned(), self.name.clone())])
    }

    /// The label selector text matching the pods: `app=<name>`.
    #[must_use]
    pub fn selector(&self) -> String {
        format!("app={}", self.name)
    }

    fn pod_spec(&self, volumes: Option<Value>) -> Value {
        let mut container = json!({ "name": "app", "image": IMAGE });
        if self.gpus > 0 {
            container["resources"] = json!({
                "limits": { GPU_RESOURCE: self.gpus.to_string() },
                "requests": { GPU_RESOURCE: self.gpus.to_string() },
            });
        }
        if let Some((resource, count)) = &self.devices {
            container["resources"] = json!({
                "limits": { resource.as_str(): count.to_string() },
                "requests": { resource.as_str(): count.to_string() },
            });
        }
        if self.gpu_claim_template.is_some() {
            container["resources"]["claims"] = json!([{ "name": crate::dra::GPU_REQUEST }]);
        }
        let mut spec = json!({ "containers": [container] });
        if let Some(template) = &self.gpu_claim_template {
            spec["resourceClaims"] =
                json!([{ "name": crate::dra::GPU_REQUEST, "resourceClaimTemplateName": template }]);
        }
        if !self.nodes.is_empty() {
            spec["affinity"] = json!({
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{
                            "matchExpressions": [{
                                "key": "kubernetes.io/hostname",
                                "operator": "In",
                                "values": self.nodes,
                            }]
                        }]
                    }
                }
            });
        }
        if !self.node_selector.is_empty() {
            spec["nodeSelector"] = json!(self.node_selector);
        }
        if let Some(seconds) = self.grace_period_seconds {
            spec["terminationGracePeriodSeconds"] = json!(seconds);
        }
        if let Some(volumes) = volumes {
            spec["containers"][0]["volumeMounts"] = json!([{ "name": "scratch", "mountPath": "/scratch" }]);
            spec["volumes"] = volumes;
        }
        spec
    }

    fn pod_metadata(&self) -> Value {
        let mut metadata = json!({ "labels": self.labels() });
        if let Some(termination) = &self.termination {
            metadata["annotations"] = json!({ SIM_TERMINATION_ANNOTATION: termination });
        }
        metadata
    }

    /// The pod template of a Deployment, `StatefulSet` or `DaemonSet`.
    #[must_use]
    pub fn pod_template(&self) -> PodTemplateSpec {
        typed(json!({ "metadata": self.pod_metadata(), "spec": self.pod_spec(None) }))
    }

    /// A Deployment of `replicas` pods.
    #[must_use]
    pub fn deployment(&self) -> Deployment {
        typed(json!({
            "metadata": { "name": self.name, "namespace": self.namespace },
            "spec": {
                "replicas": self.replicas,
                "selector": { "matchLabels": self.labels() },
                "template": self.pod_template(),
            }
        }))
    }

    /// A `StatefulSet` of `replicas` pods (parallel pod management, so they start together).
    #[must_use]
    pub fn stateful_set(&self) -> StatefulSet {
        typed(json!({
            "metadata": { "name": self.name, "namespace": self.namespace },
            "spec": {
                "replicas": self.replicas,
                "serviceName": self.name,
                "podManagementPolicy": "Parallel",
                "selector": { "matchLabels": self.labels() },
                "template": self.pod_template(),
            }
        }))
    }

    /// A `DaemonSet`: one pod on each node in `nodes` (or every node if empty). It tolerates every
    /// taint, as node agents do.
    #[must_use]
    pub fn daemon_set(&self) -> DaemonSet {
        let mut template = json!({ "metadata": self.pod_metadata(), "spec": self.pod_spec(None) });
        template["spec"]["tolerations"] = json!([{ "operator": "Exists" }]);
        typed(json!({
            "metadata": { "name": self.name, "namespace": self.namespace },
            "spec": {
                "selector": { "matchLabels": self.labels() },
                "template": template,
            }
        }))
    }

    fn bare(&self, name: &str, node: &str, volumes: Option<Value>, annotations: &Value) -> Pod {
        let mut metadata = self.pod_metadata();
        metadata["name"] = json!(name);
        metadata["namespace"] = json!(self.namespace);
        if let Some(extra) = annotations.as_object() {
            for (key, value) in extra {
                metadata["annotations"][key] = value.clone();
            }
        }
        let mut spec = self.pod_spec(volumes);
        spec["nodeName"] = json!(node);
        if let Some(spec) = spec.as_object_mut() {
            spec.remove("affinity");
        }
        typed(json!({ "metadata": metadata, "spec": spec }))
    }

    /// A pod with no controller, bound directly to `node` (no scheduler involved).
    #[must_use]
    pub fn bare_pod(&self, name: &str, node: &str) -> Pod {
        self.bare(name, node, None, &json!({}))
    }

    /// A bare pod on `node` with an `emptyDir` volume (local data a drain would lose).
    #[must_use]
    pub fn empty_dir_pod(&self, name: &str, node: &str) -> Pod {
        self.bare(
            name,
            node,
            Some(json!([{ "name": "scratch", "emptyDir": {} }])),
            &json!({}),
        )
    }

    /// A mirror pod on `node`: the API copy of a static pod, which drains must skip.
    #[must_use]
    pub fn mirror_pod(&self, name: &str, node: &str) -> Pod {
        self.bare(
            name,
            node,
            None,
            &json!({ MIRROR_ANNOTATION: format!("sim-{name}"), "kubernetes.io/config.source": "file" }),
        )
    }

    /// A `PodDisruptionBudget` named after the workload, selecting its pods.
    #[must_use]
    pub fn pdb(&self, budget: &Budget) -> PodDisruptionBudget {
        self.pdb_named(&self.name, budget)
    }

    /// A `PodDisruptionBudget` named `name`, selecting this workload's pods (e.g. a second one, to
    /// see the server refuse evictions of pods matched by two).
    #[must_use]
    pub fn pdb_named(&self, name: &str, budget: &Budget) -> PodDisruptionBudget {
        let mut spec = json!({ "selector": { "matchLabels": self.labels() } });
        match budget {
            Budget::MinAvailable(v) => spec["minAvailable"] = json!(v),
            Budget::MaxUnavailable(v) => spec["maxUnavailable"] = json!(v),
        }
        typed(json!({
            "metadata": { "name": name, "namespace": self.namespace },
            "spec": spec,
        }))
    }
}

fn typed<T: DeserializeOwned>(value: Value) -> T {
    serde_json::from_value(value).expect("workload builders produce valid objects")
}

/// Failure to create a workload object.
#[derive(Debug, thiserror::Error)]
#[error("creating {kind} {namespace}/{name}: {source}")]
pub struct CreateWorkloadError {
    /// The object's kind.
    pub kind: String,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The API error.
    pub source: kube::Error,
}

/// Creates a namespaced object (any the builders above return) and returns what the server stored.
pub async fn create<K>(client: &Client, object: &K) -> Result<K, CreateWorkloadError>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope> + Clone + Debug + Serialize + DeserializeOwned,
    K::DynamicType: Default,
{
    let namespace = object.namespace().unwrap_or_default();
    let api: Api<K> = Api::namespaced(client.clone(), &namespace);
    api.create(&PostParams::default(), object)
        .await
        .map_err(|source| CreateWorkloadError {
            kind: K::kind(&K::DynamicType::default()).into_owned(),
            namespace: namespace.clone(),
            name: object.name_any(),
            source,
        })
}

/// A wait that ran out of time.
#[derive(Debug, thiserror::Error)]
#[error("waited {waited:?} for {what}; last seen: {last_seen}")]
pub struct WaitError {
    /// What was waited for.
    pub what: String,
    /// How long.
    pub waited: Duration,
    /// The last observation.
    pub last_seen: String,
}

async fn poll<T, F, Fut>(what: String, timeout: Duration, mut probe: F) -> Result<T, WaitError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let started = tokio::time::Instant::now();
    loop {
        let last_seen = match probe().await {
            Ok(value) => return Ok(value),
            Err(seen) => seen,
        };
        if started.elapsed() >= timeout {
            return Err(WaitError {
                what,
                waited: started.elapsed(),
                last_seen,
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether `node` reports the `Ready` condition `True`: what a joining kubelet, a provisioned
/// replacement and `gpu-sandbox up --real-nodes` all wait for.
#[must_use]
pub fn node_is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Whether `pod` is Ready and not terminating: what a Deployment's rollout and the disruption
/// controller (which counts it healthy) both wait for.
#[must_use]
pub fn is_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Waits until `count` pods matching `selector` in `namespace` are Ready (and not terminating);
/// returns them.
pub async fn wait_ready_pods(
    client: &Client,
    namespace: &str,
    selector: &str,
    count: usize,
    timeout: Duration,
) -> Result<Vec<Pod>, WaitError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let params = ListParams::default().labels(selector);
    poll(
        format!("{count} ready pods {selector} in {namespace}"),
        timeout,
        || {
            let (pods, params) = (pods.clone(), params.clone());
            async move {
                let list = pods.list(&params).await.map_err(|e| e.to_string())?;
                let ready: Vec<Pod> = list.items.into_iter().filter(is_ready).collect();
                if ready.len() >= count {
                    Ok(ready)
                } else {
                    Err(format!("{} ready", ready.len()))
                }
            }
        },
    )
    .await
}

/// Waits until the disruption controller has observed PDB `name` (a PDB it has not observed yet
/// refuses every eviction) and it allows `allowed` disruptions; returns it.
pub async fn wait_pdb_allows(
    client: &Client,
    namespace: &str,
    name: &str,
    allowed: i32,
    timeout: Duration,
) -> Result<PodDisruptionBudget, WaitError> {
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), namespace);
    poll(
        format!("PDB {namespace}/{name} observed and allowing {allowed} disruptions"),
        timeout,
        || {
            let pdbs = pdbs.clone();
            async move {
                let pdb = pdbs.get(name).await.map_err(|e| e.to_string())?;
                let generation = pdb.metadata.generation;
                let status = pdb.status.clone().unwrap_or_default();
                if status.observed_generation == generation && status.disruptions_allowed == allowed {
                    Ok(pdb)
                } else {
                    Err(format!(
                        "generation {generation:?}, observed {:?}, allowed {}, healthy {}/{}",
                        status.observed_generation,
                        status.disruptions_allowed,
                        status.current_healthy,
                        status.expected_pods
                    ))
                }
            }
        },
    )
    .await
}

/// Waits until the disruption controller has observed the current generation of PDB `name`,
/// whatever it allows; returns it.
pub async fn wait_pdb_observed(
    client: &Client,
    namespace: &str,
    name: &str,
    timeout: Duration,
) -> Result<PodDisruptionBudget, WaitError> {
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), namespace);
    poll(format!("PDB {namespace}/{name} observed"), timeout, || {
        let pdbs = pdbs.clone();
        async move {
            let pdb = pdbs.get(name).await.map_err(|e| e.to_string())?;
            let observed = pdb.status.as_ref().and_then(|s| s.observed_generation);
            if observed.is_some() && observed == pdb.metadata.generation {
                Ok(pdb)
            } else {
                Err(format!(
                    "generation {:?}, observed {observed:?}",
                    pdb.metadata.generation
                ))
            }
        }
    })
    .await
}

/// Waits until pod `name` no longer exists.
pub async fn wait_pod_gone(
    client: &Client,
    namespace: &str,
    name: &str,
    timeout: Duration,
) -> Result<(), WaitError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    poll(format!("pod {namespace}/{name} gone"), timeout, || {
        let pods = pods.clone();
        async move {
            match pods.get_opt(name).await {
                Ok(None) => Ok(()),
                Ok(Some(pod)) => Err(format!(
                    "still there, deletionTimestamp {:?}",
                    pod.metadata.deletion_timestamp
                )),
                Err(e) => Err(e.to_string()),
            }
        }
    })
    .await
}

#[cfg(test)]
mod tests;

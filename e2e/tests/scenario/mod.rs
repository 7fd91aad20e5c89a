//! The controller scenarios' harness, shared by every test binary that runs the controller
//! in-process against the shared control plane: the generated CRDs installed once, a controller
//! scoped to one policy (by label), a fleet and namespace per test, a workload behind a budget, and
//! a pod watch that proves no budget was broken. [`pinned`] holds a drain back behind a closed
//! budget; [`provisioned`] is what the tests against a real provisioner share; [`reboots`] a node
//! rebooted twice through a template; [`ladder`] one node under a ladder of stand-in step objects.
#![allow(dead_code, reason = "each test binary uses a different part of the harness")]

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::StreamExt;
use gpu_remediation_api::{GpuRemediation, GpuRemediationPolicy, Phase, constants::REMEDIATION_TAINT_KEY};
use gpu_remediator::{Settings, leader::Fence};
use gpu_sandbox::{
    fault,
    fleet::FLEET_LABEL,
    workload::{self, Budget, Workload},
};
use k8s_openapi::{
    api::core::v1::{Node, Pod, Taint},
    jiff::Timestamp,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DynamicObject, ListParams, Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};

use crate::common::{self, eventually};

pub mod ladder;
pub mod pinned;
pub mod provisioned;
pub mod reboots;

/// Label on test policies; each test's controller enforces only policies with its own value.
pub const SCOPE_LABEL: &str = "e2e.gpuremediation.dev/scope";

/// Installs the generated CRDs once per test binary and waits until they are served.
pub async fn install_crds(client: &Client) {
    common::install_generated_crds(client).await;
}

/// A controller running in-process on the test's runtime, enforcing only `scope`'s policies.
pub struct RunningController {
    pub stop: Option<tokio::sync::oneshot::Sender<()>>,
    pub task: tokio::task::JoinHandle<Result<(), gpu_remediator::RunControllerError>>,
}

impl RunningController {
    pub async fn start(scope: &str) -> Self {
        Self::start_reporting(scope, gpu_remediator::telemetry::Metrics::new()).await
    }

    /// [`Self::start`], counting into `metrics` (a clone shares the series: the test reads them).
    pub async fn start_reporting(scope: &str, metrics: gpu_remediator::telemetry::Metrics) -> Self {
        let config = common::cluster().await.config();
        let settings = Settings {
            policy_selector: Some(format!("{SCOPE_LABEL}={scope}")),
            eviction_backoff: Duration::from_secs(1),
            pod_poll: Duration::from_millis(250),
            instance: Some(format!("e2e-{scope}")),
            ..Settings::default()
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let telemetry = gpu_remediator::controller::Telemetry {
            metrics,
            health: None,
        };
        let task = tokio::spawn(gpu_remediator::controller::run_with_telemetry(
            config,
            settings,
            Fence::standalone(),
            telemetry,
            async move {
                let _ = stopped.await;
            },
        ));
        Self {
            stop: Some(stop),
            task,
        }
    }

    /// Stops the controller and waits for it to end, as a process exit would.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let ended = tokio::time::timeout(Duration::from_secs(10), &mut self.task).await;
        let result = ended
            .expect("the controller stops within 10s")
            .expect("the controller task did not panic");
        result.expect("the controller ended without error");
    }
}

impl Drop for RunningController {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One test's world: a namespace, a fleet, a scope for its policy and its controller.
pub struct Scenario {
    pub client: Client,
    pub namespace: String,
    pub fleet: gpu_sandbox::Fleet,
    pub scope: String,
}

impl Scenario {
    pub async fn new(nodes: usize) -> Self {
        Self::with_fleet(nodes, |_| {}).await
    }

    /// [`Self::new`], the fleet's options edited by `edit` (`dra: true`, say).
    pub async fn with_fleet(nodes: usize, edit: impl FnOnce(&mut gpu_sandbox::FleetOptions)) -> Self {
        common::init_logs();
        let client = common::cluster().await.client();
        install_crds(&client).await;
        let namespace = common::namespace().await;
        let fleet = common::fleet_with(nodes, edit).await;
        let scope = fleet.name().to_owned();
        Self {
            client,
            namespace,
            fleet,
            scope,
        }
    }

    pub fn nodes(&self) -> Vec<String> {
        let mut names = self.fleet.node_names();
        names.sort();
        names
    }

    /// Creates this scenario's policy: it selects exactly this fleet's nodes. `spec` is merged
    /// over a base with one `GpuHealthy=False` trigger.
    pub async fn policy(&self, spec: serde_json::Value) -> GpuRemediationPolicy {
        let mut full = serde_json::json!({
            "nodeSelector": {"matchLabels": {FLEET_LABEL: self.fleet.name()}},
            "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "3s"}],
            "action": "None",
            "safety": {"maxConcurrent": 1, "maxUnhealthy": "50%", "rate": {"limit": 10, "per": "1h"}},
            "drain": {"timeout": "2m"},
            "release": {"healthyFor": "5s"},
        });
        merge(&mut full, spec);
        let policy: GpuRemediationPolicy = serde_json::from_value(serde_json::json!({
            "apiVersion": "gpuremediation.dev/v1alpha1",
            "kind": "GpuRemediationPolicy",
            "metadata": {"name": self.scope, "labels": {SCOPE_LABEL: self.scope}},
            "spec": full,
        }))
        .expect("a valid policy");
        Api::<GpuRemediationPolicy>::all(self.client.clone())
            .create(&PostParams::default(), &policy)
            .await
            .unwrap_or_else(|e| panic!("creating policy {}: {e}", self.scope))
    }

    pub async fn remediations(&self) -> Vec<GpuRemediation> {
        let all = Api::<GpuRemediation>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .unwrap();
        all.items
            .into_iter()
            .filter(|r| r.spec.policy_name == self.scope)
            .collect()
    }

    pub async fn remediation_of(&self, node: &str) -> Option<GpuRemediation> {
        self.remediations()
            .await
            .into_iter()
            .find(|r| r.spec.node_name == node)
    }

    pub async fn wait_phase(&self, node: &str, phase: Phase, timeout: Duration) -> GpuRemediation {
        eventually(
            &format!("the remediation of {node} in phase {phase}"),
            timeout,
            || async {
                self.remediation_of(node)
                    .await
                    .filter(|r| r.status.as_ref().is_some_and(|s| s.phase == phase))
            },
        )
        .await
    }

    pub async fn node(&self, name: &str) -> Node {
        Api::<Node>::all(self.client.clone()).get(name).await.unwrap()
    }

    /// Adds `taint` to `node` as another writer would (a person, the Node Readiness Controller, a
    /// cloud provider): read, append, replace over the read's version (the taints are one list; a
    /// heartbeat in between makes it conflict, and it is retried).
    pub async fn add_taint(&self, node: &str, taint: &Taint) {
        let api = Api::<Node>::all(self.client.clone());
        eventually(
            "another writer's taint added",
            Duration::from_secs(10),
            || async {
                let mut current = api.get(node).await.ok()?;
                current
                    .spec
                    .get_or_insert_with(Default::default)
                    .taints
                    .get_or_insert_with(Vec::new)
                    .push(taint.clone());
                api.replace(node, &PostParams::default(), &current)
                    .await
                    .ok()
                    .map(|_| ())
            },
        )
        .await;
    }

    /// A person's `kubectl cordon` or `uncordon`: the server names `kubectl-cordon` the field's
    /// manager when the value changes (kubectl's own patch, an absent field for `false`).
    pub async fn set_unschedulable(&self, name: &str, unschedulable: bool) {
        let patch = serde_json::json!({"spec": {"unschedulable": unschedulable.then_some(true)}});
        Api::<Node>::all(self.client.clone())
            .patch(
                name,
                &PatchParams {
                    field_manager: Some("kubectl-cordon".to_owned()),
                    ..PatchParams::default()
                },
                &Patch::Merge(&patch),
            )
            .await
            .unwrap();
    }

    pub async fn break_gpu(&self, node: &str) {
        fault::set_gpu_condition(&self.client, node, "False", "XID79", "GPU 3 fell off the bus")
            .await
            .unwrap();
    }

    pub async fn heal_gpu(&self, node: &str) {
        fault::set_gpu_condition(&self.client, node, "True", "GpusHealthy", "all GPUs healthy")
            .await
            .unwrap();
    }

    /// A Deployment of `replicas` pods all on `node` (the other `spare` nodes are cordoned while
    /// it starts, then opened, so evicted pods have somewhere to go), behind a PDB.
    pub async fn protected_workload(
        &self,
        name: &str,
        node: &str,
        spare: &[String],
        replicas: i32,
        budget: &Budget,
    ) -> Workload {
        let mut allowed: Vec<String> = vec![node.to_owned()];
        allowed.extend(spare.iter().cloned());
        let app = Workload::new(&self.namespace, name)
            .replicas(replicas)
            .on_nodes(&allowed);
        for other in spare {
            self.set_unschedulable(other, true).await;
        }
        workload::create(&self.client, &app.deployment()).await.unwrap();
        // The scheduler may not have seen a cordon yet when the first pods are placed: move any
        // pod that landed on a spare node (its ReplicaSet recreates it on `node`).
        let pods = Api::<Pod>::namespaced(self.client.clone(), &self.namespace);
        eventually(
            &format!("{replicas} ready {name} pods on {node}"),
            Duration::from_secs(60),
            || async {
                let listed = pods
                    .list(&ListParams::default().labels(&app.selector()))
                    .await
                    .ok()?;
                let mut ready_here = 0;
                for pod in &listed.items {
                    let here = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node);
                    if pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some() && !here {
                        let _ = pods
                            .delete(&pod.name_any(), &kube::api::DeleteParams::default())
                            .await;
                    } else if here && is_ready(pod) {
                        ready_here += 1;
                    }
                }
                (ready_here == replicas && usize::try_from(replicas).is_ok_and(|r| listed.items.len() == r))
                    .then_some(())
            },
        )
        .await;
        for other in spare {
            self.set_unschedulable(other, false).await;
        }
        workload::create(&self.client, &app.pdb(budget)).await.unwrap();
        app
    }

    /// Eight `train` pods on `node`, each claiming one GPU through DRA (the claim template
    /// `one-gpu`, created here); not started yet.
    pub async fn eight_pods_claiming_a_gpu_each(&self, node: &str) -> Workload {
        gpu_sandbox::dra::create_claim_template(&self.client, &self.namespace, "one-gpu", 1)
            .await
            .expect("the claim template");
        Workload::new(&self.namespace, "train")
            .replicas(8)
            .on_nodes(&[node])
            .gpus_claimed_from("one-gpu")
    }

    /// Creates the Deployment of `app` and waits up to `within` until `ready` of its pods run
    /// (`what`: what the test waits for); returns them.
    pub async fn run_workload(&self, app: &Workload, ready: usize, within: Duration, what: &str) -> Vec<Pod> {
        workload::create(&self.client, &app.deployment())
            .await
            .expect("the deployment");
        workload::wait_ready_pods(&self.client, &self.namespace, &app.selector(), ready, within)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"))
    }

    pub async fn pods_on(&self, node: &str) -> Vec<Pod> {
        let pods = Api::<Pod>::namespaced(self.client.clone(), &self.namespace)
            .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await
            .unwrap();
        pods.items
    }

    /// Waits until the controller's first-seen stamps on `node` name `serial` (any, when empty):
    /// a board counts as failed only once its node listed it before the fault.
    pub async fn stamped_serial(&self, node: &str, serial: &str) {
        eventually(
            &format!("node {node}'s serials stamped as first seen"),
            Duration::from_secs(20),
            || async {
                let node = self.node(node).await;
                let stamps = node
                    .annotations()
                    .get(gpu_remediation_api::constants::GPU_FIRST_SEEN_ANNOTATION)?;
                stamps.contains(serial).then_some(())
            },
        )
        .await;
    }

    /// One node named `name` joins the fleet carrying `gpus` (as `hardware::joining_with`
    /// prepares it: with the unchecked taint).
    pub async fn join_carrying(&self, name: &str, gpus: &[gpu_sandbox::hardware::SimGpu]) {
        let added = self
            .fleet
            .add_nodes_prepared(1, &|node| gpu_sandbox::hardware::joining_with(node, gpus))
            .await
            .unwrap();
        assert_eq!(added, [name]);
    }
}

pub use e2e::merge;

/// Whether `pod` is Ready and not terminating (as the disruption controller counts it healthy).
pub use gpu_sandbox::workload::is_ready;

pub fn evicted_through_the_api(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.type_ == "DisruptionTarget" && c.reason.as_deref() == Some("EvictionByEvictionAPI")
            })
        })
}

/// Follows every pod of a workload through a watch: the fewest healthy pods seen at any instant,
/// and, for each pod that started terminating, whether the Eviction API put it there.
#[derive(Default)]
pub struct BudgetRecord {
    /// Whether the initial list is complete (before that, counts are partial).
    pub listed: bool,
    pub fewest_healthy: Option<usize>,
    pub healthy: BTreeMap<String, bool>,
    pub left: BTreeMap<String, bool>,
}

pub struct BudgetWatch {
    pub record: Arc<Mutex<BudgetRecord>>,
    pub task: tokio::task::JoinHandle<()>,
}

impl BudgetWatch {
    pub fn start(client: &Client, namespace: &str, selector: &str) -> Self {
        let record = Arc::new(Mutex::new(BudgetRecord::default()));
        let pods = Api::<Pod>::namespaced(client.clone(), namespace);
        let config = watcher::Config::default().labels(selector);
        let shared = record.clone();
        let task = tokio::spawn(async move {
            let mut events = std::pin::pin!(watcher(pods, config).default_backoff());
            while let Some(event) = events.next().await {
                let Ok(event) = event else { continue };
                let mut record = shared.lock().unwrap();
                let mut see = |pod: &Pod, gone: bool| {
                    let name = pod.name_any();
                    if pod.metadata.deletion_timestamp.is_some() || gone {
                        record
                            .left
                            .entry(name.clone())
                            .or_insert_with(|| evicted_through_the_api(pod));
                        if evicted_through_the_api(pod) {
                            record.left.insert(name.clone(), true);
                        }
                    }
                    record.healthy.insert(name, !gone && is_ready(pod));
                };
                match event {
                    watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) => see(&pod, false),
                    watcher::Event::Delete(pod) => see(&pod, true),
                    watcher::Event::Init => record.listed = false,
                    watcher::Event::InitDone => record.listed = true,
                }
                if !record.listed {
                    continue;
                }
                let healthy = record.healthy.values().filter(|h| **h).count();
                record.fewest_healthy = Some(record.fewest_healthy.map_or(healthy, |f| f.min(healthy)));
            }
        });
        Self { record, task }
    }

    /// The fewest healthy pods seen at any instant since the watch's first complete list.
    pub fn fewest_healthy(&self) -> usize {
        let record = self.record.lock().unwrap();
        assert!(record.listed, "the budget watch never completed its first list");
        record.fewest_healthy.expect("the budget watch saw the workload")
    }

    pub fn left(&self) -> BTreeMap<String, bool> {
        self.record.lock().unwrap().left.clone()
    }
}

impl Drop for BudgetWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The evictions the controller sent, by result, from its metrics.
pub fn evictions_sent(metrics: &gpu_remediator::telemetry::Metrics) -> BTreeMap<String, u64> {
    const SERIES: &str = "gpu_remediator_evictions_total{result=\"";
    metrics
        .encode()
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(SERIES)?;
            let (result, value) = rest.split_once("\"} ")?;
            Some((result.to_owned(), value.trim().parse().ok()?))
        })
        .collect()
}

pub fn phase_at(remediation: &GpuRemediation, phase: Phase) -> Option<Timestamp> {
    remediation
        .status
        .as_ref()?
        .phase_history
        .iter()
        .find(|t| t.phase == phase)
        .map(|t| t.at.0)
}

pub fn has_our_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == REMEDIATION_TAINT_KEY))
}

/// Every pod of `others` (name, UID) is still in the scenario's namespace now with the same UID
/// and not terminating: never evicted, never replaced.
pub async fn assert_untouched(s: &Scenario, others: &[(String, Option<String>)]) {
    let after = Api::<Pod>::namespaced(s.client.clone(), &s.namespace)
        .list(&ListParams::default())
        .await
        .expect("listing the scenario's pods")
        .items;
    for (name, uid) in others {
        let pod = after
            .iter()
            .find(|p| p.name_any() == *name)
            .unwrap_or_else(|| panic!("{name} is gone"));
        assert_eq!(&pod.uid(), uid, "{name} was never replaced");
        assert!(
            pod.metadata.deletion_timestamp.is_none(),
            "{name} was never evicted"
        );
    }
}

/// The gangs a record's drain names (`status.drain.gangs`).
pub fn gangs_of(record: &GpuRemediation) -> Vec<gpu_remediation_api::gangs::GangRecord> {
    record
        .status
        .as_ref()
        .and_then(|s| s.drain.as_ref())
        .map(|d| d.gangs.clone())
        .unwrap_or_default()
}

pub fn is_unschedulable(node: &Node) -> bool {
    node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false)
}

pub fn gpu_condition_since(node: &Node) -> Timestamp {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "GpuHealthy"))
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0)
        .expect("the GpuHealthy condition has a transition time")
}

/// The Events about the object `name`, counted by reason.
pub async fn events_about(client: &Client, name: &str) -> BTreeMap<String, i32> {
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), "default")
        .list(&ListParams::default())
        .await
        .unwrap();
    let mut by_reason = BTreeMap::new();
    for event in events.items {
        if event.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name) {
            let count = event.series.as_ref().map_or(1, |s| s.count);
            *by_reason.entry(event.reason.unwrap_or_default()).or_insert(0) += count;
        }
    }
    by_reason
}

/// The notes of the Events about object `name` with `reason` (a cluster-scoped object's Events
/// are in `default`).
pub async fn event_notes(client: &Client, name: &str, reason: &str) -> Vec<String> {
    event_notes_in(client, "default", name, reason).await
}

/// The notes of the Events in `namespace` about object `name` with `reason`.
pub async fn event_notes_in(client: &Client, namespace: &str, name: &str, reason: &str) -> Vec<String> {
    Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                && e.reason.as_deref() == Some(reason)
        })
        .filter_map(|e| e.note)
        .collect()
}

/// A validation Job as the sample's `dcgmi diag -r 2`, in `namespace` (nothing runs it here: the
/// simulated kubelet decides its pod's outcome from the node's simulated GPU).
pub fn dcgm_validation_job(namespace: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"namespace": namespace},
        "spec": {"template": {"spec": {"containers": [{
            "name": "dcgm-diag",
            "image": "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04",
            "command": ["dcgmi", "diag", "-r", "2"],
        }]}}},
    })
}

/// The stand-in reboot kind (`common::REBOOT_CRD`).
pub fn reboots(s: &Scenario) -> Api<DynamicObject> {
    Api::namespaced_with(s.client.clone(), &s.namespace, &ladder::step_kind())
}

/// A reboot policy whose template makes one `FakeReboot` per remediation.
pub fn reboot_policy(s: &Scenario, timeout: &str) -> serde_json::Value {
    serde_json::json!({
        "action": "Reboot",
        "safety": {"maxUnhealthy": "100%", "maxAttemptsPerNode": {"count": 5, "per": "1h"}},
        "replacement": {
            "strategy": "Template",
            "timeout": timeout,
            "template": {
                "apiVersion": "e2e.gpuremediation.dev/v1",
                "kind": "FakeReboot",
                "metadata": {"name": "{{remediationName}}", "namespace": s.namespace},
                "spec": {"node": "{{nodeName}}"},
            },
        },
    })
}

/// Marks the reboot object done, as Self Node Remediation does when the node is back.
pub async fn report_rebooted(s: &Scenario, name: &str) {
    let patch = serde_json::json!({"status": {"conditions": [{"type": "Succeeded", "status": "True", "reason": "Rebooted"}]}});
    reboots(s)
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("reporting {name} rebooted: {e}"));
}

/// Marks the reboot object failed, as Self Node Remediation does when the node does not come back.
pub async fn report_reboot_failed(s: &Scenario, name: &str) {
    let patch = serde_json::json!({"status": {"phase": "Failed"}});
    reboots(s)
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("reporting {name} failed: {e}"));
}

/// The `DeviceTaintRule` version the control plane (Kubernetes 1.`minor`, started with
/// `Dra::DeviceTaints`) serves: the sandbox says which (`Dra::device_taint_rules`).
pub fn device_taint_rule_version(minor: u32) -> gpu_remediator::dra::wire::TaintRuleVersion {
    let served = gpu_sandbox::Dra::DeviceTaints.device_taint_rules(minor);
    gpu_remediator::dra::wire::TaintRuleVersion::PREFERRED
        .into_iter()
        .find(|version| Some(version.version()) == served)
        .expect("every supported minor serves one")
}

//! The remediation controller against the real control plane: each test runs its own controller
//! in-process, scoped to its own policy (by label), on its own simulated nodes and namespace.
//!
//! A PDB watcher (`BudgetWatch`) follows every pod of a protected workload through a pod watch and
//! fails the test if the healthy count ever drops below the budget, and records whether each pod
//! that left carried the `DisruptionTarget` condition the Eviction API sets.

mod common;

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use common::eventually;
use futures::StreamExt;
use gpu_remediation_api::{
    GpuRemediation, GpuRemediationPolicy, Phase,
    constants::{
        APPROVED_ANNOTATION, CORDONED_BY_ANNOTATION, NODE_LABEL, REMEDIATION_TAINT_KEY, policy_conditions,
    },
    crds,
};
use gpu_remediator::{Settings, leader::Fence};
use gpu_sandbox::{
    fault,
    fleet::FLEET_LABEL,
    workload::{self, Budget, Workload},
};
use k8s_openapi::{
    api::{
        admissionregistration::v1::ValidatingWebhookConfiguration,
        core::v1::{Node, Pod},
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    jiff::Timestamp,
};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use tokio::sync::OnceCell;

/// Label on test policies; each test's controller enforces only policies with its own value.
const SCOPE_LABEL: &str = "e2e.gpuremediation.dev/scope";

static CRDS: OnceCell<()> = OnceCell::const_new();

/// Installs the generated CRDs once per test binary and waits until they are served.
async fn install_crds(client: &Client) {
    CRDS.get_or_init(|| async {
        let api = Api::<CustomResourceDefinition>::all(client.clone());
        for (file, yaml) in crds::render_all() {
            let crd: CustomResourceDefinition =
                serde_yaml::from_str(&yaml).unwrap_or_else(|e| panic!("parsing {file}: {e}"));
            match api.create(&PostParams::default(), &crd).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.is_already_exists() => {}
                Err(e) => panic!("creating the CRD from {file}: {e}"),
            }
            let name = crd.name_any();
            eventually(
                &format!("CRD {name} established"),
                Duration::from_secs(30),
                || {
                    let api = api.clone();
                    let name = name.clone();
                    async move {
                        let crd = api.get(&name).await.ok()?;
                        let established = crd
                            .status?
                            .conditions?
                            .iter()
                            .any(|c| c.type_ == "Established" && c.status == "True");
                        established.then_some(())
                    }
                },
            )
            .await;
        }
        // The API server needs a moment after Established before the new kinds are discoverable
        // by every client; list once per kind to be sure.
        eventually("the new kinds to be served", Duration::from_secs(30), || {
            let client = client.clone();
            async move {
                let policies = Api::<GpuRemediationPolicy>::all(client.clone())
                    .list(&ListParams::default())
                    .await
                    .ok()?;
                let _ = Api::<GpuRemediation>::all(client)
                    .list(&ListParams::default())
                    .await
                    .ok()?;
                Some(policies)
            }
        })
        .await;
    })
    .await;
}

fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "gpu_remediator=info".into()),
        )
        .with_test_writer()
        .try_init();
}

/// A controller running in-process on the test's runtime, enforcing only `scope`'s policies.
struct RunningController {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), gpu_remediator::RunControllerError>>,
}

impl RunningController {
    async fn start(scope: &str) -> Self {
        let config = common::cluster().await.config();
        let settings = Settings {
            policy_selector: Some(format!("{SCOPE_LABEL}={scope}")),
            eviction_backoff: Duration::from_secs(1),
            pod_poll: Duration::from_millis(250),
            instance: Some(format!("e2e-{scope}")),
            ..Settings::default()
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(gpu_remediator::run(
            config,
            settings,
            Fence::standalone(),
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
    async fn stop(mut self) {
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
struct Scenario {
    client: Client,
    namespace: String,
    fleet: gpu_sandbox::Fleet,
    scope: String,
}

impl Scenario {
    async fn new(nodes: usize) -> Self {
        init_logs();
        let client = common::cluster().await.client();
        install_crds(&client).await;
        let namespace = common::namespace().await;
        let fleet = common::fleet(nodes).await;
        let scope = fleet.name().to_owned();
        Self {
            client,
            namespace,
            fleet,
            scope,
        }
    }

    fn nodes(&self) -> Vec<String> {
        let mut names = self.fleet.node_names();
        names.sort();
        names
    }

    /// Creates this scenario's policy: it selects exactly this fleet's nodes. `spec` is merged
    /// over a base with one `GpuHealthy=False` trigger.
    async fn policy(&self, spec: serde_json::Value) -> GpuRemediationPolicy {
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

    async fn remediations(&self) -> Vec<GpuRemediation> {
        let all = Api::<GpuRemediation>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .unwrap();
        all.items
            .into_iter()
            .filter(|r| r.spec.policy_name == self.scope)
            .collect()
    }

    async fn remediation_of(&self, node: &str) -> Option<GpuRemediation> {
        self.remediations()
            .await
            .into_iter()
            .find(|r| r.spec.node_name == node)
    }

    async fn wait_phase(&self, node: &str, phase: Phase, timeout: Duration) -> GpuRemediation {
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

    async fn node(&self, name: &str) -> Node {
        Api::<Node>::all(self.client.clone()).get(name).await.unwrap()
    }

    async fn set_unschedulable(&self, name: &str, unschedulable: bool) {
        let patch = serde_json::json!({"spec": {"unschedulable": unschedulable}});
        Api::<Node>::all(self.client.clone())
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }

    async fn break_gpu(&self, node: &str) {
        fault::set_gpu_condition(&self.client, node, "False", "XID79", "GPU 3 fell off the bus")
            .await
            .unwrap();
    }

    async fn heal_gpu(&self, node: &str) {
        fault::set_gpu_condition(&self.client, node, "True", "GpusHealthy", "all GPUs healthy")
            .await
            .unwrap();
    }

    /// A Deployment of `replicas` pods all on `node` (the other `spare` nodes are cordoned while
    /// it starts, then opened, so evicted pods have somewhere to go), behind a PDB.
    async fn protected_workload(
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

    async fn pods_on(&self, node: &str) -> Vec<Pod> {
        let pods = Api::<Pod>::namespaced(self.client.clone(), &self.namespace)
            .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await
            .unwrap();
        pods.items
    }
}

fn merge(base: &mut serde_json::Value, over: serde_json::Value) {
    match (base, over) {
        (serde_json::Value::Object(base), serde_json::Value::Object(over)) => {
            for (key, value) in over {
                merge(base.entry(key).or_insert(serde_json::Value::Null), value);
            }
        }
        (base, over) => *base = over,
    }
}

fn is_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn evicted_through_the_api(pod: &Pod) -> bool {
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
struct BudgetRecord {
    /// Whether the initial list is complete (before that, counts are partial).
    listed: bool,
    fewest_healthy: Option<usize>,
    healthy: BTreeMap<String, bool>,
    left: BTreeMap<String, bool>,
}

struct BudgetWatch {
    record: Arc<Mutex<BudgetRecord>>,
    task: tokio::task::JoinHandle<()>,
}

impl BudgetWatch {
    fn start(client: &Client, namespace: &str, selector: &str) -> Self {
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
    fn fewest_healthy(&self) -> usize {
        let record = self.record.lock().unwrap();
        assert!(record.listed, "the budget watch never completed its first list");
        record.fewest_healthy.expect("the budget watch saw the workload")
    }

    fn left(&self) -> BTreeMap<String, bool> {
        self.record.lock().unwrap().left.clone()
    }
}

impl Drop for BudgetWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn phase_at(remediation: &GpuRemediation, phase: Phase) -> Option<Timestamp> {
    remediation
        .status
        .as_ref()?
        .phase_history
        .iter()
        .find(|t| t.phase == phase)
        .map(|t| t.at.0)
}

fn has_our_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == REMEDIATION_TAINT_KEY))
}

fn is_unschedulable(node: &Node) -> bool {
    node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false)
}

fn gpu_condition_since(node: &Node) -> Timestamp {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "GpuHealthy"))
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0)
        .expect("the GpuHealthy condition has a transition time")
}

#[tokio::test]
#[allow(
    clippy::too_many_lines,
    reason = "one scenario, asserted step by step as it unfolds"
)]
async fn an_unhealthy_node_is_cordoned_within_a_second_and_drained_through_evictions_without_breaking_its_budget()
 {
    let s = Scenario::new(8).await;
    let nodes = s.nodes();
    let (broken, spares) = (nodes[0].clone(), nodes[1..3].to_vec());
    let web = s
        .protected_workload("web", &broken, &spares, 4, &Budget::min_available(3))
        .await;
    workload::wait_pdb_allows(&s.client, &s.namespace, "web", 1, Duration::from_secs(60))
        .await
        .unwrap();
    let solo = Workload::new(&s.namespace, "solo");
    workload::create(&s.client, &solo.bare_pod("solo", &broken))
        .await
        .unwrap();
    let agent = Workload::new(&s.namespace, "agent").on_nodes(std::slice::from_ref(&broken));
    workload::create(&s.client, &agent.daemon_set()).await.unwrap();
    let mirror = Workload::new(&s.namespace, "static");
    workload::create(&s.client, &mirror.mirror_pod("static-gpu", &broken))
        .await
        .unwrap();
    workload::wait_ready_pods(
        &s.client,
        &s.namespace,
        &agent.selector(),
        1,
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    workload::wait_ready_pods(
        &s.client,
        &s.namespace,
        &solo.selector(),
        1,
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    let budget = BudgetWatch::start(&s.client, &s.namespace, &web.selector());
    let solo_watch = BudgetWatch::start(&s.client, &s.namespace, &solo.selector());

    s.policy(serde_json::json!({})).await;
    let controller = RunningController::start(&s.scope).await;
    s.break_gpu(&broken).await;
    let due = {
        let since = gpu_condition_since(&s.node(&broken).await);
        since
            .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(3))
            .unwrap()
    };

    // Before `for` elapses nothing happens; within a second after, the node is cordoned and tainted.
    let cordoned_at = eventually(
        "the broken node to be cordoned and tainted",
        Duration::from_secs(20),
        || async {
            let node = s.node(&broken).await;
            (is_unschedulable(&node) && has_our_taint(&node)).then(Timestamp::now)
        },
    )
    .await;
    let late = cordoned_at.duration_since(due);
    assert!(late.as_secs_f64() >= 0.0, "cordoned {late} before `for` elapsed");
    assert!(
        late.as_secs_f64() <= 1.0,
        "cordoned {late} after `for` elapsed (must be within 1s)"
    );
    eprintln!("figure: cordoned {:.3}s after `for` elapsed", late.as_secs_f64());

    // Action None: drained, the node is held cordoned (Verifying) for a person or for recovery.
    let done = s
        .wait_phase(&broken, Phase::Verifying, Duration::from_secs(90))
        .await;
    let status = done.status.clone().unwrap();
    let drain = status.drain.clone().unwrap();
    assert_eq!(
        (drain.pods_total, drain.pods_evicted, drain.pods_remaining),
        (5, 5, 0),
        "{drain:?}"
    );
    assert_eq!(
        status.phase_history.first().map(|t| t.phase),
        Some(Phase::Pending),
        "{:?}",
        status.phase_history
    );
    let (cordoned, draining, held) = (
        phase_at(&done, Phase::Cordoned).unwrap(),
        phase_at(&done, Phase::Draining).unwrap(),
        phase_at(&done, Phase::Verifying).unwrap(),
    );
    assert!(
        cordoned <= draining && draining <= held,
        "{:?}",
        status.phase_history
    );
    assert_eq!(done.spec.trigger.reason, "XID79");
    assert_eq!(done.labels().get(NODE_LABEL), Some(&broken));
    eprintln!("figure: drain of 5 pods took {}", held.duration_since(draining));

    // What had to leave left through evictions; what had to stay stayed.
    let remaining: Vec<String> = s
        .pods_on(&broken)
        .await
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    assert!(
        remaining.iter().any(|n| n.starts_with("agent-")),
        "the DaemonSet pod stays: {remaining:?}"
    );
    assert!(
        remaining.contains(&"static-gpu".to_owned()),
        "the mirror pod stays: {remaining:?}"
    );
    assert!(
        !remaining.contains(&"solo".to_owned()) && !remaining.iter().any(|n| n.starts_with("web-")),
        "{remaining:?}"
    );
    let left = budget.left();
    assert_eq!(left.len(), 4, "every web pod on the node left: {left:?}");
    assert!(
        left.values().all(|evicted| *evicted),
        "each left through the Eviction API: {left:?}"
    );
    let solo_left = solo_watch.left();
    assert_eq!(
        solo_left.get("solo"),
        Some(&true),
        "the bare pod left through the Eviction API too: {solo_left:?}"
    );
    assert!(
        budget.fewest_healthy() >= 3,
        "the budget (minAvailable 3) was violated: {} healthy",
        budget.fewest_healthy()
    );

    let node = s.node(&broken).await;
    assert!(
        is_unschedulable(&node) && has_our_taint(&node),
        "action None keeps the node cordoned"
    );
    assert_eq!(
        node.annotations().get(CORDONED_BY_ANNOTATION),
        Some(&done.name_any())
    );
    controller.stop().await;
}

#[tokio::test]
async fn a_budget_that_allows_nothing_blocks_the_drain_and_names_itself() {
    let s = Scenario::new(3).await;
    let nodes = s.nodes();
    let (broken, spares) = (nodes[0].clone(), nodes[1..2].to_vec());
    let web = s
        .protected_workload("pinned", &broken, &spares, 2, &Budget::min_available(2))
        .await;
    let budget = BudgetWatch::start(&s.client, &s.namespace, &web.selector());
    s.policy(serde_json::json!({"drain": {"timeout": "4s", "onTimeout": "Block"}, "safety": {"maxUnhealthy": "100%"}})).await;
    let controller = RunningController::start(&s.scope).await;
    s.break_gpu(&broken).await;

    let blocked = s
        .wait_phase(&broken, Phase::Blocked, Duration::from_secs(40))
        .await;
    let drain = blocked.status.clone().unwrap().drain.unwrap();
    assert_eq!(drain.pods_remaining, 2);
    assert!(!drain.blockers.is_empty());
    let expected = format!("{}/pinned", s.namespace);
    assert!(
        drain
            .blockers
            .iter()
            .all(|b| b.pdb.as_deref() == Some(expected.as_str()) && b.code == 429),
        "{:?}",
        drain.blockers
    );
    assert!(blocked.status.unwrap().message.unwrap().contains(&expected));
    let node = s.node(&broken).await;
    assert!(is_unschedulable(&node), "a blocked node stays cordoned");
    assert!(budget.fewest_healthy() >= 2);
    assert!(budget.left().is_empty(), "nothing left: {:?}", budget.left());
    controller.stop().await;
}

#[tokio::test]
async fn force_delete_removes_what_the_budget_protects_after_the_timeout() {
    let s = Scenario::new(3).await;
    let nodes = s.nodes();
    let (broken, spares) = (nodes[0].clone(), nodes[1..2].to_vec());
    s.protected_workload("pinned", &broken, &spares, 2, &Budget::min_available(2))
        .await;
    s.policy(serde_json::json!({"drain": {"timeout": "3s", "onTimeout": "ForceDelete"}, "safety": {"maxUnhealthy": "100%"}})).await;
    let controller = RunningController::start(&s.scope).await;
    s.break_gpu(&broken).await;
    let done = s
        .wait_phase(&broken, Phase::Verifying, Duration::from_secs(60))
        .await;
    assert!(
        s.pods_on(&broken)
            .await
            .iter()
            .all(|p| !p.name_any().starts_with("pinned-"))
    );
    let history = &done.status.unwrap().phase_history;
    assert!(!history.iter().any(|t| t.phase == Phase::Blocked), "{history:?}");
    controller.stop().await;
}

#[tokio::test]
async fn proceed_hands_over_with_the_protected_pods_still_there() {
    let s = Scenario::new(3).await;
    let nodes = s.nodes();
    let (broken, spares) = (nodes[0].clone(), nodes[1..2].to_vec());
    s.protected_workload("pinned", &broken, &spares, 2, &Budget::min_available(2))
        .await;
    s.policy(serde_json::json!({"drain": {"timeout": "3s", "onTimeout": "Proceed"}, "safety": {"maxUnhealthy": "100%"}})).await;
    let controller = RunningController::start(&s.scope).await;
    s.break_gpu(&broken).await;
    let done = s
        .wait_phase(&broken, Phase::Verifying, Duration::from_secs(60))
        .await;
    let still: Vec<_> = s
        .pods_on(&broken)
        .await
        .into_iter()
        .filter(|p| p.name_any().starts_with("pinned-"))
        .collect();
    assert_eq!(still.len(), 2, "Proceed leaves the refused pods in place");
    let drained = done
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Drained")
        .unwrap();
    assert_eq!(drained.reason, "DrainTimeout");
    controller.stop().await;
}

#[tokio::test]
async fn four_of_ten_failing_at_once_opens_the_circuit_and_the_policy_says_why() {
    let s = Scenario::new(10).await;
    let nodes = s.nodes();
    s.policy(serde_json::json!({"safety": {"maxUnhealthy": "30%", "maxConcurrent": 5}}))
        .await;
    for node in &nodes[..4] {
        s.break_gpu(node).await;
    }
    // Let `for` (3s) pass for all four, whose transition seconds may differ, before the
    // controller's first look: it must see the fault at its full extent, not half of it.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let controller = RunningController::start(&s.scope).await;
    let policies = Api::<GpuRemediationPolicy>::all(s.client.clone());
    let status = eventually(
        "the policy to report the open circuit",
        Duration::from_secs(30),
        || async {
            let status = policies.get(&s.scope).await.ok()?.status?;
            let open = status
                .conditions
                .iter()
                .any(|c| c.type_ == policy_conditions::CIRCUIT_OPEN && c.status == "True");
            (open && status.waiting.len() == 4).then_some(status)
        },
    )
    .await;
    assert_eq!(
        (status.selected_nodes, status.unhealthy_nodes, status.in_flight),
        (10, 4, 0)
    );
    assert!(
        status
            .waiting
            .iter()
            .all(|w| w.reason == "CircuitOpen" && w.message.contains("4 of 10")),
        "{:?}",
        status.waiting
    );
    assert_eq!(status.budget.unwrap().remaining, 0);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        s.remediations().await.is_empty(),
        "nothing new starts while the circuit is open"
    );
    for node in &nodes[..4] {
        assert!(!is_unschedulable(&s.node(node).await));
    }
    controller.stop().await;
}

#[tokio::test]
async fn one_at_a_time_and_two_per_hour_starts_exactly_two_of_three_and_reports_the_next_slot() {
    let s = Scenario::new(10).await;
    let nodes = s.nodes();
    s.policy(serde_json::json!({"safety": {"maxConcurrent": 1, "maxUnhealthy": "50%", "rate": {"limit": 2, "per": "1h"}}})).await;
    let controller = RunningController::start(&s.scope).await;
    for node in &nodes[..3] {
        s.break_gpu(node).await;
    }
    // Sample in-flight remediations throughout: never more than one at any instant.
    let started = Instant::now();
    let mut most_in_flight = 0;
    let status = loop {
        let remediations = s.remediations().await;
        let in_flight = remediations
            .iter()
            .filter(|r| {
                !r.status
                    .as_ref()
                    .map(|st| st.phase)
                    .unwrap_or_default()
                    .is_terminal()
            })
            .count();
        most_in_flight = most_in_flight.max(in_flight);
        // Action None holds each drained node (and its concurrency slot) for a person: be one.
        for held in remediations
            .iter()
            .filter(|r| r.status.as_ref().is_some_and(|st| st.phase == Phase::Verifying))
        {
            s.set_unschedulable(&held.spec.node_name, false).await;
        }
        let finished = remediations
            .iter()
            .filter(|r| r.status.as_ref().is_some_and(|st| st.phase == Phase::Succeeded))
            .count();
        let policy = Api::<GpuRemediationPolicy>::all(s.client.clone())
            .get(&s.scope)
            .await
            .unwrap();
        // The third node's `for` may elapse after the first two have finished (they have no pods):
        // wait until the policy also lists it as waiting.
        if finished == 2
            && let Some(status) = policy.status.filter(|st| {
                st.budget.as_ref().is_some_and(|b| b.next_slot_at.is_some()) && !st.waiting.is_empty()
            })
        {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "two remediations did not finish: {remediations:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(most_in_flight, 1);
    assert_eq!(s.remediations().await.len(), 2);
    let budget = status.budget.unwrap();
    assert_eq!((budget.started_in_window, budget.remaining), (2, 0));
    assert_eq!(status.waiting.len(), 1);
    assert_eq!(status.waiting[0].reason, "DeferredByRate");
    controller.stop().await;
}

#[tokio::test]
async fn a_condition_flapping_faster_than_for_starts_nothing() {
    let s = Scenario::new(2).await;
    let nodes = s.nodes();
    s.policy(
        serde_json::json!({"triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "4s"}]}),
    )
    .await;
    let controller = RunningController::start(&s.scope).await;
    fault::flap(&s.client, &nodes[0], "XID79", 4, Duration::from_millis(1500))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(s.remediations().await.is_empty());
    assert!(!is_unschedulable(&s.node(&nodes[0]).await));
    controller.stop().await;
}

#[tokio::test]
async fn a_node_a_person_cordoned_stays_cordoned_after_its_remediation_is_cancelled() {
    let s = Scenario::new(3).await;
    let nodes = s.nodes();
    let (broken, spares) = (nodes[0].clone(), nodes[1..2].to_vec());
    // A budget that allows nothing keeps the remediation in flight until the node recovers.
    s.protected_workload("pinned", &broken, &spares, 2, &Budget::min_available(2))
        .await;
    s.set_unschedulable(&broken, true).await;
    s.policy(serde_json::json!({"action": "Replace", "safety": {"maxUnhealthy": "100%"}}))
        .await;
    let controller = RunningController::start(&s.scope).await;
    s.break_gpu(&broken).await;
    let draining = s
        .wait_phase(&broken, Phase::Draining, Duration::from_secs(30))
        .await;
    let node = s.node(&broken).await;
    assert!(has_our_taint(&node));
    assert_eq!(
        node.annotations().get(CORDONED_BY_ANNOTATION),
        None,
        "the cordon is not recorded as ours"
    );
    s.heal_gpu(&broken).await;
    let cancelled = s
        .wait_phase(&broken, Phase::Cancelled, Duration::from_secs(30))
        .await;
    assert_eq!(cancelled.name_any(), draining.name_any());
    let node = s.node(&broken).await;
    assert!(is_unschedulable(&node), "the person's cordon stays");
    assert!(!has_our_taint(&node), "our taint is gone");
    controller.stop().await;
}

#[tokio::test]
async fn a_person_uncordoning_the_node_cancels_and_the_controller_does_not_fight_back() {
    let s = Scenario::new(3).await;
    let nodes = s.nodes();
    let (broken, spares) = (nodes[0].clone(), nodes[1..2].to_vec());
    s.protected_workload("pinned", &broken, &spares, 2, &Budget::min_available(2))
        .await;
    s.policy(serde_json::json!({"action": "Replace", "safety": {"maxUnhealthy": "100%"}}))
        .await;
    let controller = RunningController::start(&s.scope).await;
    s.break_gpu(&broken).await;
    s.wait_phase(&broken, Phase::Draining, Duration::from_secs(30))
        .await;
    s.set_unschedulable(&broken, false).await;
    s.wait_phase(&broken, Phase::Cancelled, Duration::from_secs(30))
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let node = s.node(&broken).await;
    assert!(!is_unschedulable(&node) && !has_our_taint(&node));
    assert_eq!(node.annotations().get(CORDONED_BY_ANNOTATION), None);
    assert_eq!(
        s.remediations().await.len(),
        1,
        "no second remediation for the same episode"
    );
    controller.stop().await;
}

#[tokio::test]
async fn a_drained_node_is_replaced_by_deleting_it() {
    let s = Scenario::new(3).await;
    let nodes = s.nodes();
    let broken = nodes[0].clone();
    let solo = Workload::new(&s.namespace, "solo");
    workload::create(&s.client, &solo.bare_pod("solo", &broken))
        .await
        .unwrap();
    s.policy(serde_json::json!({
        "action": "Replace",
        "replacement": {"strategy": "DeleteNode", "timeout": "1m"},
        "safety": {"maxUnhealthy": "100%"},
    }))
    .await;
    let controller = RunningController::start(&s.scope).await;
    s.break_gpu(&broken).await;
    let done = s
        .wait_phase(&broken, Phase::Succeeded, Duration::from_secs(60))
        .await;
    let status = done.status.unwrap();
    let replacement = status.replacement.expect("the replacement's object is recorded");
    assert_eq!(
        (replacement.kind.as_str(), replacement.name.as_str()),
        ("Node", broken.as_str())
    );
    for phase in [
        Phase::Cordoned,
        Phase::Draining,
        Phase::Replacing,
        Phase::Verifying,
        Phase::Succeeded,
    ] {
        assert!(
            status.phase_history.iter().any(|t| t.phase == phase),
            "{phase} missing: {:?}",
            status.phase_history
        );
    }
    assert_eq!(status.drain.unwrap().pods_evicted, 1);
    assert!(
        Api::<Node>::all(s.client.clone())
            .get_opt(&broken)
            .await
            .unwrap()
            .is_none(),
        "the node is gone"
    );
    controller.stop().await;
}

#[tokio::test]
async fn dry_run_changes_nothing_and_names_the_budget_that_would_refuse() {
    let s = Scenario::new(3).await;
    let nodes = s.nodes();
    let (broken, spares) = (nodes[0].clone(), nodes[1..2].to_vec());
    s.protected_workload("pinned", &broken, &spares, 2, &Budget::min_available(2))
        .await;
    workload::create(
        &s.client,
        &Workload::new(&s.namespace, "solo").bare_pod("solo", &broken),
    )
    .await
    .unwrap();
    s.policy(serde_json::json!({"mode": "DryRun", "safety": {"maxUnhealthy": "100%"}}))
        .await;
    let controller = RunningController::start(&s.scope).await;
    s.break_gpu(&broken).await;
    let recorded = s
        .wait_phase(&broken, Phase::DryRun, Duration::from_secs(30))
        .await;
    let drain = recorded.status.unwrap().drain.unwrap();
    assert_eq!(drain.would_evict.len(), 3, "{:?}", drain.would_evict);
    let expected = format!("{}/pinned", s.namespace);
    assert_eq!(drain.blockers.len(), 2, "{:?}", drain.blockers);
    assert!(
        drain
            .blockers
            .iter()
            .all(|b| b.pdb.as_deref() == Some(expected.as_str()))
    );
    let node = s.node(&broken).await;
    assert!(
        !is_unschedulable(&node) && !has_our_taint(&node),
        "a dry run changes nothing"
    );
    assert_eq!(s.pods_on(&broken).await.len(), 3, "every pod is still there");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        s.remediations().await.len(),
        1,
        "a dry run is recorded once per episode"
    );
    controller.stop().await;
}

#[tokio::test]
async fn manual_mode_waits_for_approval_and_then_proceeds() {
    let s = Scenario::new(2).await;
    let nodes = s.nodes();
    let broken = nodes[0].clone();
    s.policy(serde_json::json!({"mode": "Manual"})).await;
    let controller = RunningController::start(&s.scope).await;
    s.break_gpu(&broken).await;
    let waiting = s
        .wait_phase(&broken, Phase::AwaitingApproval, Duration::from_secs(30))
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !is_unschedulable(&s.node(&broken).await),
        "nothing happens before approval"
    );
    let patch = serde_json::json!({"metadata": {"annotations": {APPROVED_ANNOTATION: "true"}}});
    Api::<GpuRemediation>::all(s.client.clone())
        .patch(
            &waiting.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .unwrap();
    s.wait_phase(&broken, Phase::Verifying, Duration::from_secs(30))
        .await;
    assert!(is_unschedulable(&s.node(&broken).await));
    controller.stop().await;
}

#[tokio::test]
async fn a_node_failing_again_past_one_attempt_per_hour_requires_a_person_and_proceeds_once_approved() {
    let s = Scenario::new(2).await;
    let broken = s.nodes()[0].clone();
    s.policy(serde_json::json!({"safety": {"maxUnhealthy": "100%", "maxAttemptsPerNode": {"count": 1, "per": "1h"}}}))
        .await;
    let controller = RunningController::start(&s.scope).await;

    // The first episode is remediated (action None holds the node) and recovers.
    s.break_gpu(&broken).await;
    let first = s
        .wait_phase(&broken, Phase::Verifying, Duration::from_secs(30))
        .await;
    s.heal_gpu(&broken).await;
    s.wait_phase(&broken, Phase::Succeeded, Duration::from_secs(30))
        .await;
    assert!(
        !is_unschedulable(&s.node(&broken).await),
        "recovery uncordoned it"
    );

    // The second episode within the hour is one recycle too many.
    s.break_gpu(&broken).await;
    let second = eventually(
        "the second episode's remediation in ManualRequired",
        Duration::from_secs(30),
        || async {
            s.remediations().await.into_iter().find(|r| {
                r.spec.node_name == broken
                    && r.name_any() != first.name_any()
                    && r.status
                        .as_ref()
                        .is_some_and(|st| st.phase == Phase::ManualRequired)
            })
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let node = s.node(&broken).await;
    assert!(
        !is_unschedulable(&node) && !has_our_taint(&node),
        "nothing is touched before a person acts"
    );
    let message = second
        .status
        .as_ref()
        .and_then(|st| st.message.clone())
        .unwrap_or_default();
    assert!(
        message.contains("within 1h")
            && message.contains("maxAttemptsPerNode 1")
            && message.contains(&format!("{APPROVED_ANNOTATION}=true")),
        "{message}"
    );
    let policy = Api::<GpuRemediationPolicy>::all(s.client.clone())
        .get(&s.scope)
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(policy.in_flight, 0, "ManualRequired is not in flight");
    assert_eq!(
        policy.budget.unwrap().started_in_window,
        1,
        "nor counted against the rate"
    );
    assert_eq!(
        events_about(&s.client, &second.name_any())
            .await
            .get("AttemptsExhausted"),
        Some(&1),
        "one Event"
    );
    let still = s
        .remediations()
        .await
        .into_iter()
        .find(|r| r.name_any() == second.name_any())
        .and_then(|r| r.status)
        .map(|st| st.phase);
    assert_eq!(still, Some(Phase::ManualRequired), "left alone");

    // A person approves: it proceeds like an admitted remediation.
    let patch = serde_json::json!({"metadata": {"annotations": {APPROVED_ANNOTATION: "true"}}});
    Api::<GpuRemediation>::all(s.client.clone())
        .patch(&second.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let approved = eventually(
        "the approved remediation to cordon",
        Duration::from_secs(30),
        || async {
            s.remediations().await.into_iter().find(|r| {
                r.name_any() == second.name_any()
                    && r.status
                        .as_ref()
                        .is_some_and(|st| st.phase_history.iter().any(|t| t.phase == Phase::Cordoned))
            })
        },
    )
    .await;
    assert!(
        is_unschedulable(&s.node(&broken).await),
        "cordoned after approval"
    );
    let history: Vec<Phase> = approved
        .status
        .unwrap()
        .phase_history
        .iter()
        .map(|t| t.phase)
        .collect();
    assert_eq!(
        &history[..4],
        &[
            Phase::Pending,
            Phase::ManualRequired,
            Phase::Pending,
            Phase::Cordoned
        ],
        "{history:?}"
    );
    controller.stop().await;
}

#[tokio::test]
async fn a_restart_mid_drain_resumes_the_same_remediation_without_resetting_the_rate_window() {
    let s = Scenario::new(3).await;
    let nodes = s.nodes();
    let (broken, spares) = (nodes[0].clone(), nodes[1..2].to_vec());
    s.protected_workload("pinned", &broken, &spares, 2, &Budget::min_available(2))
        .await;
    s.policy(serde_json::json!({"drain": {"timeout": "6s", "onTimeout": "ForceDelete"}, "safety": {"maxUnhealthy": "100%", "rate": {"limit": 1, "per": "1h"}}})).await;
    let first = RunningController::start(&s.scope).await;
    s.break_gpu(&broken).await;
    let draining = s
        .wait_phase(&broken, Phase::Draining, Duration::from_secs(30))
        .await;
    first.stop().await;

    // A second node breaks while no controller runs; the rate window (1 per hour) is full.
    s.break_gpu(&nodes[1]).await;
    let second = RunningController::start(&s.scope).await;
    let done = s
        .wait_phase(&broken, Phase::Verifying, Duration::from_secs(60))
        .await;
    assert_eq!(
        done.name_any(),
        draining.name_any(),
        "the same remediation resumed"
    );
    let history = done.status.unwrap().phase_history;
    assert_eq!(
        history.iter().filter(|t| t.phase == Phase::Draining).count(),
        1,
        "{history:?}"
    );
    assert_eq!(
        history.iter().filter(|t| t.phase == Phase::Cordoned).count(),
        1,
        "{history:?}"
    );
    // A person releases the held node (action None), freeing its concurrency slot: only the
    // rate window holds the second node back now.
    s.set_unschedulable(&broken, false).await;
    s.wait_phase(&broken, Phase::Succeeded, Duration::from_secs(30))
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        s.remediations().await.len(),
        1,
        "the rate window still counts the first remediation"
    );
    let status = Api::<GpuRemediationPolicy>::all(s.client.clone())
        .get(&s.scope)
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(status.budget.unwrap().started_in_window, 1);
    assert_eq!(status.waiting[0].reason, "DeferredByRate");
    second.stop().await;
}

#[tokio::test]
async fn deleting_a_remediation_before_the_replacement_releases_the_cordon() {
    let s = Scenario::new(3).await;
    let nodes = s.nodes();
    let (broken, spares) = (nodes[0].clone(), nodes[1..2].to_vec());
    s.protected_workload("pinned", &broken, &spares, 2, &Budget::min_available(2))
        .await;
    s.policy(serde_json::json!({"action": "Replace", "safety": {"maxUnhealthy": "100%"}}))
        .await;
    let controller = RunningController::start(&s.scope).await;
    s.break_gpu(&broken).await;
    let draining = s
        .wait_phase(&broken, Phase::Draining, Duration::from_secs(30))
        .await;
    assert!(is_unschedulable(&s.node(&broken).await));
    // Opt the node out first, or the controller would rightly start over on a still-broken node.
    let patch =
        serde_json::json!({"metadata": {"labels": {gpu_remediation_api::constants::OPT_OUT_LABEL: "true"}}});
    Api::<Node>::all(s.client.clone())
        .patch(&broken, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let remediations = Api::<GpuRemediation>::all(s.client.clone());
    remediations
        .delete(&draining.name_any(), &kube::api::DeleteParams::default())
        .await
        .unwrap();
    eventually("the record to be gone", Duration::from_secs(30), || async {
        remediations
            .get_opt(&draining.name_any())
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    let node = s.node(&broken).await;
    assert!(
        !is_unschedulable(&node) && !has_our_taint(&node),
        "our cordon was released"
    );
    assert_eq!(node.annotations().get(CORDONED_BY_ANNOTATION), None);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        s.remediations().await.is_empty(),
        "an opted-out node gets no new remediation"
    );
    controller.stop().await;
}

#[tokio::test]
async fn a_node_that_vanishes_mid_drain_cancels_its_remediation() {
    let s = Scenario::new(3).await;
    let nodes = s.nodes();
    let (broken, spares) = (nodes[0].clone(), nodes[1..2].to_vec());
    s.protected_workload("pinned", &broken, &spares, 2, &Budget::min_available(2))
        .await;
    s.policy(serde_json::json!({"action": "Replace", "safety": {"maxUnhealthy": "100%"}}))
        .await;
    let controller = RunningController::start(&s.scope).await;
    s.break_gpu(&broken).await;
    s.wait_phase(&broken, Phase::Draining, Duration::from_secs(30))
        .await;
    Api::<Node>::all(s.client.clone())
        .delete(&broken, &kube::api::DeleteParams::default())
        .await
        .unwrap();
    let cancelled = s
        .wait_phase(&broken, Phase::Cancelled, Duration::from_secs(30))
        .await;
    assert!(
        cancelled
            .status
            .unwrap()
            .message
            .unwrap()
            .contains("no longer exists")
    );
    controller.stop().await;
}

#[tokio::test]
async fn a_pod_under_two_budgets_is_a_500_blocker_naming_both() {
    let s = Scenario::new(3).await;
    let nodes = s.nodes();
    let (broken, spares) = (nodes[0].clone(), nodes[1..2].to_vec());
    let app = s
        .protected_workload("doubled", &broken, &spares, 2, &Budget::min_available(1))
        .await;
    workload::create(
        &s.client,
        &app.pdb_named("doubled-too", &Budget::min_available(1)),
    )
    .await
    .unwrap();
    s.policy(serde_json::json!({"drain": {"timeout": "4s", "onTimeout": "Block"}, "safety": {"maxUnhealthy": "100%"}}))
        .await;
    let controller = RunningController::start(&s.scope).await;
    s.break_gpu(&broken).await;
    let blocked = s
        .wait_phase(&broken, Phase::Blocked, Duration::from_secs(40))
        .await;
    let drain = blocked.status.unwrap().drain.unwrap();
    let both = format!("{ns}/doubled,{ns}/doubled-too", ns = s.namespace);
    assert_eq!(drain.blockers.len(), 2, "{:?}", drain.blockers);
    assert!(
        drain
            .blockers
            .iter()
            .all(|b| b.code == 500 && b.pdb.as_deref() == Some(both.as_str())),
        "{:?}",
        drain.blockers
    );
    assert_eq!(s.pods_on(&broken).await.len(), 2, "nothing left");
    controller.stop().await;
}

/// The Events the controller published about `name` (of any kind), by reason, with their counts
/// (an Event repeated by the recorder becomes a series with a count).
async fn events_about(client: &Client, name: &str) -> BTreeMap<String, i32> {
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

#[tokio::test]
async fn each_change_is_announced_by_one_event_not_one_per_pass() {
    let s = Scenario::new(10).await;
    let nodes = s.nodes();
    s.policy(serde_json::json!({"safety": {"maxUnhealthy": "30%", "maxConcurrent": 5}}))
        .await;
    // Broken before the controller starts, so its first look sees all four at once.
    for node in &nodes[..4] {
        s.break_gpu(node).await;
    }
    // Let `for` (3s) pass for all four, whose transition seconds may differ, before the
    // controller's first look: it must see the fault at its full extent, not half of it.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let controller = RunningController::start(&s.scope).await;
    eventually("the circuit to open", Duration::from_secs(30), || async {
        let events = events_about(&s.client, &s.scope).await;
        (events.get("CircuitOpen").copied().unwrap_or(0) >= 1).then_some(())
    })
    .await;
    // Passes keep running (pod polls, resyncs, other tests' events): the announcements must not.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let events = events_about(&s.client, &s.scope).await;
    assert_eq!(
        events.get("CircuitOpen"),
        Some(&5),
        "one for the breaker, one per held-back node: {events:?}"
    );
    controller.stop().await;
}

/// A validating webhook on the evictions of one namespace whose endpoint accepts connections and
/// never answers: each eviction there waits the webhook's `timeoutSeconds`, then goes through
/// (`failurePolicy: Ignore`), as behind a slow policy engine.
struct SilentEvictionWebhook {
    name: String,
    held: tokio::task::JoinHandle<()>,
}

impl SilentEvictionWebhook {
    async fn install(client: &Client, namespace: &str, timeout_seconds: i32) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        // Accept and hold every connection, answering nothing (not even the TLS handshake).
        let held = tokio::spawn(async move {
            let mut sockets = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                sockets.push(socket);
            }
        });
        let name = format!("silent-evictions-{namespace}");
        let config: ValidatingWebhookConfiguration = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "webhooks": [{
                "name": "silent-evictions.e2e.gpuremediation.dev",
                "clientConfig": {"url": format!("https://127.0.0.1:{port}/validate")},
                "rules": [{
                    "operations": ["CREATE"],
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "resources": ["pods/eviction"],
                }],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "failurePolicy": "Ignore",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": timeout_seconds,
            }],
        }))
        .expect("a valid webhook configuration");
        Api::<ValidatingWebhookConfiguration>::all(client.clone())
            .create(&PostParams::default(), &config)
            .await
            .expect("creating the webhook configuration");
        Self { name, held }
    }

    async fn remove(self, client: &Client) {
        Api::<ValidatingWebhookConfiguration>::all(client.clone())
            .delete(&self.name, &kube::api::DeleteParams::default())
            .await
            .expect("deleting the webhook configuration");
        self.held.abort();
    }
}

#[tokio::test]
async fn a_node_failing_while_another_drain_round_hangs_is_cordoned_without_waiting_for_it() {
    let s = Scenario::new(3).await;
    let nodes = s.nodes();
    let (first, second, spare) = (nodes[0].clone(), nodes[1].clone(), nodes[2].clone());
    s.protected_workload(
        "held",
        &first,
        std::slice::from_ref(&spare),
        2,
        &Budget::max_unavailable(2),
    )
    .await;
    // Every eviction of the first node's pods hangs 15 s in the webhook before it goes through.
    let webhook = SilentEvictionWebhook::install(&s.client, &s.namespace, 15).await;
    s.policy(serde_json::json!({"safety": {"maxConcurrent": 2, "maxUnhealthy": "100%"}}))
        .await;
    let controller = RunningController::start(&s.scope).await;
    s.break_gpu(&first).await;
    eventually(&format!("{first} cordoned"), Duration::from_secs(20), || async {
        is_unschedulable(&s.node(&first).await).then_some(())
    })
    .await;
    // The first node's drain round is now waiting on the webhook.
    s.break_gpu(&second).await;
    eventually(&format!("{second} cordoned"), Duration::from_secs(30), || async {
        is_unschedulable(&s.node(&second).await).then_some(())
    })
    .await;
    let first_pods = s.pods_on(&first).await;
    assert_eq!(
        first_pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .count(),
        2,
        "the second node was cordoned only after the first node's evictions came back: {:?}",
        first_pods.iter().map(ResourceExt::name_any).collect::<Vec<_>>()
    );
    // And the hung evictions do go through once the webhook times out.
    s.wait_phase(&first, Phase::Verifying, Duration::from_secs(60))
        .await;
    webhook.remove(&s.client).await;
    controller.stop().await;
}

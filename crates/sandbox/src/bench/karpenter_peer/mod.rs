//! The peer: Karpenter's own node repair against this project's policy, on one fault. One
//! Karpenter (upstream, KWOK provider, `NodeRepair` feature gate on) runs two identical
//! `NodePool`s, one per fleet; Karpenter launches every node. Each fleet runs the same workload
//! (two 8-GPU training pods, one per node, behind a `minAvailable: 1` PDB). At one instant the
//! kubelet of one node in each fleet reports `Ready=False` (its Lease keeps renewing: the kubelet
//! is alive and says the node is not ready, e.g. its container runtime is down). Fleet
//! `peer-karpenter` is left to Karpenter's repair (the KWOK provider's repair policies: `Ready`
//! `False` or `Unknown` tolerated 10 minutes, hard-coded); fleet `peer-policy` is governed by a
//! `GpuRemediationPolicy` triggered by the same condition, strategy `DeleteNodeClaim`.
//!
//! Per fleet it measures: fault to the repairer's first act, to a replacement node `Ready`, to the
//! broken node gone, to the workload whole again; the pods that left through the Eviction API
//! versus plain deletes (from the API server's audit log, by identity and namespace, and from
//! each departed pod's `DisruptionTarget` condition); PDB floor breaches (the drain bench's
//! sampler); and the training pods that had to restart.
//!
//! The workload's pods tolerate the `not-ready`/`unreachable` `NoExecute` taints: with the
//! default 300-second toleration kube-controller-manager's taint-eviction controller deletes them
//! five minutes after the fault, before Karpenter's repair acts, and the comparison would measure
//! that controller instead.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod, Toleration};
use kube::api::{DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};

mod report;

pub use report::{PeerComparison, PeerFleetResult, departure_reason, markdown, pod_removals, repairer_acted};

use super::bench_env::{BENCH_NAMESPACE, BenchEnv};
use super::budget_sampler::BudgetSampler;
use super::latency::{fleet_options, wait_policy_observed};
use super::setup::{BenchSetupError, api_error, eventually};
use crate::Fleet;
use crate::controlplane::usage::load_average;
use crate::fleet::FLEET_LABEL;
use crate::karpenter::{Disruption, Karpenter, KarpenterOptions, node_claim_resource};
use crate::workload::{self, Budget, Workload};

/// The fleet left to Karpenter's repair.
pub const KARPENTER_FLEET: &str = "peer-karpenter";
/// The fleet governed by the policy.
pub const POLICY_FLEET: &str = "peer-policy";
/// Karpenter's KWOK provider's toleration of `Ready` `False`/`Unknown` (hard-coded upstream in
/// `kwok/cloudprovider/cloudprovider.go`, `RepairPolicies`).
pub const KARPENTER_TOLERATION: Duration = Duration::from_secs(600);

/// How to run the peer scenario.
#[derive(Debug, Clone)]
pub struct PeerOptions {
    /// The policy trigger's `for`, e.g. `1m`.
    pub trigger_for: String,
    /// How long after the fault both fleets must be whole again.
    pub deadline: Duration,
}

impl Default for PeerOptions {
    fn default() -> Self {
        Self {
            trigger_for: "1m".to_owned(),
            deadline: KARPENTER_TOLERATION + Duration::from_secs(600),
        }
    }
}

fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref())
}

/// One fleet under test.
struct Arm {
    fleet: Fleet,
    namespace: String,
    app: Workload,
    broken: String,
    healthy_pod: String,
    nodes_before: BTreeSet<String>,
    claims_before: BTreeSet<String>,
    broken_claim: String,
}

/// Every pod of a namespace that left (deletion seen), with why: first reason seen.
struct Departures {
    seen: Arc<Mutex<BTreeMap<String, String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Departures {
    fn start(client: &Client, namespace: &str) -> Self {
        let seen = Arc::new(Mutex::new(BTreeMap::new()));
        let shared = Arc::clone(&seen);
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let task = tokio::spawn(async move {
            let mut events = std::pin::pin!(watcher(pods, watcher::Config::default()).default_backoff());
            while let Some(event) = events.next().await {
                let (pod, gone) = match event {
                    Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => (pod, false),
                    Ok(watcher::Event::Delete(pod)) => (pod, true),
                    _ => continue,
                };
                if pod.metadata.deletion_timestamp.is_none() && !gone {
                    continue;
                }
                let reason = departure_reason(&pod);
                let mut seen = shared.lock().unwrap_or_else(PoisonError::into_inner);
                let entry = seen.entry(pod.name_any()).or_insert_with(|| reason.clone());
                if entry == "none" && reason != "none" {
                    *entry = reason;
                }
            }
        });
        Self { seen, task }
    }

    fn finish(self) -> BTreeMap<String, String> {
        self.task.abort();
        self.seen.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

/// Times, in seconds from the fault, as one fleet's poller sees them.
#[derive(Debug, Default)]
struct Clock {
    first_action: Option<f64>,
    claim_deleted: Option<f64>,
    replacement_ready: Option<f64>,
    broken_gone: Option<f64>,
    restored: Option<f64>,
    new_claims: BTreeSet<String>,
    healthy_pod_untouched: bool,
}

impl Clock {
    fn done(&self) -> bool {
        self.replacement_ready.is_some() && self.broken_gone.is_some() && self.restored.is_some()
    }
}

async fn claims(client: &Client, pool: &str) -> Result<Vec<DynamicObject>, BenchSetupError> {
    Ok(
        Api::<DynamicObject>::all_with(client.clone(), &node_claim_resource())
            .list(&ListParams::default().labels(&format!("karpenter.sh/nodepool={pool}")))
            .await
            .map_err(api_error(format!("listing the NodeClaims of {pool}")))?
            .items,
    )
}

fn claim_node(claim: &DynamicObject) -> Option<&str> {
    claim
        .data
        .pointer("/status/nodeName")
        .and_then(serde_json::Value::as_str)
}

/// One look at a fleet: updates `clock` with what is newly true.
async fn observe(client: &Client, arm: &Arm, clock: &mut Clock, since: f64) -> Result<(), BenchSetupError> {
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default().labels(&format!("{FLEET_LABEL}={}", arm.fleet.name())))
        .await
        .map_err(api_error("listing the fleet's nodes"))?
        .items;
    match nodes.iter().find(|n| n.name_any() == arm.broken) {
        None => {
            clock.broken_gone.get_or_insert(since);
        }
        Some(node) if repairer_acted(node) => {
            clock.first_action.get_or_insert(since);
        }
        Some(_) => {}
    }
    if nodes
        .iter()
        .any(|n| !arm.nodes_before.contains(&n.name_any()) && crate::workload::node_is_ready(n))
    {
        clock.replacement_ready.get_or_insert(since);
    }
    for claim in claims(client, arm.fleet.name()).await? {
        let name = claim.name_any();
        if !arm.claims_before.contains(&name) {
            clock.new_claims.insert(name.clone());
        }
        if name == arm.broken_claim && claim.metadata.deletion_timestamp.is_some() {
            clock.claim_deleted.get_or_insert(since);
            clock.first_action.get_or_insert(since);
        }
    }
    if let Some(gone) = clock.broken_gone {
        // Gone between two looks: the claim went with it, and deleting it was the first act.
        clock.claim_deleted.get_or_insert(gone);
        clock.first_action.get_or_insert(gone);
    }
    let pods = Api::<Pod>::namespaced(client.clone(), &arm.namespace)
        .list(&ListParams::default().labels(&arm.app.selector()))
        .await
        .map_err(api_error("listing the workload"))?
        .items;
    clock.healthy_pod_untouched = pods
        .iter()
        .any(|p| p.name_any() == arm.healthy_pod && crate::workload::is_ready(p));
    let ready_elsewhere = pods
        .iter()
        .filter(|p| crate::workload::is_ready(p) && node_of(p) != Some(arm.broken.as_str()))
        .count();
    if ready_elsewhere >= 2 && clock.broken_gone.is_some() {
        clock.restored.get_or_insert(since);
    }
    Ok(())
}

/// The training workload of one fleet: two 8-GPU pods (one node each) behind `minAvailable: 1`,
/// tolerating the node-lifecycle `NoExecute` taints (see the module header).
async fn stage(env: &BenchEnv, fleet: Fleet, karpenter: &Karpenter) -> Result<Arm, BenchSetupError> {
    let namespace = fleet.name().to_owned();
    super::setup::ensure_namespace(&env.client, &namespace).await?;
    let app = Workload::new(&namespace, "train")
        .replicas(2)
        .gpus(fleet.shape().gpus)
        .node_selector(FLEET_LABEL, fleet.name());
    let mut deployment = app.deployment();
    if let Some(spec) = deployment.spec.as_mut().and_then(|s| s.template.spec.as_mut()) {
        spec.tolerations = Some(
            ["node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"]
                .into_iter()
                .map(|key| Toleration {
                    key: Some(key.to_owned()),
                    operator: Some("Exists".to_owned()),
                    effect: Some("NoExecute".to_owned()),
                    ..Toleration::default()
                })
                .collect(),
        );
    }
    let step = |e: &dyn std::fmt::Display| BenchSetupError::Step(format!("{namespace}: {e}"));
    workload::create(&env.client, &deployment)
        .await
        .map_err(|e| step(&e))?;
    workload::create(&env.client, &app.pdb(&Budget::min_available(1)))
        .await
        .map_err(|e| step(&e))?;
    let pods = workload::wait_ready_pods(
        &env.client,
        &namespace,
        &app.selector(),
        2,
        Duration::from_secs(240),
    )
    .await
    .map_err(|e| {
        BenchSetupError::Step(format!(
            "{namespace}: {e}; Karpenter's log ends:\n{}",
            karpenter.log_tail(30)
        ))
    })?;
    workload::wait_pdb_allows(&env.client, &namespace, &app.name, 1, Duration::from_secs(60))
        .await
        .map_err(|e| step(&e))?;
    let before = eventually(
        &format!("the NodeClaims of {namespace} naming their nodes"),
        Duration::from_secs(60),
        || async {
            let seen = claims(&env.client, &namespace).await.ok()?;
            (seen.len() == 2 && seen.iter().all(|c| claim_node(c).is_some())).then_some(seen)
        },
    )
    .await?;
    let mut sorted = pods.clone();
    sorted.sort_by_key(ResourceExt::name_any);
    let broken = node_of(&sorted[0])
        .ok_or_else(|| BenchSetupError::Step(format!("{namespace}: a Ready pod without a node")))?
        .to_owned();
    let healthy_pod = sorted[1].name_any();
    let broken_claim = before
        .iter()
        .find(|c| claim_node(c) == Some(broken.as_str()))
        .map(ResourceExt::name_any)
        .ok_or_else(|| BenchSetupError::Step(format!("{namespace}: no NodeClaim names {broken}")))?;
    let nodes_before = Api::<Node>::all(env.client.clone())
        .list(&ListParams::default().labels(&fleet.selector()))
        .await
        .map_err(api_error("listing the fleet's nodes"))?
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    Ok(Arm {
        fleet,
        namespace,
        app,
        broken,
        healthy_pod,
        nodes_before,
        claims_before: before.iter().map(ResourceExt::name_any).collect(),
        broken_claim,
    })
}

/// The fault: `node`'s kubelet reports `Ready=False` since `at` (its Lease keeps renewing).
async fn break_ready(client: &Client, node: &str, at: Timestamp) -> Result<(), BenchSetupError> {
    let patch = crate::fault::condition_patch(
        None,
        "Ready",
        "False",
        "KubeletNotReady",
        "container runtime is down (set by gpu-bench)",
        at,
    );
    Api::<Node>::all(client.clone())
        .patch_status(node, &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .map(|_| ())
        .map_err(api_error(format!("setting Ready=False on {node}")))
}

fn result(
    peer: &str,
    arm: &Arm,
    clock: &Clock,
    departures: &BTreeMap<String, String>,
    budget: &super::budget_sampler::BudgetReport,
    removals: (u64, u64),
) -> PeerFleetResult {
    let mut by_reason: BTreeMap<String, usize> = BTreeMap::new();
    for reason in departures.values() {
        *by_reason.entry(reason.clone()).or_default() += 1;
    }
    PeerFleetResult {
        peer: peer.to_owned(),
        fleet: arm.fleet.name().to_owned(),
        broken_node: arm.broken.clone(),
        first_action_s: clock.first_action,
        claim_deleted_s: clock.claim_deleted,
        replacement_ready_s: clock.replacement_ready,
        broken_node_gone_s: clock.broken_gone,
        workload_restored_s: clock.restored,
        new_node_claims: clock.new_claims.len(),
        audited_evictions: removals.0,
        audited_deletes: removals.1,
        departures: by_reason,
        pdb_violations: budget.violations.len(),
        least_margin: budget.least_margin.values().copied().min().unwrap_or(0),
        pods_restarted: departures.len(),
        healthy_pod_untouched: clock.healthy_pod_untouched,
    }
}

/// Karpenter (as its own audited identity) over two fresh fleets, each staged with its workload.
struct Setup {
    identity: super::actor::Identity,
    karpenter: Karpenter,
    theirs: Arm,
    ours: Arm,
}

async fn set_up(env: &BenchEnv) -> Result<Setup, BenchSetupError> {
    let server = env.control_plane.server_url().to_owned();
    let identity = super::actor::create_identity(
        &env.control_plane,
        BENCH_NAMESPACE,
        "karpenter",
        &server,
        &env.scratch,
    )
    .await?;
    let mut fleets = Vec::new();
    for name in [KARPENTER_FLEET, POLICY_FLEET] {
        let fleet = Fleet::start(env.client.clone(), fleet_options(name, 0))
            .await
            .map_err(|e| BenchSetupError::Step(format!("starting fleet {name}: {e}")))?;
        fleet.adopt_joining_nodes();
        fleets.push(fleet);
    }
    let karpenter = Karpenter::start_for_fleets(
        &env.control_plane,
        &[&fleets[0], &fleets[1]],
        &KarpenterOptions {
            node_repair: true,
            disruption: Disruption::default(),
            kubeconfig: Some(identity.kubeconfig.clone()),
        },
    )
    .await
    .map_err(|e| BenchSetupError::Step(format!("starting Karpenter: {e}")))?;
    eprintln!(
        "karpenter-peer: Karpenter up (log {}); launching 2 nodes per fleet",
        karpenter.log_path().display()
    );
    let policy_fleet = fleets
        .pop()
        .ok_or_else(|| BenchSetupError::Step("no fleet".to_owned()))?;
    let karpenter_fleet = fleets
        .pop()
        .ok_or_else(|| BenchSetupError::Step("no fleet".to_owned()))?;
    let theirs = stage(env, karpenter_fleet, &karpenter).await?;
    let ours = stage(env, policy_fleet, &karpenter).await?;
    Ok(Setup {
        identity,
        karpenter,
        theirs,
        ours,
    })
}

/// Looks at both fleets every second from the fault at `at` until both are whole again or the
/// deadline passes, then once more after a provisioning batch and `consolidateAfter`.
async fn watch_both(
    env: &BenchEnv,
    theirs: &Arm,
    ours: &Arm,
    at: Timestamp,
    within: Duration,
) -> (Clock, Clock) {
    let (mut their_clock, mut our_clock) = (Clock::default(), Clock::default());
    let deadline = tokio::time::Instant::now() + within;
    let mut last_report = 0.0_f64;
    loop {
        let since = Timestamp::now().duration_since(at).as_secs_f64();
        for (arm, clock) in [(theirs, &mut their_clock), (ours, &mut our_clock)] {
            if !clock.done()
                && let Err(e) = observe(&env.client, arm, clock, since).await
            {
                eprintln!("karpenter-peer: one look failed (retried): {e}");
            }
        }
        if their_clock.done() && our_clock.done() {
            break;
        }
        if since - last_report >= 60.0 {
            last_report = since;
            eprintln!(
                "karpenter-peer: {since:.0} s after the fault: Karpenter fleet {their_clock:?}; policy fleet {our_clock:?}"
            );
        }
        if tokio::time::Instant::now() >= deadline {
            eprintln!("karpenter-peer: deadline reached; recording what happened so far");
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // Longer than a provisioning batch and consolidateAfter: a second replacement would show.
    tokio::time::sleep(Duration::from_secs(15)).await;
    for (arm, clock) in [(theirs, &mut their_clock), (ours, &mut our_clock)] {
        let since = Timestamp::now().duration_since(at).as_secs_f64();
        if let Err(e) = observe(&env.client, arm, clock, since).await {
            eprintln!("karpenter-peer: the last look failed: {e}");
        }
    }
    (their_clock, our_clock)
}

/// Runs the peer scenario once.
pub async fn run(env: &BenchEnv, options: &PeerOptions) -> Result<PeerComparison, BenchSetupError> {
    let Setup {
        identity,
        karpenter,
        theirs,
        ours,
    } = set_up(env).await?;
    let scope = POLICY_FLEET;
    env.create_policy(
        scope,
        POLICY_FLEET,
        &options.trigger_for,
        serde_json::json!({
            "triggers": [{"conditionType": "Ready", "status": "False", "for": options.trigger_for}],
            "action": "Replace",
            "replacement": {"strategy": "DeleteNodeClaim", "timeout": "5m"},
        }),
    )
    .await?;
    let mut controller = env.start_controller(scope, None)?;
    wait_policy_observed(env, scope).await?;

    let mut samplers = Vec::new();
    let mut departures = Vec::new();
    for arm in [&theirs, &ours] {
        samplers.push(
            BudgetSampler::start(&env.client, &arm.namespace)
                .await
                .map_err(|e| BenchSetupError::Step(e.to_string()))?,
        );
        departures.push(Departures::start(&env.client, &arm.namespace));
    }
    let mut log = env.audit();
    log.mark();
    let at = super::bench_env::next_whole_second(Duration::from_millis(300));
    let wait = at.duration_since(Timestamp::now());
    tokio::time::sleep(Duration::try_from(wait).unwrap_or_default()).await;
    let mut load = vec![load_average()];
    let (a, b) = tokio::join!(
        break_ready(&env.client, &theirs.broken, at),
        break_ready(&env.client, &ours.broken, at)
    );
    a?;
    b?;
    eprintln!(
        "karpenter-peer: Ready=False on {} and {} at {at}; Karpenter tolerates it {} s, the policy {}",
        theirs.broken,
        ours.broken,
        KARPENTER_TOLERATION.as_secs(),
        options.trigger_for
    );
    let (their_clock, our_clock) = watch_both(env, &theirs, &ours, at, options.deadline).await;
    load.push(load_average());
    let slice = log.since_mark();
    let mut budgets = samplers.into_iter().map(BudgetSampler::finish);
    let mut gone = departures.into_iter().map(Departures::finish);
    let (their_budget, our_budget) = (
        budgets.next().unwrap_or_default(),
        budgets.next().unwrap_or_default(),
    );
    let (their_gone, our_gone) = (gone.next().unwrap_or_default(), gone.next().unwrap_or_default());
    let karpenter_result = result(
        "Karpenter node repair",
        &theirs,
        &their_clock,
        &their_gone,
        &their_budget,
        pod_removals(&slice, &identity.username, &theirs.namespace),
    );
    // In the policy's fleet both act: the controller drains, Karpenter terminates the claim.
    let (ours_evicted, ours_deleted) = pod_removals(&slice, &env.controller.username, &ours.namespace);
    let (karp_evicted, karp_deleted) = pod_removals(&slice, &identity.username, &ours.namespace);
    let policy_result = result(
        "gpu-remediator (DeleteNodeClaim)",
        &ours,
        &our_clock,
        &our_gone,
        &our_budget,
        (ours_evicted + karp_evicted, ours_deleted + karp_deleted),
    );
    let karpenter_log = std::fs::read_to_string(karpenter.log_path())
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(&theirs.broken) || l.contains(&ours.broken))
        .map(str::to_owned)
        .collect();

    controller.terminate().await;
    karpenter.stop().await;
    for arm in [theirs, ours] {
        let namespace = arm.namespace.clone();
        let policy = (arm.fleet.name() == POLICY_FLEET).then_some(scope);
        env.tear_down(policy, Some(arm.fleet), &namespace).await;
    }
    Ok(PeerComparison {
        fault: "kubelet reports Ready=False (KubeletNotReady), Lease still renewed".to_owned(),
        trigger_for: options.trigger_for.clone(),
        karpenter_toleration_s: KARPENTER_TOLERATION.as_secs(),
        karpenter: karpenter_result,
        policy: policy_result,
        load,
        karpenter_log,
    })
}

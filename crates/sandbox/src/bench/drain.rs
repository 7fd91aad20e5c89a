//! The drain race: one node holding 100 pods of Deployments (3 to 10 replicas each, every one
//! behind a `maxUnavailable: 1` PDB, the scheduler placing replacements on three spare nodes),
//! drained by the controller on one fleet and by `kubectl drain --ignore-daemonsets
//! --delete-emptydir-data --force` (the pinned release's kubectl) on an identical one. Both are
//! timed by the same watch (from the node turning unschedulable to its last pod gone) and judged
//! by the same PDB sampler; the audit log counts each peer's requests and splits its drain link by
//! link into the budgets' part and its own (`drain_links`).

use std::collections::BTreeSet;
use std::time::Duration;

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};

use super::audit::{self, AuditLog, RequestCounts};
use super::bench_env::{self, BenchEnv};
use super::budget_sampler::BudgetSampler;
use super::drain_links::{self, DrainLinks};
use super::latency::{fleet_options, wait_policy_observed};
use super::setup::{BenchSetupError, api_error, eventually};
use crate::Fleet;
use crate::workload::{self, Budget, Workload};

/// Deployment sizes: 3 to 10 replicas, 100 pods in all.
pub const DEPLOYMENT_SIZES: [i32; 16] = [3, 4, 5, 6, 7, 8, 9, 10, 3, 4, 5, 6, 7, 8, 9, 6];

/// One peer's drain.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DrainPeerResult {
    /// `gpu-remediator` or `kubectl drain`.
    pub peer: String,
    /// From the node seen unschedulable to its last pod gone.
    pub seconds: f64,
    /// Pods that left the node.
    pub pods: usize,
    /// PDB violations the sampler saw.
    pub violations: usize,
    /// The smallest healthy-minus-floor over every PDB.
    pub least_margin: i64,
    /// The peer's requests during the drain.
    pub requests: RequestCounts,
    /// Its time, link by link: the budgets' part and its own.
    pub links: DrainLinks,
}

/// Both peers, side by side.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DrainComparison {
    /// The controller.
    pub controller: DrainPeerResult,
    /// `kubectl drain`.
    pub kubectl: DrainPeerResult,
    /// `kubectl.seconds / controller.seconds`: above 1, the controller is faster.
    pub ratio: f64,
}

/// A fleet of four nodes with the 100 pods on its first node, behind observed PDBs.
struct Stage {
    fleet: Fleet,
    namespace: String,
    target: String,
}

async fn set_unschedulable(env: &BenchEnv, node: &str, unschedulable: bool) -> Result<(), BenchSetupError> {
    Api::<Node>::all(env.client.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"unschedulable": unschedulable}})),
        )
        .await
        .map(|_| ())
        .map_err(api_error(format!(
            "setting unschedulable={unschedulable} on {node}"
        )))
}

async fn stage(env: &BenchEnv, name: &str) -> Result<Stage, BenchSetupError> {
    let fleet = Fleet::start(env.client.clone(), fleet_options(name, 4))
        .await
        .map_err(|e| BenchSetupError::Step(format!("starting fleet {name}: {e}")))?;
    let mut nodes = fleet.node_names();
    nodes.sort();
    let (target, spares) = (nodes[0].clone(), nodes[1..].to_vec());
    super::setup::ensure_namespace(&env.client, name).await?;
    for spare in &spares {
        set_unschedulable(env, spare, true).await?;
    }
    let apps: Vec<Workload> = DEPLOYMENT_SIZES
        .iter()
        .enumerate()
        .map(|(i, &replicas)| {
            Workload::new(name, &format!("app-{i:02}"))
                .replicas(replicas)
                .node_selector(crate::fleet::FLEET_LABEL, name)
        })
        .collect();
    for app in &apps {
        workload::create(&env.client, &app.deployment())
            .await
            .map_err(|e| BenchSetupError::Step(e.to_string()))?;
    }
    let total: i32 = DEPLOYMENT_SIZES.iter().sum();
    workload::wait_ready_pods(
        &env.client,
        name,
        "app",
        usize::try_from(total).unwrap_or(0),
        Duration::from_secs(300),
    )
    .await
    .map_err(|e| BenchSetupError::Step(e.to_string()))?;
    for spare in &spares {
        set_unschedulable(env, spare, false).await?;
    }
    for app in &apps {
        workload::create(&env.client, &app.pdb(&Budget::max_unavailable(1)))
            .await
            .map_err(|e| BenchSetupError::Step(e.to_string()))?;
    }
    for app in &apps {
        workload::wait_pdb_allows(&env.client, name, &app.name, 1, Duration::from_secs(120))
            .await
            .map_err(|e| BenchSetupError::Step(e.to_string()))?;
    }
    Ok(Stage {
        fleet,
        namespace: name.to_owned(),
        target,
    })
}

/// Watches one node and its pods: when it was first seen unschedulable, and when its last pod
/// What watches one peer's drain from before its first request: the budgets (the PDB sampler)
/// and the audit log; [`PeerWatch::start`] starts the node's clock with them.
struct PeerWatch {
    sampler: BudgetSampler,
    log: AuditLog,
}

impl PeerWatch {
    async fn start(env: &BenchEnv, stage: &Stage) -> Result<(Self, DrainClock), BenchSetupError> {
        let sampler = BudgetSampler::start(&env.client, &stage.namespace)
            .await
            .map_err(|e| BenchSetupError::Step(e.to_string()))?;
        let clock = DrainClock::start(env, &stage.namespace, &stage.target);
        let mut log = env.audit();
        log.mark();
        Ok((Self { sampler, log }, clock))
    }

    /// The figures of `peer` (whose requests the audit log has as `username`), given its drain's
    /// seconds and pods.
    fn finish(
        self,
        peer: &str,
        username: &str,
        stage: &Stage,
        (seconds, pods): (f64, usize),
    ) -> DrainPeerResult {
        let log = self.log.since_mark();
        let requests = audit::count(&log, username);
        let links = drain_links::measure(&log, username, &stage.namespace);
        let budget = self.sampler.finish();
        DrainPeerResult {
            peer: peer.to_owned(),
            seconds,
            pods,
            violations: budget.violations.len(),
            least_margin: budget.least_margin.values().copied().min().unwrap_or(0),
            requests,
            links,
        }
    }
}

/// was gone after that.
struct DrainClock {
    task: tokio::task::JoinHandle<(Timestamp, Timestamp, usize)>,
}

impl DrainClock {
    fn start(env: &BenchEnv, namespace: &str, node: &str) -> Self {
        let nodes: Api<Node> = Api::all(env.client.clone());
        let pods: Api<Pod> = Api::namespaced(env.client.clone(), namespace);
        let node_config = watcher::Config::default().fields(&format!("metadata.name={node}"));
        let pod_config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
        let task = tokio::spawn(async move {
            let mut node_events =
                std::pin::pin!(watcher(nodes, node_config).default_backoff().applied_objects());
            let mut pod_events = std::pin::pin!(watcher(pods, pod_config).default_backoff());
            let mut on_node: BTreeSet<String> = BTreeSet::new();
            let mut ever: BTreeSet<String> = BTreeSet::new();
            let mut listed = false;
            let mut cordoned_at: Option<Timestamp> = None;
            loop {
                tokio::select! {
                    Some(Ok(node)) = node_events.next() => {
                        if cordoned_at.is_none() && node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false) {
                            cordoned_at = Some(Timestamp::now());
                        }
                    }
                    Some(Ok(event)) = pod_events.next() => match event {
                        watcher::Event::Init => { listed = false; on_node.clear(); }
                        watcher::Event::InitDone => listed = true,
                        watcher::Event::InitApply(pod) | watcher::Event::Apply(pod) => {
                            ever.insert(pod.name_any());
                            on_node.insert(pod.name_any());
                        }
                        watcher::Event::Delete(pod) => { on_node.remove(&pod.name_any()); }
                    },
                }
                if let Some(cordoned) = cordoned_at
                    && listed
                    && on_node.is_empty()
                {
                    return (cordoned, Timestamp::now(), ever.len());
                }
            }
        });
        Self { task }
    }

    async fn wait(self, within: Duration) -> Result<(f64, usize), BenchSetupError> {
        match tokio::time::timeout(within, self.task).await {
            Ok(Ok((cordoned, empty, pods))) => Ok((empty.duration_since(cordoned).as_secs_f64(), pods)),
            Ok(Err(e)) => Err(BenchSetupError::Step(format!("the drain clock failed: {e}"))),
            Err(_) => Err(BenchSetupError::Timeout {
                what: "the node to be drained".to_owned(),
                waited: within,
            }),
        }
    }
}

async fn controller_drain(env: &BenchEnv, stage: &Stage) -> Result<DrainPeerResult, BenchSetupError> {
    let scope = stage.namespace.clone();
    env.create_policy(&scope, stage.fleet.name(), "1s", serde_json::json!({}))
        .await?;
    let mut controller = env.start_controller(&scope, None)?;
    wait_policy_observed(env, &scope).await?;
    let (watch, clock) = PeerWatch::start(env, stage).await?;
    bench_env::set_condition_at(
        &env.client,
        std::slice::from_ref(&stage.target),
        "False",
        "XID79",
        Timestamp::now(),
    )
    .await?;
    let (seconds, pods) = clock.wait(Duration::from_secs(600)).await?;
    // Let the controller record the end of the drain before counting its requests.
    eventually(
        "the remediation to finish its drain",
        Duration::from_secs(60),
        || async {
            let all = env.remediations(&scope).await.ok()?;
            all.iter()
                .any(|r| {
                    r.status
                        .as_ref()
                        .is_some_and(|s| super::bench_env::drained(s.phase))
                })
                .then_some(())
        },
    )
    .await?;
    let result = watch.finish("gpu-remediator", &env.controller.username, stage, (seconds, pods));
    controller.terminate().await;
    if let Err(e) = env.delete_policy(&scope).await {
        eprintln!("teardown (not counted as a failure): {e}");
    }
    Ok(result)
}

async fn kubectl_drain(env: &BenchEnv, stage: &Stage) -> Result<DrainPeerResult, BenchSetupError> {
    let (watch, clock) = PeerWatch::start(env, stage).await?;
    let output = tokio::process::Command::new(env.control_plane.kubectl())
        .arg(format!("--kubeconfig={}", env.kubectl.kubeconfig.display()))
        .args([
            "drain",
            &stage.target,
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--force",
        ])
        .arg("--timeout=10m")
        .output()
        .await
        .map_err(|e| BenchSetupError::Step(format!("running kubectl drain: {e}")))?;
    if !output.status.success() {
        return Err(BenchSetupError::Step(format!(
            "kubectl drain failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    let (seconds, pods) = clock.wait(Duration::from_secs(60)).await?;
    Ok(watch.finish("kubectl drain", &env.kubectl.username, stage, (seconds, pods)))
}

/// Stages two identical fleets, drains one with each peer (the controller first), and compares.
pub async fn run(env: &BenchEnv) -> Result<DrainComparison, BenchSetupError> {
    eprintln!("drain: staging two fleets of 4 nodes with 100 pods on the first node of each");
    let [ours, theirs] = drain_links::NAMESPACES;
    let ours = stage(env, ours).await?;
    let theirs = stage(env, theirs).await?;
    let controller = controller_drain(env, &ours).await?;
    eprintln!("drain: gpu-remediator {:.1} s", controller.seconds);
    let kubectl = kubectl_drain(env, &theirs).await?;
    eprintln!("drain: kubectl drain {:.1} s", kubectl.seconds);
    for stage in [ours, theirs] {
        let namespace = stage.namespace.clone();
        env.tear_down(None, Some(stage.fleet), &namespace).await;
    }
    let ratio = kubectl.seconds / controller.seconds;
    Ok(DrainComparison {
        controller,
        kubectl,
        ratio,
    })
}

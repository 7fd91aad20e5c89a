//! The leak, with quarantine on and off: on a fleet with a steady stream of new one-GPU pods, one
//! node at a time reports `GpuHealthy=False`; the pods the scheduler binds to it from the fault
//! until just before its remediation's cordon (the trigger's `for` later; the drain then takes
//! them away) are the leak, counted from the pods' own `PodScheduled` times against the fault's; with quarantine on, the time from the fault to a
//! node watch seeing the quarantine taint. Each fault is healed (and its node released) before the
//! next. Both arms run in one `make bench`, one after the other, on fleets of the same shape.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};

use super::bench_env::{self, BenchEnv};
use super::cordon_watch::CordonWatch;
use super::latency::{fleet_options, wait_policy_observed};
use super::percentile::percentile;
use super::setup::ensure_namespace;
use super::setup::{BenchSetupError, api_error, eventually};
use crate::Fleet;
use crate::fleet::FLEET_LABEL;
use crate::workload::Workload;

/// How long before the trigger's `for` elapses a fault's leak is counted (pods the scheduler binds
/// in that last moment are not counted: the figure is a floor).
const LOOK_BEFORE_FOR: Duration = Duration::from_millis(300);

/// One quarantine run's shape.
#[derive(Debug, Clone)]
pub struct QuarantineOptions {
    /// Fleet size.
    pub nodes: usize,
    /// Faults, one after the other, each on its own node.
    pub faults: usize,
    /// The trigger's `for`.
    pub trigger_for: Duration,
    /// A new one-GPU pod every this long.
    pub pod_every: Duration,
    /// Each pod is deleted this long after it was created (longer than `for`, so that every pod
    /// leaked onto a faulty node is still there to be counted).
    pub pod_lifetime: Duration,
}

impl Default for QuarantineOptions {
    fn default() -> Self {
        Self {
            nodes: 6,
            faults: 6,
            trigger_for: Duration::from_secs(6),
            pod_every: Duration::from_millis(250),
            pod_lifetime: Duration::from_secs(10),
        }
    }
}

/// One arm's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct QuarantineResult {
    /// Whether the policy quarantined at the first signal.
    pub quarantine: bool,
    /// Fleet size.
    pub nodes: usize,
    /// Faults.
    pub faults: usize,
    /// The trigger's `for`, seconds.
    pub trigger_for_seconds: u64,
    /// New pods per second in the stream.
    pub pods_per_second: f64,
    /// Pods bound to a faulty node after its fault began, per fault.
    pub leaked: Vec<usize>,
    /// Their sum.
    pub leaked_total: usize,
    /// Fault to quarantine taint, median (quarantine on only).
    pub fault_to_quarantine_p50_ms: Option<f64>,
    /// 99th percentile.
    pub fault_to_quarantine_p99_ms: Option<f64>,
    /// Every fault-to-quarantine latency, ms, sorted.
    pub samples_ms: Vec<f64>,
}

/// Runs the arm with quarantine off, then the one with it on.
pub async fn run(
    env: &BenchEnv,
    options: &QuarantineOptions,
) -> Result<Vec<QuarantineResult>, BenchSetupError> {
    let mut results = Vec::new();
    for quarantine in [false, true] {
        results.push(run_arm(env, options, quarantine).await?);
    }
    Ok(results)
}

async fn run_arm(
    env: &BenchEnv,
    options: &QuarantineOptions,
    quarantine: bool,
) -> Result<QuarantineResult, BenchSetupError> {
    let scope = format!("leak-{}", if quarantine { "on" } else { "off" });
    eprintln!("quarantine {scope}: {} nodes, starting the fleet", options.nodes);
    let fleet = Fleet::start(env.client.clone(), fleet_options(&scope, options.nodes))
        .await
        .map_err(|e| BenchSetupError::Step(format!("starting fleet {scope}: {e}")))?;
    ensure_namespace(&env.client, &scope).await?;
    let for_text = format!("{}s", options.trigger_for.as_secs());
    env.create_policy(
        &scope,
        &scope,
        &for_text,
        serde_json::json!({"quarantine": {"enabled": quarantine, "max": "100%", "hysteresis": "1s"}}),
    )
    .await?;
    let mut controller = env.start_controller(&scope, None)?;
    let measured = async {
        wait_policy_observed(env, &scope).await?;
        let watch = CordonWatch::start(&env.client, &fleet.selector())
            .await
            .map_err(|e| BenchSetupError::Step(e.to_string()))?;
        let stream = PodStream::start(&env.client, &scope, &scope, options);
        let mut names = fleet.node_names();
        names.sort();
        let faults = faults(env, options, &scope, &names, &watch).await;
        drop(stream);
        faults
    }
    .await;
    if controller.exited().is_some() {
        eprintln!(
            "quarantine {scope}: the controller exited early:\n{}",
            controller.log_tail(30)
        );
    }
    controller.terminate().await;
    env.tear_down(Some(&scope), Some(fleet), &scope).await;
    let (leaked, mut samples) = measured?;
    samples.sort_by(f64::total_cmp);
    let result = QuarantineResult {
        quarantine,
        nodes: options.nodes,
        faults: options.faults,
        trigger_for_seconds: options.trigger_for.as_secs(),
        pods_per_second: 1.0 / options.pod_every.as_secs_f64(),
        leaked_total: leaked.iter().sum(),
        leaked,
        fault_to_quarantine_p50_ms: percentile(&samples, 50.0),
        fault_to_quarantine_p99_ms: percentile(&samples, 99.0),
        samples_ms: samples,
    };
    eprintln!(
        "quarantine {scope}: leaked {} pods over {} faults, fault to quarantine p50 {:?} ms p99 {:?} ms",
        result.leaked_total,
        result.faults,
        result.fault_to_quarantine_p50_ms,
        result.fault_to_quarantine_p99_ms
    );
    Ok(result)
}

/// The faults, one after the other: each node's leak and (quarantine on) fault-to-taint latency.
async fn faults(
    env: &BenchEnv,
    options: &QuarantineOptions,
    scope: &str,
    names: &[String],
    watch: &CordonWatch,
) -> Result<(Vec<usize>, Vec<f64>), BenchSetupError> {
    // The stream fills the fleet before the first fault.
    tokio::time::sleep(options.pod_lifetime).await;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), scope);
    let mut leaked = Vec::new();
    let mut samples = Vec::new();
    for node in names.iter().cycle().take(options.faults) {
        let broken = std::slice::from_ref(node);
        let at = bench_env::next_whole_second(Duration::from_millis(300));
        tokio::time::sleep(Duration::try_from(at.duration_since(Timestamp::now())).unwrap_or_default()).await;
        bench_env::set_condition_at(&env.client, broken, "False", "XID79", at).await?;
        // Just before `for` elapses: every pod leaked so far is bound, and the drain that follows
        // the cordon has not taken any away yet.
        tokio::time::sleep(options.trigger_for.saturating_sub(LOOK_BEFORE_FOR)).await;
        let fleet_pods = pods
            .list(&ListParams::default())
            .await
            .map_err(api_error(format!("listing the pods of {scope}")))?;
        let bound = fleet_pods
            .items
            .iter()
            .filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some()))
            .count();
        if bound == 0 {
            return Err(BenchSetupError::Step(format!(
                "the pod stream has no pod bound to the fleet ({} pods in {scope}): nothing to measure",
                fleet_pods.items.len()
            )));
        }
        let on_node: Vec<&Pod> = fleet_pods
            .items
            .iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node.as_str()))
            .collect();
        let count = on_node
            .iter()
            .filter(|p| scheduled_at(p).is_some_and(|t| t >= at))
            .count();
        eprintln!(
            "quarantine {scope}: fault on {node}: {count} pods leaked ({bound} stream pods bound on the fleet)"
        );
        leaked.push(count);
        if let Some(seen) = watch.first_quarantined().get(node) {
            samples.push(seen.duration_since(at).as_secs_f64() * 1000.0);
        }
        bench_env::set_condition_at(&env.client, broken, "True", "GpusHealthy", Timestamp::now()).await?;
        eventually(&format!("{node} released"), Duration::from_secs(60), || async {
            let remediations = env.remediations(scope).await.ok()?;
            let done = remediations
                .iter()
                .filter(|r| r.spec.node_name == *node)
                .all(|r| r.status.as_ref().is_some_and(|s| s.phase.is_terminal()));
            (done && !watch.quarantined().contains(node)).then_some(())
        })
        .await?;
        watch.forget_first_held(broken);
        // The fleet fills again before the next fault.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    Ok((leaked, samples))
}

/// When the scheduler bound `pod` (its `PodScheduled=True` transition, whole seconds).
fn scheduled_at(pod: &Pod) -> Option<Timestamp> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "PodScheduled" && c.status == "True")
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0)
}

/// A new one-GPU pod on the fleet every `pod_every`, each deleted `pod_lifetime` after it was
/// created.
struct PodStream {
    task: tokio::task::JoinHandle<()>,
}

impl PodStream {
    fn start(client: &Client, namespace: &str, fleet: &str, options: &QuarantineOptions) -> Self {
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let template = Workload::new(namespace, "stream")
            .node_selector(FLEET_LABEL, fleet)
            .gpus(1)
            .pod_template();
        let (every, lifetime) = (options.pod_every, options.pod_lifetime);
        let task = tokio::spawn(async move {
            let mut live: Vec<(tokio::time::Instant, String)> = Vec::new();
            let mut tick = tokio::time::interval(every);
            for i in 0_u64.. {
                tick.tick().await;
                let name = format!("stream-{i}");
                let pod = Pod {
                    metadata: kube::api::ObjectMeta {
                        name: Some(name.clone()),
                        ..template.metadata.clone().unwrap_or_default()
                    },
                    spec: template.spec.clone(),
                    status: None,
                };
                if pods.create(&PostParams::default(), &pod).await.is_ok() {
                    live.push((tokio::time::Instant::now(), name));
                }
                while live.first().is_some_and(|(at, _)| at.elapsed() > lifetime) {
                    let (_, old) = live.remove(0);
                    let _ = pods.delete(&old, &DeleteParams::default().grace_period(0)).await;
                }
            }
        });
        Self { task }
    }
}

impl Drop for PodStream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

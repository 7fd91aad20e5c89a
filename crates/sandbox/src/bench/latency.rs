//! Detection-to-cordon latency: on a fleet of `nodes` nodes carrying `pods_per_node` pods each,
//! `k` nodes report `GpuHealthy=False` with one shared transition time; the latency of each is
//! from the instant its trigger's `for` elapses to the instant a node watch sees it cordoned and
//! tainted. Rounds of 1, 10, 100 faults run on the same fleet and controller, on nodes no earlier
//! round broke while the fleet has enough (earlier rounds' drains still run in the background);
//! otherwise the broken nodes are healed, their remediations deleted and the nodes released first.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use kube::Api;
use kube::api::DeleteParams;

use super::bench_env::{self, BenchEnv};
use super::cordon_watch::CordonWatch;
use super::percentile::percentile;
use super::setup::{BenchSetupError, api_error, eventually};
use crate::controlplane::usage::ComponentUsage;
use crate::fleet::FLEET_LABEL;
use crate::population::{self, PopulationOptions};
use crate::{Fleet, FleetOptions};

/// One latency run's shape.
#[derive(Debug, Clone)]
pub struct LatencyOptions {
    /// Fleet size.
    pub nodes: usize,
    /// Pods per node (Deployments behind PDBs over the whole fleet).
    pub pods_per_node: usize,
    /// Simultaneous faults per round.
    pub faults: Vec<usize>,
    /// The trigger's `for`.
    pub trigger_for: Duration,
}

/// One round's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LatencyResult {
    /// Fleet size.
    pub nodes: usize,
    /// Pods on the fleet.
    pub pods: usize,
    /// Simultaneous faults.
    pub faults: usize,
    /// Nodes seen cordoned within the round's deadline.
    pub cordoned: usize,
    /// Median latency.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Worst.
    pub max_ms: f64,
    /// Every latency, ms, sorted.
    pub samples_ms: Vec<f64>,
    /// The controller's peak RSS after the round.
    pub controller_peak_rss_mib: f64,
    /// The instant the faults' `for` elapsed (RFC 3339): every sample is measured from it.
    pub due: String,
    /// Fault seen to quarantine seen, for each node of the round seen quarantined after its fault
    /// was seen (the quarantine taint, at the fault's first sight, before `for`: from then on no
    /// new pod lands there); both by the bench's node watch, so the harness's own writes are not
    /// in it. Zero when none was seen: read it with `quarantine_samples_ms`' length.
    pub quarantine: super::drain_links::Spread,
    /// Every fault-to-quarantine latency, ms, sorted.
    pub quarantine_samples_ms: Vec<f64>,
    /// The controller's requests from the faults' write to the last cordon seen, as the audit
    /// log has them (received and answered), in the order answered: where a round's time went.
    pub requests: Vec<super::audit::AuditedRequest>,
}

/// Fleet options every bench fleet shares: heartbeats every 30 s so that thousands of simulated
/// nodes do not spend the two cores on Lease renewals (the control plane's grace period is raised
/// to match).
#[must_use]
pub fn fleet_options(name: &str, nodes: usize) -> FleetOptions {
    FleetOptions {
        nodes,
        name_prefix: name.to_owned(),
        heartbeat_interval: Duration::from_secs(30),
        lease_duration_seconds: 120,
        registration_concurrency: 32,
        ..FleetOptions::default()
    }
}

/// Creates `pods` pods (Deployments of 20 behind `maxUnavailable: 10%` PDBs) on fleet `fleet` in
/// namespace `namespace` and waits until they are Ready.
pub async fn populate(
    env: &BenchEnv,
    namespace: &str,
    fleet: &str,
    pods: usize,
) -> Result<(), BenchSetupError> {
    if pods == 0 {
        return Ok(());
    }
    let options = PopulationOptions {
        namespace: namespace.to_owned(),
        pods,
        pods_per_deployment: 20,
        gpu_every: 0,
        node_selector: (FLEET_LABEL.to_owned(), fleet.to_owned()),
    };
    population::create(&env.client, &options)
        .await
        .map_err(|e| BenchSetupError::Step(format!("creating the population: {e}")))?;
    let within = Duration::from_secs(120 + u64::try_from(pods / 10).unwrap_or(u64::MAX));
    eventually(&format!("{pods} pods Ready in {namespace}"), within, || async {
        let ready = population::ready_pods(&env.client, namespace).await.ok()?;
        (ready >= pods).then_some(())
    })
    .await
}

/// Waits until the controller has written policy `scope`'s status for its current generation.
pub async fn wait_policy_observed(env: &BenchEnv, scope: &str) -> Result<(), BenchSetupError> {
    let api: Api<gpu_remediation_api::GpuRemediationPolicy> = Api::all(env.client.clone());
    eventually(
        &format!("the controller to report on policy {scope}"),
        Duration::from_secs(120),
        || async {
            let policy = api.get(scope).await.ok()?;
            let observed = policy.status.as_ref()?.observed_generation;
            (observed.is_some() && observed == policy.metadata.generation).then_some(())
        },
    )
    .await
}

/// Heals `nodes`, deletes policy `scope`'s remediations and waits until the controller has
/// released every node; then forgets when they were first held, so that a later round's samples
/// are of that round's cordons.
pub async fn reset(
    env: &BenchEnv,
    scope: &str,
    watch: &CordonWatch,
    nodes: &[String],
) -> Result<(), BenchSetupError> {
    bench_env::heal_at(&env.client, nodes, Timestamp::now()).await?;
    let api: Api<gpu_remediation_api::GpuRemediation> = Api::all(env.client.clone());
    for remediation in env.remediations(scope).await? {
        let name = remediation.metadata.name.clone().unwrap_or_default();
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.is_not_found() => {}
            Err(source) => return Err(api_error(format!("deleting remediation {name}"))(source)),
        }
    }
    let released = eventually(
        "every node released and every remediation gone",
        Duration::from_secs(180),
        || async {
            let left = env.remediations(scope).await.ok()?;
            (left.is_empty() && watch.held().is_empty()).then_some(())
        },
    )
    .await;
    if released.is_err() {
        let left: Vec<String> = env
            .remediations(scope)
            .await?
            .iter()
            .map(|r| {
                let phase = r.status.as_ref().map(|s| s.phase.to_string()).unwrap_or_default();
                let deleting = r.metadata.deletion_timestamp.is_some();
                format!("{} {phase} deleting={deleting}", r.spec.node_name)
            })
            .collect();
        return Err(BenchSetupError::Step(format!(
            "the controller did not release the nodes within 180s of their remediations being \
             deleted; remediations left: {left:?}; nodes still held: {:?}",
            watch.held()
        )));
    }
    watch.forget_first_held(nodes);
    Ok(())
}

/// Runs every round of `options` on a fresh fleet and controller.
pub async fn run(env: &BenchEnv, options: &LatencyOptions) -> Result<Vec<LatencyResult>, BenchSetupError> {
    let scope = format!("lat-{}-{}", options.nodes, options.pods_per_node);
    let pods = options.nodes * options.pods_per_node;
    eprintln!(
        "latency: {} nodes, {pods} pods: starting the fleet",
        options.nodes
    );
    let fleet = Fleet::start(env.client.clone(), fleet_options(&scope, options.nodes))
        .await
        .map_err(|e| BenchSetupError::Step(format!("starting fleet {scope}: {e}")))?;
    populate(env, &scope, &scope, pods).await?;
    let for_text = format!("{}s", options.trigger_for.as_secs());
    env.create_policy(&scope, &scope, &for_text, serde_json::json!({}))
        .await?;
    let mut controller = env.start_controller(&scope, None)?;
    wait_policy_observed(env, &scope).await?;
    let watch = CordonWatch::start(&env.client, &fleet.selector())
        .await
        .map_err(|e| BenchSetupError::Step(e.to_string()))?;
    let mut names = fleet.node_names();
    names.sort();
    let rounds = run_rounds(env, options, &scope, &names, &watch, &controller).await;
    if controller.exited().is_some() {
        eprintln!(
            "latency: the controller exited early:\n{}",
            controller.log_tail(30)
        );
    }
    controller.terminate().await;
    drop(watch);
    env.tear_down(Some(&scope), Some(fleet), &scope).await;
    rounds
}

/// The rounds themselves; the caller cleans up whatever they return.
pub(crate) async fn run_rounds(
    env: &BenchEnv,
    options: &LatencyOptions,
    scope: &str,
    names: &[String],
    watch: &CordonWatch,
    controller: &super::actor::ControllerProcess,
) -> Result<Vec<LatencyResult>, BenchSetupError> {
    let pods = options.nodes * options.pods_per_node;
    let mut results = Vec::new();
    // Each round breaks nodes no earlier round broke while the fleet has enough; only then are
    // the broken nodes healed, their remediations deleted and the nodes released for reuse.
    let mut next = 0;
    for &faults in &options.faults {
        if next + faults > names.len() {
            reset(env, scope, watch, &names[..next]).await?;
            next = 0;
        }
        let broken: Vec<String> = names[next..next + faults].to_vec();
        next += faults;
        let at = bench_env::next_whole_second(Duration::from_millis(300));
        let wait = at.duration_since(Timestamp::now());
        tokio::time::sleep(Duration::try_from(wait).unwrap_or_default()).await;
        let mut log = env.audit();
        log.mark();
        // As the agent reports an XID 79 on GPU 1: the condition and the failed GPU in one write.
        bench_env::fail_gpu_at(&env.client, &broken, 1, at).await?;
        let due = at
            .checked_add(SignedDuration::try_from(options.trigger_for).unwrap_or_default())
            .unwrap_or(at);
        let deadline = options.trigger_for + Duration::from_secs(120);
        let everyone = eventually(&format!("{faults} nodes cordoned"), deadline, || async {
            let first = watch.first_held();
            broken.iter().all(|n| first.contains_key(n)).then_some(first)
        })
        .await;
        let first = everyone.unwrap_or_else(|_| watch.first_held());
        let requests = super::audit::requests(&log.since_mark(), &env.controller.username);
        // Every node of `broken` was released (or never held) before this round, and `reset`
        // forgot its earlier cordons: each sample is this round's.
        let samples = super::cordon_watch::held_after_ms(&first, &broken, due);
        let to_quarantine = watch.fault_to_quarantine_ms();
        let mut quarantine: Vec<f64> = broken
            .iter()
            .filter_map(|n| to_quarantine.get(n))
            .copied()
            .collect();
        quarantine.sort_by(f64::total_cmp);
        let usage = controller.usage();
        let result = LatencyResult {
            nodes: options.nodes,
            pods,
            faults,
            cordoned: samples.len(),
            p50_ms: percentile(&samples, 50.0).unwrap_or(f64::NAN),
            p99_ms: percentile(&samples, 99.0).unwrap_or(f64::NAN),
            max_ms: samples.last().copied().unwrap_or(f64::NAN),
            samples_ms: samples,
            quarantine: super::drain_links::Spread::of(&quarantine),
            quarantine_samples_ms: quarantine,
            controller_peak_rss_mib: usage.as_ref().map_or(f64::NAN, ComponentUsage::peak_rss_mib),
            due: due.to_string(),
            requests,
        };
        eprintln!(
            "latency: {} nodes, {} faults: {}/{} cordoned, p50 {:.0} ms, p99 {:.0} ms; {}/{} quarantined, \
             p50 {:.0} ms, p99 {:.0} ms from the fault seen",
            result.nodes,
            faults,
            result.cordoned,
            faults,
            result.p50_ms,
            result.p99_ms,
            result.quarantine_samples_ms.len(),
            faults,
            result.quarantine.p50_ms,
            result.quarantine.p99_ms
        );
        results.push(result);
    }
    Ok(results)
}

//! What the controller costs as the fleet grows: a fresh controller process per fleet size, its
//! peak RSS (`VmHWM`) and CPU time once idle, then again after ten nodes were remediated at once,
//! and the requests it made per remediation (from the audit log), with every write listed.
//!
//! The fleet may be padded with bare nodes (no kubelet, no pods) and every node's status may be
//! rewritten on a period while the remediations run ([`node_churn`]), as kubelets report status:
//! the pod lists per remediation then show whether an unrelated node's change wakes the drains.

use std::time::Duration;

use jiff::Timestamp;

use super::audit::{self, AuditedRequest, RequestCounts};
use super::bench_env::{self, BenchEnv};
use super::latency::{fleet_options, populate, wait_policy_observed};
use super::node_churn::NodeChurn;
use super::setup::{BenchSetupError, eventually};
use crate::Fleet;
use crate::fleet::FLEET_LABEL;

/// Nodes registered at a time: the fleet waits for each batch to be schedulable, and thousands at
/// once do not make it within that wait on two cores.
const BATCH: usize = 1000;

/// One footprint run's shape.
#[derive(Debug, Clone)]
pub struct FootprintOptions {
    /// Nodes with a simulated kubelet (the pods run there).
    pub nodes: usize,
    /// Pods per such node.
    pub pods_per_node: usize,
    /// Nodes failed at once.
    pub faults: usize,
    /// Bare nodes added beside them (no kubelet, no pods), under the same policy.
    pub bystanders: usize,
    /// Every node's status is rewritten once per this period while the remediations run.
    pub churn: Option<Duration>,
}

/// One fleet size's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FootprintResult {
    /// Fleet size (nodes with a kubelet).
    pub nodes: usize,
    /// Bare nodes beside them.
    pub bystanders: usize,
    /// Node status writes the churn made while the remediations ran (0 without churn).
    pub node_status_writes: u64,
    /// The churn's period, seconds (each node's status rewritten once per period).
    pub churn_period_seconds: Option<f64>,
    /// Pods on the fleet.
    pub pods: usize,
    /// Peak RSS once idle (caches synced, then 10 s).
    pub idle_peak_rss_mib: f64,
    /// CPU seconds from start to idle.
    pub idle_cpu_seconds: f64,
    /// Peak RSS after the remediations.
    pub remediation_peak_rss_mib: f64,
    /// CPU seconds spent during the remediations.
    pub remediation_cpu_seconds: f64,
    /// Remediations carried out.
    pub remediations: usize,
    /// Seconds from the faults to every remediation `Succeeded`.
    pub remediation_seconds: f64,
    /// Requests per remediation (all kinds).
    pub requests_per_remediation: f64,
    /// Writes per remediation (everything but get, list and watch).
    pub writes_per_remediation: f64,
    /// Pod lists per remediation.
    pub pod_lists_per_remediation: f64,
    /// The controller's requests during the remediations.
    pub requests: RequestCounts,
    /// Every write the controller made during the remediations, in order.
    pub writes: Vec<AuditedRequest>,
}

/// Measures one fleet shape.
pub async fn run(env: &BenchEnv, options: &FootprintOptions) -> Result<FootprintResult, BenchSetupError> {
    let FootprintOptions {
        nodes,
        pods_per_node,
        bystanders,
        churn,
        ..
    } = options.clone();
    let scope = if bystanders == 0 && churn.is_none() {
        format!("fp-{nodes}-{pods_per_node}")
    } else {
        format!(
            "fp-{nodes}-{pods_per_node}-{bystanders}-{}",
            if churn.is_some() { "churn" } else { "quiet" }
        )
    };
    let pods = nodes * pods_per_node;
    eprintln!("footprint: {nodes} nodes (+{bystanders} bare), {pods} pods: starting the fleet");
    let fleet = Fleet::start(env.client.clone(), fleet_options(&scope, nodes.min(BATCH)))
        .await
        .map_err(|e| BenchSetupError::Step(format!("starting fleet {scope}: {e}")))?;
    while fleet.node_names().len() < nodes {
        let more = (nodes - fleet.node_names().len()).min(BATCH);
        fleet
            .add_nodes(more)
            .await
            .map_err(|e| BenchSetupError::Step(format!("growing fleet {scope}: {e}")))?;
    }
    let measured = measure(env, options, &scope, &fleet).await;
    tear_down(env, &scope, fleet, bystanders).await;
    measured
}

/// Deletes what [`run`] made; never fails the run.
async fn tear_down(env: &BenchEnv, scope: &str, fleet: Fleet, bystanders: usize) {
    if bystanders > 0 {
        let api: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(env.client.clone());
        let list = kube::api::ListParams::default().labels(&format!("{FLEET_LABEL}={}", bare_fleet(scope)));
        let params = kube::api::DeleteParams::default();
        if let Err(e) = crate::retry::retrying(&format!("deleting the bare nodes of {scope}"), || {
            api.delete_collection(&params, &list)
        })
        .await
        {
            eprintln!("teardown (not counted as a failure): deleting the bare nodes of {scope}: {e}");
        }
    }
    env.tear_down(Some(scope), Some(fleet), scope).await;
}

/// The fleet label of `scope`'s bare nodes.
fn bare_fleet(scope: &str) -> String {
    format!("{scope}-bare")
}

async fn measure(
    env: &BenchEnv,
    options: &FootprintOptions,
    scope: &str,
    fleet: &Fleet,
) -> Result<FootprintResult, BenchSetupError> {
    let FootprintOptions {
        nodes,
        pods_per_node,
        faults,
        bystanders,
        churn,
    } = options.clone();
    let pods = nodes * pods_per_node;
    let bare = bare_fleet(scope);
    if bystanders > 0 {
        super::scale::register(env, &bare, bystanders, super::scale::ScaleLabels::Bench).await?;
    }
    populate(env, scope, scope, pods).await?;
    // The policy selects the fleet's nodes only; the bare nodes are watched and cached like any
    // node, and their changes reach the controller.
    env.create_policy(scope, scope, "2s", serde_json::json!({}))
        .await?;
    let mut controller = env.start_controller(scope, None)?;
    wait_policy_observed(env, scope).await?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let idle = controller.usage().ok_or_else(|| {
        BenchSetupError::Step(format!("the controller exited:\n{}", controller.log_tail(30)))
    })?;
    let mut names = fleet.node_names();
    names.sort();
    let mut everyone = names.clone();
    everyone.extend((0..bystanders).map(|i| crate::fleet::node::node_name(&bare, i)));
    let churning = churn.map(|period| NodeChurn::start(env.client.clone(), everyone, period));
    let broken: Vec<String> = names.into_iter().take(faults).collect();
    let mut log = env.audit();
    log.mark();
    let started = Timestamp::now();
    bench_env::set_condition_at(&env.client, &broken, "False", "XID79", started).await?;
    let finished = eventually(
        &format!("{faults} remediations to finish their drains"),
        Duration::from_secs(600),
        || async {
            let all = env.remediations(scope).await.ok()?;
            let done = all
                .iter()
                .filter(|r| {
                    r.status
                        .as_ref()
                        .is_some_and(|s| super::bench_env::drained(s.phase))
                })
                .count();
            (done >= faults).then_some(())
        },
    )
    .await;
    let node_status_writes = match churning {
        Some(churning) => churning.stop().await,
        None => 0,
    };
    finished?;
    let remediation_seconds = Timestamp::now().duration_since(started).as_secs_f64();
    let after = controller.usage().ok_or_else(|| {
        BenchSetupError::Step(format!("the controller exited:\n{}", controller.log_tail(30)))
    })?;
    let text = log.since_mark();
    let requests = audit::count(&text, &env.controller.username);
    let writes: Vec<AuditedRequest> = audit::requests(&text, &env.controller.username)
        .into_iter()
        .filter(AuditedRequest::is_write)
        .collect();
    controller.terminate().await;
    #[allow(clippy::cast_precision_loss, reason = "request counts are small")]
    let each = |n: u64| n as f64 / faults.max(1) as f64;
    let per = each(requests.total);
    let result = FootprintResult {
        nodes,
        bystanders,
        node_status_writes,
        churn_period_seconds: churn.map(|p| p.as_secs_f64()),
        pods,
        idle_peak_rss_mib: idle.peak_rss_mib(),
        idle_cpu_seconds: idle.cpu_seconds,
        remediation_peak_rss_mib: after.peak_rss_mib(),
        remediation_cpu_seconds: after.cpu_seconds - idle.cpu_seconds,
        remediations: faults,
        remediation_seconds,
        requests_per_remediation: per,
        writes_per_remediation: each(writes.len() as u64),
        pod_lists_per_remediation: each(requests.by_kind.get("list pods").copied().unwrap_or(0)),
        requests,
        writes,
    };
    eprintln!(
        "footprint: {nodes} nodes, {pods} pods: idle {:.1} MiB, after {faults} remediations {:.1} MiB, {:.1} requests each",
        result.idle_peak_rss_mib, result.remediation_peak_rss_mib, per
    );
    Ok(result)
}

//! What the controller costs as the fleet grows: a fresh controller process per fleet size, its
//! peak RSS (`VmHWM`) and CPU time once idle, then again after ten nodes were remediated at once,
//! and the requests it made per remediation (from the audit log).

use std::time::Duration;

use jiff::Timestamp;

use super::audit::{self, RequestCounts};
use super::bench_env::{self, BenchEnv, BenchSetupError, eventually};
use super::latency::{fleet_options, populate, wait_policy_observed};
use crate::Fleet;

/// Nodes registered at a time: the fleet waits for each batch to be schedulable, and thousands at
/// once do not make it within that wait on two cores.
const BATCH: usize = 1000;

/// One fleet size's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FootprintResult {
    /// Fleet size.
    pub nodes: usize,
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
    /// The controller's requests during the remediations.
    pub requests: RequestCounts,
}

#[allow(clippy::cast_precision_loss, reason = "bytes shown in MiB")]
fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Measures one fleet size with `pods_per_node` pods on every node and `faults` remediations.
pub async fn run(
    env: &BenchEnv,
    nodes: usize,
    pods_per_node: usize,
    faults: usize,
) -> Result<FootprintResult, BenchSetupError> {
    let scope = format!("fp-{nodes}-{pods_per_node}");
    let pods = nodes * pods_per_node;
    eprintln!("footprint: {nodes} nodes, {pods} pods: starting the fleet");
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
    populate(env, &scope, &scope, pods).await?;
    env.create_policy(&scope, &scope, "2s", serde_json::json!({}))
        .await?;
    let mut controller = env.start_controller(&scope, None)?;
    wait_policy_observed(env, &scope).await?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let idle = controller.usage().ok_or_else(|| {
        BenchSetupError::Step(format!("the controller exited:\n{}", controller.log_tail(30)))
    })?;
    let mut names = fleet.node_names();
    names.sort();
    let broken: Vec<String> = names.into_iter().take(faults).collect();
    let mut log = env.audit();
    log.mark();
    let started = Timestamp::now();
    bench_env::set_condition_at(&env.client, &broken, "False", "XID79", started).await?;
    eventually(
        &format!("{faults} remediations to finish their drains"),
        Duration::from_secs(600),
        || async {
            let all = env.remediations(&scope).await.ok()?;
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
    .await?;
    let remediation_seconds = Timestamp::now().duration_since(started).as_secs_f64();
    let after = controller.usage().ok_or_else(|| {
        BenchSetupError::Step(format!("the controller exited:\n{}", controller.log_tail(30)))
    })?;
    let requests = audit::count(&log.since_mark(), &env.controller.username);
    controller.terminate().await;
    env.tear_down(Some(&scope), Some(fleet), &scope).await;
    #[allow(clippy::cast_precision_loss, reason = "request counts are small")]
    let per = requests.total as f64 / faults.max(1) as f64;
    let result = FootprintResult {
        nodes,
        pods,
        idle_peak_rss_mib: mib(idle.peak_rss_bytes),
        idle_cpu_seconds: idle.cpu_seconds,
        remediation_peak_rss_mib: mib(after.peak_rss_bytes),
        remediation_cpu_seconds: after.cpu_seconds - idle.cpu_seconds,
        remediations: faults,
        remediation_seconds,
        requests_per_remediation: per,
        requests,
    };
    eprintln!(
        "footprint: {nodes} nodes, {pods} pods: idle {:.1} MiB, after {faults} remediations {:.1} MiB, {:.1} requests each",
        result.idle_peak_rss_mib, result.remediation_peak_rss_mib, per
    );
    Ok(result)
}

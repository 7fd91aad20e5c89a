//! The GPU-hours a recycle costs a training gang (`gpu-bench --only gang`): one job of 4 workers,
//! 8 GPUs each, one per node of a 5-node fleet (the fifth takes the broken node's place), as an
//! indexed `Job` (evicted pods replaced at once: a `podFailurePolicy` ignores `DisruptionTarget`;
//! failed ones after the `Job`'s own back-off) whose pods are gang members of the simulated
//! kubelet ([`crate::fleet::gang`]):
//! when one worker dies the others stall in their collective until its timeout, then fail; a
//! worker acknowledges the checkpoint notice after its checkpoint time. One node's GPU fails; the
//! controller drains it under four policies, one arm each, on fleets of the same shape:
//! `Members`, `Members` with a notice, `Together`, `Together` with a notice.
//!
//! Measured per arm, from the fault (the condition's `lastTransitionTime`): when the job runs again
//! (all 4 indexes Running in pods created after the fault, on healthy nodes), and so the GPU-seconds
//! its 32 GPUs sat without progress. The work lost since the last checkpoint is a model, stated:
//! the job's last periodic checkpoint was [`GangOptions::since_checkpoint`] before the fault, and a
//! checkpoint written on the notice by every healthy worker (seen on the pods before they left)
//! saves it all (a data-parallel job: any healthy worker holds the whole state). The broken node's
//! worker never acknowledges: its GPU is gone (its checkpoint annotation is taken off at the fault).
//!
//! Timings are the scaled by 1/10 (a 10-minute collective timeout, a 2-minute checkpoint,
//! 15 minutes since the last checkpoint) so the four arms run in about five minutes.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use super::bench_env::{self, BenchEnv};
use super::latency::fleet_options;
use super::setup::{BenchSetupError, api_error, ensure_namespace, eventually};
use crate::Fleet;
use crate::fleet::gang;
use gpu_remediation_api::constants::{CHECKPOINTED_ANNOTATION, gang_labels};

/// Workers in the job, one per node.
const WORKERS: u32 = 4;
/// GPUs per worker (a whole node).
const GPUS: u32 = 8;

/// The scenario's timings.
#[derive(Debug, Clone)]
pub struct GangOptions {
    /// The workers' collective timeout.
    pub collective_timeout: Duration,
    /// How long a worker takes to checkpoint on the notice.
    pub checkpoint: Duration,
    /// The policy's `drain.notice` in the arms that give one.
    pub notice: Duration,
    /// How long before the fault the job's last periodic checkpoint was (the model of work lost).
    pub since_checkpoint: Duration,
    /// The trigger's `for`.
    pub trigger_for: Duration,
}

impl Default for GangOptions {
    fn default() -> Self {
        Self {
            collective_timeout: Duration::from_secs(60),
            checkpoint: Duration::from_secs(12),
            notice: Duration::from_secs(60),
            since_checkpoint: Duration::from_secs(90),
            trigger_for: Duration::from_secs(2),
        }
    }
}

/// One arm's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GangResult {
    /// `drain.gangs`.
    pub gangs: String,
    /// `drain.notice`, seconds (0: none).
    pub notice_seconds: u64,
    /// The collective timeout, seconds.
    pub collective_timeout_seconds: u64,
    /// From the fault until the job ran again on healthy nodes, seconds.
    pub fault_to_running_again_seconds: f64,
    /// The job's GPUs times that: GPU-seconds without progress.
    pub idle_gpu_seconds: f64,
    /// Whether every healthy worker acknowledged the notice before it left.
    pub checkpointed: bool,
    /// The work lost since the last checkpoint, GPU-seconds (the model: 0 where checkpointed).
    pub lost_work_gpu_seconds: f64,
    /// Their sum.
    pub total_gpu_seconds: f64,
    /// The record's `status.drain.gpuSeconds` (what the controller counted for its drain).
    pub record_gpu_seconds: u64,
}

/// The four arms, one after the other.
pub async fn run(env: &BenchEnv, options: &GangOptions) -> Result<Vec<GangResult>, BenchSetupError> {
    let mut results = Vec::new();
    for (gangs, notice) in [
        ("Members", false),
        ("Members", true),
        ("Together", false),
        ("Together", true),
    ] {
        let notice = if notice { options.notice } else { Duration::ZERO };
        results.push(run_arm(env, options, gangs, notice).await?);
    }
    Ok(results)
}

async fn run_arm(
    env: &BenchEnv,
    options: &GangOptions,
    gangs: &str,
    notice: Duration,
) -> Result<GangResult, BenchSetupError> {
    let scope = format!("gang-{}-{}", gangs.to_lowercase(), notice.as_secs());
    eprintln!("gang {scope}: starting the fleet");
    let mut shape = fleet_options(&scope, usize::try_from(WORKERS).unwrap_or(4) + 1);
    shape.gpus_per_node = GPUS;
    let fleet = Fleet::start(env.client.clone(), shape)
        .await
        .map_err(|e| BenchSetupError::Step(format!("starting fleet {scope}: {e}")))?;
    ensure_namespace(&env.client, &scope).await?;
    let measured = async {
        let first = start_job(env, &scope, options).await?;
        env.create_policy(
            &scope,
            &scope,
            &format!("{}s", options.trigger_for.as_secs()),
            json!({"drain": {"gangs": gangs, "notice": format!("{}s", notice.as_secs()), "timeout": "10m"}}),
        )
        .await?;
        let mut controller = env
            .start_controller(&scope, None)
            .map_err(|e| BenchSetupError::Step(e.to_string()))?;
        let result = fault_and_measure(env, options, &scope, &first).await;
        if controller.exited().is_some() {
            eprintln!(
                "gang {scope}: the controller exited early:\n{}",
                controller.log_tail(30)
            );
        }
        controller.terminate().await;
        result
    }
    .await;
    env.tear_down(Some(&scope), Some(fleet), &scope).await;
    let (running_again, checkpointed, record_gpu_seconds) = measured?;
    let all_gpus = f64::from(WORKERS * GPUS);
    let idle = all_gpus * running_again;
    let lost = if checkpointed {
        0.0
    } else {
        all_gpus * options.since_checkpoint.as_secs_f64()
    };
    let result = GangResult {
        gangs: gangs.to_owned(),
        notice_seconds: notice.as_secs(),
        collective_timeout_seconds: options.collective_timeout.as_secs(),
        fault_to_running_again_seconds: running_again,
        idle_gpu_seconds: idle,
        checkpointed,
        lost_work_gpu_seconds: lost,
        total_gpu_seconds: idle + lost,
        record_gpu_seconds,
    };
    eprintln!("gang {scope}: {result:?}");
    Ok(result)
}

/// Starts the job (an indexed `Job` of [`WORKERS`] gang members) and waits until it runs; its
/// pods, by index.
async fn start_job(
    env: &BenchEnv,
    scope: &str,
    options: &GangOptions,
) -> Result<BTreeMap<String, Pod>, BenchSetupError> {
    let annotations = json!({
        gang::COLLECTIVE_TIMEOUT_ANNOTATION: format!("{}s", options.collective_timeout.as_secs()),
        gang::CHECKPOINT_ANNOTATION: format!("{}s", options.checkpoint.as_secs()),
    });
    let mut job = gang::indexed_job(scope, "train", (WORKERS, GPUS), scope, 100, &annotations);
    // As recommended for Jobs: an evicted pod is replaced at once, not counted as a failure.
    job["spec"]["podFailurePolicy"] =
        json!({"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]});
    let job: k8s_openapi::api::batch::v1::Job =
        serde_json::from_value(job).map_err(|e| BenchSetupError::Step(format!("building the job: {e}")))?;
    Api::<k8s_openapi::api::batch::v1::Job>::namespaced(env.client.clone(), scope)
        .create(&PostParams::default(), &job)
        .await
        .map_err(api_error(format!("creating the job in {scope}")))?;
    eventually("the job's workers running", Duration::from_secs(90), || async {
        let by_index = running_by_index(&workers(env, scope).await.ok()?, None);
        (by_index.len() == WORKERS as usize).then_some(by_index)
    })
    .await
}

/// The job's pods now.
async fn workers(env: &BenchEnv, scope: &str) -> Result<Vec<Pod>, BenchSetupError> {
    Ok(Api::<Pod>::namespaced(env.client.clone(), scope)
        .list(&ListParams::default().labels("app=train"))
        .await
        .map_err(api_error(format!("listing the workers of {scope}")))?
        .items)
}

/// Of `pods`, the Running ones by completion index, created after `since` where given.
fn running_by_index(pods: &[Pod], since: Option<Timestamp>) -> BTreeMap<String, Pod> {
    pods.iter()
        .filter(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                && since.is_none_or(|since| p.creation_timestamp().is_some_and(|t| t.0 > since))
        })
        .filter_map(|p| {
            let index = p.annotations().get(gang_labels::COMPLETION_INDEX)?.clone();
            Some((index, p.clone()))
        })
        .collect()
}

/// Breaks the node of index 0's worker and measures: seconds from the fault until the job runs
/// again, whether every healthy worker checkpointed before leaving, the record's GPU-seconds.
async fn fault_and_measure(
    env: &BenchEnv,
    options: &GangOptions,
    scope: &str,
    first: &BTreeMap<String, Pod>,
) -> Result<(f64, bool, u64), BenchSetupError> {
    super::latency::wait_policy_observed(env, scope).await?;
    let broken_pod = &first["0"];
    let broken = broken_pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    // Its GPU is gone: its worker is hung and will never checkpoint.
    let hung = json!({"metadata": {"annotations": {gang::CHECKPOINT_ANNOTATION: null}}});
    Api::<Pod>::namespaced(env.client.clone(), scope)
        .patch(
            &broken_pod.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&hung),
        )
        .await
        .map_err(api_error("marking the broken node's worker hung"))?;
    let fault = bench_env::next_whole_second(Duration::from_millis(300));
    tokio::time::sleep(Duration::try_from(fault.duration_since(Timestamp::now())).unwrap_or_default()).await;
    bench_env::set_condition_at(
        &env.client,
        std::slice::from_ref(&broken),
        "False",
        "XID79",
        fault,
    )
    .await?;

    // Which healthy workers acknowledged before they left, as last seen.
    let mut acknowledged: BTreeMap<String, bool> = BTreeMap::new();
    let healthy: Vec<String> = first
        .values()
        .filter(|p| p.uid() != broken_pod.uid())
        .map(ResourceExt::name_any)
        .collect();
    let patience = options.collective_timeout + options.notice + Duration::from_secs(180);
    let deadline = tokio::time::Instant::now() + patience;
    let running_again = loop {
        // One list a look: the acknowledgements of the workers still there, and the new ones.
        let now = workers(env, scope).await?;
        for pod in now.iter().filter(|p| healthy.contains(&p.name_any())) {
            let acked = pod.annotations().contains_key(CHECKPOINTED_ANNOTATION);
            acknowledged.insert(pod.name_any(), acked);
        }
        let again = running_by_index(&now, Some(fault));
        if again.len() == WORKERS as usize {
            let on_broken = again
                .values()
                .any(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(broken.as_str()));
            if on_broken {
                return Err(BenchSetupError::Step(format!(
                    "a worker restarted on the broken node {broken}"
                )));
            }
            break Timestamp::now();
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(BenchSetupError::Step(format!(
                "{scope}: the job did not run again within {:?} of the fault ({} of {WORKERS} workers); its pods: {}",
                patience,
                again.len(),
                describe_pods(&now)
            )));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let checkpointed = healthy
        .iter()
        .all(|name| acknowledged.get(name).copied().unwrap_or(false));
    let record_gpu_seconds = env
        .remediations(scope)
        .await?
        .iter()
        .filter_map(|r| r.status.as_ref()?.drain.as_ref().map(|d| d.gpu_seconds))
        .sum();
    Ok((
        running_again.duration_since(fault).as_secs_f64(),
        checkpointed,
        record_gpu_seconds,
    ))
}

/// Each of `pods`: name, phase, reason, node, created, deleting (for a failure's message).
fn describe_pods(pods: &[Pod]) -> String {
    pods.iter()
        .map(|p| {
            let status = p.status.as_ref();
            format!(
                "{} {:?} {:?} on {:?} created {:?} deleting {}",
                p.name_any(),
                status.and_then(|s| s.phase.clone()),
                status.and_then(|s| s.reason.clone()),
                p.spec.as_ref().and_then(|s| s.node_name.clone()),
                p.creation_timestamp().map(|t| t.0.to_string()),
                p.metadata.deletion_timestamp.is_some()
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The arms side by side, in Markdown.
#[must_use]
pub fn table(results: &[GangResult]) -> String {
    let mut out = String::new();
    let Some(first) = results.first() else { return out };
    let _ = writeln!(
        out,
        "### GPU-seconds a recycle costs a training gang ({WORKERS} workers x {GPUS} GPUs, collective timeout {} s)\n",
        first.collective_timeout_seconds
    );
    out.push_str(
        "| drain.gangs | notice | fault to running again | idle GPU-seconds | checkpointed | work lost (GPU-s, model) | total GPU-seconds | record's drain.gpuSeconds |\n",
    );
    out.push_str("|---|---:|---:|---:|:---:|---:|---:|---:|\n");
    for r in results {
        let _ = writeln!(
            out,
            "| {} | {} s | {:.1} s | {:.0} | {} | {:.0} | {:.0} | {} |",
            r.gangs,
            r.notice_seconds,
            r.fault_to_running_again_seconds,
            r.idle_gpu_seconds,
            if r.checkpointed { "yes" } else { "no" },
            r.lost_work_gpu_seconds,
            r.total_gpu_seconds,
            r.record_gpu_seconds
        );
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(gangs: &str, notice: u64, again: f64, checkpointed: bool) -> GangResult {
        let idle = f64::from(WORKERS * GPUS) * again;
        let lost = if checkpointed { 0.0 } else { 32.0 * 90.0 };
        GangResult {
            gangs: gangs.into(),
            notice_seconds: notice,
            collective_timeout_seconds: 60,
            fault_to_running_again_seconds: again,
            idle_gpu_seconds: idle,
            checkpointed,
            lost_work_gpu_seconds: lost,
            total_gpu_seconds: idle + lost,
            record_gpu_seconds: 0,
        }
    }

    #[test]
    fn the_table_puts_the_arms_side_by_side_with_their_gpu_seconds() {
        let text = table(&[
            result("Members", 0, 63.5, false),
            result("Together", 60, 15.0, true),
        ]);
        assert!(
            text.contains("4 workers x 8 GPUs, collective timeout 60 s"),
            "{text}"
        );
        assert!(
            text.contains("| Members | 0 s | 63.5 s | 2032 | no | 2880 | 4912 | 0 |"),
            "{text}"
        );
        assert!(
            text.contains("| Together | 60 s | 15.0 s | 480 | yes | 0 | 480 | 0 |"),
            "{text}"
        );
        assert!(table(&[]).is_empty());
    }
}

//! Drain for gangs with the real `JobSet` controller (upstream `sigs.k8s.io/jobset`, its webhooks
//! registered, `gpu_sandbox::jobset`) on the real control plane: a 4-worker `JobSet` (one indexed
//! `Job`, 8 GPUs a worker, one worker per node, no retry inside the `Job`: a lost worker fails it
//! and the `JobSet` restarts every worker), a fifth node spare, a protected Deployment behind a
//! `minAvailable` budget on the node that breaks. One node's GPU fails.
//!
//! - `Together`: the three workers on healthy nodes are evicted through the Eviction API within
//!   seconds of the record's admission; the `JobSet` restarts once and runs its four workers again
//!   on healthy nodes; no budget is broken; the three nodes stay schedulable.
//! - `Members` (the default): only the failing node's worker is evicted; the others leave only by
//!   the `JobSet`'s own restart (deleted, not evicted).
//!
//! The manager is built from `tools/jobset` on first use (about a minute warm, more cold), so these
//! tests are `#[ignore]`d in `make test`; `make e2e-real` (which CI runs) runs them with `--ignored`.

mod common;
mod scenario;

use std::collections::BTreeSet;
use std::time::Duration;

use common::eventually;
use gpu_remediation_api::GpuRemediation;
use gpu_sandbox::jobset::{self, JobSetController};
use gpu_sandbox::workload::Budget;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DynamicObject, ListParams, PostParams};
use kube::{Api, ResourceExt};
use scenario::{BudgetWatch, RunningController, Scenario, gangs_of, is_unschedulable};
use serde_json::json;

/// The test binary's `JobSet` manager, started once on its shared control plane.
static JOBSET: tokio::sync::OnceCell<JobSetController> = tokio::sync::OnceCell::const_new();

async fn jobset_running() -> &'static JobSetController {
    JOBSET
        .get_or_init(|| async {
            JobSetController::start(common::cluster().await)
                .await
                .unwrap_or_else(|e| panic!("starting JobSet: {e}"))
        })
        .await
}

const NAME: &str = "llm";

fn node_of(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}

fn running(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// The `JobSet`'s pods now.
async fn workers(s: &Scenario) -> Vec<Pod> {
    Api::<Pod>::namespaced(s.client.clone(), &s.namespace)
        .list(&ListParams::default().labels(&format!(
            "{}={NAME}",
            gpu_remediation_api::constants::gang_labels::JOBSET_NAME
        )))
        .await
        .unwrap()
        .items
}

/// The `JobSet`'s `status.restarts`.
async fn restarts(s: &Scenario) -> i64 {
    Api::<DynamicObject>::namespaced_with(s.client.clone(), &s.namespace, &jobset::resource())
        .get(NAME)
        .await
        .unwrap()
        .data["status"]["restarts"]
        .as_i64()
        .unwrap_or(0)
}

/// One run: the `JobSet`'s four workers running, then the node of one of them breaking under a
/// policy with `drain` merged in, until the record names the gang.
struct Run {
    s: Scenario,
    controller: RunningController,
    broken: String,
    /// The first generation of workers on healthy nodes.
    others: Vec<Pod>,
    record: GpuRemediation,
    /// The protected Deployment's pods.
    budget: BudgetWatch,
    /// The `JobSet`'s pods: which left, and whether through the Eviction API.
    gang: BudgetWatch,
    /// The controller's metrics.
    metrics: gpu_remediator::telemetry::Metrics,
}

impl Run {
    async fn start(drain: serde_json::Value) -> Self {
        jobset_running().await;
        let s = Scenario::new(5).await;
        let gang = jobset::gang(
            &s.namespace,
            NAME,
            4,
            8,
            3,
            &json!({gpu_sandbox::fleet::FLEET_LABEL: s.fleet.name()}),
            &json!({}),
        );
        let gang: DynamicObject = serde_json::from_value(gang).unwrap();
        Api::<DynamicObject>::namespaced_with(s.client.clone(), &s.namespace, &jobset::resource())
            .create(&PostParams::default(), &gang)
            .await
            .unwrap();
        let first = eventually(
            "the JobSet's 4 workers running",
            Duration::from_secs(90),
            || async {
                let now: Vec<Pod> = workers(&s).await.into_iter().filter(running).collect();
                (now.len() == 4).then_some(now)
            },
        )
        .await;
        let nodes: BTreeSet<String> = first.iter().map(node_of).collect();
        assert_eq!(nodes.len(), 4, "one worker per node");
        let broken = node_of(&first[0]);
        let others: Vec<Pod> = first.iter().filter(|p| node_of(p) != broken).cloned().collect();
        let spare: Vec<String> = s.nodes().into_iter().filter(|n| *n != broken).collect();
        let serve = s
            .protected_workload("serve", &broken, &spare, 3, &Budget::min_available(2))
            .await;
        let budget = BudgetWatch::start(&s.client, &s.namespace, &serve.selector());
        let gang = BudgetWatch::start(
            &s.client,
            &s.namespace,
            &format!(
                "{}={NAME}",
                gpu_remediation_api::constants::gang_labels::JOBSET_NAME
            ),
        );

        s.policy(json!({"drain": drain, "safety": {"maxUnhealthy": "100%"}}))
            .await;
        let metrics = gpu_remediator::telemetry::Metrics::new();
        let controller = RunningController::start_reporting(&s.scope, metrics.clone()).await;
        s.break_gpu(&broken).await;
        let record = eventually("the record names the gang", Duration::from_secs(60), || async {
            let record = s.remediation_of(&broken).await?;
            (!gangs_of(&record).is_empty()).then_some(record)
        })
        .await;
        Self {
            s,
            controller,
            broken,
            others,
            record,
            budget,
            gang,
            metrics,
        }
    }

    /// Whether each of `pods` left through the Eviction API; `None` while it has not left.
    fn evicted(&self, pods: &[Pod]) -> Vec<Option<bool>> {
        let left = self.gang.left();
        pods.iter().map(|p| left.get(&p.name_any()).copied()).collect()
    }

    /// Until the `JobSet` runs four workers of a later generation, all on healthy nodes.
    async fn wait_running_again(&self) -> Vec<Pod> {
        let first: BTreeSet<String> = self.others.iter().filter_map(ResourceExt::uid).collect();
        eventually(
            "the JobSet running its 4 workers again on healthy nodes",
            Duration::from_secs(120),
            || async {
                let now: Vec<Pod> = workers(&self.s)
                    .await
                    .into_iter()
                    .filter(|p| running(p) && !first.contains(&p.uid().unwrap_or_default()))
                    .collect();
                (now.len() == 4).then_some(now)
            },
        )
        .await
    }
}

#[tokio::test]
#[ignore = "needs the JobSet binary: make e2e-real"]
async fn together_evicts_the_three_workers_elsewhere_within_seconds_and_the_jobset_restarts_once() {
    let run = Run::start(json!({"gangs": "Together"})).await;
    let s = &run.s;
    let gangs = gangs_of(&run.record);
    assert_eq!(gangs.len(), 1, "{gangs:?}");
    assert_eq!(gangs[0].gang, format!("JobSet {}/{NAME}", s.namespace));
    assert_eq!(gangs[0].nodes.len(), 4, "{gangs:?}");
    let mut recorded: Vec<String> = gangs[0].evicted.iter().map(|m| m.uid.clone()).collect();
    let mut expected: Vec<String> = run.others.iter().filter_map(ResourceExt::uid).collect();
    recorded.sort();
    expected.sort();
    assert_eq!(
        recorded, expected,
        "the record names the three workers elsewhere, by UID"
    );

    let admitted = run.record.creation_timestamp().unwrap().0;
    let left = eventually(
        "the three workers elsewhere evicted",
        Duration::from_secs(30),
        || async {
            run.evicted(&run.others)
                .iter()
                .all(|evicted| *evicted == Some(true))
                .then_some(k8s_openapi::jiff::Timestamp::now())
        },
    )
    .await;
    assert!(
        left.duration_since(admitted).as_secs() < 20,
        "evicted by {left}, admitted {admitted}: within seconds of admission"
    );

    let again = run.wait_running_again().await;
    assert!(
        again.iter().all(|p| node_of(p) != run.broken),
        "the restarted workers run on healthy nodes"
    );
    // Settle: a second eviction wave would restart the JobSet again.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(restarts(s).await, 1, "the JobSet restarted once");
    assert!(
        workers(s).await.iter().filter(|p| running(p)).count() == 4,
        "still four workers running after the settle"
    );
    for pod in &run.others {
        let node = s.node(&node_of(pod)).await;
        assert!(!is_unschedulable(&node), "{} was cordoned", node.name_any());
    }
    assert!(
        is_unschedulable(&s.node(&run.broken).await),
        "the broken node is cordoned"
    );
    assert!(
        run.budget.fewest_healthy() >= 2,
        "the protected Deployment's budget (minAvailable 2) held"
    );
    drain_cost_is_recorded_and_exported(&run, 4).await;
    run.controller.stop().await;
}

/// The drain's GPU-seconds: `evicted` workers of 8 GPUs each, every one evicted since the fault
/// began (the trigger's `since`), so the cost is positive and no larger than `evicted` x 8 GPUs x
/// the time since then; the policy's status sums it and the metric exports it.
async fn drain_cost_is_recorded_and_exported(run: &Run, evicted: u64) {
    let s = &run.s;
    let began = run
        .record
        .spec
        .trigger
        .since
        .as_ref()
        .expect("the fault's time")
        .0;
    let record = eventually("the drain's cost recorded", Duration::from_secs(60), || async {
        let record = s.remediation_of(&run.broken).await?;
        let drain = record.status.as_ref()?.drain.as_ref()?;
        (drain.pods_remaining == 0 && drain.gpu_seconds > 0).then_some(record)
    })
    .await;
    let cost = record.status.unwrap().drain.unwrap().gpu_seconds;
    let since = k8s_openapi::jiff::Timestamp::now().duration_since(began);
    let bound = u64::try_from(since.as_secs()).unwrap() + 1;
    assert!(
        cost <= evicted * 8 * bound,
        "{cost} GPU-seconds: at most {evicted} workers x 8 GPUs x {bound} s since the fault"
    );
    eventually("the policy sums the cost", Duration::from_secs(30), || async {
        let policy = Api::<gpu_remediation_api::GpuRemediationPolicy>::all(s.client.clone())
            .get(&s.scope)
            .await
            .ok()?;
        (policy.status?.drain_gpu_seconds == cost).then_some(())
    })
    .await;
    let series = format!(
        "gpu_remediator_drain_gpu_seconds_total{{policy=\"{}\"}} {cost}",
        s.scope
    );
    assert!(
        run.metrics.encode().lines().any(|l| l == series),
        "{series} in the metrics:\n{}",
        run.metrics.encode()
    );
}

#[tokio::test]
#[ignore = "needs the JobSet binary: make e2e-real"]
async fn members_evicts_only_the_failing_nodes_worker() {
    let run = Run::start(json!({})).await;
    let s = &run.s;
    let gangs = gangs_of(&run.record);
    assert_eq!(gangs[0].gang, format!("JobSet {}/{NAME}", s.namespace));
    assert!(
        gangs[0].evicted.is_empty(),
        "Members evicts nobody elsewhere: {gangs:?}"
    );
    // The JobSet restarts when its failing node's worker is evicted; the workers elsewhere leave
    // by that restart (the Job's deletion), never through the Eviction API.
    run.wait_running_again().await;
    assert_eq!(restarts(s).await, 1, "the JobSet restarted once, on its own");
    let evicted = run.evicted(&run.others);
    assert!(
        evicted.iter().all(|e| *e == Some(false)),
        "the workers elsewhere left by the restart, none evicted: {evicted:?}"
    );
    assert!(
        run.budget.fewest_healthy() >= 2,
        "the protected Deployment's budget (minAvailable 2) held"
    );
    let recorded = s.remediation_of(&run.broken).await.unwrap();
    assert!(
        gangs_of(&recorded)[0].evicted.is_empty(),
        "still nobody elsewhere evicted"
    );
    drain_cost_is_recorded_and_exported(&run, 1).await;
    run.controller.stop().await;
}

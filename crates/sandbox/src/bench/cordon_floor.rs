//! The cordon floor (`gpu-bench --scale`): the writes the fault path needs before a node is
//! cordoned, sent by the bench itself as fast as the server takes them, on the same fleet and seen
//! by the same node watch, so that the controller's detection to cordon stands beside the least this
//! server, on this machine, allows.
//!
//! For each fault, in the controller's order: a fresh read of the node, the create of its
//! remediation record (the controller's shape: spec with the policy's snapshot, labels; no
//! finalizer, as no controller would take it off), then the cordon, one merge patch (the
//! `cordoned-by` annotation, `unschedulable` and the remediation taint, the node's resourceVersion
//! as precondition). Every fault of a round starts at one instant; a sample runs from that instant
//! to the node seen held by the watch. Nothing else is there: no detection, no planning, no
//! queueing behind other work, no fence (the bench's identity is outside it).
//!
//! Two arms: every fault's writes in flight at once (the floor the ratios are taken to), and, for
//! rounds larger than the controller's starting concurrency, as many faults at a time as the
//! controller starts at once ([`run_rounds`]'s `in_flight`), which tells that limit's part of a
//! burst's time from the rest.
//!
//! Run after the controller stopped, on nodes no earlier round touched.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt, stream};
use gpu_remediation_api::{
    GpuRemediation, GpuRemediationPolicy, GpuRemediationSpec,
    constants::{CORDONED_BY_ANNOTATION, NODE_LABEL, POLICY_LABEL, REMEDIATION_TAINT_KEY, node_conditions},
    policy::ConditionStatus,
    remediation::{PolicySnapshot, TriggerRecord},
};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt as _};

use super::bench_env::{self, BenchEnv};
use super::cordon_watch::{CordonWatch, held_after_ms};
use super::percentile::percentile;
use super::setup::{BenchSetupError, api_error, eventually};

/// One round of the floor.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FloorRound {
    /// Faults at once.
    pub faults: usize,
    /// Faults whose writes were in flight at once (`faults` for the floor itself).
    pub in_flight: usize,
    /// Nodes seen held within the deadline.
    pub cordoned: usize,
    /// Median, ms from the round's instant.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Worst.
    pub max_ms: f64,
}

/// The record the controller creates for `node` under `policy`, as the floor writes it.
fn record_for(policy: &GpuRemediationPolicy, node: &str, since: Timestamp) -> GpuRemediation {
    let snapshot: Option<PolicySnapshot> = serde_json::to_value(&policy.spec)
        .ok()
        .and_then(|spec| serde_json::from_value(spec).ok())
        .map(|snapshot: PolicySnapshot| PolicySnapshot {
            generation: policy.metadata.generation,
            ..snapshot
        });
    let policy_name = policy.name_any();
    let mut record = GpuRemediation::new(
        &format!("floor-{node}"),
        GpuRemediationSpec {
            node_name: node.to_owned(),
            policy_name: policy_name.clone(),
            trigger: TriggerRecord {
                condition_type: node_conditions::GPU_HEALTHY.to_owned(),
                status: ConditionStatus::False,
                reason: "XID79".to_owned(),
                message: "set by gpu-bench".to_owned(),
                since: Some(Time(since)),
            },
            action: policy.spec.action,
            mode: policy.spec.mode,
            node_uid: None,
            previous_incident: None,
            policy_snapshot: snapshot,
            hardware: None,
        },
    );
    record.metadata.labels = Some(BTreeMap::from([
        (NODE_LABEL.to_owned(), node.to_owned()),
        (POLICY_LABEL.to_owned(), policy_name),
    ]));
    record
}

/// The three writes of one fault, in order.
async fn cordon_one(
    env: &BenchEnv,
    policy: &GpuRemediationPolicy,
    node: &str,
    at: Timestamp,
) -> Result<(), BenchSetupError> {
    let nodes: Api<Node> = Api::all(env.client.clone());
    let fresh = nodes
        .get(node)
        .await
        .map_err(api_error(format!("reading node {node}")))?;
    let mut record = record_for(policy, node, at);
    record.spec.node_uid = fresh.metadata.uid.clone();
    Api::<GpuRemediation>::all(env.client.clone())
        .create(&PostParams::default(), &record)
        .await
        .map_err(api_error(format!("creating the floor's record for {node}")))?;
    let mut taints = fresh.spec.and_then(|s| s.taints).unwrap_or_default();
    taints.push(k8s_openapi::api::core::v1::Taint {
        key: REMEDIATION_TAINT_KEY.to_owned(),
        effect: "NoSchedule".to_owned(),
        ..Default::default()
    });
    let patch = serde_json::json!({
        "metadata": {
            "resourceVersion": fresh.metadata.resource_version,
            "annotations": {CORDONED_BY_ANNOTATION: record.name_any()},
        },
        "spec": {"unschedulable": true, "taints": taints},
    });
    nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(api_error(format!("cordoning node {node}")))?;
    Ok(())
}

/// Both arms of the floor on fleet `names` (sorted), after the controller's rounds, quiet and under
/// churn, took two times `faults` of its first nodes: the floor itself on the fleet's last nodes,
/// then the paced floor, at the bench's controllers' starting concurrency, on the nodes before
/// them. Empty (and said) when the fleet has too few nodes left.
///
/// # Errors
/// As [`run_rounds`].
pub async fn run(
    env: &BenchEnv,
    scope: &str,
    names: &[String],
    faults: &[usize],
    watch: &CordonWatch,
) -> Result<Vec<FloorRound>, BenchSetupError> {
    let per_rounds: usize = faults.iter().sum();
    let in_flight = env.starting_concurrency;
    let paced: usize = faults.iter().filter(|&&f| f > in_flight).sum();
    if names.len() < 3 * per_rounds + paced {
        eprintln!(
            "scale: {} nodes are too few for the cordon floor's rounds beside the others",
            names.len()
        );
        return Ok(Vec::new());
    }
    let (rest, floor_nodes) = names.split_at(names.len() - per_rounds);
    let mut rounds = run_rounds(env, scope, floor_nodes, faults, None, watch).await?;
    let paced_nodes = &rest[rest.len() - paced..];
    rounds.extend(run_rounds(env, scope, paced_nodes, faults, Some(in_flight), watch).await?);
    Ok(rounds)
}

/// One floor round per entry of `faults`, each on the next unused nodes of `names`, with at most
/// `in_flight` faults' writes under way at once (`None`: all of the round's). With `Some(n)`, only
/// the rounds of more than `n` faults run (the others would repeat the floor).
///
/// # Errors
/// The policy could not be read, a node had too few unused nodes, or a write was refused.
pub async fn run_rounds(
    env: &BenchEnv,
    scope: &str,
    names: &[String],
    faults: &[usize],
    in_flight: Option<usize>,
    watch: &CordonWatch,
) -> Result<Vec<FloorRound>, BenchSetupError> {
    let policy = Api::<GpuRemediationPolicy>::all(env.client.clone())
        .get(scope)
        .await
        .map_err(api_error(format!("reading policy {scope}")))?;
    let mut next = 0;
    let mut rounds = Vec::new();
    for &count in faults.iter().filter(|&&f| in_flight.is_none_or(|n| f > n)) {
        let at_once = in_flight.unwrap_or(count).clamp(1, count.max(1));
        let Some(broken) = names.get(next..next + count) else {
            return Err(BenchSetupError::Step(format!(
                "the cordon floor needs {count} more unused nodes, {} are left",
                names.len() - next
            )));
        };
        next += count;
        let at = bench_env::next_whole_second(Duration::from_millis(300));
        tokio::time::sleep(Duration::try_from(at.duration_since(Timestamp::now())).unwrap_or_default()).await;
        stream::iter(broken)
            .map(|node| cordon_one(env, &policy, node, at))
            .buffer_unordered(at_once)
            .try_collect::<Vec<()>>()
            .await?;
        let seen = eventually(
            &format!("the floor's {count} cordons seen"),
            Duration::from_secs(60),
            || async {
                let first = watch.first_held();
                broken.iter().all(|n| first.contains_key(n)).then_some(first)
            },
        )
        .await
        .unwrap_or_else(|_| watch.first_held());
        let samples = held_after_ms(&seen, broken, at);
        let round = FloorRound {
            faults: count,
            in_flight: at_once,
            cordoned: samples.len(),
            p50_ms: percentile(&samples, 50.0).unwrap_or(f64::NAN),
            p99_ms: percentile(&samples, 99.0).unwrap_or(f64::NAN),
            max_ms: samples.last().copied().unwrap_or(f64::NAN),
        };
        eprintln!(
            "cordon floor: {count} faults, {at_once} in flight: {}/{count} held, p50 {:.0} ms, p99 {:.0} ms",
            round.cordoned, round.p50_ms, round.p99_ms
        );
        rounds.push(round);
    }
    Ok(rounds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floors_record_carries_what_the_controllers_does_but_its_finalizer() {
        let policy: GpuRemediationPolicy = serde_json::from_value(serde_json::json!({
            "apiVersion": "gpuremediation.dev/v1alpha1",
            "kind": "GpuRemediationPolicy",
            "metadata": {"name": "scale-10", "generation": 3},
            "spec": {
                "nodeSelector": {"matchLabels": {"fleet": "scale-10"}},
                "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "5s"}],
                "action": "None",
                "drain": {"timeout": "10m"},
                "release": {"healthyFor": "1s"},
            },
        }))
        .unwrap();
        let at = Timestamp::from_second(1_000).unwrap();
        let record = record_for(&policy, "gpu-00007", at);
        assert_eq!(record.name_any(), "floor-gpu-00007");
        assert_eq!(record.spec.policy_name, "scale-10");
        assert_eq!(record.spec.trigger.since, Some(Time(at)));
        let snapshot = record
            .spec
            .policy_snapshot
            .as_ref()
            .expect("the policy's snapshot");
        assert_eq!(snapshot.generation, Some(3));
        assert_eq!(snapshot.triggers, policy.spec.triggers);
        assert_eq!(snapshot.drain, policy.spec.drain);
        assert_eq!(record.labels()[NODE_LABEL], "gpu-00007");
        assert!(record.metadata.finalizers.is_none());
    }
}

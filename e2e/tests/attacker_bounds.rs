//! A broken or compromised node cannot steer the fleet (issue 39): what one node writes about
//! itself neither makes the controller write a record a second nor stops its policy.
//!
//! - A `GpuHealthy=False` condition without `lastTransitionTime`, or with one in the future, under
//!   a trigger with `for: 0s`: the controller dates it from when it first saw it, and opens one
//!   episode (one record), not one per pass; another node's fault is recorded all the same.
//! - A node whose record the API server refuses (here an admission policy refusing records of a
//!   reason, as a schema bound would: 422 Invalid) and whose fault is the oldest, so it takes the
//!   policy's only slot: the policy still governs its other nodes (another node's fault is
//!   cordoned), and the refusal is said in the policy's status and a Warning Event, naming the
//!   node and the server's words.
//! - A policy with 10,000 waiting nodes: its status, as the plan builds it, is written.

mod common;
mod scenario;

use std::time::Duration;

use gpu_remediation_api::{
    GpuRemediation, GpuRemediationPolicy,
    constants::reasons,
    policy::{GpuRemediationPolicyStatus, WAITING_LISTED_MAX},
};
use gpu_sandbox::fault::set_gpu_condition;
use k8s_openapi::{
    api::core::v1::{Node, NodeCondition, NodeStatus},
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::{SignedDuration, Timestamp},
};
use kube::{
    Api,
    api::{ObjectMeta, Patch, PatchParams},
};
use scenario::{RunningController, Scenario, event_notes, is_unschedulable};
use serde_json::json;

use crate::common::eventually;

/// How long the tests watch for a second record after the first: many passes at `for: 0s` (a
/// pass each time anything changes, and at least every few seconds).
const WATCHED: Duration = Duration::from_secs(15);

/// Writes node `node`'s `GpuHealthy=False` condition as its agent would, with `transition` as its
/// `lastTransitionTime` (`None`: left out).
async fn break_with_clock(s: &Scenario, node: &str, transition: Option<Timestamp>) {
    let patch = json!({"status": {"conditions": [{
        "type": "GpuHealthy",
        "status": "False",
        "reason": "XID79",
        "message": "GPU 0 has fallen off the bus",
        "lastHeartbeatTime": Time(Timestamp::now()),
        "lastTransitionTime": transition.map(Time),
    }]}});
    Api::<Node>::all(s.client.clone())
        .patch_status(node, &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .unwrap_or_else(|e| panic!("writing node {node}'s condition: {e}"));
    let written = s.node(node).await;
    let condition = written
        .status
        .and_then(|st| st.conditions)
        .and_then(|cs| cs.into_iter().find(|c| c.type_ == "GpuHealthy"))
        .expect("the condition is written");
    assert_eq!(condition.status, "False");
    assert_eq!(
        condition.last_transition_time.map(|t| t.0),
        transition,
        "the server keeps the node's clock as written"
    );
}

/// Under `for: 0s`, `attacker` writes its fault with `transition` and a victim breaks as usual:
/// each has exactly one record after many passes.
async fn one_record_each_whatever_the_clock(transition: Option<Timestamp>) {
    let s = Scenario::new(2).await;
    let nodes = s.nodes();
    let (attacker, victim) = (&nodes[0], &nodes[1]);
    s.policy(json!({
        "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "0s"}],
        "mode": "DryRun",
        "safety": {"maxUnhealthy": "100%"},
    }))
    .await;
    let controller = RunningController::start(&s.scope).await;
    break_with_clock(&s, attacker, transition).await;
    s.break_gpu(victim).await;

    eventually("a record of each node", Duration::from_secs(30), || async {
        let records = s.remediations().await;
        let of = |node: &str| records.iter().filter(|r| r.spec.node_name == node).count();
        (of(attacker) >= 1 && of(victim) >= 1).then_some(())
    })
    .await;
    tokio::time::sleep(WATCHED).await;
    let records = s.remediations().await;
    let of = |node: &str| {
        records
            .iter()
            .filter(|r| r.spec.node_name == node)
            .map(|r| r.metadata.name.clone().unwrap_or_default())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        of(attacker).len(),
        1,
        "one episode of the attacker: {:?}",
        of(attacker)
    );
    assert_eq!(
        of(victim).len(),
        1,
        "the victim's fault is recorded: {:?}",
        of(victim)
    );
    controller.stop().await;
}

#[tokio::test]
async fn a_condition_without_a_transition_time_opens_one_episode_not_one_a_pass() {
    one_record_each_whatever_the_clock(None).await;
}

#[tokio::test]
async fn a_condition_dated_in_the_future_opens_one_episode_not_one_a_pass() {
    let future = Timestamp::now() + SignedDuration::from_hours(1);
    // Whole seconds: the server keeps the time to the second.
    let future = Timestamp::from_second(future.as_second()).unwrap();
    one_record_each_whatever_the_clock(Some(future)).await;
}

/// An admission policy refusing the records of nodes whose fault's reason is `reason`, with
/// reason `Invalid` (422, as a schema bound answers).
async fn refuse_records_of_reason(s: &Scenario, reason: &str) -> common::Denial {
    // A record of that reason, created dry-run until the server refuses it.
    let probe: GpuRemediation = serde_json::from_value(json!({
        "apiVersion": "gpuremediation.dev/v1alpha1", "kind": "GpuRemediation",
        "metadata": {"name": "probe"},
        "spec": {"nodeName": "no-such-node", "policyName": "no-such-policy", "action": "None", "mode": "Manual",
                 "trigger": {"conditionType": "GpuHealthy", "status": "False", "reason": reason}},
    }))
    .expect("a probe record");
    let (records, dry_run) = (Api::<GpuRemediation>::all(s.client.clone()), common::dry_run());
    common::deny(
        &s.client,
        &format!("refuse-{}", s.scope),
        json!([{
            "apiGroups": ["gpuremediation.dev"], "apiVersions": ["*"], "operations": ["CREATE"],
            "resources": ["gpuremediations"],
        }]),
        json!({
            "expression": format!("object.spec.trigger.reason != '{reason}'"),
            "reason": "Invalid",
            "message": format!("no record of reason {reason} is taken"),
        }),
        serde_json::Value::Null,
        || records.create(&dry_run, &probe),
    )
    .await
}

#[tokio::test]
async fn a_node_whose_record_is_refused_neither_stops_its_policy_nor_keeps_its_slot() {
    let s = Scenario::new(3).await;
    let nodes = s.nodes();
    let (refused, victim) = (&nodes[0], &nodes[1]);
    let poison = format!("XID{}", s.scope.replace('-', ""));
    let admission = refuse_records_of_reason(&s, &poison).await;
    s.policy(json!({
        "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "1s"}],
        "safety": {"maxConcurrent": 1, "maxUnhealthy": "100%"},
    }))
    .await;
    // The refused node's fault is the older: it is admitted first, to the only slot.
    set_gpu_condition(
        &s.client,
        refused,
        "False",
        &poison,
        "a fault the server refuses to record",
    )
    .await
    .expect("the refused node's fault");
    tokio::time::sleep(Duration::from_secs(1)).await;
    s.break_gpu(victim).await;
    let controller = RunningController::start(&s.scope).await;

    // The policy governs its other node: the victim's fault is recorded and cordoned.
    eventually("the victim cordoned", Duration::from_secs(60), || async {
        let cordoned = is_unschedulable(&s.node(victim).await);
        (cordoned && s.remediation_of(victim).await.is_some()).then_some(())
    })
    .await;
    assert!(
        s.remediation_of(refused).await.is_none(),
        "the refused node has no record"
    );
    assert!(
        !is_unschedulable(&s.node(refused).await),
        "the refused node is not cordoned"
    );

    // The refusal, in the policy's status and an Event, in the server's words.
    let status = policy_status(&s).await;
    let said = status
        .record_refusals
        .iter()
        .find(|r| r.node == *refused)
        .unwrap_or_else(|| panic!("the refusal is in the status: {status:?}"));
    assert_eq!(said.code, Some(422), "{said:?}");
    assert!(
        said.message
            .contains(&format!("no record of reason {poison} is taken")),
        "{said:?}"
    );
    let waiting = status.waiting.iter().find(|w| w.node == *refused);
    assert_eq!(
        waiting.map(|w| w.reason.as_str()),
        Some(reasons::RECORD_REFUSED),
        "the refused node waits its backoff: {status:?}"
    );
    let said_in_events = eventually("the refusal's Event", Duration::from_secs(20), || async {
        let found = event_notes(&s.client, &s.scope, reasons::RECORD_REFUSED).await;
        (!found.is_empty()).then_some(found)
    })
    .await;
    assert!(
        said_in_events
            .iter()
            .any(|n| n.contains(refused.as_str()) && n.contains("no record of reason")),
        "{said_in_events:?}"
    );
    controller.stop().await;
    admission.remove(&s.client).await;
}

async fn policy_status(s: &Scenario) -> GpuRemediationPolicyStatus {
    Api::<GpuRemediationPolicy>::all(s.client.clone())
        .get(&s.scope)
        .await
        .unwrap()
        .status
        .unwrap_or_default()
}

/// Not 10,000 Node objects on the server (creating them takes minutes here): 10,000 broken nodes
/// the policy selects, planned in-process exactly as a pass plans them, and the status the plan
/// builds written to the real server as the controller writes it (server-side apply).
#[tokio::test]
async fn the_status_of_a_policy_with_ten_thousand_waiting_nodes_is_written() {
    let s = Scenario::new(1).await;
    let policy = s
        .policy(json!({"safety": {"maxConcurrent": 1, "maxUnhealthy": "100%"}}))
        .await;
    let fleet_label = policy.spec.node_selector.match_labels.clone();
    let now = Timestamp::now();
    let nodes: Vec<std::sync::Arc<Node>> = (0..10_000_i64)
        .map(|i| {
            std::sync::Arc::new(Node {
                metadata: ObjectMeta {
                    name: Some(format!("{}-gpu-node-{i:05}", s.scope)),
                    labels: Some(fleet_label.clone()),
                    ..ObjectMeta::default()
                },
                spec: None,
                status: Some(NodeStatus {
                    conditions: Some(vec![NodeCondition {
                        type_: "GpuHealthy".into(),
                        status: "False".into(),
                        reason: Some("XID79".into()),
                        message: Some("GPU 0 has fallen off the bus".into()),
                        last_transition_time: Some(Time(now - SignedDuration::from_secs(3600 + i))),
                        ..NodeCondition::default()
                    }]),
                    ..NodeStatus::default()
                }),
            })
        })
        .collect();
    let plan = gpu_remediator::fleet::plan(&[std::sync::Arc::new(policy)], &nodes, &[], now);
    let built = plan.policies[0].status.clone();
    assert_eq!(built.waiting_total, 9_999, "all but the one admitted wait");
    let body = serde_json::to_vec(&json!({
        "apiVersion": "gpuremediation.dev/v1alpha1",
        "kind": "GpuRemediationPolicy",
        "status": built,
    }))
    .unwrap();
    println!("status of 10,000 waiting nodes: {} bytes as written", body.len());
    let patch: serde_json::Value = serde_json::from_slice(&body).unwrap();
    Api::<GpuRemediationPolicy>::all(s.client.clone())
        .patch_status(
            &s.scope,
            &PatchParams::apply("gpu-remediator").force(),
            &Patch::Apply(&patch),
        )
        .await
        .expect("the server takes the status");
    let stored = policy_status(&s).await;
    assert_eq!(stored.waiting_total, 9_999);
    assert_eq!(stored.waiting.len(), WAITING_LISTED_MAX as usize);
    assert_eq!(
        stored.waiting[0].node,
        format!("{}-gpu-node-09998", s.scope),
        "the longest waiting first"
    );
}

//! The fleet plan with correlated-failure limits: a held rack in the status, its condition and its
//! Events; slow start read back from the records.

use crate::test_fixtures::at;
use std::sync::Arc;

use gpu_remediation_api::{
    GpuRemediationPolicy, GpuRemediationPolicySpec,
    constants::{policy_conditions, reasons},
};
use k8s_openapi::{
    api::core::v1::{Node, NodeCondition, NodeStatus},
    apimachinery::pkg::apis::meta::v1::Time,
};
use kube::api::ObjectMeta;

use super::plan;

fn rack_policy(max_unhealthy_count: u32) -> GpuRemediationPolicy {
    let spec: GpuRemediationPolicySpec = serde_json::from_value(serde_json::json!({
        "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "0s"}],
        "action": "None",
        "safety": {
            "maxConcurrent": 10,
            "maxUnhealthy": "100%",
            "failureDomains": [{"topologyKey": "example.com/rack", "maxUnhealthyCount": max_unhealthy_count}],
        },
    }))
    .unwrap();
    let mut p = GpuRemediationPolicy::new("p", spec);
    p.metadata.generation = Some(1);
    p
}

fn node(name: &str, rack: &str, broken: bool) -> Arc<Node> {
    Arc::new(Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some([("example.com/rack".to_owned(), rack.to_owned())].into()),
            ..ObjectMeta::default()
        },
        spec: None,
        status: Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "GpuHealthy".into(),
                status: if broken { "False" } else { "True" }.into(),
                reason: Some("XID79".into()),
                last_transition_time: Some(Time(at(0))),
                ..NodeCondition::default()
            }]),
            ..NodeStatus::default()
        }),
    })
}

/// 18 nodes in racks A, B, C of six; `broken` names nodes like `b3`.
fn racks(broken: &[&str]) -> Vec<Arc<Node>> {
    ["a", "b", "c"]
        .iter()
        .flat_map(|rack| {
            (0..6).map(move |i| {
                let name = format!("{rack}{i}");
                node(&name, &rack.to_uppercase(), broken.contains(&name.as_str()))
            })
        })
        .collect()
}

#[test]
fn four_failing_in_rack_b_hold_rack_b_only_and_the_policy_names_it_once() {
    let policy = rack_policy(2);
    let fleet = plan(
        &[Arc::new(policy.clone())],
        &racks(&["b0", "b1", "b2", "b3", "a0"]),
        &[],
        at(10),
    );
    let first = &fleet.policies[0];
    let started: Vec<&str> = first.create.iter().map(|r| r.spec.node_name.as_str()).collect();
    assert_eq!(started, ["a0"], "rack A's node starts, rack B's wait");
    assert_eq!(first.status.held_domains.len(), 1);
    assert_eq!(first.status.held_domains[0].name(), "example.com/rack=B");
    let waiting: Vec<(&str, &str)> = first
        .status
        .waiting
        .iter()
        .map(|w| (w.node.as_str(), w.reason.as_str()))
        .collect();
    assert_eq!(
        waiting,
        ["b0", "b1", "b2", "b3"]
            .map(|n| (n, reasons::DOMAIN_HELD))
            .to_vec()
    );
    assert!(
        first.status.waiting[0]
            .message
            .contains("example.com/rack=B: 4 of 6 nodes unhealthy")
    );
    let condition = first
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == policy_conditions::DOMAIN_HELD)
        .unwrap();
    assert_eq!(condition.status, "True");
    assert!(
        condition.message.contains("example.com/rack=B: 4 of 6"),
        "{}",
        condition.message
    );
    assert_eq!(first.domains_held.len(), 1, "one Event for the change");

    // The next pass, with the status written: no second Event.
    let mut again = policy.clone();
    again.status = Some(first.status.clone());
    let second = plan(
        &[Arc::new(again.clone())],
        &racks(&["b0", "b1", "b2", "b3"]),
        &[],
        at(11),
    );
    assert!(second.policies[0].domains_held.is_empty());
    assert!(second.policies[0].domains_resumed.is_empty());

    // Two recover: rack B is within its limit, its nodes start, one Event says so.
    let third = plan(&[Arc::new(again)], &racks(&["b0", "b1"]), &[], at(12));
    let third = &third.policies[0];
    assert!(third.status.held_domains.is_empty());
    assert_eq!(third.domains_resumed.len(), 1);
    assert_eq!(third.create.len(), 2);
}

#[test]
fn raising_the_limit_releases_a_held_rack() {
    let broken = racks(&["b0", "b1", "b2", "b3"]);
    let held = plan(&[Arc::new(rack_policy(2))], &broken, &[], at(10));
    assert!(held.policies[0].create.is_empty());
    let raised = plan(&[Arc::new(rack_policy(4))], &broken, &[], at(10));
    assert_eq!(raised.policies[0].create.len(), 4);
    assert!(raised.policies[0].status.held_domains.is_empty());
}

fn slow_start_policy() -> GpuRemediationPolicy {
    let mut p = rack_policy(6);
    p.spec.safety.failure_domains.clear();
    p.spec.safety.max_concurrent = gpu_remediation_api::selector::IntOrPercent::Int(4);
    p.spec.safety.slow_start = true;
    p.spec.release.healthy_for = gpu_remediation_api::Duration::from_secs(60);
    p
}

fn finished(
    node: &str,
    phase: gpu_remediation_api::Phase,
    ended: i64,
) -> Arc<gpu_remediation_api::GpuRemediation> {
    let policy = slow_start_policy();
    let broken = node_broken_at(node, -100);
    let evidence = crate::detect::Evidence {
        trigger: 0,
        condition_type: "GpuHealthy".into(),
        reason: "XID79".into(),
        message: String::new(),
        since: at(-100),
    };
    let mut r = super::new_remediation(&policy, &broken, &evidence, None);
    r.metadata.creation_timestamp = Some(Time(at(ended - 10)));
    r.status = Some(gpu_remediation_api::GpuRemediationStatus {
        phase,
        phase_history: vec![gpu_remediation_api::remediation::PhaseTransition {
            phase,
            at: Time(at(ended)),
            message: None,
        }],
        ..Default::default()
    });
    Arc::new(r)
}

fn node_broken_at(name: &str, since: i64) -> Node {
    let mut n = (*node(name, "A", true)).clone();
    if let Some(c) = n.status.as_mut().and_then(|s| s.conditions.as_mut()) {
        c[0].last_transition_time = Some(Time(at(since)));
    }
    n
}

#[test]
fn six_failing_under_slow_start_start_one_then_two_after_a_proven_success_and_one_after_a_failure() {
    let policy = Arc::new(slow_start_policy());
    let six = racks(&["a0", "a1", "a2", "a3", "a4", "a5"]);
    let first = plan(std::slice::from_ref(&policy), &six, &[], at(10));
    let first = &first.policies[0];
    assert_eq!(first.create.len(), 1);
    let status = first.status.slow_start.as_ref().unwrap();
    assert_eq!(status.allowed, 1);
    assert!(
        first
            .status
            .waiting
            .iter()
            .all(|w| w.reason == reasons::DEFERRED_SLOW_START)
    );

    // A success elsewhere, ended at 100: proven at 160 (healthyFor 60s), not before.
    let rems = [finished("gone-node", gpu_remediation_api::Phase::Succeeded, 100)];
    let before = plan(std::slice::from_ref(&policy), &six, &rems, at(150));
    assert_eq!(before.policies[0].create.len(), 1);
    assert_eq!(
        before.wake_at,
        Some(at(160)),
        "plans again when the success is proven"
    );
    let after = plan(std::slice::from_ref(&policy), &six, &rems, at(160));
    assert_eq!(after.policies[0].create.len(), 2);
    assert!(
        after.policies[0]
            .status
            .slow_start
            .as_ref()
            .unwrap()
            .message
            .contains("doubled")
    );

    let rems = [
        finished("gone-node", gpu_remediation_api::Phase::Succeeded, 100),
        finished("gone-too", gpu_remediation_api::Phase::Failed, 200),
    ];
    let failed = plan(&[policy], &six, &rems, at(300));
    assert_eq!(failed.policies[0].create.len(), 1);
    assert_eq!(failed.policies[0].status.slow_start.as_ref().unwrap().allowed, 1);
}

#[test]
fn five_of_six_failures_on_one_driver_are_named_and_with_the_hold_their_nodes_wait() {
    let mut policy = rack_policy(6);
    policy.spec.safety.failure_domains.clear();
    policy.spec.safety.suspect = Some(
        serde_json::from_value(serde_json::json!({
            "window": "1h", "share": "60%", "minFailures": 3,
            "attributes": ["nvidia.com/cuda.driver.major"], "hold": true,
        }))
        .unwrap(),
    );
    let nodes: Vec<Arc<Node>> = racks(&["a0", "a1", "a2", "a3", "a4", "a5"])
        .into_iter()
        .map(|n| {
            let mut n = (*n).clone();
            let driver = if n.metadata.name.as_deref() == Some("a5") {
                "550"
            } else {
                "570"
            };
            n.metadata
                .labels
                .get_or_insert_default()
                .insert("nvidia.com/cuda.driver.major".into(), driver.into());
            Arc::new(n)
        })
        .collect();
    let fleet = plan(&[Arc::new(policy.clone())], &nodes, &[], at(10));
    let held = &fleet.policies[0];
    let suspect = held.status.suspect.as_ref().unwrap();
    assert_eq!(
        suspect.message,
        "5 of 6 failures in the last 1h are on nvidia.com/cuda.driver.major=570"
    );
    assert!(suspect.holding);
    let started: Vec<&str> = held.create.iter().map(|r| r.spec.node_name.as_str()).collect();
    assert_eq!(started, ["a5"], "the node on another driver starts");
    assert!(
        held.status
            .waiting
            .iter()
            .all(|w| w.reason == reasons::SUSPECT_HELD && w.message.contains("driver.major=570"))
    );
    assert_eq!(held.status.waiting.len(), 5);
    assert!(held.suspect_named.is_some(), "one Event names it");
    let condition = held
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == policy_conditions::SUSPECT_CAUSE)
        .unwrap();
    assert_eq!(condition.status, "True");

    // Without the hold the suspect is still named, and nothing waits for it.
    policy.spec.safety.suspect.as_mut().unwrap().hold = false;
    policy.spec.safety.rate.limit = 10;
    let fleet = plan(&[Arc::new(policy)], &nodes, &[], at(10));
    assert_eq!(fleet.policies[0].create.len(), 6);
    assert!(fleet.policies[0].status.suspect.is_some());
}

#[test]
fn a_kernel_five_of_six_failures_share_is_named_from_nodes_as_the_cache_keeps_them() {
    let mut policy = rack_policy(6);
    policy.spec.safety.failure_domains.clear();
    policy.spec.safety.suspect = Some(
        serde_json::from_value(serde_json::json!({
            "window": "1h", "share": "60%", "minFailures": 3, "attributes": ["nodeInfo.kernelVersion"],
        }))
        .unwrap(),
    );
    let nodes: Vec<Arc<Node>> = racks(&["a0", "a1", "a2", "a3", "a4", "a5"])
        .into_iter()
        .map(|n| {
            let mut n = (*n).clone();
            let kernel = if n.metadata.name.as_deref() == Some("a5") {
                "6.8.0-1019-aws"
            } else {
                "6.8.0-1021-aws"
            };
            n.status.get_or_insert_default().node_info = Some(k8s_openapi::api::core::v1::NodeSystemInfo {
                kernel_version: kernel.into(),
                ..Default::default()
            });
            // As the watch keeps it (`observe::prune_node`), which once dropped what this reads.
            crate::observe::prune_node(&mut n);
            Arc::new(n)
        })
        .collect();
    let fleet = plan(&[Arc::new(policy)], &nodes, &[], at(10));
    let suspect = fleet.policies[0]
        .status
        .suspect
        .as_ref()
        .expect("a suspect named");
    assert_eq!(
        suspect.message,
        "5 of 6 failures in the last 1h are on nodeInfo.kernelVersion=6.8.0-1021-aws"
    );
}

#[test]
fn failures_arriving_together_within_the_settle_window_are_judged_together() {
    let mut policy = rack_policy(6);
    policy.spec.safety.failure_domains.clear();
    policy.spec.safety.max_unhealthy = gpu_remediation_api::selector::IntOrPercent::Percent("20%".into());
    policy.spec.safety.settle = Some(gpu_remediation_api::Duration::from_secs(2));
    let ten = |broken: usize| -> Vec<Arc<Node>> {
        (0..10)
            .map(|i| {
                if i < broken {
                    Arc::new(node_broken_at(&format!("n{i}"), 0))
                } else {
                    // Healthy for an hour: no recovery of a moment ago (`fleet::recovering`).
                    let mut healthy = Node::clone(&node(&format!("n{i}"), "A", false));
                    for condition in healthy
                        .status
                        .iter_mut()
                        .flat_map(|s| s.conditions.iter_mut().flatten())
                    {
                        condition.last_transition_time = Some(Time(at(-3600)));
                    }
                    Arc::new(healthy)
                }
            })
            .collect()
    };
    let policy = Arc::new(policy);
    // The first failure alone: it settles, nothing starts, the plan wakes when it has settled.
    let first = plan(std::slice::from_ref(&policy), &ten(1), &[], at(0));
    assert!(first.policies[0].create.is_empty());
    assert_eq!(first.policies[0].status.waiting[0].reason, reasons::SETTLING);
    assert_eq!(first.wake_at, Some(at(2)));
    // Two more within the window: at its end all three are seen, 3 of 10 is above 20%.
    let burst = plan(std::slice::from_ref(&policy), &ten(3), &[], at(2));
    assert!(burst.policies[0].create.is_empty());
    assert_eq!(burst.policies[0].circuit_change, Some(true));
    // Without the settle window the first would have started on its own.
    let mut eager = (*policy).clone();
    eager.spec.safety.settle = None;
    assert_eq!(
        plan(&[Arc::new(eager)], &ten(1), &[], at(0)).policies[0]
            .create
            .len(),
        1
    );
}

#[test]
fn a_policy_that_yields_twelve_nodes_counts_them_and_names_the_first_ten_with_their_governor() {
    let mut winner = rack_policy(6);
    winner.metadata.name = Some("racks-a-b".into());
    winner.spec.priority = 10;
    winner.spec.node_selector = serde_json::from_value(serde_json::json!({
        "matchExpressions": [{"key": "example.com/rack", "operator": "In", "values": ["A", "B"]}],
    }))
    .unwrap();
    let fleet = plan(
        &[Arc::new(rack_policy(6)), Arc::new(winner)],
        &racks(&[]),
        &[],
        at(10),
    );
    let loser = fleet
        .policies
        .iter()
        .find(|p| p.policy.metadata.name.as_deref() == Some("p"))
        .unwrap();
    let status = &loser.status;
    assert_eq!((status.selected_nodes, status.yielded_nodes), (6, 12));
    let named: Vec<&str> = status.yielded.iter().map(|y| y.node.as_str()).collect();
    assert_eq!(
        named,
        ["a0", "a1", "a2", "a3", "a4", "a5", "b0", "b1", "b2", "b3"]
    );
    assert!(status.yielded.iter().all(|y| y.governed_by == "racks-a-b"));
    let overlap = status
        .conditions
        .iter()
        .find(|c| c.type_ == policy_conditions::OVERLAP)
        .unwrap();
    assert_eq!(
        (overlap.status.as_str(), overlap.reason.as_str()),
        ("True", reasons::OVERLAP)
    );
    assert_eq!(
        overlap.message,
        "12 selected nodes are governed by racks-a-b (higher priority, or same priority and an earlier name): \
         a0 (racks-a-b), a1 (racks-a-b), a2 (racks-a-b), a3 (racks-a-b), a4 (racks-a-b), a5 (racks-a-b), \
         b0 (racks-a-b), b1 (racks-a-b), b2 (racks-a-b), b3 (racks-a-b) and 2 more"
    );
    let governor = fleet
        .policies
        .iter()
        .find(|p| p.policy.metadata.name.as_deref() == Some("racks-a-b"))
        .unwrap();
    assert_eq!(
        (governor.status.selected_nodes, governor.status.yielded_nodes),
        (12, 0)
    );
    assert!(governor.status.yielded.is_empty());
}

#[test]
fn with_slow_start_and_racks_a_rack_that_proved_nothing_starts_one_node_while_the_policy_has_room() {
    let mut policy = slow_start_policy();
    policy.spec.safety.failure_domains = rack_policy(6).spec.safety.failure_domains;
    let policy = Arc::new(policy);
    let rems = [
        finished("a0", gpu_remediation_api::Phase::Succeeded, 100),
        finished("a4", gpu_remediation_api::Phase::Succeeded, 100),
    ];
    let fleet = plan(&[policy], &racks(&["a1", "b1", "b2", "b3"]), &rems, at(200));
    let plan = &fleet.policies[0];
    // Two fixes proven in rack A: the policy allows 4; rack B has proven nothing and allows 1.
    assert_eq!(plan.status.slow_start.as_ref().unwrap().allowed, 4);
    let mut started: Vec<&str> = plan.create.iter().map(|r| r.spec.node_name.as_str()).collect();
    started.sort_unstable();
    assert_eq!(started, ["a1", "b1"]);
    assert_eq!(plan.status.waiting.len(), 2);
    for waiting in &plan.status.waiting {
        assert_eq!(waiting.reason, reasons::DEFERRED_DOMAIN_IN_FLIGHT);
        assert!(
            waiting
                .message
                .contains("failure domain example.com/rack=B, its slow start allows 1"),
            "{}",
            waiting.message
        );
    }
}

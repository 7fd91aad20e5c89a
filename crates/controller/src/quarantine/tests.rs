use gpu_remediation_api::{
    GpuRemediationStatus, Phase, constants::CORDONED_BY_ANNOTATION, policy::Action, selector::IntOrPercent,
};
use k8s_openapi::{
    api::core::v1::{NodeCondition, NodeSpec, NodeStatus, Taint},
    apimachinery::pkg::apis::meta::v1::Time,
};
use kube::api::ObjectMeta;

use super::*;
use crate::test_fixtures::at;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

fn spec() -> GpuRemediationPolicySpec {
    serde_json::from_value(serde_json::json!({
        "triggers": [
            {"conditionType": "GpuHealthy", "status": "False", "for": "60s"},
            {"conditionType": "GpuFlaky", "status": "True", "for": "60s", "quarantine": false},
        ],
        "action": "None",
        "safety": {"maxUnhealthy": "100%"},
        "quarantine": {"hysteresis": "20s"},
    }))
    .unwrap()
}

/// A node whose `GpuHealthy` broke at `broken` (healthy since 0 when `None`).
fn node(name: &str, broken: Option<i64>) -> Node {
    node_with(
        name,
        "GpuHealthy",
        broken.map_or("True", |_| "False"),
        broken.unwrap_or(0),
    )
}

fn node_with(name: &str, condition: &str, status: &str, since: i64) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec::default()),
        status: Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: condition.into(),
                status: status.into(),
                reason: Some("XID79".into()),
                last_transition_time: Some(Time(at(since))),
                ..NodeCondition::default()
            }]),
            ..NodeStatus::default()
        }),
    }
}

fn quarantined(mut node: Node, policy: &str) -> Node {
    taint::quarantine(&mut node, policy);
    node
}

fn record(node: &str, since: i64, phase: Phase) -> Arc<GpuRemediation> {
    let mut r = crate::test_fixtures::remediation(
        &crate::record_name::remediation_name(node, "p", at(since)),
        node,
        "p",
        Some(at(since)),
        Action::None,
    );
    r.status = Some(GpuRemediationStatus {
        phase,
        ..GpuRemediationStatus::default()
    });
    Arc::new(r)
}

fn decide(
    spec: &GpuRemediationPolicySpec,
    nodes: &[Node],
    records: &[Arc<GpuRemediation>],
    now: i64,
) -> Plan {
    decide_seen(spec, nodes, records, &FirstSeen::default(), now)
}

fn decide_seen(
    spec: &GpuRemediationPolicySpec,
    nodes: &[Node],
    records: &[Arc<GpuRemediation>],
    first_seen: &FirstSeen,
    now: i64,
) -> Plan {
    let nodes: Vec<&Node> = nodes.iter().collect();
    plan(&Inputs {
        policy: "p",
        spec,
        selected: u32::try_from(nodes.len()).unwrap(),
        nodes: &nodes,
        remediations: records,
        valid: true,
        first_seen,
        now: at(now),
    })
}

fn added(plan: &Plan) -> Vec<&str> {
    plan.add.iter().map(|a| a.node.name.as_str()).collect()
}

fn lifted(plan: &Plan) -> Vec<&str> {
    plan.lift.iter().map(|l| l.node.name.as_str()).collect()
}

#[test]
fn a_node_whose_trigger_starts_to_match_is_quarantined_before_its_for_elapses() {
    let plan = decide(&spec(), &[node("n1", Some(100)), node("n2", None)], &[], 100);
    assert_eq!(added(&plan), ["n1"]);
    let add = &plan.add[0];
    assert_eq!(add.since, at(100));
    assert_eq!(add.node.uid.as_deref(), Some("uid-n1"));
    assert_eq!(add.signal, "GpuHealthy=False (XID79)");
    assert_eq!(plan.held, 1);
    assert!(plan.lift.is_empty());
}

#[test]
fn a_held_quarantine_is_kept_while_the_signal_holds() {
    let plan = decide(&spec(), &[quarantined(node("n1", Some(100)), "p")], &[], 150);
    assert!(plan.add.is_empty() && plan.lift.is_empty());
    assert_eq!(plan.held, 1);
}

#[test]
fn a_cleared_signal_keeps_the_quarantine_for_the_hysteresis_then_lifts_it() {
    // Healthy again since 130; hysteresis 20s.
    let nodes = [quarantined(node_with("n1", "GpuHealthy", "True", 130), "p")];
    let within = decide(&spec(), &nodes, &[], 140);
    assert!(within.lift.is_empty());
    assert_eq!(within.held, 1);
    assert_eq!(
        within.wake_at,
        Some(at(150)),
        "the plan wakes when the hysteresis ends"
    );
    let after = decide(&spec(), &nodes, &[], 150);
    assert_eq!(lifted(&after), ["n1"]);
    assert_eq!(after.held, 0);
}

#[test]
fn a_restarted_controller_finds_a_quarantine_on_the_node_and_lifts_it_when_it_is_due() {
    // Nothing but the node says the quarantine exists: no memory of the previous process.
    let nodes = [quarantined(node_with("n1", "GpuHealthy", "True", 0), "p")];
    let plan = decide(&spec(), &nodes, &[], 1000);
    assert_eq!(lifted(&plan), ["n1"]);
    assert_eq!(plan.lift[0].policy, "p");
}

#[test]
fn a_trigger_that_opts_out_does_not_quarantine_and_neither_does_a_policy_that_turned_it_off() {
    let flaky = node_with("n1", "GpuFlaky", "True", 100);
    assert!(decide(&spec(), &[flaky], &[], 100).add.is_empty());
    let mut off = spec();
    off.quarantine.enabled = false;
    assert!(decide(&off, &[node("n1", Some(100))], &[], 100).add.is_empty());
    let lifted_when_off = decide(&off, &[quarantined(node("n1", Some(100)), "p")], &[], 100);
    assert_eq!(
        lifted(&lifted_when_off),
        ["n1"],
        "turning it off lifts what it held"
    );
    let mut only_one = off;
    only_one.triggers[0].quarantine = Some(true);
    assert_eq!(
        added(&decide(&only_one, &[node("n1", Some(100))], &[], 100)),
        ["n1"],
        "a trigger may opt in under a policy that is off"
    );
}

#[test]
fn a_dry_run_a_paused_and_an_invalid_policy_quarantine_nothing_new() {
    let nodes = [node("n1", Some(100))];
    let mut dry = spec();
    dry.mode = Mode::DryRun;
    assert!(decide(&dry, &nodes, &[], 100).add.is_empty());
    let mut paused = spec();
    paused.paused = true;
    assert!(decide(&paused, &nodes, &[], 100).add.is_empty());
    let refs: Vec<&Node> = nodes.iter().collect();
    let invalid = plan(&Inputs {
        policy: "p",
        spec: &spec(),
        selected: u32::try_from(refs.len()).unwrap(),
        nodes: &refs,
        remediations: &[],
        valid: false,
        first_seen: &FirstSeen::default(),
        now: at(100),
    });
    assert!(invalid.add.is_empty());
}

#[test]
fn a_running_remediation_holds_the_quarantine_and_the_plan_neither_adds_nor_lifts_it() {
    let records = [record("n1", 0, Phase::Draining)];
    // Even with the signal cleared long ago, the remediation's release lifts it, not the plan.
    let nodes = [quarantined(node_with("n1", "GpuHealthy", "True", 10), "p")];
    let plan = decide(&spec(), &nodes, &records, 1000);
    assert!(plan.add.is_empty() && plan.lift.is_empty());
    assert_eq!(plan.held, 1, "it counts against the limit");
}

#[test]
fn a_finished_remediation_still_holding_its_cordon_holds_the_quarantine() {
    let records = [record("n1", 0, Phase::Succeeded)];
    let mut n = quarantined(node("n1", Some(0)), "p");
    n.annotations_mut()
        .insert(CORDONED_BY_ANNOTATION.to_owned(), records[0].name_any());
    let plan = decide(&spec(), &[n], &records, 1000);
    assert!(plan.add.is_empty() && plan.lift.is_empty());
}

#[test]
fn an_episode_whose_remediation_ended_is_not_quarantined_and_its_quarantine_is_lifted() {
    for phase in [Phase::Cancelled, Phase::Failed, Phase::Succeeded] {
        let records = [record("n1", 0, phase)];
        let held = decide(&spec(), &[quarantined(node("n1", Some(0)), "p")], &records, 1000);
        assert_eq!(lifted(&held), ["n1"], "{phase:?}");
        let fresh = decide(&spec(), &[node("n1", Some(0))], &records, 1000);
        assert!(fresh.add.is_empty(), "{phase:?}");
    }
    // A new episode (the condition broke again later) is quarantined anew.
    let records = [record("n1", 0, Phase::Cancelled)];
    assert_eq!(
        added(&decide(&spec(), &[node("n1", Some(500))], &records, 500)),
        ["n1"]
    );
}

#[test]
fn an_episode_without_a_clock_whose_remediation_ended_is_over_at_every_later_pass() {
    // No lastTransitionTime: the episode holds since it was first seen (100), which its record
    // names, not since each pass's now.
    let mut n = quarantined(node("n1", Some(0)), "p");
    n.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].last_transition_time = None;
    let mut first_seen = FirstSeen::default();
    first_seen.observe([&n], at(100));
    let records = [record("n1", 100, Phase::Succeeded)];
    for now in [100, 500, 1000] {
        first_seen.observe([&n], at(now));
        let plan = decide_seen(&spec(), &[n.clone()], &records, &first_seen, now);
        assert_eq!(lifted(&plan), ["n1"], "at {now}");
        assert!(plan.add.is_empty(), "at {now}");
    }
}

#[test]
fn a_node_waiting_in_manual_required_keeps_its_quarantine_while_the_fault_persists() {
    let records = [record("n1", 0, Phase::ManualRequired)];
    let held = decide(&spec(), &[quarantined(node("n1", Some(0)), "p")], &records, 1000);
    assert!(held.lift.is_empty(), "{:?}", held.lift);
    assert_eq!(held.held, 1);
    // Not yet quarantined (e.g. the limit was full at its first signal): it is, as any broken node.
    let fresh = decide(&spec(), &[node("n1", Some(0))], &records, 1000);
    assert_eq!(added(&fresh), ["n1"]);
    // The fault cleared long ago (past the hysteresis): the quarantine goes.
    let cleared = decide(
        &spec(),
        &[quarantined(node_with("n1", "GpuHealthy", "True", 10), "p")],
        &records,
        1000,
    );
    assert_eq!(lifted(&cleared), ["n1"]);
}

#[test]
fn an_episode_a_person_cancelled_is_not_quarantined_again() {
    let mut n = node("n1", Some(0));
    n.annotations_mut().insert(
        CANCELLED_ANNOTATION.to_owned(),
        crate::record_name::remediation_name("n1", "p", at(0)),
    );
    assert!(decide(&spec(), &[n], &[], 1000).add.is_empty());
}

#[test]
fn a_quarantine_taint_a_person_removed_is_not_put_back_and_its_note_goes_when_the_signal_ends() {
    let mut n = quarantined(node("n1", Some(100)), "p");
    n.spec.as_mut().unwrap().taints = Some(Vec::new());
    let during = decide(&spec(), &[n.clone()], &[], 120);
    assert!(during.add.is_empty() && during.lift.is_empty());
    assert_eq!(during.held, 0);
    n.status = node_with("n1", "GpuHealthy", "True", 130).status;
    assert_eq!(lifted(&decide(&spec(), &[n], &[], 131)), ["n1"]);
}

#[test]
fn a_false_signal_on_every_node_quarantines_only_up_to_the_limit_the_longest_first() {
    let mut limited = spec();
    limited.quarantine.max = Some(IntOrPercent::Percent("30%".into()));
    let nodes: Vec<Node> = (0..10).map(|i| node(&format!("n{i}"), Some(100 - i))).collect();
    let plan = decide(&limited, &nodes, &[], 100);
    assert_eq!(plan.limit, 3);
    assert_eq!(added(&plan), ["n9", "n8", "n7"], "the longest signal first");
    assert_eq!(plan.refused.len(), 7);
    assert_eq!(plan.held, 3);
}

#[test]
fn the_limit_defaults_to_max_unhealthy_and_never_lifts_a_held_quarantine_to_make_room() {
    let mut limited = spec();
    limited.safety.max_unhealthy = IntOrPercent::Int(1);
    let nodes = [quarantined(node("late", Some(50)), "p"), node("early", Some(10))];
    let plan = decide(&limited, &nodes, &[], 60);
    assert_eq!(plan.limit, 1);
    assert!(plan.add.is_empty() && plan.lift.is_empty());
    assert_eq!(plan.refused, ["early"]);
}

#[test]
fn a_persons_cordon_does_not_stop_the_quarantine_and_is_left_alone() {
    let mut n = node("n1", Some(100));
    n.spec.as_mut().unwrap().unschedulable = Some(true);
    n.spec.as_mut().unwrap().taints = Some(vec![Taint {
        key: "node.kubernetes.io/unschedulable".into(),
        effect: "NoSchedule".into(),
        ..Taint::default()
    }]);
    let plan = decide(&spec(), &[n.clone()], &[], 100);
    assert_eq!(added(&plan), ["n1"]);
    taint::quarantine(&mut n, "p");
    taint::lift(&mut n, "p");
    assert_eq!(n.spec.as_ref().unwrap().unschedulable, Some(true));
    assert_eq!(n.spec.as_ref().unwrap().taints.as_ref().unwrap().len(), 1);
}

#[test]
fn another_policys_quarantine_is_not_counted_nor_lifted_by_this_one() {
    let nodes = [quarantined(node_with("n1", "GpuHealthy", "True", 0), "other")];
    let plan = decide(&spec(), &nodes, &[], 1000);
    assert!(plan.lift.is_empty());
    assert_eq!(plan.held, 0);
}

fn arcs(nodes: Vec<Node>) -> Vec<Arc<Node>> {
    nodes.into_iter().map(Arc::new).collect()
}

#[test]
fn a_node_that_left_its_policy_or_whose_policy_is_gone_has_its_quarantine_lifted() {
    let nodes = arcs(vec![
        quarantined(node("moved", Some(0)), "p"),
        quarantined(node("deleted-policy", Some(0)), "gone"),
        quarantined(node("kept", Some(0)), "p"),
        node("untouched", Some(0)),
    ]);
    let governor = |n: &Node| match n.name_any().as_str() {
        "moved" => Some("q"),
        "kept" => Some("p"),
        _ => None,
    };
    let lifts = orphans(&nodes, governor, |p| p == "p" || p == "q", &[], &[]);
    let names: Vec<(&str, &str, bool)> = lifts
        .iter()
        .map(|l| (l.node.name.as_str(), l.policy.as_str(), l.unless_owner_exists))
        .collect();
    assert_eq!(
        names,
        [("moved", "p", false), ("deleted-policy", "gone", true)],
        "a policy this controller does not see is lifted only once the server confirms it is gone"
    );
}

#[test]
fn an_orphan_held_by_its_remediation_or_taken_over_by_its_new_policy_is_left_alone() {
    let nodes = arcs(vec![
        quarantined(node("n1", Some(0)), "p"),
        quarantined(node("n2", Some(0)), "p"),
    ]);
    let records = [record("n1", 0, Phase::Draining)];
    let taken = Plan {
        add: vec![Add {
            node: NodeRef {
                name: "n2".into(),
                uid: None,
            },
            since: at(0),
            signal: String::new(),
        }],
        ..Plan::default()
    };
    assert!(orphans(&nodes, |_| None, |_| true, &[&taken], &records).is_empty());
}

fn labelled(mut node: Node, group: &str) -> Arc<Node> {
    node.labels_mut().insert("group".into(), group.into());
    Arc::new(node)
}

fn policy(limit: &str) -> Arc<gpu_remediation_api::GpuRemediationPolicy> {
    let mut spec = spec();
    spec.node_selector = serde_json::from_value(serde_json::json!({"matchLabels": {"group": "a"}})).unwrap();
    spec.quarantine.max = Some(IntOrPercent::Percent(limit.into()));
    Arc::new(gpu_remediation_api::GpuRemediationPolicy::new("p", spec))
}

#[test]
fn the_policy_status_counts_its_quarantines_and_says_which_nodes_the_limit_left_out() {
    let nodes: Vec<Arc<Node>> = (0..10)
        .map(|i| labelled(node(&format!("n{i}"), Some(100 + i)), "a"))
        .collect();
    let fleet = crate::fleet::plan(&[policy("30%")], &nodes, &[], at(100 + 10));
    let plan = &fleet.policies[0];
    assert_eq!(added(&plan.quarantine), ["n0", "n1", "n2"]);
    assert!(!plan.quarantine.refused.is_empty());
    assert_eq!(plan.status.quarantined_nodes, 3);
    let limited = plan
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == gpu_remediation_api::constants::policy_conditions::QUARANTINE_LIMITED)
        .unwrap();
    assert_eq!(limited.status, "True");
    assert_eq!(limited.reason, reasons::QUARANTINE_LIMIT_REACHED);
    assert!(
        limited.message.contains("7 nodes show a quarantining signal")
            && limited.message.contains("30% (3 nodes)")
            && limited.message.contains("n3, n4"),
        "{}",
        limited.message
    );
}

#[test]
fn a_node_relabelled_out_of_its_policy_has_its_quarantine_lifted_by_the_fleet_plan() {
    let nodes = [labelled(quarantined(node("n1", Some(100)), "p"), "b")];
    let fleet = crate::fleet::plan(&[policy("30%")], &nodes, &[], at(110));
    assert_eq!(fleet.orphan_quarantines.len(), 1);
    assert_eq!(fleet.orphan_quarantines[0].node.name, "n1");
    assert!(!fleet.orphan_quarantines[0].unless_owner_exists);
    let gone = crate::fleet::plan(&[], &nodes, &[], at(110));
    assert!(
        gone.orphan_quarantines[0].unless_owner_exists,
        "once the server confirms the policy is gone"
    );
    assert_eq!(
        gone.orphan_quarantines.len(),
        1,
        "a deleted policy's quarantine is lifted too"
    );
}

#[test]
fn a_held_quarantine_after_the_signal_cleared_wakes_the_fleet_when_its_hysteresis_ends() {
    let nodes = [labelled(
        quarantined(node_with("n1", "GpuHealthy", "True", 130), "p"),
        "a",
    )];
    let fleet = crate::fleet::plan(&[policy("30%")], &nodes, &[], at(135));
    assert_eq!(fleet.wake_at, Some(at(150)));
    assert_eq!(fleet.policies[0].status.quarantined_nodes, 1);
    assert!(fleet.orphan_quarantines.is_empty());
}

#[test]
fn an_add_whose_room_a_failed_lift_did_not_free_waits_for_the_next_pass() {
    let add = |name: &str| Add {
        node: NodeRef {
            name: name.into(),
            uid: None,
        },
        since: at(0),
        signal: "GpuHealthy=False (XID79)".into(),
    };
    // Limit 3: two held, both lifted, make room for three adds; 3 held once written.
    let plan = Plan {
        add: vec![add("a"), add("b"), add("c")],
        held: 3,
        limit: 3,
        ..Plan::default()
    };
    assert_eq!(plan.adds_within_limit(0), 3);
    assert_eq!(
        plan.adds_within_limit(1),
        2,
        "one lift undone: the shortest signal waits"
    );
    assert_eq!(plan.adds_within_limit(5), 0);
    // Room to spare: a failed lift costs no add.
    let spare = Plan { held: 2, ..plan };
    assert_eq!(spare.adds_within_limit(1), 3);
}
